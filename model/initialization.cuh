// The model's initial parameters (GPT-2's initialisation), drawn on the device unit by unit so that any tensor- and
// pipeline-parallel split makes the same model and no rank holds more than its own part; a model file's values
// instead are read by model_file.h and set by whole_model.cuh. Storing and sharding them is ZeroOptimizer's.
// defines: UnitRuns, unit_runs, init_unit, init_parameters
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

// GPT-2 initialisation of unit u of the whole model (wte, wpe, the blocks, the final norm, an untied LM head) into
// `unit_device` (fp32, the unit's padded size), for both families: N(0, 0.02) weights, residual projections scaled by
// 1/sqrt(2L), zero biases, unit norm weights, zero padded vocabulary rows. Each tensor draws from its own seed (its
// index in the order wte, wpe, then qkvw, attprojw, fcw, fcprojw of each block, then the LM head), so the values
// depend neither on the layout nor on the order in which units are made.
// Units of the whole model (full_layout): a tensor-parallel rank then keeps its slices, so that every tp makes
// the same model.
template <typename floatX>
void init_unit(const Transformer<floatX>& model, uint64_t seed, int u, float* unit_device) {
    const ParameterLayout& layout = model.full_layout;
    const ModelConfig& config = model.config;
    const cudaStream_t stream = model.stream;
    const size_t C = config.channels, V = config.vocab_size, L = config.num_layers;
    const float std = 0.02f, residual_std = 0.02f / sqrtf(2.0f * L);
    const size_t begin = layout.unit_offset(u);
    auto at = [&](size_t offset) { return unit_device + (offset - begin); };
    auto seed_of = [&](uint64_t tensor_id) { return splitmix64(seed * 1000003ull + tensor_id); };
    cudaCheck(cudaMemsetAsync(unit_device, 0, layout.unit_size(u) * sizeof(float), stream));
    if (u == layout.wte_unit) {
        fill_normal(at(layout.wte), V * C, std, seed_of(0), stream);
    } else if (u == layout.wpe_unit) {
        fill_normal(at(layout.wpe), (size_t)config.max_seq_len * C, std, seed_of(1), stream);
    } else if (u == layout.lm_head_unit) {
        fill_normal(at(layout.lm_head), V * C, std, seed_of(2 + 4 * L), stream);
    } else if (u != layout.lnf_unit) {
        const int l = u - layout.first_block_unit;
        const size_t F = config.hidden_units();
        fill_constant(at(layout.tensor(l, LN1W)), C, 1.0f, stream);
        fill_normal(at(layout.tensor(l, QKVW)), (size_t)config.qkv_channels() * C, std, seed_of(2 + 4 * l), stream);
        fill_normal(at(layout.tensor(l, ATTPROJW)), C * C, residual_std, seed_of(3 + 4 * l), stream);
        fill_constant(at(layout.tensor(l, LN2W)), C, 1.0f, stream);
        fill_normal(at(layout.tensor(l, FCW)), config.mlp_inputs() * F * C, std, seed_of(4 + 4 * l), stream);
        fill_normal(at(layout.tensor(l, FCPROJW)), F * C, residual_std, seed_of(5 + 4 * l), stream);
    } else {
        fill_constant(at(layout.lnfw), C, 1.0f, stream);
    }
}

// Unit by unit on the device: each unit this rank holds is drawn whole (a unit of full_layout, so that every
// tensor- and pipeline-parallel split makes the same model), this rank's slices are copied out of it, and
// ZeRO stores them. Nothing passes through the host: a rank neither holds nor draws more than its own
// stage's units (the whole model in host memory on every rank ran a 4-rank 30B GPT out of host memory).
template <typename floatX>
void init_parameters(Transformer<floatX>& model, uint64_t seed) {
    const ParameterLayout &layout = model.layout, &full_layout = model.full_layout;
    const cudaStream_t stream = model.stream;
    const UnitRuns r = unit_runs(layout, full_layout, model.mesh.tensor.rank);
    size_t most_runs = 0, largest_full = 0, largest_local = 0;
    for (int u = 0; u < layout.num_units(); u++) {
        most_runs = std::max(most_runs, r.runs[u].size());
        largest_full = std::max(largest_full, full_layout.unit_size(r.source[u]));
        largest_local = std::max(largest_local, layout.unit_size(u));
    }
    float *full_unit, *local_unit;
    CopyRun* device_runs;
    cudaCheck(cudaMalloc(&full_unit, largest_full * sizeof(float)));
    cudaCheck(cudaMalloc(&local_unit, largest_local * sizeof(float)));
    cudaCheck(cudaMalloc(&device_runs, most_runs * sizeof(CopyRun)));
    for (int u = 0; u < layout.num_units(); u++) {
        init_unit(model, seed, r.source[u], full_unit);
        cudaCheck(cudaMemsetAsync(local_unit, 0, layout.unit_size(u) * sizeof(float), stream));  // the padding
        cudaCheck(cudaMemcpyAsync(device_runs, r.runs[u].data(), r.runs[u].size() * sizeof(CopyRun), cudaMemcpyHostToDevice, stream));
        copy_runs(local_unit, full_unit, device_runs, (int)r.runs[u].size(), stream);
        model.zero->set_unit(u, local_unit);
        cudaCheck(cudaStreamSynchronize(stream));  // before the next unit overwrites the buffers
    }
    for (void* p : {(void*)full_unit, (void*)local_unit, (void*)device_runs}) cudaCheck(cudaFree(p));
}
