// Checkpoints (docs/formats.md): the whole model as an llm.c model file and one optimizer-state file per rank,
// written through temporary names and read back on any mesh and ZeRO stage; and the file utilities they use
// (make_directories, write_file_atomically).
// defines: kStateMagic, kStateVersion, checkpoint_path, state_path, latest_checkpoint, make_directories, write_file_atomically,
//          StateHeader, write_state_file, read_state_header, SavedOptimizerState, read_optimizer_state, save_checkpoint,
//          load_checkpoint
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <dirent.h>
#include <sys/stat.h>
#include "../dataloader/dataloader.h"       // DataLoaderState
#include "../kernels/common.cuh"           // PrecisionOf
#include "../distributed/process_group.h"  // ProcessGroup
#include "../distributed/mesh.h"           // MeshShape, MeshCoord, mesh_rank
#include "../distributed/zero.cuh"         // ZeroOptimizer
#include "config.h"                        // die, ModelConfig, StageModel, ParameterLayout
#include "model_file.h"                    // read_model_file, write_model_file
#include "gpt2.cuh"                        // GPT2

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
