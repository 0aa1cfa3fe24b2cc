// Parameter initialisation and precision conversion on the device.
// defines: fill_normal, fill_uniform, fill_constant, CopyRun, copy_runs, convert_precision
#pragma once
#include "common.cuh"

// out[i] = std * N(0,1), drawn from (seed, first + i) by Box-Muller: the same values whatever the launch shape, and
// whatever pieces a tensor is drawn in (first: the piece's first index in the tensor).
__global__ void fill_normal_kernel(float* out, long n, float std, uint64_t seed, long first) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        uint64_t r = splitmix64(seed ^ splitmix64((uint64_t)(first + i)));
        float u1 = ((uint32_t)(r >> 40) + 1.0f) / 16777217.0f;  // (0, 1]: log is finite
        float u2 = (uint32_t)(r & 0xFFFFFF) / 16777216.0f;
        out[i] = std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    }
}
inline void fill_normal(float* out, long n, float std, uint64_t seed, cudaStream_t stream, long first = 0) {
    if (n <= 0) return;
    fill_normal_kernel<<<std::min<long>(ceil_div(n, 256), 65535), 256, 0, stream>>>(out, n, std, seed, first);
    cudaCheckLaunch();
}

// out[i] = U(-bound, bound), drawn from (seed, i).
__global__ void fill_uniform_kernel(float* out, long n, float bound, uint64_t seed) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float u = (uint32_t)(splitmix64(seed ^ splitmix64((uint64_t)i)) >> 40) / 16777216.0f;  // [0, 1)
        out[i] = bound * (2.0f * u - 1.0f);
    }
}
inline void fill_uniform(float* out, long n, float bound, uint64_t seed, cudaStream_t stream) {
    fill_uniform_kernel<<<std::min<long>(ceil_div(n, 256), 65535), 256, 0, stream>>>(out, n, bound, seed);
    cudaCheckLaunch();
}

__global__ void fill_constant_kernel(float* out, long n, float value) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) out[i] = value;
}
inline void fill_constant(float* out, long n, float value, cudaStream_t stream) {
    if (n <= 0) return;
    fill_constant_kernel<<<std::min<long>(ceil_div(n, 256), 65535), 256, 0, stream>>>(out, n, value);
    cudaCheckLaunch();
}

// A contiguous piece of one array copied to another: dst[to + i] = src[from + i] for i < count.
struct CopyRun { size_t from, to, count; };
// All `n` runs (on the device) in one launch, a block per run: a tensor-parallel slice of a unit is thousands of
// short runs (a row-parallel weight: one per output row), too many for a copy call each.
__global__ void copy_runs_kernel(float* dst, const float* src, const CopyRun* runs, int n) {
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const CopyRun run = runs[r];
        for (size_t i = threadIdx.x; i < run.count; i += blockDim.x) dst[run.to + i] = src[run.from + i];
    }
}
inline void copy_runs(float* dst, const float* src, const CopyRun* runs, int n, cudaStream_t stream) {
    if (n == 0) return;
    copy_runs_kernel<<<std::min(n, 65535), 256, 0, stream>>>(dst, src, runs, n);
    cudaCheckLaunch();
}

// Round-to-nearest conversion between storage precisions (float <-> floatX).
template <typename To, typename From>
__global__ void convert_precision_kernel(To* out, const From* inp, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        out[i] = from_float<To>(to_float(inp[i]));
}
template <typename To, typename From>
void convert_precision(To* out, const From* inp, long n, cudaStream_t stream) {
    convert_precision_kernel<<<std::min<long>(ceil_div(n, 256), 65535), 256, 0, stream>>>(out, inp, n);
    cudaCheckLaunch();
}
