// A run's identity: a 64-bit id drawn when a run starts from scratch and kept across every resume (a checkpoint's
// manifest carries it), so that files of one run are never taken for another's: the checkpoint files, their
// manifest and --offload-dir's optimizer files all carry it. Plain C++ (the CPU tests use it).
// defines: new_run_id, run_id_text, parse_run_id
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

// A fresh id: /dev/urandom where it can be read, mixed with the clock and the process id (never 0).
inline uint64_t new_run_id() {
    uint64_t id = 0;
    if (FILE* f = fopen("/dev/urandom", "rb")) {
        if (fread(&id, sizeof(id), 1, f) != 1) id = 0;
        fclose(f);
    }
    id ^= (uint64_t)std::chrono::high_resolution_clock::now().time_since_epoch().count() * 0x9E3779B97F4A7C15ull;
    id ^= (uint64_t)getpid() << 32;
    return id == 0 ? 1 : id;
}
// 16 hexadecimal digits.
inline std::string run_id_text(uint64_t id) {
    char text[17];
    snprintf(text, sizeof(text), "%016llx", (unsigned long long)id);
    return text;
}
// The id of run_id_text's 16 digits; false for anything else.
inline bool parse_run_id(const std::string& text, uint64_t* id) {
    if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
    *id = strtoull(text.c_str(), nullptr, 16);
    return true;
}
