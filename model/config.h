// The model's configuration and the block-major layout of its parameters: the shapes (ModelConfig, from a
// "dN" descriptor or a model file's header) and their checks, and where every parameter lives in the flat
// device buffer, also under tensor and pipeline parallelism (ParameterLayout; StageModel: one stage's part).
// defines: ModelConfig, UnitKind, kMaxLayers/kMaxChannels/kMaxSeqLen/kMaxVocab, pad_vocab, config_from_descriptor, config_problem,
//          tensor_parallel_problem, BlockTensor, block_tensor_name, StageModel, pipeline_stage_model, ParameterLayout,
//          LayoutRun, sort_by_full, sorted_full_runs, for_each_shared_run
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>
#include "../kernels/die.h"          // die
#include "../kernels/host_device.h"  // LayoutMask, RopeScaling (plain C++: model files, state files and the flags compile without CUDA)

// ---------------------------------------------------------------------------------------------
// Configuration

// The two families share one block: attention then an MLP, each after a norm, each added to the residual stream.
// What differs is chosen here and nowhere else: GPT-2 has LayerNorms with biases, learned positions (wpe), biases on
// every product, a GELU MLP of 4C units and a head tied to wte; Llama (Llama 3, Qwen 2.5, SmolLM2, Mistral) has
// RMSNorms, rotary positions, grouped-query attention (kv_heads <= heads), a SwiGLU MLP (gate and up products of
// `ffn` units each, one [gate | up] product), no biases (Qwen 2.5: on q, k, v) and a head tied or its own.
enum class ModelFamily { kGpt2, kLlama };

struct ModelConfig {
    ModelFamily family = ModelFamily::kGpt2;
    int max_seq_len = 1024;  // GPT-2: wpe's rows; Llama: the longest sequence the model is meant for
    int vocab_size = 50257;
    int padded_vocab_size = 50304;
    int num_layers = 12;
    int num_heads = 12;
    int channels = 768;
    int kv_heads = 0;            // key/value heads, each shared by num_heads / kv_heads query heads; 0: num_heads
    int ffn = 0;                 // the MLP's hidden units; 0: 4 x channels (GPT-2's)
    bool qkv_bias = true;        // biases on q, k, v (GPT-2, Qwen 2.5)
    bool tied_head = true;       // the LM head is wte (else a tensor of its own)
    float norm_eps = 1e-5f;
    float rope_theta = 10000.0f;  // Llama only
    RopeScaling rope_scaling;

    bool llama() const { return family == ModelFamily::kLlama; }
    int key_value_heads() const { return kv_heads > 0 ? kv_heads : num_heads; }
    int hidden_units() const { return ffn > 0 ? ffn : 4 * channels; }
    int head_size() const { return channels / num_heads; }
    int kv_channels() const { return key_value_heads() * head_size(); }
    int qkv_channels() const { return channels + 2 * kv_channels(); }  // q, k, v rows of the qkv product
    int mlp_inputs() const { return llama() ? 2 : 1; }                  // products that feed the MLP's units: gate and up, or fc
    bool has_wpe() const { return !llama(); }
    bool has_biases() const { return !llama(); }  // the norms', the projections' and the MLP's biases
};
// One tensor-parallel rank's widths (columns per token) of the attention's and the MLP's inner activations: the qkv
// product's output (its heads' q, k and v), the MLP's input products' (fc; or gate and up) and its hidden units.
inline size_t qkv_width(const ModelConfig& c, int tp) { return (size_t)c.qkv_channels() / tp; }
inline size_t fc_width(const ModelConfig& c, int tp) { return (size_t)c.mlp_inputs() * (c.hidden_units() / tp); }
inline size_t hidden_width(const ModelConfig& c, int tp) { return (size_t)c.hidden_units() / tp; }
inline const char* family_name(ModelFamily f) { return f == ModelFamily::kLlama ? "llama" : "gpt2"; }

inline int pad_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

// The shape as the logs print it: "12 layers, 12 heads, 768 channels, max T 1024, vocab 50257 (padded 50304)", and for
// the Llama family what else it chooses (key/value heads, hidden units, biases, head, norm epsilon, rotary base).
inline std::string config_text(const ModelConfig& c) {
    char text[512];
    if (!c.llama()) {
        snprintf(text, sizeof(text), "%d layers, %d heads, %d channels, max T %d, vocab %d (padded %d)", c.num_layers, c.num_heads, c.channels,
                 c.max_seq_len, c.vocab_size, c.padded_vocab_size);
        return text;
    }
    char scaling[96] = "";
    if (c.rope_scaling.factor != 0.0f)
        snprintf(scaling, sizeof(scaling), ", scaling %g/%g/%g/%d", c.rope_scaling.factor, c.rope_scaling.low_freq_factor,
                 c.rope_scaling.high_freq_factor, c.rope_scaling.original_max_positions);
    snprintf(text, sizeof(text), "Llama family, %d layers, %d heads (%d key/value), %d channels, %d hidden units, max T %d, vocab %d (padded %d), "
             "%s head%s, RMSNorm eps %g, rope theta %g%s", c.num_layers, c.num_heads, c.key_value_heads(), c.channels, c.hidden_units(),
             c.max_seq_len, c.vocab_size, c.padded_vocab_size, c.tied_head ? "tied" : "untied", c.qkv_bias ? ", q/k/v biases" : "",
             c.norm_eps, c.rope_theta, scaling);
    return text;
}

// Shape limits: every size the code computes from them (parameters per tensor, L x 12 C^2 for the whole model,
// T x C, Vp x C, B x T x Vp logits) stays far inside size_t, and C, 4C, T and Vp inside the int arguments of the
// kernels and of cuBLASLt. GPT-2 1.5B is 48 x 1600 with T 1024 and Vp 50304.
constexpr int kMaxLayers = 1024, kMaxChannels = 16384, kMaxSeqLen = 1 << 20, kMaxVocab = 1 << 20;

// The Llama family's published shapes by name: Llama 3.2 1B and 3B, Llama 3.1 8B, SmolLM2 135M and 360M, Qwen 2.5
// 0.5B and 7B (their Hugging Face config.json files). Returns false for any other name.
inline bool config_from_preset(const std::string& name, ModelConfig& config) {
    struct Preset {
        const char* name;
        int layers, channels, heads, kv_heads, ffn, vocab, max_seq_len;
        float theta, eps, rope_factor;
        bool tied, qkv_bias;
    };
    static const Preset presets[] = {
        {"llama3-1b", 16, 2048, 32, 8, 8192, 128256, 131072, 500000.0f, 1e-5f, 32.0f, true, false},
        {"llama3-3b", 28, 3072, 24, 8, 8192, 128256, 131072, 500000.0f, 1e-5f, 32.0f, true, false},
        {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 131072, 500000.0f, 1e-5f, 8.0f, false, false},
        {"smollm2-135m", 30, 576, 9, 3, 1536, 49152, 8192, 100000.0f, 1e-5f, 0.0f, true, false},
        {"smollm2-360m", 32, 960, 15, 5, 2560, 49152, 8192, 100000.0f, 1e-5f, 0.0f, true, false},
        {"qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, 32768, 1000000.0f, 1e-6f, 0.0f, true, true},
        {"qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 131072, 1000000.0f, 1e-6f, 0.0f, false, true},
    };
    for (const Preset& p : presets) {
        if (name != p.name) continue;
        config = ModelConfig();
        config.family = ModelFamily::kLlama;
        config.num_layers = p.layers;
        config.channels = p.channels;
        config.num_heads = p.heads;
        config.kv_heads = p.kv_heads;
        config.ffn = p.ffn;
        config.vocab_size = p.vocab;
        config.padded_vocab_size = pad_vocab(p.vocab);
        config.max_seq_len = p.max_seq_len;
        config.rope_theta = p.theta;
        config.norm_eps = p.eps;
        config.rope_scaling.factor = p.rope_factor;  // Llama 3's: low 1, high 4, over 8192 positions (the defaults)
        config.tied_head = p.tied;
        config.qkv_bias = p.qkv_bias;
        return true;
    }
    return false;
}
// The Llama family at a GPT-2 shape (--model dN --arch llama): the same layers, width, heads, maximum sequence length
// and vocabulary, with Llama's defaults elsewhere: as many key/value heads as heads, 8C/3 hidden units rounded up to
// a multiple of 256 (Llama's rule), no biases, a tied head, RMSNorm epsilon 1e-5, rotary theta 10000, no scaling.
inline ModelConfig llama_of_shape(const ModelConfig& gpt2) {
    ModelConfig c = gpt2;
    c.family = ModelFamily::kLlama;
    c.kv_heads = 0;
    c.ffn = (8 * gpt2.channels / 3 + 255) / 256 * 256;
    c.qkv_bias = false;
    c.tied_head = true;
    c.norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.rope_scaling = RopeScaling();
    return c;
}
// --rope-scaling: "off", or FACTOR,LOW,HIGH,POSITIONS. False for anything else.
inline bool parse_rope_scaling(const std::string& text, RopeScaling* scaling) {
    if (text == "off") {
        *scaling = RopeScaling();
        return true;
    }
    RopeScaling r;
    char end = 0;
    if (sscanf(text.c_str(), "%f,%f,%f,%d%c", &r.factor, &r.low_freq_factor, &r.high_freq_factor, &r.original_max_positions, &end) != 4)
        return false;
    *scaling = r;
    return true;
}
constexpr const char* kPresetNames = "llama3-1b, llama3-3b, llama3-8b, smollm2-135m, smollm2-360m, qwen2.5-0.5b, qwen2.5-7b";

// "dN": GPT-2's published shapes for 12/24/36/48 layers (and llm.c's d6, d60); any other depth N gets
// C = 64 N and N heads (the aspect ratio and head size of GPT-2 124M). Returns false when `descriptor` is not of
// the form dN (a model file, then); a dN whose N is not in 1..kMaxLayers sets *problem (and leaves `config`).
inline bool config_from_descriptor(const std::string& descriptor, ModelConfig& config, std::string* problem = nullptr) {
    if (descriptor.size() < 2 || descriptor[0] != 'd') return false;
    long depth = 0;  // digit by digit, stopping above the limit: no overflow however long the number
    for (size_t i = 1; i < descriptor.size(); i++) {
        if (!isdigit((unsigned char)descriptor[i])) return false;
        if (depth <= kMaxLayers) depth = depth * 10 + (descriptor[i] - '0');
    }
    if (depth < 1 || depth > kMaxLayers) {
        if (problem == nullptr) return false;
        *problem = "dN takes N (the number of layers) in 1.." + std::to_string(kMaxLayers);
        return true;
    }
    const int known[][3] = {{6, 384, 6},    {12, 768, 12},  {24, 1024, 16}, {36, 1280, 20},
                            {48, 1600, 25}, {60, 1920, 30}};
    config = ModelConfig();
    config.num_layers = (int)depth;
    config.channels = 64 * (int)depth;  // above kMaxChannels for N > 256: config_problem says so (unless --channels overrides it)
    config.num_heads = (int)depth;
    for (auto& k : known)
        if (k[0] == depth) { config.channels = k[1]; config.num_heads = k[2]; }
    return true;
}

// Returns an empty string when the configuration is usable, else why not.
inline std::string config_problem(const ModelConfig& c) {
    char buf[256];
    if (c.num_layers <= 0 || c.num_heads <= 0 || c.channels <= 0 || c.max_seq_len <= 0 || c.vocab_size <= 0)
        return "layers, heads, channels, max sequence length and vocabulary must be positive";
    const struct { const char* name; int value, limit; } limits[] = {
        {"layers", c.num_layers, kMaxLayers}, {"channels", c.channels, kMaxChannels},
        {"max sequence length", c.max_seq_len, kMaxSeqLen}, {"padded vocabulary", c.padded_vocab_size, kMaxVocab}};
    for (const auto& l : limits)
        if (l.value > l.limit) {
            snprintf(buf, sizeof(buf), "%s (%d) must be at most %d", l.name, l.value, l.limit);
            return buf;
        }
    if (c.channels % c.num_heads != 0) {
        snprintf(buf, sizeof(buf), "channels (%d) must be divisible by heads (%d)", c.channels, c.num_heads);
        return buf;
    }
    if (c.channels / c.num_heads != 64 && c.channels / c.num_heads != 128) {
        snprintf(buf, sizeof(buf), "head size channels/heads = %d/%d must be 64 (all GPT-2 sizes) or 128 (the flash attention kernels)",
                 c.channels, c.num_heads);
        return buf;
    }
    if (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size % 128 != 0) {
        snprintf(buf, sizeof(buf), "padded vocabulary (%d) must be >= vocabulary (%d) and a multiple of 128",
                 c.padded_vocab_size, c.vocab_size);
        return buf;
    }
    const int kv = c.key_value_heads(), F = c.hidden_units();
    if (kv <= 0 || c.num_heads % kv != 0) {
        snprintf(buf, sizeof(buf), "key/value heads (%d) must divide the %d attention heads", kv, c.num_heads);
        return buf;
    }
    if (F <= 0 || F % 8 != 0 || F > 4 * kMaxChannels) {
        snprintf(buf, sizeof(buf), "MLP hidden units (%d) must be a positive multiple of 8, at most %d", F, 4 * kMaxChannels);
        return buf;
    }
    if (!c.llama()) {
        if (kv != c.num_heads || F != 4 * c.channels || !c.qkv_bias || !c.tied_head)
            return "a GPT-2 model has as many key/value heads as heads, 4 x channels MLP units, biases and a tied head";
        return "";
    }
    if (!(c.norm_eps > 0.0f && c.norm_eps < 1.0f)) return "the RMSNorm's epsilon must be in (0, 1)";
    if (!(c.rope_theta > 1.0f)) return "the rotary base theta must be above 1";
    const RopeScaling& r = c.rope_scaling;
    if (r.factor != 0.0f && !(r.factor >= 1.0f && r.low_freq_factor > 0.0f && r.high_freq_factor > r.low_freq_factor && r.original_max_positions > 0))
        return "Llama 3's rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and original positions > 0";
    return "";
}

// The first field in which `saved` (a file's) differs from `run` (this run's) as "<what> is <saved>, this run's <run>
// (<flags>)"; empty when they are the same model.
inline std::string config_difference(const ModelConfig& saved, const ModelConfig& run) {
    auto text = [](float x) {
        char buf[32];
        snprintf(buf, sizeof(buf), "%g", x);
        return std::string(buf);
    };
    struct Field {
        const char* what;
        std::string saved, run;
        const char* flags;
    };
    const std::string rope_saved = text(saved.rope_scaling.factor) + "/" + text(saved.rope_scaling.low_freq_factor) + "/" +
                                   text(saved.rope_scaling.high_freq_factor) + "/" + std::to_string(saved.rope_scaling.original_max_positions);
    const std::string rope_run = text(run.rope_scaling.factor) + "/" + text(run.rope_scaling.low_freq_factor) + "/" +
                                 text(run.rope_scaling.high_freq_factor) + "/" + std::to_string(run.rope_scaling.original_max_positions);
    const Field fields[] = {
        {"family", family_name(saved.family), family_name(run.family), "--model, --arch"},
        {"layers", std::to_string(saved.num_layers), std::to_string(run.num_layers), "--model, --layers"},
        {"heads", std::to_string(saved.num_heads), std::to_string(run.num_heads), "--model, --heads"},
        {"key/value heads", std::to_string(saved.key_value_heads()), std::to_string(run.key_value_heads()), "--model, --kv-heads"},
        {"channels", std::to_string(saved.channels), std::to_string(run.channels), "--model, --channels"},
        {"MLP hidden units", std::to_string(saved.hidden_units()), std::to_string(run.hidden_units()), "--model, --ffn"},
        {"maximum sequence length", std::to_string(saved.max_seq_len), std::to_string(run.max_seq_len), "--model, --max-seq-len"},
        {"vocabulary", std::to_string(saved.vocab_size), std::to_string(run.vocab_size), "--model, --vocab"},
        {"padded vocabulary", std::to_string(saved.padded_vocab_size), std::to_string(run.padded_vocab_size), "--model, --vocab"},
        {"q, k, v biases", saved.qkv_bias ? "on" : "off", run.qkv_bias ? "on" : "off", "--model, --qkv-bias"},
        {"head", saved.tied_head ? "tied" : "untied", run.tied_head ? "tied" : "untied", "--model, --tied-head"},
        {"norm epsilon", text(saved.norm_eps), text(run.norm_eps), "--model, --norm-eps"},
        {"rotary theta", text(saved.rope_theta), text(run.rope_theta), "--model, --rope-theta"},
        {"rope scaling (factor/low/high/positions)", rope_saved, rope_run, "--model, --rope-scaling"},
    };
    for (const Field& f : fields)
        if (f.saved != f.run) return std::string(f.what) + " is " + f.saved + ", this run's " + f.run + " (" + f.flags + ")";
    return "";
}

// Returns an empty string when tensor parallelism of degree tp can split the model, else why not (the flag and
// the values): whole heads per rank, and equal vocabulary ranges whose rows keep 16-byte alignment.
inline std::string tensor_parallel_problem(const ModelConfig& c, int tp) {
    const std::string flag = "--tensor-parallel " + std::to_string(tp) + ": ";
    if (tp < 1) return flag + "must be at least 1";
    if (c.num_heads % tp != 0)
        return flag + "the " + std::to_string(c.num_heads) + " attention heads do not split into " + std::to_string(tp) + " equal groups";
    if (c.key_value_heads() % tp != 0)
        return flag + "the " + std::to_string(c.key_value_heads()) + " key/value heads do not split into " + std::to_string(tp) +
               " equal groups (a degree above the key/value heads would need them replicated, which tensor parallelism here does not do)";
    if (c.hidden_units() % (8 * tp) != 0)
        return flag + "the MLP's " + std::to_string(c.hidden_units()) + " hidden units do not split into " + std::to_string(tp) +
               " equal groups of a multiple of 8";
    if (c.padded_vocab_size % (8 * tp) != 0)
        return flag + "the padded vocabulary " + std::to_string(c.padded_vocab_size) + " does not split into " + std::to_string(tp) +
               " equal ranges of a multiple of 8 rows";
    return "";
}

// ---------------------------------------------------------------------------------------------
// What ZeRO stages 2-3 do with a unit's full copy, and what the step does with its gradient (distributed/zero.cuh).
//   kGathered:   a block; its full parameters (stage 3) and gradients (stages 2-3) go through rings of two buffers.
//   kPersistent: full buffers for the whole step (the embeddings and the final LayerNorm).
//   kTied:       persistent, and the gradient is summed over the embedding group after the data-parallel
//                reduction: the token embedding on the first pipeline stage, whose copy the last stage holds.
//   kTiedCopy:   the last stage's copy of it: summed the same way, and left out of the gradient norm (the
//                first stage counts it), so every element counts once.
enum class UnitKind { kGathered, kPersistent, kTied, kTiedCopy };

// Parameter layout. On the device the parameters are one flat buffer, block-major:
//   [wte (Vp,C)][wpe (T,C)][block 0][block 1]...[block L-1][lnfw (C)][lnfb (C)][lm_head (Vp,C)]
// (wpe and the biases: GPT-2 only; lm_head: an untied head only) with each block's 12 tensors contiguous (those a
// family lacks hold no elements), so that one layer can be gathered (ZeRO-3), owned by a
// pipeline stage, or split for tensor parallelism as one piece. Gradients, master weights and Adam
// moments use the same layout. The llm.c file order (tensor-major) is converted only at file I/O.
//
// Under tensor parallelism of degree tp (distributed/tensor_parallel.cuh) a rank's buffer has the same
// structure with its slices in place of the split tensors: wte (and lm_head) hold a contiguous range of Vp/tp
// vocabulary rows; qkvw/qkvb the q rows of NH/tp whole heads and the k and v rows of KV/tp whole key/value heads;
// fcw/fcb F/tp rows of each of the MLP's input products (fc; or gate, then up), column-parallel; attprojw and
// fcprojw C/tp and F/tp input columns (row-parallel). The LayerNorms, wpe and the row-parallel biases are
// replicated. Under pipeline parallelism (distributed/pipeline_parallel.cuh) a stage's buffer holds only its
// part of the model (StageModel): its blocks, the embeddings on the first stage, the final LayerNorm and a copy
// of the tied wte on the last. for_each_full_run maps a rank's buffer onto the whole model's (tp = 1, one
// stage) layout, and for_each_file_run the whole model's layout onto the file: together, the one mapping from
// model-file runs to what a rank owns, used by model files, initialisation and checkpoints.

enum BlockTensor { LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, kBlockTensors };
inline const char* block_tensor_name(int t) {
    static const char* names[] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                  "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
    return names[t];
}

// What one pipeline stage holds of the model: its blocks (global layer indices, ascending; under the
// interleaved schedule several runs of them), the embeddings (first stage), the final LayerNorm and the LM head
// (last stage). The LM head is the tied token embedding: the first and the last stage each hold a copy.
struct StageModel {
    std::vector<int> layers;
    bool first = true, last = true;
    bool tied_head = true;  // the model's (ParameterLayout sets it): whether the last stage's LM head is a copy of wte
    static StageModel whole(const ModelConfig& c) {
        StageModel m;
        for (int l = 0; l < c.num_layers; l++) m.layers.push_back(l);
        m.tied_head = c.tied_head;
        return m;
    }
    bool has_wte() const { return first || (last && tied_head); }
    bool tied_copy() const { return last && !first && tied_head; }  // the last stage's copy of wte (pipeline parallelism)
    bool has_lm_head() const { return last && !tied_head; }         // an untied LM head, a tensor of its own
};

// Pipeline stage s's part of the model, from the layers of each of the P x v virtual stages (virtual stage
// k = chunk x P + stage), and the blocks of each of its chunks.
inline StageModel pipeline_stage_model(const std::vector<int>& per_virtual_stage, int P, int s, std::vector<int>* chunk_blocks) {
    StageModel m;
    m.first = s == 0;
    m.last = s == P - 1;
    chunk_blocks->clear();
    int layer = 0;
    for (size_t k = 0; k < per_virtual_stage.size(); k++) {
        if ((int)k % P == s) {
            for (int i = 0; i < per_virtual_stage[k]; i++) m.layers.push_back(layer + i);
            chunk_blocks->push_back(per_virtual_stage[k]);
        }
        layer += per_virtual_stage[k];
    }
    return m;
}

struct ParameterLayout {
    ModelConfig config;
    int tp = 1;  // tensor-parallel degree: this layout holds one rank's slices
    StageModel part;
    size_t wte = 0, wpe = 0, blocks_begin = 0, block_size = 0, block_stride = 0, lnfw = 0, lnfb = 0, lm_head = 0, total = 0;
    size_t count = 0;  // parameters of this layout (one rank's); `total` adds the padding between units
    size_t block_offset[kBlockTensors] = {}, block_tensor_size[kBlockTensors] = {};
    // Units are what data parallelism shards and gathers one at a time: wte, wpe, each block, the final norm, the
    // untied LM head (those this stage holds, in that order). Each is padded to a multiple of `unit_multiple`
    // elements (8 x the data-parallel degree: equal 16-byte-aligned shards per rank).
    std::vector<size_t> unit_offsets, unit_sizes, unit_real_sizes;
    std::vector<UnitKind> unit_kinds;
    int wte_unit = -1, wpe_unit = -1, first_block_unit = -1, lnf_unit = -1, lm_head_unit = -1;

    explicit ParameterLayout(const ModelConfig& c = ModelConfig(), size_t unit_multiple = 8, int tensor_parallel = 1,
                             const StageModel& stage_model = StageModel())
        : config(c), tp(tensor_parallel), part(stage_model) {
        if (part.layers.empty() && part.first && part.last) part = StageModel::whole(c);  // the default: the whole model
        part.tied_head = c.tied_head;
        const size_t C = c.channels, Cs = C / tp, QKVs = (size_t)c.qkv_channels() / tp, Fs = (size_t)c.hidden_units() / tp;
        const size_t inputs = c.mlp_inputs(), bias = c.has_biases() ? 1 : 0;
        const size_t sizes[kBlockTensors] = {C,           bias * C,         QKVs * C, c.qkv_bias ? QKVs : 0, C * Cs, bias * C, C, bias * C,
                                             inputs * Fs * C, bias * inputs * Fs, C * Fs, bias * C};
        for (int t = 0; t < kBlockTensors; t++) {
            block_offset[t] = block_size;
            block_tensor_size[t] = sizes[t];
            block_size += sizes[t];
        }
        auto pad = [&](size_t n) { return (n + unit_multiple - 1) / unit_multiple * unit_multiple; };
        auto add_unit = [&](size_t real, UnitKind kind) {
            unit_offsets.push_back(total);
            unit_sizes.push_back(pad(real));
            unit_real_sizes.push_back(real);
            unit_kinds.push_back(kind);
            total += pad(real);
            count += real;
            return (int)unit_offsets.size() - 1;
        };
        if (part.has_wte()) {
            wte = total;
            // tied between stages only when the first and the last are two (an untied head: the first's alone)
            wte_unit = add_unit((size_t)vocab_rows() * C, part.first && (part.last || !c.tied_head) ? UnitKind::kPersistent
                                                          : part.first                              ? UnitKind::kTied
                                                                                                    : UnitKind::kTiedCopy);
        }
        if (part.first && c.has_wpe()) {
            wpe = total;
            wpe_unit = add_unit((size_t)c.max_seq_len * C, UnitKind::kPersistent);
        }
        blocks_begin = total;
        block_stride = pad(block_size);
        first_block_unit = (int)unit_offsets.size();
        for (size_t i = 0; i < part.layers.size(); i++) add_unit(block_size, UnitKind::kGathered);
        if (part.last) {
            lnfw = total;
            lnfb = lnfw + C;
            lnf_unit = add_unit((1 + bias) * C, UnitKind::kPersistent);
        }
        if (part.has_lm_head()) {
            lm_head = total;
            lm_head_unit = add_unit((size_t)vocab_rows() * C, UnitKind::kPersistent);
        }
    }
    int vocab_rows() const { return config.padded_vocab_size / tp; }  // rows of wte (and logits columns) per rank
    // This rank's share of the attention's heads and the MLP's units (distributed/tensor_parallel.cuh); with tp = 1 all
    // of them: its query and key/value heads, hidden units, q, k and v columns and fc (or gate and up) columns.
    int heads() const { return config.num_heads / tp; }
    int kv_heads() const { return config.key_value_heads() / tp; }
    int hidden() const { return (int)hidden_width(config, tp); }
    int qkv_columns() const { return (int)qkv_width(config, tp); }
    int fc_columns() const { return (int)fc_width(config, tp); }
    // The qkv bias's columns that its gradient sums from dqkv: all of them with rotary positions; GPT-2's query part
    // (Transformer::backward_chunk says why).
    int qkv_bias_columns() const { return config.llama() ? qkv_columns() : heads() * config.head_size(); }
    int num_blocks() const { return (int)part.layers.size(); }
    size_t tensor(int block, BlockTensor t) const { return blocks_begin + block * block_stride + block_offset[t]; }  // local block index
    size_t wte_end() const { return part.has_wte() ? wte + (size_t)vocab_rows() * config.channels : 0; }  // without padding
    int block_unit(int block) const { return first_block_unit + block; }
    int local_block(int layer) const {  // of a layer this part holds
        return (int)(std::lower_bound(part.layers.begin(), part.layers.end(), layer) - part.layers.begin());
    }

    int num_units() const { return (int)unit_offsets.size(); }
    size_t unit_offset(int u) const { return unit_offsets[u]; }
    size_t unit_real_size(int u) const { return unit_real_sizes[u]; }  // without the padding
    size_t unit_size(int u) const { return unit_sizes[u]; }            // padded

    // The file order (of the whole model: tp = 1, one stage; llm.c's for GPT-2): wte, wpe, the 12 block tensors
    // each spanning all layers, the final norm's weight and bias, the untied LM head (those the family has).
    // Calls visit(file_offset, device_offset, count) for every contiguous run.
    template <typename F> void for_each_file_run(F visit) const {
        if (tp != 1 || !part.first || !part.last) die("internal: for_each_file_run on a part of the model");
        size_t file_offset = 0;
        auto run = [&](size_t device_offset, size_t count) {
            if (count == 0) return;
            visit(file_offset, device_offset, count);
            file_offset += count;
        };
        run(wte, (size_t)vocab_rows() * config.channels);
        if (config.has_wpe()) run(wpe, (size_t)config.max_seq_len * config.channels);
        for (int t = 0; t < kBlockTensors; t++)
            for (int l = 0; l < config.num_layers; l++) run(tensor(l, (BlockTensor)t), block_tensor_size[t]);
        run(lnfw, config.channels);
        if (config.has_biases()) run(lnfb, config.channels);
        if (part.has_lm_head()) run(lm_head, (size_t)vocab_rows() * config.channels);
    }

    // Tensor-parallel rank `rank`'s slices of this stage's part in the layout `full` (tp = 1, any padding) of the
    // whole model or of a part that holds this one: calls visit(full_offset, local_offset, count) for every
    // contiguous run, in local order.
    template <typename F> void for_each_full_run(const ParameterLayout& full, int rank, F visit) const {
        const size_t C = config.channels, Cs = C / tp, T = config.max_seq_len, V = vocab_rows();
        const size_t KV = config.kv_channels(), KVs = KV / tp, F_ = config.hidden_units(), Fs = F_ / tp;
        // the q, k and v rows of this rank's heads: [offset in the whole tensor's rows, rows] of each, `width` wide
        const size_t qkv_rows[3][2] = {{rank * Cs, Cs}, {C + rank * KVs, KVs}, {C + KV + rank * KVs, KVs}};
        if (part.has_wte()) visit(full.wte + rank * V * C, wte, V * C);
        if (part.first && config.has_wpe()) visit(full.wpe, wpe, T * C);
        for (int i = 0; i < num_blocks(); i++) {
            const int l = full.local_block(part.layers[i]);
            auto at = [&](BlockTensor t, size_t full_offset, size_t local_offset, size_t n) {
                if (n > 0) visit(full.tensor(l, t) + full_offset, tensor(i, t) + local_offset, n);
            };
            for (int t = 0; t < kBlockTensors; t++) {
                const BlockTensor b = (BlockTensor)t;
                if (block_tensor_size[t] == 0) continue;
                switch (b) {
                    case QKVW:  // q, k and v rows of this rank's heads
                    case QKVB: {
                        const size_t width = b == QKVW ? C : 1;
                        size_t local = 0;
                        for (const auto& r : qkv_rows) {
                            at(b, r[0] * width, local, r[1] * width);
                            local += r[1] * width;
                        }
                        break;
                    }
                    case FCW:  // this rank's rows of each input product (fc; gate, then up)
                    case FCB: {
                        const size_t width = b == FCW ? C : 1;
                        for (size_t p = 0; p < (size_t)config.mlp_inputs(); p++) at(b, (p * F_ + rank * Fs) * width, p * Fs * width, Fs * width);
                        break;
                    }
                    case ATTPROJW:  // row-parallel: this rank's input columns of every output row
                    case FCPROJW: {
                        const size_t in = b == ATTPROJW ? C : F_, part_in = in / tp;
                        for (size_t o = 0; o < C; o++) at(b, o * in + rank * part_in, o * part_in, part_in);
                        break;
                    }
                    default: at(b, 0, 0, block_tensor_size[t]);  // replicated
                }
            }
        }
        if (part.last) {
            visit(full.lnfw, lnfw, C);
            if (config.has_biases()) visit(full.lnfb, lnfb, C);
        }
        if (part.has_lm_head()) visit(full.lm_head + rank * V * C, lm_head, V * C);
    }

    // Weight decay on embeddings, the untied LM head and the four matrices of each block (tensors with 2+ dimensions).
    LayoutMask decay_mask() const {
        LayoutMask mask = blocks_mask({QKVW, ATTPROJW, FCW, FCPROJW});
        mask.head_end = blocks_begin;
        if (part.has_lm_head()) mask.tail_begin = lm_head;
        return mask;
    }
    // The tensor-parallel slices (wte, the untied LM head and the split block tensors); the rest is replicated.
    LayoutMask split_mask() const {
        LayoutMask mask = blocks_mask({QKVW, QKVB, ATTPROJW, FCW, FCB, FCPROJW});
        mask.head_end = wte_end();
        if (part.has_lm_head()) mask.tail_begin = lm_head;
        return mask;
    }

private:
    LayoutMask blocks_mask(std::initializer_list<BlockTensor> tensors) const {
        LayoutMask mask;
        mask.blocks_begin = blocks_begin;
        mask.block_size = block_stride;
        mask.blocks_end = blocks_begin + block_stride * num_blocks();
        for (BlockTensor t : tensors) {
            mask.range_begin[mask.num_ranges] = block_offset[t];
            mask.range_end[mask.num_ranges] = block_offset[t] + block_tensor_size[t];
            mask.num_ranges++;
        }
        return mask;
    }
};

// A run of ParameterLayout::for_each_full_run: `count` elements at `full` in the whole model, at `local` in a part.
struct LayoutRun {
    size_t full, local, count;
};
inline void sort_by_full(std::vector<LayoutRun>& runs) {
    std::sort(runs.begin(), runs.end(), [](const LayoutRun& a, const LayoutRun& b) { return a.full < b.full; });
}
// Tensor-parallel rank `rank`'s runs of `part` in `full`, in the whole model's order.
inline std::vector<LayoutRun> sorted_full_runs(const ParameterLayout& part, const ParameterLayout& full, int rank) {
    std::vector<LayoutRun> runs;
    part.for_each_full_run(full, rank, [&](size_t f, size_t l, size_t n) { runs.push_back({f, l, n}); });
    sort_by_full(runs);
    return runs;
}
// The pieces of the whole model that two parts both hold, from their runs (each list sorted by `full`, its runs
// disjoint): visit(a_local, b_local, count) for each, in the whole model's order.
template <typename F> void for_each_shared_run(const std::vector<LayoutRun>& a, const std::vector<LayoutRun>& b, F visit) {
    for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
        const size_t begin = std::max(a[i].full, b[j].full);
        const size_t a_end = a[i].full + a[i].count, b_end = b[j].full + b[j].count;
        if (begin < std::min(a_end, b_end)) visit(a[i].local + (begin - a[i].full), b[j].local + (begin - b[j].full), std::min(a_end, b_end) - begin);
        if (a_end <= b_end) i++;
        else j++;
    }
}
