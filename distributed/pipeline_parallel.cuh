// Pipeline parallelism (Huang et al. 2019; Narayanan et al. 2021, Megatron-LM's `schedules.py`): the layers are
// split into stages, one per rank of a pipeline group, and a step's micro-batches flow through them.
//
// The schedule (distributed/pipeline_schedule.h) gives each stage its compute actions (forward or backward of a
// micro-batch on one of its model chunks, and the activation set that holds it; ZB-H1 splits the backward into
// its input gradient B and its weight gradients W, model/backward_part.h's BackwardPart, and names the gradient slot
// that holds the output gradients from B to W) and its transfers (activations forward, their gradients backward,
// sent by the backward or B), each transfer keyed by its simulated send time.
// This file runs them:
//   - compute on the model's stream, in the schedule's order;
//   - transfers by ncclSend/ncclRecv on a communication stream, in key order, transfers of equal key in one
//     ncclGroupStart/End, so they overlap the compute. The keys are the same on both sides of every transfer,
//     every action's inputs have a smaller key than its start, and a receive into an activation set comes after
//     the set's previous backward: so every rank issues its transfers in an order that cannot deadlock (the
//     schedule's tests check this on the CPU);
//   - events join the two streams: a send waits for the action that produced its data, an action for the
//     receive of its input, a receive into a set for the set's previous micro-batch's last use of it (its
//     backward; ZB-H1: its W, which reads the layer inputs kept in the set). A gradient slot needs no event: the
//     B's and W's that use it all run on the compute stream, a W before the B that takes its slot next.
// The host enqueues both streams in one merged order (pipeline_schedule.h's host_order), so that every event is
// recorded before it is waited for.
//
// Gradients: the last stage runs the LM head's backward right after its forward (so the logits need no copy
// per micro-batch in flight); ZeRO (stages 0-1 with pipelines) reduces each unit after its last micro-batch's
// backward (ZB-H1: its last W, every stage's last action), and the tied token embedding is summed over the
// embedding group at the end (ZeroOptimizer).
// Also the pipeline's report: its predicted bubble at start-up (PipelineForecast), the bubble of each step, and at
// the end every stage's timing with the schedule simulated on the stages' measured work. Outside the schedule: the
// forward of one batch through every stage (evaluation and sampling) and a host gather over the stages.
// defines: PipelineForecast, forecast_pipeline, print_pipeline_plan, forward_all_stages, gather_over_pipeline,
//          PipelineParallel
#pragma once
#include <cstdio>
#include <vector>
#include <string>
#include <algorithm>
#include "../kernels/common.cuh"
#include "pipeline_schedule.h"
#include "../model/backward_part.h"  // defines: BackwardPart
#include "process_group.h"
#include "mesh.h"
#include "nccl.h"              // defines: nccl_type
#include "tensor_parallel.cuh"  // defines: TensorParallel (its host gather)

// What a schedule predicts for the bubble: the formula's idle share (ZB-H1's with a layer's forward, B and W work),
// and the first stage's simulated with each virtual stage's work (forward_work, backward_work, ZB-H1's
// weight_work, in layer forwards; the LM head's head_work on the last). `layer` is layer_backward_actions_work's.
struct PipelineForecast {
    PipelineScheduleKind kind = PipelineScheduleKind::kOneFOneB;
    int P = 1, m = 1, v = 1;
    double head_work = 0, theory = 0, with_work = 0;
    std::vector<double> forward_work, backward_work, weight_work;
};
inline PipelineForecast forecast_pipeline(PipelineScheduleKind kind, int P, int m, int v, const std::vector<int>& per_virtual_stage,
                                          const LayerBackwardWork& layer, double head_work) {
    PipelineForecast f;
    f.kind = kind;
    f.P = P;
    f.m = m;
    f.v = v;
    f.head_work = head_work;
    f.theory = pipeline_bubble_theory(kind, P, m, v, 1.0, layer.backward, layer.weight_gradient);
    pipeline_stage_work(per_virtual_stage, layer.backward, head_work, &f.forward_work, &f.backward_work, layer.weight_gradient, &f.weight_work);
    f.with_work = simulate_pipeline(kind, P, m, v, f.forward_work, f.backward_work, f.weight_work).idle_share[0];
    return f;
}
inline void print_pipeline_plan(FILE* out, const PipelineForecast& f) {
    fprintf(out, "pipeline: %d stages, schedule %s with %d model chunk%s per stage, %d micro-batches: bubble %.1f%% by the formula, %.1f%% "
                 "on the first stage simulated with each stage's work (the LM head adds %.1f layer forwards to the last); per stage:\n",
            f.P, pipeline_schedule_name(f.kind), f.v, f.v > 1 ? "s" : "", f.m, 100.0 * f.theory, 100.0 * f.with_work, f.head_work);
}

// A forward of the batch uploaded to the model (Model::upload_batch) through every stage (evaluation and sampling):
// the chunks in the order of their virtual stages (chunk k of stage s is virtual stage k x P + s), each stage
// receiving the residual stream from the one before and sending its chunk's output on, on the compute stream: one
// micro-batch flows along a chain, which cannot deadlock. The loss (with_loss) and the logits end on the last stage.
template <typename Model>
void forward_all_stages(Model& model, bool with_loss) {
    using floatX = typename Model::Float;
    const Communicator& stages = model.mesh.pipeline;
    const int P = stages.size;
    if (P == 1) {
        model.forward(with_loss, 0.0f);
        return;
    }
    const size_t n = (size_t)model.region_rows() * model.config.channels;
    for (int k = 0; k < model.num_chunks(); k++) {
        auto& set = model.sets[k][0];
        const int virtual_stage = k * P + stages.rank;
        if (!model.model_begins(k))
            ncclCheck(ncclRecv(set.input, n, nccl_type<floatX>(), (virtual_stage - 1) % P, stages.comm, model.stream));
        model.forward_chunk(k, set);
        if (model.model_ends(k)) model.head_forward(set, with_loss, 0.0f);
        else ncclCheck(ncclSend(model.chunk_output(k, set), n, nccl_type<floatX>(), (virtual_stage + 1) % P, stages.comm, model.stream));
    }
}

// A host gather of one vector per stage over the pipeline group (model/whole_model.cuh assembles the whole model
// with it); keep = false: only the main rank gets the vectors.
template <typename Model>
std::vector<std::vector<float>> gather_over_pipeline(const Model& model, const std::vector<float>& local, bool keep = true) {
    TensorParallel<typename Model::Float> over_stages;  // its host gather, on the pipeline group
    over_stages.group = model.mesh.pipeline;
    return over_stages.all_gather_host(local, model.stream, model.pg, keep);
}

template <typename Model>
class PipelineParallel {
public:
    PipelineParallel(const PipelineSchedule& schedule, const Communicator& pipeline) : schedule_(schedule), group_(pipeline) {}
    PipelineParallel(const PipelineParallel&) = delete;
    PipelineParallel& operator=(const PipelineParallel&) = delete;

    const StageSchedule& mine() const { return schedule_.stages[group_.rank]; }
    int micro_batches() const { return schedule_.m; }

    // After model.allocate(..., mine().slots, mine().grad_slots).
    void allocate() {
        cudaCheck(cudaStreamCreateWithFlags(&transfers_, cudaStreamNonBlocking));
        const StageSchedule& s = mine();
        for (size_t k = 0; k < s.slots.size(); k++) {
            events_.emplace_back(s.slots[k]);
            for (SetEvents& e : events_.back())
                for (cudaEvent_t& ev : e.all) cudaCheck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        }
        cudaCheck(cudaEventCreateWithFlags(&transfers_done_, cudaEventDisableTiming));
        timing_.resize(2 * s.actions.size());
        for (cudaEvent_t& e : timing_) cudaCheck(cudaEventCreate(&e));
    }
    ~PipelineParallel() {
        for (auto& chunk : events_)
            for (SetEvents& e : chunk)
                for (cudaEvent_t ev : e.all) cudaEventDestroy(ev);
        for (cudaEvent_t e : timing_) cudaEventDestroy(e);
        if (transfers_done_) cudaEventDestroy(transfers_done_);
        if (transfers_) cudaStreamDestroy(transfers_);
    }

    // One training step's forwards and backwards: micro-batch i's tokens are inputs[i] and targets[i] (B*T each,
    // host). Gradients accumulate into the model's; the losses are summed for take_mean_loss(). Enqueued only.
    void run_step(Model& model, const std::vector<std::vector<int>>& inputs, const std::vector<std::vector<int>>& targets, float dloss) {
        const StageSchedule& s = mine();
        const int m = schedule_.m;
        const size_t n = (size_t)model.region_rows() * model.config.channels;  // a residual stream's elements on this rank
        auto& trained = model.trained();
        cudaCheck(cudaEventRecord(transfers_done_, model.stream));  // the transfers start after what the stream did before
        cudaCheck(cudaStreamWaitEvent(transfers_, transfers_done_));
        for (const HostStep& step : host_order(s)) {  // every event recorded before it is waited for
            if (step.transfers) {
                enqueue_group(model, step.first, step.last, n);
                continue;
            }
            const size_t i = step.first;
            const PipelineAction& a = s.actions[i];
            auto& set = model.sets[a.chunk][a.slot];
            SetEvents& e = events_[a.chunk][a.slot];
            const bool last_micro_batch = a.micro_batch == m - 1;
            // the action's inputs first: the time spent waiting for them is the stage's idle time, outside the timing
            if (a.type == PipelineAction::kForward) {
                if (!model.model_begins(a.chunk)) cudaCheck(cudaStreamWaitEvent(model.stream, e.input_ready));
                cudaCheck(cudaStreamWaitEvent(model.stream, e.gradient_sent));  // the set's previous dresidual has left
            } else if (a.type != PipelineAction::kWeightGradient && !model.model_ends(a.chunk)) {
                cudaCheck(cudaStreamWaitEvent(model.stream, e.gradient_ready));
            }
            cudaCheck(cudaEventRecord(timing_[2 * i], model.stream));
            model.begin_micro_batch(a.micro_batch);
            if (a.type == PipelineAction::kForward) {
                if (model.model_begins(a.chunk) || model.model_ends(a.chunk))
                    model.upload_batch(inputs[a.micro_batch].data(), targets[a.micro_batch].data(), a.chunk, a.slot);
                model.forward_chunk(a.chunk, set);
                if (model.model_ends(a.chunk)) {
                    model.head_forward(set, true, dloss);
                    model.accumulate_loss();
                    trained.begin_backward(last_micro_batch);
                    model.head_backward(set);
                }
                cudaCheck(cudaEventRecord(e.forward_done, model.stream));
            } else {
                // again: another chunk's actions may have come in between (ZB-H1: the last W reduces the gradients)
                trained.begin_backward(last_micro_batch);
                model.backward_chunk(a.chunk, set, backward_part(a.type), a.grad_slot);
                if (a.type != PipelineAction::kWeightGradient) cudaCheck(cudaEventRecord(e.backward_done, model.stream));
                if (a.type != PipelineAction::kInputGradient) cudaCheck(cudaEventRecord(e.set_free, model.stream));
            }
            cudaCheck(cudaEventRecord(timing_[2 * i + 1], model.stream));
        }
        // the compute stream waits for the last transfer (the pipeline communicator is used on it next) and ends
        // the backward: ZeRO's reductions and the tied embedding's sum
        cudaCheck(cudaEventRecord(transfers_done_, transfers_));
        cudaCheck(cudaStreamWaitEvent(model.stream, transfers_done_));
        if (!model.layout.part.last) model.loss.forwards += m;  // the losses are the last stage's
        trained.end_backward();
    }
    static BackwardPart backward_part(PipelineAction::Type type) {
        return type == PipelineAction::kInputGradient ? BackwardPart::kInputGradient
               : type == PipelineAction::kWeightGradient ? BackwardPart::kWeightGradient
                                                          : BackwardPart::kBoth;
    }

    // After the step has been waited for: this stage's actions on the compute stream, from the first one's start
    // to the last one's end (span), and the time inside them (busy: in forward actions, which on the last stage
    // include the LM head's forward and backward, in backward actions (ZB-H1: B) and in ZB-H1's W actions); the
    // idle share is the stage's bubble.
    struct StageTiming {
        double span_ms = 0, busy_ms = 0, forward_ms = 0, backward_ms = 0, weight_ms = 0;
        double bubble() const { return span_ms > 0 ? std::max(0.0, (span_ms - busy_ms) / span_ms) : 0.0; }
    };
    StageTiming measured() const {
        StageTiming t;
        float ms;
        if (timing_.empty()) return t;
        cudaCheck(cudaEventElapsedTime(&ms, timing_.front(), timing_.back()));
        t.span_ms = ms;
        for (size_t i = 0; i < timing_.size() / 2; i++) {
            cudaCheck(cudaEventElapsedTime(&ms, timing_[2 * i], timing_[2 * i + 1]));
            const PipelineAction::Type type = mine().actions[i].type;
            (type == PipelineAction::kForward ? t.forward_ms : type == PipelineAction::kWeightGradient ? t.weight_ms : t.backward_ms) += ms;
        }
        t.busy_ms = t.forward_ms + t.backward_ms + t.weight_ms;
        return t;
    }

    // Every stage's timing over `timings` (the steps after the warm-up; the step log shows the first stage's): a
    // slower stage makes the others wait. Then, on the first stage, the schedule simulated with each stage's measured
    // busy time (split over its chunks, and each chunk's over forward, backward and ZB-H1's W, as the work model
    // splits them): what the stages' unequal speeds alone leave. A collective of the pipeline group.
    void report_timings(const Model& model, const std::vector<StageTiming>& timings, const PipelineForecast& f) const {
        std::vector<double> busy, forward, backward, weight, span, bubble;
        for (const StageTiming& t : timings) {
            busy.push_back(t.busy_ms);
            forward.push_back(t.forward_ms);
            backward.push_back(t.backward_ms);
            weight.push_back(t.weight_ms);
            span.push_back(t.span_ms);
            bubble.push_back(t.bubble());
        }
        char backward_text[96];  // ZB-H1's B and W apart
        if (f.kind == PipelineScheduleKind::kZeroBubbleH1)
            snprintf(backward_text, sizeof backward_text, "input gradients (B) %.2f, weight gradients (W) %.2f", median_of(backward), median_of(weight));
        else
            snprintf(backward_text, sizeof backward_text, "backward %.2f", median_of(backward));
        printf("pipeline stage %d: median over the timed steps: busy %.2f ms (forward actions %.2f%s, %s) of a %.2f ms span, bubble %.1f%%\n",
               group_.rank, median_of(busy), median_of(forward), model.layout.part.last ? " with the LM head's forward and backward" : "",
               backward_text, median_of(span), 100.0 * median_of(bubble));
        fflush(stdout);
        const std::vector<std::vector<float>> stage_busy = gather_over_pipeline(model, {(float)median_of(busy)});
        if (group_.rank != 0) return;
        const int P = f.P, K = P * f.v;
        std::vector<double> chunk_forward(K), chunk_backward(K), chunk_weight(K);
        for (int s = 0; s < P; s++) {
            double work = 0;  // the stage's modelled work per micro-batch
            for (int k = s; k < K; k += P) work += f.forward_work[k] + f.backward_work[k] + f.weight_work[k];
            for (int k = s; k < K; k += P) {
                chunk_forward[k] = stage_busy[s][0] / f.m * f.forward_work[k] / work;
                chunk_backward[k] = stage_busy[s][0] / f.m * f.backward_work[k] / work;
                chunk_weight[k] = stage_busy[s][0] / f.m * f.weight_work[k] / work;
            }
        }
        printf("pipeline: the schedule simulated with each stage's measured busy time leaves the first stage %.1f%% idle\n",
               100.0 * simulate_pipeline(f.kind, P, f.m, f.v, chunk_forward, chunk_backward, chunk_weight).idle_share[0]);
        fflush(stdout);
    }

private:
    struct SetEvents {  // of one activation set
        cudaEvent_t all[6] = {};
        cudaEvent_t& forward_done = all[0];
        cudaEvent_t& backward_done = all[1];   // its input's gradient computed: by the backward, or ZB-H1's B
        cudaEvent_t& input_ready = all[2];     // its input received
        cudaEvent_t& gradient_ready = all[3];  // its output's gradient received
        cudaEvent_t& gradient_sent = all[4];   // its input's gradient (dresidual) sent
        cudaEvent_t& set_free = all[5];        // its micro-batch's last use done: the backward, or ZB-H1's W
        SetEvents() = default;
        SetEvents(const SetEvents&) : SetEvents() {}  // the references must point into the copy
    };

    // Transfers [begin, end) of this stage's list, all of one key, as one NCCL group on the transfer stream.
    void enqueue_group(Model& model, size_t begin, size_t end, size_t n) {
        const StageSchedule& s = mine();
        using floatX = typename Model::Float;
        for (size_t i = begin; i < end; i++) {
            const PipelineTransfer& t = s.transfers[i];
            SetEvents& e = events_[t.chunk][t.slot];
            if (t.send) cudaCheck(cudaStreamWaitEvent(transfers_, t.gradient ? e.backward_done : e.forward_done));
            else if (!t.gradient) cudaCheck(cudaStreamWaitEvent(transfers_, e.set_free));  // the set's previous micro-batch is done
        }
        ncclCheck(ncclGroupStart());
        for (size_t i = begin; i < end; i++) {
            const PipelineTransfer& t = s.transfers[i];
            auto& set = model.sets[t.chunk][t.slot];
            floatX* buffer = t.gradient ? set.dresidual : t.send ? model.chunk_output(t.chunk, set) : set.input;
            if (t.send) ncclCheck(ncclSend(buffer, n, nccl_type<floatX>(), t.peer, group_.comm, transfers_));
            else ncclCheck(ncclRecv(buffer, n, nccl_type<floatX>(), t.peer, group_.comm, transfers_));
        }
        ncclCheck(ncclGroupEnd());
        for (size_t i = begin; i < end; i++) {
            const PipelineTransfer& t = s.transfers[i];
            SetEvents& e = events_[t.chunk][t.slot];
            if (!t.send) cudaCheck(cudaEventRecord(t.gradient ? e.gradient_ready : e.input_ready, transfers_));
            else if (t.gradient) cudaCheck(cudaEventRecord(e.gradient_sent, transfers_));
        }
    }

    PipelineSchedule schedule_;
    Communicator group_;
    cudaStream_t transfers_ = nullptr;
    cudaEvent_t transfers_done_ = nullptr;
    std::vector<std::vector<SetEvents>> events_;  // [chunk][slot]
    std::vector<cudaEvent_t> timing_;             // start and end of each action on the compute stream
};
