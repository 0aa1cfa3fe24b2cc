// What every libFuzzer harness of test/fuzz/ shares: a scratch folder of its own, writing an input into a file
// there, and running a parser on it with a refusal (an exception) counting as a correct answer. The harnesses build
// with -DDIE_THROWS (kernels/die.h), so die() throws instead of exiting; anything else (a sanitizer report, an
// exit, a timeout, an exception that is not std::exception) is a crash that libFuzzer reports with its input.
//
// Include this before the parsers' headers: die() throwing means that a parser that refuses a file with a FILE
// open never reaches its fclose (the program would have exited), so fopen and fclose are counted here and the
// harness closes what a refused input left open (else every refusal would leak a descriptor and its buffer).
// defines: scratch_dir, repository_path, write_file, read_file, refused, tracked_fopen, tracked_fclose, close_left_open,
//          header_word, FUZZ_CHECK
#pragma once
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

inline std::vector<FILE*>& open_streams() {
    static std::vector<FILE*> streams;
    return streams;
}
inline FILE* tracked_fopen(const char* path, const char* mode) {
    FILE* f = ::fopen(path, mode);
    if (f != nullptr) open_streams().push_back(f);
    return f;
}
inline int tracked_fclose(FILE* f) {
    std::vector<FILE*>& streams = open_streams();
    streams.erase(std::remove(streams.begin(), streams.end(), f), streams.end());
    return ::fclose(f);
}
inline void close_left_open() {
    for (FILE* f : open_streams()) ::fclose(f);
    open_streams().clear();
}
// A folder of this process's own under $TMPDIR (default: /dev/shm where there is one, else /tmp: every input is
// written to a file, in memory if possible), removed when the process exits.
inline const std::string& scratch_dir() {
    static const std::string dir = [] {
        const char* tmp = getenv("TMPDIR");
        struct stat shm;
        const std::string base = tmp != nullptr && *tmp ? tmp : stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode) ? "/dev/shm" : "/tmp";
        std::string pattern = base + "/train_gpt_fuzz_XXXXXX";
        if (mkdtemp(&pattern[0]) == nullptr) {
            perror("mkdtemp");
            abort();
        }
        static std::string removed;
        removed = pattern;
        atexit([] {
            if (system(("rm -rf '" + removed + "'").c_str()) != 0) fprintf(stderr, "cannot remove %s\n", removed.c_str());
        });
        return pattern;
    }();
    return dir;
}

// A file of the repository (data/gpt2/encoder.json), found from this program's place in it (build/fuzz/fuzz_X).
inline std::string repository_path(const std::string& relative) {
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        perror("/proc/self/exe");
        abort();
    }
    std::string root(exe, (size_t)n);
    for (int up = 0; up < 3; up++) root = root.substr(0, root.rfind('/'));
    return root + "/" + relative;
}

inline void write_file(const std::string& path, const void* data, size_t size) {
    FILE* f = ::fopen(path.c_str(), "wb");
    if (f == nullptr || (size > 0 && ::fwrite(data, 1, size, f) != size) || ::fclose(f) != 0) {
        perror(path.c_str());
        abort();  // the harness's own failure, not the parser's: stop loudly
    }
}
inline void write_file(const std::string& path, const std::string& bytes) { write_file(path, bytes.data(), bytes.size()); }

inline std::string read_file(const std::string& path) {
    std::string bytes;
    FILE* f = ::fopen(path.c_str(), "rb");
    if (f == nullptr) {
        perror(path.c_str());
        abort();
    }
    char buf[1 << 16];
    size_t got;
    while ((got = ::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, got);
    ::fclose(f);
    return bytes;
}

// Runs `parse`; true when it refused the input with an exception (die() included), false when it accepted it.
// Streams a refusal left open are closed.
inline bool refused(const std::function<void()>& parse) {
    try {
        parse();
        return false;
    } catch (const std::exception&) {
        close_left_open();
        return true;
    }
}

// Word i of a 256 x int32 header at the start of `data` (0 past its end): the formats' headers, and the harnesses'
// own choices (shapes, ranks) taken from words the formats leave unused, so a valid file stays valid.
inline int32_t header_word(const uint8_t* data, size_t size, int i) {
    int32_t w = 0;
    if (size >= 4 * (size_t)(i + 1)) memcpy(&w, data + 4 * i, 4);
    return w;
}

// A condition the harness checks beyond "no crash" (a round trip, an invariant): its failure aborts, which
// libFuzzer reports as a crash with the input.
#define FUZZ_CHECK(condition, what)                                              \
    do {                                                                         \
        if (!(condition)) {                                                      \
            fprintf(stderr, "fuzz check failed: %s (%s)\n", what, #condition); \
            abort();                                                             \
        }                                                                        \
    } while (0)

// The parsers' headers, included after this one, open and close their files through the counted functions.
#define fopen tracked_fopen
#define fclose tracked_fclose
