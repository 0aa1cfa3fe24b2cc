// The process mesh's communicators: ProcessMesh::build splits the world's communicator into the tensor,
// pipeline, data and embedding groups that mesh.h's rank arithmetic defines. See mesh.h.
#include "mesh.h"

#include <cstdio>
#include <cstdlib>

#include "process_group.h"
#include "../kernels/die.h"

namespace {

// This rank's communicator for one kind of group. ncclCommSplit is collective over the world's communicator,
// so every rank makes the same calls in the same order: a kind whose groups all have one rank is skipped by
// every rank, and a rank in no group of the kind (a middle pipeline stage, for the embedding) still takes part
// in the split, with NCCL_SPLIT_NOCOLOR. A group is named by its first global rank (color) and orders its
// ranks along its own axis (key).
Communicator split_group(ProcessGroup& pg, const MeshShape& shape, MeshGroup group, const std::string& name) {
    Communicator c;
    // Every group of a kind has the same size (tp, pp, dp; 2 or 1 for the embedding), rank 0's included.
    if (mesh_group_ranks(shape, 0, group).size() == 1) return c;
    const std::vector<int> ranks = mesh_group_ranks(shape, pg.rank, group);
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    if (!ranks.empty()) {
        color = ranks[0];
        while (ranks[key] != pg.rank) key++;
        c.rank = key;
        c.size = (int)ranks.size();
    }
    c.comm = pg.split(color, key, name);
    if (!ranks.empty() && c.comm == nullptr) die("rank " + std::to_string(pg.rank) + ": NCCL made no " + name + " communicator");
    return c;
}

}  // namespace

void ProcessMesh::build(ProcessGroup& pg, const MeshShape& mesh_shape) {
    destroy();  // a second build replaces the first
    if (pg.world > 1 && pg.comm == nullptr) die("ProcessMesh::build needs a connected ProcessGroup (call pg.connect first)");
    const std::string problem = mesh_shape_problem(pg.world, mesh_shape.tp, mesh_shape.pp);
    if (!problem.empty()) die(problem);
    if (mesh_shape.dp < 1 || mesh_shape.world() != pg.world)
        die("--tensor-parallel " + std::to_string(mesh_shape.tp) + " x --pipeline-parallel " + std::to_string(mesh_shape.pp) +
             " x data-parallel " + std::to_string(mesh_shape.dp) + " is not the " + std::to_string(pg.world) + " ranks");
    shape = mesh_shape;
    coord = mesh_coord(shape, pg.rank);
    pg_ = &pg;
    // The same order on every rank (the splits are collective).
    tensor = split_group(pg, shape, MeshGroup::kTensor, "tensor-parallel");
    pipeline = split_group(pg, shape, MeshGroup::kPipeline, "pipeline-parallel");
    data = split_group(pg, shape, MeshGroup::kData, "data-parallel");
    embedding = split_group(pg, shape, MeshGroup::kEmbedding, "embedding");
}

void ProcessMesh::destroy() {
    if (pg_ != nullptr) {
        for (Communicator* c : {&tensor, &pipeline, &data, &embedding}) pg_->destroy_communicator(c->comm);
    }
    tensor = pipeline = data = embedding = Communicator();
    pg_ = nullptr;
}
