// Timing of two memory-bound kernels of the step in bf16, at the widths of the GPT sizes this project trains:
//   the LayerNorm backward (kernels/layernorm.cuh) as layernorm_backward dispatches it (with its partial-row sums),
//     and each of its two kernels alone where both can take the width: the warp kernel (shared-memory accumulators,
//     up to C = 6144) and the wide kernel (register accumulators, any C up to kLayerNormWideMaxC), so that
//     kLayerNormWideFrom can be checked on a new GPU;
//   AdamW (kernels/adamw.cuh) over 2^30 parameters, beside a copy of its eight streams without the arithmetic (read
//     bf16 gradients and fp32 m, v, master weights; write those three and the bf16 parameters): the bandwidth that
//     access pattern allows, with AdamW's 4 elements a thread an iteration and with 8.
// TB/s counts the bytes each kernel must move: the LayerNorm backward reads x, dy and dinp and writes dinp (8 bytes
// a value); AdamW moves 28 bytes a parameter. CUDA events, median of the repetitions after warm-up; random inputs.
// Usage: bench_memory_bound [rows ...]   (default 4096 8192)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/layernorm.cuh"
#include "../kernels/adamw.cuh"
#include "bench_util.h"  // defines: random_device_array, median_ms

using bf16 = __nv_bfloat16;

// AdamW's memory traffic alone: the same loads and stores as adamw_kernel, element i's outputs from its inputs by
// additions only, with kElements consecutive elements a thread an iteration: 4 as adamw_kernel (one float4 of each
// fp32 array, 8 bytes of each bf16 one), 8 the wider access it is compared with (one 16-byte bf16 vector, two float4
// of each fp32 array). n: a multiple of kElements.
template <int kElements>
__global__ void adamw_streams_copy_kernel(bf16* params, float* master, const bf16* grads, float* m, float* v, long n) {
    constexpr int F = kElements / 4;  // float4 a thread of each fp32 array
    using BF16Bits = std::conditional_t<kElements == 4, uint2, uint4>;
    for (long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * kElements; i < n; i += (long)gridDim.x * blockDim.x * kElements) {
        const BF16Bits g = __ldcs(reinterpret_cast<const BF16Bits*>(grads + i));
        float4 mm[F], vv[F], pm[F];
        for (int k = 0; k < F; k++) {
            mm[k] = __ldcs(reinterpret_cast<const float4*>(m + i) + k);
            vv[k] = __ldcs(reinterpret_cast<const float4*>(v + i) + k);
            pm[k] = __ldcs(reinterpret_cast<const float4*>(master + i) + k);
        }
        for (int k = 0; k < F; k++) {
            mm[k].x += 1.0f; vv[k].x += 1.0f; pm[k].x += 1.0f;
            __stcs(reinterpret_cast<float4*>(m + i) + k, mm[k]);
            __stcs(reinterpret_cast<float4*>(v + i) + k, vv[k]);
            __stcs(reinterpret_cast<float4*>(master + i) + k, pm[k]);
        }
        __stcs(reinterpret_cast<BF16Bits*>(params + i), g);
    }
}

void bench_layernorm_backward(long N, int C, cudaStream_t stream) {
    const long n = N * C;
    bf16 *x = random_device_array<bf16>(n, 1), *dy = random_device_array<bf16>(n, 2), *dx = random_device_array<bf16>(n, 3);
    bf16 *w = random_device_array<bf16>(C, 4), *dwb = random_device_array<bf16>(2 * C, 5), *colsum = random_device_array<bf16>(C, 6);
    float *mean = random_device_array<float>(N, 7), *rstd = random_device_array<float>(N, 8), *scratch;
    cudaCheck(cudaMalloc(&scratch, layernorm_backward_scratch_floats(C) * sizeof(float)));
    const int blocks = layernorm_backward_blocks(), warmup = 3, reps = 20;
    const double gb = 8.0 * n / 1e9;
    auto report = [&](const char* what, float ms) { printf(" | %s %.1f us %.2f TB/s", what, ms * 1e3, gb / ms); };
    printf("layernorm_backward rows %ld C %d (%s kernel dispatched)", N, C, layernorm_backward_is_wide(C) ? "wide" : "warp");
    report("dispatched", median_ms([&] { layernorm_backward(dx, dwb, scratch, dy, x, w, mean, rstd, (int)N, C, stream); }, warmup, reps, stream));
    report("with column sums", median_ms([&] { layernorm_backward(dx, dwb, scratch, dy, x, w, mean, rstd, (int)N, C, stream, colsum); },
                                         warmup, reps, stream));
    const int warps = layernorm_backward_warps(C);
    const size_t shared_bytes = (size_t)warps * 2 * C * sizeof(float);
    if (shared_bytes <= 48 * 1024)
        report("warp kernel alone", median_ms([&] {
                   layernorm_backward_kernel<<<blocks, warps * 32, shared_bytes, stream>>>(dx, scratch, dy, x, w, mean, rstd, (int)N, C);
               }, warmup, reps, stream));
    const int threads = layernorm_backward_wide_threads(C);
    auto wide = layernorm_backward_wide_kernel_for<bf16>(C, false);
    report("wide kernel alone", median_ms([&] { wide<<<blocks, threads, 0, stream>>>(dx, scratch, dy, x, w, mean, rstd, (int)N, C); },
                                          warmup, reps, stream));
    cudaCheck(cudaGetLastError());
    printf("\n");
    for (void* p : {(void*)x, (void*)dy, (void*)dx, (void*)w, (void*)dwb, (void*)colsum, (void*)mean, (void*)rstd, (void*)scratch})
        cudaCheck(cudaFree(p));
}

void bench_adamw(cudaStream_t stream) {
    const long n = 1L << 30;
    bf16 *params = random_device_array<bf16>(n, 11), *grads = random_device_array<bf16>(n, 12);
    float *master = random_device_array<float>(n, 13), *m = random_device_array<float>(n, 14), *v;
    cudaCheck(cudaMalloc(&v, n * sizeof(float)));
    cudaCheck(cudaMemset(v, 0, n * sizeof(float)));  // v >= 0, as AdamW keeps it
    float* norm_squared;
    const float one = 1.0f;
    cudaCheck(cudaMalloc(&norm_squared, sizeof(float)));
    cudaCheck(cudaMemcpy(norm_squared, &one, sizeof(float), cudaMemcpyHostToDevice));
    AdamWHyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 3, 1234};
    // decay on a GPT's pattern (C = 4096): the embeddings, then in each block its matrices but not its vectors
    LayoutMask mask;
    const long C = 4096, block = 12 * C * C + 13 * C;
    mask.head_end = mask.blocks_begin = 1L << 28;
    mask.blocks_end = n;
    mask.block_size = block;
    mask.num_ranges = 2;
    mask.range_begin[0] = C, mask.range_end[0] = C + 3 * C * C;
    mask.range_begin[1] = 5 * C + 3 * C * C, mask.range_end[1] = 12 * C * C;
    const double gb = 28.0 * n / 1e9;
    const float adamw_ms = median_ms([&] { adamw_update(params, master, grads, m, v, n, 0, h, norm_squared, mask, stream); }, 1, 5, stream);
    printf("adamw %ld parameters: %.2f ms %.2f TB/s | its eight streams copied, by elements a thread an iteration:", n, adamw_ms,
           gb / adamw_ms);
    const int grid = std::max(1, (int)std::min<long>(ceil_div(n / 4, 512), (long)device_sm_count() * 8));  // adamw_update's
    auto copy = [&](int elements, auto kernel) {
        const float ms = median_ms([&] { kernel<<<grid, 512, 0, stream>>>(params, master, grads, m, v, n); }, 1, 5, stream);
        cudaCheck(cudaGetLastError());
        printf(" | %d: %.2f ms %.2f TB/s", elements, ms, gb / ms);
    };
    copy(4, adamw_streams_copy_kernel<4>);
    copy(8, adamw_streams_copy_kernel<8>);
    printf("\n");
    for (void* p : {(void*)params, (void*)grads, (void*)master, (void*)m, (void*)v, (void*)norm_squared}) cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    std::vector<long> rows;
    for (int i = 1; i < argc; i++) {
        char* end = nullptr;
        const long r = strtol(argv[i], &end, 10);
        if (*end != '\0' || r < 1) {
            fprintf(stderr, "bench_memory_bound: rows must be positive integers, got '%s'\n", argv[i]);
            return 2;
        }
        rows.push_back(r);
    }
    if (rows.empty()) rows = {4096, 8192};
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("%s, bf16\n", prop.name);
    for (long N : rows)
        for (int C : {768, 1024, 1536, 1600, 2048, 4096, 5120, 8192}) bench_layernorm_backward(N, C, stream);
    bench_adamw(stream);
    return 0;
}
