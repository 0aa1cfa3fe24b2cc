// ZeRO's sharding on the host: which slice of each parameter unit a data-parallel rank owns, where it lies in the
// rank's storage, and ZeRO-Offload's tiles of that storage (distributed/zero.cuh, distributed/zero_offload.cuh).
// defines: ShardPlan, local_slices
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

// Host arithmetic of the sharding; no GPU needed (tested on the CPU).
struct ShardPlan {
    int world = 1, rank = 0;
    std::vector<size_t> unit_offset, unit_size;  // in the full (padded) layout
    std::vector<size_t> shard_size;              // unit_size / world
    std::vector<size_t> local_offset;            // where this rank's slice of unit u starts in its shard storage
    size_t local_total = 0;

    ShardPlan() = default;
    ShardPlan(const std::vector<size_t>& offsets, const std::vector<size_t>& sizes, int world_size, int my_rank)
        : world(world_size), rank(my_rank), unit_offset(offsets), unit_size(sizes) {
        for (size_t u = 0; u < sizes.size(); u++) {
            shard_size.push_back(sizes[u] / world);
            local_offset.push_back(local_total);
            local_total += shard_size[u];
        }
    }
    int num_units() const { return (int)unit_size.size(); }
    // Index, in the full layout, of the first element of this rank's slice of unit u.
    size_t global_begin(int u) const { return unit_offset[u] + rank * shard_size[u]; }
    // Index, in the full layout, of element i of this rank's storage, which lies in unit u.
    size_t global_index(int u, size_t i) const { return global_begin(u) + (i - local_offset[u]); }
    // ZeRO-Offload's tiles of this rank's storage: tile k holds its elements [k tile, (k + 1) tile). visit(u, begin, end)
    // for each unit u that tile k overlaps, in order, with the overlap [begin, end) in storage order.
    int num_tiles(size_t tile) const { return (int)((local_total + tile - 1) / tile); }
    template <typename Visit>
    void for_each_tile_piece(size_t tile, int k, Visit visit) const {
        const size_t first = (size_t)k * tile, last = std::min(first + tile, local_total);
        for (int u = 0; u < num_units(); u++) {
            const size_t begin = std::max(first, local_offset[u]), end = std::min(last, local_offset[u] + shard_size[u]);
            if (begin < end) visit(u, begin, end);
        }
    }
};

// This rank's slices of a full (padded-layout) array, back to back.
inline std::vector<float> local_slices(const ShardPlan& plan, const std::vector<float>& full) {
    std::vector<float> out(plan.local_total);
    for (int u = 0; u < plan.num_units(); u++)
        std::copy(full.begin() + plan.global_begin(u), full.begin() + plan.global_begin(u) + plan.shard_size[u],
                  out.begin() + plan.local_offset[u]);
    return out;
}
