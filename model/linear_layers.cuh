// The products of a block's four linear layers (qkv, attention projection, fc, fc projection) and their backward:
// bf16 (or the model's precision) on cuBLASLt, or under --precision fp8 in FP8 (fp8_linear.cuh), where the
// kernels that produce the layers' inputs (GPT-2's LayerNorms and GELU) may cast them as they write them
// (kernels/fp8_fused.cuh), or under QLoRA's NF4 base (--base-quant nf4 --nf4-products packed) by
// kernels/nf4_matmul.cuh, which reads the packed weights. The model (transformer.cuh) calls these for every product of
// a block and asks which of its producers write FP8 copies; the head's product is always the model's precision.
// defines: Fp8Copies, LinearLayers
#pragma once
#include <type_traits>
#include "../kernels/common.cuh"
#include "../kernels/matmul.cuh"     // defines: matmul_forward, matmul_backward, matmul_backward_input, matmul_backward_weights
#include "../kernels/fp8_fused.cuh"  // defines: layernorm_forward_fp8, residual_layernorm_forward_fp8, fp8_gelu_cast
#include "../distributed/zero.cuh"   // defines: ZeroOptimizer (parameters_version)
#include "config.h"                  // defines: ModelConfig, ParameterLayout
#include "memory_plan.h"             // defines: activation_shared, Recompute levels
#include "fp8_linear.cuh"            // defines: Fp8Linear, Fp8Layer, Fp8Options, Fp8Stats
#include "../kernels/nf4_matmul.cuh"  // defines: nf4_matmul_forward, nf4_matmul_backward_input
#include "nf4_base.cuh"               // defines: Nf4Base

// Which E4M3 copies a producer writes: the row-major one for the product that follows it, the transposed one for the
// backward.
struct Fp8Copies {
    bool rows, transposed;
};

template <typename floatX>
struct LinearLayers {
    // --precision fp8 (bf16 models only; set before the model's allocate()): the four linear layers of every block
    // multiply in FP8, each rank on its own slices of them; LoRA is refused by the flags' checks
    bool fp8 = false;
    Fp8Options fp8_options;  // --fp8-scaling, --fp8-amax-history
    // With delayed scaling, the LayerNorms and the GELU cast the FP8 layers' inputs as they produce them
    // (fp8_inputs_from_producers); false: the layers cast them (test_fp8_model checks that both train alike)
    bool fp8_producer_casts = true;
    Fp8Linear fp8_linear;
    // QLoRA: the frozen NF4 base (set by the model). nf4_packed(): the products read its weights packed (the ring then
    // holds the blocks' other tensors only) instead of as the ring's dequantized bf16 copies
    const Nf4Base<floatX>* nf4_base = nullptr;
    bool nf4_packed() const { return nf4_base != nullptr && nf4_base->packed_products; }
    // The MLP's GELU runs in cuBLASLt epilogues (the model's matmul_forward_gelu; backward's gelu_inp) where
    // gelu_epilogue allows it. false: separate GELU kernels everywhere (test_model's base model, which must match a
    // model with an fc adapter bit for bit).
    bool gelu_fusion = true;

    // The model's pass, which chooses a product's precision and the producers' copies: its KV-cache position
    // (sampling) and whether a backward follows the forward.
    const int& kv_position;
    const bool& training;
    // From the model's allocate(): the --recompute level, whether the producers have FP8 kernels (GPT-2's LayerNorm
    // and GELU over whole rows: no sequence parallelism), the parameters (their version marks the weights' FP8 copies
    // stale), the deterministic reductions' scratch, the stream.
    int recompute = kKeepAll;
    bool fp8_producer_kernels = false;
    const ZeroOptimizer<floatX>* zero = nullptr;
    float* reduce_scratch = nullptr;
    cudaStream_t stream = nullptr;

    LinearLayers(const int& position, const bool& trains) : kv_position(position), training(trains) {}

    // For micro-batches of up to N rows. split_rows: sequence parallelism leaves each rank 1/tp of the LayerNorms'
    // rows. interleaved: a chunk holds more than one activation set (other micro-batches' forwards run between a
    // layer's forward and its backward). The weights' FP8 copies are kept between parameter changes, except under
    // ZeRO-3 (fp8_linear.cuh says why).
    void allocate(const ModelConfig& c, const ParameterLayout& layout, size_t N, int recompute_level, bool split_rows, bool interleaved,
                  const ZeroOptimizer<floatX>& parameters, float* scratch, cudaStream_t s) {
        recompute = recompute_level;
        fp8_producer_kernels = !split_rows && !c.llama();
        zero = &parameters;
        reduce_scratch = scratch;
        stream = s;
        if (!fp8) return;
        fp8_linear.allocate(c, N, layout.num_blocks(), fp8_options, parameters.stage() < 3, layout.tp);
        fp8_linear.interleaved_micro_batches = interleaved;
    }

    // Whether the four linear layers' products run in FP8 now: under --precision fp8, except in sampling's forwards of
    // one new position at a time (kv_position > 0), which keep the bf16 small-row products (a few microseconds of
    // GPU work, where FP8's casts would add more than they save).
    bool fp8_products() const { return fp8 && kv_position == 0; }
    // --precision fp8 with delayed scaling, once the scales come from the amax histories (Fp8Linear::delayed_scales):
    // an input's scale is known before the input exists, so the kernels that produce the inputs of qkv, fc and the fc
    // projection (ln1, ln2, fch_gelu) write them in E4M3 instead of bf16 (kernels/fp8_fused.cuh): the row-major copy
    // into Fp8Linear's input scratch, which the product that follows reads, and the transposed copy for the weight
    // gradient into the activation's own buffer (N x width codes in the first half of its bf16 room), which the
    // backward reads. Nothing else reads those activations under fp8 (no LoRA; sampling's one-position forwards run
    // bf16 products and produce them in bf16). The attention projection's input comes from the attention: its layer
    // casts it.
    // Under sequence parallelism the LayerNorms hold 1/tp of the rows that qkv and fc multiply (gathered in bf16 first):
    // there the layers cast their inputs.
    bool fp8_inputs_from_producers() const {
        return fp8_products() && fp8_producer_casts && fp8_linear.delayed_scales() && fp8_producer_kernels;
    }
    bool fp8_input_from_producer(Fp8Layer layer) const { return layer != kFp8AttnProj && fp8_inputs_from_producers(); }
    // The copies of the output of layer `layer`'s producer: the row-major one when the product follows; the
    // transposed one when the backward recomputes the output, or in a forward that a backward follows (training) when
    // the output's buffer is the block's own (not one that --recompute shares and refills).
    Fp8Copies input_copies(Fp8Layer layer, bool recomputing, bool product_follows) const {
        const int buffer = layer == kFp8Qkv ? 0 : layer == kFp8Fc ? 4 : 6;  // ln1, ln2, fch_gelu: activation_width's order
        return {product_follows, recomputing || (training && !activation_shared(recompute, buffer))};
    }

    // Whether the product before the GELU (fc's in the forward, the fc projection's in the backward) takes the GELU
    // in its epilogue: where matmul_gelu_epilogues allows it and no LoRA adapter (`adapter`) adds to the product
    // before the GELU. --recompute levels 1-2 rebuild fch_gelu from the kept fch with gelu_forward, which differs in
    // the last bit from the fused product's GELU (of the unrounded pre-activation): those levels run the GELU as
    // separate kernels both ways, so they equal --gelu-fusion 0 bit for bit. FP8 products and the packed NF4 base's
    // have no GELU epilogue here: the GELU kernels run beside them.
    bool gelu_epilogue(bool adapter) const {
        return gelu_fusion && !fp8 && !nf4_packed() && matmul_gelu_epilogues<floatX>() && !adapter &&
               (recompute == kKeepAll || recompute >= kRecomputeBlock);
    }

    // Block l's NF4 weight of layer `layer` ([OC, C]: the product's shape, checked).
    static_assert(kNf4BaseTensors[kFp8Qkv] == QKVW && kNf4BaseTensors[kFp8AttnProj] == ATTPROJW && kNf4BaseTensors[kFp8Fc] == FCW &&
                      kNf4BaseTensors[kFp8FcProj] == FCPROJW,
                  "the NF4 base's weights in the layers' order");
    const Nf4DeviceWeight& nf4_weight(int l, Fp8Layer layer, int C, int OC) const {
        const Nf4DeviceWeight& w = nf4_base->weight(l, (int)layer);
        if (w.shape.size() != 2 || w.shape[0] != (size_t)OC || w.shape[1] != (size_t)C)
            die("internal: block " + std::to_string(l) + "'s NF4 weight " + std::to_string((int)layer) + " is not [" + std::to_string(OC) + ", " +
                std::to_string(C) + "]");
        return w;
    }

    // out[N,OC] = x[N,C] weight^T + bias of layer `layer` in local block l: in FP8 where fp8_products(), else bf16.
    // Under fp8_input_from_producer(layer), x's producer has cast it already: x is not read.
    void forward(floatX* out, const floatX* x, const floatX* weight, const floatX* bias, int N, int C, int OC, int l, Fp8Layer layer) {
        if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
            if (nf4_packed()) {
                nf4_matmul_forward(out, x, nf4_weight(l, layer, C, OC), bias, N, stream);
                return;
            }
            if (fp8_input_from_producer(layer)) {
                fp8_linear.forward_precast(out, weight, bias, N, C, OC, l, layer, zero->parameters_version(), stream);
                return;
            }
            if (fp8_products()) {
                fp8_linear.forward(out, x, weight, bias, N, C, OC, l, layer, zero->parameters_version(), stream);
                return;
            }
        }
        matmul_forward(out, x, weight, bias, N, C, OC, stream);
    }
    // Its backward (matmul_backward's): dx = dy weight (through the GELU's backward in the epilogue with gelu_inp,
    // bf16 only), dweight += dy^T x, dbias += column sums of dy. Under fp8_input_from_producer(layer), x's buffer holds
    // the transposed E4M3 copy that its producer wrote.
    void backward(floatX* dx, floatX* dweight, floatX* dbias, const floatX* dy, const floatX* x, const floatX* weight, int N, int C, int OC,
                  int l, Fp8Layer layer, const floatX* gelu_inp = nullptr) {
        if (nf4_packed()) {
            if (gelu_inp != nullptr || dweight != nullptr || dbias != nullptr) die("internal: the NF4 base's products have no GELU epilogue and no gradients");
            backward_input(dx, dy, weight, N, C, OC, l, layer);
            return;
        }
        if (fp8_products()) {
            if (gelu_inp != nullptr) die("internal: FP8 products take no GELU epilogue");
            backward_input(dx, dy, weight, N, C, OC, l, layer);
            backward_weights(dweight, dbias, dy, x, N, C, OC, l, layer);
            return;
        }
        matmul_backward(dx, dweight, dbias, reduce_scratch, dy, x, weight, N, C, OC, stream, gelu_inp);
    }
    // backward's two halves: dx = dy weight, which in FP8 casts dy (E5M2) with its transposed copy; then dweight +=
    // dy^T x, in FP8 from that copy and x's transposed copy (its producer's, or cast here), and dbias. recast_dy: in
    // FP8 dy's copy is cast again, with the scale its backward_input took (fp8_linear.cuh).
    void backward_input(floatX* dx, const floatX* dy, const floatX* weight, int N, int C, int OC, int l, Fp8Layer layer) {
        if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
            if (nf4_packed()) {
                nf4_matmul_backward_input(dx, dy, nf4_weight(l, layer, C, OC), N, false, stream);
                return;
            }
            if (fp8_products()) {
                fp8_linear.backward_input(dx, dy, weight, N, C, OC, l, layer, zero->parameters_version(), stream);
                return;
            }
        }
        matmul_backward_input(dx, dy, weight, N, C, OC, stream);
    }
    void backward_weights(floatX* dweight, floatX* dbias, const floatX* dy, const floatX* x, int N, int C, int OC, int l, Fp8Layer layer,
                          bool recast_dy = false) {
        if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
            if (fp8_products()) {
                if (recast_dy) fp8_linear.recast_output_grad(dy, N, OC, l, layer, stream);
                if (fp8_input_from_producer(layer))
                    fp8_linear.backward_weights_precast(dweight, dbias, reduce_scratch, dy, reinterpret_cast<const __nv_fp8_e4m3*>(x), N, C,
                                                        OC, l, layer, stream);
                else fp8_linear.backward_weights(dweight, dbias, reduce_scratch, dy, x, N, C, OC, l, layer, stream);
                return;
            }
        }
        matmul_backward_weights(dweight, dbias, reduce_scratch, dy, x, N, C, OC, stream);
    }

    // ZB-H1's W of one layer, after its B (backward_input): dweight += dy^T x, dbias += column sums of dy. In FP8 dy is
    // cast again (B's casts of the later micro-batches took its scratch).
    void weight_gradient(floatX* dweight, floatX* dbias, const floatX* dy, const floatX* x, int N, int C, int OC, int l, Fp8Layer layer) {
        backward_weights(dweight, dbias, dy, x, N, C, OC, l, layer, true);
    }

    // Under fp8_inputs_from_producers(): out = layernorm(x), or residual = x + y, then out = layernorm(residual) when
    // y is given, over N rows of C, as the E4M3 `copies` of block l's layer `layer`'s input (out's buffer taking the
    // transposed one).
    void layernorm_fp8(floatX* out, float* mean, float* rstd, floatX* residual, const floatX* x, const floatX* y, const floatX* weight,
                       const floatX* bias, int N, int C, int l, Fp8Layer layer, Fp8Copies copies) {
        if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
            __nv_fp8_e4m3* input_rows = copies.rows ? fp8_linear.input : nullptr;
            __nv_fp8_e4m3* transposed = copies.transposed ? reinterpret_cast<__nv_fp8_e4m3*>(out) : nullptr;
            Fp8Scaling* s = fp8_linear.input_scaling(l, layer);
            if (y != nullptr) residual_layernorm_forward_fp8(residual, input_rows, transposed, mean, rstd, x, y, weight, bias, N, C, s, stream);
            else layernorm_forward_fp8(input_rows, transposed, mean, rstd, x, weight, bias, N, C, s, stream);
        }
    }
    // Under fp8_inputs_from_producers(): gelu(fch) (N x hidden) as the E4M3 `copies` of block l's fc projection's
    // input (fch_gelu's buffer taking the transposed one).
    void gelu_fp8(floatX* fch_gelu, const floatX* fch, int N, int hidden, int l, Fp8Copies copies) {
        if constexpr (std::is_same<floatX, __nv_bfloat16>::value)
            fp8_gelu_cast(copies.rows ? fp8_linear.input : nullptr, copies.transposed ? reinterpret_cast<__nv_fp8_e4m3*>(fch_gelu) : nullptr,
                          fch, N, hidden, fp8_linear.input_scaling(l, kFp8FcProj), stream);
    }

    // The end of a step's backwards: under fp8 with delayed scaling, the scales from this step's amaxes.
    void end_step() {
        if (fp8) fp8_linear.end_step(stream);
    }
    // --precision fp8: the scaling states' counts and ranges over every layer (waits for the stream).
    Fp8Stats fp8_stats() const { return fp8_linear.stats(stream); }
};
