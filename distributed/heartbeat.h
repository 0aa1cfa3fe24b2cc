// The ranks' heartbeats, beside NCCL: each rank keeps one TCP connection to rank 0, and both ends send a heartbeat
// several times a second. NCCL alone cannot say which rank is gone: a killed or stopped peer leaves a collective
// waiting until the deadline (or fails it without a name). The heartbeats name it:
//   - a peer whose connection closes without a goodbye was lost (killed, crashed);
//   - a peer that says goodbye with a failing exit status (not 0, kExitStopped or kExitStoppedUnsaved) failed;
//   - a peer that sends nothing for the silence timeout (--nccl-timeout) is silent (stopped with SIGSTOP, frozen,
//     its node unreachable).
// Rank 0 hears every rank and passes what it hears to the others; the others hear rank 0 directly. The first such
// verdict ends this rank: a wait on the GPU ends at once with it (ProcessGroup's waits read heartbeat_verdict), and
// if the main thread is elsewhere the heartbeat thread itself prints "error: rank R: <verdict>" and exits 1 two
// seconds later. A normal exit (exit() or a return from main) says goodbye with its status, so ranks that finish or
// stop at slightly different times are not taken for lost.
// defines: HeartbeatAddress, heartbeat_listen, heartbeat_start, heartbeat_verdict, heartbeat_wait_for_verdict,
//          claim_process_end
#pragma once
#include <string>

// Where rank 0 listens for the others' connections. The NCCL id's bootstrap carries it to them (process_group.cpp);
// ranks that reach rank 0 through MASTER_ADDR connect there, the others (MPI, --nccl-init-file) to `host`.
struct HeartbeatAddress {
    char host[256] = {};  // rank 0's host name
    int port = 0;
};

// Rank 0, before the NCCL id goes out: listens on a free TCP port.
HeartbeatAddress heartbeat_listen();

// Connects this rank (rank 0: accepts the world - 1 others, each naming its rank; the others: connect to host:port)
// and starts its heartbeat thread. A peer silent for silent_seconds is declared silent. Blocks until connected; the
// caller's watchdog bounds it.
void heartbeat_start(int rank, int world, const std::string& host, int port, int silent_seconds);

// The first problem with a peer this rank knows of, e.g. "rank 3 was lost: its process ended without a goodbye
// (killed or crashed)", or "" while there is none.
std::string heartbeat_verdict();
// The same, waiting up to `seconds` for one to come.
std::string heartbeat_wait_for_verdict(double seconds);

// True for the first caller only: the thread that ends the process and prints why (a failed wait, or the heartbeat
// thread); the others must not print a second reason.
bool claim_process_end();
