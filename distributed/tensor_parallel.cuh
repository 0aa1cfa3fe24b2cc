// Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM"; Megatron-LM's tensor_parallel/): the collectives
// that connect the model's split layers, named after the paper's f and g operators, and the vocabulary-parallel
// cross-entropy. Which slice of each tensor a rank holds is ParameterLayout's (model/config.h); the forward and
// backward that call these are Transformer's.
//
// A transformer block on tp ranks: the LayerNorms and the residual stream are replicated (every rank holds the
// whole (N, C) activations); qkv and fc are column-parallel (each rank computes its heads / its 4C/tp hidden
// units), attention and the GELU stay local, attn-proj and fc-proj are row-parallel (each rank multiplies its
// slice of the hidden dimension and holds a partial (N, C) sum). Two operators join them:
//   f, before a column-parallel product: identity in the forward; in the backward, all-reduce (sum) of the
//      input gradient, since each rank's product contributes the gradient of its own columns.
//   g, after a row-parallel product: all-reduce (sum) of the partial outputs in the forward; identity in the
//      backward (every rank needs the whole output gradient, which it already has).
// Row-parallel biases are added once: tensor-parallel rank 0's product adds them before g's sum, which is the
// same sum as adding them after it and costs no extra pass. Their gradients, like those of every replicated
// tensor, come out identical on all ranks from the replicated output gradient.
// The embedding is vocabulary-parallel (each rank looks up the tokens of its vocabulary range, the others give
// zero rows, and g sums them), and so is the LM head, whose logits are never gathered: the cross-entropy
// all-reduces per-row scalars only (the maximum, the sum of exponentials and the target's logit).
// defines: TensorParallel
#pragma once
#include "../kernels/classifier.cuh"
#include "mesh.h"
#include "process_group.h"  // defines: ProcessGroup, ncclCheck
#include "nccl.h"           // defines: nccl_type

template <typename floatX>
struct TensorParallel {
    Communicator group;   // the tensor-parallel group; size 1: every operator is a no-op
    float* ce_stats = nullptr;  // cross-entropy: (3N) row maximum | sum of exponentials | target logit, + (N) global maximum
    cudaStream_t comm = nullptr;  // f's backward, overlapped with the weight gradients
    cudaEvent_t input_grad_ready = nullptr, input_grad_done = nullptr;

    int rank() const { return group.rank; }

    void allocate(size_t rows) {
        if (group.size == 1) return;
        cudaCheck(cudaMalloc(&ce_stats, 4 * rows * sizeof(float)));
        cudaCheck(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&input_grad_ready, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&input_grad_done, cudaEventDisableTiming));
    }
    ~TensorParallel() {
        if (ce_stats) cudaFree(ce_stats);
        if (input_grad_ready) cudaEventDestroy(input_grad_ready);
        if (input_grad_done) cudaEventDestroy(input_grad_done);
        if (comm) cudaStreamDestroy(comm);
    }

    // Sequence parallelism (Korthikanti et al. 2022): the LayerNorm and residual regions hold 1/tp of the rows
    // (of the B*T) on each rank, which cuts their activations by tp. f's forward then all-gathers the rows (the
    // column-parallel product needs all of them) and g's backward does the same for the gradient; g's forward
    // reduce-scatters (the partial sums summed, each rank keeping its rows) and so does f's backward. The same
    // bytes cross as in an all-reduce, which is a reduce-scatter followed by an all-gather. The LayerNorms'
    // parameter gradients then cover each rank's rows only, and are summed over the group (sum_over_ranks).
    // `count` is one rank's rows x C; full = tp x count; in place when local == full + rank x count.
    void all_gather_rows(const floatX* local, floatX* full, size_t count, cudaStream_t stream) const {
        ncclCheck(ncclAllGather(local, full, count, nccl_type<floatX>(), group.comm, stream));
    }
    void reduce_scatter_rows(const floatX* full, floatX* local, size_t count, cudaStream_t stream) const {
        ncclCheck(ncclReduceScatter(full, local, count, nccl_type<floatX>(), ncclSum, group.comm, stream));
    }
    void sum_over_ranks(floatX* x, size_t n, cudaStream_t stream) const { all_reduce(x, n, stream); }

    // The operators as the model calls them, each pair named once, the forward beside the backward (Megatron-LM's
    // mappings.py). `split`: tp under sequence parallelism, else 1; `n`: one rank's rows x C of the LayerNorm and
    // residual regions (all B*T rows without sequence parallelism).
    // f (copy to the tensor-parallel region), forward: the input of a column-parallel product, whole: x itself, or
    // under sequence parallelism every rank's rows gathered into `gathered`. Its backward: begin_f_backward below.
    const floatX* f_forward(const floatX* x, floatX* gathered, size_t n, int split, cudaStream_t stream) const {
        if (split == 1) return x;
        all_gather_rows(x, gathered, n, stream);
        return gathered;
    }
    // g (reduce from the tensor-parallel region), forward: the row-parallel product's partial outputs (all B*T rows
    // in `partial`) summed over the ranks: in place; under sequence parallelism reduce-scattered into this rank's
    // rows, `rows` when given, else its slice of `partial`. Returns where the sum is.
    const floatX* g_forward(floatX* partial, floatX* rows, size_t n, int split, cudaStream_t stream) const {
        if (split == 1) {
            all_reduce(partial, n, stream);
            return partial;
        }
        floatX* mine = rows != nullptr ? rows : partial + rank() * n;
        reduce_scatter_rows(partial, mine, n, stream);
        return mine;
    }
    // g, backward: the gradient of a row-parallel product's output, whole: dy itself (the identity), or under
    // sequence parallelism every rank's rows gathered into `gathered`.
    const floatX* g_backward(const floatX* dy, floatX* gathered, size_t n, int split, cudaStream_t stream) const {
        return f_forward(dy, gathered, n, split, stream);
    }
    // f in the backward, overlapped with the weight gradients as Megatron-LM does: begin_f_backward starts the sum
    // of a column-parallel product's input gradient dx (each rank's partial) on the group's own stream as soon as
    // `stream` has produced it, the caller enqueues the weight-gradient product on `stream`, and end_f_backward
    // makes `stream` wait for the sum. `n`: the elements of the result, all of dx (an all-reduce, in place) or,
    // under sequence parallelism (`scatter`), this rank's rows (a reduce-scatter into them). Returns where the
    // result will be.
    floatX* begin_f_backward(floatX* dx, size_t n, bool scatter, cudaStream_t stream) const {
        if (group.size == 1) return dx;
        cudaCheck(cudaEventRecord(input_grad_ready, stream));
        cudaCheck(cudaStreamWaitEvent(comm, input_grad_ready));
        floatX* result = scatter ? dx + group.rank * n : dx;
        if (scatter) ncclCheck(ncclReduceScatter(dx, result, n, nccl_type<floatX>(), ncclSum, group.comm, comm));
        else ncclCheck(ncclAllReduce(dx, dx, n, nccl_type<floatX>(), ncclSum, group.comm, comm));
        cudaCheck(cudaEventRecord(input_grad_done, comm));
        return result;
    }
    void end_f_backward(cudaStream_t stream) const {
        if (group.size > 1) cudaCheck(cudaStreamWaitEvent(stream, input_grad_done));
    }

    // Losses of the vocabulary-parallel LM head: logits (N, Vl) hold this rank's columns
    // [rank * Vl, (rank + 1) * Vl) of the padded vocabulary Vp = tp * Vl; losses (N) come out the same on every
    // rank; with dloss != 0 the logits are replaced by their gradient, as fused_classifier does with tp = 1.
    void cross_entropy(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vl,
                       cudaStream_t stream) const {
        if (group.size == 1) {
            fused_classifier(logits, losses, targets, dloss, N, V, Vl, stream);
            return;
        }
        float* global_max = ce_stats + 3 * (size_t)N;
        const int vocab_begin = group.rank * Vl;
        vocab_parallel_stats(logits, ce_stats, targets, N, vocab_begin, Vl, V, stream);
        cudaCheck(cudaMemcpyAsync(global_max, ce_stats, N * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        ncclCheck(ncclAllReduce(global_max, global_max, N, ncclFloat32, ncclMax, group.comm, stream));
        vocab_parallel_rescale(ce_stats, global_max, N, stream);
        ncclCheck(ncclAllReduce(ce_stats + N, ce_stats + N, 2 * (size_t)N, ncclFloat32, ncclSum, group.comm, stream));
        vocab_parallel_loss(logits, losses, targets, ce_stats, global_max, dloss, N, vocab_begin, Vl, V, stream);
    }

    // Every rank's `count` values of `send` into `receive` (group size x count), in rank order: e.g. a row of
    // logits, whose columns are spread over the ranks, made whole for sampling.
    void all_gather(const floatX* send, floatX* receive, size_t count, cudaStream_t stream) const {
        if (group.size > 1) ncclCheck(ncclAllGather(send, receive, count, nccl_type<floatX>(), group.comm, stream));
        else cudaCheck(cudaMemcpyAsync(receive, send, count * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
    }

    // Every rank's `local` (fp32 on the host, the same length on every rank), in rank order. Through the device
    // in chunks of at most 64 MB per rank, so that no GPU ever holds the whole model; each chunk is waited for
    // within pg's deadline. A collective of the group; keep = false: this rank only sends, and gets nothing back.
    std::vector<std::vector<float>> all_gather_host(const std::vector<float>& local, cudaStream_t stream, const ProcessGroup& pg,
                                                    bool keep = true) const {
        if (group.size == 1) return keep ? std::vector<std::vector<float>>{local} : std::vector<std::vector<float>>{};
        const size_t n = local.size(), chunk = std::max<size_t>(1, std::min(n, (size_t)1 << 24));
        const int ranks = group.size;
        std::vector<std::vector<float>> all(keep ? ranks : 0, std::vector<float>(n));
        float *send, *receive, *host;
        cudaCheck(cudaMalloc(&send, chunk * sizeof(float)));
        cudaCheck(cudaMalloc(&receive, chunk * ranks * sizeof(float)));
        cudaCheck(cudaMallocHost(&host, chunk * ranks * sizeof(float)));  // pinned: the copy does not block the host
        for (size_t offset = 0; offset < n; offset += chunk) {
            const size_t count = std::min(chunk, n - offset);
            cudaCheck(cudaMemcpyAsync(send, local.data() + offset, count * sizeof(float), cudaMemcpyHostToDevice, stream));
            ncclCheck(ncclAllGather(send, receive, count, ncclFloat32, group.comm, stream));
            if (keep) cudaCheck(cudaMemcpyAsync(host, receive, count * ranks * sizeof(float), cudaMemcpyDeviceToHost, stream));
            pg.synchronize(stream);  // also before the next chunk overwrites `send`
            if (keep)
                for (int q = 0; q < ranks; q++) std::copy(host + q * count, host + (q + 1) * count, all[q].begin() + offset);
        }
        cudaCheck(cudaFree(send));
        cudaCheck(cudaFree(receive));
        cudaCheck(cudaFreeHost(host));
        return all;
    }

private:
    void all_reduce(floatX* x, size_t n, cudaStream_t stream) const {
        if (group.size > 1) ncclCheck(ncclAllReduce(x, x, n, nccl_type<floatX>(), ncclSum, group.comm, stream));
    }
};
