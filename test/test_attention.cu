// Fused flash attention (kernels/flash_attention.cuh) against the fp32 CPU reference (test/cpu_reference.cpp)
// in fp32, bf16 and fp16, head sizes 64 and 128, multi-head and grouped-query (NH query heads on KVH kv heads), on
// lengths that are and are not multiples of the tiles and odd B*NH; fresh random inputs each run (the seed is
// printed), every output poisoned with NaN before each launch. The backward runs in both modes; the deterministic
// one twice, which must agree bit for bit. On an H200 the bf16 / fp16 forward and backward are the Hopper kernels
// (flash_attention_hopper.cuh); the first line says which, and there the mma.sync kernels, which every other GPU
// runs, are checked too ("mma.sync" in a check's name). The backward cases with T > 128 have several key blocks per
// (b, kv head) (the deterministic mode's turn counters at work), most of them a ragged last block. Grouped-query
// attention at Llama sizes is checked against multi-head attention on repeated keys and values, and the KV-cache
// decode (kernels/attention_decode.cuh) against the CPU reference.
// Given files written by test/tools/attention_vs_sdpa.py, it also compares against PyTorch SDPA (flash backend).
// Usage: test_attention [seed] [sdpa_file...]   (an argument that is all digits is the seed)
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/attention_decode.cuh"
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

// One attention problem: B sequences of T positions, NH query heads sharing KVH kv heads (KVH = NH: multi-head
// attention), head size hs.
struct Shape {
    int B, NH, KVH, T, hs;
    size_t rows() const { return (size_t)B * T; }
    size_t qkv_size() const { return rows() * (NH + 2 * KVH) * hs; }
    size_t out_size() const { return rows() * NH * hs; }
    std::string name() const {
        return " B" + std::to_string(B) + " NH" + std::to_string(NH) + (KVH != NH ? " KVH" + std::to_string(KVH) : "") + " T" +
               std::to_string(T) + " hs" + std::to_string(hs);
    }
};

// Part p of a qkv-layout array (rows of [q: NH heads | k: KVH heads | v: KVH heads]) as (rows, heads * hs): p = 0
// the queries, 1 the keys, 2 the values.
static std::vector<float> qkv_part(const std::vector<float>& qkv, int p, const Shape& s) {
    const size_t width = (size_t)(s.NH + 2 * s.KVH) * s.hs, cols = (size_t)(p == 0 ? s.NH : s.KVH) * s.hs;
    const size_t first = p == 0 ? 0 : (size_t)(s.NH + (p - 1) * s.KVH) * s.hs;
    std::vector<float> out(s.rows() * cols);
    for (size_t r = 0; r < s.rows(); r++) std::memcpy(&out[r * cols], &qkv[r * width + first], cols * sizeof(float));
    return out;
}

struct Reference {
    std::vector<float> out, lse, dqkv;
};

// Which kernels a case runs: those that flash_attention_forward / backward dispatch to, or (mma_sync) the mma.sync
// ones called directly, which on a Hopper GPU the dispatch passes over and every other GPU runs.
template <typename T>
static void run_forward(bool mma_sync, T* out, float* lse, const T* qkv, const Shape& s, cudaStream_t stream) {
    if constexpr (!std::is_same<T, float>::value) {
        if (mma_sync) {
            if (s.hs == 64) flash::forward_mma_sync<T, 64>(out, lse, qkv, s.B, s.T, s.NH, s.KVH, stream);
            else flash::forward_mma_sync<T, 128>(out, lse, qkv, s.B, s.T, s.NH, s.KVH, stream);
            return;
        }
    }
    flash_attention_forward(out, lse, qkv, s.B, s.T, s.NH, s.KVH, s.hs, stream);
}
template <typename T>
static void run_backward(bool mma_sync, T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, void* scratch,
                         const Shape& s, bool deterministic, cudaStream_t stream) {
    if constexpr (!std::is_same<T, float>::value) {
        if (mma_sync) {
            if (s.hs == 64) flash::backward_mma_sync<T, 64>(dqkv, dout, qkv, out, lse, scratch, s.B, s.T, s.NH, s.KVH, deterministic, stream);
            else flash::backward_mma_sync<T, 128>(dqkv, dout, qkv, out, lse, scratch, s.B, s.T, s.NH, s.KVH, deterministic, stream);
            return;
        }
    }
    flash_attention_backward(dqkv, dout, qkv, out, lse, scratch, s.B, s.T, s.NH, s.KVH, s.hs, deterministic, stream);
}
// The mma.sync kernels are run beside the dispatched ones where those are the Hopper kernels (16-bit on Hopper).
template <typename T> static std::vector<bool> kernel_paths() {
    if (!std::is_same<T, float>::value && flash::hopper::available()) return {false, true};
    return {false};
}

// Runs ours in precision T on (qkv, dout) and compares with ref; `tag` names the case.
template <typename T>
void check_against(const std::string& tag, const std::vector<float>& qkv, const std::vector<float>& dout,
                   const Reference& ref, const Shape& s, double tol, bool check_lse, cudaStream_t stream) {
    DeviceBuffer<T> qkv_d(qkv), dout_d(dout), out_d(s.out_size()), dqkv_d(s.qkv_size());
    DeviceBuffer<float> lse_d((size_t)s.B * s.NH * s.T);
    DeviceBuffer<unsigned char> scratch(flash_attention_backward_scratch_bytes(s.B, s.T, s.NH, s.KVH, s.hs));
    for (bool mma_sync : kernel_paths<T>()) {
        const std::string name = tag + (mma_sync ? " mma.sync" : "");
        out_d.poison();
        lse_d.poison();
        run_forward(mma_sync, out_d.ptr, lse_d.ptr, qkv_d.ptr, s, stream);
        compare(name + " forward out", out_d.download(), ref.out, tol);
        if (check_lse) compare(name + " forward lse", lse_d.download(), ref.lse, tol);

        std::vector<float> first;
        for (int run = 0; run < 3; run++) {  // deterministic, deterministic again, atomic
            const bool deterministic = run < 2;
            dqkv_d.poison();
            scratch.poison();
            run_backward(mma_sync, dqkv_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, scratch.ptr, s, deterministic, stream);
            std::vector<float> dqkv = dqkv_d.download();
            if (run == 1) {
                const bool same = std::memcmp(dqkv.data(), first.data(), dqkv.size() * sizeof(float)) == 0;
                check(same, name + " backward deterministic: two runs bitwise equal", same ? "" : "results differ");
                continue;
            }
            if (run == 0) first = dqkv;
            const std::string mode = deterministic ? " backward (deterministic) " : " backward (atomic) ";
            const char* names[3] = {"dq", "dk", "dv"};
            for (int p = 0; p < 3; p++)
                compare_gradient(name + mode + names[p], qkv_part(dqkv, p, s), qkv_part(ref.dqkv, p, s), dout, tol);
        }
    }
}

// ---- against the CPU reference. A kv head's dK and dV sum over its group in fp32 before their one rounding, so
// grouped-query cases keep the multi-head bounds.
static void test_case(const Shape& s, cudaStream_t stream) {
    const size_t tt = (size_t)s.B * s.NH * s.T * s.T;
    const std::vector<float> qkv = exact_random(s.qkv_size()), dout = exact_random(s.out_size());
    Reference ref;
    ref.out.resize(s.out_size());
    std::vector<float> preatt(tt), att(tt);
    cpuref::gqa_attention_forward(ref.out.data(), preatt.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.hs);
    ref.lse.resize((size_t)s.B * s.NH * s.T);
    for (size_t r = 0; r < ref.lse.size(); r++) {  // log-sum-exp over the causal part of each preatt row
        const int t = (int)(r % s.T);
        const float* row = &preatt[r * s.T];
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; j++) mx = std::max(mx, (double)row[j]);
        for (int j = 0; j <= t; j++) sum += std::exp(row[j] - mx);
        ref.lse[r] = (float)(mx + std::log(sum));
    }
    ref.dqkv.assign(s.qkv_size(), 0.0f);
    std::vector<float> dpreatt(tt, 0.0f), datt(tt, 0.0f);
    cpuref::gqa_attention_backward(ref.dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                                   s.NH, s.KVH, s.hs);

    check_against<float>("fp32" + s.name(), qkv, dout, ref, s, tolerance<float>(), true, stream);
    check_against<__nv_bfloat16>("bf16" + s.name(), qkv, dout, ref, s, tolerance<__nv_bfloat16>(), true, stream);
    check_against<__half>("fp16" + s.name(), qkv, dout, ref, s, tolerance<__half>(), true, stream);
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
    const Shape s{1, 40, 40, 2048, hs};
    DeviceBuffer<T> qkv_d(exact_random(s.qkv_size())), dout_d(exact_random(s.out_size())), out_d(s.out_size()), dqkv_d(s.qkv_size()),
        reference_d(s.qkv_size());
    DeviceBuffer<float> lse_d((size_t)s.B * s.NH * s.T);
    DeviceBuffer<unsigned char> scratch(flash_attention_backward_scratch_bytes(s.B, s.T, s.NH, s.KVH, hs));
    run_forward(false, out_d.ptr, lse_d.ptr, qkv_d.ptr, s, stream);
    run_backward(true, reference_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, scratch.ptr, s, true, stream);
    const std::vector<float> reference = reference_d.download();
    std::vector<float> first;
    for (int run = 0; run < 2; run++) {
        dqkv_d.poison();
        scratch.poison();
        run_backward(false, dqkv_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, scratch.ptr, s, true, stream);
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

// ---- grouped-query attention at Llama sizes, too large for the CPU reference: against multi-head attention on
// the same queries with each kv head's K and V repeated for its group's heads (transformers' repeat_kv). A query
// head computes the same products from the same values either way, so out, lse and the deterministic dQ must be
// bitwise equal; a kv head's dK and dV are its group's multi-head ones summed (here in fp32 after their bf16
// rounding, in the kernel before it: the bf16 bound 1e-2; a head of the group missed or added twice is off by
// 1/group or more). Deterministic dqkv twice, bitwise; the atomic one against it, within the bf16 bound. At hs 128
// the Llama 3 8B heads (32 query heads, 8 kv heads); the Hopper backward's L2 sections then hold 3 + 3 + 2 kv heads
// (hs 64: 3 + 1 of B * KVH = 4).
static void test_repeated_kv(const Shape& s, cudaStream_t stream) {
    using T = __nv_bfloat16;
    const int group = s.NH / s.KVH;
    const Shape mha{s.B, s.NH, s.NH, s.T, s.hs};
    const std::vector<float> qkv = exact_random(s.qkv_size()), dout = exact_random(s.out_size());
    std::vector<float> qkv_mha(mha.qkv_size());
    const size_t width = (size_t)(s.NH + 2 * s.KVH) * s.hs, C = (size_t)s.NH * s.hs, hs = s.hs;
    for (size_t r = 0; r < s.rows(); r++) {
        const float* src = &qkv[r * width];
        float* dst = &qkv_mha[r * 3 * C];
        std::memcpy(dst, src, C * sizeof(float));
        for (int h = 0; h < s.NH; h++) {
            const size_t kv = (size_t)(h / group) * hs;
            std::memcpy(dst + C + h * hs, src + C + kv, hs * sizeof(float));
            std::memcpy(dst + 2 * C + h * hs, src + C + s.KVH * hs + kv, hs * sizeof(float));
        }
    }
    DeviceBuffer<T> qkv_d(qkv), qkv_mha_d(qkv_mha), dout_d(dout), out_d(s.out_size()), out_mha_d(s.out_size()), dqkv_d(s.qkv_size()),
        dqkv_mha_d(mha.qkv_size());
    DeviceBuffer<float> lse_d((size_t)s.B * s.NH * s.T), lse_mha_d((size_t)s.B * s.NH * s.T);
    DeviceBuffer<unsigned char> scratch(flash_attention_backward_scratch_bytes(s.B, s.T, s.NH, s.KVH, s.hs));
    auto bitwise = [](const std::string& name, const std::vector<float>& a, const std::vector<float>& b) {
        const bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        check(same, name, same ? "" : "results differ");
    };
    for (bool mma_sync : kernel_paths<T>()) {
        const std::string tag = "bf16" + s.name() + (mma_sync ? " mma.sync" : "") + " vs repeated K, V:";
        run_forward(mma_sync, out_d.ptr, lse_d.ptr, qkv_d.ptr, s, stream);
        run_forward(mma_sync, out_mha_d.ptr, lse_mha_d.ptr, qkv_mha_d.ptr, mha, stream);
        bitwise(tag + " forward out bitwise equal", out_d.download(), out_mha_d.download());
        bitwise(tag + " forward lse bitwise equal", lse_d.download(), lse_mha_d.download());

        run_backward(mma_sync, dqkv_mha_d.ptr, dout_d.ptr, qkv_mha_d.ptr, out_mha_d.ptr, lse_mha_d.ptr, scratch.ptr, mha, true, stream);
        const std::vector<float> dqkv_mha = dqkv_mha_d.download();
        std::vector<float> dkv_summed(s.rows() * 2 * s.KVH * hs, 0.0f);  // the group sums, as (rows, [k | v] of KVH heads)
        for (size_t r = 0; r < s.rows(); r++)
            for (int p = 0; p < 2; p++)
                for (int h = 0; h < s.NH; h++)
                    for (size_t d = 0; d < hs; d++)
                        dkv_summed[(r * 2 + p) * s.KVH * hs + (h / group) * hs + d] += dqkv_mha[r * 3 * C + (p + 1) * C + h * hs + d];
        std::vector<float> first;
        for (int run = 0; run < 3; run++) {  // deterministic, deterministic again, atomic
            const bool deterministic = run < 2;
            dqkv_d.poison();
            scratch.poison();
            run_backward(mma_sync, dqkv_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, scratch.ptr, s, deterministic, stream);
            const std::vector<float> dqkv = dqkv_d.download();
            if (run == 0) {
                first = dqkv;
                bitwise(tag + " backward (deterministic) dq bitwise equal", qkv_part(dqkv, 0, s), qkv_part(dqkv_mha, 0, mha));
                std::vector<float> dkv(dkv_summed.size());
                for (size_t r = 0; r < s.rows(); r++)
                    std::memcpy(&dkv[r * 2 * s.KVH * hs], &dqkv[r * width + C], 2 * s.KVH * hs * sizeof(float));
                compare(tag + " backward (deterministic) dk, dv against the group sums", dkv, dkv_summed, 1e-2);
            } else if (run == 1) {
                bitwise(tag + " backward deterministic: two runs bitwise equal", dqkv, first);
            } else {
                compare(tag + " backward (atomic) against deterministic", dqkv, first, 1e-2);
            }
        }
    }
}

// ---- the KV-cache decode (kernels/attention_decode.cuh) against the CPU reference: `rows` new positions from
// `pos` on, one sequence of pos + rows positions. Its sums are fp32 in another order than the reference's double:
// the file's bounds (fp32 1e-5, bf16 1e-2 for the output's rounding).
template <typename T> static void test_decode(int NH, int KVH, int hs, int pos, int rows, cudaStream_t stream) {
    const Shape s{1, NH, KVH, pos + rows, hs};
    const std::vector<float> qkv = exact_random(s.qkv_size());
    std::vector<float> out(s.out_size()), preatt((size_t)NH * s.T * s.T), att(preatt.size());
    cpuref::gqa_attention_forward(out.data(), preatt.data(), att.data(), qkv.data(), 1, s.T, NH, KVH, hs);
    const std::vector<float> expected(out.begin() + (size_t)pos * NH * hs, out.end());
    DeviceBuffer<T> qkv_d(qkv), out_d(expected.size());
    attention_decode(out_d.ptr, qkv_d.ptr, pos, rows, NH, KVH, hs, stream);
    compare(std::string(type_name<T>()) + " decode" + s.name() + " rows " + std::to_string(pos) + ".." + std::to_string(pos + rows - 1),
            out_d.download(), expected, tolerance<T>());
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
    const Shape shape{B, H, H, Tn, D};
    check_against<T>(std::string(type_name<T>()) + " vs SDPA" + shape.name(), qkv, a[3], ref, shape, 1e-2, false, stream);
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
        for (int i = 0; i < num_cases; i++) test_case({cases[i][0], cases[i][1], cases[i][1], cases[i][2], hs}, stream);
    // Grouped-query (B, NH, KVH, T): 8 query heads on 1, 2 and 8 kv heads, groups of 3 (12 on 4); T = 300 with an
    // unpaired last key-block pair on Hopper, B > 1. The quick tier runs the first four; the full tier adds a long
    // sequence and more query tiles than an H200 has SMs.
    const int gqa_cases[][4] = {{1, 8, 1, 300}, {2, 8, 2, 129}, {2, 8, 8, 129}, {1, 12, 4, 65}, {1, 8, 2, 1000}, {3, 16, 4, 400}};
    const int num_gqa_cases = quick_tier() ? 4 : (int)(sizeof(gqa_cases) / sizeof(gqa_cases[0]));
    for (int hs : {64, 128})
        for (int i = 0; i < num_gqa_cases; i++)
            test_case({gqa_cases[i][0], gqa_cases[i][1], gqa_cases[i][2], gqa_cases[i][3], hs}, stream);
    for (int hs : {64, 128}) test_sections(hs, stream);
    test_repeated_kv({1, 32, 8, 2048, 128}, stream);
    test_repeated_kv({2, 16, 2, 2048, 64}, stream);
    for (int hs : {64, 128})
        for (int kvh : {1, 2, 8}) {
            test_decode<float>(8, kvh, hs, 200, 3, stream);
            test_decode<__nv_bfloat16>(8, kvh, hs, 200, 3, stream);
        }
    for (const auto& path : files) test_sdpa_file(path, stream);
    cudaCheck(cudaStreamDestroy(stream));
    return check_failures() == 0 ? 0 : 1;
}
