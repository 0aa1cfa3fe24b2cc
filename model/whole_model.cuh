// The whole model and a rank's part of it: under tensor and pipeline parallelism a rank holds its pipeline
// stage's tensor-parallel slices (ParameterLayout `layout`), while model files, checkpoints and initial values
// describe the whole model (`full_layout`, tp = 1). local_part cuts a rank's part out of whole-model values;
// assemble_whole_model puts every rank's part back together (a collective of the tensor and pipeline groups).
// Reading and writing model files is model_file.h's (a checkpoint's model file: each rank writes its part in place).
// LoRA's adapters likewise: a pipeline stage holds its blocks' (set_adapters, assemble_whole_adapters).
// defines: holds_whole_model, local_part, set_parameters, assemble_whole_model, whole_adapter_layout, set_adapters,
//          assemble_whole_adapters
#pragma once
#include <algorithm>
#include <vector>
#include "../distributed/pipeline_parallel.cuh"  // defines: gather_over_pipeline
#include "config.h"                              // defines: ParameterLayout, StageModel
#include "lora.h"                                // defines: AdapterLayout, adapter_part, put_adapter_part
#include "transformer.cuh"                       // defines: Transformer

// Whether this rank's layout is the whole model's (one rank per layer): no cutting or gathering needed.
template <typename floatX>
bool holds_whole_model(const Transformer<floatX>& model) {
    return model.layout.tp == 1 && model.layout.part.first && model.layout.part.last;
}

// This rank's part (layout: its pipeline stage's tensor-parallel slices) of a whole-model array (full_layout).
template <typename floatX>
std::vector<float> local_part(const Transformer<floatX>& model, const std::vector<float>& full) {
    std::vector<float> local(model.layout.total, 0.0f);
    model.layout.for_each_full_run(model.full_layout, model.mesh.tensor.rank, [&](size_t from, size_t to, size_t n) {
        std::copy(full.begin() + from, full.begin() + from + n, local.begin() + to);
    });
    return local;
}

// values: the whole model in full_layout (as read_model_file gives it); this rank keeps its part. With one rank per
// layer the layouts are the same and `values` goes on as it is (no copy of the whole model).
template <typename floatX>
void set_parameters(Transformer<floatX>& model, const std::vector<float>& values) {
    if (holds_whole_model(model)) model.zero->set_parameters(values);
    else model.zero->set_parameters(local_part(model, values));
}

// The inverse of local_part, over the tensor-parallel and pipeline groups: every rank's part (gathered, fp32 host)
// put back into the whole model. A collective of both groups. With one rank per layer `local` is the whole model and
// is returned as it is (moved when the caller passes a temporary). The pipeline stages' layouts are made from
// `stage_parts` (every stage's StageModel). everywhere = false: only the main rank gets the whole model, the other
// ranks (that do not hold it anyway) an empty vector, so that their hosts hold no more than their part.
template <typename floatX>
std::vector<float> assemble_whole_model(const Transformer<floatX>& model, std::vector<float> local, const std::vector<StageModel>& stage_parts,
                                        bool everywhere = true) {
    if (holds_whole_model(model)) return local;
    const ProcessMesh& mesh = model.mesh;
    const ParameterLayout& layout = model.layout;
    // not everywhere: the main rank's data-parallel replica (data rank 0) assembles, its other tensor-parallel
    // ranks only send; the other replicas' groups, whose ranks all share a data rank, skip both gathers
    if (!everywhere && mesh.data.rank != 0) return {};
    const bool keeps_stage = everywhere || mesh.tensor.rank == 0, keeps_model = everywhere || model.pg.is_main();
    const std::vector<std::vector<float>> slices = model.tensor_parallel.all_gather_host(local, model.stream, model.pg, keeps_stage);
    if (!keeps_stage) return {};  // its pipeline group (tensor rank != 0: none keeps anything) skips the stages' gather
    const ParameterLayout whole_stage(model.config, 8 * mesh.data.size, 1, layout.part);
    std::vector<float> stage(whole_stage.total, 0.0f);  // this stage's tensor-parallel slices in a tp = 1 layout of its part
    for (int q = 0; q < layout.tp; q++)
        layout.for_each_full_run(whole_stage, q, [&](size_t to, size_t from, size_t n) {
            std::copy(slices[q].begin() + from, slices[q].begin() + from + n, stage.begin() + to);
        });
    // the stages' parts, padded to one length for the gather; the tied wte is taken from the first stage
    size_t longest = 0;
    for (const StageModel& m : stage_parts) longest = std::max(longest, ParameterLayout(model.config, 8 * mesh.data.size, 1, m).total);
    stage.resize(longest, 0.0f);
    const std::vector<std::vector<float>> parts = gather_over_pipeline(model, stage, keeps_model);
    if (!keeps_model) return {};
    std::vector<float> full(model.full_layout.total, 0.0f);
    for (int s = (int)parts.size() - 1; s >= 0; s--) {
        const ParameterLayout l(model.config, 8 * mesh.data.size, 1, stage_parts[s]);
        l.for_each_full_run(model.full_layout, 0, [&](size_t to, size_t from, size_t n) {
            std::copy(parts[s].begin() + from, parts[s].begin() + from + n, full.begin() + to);
        });
    }
    return full;
}

// The whole model's AdapterLayout (adapter files, PEFT folders, the merge), whichever blocks this rank holds.
template <typename floatX>
AdapterLayout whole_adapter_layout(const Transformer<floatX>& model) {
    return AdapterLayout(model.config, model.lora, 8 * model.mesh.data.size);
}

// LoRA's adapters of the whole model (`values`, in whole_adapter_layout as adapter files give them): this rank keeps
// its stage's blocks'.
template <typename floatX>
void set_adapters(Transformer<floatX>& model, const std::vector<float>& values) {
    const AdapterLayout& part = *model.adapter_layout;
    if (part.whole()) model.adapters->set_parameters(values);
    else model.adapters->set_parameters(adapter_part(part, whole_adapter_layout(model), values));
}

// The whole model's adapters (fp32 host, in whole_adapter_layout) from every pipeline stage's: a collective of the data
// and pipeline groups (the parameters' read gathers ZeRO-3's shards). everywhere = false: only the main rank gets
// them, the others an empty vector.
template <typename floatX>
std::vector<float> assemble_whole_adapters(Transformer<floatX>& model, bool everywhere = true) {
    std::vector<float> local = model.adapters->parameters_host();
    const AdapterLayout& part = *model.adapter_layout;
    if (part.whole()) return everywhere || model.pg.is_main() ? local : std::vector<float>();
    const ProcessMesh& mesh = model.mesh;
    if (!everywhere && mesh.data.rank != 0) return {};
    const size_t unit_multiple = 8 * mesh.data.size;
    size_t longest = 0;  // the stages' parts, padded to one length for the gather
    for (const StageModel& m : model.stage_parts) longest = std::max(longest, AdapterLayout(model.config, model.lora, unit_multiple, m.layers).total);
    local.resize(longest, 0.0f);
    const bool keeps = everywhere || model.pg.is_main();
    const std::vector<std::vector<float>> parts = gather_over_pipeline(model, local, keeps);
    if (!keeps) return {};
    const AdapterLayout whole = whole_adapter_layout(model);
    std::vector<float> values(whole.total, 0.0f);
    for (size_t s = 0; s < parts.size(); s++)
        put_adapter_part(AdapterLayout(model.config, model.lora, unit_multiple, model.stage_parts[s].layers), parts[s], whole, values);
    return values;
}
