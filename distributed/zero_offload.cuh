// ZeRO-Offload's tiers of a ZeroOptimizer (distributed/zero.cuh) below the GPU: the host's and the disk's.
// ZeRO-Offload (Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training"; --offload optimizer): at
// stages 1-3, or on one rank, the shard's master weights and Adam moments live in pinned host memory and the CPU
// runs AdamW on them (kernels/adamw_cpu.h, bitwise the kernel's update): the reduced gradient shard goes down and the
// new compute-precision parameters come up tile by tile, overlapped with the CPU's work. The GPU keeps the parameters
// and gradients of its stage: 4Ψ, 2Ψ + 2Ψ/N, 4Ψ/N in bf16 at stages 1-3; the host 12Ψ/N per rank (8Ψ/N in fp32).
// --offload optimizer,parameters (stage 3, N >= 2): the parameter shard lives on the host too, where the CPU writes
// it; each gather copies the rank's slice up into the unit's buffer and all-gathers in place, so the GPU keeps only
// the gathered working buffers of the parameters (2Ψ/N on the host instead).
// The one-step delayed update (Ren et al.'s DPU; --offload-delayed-update 1, with --offload optimizer): a host thread
// runs step N's AdamW while the GPU runs step N+1's forward and backward on the parameters without step N's update;
// step N+1's step() lands it (its parameters go up, then the all-gather) and sends its own gradient shard down. The
// gradient shard and the new parameters live in whole-shard pinned host buffers instead of the staging slots: 16Ψ/N
// on the host in all (bf16 and fp32).
// The NVMe tier (ZeRO-Infinity's optimizer-state offload; --offload-dir PATH, with --offload and without the delayed
// update): the master weights and Adam moments live in one file per rank in PATH (distributed/optimizer_file.h), 12Ψ/N
// bytes (8Ψ/N in fp32), which the host's update reads and writes back tile by tile, one tile ahead and one behind on
// an I/O thread; the host keeps OptimizerFile::kBuffers tiles of it. Checkpoints read and write the state through the
// file, in the same format.
// The ZeroOptimizer keeps the device side (its parameters and gradients, the gathers, the norm); these move the state
// between the tiers and run the update on the host.
// defines: HostMemory, Offload, CpuFloat, ZeroOffload
#pragma once
#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/adamw.cuh"      // defines: AdamWHyper
#include "../kernels/adamw_cpu.h"    // defines: adamw_cpu::update, adamw_cpu::make_step, adamw_cpu::Step
#include "process_group.h"           // defines: ProcessGroup (wait_event, synchronize: bounded by --nccl-timeout)
#include "optimizer_file.h"          // defines: OptimizerFile, optimizer_file_bytes
#include "shard_plan.h"              // defines: ShardPlan

// ZeRO-Offload's pinned host memory of one rank: the shard's master weights and Adam moments, its compute-precision
// parameters (--offload optimizer,parameters; under the delayed update the new parameters), its gradients (under the
// delayed update), and the staging slots that the gradients come down and the new parameters go up through. Under
// --offload-dir the master weights and Adam moments are the optimizer file's (`disk` bytes, not in total()) and the host
// holds its tile buffers (`file_tiles`, pageable).
struct HostMemory {
    size_t master_weights = 0, adam_state = 0, parameters = 0, gradients = 0, staging = 0, file_tiles = 0;
    size_t disk = 0;
    size_t total() const { return master_weights + adam_state + parameters + gradients + staging + file_tiles; }
};

// What ZeRO-Offload moves to the host (--offload): nothing, the optimizer state, or also the stage-3 parameter shard.
enum class Offload { kNone, kOptimizer, kOptimizerParameters };

// The CPU AdamW's name for a compute type (the same bits, kernels/adamw_cpu.h).
template <typename T> struct CpuFloat { using type = float; };
template <> struct CpuFloat<__nv_bfloat16> { using type = adamw_cpu::Bf16; };
template <> struct CpuFloat<__half> { using type = adamw_cpu::Fp16; };

// The host's state of a rank's shard and its update there. The host state is in the order of this rank's storage
// (ShardPlan::local_offset: the rank's slices, or on one rank the whole layout); its tile k
// (ShardPlan::for_each_tile_piece) lies in staging slot k % kSlots, or under the delayed update at its own place in the
// whole-shard buffers.
template <typename floatX>
class ZeroOffload {
public:
    static constexpr bool kHasMaster = !std::is_same<floatX, float>::value;
    // The step moves the gradient shard down and the new parameters up in tiles of this many elements (8 MiB of bf16
    // gradients a copy: long enough for the copy engines' full rate, short enough that the first tile's copy down and
    // the last one's copy up, which nothing overlaps, take well under a millisecond), through kSlots pinned slots each
    // way: tile k+1 comes down and tile k-1 goes up while the CPU updates tile k.
    static constexpr size_t kTileElements = size_t(1) << 22;
    static_assert(kTileElements % 1024 == 0, "the optimizer file's tile records start 4096-aligned");
    static constexpr int kSlots = 2;
    static size_t tile(size_t shard) { return std::min(kTileElements, shard); }

    // Pinned host bytes of one rank under `offload`, for `total` elements on `world` data-parallel ranks at `stage` (the
    // same at stages 1-3: each rank updates its 1/world of the elements; one rank updates all): master weights (none
    // in fp32) and Adam m and v of what the rank updates, and per staging slot a tile of gradients and one of
    // parameters; with the parameters (stage 3) the shard's parameters instead of the parameter slots. Under the
    // delayed update (delayed, with kOptimizer) no slots: the shard's gradients and new parameters, whole. With the
    // optimizer file (file: --offload-dir) the master weights and Adam moments are on the disk, the host holds its tiles.
    static HostMemory host_memory(size_t total, int world, int stage, Offload offload, bool delayed = false, bool file = false) {
        if (offload == Offload::kNone) return {};
        const bool parameters = offload == Offload::kOptimizerParameters;
        const size_t shard = stage >= 1 ? total / world : total;
        HostMemory h;
        h.master_weights = kHasMaster ? shard * sizeof(float) : 0;
        h.adam_state = 2 * shard * sizeof(float);
        h.parameters = parameters || delayed ? shard * sizeof(floatX) : 0;
        h.gradients = delayed ? shard * sizeof(floatX) : 0;
        h.staging = delayed ? 0 : kSlots * tile(shard) * (parameters ? 1 : 2) * sizeof(floatX);
        if (file) {
            const int arrays = kHasMaster ? 3 : 2;
            h.master_weights = h.adam_state = 0;
            h.file_tiles = OptimizerFile::buffers_bytes(tile(shard), arrays);
            h.disk = optimizer_file_bytes(shard, arrays);
        }
        return h;
    }

    // The shard of `plan` at `stage`, whose weight decay `decay` says, updated with `cpu_threads` OpenMP threads (0:
    // OpenMP's default team); its device side on the `compute` stream. parameters: the stage-3 parameter shard lives
    // on the host; delayed_update: the one-step delayed update; offload_dir: the NVMe tier's folder (empty: none), where
    // allocate() creates this rank's optimizer file, which carries run_id (model/run_identity.h).
    ZeroOffload(const ShardPlan& plan, const LayoutMask& decay, const ProcessGroup& pg, cudaStream_t compute, int stage, bool parameters,
                bool delayed_update, int cpu_threads, const std::string& offload_dir, uint64_t run_id)
        : plan_(plan), decay_(decay), pg_(pg), compute_(compute), stage_(stage), params_on_host_(parameters), delayed_(delayed_update),
          cpu_threads_(cpu_threads), offload_dir_(offload_dir), run_id_(run_id) {}
    ZeroOffload(const ZeroOffload&) = delete;
    ZeroOffload& operator=(const ZeroOffload&) = delete;

    // The host's state of `n` optimizer elements. shard_params, shard_grads: this rank's slice of each unit on the
    // device, where the new parameters go up and the gradients come down from; host_param_shard: the parameter shard
    // on the host (parameters), which the CPU updates in place.
    void allocate(size_t n, std::vector<floatX*> shard_params, std::vector<floatX*> shard_grads, floatX* host_param_shard) {
        elements_ = n;
        shard_params_ = std::move(shard_params);
        shard_grads_ = std::move(shard_grads);
        host_param_shard_ = host_param_shard;
        if (!offload_dir_.empty()) {  // this rank's file, preallocated: zeros (set_master_weights writes the master weights)
            file_.reset(new OptimizerFile(offload_dir_, pg_.rank, n, tile_elements(), kHasMaster, run_id_));
        } else {  // exact sizes: cudaHostAlloc pins what it is asked for
            if (kHasMaster) cudaCheck(cudaHostAlloc(&master_, n * sizeof(float), cudaHostAllocDefault));
            cudaCheck(cudaHostAlloc(&adam_m_, n * sizeof(float), cudaHostAllocDefault));
            cudaCheck(cudaHostAlloc(&adam_v_, n * sizeof(float), cudaHostAllocDefault));
            zero_host(adam_m_, n);
            zero_host(adam_v_, n);
        }
        if (delayed_) {  // the whole shard's gradients and new parameters (in fp32 the parameters the update reads)
            cudaCheck(cudaHostAlloc(&host_shard_grads_, plan_.local_total * sizeof(floatX), cudaHostAllocDefault));
            cudaCheck(cudaHostAlloc(&host_shard_params_, plan_.local_total * sizeof(floatX), cudaHostAllocDefault));
        }
        for (int i = 0; i < kSlots && !delayed_; i++) {
            cudaCheck(cudaHostAlloc(&host_grads_[i], tile_elements() * sizeof(floatX), cudaHostAllocDefault));
            if (!params_on_host_) cudaCheck(cudaHostAlloc(&host_params_[i], tile_elements() * sizeof(floatX), cudaHostAllocDefault));
        }
        cudaCheck(cudaStreamCreateWithFlags(&download_, cudaStreamNonBlocking));
        cudaCheck(cudaStreamCreateWithFlags(&upload_, cudaStreamNonBlocking));
        for (auto* e : {&offload_start_, &norm_ready_, &offload_done_, &grads_read_, &grads_cleared_})
            cudaCheck(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
        downloaded_.resize(delayed_ ? num_tiles() : kSlots);  // the delayed update: one per tile of the shard
        uploaded_.resize(delayed_ ? num_tiles() : kSlots);
        for (std::vector<cudaEvent_t>* events : {&downloaded_, &uploaded_})
            for (auto& e : *events) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        if (delayed_) {
            cudaCheck(cudaGetDevice(&device_));
            update_thread_ = std::thread([this] { run_host_updates(); });
        }
    }

    // The delayed update's host thread ends, once it finishes the update it runs, if any.
    void stop_updates() {
        if (!update_thread_.joinable()) return;
        {
            std::lock_guard<std::mutex> lock(update_mutex_);
            stop_updates_ = true;
        }
        update_cv_.notify_all();
        update_thread_.join();
    }
    ~ZeroOffload() {
        stop_updates();
        for (float* p : {master_, adam_m_, adam_v_})
            if (p != nullptr) cudaFreeHost(p);
        for (int i = 0; i < kSlots; i++)
            for (floatX* p : {host_grads_[i], host_params_[i]})
                if (p) cudaFreeHost(p);
        for (floatX* p : {host_shard_grads_, host_shard_params_})
            if (p) cudaFreeHost(p);
        for (const std::vector<cudaEvent_t>* events : {&downloaded_, &uploaded_})
            for (cudaEvent_t e : *events) cudaEventDestroy(e);
        for (cudaEvent_t e : {offload_start_, norm_ready_, offload_done_, grads_read_, grads_cleared_})
            if (e) cudaEventDestroy(e);
        for (cudaStream_t stream : {download_, upload_})
            if (stream) cudaStreamDestroy(stream);
    }

    bool parameters_on_host() const { return params_on_host_; }
    bool delayed() const { return delayed_; }
    // The NVMe tier's optimizer file of this rank, or null (no --offload-dir).
    const OptimizerFile* file() const { return file_.get(); }
    // The delayed update: whether the update of the coming step may still run on the host when the step after it
    // begins its forward (ZeroOptimizer::delay_update), and whether one is started and not yet landed.
    void delay_update(bool delay) { delay_update_ = delay; }
    bool update_may_run_on() const { return delay_update_; }
    bool update_running() const { return update_running_; }

    // The delayed update: the last step's gradients (n elements of `grads`) may still be going down to the host, so
    // they are cleared after that on the copy stream, and the backward waits for it (before_backward), not the forward.
    void clear_gradients_after_download(floatX* grads, size_t n) {
        cudaCheck(cudaEventRecord(grads_read_, compute_));
        cudaCheck(cudaStreamWaitEvent(download_, grads_read_));
        cudaCheck(cudaMemsetAsync(grads, 0, n * sizeof(floatX), download_));
        cudaCheck(cudaEventRecord(grads_cleared_, download_));
    }
    void before_backward() {
        if (delayed_) cudaCheck(cudaStreamWaitEvent(compute_, grads_cleared_));
    }

    // At the start of the step: the copy streams wait until the gradients are reduced and the last step's gathers are
    // done (the caller's wait_for_parameters), and the first tiles come down while the GPU computes the norm (under the
    // delayed update the step enqueues every tile's copy after the norm: download_all).
    void start_copies() {
        cudaCheck(cudaEventRecord(offload_start_, compute_));
        cudaCheck(cudaStreamWaitEvent(download_, offload_start_));
        cudaCheck(cudaStreamWaitEvent(upload_, offload_start_));
        for (int k = 0; k < kSlots && k < num_tiles() && !delayed_; k++) download_tile(k);
    }
    void download_all() {
        for (int k = 0; k < num_tiles(); k++) download_tile(k);
    }
    // Once the squared norm's copy to norm_host is enqueued on the compute stream: waits for it, then for each tile
    // waits for its download, runs AdamW on the CPU into its parameter slot, enqueues the slot's copy up to the GPU and
    // the download of the tile kSlots ahead into the freed gradient slot; the compute stream then waits for the last
    // upload, before the gathers (stages 1-2) and the next forward read the parameters. With the parameter shard on the
    // host the CPU writes it in place and nothing goes up: the next forward's gathers, enqueued after this returns, copy
    // it up (the last step's gathers, which read it too, were done before the norm). A skipped step (adamw_grad_scale
    // 0: a non-finite norm) changes nothing, as on the GPU; its downloads go unread. Every wait is bounded by
    // --nccl-timeout (pg_.wait_event), so a peer that fails inside the norm's all-reduce ends the job. With the optimizer
    // file the tiles' master weights and moments come from its pass (read one tile ahead, written one behind), in the
    // same order.
    void update(const AdamWHyper& h, const float* norm_host) {
        cudaCheck(cudaEventRecord(norm_ready_, compute_));
        pg_.wait_event(norm_ready_);
        const adamw_cpu::Step step = adamw_cpu::make_step(h, *norm_host);
        if (step.grad_scale == 0.0f) return;
        using Cpu = typename CpuFloat<floatX>::type;
        const int tiles = num_tiles();
        // tile k, its master weights and moments from its first element on (in the whole-shard arrays or the file's tile)
        auto update_tile = [&](int k, float* master, float* m, float* v) {
            const int slot = k % kSlots;
            const size_t first = (size_t)k * tile_elements();
            pg_.wait_event(downloaded_[slot]);
            pg_.wait_event(uploaded_[slot]);  // the parameter slot's last copy up is done
            // where element i of the shard's parameters is updated: in the host's shard, or at its place in the tile's slot
            auto params = [&](size_t i) { return reinterpret_cast<Cpu*>(params_on_host_ ? host_param_shard_ + i : host_params_[slot] + (i - first)); };
            const Cpu* grads = reinterpret_cast<const Cpu*>(host_grads_[slot]);
            for_each_piece(k, [&](int u, size_t begin, size_t end) {
                const size_t i = begin - first;
                adamw_cpu::update(params(begin), kHasMaster ? master + i : nullptr, grads + i, m + i, v + i, 0, (long)(end - begin),
                                  (long)plan_.global_index(u, begin), step, decay_, cpu_threads_);
            });
            if (!params_on_host_)
                for_each_piece(k, [&](int u, size_t begin, size_t end) {
                    cudaCheck(cudaMemcpyAsync(shard_params_[u] + (begin - plan_.local_offset[u]), host_params_[slot] + (begin - first),
                                              (end - begin) * sizeof(floatX), cudaMemcpyHostToDevice, upload_));
                });
            cudaCheck(cudaEventRecord(uploaded_[slot], upload_));
            if (k + kSlots < tiles) download_tile(k + kSlots);
        };
        if (file_ != nullptr) {
            file_->pass(0, tiles, OptimizerFile::Pass::kReadWrite, [&](const OptimizerFile::Tile& t) { update_tile(t.index, t.master, t.m, t.v); });
        } else {
            for (int k = 0; k < tiles; k++) {
                const size_t first = (size_t)k * tile_elements();
                update_tile(k, kHasMaster ? master_ + first : nullptr, adam_m_ + first, adam_v_ + first);
            }
        }
        cudaCheck(cudaEventRecord(offload_done_, upload_));
        cudaCheck(cudaStreamWaitEvent(compute_, offload_done_));
    }

    // ------------------------------------------------------------------------------------------
    // The delayed update. One host thread (run_host_updates) runs the updates, one at a time: for each tile it waits
    // until the tile's gradients are down and its last parameters have gone up (it rewrites them in place), runs
    // AdamW on it, and reports the tile done (update_tiles_done_). The main thread lands the update (land) in the next
    // step or at ZeroOptimizer::finish_update, tile by tile as the host finishes them.

    // Once the step's stream is done: the step's update (its scalars from the step's own norm) starts.
    void start_update(const adamw_cpu::Step& step) {
        std::lock_guard<std::mutex> lock(update_mutex_);
        update_step_ = step;
        update_tiles_done_ = 0;
        update_requested_ = true;
        update_running_ = true;
        update_cv_.notify_all();
    }
    // A landing outside the step (ZeroOptimizer::finish_update): the uploads follow the compute stream's last read of
    // the parameters, as the step's own copies do (start_copies).
    void uploads_after_compute() {
        cudaCheck(cudaEventRecord(offload_start_, compute_));
        cudaCheck(cudaStreamWaitEvent(upload_, offload_start_));
    }
    // Lands the running update, its copy streams already behind the compute stream's last read of the parameters
    // (offload_start_): as the host finishes each tile, the tile's new parameters go up into this rank's slices (with
    // download_gradients, the new step's gradient tile comes down into the host tile just read); the compute stream
    // waits for the last upload. The caller shares the parameters then, as after any update.
    void land(bool download_gradients) {
        for (int k = 0; k < num_tiles(); k++) {
            {
                std::unique_lock<std::mutex> lock(update_mutex_);
                update_cv_.wait(lock, [&] { return update_tiles_done_ > k; });
            }
            for_each_piece(k, [&](int u, size_t begin, size_t end) {
                cudaCheck(cudaMemcpyAsync(shard_params_[u] + (begin - plan_.local_offset[u]), host_shard_params_ + begin,
                                          (end - begin) * sizeof(floatX), cudaMemcpyHostToDevice, upload_));
            });
            cudaCheck(cudaEventRecord(uploaded_[k], upload_));
            if (download_gradients) download_tile(k);
        }
        update_running_ = false;
        cudaCheck(cudaEventRecord(offload_done_, upload_));
        cudaCheck(cudaStreamWaitEvent(compute_, offload_done_));
    }

    // ------------------------------------------------------------------------------------------
    // State transfer (ZeroOptimizer's set_unit and optimizer state), with no delayed update running.

    // Unit u's master weights from `values` on the device (fp32, the unit's padded length): this rank's slice (the
    // unit at stage 0), in pinned host memory, which the host reads after waiting for the compute stream, or through
    // the host into the optimizer file; in fp32 under the delayed update the host's parameters (their own master
    // weights).
    void set_master_weights(int u, const float* values) {
        const size_t shard = plan_.shard_size[u], mine = (size_t)plan_.rank * shard;
        float* master = kHasMaster ? master_ : delayed_ ? reinterpret_cast<float*>(host_shard_params_) : nullptr;
        if (file_ != nullptr && kHasMaster) {  // this rank's slice: stages 1-3 or one rank
            std::vector<float> slice(shard);
            cudaCheck(cudaMemcpyAsync(slice.data(), values + mine, shard * sizeof(float), cudaMemcpyDeviceToHost, compute_));
            pg_.synchronize(compute_);
            file_->write_range(OptimizerFile::kMaster, plan_.local_offset[u], slice.data(), shard);
        } else if (master != nullptr) {
            if (stage_ >= 1)
                cudaCheck(cudaMemcpyAsync(master + plan_.local_offset[u], values + mine, shard * sizeof(float), cudaMemcpyDeviceToHost, compute_));
            else
                cudaCheck(cudaMemcpyAsync(master + plan_.unit_offset[u], values, plan_.unit_size[u] * sizeof(float), cudaMemcpyDeviceToHost,
                                          compute_));
        }
    }
    // The optimizer state (master weights if any, Adam m, v; each sized to the elements), read and written in host
    // memory directly once set_master_weights' copies there are done; with the optimizer file, through it (the same
    // arrays: a checkpoint is the same whether or not the run had --offload-dir).
    void state_to_host(std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) const {
        pg_.synchronize(compute_);
        if (file_ != nullptr) return file_->read_all(kHasMaster ? master.data() : nullptr, m.data(), v.data());
        if (kHasMaster) std::copy(master_, master_ + elements_, master.begin());
        std::copy(adam_m_, adam_m_ + elements_, m.begin());
        std::copy(adam_v_, adam_v_ + elements_, v.begin());
    }
    void state_from_host(const std::vector<float>& master, const std::vector<float>& m, const std::vector<float>& v) {
        pg_.synchronize(compute_);
        if (file_ != nullptr) return file_->write_all(kHasMaster && !master.empty() ? master.data() : nullptr, m.data(), v.data());
        if (kHasMaster) std::copy(master.begin(), master.begin() + elements_, master_);
        std::copy(m.begin(), m.begin() + elements_, adam_m_);
        std::copy(v.begin(), v.begin() + elements_, adam_v_);
    }

private:
    static void zero_host(float* p, size_t n) {
#pragma omp parallel for schedule(static)
        for (long i = 0; i < (long)n; i++) p[i] = 0.0f;
    }
    size_t tile_elements() const { return tile(plan_.local_total); }
    int num_tiles() const { return plan_.num_tiles(tile_elements()); }
    template <typename Visit>
    void for_each_piece(int k, Visit visit) const { plan_.for_each_tile_piece(tile_elements(), k, visit); }
    // Enqueues tile k's gradients (fp32 with the parameters on the GPU: and its parameters, which are their own master
    // weights) into its slot, on the download stream; downloaded_[slot] marks them there. Under the delayed update the
    // gradients go to their place in the whole shard and downloaded_[k] marks them (the host keeps the fp32 parameters).
    void download_tile(int k) {
        const int slot = k % kSlots, event = delayed_ ? k : slot;
        const size_t first = (size_t)k * tile_elements();
        const bool parameters = !kHasMaster && !params_on_host_ && !delayed_;
        if (parameters) cudaCheck(cudaStreamWaitEvent(download_, uploaded_[slot]));  // the slot's last parameters have gone up
        for_each_piece(k, [&](int u, size_t begin, size_t end) {
            const size_t in_unit = begin - plan_.local_offset[u], bytes = (end - begin) * sizeof(floatX);
            floatX* grads = delayed_ ? host_shard_grads_ + begin : host_grads_[slot] + (begin - first);
            cudaCheck(cudaMemcpyAsync(grads, shard_grads_[u] + in_unit, bytes, cudaMemcpyDeviceToHost, download_));
            if (parameters)
                cudaCheck(cudaMemcpyAsync(host_params_[slot] + (begin - first), shard_params_[u] + in_unit, bytes, cudaMemcpyDeviceToHost, download_));
        });
        cudaCheck(cudaEventRecord(downloaded_[event], download_));
    }
    void run_host_updates() {
        cudaCheck(cudaSetDevice(device_));  // the events it waits for are this rank's GPU's
        std::unique_lock<std::mutex> lock(update_mutex_);
        for (;;) {
            update_cv_.wait(lock, [this] { return update_requested_ || stop_updates_; });
            if (stop_updates_) return;
            update_requested_ = false;
            const adamw_cpu::Step step = update_step_;
            lock.unlock();
            update_host_tiles(step);
            lock.lock();
        }
    }
    // On the host thread. Its waits are bounded by --nccl-timeout (pg_.wait_event), as update's.
    void update_host_tiles(const adamw_cpu::Step& step) {
        using Cpu = typename CpuFloat<floatX>::type;
        for (int k = 0; k < num_tiles(); k++) {
            pg_.wait_event(downloaded_[k]);
            pg_.wait_event(uploaded_[k]);
            for_each_piece(k, [&](int u, size_t begin, size_t end) {  // fp32: the host's parameters are their own master weights
                adamw_cpu::update(reinterpret_cast<Cpu*>(host_shard_params_ + begin), kHasMaster ? master_ + begin : nullptr,
                                  reinterpret_cast<const Cpu*>(host_shard_grads_ + begin), adam_m_ + begin, adam_v_ + begin, 0,
                                  (long)(end - begin), (long)plan_.global_index(u, begin), step, decay_, cpu_threads_);
            });
            std::lock_guard<std::mutex> lock(update_mutex_);
            update_tiles_done_ = k + 1;
            update_cv_.notify_all();
        }
    }

    const ShardPlan& plan_;
    const LayoutMask& decay_;
    const ProcessGroup& pg_;
    cudaStream_t compute_;
    int stage_;
    bool params_on_host_, delayed_;
    int cpu_threads_;
    std::string offload_dir_;  // --offload-dir: the optimizer file's folder, or empty
    uint64_t run_id_;          // the run's id, which the optimizer file carries
    size_t elements_ = 0;      // the optimizer state's, of each array
    std::vector<floatX*> shard_params_, shard_grads_;  // this rank's slice of each unit on the device
    floatX* host_param_shard_ = nullptr;               // the parameter shard on the host (--offload optimizer,parameters)
    // pinned; null with the optimizer file, whose tiles hold them instead
    float *master_ = nullptr, *adam_m_ = nullptr, *adam_v_ = nullptr;
    std::unique_ptr<OptimizerFile> file_;
    // The pinned staging slots (no parameter slots when the parameter shard is the host's), the copy streams each way
    // and their events (a slot's tile is down, a slot's parameters are up; the step's start, the norm on the host, the
    // last upload)
    floatX *host_grads_[kSlots] = {}, *host_params_[kSlots] = {};
    cudaStream_t download_ = nullptr, upload_ = nullptr;
    std::vector<cudaEvent_t> downloaded_, uploaded_;
    cudaEvent_t offload_start_ = nullptr, norm_ready_ = nullptr, offload_done_ = nullptr;
    // The delayed update: the whole-shard host buffers (no slots), the gradients' clearing after their copy down (the
    // compute stream's reads are done, the copy stream cleared them), and the host thread with what it shares with the
    // main thread: the update asked for, its progress in tiles, the stop at destruction (under update_mutex_).
    bool delay_update_ = false;
    bool update_running_ = false;  // main thread's: started and not yet landed
    floatX *host_shard_grads_ = nullptr, *host_shard_params_ = nullptr;
    cudaEvent_t grads_read_ = nullptr, grads_cleared_ = nullptr;
    int device_ = 0;
    std::thread update_thread_;
    std::mutex update_mutex_;
    std::condition_variable update_cv_;
    bool update_requested_ = false, stop_updates_ = false;
    int update_tiles_done_ = 0;
    adamw_cpu::Step update_step_ = {};
};
