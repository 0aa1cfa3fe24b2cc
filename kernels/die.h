// The one way the programs stop on an error: "error: <message>" as one line on stderr, then exit status 1.
// Every check (flags, files, shapes, CUDA, cuBLAS, NCCL, internal invariants) ends here, so every failure reads
// the same. The paths that must end with _exit instead (a watchdog thread, a CUDA context that will never drain)
// print through print_error. The dataloader and tokenizer throw: they are libraries, and their callers die.
// defines: print_error, die
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

inline void print_error(const std::string& message) {
    fprintf(stderr, "error: %s\n", message.c_str());
    fflush(stderr);
}

[[noreturn]] inline void die(const std::string& message) {
    print_error(message);
    exit(EXIT_FAILURE);
}
