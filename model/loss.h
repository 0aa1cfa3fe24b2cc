// The loss a run reports: each rank's per-row losses summed over the forwards of a step (or of an evaluation),
// gathered from every data-parallel rank and averaged on the host in a fixed order, and the flag that makes a step
// whose rows hold a non-finite loss skip its update (ZeroOptimizer::step reads it). Computing the per-row losses is
// the classifier's (kernels/classifier.cuh, through the model's head).
// defines: LossSums
#pragma once
#include <algorithm>
#include "../kernels/common.cuh"
#include "../kernels/classifier.cuh"       // defines: accumulate_losses
#include "../kernels/global_norm.cuh"      // defines: nonfinite_flag
#include "../distributed/process_group.h"  // defines: ProcessGroup (synchronize: a deadline-guarded wait)
#include "../distributed/mesh.h"           // defines: ProcessMesh

struct LossSums {
    // This rank's rows are `mine`, slice `rank` of `all`, which holds every data-parallel rank's rows once request()
    // has gathered them; `host` is its pinned copy (a copy into pageable memory blocks until the stream drains, which
    // a stuck collective would make an unbounded wait).
    float *all = nullptr, *mine = nullptr, *host = nullptr;
    float* nonfinite = nullptr;  // 0, or NaN when the rows request() gathered hold a non-finite loss
    bool requested = false;      // request() ran since the last take_mean()
    int forwards = 0;            // forwards summed since the last take_mean()

    // `rows`: one forward's rows on this rank (B*T).
    void allocate(size_t rows, const ProcessMesh& mesh) {
        const size_t dp = mesh.data.size;  // the rows of every data-parallel rank (tensor-parallel ranks share theirs)
        cudaCheck(cudaMalloc(&nonfinite, sizeof(float)));
        cudaCheck(cudaMemset(nonfinite, 0, sizeof(float)));
        cudaCheck(cudaMalloc(&all, dp * rows * sizeof(float)));
        cudaCheck(cudaMemset(all, 0, dp * rows * sizeof(float)));
        mine = all + mesh.data.rank * rows;
        cudaCheck(cudaMallocHost(&host, dp * rows * sizeof(float)));
    }
    ~LossSums() {
        for (float* p : {all, nonfinite})
            if (p != nullptr) cudaFree(p);
        if (host != nullptr) cudaFreeHost(host);
    }

    // Adds a forward's per-row losses; a stage without the head passes none (its sums stay zero).
    void accumulate(const float* losses, int rows, cudaStream_t stream) {
        if (losses != nullptr) accumulate_losses(mine, losses, rows, stream);
        forwards++;
    }
    // Enqueues the gathering of every rank's sums (a collective: all ranks call it), their copy to the host and the
    // clearing of the sums, without waiting: the training step asks for them before the optimizer step and reads them
    // after its one wait, so no second round trip between ranks follows it. The data-parallel group's rows: a
    // tensor-parallel group computes the same losses on every one of its ranks.
    void request(const ProcessMesh& mesh, size_t rows, cudaStream_t stream) {
        // the last pipeline stage computed the losses: summed over the stages, whose other sums are zero
        if (mesh.pipeline.size > 1) ncclCheck(ncclAllReduce(mine, mine, rows, ncclFloat32, ncclSum, mesh.pipeline.comm, stream));
        if (mesh.data.size > 1) ncclCheck(ncclAllGather(mine, all, rows, ncclFloat32, mesh.data.comm, stream));
        cudaCheck(cudaMemcpyAsync(host, all, mesh.data.size * rows * sizeof(float), cudaMemcpyDeviceToHost, stream));
        nonfinite_flag(nonfinite, all, (long)(mesh.data.size * rows), stream);  // every rank: the same rows, the same flag
        cudaCheck(cudaMemsetAsync(mine, 0, rows * sizeof(float), stream));
        requested = true;
    }
    // Mean loss over all ranks' rows of the forwards accumulated since the last call (e.g. the micro-steps of one
    // step). Synchronises; the rows are summed in double on the host in rank order, so the value does not depend
    // on a reduction order.
    float take_mean(const ProcessGroup& pg, const ProcessMesh& mesh, size_t rows, cudaStream_t stream) {
        if (!requested) request(mesh, rows, stream);
        pg.synchronize(stream);
        requested = false;
        const size_t total_rows = (size_t)mesh.data.size * rows;
        double total = 0.0;
        for (size_t i = 0; i < total_rows; i++) total += host[i];
        const float mean = (float)(total / ((double)total_rows * std::max(1, forwards)));
        forwards = 0;
        return mean;
    }
};
