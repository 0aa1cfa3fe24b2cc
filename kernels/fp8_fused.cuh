// The kernels that produce an FP8 product's input and cast it to E4M3 as they write it, for delayed scaling, whose
// scale is known before the tensor exists (model/fp8_linear.cuh): the LayerNorm forward (alone, and after the
// residual add) and the GELU. They write the row-major copy that the forward product reads and/or the transposed copy
// that the weight gradient reads, in place of the bf16 output: each value is rounded to bf16 as layernorm_forward or
// gelu_forward stores it, then cast as fp8_cast casts it (cast8), so the codes, the amax added into scaling->amax and
// the count added into scaling->overflow are bit for bit those of the bf16 kernel followed by fp8_cast with the same
// scale. What that saves, besides the producer's own reads: the bf16 output's write and each cast's read of it. The
// forward's cast and the backward's transposing cast of a bf16 output move 8 bytes a value (written 2; read 2,
// written 1; read 2, written 1); the producer writing both copies, 2.
// Current scaling needs the finished tensor's amax before the cast; it keeps the bf16 kernels and fp8_cast.
// defines: layernorm_forward_fp8, residual_layernorm_forward_fp8, fp8_gelu_cast
#pragma once
#include "common.cuh"
#include "fp8.cuh"        // defines: cast8, block_amax_into, fp8_cast, Fp8Scaling, require_fp8_gpu
#include "gelu.cuh"       // defines: gelu_tanh
#include "layernorm.cuh"  // defines: layernorm_residual_row, layernorm_row_statistics, layernorm_outputs

// ---------------------------------------------------------------------------------------------
// LayerNorm. A block takes 32 rows, 4 a warp: first their statistics (after the residual add, written to the
// residual buffer) as layernorm_forward_kernel takes them, then their columns in chunks of 256, a lane 8 columns of
// each of its rows: the outputs (layernorm_outputs), their codes (cast8) to out (a warp writes 256 contiguous bytes
// of a row) and into a shared tile of 32 rows x 256 codes, from which each thread writes one column's 32 codes to
// out_t as two 16-byte stores (a whole 32-byte sector), as fp8_cast_transpose_kernel does. Two tiles, used in turn:
// one barrier a chunk. The row is read from L1/L2 after the statistics' two passes, as in layernorm_forward_kernel.
constexpr int kLayerNormFp8Threads = 256, kLayerNormFp8Rows = 32, kLayerNormFp8Cols = 256;
constexpr int kLayerNormFp8RowsPerWarp = kLayerNormFp8Rows / (kLayerNormFp8Threads / 32);
static_assert(kLayerNormFp8Cols == 32 * Packed128<__nv_bfloat16>::size && kLayerNormFp8Cols == kLayerNormFp8Threads,
              "a lane casts 8 columns of each row of a chunk; a thread writes one column of the chunk transposed");
static_assert(kLayerNormFp8Rows == 32, "a thread writes a column's 32 rows as two 16-row stores");

// out[N, C] and/or out_t[C, N] (null: not written) = E4M3(LayerNorm(x) * scale), x = a, or a + b written to
// residual_out when that is given; mean and rstd as layernorm_forward writes them.
__global__ void __launch_bounds__(kLayerNormFp8Threads)
layernorm_forward_fp8_kernel(__nv_fp8_e4m3* out, __nv_fp8_e4m3* out_t, float* mean, float* rstd, __nv_bfloat16* residual_out,
                             const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* weight, const __nv_bfloat16* bias,
                             int N, int C, Fp8Scaling* scaling) {
#if FP8_DEVICE_CODE
    constexpr int R = kLayerNormFp8RowsPerWarp;
    __shared__ alignas(16) uint8_t tiles[2][kLayerNormFp8Rows][kLayerNormFp8Cols];
    __shared__ uint32_t shared[64];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long row0 = (long)blockIdx.x * kLayerNormFp8Rows;
    const float scale = scaling->scale;
    const __nv_bfloat16* x = residual_out != nullptr ? residual_out : a;
    float m[R], s[R];
#pragma unroll
    for (int k = 0; k < R; k++) {
        const long row = row0 + warp * R + k;
        m[k] = s[k] = 0.0f;
        if (row >= N) continue;
        if (residual_out != nullptr) layernorm_residual_row(residual_out + row * C, a + row * C, b + row * C, C, lane);
        layernorm_row_statistics(x + row * C, C, lane, m[k], s[k]);
        if (lane == 0) {
            mean[row] = m[k];
            rstd[row] = s[k];
        }
    }
    uint32_t magnitude = 0, saturated = 0;
    int buffer = 0;
    for (int c0 = 0; c0 < C; c0 += kLayerNormFp8Cols, buffer ^= 1) {
        uint8_t (*tile)[kLayerNormFp8Cols] = tiles[buffer];
        const int c = c0 + lane * Packed128<__nv_bfloat16>::size;
        if (c < C) {
            const Packed128<__nv_bfloat16> w = load128(weight + c), bb = load128(bias + c);
#pragma unroll
            for (int k = 0; k < R; k++) {
                const int r = warp * R + k;
                const long row = row0 + r;
                if (row >= N) continue;
                const uint2 codes = cast8<__nv_fp8_e4m3>(layernorm_outputs(load128cs(x + row * C + c), m[k], s[k], w, bb), scale, magnitude,
                                                         saturated);
                if (out != nullptr) *reinterpret_cast<uint2*>(out + row * C + c) = codes;
                if (out_t != nullptr) *reinterpret_cast<uint2*>(&tile[r][lane * 8]) = codes;
            }
        }
        if (out_t == nullptr) continue;  // the same for the whole block
        __syncthreads();  // the chunk's tile is complete; the other tile's readers (the chunk before) are done
        const long col = c0 + threadIdx.x;
        if (col < C) {
            uint32_t words[8];
#pragma unroll
            for (int w = 0; w < 8; w++) {
                const int r = 4 * w;
                words[w] = (uint32_t)tile[r][threadIdx.x] | ((uint32_t)tile[r + 1][threadIdx.x] << 8) |
                           ((uint32_t)tile[r + 2][threadIdx.x] << 16) | ((uint32_t)tile[r + 3][threadIdx.x] << 24);
            }
            // N is a multiple of 16: each 16-row half lies wholly inside or wholly outside the tensor
            for (int q = 0; q < 2; q++) {
                const long row = row0 + q * 16;
                if (row < N)
                    *reinterpret_cast<uint4*>(out_t + col * N + row) = make_uint4(words[4 * q], words[4 * q + 1], words[4 * q + 2], words[4 * q + 3]);
            }
        }
    }
    block_amax_into(&scaling->amax, magnitude, shared, &scaling->overflow, saturated);
#endif
}

inline void layernorm_forward_fp8_launch(__nv_fp8_e4m3* out, __nv_fp8_e4m3* out_t, float* mean, float* rstd, __nv_bfloat16* residual,
                                         const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* weight,
                                         const __nv_bfloat16* bias, int N, int C, Fp8Scaling* scaling, cudaStream_t stream) {
    const std::string shape = fp8_cast_shape_problem(N, C, out_t != nullptr);
    if (!shape.empty()) die("LayerNorm with its " + shape);
    for (const void* p : {(const void*)out, (const void*)out_t, (const void*)residual, (const void*)a, (const void*)b, (const void*)weight,
                          (const void*)bias})
        if ((uintptr_t)p % 16 != 0) die("LayerNorm with its FP8 cast: every buffer must be 16-byte aligned");
    if (out == nullptr && out_t == nullptr) die("LayerNorm with its FP8 cast: no output given");
    require_fp8_gpu();
    layernorm_forward_fp8_kernel<<<ceil_div(N, kLayerNormFp8Rows), kLayerNormFp8Threads, 0, stream>>>(out, out_t, mean, rstd, residual, a, b,
                                                                                                     weight, bias, N, C, scaling);
    cudaCheckLaunch();
}

// layernorm_forward's LayerNorm of inp[N, C], written as E4M3 with scaling->scale instead of bf16: out[N, C] and/or
// out_t[C, N] (null: not written; at least one), mean and rstd as layernorm_forward writes them; max |output| into
// scaling->amax, the saturated values' count into scaling->overflow. C a multiple of 16, N too with out_t.
inline void layernorm_forward_fp8(__nv_fp8_e4m3* out, __nv_fp8_e4m3* out_t, float* mean, float* rstd, const __nv_bfloat16* inp,
                                  const __nv_bfloat16* weight, const __nv_bfloat16* bias, int N, int C, Fp8Scaling* scaling,
                                  cudaStream_t stream) {
    layernorm_forward_fp8_launch(out, out_t, mean, rstd, nullptr, inp, nullptr, weight, bias, N, C, scaling, stream);
}
// residual_layernorm_forward with the LayerNorm's output so: residual = a + b (bf16, as there), its LayerNorm as
// layernorm_forward_fp8 writes it.
inline void residual_layernorm_forward_fp8(__nv_bfloat16* residual, __nv_fp8_e4m3* out, __nv_fp8_e4m3* out_t, float* mean, float* rstd,
                                           const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* weight,
                                           const __nv_bfloat16* bias, int N, int C, Fp8Scaling* scaling, cudaStream_t stream) {
    layernorm_forward_fp8_launch(out, out_t, mean, rstd, residual, a, b, weight, bias, N, C, scaling, stream);
}

// ---------------------------------------------------------------------------------------------
// GELU: fp8_cast's kernels (the tiles of fp8_cast_transpose_kernel, or the grid-stride cast without the transposed
// copy) casting gelu(x) in gelu_forward's bf16 values instead of x.
struct Fp8CastGelu {
    __device__ Packed128<__nv_bfloat16> operator()(const Packed128<__nv_bfloat16>& x) const {
        Packed128<__nv_bfloat16> y;
        for (int i = 0; i < Packed128<__nv_bfloat16>::size; i++) y[i] = from_float<__nv_bfloat16>(gelu_tanh(to_float(x[i])));
        return y;
    }
};
// gelu_forward of inp[rows, cols], written as E4M3 with scaling->scale instead of bf16: out[rows, cols] and/or
// out_t[cols, rows] (at least one), with fp8_cast's amax, count and shape rules.
inline void fp8_gelu_cast(__nv_fp8_e4m3* out, __nv_fp8_e4m3* out_t, const __nv_bfloat16* inp, long rows, long cols, Fp8Scaling* scaling,
                          cudaStream_t stream) {
    fp8_cast<__nv_fp8_e4m3, Fp8CastGelu>(out, out_t, inp, rows, cols, scaling, stream);
}
