// Shared by every kernel file: error checks, the three compute precisions (float, bf16, fp16),
// 128-bit packed loads/stores, warp/block reductions, layout masks (host_device.h), a fast exp2, stochastic rounding, the
// sm_90 mbarrier and bulk-copy wrappers, and the check of the GPU (gpu_support.h) with its MFU peak.
// It holds no layer logic.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <type_traits>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <string>
#include "die.h"
#include "gpu_support.h"
#include "host_device.h"

// ---------------------------------------------------------------------------------------------
// Error checking: every CUDA / cuBLAS call and every launch goes through one of these.
inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        die(std::string("CUDA: ") + cudaGetErrorString(err) + " at " + file + ":" + std::to_string(line));
    }
}
#define cudaCheck(err) (cuda_check((err), __FILE__, __LINE__))
// After a kernel launch: catches bad launch configurations at the launch site.
#define cudaCheckLaunch() (cuda_check(cudaGetLastError(), __FILE__, __LINE__))

inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        die(std::string("cuBLAS: ") + cublasGetStatusString(status) + " (" + std::to_string((int)status) + ") at " + file + ":" + std::to_string(line));
    }
}
#define cublasCheck(status) (cublas_check((status), __FILE__, __LINE__))

inline int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }
// The median of a list of timings (a copy: nth_element reorders it); 0 when empty.
inline double median_of(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
}

// ---------------------------------------------------------------------------------------------
// Precision: every kernel is a template over the storage type of parameters, activations and
// gradients (floatX). Arithmetic, statistics and optimizer state stay fp32.
enum class Precision { FP32, BF16, FP16 };

template <typename T> struct PrecisionOf;
template <> struct PrecisionOf<float> { static constexpr Precision value = Precision::FP32; };
template <> struct PrecisionOf<__nv_bfloat16> { static constexpr Precision value = Precision::BF16; };
template <> struct PrecisionOf<__half> { static constexpr Precision value = Precision::FP16; };

template <typename T> inline cudaDataType_t cuda_data_type();
template <> inline cudaDataType_t cuda_data_type<float>() { return CUDA_R_32F; }
template <> inline cudaDataType_t cuda_data_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> inline cudaDataType_t cuda_data_type<__half>() { return CUDA_R_16F; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// Host side: values read back from the device, as float.
inline float host_float(float x) { return x; }
inline float host_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float host_float(__half x) { return __half2float(x); }
template <typename T> std::vector<float> host_floats(const std::vector<T>& raw) {
    std::vector<float> out(raw.size());
    for (size_t i = 0; i < raw.size(); i++) out[i] = host_float(raw[i]);
    return out;
}
// A device buffer of `count` elements copied to fp32 on the host.
template <typename T> std::vector<float> device_to_host_floats(const T* device, size_t count) {
    std::vector<T> raw(count);
    cudaCheck(cudaMemcpy(raw.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host_floats(raw);
}

// ---------------------------------------------------------------------------------------------
// 128-bit packed vectors: memory-bound kernels move 16 bytes per thread per access.
template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T payload[size];
    __device__ __forceinline__ T& operator[](int i) { return payload[i]; }
    __device__ __forceinline__ const T& operator[](int i) const { return payload[i]; }
    __device__ static Packed128 zeros() {
        Packed128 p;
        for (int i = 0; i < size; i++) p.payload[i] = from_float<T>(0.0f);
        return p;
    }
};
template <typename T> __device__ __forceinline__ Packed128<T> load128(const T* address) {
    return *reinterpret_cast<const Packed128<T>*>(address);
}
// Streaming load: data read once, don't keep it in L1/L2 at the expense of reused data.
template <typename T> __device__ __forceinline__ Packed128<T> load128cs(const T* address) {
    Packed128<T> p;
    *reinterpret_cast<int4*>(&p) = __ldcs(reinterpret_cast<const int4*>(address));
    return p;
}
template <typename T> __device__ __forceinline__ void store128(T* address, Packed128<T> value) {
    *reinterpret_cast<Packed128<T>*>(address) = value;
}
template <typename T> __device__ __forceinline__ void store128cs(T* address, Packed128<T> value) {
    __stcs(reinterpret_cast<int4*>(address), *reinterpret_cast<int4*>(&value));
}

// ---------------------------------------------------------------------------------------------
// Reductions
__device__ __forceinline__ float warp_reduce_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}
__device__ __forceinline__ float warp_reduce_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}
// Sum over the whole block, result broadcast to every thread. Fixed order: deterministic.
// `shared` must hold 32 floats; the block size must be a multiple of 32.
__device__ __forceinline__ float block_reduce_sum(float v, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    v = warp_reduce_sum(v);
    __syncthreads();  // `shared` may still be read by a previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < num_warps ? shared[lane] : 0.0f;
    return warp_reduce_sum(v);
}
__device__ __forceinline__ float block_reduce_max(float v, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    v = warp_reduce_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < num_warps ? shared[lane] : -INFINITY;
    return warp_reduce_max(v);
}

// ---------------------------------------------------------------------------------------------
// The layout masks (LayoutMask) and splitmix64 are in host_device.h, shared with host code.
__device__ __forceinline__ uint32_t random_u32(uint64_t seed, uint64_t index) {
    return (uint32_t)(splitmix64(seed ^ splitmix64(index)) >> 32);
}

// exp2 on the special-function unit (flush-to-zero), for softmax-style exponentials: the attention kernels and
// the single-pass classifier. exp2(-inf) = 0, which the attention's masking relies on.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Stochastic rounding float -> bf16: adding random low bits before truncation rounds up with
// probability equal to the discarded fraction, so tiny AdamW updates are not systematically lost.
template <typename T> __device__ __forceinline__ T round_stochastic(float x, uint32_t random);
template <> __device__ __forceinline__ float round_stochastic<float>(float x, uint32_t) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 round_stochastic<__nv_bfloat16>(float x, uint32_t random) {
    if (!isfinite(x)) return __float2bfloat16_rn(x);
    uint32_t bits = __float_as_uint(x);
    bits = (bits + (random & 0xFFFFu)) & 0xFFFF0000u;
    return __float2bfloat16_rz(__uint_as_float(bits));
}
// fp16 keeps round-to-nearest: its 10-bit mantissa loses far less than bf16's 7 bits, and fp16
// parameters are always paired with fp32 master weights.
template <> __device__ __forceinline__ __half round_stochastic<__half>(float x, uint32_t) { return __float2half_rn(x); }

// ---------------------------------------------------------------------------------------------
// *p += v for two adjacent fp32 values: one vector atomic from sm_90 on, two scalar ones before (the float2
// overload of atomicAdd exists only from sm_90). Either way each element is added atomically.
__device__ __forceinline__ void atomic_add_float2(float2* p, float2 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(p, v);
#else
    atomicAdd(&p->x, v.x);
    atomicAdd(&p->y, v.y);
#endif
}

// ---------------------------------------------------------------------------------------------
// mbarriers and 1-D bulk async copies (sm_90 and later): the Hopper attention and the single-pass classifier.
// A `full` barrier counts one arrival (the issuing thread's expect_tx) plus the copy's bytes; a phase's parity
// alternates 0, 1, 0, ...; a wait on the parity of the phase before the first (1 on a fresh barrier) returns at once.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// After a thread's mbar_init calls: the barriers are visible to the async proxy (TMA and bulk copies).
__device__ __forceinline__ void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of `bar` with this parity has completed. kCluster: a barrier that another CTA of the
// cluster completes (st.async), acquired at cluster scope so that the data it delivered is visible.
#define MBAR_WAIT_LOOP(SEMANTICS)                                                 \
    "{\n"                                                                       \
    ".reg .pred done;\n"                                                        \
    "LAB_WAIT:\n"                                                               \
    "mbarrier.try_wait.parity" SEMANTICS ".shared::cta.b64 done, [%0], %1;\n"   \
    "@!done bra LAB_WAIT;\n"                                                    \
    "}\n"
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    if constexpr (kCluster) asm volatile(MBAR_WAIT_LOOP(".acquire.cluster")::"r"(bar), "r"(parity) : "memory");
    else asm volatile(MBAR_WAIT_LOOP("")::"r"(bar), "r"(parity) : "memory");
}
#undef MBAR_WAIT_LOOP
// 1-D bulk copy global -> shared completing `bar`'s transaction bytes (16-byte aligned, a multiple of 16 bytes).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
                 : "memory");
}
// Orders this thread's generic-proxy accesses to shared memory before later async-proxy accesses to it.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#endif

// ---------------------------------------------------------------------------------------------
// Deterministic column sums: kernels that reduce over rows (bias and LayerNorm weight gradients) write
// one fp32 partial row per block; this adds the partial rows into `out` (+=) in a fixed order. A block takes 32
// columns; its kPartialsRowThreads rows of threads each add every kPartialsRowThreads-th partial row, then
// combine in row order: with one thread per column, LayerNorm's 528 partial rows were one long chain of
// dependent loads per thread (about 7 us a call on an H200, 73 calls a step).
constexpr int kPartialsRowThreads = 16;
// The block's fixed-order sum of column i (< width; other columns add nothing) over the partial rows, for a block
// of (32, kRowThreads) threads: threadIdx.y takes every kRowThreads-th row, four rows' loads in flight, added in
// row order; the rows of threads are then added to `start` in order. The result is valid in the threads with
// threadIdx.y == 0; every thread of the block must call it (it synchronises).
template <int kRowThreads>
__device__ __forceinline__ float partial_rows_sum(const float* partials, int num_partials, int width, int i, float start) {
    __shared__ float shared[kRowThreads][32];
    float acc = 0.0f;
    if (i < width) {
        int p = threadIdx.y;
        for (; p + 3 * kRowThreads < num_partials; p += 4 * kRowThreads) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = partials[(long)(p + u * kRowThreads) * width + i];
#pragma unroll
            for (int u = 0; u < 4; u++) acc += v[u];
        }
        for (; p < num_partials; p += kRowThreads) acc += partials[(long)p * width + i];
    }
    shared[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0)
        for (int y = 0; y < kRowThreads; y++) start += shared[y][threadIdx.x];
    return start;
}
template <typename floatX>
__global__ void partials_accumulate_kernel(floatX* out, const float* partials, int num_partials, int width) {
    const int i = blockIdx.x * 32 + threadIdx.x;
    const float start = threadIdx.y == 0 && i < width ? to_float(out[i]) : 0.0f;
    const float total = partial_rows_sum<kPartialsRowThreads>(partials, num_partials, width, i, start);
    if (threadIdx.y == 0 && i < width) out[i] = from_float<floatX>(total);
}
template <typename floatX>
void partials_accumulate(floatX* out, const float* partials, int num_partials, int width, cudaStream_t stream) {
    partials_accumulate_kernel<<<ceil_div(width, 32), dim3(32, kPartialsRowThreads), 0, stream>>>(out, partials,
                                                                                                  num_partials, width);
    cudaCheckLaunch();
}

// Refuses, with one line, a GPU that train_gpt cannot run on (below compute capability 8.0, gpu_support.h). It
// reads the device's properties only: no context is created and nothing is allocated.
inline void require_supported_gpu(int device) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    const std::string problem = gpu_support_problem(prop.name, prop.major, prop.minor);
    if (!problem.empty()) die(problem);
}

// The current device's name, its dense bf16 peak for MFU (0: not in gpu_support.h's table) and whether this binary
// holds code it can run: one built for other GPUs (say sm_90a only, on an A100) is refused with one line here
// instead of failing at its first kernel.
struct GpuInfo {
    std::string name;
    double peak_tflops = 0;
};
__global__ void gpu_code_probe_kernel() {}
inline GpuInfo current_gpu() {
    int device;
    cudaCheck(cudaGetDevice(&device));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    const std::string capability = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    cudaFuncAttributes attributes;
    if (cudaFuncGetAttributes(&attributes, gpu_code_probe_kernel) != cudaSuccess) {
        cudaGetLastError();
        const std::string sm = std::to_string(prop.major) + std::to_string(prop.minor) + (prop.major == 9 ? "a" : "");  // Hopper: wgmma, TMA
        die(std::string("this binary holds no code for ") + prop.name + " (compute capability " + capability +
            "): rebuild on this machine (make clean && make), or with GPU_ARCH=\"-gencode arch=compute_" + sm + ",code=sm_" + sm + "\"");
    }
    return GpuInfo{prop.name, dense_bf16_peak_tflops(prop.name)};
}

// Multiprocessor count of the current device, read once: grid sizes of persistent-style kernels.
inline int device_sm_count() {
    static int count = 0;
    if (count == 0) {
        int device;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    }
    return count;
}

// dst[i] += src[i] (elementwise, any length): a reduce-scattered gradient added into its shard, a LoRA
// input gradient added into the base path's.
template <typename floatX>
__global__ void accumulate_into_kernel(floatX* dst, const floatX* src, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = from_float<floatX>(to_float(dst[i]) + to_float(src[i]));
}
template <typename floatX>
void accumulate_into(floatX* dst, const floatX* src, long n, cudaStream_t stream) {
    accumulate_into_kernel<<<std::max(1, std::min(ceil_div(n, 256), 1024)), 256, 0, stream>>>(dst, src, n);
    cudaCheckLaunch();
}
