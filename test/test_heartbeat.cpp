// The ranks' heartbeats (distributed/heartbeat.cpp) on forked processes of this machine, without NCCL or a GPU: ranks
// that end normally (status 0, or kExitStopped at slightly different times) print nothing; a rank killed with -9,
// stopped with SIGSTOP or exiting with a failing status ends every other rank with status 1 and one line naming it,
// within the expected time (printed), also when rank 0 ends the instant it knows (its notice goes out first); a
// stopped rank that is continued ends too, and no process is left behind. The survivors mostly idle (their main
// thread waits on nothing), so the heartbeat thread itself must end them.
// The eight cases run side by side, each in a process of its own with its own ranks and port (their time is sleeps and
// timeouts: 30 s one after another, about 8 s together), and their lines are printed in the cases' order. Every tier
// runs them all.
// Needs no GPU. Prints one PASS/FAIL line per check (test/check.h); exits 1 on any FAIL.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../distributed/heartbeat.h"
#include "../distributed/stop_signals.h"
#include "check.h"

namespace {

const std::string kWork = "build/test_work/heartbeat";

double now_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Rank {
    pid_t pid = -1;
    int status = -1;         // waitpid's, once it ended
    double ended_at = -1.0;  // when the parent saw it end
    std::string stderr_path;
};

// Starts `world` ranks as child processes: rank 0's listening socket is opened here and inherited; each child
// writes its stderr to a file of its own, connects, runs body(rank) and exits with its result (exit(), so that a
// normal end says goodbye).
std::vector<Rank> start_ranks(const std::string& name, int world, int silent_seconds, const std::function<int(int)>& body) {
    const HeartbeatAddress address = heartbeat_listen();
    std::vector<Rank> ranks(world);
    fflush(stdout);
    for (int r = 0; r < world; r++) {
        ranks[r].stderr_path = kWork + "/" + name + "_rank" + std::to_string(r) + ".err";
        const pid_t pid = fork();
        if (pid == 0) {
            const int fd = open(ranks[r].stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(fd, STDERR_FILENO);
            close(fd);
            heartbeat_start(r, world, "127.0.0.1", address.port, silent_seconds);
            exit(body(r));
        }
        ranks[r].pid = pid;
    }
    return ranks;
}

// Reaps the ranks as they end, up to `seconds`; those still running then are killed (and count as not ended).
void wait_for_ranks(std::vector<Rank>& ranks, double seconds) {
    const double deadline = now_seconds() + seconds;
    for (;;) {
        bool running = false;
        for (Rank& r : ranks) {
            if (r.ended_at >= 0) continue;
            int status;
            if (waitpid(r.pid, &status, WNOHANG) == r.pid && (WIFEXITED(status) || WIFSIGNALED(status))) {
                r.status = status;
                r.ended_at = now_seconds();
            } else {
                running = true;
            }
        }
        if (!running) return;
        if (now_seconds() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (Rank& r : ranks)
        if (r.ended_at < 0) {
            kill(r.pid, SIGKILL);
            kill(r.pid, SIGCONT);
            waitpid(r.pid, nullptr, 0);
        }
}

std::vector<std::string> lines_of(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

int exit_status(const Rank& r) { return r.ended_at >= 0 && WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1; }

// Every rank in `survivors` ended with status 1 within `limit` s of `since`, its stderr one line that says
// "error: rank R: " and then `expected`. Returns the latest end, in seconds after `since`, through `worst`.
void check_survivors(const std::string& name, const std::vector<Rank>& ranks, const std::vector<int>& survivors, double since,
                     double limit, const std::string& expected, double* worst = nullptr) {
    std::string bad;
    double latest = 0;
    for (int r : survivors) {
        const Rank& rank = ranks[r];
        const std::vector<std::string> lines = lines_of(rank.stderr_path);
        const std::string want = "error: rank " + std::to_string(r) + ": " + expected;
        const double after = rank.ended_at - since;
        latest = std::max(latest, after);
        if (exit_status(rank) != 1 || after > limit || lines.size() != 1 || lines[0].compare(0, want.size(), want) != 0)
            bad += " rank " + std::to_string(r) + ": status " + std::to_string(exit_status(rank)) + " after " + fmt("%.1f s", after) +
                   ", stderr '" + (lines.empty() ? std::string() : lines[0]) + "'" + (lines.size() > 1 ? " and more" : "") + ";";
    }
    if (worst) *worst = latest;
    check(bad.empty(), name, bad.empty() ? fmt("every other rank ended with one line naming it within %.1f s", latest) + fmt(" (limit %.0f s)", limit) : bad);
}

int idle(int seconds) {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    return 0;
}

// The cases: each runs in a process of its own (run_side_by_side), so that their sleeps and timeouts overlap.
const int kSilent = 2;  // seconds: heartbeats every 0.4 s

// Normal ends at different times: status 0, or kExitStopped as ranks stopped by a signal end.
void orderly(int status) {
    const std::string name = "orderly_" + std::to_string(status);
    std::vector<Rank> ranks = start_ranks(name, 3, kSilent, [status](int r) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500 + 700 * r));
        return status;
    });
    wait_for_ranks(ranks, 15);
    std::string bad;
    for (size_t r = 0; r < ranks.size(); r++)
        if (exit_status(ranks[r]) != status || !lines_of(ranks[r].stderr_path).empty())
            bad += " rank " + std::to_string(r) + " status " + std::to_string(exit_status(ranks[r])) + ";";
    check(bad.empty(), "3 ranks ending with status " + std::to_string(status) + " at different times", bad.empty() ? "no verdict, no message" : bad);
}

// A rank killed with -9: its connection closes, the others end at once.
void killed(int victim) {
    const std::string name = "killed_" + std::to_string(victim);
    std::vector<Rank> ranks = start_ranks(name, 3, kSilent, [](int) { return idle(30); });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    kill(ranks[victim].pid, SIGKILL);
    const double since = now_seconds();
    wait_for_ranks(ranks, 20);
    std::vector<int> survivors;
    for (int r = 0; r < 3; r++)
        if (r != victim) survivors.push_back(r);
    check_survivors("rank " + std::to_string(victim) + " killed with -9", ranks, survivors, since, 4.0,
                    "rank " + std::to_string(victim) + " was lost: its process ended without a goodbye");
}

// Rank 0's main thread ends the process the moment it sees the verdict (as a wait on the GPU does): rank 2 must still
// hear from rank 0 who was lost, not only that rank 0's connection closed.
void quick_end() {
    std::vector<Rank> ranks = start_ranks("quick_end", 3, kSilent, [](int r) {
        if (r != 0) return idle(30);
        for (;;) {
            const std::string verdict = heartbeat_verdict();
            if (!verdict.empty() && claim_process_end()) {
                fprintf(stderr, "error: rank 0: %s\n", verdict.c_str());
                fflush(stderr);
                _exit(1);
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    kill(ranks[1].pid, SIGKILL);
    const double since = now_seconds();
    wait_for_ranks(ranks, 20);
    check_survivors("rank 1 killed, rank 0 ending at once on the verdict", ranks, {0, 2}, since, 4.0, "rank 1 was lost");
}

// A rank stopped with SIGSTOP: silent for kSilent s; once continued it ends too.
void stopped(int victim) {
    const std::string name = "stopped_" + std::to_string(victim);
    std::vector<Rank> ranks = start_ranks(name, 3, kSilent, [](int) { return idle(30); });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    kill(ranks[victim].pid, SIGSTOP);
    const double since = now_seconds();
    std::vector<Rank> others, stopped = {ranks[victim]};
    std::vector<int> survivors;
    for (int r = 0; r < 3; r++)
        if (r != victim) {
            survivors.push_back(r);
            others.push_back(ranks[r]);
        }
    wait_for_ranks(others, 20);
    for (size_t i = 0; i < survivors.size(); i++) ranks[survivors[i]] = others[i];
    check_survivors("rank " + std::to_string(victim) + " stopped with SIGSTOP", ranks, survivors, since, kSilent + 4.0,
                    "rank " + std::to_string(victim) + " is silent: no heartbeat for ");
    kill(ranks[victim].pid, SIGCONT);
    const double continued = now_seconds();
    wait_for_ranks(stopped, 10);
    const std::vector<std::string> lines = lines_of(stopped[0].stderr_path);
    const double after = stopped[0].ended_at - continued;
    const bool ok = exit_status(stopped[0]) == 1 && after <= 4.0 && lines.size() == 1 &&
                    lines[0].find("error: rank " + std::to_string(victim) + ": rank ") == 0;
    check(ok, "rank " + std::to_string(victim) + " continued after SIGCONT ends too, nothing left behind",
          fmt("status %.0f after %.1f s: ", exit_status(stopped[0]), after) + (lines.empty() ? std::string() : lines[0]));
}

// A rank that exits with a failing status: the others end, naming it and the status.
void failed() {
    std::vector<Rank> ranks = start_ranks("failed", 3, kSilent, [](int r) {
        if (r == 1) {
            std::this_thread::sleep_for(std::chrono::seconds(1));
            return 3;
        }
        return idle(30);
    });
    const double since = now_seconds() + 1.0;
    wait_for_ranks(ranks, 20);
    check_survivors("rank 1 exiting with status 3", ranks, {0, 2}, since, 4.0, "rank 1 exited with status 3");
}

struct Case {
    std::string name;
    std::function<void()> run;
};

// Runs every case at once, each in a child process whose check lines go to a file of its own (its ranks are its
// children, its listening port its own); then prints each case's lines in order. A case that exits non-zero without
// a FAIL line (a crash) is one FAIL.
void run_side_by_side(const std::vector<Case>& cases) {
    std::vector<pid_t> pids;
    for (size_t i = 0; i < cases.size(); i++) {
        const std::string out = kWork + "/case_" + cases[i].name + ".out";
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0) _exit(2);
            close(fd);
            cases[i].run();
            fflush(stdout);
            _exit(check_failures() == 0 ? 0 : 1);
        }
        if (pid < 0) fail(cases[i].name, "fork failed");
        pids.push_back(pid);
    }
    for (size_t i = 0; i < cases.size(); i++) {
        if (pids[i] < 0) continue;
        int status = 0;
        waitpid(pids[i], &status, 0);
        bool failed_line = false;
        for (const std::string& line : lines_of(kWork + "/case_" + cases[i].name + ".out")) {
            printf("%s\n", line.c_str());
            failed_line = failed_line || line.compare(0, 5, "FAIL ") == 0;
        }
        fflush(stdout);
        const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!clean && !failed_line)
            fail(cases[i].name, WIFEXITED(status) ? fmt("its process exited with status %.0f and no check line", WEXITSTATUS(status))
                                                  : fmt("its process ended by signal %.0f", WTERMSIG(status)));
        else if (!clean)
            check_failures()++;  // its FAIL lines, printed above, count here
    }
}

}  // namespace

int main() {
    check_suite("heartbeat");
    if (system(("mkdir -p " + kWork).c_str()) != 0) {
        fail("work folder", kWork);
        return 1;
    }
    run_side_by_side({{"orderly_0", [] { orderly(0); }},
                      {"orderly_stopped", [] { orderly(kExitStopped); }},
                      {"killed_1", [] { killed(1); }},
                      {"killed_0", [] { killed(0); }},
                      {"quick_end", quick_end},
                      {"stopped_2", [] { stopped(2); }},
                      {"stopped_0", [] { stopped(0); }},
                      {"failed", failed}});
    return check_failures() == 0 ? 0 : 1;
}
