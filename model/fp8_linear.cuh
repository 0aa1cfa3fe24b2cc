// --precision fp8: the products of the blocks' four linear layers (qkv, attention projection, fc, fc projection) in
// FP8 on cuBLASLt (matmul_fp8: fp32 accumulation, bf16 output, the bias in the epilogue), with every other tensor of
// a bf16 run unchanged: parameters, gradients and activations in bf16, master weights and Adam state in fp32. The
// forward multiplies E4M3 x E4M3 (weight, input); the backward takes the output gradient in E5M2 (range before
// precision): dinp = dout W from the weight's transposed copy and dout, dW += dout^T inp from the input's and dout's
// transposed copies. The bias and GELU gradients stay bf16 kernels (bias_backward, gelu_backward).
// Scaling: per tensor, current (the scale from the tensor's own amax, taken just before its cast, so that the
// largest value maps onto the format's largest finite one: nothing saturates). The forward's weight and input scales
// serve the backward's casts of the same tensors (the weight does not change between a forward and its backward,
// and the input is the same value, kept or recomputed bit for bit). An amax that is NaN or infinite keeps the
// previous scale and is counted (Fp8Scaling::non_finite_amax; Fp8Stats reads the counts and the scales).
// The FP8 copies live in one scratch area shared by all layers, sized for the widest layer; the scaling states are
// 3 per layer per block (48 bytes each). fp8_scratch_bytes gives the memory plan its size.
// defines: Fp8Layer, kFp8Layers, Fp8LayerScaling, fp8_scratch_bytes, Fp8Stats, Fp8Linear
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

// One linear layer's scaling states: its weight and input (E4M3) and its output gradient (E5M2). Each Fp8Scaling is
// 16-byte aligned, so every inverse_scale is a pointer cuBLASLt takes.
struct Fp8LayerScaling {
    Fp8Scaling weight, input, output_grad;
};

// Device bytes of the FP8 scratch for N rows of a micro-batch: one weight (or its transpose) of the widest layer
// (4C x C), one input (or its transpose) of N rows of 4C, and the output gradient with its transpose (N x 4C each);
// plus the scaling states of every block.
inline size_t fp8_scratch_bytes(const ModelConfig& c, size_t N, int blocks) {
    const size_t C = c.channels;
    return 4 * C * C + 3 * N * 4 * C + (size_t)blocks * kFp8Layers * sizeof(Fp8LayerScaling);
}

// What the scaling states say, summed over every layer and block (Fp8Linear::stats): the updates that met a NaN or
// infinite amax (kept the previous scale), and the range of the scales of the weights, the inputs and the output
// gradients (a scale s maps the tensor's amax onto the format's largest value: amax = 448 / s for E4M3, 57344 / s
// for E5M2).
struct Fp8Stats {
    unsigned long non_finite_amax = 0;
    float weight_scale[2] = {INFINITY, 0}, input_scale[2] = {INFINITY, 0}, output_grad_scale[2] = {INFINITY, 0};  // min, max
    std::string line() const {
        char text[256];
        snprintf(text, sizeof(text), "non-finite amax %lu | scales: weights %.3g..%.3g, inputs %.3g..%.3g, output gradients %.3g..%.3g",
                 non_finite_amax, weight_scale[0], weight_scale[1], input_scale[0], input_scale[1], output_grad_scale[0], output_grad_scale[1]);
        return text;
    }
};

struct Fp8Linear {
    int blocks = 0;
    Fp8LayerScaling* scalings = nullptr;  // [blocks][kFp8Layers], device
    __nv_fp8_e4m3* weight = nullptr;      // the weight (forward) or its transposed copy (backward)
    __nv_fp8_e4m3* input = nullptr;       // the input (forward) or its transposed copy (backward)
    __nv_fp8_e5m2* output_grad = nullptr;
    __nv_fp8_e5m2* output_grad_t = nullptr;
    void* memory = nullptr;

    // For `blocks` blocks and micro-batches of up to N rows; refuses a GPU without FP8 in one line.
    void allocate(const ModelConfig& c, size_t N, int block_count) {
        require_fp8_gpu();
        blocks = block_count;
        const size_t C = c.channels;
        cudaCheck(cudaMalloc(&memory, fp8_scratch_bytes(c, N, blocks)));
        // each piece a multiple of 16 bytes (C is), so each starts 16-byte aligned as the casts and products need
        char* p = (char*)memory;
        scalings = (Fp8LayerScaling*)p;
        p += (size_t)blocks * kFp8Layers * sizeof(Fp8LayerScaling);
        weight = (__nv_fp8_e4m3*)p;
        p += 4 * C * C;
        input = (__nv_fp8_e4m3*)p;
        p += N * 4 * C;
        output_grad = (__nv_fp8_e5m2*)p;
        p += N * 4 * C;
        output_grad_t = (__nv_fp8_e5m2*)p;
        const std::vector<Fp8LayerScaling> initial((size_t)blocks * kFp8Layers);  // scale 1, amax 0, no count
        cudaCheck(cudaMemcpy(scalings, initial.data(), initial.size() * sizeof(Fp8LayerScaling), cudaMemcpyHostToDevice));
    }
    ~Fp8Linear() {
        if (memory != nullptr) cudaFree(memory);
    }

    Fp8LayerScaling* at(int block, Fp8Layer layer) const { return scalings + (size_t)block * kFp8Layers + layer; }

    // Current scaling of x[n]: its amax alone (the casts since the last update added theirs: cleared first), then
    // the scale from it (no margin: the amax maps onto the format's largest value).
    template <typename fp8>
    static void scale_from(Fp8Scaling* s, const __nv_bfloat16* x, long n, cudaStream_t stream) {
        cudaCheck(cudaMemsetAsync(&s->amax, 0, sizeof(float), stream));
        fp8_amax(&s->amax, x, n, stream);
        fp8_update_scales(s, 1, Fp8Traits<fp8>::format, 0, stream);
    }

    // out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] in E4M3 x E4M3, for layer `layer` of block `block`.
    void forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* w, const __nv_bfloat16* bias, int N, int C, int OC,
                 int block, Fp8Layer layer, cudaStream_t stream) {
        Fp8LayerScaling* s = at(block, layer);
        scale_from<__nv_fp8_e4m3>(&s->weight, w, (long)OC * C, stream);
        fp8_cast(weight, (__nv_fp8_e4m3*)nullptr, w, OC, C, &s->weight, stream);
        scale_from<__nv_fp8_e4m3>(&s->input, inp, (long)N * C, stream);
        fp8_cast(input, (__nv_fp8_e4m3*)nullptr, inp, N, C, &s->input, stream);
        matmul_fp8(out, weight, input, &s->weight.inverse_scale, &s->input.inverse_scale, bias, OC, N, C, false, stream);
    }

    // dinp[N,C] = dout[N,OC] weight[OC,C] (overwritten), after the forward of the same layer: dout is cast (E5M2,
    // with its transposed copy for backward_weights), the weight with the forward's scale.
    void backward_input(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* w, int N, int C, int OC, int block,
                        Fp8Layer layer, cudaStream_t stream) {
        Fp8LayerScaling* s = at(block, layer);
        scale_from<__nv_fp8_e5m2>(&s->output_grad, dout, (long)N * OC, stream);
        fp8_cast(output_grad, output_grad_t, dout, N, OC, &s->output_grad, stream);
        fp8_cast((__nv_fp8_e4m3*)nullptr, weight, w, OC, C, &s->weight, stream);
        matmul_fp8(dinp, weight, output_grad, &s->weight.inverse_scale, &s->output_grad.inverse_scale, (const __nv_bfloat16*)nullptr, C,
                   N, OC, false, stream);
    }

    // dweight[OC,C] += dout^T inp (null: frozen, nothing) and dbias[OC] += column sums of dout (bf16, bias_backward),
    // after backward_input of the same layer (its dout^T copy), the input cast with the forward's scale.
    void backward_weights(__nv_bfloat16* dweight, __nv_bfloat16* dbias, float* scratch, const __nv_bfloat16* dout, const __nv_bfloat16* inp,
                          int N, int C, int OC, int block, Fp8Layer layer, cudaStream_t stream) {
        Fp8LayerScaling* s = at(block, layer);
        if (dweight != nullptr) {
            fp8_cast((__nv_fp8_e4m3*)nullptr, input, inp, N, C, &s->input, stream);
            matmul_fp8(dweight, input, output_grad_t, &s->input.inverse_scale, &s->output_grad.inverse_scale, (const __nv_bfloat16*)nullptr,
                       C, OC, N, true, stream);
        }
        if (dbias != nullptr) bias_backward(dbias, scratch, dout, N, OC, stream);
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
            widen(st.weight_scale, l.weight.scale);
            widen(st.input_scale, l.input.scale);
            widen(st.output_grad_scale, l.output_grad.scale);
        }
        return st;
    }
};
