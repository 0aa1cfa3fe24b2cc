// The one way the programs stop on an error: "error: <message>" as one line on stderr, then exit status 1.
// Every check (flags, files, shapes, CUDA, cuBLAS, NCCL, internal invariants) ends here, so every failure reads
// the same. The paths that must end with _exit instead (a watchdog thread, a CUDA context that will never drain)
// print through print_error. The dataloader and tokenizer throw: they are libraries, and their callers die.
// The fuzz harnesses (test/fuzz/) build with -DDIE_THROWS: die() throws std::runtime_error(message) instead, so
// that a refused input returns to the harness; nothing else defines it.
// defines: print_error, die
#pragma once
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

inline void print_error(const std::string& message) {
    fprintf(stderr, "error: %s\n", message.c_str());
    fflush(stderr);
}

[[noreturn]] inline void die(const std::string& message) {
#ifdef DIE_THROWS
    throw std::runtime_error(message);
#else
    print_error(message);
    exit(EXIT_FAILURE);
#endif
}
