// Fuzzes checkpoints' optimizer-state files (model/state_file.h: read_optimizer_state, read_state_header) for a
// small model (2 layers, 64 channels, vocabulary 100). The input is the state file of writer rank 0; when its header
// names a mesh of up to 8 ranks, every other rank's file is a copy with that rank's coordinates in the header. Each
// file is written as it is and, when the header's element count makes it small enough, again with its body cut or
// padded with zeros to the size that count needs, so that the reassembly runs without the input carrying megabytes.
// Header words the format leaves unused choose this run's side: [100] its part (0 the whole model, 1 the first
// pipeline stage, 2 the last) and [101] its unit padding. An accepted checkpoint must fill this run's layout, and
// one written by one rank must hold the whole model.
#include <sys/stat.h>
#include <cstddef>
#include "fuzz_util.h"
#include "model/state_file.h"

namespace {

constexpr int kStep = 1, kMaxFiles = 8;
constexpr size_t kMaxPaddedBytes = 4 << 20;

ModelConfig small_model() {
    ModelConfig c;
    c.num_layers = 2;
    c.channels = 64;
    c.num_heads = 1;
    c.max_seq_len = 8;
    c.vocab_size = 100;
    c.padded_vocab_size = 128;
    return c;
}

// Writes writer rank r's file for each rank the header's mesh has (up to kMaxFiles), `body_bytes` after the header
// when not 0 (cut or padded), else the input's whole length.
void write_state_files(const std::string& dir, const uint8_t* data, size_t size, const StateHeader& h, int files, size_t body_bytes) {
    MeshShape writer;
    writer.dp = h.data_parallel, writer.tp = h.tensor_parallel, writer.pp = h.pipeline_parallel;
    for (int r = 0; r < files; r++) {
        std::vector<uint8_t> bytes(data, data + (body_bytes ? std::min(size, 1024 + body_bytes) : size));
        if (body_bytes) bytes.resize(1024 + body_bytes, 0);
        if (r > 0) {  // the rank's own coordinates, as its writer put them
            const MeshCoord c = mesh_coord(writer, r);
            const int at[] = {(int)offsetof(StateHeader, data_rank), (int)offsetof(StateHeader, tensor_rank), (int)offsetof(StateHeader, pipeline_rank)};
            const int value[] = {c.dp, c.tp, c.pp};
            for (int k = 0; k < 3; k++) memcpy(&bytes[16 + at[k]], &value[k], 4);
        }
        write_file(state_path(dir, kStep, r), bytes.data(), bytes.size());
    }
}

void read_and_check(const std::string& dir, const ParameterLayout& part, const uint8_t* data, size_t size) {
    SavedOptimizerState saved;
    if (refused([&] { saved = read_optimizer_state(dir, kStep, part, 0); })) return;
    FUZZ_CHECK(saved.m.size() == part.total && saved.v.size() == part.total, "the moments fill this run's layout");
    FUZZ_CHECK(saved.master.empty() == !saved.header.has_master && (saved.master.empty() || saved.master.size() == part.total),
               "the master weights fill this run's layout when the header says they were kept");
    const StateHeader& h = saved.header;
    if (h.data_parallel * h.tensor_parallel * h.pipeline_parallel == 1) {  // one rank wrote it: the whole model
        bool whole = header_word(data, size, kStatePartOffset) && header_word(data, size, kStatePartOffset + 1) &&
                     header_word(data, size, kStatePartOffset + 2) == part.config.num_layers;
        for (int l = 0; l < part.config.num_layers; l++) whole = whole && header_word(data, size, kStatePartOffset + 3 + l) == l;
        FUZZ_CHECK(whole, "a checkpoint of one rank holds the whole model");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string dir = [] {
        const std::string d = scratch_dir() + "/checkpoint";
        mkdir(d.c_str(), 0755);
        return d;
    }();
    for (int r = 0; r < kMaxFiles; r++) unlink(state_path(dir, kStep, r).c_str());

    const ModelConfig config = small_model();
    StageModel stage;
    const uint32_t side = (uint32_t)header_word(data, size, 100) % 3;
    if (side > 0) {
        stage.layers = {(int)side - 1};
        stage.first = side == 1;
        stage.last = side == 2;
    }
    const ParameterLayout part(config, 8 * (1 + (uint32_t)header_word(data, size, 101) % 4), 1, stage);

    StateHeader h;
    memset(&h, 0, sizeof h);
    if (size >= 16 + sizeof h) memcpy(&h, data + 16, sizeof h);
    const bool small_mesh = h.data_parallel >= 1 && h.tensor_parallel >= 1 && h.pipeline_parallel >= 1 && h.data_parallel <= kMaxFiles &&
                            h.tensor_parallel <= kMaxFiles && h.pipeline_parallel <= kMaxFiles &&
                            h.data_parallel * h.tensor_parallel * h.pipeline_parallel <= kMaxFiles;
    const int files = small_mesh ? h.data_parallel * h.tensor_parallel * h.pipeline_parallel : 1;

    write_state_files(dir, data, size, h, files, 0);
    read_and_check(dir, part, data, size);

    // every file with the body its header's element count needs: the arrays, then the data position
    if (size < 1024 || h.optimizer_elements < 0 || h.optimizer_elements > (long long)kMaxPaddedBytes) return 0;
    const size_t body = (h.has_master ? 3 : 2) * (size_t)h.optimizer_elements * sizeof(float) + sizeof(DataLoaderState);
    if (body * files > kMaxPaddedBytes || 1024 + body == size) return 0;
    write_state_files(dir, data, size, h, files, body);
    read_and_check(dir, part, data, size);
    return 0;
}
