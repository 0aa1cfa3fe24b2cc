// The model's initial parameters (GPT-2's initialisation), drawn on the device unit by unit so that any tensor- and
// pipeline-parallel split makes the same model and no rank holds more than its own part; a model file's values
// instead are read by model_file.h and set by whole_model.cuh. Storing and sharding them is ZeroOptimizer's.
// defines: UnitRuns, unit_runs, TensorFill, unit_fills, init_unit_range, init_unit, init_parameters
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/init.cuh"  // defines: fill_normal, fill_constant, CopyRun, copy_runs
#include "config.h"             // defines: ParameterLayout, BlockTensor
#include "transformer.cuh"      // defines: Transformer

// Tensor-parallel rank `tp_rank`'s runs of `local` (a stage's slices) in `full` (the whole model, tp = 1), by
// local unit: runs[u] are relative to local unit u and to the one full unit they all come from, source[u]. What
// the initialisation copies out of each whole unit it draws.
struct UnitRuns {
    std::vector<std::vector<CopyRun>> runs;
    std::vector<int> source;
};
inline UnitRuns unit_runs(const ParameterLayout& local, const ParameterLayout& full, int tp_rank) {
    auto unit_at = [](const std::vector<size_t>& offsets, size_t offset) {
        return (int)(std::upper_bound(offsets.begin(), offsets.end(), offset) - offsets.begin()) - 1;
    };
    UnitRuns r{std::vector<std::vector<CopyRun>>(local.num_units()), std::vector<int>(local.num_units(), -1)};
    local.for_each_full_run(full, tp_rank, [&](size_t from, size_t to, size_t n) {
        const int u = unit_at(local.unit_offsets, to), f = unit_at(full.unit_offsets, from);
        if (r.source[u] < 0) r.source[u] = f;
        if (f != r.source[u] || from + n > full.unit_offset(f) + full.unit_size(f) || to + n > local.unit_offset(u) + local.unit_size(u))
            die("internal: a parameter run crosses a unit");
        r.runs[u].push_back({from - full.unit_offset(f), to - local.unit_offset(u), n});
    });
    for (int u = 0; u < local.num_units(); u++)
        if (r.source[u] < 0) die("internal: a parameter unit without runs");
    return r;
}

// GPT-2 initialisation of unit u of the whole model (wte, wpe, the blocks, the final norm, an untied LM head), for both
// families: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2L), zero biases, unit norm weights, zero padded
// vocabulary rows. Each tensor draws from its own seed (its index in the order wte, wpe, then qkvw, attprojw, fcw,
// fcprojw of each block, then the LM head), so the values depend neither on the layout nor on the order in which units
// are made, nor on the pieces a unit is drawn in.
// Units of the whole model (full_layout): a tensor-parallel rank then keeps its slices, so that every tp makes
// the same model.
// TensorFill: one tensor's values in unit u: `count` elements from `begin` (relative to the unit), std * N(0, 1) from
// `seed` (normal) or the constant `value`; the unit's other elements are zeros.
struct TensorFill {
    size_t begin, count;
    bool normal;
    float value;  // the standard deviation (normal) or the constant
    uint64_t seed;
};
template <typename floatX>
std::vector<TensorFill> unit_fills(const Transformer<floatX>& model, uint64_t seed, int u) {
    const ParameterLayout& layout = model.full_layout;
    const ModelConfig& config = model.config;
    const size_t C = config.channels, V = config.vocab_size, L = config.num_layers;
    const float std = 0.02f, residual_std = 0.02f / sqrtf(2.0f * L);
    const size_t begin = layout.unit_offset(u);
    auto seed_of = [&](uint64_t tensor_id) { return splitmix64(seed * 1000003ull + tensor_id); };
    auto normal = [&](size_t offset, size_t n, float sd, uint64_t tensor_id) { return TensorFill{offset - begin, n, true, sd, seed_of(tensor_id)}; };
    auto constant = [&](size_t offset, size_t n, float value) { return TensorFill{offset - begin, n, false, value, 0}; };
    if (u == layout.wte_unit) return {normal(layout.wte, V * C, std, 0)};
    if (u == layout.wpe_unit) return {normal(layout.wpe, (size_t)config.max_seq_len * C, std, 1)};
    if (u == layout.lm_head_unit) return {normal(layout.lm_head, V * C, std, 2 + 4 * L)};
    if (u == layout.lnf_unit) return {constant(layout.lnfw, C, 1.0f)};
    const int l = u - layout.first_block_unit;
    const size_t F = config.hidden_units();
    return {constant(layout.tensor(l, LN1W), C, 1.0f),
            normal(layout.tensor(l, QKVW), (size_t)config.qkv_channels() * C, std, 2 + 4 * l),
            normal(layout.tensor(l, ATTPROJW), C * C, residual_std, 3 + 4 * l),
            constant(layout.tensor(l, LN2W), C, 1.0f),
            normal(layout.tensor(l, FCW), config.mlp_inputs() * F * C, std, 4 + 4 * l),
            normal(layout.tensor(l, FCPROJW), F * C, residual_std, 5 + 4 * l)};
}
// Elements [first, first + n) of unit u of the whole model into `out` (fp32 on the device, n elements).
template <typename floatX>
void init_unit_range(const Transformer<floatX>& model, uint64_t seed, int u, size_t first, size_t n, float* out) {
    const cudaStream_t stream = model.stream;
    cudaCheck(cudaMemsetAsync(out, 0, n * sizeof(float), stream));
    for (const TensorFill& f : unit_fills(model, seed, u)) {
        const size_t lo = std::max(f.begin, first), hi = std::min(f.begin + f.count, first + n);
        if (lo >= hi) continue;
        if (f.normal) fill_normal(out + (lo - first), (long)(hi - lo), f.value, f.seed, stream, (long)(lo - f.begin));
        else fill_constant(out + (lo - first), (long)(hi - lo), f.value, stream);
    }
}
// The whole unit u into `unit_device` (fp32, the unit's padded size).
template <typename floatX>
void init_unit(const Transformer<floatX>& model, uint64_t seed, int u, float* unit_device) {
    init_unit_range(model, seed, u, 0, model.full_layout.unit_size(u), unit_device);
}

// Unit by unit on the device: each unit this rank holds is drawn whole (a unit of full_layout, so that every
// tensor- and pipeline-parallel split makes the same model), this rank's slices are copied out of it, and
// ZeRO stores them. Nothing passes through the host: a rank neither holds nor draws more than its own
// stage's units (the whole model in host memory on every rank ran a 4-rank 30B GPT out of host memory).
// With the NF4 base (model.nf4_base, tp = 1: a unit of this rank is a unit of the whole model) each block is drawn
// whole and handed to set_unit, which quantizes it, and the persistent units (the embeddings, the final norm, the LM
// head) are drawn into their own buffers a block's size at a time: the staging is one block in fp32.
template <typename floatX>
void init_parameters(Transformer<floatX>& model, uint64_t seed) {
    const ParameterLayout &layout = model.layout, &full_layout = model.full_layout;
    const cudaStream_t stream = model.stream;
    const UnitRuns r = unit_runs(layout, full_layout, model.mesh.tensor.rank);
    const bool by_blocks = model.nf4_base != nullptr;
    size_t most_runs = 0, largest_full = 0, largest_local = 0;
    for (int u = 0; u < layout.num_units(); u++) {
        if (by_blocks && layout.unit_kinds[u] != UnitKind::kGathered) continue;
        most_runs = std::max(most_runs, r.runs[u].size());
        largest_full = std::max(largest_full, full_layout.unit_size(r.source[u]));
        largest_local = std::max(largest_local, by_blocks ? 0 : layout.unit_size(u));
    }
    float *full_unit, *local_unit = nullptr;
    CopyRun* device_runs = nullptr;
    cudaCheck(cudaMalloc(&full_unit, largest_full * sizeof(float)));
    if (!by_blocks) {
        cudaCheck(cudaMalloc(&local_unit, largest_local * sizeof(float)));
        cudaCheck(cudaMalloc(&device_runs, most_runs * sizeof(CopyRun)));
    }
    for (int u = 0; u < layout.num_units(); u++) {
        if (by_blocks) {
            if (layout.tp != 1 || full_layout.unit_size(r.source[u]) != layout.unit_size(u)) die("internal: the NF4 base's units are whole units");
            if (layout.unit_kinds[u] == UnitKind::kGathered) {
                init_unit(model, seed, r.source[u], full_unit);
                model.zero->set_unit(u, full_unit);
            } else {
                for (size_t first = 0; first < layout.unit_size(u); first += largest_full) {
                    const size_t n = std::min(largest_full, layout.unit_size(u) - first);
                    init_unit_range(model, seed, r.source[u], first, n, full_unit);
                    convert_precision(model.zero->unit_params(u) + first, full_unit, (long)n, stream);
                    cudaCheck(cudaStreamSynchronize(stream));  // before the next piece overwrites the buffer
                }
            }
            cudaCheck(cudaStreamSynchronize(stream));
            continue;
        }
        init_unit(model, seed, r.source[u], full_unit);
        cudaCheck(cudaMemsetAsync(local_unit, 0, layout.unit_size(u) * sizeof(float), stream));  // the padding
        cudaCheck(cudaMemcpyAsync(device_runs, r.runs[u].data(), r.runs[u].size() * sizeof(CopyRun), cudaMemcpyHostToDevice, stream));
        copy_runs(local_unit, full_unit, device_runs, (int)r.runs[u].size(), stream);
        model.zero->set_unit(u, local_unit);
        cudaCheck(cudaStreamSynchronize(stream));  // before the next unit overwrites the buffers
    }
    for (void* p : {(void*)full_unit, (void*)local_unit, (void*)device_runs})
        if (p) cudaCheck(cudaFree(p));
}
