// Checks the C++ CPU reference against the PyTorch reference (scripts/gpt2_reference.py debug-state).
//
// Usage: test_cpu_reference MODEL_FILE DEBUG_STATE_FILE
// Prints one line per check, "PASS <name>" or "FAIL <name>: <detail>" (measured errors go on "# " lines before
// them) and exits 1 if any check failed.
//
// Tolerances: 1e-5 relative for everything. Both sides compute in fp32 from identical parameters and tokens;
// they differ only in accumulation order (this side accumulates long reductions in double, PyTorch in fp32
// with blocked sums), which gives relative errors of ~1e-7..1e-6, well inside 1e-5, while any real bug
// (wrong index, missing term, wrong scale) shows up as errors of order 1e-3 or more.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_reference.h"

namespace {

constexpr int kStateMagic = 20240327;
constexpr int kStateVersion = 2;
constexpr int kHeaderInts = 256;
constexpr double kTol = 1e-5;

const char* const kTensorNames[16] = {"wte",  "wpe",  "ln1w", "ln1b", "qkvw", "qkvb",    "attprojw", "attprojb",
                                      "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

// Element counts of the 16 model-file tensors (docs/formats.md).
std::vector<size_t> tensor_sizes(const cpuref::Config& c) {
    const size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, T = c.max_seq_len;
    return {Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
            L * C,  L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
}

struct DebugState {
    int B = 0, T = 0, steps = 0, V = 0, Vp = 0, precision = 0;
    float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_clip = 0;
    std::vector<int> inputs, targets;
    std::vector<float> logits, grads, losses;
    float loss = 0, grad_norm = 0;
};

[[noreturn]] void die(const std::string& msg) {
    std::fprintf(stderr, "test_cpu_reference: %s\n", msg.c_str());
    std::exit(1);
}

float float_at(const int* header, int i) {
    float f;
    std::memcpy(&f, &header[i], sizeof f);
    return f;
}

DebugState load_state(const char* path, size_t num_params) {
    const std::string where = std::string(path) + ": ";
    FILE* f = std::fopen(path, "rb");
    if (!f) die(where + "cannot open debug-state file");
    int h[kHeaderInts];
    if (std::fread(h, sizeof(int), kHeaderInts, f) != (size_t)kHeaderInts) die(where + "truncated header");
    if (h[0] != kStateMagic)
        die(where + "bad debug-state magic " + std::to_string(h[0]) + " (expected " + std::to_string(kStateMagic) + ")");
    if (h[1] != kStateVersion)
        die(where + "unsupported debug-state version " + std::to_string(h[1]) + " (expected 2)");
    DebugState s;
    s.B = h[2], s.T = h[3], s.steps = h[4], s.V = h[5], s.Vp = h[6], s.precision = h[7];
    s.lr = float_at(h, 8), s.beta1 = float_at(h, 9), s.beta2 = float_at(h, 10);
    s.eps = float_at(h, 11), s.weight_decay = float_at(h, 12), s.grad_clip = float_at(h, 13);
    if (s.B <= 0 || s.T <= 0 || s.steps < 1 || s.V <= 0 || s.Vp < s.V) die(where + "invalid header dimensions");
    const size_t BT = (size_t)s.B * s.T;
    const size_t expected = sizeof(h) + 4 * (2 * BT + BT * s.V + 2 + num_params + s.steps);
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    if (size != (long)expected)
        die(where + "file size " + std::to_string(size) + " != " + std::to_string(expected) +
            " expected from its header and the model");
    std::fseek(f, sizeof(h), SEEK_SET);
    s.inputs.resize(BT);
    s.targets.resize(BT);
    s.logits.resize(BT * s.V);
    s.grads.resize(num_params);
    s.losses.resize(s.steps);
    bool ok = std::fread(s.inputs.data(), 4, BT, f) == BT && std::fread(s.targets.data(), 4, BT, f) == BT &&
              std::fread(s.logits.data(), 4, BT * s.V, f) == BT * s.V && std::fread(&s.loss, 4, 1, f) == 1 &&
              std::fread(&s.grad_norm, 4, 1, f) == 1 &&
              std::fread(s.grads.data(), 4, num_params, f) == num_params &&
              std::fread(s.losses.data(), 4, s.steps, f) == (size_t)s.steps;
    std::fclose(f);
    if (!ok) die(where + "truncated body");
    return s;
}

int failures = 0;

void report(const std::string& name, bool ok, const std::string& detail) {
    std::printf("# %s: %s\n", name.c_str(), detail.c_str());
    if (ok)
        std::printf("PASS %s\n", name.c_str());
    else {
        std::printf("FAIL %s: %s\n", name.c_str(), detail.c_str());
        failures++;
    }
}

std::string fmt(const char* format, double a, double b) {
    char buf[128];
    std::snprintf(buf, sizeof buf, format, a, b);
    return buf;
}

// ||ours - ref|| / ||ref|| (absolute when ref is all zero), in double.
double rel_l2(const float* ours, const float* ref, size_t n) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)ours[i] - ref[i]) * ((double)ours[i] - ref[i]);
        norm += (double)ref[i] * ref[i];
    }
    return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

void check_rel_l2(const std::string& name, const float* ours, const float* ref, size_t n) {
    const double err = rel_l2(ours, ref, n);
    report(name, err <= kTol, fmt("relative L2 error %.3e (tolerance %.0e)", err, kTol));
}

void check_scalar(const std::string& name, double ours, double ref) {
    const double err = std::fabs(ours - ref) / std::fabs(ref);
    report(name, err <= kTol, fmt("relative error %.3e (tolerance %.0e)", err, kTol) +
                                  fmt(", ours %.8g, reference %.8g", ours, ref));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s MODEL_FILE DEBUG_STATE_FILE\n", argv[0]);
        return 1;
    }
    cpuref::Model* model = cpuref::model_load(argv[1]);
    const cpuref::Config& cfg = cpuref::model_config(model);
    const size_t P = cpuref::model_num_params(model);
    const DebugState s = load_state(argv[2], P);
    if (s.V != cfg.vocab_size || s.Vp != cfg.padded_vocab_size)
        die(std::string(argv[2]) + ": vocab sizes do not match the model");
    if (s.T > cfg.max_seq_len) die(std::string(argv[2]) + ": T exceeds the model's max sequence length");
    if (s.precision != 0) die(std::string(argv[2]) + ": not an fp32 debug state (these tolerances are for fp32)");
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
    report("logits_max_abs", max_abs <= kTol, fmt("max abs error %.3e (tolerance %.0e)", max_abs, kTol));
    check_rel_l2("logits_rel_l2", ours.data(), s.logits.data(), ours.size());
    check_scalar("loss", loss, s.loss);

    // Step 0: backward.
    cpuref::model_zero_grad(model);
    cpuref::model_backward(model);
    const float* grads = cpuref::model_grads(model);
    check_scalar("grad_norm", cpuref::global_norm(grads, P), s.grad_norm);
    const std::vector<size_t> sizes = tensor_sizes(cfg);
    size_t offset = 0;
    for (int i = 0; i < 16; i++) {
        check_rel_l2(std::string("grad_") + kTensorNames[i], grads + offset, s.grads.data() + offset, sizes[i]);
        offset += sizes[i];
    }
    // wte is the first tensor: its rows V..Vp-1 are padding and must get exactly zero gradient on both sides.
    size_t nonzero_ours = 0, nonzero_ref = 0;
    for (size_t i = (size_t)V * cfg.channels; i < (size_t)Vp * cfg.channels; i++) {
        nonzero_ours += grads[i] != 0.0f;
        nonzero_ref += s.grads[i] != 0.0f;
    }
    report("wte_padded_rows_zero_grad", nonzero_ours == 0 && nonzero_ref == 0,
           fmt("nonzero padded-row gradients: ours %.0f, reference %.0f", (double)nonzero_ours, (double)nonzero_ref));

    // Training steps on the same batch; step 0 reuses the gradients above.
    for (int step = 0; step < s.steps; step++) {
        float step_loss = loss;
        if (step > 0) {
            step_loss = cpuref::model_forward(model, s.inputs.data(), s.targets.data(), B, T);
            cpuref::model_zero_grad(model);
            cpuref::model_backward(model);
        }
        check_scalar("train_loss_step_" + std::to_string(step), step_loss, s.losses[step]);
        cpuref::model_update(model, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.grad_clip, step + 1);
    }
    cpuref::model_free(model);
    std::printf("%s: %d check(s) failed\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
