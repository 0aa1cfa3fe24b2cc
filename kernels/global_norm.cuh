// Squared global L2 norm of the gradients, deterministic: a fixed grid writes one fp32 partial per block,
// then one block adds the partials in order. The caller takes the square root (and, under data
// parallelism, first sums the squares over ranks).
// defines: global_norm_squared, global_norm_scratch_floats
#pragma once
#include "common.cuh"

inline int global_norm_blocks() { return 2 * device_sm_count(); }
inline size_t global_norm_scratch_floats() { return global_norm_blocks(); }

// With `masked`, only the elements whose index (index_offset + i) the mask contains count.
template <typename floatX>
__global__ void norm_squared_partials_kernel(float* partials, const floatX* grads, long n, bool masked, LayoutMask mask,
                                             long index_offset) {
    __shared__ float shared[32];
    constexpr int X = Packed128<floatX>::size;
    float acc = 0.0f;
    const long vector_end = n / X * X;
    for (long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X; i < vector_end; i += (long)gridDim.x * blockDim.x * X) {
        Packed128<floatX> g = load128cs(grads + i);
        for (int k = 0; k < X; k++) {
            float v = to_float(g[k]);
            if (!masked || mask.contains(index_offset + i + k)) acc += v * v;
        }
    }
    for (long i = vector_end + (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float v = to_float(grads[i]);
        if (!masked || mask.contains(index_offset + i)) acc += v * v;
    }
    acc = block_reduce_sum(acc, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(float* out, const float* partials, int num_partials, bool accumulate) {
    __shared__ float shared[32];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) acc += partials[i];
    acc = block_reduce_sum(acc, shared);
    if (threadIdx.x == 0) *out = accumulate ? *out + acc : acc;
}

// out[0] = sum of grads[i]^2 (fp32), or out[0] += that with `accumulate` (a norm over several pieces,
// added in a fixed order). `scratch` holds global_norm_scratch_floats() floats. grads must be 16-byte aligned.
// With a mask, only element i with counted->contains(index_offset + i) counts (tensor parallelism: a replicated
// tensor is counted on one rank only).
template <typename floatX>
void global_norm_squared(float* out, const floatX* grads, long n, float* scratch, cudaStream_t stream, bool accumulate = false,
                         const LayoutMask* counted = nullptr, long index_offset = 0) {
    const int blocks = global_norm_blocks();
    norm_squared_partials_kernel<<<blocks, 512, 0, stream>>>(scratch, grads, n, counted != nullptr,
                                                             counted ? *counted : LayoutMask(), index_offset);
    cudaCheckLaunch();
    sum_partials_kernel<<<1, 1024, 0, stream>>>(out, scratch, blocks, accumulate);
    cudaCheckLaunch();
}
