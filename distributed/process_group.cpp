// Process bootstrap (MPI, Slurm or plain environment), NCCL unique-id exchange (MPI, shared file or TCP),
// and deadline-guarded waits. See process_group.h.
#include "process_group.h"
#include "heartbeat.h"
#include "../kernels/die.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#ifdef USE_MPI
#include <mpi.h>
#endif

namespace {

int env_int(const char* name, int fallback) {
    const char* value = getenv(name);
    return value ? atoi(value) : fallback;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Ends the process if `done` is not set within the deadline: covers calls that block inside NCCL or the
// bootstrap, where no error would ever come back. An empty `what` ends it without a line: the error is out already.
class Watchdog {
public:
    Watchdog(int seconds, std::string what) : what_(std::move(what)) {
        thread_ = std::thread([this, seconds] {
            const auto start = std::chrono::steady_clock::now();
            while (!done_.load()) {
                if (seconds_since(start) > seconds) {
                    if (!what_.empty()) print_error(what_ + " did not finish within " + std::to_string(seconds) + " s (a rank failed or is missing)");
                    _exit(EXIT_FAILURE);
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        });
    }
    ~Watchdog() {
        done_.store(true);
        thread_.join();
    }

private:
    std::string what_;
    std::atomic<bool> done_{false};
    std::thread thread_;
};

// What rank 0 hands the others at start: the NCCL id, and where it listens for their heartbeats.
struct Rendezvous {
    ncclUniqueId id;
    HeartbeatAddress heartbeat;
};

void send_all(int fd, const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
        ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
        if (n <= 0) die(std::string("NCCL id bootstrap: send failed: ") + strerror(errno));
        p += n;
        bytes -= n;
    }
}

void receive_all(int fd, void* data, size_t bytes) {
    char* p = static_cast<char*>(data);
    while (bytes > 0) {
        ssize_t n = recv(fd, p, bytes, 0);
        if (n <= 0) die("NCCL id bootstrap: rank 0 closed the connection early");
        p += n;
        bytes -= n;
    }
}

// Rank 0 serves the rendezvous to world-1 connections on MASTER_PORT; the others connect to MASTER_ADDR:MASTER_PORT,
// retrying until rank 0 listens.
void exchange_rendezvous_tcp(Rendezvous& rendezvous, int rank, int world) {
    const char* address = getenv("MASTER_ADDR");
    const char* port = getenv("MASTER_PORT");
    if (!address || !port)
        die("several processes without MPI need MASTER_ADDR and MASTER_PORT (TCP bootstrap) or --nccl-init-file");
    if (rank == 0) {
        int server = socket(AF_INET, SOCK_STREAM, 0);
        int yes = 1;
        setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        sockaddr_in addr = {};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_ANY);
        addr.sin_port = htons((uint16_t)atoi(port));
        if (bind(server, (sockaddr*)&addr, sizeof(addr)) != 0 || listen(server, world) != 0)
            die(std::string("NCCL id bootstrap: cannot listen on port ") + port + ": " + strerror(errno));
        for (int i = 1; i < world; i++) {
            int client = accept(server, nullptr, nullptr);
            if (client < 0) die(std::string("NCCL id bootstrap: accept failed: ") + strerror(errno));
            send_all(client, &rendezvous, sizeof(rendezvous));
            close(client);
        }
        close(server);
        return;
    }
    addrinfo hints = {}, *result = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(address, port, &hints, &result) != 0 || result == nullptr)
        die(std::string("NCCL id bootstrap: cannot resolve MASTER_ADDR ") + address);
    for (;;) {  // the watchdog bounds this loop
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, result->ai_addr, result->ai_addrlen) == 0) {
            receive_all(fd, &rendezvous, sizeof(rendezvous));
            close(fd);
            break;
        }
        close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    freeaddrinfo(result);
}

// Rank 0 writes the rendezvous to a temporary name and renames it (readers never see half a file); the others
// wait for it. The file must not exist beforehand: a stale id would connect to nobody.
void exchange_rendezvous_file(Rendezvous& rendezvous, int rank, const std::string& path) {
    if (rank == 0) {
        struct stat st;
        if (stat(path.c_str(), &st) == 0)
            die(path + ": --nccl-init-file already exists (left by an earlier job?): remove it or use a new name");
        const std::string tmp = path + ".tmp";
        FILE* f = fopen(tmp.c_str(), "wb");
        if (!f || fwrite(&rendezvous, sizeof(rendezvous), 1, f) != 1 || fclose(f) != 0 || rename(tmp.c_str(), path.c_str()) != 0)
            die(path + ": cannot write the NCCL id: " + strerror(errno));
        return;
    }
    for (;;) {  // the watchdog bounds this loop
        FILE* f = fopen(path.c_str(), "rb");
        if (f) {
            const bool ok = fread(&rendezvous, sizeof(rendezvous), 1, f) == 1;
            fclose(f);
            if (ok) return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

}  // namespace

void nccl_check(ncclResult_t result, const char* file, int line) {
    if (result != ncclSuccess && result != ncclInProgress) {
        die(std::string("NCCL: ") + ncclGetErrorString(result) + " at " + file + ":" + std::to_string(line));
    }
}

ProcessGroup ProcessGroup::from_environment(int* argc, char*** argv) {
    ProcessGroup pg;
#ifdef USE_MPI
    // started by mpirun/mpiexec (Open MPI, MPICH/PMI)?
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")) {
        MPI_Init(argc, argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &pg.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &pg.world);
        pg.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", pg.rank));
        pg.launcher = "MPI";
        pg.use_mpi_ = true;
    }
#else
    (void)argc;
    (void)argv;
#endif
    if (!pg.use_mpi_) {
        if (getenv("SLURM_PROCID") && getenv("SLURM_NTASKS")) {
            pg.rank = env_int("SLURM_PROCID", 0);
            pg.world = env_int("SLURM_NTASKS", 1);
            pg.local_rank = env_int("SLURM_LOCALID", 0);
            pg.launcher = "Slurm";
        } else if (getenv("WORLD_SIZE")) {
            pg.rank = env_int("RANK", 0);
            pg.world = env_int("WORLD_SIZE", 1);
            pg.local_rank = env_int("LOCAL_RANK", pg.rank);
            pg.launcher = "environment";
        }
    }
    if (pg.world < 1 || pg.rank < 0 || pg.rank >= pg.world)
        die("bad process layout: rank " + std::to_string(pg.rank) + " of world size " + std::to_string(pg.world));
    return pg;
}

void ProcessGroup::connect(const ProcessGroupOptions& options) {
    timeout_seconds_ = options.timeout_seconds;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) die("no CUDA GPU found");
    if (local_rank >= devices)
        die("local rank " + std::to_string(local_rank) + " has no GPU (this node has " + std::to_string(devices) + ")");
    if (cudaSetDevice(local_rank) != cudaSuccess) die("cannot select GPU " + std::to_string(local_rank));
    if (world == 1) return;

    // NVLink multicast (NVLS) stays off unless the user asks for it: on shared hosts it can take the
    // GPUs out of service.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    // Send and receive (only the pipeline's transfers use them) on one channel unless the user asks for more.
    // Each channel is a CTA that holds an SM, spinning until its peer is ready, beside the stage's compute; NCCL's
    // default on NVLink, 32 channels a peer, made the 6.6B GPT's interleaved pp 2 schedule 3.5% slower (docs/perf.md).
    setenv("NCCL_MAX_P2P_NCHANNELS", "1", 0);
    Watchdog watchdog(options.timeout_seconds, "connecting " + std::to_string(world) + " ranks (" + launcher + ")");
    Rendezvous rendezvous;
    if (rank == 0) {
        ncclCheck(ncclGetUniqueId(&rendezvous.id));
        rendezvous.heartbeat = heartbeat_listen();
    }
    const bool tcp = !use_mpi_ && options.init_file.empty();
    if (use_mpi_) {
#ifdef USE_MPI
        MPI_Bcast(&rendezvous, sizeof(rendezvous), MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
    } else if (!tcp) {
        exchange_rendezvous_file(rendezvous, rank, options.init_file);
    } else {
        exchange_rendezvous_tcp(rendezvous, rank, world);
    }
    ncclCheck(ncclCommInitRank(&comm, world, rendezvous.id, rank));
    communicators_ = {{comm, "world"}};
    // the heartbeats go where the id came from: MASTER_ADDR, which every rank reaches, or rank 0's host name
    heartbeat_start(rank, world, tcp ? getenv("MASTER_ADDR") : rendezvous.heartbeat.host, rendezvous.heartbeat.port, options.timeout_seconds);
}

ncclComm_t ProcessGroup::split(int color, int key, const std::string& name) {
    if (comm == nullptr) return nullptr;
    ncclComm_t split_comm = nullptr;
    {
        Watchdog watchdog(timeout_seconds_, "splitting the " + name + " communicator from the world's");
        ncclCheck(ncclCommSplit(comm, color, key, &split_comm, nullptr));  // nullptr: the world's configuration
    }
    if (split_comm != nullptr) communicators_.push_back({split_comm, name});
    return split_comm;
}

void ProcessGroup::destroy_communicator(ncclComm_t split_comm) {
    for (size_t i = 1; i < communicators_.size(); i++) {  // [0] is the world's: destroy() ends it
        if (communicators_[i].comm != split_comm) continue;
        communicators_.erase(communicators_.begin() + i);
        ncclCheck(ncclCommDestroy(split_comm));
        return;
    }
}

void ProcessGroup::destroy() {
    // Split communicators before the world's they came from, newest first.
    while (communicators_.size() > 1) destroy_communicator(communicators_.back().comm);
    communicators_.clear();
    if (comm) ncclCheck(ncclCommDestroy(comm));
    comm = nullptr;
#ifdef USE_MPI
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Finalize();
#endif
}

namespace {
// Ends the process with `message`. The message comes first: ncclCommAbort can itself block behind a wedged kernel,
// so a watchdog bounds the aborts; _exit skips CUDA's teardown of a context whose stream will never drain. Every
// communicator is aborted, so no peer stays blocked in any of them. Where the heartbeat thread is already ending
// the process (with its own line), this one waits for it.
[[noreturn]] void end_process(const std::vector<ProcessGroup::NamedCommunicator>& comms, const std::string& message) {
    if (!claim_process_end())
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    print_error(message);
    {
        Watchdog guard(10, "");  // an abort can block behind kernels of a dead peer's communicators on the same GPU
        for (auto it = comms.rbegin(); it != comms.rend(); ++it) ncclCommAbort(it->comm);  // split ones first
    }
    _exit(EXIT_FAILURE);
}

// After a failed or overdue collective: what went wrong, and which rank caused it where the heartbeats know or
// learn it within 3 s (a killed peer's connection closes at once; a stopped one's silence reaches the timeout
// about when the collective's deadline does); `unknown` otherwise.
[[noreturn]] void fail_collective(const std::vector<ProcessGroup::NamedCommunicator>& comms, int rank, const std::string& what,
                                  const std::string& unknown) {
    const std::string verdict = heartbeat_wait_for_verdict(3.0);
    end_process(comms, "rank " + std::to_string(rank) + ": " + what + ": " + (verdict.empty() ? unknown : verdict));
}

// Waits for a stream or an event. Without communicators (world == 1) `block` waits (cudaStreamSynchronize /
// cudaEventSynchronize); with them, `done` (cudaStreamQuery / cudaEventQuery) is polled until it succeeds
// while every communicator's errors, the heartbeats' verdict and the deadline are checked: a collective in
// progress on any group can be the one a dead or stopped peer never completes.
template <typename Query, typename Block>
void wait_with_deadline(Query done, Block block, const std::vector<ProcessGroup::NamedCommunicator>& comms, int rank,
                        int timeout_seconds, bool bounded = true) {
    if (comms.empty()) {
        cudaError_t err = block();
        if (err != cudaSuccess) die(std::string("CUDA: ") + cudaGetErrorString(err));
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
        cudaError_t err = done();
        if (err == cudaSuccess) return;
        if (err != cudaErrorNotReady) die(std::string("CUDA: ") + cudaGetErrorString(err));
        for (const ProcessGroup::NamedCommunicator& c : comms) {
            ncclResult_t async_error;
            ncclCheck(ncclCommGetAsyncError(c.comm, &async_error));
            if (async_error != ncclSuccess && async_error != ncclInProgress)
                fail_collective(comms, rank, std::string("NCCL failed (") + ncclGetErrorString(async_error) + ") in the " + c.name + " communicator",
                                "a peer rank died or lost its connection");
        }
        const std::string verdict = heartbeat_verdict();
        if (!verdict.empty()) end_process(comms, "rank " + std::to_string(rank) + ": " + verdict);
        if (bounded && seconds_since(start) > timeout_seconds)
            fail_collective(comms, rank, "a collective did not finish within " + std::to_string(timeout_seconds) + " s (--nccl-timeout)",
                            "a peer rank failed or hangs");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}
}  // namespace

void ProcessGroup::synchronize(cudaStream_t stream) const {
    wait_with_deadline([stream] { return cudaStreamQuery(stream); }, [stream] { return cudaStreamSynchronize(stream); },
                       communicators_, rank, timeout_seconds_);
}

void ProcessGroup::wait_event(cudaEvent_t event) const {
    wait_with_deadline([event] { return cudaEventQuery(event); }, [event] { return cudaEventSynchronize(event); },
                       communicators_, rank, timeout_seconds_);
}

void ProcessGroup::all_reduce_sum(float* device_value, cudaStream_t stream) const {
    if (comm != nullptr) ncclCheck(ncclAllReduce(device_value, device_value, 1, ncclFloat32, ncclSum, comm, stream));
}

std::vector<uint64_t> ProcessGroup::all_gather_host(const std::vector<uint64_t>& mine, bool bounded) const {
    if (world == 1) return mine;
    auto check = [](cudaError_t err) {
        if (err != cudaSuccess) die(std::string("CUDA: ") + cudaGetErrorString(err));
    };
    const size_t n = mine.size();
    uint64_t* values;
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    check(cudaMalloc(&values, world * n * sizeof(uint64_t)));
    check(cudaMemcpyAsync(values + rank * n, mine.data(), n * sizeof(uint64_t), cudaMemcpyHostToDevice, stream));
    ncclCheck(ncclAllGather(values + rank * n, values, n, ncclUint64, comm, stream));
    wait_with_deadline([stream] { return cudaStreamQuery(stream); }, [stream] { return cudaStreamSynchronize(stream); }, communicators_, rank,
                       timeout_seconds_, bounded);  // the copy below then finds the stream drained
    std::vector<uint64_t> all(world * n);
    check(cudaMemcpy(all.data(), values, world * n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    check(cudaFree(values));
    check(cudaStreamDestroy(stream));
    return all;
}

int ProcessGroup::ranks_on_this_host() const {
    if (world == 1) return 1;
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) die(std::string("gethostname: ") + strerror(errno));
    uint64_t hash = 1469598103934665603ull;  // FNV-1a of the host name
    for (const char* c = name; *c != '\0'; c++) hash = (hash ^ (unsigned char)*c) * 1099511628211ull;
    int same = 0;
    for (uint64_t h : all_gather_host({hash})) same += h == hash;
    return same;
}
