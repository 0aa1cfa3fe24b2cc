// Tests for the CPU AdamW (kernels/adamw_cpu.h). The scalar path against a reference written here from docs/formats.md's
// AdamW, with the kernel's fused multiply-adds and rounding (kernels/adamw.cuh), bit for bit; the AVX2 and AVX-512 paths
// (where the CPU has them) against the scalar path, bit for bit: odd lengths, tiles that start anywhere, global offsets
// that are multiples of 4, masks with every pattern of 4 decay bits, bf16/fp16/fp32 parameters with gradients in the
// compute type or fp32, with and without master weights, clipping active or not, subnormal moments; the non-finite
// skip; 1 and N OpenMP threads; a caller that flushes subnormals; the scalar fp16 conversions against F16C; the
// stochastic rounding's mean over seeds; and each path's throughput (printed, not checked). Needs no GPU; x86-64 (MXCSR,
// F16C). One PASS/FAIL/SKIP line per check (test/check.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>
#include <omp.h>

#include "../kernels/adamw_cpu.h"
#include "check.h"

using adamw_cpu::Bf16;
using adamw_cpu::Fp16;
using adamw_cpu::Isa;

namespace {

// The fields of kernels/adamw.cuh's AdamWHyper, which make_step reads.
struct Hyper {
    float lr, beta1, beta2, eps, weight_decay, grad_clip, loss_scale;
    int t;
    uint64_t seed;
};

const char* type_name(float*) { return "fp32"; }
const char* type_name(Bf16*) { return "bf16"; }
const char* type_name(Fp16*) { return "fp16"; }

uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}
float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

// ---- the reference: the test's own reading of the formula and of the kernel's rounding
// fp16 bits to their value, from the format's definition.
double fp16_value(uint16_t h) {
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
    if (exponent == 0) return sign * std::ldexp(mantissa, -24);
    return sign * std::ldexp(1024 + mantissa, exponent - 25);
}
// x rounded to the nearest fp16 value, ties to even (the value; inf past the largest).
double fp16_nearest(float x) {
    if (std::fabs(x) >= 65520.0f) return x > 0 ? INFINITY : -INFINITY;
    int e;
    std::frexp(x, &e);  // |x| in [2^(e-1), 2^e): 10 fraction bits below 2^(e-1), no finer than the subnormals' 2^-24
    const double ulp = std::ldexp(1.0, std::max(e, -13) - 11);
    return std::copysign(std::nearbyint(x / ulp) * ulp, x);
}
// The value a parameter of this type holds.
float stored_value(float x) { return x; }
float stored_value(Bf16 x) { return float_of((uint32_t)x.bits << 16); }
float stored_value(Fp16 x) { return (float)fp16_value(x.bits); }
template <typename T> T from_value(float x);
template <> float from_value<float>(float x) { return x; }
template <> Bf16 from_value<Bf16>(float x) { return Bf16{(uint16_t)(bits_of(x) >> 16)}; }  // truncated: any input will do
template <> Fp16 from_value<Fp16>(float x) {  // the nearest fp16, encoded from the format's definition (finite x)
    const double d = std::fabs(fp16_nearest(x));
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (d < std::ldexp(1.0, -14)) return Fp16{(uint16_t)(sign | (uint16_t)(d * std::ldexp(1.0, 24)))};
    int e;
    const double fraction = std::frexp(d, &e);  // d = fraction 2^e, fraction in [0.5, 1)
    return Fp16{(uint16_t)(sign | (e + 14) << 10 | (uint16_t)(fraction * 2048 - 1024))};
}

// Whether the stored parameter is the reference's rounding of the updated value x at global index `index`.
bool rounded_as_kernel(float got, float x, uint64_t, long) { return bits_of(got) == bits_of(x); }
bool rounded_as_kernel(Bf16 got, float x, uint64_t seed, long index) {
    // adamw.cuh: 16 random bits from one hash of (seed, index / 4), added below the 16 bits bf16 keeps, then truncated
    const uint64_t hash = splitmix64(seed ^ splitmix64((uint64_t)index / 4));
    const uint32_t random = (uint32_t)(hash >> (16 * (index % 4))) & 0xffff;
    if (std::isnan(x)) return got.bits == 0x7fff;
    return got.bits == (uint16_t)(((bits_of(x) + random) & 0xffff0000u) >> 16);
}
bool rounded_as_kernel(Fp16 got, float x, uint64_t, long) {
    if (std::isnan(x)) return got.bits == 0x7fff;
    const double value = fp16_value(got.bits), expected = fp16_nearest(x);
    return value == expected && std::signbit(value) == std::signbit(x);
}

// docs/formats.md's AdamW for one element (m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, mhat = m/(1-b1^t),
// vhat = v/(1-b2^t), p -= lr (mhat / (sqrt(vhat) + eps) + wd p)), after the gradient scale of clipping and the loss
// scale, in the kernel's arithmetic: the bias corrections multiply by reciprocals computed once, and what nvcc fuses
// is fused here (fmaf), the rest rounded at each step: m = fma(b1, m, (1-b1) g), v = fma((1-b2) g, g, b2 v),
// p = fma(-lr, fma(wd, p, step), p).
struct Element { float p, m, v; };
Element reference_element(float p, float g, float m, float v, bool decays, const Hyper& h, float norm_squared) {
    const float norm = sqrtf(norm_squared) / h.loss_scale;
    const float clip = h.grad_clip > 0.0f && norm > h.grad_clip ? h.grad_clip / norm : 1.0f;
    const float inv_correction1 = 1.0f / (1.0f - powf(h.beta1, (float)h.t));
    const float inv_correction2 = 1.0f / (1.0f - powf(h.beta2, (float)h.t));
    g = g * (clip / h.loss_scale);
    m = fmaf(m, h.beta1, g * (1.0f - h.beta1));
    v = fmaf(g * (1.0f - h.beta2), g, v * h.beta2);
    const float update = (m * inv_correction1) / (sqrtf(v * inv_correction2) + h.eps);
    p = fmaf(-h.lr, fmaf(p, decays ? h.weight_decay : 0.0f, update), p);
    return {p, m, v};
}

// ---- cases
// A mask with every pattern of 4 decay bits at global indices that are multiples of 4 (checked in main): a head, a gap,
// blocks of 29 (not a multiple of 4, so that the ranges fall differently into groups of 4 in successive blocks) with 8
// ranges of 1 to 3 elements, a tail.
LayoutMask mixed_mask() {
    LayoutMask mask;
    mask.head_end = 10;
    mask.blocks_begin = 13;
    mask.block_size = 29;
    mask.blocks_end = 13 + 29 * 2000;
    const long ranges[8][2] = {{0, 1}, {2, 3}, {5, 8}, {9, 10}, {12, 13}, {14, 17}, {21, 22}, {25, 27}};
    mask.num_ranges = 8;
    for (int r = 0; r < 8; r++) mask.range_begin[r] = ranges[r][0], mask.range_end[r] = ranges[r][1];
    return mask;
}
// GPT-2 124M's decay mask (model/config.h's decay_mask): wte (Vp 50304 rows) and wpe (1024) decay, then 12 blocks of
// 12 tensors, the four matrices decaying (qkvw, attprojw, fcw, fcprojw).
LayoutMask gpt2_124m_mask() {
    const long C = 768;
    const long sizes[12] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    const bool matrix[12] = {false, false, true, false, true, false, false, false, true, false, true, false};
    LayoutMask mask;
    mask.head_end = mask.blocks_begin = (50304 + 1024) * C;
    long offset = 0;
    for (int t = 0; t < 12; t++) {
        if (matrix[t]) {
            mask.range_begin[mask.num_ranges] = offset;
            mask.range_end[mask.num_ranges++] = offset + sizes[t];
        }
        offset += sizes[t];
    }
    mask.block_size = offset;
    mask.blocks_end = mask.blocks_begin + 12 * offset;
    return mask;
}
struct NamedMask { const char* name; LayoutMask mask; };
std::vector<NamedMask> masks() {
    LayoutMask none, all;
    all.head_end = 1L << 40;
    return {{"no decay", none}, {"all decay", all}, {"mixed decay", mixed_mask()}};
}

// One shard's state: the inputs and, after an update, the outputs.
template <typename Param, typename Grad>
struct State {
    std::vector<Param> params;
    std::vector<float> master, m, v;
    std::vector<Grad> grads;
    bool operator==(const State& o) const {
        return memcmp(params.data(), o.params.data(), params.size() * sizeof(Param)) == 0 &&
               memcmp(master.data(), o.master.data(), master.size() * 4) == 0 && memcmp(m.data(), o.m.data(), m.size() * 4) == 0 &&
               memcmp(v.data(), o.v.data(), v.size() * 4) == 0;
    }
};

// Random state of n elements: parameters near 0.1, gradients near 0.01 (a tenth of them 1e-22, whose squares are
// subnormal), moments as after some steps (a tenth of v subnormal), a few exact zeros of each sign.
template <typename Param, typename Grad>
State<Param, Grad> random_state(long n, bool with_master, std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> tenth(0, 9);
    State<Param, Grad> s;
    s.params.resize(n);
    s.grads.resize(n);
    s.m.resize(n);
    s.v.resize(n);
    if (with_master) s.master.resize(n);
    for (long i = 0; i < n; i++) {
        const float p = i % 97 == 0 ? (i % 2 ? -0.0f : 0.0f) : 0.1f * normal(rng);
        if (with_master) s.master[i] = p;
        s.params[i] = from_value<Param>(p);
        s.grads[i] = from_value<Grad>(tenth(rng) == 0 ? 1e-22f * normal(rng) : i % 89 == 0 ? 0.0f : 0.01f * normal(rng));
        s.m[i] = i % 83 == 0 ? 0.0f : 1e-3f * normal(rng);
        s.v[i] = tenth(rng) == 0 ? 1e-40f * std::fabs(normal(rng)) : 1e-5f * std::fabs(normal(rng));
    }
    return s;
}

struct Run {
    long index_offset;
    std::vector<long> cuts;  // tile boundaries, from 0 to n
};

// Runs one path over the tiles of `run` on a copy of `s`.
template <typename Param, typename Grad>
State<Param, Grad> updated(State<Param, Grad> s, const Run& run, const Hyper& h, float norm_squared, const LayoutMask& mask,
                           Isa isa, int threads = 0) {
    const adamw_cpu::Step step = adamw_cpu::make_step(h, norm_squared);
    for (size_t k = 0; k + 1 < run.cuts.size(); k++)
        adamw_cpu::update(s.params.data(), s.master.empty() ? nullptr : s.master.data(), s.grads.data(), s.m.data(), s.v.data(),
                          run.cuts[k], run.cuts[k + 1], run.index_offset, step, mask, threads, isa);
    return s;
}

// The first element where `got` differs from the reference's update of `in`, as a description ("" if none).
template <typename Param, typename Grad>
std::string reference_mismatch(const State<Param, Grad>& in, const State<Param, Grad>& got, long index_offset, const Hyper& h,
                               float norm_squared, const LayoutMask& mask) {
    long mismatches = 0, first = -1;
    for (long i = 0; i < (long)in.m.size(); i++) {
        const bool has_master = !in.master.empty();
        const Element e = reference_element(has_master ? in.master[i] : stored_value(in.params[i]), stored_value(in.grads[i]),
                                            in.m[i], in.v[i], mask.contains(index_offset + i), h, norm_squared);
        const bool same = bits_of(e.m) == bits_of(got.m[i]) && bits_of(e.v) == bits_of(got.v[i]) &&
                          (!has_master || bits_of(e.p) == bits_of(got.master[i])) &&
                          rounded_as_kernel(got.params[i], e.p, h.seed, index_offset + i);
        if (!same && mismatches++ == 0) first = i;
    }
    if (mismatches == 0) return "";
    return fmt("%.0f elements differ, the first at %.0f", (double)mismatches, (double)first);
}
template <typename Param, typename Grad>
std::string state_mismatch(const State<Param, Grad>& got, const State<Param, Grad>& expected) {
    for (long i = 0; i < (long)got.m.size(); i++) {
        const bool same = memcmp(&got.params[i], &expected.params[i], sizeof(Param)) == 0 && bits_of(got.m[i]) == bits_of(expected.m[i]) &&
                          bits_of(got.v[i]) == bits_of(expected.v[i]) &&
                          (got.master.empty() || bits_of(got.master[i]) == bits_of(expected.master[i]));
        if (!same) return fmt("element %.0f differs (m %a vs %a)", (double)i, got.m[i], expected.m[i]);
    }
    return "";
}

std::vector<Isa> vector_isas() { return {Isa::Avx2, Isa::Avx512}; }

// Every path over every case of one parameter/gradient type pair: lengths, offsets and tiles, masks, master or not,
// clipping or not. One check line for the scalar path against the reference and one for each vector path against the
// scalar path, naming the first case that differs.
template <typename Param, typename Grad>
void test_types(std::mt19937_64& rng) {
    const std::string types = std::string(type_name((Param*)nullptr)) + " parameters, " + type_name((Grad*)nullptr) + " gradients";
    const bool fp16 = std::is_same<Param, Fp16>::value;
    // n 20011: more than two work items of 8192; tiles cut anywhere (odd, not multiples of 4)
    const long n = 20011;
    const std::vector<Run> runs = {{0, {0, n}}, {4, {0, 3, 8190, 8195, 16389, n}}, {40004, {0, 5, 4097, n}}, {8, {0, 1, 2, 13}}};
    std::string scalar_problem, vector_problem[2];
    int cases = 0;
    for (const NamedMask& nm : masks())
        for (bool with_master : {true, false})
            for (bool clipping : {false, true})
                for (const Run& run : runs) {
                    // clipping: a global norm of 4 (16 squared) against a clip of 1; fp16 with its loss scale of 1024
                    const float loss_scale = fp16 ? 1024.0f : 1.0f;
                    const Hyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, clipping ? 1.0f : 0.0f, loss_scale, 7, rng()};
                    const float norm_squared = 16.0f * loss_scale * loss_scale;
                    const long length = run.cuts.back();
                    const State<Param, Grad> in = random_state<Param, Grad>(length, with_master, rng);
                    const std::string name = std::string(nm.name) + (with_master ? ", master" : ", no master") +
                                             (clipping ? ", clipped" : "") + ", offset " + std::to_string(run.index_offset) +
                                             ", n " + std::to_string(length) + " in " + std::to_string(run.cuts.size() - 1) + " tiles";
                    cases++;
                    const State<Param, Grad> scalar = updated(in, run, h, norm_squared, nm.mask, Isa::Scalar);
                    const std::string problem = reference_mismatch(in, scalar, run.index_offset, h, norm_squared, nm.mask);
                    if (!problem.empty() && scalar_problem.empty()) scalar_problem = name + ": " + problem;
                    for (int k = 0; k < 2; k++) {
                        if (!adamw_cpu::isa_supported(vector_isas()[k])) continue;
                        const std::string differs = state_mismatch(updated(in, run, h, norm_squared, nm.mask, vector_isas()[k]), scalar);
                        if (!differs.empty() && vector_problem[k].empty()) vector_problem[k] = name + ": " + differs;
                    }
                }
    const std::string what = fmt("%.0f cases", cases) + " (3 masks, master or not, clipping or not, 4 offsets and tilings)";
    check(scalar_problem.empty(), types + ": the scalar path equals the reference bit for bit", scalar_problem.empty() ? what : scalar_problem);
    for (int k = 0; k < 2; k++) {
        const std::string name = types + ": the " + adamw_cpu::isa_name(vector_isas()[k]) + " path equals the scalar path bit for bit";
        if (!adamw_cpu::isa_supported(vector_isas()[k])) skip(name, std::string("this CPU has no ") + adamw_cpu::isa_name(vector_isas()[k]));
        else check(vector_problem[k].empty(), name, vector_problem[k].empty() ? what : vector_problem[k]);
    }
}

// A norm that is not finite (fp16 overflow): every path leaves every array as it was.
void test_skip(std::mt19937_64& rng) {
    const long n = 1001;
    const State<Bf16, Bf16> in = random_state<Bf16, Bf16>(n, true, rng);
    const Hyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 3, 5};
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
        const std::string name = std::string("non-finite norm skips the step: nothing written (") + adamw_cpu::isa_name(isa) + ")";
        if (!adamw_cpu::isa_supported(isa)) {
            skip(name, std::string("this CPU has no ") + adamw_cpu::isa_name(isa));
            continue;
        }
        bool unchanged = true;
        for (float norm_squared : {INFINITY, NAN}) unchanged = unchanged && updated(in, {0, {0, n}}, h, norm_squared, mixed_mask(), isa) == in;
        check(unchanged, name, "inf and NaN squared norms");
    }
}

// Work items are spread over the threads: 1, 2 and 3 threads give the same bits.
void test_threads(std::mt19937_64& rng) {
    const long n = 100003;
    const State<Bf16, Bf16> in = random_state<Bf16, Bf16>(n, true, rng);
    const Hyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 3, 11};
    const Run run{12, {0, n}};
    const State<Bf16, Bf16> one = updated(in, run, h, 4.0f, mixed_mask(), adamw_cpu::best_isa(), 1);
    bool same = true;
    for (int threads : {2, 3}) same = same && updated(in, run, h, 4.0f, mixed_mask(), adamw_cpu::best_isa(), threads) == one;
    check(same, std::string("1, 2 and 3 OpenMP threads give the same bits (") + adamw_cpu::isa_name(adamw_cpu::best_isa()) + ")",
          fmt("n %.0f, bf16, %.0f threads available", (double)n, omp_get_max_threads()));
}

// A caller that flushes subnormals (MXCSR's flush-to-zero and denormals-are-zero, as -ffast-math code sets them) gets
// the same bits: update() keeps subnormals while it runs, as the kernel does. One thread: the caller's own, whose
// MXCSR this sets.
void test_caller_flushing_subnormals(std::mt19937_64& rng) {
    const long n = 10007;
    const State<Fp16, Fp16> in = random_state<Fp16, Fp16>(n, true, rng);
    const Hyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1024.0f, 3, 23};
    const Run run{0, {0, n}};
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
        const std::string name = std::string("a caller's flush-to-zero and denormals-are-zero change nothing (") + adamw_cpu::isa_name(isa) + ")";
        if (!adamw_cpu::isa_supported(isa)) {
            skip(name, std::string("this CPU has no ") + adamw_cpu::isa_name(isa));
            continue;
        }
        const State<Fp16, Fp16> kept = updated(in, run, h, 4.0f, mixed_mask(), isa, 1);
        const unsigned int saved = _mm_getcsr();
        _mm_setcsr(saved | _MM_FLUSH_ZERO_ON | _MM_DENORMALS_ZERO_ON);
        const State<Fp16, Fp16> flushing = updated(in, run, h, 4.0f, mixed_mask(), isa, 1);
        const bool restored = _mm_getcsr() == (saved | _MM_FLUSH_ZERO_ON | _MM_DENORMALS_ZERO_ON);
        _mm_setcsr(saved);
        long subnormal = 0;
        for (float v : kept.v) subnormal += std::fpclassify(v) == FP_SUBNORMAL;
        check(flushing == kept && restored && subnormal > 0, name,
              fmt("%.0f subnormal v of %.0f", (double)subnormal, (double)n) + (restored ? "" : "; the caller's MXCSR was not restored"));
    }
}

// The scalar path's fp16 conversions against F16C's: every fp16 value to float; to fp16, every sign, exponent and top
// 10 mantissa bits of a float with low 13 bits that probe the rounding (0, 1, just below, at and above half, all ones).
__attribute__((target("f16c"))) uint16_t f16c_fp16_bits(float x) {
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT), 0);
}
__attribute__((target("f16c"))) float f16c_float(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }
void test_fp16_conversions() {
    const std::string to_float = "scalar fp16 -> float equals F16C for all 65536 values";
    const std::string to_fp16 = "scalar float -> fp16 (round to nearest even) equals F16C; NaN becomes 0x7fff";
    if (!adamw_cpu::isa_supported(Isa::Avx2)) {  // AVX2's path needs F16C too
        skip(to_float, "this CPU has no AVX2 and F16C");
        skip(to_fp16, "this CPU has no AVX2 and F16C");
        return;
    }
    long differ = 0;
    for (uint32_t h = 0; h < 0x10000; h++) differ += bits_of(adamw_cpu::detail::to_float(Fp16{(uint16_t)h})) != bits_of(f16c_float((uint16_t)h));
    check(differ == 0, to_float, fmt("%.0f differ", (double)differ));
    differ = 0;
    long tried = 0;
    for (uint32_t high = 0; high < (1u << 19); high++)
        for (uint32_t low : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu}) {
            const float x = float_of(high << 13 | low);
            const uint16_t expected = std::isnan(x) ? 0x7fff : f16c_fp16_bits(x);
            differ += adamw_cpu::detail::fp16_bits(x) != expected;
            tried++;
        }
    check(differ == 0, to_fp16, fmt("%.0f of %.0f floats differ", (double)differ, (double)tried));
}

// bf16 stochastic rounding is unbiased: the same update under S seeds, every output one of the two bf16 neighbours of
// the fp32 master value x, and the mean over seeds of (output - x) in units of their spacing: each element's has a
// standard deviation sqrt(f (1 - f) / S) <= 0.5 / sqrt(S) (f: x's fraction of the spacing), so the mean over n elements
// is within 5 * 0.5 / sqrt(n S) of 0; and the mean of its absolute value stays near sqrt(2 / pi) * that (at most 0.025
// for S = 256), far below the 0.25 of rounding to nearest or the 0.5 of truncation.
void test_stochastic_rounding(std::mt19937_64& rng) {
    const long n = 4096;
    const int seeds = 256;
    const State<Bf16, Bf16> in = random_state<Bf16, Bf16>(n, true, rng);
    std::vector<double> error_sum(n, 0.0);
    bool neighbours = true;
    std::vector<float> master;
    for (int s = 0; s < seeds; s++) {
        const Hyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.0f, 1.0f, 3, splitmix64(1000 + s)};
        const State<Bf16, Bf16> out = updated(in, {0, {0, n}}, h, 1.0f, mixed_mask(), adamw_cpu::best_isa());
        for (long i = 0; i < n; i++) {
            const float x = out.master[i], below = float_of(bits_of(x) & 0xffff0000u);
            const float spacing = float_of((bits_of(x) & 0xffff0000u) + 0x10000u) - below;
            const float got = stored_value(out.params[i]);
            neighbours = neighbours && (got == below || got == below + spacing || (bits_of(x) & 0xffff) == 0);
            error_sum[i] += ((double)got - x) / spacing;
        }
    }
    double mean = 0.0, mean_abs = 0.0;
    for (long i = 0; i < n; i++) {
        mean += error_sum[i] / seeds / n;
        mean_abs += std::fabs(error_sum[i] / seeds) / n;
    }
    const double bound = 5 * 0.5 / std::sqrt((double)n * seeds);
    check(neighbours && std::fabs(mean) < bound && mean_abs < 0.05, "bf16 stochastic rounding is unbiased over 256 seeds",
          fmt("mean error %.2e of the bf16 spacing (bound %.1e), mean |error| %.4f (bound 0.05)", mean, bound, mean_abs) +
              (neighbours ? "" : "; an output is not a neighbour of the fp32 value"));
}

// Elements a second and GB/s (28 bytes an element: bf16 gradients and parameters, fp32 master, m and v, each moment
// and the master read and written) for each path with 1 thread and with all of them, on the first 2^24 elements of
// GPT-2 124M's blocks (2.4 blocks: every tensor's run of decay or none).
void print_throughput(std::mt19937_64& rng) {
    const long n = 1L << 24;
    State<Bf16, Bf16> s = random_state<Bf16, Bf16>(n, true, rng);
    const Hyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 3, 17};
    const adamw_cpu::Step step = adamw_cpu::make_step(h, 4.0f);
    const LayoutMask decay = gpt2_124m_mask();
    const int all = omp_get_max_threads();
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
        if (!adamw_cpu::isa_supported(isa)) continue;
        for (int threads : {1, all}) {
            if (threads == 1 && all == 1 && isa != Isa::Scalar) continue;
            std::vector<double> seconds;
            for (int rep = 0; rep < 3; rep++) {
                const auto start = std::chrono::steady_clock::now();
                adamw_cpu::update(s.params.data(), s.master.data(), s.grads.data(), s.m.data(), s.v.data(), 0, n, decay.blocks_begin,
                                  step, decay, threads, isa);
                seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
            }
            std::sort(seconds.begin(), seconds.end());
            const double t = seconds[1];
            check(true, std::string("throughput ") + adamw_cpu::isa_name(isa) + ", " + std::to_string(threads) + " thread(s)",
                  fmt("%.3g elements/s, %.3g GB/s (bf16 with master, 28 bytes an element, median of 3 over %.0f elements)", n / t,
                      28.0 * n / t / 1e9, (double)n));
        }
    }
}

}  // namespace

int main() {
    check_suite("adamw_cpu");
    std::mt19937_64 rng(20240527);
    printf("adamw_cpu: best path %s, %d OpenMP threads\n", adamw_cpu::isa_name(adamw_cpu::best_isa()), omp_get_max_threads());

    std::set<uint32_t> patterns;
    const LayoutMask mixed = mixed_mask();
    for (long i = 0; i < 60000; i += 4) patterns.insert(mixed.contains_bits<4>(i));
    check(patterns.size() == 16, "the mixed mask has every pattern of 4 decay bits", fmt("%.0f of 16", (double)patterns.size()));

    // LayoutMask::same_until (the vector paths' runs): contains() keeps its value up to it, for the masks of these tests
    long wrong = 0;
    for (const LayoutMask& mask : {mixed, gpt2_124m_mask()})
        for (long start : {0L, mask.blocks_begin - 5000, mask.blocks_end - 5000})
            for (long i = std::max(0L, start); i < start + 60000; i++) {
                const long until = mask.same_until(i);
                wrong += until <= i;
                for (long j = i + 1; j < std::min(until, i + 64); j++) wrong += mask.contains(j) != mask.contains(i);
            }
    check(wrong == 0, "LayoutMask::same_until: contains() keeps its value up to it", fmt("%.0f wrong", (double)wrong));

    test_types<float, float>(rng);
    test_types<Bf16, Bf16>(rng);
    test_types<Bf16, float>(rng);
    test_types<Fp16, Fp16>(rng);
    test_types<Fp16, float>(rng);
    test_skip(rng);
    test_threads(rng);
    test_caller_flushing_subnormals(rng);
    test_fp16_conversions();
    test_stochastic_rounding(rng);
    print_throughput(rng);
    return check_failures() ? 1 : 0;
}
