// Checks LoRA in the C++ CPU reference (cpu_reference.h) against the PyTorch reference and on its own.
//
// Usage: test_cpu_lora FIXTURE_DIR, a directory written by `test/tools/make_cpu_fixture.sh --lora FIXTURE_DIR`:
//   model.bin         base model (2 layers, C=128, 2 heads)
//   lora_init.bin     its initial adapters: r=4, alpha=8, all four targets, B ~ N(0, 0.02) so that the adapters
//                     matter from step 0
//   lora_state.bin    LoRA debug state of 10 steps from there (docs/lora.md)
//   merged.bin        export-merged of model.bin and lora_init.bin
//   lora_dropout.bin  the adapters after 2 steps of `train` from lora_init.bin with adapter dropout 0.1
// Scratch files go to FIXTURE_DIR too. Prints one line per check (check.h) and exits 1 if any failed; a bad
// fixture file is a one-line error and exit 1.
//
// Tolerances: 1e-5 relative against PyTorch (fp32 on both sides; see test_cpu_reference.cpp for why), 1e-5
// absolute between merged and unmerged logits (the merged weights are rounded once more), 1e-6 absolute for
// merge-then-unmerge (W0 + D - D is W0 to within an ulp of W0 + D) and for our merge against PyTorch's
// export-merged (both sum in double and round once). Bitwise where nothing is rounded differently: logits with
// B = 0, base weights after training, adapter file bytes, save/load.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "check.h"
#include "cpu_reference.h"
#include "debug_state.h"

namespace {

constexpr double kTol = 1e-5;
constexpr double kMergeTol = 1e-6;

// The adapter layout docs/lora.md specifies (written out here independently of cpu_reference.cpp): per layer, per
// target in this order, A (r, in) then B (out, r); in and out in units of C.
struct TargetInfo {
    const char* name;
    unsigned bit;
    int in_mult, out_mult;
};
constexpr TargetInfo kTargets[4] = {{"qkv", cpuref::kLoraQkv, 1, 3},
                                    {"attn-proj", cpuref::kLoraAttnProj, 1, 1},
                                    {"fc", cpuref::kLoraFc, 1, 4},
                                    {"fc-proj", cpuref::kLoraFcProj, 4, 1}};

struct AdapterTensor {
    std::string name;  // e.g. "l1_fc_B"
    size_t offset, size;
};

std::vector<AdapterTensor> adapter_layout(const cpuref::Config& c, const cpuref::LoraConfig& lc) {
    std::vector<AdapterTensor> out;
    size_t offset = 0;
    for (int l = 0; l < c.num_layers; l++)
        for (const TargetInfo& t : kTargets) {
            if (!(lc.targets & t.bit)) continue;
            const size_t a = (size_t)lc.rank * t.in_mult * c.channels, b = (size_t)t.out_mult * c.channels * lc.rank;
            const std::string prefix = "l" + std::to_string(l) + "_" + t.name;
            out.push_back({prefix + "_A", offset, a});
            out.push_back({prefix + "_B", offset + a, b});
            offset += a + b;
        }
    return out;
}

double max_abs_diff(const float* a, const float* b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = std::fmax(m, std::isfinite(a[i]) ? std::fabs((double)a[i] - b[i]) : INFINITY);
    return m;
}

void check_max_abs(const std::string& name, const float* ours, const float* ref, size_t n, double tol) {
    const double err = max_abs_diff(ours, ref, n);
    check(err <= tol, name, fmt("max abs error %.3e (tolerance %.0e)", err, tol));
}

bool same_bits(const std::vector<float>& a, const float* b) {
    return std::memcmp(a.data(), b, a.size() * sizeof(float)) == 0;
}

std::vector<char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
}

// Logits (B*T, V) of the last forward without the padded columns.
std::vector<float> unpadded_logits(const cpuref::Model* model, size_t rows) {
    const cpuref::Config& c = cpuref::model_config(model);
    const float* logits = cpuref::model_logits(model);
    std::vector<float> out(rows * c.vocab_size);
    for (size_t n = 0; n < rows; n++)
        std::memcpy(&out[n * c.vocab_size], logits + n * c.padded_vocab_size, c.vocab_size * sizeof(float));
    return out;
}

std::vector<float> lora_params_copy(cpuref::Model* model) {
    const float* p = cpuref::model_lora_params(model);
    return std::vector<float>(p, p + cpuref::model_lora_num_params(model));
}

// Every listed adapter tensor differs from its value in `before` in at least one element.
bool all_tensors_changed(const std::vector<AdapterTensor>& layout, const std::vector<float>& before, const float* now) {
    for (const AdapterTensor& t : layout)
        if (std::memcmp(before.data() + t.offset, now + t.offset, t.size * sizeof(float)) == 0) return false;
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    check_suite("cpu_lora");
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s FIXTURE_DIR (from test/tools/make_cpu_fixture.sh --lora)\n", argv[0]);
        return 1;
    }
    const std::string dir = argv[1];
    const std::string model_path = dir + "/model.bin", init_path = dir + "/lora_init.bin";
    const std::string state_path = dir + "/lora_state.bin";
    std::string error;

    // ---- Against PyTorch: step 0 and 10 training steps from the same base model and initial adapters.
    cpuref::Model* model = cpuref::model_load(model_path.c_str());
    const cpuref::Config& cfg = cpuref::model_config(model);
    const size_t P = cpuref::model_num_params(model);
    const std::vector<float> base(cpuref::model_params(model), cpuref::model_params(model) + P);
    const DebugState s = read_debug_state(state_path);
    if (s.lora_rank == 0) debug_state_error(state_path, "not a LoRA debug state (version 3)");
    if (s.V != cfg.vocab_size || s.Vp != cfg.padded_vocab_size || s.T > cfg.max_seq_len)
        debug_state_error(state_path, "B, T or vocab sizes do not fit the model");
    if (s.precision != 0) debug_state_error(state_path, "not an fp32 debug state (these tolerances are for fp32)");
    if (!cpuref::lora_load(model, init_path.c_str(), &error)) {
        fail("adapter_load", error);
        return 1;
    }
    const cpuref::LoraConfig lc = *cpuref::model_lora(model);
    check(lc.rank == s.lora_rank && lc.alpha == s.lora_alpha && lc.targets == s.lora_targets,
          "adapter_config_matches_state",
          fmt("rank %g, alpha %g, targets %g", lc.rank, lc.alpha, lc.targets) +
              fmt(" (state: rank %g, alpha %g, targets %g)", s.lora_rank, s.lora_alpha, s.lora_targets));
    const std::vector<AdapterTensor> layout = adapter_layout(cfg, lc);
    const size_t A = cpuref::model_lora_num_params(model);
    if (layout.back().offset + layout.back().size != A || s.grads.size() != A)
        debug_state_error(state_path, "holds " + std::to_string(s.grads.size()) +
                                          " adapter gradients, the adapters have " + std::to_string(A) + " parameters");
    const std::vector<float> init_adapters = lora_params_copy(model);
    const int B = s.B, T = s.T;
    const size_t BT = (size_t)B * T;

    const float loss0 = cpuref::model_forward(model, s.inputs.data(), s.targets.data(), B, T);
    const std::vector<float> adapted_logits = unpadded_logits(model, BT);
    check_max_abs("logits_max_abs", adapted_logits.data(), s.logits.data(), adapted_logits.size(), kTol);
    check_rel_l2("logits_rel_l2", adapted_logits.data(), s.logits.data(), adapted_logits.size(), kTol);
    check_scalar("loss", loss0, s.loss, kTol);

    cpuref::model_zero_grad(model);
    cpuref::model_backward(model);
    const float* grads = cpuref::model_lora_grads(model);
    check_scalar("adapter_grad_norm", cpuref::global_norm(grads, A), s.grad_norm, kTol);
    for (const AdapterTensor& t : layout)
        check_rel_l2("grad_" + t.name, grads + t.offset, s.grads.data() + t.offset, t.size, kTol);
    const std::vector<float> zeros(P, 0.0f);
    expect(same_bits(zeros, cpuref::model_grads(model)), "no_base_gradients", "a base parameter got a gradient");

    for (int step = 0; step < s.steps; step++) {
        float step_loss = loss0;
        if (step > 0) {
            step_loss = cpuref::model_forward(model, s.inputs.data(), s.targets.data(), B, T);
            cpuref::model_zero_grad(model);
            cpuref::model_backward(model);
        }
        check_scalar("train_loss_step_" + std::to_string(step), step_loss, s.losses[step], kTol);
        cpuref::model_update(model, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.grad_clip, step + 1);
    }
    expect(same_bits(base, cpuref::model_params(model)), "base_weights_bitwise_unchanged",
           "a base parameter changed in training");
    expect(all_tensors_changed(layout, init_adapters, cpuref::model_lora_params(model)), "every_adapter_trained",
           "an adapter tensor did not change in training");

    // ---- B = 0 (the paper's init): the model computes exactly what the base model does.
    cpuref::Model* other = cpuref::model_load(model_path.c_str());
    const float base_loss = cpuref::model_forward(other, s.inputs.data(), s.targets.data(), B, T);
    const std::vector<float> base_logits = unpadded_logits(other, BT);
    cpuref::model_enable_lora(other, {lc.rank, lc.alpha, lc.targets}, 1);
    {
        const float* p = cpuref::model_lora_params(other);
        bool a_ok = true, b_zero = true;
        for (const AdapterTensor& t : layout) {
            const bool is_a = t.name.back() == 'A';
            const double bound = 1.0 / std::sqrt((double)(t.size / lc.rank));  // A is (r, in)
            bool nonzero = false;
            for (size_t i = t.offset; i < t.offset + t.size; i++) {
                if (is_a) a_ok = a_ok && std::fabs(p[i]) <= bound;
                nonzero = nonzero || p[i] != 0.0f;
                b_zero = b_zero && (is_a || p[i] == 0.0f);
            }
            a_ok = a_ok && (!is_a || nonzero);
        }
        expect(a_ok && b_zero, "enable_lora_init", "A must be nonzero within +-1/sqrt(in), B zero");
    }
    const float zero_b_loss = cpuref::model_forward(other, s.inputs.data(), s.targets.data(), B, T);
    expect(same_bits(base_logits, unpadded_logits(other, BT).data()) && zero_b_loss == base_loss,
           "zero_b_logits_bitwise", "logits or loss with B = 0 differ from the base model's");

    // ---- Merging: the initial adapters (nonzero B) into the base weights, and back out.
    if (!cpuref::lora_load(other, init_path.c_str(), &error)) fail("adapter_reload", error);
    cpuref::lora_merge(other);
    cpuref::Model* exported = cpuref::model_load((dir + "/merged.bin").c_str());
    check_max_abs("merge_matches_pytorch_export", cpuref::model_params(other), cpuref::model_params(exported), P,
                  kMergeTol);
    cpuref::model_free(exported);
    cpuref::model_forward(other, s.inputs.data(), s.targets.data(), B, T);
    check_max_abs("merged_logits_vs_adapters", unpadded_logits(other, BT).data(), adapted_logits.data(),
                  adapted_logits.size(), kTol);
    cpuref::lora_unmerge(other);
    check_max_abs("unmerge_restores_base", cpuref::model_params(other), base.data(), P, kMergeTol);

    // ---- Adapter files: our writer produces PyTorch's bytes, and save + load is exact.
    const std::string saved_init = dir + "/saved_init.bin", saved_trained = dir + "/saved_trained.bin";
    expect(cpuref::lora_save(other, saved_init.c_str(), &error) && read_bytes(saved_init) == read_bytes(init_path),
           "adapter_file_bytes_match_pytorch", error.empty() ? "the files differ" : error);
    const std::vector<float> trained = lora_params_copy(model);
    error.clear();
    const bool round_trip = cpuref::lora_save(model, saved_trained.c_str(), &error) &&
                            cpuref::lora_load(other, saved_trained.c_str(), &error);
    const cpuref::LoraConfig* loaded = cpuref::model_lora(other);
    expect(round_trip && same_bits(trained, cpuref::model_lora_params(other)) && loaded->rank == lc.rank &&
               loaded->alpha == lc.alpha && loaded->targets == lc.targets,
           "adapter_save_load_round_trip", error.empty() ? "loaded adapters differ from the saved ones" : error);

    // ---- Bad adapter files: the expected one-line error, and the model's adapters untouched.
    const std::vector<char> good = read_bytes(init_path);
    struct BadFile {
        const char* name;
        int word;        // header word to set, or -1
        int value;       // its new value
        long resize_by;  // bytes to add (> 0) or cut (< 0) at the end
        std::string message;
    };
    const long good_size = (long)good.size();
    const unsigned nan_bits = 0x7fc00000u, zero_bits = 0u;
    const std::string bad_bitmask = "(expected 1..15: 1 qkv, 2 attn-proj, 4 fc, 8 fc-proj)";
    const std::vector<BadFile> bad_files = {
        {"bad_magic", 0, 20240326, 0, "bad adapter magic 20240326 (expected 20261127)"},
        {"bad_version", 1, 2, 0, "unsupported adapter version 2 (expected 1)"},
        {"zero_rank", 2, 0, 0, "adapter rank 0 must be positive"},
        {"negative_rank", 2, -4, 0, "adapter rank -4 must be positive"},
        {"nan_alpha", 3, (int)nan_bits, 0, "adapter alpha nan must be finite and positive"},
        {"zero_alpha", 3, (int)zero_bits, 0, "adapter alpha 0 must be finite and positive"},
        {"zero_bitmask", 4, 0, 0, "bad adapter target bitmask 0 " + bad_bitmask},
        {"big_bitmask", 4, 16, 0, "bad adapter target bitmask 16 " + bad_bitmask},
        {"layer_mismatch", 5, 3, 0, "adapters for 3 layers, 128 channels; the model has 2 layers, 128 channels"},
        {"channel_mismatch", 6, 64, 0, "adapters for 2 layers, 64 channels; the model has 2 layers, 128 channels"},
        {"tensor_count", 7, 15, 0, "header says 15 tensors, expected 16 (A and B per layer and target)"},
        {"rank_vs_data", 2, 8, 0, "truncated: " + std::to_string(good_size) + " bytes, its header implies " +
                                       std::to_string(1024 + 2 * (good_size - 1024))},
        {"truncated_tensors", -1, 0, -4, "truncated: " + std::to_string(good_size - 4) + " bytes, its header implies " +
                                             std::to_string(good_size)},
        {"trailing_data", -1, 0, 4, std::to_string(good_size + 4) + " bytes, its header implies " +
                                        std::to_string(good_size) + " (trailing data)"},
        {"truncated_header", -1, 0, 100 - good_size, "truncated adapter header (100 bytes)"},
    };
    for (const BadFile& b : bad_files) {
        std::vector<char> bytes = good;
        if (b.word >= 0) std::memcpy(bytes.data() + 4 * b.word, &b.value, 4);
        bytes.resize((size_t)(good_size + b.resize_by));
        const std::string path = dir + "/bad_" + b.name + ".bin";
        write_bytes(path, bytes);
        error.clear();
        const bool loaded_bad = cpuref::lora_load(other, path.c_str(), &error);
        const std::string want = path + ": " + b.message;
        expect(!loaded_bad && error == want && same_bits(trained, cpuref::model_lora_params(other)),
               std::string("bad_adapter_") + b.name,
               loaded_bad ? "accepted" : "got \"" + error + "\", expected \"" + want + "\" and the adapters unchanged");
    }
    {
        const std::string path = dir + "/no_such_adapter.bin";
        error.clear();
        const bool loaded_missing = cpuref::lora_load(other, path.c_str(), &error);
        expect(!loaded_missing && error.rfind(path + ": cannot open adapter file", 0) == 0 &&
                   error.find('\n') == std::string::npos,
               "bad_adapter_missing_file", "got \"" + error + "\"");
    }

    // ---- Adapter dropout 0.1 in PyTorch training ran and trained every adapter tensor.
    error.clear();
    const bool dropout_loaded = cpuref::lora_load(other, (dir + "/lora_dropout.bin").c_str(), &error);
    expect(dropout_loaded && all_tensors_changed(layout, init_adapters, cpuref::model_lora_params(other)),
           "dropout_training_ran", dropout_loaded ? "an adapter tensor did not change" : error);

    cpuref::model_free(other);
    cpuref::model_free(model);
    return check_failures() ? 1 : 0;
}
