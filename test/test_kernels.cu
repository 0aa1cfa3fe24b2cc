// Every kernel but attention (test_attention.cu) against the fp32 CPU reference (test/cpu_reference.cpp), forward and backward, in fp32, bf16
// and fp16, on several shapes (row counts and widths that are not multiples of any block size), with
// fresh random inputs each run (the seed is printed) and outputs poisoned with NaN before each launch. The quick
// tier (TEST_TIER=quick, check.h) leaves out the largest shapes, whose random inputs and CPU reference cost most: the
// wide LayerNorm over more rows than its blocks take at once (4 x 1100 rows of 4200), the RMSNorm over 8 x 1024 rows
// of 576 and 4 x 1100 of 4096, SwiGLU over 1024 rows, and d12's MLP product with and without the GELU epilogue; every
// kernel keeps its other shapes. The Llama family's kernels (RMSNorm, SwiGLU, RoPE) run with the widths and heads of
// SmolLM2, Qwen 2.5 and Llama 3; RoPE's frequency tables (host code) are checked without a GPU too. The CPU AdamW
// (kernels/adamw_cpu.h) is checked against the GPU's bit for bit, with each of the host's paths.
// Usage: test_kernels [seed]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/encoder.cuh"
#include "../kernels/layernorm.cuh"
#include "../kernels/matmul.cuh"
#include "../kernels/gelu.cuh"
#include "../kernels/swiglu.cuh"
#include "../kernels/rope.cuh"
#include "../kernels/classifier.cuh"
#include "../kernels/adamw.cuh"
#include "../kernels/adamw_cpu.h"
#include "../kernels/global_norm.cuh"
#include "../kernels/init.cuh"
#include "cpu_reference.h"
#include "gpu_check.h"

// Tolerances (relative L2 against the fp32 reference computed on the same, already rounded, inputs).
// fp32: only summation order differs: ~1e-6. bf16 keeps 8 significant bits, so one rounding of an output
// costs up to 2^-9 = 2e-3 relative; kernels that round intermediates compound a few of those.
// fp16 keeps 11 bits: 8x tighter.
struct Tolerance { double simple, composite; };
template <typename T> Tolerance tolerance();
template <> Tolerance tolerance<float>() { return {1e-5, 1e-5}; }
template <> Tolerance tolerance<__nv_bfloat16>() { return {1e-2, 3e-2}; }
template <> Tolerance tolerance<__half>() { return {2e-3, 5e-3}; }
static std::mt19937_64 rng;

// Random values already rounded to floatX, so the reference sees exactly what the GPU sees.
template <typename floatX> std::vector<float> random_vector(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = host_round<floatX>(normal(rng));
    return v;
}

struct Shape { int B, T, C, NH; };
// " B3 T37 C200": in the check names of tests run over several shapes, so that every name is unique
static std::string shape_name(const Shape& s) {
    return " B" + std::to_string(s.B) + " T" + std::to_string(s.T) + " C" + std::to_string(s.C);
}

template <typename floatX>
void test_encoder(const Shape& s, const std::string& tag, cudaStream_t stream) {
    const int B = s.B, T = s.T, C = s.C, V = 300;
    std::uniform_int_distribution<int> token(0, V - 1);
    std::vector<int> tokens(B * T);
    for (auto& t : tokens) t = token(rng);
    tokens[0] = tokens[B * T - 1];  // at least one repeated token
    auto wte = random_vector<floatX>((size_t)V * C), wpe = random_vector<floatX>((size_t)T * C);
    std::vector<float> out_ref((size_t)B * T * C);
    cpuref::encoder_forward(out_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    int* tokens_d;
    cudaCheck(cudaMalloc(&tokens_d, tokens.size() * 4 * 4));
    cudaCheck(cudaMemcpy(tokens_d, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
    DeviceBuffer<floatX> wte_d(wte), wpe_d(wpe), out_d(out_ref.size());
    encoder_forward(out_d.ptr, tokens_d, wte_d.ptr, wpe_d.ptr, B, T, C, stream);
    compare(tag + " encoder_forward" + shape_name(s), out_d.download(), out_ref, tolerance<floatX>().simple);

    // backward accumulates into existing gradients
    auto dout = random_vector<floatX>(out_ref.size());
    auto dwte = random_vector<floatX>(wte.size()), dwpe = random_vector<floatX>(wpe.size());
    DeviceBuffer<floatX> dout_d(dout), dwte_d(dwte), dwpe_d(dwpe);
    cpuref::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    std::vector<int> packed(3 * B * T + 1), counts;
    const int num_buckets = encoder_buckets(tokens.data(), B * T, V, packed.data(), counts);
    cudaCheck(cudaMemcpy(tokens_d, packed.data(), packed.size() * 4, cudaMemcpyHostToDevice));
    encoder_backward(dwte_d.ptr, dwpe_d.ptr, dout_d.ptr, tokens_d, num_buckets, B, T, C, stream);
    compare(tag + " encoder_backward dwte" + shape_name(s), dwte_d.download(), dwte, tolerance<floatX>().simple);
    compare(tag + " encoder_backward dwpe" + shape_name(s), dwpe_d.download(), dwpe, tolerance<floatX>().simple);
    cudaCheck(cudaFree(tokens_d));
}

// Vocabulary-parallel embedding: the padded table (Vp rows, V real) split into tp ranges of Vl = Vp / tp rows, one per
// tensor-parallel "rank", each run on its own slice; rank 0 alone adds wpe. The ranks' summed outputs (the
// all-reduce) must be the whole table's embedding, and each rank's dwte slice (and rank 0's dwpe) the matching rows
// of the whole table's gradient.
template <typename floatX>
void test_encoder_vocab_parallel(const Shape& s, int V, int Vp, int tp, const std::string& tag, cudaStream_t stream) {
    const int B = s.B, T = s.T, C = s.C, Vl = Vp / tp;
    const std::string name = " vocab-parallel V" + std::to_string(V) + " Vp" + std::to_string(Vp) + " tp" +
                             std::to_string(tp) + shape_name(s);
    std::uniform_int_distribution<int> token(0, V - 1);
    std::vector<int> tokens(B * T);
    for (auto& t : tokens) t = token(rng);
    // a token in every rank that holds real rows (the first of its range), and V - 1, the last real row
    // (twice: a bucket of two positions)
    for (int r = 0; r < tp && r * Vl < V; r++) tokens[(r + 1) % (B * T)] = r * Vl;
    tokens[0] = tokens[B * T - 1] = V - 1;
    auto wte = random_vector<floatX>((size_t)Vp * C), wpe = random_vector<floatX>((size_t)T * C);
    std::vector<float> out_ref((size_t)B * T * C), out_sum(out_ref.size(), 0.0f);
    cpuref::encoder_forward(out_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    int* tokens_d;
    cudaCheck(cudaMalloc(&tokens_d, (3 * tokens.size() + 1) * sizeof(int)));  // the tokens, then their buckets
    cudaCheck(cudaMemcpy(tokens_d, tokens.data(), tokens.size() * sizeof(int), cudaMemcpyHostToDevice));
    DeviceBuffer<floatX> wte_d(wte), wpe_d(wpe);
    for (int r = 0; r < tp; r++) {
        DeviceBuffer<floatX> out_d(out_ref.size());
        encoder_forward(out_d.ptr, tokens_d, wte_d.ptr + (size_t)r * Vl * C, r == 0 ? wpe_d.ptr : nullptr, B, T, C,
                        stream, r * Vl, Vl);
        const std::vector<float> out = out_d.download();
        for (size_t i = 0; i < out.size(); i++) out_sum[i] += out[i];
    }
    compare(tag + " encoder_forward" + name + " sum over ranks", out_sum, out_ref, tolerance<floatX>().simple);

    // backward, accumulating into existing gradients: each rank into its own slice, rank 0 alone into dwpe
    auto dout = random_vector<floatX>(out_ref.size());
    auto dwte = random_vector<floatX>(wte.size()), dwpe = random_vector<floatX>(wpe.size());
    DeviceBuffer<floatX> dout_d(dout), dwpe_d(dwpe);
    std::vector<float> dwte_ref = dwte, dwpe_ref = dwpe;
    cpuref::encoder_backward(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), B, T, C);
    std::vector<int> packed(3 * B * T + 1), counts;
    const int num_buckets = encoder_buckets(tokens.data(), B * T, V, packed.data(), counts);
    cudaCheck(cudaMemcpy(tokens_d, packed.data(), packed.size() * sizeof(int), cudaMemcpyHostToDevice));
    for (int r = 0; r < tp; r++) {
        const size_t begin = (size_t)r * Vl * C, end = begin + (size_t)Vl * C;
        DeviceBuffer<floatX> dwte_d(std::vector<float>(dwte.begin() + begin, dwte.begin() + end));
        encoder_backward(dwte_d.ptr, r == 0 ? dwpe_d.ptr : nullptr, dout_d.ptr, tokens_d, num_buckets, B, T, C, stream,
                         r * Vl, Vl);
        compare(tag + " encoder_backward" + name + " dwte rank " + std::to_string(r), dwte_d.download(),
                std::vector<float>(dwte_ref.begin() + begin, dwte_ref.begin() + end), tolerance<floatX>().simple);
    }
    compare(tag + " encoder_backward" + name + " dwpe (rank 0)", dwpe_d.download(), dwpe_ref, tolerance<floatX>().simple);
    cudaCheck(cudaFree(tokens_d));
}

template <typename floatX>
void test_layernorm(const Shape& s, const std::string& tag, cudaStream_t stream) {
    const int N = s.B * s.T, C = s.C;
    auto a = random_vector<floatX>((size_t)N * C), b = random_vector<floatX>((size_t)N * C);
    auto w = random_vector<floatX>(C), bias = random_vector<floatX>(C);
    // residual + LayerNorm: the reference normalises the rounded sum, as the kernel does
    std::vector<float> residual((size_t)N * C), out_ref((size_t)N * C), mean_ref(N), rstd_ref(N);
    cpuref::residual_forward(residual.data(), a.data(), b.data(), N * C);
    for (auto& x : residual) x = host_round<floatX>(x);
    cpuref::layernorm_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(), residual.data(), w.data(), bias.data(), N, C);
    DeviceBuffer<floatX> a_d(a), b_d(b), w_d(w), bias_d(bias), residual_d(residual.size()), out_d(out_ref.size());
    DeviceBuffer<float> mean_d(N), rstd_d(N);
    residual_layernorm_forward(residual_d.ptr, out_d.ptr, mean_d.ptr, rstd_d.ptr, a_d.ptr, b_d.ptr, w_d.ptr, bias_d.ptr, N, C, stream);
    compare(tag + " residual_layernorm_forward residual" + shape_name(s), residual_d.download(), residual, tolerance<floatX>().simple);
    compare(tag + " residual_layernorm_forward out" + shape_name(s), out_d.download(), out_ref, tolerance<floatX>().simple);
    compare(tag + " residual_layernorm_forward mean" + shape_name(s), mean_d.download(), mean_ref, 1e-5);
    compare(tag + " residual_layernorm_forward rstd" + shape_name(s), rstd_d.download(), rstd_ref, 1e-5);
    out_d.poison(); mean_d.poison(); rstd_d.poison();
    layernorm_forward(out_d.ptr, mean_d.ptr, rstd_d.ptr, residual_d.ptr, w_d.ptr, bias_d.ptr, N, C, stream);
    compare(tag + " layernorm_forward out" + shape_name(s), out_d.download(), out_ref, tolerance<floatX>().simple);

    // backward: dinp, dweight, dbias all accumulate; dweight and dbias adjacent as in the parameter layout
    auto dout = random_vector<floatX>((size_t)N * C), dinp = random_vector<floatX>((size_t)N * C);
    auto dwb = random_vector<floatX>(2 * C);
    std::vector<float> dinp_ref = dinp, dw_ref(dwb.begin(), dwb.begin() + C), db_ref(dwb.begin() + C, dwb.end());
    cpuref::layernorm_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), residual.data(), w.data(),
                               mean_ref.data(), rstd_ref.data(), N, C);
    std::vector<float> dwb_ref(dw_ref);
    dwb_ref.insert(dwb_ref.end(), db_ref.begin(), db_ref.end());
    DeviceBuffer<floatX> dout_d(dout), dinp_d(dinp), dwb_d(dwb);
    DeviceBuffer<float> scratch(layernorm_backward_scratch_floats(C));
    layernorm_backward(dinp_d.ptr, dwb_d.ptr, scratch.ptr, dout_d.ptr, residual_d.ptr, w_d.ptr, mean_d.ptr, rstd_d.ptr, N, C, stream);
    compare(tag + " layernorm_backward dinp" + shape_name(s), dinp_d.download(), dinp_ref, tolerance<floatX>().simple);
    compare(tag + " layernorm_backward dweight+dbias" + shape_name(s), dwb_d.download(), dwb_ref, tolerance<floatX>().simple);

    // the same with dinp_colsum, which gets the column sums of dinp as it was on entry (as the model takes a row-parallel
    // projection's bias gradient from it)
    auto colsum = random_vector<floatX>(C);
    std::vector<float> colsum_ref = colsum;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) colsum_ref[c] += dinp[(size_t)r * C + c];
    DeviceBuffer<floatX> dinp2_d(dinp), dwb2_d(dwb), colsum_d(colsum);
    layernorm_backward(dinp2_d.ptr, dwb2_d.ptr, scratch.ptr, dout_d.ptr, residual_d.ptr, w_d.ptr, mean_d.ptr, rstd_d.ptr, N, C,
                       stream, colsum_d.ptr);
    compare(tag + " layernorm_backward+colsum dinp" + shape_name(s), dinp2_d.download(), dinp_ref, tolerance<floatX>().simple);
    compare(tag + " layernorm_backward+colsum dweight+dbias" + shape_name(s), dwb2_d.download(), dwb_ref,
            tolerance<floatX>().simple);
    compare(tag + " layernorm_backward+colsum column sums" + shape_name(s), colsum_d.download(), colsum_ref,
            tolerance<floatX>().simple);
}

// RMSNorm (layernorm.cuh's RMSNorm instances) as test_layernorm tests LayerNorm: after the residual add and alone, the
// backward accumulating into dinp and dweight, and with dinp_colsum; one rounding of each output, so the simple
// tolerances (rstd, fp32 statistics against double: 1e-5). `scale` sizes the inputs: at 3e-3 or 1e-3, mean(x^2) is
// of the order of eps, so an eps dropped or misplaced fails the check.
template <typename floatX>
void test_rmsnorm(const Shape& s, float eps, float scale, const std::string& tag, cudaStream_t stream) {
    const int N = s.B * s.T, C = s.C;
    const std::string name = shape_name(s) + fmt(" eps %g", eps) + (scale != 1.0f ? fmt(" inputs x%g", scale) : "");
    const double tol = tolerance<floatX>().simple;
    auto a = random_vector<floatX>((size_t)N * C, scale), b = random_vector<floatX>((size_t)N * C, scale);
    auto w = random_vector<floatX>(C);
    // the reference normalises the rounded sum, as the kernel does
    std::vector<float> residual((size_t)N * C), out_ref((size_t)N * C), rstd_ref(N);
    cpuref::residual_forward(residual.data(), a.data(), b.data(), N * C);
    for (auto& x : residual) x = host_round<floatX>(x);
    cpuref::rmsnorm_forward(out_ref.data(), rstd_ref.data(), residual.data(), w.data(), N, C, eps);
    DeviceBuffer<floatX> a_d(a), b_d(b), w_d(w), residual_d(residual.size()), out_d(out_ref.size());
    DeviceBuffer<float> rstd_d(N);
    residual_rmsnorm_forward(residual_d.ptr, out_d.ptr, rstd_d.ptr, a_d.ptr, b_d.ptr, w_d.ptr, N, C, eps, stream);
    compare(tag + " residual_rmsnorm_forward residual" + name, residual_d.download(), residual, tol);
    compare(tag + " residual_rmsnorm_forward out" + name, out_d.download(), out_ref, tol);
    compare(tag + " residual_rmsnorm_forward rstd" + name, rstd_d.download(), rstd_ref, 1e-5);
    out_d.poison(); rstd_d.poison();
    rmsnorm_forward(out_d.ptr, rstd_d.ptr, residual_d.ptr, w_d.ptr, N, C, eps, stream);
    compare(tag + " rmsnorm_forward out" + name, out_d.download(), out_ref, tol);
    compare(tag + " rmsnorm_forward rstd" + name, rstd_d.download(), rstd_ref, 1e-5);

    // backward: dinp and dweight accumulate
    auto dout = random_vector<floatX>((size_t)N * C), dinp = random_vector<floatX>((size_t)N * C), dw = random_vector<floatX>(C);
    std::vector<float> dinp_ref = dinp, dw_ref = dw;
    cpuref::rmsnorm_backward(dinp_ref.data(), dw_ref.data(), dout.data(), residual.data(), w.data(), rstd_ref.data(), N, C);
    DeviceBuffer<floatX> dout_d(dout), dinp_d(dinp), dw_d(dw);
    DeviceBuffer<float> scratch(layernorm_backward_scratch_floats(C));
    rmsnorm_backward(dinp_d.ptr, dw_d.ptr, scratch.ptr, dout_d.ptr, residual_d.ptr, w_d.ptr, rstd_d.ptr, N, C, stream);
    compare(tag + " rmsnorm_backward dinp" + name, dinp_d.download(), dinp_ref, tol);
    compare(tag + " rmsnorm_backward dweight" + name, dw_d.download(), dw_ref, tol);

    // with dinp_colsum: the column sums of dinp as it was on entry
    auto colsum = random_vector<floatX>(C);
    std::vector<float> colsum_ref = colsum;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) colsum_ref[c] += dinp[(size_t)r * C + c];
    DeviceBuffer<floatX> dinp2_d(dinp), dw2_d(dw), colsum_d(colsum);
    rmsnorm_backward(dinp2_d.ptr, dw2_d.ptr, scratch.ptr, dout_d.ptr, residual_d.ptr, w_d.ptr, rstd_d.ptr, N, C, stream, colsum_d.ptr);
    compare(tag + " rmsnorm_backward+colsum dinp" + name, dinp2_d.download(), dinp_ref, tol);
    compare(tag + " rmsnorm_backward+colsum dweight" + name, dw2_d.download(), dw_ref, tol);
    compare(tag + " rmsnorm_backward+colsum column sums" + name, colsum_d.download(), colsum_ref, tol);
}

// SwiGLU over rows [gate | up] of 2F: forward, backward into a poisoned dinp, and the backward in place (dinp = inp),
// which must give the same bits. One rounding of each output from exact (already rounded) inputs: the simple tolerances.
// Gates of +-100 and -90 reach exp's overflow (silu = -0, silu' = 0) and saturation (silu = x, silu' = 1).
template <typename floatX>
void test_swiglu(int N, int F, const std::string& tag, cudaStream_t stream) {
    const std::string shape = " N" + std::to_string(N) + " F" + std::to_string(F);
    auto inp = random_vector<floatX>((size_t)N * 2 * F, 2.0f), dout = random_vector<floatX>((size_t)N * F);
    inp[0] = -100.0f;  // gates: row 0's first two, the last row's last
    inp[1] = 100.0f;
    inp[(size_t)(N - 1) * 2 * F + F - 1] = -90.0f;
    std::vector<float> out_ref((size_t)N * F), dinp_ref((size_t)N * 2 * F, 0.0f);
    cpuref::swiglu_forward(out_ref.data(), inp.data(), N, F);
    cpuref::swiglu_backward(dinp_ref.data(), inp.data(), dout.data(), N, F);
    DeviceBuffer<floatX> inp_d(inp), out_d(out_ref.size()), dout_d(dout), dinp_d(dinp_ref.size());
    swiglu_forward(out_d.ptr, inp_d.ptr, N, F, stream);
    compare(tag + " swiglu_forward" + shape, out_d.download(), out_ref, tolerance<floatX>().simple);
    swiglu_backward(dinp_d.ptr, inp_d.ptr, dout_d.ptr, N, F, stream);
    const std::vector<float> dinp = dinp_d.download();
    compare(tag + " swiglu_backward" + shape, dinp, dinp_ref, tolerance<floatX>().simple);
    swiglu_backward(inp_d.ptr, inp_d.ptr, dout_d.ptr, N, F, stream);
    const std::vector<float> in_place = inp_d.download();
    expect(memcmp(in_place.data(), dinp.data(), dinp.size() * sizeof(float)) == 0,
           tag + " swiglu_backward in place (dinp = inp) gives the same bits" + shape, "it differs from the backward into another buffer");
}

// RoPE on a qkv buffer of B x T rows [q: Hq D | k: Hkv D | v: Hkv D] at positions offset + t; factor 0: no scaling,
// else Llama 3's (factor, low 1, high 4, original 8192).
struct RopeCase { int B, T, Hq, Hkv, D, offset; float theta, factor; };
static std::string rope_name(const RopeCase& r) {
    return " B" + std::to_string(r.B) + " T" + std::to_string(r.T) + " Hq" + std::to_string(r.Hq) + " Hkv" + std::to_string(r.Hkv) +
           " D" + std::to_string(r.D) + " pos+" + std::to_string(r.offset) + fmt(" theta %g", r.theta) +
           (r.factor != 0 ? fmt(" llama3 x%g", r.factor) : "");
}
static RopeScaling llama3_scaling(float factor) {
    RopeScaling scaling;  // low 1, high 4, 8192 positions: Llama 3's
    scaling.factor = factor;
    return scaling;
}

// cpuref's rope_forward (or rope_backward) of qkv's q and k heads, v copied. cpuref rotates positions 0 .. T' - 1 of a
// (B, T', H, D) tensor: positions offset .. offset + T - 1 are the last T of T' = offset + T (the rows before, zero).
static std::vector<float> rope_reference(const std::vector<float>& qkv, const float* inv_freq, const RopeCase& r, bool backward) {
    const int W = (r.Hq + 2 * r.Hkv) * r.D, Tp = r.offset + r.T;
    std::vector<float> out = qkv;
    for (int part = 0; part < 2; part++) {
        const int H = part == 0 ? r.Hq : r.Hkv, col0 = part == 0 ? 0 : r.Hq * r.D, width = H * r.D;
        std::vector<float> x((size_t)r.B * Tp * width, 0.0f), y(x.size(), 0.0f);
        for (int b = 0; b < r.B; b++)
            for (int t = 0; t < r.T; t++)
                std::copy_n(qkv.begin() + ((size_t)b * r.T + t) * W + col0, width, x.begin() + ((size_t)b * Tp + r.offset + t) * width);
        if (backward) cpuref::rope_backward(y.data(), x.data(), inv_freq, r.B, Tp, H, r.D);  // y starts at 0: y = R^T x
        else cpuref::rope_forward(y.data(), x.data(), inv_freq, r.B, Tp, H, r.D);
        for (int b = 0; b < r.B; b++)
            for (int t = 0; t < r.T; t++)
                std::copy_n(y.begin() + ((size_t)b * Tp + r.offset + t) * width, width, out.begin() + ((size_t)b * r.T + t) * W + col0);
    }
    return out;
}
// Whether columns [from, W) of every row of a and b hold the same bits (v, which RoPE leaves alone).
static bool same_columns(const std::vector<float>& a, const std::vector<float>& b, int W, int from) {
    for (size_t row = 0; row < a.size() / W; row++)
        if (memcmp(a.data() + row * W + from, b.data() + row * W + from, (size_t)(W - from) * sizeof(float)) != 0) return false;
    return true;
}

// rope_forward and rope_backward against cpuref's on the same fp32 table (rope_inv_freq's; test_rope_frequencies checks it),
// v bitwise untouched, and the backward undoing the forward. The angle is the same fp32 product on both sides; cos and sin
// differ by an ulp or two (sincosf against double, rounded), so fp32 outputs by ~1e-7, under the simple 1e-5; bf16 and
// fp16 round each output once, the round trip twice (2 x 2^-9 relative at most in bf16): the simple tolerances.
template <typename floatX>
void test_rope(const RopeCase& r, const std::string& tag, cudaStream_t stream) {
    const std::string name = rope_name(r);
    const double tol = tolerance<floatX>().simple;
    const int N = r.B * r.T, W = (r.Hq + 2 * r.Hkv) * r.D, qk = (r.Hq + r.Hkv) * r.D;
    const std::vector<float> inv_freq = rope_inv_freq(r.D, r.theta, llama3_scaling(r.factor));
    const auto qkv = random_vector<floatX>((size_t)N * W), dqkv = random_vector<floatX>((size_t)N * W);
    DeviceBuffer<float> inv_freq_d(inv_freq);
    DeviceBuffer<floatX> qkv_d(qkv), dqkv_d(dqkv);
    rope_forward(qkv_d.ptr, inv_freq_d.ptr, r.B, r.T, r.Hq, r.Hkv, r.D, r.offset, stream);
    const std::vector<float> rotated = qkv_d.download();
    compare(tag + " rope_forward" + name, rotated, rope_reference(qkv, inv_freq.data(), r, false), tol);
    expect(same_columns(rotated, qkv, W, qk), tag + " rope_forward leaves v untouched" + name, "v changed");
    rope_backward(dqkv_d.ptr, inv_freq_d.ptr, r.B, r.T, r.Hq, r.Hkv, r.D, r.offset, stream);
    const std::vector<float> back = dqkv_d.download();
    compare(tag + " rope_backward" + name, back, rope_reference(dqkv, inv_freq.data(), r, true), tol);
    expect(same_columns(back, dqkv, W, qk), tag + " rope_backward leaves dv untouched" + name, "dv changed");
    rope_backward(qkv_d.ptr, inv_freq_d.ptr, r.B, r.T, r.Hq, r.Hkv, r.D, r.offset, stream);
    compare(tag + " rope_backward(rope_forward(x)) = x" + name, qkv_d.download(), qkv, tol);
}

// The inverse frequencies (host code): rope_inv_freq against cpuref's rope_frequencies (the same steps: within an ulp),
// and Llama 3's scaling by its definition: frequencies of wavelengths under original / high_freq_factor as unscaled,
// over original / low_freq_factor divided by the factor exactly (the factors here are powers of two), and those
// between strictly between the two.
static void test_rope_frequencies(int D, float theta, const RopeScaling& scaling) {
    const bool scaled = scaling.factor != 0;
    const std::string name = " D" + std::to_string(D) + fmt(" theta %g", theta) +
                             (scaled ? fmt(" llama3 x%g low %g high %g", scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor) +
                                           " original " + std::to_string(scaling.original_max_positions)
                                     : "");
    const std::vector<float> ours = rope_inv_freq(D, theta, scaling);
    const cpuref::RopeScaling ref_scaling{scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
                                          scaling.original_max_positions};
    std::vector<float> ref(D / 2);
    cpuref::rope_frequencies(ref.data(), D, theta, scaled ? &ref_scaling : nullptr);
    double worst = 0.0;
    for (int i = 0; i < D / 2; i++) worst = std::max(worst, std::fabs((double)ours[i] - ref[i]) / ref[i]);
    check(worst <= 0x1p-23, "rope_inv_freq equals cpuref's rope_frequencies" + name,
          fmt("largest relative difference %.3g (tolerance an ulp, 1.2e-7)", worst));
    if (!scaled) return;
    const std::vector<float> plain = rope_inv_freq(D, theta, RopeScaling{});
    const double shortest_scaled = (double)scaling.original_max_positions / scaling.high_freq_factor;
    const double longest_blended = (double)scaling.original_max_positions / scaling.low_freq_factor;
    int wrong = 0, kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < D / 2; i++) {
        const double wavelength = 2 * M_PI / plain[i];
        if (wavelength < shortest_scaled) {
            wrong += ours[i] != plain[i];
            kept++;
        } else if (wavelength > longest_blended) {
            wrong += ours[i] != plain[i] / scaling.factor;
            divided++;
        } else {
            wrong += !(ours[i] > plain[i] / scaling.factor && ours[i] < plain[i]);
            blended++;
        }
    }
    check(wrong == 0 && kept > 0 && divided > 0 && blended > 0, "rope_inv_freq's llama3 scaling by its definition" + name,
          fmt("%.0f kept, %.0f divided, %.0f blended", kept, divided, blended) + fmt(", %.0f wrong", wrong));
}

template <typename floatX>
void test_matmul(int N, int C, int OC, const std::string& tag, cudaStream_t stream) {
    auto inp = random_vector<floatX>((size_t)N * C), w = random_vector<floatX>((size_t)OC * C, 0.05f);
    auto bias = random_vector<floatX>(OC);
    std::vector<float> out_ref((size_t)N * OC);
    cpuref::matmul_forward(out_ref.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    DeviceBuffer<floatX> inp_d(inp), w_d(w), bias_d(bias), out_d(out_ref.size());
    matmul_forward(out_d.ptr, inp_d.ptr, w_d.ptr, bias_d.ptr, N, C, OC, stream);
    std::string shape = " " + std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC);
    compare(tag + " matmul_forward" + shape, out_d.download(), out_ref, tolerance<floatX>().simple);

    auto dout = random_vector<floatX>((size_t)N * OC);
    auto dw = random_vector<floatX>(w.size()), db = random_vector<floatX>(OC);
    std::vector<float> dinp_ref(inp.size(), 0.0f), dw_ref = dw, db_ref = db;
    cpuref::matmul_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), inp.data(), w.data(), N, C, OC);
    DeviceBuffer<floatX> dout_d(dout), dinp_d(inp.size()), dw_d(dw), db_d(db);
    DeviceBuffer<float> scratch(bias_backward_scratch_floats<floatX>(OC));
    matmul_backward(dinp_d.ptr, dw_d.ptr, db_d.ptr, scratch.ptr, dout_d.ptr, inp_d.ptr, w_d.ptr, N, C, OC, stream);
    compare(tag + " matmul_backward dinp" + shape, dinp_d.download(), dinp_ref, tolerance<floatX>().simple);
    compare(tag + " matmul_backward dweight" + shape, dw_d.download(), dw_ref, tolerance<floatX>().simple);
    compare(tag + " matmul_backward dbias" + shape, db_d.download(), db_ref, tolerance<floatX>().simple);

    // bias_backward over a column slice of dout (its last OC / 2 columns, rows OC apart), as the model takes the
    // qkv bias gradient's query part from dqkv
    const int half = OC / 2 / 8 * 8;
    if (half > 0) {
        std::vector<float> slice_ref(db.begin(), db.begin() + half);
        for (int r = 0; r < N; r++)
            for (int c = 0; c < half; c++) slice_ref[c] += dout[(size_t)r * OC + OC - half + c];
        DeviceBuffer<floatX> slice_d(std::vector<float>(db.begin(), db.begin() + half));
        bias_backward(slice_d.ptr, scratch.ptr, dout_d.ptr + (OC - half), N, half, stream, OC);
        compare(tag + " bias_backward of a column slice" + shape, slice_d.download(), slice_ref, tolerance<floatX>().simple);
    }
}

// out[K] += (the sum of P partial rows, C wide) weight[C, K]: the qkv bias's value part from the LayerNorm
// backward's column-sum partials (the model's use: P = layernorm_backward_blocks(), C = channels, K = this rank's
// heads x head size)
template <typename floatX>
void test_colsum_times_weight(int P, int C, int K, const std::string& tag, cudaStream_t stream) {
    auto partials = random_vector<float>((size_t)P * C), w = random_vector<floatX>((size_t)C * K, 0.05f);
    auto out = random_vector<floatX>(K);
    std::vector<double> colsum(C, 0.0);
    for (int p = 0; p < P; p++)
        for (int c = 0; c < C; c++) colsum[c] += partials[(size_t)p * C + c];
    std::vector<float> out_ref(K);
    for (int k = 0; k < K; k++) {
        double acc = out[k];
        for (int c = 0; c < C; c++) acc += colsum[c] * w[(size_t)c * K + k];
        out_ref[k] = (float)acc;
    }
    DeviceBuffer<float> partials_d(partials), scratch(colsum_times_weight_scratch_floats(C, K));
    DeviceBuffer<floatX> w_d(w), out_d(out);
    colsum_times_weight(out_d.ptr, scratch.ptr, partials_d.ptr, P, w_d.ptr, C, K, stream);
    compare(tag + " colsum_times_weight " + std::to_string(P) + "x" + std::to_string(C) + "x" + std::to_string(K),
            out_d.download(), out_ref, tolerance<floatX>().simple);
}

template <typename floatX>
void test_gelu(size_t n, const std::string& tag, cudaStream_t stream) {
    auto x = random_vector<floatX>(n, 2.0f), dout = random_vector<floatX>(n);
    std::vector<float> y_ref(n), dx_ref(n, 0.0f);
    cpuref::gelu_forward(y_ref.data(), x.data(), (int)n);
    cpuref::gelu_backward(dx_ref.data(), x.data(), dout.data(), (int)n);
    DeviceBuffer<floatX> x_d(x), y_d(n), dout_d(dout), dx_d(n);
    gelu_forward(y_d.ptr, x_d.ptr, (long)n, stream);
    gelu_backward(dx_d.ptr, x_d.ptr, dout_d.ptr, (long)n, stream);
    compare(tag + " gelu_forward n=" + std::to_string(n), y_d.download(), y_ref, tolerance<floatX>().simple);
    compare(tag + " gelu_backward n=" + std::to_string(n), dx_d.download(), dx_ref, tolerance<floatX>().simple);
}

// The MLP's GELU in the products' epilogues. Forward (C -> OC): pre = inp W^T + b and out = gelu(pre), the GELU
// of the unrounded pre-activation, as the epilogue takes it. Backward through a Linear OC -> C whose input was
// gelu(pre): dinp = (dout W) * gelu'(pre), pre as stored (rounded). OC, the GELU's width, is a multiple of 8.
template <typename floatX>
void test_matmul_gelu(int N, int C, int OC, const std::string& tag, cudaStream_t stream) {
    const std::string shape = " " + std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC);
    if (!matmul_gelu_epilogues<floatX>()) {
        skip(tag + " matmul GELU epilogues" + shape, "kFuseGeluInFp32 is off: fp32 runs the GELU kernels instead");
        return;
    }
    auto inp = random_vector<floatX>((size_t)N * C), w = random_vector<floatX>((size_t)OC * C, 0.05f);
    auto bias = random_vector<floatX>(OC);
    std::vector<float> pre_ref((size_t)N * OC), out_ref(pre_ref.size());
    cpuref::matmul_forward(pre_ref.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    cpuref::gelu_forward(out_ref.data(), pre_ref.data(), (int)pre_ref.size());
    DeviceBuffer<floatX> inp_d(inp), w_d(w), bias_d(bias), pre_d(pre_ref.size()), out_d(out_ref.size());
    matmul_forward_gelu(out_d.ptr, pre_d.ptr, inp_d.ptr, w_d.ptr, bias_d.ptr, N, C, OC, stream);
    compare(tag + " matmul_forward_gelu pre-activation" + shape, pre_d.download(), pre_ref, tolerance<floatX>().simple);
    compare(tag + " matmul_forward_gelu gelu" + shape, out_d.download(), out_ref, tolerance<floatX>().simple);

    auto pre = random_vector<floatX>((size_t)N * OC, 2.0f), x = random_vector<floatX>((size_t)N * OC);
    auto w2 = random_vector<floatX>((size_t)C * OC, 0.05f), dout = random_vector<floatX>((size_t)N * C);
    auto dw = random_vector<floatX>(w2.size()), db = random_vector<floatX>(C);
    std::vector<float> dx(pre.size(), 0.0f), dpre_ref(pre.size(), 0.0f), dw_ref = dw, db_ref = db;
    cpuref::matmul_backward(dx.data(), dw_ref.data(), db_ref.data(), dout.data(), x.data(), w2.data(), N, OC, C);
    cpuref::gelu_backward(dpre_ref.data(), pre.data(), dx.data(), (int)pre.size());
    DeviceBuffer<floatX> pre2_d(pre), x_d(x), w2_d(w2), dout_d(dout), dw_d(dw), db_d(db), dpre_d(pre.size());
    DeviceBuffer<float> scratch(bias_backward_scratch_floats<floatX>(C));
    matmul_backward(dpre_d.ptr, dw_d.ptr, db_d.ptr, scratch.ptr, dout_d.ptr, x_d.ptr, w2_d.ptr, N, OC, C, stream, pre2_d.ptr);
    compare(tag + " matmul_backward with gelu_inp dinp" + shape, dpre_d.download(), dpre_ref, tolerance<floatX>().simple);
    compare(tag + " matmul_backward with gelu_inp dweight" + shape, dw_d.download(), dw_ref, tolerance<floatX>().simple);
    compare(tag + " matmul_backward with gelu_inp dbias" + shape, db_d.download(), db_ref, tolerance<floatX>().simple);
}

// The dense softmax cross-entropy of (N, Vp) logits (real columns < V) on the CPU: losses and the logits gradient
// for dloss; and the targets on the device.
// With `ignored`, every third row's target (not the first's or the last's, which pin the first and last columns) is
// kIgnoredTarget, as masked chat data serves them; the reference gives those rows loss 0 and no gradient.
void ignore_every_third_target(std::vector<int>& targets) {
    for (size_t i = 1; i + 1 < targets.size(); i += 3) targets[i] = kIgnoredTarget;
}
// The entries of rows with an ignored target that are not exactly 0 (NaN counts too): losses (N) or gradient rows
// (N, stride).
long nonzero_in_ignored_rows(const std::vector<float>& values, const std::vector<int>& targets, size_t stride) {
    long nonzero = 0;
    for (size_t i = 0; i < targets.size(); i++)
        if (targets[i] == kIgnoredTarget)
            for (size_t j = 0; j < stride; j++) nonzero += values[i * stride + j] != 0.0f;
    return nonzero;
}
struct ClassifierReference {
    std::vector<float> losses, dlogits;
    int* targets_d = nullptr;
    ClassifierReference(const std::vector<float>& logits, const std::vector<int>& targets, float dloss, int N, int V, int Vp)
        : losses(N), dlogits((size_t)N * Vp, 0.0f) {
        std::vector<float> probs((size_t)N * Vp);
        cpuref::softmax_crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), N, V, Vp);
        cpuref::softmax_crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss, N, V, Vp);
        cudaCheck(cudaMalloc(&targets_d, N * sizeof(int)));
        cudaCheck(cudaMemcpy(targets_d, targets.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    }
    ~ClassifierReference() { cudaFree(targets_d); }
};

template <typename floatX>
void test_classifier(int N, int V, const std::string& tag, cudaStream_t stream, bool ignored = false) {
    const int Vp = (V + 127) / 128 * 128;
    auto logits = random_vector<floatX>((size_t)N * Vp, 3.0f);
    std::uniform_int_distribution<int> token(0, V - 1);
    std::vector<int> targets(N);
    for (auto& t : targets) t = token(rng);
    targets.front() = 0;     // the first column
    targets.back() = V - 1;  // the last real column
    if (ignored) ignore_every_third_target(targets);
    const float dloss = 1.0f / cpuref::counted_targets(targets.data(), N);
    const ClassifierReference ref(logits, targets, dloss, N, V, Vp);
    const std::vector<float>& losses_ref = ref.losses;
    const std::vector<float>& dlogits_ref = ref.dlogits;
    const int* targets_d = ref.targets_d;
    DeviceBuffer<floatX> logits_d(logits);
    DeviceBuffer<float> losses_d(N);
    fused_classifier(logits_d.ptr, losses_d.ptr, targets_d, 0.0f, N, V, Vp, stream);
    const std::string shape = " N" + std::to_string(N) + " V" + std::to_string(V) +
                              (fused_classifier_is_single_pass<floatX>(Vp) ? " single-pass" : " two-pass") +
                              (ignored ? " with ignored targets" : "");
    compare(tag + " fused_classifier losses" + shape, losses_d.download(), losses_ref, 1e-5);
    compare(tag + " fused_classifier keeps logits when dloss=0" + shape, logits_d.download(), logits, 0.0);
    losses_d.poison();
    fused_classifier(logits_d.ptr, losses_d.ptr, targets_d, dloss, N, V, Vp, stream);
    const std::vector<float> losses = losses_d.download(), dlogits = logits_d.download();
    compare(tag + " fused_classifier losses (with gradient)" + shape, losses, losses_ref, 1e-5);
    compare(tag + " fused_classifier dlogits" + shape, dlogits, dlogits_ref, tolerance<floatX>().simple);
    if (!ignored) return;
    const long nonzero = nonzero_in_ignored_rows(losses, targets, 1) + nonzero_in_ignored_rows(dlogits, targets, Vp);
    expect(nonzero == 0, tag + " fused_classifier ignored rows: loss and gradient exactly 0" + shape,
           fmt("%.0f entries not 0", (double)nonzero));
}

// Vocabulary-parallel cross-entropy against the dense reference: the (N, Vp) logits split by columns into tp ranges
// of Vl = Vp / tp, one per tensor-parallel "rank", with the collectives between the passes emulated on the host
// (max over ranks of stats[0, N), sum over ranks of stats[N, 3N)). Every rank's losses must be the dense losses,
// and the ranks' gradient columns side by side the dense gradient, padded columns exactly 0.
template <typename floatX>
void test_vocab_parallel_classifier(int N, int V, int Vp, int tp, const std::string& tag, cudaStream_t stream,
                                    bool ignored = false) {
    const int Vl = Vp / tp;
    const std::string name = " N" + std::to_string(N) + " V" + std::to_string(V) + " Vp" + std::to_string(Vp) + " tp" +
                             std::to_string(tp) + (ignored ? " with ignored targets" : "");
    auto logits = random_vector<floatX>((size_t)N * Vp, 3.0f);  // padded columns random too: they must be ignored
    std::uniform_int_distribution<int> token(0, V - 1);
    std::vector<int> targets(N);
    for (auto& t : targets) t = token(rng);
    // a target in every rank that holds real columns (its last real one), and the first and last real columns
    // (rows 0 .. tp-1, N-2 and N-1: N > tp + 1)
    for (int r = 0; r < tp && r * Vl < V; r++) targets[r % N] = std::min((r + 1) * Vl, V) - 1;
    targets[N - 1] = V - 1;
    targets[N - 2] = 0;
    if (ignored)  // rows 2, 5, ... below N - 2: not the rows pinned above when tp <= 2
        for (int i = 2; i < N - 2; i += 3) targets[i] = kIgnoredTarget;
    const float dloss = 1.0f / cpuref::counted_targets(targets.data(), N);
    const ClassifierReference ref(logits, targets, dloss, N, V, Vp);
    const std::vector<float>& losses_ref = ref.losses;
    const std::vector<float>& dlogits_ref = ref.dlogits;
    const int* targets_d = ref.targets_d;

    // rank r's logits: columns [r * Vl, (r + 1) * Vl) of every row
    std::vector<std::vector<float>> local_logits(tp, std::vector<float>((size_t)N * Vl));
    std::vector<std::unique_ptr<DeviceBuffer<floatX>>> logits_d;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> stats_d, losses_d;
    for (int r = 0; r < tp; r++) {
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vl; j++) local_logits[r][(size_t)i * Vl + j] = logits[(size_t)i * Vp + r * Vl + j];
        logits_d.emplace_back(new DeviceBuffer<floatX>(local_logits[r]));
        stats_d.emplace_back(new DeviceBuffer<float>(3 * N));
        losses_d.emplace_back(new DeviceBuffer<float>(N));
    }

    // pass 1, checked against each rank's statistics computed on the host in double: maxima and target logits
    // exactly (no arithmetic), sums to 1e-5; a row without real columns {-FLT_MAX, 0}
    std::vector<std::vector<float>> stats(tp);
    std::vector<float> global_max(N, -FLT_MAX);
    for (int r = 0; r < tp; r++) {
        vocab_parallel_stats(logits_d[r]->ptr, stats_d[r]->ptr, targets_d, N, r * Vl, Vl, V, stream);
        stats[r] = stats_d[r]->download();
        const int real = std::min(std::max(V - r * Vl, 0), Vl);
        std::vector<float> max_ref(N, -FLT_MAX), sum_ref(N, 0.0f), target_ref(N, 0.0f);
        for (int i = 0; i < N; i++) {
            const float* x = local_logits[r].data() + (size_t)i * Vl;
            for (int j = 0; j < real; j++) max_ref[i] = std::max(max_ref[i], x[j]);
            double sum = 0.0;
            for (int j = 0; j < real; j++) sum += std::exp((double)x[j] - max_ref[i]);
            sum_ref[i] = (float)sum;
            if (targets[i] >= r * Vl && targets[i] < (r + 1) * Vl) target_ref[i] = x[targets[i] - r * Vl];
            global_max[i] = std::max(global_max[i], stats[r][i]);
        }
        const std::string rank = " rank " + std::to_string(r) + (real == 0 ? " (no real column)" : "");
        compare(tag + " vocab_parallel_stats max" + name + rank,
                std::vector<float>(stats[r].begin(), stats[r].begin() + N), max_ref, 0.0);
        compare(tag + " vocab_parallel_stats sum" + name + rank,
                std::vector<float>(stats[r].begin() + N, stats[r].begin() + 2 * N), sum_ref, 1e-5);
        compare(tag + " vocab_parallel_stats target logit" + name + rank,
                std::vector<float>(stats[r].begin() + 2 * N, stats[r].end()), target_ref, 0.0);
    }

    // "all-reduce" max; pass 2; "all-reduce" sum of [N, 3N), into every rank's statistics
    DeviceBuffer<float> global_max_d(global_max);
    std::vector<float> reduced(2 * N, 0.0f);
    for (int r = 0; r < tp; r++) {
        vocab_parallel_rescale(stats_d[r]->ptr, global_max_d.ptr, N, stream);
        stats[r] = stats_d[r]->download();
        for (int i = 0; i < 2 * N; i++) reduced[i] += stats[r][N + i];
    }
    std::vector<float> sum_ref(N);  // the dense sum of exp(x - global max) over the real columns
    for (int i = 0; i < N; i++) {
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += std::exp((double)logits[(size_t)i * Vp + j] - global_max[i]);
        sum_ref[i] = (float)sum;
    }
    compare(tag + " vocab_parallel_rescale sum over ranks" + name, std::vector<float>(reduced.begin(), reduced.begin() + N),
            sum_ref, 1e-5);
    for (int r = 0; r < tp; r++) {
        std::copy(reduced.begin(), reduced.end(), stats[r].begin() + N);
        stats_d[r]->upload(stats[r]);
    }

    // pass 3, first without the gradient (logits kept), then with it; every rank's losses are the dense ones, and
    // bitwise the same on every rank (the same inputs)
    std::vector<std::vector<float>> losses(tp);
    for (int r = 0; r < tp; r++) {
        vocab_parallel_loss(logits_d[r]->ptr, losses_d[r]->ptr, targets_d, stats_d[r]->ptr, global_max_d.ptr, 0.0f, N,
                            r * Vl, Vl, V, stream);
        const std::string rank = " rank " + std::to_string(r);
        compare(tag + " vocab_parallel_loss losses (dloss=0)" + name + rank, losses_d[r]->download(), losses_ref, 1e-5);
        compare(tag + " vocab_parallel_loss keeps logits when dloss=0" + name + rank, logits_d[r]->download(),
                local_logits[r], 0.0);
        losses_d[r]->poison();
    }
    std::vector<float> dlogits((size_t)N * Vp);
    for (int r = 0; r < tp; r++) {
        vocab_parallel_loss(logits_d[r]->ptr, losses_d[r]->ptr, targets_d, stats_d[r]->ptr, global_max_d.ptr, dloss, N,
                            r * Vl, Vl, V, stream);
        losses[r] = losses_d[r]->download();
        compare(tag + " vocab_parallel_loss losses (with gradient)" + name + " rank " + std::to_string(r), losses[r],
                losses_ref, 1e-5);
        const std::vector<float> local = logits_d[r]->download();
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vl; j++) dlogits[(size_t)i * Vp + r * Vl + j] = local[(size_t)i * Vl + j];
    }
    bool same = true;
    for (int r = 1; r < tp; r++) same = same && memcmp(losses[r].data(), losses[0].data(), N * sizeof(float)) == 0;
    expect(same, tag + " vocab_parallel_loss losses bitwise equal on every rank" + name, "the ranks' losses differ");
    compare(tag + " vocab_parallel_loss dlogits" + name, dlogits, dlogits_ref, tolerance<floatX>().simple);
    long nonzero_padding = 0;
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++) nonzero_padding += dlogits[(size_t)i * Vp + j] != 0.0f;  // NaN counts too
    expect(nonzero_padding == 0, tag + " vocab_parallel_loss dlogits padded columns are 0" + name,
           fmt("%.0f padded gradient entries not 0", (double)nonzero_padding));
    if (!ignored) return;
    long nonzero = nonzero_in_ignored_rows(dlogits, targets, Vp);
    for (int r = 0; r < tp; r++) nonzero += nonzero_in_ignored_rows(losses[r], targets, 1);
    expect(nonzero == 0, tag + " vocab_parallel_loss ignored rows: loss and gradient exactly 0" + name,
           fmt("%.0f entries not 0", (double)nonzero));
}

template <typename floatX>
void test_optimizer(size_t n, const std::string& tag, cudaStream_t stream) {
    auto master = random_vector<float>(n), grad = random_vector<floatX>(n, 0.1f);
    auto m = random_vector<float>(n, 0.01f), v = random_vector<float>(n, 0.01f);
    for (auto& x : v) x = fabsf(x);
    std::vector<float> params(n);
    for (size_t i = 0; i < n; i++) params[i] = host_round<floatX>(master[i]);
    const bool has_master = !std::is_same<floatX, float>::value;
    // everything decays in this test's mask; the layout's mask itself is covered by the model test
    LayoutMask mask;
    mask.head_end = (long)n;
    AdamWHyper h{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.0f, 1.0f, 3, 42};  // no clipping, no loss scale: gradients as given
    std::vector<float> p_ref = has_master ? master : params, m_ref = m, v_ref = v;
    cpuref::adamw_update(p_ref.data(), grad.data(), m_ref.data(), v_ref.data(), n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.t);
    DeviceBuffer<floatX> params_d(params), grad_d(grad);
    DeviceBuffer<float> master_d(master), m_d(m), v_d(v);
    DeviceBuffer<float> any_norm(std::vector<float>{1.0f});  // finite: not skipped; unclipped, so its value does not matter
    adamw_update(params_d.ptr, has_master ? master_d.ptr : nullptr, grad_d.ptr, m_d.ptr, v_d.ptr, (long)n, 0, h, any_norm.ptr,
                 mask, stream);
    const std::string size = " n=" + std::to_string(n);
    compare(tag + " adamw m" + size, m_d.download(), m_ref, 1e-6);
    compare(tag + " adamw v" + size, v_d.download(), v_ref, 1e-6);
    if (has_master) compare(tag + " adamw master" + size, master_d.download(), p_ref, 1e-6);
    compare(tag + " adamw params" + size, params_d.download(), p_ref, tolerance<floatX>().simple);

    DeviceBuffer<float> norm_d(1), scratch(global_norm_scratch_floats());
    global_norm_squared(norm_d.ptr, grad_d.ptr, (long)n, scratch.ptr, stream);
    const double expected = cpuref::global_norm(grad.data(), n);
    const double got = sqrt(norm_d.download()[0]);
    char buf[128];
    snprintf(buf, sizeof(buf), "got %.7g expected %.7g", got, expected);
    check(fabs(got - expected) <= 1e-5 * expected, tag + " global_norm" + size, buf);
}

// The CPU AdamW (kernels/adamw_cpu.h, ZeRO-Offload's) against adamw_update on the same inputs, bit for bit, with each
// path the host has: a shard at a global offset (a multiple of 4) of odd length, decay in runs that cut groups of 4,
// clipping active (and fp16's loss scale), subnormal v and squared gradients. A NaN would compare unequal: the inputs
// make none.
template <typename floatX> struct CpuType { using type = floatX; };
template <> struct CpuType<__nv_bfloat16> { using type = adamw_cpu::Bf16; };
template <> struct CpuType<__half> { using type = adamw_cpu::Fp16; };
template <typename floatX>
void test_adamw_cpu_bitwise(const std::string& tag, cudaStream_t stream) {
    using Cpu = typename CpuType<floatX>::type;
    static_assert(sizeof(Cpu) == sizeof(floatX), "the CPU type has the GPU type's bits");
    const long n = 100003, index_offset = 40004;
    const bool has_master = !std::is_same<floatX, float>::value;
    const float loss_scale = std::is_same<floatX, __half>::value ? 1024.0f : 1.0f;
    const AdamWHyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, loss_scale, 7, 1234};
    const float norm_squared = 16.0f * loss_scale * loss_scale;  // a norm of 4 against a clip of 1
    LayoutMask mask;
    mask.head_end = index_offset + 10;
    mask.blocks_begin = index_offset + 13;
    mask.block_size = 29;
    mask.blocks_end = index_offset + 13 + 29 * 3000;
    mask.num_ranges = 3;
    mask.range_begin[0] = 0, mask.range_end[0] = 1;
    mask.range_begin[1] = 5, mask.range_end[1] = 8;
    mask.range_begin[2] = 14, mask.range_end[2] = 27;
    const std::vector<float> master = random_vector<float>(n, 0.1f);
    std::vector<float> grad = random_vector<floatX>(n, 0.01f), m = random_vector<float>(n, 1e-3f), v = random_vector<float>(n, 1e-5f);
    for (long i = 0; i < n; i++) {
        v[i] = i % 10 == 0 ? 1e-40f : fabsf(v[i]);
        if (i % 10 == 1) grad[i] = host_round<floatX>(1e-22f * grad[i]);  // a subnormal square (0 in fp16)
    }
    std::vector<float> params(n);
    for (long i = 0; i < n; i++) params[i] = host_round<floatX>(master[i]);

    DeviceBuffer<floatX> params_d(params), grad_d(grad);
    DeviceBuffer<float> master_d(master), m_d(m), v_d(v), norm_d(std::vector<float>{norm_squared});
    adamw_update(params_d.ptr, has_master ? master_d.ptr : nullptr, grad_d.ptr, m_d.ptr, v_d.ptr, n, index_offset, h, norm_d.ptr,
                 mask, stream);
    const std::vector<float> gpu_params = params_d.download(), gpu_master = master_d.download(), gpu_m = m_d.download(),
                             gpu_v = v_d.download();

    std::vector<floatX> grad_raw(n);
    for (long i = 0; i < n; i++) grad_raw[i] = from_host_float<floatX>(grad[i]);
    for (adamw_cpu::Isa isa : {adamw_cpu::Isa::Scalar, adamw_cpu::Isa::Avx2, adamw_cpu::Isa::Avx512}) {
        const std::string name = tag + " adamw on the CPU (" + adamw_cpu::isa_name(isa) + ") equals the GPU bit for bit";
        if (!adamw_cpu::isa_supported(isa)) {
            skip(name, std::string("this CPU has no ") + adamw_cpu::isa_name(isa));
            continue;
        }
        std::vector<floatX> params_raw(n);
        for (long i = 0; i < n; i++) params_raw[i] = from_host_float<floatX>(params[i]);
        std::vector<float> cpu_master = master, cpu_m = m, cpu_v = v;
        adamw_cpu::update(reinterpret_cast<Cpu*>(params_raw.data()), has_master ? cpu_master.data() : nullptr,
                          reinterpret_cast<const Cpu*>(grad_raw.data()), cpu_m.data(), cpu_v.data(), 0, n, index_offset,
                          adamw_cpu::make_step(h, norm_squared), mask, 0, isa);
        const std::vector<float> cpu_params = host_floats(params_raw);  // exact: compares the bits
        long differ = 0, first = -1;
        for (long i = 0; i < n; i++) {
            const bool same = memcmp(&cpu_params[i], &gpu_params[i], 4) == 0 && memcmp(&cpu_m[i], &gpu_m[i], 4) == 0 &&
                              memcmp(&cpu_v[i], &gpu_v[i], 4) == 0 && (!has_master || memcmp(&cpu_master[i], &gpu_master[i], 4) == 0);
            if (!same && differ++ == 0) first = i;
        }
        check(differ == 0, name, differ == 0 ? fmt("m, v, master and parameters of %.0f elements", (double)n)
                                            : fmt("%.0f elements differ, the first at %.0f", (double)differ, (double)first) +
                                                  fmt(" (parameter %a on the CPU, %a on the GPU)", cpu_params[first], gpu_params[first]));
    }
}

// bf16 stochastic rounding: unbiased (the mean of many roundings of x is x) and always one of the two
// neighbouring bf16 values.
__global__ void stochastic_round_kernel(float* out, float x, int n, uint64_t seed) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(round_stochastic<__nv_bfloat16>(x, random_u32(seed, i)));
}
static void test_stochastic_rounding() {
    const int n = 1 << 20;
    const float x = 1.0f + 1.0f / 300.0f;  // between the bf16 neighbours 1 and 1 + 2^-7
    DeviceBuffer<float> out(n);
    stochastic_round_kernel<<<ceil_div(n, 256), 256>>>(out.ptr, x, n, 7);
    cudaCheckLaunch();
    std::vector<float> v = out.download();
    double sum = 0.0;
    bool neighbours = true;
    for (float y : v) { sum += y; neighbours = neighbours && (y == 1.0f || y == 1.0078125f); }
    const double mean = sum / n;
    char buf[128];
    snprintf(buf, sizeof(buf), "mean %.7f expected %.7f", mean, (double)x);
    // the standard error of the mean is 2^-7 * 0.5 / sqrt(n) = 4e-6: 5e-5 is over 10 sigma
    check(neighbours && fabs(mean - x) < 5e-5, "bf16 stochastic rounding is unbiased", buf);
}

// copy_runs (the initialisation's slices of a unit): 70000 runs (more than the grid's 65535 blocks) of 1 to 700
// elements (under and over a block's 256 threads) from random places; the elements no run writes keep their values.
static void test_copy_runs(cudaStream_t stream) {
    const size_t n = 1000000;
    std::uniform_int_distribution<size_t> length(1, 700), from(0, n - 700);
    std::vector<CopyRun> runs(70000);
    for (CopyRun& r : runs) r = {from(rng), 0, length(rng)};
    size_t to = 5;
    for (CopyRun& r : runs) { r.to = to; to += r.count + 3; }  // disjoint destinations, gaps between them
    const std::vector<float> src = random_vector<float>(n), before = random_vector<float>(to);
    std::vector<float> expected = before;
    for (const CopyRun& r : runs) std::copy(src.begin() + r.from, src.begin() + r.from + r.count, expected.begin() + r.to);
    DeviceBuffer<float> src_d(src), dst_d(before);
    CopyRun* runs_d;
    cudaCheck(cudaMalloc(&runs_d, runs.size() * sizeof(CopyRun)));
    cudaCheck(cudaMemcpy(runs_d, runs.data(), runs.size() * sizeof(CopyRun), cudaMemcpyHostToDevice));
    copy_runs(dst_d.ptr, src_d.ptr, runs_d, (int)runs.size(), stream);
    cudaCheck(cudaStreamSynchronize(stream));
    cudaCheck(cudaFree(runs_d));
    check(dst_d.download() == expected, "copy_runs: " + std::to_string(runs.size()) + " runs, exact, the rest untouched", "");
}

template <typename floatX>
void test_precision(cudaStream_t stream) {
    const std::string tag = type_name<floatX>();
    const bool full = !quick_tier();
    const Shape shapes[] = {{3, 37, 200, 5}, {2, 64, 768, 12}, {1, 130, 64, 1}};
    for (const Shape& s : shapes) {
        test_encoder<floatX>(s, tag, stream);
        test_layernorm<floatX>(s, tag, stream);
        // tensor parallelism's vocabulary ranges: the last rank's range short of real rows (tp 2, 3), and one with
        // none (tp 4: ranks of 96 rows, V 200, so rank 2 holds 8 real rows and rank 3 only padding)
        test_encoder_vocab_parallel<floatX>(s, 300, 384, 2, tag, stream);
        test_encoder_vocab_parallel<floatX>(s, 300, 384, 3, tag, stream);
        test_encoder_vocab_parallel<floatX>(s, 200, 384, 4, tag, stream);
    }
    // more rows than the LayerNorm backward has warps (8 in each of 4 blocks a multiprocessor: 4224 on an H200), so
    // that warps accumulate several rows
    test_layernorm<floatX>({8, 1024, 768, 12}, tag, stream);
    // rows past kLayerNormWideFrom take the wide kernel: just past it (a block's last warp partly idle), C not a
    // multiple of a block's width (4200), more rows than its blocks take at once (4 x 1100), and the widest rows of
    // 16 and of 32 columns a thread
    test_layernorm<floatX>({1, 37, 2056, 1}, tag, stream);
    if (full) test_layernorm<floatX>({4, 1100, 4200, 1}, tag, stream);
    test_layernorm<floatX>({1, 19, 8192, 1}, tag, stream);
    test_layernorm<floatX>({1, 9, kLayerNormWideMaxC, 1}, tag, stream);
    // RMSNorm through the same paths (narrow and its column sums up to kLayerNormWideFrom, wide beyond), with the
    // widths of SmolLM2-135M (576), Qwen2.5-0.5B (896), Llama 3.2 1B (2048) and Llama 3.1 8B (4096), Llama's eps and
    // Qwen's, inputs small enough for eps to matter, more rows than the narrow kernel's warps (8 x 1024) and than the
    // wide kernel's blocks (4 x 1100)
    test_rmsnorm<floatX>({3, 37, 200, 1}, 1e-5f, 1.0f, tag, stream);
    test_rmsnorm<floatX>({2, 64, 576, 9}, 1e-5f, 1.0f, tag, stream);
    test_rmsnorm<floatX>({2, 37, 576, 9}, 1e-5f, 3e-3f, tag, stream);
    test_rmsnorm<floatX>({2, 64, 896, 14}, 1e-6f, 1.0f, tag, stream);
    test_rmsnorm<floatX>({1, 130, 2048, 32}, 1e-5f, 1.0f, tag, stream);
    test_rmsnorm<floatX>({1, 37, 2048, 32}, 1e-6f, 1e-3f, tag, stream);
    test_rmsnorm<floatX>({2, 50, 4096, 32}, 1e-5f, 1.0f, tag, stream);
    test_rmsnorm<floatX>({1, 9, kLayerNormWideMaxC, 1}, 1e-5f, 1.0f, tag, stream);
    if (full) test_rmsnorm<floatX>({8, 1024, 576, 9}, 1e-5f, 1.0f, tag, stream);
    if (full) test_rmsnorm<floatX>({4, 1100, 4096, 32}, 1e-5f, 1.0f, tag, stream);
    test_matmul<floatX>(111, 200, 600, tag, stream);
    if (full) test_matmul<floatX>(256, 768, 3072, tag, stream);
    test_matmul<floatX>(77, 64, 1024, tag, stream);
    test_matmul<floatX>(1, 768, 2304, tag, stream);  // the small-row products (sampling's one-row forward)
    test_matmul<floatX>(3, 200, 600, tag, stream);
    test_matmul<floatX>(8, 64, 1032, tag, stream);
    // 124M's shape on an H200 (528 partial rows); C not a multiple of 32 with fewer rows than threads; K < C (tp)
    test_colsum_times_weight<floatX>(528, 768, 768, tag, stream);
    test_colsum_times_weight<floatX>(7, 100, 72, tag, stream);
    test_colsum_times_weight<floatX>(200, 1600, 400, tag, stream);
    test_gelu<floatX>(8 * 1001, tag, stream);
    // SwiGLU: the intermediate sizes of SmolLM2-135M (1536), Qwen2.5-0.5B (4864), Llama 3.2 1B (8192) and Llama 3.1 8B
    // (14336); F 8 and 24 (one and three 16-byte vectors of bf16 a row half); enough rows for thousands of blocks
    for (int F : {1536, 4864, 8192, 14336}) test_swiglu<floatX>(37, F, tag, stream);
    test_swiglu<floatX>(5, 8, tag, stream);
    test_swiglu<floatX>(3, 24, tag, stream);
    if (full) test_swiglu<floatX>(1024, 4864, tag, stream);
    // RoPE: the heads of SmolLM2-135M (9 q, 3 kv, D 64, theta 1e5), Qwen2.5-0.5B (14, 2, 64, 1e6), Llama 3.2 1B (32, 8,
    // 64, 5e5, llama3 x32) and Llama 3.1 8B (32, 8, 128, 5e5, llama3 x8); multi-head (kv = q) at D 128; decode steps
    // (T 1) at a KV-cache position; a prompt at an offset, and one across position 8192 (Llama 3's original context)
    const RopeCase rope_cases[] = {{2, 37, 9, 3, 64, 0, 1e5f, 0},         {2, 37, 14, 2, 64, 0, 1e6f, 0},
                                   {2, 37, 32, 8, 64, 0, 5e5f, 32},       {1, 19, 32, 8, 128, 0, 5e5f, 8},
                                   {3, 20, 4, 4, 128, 0, 1e4f, 0},        {3, 1, 14, 2, 64, 517, 1e6f, 0},
                                   {2, 1, 32, 8, 128, 4000, 5e5f, 8},     {2, 33, 8, 2, 64, 1000, 1e4f, 0},
                                   {1, 50, 4, 1, 128, 8170, 5e5f, 8}};
    for (const RopeCase& r : rope_cases) test_rope<floatX>(r, tag, stream);
    // GELU widths 600 and 1032: multiples of 8 (cuBLASLt's rule), not of 16; 768 -> 3072 is d12's MLP
    test_matmul_gelu<floatX>(111, 200, 600, tag, stream);
    if (full) test_matmul_gelu<floatX>(256, 768, 3072, tag, stream);
    test_matmul_gelu<floatX>(77, 64, 1032, tag, stream);
    test_matmul_gelu<floatX>(1, 768, 3072, tag, stream);
    test_matmul_gelu<floatX>(5, 64, 1032, tag, stream);
    // autotuned (train_gpt's default): each candidate algorithm writes the outputs before the chosen one does;
    // new shapes, so that the timing runs
    matmul_context().autotune = true;
    test_matmul<floatX>(512, 768, 2304, tag + " autotuned", stream);
    test_matmul_gelu<floatX>(512, 768, 3072, tag + " autotuned", stream);
    matmul_context().autotune = false;
    // fused_classifier's kernel shows in the check names. Single-pass (a CTA per SM, two row buffers) on an
    // H100/H200 for the shapes up to GPT-2's but fp32 GPT-2 rows (two do not fit in shared memory: two-pass), and
    // two-pass for the Llama 3 and Qwen 2.5 vocabularies; N 600 gives each CTA 4-5 rows, so both buffers are refilled;
    // V 1001 ends the real columns mid-vector
    test_classifier<floatX>(37, 1000, tag, stream);
    test_classifier<floatX>(600, 1001, tag, stream);
    test_classifier<floatX>(8, 50257, tag, stream);
    test_classifier<floatX>(4, 128256, tag, stream);  // Llama 3's vocabulary
    test_classifier<floatX>(3, 151936, tag, stream);  // Qwen 2.5's
    // targets that do not count (-1, masked chat data): loss 0 and a zero gradient row, the rest as without them;
    // both kernels (600 rows single-pass where it runs, Llama 3's vocabulary two-pass)
    test_classifier<floatX>(600, 1001, tag, stream, true);
    test_classifier<floatX>(7, 128256, tag, stream, true);
    // vocabulary-parallel cross-entropy: Vp 384 in 1, 2, 3, 4 ranks of 384, 192, 128, 96 columns (V 300: the last
    // rank partly padding, its real columns ending mid-vector); V 200 leaves a rank with no real column (tp 3: rank
    // 2; tp 4: rank 3); GPT-2's vocabulary in 8 ranks of 6288 columns
    for (int tp : {1, 2, 3, 4}) test_vocab_parallel_classifier<floatX>(37, 300, 384, tp, tag, stream);
    test_vocab_parallel_classifier<floatX>(19, 200, 384, 3, tag, stream);
    test_vocab_parallel_classifier<floatX>(37, 200, 384, 4, tag, stream);
    test_vocab_parallel_classifier<floatX>(13, 50257, 50304, 8, tag, stream);
    test_vocab_parallel_classifier<floatX>(37, 300, 384, 3, tag, stream, true);
    test_optimizer<floatX>(100003, tag, stream);
    test_adamw_cpu_bitwise<floatX>(tag, stream);
}

int main(int argc, char** argv) {
    check_suite("kernels");
    rng.seed(test_seed("test_kernels", argc > 1 ? argv[1] : nullptr));
    // host code: RoPE's frequency tables of the models test_rope's cases take after
    test_rope_frequencies(64, 1e5f, RopeScaling{});
    test_rope_frequencies(64, 1e6f, RopeScaling{});
    test_rope_frequencies(64, 5e5f, llama3_scaling(32));
    test_rope_frequencies(128, 5e5f, llama3_scaling(8));
    test_rope_frequencies(128, 1e4f, RopeScaling{});
    // every field away from Llama 3's values, so that one read in place of another shows
    RopeScaling unusual;
    unusual.factor = 16;
    unusual.low_freq_factor = 2;
    unusual.high_freq_factor = 8;
    unusual.original_max_positions = 4096;
    test_rope_frequencies(128, 5e5f, unusual);
    if (!gpu_present("every kernel check")) return check_failures() == 0 ? 0 : 1;
    matmul_setup(false);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    test_precision<float>(stream);
    test_precision<__nv_bfloat16>(stream);
    test_precision<__half>(stream);
    test_stochastic_rounding();
    test_copy_runs(stream);
    cudaCheck(cudaStreamDestroy(stream));
    matmul_teardown();
    return check_failures() == 0 ? 0 : 1;
}
