// The loss a run reports: each rank's per-row losses summed over the forwards of a step (or of an evaluation),
// gathered from every data-parallel rank and averaged on the host in a fixed order (over every row, or, with masked
// data, over the targets that count: count_targets()), and the flag that makes a step
// whose rows hold a non-finite loss skip its update (ZeroOptimizer::step reads it). The gathering also carries each
// rank's stop vote (a stop signal, distributed/stop_signals.h), so that the step's own collectives tell every rank
// whether any asked to stop. Computing the per-row losses is the classifier's (kernels/classifier.cuh, through the
// model's head).
// defines: LossSums
#pragma once
#include <algorithm>
#include "../kernels/common.cuh"
#include "../kernels/classifier.cuh"       // defines: accumulate_losses
#include "../kernels/global_norm.cuh"      // defines: nonfinite_flag, set_scalar, sum_strided
#include "../distributed/process_group.h"  // defines: ProcessGroup (synchronize: a deadline-guarded wait)
#include "../distributed/mesh.h"           // defines: ProcessMesh

struct LossSums {
    // This rank's slice of `all` is `mine`: its rows' sums, then its stop vote (0, or 1 when it asks to stop); `all`
    // holds every data-parallel rank's slice once request() has gathered them; `host` is its pinned copy (a copy into
    // pageable memory blocks until the stream drains, which a stuck collective would make an unbounded wait).
    float *all = nullptr, *mine = nullptr, *host = nullptr;
    float* nonfinite = nullptr;   // 0, or NaN when the rows request() gathered hold a non-finite loss
    float* stop_votes = nullptr;  // the votes request() gathered, summed: > 0 when any of those ranks asks to stop
    bool requested = false;       // request() ran since the last take_mean()
    int forwards = 0;             // forwards summed since the last take_mean()
    bool masked = false;          // count_targets() ran since the last take_mean()
    uint64_t counted_targets = 0;  // what it counted: the divisor of take_mean()

    static size_t slice(size_t rows) { return rows + 1; }  // a rank's rows and its vote

    // d(summed loss)/d(row loss) for a micro-step of B x T rows: the mean over all rows of all micro-steps, times the
    // loss scale (fp16; 1 otherwise). Each rank takes the mean of its own rows; the gradient reduction averages over ranks.
    static float mean_gradient(float scale, int B, int T, int grad_accum_steps) { return scale / ((float)B * T * grad_accum_steps); }
    // The same for masked data: the mean over the step's targets that count, `counted_targets` over all `ranks`
    // data-parallel ranks (the gradient reduction's mean over ranks divides by their number again). With every target
    // counted this is mean_gradient bitwise: counted / ranks is B*T*grad_accum_steps exactly.
    static float counted_mean_gradient(float scale, uint64_t counted_targets, int ranks) {
        return scale / (float)((double)counted_targets / ranks);
    }

    // `rows`: one forward's rows on this rank (B*T).
    void allocate(size_t rows, const ProcessMesh& mesh) {
        const size_t dp = mesh.data.size;  // the slices of every data-parallel rank (tensor-parallel ranks share theirs)
        for (float** scalar : {&nonfinite, &stop_votes}) {
            cudaCheck(cudaMalloc(scalar, sizeof(float)));
            cudaCheck(cudaMemset(*scalar, 0, sizeof(float)));
        }
        cudaCheck(cudaMalloc(&all, dp * slice(rows) * sizeof(float)));
        cudaCheck(cudaMemset(all, 0, dp * slice(rows) * sizeof(float)));
        mine = all + mesh.data.rank * slice(rows);
        cudaCheck(cudaMallocHost(&host, dp * slice(rows) * sizeof(float)));
    }
    ~LossSums() {
        for (float* p : {all, nonfinite, stop_votes})
            if (p != nullptr) cudaFree(p);
        if (host != nullptr) cudaFreeHost(host);
    }

    // Adds a forward's per-row losses; a stage without the head passes none (its sums stay zero).
    void accumulate(const float* losses, int rows, cudaStream_t stream) {
        if (losses != nullptr) accumulate_losses(mine, losses, rows, stream);
        forwards++;
    }
    // Masked data (ignored targets' rows hold a loss of 0): the mean is over the targets that count in the forwards
    // since the last take_mean(), over all data-parallel ranks (DataLoader::counted_targets_ahead), not over the rows.
    void count_targets(uint64_t counted) {
        masked = true;
        counted_targets += counted;
    }
    // This rank asks to stop after the step: its vote goes out with the next request().
    void vote_stop(size_t rows, cudaStream_t stream) { set_scalar(mine + rows, 1.0f, stream); }
    // Enqueues the gathering of every rank's sums and votes (a collective: all ranks call it), their copy to the host
    // and the clearing of this rank's slice, without waiting: the training step asks for them before the optimizer
    // step and reads them after its one wait, so no second round trip between ranks follows it. The data-parallel
    // group's rows: a tensor-parallel group computes the same losses on every one of its ranks (its votes meet in
    // the gradient norm's reduction, ZeroOptimizer::step).
    void request(const ProcessMesh& mesh, size_t rows, cudaStream_t stream) {
        const size_t n = slice(rows), dp = mesh.data.size;
        // the last pipeline stage computed the losses: summed over the stages, whose other sums are zero (and the
        // stages' votes with them)
        if (mesh.pipeline.size > 1) ncclCheck(ncclAllReduce(mine, mine, n, ncclFloat32, ncclSum, mesh.pipeline.comm, stream));
        if (dp > 1) ncclCheck(ncclAllGather(mine, all, n, ncclFloat32, mesh.data.comm, stream));
        cudaCheck(cudaMemcpyAsync(host, all, dp * n * sizeof(float), cudaMemcpyDeviceToHost, stream));
        nonfinite_flag(nonfinite, all, (long)(dp * n), stream);  // every rank: the same rows, the same flag (the votes are finite)
        sum_strided(stop_votes, all + rows, (int)dp, (long)n, stream);
        cudaCheck(cudaMemsetAsync(mine, 0, n * sizeof(float), stream));
        requested = true;
    }
    // Mean loss over all ranks' rows (or counted targets) of the forwards accumulated since the last call (e.g. the
    // micro-steps of one step). Synchronises; the rows are summed in double on the host in rank order, so the value does not depend
    // on a reduction order.
    float take_mean(const ProcessGroup& pg, const ProcessMesh& mesh, size_t rows, cudaStream_t stream) {
        if (!requested) request(mesh, rows, stream);
        pg.synchronize(stream);
        requested = false;
        const size_t total_rows = (size_t)mesh.data.size * rows;
        double total = 0.0;
        for (size_t r = 0; r < (size_t)mesh.data.size; r++)
            for (size_t i = 0; i < rows; i++) total += host[r * slice(rows) + i];
        const double divisor = masked ? (double)counted_targets : (double)total_rows * std::max(1, forwards);
        const float mean = (float)(total / divisor);
        forwards = 0;
        masked = false;
        counted_targets = 0;
        return mean;
    }
};
