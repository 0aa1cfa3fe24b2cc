// Timing of the fused flash attention (kernels/flash_attention.cuh) for one shape in bf16 or fp16: forward,
// and forward + backward with the deterministic and the atomic dQ accumulation. CUDA events around each
// repetition after warm-up, median of the repetitions; inputs random (never zeros).
// FLOP convention (causal): forward 4*B*H*T^2*D / 2, backward 2.5x forward, forward + backward 3.5x.
// Prints one line per measurement: "ours WHAT B H T D MS TFLOPS", then a check at this size that repeated
// deterministic backwards give the same bits, and how far the atomic one is from them.
// Where the Hopper forward runs (flash_attention_hopper.cuh), "fwd" is it; "fwd_mma_sync" times the mma.sync
// forward beside it (and, for D = 64, the Hopper variant not dispatched: "fwd_hopper_nc3" below T = 2048,
// "fwd_hopper_nc2" from it on), and a check line
// gives each one's distance from the dispatched forward's out and lse. Likewise the backward: there "bwd_det" and
// "bwd_atomic" are the Hopper backward, "bwd_mma_sync_det" / "bwd_mma_sync_atomic" time the mma.sync one, and a
// check line gives each one's dqkv distance from the Hopper deterministic dqkv.
// KVH < H: grouped-query attention, the H query heads sharing KVH kv heads (Llama 3 8B: 32 and 8, D = 128); the
// FLOPs are counted per query head as for H heads.
// Usage: bench_attention B H T D [bf16|fp16] [reps] [KVH]   (KVH defaults to H)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/flash_attention.cuh"
#include "bench_util.h"  // defines: random_device_array, median_ms

// Relative L2 distance of two device arrays of n values (as float on the host).
template <typename T> double rel_l2(const T* got, const T* ref, long n) {
    std::vector<T> a(n), b(n);
    cudaCheck(cudaMemcpy(a.data(), got, n * sizeof(T), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(b.data(), ref, n * sizeof(T), cudaMemcpyDeviceToHost));
    double num = 0.0, den = 0.0;
    for (long i = 0; i < n; i++) {
        const double x = (float)a[i], y = (float)b[i];
        num += (x - y) * (x - y);
        den += y * y;
    }
    return std::sqrt(num / den);
}

// On Hopper: the other forwards beside the dispatched one (already in out, lse), timed and compared with it.
template <typename T>
void compare_forwards(const T* out, const float* lse, const T* qkv, int B, int Tn, int H, int KVH, int D, int reps, double flops,
                      cudaStream_t stream) {
    const long n = (long)B * Tn * H * D, nl = (long)B * H * Tn;
    T* out2;
    float* lse2;
    cudaCheck(cudaMalloc(&out2, n * sizeof(T)));
    cudaCheck(cudaMalloc(&lse2, nl * sizeof(float)));
    auto run = [&](const char* what, auto launch) {
        cudaCheck(cudaMemset(out2, 0xFF, n * sizeof(T)));  // NaN: what is not written shows
        cudaCheck(cudaMemset(lse2, 0xFF, nl * sizeof(float)));
        launch();
        cudaCheck(cudaStreamSynchronize(stream));
        const double e_out = rel_l2(out2, out, n), e_lse = rel_l2(lse2, lse, nl);
        const float ms = median_ms(launch, 3, reps, stream);
        printf("ours %s %d %d %d %d %.4f %.1f\n", what, B, H, Tn, D, ms, flops / (ms * 1e-3) / 1e12);
        printf("check %d %d %d %d %s vs fwd: out rel L2 %.2e, lse rel L2 %.2e\n", B, H, Tn, D, what, e_out, e_lse);
    };
    if (D == 64) {
        run("fwd_mma_sync", [&] { flash::forward_mma_sync<T, 64>(out2, lse2, qkv, B, Tn, H, KVH, stream); });
        // the variant not dispatched at this T (three consumer warpgroups from T = 2048 on, two below)
        if (Tn >= 2048) run("fwd_hopper_nc2", [&] { flash::hopper::forward<T, 64, 2>(out2, lse2, qkv, B, Tn, H, KVH, stream); });
        else run("fwd_hopper_nc3", [&] { flash::hopper::forward<T, 64, 3>(out2, lse2, qkv, B, Tn, H, KVH, stream); });
    } else {
        run("fwd_mma_sync", [&] { flash::forward_mma_sync<T, 128>(out2, lse2, qkv, B, Tn, H, KVH, stream); });
    }
    cudaCheck(cudaFree(out2));
    cudaCheck(cudaFree(lse2));
}

// On Hopper: the mma.sync backward beside the dispatched (Hopper) one, both modes, timed and compared with the
// dispatched deterministic backward's dqkv (`ref`).
template <typename T>
void compare_backwards(const T* ref, const T* dout, const T* qkv, const T* out, const float* lse, void* scratch, int B,
                       int Tn, int H, int KVH, int D, int reps, double flops, cudaStream_t stream) {
    const long n = (long)B * Tn * (H + 2 * KVH) * D;
    T* dqkv2;
    cudaCheck(cudaMalloc(&dqkv2, n * sizeof(T)));
    for (bool deterministic : {true, false}) {
        auto launch = [&] {
            if (D == 64) flash::backward_mma_sync<T, 64>(dqkv2, dout, qkv, out, lse, scratch, B, Tn, H, KVH, deterministic, stream);
            else flash::backward_mma_sync<T, 128>(dqkv2, dout, qkv, out, lse, scratch, B, Tn, H, KVH, deterministic, stream);
        };
        const char* what = deterministic ? "bwd_mma_sync_det" : "bwd_mma_sync_atomic";
        cudaCheck(cudaMemset(dqkv2, 0xFF, n * sizeof(T)));  // NaN: what is not written shows
        launch();
        cudaCheck(cudaStreamSynchronize(stream));
        const double err = rel_l2(dqkv2, ref, n);
        const float ms = median_ms(launch, 3, reps, stream);
        printf("ours %s %d %d %d %d %.4f %.1f\n", what, B, H, Tn, D, ms, flops / (ms * 1e-3) / 1e12);
        printf("check %d %d %d %d %s vs bwd_det: dqkv rel L2 %.2e\n", B, H, Tn, D, what, err);
    }
    cudaCheck(cudaFree(dqkv2));
}

template <typename T> void bench(int B, int H, int KVH, int Tn, int D, int reps) {
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    const long n = (long)B * Tn * H * D, n_qkv = (long)B * Tn * (H + 2 * KVH) * D;
    T* qkv = random_device_array<T>(n_qkv, 1);
    T* dout = random_device_array<T>(n, 2);
    T *out, *dqkv;
    float* lse;
    void* scratch;
    cudaCheck(cudaMalloc(&out, n * sizeof(T)));
    cudaCheck(cudaMalloc(&dqkv, n_qkv * sizeof(T)));
    cudaCheck(cudaMalloc(&lse, (long)B * H * Tn * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, flash_attention_backward_scratch_bytes(B, Tn, H, KVH, D)));
    cudaCheck(cudaDeviceSynchronize());

    const double fwd_flops = 4.0 * B * H * (double)Tn * Tn * D / 2.0;
    auto report = [&](const char* what, float ms, double flops) {
        printf("ours %s %d %d %d %d %.4f %.1f\n", what, B, H, Tn, D, ms, flops / (ms * 1e-3) / 1e12);
    };
    if (KVH != H) printf("grouped-query: %d query heads on %d kv heads\n", H, KVH);
    auto fwd = [&]() { flash_attention_forward(out, lse, qkv, B, Tn, H, KVH, D, stream); };
    report("fwd", median_ms(fwd, 3, reps, stream), fwd_flops);
    if (flash::hopper::available()) compare_forwards<T>(out, lse, qkv, B, Tn, H, KVH, D, reps, fwd_flops, stream);
    for (bool deterministic : {true, false}) {
        auto bwd = [&]() {
            flash_attention_backward(dqkv, dout, qkv, out, lse, scratch, B, Tn, H, KVH, D, deterministic, stream);
        };
        auto fwd_bwd = [&]() { fwd(); bwd(); };
        report(deterministic ? "bwd_det" : "bwd_atomic", median_ms(bwd, 3, reps, stream), 2.5 * fwd_flops);
        report(deterministic ? "fwdbwd_det" : "fwdbwd_atomic", median_ms(fwd_bwd, 3, reps, stream), 3.5 * fwd_flops);
    }

    if (flash::hopper::available()) {  // the dispatched deterministic backward as the reference
        T* ref;
        cudaCheck(cudaMalloc(&ref, n_qkv * sizeof(T)));
        flash_attention_backward(ref, dout, qkv, out, lse, scratch, B, Tn, H, KVH, D, true, stream);
        cudaCheck(cudaStreamSynchronize(stream));
        compare_backwards<T>(ref, dout, qkv, out, lse, scratch, B, Tn, H, KVH, D, reps, 2.5 * fwd_flops, stream);
        cudaCheck(cudaFree(ref));
    }

    // Untimed check at this size: `reps` deterministic backwards give the bits of the first one; the atomic
    // result is close to it.
    std::vector<T> first(n_qkv), got(n_qkv);
    auto backward_to_host = [&](std::vector<T>& host, bool deterministic) {
        flash_attention_backward(dqkv, dout, qkv, out, lse, scratch, B, Tn, H, KVH, D, deterministic, stream);
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaMemcpy(host.data(), dqkv, n_qkv * sizeof(T), cudaMemcpyDeviceToHost));
    };
    backward_to_host(first, true);
    bool same = true;
    for (int i = 0; i < reps; i++) {
        backward_to_host(got, true);
        same = same && std::memcmp(got.data(), first.data(), got.size() * sizeof(T)) == 0;
    }
    backward_to_host(got, false);
    double num = 0.0, den = 0.0;
    for (long i = 0; i < n_qkv; i++) {
        const double a = (float)got[i], b = (float)first[i];
        num += (a - b) * (a - b);
        den += b * b;
    }
    printf("check %d %d %d %d deterministic backward bitwise equal over %d runs: %s; atomic vs deterministic rel L2 %.2e\n",
           B, H, Tn, D, reps + 1, same ? "yes" : "NO", std::sqrt(num / den));
    cudaCheck(cudaFree(qkv));
    cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dqkv));
    cudaCheck(cudaFree(lse));
    cudaCheck(cudaFree(scratch));
    cudaCheck(cudaStreamDestroy(stream));
}

int main(int argc, char** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: bench_attention B H T D [bf16|fp16] [reps] [KVH]\n");
        return 2;
    }
    const int B = atoi(argv[1]), H = atoi(argv[2]), Tn = atoi(argv[3]), D = atoi(argv[4]);
    const std::string type = argc > 5 ? argv[5] : "bf16";
    const int reps = argc > 6 ? atoi(argv[6]) : 30, KVH = argc > 7 ? atoi(argv[7]) : H;
    if (type == "fp16") bench<__half>(B, H, KVH, Tn, D, reps);
    else bench<__nv_bfloat16>(B, H, KVH, Tn, D, reps);
    return 0;
}
