// What the kernels share with plain host code, in C++ that g++ compiles as well as nvcc (no CUDA header): the layout
// masks and splitmix64, so that the CPU AdamW (adamw_cpu.h) decays and rounds with the GPU's own definitions, and
// RoPE's scaling, which the model's configuration holds and rope_inv_freq (rope.cuh) applies.
// defines: HOST_DEVICE, HOST_DEVICE_INLINE, LayoutMask, splitmix64, RopeScaling
#pragma once
#include <climits>
#include <cstdint>

// Callable from host and device code under nvcc; plain functions elsewhere.
#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#define HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define HOST_DEVICE
#define HOST_DEVICE_INLINE inline
#endif

// Which elements of a flat parameter buffer have a property (weight decay; being a tensor-parallel slice rather
// than a replicated tensor), as a function of the element index, so that one launch covers the whole buffer or
// any contiguous shard of it. Layout: [head: true below head_end, false from there to blocks_begin]
// [identical blocks of block_size from blocks_begin to blocks_end][tail: false, true from tail_begin]; inside a
// block, the elements in [range_begin[r], range_end[r]) are true.
struct LayoutMask {
    long head_end = 0, blocks_begin = 0, block_size = 1, blocks_end = 0, tail_begin = LONG_MAX;
    int num_ranges = 0;
    long range_begin[8] = {}, range_end[8] = {};
    HOST_DEVICE bool contains(long i) const {
        if (i < head_end || i >= tail_begin) return true;
        if (i < blocks_begin || i >= blocks_end) return false;
        return in_ranges((i - blocks_begin) % block_size);
    }
    // contains() of elements index .. index + X - 1, as bits, with one 64-bit division instead of X (the position
    // within a block of the next element is one more, wrapping at block_size): AdamW's decay, per 16-byte vector.
    template <int X>
    HOST_DEVICE uint32_t contains_bits(long index) const {
        uint32_t bits = 0;
        long j = -1;  // position within the block of the previous element, once one was inside the blocks' range
        for (int k = 0; k < X; k++) {
            const long i = index + k;
            bool in = i < head_end || i >= tail_begin;
            if (!in && i >= blocks_begin && i < blocks_end) {
                j = j < 0 ? (i - blocks_begin) % block_size : (j + 1 == block_size ? 0 : j + 1);
                in = in_ranges(j);
            }
            bits |= (uint32_t)in << k;
        }
        return bits;
    }
    // An index past i up to which contains() keeps its value at i (the end of the head, the gap, a range or the gap
    // after it in a block, the blocks), not always the furthest: CPU loops test runs instead of single elements.
    HOST_DEVICE long same_until(long i) const {
        if (i >= tail_begin) return LONG_MAX;
        if (i < head_end) return head_end;
        if (i < blocks_begin) return blocks_begin;
        if (i >= blocks_end) return tail_begin;
        const long j = (i - blocks_begin) % block_size;
        long next = block_size;  // the next position in the block where a range begins or ends
        for (int r = 0; r < num_ranges; r++) {
            if (range_begin[r] > j && range_begin[r] < next) next = range_begin[r];
            if (range_end[r] > j && range_end[r] < next) next = range_end[r];
        }
        return i - j + next < blocks_end ? i - j + next : blocks_end;
    }
    // Whether position j within a block lies in one of the ranges.
    HOST_DEVICE bool in_ranges(long j) const {
        for (int r = 0; r < num_ranges; r++)
            if (j >= range_begin[r] && j < range_end[r]) return true;
        return false;
    }
};

// Counter-based random numbers: a pure function of (seed, index), so results do not depend on the
// launch configuration and a resumed run draws exactly what the uninterrupted run drew.
HOST_DEVICE_INLINE uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Llama 3's rotary frequency scaling (transformers' rope_type "llama3"; original_max_positions is its
// original_max_position_embeddings); factor 0: none.
struct RopeScaling {
    float factor = 0, low_freq_factor = 1, high_freq_factor = 4;
    int original_max_positions = 8192;
};
