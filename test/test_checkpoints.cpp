// Checkpoints as committed units (model/checkpoint_store.h), without a GPU: file names; the manifest's text, its
// checksum and every way it can be incomplete; --resume's choice (the newest committed checkpoint whose files match
// its manifest; damaged ones set aside as *.damaged, never deleted); a file of another run or attempt, or of another
// precision, at the same step refused although its own checksum is right; retention that never deletes the newest
// whole checkpoint nor counts a damaged one; each file verified by exactly one rank; a folder's lock; moving a run
// aside; the CRC-32C and the atomic writes that the files rest on (a failed write, a full disk).
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../model/checkpoint_store.h"
#include "../model/model_file.h"
#include "../model/state_file.h"
#include "../kernels/host_device.h"  // splitmix64
#include "check.h"
#include "private_mount.h"  // defines: mount_private

namespace {

std::string read_text(const std::string& path) {
    std::string text;
    if (FILE* f = fopen(path.c_str(), "rb")) {
        char buffer[4096];
        size_t n;
        while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
        fclose(f);
    }
    return text;
}
void flip_byte(const std::string& path, long offset) {
    FILE* f = fopen(path.c_str(), "r+b");
    fseek(f, offset, SEEK_SET);
    const int c = fgetc(f);
    fseek(f, offset, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}
std::string fresh_dir(const std::string& name) {
    const std::string dir = "build/test_work/checkpoints/" + name;
    make_directories(dir);
    for (const std::string& entry : directory_entries(dir)) {
        const std::string path = dir + "/" + entry;
        struct stat st;
        if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
            for (const std::string& inner : directory_entries(path)) unlink((path + "/" + inner).c_str());
            rmdir(path.c_str());
        } else {
            unlink(path.c_str());
        }
    }
    return dir;
}
std::string listing(const std::string& dir) {
    std::string text;
    for (const std::string& n : directory_entries(dir)) text += n + " ";
    return text;
}

// A small model whose files are real: a 2-layer GPT of 64 channels.
ModelConfig small_config() {
    ModelConfig config;
    config.num_layers = 2;
    config.num_heads = 1;
    config.channels = 64;
    config.max_seq_len = 32;
    return config;
}

// Commits checkpoint `step` of run `run_id` as `ranks` ranks at ZeRO stage 1 would (the state files, the model file,
// the manifest last), in one process; precision 1 = bf16, 0 = fp32. The values depend on the step and the run.
CheckpointManifest commit(const std::string& dir, int step, uint64_t run_id, int ranks, int precision = 1) {
    const ModelConfig config = small_config();
    const ParameterLayout layout(config, 8 * ranks);
    const float value = (float)step + (float)(run_id % 7) * 0.125f;
    std::vector<float> values(layout.total, value), shard(layout.total / ranks, value * 0.5f);
    DataLoaderState data_state{};
    CheckpointManifest m;
    m.run_id = run_id;
    m.step = step;
    m.precision = precision == 1 ? "bf16" : "fp32";
    m.data_parallel = ranks;
    m.zero_stage = 1;
    m.settings = {{"steps", "100"}, {"lr", "0.0006"}};
    m.files.push_back(write_model_file(checkpoint_path(dir, "model", step), layout, values, precision == 1, run_id, step));
    for (int rank = 0; rank < ranks; rank++) {
        StateHeader h{step, precision, ranks, 1, 1, rank, 0, 0, 1, precision == 1, 0, 1.0f, 0, (long long)shard.size(), run_id};
        m.files.push_back(write_state_file(state_path(dir, step, rank), h, StageModel::whole(config), precision == 1 ? shard : std::vector<float>(),
                                           shard, shard, data_state));
    }
    const std::string text = manifest_text(m);
    write_file_atomically(manifest_path(dir, step), {{text.data(), text.size()}});
    return m;
}

FILE* null_out() { return fopen("/dev/null", "w"); }

void test_names() {
    check(checkpoint_file_step("model_00000120.bin") == 120 && checkpoint_file_step("state_00000120_00003.bin") == 120 &&
              checkpoint_file_step("manifest_00000120.txt") == 120 && checkpoint_file_step("model_00000120.bin.tmp") == 120 &&
              checkpoint_file_step("manifest_00000120.txt.tmp") == 120,
          "names: the model, state and manifest files (and their temporary names) carry their step", "");
    check(checkpoint_file_step("model_00000120.bin.damaged") == -1 && checkpoint_file_step("state_00000120_00003.bin.damaged") == -1 &&
              checkpoint_file_step("model_0000012.bin") == -1 && checkpoint_file_step("log.txt") == -1 &&
              checkpoint_file_step("state_00000120_0003.bin") == -1 && checkpoint_file_step("manifest_00000120.bin") == -1,
          "names: files set aside (*.damaged) and other names are no checkpoint's", "");
}

void test_manifest_text() {
    CheckpointManifest m;
    m.run_id = 0x0123456789abcdefull;
    m.step = 250;
    m.precision = "bf16";
    m.data_parallel = 4;
    m.tensor_parallel = 2;
    m.pipeline_parallel = 3;
    m.zero_stage = 2;
    m.settings = {{"lr", "0.0006"}, {"train_shards", "2 shards 1a2b3c4d (data/x_*.bin)"}};
    m.files = {{"model_00000250.bin", 123456, 0xdeadbeef}, {"state_00000250_00000.bin", 789, 0x00000001}};
    const std::string text = manifest_text(m);
    CheckpointManifest back;
    const std::string problem = parse_manifest(text, &back);
    check(problem.empty() && back.run_id == m.run_id && back.step == 250 && back.precision == "bf16" && back.data_parallel == 4 &&
              back.tensor_parallel == 2 && back.pipeline_parallel == 3 && back.zero_stage == 2 && back.settings == m.settings && back.files == m.files,
          "manifest: its text parses back to the same run, step, precision, mesh, settings (spaces kept) and files", problem + "\n" + text);
    // every proper prefix (a manifest cut short by a crash that no rename protected) is refused
    int refused = 0;
    for (size_t n = 0; n < text.size(); n++) {
        CheckpointManifest cut;
        refused += !parse_manifest(text.substr(0, n), &cut).empty();
    }
    check(refused == (int)text.size(), "manifest: every one of its proper prefixes is refused", fmt("%.0f of %.0f refused", refused, (double)text.size()));
    std::string changed = text;
    changed[changed.find("123456")] = '9';
    CheckpointManifest damaged;
    const std::string why = parse_manifest(changed, &damaged);
    check(why.find("damaged") != std::string::npos, "manifest: a changed digit fails its closing checksum", why);
    std::string unknown = text.substr(0, text.find("end ")) + "extra line\n";
    Crc32c crc;
    crc.update(unknown.data(), unknown.size());
    char end[32];
    snprintf(end, sizeof(end), "end %08x\n", crc.value());
    CheckpointManifest odd;
    check(parse_manifest(unknown + end, &odd).find("unknown line") == 0, "manifest: an unknown line is refused even under a right checksum", "");
}

// --resume 1 on one rank as train_gpt runs it, without the GPU: rank 0's choice (the cheap checks), then the load (the
// model file and the optimizer state, resharded from the checkpoint's ranks onto this one), which verifies every file
// as it reads it, and the agreement (with itself): a damaged checkpoint is set aside and the one before loaded.
// Returns the step loaded.
int resume_on_one_rank(const std::string& dir, FILE* out) {
    const ResumeChoice choice = choose_resume_checkpoint(dir, out);
    const ParameterLayout layout(small_config(), 8);
    auto load = [&](const CheckpointManifest& m, CheckpointReads& reads) {
        read_model_part(checkpoint_path(dir, "model", m.step), layout, 0, &reads);
        read_optimizer_state(dir, m.step, layout, 0, &reads);
    };
    auto all_gather = [](const std::vector<uint64_t>& mine) { return mine; };
    auto choose_again = [&](int damaged) { return choose_after_damage(dir, damaged, out).manifest; };
    return load_agreed_checkpoint(dir, choice.manifest, 0, 1, load, all_gather, choose_again, out).step;
}

// The scenario of a damaged newest checkpoint: checkpoints 100, 200, 300 and a state file of 300 damaged after its
// header. The cheap checks pass it (its header is whole); the load's checksum finds it, sets 300 aside (never deleted)
// and loads 200; a save of 250 with --keep-checkpoints 1 then deletes 100 and 200 and keeps 250; the next resume
// takes 250.
void test_damaged_newest_and_retention() {
    const std::string dir = fresh_dir("retention");
    const uint64_t run = 0x1111;
    for (int step : {100, 200, 300}) commit(dir, step, run, 2);
    flip_byte(state_path(dir, 300, 1), 1024 + 40);
    FILE* out = fopen((dir + "/../retention.log").c_str(), "w");
    const int chosen = choose_resume_checkpoint(dir, out).step;
    const int loaded = resume_on_one_rank(dir, out);
    fclose(out);
    const std::string said = read_text(dir + "/../retention.log");
    struct stat st;
    check(chosen == 300 && loaded == 200 && stat((state_path(dir, 300, 1) + ".damaged").c_str(), &st) == 0 &&
              stat((manifest_path(dir, 300) + ".damaged").c_str(), &st) == 0 && committed_checkpoints(dir) == std::vector<int>({100, 200}) &&
              said.find("set checkpoint 300 aside as *.damaged: the load found damaged: state_00000300_00001.bin (rank 0)") != std::string::npos,
          "resume: a state file of the newest checkpoint damaged after its header passes the cheap checks; the load's checksum finds it, "
          "sets the checkpoint aside, names it and loads the one before", said + listing(dir));
    commit(dir, 250, run, 2);
    FILE* quiet = null_out();
    const std::vector<int> deleted = prune_checkpoints(dir, 250, run, 1, 0, quiet);
    fclose(quiet);
    quiet = null_out();
    const int next = resume_on_one_rank(dir, quiet);
    fclose(quiet);
    const std::string left = listing(dir);
    check(deleted == std::vector<int>({100, 200}) && committed_checkpoints(dir) == std::vector<int>({250}) && next == 250 &&
              left.find("state_00000300_00001.bin.damaged") != std::string::npos && left.find("model_00000100") == std::string::npos &&
              left.find("state_00000200") == std::string::npos,
          "retention: K = 1 after the resume deletes 100 and 200, keeps the new 250 and the damaged 300's files; the next resume takes 250", left);
}

// Retention never counts a checkpoint whose files do not match its manifest, nor deletes the one just written.
void test_retention_rules() {
    const std::vector<int> steps = {3, 6, 9, 12, 15, 18};
    check(checkpoints_to_delete(steps, 2, 0) == std::vector<int>({3, 6, 9, 12}), "retention: keep the newest 2", "");
    check(checkpoints_to_delete(steps, 2, 6) == std::vector<int>({3, 9}), "retention: newest 2 (15, 18) and milestones (6, 12) kept", "");
    check(checkpoints_to_delete(steps, 1, 0) == std::vector<int>({3, 6, 9, 12, 15}), "retention: K = 1 keeps only the newest", "");
    check(checkpoints_to_delete(steps, 10, 0).empty() && checkpoints_to_delete({}, 1, 0).empty(), "retention: fewer than K: nothing deleted", "");

    const std::string dir = fresh_dir("retention_rules");
    const uint64_t run = 0x2222;
    for (int step : {10, 20, 30}) commit(dir, step, run, 1);
    unlink(state_path(dir, 20, 0).c_str());  // 20 lost a file: not whole
    FILE* quiet = null_out();
    commit(dir, 40, run, 1);
    std::vector<int> deleted = prune_checkpoints(dir, 40, run, 2, 0, quiet);
    struct stat st;
    check(deleted == std::vector<int>({10}) && committed_checkpoints(dir) == std::vector<int>({30, 40}) &&
              stat((manifest_path(dir, 20) + ".damaged").c_str(), &st) == 0,
          "retention: K = 2 keeps 30 and 40 (20 lost a file: set aside, not counted), deletes 10", listing(dir));
    // files no manifest names (a save that did not commit, a deletion cut short) go at the next prune
    commit(dir, 35, run, 1);
    unlink(manifest_path(dir, 35).c_str());  // a save that did not commit
    FILE* f = fopen((checkpoint_path(dir, "model", 45) + ".tmp").c_str(), "wb");
    fclose(f);
    f = fopen(checkpoint_path(dir, "model", 46).c_str(), "wb");  // not this run's (no run id): never deleted
    fclose(f);
    unlink(manifest_path(dir, 30).c_str());  // a deletion interrupted after its manifest went
    commit(dir, 50, run, 1);
    deleted = prune_checkpoints(dir, 50, run, 2, 0, quiet);
    fclose(quiet);
    const std::string left = listing(dir);
    check(committed_checkpoints(dir) == std::vector<int>({40, 50}) && left.find("state_00000035") == std::string::npos &&
              left.find("model_00000045") == std::string::npos && left.find("model_00000030") == std::string::npos &&
              left.find("model_00000046.bin") != std::string::npos,
          "retention: this run's files that no manifest names (uncommitted saves, interrupted deletions) and temporary files are removed, "
          "other files kept", left);
    // K = 0: everything kept
    quiet = null_out();
    commit(dir, 60, run, 1);
    deleted = prune_checkpoints(dir, 60, run, 0, 0, quiet);
    fclose(quiet);
    check(deleted.empty() && committed_checkpoints(dir) == std::vector<int>({40, 50, 60}), "retention: K = 0 keeps every checkpoint", listing(dir));
}

// A state file rewritten by another run (or another attempt of this one) at the same step, or written in another
// precision, carries a right checksum of its own; the manifest's checksum refuses it.
void test_mixed_files_refused() {
    const std::string dir = fresh_dir("mixed"), other = fresh_dir("mixed_other");
    const uint64_t run = 0x3333, intruder = 0x4444;
    commit(dir, 10, run, 2);
    commit(dir, 20, run, 2);
    commit(other, 20, intruder, 2);
    rename(state_path(other, 20, 1).c_str(), state_path(dir, 20, 1).c_str());
    check(check_file_checksum(state_path(dir, 20, 1)).status == FileChecksum::kValid, "mixed files: the other run's state file is whole by its own checksum", "");
    FILE* quiet = null_out();
    ResumeChoice choice = choose_resume_checkpoint(dir, quiet);
    fclose(quiet);
    check(choice.step == 10, "mixed files: another run's state file at the same step is refused against the manifest; the checkpoint before is taken",
          listing(dir));
    // bf16 beside fp32: the same step written again in fp32 by rank 1 (the sizes differ too; a file of the same size
    // would fail the checksum as above)
    const std::string prec = fresh_dir("mixed_precision"), fp32 = fresh_dir("mixed_precision_fp32");
    commit(prec, 10, run, 2, 1);
    commit(fp32, 10, run, 2, 0);
    rename(state_path(fp32, 10, 1).c_str(), state_path(prec, 10, 1).c_str());
    CheckpointManifest m;
    read_manifest(prec, 10, &m);
    const std::string problem = manifest_files_problem(prec, m);
    check(problem.find(state_path(prec, 10, 1)) == 0 && problem.find("the manifest says") != std::string::npos,
          "mixed files: a state file written in fp32 beside bf16 ones is refused", problem);
}

// Each rank verifies its own files: every file of the checkpoint by exactly one rank, for any world size (also
// fewer or more ranks than wrote it), the model file by rank 0.
void test_own_files() {
    CheckpointManifest m;
    m.files.push_back({"model_00000010.bin", 1, 0});
    for (int r = 0; r < 6; r++) m.files.push_back({state_path("", 10, r).substr(1), 1, 0});
    bool every_once = true;
    for (int world = 1; world <= 8; world++) {
        std::map<std::string, int> seen;
        for (int rank = 0; rank < world; rank++)
            for (const FileRecord& f : own_checkpoint_files(m, rank, world)) seen[f.name]++;
        for (const FileRecord& f : m.files) every_once = every_once && seen[f.name] == 1;
        every_once = every_once && own_checkpoint_files(m, 0, world).front().name == "model_00000010.bin";
    }
    check(every_once, "resume: each file is verified by exactly one rank (worlds 1-8 over 6 writers), the model file by rank 0", "");
}

// A checkpoint without a manifest is none. Files of one run that never committed (killed in its first save): --resume
// starts that run again from scratch under its id. Files without a run id (an older train_gpt's checkpoints): --resume
// stops rather than start from scratch over them. A fresh run sees either as a folder that is not empty.
void test_uncommitted_folder() {
    const std::string dir = fresh_dir("uncommitted");
    commit(dir, 10, 0x5555, 1);
    unlink(manifest_path(dir, 10).c_str());
    FILE* quiet = null_out();
    const ResumeChoice adopted = choose_resume_checkpoint(dir, quiet);
    fclose(quiet);
    check(committed_checkpoints(dir).empty() && uncommitted_steps(dir) == std::vector<int>({10}) &&
              folder_checkpoints_text(dir).find("without a manifest") != std::string::npos && adopted.step == -1 && adopted.run_id == 0x5555,
          "folder: files without a manifest are no checkpoint; those of one run that never committed: --resume starts it again under its id",
          folder_checkpoints_text(dir));
    FILE* f = fopen(checkpoint_path(dir, "model", 5).c_str(), "wb");  // an older train_gpt's model file: no run id
    std::vector<int> header(256, 0);
    header[0] = kModelMagic;
    fwrite(header.data(), sizeof(int), 256, f);
    fclose(f);
    fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        if (freopen((dir + "/../uncommitted.err").c_str(), "w", stderr) == nullptr) _exit(3);
        FILE* out = null_out();
        choose_resume_checkpoint(dir, out);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    const std::string message = read_text(dir + "/../uncommitted.err");
    check(WIFEXITED(status) && WEXITSTATUS(status) == 1 && message.find("no committed checkpoint (model_00000005.bin: no run id") != std::string::npos,
          "folder: --resume over an older train_gpt's checkpoint files (no manifest, no run id) stops with one line", message);
    commit(dir, 20, 0x6666, 1);
    const std::string aside = move_run_aside(dir);
    check(directory_entries(dir).size() == 1 && directory_entries(aside).size() == 6,
          "folder: --overwrite-output moves every checkpoint file (committed or not) aside", listing(dir) + "| " + listing(aside));
}

// One job a folder: the lock, from another process, refused in one line naming the holder.
void test_folder_lock() {
    const std::string dir = fresh_dir("lock");
    int ready[2];
    if (pipe(ready) != 0) return fail("lock: pipe", "");
    fflush(stdout);
    const pid_t holder = fork();
    if (holder == 0) {
        lock_output_dir(dir);
        char c = 1;
        if (write(ready[1], &c, 1) != 1) _exit(3);
        pause();
        _exit(0);
    }
    char c;
    if (read(ready[0], &c, 1) != 1) return fail("lock: the holder did not start", "");
    const pid_t second = fork();
    if (second == 0) {
        if (freopen((dir + "/../lock.err").c_str(), "w", stderr) == nullptr) _exit(3);
        lock_output_dir(dir);
        _exit(0);
    }
    int status = 0;
    waitpid(second, &status, 0);
    const std::string message = read_text(dir + "/../lock.err");
    check(WIFEXITED(status) && WEXITSTATUS(status) == 1 && message.find("is in use by another train_gpt job (pid " + std::to_string(holder)) != std::string::npos,
          "lock: a second job with the same --output-dir is refused in one line naming the first", message);
    kill(holder, SIGKILL);
    waitpid(holder, &status, 0);
    const pid_t third = fork();
    if (third == 0) {
        lock_output_dir(dir);
        _exit(0);
    }
    waitpid(third, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "lock: released when its job ends, however it ends (SIGKILL)", "");
    close(ready[0]);
    close(ready[1]);
}

void test_verify_folder() {
    const std::string dir = fresh_dir("verify");
    commit(dir, 5, 0x7777, 2);
    commit(dir, 10, 0x7777, 2);
    FILE* out = fopen((dir + "/../verify.log").c_str(), "w");
    int status = verify_checkpoint_folder(dir, out);
    fclose(out);
    std::string text = read_text(dir + "/../verify.log");
    check(status == 0 && text.find("step 10: whole: run 0000000000007777, 3 files match the manifest\n") == 0,
          "verify: --verify-checkpoints lists each checkpoint, exit 0 when the newest is whole", text);
    flip_byte(checkpoint_path(dir, "model", 10), 3000);
    out = fopen((dir + "/../verify.log").c_str(), "w");
    status = verify_checkpoint_folder(dir, out);
    fclose(out);
    text = read_text(dir + "/../verify.log");
    check(status == 1 && text.find("step 10: damaged: " + checkpoint_path(dir, "model", 10) + ": checksum mismatch") == 0 &&
              text.find("step 5: whole") != std::string::npos && committed_checkpoints(dir).size() == 2,
          "verify: a flipped byte in the model file is named, exit 1; nothing is changed", text);
}

// The files' own integrity: CRC-32C's known answer on both paths; the model file keeps llm.c's header, carrying the
// run id and step; a failed write stops with one line and leaves the old file; a full disk likewise.
void test_file_integrity() {
    const char* nine = "123456789";
    Crc32c hardware, table(false);
    hardware.update(nine, 9);
    table.update(nine, 9);
    char crc_text[32];
    snprintf(crc_text, sizeof(crc_text), "%08x / %08x", hardware.value(), table.value());
    check(hardware.value() == 0xE3069283u && table.value() == 0xE3069283u, "integrity: CRC-32C of \"123456789\" is E3069283 on both paths", crc_text);
    std::vector<uint8_t> bytes(1 << 20);
    uint64_t seed = 11;
    for (auto& b : bytes) b = (uint8_t)(splitmix64(seed++) >> 56);
    Crc32c whole(false), pieces;
    whole.update(bytes.data(), bytes.size());
    for (size_t at = 0, step = 1; at < bytes.size(); at += step, step = step * 3 + 1) pieces.update(&bytes[at], std::min(step, bytes.size() - at));
    check(whole.value() == pieces.value(), "integrity: CRC-32C fed in pieces of any length equals one pass", "");

    const std::string dir = fresh_dir("integrity");
    commit(dir, 10, 0x0123456789abcdefull, 1);
    int header[256];
    FILE* f = fopen(checkpoint_path(dir, "model", 10).c_str(), "rb");
    const bool header_read = fread(header, sizeof(int), 256, f) == 256;
    fclose(f);
    check(check_file_checksum(checkpoint_path(dir, "model", 10)).status == FileChecksum::kValid && header_read && header[0] == kModelMagic &&
              header[kChecksumTagSlot] == kChecksumTag && header[kRunIdentitySlot + 1] == (int)0x89abcdef &&
              header[kRunIdentitySlot + 2] == 0x01234567 && header[kRunIdentitySlot + 3] == 10 &&
              std::all_of(header + 8, header + kRunIdentitySlot, [](int x) { return x == 0; }),
          "integrity: the model file keeps llm.c's header (ints 0-7), the run id and step in ints 240-243, its checksum in 254-255", "");
    FILE* g = fopen(state_path(dir, 10, 0).c_str(), "rb");
    StateHeader h = read_state_header(g, state_path(dir, 10, 0));
    fclose(g);
    check(h.run_id == 0x0123456789abcdefull && h.step == 10, "integrity: the state file carries the run id and step", "");

    const std::string plain = dir + "/plain.bin";
    std::vector<int> plain_header(256, 0);
    plain_header[0] = kModelMagic;
    f = fopen(plain.c_str(), "wb");
    fwrite(plain_header.data(), sizeof(int), 256, f);
    fclose(f);
    check(check_file_checksum(plain).status == FileChecksum::kNone, "integrity: a file without the checksum's tag is not verified", "");

    const ParameterLayout layout(small_config(), 8);
    const std::string target = checkpoint_path(dir, "model", 10), before = read_text(target), err = dir + "/../write.err";
    fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit limit = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &limit);
        if (freopen(err.c_str(), "w", stderr) == nullptr) _exit(3);
        write_model_file(target, layout, std::vector<float>(layout.total, 1.0f), false);
        _exit(0);
    }
    int wstatus = 0;
    waitpid(child, &wstatus, 0);
    const std::string message = read_text(err);
    struct stat st;
    check(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 1 && message.find("error: " + target + ": cannot write: File too large") == 0 &&
              std::count(message.begin(), message.end(), '\n') == 1 && stat((target + ".tmp").c_str(), &st) != 0 && read_text(target) == before,
          "integrity: a failed write stops with one line naming the file, removes the temporary file, leaves the old one as it was", message);

    // a full disk: a tmpfs with room for the old file but not a second copy, mounted by a child in its own user and
    // mount namespaces where the system allows one; the child's own child writes (and dies of the error)
    const std::string full = dir + "/full", full_target = full + "/model_00000010.bin", full_err = dir + "/../full.err";
    mkdir(full.c_str(), 0755);
    fflush(stdout);
    const pid_t owner = fork();
    if (owner == 0) {
        if (freopen(err.c_str(), "w", stderr) == nullptr) _exit(3);
        const std::string why = mount_private(full, "tmpfs", "size=" + std::to_string(before.size() * 3 / 2));
        if (!why.empty()) {
            fprintf(stderr, "%s", why.c_str());
            fflush(stderr);
            _exit(4);
        }
        FILE* copy = fopen(full_target.c_str(), "wb");
        if (copy == nullptr || fwrite(before.data(), 1, before.size(), copy) != before.size() || fclose(copy) != 0) _exit(5);
        fflush(stderr);
        const pid_t writer = fork();
        if (writer == 0) {
            if (freopen(full_err.c_str(), "w", stderr) == nullptr) _exit(3);
            write_model_file(full_target, layout, std::vector<float>(layout.total, 1.0f), true);
            _exit(0);
        }
        int writer_status = 0;
        waitpid(writer, &writer_status, 0);
        struct stat tmp_st;
        fprintf(stderr, "exit %d, temporary file %s, old file %s", WIFEXITED(writer_status) ? WEXITSTATUS(writer_status) : -1,
                stat((full_target + ".tmp").c_str(), &tmp_st) == 0 ? "left" : "removed", read_text(full_target) == before ? "kept" : "changed");
        fflush(stderr);
        _exit(0);
    }
    waitpid(owner, &wstatus, 0);
    const std::string full_report = read_text(err), full_message = read_text(full_err);
    if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 4)
        skip("integrity: a full disk", full_report);
    else
        check(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0 && full_report == "exit 1, temporary file removed, old file kept" &&
                  full_message.find("error: " + full_target + ": cannot write: No space left on device") == 0 &&
                  std::count(full_message.begin(), full_message.end(), '\n') == 1,
              "integrity: a full disk (a tmpfs) at a save: one line naming the file, the temporary file removed, the old one as it was",
              full_report + "; " + full_message);
}

// The model file written in place by every rank's share (ModelFilePart, a unit at a time) and sealed by rank 0 is
// bitwise the file written whole from the assembled model, for one rank and for tensor parallel 2 x pipeline 2
// (replicated tensors and the tied embedding written once), fp32 and bf16.
void test_streamed_model_file() {
    const std::string dir = fresh_dir("streamed");
    ModelConfig config = small_config();
    config.num_layers = 4;
    config.num_heads = 4;
    config.vocab_size = 1000;
    config.padded_vocab_size = 1024;
    const ParameterLayout whole(config, 16);
    std::vector<float> values(whole.total, 0.0f);
    uint64_t seed = 5;
    whole.for_each_file_run([&](size_t, size_t offset, size_t n) {
        for (size_t i = offset; i < offset + n; i++) values[i] = (float)((int64_t)(splitmix64(seed++) >> 44) - (1 << 19)) * 1e-6f;
    });
    for (bool bf16 : {false, true}) {
        const std::string reference = dir + "/reference.bin", streamed = checkpoint_path(dir, "model", bf16 ? 2 : 1);
        write_model_file(reference, whole, values, bf16, 0xabcdef, bf16 ? 2 : 1);
        for (int tp : {1, 2}) {
            const int pp = tp;  // one rank, or tp 2 x pp 2
            for (int stage = 0; stage < pp; stage++) {
                StageModel part;
                part.first = stage == 0;
                part.last = stage == pp - 1;
                for (int l = stage * config.num_layers / pp; l < (stage + 1) * config.num_layers / pp; l++) part.layers.push_back(l);
                const ParameterLayout layout(config, 8, tp, part);
                for (int rank = 0; rank < tp; rank++) {
                    std::vector<float> local(layout.total, 0.0f);
                    layout.for_each_full_run(whole, rank, [&](size_t from, size_t to, size_t n) { std::copy(&values[from], &values[from] + n, &local[to]); });
                    ModelFilePart writer(streamed + ".tmp", layout, rank, bf16);
                    for (int u = layout.num_units() - 1; u >= 0; u--)  // any order of units
                        writer.write(layout.unit_offset(u), &local[layout.unit_offset(u)], layout.unit_size(u));
                    writer.finish();
                }
            }
            const FileRecord record = seal_model_file(streamed, config, bf16, 0xabcdef, bf16 ? 2 : 1);
            check(read_text(streamed) == read_text(reference) && record.bytes == read_text(reference).size(),
                  std::string("streamed model file: ") + (tp == 1 ? "one rank" : "tensor parallel 2 x pipeline 2") + (bf16 ? ", bf16" : ", fp32") +
                      ": written in place unit by unit, bitwise the file written whole", "");
            unlink(streamed.c_str());
        }
    }
}

void test_setting_differences() {
    CheckpointManifest saved;
    saved.settings = {{"steps", "100"}, {"lr", "0.0006"}, {"train_shards", "2 shards 0000abcd (x)"}};
    const auto d = setting_differences(saved, {{"steps", "200"}, {"lr", "0.0006"}, {"train_shards", "3 shards 0000ef01 (x)"}, {"seed", "1"}});
    check(d.size() == 3 && d.at("steps") == "steps 100 -> 200" && d.count("train_shards") == 1 && d.at("seed") == "seed (not recorded) -> 1",
          "settings: the differences from a checkpoint's recorded settings, each named", "");
}

}  // namespace

int main() {
    check_suite("checkpoints");
    test_names();
    test_manifest_text();
    test_damaged_newest_and_retention();
    test_retention_rules();
    test_mixed_files_refused();
    test_own_files();
    test_uncommitted_folder();
    test_folder_lock();
    test_verify_folder();
    test_file_integrity();
    test_setting_differences();
    test_streamed_model_file();
    return check_failures() == 0 ? 0 : 1;
}
