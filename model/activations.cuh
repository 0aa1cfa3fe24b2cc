// The model's activations: a block's buffers, a micro-batch's activation set on a chunk of blocks, and the memory
// they are carved from, in the order and the amounts that activation_counts gives the memory plan (memory_plan.h),
// so that plan and allocation cannot drift apart (the model's allocate() checks that every element was taken).
// defines: LayerActivations, ActivationSet, ActivationMemory
#pragma once
#include <array>
#include <vector>
#include "../kernels/common.cuh"
#include "config.h"       // defines: ModelConfig
#include "memory_plan.h"  // defines: ActivationPlan, activation_width, activation_shared, Recompute levels

template <typename floatX>
struct LayerActivations {
    floatX *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    float* lse;  // attention's log-sum-exp per (b, head, t): all the backward needs besides q, k, v and the output
};

// One micro-batch's activations on one chunk of blocks (all of them, without pipeline parallelism): what its
// backward needs, kept from its forward. A pipeline stage has one set per micro-batch in flight on each chunk.
template <typename floatX>
struct ActivationSet {
    std::vector<LayerActivations<floatX>> layers;  // the chunk's blocks
    floatX* input = nullptr;      // the residual stream entering the chunk: the embeddings' output, or received
    floatX* dresidual = nullptr;  // d(loss)/d(residual stream), from the chunk's end back to its input
    int* tokens = nullptr;        // the micro-batch's inputs, targets and encoder buckets (device)
    int num_buckets = 0;
    // the last forward was one for a backward with the FP8 inputs cast by their producers
    // (LinearLayers::fp8_inputs_from_producers): the buffers of ln1, ln2 and fch_gelu hold FP8 copies, not bf16 values
    bool fp8_producer_copies = false;
};

// A rank's activation memory: the elements of the model's precision and the fp32 statistics that activation_counts
// counts, handed out in its order (take, take_floats), and every set's tokens.
template <typename floatX>
struct ActivationMemory {
    floatX* elements = nullptr;
    float* statistics = nullptr;
    int* tokens = nullptr;
    size_t element_count = 0, statistic_count = 0, elements_taken = 0, statistics_taken = 0;

    ActivationMemory() = default;
    ActivationMemory(const ActivationMemory&) = delete;
    ActivationMemory& operator=(const ActivationMemory&) = delete;
    ~ActivationMemory() {
        for (void* p : {(void*)elements, (void*)statistics, (void*)tokens})
            if (p != nullptr) cudaFree(p);
    }
    void allocate(size_t x_elements, size_t stat_elements, size_t token_ints) {
        element_count = x_elements;
        statistic_count = stat_elements;
        elements_taken = statistics_taken = 0;
        cudaCheck(cudaMalloc(&elements, x_elements * sizeof(floatX)));
        cudaCheck(cudaMalloc(&statistics, stat_elements * sizeof(float)));
        cudaCheck(cudaMalloc(&tokens, token_ints * sizeof(int)));
    }
    floatX* take(size_t n) {
        floatX* p = elements + elements_taken;
        elements_taken += n;
        return p;
    }
    float* take_floats(size_t n) {
        float* p = statistics + statistics_taken;
        statistics_taken += n;
        return p;
    }
    bool all_taken() const { return elements_taken == element_count && statistics_taken == statistic_count; }

    // The activation sets of plan `ap` (sets[k][slot]: chunk k's, one per micro-batch in flight) for micro-batches of
    // B x T rows, on a rank of `tp` tensor-parallel ones, `split` = tp under sequence parallelism (else 1), each with
    // `token_ints` of the tokens. The buffers that --recompute refills are one for all layers and sets.
    std::vector<std::vector<ActivationSet<floatX>>> sets(const ModelConfig& c, int B, int T, int tp, int split, int recompute,
                                                         const ActivationPlan& ap, size_t token_ints) {
        const size_t N = (size_t)B * T, C = c.channels, NH = c.num_heads / tp;  // this rank's heads
        const size_t Nr = N / split;  // rows of the LayerNorm and residual regions on this rank
        const std::array<size_t, 8> width = activation_width(c, tp, split);
        floatX* shared[8] = {};
        for (int i = 0; i < 8; i++)
            if (activation_shared(recompute, i)) shared[i] = take(N * width[i]);
        float* shared_lse = recompute >= kRecomputeBlock ? take_floats((size_t)B * NH * T) : nullptr;
        std::vector<std::vector<ActivationSet<floatX>>> chunks(ap.chunk_blocks.size());
        int* set_tokens = tokens;
        for (size_t k = 0; k < chunks.size(); k++) {
            chunks[k].resize(ap.slots[k]);
            for (ActivationSet<floatX>& set : chunks[k]) {
                set.layers.resize(ap.chunk_blocks[k]);
                for (LayerActivations<floatX>& a : set.layers) {
                    floatX** buffers[8] = {&a.ln1, &a.qkv, &a.atty, &a.residual2, &a.ln2, &a.fch, &a.fch_gelu, &a.residual3};
                    for (int i = 0; i < 8; i++) *buffers[i] = shared[i] ? shared[i] : take(N * width[i]);
                    a.ln1_mean = take_floats(Nr); a.ln1_rstd = take_floats(Nr); a.ln2_mean = take_floats(Nr); a.ln2_rstd = take_floats(Nr);
                    a.lse = shared_lse ? shared_lse : take_floats((size_t)B * NH * T);
                }
                set.input = take(Nr * C);
                set.dresidual = take(Nr * C);
                set.tokens = set_tokens;
                set_tokens += token_ints;
            }
        }
        return chunks;
    }
};
