// Helpers of the kernel benchmarks (bench_attention, bench_memory_bound): random device inputs and a median time.
// defines: fill_random_kernel, random_device_array, median_ms
#pragma once
#include <algorithm>
#include <vector>
#include "../kernels/common.cuh"

template <typename T> __global__ void fill_random_kernel(T* x, long n, uint64_t seed) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    // sum of 4 uniforms in [-0.5, 0.5): mean 0, variance 1/3, close enough to normal for timing
    float s = 0.0f;
    for (int k = 0; k < 4; k++) s += (float)random_u32(seed, 4 * i + k) * 2.3283064e-10f - 0.5f;
    x[i] = from_float<T>(s * 1.7f);
}

template <typename T> T* random_device_array(long n, uint64_t seed) {
    T* p;
    cudaCheck(cudaMalloc(&p, n * sizeof(T)));
    fill_random_kernel<<<ceil_div(n, 256), 256>>>(p, n, seed);
    cudaCheckLaunch();
    return p;
}

// Median milliseconds of `reps` runs of fn after `warmup` runs.
template <typename Fn> float median_ms(Fn fn, int warmup, int reps, cudaStream_t stream) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < warmup; i++) fn();
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) {
        cudaCheck(cudaEventRecord(start, stream));
        fn();
        cudaCheck(cudaEventRecord(stop, stream));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[i], start, stop));
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}
