// ZeRO-Offload's CPU AdamW (kernels/adamw_cpu.h) on one large shard, against the memory traffic it cannot beat:
// a pass that reads and writes the same bytes with one add an element ("the same traffic"). Both on all cores (or
// --threads), the best and the median of --reps passes after one warm-up pass. Prints one RESULT line per run:
//   RESULT adamw_cpu <precision> elements=N threads=T best_s=... median_s=... params_per_s=... GB_per_s=...
// Bytes an element, read and written: bf16 with fp32 master weights (what --offload optimizer runs): gradient 2,
// master 4 + 4, m 4 + 4, v 4 + 4, parameter 2 = 28; fp32 (the parameters are the master weights): gradient 4,
// parameter 4 + 4, m and v 16 = 28. bench/bench_pytorch_adamw_cpu.py counts PyTorch's fp32 AdamW the same way.
// Usage: bench_adamw_cpu [--elements N] [--threads T] [--reps R]
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <unistd.h>
#include "../kernels/adamw_cpu.h"

namespace {

struct Hyper {
    float lr, beta1, beta2, eps, weight_decay, grad_clip, loss_scale;
    int t;
    uint64_t seed;
};

struct Timing {
    double best, median;
};
template <typename Fn> Timing time_passes(Fn fn, int reps) {
    fn();  // warm-up: first touch of the pages, the threads started
    std::vector<double> seconds;
    for (int r = 0; r < reps; r++) {
        const auto start = std::chrono::steady_clock::now();
        fn();
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    return {seconds.front(), seconds[seconds.size() / 2]};
}

void print_result(const char* what, long n, int threads, Timing t) {
    printf("RESULT %s elements=%ld threads=%d best_s=%.4f median_s=%.4f params_per_s=%.4g GB_per_s=%.2f\n", what, n, threads,
           t.best, t.median, n / t.best, 28.0 * n / t.best / 1e9);
}

// Filled with values AdamW keeps finite, in parallel (the fill of several GiB takes seconds on one thread).
template <typename T> std::vector<T> filled(long n, T value, int threads) {
    std::vector<T> x(n);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long i = 0; i < n; i++) x[i] = value;
    return x;
}

long parse_long(const char* flag, const char* value) {
    char* end = nullptr;
    const long x = strtol(value, &end, 10);
    if (end == value || *end != '\0' || x <= 0) die(std::string("bench_adamw_cpu: ") + flag + " must be a positive integer, got '" + value + "'");
    return x;
}

}  // namespace

int main(int argc, char** argv) {
    long n = 1L << 28;
    int threads = omp_get_max_threads(), reps = 5;
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) die("bench_adamw_cpu: " + flag + " needs a value (flags: --elements, --threads, --reps)");
        if (flag == "--elements") n = parse_long("--elements", argv[++i]);
        else if (flag == "--threads") threads = (int)parse_long("--threads", argv[++i]);
        else if (flag == "--reps") reps = (int)parse_long("--reps", argv[++i]);
        else die("bench_adamw_cpu: unknown flag '" + flag + "' (flags: --elements, --threads, --reps)");
    }
    // bf16 run: 2 + 2 + 4 x 3 = 16 bytes an element held; fp32 run: 4 x 4 = 16; one run at a time
    const double need_gib = 16.0 * n / (1 << 30), have_gib = (double)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE) / (1 << 30);
    if (need_gib > 0.8 * have_gib)
        die("bench_adamw_cpu: --elements " + std::to_string(n) + " needs " + std::to_string(need_gib) + " GiB of host memory, more than 80% of the " +
            std::to_string(have_gib) + " GiB here: pass a smaller --elements");
    printf("bench_adamw_cpu: %ld elements (%.2f GiB held), %d threads, %s path, %d timed passes\n", n, need_gib, threads,
           adamw_cpu::isa_name(adamw_cpu::best_isa()), reps);
    const Hyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 10, 1234};
    const adamw_cpu::Step step = adamw_cpu::make_step(h, 0.25f);  // a norm of 0.5: no clipping
    LayoutMask decay;  // every element decays
    decay.head_end = n;

    {
        std::vector<adamw_cpu::Bf16> params = filled(n, adamw_cpu::Bf16{0x3c00}, threads), grads = filled(n, adamw_cpu::Bf16{0x3a00}, threads);
        std::vector<float> master = filled(n, 0.0078125f, threads), m = filled(n, 1e-3f, threads), v = filled(n, 1e-6f, threads);
        print_result("adamw_cpu bf16+master", n, threads, time_passes([&] {
            adamw_cpu::update(params.data(), master.data(), grads.data(), m.data(), v.data(), 0, n, 0, step, decay, threads);
        }, reps));
        // the same bytes read and written, one add an element: the memory system's limit for this access pattern
        print_result("same_traffic bf16+master", n, threads, time_passes([&] {
#pragma omp parallel for schedule(static) num_threads(threads)
            for (long i = 0; i < n; i++) {
                const float g = adamw_cpu::detail::float_of((uint32_t)grads[i].bits << 16);
                m[i] += g;
                v[i] += g;
                master[i] += g;
                params[i].bits = (uint16_t)(adamw_cpu::detail::bits_of(master[i]) >> 16);
            }
        }, reps));
    }
    {
        std::vector<float> params = filled(n, 0.0078125f, threads), grads = filled(n, 0.001f, threads), m = filled(n, 1e-3f, threads),
                           v = filled(n, 1e-6f, threads);
        print_result("adamw_cpu fp32", n, threads, time_passes([&] {
            adamw_cpu::update(params.data(), (float*)nullptr, grads.data(), m.data(), v.data(), 0, n, 0, step, decay, threads);
        }, reps));
        print_result("same_traffic fp32", n, threads, time_passes([&] {
#pragma omp parallel for schedule(static) num_threads(threads)
            for (long i = 0; i < n; i++) {
                const float g = grads[i];
                m[i] += g;
                v[i] += g;
                params[i] += g;
            }
        }, reps));
    }
    return 0;
}
