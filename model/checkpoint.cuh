// Checkpoints (docs/formats.md): the whole model as an llm.c model file and one optimizer-state file per rank,
// written through temporary names and read back on any mesh and ZeRO stage, each file's checksum verified first.
// The state files' format and reader are state_file.h's.
// defines: checkpoint_path, complete_checkpoints, latest_checkpoint, prune_checkpoints, make_directories, write_state_file,
//          CheckpointCheck, check_checkpoint, newest_whole_checkpoint, verify_checkpoint_folder, save_checkpoint, resume_problem,
//          load_checkpoint, save_lora_outputs
#pragma once
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <dirent.h>
#include <unistd.h>
#include <sys/stat.h>
#include "../dataloader/dataloader.h"       // DataLoaderState
#include "../kernels/common.cuh"           // PrecisionOf
#include "../distributed/process_group.h"  // ProcessGroup
#include "../distributed/mesh.h"           // MeshShape, MeshCoord, mesh_rank
#include "../distributed/zero.cuh"         // ZeroOptimizer
#include "config.h"                        // ModelConfig, StageModel, ParameterLayout
#include "model_file.h"                    // read_model_file, write_model_file
#include "state_file.h"                    // StateHeader, state_path, read_state_header, read_optimizer_state
#include "gpt2.cuh"                        // GPT2
#include "whole_model.cuh"                 // full_parameters_host

// ---------------------------------------------------------------------------------------------
// Checkpoints: DIR/model_NNNNNNNN.bin, an ordinary llm.c model file of the parameters as trained (bf16 in
// bf16 mode, else fp32), and one DIR/state_NNNNNNNN_RRRRR.bin per rank that holds optimizer state (its
// shard of master weights and Adam moments: stages 1-3; at stage 0 the copy of data-parallel rank 0, one per
// tensor-parallel rank), the loss scale and the data position. Every file goes through a temporary name; the
// model file is written last, after all ranks finished their state, so it marks a complete checkpoint. A
// checkpoint resumes on any number of GPUs, any tensor-parallel degree and any ZeRO stage: the optimizer state
// is reassembled into the whole model (unit by unit from the shards, slice by slice from the tensor-parallel
// ranks) and cut into the new ranks' pieces.

inline std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/%s_%08d.bin", kind, step);
    return dir + name;
}

// The step a checkpoint file's name carries (model_NNNNNNNN.bin, state_NNNNNNNN_RRRRR.bin, either with .tmp), or -1
// for any other name.
inline int checkpoint_file_step(const std::string& name) {
    if (name.size() < 14 || (name.rfind("model_", 0) != 0 && name.rfind("state_", 0) != 0)) return -1;
    for (int i = 6; i < 14; i++)
        if (!isdigit((unsigned char)name[i])) return -1;
    return atoi(name.substr(6, 8).c_str());
}
// The names of the files in `dir` (none if it does not exist).
inline std::vector<std::string> directory_entries(const std::string& dir) {
    std::vector<std::string> names;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) names.push_back(e->d_name);
        closedir(d);
    }
    return names;
}
// The steps of the complete checkpoints in `dir`, ascending: those with a model file, the last file a checkpoint writes.
inline std::vector<int> complete_checkpoints(const std::string& dir) {
    std::vector<int> steps;
    for (const std::string& name : directory_entries(dir)) {
        const int step = checkpoint_file_step(name);
        if (step >= 0 && name.size() == 18 && name.rfind("model_", 0) == 0 && name.compare(14, 4, ".bin") == 0) steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}
// The highest step with a complete checkpoint in `dir`, or -1.
inline int latest_checkpoint(const std::string& dir) {
    const std::vector<int> steps = complete_checkpoints(dir);
    return steps.empty() ? -1 : steps.back();
}

// --keep-checkpoints K, --keep-every M: of the complete checkpoints `steps` (ascending), those to delete: all but
// the newest K and the milestones (steps that are multiples of M; M = 0: none). K >= 1 always keeps the newest.
inline std::vector<int> checkpoints_to_delete(const std::vector<int>& steps, int keep_newest, int keep_every) {
    std::vector<int> doomed;
    for (size_t i = 0; i + keep_newest < steps.size(); i++)
        if (keep_every <= 0 || steps[i] % keep_every != 0) doomed.push_back(steps[i]);
    return doomed;
}
// Deletes the checkpoints that the retention flags no longer keep, once a new one is complete. The model file
// goes first, so an interrupted deletion leaves an incomplete checkpoint that --resume ignores, never a model
// file without its state; state and temporary files of steps before the newest complete checkpoint that have no
// model file (left by such an interruption, or by a run killed while writing) go too. Returns the deleted
// complete checkpoints' steps. Failures to delete are warnings: they must not stop the training.
inline std::vector<int> prune_checkpoints(const std::string& dir, int keep_newest, int keep_every) {
    const std::vector<int> complete = complete_checkpoints(dir);
    if (complete.empty() || keep_newest <= 0) return {};
    const std::vector<int> doomed = checkpoints_to_delete(complete, keep_newest, keep_every);
    auto remove_file = [&](const std::string& path) {
        if (unlink(path.c_str()) != 0 && errno != ENOENT) fprintf(stderr, "warning: %s: cannot delete: %s\n", path.c_str(), strerror(errno));
    };
    for (int step : doomed) remove_file(checkpoint_path(dir, "model", step));
    const std::vector<int> kept = complete_checkpoints(dir);
    for (const std::string& name : directory_entries(dir)) {
        const int step = checkpoint_file_step(name);
        if (step >= 0 && step < complete.back() && !std::binary_search(kept.begin(), kept.end(), step)) remove_file(dir + "/" + name);
    }
    return doomed;
}

// mkdir -p: creates `dir` and any missing parents.
inline void make_directories(const std::string& dir) {
    for (size_t i = 1; i <= dir.size(); i++) {
        if (i < dir.size() && dir[i] != '/') continue;
        const std::string prefix = dir.substr(0, i);
        if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) die(prefix + ": cannot create folder: " + strerror(errno));
    }
}

// One rank's state file: header (the CRC-32C of the file in its last ints), then its master weights (if kept), Adam m
// and v, and the data position.
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
    const FileParts parts = {{header, sizeof(header)},
                             {master.data(), master.size() * sizeof(float)},
                             {m.data(), m.size() * sizeof(float)},
                             {v.data(), v.size() * sizeof(float)},
                             {&data_state, sizeof(data_state)}};
    seal_file_checksum(header, parts);
    write_file_atomically(path, parts);
}

// Whether checkpoint `step` in `dir` is whole: its model file and every state file its writer wrote (the mesh and
// stage in the first state file's header say which) are each read once and their checksums compared. `problem`:
// the first damaged or missing file, in one line ("" when whole); `unchecked`: files that carry no checksum.
struct CheckpointCheck {
    std::string problem;
    int files = 0, unchecked = 0;
};
inline CheckpointCheck check_checkpoint(const std::string& dir, int step) {
    CheckpointCheck result;
    auto verify = [&](const std::string& path) {
        const FileChecksum c = check_file_checksum(path);
        result.files++;
        if (c.status == FileChecksum::kNone) result.unchecked++;
        if (c.status == FileChecksum::kDamaged) result.problem = c.problem;
        return result.problem.empty();
    };
    const std::string first = state_path(dir, step, 0);
    if (!verify(checkpoint_path(dir, "model", step)) || !verify(first)) return result;
    int header[256];
    FILE* f = fopen(first.c_str(), "rb");
    const bool read = f != nullptr && fread(header, sizeof(int), 256, f) == 256;
    if (f != nullptr) fclose(f);
    result.problem = read ? state_header_problem(header, first) : first + ": not a train_gpt state file (bad magic)";
    if (!result.problem.empty()) return result;
    StateHeader h;
    memcpy(&h, &header[4], sizeof(h));
    MeshShape writer;
    writer.tp = h.tensor_parallel;
    writer.pp = h.pipeline_parallel;
    writer.dp = h.data_parallel;
    for (int p = 0; p < writer.pp; p++)
        for (int t = 0; t < writer.tp; t++)
            for (int d = 0; d < (h.stage >= 1 ? writer.dp : 1); d++) {  // at stage 0 data rank 0 alone writes
                MeshCoord coord;
                coord.tp = t;
                coord.pp = p;
                coord.dp = d;
                const int rank = mesh_rank(writer, coord);
                if (rank != 0 && !verify(state_path(dir, step, rank))) return result;
            }
    return result;
}

// --resume 1's checkpoint: the newest complete one in `dir` that is whole, or -1 when there is none. Each damaged
// one newer than it is named on `out` with its reason; when checkpoints exist but none is whole, the run stops
// (it never starts again from scratch over a folder of checkpoints).
inline int newest_whole_checkpoint(const std::string& dir, FILE* out) {
    const std::vector<int> steps = complete_checkpoints(dir);
    std::string newest_problem;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        const CheckpointCheck check = check_checkpoint(dir, *it);
        if (check.problem.empty()) {
            if (check.unchecked > 0)
                fprintf(out, "note: checkpoint %s: %d of its %d files carry no checksum, so they were not verified\n",
                        checkpoint_path(dir, "model", *it).c_str(), check.unchecked, check.files);
            return *it;
        }
        if (newest_problem.empty()) newest_problem = check.problem;
        fprintf(out, "skipping checkpoint %s: %s\n", checkpoint_path(dir, "model", *it).c_str(), check.problem.c_str());
    }
    if (!steps.empty())
        die("--resume 1: none of the " + std::to_string(steps.size()) + " checkpoints in " + dir + " is whole (the newest: " + newest_problem +
            "); move them away to start from scratch");
    return -1;
}

// --verify-checkpoints DIR: every complete checkpoint in DIR, newest first, checked as --resume checks them, one
// line each; no GPU is used. Returns the exit status: 0 when the newest is whole, 1 otherwise (or when there is none).
inline int verify_checkpoint_folder(const std::string& dir, FILE* out) {
    const std::vector<int> steps = complete_checkpoints(dir);
    if (steps.empty()) {
        fprintf(out, "%s: no complete checkpoint (no model_NNNNNNNN.bin)\n", dir.c_str());
        return 1;
    }
    bool newest_whole = false;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        const CheckpointCheck check = check_checkpoint(dir, *it);
        if (it == steps.rbegin()) newest_whole = check.problem.empty();
        if (!check.problem.empty()) fprintf(out, "step %d: damaged: %s\n", *it, check.problem.c_str());
        else if (check.unchecked > 0) fprintf(out, "step %d: whole as far as known: %d files, %d without a checksum\n", *it, check.files, check.unchecked);
        else fprintf(out, "step %d: whole: %d files, every checksum matches\n", *it, check.files);
    }
    return newest_whole ? 0 : 1;
}

// Why checkpoint `step` in `dir` cannot continue a run of `run` in `precision`, or "": from the files' headers,
// before anything is allocated. The model's whole shape and the precision must match; the mesh (data, tensor,
// pipeline parallel), the pipeline's split and the ZeRO stage may differ, since the optimizer state is cut into
// this run's pieces. (LoRA runs do not checkpoint: they save and load adapter files.)
inline std::string resume_problem(const std::string& dir, int step, const ModelConfig& run, Precision precision) {
    const std::string model_path = checkpoint_path(dir, "model", step);
    FILE* f = fopen(model_path.c_str(), "rb");
    if (f == nullptr) return model_path + ": cannot open: " + strerror(errno);
    int version;
    const ModelConfig saved = read_model_header(f, model_path, &version);
    fclose(f);
    struct Field {
        const char* what;
        int saved, run;
        const char* flags;
    };
    for (const Field& x : {Field{"layers", saved.num_layers, run.num_layers, "--model, --layers"},
                           Field{"heads", saved.num_heads, run.num_heads, "--model, --heads"},
                           Field{"channels", saved.channels, run.channels, "--model, --channels"},
                           Field{"maximum sequence length", saved.max_seq_len, run.max_seq_len, "--max-seq-len"},
                           Field{"vocabulary", saved.vocab_size, run.vocab_size, "--model"},
                           Field{"padded vocabulary", saved.padded_vocab_size, run.padded_vocab_size, "--model"}})
        if (x.saved != x.run)
            return model_path + ": the checkpoint's " + x.what + " is " + std::to_string(x.saved) + ", this run's " + std::to_string(x.run) +
                   " (" + x.flags + "): --resume 1 continues the same model";
    const std::string first_state = state_path(dir, step, 0);
    FILE* g = fopen(first_state.c_str(), "rb");
    if (g == nullptr) return first_state + ": cannot open (the checkpoint's optimizer state): " + strerror(errno);
    const StateHeader h = read_state_header(g, first_state);
    fclose(g);
    const char* names[] = {"fp32", "bf16", "fp16"};
    if (h.precision != (int)precision)
        return first_state + ": saved with --precision " + (h.precision >= 0 && h.precision < 3 ? names[h.precision] : "?") + ", this run uses " +
               names[(int)precision] + ": --resume 1 continues in the same precision";
    return "";
}

// Every rank writes its optimizer state (at stage 0 one rank of each data-parallel group: the copies are the
// same); rank 0 writes the whole model, gathered from all ranks, as an ordinary llm.c model file.
template <typename floatX>
void save_checkpoint(const std::string& dir, int step, GPT2<floatX>& model, const DataLoaderState& data_state) {
    ZeroOptimizer<floatX>& zero = *model.zero;
    const ProcessGroup& pg = model.pg;
    const ProcessMesh& mesh = model.mesh;
    if (pg.is_main()) make_directories(dir);
    // a collective (ZeRO-3, tensor and pipeline parallelism): every rank takes part, rank 0 alone gets the whole model
    const std::vector<float> params = full_parameters_host(model);
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
// may come from any mesh and ZeRO stage; its shape and precision are the caller's check, resume_problem(), which
// train() runs before the GPU is touched.
template <typename floatX>
DataLoaderState load_checkpoint(const std::string& dir, int step, GPT2<floatX>& model) {
    ZeroOptimizer<floatX>& zero = *model.zero;
    model.load_parameters(checkpoint_path(dir, "model", step));  // this rank's part only, as the state below
    const SavedOptimizerState saved = read_optimizer_state(dir, step, model.layout, model.mesh.tensor.rank);
    zero.optimizer_state_from_host(saved.master.empty() ? saved.master : zero.optimizer_part(saved.master), zero.optimizer_part(saved.m),
                                   zero.optimizer_part(saved.v));
    zero.scaler.scale = saved.header.loss_scale;
    zero.scaler.clean_steps = saved.header.clean_steps;
    zero.scaler.skipped_steps = saved.header.skipped_steps;
    return saved.data_state;
}

// LoRA's outputs at the end of a run: the adapter file (--lora-save) and the base model with the adapters merged
// in, as a model file (--lora-merge). Every rank takes part in reading the parameters; the main rank writes.
template <typename floatX>
void save_lora_outputs(FILE* out, GPT2<floatX>& model, const std::string& adapter_path, const std::string& merged_path, bool main_rank) {
    if (adapter_path.empty() && merged_path.empty()) return;
    const std::vector<float> adapter_values = model.adapters->parameters_host();
    const std::vector<float> base_values = model.zero->parameters_host();
    if (main_rank && !adapter_path.empty()) {
        write_adapter_file(adapter_path, *model.adapter_layout, adapter_values);
        fprintf(out, "wrote adapters %s\n", adapter_path.c_str());
    }
    if (main_rank && !merged_path.empty()) {
        write_model_file(merged_path, model.layout, merge_adapters(model.layout, base_values, *model.adapter_layout, adapter_values), false);
        fprintf(out, "wrote the merged model %s\n", merged_path.c_str());
    }
}
