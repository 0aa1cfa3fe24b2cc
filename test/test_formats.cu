// File formats and schedules, without a GPU: the learning-rate schedule against the formulas of
// docs/formats.md and against the PyTorch reference's own (scripts/reference/gpt2_reference.py lr_at) when a Python is
// at hand; llm.c model files round-trip (fp32 exactly, bf16 rounded to nearest even) through the padded
// layouts of 1 and 3 ranks, and each tensor- and pipeline-parallel rank's part reads alone. (Checkpoints as committed
// units are test_checkpoints.cpp's.)
#define TESTING
#include "../train_gpt.cu"
#include "check.h"

static void test_schedule() {
    const float M = 6e-4f, f = 0.1f, F = M * f;
    const int W = 10, N = 110;
    bool ok = true;
    for (int s = 0; s < W; s++) ok = ok && fabsf(learning_rate(s, N, M, W, f, "cosine") - M * (s + 1) / W) <= 1e-12f;
    check(ok, "schedule: linear warm-up reaches the maximum at step W-1", "");
    check(fabsf(learning_rate(W, N, M, W, f, "cosine") - M) <= 1e-10f && fabsf(learning_rate(N, N, M, W, f, "cosine") - F) <= 1e-10f,
          "schedule: cosine from the maximum to the final fraction", "");
    check(fabsf(learning_rate(W + 50, N, M, W, f, "cosine") - (F + 0.5f * (M - F))) <= 1e-9f, "schedule: cosine midpoint", "");
    check(fabsf(learning_rate(W + 25, N, M, W, f, "linear") - (M - (M - F) * 0.25f)) <= 1e-9f, "schedule: linear decay", "");
    check(learning_rate(W + 25, N, M, W, f, "constant") == M, "schedule: constant after warm-up", "");
    // the reference's implementation, for every step of a run (Debian's Python has torch, or the one on PATH)
    std::vector<double> ref;
    for (const char* python : {"/usr/bin/python3", "python3"}) {
        const std::string command = std::string(python) + " -c \"import sys; sys.path.insert(0, 'scripts/reference'); import gpt2_reference as r; "
                                    "print(' '.join(repr(r.lr_at(s, 6e-4, 10, 110, 'cosine', 0.1)) for s in range(110)))\" 2> /dev/null";
        FILE* p = popen(command.c_str(), "r");
        ref.clear();
        double x;
        while (p && fscanf(p, "%lf", &x) == 1) ref.push_back(x);
        if (p) pclose(p);
        if (ref.size() == 110) break;
    }
    if (ref.size() != 110) {
        skip("schedule: same as the PyTorch reference's", "no Python with torch to import scripts/reference/gpt2_reference.py");
        return;
    }
    double worst = 0.0;
    for (int s = 0; s < 110; s++) worst = std::max(worst, fabs(learning_rate(s, N, M, W, f, "cosine") - ref[s]) / M);
    check(worst <= 1e-6, "schedule: same as the PyTorch reference's at every step", fmt("max relative difference %.3g", worst));
}

// A test parameter value from a running hash state: 24 random bits, scaled to within +-0.84.
static float test_value(uint64_t& state) { return (float)((int64_t)(splitmix64(state++) >> 40) - (1 << 23)) * 1e-7f; }

static void test_model_files() {
    const std::string dir = "build/test_work/formats";
    make_directories(dir);
    ModelConfig config;
    config.num_layers = 3; config.num_heads = 1; config.channels = 64; config.max_seq_len = 40;
    for (int world : {1, 3}) {
        const ParameterLayout layout(config, 8 * world);
        std::vector<float> values(layout.total, 0.0f);
        uint64_t state = 5;
        layout.for_each_file_run([&](size_t, size_t device_offset, size_t count) {
            for (size_t i = 0; i < count; i++) values[device_offset + i] = test_value(state);
        });
        for (bool bf16 : {false, true}) {
            const std::string path = dir + "/model.bin", tag = std::string(bf16 ? "bf16" : "fp32") + " on " + std::to_string(world) + " rank(s)";
            write_model_file(path, layout, values, bf16);
            std::vector<float> back;
            const ModelConfig read = read_model_file(path, back, 8 * world);
            bool same = read.num_layers == config.num_layers && read.channels == config.channels && back.size() == values.size();
            for (size_t i = 0; same && i < values.size(); i++)
                same = back[i] == (bf16 ? bf16_bits_to_float(float_to_bf16_bits(values[i])) : values[i]);
            check(same, "model file round trip, " + tag, "");
            struct stat st;
            stat(path.c_str(), &st);
            check((size_t)st.st_size == 1024 + layout.count * (bf16 ? 2 : 4), "model file size is llm.c's, " + tag,
                  std::to_string(st.st_size) + " bytes");
        }
    }
    // a rank's part read alone (read_model_part): each tensor-parallel rank's slices of each pipeline stage,
    // in its own padding, equal to the whole model's values at those places
    ModelConfig split = config;  // 4 heads of 64: splits over 1, 2 and 4 tensor-parallel ranks
    split.num_layers = 4; split.num_heads = 4; split.channels = 256;
    const ParameterLayout whole(split);
    std::vector<float> values(whole.total, 0.0f);
    uint64_t state = 9;
    whole.for_each_file_run([&](size_t, size_t device_offset, size_t count) {
        for (size_t i = 0; i < count; i++) values[device_offset + i] = test_value(state);
    });
    for (bool bf16 : {false, true}) {
        const std::string path = dir + "/split.bin";
        write_model_file(path, whole, values, bf16);
        int parts = 0;
        bool same = true;
        for (int tp : {1, 2, 4})
            for (int pp : {1, 2, 4}) {
                std::vector<int> per_virtual_stage;
                if (!pipeline_layer_split(split.num_layers, pp, 1, "", &per_virtual_stage).empty()) die("internal: the test's split");
                for (int stage = 0; stage < pp; stage++) {
                    std::vector<int> chunks;
                    const ParameterLayout part(split, 8 * 3, tp, pipeline_stage_model(per_virtual_stage, pp, stage, &chunks));
                    for (int r = 0; r < tp; r++) {
                        std::vector<float> expected(part.total, 0.0f);
                        part.for_each_full_run(whole, r, [&](size_t from, size_t to, size_t n) {
                            for (size_t i = 0; i < n; i++)
                                expected[to + i] = bf16 ? bf16_bits_to_float(float_to_bf16_bits(values[from + i])) : values[from + i];
                        });
                        same = same && read_model_part(path, part, r) == expected;
                        parts++;
                    }
                }
            }
        check(same, std::string("model file, each rank's part read alone (") + (bf16 ? "bf16" : "fp32") + ")",
              std::to_string(parts) + " parts: tp 1, 2, 4 x pp 1, 2, 4");
    }
    // round to nearest even: 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7 and goes to 1
    check(bf16_bits_to_float(float_to_bf16_bits(1.0f + 1.0f / 256)) == 1.0f &&
          bf16_bits_to_float(float_to_bf16_bits(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256, "bf16 conversion rounds to nearest even", "");
}

// The end-of-run checksums fed a unit at a time equal the one-pass definition (chunks of 2^20 hashed alone, their
// hashes chained) for any cut into units, and each moves when an element it covers changes.
static void test_parameter_checksums() {
    ModelConfig config;
    config.num_layers = 3; config.num_heads = 2; config.channels = 128; config.max_seq_len = 64;
    const ParameterLayout layout(config, 8, 2);  // tensor parallel: the split mask covers the vocabulary rows and the split block tensors
    const LayoutMask split = layout.split_mask();
    std::vector<float> values(layout.total);
    uint64_t state = 7;
    for (float& v : values) v = test_value(state);
    auto one_pass = [&](const std::vector<float>& p, uint64_t* all, uint64_t* replicated, uint64_t* wte) {
        *all = *replicated = *wte = 0;
        const size_t chunk = ParameterChecksums::kChunk;
        for (size_t c = 0; c < (p.size() + chunk - 1) / chunk; c++) {
            uint64_t h = 0, r = 0;
            for (size_t i = c * chunk; i < std::min(p.size(), (c + 1) * chunk); i++) {
                uint32_t bits;
                memcpy(&bits, &p[i], 4);
                h = splitmix64(h ^ bits);
                if (!split.contains((long)i)) r = splitmix64(r ^ bits);
                if (i >= layout.wte && i < layout.wte_end()) *wte = splitmix64(*wte ^ bits);
            }
            *all = splitmix64(*all ^ h);
            *replicated = splitmix64(*replicated ^ r);
        }
    };
    auto streamed = [&](const std::vector<float>& p, const std::vector<size_t>& cuts) {  // cuts: the units' ends
        ParameterChecksums sums(split, layout.wte, layout.wte_end());
        size_t begin = 0;
        for (size_t end : cuts) {
            sums.feed(begin, p.data() + begin, end - begin);
            begin = end;
        }
        sums.finish();
        return sums;
    };
    uint64_t all, replicated, wte;
    one_pass(values, &all, &replicated, &wte);
    const size_t n = values.size(), chunk = ParameterChecksums::kChunk;
    std::vector<size_t> units;
    for (int u = 0; u < layout.num_units(); u++) units.push_back(layout.unit_offset(u) + layout.unit_size(u));
    const std::vector<std::vector<size_t>> cuts = {{n}, units, {7, chunk, chunk + 1, 3 * chunk + 5, n}, {chunk - 1, 2 * chunk, n}};
    bool same = true;
    for (const std::vector<size_t>& c : cuts) {
        const ParameterChecksums s = streamed(values, c);
        same = same && s.all == all && s.replicated == replicated && s.wte == wte;
    }
    check(n > 3 * chunk + 5 && same, "parameter checksums: fed a unit at a time, any cut (4 cuts, " + std::to_string(n) + " elements) equals one pass", "");
    const ParameterChecksums base = streamed(values, units);
    auto changed = [&](size_t i) {
        std::vector<float> p = values;
        p[i] = nextafterf(p[i], 1.0f);
        return streamed(p, units);
    };
    const size_t in_wte = layout.wte + 12345, in_qkvw = layout.tensor(1, QKVW) + 77, in_ln = layout.tensor(2, LN1W) + 3;
    const ParameterChecksums a = changed(in_wte), b = changed(in_qkvw), c = changed(in_ln);
    check(split.contains((long)in_wte) && split.contains((long)in_qkvw) && !split.contains((long)in_ln) && a.all != base.all &&
              a.replicated == base.replicated && a.wte != base.wte && b.all != base.all && b.replicated == base.replicated && b.wte == base.wte &&
              c.all != base.all && c.replicated != base.replicated && c.wte == base.wte,
          "parameter checksums: one element changed moves the checksums that cover it (all; replicated: not the split ones; wte: its range)", "");
}

int main() {
    check_suite("formats");
    test_schedule();
    test_model_files();
    test_parameter_checksums();
    return check_failures() == 0 ? 0 : 1;
}
