// The FP8 kernels (kernels/fp8.cuh) and products (matmul_fp8, kernels/matmul.cuh) on the GPU, against the host
// reference of kernels/fp8_formats.h (itself checked by test_fp8), with fresh random inputs each run (the seed is
// printed) and outputs poisoned before each launch (0xFF: a NaN code in both formats, NaN in bf16):
//   without a GPU: the host reference against cuda_fp8.h's own conversion (every bf16 value under several scales);
//     the refusal of FP8 product and cast shapes cuBLASLt or the cast cannot take, one line and exit status 1
//     (in a child process);
//   on a GPU of compute capability 8.9 or newer (skipped below): the amax exact, NaN and inf propagated; the scale
//     update as fp8_update_scaling, current scaling's (fp8_scale_from_current) and the amax history's
//     (fp8_update_scales_from_history) as their host rules; the cast, E4M3 and E5M2, bit for bit against fp8_round
//     (saturation, subnormals, infinities and NaN included), its fused amax and count of saturated values, the
//     transposed copy, on shapes that are not multiples of the
//     kernel's tiles; the FP8 products against an fp64 host product of the same dequantised operands and against
//     the unquantised product of the bf16 inputs within the FP8 error bound, on shapes that are not multiples of
//     cuBLASLt's tiles, with bias, accumulating, and as a Linear layer's three products from the transposed casts;
//     the kernels that cast what they produce (kernels/fp8_fused.cuh: the LayerNorm forward, alone and after the
//     residual add, and the GELU) against the bf16 kernel followed by the cast with the same scale: codes (row-major,
//     transposed, or both), amax and saturated count bit for bit, the LayerNorm's mean, rstd and residual too, on
//     shapes that are not multiples of their tiles, with values that saturate and subnormal codes, then with NaN
//     and inf inputs.
// The quick tier (TEST_TIER=quick) leaves out the largest cast (8M values, several grid-stride sweeps) and the
// largest product.
// Usage: test_fp8_gpu [seed]
#include <sys/wait.h>
#include <unistd.h>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/fp8.cuh"
#include "../kernels/fp8_fused.cuh"
#include "../kernels/matmul.cuh"
#include "gpu_check.h"

static std::mt19937_64 rng;

// ---------------------------------------------------------------------------------------------
// Without a GPU

// fp8_round against cuda_fp8.h's host conversion (__nv_cvt_float_to_fp8, satfinite): every bf16 value times each
// scale, rounded to fp32 as the cast does. NaN inputs: both give a NaN (the codes of NaN may differ).
static void check_reference_against_cuda_fp8() {
    const float scales[] = {1.0f, 0.37f, 11.7f, 448.0f / 3.0f, 6.1e4f, 1.3e-3f, 5.7344e7f};
    for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
        const __nv_fp8_interpretation_t kind = format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
        long compared = 0, mismatches = 0;
        std::string first;
        for (float scale : scales) {
            for (uint32_t bits = 0; bits < 65536; bits++) {
                const float x = __bfloat162float(__ushort_as_bfloat16((unsigned short)bits)) * scale;
                const uint8_t ours = fp8_round(x, format), theirs = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind);
                const bool same = std::isnan(x) ? std::isnan(fp8_to_float(ours, format)) && std::isnan(fp8_to_float(theirs, format)) : ours == theirs;
                compared++;
                if (!same && mismatches++ == 0) first = fmt("x %.9g: ours 0x%02X, cuda_fp8.h 0x%02X", x, ours, theirs);
            }
        }
        expect(mismatches == 0, std::string("host reference ") + fp8_name(format) + " equals cuda_fp8.h's conversion on " + std::to_string(compared) + " values",
               std::to_string(mismatches) + " mismatches, the first " + first);
    }
}

// Runs body in a child process; returns its exit status (-1: killed) and what it wrote to stderr.
static std::pair<int, std::string> run_in_child(const std::function<void()>& body) {
    int fds[2];
    if (pipe(fds) != 0) return {-1, "pipe failed"};
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        body();
        _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof buf)) > 0) err.append(buf, (size_t)got);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, err};
}

// The shape checks come before any CUDA call: they run (and are checked) without a GPU.
static void check_refusals() {
    struct Refusal {
        const char* name;
        std::function<void()> call;
        const char* starts;
    };
    using e4m3 = __nv_fp8_e4m3;
    using e5m2 = __nv_fp8_e5m2;
    const Refusal refusals[] = {
        {"FP8 product with m=40 refused", [] { matmul_fp8<e4m3, e4m3>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 40, 64, 64, false, 0); },
         "error: FP8 product of m=40 n=64 k=64: cuBLASLt's FP8 kernels need"},
        {"FP8 product with k=100 refused", [] { matmul_fp8<e4m3, e5m2>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 64, 64, 100, false, 0); },
         "error: FP8 product of m=64 n=64 k=100: cuBLASLt's FP8 kernels need"},
        {"FP8 cast of rows of 40 refused", [] { fp8_cast<e4m3>(nullptr, nullptr, nullptr, 16, 40, nullptr, 0); },
         "error: FP8 cast of 16 x 40: the row length must be"},
        // any non-null transposed output asks for the transpose: the shape is refused before it is used
        {"FP8 transposing cast of 37 rows refused", [] { fp8_cast<e5m2>(nullptr, reinterpret_cast<e5m2*>(16), nullptr, 37, 48, nullptr, 0); },
         "error: FP8 cast of 37 x 48 with its transpose: the row length and the row count must be"},
        {"LayerNorm with its transposed FP8 cast of 37 rows refused",
         [] { layernorm_forward_fp8(nullptr, reinterpret_cast<e4m3*>(16), nullptr, nullptr, nullptr, nullptr, nullptr, 37, 48, nullptr, 0); },
         "error: LayerNorm with its FP8 cast of 37 x 48 with its transpose: the row length and the row count must be"},
        {"LayerNorm with its FP8 cast of rows of 40 refused",
         [] { layernorm_forward_fp8(reinterpret_cast<e4m3*>(16), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 16, 40, nullptr, 0); },
         "error: LayerNorm with its FP8 cast of 16 x 40: the row length must be"},
    };
    for (const Refusal& r : refusals) {
        const std::pair<int, std::string> result = run_in_child(r.call);
        const std::string& err = result.second;
        const bool one_line = !err.empty() && err.find('\n') == err.size() - 1;
        expect(result.first == 1 && one_line && err.rfind(r.starts, 0) == 0, r.name,
               fmt("exit status %g, stderr: ", result.first) + err);
    }
}

// ---------------------------------------------------------------------------------------------
// GPU helpers

// A device buffer of FP8 codes, poisoned with 0xFF (a NaN code in both formats).
struct DeviceCodes {
    uint8_t* ptr = nullptr;
    size_t n;
    explicit DeviceCodes(size_t count) : n(count) {
        cudaCheck(cudaMalloc(&ptr, std::max<size_t>(n, 16)));
        cudaCheck(cudaMemset(ptr, 0xFF, n));
    }
    DeviceCodes(const DeviceCodes&) = delete;
    ~DeviceCodes() { cudaFree(ptr); }
    template <typename fp8> fp8* as() const { return reinterpret_cast<fp8*>(ptr); }
    std::vector<uint8_t> download() const {
        cudaCheck(cudaDeviceSynchronize());
        std::vector<uint8_t> codes(n);
        cudaCheck(cudaMemcpy(codes.data(), ptr, n, cudaMemcpyDeviceToHost));
        return codes;
    }
};

// One tensor's scaling state in device memory.
struct DeviceScaling {
    Fp8Scaling* ptr = nullptr;
    explicit DeviceScaling(const Fp8Scaling& initial = Fp8Scaling()) {
        cudaCheck(cudaMalloc(&ptr, sizeof(Fp8Scaling)));
        upload(initial);
    }
    DeviceScaling(const DeviceScaling&) = delete;
    ~DeviceScaling() { cudaFree(ptr); }
    void upload(const Fp8Scaling& s) { cudaCheck(cudaMemcpy(ptr, &s, sizeof s, cudaMemcpyHostToDevice)); }
    Fp8Scaling download() const {
        cudaCheck(cudaDeviceSynchronize());
        Fp8Scaling s;
        cudaCheck(cudaMemcpy(&s, ptr, sizeof s, cudaMemcpyDeviceToHost));
        return s;
    }
};

static float bf16_round(float x) { return host_round<__nv_bfloat16>(x); }

// n bf16 values, normal(0, 1) times 2^e with e uniform in [low, high]: magnitudes over many binades, so that a cast
// meets saturation, normals, subnormals and zeros alike.
static std::vector<float> spread_values(size_t n, int low, int high) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(low, high);
    std::vector<float> v(n);
    for (float& x : v) x = bf16_round(std::ldexp(normal(rng), exponent(rng)));
    return v;
}
static std::vector<float> normal_values(size_t n, float sigma) {
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = bf16_round(normal(rng));
    return v;
}
static float host_amax(const std::vector<float>& v) {
    float m = 0.0f;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}
static std::string bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    char s[64];
    snprintf(s, sizeof s, "%.9g (bits 0x%08X)", x, b);
    return s;
}
static bool same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

// ---------------------------------------------------------------------------------------------
// amax and the scale update

static void test_amax(cudaStream_t stream) {
    for (long n : {5L, 4096L, 1000003L}) {
        std::vector<float> x = normal_values((size_t)n, 1.0f);
        x[(size_t)n - 1] = -37.5f;  // the largest magnitude, negative, in the tail past the last 16-byte vector
        DeviceBuffer<__nv_bfloat16> x_d(x);
        DeviceScaling s;
        fp8_amax(&s.ptr->amax, x_d.ptr, n, stream);
        const float got = s.download().amax, expected = host_amax(x);
        check(same_bits(got, expected), "amax exact over " + std::to_string(n) + " values", "got " + bits_of(got) + ", expected " + bits_of(expected));
    }
    // non-finite values: inf beats every finite value, NaN beats inf; the sign does not matter
    const long n = 100003;
    std::vector<float> x = normal_values((size_t)n, 1.0f);
    DeviceBuffer<__nv_bfloat16> x_d(x);
    auto amax_with = [&](const std::vector<std::pair<long, float>>& specials) {
        std::vector<float> y = x;
        for (const auto& s : specials) y[(size_t)s.first] = s.second;
        x_d.upload(y);
        DeviceScaling s;
        fp8_amax(&s.ptr->amax, x_d.ptr, n, stream);
        return s.download().amax;
    };
    const float with_inf = amax_with({{77, -INFINITY}}), with_nan = amax_with({{5, INFINITY}, {n - 1, NAN}, {9000, -NAN}});
    check(std::isinf(with_inf) && with_inf > 0, "amax of a tensor holding -inf is inf", "got " + bits_of(with_inf));
    check(std::isnan(with_nan), "amax of a tensor holding NaN and inf is NaN", "got " + bits_of(with_nan));
    // accumulation across calls: the max of both
    DeviceScaling s;
    std::vector<float> small = normal_values(4096, 0.01f), large = normal_values(4096, 1.0f);
    DeviceBuffer<__nv_bfloat16> small_d(small), large_d(large);
    fp8_amax(&s.ptr->amax, large_d.ptr, 4096, stream);
    fp8_amax(&s.ptr->amax, small_d.ptr, 4096, stream);
    check(same_bits(s.download().amax, host_amax(large)), "amax accumulates across calls (the max of both)", "got " + bits_of(s.download().amax));
}

// Two scaling states field by field, bit for bit (the struct's padding is not compared).
static bool same_state(const Fp8Scaling& a, const Fp8Scaling& b) {
    return same_bits(a.inverse_scale, b.inverse_scale) && same_bits(a.scale, b.scale) && same_bits(a.amax, b.amax) &&
           same_bits(a.current_amax, b.current_amax) && a.overflow == b.overflow && a.non_finite_amax == b.non_finite_amax;
}

static void test_update_scales(cudaStream_t stream) {
    const float amaxes[] = {4.0f, 0.0f, NAN, INFINITY, 1e-3f, 3.0e5f, std::ldexp(1.0f, -130), 448.0f};
    for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
        for (int margin : {0, 1}) {
            std::vector<Fp8Scaling> states;
            for (float amax : amaxes) {
                Fp8Scaling s;
                s.scale = 3.0f;
                s.inverse_scale = 1.0f / 3.0f;
                s.amax = amax;
                s.non_finite_amax = 5;
                states.push_back(s);
            }
            Fp8Scaling* d;
            cudaCheck(cudaMalloc(&d, states.size() * sizeof(Fp8Scaling)));
            cudaCheck(cudaMemcpy(d, states.data(), states.size() * sizeof(Fp8Scaling), cudaMemcpyHostToDevice));
            fp8_update_scales(d, (int)states.size(), format, margin, stream);
            std::vector<Fp8Scaling> got(states.size());
            cudaCheck(cudaMemcpy(got.data(), d, got.size() * sizeof(Fp8Scaling), cudaMemcpyDeviceToHost));
            cudaCheck(cudaFree(d));
            std::string bad;
            for (size_t i = 0; i < states.size(); i++) {
                fp8_update_scaling(states[i], format, margin);
                if (!same_state(states[i], got[i]))
                    bad += fmt(" amax %g: scale %g count %g", amaxes[i], got[i].scale, got[i].non_finite_amax) + fmt(" (host %g count %g)", states[i].scale, states[i].non_finite_amax);
            }
            expect(bad.empty(), std::string("scale update ") + fp8_name(format) + " margin " + std::to_string(margin) + " equals fp8_update_scaling bit for bit", bad);
        }
    }
}

// Current scaling's scale from current_amax (fp8_amax's, before the cast), and delayed scaling's from an amax history:
// both against their host rules (fp8_set_scale, fp8_update_scaling_from_history) bit for bit, the casts' record
// (amax) untouched by the first, and the history slot written by the second.
// Scaling states in device memory (states_to_device: the caller frees) and back.
static Fp8Scaling* states_to_device(const std::vector<Fp8Scaling>& states) {
    Fp8Scaling* d;
    cudaCheck(cudaMalloc(&d, states.size() * sizeof(Fp8Scaling)));
    cudaCheck(cudaMemcpy(d, states.data(), states.size() * sizeof(Fp8Scaling), cudaMemcpyHostToDevice));
    return d;
}
static std::vector<Fp8Scaling> states_from_device(const Fp8Scaling* d, size_t n) {
    std::vector<Fp8Scaling> states(n);
    cudaCheck(cudaMemcpy(states.data(), d, n * sizeof(Fp8Scaling), cudaMemcpyDeviceToHost));
    return states;
}

static void test_current_and_history_scales(cudaStream_t stream) {
    const float amaxes[] = {4.0f, 0.0f, NAN, INFINITY, 1e-3f, 3.0e5f, std::ldexp(1.0f, -130), 448.0f};
    const int count = (int)(sizeof amaxes / sizeof amaxes[0]);
    std::vector<Fp8Scaling> states;
    for (float amax : amaxes) {
        Fp8Scaling s;
        s.scale = 3.0f;
        s.inverse_scale = 1.0f / 3.0f;
        s.amax = 2.0f;  // the casts' record: left alone
        s.current_amax = amax;
        s.non_finite_amax = 5;
        states.push_back(s);
    }
    Fp8Scaling* d = states_to_device(states);
    fp8_scale_from_current(d, count, Fp8Format::E5M2, stream);
    std::vector<Fp8Scaling> got = states_from_device(d, count);
    cudaCheck(cudaFree(d));
    std::string bad;
    for (int i = 0; i < count; i++) {
        Fp8Scaling expected = states[i];
        fp8_set_scale(expected, amaxes[i], Fp8Format::E5M2, 0);
        expected.current_amax = 0.0f;
        if (!same_state(expected, got[i])) bad += fmt(" current amax %g: scale %g amax %g", amaxes[i], got[i].scale, got[i].amax);
    }
    expect(bad.empty(), "current scaling: the scale from current_amax (cleared), the casts' amax kept, bit for bit", bad);

    // delayed: tensors in groups of 3, the third E5M2; history of 4 with earlier amaxes, this interval's into slot 2
    const int length = 4, slot = 2;
    std::vector<float> history((size_t)count * length);
    for (int i = 0; i < count; i++)
        for (int k = 0; k < length; k++) history[(size_t)i * length + k] = k == slot ? 0.0f : (float)(i + 1) * (k + 1) * 0.25f;
    for (int i = 0; i < count; i++) states[i].amax = amaxes[i];
    Fp8Scaling* dh = states_to_device(states);
    DeviceBuffer<float> history_d(history);
    fp8_update_scales_from_history(dh, history_d.ptr, count, length, slot, 3, 2, 0, stream);
    got = states_from_device(dh, count);
    cudaCheck(cudaFree(dh));
    const std::vector<float> history_got = history_d.download();
    bad.clear();
    for (int i = 0; i < count; i++) {
        Fp8Scaling expected = states[i];
        fp8_update_scaling_from_history(expected, history.data() + (size_t)i * length, length, slot,
                                        i % 3 == 2 ? Fp8Format::E5M2 : Fp8Format::E4M3, 0);
        if (!same_state(expected, got[i]) || memcmp(history.data() + (size_t)i * length, history_got.data() + (size_t)i * length, length * sizeof(float)) != 0)
            bad += fmt(" amax %g: scale %g", amaxes[i], got[i].scale) + fmt(" (host %g)", expected.scale);
    }
    // the host rule itself: the scale from the history's max, a NaN stored as 0 and counted
    Fp8Scaling h;
    float past[3] = {2.0f, 7.0f, 0.0f};
    h.amax = NAN;
    fp8_update_scaling_from_history(h, past, 3, 1, Fp8Format::E4M3, 0);
    const bool rule = past[1] == 0.0f && h.non_finite_amax == 1 && h.scale == 448.0f / 2.0f && h.amax == 0.0f;
    expect(bad.empty() && rule, "delayed scaling: the scales from the amax histories (groups of 3, the third E5M2) equal the host rule bit for bit",
           bad + (rule ? "" : fmt(" host rule: scale %g", h.scale)));
}

// ---------------------------------------------------------------------------------------------
// The cast

template <typename fp8>
static void test_cast(long rows, long cols, bool transposed, bool row_major_too, cudaStream_t stream) {
    constexpr Fp8Format format = Fp8Traits<fp8>::format;
    const std::string name = std::string(fp8_name(format)) + " cast " + std::to_string(rows) + " x " + std::to_string(cols) +
                             (transposed ? (row_major_too ? " with transpose" : " transpose only") : "");
    const size_t n = (size_t)rows * cols;
    // E4M3 meets its saturation and subnormals over 2^-16 .. 2^4; E5M2 over 2^-30 .. 2^4
    std::vector<float> x = format == Fp8Format::E4M3 ? spread_values(n, -16, 4) : spread_values(n, -30, 4);
    const float finite_amax = host_amax(x);
    // a scale that saturates the values above 60% of the amax, not a power of two (x * scale is rounded to fp32)
    Fp8Scaling state;
    state.scale = fp8_max(format) / (0.6f * finite_amax);
    state.inverse_scale = 1.0f / state.scale;
    for (int pass = 0; pass < 2; pass++) {
        // pass 1: special values among the finite ones, and the amax becomes NaN
        if (pass == 1) {
            const float specials[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 3.0e38f, -3.0e38f, 1e-40f, -1e-40f};
            for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[(i * 7919) % n] = bf16_round(specials[i]);
        }
        DeviceBuffer<__nv_bfloat16> x_d(x);
        DeviceCodes out(n), out_t(n);
        DeviceScaling s(state);
        fp8_cast<fp8>(row_major_too ? out.as<fp8>() : nullptr, transposed ? out_t.as<fp8>() : nullptr, x_d.ptr, rows, cols, s.ptr, stream);
        const std::vector<uint8_t> codes = out.download(), codes_t = out_t.download();
        long wrong = 0, wrong_t = 0;
        std::string first;
        for (long r = 0; r < rows; r++) {
            for (long c = 0; c < cols; c++) {
                const float v = x[(size_t)r * cols + c] * state.scale;
                const uint8_t expected = fp8_round(v, format);
                auto matches = [&](uint8_t got) { return std::isnan(v) ? std::isnan(fp8_to_float(got, format)) : got == expected; };
                if (row_major_too && !matches(codes[(size_t)r * cols + c]) && wrong++ == 0)
                    first = fmt("[%g, %g] x*scale %.9g", r, c, v) + fmt(": got 0x%02X, expected 0x%02X", codes[(size_t)r * cols + c], expected);
                if (transposed && !matches(codes_t[(size_t)c * rows + r]) && wrong_t++ == 0 && first.empty())
                    first = fmt("transposed [%g, %g] x*scale %.9g", c, r, v) + fmt(": got 0x%02X, expected 0x%02X", codes_t[(size_t)c * rows + r], expected);
            }
        }
        const std::string tag = pass == 0 ? "" : " with inf, NaN, zeros, huge and subnormal inputs";
        if (row_major_too) expect(wrong == 0, name + tag + ": codes equal fp8_round bit for bit", std::to_string(wrong) + " wrong, the first " + first);
        if (transposed) expect(wrong_t == 0, name + tag + ": transposed codes equal fp8_round bit for bit", std::to_string(wrong_t) + " wrong, the first " + first);
        const Fp8Scaling after = s.download();
        unsigned long long saturated = 0;
        for (float v : x) saturated += fp8_saturates(std::fabs(v * state.scale), format);
        check(after.overflow == saturated, name + tag + ": saturated values counted (fp8_saturates)",
              fmt("counted %g", (double)after.overflow) + fmt(", expected %g", (double)saturated));
        if (pass == 0)
            check(same_bits(after.amax, finite_amax) && after.scale == state.scale, name + ": fused amax exact, scale untouched",
                  "amax " + bits_of(after.amax) + ", expected " + bits_of(finite_amax));
        else
            check(std::isnan(after.amax), name + tag + ": fused amax is NaN", "amax " + bits_of(after.amax));
    }
}

// ---------------------------------------------------------------------------------------------
// The producers' casts (kernels/fp8_fused.cuh) against the bf16 kernel followed by fp8_cast, with the same scale

// An E4M3 cast's outputs: the row-major and the transposed codes (0xFF-poisoned) and the scaling state.
struct CastOutputs {
    DeviceCodes rows, transposed;
    DeviceScaling state;
    CastOutputs(size_t n, const Fp8Scaling& initial) : rows(n), transposed(n), state(initial) {}
    __nv_fp8_e4m3* rows_if(bool wanted) const { return wanted ? rows.as<__nv_fp8_e4m3>() : nullptr; }
    __nv_fp8_e4m3* transposed_if(bool wanted) const { return wanted ? transposed.as<__nv_fp8_e4m3>() : nullptr; }
};

// The fused kernel's codes and state against the pair's, bit for bit (the NaN codes too: both come from the same
// conversion); `saturating`: the pair saturated values (the scale was chosen so), which the count must show.
static void compare_casts(const std::string& name, const CastOutputs& fused, const CastOutputs& pair, bool rows, bool transposed,
                          bool saturating) {
    for (int t = 0; t < 2; t++) {
        if (!(t == 0 ? rows : transposed)) continue;
        const std::vector<uint8_t> got = (t == 0 ? fused.rows : fused.transposed).download(), expected = (t == 0 ? pair.rows : pair.transposed).download();
        long wrong = 0, first = -1;
        for (size_t i = 0; i < got.size(); i++)
            if (got[i] != expected[i] && wrong++ == 0) first = (long)i;
        expect(wrong == 0, name + (t == 0 ? ": row-major codes" : ": transposed codes") + " equal the pair's bit for bit",
               fmt("%g differ, the first at %g", wrong, first) + (first >= 0 ? fmt(": code %g against %g", got[first], expected[first]) : ""));
    }
    const Fp8Scaling a = fused.state.download(), b = pair.state.download();
    check(same_state(a, b) && (!saturating || b.overflow > 0), name + ": amax and saturated count equal the pair's",
          "amax " + bits_of(a.amax) + " against " + bits_of(b.amax) + fmt(", saturated %g against %g", (double)a.overflow, (double)b.overflow));
}

// Bitwise equality of two float vectors (bf16 values read back as float included; NaN by its bits).
static bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The finite amax of bf16 values and a scale under which the values above 60% of it saturate (not a power of two).
static Fp8Scaling saturating_state(const std::vector<float>& values) {
    float amax = 0.0f;
    for (float v : values)
        if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
    Fp8Scaling s;
    s.scale = 448.0f / (0.6f * amax);
    s.inverse_scale = 1.0f / s.scale;
    return s;
}

// layernorm_forward_fp8 (residual_layernorm_forward_fp8 with `residual`) of N x C against layernorm_forward
// (residual_layernorm_forward) then fp8_cast, writing the row-major codes, the transposed ones, or both. The weight
// and bias spread over binades, so that outputs meet subnormal codes as well as saturation. Pass 1: a NaN and an
// inf among the inputs (their rows' outputs are NaN, and so is the amax).
static void test_layernorm_fp8(int N, int C, bool residual, bool rows, bool transposed, cudaStream_t stream) {
    const std::string name = std::string(residual ? "residual add + LayerNorm" : "LayerNorm") + fmt(" with E4M3 cast %g x %g", N, C) +
                             (rows && transposed ? " and transpose" : transposed ? " transposed only" : "");
    const size_t n = (size_t)N * C;
    std::vector<float> a = normal_values(n, 1.0f), b = normal_values(n, 0.5f);
    const std::vector<float> weight = spread_values(C, -12, 1), bias = spread_values(C, -14, -1);
    for (size_t i = 0; i < n; i += C) a[i] = bf16_round(a[i] + 3.0f);  // rows whose mean is not near 0
    Fp8Scaling state;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            a[(size_t)3 % N * C + 5] = NAN;
            a[(size_t)5 % N * C + C - 1] = -INFINITY;
        }
        DeviceBuffer<__nv_bfloat16> a_d(a), b_d(b), w_d(weight), bias_d(bias), out(n), residual_pair(n), residual_fused(n);
        DeviceBuffer<float> mean_pair(N), rstd_pair(N), mean_fused(N), rstd_fused(N);
        if (residual)
            residual_layernorm_forward(residual_pair.ptr, out.ptr, mean_pair.ptr, rstd_pair.ptr, a_d.ptr, b_d.ptr, w_d.ptr, bias_d.ptr, N, C, stream);
        else layernorm_forward(out.ptr, mean_pair.ptr, rstd_pair.ptr, a_d.ptr, w_d.ptr, bias_d.ptr, N, C, stream);
        if (pass == 0) state = saturating_state(out.download());
        CastOutputs pair(n, state), fused(n, state);
        fp8_cast(pair.rows_if(rows), pair.transposed_if(transposed), out.ptr, N, C, pair.state.ptr, stream);
        if (residual)
            residual_layernorm_forward_fp8(residual_fused.ptr, fused.rows_if(rows), fused.transposed_if(transposed), mean_fused.ptr, rstd_fused.ptr,
                                           a_d.ptr, b_d.ptr, w_d.ptr, bias_d.ptr, N, C, fused.state.ptr, stream);
        else layernorm_forward_fp8(fused.rows_if(rows), fused.transposed_if(transposed), mean_fused.ptr, rstd_fused.ptr, a_d.ptr, w_d.ptr, bias_d.ptr, N, C,
                                   fused.state.ptr, stream);
        const std::string tag = name + (pass == 0 ? "" : " with NaN and inf inputs");
        compare_casts(tag, fused, pair, rows, transposed, pass == 0);
        const bool statistics = same_floats(mean_fused.download(), mean_pair.download()) && same_floats(rstd_fused.download(), rstd_pair.download());
        const bool residual_same = !residual || same_floats(residual_fused.download(), residual_pair.download());
        expect(statistics && residual_same, tag + ": mean, rstd" + (residual ? " and the residual" : "") + " equal the bf16 kernel's bit for bit",
               std::string(statistics ? "" : "the statistics differ ") + (residual_same ? "" : "the residual differs"));
    }
}

// fp8_gelu_cast of rows x cols against gelu_forward then fp8_cast. Inputs over many binades (GELU's negative tail
// and its subnormal codes, its identity-like positive side saturating); pass 1 with inf, -inf (GELU: NaN) and NaN.
static void test_gelu_fp8(long rows, long cols, bool row_major, bool transposed, cudaStream_t stream) {
    const std::string name = fmt("GELU with E4M3 cast %g x %g", rows, cols) + (row_major && transposed ? " and transpose" : transposed ? " transposed only" : "");
    const size_t n = (size_t)rows * cols;
    std::vector<float> x = spread_values(n, -16, 3);
    Fp8Scaling state;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            const float specials[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 3.0e38f, -3.0e38f, 1e-40f};
            for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[(i * 7919) % n] = bf16_round(specials[i]);
        }
        DeviceBuffer<__nv_bfloat16> x_d(x), out(n);
        gelu_forward(out.ptr, x_d.ptr, (long)n, stream);
        if (pass == 0) state = saturating_state(out.download());
        CastOutputs pair(n, state), fused(n, state);
        fp8_cast(pair.rows_if(row_major), pair.transposed_if(transposed), out.ptr, rows, cols, pair.state.ptr, stream);
        fp8_gelu_cast(fused.rows_if(row_major), fused.transposed_if(transposed), x_d.ptr, rows, cols, fused.state.ptr, stream);
        compare_casts(name + (pass == 0 ? "" : " with inf, NaN, zeros, huge and subnormal inputs"), fused, pair, row_major, transposed, pass == 0);
    }
}

// ---------------------------------------------------------------------------------------------
// The products

// An FP8 operand on the GPU: a bf16 tensor cast with current scaling (its amax, a scale update, the cast), with the
// transposed copy where asked.
template <typename fp8>
struct Operand {
    DeviceScaling scaling;
    DeviceCodes codes, codes_t;
    Operand(const std::vector<float>& src, long rows, long cols, bool transposed, cudaStream_t stream)
        : codes((size_t)rows * cols), codes_t(transposed ? (size_t)rows * cols : 0) {
        DeviceBuffer<__nv_bfloat16> src_d(src);
        fp8_amax(&scaling.ptr->amax, src_d.ptr, rows * cols, stream);
        fp8_update_scales(scaling.ptr, 1, Fp8Traits<fp8>::format, 0, stream);
        fp8_cast<fp8>(codes.as<fp8>(), transposed ? codes_t.as<fp8>() : nullptr, src_d.ptr, rows, cols, scaling.ptr, stream);
        cudaCheck(cudaStreamSynchronize(stream));
    }
};

static std::vector<float> transpose(const std::vector<float>& v, long rows, long cols) {
    std::vector<float> t(v.size());
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < cols; c++) t[(size_t)c * rows + r] = v[(size_t)r * cols + c];
    return t;
}

// The unit roundoff of a format (half its relative spacing) and half its smallest subnormal.
static double unit_roundoff(Fp8Format f) { return std::ldexp(1.0, -(fp8_mantissa_bits(f) + 1)); }
static double half_smallest_subnormal(Fp8Format f) { return std::ldexp(1.0, -fp8_exponent_bias(f) - fp8_mantissa_bits(f)); }

// Checks out[n, m] (bf16, from the GPU) = a[m, k] b[n, k]^T (+ bias[m]) (+ before[n, m]), where a and b are the FP8
// codes the product read (qa, qb, with their scaling states) and a_src, b_src the bf16 tensors they were cast from.
//   1. The operands are the casts of the sources: qa == fp8_round(a_src * scale), likewise b.
//   2. Against the fp64 product of the same dequantised operands, element by element:
//        |out - ref| <= 2^-8 |ref| + 2^-12 sum_k |a_ik b_jk| (dequantised).
//      Both sides multiply the same numbers (the product of two FP8 values is exact in fp32), so what differs is
//      the additions and the one rounding of the output. The bf16 rounding of out costs up to half an ulp, 2^-9
//      relative; 2^-8 lets a sum that lands beside a rounding boundary round the other way. The accumulation: fp32
//      sums of k terms are off by at most about k 2^-24 of sum |terms| (2^-14 here, k <= 1024), and Hopper's tensor
//      cores add a block of k's products with fewer bits (about 14) before cuBLASLt adds the block into fp32,
//      2^-13 of the block's sum |terms| at most; 2^-12 of the whole sum |terms| covers both.
//   3. Against the unquantised product of the bf16 sources (fp64): the bound of 2. plus the quantisation's own,
//      sum_k (|da| |b| + |a| |db| + |da| |db|), where |da| <= u_a |a| + h_a: u is the format's unit roundoff
//      (2^-4 for E4M3, 2^-3 for E5M2; times 1 + 2^-10 for the fp32 roundings of x * scale and of 1 / scale) and h
//      half its smallest subnormal over the scale (the subnormals' absolute error). No value saturates: the scale
//      comes from the operand's own amax (current scaling, margin 0).
//   4. The relative L2 error against the unquantised product is below u_a + u_b (typically a third of that): a
//      statistical check that the bound of 3. is not met by a product that is off by a constant factor.
static double bf16_value(float x) { return __bfloat162float(__float2bfloat16(x)); }

static void check_product(const std::string& name, int m, int n, int k, Fp8Format fa, Fp8Format fb, const std::vector<uint8_t>& qa,
                          const std::vector<uint8_t>& qb, const Fp8Scaling& sa, const Fp8Scaling& sb, const std::vector<float>& a_src,
                          const std::vector<float>& b_src, const std::vector<float>& bias, const std::vector<float>& before,
                          const std::vector<float>& out) {
    long wrong_codes = 0;
    for (size_t i = 0; i < qa.size(); i++) wrong_codes += qa[i] != fp8_round(a_src[i] * sa.scale, fa);
    for (size_t i = 0; i < qb.size(); i++) wrong_codes += qb[i] != fp8_round(b_src[i] * sb.scale, fb);
    expect(wrong_codes == 0, name + ": operands are the casts of the bf16 inputs", std::to_string(wrong_codes) + " codes differ");

    const double ua = unit_roundoff(fa) * (1 + std::ldexp(1.0, -10)), ub = unit_roundoff(fb) * (1 + std::ldexp(1.0, -10));
    const double ha = half_smallest_subnormal(fa) / sa.scale, hb = half_smallest_subnormal(fb) / sb.scale;
    const double dequant = (double)sa.inverse_scale * sb.inverse_scale;
    std::vector<double> a_value(qa.size()), b_value(qb.size());
    for (size_t i = 0; i < qa.size(); i++) a_value[i] = fp8_to_float(qa[i], fa);
    for (size_t i = 0; i < qb.size(); i++) b_value[i] = fp8_to_float(qb[i], fb);
    long outside_q = 0, outside_x = 0;
    double worst_q = 0, worst_x = 0, err2 = 0, ref2 = 0;
    std::string first_q, first_x;
#pragma omp parallel for reduction(+ : outside_q, outside_x, err2, ref2) reduction(max : worst_q, worst_x) schedule(dynamic)
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            double sum_q = 0, abs_q = 0, sum_x = 0, quantisation = 0;
            for (int p = 0; p < k; p++) {
                const double tq = a_value[(size_t)i * k + p] * b_value[(size_t)j * k + p];
                sum_q += tq;
                abs_q += std::fabs(tq);
                const double a = a_src[(size_t)i * k + p], b = b_src[(size_t)j * k + p];
                sum_x += a * b;
                const double da = ua * std::fabs(a) + ha, db = ub * std::fabs(b) + hb;
                quantisation += da * std::fabs(b) + std::fabs(a) * db + da * db;
            }
            // the bias and the accumulated output went to the GPU as bf16: their rounded values
            const double extra = (bias.empty() ? 0.0 : bf16_value(bias[i])) + (before.empty() ? 0.0 : bf16_value(before[(size_t)j * m + i]));
            const double ref_q = sum_q * dequant + extra, ref_x = sum_x + extra;
            // bf16 rounding of the result, fp32 accumulation; with accumulation the kernels also round the product
            // (with its bias) to bf16 before adding the output's previous values: one more bf16 rounding, of that product
            const double product = sum_q * dequant + (bias.empty() ? 0.0 : bf16_value(bias[i]));
            const double tol_q = std::ldexp(std::fabs(ref_q), -8) + std::ldexp(abs_q * dequant, -12) +
                                 (before.empty() ? 0.0 : std::ldexp(std::fabs(product), -8));
            const double got = out[(size_t)j * m + i];
            const double diff_q = std::fabs(got - ref_q), diff_x = std::fabs(got - ref_x);
            // NaN compares false: counted as outside
            if (!(diff_q <= tol_q)) {
                outside_q++;
#pragma omp critical
                if (first_q.empty()) first_q = fmt("[%g, %g] got %.7g", j, i, got) + fmt(" ref %.7g tol %.3g", ref_q, tol_q);
            }
            if (!(diff_x <= tol_q + quantisation)) {
                outside_x++;
#pragma omp critical
                if (first_x.empty()) first_x = fmt("[%g, %g] got %.7g", j, i, got) + fmt(" unquantised %.7g bound %.3g", ref_x, tol_q + quantisation);
            }
            worst_q = std::max(worst_q, tol_q > 0 ? diff_q / tol_q : 0.0);
            worst_x = std::max(worst_x, tol_q + quantisation > 0 ? diff_x / (tol_q + quantisation) : 0.0);
            err2 += (got - ref_x) * (got - ref_x);
            ref2 += ref_x * ref_x;
        }
    }
    check(outside_q == 0, name + ": equals the fp64 product of the dequantised operands within fp32 accumulation and bf16 rounding",
          outside_q == 0 ? fmt("largest error %.2f of its bound", worst_q) : std::to_string(outside_q) + " outside, the first " + first_q);
    check(outside_x == 0, name + ": within the FP8 error bound of the unquantised bf16 product",
          outside_x == 0 ? fmt("largest error %.2f of its bound", worst_x) : std::to_string(outside_x) + " outside, the first " + first_x);
    const double rel = std::sqrt(err2 / ref2), limit = unit_roundoff(fa) + unit_roundoff(fb);
    check(rel <= limit, name + ": relative L2 error against the unquantised product", fmt("%.4f (limit %.4f)", rel, limit));
}

// One product a[m, k] b[n, k]^T (+ bias) (+ the output's previous values) from fresh inputs; the E5M2 operand gets
// gradient-sized values.
template <typename fpA, typename fpB>
static void test_product(int m, int n, int k, bool with_bias, bool accumulate, cudaStream_t stream) {
    constexpr Fp8Format fa = Fp8Traits<fpA>::format, fb = Fp8Traits<fpB>::format;
    const std::string name = std::string("product ") + fp8_name(fa) + " x " + fp8_name(fb) + fmt(" m%g n%g k%g", m, n, k) +
                             (with_bias ? " bias" : "") + (accumulate ? " accumulate" : "");
    const std::vector<float> a_src = normal_values((size_t)m * k, fa == Fp8Format::E5M2 ? 1e-3f : 1.0f);
    const std::vector<float> b_src = normal_values((size_t)n * k, fb == Fp8Format::E5M2 ? 1e-3f : 1.0f);
    const float out_sigma = std::sqrt((float)k) * (fa == Fp8Format::E5M2 || fb == Fp8Format::E5M2 ? 1e-3f : 1.0f);
    const std::vector<float> bias = with_bias ? normal_values((size_t)m, out_sigma) : std::vector<float>();
    const std::vector<float> before = accumulate ? normal_values((size_t)n * m, out_sigma) : std::vector<float>();
    Operand<fpA> a(a_src, m, k, false, stream);
    Operand<fpB> b(b_src, n, k, false, stream);
    DeviceBuffer<__nv_bfloat16> out((size_t)n * m), bias_d(with_bias ? bias : std::vector<float>(1, 0.0f));
    if (accumulate) out.upload(before);
    matmul_fp8(out.ptr, a.codes.template as<fpA>(), b.codes.template as<fpB>(), &a.scaling.ptr->inverse_scale, &b.scaling.ptr->inverse_scale,
               with_bias ? bias_d.ptr : nullptr, m, n, k, accumulate, stream);
    check_product(name, m, n, k, fa, fb, a.codes.download(), b.codes.download(), a.scaling.download(), b.scaling.download(), a_src, b_src,
                  bias, before, out.download());
}

// A Linear layer's three products as FP8 training runs them: forward out[N, OC] = inp W^T + bias (E4M3 x E4M3),
// input gradient dinp[N, C] = dout W (W^T from the weight's transposing cast, E4M3 x E5M2), weight gradient
// dW[OC, C] += dout^T inp (inp^T and dout^T from the transposing casts, accumulating).
static void test_linear(int N, int C, int OC, cudaStream_t stream) {
    using e4m3 = __nv_fp8_e4m3;
    using e5m2 = __nv_fp8_e5m2;
    const std::string name = fmt("Linear N%g C%g OC%g", N, C, OC);
    const std::vector<float> w = normal_values((size_t)OC * C, 0.02f), inp = normal_values((size_t)N * C, 1.0f);
    const std::vector<float> dout = normal_values((size_t)N * OC, 1e-4f), bias = normal_values((size_t)OC, 0.02f);
    const std::vector<float> dw_before = normal_values((size_t)OC * C, 1e-3f);
    Operand<e4m3> w_q(w, OC, C, true, stream), inp_q(inp, N, C, true, stream);
    Operand<e5m2> dout_q(dout, N, OC, true, stream);
    DeviceBuffer<__nv_bfloat16> out((size_t)N * OC), dinp((size_t)N * C), dw(dw_before), bias_d(bias);
    matmul_fp8(out.ptr, w_q.codes.as<e4m3>(), inp_q.codes.as<e4m3>(), &w_q.scaling.ptr->inverse_scale, &inp_q.scaling.ptr->inverse_scale,
               bias_d.ptr, OC, N, C, false, stream);
    matmul_fp8(dinp.ptr, w_q.codes_t.as<e4m3>(), dout_q.codes.as<e5m2>(), &w_q.scaling.ptr->inverse_scale,
               &dout_q.scaling.ptr->inverse_scale, (const __nv_bfloat16*)nullptr, C, N, OC, false, stream);
    matmul_fp8(dw.ptr, inp_q.codes_t.as<e4m3>(), dout_q.codes_t.as<e5m2>(), &inp_q.scaling.ptr->inverse_scale,
               &dout_q.scaling.ptr->inverse_scale, (const __nv_bfloat16*)nullptr, C, OC, N, true, stream);
    const Fp8Scaling sw = w_q.scaling.download(), si = inp_q.scaling.download(), sd = dout_q.scaling.download();
    check_product(name + " forward", OC, N, C, Fp8Format::E4M3, Fp8Format::E4M3, w_q.codes.download(), inp_q.codes.download(), sw, si, w, inp,
                  bias, {}, out.download());
    check_product(name + " input gradient", C, N, OC, Fp8Format::E4M3, Fp8Format::E5M2, w_q.codes_t.download(), dout_q.codes.download(), sw,
                  sd, transpose(w, OC, C), dout, {}, {}, dinp.download());
    check_product(name + " weight gradient", C, OC, N, Fp8Format::E4M3, Fp8Format::E5M2, inp_q.codes_t.download(), dout_q.codes_t.download(),
                  si, sd, transpose(inp, N, C), transpose(dout, N, OC), {}, dw_before, dw.download());
}

int main(int argc, char** argv) {
    check_suite("fp8_gpu");
    rng.seed(test_seed("test_fp8_gpu", argc > 1 ? argv[1] : nullptr));
    check_reference_against_cuda_fp8();
    check_refusals();
    if (!gpu_present("FP8 casts and products")) return check_failures() ? 1 : 0;
    const std::string problem = fp8_gpu_problem();
    if (!problem.empty()) {
        skip("FP8 casts and products", problem);
        return check_failures() ? 1 : 0;
    }
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    matmul_setup(false);
    using e4m3 = __nv_fp8_e4m3;
    using e5m2 = __nv_fp8_e5m2;
    guarded("amax", [&] { test_amax(stream); });
    guarded("scale update", [&] { test_update_scales(stream); });
    guarded("current and delayed scales", [&] { test_current_and_history_scales(stream); });
    guarded("casts", [&] {
        // tiles are 64 x 128: 48 x 80 is less than one, 272 x 1040 leaves partial tiles in both directions
        test_cast<e4m3>(16, 16, true, true, stream);
        test_cast<e4m3>(48, 80, true, true, stream);
        test_cast<e5m2>(272, 1040, true, true, stream);
        test_cast<e4m3>(272, 1040, true, false, stream);
        test_cast<e4m3>(37, 48, false, true, stream);
        test_cast<e5m2>(1, 4112, false, true, stream);
        if (!quick_tier()) test_cast<e4m3>(4096, 2048, false, true, stream);  // several grid-stride sweeps
        if (!quick_tier()) test_cast<e5m2>(1024, 4096, true, true, stream);
    });
    guarded("casts fused with their producers", [&] {
        // LayerNorm tiles are 32 rows x 256 columns: 48 x 80 leaves a half tile of rows, 272 x 1040 partial chunks
        for (bool residual : {false, true}) {
            test_layernorm_fp8(48, 80, residual, true, true, stream);
            test_layernorm_fp8(272, 1040, residual, true, true, stream);
            test_layernorm_fp8(64, 768, residual, false, true, stream);
            test_layernorm_fp8(37, 48, residual, true, false, stream);
        }
        if (!quick_tier()) test_layernorm_fp8(1024, 1600, true, true, true, stream);
        test_gelu_fp8(48, 80, true, true, stream);
        test_gelu_fp8(272, 1040, true, true, stream);
        test_gelu_fp8(64, 3072, false, true, stream);
        test_gelu_fp8(37, 48, true, false, stream);
        if (!quick_tier()) test_gelu_fp8(1024, 6400, true, true, stream);
    });
    guarded("products", [&] {
        test_product<e4m3, e4m3>(64, 64, 64, false, false, stream);
        test_product<e4m3, e4m3>(48, 37, 80, true, false, stream);  // n = 37: not a multiple of 16
        test_product<e4m3, e4m3>(16, 1, 16, false, false, stream);
        test_product<e4m3, e5m2>(208, 100, 176, false, true, stream);
        test_product<e5m2, e4m3>(144, 61, 112, true, true, stream);
        if (!quick_tier()) test_product<e4m3, e4m3>(1024, 333, 1024, true, false, stream);
        test_linear(80, 48, 208, stream);
    });
    matmul_teardown();
    cudaCheck(cudaStreamDestroy(stream));
    return check_failures() ? 1 : 0;
}
