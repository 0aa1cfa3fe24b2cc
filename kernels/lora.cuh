// LoRA adapters (Hu et al. 2021) on a frozen linear layer: y = W0 x + b + s B A dropout(x), s = alpha / r,
// A (r, in), B (out, r). The adapter path is four small cuBLASLt products around the base product, which
// stays as it is (so with B = 0 the output is bitwise the base model's); the rank-r intermediate
// u = A dropout(x) (N x r) is kept for the backward. Dropout masks come from (seed, element index), so the
// backward regenerates them instead of storing them.
// defines: lora_forward, lora_backward, lora_dropout
#pragma once
#include "common.cuh"
#include "matmul.cuh"

// out = x * keep / (1 - p), keep drawn with probability 1 - p from (seed, i).
template <typename floatX>
__global__ void lora_dropout_kernel(floatX* out, const floatX* x, long n, float p, uint64_t seed) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float u = (random_u32(seed, i) >> 8) / 16777216.0f;
        out[i] = from_float<floatX>(u >= p ? to_float(x[i]) / (1.0f - p) : 0.0f);
    }
}
template <typename floatX>
void lora_dropout(floatX* out, const floatX* x, long n, float p, uint64_t seed, cudaStream_t stream) {
    lora_dropout_kernel<<<std::min<long>(ceil_div(n, 256), 65535), 256, 0, stream>>>(out, x, n, p, seed);
    cudaCheckLaunch();
}

// out (N, out) += s * (x_in A^T) B^T, keeping u = x_in A^T (N, r). x_in is the (dropped-out) input (N, in).
template <typename floatX>
void lora_forward(floatX* out, floatX* u, const floatX* x_in, const floatX* A, const floatX* B, float scale, int N, int in,
                  int out_features, int r, cudaStream_t stream) {
    matmul_forward(u, x_in, A, (const floatX*)nullptr, N, in, r, stream);
    matmul_cublaslt(out, B, u, (const floatX*)nullptr, out_features, N, r, true, false, true, stream, scale);
}

// Given dout (N, out): dB += s dout^T u, du = s dout B (scratch, N x r), dA += du^T x_in, and the input
// gradient of the adapter path du A, added into dx_in (which the caller masks when there is dropout).
template <typename floatX>
void lora_backward(floatX* dx_in, floatX* dA, floatX* dB, floatX* du, const floatX* dout, const floatX* u, const floatX* x_in,
                   const floatX* A, const floatX* B, float scale, int N, int in, int out_features, int r, bool accumulate_dx,
                   cudaStream_t stream) {
    matmul_cublaslt(dB, u, dout, (const floatX*)nullptr, r, out_features, N, false, true, true, stream, scale);
    matmul_cublaslt(du, B, dout, (const floatX*)nullptr, r, N, out_features, false, false, false, stream, scale);
    matmul_cublaslt(dA, x_in, du, (const floatX*)nullptr, in, r, N, false, true, true, stream);
    matmul_cublaslt(dx_in, A, du, (const floatX*)nullptr, in, N, r, false, false, accumulate_dx, stream);
}
