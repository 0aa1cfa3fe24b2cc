// Reading a checkpoint's files once (docs/reliability.md, "Resuming"): the load computes each file's CRC-32C while it
// reads, so that the read which loads a file is also the one that verifies it. A file is read in order, front to back
// (CheckedFile); where this rank verifies it (CheckpointReads: own_checkpoint_files' assignment, each file one rank
// of the job), the bytes the load skips are read and checksummed rather than sought over, and once the load is done
// with it the rest is read to close its CRC, which is compared with the manifest's. A file this rank verifies but
// does not load is read whole for its CRC alone. Plain C++: the CPU tests run it without CUDA.
// defines: ReadTally, read_tally, CheckpointReads, CheckedFile
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>
#include <sys/stat.h>
#include "../kernels/die.h"  // die
#include "file_integrity.h"  // Crc32c, FileRecord, kChecksumSlot

// The byte ranges [begin, end) each file was read in, by path: recorded only while a test installs a tally, to prove
// that no byte is read twice.
struct ReadTally {
    std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
};
inline ReadTally*& read_tally() {
    static ReadTally* tally = nullptr;
    return tally;
}

// The files of one checkpoint that this rank verifies, and the verdicts: each is verified by the first CheckedFile that
// opens it (reading it whole, in order), or by finish().
class CheckpointReads {
public:
    CheckpointReads(const std::string& dir, const std::vector<FileRecord>& to_verify) : dir_(dir), to_verify_(to_verify) {}
    // The record to verify `path` against, if this rank verifies it and no reader has yet; nullptr otherwise.
    const FileRecord* claim(const std::string& path) {
        for (const FileRecord& f : to_verify_)
            if (dir_ + "/" + f.name == path && !claimed_.count(f.name)) {
                claimed_[f.name] = "";
                return &f;
            }
        return nullptr;
    }
    void record(const FileRecord& f, const std::string& problem) {
        claimed_[f.name] = problem;
        if (!problem.empty() && problem_.empty()) {
            problem_ = problem;
            damaged_ = f.name;
        }
    }
    // Verifies the files of this rank that no reader opened (a full read each); returns the first problem, or "".
    inline std::string finish();
    const std::string& problem() const { return problem_; }
    const std::string& damaged_file() const { return damaged_; }  // its name in the folder, "" while none is
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
    std::vector<FileRecord> to_verify_;
    std::map<std::string, std::string> claimed_;  // name -> its problem ("" whole, or not read to its end yet)
    std::string problem_, damaged_;
};

// One file read front to back. With `reads` given and the file this rank's to verify, every byte passes through the
// CRC-32C (the header's checksum slot counted as 0, as seal_file_checksum wrote it) and skipping reads; otherwise a
// skip seeks. A failed read stops with one line naming the file (die). Closing (or leaving the scope, also for an
// exception) reads the rest of a verified file and records its verdict.
class CheckedFile {
public:
    // `kind` names the file in the message when it cannot be opened ("model file": "PATH: cannot open model file: ...").
    CheckedFile(const std::string& path, CheckpointReads* reads, const std::string& kind = "") : path_(path), reads_(reads) {
        f_ = fopen(path.c_str(), "rb");
        if (f_ == nullptr) die(path + ": cannot open" + (kind.empty() ? "" : " " + kind) + ": " + strerror(errno));
        struct stat st;
        size_ = fstat(fileno(f_), &st) == 0 ? (uint64_t)st.st_size : 0;
        verified_ = reads != nullptr ? reads->claim(path) : nullptr;
    }
    ~CheckedFile() { close(); }
    CheckedFile(const CheckedFile&) = delete;
    CheckedFile& operator=(const CheckedFile&) = delete;

    uint64_t size() const { return size_; }
    uint64_t position() const { return position_; }
    // The next `n` bytes into `data`; `what` says what they are, for the message of a short file.
    void read(void* data, size_t n, const char* what = "its contents") {
        if (take(data, n) != n)
            die(path_ + ": truncated: " + std::to_string(size_) + " bytes, ended while reading " + what + " at byte " + std::to_string(position_));
    }
    // Moves on to byte `offset` (never back).
    void skip_to(uint64_t offset) {
        if (offset < position_) die(path_ + ": read out of order (byte " + std::to_string(offset) + " after byte " + std::to_string(position_) + ")");
        if (verified_ == nullptr) {
            if (fseeko(f_, (off_t)offset, SEEK_SET) != 0) die(path_ + ": cannot seek to byte " + std::to_string(offset) + ": " + strerror(errno));
            position_ = offset;
            return;
        }
        std::vector<uint8_t> buffer((size_t)std::min<uint64_t>(offset - position_, 16u << 20));
        while (position_ < offset) {
            const size_t n = (size_t)std::min<uint64_t>(offset - position_, buffer.size());
            if (take(buffer.data(), n) != n) die(path_ + ": truncated: " + std::to_string(size_) + " bytes, expected at least " + std::to_string(offset));
        }
    }
    // Done with the file: a verified one is read to its end, and its CRC-32C compared with the manifest's. Never stops
    // the process (it runs while an exception unwinds): the verdict goes to `reads`.
    void close() {
        if (f_ == nullptr) return;
        if (verified_ != nullptr) {
            std::vector<uint8_t> buffer(16u << 20);
            while (take(buffer.data(), buffer.size()) > 0) continue;
            std::string problem;
            if (ferror(f_) != 0) problem = path_ + ": read error at byte " + std::to_string(position_) + ": " + strerror(errno);
            else if (position_ != verified_->bytes)
                problem = path_ + ": " + std::to_string(position_) + " bytes, the manifest says " + std::to_string(verified_->bytes);
            else if (crc_.value() != verified_->crc) {
                char text[128];
                snprintf(text, sizeof(text), ": checksum mismatch (CRC-32C %08x, the manifest says %08x): the file is damaged", crc_.value(), verified_->crc);
                problem = path_ + text;
            }
            reads_->record(*verified_, problem);
        }
        fclose(f_);
        f_ = nullptr;
    }

private:
    // Reads up to n bytes, feeding a verified file's CRC and the tally; returns how many came.
    size_t take(void* data, size_t n) {
        const size_t got = fread(data, 1, n, f_);
        if (got == 0) return 0;
        if (verified_ != nullptr) {
            constexpr uint64_t slot = kChecksumSlot * sizeof(int);
            const uint8_t* p = static_cast<const uint8_t*>(data);
            if (position_ < slot + 4 && position_ + got > slot) {  // the stored CRC counts as 0
                std::vector<uint8_t> copy(p, p + got);
                for (uint64_t b = std::max(position_, slot); b < std::min<uint64_t>(slot + 4, position_ + got); b++) copy[b - position_] = 0;
                crc_.update(copy.data(), got);
            } else {
                crc_.update(p, got);
            }
        }
        if (ReadTally* tally = read_tally()) tally->ranges[path_].push_back({position_, position_ + got});
        position_ += got;
        return got;
    }

    std::string path_;
    CheckpointReads* reads_;
    FILE* f_ = nullptr;
    uint64_t size_ = 0, position_ = 0;
    const FileRecord* verified_ = nullptr;
    Crc32c crc_;
};

inline std::string CheckpointReads::finish() {
    for (const FileRecord& f : to_verify_)
        if (!claimed_.count(f.name)) {
            const std::string path = dir_ + "/" + f.name;
            FILE* probe = fopen(path.c_str(), "rb");
            if (probe == nullptr) {
                record(f, path + ": cannot open: " + strerror(errno));
                continue;
            }
            fclose(probe);
            CheckedFile whole(path, this);
        }
    return problem_;
}
