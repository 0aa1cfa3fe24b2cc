// AdamW on fp32 master weights and fp32 moments; writes the compute-precision copy of the parameters
// (stochastically rounded to bf16). Weight decay only on matrices and embeddings (a LayoutMask).
// defines: AdamWHyper, adamw_grad_scale, adamw_update
#pragma once
#include "common.cuh"

struct AdamWHyper {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_clip;   // the gradients' global norm is clipped to this (0: no clipping)
    float loss_scale;  // fp16: the scale the gradients carry (1 otherwise)
    int t;             // 1-based step, for the bias corrections
    uint64_t seed;     // stochastic rounding; the rounding of element i depends only on (seed, i)
};

// The factor every gradient is multiplied by first -- clipping and the removal of the fp16 loss scale in
// one -- from the squared global norm of the scaled gradients, on the device (so that the host need not
// wait for the norm); 0 when the norm is not finite (fp16 overflow): the caller skips the step.
__host__ __device__ inline float adamw_grad_scale(float norm_squared, const AdamWHyper& h) {
    const float norm = sqrtf(norm_squared) / h.loss_scale;
    if (!isfinite(norm)) return 0.0f;
    const float clip = (h.grad_clip > 0.0f && norm > h.grad_clip) ? h.grad_clip / norm : 1.0f;
    return clip / h.loss_scale;
}

// One element: updates m and v in place and returns the new fp32 parameter. The bias corrections come as
// reciprocals: a multiply per element instead of a division. The multiply-adds are written out (each rounded
// once), so the kernel's vector loop, its tail and the CPU AdamW (adamw_cpu.h) do the same operations.
__device__ __forceinline__ float adamw_element(float p, float g, float& m, float& v, float weight_decay, float grad_scale,
                                               const AdamWHyper& h, float inv_bias_correction1, float inv_bias_correction2) {
    g *= grad_scale;
    m = __fmaf_rn(h.beta1, m, (1.0f - h.beta1) * g);
    v = __fmaf_rn(g, (1.0f - h.beta2) * g, h.beta2 * v);
    const float m_hat = m * inv_bias_correction1, v_hat = v * inv_bias_correction2;
    return __fmaf_rn(__fmaf_rn(weight_decay, p, m_hat / (sqrtf(v_hat) + h.eps)), -h.lr, p);
}

// The random bits that stochastically round element `index`: 16 bits of one 64-bit hash shared by 4 consecutive
// elements, so a 16-byte vector of bf16 costs two hashes instead of eight (the hashes and the decay mask's
// division made the kernel compute-bound: 2.6 TB/s on an H200). Still a function of (seed, index) alone.
__device__ __forceinline__ uint64_t rounding_hash(uint64_t seed, long index) { return splitmix64(seed ^ splitmix64((uint64_t)index >> 2)); }
__device__ __forceinline__ uint32_t rounding_bits(uint64_t hash, long index) { return (uint32_t)(hash >> (16 * (index & 3))); }

// Four consecutive compute-precision values as one vector load or store (8 bytes in bf16 and fp16, 16 in fp32).
template <typename T> using FourBits = std::conditional_t<sizeof(T) == 2, uint2, float4>;
template <typename T> __device__ __forceinline__ void load4cs(T* to, const T* from) {
    *reinterpret_cast<FourBits<T>*>(to) = __ldcs(reinterpret_cast<const FourBits<T>*>(from));
}
template <typename T> __device__ __forceinline__ void store4cs(T* to, const T* from) {
    __stcs(reinterpret_cast<FourBits<T>*>(to), *reinterpret_cast<const FourBits<T>*>(from));
}

// Memory-bound: each thread takes 4 consecutive elements an iteration, so that every warp access covers one
// contiguous piece of each stream (512 bytes of each fp32 array, 256 of the bf16 ones). With 8 elements a thread
// (one 16-byte bf16 vector, two float4 of each fp32 array at a 32-byte stride) a copy of the same traffic ran at
// 3.10 TB/s against 3.91 with 4, and this kernel at 3.17 against 3.84 (H200, bench_memory_bound). A tail shorter
// than 4 (n not a multiple of 4) is done element by element. Element i's result depends only on element i (and
// (seed, i) for the rounding), so it is the same however it is grouped. With master weights the compute-precision
// parameters are only written. Every array is touched once: streamed.
template <typename floatX>
__global__ void adamw_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v, long n,
                             long index_offset, AdamWHyper h, const float* norm_squared, float inv_bias_correction1,
                             float inv_bias_correction2, LayoutMask mask) {
    const float grad_scale = adamw_grad_scale(*norm_squared, h);
    if (grad_scale == 0.0f) return;  // non-finite gradients: the step is skipped
    const long stride = (long)gridDim.x * blockDim.x;
    const long vector_end = n / 4 * 4;
    for (long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < vector_end; i += stride * 4) {
        alignas(16) floatX g[4], p[4];
        float4 mm = __ldcs(reinterpret_cast<const float4*>(m + i)), vv = __ldcs(reinterpret_cast<const float4*>(v + i)), pm;
        load4cs(g, grads + i);
        if (master != nullptr) {
            pm = __ldcs(reinterpret_cast<const float4*>(master + i));
        } else {
            load4cs(p, params + i);
            pm = make_float4(to_float(p[0]), to_float(p[1]), to_float(p[2]), to_float(p[3]));
        }
        const long index = index_offset + i;  // a multiple of 4: shards start on 8-element boundaries
        const uint32_t decays = mask.contains_bits<4>(index);
        const uint64_t hash = std::is_same<floatX, __nv_bfloat16>::value ? rounding_hash(h.seed, index) : 0;
        float *pms = &pm.x, *ms = &mm.x, *vs = &vv.x;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            pms[u] = adamw_element(pms[u], to_float(g[u]), ms[u], vs[u], (decays >> u) & 1 ? h.weight_decay : 0.0f,
                                   grad_scale, h, inv_bias_correction1, inv_bias_correction2);
            p[u] = round_stochastic<floatX>(pms[u], rounding_bits(hash, index + u));
        }
        __stcs(reinterpret_cast<float4*>(m + i), mm);
        __stcs(reinterpret_cast<float4*>(v + i), vv);
        if (master != nullptr) __stcs(reinterpret_cast<float4*>(master + i), pm);
        store4cs(params + i, p);
    }
    for (long i = vector_end + (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long index = index_offset + i;
        const float old = master != nullptr ? master[i] : to_float(params[i]);
        const float updated = adamw_element(old, to_float(grads[i]), m[i], v[i], mask.contains(index) ? h.weight_decay : 0.0f,
                                            grad_scale, h, inv_bias_correction1, inv_bias_correction2);
        if (master != nullptr) master[i] = updated;
        params[i] = round_stochastic<floatX>(updated, rounding_bits(rounding_hash(h.seed, index), index));
    }
}

// Updates n elements starting at global element index `index_offset` (0 for the whole buffer; a shard's
// start under ZeRO). master may be null when floatX is float (the parameters are the master weights).
// norm_squared: the device's squared global norm of the (loss-scaled) gradients, for adamw_grad_scale.
// All pointers 16-byte aligned (the parameter layout pads every unit and shard to 8 elements).
template <typename floatX>
void adamw_update(floatX* params, float* master, const floatX* grads, float* m, float* v, long n, long index_offset,
                  const AdamWHyper& h, const float* norm_squared, const LayoutMask& mask, cudaStream_t stream) {
    const float inv_bias_correction1 = 1.0f / (1.0f - powf(h.beta1, (float)h.t));
    const float inv_bias_correction2 = 1.0f / (1.0f - powf(h.beta2, (float)h.t));
    if (index_offset % 4 != 0) die("adamw_update: index_offset " + std::to_string(index_offset) + " is not a multiple of 4");
    const int block = 512;
    const int grid = std::max(1, (int)std::min<long>(ceil_div(n / 4, block), (long)device_sm_count() * 8));
    adamw_kernel<<<grid, block, 0, stream>>>(params, master, grads, m, v, n, index_offset, h, norm_squared,
                                            inv_bias_correction1, inv_bias_correction2, mask);
    cudaCheckLaunch();
}
