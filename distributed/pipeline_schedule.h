// Pipeline-parallel schedules: which forward and backward each pipeline stage (rank) runs in which order, and
// the point-to-point messages between them, for the 1F1B and the interleaved 1F1B schedules of Narayanan et
// al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"), and ZB-H1 of
// Qi et al. 2023 ("Zero Bubble Pipeline Parallelism"), which splits each backward into the input gradient (B,
// which the previous stage waits for) and the weight gradient (W, which nothing waits for) and runs W's late,
// in the time 1F1B's stages wait (`--pipeline-schedule zb1`).
//
// make_pipeline_schedule builds each rank's order, then simulates it with fixed forward, backward (B) and
// weight-gradient (W) times.
// The simulated times are not a prediction the driver relies on; they give every message a key (its send
// time) that both sides agree on, so that sorting each rank's messages by key orders them the same way on
// every rank (no deadlock), and they decide which activation set ("slot") each micro-batch uses, and under ZB-H1
// which set of output gradients ("gradient slot"), kept from its B to its W.
// simulate_pipeline runs the same orders with each virtual stage's own work (the LM head makes the last one
// heavier): the idle share that predicts, and the layer split that shortens the step (pipeline_layer_split's
// "balanced").
//
// Model chunks and virtual stages: with v chunks per rank, the model's layers form P*v virtual stages;
// virtual stage k = chunk * P + stage runs on rank k % P. 1F1B is the case v = 1.
//
// Header-only with no CUDA or NCCL (test/test_pipeline_schedule.cpp compiles it with g++).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

enum class PipelineScheduleKind { kOneFOneB, kInterleaved, kZeroBubbleH1 };

// "1f1b" / "interleaved" / "zb1"; false for anything else.
inline bool parse_pipeline_schedule(const std::string& name, PipelineScheduleKind* kind) {
    if (name == "1f1b") *kind = PipelineScheduleKind::kOneFOneB;
    else if (name == "interleaved") *kind = PipelineScheduleKind::kInterleaved;
    else if (name == "zb1") *kind = PipelineScheduleKind::kZeroBubbleH1;
    else return false;
    return true;
}

inline const char* pipeline_schedule_name(PipelineScheduleKind kind) {
    switch (kind) {
        case PipelineScheduleKind::kOneFOneB: return "1f1b";
        case PipelineScheduleKind::kInterleaved: return "interleaved";
        case PipelineScheduleKind::kZeroBubbleH1: return "zb1";
    }
    return "unknown";
}

namespace pipeline_detail {

inline std::string stages_flags(int P, int v) {
    return "--pipeline-parallel " + std::to_string(P) + (v > 1 ? " x --virtual-stages " + std::to_string(v) : "");
}
// n layers in `parts` equal parts, the remainder one each to the last parts (pipeline_layer_split says why).
inline std::vector<int> even_split(int n, int parts) {
    std::vector<int> split;
    for (int k = 0; k < parts; k++) split.push_back(n / parts + (k >= parts - n % parts));
    return split;
}
// "" when every one of the P*v virtual stages can get a layer.
inline std::string layers_problem(int layers, int P, int v) {
    if (layers >= P * v) return "";
    return stages_flags(P, v) + ": the " + std::to_string(layers) + (layers == 1 ? " layer" : " layers") + " cannot fill " +
           std::to_string(P * v) + (v > 1 ? " virtual stages" : " stages") + " (each needs at least one layer)";
}

}  // namespace pipeline_detail

// The most micro-batches a step of a pipeline runs: the schedule lists every one of them on every stage, and the
// balanced split simulates the step once per candidate split (4096 covers a 4M-token batch of single 1024-token rows).
constexpr int kMaxPipelineMicroBatches = 4096;

// "" when the schedule can run P stages, m micro-batches, v model chunks per rank and `layers` transformer
// layers; otherwise one line naming the flags and values. 1F1B runs any m in 1..kMaxPipelineMicroBatches (m < P
// is allowed but leaves each stage idle for most of the step: the bubble is (P-1)/(m+P-1)), and so does ZB-H1.
// The interleaved schedule hands out micro-batches in groups of P per chunk, so it needs m to be a multiple of P.
inline std::string pipeline_schedule_problem(PipelineScheduleKind kind, int P, int m, int v, int layers) {
    if (P < 1) return "--pipeline-parallel " + std::to_string(P) + " must be at least 1";
    if (v < 1) return "--virtual-stages " + std::to_string(v) + " must be at least 1";
    if (m < 1)
        return "--pipeline-parallel " + std::to_string(P) + " needs at least 1 micro-batch (gradient-accumulation step), not " +
               std::to_string(m);
    if (m > kMaxPipelineMicroBatches)
        return "--pipeline-parallel " + std::to_string(P) + " runs at most " + std::to_string(kMaxPipelineMicroBatches) +
               " micro-batches (gradient-accumulation steps) a step, not " + std::to_string(m) +
               ": raise --batch-size or lower --total-batch-tokens";
    if (kind != PipelineScheduleKind::kInterleaved && v != 1)
        return "--virtual-stages " + std::to_string(v) + " needs --pipeline-schedule interleaved (" + pipeline_schedule_name(kind) +
               " runs one model chunk per stage)";
    if (kind == PipelineScheduleKind::kInterleaved) {
        if (v < 2) return "--pipeline-schedule interleaved needs --virtual-stages of at least 2, not " + std::to_string(v);
        if (P < 2) return "--pipeline-schedule interleaved needs --pipeline-parallel of at least 2, not " + std::to_string(P);
        if (m % P != 0)
            return "--pipeline-schedule interleaved needs the " + std::to_string(m) +
                   " micro-batches (gradient-accumulation steps) to be a multiple of --pipeline-parallel " + std::to_string(P);
    }
    return pipeline_detail::layers_problem(layers, P, v);
}

// Layers per virtual stage (P*v entries, virtual stage k = chunk * P + stage). `counts` empty: an even split,
// the remainder going one each to the LAST virtual stages, so that the first stage, which also holds the
// embeddings, is never the heaviest. Otherwise `counts` is --pipeline-layers' comma list ("3,3,2,4") of P*v
// positive entries summing to `layers`. Returns "" or a one-line problem.
inline std::string pipeline_layer_split(int layers, int P, int v, const std::string& counts, std::vector<int>* per_virtual_stage) {
    per_virtual_stage->clear();
    const int stages = P * v;
    if (counts.empty()) {
        const std::string problem = pipeline_detail::layers_problem(layers, P, v);
        if (!problem.empty()) return problem;
        *per_virtual_stage = pipeline_detail::even_split(layers, stages);
        return "";
    }
    const std::string flag = "--pipeline-layers " + counts;
    std::vector<int> parsed;
    long long sum = 0;
    size_t begin = 0;
    while (true) {
        const size_t comma = std::min(counts.find(',', begin), counts.size());
        const std::string entry = counts.substr(begin, comma - begin);
        // Digits only (no sign, space or exponent), and few enough of them for an int.
        if (entry.empty() || entry.size() > 9 || entry.find_first_not_of("0123456789") != std::string::npos)
            return flag + ": \"" + entry + "\" is not a whole number of layers";
        parsed.push_back(std::stoi(entry));
        if (parsed.back() == 0)
            return flag + ": entry " + std::to_string(parsed.size()) + " is 0, but every virtual stage needs at least one layer";
        sum += parsed.back();
        if (comma == counts.size()) break;
        begin = comma + 1;
    }
    if ((int)parsed.size() != stages)
        return flag + ": " + std::to_string(parsed.size()) + " entries, but " + pipeline_detail::stages_flags(P, v) + " makes " +
               std::to_string(stages) + (v > 1 ? " virtual stages" : " stages");
    if (sum != layers)
        return flag + ": the entries sum to " + std::to_string(sum) + ", but the model has " + std::to_string(layers) + " layers";
    *per_virtual_stage = parsed;
    return "";
}

struct PipelineAction {              // one compute action of one rank, in execution order
    // kBackward: both gradients of the chunk (1F1B, interleaved). ZB-H1 splits it: kInputGradient (B) computes
    // and sends the gradient of the chunk's input, kWeightGradient (W) the weight gradients, later, from the
    // layer inputs and output gradients that B leaves in the slot; W sends nothing.
    enum Type { kForward, kBackward, kInputGradient, kWeightGradient } type;
    int micro_batch;                 // 0..m-1
    int chunk;                       // this rank's model chunk 0..v-1; virtual stage = chunk * P + stage
    int slot;                        // the activation set of this chunk that holds the micro-batch
    int grad_slot;                   // B and W: the gradient slot of this chunk that holds the micro-batch's output
                                     // gradients from B's start to W's end; -1 for the other actions
    double start, end;               // simulated times
};
struct PipelineTransfer {            // one point-to-point message as seen by one rank
    bool send;                       // true: this rank sends; false: receives
    bool gradient;                   // false: an activation (forward direction), true: its gradient (backward)
    int peer;                        // the other stage (rank in the pipeline group)
    int micro_batch;
    int chunk;                       // THIS rank's chunk whose buffer is read (send) or written (receive)
    int slot;                        // and that chunk's activation set
    double key;                      // simulated send time = end of the producing action (the same on both sides)
};
struct StageSchedule {
    std::vector<PipelineAction> actions;       // execution order (sorted by start)
    std::vector<PipelineTransfer> transfers;   // sorted by key; transfers of equal key form one group (ncclGroupStart/End)
    std::vector<int> slots;                    // activation sets needed per chunk (v entries)
    std::vector<int> grad_slots;               // gradient slots needed per chunk (v entries; 0 but under ZB-H1): the
                                               // most micro-batches whose B has started and whose W has not ended
    int max_in_flight = 0;                     // most micro-batches (over all chunks) whose forward began and whose
                                               // backward (ZB-H1: W) has not ended
    double busy = 0;                           // sum of action durations
};
struct PipelineSchedule {
    PipelineScheduleKind kind;
    int P, m, v;
    std::vector<StageSchedule> stages;         // one per rank of the pipeline group
    double makespan = 0;
    // Mean over stages of the idle fraction (makespan - busy) / makespan.
    double bubble() const {
        double sum = 0;
        for (const StageSchedule& s : stages) sum += (makespan - s.busy) / makespan;
        return sum / stages.size();
    }
};

namespace pipeline_detail {

struct Step {
    PipelineAction::Type type;
    int micro_batch, chunk;
};
constexpr PipelineAction::Type kF = PipelineAction::kForward, kFullBackward = PipelineAction::kBackward,
                               kB = PipelineAction::kInputGradient, kW = PipelineAction::kWeightGradient;

// 1F1B on stage s: P-1-s forwards fill the pipeline (the later stages then get work without waiting), then
// each forward is followed by the oldest outstanding backward, which caps the micro-batches in flight at
// P - s; the last backwards drain it.
inline std::vector<Step> one_f_one_b_order(int P, int m, int s) {
    const int warmup = std::min(P - 1 - s, m);
    std::vector<Step> order;
    for (int i = 0; i < warmup; i++) order.push_back({kF, i, 0});
    for (int i = warmup; i < m; i++) {
        order.push_back({kF, i, 0});
        order.push_back({kFullBackward, i - warmup, 0});
    }
    for (int i = m - warmup; i < m; i++) order.push_back({kFullBackward, i, 0});
    return order;
}

// ZB-H1 on stage s: 1F1B's order of forwards and B's, each B followed by the oldest waiting W once more than s
// W's wait; the W's still waiting after the last B run at the end. Holding W's back runs the B's, which the
// earlier stages wait for, sooner, and the held W's fill the end of the step, when 1F1B's later stages idle while
// the last gradients travel to the first stage. With 1F1B's P-1-s warm-up forwards every stage then has up to P
// micro-batches in flight (until their W ends), as many as 1F1B's first stage.
inline std::vector<Step> zero_bubble_h1_order(int P, int m, int s) {
    const int warmup = std::min(P - 1 - s, m);
    std::vector<Step> order;
    int oldest_waiting_weight = 0;
    auto input_gradient = [&](int i) {
        order.push_back({kB, i, 0});
        if (i + 1 - oldest_waiting_weight > s) order.push_back({kW, oldest_waiting_weight++, 0});
    };
    for (int i = 0; i < warmup; i++) order.push_back({kF, i, 0});
    for (int i = warmup; i < m; i++) {
        order.push_back({kF, i, 0});
        input_gradient(i - warmup);
    }
    for (int i = m - warmup; i < m; i++) input_gradient(i);
    while (oldest_waiting_weight < m) order.push_back({kW, oldest_waiting_weight++, 0});
    return order;
}

// Megatron-LM's depth-first interleaved order on stage s. The m*v forwards of a rank run in groups of P
// micro-batches per chunk: micro-batches 0..P-1 through chunk 0, then the same ones through chunk 1, ...,
// then micro-batches P..2P-1 through chunk 0, and so on; backwards go the same way through the chunks in
// reverse. The warm-up is Megatron's: (v-1)*P forwards, which reach the last chunk, whose backwards come
// first, plus 2 for each later stage, which the first micro-batch's round trip through them takes. (Megatron
// runs all forwards first when m == P; the general rule gives the same bubble there with fewer micro-batches
// in flight on the later stages.)
inline std::vector<Step> interleaved_order(int P, int m, int v, int s) {
    const int total = m * v;
    const int warmup = std::min((P - 1 - s) * 2 + (v - 1) * P, total);
    auto step = [&](int i, bool backward) {
        const int chunk_in_group = i % (P * v) / P;
        return Step{backward ? kFullBackward : kF, i / (P * v) * P + i % P, backward ? v - 1 - chunk_in_group : chunk_in_group};
    };
    std::vector<Step> order;
    for (int i = 0; i < warmup; i++) order.push_back(step(i, false));
    for (int i = warmup; i < total; i++) {
        order.push_back(step(i, false));
        order.push_back(step(i - warmup, true));
    }
    for (int i = total - warmup; i < total; i++) order.push_back(step(i, true));
    return order;
}

}  // namespace pipeline_detail

namespace pipeline_detail {

struct Times {
    double start = -1, end = -1;
    bool done() const { return end >= 0; }
};
struct Simulated {
    std::vector<std::vector<Step>> orders;        // per rank
    std::vector<Times> forward, backward, weight;  // indexed by virtual stage * m + micro-batch; backward holds the
                                                  // backward or B, weight ZB-H1's W
    std::vector<Times>& of(PipelineAction::Type type) { return type == kF ? forward : type == kW ? weight : backward; }
    const std::vector<Times>& of(PipelineAction::Type type) const { return type == kF ? forward : type == kW ? weight : backward; }
    // The action after which a micro-batch's activations on virtual stage k are no longer needed.
    const Times& last_use(PipelineScheduleKind kind, int k, int m, int i) const {
        return (kind == PipelineScheduleKind::kZeroBubbleH1 ? weight : backward)[k * m + i];
    }
};
// The lowest slot that in_use marks free, marked in use (a new one when all are).
inline int take_lowest_free(std::vector<bool>& in_use) {
    const int slot = std::find(in_use.begin(), in_use.end(), false) - in_use.begin();
    if (slot == (int)in_use.size()) in_use.push_back(false);
    in_use[slot] = true;
    return slot;
}
// The action whose output a step of virtual stage k consumes (K virtual stages); null for virtual stage 0's forward.
inline const Times* input_of(const Simulated& sim, const Step& step, int k, int K, int m) {
    const int i = step.micro_batch;
    if (step.type == kF) return k > 0 ? &sim.forward[(k - 1) * m + i] : nullptr;
    if (step.type == kW) return &sim.backward[k * m + i];
    return k < K - 1 ? &sim.backward[(k + 1) * m + i] : &sim.forward[k * m + i];
}

// Each rank's order, run as far as the inputs exist until all actions have run: an action starts at max(end of
// this rank's previous action, end of the producing action of its input) and takes forward_cost[k],
// backward_cost[k] (B) or weight_cost[k] (W) on virtual stage k, a backward of both gradients backward_cost[k] +
// weight_cost[k]. A forward of virtual stage k > 0 needs the activation of virtual stage k-1, a backward (or B)
// of virtual stage k < P*v-1 the gradient of virtual stage k+1; the backward of the last virtual stage needs
// only its own forward; a W needs its B.
inline Simulated simulate_orders(PipelineScheduleKind kind, int P, int m, int v, const std::vector<double>& forward_cost,
                                 const std::vector<double>& backward_cost, const std::vector<double>& weight_cost) {
    const int K = P * v;  // virtual stages
    Simulated sim;
    sim.orders.resize(P);
    size_t remaining = 0;
    for (int s = 0; s < P; s++) {
        sim.orders[s] = kind == PipelineScheduleKind::kOneFOneB  ? one_f_one_b_order(P, m, s)
                        : kind == PipelineScheduleKind::kInterleaved ? interleaved_order(P, m, v, s)
                                                                     : zero_bubble_h1_order(P, m, s);
        remaining += sim.orders[s].size();
    }
    sim.forward.assign(K * m, Times{});
    sim.backward.assign(K * m, Times{});
    sim.weight.assign(K * m, Times{});
    std::vector<size_t> next(P, 0);
    std::vector<double> rank_free(P, 0.0);
    while (remaining > 0) {
        bool progressed = false;
        for (int s = 0; s < P; s++) {
            while (next[s] < sim.orders[s].size()) {
                const Step& step = sim.orders[s][next[s]];
                const int k = step.chunk * P + s;
                const Times* input = input_of(sim, step, k, K, m);
                if (input && !input->done()) break;
                Times& t = sim.of(step.type)[k * m + step.micro_batch];
                const double cost = step.type == kF   ? forward_cost[k]
                                    : step.type == kB ? backward_cost[k]
                                    : step.type == kW ? weight_cost[k]
                                                      : backward_cost[k] + weight_cost[k];
                t.start = std::max(rank_free[s], input ? input->end : 0.0);
                t.end = rank_free[s] = t.start + cost;
                next[s]++;
                remaining--;
                progressed = true;
            }
        }
        if (!progressed) throw std::logic_error("pipeline schedule: the stages' orders wait on each other");
    }
    return sim;
}

}  // namespace pipeline_detail

// Builds each rank's order and simulates it (pipeline_detail::simulate_orders) with every chunk's forward taking
// forward_time / v, its input gradient (ZB-H1's B) backward_time / v and its weight gradients (ZB-H1's W)
// weight_gradient_time / v; 1F1B's and the interleaved schedule's backward computes both, in (backward_time +
// weight_gradient_time) / v. Then it lays out each rank's messages and activation sets (slots): a slot of a
// chunk is taken when the micro-batch's activation arrives (at its forward's start for virtual stage 0) and
// freed at the end of its backward (ZB-H1: of its W, which reads the layer inputs); the
// lowest free slot is taken, and at equal times frees come first. ZB-H1 also keeps each micro-batch's output
// gradients from its B to its W in a gradient slot of the chunk, taken at B's start and freed at W's end: a stage
// runs one action at a time in its order, so they are handed out in that order, the lowest free first; a W frees its
// slot for the B's after it in the order, whatever the times (the trainer's W takes no simulated time). On stage s
// at most min(m, s+1) micro-batches hold one (a B leaves at most s+1 W's waiting, the oldest then runs), against
// the min(m, P) activation sets. Integer times keep the simulation exact, so that messages sent at the same moment
// share one key (one group).
// Throws std::invalid_argument for a shape that pipeline_schedule_problem rejects.
inline PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int P, int m, int v, double forward_time = 1.0,
                                               double backward_time = 2.0, double weight_gradient_time = 0.0) {
    using namespace pipeline_detail;
    const std::string problem = pipeline_schedule_problem(kind, P, m, v, P * v);
    if (!problem.empty()) throw std::invalid_argument(problem);
    const int K = P * v;  // virtual stages

    // Simulate in units of 1/v of the final times (a chunk's forward takes forward_time), so that integer
    // times stay exact sums; they are divided by v at the end.
    const Simulated sim = simulate_orders(kind, P, m, v, std::vector<double>(K, forward_time), std::vector<double>(K, backward_time),
                                          std::vector<double>(K, weight_gradient_time));
    const std::vector<std::vector<Step>>& orders = sim.orders;
    const std::vector<Times>& forward = sim.forward;
    auto input_of = [&](const Step& step, int k) { return pipeline_detail::input_of(sim, step, k, K, m); };

    // Slots of each virtual stage, handed out in time order of the takes and frees.
    std::vector<int> slot_of(K * m), slots_needed(K);
    for (int k = 0; k < K; k++) {
        struct Event {
            double time;
            bool take;
            int micro_batch;
        };
        std::vector<Event> events;
        for (int i = 0; i < m; i++) {
            events.push_back({k == 0 ? forward[i].start : forward[(k - 1) * m + i].end, true, i});
            events.push_back({sim.last_use(kind, k, m, i).end, false, i});
        }
        std::sort(events.begin(), events.end(),
                  [](const Event& a, const Event& b) { return a.time != b.time ? a.time < b.time : !a.take && b.take; });
        std::vector<bool> in_use;
        for (const Event& e : events) {
            int& slot = slot_of[k * m + e.micro_batch];
            if (!e.take) {
                in_use[slot] = false;
                continue;
            }
            slot = take_lowest_free(in_use);
        }
        slots_needed[k] = in_use.size();
    }

    PipelineSchedule schedule{kind, P, m, v, std::vector<StageSchedule>(P)};
    for (int s = 0; s < P; s++) {
        StageSchedule& stage = schedule.stages[s];
        for (int c = 0; c < v; c++) stage.slots.push_back(slots_needed[c * P + s]);
        std::vector<std::vector<bool>> grad_in_use(v);  // per chunk: gradient slots held
        std::vector<int> grad_slot_of(v * m, -1);        // chunk * m + micro-batch
        std::vector<std::pair<double, int>> in_flight_changes;  // +1 at a forward's start, -1 at the slot's last use
        for (const Step& step : orders[s]) {
            const int k = step.chunk * P + s, i = step.micro_batch, slot = slot_of[k * m + i];
            int& grad_slot = grad_slot_of[step.chunk * m + i];
            if (step.type == kB) grad_slot = take_lowest_free(grad_in_use[step.chunk]);
            if (step.type == kW) grad_in_use[step.chunk][grad_slot] = false;
            const Times& t = sim.of(step.type)[k * m + i];
            stage.actions.push_back({step.type, i, step.chunk, slot, step.type == kB || step.type == kW ? grad_slot : -1, t.start / v, t.end / v});
            stage.busy += (t.end - t.start) / v;
            schedule.makespan = std::max(schedule.makespan, t.end / v);
            if (step.type == kF) in_flight_changes.emplace_back(t.start, +1);
            if (step.type == kFullBackward || step.type == kW) in_flight_changes.emplace_back(t.end, -1);
            if (step.type == kW) continue;  // W neither receives nor sends
            // The message this action sends to the neighbouring virtual stage, and the one it received from it.
            const bool gradient = step.type != kF;
            const int to = gradient ? k - 1 : k + 1, from = gradient ? k + 1 : k - 1;
            if (to >= 0 && to < K) stage.transfers.push_back({true, gradient, to % P, i, step.chunk, slot, t.end / v});
            if (from >= 0 && from < K) stage.transfers.push_back({false, gradient, from % P, i, step.chunk, slot, input_of(step, k)->end / v});
        }
        for (int c = 0; c < v; c++) stage.grad_slots.push_back(grad_in_use[c].size());
        std::stable_sort(stage.transfers.begin(), stage.transfers.end(),
                         [](const PipelineTransfer& a, const PipelineTransfer& b) { return a.key < b.key; });
        std::sort(in_flight_changes.begin(), in_flight_changes.end());  // at equal times the -1 comes first
        int in_flight = 0;
        for (const auto& change : in_flight_changes) stage.max_in_flight = std::max(stage.max_in_flight, in_flight += change.second);
    }
    return schedule;
}

// The order in which a stage's host enqueues its work (PipelineParallel::run_step), whose events join the compute
// and transfer streams: an event must be recorded before it is waited for, or the wait sees an older record. Each
// step is an action (index into actions) or a group of transfers of one key [first, last). A group of key k comes
// before the actions that start at k or later, except ZB-H1's W: the schedule may simulate it as taking no time,
// and the receive into the activation set it frees is keyed at its end, so that receive's wait for the set's
// release must come after it.
struct HostStep {
    bool transfers;      // false: one action
    size_t first, last;  // the action (first), or the transfer group [first, last)
};
inline std::vector<HostStep> host_order(const StageSchedule& s) {
    std::vector<HostStep> order;
    size_t next = 0;
    auto groups_before = [&](double time, bool including_time) {
        while (next < s.transfers.size() && (s.transfers[next].key < time || (including_time && s.transfers[next].key == time))) {
            size_t end = next;
            while (end < s.transfers.size() && s.transfers[end].key == s.transfers[next].key) end++;
            order.push_back({true, next, end});
            next = end;
        }
    };
    for (size_t i = 0; i < s.actions.size(); i++) {
        groups_before(s.actions[i].start, s.actions[i].type != PipelineAction::kWeightGradient);
        order.push_back({false, i, i + 1});
    }
    groups_before(INFINITY, true);
    return order;
}

// The bubble fraction the schedule should have, makespan idle over makespan, with make_pipeline_schedule's
// times F = forward_time, B = backward_time, W = weight_gradient_time: 1F1B (P-1)/(m+P-1) and interleaved
// (P-1)/(v*m+P-1) for any times. ZB-H1: every stage works m (F+B+W) of a step that lasts
//     m (F+B+W) + (P-1)(F+B) - (min(m,P) - 1) min(F,B,W),
// the simulated step for any times (the tests check it). With m >= P and W no longer than F or B the idle
// time is the paper's (P-1)(F+B-W), against 1F1B's (P-1)(F+B+W): a third of it when F = B = W.
inline double pipeline_bubble_theory(PipelineScheduleKind kind, int P, int m, int v, double forward_time = 1.0, double backward_time = 2.0,
                                     double weight_gradient_time = 0.0) {
    if (kind == PipelineScheduleKind::kZeroBubbleH1) {
        const double work = m * (forward_time + backward_time + weight_gradient_time);
        const double makespan = work + (P - 1) * (forward_time + backward_time) -
                                (std::min(m, P) - 1) * std::min({forward_time, backward_time, weight_gradient_time});
        return (makespan - work) / makespan;
    }
    const int chunks = kind == PipelineScheduleKind::kOneFOneB ? 1 : v;
    return double(P - 1) / (chunks * m + P - 1);
}

// A pipeline step in which virtual stage k's forward takes forward_cost[k], its input gradient backward_cost[k]
// and its weight gradients weight_gradient_cost[k] (any unit; empty: none, the backward_cost is the whole
// backward), 1F1B's and the interleaved schedule's backward both: each stage's idle share of its span, (span - busy) / span from its first action's start to its last
// action's end (what the step log measures on the first stage), and the step's length. With equal work on every
// virtual stage the first stage's share is pipeline_bubble_theory's; a heavier stage makes the others wait.
// Throws std::invalid_argument for a shape that pipeline_schedule_problem rejects or costs of the wrong length.
struct PipelineSimulation {
    std::vector<double> idle_share;  // per stage
    double makespan = 0;
};
inline PipelineSimulation simulate_pipeline(PipelineScheduleKind kind, int P, int m, int v, const std::vector<double>& forward_cost,
                                            const std::vector<double>& backward_cost, const std::vector<double>& weight_gradient_cost = {}) {
    const std::string problem = pipeline_schedule_problem(kind, P, m, v, P * v);
    if (!problem.empty()) throw std::invalid_argument(problem);
    if ((int)forward_cost.size() != P * v || (int)backward_cost.size() != P * v ||
        !(weight_gradient_cost.empty() || (int)weight_gradient_cost.size() == P * v))
        throw std::invalid_argument("simulate_pipeline: one forward, one backward and none or one weight-gradient cost per virtual stage");
    const std::vector<double> weight = weight_gradient_cost.empty() ? std::vector<double>(P * v, 0.0) : weight_gradient_cost;
    const pipeline_detail::Simulated sim = pipeline_detail::simulate_orders(kind, P, m, v, forward_cost, backward_cost, weight);
    PipelineSimulation result;
    for (int s = 0; s < P; s++) {
        double first = 1e300, last = 0, busy = 0;
        for (const pipeline_detail::Step& step : sim.orders[s]) {
            const pipeline_detail::Times& t = sim.of(step.type)[(step.chunk * P + s) * m + step.micro_batch];
            first = std::min(first, t.start);
            last = std::max(last, t.end);
            busy += t.end - t.start;
        }
        result.idle_share.push_back(last > first ? (last - first - busy) / (last - first) : 0.0);
        result.makespan = std::max(result.makespan, last);
    }
    return result;
}

// The work model's GPT figures, in units of one layer's forward: the LM head's forward and backward, 6 Vp C FLOPs
// per token against a layer's forward, (72 C^2 + 12 C T) / 3 (MFU's count); a layer's backward, twice its forward,
// or three times when --recompute 3 runs the forward again.
inline double lm_head_work(int padded_vocab_size, int channels, int T) { return 3.0 * padded_vocab_size / (12.0 * channels + 2.0 * T); }
inline double layer_backward_work(int recompute) { return recompute == 3 ? 3.0 : 2.0; }
// A layer's backward actions under a schedule: the backward (ZB-H1: its input gradient, B) and ZB-H1's weight
// gradients (W; 0 for the other schedules). ZB-H1 splits the two products' gradients, one forward each; under
// --recompute 3 both B and W refill the layer's activations, a forward each.
struct LayerBackwardWork {
    double backward, weight_gradient;
};
inline LayerBackwardWork layer_backward_actions_work(PipelineScheduleKind kind, int recompute) {
    if (kind != PipelineScheduleKind::kZeroBubbleH1) return {layer_backward_work(recompute), 0.0};
    const double refill = recompute == 3 ? 1.0 : 0.0;
    return {1.0 + refill, 1.0 + refill};
}

// Each virtual stage's work for a layer split, in units of one transformer layer's forward: a layer's forward 1, its
// backward layer_backward (2 for the products' two gradients, 3 when the backward recomputes the forward; ZB-H1: B's)
// and with `weight` ZB-H1's W layer_weight_gradient, and on the last virtual stage, whose forward action also runs
// the LM head's forward and backward, head_work more (a GPT's head: 3 Vp / (12 C + 2 T) by the FLOP count that MFU
// uses). The first stage's embedding (a gather) is free.
inline void pipeline_stage_work(const std::vector<int>& per_virtual_stage, double layer_backward, double head_work,
                                std::vector<double>* forward, std::vector<double>* backward, double layer_weight_gradient = 0.0,
                                std::vector<double>* weight = nullptr) {
    forward->clear();
    backward->clear();
    if (weight) weight->clear();
    for (int layers : per_virtual_stage) {
        forward->push_back(layers);
        backward->push_back(layers * layer_backward);
        if (weight) weight->push_back(layers * layer_weight_gradient);
    }
    if (!forward->empty()) forward->back() += head_work;
}

// --pipeline-layers balanced: the split whose simulated step (simulate_pipeline with pipeline_stage_work) is the
// shortest, among those that give the last virtual stage c layers (c = 1 .. layers - P*v + 1) and the others
// layers - c evenly (the remainder to the later ones); of equally short ones the nearest to the even split. The
// even split (pipeline_layer_split's default) loads the LM head's stage most: at T = 1024 a GPT-2 124M head is
// 13.4 layer forwards of work (4.5 layers' forward and backward), 1.5B's 7.1, a 6.6B GPT's (C = 4096) 2.9. The shape must pass pipeline_schedule_problem.
inline std::vector<int> pipeline_balanced_split(PipelineScheduleKind kind, int layers, int P, int m, int v, double layer_backward,
                                                double head_work, double layer_weight_gradient = 0.0) {
    const int K = P * v;
    if (K == 1) return {layers};
    const int even_last = pipeline_detail::even_split(layers, K).back();
    std::vector<int> best;
    double best_makespan = 0;
    for (int c = 1; c <= layers - (K - 1); c++) {
        std::vector<int> split = pipeline_detail::even_split(layers - c, K - 1);
        split.push_back(c);
        std::vector<double> forward, backward, weight;
        pipeline_stage_work(split, layer_backward, head_work, &forward, &backward, layer_weight_gradient, &weight);
        const double makespan = simulate_pipeline(kind, P, m, v, forward, backward, weight).makespan;
        const bool shorter = makespan < best_makespan * (1 - 1e-12);
        const bool as_short_and_nearer = !shorter && makespan <= best_makespan * (1 + 1e-12) && std::abs(c - even_last) < std::abs(best.back() - even_last);
        if (best.empty() || shorter || as_short_and_nearer) {
            best = split;
            best_makespan = makespan;
        }
    }
    return best;
}
