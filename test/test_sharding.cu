// Sharding plans, without a GPU: the padded parameter layout for N data-parallel ranks and each rank's
// ZeRO slices. For several models (GPT-2 124M, an uneven toy model) and N = 1..8: every unit is padded to
// a multiple of 8N; the slices of all ranks tile every unit exactly once; each rank stores total/N elements;
// the llm.c file order maps onto the layout without overlaps and covers exactly the model's parameters;
// weight decay covers exactly the matrices and embeddings.
#define TESTING
#include "../train_gpt.cu"
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

int main() {
    ModelConfig d12;
    config_from_descriptor("d12", d12);
    check_layout(d12, "d12");
    ModelConfig toy;  // parameter count not divisible by any N > 1
    toy.num_layers = 3; toy.num_heads = 3; toy.channels = 72; toy.max_seq_len = 129; toy.vocab_size = 1001; toy.padded_vocab_size = 1024;
    check_layout(toy, "toy");
    return check_failures() == 0 ? 0 : 1;
}
