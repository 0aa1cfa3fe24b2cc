// Rotary position embedding (RoPE) as transformers' Llama applies it, in place on the query and key heads of the
// fused qkv activation, and its backward; the inverse frequencies, computed on the host, with Llama 3's scaling.
// defines: rope_inv_freq, rope_forward, rope_backward
#pragma once
#include <cmath>
#include <string>
#include <vector>
#include "common.cuh"
#include "host_device.h"  // RopeScaling

// inv_freq[i] = theta^(-2i/D) for i < D/2, as transformers' _compute_default_rope_parameters; unless scaling.factor is 0
// (none; Llama 3.1: factor 8, low_freq_factor 1, high_freq_factor 4, original_max_positions 8192; Llama 3.2: factor 32),
// rescaled as its _compute_llama3_parameters: wavelengths 2 pi / inv_freq above original / low_freq_factor divided by
// `factor`, those below original / high_freq_factor kept, and those between blended smoothly. Transformers computes in
// fp32; here each of its steps of the unscaled frequency (2i / D, the power, the reciprocal) is computed in double and
// rounded to fp32 where its tensor is (an ulp of a frequency moves the angle at position 8192 by up to 1e-3 rad), and
// the scaling in double, rounded once (within an ulp of transformers' fp32 arithmetic).
inline std::vector<float> rope_inv_freq(int D, float theta, const RopeScaling& scaling) {
    if (D <= 0 || D % 2 != 0) die("rope_inv_freq: the head size D=" + std::to_string(D) + " must be even");
    constexpr double kTwoPi = 6.283185307179586;
    std::vector<float> inv_freq(D / 2);
    for (int i = 0; i < D / 2; i++) {
        const float exponent = (float)(2 * i) / (float)D;
        const float power = (float)std::pow((double)theta, (double)exponent);
        double f = (float)(1.0 / power);
        if (scaling.factor != 0.0f) {
            const double original = scaling.original_max_positions, factor = scaling.factor;
            const double low = scaling.low_freq_factor, high = scaling.high_freq_factor;
            const double wavelength = kTwoPi / f;
            if (wavelength > original / low) {
                f /= factor;
            } else if (wavelength >= original / high) {
                const double smooth = (original / wavelength - low) / (high - low);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
    return inv_freq;
}

// Heads a thread rotates with one computation of its cos and sin (the heads of a row share the positions' angles).
constexpr int kRopeHeadsPerThread = 4;

// Rotates, in place, heads [0, heads) of each row of qkv (N rows of row_width, head h at columns h * D .. h * D + D - 1),
// row r at position position_offset + r % T, in transformers' rotate_half layout: dimension i < D/2 pairs with
// i + D/2, both rotated by angle = position * inv_freq[i]: (x_i, x_{i+D/2}) -> (x_i cos - x_{i+D/2} sin,
// x_{i+D/2} cos + x_i sin); kInverse rotates by -angle (the transpose: the backward). A thread takes X dimensions
// i of the first half (and their partners) of up to kRopeHeadsPerThread heads (blockIdx.y picks them), all loaded
// before any is stored. The angle is the fp32 product of the position and the fp32 inverse frequency (__fmul_rn: never
// contracted into sincosf's range reduction), and its cos and sin are computed in fp32 by the accurate sincosf (not
// __sincosf, whose error grows with the angle, up to thousands of radians here), as transformers computes them in
// fp32; the rotation in fp32, rounded once (transformers rounds cos and sin to the model's type first).
template <typename floatX, bool kInverse>
__global__ void rope_kernel(floatX* qkv, const float* inv_freq, long N, int T, int heads, long row_width, int D,
                            int position_offset) {
    constexpr int X = Packed128<floatX>::size;
    const int half = D / 2, chunks = half / X;
    const long thread = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (thread >= N * chunks) return;
    const long row = thread / chunks;
    const int i0 = (int)(thread % chunks) * X, h0 = blockIdx.y * kRopeHeadsPerThread;
    const float position = (float)(position_offset + (int)(row % T));
    float cos_[X], sin_[X];
    for (int i = 0; i < X; i++) {
        sincosf(__fmul_rn(position, inv_freq[i0 + i]), &sin_[i], &cos_[i]);
        if constexpr (kInverse) sin_[i] = -sin_[i];
    }
    floatX* head0 = qkv + row * row_width + (long)h0 * D + i0;
    Packed128<floatX> lo[kRopeHeadsPerThread], hi[kRopeHeadsPerThread];
#pragma unroll
    for (int k = 0; k < kRopeHeadsPerThread; k++) {
        if (h0 + k < heads) {
            lo[k] = load128(head0 + (long)k * D);
            hi[k] = load128(head0 + (long)k * D + half);
        }
    }
#pragma unroll
    for (int k = 0; k < kRopeHeadsPerThread; k++) {
        if (h0 + k >= heads) continue;
        Packed128<floatX> a, b;
        for (int i = 0; i < X; i++) {
            const float x1 = to_float(lo[k][i]), x2 = to_float(hi[k][i]);
            a[i] = from_float<floatX>(x1 * cos_[i] - x2 * sin_[i]);
            b[i] = from_float<floatX>(x2 * cos_[i] + x1 * sin_[i]);
        }
        store128(head0 + (long)k * D, a);
        store128(head0 + (long)k * D + half, b);
    }
}

// Rows of qkv (B x T of them) are [q: heads_q * D | k: heads_kv * D | v: heads_kv * D] (heads_kv < heads_q: grouped-
// query attention); q and k are contiguous, so their heads_q + heads_kv heads are rotated alike and v is untouched.
template <typename floatX, bool kInverse>
void rope_launch(floatX* qkv, const float* inv_freq, int B, int T, int heads_q, int heads_kv, int D, int position_offset,
                 cudaStream_t stream) {
    constexpr int X = Packed128<floatX>::size;
    const char* what = kInverse ? "rope_backward" : "rope_forward";
    if (D <= 0 || D % 16 != 0) die(std::string(what) + ": the head size D=" + std::to_string(D) + " must be a multiple of 16");
    // positions are exact in fp32 below 2^24, as transformers' float position ids are
    if (position_offset < 0 || (long)position_offset + T > (1L << 24))
        die(std::string(what) + ": positions " + std::to_string(position_offset) + " .. " + std::to_string((long)position_offset + T - 1) +
            " out of range [0, 2^24)");
    const long N = (long)B * T, threads = N * (D / 2 / X);
    const int heads = heads_q + heads_kv;
    const dim3 grid(ceil_div(threads, 256), ceil_div(heads, kRopeHeadsPerThread));
    rope_kernel<floatX, kInverse><<<grid, 256, 0, stream>>>(qkv, inv_freq, N, T, heads, (long)(heads_q + 2 * heads_kv) * D, D,
                                                            position_offset);
    cudaCheckLaunch();
}

// Rotates the q and k heads of qkv (B, T, (heads_q + 2 heads_kv) D) in place, token t of each sequence at position
// position_offset + t (a KV-cache decode step passes its position with T = 1). inv_freq: D/2 floats on the device
// (rope_inv_freq's). D a multiple of 16 (64 and 128 in the Llama family).
template <typename floatX>
void rope_forward(floatX* qkv, const float* inv_freq, int B, int T, int heads_q, int heads_kv, int D, int position_offset,
                  cudaStream_t stream) {
    rope_launch<floatX, false>(qkv, inv_freq, B, T, heads_q, heads_kv, D, position_offset, stream);
}
// The backward: dq and dk of dqkv (laid out as qkv) rotated back in place (the rotation's transpose is its inverse);
// dv untouched.
template <typename floatX>
void rope_backward(floatX* dqkv, const float* inv_freq, int B, int T, int heads_q, int heads_kv, int D, int position_offset,
                   cudaStream_t stream) {
    rope_launch<floatX, true>(dqkv, inv_freq, B, T, heads_q, heads_kv, D, position_offset, stream);
}
