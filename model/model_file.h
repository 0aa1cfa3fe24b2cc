// llm.c model files: a 256-int header (magic, version, shape), then every parameter as fp32 (version 3) or bf16
// (version 5) in llm.c's tensor-major order, converted to and from the device's block-major layout.
// defines: kModelMagic, kModelVersionFP32, kModelVersionBF16, float_to_bf16_bits, bf16_bits_to_float, read_model_header,
//          open_model_file, read_model_config, read_model_part, read_model_file, write_model_file
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "config.h"          // ModelConfig, config_problem, ParameterLayout
#include "file_integrity.h"  // seal_file_checksum, write_file_atomically

// ---------------------------------------------------------------------------------------------
// llm.c model files. Values travel as fp32 on the host in device (block-major) order.

constexpr int kModelMagic = 20240326;
constexpr int kModelVersionFP32 = 3, kModelVersionBF16 = 5;

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

// Opens an llm.c model file and checks its size against its header's shape; leaves the position after the header.
inline FILE* open_model_file(const std::string& path, ModelConfig* config, size_t* element_bytes) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) die(path + ": cannot open model file: " + strerror(errno));
    int version;
    *config = read_model_header(f, path, &version);
    *element_bytes = version == kModelVersionFP32 ? 4 : 2;
    fseek(f, 0, SEEK_END);
    const long file_size = ftell(f);
    const long expected = 1024 + (long)(ParameterLayout(*config).count * *element_bytes);
    if (file_size != expected)
        die(path + ": size " + std::to_string(file_size) + " bytes, expected " + std::to_string(expected) + " for its header's shape");
    fseek(f, 1024, SEEK_SET);
    return f;
}
// An llm.c model file's shape, its size checked against it (no parameter read).
inline ModelConfig read_model_config(const std::string& path) {
    ModelConfig config;
    size_t element_bytes;
    fclose(open_model_file(path, &config, &element_bytes));
    return config;
}

// Reads tensor-parallel rank `rank`'s slices of `part` (a layout of part.config's model: one pipeline stage's,
// any padding) out of an llm.c model file of that shape, fp32 in `part`'s order. Only those bytes are read: a
// rank's host memory holds its part, not the whole model.
inline std::vector<float> read_model_part(const std::string& path, const ParameterLayout& part, int rank) {
    ModelConfig c;
    size_t element_bytes;
    FILE* f = open_model_file(path, &c, &element_bytes);
    if (c.num_layers != part.config.num_layers || c.channels != part.config.channels || c.num_heads != part.config.num_heads ||
        c.max_seq_len != part.config.max_seq_len || c.vocab_size != part.config.vocab_size || c.padded_vocab_size != part.config.padded_vocab_size)
        die(path + ": the model file's shape differs from this run's");
    const ParameterLayout whole(c);  // tp 1, every layer: the file's tensors
    std::vector<LayoutRun> in_file;  // whole-model offset -> file offset
    whole.for_each_file_run([&](size_t file_offset, size_t offset, size_t n) { in_file.push_back({offset, file_offset, n}); });
    sort_by_full(in_file);
    std::vector<LayoutRun> reads;  // `full` holds the file offset here
    for_each_shared_run(in_file, sorted_full_runs(part, whole, rank), [&](size_t file_offset, size_t local, size_t n) {
        reads.push_back({file_offset, local, n});
    });
    sort_by_full(reads);
    std::vector<float> values(part.total, 0.0f);
    std::vector<uint8_t> raw;
    size_t position = 0;  // in elements after the header
    for (const LayoutRun& r : reads) {
        raw.resize(r.count * element_bytes);
        if (r.full != position && fseek(f, 1024 + (long)(r.full * element_bytes), SEEK_SET) != 0) die(path + ": seek failed");
        if (fread(raw.data(), 1, raw.size(), f) != raw.size()) die(path + ": read failed");
        position = r.full + r.count;
        for (size_t i = 0; i < r.count; i++) {
            if (element_bytes == 4) memcpy(&values[r.local + i], &raw[i * 4], 4);
            else {
                uint16_t b;
                memcpy(&b, &raw[i * 2], 2);
                values[r.local + i] = bf16_bits_to_float(b);
            }
        }
    }
    fclose(f);
    return values;
}

// Reads a whole llm.c model file into `values` (fp32, device order) in the layout with the given unit padding
// (see ParameterLayout); returns its shape.
inline ModelConfig read_model_file(const std::string& path, std::vector<float>& values, size_t unit_multiple = 8) {
    const ModelConfig config = read_model_config(path);
    values = read_model_part(path, ParameterLayout(config, unit_multiple), 0);
    return config;
}

// Writes `values` (fp32, device order) as an llm.c model file: fp32 (version 3) or bf16 (version 5), with the
// CRC-32C of its bytes in the header's last ints (file_integrity.h; llm.c reads ints 0-7). Written to a temporary
// name, flushed and renamed, so a crash or a full disk never leaves a half-written file.
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
    const FileParts parts = {{header, sizeof(header)}, {raw.data(), raw.size()}};
    seal_file_checksum(header, parts);
    write_file_atomically(path, parts);
}
