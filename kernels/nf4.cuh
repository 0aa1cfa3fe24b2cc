// QLoRA's NF4 weights on the GPU (docs/formats.md "QLoRA's NF4 format"): an Nf4Weight of model/nf4.h uploaded to the
// device, and dequantized there into a bf16 or fp32 matrix bitwise equal to dequantize_nf4_bf16 / dequantize_nf4
// (test/test_nf4_gpu.cu). The arithmetic is nf4.h's, each operation rounded on its own as the host rounds it:
//   single:  w' = NF4[code] * absmax[b]
//   double:  w' = NF4[code] * (DYNAMIC[code8[b]] * nested[b / 256] + offset)   (product, sum and product rounded apart)
// __fmul_rn / __fadd_rn keep nvcc from fusing them into a multiply-add, which the host code never does.
// Quantization on the device (quantize_nf4_device), bitwise nf4.h's quantize_nf4: the 4-bit codes and block absmaxes
// by a kernel with the host's arithmetic (max |w|, a rounded reciprocal, a rounded product, the same 15 thresholds);
// the double quantization of the absmaxes (1/64 of the weights) on the host by nf4.h's own nf4_double_quantize, so its
// float64 mean sums in the host's order.
// defines: Nf4Tables, nf4_tables, Nf4DeviceWeight, upload_nf4, allocate_nf4, free_nf4, download_nf4, nf4_double_quant_absmax,
//          dequantize_nf4_kernel, dequantize_nf4_device, Nf4QuantizeScratch, quantize_nf4_kernel, quantize_nf4_device
#pragma once
#include <cstring>
#include "common.cuh"
#include "../model/nf4.h"  // Nf4Weight, kNf4Values, dynamic_map, nf4_layout_problem, nf4_bytes

// The two lookup tables, passed by value as a kernel argument (1088 bytes) and copied into shared memory by each
// block: a warp's lookups then hit distinct banks (NF4's 16 entries) instead of serialising on constant memory.
struct Nf4Tables {
    float nf4[16];
    float dynamic[256];
};
inline const Nf4Tables& nf4_tables() {
    static const Nf4Tables tables = [] {
        Nf4Tables t;
        memcpy(t.nf4, kNf4Values.data(), sizeof t.nf4);
        memcpy(t.dynamic, dynamic_map().data(), sizeof t.dynamic);
        return t;
    }();
    return tables;
}

// The codes are stored padded to a whole number of 16-byte vectors (zero codes past the last weight), so every
// load of them is one aligned vector; the pad is never dequantized.
constexpr size_t kNf4CodeVectorBytes = 16;

// An NF4 weight in device memory: the arrays of Nf4Weight (single quantization: absmax; double: absmax_codes,
// nested_absmax, with the offset kept here as a value). Made by upload_nf4, released by free_nf4.
struct Nf4DeviceWeight {
    std::vector<size_t> shape;
    size_t count = 0;
    bool double_quant = false;
    uint8_t* packed = nullptr;        // padded_code_bytes(): (count + 1) / 2 bytes of codes, then zeros
    float* absmax = nullptr;          // single: blocks()
    uint8_t* absmax_codes = nullptr;  // double: blocks()
    float* nested_absmax = nullptr;   // double: nested_blocks()
    float absmax_offset = 0.0f;       // double
    size_t blocks() const { return (count + kNf4BlockSize - 1) / kNf4BlockSize; }
    size_t nested_blocks() const { return (blocks() + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize; }
    size_t code_bytes() const { return (count + 1) / 2; }
    size_t padded_code_bytes() const { return (code_bytes() + kNf4CodeVectorBytes - 1) / kNf4CodeVectorBytes * kNf4CodeVectorBytes; }
    // What it stores, the codes' padding aside: nf4_bytes(count, double_quant), the offset's 4 bytes included.
    size_t bytes() const {
        if (!double_quant) return code_bytes() + blocks() * sizeof(float);
        return code_bytes() + blocks() + nested_blocks() * sizeof(float) + sizeof(float);
    }
};

// Copies w to the device (synchronously). An Nf4Weight whose arrays disagree with its count and mode is refused in
// one line before anything is allocated.
inline Nf4DeviceWeight upload_nf4(const Nf4Weight& w) {
    if (const std::string problem = nf4_layout_problem(w); !problem.empty()) die("upload_nf4: NF4 weight: " + problem);
    Nf4DeviceWeight d;
    d.shape = w.shape;
    d.count = w.count;
    d.double_quant = w.double_quant;
    cudaCheck(cudaMalloc(&d.packed, d.padded_code_bytes()));
    cudaCheck(cudaMemset(d.packed, 0, d.padded_code_bytes()));
    cudaCheck(cudaMemcpy(d.packed, w.packed.data(), d.code_bytes(), cudaMemcpyHostToDevice));
    if (!d.double_quant) {
        cudaCheck(cudaMalloc(&d.absmax, d.blocks() * sizeof(float)));
        cudaCheck(cudaMemcpy(d.absmax, w.absmax.data(), d.blocks() * sizeof(float), cudaMemcpyHostToDevice));
    } else {
        cudaCheck(cudaMalloc(&d.absmax_codes, d.blocks()));
        cudaCheck(cudaMemcpy(d.absmax_codes, w.absmax_codes.data(), d.blocks(), cudaMemcpyHostToDevice));
        cudaCheck(cudaMalloc(&d.nested_absmax, d.nested_blocks() * sizeof(float)));
        cudaCheck(cudaMemcpy(d.nested_absmax, w.nested_absmax.data(), d.nested_blocks() * sizeof(float), cudaMemcpyHostToDevice));
        d.absmax_offset = w.absmax_offset;
    }
    return d;
}

// An NF4 weight of `shape` on the device with every array allocated and zeroed, for quantize_nf4_device to fill.
inline Nf4DeviceWeight allocate_nf4(const std::vector<size_t>& shape, bool double_quant) {
    Nf4DeviceWeight d;
    d.shape = shape;
    d.count = 1;
    for (size_t n : shape) d.count *= n;
    if (shape.empty() || d.count == 0) die("allocate_nf4: an NF4 weight needs a shape of at least one weight");
    d.double_quant = double_quant;
    auto zeroed = [](auto** p, size_t bytes) {
        cudaCheck(cudaMalloc(p, bytes));
        cudaCheck(cudaMemset(*p, 0, bytes));
    };
    zeroed(&d.packed, d.padded_code_bytes());
    if (!double_quant) {
        zeroed(&d.absmax, d.blocks() * sizeof(float));
    } else {
        zeroed(&d.absmax_codes, d.blocks());
        zeroed(&d.nested_absmax, d.nested_blocks() * sizeof(float));
    }
    return d;
}

inline void free_nf4(Nf4DeviceWeight& d) {
    for (void* p : {(void*)d.packed, (void*)d.absmax, (void*)d.absmax_codes, (void*)d.nested_absmax}) cudaCheck(cudaFree(p));
    d = Nf4DeviceWeight();
}

// The device weight back on the host as an Nf4Weight (synchronously): for tests, and for comparing with nf4.h.
inline Nf4Weight download_nf4(const Nf4DeviceWeight& d) {
    Nf4Weight w;
    w.shape = d.shape;
    w.count = d.count;
    w.double_quant = d.double_quant;
    w.packed.resize(d.code_bytes());
    cudaCheck(cudaMemcpy(w.packed.data(), d.packed, d.code_bytes(), cudaMemcpyDeviceToHost));
    if (!d.double_quant) {
        w.absmax.resize(d.blocks());
        cudaCheck(cudaMemcpy(w.absmax.data(), d.absmax, d.blocks() * sizeof(float), cudaMemcpyDeviceToHost));
    } else {
        w.absmax_codes.resize(d.blocks());
        w.nested_absmax.resize(d.nested_blocks());
        cudaCheck(cudaMemcpy(w.absmax_codes.data(), d.absmax_codes, d.blocks(), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(w.nested_absmax.data(), d.nested_absmax, d.nested_blocks() * sizeof(float), cudaMemcpyDeviceToHost));
        w.absmax_offset = d.absmax_offset;
    }
    return w;
}

// A double-quantized block's absmax from its 8-bit code's dynamic-map value, its group's nested absmax and the offset:
// the product, then the sum, each rounded on its own (no fused multiply-add), as model/nf4.h's nf4_block_scales.
__device__ __forceinline__ float nf4_double_quant_absmax(float map_value, float nested_absmax, float offset) {
    return __fadd_rn(__fmul_rn(map_value, nested_absmax), offset);
}

// A warp takes a span of 1024 weights at a time (grid-stride over spans): each lane loads one 16-byte vector of codes
// (32 weights; the warp's 512 bytes in one coalesced load) into the warp's slice of shared memory, and lanes 0-15
// each compute one of the span's 16 block absmaxes once. The lanes then read the codes back in the order that makes
// every output store a contiguous 512 bytes across the warp: step s, lane l writes the 16-byte vector of weights
// (32 s + l) * V .. + V (V = 8 bf16 or 4 fp32), taking its block's absmax from lane (32 s + l) * V / 64 by shuffle.
constexpr int kNf4Threads = 256;
constexpr int kNf4SpanWeights = 32 * kNf4CodeVectorBytes * 2;               // 1024
constexpr int kNf4SpanBlocks = kNf4SpanWeights / (int)kNf4BlockSize;       // 16
static_assert(kNf4SpanBlocks <= 32, "one absmax per lane");

template <typename OutT, bool kDoubleQuant>
__global__ void __launch_bounds__(kNf4Threads)
dequantize_nf4_kernel(OutT* out, const uint8_t* packed, const float* absmax, const uint8_t* absmax_codes,
                      const float* nested_absmax, float absmax_offset, long count, const Nf4Tables tables) {
    constexpr int kWarps = kNf4Threads / 32;
    constexpr int V = Packed128<OutT>::size;                  // weights a store
    constexpr int kSteps = kNf4SpanWeights / (32 * V);        // 4 (bf16) or 8 (fp32)
    static_assert(!kDoubleQuant || kNf4Threads == 256, "one dynamic-map entry per thread");
    __shared__ float nf4[16];
    __shared__ float dynamic[kDoubleQuant ? 256 : 1];
    __shared__ alignas(16) uint8_t codes[kWarps][kNf4SpanWeights / 2];
    if (threadIdx.x < 16) nf4[threadIdx.x] = tables.nf4[threadIdx.x];
    if constexpr (kDoubleQuant) dynamic[threadIdx.x] = tables.dynamic[threadIdx.x];
    __syncthreads();

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long blocks = (count + (long)kNf4BlockSize - 1) / (long)kNf4BlockSize;
    const long code_bytes = (count + 1) / 2;
    const long spans = (count + kNf4SpanWeights - 1) / kNf4SpanWeights;
    uint8_t* warp_codes = codes[warp];
    for (long span = (long)blockIdx.x * kWarps + warp; span < spans; span += (long)gridDim.x * kWarps) {
        const long first = span * kNf4SpanWeights;
        const long byte = first / 2 + lane * (long)kNf4CodeVectorBytes;  // a vector that starts in the codes ends in their padding
        const int4 vector = byte < code_bytes ? __ldcs(reinterpret_cast<const int4*>(packed + byte)) : make_int4(0, 0, 0, 0);
        *reinterpret_cast<int4*>(warp_codes + lane * kNf4CodeVectorBytes) = vector;
        const long block = first / (long)kNf4BlockSize + lane;
        float scale = 0.0f;
        if (lane < kNf4SpanBlocks && block < blocks) {
            if constexpr (kDoubleQuant)
                scale = nf4_double_quant_absmax(dynamic[absmax_codes[block]], nested_absmax[block / (long)kNf4NestedBlockSize], absmax_offset);
            else
                scale = absmax[block];
        }
        __syncwarp();
#pragma unroll
        for (int step = 0; step < kSteps; step++) {
            const int local = (step * 32 + lane) * V;  // the vector's first weight within the span
            const float s = __shfl_sync(0xffffffffu, scale, local / (int)kNf4BlockSize);
            // V / 2 bytes of codes, little-endian: weight i is byte i / 2's high nibble (i even) or low nibble (i odd)
            uint32_t bits;
            if constexpr (V == 8) bits = *reinterpret_cast<const uint32_t*>(warp_codes + local / 2);
            else bits = *reinterpret_cast<const uint16_t*>(warp_codes + local / 2);
            Packed128<OutT> values;
#pragma unroll
            for (int i = 0; i < V; i++) values[i] = from_float<OutT>(__fmul_rn(nf4[(bits >> (8 * (i / 2) + (i % 2 ? 0 : 4))) & 0xF], s));
            const long at = first + local;
            if (at + V <= count) {
                store128(out + at, values);
            } else {
                for (int i = 0; i < V && at + i < count; i++) out[at + i] = values[i];
            }
        }
        __syncwarp();  // every lane has read the codes before the next span overwrites them
    }
}

// out[count] (fp32 or bf16, 16-byte aligned) = the dequantized weight, on `stream`. A weight never uploaded and a
// misaligned output are refused in one line before any CUDA call.
template <typename OutT>
void dequantize_nf4_device(OutT* out, const Nf4DeviceWeight& w, cudaStream_t stream) {
    static_assert(std::is_same_v<OutT, float> || std::is_same_v<OutT, __nv_bfloat16>, "NF4 dequantizes to fp32 or bf16");
    if (w.count == 0) die("dequantize_nf4_device: the NF4 weight holds no weights (not uploaded?)");
    if (reinterpret_cast<uintptr_t>(out) % 16 != 0) die("dequantize_nf4_device: the output must be 16-byte aligned (vector stores)");
    const long spans = ceil_div((long)w.count, kNf4SpanWeights), warps_per_block = kNf4Threads / 32;
    // enough blocks to fill every SM once; larger weights are walked by the grid-stride loop
    static int blocks_per_sm[2] = {0, 0};
    int& resident = blocks_per_sm[w.double_quant];
    if (resident == 0) {
        auto kernel = w.double_quant ? dequantize_nf4_kernel<OutT, true> : dequantize_nf4_kernel<OutT, false>;
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kNf4Threads, 0));
    }
    const int grid = (int)std::min<long>(ceil_div(spans, warps_per_block), (long)device_sm_count() * resident);
    if (w.double_quant)
        dequantize_nf4_kernel<OutT, true><<<grid, kNf4Threads, 0, stream>>>(out, w.packed, w.absmax, w.absmax_codes, w.nested_absmax,
                                                                             w.absmax_offset, (long)w.count, nf4_tables());
    else
        dequantize_nf4_kernel<OutT, false><<<grid, kNf4Threads, 0, stream>>>(out, w.packed, w.absmax, w.absmax_codes, w.nested_absmax,
                                                                              w.absmax_offset, (long)w.count, nf4_tables());
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// Quantization on the device

// Device scratch of quantize_nf4_device for weights of up to `max_count` elements: the block absmaxes of a
// double-quantized weight before their own quantization, and the first block holding a weight that is not finite.
struct Nf4QuantizeScratch {
    float* absmax = nullptr;
    unsigned long long* first_bad_block = nullptr;
    size_t max_blocks = 0;
    void allocate(size_t max_count) {
        max_blocks = (max_count + kNf4BlockSize - 1) / kNf4BlockSize;
        cudaCheck(cudaMalloc(&absmax, max_blocks * sizeof(float)));
        cudaCheck(cudaMalloc(&first_bad_block, sizeof(unsigned long long)));
    }
    void free() {
        for (void* p : {(void*)absmax, (void*)first_bad_block})
            if (p) cudaCheck(cudaFree(p));
        *this = Nf4QuantizeScratch();
    }
    // Bytes allocate(max_count) takes (the memory plan counts it).
    static size_t bytes(size_t max_count) { return (max_count + kNf4BlockSize - 1) / kNf4BlockSize * sizeof(float) + sizeof(unsigned long long); }
};

// dQuantizeNF4's thresholds (nf4.h's nf4_thresholds), a kernel argument.
struct Nf4Thresholds {
    float t[15];
};

// A warp per block of 64 weights (grid-stride over blocks): lane l takes weights 2l and 2l + 1 (past the count: 0,
// whose code fills an odd count's last low nibble, as on the host), the block's max |w| by shuffles (a max is exact
// in any order), then each lane's two codes from w * (1 / absmax) rounded as the host rounds it, one packed byte a
// lane. A block holding NaN or inf records its index in first_bad_block (the smallest: atomicMin).
constexpr int kNf4QuantizeThreads = 256;
__global__ void __launch_bounds__(kNf4QuantizeThreads)
quantize_nf4_kernel(uint8_t* packed, float* absmax, unsigned long long* first_bad_block, const float* weights, long count, const Nf4Thresholds th) {
    const int lane = threadIdx.x % 32;
    const long blocks = (count + (long)kNf4BlockSize - 1) / (long)kNf4BlockSize;
    const long warps = (long)gridDim.x * (kNf4QuantizeThreads / 32);
    for (long b = (long)blockIdx.x * (kNf4QuantizeThreads / 32) + threadIdx.x / 32; b < blocks; b += warps) {
        const long i = b * (long)kNf4BlockSize + 2 * lane;
        const float x0 = i < count ? weights[i] : 0.0f, x1 = i + 1 < count ? weights[i + 1] : 0.0f;
        const float a0 = fabsf(x0), a1 = fabsf(x1);
        const bool bad = !(a0 <= FLT_MAX) || !(a1 <= FLT_MAX);
        float m = fmaxf(a0, a1);
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
        if (__any_sync(0xffffffffu, bad)) {
            if (lane == 0) atomicMin(first_bad_block, (unsigned long long)b);
            continue;
        }
        const float inverse = __fdiv_rn(1.0f, m);  // inf for a block of zeros: every code 0, as on the host
        const float s0 = __fmul_rn(x0, inverse), s1 = __fmul_rn(x1, inverse);
        int c0 = 0, c1 = 0;
#pragma unroll
        for (int k = 0; k < 15; k++) {
            c0 += s0 > th.t[k];
            c1 += s1 > th.t[k];
        }
        if (i < count) packed[i / 2] = (uint8_t)(c0 << 4 | c1);
        if (lane == 0) absmax[b] = m;
    }
}

// Quantizes `weights` (fp32 on the device, w.count of them) into w (allocate_nf4's, of the same count), bitwise
// quantize_nf4(weights, w.count, w.double_quant): the codes and absmaxes on `stream`, then (double quantization) the
// absmaxes' own quantization on the host. Synchronous: returns once w holds the weight. A weight that is not finite
// stops the run with one line naming `what`, its index and value, as quantize_nf4 does.
inline void quantize_nf4_device(Nf4DeviceWeight& w, const float* weights, Nf4QuantizeScratch& scratch, cudaStream_t stream,
                                const std::string& what = "quantize_nf4_device") {
    if (w.count == 0 || w.packed == nullptr) die("quantize_nf4_device: the NF4 weight is not allocated (allocate_nf4)");
    const size_t blocks = w.blocks();
    if (blocks > scratch.max_blocks) die("internal: quantize_nf4_device: the scratch holds fewer block absmaxes than the weight has blocks");
    static const Nf4Thresholds thresholds = [] {
        Nf4Thresholds t;
        memcpy(t.t, nf4_thresholds().data(), sizeof t.t);
        return t;
    }();
    float* absmax = w.double_quant ? scratch.absmax : w.absmax;
    cudaCheck(cudaMemsetAsync(scratch.first_bad_block, 0xFF, sizeof(unsigned long long), stream));
    const long warps_per_block = kNf4QuantizeThreads / 32;
    const int grid = (int)std::min<long>(ceil_div((long)blocks, warps_per_block), 65535L * 8);
    quantize_nf4_kernel<<<grid, kNf4QuantizeThreads, 0, stream>>>(w.packed, absmax, scratch.first_bad_block, weights, (long)w.count, thresholds);
    cudaCheckLaunch();
    unsigned long long first_bad = 0;
    cudaCheck(cudaMemcpyAsync(&first_bad, scratch.first_bad_block, sizeof first_bad, cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    if (first_bad != ~0ull) {  // the block's weights, to name the first that is not finite
        const size_t begin = (size_t)first_bad * kNf4BlockSize, n = std::min(kNf4BlockSize, w.count - begin);
        std::vector<float> block(n);
        cudaCheck(cudaMemcpy(block.data(), weights + begin, n * sizeof(float), cudaMemcpyDeviceToHost));
        size_t i = 0;
        while (i + 1 < n && std::fabs(block[i]) <= FLT_MAX) i++;
        die(what + ": weight " + std::to_string(begin + i) + " of " + std::to_string(w.count) + " is " + std::to_string(block[i]) +
            "; NF4 quantizes finite weights only");
    }
    if (!w.double_quant) return;
    std::vector<float> host_absmax(blocks);
    cudaCheck(cudaMemcpy(host_absmax.data(), scratch.absmax, blocks * sizeof(float), cudaMemcpyDeviceToHost));
    Nf4Weight nested;
    nf4_double_quantize(host_absmax, nested);
    cudaCheck(cudaMemcpy(w.absmax_codes, nested.absmax_codes.data(), blocks, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(w.nested_absmax, nested.nested_absmax.data(), nested.nested_absmax.size() * sizeof(float), cudaMemcpyHostToDevice));
    w.absmax_offset = nested.absmax_offset;
}
