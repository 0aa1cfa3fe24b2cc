// The stop signals (distributed/stop_signals.h) in forked processes, without a GPU: before the training loop accepts
// stop requests a signal ends the process as by default; then SIGTERM, SIGUSR1 and SIGINT (also when inherited as
// ignored, as a shell starts background commands) are recorded as the first request and the process goes on; a
// later SIGINT ends it at once, killed by SIGINT (status 130 in a shell); and no system call of any thread is cut
// short by them (EINTR): a poll, a sleep and a pipe read in progress while signals arrive run to their end; a thread
// that unblocked them (a library's) takes them through the handler, to the same effect.
// Needs no GPU. Prints one PASS/FAIL line per check (test/check.h); exits 1 on any FAIL.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../distributed/stop_signals.h"
#include "check.h"

namespace {

// The exit codes a child reports its findings with.
enum : int { kOk = 0, kWrongRequest = 2, kInterrupted = 3, kNotEnded = 4 };

// Runs body() in a child process and returns its waitpid status; `signals` are sent to the child at the given
// milliseconds after its start (the child has installed the stop signals by then).
int run_child(const std::function<int()>& body, const std::vector<std::pair<int, int>>& signals) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        const int null = open("/dev/null", O_WRONLY);  // the stop signals' notes on stderr are not the checks'
        dup2(null, STDERR_FILENO);
        _exit(body());
    }
    const auto start = std::chrono::steady_clock::now();
    for (const auto& s : signals) {
        std::this_thread::sleep_until(start + std::chrono::milliseconds(s.first));
        kill(pid, s.second);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

std::string describe(int status) {
    if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
    return "exit status " + std::to_string(WEXITSTATUS(status));
}
bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == kOk; }
bool killed_by(int status, int sig) { return WIFSIGNALED(status) && WTERMSIG(status) == sig; }

// Installs the stop signals, accepts requests, sleeps `ms` milliseconds and reports whether the first request
// was `expected`.
int accept_and_expect(int expected, int ms) {
    install_stop_signals();
    accept_stop_requests();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return stop_signal_received() == expected ? kOk : kWrongRequest;
}

}  // namespace

int main() {
    check_suite("stop_signals");

    for (int sig : {SIGTERM, SIGINT, SIGUSR1}) {
        const int status = run_child([] {
            install_stop_signals();
            std::this_thread::sleep_for(std::chrono::seconds(5));
            return (int)kNotEnded;
        }, {{300, sig}});
        check(killed_by(status, sig), std::string(signal_name(sig)) + " before the loop accepts stop requests ends the process as by default",
              describe(status));
    }
    for (int sig : {SIGTERM, SIGUSR1, SIGINT}) {
        const int status = run_child([sig] { return accept_and_expect(sig, 800); }, {{300, sig}});
        check(exited_ok(status), std::string(signal_name(sig)) + " is recorded as the stop request; the process goes on", describe(status));
    }
    {
        const int status = run_child([] { return accept_and_expect(SIGUSR1, 1000); }, {{300, SIGUSR1}, {500, SIGTERM}, {700, SIGUSR1}});
        check(exited_ok(status), "the first signal is the request: SIGUSR1, then SIGTERM and SIGUSR1 again change nothing", describe(status));
    }
    {
        const int status = run_child([] {
            signal(SIGINT, SIG_IGN);  // as a shell starts a background command
            return accept_and_expect(SIGINT, 800);
        }, {{300, SIGINT}});
        check(exited_ok(status), "SIGINT inherited as ignored is taken all the same", describe(status));
    }
    for (int first : {SIGINT, SIGTERM}) {
        const int status = run_child([] { return accept_and_expect(0, 5000) == kOk ? (int)kWrongRequest : (int)kNotEnded; },
                                     {{300, first}, {600, SIGINT}});
        check(killed_by(status, SIGINT), std::string(signal_name(first)) + ", then SIGINT: ends at once, killed by SIGINT (status 130 in a shell)",
              describe(status));
    }
    {  // a thread that unblocks the signals (as a library's might): the handler there records the request alike
        const int status = run_child([] {
            install_stop_signals();
            accept_stop_requests();
            std::thread unblocked([] {
                sigset_t all;
                sigfillset(&all);
                pthread_sigmask(SIG_UNBLOCK, &all, nullptr);
                raise(SIGUSR1);  // at this thread: its handler runs here
                raise(SIGTERM);
            });
            unblocked.join();
            return stop_signal_received() == SIGUSR1 ? (int)kOk : (int)kWrongRequest;
        }, {});
        check(exited_ok(status), "a thread that unblocked the signals takes them alike (SIGUSR1 recorded, SIGTERM then changes nothing)",
              describe(status));
    }
    {  // signals arrive while a thread polls, the main thread sleeps (one nanosleep) and a thread reads a pipe
        const int status = run_child([] {
            install_stop_signals();
            accept_stop_requests();
            int pipe_fds[2];
            if (pipe(pipe_fds) != 0) return (int)kInterrupted;
            std::atomic<int> interrupted{0};
            std::thread poller([&] {
                if (poll(nullptr, 0, 900) != 0) interrupted++;  // 0: timed out, as asked
            });
            std::thread reader([&] {
                char c;
                if (read(pipe_fds[0], &c, 1) != 1) interrupted++;  // -1 with EINTR if a signal cut it short
            });
            timespec sleep_time{0, 900000000};
            if (nanosleep(&sleep_time, nullptr) != 0) interrupted++;
            if (write(pipe_fds[1], "x", 1) != 1) interrupted++;
            poller.join();
            reader.join();
            return interrupted.load() == 0 && stop_signal_received() == SIGTERM ? (int)kOk : (int)kInterrupted;
        }, {{200, SIGTERM}, {400, SIGUSR1}, {600, SIGTERM}});
        check(exited_ok(status), "no system call is cut short: a poll, a nanosleep and a pipe read under SIGTERM, SIGUSR1, SIGTERM",
              describe(status));
    }
    return check_failures() == 0 ? 0 : 1;
}
