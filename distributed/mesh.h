// The process mesh: the one place that does rank arithmetic for tensor, pipeline and data parallelism,
// and the NCCL communicators of its groups. Nothing else computes which ranks work together.
//
// The world is dp x pp x tp with tp innermost: consecutive global ranks form a tensor-parallel group (as in
// Megatron-LM: tensor parallelism exchanges the most data, so its ranks should share a node's NVLink), then
// pp, then dp. For example 8 ranks as tp 2 x pp 2 x dp 2:
//   global rank  0 1 2 3 4 5 6 7
//   tp           0 1 0 1 0 1 0 1      tensor groups    {0,1} {2,3} {4,5} {6,7}
//   pp           0 0 1 1 0 0 1 1      pipeline groups  {0,2} {1,3} {4,6} {5,7}
//   dp           0 0 0 0 1 1 1 1      data groups      {0,4} {1,5} {2,6} {3,7}
// The embedding group joins the first and the last pipeline stage of the same (tp, dp) coordinates, the
// two holders of the tied token embedding whose gradients must agree; here it is the pipeline group.
//
// The rank arithmetic below is inline and needs no CUDA or NCCL header (test/test_mesh.cpp compiles it with
// g++); ProcessMesh::build and destroy (mesh.cpp) make and free the communicators.
#pragma once
#include <string>
#include <vector>

// The same declaration as nccl.h's, so that this header needs no NCCL (repeating a typedef is legal C++).
typedef struct ncclComm* ncclComm_t;
class ProcessGroup;

struct MeshShape {
    int tp = 1, pp = 1, dp = 1;
    int world() const { return tp * pp * dp; }
};
struct MeshCoord {
    int tp = 0, pp = 0, dp = 0;
};

inline MeshCoord mesh_coord(const MeshShape& shape, int rank) {
    MeshCoord c;
    c.tp = rank % shape.tp;
    c.pp = rank / shape.tp % shape.pp;
    c.dp = rank / (shape.tp * shape.pp);
    return c;
}

inline int mesh_rank(const MeshShape& shape, const MeshCoord& coord) {
    return (coord.dp * shape.pp + coord.pp) * shape.tp + coord.tp;
}

enum class MeshGroup { kTensor, kPipeline, kData, kEmbedding };

// The global ranks of `rank`'s group, in group-rank order (the order of the group's own axis).
// kEmbedding: {first stage, last stage} of rank's (tp, dp) coordinates when pp > 1, {rank} when pp == 1, and
// empty for a middle pipeline stage, which belongs to no embedding group.
inline std::vector<int> mesh_group_ranks(const MeshShape& shape, int rank, MeshGroup group) {
    const MeshCoord coord = mesh_coord(shape, rank);
    std::vector<int> ranks;
    // The ranks that differ from `coord` only along `axis`, in order of that axis.
    auto line = [&](int MeshCoord::*axis, int size) {
        for (int i = 0; i < size; i++) {
            MeshCoord c = coord;
            c.*axis = i;
            ranks.push_back(mesh_rank(shape, c));
        }
    };
    switch (group) {
        case MeshGroup::kTensor: line(&MeshCoord::tp, shape.tp); break;
        case MeshGroup::kPipeline: line(&MeshCoord::pp, shape.pp); break;
        case MeshGroup::kData: line(&MeshCoord::dp, shape.dp); break;
        case MeshGroup::kEmbedding: {
            if (coord.pp != 0 && coord.pp != shape.pp - 1) break;
            MeshCoord first = coord, last = coord;
            first.pp = 0;
            last.pp = shape.pp - 1;
            ranks.push_back(mesh_rank(shape, first));
            if (shape.pp > 1) ranks.push_back(mesh_rank(shape, last));
            break;
        }
    }
    return ranks;
}

// "" when `world` ranks can form a mesh of tensor-parallel size tp and pipeline-parallel size pp (the data-
// parallel size is then world / (tp * pp)); otherwise a one-line problem naming the flags and their values.
inline std::string mesh_shape_problem(int world, int tp, int pp) {
    if (tp < 1) return "--tensor-parallel " + std::to_string(tp) + " must be at least 1";
    if (pp < 1) return "--pipeline-parallel " + std::to_string(pp) + " must be at least 1";
    const long long product = (long long)tp * pp;
    if (world % product != 0)
        return "--tensor-parallel " + std::to_string(tp) + " x --pipeline-parallel " + std::to_string(pp) + " = " +
               std::to_string(product) + " does not divide the " + std::to_string(world) + (world == 1 ? " rank" : " ranks");
    return "";
}

// One group's communicator, as seen by one of its ranks. comm is null when the group has one rank (and for a
// middle pipeline stage's embedding "group"): there is nothing to communicate.
struct Communicator {
    ncclComm_t comm = nullptr;
    int rank = 0, size = 1;
};

class ProcessMesh {
public:
    MeshShape shape;
    MeshCoord coord;
    Communicator tensor, pipeline, data, embedding;

    // After pg.connect(), on every rank: checks that `mesh_shape` covers the pg.world ranks (the process ends
    // with a message otherwise), then splits pg's communicator into the four kinds of groups. A kind whose
    // groups have one rank gets no communicator; with pg.world == 1 nothing is created. The communicators are
    // registered with pg, so its deadline waits poll them and a failure aborts them.
    void build(ProcessGroup& pg, const MeshShape& mesh_shape);
    // Destroys what build() made (call it before pg.destroy(), which would otherwise destroy them itself).
    void destroy();

private:
    ProcessGroup* pg_ = nullptr;
};
