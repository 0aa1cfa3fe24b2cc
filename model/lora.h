// LoRA (docs/lora.md): which matrices of each block carry adapters (LoraSpec), the adapters' own flat device
// buffer (AdapterLayout), adapter files, and the merge of adapters into the base model.
// defines: LoraTargetIndex, kLoraProducts, lora_target_name, lora_product, lora_target_weight, lora_in, lora_out,
//          lora_out_offset, lora_out_stride, lora_stream, LoraSpec, parse_lora_targets, kLoraTargetNames,
//          lora_targets_problem, AdapterLayout, adapter_part, put_adapter_part, lora_u_elements, lora_activation_elements,
//          kAdapterMagic, write_adapter_file, parse_adapter_header, read_adapter_spec, read_adapter_file, merge_adapters
#pragma once
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "../kernels/die.h"          // die
#include "../kernels/host_device.h"  // LayoutMask
#include "config.h"                  // ModelConfig, BlockTensor, ParameterLayout, UnitKind
#include "file_integrity.h"          // seal_file_checksum, check_file_checksum, write_file_atomically
#include "checked_reads.h"           // CheckedFile, CheckpointReads
#include "nf4.h"                     // Nf4Products

// ---------------------------------------------------------------------------------------------
// LoRA (docs/lora.md): adapters A (r, in), B (out, r) on chosen matrices of every block. On the device
// the adapters of block l form unit l+1 of their own flat buffer (units 0 and L+1 are empty, matching
// ParameterLayout's unit numbering), each target's A then B in the order of LoraTargetIndex: the order of the
// adapter file. A target adapts a whole product (qkv, attn-proj, fc, fc-proj) or a slice of its output columns,
// the rows of its weight (q, k, v of qkv; the Llama family's gate and up of fc): PEFT adapts q_proj, k_proj,
// v_proj, gate_proj and up_proj separately.

enum LoraTargetIndex { kLoraQkv, kLoraAttnProj, kLoraFc, kLoraFcProj, kLoraQ, kLoraK, kLoraV, kLoraGate, kLoraUp, kLoraTargets };
constexpr int kLoraProducts = 4;  // the block's linear layers: the first four targets
constexpr unsigned kLoraLlamaOnly = 1u << kLoraGate | 1u << kLoraUp;  // GPT-2's MLP input is one product, fc
inline const char* lora_target_name(int t) {
    static const char* names[] = {"qkv", "attn-proj", "fc", "fc-proj", "q", "k", "v", "gate", "up"};
    return names[t];
}
// The product whose output target t adds to.
inline int lora_product(int t) { return t == kLoraQ || t == kLoraK || t == kLoraV ? kLoraQkv : t == kLoraGate || t == kLoraUp ? kLoraFc : t; }
inline BlockTensor lora_target_weight(int t) {
    static const BlockTensor weights[] = {QKVW, ATTPROJW, FCW, FCPROJW};
    return weights[lora_product(t)];
}
// A target's input and output widths (tp = 1): qkv's output holds the q, k and v heads; fc's the MLP's input products
// (GPT-2's fc, Llama's gate and up); fc-proj's input the MLP's hidden units.
inline int lora_in(int t, const ModelConfig& c) { return t == kLoraFcProj ? c.hidden_units() : c.channels; }
inline int lora_out(int t, const ModelConfig& c) {
    switch (t) {
        case kLoraQkv: return c.qkv_channels();
        case kLoraFc: return c.mlp_inputs() * c.hidden_units();
        case kLoraQ: return c.channels;
        case kLoraK: case kLoraV: return c.kv_channels();
        case kLoraGate: case kLoraUp: return c.hidden_units();
        default: return c.channels;
    }
}
// Where target t's output columns begin in its product's output ([q | k | v], [gate | up]); the product's output
// width is its row stride.
inline int lora_out_offset(int t, const ModelConfig& c) {
    return t == kLoraK ? c.channels : t == kLoraV ? c.channels + c.kv_channels() : t == kLoraUp ? c.hidden_units() : 0;
}
inline int lora_out_stride(int t, const ModelConfig& c) { return lora_out(lora_product(t), c); }
// The random streams of target t in block l (initialisation, dropout): the four products' as l * 4 + t, the
// slices' in a range of their own.
inline uint64_t lora_stream(int l, int t) {
    return t < kLoraProducts ? (uint64_t)l * kLoraProducts + t : (1ull << 32) + (uint64_t)l * kLoraTargets + t;
}

struct LoraSpec {
    int rank = 0;        // 0: LoRA off
    float alpha = 0.0f;
    unsigned targets = 0;  // bit t = LoraTargetIndex t
    float dropout = 0.0f;
    bool nf4_base = false;  // the frozen base's blocks' linear weights in QLoRA's NF4 (--base-quant nf4; model/nf4_base.cuh)
    Nf4Products nf4_products = Nf4Products::kDequantized;  // --nf4-products
    bool nf4_double_quant = true;  // --nf4-double-quant: the NF4 base's absmaxes in 8 bits, or in fp32
    bool enabled() const { return rank > 0; }
    bool targets_has(int t) const { return (targets >> t) & 1u; }
    float scale() const { return alpha / (float)rank; }
};

// "qkv,fc" -> bitmask; 0 on an unknown name. "o" and "down", PEFT's names of the projections, are attn-proj and fc-proj.
inline unsigned parse_lora_targets(const std::string& list) {
    unsigned mask = 0;
    size_t start = 0;
    while (start <= list.size()) {
        const size_t end = std::min(list.find(',', start), list.size());
        std::string name = list.substr(start, end - start);
        if (name == "o") name = lora_target_name(kLoraAttnProj);
        if (name == "down") name = lora_target_name(kLoraFcProj);
        bool known = false;
        for (int t = 0; t < kLoraTargets; t++)
            if (name == lora_target_name(t)) { mask |= 1u << t; known = true; }
        if (!known) return 0;
        start = end + 1;
    }
    return mask;
}
constexpr const char* kLoraTargetNames = "qkv, attn-proj (o), fc, fc-proj (down), q, k, v, gate, up";
// Why `targets` does not fit a model of shape c ("" if they do): gate and up are slices of the Llama family's
// [gate | up] product.
inline std::string lora_targets_problem(unsigned targets, const ModelConfig& c) {
    if ((targets & kLoraLlamaOnly) && !c.llama()) return "gate and up adapt the Llama family's SwiGLU MLP; GPT-2's MLP input is one product, fc";
    return "";
}

// The adapters of a model's blocks, or of a pipeline stage's (`layers`: their global indices, ascending; all of them
// by default): local block l's adapters are unit l + 1. Files, PEFT folders and the merge use the whole model's
// layout; a stage's part is cut from it and put back by adapter_part and put_adapter_part.
struct AdapterLayout {
    ModelConfig config;
    LoraSpec spec;
    std::vector<int> layers;  // the global index of each local block
    size_t unit_stride = 0, total = 0;
    size_t offset_a[kLoraTargets] = {}, offset_b[kLoraTargets] = {};  // within a layer's unit
    size_t count = 0;                                                 // adapter parameters (no padding)
    AdapterLayout(const ModelConfig& c, const LoraSpec& s, size_t unit_multiple, std::vector<int> stage_layers = {})
        : config(c), spec(s), layers(std::move(stage_layers)) {
        if (layers.empty())
            for (int l = 0; l < c.num_layers; l++) layers.push_back(l);
        size_t size = 0;
        for (int t = 0; t < kLoraTargets; t++) {
            if (!s.targets_has(t)) continue;
            offset_a[t] = size;
            size += (size_t)s.rank * lora_in(t, c);
            offset_b[t] = size;
            size += (size_t)lora_out(t, c) * s.rank;
        }
        count = size * num_blocks();
        unit_stride = (size + unit_multiple - 1) / unit_multiple * unit_multiple;
        edge_ = unit_multiple;
        total = edge_ + unit_stride * num_blocks() + edge_;
    }
    int num_blocks() const { return (int)layers.size(); }
    bool whole() const { return num_blocks() == config.num_layers; }
    size_t layer_size() const { return count / num_blocks(); }
    size_t unit_begin(int l) const { return edge_ + l * unit_stride; }  // local block l's adapters
    size_t a(int l, int t) const { return edge_ + l * unit_stride + offset_a[t]; }
    size_t b(int l, int t) const { return edge_ + l * unit_stride + offset_b[t]; }
    std::vector<size_t> unit_offsets() const {
        std::vector<size_t> v = {0};
        for (int l = 0; l <= num_blocks(); l++) v.push_back(edge_ + l * unit_stride);
        return v;
    }
    std::vector<size_t> unit_sizes() const {
        std::vector<size_t> v = {edge_};
        for (int l = 0; l < num_blocks(); l++) v.push_back(unit_stride);
        v.push_back(edge_);
        return v;
    }
    std::vector<UnitKind> unit_kinds() const {  // the layers gathered on use (ZeRO-3), the edges persistent
        std::vector<UnitKind> v(num_blocks() + 2, UnitKind::kGathered);
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

// A stage's adapters (`part`) cut from the whole model's (`whole`, values in its layout), and put back.
inline std::vector<float> adapter_part(const AdapterLayout& part, const AdapterLayout& whole, const std::vector<float>& whole_values) {
    std::vector<float> values(part.total, 0.0f);
    for (int l = 0; l < part.num_blocks(); l++)
        std::copy_n(whole_values.begin() + whole.unit_begin(part.layers[l]), part.layer_size(), values.begin() + part.unit_begin(l));
    return values;
}
inline void put_adapter_part(const AdapterLayout& part, const std::vector<float>& part_values, const AdapterLayout& whole,
                             std::vector<float>& whole_values) {
    for (int l = 0; l < part.num_blocks(); l++)
        std::copy_n(part_values.begin() + part.unit_begin(l), part.layer_size(), whole_values.begin() + whole.unit_begin(part.layers[l]));
}

// LoRA's activations, in elements: u = A dropout(x) of every target of every block of a stage for each of `slots`
// micro-batches in flight (pipeline parallelism: the most activation sets of any of its chunks; lora_u_elements),
// the backward's du and, with dropout, the dropped input.
inline size_t lora_u_elements(const LoraSpec& spec, size_t N, int blocks, int slots) {
    return N * spec.rank * __builtin_popcount(spec.targets) * blocks * slots;
}
inline size_t lora_activation_elements(const LoraSpec& spec, const ModelConfig& c, size_t N, int blocks, int slots) {
    return lora_u_elements(spec, N, blocks, slots) + N * spec.rank + (spec.dropout > 0.0f ? N * std::max(c.channels, c.hidden_units()) : 0);
}

// Adapter files (docs/lora.md): header of 256 int32 (magic 20261127, version 1, rank, alpha, targets, L, C,
// tensor count; the CRC-32C in its last ints, file_integrity.h), then fp32 A and B per layer and target. `values`
// uses the device layout (padded units).
constexpr int kAdapterMagic = 20261127;

// A checkpoint's adapter file (run_id != 0) carries the run's identity (stamp_run_identity). Returns the file as a
// checkpoint's manifest lists it.
inline FileRecord write_adapter_file(const std::string& path, const AdapterLayout& layout, const std::vector<float>& values, uint64_t run_id = 0,
                                     int step = 0) {
    int header[256] = {};
    header[0] = kAdapterMagic;
    header[1] = 1;
    header[2] = layout.spec.rank;
    memcpy(&header[3], &layout.spec.alpha, sizeof(float));
    header[4] = (int)layout.spec.targets;
    if (!layout.whole()) die("internal: an adapter file holds the whole model's adapters");
    header[5] = layout.config.num_layers;
    header[6] = layout.config.channels;
    header[7] = 2 * layout.config.num_layers * __builtin_popcount(layout.spec.targets);
    if (run_id != 0) stamp_run_identity(header, run_id, step);
    std::vector<float> body;
    for (int l = 0; l < layout.config.num_layers; l++)
        body.insert(body.end(), values.begin() + layout.unit_begin(l), values.begin() + layout.unit_begin(l) + layout.layer_size());
    const FileParts parts = {{header, sizeof(header)}, {body.data(), body.size() * sizeof(float)}};
    FileRecord record;
    record.crc = seal_file_checksum(header, parts);
    record.bytes = write_file_atomically(path, parts);
    record.name = path.substr(path.rfind('/') + 1);
    return record;
}

// An adapter file's spec (dropout 0) from its 256 header ints and its size, checked against `config` (the messages
// are docs/lora.md's, the same as scripts/reference/gpt2_reference.py's reader).
inline LoraSpec parse_adapter_header(const int* header, uint64_t size, const std::string& path, const ModelConfig& config) {
    if (header[0] != kAdapterMagic)
        die(path + ": bad adapter magic " + std::to_string(header[0]) + " (expected " + std::to_string(kAdapterMagic) + ")");
    if (header[1] != 1) die(path + ": unsupported adapter version " + std::to_string(header[1]) + " (expected 1)");
    LoraSpec spec;
    spec.rank = header[2];
    memcpy(&spec.alpha, &header[3], sizeof(float));
    spec.targets = (unsigned)header[4];
    if (spec.rank <= 0) die(path + ": adapter rank " + std::to_string(spec.rank) + " must be positive");
    if (!(spec.alpha > 0.0f) || !std::isfinite(spec.alpha)) {
        char alpha[32];
        snprintf(alpha, sizeof(alpha), "%g", spec.alpha);
        die(path + ": adapter alpha " + alpha + " must be finite and positive");
    }
    if (spec.targets == 0 || spec.targets >= 1u << kLoraTargets)
        die(path + ": bad adapter target bitmask " + std::to_string(header[4]) +
            " (expected 1..511: 1 qkv, 2 attn-proj, 4 fc, 8 fc-proj, 16 q, 32 k, 64 v, 128 gate, 256 up)");
    const std::string problem = lora_targets_problem(spec.targets, config);
    if (!problem.empty()) die(path + ": adapter targets " + std::to_string(header[4]) + ": " + problem);
    if (header[5] != config.num_layers || header[6] != config.channels)
        die(path + ": adapters for " + std::to_string(header[5]) + " layers, " + std::to_string(header[6]) + " channels; the model has " +
            std::to_string(config.num_layers) + " layers, " + std::to_string(config.channels) + " channels");
    const int tensors = 2 * config.num_layers * __builtin_popcount(spec.targets);
    if (header[7] != tensors)
        die(path + ": header says " + std::to_string(header[7]) + " tensors, expected " + std::to_string(tensors) + " (A and B per layer and target)");
    const uint64_t expected = 1024 + 4 * (uint64_t)AdapterLayout(config, spec, 8).count;
    if (size < expected) die(path + ": truncated: " + std::to_string(size) + " bytes, its header implies " + std::to_string(expected));
    if (size > expected) die(path + ": " + std::to_string(size) + " bytes, its header implies " + std::to_string(expected) + " (trailing data)");
    return spec;
}
// An adapter file's spec from its header alone (a resume's check against this run, before the load reads the file).
inline LoraSpec read_adapter_spec(const std::string& path, const ModelConfig& config) {
    CheckedFile f(path, nullptr, "adapter file");
    int header[256];
    if (f.size() < sizeof(header)) die(path + ": truncated adapter header (" + std::to_string(f.size()) + " bytes)");
    f.read(header, sizeof(header), "the header");
    return parse_adapter_header(header, f.size(), path, config);
}

// Reads an adapter file for `config`; returns its spec (dropout 0) and fills `values` for `unit_multiple`. Read once,
// front to back: a checkpoint's adapter file through `reads` (which verifies it on the rank it is given to); any other
// file (--lora-load) is checked against the CRC-32C its header carries first.
inline LoraSpec read_adapter_file(const std::string& path, const ModelConfig& config, size_t unit_multiple, std::vector<float>& values,
                                  CheckpointReads* reads = nullptr) {
    if (reads == nullptr && access(path.c_str(), F_OK) == 0) {
        const FileChecksum checksum = check_file_checksum(path);
        if (checksum.status == FileChecksum::kDamaged) die(checksum.problem);
    }
    CheckedFile f(path, reads, "adapter file");
    int header[256];
    if (f.size() < sizeof(header)) die(path + ": truncated adapter header (" + std::to_string(f.size()) + " bytes)");
    f.read(header, sizeof(header), "the header");
    const LoraSpec spec = parse_adapter_header(header, f.size(), path, config);
    const AdapterLayout layout(config, spec, unit_multiple);
    std::vector<float> body(layout.count);
    f.read(body.data(), body.size() * sizeof(float), "the adapters");
    values.assign(layout.total, 0.0f);
    for (int l = 0; l < config.num_layers; l++)
        std::copy(body.begin() + l * layout.layer_size(), body.begin() + (l + 1) * layout.layer_size(),
                  values.begin() + layout.unit_begin(l));
    return spec;
}

// The merged model W = W0 + s B A for every adapted matrix (summed in double, rounded once), padded layout; a slice
// target's B A covers its rows of the product's weight.
inline std::vector<float> merge_adapters(const ParameterLayout& base, const std::vector<float>& base_values,
                                         const AdapterLayout& adapters, const std::vector<float>& adapter_values) {
    if (!adapters.whole()) die("internal: the merge takes the whole model's adapters");
    std::vector<float> merged = base_values;
    const int r = adapters.spec.rank;
    const double s = adapters.spec.scale();
    for (int l = 0; l < base.config.num_layers; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            if (!adapters.spec.targets_has(t)) continue;
            const int in = lora_in(t, base.config), out = lora_out(t, base.config);
            const float* A = &adapter_values[adapters.a(l, t)];
            const float* Bm = &adapter_values[adapters.b(l, t)];
            float* W = &merged[base.tensor(l, lora_target_weight(t)) + (size_t)lora_out_offset(t, base.config) * in];
            for (int o = 0; o < out; o++)
                for (int i = 0; i < in; i++) {
                    double acc = 0.0;
                    for (int k = 0; k < r; k++) acc += (double)Bm[(size_t)o * r + k] * A[(size_t)k * in + i];
                    W[(size_t)o * in + i] = (float)((double)W[(size_t)o * in + i] + s * acc);
                }
        }
    return merged;
}
