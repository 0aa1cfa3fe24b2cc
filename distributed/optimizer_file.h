// The NVMe tier of ZeRO-Offload (--offload-dir; the optimizer-state offload of ZeRO-Infinity, Rajbhandari et al.,
// "ZeRO-Infinity: Breaking the GPU Memory Wall for Extreme Scale Deep Learning"): one rank's fp32 master weights and
// Adam m and v live in a file, and the CPU's AdamW passes over it tile by tile while one I/O thread reads the next
// tile and writes the last one back, so host memory holds kBuffers tiles instead of the whole shard. Plain C++ (no
// CUDA), so the CPU tests and bench/bench_offload_dir.cpp build it with g++; distributed/zero.cuh drives it.
// Layout: a header block of 4096 bytes (OptimizerFileHeader in the host's byte order, zeros after it: magic "GPTOPTIM",
// version, rank, run id (model/run_identity.h), elements, tile, arrays, the owner's pid and host name), then the
// records: tile k holds elements [k tile, k tile + n_k) of the shard as one record at byte 4096 + k x arrays x 4 x
// tile: its master weights (arrays = 3; none in fp32, where the parameters are their own master weights: arrays = 2),
// m and v, n_k floats each, back to back, so a tile is one read and one write. The tiles are in the order the update
// visits them.
// A record's size is a multiple of 4096 bytes (the tile a multiple of 1024 elements) unless the shard is one tile, so
// every record starts 4096-aligned for direct I/O; the records end rounded up to 4096 bytes, so the last one too is
// read and written whole, in 4096-aligned buffers.
// Ownership: the process that creates the file holds an exclusive flock on it for the file's life, taken before
// anything is written (opened without truncation, locked, then emptied, its header written and preallocated), so a
// second job given the same folder is refused with one line naming the owner from the header, and leaves the file as
// it was. A file whose owner died is unlocked (the kernel drops the lock with the process) and the next start takes it.
// I/O: O_DIRECT (the page cache would only double the copies of a file read once a step), or buffered reads and
// writes where the file system refuses it (direct() says which). The file is preallocated with posix_fallocate (a full
// disk is found before training) and removed by the destructor. A failed read or write ends the program with one line
// naming the file (die, from the thread that waits for it).
// defines: OptimizerFile, OptimizerFileHeader, read_optimizer_file_header, optimizer_file_locked, optimizer_file_bytes,
//          optimizer_file_path, offload_dir_problem, offload_dir_free_bytes, offload_dir_space_problem
#pragma once
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "../kernels/die.h"
#include "../model/run_identity.h"  // defines: run_id_text

constexpr size_t kOptimizerFileAlignment = 4096;  // direct I/O's alignment of offsets, lengths and buffers
inline size_t round_up_to_alignment(size_t bytes) { return (bytes + kOptimizerFileAlignment - 1) / kOptimizerFileAlignment * kOptimizerFileAlignment; }

constexpr size_t kOptimizerFileHeaderBytes = 4096;  // the header block before the records

// Bytes of the optimizer file of a shard of `elements` with `arrays` fp32 arrays (3: master, m, v; 2: m, v).
inline size_t optimizer_file_bytes(size_t elements, int arrays) {
    return kOptimizerFileHeaderBytes + round_up_to_alignment(elements * arrays * sizeof(float));
}
inline std::string optimizer_file_path(const std::string& dir, int rank) { return dir + "/optimizer_rank" + std::to_string(rank) + ".bin"; }

// The optimizer file's header, at byte 0 of its first 4096 bytes (the rest zeros).
struct OptimizerFileHeader {
    static constexpr char kMagic[8] = {'G', 'P', 'T', 'O', 'P', 'T', 'I', 'M'};
    static constexpr uint32_t kVersion = 1;
    char magic[8];
    uint32_t version;
    int32_t rank;
    uint64_t run_id;
    uint64_t elements, tile;
    uint32_t arrays;
    int32_t pid;     // the owner's process
    char host[256];  // the owner's host name, NUL-terminated
};
static_assert(offsetof(OptimizerFileHeader, run_id) == 16 && offsetof(OptimizerFileHeader, pid) == 44 &&
                  offsetof(OptimizerFileHeader, host) == 48 && sizeof(OptimizerFileHeader) <= kOptimizerFileHeaderBytes,
              "the optimizer file's header layout");

// The header of the optimizer file at `path`: false when it cannot be read or is none (a file being created, or another
// file under that name).
inline bool read_optimizer_file_header(const std::string& path, OptimizerFileHeader* header) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) return false;
    const bool read = fread(header, sizeof(*header), 1, f) == 1;
    fclose(f);
    return read && memcmp(header->magic, OptimizerFileHeader::kMagic, sizeof(header->magic)) == 0 &&
           header->version == OptimizerFileHeader::kVersion && memchr(header->host, '\0', sizeof(header->host)) != nullptr;
}

// Whether a process holds the optimizer file at `path` (its flock). A shared lock taken for an instant tells: the
// owner's exclusive lock, being taken at that instant, retries (OptimizerFile).
inline bool optimizer_file_locked(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool locked = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);  // and with it the shared lock
    return locked;
}

inline std::string gib_text_of(double bytes) {
    char text[32];
    snprintf(text, sizeof text, "%.2f", bytes / (1024.0 * 1024.0 * 1024.0));
    return text;
}

// --offload-dir's folder: "" when it exists, is a folder and takes a new file; else the problem, in one line.
inline std::string offload_dir_problem(const std::string& dir) {
    struct stat st;
    if (stat(dir.c_str(), &st) != 0)
        return "--offload-dir " + dir + ": " + strerror(errno) + ": give an existing folder on a local disk (NVMe) for the optimizer files";
    if (!S_ISDIR(st.st_mode)) return "--offload-dir " + dir + " is not a folder: give the folder the optimizer files go to";
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);  // the ranks of several machines may share the folder
    const std::string probe = dir + "/.offload_dir_probe_" + host + "_" + std::to_string(getpid());
    const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return "--offload-dir " + dir + " is not writable (" + strerror(errno) + "): give a folder this user can create files in";
    close(fd);
    unlink(probe.c_str());
    return "";
}

// The free bytes of the file system of `dir` for the optimizer files of run `run_id`: its free space plus what the
// optimizer files already there take that a start of this run may count as its own: those of its ranks that started
// first (locked, their header carrying run_id) and those a run that died left (unlocked: a start replaces them).
// Another job's files (locked, another run id, or run_id 0) are not counted.
inline double offload_dir_free_bytes(const std::string& dir, uint64_t run_id = 0) {
    struct statvfs fs;
    if (statvfs(dir.c_str(), &fs) != 0) return -1.0;
    double free_bytes = (double)fs.f_bavail * fs.f_frsize;
    if (DIR* d = opendir(dir.c_str())) {
        while (const dirent* e = readdir(d)) {
            const std::string name = e->d_name, path = dir + "/" + name;
            struct stat st;
            if (name.rfind("optimizer_rank", 0) != 0 || name.size() <= 4 || name.compare(name.size() - 4, 4, ".bin") != 0 ||
                stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
                continue;
            OptimizerFileHeader header;
            if (!optimizer_file_locked(path) || (run_id != 0 && read_optimizer_file_header(path, &header) && header.run_id == run_id))
                free_bytes += (double)st.st_blocks * 512;
        }
        closedir(d);
    }
    return free_bytes;
}

// "" when the file system of `dir` has room for `ranks` optimizer files of `bytes` each (the ranks of one machine
// that share the folder) of run `run_id` (offload_dir_free_bytes); else the problem, in one line.
inline std::string offload_dir_space_problem(const std::string& dir, size_t bytes, int ranks, uint64_t run_id = 0) {
    const double free_bytes = offload_dir_free_bytes(dir, run_id), need = (double)bytes * ranks;
    if (free_bytes < 0) return "--offload-dir " + dir + ": cannot read its free space: " + strerror(errno);
    if (need <= free_bytes) return "";
    return "--offload-dir " + dir + " has " + gib_text_of(free_bytes) + " GiB free but the optimizer files need " + gib_text_of(need) + " GiB (" +
           std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") + " x " + gib_text_of((double)bytes) + " GiB): free space there, give "
           "a folder on a larger disk, or spread the job over more data-parallel ranks (each holds a smaller shard)";
}

class OptimizerFile {
public:
    static constexpr int kBuffers = 3;  // while the CPU updates tile k, tile k+1 is read and tile k-1 written
    enum Array { kMaster = 0, kM = 1, kV = 2 };
    // One tile in memory: elements [first, first + count) of the shard; master null without master weights.
    struct Tile {
        int index;
        size_t first, count;
        float *master, *m, *v;
        float* array(Array a) const { return a == kMaster ? master : a == kM ? m : v; }
    };
    // What a pass does with the file: reads each tile (kRead), reads and writes it back (kReadWrite), or writes it
    // without reading (kWrite: the visit sets all of the tile).
    enum class Pass { kRead, kReadWrite, kWrite };
    struct Counters {
        double bytes_read = 0, bytes_written = 0;
        double read_seconds = 0, write_seconds = 0;  // the I/O thread's time in pread and pwrite
        double wait_seconds = 0;                     // the passes' time waiting for the I/O thread
    };

    // Creates rank `rank`'s file in `dir` for run `run_id` (replacing one a run that died left there; refusing, in one
    // line, one that another process holds), preallocates it and starts the I/O thread. tile: a multiple of 1024
    // elements, or at least `elements` (one tile).
    OptimizerFile(const std::string& dir, int rank, size_t elements, size_t tile, bool master_weights, uint64_t run_id)
        : path_(optimizer_file_path(dir, rank)), elements_(elements), tile_(std::min(tile, elements)), arrays_(master_weights ? 3 : 2) {
        if (elements == 0 || tile == 0 || (tile_ < elements_ && tile_ % 1024 != 0))
            die("internal: an optimizer file takes a tile of a multiple of 1024 elements, or one tile (got " + std::to_string(tile) + " of " +
                std::to_string(elements) + ")");
        for (char*& buffer : buffers_)
            if (posix_memalign(reinterpret_cast<void**>(&buffer), kOptimizerFileAlignment, buffer_bytes()) != 0)
                die("cannot allocate the optimizer file's tile buffers (" + std::to_string(kBuffers) + " x " + std::to_string(buffer_bytes()) + " bytes)");
        open_locked(dir);
        // the lock is ours: a dead run's contents go (the preallocation reads as zeros), then the header, the records
        if (ftruncate(fd_, 0) != 0) abandon("cannot empty the optimizer file " + path_ + ": " + strerror(errno));
        OptimizerFileHeader header = {};
        memcpy(header.magic, OptimizerFileHeader::kMagic, sizeof(header.magic));
        header.version = OptimizerFileHeader::kVersion;
        header.rank = rank;
        header.run_id = run_id;
        header.elements = elements_;
        header.tile = tile_;
        header.arrays = (uint32_t)arrays_;
        header.pid = (int32_t)getpid();
        gethostname(header.host, sizeof(header.host) - 1);
        memset(buffers_[0], 0, kOptimizerFileHeaderBytes);  // a buffer holds a record: 4096 bytes at least
        memcpy(buffers_[0], &header, sizeof(header));
        const std::string error = transfer(true, buffers_[0], kOptimizerFileHeaderBytes, 0);
        if (!error.empty()) abandon(error);
        const int err = posix_fallocate(fd_, 0, (off_t)file_bytes());
        if (err != 0)
            abandon("cannot preallocate " + gib_text_of((double)file_bytes()) + " GiB for the optimizer file " + path_ + ": " + strerror(err) +
                    ": free space in --offload-dir or give a folder on a larger disk");
        io_thread_ = std::thread([this] { run_io(); });
    }
    ~OptimizerFile() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        cv_.notify_all();
        io_thread_.join();  // after the requests already queued
        for (char* buffer : buffers_) free(buffer);
        remove_file();
    }
    OptimizerFile(const OptimizerFile&) = delete;
    OptimizerFile& operator=(const OptimizerFile&) = delete;

    // Host bytes of the tile buffers for a tile of `tile` elements.
    static size_t buffers_bytes(size_t tile, int arrays) { return kBuffers * round_up_to_alignment(tile * arrays * sizeof(float)); }

    const std::string& path() const { return path_; }
    size_t tile() const { return tile_; }
    int num_tiles() const { return (int)((elements_ + tile_ - 1) / tile_); }
    bool direct() const { return direct_; }
    bool has_master() const { return arrays_ == 3; }
    size_t file_bytes() const { return optimizer_file_bytes(elements_, arrays_); }
    size_t records_bytes() const { return file_bytes() - kOptimizerFileHeaderBytes; }  // what a pass over every tile moves
    size_t buffer_bytes() const { return round_up_to_alignment(tile_ * arrays_ * sizeof(float)); }
    Counters counters() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return counters_;
    }

    // Visits tiles [first, end) in order, each in memory once its read is done (kRead, kReadWrite), and writes it back
    // after the visit (kReadWrite, kWrite); the next tile's read and the last one's write run on the I/O thread during
    // the visit. Returns once every write is done.
    void pass(int first, int end, Pass mode, const std::function<void(const Tile&)>& visit) {
        const bool reads = mode != Pass::kWrite, writes = mode != Pass::kRead;
        if (reads && first < end) enqueue(false, first);
        for (int k = first; k < end; k++) {
            // buffer (k + 1) % kBuffers last held tile k - 2, whose write the I/O thread, in queue order, does first
            if (reads && k + 1 < end) enqueue(false, k + 1);
            wait_for(buffer_ticket_[k % kBuffers]);  // tile k's read, or the buffer's last write
            visit(tile_in(k));
            if (writes) enqueue(true, k);
        }
        wait_for(enqueued_);
    }
    // The whole state into host arrays of the shard's size (master null without master weights), and back (master null
    // with master weights: the file's are kept).
    void read_all(float* master, float* m, float* v) {
        float* to[3] = {master, m, v};
        pass(0, num_tiles(), Pass::kRead, [&](const Tile& t) {
            for (int a = kMaster; a <= kV; a++)
                if (t.array((Array)a) != nullptr) std::copy(t.array((Array)a), t.array((Array)a) + t.count, to[a] + t.first);
        });
    }
    void write_all(const float* master, const float* m, const float* v) {
        const float* from[3] = {master, m, v};
        pass(0, num_tiles(), has_master() && master == nullptr ? Pass::kReadWrite : Pass::kWrite, [&](const Tile& t) {
            for (int a = kMaster; a <= kV; a++)
                if (t.array((Array)a) != nullptr && from[a] != nullptr) std::copy(from[a] + t.first, from[a] + t.first + t.count, t.array((Array)a));
        });
    }
    // Elements [at, at + n) of one array from `values`; the rest of the tiles they lie in stays.
    void write_range(Array array, size_t at, const float* values, size_t n) {
        if (n == 0) return;
        pass((int)(at / tile_), (int)((at + n - 1) / tile_) + 1, Pass::kReadWrite, [&](const Tile& t) {
            const size_t begin = std::max(at, t.first), end = std::min(at + n, t.first + t.count);
            std::copy(values + (begin - at), values + (end - at), t.array(array) + (begin - t.first));
        });
    }

private:
    size_t tile_count(int k) const { return std::min(tile_, elements_ - (size_t)k * tile_); }
    off_t tile_offset(int k) const { return (off_t)(kOptimizerFileHeaderBytes + (size_t)k * tile_ * arrays_ * sizeof(float)); }
    Tile tile_in(int k) const {
        const size_t n = tile_count(k);
        float* base = reinterpret_cast<float*>(buffers_[k % kBuffers]);
        return arrays_ == 3 ? Tile{k, (size_t)k * tile_, n, base, base + n, base + 2 * n} : Tile{k, (size_t)k * tile_, n, nullptr, base, base + n};
    }

    // Opens path_ (created if absent; O_DIRECT where the file system takes it) as fd_ and takes its exclusive lock, or
    // dies naming the process that holds it. An instant's shared lock (optimizer_file_locked) is waited out; a file its
    // owner removed between the open and the lock is opened again.
    void open_locked(const std::string& dir) {
        for (;;) {
            fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (direct_ ? O_DIRECT : 0), 0600);
            if (fd_ < 0 && errno == EINVAL && direct_) {  // the file system refuses direct I/O (ramfs, some network file systems)
                direct_ = false;
                continue;
            }
            if (fd_ < 0) die("cannot create the optimizer file " + path_ + ": " + strerror(errno));
            int tries = 0;
            while (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
                if (errno == EINTR) continue;
                if (errno != EWOULDBLOCK) die("cannot lock the optimizer file " + path_ + ": " + strerror(errno));
                if (++tries == 20) {  // 200 ms: held by a process
                    close(fd_);
                    OptimizerFileHeader owner;
                    const std::string who = read_optimizer_file_header(path_, &owner)
                                                ? "pid " + std::to_string(owner.pid) + " on " + owner.host + ", run " + run_id_text(owner.run_id)
                                                : "being created: no header yet";
                    die("--offload-dir " + dir + ": " + path_ + " is in use by another job (" + who + "); give each job its own folder");
                }
                usleep(10000);
            }
            struct stat opened, named;
            if (fstat(fd_, &opened) == 0 && stat(path_.c_str(), &named) == 0 && opened.st_dev == named.st_dev && opened.st_ino == named.st_ino) return;
            close(fd_);
        }
    }
    // Removes the file while its lock is held (so that no other start takes the name in between), then closes it; a
    // name that no longer leads to this file (removed by hand and created again) is left alone.
    void remove_file() {
        struct stat opened, named;
        if (fstat(fd_, &opened) == 0 && stat(path_.c_str(), &named) == 0 && opened.st_dev == named.st_dev && opened.st_ino == named.st_ino)
            unlink(path_.c_str());
        close(fd_);
    }
    // A creation that failed after the lock: the file removed, `error` in one line.
    [[noreturn]] void abandon(const std::string& error) {
        remove_file();
        die(error);
    }

    struct Request {
        bool write;
        int tile;
    };
    void enqueue(bool write, int k) {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back({write, k});
        buffer_ticket_[k % kBuffers] = ++enqueued_;
        cv_.notify_all();
    }
    // Waits until the I/O thread has done the request numbered `ticket` (the first is 1) and every one before it.
    void wait_for(uint64_t ticket) {
        const auto start = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return completed_ >= ticket || !error_.empty(); });
        counters_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!error_.empty()) {
            const std::string error = error_;
            lock.unlock();
            die(error);
        }
    }
    void run_io() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stop_, with nothing left to do
            const Request r = queue_.front();
            queue_.pop_front();
            const bool failed = !error_.empty();  // after a failure the rest is skipped: the waiting pass dies
            lock.unlock();
            const auto start = std::chrono::steady_clock::now();
            const size_t bytes = round_up_to_alignment(tile_count(r.tile) * arrays_ * sizeof(float));
            const std::string error = failed ? "" : transfer(r.write, buffers_[r.tile % kBuffers], bytes, tile_offset(r.tile));
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            lock.lock();
            if (!failed && error.empty()) {
                (r.write ? counters_.bytes_written : counters_.bytes_read) += (double)bytes;
                (r.write ? counters_.write_seconds : counters_.read_seconds) += seconds;
            }
            if (!error.empty()) error_ = error;
            completed_++;
            cv_.notify_all();
        }
    }
    // One record whole: "" or the error, naming the file.
    std::string transfer(bool write, char* buffer, size_t bytes, off_t offset) {
        for (size_t done = 0; done < bytes;) {
            const ssize_t n = write ? pwrite(fd_, buffer + done, bytes - done, offset + (off_t)done)
                                    : pread(fd_, buffer + done, bytes - done, offset + (off_t)done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0)
                return std::string("cannot ") + (write ? "write" : "read") + " the optimizer file " + path_ + " at byte " +
                       std::to_string((long long)offset + (long long)done) + ": " + (n == 0 ? "end of file" : strerror(errno));
            done += (size_t)n;
        }
        return "";
    }

    std::string path_;
    size_t elements_, tile_;
    int arrays_;
    int fd_ = -1;
    bool direct_ = true;
    char* buffers_[kBuffers] = {};
    // shared with the I/O thread, under mutex_: the requests, how many were queued and done (tickets), the ticket of
    // each buffer's last request, the first error, the counters
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<Request> queue_;
    uint64_t enqueued_ = 0, completed_ = 0;
    uint64_t buffer_ticket_[kBuffers] = {};
    std::string error_;
    bool stop_ = false;
    Counters counters_;
    std::thread io_thread_;
};
