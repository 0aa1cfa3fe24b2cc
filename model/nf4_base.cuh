// QLoRA's frozen 4-bit base (--base-quant nf4, docs/lora.md "QLoRA"): under LoRA the base model's blocks keep their four
// linear layers' weights (qkv, the attention projection, fc or [gate | up], the fc projection) in NF4 with double
// quantization (kernels/nf4.cuh, 0.5159 bytes a weight), and everything else of a block (norms, biases) in the compute
// precision; the embeddings, the final norm and the LM head stay whole in ZeroOptimizer's persistent buffers.
// How the products see the weights: Nf4Base is ZeroOptimizer's UnitSource. ZeroOptimizer runs the blocks through its
// two-slot parameter ring as under ZeRO-3 (at any world size), and each slot is filled by fill() on the communication
// stream -- the block's four weights dequantized to bf16 and its small tensors copied -- just before the block's
// forward, and again before its backward (whose input gradient dx = dy W reads the same bf16 weights; the base has no
// weight gradient), the next block prefetched while the current one computes.
// Quantization happens as values arrive: ZeroOptimizer::set_unit hands each block's fp32 values (from a model file, a
// Hugging Face import or the initialisation, one block at a time) to store(), which quantizes on the GPU, bitwise
// model/nf4.h's quantize_nf4. No bf16 copy of the whole base is ever on the GPU.
// What it leaves to others: the ring, its events and prefetching (distributed/zero.cuh); the memory plan's use of
// nf4_base_memory (memory_plan.h); the chunked initialisation of the persistent units (initialization.cuh).
// defines: Nf4BaseMemory, nf4_base_memory, Nf4Base
#pragma once
#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/init.cuh"       // defines: convert_precision
#include "../kernels/nf4.cuh"        // defines: Nf4DeviceWeight, quantize_nf4_device, dequantize_nf4_device, Nf4QuantizeScratch
#include "../distributed/zero.cuh"  // defines: UnitSource
#include "config.h"                 // defines: ParameterLayout, BlockTensor, UnitKind
#include "nf4.h"                    // defines: kNf4BaseTensors, nf4_base_tensor (which block tensors are NF4)

// Each array of the packed storage starts on a 256-byte boundary of one allocation (cudaMalloc's own alignment).
constexpr size_t kNf4BaseAlign = 256;
inline size_t nf4_base_aligned(size_t bytes) { return (bytes + kNf4BaseAlign - 1) / kNf4BaseAlign * kNf4BaseAlign; }

// A linear weight of the layout as an NF4 weight's dimensions (rows = output features, columns = input features).
inline std::vector<size_t> nf4_base_shape(const ParameterLayout& l, BlockTensor t) {
    const size_t C = l.config.channels, n = l.block_tensor_size[t];
    return t == FCPROJW || t == ATTPROJW ? std::vector<size_t>{C, n / C} : std::vector<size_t>{n / C, C};
}
// Bytes of one NF4 weight of n elements as Nf4Base carves it: codes (padded to 16-byte vectors), then 8-bit absmax codes
// and fp32 nested absmaxes (double_quant), or fp32 absmaxes, each array 256-byte aligned (its offset is a host value).
inline size_t nf4_base_weight_bytes(size_t n, bool double_quant) {
    Nf4DeviceWeight d;
    d.count = n;
    if (!double_quant) return nf4_base_aligned(d.padded_code_bytes()) + nf4_base_aligned(d.blocks() * sizeof(float));
    return nf4_base_aligned(d.padded_code_bytes()) + nf4_base_aligned(d.blocks()) + nf4_base_aligned(d.nested_blocks() * sizeof(float));
}

// Device memory of a stage's NF4 base (layout: its part of the model), before allocating (the start-up plan):
//   packed:     the blocks' linear weights in NF4 (codes, absmax codes, nested absmaxes), and their other tensors
//   persistent: the embeddings, the final norm and the LM head, whole (ZeroOptimizer's persistent buffers)
//   ring:       two blocks in the compute precision, which the products read
//   scratch:    quantization's block absmaxes of the largest weight; staging: the fp32 values of one block, which the
//               initialisation and the load hand to store() (the persistent units pass through it a block's size at a time)
// dense: the same parameters in the compute precision, for the report's comparison.
struct Nf4BaseMemory {
    size_t packed = 0, persistent = 0, ring = 0, scratch = 0, staging = 0, dense = 0;
    size_t weights = 0;  // elements stored in NF4
    size_t parameters() const { return packed + persistent + ring; }
};
template <typename floatX>
Nf4BaseMemory nf4_base_memory(const ParameterLayout& l, bool double_quant) {
    Nf4BaseMemory m;
    size_t block_rest = 0, largest_weight = 0, largest_block = 0;
    for (int t = 0; t < kBlockTensors; t++) {
        if (!nf4_base_tensor(t)) {
            block_rest += l.block_tensor_size[t];
            continue;
        }
        m.packed += nf4_base_weight_bytes(l.block_tensor_size[t], double_quant) * l.num_blocks();
        m.weights += l.block_tensor_size[t] * l.num_blocks();
        largest_weight = std::max(largest_weight, l.block_tensor_size[t]);
    }
    m.packed += nf4_base_aligned(block_rest * l.num_blocks() * sizeof(floatX));
    for (int u = 0; u < l.num_units(); u++) {
        if (l.unit_kinds[u] == UnitKind::kGathered) largest_block = std::max(largest_block, l.unit_size(u));
        else m.persistent += l.unit_size(u) * sizeof(floatX);
    }
    m.ring = (l.num_blocks() >= 2 ? 2 : l.num_blocks()) * largest_block * sizeof(floatX);
    m.scratch = Nf4QuantizeScratch::bytes(largest_weight);
    m.staging = largest_block * sizeof(float);
    m.dense = l.total * sizeof(floatX);
    return m;
}

// The NF4 base of one stage's blocks: its packed weights and small tensors on the device in one allocation, filled
// by store() and read by fill() (UnitSource).
template <typename floatX>
class Nf4Base : public UnitSource<floatX> {
public:
    // packed: the products read the four weights packed (--nf4-products packed), so the ring's fills leave
    // them out; double_quant: the absmaxes in 8 bits (QLoRA's double quantization), else in fp32 (--nf4-double-quant 0)
    Nf4Base(const ParameterLayout& layout, bool packed, bool double_quant)
        : packed_products(packed), double_quant_(double_quant), layout_(layout) {
        for (int t = 0; t < kBlockTensors; t++) {
            rest_offset_[t] = rest_size_;
            if (!nf4_base_tensor(t)) rest_size_ += layout.block_tensor_size[t];
        }
    }
    Nf4Base(const Nf4Base&) = delete;
    Nf4Base& operator=(const Nf4Base&) = delete;
    ~Nf4Base() override {
        if (storage_) cudaFree(storage_);
        scratch_.free();
    }

    // One allocation for every block's packed weights and small tensors (zeroed), carved as nf4_base_memory counts it.
    void allocate() {
        const Nf4BaseMemory m = nf4_base_memory<floatX>(layout_, double_quant_);
        cudaCheck(cudaMalloc(&storage_, m.packed));
        cudaCheck(cudaMemset(storage_, 0, m.packed));
        uint8_t* next = storage_;
        auto carve = [&](size_t bytes) {
            uint8_t* p = next;
            next += nf4_base_aligned(bytes);
            return p;
        };
        weights_.assign(layout_.num_blocks(), {});
        for (int b = 0; b < layout_.num_blocks(); b++)
            for (int k = 0; k < 4; k++) {
                Nf4DeviceWeight& w = weights_[b][k];
                w.shape = nf4_base_shape(layout_, kNf4BaseTensors[k]);
                w.count = layout_.block_tensor_size[kNf4BaseTensors[k]];
                w.double_quant = double_quant_;
                w.packed = carve(w.padded_code_bytes());
                if (double_quant_) {
                    w.absmax_codes = carve(w.blocks());
                    w.nested_absmax = reinterpret_cast<float*>(carve(w.nested_blocks() * sizeof(float)));
                } else {
                    w.absmax = reinterpret_cast<float*>(carve(w.blocks() * sizeof(float)));
                }
            }
        rest_ = reinterpret_cast<floatX*>(carve(rest_size_ * layout_.num_blocks() * sizeof(floatX)));
        if ((size_t)(next - storage_) != m.packed) die("internal: the NF4 base's carving disagrees with nf4_base_memory");
        size_t largest = 0;
        for (BlockTensor t : kNf4BaseTensors) largest = std::max(largest, layout_.block_tensor_size[t]);
        scratch_.allocate(largest);
    }

    // Unit u (a block) from its fp32 values on the device (the padded unit, as ZeroOptimizer::set_unit has them): the four
    // weights quantized (synchronously), the small tensors converted on `stream`, which the caller waits for before
    // `values` changes.
    void store(int u, const float* values, cudaStream_t stream) override {
        const int b = block_of(u);
        for (int k = 0; k < 4; k++) {
            const BlockTensor t = kNf4BaseTensors[k];
            quantize_nf4_device(weights_[b][k], values + layout_.block_offset[t], scratch_, stream,
                                "--base-quant nf4: block " + std::to_string(b) + " " + block_tensor_name(t));
        }
        for (int t = 0; t < kBlockTensors; t++)
            if (!nf4_base_tensor(t) && layout_.block_tensor_size[t] > 0)
                convert_precision(rest(b, t), values + layout_.block_offset[t], (long)layout_.block_tensor_size[t], stream);
    }

    const bool packed_products;  // the constructor's `packed`: fill() leaves the four weights out unless `whole`

    // Unit u (a block) in the compute precision into dst (a ring slot of the unit's size) on `stream`: the weights
    // dequantized (unless packed_products and not `whole`), the small tensors copied; the padding is left as it is
    // (nothing reads it).
    void fill(int u, floatX* dst, bool whole, cudaStream_t stream) override {
        const int b = block_of(u);
        for (int k = 0; k < 4 && (whole || !packed_products); k++) {
            floatX* out = dst + layout_.block_offset[kNf4BaseTensors[k]];
            if constexpr (std::is_same<floatX, __nv_bfloat16>::value || std::is_same<floatX, float>::value)
                dequantize_nf4_device(out, weights_[b][k], stream);
            else
                die("--base-quant nf4 runs in --precision bf16 or fp32");
        }
        for (int t = 0; t < kBlockTensors; t++)
            if (!nf4_base_tensor(t) && layout_.block_tensor_size[t] > 0)
                cudaCheck(cudaMemcpyAsync(dst + layout_.block_offset[t], rest(b, t), layout_.block_tensor_size[t] * sizeof(floatX),
                                          cudaMemcpyDeviceToDevice, stream));
    }

    // Block b's weight k (kNf4BaseTensors' order), for tests.
    const Nf4DeviceWeight& weight(int b, int k) const { return weights_[b][k]; }

private:
    int block_of(int u) const {
        const int b = u - layout_.first_block_unit;
        if (b < 0 || b >= layout_.num_blocks()) die("internal: the NF4 base holds blocks only (unit " + std::to_string(u) + ")");
        return b;
    }
    floatX* rest(int b, int t) const { return rest_ + (size_t)b * rest_size_ + rest_offset_[t]; }

    const bool double_quant_;
    ParameterLayout layout_;
    uint8_t* storage_ = nullptr;                           // everything below, in one allocation
    std::vector<std::array<Nf4DeviceWeight, 4>> weights_;  // per block, kNf4BaseTensors' order
    floatX* rest_ = nullptr;                               // per block, its other tensors back to back
    size_t rest_offset_[kBlockTensors] = {}, rest_size_ = 0;
    Nf4QuantizeScratch scratch_;
};
