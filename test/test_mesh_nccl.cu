// The process mesh's NCCL communicators on real ranks (distributed/mesh.*): run by test/test_mesh_nccl.sh under
// scripts/launch.sh --one-gpu N, so several ranks share one GPU.
//   test_mesh_nccl TP PP        builds a TP x PP x (N / (TP PP)) mesh; in every group, an all-gather of the
//                               members' global ranks must give mesh_group_ranks' list (so colors and keys are
//                               right) and NCCL's rank and count must match the Communicator's; rank 0 prints
//                               one "PASS mesh_nccl ..." or "FAIL mesh_nccl ..." line per check for all ranks
//                               (failures are summed over the world).
//   test_mesh_nccl TP PP --die  rank 1 leaves after one tensor-parallel all-reduce; rank 0 then waits on a second
//                               one, and must end with pg's message instead of hanging (test_mesh_nccl.sh checks
//                               it). Rank 1 ends normally (exit status 0: a goodbye to the heartbeats, and no
//                               failure for the launcher), so only NCCL's error in the tensor-parallel communicator
//                               (or the deadline) can end rank 0's wait.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include "../distributed/mesh.h"
#include "../distributed/process_group.h"

#define cudaOk(call) cuda_ok((call), #call)
static void cuda_ok(cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
        fprintf(stderr, "error: CUDA: %s in %s\n", cudaGetErrorString(err), what);
        exit(EXIT_FAILURE);
    }
}

namespace {

struct Kind {
    const char* name;
    MeshGroup group;
};
const Kind kKinds[] = {{"tensor", MeshGroup::kTensor}, {"pipeline", MeshGroup::kPipeline}, {"data", MeshGroup::kData},
                       {"embedding", MeshGroup::kEmbedding}};
const Communicator& communicator(const ProcessMesh& mesh, MeshGroup group) {
    switch (group) {
        case MeshGroup::kTensor: return mesh.tensor;
        case MeshGroup::kPipeline: return mesh.pipeline;
        case MeshGroup::kData: return mesh.data;
        case MeshGroup::kEmbedding: break;
    }
    return mesh.embedding;
}

// The checks, each counting this rank's failures (summed over all ranks at the end).
enum Check { kCoords, kCommunicators, kGather, kReduce, kNumChecks };
const char* kCheckNames[kNumChecks] = {
    "communicators: every rank's coordinates are mesh_coord's",
    "communicators: rank and size match NCCL's and mesh_group_ranks (none for groups of one rank)",
    "communicators: an all-gather of global ranks over each group gives mesh_group_ranks' list",
    "communicators: an all-reduce over each group sums its members' global ranks",
};

}  // namespace

int main(int argc, char** argv) {
    ProcessGroup pg = ProcessGroup::from_environment(&argc, &argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s TP PP [--die]\n", argv[0]);
        return 2;
    }
    const int tp = atoi(argv[1]), pp = atoi(argv[2]);
    const bool die = argc > 3 && strcmp(argv[3], "--die") == 0;
    const std::string problem = mesh_shape_problem(pg.world, tp, pp);
    if (!problem.empty()) {
        fprintf(stderr, "error: %s\n", problem.c_str());
        return 2;
    }
    pg.connect({"", die ? 20 : 120});
    const MeshShape shape{tp, pp, pg.world / (tp * pp)};
    ProcessMesh mesh;
    mesh.build(pg, shape);
    cudaStream_t stream;
    cudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int* device = nullptr;  // [0]: this rank's value; [1..]: the group's results; then the failure counts
    cudaOk(cudaMalloc(&device, (1 + pg.world + kNumChecks) * sizeof(int)));

    if (die) {  // one all-reduce that every tensor-group member takes part in, then rank 1 leaves
        if (mesh.tensor.comm == nullptr) {
            fprintf(stderr, "error: --die needs --tensor-parallel > 1\n");
            return 2;
        }
        cudaOk(cudaMemcpy(device, &pg.rank, sizeof(int), cudaMemcpyHostToDevice));
        ncclCheck(ncclAllReduce(device, device + 1, 1, ncclInt32, ncclSum, mesh.tensor.comm, stream));
        pg.synchronize(stream);
        if (pg.rank == 1) exit(0);
        sleep(1);
        ncclCheck(ncclAllReduce(device, device + 1, 1, ncclInt32, ncclSum, mesh.tensor.comm, stream));
        pg.synchronize(stream);  // must end the process: rank 1 never joins
        printf("FAIL mesh_nccl a collective whose peer left completed\n");
        return 1;
    }

    int failures[kNumChecks] = {};
    const MeshCoord expected = mesh_coord(shape, pg.rank);
    if (mesh.coord.tp != expected.tp || mesh.coord.pp != expected.pp || mesh.coord.dp != expected.dp ||
        mesh.shape.world() != pg.world) {
        fprintf(stderr, "rank %d: mesh coordinates (%d, %d, %d)\n", pg.rank, mesh.coord.tp, mesh.coord.pp, mesh.coord.dp);
        failures[kCoords]++;
    }
    for (const Kind& kind : kKinds) {
        const Communicator& c = communicator(mesh, kind.group);
        const std::vector<int> ranks = mesh_group_ranks(shape, pg.rank, kind.group);
        if (ranks.size() <= 1) {  // one rank, or a middle stage's embedding: nothing to communicate
            if (c.comm != nullptr || c.size != 1 || c.rank != 0) {
                fprintf(stderr, "rank %d: %s group of one rank has size %d, rank %d, comm %p\n", pg.rank, kind.name, c.size, c.rank, (void*)c.comm);
                failures[kCommunicators]++;
            }
            continue;
        }
        int nccl_rank = -1, nccl_count = -1;
        if (c.comm != nullptr) {
            ncclCheck(ncclCommUserRank(c.comm, &nccl_rank));
            ncclCheck(ncclCommCount(c.comm, &nccl_count));
        }
        if (c.comm == nullptr || c.size != (int)ranks.size() || c.rank < 0 || c.rank >= c.size || ranks[c.rank] != pg.rank ||
            nccl_rank != c.rank || nccl_count != c.size) {
            fprintf(stderr, "rank %d: %s communicator rank %d size %d (NCCL: %d of %d)\n", pg.rank, kind.name, c.rank, c.size, nccl_rank, nccl_count);
            failures[kCommunicators]++;
            continue;
        }
        std::vector<int> gathered(c.size, -1);
        int sum = -1;
        cudaOk(cudaMemcpyAsync(device, &pg.rank, sizeof(int), cudaMemcpyHostToDevice, stream));
        ncclCheck(ncclAllGather(device, device + 1, 1, ncclInt32, c.comm, stream));
        cudaOk(cudaMemcpyAsync(gathered.data(), device + 1, c.size * sizeof(int), cudaMemcpyDeviceToHost, stream));
        ncclCheck(ncclAllReduce(device, device + 1, 1, ncclInt32, ncclSum, c.comm, stream));
        cudaOk(cudaMemcpyAsync(&sum, device + 1, sizeof(int), cudaMemcpyDeviceToHost, stream));
        pg.synchronize(stream);  // polls the mesh communicators too
        int expected_sum = 0;
        for (int r : ranks) expected_sum += r;
        if (gathered != ranks) {
            std::string got;
            for (int r : gathered) got += " " + std::to_string(r);
            fprintf(stderr, "rank %d: %s group all-gather gave%s\n", pg.rank, kind.name, got.c_str());
            failures[kGather]++;
        }
        if (sum != expected_sum) {
            fprintf(stderr, "rank %d: %s group all-reduce gave %d, not %d\n", pg.rank, kind.name, sum, expected_sum);
            failures[kReduce]++;
        }
    }

    // Failures summed over the world; rank 0 reports.
    int* counts = device + 1 + pg.world;
    cudaOk(cudaMemcpyAsync(counts, failures, sizeof(failures), cudaMemcpyHostToDevice, stream));
    if (pg.comm != nullptr) ncclCheck(ncclAllReduce(counts, counts, kNumChecks, ncclInt32, ncclSum, pg.comm, stream));
    cudaOk(cudaMemcpyAsync(failures, counts, sizeof(failures), cudaMemcpyDeviceToHost, stream));
    pg.synchronize(stream);
    const std::string where = " (" + std::to_string(pg.world) + " ranks as tp " + std::to_string(tp) + " x pp " + std::to_string(pp) +
                              " x dp " + std::to_string(shape.dp) + ")";
    int total = 0;
    for (int i = 0; i < kNumChecks; i++) {
        total += failures[i];
        if (pg.rank == 0) {
            if (failures[i] == 0) printf("PASS mesh_nccl %s%s\n", kCheckNames[i], where.c_str());
            else printf("FAIL mesh_nccl %s%s: %d failure(s), see stderr\n", kCheckNames[i], where.c_str(), failures[i]);
        }
    }
    fflush(stdout);
    cudaOk(cudaFree(device));
    cudaOk(cudaStreamDestroy(stream));
    mesh.destroy();
    mesh.destroy();  // harmless twice
    pg.destroy();    // destroys the world's communicator only: the mesh's are gone already
    return total == 0 ? 0 : 1;
}
