// LayerNorm (eps 1e-5, fp32 statistics): forward, forward fused with the residual add that precedes it,
// and a deterministic backward.
// defines: layernorm_forward, residual_layernorm_forward, residual_forward, layernorm_backward, layernorm_backward_scratch_floats
#pragma once
#include "common.cuh"

constexpr float kLayerNormEps = 1e-5f;

// One warp per row. The row is read three times (mean, variance, output); the re-reads hit L1/L2.
// When `residual_out` is given, the normalised input is a + b, which is also written to residual_out.
template <typename floatX>
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, floatX* residual_out,
                                         const floatX* a, const floatX* b, const floatX* weight,
                                         const floatX* bias, int N, int C) {
    constexpr int X = Packed128<floatX>::size;
    const int lane = threadIdx.x % 32;
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const floatX* x = a + row * C;
    if (residual_out != nullptr) {  // residual = a + b, rounded to floatX once so that backward sees the same values
        const floatX* y = b + row * C;
        floatX* r = residual_out + row * C;
        for (int c = lane * X; c < C; c += 32 * X) {
            Packed128<floatX> va = load128cs(x + c), vb = load128cs(y + c), vr;
            for (int i = 0; i < X; i++) vr[i] = from_float<floatX>(to_float(va[i]) + to_float(vb[i]));
            store128(r + c, vr);
        }
        __syncwarp();
        x = r;
    }
    float sum = 0.0f;
    for (int c = lane * X; c < C; c += 32 * X) {
        Packed128<floatX> v = load128(x + c);
        for (int i = 0; i < X; i++) sum += to_float(v[i]);
    }
    const float m = warp_reduce_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * X; c < C; c += 32 * X) {
        Packed128<floatX> v = load128(x + c);
        for (int i = 0; i < X; i++) { float d = to_float(v[i]) - m; var += d * d; }
    }
    const float s = rsqrtf(warp_reduce_sum(var) / C + kLayerNormEps);
    for (int c = lane * X; c < C; c += 32 * X) {
        Packed128<floatX> v = load128cs(x + c), w = load128(weight + c), bb = load128(bias + c), o;
        for (int i = 0; i < X; i++)
            o[i] = from_float<floatX>((to_float(v[i]) - m) * s * to_float(w[i]) + to_float(bb[i]));
        store128(out + row * C + c, o);
    }
    if (lane == 0) { mean[row] = m; rstd[row] = s; }
}

template <typename floatX>
void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                       const floatX* bias, int N, int C, cudaStream_t stream) {
    const int block = 256, rows_per_block = block / 32;
    layernorm_forward_kernel<<<ceil_div(N, rows_per_block), block, 0, stream>>>(
        out, mean, rstd, (floatX*)nullptr, inp, (const floatX*)nullptr, weight, bias, N, C);
    cudaCheckLaunch();
}

// residual = a + b; out = LayerNorm(residual). Saves a full pass over the residual stream.
template <typename floatX>
void residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd, const floatX* a,
                                const floatX* b, const floatX* weight, const floatX* bias, int N, int C,
                                cudaStream_t stream) {
    const int block = 256, rows_per_block = block / 32;
    layernorm_forward_kernel<<<ceil_div(N, rows_per_block), block, 0, stream>>>(out, mean, rstd, residual, a, b,
                                                                               weight, bias, N, C);
    cudaCheckLaunch();
}

// residual = a + b alone, rounded as residual_layernorm_forward rounds it: where a pipeline stage's last block
// hands the residual stream to the next stage, whose first block normalises it (layernorm_forward).
template <typename floatX>
__global__ void residual_forward_kernel(floatX* residual, const floatX* a, const floatX* b, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        residual[i] = from_float<floatX>(to_float(a[i]) + to_float(b[i]));
}
template <typename floatX>
void residual_forward(floatX* residual, const floatX* a, const floatX* b, long n, cudaStream_t stream) {
    residual_forward_kernel<<<std::max(1, std::min(ceil_div(n, 256), 4 * device_sm_count())), 256, 0, stream>>>(residual, a, b, n);
    cudaCheckLaunch();
}

// Backward. One warp per row; each warp accumulates its rows' dweight/dbias contributions in its own
// shared-memory region (no atomics), the block adds its warps in order into one partial row, and
// partials_accumulate adds the blocks in order: bitwise reproducible.
// dinp is accumulated (+=): it is the residual stream's gradient, which the LayerNorm joins.
template <typename floatX>
__global__ void layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N,
                                          int C) {
    constexpr int X = Packed128<floatX>::size;
    // [warps][2][X][C/X]: dweight then dbias, column c at (c % X) * (C / X) + c / X, so that the 32 lanes
    // (each owning X adjacent columns) touch 32 consecutive banks instead of colliding X-way
    extern __shared__ float shared[];
    const int CX = C / X;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    float* acc = shared + (long)warp * 2 * C;
    for (int c = lane; c < 2 * C; c += 32) acc[c] = 0.0f;
    __syncwarp();
    for (long row = (long)blockIdx.x * num_warps + warp; row < N; row += (long)gridDim.x * num_warps) {
        const floatX* x = inp + row * C;
        const floatX* dy = dout + row * C;
        const float m = mean[row], s = rstd[row];
        float sum_dnorm = 0.0f, sum_dnorm_xhat = 0.0f;
        for (int c = lane * X; c < C; c += 32 * X) {
            Packed128<floatX> vx = load128(x + c), vdy = load128(dy + c), vw = load128(weight + c);
            for (int i = 0; i < X; i++) {
                float xhat = (to_float(vx[i]) - m) * s;
                float dnorm = to_float(vw[i]) * to_float(vdy[i]);
                sum_dnorm += dnorm;
                sum_dnorm_xhat += dnorm * xhat;
            }
        }
        const float mean_dnorm = warp_reduce_sum(sum_dnorm) / C;
        const float mean_dnorm_xhat = warp_reduce_sum(sum_dnorm_xhat) / C;
        for (int c = lane * X; c < C; c += 32 * X) {
            Packed128<floatX> vx = load128(x + c), vdy = load128(dy + c), vw = load128(weight + c);
            Packed128<floatX> vdx = load128(dinp + row * C + c);
            for (int i = 0; i < X; i++) {
                float xhat = (to_float(vx[i]) - m) * s;
                float g = to_float(vdy[i]);
                acc[i * CX + c / X] += g * xhat;
                acc[C + i * CX + c / X] += g;
                float dnorm = to_float(vw[i]) * g;
                vdx[i] = from_float<floatX>(to_float(vdx[i]) + s * (dnorm - mean_dnorm - xhat * mean_dnorm_xhat));
            }
            store128(dinp + row * C + c, vdx);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
        const int part = c / C, column = c % C, slot = part * C + (column % X) * CX + column / X;
        float total = 0.0f;
        for (int w = 0; w < num_warps; w++) total += shared[(long)w * 2 * C + slot];
        partials[(long)blockIdx.x * 2 * C + c] = total;
    }
}

// Warps per block such that their accumulators fit the default 48 KB of shared memory.
inline int layernorm_backward_warps(int C) { return std::max(1, std::min(8, (int)(48 * 1024 / (2 * C * sizeof(float))))); }
inline int layernorm_backward_blocks() { return 4 * device_sm_count(); }  // 4 per SM fit: more loads in flight
inline size_t layernorm_backward_scratch_floats(int C) { return (size_t)layernorm_backward_blocks() * 2 * C; }

// dinp += d/dinp; dweight, dbias += their gradients (skipped when dweight_then_dbias is null: frozen
// parameters). dbias must directly follow dweight in memory (the block layout keeps every LayerNorm's
// weight and bias adjacent). `scratch` holds
// layernorm_backward_scratch_floats(C) floats.
template <typename floatX>
void layernorm_backward(floatX* dinp, floatX* dweight_then_dbias, float* scratch, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                        int C, cudaStream_t stream) {
    const int warps = layernorm_backward_warps(C), blocks = layernorm_backward_blocks();
    const size_t shared_bytes = (size_t)warps * 2 * C * sizeof(float);
    if (shared_bytes > 48 * 1024) {
        die("layernorm_backward: C=" + std::to_string(C) + " is too large for its shared-memory accumulators");
    }
    layernorm_backward_kernel<<<blocks, warps * 32, shared_bytes, stream>>>(dinp, scratch, dout, inp, weight, mean,
                                                                            rstd, N, C);
    cudaCheckLaunch();
    if (dweight_then_dbias != nullptr) partials_accumulate(dweight_then_dbias, scratch, blocks, 2 * C, stream);
}
