// Sharding plans, without a GPU: the padded parameter layout for N data-parallel ranks and each rank's
// ZeRO slices. For several models (GPT-2 124M, an uneven toy model) and N = 1..8: every unit is padded to
// a multiple of 8N; the slices of all ranks tile every unit exactly once; each rank stores total/N elements;
// the llm.c file order maps onto the layout without overlaps and covers exactly the model's parameters;
// weight decay covers exactly the matrices and embeddings. Checkpoints: optimizer state written by N ranks at
// any stage reads back, unit by unit, into the layout of any other number of ranks.
#define TESTING
#include "../train_gpt.cu"
#include <random>
#include <tuple>
#include "check.h"

static void check_layout(const ModelConfig& config, const std::string& name) {
    for (int N = 1; N <= 8; N++) {
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
            ShardPlan plan(GPT2<float>::unit_offsets(layout), GPT2<float>::unit_sizes(layout), N, r);
            local = local && plan.local_total * N == layout.total;
            for (int u = 0; u < plan.num_units(); u++)
                for (size_t i = 0; i < plan.shard_size[u]; i++) owner[plan.global_begin(u) + i]++;
        }
        bool once = true;
        for (int c : owner) once = once && c == 1;
        check(padded, "sharding " + tag + ": units padded to a multiple of 8N", "");
        check(tiled, "sharding " + tag + ": units tile the layout", "");
        check(local && once, "sharding " + tag + ": every element owned by exactly one rank, total/N each", "");
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
        check(disjoint && covered == layout.count, "sharding " + tag + ": file order maps onto the layout", std::to_string(covered) + " parameters");
        // weight decay: the matrices and embeddings (wte, wpe, qkvw, attprojw, fcw, fcprojw), nothing else
        const DecayMask mask = layout.decay_mask();
        size_t decayed = 0;
        for (size_t i = 0; i < layout.total; i++) decayed += used[i] && mask.decays(i);
        const size_t C = config.channels, expected = (size_t)config.padded_vocab_size * C + (size_t)config.max_seq_len * C +
                                                      (size_t)config.num_layers * 12 * C * C;
        check(decayed == expected, "sharding " + tag + ": weight decay on exactly the 2-D tensors",
              std::to_string(decayed) + " of " + std::to_string(expected));
    }
}

// Writes the state files that `world` ranks at `stage` would write for full optimizer arrays (in their
// layout), reads them back for `new_world` ranks, and compares every real element (padding must read 0).
static void check_resharding(const ModelConfig& config, int world, int stage, int new_world, bool has_master) {
    const std::string dir = "build/test_work/sharding";
    make_directories(dir);
    const ParameterLayout old_layout(config, 8 * world), new_layout(config, 8 * new_world);
    std::mt19937 rng(world * 100 + stage * 10 + new_world);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<std::vector<float>> full(3, std::vector<float>(old_layout.total, 0.0f));
    for (auto& a : full)
        for (int u = 0; u < old_layout.num_units(); u++)
            for (size_t i = 0; i < old_layout.unit_real_size(u); i++) a[old_layout.unit_offset(u) + i] = uniform(rng);
    DataLoaderState data = {};
    data.epoch = 7;
    for (int r = 0; r < (stage >= 1 ? world : 1); r++) {
        ShardPlan plan(GPT2<float>::unit_offsets(old_layout), GPT2<float>::unit_sizes(old_layout), world, r);
        auto part = [&](const std::vector<float>& a) { return stage >= 1 ? local_slices(plan, a) : a; };
        const std::vector<float> master = has_master ? part(full[0]) : std::vector<float>();
        StateHeader h{3, 1, world, r, stage, has_master, 0, 1.0f, 0, (long long)part(full[1]).size()};
        write_state_file(state_path(dir, 3, r), h, master, part(full[1]), part(full[2]), data);
    }
    const SavedOptimizerState saved = read_optimizer_state(dir, 3, new_layout);
    bool same = saved.data_state.epoch == 7 && saved.master.empty() == !has_master;
    for (int a = has_master ? 0 : 1; a < 3; a++) {
        const std::vector<float>& got = a == 0 ? saved.master : a == 1 ? saved.m : saved.v;
        for (int u = 0; u < new_layout.num_units(); u++)
            for (size_t i = 0; i < new_layout.unit_size(u); i++) {
                const float expected = i < new_layout.unit_real_size(u) ? full[a][old_layout.unit_offset(u) + i] : 0.0f;
                same = same && got[new_layout.unit_offset(u) + i] == expected;
            }
    }
    check(same, "checkpoint written by " + std::to_string(world) + " ranks at stage " + std::to_string(stage) +
                    (has_master ? " (with master weights)" : "") + " reads back exactly on " + std::to_string(new_world) + " ranks", "");
}

int main() {
    ModelConfig d12;
    config_from_descriptor("d12", d12);
    check_layout(d12, "d12");
    ModelConfig toy;  // parameter count not divisible by any N > 1
    toy.num_layers = 3; toy.num_heads = 3; toy.channels = 72; toy.max_seq_len = 129; toy.vocab_size = 1001; toy.padded_vocab_size = 1024;
    check_layout(toy, "toy");
    ModelConfig small = toy;  // GPT-2 head size, padded on 3 ranks
    small.num_heads = 1; small.channels = 64;
    for (const auto& c : {std::make_tuple(1, 0, 2), std::make_tuple(2, 0, 4), std::make_tuple(2, 1, 4), std::make_tuple(4, 2, 2),
                          std::make_tuple(4, 3, 1), std::make_tuple(3, 3, 2), std::make_tuple(2, 3, 3), std::make_tuple(3, 1, 3)})
        for (bool has_master : {true, false})
            check_resharding(small, std::get<0>(c), std::get<1>(c), std::get<2>(c), has_master);
    return check_failures() == 0 ? 0 : 1;
}
