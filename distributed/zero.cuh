// ZeRO data parallelism (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models"): which part of the parameters, gradients and optimizer state each of N ranks stores, and the
// NCCL collectives that keep them consistent. With Ψ parameters, bf16 parameters and gradients and 12 bytes
// of fp32 optimizer state (master weights, Adam m and v) per parameter (in fp32 there is no master copy: 4-byte
// parameters and gradients and 8 bytes of Adam state, model/memory_plan.h's zero_states_formula):
//   stage 0: everything replicated; gradients all-reduced.                              16Ψ per GPU
//   stage 1: optimizer state sharded; gradients reduce-scattered into the owner's shard,
//            each rank updates its shard, parameters all-gathered.                       4Ψ + 12Ψ/N
//   stage 2: also gradients: each unit's gradients are reduce-scattered as soon as its backward ends,
//            into a gradient shard; only a two-block ring of full gradients is kept.     2Ψ + 14Ψ/N
//   stage 3: also parameters: each rank stores its shard; a block is all-gathered just before its forward
//            and again before its backward (the next one prefetched on the communication stream while
//            the current one computes) and its full copy dropped after use.            16Ψ/N
// N is the data-parallel degree: the ranks of one data-parallel group of the process mesh (distributed/mesh.h),
// which under tensor parallelism hold the same tensor-parallel slice.
// Units (ParameterLayout): the token embedding, the position embedding, each block, the final LayerNorm (a
// pipeline stage has the ones it holds). Rank r owns the r-th of N equal slices of every unit (units are padded,
// so any parameter count works); its slices of all units are stored back to back. Each unit has a kind
// (UnitKind): the blocks are gathered on use through rings of two; the embeddings (needed at both ends of
// forward and backward) and the final LayerNorm are persistent, with full buffers.
// Gradient accumulation: stages 0 and 1 accumulate full gradients locally and reduce after the last
// micro-step; stages 2 and 3 reduce-scatter every micro-step and add the result into the gradient shard.
// ZeRO-Offload (--offload: the optimizer state, at stage 3 also the parameter shard, on the host; the one-step delayed
// update; the NVMe tier) is distributed/zero_offload.cuh's: this class keeps the device side and hands it the host's.
// defines: ZeroMemory, zero_memory, UnitSource, LossScaler, ZeroStreams, ZeroOptimizer
#pragma once
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/adamw.cuh"
#include "../kernels/global_norm.cuh"
#include "process_group.h"
#include "mesh.h"
#include "nccl.h"                  // defines: nccl_type
#include "shard_plan.h"            // defines: ShardPlan, local_slices
#include "zero_offload.cuh"        // defines: ZeroOffload, Offload, HostMemory (ZeRO-Offload's host and disk tiers)
#include "../model/config.h"       // defines: UnitKind (each parameter unit's kind, with the layout)

struct ZeroMemory {
    size_t parameters = 0, gradients = 0, master_weights = 0, adam_state = 0;
    size_t working = 0;  // of the above, full (unsharded) unit buffers beyond the shards (stages 2 and 3)
    size_t total() const { return parameters + gradients + master_weights + adam_state; }
};

// Bytes per GPU of a ZeroOptimizer for a stage and data-parallel degree `world`, before allocating (the start-up memory
// plan). Under offload the master weights and Adam moments are the host's (ZeroOffload::host_memory), at stage 3 with
// its parameters the parameter shard too.
template <typename floatX>
ZeroMemory zero_memory(const std::vector<size_t>& unit_sizes, const std::vector<UnitKind>& kinds, size_t total, int world, int stage,
                       bool trainable = true, Offload offload = Offload::kNone) {
    if (!trainable) return {total * sizeof(floatX), 0, 0, 0};
    if (world == 1) stage = 0;
    const size_t local = total / world;
    size_t persistent = 0, largest_gathered = 0;
    for (size_t u = 0; u < unit_sizes.size(); u++)
        if (kinds[u] == UnitKind::kGathered) largest_gathered = std::max(largest_gathered, unit_sizes[u]);
        else persistent += unit_sizes[u];
    const size_t ring = 2 * largest_gathered;
    ZeroMemory m;
    const size_t param_shard = offload == Offload::kOptimizerParameters ? 0 : local;
    m.parameters = (stage == 3 ? param_shard + persistent + ring : total) * sizeof(floatX);
    m.gradients = (stage >= 2 ? local + persistent + ring : total) * sizeof(floatX);  // shard + full buffers
    m.working = ((stage == 3) + (stage >= 2)) * (persistent + ring) * sizeof(floatX);
    const size_t optimizer_elements = stage >= 1 ? local : total;
    if (offload != Offload::kNone) return m;
    m.master_weights = !std::is_same<floatX, float>::value ? optimizer_elements * sizeof(float) : 0;
    m.adam_state = 2 * optimizer_elements * sizeof(float);
    return m;
}

// Where a frozen model's gathered units come from instead of an all-gather of shards (the NF4 base of
// model/nf4_base.cuh): set_unit hands it those units' values, and each ring slot is filled by fill() on the
// communication stream, just before the unit's forward and backward as ZeRO-3's gathers are (at any world size).
template <typename floatX>
struct UnitSource {
    virtual ~UnitSource() = default;
    virtual void store(int u, const float* values, cudaStream_t stream) = 0;  // unit u's values: fp32 on the device, padded
    // unit u in compute precision into dst; `whole`: every tensor (reading the parameters), else what the products of
    // the ring's users read (the source may leave out what they read elsewhere)
    virtual void fill(int u, floatX* dst, bool whole, cudaStream_t stream) = 0;
};

// fp16 dynamic loss scaling (a no-op scale of 1 in bf16 and fp32): the loss is multiplied by `scale` before backward;
// a step whose gradients hold inf/NaN is skipped and the scale halved; after `growth_interval` clean steps in a row
// the scale doubles.
struct LossScaler {
    float scale = 1.0f;
    int growth_interval = 2000;
    int clean_steps = 0;
    long skipped_steps = 0;
    void after_step(bool skipped, bool grows) {  // grows: fp16 (the other precisions keep the scale at 1)
        if (skipped) {
            skipped_steps++;
            clean_steps = 0;
            scale = std::max(scale * 0.5f, 1.0f);
        } else if (grows && ++clean_steps >= growth_interval) {
            scale *= 2.0f;
            clean_steps = 0;
        }
    }
};

// A ZeroOptimizer's communication stream and the events that order it with the compute stream (created by create(),
// destroyed with this).
struct ZeroStreams {
    cudaStream_t comm = nullptr;
    cudaEvent_t comm_done = nullptr, persistent_grads_free = nullptr;
    cudaEvent_t ring_params_ready[2] = {}, ring_params_free[2] = {}, ring_grads_free[2] = {};
    std::vector<cudaEvent_t> unit_events;  // unit u: the compute stream's point that its reduction or gather waits for
    std::vector<cudaEvent_t> gathered;     // stages 1/2: unit u's gather after the last step() is done
    ZeroStreams() = default;
    ZeroStreams(const ZeroStreams&) = delete;
    ZeroStreams& operator=(const ZeroStreams&) = delete;
    void create(int units) {
        cudaCheck(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
        for (auto* e : {&comm_done, &persistent_grads_free, &ring_params_ready[0], &ring_params_ready[1], &ring_params_free[0],
                        &ring_params_free[1], &ring_grads_free[0], &ring_grads_free[1]})
            cudaCheck(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
        unit_events.resize(units);
        gathered.resize(units);
        for (std::vector<cudaEvent_t>* events : {&unit_events, &gathered})
            for (auto& e : *events) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    ~ZeroStreams() {
        for (const std::vector<cudaEvent_t>* events : {&unit_events, &gathered})
            for (cudaEvent_t e : *events) cudaEventDestroy(e);
        for (cudaEvent_t e : {comm_done, persistent_grads_free, ring_params_ready[0], ring_params_ready[1], ring_params_free[0],
                              ring_params_free[1], ring_grads_free[0], ring_grads_free[1]})
            if (e) cudaEventDestroy(e);
        if (comm) cudaStreamDestroy(comm);
    }
};

// Parameters, gradients and optimizer state of one rank, and the communication between ranks.
template <typename floatX>
class ZeroOptimizer {
public:
    static constexpr bool kHasMaster = !std::is_same<floatX, float>::value;

    struct StepResult {
        float grad_norm;      // of the unscaled gradients, before clipping
        bool skipped;         // non-finite gradients: no update
        bool stop_requested;  // a rank asked to stop after this step (step()'s stop_votes): every rank learns the same
    };
    LossScaler scaler;  // fp16's dynamic loss scale

    // offsets/sizes/kinds: the padded units of the parameter layout (their sizes divisible by 8 x the data-parallel
    // degree). Sharding and its collectives run over mesh.data; pg bounds every wait. Under tensor parallelism
    // the gradient norm is summed over mesh.tensor too, and `split` says which elements are this rank's own
    // slices: the other tensors are replicated over the tensor-parallel group, and only its rank 0 counts them.
    // Under pipeline parallelism the norm is summed over mesh.pipeline, and the tied units over mesh.embedding.
    // trainable = false: frozen parameters (the base model under LoRA), stored whole: no gradients, no optimizer
    // state, no communication (stages 0-2; a frozen copy is the same on every rank).
    ZeroOptimizer(const std::vector<size_t>& unit_offsets, const std::vector<size_t>& unit_sizes, const std::vector<UnitKind>& unit_kinds,
                  size_t total, const LayoutMask& decay, const ProcessGroup& pg, const ProcessMesh& mesh, int stage, cudaStream_t compute,
                  bool trainable = true, const LayoutMask& split = LayoutMask())
        : plan_(unit_offsets, unit_sizes, mesh.data.size, mesh.data.rank), kinds_(unit_kinds), total_(total), decay_(decay), pg_(pg),
          data_(mesh.data), tensor_(mesh.tensor), pipeline_(mesh.pipeline), embedding_(mesh.embedding), split_(split),
          count_split_only_(mesh.tensor.size > 1 && mesh.tensor.rank != 0),
          stage_(mesh.data.size == 1 || !trainable ? 0 : stage), compute_(compute), trainable_(trainable) {
        for (UnitKind k : kinds_) {
            ordinal_.push_back(k == UnitKind::kGathered ? (int)gathered_units_.size() : -1);
            if (k == UnitKind::kGathered) gathered_units_.push_back((int)ordinal_.size() - 1);
            has_tied_ = has_tied_ || k == UnitKind::kTied || k == UnitKind::kTiedCopy;
            has_tied_copy_ = has_tied_copy_ || k == UnitKind::kTiedCopy;
        }
        if (has_tied_ && stage_ >= 2) die("internal: tied units (pipeline parallelism) at ZeRO stage 2 or 3");
    }

    int stage() const { return stage_; }
    const ShardPlan& plan() const { return plan_; }
    // Frozen parameters only, before allocate(): the gathered units come from `source` (UnitSource), which outlives this.
    void set_unit_source(UnitSource<floatX>* source) {
        if (trainable_ || norm_ != nullptr || streams_.comm != nullptr) die("internal: a unit source serves frozen parameters, set before allocate()");
        source_ = source;
    }

    // ZeRO-Offload, before allocate(): this rank's master weights and Adam moments in pinned host memory, AdamW on the
    // CPU with `cpu_threads` OpenMP threads (0: OpenMP's default team); with kOptimizerParameters the stage-3 parameter
    // shard too. Trained parameters sharded at stage 1-3 or on one rank, the parameters at stage 3 (validate_options
    // refuses the rest: stage 0 on several ranks, pipelines, LoRA, parameters below stage 3 or on one rank).
    // delayed_update: the one-step delayed update (kOptimizer only): step() leaves its update running on a host
    // thread while the next step computes, where delay_update() allows it. offload_dir: the NVMe tier's folder (empty:
    // none; not with the delayed update), where allocate() creates this rank's optimizer file, which carries run_id
    // (model/run_identity.h).
    void set_offload(Offload offload, int cpu_threads, bool delayed_update = false, const std::string& offload_dir = "", uint64_t run_id = 0) {
        const bool parameters = offload == Offload::kOptimizerParameters;
        if (offload == Offload::kNone) return;
        if (!trainable_ || has_tied_ || (stage_ == 0 && data_.size > 1) || (parameters && stage_ != 3) || (parameters && delayed_update) ||
            (delayed_update && !offload_dir.empty()) || norm_ != nullptr)  // norm_: allocate() ran
            die("internal: ZeRO-Offload needs trained parameters of one rank or ZeRO stage 1-3 (its parameters: stage 3, without the delayed "
                "update; the optimizer file: without the delayed update), without pipeline stages, before allocate()");
        offload_.reset(new ZeroOffload<floatX>(plan_, decay_, pg_, compute_, stage_, parameters, delayed_update, cpu_threads, offload_dir, run_id));
    }
    // The NVMe tier's optimizer file of this rank, or null (no --offload-dir); its counters say what the disk did.
    const OptimizerFile* optimizer_file() const { return offload_ ? offload_->file() : nullptr; }
    // The delayed update (set_offload): whether the update of the coming step() may still be running on the host when
    // the step after it begins its forward (otherwise it lands within its own step, in finish_step()).
    void delay_update(bool delay) {
        if (offload_) offload_->delay_update(delay);
    }
    // Lands the delayed update that is still running, if any: waits for the host, brings its parameters up and
    // shares them (stages 1-2: all-gathered; stage 3: gathered on use). Whatever reads the parameters or the optimizer
    // state between steps (evaluations, samples, checkpoints, the end of the run) calls it first.
    void finish_update() {
        if (!offload_ || !offload_->update_running()) return;
        wait_for_parameters();  // the uploads rewrite the slices that the last gathers send
        offload_->uploads_after_compute();
        land_update(false);
    }

    void allocate() {
        const int U = plan_.num_units();
        const size_t local = plan_.local_total;
        size_t largest_gathered = 0;
        for (int u : gathered_units_) largest_gathered = std::max(largest_gathered, plan_.unit_size[u]);
        // full buffers of the persistent units and the two-slot ring of the gathered ones
        auto alloc_full = [&](std::vector<floatX*>& persistent, floatX* (&ring)[2]) {
            persistent.assign(U, nullptr);
            for (int u = 0; u < U; u++)
                if (ordinal_[u] < 0) alloc(&persistent[u], plan_.unit_size[u]);
            for (int i = 0; i < 2 && i < (int)gathered_units_.size(); i++) alloc(&ring[i], largest_gathered);
        };
        if (!trainable_) {  // frozen: the whole parameters, or with a unit source only the persistent units and the ring
            if (!source_) return alloc(&params_, total_);
            alloc_full(persistent_params_, ring_params_);
            return streams_.create(plan_.num_units());
        }
        // a sharded buffer (stage 3 parameters, stage 2-3 gradients): this rank's shards and the full buffers
        auto alloc_sharded = [&](floatX** shards, std::vector<floatX*>& persistent, floatX* (&ring)[2], bool shards_on_host) {
            if (shards_on_host) {  // mapped: set_unit's conversion kernel writes it through the same address (unified addressing)
                cudaCheck(cudaHostAlloc(shards, local * sizeof(floatX), cudaHostAllocMapped));
                memset(*shards, 0, local * sizeof(floatX));
            } else {
                alloc(shards, local);
            }
            alloc_full(persistent, ring);
        };
        if (stage_ == 3) alloc_sharded(&param_shards_, persistent_params_, ring_params_, params_on_host());
        else alloc(&params_, total_);
        if (stage_ >= 2) alloc_sharded(&grad_shards_, persistent_grads_, ring_grads_, false);
        else alloc(&grads_, total_);
        const size_t n = optimizer_elements();
        if (offload_) {  // the host's state, and where on the device its tiles come from and go to
            std::vector<floatX*> param_slices(U), grad_slices(U);
            for (int u = 0; u < U; u++) {
                param_slices[u] = shard_params(u);
                grad_slices[u] = shard_grads(u);
            }
            offload_->allocate(n, param_slices, grad_slices, params_on_host() ? param_shards_ : nullptr);
        } else {
            if (kHasMaster) cudaCheck(cudaMalloc(&master_, n * sizeof(float)));
            cudaCheck(cudaMalloc(&adam_m_, n * sizeof(float)));
            cudaCheck(cudaMalloc(&adam_v_, n * sizeof(float)));
            cudaCheck(cudaMemset(adam_m_, 0, n * sizeof(float)));
            cudaCheck(cudaMemset(adam_v_, 0, n * sizeof(float)));
        }
        cudaCheck(cudaMalloc(&norm_, 2 * sizeof(float)));
        cudaCheck(cudaMalloc(&norm_scratch_, global_norm_scratch_floats() * sizeof(float)));
        cudaCheck(cudaMallocHost(&norm_host_, 2 * sizeof(float)));
        streams_.create(plan_.num_units());
    }

    ~ZeroOptimizer() {
        if (offload_) offload_->stop_updates();  // first: its host thread finishes the update it runs, if any
        for (void* p : {(void*)params_, (void*)grads_, (void*)grad_shards_, (void*)ring_params_[0], (void*)ring_params_[1],
                        (void*)ring_grads_[0], (void*)ring_grads_[1], (void*)norm_, (void*)norm_scratch_})
            if (p) cudaFree(p);
        if (param_shards_ != nullptr) {
            if (params_on_host()) cudaFreeHost(param_shards_);
            else cudaFree(param_shards_);
        }
        for (float* p : {master_, adam_m_, adam_v_})
            if (p) cudaFree(p);
        for (const std::vector<floatX*>* buffers : {&persistent_params_, &persistent_grads_})
            for (floatX* p : *buffers)
                if (p) cudaFree(p);
        if (norm_host_) cudaFreeHost(norm_host_);
    }

    // Counts the changes of the parameters (step, set_unit, a landed delayed update): what is derived from them and
    // kept (--precision fp8's weight copies, model/fp8_linear.cuh) is stale once it moved.
    unsigned long long parameters_version() const { return parameters_version_; }

    // ------------------------------------------------------------------------------------------
    // Where the compute kernels find a unit's parameters and gradients (valid inside the hooks below).
    floatX* unit_params(int u) const {
        if (!gathers()) return params_ + plan_.unit_offset[u];
        return ordinal_[u] < 0 ? persistent_params_[u] : ring_params_[ordinal_[u] % 2];
    }
    floatX* unit_grads(int u) const {  // null for frozen parameters
        if (!trainable_) return nullptr;
        if (stage_ < 2) return grads_ + plan_.unit_offset[u];
        return ordinal_[u] < 0 ? persistent_grads_[u] : ring_grads_[ordinal_[u] % 2];
    }

    // ------------------------------------------------------------------------------------------
    // Hooks, called by the model with unit indices, in this order for each micro-step:
    // begin_forward, (before_unit_forward(u), after_unit_forward(u)) for the blocks in order (before_unit_forward
    // of the next block or of the final LayerNorm may come early: a block's closing LayerNorm uses the next one's
    // parameters), begin_backward(last), after_unit_backward of the final LayerNorm, (before_unit_backward(u),
    // after_unit_backward(u)) for the blocks in reverse, after_unit_backward of the embeddings, end_backward.
    // Under ZeRO-3 the i-th gathered unit lives in parameter ring slot i % 2; a slot is refilled (on the
    // communication stream) as soon as the compute stream is done with the unit it held, so the gather of unit
    // i+2 (forward) or i-2 (backward) overlaps the computation of unit i+1 or i-1. Under ZeRO-1/2 the forward
    // hooks wait for each unit's gather after the last step(), which so overlaps the forward's first blocks.
    // Under pipeline parallelism (stages 0-1) a stage calls them for its own units, micro-batch by micro-batch
    // in its schedule's order, and end_backward once after its last backward.

    void zero_grad() {
        if (!trainable_) return;
        floatX* grads = stage_ < 2 ? grads_ : grad_shards_;
        const size_t n = stage_ < 2 ? total_ : plan_.local_total;
        if (offload_ && offload_->delayed()) offload_->clear_gradients_after_download(grads, n);
        else cudaCheck(cudaMemsetAsync(grads, 0, n * sizeof(floatX), compute_));
    }

    void begin_forward() {
        for (int u = 0; u < plan_.num_units(); u++)
            if (ordinal_[u] < 0) wait_for_unit(u);
        if (!gathers()) return;
        if (!persistent_gathered_ && !source_) {  // parameters change only in step(): gather the persistent units once per step
            cudaCheck(cudaEventRecord(streams_.comm_done, compute_));
            cudaCheck(cudaStreamWaitEvent(streams_.comm, streams_.comm_done));
            for (int u = 0; u < plan_.num_units(); u++)
                if (ordinal_[u] < 0) gather(u, persistent_params_[u], streams_.comm);
            cudaCheck(cudaEventRecord(streams_.comm_done, streams_.comm));
            cudaCheck(cudaStreamWaitEvent(compute_, streams_.comm_done));
            persistent_gathered_ = true;
        }
        for (int i = 0; i < 2 && i < (int)gathered_units_.size(); i++) ensure_gathered(i);
    }
    void before_unit_forward(int u) {
        wait_for_unit(u);
        if (gathers() && ordinal_[u] >= 0) cudaCheck(cudaStreamWaitEvent(compute_, streams_.ring_params_ready[ordinal_[u] % 2]));
    }
    void after_unit_forward(int u) {
        if (!gathers() || ordinal_[u] < 0) return;
        const int i = ordinal_[u];
        cudaCheck(cudaEventRecord(streams_.ring_params_free[i % 2], compute_));
        if (i + 2 < (int)gathered_units_.size()) ensure_gathered(i + 2);
    }

    void begin_backward(bool last_micro_step) {
        if (!trainable_) return;
        last_micro_step_ = last_micro_step;
        if (offload_) offload_->before_backward();
        if (stage_ >= 2) cudaCheck(cudaStreamWaitEvent(compute_, streams_.persistent_grads_free));  // previous micro-step's reductions
    }
    void before_unit_backward(int u) {
        if (!(trainable_ || source_) || ordinal_[u] < 0) return;
        const int i = ordinal_[u];
        if (stage_ >= 2) cudaCheck(cudaStreamWaitEvent(compute_, streams_.ring_grads_free[i % 2]));
        if (!gathers()) return;
        ensure_gathered(i);
        cudaCheck(cudaStreamWaitEvent(compute_, streams_.ring_params_ready[i % 2]));
    }
    // Unit u's gradients are complete for this micro-step: reduce them (stages 0/1: only after the last
    // micro-step; stages 2/3: every micro-step, into the gradient shard).
    void after_unit_backward(int u) {
        const int i = ordinal_[u];
        if (gathers() && i >= 0) {  // its slot can take the gathered unit two before it
            cudaCheck(cudaEventRecord(streams_.ring_params_free[i % 2], compute_));
            if (i - 2 >= 0) ensure_gathered(i - 2);
        }
        if (!trainable_ || data_.size == 1 || (stage_ < 2 && !last_micro_step_)) return;
        cudaCheck(cudaEventRecord(streams_.unit_events[u], compute_));
        cudaCheck(cudaStreamWaitEvent(streams_.comm, streams_.unit_events[u]));
        floatX* unit = unit_grads(u);
        const size_t n = plan_.unit_size[u], shard = plan_.shard_size[u];
        if (stage_ == 0) {
            ncclCheck(ncclAllReduce(unit, unit, n, nccl_type<floatX>(), ncclAvg, data_.comm, streams_.comm));
            return;
        }
        // in place: this rank's slice of the unit receives the reduced slice
        floatX* slice = unit + data_.rank * shard;
        ncclCheck(ncclReduceScatter(unit, slice, shard, nccl_type<floatX>(), ncclAvg, data_.comm, streams_.comm));
        if (stage_ >= 2) {
            accumulate_into(grad_shards_ + plan_.local_offset[u], slice, (long)shard, streams_.comm);
            cudaCheck(cudaMemsetAsync(unit, 0, n * sizeof(floatX), streams_.comm));  // ready for the next micro-step
            // the latest record is what the next wait sees: the comm stream runs in order
            cudaCheck(cudaEventRecord(i >= 0 ? streams_.ring_grads_free[i % 2] : streams_.persistent_grads_free, streams_.comm));
        }
    }
    // Whether the gradients of this micro-step are reduced now (stages 2/3: every micro-step; 0/1: the last one).
    bool reduces_this_micro_step() const { return stage_ >= 2 || last_micro_step_; }
    void end_backward() {
        if (!trainable_) return;
        if (last_micro_step_ && has_tied_ && embedding_.size > 1) {
            // the two copies of the tied token embedding get the sum of both stages' (reduced) gradients: the
            // whole unit at stage 0, this data-parallel rank's slice at stage 1 (the same slice on both stages)
            cudaCheck(cudaEventRecord(streams_.comm_done, compute_));
            cudaCheck(cudaStreamWaitEvent(streams_.comm, streams_.comm_done));
            for (int u = 0; u < plan_.num_units(); u++) {
                if (kinds_[u] != UnitKind::kTied && kinds_[u] != UnitKind::kTiedCopy) continue;
                const bool sliced = stage_ == 1 && data_.size > 1;
                floatX* g = grads_ + (sliced ? plan_.global_begin(u) : plan_.unit_offset[u]);
                const size_t n = sliced ? plan_.shard_size[u] : plan_.unit_size[u];
                ncclCheck(ncclAllReduce(g, g, n, nccl_type<floatX>(), ncclSum, embedding_.comm, streams_.comm));
            }
        } else if (data_.size == 1) {
            return;
        }
        // Stages 2/3 between micro-steps: the next forward needs none of this micro-step's reductions (the next
        // backward waits for its gradient buffers through the *_grads_free_ events), so the last units'
        // reduce-scatters overlap the next forward instead of delaying it.
        if (stage_ >= 2 && !last_micro_step_) return;
        cudaCheck(cudaEventRecord(streams_.comm_done, streams_.comm));
        cudaCheck(cudaStreamWaitEvent(compute_, streams_.comm_done));
    }

    // ------------------------------------------------------------------------------------------
    // The optimizer step: global norm (summed over ranks), skip on inf/NaN, clipping, AdamW on this rank's
    // slices, then the updated parameters are shared (stages 1/2: all-gather; stage 3: gathered on use).
    // Enqueued only: the clip factor and the skip are decided on the device from the norm, so the host does
    // not wait inside the step. After the caller has waited for the stream, finish_step() reads the norm for
    // the log and updates the fp16 loss scale (which the next step's backward uses). h.grad_clip clips; its
    // loss_scale is replaced by the scaler's. nonfinite_loss (device, 0 or NaN, the same on every rank) is added
    // to the squared norm: a non-finite loss skips the step in every precision, as a non-finite gradient does.
    // stop_votes (device: the stop votes of the ranks whose losses this rank gathered, model/loss.h) travels beside
    // the squared norm through its reductions, which cover the tensor-parallel group that the losses' gathering
    // leaves out: every rank of the mesh ends with the same verdict, at no extra collective.
    // Under ZeRO-Offload the host runs the update: it waits for the norm inside the step (ZeroOffload::update), then
    // decides clipping and the skip from it with the kernel's own formula (adamw_cpu::make_step). Under the delayed
    // update the step enqueues the norm and the gradients' copies down, then lands the last step's update if it is
    // still running (land_update); finish_step() starts this step's update on the host thread.
    void step(AdamWHyper h, const float* nonfinite_loss = nullptr, const float* stop_votes = nullptr) {
        if (!trainable_) {
            die("internal: optimizer step on frozen parameters");
        }
        const int U = plan_.num_units();
        wait_for_parameters();  // AdamW rewrites the slices that the last step's gathers send
        parameters_version_++;
        if (offload_) offload_->start_copies();
        const LayoutMask* counted = count_split_only_ ? &split_ : nullptr;
        if (stage_ == 0 && !has_tied_copy_) {
            global_norm_squared(norm_, grads_, (long)total_, norm_scratch_, compute_, false, counted);
        } else if (stage_ <= 1 || counted != nullptr) {  // unit by unit: each slice's elements have their own indices
            bool first = true;
            for (int u = 0; u < U; u++) {
                if (kinds_[u] == UnitKind::kTiedCopy) continue;  // the first pipeline stage counts the tied embedding
                const bool whole = stage_ == 0;
                const floatX* g = whole ? grads_ + plan_.unit_offset[u] : stage_ == 1 ? grads_ + plan_.global_begin(u) : grad_shards_ + plan_.local_offset[u];
                global_norm_squared(norm_, g, (long)(whole ? plan_.unit_size[u] : plan_.shard_size[u]), norm_scratch_, compute_, !first, counted,
                                    (long)(whole ? plan_.unit_offset[u] : plan_.global_begin(u)));
                first = false;
            }
            if (first) cudaCheck(cudaMemsetAsync(norm_, 0, sizeof(float), compute_));
        } else {
            global_norm_squared(norm_, grad_shards_, (long)plan_.local_total, norm_scratch_, compute_);
        }
        // [1]: the stop votes, summed with the squares
        if (stop_votes != nullptr) cudaCheck(cudaMemcpyAsync(norm_ + 1, stop_votes, sizeof(float), cudaMemcpyDeviceToDevice, compute_));
        else cudaCheck(cudaMemsetAsync(norm_ + 1, 0, sizeof(float), compute_));
        // the squares summed over the data-parallel shards, then over the tensor-parallel slices and the pipeline
        // stages: every rank gets the same sum, so every rank takes the same clipping and skip decisions
        if (stage_ >= 1) ncclCheck(ncclAllReduce(norm_, norm_, 2, ncclFloat32, ncclSum, data_.comm, compute_));
        if (tensor_.size > 1) ncclCheck(ncclAllReduce(norm_, norm_, 2, ncclFloat32, ncclSum, tensor_.comm, compute_));
        if (pipeline_.size > 1) ncclCheck(ncclAllReduce(norm_, norm_, 2, ncclFloat32, ncclSum, pipeline_.comm, compute_));
        if (nonfinite_loss != nullptr) add_to_scalar(norm_, nonfinite_loss, compute_);
        // pinned: a copy into pageable memory would block until the stream drains, past --nccl-timeout's deadline
        cudaCheck(cudaMemcpyAsync(norm_host_, norm_, 2 * sizeof(float), cudaMemcpyDeviceToHost, compute_));
        h.loss_scale = scaler.scale;
        step_hyper_ = h;
        if (offload_ && offload_->delayed()) {  // each gradient tile goes down once the last update has read its host tile
            if (offload_->update_running()) land_update(true);
            else offload_->download_all();
            return;
        }
        if (offload_) offload_->update(h, norm_host_);
        else if (stage_ == 0) adamw_update(params_, master_, grads_, adam_m_, adam_v_, (long)total_, 0, h, norm_, decay_, compute_);
        for (int u = 0; u < U && stage_ >= 1; u++) {
            const size_t local = plan_.local_offset[u];
            if (!offload_)
                adamw_update(shard_params(u), kHasMaster ? master_ + local : nullptr, shard_grads(u), adam_m_ + local, adam_v_ + local,
                             (long)plan_.shard_size[u], (long)plan_.global_begin(u), h, norm_, decay_, compute_);
            // Stages 1/2: the updated unit is gathered on the communication stream while the next units update (under
            // offload: once the host's update is back) and the next forward starts, which waits for each unit just
            // before it uses it (wait_for_unit). A skipped step gathers the unchanged shards: the same parameters
            // everywhere.
            if (stage_ < 3) gather_updated_unit(u);
        }
        if (stage_ == 3) {
            persistent_gathered_ = false;
            ring_unit_[0] = ring_unit_[1] = -1;
        }
    }
    // After step() and a wait for the compute stream: the step's gradient norm (unscaled, before clipping),
    // whether it was skipped, and the loss-scale update that follows from it. Under the delayed update it starts the
    // step's update on the host thread (unless skipped), and lands it at once unless delay_update() allows it to run on.
    StepResult finish_step() {
        const float norm = sqrtf(norm_host_[0]) / step_hyper_.loss_scale;
        const bool stop = norm_host_[1] > 0.0f;
        const bool skipped = adamw_grad_scale(norm_host_[0], step_hyper_) == 0.0f;  // the kernels' own test: they skipped the step
        scaler.after_step(skipped, std::is_same<floatX, __half>::value);
        if (offload_ && offload_->delayed() && !skipped) {
            offload_->start_update(adamw_cpu::make_step(step_hyper_, norm_host_[0]));
            if (!offload_->update_may_run_on()) finish_update();
        }
        return {norm, skipped, stop};
    }

    // ------------------------------------------------------------------------------------------
    // State transfer. Full arrays use the padded layout; shards follow plan().

    // Sets the parameters (and master weights) from the full fp32 values (host, padded layout), unit by unit
    // through one unit-sized device buffer (set_unit): no full fp32 copy of the model is ever on the device.
    // With a unit source the staging is one gathered unit: the persistent units go to their buffers that much at a time.
    void set_parameters(const std::vector<float>& full) {
        size_t largest = 0;
        for (int u = 0; u < plan_.num_units(); u++)
            if (!source_ || ordinal_[u] >= 0) largest = std::max(largest, plan_.unit_size[u]);
        float* staging;
        cudaCheck(cudaMalloc(&staging, largest * sizeof(float)));
        for (int u = 0; u < plan_.num_units(); u++) {
            const size_t n = plan_.unit_size[u];
            for (size_t first = 0; first < n; first += largest) {  // one piece, but a source's persistent units
                const size_t piece = std::min(largest, n - first);
                cudaCheck(cudaMemcpy(staging, full.data() + plan_.unit_offset[u] + first, piece * sizeof(float), cudaMemcpyHostToDevice));
                if (piece == n) set_unit(u, staging);
                else convert_precision(persistent_params_[u] + first, staging, (long)piece, compute_);
                cudaCheck(cudaStreamSynchronize(compute_));  // before the next unit overwrites the staging buffer
            }
        }
        cudaCheck(cudaFree(staging));
    }

    // Unit u's parameters (and master weights) from `values` on the device (fp32, the unit's padded length):
    // the compute-precision copy (stage 3: this rank's shard of it) and this rank's master weights.
    void set_unit(int u, const float* values) {
        require_landed("setting parameters");
        wait_for_parameters();
        const size_t shard = plan_.shard_size[u], mine = (size_t)plan_.rank * shard;
        if (source_ && streams_.comm) cudaCheck(cudaStreamSynchronize(streams_.comm));  // no fill reads the source while it changes
        if (source_ && ordinal_[u] >= 0) source_->store(u, values, compute_);
        else if (source_) convert_precision(persistent_params_[u], values, (long)plan_.unit_size[u], compute_);
        else if (stage_ < 3) convert_precision(params_ + plan_.unit_offset[u], values, (long)plan_.unit_size[u], compute_);
        else convert_precision(param_shards_ + plan_.local_offset[u], values + mine, (long)shard, compute_);
        // the fp32 values the update starts from: the master weights (under offload the host's)
        if (offload_) {
            offload_->set_master_weights(u, values);
        } else if (master_ != nullptr && trainable_) {
            if (stage_ >= 1)
                cudaCheck(cudaMemcpyAsync(master_ + plan_.local_offset[u], values + mine, shard * sizeof(float), cudaMemcpyDeviceToDevice, compute_));
            else
                cudaCheck(cudaMemcpyAsync(master_ + plan_.unit_offset[u], values, plan_.unit_size[u] * sizeof(float), cudaMemcpyDeviceToDevice,
                                          compute_));
        }
        persistent_gathered_ = false;
        ring_unit_[0] = ring_unit_[1] = -1;
        parameters_version_++;
    }

    // The parameters in compute precision as fp32 on the host, unit by unit in order: visit(offset, values, n)
    // with the unit's offset in the whole and its padded size. Host memory: one unit, so a 30B model's checksum
    // or save need not hold it whole on every rank. Stage 3 gathers each unit: every rank calls; an empty visit
    // only takes part in the gathers.
    void for_each_unit_host(const std::function<void(size_t, const float*, size_t)>& visit) {
        require_landed("reading the parameters");
        wait_for_parameters();
        if (!visit && stage_ < 3) return;
        const size_t largest = *std::max_element(plan_.unit_size.begin(), plan_.unit_size.end());
        floatX* gathered = nullptr;  // stage 3, a unit source: a unit-sized buffer, so the full model need not fit one GPU
        if (gathers()) cudaCheck(cudaMalloc(&gathered, largest * sizeof(floatX)));
        std::vector<floatX> raw(visit ? largest : 0);
        std::vector<float> values(visit ? largest : 0);
        for (int u = 0; u < plan_.num_units(); u++) {
            const size_t n = plan_.unit_size[u];
            const floatX* unit = params_ + plan_.unit_offset[u];
            if (stage_ == 3) {
                gather(u, gathered, compute_);
                unit = gathered;
            } else if (source_) {
                if (ordinal_[u] >= 0) source_->fill(u, gathered, true, compute_);
                unit = ordinal_[u] >= 0 ? gathered : persistent_params_[u];
            }
            if (visit) cudaCheck(cudaMemcpyAsync(raw.data(), unit, n * sizeof(floatX), cudaMemcpyDeviceToHost, compute_));
            pg_.synchronize(compute_);
            if (!visit) continue;
            for (size_t i = 0; i < n; i++) values[i] = host_float(raw[i]);
            visit(plan_.unit_offset[u], values.data(), n);
        }
        if (gathered != nullptr) cudaCheck(cudaFree(gathered));
    }
    // The full parameters in compute precision, as fp32 on the host (stage 3 gathers them: every rank calls).
    // keep = false: this rank only takes part in the gathers and gets an empty vector.
    std::vector<float> parameters_host(bool keep = true) {
        std::vector<float> all(keep ? total_ : 0);
        std::function<void(size_t, const float*, size_t)> copy;
        if (keep) copy = [&](size_t offset, const float* values, size_t n) { std::copy(values, values + n, all.begin() + offset); };
        for_each_unit_host(copy);
        return all;
    }
    // The compute stream waits until every unit's parameters are current: at stages 1/2, until the gathers of
    // the last step() are done. The forward hooks wait unit by unit instead; other readers and writers call this.
    void wait_for_parameters() { wait_for_unit(plan_.num_units() - 1); }  // the last gather: the stream runs in order

    // Full gradients (stages 0 and 1 keep them; for tests).
    std::vector<float> gradients_host() {
        if (stage_ >= 2) die("full gradients are not kept at ZeRO stage " + std::to_string(stage_));
        std::vector<floatX> raw(total_);
        cudaCheck(cudaMemcpyAsync(raw.data(), grads_, total_ * sizeof(floatX), cudaMemcpyDeviceToHost, compute_));
        pg_.synchronize(compute_);
        return host_floats(raw);
    }

    // Optimizer state of this rank (master weights if any, Adam m, v), each optimizer_elements() floats; under
    // ZeRO-Offload the host's (ZeroOffload::state_to_host).
    size_t optimizer_elements() const { return stage_ >= 1 ? plan_.local_total : total_; }
    void optimizer_state_to_host(std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) const {
        const size_t n = optimizer_elements();
        master.resize(kHasMaster ? n : 0);
        m.resize(n);
        v.resize(n);
        require_landed("reading the optimizer state");
        if (offload_) return offload_->state_to_host(master, m, v);
        auto get = [&](std::vector<float>& to, const float* from) { cudaCheck(cudaMemcpy(to.data(), from, n * sizeof(float), cudaMemcpyDeviceToHost)); };
        if (kHasMaster) get(master, master_);
        get(m, adam_m_);
        get(v, adam_v_);
    }
    void optimizer_state_from_host(const std::vector<float>& master, const std::vector<float>& m, const std::vector<float>& v) {
        const size_t n = optimizer_elements();
        require_landed("setting the optimizer state");
        if (offload_) return offload_->state_from_host(master, m, v);
        auto put = [&](float* to, const std::vector<float>& from) { cudaCheck(cudaMemcpy(to, from.data(), n * sizeof(float), cudaMemcpyHostToDevice)); };
        if (kHasMaster) put(master_, master);
        put(adam_m_, m);
        put(adam_v_, v);
    }
    // What this rank stores of a full (padded-layout) optimizer array.
    std::vector<float> optimizer_part(const std::vector<float>& full) const { return stage_ >= 1 ? local_slices(plan_, full) : full; }

private:

    void alloc(floatX** p, size_t n) {
        cudaCheck(cudaMalloc(p, n * sizeof(floatX)));
        cudaCheck(cudaMemset(*p, 0, n * sizeof(floatX)));
    }
    // This rank's slice of unit u on the device, where AdamW reads its gradients and writes its parameters (stages
    // 1-3; one rank's slice is the whole unit).
    floatX* shard_params(int u) const { return stage_ == 3 ? param_shards_ + plan_.local_offset[u] : params_ + plan_.global_begin(u); }
    floatX* shard_grads(int u) const { return stage_ >= 2 ? grad_shards_ + plan_.local_offset[u] : grads_ + plan_.global_begin(u); }

    // Blocks go through the parameter ring: ZeRO-3's gathers, or a unit source's fills.
    bool gathers() const { return stage_ == 3 || source_ != nullptr; }
    // The parameter shard lives on the host (--offload optimizer,parameters).
    bool params_on_host() const { return offload_ && offload_->parameters_on_host(); }
    // Lands the delayed update that runs on the host (ZeroOffload::land), its copy streams already behind the compute
    // stream's last read of the parameters; the parameters are then shared as after any update (stages 1-2:
    // all-gathered; stage 3: gathered on use).
    void land_update(bool download_gradients) {
        offload_->land(download_gradients);
        parameters_version_++;
        for (int u = 0; u < plan_.num_units() && (stage_ == 1 || stage_ == 2); u++) gather_updated_unit(u);
        if (stage_ == 3) {
            persistent_gathered_ = false;
            ring_unit_[0] = ring_unit_[1] = -1;
        }
    }
    // Whatever reads or writes the parameters or the optimizer state outside the step: no delayed update may be running.
    void require_landed(const char* what) const {
        if (offload_ && offload_->update_running()) die(std::string("internal: ") + what + " while a delayed update runs (finish_update() first)");
    }
    // Stages 1/2: unit u's updated slice goes to every rank, all-gathered in place on the communication stream once the
    // compute stream has come here; streams_.gathered[u] marks it for the next forward.
    void gather_updated_unit(int u) {
        cudaCheck(cudaEventRecord(streams_.unit_events[u], compute_));
        cudaCheck(cudaStreamWaitEvent(streams_.comm, streams_.unit_events[u]));
        floatX* unit = params_ + plan_.unit_offset[u];
        ncclCheck(ncclAllGather(unit + data_.rank * plan_.shard_size[u], unit, plan_.shard_size[u], nccl_type<floatX>(), data_.comm, streams_.comm));
        cudaCheck(cudaEventRecord(streams_.gathered[u], streams_.comm));
    }
    // All-gather unit u from the parameter shards into `dst` on `stream`. Shards on the host (--offload
    // optimizer,parameters): this rank's slice is copied up to its place in `dst`, then gathered in place.
    void gather(int u, floatX* dst, cudaStream_t stream) {
        const size_t shard = plan_.shard_size[u];
        const floatX* mine = param_shards_ + plan_.local_offset[u];
        if (params_on_host()) {
            cudaCheck(cudaMemcpyAsync(dst + data_.rank * shard, mine, shard * sizeof(floatX), cudaMemcpyHostToDevice, stream));
            mine = dst + data_.rank * shard;
        }
        ncclCheck(ncclAllGather(mine, dst, shard, nccl_type<floatX>(), data_.comm, stream));
    }
    // Stages 1/2: the compute stream waits for the gather of unit u after the last step() (a no-op before the first).
    void wait_for_unit(int u) {
        if (stage_ == 1 || stage_ == 2) cudaCheck(cudaStreamWaitEvent(compute_, streams_.gathered[u]));
    }
    // Stage 3: unless the i-th gathered unit already sits in its ring slot, gather it there once the compute
    // stream is done with the slot's previous unit.
    void ensure_gathered(int i) {
        const int slot = i % 2;
        if (ring_unit_[slot] == i) return;
        cudaCheck(cudaStreamWaitEvent(streams_.comm, streams_.ring_params_free[slot]));
        if (source_) source_->fill(gathered_units_[i], ring_params_[slot], false, streams_.comm);
        else gather(gathered_units_[i], ring_params_[slot], streams_.comm);
        cudaCheck(cudaEventRecord(streams_.ring_params_ready[slot], streams_.comm));
        ring_unit_[slot] = i;
    }

    ShardPlan plan_;
    std::vector<UnitKind> kinds_;
    std::vector<int> ordinal_;         // of each unit among the gathered ones, -1 for the others
    std::vector<int> gathered_units_;  // the gathered units in order
    bool has_tied_ = false, has_tied_copy_ = false;
    size_t total_;
    LayoutMask decay_;
    const ProcessGroup& pg_;
    Communicator data_, tensor_, pipeline_, embedding_;
    LayoutMask split_;
    bool count_split_only_;  // a tensor-parallel rank other than 0: the norm counts only its own slices
    int stage_;
    cudaStream_t compute_;
    bool trainable_ = true;
    UnitSource<floatX>* source_ = nullptr;  // set_unit_source: fills the gathered units of frozen parameters
    bool last_micro_step_ = true, persistent_gathered_ = false;
    int ring_unit_[2] = {-1, -1};  // stage 3: which gathered unit (its ordinal) each parameter ring slot holds

    floatX *params_ = nullptr, *grads_ = nullptr;                // full (stages < 3 / < 2)
    unsigned long long parameters_version_ = 0;
    floatX *param_shards_ = nullptr, *grad_shards_ = nullptr;
    std::vector<floatX*> persistent_params_, persistent_grads_;  // stage 3 / stages 2-3: full buffers of the persistent units
    floatX *ring_params_[2] = {}, *ring_grads_[2] = {};          // and the two slots of the gathered ones
    float *master_ = nullptr, *adam_m_ = nullptr, *adam_v_ = nullptr;  // on the device (null under offload: the host's)
    float *norm_ = nullptr, *norm_scratch_ = nullptr;  // norm_: the squared gradient norm, then the stop votes
    float* norm_host_ = nullptr;  // pinned: norm_'s copy
    AdamWHyper step_hyper_ = {};  // the last step()'s hyperparameters, loss scale included, for finish_step()
    ZeroStreams streams_;  // the communication stream and its events
    // ZeRO-Offload's host and disk tiers (set_offload), or null: the state is the device's
    std::unique_ptr<ZeroOffload<floatX>> offload_;
};
