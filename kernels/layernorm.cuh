// LayerNorm (eps 1e-5, fp32 statistics) and RMSNorm (the Llama family's: no mean subtraction, no bias, the model's
// eps): forward, forward fused with the residual add that precedes it, and a deterministic backward. One set of
// kernels, templated on the norm (Norm); what differs is chosen at compile time (if constexpr), so each norm's
// instances carry none of the other's work.
// defines: Norm, layernorm_forward, residual_layernorm_forward, rmsnorm_forward, residual_rmsnorm_forward,
//          residual_forward, layernorm_residual_row, layernorm_row_statistics, layernorm_outputs, rmsnorm_outputs,
//          layernorm_backward, rmsnorm_backward, layernorm_backward_scratch_floats,
//          layernorm_backward_colsum_partials, kLayerNormWideMaxC
#pragma once
#include "common.cuh"

constexpr float kLayerNormEps = 1e-5f;

// LayerNorm: y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(variance + 1e-5).
// RMSNorm: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps); it has no mean (buffers of means are null).
// Templates that take the norm default to LayerNorm, which GPT-2's callers (fp8_fused.cuh, the benchmarks) leave unnamed.
enum class Norm { LayerNorm, RMSNorm };
// The parameter vectors of C a norm has: weight and bias, or weight alone (the rows of the backward's partials).
template <Norm kNorm> __host__ __device__ constexpr int norm_parameters() { return kNorm == Norm::LayerNorm ? 2 : 1; }
// x less the row's mean (LayerNorm), or x (RMSNorm): times rstd, the normalised value.
template <Norm kNorm> __device__ __forceinline__ float norm_centered(float x, float m) {
    if constexpr (kNorm == Norm::LayerNorm) return x - m;
    else return x;
}

// A row's parts of the forward, one warp a row, shared by layernorm_forward_kernel and the kernels that also cast
// the output to FP8 (fp8_fused.cuh), so that all of them compute the same values bit for bit.
// residual r = x + y over a row of C values, rounded to floatX once so that the backward sees the same values.
template <typename floatX>
__device__ __forceinline__ void layernorm_residual_row(floatX* r, const floatX* x, const floatX* y, int C, int lane) {
    constexpr int X = Packed128<floatX>::size;
    for (int c = lane * X; c < C; c += 32 * X) {
        Packed128<floatX> va = load128cs(x + c), vb = load128cs(y + c), vr;
        for (int i = 0; i < X; i++) vr[i] = from_float<floatX>(to_float(va[i]) + to_float(vb[i]));
        store128(r + c, vr);
    }
    __syncwarp();  // the row is read back by the whole warp
}
// The mean and 1 / sqrt(variance + eps) of a row of C values: two passes, each lane's partial sums in a fixed order.
// RMSNorm: m = 0 and s = 1 / sqrt(mean(x^2) + eps), one pass. eps: LayerNorm's unless given.
template <typename floatX, Norm kNorm = Norm::LayerNorm>
__device__ __forceinline__ void layernorm_row_statistics(const floatX* x, int C, int lane, float& m, float& s,
                                                         float eps = kLayerNormEps) {
    constexpr int X = Packed128<floatX>::size;
    m = 0.0f;
    if constexpr (kNorm == Norm::LayerNorm) {
        float sum = 0.0f;
        for (int c = lane * X; c < C; c += 32 * X) {
            Packed128<floatX> v = load128(x + c);
            for (int i = 0; i < X; i++) sum += to_float(v[i]);
        }
        m = warp_reduce_sum(sum) / C;
    }
    float var = 0.0f;
    for (int c = lane * X; c < C; c += 32 * X) {
        Packed128<floatX> v = load128(x + c);
        for (int i = 0; i < X; i++) { float d = norm_centered<kNorm>(to_float(v[i]), m); var += d * d; }
    }
    s = rsqrtf(warp_reduce_sum(var) / C + eps);
}
// The outputs of X values of a row (v) from the row's statistics, the weight and the bias.
template <typename floatX>
__device__ __forceinline__ Packed128<floatX> layernorm_outputs(const Packed128<floatX>& v, float m, float s, const Packed128<floatX>& w,
                                                               const Packed128<floatX>& bias) {
    Packed128<floatX> o;
    for (int i = 0; i < Packed128<floatX>::size; i++) o[i] = from_float<floatX>((to_float(v[i]) - m) * s * to_float(w[i]) + to_float(bias[i]));
    return o;
}
// RMSNorm's: x * rstd * weight in fp32, rounded once (transformers rounds x * rstd to the model's type before the
// weight's product: within an ulp of this).
template <typename floatX>
__device__ __forceinline__ Packed128<floatX> rmsnorm_outputs(const Packed128<floatX>& v, float s, const Packed128<floatX>& w) {
    Packed128<floatX> o;
    for (int i = 0; i < Packed128<floatX>::size; i++) o[i] = from_float<floatX>(to_float(v[i]) * s * to_float(w[i]));
    return o;
}

// One warp per row. The row is read three times (mean, variance, output; RMSNorm twice); the re-reads hit L1/L2.
// When `residual_out` is given, the normalised input is a + b, which is also written to residual_out.
template <typename floatX, Norm kNorm>
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, floatX* residual_out,
                                         const floatX* a, const floatX* b, const floatX* weight,
                                         const floatX* bias, int N, int C, float eps) {
    constexpr int X = Packed128<floatX>::size;
    const int lane = threadIdx.x % 32;
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const floatX* x = a + row * C;
    if (residual_out != nullptr) {
        layernorm_residual_row(residual_out + row * C, x, b + row * C, C, lane);
        x = residual_out + row * C;
    }
    float m, s;
    layernorm_row_statistics<floatX, kNorm>(x, C, lane, m, s, eps);
    for (int c = lane * X; c < C; c += 32 * X) {
        if constexpr (kNorm == Norm::LayerNorm)
            store128(out + row * C + c, layernorm_outputs(load128cs(x + c), m, s, load128(weight + c), load128(bias + c)));
        else
            store128(out + row * C + c, rmsnorm_outputs(load128cs(x + c), s, load128(weight + c)));
    }
    if (lane == 0) {
        if constexpr (kNorm == Norm::LayerNorm) mean[row] = m;
        rstd[row] = s;
    }
}

// The four forwards' launch: residual null for the plain norm (a alone; b unused), mean and bias null for RMSNorm.
template <typename floatX, Norm kNorm>
void norm_forward(floatX* residual, floatX* out, float* mean, float* rstd, const floatX* a, const floatX* b,
                  const floatX* weight, const floatX* bias, int N, int C, float eps, cudaStream_t stream) {
    const int block = 256, rows_per_block = block / 32;
    layernorm_forward_kernel<floatX, kNorm><<<ceil_div(N, rows_per_block), block, 0, stream>>>(out, mean, rstd, residual, a, b,
                                                                                               weight, bias, N, C, eps);
    cudaCheckLaunch();
}

template <typename floatX>
void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                       const floatX* bias, int N, int C, cudaStream_t stream) {
    norm_forward<floatX, Norm::LayerNorm>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, kLayerNormEps, stream);
}

// residual = a + b; out = LayerNorm(residual). Saves a full pass over the residual stream.
template <typename floatX>
void residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd, const floatX* a,
                                const floatX* b, const floatX* weight, const floatX* bias, int N, int C,
                                cudaStream_t stream) {
    norm_forward<floatX, Norm::LayerNorm>(residual, out, mean, rstd, a, b, weight, bias, N, C, kLayerNormEps, stream);
}

// out = RMSNorm(inp) with the model's eps (rms_norm_eps: Llama 3 and SmolLM2 1e-5, Qwen 2.5 1e-6); rstd (N) as the
// backward takes it.
template <typename floatX>
void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C, float eps,
                     cudaStream_t stream) {
    norm_forward<floatX, Norm::RMSNorm>(nullptr, out, nullptr, rstd, inp, nullptr, weight, nullptr, N, C, eps, stream);
}

// residual = a + b; out = RMSNorm(residual), as residual_layernorm_forward.
template <typename floatX>
void residual_rmsnorm_forward(floatX* residual, floatX* out, float* rstd, const floatX* a, const floatX* b,
                              const floatX* weight, int N, int C, float eps, cudaStream_t stream) {
    norm_forward<floatX, Norm::RMSNorm>(residual, out, nullptr, rstd, a, b, weight, nullptr, N, C, eps, stream);
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

// Backward of rows up to kLayerNormWideFrom wide (wider: layernorm_backward_wide_kernel, below). One warp per row;
// each warp accumulates its rows' dweight/dbias contributions in its own shared-memory region (no atomics), the
// block adds its warps in order into one partial row, and partials_accumulate adds the blocks in order: bitwise
// reproducible. RMSNorm's instances keep the dweight half of the accumulators and partials (it has no dbias) and skip
// the mean's terms.
// dinp is accumulated (+=): it is the residual stream's gradient, which the LayerNorm joins.
// layernorm_backward_colsum_kernel also sums dinp's columns as they were on entry: where dinp holds the gradient of
// a row-parallel projection's output, that is the projection's bias gradient, and the model needs no bias_backward
// pass over it. Lane `lane` owns the columns lane * X + k * 32 * X + i (k < kColsumChunks, i < X), so the sums
// stay in registers until the block's combine: a third shared-memory region of C floats a warp cost a block a
// multiprocessor and the L1 that the second pass over x and dy relies on (layernorm_backward: 3.1 -> 4.5 ms a step at
// 124M on an H200).

// Warps per block such that their accumulators fit the default 48 KB of shared memory (LayerNorm's two a column; 8 warps
// up to kLayerNormWideFrom, either norm).
constexpr int layernorm_backward_warps(int C) { return std::max(1, std::min(8, (int)(48 * 1024 / (2 * C * sizeof(float))))); }

// First pass over a row's columns c .. c + X - 1: the sums of dnorm = weight * dy (LayerNorm) and of dnorm * xhat.
template <typename floatX, Norm kNorm>
__device__ __forceinline__ void layernorm_backward_dots(const floatX* x, const floatX* dy, const floatX* weight, int c,
                                                        float m, float s, float& sum_dnorm, float& sum_dnorm_xhat) {
    constexpr int X = Packed128<floatX>::size;
    Packed128<floatX> vx = load128(x + c), vdy = load128(dy + c), vw = load128(weight + c);
    for (int i = 0; i < X; i++) {
        float xhat = norm_centered<kNorm>(to_float(vx[i]), m) * s;
        float dnorm = to_float(vw[i]) * to_float(vdy[i]);
        if constexpr (kNorm == Norm::LayerNorm) sum_dnorm += dnorm;
        sum_dnorm_xhat += dnorm * xhat;
    }
}

// Second pass over columns c .. c + X - 1 of a row (drow: its dinp): dinp += its gradient, and the warp's
// accumulators `acc` (laid out for R columns) += the dweight and dbias terms; with kSums, sums[0 .. X - 1] += dinp's
// values on entry. RMSNorm: mean_dnorm is 0.
template <typename floatX, Norm kNorm, bool kSums>
__device__ __forceinline__ void layernorm_backward_columns(floatX* drow, const floatX* x, const floatX* dy, const floatX* weight,
                                                           float* acc, float* sums, int c, int R, float m, float s,
                                                           float mean_dnorm, float mean_dnorm_xhat) {
    constexpr int X = Packed128<floatX>::size;
    const int CX = R / X;
    Packed128<floatX> vx = load128(x + c), vdy = load128(dy + c), vw = load128(weight + c);
    Packed128<floatX> vdx = load128(drow + c);
    for (int i = 0; i < X; i++) {
        if constexpr (kSums) sums[i] += to_float(vdx[i]);
        float xhat = norm_centered<kNorm>(to_float(vx[i]), m) * s;
        float g = to_float(vdy[i]);
        acc[i * CX + c / X] += g * xhat;
        if constexpr (kNorm == Norm::LayerNorm) acc[R + i * CX + c / X] += g;
        float dnorm = to_float(vw[i]) * g;
        vdx[i] = from_float<floatX>(to_float(vdx[i]) + s * (dnorm - mean_dnorm - xhat * mean_dnorm_xhat));
    }
    store128(drow + c, vdx);
}

// The row width that the accumulators of a block are laid out for: C, or with kColsumChunks > 0 the widest C of
// that many chunks, so that a lane's offsets in them are constants (immediates; with C / X as their stride ptxas
// kept them in registers and spilled: ~200 bytes at 5-7 chunks in bf16).
template <typename floatX>
__host__ __device__ constexpr int layernorm_backward_width(int colsum_chunks, int C) {
    return colsum_chunks > 0 ? colsum_chunks * 32 * Packed128<floatX>::size : C;
}

// Both kernels' body. `partials` gets a 2C-wide row per block (dweight, dbias; RMSNorm: C wide, dweight) and, with
// kColsumChunks > 0, from 2C rows in (either norm) a C-wide row per block (dinp's column sums).
template <typename floatX, Norm kNorm, int kColsumChunks>
__device__ __forceinline__ void layernorm_backward_rows(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                                        const floatX* weight, const float* mean, const float* rstd, int N,
                                                        int C) {
    constexpr int X = Packed128<floatX>::size, P = norm_parameters<kNorm>();
    // [warps][P][X][R/X]: dweight then dbias, column c at (c % X) * (R / X) + c / X, so that the 32 lanes
    // (each owning X adjacent columns) touch 32 consecutive banks instead of colliding X-way
    extern __shared__ float shared[];
    const int R = layernorm_backward_width<floatX>(kColsumChunks, C), CX = R / X;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    float* acc = shared + (long)warp * P * R;
    for (int c = lane; c < P * R; c += 32) acc[c] = 0.0f;
    float colsum[kColsumChunks > 0 ? kColsumChunks * X : 1] = {};  // this lane's columns of dinp's column sums
    __syncwarp();
    for (long row = (long)blockIdx.x * num_warps + warp; row < N; row += (long)gridDim.x * num_warps) {
        const floatX* x = inp + row * C;
        const floatX* dy = dout + row * C;
        const float m = kNorm == Norm::LayerNorm ? mean[row] : 0.0f, s = rstd[row];
        float sum_dnorm = 0.0f, sum_dnorm_xhat = 0.0f;
        // with column sums, both passes unrolled over the chunks: colsum's indices and the accumulators' offsets
        // are constants (the default partial unroll of the first pass spills under the launch bounds)
        if constexpr (kColsumChunks == 0) {
            for (int c = lane * X; c < C; c += 32 * X)
                layernorm_backward_dots<floatX, kNorm>(x, dy, weight, c, m, s, sum_dnorm, sum_dnorm_xhat);
        } else {
#pragma unroll
            for (int k = 0; k < kColsumChunks; k++)
                if (lane * X + k * 32 * X < C)
                    layernorm_backward_dots<floatX, kNorm>(x, dy, weight, lane * X + k * 32 * X, m, s, sum_dnorm, sum_dnorm_xhat);
        }
        const float mean_dnorm = kNorm == Norm::LayerNorm ? warp_reduce_sum(sum_dnorm) / C : 0.0f;
        const float mean_dnorm_xhat = warp_reduce_sum(sum_dnorm_xhat) / C;
        if constexpr (kColsumChunks == 0) {
            for (int c = lane * X; c < C; c += 32 * X)
                layernorm_backward_columns<floatX, kNorm, false>(dinp + row * C, x, dy, weight, acc, nullptr, c, R, m, s,
                                                                 mean_dnorm, mean_dnorm_xhat);
        } else {
#pragma unroll
            for (int k = 0; k < kColsumChunks; k++)
                if (lane * X + k * 32 * X < C)
                    layernorm_backward_columns<floatX, kNorm, true>(dinp + row * C, x, dy, weight, acc, colsum + k * X,
                                                                    lane * X + k * 32 * X, R, m, s, mean_dnorm, mean_dnorm_xhat);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < P * C; c += blockDim.x) {
        const int part = c / C, column = c % C, slot = part * R + (column % X) * CX + column / X;
        float total = 0.0f;
        for (int w = 0; w < num_warps; w++) total += shared[(long)w * P * R + slot];
        partials[(long)blockIdx.x * P * C + c] = total;
    }
    if constexpr (kColsumChunks > 0) {
        // the warps' column sums through the dweight parts of their regions (read above), in the same layout, then
        // added in warp order
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kColsumChunks; k++)
            if (lane * X + k * 32 * X < C)
                for (int i = 0; i < X; i++) acc[i * CX + lane + k * 32] = colsum[k * X + i];
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float total = 0.0f;
            for (int w = 0; w < num_warps; w++) total += shared[(long)w * P * R + (c % X) * CX + c / X];
            partials[(long)gridDim.x * 2 * C + (long)blockIdx.x * C + c] = total;
        }
    }
}

template <typename floatX, Norm kNorm = Norm::LayerNorm>
__global__ void layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N,
                                          int C) {
    layernorm_backward_rows<floatX, kNorm, 0>(dinp, partials, dout, inp, weight, mean, rstd, N, C);
}
// With column sums: blocks sized for the widest C of kColsumChunks chunks, and launch bounds that keep 4 of them a
// multiprocessor (layernorm_backward_blocks) in registers: 64 a thread at 8 warps, 24 of which hold colsum at C = 768
// in bf16. A kernel of its own: bounds on the one above would change its code.
template <typename floatX, Norm kNorm, int kColsumChunks>
__global__ void __launch_bounds__(32 * layernorm_backward_warps(layernorm_backward_width<floatX>(kColsumChunks, 0)), 4)
layernorm_backward_colsum_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                 const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    layernorm_backward_rows<floatX, kNorm, kColsumChunks>(dinp, partials, dout, inp, weight, mean, rstd, N, C);
}

// Wide rows. The kernels above keep a warp's dweight and dbias in 8 C bytes of shared memory: at C = 4096 a block
// holds one warp and a multiprocessor four (0.58 TB/s on an H200; layernorm_backward was 14.5 of a 339 ms step of
// the 6.6B GPT). Here a block takes a row at a time: each thread owns 16 columns (32 above 8192), in chunks of X a
// block's width apart, and keeps their dweight, dbias (and dinp's column sums) in registers; a row's two sums are
// added over the block's warps through shared memory, in warp order (bitwise reproducible). The row's x, dy and
// dinp are all loaded before that reduction, so the loads are in flight during it. RMSNorm: no dbias, one sum a row.
constexpr int kLayerNormWideMaxThreads = 512;
constexpr int kLayerNormWideMaxC = 32 * kLayerNormWideMaxThreads;
inline int layernorm_backward_wide_columns(int C) { return C <= 16 * kLayerNormWideMaxThreads ? 16 : 32; }
inline int layernorm_backward_wide_threads(int C) {
    return std::max(32, ceil_div(ceil_div(C, layernorm_backward_wide_columns(C)), 32) * 32);
}

template <typename floatX, Norm kNorm, int kColumns, bool kSums>
__global__ void __launch_bounds__(kLayerNormWideMaxThreads, 1)
layernorm_backward_wide_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp, const floatX* weight,
                               const float* mean, const float* rstd, int N, int C) {
    constexpr bool kLayerNorm = kNorm == Norm::LayerNorm;
    constexpr int X = Packed128<floatX>::size, K = kColumns / X;
    __shared__ float row_sums[2][kLayerNormWideMaxThreads / 32][2];  // two buffers: one barrier a row, not two
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    float dw[K][X] = {}, db[kLayerNorm ? K : 1][X] = {}, colsum[kSums ? K : 1][X] = {};
    int buffer = 0;
    for (long row = blockIdx.x; row < N; row += gridDim.x, buffer ^= 1) {
        Packed128<floatX> x[K], dy[K], dx[K];
        const float m = kLayerNorm ? mean[row] : 0.0f, s = rstd[row];
        for (int k = 0; k < K; k++) {
            const int c = (k * blockDim.x + threadIdx.x) * X;
            x[k] = c < C ? load128cs(inp + row * C + c) : Packed128<floatX>::zeros();
            dy[k] = c < C ? load128cs(dout + row * C + c) : Packed128<floatX>::zeros();
            dx[k] = c < C ? load128cs(dinp + row * C + c) : Packed128<floatX>::zeros();
        }
        float sum_dnorm = 0.0f, sum_dnorm_xhat = 0.0f;
        for (int k = 0; k < K; k++) {
            const int c = (k * blockDim.x + threadIdx.x) * X;
            const Packed128<floatX> w = c < C ? load128(weight + c) : Packed128<floatX>::zeros();  // L1-resident
            for (int i = 0; i < X; i++) {
                const float dnorm = to_float(w[i]) * to_float(dy[k][i]);
                if constexpr (kLayerNorm) sum_dnorm += dnorm;
                sum_dnorm_xhat += dnorm * norm_centered<kNorm>(to_float(x[k][i]), m) * s;
            }
        }
        if constexpr (kLayerNorm) sum_dnorm = warp_reduce_sum(sum_dnorm);
        sum_dnorm_xhat = warp_reduce_sum(sum_dnorm_xhat);
        if (lane == 0) {
            if constexpr (kLayerNorm) row_sums[buffer][warp][0] = sum_dnorm;
            row_sums[buffer][warp][1] = sum_dnorm_xhat;
        }
        __syncthreads();
        float mean_dnorm = 0.0f, mean_dnorm_xhat = 0.0f;  // RMSNorm: mean_dnorm stays 0
        for (int v = 0; v < num_warps; v++) {
            if constexpr (kLayerNorm) mean_dnorm += row_sums[buffer][v][0];
            mean_dnorm_xhat += row_sums[buffer][v][1];
        }
        if constexpr (kLayerNorm) mean_dnorm /= C;
        mean_dnorm_xhat /= C;
        for (int k = 0; k < K; k++) {
            const int c = (k * blockDim.x + threadIdx.x) * X;
            if (c >= C) continue;
            const Packed128<floatX> w = load128(weight + c);
            Packed128<floatX> out;
            for (int i = 0; i < X; i++) {
                const float old = to_float(dx[k][i]), xhat = norm_centered<kNorm>(to_float(x[k][i]), m) * s, g = to_float(dy[k][i]);
                if constexpr (kSums) colsum[k][i] += old;
                dw[k][i] += g * xhat;
                if constexpr (kLayerNorm) db[k][i] += g;
                out[i] = from_float<floatX>(old + s * (to_float(w[i]) * g - mean_dnorm - xhat * mean_dnorm_xhat));
            }
            store128(dinp + row * C + c, out);
        }
    }
    // this block's partial rows, in the layout of the kernels above
    for (int k = 0; k < K; k++) {
        const int c = (k * blockDim.x + threadIdx.x) * X;
        if (c >= C) continue;
        float* dw_row = partials + (long)blockIdx.x * norm_parameters<kNorm>() * C;
        for (int i = 0; i < X; i += 4) {
            *reinterpret_cast<float4*>(dw_row + c + i) = make_float4(dw[k][i], dw[k][i + 1], dw[k][i + 2], dw[k][i + 3]);
            if constexpr (kLayerNorm)
                *reinterpret_cast<float4*>(dw_row + C + c + i) = make_float4(db[k][i], db[k][i + 1], db[k][i + 2], db[k][i + 3]);
            if constexpr (kSums)
                *reinterpret_cast<float4*>(partials + (long)gridDim.x * 2 * C + (long)blockIdx.x * C + c + i) =
                    make_float4(colsum[k][i], colsum[k][i + 1], colsum[k][i + 2], colsum[k][i + 3]);
        }
    }
}

// The wide kernel's instance for rows of C columns, with or without dinp's column sums.
template <typename floatX, Norm kNorm = Norm::LayerNorm>
auto layernorm_backward_wide_kernel_for(int C, bool sums) {
    if (layernorm_backward_wide_columns(C) == 16)
        return sums ? layernorm_backward_wide_kernel<floatX, kNorm, 16, true> : layernorm_backward_wide_kernel<floatX, kNorm, 16, false>;
    return sums ? layernorm_backward_wide_kernel<floatX, kNorm, 32, true> : layernorm_backward_wide_kernel<floatX, kNorm, 32, false>;
}

inline int layernorm_backward_blocks() { return 4 * device_sm_count(); }  // 4 per SM fit: more loads in flight
// a block's partial rows: dweight and dbias (2C), and dinp's column sums (C); either norm (RMSNorm leaves C unused)
inline size_t layernorm_backward_scratch_floats(int C) { return (size_t)layernorm_backward_blocks() * 3 * C; }
// After a layernorm_backward or rmsnorm_backward with dinp_colsum, the column sums' partial rows
// (layernorm_backward_blocks() rows of C) stay in its scratch, here, until the scratch is next written: the model
// derives a second bias gradient from them.
inline const float* layernorm_backward_colsum_partials(const float* scratch, int C) {
    return scratch + (size_t)layernorm_backward_blocks() * 2 * C;
}

// Rows wider than this take layernorm_backward_wide_kernel. Measured on an H200 (bf16, 4096 and 8192 rows): the warp
// kernels are faster at C = 768 with 8192 rows (20.3 against 23.7 us), the wide one from C = 1024 on (1.25-1.4x at
// 1024 and 1536, 1.9-2.3x at 1600 and 2048, 4.1-4.2x at 4096).
constexpr int kLayerNormWideFrom = 768;
inline bool layernorm_backward_is_wide(int C) { return C > kLayerNormWideFrom; }

// layernorm_backward_colsum_kernel's chunks of 32 X columns (X a lane a chunk) for rows up to kLayerNormWideFrom wide:
// at most 6 (fp32).
constexpr int kLayerNormColsumMaxChunks = kLayerNormWideFrom / (32 * Packed128<float>::size);
template <typename floatX>
inline int layernorm_backward_colsum_chunks(int C) { return ceil_div(C, 32 * Packed128<floatX>::size); }

// Launches layernorm_backward_colsum_kernel<floatX, kNorm, chunks> (kColsumChunks counts up to it).
template <typename floatX, Norm kNorm, int kColsumChunks = 1>
void layernorm_backward_colsum_launch(int chunks, int blocks, int threads, size_t shared_bytes, cudaStream_t stream,
                                      floatX* dinp, float* scratch, const floatX* dout, const floatX* inp,
                                      const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    if constexpr (kColsumChunks < kLayerNormColsumMaxChunks) {
        if (chunks > kColsumChunks) {
            layernorm_backward_colsum_launch<floatX, kNorm, kColsumChunks + 1>(chunks, blocks, threads, shared_bytes, stream,
                                                                               dinp, scratch, dout, inp, weight, mean, rstd, N, C);
            return;
        }
    }
    layernorm_backward_colsum_kernel<floatX, kNorm, kColsumChunks><<<blocks, threads, shared_bytes, stream>>>(
        dinp, scratch, dout, inp, weight, mean, rstd, N, C);
}

// Both backwards: dparams is dweight then dbias (LayerNorm) or dweight (RMSNorm); mean null for RMSNorm.
template <typename floatX, Norm kNorm>
void norm_backward(floatX* dinp, floatX* dparams, float* scratch, const floatX* dout, const floatX* inp, const floatX* weight,
                   const float* mean, const float* rstd, int N, int C, cudaStream_t stream, floatX* dinp_colsum) {
    constexpr int P = norm_parameters<kNorm>();
    const int blocks = layernorm_backward_blocks();
    if (layernorm_backward_is_wide(C)) {
        if (C > kLayerNormWideMaxC) {
            die(std::string(kNorm == Norm::LayerNorm ? "layernorm_backward" : "rmsnorm_backward") + ": C=" + std::to_string(C) +
                " is wider than the " + std::to_string(kLayerNormWideMaxC) + " columns its kernel holds in registers");
        }
        auto kernel = layernorm_backward_wide_kernel_for<floatX, kNorm>(C, dinp_colsum != nullptr);
        kernel<<<blocks, layernorm_backward_wide_threads(C), 0, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    } else {
        const int chunks = dinp_colsum != nullptr ? layernorm_backward_colsum_chunks<floatX>(C) : 0;
        const int width = layernorm_backward_width<floatX>(chunks, C), warps = layernorm_backward_warps(width);
        const size_t shared_bytes = (size_t)warps * P * width * sizeof(float);
        if (chunks == 0) {
            layernorm_backward_kernel<floatX, kNorm><<<blocks, warps * 32, shared_bytes, stream>>>(dinp, scratch, dout, inp, weight,
                                                                                                   mean, rstd, N, C);
        } else {
            layernorm_backward_colsum_launch<floatX, kNorm>(chunks, blocks, warps * 32, shared_bytes, stream, dinp, scratch, dout,
                                                            inp, weight, mean, rstd, N, C);
        }
    }
    cudaCheckLaunch();
    if (dparams != nullptr) partials_accumulate(dparams, scratch, blocks, P * C, stream);
    if (dinp_colsum != nullptr) partials_accumulate(dinp_colsum, layernorm_backward_colsum_partials(scratch, C), blocks, C, stream);
}

// dinp += d/dinp; dweight, dbias += their gradients (skipped when dweight_then_dbias is null: frozen
// parameters). dbias must directly follow dweight in memory (the block layout keeps every LayerNorm's
// weight and bias adjacent). With dinp_colsum: dinp_colsum[c] += the sum over rows of dinp[., c] as it was on
// entry. `scratch` holds layernorm_backward_scratch_floats(C) floats.
template <typename floatX>
void layernorm_backward(floatX* dinp, floatX* dweight_then_dbias, float* scratch, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                        int C, cudaStream_t stream, floatX* dinp_colsum = nullptr) {
    norm_backward<floatX, Norm::LayerNorm>(dinp, dweight_then_dbias, scratch, dout, inp, weight, mean, rstd, N, C, stream,
                                           dinp_colsum);
}

// RMSNorm's backward, as layernorm_backward without dbias: dinp += d/dinp; dweight += its gradient (skipped when null);
// dinp_colsum as there; rstd as rmsnorm_forward wrote it; `scratch` holds layernorm_backward_scratch_floats(C) floats.
template <typename floatX>
void rmsnorm_backward(floatX* dinp, floatX* dweight, float* scratch, const floatX* dout, const floatX* inp,
                      const floatX* weight, const float* rstd, int N, int C, cudaStream_t stream, floatX* dinp_colsum = nullptr) {
    norm_backward<floatX, Norm::RMSNorm>(dinp, dweight, scratch, dout, inp, weight, nullptr, rstd, N, C, stream, dinp_colsum);
}
