// The products with an NF4 weight (kernels/nf4_matmul.cuh: dequantized inside the kernel) against what they replace,
// at Llama 3 8B's linear layers (C = 4096, F = 14336): qkv (4096 -> 6144), o (4096 -> 4096), gate/up (4096 -> 28672,
// the fused [2F, C] weight) and down (14336 -> 4096), for N = 2048, 512, 16, 8 and 1 rows (tokens) unless given
// (forwards of at most 8 rows run nf4_matmul.cuh's small-rows kernel):
//   forward out[N, OC] = x[N, IC] W^T and the input gradient dx[N, IC] = dout[N, OC] W (overwriting), each as
//   (a) nf4_matmul_forward / nf4_matmul_backward_input, (b) dequantize_nf4_device to bf16 then cuBLASLt's bf16 product
//   (matmul_forward / matmul_backward_input, as the NF4 base runs them now), (c) that bf16 product alone (a bf16
//   model's cost); one line each with microseconds, TFLOP/s (2 N IC OC flops), the dequantization's own time, the
//   ratios (a) / (b) and (a) / (c) (below 1: the fused product is faster), and the relative L2 difference of (a)'s
//   output from (b)'s (the same bf16 operands: only the sums' order and rounding differ, expect 1e-3 or less).
// Weights N(0, 1)-like, double-quantized on the GPU as the NF4 base stores them; CUDA events, median of the
// repetitions after warm-up; cuBLASLt takes its heuristic's first algorithm.
// Usage: bench_nf4 [rows ...]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/matmul.cuh"
#include "../kernels/nf4.cuh"
#include "../kernels/nf4_matmul.cuh"
#include "bench_util.h"  // defines: random_device_array, median_ms

using bf16 = __nv_bfloat16;
constexpr int kWarmup = 3, kReps = 20;

struct Layer {
    const char* name;
    int IC, OC;
};

// ||a - b|| / ||b|| of two bf16 device arrays of n values.
static double relative_l2_bf16(const bf16* a, const bf16* b, size_t n) {
    std::vector<bf16> x(n), y(n);
    cudaCheck(cudaMemcpy(x.data(), a, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(y.data(), b, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double u = __bfloat162float(x[i]), v = __bfloat162float(y[i]);
        num += (u - v) * (u - v);
        den += v * v;
    }
    return den > 0.0 ? std::sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
}

// One line: the three ways of one product, with the fused output checked against the dequantize + cuBLASLt one.
template <typename Fused, typename Dequantize, typename Product>
static void compare(const char* direction, const Layer& layer, int N, Fused fused, Dequantize dequantize, Product product,
                    const bf16* fused_out, const bf16* product_out, size_t outputs, cudaStream_t stream) {
    const double flops = 2.0 * N * (double)layer.IC * layer.OC;
    const float fused_ms = median_ms(fused, kWarmup, kReps, stream);
    const float dequantize_ms = median_ms(dequantize, kWarmup, kReps, stream);
    const float both_ms = median_ms([&] { dequantize(); product(); }, kWarmup, kReps, stream);
    const float product_ms = median_ms(product, kWarmup, kReps, stream);
    fused();
    dequantize();
    product();
    cudaCheck(cudaStreamSynchronize(stream));
    const double difference = relative_l2_bf16(fused_out, product_out, outputs);
    auto tflops = [&](float ms) { return flops / (ms * 1e-3) / 1e12; };
    printf("%-8s %-7s N %5d %5d -> %5d | fused %8.1f us %6.1f TFLOP/s | dequantize + cuBLASLt %8.1f us %6.1f TFLOP/s (dequantize %6.1f us) | "
           "bf16 cuBLASLt %8.1f us %6.1f TFLOP/s | fused / (dequantize + cuBLASLt) %.2f, fused / bf16 %.2f | rel L2 %.1e\n",
           direction, layer.name, N, layer.IC, layer.OC, fused_ms * 1e3, tflops(fused_ms), both_ms * 1e3, tflops(both_ms),
           dequantize_ms * 1e3, product_ms * 1e3, tflops(product_ms), fused_ms / both_ms, fused_ms / product_ms, difference);
    fflush(stdout);
}

int main(int argc, char** argv) {
    std::vector<int> rows;
    for (int i = 1; i < argc; i++) rows.push_back(atoi(argv[i]));
    if (rows.empty()) rows = {2048, 512, 16, 8, 1};
    for (int N : rows)
        if (N <= 0) die("bench_nf4: rows must be positive, got " + std::to_string(N));
    const GpuInfo gpu = current_gpu();
    printf("bench_nf4 on %s: NF4 (double-quantized) products against dequantization + cuBLASLt bf16\n", gpu.name.c_str());
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    matmul_setup(false);
    const Layer layers[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate/up", 4096, 28672}, {"down", 14336, 4096}};
    int max_rows = 0;
    for (int N : rows) max_rows = std::max(max_rows, N);
    for (const Layer& layer : layers) {
        const size_t count = (size_t)layer.OC * layer.IC;
        float* weights = random_device_array<float>((long)count, 1);
        Nf4DeviceWeight w = allocate_nf4({(size_t)layer.OC, (size_t)layer.IC}, true);
        Nf4QuantizeScratch scratch;
        scratch.allocate(count);
        quantize_nf4_device(w, weights, scratch, stream);
        scratch.free();
        cudaCheck(cudaFree(weights));
        bf16* dense = nullptr;  // the dequantized weight (b) and (c) read
        cudaCheck(cudaMalloc(&dense, count * sizeof(bf16)));
        dequantize_nf4_device(dense, w, stream);
        bf16 *x = random_device_array<bf16>((long)max_rows * layer.IC, 2), *dout = random_device_array<bf16>((long)max_rows * layer.OC, 3);
        bf16 *out, *out_ref, *dx, *dx_ref;
        for (bf16** p : {&out, &out_ref}) cudaCheck(cudaMalloc(p, (size_t)max_rows * layer.OC * sizeof(bf16)));
        for (bf16** p : {&dx, &dx_ref}) cudaCheck(cudaMalloc(p, (size_t)max_rows * layer.IC * sizeof(bf16)));
        auto dequantize = [&] { dequantize_nf4_device(dense, w, stream); };
        for (int N : rows) {
            compare("forward", layer, N, [&] { nf4_matmul_forward(out, x, w, nullptr, N, stream); }, dequantize,
                    [&] { matmul_forward(out_ref, x, dense, (const bf16*)nullptr, N, layer.IC, layer.OC, stream); }, out, out_ref,
                    (size_t)N * layer.OC, stream);
            compare("backward", layer, N, [&] { nf4_matmul_backward_input(dx, dout, w, N, false, stream); }, dequantize,
                    [&] { matmul_backward_input(dx_ref, dout, dense, N, layer.IC, layer.OC, stream); }, dx, dx_ref, (size_t)N * layer.IC,
                    stream);
        }
        for (bf16* p : {dense, x, dout, out, out_ref, dx, dx_ref}) cudaCheck(cudaFree(p));
        free_nf4(w);
    }
    matmul_teardown();
    cudaCheck(cudaStreamDestroy(stream));
    return 0;
}
