// The NVMe tier of ZeRO-Offload (distributed/optimizer_file.h, --offload-dir) on the CPU: AdamW over a shard kept in a
// file, tile by tile through the double-buffered pipeline, against adamw_cpu's update of the same data in memory (bf16
// with master weights and fp32 without; several tiles, a last partial one, sizes that are no multiple of 4096 bytes or
// of the tile; several steps), bit for bit; the file's size, its header (the run id), its removal; its lock (a second
// job on the same file refused in one line from another process, the file untouched, and accepted once the first is
// gone; a file a dead run left replaced); a failed write, a full disk, a file system without direct I/O (ramfs: the
// buffered fallback), the free space (which counts this run's files and dead runs', not another job's), and
// --offload-dir's refusals. The file systems that fill or refuse O_DIRECT are mounted by a child in its own user and
// mount namespaces (as `unshare -rm`) where the system allows it, and skipped otherwise.
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>
#include "../distributed/optimizer_file.h"
#include "../kernels/adamw_cpu.h"
#include "../model/run_identity.h"
#include "check.h"
#include "private_mount.h"                 // defines: mount_private

namespace {

const std::string kWork = "build/test_work/offload_dir";
const uint64_t kRun = 0x0123456789abcdefull, kOtherRun = 0xfedcba9876543210ull;

struct Hyper {  // the fields of kernels/adamw.cuh's AdamWHyper that make_step reads
    float lr, beta1, beta2, eps, weight_decay, grad_clip, loss_scale;
    int t;
    uint64_t seed;
};

float random_float(uint64_t& state, float scale) { return scale * ((float)(splitmix64(state++) >> 40) / (float)(1 << 24) - 0.5f); }
bool same_bits(const void* a, const void* b, size_t bytes) { return memcmp(a, b, bytes) == 0; }
std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}
long file_size(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 ? (long)st.st_size : -1;
}

// A shard of `n` elements at global index `offset`: AdamW for `steps` steps in memory (adamw_cpu::update on the whole
// shard) and through an optimizer file with tiles of `tile` elements in `dir`; every array bitwise equal after each
// step, the file's size, its removal. Param: adamw_cpu::Bf16 (with master weights) or float (none).
template <typename Param>
void check_update(const std::string& dir, const std::string& name, size_t n, size_t tile, long offset, int steps) {
    const bool master = !std::is_same<Param, float>::value;
    uint64_t state = 1234 + n;
    std::vector<float> weights(n), m(n, 0.0f), v(n, 0.0f);
    for (float& w : weights) w = random_float(state, 0.2f);
    std::vector<Param> params(n), file_params(n);
    for (size_t i = 0; i < n; i++) adamw_cpu::detail::store(&params[i], weights[i], 0);
    file_params = params;
    LayoutMask decay;  // decay on the first 3/4 of a block of 1000, after a head of 100 without
    decay.blocks_begin = 100;
    decay.block_size = 1000;
    decay.blocks_end = 1L << 40;
    decay.num_ranges = 1;
    decay.range_end[0] = 750;
    const std::string path = optimizer_file_path(dir, 7);
    bool equal = true, size_ok = true, counted = true;
    std::string detail;
    {
        OptimizerFile file(dir, 7, n, tile, master, kRun);
        const int arrays = master ? 3 : 2;
        size_ok = file_size(path) == (long)optimizer_file_bytes(n, arrays) && file.file_bytes() % 4096 == 0 &&
                  file.records_bytes() >= n * arrays * sizeof(float) && file.records_bytes() < n * arrays * sizeof(float) + 4096 &&
                  file.file_bytes() == file.records_bytes() + 4096;
        file.write_all(master ? weights.data() : nullptr, m.data(), v.data());
        std::vector<float> file_master(n), file_m(n), file_v(n);
        for (int s = 1; s <= steps && equal; s++) {
            std::vector<Param> grads(n);
            for (size_t i = 0; i < n; i++) adamw_cpu::detail::store(&grads[i], random_float(state, 0.01f), 0);
            const Hyper h{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, s, 99 + (uint64_t)s};
            const adamw_cpu::Step step = adamw_cpu::make_step(h, 0.5f);
            adamw_cpu::update(params.data(), master ? weights.data() : nullptr, grads.data(), m.data(), v.data(), 0, (long)n, offset, step, decay);
            const OptimizerFile::Counters before = file.counters();
            file.pass(0, file.num_tiles(), OptimizerFile::Pass::kReadWrite, [&](const OptimizerFile::Tile& t) {
                adamw_cpu::update(file_params.data() + t.first, t.master, grads.data() + t.first, t.m, t.v, 0, (long)t.count,
                                  offset + (long)t.first, step, decay);
            });
            const OptimizerFile::Counters after = file.counters();
            counted = counted && after.bytes_read - before.bytes_read == file.records_bytes() &&
                      after.bytes_written - before.bytes_written == file.records_bytes();
            file.read_all(master ? file_master.data() : nullptr, file_m.data(), file_v.data());
            equal = same_bits(params.data(), file_params.data(), n * sizeof(Param)) && same_bits(m.data(), file_m.data(), n * 4) &&
                    same_bits(v.data(), file_v.data(), n * 4) && (!master || same_bits(weights.data(), file_master.data(), n * 4));
            if (!equal) detail = "step " + std::to_string(s) + " differs";
        }
        detail += " (" + std::to_string(file.num_tiles()) + " tiles of " + std::to_string(file.tile()) + ", " +
                  (file.direct() ? "direct I/O" : "buffered I/O") + ")";
    }
    check(equal, name + ": AdamW through the file equals AdamW in memory, bitwise, over " + std::to_string(steps) + " steps", detail);
    check(size_ok, name + ": the file is a 4096-byte header and the records rounded up to 4096 bytes",
          std::to_string(optimizer_file_bytes(n, master ? 3 : 2)) + " bytes");
    check(counted, name + ": an update reads and writes the file once", "");
    check(!file_exists(path), name + ": the file is removed at the end", path);
}

// write_range: one array's elements across tiles, the rest as it was.
void check_write_range(const std::string& dir) {
    const size_t n = 5000, tile = 1024;
    std::vector<float> master(n), m(n), v(n);
    for (size_t i = 0; i < n; i++) master[i] = (float)i, m[i] = -(float)i, v[i] = 0.5f * i;
    OptimizerFile file(dir, 8, n, tile, true, kRun);
    file.write_all(master.data(), m.data(), v.data());
    std::vector<float> values(2100, 7.0f);
    file.write_range(OptimizerFile::kMaster, 1000, values.data(), values.size());
    std::copy(values.begin(), values.end(), master.begin() + 1000);
    std::vector<float> got_master(n), got_m(n), got_v(n);
    file.read_all(got_master.data(), got_m.data(), got_v.data());
    check(got_master == master && got_m == m && got_v == v, "write_range: elements 1000-3099 of the master weights over 3 tiles, the rest unchanged", "");
    std::vector<float> zeros(n, 0.0f);
    file.write_all(nullptr, zeros.data(), zeros.data());
    file.read_all(got_master.data(), got_m.data(), got_v.data());
    check(got_master == master && got_m == zeros && got_v == zeros, "write_all without master weights keeps the file's", "");
}

// Runs body() in a child process whose stderr goes to `err`: its exit status (-1 if it did not exit).
int in_child(const std::string& err, const std::function<void()>& body) {
    fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        if (freopen(err.c_str(), "w", stderr) == nullptr) _exit(3);
        body();
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
bool one_line(const std::string& text) { return std::count(text.begin(), text.end(), '\n') == 1; }

// A write that fails (the file-size limit: EFBIG, as a full disk gives ENOSPC) ends the pass with one line naming the file.
void check_write_error(const std::string& dir) {
    const std::string path = optimizer_file_path(dir, 9), err = kWork + "/write.err";
    const int status = in_child(err, [&] {
        OptimizerFile file(dir, 9, 6000, 1024, true, kRun);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit limit = {9 * 4096, 9 * 4096};  // within the third tile's record (after the header)
        setrlimit(RLIMIT_FSIZE, &limit);
        file.pass(0, file.num_tiles(), OptimizerFile::Pass::kReadWrite, [](const OptimizerFile::Tile&) {});
    });
    const std::string message = read_text(err);
    check(status == 1 && message.find("error: cannot write the optimizer file " + path + " at byte ") == 0 &&
              message.find("File too large") != std::string::npos && one_line(message),
          "a failed write ends with one line naming the file", message);
    unlink(path.c_str());
}

// The header and the lock: the header names the run and the owner; a second job on the same file (another process:
// flock's locks belong to an open file, so the test's own process would conflict with itself too) is refused in one
// line and leaves the file as it was; once the first is gone a second job is accepted; a file whose owner died
// (unlocked) is replaced, its contents gone.
void check_ownership(const std::string& dir) {
    const size_t n = 3000;
    const std::string path = optimizer_file_path(dir, 5), err = kWork + "/lock.err";
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    std::vector<float> master(n), m(n), v(n), got_master(n), got_m(n), got_v(n);
    for (size_t i = 0; i < n; i++) master[i] = 0.5f * i, m[i] = -(float)i, v[i] = 1.0f + i;
    {
        OptimizerFile first(dir, 5, n, 1024, true, kRun);
        first.write_all(master.data(), m.data(), v.data());
        const std::string before = read_text(path);
        OptimizerFileHeader header;
        const bool read = read_optimizer_file_header(path, &header);
        uint64_t raw_id = 0;
        if (before.size() >= 24) memcpy(&raw_id, before.data() + 16, sizeof(raw_id));
        check(read && before.compare(0, 8, "GPTOPTIM") == 0 && raw_id == kRun && header.run_id == kRun && header.rank == 5 && header.elements == n &&
                  header.tile == 1024 && header.arrays == 3 && header.pid == getpid() && strcmp(header.host, host) == 0,
              "the header carries the run id (byte 16), the rank, the shape and the owner (pid, host)",
              read ? "run " + run_id_text(header.run_id) + ", pid " + std::to_string(header.pid) + " on " + header.host : "no header");
        const int status = in_child(err, [&] { OptimizerFile second(dir, 5, 2 * n, 2048, false, kOtherRun); });
        const std::string message = read_text(err), owner = "(pid " + std::to_string(getpid()) + " on " + host + ", run " + run_id_text(kRun) + ")";
        check(status == 1 && message == "error: --offload-dir " + dir + ": " + path + " is in use by another job " + owner + "; give each job its own folder\n",
              "a second job on the file (another process) is refused in one line naming the owner", message);
        first.read_all(got_master.data(), got_m.data(), got_v.data());
        check(read_text(path) == before && got_master == master && got_m == m && got_v == v,
              "the refused job leaves the file bitwise as it was (header and records)", "");
    }
    int status = in_child(err, [&] {
        OptimizerFile second(dir, 5, 2 * n, 2048, false, kOtherRun);
        OptimizerFileHeader header;
        if (!read_optimizer_file_header(path, &header) || header.run_id != kOtherRun || header.pid != getpid()) _exit(2);
    });
    check(status == 0 && !file_exists(path), "a second job on the file is accepted once the first is gone",
          "exit status " + std::to_string(status) + ": " + read_text(err));
    status = in_child(err, [&] {
        OptimizerFile file(dir, 5, n, 1024, true, kOtherRun);
        file.write_all(master.data(), m.data(), v.data());
        _exit(0);  // as a crash: no destructor, the lock gone with the process
    });
    const bool left = status == 0 && file_exists(path) && !optimizer_file_locked(path);
    {
        OptimizerFile file(dir, 5, n, 1024, true, kRun);
        OptimizerFileHeader header;
        const bool read = read_optimizer_file_header(path, &header);
        file.read_all(got_master.data(), got_m.data(), got_v.data());
        const std::vector<float> zeros(n, 0.0f);
        check(left && read && header.run_id == kRun && header.pid == getpid() && got_master == zeros && got_m == zeros && got_v == zeros &&
                  file_size(path) == (long)optimizer_file_bytes(n, 3),
              "a file a dead run left (unlocked) is taken over: this run's header, its contents zeros",
              left ? (read ? "run " + run_id_text(header.run_id) : std::string("no header")) : "the dead run's file was not left unlocked");
    }
}

void check_refusals(const std::string& dir) {
    const std::string missing = dir + "/missing", plain = dir + "/plain";
    check(offload_dir_problem(missing).find("--offload-dir " + missing + ": No such file or directory") == 0, "refuses a missing folder",
          offload_dir_problem(missing));
    FILE* f = fopen(plain.c_str(), "w");
    if (f) fclose(f);
    check(offload_dir_problem(plain).find("--offload-dir " + plain + " is not a folder") == 0, "refuses a file", offload_dir_problem(plain));
    check(offload_dir_problem(dir).empty(), "accepts a writable folder", offload_dir_problem(dir));
    const std::string space = offload_dir_space_problem(dir, (size_t)1 << 62, 2);
    check(space.find("--offload-dir " + dir + " has ") == 0 && space.find("GiB free but the optimizer files need") != std::string::npos &&
              space.find("(2 ranks x ") != std::string::npos,
          "refuses a disk without room for the files", space);
    check(offload_dir_space_problem(dir, 4096, 1).empty(), "accepts a disk with room", "");
}


// In a child with its own mounts: a tmpfs too small for the file, a ramfs (no O_DIRECT), a read-only tmpfs.
void check_file_systems() {
    const std::string small = kWork + "/small", ram = kWork + "/ram", readonly = kWork + "/readonly";
    for (const std::string& d : {small, ram, readonly}) mkdir(d.c_str(), 0755);
    fflush(stdout);
    const pid_t owner = fork();
    if (owner == 0) {
        std::string why = mount_private(small, "tmpfs", "size=256k");
        if (why.empty()) why = mount_private(ram, "ramfs", "");
        if (why.empty()) why = mount_private(readonly, "tmpfs", "size=64k", MS_RDONLY);
        if (!why.empty()) {
            skip("a full disk, a file system without direct I/O, a read-only one", why);
            _exit(0);
        }
        const std::string path = optimizer_file_path(small, 0);
        const int status = in_child(kWork + "/full.err", [&] { OptimizerFile file(small, 0, 100000, 1024, true, kRun); });
        const std::string message = read_text(kWork + "/full.err");
        check(status == 1 && message.find("error: cannot preallocate 0.00 GiB for the optimizer file " + path + ": No space left on device") == 0 &&
                  one_line(message) && !file_exists(path),
              "a full disk is found at creation: one line naming the file, no file left", message);
        {  // the free space counts this run's optimizer files (a rank that started first) and those a dead run left
            OptimizerFile file(small, 1, 12 * 1024, 1024, true, kRun);  // 148 KiB of the 256
            const int dead = in_child(kWork + "/dead.err", [&] {
                OptimizerFile left(small, 2, 2 * 1024, 1024, true, kOtherRun);  // 28 KiB
                _exit(0);  // as a crash: no destructor, the lock gone with the process
            });
            struct statvfs fs;
            statvfs(small.c_str(), &fs);
            const double disk = (double)fs.f_bavail * fs.f_frsize, dead_bytes = (double)optimizer_file_bytes(2 * 1024, 3);
            const double ours = offload_dir_free_bytes(small, kRun), others = offload_dir_free_bytes(small, kOtherRun);
            check(dead == 0 && ours == disk + file.file_bytes() + dead_bytes && offload_dir_space_problem(small, file.file_bytes(), 1, kRun).empty(),
                  "the free space counts this run's locked file and a dead run's: a second rank of the run finds room for its own",
                  fmt("%.0f bytes free, %.0f on the disk", ours, disk));
            check(others == disk + dead_bytes && !offload_dir_space_problem(small, file.file_bytes(), 1, kOtherRun).empty(),
                  "the free space counts no file another job holds: a second job finds no room", fmt("%.0f bytes free, %.0f on the disk", others, disk));
        }
        check_update<adamw_cpu::Bf16>(ram, "ramfs (buffered I/O)", 7 * 1024 + 5, 2048, 3, 3);
        {
            OptimizerFile file(ram, 1, 4096, 1024, true, kRun);
            check(!file.direct(), "ramfs refuses O_DIRECT: the file falls back to buffered I/O", "");
        }
        const std::string refused = offload_dir_problem(readonly);
        check(refused.find("--offload-dir " + readonly + " is not writable (Read-only file system)") == 0, "refuses a read-only folder", refused);
        _exit(check_failures() == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(owner, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (!WIFEXITED(status)) fail("file systems in a child", "the child did not exit");
        check_failures()++;  // the child printed its FAIL lines
    }
}

}  // namespace

int main() {
    check_suite("offload_dir");
    const std::string dir = kWork + "/disk";
    if (system(("rm -rf " + kWork + " && mkdir -p " + dir).c_str()) != 0) {
        fail("setup", "cannot create " + dir);
        return 1;
    }
    check_file_systems();  // first: a child forked after OpenMP has run would wait for the parent's thread team
    // a tile that is the whole shard; several tiles and a last partial one; no multiple of 4096 bytes or of the tile
    check_update<adamw_cpu::Bf16>(dir, "bf16 one tile of 1000", 1000, 4096, 0, 3);
    check_update<adamw_cpu::Bf16>(dir, "bf16 5 tiles of 2048 + 123", 5 * 2048 + 123, 2048, 5, 4);
    check_update<float>(dir, "fp32 4 tiles of 1024 + 1", 4 * 1024 + 1, 1024, 2, 3);
    check_update<float>(dir, "fp32 3 whole tiles of 3072", 3 * 3072, 3072, 1, 2);
    check_write_range(dir);
    check_write_error(dir);
    check_ownership(dir);
    check_refusals(dir);
    return check_failures() == 0 ? 0 : 1;
}
