// File formats and schedules, without a GPU: the learning-rate schedule against the formulas of
// docs/formats.md and against the PyTorch reference's own (scripts/reference/gpt2_reference.py lr_at) when a Python is
// at hand; llm.c model files round-trip (fp32 exactly, bf16 rounded to nearest even) through the padded
// layouts of 1 and 3 ranks, and each tensor- and pipeline-parallel rank's part reads alone; checkpoint discovery
// finds the newest complete checkpoint; checkpoint retention deletes what --keep-checkpoints and --keep-every no
// longer keep, whole checkpoints only; checkpoint integrity: checksums, damaged and missing files, failed writes (a file size limit, and a full tmpfs where
// the system lets the test mount one).
#define TESTING
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include "../train_gpt.cu"
#include "check.h"
#include "private_mount.h"  // defines: mount_private

static void test_schedule() {
    const float M = 6e-4f, f = 0.1f, F = M * f;
    const int W = 10, N = 110;
    bool ok = true;
    for (int s = 0; s < W; s++) ok = ok && fabsf(learning_rate(s, N, M, W, f, "cosine") - M * (s + 1) / W) <= 1e-12f;
    check(ok, "schedule: linear warm-up reaches the maximum at step W-1", "");
    check(fabsf(learning_rate(W, N, M, W, f, "cosine") - M) <= 1e-10f && fabsf(learning_rate(N, N, M, W, f, "cosine") - F) <= 1e-10f,
          "schedule: cosine from the maximum to the final fraction", "");
    check(fabsf(learning_rate(W + 50, N, M, W, f, "cosine") - (F + 0.5f * (M - F))) <= 1e-9f, "schedule: cosine midpoint", "");
    check(fabsf(learning_rate(W + 25, N, M, W, f, "linear") - (M - (M - F) * 0.25f)) <= 1e-9f, "schedule: linear decay", "");
    check(learning_rate(W + 25, N, M, W, f, "constant") == M, "schedule: constant after warm-up", "");
    // the reference's implementation, for every step of a run (Debian's Python has torch, or the one on PATH)
    std::vector<double> ref;
    for (const char* python : {"/usr/bin/python3", "python3"}) {
        const std::string command = std::string(python) + " -c \"import sys; sys.path.insert(0, 'scripts/reference'); import gpt2_reference as r; "
                                    "print(' '.join(repr(r.lr_at(s, 6e-4, 10, 110, 'cosine', 0.1)) for s in range(110)))\" 2> /dev/null";
        FILE* p = popen(command.c_str(), "r");
        ref.clear();
        double x;
        while (p && fscanf(p, "%lf", &x) == 1) ref.push_back(x);
        if (p) pclose(p);
        if (ref.size() == 110) break;
    }
    if (ref.size() != 110) {
        skip("schedule: same as the PyTorch reference's", "no Python with torch to import scripts/reference/gpt2_reference.py");
        return;
    }
    double worst = 0.0;
    for (int s = 0; s < 110; s++) worst = std::max(worst, fabs(learning_rate(s, N, M, W, f, "cosine") - ref[s]) / M);
    check(worst <= 1e-6, "schedule: same as the PyTorch reference's at every step", fmt("max relative difference %.3g", worst));
}

// A test parameter value from a running hash state: 24 random bits, scaled to within +-0.84.
static float test_value(uint64_t& state) { return (float)((int64_t)(splitmix64(state++) >> 40) - (1 << 23)) * 1e-7f; }

static void test_model_files() {
    const std::string dir = "build/test_work/formats";
    make_directories(dir);
    ModelConfig config;
    config.num_layers = 3; config.num_heads = 1; config.channels = 64; config.max_seq_len = 40;
    for (int world : {1, 3}) {
        const ParameterLayout layout(config, 8 * world);
        std::vector<float> values(layout.total, 0.0f);
        uint64_t state = 5;
        layout.for_each_file_run([&](size_t, size_t device_offset, size_t count) {
            for (size_t i = 0; i < count; i++) values[device_offset + i] = test_value(state);
        });
        for (bool bf16 : {false, true}) {
            const std::string path = dir + "/model.bin", tag = std::string(bf16 ? "bf16" : "fp32") + " on " + std::to_string(world) + " rank(s)";
            write_model_file(path, layout, values, bf16);
            std::vector<float> back;
            const ModelConfig read = read_model_file(path, back, 8 * world);
            bool same = read.num_layers == config.num_layers && read.channels == config.channels && back.size() == values.size();
            for (size_t i = 0; same && i < values.size(); i++)
                same = back[i] == (bf16 ? bf16_bits_to_float(float_to_bf16_bits(values[i])) : values[i]);
            check(same, "model file round trip, " + tag, "");
            struct stat st;
            stat(path.c_str(), &st);
            check((size_t)st.st_size == 1024 + layout.count * (bf16 ? 2 : 4), "model file size is llm.c's, " + tag,
                  std::to_string(st.st_size) + " bytes");
        }
    }
    // a rank's part read alone (read_model_part): each tensor-parallel rank's slices of each pipeline stage,
    // in its own padding, equal to the whole model's values at those places
    ModelConfig split = config;  // 4 heads of 64: splits over 1, 2 and 4 tensor-parallel ranks
    split.num_layers = 4; split.num_heads = 4; split.channels = 256;
    const ParameterLayout whole(split);
    std::vector<float> values(whole.total, 0.0f);
    uint64_t state = 9;
    whole.for_each_file_run([&](size_t, size_t device_offset, size_t count) {
        for (size_t i = 0; i < count; i++) values[device_offset + i] = test_value(state);
    });
    for (bool bf16 : {false, true}) {
        const std::string path = dir + "/split.bin";
        write_model_file(path, whole, values, bf16);
        int parts = 0;
        bool same = true;
        for (int tp : {1, 2, 4})
            for (int pp : {1, 2, 4}) {
                std::vector<int> per_virtual_stage;
                if (!pipeline_layer_split(split.num_layers, pp, 1, "", &per_virtual_stage).empty()) die("internal: the test's split");
                for (int stage = 0; stage < pp; stage++) {
                    std::vector<int> chunks;
                    const ParameterLayout part(split, 8 * 3, tp, pipeline_stage_model(per_virtual_stage, pp, stage, &chunks));
                    for (int r = 0; r < tp; r++) {
                        std::vector<float> expected(part.total, 0.0f);
                        part.for_each_full_run(whole, r, [&](size_t from, size_t to, size_t n) {
                            for (size_t i = 0; i < n; i++)
                                expected[to + i] = bf16 ? bf16_bits_to_float(float_to_bf16_bits(values[from + i])) : values[from + i];
                        });
                        same = same && read_model_part(path, part, r) == expected;
                        parts++;
                    }
                }
            }
        check(same, std::string("model file, each rank's part read alone (") + (bf16 ? "bf16" : "fp32") + ")",
              std::to_string(parts) + " parts: tp 1, 2, 4 x pp 1, 2, 4");
    }
    // round to nearest even: 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7 and goes to 1
    check(bf16_bits_to_float(float_to_bf16_bits(1.0f + 1.0f / 256)) == 1.0f &&
          bf16_bits_to_float(float_to_bf16_bits(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256, "bf16 conversion rounds to nearest even", "");
}

static void test_checkpoint_discovery() {
    const std::string dir = "build/test_work/formats/checkpoints";
    make_directories(dir);
    for (const char* name : {"model_00000010.bin", "state_00000010_00000.bin", "model_00000020.bin", "state_00000030_00000.bin",
                             "model_00000040.bin.tmp", "notes.txt"}) {
        FILE* f = fopen((dir + "/" + name).c_str(), "wb");
        if (f) fclose(f);
    }
    // the model file is written last: step 30 (state only) and the temporary file are incomplete
    check(latest_checkpoint(dir) == 20, "checkpoint discovery: newest step with a model file", std::to_string(latest_checkpoint(dir)));
    check(latest_checkpoint(dir + "/missing") == -1, "checkpoint discovery: none in a missing folder", "");
}

// The end-of-run checksums fed a unit at a time equal the one-pass definition (chunks of 2^20 hashed alone, their
// hashes chained) for any cut into units, and each moves when an element it covers changes.
static void test_parameter_checksums() {
    ModelConfig config;
    config.num_layers = 3; config.num_heads = 2; config.channels = 128; config.max_seq_len = 64;
    const ParameterLayout layout(config, 8, 2);  // tensor parallel: the split mask covers the vocabulary rows and the split block tensors
    const LayoutMask split = layout.split_mask();
    std::vector<float> values(layout.total);
    uint64_t state = 7;
    for (float& v : values) v = test_value(state);
    auto one_pass = [&](const std::vector<float>& p, uint64_t* all, uint64_t* replicated, uint64_t* wte) {
        *all = *replicated = *wte = 0;
        const size_t chunk = ParameterChecksums::kChunk;
        for (size_t c = 0; c < (p.size() + chunk - 1) / chunk; c++) {
            uint64_t h = 0, r = 0;
            for (size_t i = c * chunk; i < std::min(p.size(), (c + 1) * chunk); i++) {
                uint32_t bits;
                memcpy(&bits, &p[i], 4);
                h = splitmix64(h ^ bits);
                if (!split.contains((long)i)) r = splitmix64(r ^ bits);
                if (i >= layout.wte && i < layout.wte_end()) *wte = splitmix64(*wte ^ bits);
            }
            *all = splitmix64(*all ^ h);
            *replicated = splitmix64(*replicated ^ r);
        }
    };
    auto streamed = [&](const std::vector<float>& p, const std::vector<size_t>& cuts) {  // cuts: the units' ends
        ParameterChecksums sums(split, layout.wte, layout.wte_end());
        size_t begin = 0;
        for (size_t end : cuts) {
            sums.feed(begin, p.data() + begin, end - begin);
            begin = end;
        }
        sums.finish();
        return sums;
    };
    uint64_t all, replicated, wte;
    one_pass(values, &all, &replicated, &wte);
    const size_t n = values.size(), chunk = ParameterChecksums::kChunk;
    std::vector<size_t> units;
    for (int u = 0; u < layout.num_units(); u++) units.push_back(layout.unit_offset(u) + layout.unit_size(u));
    const std::vector<std::vector<size_t>> cuts = {{n}, units, {7, chunk, chunk + 1, 3 * chunk + 5, n}, {chunk - 1, 2 * chunk, n}};
    bool same = true;
    for (const std::vector<size_t>& c : cuts) {
        const ParameterChecksums s = streamed(values, c);
        same = same && s.all == all && s.replicated == replicated && s.wte == wte;
    }
    check(n > 3 * chunk + 5 && same, "parameter checksums: fed a unit at a time, any cut (4 cuts, " + std::to_string(n) + " elements) equals one pass", "");
    const ParameterChecksums base = streamed(values, units);
    auto changed = [&](size_t i) {
        std::vector<float> p = values;
        p[i] = nextafterf(p[i], 1.0f);
        return streamed(p, units);
    };
    const size_t in_wte = layout.wte + 12345, in_qkvw = layout.tensor(1, QKVW) + 77, in_ln = layout.tensor(2, LN1W) + 3;
    const ParameterChecksums a = changed(in_wte), b = changed(in_qkvw), c = changed(in_ln);
    check(split.contains((long)in_wte) && split.contains((long)in_qkvw) && !split.contains((long)in_ln) && a.all != base.all &&
              a.replicated == base.replicated && a.wte != base.wte && b.all != base.all && b.replicated == base.replicated && b.wte == base.wte &&
              c.all != base.all && c.replicated != base.replicated && c.wte == base.wte,
          "parameter checksums: one element changed moves the checksums that cover it (all; replicated: not the split ones; wte: its range)", "");
}

// --keep-checkpoints / --keep-every: which checkpoints go, and that deleting leaves only whole checkpoints.
static void test_checkpoint_retention() {
    const std::vector<int> steps = {3, 6, 9, 12, 15, 18};
    check(checkpoints_to_delete(steps, 2, 0) == std::vector<int>({3, 6, 9, 12}), "retention: keep the newest 2", "");
    check(checkpoints_to_delete(steps, 2, 6) == std::vector<int>({3, 9}), "retention: newest 2 (15, 18) and milestones (6, 12) kept", "");
    check(checkpoints_to_delete(steps, 1, 0) == std::vector<int>({3, 6, 9, 12, 15}), "retention: K = 1 keeps only the newest", "");
    check(checkpoints_to_delete(steps, 10, 0).empty() && checkpoints_to_delete({}, 1, 0).empty(), "retention: fewer than K: nothing deleted", "");

    const std::string dir = "build/test_work/formats/retention";
    make_directories(dir);
    for (const std::string& name : directory_entries(dir)) unlink((dir + "/" + name).c_str());
    auto touch = [&](const std::string& name) {
        FILE* f = fopen((dir + "/" + name).c_str(), "wb");
        if (f) fclose(f);
    };
    for (int step : {3, 6, 9, 12}) {
        touch(checkpoint_path("", "model", step).substr(1));
        for (int rank = 0; rank < 2; rank++) touch(state_path("", step, rank).substr(1));
    }
    touch("state_00000001_00000.bin");      // an older incomplete checkpoint (interrupted deletion)
    touch("state_00000014_00000.bin.tmp");  // a checkpoint being written after the newest complete one
    touch("notes.txt");
    const std::vector<int> deleted = prune_checkpoints(dir, 2, 6);
    std::vector<std::string> left = directory_entries(dir);
    left.erase(std::remove_if(left.begin(), left.end(), [](const std::string& n) { return n == "." || n == ".."; }), left.end());
    std::sort(left.begin(), left.end());
    const std::vector<std::string> expected = {"model_00000006.bin", "model_00000009.bin", "model_00000012.bin", "notes.txt",
                                               "state_00000006_00000.bin", "state_00000006_00001.bin", "state_00000009_00000.bin",
                                               "state_00000009_00001.bin", "state_00000012_00000.bin", "state_00000012_00001.bin",
                                               "state_00000014_00000.bin.tmp"};
    std::string listing;
    for (const std::string& n : left) listing += n + " ";
    expect(deleted == std::vector<int>({3}) && left == expected,
          "retention: K = 2, M = 6 deletes step 3's model and state files and the older orphan, keeps 6 (milestone), 9, 12, the newer "
          "partial checkpoint and other files", listing);
    check(latest_checkpoint(dir) == 12 && prune_checkpoints(dir, 0, 0).empty() && latest_checkpoint(dir) == 12,
          "retention: K = 0 keeps everything", "");
}


// Checkpoint integrity (model/file_integrity.h, check_checkpoint): CRC-32C's known answer on both paths; a checkpoint
// of a model file and two state files is whole; a flipped byte, a truncation or a missing state file is named and
// the newest whole checkpoint is taken instead; files without a checksum load unverified; a write that fails (a
// file-size limit standing in for a full disk) stops with one line, leaves no temporary file and the old file as
// it was.
static std::string read_text(const std::string& path) {
    std::string text;
    if (FILE* f = fopen(path.c_str(), "rb")) {
        char buffer[4096];
        size_t n;
        while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
        fclose(f);
    }
    return text;
}
static void flip_byte(const std::string& path, long offset) {
    FILE* f = fopen(path.c_str(), "r+b");
    fseek(f, offset, SEEK_SET);
    const int c = fgetc(f);
    fseek(f, offset, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void test_checkpoint_integrity() {
    const char* nine = "123456789";
    Crc32c hardware, table(false);
    hardware.update(nine, 9);
    table.update(nine, 9);
    char crc_text[32];
    snprintf(crc_text, sizeof(crc_text), "%08x / %08x", hardware.value(), table.value());
    check(hardware.value() == 0xE3069283u && table.value() == 0xE3069283u, "integrity: CRC-32C of \"123456789\" is E3069283 on both paths",
          crc_text);
    std::vector<uint8_t> bytes(1 << 20);
    uint64_t seed = 11;
    for (auto& b : bytes) b = (uint8_t)(splitmix64(seed++) >> 56);
    Crc32c whole(false), pieces;
    whole.update(bytes.data(), bytes.size());
    for (size_t at = 0, step = 1; at < bytes.size(); at += step, step = step * 3 + 1) pieces.update(&bytes[at], std::min(step, bytes.size() - at));
    check(whole.value() == pieces.value(), "integrity: CRC-32C fed in pieces of any length equals one pass", "");

    const std::string dir = "build/test_work/formats/integrity";
    make_directories(dir);
    for (const std::string& name : directory_entries(dir)) unlink((dir + "/" + name).c_str());
    ModelConfig config;
    config.num_layers = 2; config.num_heads = 1; config.channels = 64; config.max_seq_len = 32;
    const ParameterLayout layout(config, 16);
    std::vector<float> values(layout.total, 0.25f), shard(layout.total / 2, 0.5f);
    DataLoaderState data_state{};
    auto write_checkpoint = [&](int step) {
        for (int rank = 0; rank < 2; rank++) {
            StateHeader h{step, 1, 2, 1, 1, rank, 0, 0, 1, 1, 0, 1.0f, 0, (long long)shard.size()};
            write_state_file(state_path(dir, step, rank), h, StageModel::whole(config), shard, shard, shard, data_state);
        }
        write_model_file(checkpoint_path(dir, "model", step), layout, values, true);
    };
    write_checkpoint(5);
    write_checkpoint(10);
    CheckpointCheck c = check_checkpoint(dir, 10);
    check(c.problem.empty() && c.files == 3 && c.unchecked == 0, "integrity: a fresh checkpoint (model file, 2 state files) is whole",
          c.problem + fmt(" (%.0f files", (double)c.files) + fmt(", %.0f unchecked)", (double)c.unchecked));
    const FileChecksum model_check = check_file_checksum(checkpoint_path(dir, "model", 10));
    int header[256];
    FILE* f = fopen(checkpoint_path(dir, "model", 10).c_str(), "rb");
    const bool header_read = fread(header, sizeof(int), 256, f) == 256;
    fclose(f);
    check(model_check.status == FileChecksum::kValid && header_read && header[0] == kModelMagic && header[kChecksumTagSlot] == kChecksumTag &&
              std::all_of(header + 8, header + kChecksumTagSlot, [](int x) { return x == 0; }),
          "integrity: the model file keeps llm.c's header (ints 0-7), its checksum in ints 254-255", "");

    const std::string state1 = state_path(dir, 10, 1), log = dir + "/resume.log";
    flip_byte(state1, 1024 + 17);
    c = check_checkpoint(dir, 10);
    FILE* out = fopen(log.c_str(), "w");
    const int chosen = newest_whole_checkpoint(dir, out);
    fclose(out);
    const std::string said = read_text(log);
    check(c.problem.find(state1 + ": checksum mismatch") == 0 && chosen == 5 &&
              said == "skipping checkpoint " + checkpoint_path(dir, "model", 10) + ": " + c.problem + "\n",
          "integrity: a flipped byte in a state file: the checkpoint is skipped with one line naming the file, the one before is taken",
          said);
    flip_byte(state1, 1024 + 17);  // whole again
    flip_byte(checkpoint_path(dir, "model", 10), 900);  // a header int no reader looks at
    c = check_checkpoint(dir, 10);
    check(c.problem.find("model_00000010.bin: checksum mismatch") != std::string::npos, "integrity: a flipped byte anywhere in the model file is found",
          c.problem);
    flip_byte(checkpoint_path(dir, "model", 10), 900);
    if (truncate(state_path(dir, 5, 1).c_str(), 2000) != 0) perror("truncate");
    c = check_checkpoint(dir, 5);
    check(c.problem.find("state_00000005_00001.bin: checksum mismatch") != std::string::npos, "integrity: a truncated state file is found", c.problem);
    unlink(state_path(dir, 5, 1).c_str());
    c = check_checkpoint(dir, 5);
    check(c.problem.find("state_00000005_00001.bin: cannot open") != std::string::npos, "integrity: a missing state file is found", c.problem);
    out = fopen(log.c_str(), "w");
    const int status = verify_checkpoint_folder(dir, out);
    fclose(out);
    const std::string listing = read_text(log);
    check(status == 0 && listing.find("step 10: whole: 3 files, every checksum matches\n") == 0 &&
              listing.find("step 5: damaged: " + state_path(dir, 5, 1) + ": cannot open") != std::string::npos,
          "integrity: --verify-checkpoints lists each checkpoint, exit 0 when the newest is whole", listing);

    // a file without a checksum (llm.c's, or an older train_gpt's) loads unverified
    const std::string plain = dir + "/plain.bin";
    std::vector<int> plain_header(256, 0);
    plain_header[0] = kModelMagic;
    f = fopen(plain.c_str(), "wb");
    fwrite(plain_header.data(), sizeof(int), 256, f);
    fclose(f);
    check(check_file_checksum(plain).status == FileChecksum::kNone, "integrity: a file without the checksum's tag is not verified", "");

    // a failed write: the child process writes under a file-size limit (EFBIG, as a full disk gives ENOSPC)
    const std::string target = checkpoint_path(dir, "model", 10), before = read_text(target), err = dir + "/write.err";
    fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit limit = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &limit);
        if (freopen(err.c_str(), "w", stderr) == nullptr) _exit(3);
        write_model_file(target, layout, std::vector<float>(layout.total, 1.0f), true);
        _exit(0);
    }
    int wstatus = 0;
    waitpid(child, &wstatus, 0);
    const std::string message = read_text(err);
    struct stat st;
    check(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 1 && message.find("error: " + target + ": cannot write: File too large") == 0 &&
              std::count(message.begin(), message.end(), '\n') == 1 && stat((target + ".tmp").c_str(), &st) != 0 && read_text(target) == before,
          "integrity: a failed write stops with one line naming the file, removes the temporary file, leaves the old one as it was", message);

    // a full disk: the same write into a tmpfs with room for the old file but not a second copy, mounted by a child in
    // its own user and mount namespaces (unshare -rm; as root a mount namespace alone) where the system allows one;
    // the child's own child writes (and dies of the error), the child then looks at the tmpfs, which lives with it
    const std::string full = dir + "/full", full_target = full + "/model_00000010.bin", full_err = dir + "/full.err";
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

int main() {
    check_suite("formats");
    test_schedule();
    test_model_files();
    test_checkpoint_discovery();
    test_checkpoint_retention();
    test_parameter_checksums();
    test_checkpoint_integrity();
    return check_failures() == 0 ? 0 : 1;
}
