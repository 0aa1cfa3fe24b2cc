// LoRA adapters as a PEFT folder (docs/lora.md "PEFT folders"): adapter_config.json and adapter_model.safetensors,
// as `PeftModel.from_pretrained` loads them onto a Llama-family model exported by scripts/hf/export_hf.py (whose
// q_proj..down_proj are our weights' rows unmoved, so the adapters map one to one).
// defines: is_peft_folder_path, peft_module_path, peft_module_name, peft_targets_problem,
//          kPeftConfigName, kPeftWeightsName, peft_file, peft_tensor_name, peft_number, peft_safetensors_header,
//          write_peft_folder, peft_read_whole, read_peft_folder
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>
#include <sys/stat.h>
#include "../dataloader/json.h"  // JsonValue, parse_json
#include "../kernels/die.h"  // die
#include "config.h"          // ModelConfig
#include "file_integrity.h"  // write_file_atomically, FileParts
#include "lora.h"            // LoraSpec, AdapterLayout, lora_in, lora_out

// ---------------------------------------------------------------------------------------------
// --lora-save DIR/ and --lora-load DIR name a PEFT folder: a path ending in '/', or an existing folder.
inline bool is_peft_folder_path(const std::string& path) {
    struct stat st;
    return !path.empty() && (path.back() == '/' || (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)));
}

// Target t's module in transformers' LlamaForCausalLM (its path under a layer, "self_attn.q_proj"); nullptr for
// the fused products qkv and fc, which PEFT has no module for.
inline const char* peft_module_path(int t) {
    switch (t) {
        case kLoraQ: return "self_attn.q_proj";
        case kLoraK: return "self_attn.k_proj";
        case kLoraV: return "self_attn.v_proj";
        case kLoraAttnProj: return "self_attn.o_proj";
        case kLoraGate: return "mlp.gate_proj";
        case kLoraUp: return "mlp.up_proj";
        case kLoraFcProj: return "mlp.down_proj";
        default: return nullptr;
    }
}
inline const char* peft_module_name(int t) {  // "q_proj": adapter_config.json's target_modules
    const char* path = peft_module_path(t);
    return path == nullptr ? nullptr : strchr(path, '.') + 1;
}

// Why adapters on `targets` of a model shaped `c` cannot be a PEFT folder ("" if they can).
inline std::string peft_targets_problem(unsigned targets, const ModelConfig& c) {
    if (!c.llama()) return "a PEFT folder holds adapters of a Llama-family model (q_proj .. down_proj); this model is GPT-2: save an adapter file";
    if (targets & (1u << kLoraQkv)) return "PEFT has no module for the fused target qkv: use q,k,v";
    if (targets & (1u << kLoraFc)) return "PEFT has no module for the fused target fc: use gate,up";
    return "";
}

constexpr const char* kPeftConfigName = "adapter_config.json";
constexpr const char* kPeftWeightsName = "adapter_model.safetensors";
inline std::string peft_file(const std::string& dir, const char* name) {
    std::string d = dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    return d + "/" + name;
}
// PEFT's state-dict name of layer l's target t ('A' or 'B').
inline std::string peft_tensor_name(int l, int t, char ab) {
    return "base_model.model.model.layers." + std::to_string(l) + "." + peft_module_path(t) + ".lora_" + ab + ".weight";
}

inline std::string peft_number(double x) {  // shortest text that reads back as the same float
    char text[32];
    snprintf(text, sizeof(text), "%.9g", x);
    return text;
}

// The safetensors header (JSON, padded with spaces to a multiple of 8 bytes, as the safetensors library writes it)
// for the layout's tensors, fp32, in layer, target (bit order), A-then-B order.
inline std::string peft_safetensors_header(const AdapterLayout& layout) {
    std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
    uint64_t offset = 0;
    const int r = layout.spec.rank;
    for (int l = 0; l < layout.config.num_layers; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            if (!layout.spec.targets_has(t)) continue;
            const int in = lora_in(t, layout.config), out = lora_out(t, layout.config);
            for (const char ab : {'A', 'B'}) {
                const uint64_t rows = ab == 'A' ? r : out, cols = ab == 'A' ? in : r, bytes = rows * cols * 4;
                h += ",\"" + peft_tensor_name(l, t, ab) + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(rows) + "," + std::to_string(cols) +
                     "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
                offset += bytes;
            }
        }
    h += "}";
    h.append((8 - h.size() % 8) % 8, ' ');
    return h;
}

// Writes the adapters (`values` in the device layout) as a PEFT folder, creating the folder (not its parents); each
// file through a temporary name and a rename (write_file_atomically), the weights before the config.
inline void write_peft_folder(const std::string& dir, const AdapterLayout& layout, const std::vector<float>& values) {
    if (!layout.whole()) die("internal: a PEFT folder holds the whole model's adapters");
    const std::string problem = peft_targets_problem(layout.spec.targets, layout.config);
    if (!problem.empty()) die(dir + ": " + problem);
    std::string folder = dir;
    while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
    if (mkdir(folder.c_str(), 0777) != 0 && errno != EEXIST) die(dir + ": cannot create the PEFT folder: " + strerror(errno));
    struct stat st;
    if (stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) die(dir + ": exists and is not a folder (a PEFT folder goes there)");

    const std::string header = peft_safetensors_header(layout);
    const uint64_t header_bytes = header.size();
    std::vector<float> body;
    body.reserve(layout.count);
    for (int l = 0; l < layout.config.num_layers; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            if (!layout.spec.targets_has(t)) continue;
            const size_t a = (size_t)layout.spec.rank * lora_in(t, layout.config), b = (size_t)lora_out(t, layout.config) * layout.spec.rank;
            body.insert(body.end(), values.begin() + layout.a(l, t), values.begin() + layout.a(l, t) + a);
            body.insert(body.end(), values.begin() + layout.b(l, t), values.begin() + layout.b(l, t) + b);
        }
    write_file_atomically(peft_file(dir, kPeftWeightsName),
                          {{&header_bytes, 8}, {header.data(), header.size()}, {body.data(), body.size() * sizeof(float)}});

    std::string modules;
    for (int t = 0; t < kLoraTargets; t++)
        if (layout.spec.targets_has(t)) modules += std::string(modules.empty() ? "" : ", ") + "\"" + peft_module_name(t) + "\"";
    const std::string config = "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": " + std::to_string(layout.spec.rank) +
                               ",\n  \"lora_alpha\": " + peft_number(layout.spec.alpha) + ",\n  \"lora_dropout\": " + peft_number(layout.spec.dropout) +
                               ",\n  \"target_modules\": [" + modules +
                               "],\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"base_model_name_or_path\": null,\n"
                               "  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n  \"modules_to_save\": null,\n  \"use_rslora\": false\n}\n";
    write_file_atomically(peft_file(dir, kPeftConfigName), {{config.data(), config.size()}});
}

// A whole file's bytes; dies naming it.
inline std::string peft_read_whole(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) die(path + ": cannot open: " + strerror(errno));
    std::string bytes;
    char buffer[1 << 16];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) bytes.append(buffer, n);
    const bool error = ferror(f) != 0;
    fclose(f);
    if (error) die(path + ": read error");
    return bytes;
}

// Reads a PEFT folder's adapters for `config`: rank, alpha and targets from adapter_config.json (dropout 0, as
// read_adapter_file), and fills `values` for `unit_multiple` from adapter_model.safetensors (F32 or BF16, widened).
// Every tensor of the targets must be there in its shape, and nothing else.
inline LoraSpec read_peft_folder(const std::string& dir, const ModelConfig& config, size_t unit_multiple, std::vector<float>& values) {
    // adapter_config.json
    const std::string config_path = peft_file(dir, kPeftConfigName);
    JsonValue json;
    const std::string json_problem = parse_json(peft_read_whole(config_path), json);
    if (!json_problem.empty()) die(config_path + ": not JSON: " + json_problem);
    if (json.kind != JsonValue::kObject) die(config_path + ": expected a JSON object");
    const auto key = [&](const char* name) { return json.find(name); };
    const JsonValue* type = key("peft_type");
    if (type == nullptr || type->kind != JsonValue::kString || type->text != "LORA") die(config_path + ": peft_type must be \"LORA\"");
    LoraSpec spec;
    const JsonValue* r = key("r");
    if (r == nullptr || !r->natural() || r->number < 1 || r->number > 65536) die(config_path + ": r must be an integer in 1..65536");
    spec.rank = (int)r->number;
    const JsonValue* alpha = key("lora_alpha");
    if (alpha == nullptr || alpha->kind != JsonValue::kNumber || !(alpha->number > 0) || !std::isfinite((float)alpha->number))
        die(config_path + ": lora_alpha must be a finite positive number");
    spec.alpha = (float)alpha->number;
    const JsonValue* modules = key("target_modules");
    if (modules == nullptr || modules->kind != JsonValue::kArray || modules->items.empty())
        die(config_path + ": target_modules must be a non-empty list of module names");
    for (const JsonValue& m : modules->items) {
        int found = -1;
        for (int t = 0; t < kLoraTargets; t++)
            if (m.kind == JsonValue::kString && peft_module_name(t) != nullptr && m.text == peft_module_name(t)) found = t;
        if (found < 0)
            die(config_path + ": unknown module " + (m.kind == JsonValue::kString ? "\"" + m.text + "\"" : std::string("(not a string)")) +
                " in target_modules (expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
        spec.targets |= 1u << found;
    }
    // settings that change what the tensors mean or add tensors this reader does not hold
    const auto absent_or = [&](const char* name, bool ok_value, const char* expected) {
        const JsonValue* v = key(name);
        if (v != nullptr && v->kind != JsonValue::kNull && !ok_value) die(config_path + ": " + name + " must be " + expected);
    };
    const JsonValue* v;
    absent_or("use_rslora", (v = key("use_rslora")) && v->kind == JsonValue::kBool && !v->boolean, "false (the scale is alpha / r)");
    absent_or("fan_in_fan_out", (v = key("fan_in_fan_out")) && v->kind == JsonValue::kBool && !v->boolean, "false (weights are (out, in))");
    absent_or("bias", (v = key("bias")) && v->kind == JsonValue::kString && v->text == "none", "\"none\" (no bias tensors)");
    absent_or("modules_to_save", (v = key("modules_to_save")) && v->kind == JsonValue::kArray && v->items.empty(), "null (adapters only)");
    for (const char* pattern : {"rank_pattern", "alpha_pattern"})
        absent_or(pattern, (v = key(pattern)) && v->kind == JsonValue::kObject && v->members.empty(), "empty (one rank and alpha for all modules)");
    const std::string problem = peft_targets_problem(spec.targets, config);
    if (!problem.empty()) die(dir + ": " + problem);

    // adapter_model.safetensors: an 8-byte header length, the JSON header, the data
    const std::string path = peft_file(dir, kPeftWeightsName);
    const std::string bytes = peft_read_whole(path);
    uint64_t n = 0;
    if (bytes.size() >= 8) memcpy(&n, bytes.data(), 8);
    if (bytes.size() < 8 || n > bytes.size() - 8)
        die(path + ": not a safetensors file (header length " + std::to_string(n) + ", file size " + std::to_string(bytes.size()) + " bytes)");
    JsonValue header;
    const std::string header_problem = parse_json(bytes.substr(8, n), header);
    if (!header_problem.empty()) die(path + ": not a safetensors file (its header is not JSON: " + header_problem + ")");
    if (header.kind != JsonValue::kObject) die(path + ": not a safetensors file (its header is not a JSON object)");
    const uint64_t data_size = bytes.size() - 8 - n;
    const char* data = bytes.data() + 8 + n;

    const AdapterLayout layout(config, spec, unit_multiple);
    values.assign(layout.total, 0.0f);
    std::set<std::string> expected;
    for (int l = 0; l < config.num_layers; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            if (!spec.targets_has(t)) continue;
            for (const char ab : {'A', 'B'}) {
                const std::string name = peft_tensor_name(l, t, ab);
                const JsonValue* entry = header.find(name);
                if (entry == nullptr) die(path + ": missing tensor " + name);
                expected.insert(name);
                const JsonValue* dtype = entry->find("dtype");
                const JsonValue* shape = entry->find("shape");
                const JsonValue* offsets = entry->find("data_offsets");
                if (dtype == nullptr || dtype->kind != JsonValue::kString || shape == nullptr || shape->kind != JsonValue::kArray ||
                    offsets == nullptr || offsets->kind != JsonValue::kArray || offsets->items.size() != 2 || !offsets->items[0].natural() ||
                    !offsets->items[1].natural())
                    die(path + ": tensor " + name + ": malformed header entry");
                const bool f32 = dtype->text == "F32", bf16 = dtype->text == "BF16";
                if (!f32 && !bf16) die(path + ": tensor " + name + " has dtype " + dtype->text + " (expected F32 or BF16)");
                const uint64_t rows = ab == 'A' ? spec.rank : lora_out(t, config), cols = ab == 'A' ? lora_in(t, config) : spec.rank;
                std::string got;
                for (const JsonValue& d : shape->items) got += (got.empty() ? "" : ", ") + (d.natural() ? std::to_string((uint64_t)d.number) : "?");
                if (shape->items.size() != 2 || !shape->items[0].natural() || !shape->items[1].natural() || shape->items[0].number != rows ||
                    shape->items[1].number != cols)
                    die(path + ": tensor " + name + " has shape [" + got + "], the model and r give [" + std::to_string(rows) + ", " +
                        std::to_string(cols) + "]");
                const uint64_t begin = (uint64_t)offsets->items[0].number, end = (uint64_t)offsets->items[1].number;
                const uint64_t width = f32 ? 4 : 2;
                if (end < begin || end - begin != rows * cols * width || end > data_size)
                    die(path + ": tensor " + name + ": data_offsets " + std::to_string(begin) + ".." + std::to_string(end) + " do not hold " + dtype->text +
                        " [" + got + "] inside the file");
                float* dst = &values[ab == 'A' ? layout.a(l, t) : layout.b(l, t)];
                if (f32) {
                    memcpy(dst, data + begin, rows * cols * 4);
                } else {
                    for (uint64_t i = 0; i < rows * cols; i++) {
                        uint16_t half;
                        memcpy(&half, data + begin + 2 * i, 2);
                        const uint32_t bits = (uint32_t)half << 16;  // bf16 widens exactly
                        memcpy(&dst[i], &bits, 4);
                    }
                }
            }
        }
    // any other tensor belongs to a module or layer without an adapter here (the parser refuses duplicate names)
    if (header.members.size() - (header.find("__metadata__") != nullptr) > expected.size())
        for (const auto& m : header.members)
            if (m.first != "__metadata__" && !expected.count(m.first)) die(path + ": unknown tensor " + m.first + " (not an adapter of target_modules)");
    return spec;
}
