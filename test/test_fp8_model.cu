// --precision fp8 on the whole model: a bf16 model and one whose blocks' linear layers multiply in FP8 (GPT2::fp8,
// model/fp8_linear.cuh), from the same weights and batch (2 layers, 2 heads, 128 channels, B=4, T=64, GPT-2's
// vocabulary): the loss of one forward, every gradient, and 10 AdamW steps on the batch; the FP8 scaling states after
// them (no non-finite amax, every scale set). On a GPU without FP8 the checks are skipped with the reason.
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
    std::vector<float> step_losses; // of the 10 AdamW steps
    bool any_skipped = false;
    Fp8Stats stats;
};

static Fp8ModelRun run_model(const ModelConfig& config, bool fp8, const std::vector<float>& parameters, const std::vector<int>& inputs,
                             const std::vector<int>& targets, int B, int T, cudaStream_t stream) {
    ProcessGroup single;
    const ProcessMesh mesh;
    GPT2<__nv_bfloat16> model(config, single, mesh, 0, stream);
    model.fp8 = fp8;
    model.allocate(B, T);
    model.zero->set_parameters(parameters);
    model.upload_batch(inputs.data(), targets.data());
    Fp8ModelRun r;
    auto forward_backward = [&] {
        model.zero_grad();
        model.forward(true, model.dloss(1));
        model.accumulate_loss();
        model.backward();
        return model.take_mean_loss();
    };
    r.loss = forward_backward();
    r.grads = model.trained().gradients_host();
    AdamWHyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 0, 1234};
    for (int step = 0; step < 10; step++) {
        r.step_losses.push_back(step > 0 ? forward_backward() : r.loss);  // step 0 takes the gradients above
        h.t = step + 1;
        model.trained().step(h, model.loss.nonfinite);  // the optimizer alone: the loss is taken above
        cudaCheck(cudaStreamSynchronize(stream));
        r.any_skipped = model.trained().finish_step().skipped || r.any_skipped;
    }
    if (fp8) r.stats = model.fp8_stats();
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
        GPT2<__nv_bfloat16> init(config, single, mesh, 0, stream);
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
    check(st.non_finite_amax == 0 && scales_set, "scaling states after the steps", st.line());

    cudaCheck(cudaStreamDestroy(stream));
    matmul_teardown();
    return check_failures() == 0 ? 0 : 1;
}
