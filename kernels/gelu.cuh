// GELU, tanh approximation (as GPT-2 and PyTorch's approximate="tanh"): forward and backward.
// defines: gelu_tanh, gelu_forward, gelu_backward
#pragma once
#include "common.cuh"

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
__device__ __forceinline__ float gelu_tanh(float v) { return 0.5f * v * (1.0f + tanhf(kGeluScale * (v + 0.044715f * v * v * v))); }

template <typename floatX>
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, long n) {
    constexpr int X = Packed128<floatX>::size;
    long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;
    if (idx >= n) return;
    Packed128<floatX> x = load128cs(inp + idx), y;
    for (int i = 0; i < X; i++) {
        y[i] = from_float<floatX>(gelu_tanh(to_float(x[i])));
    }
    store128(out + idx, y);
}

// dinp = dout * gelu'(inp) (overwritten; dinp may alias dout).
template <typename floatX>
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, long n) {
    constexpr int X = Packed128<floatX>::size;
    long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;
    if (idx >= n) return;
    Packed128<floatX> x = load128cs(inp + idx), g = load128(dout + idx), d;
    for (int i = 0; i < X; i++) {
        float v = to_float(x[i]);
        float u = kGeluScale * (v + 0.044715f * v * v * v);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
        d[i] = from_float<floatX>(grad * to_float(g[i]));
    }
    store128(dinp + idx, d);
}

template <typename floatX>
void gelu_forward(floatX* out, const floatX* inp, long n, cudaStream_t stream) {
    gelu_forward_kernel<<<ceil_div(n / Packed128<floatX>::size, 256), 256, 0, stream>>>(out, inp, n);
    cudaCheckLaunch();
}
template <typename floatX>
void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, long n, cudaStream_t stream) {
    gelu_backward_kernel<<<ceil_div(n / Packed128<floatX>::size, 256), 256, 0, stream>>>(dinp, inp, dout, n);
    cudaCheckLaunch();
}
