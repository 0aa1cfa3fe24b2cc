// The memory plan: every device buffer a rank allocates, counted before anything is allocated, so that a run that
// does not fit is refused with the figures and what to change instead of failing at an allocation. The model
// (transformer.cuh, activations.cuh) allocates from the same counts (activation_counts), so plan and allocation
// cannot drift apart (its allocate() checks that they agree). The start-up report prints the plan next to the GPU's
// free memory; the ZeRO formula and the measured model states are compared after allocation. Under ZeRO-Offload the
// plan also counts the pinned host memory of each rank, reported against the machine's budget (MemTotal or
// --host-memory-gib) for all the ranks that share it. Allocating is the model's.
// defines: ActivationPlan, MemoryPlan, Recompute, activation_counts, plan_memory, gib, device_memory_in_use,
//          StagePlans, report_memory_plan, zero_states_formula, HostBudget, host_memory_budget, report_host_memory_plan
#pragma once
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/layernorm.cuh"            // defines: layernorm_backward_scratch_floats, colsum_times_weight_scratch_floats
#include "../kernels/matmul.cuh"               // defines: matmul_context, bias_backward_scratch_floats
#include "../kernels/flash_attention.cuh"      // defines: flash_attention_backward_scratch_bytes
#include "../kernels/global_norm.cuh"          // defines: global_norm_scratch_floats
#include "../distributed/zero.cuh"             // defines: zero_memory, ZeroOffload::host_memory, ZeroMemory, HostMemory
#include "config.h"                            // defines: ModelConfig, StageModel, ParameterLayout
#include "lora.h"                              // defines: LoraSpec, AdapterLayout
#include "fp8_linear.cuh"                      // defines: fp8_scratch_bytes
#include "nf4_base.cuh"                        // defines: nf4_base_memory (QLoRA's NF4 base)

// The activation sets a stage allocates: the blocks of each chunk, the sets per chunk (one per micro-batch in
// flight), whether the stage ends the model (final LayerNorm, LM head, loss), and the gradient slots per chunk, each
// its blocks' output gradients for one micro-batch from B to W (ZB-H1's split backward, model/gradient_slots.cuh;
// empty or all 0: none, the backward unsplit).
struct ActivationPlan {
    std::vector<int> chunk_blocks;
    std::vector<int> slots;
    bool head = true;
    std::vector<int> grad_slots;
    static ActivationPlan whole(const ModelConfig& c) { return {{c.num_layers}, {1}, true}; }
    int sets() const { return std::accumulate(slots.begin(), slots.end(), 0); }
    int total_grad_slots() const { return std::accumulate(grad_slots.begin(), grad_slots.end(), 0); }
    bool splits_backward() const { return total_grad_slots() > 0; }
};

inline double gib(size_t bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }
inline size_t device_memory_in_use() {
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
}

// Bytes of every buffer, for the start-up memory plan (predicted before anything is allocated).
struct MemoryPlan {
    size_t parameters = 0, gradients = 0, master_weights = 0, adam_state = 0, activations = 0, scratch = 0;
    size_t working = 0;  // of parameters and gradients: the unsharded unit buffers of ZeRO stages 2-3 (ZeroMemory)
    HostMemory host;     // ZeRO-Offload's pinned host memory of the rank (not in total(), which is the GPU's)
    size_t total() const { return parameters + gradients + master_weights + adam_state + activations + scratch; }
};

// fp32 scratch of the deterministic reductions, shared by every layer.
template <typename floatX>
inline size_t reduce_scratch_floats(const ModelConfig& c) {
    const int C = c.channels;
    // the LayerNorm backward's partial rows, then the qkv bias's value part from them (backward_chunk)
    return std::max({layernorm_backward_scratch_floats(C) + colsum_times_weight_scratch_floats(C, C),
                     bias_backward_scratch_floats<floatX>((int)std::max(fc_width(c, 1), qkv_width(c, 1))),
                     bias_backward_scratch_floats<floatX>(c.padded_vocab_size), global_norm_scratch_floats()});
}

// Activation-buffer element counts, in allocation order, shared by the plan and the allocation.
// --recompute levels: which activations the backward recomputes instead of keeping one copy per layer.
enum Recompute { kKeepAll = 0, kRecomputeGelu = 1, kRecomputeGeluLayerNorm = 2, kRecomputeBlock = 3 };
// The widths of one row (per token) of {ln1, qkv, atty, residual2, ln2, fch, fch_gelu, residual3}: under tensor
// parallelism the attention's and the MLP's inner activations hold this rank's heads and hidden units (fch: the
// MLP's input products, fc or gate and up; fch_gelu: its activation, GELU or SwiGLU); under sequence parallelism
// (split = tp) the norm and residual activations hold this rank's 1/tp of the rows, which is a width of C / tp per
// row of the batch.
inline std::array<size_t, 8> activation_width(const ModelConfig& c, int tp, int split) {
    const size_t C = c.channels, Cs = C / tp, Cr = C / split;
    return {Cr, qkv_width(c, tp), Cs, Cr, Cr, fc_width(c, tp), hidden_width(c, tp), Cr};
}
// Elements of one row that every layer keeps, or that all layers share (refilled by the backward), for a
// recompute level.
inline bool activation_shared(int recompute, int buffer);
inline void activation_widths(const ModelConfig& c, int tp, int split, int recompute, size_t* kept, size_t* shared) {
    const std::array<size_t, 8> width = activation_width(c, tp, split);
    *kept = *shared = 0;
    for (int i = 0; i < 8; i++) (activation_shared(recompute, i) ? *shared : *kept) += width[i];
}
inline bool activation_shared(int recompute, int buffer) {
    switch (buffer) {
        case 6: return recompute >= kRecomputeGelu;                      // fch_gelu
        case 0: case 4: return recompute >= kRecomputeGeluLayerNorm;     // ln1, ln2
        case 7: return false;                                            // residual3: the next block's input
        default: return recompute >= kRecomputeBlock;                    // qkv, atty, residual2, fch
    }
}

// Elements of one row (token) of a block's output gradients kept from B to W in a gradient slot: the attention
// projection's (C) and the fc projection's (C), and the qkv product's and fc's (their widths per rank) unless they
// take the place of the activation set's own qkv and fch buffers (with one spare of each, gradient_slots.cuh's
// GradientSlots). Those are dead after B wherever W reads them nowhere: qkv unless --recompute 3 refills it
// (shared then), fch unless --recompute 1-3 refills the GELU's output from it.
inline bool qkv_grad_in_set(int recompute) { return !activation_shared(recompute, 1); }
inline bool fc_grad_in_set(int recompute) { return recompute == kKeepAll; }
// Elements of one row of those that take the set's buffers' place (and of the spares they rotate through).
inline size_t output_grads_in_set_width(const ModelConfig& c, int tp, int recompute) {
    return (qkv_grad_in_set(recompute) ? qkv_width(c, tp) : 0) + (fc_grad_in_set(recompute) ? fc_width(c, tp) : 0);
}
inline size_t output_grads_width(const ModelConfig& c, int tp, int recompute) {
    const size_t C = c.channels;
    return qkv_width(c, tp) + C + fc_width(c, tp) + C - output_grads_in_set_width(c, tp, recompute);
}

// Activation-buffer element counts, in allocation order, shared by the plan and the allocation.
// `split`: tp under sequence parallelism, else 1 (the rows of the LayerNorm and residual regions are N / split).
// Each activation set keeps its blocks' activations, its input and its dresidual, each gradient slot its chunk's
// blocks' output gradients; the recomputed buffers, the head's (lnf, logits) and the scratch are shared by all sets.
inline void activation_counts(const ModelConfig& c, int B, int T, int tp, int split, int recompute, const ActivationPlan& ap,
                              size_t* x_elements, size_t* stat_elements) {
    const size_t N = (size_t)B * T, Nr = N / split, C = c.channels, NH = c.num_heads / tp;
    size_t kept, shared;
    activation_widths(c, tp, split, recompute, &kept, &shared);
    const size_t lse = (size_t)B * NH * T;
    size_t set_blocks = 0;  // blocks over all sets
    for (size_t k = 0; k < ap.slots.size(); k++) set_blocks += (size_t)ap.slots[k] * ap.chunk_blocks[k];
    size_t grad_blocks = 0;  // blocks over all gradient slots
    for (size_t k = 0; k < ap.grad_slots.size(); k++) grad_blocks += (size_t)ap.grad_slots[k] * ap.chunk_blocks[k];
    const size_t head = ap.head ? N * C + N * (c.padded_vocab_size / tp) : 0;  // lnf, logits (this rank's columns)
    // proj_out, dbtc, dbig (the qkv product's or the MLP inputs' output gradient), Llama's dhidden (the SwiGLU output's
    // gradient), and under sequence parallelism `gathered`
    const size_t scratch = N * C + N * C + N * std::max(qkv_width(c, tp), fc_width(c, tp)) + (c.llama() ? N * hidden_width(c, tp) : 0) +
                           (split > 1 ? N * C : 0);
    // the spares that the sets' qkv and fch buffers rotate through, where output gradients take their place
    const size_t spares = ap.splits_backward() ? output_grads_in_set_width(c, tp, recompute) : 0;
    *x_elements = N * (kept * set_blocks + output_grads_width(c, tp, recompute) * grad_blocks + shared + spares) + 2 * Nr * C * ap.sets() + head +
                  scratch;
    *stat_elements = (Nr * 4 + (recompute >= kRecomputeBlock ? 0 : lse)) * set_blocks + (recompute >= kRecomputeBlock ? lse : 0) +
                     (ap.head ? Nr * 2 : 0) + N;
}

// Per GPU, for `dp` data-parallel and `tp` tensor-parallel ranks (`split` = tp with sequence parallelism, else 1),
// of a pipeline stage holding `part` with activation sets `ap` (the whole model with one set by default). offload:
// what ZeRO-Offload keeps on the host (p.host) instead of the GPU; delayed_update: its one-step delayed update, whose
// whole-shard host buffers the host plan counts (the GPU's is the same); offload_file: its NVMe tier (--offload-dir),
// the optimizer state on the disk and its tiles on the host. fp8 (null without --precision fp8): FP8's memory (the
// weights' copies, kept except under ZeRO-3, one layer's activation copies, the scaling states). device_scratch = false
// (a plan made without a GPU, train_gpt's --dry-run): without the reductions' scratch, whose size is the GPU's (per SM).
// lora.nf4_base (--base-quant nf4): the frozen base as nf4_base.cuh stores it (nf4_base_memory) instead of whole.
template <typename floatX>
MemoryPlan plan_memory(const ModelConfig& c, int B, int T, int dp, int tp, int split, int zero_stage, int recompute, Offload offload = Offload::kNone,
                       bool delayed_update = false, const LoraSpec& lora = LoraSpec(), const StageModel& part = StageModel(),
                       ActivationPlan ap = ActivationPlan(), bool offload_file = false, const Fp8Options* fp8 = nullptr, bool device_scratch = true) {
    MemoryPlan p;
    if (ap.slots.empty()) ap = ActivationPlan::whole(c);
    const ParameterLayout l(c, 8 * dp, tp, part);  // ZeRO shards over the data-parallel group
    const ZeroMemory z = zero_memory<floatX>(l.unit_sizes, l.unit_kinds, l.total, dp, zero_stage, !lora.enabled(), offload);
    p.host = ZeroOffload<floatX>::host_memory(l.total, dp, zero_stage, offload, delayed_update, offload_file);
    p.parameters = z.parameters;
    p.gradients = z.gradients;
    p.master_weights = z.master_weights;
    p.adam_state = z.adam_state;
    p.working = z.working;
    const bool nf4 = lora.enabled() && lora.nf4_base;
    const Nf4BaseMemory nf4_base = nf4_base_memory<floatX>(l, lora.nf4_double_quant);
    if (nf4) {
        p.parameters = nf4_base.parameters();
        p.working = nf4_base.ring;
    }
    if (lora.enabled()) {
        const AdapterLayout a(c, lora, 8 * dp, l.part.layers);  // the stage's blocks'
        const ZeroMemory za = zero_memory<floatX>(a.unit_sizes(), a.unit_kinds(), a.total, dp, zero_stage);
        p.parameters += za.parameters;
        p.gradients += za.gradients;
        p.master_weights += za.master_weights;
        p.adam_state += za.adam_state;
        const size_t N = (size_t)B * T;
        p.activations += lora_activation_elements(lora, c, N, a.num_blocks(), *std::max_element(ap.slots.begin(), ap.slots.end())) * sizeof(floatX);
    }
    size_t x_elements, stat_elements;
    activation_counts(c, B, T, tp, split, recompute, ap, &x_elements, &stat_elements);
    p.activations += x_elements * sizeof(floatX) + stat_elements * sizeof(float);  // after LoRA's buffers
    // the initialisation's transient staging included (init_parameters: a whole fp32 unit and this rank's part
    // of one; set_parameters: one of this rank's units; with the NF4 base one block, and its quantization's scratch)
    const std::vector<size_t>& sizes = ParameterLayout(c, 8 * dp).unit_sizes;  // init_parameters draws whole units
    const size_t staging = nf4 ? nf4_base.staging + nf4_base.scratch
                               : (*std::max_element(sizes.begin(), sizes.end()) + *std::max_element(l.unit_sizes.begin(), l.unit_sizes.end())) *
                                     sizeof(float);
    p.scratch = (device_scratch ? reduce_scratch_floats<floatX>(c) * sizeof(float) : 0) + matmul_context().workspace_bytes + staging +
                (size_t)B * T * 5 * sizeof(int) * ap.sets() +
                flash_attention_backward_scratch_bytes(B, T, c.num_heads / tp, c.key_value_heads() / tp, c.head_size()) +
                (tp > 1 ? 4 * (size_t)B * T * sizeof(float) : 0) +  // the vocabulary-parallel loss's row statistics
                (fp8 ? fp8_scratch_bytes(c, (size_t)B * T, l.num_blocks(), *fp8, dp == 1 || zero_stage < 3, tp) : 0);
    return p;
}

// Each pipeline stage's plan (the whole model's, without pipeline parallelism): its part of the model, one
// activation set per micro-batch in flight on each of its chunks, and under ZB-H1 one gradient slot per micro-batch
// between its B and its W.
template <typename floatX>
struct StagePlans {
    ModelConfig config;
    int B = 0, T = 0, dp = 1, tp = 1, zero_stage = 0, recompute = 0;
    Offload offload = Offload::kNone;
    bool delayed_update = false;  // ZeRO-Offload's one-step delayed update
    LoraSpec lora;
    std::vector<StageModel> parts;
    std::vector<std::vector<int>> chunks, slots;  // per stage: blocks per chunk, activation sets per chunk
    bool offload_file = false;  // ZeRO-Offload's NVMe tier (--offload-dir)
    std::vector<std::vector<int>> grad_slots;  // per stage: gradient slots per chunk (ZB-H1's; empty or 0: none)
    bool fp8 = false;           // --precision fp8
    Fp8Options fp8_options;
    bool device_scratch = true;  // false: without a GPU, the plan leaves out the reductions' scratch (plan_memory)
    ActivationPlan sets(int s) const { return {chunks[s], slots[s], parts[s].last, grad_slots.empty() ? std::vector<int>() : grad_slots[s]}; }
    MemoryPlan of(int s, int split) const {
        return plan_memory<floatX>(config, B, T, dp, tp, split, zero_stage, recompute, offload, delayed_update, lora, parts[s], sets(s), offload_file,
                                   fp8 ? &fp8_options : nullptr, device_scratch);
    }
};

// ZeRO's model states per GPU for P parameters on N data-parallel ranks at `stage` (0-3), with parameters and
// gradients of `w` bytes and fp32 master weights (4 bytes) unless the parameters are fp32 themselves, and Adam's
// m and v (8 bytes): in bf16 16P, 4P + 12P/N, 2P + 14P/N, 16P/N bytes; in fp32 16P, 8P + 8P/N, 4P + 12P/N, 16P/N.
// offload (ZeRO-Offload): the optimizer state is the host's, the GPU keeps 4P, 2P + 2P/N, 4P/N at stages 1-3 in
// bf16 (8P, 4P + 4P/N, 8P/N in fp32); with the parameters at stage 3, 2P/N (4P/N). Under tensor parallelism P is one
// rank's share: its slices plus the replicated tensors.
inline double zero_states_formula(double P, double N, int stage, int w, Offload offload = Offload::kNone) {
    const double master = w == 4 ? 0 : 4, optimizer = offload != Offload::kNone ? 0 : master + 8;
    const double parameters = offload == Offload::kOptimizerParameters ? 0 : w;  // the stage-3 shard's
    return std::vector<double>{(2 * w + optimizer) * P, 2 * w * P + optimizer * P / N, w * P + (w + optimizer) * P / N,
                               (parameters + w + optimizer) * P / N}[stage];
}
// What the formula counts, in words, for the start-up line.
inline std::string zero_states_words(const std::string& precision, Offload offload = Offload::kNone) {
    const std::string states = precision + " parameters and gradients";
    if (offload == Offload::kOptimizerParameters) return precision + " gradients (the parameter shard and the optimizer state are on the host)";
    if (offload == Offload::kOptimizer) return states + " (the optimizer state is on the host)";
    return precision == "fp32" ? states + ", Adam m + v" : states + ", fp32 master weights + Adam m + v";
}

inline std::string gib_text(size_t bytes) { return std::to_string(gib(bytes)).substr(0, 5); }

// The start-up report of stage `stage`'s plan (per-stage lines under pipeline parallelism; LoRA's against full
// fine-tuning; sequence parallelism's saving) against `free_bytes`; dies with the figures and what to change when it
// does not fit. A smaller batch only shrinks the activations: when the rest alone does not fit, only more GPUs help.
// A higher ZeRO stage helps only with data-parallel ranks to shard over, and pipelines run stages 0-1.
template <typename floatX>
MemoryPlan report_memory_plan(FILE* out, const StagePlans<floatX>& plans, int stage, int split, size_t free_bytes, size_t parameters,
                              size_t trainable, const std::string& lora_targets) {
    const MemoryPlan plan = plans.of(stage, split);
    const int P = (int)plans.parts.size();
    for (int s = 0; P > 1 && s < P; s++) {
        const MemoryPlan p = plans.of(s, split);
        const ActivationPlan ap = plans.sets(s);
        std::string chunks, slots, grad_slots;
        for (size_t k = 0; k < ap.chunk_blocks.size(); k++) {
            chunks += (k ? "+" : "") + std::to_string(ap.chunk_blocks[k]);
            slots += (k ? "+" : "") + std::to_string(ap.slots[k]);
            if (k < ap.grad_slots.size()) grad_slots += (k ? "+" : "") + std::to_string(ap.grad_slots[k]);
        }
        const std::string kept = ap.total_grad_slots() == 0 ? ""
                                 : " (with the output gradients of " + grad_slots + (grad_slots == "1" ? " micro-batch" : " micro-batches") +
                                       " kept from B to W)";
        fprintf(out, "  stage %d: %s blocks%s%s, %s micro-batches in flight: parameters+gradients+optimizer %.2f GiB, activations%s %.2f GiB, total %.2f GiB\n",
                s, chunks.c_str(), plans.parts[s].first ? " + embeddings" : "", plans.parts[s].last ? " + final LayerNorm and LM head" : "",
                slots.c_str(), gib(p.parameters + p.gradients + p.master_weights + p.adam_state), kept.c_str(), gib(p.activations), gib(p.total()));
    }
    const LoraSpec& lora = plans.lora;
    if (lora.enabled()) {
        const MemoryPlan full = plan_memory<floatX>(plans.config, plans.B, plans.T, plans.dp, plans.tp, split, plans.zero_stage, plans.recompute,
                                                    Offload::kNone, false, LoraSpec(), StageModel(), ActivationPlan(), false, nullptr,
                                                    plans.device_scratch);
        const size_t states = plan.parameters + plan.gradients + plan.master_weights + plan.adam_state;
        const size_t full_states = full.parameters + full.gradients + full.master_weights + full.adam_state;
        fprintf(out, "LoRA r=%d alpha=%g targets %s: %zu trainable parameters (%.3f%% of %zu); model states %.3f GiB vs %.3f GiB for full fine-tuning\n",
                lora.rank, lora.alpha, lora_targets.c_str(), trainable, 100.0 * trainable / parameters, parameters, gib(states), gib(full_states));
        if (lora.nf4_base) {
            const Nf4BaseMemory m =
                nf4_base_memory<floatX>(ParameterLayout(plans.config, 8 * plans.dp, plans.tp, plans.parts[stage]), lora.nf4_double_quant);
            const char* precision = std::is_same<floatX, float>::value ? "fp32" : "bf16";
            fprintf(out, "base in NF4 (QLoRA, %s, %.4f bytes a weight): the blocks' %zu linear-layer weights with their norms and "
                         "biases %.3f GiB | embeddings, final norm and LM head in %s %.3f GiB | ring of two %s blocks %.3f GiB | total %.3f GiB "
                         "vs %.3f GiB for the %s base\n",
                    lora.nf4_double_quant ? "double quantization" : "fp32 absmaxes", nf4_bits_per_weight(lora.nf4_double_quant) / 8, m.weights, gib(m.packed), precision, gib(m.persistent), precision, gib(m.ring),
                    gib(m.parameters()), gib(m.dense), precision);
        }
    }
    fprintf(out, "memory plan per GPU (GiB): parameters %.2f | gradients %.2f | master weights %.2f | Adam m+v %.2f | activations %.2f | scratch %.2f | total %.2f of %.2f free\n",
            gib(plan.parameters), gib(plan.gradients), gib(plan.master_weights), gib(plan.adam_state), gib(plan.activations),
            gib(plan.scratch), gib(plan.total()), gib(free_bytes));
    if (split > 1)
        fprintf(out, "sequence parallel: activations %.2f GiB per GPU, against %.2f GiB without it (the LayerNorm and residual regions hold 1/%d of the rows)\n",
                gib(plan.activations), gib(plans.of(stage, 1).activations), split);
    if (plan.total() > free_bytes) {
        const size_t without_activations = plan.total() - plan.activations;
        const std::string hint = without_activations > free_bytes
            ? "the model states and scratch alone need " + gib_text(without_activations) +
                  " GiB: spread the model over more GPUs (--tensor-parallel, --pipeline-parallel, or more data-parallel ranks under --zero-stage 3)"
            : "lower --batch-size (and raise --total-batch-tokens to keep the step size)";
        die("the plan needs " + gib_text(plan.total()) + " GiB but the GPU has " + gib_text(free_bytes) + " GiB free: " + hint +
            (plans.zero_stage < 3 && P == 1 && plans.dp > 1 ? ", or raise --zero-stage" : ""));
    }
    return plan;
}

// ZeRO-Offload's host memory budget of one machine: --host-memory-gib, or MemTotal of /proc/meminfo. Some virtual
// machines let a process use more than their MemTotal (memory that grows as it is touched): the flag states it.
struct HostBudget {
    size_t bytes = 0;
    std::string source;  // what the budget is, for the report: "MemTotal" or "--host-memory-gib"
};
inline HostBudget host_memory_budget(float host_memory_gib) {
    if (host_memory_gib > 0) return {(size_t)((double)host_memory_gib * 1024 * 1024 * 1024), "--host-memory-gib"};
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    size_t kib = 0;
    while (meminfo >> key && key != "MemTotal:") meminfo.ignore(1 << 20, '\n');
    if (key != "MemTotal:" || !(meminfo >> kib) || kib == 0)
        die("cannot read MemTotal from /proc/meminfo: give the host memory budget with --host-memory-gib");
    return {kib * 1024, "MemTotal"};
}

// The start-up line of ZeRO-Offload's pinned host memory, next to the GPU's plan: a rank's part (`host`, each of the
// `ranks_on_host` ranks of this machine takes as much) against the machine's budget, and the CPU AdamW that updates it
// (`cpu`, in words). Dies with the figures and what can help when the machine's ranks together exceed the budget.
// With the NVMe tier (offload_dir not empty) the host holds the optimizer file's tiles (pageable), and a second line
// gives the file of a rank against the free space of offload_dir (the optimizer files already there of run `run_id`
// count as free: its ranks that started first; so do those a run that died left), which refuses when the machine's
// files do not fit.
inline void report_host_memory_plan(FILE* out, const HostMemory& host, int ranks_on_host, const HostBudget& budget, const std::string& cpu,
                                    const std::string& offload_dir = "", uint64_t run_id = 0) {
    const size_t machine = host.total() * ranks_on_host;
    const std::string ranks = std::to_string(ranks_on_host) + (ranks_on_host == 1 ? " rank" : " ranks");
    const std::string tiles = offload_dir.empty() ? "" : " | optimizer file tiles (pageable) " + gib_text_of((double)host.file_tiles);
    fprintf(out, "host memory per rank (GiB, pinned): master weights %.2f | Adam m+v %.2f | parameters %.2f | gradients %.2f | staging %.2f%s | "
                 "total %.2f; x %s on this machine = %.2f of %.2f (budget: %s); AdamW on the CPU: %s\n",
            gib(host.master_weights), gib(host.adam_state), gib(host.parameters), gib(host.gradients), gib(host.staging), tiles.c_str(),
            gib(host.total()), ranks.c_str(), gib(machine), gib(budget.bytes), budget.source.c_str(), cpu.c_str());
    if (!offload_dir.empty()) {
        const double free_bytes = std::max(offload_dir_free_bytes(offload_dir, run_id), 0.0);
        fprintf(out, "disk per rank (GiB, --offload-dir %s): optimizer file (master weights + Adam m+v) %.2f; x %s on this machine = %.2f of "
                     "%.2f free\n",
                offload_dir.c_str(), gib(host.disk), ranks.c_str(), gib(host.disk * ranks_on_host), free_bytes / (1024.0 * 1024.0 * 1024.0));
        const std::string problem = offload_dir_space_problem(offload_dir, host.disk, ranks_on_host, run_id);
        if (!problem.empty()) die(problem);
    }
    if (machine > budget.bytes)
        die("the offloaded state needs " + gib_text(machine) + " GiB of pinned host memory on this machine (" + ranks + " x " +
            gib_text(host.total()) + " GiB) but the budget is " + gib_text(budget.bytes) + " GiB (" + budget.source + "): spread the job "
            "over more machines (more data-parallel ranks each hold a smaller shard), or give --host-memory-gib if this machine lets a "
            "process use more than MemTotal");
}
