// Who am I among the training processes, and the NCCL communicator that connects them.
//
// Bootstrap, in order of precedence:
//   - mpirun / mpiexec (when built with MPI: `make USE_MPI=1`, automatic where mpicxx exists): rank and size
//     from MPI; MPI broadcasts the NCCL unique id, and is used for nothing else.
//   - Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
//   - Plain environment (our launcher scripts/launch.sh, torchrun-style): RANK, WORLD_SIZE, LOCAL_RANK.
// Without MPI the NCCL unique id travels either through a file on a shared file system (--nccl-init-file,
// rank 0 writes it, the others wait for it) or over TCP from rank 0 (MASTER_ADDR, MASTER_PORT), which also
// covers several nodes. A single process (world size 1) needs none of this and creates no communicator.
//
// Every NCCL call is checked; waits on collectives have a deadline (--nccl-timeout), so a rank that died
// or hangs ends the job with a message instead of hanging it. Beside NCCL the ranks exchange heartbeats with
// rank 0 (heartbeat.h: its address travels with the NCCL id), which name a rank that was killed, failed or went
// silent (SIGSTOP) in that message. ProcessGroup owns every communicator: the world's, and those split from it for
// the process mesh's groups (distributed/mesh.h); each wait polls all of them for errors, and a failure, a
// heartbeat verdict or an overdue wait aborts all of them.
#pragma once
#include <string>
#include <vector>
#include <cuda_runtime.h>
#include <nccl.h>
#include <cstdint>

#define ncclCheck(call) nccl_check((call), __FILE__, __LINE__)
void nccl_check(ncclResult_t result, const char* file, int line);

struct ProcessGroupOptions {
    std::string init_file;      // shared-file bootstrap of the NCCL id (empty: TCP or MPI)
    int timeout_seconds = 600;  // deadline for bootstrap and for every wait on a collective; a peer's heartbeat silence
};

class ProcessGroup {
public:
    int rank = 0, world = 1, local_rank = 0;
    ncclComm_t comm = nullptr;  // null when world == 1
    std::string launcher = "single process";

    // Reads the launcher's environment (and starts MPI when launched by mpirun); touches no GPU.
    static ProcessGroup from_environment(int* argc, char*** argv);
    // Selects GPU local_rank and connects the ranks (NCCL).
    void connect(const ProcessGroupOptions& options);
    // Destroys every communicator still held (those made by split() first, then the world's).
    void destroy();

    // A new communicator over the ranks that pass the same `color`, ordered by `key`; null on a rank that
    // passes NCCL_SPLIT_NOCOLOR (and when world == 1). Collective over `comm`: every rank calls it, in the same
    // order. Bounded by the deadline. The result is registered under `name` (every wait polls it, a failure
    // aborts it) and stays owned here until destroy_communicator() or destroy(). ProcessMesh::build uses it.
    ncclComm_t split(int color, int key, const std::string& name);
    // Destroys a communicator made by split(); null or one already destroyed is ignored.
    void destroy_communicator(ncclComm_t split_comm);

    // Waits for `stream`, checking every communicator for errors and the deadline: a failed or missing
    // peer ends this process with a message (and the communicators are aborted so no rank hangs in them).
    void synchronize(cudaStream_t stream) const;
    // The same for an event.
    void wait_event(cudaEvent_t event) const;
    // Sum of one float over all ranks (the checkpoint barrier), on `stream`.
    void all_reduce_sum(float* device_value, cudaStream_t stream) const;
    // Every rank's `mine` (the same count on every rank), rank by rank, on every rank: a host-side exchange of a few
    // values (the checkpoint's agreements). Collective over all ranks (after connect()); bounded by the deadline, or
    // (bounded = false) waiting as long as every peer lives, for a rank that does long work first (rank 0 writing the
    // model file): a dead or silent peer still ends it. world == 1: `mine`.
    std::vector<uint64_t> all_gather_host(const std::vector<uint64_t>& mine, bool bounded = true) const;
    // How many ranks of the job run on this machine (the same host name), this one included: what shares its memory.
    // Collective over all ranks (after connect()), bounded by the deadline.
    int ranks_on_this_host() const;
    bool is_main() const { return rank == 0; }

    struct NamedCommunicator {
        ncclComm_t comm;
        std::string name;  // "world", "tensor-parallel", ...: named in the error message of a failure
    };

private:
    int timeout_seconds_ = 600;
    bool use_mpi_ = false;
    std::vector<NamedCommunicator> communicators_;  // the world's first, then split()'s: what every wait polls
};
