// FP8 in plain C++ (g++ and nvcc, no CUDA header), shared by the kernels (fp8.cuh, matmul.cuh) and host code: the two
// formats and their limits, the per-tensor scale from an amax (current or delayed scaling, an amax history), the reference cast float -> FP8
// (round to nearest even, saturating to the largest finite value, with subnormals) that the GPU's cast matches bit
// for bit, the decoding back to float, and the shapes cuBLASLt's FP8 products take. The kernels are in fp8.cuh.
// defines: Fp8Format, fp8_max, fp8_name, fp8_scale_from_amax, kFp8MaxScale, Fp8Scaling, fp8_set_scale, fp8_update_scaling,
//          fp8_update_scaling_from_history, fp8_saturates, fp8_round,
//          fp8_to_float, fp8_matmul_shape_problem, fp8_cast_shape_problem
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include "host_device.h"

// E4M3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities (S.1111.111 is NaN), largest finite 448: the
// forward's weights and activations, where precision matters. E5M2: 5 exponent bits (bias 15), 2 mantissa bits,
// IEEE infinities and NaNs, largest finite 57344: the gradients, whose range matters more than their precision.
enum class Fp8Format { E4M3, E5M2 };

HOST_DEVICE_INLINE float fp8_max(Fp8Format format) { return format == Fp8Format::E4M3 ? 448.0f : 57344.0f; }
HOST_DEVICE_INLINE int fp8_mantissa_bits(Fp8Format format) { return format == Fp8Format::E4M3 ? 3 : 2; }
HOST_DEVICE_INLINE int fp8_exponent_bias(Fp8Format format) { return format == Fp8Format::E4M3 ? 7 : 15; }
// The code of the largest finite value, without the sign: S.1111.110 and S.11110.11.
HOST_DEVICE_INLINE uint32_t fp8_max_code(Fp8Format format) { return format == Fp8Format::E4M3 ? 0x7Eu : 0x7Bu; }
inline const char* fp8_name(Fp8Format format) { return format == Fp8Format::E4M3 ? "E4M3" : "E5M2"; }

// The largest scale handed out: its inverse, which cuBLASLt multiplies the product by, stays a normal float
// (a flush-to-zero kernel would read a subnormal one as 0). Only an amax below about 2^-118 reaches it.
constexpr float kFp8MaxScale = 0x1p126f;

// The scale that maps amax onto the format's largest finite value, divided by 2^margin (headroom for values that
// grow before the next update): the cast stores round(x * scale), the product multiplies by 1 / scale. An amax of
// zero (an all-zero tensor says nothing of its range) and a NaN or infinite one (an overflow upstream) keep the
// previous scale; fp8_update_scales (fp8.cuh) counts the non-finite ones.
HOST_DEVICE_INLINE float fp8_scale_from_amax(float amax, float previous_scale, Fp8Format format, int margin) {
    if (!(amax > 0.0f) || !(amax <= FLT_MAX)) return previous_scale;  // zero, negative, NaN (compares false), inf
    return fminf(ldexpf(fp8_max(format) / amax, -margin), kFp8MaxScale);  // fminf: an inf quotient becomes the cap
}

// A quantised tensor's scaling state, in device memory (one per tensor; 32 bytes). Delayed scaling: a cast uses the
// scale from the amaxes seen up to the last update and adds its own input's amax for the next one. Current scaling:
// fp8_amax takes the tensor's amax into current_amax just before the cast, and fp8_scale_from_current (fp8.cuh)
// makes the scale from it, leaving `amax` to the casts. The casts count the values they saturate (overflow).
// cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED, cuBLAS 13.1 on an H200) A and B scale pointers that are not 16-byte
// aligned: inverse_scale comes first in a 16-byte aligned struct.
struct alignas(16) Fp8Scaling {
    float inverse_scale = 1.0f;       // 1 / scale: the product's dequantisation (cuBLASLt's A and B scale pointers)
    float scale = 1.0f;               // the cast stores round(x * scale)
    float amax = 0.0f;                // max |x| over the casts and fp8_amax calls since the last update (NaN, inf kept)
    float current_amax = 0.0f;        // current scaling: max |x| of the tensor about to be cast (cleared once used)
    unsigned long long overflow = 0;  // values whose |x * scale| lay beyond the format's range (fp8_saturates), all casts
    uint32_t non_finite_amax = 0;     // updates that found a NaN or infinite amax and kept the scale
};

// Sets the scale from `amax` (the previous one kept, and counted when the amax is NaN or inf) and its inverse.
HOST_DEVICE_INLINE void fp8_set_scale(Fp8Scaling& s, float amax, Fp8Format format, int margin) {
    if (amax != amax || amax > FLT_MAX) s.non_finite_amax++;
    s.scale = fp8_scale_from_amax(amax, s.scale, format, margin);
    s.inverse_scale = 1.0f / s.scale;
}

// One update of a tensor's scaling (fp8_update_scales runs it on the device): the scale from the amax (or the
// previous one, counted when the amax was NaN or inf), its inverse, and the amax cleared for the next interval.
HOST_DEVICE_INLINE void fp8_update_scaling(Fp8Scaling& s, Fp8Format format, int margin) {
    fp8_set_scale(s, s.amax, format, margin);
    s.amax = 0.0f;
}

// Delayed scaling with an amax history (fp8_update_scales_from_history runs it on the device): this interval's amax
// goes into slot `slot` of the tensor's `length` past amaxes (a NaN or inf one counted and stored as 0: it says
// nothing of the range), the scale comes from their max (all zero: the previous scale), and the amax is cleared.
HOST_DEVICE_INLINE void fp8_update_scaling_from_history(Fp8Scaling& s, float* history, int length, int slot, Fp8Format format, int margin) {
    const bool finite = s.amax == s.amax && s.amax <= FLT_MAX;
    if (!finite) s.non_finite_amax++;
    history[slot] = finite ? s.amax : 0.0f;
    float amax = 0.0f;
    for (int i = 0; i < length; i++) amax = fmaxf(amax, history[i]);
    s.scale = fp8_scale_from_amax(amax, s.scale, format, margin);
    s.inverse_scale = 1.0f / s.scale;
    s.amax = 0.0f;
}

// Whether the cast saturates |x * scale| = v: whether rounding it to nearest even without a bound would give more
// than the largest finite value (v beyond the midpoint between that value and the next binade's step; at the
// midpoint itself the even code wins: E4M3's largest, S.1111.110, is even, E5M2's, S.11110.11, odd). Values up to
// the midpoint round to the largest value anyway; infinities saturate; NaN does not count.
HOST_DEVICE_INLINE bool fp8_saturates(float v, Fp8Format format) {
    const float midpoint = format == Fp8Format::E4M3 ? 464.0f : 61440.0f;  // 448 + 32 / 2, 57344 + 8192 / 2
    return format == Fp8Format::E4M3 ? v > midpoint : v >= midpoint;
}

// The host reference of the cast: x rounded to the format's nearest value, ties to the even code (the one whose
// mantissa ends in 0), values beyond the largest finite one and infinities saturated to it with x's sign (as
// cvt.rn.satfinite does), values at or below half the smallest subnormal to a zero of x's sign. NaN gives a NaN
// (S.1111.111 for E4M3, S.11111.10 for E5M2; which NaN code the GPU writes is not specified, so tests compare
// NaN-ness). Integer arithmetic on x's bits, independent of cuda_fp8.h, which the GPU test checks it against.
inline uint8_t fp8_round(float x, Fp8Format format) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint32_t sign = (bits >> 24) & 0x80u, magnitude = bits & 0x7FFFFFFFu;
    const uint32_t max_code = fp8_max_code(format);
    if (magnitude > 0x7F800000u) return (uint8_t)(sign | (format == Fp8Format::E4M3 ? 0x7Fu : 0x7Eu));
    if (magnitude == 0x7F800000u) return (uint8_t)(sign | max_code);
    const int m = fp8_mantissa_bits(format), bias = fp8_exponent_bias(format);
    const int biased = (int)(magnitude >> 23);
    if (biased == 0) return (uint8_t)sign;  // fp32 subnormals lie far below half the smallest FP8 subnormal
    // x = significand * 2^(exponent - 23), with the implicit bit; the FP8 value's unit in the last place is
    // 2^quantum, where quantum is the exponent less m, but not below the subnormals' (1 - bias - m)
    const int exponent = biased - 127;
    const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    const int min_exponent = 1 - bias;
    int quantum = (exponent > min_exponent ? exponent : min_exponent) - m;
    const int shift = quantum - (exponent - 23);  // bits of the significand below the unit: at least 23 - m
    if (shift > 25) return (uint8_t)sign;         // x < 2^(quantum - 2): below half a unit, rounds to zero
    uint32_t units = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (units & 1u))) units++;
    if (units == 0) return (uint8_t)sign;
    if (units == (2u << m)) {  // rounding carried into the next binade
        units >>= 1;
        quantum++;
    }
    // units < 2^m only in the subnormal range (exponent field 0); else the leading bit is the implicit one
    const uint32_t code = units < (1u << m) ? units : ((uint32_t)(quantum + m + bias) << m) | (units - (1u << m));
    return (uint8_t)(sign | (code > max_code ? max_code : code));
}

// The value of an FP8 code (NaN and, for E5M2, the infinities included).
inline float fp8_to_float(uint8_t code, Fp8Format format) {
    const int m = fp8_mantissa_bits(format), bias = fp8_exponent_bias(format);
    const float sign = (code & 0x80u) ? -1.0f : 1.0f;
    const uint32_t exponent_field = (code & 0x7Fu) >> m, mantissa = code & ((1u << m) - 1);
    if (format == Fp8Format::E4M3 && (code & 0x7Fu) == 0x7Fu) return NAN;
    if (format == Fp8Format::E5M2 && exponent_field == 31) return mantissa == 0 ? sign * INFINITY : NAN;
    if (exponent_field == 0) return sign * ldexpf((float)mantissa, 1 - bias - m);
    return sign * ldexpf((float)((1u << m) | mantissa), (int)exponent_field - bias - m);
}

// cuBLASLt's FP8 products (matmul_fp8, matmul.cuh) read both operands with the reduction dimension contiguous and
// need it (k) and the output's contiguous dimension (m) to be multiples of 16; the other output dimension (n,
// the rows of a row-major output) may be any. "" when the shape is one they take, else the one-line reason.
inline std::string fp8_matmul_shape_problem(int m, int n, int k) {
    if (m > 0 && n > 0 && k > 0 && m % 16 == 0 && k % 16 == 0) return "";
    return "FP8 product of m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           ": cuBLASLt's FP8 kernels need the output width m and the reduction length k to be positive multiples "
           "of 16 (n: any positive count)";
}

// The cast (fp8_cast, fp8.cuh) moves 16 elements a thread: the row length must be a multiple of 16, and of the rows'
// count too when it also writes the transposed copy (whose rows are the input's columns).
inline std::string fp8_cast_shape_problem(long rows, long cols, bool transposed) {
    if (rows > 0 && cols > 0 && cols % 16 == 0 && (!transposed || rows % 16 == 0)) return "";
    return "FP8 cast of " + std::to_string(rows) + " x " + std::to_string(cols) + (transposed ? " with its transpose" : "") +
           ": the row length" + (transposed ? " and the row count must be positive multiples" : " must be a positive multiple") +
           " of 16";
}
