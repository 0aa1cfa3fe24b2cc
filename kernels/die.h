// The one way the programs stop on an error: "error: <message>" as one line on stderr, then exit status 1.
// Every check (flags, files, shapes, CUDA, cuBLAS, NCCL, internal invariants) ends here, so every failure reads
// the same. The paths that must end with _exit instead (a watchdog thread, a CUDA context that will never drain)
// print through print_error. The dataloader and tokenizer throw: they are libraries, and their callers die.
// The fuzz harnesses (test/fuzz/) build with -DDIE_THROWS: die() throws std::runtime_error(message) instead, so
// that a refused input returns to the harness; nothing else defines it. At run time, DieThrowsInScope does the same
// on one thread for a while: the resume's load (model/checked_reads.h), where a file refused as malformed may be a
// damaged one, whose verdict the ranks gather before any of them stops.
// defines: print_error, die_throws_on_this_thread, DieThrowsInScope, die
#pragma once
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

inline void print_error(const std::string& message) {
    fprintf(stderr, "error: %s\n", message.c_str());
    fflush(stderr);
}

inline bool& die_throws_on_this_thread() {
    thread_local bool throws = false;
    return throws;
}
struct DieThrowsInScope {
    const bool before = die_throws_on_this_thread();
    DieThrowsInScope() { die_throws_on_this_thread() = true; }
    ~DieThrowsInScope() { die_throws_on_this_thread() = before; }
    DieThrowsInScope(const DieThrowsInScope&) = delete;
    DieThrowsInScope& operator=(const DieThrowsInScope&) = delete;
};

[[noreturn]] inline void die(const std::string& message) {
    if (die_throws_on_this_thread()) throw std::runtime_error(message);
#ifdef DIE_THROWS
    throw std::runtime_error(message);
#else
    print_error(message);
    exit(EXIT_FAILURE);
#endif
}
