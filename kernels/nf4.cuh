// QLoRA's NF4 weights on the GPU (docs/formats.md "QLoRA's NF4 format"): an Nf4Weight of model/nf4.h uploaded to the
// device, and dequantized there into a bf16 or fp32 matrix bitwise equal to dequantize_nf4_bf16 / dequantize_nf4
// (test/test_nf4_gpu.cu). The arithmetic is nf4.h's, each operation rounded on its own as the host rounds it:
//   single:  w' = NF4[code] * absmax[b]
//   double:  w' = NF4[code] * (DYNAMIC[code8[b]] * nested[b / 256] + offset)   (product, sum and product rounded apart)
// __fmul_rn / __fadd_rn keep nvcc from fusing them into a multiply-add, which the host code never does.
// defines: Nf4Tables, nf4_tables, Nf4DeviceWeight, upload_nf4, free_nf4, dequantize_nf4_kernel, dequantize_nf4_device
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

inline void free_nf4(Nf4DeviceWeight& d) {
    for (void* p : {(void*)d.packed, (void*)d.absmax, (void*)d.absmax_codes, (void*)d.nested_absmax}) cudaCheck(cudaFree(p));
    d = Nf4DeviceWeight();
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
                scale = __fadd_rn(__fmul_rn(dynamic[absmax_codes[block]], nested_absmax[block / (long)kNf4NestedBlockSize]), absmax_offset);
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
