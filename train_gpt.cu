// train_gpt.cu: GPT-2 training on one GPU, read top to bottom as the recipe.
//   1. configuration and the block-major parameter layout
//   2. llm.c model files
//   3. the model: allocation, initialisation, forward, backward, update (one kernel call per operation)
//   4. command-line flags, learning-rate schedule, checkpoints
//   5. the training loop
// The kernels live in kernels/ (one file per layer), data loading and the tokenizer in dataloader/.
// Tests include this file with TESTING defined, which leaves out main().
#include <string>
#include <vector>
#include <array>
#include <cstring>
#include <chrono>
#include <dirent.h>
#include <sys/stat.h>
#include "dataloader/dataloader.h"   // defines: DataLoader (token shards, prefetching, resumable position)
#include "dataloader/tokenizer.h"    // defines: GPT2Tokenizer, TokenDecoder (to decode samples)
#include "dataloader/hellaswag.h"    // defines: HellaSwagBatcher (packing and scoring the HellaSwag eval)
#include "kernels/common.cuh"
#include "kernels/init.cuh"
#include "kernels/encoder.cuh"            // defines: encoder_forward, encoder_backward, EncoderBuckets
#include "kernels/layernorm.cuh"          // defines: layernorm_forward, residual_layernorm_forward, residual_forward, layernorm_backward
#include "kernels/matmul.cuh"             // defines: matmul_forward, matmul_forward_gelu, matmul_backward (cuBLASLt), bias_backward
#include "kernels/flash_attention.cuh"    // defines: flash_attention_forward, flash_attention_backward
#include "kernels/gelu.cuh"               // defines: gelu_forward, gelu_backward
#include "kernels/classifier.cuh"         // defines: fused_classifier (softmax + cross-entropy)
#include "kernels/adamw.cuh"              // defines: adamw_update (LayoutMask: kernels/common.cuh)
#include "kernels/global_norm.cuh"        // defines: global_norm_squared
#include "kernels/lora.cuh"               // defines: lora_forward, lora_backward, lora_dropout
#include "distributed/process_group.h"    // defines: ProcessGroup (ranks, NCCL communicator, bootstrap)
#include "distributed/mesh.h"             // defines: MeshShape, ProcessMesh (rank arithmetic; tp, pp, dp communicators)
#include "distributed/zero.cuh"           // defines: ZeroOptimizer (ZeRO stages 0-3: sharding, collectives, AdamW)
#include "distributed/tensor_parallel.cuh"  // defines: TensorParallel (the f and g operators, vocabulary-parallel loss)
#include "distributed/pipeline_schedule.h"  // defines: make_pipeline_schedule (1F1B, interleaved), pipeline_layer_split
#include "distributed/pipeline_parallel.cuh"  // defines: PipelineParallel (runs a stage's schedule: compute and transfers)

// ---------------------------------------------------------------------------------------------
// Configuration

inline void die(const std::string& message) {
    fprintf(stderr, "error: %s\n", message.c_str());
    exit(EXIT_FAILURE);
}

constexpr int kModelMagic = 20240326;
constexpr int kModelVersionFP32 = 3, kModelVersionBF16 = 5;

struct ModelConfig {
    int max_seq_len = 1024;
    int vocab_size = 50257;
    int padded_vocab_size = 50304;
    int num_layers = 12;
    int num_heads = 12;
    int channels = 768;
};

inline int pad_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

// "dN": GPT-2's published shapes for 12/24/36/48 layers (and llm.c's d6, d60); any other depth N gets
// C = 64 N and N heads (the aspect ratio and head size of GPT-2 124M).
inline bool config_from_descriptor(const std::string& descriptor, ModelConfig& config) {
    if (descriptor.size() < 2 || descriptor[0] != 'd') return false;
    for (size_t i = 1; i < descriptor.size(); i++)
        if (!isdigit((unsigned char)descriptor[i])) return false;
    const int depth = atoi(descriptor.c_str() + 1);
    if (depth <= 0) return false;
    const int known[][3] = {{6, 384, 6},    {12, 768, 12},  {24, 1024, 16}, {36, 1280, 20},
                            {48, 1600, 25}, {60, 1920, 30}};
    config = ModelConfig();
    config.num_layers = depth;
    config.channels = 64 * depth;
    config.num_heads = depth;
    for (auto& k : known)
        if (k[0] == depth) { config.channels = k[1]; config.num_heads = k[2]; }
    return true;
}

// Returns an empty string when the configuration is usable, else why not.
inline std::string config_problem(const ModelConfig& c) {
    char buf[256];
    if (c.num_layers <= 0 || c.num_heads <= 0 || c.channels <= 0 || c.max_seq_len <= 0 || c.vocab_size <= 0)
        return "layers, heads, channels, max sequence length and vocabulary must be positive";
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
    return "";
}

// Returns an empty string when tensor parallelism of degree tp can split the model, else why not (the flag and
// the values): whole heads per rank, and equal vocabulary ranges whose rows keep 16-byte alignment.
inline std::string tensor_parallel_problem(const ModelConfig& c, int tp) {
    const std::string flag = "--tensor-parallel " + std::to_string(tp) + ": ";
    if (tp < 1) return flag + "must be at least 1";
    if (c.num_heads % tp != 0)
        return flag + "the " + std::to_string(c.num_heads) + " attention heads do not split into " + std::to_string(tp) + " equal groups";
    if (c.padded_vocab_size % (8 * tp) != 0)
        return flag + "the padded vocabulary " + std::to_string(c.padded_vocab_size) + " does not split into " + std::to_string(tp) +
               " equal ranges of a multiple of 8 rows";
    return "";
}

// ---------------------------------------------------------------------------------------------
// Parameter layout. On the device the parameters are one flat buffer, block-major:
//   [wte (Vp,C)][wpe (T,C)][block 0][block 1]...[block L-1][lnfw (C)][lnfb (C)]
// with each block's 12 tensors contiguous, so that one layer can be gathered (ZeRO-3), owned by a
// pipeline stage, or split for tensor parallelism as one piece. Gradients, master weights and Adam
// moments use the same layout. The llm.c file order (tensor-major) is converted only at file I/O.
//
// Under tensor parallelism of degree tp (distributed/tensor_parallel.cuh) a rank's buffer has the same
// structure with its slices in place of the split tensors: wte holds a contiguous range of Vp/tp vocabulary
// rows; qkvw/qkvb the q, k and v rows of NH/tp whole heads; fcw/fcb 4C/tp rows (column-parallel); attprojw and
// fcprojw C/tp and 4C/tp input columns (row-parallel). The LayerNorms, wpe and the row-parallel biases are
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
    static StageModel whole(const ModelConfig& c) {
        StageModel m;
        for (int l = 0; l < c.num_layers; l++) m.layers.push_back(l);
        return m;
    }
    bool has_wte() const { return first || last; }
    bool tied_copy() const { return last && !first; }  // the last stage's copy of wte (pipeline parallelism)
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
    size_t wte = 0, wpe = 0, blocks_begin = 0, block_size = 0, block_stride = 0, lnfw = 0, lnfb = 0, total = 0;
    size_t count = 0;  // parameters of this layout (one rank's); `total` adds the padding between units
    size_t block_offset[kBlockTensors] = {}, block_tensor_size[kBlockTensors] = {};
    // Units are what data parallelism shards and gathers one at a time: wte, wpe, each block, the final
    // LayerNorm (those this stage holds, in that order). Each is padded to a multiple of `unit_multiple`
    // elements (8 x the data-parallel degree: equal 16-byte-aligned shards per rank).
    std::vector<size_t> unit_offsets, unit_sizes, unit_real_sizes;
    std::vector<UnitKind> unit_kinds;
    int wte_unit = -1, wpe_unit = -1, first_block_unit = -1, lnf_unit = -1;

    explicit ParameterLayout(const ModelConfig& c = ModelConfig(), size_t unit_multiple = 8, int tensor_parallel = 1,
                             const StageModel& stage_model = StageModel())
        : config(c), tp(tensor_parallel), part(stage_model) {
        if (part.layers.empty() && part.first && part.last) part = StageModel::whole(c);  // the default: the whole model
        const size_t C = c.channels, Cs = C / tp;  // Cs: one rank's share of C (heads x head size)
        const size_t sizes[kBlockTensors] = {C, C, 3 * Cs * C, 3 * Cs, C * Cs, C, C, C, 4 * Cs * C, 4 * Cs, C * 4 * Cs, C};
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
            wte_unit = add_unit((size_t)vocab_rows() * C,
                                part.first && part.last ? UnitKind::kPersistent : part.first ? UnitKind::kTied : UnitKind::kTiedCopy);
        }
        if (part.first) {
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
            lnf_unit = add_unit(2 * C, UnitKind::kPersistent);
        }
    }
    int vocab_rows() const { return config.padded_vocab_size / tp; }  // rows of wte (and logits columns) per rank
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

    // The llm.c file order (of the whole model: tp = 1, one stage): 16 tensors, the 12 block tensors each
    // spanning all layers. Calls visit(file_offset, device_offset, count) for every contiguous run.
    template <typename F> void for_each_file_run(F visit) const {
        if (tp != 1 || !part.first || !part.last) die("internal: for_each_file_run on a part of the model");
        size_t file_offset = 0;
        auto run = [&](size_t device_offset, size_t count) { visit(file_offset, device_offset, count); file_offset += count; };
        run(wte, (size_t)vocab_rows() * config.channels);
        run(wpe, (size_t)config.max_seq_len * config.channels);
        for (int t = 0; t < kBlockTensors; t++)
            for (int l = 0; l < config.num_layers; l++) run(tensor(l, (BlockTensor)t), block_tensor_size[t]);
        run(lnfw, config.channels);
        run(lnfb, config.channels);
    }

    // Tensor-parallel rank `rank`'s slices of this stage's part in the layout `full` (tp = 1, any padding) of the
    // whole model or of a part that holds this one: calls visit(full_offset, local_offset, count) for every
    // contiguous run, in local order.
    template <typename F> void for_each_full_run(const ParameterLayout& full, int rank, F visit) const {
        const size_t C = config.channels, Cs = C / tp, T = config.max_seq_len, V = vocab_rows();
        if (part.has_wte()) visit(full.wte + rank * V * C, wte, V * C);
        if (part.first) visit(full.wpe, wpe, T * C);
        for (int i = 0; i < num_blocks(); i++) {
            const int l = full.local_block(part.layers[i]);
            auto at = [&](BlockTensor t, size_t full_offset, size_t local_offset, size_t n) {
                visit(full.tensor(l, t) + full_offset, tensor(i, t) + local_offset, n);
            };
            for (int t = 0; t < kBlockTensors; t++) {
                const BlockTensor b = (BlockTensor)t;
                switch (b) {
                    case QKVW:  // q, k and v rows of this rank's heads
                        for (size_t p = 0; p < 3; p++) at(b, (p * C + rank * Cs) * C, p * Cs * C, Cs * C);
                        break;
                    case QKVB:
                        for (size_t p = 0; p < 3; p++) at(b, p * C + rank * Cs, p * Cs, Cs);
                        break;
                    case FCW: at(b, rank * 4 * Cs * C, 0, 4 * Cs * C); break;
                    case FCB: at(b, rank * 4 * Cs, 0, 4 * Cs); break;
                    case ATTPROJW:  // row-parallel: this rank's input columns of every output row
                    case FCPROJW: {
                        const size_t in = b == ATTPROJW ? C : 4 * C, part_in = in / tp;
                        for (size_t o = 0; o < C; o++) at(b, o * in + rank * part_in, o * part_in, part_in);
                        break;
                    }
                    default: at(b, 0, 0, block_tensor_size[t]);  // replicated
                }
            }
        }
        if (part.last) {
            visit(full.lnfw, lnfw, C);
            visit(full.lnfb, lnfb, C);
        }
    }

    // Weight decay on embeddings and the four matrices of each block (tensors with 2+ dimensions).
    LayoutMask decay_mask() const {
        LayoutMask mask = blocks_mask({QKVW, ATTPROJW, FCW, FCPROJW});
        mask.head_end = blocks_begin;
        return mask;
    }
    // The tensor-parallel slices (wte and the split block tensors); the rest is replicated.
    LayoutMask split_mask() const {
        LayoutMask mask = blocks_mask({QKVW, QKVB, ATTPROJW, FCW, FCB, FCPROJW});
        mask.head_end = wte_end();
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

// ---------------------------------------------------------------------------------------------
// LoRA (docs/lora.md): adapters A (r, in), B (out, r) on chosen matrices of every block. On the device
// the adapters of block l form unit l+1 of their own flat buffer (units 0 and L+1 are empty, matching
// ParameterLayout's unit numbering), each target's A then B in the order qkv, attn-proj, fc, fc-proj: the
// order of the adapter file.

enum LoraTargetIndex { kLoraQkv, kLoraAttnProj, kLoraFc, kLoraFcProj, kLoraTargets };
inline const char* lora_target_name(int t) {
    static const char* names[] = {"qkv", "attn-proj", "fc", "fc-proj"};
    return names[t];
}
inline BlockTensor lora_target_weight(int t) {
    static const BlockTensor weights[] = {QKVW, ATTPROJW, FCW, FCPROJW};
    return weights[t];
}
inline int lora_in(int t, int C) { return t == kLoraFcProj ? 4 * C : C; }
inline int lora_out(int t, int C) { return t == kLoraQkv ? 3 * C : t == kLoraFc ? 4 * C : C; }

struct LoraSpec {
    int rank = 0;        // 0: LoRA off
    float alpha = 0.0f;
    unsigned targets = 0;  // bit t = LoraTargetIndex t
    float dropout = 0.0f;
    bool enabled() const { return rank > 0; }
    bool targets_has(int t) const { return (targets >> t) & 1u; }
    float scale() const { return alpha / (float)rank; }
};

// "qkv,fc" -> bitmask; 0 on an unknown name.
inline unsigned parse_lora_targets(const std::string& list) {
    unsigned mask = 0;
    size_t start = 0;
    while (start <= list.size()) {
        const size_t end = std::min(list.find(',', start), list.size());
        const std::string name = list.substr(start, end - start);
        bool known = false;
        for (int t = 0; t < kLoraTargets; t++)
            if (name == lora_target_name(t)) { mask |= 1u << t; known = true; }
        if (!known) return 0;
        start = end + 1;
    }
    return mask;
}

struct AdapterLayout {
    ModelConfig config;
    LoraSpec spec;
    size_t unit_stride = 0, total = 0;
    size_t offset_a[kLoraTargets] = {}, offset_b[kLoraTargets] = {};  // within a layer's unit
    size_t count = 0;                                                 // adapter parameters (no padding)
    AdapterLayout(const ModelConfig& c, const LoraSpec& s, size_t unit_multiple) : config(c), spec(s) {
        size_t size = 0;
        for (int t = 0; t < kLoraTargets; t++) {
            if (!s.targets_has(t)) continue;
            offset_a[t] = size;
            size += (size_t)s.rank * lora_in(t, c.channels);
            offset_b[t] = size;
            size += (size_t)lora_out(t, c.channels) * s.rank;
        }
        count = size * c.num_layers;
        unit_stride = (size + unit_multiple - 1) / unit_multiple * unit_multiple;
        edge_ = unit_multiple;
        total = edge_ + unit_stride * c.num_layers + edge_;
    }
    size_t layer_size() const { return count / config.num_layers; }
    size_t unit_begin(int l) const { return edge_ + l * unit_stride; }  // layer l's adapters
    size_t a(int l, int t) const { return edge_ + l * unit_stride + offset_a[t]; }
    size_t b(int l, int t) const { return edge_ + l * unit_stride + offset_b[t]; }
    std::vector<size_t> unit_offsets() const {
        std::vector<size_t> v = {0};
        for (int l = 0; l <= config.num_layers; l++) v.push_back(edge_ + l * unit_stride);
        return v;
    }
    std::vector<size_t> unit_sizes() const {
        std::vector<size_t> v = {edge_};
        for (int l = 0; l < config.num_layers; l++) v.push_back(unit_stride);
        v.push_back(edge_);
        return v;
    }
    std::vector<UnitKind> unit_kinds() const {  // the layers gathered on use (ZeRO-3), the edges persistent
        std::vector<UnitKind> v(config.num_layers + 2, UnitKind::kGathered);
        v.front() = v.back() = UnitKind::kPersistent;
        return v;
    }
    LayoutMask decay_mask() const {  // A and B are 2-D: all of them decay (with the LoRA weight decay)
        LayoutMask mask;
        mask.head_end = total;
        return mask;
    }

private:
    size_t edge_ = 8;  // the empty first and last units (one shard slot per rank)
};

// ---------------------------------------------------------------------------------------------
// llm.c model files. Values travel as fp32 on the host in device (block-major) order.

inline uint16_t float_to_bf16_bits(float x) {  // round to nearest even
    uint32_t bits;
    memcpy(&bits, &x, 4);
    if ((bits & 0x7F800000u) == 0x7F800000u) return (uint16_t)(bits >> 16);  // inf / nan
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}
inline float bf16_bits_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

inline ModelConfig read_model_header(FILE* f, const std::string& path, int* version) {
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) die(path + ": too short for a model header (1024 bytes)");
    if (header[0] != kModelMagic)
        die(path + ": bad magic " + std::to_string(header[0]) + " (expected " + std::to_string(kModelMagic) + ", an llm.c model file)");
    if (header[1] != kModelVersionFP32 && header[1] != kModelVersionBF16)
        die(path + ": unsupported model version " + std::to_string(header[1]) + " (expected 3 = fp32 or 5 = bf16)");
    *version = header[1];
    ModelConfig c;
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    std::string problem = config_problem(c);
    if (!problem.empty()) die(path + ": " + problem);
    return c;
}

// Reads an llm.c model file into `values` (fp32, device order).
// `values` uses the device layout with the given unit padding (see ParameterLayout).
inline ModelConfig read_model_file(const std::string& path, std::vector<float>& values, size_t unit_multiple = 8) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) die(path + ": cannot open model file: " + strerror(errno));
    int version;
    ModelConfig config = read_model_header(f, path, &version);
    ParameterLayout layout(config, unit_multiple);
    const size_t element_bytes = version == kModelVersionFP32 ? 4 : 2;
    fseek(f, 0, SEEK_END);
    const long file_size = ftell(f);
    const long expected = 1024 + (long)(layout.count * element_bytes);
    if (file_size != expected)
        die(path + ": size " + std::to_string(file_size) + " bytes, expected " + std::to_string(expected) + " for its header's shape");
    fseek(f, 1024, SEEK_SET);
    std::vector<uint8_t> raw(layout.count * element_bytes);
    if (fread(raw.data(), 1, raw.size(), f) != raw.size()) die(path + ": read failed");
    fclose(f);
    values.assign(layout.total, 0.0f);
    layout.for_each_file_run([&](size_t file_offset, size_t device_offset, size_t count) {
        for (size_t i = 0; i < count; i++) {
            if (element_bytes == 4) memcpy(&values[device_offset + i], &raw[(file_offset + i) * 4], 4);
            else {
                uint16_t b;
                memcpy(&b, &raw[(file_offset + i) * 2], 2);
                values[device_offset + i] = bf16_bits_to_float(b);
            }
        }
    });
    return config;
}

// Writes `values` (fp32, device order) as an llm.c model file: fp32 (version 3) or bf16 (version 5).
// Written to a temporary name and renamed, so a crash never leaves a half-written file.
inline void write_model_file(const std::string& path, const ParameterLayout& layout, const std::vector<float>& values, bool bf16) {
    const ModelConfig& c = layout.config;
    int header[256] = {};
    header[0] = kModelMagic;
    header[1] = bf16 ? kModelVersionBF16 : kModelVersionFP32;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    const size_t element_bytes = bf16 ? 2 : 4;
    std::vector<uint8_t> raw(layout.count * element_bytes);
    layout.for_each_file_run([&](size_t file_offset, size_t device_offset, size_t count) {
        for (size_t i = 0; i < count; i++) {
            if (!bf16) memcpy(&raw[(file_offset + i) * 4], &values[device_offset + i], 4);
            else {
                uint16_t b = float_to_bf16_bits(values[device_offset + i]);
                memcpy(&raw[(file_offset + i) * 2], &b, 2);
            }
        }
    });
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (f == nullptr) die(tmp + ": cannot create: " + strerror(errno));
    bool ok = fwrite(header, sizeof(int), 256, f) == 256 && fwrite(raw.data(), 1, raw.size(), f) == raw.size();
    ok = (fclose(f) == 0) && ok;
    if (!ok) die(tmp + ": write failed (disk full?)");
    if (rename(tmp.c_str(), path.c_str()) != 0) die(path + ": rename failed: " + strerror(errno));
}

// Adapter files (docs/lora.md): header of 256 int32 (magic 20261127, version 1, rank, alpha, targets, L, C,
// tensor count), then fp32 A and B per layer and target. `values` uses the device layout (padded units).
constexpr int kAdapterMagic = 20261127;

inline void write_adapter_file(const std::string& path, const AdapterLayout& layout, const std::vector<float>& values) {
    int header[256] = {};
    header[0] = kAdapterMagic;
    header[1] = 1;
    header[2] = layout.spec.rank;
    memcpy(&header[3], &layout.spec.alpha, sizeof(float));
    header[4] = (int)layout.spec.targets;
    header[5] = layout.config.num_layers;
    header[6] = layout.config.channels;
    header[7] = 2 * layout.config.num_layers * __builtin_popcount(layout.spec.targets);
    std::vector<float> body;
    for (int l = 0; l < layout.config.num_layers; l++)
        body.insert(body.end(), values.begin() + layout.unit_begin(l), values.begin() + layout.unit_begin(l) + layout.layer_size());
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (f == nullptr) die(tmp + ": cannot create: " + strerror(errno));
    bool ok = fwrite(header, sizeof(int), 256, f) == 256 && fwrite(body.data(), sizeof(float), body.size(), f) == body.size();
    ok = (fclose(f) == 0) && ok;
    if (!ok) die(tmp + ": write failed (disk full?)");
    if (rename(tmp.c_str(), path.c_str()) != 0) die(path + ": rename failed: " + strerror(errno));
}

// Reads an adapter file for `config`; returns its spec (dropout 0) and fills `values` for `unit_multiple`.
inline LoraSpec read_adapter_file(const std::string& path, const ModelConfig& config, size_t unit_multiple, std::vector<float>& values) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) die(path + ": cannot open adapter file: " + strerror(errno));
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) die(path + ": too short for an adapter header (1024 bytes)");
    if (header[0] != kAdapterMagic) die(path + ": bad magic " + std::to_string(header[0]) + " (expected " + std::to_string(kAdapterMagic) + ", an adapter file)");
    if (header[1] != 1) die(path + ": unsupported adapter file version " + std::to_string(header[1]) + " (expected 1)");
    LoraSpec spec;
    spec.rank = header[2];
    memcpy(&spec.alpha, &header[3], sizeof(float));
    spec.targets = (unsigned)header[4];
    if (spec.rank <= 0) die(path + ": rank " + std::to_string(spec.rank) + " must be positive");
    if (!(spec.alpha > 0.0f) || !std::isfinite(spec.alpha)) die(path + ": alpha must be finite and positive");
    if (spec.targets == 0 || spec.targets > 15) die(path + ": bad target bitmask " + std::to_string(header[4]) + " (1 qkv, 2 attn-proj, 4 fc, 8 fc-proj)");
    if (header[5] != config.num_layers || header[6] != config.channels)
        die(path + ": adapters for " + std::to_string(header[5]) + " layers x " + std::to_string(header[6]) + " channels, the model has " +
            std::to_string(config.num_layers) + " x " + std::to_string(config.channels));
    if (header[7] != 2 * config.num_layers * __builtin_popcount(spec.targets)) die(path + ": tensor count does not match its targets");
    const AdapterLayout layout(config, spec, unit_multiple);
    std::vector<float> body(layout.count);
    if (fread(body.data(), sizeof(float), body.size(), f) != body.size()) die(path + ": truncated");
    if (fgetc(f) != EOF) die(path + ": longer than its header says");
    fclose(f);
    values.assign(layout.total, 0.0f);
    for (int l = 0; l < config.num_layers; l++)
        std::copy(body.begin() + l * layout.layer_size(), body.begin() + (l + 1) * layout.layer_size(),
                  values.begin() + layout.unit_begin(l));
    return spec;
}

// The merged model W = W0 + s B A for every adapted matrix (summed in double, rounded once), padded layout.
inline std::vector<float> merge_adapters(const ParameterLayout& base, const std::vector<float>& base_values,
                                         const AdapterLayout& adapters, const std::vector<float>& adapter_values) {
    std::vector<float> merged = base_values;
    const int C = base.config.channels, r = adapters.spec.rank;
    const double s = adapters.spec.scale();
    for (int l = 0; l < base.config.num_layers; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            if (!adapters.spec.targets_has(t)) continue;
            const int in = lora_in(t, C), out = lora_out(t, C);
            const float* A = &adapter_values[adapters.a(l, t)];
            const float* Bm = &adapter_values[adapters.b(l, t)];
            float* W = &merged[base.tensor(l, lora_target_weight(t))];
            for (int o = 0; o < out; o++)
                for (int i = 0; i < in; i++) {
                    double acc = 0.0;
                    for (int k = 0; k < r; k++) acc += (double)Bm[(size_t)o * r + k] * A[(size_t)k * in + i];
                    W[(size_t)o * in + i] = (float)((double)W[(size_t)o * in + i] + s * acc);
                }
        }
    return merged;
}

// ---------------------------------------------------------------------------------------------
// The model

template <typename floatX>
struct LayerActivations {
    floatX *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    float* lse;  // attention's log-sum-exp per (b, head, t): all the backward needs besides q, k, v and the output
};

// One micro-batch's activations on one chunk of blocks (all of them, without pipeline parallelism): what its
// backward needs, kept from its forward. A pipeline stage has one set per micro-batch in flight on each chunk.
template <typename floatX>
struct ActivationSet {
    std::vector<LayerActivations<floatX>> layers;  // the chunk's blocks
    floatX* input = nullptr;      // the residual stream entering the chunk: the embeddings' output, or received
    floatX* dresidual = nullptr;  // d(loss)/d(residual stream), from the chunk's end back to its input
    int* tokens = nullptr;        // the micro-batch's inputs, targets and encoder buckets (device)
    int num_buckets = 0;
};

// The activation sets a stage allocates: the blocks of each chunk, the sets per chunk (one per micro-batch in
// flight), and whether the stage ends the model (final LayerNorm, LM head, loss).
struct ActivationPlan {
    std::vector<int> chunk_blocks;
    std::vector<int> slots;
    bool head = true;
    static ActivationPlan whole(const ModelConfig& c) { return {{c.num_layers}, {1}, true}; }
    int sets() const {
        int n = 0;
        for (int k : slots) n += k;
        return n;
    }
};

inline double gib(size_t bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }
inline size_t device_memory_in_use() {
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
}

// Bytes of every buffer, for the start-up memory plan (predicted before anything is allocated).
struct MemoryPlan {
    size_t parameters = 0, gradients = 0, master_weights = 0, adam_state = 0, activations = 0, scratch = 0;
    size_t working = 0;  // of parameters and gradients: the unsharded unit buffers of ZeRO stages 2-3 (ZeroMemory)
    size_t total() const { return parameters + gradients + master_weights + adam_state + activations + scratch; }
};

template <typename floatX>
struct GPT2 {
    using Float = floatX;
    ModelConfig config;
    ParameterLayout layout;       // this rank's parameters (its tensor-parallel slices)
    ParameterLayout full_layout;  // the whole model (tp = 1), same padding: model files, initialisation, checkpoints
    const ProcessGroup& pg;
    const ProcessMesh& mesh;
    TensorParallel<floatX> tensor_parallel;
    int B = 0, T = 0;  // activation shape (per rank)
    cudaStream_t stream = nullptr;
    // Parameters, gradients and optimizer state: stored, sharded and communicated as the ZeRO stage says.
    // Under LoRA `zero` holds the frozen base model (parameters only) and `adapters` the trained A and B.
    std::unique_ptr<ZeroOptimizer<floatX>> zero;
    LoraSpec lora;
    std::unique_ptr<AdapterLayout> adapter_layout;
    std::unique_ptr<ZeroOptimizer<floatX>> adapters;
    floatX* lora_u = nullptr;        // u = A dropout(x), (N, r) per layer and target, for the backward
    floatX* lora_du = nullptr;       // (N, r) scratch of the backward
    floatX* lora_dropped = nullptr;  // dropout(x), (N, 4C) scratch, only with dropout
    uint64_t lora_dropout_seed = 0;  // set per micro-step; the backward regenerates the same masks
    bool training = false;           // LoRA dropout only while training, not in evaluation or sampling

    // activations: sets[k][slot] holds one micro-batch's on chunk k (one set without pipeline parallelism)
    floatX* activation_memory = nullptr;
    float* statistics_memory = nullptr;
    std::vector<std::vector<ActivationSet<floatX>>> sets;
    // the model's end (last stage): the final LayerNorm's output, the logits (or their gradient), per-row losses
    floatX *lnf = nullptr, *logits = nullptr;
    float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr;
    // scratch shared by all layers and sets
    floatX *proj_out = nullptr, *dbtc = nullptr, *dbig = nullptr;
    floatX* gathered = nullptr;  // sequence parallelism: a LayerNorm output made whole for a column-parallel product
    // Sequence parallelism (Korthikanti et al. 2022), with tp > 1: the LayerNorm and residual regions hold 1/tp of
    // the rows on each rank (set before allocate()).
    bool sequence_parallel = false;
    int sequence_split() const { return sequence_parallel ? layout.tp : 1; }
    void* attention_scratch = nullptr;  // flash attention backward (dQ accumulation)
    bool deterministic_attention = true;
    int recompute = 0;  // Recompute level
    // The MLP's GELU runs in cuBLASLt epilogues (matmul_forward_gelu; matmul_backward's gelu_inp) where
    // matmul_gelu_epilogues allows it and no LoRA adapter adds to the product before the GELU (fc in the forward,
    // fc-proj in the backward). false: separate GELU kernels everywhere (test_gpt2's base model, which must
    // match a model with an fc adapter bit for bit).
    bool gelu_fusion = true;
    size_t model_state_bytes = 0;  // device memory that allocate() took for parameters, gradients and optimizer state
    float* reduce_scratch = nullptr;  // partial sums of the deterministic reductions
    float* device_scalar = nullptr;   // one float, zero: barrier()'s all-reduce
    // Per-row losses summed by accumulate_loss() until take_mean_loss(): this rank's rows are loss_sums, slice
    // `rank` of all_loss_sums, which holds every rank's rows once request_losses() has gathered them.
    float *all_loss_sums = nullptr, *loss_sums = nullptr;
    // pinned host copy of all_loss_sums: a copy into pageable memory blocks until the stream drains, which a
    // stuck collective would make an unbounded wait
    float* loss_sums_host = nullptr;
    bool losses_requested = false;  // request_losses() ran since the last take_mean_loss()
    int forwards_summed = 0;
    // Batches go through two pinned staging buffers (inputs, targets, encoder buckets) into an activation set's
    // tokens, so the host prepares the next micro-batch while the GPU still works on the current one.
    int* tokens_memory = nullptr;  // every set's tokens
    int* staging[2] = {nullptr, nullptr};
    cudaEvent_t staging_free[2] = {nullptr, nullptr};
    int staging_index = 0;
    std::vector<int> bucket_counts;
    size_t tokens_buffer_ints() const { return (size_t)B * T * 5 + 1; }  // inputs, targets, buckets (<= 3N + 1)

    // The mesh's data group shards (ZeRO), its tensor group splits the layers; LoRA needs tp = 1 (main() checks).
    // `part`: what this pipeline stage holds (the whole model by default), in chunks of `chunk_blocks` blocks.
    GPT2(const ModelConfig& c, const ProcessGroup& process_group, const ProcessMesh& process_mesh, int zero_stage, cudaStream_t s,
         const LoraSpec& lora_spec = LoraSpec(), const StageModel& part = StageModel(), std::vector<int> chunk_blocks = {})
        : config(c), layout(c, 8 * process_mesh.data.size, process_mesh.tensor.size, part), full_layout(c, 8 * process_mesh.data.size),
          pg(process_group), mesh(process_mesh), stream(s),
          zero(new ZeroOptimizer<floatX>(layout.unit_offsets, layout.unit_sizes, layout.unit_kinds, layout.total, layout.decay_mask(),
                                         process_group, process_mesh, zero_stage, s, !lora_spec.enabled(), layout.split_mask())),
          lora(lora_spec) {
        tensor_parallel.group = mesh.tensor;
        if (chunk_blocks.empty()) chunk_blocks = {layout.num_blocks()};
        chunk_begin = {0};
        for (int k : chunk_blocks) chunk_begin.push_back(chunk_begin.back() + k);
        if (chunk_begin.back() != layout.num_blocks()) die("internal: the chunks do not cover the stage's blocks");
        if (lora.enabled()) {
            adapter_layout.reset(new AdapterLayout(c, lora, 8 * process_mesh.data.size));
            adapters.reset(new ZeroOptimizer<floatX>(adapter_layout->unit_offsets(), adapter_layout->unit_sizes(), adapter_layout->unit_kinds(),
                                                     adapter_layout->total, adapter_layout->decay_mask(), process_group, process_mesh,
                                                     zero_stage, s));
        }
    }
    // Chunks of blocks (pipeline parallelism's model chunks; one without it): chunk k holds the local blocks
    // [chunk_begin[k], chunk_begin[k+1]). The model's first chunk starts with the embeddings, its last ends with
    // the final LayerNorm and the LM head.
    std::vector<int> chunk_begin;
    int num_chunks() const { return (int)chunk_begin.size() - 1; }
    bool model_begins(int k) const { return layout.part.first && k == 0; }
    bool model_ends(int k) const { return layout.part.last && k == num_chunks() - 1; }
    ActivationPlan activation_plan(std::vector<int> slots = {}) const {
        ActivationPlan p;
        for (int k = 0; k < num_chunks(); k++) p.chunk_blocks.push_back(chunk_begin[k + 1] - chunk_begin[k]);
        p.slots = slots.empty() ? std::vector<int>(num_chunks(), 1) : slots;
        p.head = layout.part.last;
        return p;
    }
    // The optimizer of what trains: the adapters under LoRA, else the model.
    ZeroOptimizer<floatX>& trained() { return lora.enabled() ? *adapters : *zero; }
    size_t trainable_parameters() const { return lora.enabled() ? adapter_layout->count : full_layout.count; }

    size_t num_parameters() const { return full_layout.count; }  // of the whole model

    static size_t reduce_scratch_floats(const ModelConfig& c) {
        const int C = c.channels;
        return std::max({layernorm_backward_scratch_floats(C), bias_backward_scratch_floats<floatX>(4 * C),
                         bias_backward_scratch_floats<floatX>(c.padded_vocab_size), global_norm_scratch_floats()});
    }

    // Activation-buffer element counts, in allocation order, shared by the plan and the allocation.
    // --recompute levels: which activations the backward recomputes instead of keeping one copy per layer.
    enum Recompute { kKeepAll = 0, kRecomputeGelu = 1, kRecomputeGeluLayerNorm = 2, kRecomputeBlock = 3 };
    // The widths of one row (per token) of {ln1, qkv, atty, residual2, ln2, fch, fch_gelu, residual3}: under tensor
    // parallelism the attention's and the MLP's inner activations hold this rank's heads and hidden units; under
    // sequence parallelism (split = tp) the LayerNorm and residual activations hold this rank's 1/tp of the rows,
    // which is a width of C / tp per row of the batch.
    static std::array<size_t, 8> activation_width(const ModelConfig& c, int tp, int split) {
        const size_t C = c.channels, Cs = C / tp, Cr = C / split;
        return {Cr, 3 * Cs, Cs, Cr, Cr, 4 * Cs, 4 * Cs, Cr};
    }
    // Elements of one row that every layer keeps, or that all layers share (refilled by the backward), for a
    // recompute level.
    static void activation_widths(const ModelConfig& c, int tp, int split, int recompute, size_t* kept, size_t* shared) {
        const std::array<size_t, 8> width = activation_width(c, tp, split);
        *kept = *shared = 0;
        for (int i = 0; i < 8; i++) (activation_shared(recompute, i) ? *shared : *kept) += width[i];
    }
    static bool activation_shared(int recompute, int buffer) {
        switch (buffer) {
            case 6: return recompute >= kRecomputeGelu;                      // fch_gelu
            case 0: case 4: return recompute >= kRecomputeGeluLayerNorm;     // ln1, ln2
            case 7: return false;                                            // residual3: the next block's input
            default: return recompute >= kRecomputeBlock;                    // qkv, atty, residual2, fch
        }
    }

    // Activation-buffer element counts, in allocation order, shared by the plan and the allocation.
    // `split`: tp under sequence parallelism, else 1 (the rows of the LayerNorm and residual regions are N / split).
    // Each activation set keeps its blocks' activations, its input and its dresidual; the recomputed buffers,
    // the head's (lnf, logits) and the scratch are shared by all sets.
    static void activation_counts(const ModelConfig& c, int B, int T, int tp, int split, int recompute, const ActivationPlan& ap,
                                  size_t* x_elements, size_t* stat_elements) {
        const size_t N = (size_t)B * T, Nr = N / split, C = c.channels, NH = c.num_heads / tp;
        size_t kept, shared;
        activation_widths(c, tp, split, recompute, &kept, &shared);
        const size_t lse = (size_t)B * NH * T;
        size_t set_blocks = 0;  // blocks over all sets
        for (size_t k = 0; k < ap.slots.size(); k++) set_blocks += (size_t)ap.slots[k] * ap.chunk_blocks[k];
        const size_t head = ap.head ? N * C + N * (c.padded_vocab_size / tp) : 0;  // lnf, logits (this rank's columns)
        // proj_out, dbtc, dbig, and under sequence parallelism `gathered`
        const size_t scratch = N * C + N * C + N * 4 * (C / tp) + (split > 1 ? N * C : 0);
        *x_elements = N * (kept * set_blocks + shared) + 2 * Nr * C * ap.sets() + head + scratch;
        *stat_elements = (Nr * 4 + (recompute >= kRecomputeBlock ? 0 : lse)) * set_blocks + (recompute >= kRecomputeBlock ? lse : 0) +
                         (ap.head ? Nr * 2 : 0) + N;
    }

    // Per GPU, for `dp` data-parallel and `tp` tensor-parallel ranks (`split` = tp with sequence parallelism, else 1),
    // of a pipeline stage holding `part` with activation sets `ap` (the whole model with one set by default).
    static MemoryPlan plan(const ModelConfig& c, int B, int T, int dp, int tp, int split, int zero_stage, int recompute,
                           const LoraSpec& lora = LoraSpec(), const StageModel& part = StageModel(), ActivationPlan ap = ActivationPlan()) {
        MemoryPlan p;
        if (ap.slots.empty()) ap = ActivationPlan::whole(c);
        const ParameterLayout l(c, 8 * dp, tp, part);  // ZeRO shards over the data-parallel group
        const ZeroMemory z = ZeroOptimizer<floatX>::memory(l.unit_sizes, l.unit_kinds, l.total, dp, zero_stage, !lora.enabled());
        p.parameters = z.parameters;
        p.gradients = z.gradients;
        p.master_weights = z.master_weights;
        p.adam_state = z.adam_state;
        p.working = z.working;
        if (lora.enabled()) {
            const AdapterLayout a(c, lora, 8 * dp);
            const ZeroMemory za = ZeroOptimizer<floatX>::memory(a.unit_sizes(), a.unit_kinds(), a.total, dp, zero_stage);
            p.parameters += za.parameters;
            p.gradients += za.gradients;
            p.master_weights += za.master_weights;
            p.adam_state += za.adam_state;
            const size_t N = (size_t)B * T;
            p.activations += (N * lora.rank * __builtin_popcount(lora.targets) * c.num_layers + N * lora.rank +
                              (lora.dropout > 0.0f ? N * 4 * c.channels : 0)) * sizeof(floatX);
        }
        size_t x_elements, stat_elements;
        activation_counts(c, B, T, tp, split, recompute, ap, &x_elements, &stat_elements);
        p.activations += x_elements * sizeof(floatX) + stat_elements * sizeof(float);  // after LoRA's buffers
        // the initialisation's transient staging (init_parameters: one fp32 unit; set_parameters: its chunks) included
        const std::vector<size_t>& sizes = ParameterLayout(c, 8 * dp).unit_sizes;  // init_parameters makes whole units
        const size_t staging = std::max(*std::max_element(sizes.begin(), sizes.end()), ZeroOptimizer<floatX>::kStagingFloats);
        p.scratch = reduce_scratch_floats(c) * sizeof(float) + matmul_context().workspace_bytes + staging * sizeof(float) +
                    (size_t)B * T * 5 * sizeof(int) * ap.sets() +
                    flash_attention_backward_scratch_bytes(B, T, c.num_heads / tp, c.channels / c.num_heads) +
                    (tp > 1 ? 4 * (size_t)B * T * sizeof(float) : 0);  // the vocabulary-parallel loss's row statistics
        return p;
    }

    // `slots`: activation sets per chunk (pipeline parallelism: one per micro-batch in flight); one by default.
    void allocate(int batch, int seq_len, int recompute_level = kKeepAll, const std::vector<int>& slots = {}) {
        B = batch;
        T = seq_len;
        recompute = recompute_level;
        const size_t in_use_before_states = device_memory_in_use();
        zero->allocate();
        if (lora.enabled()) adapters->allocate();
        model_state_bytes = device_memory_in_use() - in_use_before_states;
        if (lora.enabled()) {
            const size_t N = (size_t)B * T;
            cudaCheck(cudaMalloc(&lora_u, N * lora.rank * __builtin_popcount(lora.targets) * config.num_layers * sizeof(floatX)));
            cudaCheck(cudaMalloc(&lora_du, N * lora.rank * sizeof(floatX)));
            if (lora.dropout > 0.0f) cudaCheck(cudaMalloc(&lora_dropped, N * 4 * config.channels * sizeof(floatX)));
        }

        const ActivationPlan ap = activation_plan(slots);
        size_t x_elements, stat_elements;
        activation_counts(config, B, T, layout.tp, sequence_split(), recompute, ap, &x_elements, &stat_elements);
        cudaCheck(cudaMalloc(&activation_memory, x_elements * sizeof(floatX)));
        cudaCheck(cudaMalloc(&statistics_memory, stat_elements * sizeof(float)));
        const size_t N = (size_t)B * T, C = config.channels, NH = config.num_heads / layout.tp;  // this rank's heads
        const size_t Nr = N / sequence_split();  // rows of the LayerNorm and residual regions on this rank
        floatX* x = activation_memory;
        auto take = [&](size_t n) { floatX* p = x; x += n; return p; };
        float* f = statistics_memory;
        auto take_f = [&](size_t n) { float* p = f; f += n; return p; };
        // recomputed activations: one buffer for all layers, which the backward refills layer by layer
        const std::array<size_t, 8> width = activation_width(config, layout.tp, sequence_split());
        floatX* shared[8] = {};
        for (int i = 0; i < 8; i++)
            if (activation_shared(recompute, i)) shared[i] = take(N * width[i]);
        float* shared_lse = recompute >= kRecomputeBlock ? take_f((size_t)B * NH * T) : nullptr;
        cudaCheck(cudaMalloc(&tokens_memory, tokens_buffer_ints() * ap.sets() * sizeof(int)));
        sets.assign(num_chunks(), {});
        int* tokens = tokens_memory;
        for (int k = 0; k < num_chunks(); k++) {
            sets[k].resize(ap.slots[k]);
            for (ActivationSet<floatX>& set : sets[k]) {
                set.layers.resize(ap.chunk_blocks[k]);
                for (auto& a : set.layers) {
                    floatX** buffers[8] = {&a.ln1, &a.qkv, &a.atty, &a.residual2, &a.ln2, &a.fch, &a.fch_gelu, &a.residual3};
                    for (int i = 0; i < 8; i++) *buffers[i] = shared[i] ? shared[i] : take(N * width[i]);
                    a.ln1_mean = take_f(Nr); a.ln1_rstd = take_f(Nr); a.ln2_mean = take_f(Nr); a.ln2_rstd = take_f(Nr);
                    a.lse = shared_lse ? shared_lse : take_f((size_t)B * NH * T);
                }
                set.input = take(Nr * C);
                set.dresidual = take(Nr * C);
                set.tokens = tokens;
                tokens += tokens_buffer_ints();
            }
        }
        if (ap.head) {
            lnf = take(N * C);
            logits = take(N * layout.vocab_rows());
        }
        proj_out = take(N * C); dbtc = take(N * C); dbig = take(N * 4 * (C / layout.tp));
        if (sequence_split() > 1) gathered = take(N * C);
        if (ap.head) { lnf_mean = take_f(Nr); lnf_rstd = take_f(Nr); }
        losses = take_f(N);
        if (x != activation_memory + x_elements || f != statistics_memory + stat_elements)
            die("internal: activation plan and allocation disagree");
        cudaCheck(cudaMalloc(&reduce_scratch, reduce_scratch_floats(config) * sizeof(float)));
        cudaCheck(cudaMalloc(&device_scalar, sizeof(float)));
        cudaCheck(cudaMemset(device_scalar, 0, sizeof(float)));
        cudaCheck(cudaMalloc(&attention_scratch, flash_attention_backward_scratch_bytes(B, T, NH, C / NH)));
        const size_t dp = mesh.data.size;  // the rows of every data-parallel rank (tensor-parallel ranks share theirs)
        cudaCheck(cudaMalloc(&all_loss_sums, dp * N * sizeof(float)));
        cudaCheck(cudaMemset(all_loss_sums, 0, dp * N * sizeof(float)));
        loss_sums = all_loss_sums + mesh.data.rank * N;
        cudaCheck(cudaMallocHost(&loss_sums_host, dp * N * sizeof(float)));
        tensor_parallel.allocate(N);
        for (int i = 0; i < 2; i++) {
            cudaCheck(cudaMallocHost(&staging[i], tokens_buffer_ints() * sizeof(int)));
            cudaCheck(cudaEventCreateWithFlags(&staging_free[i], cudaEventDisableTiming));
        }
    }

    ~GPT2() {
        for (void* p : {(void*)activation_memory,
                        (void*)statistics_memory, (void*)reduce_scratch, (void*)device_scalar, (void*)tokens_memory,
                        (void*)all_loss_sums, attention_scratch, (void*)lora_u, (void*)lora_du, (void*)lora_dropped})
            if (p != nullptr) cudaFree(p);
        if (loss_sums_host != nullptr) cudaFreeHost(loss_sums_host);
        for (int i = 0; i < 2; i++) {
            if (staging[i] != nullptr) cudaFreeHost(staging[i]);
            if (staging_free[i] != nullptr) cudaEventDestroy(staging_free[i]);
        }
    }

    // GPT-2 initialisation of unit u of the whole model (wte, wpe, the blocks, the final LayerNorm) into `unit_device`
    // (fp32, the unit's padded size): N(0, 0.02) weights, residual projections scaled by 1/sqrt(2L), zero
    // biases, unit LayerNorm weights, zero padded vocabulary rows. Each tensor draws from its own seed (its
    // index in the order wte, wpe, then qkvw, attprojw, fcw, fcprojw of each block), so the values depend
    // neither on the layout nor on the order in which units are made.
    // Units of the whole model (full_layout): a tensor-parallel rank then keeps its slices, so that every tp makes
    // the same model.
    void init_unit(uint64_t seed, int u, float* unit_device) {
        const ParameterLayout& layout = full_layout;
        const size_t C = config.channels, V = config.vocab_size, L = config.num_layers;
        const float std = 0.02f, residual_std = 0.02f / sqrtf(2.0f * L);
        const size_t begin = layout.unit_offset(u);
        auto at = [&](size_t offset) { return unit_device + (offset - begin); };
        auto seed_of = [&](uint64_t tensor_id) { return splitmix64(seed * 1000003ull + tensor_id); };
        cudaCheck(cudaMemsetAsync(unit_device, 0, layout.unit_size(u) * sizeof(float), stream));
        if (u == layout.wte_unit) {
            fill_normal(at(layout.wte), V * C, std, seed_of(0), stream);
        } else if (u == layout.wpe_unit) {
            fill_normal(at(layout.wpe), (size_t)config.max_seq_len * C, std, seed_of(1), stream);
        } else if (u != layout.lnf_unit) {
            const int l = u - layout.first_block_unit;
            fill_constant(at(layout.tensor(l, LN1W)), C, 1.0f, stream);
            fill_normal(at(layout.tensor(l, QKVW)), 3 * C * C, std, seed_of(2 + 4 * l), stream);
            fill_normal(at(layout.tensor(l, ATTPROJW)), C * C, residual_std, seed_of(3 + 4 * l), stream);
            fill_constant(at(layout.tensor(l, LN2W)), C, 1.0f, stream);
            fill_normal(at(layout.tensor(l, FCW)), 4 * C * C, std, seed_of(4 + 4 * l), stream);
            fill_normal(at(layout.tensor(l, FCPROJW)), 4 * C * C, residual_std, seed_of(5 + 4 * l), stream);
        } else {
            fill_constant(at(layout.lnfw), C, 1.0f, stream);
        }
    }

    // values: the whole model in full_layout (as read_model_file gives it); this rank keeps its part. With one
    // rank per layer the layouts are the same and `values` goes on as it is (no copy of the whole model).
    void set_parameters(const std::vector<float>& values) {
        if (holds_whole_model()) zero->set_parameters(values);
        else zero->set_parameters(local_part(values));
    }
    bool holds_whole_model() const { return layout.tp == 1 && layout.part.first && layout.part.last; }
    // This rank's part (layout: its pipeline stage's tensor-parallel slices) of a whole-model array (full_layout).
    std::vector<float> local_part(const std::vector<float>& full) const {
        std::vector<float> local(layout.total, 0.0f);
        layout.for_each_full_run(full_layout, mesh.tensor.rank, [&](size_t from, size_t to, size_t n) {
            std::copy(full.begin() + from, full.begin() + from + n, local.begin() + to);
        });
        return local;
    }
    // The inverse, over the tensor-parallel and pipeline groups: every rank's part (gathered, fp32 host) put back
    // into the whole model. A collective of both groups. With one rank per layer `local` is the whole model and
    // is returned as it is (moved when the caller passes a temporary). The pipeline stages' layouts are made from
    // `stage_parts` (every stage's StageModel).
    std::vector<float> assemble_whole_model(std::vector<float> local, const std::vector<StageModel>& stage_parts) const {
        if (holds_whole_model()) return local;
        const std::vector<std::vector<float>> slices = tensor_parallel.all_gather_host(local, stream, pg);
        const ParameterLayout whole_stage(config, 8 * mesh.data.size, 1, layout.part);
        std::vector<float> stage(whole_stage.total, 0.0f);  // this stage's tensor-parallel slices in a tp = 1 layout of its part
        for (int q = 0; q < layout.tp; q++)
            layout.for_each_full_run(whole_stage, q, [&](size_t to, size_t from, size_t n) {
                std::copy(slices[q].begin() + from, slices[q].begin() + from + n, stage.begin() + to);
            });
        std::vector<float> full(full_layout.total, 0.0f);
        // the stages' parts, padded to one length for the gather; the tied wte is taken from the first stage
        size_t longest = 0;
        for (const StageModel& m : stage_parts) longest = std::max(longest, ParameterLayout(config, 8 * mesh.data.size, 1, m).total);
        stage.resize(longest, 0.0f);
        const std::vector<std::vector<float>> parts = gather_over_pipeline(stage);
        for (int s = (int)parts.size() - 1; s >= 0; s--) {
            const ParameterLayout l(config, 8 * mesh.data.size, 1, stage_parts[s]);
            l.for_each_full_run(full_layout, 0, [&](size_t to, size_t from, size_t n) {
                std::copy(parts[s].begin() + from, parts[s].begin() + from + n, full.begin() + to);
            });
        }
        return full;
    }
    std::vector<std::vector<float>> gather_over_pipeline(const std::vector<float>& local) const {
        TensorParallel<floatX> over_stages;  // its host gather, on the pipeline group
        over_stages.group = mesh.pipeline;
        return over_stages.all_gather_host(local, stream, pg);
    }
    // Every stage's part of the model (set by the pipeline; the whole model by default).
    std::vector<StageModel> stage_parts = {StageModel()};
    // The whole model's parameters in compute precision (full_layout, fp32 host): a collective of every rank.
    std::vector<float> full_parameters_host() { return assemble_whole_model(zero->parameters_host(), stage_parts); }
    // Made unit by unit through one unit-sized device buffer: a model too large for one GPU still initialises.
    void init_parameters(uint64_t seed) {
        const std::vector<size_t>& offsets = full_layout.unit_offsets;
        const std::vector<size_t>& sizes = full_layout.unit_sizes;
        float* staging;
        cudaCheck(cudaMalloc(&staging, *std::max_element(sizes.begin(), sizes.end()) * sizeof(float)));
        std::vector<float> values(full_layout.total, 0.0f);
        for (size_t u = 0; u < sizes.size(); u++) {
            init_unit(seed, (int)u, staging);
            cudaCheck(cudaMemcpyAsync(values.data() + offsets[u], staging, sizes[u] * sizeof(float), cudaMemcpyDeviceToHost, stream));
            cudaCheck(cudaStreamSynchronize(stream));
        }
        cudaCheck(cudaFree(staging));
        set_parameters(values);
    }

    // Copies a device buffer of `count` elements to fp32 on the host.
    template <typename T> static std::vector<float> to_host(const T* device, size_t count) {
        std::vector<T> raw(count);
        cudaCheck(cudaMemcpy(raw.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
        return host_floats(raw);
    }

    // Where each tensor lives now (under ZeRO-3 a block's parameters are a gathered copy); l is a local block.
    floatX* param(int l, BlockTensor t) const { return zero->unit_params(layout.block_unit(l)) + layout.block_offset[t]; }
    floatX* grad(int l, BlockTensor t) const {  // null when frozen
        floatX* unit = zero->unit_grads(layout.block_unit(l));
        return unit ? unit + layout.block_offset[t] : nullptr;
    }
    floatX* wte_params() const { return zero->unit_params(layout.wte_unit); }
    floatX* wte_grads() const { return zero->unit_grads(layout.wte_unit); }
    floatX* wpe_params() const { return zero->unit_params(layout.wpe_unit); }
    floatX* wpe_grads() const { return zero->unit_grads(layout.wpe_unit); }
    floatX* final_norm_params() const { return zero->unit_params(layout.lnf_unit); }  // lnfw, then lnfb
    floatX* final_norm_grads() const { return zero->unit_grads(layout.lnf_unit); }

    // Uploads a batch (host int32, B*T each; targets may be null) and the encoder's token grouping into the
    // tokens of activation set `slot` of chunk k (the only one without pipeline parallelism).
    // Does not wait for the GPU, only for the copy that last used this staging buffer.
    // k = -1: the sets that forward_all_stages reads tokens from (set 0 of the first and of the last chunk).
    void upload_batch(const int* inputs, const int* targets, int k = -1, int slot = 0) {
        if (k < 0) {
            upload_batch(inputs, targets, 0, 0);
            if (num_chunks() > 1) upload_batch(inputs, targets, num_chunks() - 1, 0);
            return;
        }
        const size_t N = (size_t)B * T;
        for (size_t i = 0; i < N; i++)
            if (inputs[i] < 0 || inputs[i] >= config.vocab_size || (targets && (targets[i] < 0 || targets[i] >= config.vocab_size)))
                die("token id out of range [0, " + std::to_string(config.vocab_size) + ") in the batch");
        int* s = staging[staging_index];
        pg.wait_event(staging_free[staging_index]);  // bounded: a failed peer cannot hang this wait
        memcpy(s, inputs, N * sizeof(int));
        if (targets) memcpy(s + N, targets, N * sizeof(int));
        else memset(s + N, 0, N * sizeof(int));
        ActivationSet<floatX>& set = sets[k][slot];
        set.num_buckets = encoder_buckets(inputs, (int)N, config.vocab_size, s + 2 * N, bucket_counts);
        const size_t ints = 2 * N + 2 * set.num_buckets + 1 + N;
        cudaCheck(cudaMemcpyAsync(set.tokens, s, ints * sizeof(int), cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaEventRecord(staging_free[staging_index], stream));
        staging_index ^= 1;
    }

    // LoRA: out += s B A dropout(x) after the base product of target t in block l (no-op without LoRA).
    void adapt_forward(int l, int t, floatX* out, const floatX* x) {
        if (!lora.enabled() || !lora.targets_has(t)) return;
        const int N = B * T, C = config.channels;
        const floatX* params = adapters->unit_params(l + 1) - adapter_layout->unit_begin(l);
        lora_forward(out, lora_u_buffer(l, t), adapter_input(l, t, x), params + adapter_layout->a(l, t),
                     params + adapter_layout->b(l, t), lora.scale(), N, lora_in(t, C), lora_out(t, C), lora.rank, stream);
    }
    // LoRA backward of target t in block l: dA, dB, and the adapter's share of dx (added; masked under dropout).
    void adapt_backward(int l, int t, floatX* dx, const floatX* dout, const floatX* x) {
        if (!lora.enabled() || !lora.targets_has(t)) return;
        const int N = B * T, C = config.channels, in = lora_in(t, C);
        const floatX* x_in = adapter_input(l, t, x);
        const floatX* params = adapters->unit_params(l + 1) - adapter_layout->unit_begin(l);
        floatX* grads = adapters->unit_grads(l + 1) - adapter_layout->unit_begin(l);
        const bool dropout = x_in != x;
        // under dropout the adapter's dx goes through the same mask again (into the dropout buffer, whose
        // input copy the products have read by then), and is added afterwards
        lora_backward(dropout ? lora_dropped : dx, grads + adapter_layout->a(l, t), grads + adapter_layout->b(l, t), lora_du,
                      dout, lora_u_buffer(l, t), x_in, params + adapter_layout->a(l, t), params + adapter_layout->b(l, t),
                      lora.scale(), N, in, lora_out(t, C), lora.rank, !dropout, stream);
        if (dropout) {
            lora_dropout(lora_dropped, lora_dropped, (long)N * in, lora.dropout, dropout_seed(l, t), stream);
            accumulate_into(dx, lora_dropped, (long)N * in, stream);
        }
    }
    // The adapter's input: x, or while training with dropout, dropout(x) from this micro-step's masks.
    const floatX* adapter_input(int l, int t, const floatX* x) {
        if (!training || lora.dropout <= 0.0f) return x;
        lora_dropout(lora_dropped, x, (long)B * T * lora_in(t, config.channels), lora.dropout, dropout_seed(l, t), stream);
        return lora_dropped;
    }
    floatX* lora_u_buffer(int l, int t) const {
        int index = 0;
        for (int k = 0; k < t; k++) index += lora.targets_has(k);
        return lora_u + ((size_t)l * __builtin_popcount(lora.targets) + index) * B * T * lora.rank;
    }
    uint64_t dropout_seed(int l, int t) const { return splitmix64(lora_dropout_seed ^ (uint64_t)(l * kLoraTargets + t + 1)); }

    // --recompute levels 1-2 rebuild fch_gelu from the kept fch with gelu_forward, which differs in the last bit
    // from the fused product's GELU (of the unrounded pre-activation): those levels run the GELU as separate
    // kernels both ways, so they equal --gelu-fusion 0 bit for bit
    bool fused_gelu_without_adapter(int t) const {
        return gelu_fusion && matmul_gelu_epilogues<floatX>() && !(lora.enabled() && lora.targets_has(t)) &&
               (recompute == kKeepAll || recompute >= kRecomputeBlock);
    }
    bool fc_gelu_fused() const { return fused_gelu_without_adapter(kLoraFc); }
    bool fcproj_dgelu_fused() const { return fused_gelu_without_adapter(kLoraFcProj); }
    // Under tensor parallelism this rank computes `heads()` of the attention's heads and `hidden()` of the MLP's
    // 4C units (distributed/tensor_parallel.cuh); with tp = 1 all of them.
    int heads() const { return config.num_heads / layout.tp; }
    int hidden() const { return 4 * config.channels / layout.tp; }
    int head_size() const { return config.channels / config.num_heads; }
    // Row-parallel products add their bias on tensor-parallel rank 0 only: g's sum then holds it once.
    const floatX* row_parallel_bias(int l, BlockTensor t) const { return tensor_parallel.rank() == 0 ? param(l, t) : nullptr; }
    // Rows of the LayerNorm and residual regions on this rank: all B*T, or 1/tp of them under sequence parallelism.
    int region_rows() const { return B * T / sequence_split(); }

    // Where the LayerNorm/residual regions meet the split products: the f and g operators of
    // distributed/tensor_parallel.cuh, with sequence parallelism's all-gathers and reduce-scatters in place of the
    // identities and all-reduces.
    // f forward: the input of a column-parallel product, whole (sequence parallelism gathers the rows).
    const floatX* column_input(const floatX* x) {
        if (sequence_split() == 1) return x;
        tensor_parallel.all_gather_rows(x, gathered, (size_t)region_rows() * config.channels, stream);
        return gathered;
    }
    // g forward: the partial sums in `partial` (B*T rows) summed into this rank's rows: into `rows` when given
    // under sequence parallelism, else in place (the result is `partial`, or a pointer into it).
    const floatX* row_output(floatX* partial, floatX* rows = nullptr) {
        const size_t n = (size_t)region_rows() * config.channels;
        if (sequence_split() == 1) {
            tensor_parallel.g_forward(partial, n, stream);
            return partial;
        }
        floatX* mine = rows != nullptr ? rows : partial + tensor_parallel.rank() * n;
        tensor_parallel.reduce_scatter_rows(partial, mine, n, stream);
        return mine;
    }
    // g backward: the gradient of a row-parallel product's output (dresidual), whole; under sequence parallelism
    // gathered into proj_out, which the backward does not otherwise use.
    const floatX* row_output_grad(const floatX* dresidual) {
        if (sequence_split() == 1) return dresidual;
        tensor_parallel.all_gather_rows(dresidual, proj_out, (size_t)region_rows() * config.channels, stream);
        return proj_out;
    }
    // The backward of a column-parallel product y = x W^T + b (x whole; the LoRA adapter `target` of block l, or -1):
    // dx = dy W into dbtc, whose sum over the tensor-parallel group (f's backward) runs on the group's stream while
    // dW += dy^T x and db compute. Returns this rank's rows of dx.
    const floatX* column_parallel_backward(floatX* dweight, floatX* dbias, const floatX* weight, const floatX* dy, const floatX* x,
                                           int out_features, int l, int target) {
        const int N = B * T, C = config.channels;
        matmul_backward_input(dbtc, dy, weight, N, C, out_features, stream);
        if (target >= 0) adapt_backward(l, target, dbtc, dy, x);
        const bool scatter = sequence_split() > 1;
        const floatX* dx = tensor_parallel.begin_f_backward(dbtc, (size_t)(scatter ? region_rows() : N) * C, scatter, stream);
        matmul_backward_weights(dweight, dbias, reduce_scratch, dy, x, N, C, out_features, stream);
        tensor_parallel.end_f_backward(stream);
        return dx;
    }
    // Sequence parallelism leaves each rank the LayerNorm parameters' gradient over its own rows only: summed over
    // the tensor-parallel group when this micro-step's gradients are reduced (accumulated gradients are summed once).
    void sum_layernorm_grads(floatX* grads, size_t n) {
        if (sequence_split() > 1 && grads != nullptr && trained().reduces_this_micro_step()) tensor_parallel.sum_over_ranks(grads, n, stream);
    }

    // fch = ln2 FCW^T + FCB (+ the fc adapter) and fch_gelu = gelu(fch) of local block l (this rank's hidden units).
    void fc_gelu_forward(int l, LayerActivations<floatX>& a) {
        const int N = B * T, C = config.channels;
        const floatX* x = column_input(a.ln2);
        if (fc_gelu_fused()) {
            matmul_forward_gelu(a.fch_gelu, a.fch, x, param(l, FCW), param(l, FCB), N, C, hidden(), stream);
            return;
        }
        matmul_forward(a.fch, x, param(l, FCW), param(l, FCB), N, C, hidden(), stream);
        adapt_forward(l, kLoraFc, a.fch, x);
        gelu_forward(a.fch_gelu, a.fch, (long)N * hidden(), stream);
    }
    // Block l from its normalised input ln1 to the MLP's hidden activations: attention (qkv column-parallel,
    // attn-proj row-parallel and g), the residual add and the second LayerNorm, fc and the GELU.
    void attention_and_fc_forward(int l, LayerActivations<floatX>& a, const floatX* residual_in) {
        const int N = B * T, C = config.channels, Cs = heads() * head_size();
        const floatX* x = column_input(a.ln1);
        matmul_forward(a.qkv, x, param(l, QKVW), param(l, QKVB), N, C, 3 * Cs, stream);
        adapt_forward(l, kLoraQkv, a.qkv, x);
        flash_attention_forward(a.atty, a.lse, a.qkv, B, T, heads(), head_size(), stream);
        matmul_forward(proj_out, a.atty, param(l, ATTPROJW), row_parallel_bias(l, ATTPROJB), N, Cs, C, stream);
        adapt_forward(l, kLoraAttnProj, proj_out, a.atty);
        residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, residual_in, row_output(proj_out),
                                   param(l, LN2W), param(l, LN2B), region_rows(), C, stream);
        fc_gelu_forward(l, a);
    }

    // Forward over the uploaded batch (activation set 0 of the whole model). With dloss != 0 the classifier also
    // leaves the logits gradient in `logits` (see fused_classifier); with dloss == 0 `logits` keeps the logits
    // (this rank's vocabulary columns). Per-row losses in `losses` when `with_loss`.
    void forward(bool with_loss, float dloss) {
        forward_chunk(0, sets[0][0]);
        head_forward(sets[0][0], with_loss, dloss);
    }

    // The forward of chunk k on activation set `set`: the embeddings first when the chunk begins the model (the
    // set's input otherwise holds the residual stream, received from the previous stage), then its blocks. The
    // chunk's output is its last block's residual3, which is the residual stream that goes on to the next chunk, or
    // when the chunk ends the model, the input of the final LayerNorm, whose output (lnf) it also computes.
    void forward_chunk(int k, ActivationSet<floatX>& set) {
        const int C = config.channels, Vl = layout.vocab_rows(), Nr = region_rows();
        const int begin = chunk_begin[k], end = chunk_begin[k + 1];
        zero->begin_forward();
        if (adapters) adapters->wait_for_parameters();
        if (model_begins(k)) {
            // vocabulary-parallel: each rank looks up the tokens of its rows (zeros for the others) and rank 0 adds
            // the positions; g sums them (into this rank's rows under sequence parallelism)
            const floatX* wpe = tensor_parallel.rank() == 0 ? wpe_params() : nullptr;
            floatX* lookup = sequence_split() > 1 ? proj_out : set.input;
            encoder_forward(lookup, set.tokens, wte_params(), wpe, B, T, C, stream, tensor_parallel.rank() * Vl, Vl);
            row_output(lookup, set.input);
        }
        // the final LayerNorm's rows: under sequence parallelism this rank's part of lnf, gathered before the LM head
        floatX* lnf_rows = lnf + (sequence_split() > 1 ? (size_t)tensor_parallel.rank() * Nr * C : 0);
        for (int l = begin; l < end; l++) {
            LayerActivations<floatX>& a = set.layers[l - begin];
            zero->before_unit_forward(layout.block_unit(l));
            // the first LayerNorm of a block was fused into the previous block's closing residual add, except in
            // the chunk's first block
            if (l == begin) layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, set.input, param(l, LN1W), param(l, LN1B), Nr, C, stream);
            const floatX* residual_in = l == begin ? set.input : set.layers[l - begin - 1].residual3;
            attention_and_fc_forward(l, a, residual_in);
            matmul_forward(proj_out, a.fch_gelu, param(l, FCPROJW), row_parallel_bias(l, FCPROJB), N(), hidden(), C, stream);
            adapt_forward(l, kLoraFcProj, proj_out, a.fch_gelu);
            // residual3 = residual2 + mlp, normalised by the next block's first LayerNorm (or the final one); under
            // ZeRO-3 the next block's LayerNorm parameters are its gathered copy. At the end of a chunk that does
            // not end the model the next block is on another stage (or chunk): the residual add alone.
            const floatX* mlp = row_output(proj_out);
            if (l + 1 < end) {
                zero->before_unit_forward(layout.block_unit(l + 1));
                LayerActivations<floatX>& next = set.layers[l + 1 - begin];
                residual_layernorm_forward(a.residual3, next.ln1, next.ln1_mean, next.ln1_rstd, a.residual2, mlp,
                                           param(l + 1, LN1W), param(l + 1, LN1B), Nr, C, stream);
            } else if (model_ends(k)) {
                zero->before_unit_forward(layout.lnf_unit);
                residual_layernorm_forward(a.residual3, lnf_rows, lnf_mean, lnf_rstd, a.residual2, mlp, final_norm_params(),
                                           final_norm_params() + C, Nr, C, stream);
            } else {
                residual_forward(a.residual3, a.residual2, mlp, (long)Nr * C, stream);
            }
            zero->after_unit_forward(layout.block_unit(l));
        }
    }
    // A forward of the uploaded batch through every stage (evaluation and sampling): the chunks in the order of
    // their virtual stages (chunk k of stage s is virtual stage k x P + s), each stage receiving the residual
    // stream from the one before and sending its chunk's output on, on the compute stream: one micro-batch flows
    // along a chain, which cannot deadlock. The loss (with_loss) and the logits end on the last stage.
    void forward_all_stages(bool with_loss) {
        const int P = mesh.pipeline.size, stage = mesh.pipeline.rank;
        if (P == 1) {
            forward(with_loss, 0.0f);
            return;
        }
        const size_t n = (size_t)region_rows() * config.channels;
        for (int k = 0; k < num_chunks(); k++) {
            ActivationSet<floatX>& set = sets[k][0];
            const int virtual_stage = k * P + stage;
            if (!model_begins(k))
                ncclCheck(ncclRecv(set.input, n, nccl_type<floatX>(), (virtual_stage - 1) % P, mesh.pipeline.comm, stream));
            forward_chunk(k, set);
            if (model_ends(k)) head_forward(set, with_loss, 0.0f);
            else ncclCheck(ncclSend(chunk_output(k, set), n, nccl_type<floatX>(), (virtual_stage + 1) % P, mesh.pipeline.comm, stream));
        }
    }
    // The chunk's output: the residual stream that the next chunk (on the next stage) receives.
    floatX* chunk_output(int k, ActivationSet<floatX>& set) const { return set.layers[chunk_begin[k + 1] - chunk_begin[k] - 1].residual3; }
    int N() const { return B * T; }

    // The LM head and the loss, after the model's last chunk ran on `set`: logits = lnf wte^T (this rank's
    // vocabulary columns; f: lnf enters the LM head) and the vocabulary-parallel cross-entropy.
    void head_forward(ActivationSet<floatX>& set, bool with_loss, float dloss) {
        const int C = config.channels, Vl = layout.vocab_rows(), Nr = region_rows();
        if (sequence_split() > 1) tensor_parallel.all_gather_rows(lnf + (size_t)tensor_parallel.rank() * Nr * C, lnf, (size_t)Nr * C, stream);
        matmul_forward(logits, lnf, wte_params(), (const floatX*)nullptr, N(), C, Vl, stream);
        const int* targets = set.tokens + (size_t)B * T;
        if (with_loss) tensor_parallel.cross_entropy(logits, losses, targets, dloss, N(), config.vocab_size, Vl, stream);
    }

    // Refills the activations of local block l that --recompute did not keep, with the forward's own kernels:
    // the kernels are deterministic, so the backward sees exactly the values the forward computed.
    void recompute_activations(int l, LayerActivations<floatX>& a, const floatX* residual_in) {
        if (recompute == kKeepAll) return;
        const int N = B * T, C = config.channels, Nr = region_rows();
        if (recompute >= kRecomputeGeluLayerNorm)
            layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual_in, param(l, LN1W), param(l, LN1B), Nr, C, stream);
        if (recompute >= kRecomputeBlock) {
            attention_and_fc_forward(l, a, residual_in);
            return;
        }
        if (recompute >= kRecomputeGeluLayerNorm)
            layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, param(l, LN2W), param(l, LN2B), Nr, C, stream);
        gelu_forward(a.fch_gelu, a.fch, (long)N * hidden(), stream);  // the forward's own kernel (see fc_gelu_fused)
    }

    // Adds the last forward's per-row losses to the sums that take_mean_loss() reads.
    void accumulate_loss() {
        if (layout.part.last) accumulate_losses(loss_sums, losses, B * T, stream);  // the other stages' sums stay zero
        forwards_summed++;
    }

    // Backward after forward(true, dloss != 0). Gradients accumulate (+=) over the micro-steps of a step
    // (between zero_grad() calls); `last_micro_step` tells data parallelism when to reduce them.
    // Under tensor parallelism the gradients entering the replicated regions are summed by f's backward (after
    // the LM head, fc and qkv); the row-parallel products need no collective (g's backward is the identity), except
    // under sequence parallelism, whose f and g swap all-reduces for reduce-scatters and all-gathers.
    void backward(bool last_micro_step = true) {
        trained().begin_backward(last_micro_step);
        head_backward(sets[0][0]);
        backward_chunk(0, sets[0][0]);
        trained().end_backward();
    }

    // The LM head's and the final LayerNorm's backward, after head_forward with dloss != 0 left the logits'
    // gradient in `logits`: set.dresidual becomes d(loss)/d(the last block's residual3).
    void head_backward(ActivationSet<floatX>& set) {
        const int C = config.channels, Vl = layout.vocab_rows(), Nr = region_rows();
        cudaCheck(cudaMemsetAsync(set.dresidual, 0, (size_t)Nr * C * sizeof(floatX), stream));
        const floatX* dlnf = column_parallel_backward(wte_grads(), nullptr, wte_params(), logits, lnf, Vl, -1, -1);
        layernorm_backward(set.dresidual, final_norm_grads(), reduce_scratch, dlnf, set.layers.back().residual3,
                           final_norm_params(), lnf_mean, lnf_rstd, Nr, C, stream);
        sum_layernorm_grads(final_norm_grads(), 2 * (size_t)C);
        if (adapters) {
            adapters->after_unit_backward(config.num_layers + 1);
            return;
        }
        zero->after_unit_backward(layout.lnf_unit);
        if (layout.part.tied_copy()) zero->after_unit_backward(layout.wte_unit);  // the LM head's copy of wte is complete
    }

    // The backward of chunk k on `set`, whose dresidual holds d(loss)/d(the chunk's output): from the head
    // (head_backward), or received from the next stage. Leaves d(loss)/d(the chunk's input) in set.dresidual
    // (sent to the previous stage) or, when the chunk begins the model, adds it into the embeddings' gradients.
    void backward_chunk(int k, ActivationSet<floatX>& set) {
        const int N = B * T, C = config.channels, Vl = layout.vocab_rows(), Nr = region_rows();
        const int Cs = heads() * head_size();
        const int begin = chunk_begin[k], end = chunk_begin[k + 1];
        floatX* dresidual = set.dresidual;
        for (int l = end - 1; l >= begin; l--) {
            LayerActivations<floatX>& a = set.layers[l - begin];
            const floatX* residual_in = l == begin ? set.input : set.layers[l - begin - 1].residual3;
            zero->before_unit_backward(layout.block_unit(l));
            if (adapters) adapters->before_unit_backward(l + 1);
            recompute_activations(l, a, residual_in);
            // dresidual is d(loss)/d(residual3); it passes unchanged to residual2 and into the MLP, where dbig
            // becomes d(loss)/d(fch): the GELU's backward in the product's epilogue, unless fc-proj's adapter
            // must add its share before it
            const bool dgelu_fused = fcproj_dgelu_fused();
            const floatX* dmlp = row_output_grad(dresidual);
            matmul_backward(dbig, grad(l, FCPROJW), grad(l, FCPROJB), reduce_scratch, dmlp, a.fch_gelu,
                            param(l, FCPROJW), N, hidden(), C, stream, dgelu_fused ? a.fch : nullptr);
            if (!dgelu_fused) {
                adapt_backward(l, kLoraFcProj, dbig, dmlp, a.fch_gelu);
                gelu_backward(dbig, a.fch, dbig, (long)N * hidden(), stream);
            }
            // ln2 re-gathered under sequence parallelism
            const floatX* dln2 = column_parallel_backward(grad(l, FCW), grad(l, FCB), param(l, FCW), dbig, column_input(a.ln2),
                                                          hidden(), l, kLoraFc);
            layernorm_backward(dresidual, grad(l, LN2W), reduce_scratch, dln2, a.residual2, param(l, LN2W),
                               a.ln2_mean, a.ln2_rstd, Nr, C, stream);
            // now d(loss)/d(residual2), which passes to residual_in and into the attention
            const floatX* dattention = row_output_grad(dresidual);
            matmul_backward(dbtc, grad(l, ATTPROJW), grad(l, ATTPROJB), reduce_scratch, dattention, a.atty,
                            param(l, ATTPROJW), N, Cs, C, stream);
            adapt_backward(l, kLoraAttnProj, dbtc, dattention, a.atty);
            flash_attention_backward(dbig, dbtc, a.qkv, a.atty, a.lse, attention_scratch, B, T, heads(), head_size(),
                                     deterministic_attention, stream);
            const floatX* dln1 = column_parallel_backward(grad(l, QKVW), grad(l, QKVB), param(l, QKVW), dbig, column_input(a.ln1),
                                                          3 * Cs, l, kLoraQkv);
            layernorm_backward(dresidual, grad(l, LN1W), reduce_scratch, dln1, residual_in, param(l, LN1W),
                               a.ln1_mean, a.ln1_rstd, Nr, C, stream);
            sum_layernorm_grads(grad(l, LN1W), 2 * (size_t)C);  // LN1W, LN1B and LN2W, LN2B are adjacent pairs
            sum_layernorm_grads(grad(l, LN2W), 2 * (size_t)C);
            if (adapters) adapters->after_unit_backward(l + 1);
            else zero->after_unit_backward(layout.block_unit(l));
        }
        if (!model_begins(k)) return;
        const int* bucket_data = set.tokens + 2 * (size_t)B * T;
        if (wte_grads() != nullptr)  // not frozen
            encoder_backward(wte_grads(), wpe_grads(), row_output_grad(dresidual), bucket_data, set.num_buckets, B, T, C, stream,
                             tensor_parallel.rank() * Vl, Vl);
        if (adapters) {
            adapters->after_unit_backward(0);
            return;
        }
        zero->after_unit_backward(layout.wpe_unit);
        zero->after_unit_backward(layout.wte_unit);
    }

    void zero_grad() { trained().zero_grad(); }

    // Enqueues the gathering of every rank's summed per-row losses (a collective: all ranks call it), their
    // copy to the host and the clearing of the sums, without waiting: the training step asks for them before
    // the optimizer step and reads them after its one wait, so no second round trip between ranks follows it.
    // The data-parallel group's rows: a tensor-parallel group computes the same losses on every one of its ranks.
    void request_losses() {
        const size_t N = (size_t)B * T;
        // the last pipeline stage computed the losses: summed over the stages, whose other sums are zero
        if (mesh.pipeline.size > 1) ncclCheck(ncclAllReduce(loss_sums, loss_sums, N, ncclFloat32, ncclSum, mesh.pipeline.comm, stream));
        if (mesh.data.size > 1) ncclCheck(ncclAllGather(loss_sums, all_loss_sums, N, ncclFloat32, mesh.data.comm, stream));
        cudaCheck(cudaMemcpyAsync(loss_sums_host, all_loss_sums, mesh.data.size * N * sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaMemsetAsync(loss_sums, 0, N * sizeof(float), stream));
        losses_requested = true;
    }
    // Mean loss over all ranks' rows of the forwards accumulated since the last call (e.g. the micro-steps of one
    // step). Synchronises; the rows are summed in double on the host in rank order, so the value does not depend
    // on a reduction order.
    float take_mean_loss() {
        if (!losses_requested) request_losses();
        pg.synchronize(stream);
        losses_requested = false;
        const size_t rows = (size_t)mesh.data.size * B * T;
        double total = 0.0;
        for (size_t i = 0; i < rows; i++) total += loss_sums_host[i];
        const float mean = (float)(total / ((double)rows * std::max(1, forwards_summed)));
        forwards_summed = 0;
        return mean;
    }

    // Returns once every rank has called it: a one-float all-reduce, waited for within --nccl-timeout.
    void barrier() {
        pg.all_reduce_sum(device_scalar, stream);
        pg.synchronize(stream);
    }

    // d(summed loss)/d(row loss) for a micro-step: the mean over all rows of all micro-steps, scaled (fp16).
    // Each rank takes the mean of its own rows; the gradient reduction averages over ranks.
    float dloss(int grad_accum_steps) const {
        return (lora.enabled() ? adapters : zero)->scaler.scale / ((float)B * T * grad_accum_steps);
    }
    void enable_loss_scaling(float initial_scale, int growth_interval) {
        trained().scaler.scale = initial_scale;
        trained().scaler.growth_interval = growth_interval;
    }

    // LoRA adapters: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's default Linear init), B = 0, from `seed`.
    void init_adapters(uint64_t seed) {
        float* staging;
        const size_t n = adapter_layout->total;
        cudaCheck(cudaMalloc(&staging, n * sizeof(float)));
        cudaCheck(cudaMemsetAsync(staging, 0, n * sizeof(float), stream));
        for (int l = 0; l < config.num_layers; l++)
            for (int t = 0; t < kLoraTargets; t++)
                if (lora.targets_has(t)) {
                    const int in = lora_in(t, config.channels);
                    fill_uniform(staging + adapter_layout->a(l, t), (long)lora.rank * in, 1.0f / sqrtf((float)in),
                                 splitmix64(seed * 1000003ull + l * kLoraTargets + t), stream);
                }
        std::vector<float> values(n);
        cudaCheck(cudaMemcpyAsync(values.data(), staging, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(staging));
        adapters->set_parameters(values);
    }
};

// ---------------------------------------------------------------------------------------------
// Command-line flags. One table drives both the parser and --help, so they cannot disagree.

struct Options {
    std::string model = "d12";  // dN, or an llm.c model file to start from
    int layers = -1, heads = -1, channels = -1, max_seq_len = -1;  // override the dN shape (random init only)
    std::string train_data = "data/tinyshakespeare/tinyshakespeare_train_*.bin";
    std::string val_data = "data/tinyshakespeare/tinyshakespeare_val_*.bin";
    std::string tokenizer = "data/gpt2";
    int batch_size = 4;
    int seq_len = 1024;
    long total_batch_tokens = -1;  // -1: one micro-batch per step
    std::string precision = "bf16";
    int tf32 = 0;
    float lr = 3e-4f;
    int warmup_steps = 0;
    std::string lr_schedule = "cosine";
    float final_lr_frac = 1.0f;
    float weight_decay = 0.1f;
    float grad_clip = 1.0f;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    int steps = -1;  // -1: one epoch of the training data
    int val_every = 20, val_batches = 20;
    int sample_every = 20, sample_tokens = 64, top_k = 40;
    float temperature = 1.0f;
    int hellaswag = 0;
    std::string hellaswag_data = "data/hellaswag/hellaswag_val.jsonl.xz";
    std::string prompt = "";
    int generate = 0;  // > 0: only generate this many tokens from --prompt with --model, no training
    std::string output_dir = "";
    int checkpoint_every = 0;
    int resume = 0;
    long seed = 1337;
    int shuffle = 0;
    float fp16_initial_scale = 65536.0f;
    int fp16_growth_interval = 2000;
    int zero_stage = 1;
    int tensor_parallel = 1;
    int sequence_parallel = 0;
    int pipeline_parallel = 1;
    std::string pipeline_schedule = "1f1b";
    int virtual_stages = 0;  // 0: 2 for the interleaved schedule, 1 for 1f1b
    std::string pipeline_layers = "";
    int lora_rank = 0;
    float lora_alpha = -1.0f;  // -1: the rank
    std::string lora_targets = "qkv";
    float lora_dropout = 0.0f;
    float lora_weight_decay = 0.0f;
    std::string lora_load = "", lora_save = "", lora_merge = "";
    int deterministic = 0;
    int gelu_fusion = 1;
    int recompute = 0;
    std::string nccl_init_file = "";
    int nccl_timeout = 600;
};

struct Flag {
    const char* name;
    const char* alias;  // llm.c's single-letter flag where one exists
    enum Kind { INT, LONG, FLOAT, STRING } kind;
    void* target;
    const char* help;
};

static std::vector<Flag> flag_table(Options& o) {
    return {
        {"--model", "-e", Flag::STRING, &o.model, "dN (d12 = 124M, d24, d36, d48 = 1.5B, any N) or an llm.c model file to start from"},
        {"--init-from", nullptr, Flag::STRING, &o.model, "same as --model (a model file)"},
        {"--layers", nullptr, Flag::INT, &o.layers, "override the number of layers (-1: from --model)"},
        {"--heads", nullptr, Flag::INT, &o.heads, "override the number of attention heads (-1: from --model)"},
        {"--channels", nullptr, Flag::INT, &o.channels, "override the width C (-1: from --model)"},
        {"--max-seq-len", nullptr, Flag::INT, &o.max_seq_len, "override the maximum sequence length (-1: 1024)"},
        {"--train-data", "-i", Flag::STRING, &o.train_data, "training token shards (glob)"},
        {"--val-data", "-j", Flag::STRING, &o.val_data, "validation token shards (glob; empty: none)"},
        {"--tokenizer", nullptr, Flag::STRING, &o.tokenizer, "folder with encoder.json and vocab.bpe, or an llm.c tokenizer file, to decode samples"},
        {"--batch-size", "-b", Flag::INT, &o.batch_size, "sequences per micro-batch on each GPU"},
        {"--seq-len", "-t", Flag::INT, &o.seq_len, "tokens per sequence"},
        {"--total-batch-tokens", "-d", Flag::LONG, &o.total_batch_tokens, "tokens per optimizer step over all GPUs; gradient accumulation fills it (-1: batch-size x seq-len x GPUs)"},
        {"--precision", nullptr, Flag::STRING, &o.precision, "bf16 | fp16 (dynamic loss scaling) | fp32"},
        {"--tf32", nullptr, Flag::INT, &o.tf32, "1: allow TF32 matrix products in fp32 mode"},
        {"--lr", "-l", Flag::FLOAT, &o.lr, "maximum learning rate"},
        {"--warmup-steps", "-u", Flag::INT, &o.warmup_steps, "linear warm-up steps"},
        {"--lr-schedule", nullptr, Flag::STRING, &o.lr_schedule, "decay after warm-up: cosine | linear | constant"},
        {"--final-lr-frac", "-q", Flag::FLOAT, &o.final_lr_frac, "final learning rate as a fraction of --lr"},
        {"--weight-decay", "-c", Flag::FLOAT, &o.weight_decay, "AdamW weight decay (matrices and embeddings only)"},
        {"--grad-clip", nullptr, Flag::FLOAT, &o.grad_clip, "clip the global gradient norm to this (0: off)"},
        {"--beta1", nullptr, Flag::FLOAT, &o.beta1, "AdamW beta1"},
        {"--beta2", nullptr, Flag::FLOAT, &o.beta2, "AdamW beta2"},
        {"--eps", nullptr, Flag::FLOAT, &o.eps, "AdamW epsilon"},
        {"--steps", "-x", Flag::INT, &o.steps, "optimizer steps (-1: one epoch of --train-data; 0: only evaluate)"},
        {"--val-every", "-v", Flag::INT, &o.val_every, "validation loss every N steps (0: never)"},
        {"--val-batches", "-m", Flag::INT, &o.val_batches, "batches per validation"},
        {"--hellaswag", nullptr, Flag::INT, &o.hellaswag, "1: HellaSwag accuracy at every validation (with --steps 0: evaluate only)"},
        {"--hellaswag-data", nullptr, Flag::STRING, &o.hellaswag_data, "HellaSwag items (jsonl, plain or .xz)"},
        {"--sample-every", "-s", Flag::INT, &o.sample_every, "print a text sample every N steps (0: never)"},
        {"--sample-tokens", "-g", Flag::INT, &o.sample_tokens, "tokens per sample"},
        {"--temperature", nullptr, Flag::FLOAT, &o.temperature, "sampling temperature"},
        {"--top-k", nullptr, Flag::INT, &o.top_k, "sample from the k most likely tokens (0: all)"},
        {"--prompt", nullptr, Flag::STRING, &o.prompt, "text that samples continue (after <|endoftext|>)"},
        {"--generate", nullptr, Flag::INT, &o.generate, "only generate this many tokens from --prompt with --model, then exit (no training data needed)"},
        {"--output-dir", "-o", Flag::STRING, &o.output_dir, "folder for checkpoints and the log (empty: none)"},
        {"--checkpoint-every", "-n", Flag::INT, &o.checkpoint_every, "write a checkpoint every N steps (0: never)"},
        {"--resume", "-y", Flag::INT, &o.resume, "1: continue from the latest checkpoint in --output-dir"},
        {"--seed", nullptr, Flag::LONG, &o.seed, "seed for initialisation, shuffling, rounding and sampling"},
        {"--shuffle", nullptr, Flag::INT, &o.shuffle, "1: shuffle shard and window order each epoch"},
        {"--fp16-initial-scale", nullptr, Flag::FLOAT, &o.fp16_initial_scale, "fp16: initial loss scale"},
        {"--fp16-growth-interval", nullptr, Flag::INT, &o.fp16_growth_interval, "fp16: double the loss scale after this many clean steps"},
        {"--gelu-fusion", "-ge", Flag::INT, &o.gelu_fusion, "1: the MLP's GELU in the cuBLASLt products' epilogues (not with --recompute 1-2 or LoRA on fc/fc-proj); 0: separate kernels"},
        {"--recompute", "-r", Flag::INT, &o.recompute, "activations recomputed in the backward instead of kept: 0 none, 1 GELU, 2 GELU + LayerNorm, 3 whole block"},
        {"--deterministic", nullptr, Flag::INT, &o.deterministic, "1: bitwise reproducible runs (attention dQ summed in a fixed order, cuBLASLt's first heuristic choice for every product); 0: atomic dQ sums and products autotuned at their first call, faster"},
        {"--lora-rank", nullptr, Flag::INT, &o.lora_rank, "LoRA: adapter rank r (0: off, train the whole model)"},
        {"--lora-alpha", nullptr, Flag::FLOAT, &o.lora_alpha, "LoRA: alpha; the adapters are scaled by alpha / r (-1: r)"},
        {"--lora-targets", nullptr, Flag::STRING, &o.lora_targets, "LoRA: comma list of qkv, attn-proj, fc, fc-proj"},
        {"--lora-dropout", nullptr, Flag::FLOAT, &o.lora_dropout, "LoRA: dropout on the adapters' input while training"},
        {"--lora-weight-decay", nullptr, Flag::FLOAT, &o.lora_weight_decay, "LoRA: AdamW weight decay of A and B"},
        {"--lora-load", nullptr, Flag::STRING, &o.lora_load, "LoRA: start from this adapter file (its rank, alpha and targets)"},
        {"--lora-save", nullptr, Flag::STRING, &o.lora_save, "LoRA: write the adapters to this file at the end"},
        {"--lora-merge", nullptr, Flag::STRING, &o.lora_merge, "LoRA: write base + adapters as an llm.c model file at the end"},
        {"--zero-stage", "-z", Flag::INT, &o.zero_stage, "ZeRO stage with several GPUs: 0 replicate all, 1 shard optimizer state, 2 + gradients, 3 + parameters"},
        {"--tensor-parallel", nullptr, Flag::INT, &o.tensor_parallel, "GPUs that split every layer (Megatron tensor parallelism); the rest of the GPUs are data parallel"},
        {"--sequence-parallel", nullptr, Flag::INT, &o.sequence_parallel, "1: with --tensor-parallel > 1, the LayerNorm and residual activations split along the sequence (less memory)"},
        {"--pipeline-parallel", nullptr, Flag::INT, &o.pipeline_parallel, "GPUs that split the layers into pipeline stages; the gradient-accumulation steps are the micro-batches"},
        {"--pipeline-schedule", nullptr, Flag::STRING, &o.pipeline_schedule, "1f1b | interleaved (several model chunks per stage: a smaller bubble; micro-batches a multiple of the stages)"},
        {"--virtual-stages", nullptr, Flag::INT, &o.virtual_stages, "model chunks per stage for --pipeline-schedule interleaved (0: 2 for interleaved, 1 for 1f1b)"},
        {"--pipeline-layers", nullptr, Flag::STRING, &o.pipeline_layers, "layers per (virtual) stage, e.g. 3,3,2,4 (empty: an even split, the remainder to the last stages)"},
        {"--nccl-init-file", nullptr, Flag::STRING, &o.nccl_init_file, "several GPUs without MPI: a new file on a shared file system for the NCCL id (empty: TCP to MASTER_ADDR:MASTER_PORT)"},
        {"--nccl-timeout", nullptr, Flag::INT, &o.nccl_timeout, "seconds before a hung or failed rank ends the job"},
    };
}

static std::string flag_value_string(const Flag& f) {
    char buf[64];
    switch (f.kind) {
        case Flag::INT: return std::to_string(*(int*)f.target);
        case Flag::LONG: return std::to_string(*(long*)f.target);
        case Flag::FLOAT: snprintf(buf, sizeof(buf), "%g", *(float*)f.target); return buf;
        case Flag::STRING: return "\"" + *(std::string*)f.target + "\"";
    }
    return "";
}

static void print_help(const char* program) {
    Options defaults;
    printf("usage: %s [flags]\nTrains GPT-2 on one or more GPUs (several: launch with mpirun, srun or scripts/launch.sh).\n"
           "Flags (default in brackets):\n", program);
    for (const Flag& f : flag_table(defaults)) {
        std::string names = std::string(f.name) + (f.alias ? std::string(", ") + f.alias : "");
        printf("  %-26s %s [%s]\n", names.c_str(), f.help, flag_value_string(f).c_str());
    }
    printf("  %-26s %s\n", "--help, -h", "print this help");
}

static Options parse_options(int argc, char** argv) {
    Options o;
    std::vector<Flag> table = flag_table(o);
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") { print_help(argv[0]); exit(EXIT_SUCCESS); }
        std::string value;
        bool has_value = false;
        size_t eq = arg.find('=');
        if (arg.rfind("--", 0) == 0 && eq != std::string::npos) { value = arg.substr(eq + 1); arg = arg.substr(0, eq); has_value = true; }
        const Flag* flag = nullptr;
        for (const Flag& f : table)
            if (arg == f.name || (f.alias && arg == f.alias)) flag = &f;
        if (flag == nullptr) die("unknown flag '" + arg + "' (see --help)");
        if (!has_value) {
            if (i + 1 >= argc) die("flag " + arg + " needs a value");
            value = argv[++i];
        }
        char* end = nullptr;
        errno = 0;
        switch (flag->kind) {
            case Flag::INT: { long v = strtol(value.c_str(), &end, 10); *(int*)flag->target = (int)v; break; }
            case Flag::LONG: *(long*)flag->target = strtol(value.c_str(), &end, 10); break;
            case Flag::FLOAT: *(float*)flag->target = strtof(value.c_str(), &end); break;
            case Flag::STRING: *(std::string*)flag->target = value; break;
        }
        if (flag->kind != Flag::STRING && (value.empty() || *end != '\0' || errno != 0))
            die("flag " + arg + " expects " + (flag->kind == Flag::FLOAT ? "a number" : "an integer") + ", got '" + value + "'");
    }
    return o;
}

// ---------------------------------------------------------------------------------------------
// Learning-rate schedule (docs/formats.md): linear warm-up, then cosine, linear or constant decay to
// final_frac * max_lr at the last step.
inline float learning_rate(int step, int total_steps, float max_lr, int warmup, float final_frac, const std::string& schedule) {
    if (step < warmup) return max_lr * (step + 1) / warmup;
    const float final_lr = max_lr * final_frac;
    const float progress = (float)(step - warmup) / std::max(1, total_steps - warmup);
    if (schedule == "cosine") return final_lr + 0.5f * (max_lr - final_lr) * (1.0f + cosf((float)M_PI * progress));
    if (schedule == "linear") return max_lr - (max_lr - final_lr) * progress;
    return max_lr;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: DIR/model_NNNNNNNN.bin, an ordinary llm.c model file of the parameters as trained (bf16 in
// bf16 mode, else fp32), and one DIR/state_NNNNNNNN_RRRRR.bin per rank that holds optimizer state (its
// shard of master weights and Adam moments: stages 1-3; at stage 0 the copy of data-parallel rank 0, one per
// tensor-parallel rank), the loss scale and the data position. Every file goes through a temporary name; the
// model file is written last, after all ranks finished their state, so it marks a complete checkpoint. A
// checkpoint resumes on any number of GPUs, any tensor-parallel degree and any ZeRO stage: the optimizer state
// is reassembled into the whole model (unit by unit from the shards, slice by slice from the tensor-parallel
// ranks) and cut into the new ranks' pieces.

constexpr int kStateMagic = 20261126, kStateVersion = 4;  // 3: the writer's mesh (tensor parallelism); 4: its pipeline stage's part

inline std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/%s_%08d.bin", kind, step);
    return dir + name;
}
inline std::string state_path(const std::string& dir, int step, int rank) {
    char name[64];
    snprintf(name, sizeof(name), "/state_%08d_%05d.bin", step, rank);
    return dir + name;
}

// The highest step with a model file (the last file a checkpoint writes) in `dir`, or -1.
inline int latest_checkpoint(const std::string& dir) {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return -1;
    int best = -1;
    while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;  // model_NNNNNNNN.bin
        if (name.size() != 18 || name.rfind("model_", 0) != 0 || name.compare(14, 4, ".bin") != 0) continue;
        best = std::max(best, atoi(name.substr(6, 8).c_str()));
    }
    closedir(d);
    return best;
}

// mkdir -p: creates `dir` and any missing parents.
inline void make_directories(const std::string& dir) {
    for (size_t i = 1; i <= dir.size(); i++) {
        if (i < dir.size() && dir[i] != '/') continue;
        const std::string prefix = dir.substr(0, i);
        if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) die(prefix + ": cannot create folder: " + strerror(errno));
    }
}

inline void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts) {
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (f == nullptr) die(tmp + ": cannot create: " + strerror(errno));
    bool ok = true;
    for (auto& part : parts) ok = ok && fwrite(part.first, 1, part.second, f) == part.second;
    ok = (fclose(f) == 0) && ok;
    if (!ok) die(tmp + ": write failed (disk full?)");
    if (rename(tmp.c_str(), path.c_str()) != 0) die(path + ": rename failed: " + strerror(errno));
}

struct StateHeader {
    int step, precision;
    int data_parallel, tensor_parallel, pipeline_parallel, data_rank, tensor_rank, pipeline_rank;  // the writer's mesh and its place in it
    int stage, has_master, clean_steps;
    float loss_scale;
    long long skipped_steps, optimizer_elements;
};
// The header's second half holds the writer's pipeline stage's part of the model (StageModel): first, last, the
// number of blocks and their layer indices.
constexpr int kStatePartOffset = 128, kStateMaxLayers = 256 - kStatePartOffset - 3;

// One rank's state file: header, then its master weights (if kept), Adam m and v, and the data position.
inline void write_state_file(const std::string& path, const StateHeader& h, const StageModel& part, const std::vector<float>& master,
                             const std::vector<float>& m, const std::vector<float>& v, const DataLoaderState& data_state) {
    int header[256] = {};
    header[0] = kStateMagic;
    header[1] = kStateVersion;
    header[2] = (int)sizeof(StateHeader);
    header[3] = (int)sizeof(DataLoaderState);
    memcpy(&header[4], &h, sizeof(h));
    if ((int)part.layers.size() > kStateMaxLayers)
        die(path + ": a state file records at most " + std::to_string(kStateMaxLayers) + " blocks per pipeline stage, this stage holds " +
            std::to_string(part.layers.size()));
    header[kStatePartOffset] = part.first;
    header[kStatePartOffset + 1] = part.last;
    header[kStatePartOffset + 2] = (int)part.layers.size();
    std::copy(part.layers.begin(), part.layers.end(), header + kStatePartOffset + 3);
    write_file_atomically(path, {{header, sizeof(header)},
                                 {master.data(), master.size() * sizeof(float)},
                                 {m.data(), m.size() * sizeof(float)},
                                 {v.data(), v.size() * sizeof(float)},
                                 {&data_state, sizeof(data_state)}});
}

inline StateHeader read_state_header(FILE* f, const std::string& path, StageModel* part = nullptr) {
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256 || header[0] != kStateMagic)
        die(path + ": not a train_gpt state file (bad magic)");
    if (header[1] != kStateVersion || header[2] != (int)sizeof(StateHeader) || header[3] != (int)sizeof(DataLoaderState))
        die(path + ": state file version " + std::to_string(header[1]) + " is not the supported " + std::to_string(kStateVersion));
    StateHeader h;
    memcpy(&h, &header[4], sizeof(h));
    const int blocks = header[kStatePartOffset + 2];
    if (blocks < 1 || blocks > kStateMaxLayers) die(path + ": corrupt header (" + std::to_string(blocks) + " blocks)");
    if (part != nullptr) {
        part->first = header[kStatePartOffset] != 0;
        part->last = header[kStatePartOffset + 1] != 0;
        part->layers.assign(header + kStatePartOffset + 3, header + kStatePartOffset + 3 + blocks);
    }
    return h;
}

// The optimizer state of checkpoint `step`, whatever mesh and stage wrote it, as whole-model arrays in `full`
// (tp = 1, this run's padding): for each tensor-parallel rank of the writer, its data-parallel shards are put
// back together unit by unit, then its slices go to their places in the whole model.
struct SavedOptimizerState {
    StateHeader header;               // rank 0's
    std::vector<float> master, m, v;  // master empty when the precision keeps none
    DataLoaderState data_state;
};
inline SavedOptimizerState read_optimizer_state(const std::string& dir, int step, const ParameterLayout& full) {
    SavedOptimizerState saved;
    const std::string first = state_path(dir, step, 0);
    FILE* f = fopen(first.c_str(), "rb");
    if (f == nullptr) die(first + ": cannot open: " + strerror(errno));
    saved.header = read_state_header(f, first);
    fclose(f);
    const StateHeader& s = saved.header;
    MeshShape writer;
    writer.tp = s.tensor_parallel;
    writer.pp = s.pipeline_parallel;
    writer.dp = s.data_parallel;
    const int files = s.stage >= 1 ? s.data_parallel : 1;  // at stage 0 data rank 0's file holds everything
    std::vector<std::vector<float>*> arrays = {&saved.m, &saved.v};
    if (s.has_master) arrays.insert(arrays.begin(), &saved.master);
    for (auto* a : arrays) a->assign(full.total, 0.0f);
    std::vector<std::vector<float>> local(arrays.size());
    // from the last stage to the first: the first stage's tied wte (the same values) overwrites the last's copy
    for (int p = writer.pp - 1; p >= 0; p--) {
        for (int t = 0; t < s.tensor_parallel; t++) {
            StageModel part;
            std::unique_ptr<ParameterLayout> slices;  // one writer rank's layout, from its header
            for (int d = 0; d < files; d++) {
                MeshCoord coord;
                coord.tp = t;
                coord.pp = p;
                coord.dp = d;
                const int rank = mesh_rank(writer, coord);
                const std::string path = state_path(dir, step, rank);
                FILE* g = fopen(path.c_str(), "rb");
                if (g == nullptr)
                    die(path + ": cannot open (a checkpoint written by " + std::to_string(writer.world()) + " ranks needs all their state files)");
                StageModel file_part;
                const StateHeader h = read_state_header(g, path, &file_part);
                if (d == 0) {
                    part = file_part;
                    slices.reset(new ParameterLayout(full.config, 8 * s.data_parallel, s.tensor_parallel, part));
                    for (auto& a : local) a.assign(slices->total, 0.0f);
                }
                const size_t expected = s.stage >= 1 ? slices->total / s.data_parallel : slices->total;
                if (h.data_parallel != s.data_parallel || h.tensor_parallel != s.tensor_parallel || h.pipeline_parallel != s.pipeline_parallel ||
                    h.stage != s.stage || h.data_rank != d || h.tensor_rank != t || h.pipeline_rank != p || file_part.layers != part.layers ||
                    h.optimizer_elements != (long long)expected)
                    die(path + ": does not belong with " + first);
                std::vector<float> buffer(expected);
                for (size_t k = 0; k < arrays.size(); k++) {
                    if (fread(buffer.data(), sizeof(float), expected, g) != expected) die(path + ": truncated");
                    size_t next = 0;  // the saved slices of all units, back to back (whole units at stage 0)
                    for (int u = 0; u < slices->num_units(); u++) {
                        const size_t slice = s.stage >= 1 ? slices->unit_size(u) / s.data_parallel : slices->unit_size(u);
                        const size_t begin = s.stage >= 1 ? d * slice : 0;
                        std::copy(buffer.begin() + next, buffer.begin() + next + slice, local[k].begin() + slices->unit_offset(u) + begin);
                        next += slice;
                    }
                }
                if (rank == 0 && fread(&saved.data_state, sizeof(saved.data_state), 1, g) != 1)
                    die(path + ": truncated while reading the data position");
                fclose(g);
            }
            slices->for_each_full_run(full, t, [&](size_t to, size_t from, size_t n) {
                for (size_t k = 0; k < arrays.size(); k++) std::copy(local[k].begin() + from, local[k].begin() + from + n, arrays[k]->begin() + to);
            });
        }
    }
    return saved;
}

// Every rank writes its optimizer state (at stage 0 one rank of each data-parallel group: the copies are the
// same); rank 0 writes the whole model, gathered from all ranks, as an ordinary llm.c model file.
template <typename floatX>
void save_checkpoint(const std::string& dir, int step, GPT2<floatX>& model, const DataLoaderState& data_state) {
    ZeroOptimizer<floatX>& zero = *model.zero;
    const ProcessGroup& pg = model.pg;
    const ProcessMesh& mesh = model.mesh;
    if (pg.is_main()) make_directories(dir);
    std::vector<float> params = model.full_parameters_host();  // a collective (ZeRO-3, tensor parallelism): every rank takes part
    if (zero.stage() >= 1 || mesh.data.rank == 0) {
        StateHeader h{step, (int)PrecisionOf<floatX>::value, mesh.data.size, mesh.tensor.size, mesh.pipeline.size, mesh.data.rank, mesh.tensor.rank,
                      mesh.pipeline.rank, zero.stage(), ZeroOptimizer<floatX>::kHasMaster, zero.scaler.clean_steps, zero.scaler.scale,
                      zero.scaler.skipped_steps, (long long)zero.optimizer_elements()};
        std::vector<float> master, m, v;
        zero.optimizer_state_to_host(master, m, v);
        make_directories(dir);  // other nodes may not share rank 0's file system view yet
        write_state_file(state_path(dir, step, pg.rank), h, model.layout.part, master, m, v, data_state);
    }
    // barrier: every state file is complete before the model file marks the checkpoint as usable
    model.barrier();
    if (pg.is_main())
        write_model_file(checkpoint_path(dir, "model", step), model.full_layout, params, std::is_same<floatX, __nv_bfloat16>::value);
}

// Restores parameters, optimizer state and loss scale; returns the data position to restore. The checkpoint
// may come from any mesh and ZeRO stage.
template <typename floatX>
DataLoaderState load_checkpoint(const std::string& dir, int step, GPT2<floatX>& model) {
    ZeroOptimizer<floatX>& zero = *model.zero;
    std::vector<float> values;
    const std::string model_path = checkpoint_path(dir, "model", step);
    ModelConfig config = read_model_file(model_path, values, 8 * model.mesh.data.size);
    if (ParameterLayout(config).count != model.full_layout.count) die(model_path + ": shape differs from the model being trained");
    model.set_parameters(values);
    const SavedOptimizerState saved = read_optimizer_state(dir, step, model.full_layout);
    if (saved.header.precision != (int)PrecisionOf<floatX>::value) die(state_path(dir, step, 0) + ": saved in another --precision");
    auto mine = [&](const std::vector<float>& whole) {  // at tp = 1 the whole model is this rank's layout: no slicing copy
        return model.holds_whole_model() ? zero.optimizer_part(whole) : zero.optimizer_part(model.local_part(whole));
    };
    zero.optimizer_state_from_host(saved.master.empty() ? saved.master : mine(saved.master), mine(saved.m), mine(saved.v));
    zero.scaler.scale = saved.header.loss_scale;
    zero.scaler.clean_steps = saved.header.clean_steps;
    zero.scaler.skipped_steps = saved.header.skipped_steps;
    return saved.data_state;
}

// ---------------------------------------------------------------------------------------------
// Sampling: each new token is one forward over the sequence so far (no KV cache: a 64-token sample of
// d12 takes ~64 short forwards, well under a second, so the periodic samples cost little).

template <typename floatX>
std::vector<int> generate(GPT2<floatX>& model, std::vector<int> tokens, int count, float temperature, int top_k, uint64_t seed) {
    const int B = model.B, T = model.T, Vp = model.config.padded_vocab_size, V = model.config.vocab_size;
    const int Vl = model.layout.vocab_rows();
    // every new length is a new product shape, run once: timing its candidates would cost more than it saves
    const bool autotune = matmul_context().autotune;
    matmul_context().autotune = false;
    floatX* row;  // the last position's logits, whole (their columns are spread over tensor-parallel ranks)
    cudaCheck(cudaMalloc(&row, Vp * sizeof(floatX)));
    std::vector<float> logits;
    std::vector<std::pair<float, int>> candidates(V);
    std::vector<int> window;
    for (int i = 0; i < count; i++) {
        const int start = std::max(0, (int)tokens.size() - T);  // a window of at most T tokens
        const int t = (int)tokens.size() - start;
        // sequence parallelism splits the rows evenly: pad the window at its end, which the causal attention
        // keeps from changing the positions before it (T is a multiple of the split)
        const int split = model.sequence_split();
        window.assign(tokens.begin() + start, tokens.end());
        window.resize((t + split - 1) / split * split, 0);
        model.B = 1;
        model.T = (int)window.size();
        model.upload_batch(window.data(), nullptr);
        model.forward_all_stages(false);
        // the logits are on the last pipeline stage, which sends the row to the others: every rank draws the same token
        if (model.layout.part.last) model.tensor_parallel.all_gather(model.logits + (size_t)(t - 1) * Vl, row, Vl, model.stream);
        const Communicator& stages = model.mesh.pipeline;
        if (stages.size > 1) ncclCheck(ncclBroadcast(row, row, Vp, nccl_type<floatX>(), stages.size - 1, stages.comm, model.stream));
        model.pg.synchronize(model.stream);
        logits = GPT2<floatX>::to_host(row, V);
        for (int j = 0; j < V; j++) candidates[j] = {logits[j] / std::max(temperature, 1e-6f), j};
        int k = (top_k > 0 && top_k < V) ? top_k : V;
        std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(), std::greater<>());
        double sum = 0.0;
        for (int j = 0; j < k; j++) sum += exp(candidates[j].first - candidates[0].first);
        const double u = (splitmix64(seed + i) >> 11) * (1.0 / 9007199254740992.0) * sum;
        double acc = 0.0;
        int chosen = candidates[k - 1].second;
        for (int j = 0; j < k; j++) {
            acc += exp(candidates[j].first - candidates[0].first);
            if (u < acc) { chosen = candidates[j].second; break; }
        }
        tokens.push_back(chosen);
    }
    cudaCheck(cudaFree(row));
    model.B = B;
    model.T = T;
    matmul_context().autotune = autotune;
    return tokens;
}

// Encodes prompts and decodes samples with the GPT-2 vocabulary when one is found (a folder with
// encoder.json and vocab.bpe, or a decode-only llm.c tokenizer file); token ids otherwise.
struct SampleText {
    std::unique_ptr<GPT2Tokenizer> tokenizer;
    TokenDecoder decoder;
    bool can_decode = false;
    explicit SampleText(const std::string& path) {
        try {
            struct stat st;
            if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
                tokenizer.reset(new GPT2Tokenizer(GPT2Tokenizer::load(path)));
                decoder = tokenizer->decoder();
            } else {
                decoder = TokenDecoder::load_llmc(path);
            }
            can_decode = true;
        } catch (const std::exception& e) {
            fprintf(stderr, "warning: no tokenizer (%s): samples are printed as token ids\n", e.what());
        }
    }
    // <|endoftext|> followed by the prompt's tokens.
    std::vector<int> prompt_tokens(const std::string& prompt) const {
        std::vector<int> tokens = {50256};
        if (prompt.empty()) return tokens;
        if (!tokenizer) die("--prompt needs the GPT-2 vocabulary: --tokenizer must be a folder with encoder.json and vocab.bpe");
        std::vector<int> encoded = tokenizer->encode(prompt);
        tokens.insert(tokens.end(), encoded.begin(), encoded.end());
        return tokens;
    }
    std::string operator()(const std::vector<int>& ids) const {
        if (can_decode) return decoder.decode(ids);
        std::string s;
        for (int id : ids) s += std::to_string(id) + " ";
        return s;
    }
};

// --generate: continue --prompt with a trained (or freshly initialised) model, and report the speed.
template <typename floatX>
int generate_only(const Options& o, ProcessGroup& pg, const ModelConfig& config, const std::vector<float>* initial_values) {
    if (pg.world > 1) die("--generate runs on one GPU");
    pg.connect({o.nccl_init_file, o.nccl_timeout});
    matmul_setup(o.tf32 != 0);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    {
        const ProcessMesh single;  // one rank: no communicators
        GPT2<floatX> model(config, pg, single, 0, stream);
        model.allocate(1, config.max_seq_len);
        if (initial_values) model.set_parameters(*initial_values);
        else model.init_parameters((uint64_t)o.seed);
        SampleText text(o.tokenizer);
        std::vector<int> prompt = text.prompt_tokens(o.prompt);
        const auto start = std::chrono::steady_clock::now();
        std::vector<int> tokens = generate(model, prompt, o.generate, o.temperature, o.top_k, (uint64_t)o.seed);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        printf("%s\n---\ngenerated %d tokens in %.2f s (%.1f tokens/s; no KV cache: each token re-runs the prefix)\n",
               text(std::vector<int>(tokens.begin() + 1, tokens.end())).c_str(), o.generate, seconds, o.generate / seconds);
    }
    cudaCheck(cudaStreamDestroy(stream));
    matmul_teardown();
    return 0;
}

// ---------------------------------------------------------------------------------------------
// HellaSwag: each item's four candidate completions are four rows; the completion whose tokens have the
// lowest mean loss is the model's answer. Candidates are short (at most 149 tokens), so the eval runs the
// model at a reduced sequence length with proportionally more rows: the same activation buffers, a fraction
// of the work of padding every row to T.

template <typename floatX>
HellaSwagScore evaluate_hellaswag(GPT2<floatX>& model, const std::vector<HellaSwagItem>& items, const GPT2Tokenizer& tokenizer) {
    const int B = model.B, T = model.T;
    const int longest = HellaSwagBatcher(items, tokenizer, 4, T).max_length();
    const int multiple = 8 * model.sequence_split();  // sequence parallelism: rows split evenly (T is a multiple of the split)
    const int eval_T = std::min(T, (longest + multiple - 1) / multiple * multiple);
    const int eval_B = std::max(4, (int)((long)B * T / eval_T) / 4 * 4);
    if ((long)eval_B * eval_T > (long)B * T) die("HellaSwag needs --batch-size x --seq-len >= 4 x the longest candidate");
    HellaSwagBatcher batcher(items, tokenizer, eval_B, eval_T);
    const size_t N = (size_t)eval_B * eval_T;
    std::vector<int32_t> inputs(N), targets(N);
    std::vector<uint8_t> mask(N);
    std::vector<float> losses(N);
    HellaSwagScore score;
    model.B = eval_B;
    model.T = eval_T;
    for (int b = 0; b < batcher.num_batches(); b++) {
        batcher.fill(b, inputs.data(), targets.data(), mask.data());
        model.upload_batch(inputs.data(), targets.data());
        model.forward(true, 0.0f);
        cudaCheck(cudaMemcpyAsync(losses.data(), model.losses, N * sizeof(float), cudaMemcpyDeviceToHost, model.stream));
        cudaCheck(cudaStreamSynchronize(model.stream));
        batcher.score(b, losses.data(), score);
    }
    model.B = B;
    model.T = T;
    return score;
}

// ---------------------------------------------------------------------------------------------
// The training loop

// The pipeline's shape from the flags: schedule, chunks per stage and layers per virtual stage.
struct PipelineOptions {
    PipelineScheduleKind kind = PipelineScheduleKind::kOneFOneB;
    int virtual_stages = 1;
    std::vector<int> per_virtual_stage;
};

template <typename floatX>
int train(const Options& o, ProcessGroup& pg, const MeshShape& shape, const ModelConfig& config, const std::vector<float>* initial_values,
          const LoraSpec& lora, const std::vector<float>* initial_adapters, const PipelineOptions& po) {
    const int B = o.batch_size, T = o.seq_len;  // per data-parallel rank (its tensor-parallel ranks share the rows)
    const MeshCoord coord = mesh_coord(shape, pg.rank);
    const long tokens_per_micro = (long)B * T * shape.dp;
    const long total_batch_tokens = o.total_batch_tokens > 0 ? o.total_batch_tokens : tokens_per_micro;
    if (total_batch_tokens % tokens_per_micro != 0)
        die("--total-batch-tokens " + std::to_string(total_batch_tokens) + " is not a multiple of --batch-size x --seq-len" +
            (shape.dp > 1 ? " x data-parallel ranks (" + std::to_string(shape.dp) + ")" : std::string()) + " = " + std::to_string(tokens_per_micro));
    const int grad_accum = (int)(total_batch_tokens / tokens_per_micro);
    // pipeline parallelism: the gradient-accumulation steps are the micro-batches
    const std::string schedule_problem = pipeline_schedule_problem(po.kind, shape.pp, grad_accum, po.virtual_stages, config.num_layers);
    if (!schedule_problem.empty()) die(schedule_problem);
    std::vector<StageModel> stage_parts;
    std::vector<std::vector<int>> stage_chunks(shape.pp);
    for (int s = 0; s < shape.pp; s++) stage_parts.push_back(pipeline_stage_model(po.per_virtual_stage, shape.pp, s, &stage_chunks[s]));
    std::unique_ptr<PipelineSchedule> schedule;
    if (shape.pp > 1) schedule.reset(new PipelineSchedule(make_pipeline_schedule(po.kind, shape.pp, grad_accum, po.virtual_stages)));
    FILE* out = pg.is_main() ? stdout : fopen("/dev/null", "w");  // rank 0 reports

    // data first: a bad shard is reported before anything else can fail (also on a machine without a GPU)
    int device_count = 0;
    const bool have_gpu = cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0;
    HostAllocator pinned{[](size_t bytes) { void* p; cudaCheck(cudaMallocHost(&p, bytes)); return p; },
                         [](void* p) { cudaFreeHost(p); }};
    DataLoaderConfig train_config;
    train_config.pattern = o.train_data;
    train_config.B = B;
    train_config.T = T;
    train_config.shuffle = o.shuffle != 0;
    train_config.seed = (uint64_t)o.seed;
    train_config.vocab_size = config.vocab_size;
    train_config.num_ranks = shape.dp;
    train_config.rank = coord.dp;
    train_config.allocator = have_gpu ? pinned : HostAllocator::system();
    std::unique_ptr<DataLoader> train_loader, val_loader;
    try {
        train_loader.reset(new DataLoader(train_config));
        if (!o.val_data.empty() && o.val_every > 0) {
            DataLoaderConfig val_config = train_config;
            val_config.pattern = o.val_data;
            val_config.shuffle = false;
            val_loader.reset(new DataLoader(val_config));
        }
    } catch (const std::exception& e) {
        die(e.what());
    }
    if (!have_gpu) die("no CUDA GPU found");
    pg.connect({o.nccl_init_file, o.nccl_timeout});
    ProcessMesh mesh;
    mesh.build(pg, shape);
    matmul_setup(o.tf32 != 0, o.deterministic == 0);
    const int steps = o.steps >= 0 ? o.steps : std::max<long>(1, (long)train_loader->batches_per_epoch() / grad_accum);
    const int val_batches = val_loader ? (int)std::min<uint64_t>(o.val_batches, val_loader->batches_per_epoch()) : 0;

    // memory plan, predicted before allocating
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    GPT2<floatX> model(config, pg, mesh, o.zero_stage, stream, lora, stage_parts[coord.pp], stage_chunks[coord.pp]);
    model.stage_parts = stage_parts;
    const int stage = model.trained().stage();
    const int split = o.sequence_parallel ? shape.tp : 1;
    // pipeline stage s's plan: its part of the model and one activation set per micro-batch in flight on each chunk
    auto stage_plan = [&](int s, int with_split) {
        const ActivationPlan sets{stage_chunks[s], schedule ? schedule->stages[s].slots : std::vector<int>{1}, stage_parts[s].last};
        return GPT2<floatX>::plan(config, B, T, shape.dp, shape.tp, with_split, stage, o.recompute, lora, stage_parts[s], sets);
    };
    const MemoryPlan plan = stage_plan(coord.pp, split);
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    fprintf(out, "model: %d layers, %d heads, %d channels, max T %d, vocab %d (padded %d): %zu parameters\n", config.num_layers,
            config.num_heads, config.channels, config.max_seq_len, config.vocab_size, config.padded_vocab_size, model.num_parameters());
    fprintf(out, "batch: %d x %d tokens x %d data-parallel ranks, %d micro-steps per step = %ld tokens per step; %d steps; precision %s\n", B, T,
            shape.dp, grad_accum, total_batch_tokens, steps, o.precision.c_str());
    // ZeRO's model states per GPU for Psi parameters on N data-parallel ranks (stages 0-3); under tensor
    // parallelism Psi is one rank's share: its slices plus the replicated tensors
    const double P = (double)model.layout.count, N = shape.dp;
    const double zero_formula = std::vector<double>{16 * P, 4 * P + 12 * P / N, 2 * P + 14 * P / N, 16 * P / N}[stage];
    if (pg.world > 1)
        fprintf(out, "mesh: %d GPUs (%s) = data parallel %d x pipeline parallel %d x tensor parallel %d; ZeRO stage %d: model states per GPU by "
                     "the formula %.2f GiB for %zu parameters per rank (bf16 parameters and gradients, fp32 master + Adam)\n",
                pg.world, pg.launcher.c_str(), shape.dp, shape.pp, shape.tp, stage, gib((size_t)zero_formula), model.layout.count);
    if (schedule) {
        fprintf(out, "pipeline: %d stages, schedule %s with %d model chunk%s per stage, %d micro-batches: bubble %.1f%% by the formula; per stage:\n",
                shape.pp, pipeline_schedule_name(po.kind), po.virtual_stages, po.virtual_stages > 1 ? "s" : "", grad_accum,
                100.0 * pipeline_bubble_theory(po.kind, shape.pp, grad_accum, po.virtual_stages));
        for (int s = 0; s < shape.pp; s++) {
            const MemoryPlan p = stage_plan(s, split);
            std::string chunks, slots;
            for (size_t k = 0; k < stage_chunks[s].size(); k++) {
                chunks += (k ? "+" : "") + std::to_string(stage_chunks[s][k]);
                slots += (k ? "+" : "") + std::to_string(schedule->stages[s].slots[k]);
            }
            fprintf(out, "  stage %d: %s blocks%s%s, %s micro-batches in flight: parameters+gradients+optimizer %.2f GiB, activations %.2f GiB, total %.2f GiB\n",
                    s, chunks.c_str(), stage_parts[s].first ? " + embeddings" : "", stage_parts[s].last ? " + final LayerNorm and LM head" : "",
                    slots.c_str(), gib(p.parameters + p.gradients + p.master_weights + p.adam_state), gib(p.activations), gib(p.total()));
        }
    }
    if (lora.enabled()) {
        const MemoryPlan full = GPT2<floatX>::plan(config, B, T, shape.dp, shape.tp, split, stage, o.recompute);
        const size_t states = plan.parameters + plan.gradients + plan.master_weights + plan.adam_state;
        const size_t full_states = full.parameters + full.gradients + full.master_weights + full.adam_state;
        fprintf(out, "LoRA r=%d alpha=%g targets %s: %zu trainable parameters (%.3f%% of %zu); model states %.3f GiB vs %.3f GiB for full fine-tuning\n",
                lora.rank, lora.alpha, o.lora_targets.c_str(), model.trainable_parameters(),
                100.0 * model.trainable_parameters() / model.num_parameters(), model.num_parameters(), gib(states), gib(full_states));
    }
    fprintf(out, "memory plan per GPU (GiB): parameters %.2f | gradients %.2f | master weights %.2f | Adam m+v %.2f | activations %.2f | scratch %.2f | total %.2f of %.2f free\n",
            gib(plan.parameters), gib(plan.gradients), gib(plan.master_weights), gib(plan.adam_state), gib(plan.activations),
            gib(plan.scratch), gib(plan.total()), gib(free_bytes));
    if (split > 1)
        fprintf(out, "sequence parallel: activations %.2f GiB per GPU, against %.2f GiB without it (the LayerNorm and residual regions hold 1/%d of the rows)\n",
                gib(plan.activations), gib(stage_plan(coord.pp, 1).activations), split);
    if (plan.total() > free_bytes)
        die("the plan needs " + std::to_string(gib(plan.total())).substr(0, 5) + " GiB but the GPU has " +
            std::to_string(gib(free_bytes)).substr(0, 5) + " GiB free: lower --batch-size (and raise --total-batch-tokens to keep the step size)" +
            (stage < 3 ? ", or raise --zero-stage" : ""));
    const size_t in_use_before = device_memory_in_use();
    model.deterministic_attention = o.deterministic != 0;
    model.gelu_fusion = o.gelu_fusion != 0;
    model.sequence_parallel = split > 1;
    model.allocate(B, T, o.recompute, schedule ? schedule->stages[coord.pp].slots : std::vector<int>());
    std::unique_ptr<PipelineParallel<GPT2<floatX>>> pipeline;
    if (schedule) {
        pipeline.reset(new PipelineParallel<GPT2<floatX>>(*schedule, mesh.pipeline));
        pipeline->allocate();
    }
    fprintf(out, "device memory in use after allocation: %.2f GiB (plan %.2f GiB + %.2f GiB CUDA context)\n",
            gib(device_memory_in_use()), gib(plan.total()), gib(in_use_before));
    if (pg.world > 1 && !lora.enabled()) {
        // the formula counts shards only; stages 2 and 3 also keep full buffers of the units being worked on
        fprintf(out, "model states per GPU: measured %.3f GiB, formula %.3f GiB (%+.1f%%), of which %.3f GiB are unsharded working buffers "
                     "(stage 2: gradients, stage 3: also parameters, of the embeddings, final LayerNorm and a two-block ring)\n",
                gib(model.model_state_bytes), gib((size_t)zero_formula), 100.0 * (model.model_state_bytes / zero_formula - 1.0),
                gib(plan.working));
    }
    if (std::is_same<floatX, __half>::value) model.enable_loss_scaling(o.fp16_initial_scale, o.fp16_growth_interval);

    int start_step = 0;
    const int resume_step = (o.resume && !o.output_dir.empty()) ? latest_checkpoint(o.output_dir) : -1;
    if (resume_step >= 0) {
        DataLoaderState data_state = load_checkpoint(o.output_dir, resume_step, model);
        try { train_loader->restore(data_state); } catch (const std::exception& e) { die(e.what()); }
        start_step = resume_step;
        fprintf(out, "resumed from %s at step %d\n", checkpoint_path(o.output_dir, "model", resume_step).c_str(), resume_step);
    } else if (o.resume && !o.output_dir.empty()) {
        fprintf(out, "no checkpoint in %s: starting from scratch\n", o.output_dir.c_str());
    }
    if (resume_step < 0) {
        if (initial_values) model.set_parameters(*initial_values);
        else model.init_parameters((uint64_t)o.seed);
        if (lora.enabled()) {
            if (initial_adapters) model.adapters->set_parameters(*initial_adapters);
            else model.init_adapters((uint64_t)o.seed + 1);
        }
    }

    FILE* log = nullptr;
    if (!o.output_dir.empty() && pg.is_main()) {
        make_directories(o.output_dir);
        log = fopen((o.output_dir + "/log.txt").c_str(), start_step > 0 ? "a" : "w");
        if (log == nullptr) die(o.output_dir + "/log.txt: cannot open for writing");
        if (start_step == 0) fprintf(log, "# step loss lr grad_norm ms (steps 0-based; validation lines start with '# val')\n");
        setvbuf(log, nullptr, _IOLBF, 0);
    }
    SampleText text(o.tokenizer);
    const std::vector<int> sample_prompt = text.prompt_tokens(o.prompt);
    std::vector<HellaSwagItem> hellaswag_items;
    if (o.hellaswag) {
        if (!text.tokenizer) die("--hellaswag needs the GPT-2 vocabulary: --tokenizer must be a folder with encoder.json and vocab.bpe");
        try { hellaswag_items = load_hellaswag(o.hellaswag_data); } catch (const std::exception& e) { die(e.what()); }
    }
    // FLOPs per token for forward + backward: 6 per parameter that multiplies (all but wpe) plus attention's
    // scores and weighted sum (12 L C T, counting the masked half as llm.c and PaLM do).
    const double flops_per_token = 6.0 * (model.num_parameters() - (size_t)config.max_seq_len * config.channels) +
                                   12.0 * config.num_layers * config.channels * T;
    const double peak_flops = 989e12 * pg.world;  // H100/H200 dense bf16, per GPU: MFU is of all GPUs together
    std::vector<double> step_ms;  // for the closing summary
    size_t peak_memory = 0;

    for (int step = start_step; step <= steps; step++) {
        const bool last = step == steps;
        const bool evaluate = o.val_every > 0 && (step % o.val_every == 0 || last);
        if (evaluate && o.hellaswag) {
            const auto start = std::chrono::steady_clock::now();
            HellaSwagScore score = evaluate_hellaswag(model, hellaswag_items, *text.tokenizer);
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            fprintf(out, "step %d: HellaSwag acc_norm %.4f (%d/%d), acc %.4f, %.1f s\n", step, (double)score.correct_mean / score.items,
                   score.correct_mean, score.items, (double)score.correct_sum / score.items, seconds);
            if (log) fprintf(log, "# hellaswag step %d acc_norm %.6f acc %.6f\n", step, (double)score.correct_mean / score.items,
                             (double)score.correct_sum / score.items);
        }
        if (evaluate && val_loader) {
            val_loader->reset();
            for (int i = 0; i < val_batches; i++) {
                Batch batch = val_loader->next();
                model.upload_batch(batch.inputs, batch.targets);
                model.forward_all_stages(true);
                model.accumulate_loss();
            }
            const float val_loss = model.take_mean_loss();
            fprintf(out, "step %d: val loss %.6f\n", step, val_loss);
            if (log) fprintf(log, "# val step %d loss %.9g\n", step, val_loss);
        }
        if (o.sample_every > 0 && step > 0 && (step % o.sample_every == 0 || last)) {
            std::vector<int> sample = generate(model, sample_prompt, o.sample_tokens, o.temperature, o.top_k,
                                               splitmix64((uint64_t)o.seed ^ (uint64_t)step));
            fprintf(out, "step %d sample: %s\n---\n", step, text(std::vector<int>(sample.begin() + 1, sample.end())).c_str());
        }
        if (o.checkpoint_every > 0 && !o.output_dir.empty() && step > start_step && (step % o.checkpoint_every == 0 || last)) {
            save_checkpoint(o.output_dir, step, model, train_loader->state());
            fprintf(out, "wrote checkpoint %s\n", checkpoint_path(o.output_dir, "model", step).c_str());
        }
        if (last) break;

        const auto start = std::chrono::steady_clock::now();
        double data_seconds = 0.0;
        model.zero_grad();
        model.training = true;
        if (pipeline) {  // the micro-batches go through the pipeline's schedule
            std::vector<std::vector<int>> inputs(grad_accum), targets(grad_accum);
            for (int micro = 0; micro < grad_accum; micro++) {
                Batch batch;
                try { batch = train_loader->next(); } catch (const std::exception& e) { die(e.what()); }
                data_seconds += batch.wait_seconds;
                inputs[micro].assign(batch.inputs, batch.inputs + (size_t)B * T);
                targets[micro].assign(batch.targets, batch.targets + (size_t)B * T);
            }
            pipeline->run_step(model, inputs, targets, model.dloss(grad_accum));
        }
        for (int micro = 0; micro < grad_accum && !pipeline; micro++) {
            model.lora_dropout_seed = splitmix64(((uint64_t)o.seed << 20) ^ ((uint64_t)step << 8) ^ (uint64_t)micro);
            Batch batch;
            try { batch = train_loader->next(); } catch (const std::exception& e) { die(e.what()); }
            data_seconds += batch.wait_seconds;
            model.upload_batch(batch.inputs, batch.targets);
            model.forward(true, model.dloss(grad_accum));
            model.accumulate_loss();
            model.backward(micro == grad_accum - 1);
        }
        model.training = false;
        // one wait per step: the losses' copy and the optimizer step are enqueued first
        model.request_losses();
        const float lr = learning_rate(step, steps, o.lr, o.warmup_steps, o.final_lr_frac, o.lr_schedule);
        AdamWHyper h{lr, o.beta1, o.beta2, o.eps, lora.enabled() ? o.lora_weight_decay : o.weight_decay, o.grad_clip, 1.0f, step + 1,
                     splitmix64((uint64_t)o.seed + 0x5EED + step)};
        model.trained().step(h);
        const float loss = model.take_mean_loss();  // waits for the step
        const typename ZeroOptimizer<floatX>::StepResult result = model.trained().finish_step();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double tokens_per_second = total_batch_tokens / seconds;
        fprintf(out, "step %5d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s | MFU %.1f%% | data %.2f ms | mem %.1f GiB",
               step + 1, steps, loss, lr, result.grad_norm, seconds * 1e3, tokens_per_second,
               100.0 * flops_per_token * tokens_per_second / peak_flops, data_seconds * 1e3, gib(device_memory_in_use()));
        if (std::is_same<floatX, __half>::value)
            fprintf(out, " | scale %g | skipped %ld%s", model.trained().scaler.scale, model.trained().scaler.skipped_steps, result.skipped ? " (this step)" : "");
        if (pipeline)  // rank 0's stage: the first
            fprintf(out, " | bubble %.1f%% (theory %.1f%%)", 100.0 * pipeline->measured_bubble(),
                    100.0 * pipeline_bubble_theory(po.kind, shape.pp, grad_accum, po.virtual_stages));
        fprintf(out, "\n");
        fflush(out);
        if (log) fprintf(log, "%d %.9g %.9g %.9g %.3f\n", step, loss, lr, result.grad_norm, seconds * 1e3);
        step_ms.push_back(seconds * 1e3);
        peak_memory = std::max(peak_memory, device_memory_in_use() - in_use_before);  // ours, without the CUDA context
    }
    // Summary for benchmarks: the median step time, leaving out the first steps (cuBLAS heuristics, warm-up).
    if (step_ms.size() > 3) {
        std::vector<double> timed(step_ms.begin() + 3, step_ms.end());
        std::nth_element(timed.begin(), timed.begin() + timed.size() / 2, timed.end());
        const double ms = timed[timed.size() / 2];
        fprintf(out, "RESULT tokens_per_s=%.0f ms_per_step=%.2f peak_mem_gib=%.2f mfu=%.1f\n", total_batch_tokens / ms * 1e3, ms,
               gib(peak_memory), 100.0 * flops_per_token * total_batch_tokens / (ms * 1e-3) / peak_flops);
    }
    if (lora.enabled() && (!o.lora_save.empty() || !o.lora_merge.empty())) {
        const std::vector<float> adapter_values = model.adapters->parameters_host();
        const std::vector<float> base_values = model.zero->parameters_host();
        if (pg.is_main() && !o.lora_save.empty()) {
            write_adapter_file(o.lora_save, *model.adapter_layout, adapter_values);
            fprintf(out, "wrote adapters %s\n", o.lora_save.c_str());
        }
        if (pg.is_main() && !o.lora_merge.empty()) {
            write_model_file(o.lora_merge, model.layout, merge_adapters(model.layout, base_values, *model.adapter_layout, adapter_values), false);
            fprintf(out, "wrote the merged model %s\n", o.lora_merge.c_str());
        }
    }
    if (pg.world > 1) {
        // the ranks of a data-parallel group must end with the same parameters, and the tensors that tensor
        // parallelism replicates must be the same on every rank: each rank prints checksums of its copies
        std::vector<float> params = model.trained().parameters_host();
        const LayoutMask split = model.layout.split_mask();
        uint64_t hash = 0, replicated = 0;
        for (size_t i = 0; i < params.size(); i++) {
            uint32_t bits;
            memcpy(&bits, &params[i], 4);
            hash = splitmix64(hash ^ bits);
            if (!split.contains((long)i)) replicated = splitmix64(replicated ^ bits);
        }
        fprintf(stderr, "rank %d parameter checksum %016llx tensor-parallel rank %d replicated checksum %016llx\n", pg.rank,
                (unsigned long long)hash, mesh.tensor.rank, (unsigned long long)replicated);
        if (shape.pp > 1 && model.layout.part.has_wte()) {  // the two copies of the tied token embedding must agree
            uint64_t wte = 0;
            for (size_t i = model.layout.wte; i < model.layout.wte + (size_t)model.layout.vocab_rows() * config.channels; i++) {
                uint32_t bits;
                memcpy(&bits, &params[i], 4);
                wte = splitmix64(wte ^ bits);
            }
            fprintf(stderr, "rank %d pipeline stage %d tensor-parallel rank %d data-parallel rank %d wte checksum %016llx\n", pg.rank, mesh.pipeline.rank,
                    mesh.tensor.rank, mesh.data.rank, (unsigned long long)wte);
        }
    }
    if (log) fclose(log);
    if (out != stdout) fclose(out);
    matmul_teardown();
    mesh.destroy();
    return 0;
}

#ifndef TESTING
int main(int argc, char** argv) {
    ProcessGroup pg = ProcessGroup::from_environment(&argc, &argv);
    Options o = parse_options(argc, argv);
    // the process mesh: data parallel x pipeline parallel x tensor parallel
    const std::string mesh_problem = mesh_shape_problem(pg.world, o.tensor_parallel, o.pipeline_parallel);
    if (!mesh_problem.empty()) die(mesh_problem);
    MeshShape shape;
    shape.tp = o.tensor_parallel;
    shape.pp = o.pipeline_parallel;
    shape.dp = pg.world / (o.tensor_parallel * o.pipeline_parallel);
    PipelineOptions pipeline;
    if (!parse_pipeline_schedule(o.pipeline_schedule, &pipeline.kind))
        die("--pipeline-schedule must be 1f1b or interleaved, got '" + o.pipeline_schedule + "'");
    if (o.virtual_stages < 0) die("--virtual-stages must be at least 1 (or 0: the schedule's default), got " + std::to_string(o.virtual_stages));
    pipeline.virtual_stages = o.virtual_stages > 0 ? o.virtual_stages : pipeline.kind == PipelineScheduleKind::kInterleaved ? 2 : 1;
    // model shape: a dN descriptor (plus overrides), or a model file
    ModelConfig config;
    std::vector<float> initial_values;
    const bool from_file = !config_from_descriptor(o.model, config);
    if (from_file) {
        config = read_model_file(o.model, initial_values, 8 * shape.dp);
        if (o.layers > 0 || o.heads > 0 || o.channels > 0 || o.max_seq_len > 0)
            die("--layers/--heads/--channels/--max-seq-len apply to a dN model, not to a model file (" + o.model + ")");
    } else {
        if (o.layers > 0) config.num_layers = o.layers;
        if (o.heads > 0) config.num_heads = o.heads;
        if (o.channels > 0) config.channels = o.channels;
        if (o.max_seq_len > 0) config.max_seq_len = o.max_seq_len;
        std::string problem = config_problem(config);
        if (!problem.empty()) die("model " + o.model + ": " + problem);
    }
    const std::string split_problem = tensor_parallel_problem(config, shape.tp);
    if (!split_problem.empty()) die(split_problem);
    const std::string layers_problem = pipeline_layer_split(config.num_layers, shape.pp, pipeline.virtual_stages, o.pipeline_layers,
                                                            &pipeline.per_virtual_stage);
    if (!layers_problem.empty()) die(layers_problem);
    if (shape.pp > 1 && o.zero_stage >= 2)
        die("--pipeline-parallel " + std::to_string(shape.pp) + " runs with --zero-stage 0 or 1 (got " + std::to_string(o.zero_stage) +
            "): stages 2-3 would reduce-scatter every micro-batch's gradients, which a pipeline's interleaved micro-batches make a "
            "reduction per micro-batch instead of one per step");
    if (shape.pp > 1 && o.hellaswag) die("--hellaswag runs with --pipeline-parallel 1 (got " + std::to_string(shape.pp) + ")");
    if (o.sequence_parallel != 0 && o.sequence_parallel != 1) die("--sequence-parallel must be 0 or 1, got " + std::to_string(o.sequence_parallel));
    if (o.sequence_parallel && o.seq_len % shape.tp != 0)
        die("--sequence-parallel 1: --seq-len " + std::to_string(o.seq_len) + " must be a multiple of --tensor-parallel " + std::to_string(shape.tp));
    if (o.batch_size <= 0) die("--batch-size must be positive");
    if (o.seq_len <= 0 || o.seq_len > config.max_seq_len)
        die("--seq-len must be in 1.." + std::to_string(config.max_seq_len) + " (the model's maximum sequence length)");
    if (o.lr_schedule != "cosine" && o.lr_schedule != "linear" && o.lr_schedule != "constant")
        die("--lr-schedule must be cosine, linear or constant, got '" + o.lr_schedule + "'");
    if (o.precision != "bf16" && o.precision != "fp16" && o.precision != "fp32")
        die("--precision must be bf16, fp16 or fp32, got '" + o.precision + "'");
    if (o.recompute < 0 || o.recompute > 3) die("--recompute must be 0, 1, 2 or 3, got " + std::to_string(o.recompute));
    if (o.zero_stage < 0 || o.zero_stage > 3) die("--zero-stage must be 0, 1, 2 or 3, got " + std::to_string(o.zero_stage));
    if (o.gelu_fusion != 0 && o.gelu_fusion != 1) die("--gelu-fusion must be 0 or 1, got " + std::to_string(o.gelu_fusion));
    if (o.deterministic != 0 && o.deterministic != 1) die("--deterministic must be 0 or 1, got " + std::to_string(o.deterministic));
    // LoRA: from flags, or from an adapter file
    LoraSpec lora;
    std::vector<float> initial_adapters;
    if (!o.lora_load.empty()) {
        lora = read_adapter_file(o.lora_load, config, 8 * shape.dp, initial_adapters);
        if (o.lora_rank > 0 && o.lora_rank != lora.rank) die("--lora-rank " + std::to_string(o.lora_rank) + " disagrees with " + o.lora_load);
    } else if (o.lora_rank > 0) {
        lora.rank = o.lora_rank;
        lora.alpha = o.lora_alpha > 0.0f ? o.lora_alpha : (float)o.lora_rank;
        lora.targets = parse_lora_targets(o.lora_targets);
        if (lora.targets == 0) die("--lora-targets '" + o.lora_targets + "': expected a comma list of qkv, attn-proj, fc, fc-proj");
    } else if (o.lora_rank < 0) {
        die("--lora-rank must be >= 0");
    } else if (!o.lora_save.empty() || !o.lora_merge.empty()) {
        die("--lora-save and --lora-merge need LoRA (--lora-rank or --lora-load)");
    }
    lora.dropout = o.lora_dropout;
    if (o.lora_dropout < 0.0f || o.lora_dropout >= 1.0f) die("--lora-dropout must be in [0, 1)");
    if (lora.enabled() && o.zero_stage == 3 && pg.world > 1) die("LoRA runs with --zero-stage 0, 1 or 2 (the frozen base is replicated)");
    if (lora.enabled() && shape.tp > 1)
        die("LoRA runs with --tensor-parallel 1 (got " + std::to_string(shape.tp) + "): fine-tune on data-parallel ranks, whose frozen base is replicated");
    if (lora.enabled() && shape.pp > 1)
        die("LoRA runs with --pipeline-parallel 1 (got " + std::to_string(shape.pp) + "): fine-tune on data-parallel ranks, whose frozen base is replicated");
    if (lora.enabled() && (o.checkpoint_every > 0 || o.resume))
        die("LoRA runs write their adapters with --lora-save and continue with --lora-load; --checkpoint-every and --resume are for full training");
    if (lora.enabled() && o.generate > 0) die("--generate runs a model file: merge the adapters first (--lora-merge)");
    if (o.resume && o.output_dir.empty()) die("--resume needs --output-dir (where the checkpoints are)");
    const std::vector<float>* initial = from_file ? &initial_values : nullptr;
    int rc;
    if (o.generate > 0)
        rc = o.precision == "fp32" ? generate_only<float>(o, pg, config, initial)
           : o.precision == "fp16" ? generate_only<__half>(o, pg, config, initial)
                                   : generate_only<__nv_bfloat16>(o, pg, config, initial);
    else {
        const std::vector<float>* adapters = initial_adapters.empty() ? nullptr : &initial_adapters;
        rc = o.precision == "fp32" ? train<float>(o, pg, shape, config, initial, lora, adapters, pipeline)
           : o.precision == "fp16" ? train<__half>(o, pg, shape, config, initial, lora, adapters, pipeline)
                                   : train<__nv_bfloat16>(o, pg, shape, config, initial, lora, adapters, pipeline);
    }
    pg.destroy();
    return rc;
}
#endif
