// QLoRA's 4-bit NormalFloat storage of a frozen weight (docs/formats.md "QLoRA's NF4 format"), on the host: bitsandbytes'
// quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True|False) with the arithmetic of its CUDA
// kernels, bitwise equal to scripts/reference/nf4_reference.py (test/test_nf4.cpp), multi-threaded with std::thread.
//   absmax[b] = max |w| over block b of 64;  code = #{k : w * (1 / absmax[b]) > threshold[k]};  w' = NF4[code] * absmax[b]
//   double quantization: offset = mean(absmax); absmax - offset in 8-bit dynamic-map codes by groups of 256, each group
//   with its own fp32 nested absmax; absmax' = DYNAMIC[code8] * nested[g] + offset.
// defines: kNf4BlockSize, kNf4NestedBlockSize, kNf4Values, nf4_thresholds, nf4_code, dynamic_map, dynamic8_code,
//          nf4_parallel, quantize_dynamic8, Nf4Weight, nf4_bytes, nf4_bits_per_weight, nf4_layout_problem, nf4_double_quantize,
//          quantize_nf4, nf4_block_scales, nf4_dequantize_with, dequantize_nf4, dequantize_nf4_bf16, kNf4BaseTensors,
//          nf4_base_tensor, Nf4Products
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>
#include "../kernels/die.h"  // die
#include "config.h"          // BlockTensor (the NF4 base's tensors)
#include "model_file.h"      // float_to_bf16_bits

constexpr size_t kNf4BlockSize = 64;         // weights per absmax
constexpr size_t kNf4NestedBlockSize = 256;  // absmaxes per nested absmax (double quantization)

// bitsandbytes' get_4bit_type("nf4"): quantiles of N(0, 1) scaled to [-1, 1], with an exact 0 (QLoRA, appendix E).
constexpr std::array<float, 16> kNf4Values = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// dQuantizeNF4's 15 thresholds. bitsandbytes writes each as the shortest decimal of the exact midpoint of two adjacent
// values, a float literal that the compiler rounds to float32 once; for four of them that is not the midpoint's own
// round-to-even (the midpoint is a float32 tie), so they are rebuilt the same way: shortest decimal, then read.
inline const std::array<float, 15>& nf4_thresholds() {
    static const std::array<float, 15> thresholds = [] {
        std::array<float, 15> t{};
        for (size_t k = 0; k < t.size(); k++) {
            const double midpoint = ((double)kNf4Values[k] + kNf4Values[k + 1]) / 2;  // exact
            char text[64];
            const auto written = std::to_chars(text, text + sizeof text, midpoint);
            std::from_chars(text, written.ptr, t[k]);
        }
        return t;
    }();
    return thresholds;
}

// The NF4 code of a scaled weight: the number of thresholds below it (a tie takes the lower code; NaN, from a block
// of zeros' 0 * (1/0), is below none: code 0, as on the GPU).
inline uint8_t nf4_code(float scaled, const std::array<float, 15>& thresholds) {
    int code = 0;
    for (float t : thresholds) code += scaled > t;
    return (uint8_t)code;
}

// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for i = 0..6 the means of
// adjacent points of linspace(0.1, 1, 2^i + 1) times +-10^(i-6), with 0 and 1, sorted. linspace is torch 2's CPU
// kernel as x86 builds compile it: start + step * j (end - step * (k-1-j) from the middle on), one fused multiply-add.
inline const std::array<float, 256>& dynamic_map() {
    static const std::array<float, 256> table = [] {
        std::vector<float> values = {0.0f, 1.0f};
        const double powers_of_ten[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
        for (int i = 0; i < 7; i++) {
            const int steps = (1 << i) + 1;
            const float start = 0.1f, end = 1.0f, step = (end - start) / (float)(steps - 1);
            std::vector<float> bounds(steps);
            for (int j = 0; j < steps; j++)
                bounds[j] = j < steps / 2 ? std::fma(step, (float)j, start) : std::fma(-step, (float)(steps - 1 - j), end);
            const float scale = (float)powers_of_ten[i];  // torch casts the Python scalar to float32
            for (int j = 0; j + 1 < steps; j++) {
                const float mean = (bounds[j] + bounds[j + 1]) / 2.0f;
                values.push_back(scale * mean);
                values.push_back(-scale * mean);
            }
        }
        std::sort(values.begin(), values.end());
        std::array<float, 256> t{};
        std::copy(values.begin(), values.end(), t.begin());
        return t;
    }();
    return table;
}

// dQuantize<0> (bitsandbytes' kernels.cu): a 7-step binary search of the sorted map from index 127, then the scaled
// value against the float32 midpoint (value + neighbour) * 0.5 on its side, the neighbours being the last indices
// the search passed (the map's ends when it passed none). NaN goes left all the way: index 0.
inline uint8_t dynamic8_code(float x, const std::array<float, 256>& map) {
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float upper = 1.0f, lower = -1.0f, val = map[pivot];
    for (int step = 64; step > 0; step >>= 1) {
        if (x > val) {
            lower_pivot = pivot;
            lower = val;
            pivot += step;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= step;
        }
        val = map[pivot];
    }
    if (upper_pivot == 255) upper = map[255];
    if (lower_pivot == 0) lower = map[0];
    if (x > val) return (uint8_t)(x > (upper + val) * 0.5f ? upper_pivot : pivot);
    return (uint8_t)(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

// Runs body(first, last) on contiguous ranges of [0, count), one per thread, at least min_per_thread items each
// (small jobs stay on the calling thread). threads <= 0: one per hardware thread. Each item's result depends on it
// alone, so the split never changes a bit.
template <typename Body>
inline void nf4_parallel(size_t count, size_t min_per_thread, int threads, const Body& body) {
    size_t workers = threads > 0 ? (size_t)threads : std::max(1u, std::thread::hardware_concurrency());
    workers = std::min(workers, std::max<size_t>(1, count / min_per_thread));
    const size_t per_worker = (count + workers - 1) / workers;
    std::vector<std::thread> pool;
    for (size_t first = per_worker; first < count; first += per_worker)
        pool.emplace_back([&body, first, count, per_worker] { body(first, std::min(count, first + per_worker)); });
    body(0, std::min(count, per_worker));
    for (std::thread& t : pool) t.join();
}

// bitsandbytes' quantize_blockwise(values, blocksize=256) with the dynamic map: codes[n] and absmax[ceil(n / 256)].
inline void quantize_dynamic8(const float* values, size_t n, uint8_t* codes, float* absmax, int threads = 0) {
    const std::array<float, 256>& map = dynamic_map();
    const size_t groups = (n + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize;
    nf4_parallel(groups, 1024, threads, [&](size_t first, size_t last) {
        for (size_t g = first; g < last; g++) {
            const size_t begin = g * kNf4NestedBlockSize, end = std::min(n, begin + kNf4NestedBlockSize);
            float m = 0.0f;
            for (size_t i = begin; i < end; i++) m = std::max(m, std::fabs(values[i]));
            absmax[g] = m;
            const float inverse = 1.0f / m;
            for (size_t i = begin; i < end; i++) codes[i] = dynamic8_code(values[i] * inverse, map);
        }
    });
}

// A quantized weight. Single quantization keeps `absmax`; double quantization keeps `absmax_codes`, `nested_absmax`
// and `absmax_offset` instead.
struct Nf4Weight {
    std::vector<size_t> shape;          // the tensor's shape (row-major); its product is count
    size_t count = 0;                   // weights
    std::vector<uint8_t> packed;        // (count + 1) / 2 bytes: weight 2j in the high nibble, 2j + 1 in the low
    bool double_quant = false;
    std::vector<float> absmax;          // single: one per block of 64 (the last block may be partial)
    std::vector<uint8_t> absmax_codes;  // double: one per block, an index of dynamic_map()
    std::vector<float> nested_absmax;   // double: one per group of 256 blocks (the last group may be partial)
    float absmax_offset = 0.0f;         // double: the mean of the block absmaxes
    size_t blocks() const { return (count + kNf4BlockSize - 1) / kNf4BlockSize; }
    // What the stored arrays take, the shape aside (= nf4_bytes(count, double_quant)).
    size_t bytes() const {
        return packed.size() + absmax.size() * sizeof(float) + absmax_codes.size() + nested_absmax.size() * sizeof(float) +
               (double_quant ? sizeof(float) : 0);
    }
};

// Bytes of n weights: ceil(n / 2) bytes of codes, plus for B = ceil(n / 64) blocks
//   single: 4 B (an fp32 absmax each)                       -> 0.5 + 4/64 = 0.5625 bytes (4.5 bits) a weight
//   double: B + 4 ceil(B / 256) + 4 (8-bit codes, an fp32 nested absmax per 256 blocks, the fp32 offset)
//                                                           -> 0.5 + 1/64 + 4/(64*256) = 0.515869140625 bytes a weight
// (QLoRA's 4 + 8/64 + 32/(64*256) = 4.127 bits; nf4_bits_per_weight gives these limits of large n).
inline size_t nf4_bytes(size_t n, bool double_quant) {
    const size_t blocks = (n + kNf4BlockSize - 1) / kNf4BlockSize;
    if (!double_quant) return (n + 1) / 2 + blocks * sizeof(float);
    return (n + 1) / 2 + blocks + (blocks + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize * sizeof(float) + sizeof(float);
}
constexpr double nf4_bits_per_weight(bool double_quant) {
    return double_quant ? 4.0 + 8.0 / kNf4BlockSize + 32.0 / (kNf4BlockSize * kNf4NestedBlockSize) : 4.0 + 32.0 / kNf4BlockSize;
}

// What is wrong with a weight's arrays for its count and mode ("" when they agree).
inline std::string nf4_layout_problem(const Nf4Weight& w) {
    auto mismatch = [](const char* what, size_t given, size_t expected) {
        return std::string(what) + " holds " + std::to_string(given) + " entries, expected " + std::to_string(expected);
    };
    if (w.count == 0) return "no weights (count 0)";
    size_t product = 1;
    for (size_t d : w.shape) product *= d;
    if (product != w.count) return "shape's product " + std::to_string(product) + " is not the count " + std::to_string(w.count);
    if (w.packed.size() != (w.count + 1) / 2) return mismatch("packed", w.packed.size(), (w.count + 1) / 2);
    const size_t blocks = w.blocks(), groups = (blocks + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize;
    if (w.absmax.size() != (w.double_quant ? 0 : blocks)) return mismatch("absmax", w.absmax.size(), w.double_quant ? 0 : blocks);
    if (w.absmax_codes.size() != (w.double_quant ? blocks : 0)) return mismatch("absmax_codes", w.absmax_codes.size(), w.double_quant ? blocks : 0);
    if (w.nested_absmax.size() != (w.double_quant ? groups : 0)) return mismatch("nested_absmax", w.nested_absmax.size(), w.double_quant ? groups : 0);
    return "";
}

// Double quantization of a weight's block absmaxes (one per block, in order) into w's absmax_codes, nested_absmax and
// absmax_offset. Shared by quantize_nf4 and the GPU's quantization (kernels/nf4.cuh), which hands its absmaxes here.
inline void nf4_double_quantize(const std::vector<float>& absmax, Nf4Weight& w, int threads = 0) {
    const size_t blocks = absmax.size();
    // offset: a float64 sum in index order (bitsandbytes takes torch's float32 mean, whose order is the device's)
    double sum = 0.0;
    for (float a : absmax) sum += a;
    w.absmax_offset = (float)(sum / (double)blocks);
    std::vector<float> centered(blocks);
    for (size_t b = 0; b < blocks; b++) centered[b] = absmax[b] - w.absmax_offset;
    w.absmax_codes.resize(blocks);
    w.nested_absmax.resize((blocks + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize);
    quantize_dynamic8(centered.data(), blocks, w.absmax_codes.data(), w.nested_absmax.data(), threads);
}

// Quantizes n finite weights (shape: the tensor's, {n} when empty). Refuses an empty array, a shape whose product is
// not n, and a NaN or infinite weight (naming the first). threads <= 0: one per hardware thread.
inline Nf4Weight quantize_nf4(const float* weights, size_t n, bool double_quant, const std::vector<size_t>& shape = {},
                              int threads = 0) {
    if (n == 0) die("quantize_nf4: no weights (n = 0)");
    Nf4Weight w;
    w.shape = shape.empty() ? std::vector<size_t>{n} : shape;
    size_t product = 1;
    for (size_t d : w.shape) product *= d;
    if (product != n) die("quantize_nf4: the shape's product " + std::to_string(product) + " is not the weight count " + std::to_string(n));
    w.count = n;
    w.double_quant = double_quant;
    w.packed.resize((n + 1) / 2);
    const size_t blocks = w.blocks();
    std::vector<float> absmax(blocks);
    const std::array<float, 15>& thresholds = nf4_thresholds();
    std::atomic<size_t> first_bad_block{blocks};
    nf4_parallel(blocks, 4096, threads, [&](size_t first, size_t last) {
        for (size_t b = first; b < last; b++) {
            const size_t begin = b * kNf4BlockSize, size = std::min(n - begin, kNf4BlockSize);
            const float* x = weights + begin;
            float m = 0.0f;
            bool bad = false;
            for (size_t i = 0; i < size; i++) {
                const float a = std::fabs(x[i]);
                bad |= !(a <= FLT_MAX);  // NaN or inf
                m = a > m ? a : m;
            }
            if (bad) {
                for (size_t seen = first_bad_block; b < seen && !first_bad_block.compare_exchange_weak(seen, b);) {}
                continue;
            }
            absmax[b] = m;
            const float inverse = 1.0f / m;  // inf for a block of zeros, as on the GPU
            uint8_t codes[kNf4BlockSize + 1];
            for (size_t i = 0; i < size; i++) codes[i] = nf4_code(x[i] * inverse, thresholds);
            codes[size] = nf4_code(0.0f * inverse, thresholds);  // an odd count's last low nibble: the GPU's zero padding
            for (size_t i = 0; i < size; i += 2) w.packed[(begin + i) / 2] = (uint8_t)(codes[i] << 4 | codes[i + 1]);
        }
    });
    if (first_bad_block < blocks) {
        size_t i = first_bad_block * kNf4BlockSize;
        while (std::fabs(weights[i]) <= FLT_MAX) i++;
        die("quantize_nf4: weight " + std::to_string(i) + " of " + std::to_string(n) + " is " + std::to_string(weights[i]) +
            "; NF4 quantizes finite weights only");
    }
    if (!double_quant) {
        w.absmax = std::move(absmax);
        return w;
    }
    nf4_double_quantize(absmax, w, threads);
    return w;
}

// The absmax each block dequantizes with: the stored one, or DYNAMIC[code8] * nested + offset rounded after the
// product and after the sum as bitsandbytes does (the product is exact in double: no fused multiply-add can merge them).
inline std::vector<float> nf4_block_scales(const Nf4Weight& w) {
    if (const std::string problem = nf4_layout_problem(w); !problem.empty()) die("NF4 weight: " + problem);
    if (!w.double_quant) return w.absmax;
    const std::array<float, 256>& map = dynamic_map();
    std::vector<float> scales(w.absmax_codes.size());
    for (size_t b = 0; b < scales.size(); b++) {
        const float product = (float)((double)map[w.absmax_codes[b]] * w.nested_absmax[b / kNf4NestedBlockSize]);
        scales[b] = product + w.absmax_offset;
    }
    return scales;
}

// Dequantizes into out[count]: NF4[code] * the block's absmax in float32, then store(out + i, value).
template <typename Store>
inline void nf4_dequantize_with(const Nf4Weight& w, int threads, const Store& store) {
    const std::vector<float> scales = nf4_block_scales(w);
    nf4_parallel(scales.size(), 4096, threads, [&](size_t first, size_t last) {
        for (size_t b = first; b < last; b++) {
            const size_t begin = b * kNf4BlockSize, end = std::min(w.count, begin + kNf4BlockSize);
            for (size_t i = begin; i < end; i++) {
                const uint8_t byte = w.packed[i / 2];
                store(i, kNf4Values[i % 2 ? byte & 0x0F : byte >> 4] * scales[b]);
            }
        }
    });
}
inline void dequantize_nf4(const Nf4Weight& w, float* out, int threads = 0) {
    nf4_dequantize_with(w, threads, [out](size_t i, float v) { out[i] = v; });
}
// To bfloat16 bits, rounded to nearest even from the float32 value (as the GPU kernel's bf16 output).
inline void dequantize_nf4_bf16(const Nf4Weight& w, uint16_t* out, int threads = 0) {
    nf4_dequantize_with(w, threads, [out](size_t i, float v) { out[i] = float_to_bf16_bits(v); });
}

// QLoRA's NF4 base (--base-quant nf4, model/nf4_base.cuh): the block tensors stored in NF4, the four linear layers'
// weights; every other block tensor keeps the compute precision.
constexpr BlockTensor kNf4BaseTensors[] = {QKVW, ATTPROJW, FCW, FCPROJW};
inline bool nf4_base_tensor(int t) { return t == QKVW || t == ATTPROJW || t == FCW || t == FCPROJW; }

// How the blocks' products read the NF4 base (--nf4-products): dequantized (the default), each block's weights written
// to bf16 in the parameter ring ahead of its products, which cuBLASLt runs (the dequantization overlapping the previous
// block's products); or packed, by kernels/nf4_matmul.cuh, which dequantizes the weights inside the product. cuBLASLt's
// products outrun our tiled kernel at every shape measured, 16 to 2,048 rows (bench/bench_nf4.cu, docs/perf.md).
enum class Nf4Products { kDequantized, kPacked };
