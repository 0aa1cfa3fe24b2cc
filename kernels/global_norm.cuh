// Squared global L2 norm of the gradients, deterministic: a fixed grid writes one fp32 partial per block,
// then one block adds the partials in order. The caller takes the square root (and, under data
// parallelism, first sums the squares over ranks).
// defines: global_norm_squared, global_norm_scratch_floats, nonfinite_flag, add_to_scalar, set_scalar, sum_strided
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

// *flag = NaN when any of values[0, n) is inf or NaN, else 0. Added to the squared gradient norm it makes a
// non-finite loss skip the step by the optimizer's one finiteness test, like a non-finite gradient.
__global__ void nonfinite_flag_kernel(float* flag, const float* values, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        if (!isfinite(values[i])) *flag = __int_as_float(0x7fc00000);  // every writer stores the same NaN
}
inline void nonfinite_flag(float* flag, const float* values, long n, cudaStream_t stream) {
    cudaCheck(cudaMemsetAsync(flag, 0, sizeof(float), stream));
    nonfinite_flag_kernel<<<std::max(1, std::min(ceil_div(n, 256), 1024)), 256, 0, stream>>>(flag, values, n);
    cudaCheckLaunch();
}

__global__ void add_to_scalar_kernel(float* target, const float* term) { *target += *term; }
inline void add_to_scalar(float* target, const float* term, cudaStream_t stream) {
    add_to_scalar_kernel<<<1, 1, 0, stream>>>(target, term);
    cudaCheckLaunch();
}

// *target = value, in stream order (a host write would race the stream; a copy from pageable memory may wait for it).
__global__ void set_scalar_kernel(float* target, float value) { *target = value; }
inline void set_scalar(float* target, float value, cudaStream_t stream) {
    set_scalar_kernel<<<1, 1, 0, stream>>>(target, value);
    cudaCheckLaunch();
}

// *out = values[0] + values[stride] + ... (count terms, in order): the ranks' stop votes in the gathered losses.
__global__ void sum_strided_kernel(float* out, const float* values, int count, long stride) {
    float sum = 0.0f;
    for (int i = 0; i < count; i++) sum += values[i * stride];
    *out = sum;
}
inline void sum_strided(float* out, const float* values, int count, long stride, cudaStream_t stream) {
    sum_strided_kernel<<<1, 1, 0, stream>>>(out, values, count, stride);
    cudaCheckLaunch();
}
