// Stop signals: SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 (Slurm's `--signal=USR1@120`) ask a training run to stop at
// the end of the optimizer step in progress, write a checkpoint and exit with kExitStopped; a SIGINT while that stop
// is pending ends the process at once, as Ctrl-C does (status 130). Before the training loop accepts stop requests
// (set-up, --generate) the signals end the process as they would without train_gpt's handling.
//
// The signals are blocked in every thread and taken by one thread of their own (sigwait), which records the first
// in an atomic flag: no other thread's system call is ever cut short with EINTR, so a checkpoint being written, a
// socket read or a wait on the GPU goes on undisturbed. (Should a library's thread unblock them, the handler there
// does the same, with async-signal-safe calls only.) The training step reads the flag (stop_signal_received) once,
// before the step's losses are gathered, and every rank learns of any rank's request through the step's own
// reductions (model/loss.h, distributed/zero.cuh), so all stop after the same step.
// defines: kExitStopped, kExitStoppedUnsaved, install_stop_signals, accept_stop_requests, stop_signal_received, signal_name
#pragma once
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <pthread.h>
#include <thread>
#include <unistd.h>

// The exit status of a run stopped by a signal after writing its checkpoint: EX_TEMPFAIL of sysexits.h ("try again
// later"), distinct from errors (1) and from a process killed by a signal (128 + N), so that a job script can
// requeue the job, which continues with --resume 1.
constexpr int kExitStopped = 75;
// The exit status of a run stopped by a signal that committed no checkpoint (no --output-dir, a LoRA run's adapter
// files): requeueing it would start it again from its beginning.
constexpr int kExitStoppedUnsaved = 76;

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};

inline const char* signal_name(int sig) {
    switch (sig) {
        case SIGTERM: return "SIGTERM";
        case SIGINT: return "SIGINT";
        case SIGUSR1: return "SIGUSR1";
    }
    return "a signal";
}

namespace stop_signals {
inline std::atomic<int> requested{0};       // the first stop signal accepted, or 0
inline std::atomic<bool> accepting{false};  // the training loop runs: a signal asks it to stop

inline void note(const char* text, size_t length) {
    const ssize_t ignored = write(STDERR_FILENO, text, length);
    (void)ignored;
}
#define STOP_SIGNAL_NOTE(name) name ": stopping after the current step, with a checkpoint where --output-dir is set (SIGINT again: at once)\n"

// Ends the process by `sig` with its default action (a shell reports 128 + sig): unblocked in this thread only,
// then raised at this thread.
[[noreturn]] inline void end_by(int sig) {
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);
    abort();  // not reached: the default action of every stop signal ends the process
}

// What a stop signal does, in async-signal-safe calls only.
inline void take(int sig) {
    static const char term[] = STOP_SIGNAL_NOTE("SIGTERM"), interrupt[] = STOP_SIGNAL_NOTE("SIGINT"), user1[] = STOP_SIGNAL_NOTE("SIGUSR1");
    static const char again[] = "SIGINT while stopping: stopping at once, without a checkpoint\n";
    if (!accepting.load()) end_by(sig);
    int none = 0;
    if (requested.compare_exchange_strong(none, sig)) {
        if (sig == SIGTERM) note(term, sizeof term - 1);
        if (sig == SIGINT) note(interrupt, sizeof interrupt - 1);
        if (sig == SIGUSR1) note(user1, sizeof user1 - 1);
    } else if (sig == SIGINT) {
        note(again, sizeof again - 1);
        end_by(SIGINT);
    }
}
#undef STOP_SIGNAL_NOTE

inline void take_signals(sigset_t set) {
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) == 0) take(sig);
    }
}
extern "C" inline void on_stop_signal(int sig) { take(sig); }
}  // namespace stop_signals

// Blocks the stop signals in the calling thread, and so in every thread it starts afterwards, and starts the thread
// that takes them. Call it first in main(), before MPI, CUDA, NCCL or the data loader start threads of their own.
// An inherited "ignore" (a shell starts a background command with SIGINT ignored) is replaced: the signals are meant
// for the run.
inline void install_stop_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kStopSignals) sigaddset(&set, sig);
    struct sigaction action = {};
    action.sa_handler = stop_signals::on_stop_signal;
    action.sa_mask = set;
    action.sa_flags = SA_RESTART;
    for (int sig : kStopSignals) sigaction(sig, &action, nullptr);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread(stop_signals::take_signals, set).detach();
}

// From now on a stop signal asks the training loop to stop after its step (before: it ends the process).
inline void accept_stop_requests() { stop_signals::accepting.store(true); }

// The first stop signal received since accept_stop_requests(), or 0.
inline int stop_signal_received() { return stop_signals::requested.load(); }
