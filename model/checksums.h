// Checksums of the parameters at the end of a run with several ranks: the ranks of a data-parallel group must end
// with the same parameters, and the tensors that tensor parallelism replicates (and the pipeline's two copies of the
// tied token embedding) must agree on every rank; each rank prints its checksums on stderr and the tests compare
// them. Reading the parameters is the optimizer's (ZeroOptimizer::for_each_unit_host).
// defines: ParameterChecksums, print_parameter_checksums
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "../kernels/die.h"          // defines: die
#include "../kernels/common.cuh"     // defines: splitmix64, LayoutMask
#include "../distributed/mesh.h"     // defines: MeshShape, ProcessMesh
#include "config.h"                  // defines: ParameterLayout

// Checksums of a rank's parameters, fed in index order a unit at a time (the whole model need not be in host
// memory): of all of them, of those that tensor parallelism replicates (not in `split`), and of the token
// embedding's range [wte_begin, wte_end). All and replicated hash chunks of 2^20 elements on all cores and chain
// the chunks' hashes in order: the same values for any thread count and any cut into units (on one thread about
// 3.6 ns an element: 6 s at the end of a 6.6B GPT's run at tp 4, 24 s for a whole 6.6B model).
struct ParameterChecksums {
    static constexpr size_t kChunk = (size_t)1 << 20;
    LayoutMask split;  // a copy: callers pass split_mask()'s temporary
    size_t wte_begin = 0, wte_end = 0;
    uint64_t all = 0, replicated = 0, wte = 0;
    size_t next = 0;                               // index of the next element
    uint64_t chunk_all = 0, chunk_replicated = 0;  // the running hashes of the chunk `next` is in

    ParameterChecksums(const LayoutMask& split_mask, size_t wte_from, size_t wte_to) : split(split_mask), wte_begin(wte_from), wte_end(wte_to) {}
    static uint64_t mixed(uint64_t h, float value) {
        uint32_t bits;
        memcpy(&bits, &value, 4);
        return splitmix64(h ^ bits);
    }
    void add(size_t index, float value, uint64_t* h, uint64_t* r) const {
        *h = mixed(*h, value);
        if (!split.contains((long)index)) *r = mixed(*r, value);
    }
    void chain(uint64_t h, uint64_t r) {
        all = splitmix64(all ^ h);
        replicated = splitmix64(replicated ^ r);
    }
    // values[i] is element offset + i; offset must be where the last feed ended.
    void feed(size_t offset, const float* values, size_t n) {
        if (offset != next) die("parameter checksums: a unit at " + std::to_string(offset) + ", expected the next at " + std::to_string(next));
        for (size_t i = std::max(offset, wte_begin); i < std::min(offset + n, wte_end); i++) wte = mixed(wte, values[i - offset]);
        size_t i = 0;
        for (; i < n && next % kChunk != 0; i++, next++) {  // the open chunk's rest
            add(next, values[i], &chunk_all, &chunk_replicated);
            if ((next + 1) % kChunk == 0) {
                chain(chunk_all, chunk_replicated);
                chunk_all = chunk_replicated = 0;
            }
        }
        const size_t whole = (n - i) / kChunk;  // whole chunks, on all cores
        std::vector<uint64_t> all_of(whole), replicated_of(whole);
#pragma omp parallel for schedule(static)
        for (long c = 0; c < (long)whole; c++) {
            uint64_t h = 0, r = 0;
            for (size_t k = i + c * kChunk; k < i + (c + 1) * kChunk; k++) add(next + k - i, values[k], &h, &r);
            all_of[c] = h;
            replicated_of[c] = r;
        }
        for (size_t c = 0; c < whole; c++) chain(all_of[c], replicated_of[c]);
        i += whole * kChunk;
        next += whole * kChunk;
        for (; i < n; i++, next++) add(next, values[i], &chunk_all, &chunk_replicated);  // opens the next chunk
    }
    void finish() {
        if (next % kChunk != 0) chain(chunk_all, chunk_replicated);
        chunk_all = chunk_replicated = 0;
    }
};

// Feeds this rank's parameters (a unit at a time, on the host) and prints their checksums on stderr.
template <typename Model>
void print_parameter_checksums(Model& model, int rank, const MeshShape& shape, const ProcessMesh& mesh) {
    // the two copies of the tied token embedding must agree (a LoRA run's trained parameters are its adapters)
    const bool tied_copy = shape.pp > 1 && model.layout.part.has_wte() && !model.lora.enabled();
    ParameterChecksums sums(model.layout.split_mask(), tied_copy ? model.layout.wte : 0, tied_copy ? model.layout.wte_end() : 0);
    model.trained().for_each_unit_host([&](size_t offset, const float* values, size_t n) { sums.feed(offset, values, n); });
    sums.finish();
    fprintf(stderr, "rank %d parameter checksum %016llx tensor-parallel rank %d replicated checksum %016llx\n", rank,
            (unsigned long long)sums.all, mesh.tensor.rank, (unsigned long long)sums.replicated);
    if (tied_copy)
        fprintf(stderr, "rank %d pipeline stage %d tensor-parallel rank %d data-parallel rank %d wte checksum %016llx\n", rank, mesh.pipeline.rank,
                mesh.tensor.rank, mesh.data.rank, (unsigned long long)sums.wte);
}
