// Checkpoints as committed units (docs/formats.md, docs/reliability.md): the files of checkpoint S in the output
// folder, how a save commits them, how --resume chooses one, and what retention may delete. Plain C++: the CPU tests
// and the crash-consistency test (test/test_checkpoint_crash.cpp, ranks as processes) run it without CUDA;
// checkpoint.cuh fills the files from the GPU and exchanges over NCCL.
//
// Checkpoint S is model_S.bin (the whole model, an llm.c model file; a LoRA run's: adapters_S.bin, its adapter file),
// one state_S_R.bin per writing rank R (the optimizer state of what trains), and
// manifest_S.txt, the commit marker: written last, by rank 0, after every rank's files are durable (written, fsynced,
// renamed, the folder fsynced), and made durable itself the same way. It names the run (its id, fixed when the run
// starts from scratch and kept across resumes), the step, precision and mesh, the settings a resume must agree with,
// and every file with its size and CRC-32C; its last line is the CRC-32C of the lines before. A checkpoint without a
// manifest, or whose files do not match it, is not a checkpoint: --resume never takes it. Deleting one removes the
// manifest first, so an interrupted deletion leaves files that no manifest names (removed by the next prune).
// defines: checkpoint_path, manifest_path, checkpoint_file_step, directory_entries, make_directories, CheckpointManifest,
//          manifest_text, parse_manifest, read_manifest, committed_checkpoints, manifest_files_problem, file_header_problem, verify_manifest_file,
//          set_checkpoint_aside, RankExchange, save_committed_checkpoint, checkpoints_to_delete, prune_checkpoints,
//          ResumeChoice, own_checkpoint_files, choose_resume_checkpoint, choose_after_damage, kLoaded, kLoadFailed,
//          load_agreed_checkpoint, verify_checkpoint_folder, folder_checkpoints_text, move_run_aside,
//          lock_output_dir, setting_differences
#pragma once
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../kernels/die.h"  // die
#include "file_integrity.h"  // FileRecord, Crc32c, check_file_checksum, fault_point, sync_directory, write_file_atomically
#include "checked_reads.h"   // CheckpointReads
#include "run_identity.h"    // run_id_text, parse_run_id

inline std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/%s_%08d.bin", kind, step);
    return dir + name;
}
inline std::string manifest_path(const std::string& dir, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/manifest_%08d.txt", step);
    return dir + name;
}

// The step a checkpoint file's name carries (model_S.bin, adapters_S.bin, state_S_R.bin, manifest_S.txt, any of them with
// .tmp), or -1
// for any other name (among them the files set aside, *.damaged).
inline int checkpoint_file_step(const std::string& name) {
    const bool state = name.rfind("state_", 0) == 0, manifest = name.rfind("manifest_", 0) == 0, adapters = name.rfind("adapters_", 0) == 0;
    if (!state && !manifest && !adapters && name.rfind("model_", 0) != 0) return -1;
    const size_t digits = manifest || adapters ? 9 : 6;
    if (name.size() < digits + 8) return -1;
    for (size_t i = digits; i < digits + 8; i++)
        if (!isdigit((unsigned char)name[i])) return -1;
    std::string rest = name.substr(digits + 8);
    if (rest.size() >= 4 && rest.compare(rest.size() - 4, 4, ".tmp") == 0) rest.resize(rest.size() - 4);
    const bool state_rank = rest.size() == 10 && rest[0] == '_' && std::all_of(rest.begin() + 1, rest.begin() + 6, ::isdigit) && rest.compare(6, 4, ".bin") == 0;
    if (state ? !state_rank : rest != (manifest ? ".txt" : ".bin")) return -1;
    return atoi(name.substr(digits, 8).c_str());
}
// The names of the entries in `dir` (none if it does not exist), sorted.
inline std::vector<std::string> directory_entries(const std::string& dir) {
    std::vector<std::string> names;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d))
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
        closedir(d);
    }
    std::sort(names.begin(), names.end());
    return names;
}
// mkdir -p: creates `dir` and any missing parents.
inline void make_directories(const std::string& dir) {
    for (size_t i = 1; i <= dir.size(); i++) {
        if (i < dir.size() && dir[i] != '/') continue;
        const std::string prefix = dir.substr(0, i);
        if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) die(prefix + ": cannot create folder: " + strerror(errno));
    }
}

// ---------------------------------------------------------------------------------------------
// The manifest

struct CheckpointManifest {
    uint64_t run_id = 0;
    int step = -1;
    std::string precision;
    int data_parallel = 1, tensor_parallel = 1, pipeline_parallel = 1, zero_stage = 0;
    std::vector<std::pair<std::string, std::string>> settings;  // what a resume compares (the schedule, the data), in order
    std::vector<FileRecord> files;                               // the model file first, then the state files by rank
    std::string setting(const std::string& key) const {
        for (const auto& s : settings)
            if (s.first == key) return s.second;
        return "";
    }
};

inline std::string manifest_text(const CheckpointManifest& m) {
    std::ostringstream t;
    t << "train_gpt checkpoint 1\n"
      << "run " << run_id_text(m.run_id) << "\n"
      << "step " << m.step << "\n"
      << "precision " << m.precision << "\n"
      << "mesh " << m.data_parallel << " " << m.tensor_parallel << " " << m.pipeline_parallel << " zero " << m.zero_stage << "\n";
    for (const auto& s : m.settings) t << "setting " << s.first << " " << s.second << "\n";
    for (const FileRecord& f : m.files) {
        char crc[9];
        snprintf(crc, sizeof(crc), "%08x", f.crc);
        t << "file " << f.name << " " << f.bytes << " " << crc << "\n";
    }
    std::string text = t.str();
    Crc32c crc;
    crc.update(text.data(), text.size());
    char end[32];
    snprintf(end, sizeof(end), "end %08x\n", crc.value());
    return text + end;
}

// Parses a manifest's text; "" or the problem (in a phrase, without the path).
inline std::string parse_manifest(const std::string& text, CheckpointManifest* m) {
    const size_t end = text.rfind("end ");
    if (end == std::string::npos || (end > 0 && text[end - 1] != '\n') || text.size() != end + 13 || text.back() != '\n')
        return "incomplete (no closing checksum line)";
    Crc32c crc;
    crc.update(text.data(), end);
    char expected[16];
    snprintf(expected, sizeof(expected), "%08x", crc.value());
    if (text.compare(end + 4, 8, expected) != 0) return "damaged (its closing checksum does not match its lines)";
    std::istringstream lines(text.substr(0, end));
    std::string line;
    int fields = 0;
    while (std::getline(lines, line)) {
        std::istringstream w(line);
        std::string key;
        w >> key;
        if (key == "train_gpt") {
            std::string word;
            int version = 0;
            w >> word >> version;
            if (word != "checkpoint" || version != 1) return "not a train_gpt checkpoint manifest of version 1";
            fields |= 1;
        } else if (key == "run") {
            std::string id;
            w >> id;
            if (!parse_run_id(id, &m->run_id)) return "bad run id '" + id + "'";
            fields |= 2;
        } else if (key == "step") {
            if (!(w >> m->step) || m->step < 0) return "bad step";
            fields |= 4;
        } else if (key == "precision") {
            w >> m->precision;
            fields |= 8;
        } else if (key == "mesh") {
            std::string zero;
            if (!(w >> m->data_parallel >> m->tensor_parallel >> m->pipeline_parallel >> zero >> m->zero_stage) || zero != "zero") return "bad mesh line";
            fields |= 16;
        } else if (key == "setting") {
            std::string name, value;
            w >> name;
            std::getline(w, value);
            if (!value.empty() && value[0] == ' ') value.erase(0, 1);
            m->settings.push_back({name, value});
        } else if (key == "file") {
            FileRecord f;
            std::string crc;
            if (!(w >> f.name >> f.bytes >> crc) || crc.size() != 8 || f.name.find('/') != std::string::npos) return "bad file line '" + line + "'";
            f.crc = (uint32_t)strtoul(crc.c_str(), nullptr, 16);
            m->files.push_back(f);
        } else {
            return "unknown line '" + line + "'";
        }
    }
    if (fields != 31 || m->files.empty()) return "incomplete (a required line is missing)";
    return "";
}

// Reads and parses manifest_S.txt; "" or the problem, in one line naming the file.
inline std::string read_manifest(const std::string& dir, int step, CheckpointManifest* m) {
    const std::string path = manifest_path(dir, step);
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) return path + ": cannot open: " + strerror(errno);
    std::string text;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
    fclose(f);
    const std::string problem = parse_manifest(text, m);
    if (!problem.empty()) return path + ": " + problem;
    if (m->step != step) return path + ": names step " + std::to_string(m->step) + ", not the step of its name";
    return "";
}

// The steps of the committed checkpoints in `dir` (those with a manifest), ascending.
inline std::vector<int> committed_checkpoints(const std::string& dir) {
    std::vector<int> steps;
    for (const std::string& name : directory_entries(dir)) {
        const int step = checkpoint_file_step(name);
        if (step >= 0 && name.rfind("manifest_", 0) == 0 && name.size() == 21) steps.push_back(step);
    }
    return steps;
}

// The steps in `dir` that have checkpoint files but no manifest (not committed), ascending.
inline std::vector<int> uncommitted_steps(const std::string& dir) {
    const std::vector<int> committed = committed_checkpoints(dir);
    std::vector<int> steps;
    for (const std::string& name : directory_entries(dir)) {
        const int step = checkpoint_file_step(name);
        if (step >= 0 && !std::binary_search(committed.begin(), committed.end(), step)) steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
}

// The run id in a checkpoint file's header (stamp_run_identity), or 0: none (a file of an older train_gpt, another
// program's, a temporary one not yet sealed, or one too short to tell).
inline uint64_t file_run_id(const std::string& path) {
    int header[256];
    if (!read_file_header(path, header) || header[kRunIdentitySlot] != kRunIdentityTag) return 0;
    return (uint64_t)(uint32_t)header[kRunIdentitySlot + 1] | (uint64_t)(uint32_t)header[kRunIdentitySlot + 2] << 32;
}
inline bool is_temporary(const std::string& name) { return name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0; }

// The cheap check of a committed checkpoint: each file the manifest names exists with the manifest's size. "" or the
// first problem, in one line.
inline std::string manifest_files_problem(const std::string& dir, const CheckpointManifest& m) {
    for (const FileRecord& f : m.files) {
        struct stat st;
        const std::string path = dir + "/" + f.name;
        if (stat(path.c_str(), &st) != 0) return path + ": missing (" + strerror(errno) + "), though the manifest names it";
        if ((uint64_t)st.st_size != f.bytes)
            return path + ": " + std::to_string((long long)st.st_size) + " bytes, the manifest says " + std::to_string(f.bytes);
    }
    return "";
}
// The cheap check of one file of a manifest, which reads its header alone: the file is there at the manifest's size,
// carries a checksum, and its header's CRC-32C is the manifest's (a file rewritten by another run or attempt carries
// its own, and fails it). That the bytes match that CRC is the full check's (verify_manifest_file), or the load's
// (checked_reads.h). "" or the problem, in one line.
inline std::string file_header_problem(const std::string& dir, const FileRecord& f) {
    const std::string path = dir + "/" + f.name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return path + ": missing (" + strerror(errno) + "), though the manifest names it";
    if ((uint64_t)st.st_size != f.bytes) return path + ": " + std::to_string((long long)st.st_size) + " bytes, the manifest says " + std::to_string(f.bytes);
    int header[256];
    if (!read_file_header(path, header)) return path + ": cannot read its 1024-byte header: " + strerror(errno);
    if (header[kChecksumTagSlot] != kChecksumTag) return path + ": carries no checksum, the manifest's file does";
    uint32_t stored;
    memcpy(&stored, &header[kChecksumSlot], 4);
    if (stored != f.crc) {
        char text[128];
        snprintf(text, sizeof(text), ": CRC-32C %08x, the manifest says %08x: not the file this checkpoint committed", stored, f.crc);
        return path + text;
    }
    return "";
}
// The full check of one file of a manifest: the cheap check, then the whole file read once for its CRC-32C. "" or the
// problem, in one line.
inline std::string verify_manifest_file(const std::string& dir, const FileRecord& f) {
    const std::string problem = file_header_problem(dir, f);
    if (!problem.empty()) return problem;
    const FileChecksum c = check_file_checksum(dir + "/" + f.name);
    return c.status == FileChecksum::kDamaged ? c.problem : "";
}

// Renames checkpoint `step`'s manifest and files (any that exist, temporary ones too) to NAME.damaged, manifest first,
// and makes that durable; they are never deleted. Returns the names set aside.
inline std::vector<std::string> set_checkpoint_aside(const std::string& dir, int step) {
    std::vector<std::string> names;
    const std::string manifest = manifest_path(dir, step).substr(dir.size() + 1);
    for (const std::string& name : directory_entries(dir))
        if (checkpoint_file_step(name) == step) names.push_back(name);
    std::stable_partition(names.begin(), names.end(), [&](const std::string& n) { return n == manifest; });
    for (const std::string& name : names) {
        if (rename((dir + "/" + name).c_str(), (dir + "/" + name + ".damaged").c_str()) != 0)
            die(dir + "/" + name + ": cannot set the damaged checkpoint's file aside: " + strerror(errno));
        fault_point();
    }
    const std::string problem = sync_directory(dir);
    if (!problem.empty()) die(problem);
    return names;
}

// ---------------------------------------------------------------------------------------------
// Saving: every rank's part, then the commit

// What the ranks of a save exchange: in train_gpt over NCCL (checkpoint.cuh), in the crash-consistency test over pipes.
struct RankExchange {
    virtual ~RankExchange() = default;
    virtual int rank() const = 0;
    virtual int world() const = 0;
    // Every rank's record, indexed by rank (a rank that wrote nothing gives an empty name). Returns only when every
    // rank's file is durable: the save's barrier.
    virtual std::vector<FileRecord> all_gather(const FileRecord& mine) = 0;
    // Rank 0's verdict (1: committed) on every rank. Waits without the collective deadline while rank 0 writes the
    // model file and the manifest (a dead rank still ends it).
    virtual int broadcast_from_main(int value) = 0;
};

// The save of checkpoint `manifest.step` as one unit: each rank writes its file (write_own: its state file, or none)
// durably; all ranks exchange their records, which is the barrier; rank 0 then writes the model file (write_model)
// and commits the manifest naming them all; every rank learns that the checkpoint committed. A failure anywhere stops
// that rank (die), the others in the exchange, and leaves no manifest: the checkpoint does not exist. Returns true on
// every rank once committed.
template <typename WriteOwn, typename WriteModel>
bool save_committed_checkpoint(const std::string& dir, CheckpointManifest manifest, RankExchange& exchange, WriteOwn write_own, WriteModel write_model) {
    make_directories(dir);  // every rank: other nodes may not share rank 0's view of the file system yet
    const FileRecord mine = write_own();
    const std::vector<FileRecord> records = exchange.all_gather(mine);
    int committed = 0;
    if (exchange.rank() == 0) {
        manifest.files.clear();
        manifest.files.push_back(write_model());
        for (const FileRecord& r : records)
            if (!r.name.empty()) manifest.files.push_back(r);
        const std::string text = manifest_text(manifest);
        write_file_atomically(manifest_path(dir, manifest.step), {{text.data(), text.size()}});
        committed = 1;
    }
    return exchange.broadcast_from_main(committed) == 1;
}

// --keep-checkpoints K, --keep-every M: of the committed checkpoints `steps` (ascending), those to delete: all but
// the newest K and the milestones (steps that are multiples of M; M = 0: none). K >= 1 always keeps the newest.
inline std::vector<int> checkpoints_to_delete(const std::vector<int>& steps, int keep_newest, int keep_every) {
    std::vector<int> doomed;
    for (size_t i = 0; i + keep_newest < steps.size(); i++)
        if (keep_every <= 0 || steps[i] % keep_every != 0) doomed.push_back(steps[i]);
    return doomed;
}

// After checkpoint `written` committed (rank 0): the checkpoints that --keep-checkpoints and --keep-every no longer
// keep. Only committed checkpoints of this run whose files are all there count; another one (an unreadable manifest,
// a missing or resized file, another run's) is set aside as *.damaged and named on `out`, never deleted, never
// counted as kept. `written` itself is never deleted. A deletion removes the manifest first (durably), then the
// files. This run's checkpoint files that no kept manifest names (a save or a deletion that was interrupted) go too,
// and temporary files (one job a folder: lock_output_dir); files of other runs or programs stay. Returns the
// deleted checkpoints' steps. Failures to delete are warnings: they must not stop the training.
inline std::vector<int> prune_checkpoints(const std::string& dir, int written, uint64_t run_id, int keep_newest, int keep_every, FILE* out) {
    std::vector<int> healthy;
    std::map<int, CheckpointManifest> manifests;
    for (int step : committed_checkpoints(dir)) {
        CheckpointManifest m;
        std::string problem = read_manifest(dir, step, &m);
        if (problem.empty() && m.run_id != run_id)
            problem = manifest_path(dir, step) + ": belongs to run " + run_id_text(m.run_id) + ", not this run " + run_id_text(run_id);
        if (problem.empty()) problem = manifest_files_problem(dir, m);
        if (problem.empty() || step == written) {
            healthy.push_back(step);
            manifests[step] = m;
            continue;
        }
        set_checkpoint_aside(dir, step);
        fprintf(out, "set checkpoint %d aside as *.damaged (not deleted, not counted as kept): %s\n", step, problem.c_str());
    }
    std::vector<int> doomed;
    if (keep_newest > 0) doomed = checkpoints_to_delete(healthy, keep_newest, keep_every);
    doomed.erase(std::remove(doomed.begin(), doomed.end(), written), doomed.end());
    auto remove_file = [&](const std::string& path) {
        if (unlink(path.c_str()) != 0 && errno != ENOENT) fprintf(out, "warning: %s: cannot delete: %s\n", path.c_str(), strerror(errno));
        fault_point();
    };
    for (int step : doomed) {
        remove_file(manifest_path(dir, step));
        manifests.erase(step);
    }
    if (!doomed.empty()) {
        const std::string problem = sync_directory(dir);  // the manifests' removal durable before their files go
        if (!problem.empty()) fprintf(out, "warning: %s\n", problem.c_str());
    }
    for (const std::string& name : directory_entries(dir)) {
        const int step = checkpoint_file_step(name);
        if (step < 0 || step == written) continue;
        const auto kept = manifests.find(step);
        bool named = kept != manifests.end() && name == manifest_path(dir, step).substr(dir.size() + 1);
        if (kept != manifests.end())
            for (const FileRecord& f : kept->second.files) named = named || f.name == name;
        if (!named && (is_temporary(name) || file_run_id(dir + "/" + name) == run_id)) remove_file(dir + "/" + name);
    }
    return doomed;
}

// ---------------------------------------------------------------------------------------------
// Resuming

// The newest committed checkpoint whose manifest and files pass the cheap checks (file_header_problem); the load
// verifies the bytes (load_agreed_checkpoint).
struct ResumeChoice {
    int step = -1;  // -1: none
    CheckpointManifest manifest;
    uint64_t run_id = 0;  // the checkpoint's run; with no checkpoint, the run whose first save did not commit (0: none)
};
// Each rank verifies its own files of a checkpoint: rank r the files of writer ranks r, r + world, r + 2 world, ...
// (every file once over the job, also when the checkpoint came from more ranks), and rank 0 the model file too.
inline std::vector<FileRecord> own_checkpoint_files(const CheckpointManifest& m, int rank, int world) {
    std::vector<FileRecord> own;
    for (size_t i = 0; i < m.files.size(); i++) {
        const FileRecord& f = m.files[i];
        const int writer = f.name.rfind("state_", 0) == 0 ? atoi(f.name.substr(15, 5).c_str()) : 0;  // the model or adapter file: rank 0
        if (writer % world == rank) own.push_back(f);
    }
    return own;
}
// Rank 0's choice (before any GPU is touched): newest first, each committed checkpoint's manifest is read and each of
// its files given the cheap check (file_header_problem: present at its size, the manifest's CRC-32C in its header),
// which reads headers only, so that the load reads each file's bytes once (checked_reads.h) and verifies them then; a
// checkpoint that fails is set aside (*.damaged) and named on `out`, and the next older one tried. Files of a step
// that no manifest names (a save that did not commit) are named too; they are never taken. When the folder holds
// checkpoint files but no committed checkpoint that passes, the run stops (it never starts from scratch over them),
// unless they are all one run's files that never committed: that run starts again from scratch under its id
// (`run_id`), and its next save removes them.
inline ResumeChoice choose_resume_checkpoint(const std::string& dir, FILE* out) {
    ResumeChoice choice;
    const std::vector<int> steps = committed_checkpoints(dir), uncommitted = uncommitted_steps(dir);
    for (int step : uncommitted)
        fprintf(out, "--resume 1: step %d in %s has files but no manifest (a save that did not commit, or an older train_gpt's): not a checkpoint\n",
                step, dir.c_str());
    std::string newest_problem;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        CheckpointManifest m;
        std::string problem = read_manifest(dir, *it, &m);
        for (size_t i = 0; problem.empty() && i < m.files.size(); i++) problem = file_header_problem(dir, m.files[i]);
        if (problem.empty()) {
            choice.step = *it;
            choice.manifest = m;
            return choice;
        }
        if (newest_problem.empty()) newest_problem = problem;
        set_checkpoint_aside(dir, *it);
        fprintf(out, "--resume 1: set checkpoint %d aside as *.damaged: %s\n", *it, problem.c_str());
    }
    if (!steps.empty())
        die("--resume 1: none of the " + std::to_string(steps.size()) + " committed checkpoints in " + dir + " is whole (the newest: " + newest_problem +
            "); they were set aside as *.damaged");
    // no checkpoint: files of one run of ours that never committed (killed in its first save) are that run's, which
    // starts again from scratch under its id; anything else (an older train_gpt's checkpoints, another run's) stops it
    for (const std::string& name : directory_entries(dir)) {
        if (checkpoint_file_step(name) < 0 || is_temporary(name)) continue;
        const uint64_t id = file_run_id(dir + "/" + name);
        if (id == 0 || (choice.run_id != 0 && id != choice.run_id))
            die("--resume 1: " + dir + " holds checkpoint files but no committed checkpoint (" + name + ": " +
                (id == 0 ? std::string("no run id: an older train_gpt's or another program's") : "of another run than " + dir + "/" + name) +
                "); move them away to start from scratch");
        choice.run_id = id;
    }
    return choice;
}

// Rank 0's choice after the load found checkpoint `damaged` damaged (and it was set aside): the next older one that
// passes the cheap checks. The run has loaded parameters by now and never starts from scratch here: with none left it
// stops, naming the folder.
inline ResumeChoice choose_after_damage(const std::string& dir, int damaged, FILE* out) {
    const ResumeChoice choice = choose_resume_checkpoint(dir, out);
    if (choice.step < 0)
        die("--resume 1: checkpoint " + std::to_string(damaged) + " in " + dir + " was damaged and no older committed checkpoint is left (those set "
            "aside are *.damaged)");
    return choice;
}

// One rank's verdict on its load of a checkpoint, as the ranks gather it: kLoaded; kLoadFailed (the load stopped on an
// error no damaged file explains); or 1 + i, the manifest's file i found damaged (its CRC-32C, computed as it was read).
constexpr uint64_t kLoaded = 0, kLoadFailed = ~0ull;

// --resume 1's load of checkpoint `manifest` and the ranks' agreement on it, the same on one rank and on many. Every
// rank loads its part (load(manifest, reads): its reads go through `reads`, which verifies this rank's own files,
// own_checkpoint_files, as they are read: each file by one rank, each byte a rank loads read once by it); the files
// of its own that the load did not read to their end are read for their CRC-32C then. A refusal inside the load (die)
// becomes this rank's verdict rather than its end, since a damaged file may cause it. The ranks gather their verdicts
// (all_gather: every rank's value, indexed by rank; bounded by the heartbeats, so a lost rank ends it). Where any
// rank found a file damaged, rank 0 sets the checkpoint aside (*.damaged) and names the file and the rank on `out`,
// every rank learns the next choice (choose_again, which stops every rank together where none is left) and loads it
// again: the load overwrites what it sets whole. A failure no damaged file explains stops every rank with the reason.
// Returns the manifest of the checkpoint loaded.
template <typename Load, typename AllGather, typename ChooseAgain>
CheckpointManifest load_agreed_checkpoint(const std::string& dir, CheckpointManifest manifest, int rank, int world, Load load, AllGather all_gather,
                                          ChooseAgain choose_again, FILE* out) {
    for (;;) {
        CheckpointReads reads(dir, own_checkpoint_files(manifest, rank, world));
        std::string error;
        {
            DieThrowsInScope throws;
            try {
                load(manifest, reads);
            } catch (const std::exception& e) {
                error = e.what();
            }
        }
        reads.finish();
        uint64_t verdict = kLoaded;
        for (size_t i = 0; i < manifest.files.size(); i++)
            if (manifest.files[i].name == reads.damaged_file()) verdict = 1 + i;
        if (verdict != kLoaded) fprintf(stderr, "rank %d: checkpoint %d: %s\n", rank, manifest.step, reads.problem().c_str());
        else if (!error.empty()) verdict = kLoadFailed;
        const std::vector<uint64_t> verdicts = all_gather(std::vector<uint64_t>{verdict});
        std::string damaged;
        int failed = -1;
        for (int r = 0; r < world; r++) {
            if (verdicts[r] == kLoadFailed && failed < 0) failed = r;
            if (verdicts[r] != kLoaded && verdicts[r] != kLoadFailed)
                damaged += (damaged.empty() ? "" : ", ") + manifest.files[verdicts[r] - 1].name + " (rank " + std::to_string(r) + ")";
        }
        if (damaged.empty() && failed < 0) return manifest;
        if (damaged.empty())
            die(rank == failed ? error : "--resume 1: rank " + std::to_string(failed) + " could not load checkpoint " + std::to_string(manifest.step) + " (its error on its stderr)");
        if (rank == 0) {
            set_checkpoint_aside(dir, manifest.step);
            fprintf(out, "--resume 1: set checkpoint %d aside as *.damaged: the load found damaged: %s (each rank's line on stderr says how)\n",
                    manifest.step, damaged.c_str());
        }
        manifest = choose_again(manifest.step);
    }
}

// --verify-checkpoints DIR: every committed checkpoint in DIR, newest first, each file read whole and checked against
// the manifest, one line each; files no manifest names are listed too. No GPU is used, nothing is changed. Returns the
// exit status: 0 when the newest committed checkpoint is whole, 1 otherwise (or when there is none).
inline int verify_checkpoint_folder(const std::string& dir, FILE* out) {
    const std::vector<int> steps = committed_checkpoints(dir), uncommitted = uncommitted_steps(dir);
    for (int step : uncommitted) fprintf(out, "step %d: not committed (files without a manifest)\n", step);
    if (steps.empty()) {
        fprintf(out, "%s: no committed checkpoint (no manifest_NNNNNNNN.txt)\n", dir.c_str());
        return 1;
    }
    bool newest_whole = false;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        CheckpointManifest m;
        std::string problem = read_manifest(dir, *it, &m);
        for (size_t i = 0; problem.empty() && i < m.files.size(); i++) problem = verify_manifest_file(dir, m.files[i]);
        if (it == steps.rbegin()) newest_whole = problem.empty();
        if (!problem.empty()) fprintf(out, "step %d: damaged: %s\n", *it, problem.c_str());
        else fprintf(out, "step %d: whole: run %s, %zu files match the manifest\n", *it, run_id_text(m.run_id).c_str(), m.files.size());
    }
    return newest_whole ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// A folder belongs to one run

// What checkpoint files `dir` holds, in a phrase ("" when none): the committed checkpoints' run and newest step, or the
// steps of files without a manifest.
inline std::string folder_checkpoints_text(const std::string& dir) {
    const std::vector<int> steps = committed_checkpoints(dir);
    if (!steps.empty()) {
        CheckpointManifest m;
        const std::string problem = read_manifest(dir, steps.back(), &m);
        return std::to_string(steps.size()) + " checkpoint(s) of " + (problem.empty() ? "run " + run_id_text(m.run_id) : std::string("a run")) +
               " (the newest at step " + std::to_string(steps.back()) + ")";
    }
    int files = 0;
    for (const std::string& name : directory_entries(dir)) files += checkpoint_file_step(name) >= 0;
    return files == 0 ? "" : std::to_string(files) + " checkpoint file(s) without a manifest";
}

// --overwrite-output 1: moves every checkpoint file and log.txt of `dir` into a new folder DIR/replaced_YYYYMMDD_HHMMSS
// (nothing is deleted); returns that folder.
inline std::string move_run_aside(const std::string& dir) {
    char stamp[32];
    const time_t now = time(nullptr);
    strftime(stamp, sizeof(stamp), "%Y%m%d_%H%M%S", localtime(&now));
    std::string aside = dir + "/replaced_" + stamp;
    for (int k = 2; access(aside.c_str(), F_OK) == 0; k++) aside = dir + "/replaced_" + stamp + "_" + std::to_string(k);
    make_directories(aside);
    for (const std::string& name : directory_entries(dir))
        if (checkpoint_file_step(name) >= 0 || name == "log.txt" || (name.size() > 8 && name.compare(name.size() - 8, 8, ".damaged") == 0))
            if (rename((dir + "/" + name).c_str(), (aside + "/" + name).c_str()) != 0)
                die(dir + "/" + name + ": cannot move it aside to " + aside + ": " + strerror(errno));
    const std::string problem = sync_directory(dir);
    if (!problem.empty()) die(problem);
    return aside;
}

// Rank 0 holds DIR/.train_gpt.lock (flock) for the run's life: a second job with the same --output-dir is refused in
// one line. The lock ends with the process, however it ends.
inline void lock_output_dir(const std::string& dir) {
    make_directories(dir);
    const std::string path = dir + "/.train_gpt.lock";
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) die("--output-dir " + dir + ": cannot create " + path + ": " + strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char owner[64] = {};
        const ssize_t n = pread(fd, owner, sizeof(owner) - 1, 0);
        std::string who = n > 0 ? std::string(owner, (size_t)n) : std::string("unknown");
        while (!who.empty() && who.back() == '\n') who.pop_back();
        die("--output-dir " + dir + " is in use by another train_gpt job (" + who + "); give each job its own folder");
    }
    char host[128] = {};
    gethostname(host, sizeof(host) - 1);
    const std::string owner = "pid " + std::to_string(getpid()) + " on " + host + "\n";
    if (ftruncate(fd, 0) != 0 || pwrite(fd, owner.data(), owner.size(), 0) != (ssize_t)owner.size())
        die(path + ": cannot write: " + strerror(errno));
}

// The settings recorded in `saved` (a manifest's) that differ from `now`'s, as "key: saved -> now" phrases by key.
inline std::map<std::string, std::string> setting_differences(const CheckpointManifest& saved, const std::vector<std::pair<std::string, std::string>>& now) {
    std::map<std::string, std::string> differences;
    for (const auto& s : now) {
        const std::string before = saved.setting(s.first);
        if (before != s.second) differences[s.first] = s.first + " " + (before.empty() ? "(not recorded)" : before) + " -> " + s.second;
    }
    return differences;
}
