// --precision fp8 on the whole model: a bf16 model and one whose blocks' linear layers multiply in FP8
// (LinearLayers::fp8, model/fp8_linear.cuh), from the same weights and batch (2 layers, 2 heads, 128 channels, B=4,
// T=64, GPT-2's vocabulary): the loss of one forward, every gradient, and 10 AdamW steps on the batch; the FP8 scaling
// states after them (no non-finite amax, every scale set). Current scaling with the weights' copies kept between
// parameter changes against casts at each use (ZeRO-3's path): bitwise the same losses and gradients (the same codes,
// the same scales). Delayed scaling (amax history 16) against current: 10 steps' losses within 2e-2 (both are E4M3
// roundings of the same tensors with scales from amaxes a step apart; the first step is current scaling in both, so
// equal), its saturated values counted. The kept weight copies after a step equal a fresh cast of the weights with
// their scale, bitwise, and so again after the parameters are set anew (as a checkpoint load does).
// Delayed scaling's inputs cast by their producers (the LayerNorms and the GELU, kernels/fp8_fused.cuh; steps 1-9,
// once the scales come from the history) against the layers casting them (LinearLayers::fp8_producer_casts false):
// the 10 steps' losses and the last step's gradients bitwise equal (the same codes under the same scales, the same
// amaxes in the history), and so at --recompute 1, 2 and 3 (the backward refilling the copies).
// On a GPU without FP8 the checks are skipped with the reason.
// Tolerances, from the formats: a value rounded to E4M3 (3 mantissa bits) is off by at most 2^-4 of itself, to E5M2
// (2 bits) by 2^-3, about 2.5% and 5% RMS over uniformly spread mantissas. A product of K terms with independent
// rounding errors is then off by about 3.5% (E4M3 x E4M3) to 6% (E4M3 x E5M2) RMS of its own size, and the
// errors of the 8 FP8 products along two blocks' backward add in quadrature to ~15%: gradients within 0.3 relative
// L2 of bf16's (2x), and not equal to them (which would mean the FP8 path did not run). The loss moves far less:
// logit errors of random sign average out over the 256 rows, so one forward's loss is within 2e-2 of bf16's
// (test_model's bound for bf16 against PyTorch's autocast), and 10 steps at lr 1e-4, whose updates AdamW normalises
// element by element, keep it within 5e-2.
// Usage: test_fp8_model (prints one line per check, "PASS fp8_model ..." or "FAIL fp8_model ..."; exits 1 on a failure)
#define TESTING
#include "../train_gpt.cu"
#include "check.h"
#include "gpu_check.h"

struct Fp8ModelRun {
    float loss = 0;                 // of the first forward
    std::vector<float> grads;       // of that forward's backward (all parameters, device layout)
    std::vector<float> last_grads;  // of the last step's backward
    std::vector<float> step_losses; // of the 10 AdamW steps
    int producer_cast_steps = 0;    // steps whose inputs the LayerNorms and the GELU cast (LinearLayers::fp8_inputs_from_producers)
    bool any_skipped = false;
    Fp8Stats stats;
    std::string cache_after_step, cache_after_load;  // "" when the kept weight copies equal a fresh cast, else where not
};

// "" when every block's kept weight copies (the weight and its transpose) are those of the parameters now (version)
// and equal, bitwise, a fresh transposing cast of the weights with the scale they hold; else the first that does not.
static std::string cache_mismatch(Transformer<__nv_bfloat16>& model, cudaStream_t stream) {
    Fp8Linear& f = model.linear.fp8_linear;
    const int C = model.config.channels;
    const int out_features[kFp8Layers] = {3 * C, C, 4 * C, C}, in_features[kFp8Layers] = {C, C, C, 4 * C};
    const BlockTensor tensors[kFp8Layers] = {QKVW, ATTPROJW, FCW, FCPROJW};
    for (int l = 0; l < f.blocks; l++) {
        for (int layer = 0; layer < kFp8Layers; layer++) {
            const std::string where = fmt("block %g ", l) + block_tensor_name(tensors[layer]);
            if (f.weights_version[(size_t)l * kFp8Layers + layer] != model.zero->parameters_version()) return where + ": copies of older parameters";
            const size_t n = (size_t)out_features[layer] * in_features[layer];
            Fp8Scaling* state;  // the copy's scale; the fresh cast's amax and counts land here, not in the model's
            uint8_t* fresh;
            cudaCheck(cudaMalloc(&state, sizeof(Fp8Scaling)));
            cudaCheck(cudaMalloc(&fresh, 2 * n));
            cudaCheck(cudaMemcpy(state, &f.at(l, (Fp8Layer)layer)->weight, sizeof(Fp8Scaling), cudaMemcpyDeviceToDevice));
            fp8_cast((__nv_fp8_e4m3*)fresh, (__nv_fp8_e4m3*)fresh + n, model.param(l, tensors[layer]), out_features[layer], in_features[layer],
                     state, stream);
            std::vector<uint8_t> expected(2 * n), kept(2 * n);
            cudaCheck(cudaStreamSynchronize(stream));
            cudaCheck(cudaMemcpy(expected.data(), fresh, 2 * n, cudaMemcpyDeviceToHost));
            const __nv_fp8_e4m3* copies = f.weights + fp8_weight_copies_offset(l, (Fp8Layer)layer, f.weight_sizes);
            cudaCheck(cudaMemcpy(kept.data(), copies, 2 * n, cudaMemcpyDeviceToHost));
            cudaCheck(cudaFree(state));
            cudaCheck(cudaFree(fresh));
            if (expected != kept) return where + ": the kept copies differ from a fresh cast";
        }
    }
    return "";
}

// One model from `parameters` on the batch: bf16 (fp8 false), or --precision fp8 with `options`, the weights' copies
// kept (cache) or cast at each use, the inputs cast by their producers where delayed scaling allows (producer_casts)
// or by the layers, at --recompute `recompute`. With the copies kept, after the steps: the copies against a fresh
// cast, then again after the parameters are set back to `parameters`.
static Fp8ModelRun run_model(const ModelConfig& config, bool fp8, const std::vector<float>& parameters, const std::vector<int>& inputs,
                             const std::vector<int>& targets, int B, int T, cudaStream_t stream, const Fp8Options& options = Fp8Options(),
                             bool cache = true, bool producer_casts = true, int recompute = kKeepAll) {
    ProcessGroup single;
    const ProcessMesh mesh;
    Transformer<__nv_bfloat16> model(config, single, mesh, 0, stream);
    model.linear.fp8 = fp8;
    model.linear.fp8_options = options;
    model.linear.fp8_producer_casts = producer_casts;
    model.allocate(B, T, recompute);
    if (fp8 && !cache) model.linear.fp8_linear.allocate(config, (size_t)B * T, config.num_layers, options, false);  // ZeRO-3's path
    model.zero->set_parameters(parameters);
    model.upload_batch(inputs.data(), targets.data());
    Fp8ModelRun r;
    auto forward_backward = [&] {
        model.zero_grad();
        model.training = true;  // as train_step: a backward follows the forward
        r.producer_cast_steps += model.linear.fp8_inputs_from_producers();
        model.forward(true, model.dloss(1));
        model.accumulate_loss();
        model.backward();
        model.training = false;
        return model.take_mean_loss();
    };
    r.loss = forward_backward();
    r.grads = model.trained().gradients_host();
    AdamWHyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 0, 1234};
    for (int step = 0; step < 10; step++) {
        r.step_losses.push_back(step > 0 ? forward_backward() : r.loss);  // step 0 takes the gradients above
        if (step == 9) r.last_grads = model.trained().gradients_host();
        h.t = step + 1;
        if (fp8) model.linear.fp8_linear.end_step(stream);      // as Transformer::step: delayed scaling's update
        model.trained().step(h, model.loss.nonfinite);  // the optimizer alone: the loss is taken above
        cudaCheck(cudaStreamSynchronize(stream));
        r.any_skipped = model.trained().finish_step().skipped || r.any_skipped;
    }
    if (fp8) r.stats = model.linear.fp8_stats();
    if (fp8 && cache) {
        model.forward(true, 0.0f);  // the first forward after the step casts the copies
        r.cache_after_step = cache_mismatch(model, stream);
        model.zero->set_parameters(parameters);  // as a checkpoint load: the parameters change outside a step
        model.forward(true, 0.0f);
        r.cache_after_load = cache_mismatch(model, stream);
    }
    cudaCheck(cudaStreamSynchronize(stream));
    return r;
}

static std::string losses_text(const std::vector<float>& losses) {
    std::string s;
    for (float l : losses) s += fmt("%.4f ", l);
    return s;
}

int main() {
    check_suite("fp8_model");
    if (!gpu_present("fp8 model against bf16")) return 0;
    const std::string problem = fp8_gpu_problem();
    if (!problem.empty()) {
        skip("fp8 model against bf16", problem);
        return 0;
    }
    ModelConfig config;  // GPT-2's vocabulary
    config.num_layers = 2;
    config.num_heads = 2;
    config.channels = 128;
    config.max_seq_len = 64;
    const int B = 4, T = 64;
    matmul_setup(false);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    std::vector<float> parameters;
    {
        ProcessGroup single;
        const ProcessMesh mesh;
        Transformer<__nv_bfloat16> init(config, single, mesh, 0, stream);
        init.allocate(B, T);
        init_parameters(init, 1337);
        parameters = init.zero->parameters_host();  // the bf16 values both models start from
    }
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    uint64_t state = 42;
    for (size_t i = 0; i < inputs.size(); i++) {
        state = splitmix64(state);
        inputs[i] = (int)(state % (uint64_t)config.vocab_size);
        targets[i] = (int)((state >> 32) % (uint64_t)config.vocab_size);
    }
    const Fp8ModelRun bf16 = run_model(config, false, parameters, inputs, targets, B, T, stream);
    const Fp8ModelRun fp8 = run_model(config, true, parameters, inputs, targets, B, T, stream);
    const Fp8ModelRun uncached = run_model(config, true, parameters, inputs, targets, B, T, stream, Fp8Options(), false);
    Fp8Options delayed_options;
    delayed_options.delayed = true;
    const Fp8ModelRun delayed = run_model(config, true, parameters, inputs, targets, B, T, stream, delayed_options);
    const Fp8ModelRun delayed_layer_casts = run_model(config, true, parameters, inputs, targets, B, T, stream, delayed_options, true, false);

    const double loss_diff = fabs((double)fp8.loss - bf16.loss);
    check(loss_diff <= 2e-2, "one forward's loss", fmt("fp8 %.6f bf16 %.6f, |difference| %.3g (tolerance 2e-2)", fp8.loss, bf16.loss, loss_diff));

    const double grad_err = relative_l2(fp8.grads.data(), bf16.grads.data(), bf16.grads.size());
    check(grad_err > 1e-4 && grad_err <= 0.3, "gradients against bf16",
          fmt("relative L2 error %.3g (tolerance 0.3; above 1e-4: the FP8 products ran) over %g parameters", grad_err, (double)bf16.grads.size()));

    double worst = 0;
    for (int i = 0; i < 10; i++) worst = std::max(worst, fabs((double)fp8.step_losses[i] - bf16.step_losses[i]));
    check(worst <= 5e-2, "10 AdamW steps' losses against bf16",
          fmt("max |difference| %.3g (tolerance 5e-2)", worst) + "; fp8 " + losses_text(fp8.step_losses) + "; bf16 " + losses_text(bf16.step_losses));
    bool decreasing = true;
    for (int i = 1; i < 10; i++) decreasing = decreasing && fp8.step_losses[i] < fp8.step_losses[i - 1];
    check(decreasing && !fp8.any_skipped, "10 AdamW steps: loss decreasing at every step, none skipped",
          "fp8 " + losses_text(fp8.step_losses) + (fp8.any_skipped ? "; a step was skipped" : ""));
    const Fp8Stats& st = fp8.stats;
    const bool scales_set = st.weight_scale[0] != 1.0f && st.input_scale[0] != 1.0f && st.output_grad_scale[0] != 1.0f &&
                            std::isfinite(st.weight_scale[1]) && std::isfinite(st.input_scale[1]) && std::isfinite(st.output_grad_scale[1]);
    check(st.non_finite_amax == 0 && st.overflow == 0 && scales_set, "scaling states after the steps (current scaling saturates nothing)", st.line());

    const bool same = fp8.step_losses == uncached.step_losses && fp8.grads == uncached.grads;
    check(same, "weight copies kept between steps against casts at each use (ZeRO-3's path): losses and gradients bitwise equal",
          "kept " + losses_text(fp8.step_losses) + "; at each use " + losses_text(uncached.step_losses));
    check(fp8.cache_after_step.empty(), "kept weight copies after a step equal a fresh cast (bitwise)", fp8.cache_after_step);
    check(fp8.cache_after_load.empty(), "kept weight copies after the parameters are set anew (a checkpoint load) equal a fresh cast", fp8.cache_after_load);
    check(delayed.cache_after_step.empty() && delayed.cache_after_load.empty(), "delayed scaling: kept weight copies equal a fresh cast",
          delayed.cache_after_step + delayed.cache_after_load);

    double worst_delayed = 0;
    for (int i = 0; i < 10; i++) worst_delayed = std::max(worst_delayed, fabs((double)delayed.step_losses[i] - fp8.step_losses[i]));
    check(worst_delayed <= 2e-2 && delayed.step_losses[0] == fp8.step_losses[0] && !delayed.any_skipped,
          "delayed scaling against current: 10 steps' losses within 2e-2, the first step (current scaling in both) equal",
          fmt("max |difference| %.3g; delayed ", worst_delayed) + losses_text(delayed.step_losses) + "; current " + losses_text(fp8.step_losses));
    const Fp8Stats& ds = delayed.stats;
    check(ds.non_finite_amax == 0 && std::isfinite(ds.weight_scale[1]) && ds.line().find("saturated values") != std::string::npos,
          "delayed scaling's states: no non-finite amax, saturated values counted", ds.line());

    check(delayed.producer_cast_steps == 9 && delayed_layer_casts.producer_cast_steps == 0 &&
              delayed.step_losses == delayed_layer_casts.step_losses && delayed.last_grads == delayed_layer_casts.last_grads,
          "delayed scaling: inputs cast by the LayerNorms and the GELU (steps 1-9) against the layers casting them: losses and last gradients bitwise equal",
          fmt("steps cast by the producers %g and %g (expected 9 and 0); ", delayed.producer_cast_steps, delayed_layer_casts.producer_cast_steps) +
              "producers " + losses_text(delayed.step_losses) + "; layers " + losses_text(delayed_layer_casts.step_losses));
    for (int level : {kRecomputeGelu, kRecomputeGeluLayerNorm, kRecomputeBlock}) {
        const Fp8ModelRun recomputed = run_model(config, true, parameters, inputs, targets, B, T, stream, delayed_options, true, true, level);
        check(recomputed.producer_cast_steps == 9 && recomputed.step_losses == delayed.step_losses && recomputed.last_grads == delayed.last_grads,
              fmt("delayed scaling with the producers' casts at --recompute %g: losses and last gradients bitwise those of --recompute 0", level),
              "recomputed " + losses_text(recomputed.step_losses) + "; kept " + losses_text(delayed.step_losses));
    }

    cudaCheck(cudaStreamDestroy(stream));
    matmul_teardown();
    return check_failures() == 0 ? 0 : 1;
}
