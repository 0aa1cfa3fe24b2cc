// The integrity of the files train_gpt writes (model, state and adapter files, docs/formats.md): each starts with a
// 256-int header whose last two ints hold a tag and the CRC-32C (Castagnoli) of the whole file, computed over the
// bytes as they are written (the checksum slot counted as 0); and every file is written through a temporary name,
// flushed to the disk, renamed, and the rename made durable by an fsync of the folder, so that a crash or a full
// disk never leaves a half-written file under the real name. Files without the tag (llm.c's and older ones) have no
// checksum to verify. Each step of that sequence is a fault point: the crash-consistency test kills the writer at
// every one in turn (TRAIN_GPT_KILL_AT).
// defines: Crc32c, kChecksumTag, kChecksumTagSlot, kChecksumSlot, kRunIdentitySlot, stamp_run_identity, FileParts, FileRecord, seal_file_checksum, FileChecksum, read_file_header,
//          check_file_checksum, fault_point, sync_directory, write_file_atomically
#pragma once
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#define FILE_CRC_X86 1
#endif
#include "../kernels/die.h"  // defines: die

// CRC-32C, fed in pieces: the SSE4.2 instruction where the CPU has it (about 8 GB/s on one core), else a table
// 8 bytes at a time; both give the same value. "123456789" -> 0xE3069283.
class Crc32c {
public:
    explicit Crc32c(bool hardware_allowed = true) : hardware_allowed_(hardware_allowed) {}  // false: the table (tests)
    void update(const void* data, size_t n) {
        const uint8_t* p = static_cast<const uint8_t*>(data);
#ifdef FILE_CRC_X86
        static const bool hardware = __builtin_cpu_supports("sse4.2");
        if (hardware && hardware_allowed_) {
            state_ = update_sse42(state_, p, n);
            return;
        }
#endif
        state_ = update_table(state_, p, n);
    }
    uint32_t value() const { return ~state_; }

private:
    bool hardware_allowed_;
    uint32_t state_ = ~0u;
    using Tables = std::array<std::array<uint32_t, 256>, 8>;
    static const Tables& tables() {
        static const Tables t = [] {
            Tables t{};
            for (uint32_t i = 0; i < 256; i++) {
                uint32_t c = i;
                for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));  // the reflected polynomial
                t[0][i] = c;
            }
            for (int s = 1; s < 8; s++)
                for (uint32_t i = 0; i < 256; i++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
            return t;
        }();
        return t;
    }
    static uint32_t update_table(uint32_t c, const uint8_t* p, size_t n) {
        const Tables& t = tables();
        for (; n >= 8; p += 8, n -= 8) {
            uint64_t w;
            memcpy(&w, p, 8);  // little-endian
            w ^= c;
            c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^ t[3][(w >> 32) & 0xFF] ^
                t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
        }
        for (; n > 0; p++, n--) c = (c >> 8) ^ t[0][(c ^ *p) & 0xFF];
        return c;
    }
#ifdef FILE_CRC_X86
    __attribute__((target("sse4.2"))) static uint32_t update_sse42(uint32_t c, const uint8_t* p, size_t n) {
        uint64_t c64 = c;
        for (; n >= 8; p += 8, n -= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            c64 = _mm_crc32_u64(c64, w);
        }
        c = (uint32_t)c64;
        for (; n > 0; p++, n--) c = _mm_crc32_u8(c, *p);
        return c;
    }
#endif
};

constexpr int kChecksumTagSlot = 254, kChecksumSlot = 255;  // in the 256-int header; llm.c reads ints 0-7
constexpr int kChecksumTag = 0x43524343;                     // "CCRC" little-endian: the file carries a CRC-32C

// A checkpoint's files (model, adapter and state files) carry the run's identity in header ints 240-243, which
// llm.c's readers never look at: a tag, the run id's two halves and the step. Other files leave them 0.
constexpr int kRunIdentitySlot = 240, kRunIdentityTag = 0x494E5552;  // "RUNI"
inline void stamp_run_identity(int* header, uint64_t run_id, int step) {
    header[kRunIdentitySlot] = kRunIdentityTag;
    header[kRunIdentitySlot + 1] = (int)(uint32_t)run_id;
    header[kRunIdentitySlot + 2] = (int)(uint32_t)(run_id >> 32);
    header[kRunIdentitySlot + 3] = step;
}

// A file's contents as pieces, the 1024-byte header first.
using FileParts = std::vector<std::pair<const void*, size_t>>;

// A written file as a checkpoint's manifest lists it: its name in the folder, size and CRC-32C.
struct FileRecord {
    std::string name;
    uint64_t bytes = 0;
    uint32_t crc = 0;
    bool operator==(const FileRecord& o) const { return name == o.name && bytes == o.bytes && crc == o.crc; }
};

// Tags `header` (the first part's 256 ints) and stores the CRC-32C of all the parts, its own slot counted as 0;
// returns that CRC.
inline uint32_t seal_file_checksum(int* header, const FileParts& parts) {
    header[kChecksumTagSlot] = kChecksumTag;
    header[kChecksumSlot] = 0;
    Crc32c crc;
    for (const auto& part : parts) crc.update(part.first, part.second);
    const uint32_t value = crc.value();
    memcpy(&header[kChecksumSlot], &value, 4);
    return value;
}

// What a file's checksum says: kValid, kNone (no tag: nothing to verify), kDamaged (`problem` says how).
struct FileChecksum {
    enum Status { kValid, kNone, kDamaged } status;
    std::string problem;  // for kDamaged: "<path>: ..." in one line
    uint32_t stored = 0;  // the CRC-32C its header holds (kValid, and kDamaged once the header was read)
};
// The first 1024 bytes of a file (the header of every file train_gpt writes) into header[256]; false when the file
// cannot be opened or is shorter.
inline bool read_file_header(const std::string& path, int* header) {
    FILE* f = fopen(path.c_str(), "rb");
    const bool read = f != nullptr && fread(header, sizeof(int), 256, f) == 256;
    if (f != nullptr) fclose(f);
    return read;
}
// Reads the whole file once (in 16 MiB pieces) and compares its CRC-32C with its header's.
inline FileChecksum check_file_checksum(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) return {FileChecksum::kDamaged, path + ": cannot open: " + strerror(errno)};
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) {
        fclose(f);
        return {FileChecksum::kDamaged, path + ": shorter than its 1024-byte header"};
    }
    if (header[kChecksumTagSlot] != kChecksumTag) {
        fclose(f);
        return {FileChecksum::kNone, ""};
    }
    uint32_t stored;
    memcpy(&stored, &header[kChecksumSlot], 4);
    header[kChecksumSlot] = 0;
    Crc32c crc;
    crc.update(header, sizeof(header));
    std::vector<uint8_t> buffer(16u << 20);
    size_t n;
    while ((n = fread(buffer.data(), 1, buffer.size(), f)) > 0) crc.update(buffer.data(), n);
    const bool read_error = ferror(f) != 0;
    fclose(f);
    if (read_error) return {FileChecksum::kDamaged, path + ": read error", stored};
    if (crc.value() != stored) {
        char text[96];
        snprintf(text, sizeof(text), ": checksum mismatch (CRC-32C %08x, the header says %08x): the file is damaged", crc.value(), stored);
        return {FileChecksum::kDamaged, path + text, stored};
    }
    return {FileChecksum::kValid, "", stored};
}

// A step of a durable write or deletion (a file written, flushed, renamed; a folder synced; a file deleted) where
// the crash-consistency test may kill this process: with TRAIN_GPT_KILL_AT=N in the environment the N-th fault
// point (counting from 1) sends SIGKILL to the process itself, as a crash or a node failure would end it there.
// fault_points_passed() counts them (the test learns how many a save passes).
inline long& fault_points_passed() {
    static long passed = 0;
    return passed;
}
inline void fault_point() {
    const char* kill_at = getenv("TRAIN_GPT_KILL_AT");  // read each time: the test sets it in forked processes
    if (++fault_points_passed() == (kill_at != nullptr ? atol(kill_at) : 0)) raise(SIGKILL);
}

// The folder of `path` (".", for a bare name).
inline std::string folder_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}
// Makes the entries of `dir` (a rename, a new or deleted file) durable: fsync of the folder. "" or the problem.
inline std::string sync_directory(const std::string& dir) {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return dir + ": cannot open the folder to make its entries durable: " + strerror(errno);
    const int rc = fsync(fd);
    const int error = errno;
    close(fd);
    fault_point();
    if (rc != 0 && error != EINVAL) return dir + ": cannot make the folder's entries durable (fsync): " + strerror(error);  // EINVAL: not supported there
    return "";
}

// Writes `parts` to path + ".tmp", flushes it to the disk, renames it to `path` and syncs the folder: the file appears
// whole or not at all, and once this returns it survives a crash. A failed write (a full disk, a quota, an I/O error)
// removes the temporary file, leaves whatever `path` held before untouched, and stops with one line naming the file
// and the system's reason. Returns the file's size in bytes.
inline uint64_t write_file_atomically(const std::string& path, const FileParts& parts) {
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (f == nullptr) die(tmp + ": cannot create: " + strerror(errno));
    int error = 0;
    uint64_t bytes = 0;
    for (const auto& part : parts) {
        errno = 0;
        if (error == 0 && fwrite(part.first, 1, part.second, f) != part.second) error = errno != 0 ? errno : EIO;
        bytes += part.second;
    }
    if (error == 0 && fflush(f) != 0) error = errno;
    if (error == 0) fault_point();
    if (error == 0 && fsync(fileno(f)) != 0) error = errno;
    if (fclose(f) != 0 && error == 0) error = errno;
    if (error != 0) {
        unlink(tmp.c_str());
        die(path + ": cannot write: " + strerror(error) + " (nothing was written under this name; the files before it are untouched)");
    }
    fault_point();
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        error = errno;
        unlink(tmp.c_str());
        die(path + ": cannot rename the written file into place: " + strerror(error));
    }
    fault_point();
    const std::string problem = sync_directory(folder_of(path));
    if (!problem.empty()) die(problem);
    return bytes;
}
