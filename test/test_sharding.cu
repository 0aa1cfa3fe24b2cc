// Sharding plans, without a GPU: the padded parameter layout for N data-parallel ranks and each rank's
// ZeRO slices. For several models (GPT-2 124M, an uneven toy model) and N = 1..8: every unit is padded to
// a multiple of 8N; the slices of all ranks tile every unit exactly once; each rank stores total/N elements;
// the llm.c file order maps onto the layout without overlaps and covers exactly the model's parameters;
// weight decay covers exactly the matrices and embeddings, and LayoutMask::contains_bits (AdamW's per-vector
// form) equals contains. Checkpoints: optimizer state written by N ranks at
// any stage reads back, unit by unit, into the layout of any other number of ranks, also across tensor- and
// pipeline-parallel sizes, and each rank's part of another mesh reads alone. The pipeline stages' parts cover the model once (the tied wte twice). The
// initialisation's runs, unit by unit, give each rank's part. ZeRO-Offload's memory plan: d12's pinned host memory
// per rank against hand-computed bytes (with the delayed update too), and the GPU's plan without the optimizer state; its tiles cover each rank's
// storage once, and the CPU AdamW over them equals the update unit slice by unit slice, bit for bit. A pipeline
// stage's activation counts with ZB-H1's gradient slots and without (1F1B's, all 0) at each recompute level.
// The quick tier (TEST_TIER=quick) checks d12's layout at N = 5 only (padded units; the toy model still takes N = 1..8)
// and leaves out d12's tensor-parallel layout (the 4-head model's, at tp 1, 2 and 4, stays): each d12 pass walks its
// 124M elements, about 1.4 s a layout and 3 s a tensor-parallel size on an H100 host, most of the suite's time.
#define TESTING
#include "../train_gpt.cu"
#include <random>
#include <tuple>
#include "check.h"

static void check_layout(const ModelConfig& config, const std::string& name, std::vector<int> ranks = {1, 2, 3, 4, 5, 6, 7, 8}) {
    for (int N : ranks) {
        const ParameterLayout layout(config, 8 * N);
        const std::string tag = name + " N=" + std::to_string(N);
        bool padded = true, tiled = true, local = true;
        std::vector<int> owner(layout.total, 0);
        for (int u = 0; u < layout.num_units(); u++) {
            padded = padded && layout.unit_size(u) % (8 * N) == 0 && layout.unit_size(u) >= layout.unit_real_size(u);
            if (u + 1 < layout.num_units()) tiled = tiled && layout.unit_offset(u) + layout.unit_size(u) == layout.unit_offset(u + 1);
        }
        tiled = tiled && layout.unit_offset(layout.num_units() - 1) + layout.unit_size(layout.num_units() - 1) == layout.total;
        for (int r = 0; r < N; r++) {
            ShardPlan plan(layout.unit_offsets, layout.unit_sizes, N, r);
            local = local && plan.local_total * N == layout.total;
            for (int u = 0; u < plan.num_units(); u++)
                for (size_t i = 0; i < plan.shard_size[u]; i++) owner[plan.global_begin(u) + i]++;
        }
        bool once = true;
        for (int c : owner) once = once && c == 1;
        check(padded, tag + ": units padded to a multiple of 8N", "");
        check(tiled, tag + ": units tile the layout", "");
        check(local && once, tag + ": every element owned by exactly one rank, total/N each", "");
        // llm.c file runs: in bounds, disjoint, exactly `count` parameters, never in the padding
        std::vector<char> used(layout.total, 0);
        size_t covered = 0;
        bool disjoint = true;
        layout.for_each_file_run([&](size_t, size_t device_offset, size_t count) {
            for (size_t i = 0; i < count; i++) {
                disjoint = disjoint && device_offset + i < layout.total && !used[device_offset + i];
                if (device_offset + i < layout.total) used[device_offset + i] = 1;
            }
            covered += count;
        });
        check(disjoint && covered == layout.count, tag + ": file order maps onto the layout", std::to_string(covered) + " parameters");
        // weight decay: the matrices and embeddings (wte, wpe, qkvw, attprojw, fcw, fcprojw), nothing else
        const LayoutMask mask = layout.decay_mask();
        size_t decayed = 0;
        for (size_t i = 0; i < layout.total; i++) decayed += used[i] && mask.contains(i);
        const size_t C = config.channels, expected = (size_t)config.padded_vocab_size * C + (size_t)config.max_seq_len * C +
                                                      (size_t)config.num_layers * 12 * C * C;
        check(decayed == expected, tag + ": weight decay on exactly the 2-D tensors",
              std::to_string(decayed) + " of " + std::to_string(expected));
    }
}

// LayoutMask::contains_bits against contains on small masks of every shape (blocks of 1 to 20 elements, ranges that
// start at a block's first element, runs crossing the head, block and tail boundaries), from every start.
static void check_mask_bits() {
    std::mt19937 rng(7);
    size_t mismatches = 0, elements = 0;
    for (int trial = 0; trial < 500; trial++) {
        LayoutMask m;
        m.head_end = rng() % 12;
        m.blocks_begin = m.head_end + rng() % 6;
        m.block_size = 1 + rng() % 20;
        m.blocks_end = m.blocks_begin + m.block_size * (rng() % 4);
        m.num_ranges = rng() % 4;
        for (int r = 0; r < m.num_ranges; r++) {
            m.range_begin[r] = rng() % m.block_size;
            m.range_end[r] = m.range_begin[r] + 1 + rng() % 6;
        }
        for (long i = 0; i < m.blocks_end + 8; i++) {
            const uint32_t bits4 = m.contains_bits<4>(i), bits8 = m.contains_bits<8>(i);
            for (int k = 0; k < 8; k++) {
                const uint32_t in = m.contains(i + k);
                mismatches += ((bits8 >> k) & 1) != in;
                if (k < 4) mismatches += ((bits4 >> k) & 1) != in;
                elements += k < 4 ? 2 : 1;
            }
        }
    }
    check(mismatches == 0, "LayoutMask::contains_bits equals contains on 500 small masks",
          std::to_string(mismatches) + " of " + std::to_string(elements) + " elements differ");
}

// Tensor parallelism: every rank's slices (for_each_full_run) tile the whole model's real parameters exactly once;
// each rank's runs fill its own layout's real parameters exactly once; the split mask covers exactly the split
// tensors; and qkv is split by whole heads (a rank's first q row is the full model's row r * C / tp, its first k
// row the full row C + r * C / tp), not into chunks of the fused matrix.
static void check_tensor_parallel_layout(const ModelConfig& config, const std::string& name) {
    const ParameterLayout full(config, 8);
    const size_t C = config.channels;
    for (int tp : {1, 2, 4}) {
        if (tensor_parallel_problem(config, tp) != "") continue;
        const std::string tag = name + " tp=" + std::to_string(tp);
        std::vector<int> owners(full.total, 0);
        bool local_once = true, heads_whole = true, mask_exact = true;
        for (int r = 0; r < tp; r++) {
            const ParameterLayout local(config, 8 * 3, tp);  // any data-parallel padding
            std::vector<int> used(local.total, 0);
            size_t mapped = 0;
            local.for_each_full_run(full, r, [&](size_t from, size_t to, size_t n) {
                for (size_t i = 0; i < n; i++) { owners[from + i]++; used[to + i]++; }
                mapped += n;
            });
            size_t in_split = 0;
            const LayoutMask split = local.split_mask();
            for (size_t i = 0; i < local.total; i++) {
                local_once = local_once && used[i] <= 1;
                in_split += used[i] && split.contains((long)i);
                mask_exact = mask_exact && (split.contains((long)i) ? used[i] == 1 : true);
            }
            local_once = local_once && mapped == local.count;
            const size_t Cs = C / tp, Vl = config.padded_vocab_size / tp;
            const size_t split_count = Vl * C + (size_t)config.num_layers * (3 * Cs * C + 3 * Cs + Cs * C + 4 * Cs * C + 4 * Cs + 4 * Cs * C);
            mask_exact = mask_exact && in_split == split_count;
            // where the first q and the first k row of rank r come from
            local.for_each_full_run(full, r, [&](size_t from, size_t to, size_t) {
                if (to == local.tensor(0, QKVW)) heads_whole = heads_whole && from == full.tensor(0, QKVW) + r * Cs * C;
                if (to == local.tensor(0, QKVW) + Cs * C) heads_whole = heads_whole && from == full.tensor(0, QKVW) + (C + r * Cs) * C;
                if (to == local.tensor(0, ATTPROJW) + Cs) heads_whole = heads_whole && from == full.tensor(0, ATTPROJW) + C + r * Cs;
            });
        }
        bool full_once = true;
        for (int u = 0; u < full.num_units(); u++)
            for (size_t i = 0; i < full.unit_size(u); i++) {
                const int got = owners[full.unit_offset(u) + i];  // 1 (split) or tp (replicated); 0 in the padding
                full_once = full_once && (i < full.unit_real_size(u) ? got == 1 || got == tp : got == 0);
            }
        // split tensors are owned once over the ranks, replicated ones by every rank: count the ranks per element
        size_t owned = 0;
        for (int c : owners) owned += c;
        const size_t replicated_count = full.count - (size_t)config.padded_vocab_size * C - (size_t)config.num_layers * 12 * C * C -
                                        (size_t)config.num_layers * 7 * C;  // wpe, LayerNorms, lnf, attprojb, fcprojb
        full_once = full_once && owned == full.count + (size_t)(tp - 1) * replicated_count;
        check(full_once, tag + ": the ranks' slices tile the whole model (split tensors once, replicated on every rank)", "");
        check(local_once, tag + ": each rank's runs fill its layout's parameters exactly once", "");
        check(mask_exact, tag + ": the split mask covers exactly the split tensors", "");
        check(heads_whole, tag + ": qkv split by whole heads, attn-proj by the matching input columns", "");
    }
}

// Pipeline parallelism: the stages' parts (for_each_full_run) cover the whole model's real parameters exactly once,
// except the tied wte, which the first and the last stage both hold (kinds kTied and kTiedCopy).
static void check_pipeline_layout(const ModelConfig& config, const std::string& name) {
    for (int tp : {1, 2})
        for (int pp = 2; pp <= 4; pp++)
            for (int v : {1, 2}) {
                std::vector<int> per_virtual_stage;
                if (!pipeline_layer_split(config.num_layers, pp, v, "", &per_virtual_stage).empty()) continue;
                const ParameterLayout full(config, 8);
                std::vector<int> owners(full.total, 0);
                bool kinds = true;
                for (int p = 0; p < pp; p++) {
                    std::vector<int> chunks;
                    const ParameterLayout stage(config, 8, tp, pipeline_stage_model(per_virtual_stage, pp, p, &chunks));
                    kinds = kinds && (stage.wte_unit < 0) == (p != 0 && p != pp - 1) &&
                            (p == 0 ? stage.unit_kinds[stage.wte_unit] == UnitKind::kTied
                                    : p == pp - 1 ? stage.unit_kinds[stage.wte_unit] == UnitKind::kTiedCopy : true);
                    for (int r = 0; r < tp; r++)
                        stage.for_each_full_run(full, r, [&](size_t from, size_t, size_t n) {
                            for (size_t i = 0; i < n; i++) owners[from + i]++;
                        });
                }
                bool exact = true;
                const size_t wte_end = (size_t)config.padded_vocab_size * config.channels;
                for (int u = 0; u < full.num_units(); u++)
                    for (size_t i = 0; i < full.unit_size(u); i++) {
                        const size_t at = full.unit_offset(u) + i;
                        const bool real = i < full.unit_real_size(u);
                        const bool split = full.split_mask().contains((long)at);
                        const int expected = !real ? 0 : (split ? 1 : tp) * (at < wte_end ? 2 : 1);
                        exact = exact && owners[at] == expected;
                    }
                check(exact && kinds, "pipeline layout " + name + " tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " v " + std::to_string(v) +
                                      ": the stages' parts cover the model once, wte on the first and the last stage", "");
            }
}

// Writes the state files that a mesh of world (data) x pp (pipeline, v chunks per stage) x tp ranks at `stage`
// would write for whole-model optimizer arrays, reads them back for `new_world` data-parallel ranks (whole-model
// arrays in their padding), and compares every real element (padding must read 0).
static void check_resharding(const ModelConfig& config, int world, int stage, int new_world, bool has_master, int tp = 1, int pp = 1,
                             int v = 1) {
    const std::string dir = "build/test_work/sharding";
    make_directories(dir);
    const ParameterLayout old_full(config, 8 * world), new_layout(config, 8 * new_world);
    std::vector<int> per_virtual_stage;
    const std::string problem = pipeline_layer_split(config.num_layers, pp, v, "", &per_virtual_stage);
    if (!problem.empty()) die(problem);
    std::mt19937 rng(world * 100 + stage * 10 + new_world + 1000 * tp);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<std::vector<float>> full(3, std::vector<float>(old_full.total, 0.0f));
    for (auto& a : full)
        for (int u = 0; u < old_full.num_units(); u++)
            for (size_t i = 0; i < old_full.unit_real_size(u); i++) a[old_full.unit_offset(u) + i] = uniform(rng);
    DataLoaderState data = {};
    data.epoch = 7;
    MeshShape shape;
    shape.tp = tp;
    shape.pp = pp;
    shape.dp = world;
    for (int t = 0; t < tp; t++)
    for (int p = 0; p < pp; p++) {
        std::vector<int> chunks;
        const StageModel stage_part = pipeline_stage_model(per_virtual_stage, pp, p, &chunks);
        const ParameterLayout slices(config, 8 * world, tp, stage_part);
        std::vector<std::vector<float>> local(3, std::vector<float>(slices.total, 0.0f));
        slices.for_each_full_run(old_full, t, [&](size_t from, size_t to, size_t n) {
            for (int a = 0; a < 3; a++) std::copy(full[a].begin() + from, full[a].begin() + from + n, local[a].begin() + to);
        });
        for (int d = 0; d < (stage >= 1 ? world : 1); d++) {
            ShardPlan plan(slices.unit_offsets, slices.unit_sizes, world, d);
            auto part = [&](const std::vector<float>& a) { return stage >= 1 ? local_slices(plan, a) : a; };
            const std::vector<float> master = has_master ? part(local[0]) : std::vector<float>();
            StateHeader h{3, 1, world, tp, pp, d, t, p, stage, has_master, 0, 1.0f, 0, (long long)part(local[1]).size()};
            MeshCoord coord;
            coord.tp = t;
            coord.pp = p;
            coord.dp = d;
            write_state_file(state_path(dir, 3, mesh_rank(shape, coord)), h, stage_part, master, part(local[1]), part(local[2]), data);
        }
    }
    const SavedOptimizerState saved = read_optimizer_state(dir, 3, new_layout, 0);
    bool same = saved.data_state.epoch == 7 && saved.master.empty() == !has_master;
    std::vector<std::vector<float>> whole(3, std::vector<float>(new_layout.total, 0.0f));  // the written state in new_layout
    for (int a = 0; a < 3; a++)
        for (int u = 0; u < new_layout.num_units(); u++)
            for (size_t i = 0; i < new_layout.unit_real_size(u); i++) whole[a][new_layout.unit_offset(u) + i] = full[a][old_full.unit_offset(u) + i];
    for (int a = has_master ? 0 : 1; a < 3; a++) same = same && (a == 0 ? saved.master : a == 1 ? saved.m : saved.v) == whole[a];
    // each rank's part of other tensor- and pipeline-parallel sizes, read alone, equals those places of the whole
    for (int new_tp : {1, 2})
        for (int new_pp : {1, 2}) {
            std::vector<int> new_split;
            if (tensor_parallel_problem(config, new_tp) != "" || !pipeline_layer_split(config.num_layers, new_pp, 1, "", &new_split).empty()) continue;
            for (int p = 0; p < new_pp; p++) {
                std::vector<int> chunks;
                const ParameterLayout part(config, 8 * new_world, new_tp, pipeline_stage_model(new_split, new_pp, p, &chunks));
                for (int t = 0; t < new_tp; t++) {
                    const SavedOptimizerState mine = read_optimizer_state(dir, 3, part, t);
                    same = same && mine.data_state.epoch == 7;
                    for (int a = has_master ? 0 : 1; a < 3; a++) {
                        std::vector<float> expected(part.total, 0.0f);
                        part.for_each_full_run(new_layout, t, [&](size_t from, size_t to, size_t n) {
                            std::copy(whole[a].begin() + from, whole[a].begin() + from + n, expected.begin() + to);
                        });
                        same = same && (a == 0 ? mine.master : a == 1 ? mine.m : mine.v) == expected;
                    }
                }
            }
        }
    check(same, "checkpoint written by " + std::to_string(world) + " ranks" + (tp > 1 ? " x tensor parallel " + std::to_string(tp) : "") +
                    (pp > 1 ? " x pipeline parallel " + std::to_string(pp) + (v > 1 ? " (" + std::to_string(v) + " chunks per stage)" : "") : "") +
                    " at stage " + std::to_string(stage) + (has_master ? " (with master weights)" : "") + " reads back exactly on " +
                    std::to_string(new_world) + " ranks, whole and in each part at tp 1-2 x pp 1-2", "");
}

// The initialisation's runs (unit_runs): copied unit by unit out of a whole model of distinct values, they give
// each rank's part exactly as for_each_full_run maps it (padding zero), at tp 1-4 and on every pipeline stage
// of 1-4 stages with 1 or 2 chunks each.
static void check_unit_runs(const ModelConfig& config, const std::string& name) {
    const ParameterLayout full(config, 8 * 3);
    std::vector<float> values(full.total);
    for (size_t i = 0; i < full.total; i++) values[i] = (float)(i + 1);  // distinct: the model has fewer than 2^24
    bool exact = true;
    int parts = 0;
    for (int tp : {1, 2, 4}) {
        if (tensor_parallel_problem(config, tp) != "") continue;
        for (int pp = 1; pp <= 4; pp++)
            for (int v : {1, 2}) {
                std::vector<int> per_virtual_stage;
                if (pp == 1 && v == 2) continue;
                if (pp > 1 && !pipeline_layer_split(config.num_layers, pp, v, "", &per_virtual_stage).empty()) continue;
                for (int p = 0; p < pp; p++) {
                    std::vector<int> chunks;
                    const StageModel part = pp == 1 ? StageModel() : pipeline_stage_model(per_virtual_stage, pp, p, &chunks);
                    const ParameterLayout local(config, 8 * 3, tp, part);
                    for (int r = 0; r < tp; r++) {
                        std::vector<float> expected(local.total, 0.0f), made(local.total, 0.0f);
                        local.for_each_full_run(full, r, [&](size_t from, size_t to, size_t n) {
                            std::copy(values.begin() + from, values.begin() + from + n, expected.begin() + to);
                        });
                        const UnitRuns runs = unit_runs(local, full, r);
                        for (int u = 0; u < local.num_units(); u++)
                            for (const CopyRun& c : runs.runs[u])
                                std::copy(values.begin() + full.unit_offset(runs.source[u]) + c.from,
                                          values.begin() + full.unit_offset(runs.source[u]) + c.from + c.count,
                                          made.begin() + local.unit_offset(u) + c.to);
                        exact = exact && made == expected;
                        parts++;
                    }
                }
            }
    }
    check(exact && parts > 0, "initialisation runs " + name + ": unit by unit, each rank's part of the whole model",
          std::to_string(parts) + " parts (tp 1-4, pp 1-4, 1-2 chunks a stage)");
}

// ZeRO-Offload's plan for d12 (GPT-2 124M: 124,475,904 elements in the padded layout at 1, 2 and 4 data-parallel
// ranks: wte 50304 x 768 = 38,633,472, wpe 1024 x 768 = 786,432, 12 blocks of 12 C^2 + 13 C = 7,087,872 and the final
// LayerNorm's 2 C = 1,536, each a multiple of 32, so no padding) at ZeRO stages 1-3 (`stages`): per rank the host
// holds the shard's fp32 master weights (4 bytes an element; none in fp32) and Adam m and v (8), and two staging
// slots of a 4,194,304-element tile of gradients and one of parameters (2 x 4,194,304 x (2 + 2) bytes in bf16, x
// (4 + 4) in fp32), whatever the stage; with the parameters (stage 3) also the shard's parameters (2 bytes an element
// in bf16) and only the gradient slots. With the delayed update (`delayed`) no slots, but the shard's gradients and
// its new parameters whole (2 + 2 bytes an element in bf16, 4 + 4 in fp32). The GPU's model states are those without
// offload less what the host holds instead (the optimizer state, and with optimizer,parameters the parameter shard).
template <typename floatX>
static void check_offload_memory(const ModelConfig& d12, const std::string& precision, Offload offload, bool delayed, int dp,
                                 std::vector<int> stages, size_t master, size_t adam, size_t parameters, size_t gradients, size_t staging,
                                 size_t total) {
    const ParameterLayout l(d12, 8 * dp);
    for (int stage : stages) {
        const HostMemory h = ZeroOffload<floatX>::host_memory(l.total, dp, stage, offload, delayed);
        const ZeroMemory offloaded = zero_memory<floatX>(l.unit_sizes, l.unit_kinds, l.total, dp, stage, true, offload);
        const ZeroMemory resident = zero_memory<floatX>(l.unit_sizes, l.unit_kinds, l.total, dp, stage, true, Offload::kNone);
        const size_t parameters_moved = offload == Offload::kOptimizerParameters ? parameters : 0;
        char text[256];
        snprintf(text, sizeof(text), "%zu elements; host: master %zu, Adam %zu, parameters %zu, gradients %zu, staging %zu, total %zu; GPU optimizer state %zu",
                 l.total, h.master_weights, h.adam_state, h.parameters, h.gradients, h.staging, h.total(),
                 offloaded.master_weights + offloaded.adam_state);
        check(l.total == 124475904 && h.master_weights == master && h.adam_state == adam && h.parameters == parameters && h.gradients == gradients &&
                  h.staging == staging && h.total() == total && offloaded.master_weights == 0 && offloaded.adam_state == 0 &&
                  offloaded.parameters + parameters_moved == resident.parameters && offloaded.gradients == resident.gradients &&
                  resident.adam_state > 0 && ZeroOffload<floatX>::host_memory(l.total, dp, stage, Offload::kNone, delayed).total() == 0,
              "offload plan d12 " + precision + (offload == Offload::kOptimizerParameters ? " optimizer,parameters" : " optimizer") +
                  (delayed ? " delayed update" : "") + " dp " + std::to_string(dp) + " stage " + std::to_string(stage) +
                  ": host bytes per rank as computed by hand, the GPU without them",
              text);
    }
}

// The NVMe tier's plan (--offload-dir) for d12: the host holds no master weights or moments, the staging as without the
// file and the optimizer file's 3 tile buffers (a 4,194,304-element tile of 12 bytes in bf16, 8 in fp32); the disk the
// shard's 12 (8) bytes an element, rounded up to 4096, after the file's 4096-byte header.
template <typename floatX>
static void check_offload_file_memory(const ModelConfig& d12, const std::string& precision, Offload offload, int dp, size_t staging,
                                      size_t file_tiles, size_t disk) {
    const ParameterLayout l(d12, 8 * dp);
    for (int stage : {1, 2, 3}) {
        if (offload == Offload::kOptimizerParameters && stage != 3) continue;
        const HostMemory h = ZeroOffload<floatX>::host_memory(l.total, dp, stage, offload, false, true);
        const size_t parameters = offload == Offload::kOptimizerParameters ? l.total / dp * sizeof(floatX) : 0;
        char text[200];
        snprintf(text, sizeof(text), "host: master %zu, Adam %zu, staging %zu, file tiles %zu, total %zu; disk %zu", h.master_weights, h.adam_state,
                 h.staging, h.file_tiles, h.total(), h.disk);
        check(h.master_weights == 0 && h.adam_state == 0 && h.staging == staging && h.file_tiles == file_tiles && h.disk == disk &&
                  h.total() == staging + file_tiles + parameters,
              "offload-dir plan d12 " + precision + " dp " + std::to_string(dp) + " stage " + std::to_string(stage) +
                  ": the file's tiles on the host, the shard's state on the disk",
              text);
    }
}

// ZeRO-Offload's tiles, for a model whose units are not multiples of each other, on 1-3 ranks, with tiles from one
// element to more than a rank's storage: the tiles' pieces cover each rank's storage once, in order, each inside one
// unit and one tile; and the CPU AdamW (bf16 with master weights) run piece by piece at ShardPlan::global_index equals
// it run over each unit's slice at the slice's first global index (the GPU path's calls), bit for bit (one thread: the
// thread count changes nothing, test_adamw_cpu checks).
// The activation counts of a pipeline stage's sets: a schedule without gradient slots (1F1B's all 0) counts what no
// gradient slots count, and ZB-H1's add their slots' output gradients (2C a token a block at --recompute 0: qkv's
// and fc's take the set's buffers' place) and one spare each of the qkv and fch buffers they rotate through
// (3C + 4C a token), at each recompute level the slot widths of memory_plan.h's comment.
static void check_grad_slot_counts(const ModelConfig& c) {
    const int B = 2, T = 64, blocks = 3;
    const size_t N = (size_t)B * T, C = c.channels;
    for (int recompute = 0; recompute <= 3; recompute++) {
        const std::string tag = "activation counts, recompute " + std::to_string(recompute);
        size_t none_x, none_s, zeros_x, zeros_s, zb_x, zb_s;
        activation_counts(c, B, T, 1, 1, recompute, {{blocks}, {2}, false, {}}, &none_x, &none_s);
        activation_counts(c, B, T, 1, 1, recompute, {{blocks}, {2}, false, {0}}, &zeros_x, &zeros_s);
        activation_counts(c, B, T, 1, 1, recompute, {{blocks}, {2}, false, {2}}, &zb_x, &zb_s);
        check(zeros_x == none_x && zeros_s == none_s, tag + ": gradient slots all 0 count as none", std::to_string(zeros_x) + " against " + std::to_string(none_x));
        const size_t slot_width = recompute == 0 ? 2 * C : recompute < 3 ? 6 * C : 9 * C;
        const size_t spares = recompute == 0 ? 7 * C : recompute < 3 ? 3 * C : 0;
        check(zb_x == none_x + N * (2 * blocks * slot_width + spares) && zb_s == none_s,
              tag + ": 2 gradient slots add their blocks' output gradients and the spares",
              std::to_string(zb_x - none_x) + " elements more, expected " + std::to_string(N * (2 * blocks * slot_width + spares)));
    }
}

static void check_offload_tiles(const ModelConfig& config, const std::string& name) {
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    AdamWHyper h{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f, 3, 99};
    const adamw_cpu::Step step = adamw_cpu::make_step(h, 4.0f);  // norm 2: clipped to 1
    for (int N = 1; N <= 3; N++) {
        const ParameterLayout layout(config, 8 * N);
        const LayoutMask decay = layout.decay_mask();
        for (int r = 0; r < N; r++) {
            const ShardPlan plan(layout.unit_offsets, layout.unit_sizes, N, r);
            const size_t n = plan.local_total;
            std::vector<adamw_cpu::Bf16> grads(n);
            std::vector<float> master(n), m(n), v(n);
            for (size_t i = 0; i < n; i++) {
                grads[i].bits = (uint16_t)(adamw_cpu::detail::bits_of(normal(rng)) >> 16);
                master[i] = normal(rng);
                m[i] = 0.1f * normal(rng);
                v[i] = 0.01f * std::fabs(normal(rng));
            }
            std::vector<float> unit_master = master, unit_m = m, unit_v = v;
            std::vector<adamw_cpu::Bf16> unit_params(n);
            for (int u = 0; u < plan.num_units(); u++) {
                const size_t at = plan.local_offset[u];
                adamw_cpu::update(unit_params.data() + at, unit_master.data() + at, grads.data() + at, unit_m.data() + at, unit_v.data() + at, 0,
                                  (long)plan.shard_size[u], (long)plan.global_begin(u), step, decay, 1);
            }
            for (size_t tile : {(size_t)1, (size_t)7, (size_t)4096, n / 3 + 5, n, 2 * n}) {
                bool covered = true;
                size_t next = 0;
                std::vector<float> tile_master = master, tile_m = m, tile_v = v;
                std::vector<adamw_cpu::Bf16> tile_params(n);
                for (int k = 0; k < plan.num_tiles(tile); k++)
                    plan.for_each_tile_piece(tile, k, [&](int u, size_t begin, size_t end) {
                        covered = covered && begin == next && begin < end && begin >= plan.local_offset[u] &&
                                  end <= plan.local_offset[u] + plan.shard_size[u] && begin / tile == (size_t)k && (end - 1) / tile == (size_t)k;
                        next = end;
                        if (tile == 1) return;  // the cover only: one element a call
                        adamw_cpu::update(tile_params.data() + begin, tile_master.data() + begin, grads.data() + begin, tile_m.data() + begin,
                                          tile_v.data() + begin, 0, (long)(end - begin), (long)plan.global_index(u, begin), step, decay, 1);
                    });
                const std::string tag = "offload tiles " + name + " N=" + std::to_string(N) + " rank " + std::to_string(r) + " tile " +
                                        std::to_string(tile);
                check(covered && next == n, tag + ": the pieces cover the rank's storage once, in order, each in one unit", "");
                if (tile == 1) continue;
                const bool same = memcmp(tile_params.data(), unit_params.data(), n * sizeof(adamw_cpu::Bf16)) == 0 && tile_master == unit_master &&
                                  tile_m == unit_m && tile_v == unit_v;
                check(same, tag + ": AdamW piece by piece equals it unit slice by unit slice, bit for bit", "");
            }
        }
    }
}

int main() {
    check_suite("sharding");
    ModelConfig d12;
    config_from_descriptor("d12", d12);
    if (quick_tier()) check_layout(d12, "d12", {5});
    else check_layout(d12, "d12");
    const Offload optimizer = Offload::kOptimizer, parameters = Offload::kOptimizerParameters;
    // master weights 124,475,904 x 4 / dp, m and v x 8 / dp
    check_offload_memory<__nv_bfloat16>(d12, "bf16", optimizer, false, 1, {1, 2, 3}, 497903616, 995807232, 0, 0, 33554432, 1527265280);
    check_offload_file_memory<__nv_bfloat16>(d12, "bf16", optimizer, 2, 33554432, 150994944, 746860544);
    check_offload_file_memory<__nv_bfloat16>(d12, "bf16", parameters, 4, 16777216, 150994944, 373432320);
    check_offload_file_memory<float>(d12, "fp32", optimizer, 1, 67108864, 100663296, 995811328);
    check_offload_memory<__nv_bfloat16>(d12, "bf16", optimizer, false, 2, {1, 2, 3}, 248951808, 497903616, 0, 0, 33554432, 780409856);
    check_offload_memory<__nv_bfloat16>(d12, "bf16", optimizer, false, 4, {1, 2, 3}, 124475904, 248951808, 0, 0, 33554432, 406982144);
    check_offload_memory<float>(d12, "fp32", optimizer, false, 1, {1, 2, 3}, 0, 995807232, 0, 0, 67108864, 1062916096);
    check_offload_memory<float>(d12, "fp32", optimizer, false, 2, {1, 2, 3}, 0, 497903616, 0, 0, 67108864, 565012480);
    check_offload_memory<float>(d12, "fp32", optimizer, false, 4, {1, 2, 3}, 0, 248951808, 0, 0, 67108864, 316060672);
    // and the parameter shard, 124,475,904 x 2 / dp in bf16 (x 4 in fp32); staging 2 x 4,194,304 x 2 (x 4)
    check_offload_memory<__nv_bfloat16>(d12, "bf16", parameters, false, 2, {3}, 248951808, 497903616, 124475904, 0, 16777216, 888108544);
    check_offload_memory<__nv_bfloat16>(d12, "bf16", parameters, false, 4, {3}, 124475904, 248951808, 62237952, 0, 16777216, 452442880);
    check_offload_memory<float>(d12, "fp32", parameters, false, 2, {3}, 0, 497903616, 248951808, 0, 33554432, 780409856);
    // the delayed update: no staging; the shard's gradients and new parameters, 124,475,904 x 2 / dp each in bf16
    // (x 4 in fp32): 16 bytes an element of the shard in both
    check_offload_memory<__nv_bfloat16>(d12, "bf16", optimizer, true, 1, {1, 2, 3}, 497903616, 995807232, 248951808, 248951808, 0, 1991614464);
    check_offload_memory<__nv_bfloat16>(d12, "bf16", optimizer, true, 2, {1, 2, 3}, 248951808, 497903616, 124475904, 124475904, 0, 995807232);
    check_offload_memory<__nv_bfloat16>(d12, "bf16", optimizer, true, 4, {1, 2, 3}, 124475904, 248951808, 62237952, 62237952, 0, 497903616);
    check_offload_memory<float>(d12, "fp32", optimizer, true, 1, {1, 2, 3}, 0, 995807232, 497903616, 497903616, 0, 1991614464);
    check_offload_memory<float>(d12, "fp32", optimizer, true, 2, {1, 2, 3}, 0, 497903616, 248951808, 248951808, 0, 995807232);
    ModelConfig toy;  // parameter count not divisible by any N > 1
    toy.num_layers = 3; toy.num_heads = 3; toy.channels = 72; toy.max_seq_len = 129; toy.vocab_size = 1001; toy.padded_vocab_size = 1024;
    check_layout(toy, "toy");
    check_mask_bits();
    ModelConfig small = toy;  // GPT-2 head size, padded on 3 ranks
    small.num_heads = 1; small.channels = 64;
    for (const auto& c : {std::make_tuple(1, 0, 2), std::make_tuple(2, 0, 4), std::make_tuple(2, 1, 4), std::make_tuple(4, 2, 2),
                          std::make_tuple(4, 3, 1), std::make_tuple(3, 3, 2), std::make_tuple(2, 3, 3), std::make_tuple(3, 1, 3)})
        for (bool has_master : {true, false})
            check_resharding(small, std::get<0>(c), std::get<1>(c), std::get<2>(c), has_master);
    ModelConfig split = toy;  // 4 heads of 64: splits over 1, 2 and 4 tensor-parallel ranks
    split.num_heads = 4; split.channels = 256;
    if (!quick_tier()) check_tensor_parallel_layout(d12, "d12");
    check_tensor_parallel_layout(split, "4 heads");
    check_pipeline_layout(toy, "toy");
    check_pipeline_layout(split, "4 heads");
    ModelConfig eight = split;
    eight.num_layers = 8;
    check_pipeline_layout(eight, "8 layers");
    check_offload_tiles(toy, "toy");
    check_grad_slot_counts(split);
    check_unit_runs(toy, "toy");
    check_unit_runs(split, "4 heads");
    check_unit_runs(eight, "8 layers");
    for (const auto& c : {std::make_tuple(2, 1, 1, 1), std::make_tuple(2, 3, 2, 1), std::make_tuple(4, 1, 0, 2), std::make_tuple(2, 2, 2, 2),
                          std::make_tuple(4, 2, 3, 3), std::make_tuple(2, 2, 0, 1)})
        check_resharding(split, std::get<1>(c), std::get<2>(c), std::get<3>(c), true, std::get<0>(c));
    // pipeline stages (tp, pp, v, world, stage, new world): each stage's part of the blocks, the embeddings on the
    // first, the final LayerNorm and a copy of wte on the last
    ModelConfig deep = split;  // 4 layers: 2 stages of 2 chunks
    deep.num_layers = 4;
    for (const auto& c : {std::make_tuple(1, 2, 1, 1, 0, 1), std::make_tuple(1, 3, 1, 2, 1, 1), std::make_tuple(2, 2, 1, 2, 1, 3),
                          std::make_tuple(1, 2, 2, 1, 0, 2), std::make_tuple(2, 3, 1, 1, 0, 1), std::make_tuple(2, 2, 2, 2, 1, 1)})
        check_resharding(deep, std::get<3>(c), std::get<4>(c), std::get<5>(c), true, std::get<0>(c), std::get<1>(c), std::get<2>(c));
    return check_failures() == 0 ? 0 : 1;
}
