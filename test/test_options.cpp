// Tests for train_gpt's command line (train_options.h), without a GPU: every flag's name, alias, default and
// accepted values pinned in one table (a flag added without a row, or a default, alias or range changed, fails
// here until the table says so); each flag's range at its bounds through parse_options (the largest and smallest
// accepted values accepted, the next ones beyond refused); and the bounds of the checks validate_options makes
// across flags (sequence length, micro-batch size, FP8 rows, pipeline stages, ZeRO, offload, checkpoints, the output
// folder, the dry run).
//
// A refused flag ends the run (die()), so each parse that may be refused runs in a forked child. Prints one
// PASS/FAIL line per check (test/check.h); exits 1 on any FAIL.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "../train_options.h"
#include "check.h"

namespace {

// Each flag as --help shows it: name, llm.c alias ("" for none), default, accepted values ("" for any text).
// A float default is compared as the float its text parses to.
struct PinnedFlag {
    const char* name;
    const char* alias;
    const char* default_value;
    const char* accepts;
};
const PinnedFlag kPinnedFlags[] = {
    {"--model", "-e", "d12", ""},
    {"--init-from", "", "d12", ""},
    {"--layers", "", "-1", "-1 or in [1, 1024]"},
    {"--heads", "", "-1", "-1 or in [1, 256]"},
    {"--channels", "", "-1", "-1 or in [1, 16384]"},
    {"--max-seq-len", "", "-1", "-1 or in [1, 1048576]"},
    {"--arch", "", "", "one of gpt2, llama"},
    {"--kv-heads", "", "-1", "-1 or in [1, 256]"},
    {"--ffn", "", "-1", "-1 or in [8, 65536]"},
    {"--vocab", "", "-1", "-1 or in [2, 1048576]"},
    {"--qkv-bias", "", "-1", "one of -1, 0, 1"},
    {"--tied-head", "", "-1", "one of -1, 0, 1"},
    {"--norm-eps", "", "-1", "-1 or in (0, 1)"},
    {"--rope-theta", "", "-1", "-1 or > 1"},
    {"--rope-scaling", "", "", ""},
    {"--train-data", "-i", "data/tinyshakespeare/tinyshakespeare_train_*.bin", ""},
    {"--val-data", "-j", "data/tinyshakespeare/tinyshakespeare_val_*.bin", ""},
    {"--tokenizer", "", "data/gpt2", ""},
    {"--batch-size", "-b", "4", ">= 1"},
    {"--seq-len", "-t", "1024", "in [1, 1048576]"},
    {"--total-batch-tokens", "-d", "-1", "-1 or in [1, 2147483647]"},
    {"--precision", "", "bf16", "one of bf16, fp16, fp32, fp8"},
    {"--fp8-stats", "", "0", "one of 0, 1"},
    {"--fp8-scaling", "", "current", "one of current, delayed"},
    {"--fp8-amax-history", "", "-1", "-1 or in [1, 1024]"},
    {"--tf32", "", "0", "one of 0, 1"},
    {"--lr", "-l", "3e-4", ">= 0"},
    {"--warmup-steps", "-u", "0", ">= 0"},
    {"--lr-schedule", "", "cosine", "one of cosine, linear, constant"},
    {"--final-lr-frac", "-q", "1", "in [0, 1]"},
    {"--weight-decay", "-c", "0.1", ">= 0"},
    {"--grad-clip", "", "1", ">= 0"},
    {"--beta1", "", "0.9", "in [0, 1)"},
    {"--beta2", "", "0.95", "in [0, 1)"},
    {"--eps", "", "1e-8", "> 0"},
    {"--steps", "-x", "-1", "-1 or >= 0"},
    {"--val-every", "-v", "20", ">= 0"},
    {"--val-batches", "-m", "20", ">= 1"},
    {"--hellaswag", "", "0", "one of 0, 1"},
    {"--hellaswag-data", "", "data/hellaswag/hellaswag_val.jsonl.xz", ""},
    {"--sample-every", "-s", "20", ">= 0"},
    {"--sample-tokens", "-g", "64", ">= 1"},
    {"--temperature", "", "1", ">= 0"},
    {"--top-k", "", "40", ">= 0"},
    {"--kv-cache", "", "1", "one of 0, 1"},
    {"--stop-at-end", "", "1", "one of 0, 1"},
    {"--prompt", "", "", ""},
    {"--generate", "", "0", ">= 0"},
    {"--output-dir", "-o", "", ""},
    {"--checkpoint-every", "-n", "0", ">= 0"},
    {"--keep-checkpoints", "", "0", ">= 0"},
    {"--keep-every", "", "0", ">= 0"},
    {"--resume", "-y", "0", "one of 0, 1"},
    {"--overwrite-output", "", "0", "one of 0, 1"},
    {"--verify-checkpoints", "", "", ""},
    {"--max-skipped-steps", "", "16", ">= 0"},
    {"--seed", "", "1337", ""},
    {"--shuffle", "", "1", "one of 0, 1"},
    {"--fp16-initial-scale", "", "65536", "> 0"},
    {"--fp16-growth-interval", "", "2000", ">= 1"},
    {"--gelu-fusion", "-ge", "1", "one of 0, 1"},
    {"--recompute", "-r", "0", "one of 0, 1, 2, 3"},
    {"--parameter-checksums", "", "0", "one of 0, 1"},
    {"--deterministic", "", "0", "one of 0, 1"},
    {"--lora-rank", "", "0", ">= 0"},
    {"--lora-alpha", "", "-1", "-1 or > 0"},
    {"--lora-targets", "", "qkv", ""},
    {"--lora-dropout", "", "0", "in [0, 1)"},
    {"--lora-weight-decay", "", "0", ">= 0"},
    {"--lora-load", "", "", ""},
    {"--lora-save", "", "", ""},
    {"--lora-merge", "", "", ""},
    {"--base-quant", "", "none", "one of none, nf4"},
    {"--nf4-double-quant", "", "1", "one of 0, 1"},
    {"--nf4-products", "", "dequantized", "one of dequantized, packed"},
    {"--zero-stage", "-z", "1", "one of 0, 1, 2, 3"},
    {"--offload", "", "none", "one of none, optimizer, optimizer,parameters"},
    {"--offload-delayed-update", "", "0", "one of 0, 1"},
    {"--offload-dir", "", "", ""},
    {"--host-memory-gib", "", "-1", "-1 or > 0"},
    {"--tensor-parallel", "", "1", ">= 1"},
    {"--sequence-parallel", "", "0", "one of 0, 1"},
    {"--pipeline-parallel", "", "1", ">= 1"},
    {"--pipeline-schedule", "", "1f1b", "one of 1f1b, interleaved, zb1"},
    {"--virtual-stages", "", "0", ">= 0"},
    {"--pipeline-layers", "", "", ""},
    {"--nccl-init-file", "", "", ""},
    {"--nccl-timeout", "", "600", ">= 1"},
    {"--dry-run", "", "0", "one of 0, 1"},
    {"--dry-run-gpu-gib", "", "80", "> 0"},
};

// train_gpt's flag checks on `args` for `world` ranks, in a child process: "" when parse_options (and, with
// `validate`, validate_options) accept them, else what the child printed on stderr (or how it ended).
std::string refusal(const std::vector<std::string>& args, int world = 1, bool validate = true) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    fflush(stdout);
    const pid_t child = fork();
    if (child < 0) return "fork failed";
    if (child == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        std::vector<std::string> storage = {"train_gpt"};
        storage.insert(storage.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& a : storage) argv.push_back(&a[0]);
        argv.push_back(nullptr);
        const Options o = parse_options((int)storage.size(), argv.data());
        if (validate) validate_options(o, world);
        _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, n);
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return err.empty() ? "" : "exit 0 with stderr: " + err;
    if (!err.empty() && err.back() == '\n') err.pop_back();
    if (err.empty()) err = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status)) : "exit " + std::to_string(WEXITSTATUS(status));
    return err;
}

std::string joined(const std::vector<std::string>& args) {
    std::string s;
    for (const std::string& a : args) s += (s.empty() ? "" : " ") + (a.empty() ? "''" : a);
    return s;
}

// ---- defaults, aliases and ranges ------------------------------------------------------------------------

std::string default_text(const Flag& f) {
    char buf[64];
    switch (f.kind) {
        case Flag::INT: return std::to_string(*(int*)f.target);
        case Flag::LONG: return std::to_string(*(long*)f.target);
        case Flag::FLOAT: snprintf(buf, sizeof buf, "%.9g", *(float*)f.target); return buf;
        case Flag::STRING: return *(std::string*)f.target;
    }
    return "";
}

bool default_matches(const Flag& f, const std::string& pinned) {
    if (f.kind != Flag::FLOAT) return default_text(f) == pinned;
    char* end = nullptr;
    const float want = strtof(pinned.c_str(), &end);
    return *end == '\0' && want == *(float*)f.target;
}

void test_pinned_flags() {
    char program[] = "train_gpt";
    char* argv[] = {program, nullptr};
    Options parsed = parse_options(1, argv);
    const std::vector<Flag> table = flag_table(parsed);
    std::set<std::string> in_table;
    for (const Flag& f : table) {
        const std::string name = std::string("flag ") + f.name;
        in_table.insert(f.name);
        const PinnedFlag* pin = nullptr;
        for (const PinnedFlag& p : kPinnedFlags)
            if (f.name == std::string(p.name)) pin = &p;
        if (!pin) {
            fail(name, "not pinned: add {\"" + std::string(f.name) + "\", \"" + (f.alias ? f.alias : "") + "\", \"" + default_text(f) +
                           "\", \"" + flag_accepts_string(f, false) + "\"} to kPinnedFlags");
            continue;
        }
        const std::string alias = f.alias ? f.alias : "";
        const std::string accepts = flag_accepts_string(f, false);
        expect(alias == pin->alias && default_matches(f, pin->default_value) && accepts == pin->accepts, name,
               "alias \"" + alias + "\", default \"" + default_text(f) + "\", accepts \"" + accepts + "\"; pinned \"" + pin->alias +
                   "\", \"" + pin->default_value + "\", \"" + pin->accepts + "\"");
    }
    std::string stale;
    for (const PinnedFlag& p : kPinnedFlags)
        if (!in_table.count(p.name)) stale += std::string(" ") + p.name;
    expect(stale.empty() && in_table.size() == table.size(), "every pinned flag exists, once",
           stale.empty() ? "a flag is listed twice" : "not flags:" + stale);
    // the parser takes the last flag a name or alias matches, so one that two flags answer to reaches only one of them
    std::set<std::string> names;
    std::string shared;
    for (const Flag& f : table) {
        if (!names.insert(f.name).second) shared += std::string(" ") + f.name;
        if (f.alias && !names.insert(f.alias).second) shared += std::string(" ") + f.alias;
    }
    expect(shared.empty(), "names and aliases name one flag each", "shared:" + shared);
}

std::string int_text(long double v) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.0Lf", v);
    return buf;
}
std::string float_text(float v) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

// Each flag with a range or choices: the values at its bounds accepted, the next ones beyond refused, by
// parse_options alone. Integers are bounded by their type too (the next value past it is refused, not cut to fit);
// floats are finite.
void test_flag_ranges() {
    Options o;
    for (const Flag& f : flag_table(o)) {
        const Accepts& a = f.accepts;
        std::vector<std::string> accepted, refused;
        if (f.kind == Flag::STRING) {
            if (a.choices.empty()) continue;
            accepted = a.choices;
            for (const std::string& c : a.choices) refused.push_back(c + "x");
            refused.push_back("");
        } else if (!a.choices.empty()) {
            long lo = LONG_MAX, hi = LONG_MIN;
            for (const std::string& c : a.choices) lo = std::min(lo, std::stol(c)), hi = std::max(hi, std::stol(c));
            accepted = a.choices;
            refused = {std::to_string(lo - 1), std::to_string(hi + 1)};
        } else if (f.kind == Flag::FLOAT) {
            // a bound and the float next to it outside (for an open bound: inside); no bound: the largest finite float
            const auto bound = [&](double at, bool open, float outward) {
                if (std::isinf(at)) {
                    accepted.push_back(float_text(std::nextafter(outward, 0.0f)));
                    refused.push_back(float_text(outward));
                    return;
                }
                const float b = (float)at;
                (open ? refused : accepted).push_back(float_text(b));
                (open ? accepted : refused).push_back(float_text(std::nextafter(b, open ? -outward : outward)));
            };
            bound(a.lo, a.lo_open, -INFINITY);
            bound(a.hi, a.hi_open, INFINITY);
            refused.push_back("nan");
        } else {
            const long double lo = std::isfinite(a.lo) ? a.lo + (a.lo_open ? 1 : 0) : f.kind == Flag::INT ? INT_MIN : (long double)LONG_MIN;
            const long double hi = std::isfinite(a.hi) ? a.hi - (a.hi_open ? 1 : 0) : f.kind == Flag::INT ? INT_MAX : (long double)LONG_MAX;
            accepted = {int_text(lo), int_text(hi)};
            refused = {int_text(lo - 1), int_text(hi + 1)};
        }
        if (a.minus_one) {  // -1 besides the range, and nothing next to it
            refused.erase(std::remove(refused.begin(), refused.end(), "-1"), refused.end());
            accepted.push_back("-1");
            if (f.kind == Flag::FLOAT) {
                refused.push_back(float_text(std::nextafter(-1.0f, -INFINITY)));
                refused.push_back(float_text(std::nextafter(-1.0f, 0.0f)));
            } else {
                refused.push_back("-2");
            }
        }
        std::string problems;
        for (const std::string& v : accepted) {
            const std::string r = refusal({f.name, v}, 1, false);
            if (!r.empty()) problems += " [" + v + " refused: " + r + "]";
        }
        for (const std::string& v : refused) {
            const std::string r = refusal({f.name, v}, 1, false);
            if (r.empty()) problems += " [" + v + " accepted]";
            else if (r.find(std::string(f.name) + " must be ") == std::string::npos) problems += " [" + v + ": " + r + "]";
        }
        check(problems.empty(), std::string("range ") + f.name,
              problems.empty() ? "accepted " + joined(accepted) + "; refused " + joined(refused) : problems.substr(1));
    }
}

// ---- the checks across flags ------------------------------------------------------------------------------

// validate_options at one of its bounds: `accepted` passes for `world` ranks, and `refused` (the same but one
// step beyond) is refused with a message containing `message`.
void boundary(const std::string& name, int world, const std::vector<std::string>& accepted, int refused_world,
              const std::vector<std::string>& refused, const std::string& message) {
    const std::string ok = refusal(accepted, world), no = refusal(refused, refused_world);
    check(ok.empty() && no.find(message) != std::string::npos, "bound " + name,
          ok.empty() ? (no.find(message) != std::string::npos ? "" : "refusing " + joined(refused) + " gives \"" + no + "\"")
                     : "refuses " + joined(accepted) + ": " + ok);
}
void boundary(const std::string& name, const std::vector<std::string>& accepted, const std::vector<std::string>& refused,
              const std::string& message) {
    boundary(name, 1, accepted, 1, refused, message);
}

void test_cross_flag_bounds() {
    // a model of 2 layers of 64 channels and at most 64 positions
    const std::vector<std::string> small = {"--layers", "2", "--heads", "1", "--channels", "64", "--max-seq-len", "64", "--seq-len", "32"};
    const auto at = [&](std::vector<std::string> more) {
        more.insert(more.begin(), small.begin(), small.end());
        return more;
    };
    const std::string defaults = refusal({});
    check(defaults.empty(), "bound every default accepted", defaults);
    boundary("seq-len at the model's maximum", at({"--seq-len", "64"}), at({"--seq-len", "65"}),
             "--seq-len must be in 1..64 (the model's maximum sequence length), got 65");
    boundary("seq-len beyond the maximum with --generate", at({"--seq-len", "65", "--generate", "1"}),
             at({"--seq-len", "65", "--generate", "0"}), "--seq-len must be in 1..64");
    boundary("tokens per micro-batch", at({"--batch-size", "2147483647", "--seq-len", "1"}),
             at({"--batch-size", "1073741824", "--seq-len", "2"}),
             "--batch-size x --seq-len = 2147483648 tokens per micro-batch must be at most 2147483647");
    boundary("fp8 rows 16, not 17", at({"--precision", "fp8", "--batch-size", "1", "--seq-len", "16"}),
             at({"--precision", "fp8", "--batch-size", "1", "--seq-len", "17"}),
             "--precision fp8 needs --batch-size x --seq-len to be a multiple of 16, got 1 x 17 = 17");
    boundary("fp8 rows 16, not 8", at({"--precision", "fp8", "--batch-size", "2", "--seq-len", "8"}),
             at({"--precision", "fp8", "--batch-size", "1", "--seq-len", "8"}), "got 1 x 8 = 8");
    // pipelines: a virtual stage per layer at least, ZeRO 0-1
    boundary("layers per virtual stage", 2, at({"--layers", "4", "--pipeline-parallel", "2", "--pipeline-schedule", "interleaved"}), 2,
             at({"--layers", "3", "--pipeline-parallel", "2", "--pipeline-schedule", "interleaved"}),
             "--pipeline-parallel 2 x --virtual-stages 2: the 3 layers cannot fill 4 virtual stages");
    boundary("layers per stage", 2, at({"--pipeline-parallel", "2"}), 2, at({"--layers", "1", "--pipeline-parallel", "2"}),
             "--pipeline-parallel 2: the 1 layer cannot fill 2 stages");
    boundary("pipeline ZeRO stage", 2, at({"--pipeline-parallel", "2", "--zero-stage", "1"}), 2,
             at({"--pipeline-parallel", "2", "--zero-stage", "2"}), "--pipeline-parallel 2 runs with --zero-stage 0 or 1 (got 2)");
    boundary("ZeRO-3 without a pipeline", 2, at({"--zero-stage", "3"}), 2, at({"--pipeline-parallel", "2", "--zero-stage", "3"}),
             "--pipeline-parallel 2 runs with --zero-stage 0 or 1 (got 3)");
    // tensor and sequence parallelism
    const auto split = [&](const std::string& seq_len) {
        return at({"--heads", "2", "--channels", "128", "--tensor-parallel", "2", "--sequence-parallel", "1", "--seq-len", seq_len});
    };
    boundary("sequence parallel seq-len", 2, split("32"), 2, split("31"),
             "--sequence-parallel 1: --seq-len 31 must be a multiple of --tensor-parallel 2");
    boundary("ranks the mesh divides", 4, at({"--tensor-parallel", "1", "--pipeline-parallel", "2"}), 4,
             at({"--tensor-parallel", "3", "--pipeline-parallel", "1"}), "does not divide the 4 ranks");
    // ZeRO-Offload
    boundary("offloaded parameters' data-parallel ranks", 2, at({"--zero-stage", "3", "--offload", "optimizer,parameters"}), 1,
             at({"--zero-stage", "3", "--offload", "optimizer,parameters"}),
             "--offload optimizer,parameters needs at least 2 data-parallel ranks (got 1)");
    boundary("offload ZeRO stage", at({"--zero-stage", "1", "--offload", "optimizer"}), at({"--zero-stage", "0", "--offload", "optimizer"}),
             "--offload optimizer runs with --zero-stage 1, 2 or 3 (got 0)");
    boundary("host memory without offload", at({"--host-memory-gib", "-1"}), at({"--host-memory-gib", "1"}),
             "--host-memory-gib bounds the pinned host memory of --offload, which is none");
    // QLoRA's NF4 base: with LoRA, in bf16 or fp32, on one tensor-parallel rank
    boundary("NF4 base with LoRA", at({"--lora-rank", "4", "--base-quant", "nf4"}), at({"--lora-rank", "0", "--base-quant", "nf4"}),
             "--base-quant nf4 quantizes the frozen base of a LoRA run: add --lora-rank (or --lora-load)");
    boundary("NF4 base in fp32, not fp16", at({"--lora-rank", "4", "--base-quant", "nf4", "--precision", "fp32"}),
             at({"--lora-rank", "4", "--base-quant", "nf4", "--precision", "fp16"}),
             "--base-quant nf4 runs in --precision bf16 (or fp32), got fp16");
    boundary("NF4 base without fp8", at({"--lora-rank", "4", "--base-quant", "nf4", "--precision", "bf16"}),
             at({"--lora-rank", "4", "--base-quant", "nf4", "--precision", "fp8"}), "--base-quant nf4 runs in --precision bf16 (or fp32), got fp8");
    boundary("packed NF4 products in bf16, not fp32", at({"--lora-rank", "4", "--base-quant", "nf4", "--nf4-products", "packed"}),
             at({"--lora-rank", "4", "--base-quant", "nf4", "--nf4-products", "packed", "--precision", "fp32"}),
             "--nf4-products packed multiplies in bf16, got --precision fp32: use --nf4-products dequantized");
    boundary("NF4 absmaxes with an NF4 base", at({"--lora-rank", "4", "--base-quant", "nf4", "--nf4-double-quant", "0"}),
             at({"--lora-rank", "4", "--nf4-double-quant", "0"}), "--nf4-double-quant 0 chooses how the NF4 base keeps its absmaxes: add --base-quant nf4");
    boundary("NF4 products with an NF4 base", at({"--lora-rank", "4", "--base-quant", "nf4", "--nf4-products", "packed"}),
             at({"--lora-rank", "4", "--nf4-products", "packed"}), "--nf4-products packed chooses how the products read an NF4 base: add --base-quant nf4");
    boundary("NF4 base on one tensor-parallel rank", 2, at({"--lora-rank", "4", "--base-quant", "nf4"}), 2,
             at({"--lora-rank", "4", "--base-quant", "nf4", "--heads", "2", "--channels", "128", "--tensor-parallel", "2"}),
             "LoRA runs with --tensor-parallel 1 (got 2)");
    // FP8 scaling, checkpoints and the output folder
    boundary("fp8 amax history", at({"--precision", "fp8", "--fp8-scaling", "delayed", "--fp8-amax-history", "1"}),
             at({"--precision", "fp8", "--fp8-amax-history", "1"}), "--fp8-amax-history 1 runs with --fp8-scaling delayed (got current)");
    boundary("keep-every without keep-checkpoints", at({"--keep-every", "0", "-o", "out"}), at({"--keep-every", "1", "-o", "out"}),
             "--keep-every 1 needs --keep-checkpoints K");
    boundary("keep-checkpoints without output dir", at({"--keep-checkpoints", "0"}), at({"--keep-checkpoints", "1"}),
             "--keep-checkpoints needs --output-dir");
    boundary("checkpoint-every without output dir", at({"--checkpoint-every", "0"}), at({"--checkpoint-every", "1"}),
             "--checkpoint-every needs --output-dir");
    boundary("overwrite-output without output dir", at({"--overwrite-output", "0"}), at({"--overwrite-output", "1"}),
             "--overwrite-output 1 needs --output-dir");
    boundary("overwrite-output with resume", at({"--overwrite-output", "1", "-o", "out", "--resume", "0"}),
             at({"--overwrite-output", "1", "-o", "out", "--resume", "1"}), "--overwrite-output 1 and --resume 1 exclude each other");
    // the dry run's GPU memory: any value with --dry-run 1, only the default without
    boundary("dry-run GPU memory without a dry run", at({"--dry-run", "1", "--dry-run-gpu-gib", "1"}), at({"--dry-run", "0", "--dry-run-gpu-gib", "1"}),
             "--dry-run-gpu-gib 1 runs with --dry-run 1 (got 0)");
}

}  // namespace

int main() {
    check_suite("options");
    test_pinned_flags();
    test_flag_ranges();
    test_cross_flag_bounds();
    return check_failures() ? 1 : 0;
}
