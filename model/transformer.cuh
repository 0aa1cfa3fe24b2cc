// The model: a transformer of either family (GPT-2, Llama) on one rank -- its parameters (sharded by ZeRO, split by
// tensor parallelism, a pipeline stage's part), its activation sets, and the forward and backward over a chunk of
// blocks and the head, one kernel call per operation. What it leaves to others: the memory plan (memory_plan.h,
// whose counts allocate() uses) and the activations' carving (activations.cuh), the family's choices inside a block
// (block_spec.cuh), the linear layers' products and their FP8 bookkeeping (linear_layers.cuh), ZB-H1's gradient
// slots (gradient_slots.cuh), the initial values (initialization.cuh, whole_model.cuh), LoRA's products
// (lora_hooks.cuh), the loss bookkeeping (loss.h), the tensor-parallel collectives (distributed/tensor_parallel.cuh),
// the optimizer and its sharding (distributed/zero.cuh), the pipeline's schedule (distributed/pipeline_parallel.cuh).
// defines: StepReport, Transformer
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/encoder.cuh"              // defines: encoder_forward, encoder_backward, EncoderBuckets
#include "../kernels/layernorm.cuh"            // defines: layernorm_forward, residual_layernorm_forward, residual_forward, layernorm_backward, kLayerNormWideMaxC
#include "../kernels/matmul.cuh"               // defines: matmul_forward, matmul_forward_gelu, matmul_backward (cuBLASLt), bias_backward
#include "../kernels/flash_attention.cuh"      // defines: flash_attention_forward, flash_attention_backward
#include "../kernels/attention_decode.cuh"     // defines: attention_decode
#include "../kernels/gelu.cuh"                 // defines: gelu_forward, gelu_backward
#include "../distributed/process_group.h"      // defines: ProcessGroup
#include "../distributed/mesh.h"               // defines: ProcessMesh
#include "../distributed/zero.cuh"             // defines: ZeroOptimizer, ZeroMemory
#include "../distributed/tensor_parallel.cuh"  // defines: TensorParallel (the f and g operators, vocabulary-parallel loss)
#include "config.h"                            // defines: ModelConfig, StageModel, ParameterLayout
#include "model_file.h"                        // defines: read_model_part
#include "lora.h"                              // defines: LoraSpec, AdapterLayout
#include "lora_hooks.cuh"                      // defines: LoraHooks
#include "nf4_base.cuh"                        // defines: Nf4Base (QLoRA's frozen NF4 base, ZeroOptimizer's unit source)
#include "batch_staging.h"                     // defines: BatchStaging
#include "loss.h"                              // defines: LossSums
#include "memory_plan.h"                       // defines: ActivationPlan, activation_counts, Recompute levels, device_memory_in_use
#include "activations.cuh"                     // defines: LayerActivations, ActivationSet, ActivationMemory
#include "backward_part.h"                     // defines: BackwardPart
#include "block_spec.cuh"                      // defines: BlockSpec (the family's norm, position encoding and MLP activation)
#include "linear_layers.cuh"                   // defines: LinearLayers (the four linear layers' products, bf16 or FP8), Fp8Copies
#include "gradient_slots.cuh"                  // defines: LayerOutputGrads, GradientSlots (ZB-H1's output gradients from B to W)

// every width --channels accepts has a LayerNorm backward
static_assert(kMaxChannels <= kLayerNormWideMaxC, "layernorm_backward holds rows up to kLayerNormWideMaxC wide");
// the backward's column-parallel products name their layer by its LoRA target, which is also its FP8 layer
static_assert((int)kFp8Qkv == (int)kLoraQkv && (int)kFp8AttnProj == (int)kLoraAttnProj && (int)kFp8Fc == (int)kLoraFc &&
                  (int)kFp8FcProj == (int)kLoraFcProj,
              "FP8 layers and LoRA targets name the four linear layers in the same order");

// ---------------------------------------------------------------------------------------------
// The model

// What a training step reports (Transformer::step): the mean loss over all ranks' rows, the gradient norm before
// clipping, the loss scale (fp16; 1 otherwise), whether the update was skipped, and how many steps have been skipped
// so far; whether any rank asked to stop after this step (the same on every rank).
struct StepReport {
    float loss = 0, grad_norm = 0, loss_scale = 1;
    bool skipped = false;
    long skipped_steps = 0;
    bool stop_requested = false;
};

template <typename floatX>
struct Transformer {
    using Float = floatX;
    ModelConfig config;
    ParameterLayout layout;       // this rank's parameters (its tensor-parallel slices)
    ParameterLayout full_layout;  // the whole model (tp = 1), same padding: model files, initialisation, checkpoints
    const ProcessGroup& pg;
    const ProcessMesh& mesh;
    TensorParallel<floatX> tensor_parallel;
    int B = 0, T = 0;  // activation shape (per rank)
    cudaStream_t stream = nullptr;
    // QLoRA (lora.nf4_base): the frozen base's blocks in NF4, which fill zero's ring of blocks (declared first: it
    // outlives zero)
    std::unique_ptr<Nf4Base<floatX>> nf4_base;
    // Parameters, gradients and optimizer state: stored, sharded and communicated as the ZeRO stage says.
    // Under LoRA `zero` holds the frozen base model (parameters only) and `adapters` the trained A and B.
    std::unique_ptr<ZeroOptimizer<floatX>> zero;
    LoraSpec lora;
    std::unique_ptr<AdapterLayout> adapter_layout;
    std::unique_ptr<ZeroOptimizer<floatX>> adapters;
    LoraHooks<floatX> lora_hooks;  // the adapters' products in the forward and backward
    BlockSpec<floatX> spec;        // what the family chooses inside a block
    // LoRA dropout and the FP8 producers' transposed copies only while training (a backward follows the forward),
    // not in evaluation or sampling
    bool training = false;

    // activations: sets[k][slot] holds one micro-batch's on chunk k (one set without pipeline parallelism)
    ActivationMemory<floatX> activation_memory;
    std::vector<std::vector<ActivationSet<floatX>>> sets;
    GradientSlots<floatX> gradient_slots;  // ZB-H1's output gradients from a micro-batch's B to its W
    // the model's end (last stage): the final LayerNorm's output, the logits (or their gradient), per-row losses
    floatX *lnf = nullptr, *logits = nullptr;
    float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr;
    // scratch shared by all layers and sets
    floatX *proj_out = nullptr, *dbtc = nullptr, *dbig = nullptr;
    floatX* dhidden = nullptr;   // Llama: d(loss)/d(the SwiGLU's output), whose input gradient (in dbig) is twice as wide
    floatX* gathered = nullptr;  // sequence parallelism: a LayerNorm output made whole for a column-parallel product
    // Sequence parallelism (Korthikanti et al. 2022), with tp > 1: the LayerNorm and residual regions hold 1/tp of
    // the rows on each rank (set before allocate()).
    bool sequence_parallel = false;
    int sequence_split() const { return sequence_parallel ? layout.tp : 1; }
    // Sampling with a KV cache (model/sampling.cuh): 0 for a forward from position 0 (training, evaluation, a
    // sample's prompt); p > 0 when the batch is one sequence's positions p, p + 1, ... whose earlier keys and values
    // are still in each block's qkv buffer, at their rows, from the forwards before.
    int kv_position = 0;
    void* attention_scratch = nullptr;  // flash attention backward (dQ accumulation)
    bool deterministic_attention = true;
    int recompute = 0;  // Recompute level
    LinearLayers<floatX> linear{kv_position, training};  // the blocks' four linear layers: bf16, or --precision fp8
    size_t model_state_bytes = 0;  // device memory that allocate() took for parameters, gradients and optimizer state
    float* reduce_scratch = nullptr;  // partial sums of the deterministic reductions
    LossSums loss;  // per-row losses summed by accumulate_loss() until take_mean_loss()
    BatchStaging staging;  // a batch's tokens into a set's, through pinned buffers
    size_t tokens_buffer_ints() const { return BatchStaging::ints((size_t)B * T); }

    // The mesh's data group shards (ZeRO), its tensor group splits the layers; LoRA needs tp = 1 (main() checks) and
    // holds the adapters of this stage's blocks.
    // `part`: what this pipeline stage holds (the whole model by default), in chunks of `chunk_blocks` blocks.
    Transformer(const ModelConfig& c, const ProcessGroup& process_group, const ProcessMesh& process_mesh, int zero_stage, cudaStream_t s,
                const LoraSpec& lora_spec = LoraSpec(), const StageModel& part = StageModel(), std::vector<int> chunk_blocks = {})
        : config(c), layout(c, 8 * process_mesh.data.size, process_mesh.tensor.size, part), full_layout(c, 8 * process_mesh.data.size),
          pg(process_group), mesh(process_mesh), stream(s),
          zero(new ZeroOptimizer<floatX>(layout.unit_offsets, layout.unit_sizes, layout.unit_kinds, layout.total, layout.decay_mask(),
                                         process_group, process_mesh, zero_stage, s, !lora_spec.enabled(), layout.split_mask())),
          lora(lora_spec) {
        tensor_parallel.group = mesh.tensor;
        if (chunk_blocks.empty()) chunk_blocks = {layout.num_blocks()};
        chunk_begin = {0};
        for (int k : chunk_blocks) chunk_begin.push_back(chunk_begin.back() + k);
        if (chunk_begin.back() != layout.num_blocks()) die("internal: the chunks do not cover the stage's blocks");
        if (lora.enabled()) {
            const std::string problem = lora_targets_problem(lora.targets, c);
            if (!problem.empty()) die("LoRA targets: " + problem);
            adapter_layout.reset(new AdapterLayout(c, lora, 8 * process_mesh.data.size, layout.part.layers));  // this stage's blocks'
            adapters.reset(new ZeroOptimizer<floatX>(adapter_layout->unit_offsets(), adapter_layout->unit_sizes(), adapter_layout->unit_kinds(),
                                                     adapter_layout->total, adapter_layout->decay_mask(), process_group, process_mesh,
                                                     zero_stage, s));
            if (lora.nf4_base) {
                if (layout.tp != 1) die("internal: the NF4 base runs with tp = 1");
                nf4_base.reset(new Nf4Base<floatX>(layout, std::is_same<floatX, __nv_bfloat16>::value && lora.nf4_products == Nf4Products::kPacked,
                                                   lora.nf4_double_quant));
                zero->set_unit_source(nf4_base.get());
                linear.nf4_base = nf4_base.get();
            }
        }
        lora_hooks.attach(c, lora, adapter_layout.get(), adapters.get());
        spec.allocate(c);
    }
    // Chunks of blocks (pipeline parallelism's model chunks; one without it): chunk k holds the local blocks
    // [chunk_begin[k], chunk_begin[k+1]). The model's first chunk starts with the embeddings, its last ends with
    // the final LayerNorm and the LM head.
    std::vector<int> chunk_begin;
    int num_chunks() const { return (int)chunk_begin.size() - 1; }
    bool model_begins(int k) const { return layout.part.first && k == 0; }
    bool model_ends(int k) const { return layout.part.last && k == num_chunks() - 1; }
    // The optimizer of what trains: the adapters under LoRA, else the model.
    ZeroOptimizer<floatX>& trained() { return lora.enabled() ? *adapters : *zero; }
    size_t trainable_parameters() const { return lora.enabled() ? AdapterLayout(config, lora, 8).count : full_layout.count; }  // whole model's

    size_t num_parameters() const { return full_layout.count; }  // of the whole model

    // `slots`: activation sets per chunk (pipeline parallelism: one per micro-batch in flight); one by default.
    // `grad_slots`: ZB-H1's gradient slots per chunk (one per micro-batch between its B and its W); none by default.
    void allocate(int batch, int seq_len, int recompute_level = kKeepAll, const std::vector<int>& slots = {},
                  const std::vector<int>& grad_slots = {}) {
        B = batch;
        T = seq_len;
        recompute = recompute_level;
        const size_t in_use_before_states = device_memory_in_use();
        if (nf4_base) nf4_base->allocate();
        zero->allocate();
        if (lora.enabled()) adapters->allocate();
        model_state_bytes = device_memory_in_use() - in_use_before_states;
        lora_hooks.allocate((size_t)B * T, slots.empty() ? 1 : *std::max_element(slots.begin(), slots.end()));

        std::vector<int> chunk_blocks;
        for (int k = 0; k < num_chunks(); k++) chunk_blocks.push_back(chunk_begin[k + 1] - chunk_begin[k]);
        const ActivationPlan ap{chunk_blocks, slots.empty() ? std::vector<int>(num_chunks(), 1) : slots, layout.part.last, grad_slots};
        size_t x_elements, stat_elements;
        activation_counts(config, B, T, layout.tp, sequence_split(), recompute, ap, &x_elements, &stat_elements);
        activation_memory.allocate(x_elements, stat_elements, tokens_buffer_ints() * ap.sets());
        sets = activation_memory.sets(config, B, T, layout.tp, sequence_split(), recompute, ap, tokens_buffer_ints());
        const size_t N = (size_t)B * T, C = config.channels, NH = config.num_heads / layout.tp;  // this rank's heads
        const size_t Nr = N / sequence_split();  // rows of the LayerNorm and residual regions on this rank
        auto take = [&](size_t n) { return activation_memory.take(n); };
        auto take_f = [&](size_t n) { return activation_memory.take_floats(n); };
        gradient_slots.allocate(take, ap, N, config, layout.tp, recompute);
        if (ap.head) {
            lnf = take(N * C);
            logits = take(N * layout.vocab_rows());
        }
        proj_out = take(N * C); dbtc = take(N * C); dbig = take(N * std::max(qkv_width(config, layout.tp), fc_width(config, layout.tp)));
        if (config.llama()) dhidden = take(N * hidden_width(config, layout.tp));
        if (sequence_split() > 1) gathered = take(N * C);
        if (ap.head) { lnf_mean = take_f(Nr); lnf_rstd = take_f(Nr); }
        losses = take_f(N);
        if (!activation_memory.all_taken()) die("internal: activation plan and allocation disagree");
        cudaCheck(cudaMalloc(&reduce_scratch, reduce_scratch_floats<floatX>(config) * sizeof(float)));
        cudaCheck(cudaMalloc(&attention_scratch, flash_attention_backward_scratch_bytes(B, T, NH, layout.kv_heads(), head_size())));
        if (linear.fp8 && (!std::is_same<floatX, __nv_bfloat16>::value || lora.enabled()))
            die("internal: FP8 products run in a bf16 model without LoRA");
        linear.allocate(config, layout, N, recompute, sequence_split() > 1, ap.sets() > num_chunks(), *zero, reduce_scratch, stream);
        loss.allocate(N, mesh);
        tensor_parallel.allocate(N);
        staging.allocate(N);
    }

    ~Transformer() {
        for (void* p : {(void*)reduce_scratch, attention_scratch})
            if (p != nullptr) cudaFree(p);
    }

    // This rank's part of an llm.c model file of this model's shape (only that part is read).
    void load_parameters(const std::string& path) { zero->set_parameters(read_model_part(path, layout, mesh.tensor.rank)); }
    // Every stage's part of the model (set by the pipeline; the whole model by default): model/whole_model.cuh
    // assembles the whole model from them.
    std::vector<StageModel> stage_parts = {StageModel()};

    // Where each tensor lives now (under ZeRO-3 a block's parameters are a gathered copy); l is a local block.
    floatX* param(int l, BlockTensor t) const { return zero->unit_params(layout.block_unit(l)) + layout.block_offset[t]; }
    floatX* grad(int l, BlockTensor t) const {  // null when frozen
        floatX* unit = zero->unit_grads(layout.block_unit(l));
        return unit ? unit + layout.block_offset[t] : nullptr;
    }
    floatX* wte_params() const { return zero->unit_params(layout.wte_unit); }
    floatX* wte_grads() const { return zero->unit_grads(layout.wte_unit); }
    floatX* wpe_params() const { return layout.wpe_unit >= 0 ? zero->unit_params(layout.wpe_unit) : nullptr; }  // null: no wpe (Llama)
    floatX* wpe_grads() const { return layout.wpe_unit >= 0 ? zero->unit_grads(layout.wpe_unit) : nullptr; }
    // The LM head's weight: wte (tied), or its own (an untied head on the last stage).
    floatX* head_params() const { return layout.lm_head_unit >= 0 ? zero->unit_params(layout.lm_head_unit) : wte_params(); }
    floatX* head_grads() const { return layout.lm_head_unit >= 0 ? zero->unit_grads(layout.lm_head_unit) : wte_grads(); }
    floatX* final_norm_params() const { return zero->unit_params(layout.lnf_unit); }  // lnfw, then lnfb
    floatX* final_norm_grads() const { return zero->unit_grads(layout.lnf_unit); }

    // Uploads a batch (host int32, B*T each; targets may be null) and the encoder's token grouping into the
    // tokens of activation set `slot` of chunk k (the only one without pipeline parallelism).
    // Does not wait for the GPU (BatchStaging).
    // k = -1: the sets that forward_all_stages (distributed/pipeline_parallel.cuh) reads tokens from (set 0 of the
    // first and of the last chunk).
    void upload_batch(const int* inputs, const int* targets, int k = -1, int slot = 0) {
        if (k < 0) {
            upload_batch(inputs, targets, 0, 0);
            if (num_chunks() > 1) upload_batch(inputs, targets, num_chunks() - 1, 0);
            return;
        }
        ActivationSet<floatX>& set = sets[k][slot];
        set.num_buckets = staging.upload(inputs, targets, (size_t)B * T, config.vocab_size, set.tokens, pg, stream);
    }

    // LoRA's adapters on product p (kLoraQkv .. kLoraFcProj) of block l, the product's own and its output slices' (no-op
    // without them): out += s B A dropout(x), and their backward.
    void adapt_forward(int l, int p, floatX* out, const floatX* x) { lora_hooks.forward(l, p, out, x, N(), training, stream); }
    void adapt_backward(int l, int p, floatX* dx, const floatX* dout, const floatX* x) {
        lora_hooks.backward(l, p, dx, dout, x, N(), training, stream);
    }
    // The adapters' intermediates (u) of the micro-batch in `set`, activation set `slot` of chunk k, apart from
    // those of the other micro-batches in flight (pipeline parallelism).
    void select_lora_slot(int k, const ActivationSet<floatX>& set) { lora_hooks.slot = (int)(&set - sets[k].data()); }
    // The micro-batch whose forward or backward runs next: LoRA's dropout masks are drawn from it.
    void begin_micro_batch(int micro) { lora_hooks.micro_batch(micro); }

    // GPT-2's GELU in the epilogue of fc's product (forward) and of the fc projection's (backward), where
    // LinearLayers::gelu_epilogue allows it with the product's adapter, if any.
    bool fc_gelu_fused() const { return !config.llama() && linear.gelu_epilogue(lora_hooks.adapts(kLoraFc)); }
    bool fcproj_dgelu_fused() const { return !config.llama() && linear.gelu_epilogue(lora_hooks.adapts(kLoraFcProj)); }
    int head_size() const { return config.head_size(); }
    // A block's bias and its gradient, null where the family has none (its tensor is empty).
    const floatX* bias(int l, BlockTensor t) const { return layout.block_tensor_size[t] > 0 ? param(l, t) : nullptr; }
    floatX* bias_grad(int l, BlockTensor t) const { return layout.block_tensor_size[t] > 0 ? grad(l, t) : nullptr; }
    // Row-parallel products add their bias on tensor-parallel rank 0 only: g's sum then holds it once.
    const floatX* row_parallel_bias(int l, BlockTensor t) const { return tensor_parallel.rank() == 0 ? bias(l, t) : nullptr; }
    // Rows of the LayerNorm and residual regions on this rank: all B*T, or 1/tp of them under sequence parallelism.
    int region_rows() const { return B * T / sequence_split(); }

    // Where the LayerNorm/residual regions meet the split products: tensor_parallel.cuh's f and g operators, with
    // sequence parallelism's all-gathers and reduce-scatters in place of the identities and all-reduces. g's
    // backward gathers into proj_out, which the backward does not otherwise use.
    const floatX* column_input(const floatX* x) { return tensor_parallel.f_forward(x, gathered, region_elements(), sequence_split(), stream); }
    const floatX* row_output(floatX* partial, floatX* rows = nullptr) {
        return tensor_parallel.g_forward(partial, rows, region_elements(), sequence_split(), stream);
    }
    const floatX* row_output_grad(const floatX* dresidual) { return tensor_parallel.g_backward(dresidual, proj_out, region_elements(), sequence_split(), stream); }
    size_t region_elements() const { return (size_t)region_rows() * config.channels; }
    // The backward of a column-parallel product y = x W^T + b (x whole; the LoRA adapter `target` of block l, or -1):
    // dx = dy W into dbtc, whose sum over the tensor-parallel group (f's backward) runs on the group's stream while
    // dW += dy^T x and db compute. Returns this rank's rows of dx.
    const floatX* column_parallel_backward(floatX* dweight, floatX* dbias, const floatX* weight, const floatX* dy, const floatX* x,
                                           int out_features, int l, int target) {
        const int N = B * T, C = config.channels;
        // a block's layer in its precision (FP8: no adapter then, as fp8 runs without LoRA); the LM head's in bf16
        if (target >= 0) linear.backward_input(dbtc, dy, weight, N, C, out_features, l, (Fp8Layer)target);
        else matmul_backward_input(dbtc, dy, weight, N, C, out_features, stream);
        if (target >= 0) adapt_backward(l, target, dbtc, dy, x);
        const bool scatter = sequence_split() > 1;
        const floatX* dx = tensor_parallel.begin_f_backward(dbtc, (size_t)(scatter ? region_rows() : N) * C, scatter, stream);
        if (target >= 0) linear.backward_weights(dweight, dbias, dy, x, N, C, out_features, l, (Fp8Layer)target);
        else matmul_backward_weights(dweight, dbias, reduce_scratch, dy, x, N, C, out_features, stream);
        tensor_parallel.end_f_backward(stream);
        return dx;
    }
    // out = norm(x), or residual = x + y, then out = norm(residual) when y is given: block l's ln1 or ln2, the input
    // of its layer `layer`; in bf16, or under fp8_inputs_from_producers() (GPT-2's LayerNorms) as the E4M3 `copies`.
    void block_layernorm(floatX* out, float* mean, float* rstd, floatX* residual, const floatX* x, const floatX* y, const floatX* weight,
                         const floatX* bias, int l, Fp8Layer layer, Fp8Copies copies) {
        if (linear.fp8_inputs_from_producers())
            linear.layernorm_fp8(out, mean, rstd, residual, x, y, weight, bias, region_rows(), config.channels, l, layer, copies);
        else spec.norm_forward(residual, out, mean, rstd, x, y, weight, bias, region_rows(), stream);
    }
    // fch_gelu = the MLP's activation of fch (GELU, or SwiGLU of [gate | up]) of local block l: in bf16, or under
    // fp8_inputs_from_producers() (GPT-2's GELU) as the E4M3 `copies`.
    void block_gelu(int l, LayerActivations<floatX>& a, Fp8Copies copies) {
        if (linear.fp8_inputs_from_producers()) linear.gelu_fp8(a.fch_gelu, a.fch, N(), layout.hidden(), l, copies);
        else spec.activation_forward(a.fch_gelu, a.fch, N(), layout.hidden(), stream);
    }

    // Sequence parallelism leaves each rank the LayerNorm parameters' gradient over its own rows only: summed over
    // the tensor-parallel group when this micro-step's gradients are reduced (accumulated gradients are summed once).
    void sum_layernorm_grads(floatX* grads, size_t n) {
        if (sequence_split() > 1 && grads != nullptr && trained().reduces_this_micro_step()) tensor_parallel.sum_over_ranks(grads, n, stream);
    }

    // fch = ln2 FCW^T + FCB (+ the fc adapter) and fch_gelu = gelu(fch) of local block l (this rank's hidden units);
    // recomputing: in the backward (--recompute 3), where the fc projection's forward does not follow.
    void fc_gelu_forward(int l, LayerActivations<floatX>& a, bool recomputing = false) {
        const int N = B * T, C = config.channels;
        const floatX* x = column_input(a.ln2);
        if (fc_gelu_fused()) {
            matmul_forward_gelu(a.fch_gelu, a.fch, x, param(l, FCW), bias(l, FCB), N, C, layout.hidden(), stream);
            return;
        }
        linear.forward(a.fch, x, param(l, FCW), bias(l, FCB), N, C, layout.fc_columns(), l, kFp8Fc);
        adapt_forward(l, kLoraFc, a.fch, x);
        block_gelu(l, a, linear.input_copies(kFp8FcProj, recomputing, !recomputing));
    }
    // Block l from its normalised input ln1 to the MLP's hidden activations: attention (qkv column-parallel,
    // attn-proj row-parallel and g), the residual add and the second LayerNorm, fc and the GELU; recomputing: in the
    // backward (--recompute 3).
    void attention_and_fc_forward(int l, LayerActivations<floatX>& a, const floatX* residual_in, bool recomputing = false) {
        const int C = config.channels, Cs = layout.heads() * head_size();
        const floatX* x = column_input(a.ln1);
        floatX* qkv = a.qkv + (size_t)kv_position * layout.qkv_columns();  // the KV cache's new rows
        linear.forward(qkv, x, param(l, QKVW), bias(l, QKVB), N(), C, layout.qkv_columns(), l, kFp8Qkv);
        adapt_forward(l, kLoraQkv, qkv, x);
        spec.position_forward(qkv, B, T, layout.heads(), layout.kv_heads(), kv_position, stream);  // T new rows at kv_position
        if (kv_position == 0) flash_attention_forward(a.atty, a.lse, a.qkv, B, T, layout.heads(), layout.kv_heads(), head_size(), stream);
        else attention_decode(a.atty, a.qkv, kv_position, T, layout.heads(), layout.kv_heads(), head_size(), stream);
        linear.forward(proj_out, a.atty, param(l, ATTPROJW), row_parallel_bias(l, ATTPROJB), N(), Cs, C, l, kFp8AttnProj);
        adapt_forward(l, kLoraAttnProj, proj_out, a.atty);
        block_layernorm(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, residual_in, row_output(proj_out), param(l, LN2W), bias(l, LN2B), l, kFp8Fc,
                        linear.input_copies(kFp8Fc, recomputing, true));
        fc_gelu_forward(l, a, recomputing);
    }

    // Forward over the uploaded batch (activation set 0 of the whole model). With dloss != 0 the classifier also
    // leaves the logits gradient in `logits` (see fused_classifier); with dloss == 0 `logits` keeps the logits
    // (this rank's vocabulary columns). Per-row losses in `losses` when `with_loss`.
    void forward(bool with_loss, float dloss) {
        forward_chunk(0, sets[0][0]);
        head_forward(sets[0][0], with_loss, dloss);
    }

    // The forward of chunk k on activation set `set`: the embeddings first when the chunk begins the model (the
    // set's input otherwise holds the residual stream, received from the previous stage), then its blocks. The
    // chunk's output is its last block's residual3, which is the residual stream that goes on to the next chunk, or
    // when the chunk ends the model, the input of the final LayerNorm, whose output (lnf) it also computes.
    void forward_chunk(int k, ActivationSet<floatX>& set) {
        const int C = config.channels, Vl = layout.vocab_rows(), Nr = region_rows();
        const int begin = chunk_begin[k], end = chunk_begin[k + 1];
        select_lora_slot(k, set);
        zero->begin_forward();
        if (adapters) adapters->wait_for_parameters();
        if (model_begins(k)) {
            // vocabulary-parallel: each rank looks up the tokens of its rows (zeros for the others) and rank 0 adds
            // the positions; g sums them (into this rank's rows under sequence parallelism)
            const floatX* wpe = tensor_parallel.rank() == 0 && wpe_params() != nullptr ? wpe_params() + (size_t)kv_position * C : nullptr;
            floatX* lookup = sequence_split() > 1 ? proj_out : set.input;
            encoder_forward(lookup, set.tokens, wte_params(), wpe, B, T, C, stream, tensor_parallel.rank() * Vl, Vl);
            row_output(lookup, set.input);
        }
        // the final LayerNorm's rows: under sequence parallelism this rank's part of lnf, gathered before the LM head
        floatX* lnf_rows = lnf + (sequence_split() > 1 ? (size_t)tensor_parallel.rank() * Nr * C : 0);
        set.fp8_producer_copies = linear.fp8_inputs_from_producers() && training;
        for (int l = begin; l < end; l++) {
            LayerActivations<floatX>& a = set.layers[l - begin];
            zero->before_unit_forward(layout.block_unit(l));
            // the first LayerNorm of a block was fused into the previous block's closing residual add, except in
            // the chunk's first block
            if (l == begin)
                block_layernorm(a.ln1, a.ln1_mean, a.ln1_rstd, nullptr, set.input, nullptr, param(l, LN1W), bias(l, LN1B), l, kFp8Qkv,
                                linear.input_copies(kFp8Qkv, false, true));
            const floatX* residual_in = l == begin ? set.input : set.layers[l - begin - 1].residual3;
            attention_and_fc_forward(l, a, residual_in);
            linear.forward(proj_out, a.fch_gelu, param(l, FCPROJW), row_parallel_bias(l, FCPROJB), N(), layout.hidden(), C, l, kFp8FcProj);
            adapt_forward(l, kLoraFcProj, proj_out, a.fch_gelu);
            // residual3 = residual2 + mlp, normalised by the next block's first LayerNorm (or the final one); under
            // ZeRO-3 the next block's LayerNorm parameters are its gathered copy. At the end of a chunk that does
            // not end the model the next block is on another stage (or chunk): the residual add alone.
            const floatX* mlp = row_output(proj_out);
            if (l + 1 < end) {
                zero->before_unit_forward(layout.block_unit(l + 1));
                LayerActivations<floatX>& next = set.layers[l + 1 - begin];
                block_layernorm(next.ln1, next.ln1_mean, next.ln1_rstd, a.residual3, a.residual2, mlp, param(l + 1, LN1W), bias(l + 1, LN1B),
                                l + 1, kFp8Qkv, linear.input_copies(kFp8Qkv, false, true));
            } else if (model_ends(k)) {
                zero->before_unit_forward(layout.lnf_unit);
                spec.norm_forward(a.residual3, lnf_rows, lnf_mean, lnf_rstd, a.residual2, mlp, final_norm_params(),
                                  config.has_biases() ? final_norm_params() + C : nullptr, Nr, stream);
            } else {
                residual_forward(a.residual3, a.residual2, mlp, (long)Nr * C, stream);
            }
            zero->after_unit_forward(layout.block_unit(l));
        }
    }
    // The chunk's output: the residual stream that the next chunk (on the next stage) receives.
    floatX* chunk_output(int k, ActivationSet<floatX>& set) const { return set.layers[chunk_begin[k + 1] - chunk_begin[k] - 1].residual3; }
    int N() const { return B * T; }

    // The LM head and the loss, after the model's last chunk ran on `set`: logits = lnf wte^T (this rank's
    // vocabulary columns; f: lnf enters the LM head) and the vocabulary-parallel cross-entropy.
    void head_forward(ActivationSet<floatX>& set, bool with_loss, float dloss) {
        const int C = config.channels, Vl = layout.vocab_rows(), Nr = region_rows();
        if (sequence_split() > 1) tensor_parallel.all_gather_rows(lnf + (size_t)tensor_parallel.rank() * Nr * C, lnf, (size_t)Nr * C, stream);
        matmul_forward(logits, lnf, head_params(), (const floatX*)nullptr, N(), C, Vl, stream);
        const int* targets = set.tokens + (size_t)B * T;
        if (with_loss) tensor_parallel.cross_entropy(logits, losses, targets, dloss, N(), config.vocab_size, Vl, stream);
    }

    // Refills the activations of local block l that --recompute did not keep, with the forward's own kernels:
    // the kernels are deterministic, so the backward sees exactly the values the forward computed.
    void recompute_activations(int l, LayerActivations<floatX>& a, const floatX* residual_in) {
        if (recompute == kKeepAll) return;
        if (recompute >= kRecomputeGeluLayerNorm)
            block_layernorm(a.ln1, a.ln1_mean, a.ln1_rstd, nullptr, residual_in, nullptr, param(l, LN1W), bias(l, LN1B), l, kFp8Qkv,
                            linear.input_copies(kFp8Qkv, true, recompute >= kRecomputeBlock));
        if (recompute >= kRecomputeBlock) {
            attention_and_fc_forward(l, a, residual_in, true);
            return;
        }
        if (recompute >= kRecomputeGeluLayerNorm)
            block_layernorm(a.ln2, a.ln2_mean, a.ln2_rstd, nullptr, a.residual2, nullptr, param(l, LN2W), bias(l, LN2B), l, kFp8Fc,
                            linear.input_copies(kFp8Fc, true, false));
        block_gelu(l, a, linear.input_copies(kFp8FcProj, true, false));  // the forward's own kernel (see fc_gelu_fused)
    }

    // The loss bookkeeping (LossSums) of this model's rows: the last forward's per-row losses added to the sums;
    // every rank's rows gathered (a collective, not waited for); their mean (waits).
    void accumulate_loss() { loss.accumulate(layout.part.last ? losses : nullptr, B * T, stream); }
    void request_losses() { loss.request(mesh, (size_t)B * T, stream); }
    float take_mean_loss() { return loss.take_mean(pg, mesh, (size_t)B * T, stream); }

    // Backward after forward(true, dloss != 0). Gradients accumulate (+=) over the micro-steps of a step
    // (between zero_grad() calls); `last_micro_step` tells data parallelism when to reduce them.
    // Under tensor parallelism the gradients entering the replicated regions are summed by f's backward (after
    // the LM head, fc and qkv); the row-parallel products need no collective (g's backward is the identity), except
    // under sequence parallelism, whose f and g swap all-reduces for reduce-scatters and all-gathers.
    void backward(bool last_micro_step = true) {
        trained().begin_backward(last_micro_step);
        head_backward(sets[0][0]);
        backward_chunk(0, sets[0][0]);
        trained().end_backward();
    }

    // The LM head's and the final LayerNorm's backward, after head_forward with dloss != 0 left the logits'
    // gradient in `logits`: set.dresidual becomes d(loss)/d(the last block's residual3).
    void head_backward(ActivationSet<floatX>& set) {
        const int C = config.channels, Vl = layout.vocab_rows(), Nr = region_rows();
        cudaCheck(cudaMemsetAsync(set.dresidual, 0, (size_t)Nr * C * sizeof(floatX), stream));
        const floatX* dlnf = column_parallel_backward(head_grads(), nullptr, head_params(), logits, lnf, Vl, -1, -1);
        spec.norm_backward(set.dresidual, final_norm_grads(), reduce_scratch, dlnf, set.layers.back().residual3, final_norm_params(), lnf_mean,
                           lnf_rstd, Nr, stream);
        sum_layernorm_grads(final_norm_grads(), spec.norm_parameters());
        if (adapters) {
            adapters->after_unit_backward(adapter_layout->num_blocks() + 1);
            return;
        }
        zero->after_unit_backward(layout.lnf_unit);
        if (layout.lm_head_unit >= 0) zero->after_unit_backward(layout.lm_head_unit);
        if (layout.part.tied_copy()) zero->after_unit_backward(layout.wte_unit);  // the LM head's copy of wte is complete
    }

    // The backward of chunk k on `set`, whose dresidual holds d(loss)/d(the chunk's output): from the head
    // (head_backward), or received from the next stage. Leaves d(loss)/d(the chunk's input) in set.dresidual
    // (sent to the previous stage) or, when the chunk begins the model, adds it into the embeddings' gradients.
    // `part` (BackwardPart): kInputGradient leaves the products' output gradients in gradient slot `grad_slot` of
    // the chunk (gradient_slots.slot(k, grad_slot)) and their weight gradients, and the embeddings', to kWeightGradient
    // (weight_gradient_chunk), which reads them from the same slot.
    void backward_chunk(int k, ActivationSet<floatX>& set, BackwardPart part = BackwardPart::kBoth, int grad_slot = -1) {
        select_lora_slot(k, set);
        if (part == BackwardPart::kWeightGradient) {
            weight_gradient_chunk(k, set, grad_slot);
            return;
        }
        const bool input_only = part == BackwardPart::kInputGradient;
        std::vector<LayerOutputGrads<floatX>>* kept_grads = input_only ? &gradient_slots.slot(k, grad_slot) : nullptr;
        const int N = B * T, C = config.channels, Nr = region_rows();
        const int Cs = layout.heads() * head_size();
        const int begin = chunk_begin[k], end = chunk_begin[k + 1];
        if (set.fp8_producer_copies != linear.fp8_inputs_from_producers())
            die("internal: the backward reads the FP8 inputs' copies from their producers when, and only when, its forward (with training set) wrote them");
        floatX* dresidual = set.dresidual;
        for (int l = end - 1; l >= begin; l--) {
            LayerActivations<floatX>& a = set.layers[l - begin];
            const floatX* residual_in = l == begin ? set.input : set.layers[l - begin - 1].residual3;
            zero->before_unit_backward(layout.block_unit(l));
            if (adapters) adapters->before_unit_backward(l + 1);
            recompute_activations(l, a, residual_in);
            // B: the products' output gradients go to the gradient slot, which W reads, and their weight gradients
            // (null here) are W's; the products' inputs are read only by LoRA's adapters, which run with tp = 1 (no
            // gather)
            LayerOutputGrads<floatX>* kept = kept_grads ? &(*kept_grads)[l - begin] : nullptr;
            auto product_grad = [&](BlockTensor t) { return input_only ? nullptr : grad(l, t); };
            auto product_bias_grad = [&](BlockTensor t) { return input_only ? nullptr : bias_grad(l, t); };
            auto product_input = [&](const floatX* x) { return input_only ? x : column_input(x); };
            // B's output gradients of fc and qkv go to the slot's own memory, or to the spares, which the slot keeps
            // once the set's fch and qkv buffers have been read for the last time and become the spares
            floatX* dfch = kept ? gradient_slots.fc_grad(*kept) : dbig;
            floatX* dqkv = kept ? gradient_slots.qkv_grad(*kept) : dbig;
            // dresidual is d(loss)/d(residual3); it passes unchanged to residual2 and into the MLP, where dfch
            // becomes d(loss)/d(fch): the GELU's backward in the product's epilogue, unless fc-proj's adapter
            // must add its share before it. SwiGLU's input is twice as wide as its output: d(loss)/d(fch_gelu) goes to
            // dhidden first.
            const bool dgelu_fused = fcproj_dgelu_fused();
            const floatX* dmlp = row_output_grad(dresidual);
            if (kept) gradient_slots.keep(kept->fcproj, dmlp, (size_t)N * C, stream);
            // The row-parallel projections' bias gradients are dresidual's column sums: the next LayerNorm backward,
            // which reads dresidual anyway, adds them (its dinp_colsum) instead of a bias_backward pass, unless
            // sequence parallelism leaves this rank only its rows of dresidual.
            const bool bias_in_layernorm = sequence_split() == 1;
            floatX* dact = config.llama() ? dhidden : dfch;
            linear.backward(dact, product_grad(FCPROJW), bias_in_layernorm ? nullptr : product_bias_grad(FCPROJB), dmlp, a.fch_gelu,
                            param(l, FCPROJW), N, layout.hidden(), C, l, kFp8FcProj, dgelu_fused ? a.fch : nullptr);
            if (!dgelu_fused) {
                adapt_backward(l, kLoraFcProj, dact, dmlp, a.fch_gelu);
                spec.activation_backward(dfch, dact, a.fch, N, layout.hidden(), stream);
            }
            if (kept) gradient_slots.fch_read(*kept, a.fch);  // fch's last read was the activation's backward
            // ln2 re-gathered under sequence parallelism
            const floatX* dln2 = column_parallel_backward(product_grad(FCW), product_bias_grad(FCB), param(l, FCW), dfch, product_input(a.ln2),
                                                          layout.fc_columns(), l, kLoraFc);
            // fc-proj's bias gradient from dresidual as it enters: d(loss)/d(residual3)
            spec.norm_backward(dresidual, grad(l, LN2W), reduce_scratch, dln2, a.residual2, param(l, LN2W), a.ln2_mean, a.ln2_rstd, Nr, stream,
                               bias_in_layernorm ? bias_grad(l, FCPROJB) : nullptr);
            // now d(loss)/d(residual2), which passes to residual_in and into the attention
            const floatX* dattention = row_output_grad(dresidual);
            if (kept) gradient_slots.keep(kept->attproj, dattention, (size_t)N * C, stream);
            linear.backward(dbtc, product_grad(ATTPROJW), bias_in_layernorm ? nullptr : product_bias_grad(ATTPROJB), dattention, a.atty,
                            param(l, ATTPROJW), N, Cs, C, l, kFp8AttnProj);
            adapt_backward(l, kLoraAttnProj, dbtc, dattention, a.atty);
            flash_attention_backward(dqkv, dbtc, a.qkv, a.atty, a.lse, attention_scratch, B, T, layout.heads(), layout.kv_heads(), head_size(),
                                     deterministic_attention, stream);
            spec.position_backward(dqkv, B, T, layout.heads(), layout.kv_heads(), stream);
            if (kept) gradient_slots.qkv_read(*kept, a.qkv);  // qkv's last read was the attention's backward
            // The qkv bias gradient, dbig's column sums, without reading dK and dV: their key part is zero (a bias
            // on every key moves each query's scores alike, which the softmax ignores: dS's rows sum to 0) and their
            // value part is dO's column sums (each query's attention weights sum to 1). dO = dattention ATTPROJW, so
            // those are dattention's column sums times ATTPROJW: from the partial sums the LayerNorm backward below
            // leaves for the attention projection's bias (a 1 x C by C x Cs product instead of reading dO), unless
            // that bias gradient is not taken there or an adapter adds to dO; then from dO (dbtc) before the qkv
            // product's backward overwrites it. The query part from dQ, the first Cs columns of dqkv (W's under B).
            // With rotary positions (Qwen 2.5's q, k and v biases) a key bias is rotated differently at each position,
            // so it moves the scores: the whole bias from dqkv (W's under B).
            floatX* dqkv_bias = bias_grad(l, QKVB);
            floatX* dattproj_bias = bias_in_layernorm ? bias_grad(l, ATTPROJB) : nullptr;
            const bool value_bias_from_layernorm = dqkv_bias != nullptr && dattproj_bias != nullptr &&
                                                   !(lora.enabled() && lora.targets_has(kLoraAttnProj));
            if (dqkv_bias != nullptr && !input_only) bias_backward(dqkv_bias, reduce_scratch, dqkv, N, layout.qkv_bias_columns(), stream, layout.qkv_columns());
            if (dqkv_bias != nullptr && !config.llama() && !value_bias_from_layernorm)
                bias_backward(dqkv_bias + 2 * Cs, reduce_scratch, dbtc, N, Cs, stream);
            const floatX* dln1 = column_parallel_backward(product_grad(QKVW), nullptr, param(l, QKVW), dqkv, product_input(a.ln1), layout.qkv_columns(),
                                                          l, kLoraQkv);
            // the attention projection's bias gradient from d(loss)/d(residual2)
            spec.norm_backward(dresidual, grad(l, LN1W), reduce_scratch, dln1, residual_in, param(l, LN1W), a.ln1_mean, a.ln1_rstd, Nr, stream,
                               dattproj_bias);
            if (value_bias_from_layernorm)
                colsum_times_weight(dqkv_bias + 2 * Cs, reduce_scratch + layernorm_backward_scratch_floats(C),
                                    layernorm_backward_colsum_partials(reduce_scratch, C), layernorm_backward_blocks(),
                                    param(l, ATTPROJW), C, Cs, stream);
            sum_layernorm_grads(grad(l, LN1W), spec.norm_parameters());  // a norm's weight and bias are adjacent
            sum_layernorm_grads(grad(l, LN2W), spec.norm_parameters());
            if (!input_only) block_gradients_done(l);  // B: W completes them
        }
        if (model_begins(k) && !input_only) embeddings_backward(set);
    }

    // ZB-H1's W of chunk k on `set`, after its B (backward_chunk with BackwardPart::kInputGradient) left the products'
    // output gradients in gradient slot `grad_slot` and d(loss)/d(the chunk's input) in set.dresidual: the products'
    // weight gradients (their inputs refilled again where --recompute dropped them) and the biases summed from the
    // output gradients (backward_chunk's, less those B took), then the embeddings' when the chunk begins the model.
    void weight_gradient_chunk(int k, ActivationSet<floatX>& set, int grad_slot) {
        const std::vector<LayerOutputGrads<floatX>>& kept_grads = gradient_slots.slot(k, grad_slot);
        const int N = B * T, C = config.channels;
        const int Cs = layout.heads() * head_size();
        const int begin = chunk_begin[k], end = chunk_begin[k + 1];
        const bool bias_in_layernorm = sequence_split() == 1;  // B took the row-parallel biases (backward_chunk)
        for (int l = end - 1; l >= begin; l--) {
            LayerActivations<floatX>& a = set.layers[l - begin];
            const LayerOutputGrads<floatX>& d = kept_grads[l - begin];
            const floatX* residual_in = l == begin ? set.input : set.layers[l - begin - 1].residual3;
            zero->before_unit_backward(layout.block_unit(l));
            if (adapters) adapters->before_unit_backward(l + 1);
            recompute_activations(l, a, residual_in);
            linear.weight_gradient(grad(l, FCPROJW), bias_in_layernorm ? nullptr : bias_grad(l, FCPROJB), d.fcproj, a.fch_gelu, N, layout.hidden(), C, l,
                                   kFp8FcProj);
            linear.weight_gradient(grad(l, FCW), bias_grad(l, FCB), d.fc, column_input(a.ln2), N, C, layout.fc_columns(), l, kFp8Fc);
            linear.weight_gradient(grad(l, ATTPROJW), bias_in_layernorm ? nullptr : bias_grad(l, ATTPROJB), d.attproj, a.atty, N, Cs, C, l,
                                   kFp8AttnProj);
            if (bias_grad(l, QKVB) != nullptr)  // B's part (backward_chunk)
                bias_backward(bias_grad(l, QKVB), reduce_scratch, d.qkv, N, layout.qkv_bias_columns(), stream, layout.qkv_columns());
            linear.weight_gradient(grad(l, QKVW), nullptr, d.qkv, column_input(a.ln1), N, C, layout.qkv_columns(), l, kFp8Qkv);
            gradient_slots.hand_back(d, a.qkv, a.fch);  // the output gradients' last read is above
            block_gradients_done(l);
        }
        if (model_begins(k)) embeddings_backward(set);
    }
    // Block l's gradients are complete for this micro-batch (ZeRO reduces them after the last one).
    // Under LoRA the frozen base's hook only hands the block's ring slot on (the NF4 base's next block is filled there).
    void block_gradients_done(int l) {
        if (adapters) adapters->after_unit_backward(l + 1);
        zero->after_unit_backward(layout.block_unit(l));
    }
    // The embeddings' gradients from d(loss)/d(the model's input), which the backward of the model's first chunk
    // leaves in set.dresidual.
    void embeddings_backward(ActivationSet<floatX>& set) {
        const int C = config.channels, Vl = layout.vocab_rows();
        const int* bucket_data = set.tokens + 2 * (size_t)B * T;
        if (wte_grads() != nullptr)  // not frozen
            encoder_backward(wte_grads(), wpe_grads(), row_output_grad(set.dresidual), bucket_data, set.num_buckets, B, T, C, stream,
                             tensor_parallel.rank() * Vl, Vl);
        if (adapters) {
            adapters->after_unit_backward(0);
            return;
        }
        if (layout.wpe_unit >= 0) zero->after_unit_backward(layout.wpe_unit);
        zero->after_unit_backward(layout.wte_unit);
    }

    void zero_grad() { trained().zero_grad(); }
    // The optimizer step of the trained parameters after a step's forwards and backwards, and what the step log
    // shows. One wait: the losses' gathering and the update are enqueued first. A non-finite loss in the step's rows
    // skips the update, as a non-finite gradient norm does, in every precision: no parameter or optimizer state
    // changes. The loss scale is the one after the step (fp16: halved on a skip, doubled after clean steps).
    // vote_stop: this rank asks to stop after the step; the votes travel with the losses and the norm, so every rank
    // reports the same stop_requested.
    StepReport step(const AdamWHyper& h, bool vote_stop = false) {
        linear.end_step();
        if (vote_stop) loss.vote_stop((size_t)B * T, stream);
        request_losses();
        trained().step(h, loss.nonfinite, loss.stop_votes);
        const float loss = take_mean_loss();
        const typename ZeroOptimizer<floatX>::StepResult r = trained().finish_step();
        return {loss, r.grad_norm, trained().scaler.scale, r.skipped, trained().scaler.skipped_steps, r.stop_requested};
    }

    // d(summed loss)/d(row loss) of a micro-step (loss.h): over all rows, or over the targets that count (masked data)
    float dloss(int grad_accum_steps) const { return LossSums::mean_gradient(trained_scale(), B, T, grad_accum_steps); }
    float dloss_over_counted(uint64_t counted) const { return LossSums::counted_mean_gradient(trained_scale(), counted, mesh.data.size); }
    float trained_scale() const { return (lora.enabled() ? adapters : zero)->scaler.scale; }

    void init_adapters(uint64_t seed) { lora_hooks.init(seed, stream); }
};
