// Whole model on the GPU against the PyTorch reference's debug state (docs/formats.md): step-0 logits,
// loss, gradient norm and every parameter gradient, then the losses of S AdamW steps on the same batch, and in
// fp16 a step whose gradients overflow (skipped, parameters unchanged, loss scale halved); in every precision a
// step with an injected NaN gradient or inf loss (skipped, parameters and optimizer state unchanged). ZeRO-Offload: the
// same steps with the optimizer state on the host (--offload optimizer) equal the GPU-resident ones bit for bit, and
// skip an injected NaN gradient the same way.
// With a LoRA debug state (version 3, docs/lora.md) and the reference's adapter file: the adapter
// gradients instead, the base weights bitwise unchanged by the steps, and with B = 0 the base model's
// logits bitwise. A Llama-family model in fp32 also checks LoRA on slices of a product (check_lora_slices).
// Usage: test_model MODEL.bin STATE.bin fp32|bf16|fp16 [label] [ADAPTERS.bin]
// Prints one line per check ("PASS model ..." or "FAIL model ...") for the test runner; exits 1 on any failure.
#define TESTING
#include "../train_gpt.cu"
#include "../model/whole_model.cuh"  // defines: set_parameters, local_part, assemble_whole_model
#include "debug_state.h"
#include "check.h"

// Tolerances per precision. fp32 against fp32 PyTorch: only the summation order differs
// (and cuBLAS against PyTorch's kernels), so errors are ~1e-6 relative and the bounds leave 10-100x room.
// bf16/fp16 against PyTorch autocast: both round activations to 8 (bf16) or 11 (fp16) mantissa bits, but
// at different places (autocast keeps LayerNorm, softmax and residuals in fp32), so they differ by the
// rounding of each op, a few 1e-3 relative per op, accumulating over the layers.
struct Tolerances {
    float logits_max_abs, logits_rel_l2, loss_abs, grad_rel_l2, steps_loss_abs;
};
static Tolerances tolerances_for(Precision p) {
    if (p == Precision::FP32) return {1e-4f, 1e-5f, 1e-5f, 1e-4f, 1e-4f};
    return {INFINITY, 2e-2f, 2e-2f, 5e-2f, 3e-2f};
}
// The bounds for LoRA's adapter gradients and the step losses: 1e-5 (fp32), 2e-2 (bf16/fp16). Only the
// small adapters train, so the losses move little and stay closer than in full training.
static Tolerances lora_tolerances_for(Precision p) {
    Tolerances t = tolerances_for(p);
    t.grad_rel_l2 = t.steps_loss_abs = p == Precision::FP32 ? 1e-5f : 2e-2f;
    return t;
}

// Logits (B*T, V) of the uploaded batch: a forward only (the classifier would overwrite them with their gradient).
template <typename floatX>
static std::vector<float> unpadded_logits(Transformer<floatX>& model) {
    const int Vp = model.config.padded_vocab_size, V = model.config.vocab_size;
    const size_t rows = (size_t)model.B * model.T;
    model.forward(false, 0.0f);
    std::vector<float> padded = device_to_host_floats(model.logits, rows * Vp);
    std::vector<float> logits(rows * V);
    for (size_t r = 0; r < rows; r++) memcpy(&logits[r * V], &padded[r * Vp], V * sizeof(float));
    return logits;
}

// ZeRO-Offload on one rank: two fresh models from `values`, one with the optimizer state on the GPU and one with it on
// the host (AdamW on the CPU, kernels/adamw_cpu.h: the kernel's arithmetic bit for bit), take the debug state's steps
// on its batch: every step's loss and gradient norm, then the parameters, master weights and Adam moments, are bitwise
// equal. Then a NaN gradient skips the offloaded step: parameters and optimizer state unchanged, the skip counted.
template <typename floatX>
static void check_offload(const ModelConfig& config, const std::vector<float>& values, const DebugState& state, const std::string& label,
                          Precision precision, cudaStream_t stream) {
    ProcessGroup single;
    const ProcessMesh mesh;
    Transformer<floatX> resident(config, single, mesh, 0, stream), offloaded(config, single, mesh, 0, stream);
    offloaded.zero->set_offload(Offload::kOptimizer, 0);
    AdamWHyper h{state.lr, state.beta1, state.beta2, state.eps, state.weight_decay, state.grad_clip, 1.0f, 0, 1234};
    auto forward_backward = [&](Transformer<floatX>& m) {
        m.zero_grad();
        m.forward(true, m.dloss(1));
        m.accumulate_loss();
        m.backward();
    };
    auto snapshot = [](Transformer<floatX>& m) {
        std::vector<float> master, adam_m, adam_v;
        m.zero->optimizer_state_to_host(master, adam_m, adam_v);
        std::vector<float> all = m.zero->parameters_host();
        for (auto* part : {&master, &adam_m, &adam_v}) all.insert(all.end(), part->begin(), part->end());
        return all;
    };
    std::vector<float> reports[2], states[2];
    Transformer<floatX>* models[2] = {&resident, &offloaded};
    for (int i = 0; i < 2; i++) {
        Transformer<floatX>& m = *models[i];
        m.allocate(state.B, state.T);
        set_parameters(m, values);
        if (precision == Precision::FP16) m.trained().scaler.scale = 1024.0f;
        m.upload_batch(state.inputs.data(), state.targets.data());
        for (int step = 0; step < state.steps; step++) {
            forward_backward(m);
            h.t = step + 1;
            const StepReport r = m.step(h);
            reports[i].insert(reports[i].end(), {r.loss, r.grad_norm, r.loss_scale, (float)r.skipped});
        }
        states[i] = snapshot(m);
    }
    char buf[160];
    snprintf(buf, sizeof(buf), "last loss %.7f / %.7f, %zu state values", reports[0].end()[-4], reports[1].end()[-4], states[1].size());
    check(reports[0] == reports[1] && states[0] == states[1],
          label + " offload: " + std::to_string(state.steps) + " steps with the optimizer state on the host equal the GPU's bit for bit "
                  "(losses, norms, parameters, master weights, Adam moments)", buf);
    forward_backward(offloaded);
    cudaCheck(cudaMemsetAsync(offloaded.zero->unit_grads(offloaded.layout.wte_unit) + 5, 0xFF, sizeof(floatX), stream));  // NaN
    const long skipped_before = offloaded.zero->scaler.skipped_steps;
    h.t = state.steps + 1;
    const StepReport r = offloaded.step(h);
    check(r.skipped && offloaded.zero->scaler.skipped_steps == skipped_before + 1 && snapshot(offloaded) == states[1],
          label + " offload: a NaN gradient skips the host's step, parameters and optimizer state bitwise unchanged", "");
}

template <typename floatX>
static void run(const std::string& model_path, const DebugState& state, const std::string& label, Precision precision,
                const std::string& adapter_path) {
    std::vector<float> values;
    ModelConfig config = read_model_file(model_path, values);
    LoraSpec lora;
    std::vector<float> adapter_values;
    if (state.lora_rank > 0) {
        if (adapter_path.empty()) die("a LoRA debug state needs the adapter file as the fifth argument");
        lora = read_adapter_file(adapter_path, config, 8, adapter_values);
        if (lora.rank != state.lora_rank || lora.alpha != state.lora_alpha || lora.targets != state.lora_targets)
            die(adapter_path + ": rank, alpha or targets differ from the debug state's");
    }
    const Tolerances tol = state.lora_rank > 0 ? lora_tolerances_for(precision) : tolerances_for(precision);
    const int B = state.B, T = state.T, V = config.vocab_size;
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    ProcessGroup single;  // one process, no communicator
    const ProcessMesh mesh;
    Transformer<floatX> model(config, single, mesh, 0, stream, lora);
    model.allocate(B, T);
    set_parameters(model, values);
    if (lora.enabled()) model.adapters->set_parameters(adapter_values);
    if (precision == Precision::FP16) model.trained().scaler.scale = 1024.0f;
    model.upload_batch(state.inputs.data(), state.targets.data());
    const std::vector<float> logits = unpadded_logits(model);
    double max_abs = 0.0;
    for (size_t i = 0; i < logits.size(); i++) max_abs = std::max(max_abs, (double)fabsf(logits[i] - state.logits[i]));
    const double logits_rel = relative_l2(logits.data(), state.logits.data(), logits.size());
    char buf[256];
    snprintf(buf, sizeof(buf), "max abs %.3g (tol %.3g), rel L2 %.3g (tol %.3g)", max_abs, tol.logits_max_abs, logits_rel, tol.logits_rel_l2);
    check(max_abs <= tol.logits_max_abs && logits_rel <= tol.logits_rel_l2, label + " logits", buf);

    // loss and gradients of step 0
    model.zero_grad();
    model.forward(true, model.dloss(1));
    model.accumulate_loss();
    const float loss = model.take_mean_loss();
    snprintf(buf, sizeof(buf), "ours %.7f reference %.7f (tol %.3g)", loss, state.loss, tol.loss_abs);
    check(fabsf(loss - state.loss) <= tol.loss_abs, label + " loss", buf);
    model.backward();
    std::vector<float> grads = model.trained().gradients_host();
    double norm_squared = 0.0;
    for (float& g : grads) {
        g /= model.trained().scaler.scale;
        norm_squared += (double)g * g;
    }
    const double norm = sqrt(norm_squared);
    snprintf(buf, sizeof(buf), "ours %.6g reference %.6g", norm, state.grad_norm);
    check(fabs(norm - state.grad_norm) <= tol.grad_rel_l2 * state.grad_norm, label + " grad norm", buf);
    if (lora.enabled()) {
        // adapter-file order: each layer's unit, each target's A then B
        const AdapterLayout& al = *model.adapter_layout;
        size_t offset = 0;
        for (int l = 0; l < config.num_layers; l++)
            for (int t = 0; t < kLoraTargets; t++) {
                if (!lora.targets_has(t)) continue;
                const size_t na = (size_t)lora.rank * lora_in(t, config), nb = (size_t)lora_out(t, config) * lora.rank;
                const double ra = relative_l2(&grads[al.a(l, t)], &state.grads[offset], na);
                const double rb = relative_l2(&grads[al.b(l, t)], &state.grads[offset + na], nb);
                snprintf(buf, sizeof(buf), "A rel L2 %.3g, B rel L2 %.3g (tol %.3g)", ra, rb, tol.grad_rel_l2);
                check(ra <= tol.grad_rel_l2 && rb <= tol.grad_rel_l2, label + " adapter grads layer " + std::to_string(l) + " " + lora_target_name(t), buf);
                offset += na + nb;
            }
    } else {
        // the reference writes gradients in file order: compare tensor by tensor (those the family has)
        const char* names[17] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w",
                                 "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb", "lm_head"};
        std::vector<float> file_order(grads.size());
        model.layout.for_each_file_run([&](size_t file_offset, size_t device_offset, size_t count) {
            memcpy(&file_order[file_offset], &grads[device_offset], count * sizeof(float));
        });
        size_t offset = 0;
        const size_t L = config.num_layers, C = config.channels, vocab_rows = (size_t)config.padded_vocab_size * C;
        for (int t = 0; t < 17; t++) {
            const size_t count = t == 0    ? vocab_rows
                                 : t == 1  ? (config.has_wpe() ? (size_t)config.max_seq_len * C : 0)
                                 : t == 14 ? C
                                 : t == 15 ? (config.has_biases() ? C : 0)
                                 : t == 16 ? (config.tied_head ? 0 : vocab_rows)
                                           : model.layout.block_tensor_size[t - 2] * L;
            if (count == 0) continue;
            const double rel = relative_l2(&file_order[offset], &state.grads[offset], count);
            snprintf(buf, sizeof(buf), "rel L2 %.3g (tol %.3g)", rel, tol.grad_rel_l2);
            check(rel <= tol.grad_rel_l2, label + " grad " + names[t], buf);
            offset += count;
        }
        check(offset == file_order.size() && offset == state.grads.size(), label + " gradients compared: every tensor of the model file",
              std::to_string(offset) + " of " + std::to_string(file_order.size()) + " (the reference's " + std::to_string(state.grads.size()) + ")");
        bool padded_zero = true;  // wte's padded rows, and an untied head's
        for (size_t i = (size_t)V * C; i < vocab_rows; i++) padded_zero = padded_zero && file_order[i] == 0.0f;
        if (!config.tied_head)
            for (size_t i = file_order.size() - vocab_rows + (size_t)V * C; i < file_order.size(); i++)
                padded_zero = padded_zero && file_order[i] == 0.0f;
        check(padded_zero, label + " padded vocabulary rows get zero gradient", "");
    }
    const std::vector<float> base_before = model.zero->parameters_host();

    // S AdamW steps on the same batch
    AdamWHyper h{state.lr, state.beta1, state.beta2, state.eps, state.weight_decay, state.grad_clip, 1.0f, 0, 1234};
    auto forward_backward = [&] {  // the batch's loss, with the gradients of one micro-step
        model.zero_grad();
        model.forward(true, model.dloss(1));
        model.accumulate_loss();
        model.backward();
        return model.take_mean_loss();
    };
    auto optimizer_step = [&](int t) {
        h.t = t;
        model.trained().step(h, model.loss.nonfinite);  // the optimizer alone: the losses are taken apart
        cudaCheck(cudaStreamSynchronize(stream));
        return model.trained().finish_step();  // also the fp16 loss scale's update
    };
    double worst = 0.0;
    std::string detail;
    for (int step = 0; step < state.steps; step++) {
        const float step_loss = step > 0 ? forward_backward() : loss;
        worst = std::max(worst, (double)fabsf(step_loss - state.losses[step]));
        snprintf(buf, sizeof(buf), " %d:%.5f/%.5f", step, step_loss, state.losses[step]);
        detail += buf;
        optimizer_step(step + 1);
    }
    snprintf(buf, sizeof(buf), "max abs diff %.3g (tol %.3g); ours/ref", worst, tol.steps_loss_abs);
    check(worst <= tol.steps_loss_abs, label + " " + std::to_string(state.steps) + " step losses", buf + detail);
    if (precision == Precision::FP16) {
        // A loss scale far past fp16's range (65504) makes the gradients inf: the kernels must skip the update
        // and finish_step() must report the skip and halve the scale, by the same test on the same norm.
        auto& zero = model.trained();
        const std::vector<float> before = zero.parameters_host();
        const long skipped_before = zero.scaler.skipped_steps;
        zero.scaler.scale = 1e30f;
        forward_backward();
        const auto result = optimizer_step(state.steps + 1);
        snprintf(buf, sizeof(buf), "grad norm %g, skipped %d, scale %g, skipped steps %ld", result.grad_norm,
                 (int)result.skipped, zero.scaler.scale, zero.scaler.skipped_steps);
        check(result.skipped && !std::isfinite(result.grad_norm) && zero.scaler.scale == 1e30f * 0.5f &&
                  zero.scaler.skipped_steps == skipped_before + 1 && zero.parameters_host() == before,
              label + " fp16 overflow: step skipped, parameters bitwise unchanged, scale halved", buf);
    }
    if (!lora.enabled()) {
        // In every precision, a step with a non-finite gradient (a NaN written into one wte gradient) or a non-finite
        // loss (an inf written into one row's loss, the gradients finite) is skipped: parameters, master weights and
        // Adam moments bitwise unchanged, the skip counted. A clean step first must change the parameters, so the
        // comparison can fail.
        auto& zero = *model.zero;
        auto snapshot = [&] {
            std::vector<float> master, m, v;
            zero.optimizer_state_to_host(master, m, v);
            std::vector<float> all = zero.parameters_host();
            for (auto* part : {&master, &m, &v}) all.insert(all.end(), part->begin(), part->end());
            return all;
        };
        const char* injections[] = {"clean step", "NaN gradient", "inf loss"};
        for (int inject = 0; inject < 3; inject++) {
            zero.scaler.scale = precision == Precision::FP16 ? 1024.0f : 1.0f;  // the overflow check above left it huge
            model.zero_grad();
            model.forward(true, model.dloss(1));
            model.accumulate_loss();
            if (inject == 2) {
                const float inf = INFINITY;
                cudaCheck(cudaStreamSynchronize(stream));
                cudaCheck(cudaMemcpy(model.loss.mine + 3, &inf, sizeof(float), cudaMemcpyHostToDevice));
            }
            model.backward();
            if (inject == 1) cudaCheck(cudaMemsetAsync(zero.unit_grads(model.layout.wte_unit) + 5, 0xFF, sizeof(floatX), stream));  // all ones: NaN in fp32, bf16 and fp16
            model.request_losses();
            const std::vector<float> before = snapshot();
            const long skipped_before = zero.scaler.skipped_steps;
            const auto result = optimizer_step(state.steps + 2 + inject);
            const float step_loss = model.take_mean_loss();
            const bool unchanged = snapshot() == before;
            snprintf(buf, sizeof(buf), "loss %g, grad norm %g, skipped %d, skipped steps %ld -> %ld, state unchanged %d", step_loss,
                     result.grad_norm, (int)result.skipped, skipped_before, zero.scaler.skipped_steps, (int)unchanged);
            const bool expect_skip = inject > 0;
            check(result.skipped == expect_skip && unchanged == expect_skip && zero.scaler.skipped_steps == skipped_before + expect_skip,
                  label + " " + injections[inject] + (expect_skip ? ": step skipped, parameters and optimizer state bitwise unchanged, skip counted"
                                                                  : ": not skipped, parameters change"), buf);
        }
    }
    if (!lora.enabled()) check_offload<floatX>(config, values, state, label, precision, stream);
    if (lora.enabled()) {
        check(model.zero->parameters_host() == base_before, label + " LoRA: base weights bitwise unchanged by the steps", "");
        // B = 0: the adapted model computes exactly the base model
        for (int l = 0; l < config.num_layers; l++)
            for (int t = 0; t < kLoraTargets; t++)
                if (lora.targets_has(t))
                    std::fill_n(adapter_values.begin() + model.adapter_layout->b(l, t), (size_t)lora_out(t, config) * lora.rank, 0.0f);
        model.adapters->set_parameters(adapter_values);
        Transformer<floatX> base(config, single, mesh, 0, stream);
        base.linear.gelu_fusion = model.fc_gelu_fused();  // an fc adapter keeps the GELU out of the product: the same path
        base.allocate(B, T);
        set_parameters(base, values);
        base.upload_batch(state.inputs.data(), state.targets.data());
        model.upload_batch(state.inputs.data(), state.targets.data());
        check(unpadded_logits(model) == unpadded_logits(base), label + " LoRA: with B = 0 the logits equal the base model's bitwise", "");
    }
    cudaCheck(cudaStreamDestroy(stream));
}

// LoRA on slices of a product (the Llama family's q, k, v of qkv and gate, up of fc, PEFT's adapters) against the same
// adapters as whole-product ones (qkv and fc at rank 3r: A the slices' A stacked, B block-diagonal, the third block of
// fc's zero; alpha 3x, so the scales agree) on the same base and batch, fp32: logits and loss within the summation
// order's rounding (1e-5 relative: the products differ in shape, not in what they sum), and every slice adapter's dA and
// dB equal to its block of the whole-product adapter's gradients within 1e-5 relative.
static void check_lora_slices(const std::string& model_path, const DebugState& state, const std::string& label) {
    std::vector<float> values;
    const ModelConfig config = read_model_file(model_path, values);
    const int r = 2, B = state.B, T = state.T;
    LoraSpec slices, whole;
    slices.rank = r;
    slices.alpha = 4.0f;
    slices.targets = 1u << kLoraQ | 1u << kLoraK | 1u << kLoraV | 1u << kLoraGate | 1u << kLoraUp;
    whole.rank = 3 * r;
    whole.alpha = 3 * slices.alpha;
    whole.targets = 1u << kLoraQkv | 1u << kLoraFc;
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    ProcessGroup single;
    const ProcessMesh mesh;
    Transformer<float> ms(config, single, mesh, 0, stream, slices), mw(config, single, mesh, 0, stream, whole);
    ms.allocate(B, T);
    mw.allocate(B, T);
    set_parameters(ms, values);
    set_parameters(mw, values);
    const AdapterLayout &ls = *ms.adapter_layout, &lw = *mw.adapter_layout;
    std::vector<float> as(ls.total, 0.0f), aw(lw.total, 0.0f);
    uint64_t seed = 99;
    auto draw = [&]() { seed = splitmix64(seed); return (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5) * 0.2f; };
    // slice t of whole product w: its A rows [block r, block r + r) of w's A, its B the (out x r) block at rows
    // lora_out_offset(t), columns [block r, block r + r) of w's B
    auto block_of = [](int t) { return t == kLoraQ || t == kLoraGate ? 0 : t == kLoraK || t == kLoraUp ? 1 : 2; };
    for (int l = 0; l < config.num_layers; l++)
        for (int t : {kLoraQ, kLoraK, kLoraV, kLoraGate, kLoraUp}) {
            const int w = lora_product(t), in = lora_in(t, config), out = lora_out(t, config), k = block_of(t), col = lora_out_offset(t, config);
            for (int i = 0; i < r * in; i++) as[ls.a(l, t) + i] = aw[lw.a(l, w) + (size_t)k * r * in + i] = draw();
            for (int o = 0; o < out; o++)
                for (int j = 0; j < r; j++)
                    as[ls.b(l, t) + (size_t)o * r + j] = aw[lw.b(l, w) + (size_t)(col + o) * 3 * r + k * r + j] = draw();
        }
    ms.adapters->set_parameters(as);
    mw.adapters->set_parameters(aw);
    ms.upload_batch(state.inputs.data(), state.targets.data());
    mw.upload_batch(state.inputs.data(), state.targets.data());
    const std::vector<float> logits_s = unpadded_logits(ms), logits_w = unpadded_logits(mw);
    const double logits_rel = relative_l2(logits_s.data(), logits_w.data(), logits_s.size());
    char buf[256];
    snprintf(buf, sizeof(buf), "rel L2 %.3g (tol 1e-5)", logits_rel);
    check(logits_rel <= 1e-5, label + " LoRA slices q, k, v, gate, up: logits equal whole-product adapters'", buf);
    float loss[2];
    Transformer<float>* models[2] = {&ms, &mw};
    for (int m = 0; m < 2; m++) {
        models[m]->zero_grad();
        models[m]->forward(true, models[m]->dloss(1));
        models[m]->accumulate_loss();
        loss[m] = models[m]->take_mean_loss();
        models[m]->backward();
    }
    snprintf(buf, sizeof(buf), "%.7f and %.7f", loss[0], loss[1]);
    check(fabsf(loss[0] - loss[1]) <= 1e-5f * fabsf(loss[1]), label + " LoRA slices: loss equal whole-product adapters'", buf);
    const std::vector<float> gs = ms.adapters->gradients_host(), gw = mw.adapters->gradients_host();
    std::vector<float> mine, theirs;
    for (int l = 0; l < config.num_layers; l++)
        for (int t : {kLoraQ, kLoraK, kLoraV, kLoraGate, kLoraUp}) {
            const int w = lora_product(t), in = lora_in(t, config), out = lora_out(t, config), k = block_of(t), col = lora_out_offset(t, config);
            for (int i = 0; i < r * in; i++) {
                mine.push_back(gs[ls.a(l, t) + i]);
                theirs.push_back(gw[lw.a(l, w) + (size_t)k * r * in + i]);
            }
            for (int o = 0; o < out; o++)
                for (int j = 0; j < r; j++) {
                    mine.push_back(gs[ls.b(l, t) + (size_t)o * r + j]);
                    theirs.push_back(gw[lw.b(l, w) + (size_t)(col + o) * 3 * r + k * r + j]);
                }
        }
    const double grads_rel = relative_l2(mine.data(), theirs.data(), mine.size());
    snprintf(buf, sizeof(buf), "rel L2 %.3g over %zu values (tol 1e-5)", grads_rel, mine.size());
    check(grads_rel <= 1e-5, label + " LoRA slices: dA and dB equal their blocks of the whole-product adapters'", buf);
    cudaCheck(cudaStreamDestroy(stream));
}

int main(int argc, char** argv) {
    check_suite("model");
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.bin STATE.bin fp32|bf16|fp16 [label] [ADAPTERS.bin]\n", argv[0]);
        return 2;
    }
    const std::string precision = argv[3];
    const std::string label = argc > 4 ? argv[4] : precision;
    const std::string adapters = argc > 5 ? argv[5] : "";
    DebugState state = read_debug_state(argv[2]);
    matmul_setup(false);
    if (precision == "fp32") {
        run<float>(argv[1], state, label, Precision::FP32, adapters);
        if (adapters.empty() && read_model_config(argv[1]).llama()) check_lora_slices(argv[1], state, label);
    } else if (precision == "bf16") run<__nv_bfloat16>(argv[1], state, label, Precision::BF16, adapters);
    else if (precision == "fp16") run<__half>(argv[1], state, label, Precision::FP16, adapters);
    else die("precision must be fp32, bf16 or fp16, got '" + precision + "'");
    matmul_teardown();
    return check_failures() == 0 ? 0 : 1;
}
