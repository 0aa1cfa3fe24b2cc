// Tests for the host side of FP8 (kernels/fp8_formats.h, and the GPU check of kernels/gpu_support.h), without a GPU:
// the reference cast float -> E4M3 / E5M2 against known codes (round to nearest even, saturation to the largest
// finite value, subnormals, signed zeros, infinities, NaN) and against the formats' own grids (every pair of
// neighbouring codes: the midpoint goes to the even code, a hair off it to the nearer one); the scale from an amax
// (outliers, zero, NaN and inf amaxes keep the previous scale and the non-finite ones are counted; the margin; the
// cap); the shapes the FP8 products and casts take; the refusal of GPUs below compute capability 8.9.
// The GPU's cast, amax, scale update and products are checked in test_fp8_gpu.cu. One PASS/FAIL line per check.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "../kernels/fp8_formats.h"
#include "../kernels/gpu_support.h"
#include "check.h"

static std::string hex(uint32_t v) {
    char buf[16];
    snprintf(buf, sizeof buf, "0x%02X", v);
    return buf;
}

struct KnownCode {
    float x;
    uint8_t code;
    const char* what;
};

static void check_known_codes(Fp8Format format, const std::vector<KnownCode>& cases) {
    std::string bad;
    for (const KnownCode& c : cases) {
        const uint8_t got = fp8_round(c.x, format);
        if (got != c.code) bad += std::string(bad.empty() ? "" : "; ") + c.what + fmt(" (%.9g)", c.x) + " -> " + hex(got) + ", expected " + hex(c.code);
    }
    expect(bad.empty(), std::string(fp8_name(format)) + " rounding of " + std::to_string(cases.size()) + " known values", bad);
}

// Every finite code decodes to the value its bits say, and the codes order as their values do.
static void check_decoding(Fp8Format format) {
    std::string bad;
    const int m = fp8_mantissa_bits(format), bias = fp8_exponent_bias(format);
    for (uint32_t code = 0; code <= fp8_max_code(format); code++) {
        const uint32_t e = code >> m, mantissa = code & ((1u << m) - 1);
        const double expected = e == 0 ? std::ldexp((double)mantissa, 1 - bias - m) : std::ldexp(1.0 + std::ldexp((double)mantissa, -m), (int)e - bias);
        const float got = fp8_to_float((uint8_t)code, format);
        if ((double)got != expected || fp8_to_float((uint8_t)(code | 0x80u), format) != -got) bad += " " + hex(code);
        if (code > 0 && !(got > fp8_to_float((uint8_t)(code - 1), format))) bad += " order@" + hex(code);
    }
    const bool nan_ok = format == Fp8Format::E4M3 ? std::isnan(fp8_to_float(0x7F, format)) && std::isnan(fp8_to_float(0xFF, format))
                                                  : std::isinf(fp8_to_float(0x7C, format)) && std::isnan(fp8_to_float(0x7D, format)) &&
                                                        fp8_to_float(0xFC, format) == -INFINITY;
    expect(bad.empty() && nan_ok, std::string(fp8_name(format)) + " decoding of every code", bad.empty() ? "NaN/inf codes" : "codes" + bad);
    check(fp8_to_float((uint8_t)fp8_max_code(format), format) == fp8_max(format), std::string(fp8_name(format)) + " largest finite code",
          fmt("%g", fp8_to_float((uint8_t)fp8_max_code(format), format)));
}

// For each pair of neighbouring non-negative codes (lo, hi): the midpoint rounds to the even code, the floats just
// below and above it to lo and hi; each code's own value, and its negative, round to it.
static void check_grid(Fp8Format format) {
    std::string bad;
    int pairs = 0;
    for (uint32_t lo = 0; lo < fp8_max_code(format); lo++) {
        const uint32_t hi = lo + 1;
        const float a = fp8_to_float((uint8_t)lo, format), b = fp8_to_float((uint8_t)hi, format);
        const float mid = 0.5f * (a + b);  // exact: the codes have at most 4 significant bits
        const uint32_t even = (lo % 2 == 0) ? lo : hi;
        const uint8_t at_mid = fp8_round(mid, format), below = fp8_round(std::nextafter(mid, 0.0f), format),
                      above = fp8_round(std::nextafter(mid, INFINITY), format);
        if (at_mid != even || below != lo || above != hi) bad += " " + hex(lo) + "/" + hex(hi);
        if (fp8_round(a, format) != lo || fp8_round(-a, format) != (lo | 0x80u)) bad += " exact " + hex(lo);
        pairs++;
    }
    expect(bad.empty(), std::string(fp8_name(format)) + " round to nearest even between all " + std::to_string(pairs) + " neighbouring codes",
           "wrong at" + bad.substr(0, 300));
}

static void check_rounding() {
    const float tiny_e4m3 = std::ldexp(1.0f, -9), tiny_e5m2 = std::ldexp(1.0f, -16);  // the smallest subnormals
    check_known_codes(Fp8Format::E4M3, {
        {1.0f, 0x38, "one"}, {-2.0f, 0xC0, "minus two"}, {0.0f, 0x00, "zero"}, {-0.0f, 0x80, "negative zero"},
        {448.0f, 0x7E, "largest finite"}, {464.0f, 0x7E, "halfway past the largest (tie to even: 448)"},
        {470.0f, 0x7E, "beyond the largest: saturated"}, {1e9f, 0x7E, "far beyond: saturated"}, {-1e30f, 0xFE, "negative far beyond"},
        {FLT_MAX, 0x7E, "FLT_MAX"}, {INFINITY, 0x7E, "inf saturated"}, {-INFINITY, 0xFE, "-inf saturated"},
        {1.0625f, 0x38, "tie between 1 and 1.125: to even 1"}, {1.1875f, 0x3A, "tie between 1.125 and 1.25: to even 1.25"},
        {1.07f, 0x39, "above the tie: 1.125"}, {240.0f, 0x77, "240"}, {-0.3f, 0xAA, "-0.3 -> -0.3125"},
        {std::ldexp(1.0f, -6), 0x08, "smallest normal"}, {tiny_e4m3, 0x01, "smallest subnormal"},
        {7 * tiny_e4m3, 0x07, "largest subnormal"}, {7.5f * tiny_e4m3, 0x08, "tie between the largest subnormal and the smallest normal"},
        {0.5f * tiny_e4m3, 0x00, "half the smallest subnormal: tie to zero"}, {-0.5f * tiny_e4m3, 0x80, "minus that: negative zero"},
        {0.51f * tiny_e4m3, 0x01, "just above half the smallest subnormal"}, {1.5f * tiny_e4m3, 0x02, "tie between subnormals 1 and 2: to 2"},
        {2.5f * tiny_e4m3, 0x02, "tie between subnormals 2 and 3: to 2"}, {1e-30f, 0x00, "far below: zero"},
        {1e-45f, 0x00, "an fp32 subnormal: zero"},
    });
    check_known_codes(Fp8Format::E5M2, {
        {1.0f, 0x3C, "one"}, {-2.0f, 0xC0, "minus two"}, {0.0f, 0x00, "zero"}, {-0.0f, 0x80, "negative zero"},
        {57344.0f, 0x7B, "largest finite"}, {61440.0f, 0x7B, "halfway past the largest: saturated"},
        {1e9f, 0x7B, "far beyond: saturated"}, {INFINITY, 0x7B, "inf saturated"}, {-INFINITY, 0xFB, "-inf saturated"},
        {1.125f, 0x3C, "tie between 1 and 1.25: to even 1"}, {1.375f, 0x3E, "tie between 1.25 and 1.5: to even 1.5"},
        {std::ldexp(1.0f, -14), 0x04, "smallest normal"}, {tiny_e5m2, 0x01, "smallest subnormal"},
        {3 * tiny_e5m2, 0x03, "largest subnormal"}, {3.5f * tiny_e5m2, 0x04, "tie between the largest subnormal and the smallest normal"},
        {0.5f * tiny_e5m2, 0x00, "half the smallest subnormal: tie to zero"}, {1.5f * tiny_e5m2, 0x02, "tie between subnormals 1 and 2: to 2"},
        {1e-30f, 0x00, "far below: zero"}, {-1e-6f, 0x80, "-1e-6: negative zero"}, {0.0001f, 0x07, "1e-4 -> 1.75 x 2^-14"},
    });
    expect(std::isnan(fp8_to_float(fp8_round(NAN, Fp8Format::E4M3), Fp8Format::E4M3)) &&
               std::isnan(fp8_to_float(fp8_round(-NAN, Fp8Format::E4M3), Fp8Format::E4M3)) &&
               std::isnan(fp8_to_float(fp8_round(NAN, Fp8Format::E5M2), Fp8Format::E5M2)),
           "NaN rounds to a NaN in both formats", "a NaN came out as a number");
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
        check_decoding(f);
        check_grid(f);
    }
}

static void check_scales() {
    const Fp8Format e4m3 = Fp8Format::E4M3, e5m2 = Fp8Format::E5M2;
    check(fp8_scale_from_amax(4.0f, 1.0f, e4m3, 0) == 112.0f, "E4M3 scale maps amax onto 448", fmt("amax 4: scale %g (expected 112)", fp8_scale_from_amax(4.0f, 1.0f, e4m3, 0)));
    check(fp8_scale_from_amax(4.0f, 1.0f, e5m2, 0) == 14336.0f, "E5M2 scale maps amax onto 57344", fmt("amax 4: scale %g (expected 14336)", fp8_scale_from_amax(4.0f, 1.0f, e5m2, 0)));
    check(fp8_scale_from_amax(4.0f, 1.0f, e4m3, 2) == 28.0f, "margin 2 divides the scale by 4", fmt("scale %g (expected 28)", fp8_scale_from_amax(4.0f, 1.0f, e4m3, 2)));
    // an outlier: the scale follows it, and the outlier itself casts to the largest finite value, not beyond
    const float outlier = 3.0e5f, outlier_scale = fp8_scale_from_amax(outlier, 1.0f, e4m3, 0);
    check(fp8_round(outlier * outlier_scale, e4m3) == 0x7E && fp8_round(-outlier * outlier_scale, e4m3) == 0xFE,
          "an outlier amax: the outlier casts to +-448", fmt("scale %g, code of the outlier %g", outlier_scale, fp8_round(outlier * outlier_scale, e4m3)));
    const float small = 1e-3f, small_scale = fp8_scale_from_amax(small, 1.0f, e5m2, 0);
    check(fp8_round(small * small_scale, e5m2) == 0x7B, "a small amax (1e-3, a gradient's): it casts to 57344", fmt("scale %g", small_scale));
    // zero, NaN, inf and negative amaxes keep the previous scale
    const float kept[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, -1.0f};
    std::string bad;
    for (float amax : kept)
        if (fp8_scale_from_amax(amax, 3.5f, e4m3, 0) != 3.5f) bad += fmt(" %g", amax);
    expect(bad.empty(), "zero, NaN, inf and negative amaxes keep the previous scale", "changed for amax" + bad);
    // the cap: a tiny amax whose quotient overflows, and one just below it
    const float tiny = std::ldexp(1.0f, -130);  // a bf16 subnormal
    check(fp8_scale_from_amax(tiny, 1.0f, e4m3, 0) == kFp8MaxScale && std::isnormal(1.0f / kFp8MaxScale),
          "a subnormal amax: the scale is capped at 2^126 (its inverse a normal float)", fmt("scale %g", fp8_scale_from_amax(tiny, 1.0f, e4m3, 0)));
    check(fp8_scale_from_amax(FLT_MAX, 1.0f, e5m2, 0) > 0.0f, "amax FLT_MAX: a positive scale", fmt("scale %g", fp8_scale_from_amax(FLT_MAX, 1.0f, e5m2, 0)));

    // the state's update: scale and inverse from the amax, amax cleared, non-finite amaxes counted and the scale kept
    Fp8Scaling s;
    s.amax = 2.0f;
    fp8_update_scaling(s, e4m3, 0);
    check(s.scale == 224.0f && s.inverse_scale == 1.0f / 224.0f && s.amax == 0.0f && s.non_finite_amax == 0,
          "update: scale 448/amax, its inverse, amax cleared", fmt("scale %g inverse %g amax %g", s.scale, s.inverse_scale, s.amax));
    s.amax = NAN;
    fp8_update_scaling(s, e4m3, 0);
    const bool kept_nan = s.scale == 224.0f && s.amax == 0.0f && s.non_finite_amax == 1;
    s.amax = INFINITY;
    fp8_update_scaling(s, e4m3, 0);
    const bool kept_inf = s.scale == 224.0f && s.amax == 0.0f && s.non_finite_amax == 2;
    fp8_update_scaling(s, e4m3, 0);  // zero amax (nothing cast since): kept, not counted
    const bool kept_zero = s.scale == 224.0f && s.non_finite_amax == 2;
    check(kept_nan && kept_inf && kept_zero, "update: NaN and inf amaxes keep the scale and are counted, zero keeps it uncounted",
          fmt("scale %g, non-finite count %g", s.scale, s.non_finite_amax));
    s.amax = 448.0f;
    fp8_update_scaling(s, e4m3, 0);
    check(s.scale == 1.0f && s.inverse_scale == 1.0f && s.non_finite_amax == 2, "update after a NaN: a finite amax sets the scale again",
          fmt("scale %g", s.scale));

    // delayed scaling: the scale from the history's max, this interval's amax in its slot, NaN stored as 0 and counted
    Fp8Scaling d;
    float history[4] = {1.0f, 8.0f, 2.0f, 0.0f};
    d.amax = 4.0f;
    fp8_update_scaling_from_history(d, history, 4, 1, e4m3, 0);  // overwrites the 8
    const bool from_max = d.scale == 112.0f && history[1] == 4.0f && d.amax == 0.0f;
    d.amax = NAN;
    fp8_update_scaling_from_history(d, history, 4, 1, e4m3, 0);
    const bool nan_kept = d.scale == 224.0f && history[1] == 0.0f && d.non_finite_amax == 1;  // max of 1, 0, 2, 0
    float empty[2] = {0.0f, 0.0f};
    d.amax = 0.0f;
    fp8_update_scaling_from_history(d, empty, 2, 0, e4m3, 0);
    const bool zeros_keep = d.scale == 224.0f;
    check(from_max && nan_kept && zeros_keep, "amax history: the scale from its max, a NaN amax stored as 0 and counted, an all-zero history keeps the scale",
          fmt("scale %g", d.scale));

    // saturation: beyond the midpoint above the largest value (ties: E4M3's largest code is even, E5M2's odd)
    const bool e4m3_edges = !fp8_saturates(448.0f, e4m3) && !fp8_saturates(464.0f, e4m3) && fp8_saturates(464.03125f, e4m3) &&
                            fp8_round(464.0f, e4m3) == 0x7E && fp8_saturates(INFINITY, e4m3) && !fp8_saturates(NAN, e4m3);
    const bool e5m2_edges = !fp8_saturates(57344.0f, e5m2) && !fp8_saturates(61439.0f, e5m2) && fp8_saturates(61440.0f, e5m2) &&
                            fp8_round(61439.0f, e5m2) == 0x7B && fp8_saturates(INFINITY, e5m2);
    check(e4m3_edges && e5m2_edges, "saturated values: beyond the rounding midpoint above 448 (E4M3) and 57344 (E5M2), infinities; not NaN",
          std::string(e4m3_edges ? "" : "E4M3 edges wrong ") + (e5m2_edges ? "" : "E5M2 edges wrong"));
}

static void check_shapes() {
    check(fp8_matmul_shape_problem(4096, 4096, 16384).empty() && fp8_matmul_shape_problem(48, 37, 80).empty() &&
              fp8_matmul_shape_problem(16, 1, 16).empty(),
          "FP8 product shapes: m and k multiples of 16, any n", fp8_matmul_shape_problem(48, 37, 80));
    std::string bad;
    struct Shape { int m, n, k; };
    for (const Shape& s : {Shape{40, 64, 64}, Shape{64, 64, 40}, Shape{8, 16, 16}, Shape{0, 16, 16}, Shape{16, 0, 16}, Shape{16, 16, -16}}) {
        const std::string problem = fp8_matmul_shape_problem(s.m, s.n, s.k);
        if (problem.empty() || problem.find('\n') != std::string::npos || problem.find("multiples of 16") == std::string::npos)
            bad += fmt(" m=%g n=%g k=%g", s.m, s.n, s.k) + ": '" + problem + "'";
    }
    expect(bad.empty(), "FP8 product shapes refused in one line naming the rule", bad);
    const std::string example = fp8_matmul_shape_problem(40, 64, 64);
    check(example.find("m=40") != std::string::npos && example.find("k=64") != std::string::npos, "the refusal names the shape given", example);
    check(fp8_cast_shape_problem(37, 48, false).empty() && fp8_cast_shape_problem(48, 64, true).empty() &&
              !fp8_cast_shape_problem(37, 48, true).empty() && !fp8_cast_shape_problem(32, 40, false).empty() &&
              !fp8_cast_shape_problem(0, 16, false).empty(),
          "FP8 cast shapes: rows of a multiple of 16 values; row counts too with the transpose", fp8_cast_shape_problem(37, 48, true));
}

static void check_gpu_refusal() {
    const std::string a100 = fp8_support_problem("NVIDIA A100-SXM4-80GB", 8, 0);
    expect(a100.find("NVIDIA A100-SXM4-80GB") != std::string::npos && a100.find("compute capability 8.0") != std::string::npos &&
               a100.find("8.9 or newer") != std::string::npos && a100.find('\n') == std::string::npos,
           "FP8 refuses an A100 (8.0) in one line naming it", "message: " + a100);
    expect(!fp8_support_problem("NVIDIA GeForce RTX 3090", 8, 6).empty(), "FP8 refuses an RTX 3090 (8.6)", "accepted");
    std::string bad;
    struct Capability { int major, minor; };
    for (const Capability& cc : {Capability{8, 9}, Capability{9, 0}, Capability{10, 0}, Capability{12, 0}})
        if (!fp8_support_problem("some GPU", cc.major, cc.minor).empty()) bad += fmt(" %g.%g", cc.major, cc.minor);
    expect(bad.empty(), "FP8 accepts compute capability 8.9, 9.0, 10.0, 12.0", "refused" + bad);
}

int main() {
    check_suite("fp8");
    check_rounding();
    check_scales();
    check_shapes();
    check_gpu_refusal();
    return check_failures() ? 1 : 0;
}
