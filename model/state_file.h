// Optimizer-state files of checkpoints (docs/formats.md): the header, the file names, the writer, and the reader
// that reassembles the state any mesh and ZeRO stage wrote into this rank's part. Plain C++ (the fuzz harness of
// test/fuzz/ and the crash-consistency test read and write state files without CUDA).
// defines: kStateMagic, kStateVersion, state_path, StateHeader, kStatePartOffset, kStateMaxLayers, state_header_problem, read_state_header,
//          parse_state_header, write_state_file, SavedOptimizerState, read_optimizer_state, read_own_optimizer_state
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include "../dataloader/dataloader.h"  // DataLoaderState
#include "../distributed/mesh.h"      // MeshShape, MeshCoord, mesh_rank
#include "../kernels/die.h"           // die
#include "config.h"                   // StageModel, ParameterLayout, LayoutRun, sorted_full_runs, for_each_shared_run
#include "file_integrity.h"           // kChecksumTagSlot
#include "checked_reads.h"            // CheckedFile, CheckpointReads

// 3: the writer's mesh (tensor parallelism); 4: its pipeline stage's part; 5: the run id
constexpr int kStateMagic = 20261126, kStateVersion = 5;

inline std::string state_path(const std::string& dir, int step, int rank) {
    char name[64];
    snprintf(name, sizeof(name), "/state_%08d_%05d.bin", step, rank);
    return dir + name;
}

struct StateHeader {
    int step, precision;
    int data_parallel, tensor_parallel, pipeline_parallel, data_rank, tensor_rank, pipeline_rank;  // the writer's mesh and its place in it
    int stage, has_master, clean_steps;
    float loss_scale;
    long long skipped_steps, optimizer_elements;
    unsigned long long run_id;  // the run that wrote it (run_identity.h)
};
// The header's second half holds the writer's pipeline stage's part of the model (StageModel): first, last, the
// number of blocks and their layer indices.
constexpr int kStatePartOffset = 128, kStateMaxLayers = kRunIdentitySlot - kStatePartOffset - 3;  // the run's identity after them
// The most ranks a checkpoint can come from: the file names' five rank digits.
constexpr long long kStateMaxRanks = 100000;

// What is wrong with a state file's header (its 256 ints, as read from `path`), in one line naming the file, or "":
// the magic, the version, the writer's mesh and its place in it, the number of blocks of its part.
inline std::string state_header_problem(const int* header, const std::string& path) {
    if (header[0] != kStateMagic) return path + ": not a train_gpt state file (bad magic)";
    if (header[1] != kStateVersion || header[2] != (int)sizeof(StateHeader) || header[3] != (int)sizeof(DataLoaderState))
        return path + ": state file version " + std::to_string(header[1]) + " is not the supported " + std::to_string(kStateVersion);
    StateHeader h;
    memcpy(&h, &header[4], sizeof(h));
    // the writer's mesh and its place in it, before any size is computed from them
    const long long sizes[] = {h.data_parallel, h.tensor_parallel, h.pipeline_parallel}, ranks[] = {h.data_rank, h.tensor_rank, h.pipeline_rank};
    bool mesh_ok = true;
    for (int k = 0; k < 3; k++) mesh_ok = mesh_ok && sizes[k] >= 1 && sizes[k] <= kStateMaxRanks && ranks[k] >= 0 && ranks[k] < sizes[k];
    if (!mesh_ok || sizes[0] * sizes[1] * sizes[2] > kStateMaxRanks)
        return path + ": corrupt header (a mesh of data " + std::to_string(sizes[0]) + " x tensor " + std::to_string(sizes[1]) + " x pipeline " +
               std::to_string(sizes[2]) + " ranks, this file's place data " + std::to_string(ranks[0]) + ", tensor " + std::to_string(ranks[1]) +
               ", pipeline " + std::to_string(ranks[2]) + ")";
    const int blocks = header[kStatePartOffset + 2];
    if (blocks < 1 || blocks > kStateMaxLayers) return path + ": corrupt header (" + std::to_string(blocks) + " blocks)";
    return "";
}

// A state file's header from its 256 ints (stops, naming the file, on a malformed one); `part`, when given, gets the
// writer's pipeline stage's part.
inline StateHeader parse_state_header(const int* header, const std::string& path, StageModel* part) {
    const std::string problem = state_header_problem(header, path);
    if (!problem.empty()) die(problem);
    StateHeader h;
    memcpy(&h, &header[4], sizeof(h));
    const int blocks = header[kStatePartOffset + 2];
    if (part != nullptr) {
        part->first = header[kStatePartOffset] != 0;
        part->last = header[kStatePartOffset + 1] != 0;
        part->layers.assign(header + kStatePartOffset + 3, header + kStatePartOffset + 3 + blocks);
    }
    return h;
}
inline StateHeader read_state_header(FILE* f, const std::string& path, StageModel* part = nullptr) {
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) die(path + ": not a train_gpt state file (bad magic)");
    return parse_state_header(header, path, part);
}
inline StateHeader read_state_header(CheckedFile& f, const std::string& path, StageModel* part = nullptr) {
    int header[256];
    f.read(header, sizeof(header), "the header");
    return parse_state_header(header, path, part);
}

// One rank's state file: header (the CRC-32C of the file in its last ints), then its master weights (if kept), Adam m
// and v, and the data position. Returns the file as a checkpoint's manifest lists it.
inline FileRecord write_state_file(const std::string& path, const StateHeader& h, const StageModel& part, const std::vector<float>& master,
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
    stamp_run_identity(header, h.run_id, h.step);
    const FileParts parts = {{header, sizeof(header)},
                             {master.data(), master.size() * sizeof(float)},
                             {m.data(), m.size() * sizeof(float)},
                             {v.data(), v.size() * sizeof(float)},
                             {&data_state, sizeof(data_state)}};
    FileRecord record;
    record.crc = seal_file_checksum(header, parts);
    record.bytes = write_file_atomically(path, parts);
    record.name = path.substr(path.rfind('/') + 1);
    return record;
}

// The optimizer state of checkpoint `step`, whatever mesh and stage wrote it, as arrays in `part` (this rank's
// layout: its pipeline stage's tensor-parallel slices `rank`, this run's padding). For each tensor-parallel rank
// of the writer whose slices share elements with `part`, its data-parallel shards are put back together unit by
// unit, then the shared elements go to their places in `part`. A rank so holds its part and one writer's, never
// the whole model's state.
struct SavedOptimizerState {
    StateHeader header;               // rank 0's
    std::vector<float> master, m, v;  // in `part`; master empty when the precision keeps none
    DataLoaderState data_state;
};
inline SavedOptimizerState read_optimizer_state(const std::string& dir, int step, const ParameterLayout& part, int tp_rank,
                                                CheckpointReads* reads = nullptr) {
    SavedOptimizerState saved;
    const std::string first = state_path(dir, step, 0);
    CheckedFile first_file(first, reads);  // rank 0's header tells the writer's mesh; the loop reads the rest of it last
    StageModel first_part;
    saved.header = read_state_header(first_file, first, &first_part);
    const StateHeader& s = saved.header;
    MeshShape writer;
    writer.tp = s.tensor_parallel;
    writer.pp = s.pipeline_parallel;
    writer.dp = s.data_parallel;
    const int files = s.stage >= 1 ? s.data_parallel : 1;  // at stage 0 data rank 0's file holds everything
    std::vector<std::vector<float>*> arrays = {&saved.m, &saved.v};
    if (s.has_master) arrays.insert(arrays.begin(), &saved.master);
    for (auto* a : arrays) a->assign(part.total, 0.0f);
    const ParameterLayout whole(part.config);  // the frame in which the writer's slices and this rank's meet
    const std::vector<LayoutRun> mine = sorted_full_runs(part, whole, tp_rank);
    // from the last stage to the first: the first stage's tied wte (the same values) overwrites the last's copy
    for (int p = writer.pp - 1; p >= 0; p--) {
        for (int t = 0; t < s.tensor_parallel; t++) {
            StageModel writer_part;
            std::unique_ptr<ParameterLayout> slices;  // one writer rank's layout, from its header
            std::vector<LayoutRun> shared;            // what it holds of `part`: `full` its offset, `local` this rank's
            std::vector<std::vector<float>> local(arrays.size());
            for (int d = 0; d < files; d++) {
                MeshCoord coord;
                coord.tp = t;
                coord.pp = p;
                coord.dp = d;
                const int writer_rank = mesh_rank(writer, coord);
                const std::string path = state_path(dir, step, writer_rank);
                std::unique_ptr<CheckedFile> opened;  // each file opened once: rank 0's is open already
                CheckedFile* g = &first_file;
                StageModel file_part = first_part;
                StateHeader h = saved.header;
                if (writer_rank != 0) {
                    if (access(path.c_str(), F_OK) != 0)
                        die(path + ": cannot open (a checkpoint written by " + std::to_string(writer.world()) + " ranks needs all their state files)");
                    opened.reset(new CheckedFile(path, reads));
                    g = opened.get();
                    h = read_state_header(*g, path, &file_part);
                }
                if (d == 0) {
                    writer_part = file_part;
                    // the writer's part must be a stage of this model under its mesh, before a layout is made of it
                    bool part_ok = writer_part.first == (p == 0) && writer_part.last == (p == writer.pp - 1) &&
                                   tensor_parallel_problem(part.config, writer.tp).empty();
                    std::string layers;
                    for (size_t i = 0; i < writer_part.layers.size(); i++) {
                        const int l = writer_part.layers[i];
                        part_ok = part_ok && l >= 0 && l < part.config.num_layers && (i == 0 || l > writer_part.layers[i - 1]);
                        layers += (i ? "," : "") + std::to_string(l);
                    }
                    if (!part_ok)
                        die(path + ": corrupt header (pipeline stage " + std::to_string(p) + " of " + std::to_string(writer.pp) + ", layers " + layers +
                            (writer_part.first ? ", the embeddings" : "") + (writer_part.last ? ", the LM head" : "") + ", tensor parallel " +
                            std::to_string(writer.tp) + ": not a part of this " + std::to_string(part.config.num_layers) + "-layer model)");
                    slices.reset(new ParameterLayout(part.config, 8 * s.data_parallel, s.tensor_parallel, writer_part));
                    for_each_shared_run(sorted_full_runs(*slices, whole, t), mine,
                                        [&](size_t at_writer, size_t at_part, size_t n) { shared.push_back({at_writer, at_part, n}); });
                    if (!shared.empty())
                        for (auto& a : local) a.assign(slices->total, 0.0f);
                }
                const size_t expected = s.stage >= 1 ? slices->total / s.data_parallel : slices->total;
                if (h.data_parallel != s.data_parallel || h.tensor_parallel != s.tensor_parallel || h.pipeline_parallel != s.pipeline_parallel ||
                    h.stage != s.stage || h.data_rank != d || h.tensor_rank != t || h.pipeline_rank != p || file_part.layers != writer_part.layers ||
                    h.optimizer_elements != (long long)expected)
                    die(path + ": does not belong with " + first);
                if (!shared.empty()) {
                    std::vector<float> buffer(expected);
                    for (size_t k = 0; k < arrays.size(); k++) {
                        g->read(buffer.data(), expected * sizeof(float), "the optimizer state");
                        size_t next = 0;  // the saved slices of all units, back to back (whole units at stage 0)
                        for (int u = 0; u < slices->num_units(); u++) {
                            const size_t slice = s.stage >= 1 ? slices->unit_size(u) / s.data_parallel : slices->unit_size(u);
                            const size_t begin = s.stage >= 1 ? d * slice : 0;
                            std::copy(buffer.begin() + next, buffer.begin() + next + slice, local[k].begin() + slices->unit_offset(u) + begin);
                            next += slice;
                        }
                    }
                } else if (writer_rank == 0) {  // nothing of `part`: only the data position, after the arrays
                    g->skip_to(g->position() + arrays.size() * expected * sizeof(float));
                }
                if (writer_rank == 0) g->read(&saved.data_state, sizeof(saved.data_state), "the data position");
            }
            for (const LayoutRun& r : shared)
                for (size_t k = 0; k < arrays.size(); k++)
                    std::copy(local[k].begin() + r.full, local[k].begin() + r.full + r.count, arrays[k]->begin() + r.local);
        }
    }
    return saved;
}

// The optimizer state of a checkpoint written on this run's own mesh and ZeRO stage (a LoRA run's adapters): the
// shard in state file `rank` as it is, `elements` floats per array (checked against its header), and the data
// position from rank 0's file. With `reads`, the files this rank verifies are checksummed as they are read.
inline SavedOptimizerState read_own_optimizer_state(const std::string& dir, int step, int rank, size_t elements, CheckpointReads* reads = nullptr) {
    SavedOptimizerState saved;
    const std::string path = state_path(dir, step, rank);
    CheckedFile f(path, reads);
    saved.header = read_state_header(f, path);
    if (saved.header.optimizer_elements != (long long)elements)
        die(path + ": holds " + std::to_string(saved.header.optimizer_elements) + " elements of optimizer state, this rank's shard has " +
            std::to_string(elements));
    std::vector<std::vector<float>*> arrays = {&saved.m, &saved.v};
    if (saved.header.has_master) arrays.insert(arrays.begin(), &saved.master);
    for (auto* a : arrays) {
        a->resize(elements);
        f.read(a->data(), elements * sizeof(float), "the optimizer state");
    }
    if (rank == 0) f.read(&saved.data_state, sizeof(saved.data_state), "the data position");
    f.close();
    if (rank != 0) {  // the data position, from rank 0's file (which rank 0 verifies): its arrays are as long as this rank's
        const std::string first = state_path(dir, step, 0);
        CheckedFile g(first, reads);
        g.skip_to(1024 + arrays.size() * elements * sizeof(float));
        g.read(&saved.data_state, sizeof(saved.data_state), "the data position");
    }
    return saved;
}
