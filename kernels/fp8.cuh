// FP8 (E4M3, E5M2) on the GPU: a bf16 tensor's amax, the per-tensor scales from the amaxes (delayed scaling), and
// the cast bf16 -> FP8 with the scale, fused with the amax of its input and optionally writing the transposed copy
// that the backward products need (cuBLASLt's FP8 products read both operands with the reduction dimension
// contiguous: matmul_fp8, matmul.cuh). The formats, the scale rule and the host reference of the rounding are plain
// C++ in fp8_formats.h. The cast kernels hold code for compute capability 8.9 and newer only (FP8 conversions in
// hardware); on older GPUs the host functions refuse in one line before launching anything.
// defines: Fp8Traits, fp8_gpu_problem, require_fp8_gpu, fp8_amax, fp8_update_scales, fp8_scale_from_current,
//          fp8_update_scales_from_history, fp8_cast (fp8_cast_kernel, fp8_cast_transpose_kernel), Fp8CastInput, and
//          for the kernels that cast what they produce (fp8_fused.cuh): cast8, block_amax_into
#pragma once
#include <cuda_fp8.h>
#include "common.cuh"
#include "fp8_formats.h"  // defines: Fp8Format, Fp8Scaling, fp8_update_scaling, fp8_cast_shape_problem

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define FP8_DEVICE_CODE 1
#else
#define FP8_DEVICE_CODE 0
#endif

template <typename fp8> struct Fp8Traits;
template <> struct Fp8Traits<__nv_fp8_e4m3> {
    static constexpr Fp8Format format = Fp8Format::E4M3;
    static constexpr __nv_fp8_interpretation_t interpretation = __NV_E4M3;
};
template <> struct Fp8Traits<__nv_fp8_e5m2> {
    static constexpr Fp8Format format = Fp8Format::E5M2;
    static constexpr __nv_fp8_interpretation_t interpretation = __NV_E5M2;
};
template <> inline cudaDataType_t cuda_data_type<__nv_fp8_e4m3>() { return CUDA_R_8F_E4M3; }
template <> inline cudaDataType_t cuda_data_type<__nv_fp8_e5m2>() { return CUDA_R_8F_E5M2; }

// ---------------------------------------------------------------------------------------------
// amax. |x| of a bf16 as its bit pattern orders as the magnitudes do, with infinity above every finite value and
// NaN above infinity: an integer max keeps a NaN or an inf (fmaxf would drop a NaN), and the amax float that it
// writes is NaN or inf then, for fp8_update_scales to see.
__device__ __forceinline__ uint32_t bf16_magnitude_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x) & 0x7FFFu; }

// Max of the block's `magnitude` values (bf16 magnitude bits) into *amax, one atomic per block: the amax float's
// bits, non-negative, order as unsigned integers do; with `overflow`, the sum of the block's `saturated` counts added
// to it (one atomic, only when not zero). `shared` holds 64 values; the block size is a multiple of 32.
__device__ __forceinline__ void block_amax_into(float* amax, uint32_t magnitude, uint32_t* shared, unsigned long long* overflow = nullptr,
                                                uint32_t saturated = 0) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    magnitude = __reduce_max_sync(0xffffffffu, magnitude);
    saturated = __reduce_add_sync(0xffffffffu, saturated);
    if (lane == 0) {
        shared[warp] = magnitude;
        shared[32 + warp] = saturated;
    }
    __syncthreads();
    if (warp != 0) return;
    magnitude = __reduce_max_sync(0xffffffffu, lane < num_warps ? shared[lane] : 0u);
    saturated = __reduce_add_sync(0xffffffffu, lane < num_warps ? shared[32 + lane] : 0u);
    if (lane == 0 && magnitude != 0) atomicMax(reinterpret_cast<unsigned int*>(amax), magnitude << 16);
    if (lane == 0 && overflow != nullptr && saturated != 0) atomicAdd(overflow, (unsigned long long)saturated);
}

constexpr int kFp8Threads = 256;
// Grid-stride kernels take up to this many blocks a multiprocessor: the whole GPU busy, one atomic a block.
constexpr int kFp8BlocksPerSM = 8;

// *amax = max(*amax, max |x|) over n values (16-byte aligned); the caller clears *amax where a new max is meant.
__global__ void __launch_bounds__(kFp8Threads) fp8_amax_kernel(float* amax, const __nv_bfloat16* x, long n) {
    __shared__ uint32_t shared[64];
    constexpr int X = Packed128<__nv_bfloat16>::size;
    const long thread = (long)blockIdx.x * blockDim.x + threadIdx.x, threads = (long)gridDim.x * blockDim.x;
    uint32_t magnitude = 0;
    const long vectors = n / X;
    for (long v = thread; v < vectors; v += threads) {
        const Packed128<__nv_bfloat16> p = load128cs(x + v * X);
        for (int i = 0; i < X; i++) magnitude = max(magnitude, bf16_magnitude_bits(p[i]));
    }
    if (thread < n - vectors * X) magnitude = max(magnitude, bf16_magnitude_bits(x[vectors * X + thread]));
    block_amax_into(amax, magnitude, shared);
}

// Blocks for a grid-stride kernel over `items` pieces of one thread's work: a thread each, up to kFp8BlocksPerSM
// blocks a multiprocessor.
inline int fp8_grid_blocks(long items) {
    return (int)std::max(1L, std::min((long)ceil_div(items, kFp8Threads), (long)kFp8BlocksPerSM * device_sm_count()));
}

// Adds max |x| over x[0, n) into *amax (a float in device memory, e.g. an Fp8Scaling's amax). Runs on any GPU.
inline void fp8_amax(float* amax, const __nv_bfloat16* x, long n, cudaStream_t stream) {
    if ((uintptr_t)x % 16 != 0) die("fp8_amax: the input must be 16-byte aligned");
    if (n <= 0) return;
    fp8_amax_kernel<<<fp8_grid_blocks(n / Packed128<__nv_bfloat16>::size + 1), kFp8Threads, 0, stream>>>(amax, x, n);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// Scales: fp8_update_scaling (fp8_formats.h) on each of `count` tensors' states, all of one format.
__global__ void fp8_update_scales_kernel(Fp8Scaling* scalings, int count, Fp8Format format, int margin) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    Fp8Scaling s = scalings[i];
    fp8_update_scaling(s, format, margin);
    scalings[i] = s;
}
inline void fp8_update_scales(Fp8Scaling* scalings, int count, Fp8Format format, int margin, cudaStream_t stream) {
    if (count <= 0) return;
    fp8_update_scales_kernel<<<ceil_div(count, kFp8Threads), kFp8Threads, 0, stream>>>(scalings, count, format, margin);
    cudaCheckLaunch();
}

// Current scaling: the scale of each of `count` tensors' states (one format) from its current_amax (fp8_amax's, just
// before), which is cleared for the next; the states' amax, the casts' record, is left as it is.
__global__ void fp8_scale_from_current_kernel(Fp8Scaling* scalings, int count, Fp8Format format) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    Fp8Scaling s = scalings[i];
    fp8_set_scale(s, s.current_amax, format, 0);
    s.current_amax = 0.0f;
    scalings[i] = s;
}
inline void fp8_scale_from_current(Fp8Scaling* scalings, int count, Fp8Format format, cudaStream_t stream) {
    if (count <= 0) return;
    fp8_scale_from_current_kernel<<<ceil_div(count, kFp8Threads), kFp8Threads, 0, stream>>>(scalings, count, format);
    cudaCheckLaunch();
}

// Delayed scaling: fp8_update_scaling_from_history on each of `count` tensors' states, tensor i's `length` past amaxes
// at history[i * length], this interval's going into slot `slot`. The tensors come in groups of `group` states, the
// one at `e5m2_index` of each E5M2 and the others E4M3 (-1: all E4M3): one launch for a model's weights, inputs and
// output gradients.
__global__ void fp8_update_scales_from_history_kernel(Fp8Scaling* scalings, float* history, int count, int length, int slot, int group,
                                                      int e5m2_index, int margin) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    Fp8Scaling s = scalings[i];
    const Fp8Format format = i % group == e5m2_index ? Fp8Format::E5M2 : Fp8Format::E4M3;
    fp8_update_scaling_from_history(s, history + (size_t)i * length, length, slot, format, margin);
    scalings[i] = s;
}
inline void fp8_update_scales_from_history(Fp8Scaling* scalings, float* history, int count, int length, int slot, int group, int e5m2_index,
                                           int margin, cudaStream_t stream) {
    if (count <= 0) return;
    if (length < 1 || slot < 0 || slot >= length || group < 1) die("internal: FP8 amax history of length " + std::to_string(length) + ", slot " + std::to_string(slot));
    fp8_update_scales_from_history_kernel<<<ceil_div(count, kFp8Threads), kFp8Threads, 0, stream>>>(scalings, history, count, length, slot,
                                                                                                   group, e5m2_index, margin);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// The cast. Each thread takes 16 consecutive values (two 16-byte loads) and writes their 16 codes (one 16-byte
// store); x * scale is rounded to fp32 first, then to FP8 with saturation (cvt.rn.satfinite), as fp8_round does on
// the host. The kernels that produce a tensor and cast it on the way (fp8_fused.cuh) share cast8 and the transform
// below, so that their codes, amax and saturated counts are those of this cast of the tensor they would have stored.
#if FP8_DEVICE_CODE
template <typename fp8>
__device__ __forceinline__ uint32_t fp8x4(float a, float b, float c, float d) {
    constexpr __nv_fp8_interpretation_t kind = Fp8Traits<fp8>::interpretation;
    const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
    const uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kind);
    return low | (high << 16);
}
// The 8 codes of 8 bf16 values; their magnitudes into `magnitude` (max) and the saturated ones into `saturated`.
template <typename fp8>
__device__ __forceinline__ uint2 cast8(const Packed128<__nv_bfloat16>& p, float scale, uint32_t& magnitude, uint32_t& saturated) {
    float f[8];
    for (int i = 0; i < 8; i++) {
        magnitude = max(magnitude, bf16_magnitude_bits(p[i]));
        f[i] = __fmul_rn(__bfloat162float(p[i]), scale);  // never contracted into anything else
        saturated += fp8_saturates(fabsf(f[i]), Fp8Traits<fp8>::format);
    }
    return make_uint2(fp8x4<fp8>(f[0], f[1], f[2], f[3]), fp8x4<fp8>(f[4], f[5], f[6], f[7]));
}
#endif

// What the cast kernels cast: the input itself (fp8_cast), or a function of it that they compute on the way, in the
// bf16 values its own kernel would store (the GELU: fp8_fused.cuh's fp8_gelu_cast).
struct Fp8CastInput {
    __device__ Packed128<__nv_bfloat16> operator()(const Packed128<__nv_bfloat16>& x) const { return x; }
};

#if FP8_DEVICE_CODE
template <typename fp8, typename Transform>
__device__ __forceinline__ uint4 cast16(const __nv_bfloat16* in, float scale, uint32_t& magnitude, uint32_t& saturated) {
    const Transform transform{};
    const Packed128<__nv_bfloat16> p[2] = {load128cs(in), load128cs(in + 8)};  // both loads in flight at once
    const uint2 low = cast8<fp8>(transform(p[0]), scale, magnitude, saturated);
    const uint2 high = cast8<fp8>(transform(p[1]), scale, magnitude, saturated);
    return make_uint4(low.x, low.y, high.x, high.y);
}
#endif

// out[i] = fp8(transform(in)[i] * scale) over n values (a multiple of 16), and scaling->amax = max(amax, max
// |transform(in)|).
template <typename fp8, typename Transform = Fp8CastInput>
__global__ void __launch_bounds__(kFp8Threads) fp8_cast_kernel(fp8* out, const __nv_bfloat16* in, long n, Fp8Scaling* scaling) {
#if FP8_DEVICE_CODE
    __shared__ uint32_t shared[64];
    const float scale = scaling->scale;
    uint32_t magnitude = 0, saturated = 0;
    for (long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 16; i < n; i += (long)gridDim.x * blockDim.x * 16) {
        *reinterpret_cast<uint4*>(out + i) = cast16<fp8, Transform>(in + i, scale, magnitude, saturated);
    }
    block_amax_into(&scaling->amax, magnitude, shared, &scaling->overflow, saturated);
#endif
}

// The same cast of a row-major [rows, cols] tensor, writing also (or only, when out is null) the transposed copy
// out_t[cols, rows]. A block takes a tile of 64 rows x 128 columns: first 8 threads a row, 16 columns each, cast
// and store row-major and into a shared tile of codes; then a thread a column and 32 rows, 32 codes read down the
// tile's column (a warp reads 32 adjacent bytes of a row at a time: no bank conflicts) and stored as two 16-byte
// vectors: each thread writes one whole 32-byte sector of out_t. rows and cols: multiples of 16.
constexpr int kCastTileRows = 64, kCastTileCols = 128;
static_assert(kCastTileCols * 2 == kFp8Threads && kCastTileRows == 64, "the transposed pass takes a column and 32 rows a thread");
template <typename fp8, typename Transform = Fp8CastInput>
__global__ void __launch_bounds__(kFp8Threads) fp8_cast_transpose_kernel(fp8* out, fp8* out_t, const __nv_bfloat16* in, long rows,
                                                                         long cols, Fp8Scaling* scaling) {
#if FP8_DEVICE_CODE
    __shared__ alignas(16) uint8_t tile[kCastTileRows][kCastTileCols];
    __shared__ uint32_t shared[64];
    const float scale = scaling->scale;
    const long row0 = (long)blockIdx.x * kCastTileRows, col0 = (long)blockIdx.y * kCastTileCols;
    uint32_t magnitude = 0, saturated = 0;
    constexpr int kThreadsPerRow = kCastTileCols / 16;
    const int chunk = threadIdx.x % kThreadsPerRow;
    const long col = col0 + chunk * 16;
    for (int r = threadIdx.x / kThreadsPerRow; r < kCastTileRows; r += kFp8Threads / kThreadsPerRow) {
        const long row = row0 + r;
        if (row >= rows || col >= cols) continue;
        const uint4 codes = cast16<fp8, Transform>(in + row * cols + col, scale, magnitude, saturated);
        if (out != nullptr) *reinterpret_cast<uint4*>(out + row * cols + col) = codes;
        *reinterpret_cast<uint4*>(&tile[r][chunk * 16]) = codes;
    }
    __syncthreads();
    const int c = threadIdx.x % kCastTileCols, half = threadIdx.x / kCastTileCols;
    if (col0 + c < cols) {
        uint32_t words[8];
#pragma unroll
        for (int w = 0; w < 8; w++) {
            const int r = half * 32 + 4 * w;
            words[w] = (uint32_t)tile[r][c] | ((uint32_t)tile[r + 1][c] << 8) | ((uint32_t)tile[r + 2][c] << 16) |
                       ((uint32_t)tile[r + 3][c] << 24);
        }
        // rows is a multiple of 16: each 16-row half lies wholly inside or wholly outside the tensor
        for (int q = 0; q < 2; q++) {
            const long row = row0 + half * 32 + q * 16;
            if (row < rows)
                *reinterpret_cast<uint4*>(out_t + (col0 + c) * rows + row) =
                    make_uint4(words[4 * q], words[4 * q + 1], words[4 * q + 2], words[4 * q + 3]);
        }
    }
    block_amax_into(&scaling->amax, magnitude, shared, &scaling->overflow, saturated);
#endif
}

// "" when the current GPU runs this binary's FP8 code, else the one-line reason: a GPU below compute capability 8.9
// (gpu_support.h's fp8_support_problem), or a binary whose code for this GPU was built from PTX below 8.9 (`make
// test-portable`'s compute_80 PTX: the casts' bodies are empty there). Checked once per device.
inline std::string fp8_gpu_problem() {
    constexpr int kMaxDevices = 64;
    static std::string problems[kMaxDevices];
    static bool checked[kMaxDevices] = {};
    int device;
    cudaCheck(cudaGetDevice(&device));
    if (device < kMaxDevices && checked[device]) return problems[device];
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    std::string problem = fp8_support_problem(prop.name, prop.major, prop.minor);
    cudaFuncAttributes attributes;
    if (problem.empty() && cudaFuncGetAttributes(&attributes, fp8_cast_kernel<__nv_fp8_e4m3>) == cudaSuccess &&
        attributes.ptxVersion < 10 * kMinFp8ComputeMajor + kMinFp8ComputeMinor) {
        problem = std::string("this binary's code for ") + prop.name + " was built for compute capability " +
                  std::to_string(attributes.ptxVersion / 10) + "." + std::to_string(attributes.ptxVersion % 10) +
                  ", without FP8: rebuild with GPU_ARCH=\"-gencode arch=compute_" + std::to_string(prop.major) +
                  std::to_string(prop.minor) + (prop.major == 9 ? "a" : "") + ",code=sm_" + std::to_string(prop.major) +
                  std::to_string(prop.minor) + (prop.major == 9 ? "a" : "") + "\"";
    }
    (void)cudaGetLastError();  // a binary without code for this GPU at all: current_gpu() (common.cuh) says so
    if (device < kMaxDevices) {
        problems[device] = problem;
        checked[device] = true;
    }
    return problem;
}
inline void require_fp8_gpu() {
    const std::string problem = fp8_gpu_problem();
    if (!problem.empty()) die(problem);
}

// Casts the row-major bf16 [rows, cols] tensor `in` to FP8 (fp8: __nv_fp8_e4m3 or __nv_fp8_e5m2) with
// scaling->scale: out[rows, cols] (may be null when out_transposed is not) and, unless null, out_transposed[cols,
// rows]; adds max |in| into scaling->amax (delayed scaling: the next update makes the scale from it) and the count of
// values it saturated (fp8_saturates) into scaling->overflow. With a Transform (fp8_fused.cuh), the values cast are
// transform(in) instead.
// cols must be a multiple of 16, rows too with the transposed copy; the buffers 16-byte aligned.
template <typename fp8, typename Transform = Fp8CastInput>
void fp8_cast(fp8* out, fp8* out_transposed, const __nv_bfloat16* in, long rows, long cols, Fp8Scaling* scaling, cudaStream_t stream) {
    const std::string shape = fp8_cast_shape_problem(rows, cols, out_transposed != nullptr);
    if (!shape.empty()) die(shape);
    if ((uintptr_t)in % 16 != 0 || (uintptr_t)out % 16 != 0 || (uintptr_t)out_transposed % 16 != 0)
        die("FP8 cast: the input and output buffers must be 16-byte aligned");
    if (out == nullptr && out_transposed == nullptr) die("FP8 cast: no output given");
    require_fp8_gpu();
    if (out_transposed == nullptr) {
        const long n = rows * cols;
        fp8_cast_kernel<fp8, Transform><<<fp8_grid_blocks(n / 16), kFp8Threads, 0, stream>>>(out, in, n, scaling);
    } else {
        if (ceil_div(cols, kCastTileCols) > 65535) die("FP8 cast: rows of " + std::to_string(cols) + " values are too wide for the transposing cast");
        const dim3 grid(ceil_div(rows, kCastTileRows), ceil_div(cols, kCastTileCols));
        fp8_cast_transpose_kernel<fp8, Transform><<<grid, kFp8Threads, 0, stream>>>(out, out_transposed, in, rows, cols, scaling);
    }
    cudaCheckLaunch();
}
