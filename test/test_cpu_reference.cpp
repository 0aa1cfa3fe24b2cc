// Checks the C++ CPU reference: the Llama family's layers against hand-computed cases and central differences of
// their own forwards, and the whole GPT-2 model against the PyTorch reference (scripts/reference/gpt2_reference.py
// debug-state).
//
// Usage: test_cpu_reference [MODEL_FILE DEBUG_STATE_FILE]
// Without arguments only the layer checks run. Prints one line per check (check.h: "PASS <name>  <detail>" or
// "FAIL <name>: <detail>") and exits 1 if any check failed; a bad model or debug-state file is a one-line error
// and exit 1.
//
// Model tolerances: 1e-5 relative for everything. Both sides are fp32 computations from identical parameters and
// tokens and differ only in accumulation order: this side accumulates long reductions in double, PyTorch in
// fp32. Against a float64 PyTorch run this side is within ~1e-7; PyTorch's own fp32 error dominates and is
// largest in the gradients (every one flows through the LM-head backward, a 50257-term sum): ~5e-7 with a
// blocked BLAS (OpenBLAS), up to ~5e-6 with Debian's default reference BLAS, which sums sequentially. Real bugs
// (wrong index, missing term, wrong scale) give errors of 1e-3 or more.
//
// Layer tolerances are given where each is used.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "cpu_reference.h"
#include "debug_state.h"

namespace {

constexpr double kTol = 1e-5;

const char* const kTensorNames[16] = {"wte",  "wpe",  "ln1w", "ln1b", "qkvw", "qkvb",    "attprojw", "attprojb",
                                      "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

// Element counts of the 16 model-file tensors (docs/formats.md).
std::vector<size_t> tensor_sizes(const cpuref::Config& c) {
    const size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, T = c.max_seq_len;
    return {Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
            L * C,  L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
}

// ---- Llama family layers

// Values uniform in [-scale, scale) from a fixed seed (mt19937's sequence is fixed by the standard; 24 bits each).
std::vector<float> random_values(size_t n, unsigned seed, double scale = 1.0) {
    std::mt19937 gen(seed);
    std::vector<float> v(n);
    for (float& x : v) x = (float)(scale * (2.0 * (double)(gen() >> 8) / 16777216.0 - 1.0));
    return v;
}

// Largest |ours - expected|, or with `relative` the largest |ours - expected| / |expected|.
double max_error(const float* ours, const std::vector<double>& expected, bool relative = false) {
    double err = 0.0;
    for (size_t i = 0; i < expected.size(); i++) {
        if (!std::isfinite(ours[i])) return INFINITY;
        const double e = std::fabs(ours[i] - expected[i]);
        err = std::fmax(err, relative ? e / std::fabs(expected[i]) : e);
    }
    return err;
}
void check_values(const std::string& name, const float* ours, const std::vector<double>& expected, double tol,
                  bool relative = false) {
    const double err = max_error(ours, expected, relative);
    const char* format = relative ? "max relative error %.3e (tolerance %.0e)" : "max abs error %.3e (tolerance %.0e)";
    check(err <= tol, name, fmt(format, err, tol));
}
// Equal bit for bit (sizes are equal by construction).
void check_bitwise(const std::string& name, const std::vector<float>& ours, const std::vector<float>& ref) {
    size_t differ = 0;
    for (size_t i = 0; i < ref.size(); i++) differ += std::memcmp(&ours[i], &ref[i], sizeof(float)) != 0;
    check(differ == 0, name, fmt("%.0f of %.0f values differ", (double)differ, (double)ref.size()));
}

// Central differences of loss(x) = sum_k w_k forward(x)_k, the loss summed in double over the fp32 forward's
// outputs. The denominator is the difference of the two fp32 inputs actually evaluated, so x +- kFdStep rounding
// to fp32 costs nothing.
constexpr float kFdStep = 1e-2f;
std::vector<float> numeric_gradient(std::vector<float> x, const std::vector<float>& w,
                                    const std::function<void(const float* x, float* out)>& forward) {
    std::vector<float> out(w.size()), grad(x.size());
    auto loss = [&]() {
        forward(x.data(), out.data());
        double sum = 0.0;
        for (size_t k = 0; k < out.size(); k++) sum += (double)w[k] * out[k];
        return sum;
    };
    for (size_t j = 0; j < x.size(); j++) {
        const float x0 = x[j];
        x[j] = x0 + kFdStep;
        const double up = loss(), x_up = x[j];
        x[j] = x0 - kFdStep;
        const double down = loss(), x_down = x[j];
        x[j] = x0;
        grad[j] = (float)((up - down) / (x_up - x_down));
    }
    return grad;
}

// Backward against central differences: relative L2 error. The forwards round each output to fp32 once, so the
// loss difference carries ~6e-8 relative noise per output the input moves, divided by 2*kFdStep: 1e-6 (RoPE,
// two outputs) to 5e-6 (an RMSNorm row, attention) relative here. The truncation error is kFdStep^2/6 times the
// third derivative: 0 for RoPE (linear), up to ~1e-5 for the others at these input sizes (measured: 1e-6 to 1e-5
// in all at this step, and larger at steps 3x smaller or larger). 1e-4 leaves a margin of 10; a wrong index,
// term, sign or scale gives 1e-1 or more.
constexpr double kFdTol = 1e-4;

// The hand-computed forwards allow 1e-7 absolute: each output is one fp32 rounding, at most 6e-8 (half an ulp) for
// the values below 2 checked so (exact values above 2 round to themselves).
void test_rmsnorm() {
    {  // mean(x^2) + eps = 3 + 1 and 1 + 1: rstd 1/2 and 1/sqrt(2); exact in fp32 up to the last rounding
        const std::vector<float> x = {3, -1, 1, 1, 1, 1, 1, 1}, w = {1, 2, -1, 0.5f};
        std::vector<float> out(8), rstd(2);
        cpuref::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 2, 4, 1.0f);
        const double r = 0.7071067811865475;
        check_values("rmsnorm_forward_hand", out.data(), {1.5, -1, -0.5, 0.25, r, 2 * r, -r, 0.5 * r}, 1e-7);
        check_values("rmsnorm_rstd_hand", rstd.data(), {0.5, r}, 1e-7);
    }
    const int N = 3, C = 16;
    const float eps = 1e-5f;
    const std::vector<float> x = random_values((size_t)N * C, 1), w = random_values(C, 2, 2.0),
                             dout = random_values((size_t)N * C, 3);
    std::vector<float> out((size_t)N * C), rstd(N), dx((size_t)N * C, 0.0f), dw(C, 0.0f);
    cpuref::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    cpuref::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    std::vector<float> scratch_rstd(N);
    check_rel_l2("rmsnorm_backward_dinp_vs_fd", dx.data(), numeric_gradient(x, dout, [&](const float* xp, float* o) {
                     cpuref::rmsnorm_forward(o, scratch_rstd.data(), xp, w.data(), N, C, eps);
                 }).data(), dx.size(), kFdTol);
    check_rel_l2("rmsnorm_backward_dweight_vs_fd", dw.data(), numeric_gradient(w, dout, [&](const float* wp, float* o) {
                     cpuref::rmsnorm_forward(o, scratch_rstd.data(), x.data(), wp, N, C, eps);
                 }).data(), dw.size(), kFdTol);
    // A second backward adds the same fp32 values again: exactly twice the first. A null dweight leaves dinp as is.
    std::vector<float> dx2 = dx, dw2 = dw, dx_frozen((size_t)N * C, 0.0f);
    cpuref::rmsnorm_backward(dx2.data(), dw2.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    cpuref::rmsnorm_backward(dx_frozen.data(), nullptr, dout.data(), x.data(), w.data(), rstd.data(), N, C);
    for (float& v : dx) v *= 2.0f;
    for (float& v : dw) v *= 2.0f;
    check_bitwise("rmsnorm_backward_accumulates_dinp", dx2, dx);
    check_bitwise("rmsnorm_backward_accumulates_dweight", dw2, dw);
    for (float& v : dx_frozen) v *= 2.0f;
    check_bitwise("rmsnorm_backward_null_dweight", dx_frozen, dx);
}

void test_rope() {
    // theta^(-2i/D) for D = 8, theta = 1e4: 1, 0.1, 0.01, 0.001, within the fp32 roundings of transformers'
    // steps (2 ulps, up to 2.4e-7 relative).
    std::vector<float> freqs(4);
    cpuref::rope_frequencies(freqs.data(), 8, 10000.0f, nullptr);
    check_values("rope_frequencies_default_hand", freqs.data(), {1, 0.1, 0.01, 0.001}, 3e-7, true);
    // Llama 3 scaling with factor 8, low 1, high 4, original 1024: wavelengths 2 pi / f are 6.3, 63, 628, 6283;
    // below 1024/4 = 256 kept, above 1024/1 divided by 8, and 628 in between interpolated with
    // s = (1024/628.32 - 1)/(4 - 1) = 0.209916: f = 0.01 ((1 - s)/8 + s).
    const cpuref::RopeScaling llama3 = {8.0f, 1.0f, 4.0f, 1024};
    cpuref::rope_frequencies(freqs.data(), 8, 10000.0f, &llama3);
    check_values("rope_frequencies_llama3_hand", freqs.data(), {1, 0.1, 0.003086760967011274, 0.000125}, 3e-7, true);

    {  // D = 4: inv_freq 1, 0.01. Position 0 is the identity; position 1 rotates the pair (0, 2) by 1 rad and the
       // pair (1, 3) by 0.01 rad (rotate_half pairs, not (0, 1) and (2, 3)).
        std::vector<float> f(2), out(8);
        cpuref::rope_frequencies(f.data(), 4, 10000.0f, nullptr);
        const std::vector<float> x = {1, 2, 3, 4, 1, 0, 0, 1};
        cpuref::rope_forward(out.data(), x.data(), f.data(), 1, 2, 1, 4);
        check_values("rope_forward_hand", out.data(),
                     {1, 2, 3, 4, 0.5403023058681398, -0.009999833334166664, 0.8414709848078965, 0.9999500004166653},
                     1e-7);
    }
    const int B = 2, T = 6, NH = 3, D = 8;
    const size_t n = (size_t)B * T * NH * D;
    std::vector<float> inv_freq(D / 2);
    cpuref::rope_frequencies(inv_freq.data(), D, 500000.0f, nullptr);
    const std::vector<float> x = random_values(n, 4), dout = random_values(n, 5);
    std::vector<float> out(n), dx(n, 0.0f);
    cpuref::rope_forward(out.data(), x.data(), inv_freq.data(), B, T, NH, D);
    std::vector<float> in_place = x;
    cpuref::rope_forward(in_place.data(), in_place.data(), inv_freq.data(), B, T, NH, D);
    check_bitwise("rope_forward_in_place", in_place, out);
    // The backward rotates back: applied to the forward's output it returns the input, up to the rounding of the
    // output and of cos and sin to fp32 (cos^2 + sin^2 = 1 to ~1e-7).
    std::vector<float> back(n, 0.0f);
    cpuref::rope_backward(back.data(), out.data(), inv_freq.data(), B, T, NH, D);
    check_rel_l2("rope_backward_inverts_forward", back.data(), x.data(), n, 1e-6);
    cpuref::rope_backward(dx.data(), dout.data(), inv_freq.data(), B, T, NH, D);
    check_rel_l2("rope_backward_vs_fd", dx.data(), numeric_gradient(x, dout, [&](const float* xp, float* o) {
                     cpuref::rope_forward(o, xp, inv_freq.data(), B, T, NH, D);
                 }).data(), n, kFdTol);
    std::vector<float> dx2 = dx;
    cpuref::rope_backward(dx2.data(), dout.data(), inv_freq.data(), B, T, NH, D);
    for (float& v : dx) v *= 2.0f;
    check_bitwise("rope_backward_accumulates", dx2, dx);
}

void test_swiglu() {
    {  // silu(0) 5 = 0; silu(1) 2 = 2 sigmoid(1); silu(-2) 3 = -6 sigmoid(-2)
        const std::vector<float> inp = {0, 1, -2, 5, 2, 3};
        std::vector<float> out(3);
        cpuref::swiglu_forward(out.data(), inp.data(), 1, 3);
        check_values("swiglu_forward_hand", out.data(), {0, 1.4621171572600098, -0.7152175321327052}, 1e-7);
    }
    const int N = 4, F = 8;
    // gates over +-4: the sigmoid's curved range
    const std::vector<float> inp = random_values((size_t)N * 2 * F, 6, 4.0), dout = random_values((size_t)N * F, 7);
    std::vector<float> dinp((size_t)N * 2 * F, 0.0f);
    cpuref::swiglu_backward(dinp.data(), inp.data(), dout.data(), N, F);
    check_rel_l2("swiglu_backward_vs_fd", dinp.data(), numeric_gradient(inp, dout, [&](const float* xp, float* o) {
                     cpuref::swiglu_forward(o, xp, N, F);
                 }).data(), dinp.size(), kFdTol);
    std::vector<float> dinp2 = dinp;
    cpuref::swiglu_backward(dinp2.data(), inp.data(), dout.data(), N, F);
    for (float& v : dinp) v *= 2.0f;
    check_bitwise("swiglu_backward_accumulates", dinp2, dinp);
}

// gqa_attention_backward into dqkv, with the zeroed datt and dpreatt it needs.
void gqa_backward(std::vector<float>& dqkv, const std::vector<float>& dout, const std::vector<float>& qkv,
                  const std::vector<float>& att, int B, int T, int NH, int KVH, int D) {
    std::vector<float> dpreatt(att.size(), 0.0f), datt(att.size(), 0.0f);
    cpuref::gqa_attention_backward(dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(), att.data(), B,
                                   T, NH, KVH, D);
}

void test_gqa_attention() {
    {  // NH 2 sharing one kv head, D 4 (scale 1/2), T 2; k0 = 0, k1 = (1,1,1,1). Position 0 attends to itself
       // only: v0 in both heads. At position 1 head 0's q = 0 weighs both keys equally: (v0 + v1)/2; head 1's
       // q = (c,c,c,c), c = ln(3)/2, scores 0 and 4c/2 = ln 3: weights 1/4, 3/4.
        const float c = 0.5493061443340549f;
        const std::vector<float> qkv = {0, 0, 0, 0, 9, 9, 9, 9, 0, 0, 0, 0, 1, 0, -1, 2,   // t 0: q0 q1 | k | v
                                        0, 0, 0, 0, c, c, c, c, 1, 1, 1, 1, 3, 4, 1, 2};   // t 1
        std::vector<float> out(16), preatt(8), att(8);
        cpuref::gqa_attention_forward(out.data(), preatt.data(), att.data(), qkv.data(), 1, 2, 2, 1, 4);
        // outputs up to 3 (half an ulp 1.2e-7) and c rounded to fp32 (moves the weights by ~1e-8)
        check_values("gqa_attention_forward_hand", out.data(),
                     {1, 0, -1, 2, 1, 0, -1, 2, 2, 2, 0, 2, 2.5, 3, 0.5, 2}, 1e-6);
        check_values("gqa_attention_att_hand", att.data(), {1, 0, 0.5, 0.5, 1, 0, 0.25, 0.75}, 1e-7);
    }
    {  // KVH = NH with [q|k|v] rows of C = NH*D: GPT-2's attention, bit for bit
        const int B = 2, T = 5, NH = 3, D = 4, C = NH * D;
        const std::vector<float> qkv = random_values((size_t)B * T * 3 * C, 8),
                                 dout = random_values((size_t)B * T * C, 9);
        const size_t att_n = (size_t)B * NH * T * T;
        std::vector<float> out1((size_t)B * T * C), pre1(att_n), att1(att_n), out2 = out1, pre2 = pre1, att2 = att1;
        cpuref::attention_forward(out1.data(), pre1.data(), att1.data(), qkv.data(), B, T, C, NH);
        cpuref::gqa_attention_forward(out2.data(), pre2.data(), att2.data(), qkv.data(), B, T, NH, NH, D);
        check_bitwise("gqa_attention_forward_mha_equal", out2, out1);
        check_bitwise("gqa_attention_att_mha_equal", att2, att1);
        std::vector<float> dqkv1(qkv.size(), 0.0f), dpre1(att_n, 0.0f), datt1(att_n, 0.0f);
        cpuref::attention_backward(dqkv1.data(), dpre1.data(), datt1.data(), dout.data(), qkv.data(), att1.data(), B, T,
                                   C, NH);
        std::vector<float> dqkv2(qkv.size(), 0.0f);
        gqa_backward(dqkv2, dout, qkv, att2, B, T, NH, NH, D);
        check_bitwise("gqa_attention_backward_mha_equal", dqkv2, dqkv1);
    }
    const int B = 2, T = 5, NH = 4, D = 4;
    for (const int KVH : {2, 1}) {
        // Against multi-head attention on k and v repeated per query head (transformers' repeat_kv): the same
        // forward bit for bit, and dk, dv the sums of the repeated heads' gradients (summed here in fp32 from
        // rounded per-head values, there in double: 1e-6 covers the difference).
        const std::string kv = "_kvh" + std::to_string(KVH);
        const int row = (NH + 2 * KVH) * D, C = NH * D, group = NH / KVH;
        const std::vector<float> qkv = random_values((size_t)B * T * row, 10 + KVH),
                                 dout = random_values((size_t)B * T * C, 20 + KVH);
        std::vector<float> mha((size_t)B * T * 3 * C);
        for (int bt = 0; bt < B * T; bt++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < D; i++) {
                    const float* src = qkv.data() + (size_t)bt * row;
                    float* dst = mha.data() + (size_t)bt * 3 * C;
                    dst[h * D + i] = src[h * D + i];
                    dst[C + h * D + i] = src[(NH + h / group) * D + i];
                    dst[2 * C + h * D + i] = src[(NH + KVH + h / group) * D + i];
                }
        const size_t att_n = (size_t)B * NH * T * T;
        std::vector<float> out1((size_t)B * T * C), pre1(att_n), att1(att_n), out2 = out1, pre2 = pre1, att2 = att1;
        cpuref::attention_forward(out1.data(), pre1.data(), att1.data(), mha.data(), B, T, C, NH);
        cpuref::gqa_attention_forward(out2.data(), pre2.data(), att2.data(), qkv.data(), B, T, NH, KVH, D);
        check_bitwise("gqa_attention_forward_repeat_kv" + kv, out2, out1);
        std::vector<float> dmha(mha.size(), 0.0f), dpre(att_n, 0.0f), datt(att_n, 0.0f), dqkv(qkv.size(), 0.0f);
        cpuref::attention_backward(dmha.data(), dpre.data(), datt.data(), dout.data(), mha.data(), att1.data(), B, T, C,
                                   NH);
        gqa_backward(dqkv, dout, qkv, att2, B, T, NH, KVH, D);
        std::vector<float> summed(qkv.size(), 0.0f);
        for (int bt = 0; bt < B * T; bt++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < D; i++) {
                    const float* src = dmha.data() + (size_t)bt * 3 * C;
                    float* dst = summed.data() + (size_t)bt * row;
                    dst[h * D + i] = src[h * D + i];
                    dst[(NH + h / group) * D + i] += src[C + h * D + i];
                    dst[(NH + KVH + h / group) * D + i] += src[2 * C + h * D + i];
                }
        check_rel_l2("gqa_attention_backward_repeat_kv" + kv, dqkv.data(), summed.data(), dqkv.size(), 1e-6);
        std::vector<float> scratch_pre(att_n), scratch_att(att_n);
        check_rel_l2("gqa_attention_backward_vs_fd" + kv, dqkv.data(),
                     numeric_gradient(qkv, dout, [&](const float* xp, float* o) {
                         cpuref::gqa_attention_forward(o, scratch_pre.data(), scratch_att.data(), xp, B, T, NH, KVH, D);
                     }).data(), dqkv.size(), kFdTol);
        std::vector<float> dqkv2 = dqkv;
        gqa_backward(dqkv2, dout, qkv, att2, B, T, NH, KVH, D);
        for (float& v : dqkv) v *= 2.0f;
        check_bitwise("gqa_attention_backward_accumulates" + kv, dqkv2, dqkv);
    }
}

// ---- GPT-2 against PyTorch

// The whole model against the PyTorch reference's debug state: forward, backward and AdamW steps.
void check_model(const char* model_path, const std::string& state_path) {
    cpuref::Model* model = cpuref::model_load(model_path);
    const cpuref::Config& cfg = cpuref::model_config(model);
    const size_t P = cpuref::model_num_params(model);
    const DebugState s = read_debug_state(state_path);
    if (s.B <= 0 || s.T <= 0 || s.steps < 1) debug_state_error(state_path, "invalid B, T or step count in header");
    if (s.V != cfg.vocab_size || s.Vp != cfg.padded_vocab_size)
        debug_state_error(state_path, "vocab sizes do not match the model");
    if (s.T > cfg.max_seq_len) debug_state_error(state_path, "T exceeds the model's max sequence length");
    if (s.grads.size() != P)
        debug_state_error(state_path, "holds " + std::to_string(s.grads.size()) + " gradients, the model has " +
                                          std::to_string(P) + " parameters");
    if (s.precision != 0) debug_state_error(state_path, "not an fp32 debug state (these tolerances are for fp32)");
    const int B = s.B, T = s.T, V = s.V, Vp = s.Vp;
    const size_t BT = (size_t)B * T;

    // Step 0: forward.
    const float loss = cpuref::model_forward(model, s.inputs.data(), s.targets.data(), B, T);
    const float* logits = cpuref::model_logits(model);
    std::vector<float> ours((size_t)BT * V);  // drop the padded columns
    double max_abs = 0.0;
    for (size_t n = 0; n < BT; n++)
        for (int v = 0; v < V; v++) {
            ours[n * V + v] = logits[n * Vp + v];
            max_abs = std::fmax(max_abs, std::fabs((double)ours[n * V + v] - s.logits[n * V + v]));
        }
    check(max_abs <= kTol, "logits_max_abs", fmt("max abs error %.3e (tolerance %.0e)", max_abs, kTol));
    check_rel_l2("logits_rel_l2", ours.data(), s.logits.data(), ours.size(), kTol);
    check_scalar("loss", loss, s.loss, kTol);

    // Step 0: backward.
    cpuref::model_zero_grad(model);
    cpuref::model_backward(model);
    const float* grads = cpuref::model_grads(model);
    check_scalar("grad_norm", cpuref::global_norm(grads, P), s.grad_norm, kTol);
    const std::vector<size_t> sizes = tensor_sizes(cfg);
    size_t offset = 0;
    for (int i = 0; i < 16; i++) {
        check_rel_l2(std::string("grad_") + kTensorNames[i], grads + offset, s.grads.data() + offset, sizes[i], kTol);
        offset += sizes[i];
    }
    // wte is the first tensor: its rows V..Vp-1 are padding and must get exactly zero gradient on both sides.
    size_t nonzero_ours = 0, nonzero_ref = 0;
    for (size_t i = (size_t)V * cfg.channels; i < (size_t)Vp * cfg.channels; i++) {
        nonzero_ours += grads[i] != 0.0f;
        nonzero_ref += s.grads[i] != 0.0f;
    }
    check(nonzero_ours == 0 && nonzero_ref == 0, "wte_padded_rows_zero_grad",
          fmt("nonzero padded-row gradients: ours %.0f, reference %.0f", (double)nonzero_ours, (double)nonzero_ref));

    // Training steps on the same batch; step 0 reuses the gradients above.
    for (int step = 0; step < s.steps; step++) {
        float step_loss = loss;
        if (step > 0) {
            step_loss = cpuref::model_forward(model, s.inputs.data(), s.targets.data(), B, T);
            cpuref::model_zero_grad(model);
            cpuref::model_backward(model);
        }
        check_scalar("train_loss_step_" + std::to_string(step), step_loss, s.losses[step], kTol);
        cpuref::model_update(model, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.grad_clip, step + 1);
    }
    cpuref::model_free(model);
}

}  // namespace

int main(int argc, char** argv) {
    check_suite("cpu_reference");
    if (argc != 1 && argc != 3) {
        std::fprintf(stderr, "usage: %s [MODEL_FILE DEBUG_STATE_FILE]\n", argv[0]);
        return 1;
    }
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_gqa_attention();
    if (argc == 3) check_model(argv[1], argv[2]);
    return check_failures() ? 1 : 0;
}
