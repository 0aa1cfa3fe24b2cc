// ZeRO-Offload's NVMe tier (--offload-dir) on the CPU: what the disk under --dir reaches, and how much of it the
// optimizer file's double-buffered AdamW pass (distributed/optimizer_file.h, kernels/adamw_cpu.h) uses.
// 1. The disk: a file of --gib GiB written, then read, sequentially in records of the tile (--tile elements x 12 bytes:
//    master weights, m, v) through the optimizer file's I/O thread with nothing to compute (direct I/O where the file
//    system allows it; the line says which):
//      RESULT disk write|read bytes=N tile_bytes=N seconds=... GB_per_s=... io=direct|buffered
// 2. The update: AdamW (bf16 parameters and gradients in memory, fp32 master weights and moments in the file) over a
//    shard of --elements parameters, --reps passes after one warm-up pass, each tile read while the one before is
//    updated and the one before that written. The disk's limit for a pass is reading and writing the file once at the
//    rates of 1 (one I/O thread does both, one after the other); disk_fraction is that limit over the pass's time;
//    cpu_s is the time of the AdamW alone (in memory, the same tiles), waited_s the pass's wait for the I/O thread:
//      RESULT offload_dir_adamw elements=N threads=T median_s=... params_per_s=... file_GB=... disk_limit_s=...
//             disk_fraction=... cpu_s=... waited_s=...
// Usage: bench_offload_dir --dir PATH [--gib G] [--elements N] [--tile N] [--threads T] [--reps R]
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "../distributed/optimizer_file.h"
#include "../kernels/adamw_cpu.h"
#include "../model/run_identity.h"

namespace {

struct Hyper {  // the fields of kernels/adamw.cuh's AdamWHyper that make_step reads
    float lr, beta1, beta2, eps, weight_decay, grad_clip, loss_scale;
    int t;
    uint64_t seed;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
long parse_long(const std::string& flag, const char* text) {
    char* end = nullptr;
    const long value = strtol(text, &end, 10);
    if (end == text || *end != '\0' || value <= 0) die("bench_offload_dir: " + flag + " takes a positive integer, got '" + text + "'");
    return value;
}

}  // namespace

int main(int argc, char** argv) {
    std::string dir;
    long gib = 4, elements = 1L << 28, tile = 1L << 22, threads = omp_get_max_threads(), reps = 3;
    const std::string flags = " (flags: --dir, --gib, --elements, --tile, --threads, --reps)";
    for (int i = 1; i < argc; i += 2) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) die("bench_offload_dir: " + flag + " needs a value" + flags);
        if (flag == "--dir") dir = argv[i + 1];
        else if (flag == "--gib") gib = parse_long(flag, argv[i + 1]);
        else if (flag == "--elements") elements = parse_long(flag, argv[i + 1]);
        else if (flag == "--tile") tile = parse_long(flag, argv[i + 1]);
        else if (flag == "--threads") threads = parse_long(flag, argv[i + 1]);
        else if (flag == "--reps") reps = parse_long(flag, argv[i + 1]);
        else die("bench_offload_dir: unknown flag '" + flag + "'" + flags);
    }
    if (dir.empty()) die("bench_offload_dir: --dir PATH is the folder to measure" + flags);
    if (tile % 1024 != 0) die("bench_offload_dir: --tile " + std::to_string(tile) + " is not a multiple of 1024 elements");
    std::string problem = offload_dir_problem(dir);
    if (problem.empty()) problem = offload_dir_space_problem(dir, optimizer_file_bytes(std::max(((size_t)gib << 30) / 12, (size_t)elements), 3), 1);
    if (!problem.empty()) die(problem);
    const uint64_t run_id = new_run_id();

    // 1. the disk, at the tile's record size
    double read_rate, write_rate;
    {
        const size_t probe_elements = ((size_t)gib << 30) / 12;
        OptimizerFile file(dir, 0, probe_elements, (size_t)tile, true, run_id);
        const char* io = file.direct() ? "direct" : "buffered";
        auto timed = [&](OptimizerFile::Pass mode) {
            const auto start = std::chrono::steady_clock::now();
            file.pass(0, file.num_tiles(), mode, [](const OptimizerFile::Tile&) {});
            return seconds_since(start);
        };
        const double write_s = timed(OptimizerFile::Pass::kWrite), read_s = timed(OptimizerFile::Pass::kRead);
        write_rate = file.records_bytes() / write_s;
        read_rate = file.records_bytes() / read_s;
        printf("RESULT disk write bytes=%zu tile_bytes=%zu seconds=%.3f GB_per_s=%.2f io=%s\n", file.records_bytes(), file.buffer_bytes(), write_s,
               write_rate * 1e-9, io);
        printf("RESULT disk read bytes=%zu tile_bytes=%zu seconds=%.3f GB_per_s=%.2f io=%s\n", file.records_bytes(), file.buffer_bytes(), read_s,
               read_rate * 1e-9, io);
        fflush(stdout);
    }

    // 2. AdamW through the file
    const size_t n = (size_t)elements;
    std::vector<adamw_cpu::Bf16> params(n), grads(n);
    for (size_t i = 0; i < n; i++) {
        params[i].bits = (uint16_t)(0x3c00 + (splitmix64(i) & 0xff));  // about 0.008
        grads[i].bits = (uint16_t)(0x3a00 + (splitmix64(i + n) & 0xff));
    }
    LayoutMask decay;
    decay.head_end = (long)n;
    OptimizerFile file(dir, 1, n, (size_t)tile, true, run_id);
    auto pass = [&](int t) {
        const Hyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, t, (uint64_t)t};
        const adamw_cpu::Step step = adamw_cpu::make_step(h, 1.0f);
        file.pass(0, file.num_tiles(), OptimizerFile::Pass::kReadWrite, [&](const OptimizerFile::Tile& k) {
            adamw_cpu::update(params.data() + k.first, k.master, grads.data() + k.first, k.m, k.v, 0, (long)k.count, (long)k.first, step, decay,
                              (int)threads);
        });
    };
    pass(1);  // warm-up: the pages of the file and of the arrays touched, the threads started
    std::vector<double> seconds;
    const double waited_before = file.counters().wait_seconds;
    for (int r = 0; r < reps; r++) {
        const auto start = std::chrono::steady_clock::now();
        pass(r + 2);
        seconds.push_back(seconds_since(start));
    }
    const double waited = (file.counters().wait_seconds - waited_before) / reps;
    // the AdamW alone over the same tiles, its state in memory
    std::vector<float> state(3 * (size_t)tile);
    const Hyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 2, 2};
    const adamw_cpu::Step step = adamw_cpu::make_step(h, 1.0f);
    const auto cpu_start = std::chrono::steady_clock::now();
    for (size_t first = 0; first < n; first += (size_t)tile) {
        const size_t count = std::min((size_t)tile, n - first);
        adamw_cpu::update(params.data() + first, state.data(), grads.data() + first, state.data() + tile, state.data() + 2 * tile, 0, (long)count,
                          (long)first, step, decay, (int)threads);
    }
    const double cpu_s = seconds_since(cpu_start), pass_s = median(seconds);
    const double limit_s = file.records_bytes() / read_rate + file.records_bytes() / write_rate;
    printf("RESULT offload_dir_adamw elements=%zu threads=%ld median_s=%.3f params_per_s=%.4g file_GB=%.2f disk_limit_s=%.3f disk_fraction=%.2f "
           "cpu_s=%.3f waited_s=%.3f\n",
           n, threads, pass_s, n / pass_s, file.file_bytes() * 1e-9, limit_s, limit_s / pass_s, cpu_s, waited);
    return 0;
}
