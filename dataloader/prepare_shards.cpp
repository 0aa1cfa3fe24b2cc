// prepare_shards: tokenizes text files into llm.c token shards (an offline job, hence its own small binary
// rather than part of the trainer).
//
// Each document becomes <|endoftext|> followed by its GPT-2 tokens (the llm.c / nanoGPT convention: every
// document starts with EOT). The shards hold uint16 tokens when the tokenizer's vocabulary fits, else uint32
// (llm.c's two formats, shards.h). Documents are whole files (--doc-per-file) or the pieces of a file between
// literal "<|endoftext|>" separators; empty pieces are skipped, and a file's end also ends a document.
// Input "-" is stdin, so a script can stream documents in (scripts/data/prepare_fineweb.py does).
// Documents are read in batches and encoded in parallel on all cores; the output is assembled in document
// order, so it does not depend on the thread count. Output: PREFIX_val_000000.bin, ... and
// PREFIX_train_000000.bin, ...
//
// The prefix's shard set is replaced only by a run that succeeded, and then as a whole (see OutputSet
// below): the new shards are written into a staging folder next to them and renamed into place at the end,
// shards of the earlier set that the new one lacks are deleted, so the prefix's set is exactly this run's.
// A run that fails (bad input, an empty train or validation split, a signal) leaves the earlier set as it
// was. Long documents are encoded in parts of at most 1 MiB (see safe_parts), so memory stays bounded.
//
// `--count FILE...` instead prints each file's plain token count (tiktoken's encode_ordinary, no EOTs) and
// the single-thread encode speed.
//
// `--chat` instead reads JSONL conversations (dataloader/chat.h) and writes each through a chat template into a
// window of --seq-len tokens of its own (no packing: the rest of the window is padding), with a mask shard beside
// each token shard marking the tokens that count in the loss (docs/formats.md, docs/training.md).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../kernels/die.h"  // print_error: the one error line format
#include "chat.h"
#include "shards.h"
#include "text_reader.h"
#include "tokenizer.h"

namespace {

const char* kUsage = R"(usage: prepare_shards [options] --out PREFIX INPUT...
       prepare_shards --count FILE...

Tokenizes text (plain or .xz; "-" is stdin) into llm.c token shards PREFIX_val_NNNNNN.bin and
PREFIX_train_NNNNNN.bin. Every document starts with the end-of-text token (GPT-2's <|endoftext|>). Tokens are uint16 (llm.c's
GPT-2 format) when the tokenizer's vocabulary has at most 65,536 tokens, else uint32 (its Llama 3 format).
The prefix's earlier shards are replaced only when the run succeeds (the new ones go to
DIR/.prepare_BASE.PID/ first); an empty train split, or an empty validation split that was asked for, is an
error.

  --out PREFIX           output path prefix, e.g. data/gutenberg/gutenberg (its folder is created if missing)
  --tokenizer PATH       a Hugging Face tokenizer.json, or a folder holding one or GPT-2's encoder.json and
                         vocab.bpe (default: data/gpt2)
  --eot TOKEN            the added token that starts each document (default: the tokenizer's end of text:
                         <|endoftext|>, Llama 3's <|end_of_text|>, or its post-processor's end token)
  --doc-per-file         each input file is one document (default: documents are separated by the
                         literal text <|endoftext|>)
  --shard-size N         tokens per shard (default: 100000000)
  --val-input FILE       every document of FILE goes to the validation split (repeatable; these are
                         read before the INPUTs and are not counted by the options below)
  --val-docs N           the first N documents form the validation split
  --val-fraction F       a fraction F of the documents, spread evenly (document i is validation when
                         floor((i+1)F) > floor(iF)), forms the validation split
  --val-last-fraction F  the last fraction F of all tokens forms the validation split (nanoGPT style;
                         holds all tokens in memory)
  --threads N            encoding threads (default: all cores)
  --count                print the plain token count (encode_ordinary, no EOTs) of each FILE and exit

Chat data (fine-tuning where only the answers count; docs/training.md):
  --chat                 INPUTs are JSONL conversations, one a line: {"messages": [{"role":
                         "system"|"user"|"assistant", "content": "..."}, ...]} or {"prompt": "...",
                         "completion": "..."}. Each conversation gets a window of --seq-len tokens of its
                         own (padding after it), cut to the window if longer; a mask shard
                         X_train_NNNNNN.bin.mask beside each shard marks the tokens that count
  --seq-len T            the window: train_gpt's --seq-len (required with --chat)
  --chat-template NAME   llama3, chatml or plain (default: plain, the one GPT-2's tokenizer can render)
  --chat-loss WHICH      assistant (default: the assistant's answers and their end-of-turn tokens count)
                         or all (every token of the conversation counts)
  With --chat, --val-docs and --val-fraction count conversations, and --shard-size is rounded down to
  whole windows (plus one token).
  -h, --help             show this help
)";

struct Options {
    std::vector<std::string> val_inputs;  // wholly validation
    std::vector<std::string> inputs;
    std::string out_prefix;
    std::string tokenizer_dir = "data/gpt2";
    std::string eot_token;  // --eot: the added token that starts each document ("": the tokenizer's end of text)
    bool doc_per_file = false;
    uint64_t shard_size = 100000000;
    enum class ValSplit { kNone, kFirstDocs, kDocFraction, kLastTokens } val_split = ValSplit::kNone;
    uint64_t val_docs = 0;
    double val_fraction = 0;
    int threads = 0;
    bool count = false;
    bool chat = false;
    int seq_len = 0;  // --chat's window
    ChatTemplate chat_template = ChatTemplate::kPlain;
    ChatLoss chat_loss = ChatLoss::kAssistant;
};

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

uint64_t parse_count(const std::string& flag, const std::string& value, uint64_t min, uint64_t max) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(value.c_str(), &end, 10);
    if (value.empty() || *end || errno || value[0] == '-' || v < min || v > max)
        throw UsageError(flag + " needs an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                         "], got '" + value + "'");
    return v;
}

double parse_fraction(const std::string& flag, const std::string& value) {
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end || !(v > 0 && v < 1))
        throw UsageError(flag + " needs a number strictly between 0 and 1, got '" + value + "'");
    return v;
}

Options parse_args(int argc, char** argv) {
    Options o;
    int val_options = 0;
    std::vector<std::string> chat_options;  // given flags that only --chat takes
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw UsageError(arg + " needs a value");
            return argv[++i];
        };
        if (arg == "-h" || arg == "--help") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        } else if (arg == "--out") {
            o.out_prefix = value();
        } else if (arg == "--tokenizer") {
            o.tokenizer_dir = value();
        } else if (arg == "--eot") {
            o.eot_token = value();
        } else if (arg == "--doc-per-file") {
            o.doc_per_file = true;
        } else if (arg == "--shard-size") {
            o.shard_size = parse_count(arg, value(), 1, INT32_MAX);
        } else if (arg == "--val-input") {
            o.val_inputs.push_back(value());
        } else if (arg == "--val-docs") {
            o.val_docs = parse_count(arg, value(), 1, UINT64_MAX);
            o.val_split = Options::ValSplit::kFirstDocs;
            ++val_options;
        } else if (arg == "--val-fraction") {
            o.val_fraction = parse_fraction(arg, value());
            o.val_split = Options::ValSplit::kDocFraction;
            ++val_options;
        } else if (arg == "--val-last-fraction") {
            o.val_fraction = parse_fraction(arg, value());
            o.val_split = Options::ValSplit::kLastTokens;
            ++val_options;
        } else if (arg == "--threads") {
            o.threads = static_cast<int>(parse_count(arg, value(), 1, 1024));
        } else if (arg == "--count") {
            o.count = true;
        } else if (arg == "--chat") {
            o.chat = true;
        } else if (arg == "--seq-len") {
            o.seq_len = static_cast<int>(parse_count(arg, value(), 1, INT32_MAX / 2));
        } else if (arg == "--chat-template") {
            try {
                o.chat_template = parse_chat_template(value(), arg);
            } catch (const std::runtime_error& e) {
                throw UsageError(e.what());
            }
            chat_options.push_back(arg);
        } else if (arg == "--chat-loss") {
            const std::string which = value();
            if (which != "assistant" && which != "all")
                throw UsageError(arg + " " + which + ": expected assistant or all");
            o.chat_loss = which == "all" ? ChatLoss::kAllTokens : ChatLoss::kAssistant;
            chat_options.push_back(arg);
        } else if (arg.size() > 1 && arg[0] == '-') {  // "-" alone is stdin
            throw UsageError("unknown option " + arg);
        } else {
            o.inputs.push_back(arg);
        }
    }
    if (o.inputs.empty() && o.val_inputs.empty()) throw UsageError("no input files");
    if (val_options > 1) throw UsageError("--val-docs, --val-fraction and --val-last-fraction exclude each other");
    if (!o.count && o.out_prefix.empty()) throw UsageError("--out PREFIX is required");
    if (o.count && (!o.out_prefix.empty() || val_options || !o.val_inputs.empty()))
        throw UsageError("--count takes only input files (and --tokenizer)");
    if (o.chat && o.count) throw UsageError("--chat and --count exclude each other");
    if (o.seq_len > 0) chat_options.push_back("--seq-len");
    if (!o.chat && !chat_options.empty()) throw UsageError(chat_options[0] + " needs --chat");
    if (o.chat && o.seq_len == 0) throw UsageError("--chat needs --seq-len T, the window train_gpt's --seq-len will be");
    if (o.chat && o.doc_per_file) throw UsageError("--doc-per-file does not apply to --chat (a conversation is a line)");
    if (o.chat && o.val_split == Options::ValSplit::kLastTokens)
        throw UsageError("--val-last-fraction does not apply to --chat (a split of tokens would cut a conversation): "
                         "use --val-fraction or --val-docs");
    if (o.chat && o.shard_size < static_cast<uint64_t>(o.seq_len) + 1)
        throw UsageError("--shard-size " + std::to_string(o.shard_size) + " holds no window of --seq-len " +
                         std::to_string(o.seq_len) + " (a chat shard needs --seq-len + 1 tokens at least)");
    if (o.threads == 0) o.threads = std::max(1u, std::thread::hardware_concurrency());
    return o;
}

// ---- cutting long documents into parts ---------------------------------------------------------------------
//
// A document longer than kMaxPart bytes is read and encoded in parts of at most kMaxPart bytes, so memory
// stays bounded however long a document or a run without spaces is. (It was not: 100 MB of "a" is one
// pre-token piece, whose BPE needs ~25 bytes per byte -- 2.5 GB -- and indexes it with int, which overflows
// past 2 GiB.) Parts end at safe cuts: positions p where encoding text[0,p) and text[p,n) separately gives
// exactly the tokens of the whole text, so the shards do not change. A character boundary p is a safe cut
// when the character X before it is not white space, the character Y at p is white space or of another
// class (letter / number / other) than X, and not X = ' with Y one of s t m d r v l. Why: with the GPT-2
// pre-tokenizer pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// the piece holding X is a run of X's class or a contraction ending in X (white space appears only at a
// piece's start), so a piece ends at p; the scan of text[0,p) looks past p only to learn that Y does not
// continue X's run or complete a contraction, which it also learns when the text ends at p; and the scan
// from p depends on text[p..] alone.
// Only when kMaxPart bytes in a row hold no safe cut -- a white-space run, maybe an apostrophe, then a run
// of one class, so a pre-token piece of about kMaxPart/2 bytes or more -- is that stretch cut into parts of
// kPathologicalChunk bytes (at character boundaries) instead; that changes the tokens of that pathological
// piece only (a token or so per chunk). kMaxPart = 1 MiB: ordinary pieces are words, numbers, punctuation
// and white-space runs, far below half a megabyte, so ordinary text is tokenized exactly as a whole.
// kPathologicalChunk = 64 bytes rather than 1 MiB because the tokenizer caches the tokens of every distinct
// piece, up to 2^18 pieces per thread: 64-byte chunks bound that cache to ~64 MB per thread, where 1 MiB
// chunks of, say, 100 MB of random letters would hold 3-4 bytes per input byte (415 MB measured).
constexpr size_t kMaxPart = size_t(1) << 20;
constexpr size_t kPathologicalChunk = 64;
// safe_parts decodes the character at a cut, up to 4 bytes: the text must extend this far past the limit.
constexpr size_t kCutMargin = 16;

// ---- reading documents ------------------------------------------------------------------------------------

// A document, or a part of one (see safe_parts): the parts of a long document follow each other.
struct Document {
    std::string text;
    size_t file;        // index of the input it came from
    bool continuation;  // the next part of the previous Document (no EOT before it)
};

class DocumentSource {
public:
    DocumentSource(const std::vector<std::string>& inputs, bool doc_per_file, const Tokenizer& tok)
        : inputs_(inputs), doc_per_file_(doc_per_file), tok_(tok) {
        for (const std::string& path : inputs_) {
            if (path == "-") continue;  // stdin: size unknown
            struct stat st;
            if (::stat(path.c_str(), &st) != 0) throw std::runtime_error(path + ": " + std::strerror(errno));
            if (S_ISDIR(st.st_mode)) throw std::runtime_error(path + ": is a directory");
            if (S_ISREG(st.st_mode)) total_bytes_ += static_cast<uint64_t>(st.st_size);  // not pipes
        }
    }

    // Appends documents (or parts of long ones) to `docs` until they hold at least `min_bytes` of text or the
    // input ends.
    void next_batch(size_t min_bytes, std::vector<Document>& docs) {
        size_t bytes = 0;
        auto emit = [&](size_t begin, size_t end, bool document_ends) {
            if (end > begin) {  // empty documents (e.g. after a trailing separator) are skipped
                docs.push_back({buffer_.substr(begin, end - begin), next_file_ - 1, in_document_});
                bytes += end - begin;
                in_document_ = true;
            }
            if (document_ends) in_document_ = false;
        };
        while (bytes < min_bytes) {
            if (!reader_) {
                if (next_file_ == inputs_.size()) return;
                reader_ = std::make_unique<TextFileReader>(inputs_[next_file_++]);
                buffer_.clear();
                begin_ = search_ = 0;
                in_document_ = false;
            }
            if (!doc_per_file_) {
                const size_t at = buffer_.find(kSeparator, search_);
                if (at != std::string::npos) {
                    emit(begin_, at, true);
                    begin_ = search_ = at + kSeparatorLength;
                    continue;
                }
                // A separator may straddle the next read: resume the search just before the end.
                search_ = std::max(begin_, buffer_.size() - std::min(buffer_.size(), kSeparatorLength - 1));
            }
            if (buffer_.size() - begin_ >= kMaxPart + kCutMargin) {
                // A long document: emit parts of it. No separator starts before search_, after the cuts.
                tok_.safe_parts(std::string_view(buffer_).substr(begin_), kMaxPart, kPathologicalChunk, ends_);
                const size_t start = begin_;
                for (size_t end : ends_) {
                    emit(begin_, start + end, false);
                    begin_ = start + end;
                }
                search_ = std::max(search_, begin_);
                continue;
            }
            buffer_.erase(0, begin_);
            search_ -= begin_;
            begin_ = 0;
            const size_t old_size = buffer_.size();
            buffer_.resize(old_size + kChunk);
            const size_t got = reader_->read(&buffer_[old_size], kChunk);
            buffer_.resize(old_size + got);
            if (got == 0) {  // end of file: the rest is the last document
                emit(0, buffer_.size(), true);
                done_bytes_ += reader_->file_position();
                reader_.reset();
            }
        }
    }

    bool finished() const { return !reader_ && next_file_ == inputs_.size(); }
    uint64_t total_bytes() const { return total_bytes_; }  // 0 if unknown (stdin, pipes)
    uint64_t bytes_read() const { return done_bytes_ + (reader_ ? reader_->file_position() : 0); }

private:
    static constexpr char kSeparator[] = "<|endoftext|>";
    static constexpr size_t kSeparatorLength = sizeof(kSeparator) - 1;
    static constexpr size_t kChunk = size_t(1) << 20;

    std::vector<std::string> inputs_;
    bool doc_per_file_;
    const Tokenizer& tok_;  // where a long document may be cut (safe_parts)
    size_t next_file_ = 0;
    std::unique_ptr<TextFileReader> reader_;
    std::string buffer_;  // unconsumed text of the current file starts at begin_
    size_t begin_ = 0, search_ = 0;
    bool in_document_ = false;  // a part of the current document was emitted already
    std::vector<size_t> ends_;  // safe_parts' result
    uint64_t total_bytes_ = 0, done_bytes_ = 0;
};

// ---- encoding -------------------------------------------------------------------------------------------

// EOT (unless a continuation part) + tokens of every document, encoded on `threads` threads; result i
// belongs to docs[i]. Token holds every id of the vocabulary (run_shards' choice).
template <typename Token>
std::vector<std::vector<Token>> encode_documents(const Tokenizer& tok, const std::vector<Document>& docs,
                                                 int threads) {
    std::vector<std::vector<Token>> out(docs.size());
    // Largest documents first, so one big document does not start last and leave the other threads idle.
    std::vector<size_t> order(docs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return docs[a].text.size() > docs[b].text.size(); });
    std::atomic<size_t> next{0};
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    auto work = [&] {
        std::vector<int> ids;
        for (size_t k; !failed && (k = next++) < order.size();) {
            try {
                const size_t i = order[k];
                ids.clear();
                tok.encode_append(docs[i].text, ids);
                out[i].reserve(ids.size() + 1);
                if (!docs[i].continuation) out[i].push_back(static_cast<Token>(tok.eot()));
                for (int id : ids) out[i].push_back(static_cast<Token>(id));
            } catch (...) {
                if (!failed.exchange(true)) error = std::current_exception();
            }
        }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
    return out;
}

// ---- signals ------------------------------------------------------------------------------------------------

// SIGINT / SIGTERM / SIGHUP stop the run after the current batch, through the ordinary error path, so the
// staging folder is removed and the earlier shard set stays as it was. A second signal has its default
// effect (SA_RESETHAND), stopping at once; the next run then removes the staging folder. Reads are restarted
// (SA_RESTART): a run blocked reading stdin stops once input arrives or ends (prepare_fineweb.py signals it
// before it closes the pipe, so the end of input is never taken for a complete corpus).
volatile sig_atomic_t g_signal = 0;

extern "C" void on_signal(int sig) {
    g_signal = sig;
    static const char message[] =
        "\nprepare_shards: stopping after the current batch; the earlier shards stay as they are "
        "(signal again to stop at once)\n";
    ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
    (void)ignored;
}

void install_signal_handlers() {
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

struct Interrupted : std::runtime_error {
    explicit Interrupted(int sig)
        : std::runtime_error("stopped by signal " + std::to_string(sig) + " (" + strsignal(sig) +
                             ") before the shards were complete; the earlier shards were left as they were"),
          signal(sig) {}
    int signal;
};

void check_interrupted() {
    if (g_signal) throw Interrupted(g_signal);
}

// ---- the output set: staging, then replacing the earlier set ------------------------------------------------
//
// A failed or killed run must not leave a mix of old and new shards under the final names, which the
// training glob PREFIX_train_*.bin would read without complaint. So:
//  - The new set is written into a staging folder DIR/.prepare_BASE.PID/ (PREFIX = DIR/BASE) under the
//    final file names. It is inside DIR, so the same file system (rename works), and the glob, which does
//    not descend into folders, never matches it or the temporary files write_shard makes there.
//  - Only when every shard is complete (each fsynced by write_shard) is the set replaced: a small marker
//    PREFIX.replacing, naming the staging folder and the new set's shard counts, is put in place; the
//    earlier set's shards that the new set lacks are deleted; each new shard is renamed into place (rename
//    is atomic per file, so no file is ever partial); the marker is removed, then the staging folder. This
//    step is only unlinks and renames, milliseconds even for thousands of shards; the shards are written
//    and fsynced before it begins.
//  - The residual window: a SIGKILL or power cut inside that step leaves a mix under the final names, but
//    also the marker, whose text says so; the next prepare_shards run with this prefix (any arguments)
//    completes the replacement from the complete staging folder before it starts. A training run started
//    in between would read the mix; nothing but the marker flags it.
//  - Staging folders of runs that died earlier (their pid is not alive on this machine) are removed by the
//    next run with a message; one of a live process is an error (two runs must not write one prefix).
//    Temporary files BASE_*_NNNNNN.bin.tmp.PID that older versions left in DIR are removed likewise.
//  - The folder's writability is checked before tokenizing, by creating the staging folder and a probe
//    file in it.

std::string shard_path(const std::string& prefix, const std::string& split, int index) {
    char number[16];
    std::snprintf(number, sizeof number, "%06d", index);
    return prefix + "_" + split + "_" + number + ".bin";
}

// Splits PREFIX into its folder and base name.
void split_prefix(const std::string& prefix, std::string& dir, std::string& base) {
    const size_t slash = prefix.rfind('/');
    dir = slash == std::string::npos ? "." : slash == 0 ? "/" : prefix.substr(0, slash);
    base = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
}

// mkdir -p: `dir` and its missing parents; "" or the folder that could not be made and why.
std::string make_folders(const std::string& dir) {
    for (size_t end = 1; end <= dir.size(); end++) {
        if (end < dir.size() && dir[end] != '/') continue;
        const std::string folder = dir.substr(0, end);
        if (::mkdir(folder.c_str(), 0755) != 0 && errno != EEXIST) return folder + ": " + std::strerror(errno);
    }
    return "";
}

std::string join(const std::string& dir, const std::string& name) {
    return dir == "/" ? "/" + name : dir + "/" + name;
}

bool all_digits(std::string_view s) {
    return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> list_folder(const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) throw std::runtime_error(dir + ": cannot list the folder: " + std::strerror(errno));
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

// If `name` is BASE_SPLIT_DIGITS.binREST with SPLIT train or val, stores the split, the index and REST.
bool parse_shard_name(const std::string& name, const std::string& base, std::string& split, long long& index,
                      std::string& rest) {
    for (const char* s : {"train", "val"}) {
        const std::string head = base + "_" + s + "_";
        if (name.compare(0, head.size(), head) != 0) continue;
        const size_t dot = name.find(".bin", head.size());
        if (dot == std::string::npos) return false;
        const std::string_view digits(name.data() + head.size(), dot - head.size());
        if (!all_digits(digits)) return false;
        split = s;
        index = std::stoll(std::string(digits));
        rest = name.substr(dot + 4);
        return true;
    }
    return false;
}

// If `name` is .prepare_BASE.PID, stores PID.
bool parse_staging_name(const std::string& name, const std::string& base, long& pid) {
    const std::string head = ".prepare_" + base + ".";
    if (name.compare(0, head.size(), head) != 0 || !all_digits(std::string_view(name).substr(head.size())))
        return false;
    pid = std::stol(name.substr(head.size()));
    return true;
}

std::string staging_name(const std::string& base, long pid) { return ".prepare_" + base + "." + std::to_string(pid); }

bool other_process_alive(long pid) {
    if (pid == static_cast<long>(::getpid())) return false;  // a dead run's folder whose pid we now have
    return pid > 0 && pid <= INT32_MAX && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

void fsync_folder(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);  // best effort: some file systems refuse fsync on a folder
    ::close(fd);
}

// Removes a staging folder and the plain files in it (it holds nothing else).
void remove_staging_folder(const std::string& path) {
    for (const std::string& name : list_folder(path))
        if (::unlink(join(path, name).c_str()) != 0 && errno != ENOENT)
            throw std::runtime_error(join(path, name) + ": cannot remove: " + std::strerror(errno));
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT)
        throw std::runtime_error(path + ": cannot remove the folder: " + std::strerror(errno));
}

struct Replacement {
    std::string staging;  // the staging folder's name in DIR
    long long shards_train = -1, shards_val = -1;
    bool masks = false;   // the new set has a mask shard beside each token shard (--chat)
};

// A token shard's companion in a set: its mask shard, BASE_SPLIT_NNNNNN.bin.mask (shards.h).
const std::string kMaskRest = mask_shard_path("");

void write_text_file(const std::string& path, const std::string& text) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
    const int err = errno;
    if (::close(fd) != 0 || !ok) throw std::runtime_error(path + ": write error: " + std::strerror(ok ? errno : err));
}

Replacement read_marker(const std::string& path, const std::string& base) {
    const std::string text = read_text_file(path);
    Replacement r;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t eol = text.find('\n', pos);
        if (eol == std::string::npos) eol = text.size();
        const std::string line = text.substr(pos, eol - pos);
        pos = eol + 1;
        const size_t space = line.find(' ');
        if (line.empty() || line[0] == '#' || space == std::string::npos) continue;
        const std::string key = line.substr(0, space), value = line.substr(space + 1);
        if (key == "staging") r.staging = value;
        if (key == "train" && all_digits(value)) r.shards_train = std::stoll(value);
        if (key == "val" && all_digits(value)) r.shards_val = std::stoll(value);
        if (key == "masks") r.masks = value == "1";
    }
    long pid;
    if (r.shards_train < 0 || r.shards_val < 0 || !parse_staging_name(r.staging, base, pid))
        throw std::runtime_error(path + ": unreadable replacement marker (expected lines 'staging .prepare_BASE.PID', "
                                 "'train N', 'val N'); the shard set may be a mix of two runs: delete the shards "
                                 "and this file, then prepare them again");
    return r;
}

// The replacement step (see above), also used to complete one that was interrupted. Returns how many shards
// of the earlier set were deleted.
int replace_set(const std::string& dir, const std::string& base, const Replacement& r, const std::string& marker) {
    int deleted = 0;
    std::string split, rest;
    long long index;
    for (const std::string& name : list_folder(dir)) {
        if (!parse_shard_name(name, base, split, index, rest) || (!rest.empty() && rest != kMaskRest)) continue;
        const bool mask = !rest.empty();  // an earlier set's mask goes unless the new set has one by its name
        const std::string shard = shard_path(base, split, static_cast<int>(index));
        if (index < (split == "train" ? r.shards_train : r.shards_val) && (!mask || r.masks) &&
            name == (mask ? mask_shard_path(shard) : shard))
            continue;  // to be overwritten by the new shard
        if (::unlink(join(dir, name).c_str()) != 0 && errno != ENOENT)
            throw std::runtime_error(join(dir, name) + ": cannot delete this shard of the earlier set: " +
                                     std::strerror(errno));
        ++deleted;
    }
    const std::string staging = join(dir, r.staging);
    struct stat st;
    if (::stat(staging.c_str(), &st) == 0) {  // absent when an interrupted replacement had got this far
        for (const std::string& name : list_folder(staging)) {
            if (!parse_shard_name(name, base, split, index, rest) || (!rest.empty() && rest != kMaskRest)) continue;
            if (::rename(join(staging, name).c_str(), join(dir, name).c_str()) != 0)
                throw std::runtime_error(join(dir, name) + ": cannot rename the new shard into place: " +
                                         std::strerror(errno) + " (rerun to complete the replacement)");
        }
    }
    fsync_folder(dir);
    if (::unlink(marker.c_str()) != 0 && errno != ENOENT)
        throw std::runtime_error(marker + ": cannot delete: " + std::strerror(errno));
    fsync_folder(dir);
    if (::stat(staging.c_str(), &st) == 0) remove_staging_folder(staging);
    return deleted;
}

class OutputSet {
public:
    explicit OutputSet(const std::string& prefix) : prefix_(prefix), marker_(prefix + ".replacing") {
        split_prefix(prefix, dir_, base_);
        if (base_.empty() || base_ == "." || base_ == "..")
            throw std::runtime_error("--out " + prefix + " needs a file name prefix after the folder (e.g. " +
                                     join(dir_, "corpus") + ")");
        struct stat st;
        const std::string unmade = ::stat(dir_.c_str(), &st) == 0 ? "" : make_folders(dir_);
        if (!unmade.empty()) throw std::runtime_error("output folder " + dir_ + " cannot be created (from --out " + prefix + "): " + unmade);
        if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
            throw std::runtime_error("output folder " + dir_ + " is not a folder (from --out " + prefix + ")");
        complete_interrupted_replacement();
        // Writable? Create the staging folder and a probe file in it, before any tokenizing.
        staging_dir_ = join(dir_, staging_name(base_, ::getpid()));
        if (::mkdir(staging_dir_.c_str(), 0755) != 0) {
            const int err = errno;
            if (err == EEXIST) remove_staging_folder(staging_dir_);  // a dead run's, whose pid we now have
            if (err != EEXIST || ::mkdir(staging_dir_.c_str(), 0755) != 0)
                throw std::runtime_error("output folder " + dir_ + " is not writable (from --out " + prefix +
                                         "): cannot create " + staging_dir_ + ": " + std::strerror(errno));
        }
        created_ = true;
        try {  // a constructor that throws runs no destructor: remove the staging folder here
            const std::string probe = join(staging_dir_, "probe");
            const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            if (fd < 0)
                throw std::runtime_error("output folder " + dir_ + " is not writable (from --out " + prefix +
                                         "): cannot create " + probe + ": " + std::strerror(errno));
            ::close(fd);
            ::unlink(probe.c_str());
            remove_stale_files();
        } catch (...) {
            try {
                remove_staging_folder(staging_dir_);
            } catch (...) {
            }
            throw;
        }
    }

    ~OutputSet() {
        if (!created_ || committed_) return;
        try {
            remove_staging_folder(staging_dir_);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "prepare_shards: %s\n", e.what());
        }
    }
    OutputSet(const OutputSet&) = delete;
    OutputSet& operator=(const OutputSet&) = delete;

    // Where the new shards are written: the staging folder, under their final names.
    std::string staging_prefix() const { return join(staging_dir_, base_); }

    // Replaces the prefix's shard set by the staged one (all its shards complete; with `masks`, a mask shard beside
    // each).
    void commit(int train_shards, int val_shards, bool masks = false) {
        fsync_folder(staging_dir_);
        Replacement r{staging_name(base_, ::getpid()), train_shards, val_shards, masks};
        const std::string text =
            "# prepare_shards (pid " + std::to_string(::getpid()) + ") is replacing the shards " + prefix_ +
            "_{train,val}_*.bin by the complete set in " + staging_dir_ + "/.\n"
            "# If this file is still here, that was interrupted and the shards may be a mix of two runs: the next\n"
            "# prepare_shards --out " + prefix_ + " (any inputs) completes the replacement before it starts.\n"
            "staging " + r.staging + "\ntrain " + std::to_string(train_shards) + "\nval " +
            std::to_string(val_shards) + "\nmasks " + (masks ? "1" : "0") + "\n";
        const std::string tmp = join(staging_dir_, "replacing");  // written in full, then renamed into place
        write_text_file(tmp, text);
        if (::rename(tmp.c_str(), marker_.c_str()) != 0)
            throw std::runtime_error(marker_ + ": cannot create: " + std::strerror(errno));
        fsync_folder(dir_);
        committed_ = true;  // from here on the staging folder is the marker's, not ours to remove
        const int deleted = replace_set(dir_, base_, r, marker_);
        if (deleted > 0)
            std::fprintf(stderr, "prepare_shards: deleted %d shard(s) of the earlier set %s_{train,val}_*.bin that "
                         "the new set does not have\n", deleted, prefix_.c_str());
    }

private:
    void complete_interrupted_replacement() {
        struct stat st;
        if (::stat(marker_.c_str(), &st) != 0) return;
        const Replacement r = read_marker(marker_, base_);
        long pid = 0;
        parse_staging_name(r.staging, base_, pid);
        if (other_process_alive(pid))
            throw std::runtime_error("another prepare_shards (pid " + std::to_string(pid) +
                                     ") is replacing the shards of " + prefix_ + " now (" + marker_ + ")");
        std::fprintf(stderr, "prepare_shards: completing the replacement of %s_{train,val}_*.bin that process "
                     "%ld began and did not finish (%s)\n", prefix_.c_str(), pid, marker_.c_str());
        replace_set(dir_, base_, r, marker_);
    }

    // Staging folders and old-style temporary files of runs that died.
    void remove_stale_files() {
        const std::string mine = staging_name(base_, ::getpid());
        std::string split, rest;
        long long index;
        for (const std::string& name : list_folder(dir_)) {
            long pid;
            if (name != mine && parse_staging_name(name, base_, pid)) {
                const std::string path = join(dir_, name);
                if (other_process_alive(pid))
                    throw std::runtime_error("another prepare_shards (pid " + std::to_string(pid) +
                                             ") is writing shards for " + prefix_ + " (staging folder " + path +
                                             "); wait for it, or delete the folder if that process is not one");
                remove_staging_folder(path);
                std::fprintf(stderr, "prepare_shards: removed the staging folder %s of a run (pid %ld) that did "
                             "not finish\n", path.c_str(), pid);
            } else if (parse_shard_name(name, base_, split, index, rest) && rest.compare(0, 5, ".tmp.") == 0 &&
                       all_digits(std::string_view(rest).substr(5)) && !other_process_alive(std::stol(rest.substr(5)))) {
                const std::string path = join(dir_, name);  // an older prepare_shards wrote these in place
                if (::unlink(path.c_str()) == 0)
                    std::fprintf(stderr, "prepare_shards: removed %s, a temporary file of a run that did not "
                                 "finish\n", path.c_str());
            }
        }
    }

    std::string prefix_, marker_, dir_, base_, staging_dir_;
    bool created_ = false, committed_ = false;
};

// ---- writing ----------------------------------------------------------------------------------------------

// One split's shard sequence, written under `prefix` (the staging folder) in the format of `vocab_size`: full
// shards are written as they fill, the remainder by finish().
template <typename Token>
class SplitWriter {
public:
    SplitWriter(std::string prefix, std::string split, uint64_t shard_size, int vocab_size)
        : prefix_(std::move(prefix)), split_(std::move(split)), shard_size_(shard_size), vocab_size_(vocab_size) {}

    void append(const Token* tokens, size_t n) {
        // Reserved whole at once (only the pages written count): growing by doubling would copy the shard
        // and briefly hold 1.5 times it.
        if (n > 0 && buffer_.capacity() < shard_size_) buffer_.reserve(shard_size_);
        while (n > 0) {
            const size_t take = std::min<size_t>(n, shard_size_ - buffer_.size());
            buffer_.insert(buffer_.end(), tokens, tokens + take);
            tokens += take, n -= take;
            if (buffer_.size() == shard_size_) flush();
        }
    }

    void finish() {
        if (!buffer_.empty()) flush();
    }

    uint64_t tokens() const { return tokens_ + buffer_.size(); }
    int shards() const { return shards_; }

private:
    void flush() {
        write_shard(shard_path(prefix_, split_, shards_++), buffer_, vocab_size_);
        tokens_ += buffer_.size();
        buffer_.clear();
    }

    std::string prefix_, split_;
    uint64_t shard_size_;
    int vocab_size_;
    std::vector<Token> buffer_;
    uint64_t tokens_ = 0;
    int shards_ = 0;
};

// ---- progress ---------------------------------------------------------------------------------------------

// A live bar on a terminal; on a log, a line every 10 seconds. Input of unknown size (stdin) gets no bar.
class Progress {
public:
    explicit Progress(uint64_t total_bytes) : total_(total_bytes), tty_(::isatty(STDERR_FILENO)) {}

    void update(uint64_t bytes, uint64_t tokens, bool final = false) {
        const auto now = std::chrono::steady_clock::now();
        if (!final && now - last_print_ < std::chrono::seconds(tty_ ? 0 : 10)) return;
        last_print_ = now;
        const double secs = std::chrono::duration<double>(now - start_).count();
        std::string bar;
        if (total_ > 0) {
            const double fraction = std::min(1.0, double(bytes) / total_);
            const int filled = static_cast<int>(fraction * 30);
            char percent[16];
            std::snprintf(percent, sizeof percent, "%3.0f%%  ", 100 * fraction);
            bar = "[" + std::string(filled, '#') + std::string(30 - filled, '.') + "] " + percent;
        }
        std::fprintf(stderr, "%s%s%.1f MB  %.2fM tokens  %.1f s%s", tty_ ? "\r" : "", bar.c_str(), bytes / 1e6,
                     tokens / 1e6, secs, tty_ && !final ? "" : "\n");
    }

private:
    uint64_t total_;
    bool tty_;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point last_print_ = start_;
};

// ---- modes --------------------------------------------------------------------------------------------------

int run_count(const Options& o, const Tokenizer& tok) {
    uint64_t total = 0;
    for (const std::string& path : o.inputs) {
        // Streamed in parts cut by safe_parts, so memory stays bounded; the count is that of the whole text
        // unless the text holds a pathological pre-token piece (see safe_parts).
        TextFileReader reader(path);
        std::string buffer;
        std::vector<int> ids;
        std::vector<size_t> ends;
        uint64_t n = 0, bytes = 0;
        double secs = 0;
        for (bool end = false; !end || !buffer.empty();) {
            if (!end && buffer.size() < kMaxPart + kCutMargin) {
                const size_t old_size = buffer.size(), chunk = size_t(1) << 20;
                buffer.resize(old_size + chunk);
                const size_t got = reader.read(&buffer[old_size], chunk);
                buffer.resize(old_size + got);
                end = got == 0;
                continue;
            }
            if (buffer.size() >= kMaxPart + kCutMargin) tok.safe_parts(buffer, kMaxPart, kPathologicalChunk, ends);
            else ends.assign(1, buffer.size());
            const auto t0 = std::chrono::steady_clock::now();
            for (size_t k = 0; k < ends.size(); ++k) {
                const size_t begin = k == 0 ? 0 : ends[k - 1];
                ids.clear();
                tok.encode_append(std::string_view(buffer).substr(begin, ends[k] - begin), ids);
                n += ids.size();
            }
            secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            bytes += ends.back();
            buffer.erase(0, ends.back());
        }
        std::printf("%llu\t%s\n", static_cast<unsigned long long>(n), path.c_str());
        std::fprintf(stderr, "%s: %llu bytes, %llu tokens, encoded in %.3f s (%.1f MB/s, one thread)\n", path.c_str(),
                     static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(n), secs,
                     secs > 0 ? bytes / secs / 1e6 : 0.0);
        total += n;
    }
    if (o.inputs.size() > 1) std::printf("%llu\ttotal\n", static_cast<unsigned long long>(total));
    return 0;
}

std::string describe_inputs(const std::vector<std::string>& paths) {
    std::string s = paths.empty() ? "none" : paths[0] == "-" ? "stdin" : paths[0];
    if (paths.size() > 1) s += " and " + std::to_string(paths.size() - 1) + " more";
    return s;
}

std::string format_number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// Token: uint16_t or uint32_t, the width of the vocabulary's shards, so a GPT-2 run holds its shards' tokens
// in half the memory.
template <typename Token>
int run_shards(const Options& o, const Tokenizer& tok) {
    install_signal_handlers();
    std::vector<std::string> inputs = o.val_inputs;  // validation-only inputs first
    inputs.insert(inputs.end(), o.inputs.begin(), o.inputs.end());
    DocumentSource source(inputs, o.doc_per_file, tok);  // checks that the inputs exist
    OutputSet output(o.out_prefix);                  // checks that the folder is writable; cleans up dead runs
    SplitWriter<Token> train(output.staging_prefix(), "train", o.shard_size, tok.vocab_size());
    SplitWriter<Token> val(output.staging_prefix(), "val", o.shard_size, tok.vocab_size());
    std::vector<Token> tail;  // --val-last-fraction only: every INPUT token, split at the end
    Progress progress(source.total_bytes());
    // doc_index counts INPUT documents only; val_input_docs those of --val-input files.
    uint64_t docs_total = 0, doc_index = 0, val_input_docs = 0, tokens = 0;
    enum class Destination { kTrain, kVal, kTail } destination = Destination::kTrain;  // the current document's
    // Enough text per batch to keep every thread busy, small enough for a lively progress bar.
    const size_t batch_bytes = std::max<size_t>(size_t(8) << 20, size_t(o.threads) << 20);
    std::vector<Document> docs;
    while (!source.finished()) {
        check_interrupted();
        docs.clear();
        source.next_batch(batch_bytes, docs);
        const std::vector<std::vector<Token>> encoded = encode_documents<Token>(tok, docs, o.threads);
        for (size_t d = 0; d < docs.size(); ++d) {
            const std::vector<Token>& doc = encoded[d];
            tokens += doc.size();
            if (!docs[d].continuation) {  // a new document: choose its split (its later parts follow it)
                ++docs_total;
                if (docs[d].file < o.val_inputs.size()) {
                    destination = Destination::kVal;
                    ++val_input_docs;
                } else {
                    bool is_val = false;
                    switch (o.val_split) {
                        case Options::ValSplit::kNone: break;
                        case Options::ValSplit::kFirstDocs: is_val = doc_index < o.val_docs; break;
                        case Options::ValSplit::kDocFraction:
                            is_val = std::floor((doc_index + 1) * o.val_fraction) > std::floor(doc_index * o.val_fraction);
                            break;
                        case Options::ValSplit::kLastTokens: break;
                    }
                    destination = o.val_split == Options::ValSplit::kLastTokens ? Destination::kTail
                                  : is_val                                      ? Destination::kVal
                                                                                : Destination::kTrain;
                    ++doc_index;
                }
            }
            switch (destination) {
                case Destination::kTrain: train.append(doc.data(), doc.size()); break;
                case Destination::kVal: val.append(doc.data(), doc.size()); break;
                case Destination::kTail: tail.insert(tail.end(), doc.begin(), doc.end()); break;
            }
        }
        progress.update(source.bytes_read(), tokens);
    }
    progress.update(source.bytes_read(), tokens, true);
    check_interrupted();
    if (docs_total == 0) throw std::runtime_error("the input (" + describe_inputs(inputs) + ") holds no documents");
    if (o.val_split == Options::ValSplit::kLastTokens) {
        // Like nanoGPT's split: the first floor((1-F) n) tokens train, the rest validate.
        const size_t cut = static_cast<size_t>(std::floor(tail.size() * (1.0 - o.val_fraction)));
        train.append(tail.data(), cut);
        val.append(tail.data() + cut, tail.size() - cut);
    }
    // An empty split is an error, not a set without training (or requested validation) data.
    const std::string from_inputs = " of the INPUTs (" + describe_inputs(o.inputs) + ")";
    if (train.tokens() == 0) {
        std::string why;
        if (o.inputs.empty()) why = "there are only --val-input files (" + describe_inputs(o.val_inputs) + ")";
        else if (doc_index == 0) why = "the INPUTs (" + describe_inputs(o.inputs) + ") hold no documents";
        else if (o.val_split == Options::ValSplit::kFirstDocs)
            why = "--val-docs " + std::to_string(o.val_docs) + " takes all " + std::to_string(doc_index) +
                  " documents" + from_inputs;
        else if (o.val_split == Options::ValSplit::kLastTokens)
            why = "--val-last-fraction " + format_number(o.val_fraction) + " of the " + std::to_string(tail.size()) +
                  " tokens" + from_inputs + " leaves none for training";
        else why = "no tokens" + from_inputs;
        throw std::runtime_error("the train split is empty: " + why + "; nothing was replaced");
    }
    const bool val_requested = o.val_split != Options::ValSplit::kNone || !o.val_inputs.empty();
    if (val_requested && val.tokens() == 0) {
        std::string why = "no tokens";
        if (o.val_split == Options::ValSplit::kNone)
            why = "the --val-input files (" + describe_inputs(o.val_inputs) + ") hold no documents";
        else if (o.val_split == Options::ValSplit::kDocFraction)
            why = "--val-fraction " + format_number(o.val_fraction) + " chooses none of the " +
                  std::to_string(doc_index) + " documents" + from_inputs;
        if (o.val_split != Options::ValSplit::kNone && !o.val_inputs.empty())
            why += ", and the --val-input files (" + describe_inputs(o.val_inputs) + ") hold none";
        throw std::runtime_error("the validation split is empty: " + why + "; nothing was replaced");
    }
    train.finish();
    val.finish();
    check_interrupted();
    output.commit(train.shards(), val.shards());
    std::fprintf(stderr, "%llu documents: %llu train tokens in %d shard(s) %s_train_*.bin, %llu val tokens in %d "
                 "shard(s) %s_val_*.bin (uint%d tokens)\n", static_cast<unsigned long long>(docs_total),
                 static_cast<unsigned long long>(train.tokens()), train.shards(), o.out_prefix.c_str(),
                 static_cast<unsigned long long>(val.tokens()), val.shards(), o.out_prefix.c_str(),
                 8 * static_cast<int>(sizeof(Token)));
    return 0;
}

// ---- chat data ------------------------------------------------------------------------------------------------

// The tokenizer a chat template goes through: text by its ordinary encoding (special tokens' names in a message stay
// text), special tokens by their added tokens' ids. GPT-2's files (encoder.json, vocab.bpe) have one, <|endoftext|>,
// so they render the plain template; llama3 and chatml need their model's tokenizer.json.
ChatTokenizer chat_tokenizer(const Tokenizer& tok, const std::string& tokenizer_dir) {
    ChatTokenizer t;
    t.encode_text = [&tok](std::string_view text, std::vector<int>& out) { tok.encode_append(text, out); };
    t.special_id = [&tok, tokenizer_dir](const std::string& name) {
        const int id = tok.added_token_id(name);
        if (id < 0)
            throw std::runtime_error("--tokenizer " + tokenizer_dir + ": no special token " + name + " in this tokenizer " +
                                     "(the chat template needs it: llama3 and chatml need their model's tokenizer.json, "
                                     "plain needs <|endoftext|>)");
        return id;
    };
    return t;
}

// One split's chat shards: conversations in windows of T tokens, each shard K windows plus one padding token (a
// window's last target is the next window's first token, and the shard's last window needs one after it), a mask
// shard beside each.
template <typename Token>
class ChatSplitWriter {
public:
    ChatSplitWriter(std::string prefix, std::string split, uint64_t shard_size, int T, int vocab_size, uint32_t pad)
        : prefix_(std::move(prefix)), split_(std::move(split)), windows_per_shard_((shard_size - 1) / T), T_(T),
          vocab_size_(vocab_size), pad_(pad) {}

    // A conversation of at most T tokens: into the next window, padded.
    void append(const TokenizedChat& chat) {
        tokens_.insert(tokens_.end(), chat.tokens.begin(), chat.tokens.end());
        mask_.insert(mask_.end(), chat.mask.begin(), chat.mask.end());
        tokens_.resize(tokens_.size() + (T_ - chat.tokens.size()), static_cast<Token>(pad_));
        mask_.resize(tokens_.size(), 0);
        padding_ += T_ - chat.tokens.size();
        counted_ += chat.counted();
        if (++windows_ == windows_per_shard_) flush();
    }
    void finish() {
        if (windows_ > 0) flush();
    }

    uint64_t conversations() const { return conversations_ + windows_; }
    uint64_t tokens() const { return tokens_written_ + tokens_.size(); }
    uint64_t padding() const { return padding_; }  // window positions after a conversation
    uint64_t counted() const { return counted_; }
    int shards() const { return shards_; }

private:
    void flush() {
        tokens_.push_back(static_cast<Token>(pad_));
        mask_.push_back(0);
        const std::string path = shard_path(prefix_, split_, shards_++);
        write_shard(path, tokens_, vocab_size_);
        write_mask_shard(mask_shard_path(path), mask_, T_);
        tokens_written_ += tokens_.size();
        conversations_ += windows_;
        windows_ = 0;
        tokens_.clear();
        mask_.clear();
    }

    std::string prefix_, split_;
    uint64_t windows_per_shard_;
    size_t T_;
    int vocab_size_;
    uint32_t pad_;
    std::vector<Token> tokens_;
    std::vector<uint8_t> mask_;
    uint64_t windows_ = 0, conversations_ = 0, tokens_written_ = 0, padding_ = 0, counted_ = 0;
    int shards_ = 0;
};

// A JSONL line: the conversation on it, tokenized, or the error that refused it.
struct ChatLine {
    std::string text;
    size_t file;
    uint64_t number;
    TokenizedChat chat;
    std::exception_ptr error;
};

template <typename Token>
int run_chat_shards(const Options& o, const Tokenizer& tok) {
    install_signal_handlers();
    const ChatTokenizer tokenizer = chat_tokenizer(tok, o.tokenizer_dir);
    // the template's special tokens looked up before any input is read: a tokenizer without them stops here
    for (const ChatSegment& s : render_chat({{{ChatMessage::kSystem, ""}, {ChatMessage::kUser, ""}, {ChatMessage::kAssistant, ""}}},
                                            o.chat_template))
        if (s.special) tokenizer.special_id(s.text);
    const uint32_t pad = static_cast<uint32_t>(tokenizer.special_id(chat_padding_token(o.chat_template)));
    std::vector<std::string> inputs = o.val_inputs;  // validation-only inputs first
    inputs.insert(inputs.end(), o.inputs.begin(), o.inputs.end());
    for (const std::string& path : inputs) {  // before the output folder is touched: a missing input changes nothing
        struct stat st;
        if (path != "-" && ::stat(path.c_str(), &st) != 0) throw std::runtime_error(path + ": " + std::strerror(errno));
    }
    OutputSet output(o.out_prefix);
    ChatSplitWriter<Token> train(output.staging_prefix(), "train", o.shard_size, o.seq_len, tok.vocab_size(), pad);
    ChatSplitWriter<Token> val(output.staging_prefix(), "val", o.shard_size, o.seq_len, tok.vocab_size(), pad);
    uint64_t conversations = 0, doc_index = 0, cut = 0, dropped = 0;
    constexpr size_t kBatchLines = 4096;
    std::vector<ChatLine> lines;
    // Lines are parsed and tokenized on all threads a batch at a time; the batch is then taken in line order, so the
    // shards and the first error reported do not depend on the thread count.
    auto process = [&] {
        std::atomic<size_t> next{0};
        auto work = [&] {
            for (size_t i; (i = next++) < lines.size();) {
                ChatLine& l = lines[i];
                try {
                    l.chat = tokenize_chat(render_chat(parse_chat_line(l.text, inputs[l.file], l.number), o.chat_template),
                                           tokenizer, o.chat_loss);
                } catch (...) {
                    l.error = std::current_exception();
                }
            }
        };
        std::vector<std::thread> pool;
        for (int t = 1; t < o.threads; ++t) pool.emplace_back(work);
        work();
        for (auto& t : pool) t.join();
        for (ChatLine& l : lines) {
            if (l.error) std::rethrow_exception(l.error);
            ++conversations;
            bool is_val = l.file < o.val_inputs.size();
            if (!is_val) {
                if (o.val_split == Options::ValSplit::kFirstDocs) is_val = doc_index < o.val_docs;
                if (o.val_split == Options::ValSplit::kDocFraction)
                    is_val = std::floor((doc_index + 1) * o.val_fraction) > std::floor(doc_index * o.val_fraction);
                ++doc_index;
            }
            TokenizedChat& chat = l.chat;
            if (chat.tokens.size() > static_cast<size_t>(o.seq_len)) {  // cut to the window
                ++cut;
                chat.tokens.resize(o.seq_len);
                chat.mask.resize(o.seq_len);
                if (chat.counted() == 0) {  // its answers all lay beyond the window: nothing left to learn
                    ++dropped;
                    continue;
                }
            }
            (is_val ? val : train).append(chat);
        }
        lines.clear();
    };
    for (size_t f = 0; f < inputs.size(); ++f) {
        TextFileReader reader(inputs[f]);
        std::string buffer;
        uint64_t line_number = 0;
        for (bool end = false; !end;) {
            check_interrupted();
            const size_t old_size = buffer.size(), chunk = size_t(1) << 20;
            buffer.resize(old_size + chunk);
            const size_t got = reader.read(&buffer[old_size], chunk);
            buffer.resize(old_size + got);
            end = got == 0;
            size_t begin = 0;
            for (size_t eol; (eol = buffer.find('\n', begin)) != std::string::npos || (end && begin < buffer.size()); begin = eol + 1) {
                if (eol == std::string::npos) eol = buffer.size();  // the last line, without a newline
                ++line_number;
                const std::string_view line(buffer.data() + begin, eol - begin);
                if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines hold nothing
                lines.push_back({std::string(line), f, line_number, {}, nullptr});
                if (lines.size() == kBatchLines) process();
            }
            buffer.erase(0, std::min(begin, buffer.size()));
        }
    }
    process();
    check_interrupted();
    if (train.conversations() == 0)
        throw std::runtime_error("the train split is empty: " + std::to_string(conversations) + " conversations in " +
                                 describe_inputs(inputs) + (dropped > 0 ? " (" + std::to_string(dropped) + " dropped)" : "") +
                                 ", none for training; nothing was replaced");
    const bool val_requested = o.val_split != Options::ValSplit::kNone || !o.val_inputs.empty();
    if (val_requested && val.conversations() == 0)
        throw std::runtime_error("the validation split is empty: no conversation of " + describe_inputs(inputs) +
                                 " went to it; nothing was replaced");
    train.finish();
    val.finish();
    check_interrupted();
    output.commit(train.shards(), val.shards(), true);
    const uint64_t windows = train.conversations() + val.conversations();
    const uint64_t padding = train.padding() + val.padding();
    std::fprintf(stderr, "%llu conversations (%s template, %s tokens counted): %llu cut to the window of %d tokens, "
                 "%llu of them dropped (no counted token left in the window)\n", static_cast<unsigned long long>(conversations),
                 chat_template_name(o.chat_template), o.chat_loss == ChatLoss::kAllTokens ? "all" : "the assistant's",
                 static_cast<unsigned long long>(cut), o.seq_len, static_cast<unsigned long long>(dropped));
    std::fprintf(stderr, "train: %llu conversations, %llu tokens (%llu counted) in %d shard(s) %s_train_*.bin; val: %llu "
                 "conversations, %llu tokens (%llu counted) in %d shard(s) %s_val_*.bin; masks beside them (*.bin.mask)\n",
                 static_cast<unsigned long long>(train.conversations()), static_cast<unsigned long long>(train.tokens()),
                 static_cast<unsigned long long>(train.counted()), train.shards(), o.out_prefix.c_str(),
                 static_cast<unsigned long long>(val.conversations()), static_cast<unsigned long long>(val.tokens()),
                 static_cast<unsigned long long>(val.counted()), val.shards(), o.out_prefix.c_str());
    std::fprintf(stderr, "padding: %llu of the %llu window positions (%.1f%%)\n", static_cast<unsigned long long>(padding),
                 static_cast<unsigned long long>(windows * o.seq_len), 100.0 * padding / (double(windows) * o.seq_len));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = parse_args(argc, argv);
        Tokenizer tok = Tokenizer::load(o.tokenizer_dir);
        if (!o.eot_token.empty()) {
            if (tok.added_token_id(o.eot_token) < 0) throw UsageError("--eot " + o.eot_token + ": not an added token of " + o.tokenizer_dir);
            tok.set_eot(o.eot_token);
        }
        if (o.count) return run_count(o, tok);
        if (tok.eot() < 0 && !o.chat)
            throw UsageError("--tokenizer " + o.tokenizer_dir + " names no end-of-text token to start each document with: name one of its added tokens with --eot");
        if (o.chat) return shard_token_bytes(tok.vocab_size()) == 2 ? run_chat_shards<uint16_t>(o, tok) : run_chat_shards<uint32_t>(o, tok);
        return shard_token_bytes(tok.vocab_size()) == 2 ? run_shards<uint16_t>(o, tok) : run_shards<uint32_t>(o, tok);
    } catch (const UsageError& e) {
        print_error(std::string("prepare_shards: ") + e.what() + " (see --help)");
    } catch (const Interrupted& e) {
        print_error(std::string("prepare_shards: ") + e.what());
        return 128 + e.signal;
    } catch (const std::exception& e) {
        print_error(std::string("prepare_shards: ") + e.what());
    }
    return 1;
}
