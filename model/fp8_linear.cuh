// --precision fp8: the products of the blocks' four linear layers (qkv, attention projection, fc, fc projection) in
// FP8 on cuBLASLt (matmul_fp8: fp32 accumulation, bf16 output, the bias in the epilogue), with every other tensor of
// a bf16 run unchanged: parameters, gradients and activations in bf16, master weights and Adam state in fp32. The
// forward multiplies E4M3 x E4M3 (weight, input); the backward takes the output gradient in E5M2 (range before
// precision): dinp = dout W from the weight's transposed copy and dout, dW += dout^T inp from the input's and dout's
// transposed copies. The bias and GELU gradients stay bf16 kernels (bias_backward, gelu_backward).
// Scaling: per tensor, current or delayed (Fp8Options). Current: the scale from the tensor's own amax, taken just
// before its cast (an fp8_amax pass), so that the largest value maps onto the format's largest finite one: nothing
// saturates. Delayed (as Transformer Engine's): the scale from the max of the tensor's last H amaxes, which the
// casts record (no amax pass); all scales are updated once per step (end_step: one kernel), and the first step,
// without a history, takes current scaling. A value beyond the format's range under a delayed scale saturates and
// is counted (Fp8Scaling::overflow). The forward's weight and input scales serve the backward's casts of the same
// tensors (the weight does not change between a forward and its backward, and the input is the same value, kept or
// recomputed bit for bit); where other micro-batches' forwards run between a layer's forward and its backward (a
// pipeline's activation sets in flight: interleaved_micro_batches), a current input scale is taken again from the
// same values, as the forward took it. An amax that is NaN or infinite keeps the previous scale and is counted
// (Fp8Scaling::non_finite_amax; Fp8Stats reads the counts and the scales).
// Weights: each block's four weights are cast once per parameter change (the optimizer step, a checkpoint or model
// load, the initialisation: ZeroOptimizer::parameters_version moves), into an E4M3 copy and its transposed copy kept
// until the next change (2 bytes a weight parameter of the blocks), at their first use; the delayed scales' update
// marks them stale too, as their scale changes. Under ZeRO-3 the gathered weights live only as long as their unit's
// slot in the gather ring, so the copies could not outlive them: there each use casts the weight into a scratch
// shared by all layers (the forward the copy, the backward the transposed copy), as without a cache.
// Inputs: forward casts the layer's input into the forward's copy, backward_weights casts it again into the
// transposed copy. Under delayed scaling, once the scales come from the histories, the input's scale is known before
// the input exists: the kernels that produce the inputs of qkv, fc and the fc projection (the LayerNorms and the
// GELU, kernels/fp8_fused.cuh) write them in E4M3 themselves (Transformer decides where), and forward_precast and
// backward_weights_precast take those copies. The attention projection's input, the attention's output, is cast here.
// A value is counted (overflow) once by each cast that saturates it: twice a step where the layer casts its input,
// once where the producer does.
// The activations' FP8 copies live in one scratch area shared by all layers, sized for the widest layer; the scaling
// states are 3 per layer per block (32 bytes each), with delayed scaling an amax history of H floats each.
// fp8_scratch_bytes gives the memory plan its size.
// defines: Fp8Layer, kFp8Layers, Fp8Options, kFp8DefaultAmaxHistory, Fp8LayerScaling, fp8_scratch_bytes, Fp8Stats, Fp8Linear
#pragma once
#include <algorithm>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/fp8.cuh"     // defines: fp8_amax, fp8_update_scales, fp8_cast, require_fp8_gpu (Fp8Scaling: fp8_formats.h)
#include "../kernels/matmul.cuh"  // defines: matmul_fp8, bias_backward
#include "config.h"               // defines: ModelConfig

// The four linear layers of a block, in the order of LoRA's targets (model/lora.h), which name the same layers.
enum Fp8Layer { kFp8Qkv, kFp8AttnProj, kFp8Fc, kFp8FcProj, kFp8Layers };

// --fp8-scaling and --fp8-amax-history: how the scales are chosen (see above). The default history is Transformer
// Engine's.
constexpr int kFp8DefaultAmaxHistory = 16;
struct Fp8Options {
    bool delayed = false;
    int amax_history = kFp8DefaultAmaxHistory;  // H, with delayed scaling
};

// One linear layer's scaling states: its weight and input (E4M3) and its output gradient (E5M2). Each Fp8Scaling is
// 16-byte aligned, so every inverse_scale is a pointer cuBLASLt takes; the three lie back to back, so a model's
// states are one array of Fp8Scaling for the delayed update (fp8_update_scales_from_history: groups of 3, the third
// E5M2).
struct Fp8LayerScaling {
    Fp8Scaling weight, input, output_grad;
};
static_assert(sizeof(Fp8LayerScaling) == 3 * sizeof(Fp8Scaling), "a layer's scaling states are three back to back");

// A block's weight elements per layer on a rank of `tp` tensor-parallel ones (its slices): qkv (its heads' q, k and v
// rows) x C, the attention projection C x (its heads' columns), fc (its hidden units' fc, or gate and up, rows) x C,
// the fc projection C x (its hidden units). GPT-2: 3, 1, 4 and 4 times C^2 / tp.
struct Fp8WeightSizes {
    size_t layer[kFp8Layers] = {};
    size_t block() const { return layer[0] + layer[1] + layer[2] + layer[3]; }
    size_t widest() const { return std::max(std::max(layer[0], layer[1]), std::max(layer[2], layer[3])); }
};
inline Fp8WeightSizes fp8_weight_sizes(const ModelConfig& c, int tp) {
    const size_t C = c.channels;
    Fp8WeightSizes w;
    w.layer[kFp8Qkv] = qkv_width(c, tp) * C;
    w.layer[kFp8AttnProj] = C * (C / tp);
    w.layer[kFp8Fc] = fc_width(c, tp) * C;
    w.layer[kFp8FcProj] = C * hidden_width(c, tp);
    return w;
}
// Where block `block`'s copies of `layer` start among the kept copies: block after block, in each the layers' two
// copies (the weight, then its transpose) in layer order.
inline size_t fp8_weight_copies_offset(int block, Fp8Layer layer, const Fp8WeightSizes& w) {
    size_t offset = (size_t)block * 2 * w.block();
    for (int k = 0; k < layer; k++) offset += 2 * w.layer[k];
    return offset;
}
// The copies' elements (1 byte each): every block's (cache_weights), else one weight or its transpose of the widest
// layer, cast at each use.
inline size_t fp8_weight_copies_elements(int blocks, const Fp8WeightSizes& w, bool cache_weights) {
    return cache_weights ? (size_t)blocks * 2 * w.block() : w.widest();
}
// The widest row of a layer's input or output gradient (the whole model's: tp = 1): GPT-2's 4C.
inline size_t fp8_widest_row(const ModelConfig& c) {
    return std::max({(size_t)c.channels, (size_t)c.qkv_channels(), fc_width(c, 1), hidden_width(c, 1)});
}

// Device bytes of the FP8 memory for N rows of a micro-batch on a rank of `tp` tensor-parallel ones: the weights'
// copies (cache_weights: every block's weight slices and their transposes, 2 bytes a weight parameter; else one
// weight slice or its transpose of the widest layer), one input (or its transpose) of N rows of the widest row, and
// the output gradient with its transpose (as many each); plus the scaling states of every block and, with delayed
// scaling, their amax histories.
inline size_t fp8_scratch_bytes(const ModelConfig& c, size_t N, int blocks, const Fp8Options& options, bool cache_weights, int tp = 1) {
    const size_t tensors = (size_t)blocks * kFp8Layers * 3;
    return fp8_weight_copies_elements(blocks, fp8_weight_sizes(c, tp), cache_weights) + 3 * N * fp8_widest_row(c) +
           (size_t)blocks * kFp8Layers * sizeof(Fp8LayerScaling) + (options.delayed ? tensors * options.amax_history * sizeof(float) : 0);
}

// What the scaling states say, summed over every layer and block (Fp8Linear::stats): the updates that met a NaN or
// infinite amax (kept the previous scale), the values the casts saturated (beyond the format's range under their
// scale: delayed scaling's scale from past amaxes met a larger one), and the range of the scales of the weights, the
// inputs and the output gradients (a scale s maps the tensor's amax onto the format's largest value: amax = 448 / s
// for E4M3, 57344 / s for E5M2).
struct Fp8Stats {
    unsigned long non_finite_amax = 0;
    unsigned long long overflow = 0;
    float weight_scale[2] = {INFINITY, 0}, input_scale[2] = {INFINITY, 0}, output_grad_scale[2] = {INFINITY, 0};  // min, max
    std::string line() const {
        char text[320];
        snprintf(text, sizeof(text),
                 "non-finite amax %lu | saturated values %llu | scales: weights %.3g..%.3g, inputs %.3g..%.3g, output gradients %.3g..%.3g",
                 non_finite_amax, overflow, weight_scale[0], weight_scale[1], input_scale[0], input_scale[1], output_grad_scale[0],
                 output_grad_scale[1]);
        return text;
    }
};

struct Fp8Linear {
    int blocks = 0;
    Fp8WeightSizes weight_sizes;  // a rank's weight slices per layer
    Fp8Options options;
    bool cache_weights = false;
    // other micro-batches' forwards run between a layer's forward and its backward (pipeline stages with more than one
    // activation set): an input's current scale, which each forward overwrites, is taken again for the backward
    bool interleaved_micro_batches = false;
    Fp8LayerScaling* scalings = nullptr;  // [blocks][kFp8Layers], device
    float* amax_history = nullptr;        // delayed scaling: [blocks][kFp8Layers][3 tensors][H], device
    int history_updates = 0;              // end_step calls so far (delayed scaling: the history's next slot, modulo H)
    // cache_weights: every block's weight copies ([blocks][layer]: the weight, then its transpose); else the scratch
    // of one weight (forward) or its transposed copy (backward)
    __nv_fp8_e4m3* weights = nullptr;
    std::vector<unsigned long long> weights_version;  // [blocks][layer]: the parameters' version the copies hold
    static constexpr unsigned long long kStale = ~0ull;
    __nv_fp8_e4m3* input = nullptr;       // the input (forward) or its transposed copy (backward)
    __nv_fp8_e5m2* output_grad = nullptr;
    __nv_fp8_e5m2* output_grad_t = nullptr;
    void* memory = nullptr;

    // For `blocks` blocks and micro-batches of up to N rows, on a rank of `tp` tensor-parallel ones; cache: keep the
    // weights' copies (not under ZeRO-3). Refuses a GPU without FP8 in one line. Called again, it starts afresh (no
    // copies, no history).
    void allocate(const ModelConfig& c, size_t N, int block_count, const Fp8Options& fp8_options, bool cache, int tp = 1) {
        require_fp8_gpu();
        if (memory != nullptr) cudaCheck(cudaFree(memory));
        history_updates = 0;
        blocks = block_count;
        weight_sizes = fp8_weight_sizes(c, tp);
        options = fp8_options;
        cache_weights = cache;
        if (options.delayed && options.amax_history < 1) die("internal: an FP8 amax history of " + std::to_string(options.amax_history));
        const size_t row = fp8_widest_row(c), bytes = fp8_scratch_bytes(c, N, blocks, options, cache_weights, tp);
        cudaCheck(cudaMalloc(&memory, bytes));
        cudaCheck(cudaMemset(memory, 0, bytes));  // the histories start empty
        // each piece a multiple of 16 bytes (the widths are), so each starts 16-byte aligned as the casts and products need
        char* p = (char*)memory;
        scalings = (Fp8LayerScaling*)p;
        p += (size_t)blocks * kFp8Layers * sizeof(Fp8LayerScaling);
        weights = (__nv_fp8_e4m3*)p;
        p += fp8_weight_copies_elements(blocks, weight_sizes, cache_weights);
        input = (__nv_fp8_e4m3*)p;
        p += N * row;
        output_grad = (__nv_fp8_e5m2*)p;
        p += N * row;
        output_grad_t = (__nv_fp8_e5m2*)p;
        p += N * row;
        if (options.delayed) amax_history = (float*)p;
        const std::vector<Fp8LayerScaling> initial((size_t)blocks * kFp8Layers);  // scale 1, amax 0, no count
        cudaCheck(cudaMemcpy(scalings, initial.data(), initial.size() * sizeof(Fp8LayerScaling), cudaMemcpyHostToDevice));
        weights_version.assign((size_t)blocks * kFp8Layers, kStale);
    }
    ~Fp8Linear() {
        if (memory != nullptr) cudaFree(memory);
    }

    Fp8LayerScaling* at(int block, Fp8Layer layer) const { return scalings + (size_t)block * kFp8Layers + layer; }
    // Whether the scales come from the amax histories now: delayed scaling after its first update.
    bool delayed_scales() const { return options.delayed && history_updates > 0; }

    // Current scaling of x[n]: its amax alone into the state's current_amax, then the scale from it (no margin: the
    // amax maps onto the format's largest value); the casts' record (amax) is left to them.
    template <typename fp8>
    static void scale_from(Fp8Scaling* s, const __nv_bfloat16* x, long n, cudaStream_t stream) {
        fp8_amax(&s->current_amax, x, n, stream);
        fp8_scale_from_current(s, 1, Fp8Traits<fp8>::format, stream);
    }
    // x's scale for its cast now: current scaling's, unless the delayed scales are there.
    template <typename fp8>
    void prepare_scale(Fp8Scaling* s, const __nv_bfloat16* x, long n, cudaStream_t stream) const {
        if (!delayed_scales()) scale_from<fp8>(s, x, n, stream);
    }

    // Block `block`'s cached copies of layer `layer`'s weight w[OC,C]: the weight and its transpose, cast (one
    // transposing cast) when the parameters' version differs from the one they were cast at.
    struct WeightCopies {
        const __nv_fp8_e4m3 *weight, *transposed;
    };
    WeightCopies cached_weight(const __nv_bfloat16* w, int OC, int C, int block, Fp8Layer layer, unsigned long long version,
                               cudaStream_t stream) {
        __nv_fp8_e4m3* copy = weights + fp8_weight_copies_offset(block, layer, weight_sizes);
        __nv_fp8_e4m3* transposed = copy + (size_t)OC * C;
        unsigned long long& cached = weights_version[(size_t)block * kFp8Layers + layer];
        if (cached != version) {
            Fp8Scaling* s = &at(block, layer)->weight;
            prepare_scale<__nv_fp8_e4m3>(s, w, (long)OC * C, stream);
            fp8_cast(copy, transposed, w, OC, C, s, stream);
            cached = version;
        }
        return {copy, transposed};
    }

    // out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] in E4M3 x E4M3, for layer `layer` of block `block`; version: the
    // parameters' (ZeroOptimizer::parameters_version).
    void forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* w, const __nv_bfloat16* bias, int N, int C, int OC,
                 int block, Fp8Layer layer, unsigned long long version, cudaStream_t stream) {
        Fp8Scaling* s = input_scaling(block, layer);
        prepare_scale<__nv_fp8_e4m3>(s, inp, (long)N * C, stream);
        fp8_cast(input, (__nv_fp8_e4m3*)nullptr, inp, N, C, s, stream);
        forward_precast(out, w, bias, N, C, OC, block, layer, version, stream);
    }
    // Inputs cast by their producers (delayed scaling: the scale is known before the input exists): the kernel that
    // produces layer `layer`'s input (kernels/fp8_fused.cuh) casts it with input_scaling's scale, recording its amax
    // there, into `input` (the forward's copy) and/or a transposed copy of its own keeping (for the weight gradient).
    Fp8Scaling* input_scaling(int block, Fp8Layer layer) const { return &at(block, layer)->input; }
    // forward's product with the input already in `input`, cast with input_scaling(block, layer)'s scale.
    void forward_precast(__nv_bfloat16* out, const __nv_bfloat16* w, const __nv_bfloat16* bias, int N, int C, int OC, int block, Fp8Layer layer,
                         unsigned long long version, cudaStream_t stream) {
        Fp8LayerScaling* s = at(block, layer);
        const __nv_fp8_e4m3* weight = weights;
        if (cache_weights) {
            weight = cached_weight(w, OC, C, block, layer, version, stream).weight;
        } else {
            prepare_scale<__nv_fp8_e4m3>(&s->weight, w, (long)OC * C, stream);
            fp8_cast(weights, (__nv_fp8_e4m3*)nullptr, w, OC, C, &s->weight, stream);
        }
        matmul_fp8(out, weight, input, &s->weight.inverse_scale, &s->input.inverse_scale, bias, OC, N, C, false, stream);
    }

    // dinp[N,C] = dout[N,OC] weight[OC,C] (overwritten), after the forward of the same layer: dout is cast (E5M2,
    // with its transposed copy for backward_weights), the weight's transposed copy taken from the cache or cast with
    // the forward's scale.
    void backward_input(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* w, int N, int C, int OC, int block,
                        Fp8Layer layer, unsigned long long version, cudaStream_t stream) {
        Fp8LayerScaling* s = at(block, layer);
        prepare_scale<__nv_fp8_e5m2>(&s->output_grad, dout, (long)N * OC, stream);
        fp8_cast(output_grad, output_grad_t, dout, N, OC, &s->output_grad, stream);
        const __nv_fp8_e4m3* transposed = weights;
        if (cache_weights) transposed = cached_weight(w, OC, C, block, layer, version, stream).transposed;
        else fp8_cast((__nv_fp8_e4m3*)nullptr, weights, w, OC, C, &s->weight, stream);
        matmul_fp8(dinp, transposed, output_grad, &s->weight.inverse_scale, &s->output_grad.inverse_scale, (const __nv_bfloat16*)nullptr, C,
                   N, OC, false, stream);
    }
    // dweight[OC,C] += dout^T inp (null: frozen, nothing) and dbias[OC] += column sums of dout (bf16, bias_backward),
    // after backward_input of the same layer (its dout^T copy), the input cast with the forward's scale.
    void backward_weights(__nv_bfloat16* dweight, __nv_bfloat16* dbias, float* scratch, const __nv_bfloat16* dout, const __nv_bfloat16* inp,
                          int N, int C, int OC, int block, Fp8Layer layer, cudaStream_t stream) {
        if (dweight != nullptr) {
            if (interleaved_micro_batches) prepare_scale<__nv_fp8_e4m3>(input_scaling(block, layer), inp, (long)N * C, stream);
            fp8_cast((__nv_fp8_e4m3*)nullptr, input, inp, N, C, input_scaling(block, layer), stream);
        }
        backward_weights_precast(dweight, dbias, scratch, dout, input, N, C, OC, block, layer, stream);
    }
    // The output gradient dout[N,OC]'s transposed copy cast again, for a backward_weights that does not follow its
    // backward_input (ZB-H1's W, after later micro-batches' B's reused the copy), with the scale backward_input took:
    // current scaling takes the same amax of the same values, and a delayed scale holds for the step. The codes are
    // the first cast's; a saturated value is counted again, the amax recorded again (no change to the max).
    void recast_output_grad(const __nv_bfloat16* dout, int N, int OC, int block, Fp8Layer layer, cudaStream_t stream) {
        Fp8Scaling* s = &at(block, layer)->output_grad;
        prepare_scale<__nv_fp8_e5m2>(s, dout, (long)N * OC, stream);
        fp8_cast((__nv_fp8_e5m2*)nullptr, output_grad_t, dout, N, OC, s, stream);
    }
    // backward_weights with the input's transposed copy inp_t[C,N] given, cast with input_scaling(block, layer)'s
    // scale (by its producer, or above).
    void backward_weights_precast(__nv_bfloat16* dweight, __nv_bfloat16* dbias, float* scratch, const __nv_bfloat16* dout,
                                  const __nv_fp8_e4m3* inp_t, int N, int C, int OC, int block, Fp8Layer layer, cudaStream_t stream) {
        if (dweight != nullptr)
            matmul_fp8(dweight, inp_t, output_grad_t, &input_scaling(block, layer)->inverse_scale, &at(block, layer)->output_grad.inverse_scale,
                       (const __nv_bfloat16*)nullptr, C, OC, N, true, stream);
        if (dbias != nullptr) bias_backward(dbias, scratch, dout, N, OC, stream);
    }

    // The end of a step, after its last backward: with delayed scaling, every tensor's amax since the last update goes
    // into its history and its scale comes from the history's max (one kernel); the cached weight copies are stale
    // (their scale changed). Nothing with current scaling.
    void end_step(cudaStream_t stream) {
        if (!options.delayed) return;
        const int H = options.amax_history;
        fp8_update_scales_from_history(&scalings->weight, amax_history, blocks * kFp8Layers * 3, H, history_updates % H, 3, 2, 0, stream);
        history_updates++;
        std::fill(weights_version.begin(), weights_version.end(), kStale);
    }

    // The scaling states' counts and ranges (waits for the stream).
    Fp8Stats stats(cudaStream_t stream) const {
        std::vector<Fp8LayerScaling> host((size_t)blocks * kFp8Layers);
        cudaCheck(cudaMemcpyAsync(host.data(), scalings, host.size() * sizeof(Fp8LayerScaling), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        Fp8Stats st;
        auto widen = [](float* range, float scale) {
            range[0] = std::min(range[0], scale);
            range[1] = std::max(range[1], scale);
        };
        for (const Fp8LayerScaling& l : host) {
            st.non_finite_amax += l.weight.non_finite_amax + l.input.non_finite_amax + l.output_grad.non_finite_amax;
            st.overflow += l.weight.overflow + l.input.overflow + l.output_grad.overflow;
            widen(st.weight_scale, l.weight.scale);
            widen(st.input_scale, l.input.scale);
            widen(st.output_grad_scale, l.output_grad.scale);
        }
        return st;
    }
};
