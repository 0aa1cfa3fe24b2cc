// Batches from the host to the GPU: a micro-batch's inputs, targets and the encoder's token grouping go through two
// pinned staging buffers into an activation set's tokens, so the host prepares the next micro-batch while the GPU
// still works on the current one. Reading the batches is the DataLoader's; using the tokens is the model's.
// defines: BatchStaging
#pragma once
#include <cstring>
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/encoder.cuh"          // defines: encoder_buckets
#include "../kernels/classifier.cuh"       // defines: kIgnoredTarget
#include "../distributed/process_group.h"  // defines: ProcessGroup (wait_event: a deadline-guarded wait)

struct BatchStaging {
    int* buffer[2] = {nullptr, nullptr};
    cudaEvent_t free[2] = {nullptr, nullptr};
    int index = 0;
    std::vector<int> bucket_counts;

    // A micro-batch of N rows: inputs, targets, buckets (at most 3N + 1 ints).
    static size_t ints(size_t N) { return N * 5 + 1; }
    void allocate(size_t N) {
        for (int i = 0; i < 2; i++) {
            cudaCheck(cudaMallocHost(&buffer[i], ints(N) * sizeof(int)));
            cudaCheck(cudaEventCreateWithFlags(&free[i], cudaEventDisableTiming));
        }
    }
    ~BatchStaging() {
        for (int i = 0; i < 2; i++) {
            if (buffer[i] != nullptr) cudaFreeHost(buffer[i]);
            if (free[i] != nullptr) cudaEventDestroy(free[i]);
        }
    }
    // Copies N inputs and targets (host int32; targets may be null) and the encoder's grouping of the inputs into
    // `tokens` (device) on `stream`; returns the number of encoder buckets (0 without targets). Does not wait for
    // the GPU, only for the copy that last used this staging buffer.
    int upload(const int* inputs, const int* targets, size_t N, int vocab_size, int* tokens, const ProcessGroup& pg, cudaStream_t stream) {
        for (size_t i = 0; i < N; i++)
            if (inputs[i] < 0 || inputs[i] >= vocab_size || (targets && (targets[i] < kIgnoredTarget || targets[i] >= vocab_size)))
                die("token id out of range [0, " + std::to_string(vocab_size) + ") in the batch (a target may also be " +
                    std::to_string(kIgnoredTarget) + ": not counted)");
        int* s = buffer[index];
        pg.wait_event(free[index]);  // bounded: a failed peer cannot hang this wait
        memcpy(s, inputs, N * sizeof(int));
        if (targets) memcpy(s + N, targets, N * sizeof(int));
        else memset(s + N, 0, N * sizeof(int));
        // the grouping is for the embeddings' backward, which needs targets: none for a forward alone (sampling),
        // where the three passes over the vocabulary would cost more than the forward of one token
        const int num_buckets = targets ? encoder_buckets(inputs, (int)N, vocab_size, s + 2 * N, bucket_counts) : 0;
        const size_t ints = 2 * N + 2 * num_buckets + 1 + N;
        cudaCheck(cudaMemcpyAsync(tokens, s, ints * sizeof(int), cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaEventRecord(free[index], stream));
        index ^= 1;
        return num_buckets;
    }
};
