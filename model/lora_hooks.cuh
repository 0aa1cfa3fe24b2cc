// LoRA in the model's forward and backward (Hu et al. 2021): after the base product of each targeted linear layer,
// out += s B A dropout(x); in the backward dA, dB and the adapter's share of dx. The adapters' parameters and
// gradients are an optimizer of their own (ZeroOptimizer, the base model frozen); their layout, files and merge
// are lora.h's; where the hooks are called is the model's (transformer.cuh).
// defines: LoraHooks
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/init.cuh"       // defines: fill_uniform
#include "../kernels/lora.cuh"       // defines: lora_forward, lora_backward, lora_dropout
#include "../distributed/zero.cuh"   // defines: ZeroOptimizer
#include "lora.h"                    // defines: LoraSpec, AdapterLayout, lora_in, lora_out, lora_product, kLoraTargets

template <typename floatX>
struct LoraHooks {
    LoraSpec spec;
    const AdapterLayout* layout = nullptr;  // the model's, with `adapters`
    ZeroOptimizer<floatX>* adapters = nullptr;
    ModelConfig config;  // the model's shape: the targets' widths
    int layers = 0;      // this rank's blocks (a pipeline stage's; all of them without pipeline parallelism)
    int slot = 0;        // the activation set whose forward or backward runs now (Transformer::select_lora_slot)
    floatX* u = nullptr;        // u = A dropout(x), (N, r) per slot, layer and target, for the backward
    floatX* du = nullptr;       // (N, r) scratch of the backward
    floatX* dropped = nullptr;  // dropout(x), (N, the widest input) scratch, only with dropout
    // Dropout's masks: step_key is set per step, step_seed per micro-batch (micro_batch); the backward regenerates
    // the forward's masks from them.
    uint64_t step_key = 0, step_seed = 0;
    void micro_batch(int micro) { step_seed = splitmix64(step_key ^ (uint64_t)micro); }

    // The adapters of `lora_spec` on a model of shape c: their layout and their parameters (null without LoRA).
    void attach(const ModelConfig& c, const LoraSpec& lora_spec, const AdapterLayout* adapter_layout, ZeroOptimizer<floatX>* optimizer) {
        spec = lora_spec;
        layout = adapter_layout;
        adapters = optimizer;
        config = c;
        layers = adapter_layout ? adapter_layout->num_blocks() : 0;
    }
    bool active(int t) const { return spec.enabled() && spec.targets_has(t); }
    // Whether any adapter adds to product p (kLoraQkv, kLoraAttnProj, kLoraFc, kLoraFcProj): its own or its slices'.
    bool adapts(int p) const {
        for (int t = 0; t < kLoraTargets; t++)
            if (lora_product(t) == p && active(t)) return true;
        return false;
    }
    // Buffers for micro-batches of N rows, `in_flight` of them at once on a chunk (lora_activation_elements counts them).
    void allocate(size_t N, int in_flight) {
        if (!spec.enabled()) return;
        cudaCheck(cudaMalloc(&u, lora_u_elements(spec, N, layers, in_flight) * sizeof(floatX)));
        cudaCheck(cudaMalloc(&du, N * spec.rank * sizeof(floatX)));
        if (spec.dropout > 0.0f) cudaCheck(cudaMalloc(&dropped, N * std::max(config.channels, config.hidden_units()) * sizeof(floatX)));
    }
    ~LoraHooks() {
        for (floatX* p : {u, du, dropped})
            if (p != nullptr) cudaFree(p);
    }

    // out += s B A dropout(x) after the base product p (kLoraQkv .. kLoraFcProj) of block l, for N rows: the adapters
    // of p and of its output's slices (none: no-op).
    void forward(int l, int p, floatX* out, const floatX* x, int N, bool training, cudaStream_t stream) {
        for (int t = 0; t < kLoraTargets; t++)
            if (lora_product(t) == p && active(t)) forward_target(l, t, out, x, N, training, stream);
    }
    // The backward of product p's adapters in block l: dA, dB, and the adapters' share of dx (added; masked under
    // dropout). dout is the whole product's output gradient.
    void backward(int l, int p, floatX* dx, const floatX* dout, const floatX* x, int N, bool training, cudaStream_t stream) {
        for (int t = 0; t < kLoraTargets; t++)
            if (lora_product(t) == p && active(t)) backward_target(l, t, dx, dout, x, N, training, stream);
    }
    void forward_target(int l, int t, floatX* out, const floatX* x, int N, bool training, cudaStream_t stream) {
        const floatX* params = adapters->unit_params(l + 1) - layout->unit_begin(l);
        lora_forward(out + lora_out_offset(t, config), u_buffer(l, t, N), input(l, t, x, N, training, stream), params + layout->a(l, t),
                     params + layout->b(l, t), spec.scale(), N, lora_in(t, config), lora_out(t, config), spec.rank, stream,
                     lora_out_stride(t, config));
    }
    void backward_target(int l, int t, floatX* dx, const floatX* dout, const floatX* x, int N, bool training, cudaStream_t stream) {
        const int in = lora_in(t, config);
        const floatX* x_in = input(l, t, x, N, training, stream);
        const floatX* params = adapters->unit_params(l + 1) - layout->unit_begin(l);
        floatX* grads = adapters->unit_grads(l + 1) - layout->unit_begin(l);
        const bool dropout = x_in != x;
        // under dropout the adapter's dx goes through the same mask again (into the dropout buffer, whose
        // input copy the products have read by then), and is added afterwards
        lora_backward(dropout ? dropped : dx, grads + layout->a(l, t), grads + layout->b(l, t), du, dout + lora_out_offset(t, config),
                      u_buffer(l, t, N), x_in, params + layout->a(l, t), params + layout->b(l, t), spec.scale(), N, in, lora_out(t, config),
                      spec.rank, !dropout, stream, lora_out_stride(t, config));
        if (dropout) {
            lora_dropout(dropped, dropped, (long)N * in, spec.dropout, dropout_seed(l, t), stream);
            accumulate_into(dx, dropped, (long)N * in, stream);
        }
    }
    // The adapter's input: x, or while training with dropout, dropout(x) from this micro-step's masks.
    const floatX* input(int l, int t, const floatX* x, int N, bool training, cudaStream_t stream) {
        if (!training || spec.dropout <= 0.0f) return x;
        lora_dropout(dropped, x, (long)N * lora_in(t, config), spec.dropout, dropout_seed(l, t), stream);
        return dropped;
    }
    floatX* u_buffer(int l, int t, int N) const {
        int index = 0;
        for (int k = 0; k < t; k++) index += spec.targets_has(k);
        return u + (((size_t)slot * layers + l) * __builtin_popcount(spec.targets) + index) * N * spec.rank;
    }
    // the streams of the global block: the same masks and initial values with or without pipeline stages
    uint64_t dropout_seed(int l, int t) const { return splitmix64(step_seed ^ (lora_stream(layout->layers[l], t) + 1)); }

    // A ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's default Linear init), B = 0, from `seed`.
    void init(uint64_t seed, cudaStream_t stream) {
        float* staging;
        const size_t n = layout->total;
        cudaCheck(cudaMalloc(&staging, n * sizeof(float)));
        cudaCheck(cudaMemsetAsync(staging, 0, n * sizeof(float), stream));
        for (int l = 0; l < layers; l++)
            for (int t = 0; t < kLoraTargets; t++)
                if (spec.targets_has(t)) {
                    const int in = lora_in(t, config);
                    fill_uniform(staging + layout->a(l, t), (long)spec.rank * in, 1.0f / sqrtf((float)in),
                                 splitmix64(seed * 1000003ull + lora_stream(layout->layers[l], t)), stream);
                }
        std::vector<float> values(n);
        cudaCheck(cudaMemcpyAsync(values.data(), staging, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(staging));
        adapters->set_parameters(values);
    }
};
