// Checkpoints on the GPU's side (docs/formats.md): the whole model as an llm.c model file and one optimizer-state file
// per rank, committed as one unit by a manifest (checkpoint_store.h: the files, the commit, the choice at resume,
// retention), and read back on any mesh and ZeRO stage. The state files' format and reader are state_file.h's.
// defines: NcclRankExchange, resume_problem, save_checkpoint, load_checkpoint, save_lora_outputs
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include "../dataloader/dataloader.h"       // DataLoaderState
#include "../kernels/common.cuh"           // PrecisionOf
#include "../distributed/process_group.h"  // ProcessGroup
#include "../distributed/mesh.h"           // MeshShape, MeshCoord, mesh_rank
#include "../distributed/zero.cuh"         // ZeroOptimizer
#include "config.h"                        // ModelConfig, StageModel, ParameterLayout
#include "model_file.h"                    // read_model_file, ModelFilePart, seal_model_file
#include "lora.h"                          // read_adapter_file, write_adapter_file
#include "peft_adapters.h"                 // is_peft_folder_path, write_peft_folder
#include "state_file.h"                    // StateHeader, state_path, read_state_header, write_state_file, read_optimizer_state
#include "checkpoint_store.h"              // CheckpointManifest, RankExchange, save_committed_checkpoint, checkpoint_path
#include "transformer.cuh"                 // Transformer
#include "whole_model.cuh"                 // assemble_whole_model, whole_adapter_layout, set_adapters, assemble_whole_adapters

// The ranks' exchanges of a save or a resume over the world's NCCL communicator (ProcessGroup::all_gather_host): a
// record is its size, CRC-32C and whether the rank wrote a file, whose name is the rank's state file of `step`.
class NcclRankExchange : public RankExchange {
public:
    NcclRankExchange(const ProcessGroup& pg, int step) : pg_(pg), step_(step) {}
    int rank() const override { return pg_.rank; }
    int world() const override { return pg_.world; }
    std::vector<FileRecord> all_gather(const FileRecord& mine) override {
        const std::vector<uint64_t> all = pg_.all_gather_host({mine.name.empty() ? 0u : 1u, mine.bytes, mine.crc});
        std::vector<FileRecord> records(pg_.world);
        for (int r = 0; r < pg_.world; r++) {
            if (all[3 * r] == 0) continue;
            records[r].name = state_path("", step_, r).substr(1);
            records[r].bytes = all[3 * r + 1];
            records[r].crc = (uint32_t)all[3 * r + 2];
        }
        return records;
    }
    int broadcast_from_main(int value) override { return (int)pg_.all_gather_host({(uint64_t)value}, false)[0]; }

private:
    const ProcessGroup& pg_;
    int step_;
};

// Why checkpoint `step` in `dir` cannot continue a run of `run` in `precision` (with `lora`'s adapters, where
// enabled), or "": from the files' headers, before anything is allocated. The model's whole shape and the precision
// must match; the mesh (data, tensor, pipeline parallel), the pipeline's split and the ZeRO stage may differ, since
// the optimizer state is cut into this run's pieces. A LoRA run's checkpoint holds the adapters and their optimizer
// state: its adapters' rank, alpha and targets must match, and its mesh and ZeRO stage (their shards are cut by them).
inline std::string resume_problem(const std::string& dir, int step, const ModelConfig& run, Precision precision, const LoraSpec& lora,
                                  const MeshShape& shape, int zero_stage) {
    const std::string first_state = state_path(dir, step, 0);
    FILE* g = fopen(first_state.c_str(), "rb");
    if (g == nullptr) return first_state + ": cannot open (the checkpoint's optimizer state): " + strerror(errno);
    const StateHeader h = read_state_header(g, first_state);
    fclose(g);
    const char* names[] = {"fp32", "bf16", "fp16"};
    if (h.precision != (int)precision)
        return first_state + ": saved with --precision " + (h.precision >= 0 && h.precision < 3 ? names[h.precision] : "?") + ", this run uses " +
               names[(int)precision] + ": --resume 1 continues in the same precision";
    if (lora.enabled()) {
        const std::string path = checkpoint_path(dir, "adapters", step);
        if (access(path.c_str(), F_OK) != 0)
            return manifest_path(dir, step) + ": a checkpoint of full training, this run trains LoRA adapters: --resume 1 continues the same kind of run";
        const LoraSpec saved = read_adapter_spec(path, run);  // the header alone: the load reads the file
        if (saved.rank != lora.rank || saved.alpha != lora.alpha || saved.targets != lora.targets)
            return path + ": adapters of rank " + std::to_string(saved.rank) + ", targets mask " + std::to_string(saved.targets) + "; this run's: rank " +
                   std::to_string(lora.rank) + ", targets mask " + std::to_string(lora.targets) + " (--lora-rank, --lora-alpha, --lora-targets)";
        const int stage = shape.dp == 1 ? 0 : zero_stage;  // the optimizer's: one data-parallel rank shards nothing
        if (h.data_parallel != shape.dp || h.stage != stage)
            return first_state + ": saved by " + std::to_string(h.data_parallel) + " data-parallel ranks at ZeRO stage " + std::to_string(h.stage) +
                   ", this run has " + std::to_string(shape.dp) + " at stage " + std::to_string(stage) +
                   ": a LoRA checkpoint resumes on the same data-parallel ranks and stage";
        return "";
    }
    const std::string model_path = checkpoint_path(dir, "model", step);
    FILE* f = fopen(model_path.c_str(), "rb");
    if (f == nullptr) return model_path + ": cannot open (" + strerror(errno) + ")" + (access(checkpoint_path(dir, "adapters", step).c_str(), F_OK) == 0
                                 ? ": a LoRA run's checkpoint, this run trains the whole model: --resume 1 continues the same kind of run" : "");
    int version;
    const ModelConfig saved = read_model_header(f, model_path, &version);
    fclose(f);
    const std::string difference = config_difference(saved, run);
    if (!difference.empty()) return model_path + ": the checkpoint's " + difference + ": --resume 1 continues the same model";
    return "";
}

// Checkpoint `manifest.step` as one committed unit (save_committed_checkpoint): every rank writes the optimizer state
// of what trains (at stage 0 one rank of each data-parallel group: the copies are the same) and its share of the whole
// model into the model file, a unit at a time (ModelFilePart: the replicas of data rank 0 write, each tensor-parallel
// and pipeline rank its own slices; ZeRO-3 gathers each unit over the data-parallel group, so every rank takes part);
// then rank 0 seals the model file (an ordinary llm.c model file) and commits the manifest. A LoRA run's checkpoint
// holds its adapter file instead (the frozen base is its --model). Every file carries the run id and the step. Host
// memory: the rank's optimizer state while its state file is written, then one unit of parameters (fp32 and floatX)
// for the model file. Returns true on every rank once committed; a failure on any rank ends the job before the
// manifest is written.
template <typename floatX>
bool save_checkpoint(const std::string& dir, const CheckpointManifest& manifest, Transformer<floatX>& model, const DataLoaderState& data_state) {
    ZeroOptimizer<floatX>& trained = model.trained();
    const ProcessGroup& pg = model.pg;
    const ProcessMesh& mesh = model.mesh;
    const int step = manifest.step;
    const bool lora = model.lora.enabled(), bf16 = std::is_same<floatX, __nv_bfloat16>::value;
    const std::string model_path = checkpoint_path(dir, lora ? "adapters" : "model", step);
    NcclRankExchange exchange(pg, step);
    std::vector<float> adapters;  // LoRA: the whole model's adapters on rank 0, gathered over the pipeline stages
    auto write_own = [&]() -> FileRecord {
        FileRecord record;
        if (lora) adapters = assemble_whole_adapters(model, false);
        if (trained.stage() >= 1 || mesh.data.rank == 0) {
            StateHeader h{step, (int)PrecisionOf<floatX>::value, mesh.data.size, mesh.tensor.size, mesh.pipeline.size, mesh.data.rank, mesh.tensor.rank,
                          mesh.pipeline.rank, trained.stage(), ZeroOptimizer<floatX>::kHasMaster, trained.scaler.clean_steps, trained.scaler.scale,
                          trained.scaler.skipped_steps, (long long)trained.optimizer_elements(), manifest.run_id};
            std::vector<float> master, m, v;
            trained.optimizer_state_to_host(master, m, v);
            record = write_state_file(state_path(dir, step, pg.rank), h, model.layout.part, master, m, v, data_state);
        }
        if (!lora) {
            std::unique_ptr<ModelFilePart> part;
            std::function<void(size_t, const float*, size_t)> visit;
            if (mesh.data.rank == 0) {
                part.reset(new ModelFilePart(model_path + ".tmp", model.layout, mesh.tensor.rank, bf16));
                visit = [&](size_t offset, const float* values, size_t n) { part->write(offset, values, n); };
            }
            model.zero->for_each_unit_host(visit);
            if (part) part->finish();
        }
        return record;
    };
    auto write_model = [&] {
        if (lora) return write_adapter_file(model_path, whole_adapter_layout(model), adapters, manifest.run_id, step);
        return seal_model_file(model_path, model.config, bf16, manifest.run_id, step);
    };
    return save_committed_checkpoint(dir, manifest, exchange, write_own, write_model);
}

// Restores the parameters, the optimizer state and the loss scale of what trains, each set whole (a second load over a
// first, after a damaged file, leaves nothing of the first); returns the data position to restore. Every file is read
// through `reads` (checked_reads.h: once, the files this rank verifies checksummed on the way). The checkpoint may
// come from any mesh and ZeRO stage (a LoRA run's: the same ones); its shape and precision are the caller's check,
// resume_problem(), which train() runs before the GPU is touched. A LoRA run's frozen base is its --model, loaded by
// the caller.
template <typename floatX>
DataLoaderState load_checkpoint(const std::string& dir, int step, Transformer<floatX>& model, CheckpointReads& reads) {
    ZeroOptimizer<floatX>& trained = model.trained();
    SavedOptimizerState saved;
    if (model.lora.enabled()) {
        std::vector<float> adapters;
        read_adapter_file(checkpoint_path(dir, "adapters", step), model.config, 8 * model.mesh.data.size, adapters, &reads);
        set_adapters(model, adapters);
        // ZeRO-0 keeps whole copies: data rank 0 of this rank's stage wrote them
        MeshCoord writer = model.mesh.coord;
        writer.dp = 0;
        const int rank = trained.stage() >= 1 ? model.pg.rank : mesh_rank(model.mesh.shape, writer);
        saved = read_own_optimizer_state(dir, step, rank, (size_t)trained.optimizer_elements(), &reads);
        trained.optimizer_state_from_host(saved.master, saved.m, saved.v);
    } else {
        model.zero->set_parameters(read_model_part(checkpoint_path(dir, "model", step), model.layout, model.mesh.tensor.rank, &reads));  // this rank's part
        saved = read_optimizer_state(dir, step, model.layout, model.mesh.tensor.rank, &reads);
        trained.optimizer_state_from_host(saved.master.empty() ? saved.master : trained.optimizer_part(saved.master), trained.optimizer_part(saved.m),
                                          trained.optimizer_part(saved.v));
    }
    trained.scaler.scale = saved.header.loss_scale;
    trained.scaler.clean_steps = saved.header.clean_steps;
    trained.scaler.skipped_steps = saved.header.skipped_steps;
    return saved.data_state;
}

// LoRA's outputs at the end of a run: the adapter file or PEFT folder (--lora-save) and the base model with the adapters merged
// in, as a model file (--lora-merge). Every rank takes part in reading the parameters; the main rank writes.
template <typename floatX>
void save_lora_outputs(FILE* out, Transformer<floatX>& model, const std::string& adapter_path, const std::string& merged_path, bool main_rank) {
    if (adapter_path.empty() && merged_path.empty()) return;
    const std::vector<float> adapter_values = assemble_whole_adapters(model, false);
    const std::vector<float> base_values =
        merged_path.empty() ? std::vector<float>() : assemble_whole_model(model, model.zero->parameters_host(), model.stage_parts, false);
    const AdapterLayout whole = whole_adapter_layout(model);
    if (main_rank && !adapter_path.empty()) {
        if (is_peft_folder_path(adapter_path)) write_peft_folder(adapter_path, whole, adapter_values);
        else write_adapter_file(adapter_path, whole, adapter_values);
        fprintf(out, "wrote adapters %s\n", adapter_path.c_str());
    }
    if (main_rank && !merged_path.empty()) {
        write_model_file(merged_path, model.full_layout, merge_adapters(model.full_layout, base_values, whole, adapter_values), false);
        fprintf(out, "wrote the merged model %s\n", merged_path.c_str());
    }
}
