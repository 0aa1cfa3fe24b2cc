// Crash consistency of checkpoints (model/checkpoint_store.h), ranks as processes, no GPU. Each rank is a forked
// process that runs the save sequence train_gpt runs (save_committed_checkpoint: its state file durably, the
// exchange of records, rank 0's model file and manifest, rank 0's retention), exchanging over a socket with a hub
// (this process) that, like the heartbeats of a real job, kills every rank once one dies. A run of a few saves is
// repeated with one rank killed (SIGKILL, TRAIN_GPT_KILL_AT) at each fault point of the save in turn - each file's
// write, fsync, rename and folder fsync, the manifest's, each deletion of retention - and, in the full tier, at
// random times; the run's first save and one after two committed checkpoints. After every kill the folder must hold
// only committed checkpoints of this run whose files all match their manifests, the newest committed one before the
// save must still be there (or the save's own must have committed), --resume must take the newest without setting
// anything aside (with none, start this run again from scratch under its id), and the run must continue from it
// (one more save, which leaves no uncommitted file behind). The closing line reports the number of kills and of lost or
// mixed checkpoints.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../model/checkpoint_store.h"
#include "../model/model_file.h"
#include "../model/state_file.h"
#include "check.h"

namespace {

constexpr uint64_t kRun = 0xC0FFEE0123456789ull;

ModelConfig tiny_config() {
    ModelConfig config;
    config.num_layers = 2;
    config.num_heads = 1;
    config.channels = 32;
    config.max_seq_len = 16;
    config.vocab_size = 256;
    config.padded_vocab_size = 256;
    return config;
}

bool read_all(int fd, void* data, size_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
        const ssize_t got = read(fd, p, n);
        if (got <= 0) return false;
        p += got;
        n -= (size_t)got;
    }
    return true;
}
bool write_all(int fd, const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t put = write(fd, p, n);
        if (put <= 0) return false;
        p += put;
        n -= (size_t)put;
    }
    return true;
}

// A rank's side of the exchange: its socket to the hub. A message is 4 values; a lost hub ends the rank.
class SocketExchange : public RankExchange {
public:
    SocketExchange(int fd, int rank, int world, int step) : fd_(fd), rank_(rank), world_(world), step_(step) {}
    int rank() const override { return rank_; }
    int world() const override { return world_; }
    std::vector<FileRecord> all_gather(const FileRecord& mine) override {
        const uint64_t message[4] = {1, mine.name.empty() ? 0u : 1u, mine.bytes, mine.crc};
        std::vector<uint64_t> all(3 * world_);
        if (!write_all(fd_, message, sizeof(message)) || !read_all(fd_, all.data(), all.size() * sizeof(uint64_t))) _exit(9);
        std::vector<FileRecord> records(world_);
        for (int r = 0; r < world_; r++)
            if (all[3 * r] != 0) records[r] = {state_path("", step_, r).substr(1), all[3 * r + 1], (uint32_t)all[3 * r + 2]};
        return records;
    }
    int broadcast_from_main(int value) override {
        const uint64_t message[4] = {2, (uint64_t)value, 0, 0};
        uint64_t verdict = 0;
        if (!write_all(fd_, message, sizeof(message)) || !read_all(fd_, &verdict, sizeof(verdict))) _exit(9);
        return (int)verdict;
    }

private:
    int fd_, rank_, world_, step_;
};

// One rank's save of `step` in a forked process: its state file (each rank at ZeRO stage 1), rank 0's model file and
// manifest, then rank 0's retention. kill_at > 0: killed at its kill_at-th fault point. Writes its count of fault
// points to count_file (when given) and exits 0 once the checkpoint committed.
[[noreturn]] void rank_process(int fd, int rank, int world, int step, const std::string& dir, int keep, long kill_at, const std::string& count_file) {
    if (kill_at > 0) setenv("TRAIN_GPT_KILL_AT", std::to_string(kill_at).c_str(), 1);
    else unsetenv("TRAIN_GPT_KILL_AT");
    fault_points_passed() = 0;
    const ModelConfig config = tiny_config();
    const ParameterLayout layout(config, 8 * world);
    const float value = (float)step;
    CheckpointManifest manifest;
    manifest.run_id = kRun;
    manifest.step = step;
    manifest.precision = "bf16";
    manifest.data_parallel = world;
    manifest.zero_stage = 1;
    manifest.settings = {{"steps", "100"}};
    SocketExchange exchange(fd, rank, world, step);
    auto write_own = [&] {
        const std::vector<float> shard(layout.total / world, value + rank);
        StateHeader h{step, 1, world, 1, 1, rank, 0, 0, 1, 1, 0, 1.0f, 0, (long long)shard.size(), kRun};
        DataLoaderState data_state{};
        return write_state_file(state_path(dir, step, rank), h, StageModel::whole(config), shard, shard, shard, data_state);
    };
    auto write_model = [&] {
        return write_model_file(checkpoint_path(dir, "model", step), layout, std::vector<float>(layout.total, value), true, kRun, step);
    };
    const bool committed = save_committed_checkpoint(dir, manifest, exchange, write_own, write_model);
    if (committed && rank == 0) {
        FILE* quiet = fopen("/dev/null", "w");
        prune_checkpoints(dir, step, kRun, keep, 0, quiet);
        fclose(quiet);
    }
    if (!count_file.empty())
        if (FILE* f = fopen(count_file.c_str(), "w")) {
            fprintf(f, "%ld\n", fault_points_passed());
            fclose(f);
        }
    _exit(committed ? 0 : 2);
}

// Runs one save of `step` with `world` ranks; kill_rank/kill_at: the rank killed at its kill_at-th fault point (-1:
// none); kill_after_us >= 0: the hub kills a random rank after that many microseconds instead. The hub ends every
// rank once one dies. Returns true when every rank exited 0 (committed and pruned).
bool run_save(const std::string& dir, int world, int step, int keep, int kill_rank, long kill_at, long kill_after_us = -1,
              const std::string& count_prefix = "", std::mt19937* random = nullptr) {
    std::vector<int> fds(world);
    std::vector<pid_t> pids(world);
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) die("socketpair failed");
        pids[r] = fork();
        if (pids[r] == 0) {
            for (int q = 0; q < r; q++) close(fds[q]);
            close(pair[0]);
            rank_process(pair[1], r, world, step, dir, keep, r == kill_rank ? kill_at : 0,
                         count_prefix.empty() ? "" : count_prefix + std::to_string(r));
        }
        close(pair[1]);
        fds[r] = pair[0];
    }
    if (kill_after_us >= 0) {
        usleep((useconds_t)kill_after_us);
        kill(pids[(*random)() % world], SIGKILL);
    }
    bool alive = true;
    for (int round = 0; round < 2 && alive; round++) {
        std::vector<uint64_t> all;
        for (int r = 0; r < world && alive; r++) {
            uint64_t message[4];
            alive = read_all(fds[r], message, sizeof(message));
            if (round == 0) all.insert(all.end(), message + 1, message + 4);
            else if (r == 0) all.push_back(message[1]);
        }
        for (int r = 0; r < world && alive; r++) alive = write_all(fds[r], all.data(), all.size() * sizeof(uint64_t));
    }
    if (!alive)
        for (pid_t p : pids) kill(p, SIGKILL);  // a rank died: the job ends, as the heartbeats end it
    bool all_zero = true;
    for (int r = 0; r < world; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        all_zero = all_zero && WIFEXITED(status) && WEXITSTATUS(status) == 0;
        close(fds[r]);
    }
    return all_zero && alive;
}

void clear_dir(const std::string& dir) {
    make_directories(dir);
    for (const std::string& name : directory_entries(dir)) unlink((dir + "/" + name).c_str());
}

// What must hold after a crash during the save of `step` (the saves before it committed `before`): every committed
// checkpoint is this run's and whole; the newest of `before` is still committed, or `step` committed; nothing is set
// aside. Returns "" or what broke.
std::string crash_problem(const std::string& dir, const std::vector<int>& before, int step) {
    const std::vector<int> committed = committed_checkpoints(dir);
    for (int s : committed) {
        CheckpointManifest m;
        std::string problem = read_manifest(dir, s, &m);
        if (problem.empty() && m.run_id != kRun) problem = "checkpoint " + std::to_string(s) + " of another run";
        for (size_t i = 0; problem.empty() && i < m.files.size(); i++) problem = verify_manifest_file(dir, m.files[i]);
        if (!problem.empty()) return "mixed or damaged: " + problem;
    }
    const bool newest_kept = before.empty() || std::binary_search(committed.begin(), committed.end(), before.back());
    const bool saved = std::binary_search(committed.begin(), committed.end(), step);
    if (!newest_kept && !saved) return "lost: checkpoint " + std::to_string(before.back()) + " is gone and " + std::to_string(step) + " did not commit";
    for (const std::string& name : directory_entries(dir))
        if (name.find(".damaged") != std::string::npos) return "set aside: " + name;
    return "";
}

struct Tally {
    int kills = 0, lost_or_mixed = 0, committed = 0, not_committed = 0;
    std::string first_problem;
};

// One kill: with `saves_before` saves committed first (steps 10, 20), the next save is killed; then --resume's
// choice (the newest committed checkpoint; with none, this run again from scratch under its id) and the run goes on
// with one more save, which must commit and leave no file that no manifest names.
void crash_once(const std::string& dir, int world, int keep, int saves_before, int kill_rank, long kill_at, long kill_after_us, std::mt19937* random,
                Tally& tally) {
    clear_dir(dir);
    for (int k = 1; k <= saves_before; k++)
        if (!run_save(dir, world, 10 * k, keep, -1, 0)) {
            tally.lost_or_mixed++;
            if (tally.first_problem.empty()) tally.first_problem = "a save without a kill failed";
            return;
        }
    const int step = 10 * (saves_before + 1);
    const std::vector<int> before = committed_checkpoints(dir);
    run_save(dir, world, step, keep, kill_rank, kill_at, kill_after_us, "", random);
    tally.kills++;
    std::string problem = crash_problem(dir, before, step);
    const std::vector<int> after = committed_checkpoints(dir);
    const bool saved = std::binary_search(after.begin(), after.end(), step);
    (saved ? tally.committed : tally.not_committed)++;
    if (problem.empty()) {
        FILE* quiet = fopen("/dev/null", "w");
        const ResumeChoice choice = choose_resume_checkpoint(dir, quiet);
        fclose(quiet);
        const int newest = after.empty() ? -1 : after.back();
        if (choice.step != newest) problem = "--resume took " + std::to_string(choice.step) + ", not the newest committed " + std::to_string(newest);
        bool sealed_files = false;  // files of the save that were renamed into place (temporary ones name no run)
        for (const std::string& name : directory_entries(dir)) sealed_files = sealed_files || (checkpoint_file_step(name) >= 0 && !is_temporary(name));
        if (newest < 0 && sealed_files && choice.run_id != kRun) problem = "--resume did not take the uncommitted files' run";
    }
    if (problem.empty()) {  // the run continues: its next save commits and leaves no file that no manifest names
        const int next = after.empty() ? 10 : after.back() + 5;
        if (!run_save(dir, world, next, keep, -1, 0)) problem = "the save after the resume failed";
        else if (!uncommitted_steps(dir).empty()) problem = "files without a manifest left after the next save: step " + std::to_string(uncommitted_steps(dir)[0]);
        else problem = crash_problem(dir, committed_checkpoints(dir), next);
    }
    if (!problem.empty()) {
        tally.lost_or_mixed++;
        if (tally.first_problem.empty())
            tally.first_problem = "world " + std::to_string(world) + ", keep " + std::to_string(keep) + ", " + std::to_string(saves_before) +
                                  " saves before, rank " + std::to_string(kill_rank) + " killed at point " + std::to_string(kill_at) + ": " + problem;
    }
}

}  // namespace

int main() {
    check_suite("checkpoint_crash");
    signal(SIGPIPE, SIG_IGN);  // a write to a killed rank's socket fails instead
    const std::string dir = "build/test_work/checkpoint_crash/run", counts = "build/test_work/checkpoint_crash/count_";
    make_directories(dir);
    const auto start = std::chrono::steady_clock::now();
    std::mt19937 random(1234);
    Tally total;
    // the quick tier: one and three ranks, keeping one checkpoint (retention deletes at every save); the full tier
    // also two ranks, keeping two, and random-time kills
    std::vector<std::pair<int, int>> configs = {{1, 1}, {3, 1}};
    if (!quick_tier()) configs.insert(configs.end(), {{2, 1}, {1, 2}, {2, 2}, {3, 2}});
    for (const auto& config : configs) {
        const int world = config.first, keep = config.second;
        for (int saves_before : {0, 2}) {  // the run's first save, and one after two committed checkpoints
            // the fault points each rank passes in that save (a run without a kill, the same files)
            clear_dir(dir);
            for (int k = 1; k <= saves_before; k++) run_save(dir, world, 10 * k, keep, -1, 0);
            run_save(dir, world, 10 * (saves_before + 1), keep, -1, 0, -1, counts);
            Tally tally;
            for (int rank = 0; rank < world; rank++) {
                long points = 0;
                if (FILE* f = fopen((counts + std::to_string(rank)).c_str(), "r")) {
                    if (fscanf(f, "%ld", &points) != 1) points = 0;
                    fclose(f);
                }
                for (long at = 1; at <= points; at++) crash_once(dir, world, keep, saves_before, rank, at, -1, &random, tally);
            }
            check(tally.lost_or_mixed == 0 && tally.kills > 0,
                  "killed at every fault point of " + std::string(saves_before == 0 ? "the first save" : "a save after two") + " (" +
                      std::to_string(world) + " rank(s), --keep-checkpoints " + std::to_string(keep) +
                      "): every committed checkpoint whole and this run's, none lost, --resume takes the newest and the run continues",
                  fmt("%.0f kills (%.0f after the commit, %.0f before)", tally.kills, tally.committed, tally.not_committed) +
                      (tally.first_problem.empty() ? "" : "; " + tally.first_problem));
            total.kills += tally.kills;
            total.lost_or_mixed += tally.lost_or_mixed;
        }
    }
    if (!quick_tier()) {
        Tally tally;
        for (int i = 0; i < 120; i++) crash_once(dir, 3, 1 + i % 2, 2, -1, 0, (long)(random() % 4000), &random, tally);
        check(tally.lost_or_mixed == 0, "killed at random times during a save (3 ranks): no committed checkpoint lost or mixed",
              fmt("%.0f kills (%.0f after the commit, %.0f before)", tally.kills, tally.committed, tally.not_committed) +
                  (tally.first_problem.empty() ? "" : "; " + tally.first_problem));
        total.kills += tally.kills;
        total.lost_or_mixed += tally.lost_or_mixed;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    printf("checkpoint_crash: %d kills, %d lost or mixed checkpoints, %.1f s\n", total.kills, total.lost_or_mixed, seconds);
    return check_failures() == 0 ? 0 : 1;
}
