// The model families' shapes and parameter layouts (model/config.h), on the CPU: the presets' parameter counts
// against the published models', the checks of a shape, every tensor-parallel split and pipeline part mapping each
// element of the whole model exactly once, the file order covering the file, the layout masks (weight decay,
// tensor-parallel slices) including an untied LM head, and a Llama-family model file read back as written.
#include <cstdio>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>
#include "../model/config.h"
#include "../model/model_file.h"
#include "check.h"

static ModelConfig preset(const char* name) {
    ModelConfig c;
    if (!config_from_preset(name, c)) die(std::string("no preset ") + name);
    return c;
}

// A small Llama-family shape: 2 KV heads of 4 query heads, head size 64, an MLP of 384 units.
static ModelConfig small_llama(bool tied, bool qkv_bias) {
    ModelConfig c = preset("smollm2-135m");
    c.num_layers = 3;
    c.channels = 256;
    c.num_heads = 4;
    c.kv_heads = 2;
    c.ffn = 384;
    c.vocab_size = 1000;
    c.padded_vocab_size = pad_vocab(1000);
    c.max_seq_len = 64;
    c.tied_head = tied;
    c.qkv_bias = qkv_bias;
    return c;
}

// The published parameter counts (Hugging Face's num_parameters(); every preset's vocabulary is a multiple of 128,
// so the padded count is the same).
static void test_preset_counts() {
    const std::map<std::string, size_t> published = {
        {"llama3-1b", 1235814400},   {"llama3-3b", 3212749824},    {"llama3-8b", 8030261248},  {"smollm2-135m", 134515008},
        {"smollm2-360m", 361821120}, {"qwen2.5-0.5b", 494032768}, {"qwen2.5-7b", 7615616512},
    };
    for (const auto& p : published) {
        const ModelConfig c = preset(p.first.c_str());
        const std::string problem = config_problem(c);
        expect(problem.empty(), "preset " + p.first + " is a valid shape", problem);
        const size_t count = ParameterLayout(c).count;
        check(count == p.second, "preset " + p.first + " parameters", std::to_string(count) + " (published " + std::to_string(p.second) + ")");
    }
    ModelConfig none;
    check(!config_from_preset("llama3-2b", none) && !config_from_preset("d12", none), "unknown preset names are not presets", "");
    // GPT-2 124M keeps llm.c's count and file order
    ModelConfig d12;
    config_from_descriptor("d12", d12);
    check(ParameterLayout(d12).count == 124475904, "d12 parameters", std::to_string(ParameterLayout(d12).count) + " (llm.c: 124475904)");
}

static void test_shape_checks() {
    struct Case {
        const char* name;
        void (*change)(ModelConfig&);
        const char* expected;
    };
    const Case cases[] = {
        {"KV heads that do not divide the heads", [](ModelConfig& c) { c.kv_heads = 3; }, "key/value heads (3) must divide the 4 attention heads"},
        {"an MLP width not a multiple of 8", [](ModelConfig& c) { c.ffn = 100; }, "MLP hidden units (100) must be a positive multiple of 8"},
        {"a zero norm epsilon", [](ModelConfig& c) { c.norm_eps = 0; }, "epsilon must be in (0, 1)"},
        {"theta 1", [](ModelConfig& c) { c.rope_theta = 1; }, "theta must be above 1"},
        {"rope scaling below 1", [](ModelConfig& c) { c.rope_scaling.factor = 0.5f; }, "rope scaling needs factor >= 1"},
        {"a GPT-2 with fewer KV heads", [](ModelConfig& c) { c.family = ModelFamily::kGpt2; }, "a GPT-2 model has as many key/value heads"},
    };
    for (const Case& k : cases) {
        ModelConfig c = small_llama(true, false);
        k.change(c);
        const std::string problem = config_problem(c);
        expect(problem.find(k.expected) != std::string::npos, "shape refused: " + std::string(k.name), "got '" + problem + "'");
    }
    check(config_problem(small_llama(false, true)).empty(), "the small Llama shape is valid", config_problem(small_llama(false, true)));
    // tensor parallelism splits query and key/value heads: 2 KV heads split into 2, not into 4
    const ModelConfig c = small_llama(true, false);
    check(tensor_parallel_problem(c, 2).empty(), "tp 2 splits 4 heads and 2 KV heads", tensor_parallel_problem(c, 2));
    const std::string kv4 = tensor_parallel_problem(c, 4);
    expect(kv4.find("the 2 key/value heads do not split into 4") != std::string::npos, "tp 4 refused for 2 KV heads", kv4);
    ModelConfig odd_ffn = c;
    odd_ffn.ffn = 392;  // 392 / 2 = 196: not a multiple of 8
    const std::string f2 = tensor_parallel_problem(odd_ffn, 2);
    expect(f2.find("hidden units do not split into 2") != std::string::npos, "tp 2 refused for 392 MLP units", f2);
}

// Every element of the whole model is mapped by exactly one run of each rank's part (replicated tensors by every
// tensor-parallel rank, split ones by exactly one), and each local element of each part exactly once.
static void test_splits_cover(const ModelConfig& c, const std::string& name) {
    const ParameterLayout whole(c);
    for (int tp : {1, 2}) {
        for (int pp : {1, 2, 3}) {
            if (!tensor_parallel_problem(c, tp).empty()) continue;
            std::vector<int> per_stage(pp, c.num_layers / pp);
            per_stage.back() += c.num_layers % pp;
            std::vector<int> seen(whole.total, 0);  // per element: how many (stage, rank) parts hold it
            bool local_ok = true;
            for (int s = 0; s < pp; s++) {
                std::vector<int> chunks;
                const StageModel stage = pipeline_stage_model(per_stage, pp, s, &chunks);
                for (int r = 0; r < tp; r++) {
                    const ParameterLayout part(c, 8, tp, stage);
                    std::vector<int> local(part.total, 0);
                    part.for_each_full_run(whole, r, [&](size_t full, size_t l, size_t n) {
                        for (size_t i = 0; i < n; i++) {
                            seen[full + i]++;
                            local[l + i]++;
                        }
                    });
                    size_t covered = 0;
                    for (int v : local) {
                        covered += v == 1;
                        if (v > 1) local_ok = false;
                    }
                    if (covered != part.count) local_ok = false;
                }
            }
            // what each whole-model element should see: split tensors once, replicated ones tp times; the tied wte
            // under pipeline parallelism once more (the last stage's copy)
            const LayoutMask split = whole.split_mask();
            bool whole_ok = true;
            size_t elements = 0;
            whole.for_each_file_run([&](size_t, size_t offset, size_t n) {
                for (size_t i = offset; i < offset + n; i++) {
                    int want = split.contains((long)i) ? 1 : tp;
                    if (c.tied_head && pp > 1 && i >= whole.wte && i < whole.wte_end()) want *= 2;
                    if (seen[i] != want) whole_ok = false;
                    elements++;
                }
            });
            check(whole_ok && local_ok && elements == whole.count,
                  name + " tp " + std::to_string(tp) + " pp " + std::to_string(pp) + ": every element mapped as often as it is held",
                  local_ok ? (whole_ok ? "" : "whole-model counts wrong") : "a part's local elements not covered exactly once");
        }
    }
}

// The file order is a contiguous cover of [0, count) and of the layout's real elements.
static void test_file_order(const ModelConfig& c, const std::string& name) {
    const ParameterLayout whole(c);
    size_t next = 0;
    bool contiguous = true;
    std::vector<int> seen(whole.total, 0);
    whole.for_each_file_run([&](size_t file_offset, size_t offset, size_t n) {
        if (file_offset != next) contiguous = false;
        next = file_offset + n;
        for (size_t i = offset; i < offset + n; i++) seen[i]++;
    });
    size_t once = 0;
    for (int v : seen) once += v == 1;
    check(contiguous && next == whole.count && once == whole.count, name + " file order covers the model once",
          std::to_string(next) + " file elements, " + std::to_string(once) + " of " + std::to_string(whole.count) + " held once");
}

// The masks: contains() against the tensors they name, and same_until() never jumping past a change of contains().
static void test_masks(const ModelConfig& c, const std::string& name) {
    for (int tp : {1, 2}) {
        const ParameterLayout l(c, 8, tp);
        const LayoutMask decay = l.decay_mask(), split = l.split_mask();
        std::vector<char> want_decay(l.total, 0), want_split(l.total, 0);
        const size_t matrix = (size_t)l.vocab_rows() * c.channels;
        for (size_t i = 0; i < matrix; i++) want_decay[l.wte + i] = want_split[l.wte + i] = 1;
        if (c.has_wpe())
            for (size_t i = 0; i < (size_t)c.max_seq_len * c.channels; i++) want_decay[l.wpe + i] = 1;
        if (!c.tied_head)
            for (size_t i = 0; i < matrix; i++) want_decay[l.lm_head + i] = want_split[l.lm_head + i] = 1;
        for (int b = 0; b < l.num_blocks(); b++) {
            for (BlockTensor t : {QKVW, ATTPROJW, FCW, FCPROJW})
                for (size_t i = 0; i < l.block_tensor_size[t]; i++) want_decay[l.tensor(b, t) + i] = want_split[l.tensor(b, t) + i] = 1;
            for (BlockTensor t : {QKVB, FCB})
                for (size_t i = 0; i < l.block_tensor_size[t]; i++) want_split[l.tensor(b, t) + i] = 1;
        }
        bool decay_ok = true, split_ok = true, runs_ok = true;
        for (size_t i = 0; i < l.total; i++) {
            if (decay.contains((long)i) != (bool)want_decay[i]) decay_ok = false;
            if (split.contains((long)i) != (bool)want_split[i]) split_ok = false;
        }
        for (const LayoutMask* m : {&decay, &split}) {
            for (long i = 0; i < (long)l.total;) {
                const long until = std::min<long>(m->same_until(i), (long)l.total);
                if (until <= i) { runs_ok = false; break; }
                for (long j = i; j < until; j++)
                    if (m->contains(j) != m->contains(i)) runs_ok = false;
                i = until;
            }
            for (long i = 0; i + 8 <= (long)l.total; i += 5) {  // contains_bits agrees with contains
                const uint32_t bits = m->contains_bits<8>(i);
                for (int k = 0; k < 8; k++)
                    if (((bits >> k) & 1) != (uint32_t)m->contains(i + k)) runs_ok = false;
            }
        }
        const std::string tag = name + " tp " + std::to_string(tp);
        check(decay_ok, tag + " decay mask: the embeddings, the LM head and the blocks' matrices", "");
        check(split_ok, tag + " split mask: wte, the LM head and the split block tensors", "");
        check(runs_ok, tag + " masks' runs and bits agree with contains()", "");
    }
}

// A Llama-family model file (untied head, q/k/v biases) written and read back: the shape from its header, every value.
static void test_model_file_round_trip() {
    char dir_template[] = "/tmp/test_layout_XXXXXX";
    const std::string dir = mkdtemp(dir_template);
    for (bool bf16 : {false, true}) {
        ModelConfig c = small_llama(false, true);
        c.rope_scaling.factor = 8;
        c.rope_theta = 500000;
        c.norm_eps = 1e-6f;
        const ParameterLayout l(c);
        std::vector<float> values(l.total, 0.0f);
        l.for_each_file_run([&](size_t file_offset, size_t offset, size_t n) {
            for (size_t i = 0; i < n; i++) values[offset + i] = bf16_bits_to_float(float_to_bf16_bits(0.001f * (float)((file_offset + i) % 4099)));
        });
        const std::string path = dir + (bf16 ? "/llama_bf16.bin" : "/llama_fp32.bin");
        write_model_file(path, l, values, bf16);
        std::vector<float> read;
        const ModelConfig back = read_model_file(path, read);
        const std::string difference = config_difference(back, c);
        check(difference.empty(), std::string("Llama model file's header read back (") + (bf16 ? "bf16" : "fp32") + ")", difference);
        check(read == values, std::string("Llama model file's values read back (") + (bf16 ? "bf16" : "fp32") + ")", "");
        ModelConfig other = c;
        other.kv_heads = 4;
        const std::string d = config_difference(back, other);
        expect(d == "key/value heads is 2, this run's 4 (--model, --kv-heads)", "a shape difference named", "got '" + d + "'");
        unlink(path.c_str());
    }
    rmdir(dir.c_str());
}

int main() {
    check_suite("layout");
    test_preset_counts();
    test_shape_checks();
    ModelConfig d6;
    config_from_descriptor("d6", d6);
    d6.num_layers = 3;
    for (const auto& named : std::vector<std::pair<std::string, ModelConfig>>{{"gpt2 d6x3", d6},
                                                                              {"llama tied", small_llama(true, false)},
                                                                              {"llama untied qkv-bias", small_llama(false, true)}}) {
        test_splits_cover(named.second, named.first);
        test_file_order(named.second, named.first);
        test_masks(named.second, named.first);
    }
    test_model_file_round_trip();
    return check_failures() == 0 ? 0 : 1;
}
