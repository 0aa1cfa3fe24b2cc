// Fused flash attention (kernels/flash_attention.cuh) against the fp32 CPU reference (test/cpu_reference.cpp)
// in fp32, bf16 and fp16, head sizes 64 and 128, on lengths that are and are not multiples of the tiles and
// odd B*NH; fresh random inputs each run (the seed is printed), every output poisoned with NaN before each
// launch. The backward runs in both modes; the deterministic one twice, which must agree bit for bit. On an
// H200 the bf16 / fp16 forward and backward are the Hopper kernels (flash_attention_hopper.cuh); the first line
// says which. The backward cases with T > 128 have several key blocks per (b, head) (the deterministic mode's
// turn counters at work), most of them a ragged last block.
// Given files written by test/tools/attention_vs_sdpa.py, it also compares against PyTorch SDPA (flash backend).
// Usage: test_attention [seed] [sdpa_file...]   (an argument that is all digits is the seed)
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/flash_attention.cuh"
#include "cpu_reference.h"
#include "gpu_check.h"

// Relative L2 bounds: fp32 differs from the reference only in summation order; bf16/fp16 round P and dS to
// 16 bits before the products that use them, and the outputs themselves.
template <typename T> double tolerance() { return std::is_same<T, float>::value ? 1e-5 : 1e-2; }
static float bits_to_float(uint16_t bits, __nv_bfloat16*) {
    __nv_bfloat16_raw r;
    r.x = bits;
    return __bfloat162float(__nv_bfloat16(r));
}
static float bits_to_float(uint16_t bits, __half*) {
    __half_raw r;
    r.x = bits;
    return __half2float(__half(r));
}

static std::mt19937_64 rng;

// Normal values that bf16, fp16 and fp32 all hold exactly (bf16 values, fp16 subnormals flushed to 0), so one
// reference serves the three precisions and sees exactly what the GPU sees.
static std::vector<float> exact_random(size_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) {
        x = __bfloat162float(__float2bfloat16(normal(rng)));
        if (std::fabs(x) < 6.103515625e-05f) x = 0.0f;
    }
    return v;
}

// Gradients can be exactly zero (dq and dk when T = 1: a softmax over one key has zero gradient), where a
// relative error means nothing: those are measured against the norm of `scale` (dout, which they are made of).
static void compare_gradient(const std::string& name, const std::vector<float>& got, const std::vector<float>& expected,
                             const std::vector<float>& scale, double tol) {
    double ref_norm = 0.0;
    for (float x : expected) ref_norm += (double)x * x;
    if (ref_norm > 0.0) return compare(name, got, expected, tol);
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); i++) num += std::isfinite(got[i]) ? (double)got[i] * got[i] : INFINITY;
    for (float x : scale) den += (double)x * x;
    const double err = std::sqrt(num / den);
    char buf[128];
    snprintf(buf, sizeof(buf), "|got| / |dout| %.3g, reference 0 (tol %.3g)", err, tol);
    check(err <= tol, name, buf);
}

// Slice s (0 = q, 1 = k, 2 = v) of a (B,T,3,C) array as (B,T,C).
static std::vector<float> slice3(const std::vector<float>& qkv, int s, size_t rows, int C) {
    std::vector<float> out(rows * C);
    for (size_t r = 0; r < rows; r++)
        std::memcpy(&out[r * C], &qkv[(r * 3 + s) * C], C * sizeof(float));
    return out;
}

struct Reference {
    std::vector<float> out, lse, dqkv;
};

// Runs ours in precision T on (qkv, dout) and compares with ref; `tag` names the case.
template <typename T>
void check_against(const std::string& tag, const std::vector<float>& qkv, const std::vector<float>& dout,
                   const Reference& ref, int B, int Tn, int NH, int hs, double tol, bool check_lse, cudaStream_t stream) {
    const int C = NH * hs;
    const size_t rows = (size_t)B * Tn, n = rows * C;
    DeviceBuffer<T> qkv_d(3 * n), dout_d(n), out_d(n), dqkv_d(3 * n);
    DeviceBuffer<float> lse_d((size_t)B * NH * Tn);
    DeviceBuffer<unsigned char> scratch(flash_attention_backward_scratch_bytes(B, Tn, NH, hs));
    qkv_d.upload(qkv);
    dout_d.upload(dout);
    flash_attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, Tn, NH, hs, stream);
    compare(tag + " forward out", out_d.download(), ref.out, tol);
    if (check_lse) compare(tag + " forward lse", lse_d.download(), ref.lse, tol);

    std::vector<float> first;
    for (int run = 0; run < 3; run++) {  // deterministic, deterministic again, atomic
        const bool deterministic = run < 2;
        dqkv_d.poison();
        scratch.poison();
        flash_attention_backward(dqkv_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, scratch.ptr, B, Tn, NH, hs, deterministic,
                                 stream);
        std::vector<float> dqkv = dqkv_d.download();
        if (run == 1) {
            const bool same = std::memcmp(dqkv.data(), first.data(), dqkv.size() * sizeof(float)) == 0;
            check(same, tag + " backward deterministic: two runs bitwise equal", same ? "" : "results differ");
            continue;
        }
        if (run == 0) first = dqkv;
        const std::string mode = deterministic ? " backward (deterministic) " : " backward (atomic) ";
        const char* names[3] = {"dq", "dk", "dv"};
        for (int s = 0; s < 3; s++)
            compare_gradient(tag + mode + names[s], slice3(dqkv, s, rows, C), slice3(ref.dqkv, s, rows, C), dout, tol);
    }
}

// ---- against the CPU reference
static void test_case(int B, int NH, int Tn, int hs, cudaStream_t stream) {
    const int C = NH * hs;
    const size_t n = (size_t)B * Tn * C, tt = (size_t)B * NH * Tn * Tn;
    const std::vector<float> qkv = exact_random(3 * n), dout = exact_random(n);
    Reference ref;
    ref.out.resize(n);
    std::vector<float> preatt(tt), att(tt);
    cpuref::attention_forward(ref.out.data(), preatt.data(), att.data(), qkv.data(), B, Tn, C, NH);
    ref.lse.resize((size_t)B * NH * Tn);
    for (size_t r = 0; r < ref.lse.size(); r++) {  // log-sum-exp over the causal part of each preatt row
        const int t = (int)(r % Tn);
        const float* row = &preatt[r * Tn];
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; j++) mx = std::max(mx, (double)row[j]);
        for (int j = 0; j <= t; j++) sum += std::exp(row[j] - mx);
        ref.lse[r] = (float)(mx + std::log(sum));
    }
    ref.dqkv.assign(3 * n, 0.0f);
    std::vector<float> dpreatt(tt, 0.0f), datt(tt, 0.0f);
    cpuref::attention_backward(ref.dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, Tn, C, NH);

    const std::string shape = " B" + std::to_string(B) + " NH" + std::to_string(NH) + " T" + std::to_string(Tn) +
                              " hs" + std::to_string(hs);
    check_against<float>(std::string("fp32") + shape, qkv, dout, ref, B, Tn, NH, hs, tolerance<float>(), true, stream);
    check_against<__nv_bfloat16>(std::string("bf16") + shape, qkv, dout, ref, B, Tn, NH, hs, tolerance<__nv_bfloat16>(), true, stream);
    check_against<__half>(std::string("fp16") + shape, qkv, dout, ref, B, Tn, NH, hs, tolerance<__half>(), true, stream);
}

// ---- the Hopper backward over several L2 sections of heads (at GPT-2 sizes a section holds every head of the
// small cases above): 40 heads at T = 2048 make 2 sections at hs 64 (31 + 9 heads) and 3 at hs 128 (15 + 15 + 10).
// Too large for the CPU reference: against the mma.sync backward (both deterministic), whose dqkv differs only by
// the bf16 rounding of sums taken in another order (rel L2 about 1.7e-4 at T = 4096, one H200), so 1e-3; a head
// or key block the sections missed or ran twice would be poison (NaN) or off by O(1).
static void test_sections(int hs, cudaStream_t stream) {
    if (!flash::hopper::available()) {
        skip("Hopper backward over several L2 sections, hs " + std::to_string(hs), "not an sm_90a build on a Hopper GPU");
        return;
    }
    using T = __nv_bfloat16;
    const int B = 1, NH = 40, Tn = 2048, C = NH * hs;
    const size_t n = (size_t)B * Tn * C;
    DeviceBuffer<T> qkv_d(exact_random(3 * n)), dout_d(exact_random(n)), out_d(n), dqkv_d(3 * n), reference_d(3 * n);
    DeviceBuffer<float> lse_d((size_t)B * NH * Tn);
    DeviceBuffer<unsigned char> scratch(flash_attention_backward_scratch_bytes(B, Tn, NH, hs));
    flash_attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, Tn, NH, hs, stream);
    if (hs == 64) flash::backward_mma_sync<T, 64>(reference_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, scratch.ptr, B, Tn, NH, true, stream);
    else flash::backward_mma_sync<T, 128>(reference_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, scratch.ptr, B, Tn, NH, true, stream);
    const std::vector<float> reference = reference_d.download();
    std::vector<float> first;
    for (int run = 0; run < 2; run++) {
        dqkv_d.poison();
        scratch.poison();
        flash_attention_backward(dqkv_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, scratch.ptr, B, Tn, NH, hs, true, stream);
        const std::vector<float> dqkv = dqkv_d.download();
        if (run == 0) {
            compare("Hopper backward over several L2 sections (B1 NH40 T2048 hs" + std::to_string(hs) + ") against mma.sync", dqkv, reference, 1e-3);
            first = dqkv;
        } else {
            const bool same = std::memcmp(dqkv.data(), first.data(), dqkv.size() * sizeof(float)) == 0;
            check(same, "Hopper backward over several L2 sections, hs " + std::to_string(hs) + ": two runs bitwise equal", same ? "" : "results differ");
        }
    }
}

// ---- against PyTorch SDPA: records of (dtype, B, H, T, D) then q, k, v, dout, out, dq, dk, dv, each
// (B,T,H,D) in that 16-bit dtype (1 = bf16, 2 = fp16); see test/tools/attention_vs_sdpa.py.
template <typename T>
static void sdpa_record(std::ifstream& f, int B, int H, int Tn, int D, cudaStream_t stream) {
    const size_t n = (size_t)B * Tn * H * D, rows = (size_t)B * Tn;
    const int C = H * D;
    std::vector<std::vector<float>> a(8, std::vector<float>(n));
    std::vector<uint16_t> raw(n);
    for (auto& v : a) {
        f.read(reinterpret_cast<char*>(raw.data()), n * 2);
        for (size_t i = 0; i < n; i++) v[i] = bits_to_float(raw[i], (T*)nullptr);
    }
    std::vector<float> qkv(3 * n);
    for (size_t r = 0; r < rows; r++)
        for (int s = 0; s < 3; s++) std::memcpy(&qkv[(r * 3 + s) * C], &a[s][r * C], C * sizeof(float));
    Reference ref;
    ref.out = a[4];
    ref.dqkv.resize(3 * n);
    for (size_t r = 0; r < rows; r++)
        for (int s = 0; s < 3; s++) std::memcpy(&ref.dqkv[(r * 3 + s) * C], &a[5 + s][r * C], C * sizeof(float));
    const std::string tag = std::string(type_name<T>()) + " vs SDPA B" + std::to_string(B) + " NH" + std::to_string(H) +
                            " T" + std::to_string(Tn) + " hs" + std::to_string(D);
    check_against<T>(tag, qkv, a[3], ref, B, Tn, H, D, 1e-2, false, stream);
}

static void test_sdpa_file(const std::string& path, cudaStream_t stream) {
    std::ifstream f(path, std::ios::binary);
    char magic[8];
    if (!f.read(magic, 8) || std::memcmp(magic, "SDPAREF1", 8) != 0) {
        check(false, "SDPA file " + path, "missing or not an SDPA reference file");
        return;
    }
    int32_t hdr[5];
    while (f.read(reinterpret_cast<char*>(hdr), sizeof(hdr))) {
        if (hdr[0] == 1) sdpa_record<__nv_bfloat16>(f, hdr[1], hdr[2], hdr[3], hdr[4], stream);
        else if (hdr[0] == 2) sdpa_record<__half>(f, hdr[1], hdr[2], hdr[3], hdr[4], stream);
        else { check(false, "SDPA file " + path, "unknown dtype code"); return; }
        if (!f) { check(false, "SDPA file " + path, "truncated record"); return; }
    }
}

int main(int argc, char** argv) {
    check_suite("attention");
    const char* seed = nullptr;
    std::vector<std::string> files;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (!a.empty() && a.find_first_not_of("0123456789") == std::string::npos) seed = argv[i];
        else files.push_back(a);
    }
    rng.seed(test_seed("test_attention", seed));
    if (!gpu_present("flash attention")) return 0;
    printf("bf16/fp16 forward and backward: %s\n", flash::hopper::available() ? "Hopper (wgmma, TMA)" : "mma.sync");
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    // (B, NH, T): B*NH odd; long sequences with one head to keep the CPU reference cheap; T = 300 has an odd
    // number of 128-key blocks above one (the Hopper backward's last pair unpaired, finishing what pair 0 began).
    // {5, 31, 129} and {3, 15, 400} have more query tiles than an H200 has SMs, so the Hopper forward's persistent
    // CTAs each run several tiles. The quick tier (TEST_TIER=quick) runs the first six (ragged and whole tiles, an
    // odd number of key blocks, persistent CTAs with several tiles); the long sequences after them cost the CPU
    // reference most.
    const int cases[][3] = {{1, 3, 1}, {3, 1, 63}, {1, 5, 64}, {1, 3, 65}, {1, 3, 300}, {5, 31, 129}, {1, 3, 1000},
                            {1, 1, 1024}, {1, 1, 2048}, {3, 15, 400}};
    const int num_cases = quick_tier() ? 6 : (int)(sizeof(cases) / sizeof(cases[0]));
    for (int hs : {64, 128})
        for (int i = 0; i < num_cases; i++) test_case(cases[i][0], cases[i][1], cases[i][2], hs, stream);
    for (int hs : {64, 128}) test_sections(hs, stream);
    for (const auto& path : files) test_sdpa_file(path, stream);
    cudaCheck(cudaStreamDestroy(stream));
    return check_failures() == 0 ? 0 : 1;
}
