// Checks the C++ CPU reference against the PyTorch reference (scripts/reference/gpt2_reference.py debug-state).
//
// Usage: test_cpu_reference MODEL_FILE DEBUG_STATE_FILE
// Prints one line per check (check.h: "PASS <name>  <detail>" or "FAIL <name>: <detail>") and exits 1 if any
// check failed; a bad model or debug-state file is a one-line error and exit 1.
//
// Tolerances: 1e-5 relative for everything. Both sides are fp32 computations from identical parameters and
// tokens and differ only in accumulation order: this side accumulates long reductions in double, PyTorch in
// fp32. Against a float64 PyTorch run this side is within ~1e-7; PyTorch's own fp32 error dominates and is
// largest in the gradients (every one flows through the LM-head backward, a 50257-term sum): ~5e-7 with a
// blocked BLAS (OpenBLAS), up to ~5e-6 with Debian's default reference BLAS, which sums sequentially. Real bugs
// (wrong index, missing term, wrong scale) give errors of 1e-3 or more.
#include <cmath>
#include <cstdio>
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

}  // namespace

int main(int argc, char** argv) {
    check_suite("cpu_reference");
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s MODEL_FILE DEBUG_STATE_FILE\n", argv[0]);
        return 1;
    }
    cpuref::Model* model = cpuref::model_load(argv[1]);
    const cpuref::Config& cfg = cpuref::model_config(model);
    const size_t P = cpuref::model_num_params(model);
    const std::string state_path = argv[2];
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
    return check_failures() ? 1 : 0;
}
