// What the GPU kernel tests share: host-side conversion from float to the three storage types, device
// buffers that start poisoned (NaN) so unwritten outputs fail, and the relative-L2 comparison line.
#pragma once
#include <chrono>
#include <random>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "check.h"

template <typename T> const char* type_name();
template <> inline const char* type_name<float>() { return "fp32"; }
template <> inline const char* type_name<__nv_bfloat16>() { return "bf16"; }
template <> inline const char* type_name<__half>() { return "fp16"; }

template <typename T> T from_host_float(float x);
template <> inline float from_host_float<float>(float x) { return x; }
template <> inline __nv_bfloat16 from_host_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> inline __half from_host_float<__half>(float x) { return __float2half(x); }
// x rounded to T and back: the value a T buffer holds.
template <typename T> float host_round(float x) { return host_float(from_host_float<T>(x)); }

// A device buffer of T (freed at scope exit), poisoned (all-ones bits: NaN in every float type) when made
// and on request.
template <typename T> struct DeviceBuffer {
    T* ptr = nullptr;
    size_t n = 0;
    explicit DeviceBuffer(size_t count) : n(count) {
        cudaCheck(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)));
        poison();
    }
    explicit DeviceBuffer(const std::vector<float>& values) : DeviceBuffer(values.size()) { upload(values); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { cudaFree(ptr); }
    void poison() { cudaCheck(cudaMemset(ptr, 0xFF, n * sizeof(T))); }
    void upload(const std::vector<float>& values) {
        std::vector<T> raw(n);
        for (size_t i = 0; i < n; i++) raw[i] = from_host_float<T>(values[i]);
        cudaCheck(cudaMemcpy(ptr, raw.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<float> download() const {
        cudaCheck(cudaDeviceSynchronize());
        std::vector<T> raw(n);
        cudaCheck(cudaMemcpy(raw.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
        return host_floats(raw);
    }
};

inline void compare(const std::string& name, const std::vector<float>& got, const std::vector<float>& expected, double tol) {
    const double err = relative_l2(got.data(), expected.data(), expected.size());
    char buf[128];
    snprintf(buf, sizeof(buf), "rel L2 %.3g (tol %.3g)", err, tol);
    check(err <= tol, name, buf);
}

// A run's seed: the given one, else the clock's; printed, so a failing run can be repeated.
inline unsigned long test_seed(const char* program, const char* given) {
    const unsigned long seed = given ? strtoul(given, nullptr, 10)
                                     : (unsigned long)std::chrono::steady_clock::now().time_since_epoch().count();
    printf("%s: seed %lu\n", program, seed);
    return seed;
}
// False (and a SKIP line for `what`) on a machine without a GPU.
inline bool gpu_present(const std::string& what) {
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0) return true;
    skip(what, "no GPU");
    return false;
}
