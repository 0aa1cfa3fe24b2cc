// Tests for the pipeline schedules (distributed/pipeline_schedule.h) over every shape with P 1..8 stages,
// m 1..32 micro-batches and v 1..4 chunks per stage that a schedule accepts: each stage runs each forward and
// backward once, in Megatron-LM's order and after its inputs; the micro-batches in flight and the activation
// sets stay within what the memory plan assumes; every message has one partner on a neighbouring stage, with
// the key conditions the driver's two streams need, and the stages' message groups complete without
// deadlock; the bubble equals its formula. ZB-H1 (zb1, P 1..8, m 1..32 at four forward:B:W times) likewise,
// each micro-batch's F, B and W once per stage, its slots held until W, never more than 1F1B's first stage
// needs, its output gradients in one gradient slot from B to W (min(m, s+1) of them on stage s), and its bubble
// below 1F1B's. Also the flag checks, the layer split, the simulation with each stage's
// own work (the LM head on the last) and the split balanced by it.
//
// Needs no GPU, CUDA or NCCL. Prints one PASS/FAIL line per check group (test/check.h); exits 1 on any FAIL.
#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../distributed/pipeline_schedule.h"
#include "check.h"

namespace {

// Records the first failure of a check group that runs over many shapes; report() prints its one line (the
// destructor does, if an exception came first).
struct Verdict {
    explicit Verdict(std::string check_name) : name(std::move(check_name)) {}
    std::string name, where, first_failure;
    std::string detail;  // printed after PASS
    bool reported = false;
    void fail(const std::string& why) {
        if (first_failure.empty()) first_failure = where + ": " + why;
    }
    void expect(bool ok, const char* why) {
        if (!ok) fail(why);
    }
    void report() {
        if (!reported) check(first_failure.empty(), name, first_failure.empty() ? detail : first_failure);
        reported = true;
    }
    ~Verdict() { report(); }
};

struct Shape {
    PipelineScheduleKind kind;
    int P, m, v;
};
std::string shape_name(const Shape& s) {
    return std::string(pipeline_schedule_name(s.kind)) + " P " + std::to_string(s.P) + ", m " + std::to_string(s.m) + ", v " + std::to_string(s.v);
}

// What the schedules promise to run (pipeline_schedule_problem's rules, restated).
bool runs(PipelineScheduleKind kind, int P, int m, int v) {
    if (P < 1 || m < 1) return false;
    if (kind == PipelineScheduleKind::kOneFOneB) return v == 1;
    return v >= 2 && P >= 2 && m % P == 0;
}

std::vector<Shape> accepted_shapes(PipelineScheduleKind kind) {
    std::vector<Shape> shapes;
    for (int P = 1; P <= 8; P++)
        for (int m = 1; m <= 32; m++)
            for (int v = 1; v <= 4; v++)
                if (pipeline_schedule_problem(kind, P, m, v, P * v).empty()) shapes.push_back({kind, P, m, v});
    return shapes;
}

bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == std::string::npos; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void test_names() {
    PipelineScheduleKind kind = PipelineScheduleKind::kInterleaved;
    bool ok = parse_pipeline_schedule("1f1b", &kind) && kind == PipelineScheduleKind::kOneFOneB;
    ok = ok && parse_pipeline_schedule("interleaved", &kind) && kind == PipelineScheduleKind::kInterleaved;
    for (const char* bad : {"", "1F1B", "gpipe", "interleaved ", "1f1b,interleaved"}) ok = ok && !parse_pipeline_schedule(bad, &kind);
    ok = ok && std::string(pipeline_schedule_name(PipelineScheduleKind::kOneFOneB)) == "1f1b" &&
         std::string(pipeline_schedule_name(PipelineScheduleKind::kInterleaved)) == "interleaved";
    expect(ok, "pipeline schedule names: 1f1b and interleaved parse and print, others are refused", "a name is mishandled");
}

void test_problems() {
    Verdict v{"pipeline_schedule_problem: accepts exactly 1f1b at v 1 and interleaved at v >= 2, P >= 2, m % P == 0"};
    Verdict layers{"pipeline_schedule_problem: fewer layers than virtual stages are refused"};
    int accepted = 0, rejected = 0;
    for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved})
        for (int P = 0; P <= 8; P++)
            for (int m = 0; m <= 32; m++)
                for (int chunks = 0; chunks <= 4; chunks++) {
                    v.where = layers.where = shape_name({kind, P, m, chunks});
                    const std::string problem = pipeline_schedule_problem(kind, P, m, chunks, P * chunks);
                    if (!runs(kind, P, m, chunks)) {
                        rejected++;
                        v.expect(one_line(problem) && problem.compare(0, 2, "--") == 0, "not refused in one line that starts with a flag");
                        bool threw = false;
                        try {
                            make_pipeline_schedule(kind, P, m, chunks);
                        } catch (const std::invalid_argument&) {
                            threw = true;
                        }
                        v.expect(threw, "make_pipeline_schedule does not throw std::invalid_argument");
                        continue;
                    }
                    accepted++;
                    if (!problem.empty()) v.fail("refused: " + problem);
                    const std::string short_of_layers = pipeline_schedule_problem(kind, P, m, chunks, P * chunks - 1);
                    layers.expect(one_line(short_of_layers) && contains(short_of_layers, "--pipeline-parallel") &&
                                      contains(short_of_layers, "cannot fill"),
                                  ("P*v - 1 layers give \"" + short_of_layers + "\"").c_str());
                }
    v.detail = std::to_string(accepted) + " accepted, " + std::to_string(rejected) + " refused";
    layers.detail = std::to_string(accepted) + " shapes";
    v.report();
    layers.report();

    const std::string few_layers = pipeline_schedule_problem(PipelineScheduleKind::kOneFOneB, 4, 8, 1, 3);
    const std::string few_micro_batches = pipeline_schedule_problem(PipelineScheduleKind::kInterleaved, 4, 6, 2, 24);
    check(few_layers == "--pipeline-parallel 4: the 3 layers cannot fill 4 stages (each needs at least one layer)" &&
              few_micro_batches ==
                  "--pipeline-schedule interleaved needs the 6 micro-batches (gradient-accumulation steps) to be a multiple of --pipeline-parallel 4",
          "pipeline_schedule_problem messages", "\"" + few_layers + "\", \"" + few_micro_batches + "\"");
}

// Each limit pipeline_schedule_problem checks, at its bound, for each schedule: the most micro-batches
// (kMaxPipelineMicroBatches) accepted and the next count refused (interleaved: the next multiple of P), and
// make_pipeline_schedule and simulate_pipeline building the largest step; at least one micro-batch, stage and model chunk;
// interleaved's two chunks, two stages and micro-batches a multiple of P; a layer per virtual stage.
void test_limits(PipelineScheduleKind kind) {
    const bool interleaved = kind == PipelineScheduleKind::kInterleaved;
    Verdict v{std::string("pipeline_schedule_problem: every limit at its bound, ") + pipeline_schedule_name(kind)};
    int cases = 0;
    // P stages, m micro-batches, `chunks` per stage, `layers`: accepted when `refusal` is empty, else refused with it in the message
    auto expect_problem = [&](int P, int m, int chunks, int layers, const std::string& refusal) {
        cases++;
        v.where = shape_name({kind, P, m, chunks}) + ", " + std::to_string(layers) + " layers";
        const std::string problem = pipeline_schedule_problem(kind, P, m, chunks, layers);
        if (refusal.empty() && !problem.empty()) v.fail("refused: " + problem);
        if (!refusal.empty() && !(one_line(problem) && contains(problem, refusal)))
            v.fail("gives \"" + problem + "\", not a refusal with \"" + refusal + "\"");
    };
    const int v1 = interleaved ? 2 : 1;  // the fewest chunks the schedule runs
    for (int P : {interleaved ? 2 : 1, 3}) {
        const int most = interleaved ? kMaxPipelineMicroBatches / P * P : kMaxPipelineMicroBatches;  // interleaved: a multiple of P
        expect_problem(P, most, v1, P * v1, "");
        expect_problem(P, most + (interleaved ? P : 1), v1, P * v1,
                       "runs at most 4096 micro-batches (gradient-accumulation steps) a step, not " + std::to_string(most + (interleaved ? P : 1)));
        expect_problem(P, interleaved ? P : 1, v1, P * v1, "");
        expect_problem(P, 0, v1, P * v1, "needs at least 1 micro-batch (gradient-accumulation step), not 0");
        expect_problem(P, P, v1, P * v1 - 1, "cannot fill");
        expect_problem(P, P, 0, 0, "--virtual-stages 0 must be at least 1");
        if (interleaved) {
            expect_problem(P, P + 1, v1, P * v1, "to be a multiple of --pipeline-parallel " + std::to_string(P));
            expect_problem(P, P, 1, P, "needs --virtual-stages of at least 2, not 1");
        } else {
            expect_problem(P, P, 2, 2 * P, "--virtual-stages 2 needs --pipeline-schedule interleaved");
        }
    }
    expect_problem(0, 1, v1, v1, "--pipeline-parallel 0 must be at least 1");
    if (interleaved) expect_problem(1, 2, 2, 2, "needs --pipeline-parallel of at least 2, not 1");
    else expect_problem(1, 1, 1, 1, "");
    // the largest step builds; one more micro-batch throws
    const int P = 2, most = kMaxPipelineMicroBatches;
    v.where = shape_name({kind, P, most, v1}) + " built";
    const std::vector<double> costs(P * v1, 1.0);
    const PipelineSchedule largest = make_pipeline_schedule(kind, P, most, v1, 1.0, 2.0, 1.0);
    v.expect((int)largest.stages[0].actions.size() == (kind == PipelineScheduleKind::kZeroBubbleH1 ? 3 : 2) * most * v1,
             "not every micro-batch scheduled");
    v.expect(simulate_pipeline(kind, P, most, v1, costs, costs, costs).makespan > 0, "not simulated");
    const int beyond = most + (interleaved ? P : 1);
    v.where = shape_name({kind, P, beyond, v1}) + " built";
    bool schedule_threw = false, simulation_threw = false;
    try {
        make_pipeline_schedule(kind, P, beyond, v1);
    } catch (const std::invalid_argument&) {
        schedule_threw = true;
    }
    try {
        simulate_pipeline(kind, P, beyond, v1, costs, costs, costs);
    } catch (const std::invalid_argument&) {
        simulation_threw = true;
    }
    v.expect(schedule_threw && simulation_threw, "make_pipeline_schedule or simulate_pipeline does not throw std::invalid_argument");
    v.detail = std::to_string(cases) + " shapes, and the " + std::to_string(most) + "-micro-batch step built";
}

void test_layer_split() {
    {
        Verdict v{"pipeline_layer_split: even split, remainder on the last virtual stages"};
        int cases = 0;
        for (int layers = 1; layers <= 64; layers++)
            for (int P = 1; P <= 8; P++)
                for (int chunks = 1; chunks <= 4; chunks++) {
                    v.where = std::to_string(layers) + " layers, P " + std::to_string(P) + ", v " + std::to_string(chunks);
                    std::vector<int> split{-1};
                    const std::string problem = pipeline_layer_split(layers, P, chunks, "", &split);
                    cases++;
                    if (layers < P * chunks) {
                        v.expect(one_line(problem) && contains(problem, "cannot fill") && split.empty(), "too few layers not refused");
                        continue;
                    }
                    const int K = P * chunks, base = layers / K;
                    v.expect(problem.empty() && (int)split.size() == K, "refused or wrong size");
                    if ((int)split.size() != K) continue;
                    int sum = 0;
                    for (int k = 0; k < K; k++) {
                        sum += split[k];
                        v.expect(split[k] == base + (k >= K - layers % K), "not base layers with the remainder on the last stages");
                    }
                    v.expect(sum == layers, "the split does not sum to the layers");
                }
        v.detail = std::to_string(cases) + " cases";
    }
    {
        Verdict v{"pipeline_layer_split: --pipeline-layers lists"};
        std::vector<int> split;
        v.where = "3,3,2,4 as P 4";
        v.expect(pipeline_layer_split(12, 4, 1, "3,3,2,4", &split).empty() && split == std::vector<int>{3, 3, 2, 4}, "not taken as given");
        v.where = "3,3,2,4 as P 2 x v 2";
        v.expect(pipeline_layer_split(12, 2, 2, "3,3,2,4", &split).empty() && split == std::vector<int>{3, 3, 2, 4}, "not taken as given");
        struct Bad {
            const char* counts;
            const char* why;  // a part of the expected problem
        };
        const Bad bad[] = {{"3,x,3,3", "not a whole number"}, {"3,,3,6", "not a whole number"}, {"3,3,3,3,", "not a whole number"},
                           {" 3,3,3,3", "not a whole number"}, {"-3,3,6,6", "not a whole number"}, {"+3,3,3,3", "not a whole number"},
                           {"3.0,3,3,3", "not a whole number"}, {"3000000000,1,1,1", "not a whole number"},
                           {"1000000000,1,1,1", "not a whole number"}, {"999999999,1,1,1", "sum to 1000000002"}, {"3,3,3", "3 entries"},
                           {"3,3,3,1,2", "5 entries"}, {"3,0,5,4", "entry 2 is 0"}, {"3,3,3,4", "sum to 13"}};
        std::string example;
        for (const Bad& b : bad) {
            v.where = b.counts;
            split = {-1};
            const std::string problem = pipeline_layer_split(12, 4, 1, b.counts, &split);
            if (!(one_line(problem) && contains(problem, "--pipeline-layers") && contains(problem, b.why) && split.empty()))
                v.fail("gives \"" + problem + "\"");
            if (example.empty()) example = problem;
        }
        v.detail = std::to_string(std::size(bad)) + " bad lists refused, e.g. \"" + example + "\"";
    }
}

// The actions of a schedule by virtual stage and micro-batch (index k * m + i).
struct ActionIndex {
    std::vector<const PipelineAction*> forward, backward;  // backward: the backward, or ZB-H1's B
    std::vector<const PipelineAction*> weight;             // ZB-H1's W (empty for the other schedules)
    std::vector<int> stage_of;  // of each entry, the stage that ran it
    // The action after which the micro-batch's slot is free: its backward, or its W.
    const PipelineAction* last_use(int entry) const { return weight.empty() ? backward[entry] : weight[entry]; }
};

// The stage's (type, micro-batch, chunk) sequence Megatron-LM runs: `warmup` forwards, then one forward and
// one backward `total - warmup` times, then the remaining backwards; micro_batch_chunk maps the n-th forward
// or backward to its (micro-batch, chunk).
template <class MicroBatchChunk>
std::vector<std::tuple<bool, int, int>> megatron_order(int warmup, int total, MicroBatchChunk micro_batch_chunk) {
    std::vector<std::tuple<bool, int, int>> order;
    int forwards = 0, backwards = 0;
    auto forward = [&] { order.push_back(std::tuple_cat(std::make_tuple(false), micro_batch_chunk(forwards++, false))); };
    auto backward = [&] { order.push_back(std::tuple_cat(std::make_tuple(true), micro_batch_chunk(backwards++, true))); };
    for (int n = 0; n < warmup; n++) forward();
    for (int n = warmup; n < total; n++) forward(), backward();
    for (int n = 0; n < warmup; n++) backward();
    return order;
}

// Each action once, non-overlapping, after its inputs; the order Megatron-LM runs; busy and makespan.
void check_actions(const PipelineSchedule& sched, Verdict& v, Verdict& order, ActionIndex* index) {
    const int P = sched.P, m = sched.m, K = P * sched.v;
    index->forward.assign(K * m, nullptr);
    index->backward.assign(K * m, nullptr);
    index->stage_of.assign(K * m, -1);
    v.expect((int)sched.stages.size() == P, "not one stage schedule per stage");
    if ((int)sched.stages.size() != P) return;
    double makespan = 0;
    for (int s = 0; s < P; s++) {
        const StageSchedule& stage = sched.stages[s];
        v.expect((int)stage.actions.size() == 2 * m * sched.v, "a stage does not have 2 m v actions");
        double busy = 0, free_at = 0;
        std::vector<std::tuple<bool, int, int>> ran;
        for (const PipelineAction& a : stage.actions) {
            const bool in_range = a.micro_batch >= 0 && a.micro_batch < m && a.chunk >= 0 && a.chunk < sched.v;
            v.expect(in_range, "micro-batch or chunk out of range");
            if (!in_range) return;
            const bool backward = a.type == PipelineAction::kBackward;
            const double duration = (backward ? 2.0 : 1.0) / sched.v;
            v.expect(std::fabs(a.end - a.start - duration) < 1e-12, "an action does not last forward_time / v or backward_time / v");
            v.expect(a.start >= free_at, "an action starts before the previous one on its stage ends");
            free_at = a.end;
            busy += a.end - a.start;
            makespan = std::max(makespan, a.end);
            const int entry = (a.chunk * P + s) * m + a.micro_batch;
            const PipelineAction*& seen = (backward ? index->backward : index->forward)[entry];
            v.expect(seen == nullptr, "an action runs twice");
            seen = &a;
            index->stage_of[entry] = s;
            ran.emplace_back(backward, a.micro_batch, a.chunk);
        }
        v.expect(std::fabs(stage.busy - busy) < 1e-9, "busy is not the sum of the action durations");

        // Megatron-LM's order; the interleaved one goes through the chunks in groups of P micro-batches.
        std::vector<std::tuple<bool, int, int>> expected;
        if (sched.kind == PipelineScheduleKind::kOneFOneB) {
            expected = megatron_order(std::min(P - 1 - s, m), m, [](int n, bool) { return std::make_tuple(n, 0); });
        } else {
            const int total = m * sched.v, warmup = std::min(2 * (P - 1 - s) + (sched.v - 1) * P, total);
            expected = megatron_order(warmup, total, [&](int n, bool backward) {
                const int chunk = n % (P * sched.v) / P;
                return std::make_tuple(n / (P * sched.v) * P + n % P, backward ? sched.v - 1 - chunk : chunk);
            });
        }
        order.expect(ran == expected, "the stage's order is not Megatron-LM's");
    }
    v.expect(std::fabs(sched.makespan - makespan) < 1e-9, "makespan is not the last action's end");
    for (int k = 0; k < K; k++)
        for (int i = 0; i < m; i++) {
            const PipelineAction *f = index->forward[k * m + i], *b = index->backward[k * m + i];
            v.expect(f && b, "a forward or backward never runs");
            if (!f || !b) return;
            v.expect(index->stage_of[k * m + i] == k % P, "a virtual stage runs on the wrong stage");
            v.expect(b->start >= f->end, "a backward starts before its forward ends");
            if (k > 0 && index->forward[(k - 1) * m + i])
                v.expect(f->start >= index->forward[(k - 1) * m + i]->end, "a forward starts before the previous virtual stage's");
            if (k < K - 1 && index->backward[(k + 1) * m + i])
                v.expect(b->start >= index->backward[(k + 1) * m + i]->end, "a backward starts before the next virtual stage's");
        }
}

// What the memory plan assumes each chunk's activation sets and the micro-batches in flight stay within
// (1F1B's slots reach the bound).
// ZB-H1 stays within what 1F1B needs on its first stage.
int slots_bound(const PipelineSchedule& sched, int s, int chunk) {
    if (sched.kind == PipelineScheduleKind::kZeroBubbleH1) return std::min(sched.m, sched.P);
    if (sched.kind == PipelineScheduleKind::kOneFOneB) return std::min(sched.m, s == 0 ? sched.P : sched.P - s + 1);
    return std::min(sched.m, chunk < (sched.v + 1) / 2 ? 2 * sched.P : sched.P);
}
int in_flight_bound(const PipelineSchedule& sched, int s) {
    if (sched.kind == PipelineScheduleKind::kZeroBubbleH1) return std::min(sched.m, sched.P);
    if (sched.kind == PipelineScheduleKind::kOneFOneB) return std::min(sched.m, sched.P - s);
    return std::min(sched.m * sched.v, 2 * (sched.P - 1 - s) + (sched.v - 1) * sched.P + 1);
}

// The receive of a stage that brings (gradient, chunk, micro-batch), or null.
const PipelineTransfer* find_receive(const StageSchedule& stage, bool gradient, int chunk, int micro_batch) {
    for (const PipelineTransfer& t : stage.transfers)
        if (!t.send && t.gradient == gradient && t.chunk == chunk && t.micro_batch == micro_batch) return &t;
    return nullptr;
}

// Each micro-batch keeps one slot of its chunk from its take (the activation's arrival, or virtual stage 0's
// forward start) to its backward's end (ZB-H1: its W's end); no slot holds two at once, so an activation arrives into a slot no
// earlier than the end of the backward of the slot's previous micro-batch (condition (c)); slots[c] is the
// most held at once; the
// micro-batches in flight are counted right; both stay within the memory plan's bounds. Records the most
// slots seen per (P, v, stage, chunk) in `most_slots`.
using MostSlots = std::map<std::array<int, 4>, int>;
void check_memory(const PipelineSchedule& sched, const ActionIndex& index, Verdict& v, MostSlots* most_slots) {
    const int P = sched.P, m = sched.m;
    for (int s = 0; s < P; s++) {
        const StageSchedule& stage = sched.stages[s];
        v.expect((int)stage.slots.size() == sched.v, "slots does not have v entries");
        if ((int)stage.slots.size() != sched.v) return;
        std::vector<std::pair<double, int>> in_flight_changes;
        for (int c = 0; c < sched.v; c++) {
            const int k = c * P + s;
            std::vector<std::pair<double, int>> occupancy_changes;
            std::map<int, std::vector<std::pair<double, double>>> held;  // slot -> (take, free) of its micro-batches
            for (int i = 0; i < m; i++) {
                const PipelineAction *f = index.forward[k * m + i], *b = index.backward[k * m + i];
                const PipelineTransfer* arrival = k > 0 ? find_receive(stage, false, c, i) : nullptr;
                v.expect(k == 0 || arrival, "an activation never arrives");
                if (k > 0 && !arrival) return;
                const double take = k == 0 ? f->start : arrival->key;
                const PipelineAction* last = index.last_use(k * m + i);
                v.expect(f->slot == b->slot && f->slot == last->slot && f->slot >= 0 && f->slot < stage.slots[c],
                         "forward and backward (or B and W) use different or bad slots");
                for (const PipelineTransfer& t : stage.transfers)
                    if (t.chunk == c && t.micro_batch == i) v.expect(t.slot == f->slot, "a transfer uses another slot than its actions");
                held[f->slot].emplace_back(take, last->end);
                occupancy_changes.emplace_back(take, +1);
                occupancy_changes.emplace_back(last->end, -1);
                in_flight_changes.emplace_back(f->start, +1);
                in_flight_changes.emplace_back(last->end, -1);
            }
            for (auto& [slot, intervals] : held) {
                std::sort(intervals.begin(), intervals.end());
                for (size_t j = 1; j < intervals.size(); j++)
                    v.expect(intervals[j].first >= intervals[j - 1].second, "a slot is taken before its previous micro-batch's backward ends");
            }
            std::sort(occupancy_changes.begin(), occupancy_changes.end());  // at equal times frees (-1) first
            int held_now = 0, most_held = 0;
            for (const auto& change : occupancy_changes) most_held = std::max(most_held, held_now += change.second);
            v.expect(stage.slots[c] == most_held, "slots is not the most micro-batches the chunk holds at once");
            if (sched.kind == PipelineScheduleKind::kOneFOneB) v.expect(stage.slots[c] == slots_bound(sched, s, c), "slots are not the bound");
            else v.expect(stage.slots[c] <= slots_bound(sched, s, c), "slots exceed the memory plan's bound");
            int& most = (*most_slots)[{P, sched.v, s, c}];
            most = std::max(most, stage.slots[c]);
        }
        std::sort(in_flight_changes.begin(), in_flight_changes.end());
        int in_flight = 0, most_in_flight = 0;
        for (const auto& change : in_flight_changes) most_in_flight = std::max(most_in_flight, in_flight += change.second);
        v.expect(stage.max_in_flight == most_in_flight, "max_in_flight is not the most micro-batches in flight");
        v.expect(stage.max_in_flight <= in_flight_bound(sched, s), "more micro-batches in flight than the bound");
    }
}

// (a) every send has one receive on its peer with the same key, micro-batch and direction, between
// neighbouring virtual stages, keyed at the producing action's end; (b) every input arrives at or before its
// consumer's start; transfers sorted by key. (Condition (c) is checked with the slots, in check_memory.)
void check_transfers(const PipelineSchedule& sched, const ActionIndex& index, Verdict& v) {
    const int P = sched.P, m = sched.m, K = P * sched.v;
    struct Ends {
        int sends = 0, receives = 0, sender_chunk = -1, receiver_chunk = -1;
    };
    std::map<std::tuple<int, int, bool, int, double>, Ends> messages;  // (sender, receiver, gradient, micro-batch, key)
    for (int s = 0; s < P; s++) {
        const std::vector<PipelineTransfer>& transfers = sched.stages[s].transfers;
        for (size_t j = 0; j < transfers.size(); j++) {
            const PipelineTransfer& t = transfers[j];
            v.expect(j == 0 || transfers[j - 1].key <= t.key, "transfers are not sorted by key");
            const bool in_range = t.peer >= 0 && t.peer < P && t.micro_batch >= 0 && t.micro_batch < m && t.chunk >= 0 && t.chunk < sched.v;
            v.expect(in_range, "a transfer's peer, micro-batch or chunk is out of range");
            if (!in_range) return;
            Ends& ends = messages[{t.send ? s : t.peer, t.send ? t.peer : s, t.gradient, t.micro_batch, t.key}];
            (t.send ? ends.sends : ends.receives)++;
            (t.send ? ends.sender_chunk : ends.receiver_chunk) = t.chunk;
            // The action that produced the message (send) or consumes it (receive), on this stage.
            const int entry = (t.chunk * P + s) * m + t.micro_batch;
            const PipelineAction* action = (t.gradient ? index.backward : index.forward)[entry];
            if (t.send) v.expect(t.key == action->end, "a send's key is not its producing action's end");
            else v.expect(t.key <= action->start, "a message arrives after its consumer starts");
        }
    }
    for (const auto& [message, ends] : messages) {
        v.expect(ends.sends == 1 && ends.receives == 1, "a message is not one send and one receive with the same key");
        const int sender_stage = ends.sender_chunk * P + std::get<0>(message), receiver_stage = ends.receiver_chunk * P + std::get<1>(message);
        v.expect(receiver_stage == sender_stage + (std::get<2>(message) ? -1 : 1), "a message skips a virtual stage or goes the wrong way");
    }
    v.expect((int)messages.size() == 2 * m * (K - 1), "not one activation and one gradient per micro-batch between virtual stages");
}

// Each stage posts its transfer groups (equal keys) one after another, as the driver's communication stream
// does; a message completes once both its send and its receive are posted, and a stage moves on when its
// group's messages are all complete. True when every group completes.
bool groups_complete(const PipelineSchedule& sched) {
    const int P = sched.P;
    std::vector<std::vector<std::vector<int>>> groups(P);  // per stage: groups of transfer indices
    std::vector<std::vector<bool>> done(P);
    for (int s = 0; s < P; s++) {
        const std::vector<PipelineTransfer>& transfers = sched.stages[s].transfers;
        done[s].assign(transfers.size(), false);
        for (size_t j = 0; j < transfers.size(); j++) {
            if (j == 0 || transfers[j].key != transfers[j - 1].key) groups[s].emplace_back();
            groups[s].back().push_back(j);
        }
    }
    std::vector<size_t> head(P, 0);
    // The index of t's partner in the group its peer has posted now, or -1.
    auto posted_partner = [&](int s, const PipelineTransfer& t) {
        if (head[t.peer] == groups[t.peer].size()) return -1;
        for (int j : groups[t.peer][head[t.peer]]) {
            const PipelineTransfer& u = sched.stages[t.peer].transfers[j];
            if (u.peer == s && u.send != t.send && u.gradient == t.gradient && u.micro_batch == t.micro_batch && u.key == t.key) return j;
        }
        return -1;
    };
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (int s = 0; s < P; s++) {
            if (head[s] == groups[s].size()) continue;
            bool all_done = true;
            for (int j : groups[s][head[s]]) {
                const PipelineTransfer& t = sched.stages[s].transfers[j];
                const int partner = done[s][j] ? -1 : posted_partner(s, t);
                if (partner >= 0) done[s][j] = done[t.peer][partner] = true;
                all_done = all_done && done[s][j];
            }
            if (all_done) head[s]++, progressed = true;
        }
    }
    for (int s = 0; s < P; s++)
        if (head[s] != groups[s].size()) return false;
    return true;
}

// The most slots seen at P stages and v chunks: the chunks' counts joined by commas, stage after stage.
std::string slots_by_stage(const MostSlots& most_slots, int P, int v) {
    std::string text;
    for (int s = 0; s < P; s++)
        for (int c = 0; c < v; c++) {
            auto it = most_slots.find({P, v, s, c});
            text += (c ? "," : s ? " " : "") + (it == most_slots.end() ? "?" : std::to_string(it->second));
        }
    return text;
}

void test_schedules(PipelineScheduleKind kind) {
    const std::string name = pipeline_schedule_name(kind);
    const std::vector<Shape> shapes = accepted_shapes(kind);
    const std::string count = std::to_string(shapes.size()) + " shapes";
    Verdict actions{name + " actions: each forward and backward once per stage, in order, after their inputs"};
    Verdict order{name + " order: Megatron-LM's warm-up, one forward one backward, cool-down" +
                  (kind == PipelineScheduleKind::kInterleaved ? ", chunks in groups of P micro-batches" : "")};
    Verdict memory{name + " memory: slots held from arrival to backward, never shared (c), within the memory plan's bounds"};
    Verdict transfers{name + " transfers: matched pairs between neighbours, keyed at the producer's end (a), before the consumer (b)"};
    Verdict deadlock{name + " transfers: every stage's groups complete (no deadlock)"};
    Verdict bubble{name + " bubble() equals pipeline_bubble_theory (forward:backward 1:2, 1:1, 1:3)"};
    MostSlots most_slots;
    for (const Shape& shape : shapes) {
        actions.where = order.where = memory.where = transfers.where = deadlock.where = bubble.where = shape_name(shape);
        try {
            const PipelineSchedule sched = make_pipeline_schedule(kind, shape.P, shape.m, shape.v);
            ActionIndex index;
            const std::string before = actions.first_failure;
            check_actions(sched, actions, order, &index);
            if (actions.first_failure != before) continue;  // the later checks need every action once
            check_memory(sched, index, memory, &most_slots);
            check_transfers(sched, index, transfers);
            deadlock.expect(groups_complete(sched), "the transfer groups deadlock");
            const double theory = pipeline_bubble_theory(kind, shape.P, shape.m, shape.v);
            const std::pair<double, double> times[] = {{1.0, 2.0}, {1.0, 1.0}, {1.0, 3.0}};
            for (const auto& [forward_time, backward_time] : times) {
                const double simulated = make_pipeline_schedule(kind, shape.P, shape.m, shape.v, forward_time, backward_time).bubble();
                if (std::fabs(simulated - theory) > 1e-9)
                    bubble.fail(fmt("bubble %.9f, theory %.9f at forward:backward 1:%g", simulated, theory, backward_time / forward_time));
            }
        } catch (const std::exception& e) {
            actions.fail(std::string("exception: ") + e.what());
        }
    }
    actions.detail = order.detail = transfers.detail = deadlock.detail = bubble.detail = count;
    actions.report();
    order.report();
    if (kind == PipelineScheduleKind::kOneFOneB)
        memory.detail = count + "; slots min(m, P) on stage 0, min(m, P-s+1) on stage s > 0 (at P 8: " + slots_by_stage(most_slots, 8, 1) +
                        "); in flight <= P-s";
    else
        memory.detail = count + "; slots <= min(m, 2P) for chunks below v/2 rounded up, min(m, P) above (most at P 8, v 4, per stage: " +
                        slots_by_stage(most_slots, 8, 4) + "); in flight <= min(m v, (v-1)P + 2(P-1-s) + 1)";
    memory.report();
    transfers.report();
    deadlock.report();
    bubble.report();
}

// The deadlock check itself: stage 0 receives a gradient before it sends the activation that stage 1 waits
// for before sending that gradient; with stage 0's two transfers the other way round, both complete.
void test_deadlock_check() {
    PipelineSchedule crossed{PipelineScheduleKind::kOneFOneB, 2, 2, 1, std::vector<StageSchedule>(2)};
    //                              send   gradient peer micro-batch chunk slot key
    crossed.stages[0].transfers = {{false, true, 1, 1, 0, 0, 2.0}, {true, false, 1, 0, 0, 0, 1.0}};
    crossed.stages[1].transfers = {{false, false, 0, 0, 0, 0, 1.0}, {true, true, 0, 1, 0, 0, 2.0}};
    PipelineSchedule ordered = crossed;
    std::swap(ordered.stages[0].transfers[0], ordered.stages[0].transfers[1]);
    expect(!groups_complete(crossed) && groups_complete(ordered), "deadlock check: finds two stages that both receive first",
           "crossed transfers " + std::string(groups_complete(crossed) ? "complete" : "deadlock") + ", ordered ones " +
               (groups_complete(ordered) ? "complete" : "deadlock"));
}

void test_interleaved_beats_1f1b() {
    Verdict v{"interleaved bubble < 1f1b bubble (same P > 1 and m)"};
    int cases = 0;
    for (const Shape& shape : accepted_shapes(PipelineScheduleKind::kInterleaved)) {
        v.where = shape_name(shape);
        const double interleaved = make_pipeline_schedule(PipelineScheduleKind::kInterleaved, shape.P, shape.m, shape.v).bubble();
        const double one_f_one_b = make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, shape.P, shape.m, 1).bubble();
        v.expect(interleaved < one_f_one_b, "not smaller");
        cases++;
    }
    v.detail = std::to_string(cases) + " shapes";
}


// simulate_pipeline with each virtual stage's own work: equal work gives the formula on the first stage; a case
// worked by hand; a heavier last stage adds idle time to the first.
void test_simulation_with_work() {
    {
        Verdict v{"simulate_pipeline: equal work gives pipeline_bubble_theory on the first stage, and no stage idles more"};
        int cases = 0;
        for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved})
            for (const Shape& shape : accepted_shapes(kind)) {
                v.where = shape_name(shape);
                const int K = shape.P * shape.v;
                const PipelineSimulation sim = simulate_pipeline(kind, shape.P, shape.m, shape.v, std::vector<double>(K, 1.0), std::vector<double>(K, 2.0));
                const double theory = pipeline_bubble_theory(kind, shape.P, shape.m, shape.v);
                if (std::fabs(sim.idle_share[0] - theory) > 1e-9) v.fail(fmt("first stage idle %.9f, theory %.9f", sim.idle_share[0], theory));
                for (double idle : sim.idle_share) v.expect(idle <= theory + 1e-9, "a later stage idles more than the first");
                const double makespan = make_pipeline_schedule(kind, shape.P, shape.m, shape.v).makespan * shape.v;
                v.expect(std::fabs(sim.makespan - makespan) < 1e-9, "makespan differs from make_pipeline_schedule's");
                cases++;
            }
        v.detail = std::to_string(cases) + " shapes";
    }
    {
        // 1F1B, P 2, m 2; stage 1's forward takes 2 (it holds the head), every backward 2. Stage 0: F0 0-1, F1 1-2,
        // B0 after stage 1's B0 (1-3 forward, 3-5 backward) 5-7, B1 after stage 1's F1 5-7, B1 7-9: 9-11. Stage 0
        // idles 11 - 6 = 5 of 11; stage 1 from 1 to 9 never.
        const PipelineSimulation sim = simulate_pipeline(PipelineScheduleKind::kOneFOneB, 2, 2, 1, {1.0, 2.0}, {2.0, 2.0});
        expect(std::fabs(sim.idle_share[0] - 5.0 / 11.0) < 1e-12 && sim.idle_share[1] == 0.0 && sim.makespan == 11.0,
               "simulate_pipeline: 1f1b P 2, m 2 with a heavier last stage, by hand (first stage idle 5/11 against the formula's 1/3)",
               fmt("idle %.6f and %.6f, makespan %g", sim.idle_share[0], sim.idle_share[1], sim.makespan));
    }
    {
        Verdict v{"simulate_pipeline: the LM head's work on the last stage adds idle time to the first"};
        int cases = 0;
        for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved})
            for (const Shape& shape : accepted_shapes(kind)) {
                if (shape.P < 2) continue;
                v.where = shape_name(shape);
                std::vector<double> forward, backward;
                pipeline_stage_work(std::vector<int>(shape.P * shape.v, 4), 2.0, 3.0, &forward, &backward);
                const double idle = simulate_pipeline(kind, shape.P, shape.m, shape.v, forward, backward).idle_share[0];
                v.expect(idle > pipeline_bubble_theory(kind, shape.P, shape.m, shape.v) + 1e-9, "not more idle than the formula");
                cases++;
            }
        v.detail = std::to_string(cases) + " shapes";
    }
    {
        std::vector<double> forward, backward;
        pipeline_stage_work({3, 5}, 2.0, 1.5, &forward, &backward);
        expect(forward == std::vector<double>{3.0, 6.5} && backward == std::vector<double>{6.0, 10.0},
               "pipeline_stage_work: layers' forward and backward, the head's work on the last virtual stage's forward",
               fmt("forward %g %g", forward[0], forward[1]) + fmt(", backward %g %g", backward[0], backward[1]));
    }
}

// pipeline_balanced_split: a split of the layers, never slower (simulated) than the even one, 1F1B's equal parts
// when they exist and the head costs nothing (the interleaved schedule's drain can favour a lighter last chunk), and GPT-2 124M's head (13.4 layer forwards at T 1024) moved off 4 of the last stage's 6 layers.
void test_balanced_split() {
    Verdict v{"pipeline_balanced_split: a split of the layers, simulated no slower than the even split; 1f1b's equal parts without a head"};
    int cases = 0;
    for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved})
        for (int P = 1; P <= 8; P *= 2)
            for (int chunks = 1; chunks <= 2; chunks++)
                for (int layers : {8, 12, 24, 32, 48})
                    for (double head : {0.0, 1.0, 3.0, 13.4}) {
                        const int m = 2 * P;
                        if (!pipeline_schedule_problem(kind, P, m, chunks, layers).empty()) continue;
                        v.where = std::string(pipeline_schedule_name(kind)) + fmt(" P %g v %g, %g layers", P, chunks, layers) + fmt(", head %g", head);
                        const std::vector<int> split = pipeline_balanced_split(kind, layers, P, m, chunks, 2.0, head);
                        std::vector<int> even;
                        pipeline_layer_split(layers, P, chunks, "", &even);
                        int sum = 0;
                        for (int n : split) sum += n;
                        v.expect((int)split.size() == P * chunks && sum == layers && *std::min_element(split.begin(), split.end()) >= 1,
                                 "not a split of the layers into P*v non-empty parts");
                        if ((int)split.size() != P * chunks) continue;
                        auto makespan = [&](const std::vector<int>& s) {
                            std::vector<double> forward, backward;
                            pipeline_stage_work(s, 2.0, head, &forward, &backward);
                            return simulate_pipeline(kind, P, m, chunks, forward, backward).makespan;
                        };
                        v.expect(makespan(split) <= makespan(even) * (1 + 1e-12), "slower than the even split");
                        if (kind == PipelineScheduleKind::kOneFOneB && head == 0.0 && layers % P == 0) v.expect(split == even, "not the even split of equal parts when the head costs nothing");
                        cases++;
                    }
    v.detail = std::to_string(cases) + " cases";
    v.report();
    const double head_124m = 3.0 * 50304 / (12.0 * 768 + 2.0 * 1024);
    const std::vector<int> split = pipeline_balanced_split(PipelineScheduleKind::kOneFOneB, 12, 2, 8, 1, 2.0, head_124m);
    std::vector<double> forward, backward;
    pipeline_stage_work({6, 6}, 2.0, head_124m, &forward, &backward);
    const double even = simulate_pipeline(PipelineScheduleKind::kOneFOneB, 2, 8, 1, forward, backward).makespan;
    pipeline_stage_work(split, 2.0, head_124m, &forward, &backward);
    const double balanced = simulate_pipeline(PipelineScheduleKind::kOneFOneB, 2, 8, 1, forward, backward).makespan;
    expect(split == std::vector<int>{8, 4} && balanced < 0.9 * even, "pipeline_balanced_split: GPT-2 124M on 2 stages, 1f1b, m 8: 8 + 4 layers",
           fmt("%g parts, simulated step %.1f against the even split's %.1f", split.size(), balanced, even));
}

// ZB-H1 (zb1), v 1 only. The stage times F, B, W it is tested with: all equal (the paper's case), and each of
// the three the shortest once, which the step's formula depends on.
struct StageTimes {
    double forward, input_gradient, weight_gradient;
};
const StageTimes kZeroBubbleTimes[] = {{1, 1, 1}, {2, 3, 1}, {3, 1, 2}, {1, 2, 4}};
std::string times_name(const StageTimes& t) { return fmt("F:B:W %g:%g:%g", t.forward, t.input_gradient, t.weight_gradient); }

// Each micro-batch's F, B and W once per stage and nothing else, each lasting its time, one at a time; F before
// B before W; F after the previous stage's F, B after the next stage's B (the last stage's after its own F).
void check_zero_bubble_actions(const PipelineSchedule& sched, const StageTimes& times, Verdict& v, ActionIndex* index) {
    const int P = sched.P, m = sched.m;
    index->forward.assign(P * m, nullptr);
    index->backward.assign(P * m, nullptr);
    index->weight.assign(P * m, nullptr);
    index->stage_of.assign(P * m, -1);
    v.expect((int)sched.stages.size() == P && sched.v == 1, "not one stage schedule per stage, or v is not 1");
    if ((int)sched.stages.size() != P) return;
    double makespan = 0;
    for (int s = 0; s < P; s++) {
        const StageSchedule& stage = sched.stages[s];
        v.expect((int)stage.actions.size() == 3 * m, "a stage does not have 3 m actions");
        double busy = 0, free_at = 0;
        for (const PipelineAction& a : stage.actions) {
            const bool in_range = a.micro_batch >= 0 && a.micro_batch < m && a.chunk == 0;
            v.expect(in_range, "micro-batch or chunk out of range");
            if (!in_range) return;
            const PipelineAction** seen = nullptr;
            double duration = 0;
            const int entry = s * m + a.micro_batch;
            if (a.type == PipelineAction::kForward) seen = &index->forward[entry], duration = times.forward;
            if (a.type == PipelineAction::kInputGradient) seen = &index->backward[entry], duration = times.input_gradient;
            if (a.type == PipelineAction::kWeightGradient) seen = &index->weight[entry], duration = times.weight_gradient;
            v.expect(seen != nullptr, "an action is neither F, B nor W");
            if (!seen) return;
            v.expect(std::fabs(a.end - a.start - duration) < 1e-12, "an action does not last its F, B or W time");
            v.expect(a.start >= free_at, "an action starts before the previous one on its stage ends");
            free_at = a.end;
            busy += a.end - a.start;
            makespan = std::max(makespan, a.end);
            v.expect(*seen == nullptr, "an action runs twice");
            *seen = &a;
            index->stage_of[entry] = s;
        }
        v.expect(std::fabs(stage.busy - busy) < 1e-9, "busy is not the sum of the action durations");
    }
    v.expect(std::fabs(sched.makespan - makespan) < 1e-9, "makespan is not the last action's end");
    for (int s = 0; s < P; s++)
        for (int i = 0; i < m; i++) {
            const int entry = s * m + i;
            const PipelineAction *f = index->forward[entry], *b = index->backward[entry], *w = index->weight[entry];
            v.expect(f && b && w, "an F, B or W never runs");
            if (!f || !b || !w) return;
            v.expect(b->start >= f->end && w->start >= b->end, "not F before B before W");
            if (s > 0 && index->forward[entry - m]) v.expect(f->start >= index->forward[entry - m]->end, "an F starts before the previous stage's");
            if (s < P - 1 && index->backward[entry + m])
                v.expect(b->start >= index->backward[entry + m]->end, "a B starts before the next stage's");
        }
}

// The order on stage s: the F's and B's in 1F1B's order (its backwards as B's), the W's in micro-batch order,
// at most s W's waiting (B run, W not) at any time, and a W only where the (s+1)-th would wait or after the
// last B. Returns the most W's seen waiting on the stage.
int check_zero_bubble_order(const PipelineSchedule& sched, int s, Verdict& v) {
    const int P = sched.P, m = sched.m;
    const std::vector<std::tuple<bool, int, int>> one_f_one_b =
        megatron_order(std::min(P - 1 - s, m), m, [](int n, bool) { return std::make_tuple(n, 0); });
    std::vector<std::tuple<bool, int, int>> forwards_and_input_gradients;
    int waiting = 0, most_waiting = 0, next_weight = 0, input_gradients = 0;
    const std::vector<PipelineAction>& actions = sched.stages[s].actions;
    for (size_t j = 0; j < actions.size(); j++) {
        const PipelineAction& a = actions[j];
        if (a.type != PipelineAction::kWeightGradient) {
            forwards_and_input_gradients.emplace_back(a.type != PipelineAction::kForward, a.micro_batch, a.chunk);
            if (a.type == PipelineAction::kInputGradient) waiting++, input_gradients++;
        } else {
            v.expect(a.micro_batch == next_weight++, "the W's do not run in micro-batch order");
            const bool after_input_gradient = j > 0 && actions[j - 1].type == PipelineAction::kInputGradient;
            v.expect(waiting > s || input_gradients == m, "a W runs before s+1 W's wait, before the last B");
            v.expect(after_input_gradient || input_gradients == m, "a W runs other than right after a B, before the last B");
            waiting--;
        }
        // The W's waiting before the next F or B (a B that leaves s+1 waiting is followed by the oldest W).
        if (j + 1 < actions.size() && actions[j + 1].type != PipelineAction::kWeightGradient) {
            v.expect(waiting <= s, "more than s W's wait on stage s");
            most_waiting = std::max(most_waiting, waiting);
        }
    }
    v.expect(forwards_and_input_gradients == one_f_one_b, "the F's and B's are not in 1F1B's order");
    return most_waiting;
}

void test_zero_bubble_names_and_problems() {
    const PipelineScheduleKind zb1 = PipelineScheduleKind::kZeroBubbleH1;
    PipelineScheduleKind kind = PipelineScheduleKind::kOneFOneB;
    expect(std::string(pipeline_schedule_name(zb1)) == "zb1" && parse_pipeline_schedule("zb1", &kind) && kind == zb1 &&
               !parse_pipeline_schedule("ZB1", &kind) && !parse_pipeline_schedule("zb", &kind),
           "zb1 name: printed and parsed as zb1 (ZB1, zb refused)", std::string("named ") + pipeline_schedule_name(zb1));
    Verdict v{"zb1 pipeline_schedule_problem: accepts exactly v 1 (P >= 1, m >= 1); other v refused in one line naming --virtual-stages"};
    int accepted = 0, refused = 0;
    for (int P = 0; P <= 8; P++)
        for (int m = 0; m <= 32; m++)
            for (int chunks = 0; chunks <= 4; chunks++) {
                v.where = shape_name({zb1, P, m, chunks});
                const std::string problem = pipeline_schedule_problem(zb1, P, m, chunks, P * chunks);
                if (P >= 1 && m >= 1 && chunks == 1) {
                    accepted++;
                    if (!problem.empty()) v.fail("refused: " + problem);
                    continue;
                }
                refused++;
                v.expect(one_line(problem) && problem.compare(0, 2, "--") == 0, "not refused in one line that starts with a flag");
                if (P >= 1 && m >= 1 && chunks > 1)
                    v.expect(contains(problem, "--virtual-stages " + std::to_string(chunks)) && contains(problem, "zb1"),
                             ("the refusal of v > 1 does not name --virtual-stages and zb1: \"" + problem + "\"").c_str());
                bool schedule_threw = false, simulation_threw = false;
                try {
                    make_pipeline_schedule(zb1, P, m, chunks, 1, 1, 1);
                } catch (const std::invalid_argument&) {
                    schedule_threw = true;
                }
                try {
                    const std::vector<double> costs(std::max(P * chunks, 0), 1.0);
                    simulate_pipeline(zb1, P, m, chunks, costs, costs, costs);
                } catch (const std::invalid_argument&) {
                    simulation_threw = true;
                }
                v.expect(schedule_threw && simulation_threw, "make_pipeline_schedule or simulate_pipeline does not throw std::invalid_argument");
            }
    const std::string message = pipeline_schedule_problem(zb1, 4, 8, 2, 8);
    v.where = "the message at P 4, m 8, v 2";
    v.expect(message == "--virtual-stages 2 needs --pipeline-schedule interleaved (zb1 runs one model chunk per stage)", ("\"" + message + "\"").c_str());
    v.detail = std::to_string(accepted) + " accepted, " + std::to_string(refused) + " refused, e.g. \"" + message + "\"";
}

// ZB-H1 over P 1..8, m 1..32, at each of kZeroBubbleTimes.
void test_zero_bubble_schedules() {
    const PipelineScheduleKind zb1 = PipelineScheduleKind::kZeroBubbleH1;
    const std::vector<Shape> shapes = accepted_shapes(zb1);
    const std::string count = std::to_string(shapes.size()) + " shapes x " + std::to_string(std::size(kZeroBubbleTimes)) + " F:B:W times";
    Verdict actions{"zb1 actions: each micro-batch's F, B and W once per stage, F before B before W, F and B after the neighbouring stages'"};
    Verdict order{"zb1 order: 1F1B's F's and B's; W's in order, run once s+1 wait on stage s, the rest after the last B"};
    Verdict memory{"zb1 memory: slots held from arrival to W's end, never shared (c), within min(m, P)"};
    Verdict like_one_f_one_b{"zb1 memory: no stage needs more slots or micro-batches in flight than 1F1B's stages do (P, m alike)"};
    Verdict transfers{"zb1 transfers: B carries the gradient, W sends nothing: matched pairs keyed at the producer's end (a), before the consumer (b)"};
    Verdict deadlock{"zb1 transfers: every stage's groups complete (no deadlock)"};
    Verdict bubble{"zb1 bubble() equals pipeline_bubble_theory; simulate_pipeline's idle shares are the stages', the first stage's the theory at F = B = W"};
    Verdict paper{"zb1 idle time (P-1)(F+B-W) at F = B = W and m >= P, 1f1b's (P-1)(F+B+W)"};
    Verdict smaller{"zb1 bubble < 1f1b bubble (backward B + W) for P > 1 and m >= P, <= for every m"};
    MostSlots most_slots;
    std::map<int, int> most_waiting;  // stage at P 8 -> most W's waiting
    int compared = 0;
    for (const Shape& shape : shapes) {
        const int P = shape.P, m = shape.m;
        for (const StageTimes& t : kZeroBubbleTimes) {
            const std::string where = shape_name(shape) + ", " + times_name(t);
            actions.where = order.where = memory.where = like_one_f_one_b.where = transfers.where = deadlock.where = bubble.where = paper.where =
                smaller.where = where;
            try {
                const PipelineSchedule sched = make_pipeline_schedule(zb1, P, m, 1, t.forward, t.input_gradient, t.weight_gradient);
                ActionIndex index;
                const std::string before = actions.first_failure;
                check_zero_bubble_actions(sched, t, actions, &index);
                if (actions.first_failure != before) continue;  // the later checks need every action once
                for (int s = 0; s < P; s++) {
                    const int waiting = check_zero_bubble_order(sched, s, order);
                    if (P == 8) most_waiting[s] = std::max(most_waiting[s], waiting);
                }
                check_memory(sched, index, memory, &most_slots);
                check_transfers(sched, index, transfers);
                deadlock.expect(groups_complete(sched), "the transfer groups deadlock");

                // 1F1B at the same times, its backward computing both gradients.
                const PipelineSchedule one_f_one_b = make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, P, m, 1, t.forward, t.input_gradient + t.weight_gradient);
                int one_f_one_b_slots = 0, one_f_one_b_in_flight = 0;
                for (const StageSchedule& stage : one_f_one_b.stages) {
                    one_f_one_b_slots = std::max(one_f_one_b_slots, stage.slots[0]);
                    one_f_one_b_in_flight = std::max(one_f_one_b_in_flight, stage.max_in_flight);
                }
                for (const StageSchedule& stage : sched.stages)
                    like_one_f_one_b.expect(stage.slots[0] <= one_f_one_b_slots && stage.max_in_flight <= one_f_one_b_in_flight,
                                            "a stage needs more slots or micro-batches in flight than 1F1B's most");

                const double theory = pipeline_bubble_theory(zb1, P, m, 1, t.forward, t.input_gradient, t.weight_gradient);
                if (std::fabs(sched.bubble() - theory) > 1e-9) bubble.fail(fmt("bubble %.9f, theory %.9f", sched.bubble(), theory));
                const std::vector<double> F(P, t.forward), B(P, t.input_gradient), W(P, t.weight_gradient);
                const PipelineSimulation sim = simulate_pipeline(zb1, P, m, 1, F, B, W);
                bubble.expect(std::fabs(sim.makespan - sched.makespan) < 1e-9, "simulate_pipeline's makespan differs from make_pipeline_schedule's");
                for (int s = 0; s < P; s++) {
                    const StageSchedule& stage = sched.stages[s];
                    const double span = stage.actions.back().end - stage.actions.front().start;
                    if (std::fabs(sim.idle_share[s] - (span - stage.busy) / span) > 1e-9)
                        bubble.fail(fmt("stage %g idle share %.9f, the schedule's %.9f", s, sim.idle_share[s], (span - stage.busy) / span));
                }
                const bool equal_times = t.forward == t.input_gradient && t.input_gradient == t.weight_gradient;
                if (equal_times && std::fabs(sim.idle_share[0] - theory) > 1e-9)
                    bubble.fail(fmt("first stage idle %.9f, theory %.9f", sim.idle_share[0], theory));

                const double work = m * (t.forward + t.input_gradient + t.weight_gradient);
                const double one_f_one_b_bubble = one_f_one_b.bubble();
                if (equal_times && m >= P) {
                    const double idle = sched.makespan - work, one_f_one_b_idle = one_f_one_b.makespan - work;
                    paper.expect(std::fabs(idle - (P - 1) * t.forward) < 1e-9, "the idle time is not (P-1)(F+B-W)");
                    paper.expect(std::fabs(one_f_one_b_idle - 3 * (P - 1) * t.forward) < 1e-9, "1f1b's idle time is not (P-1)(F+B+W)");
                }
                smaller.expect(sched.bubble() <= one_f_one_b_bubble + 1e-12, "larger than 1f1b's");
                if (P > 1 && m >= P) {
                    smaller.expect(sched.bubble() < one_f_one_b_bubble - 1e-12, "not smaller than 1f1b's");
                    compared++;
                }
            } catch (const std::exception& e) {
                actions.fail(std::string("exception: ") + e.what());
            }
        }
    }
    actions.detail = transfers.detail = deadlock.detail = bubble.detail = count;
    std::string waiting_text;
    for (int s = 0; s < 8; s++) waiting_text += (s ? "," : "") + std::to_string(most_waiting[s]);
    order.detail = count + "; most W's waiting per stage at P 8: " + waiting_text;
    memory.detail = count + "; most slots per stage at P 8: " + slots_by_stage(most_slots, 8, 1) + " (in flight until W's end <= min(m, P))";
    std::string one_f_one_b_slots;
    for (const StageSchedule& stage : make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, 8, 32, 1).stages)
        one_f_one_b_slots += (one_f_one_b_slots.empty() ? "" : " ") + std::to_string(stage.slots[0]);
    like_one_f_one_b.detail = count + "; 1F1B's slots per stage at P 8: " + one_f_one_b_slots +
                              " (ZB-H1 needs its first stage's on every stage)";
    paper.detail = "P 1..8, m P..32";
    smaller.detail = std::to_string(compared) + " shapes and times with m >= P";
    actions.report();
    order.report();
    memory.report();
    like_one_f_one_b.report();
    transfers.report();
    deadlock.report();
    bubble.report();
    paper.report();
    smaller.report();
}

// ZB-H1's gradient slots on each stage, walked in the stage's action order (the order the compute stream runs them
// in): a micro-batch's B takes one and its W, which reads the output gradients B left there, uses the same; no slot
// holds two micro-batches at once, so a slot passes to a B only after the W that frees it, in the order and in time;
// grad_slots is the most held at once, exactly min(m, s+1) on stage s (a B leaves at most s+1 W's waiting, then the
// oldest runs), and no more than the stage's activation sets. At kZeroBubbleTimes and the trainer's times (W takes no
// time). The other schedules keep none: grad_slots all 0, every grad_slot -1.
void test_zero_bubble_gradient_slots() {
    const PipelineScheduleKind zb1 = PipelineScheduleKind::kZeroBubbleH1;
    std::vector<StageTimes> times(std::begin(kZeroBubbleTimes), std::end(kZeroBubbleTimes));
    times.push_back({1, 2, 0});  // the trainer's schedule: make_pipeline_schedule's default times
    Verdict v{"zb1 gradient slots: B and W of a micro-batch share one, none held by two micro-batches at once (in action order and in "
              "time), min(m, s+1) on stage s, no more than the activation sets"};
    const std::vector<Shape> shapes = accepted_shapes(zb1);
    std::string at_p8;  // per stage at P 8, m 32: gradient slots / activation sets
    for (const Shape& shape : shapes)
        for (const StageTimes& t : times) {
            v.where = shape_name(shape) + ", " + times_name(t);
            const PipelineSchedule sched = make_pipeline_schedule(zb1, shape.P, shape.m, 1, t.forward, t.input_gradient, t.weight_gradient);
            for (int s = 0; s < shape.P; s++) {
                const StageSchedule& stage = sched.stages[s];
                v.expect(stage.grad_slots.size() == 1 && stage.slots.size() == 1, "grad_slots or slots does not have v = 1 entries");
                if (stage.grad_slots.size() != 1 || stage.slots.size() != 1) return;
                const int slots = stage.grad_slots[0];
                std::vector<int> holder(std::max(slots, 0), -1);      // the micro-batch holding each slot, or -1
                std::vector<double> freed_at(holder.size(), -1.0);    // the end of the W that last freed it
                std::vector<int> slot_of(shape.m, -1);                // each micro-batch's slot, from its B
                int held = 0, most_held = 0;
                for (const PipelineAction& a : stage.actions) {
                    const int i = a.micro_batch;
                    if (a.type == PipelineAction::kForward) {
                        v.expect(a.grad_slot == -1, "a forward has a gradient slot");
                        continue;
                    }
                    const bool in_range = a.grad_slot >= 0 && a.grad_slot < slots;
                    v.expect(in_range, "a B or W has no gradient slot, or one beyond grad_slots");
                    if (!in_range) return;
                    if (a.type == PipelineAction::kInputGradient) {
                        v.expect(holder[a.grad_slot] == -1, "a B takes a gradient slot that another micro-batch holds (action order)");
                        v.expect(a.start >= freed_at[a.grad_slot], "a B takes a gradient slot before the W that freed it ends");
                        holder[a.grad_slot] = i;
                        slot_of[i] = a.grad_slot;
                        most_held = std::max(most_held, ++held);
                    } else {
                        v.expect(a.type == PipelineAction::kWeightGradient, "an action is neither F, B nor W");
                        v.expect(a.grad_slot == slot_of[i] && holder[a.grad_slot] == i, "a W reads another gradient slot than its B's");
                        holder[a.grad_slot] = -1;
                        freed_at[a.grad_slot] = a.end;
                        held--;
                    }
                }
                v.expect(held == 0, "a gradient slot is still held after the stage's last action");
                v.expect(slots == most_held, "grad_slots is not the most micro-batches holding one at once");
                v.expect(slots == std::min(shape.m, s + 1), "grad_slots on stage s is not min(m, s+1)");
                v.expect(slots <= stage.slots[0], "more gradient slots than activation sets");
                if (shape.P == 8 && shape.m == 32 && t.weight_gradient == 0)
                    at_p8 += (s ? " " : "") + std::to_string(slots) + "/" + std::to_string(stage.slots[0]);
            }
        }
    for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved})
        for (const Shape& shape : accepted_shapes(kind)) {
            v.where = shape_name(shape);
            const PipelineSchedule sched = make_pipeline_schedule(kind, shape.P, shape.m, shape.v);
            for (const StageSchedule& stage : sched.stages) {
                v.expect(stage.grad_slots == std::vector<int>(shape.v, 0), "grad_slots is not v zeros");
                for (const PipelineAction& a : stage.actions) v.expect(a.grad_slot == -1, "an action has a gradient slot");
            }
        }
    v.detail = std::to_string(shapes.size()) + " shapes x " + std::to_string(times.size()) +
               " F:B:W times; gradient slots / activation sets per stage at P 8, m 32: " + at_p8;
}

// 1F1B's and the interleaved schedule's backward computes both gradients: with a weight-gradient time its
// actions last backward + weight-gradient time, and the schedule is the one with that backward time.
void test_weight_gradient_time_in_full_backward() {
    Verdict v{"1f1b and interleaved: the backward lasts B + W (weight_gradient_time added to backward_time)"};
    int cases = 0;
    for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved})
        for (const Shape& shape : accepted_shapes(kind)) {
            v.where = shape_name(shape);
            const PipelineSchedule split = make_pipeline_schedule(kind, shape.P, shape.m, shape.v, 2.0, 1.0, 3.0);
            const PipelineSchedule whole = make_pipeline_schedule(kind, shape.P, shape.m, shape.v, 2.0, 4.0);
            v.expect(split.makespan == whole.makespan && split.bubble() == whole.bubble(), "a different step");
            for (int s = 0; s < shape.P; s++)
                for (size_t j = 0; j < split.stages[s].actions.size(); j++) {
                    const PipelineAction &a = split.stages[s].actions[j], &b = whole.stages[s].actions[j];
                    v.expect(a.type == b.type && a.start == b.start && a.end == b.end && a.slot == b.slot &&
                                 (a.type == PipelineAction::kForward || a.type == PipelineAction::kBackward),
                             "an action differs, or is not a forward or a backward");
                }
            const int K = shape.P * shape.v;
            const PipelineSimulation with_weight = simulate_pipeline(kind, shape.P, shape.m, shape.v, std::vector<double>(K, 2.0),
                                                                     std::vector<double>(K, 1.0), std::vector<double>(K, 3.0));
            const PipelineSimulation without = simulate_pipeline(kind, shape.P, shape.m, shape.v, std::vector<double>(K, 2.0), std::vector<double>(K, 4.0));
            v.expect(with_weight.makespan == without.makespan && with_weight.idle_share == without.idle_share, "simulate_pipeline differs");
            cases++;
        }
    v.detail = std::to_string(cases) + " shapes";
}
// The trainer's work model for zb1: a layer's B and W one forward each (two each under --recompute 3), the other
// schedules' backward whole; pipeline_stage_work's W per virtual stage; the balanced split of zb1 a split of the
// layers, simulated with W no slower than the even split.
void test_zero_bubble_work_model() {
    const PipelineScheduleKind zb1 = PipelineScheduleKind::kZeroBubbleH1;
    const LayerBackwardWork plain = layer_backward_actions_work(zb1, 0), recomputed = layer_backward_actions_work(zb1, 3),
                            one_f_one_b = layer_backward_actions_work(PipelineScheduleKind::kOneFOneB, 3);
    expect(plain.backward == 1 && plain.weight_gradient == 1 && recomputed.backward == 2 && recomputed.weight_gradient == 2 &&
               one_f_one_b.backward == 3 && one_f_one_b.weight_gradient == 0,
           "layer_backward_actions_work: zb1's B and W 1 each (2 each under --recompute 3), 1f1b's backward whole",
           fmt("zb1 %g + %g", plain.backward, plain.weight_gradient) + fmt(", recompute 3 %g + %g", recomputed.backward, recomputed.weight_gradient));
    std::vector<double> forward, backward, weight;
    pipeline_stage_work({3, 5}, 1.0, 1.5, &forward, &backward, 1.0, &weight);
    expect(forward == std::vector<double>{3.0, 6.5} && backward == std::vector<double>{3.0, 5.0} && weight == std::vector<double>{3.0, 5.0},
           "pipeline_stage_work with W: each virtual stage's B and W", fmt("weight %g %g", weight[0], weight[1]));
    Verdict v{"pipeline_balanced_split zb1: a split of the layers, simulated with W no slower than the even split"};
    int cases = 0;
    for (int P = 2; P <= 8; P *= 2)
        for (int layers : {8, 12, 32})
            for (double head : {0.0, 3.0, 13.4}) {
                const int m = 2 * P;
                v.where = fmt("P %g, %g layers", P, layers) + fmt(", head %g", head);
                const std::vector<int> split = pipeline_balanced_split(zb1, layers, P, m, 1, 1.0, head, 1.0);
                std::vector<int> even;
                pipeline_layer_split(layers, P, 1, "", &even);
                int sum = 0;
                for (int n : split) sum += n;
                v.expect((int)split.size() == P && sum == layers && *std::min_element(split.begin(), split.end()) >= 1,
                         "not a split of the layers into P non-empty parts");
                if ((int)split.size() != P) continue;
                auto makespan = [&](const std::vector<int>& s) {
                    std::vector<double> f, b, w;
                    pipeline_stage_work(s, 1.0, head, &f, &b, 1.0, &w);
                    return simulate_pipeline(zb1, P, m, 1, f, b, w).makespan;
                };
                v.expect(makespan(split) <= makespan(even) * (1 + 1e-12), "slower than the even split");
                cases++;
            }
    v.detail = std::to_string(cases) + " cases";
}
}  // namespace

// The host order (host_order, which PipelineParallel::run_step follows) against the events that join the compute and
// transfer streams: each wait must find the record it is meant to see as the event's latest, or it would wait for an
// older one. Per (chunk, slot): a send waits for its producer (forward_done, backward_done: this micro-batch), a
// receive of an activation for the release of the set by its previous micro-batch (set_free: backward, ZB-H1's W),
// a forward for its input (input_ready) and for the previous micro-batch's gradient to have left (gradient_sent), a
// backward or B for its output's gradient (gradient_ready).
std::string host_order_problem(const PipelineSchedule& sched) {
    const int P = sched.P, K = sched.P * sched.v;
    for (int stage = 0; stage < P; stage++) {
        const StageSchedule& s = sched.stages[stage];
        enum Event { kForwardDone, kBackwardDone, kSetFree, kInputReady, kGradientReady, kGradientSent, kEvents };
        std::map<std::pair<int, int>, std::array<int, kEvents>> latest;        // (chunk, slot) -> micro-batch last recorded
        std::map<std::pair<int, int>, std::vector<int>> occupants;             // (chunk, slot) -> micro-batches in forward order
        for (const PipelineAction& a : s.actions)
            if (a.type == PipelineAction::kForward) occupants[{a.chunk, a.slot}].push_back(a.micro_batch);
        auto previous = [&](int chunk, int slot, int micro_batch) {
            const std::vector<int>& o = occupants[{chunk, slot}];
            const auto it = std::find(o.begin(), o.end(), micro_batch);
            return it == o.end() || it == o.begin() ? -1 : *(it - 1);
        };
        auto record = [&](int chunk, int slot, Event e, int micro_batch) {
            auto it = latest.find({chunk, slot});
            if (it == latest.end()) it = latest.emplace(std::make_pair(chunk, slot), std::array<int, kEvents>{-1, -1, -1, -1, -1, -1}).first;
            it->second[e] = micro_batch;
        };
        auto seen = [&](int chunk, int slot, Event e) {
            const auto it = latest.find({chunk, slot});
            return it == latest.end() ? -1 : it->second[e];
        };
        const char* names[] = {"forward_done", "backward_done", "set_free", "input_ready", "gradient_ready", "gradient_sent"};
        auto wrong = [&](const char* what, int micro_batch, Event e, int expected, int got) {
            return fmt("stage %g: ", stage) + what + fmt(" of micro-batch %g", micro_batch) + " waits for " + names[e] +
                   fmt(" of micro-batch %g but would see %g's", expected, got);
        };
        for (const HostStep& step : host_order(s)) {
            if (step.transfers) {
                for (size_t t = step.first; t < step.last; t++) {
                    const PipelineTransfer& x = s.transfers[t];
                    const Event e = x.send ? (x.gradient ? kBackwardDone : kForwardDone) : kSetFree;
                    const int expected = x.send ? x.micro_batch : previous(x.chunk, x.slot, x.micro_batch);
                    if ((x.send || !x.gradient) && expected >= 0 && seen(x.chunk, x.slot, e) != expected)
                        return wrong(x.send ? "a send" : "the receive of the activation", x.micro_batch, e, expected, seen(x.chunk, x.slot, e));
                }
                for (size_t t = step.first; t < step.last; t++) {
                    const PipelineTransfer& x = s.transfers[t];
                    if (!x.send) record(x.chunk, x.slot, x.gradient ? kGradientReady : kInputReady, x.micro_batch);
                    else if (x.gradient) record(x.chunk, x.slot, kGradientSent, x.micro_batch);
                }
                continue;
            }
            const PipelineAction& a = s.actions[step.first];
            const int k = a.chunk * P + stage, i = a.micro_batch;
            if (a.type == PipelineAction::kForward) {
                if (k > 0 && seen(a.chunk, a.slot, kInputReady) != i)
                    return wrong("the forward", i, kInputReady, i, seen(a.chunk, a.slot, kInputReady));
                const int before = previous(a.chunk, a.slot, i);
                if (k > 0 && before >= 0 && seen(a.chunk, a.slot, kGradientSent) != before)
                    return wrong("the forward", i, kGradientSent, before, seen(a.chunk, a.slot, kGradientSent));
                record(a.chunk, a.slot, kForwardDone, i);
            } else {
                if (a.type != PipelineAction::kWeightGradient && k < K - 1 && seen(a.chunk, a.slot, kGradientReady) != i)
                    return wrong("the backward", i, kGradientReady, i, seen(a.chunk, a.slot, kGradientReady));
                if (a.type != PipelineAction::kWeightGradient) record(a.chunk, a.slot, kBackwardDone, i);
                if (a.type != PipelineAction::kInputGradient) record(a.chunk, a.slot, kSetFree, i);
            }
        }
    }
    return "";
}
void test_host_order() {
    int cases = 0;
    for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved, PipelineScheduleKind::kZeroBubbleH1}) {
        Verdict v{std::string(pipeline_schedule_name(kind)) +
                  " host order: every wait on an event finds the record it needs as the latest (the receive into a set after the set's last use)"};
        std::vector<StageTimes> times = {{1, 2, 0}};  // the trainer's schedule: make_pipeline_schedule's default times
        if (kind == PipelineScheduleKind::kZeroBubbleH1) times.insert(times.end(), std::begin(kZeroBubbleTimes), std::end(kZeroBubbleTimes));
        for (const Shape& shape : accepted_shapes(kind))
            for (const StageTimes& t : times) {
                v.where = shape_name(shape) + ", " + times_name(t);
                const std::string problem =
                    host_order_problem(make_pipeline_schedule(kind, shape.P, shape.m, shape.v, t.forward, t.input_gradient, t.weight_gradient));
                if (!problem.empty()) v.fail(problem);
                cases++;
            }
        v.detail = std::to_string(cases) + " schedules";
        cases = 0;
    }
}

int main() {
    check_suite("pipeline_schedule");
    test_names();
    test_problems();
    for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved, PipelineScheduleKind::kZeroBubbleH1})
        guarded(std::string("limits ") + pipeline_schedule_name(kind), [&] { test_limits(kind); });
    test_layer_split();
    test_deadlock_check();
    for (PipelineScheduleKind kind : {PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved})
        guarded(std::string(pipeline_schedule_name(kind)) + " schedules", [&] { test_schedules(kind); });
    guarded("interleaved bubble < 1f1b bubble", test_interleaved_beats_1f1b);
    guarded("simulate_pipeline with each stage's work", test_simulation_with_work);
    guarded("pipeline_balanced_split", test_balanced_split);
    guarded("zb1 names and problems", test_zero_bubble_names_and_problems);
    guarded("zb1 schedules", test_zero_bubble_schedules);
    guarded("zb1 gradient slots", test_zero_bubble_gradient_slots);
    guarded("backward time B + W", test_weight_gradient_time_in_full_backward);
    guarded("zb1 work model", test_zero_bubble_work_model);
    guarded("host order", test_host_order);
    return check_failures() ? 1 : 0;
}
