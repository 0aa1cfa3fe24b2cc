// What differs between the model families inside a block, chosen in one place (as Megatron's layer spec): the norm
// (GPT-2: LayerNorm with a bias; Llama: RMSNorm), the position encoding (GPT-2: learned positions that the
// embeddings add; Llama: rotary embeddings of q and k after the qkv product) and the MLP's activation (GPT-2: GELU of
// fc; Llama: SwiGLU of [gate | up]). The model (transformer.cuh) sees the widths (config.h) and these calls; the
// parallel machinery sees neither.
// defines: BlockSpec
#pragma once
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/layernorm.cuh"  // defines: layernorm_forward, rmsnorm_forward, and their residual and backward forms
#include "../kernels/rope.cuh"       // defines: rope_inv_freq, rope_forward, rope_backward
#include "../kernels/swiglu.cuh"     // defines: swiglu_forward, swiglu_backward
#include "../kernels/gelu.cuh"       // defines: gelu_forward, gelu_backward
#include "config.h"                  // defines: ModelConfig

template <typename floatX>
struct BlockSpec {
    ModelConfig config;
    float* inv_freq = nullptr;  // Llama: the rotary frequencies (head size / 2, device)

    BlockSpec() = default;
    BlockSpec(const BlockSpec&) = delete;
    BlockSpec& operator=(const BlockSpec&) = delete;
    ~BlockSpec() {
        if (inv_freq != nullptr) cudaFree(inv_freq);
    }
    void allocate(const ModelConfig& c) {
        config = c;
        if (!c.llama()) return;
        const std::vector<float> f = rope_inv_freq(c.head_size(), c.rope_theta, c.rope_scaling);
        cudaCheck(cudaMalloc(&inv_freq, f.size() * sizeof(float)));
        cudaCheck(cudaMemcpy(inv_freq, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
    }

    // Parameters of one norm: weight and bias (LayerNorm), weight (RMSNorm); adjacent in every layout.
    size_t norm_parameters() const { return (config.llama() ? 1 : 2) * (size_t)config.channels; }
    // out = norm(x); or residual = x + y, then out = norm(residual) when y is given. mean and bias: LayerNorm's.
    void norm_forward(floatX* residual, floatX* out, float* mean, float* rstd, const floatX* x, const floatX* y, const floatX* weight,
                      const floatX* bias, int N, cudaStream_t stream) const {
        const int C = config.channels;
        if (config.llama()) {
            if (y != nullptr) residual_rmsnorm_forward(residual, out, rstd, x, y, weight, N, C, config.norm_eps, stream);
            else rmsnorm_forward(out, rstd, x, weight, N, C, config.norm_eps, stream);
        } else if (y != nullptr) {
            residual_layernorm_forward(residual, out, mean, rstd, x, y, weight, bias, N, C, stream);
        } else {
            layernorm_forward(out, mean, rstd, x, weight, bias, N, C, stream);
        }
    }
    // dinp += d/dinp, dparams += the norm's parameter gradients (null: frozen); dinp_colsum as layernorm_backward's.
    void norm_backward(floatX* dinp, floatX* dparams, float* scratch, const floatX* dout, const floatX* inp, const floatX* weight,
                       const float* mean, const float* rstd, int N, cudaStream_t stream, floatX* dinp_colsum = nullptr) const {
        const int C = config.channels;
        if (config.llama()) rmsnorm_backward(dinp, dparams, scratch, dout, inp, weight, rstd, N, C, stream, dinp_colsum);
        else layernorm_backward(dinp, dparams, scratch, dout, inp, weight, mean, rstd, N, C, stream, dinp_colsum);
    }

    // The position encoding inside the block: q and k of `qkv` (B x T rows of this rank's heads) rotated for the
    // positions position_offset, position_offset + 1, ... of each row's sequence; nothing for GPT-2, whose
    // positions the embeddings add.
    void position_forward(floatX* qkv, int B, int T, int heads, int kv_heads, int position_offset, cudaStream_t stream) const {
        if (config.llama()) rope_forward(qkv, inv_freq, B, T, heads, kv_heads, config.head_size(), position_offset, stream);
    }
    // Its backward, in place on the attention's dqkv: the gradients of q and k before the rotation.
    void position_backward(floatX* dqkv, int B, int T, int heads, int kv_heads, cudaStream_t stream) const {
        if (config.llama()) rope_backward(dqkv, inv_freq, B, T, heads, kv_heads, config.head_size(), 0, stream);
    }

    // The MLP's activation: act (N x hidden) from fch, the output of the MLP's input product (N x hidden for
    // GPT-2's fc; N x 2 hidden, rows [gate | up], for Llama).
    void activation_forward(floatX* act, const floatX* fch, int N, int hidden, cudaStream_t stream) const {
        if (config.llama()) swiglu_forward(act, fch, N, hidden, stream);
        else gelu_forward(act, fch, (long)N * hidden, stream);
    }
    // dfch = d(loss)/d(fch) from dact = d(loss)/d(act); GPT-2's may be in place (dfch == dact).
    void activation_backward(floatX* dfch, const floatX* dact, const floatX* fch, int N, int hidden, cudaStream_t stream) const {
        if (config.llama()) swiglu_backward(dfch, fch, dact, N, hidden, stream);
        else gelu_backward(dfch, fch, dact, (long)N * hidden, stream);
    }
};
