// FP8 against bf16 at the 6.6B GPT's widths (C = 4096; rows = B x T tokens, 4096 unless given):
//   the cast bf16 -> E4M3 (kernels/fp8.cuh) with its fused amax, plain and with the transposed copy, and the amax
//     alone, against cudaMemcpy (device to device) of the input's bytes, on the activations and gradients the four
//     products cast (4096, 12288 and 16384 wide). TB/s counts the bytes each moves: the cast reads 2 bytes a value
//     and writes 1 (2 with the transposed copy), the amax reads 2, the copy reads and writes the input's 2;
//   the FP8 products (matmul_fp8: E4M3 x E4M3 forward with bias, E4M3 x E5M2 input and weight gradients, the weight
//     gradient accumulating) against the bf16 ones as the model runs them (matmul_forward, matmul_backward_input,
//     matmul_backward_weights) for qkv (4096 -> 12288), the attention projection (4096 -> 4096), fc (4096 -> 16384)
//     and the fc projection (16384 -> 4096): TFLOP/s of each and FP8's speed-up, one line a layer;
//   the kernels that cast what they produce (kernels/fp8_fused.cuh) at GPT-2 124M's, 1.5B's and 6.6B's widths (C =
//     768, 1600, 4096): the residual add + LayerNorm (C wide) and the GELU (4C wide) writing E4M3 with the transposed
//     copy (a training forward) and without it, against the copy's TB/s and against the kernels they replace (the
//     bf16 kernel, then the forward's cast, and the backward's transposing cast of the same bf16 output). TB/s counts
//     the bytes each must move: the LayerNorm reads a and b (2 + 2 bytes a value) and writes the residual (2) and the
//     codes (1, or 2 with the transposed copy; its statistics' re-reads of the residual are cache hits); the GELU
//     reads 2 and writes 1 or 2.
// CUDA events, median of the repetitions after warm-up; random inputs. "autotune" times cuBLASLt's candidates at
// each product's first call (matmul_setup's autotune) for both precisions; without it both take the heuristic's
// first choice.
// Usage: bench_fp8 [rows] [autotune]   (rows: 65536 is GPT-2 124M's B=64 x T=1024)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/fp8.cuh"
#include "../kernels/fp8_fused.cuh"
#include "../kernels/matmul.cuh"
#include "bench_util.h"  // defines: random_device_array, median_ms

using bf16 = __nv_bfloat16;
using e4m3 = __nv_fp8_e4m3;
using e5m2 = __nv_fp8_e5m2;
constexpr int kWarmup = 3, kReps = 20;

// An FP8 copy of a bf16 tensor [rows, cols] and its transpose, with its scaling state made from its own amax.
template <typename fp8>
struct Fp8Tensor {
    fp8 *q = nullptr, *q_t = nullptr;
    Fp8Scaling* scaling = nullptr;
    Fp8Tensor(const bf16* src, long rows, long cols, cudaStream_t stream) {
        cudaCheck(cudaMalloc(&q, rows * cols));
        cudaCheck(cudaMalloc(&q_t, rows * cols));
        cudaCheck(cudaMalloc(&scaling, sizeof(Fp8Scaling)));
        const Fp8Scaling initial;
        cudaCheck(cudaMemcpy(scaling, &initial, sizeof initial, cudaMemcpyHostToDevice));
        fp8_amax(&scaling->amax, src, rows * cols, stream);
        fp8_update_scales(scaling, 1, Fp8Traits<fp8>::format, 0, stream);
        fp8_cast(q, q_t, src, rows, cols, scaling, stream);
    }
    ~Fp8Tensor() {
        cudaFree(q);
        cudaFree(q_t);
        cudaFree(scaling);
    }
    const float* inverse_scale() const { return &scaling->inverse_scale; }
};

void bench_cast(long rows, long cols, cudaStream_t stream) {
    const long n = rows * cols;
    bf16* x = random_device_array<bf16>(n, 1);
    void* copy;
    cudaCheck(cudaMalloc(&copy, n * sizeof(bf16)));
    Fp8Tensor<e4m3> t(x, rows, cols, stream);
    const float cast_ms = median_ms([&] { fp8_cast<e4m3>(t.q, nullptr, x, rows, cols, t.scaling, stream); }, kWarmup, kReps, stream);
    const float transposed_ms = median_ms([&] { fp8_cast<e4m3>(t.q, t.q_t, x, rows, cols, t.scaling, stream); }, kWarmup, kReps, stream);
    const float amax_ms = median_ms([&] { fp8_amax(&t.scaling->amax, x, n, stream); }, kWarmup, kReps, stream);
    const float copy_ms = median_ms([&] { cudaCheck(cudaMemcpyAsync(copy, x, n * sizeof(bf16), cudaMemcpyDeviceToDevice, stream)); },
                                    kWarmup, kReps, stream);
    auto tbps = [](double bytes, float ms) { return bytes / ms / 1e9; };
    const double copy_tbps = tbps(4.0 * n, copy_ms);
    printf("cast %ld x %ld bf16 -> E4M3 | cast %.1f us %.2f TB/s (%.2f of the copy's) | with transpose %.1f us %.2f TB/s (%.2f) | "
           "amax alone %.1f us %.2f TB/s (%.2f) | cudaMemcpy of %.0f MiB %.1f us %.2f TB/s\n",
           rows, cols, cast_ms * 1e3, tbps(3.0 * n, cast_ms), tbps(3.0 * n, cast_ms) / copy_tbps, transposed_ms * 1e3,
           tbps(4.0 * n, transposed_ms), tbps(4.0 * n, transposed_ms) / copy_tbps, amax_ms * 1e3, tbps(2.0 * n, amax_ms),
           tbps(2.0 * n, amax_ms) / copy_tbps, 2.0 * n / (1 << 20), copy_ms * 1e3, copy_tbps);
    cudaCheck(cudaFree(x));
    cudaCheck(cudaFree(copy));
}

// The casts fused with their producers at width C, rows x C (the GELU's rows: 4C wide), against the copy limit and the
// kernels they replace.
void bench_fused(long rows, int C, cudaStream_t stream) {
    const long n = rows * C, wide = 4 * n;
    bf16 *a = random_device_array<bf16>(n, 11), *b = random_device_array<bf16>(n, 12), *w = random_device_array<bf16>(C, 13);
    bf16 *bias = random_device_array<bf16>(C, 14), *fch = random_device_array<bf16>(wide, 15);
    bf16 *residual, *produced;  // produced: the bf16 output of the kernels the fused ones replace
    float *mean, *rstd;
    e4m3 *q, *q_t;
    cudaCheck(cudaMalloc(&residual, n * sizeof(bf16)));
    cudaCheck(cudaMalloc(&produced, wide * sizeof(bf16)));
    cudaCheck(cudaMalloc(&mean, rows * sizeof(float)));
    cudaCheck(cudaMalloc(&rstd, rows * sizeof(float)));
    cudaCheck(cudaMalloc(&q, wide));
    cudaCheck(cudaMalloc(&q_t, wide));
    Fp8Tensor<e4m3> scaled(a, rows, C, stream);  // its scaling state (the scale of a's amax) serves every cast here
    Fp8Scaling* s = scaled.scaling;
    // the copy's TB/s (device to device, reading and writing 2 bytes a value) over `values` bf16 values
    auto copy_tbps = [&](long values) {
        const float ms = median_ms([&] { cudaCheck(cudaMemcpyAsync(produced, fch, values * sizeof(bf16), cudaMemcpyDeviceToDevice, stream)); },
                                   kWarmup, kReps, stream);
        return 4.0 * values / ms / 1e9;
    };
    struct Variant {
        const char* what;
        double bytes_per_value;
        float fused_ms, replaced_ms;
    };
    auto print = [&](const char* kernel, long cols, const Variant (&variants)[2]) {
        const double copy = copy_tbps(rows * cols);
        printf("%-25s %6ld x %5ld -> E4M3 (copy %.2f TB/s)", kernel, rows, cols, copy);
        for (const Variant& v : variants) {
            const double tbps = v.bytes_per_value * rows * cols / v.fused_ms / 1e9;
            printf(" | %s %.1f us %.2f TB/s (%.2f of the copy's), replaced kernels %.1f us (%.2fx)", v.what, v.fused_ms * 1e3, tbps, tbps / copy,
                   v.replaced_ms * 1e3, v.replaced_ms / v.fused_ms);
        }
        printf("\n");
    };
    auto layernorm_bf16 = [&] { residual_layernorm_forward(residual, produced, mean, rstd, a, b, w, bias, (int)rows, C, stream); };
    const Variant layernorm[2] = {
        {"with transpose", 8.0,
         median_ms([&] { residual_layernorm_forward_fp8(residual, q, q_t, mean, rstd, a, b, w, bias, (int)rows, C, s, stream); }, kWarmup, kReps, stream),
         median_ms([&] { layernorm_bf16(); fp8_cast(q, (e4m3*)nullptr, produced, rows, C, s, stream); fp8_cast((e4m3*)nullptr, q_t, produced, rows, C, s, stream); },
                   kWarmup, kReps, stream)},
        {"row-major only", 7.0,
         median_ms([&] { residual_layernorm_forward_fp8(residual, q, nullptr, mean, rstd, a, b, w, bias, (int)rows, C, s, stream); }, kWarmup, kReps, stream),
         median_ms([&] { layernorm_bf16(); fp8_cast(q, (e4m3*)nullptr, produced, rows, C, s, stream); }, kWarmup, kReps, stream)},
    };
    print("residual add + LayerNorm", C, layernorm);
    auto gelu_bf16 = [&] { gelu_forward(produced, fch, wide, stream); };
    const Variant gelu[2] = {
        {"with transpose", 4.0, median_ms([&] { fp8_gelu_cast(q, q_t, fch, rows, 4L * C, s, stream); }, kWarmup, kReps, stream),
         median_ms([&] { gelu_bf16(); fp8_cast(q, (e4m3*)nullptr, produced, rows, 4L * C, s, stream); fp8_cast((e4m3*)nullptr, q_t, produced, rows, 4L * C, s, stream); },
                   kWarmup, kReps, stream)},
        {"row-major only", 3.0, median_ms([&] { fp8_gelu_cast(q, nullptr, fch, rows, 4L * C, s, stream); }, kWarmup, kReps, stream),
         median_ms([&] { gelu_bf16(); fp8_cast(q, (e4m3*)nullptr, produced, rows, 4L * C, s, stream); }, kWarmup, kReps, stream)},
    };
    print("GELU", 4L * C, gelu);
    for (void* p : {(void*)a, (void*)b, (void*)w, (void*)bias, (void*)fch, (void*)residual, (void*)produced, (void*)mean, (void*)rstd, (void*)q, (void*)q_t})
        cudaCheck(cudaFree(p));
}

// One Linear layer (C inputs, OC outputs, N rows): its three products in bf16 and in FP8.
void bench_layer(const char* name, int N, int C, int OC, cudaStream_t stream) {
    bf16 *inp = random_device_array<bf16>((long)N * C, 2), *w = random_device_array<bf16>((long)OC * C, 3);
    bf16 *dout = random_device_array<bf16>((long)N * OC, 4), *bias = random_device_array<bf16>(OC, 5);
    bf16 *out = random_device_array<bf16>((long)N * OC, 6), *dinp = random_device_array<bf16>((long)N * C, 7);
    bf16* dw = random_device_array<bf16>((long)OC * C, 8);
    Fp8Tensor<e4m3> inp_q(inp, N, C, stream), w_q(w, OC, C, stream);
    Fp8Tensor<e5m2> dout_q(dout, N, OC, stream);
    const double tflop = 2.0 * N * C * OC / 1e12;
    struct Product {
        const char* what;
        float bf16_ms, fp8_ms;
    };
    const Product products[] = {
        {"forward", median_ms([&] { matmul_forward(out, inp, w, bias, N, C, OC, stream); }, kWarmup, kReps, stream),
         median_ms([&] { matmul_fp8(out, w_q.q, inp_q.q, w_q.inverse_scale(), inp_q.inverse_scale(), bias, OC, N, C, false, stream); },
                   kWarmup, kReps, stream)},
        {"input grad", median_ms([&] { matmul_backward_input(dinp, dout, w, N, C, OC, stream); }, kWarmup, kReps, stream),
         median_ms([&] { matmul_fp8(dinp, w_q.q_t, dout_q.q, w_q.inverse_scale(), dout_q.inverse_scale(), (const bf16*)nullptr, C, N, OC,
                                    false, stream); },
                   kWarmup, kReps, stream)},
        {"weight grad", median_ms([&] { matmul_backward_weights(dw, (bf16*)nullptr, nullptr, dout, inp, N, C, OC, stream); }, kWarmup, kReps, stream),
         median_ms([&] { matmul_fp8(dw, inp_q.q_t, dout_q.q_t, inp_q.inverse_scale(), dout_q.inverse_scale(), (const bf16*)nullptr, C, OC,
                                    N, true, stream); },
                   kWarmup, kReps, stream)},
    };
    printf("%-20s %5d -> %5d, %d rows", name, C, OC, N);
    for (const Product& p : products)
        printf(" | %s bf16 %.0f fp8 %.0f TFLOP/s (%.2fx)", p.what, tflop / p.bf16_ms * 1e3, tflop / p.fp8_ms * 1e3, p.bf16_ms / p.fp8_ms);
    printf("\n");
    for (bf16* p : {inp, w, dout, bias, out, dinp, dw}) cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 4096;
    const bool autotune = argc > 2 && strcmp(argv[2], "autotune") == 0;
    if (rows <= 0 || rows % 16 != 0) die("bench_fp8: rows must be a positive multiple of 16 (the weight gradient's reduction), got " + std::string(argc > 1 ? argv[1] : ""));
    const GpuInfo gpu = current_gpu();
    require_fp8_gpu();
    printf("%s, %d rows, cuBLASLt %s\n", gpu.name.c_str(), rows, autotune ? "autotuned" : "heuristic's first choice");
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    matmul_setup(false, autotune);
    for (long cols : {4096L, 12288L, 16384L}) bench_cast(rows, cols, stream);
    for (int C : {768, 1600, 4096}) bench_fused(rows, C, stream);
    bench_layer("qkv", rows, 4096, 12288, stream);
    bench_layer("attention projection", rows, 4096, 4096, stream);
    bench_layer("fc", rows, 4096, 16384, stream);
    bench_layer("fc projection", rows, 16384, 4096, stream);
    matmul_teardown();
    cudaCheck(cudaStreamDestroy(stream));
    return 0;
}
