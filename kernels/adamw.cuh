// AdamW on fp32 master weights and fp32 moments; writes the compute-precision copy of the parameters
// (stochastically rounded to bf16). Weight decay only on matrices and embeddings (DecayMask).
// defines: DecayMask, adamw_update
#pragma once
#include "common.cuh"

// Which elements of the flat parameter buffer get weight decay, as a function of the element index, so
// that one launch covers the whole buffer (or any contiguous shard of it).
// Layout: [decayed head: wte, wpe][num_blocks identical blocks][no-decay tail: lnfw, lnfb];
// inside a block, elements in [range_begin[r], range_end[r]) decay (the 2-D weight matrices).
struct DecayMask {
    long head_end = 0, block_size = 1, blocks_end = 0;
    int num_ranges = 0;
    long range_begin[8] = {}, range_end[8] = {};
    __host__ __device__ bool decays(long i) const {
        if (i < head_end) return true;
        if (i >= blocks_end) return false;
        long j = (i - head_end) % block_size;
        for (int r = 0; r < num_ranges; r++)
            if (j >= range_begin[r] && j < range_end[r]) return true;
        return false;
    }
};

struct AdamWHyper {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;  // multiplies every gradient first: clipping and fp16 loss-scale removal in one factor
    int t;             // 1-based step, for the bias corrections
    uint64_t seed;     // stochastic rounding; the rounding of element i depends only on (seed, i)
};

template <typename floatX>
__global__ void adamw_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v, long n,
                             long index_offset, AdamWHyper h, float bias_correction1, float bias_correction2,
                             DecayMask mask) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float g = to_float(grads[i]) * h.grad_scale;
        const float mi = h.beta1 * m[i] + (1.0f - h.beta1) * g;
        const float vi = h.beta2 * v[i] + (1.0f - h.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float m_hat = mi / bias_correction1, v_hat = vi / bias_correction2;
        const float wd = mask.decays(index_offset + i) ? h.weight_decay : 0.0f;
        float p = master != nullptr ? master[i] : to_float(params[i]);
        p -= h.lr * (m_hat / (sqrtf(v_hat) + h.eps) + wd * p);
        if (master != nullptr) master[i] = p;
        params[i] = round_stochastic<floatX>(p, random_u32(h.seed, index_offset + i));
    }
}

// Updates n elements starting at global element index `index_offset` (0 for the whole buffer; a shard's
// start under ZeRO). master may be null when floatX is float (the parameters are the master weights).
template <typename floatX>
void adamw_update(floatX* params, float* master, const floatX* grads, float* m, float* v, long n, long index_offset,
                  const AdamWHyper& h, const DecayMask& mask, cudaStream_t stream) {
    const float bias_correction1 = 1.0f - powf(h.beta1, (float)h.t);
    const float bias_correction2 = 1.0f - powf(h.beta2, (float)h.t);
    const int block = 512;
    const int grid = (int)std::min<long>(ceil_div(n, block), (long)device_sm_count() * 8);
    adamw_kernel<<<grid, block, 0, stream>>>(params, master, grads, m, v, n, index_offset, h, bias_correction1,
                                            bias_correction2, mask);
    cudaCheckLaunch();
}
