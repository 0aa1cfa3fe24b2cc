// SwiGLU, the Llama family's MLP activation (transformers' act_fn(gate_proj(x)) * up_proj(x) with act_fn SiLU), over
// the fused gate and up projection's output: forward and backward.
// defines: swiglu_forward, swiglu_backward
#pragma once
#include "common.cuh"

// Rows of inp are [gate (F) | up (F)]. Each thread takes X adjacent columns of one row (F a multiple of 8, so a
// thread's X columns never straddle two rows and every 16-byte access is aligned), computes in fp32 and rounds once:
// transformers rounds silu(gate) to the model's type before the product, within an ulp of this. SiLU as PyTorch
// computes it, x / (1 + exp(-x)), with the accurate expf: large negative x gives exp(-x) = inf and silu -0, no NaN.
template <typename floatX>
__global__ void swiglu_forward_kernel(floatX* out, const floatX* inp, long N, int F) {
    constexpr int X = Packed128<floatX>::size;
    const long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;  // into out (N x F)
    if (idx >= N * F) return;
    const long row = idx / F, col = idx % F;
    const floatX* gate = inp + row * 2 * F + col;
    const Packed128<floatX> g = load128cs(gate), u = load128cs(gate + F);
    Packed128<floatX> y;
    for (int i = 0; i < X; i++) {
        const float x = to_float(g[i]);
        y[i] = from_float<floatX>(x / (1.0f + expf(-x)) * to_float(u[i]));
    }
    store128(out + idx, y);
}

// dgate = dout * up * silu'(gate), silu'(x) = sigmoid(x) + silu(x) (1 - sigmoid(x)); dup = dout * silu(gate). Each
// thread reads its gate and up values before it writes their gradients to the same places, so dinp may be inp.
template <typename floatX>
__global__ void swiglu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, long N, int F) {
    constexpr int X = Packed128<floatX>::size;
    const long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;  // into dout (N x F)
    if (idx >= N * F) return;
    const long row = idx / F, at = row * 2 * F + idx % F;
    const Packed128<floatX> g = load128cs(inp + at), u = load128cs(inp + at + F), dy = load128cs(dout + idx);
    Packed128<floatX> dg, du;
    for (int i = 0; i < X; i++) {
        const float x = to_float(g[i]), d = to_float(dy[i]);
        const float e = 1.0f + expf(-x), sigmoid = 1.0f / e, silu = x / e;
        dg[i] = from_float<floatX>(d * to_float(u[i]) * (sigmoid + silu * (1.0f - sigmoid)));
        du[i] = from_float<floatX>(d * silu);
    }
    store128(dinp + at, dg);
    store128(dinp + at + F, du);
}

inline void swiglu_check_width(int F, const char* what) {
    if (F <= 0 || F % 8 != 0) die(std::string(what) + ": F=" + std::to_string(F) + " must be a positive multiple of 8");
}

// out[N, F] = silu(gate) * up of inp[N, 2F] = [gate | up]. out must not overlap inp.
template <typename floatX>
void swiglu_forward(floatX* out, const floatX* inp, long N, int F, cudaStream_t stream) {
    swiglu_check_width(F, "swiglu_forward");
    swiglu_forward_kernel<<<ceil_div(N * F / Packed128<floatX>::size, 256), 256, 0, stream>>>(out, inp, N, F);
    cudaCheckLaunch();
}
// dinp[N, 2F] = [dgate | dup] from the forward's inp[N, 2F] and dout[N, F], overwritten (not accumulated), as
// gelu_backward (same argument order) writes its gradient. dinp may be inp (the forward's input is dead after this); dout must not overlap
// dinp.
template <typename floatX>
void swiglu_backward(floatX* dinp, const floatX* inp, const floatX* dout, long N, int F, cudaStream_t stream) {
    swiglu_check_width(F, "swiglu_backward");
    swiglu_backward_kernel<<<ceil_div(N * F / Packed128<floatX>::size, 256), 256, 0, stream>>>(dinp, inp, dout, N, F);
    cudaCheckLaunch();
}
