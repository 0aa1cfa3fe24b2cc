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
// mixed checkpoints. The same ranks also resume (load_agreed_checkpoint), counting the bytes each reads of each file:
// no byte read twice, each file verified whole by its one rank, a damaged file found by the load and the checkpoint
// before loaded, another run's file refused by the cheap check.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
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
    config.channels = 64;  // a head of 64: a shape the model file's reader accepts
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

// Forks `world` rank processes, each joined to this process (the hub) by a socket pair: rank r runs body(its socket,
// r), which ends the process. The hub's sockets and the ranks' pids, by rank.
struct RankProcesses {
    std::vector<int> fds;
    std::vector<pid_t> pids;
};
RankProcesses fork_ranks(int world, const std::function<void(int, int)>& body) {
    RankProcesses ranks{std::vector<int>(world), std::vector<pid_t>(world)};
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) die("socketpair failed");
        ranks.pids[r] = fork();
        if (ranks.pids[r] == 0) {
            for (int q = 0; q < r; q++) close(ranks.fds[q]);
            close(pair[0]);
            body(pair[1], r);
        }
        close(pair[1]);
        ranks.fds[r] = pair[0];
    }
    return ranks;
}

// Runs one save of `step` with `world` ranks; kill_rank/kill_at: the rank killed at its kill_at-th fault point (-1:
// none); kill_after_us >= 0: the hub kills a random rank after that many microseconds instead. The hub ends every
// rank once one dies. Returns true when every rank exited 0 (committed and pruned).
bool run_save(const std::string& dir, int world, int step, int keep, int kill_rank, long kill_at, long kill_after_us = -1,
              const std::string& count_prefix = "", std::mt19937* random = nullptr) {
    const RankProcesses ranks = fork_ranks(world, [&](int fd, int r) {
        rank_process(fd, r, world, step, dir, keep, r == kill_rank ? kill_at : 0, count_prefix.empty() ? "" : count_prefix + std::to_string(r));
    });
    const std::vector<int>& fds = ranks.fds;
    const std::vector<pid_t>& pids = ranks.pids;
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

// ---------------------------------------------------------------------------------------------
// Resuming, ranks as processes: the load verifies each file as it reads it, each byte once

// A rank's side of the resume's gathers: its value to the hub, every rank's back.
std::vector<uint64_t> socket_all_gather(int fd, int world, uint64_t mine) {
    std::vector<uint64_t> all(world);
    if (!write_all(fd, &mine, sizeof(mine)) || !read_all(fd, all.data(), all.size() * sizeof(uint64_t))) _exit(9);
    return all;
}

// One rank's --resume 1 as train_gpt runs it on the checkpoint's own data-parallel mesh (ZeRO stage 1): rank 0 chooses
// (the cheap checks) and every rank learns the choice; each loads the whole model file and its own state file through
// the checked reads (verifying its own files) and the ranks agree (load_agreed_checkpoint). Writes `report`: the step
// loaded, whether every value loaded is that checkpoint's, and for each file read: its size, the bytes read, the bytes
// read more than once.
[[noreturn]] void resume_rank_process(int fd, int rank, int world, const std::string& dir, const std::string& report) {
    ReadTally tally;
    read_tally() = &tally;
    FILE* out = fopen(rank == 0 ? (report + ".log").c_str() : "/dev/null", "w");
    auto all_gather = [&](const std::vector<uint64_t>& mine) { return socket_all_gather(fd, world, mine[0]); };
    auto agree = [&](int chosen) {  // rank 0's choice, to every rank
        const int step = (int)all_gather({(uint64_t)(chosen + 1)})[0] - 1;
        if (step < 0) _exit(3);
        CheckpointManifest m;
        const std::string problem = read_manifest(dir, step, &m);
        if (!problem.empty()) die(problem);
        return m;
    };
    const CheckpointManifest first = agree(rank == 0 ? choose_resume_checkpoint(dir, out).step : -1);
    const ParameterLayout layout(tiny_config(), 8 * world);
    std::vector<float> parameters;
    SavedOptimizerState saved;
    auto load = [&](const CheckpointManifest& m, CheckpointReads& reads) {
        parameters = read_model_part(checkpoint_path(dir, "model", m.step), layout, 0, &reads);
        saved = read_own_optimizer_state(dir, m.step, rank, layout.total / world, &reads);
    };
    auto choose_again = [&](int damaged) { return agree(rank == 0 ? choose_after_damage(dir, damaged, out).step : -1); };
    const int step = load_agreed_checkpoint(dir, first, rank, world, load, all_gather, choose_again, out).step;
    fclose(out);
    bool values = saved.m.size() == layout.total / world;
    for (float x : parameters) values = values && (x == 0.0f || x == (float)step);  // 0: the layout's padding
    for (float x : saved.m) values = values && x == (float)(step + rank);
    FILE* f = fopen(report.c_str(), "w");
    fprintf(f, "%d %d\n", step, values ? 1 : 0);
    for (auto& file : tally.ranges) {
        std::sort(file.second.begin(), file.second.end());
        uint64_t read = 0, twice = 0, end = 0;
        for (const auto& r : file.second) {
            read += r.second - r.first;
            if (r.first < end) twice += std::min(end, r.second) - r.first;
            end = std::max(end, r.second);
        }
        struct stat st;
        const std::string now = access(file.first.c_str(), F_OK) == 0 ? file.first : file.first + ".damaged";
        fprintf(f, "%s %lld %llu %llu\n", file.first.substr(file.first.rfind('/') + 1).c_str(),
                stat(now.c_str(), &st) == 0 ? (long long)st.st_size : -1LL, (unsigned long long)read, (unsigned long long)twice);
    }
    fclose(f);
    _exit(0);
}

// What one resume of `world` ranks did: each rank's exit status and report lines.
struct ResumeRun {
    std::vector<int> status;  // the exit status, or 128 + the signal
    std::vector<std::vector<std::string>> report;
    std::string log;  // rank 0's
};
ResumeRun run_resume(const std::string& dir, int world) {
    const std::string prefix = dir + "/../resume_report_";
    for (int r = 0; r < world; r++) unlink((prefix + std::to_string(r)).c_str());
    const RankProcesses ranks = fork_ranks(world, [&](int fd, int r) {
        if (freopen((prefix + std::to_string(r) + ".err").c_str(), "w", stderr) == nullptr) _exit(4);
        resume_rank_process(fd, r, world, dir, prefix + std::to_string(r));
    });
    const std::vector<int>& fds = ranks.fds;
    const std::vector<pid_t>& pids = ranks.pids;
    // the hub: a round takes one value from each rank and gives every rank all of them; once a rank's socket closes,
    // the job is over: a rank that ended with an error ends the others, as the heartbeats do
    ResumeRun run;
    run.status.assign(world, -1);
    for (bool alive = true; alive;) {
        std::vector<uint64_t> all(world);
        for (int r = 0; r < world && alive; r++) alive = read_all(fds[r], &all[r], sizeof(uint64_t));
        for (int r = 0; r < world && alive; r++) alive = write_all(fds[r], all.data(), all.size() * sizeof(uint64_t));
    }
    for (int r = 0; r < world; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        run.status[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (run.status[r] != 0)
            for (pid_t p : pids) kill(p, SIGKILL);
        close(fds[r]);
    }
    for (int r = 0; r < world; r++) {
        std::vector<std::string> lines;
        if (FILE* f = fopen((prefix + std::to_string(r)).c_str(), "r")) {
            char line[512];
            while (fgets(line, sizeof(line), f)) lines.push_back(line);
            fclose(f);
        }
        run.report.push_back(lines);
    }
    if (FILE* f = fopen((prefix + "0.log").c_str(), "r")) {
        char buffer[4096];
        size_t n;
        while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) run.log.append(buffer, n);
        fclose(f);
    }
    return run;
}

// "" when every rank loaded `step` with its values, read no byte of any file twice and read whole each file it
// verifies (own_checkpoint_files); otherwise what differs. `bytes` adds up what the ranks read.
std::string resume_problem(const ResumeRun& run, int world, int step, const std::string& dir, uint64_t* bytes) {
    CheckpointManifest m;
    read_manifest(dir, step, &m);
    for (int r = 0; r < world; r++) {
        if (run.status[r] != 0 || run.report[r].empty()) return "rank " + std::to_string(r) + " exited " + std::to_string(run.status[r]);
        int loaded = -1, values = 0;
        sscanf(run.report[r][0].c_str(), "%d %d", &loaded, &values);
        if (loaded != step || values != 1) return "rank " + std::to_string(r) + " loaded step " + std::to_string(loaded) + (values ? "" : " with wrong values");
        std::map<std::string, std::pair<unsigned long long, unsigned long long>> reads;  // name -> read, twice
        for (size_t i = 1; i < run.report[r].size(); i++) {
            char name[256];
            long long size;
            unsigned long long read, twice;
            if (sscanf(run.report[r][i].c_str(), "%255s %lld %llu %llu", name, &size, &read, &twice) != 4) continue;
            reads[name] = {read, twice};
            *bytes += read;
            if (twice != 0) return "rank " + std::to_string(r) + " read " + std::to_string(twice) + " bytes of " + name + " twice";
        }
        for (const FileRecord& f : own_checkpoint_files(m, r, world))
            if (reads[f.name].first != f.bytes)
                return "rank " + std::to_string(r) + " read " + std::to_string(reads[f.name].first) + " of the " + std::to_string(f.bytes) + " bytes of " + f.name + ", which it verifies";
    }
    return "";
}

// Flips one byte in the middle of a file (after its header: its header CRC still the manifest's).
void flip_middle_byte(const std::string& path) {
    struct stat st;
    stat(path.c_str(), &st);
    FILE* f = fopen(path.c_str(), "r+b");
    fseek(f, st.st_size / 2, SEEK_SET);
    const int c = fgetc(f);
    fseek(f, st.st_size / 2, SEEK_SET);
    fputc(c ^ 0x01, f);
    fclose(f);
}

void test_resume_reads(const std::string& dir) {
    for (int world : {1, 3}) {
        const std::string ranks = std::to_string(world) + " rank(s)";
        // a whole checkpoint: every rank loads it, each file read once, each verified file read whole
        clear_dir(dir);
        run_save(dir, world, 10, 2, -1, 0);
        run_save(dir, world, 20, 2, -1, 0);
        uint64_t bytes = 0, file_bytes = 0;
        ResumeRun run = run_resume(dir, world);
        std::string problem = resume_problem(run, world, 20, dir, &bytes);
        CheckpointManifest m;
        read_manifest(dir, 20, &m);
        for (const FileRecord& f : m.files) file_bytes += f.bytes;
        check(problem.empty(), "resume (" + ranks + "): each rank loads checkpoint 20, reading no byte twice; each file verified whole by its one rank",
              fmt("%.0f bytes read by the ranks, the checkpoint's files hold %.0f", (double)bytes, (double)file_bytes) + (problem.empty() ? "" : "; " + problem));
        // a byte flipped in the middle of a file passes the cheap checks; the load's CRC finds it, and checkpoint 10 is loaded
        for (const std::string& name : {std::string("model_00000020.bin"), state_path("", 20, world - 1).substr(1)}) {
            clear_dir(dir);
            run_save(dir, world, 10, 2, -1, 0);
            run_save(dir, world, 20, 2, -1, 0);
            flip_middle_byte(dir + "/" + name);
            bytes = 0;
            run = run_resume(dir, world);
            problem = resume_problem(run, world, 10, dir, &bytes);
            const int finder = name[0] == 'm' ? 0 : world - 1;
            const bool named = run.log.find("set checkpoint 20 aside as *.damaged: the load found damaged: " + name + " (rank " + std::to_string(finder) + ")") != std::string::npos;
            check(problem.empty() && named && access((manifest_path(dir, 20) + ".damaged").c_str(), F_OK) == 0,
                  "resume (" + ranks + "): " + name + " damaged in its middle: rank " + std::to_string(finder) + "'s load finds it by its CRC, checkpoint 20 is set aside and named, every rank loads 10, each byte read once",
                  problem + run.log);
        }
        // a state file of another attempt at the same step (its own CRC, the same size): the cheap check refuses it
        clear_dir(dir);
        run_save(dir, world, 10, 2, -1, 0);
        run_save(dir, world, 20, 2, -1, 0);
        const ParameterLayout layout(tiny_config(), 8 * world);
        const std::vector<float> other(layout.total / world, 99.0f);
        StateHeader h{20, 1, world, 1, 1, 0, 0, 0, 1, 1, 0, 1.0f, 0, (long long)other.size(), kRun + 1};
        write_state_file(state_path(dir, 20, 0), h, StageModel::whole(tiny_config()), other, other, other, DataLoaderState{});
        bytes = 0;
        run = run_resume(dir, world);
        problem = resume_problem(run, world, 10, dir, &bytes);
        check(problem.empty() && run.log.find("set checkpoint 20 aside as *.damaged: " + state_path(dir, 20, 0) + ": CRC-32C") != std::string::npos &&
                  run.log.find("the load found") == std::string::npos,
              "resume (" + ranks + "): a state file of another run at the same step fails the cheap check (its header's CRC-32C); 10 is loaded", problem + run.log);
        // the only checkpoint damaged: every rank stops
        clear_dir(dir);
        run_save(dir, world, 10, 2, -1, 0);
        flip_middle_byte(checkpoint_path(dir, "model", 10));
        run = run_resume(dir, world);
        bool all_stopped = true;
        for (int r = 0; r < world; r++) all_stopped = all_stopped && run.status[r] != 0;
        check(all_stopped && access((manifest_path(dir, 10) + ".damaged").c_str(), F_OK) == 0,
              "resume (" + ranks + "): the only checkpoint damaged: set aside, and every rank stops", run.log);
    }
}

}  // namespace

int main() {
    check_suite("checkpoint_crash");
    signal(SIGPIPE, SIG_IGN);  // a write to a killed rank's socket fails instead
    const std::string dir = "build/test_work/checkpoint_crash/run", counts = "build/test_work/checkpoint_crash/count_";
    make_directories(dir);
    const auto start = std::chrono::steady_clock::now();
    test_resume_reads(dir);
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
