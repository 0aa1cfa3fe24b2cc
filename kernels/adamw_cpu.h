// AdamW on the CPU, for ZeRO-Offload: the update of kernels/adamw.cuh's adamw_kernel, bit for bit, on a shard held in
// host memory (fp32 master weights, m and v; gradients in the GPU's type or fp32; the parameters written in the compute
// type). Plain C++ (no CUDA header), so g++ and nvcc host code both compile it. Scalar, AVX2+FMA and AVX-512 paths,
// chosen at run time and bitwise equal to each other; OpenMP over the cores; any range [begin, end) of a shard, so that
// a caller can copy one tile to or from the GPU while the next one is computed.
// defines: adamw_cpu::{Bf16, Fp16, grad_scale, Step, make_step, Isa, isa_name, isa_supported, best_isa, update}
//
// Why the results are the GPU's bit for bit (finite inputs, subnormals included):
// - adamw_element (kernels/adamw.cuh) spells out its multiply-adds (__fmaf_rn), so its vector loop and its tail
//   compile alike whatever nvcc's contraction would choose; per element:
//     g = g * grad_scale                                  FMUL
//     m = fma(beta1, m, (1 - beta1) * g)                  FMUL, FFMA
//     v = fma(g, (1 - beta2) * g, beta2 * v)              FMUL, FMUL, FFMA
//     m_hat = m * inv_bias_correction1, v_hat = v * inv_bias_correction2      FMUL, FMUL
//     q = m_hat / (sqrt(v_hat) + eps)                     sqrt.rn, FADD, div.rn
//     u = fma(weight_decay, p, q)                         FFMA (0 for weight_decay where the mask says no decay)
//     p = fma(u, -lr, p)                                  FFMA
//   Every path here does exactly these operations, each rounded once to nearest even (std::fma, vfmadd). No product
//   feeds a plain addition, so a host compiler's own contraction (-ffp-contract=fast) finds nothing to fuse. The last
//   one negates lr, not u: GCC turns -fma(a, b, c) into fnmsub, -(a b) - c, which is +0 where fma(a, -b, c) is -0 (a
//   parameter of -0 with no gradient).
// - sqrt.rn and div.rn are correctly rounded, as are sqrtss/sqrtps and divss/divps.
// - The kernel keeps subnormals (no -ftz); update() clears MXCSR's flush-to-zero and denormals-are-zero bits while it
//   runs (x86), whatever the caller set.
// - The step's scalars come from make_step exactly as adamw_update and adamw_grad_scale compute them: the reciprocal
//   bias corrections with the host's powf, the gradient scale with IEEE square root and divisions (the GPU's too).
// - bf16: the GPU's stochastic rounding (the float's bits plus 16 random bits of rounding_hash, truncated); fp16: round
//   to nearest even (F16C, or the scalar path's integer conversion). A NaN becomes 0x7fff in both, as on the GPU.
// What is not bitwise: the payload of a NaN in an fp32 output (the GPU writes 0x7fffffff, x86 keeps an input NaN's
// payload). A NaN can come only from NaN or inf already in the state: non-finite gradients skip the step.
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define ADAMW_CPU_X86 1
#define ADAMW_CPU_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ADAMW_CPU_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,f16c")))
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#include "die.h"
#include "host_device.h"

#ifdef __FAST_MATH__
#error "kernels/adamw_cpu.h needs IEEE arithmetic: build it without -ffast-math"
#endif

namespace adamw_cpu {

// bf16 and fp16 values as their bits: the CPU's names for __nv_bfloat16 and __half (same size and layout, so a caller
// passes pointers to those through reinterpret_cast).
struct Bf16 { uint16_t bits; };
struct Fp16 { uint16_t bits; };

// adamw_grad_scale's factor (clipping and the removal of the fp16 loss scale), from the squared global norm of the
// loss-scaled gradients; 0 when the norm is not finite, and then update() leaves everything as it was.
inline float grad_scale(float norm_squared, float grad_clip, float loss_scale) {
    const float norm = std::sqrt(norm_squared) / loss_scale;
    if (!std::isfinite(norm)) return 0.0f;
    const float clip = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
    return clip / loss_scale;
}

// The scalars every element of one step uses.
struct Step {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;  // 0: the step is skipped
    float inv_bias_correction1, inv_bias_correction2;
    uint64_t seed;  // bf16's stochastic rounding
};
// From the step's hyperparameters (kernels/adamw.cuh's AdamWHyper, or any struct with its fields) and the squared
// global norm of the gradients, as adamw_update computes them for the kernel.
template <typename Hyper>
Step make_step(const Hyper& h, float norm_squared) {
    return {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, grad_scale(norm_squared, h.grad_clip, h.loss_scale),
            1.0f / (1.0f - ::powf(h.beta1, (float)h.t)), 1.0f / (1.0f - ::powf(h.beta2, (float)h.t)), h.seed};
}

enum class Isa { Scalar, Avx2, Avx512 };
inline const char* isa_name(Isa isa) { return isa == Isa::Avx512 ? "AVX-512" : isa == Isa::Avx2 ? "AVX2" : "scalar"; }
namespace detail {
// The vector paths the CPU can run, read once: AVX2 with FMA and F16C; AVX-512 F, DQ and VL besides.
struct CpuPaths {
    bool avx2 = false, avx512 = false;
    CpuPaths() {
#ifdef ADAMW_CPU_X86
        unsigned int eax, ebx, ecx, edx;  // F16C by cpuid: clang's __builtin_cpu_supports does not know it
        const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
        avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
    }
};
}  // namespace detail
inline bool isa_supported(Isa isa) {
    static const detail::CpuPaths cpu;
    return isa == Isa::Scalar || (isa == Isa::Avx2 && cpu.avx2) || (isa == Isa::Avx512 && cpu.avx512);
}
inline Isa best_isa() {
    static const Isa best = isa_supported(Isa::Avx512) ? Isa::Avx512 : isa_supported(Isa::Avx2) ? Isa::Avx2 : Isa::Scalar;
    return best;
}

namespace detail {

inline uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}
inline float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

// What round_stochastic and the conversions make of a NaN: 0x7fff in bf16 and in fp16. These float NaNs turn into it
// (bf16: 0x7fff0000 plus at most 0xffff keeps the top half; fp16: F16C keeps the top 10 bits of the payload).
constexpr uint32_t kBf16CanonicalNaN = 0x7fff0000u, kFp16CanonicalNaN = 0x7fffe000u;

inline float to_float(float x) { return x; }
inline float to_float(Bf16 x) { return float_of((uint32_t)x.bits << 16); }
// Exact, like F16C's vcvtph2ps (a NaN keeps its payload and becomes quiet).
inline float to_float(Fp16 x) {
    const uint32_t sign = (uint32_t)(x.bits & 0x8000) << 16, exponent = (x.bits >> 10) & 0x1f, mantissa = x.bits & 0x3ff;
    if (exponent == 0x1f) return float_of(sign | 0x7f800000u | mantissa << 13 | (mantissa != 0 ? 0x400000u : 0u));
    if (exponent == 0) return float_of(sign | bits_of((float)mantissa * 0x1p-24f));  // subnormal: exact in float
    return float_of(sign | (exponent + 112) << 23 | mantissa << 13);
}

// float to fp16, rounded to nearest even (as __float2half_rn and F16C's vcvtps2ph with imm 0).
inline uint16_t fp16_bits(float x) {
    const uint32_t b = bits_of(x), sign = (b >> 16) & 0x8000, magnitude = b & 0x7fffffff;
    if (magnitude > 0x7f800000u) return 0x7fff;
    if (magnitude >= 0x47800000u) return (uint16_t)(sign | 0x7c00);  // 2^16 or more: inf
    if (magnitude >= 0x38800000u) {  // 2^-14 or more: a normal fp16 (from 65520 on, the rounding carries into inf)
        const uint32_t rebiased = magnitude - 0x38000000u;  // exponent bias 127 -> 15
        return (uint16_t)(sign | (rebiased + 0xfff + ((rebiased >> 13) & 1)) >> 13);
    }
    // a subnormal fp16 or zero: the value in units of 2^-24, rounded to nearest even
    const int shift = 126 - (int)(magnitude >> 23);
    if (shift > 24) return (uint16_t)sign;  // below 2^-25: rounds to 0
    const uint32_t significand = (magnitude & 0x7fffff) | 0x800000, half = 1u << (shift - 1);
    const uint32_t units = significand >> shift, rest = significand & ((half << 1) - 1);
    return (uint16_t)(sign | (units + (rest > half || (rest == half && (units & 1)))));
}

// round_stochastic<__nv_bfloat16>: `random`'s low 16 bits added to the float's bits, which are then truncated.
inline uint16_t bf16_bits_stochastic(float x, uint32_t random) {
    const uint32_t b = std::isnan(x) ? kBf16CanonicalNaN : bits_of(x);
    return (uint16_t)((b + (random & 0xffff)) >> 16);
}

// adamw.cuh's rounding_hash and rounding_bits: 16 bits of one hash for 4 consecutive elements.
inline uint64_t rounding_hash(uint64_t seed, long index) { return splitmix64(seed ^ splitmix64((uint64_t)index >> 2)); }
inline uint32_t rounding_bits(uint64_t hash, long index) { return (uint32_t)(hash >> (16 * (index & 3))); }

inline void store(float* to, float x, uint32_t) { *to = x; }
inline void store(Bf16* to, float x, uint32_t random) { to->bits = bf16_bits_stochastic(x, random); }
inline void store(Fp16* to, float x, uint32_t) { to->bits = fp16_bits(x); }

// adamw_element with the GPU's fused multiply-adds (see the top of this file).
inline float update_element(float p, float g, float& m, float& v, float weight_decay, const Step& s) {
    g *= s.grad_scale;
    m = std::fma(s.beta1, m, (1.0f - s.beta1) * g);
    v = std::fma(g, (1.0f - s.beta2) * g, s.beta2 * v);
    const float m_hat = m * s.inv_bias_correction1, v_hat = v * s.inv_bias_correction2;
    const float u = std::fma(weight_decay, p, m_hat / (std::sqrt(v_hat) + s.eps));
    return std::fma(u, -s.lr, p);
}

// One call's arrays: element i (global index index_offset + i) of the shard.
template <typename Param, typename Grad>
struct Shard {
    Param* params;
    float* master;  // null: the parameters are read from params
    const Grad* grads;
    float *m, *v;
    long index_offset;
    Step step;
    LayoutMask decay;
};

template <typename Param, typename Grad>
inline void update_one(const Shard<Param, Grad>& a, long i) {
    const long index = a.index_offset + i;
    const float p = a.master != nullptr ? a.master[i] : to_float(a.params[i]);
    const float updated = update_element(p, to_float(a.grads[i]), a.m[i], a.v[i],
                                         a.decay.contains(index) ? a.step.weight_decay : 0.0f, a.step);
    if (a.master != nullptr) a.master[i] = updated;
    const bool stochastic = std::is_same<Param, Bf16>::value;
    store(a.params + i, updated, stochastic ? rounding_bits(rounding_hash(a.step.seed, index), index) : 0);
}

template <typename Param, typename Grad>
void update_scalar(const Shard<Param, Grad>& a, long begin, long end) {
    for (long i = begin; i < end; i++) update_one(a, i);
}

// The decay bits of W consecutive elements, found by runs of the mask: while the W lie in one run (the mask's
// same_until), a comparison; contains_bits where a run ends among them.
template <int W>
struct DecayRuns {
    const LayoutMask& mask;
    long run_end = LONG_MIN;  // contains() is `decays` from the last index looked up to here
    bool decays = false;
    uint32_t bits(long index) {
        if (index >= run_end) {
            decays = mask.contains(index);
            run_end = mask.same_until(index);
        }
        if (index + W <= run_end) return decays ? (1u << W) - 1 : 0u;
        return mask.template contains_bits<W>(index);
    }
};

// The vector paths do the elements before the first global index that is a multiple of 4 (where a rounding hash's
// group starts) and those after the last full vector one by one, with update_one.
#ifdef ADAMW_CPU_X86
ADAMW_CPU_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
ADAMW_CPU_AVX2 inline __m256 load8(const Bf16* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
ADAMW_CPU_AVX2 inline __m256 load8(const Fp16* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
// index: the global index of the first of the 8, a multiple of 4
ADAMW_CPU_AVX2 inline void store8(float* to, __m256 x, uint64_t, long) { _mm256_storeu_ps(to, x); }
ADAMW_CPU_AVX2 inline void store8(Bf16* to, __m256 x, uint64_t seed, long index) {
    const uint64_t hashes[2] = {rounding_hash(seed, index), rounding_hash(seed, index + 4)};  // 16 bits an element, in order
    const __m256i random = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)hashes));
    x = _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)kBf16CanonicalNaN)), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i b = _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(x), random), 16);
    _mm_storeu_si128((__m128i*)to, _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}
ADAMW_CPU_AVX2 inline void store8(Fp16* to, __m256 x, uint64_t, long) {
    x = _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)kFp16CanonicalNaN)), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    _mm_storeu_si128((__m128i*)to, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

template <typename Param, typename Grad>
ADAMW_CPU_AVX2 void update_avx2(const Shard<Param, Grad>& a, long begin, long end) {
    long i = begin;
    for (; i < end && (a.index_offset + i) % 4 != 0; i++) update_one(a, i);
    const Step& s = a.step;
    const __m256 grad_scale = _mm256_set1_ps(s.grad_scale), beta1 = _mm256_set1_ps(s.beta1), beta2 = _mm256_set1_ps(s.beta2);
    const __m256 one_minus_beta1 = _mm256_set1_ps(1.0f - s.beta1), one_minus_beta2 = _mm256_set1_ps(1.0f - s.beta2);
    const __m256 inv_bias_correction1 = _mm256_set1_ps(s.inv_bias_correction1), inv_bias_correction2 = _mm256_set1_ps(s.inv_bias_correction2);
    const __m256 eps = _mm256_set1_ps(s.eps), minus_lr = _mm256_set1_ps(-s.lr), weight_decay = _mm256_set1_ps(s.weight_decay);
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    DecayRuns<8> decay_runs{a.decay};
    for (; i + 8 <= end; i += 8) {
        const long index = a.index_offset + i;
        __m256 p = a.master != nullptr ? _mm256_loadu_ps(a.master + i) : load8(a.params + i);
        const __m256 g = _mm256_mul_ps(load8(a.grads + i), grad_scale);
        const __m256 m = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(a.m + i), _mm256_mul_ps(one_minus_beta1, g));
        const __m256 v = _mm256_fmadd_ps(g, _mm256_mul_ps(one_minus_beta2, g), _mm256_mul_ps(beta2, _mm256_loadu_ps(a.v + i)));
        const __m256 q = _mm256_div_ps(_mm256_mul_ps(m, inv_bias_correction1),
                                       _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(v, inv_bias_correction2)), eps));
        const __m256i decays = _mm256_set1_epi32((int)decay_runs.bits(index));
        const __m256 decay = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(decays, lane_bit), lane_bit)), weight_decay);
        p = _mm256_fmadd_ps(_mm256_fmadd_ps(decay, p, q), minus_lr, p);
        _mm256_storeu_ps(a.m + i, m);
        _mm256_storeu_ps(a.v + i, v);
        if (a.master != nullptr) _mm256_storeu_ps(a.master + i, p);
        store8(a.params + i, p, s.seed, index);
    }
    for (; i < end; i++) update_one(a, i);
}

// GCC 12 warns that the AVX-512 intrinsics' _mm512_undefined_*() placeholders may be used uninitialized: they are not.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
ADAMW_CPU_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
ADAMW_CPU_AVX512 inline __m512 load16(const Bf16* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
ADAMW_CPU_AVX512 inline __m512 load16(const Fp16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
// splitmix64 of 4 values at once, and the rounding hashes of 16 elements from index (a multiple of 4): 16 bits an
// element, in order.
ADAMW_CPU_AVX512 inline __m256i splitmix64x4(__m256i x) {
    x = _mm256_add_epi64(x, _mm256_set1_epi64x((long long)0x9E3779B97F4A7C15ull));
    x = _mm256_mullo_epi64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 30)), _mm256_set1_epi64x((long long)0xBF58476D1CE4E5B9ull));
    x = _mm256_mullo_epi64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 27)), _mm256_set1_epi64x((long long)0x94D049BB133111EBull));
    return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}
ADAMW_CPU_AVX512 inline __m256i rounding_hashes4(uint64_t seed, long index) {
    const __m256i groups = _mm256_add_epi64(_mm256_set1_epi64x((long long)((uint64_t)index >> 2)), _mm256_setr_epi64x(0, 1, 2, 3));
    return splitmix64x4(_mm256_xor_si256(_mm256_set1_epi64x((long long)seed), splitmix64x4(groups)));
}
ADAMW_CPU_AVX512 inline void store16(float* to, __m512 x, uint64_t, long) { _mm512_storeu_ps(to, x); }
ADAMW_CPU_AVX512 inline void store16(Bf16* to, __m512 x, uint64_t seed, long index) {
    const __m512i random = _mm512_cvtepu16_epi32(rounding_hashes4(seed, index));
    x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(_mm512_set1_epi32((int)kBf16CanonicalNaN)));
    const __m512i b = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(x), random), 16);
    _mm256_storeu_si256((__m256i*)to, _mm512_cvtepi32_epi16(b));
}
ADAMW_CPU_AVX512 inline void store16(Fp16* to, __m512 x, uint64_t, long) {
    x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(_mm512_set1_epi32((int)kFp16CanonicalNaN)));
    _mm256_storeu_si256((__m256i*)to, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

template <typename Param, typename Grad>
ADAMW_CPU_AVX512 void update_avx512(const Shard<Param, Grad>& a, long begin, long end) {
    long i = begin;
    for (; i < end && (a.index_offset + i) % 4 != 0; i++) update_one(a, i);
    const Step& s = a.step;
    const __m512 grad_scale = _mm512_set1_ps(s.grad_scale), beta1 = _mm512_set1_ps(s.beta1), beta2 = _mm512_set1_ps(s.beta2);
    const __m512 one_minus_beta1 = _mm512_set1_ps(1.0f - s.beta1), one_minus_beta2 = _mm512_set1_ps(1.0f - s.beta2);
    const __m512 inv_bias_correction1 = _mm512_set1_ps(s.inv_bias_correction1), inv_bias_correction2 = _mm512_set1_ps(s.inv_bias_correction2);
    const __m512 eps = _mm512_set1_ps(s.eps), minus_lr = _mm512_set1_ps(-s.lr), weight_decay = _mm512_set1_ps(s.weight_decay);
    DecayRuns<16> decay_runs{a.decay};
    for (; i + 16 <= end; i += 16) {
        const long index = a.index_offset + i;
        __m512 p = a.master != nullptr ? _mm512_loadu_ps(a.master + i) : load16(a.params + i);
        const __m512 g = _mm512_mul_ps(load16(a.grads + i), grad_scale);
        const __m512 m = _mm512_fmadd_ps(beta1, _mm512_loadu_ps(a.m + i), _mm512_mul_ps(one_minus_beta1, g));
        const __m512 v = _mm512_fmadd_ps(g, _mm512_mul_ps(one_minus_beta2, g), _mm512_mul_ps(beta2, _mm512_loadu_ps(a.v + i)));
        const __m512 q = _mm512_div_ps(_mm512_mul_ps(m, inv_bias_correction1),
                                       _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(v, inv_bias_correction2)), eps));
        const __m512 decay = _mm512_maskz_mov_ps((__mmask16)decay_runs.bits(index), weight_decay);
        p = _mm512_fmadd_ps(_mm512_fmadd_ps(decay, p, q), minus_lr, p);
        _mm512_storeu_ps(a.m + i, m);
        _mm512_storeu_ps(a.v + i, v);
        if (a.master != nullptr) _mm512_storeu_ps(a.master + i, p);
        store16(a.params + i, p, s.seed, index);
    }
    for (; i < end; i++) update_one(a, i);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// While alive, this thread keeps subnormal inputs and results (x86: MXCSR's FTZ and DAZ bits cleared), as the kernel does.
struct KeepSubnormals {
#ifdef ADAMW_CPU_X86
    const unsigned int saved = _mm_getcsr();
    KeepSubnormals() { _mm_setcsr(saved & ~(_MM_FLUSH_ZERO_ON | _MM_DENORMALS_ZERO_ON)); }
    ~KeepSubnormals() { _mm_setcsr(saved); }
#endif
};

// Elements a work item covers: work items start at global indices that are multiples of it (so of 4, a rounding hash's
// group) and are spread over the threads in order.
constexpr long kChunkElements = 8192;

}  // namespace detail

// Updates elements [begin, end) of a shard whose element 0 has global index index_offset (0 for a whole buffer): every
// pointer points at the shard's element 0. params: the compute-precision parameters (float, Bf16 or Fp16), written;
// master: the fp32 master weights, or null, as in adamw_update (then the parameters are read from params: fp32
// parameters are their own master weights); grads: the gradients, in the compute type or fp32; m, v: fp32 moments.
// decay: the weight-decay mask over global indices (the kernel's). An element's result depends only on its values and
// global index, so any tiling of a shard (and any thread count) gives the same bits: a caller can update tile k while
// tile k+1's gradients and tile k-1's parameters are copied. threads: OpenMP threads (0: the default team); isa: the
// path (a vector path the CPU lacks is refused).
template <typename Param, typename Grad>
void update(Param* params, float* master, const Grad* grads, float* m, float* v, long begin, long end, long index_offset,
            const Step& step, const LayoutMask& decay, int threads = 0, Isa isa = best_isa()) {
    static_assert(std::is_same<Grad, Param>::value || std::is_same<Grad, float>::value, "gradients in the compute type or fp32");
    if (!isa_supported(isa)) die(std::string("adamw_cpu::update: this CPU has no ") + isa_name(isa));
    if (step.grad_scale == 0.0f || begin >= end) return;  // non-finite gradients: the step is skipped
    const detail::Shard<Param, Grad> shard{params, master, grads, m, v, index_offset, step, decay};
    void (*run)(const detail::Shard<Param, Grad>&, long, long) = detail::update_scalar<Param, Grad>;
#ifdef ADAMW_CPU_X86
    if (isa == Isa::Avx2) run = detail::update_avx2<Param, Grad>;
    if (isa == Isa::Avx512) run = detail::update_avx512<Param, Grad>;
#endif
    const long chunk = detail::kChunkElements, first = (index_offset + begin) / chunk, last = (index_offset + end - 1) / chunk;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
#else
    (void)threads;
#endif
    for (long c = first; c <= last; c++) {
        const detail::KeepSubnormals keep;
        run(shard, std::max(begin, c * chunk - index_offset), std::min(end, (c + 1) * chunk - index_offset));
    }
}

}  // namespace adamw_cpu
