// llm.c model files: a 256-int header (magic, version, shape), then every parameter as fp32 (version 3) or bf16
// (version 5) in llm.c's tensor-major order, converted to and from the device's block-major layout.
// defines: kModelMagic, kModelVersionFP32, kModelVersionBF16, float_to_bf16_bits, bf16_bits_to_float, parse_model_header, read_model_header,
//          open_model_file, read_model_config, read_model_part, read_model_file, fill_model_header, write_model_file, model_file_runs, ModelFilePart,
//          seal_model_file
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <fcntl.h>
#include <unistd.h>
#include "config.h"          // ModelConfig, config_problem, ParameterLayout
#include "file_integrity.h"  // seal_file_checksum, write_file_atomically
#include "checked_reads.h"   // CheckedFile, CheckpointReads

// ---------------------------------------------------------------------------------------------
// llm.c model files. Values travel as fp32 on the host in device (block-major) order.

// GPT-2: llm.c's model file (magic 20240326; header ints 0-7). The Llama family: the same file with its own magic and
// the family's shape in ints 8-16 (docs/formats.md).
constexpr int kModelMagic = 20240326, kLlamaModelMagic = 20261207;
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

inline float header_float(int bits) {
    float x;
    memcpy(&x, &bits, 4);
    return x;
}
inline int float_header(float x) {
    int bits;
    memcpy(&bits, &x, 4);
    return bits;
}

// A model file's shape from its 256 header ints; its version (fp32 or bf16) into `version`.
inline ModelConfig parse_model_header(const int* header, const std::string& path, int* version) {
    if (header[0] != kModelMagic && header[0] != kLlamaModelMagic)
        die(path + ": bad magic " + std::to_string(header[0]) + " (expected " + std::to_string(kModelMagic) + ", an llm.c GPT-2 model file, or " +
            std::to_string(kLlamaModelMagic) + ", a Llama-family one)");
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
    if (header[0] == kLlamaModelMagic) {
        c.family = ModelFamily::kLlama;
        c.kv_heads = header[8];
        c.ffn = header[9];
        if ((header[10] & ~3) != 0) die(path + ": unknown flags " + std::to_string(header[10]) + " in header int 10 (1: q, k, v biases; 2: tied head)");
        c.qkv_bias = (header[10] & 1) != 0;
        c.tied_head = (header[10] & 2) != 0;
        c.norm_eps = header_float(header[11]);
        c.rope_theta = header_float(header[12]);
        c.rope_scaling.factor = header_float(header[13]);
        c.rope_scaling.low_freq_factor = header_float(header[14]);
        c.rope_scaling.high_freq_factor = header_float(header[15]);
        c.rope_scaling.original_max_positions = header[16];
    }
    std::string problem = config_problem(c);
    if (!problem.empty()) die(path + ": " + problem);
    return c;
}
inline ModelConfig read_model_header(FILE* f, const std::string& path, int* version) {
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) die(path + ": too short for a model header (1024 bytes)");
    return parse_model_header(header, path, version);
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
// any padding) out of an llm.c model file of that shape, fp32 in `part`'s order, reading the file front to back once.
// Only those bytes are read, unless `reads` has this rank verify the file: then it reads all of them, checksumming
// what it skips (checked_reads.h). A rank's host memory holds its part, not the whole model.
inline std::vector<float> read_model_part(const std::string& path, const ParameterLayout& part, int rank, CheckpointReads* reads = nullptr) {
    CheckedFile f(path, reads, "model file");
    int header[256];
    if (f.size() < sizeof(header)) die(path + ": too short for a model header (1024 bytes)");
    f.read(header, sizeof(header), "the header");
    int version;
    const ModelConfig c = parse_model_header(header, path, &version);
    const size_t element_bytes = version == kModelVersionFP32 ? 4 : 2;
    const uint64_t expected = 1024 + (uint64_t)ParameterLayout(c).count * element_bytes;
    if (f.size() != expected)
        die(path + ": size " + std::to_string(f.size()) + " bytes, expected " + std::to_string(expected) + " for its header's shape");
    const std::string difference = config_difference(c, part.config);
    if (!difference.empty()) die(path + ": the model file's " + difference);
    const ParameterLayout whole(c);  // tp 1, every layer: the file's tensors
    std::vector<LayoutRun> in_file;  // whole-model offset -> file offset
    whole.for_each_file_run([&](size_t file_offset, size_t offset, size_t n) { in_file.push_back({offset, file_offset, n}); });
    sort_by_full(in_file);
    std::vector<LayoutRun> runs;  // `full` holds the file offset here
    for_each_shared_run(in_file, sorted_full_runs(part, whole, rank), [&](size_t file_offset, size_t local, size_t n) {
        runs.push_back({file_offset, local, n});
    });
    sort_by_full(runs);
    std::vector<float> values(part.total, 0.0f);
    std::vector<uint8_t> raw;
    for (const LayoutRun& r : runs) {
        raw.resize(r.count * element_bytes);
        f.skip_to(1024 + (uint64_t)r.full * element_bytes);
        f.read(raw.data(), raw.size(), "the parameters");
        for (size_t i = 0; i < r.count; i++) {
            if (element_bytes == 4) memcpy(&values[r.local + i], &raw[i * 4], 4);
            else {
                uint16_t b;
                memcpy(&b, &raw[i * 2], 2);
                values[r.local + i] = bf16_bits_to_float(b);
            }
        }
    }
    return values;
}

// Reads a whole llm.c model file into `values` (fp32, device order) in the layout with the given unit padding
// (see ParameterLayout); returns its shape.
inline ModelConfig read_model_file(const std::string& path, std::vector<float>& values, size_t unit_multiple = 8) {
    const ModelConfig config = read_model_config(path);
    values = read_model_part(path, ParameterLayout(config, unit_multiple), 0);
    return config;
}

// A model file's header for shape `c`: magic, version (fp32 or bf16), the shape; for a checkpoint (run_id != 0) the
// run's identity (stamp_run_identity); the checksum's slots 0.
inline void fill_model_header(int* header, const ModelConfig& c, bool bf16, uint64_t run_id, int step) {
    std::fill(header, header + 256, 0);
    header[0] = c.llama() ? kLlamaModelMagic : kModelMagic;
    header[1] = bf16 ? kModelVersionBF16 : kModelVersionFP32;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    if (c.llama()) {
        header[8] = c.key_value_heads();
        header[9] = c.hidden_units();
        header[10] = (c.qkv_bias ? 1 : 0) | (c.tied_head ? 2 : 0);
        header[11] = float_header(c.norm_eps);
        header[12] = float_header(c.rope_theta);
        header[13] = float_header(c.rope_scaling.factor);
        header[14] = float_header(c.rope_scaling.low_freq_factor);
        header[15] = float_header(c.rope_scaling.high_freq_factor);
        header[16] = c.rope_scaling.original_max_positions;
    }
    if (run_id != 0) stamp_run_identity(header, run_id, step);
}

// Writes `values` (fp32, device order) as an llm.c model file: fp32 (version 3) or bf16 (version 5), with the
// CRC-32C of its bytes in the header's last ints (file_integrity.h; llm.c reads ints 0-7) and, for a checkpoint
// (run_id != 0), the run's identity (stamp_run_identity). Written to a temporary name, flushed, renamed and the folder synced, so a crash
// or a full disk never leaves a half-written file. Returns the file as a checkpoint's manifest lists it.
inline FileRecord write_model_file(const std::string& path, const ParameterLayout& layout, const std::vector<float>& values, bool bf16,
                                   uint64_t run_id = 0, int step = 0) {
    const ModelConfig& c = layout.config;
    int header[256];
    fill_model_header(header, c, bf16, run_id, step);
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
    FileRecord record;
    record.crc = seal_file_checksum(header, parts);
    record.bytes = write_file_atomically(path, parts);
    record.name = path.substr(path.rfind('/') + 1);
    return record;
}

// ---------------------------------------------------------------------------------------------
// A checkpoint's model file written in bounded host memory: every rank that holds parameters writes its own share
// into the temporary file in place (ModelFilePart, a unit at a time), then rank 0 seals it (seal_model_file: the
// header, the checksum read back from the file, the rename). No rank holds more than one unit of parameters for it.

// The runs of tensor-parallel rank `rank`'s part (`part`: a pipeline stage's slices, any padding) in an llm.c model
// file of the whole model: `full` is the file offset in elements, sorted by `local`. Each element of the file is
// owned by one rank: the replicated tensors by tensor-parallel rank 0, the tied token embedding by the first stage.
inline std::vector<LayoutRun> model_file_runs(const ParameterLayout& part, int rank) {
    const ParameterLayout whole(part.config);  // tp 1, every layer: the file's tensors
    std::vector<LayoutRun> in_file;            // whole-model offset -> file offset
    whole.for_each_file_run([&](size_t file_offset, size_t offset, size_t n) { in_file.push_back({offset, file_offset, n}); });
    sort_by_full(in_file);
    const LayoutMask split = part.split_mask();
    std::vector<LayoutRun> runs;
    for_each_shared_run(in_file, sorted_full_runs(part, whole, rank), [&](size_t file_offset, size_t local, size_t n) {
        const bool tied_copy = part.part.tied_copy() && local >= part.wte && local < part.wte_end();
        if (!tied_copy && (rank == 0 || split.contains((long)local))) runs.push_back({file_offset, local, n});
    });
    std::sort(runs.begin(), runs.end(), [](const LayoutRun& a, const LayoutRun& b) { return a.local < b.local; });
    return runs;
}

// One rank's share of a model file, written into `tmp` (created if need be, never truncated: the ranks write at once)
// at the file's offsets as units of its part arrive, fp32 or bf16.
class ModelFilePart {
public:
    ModelFilePart(const std::string& tmp, const ParameterLayout& part, int rank, bool bf16)
        : path_(tmp), runs_(model_file_runs(part, rank)), element_bytes_(bf16 ? 2 : 4) {
        fd_ = open(tmp.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) die(tmp + ": cannot create: " + strerror(errno));
    }
    ~ModelFilePart() {
        if (fd_ >= 0) close(fd_);
    }
    // values[i] is the part's element `offset` + i (a unit of it, in the part's order).
    void write(size_t offset, const float* values, size_t n) {
        auto it = std::upper_bound(runs_.begin(), runs_.end(), offset, [](size_t at, const LayoutRun& r) { return at < r.local; });
        if (it != runs_.begin()) --it;
        for (; it != runs_.end() && it->local < offset + n; ++it) {
            const size_t begin = std::max(offset, it->local), end = std::min(offset + n, it->local + it->count);
            if (begin >= end) continue;
            raw_.resize((end - begin) * element_bytes_);
            for (size_t i = begin; i < end; i++) {
                if (element_bytes_ == 4) memcpy(&raw_[(i - begin) * 4], &values[i - offset], 4);
                else {
                    const uint16_t b = float_to_bf16_bits(values[i - offset]);
                    memcpy(&raw_[(i - begin) * 2], &b, 2);
                }
            }
            const off_t at = 1024 + (off_t)((it->full + (begin - it->local)) * element_bytes_);
            for (size_t done = 0; done < raw_.size();) {
                const ssize_t put = pwrite(fd_, raw_.data() + done, raw_.size() - done, at + (off_t)done);
                if (put < 0 && errno == EINTR) continue;
                if (put <= 0) die(path_ + ": cannot write: " + strerror(put < 0 ? errno : EIO));
                done += (size_t)put;
            }
        }
    }
    // Makes this rank's share durable.
    void finish() {
        if (fsync(fd_) != 0) die(path_ + ": cannot write (fsync): " + strerror(errno));
        if (close(fd_) != 0) die(path_ + ": cannot write (close): " + strerror(errno));
        fd_ = -1;
        fault_point();
    }

private:
    std::string path_;
    std::vector<LayoutRun> runs_;
    size_t element_bytes_;
    int fd_ = -1;
    std::vector<uint8_t> raw_;
};

// Rank 0, once every rank's share of path + ".tmp" is durable: cuts it to its size, writes the header (the shape,
// the run's identity and the CRC-32C of the whole file, read back in 16 MiB pieces), makes it durable and renames
// it into place. Returns the file as a checkpoint's manifest lists it.
inline FileRecord seal_model_file(const std::string& path, const ModelConfig& c, bool bf16, uint64_t run_id, int step) {
    const std::string tmp = path + ".tmp";
    int header[256];
    fill_model_header(header, c, bf16, run_id, step);
    header[kChecksumTagSlot] = kChecksumTag;
    const uint64_t bytes = 1024 + (uint64_t)ParameterLayout(c).count * (bf16 ? 2 : 4);
    const int fd = open(tmp.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) die(tmp + ": cannot open the written model file: " + strerror(errno));
    auto fail = [&](const std::string& what) {
        const int error = errno;
        close(fd);
        unlink(tmp.c_str());
        die(path + ": cannot " + what + ": " + strerror(error) + " (nothing was written under this name; the files before it are untouched)");
    };
    if (ftruncate(fd, (off_t)bytes) != 0) fail("write");
    Crc32c crc;
    crc.update(header, sizeof(header));
    std::vector<uint8_t> buffer(16u << 20);
    for (uint64_t at = 1024; at < bytes;) {
        const ssize_t got = pread(fd, buffer.data(), (size_t)std::min<uint64_t>(buffer.size(), bytes - at), (off_t)at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) fail("read back the written model file");
        crc.update(buffer.data(), (size_t)got);
        at += (uint64_t)got;
    }
    FileRecord record;
    record.crc = crc.value();
    memcpy(&header[kChecksumSlot], &record.crc, 4);
    if (pwrite(fd, header, sizeof(header), 0) != (ssize_t)sizeof(header)) fail("write");
    fault_point();
    if (fsync(fd) != 0) fail("write (fsync)");
    if (close(fd) != 0) {
        unlink(tmp.c_str());
        die(path + ": cannot write (close): " + strerror(errno));
    }
    fault_point();
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        const int error = errno;
        unlink(tmp.c_str());
        die(path + ": cannot rename the written file into place: " + strerror(error));
    }
    fault_point();
    const std::string problem = sync_directory(folder_of(path));
    if (!problem.empty()) die(problem);
    record.bytes = bytes;
    record.name = path.substr(path.rfind('/') + 1);
    return record;
}
