// prepare_shards: tokenizes text files into llm.c token shards (an offline job, hence its own small binary
// rather than part of the trainer).
//
// Each document becomes <|endoftext|> followed by its GPT-2 tokens (the llm.c / nanoGPT convention: every
// document starts with EOT). Documents are whole files (--doc-per-file) or the pieces of a file between
// literal "<|endoftext|>" separators; empty pieces are skipped, and a file's end also ends a document.
// Input "-" is stdin, so a script can stream documents in (scripts/prepare_fineweb.py does).
// Documents are read in batches and encoded in parallel on all cores; the output is assembled in document
// order, so it does not depend on the thread count. Output: PREFIX_val_000000.bin, ... and
// PREFIX_train_000000.bin, ... Shards left over from an earlier run with the same prefix and a higher
// index are removed, so the prefix's shard set is exactly this run's.
//
// `--count FILE...` instead prints each file's plain token count (tiktoken's encode_ordinary, no EOTs) and
// the single-thread encode speed.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "shards.h"
#include "text_reader.h"
#include "tokenizer.h"

namespace {

const char* kUsage = R"(usage: prepare_shards [options] --out PREFIX INPUT...
       prepare_shards --count FILE...

Tokenizes text (plain or .xz; "-" is stdin) into llm.c token shards PREFIX_val_NNNNNN.bin and
PREFIX_train_NNNNNN.bin. Every document starts with the <|endoftext|> token.

  --out PREFIX           output path prefix, e.g. data/gutenberg/gutenberg
  --tokenizer DIR        directory holding encoder.json and vocab.bpe (default: data/gpt2)
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
  -h, --help             show this help
)";

struct Options {
    std::vector<std::string> val_inputs;  // wholly validation
    std::vector<std::string> inputs;
    std::string out_prefix;
    std::string tokenizer_dir = "data/gpt2";
    bool doc_per_file = false;
    uint64_t shard_size = 100000000;
    enum class ValSplit { kNone, kFirstDocs, kDocFraction, kLastTokens } val_split = ValSplit::kNone;
    uint64_t val_docs = 0;
    double val_fraction = 0;
    int threads = 0;
    bool count = false;
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
    if (o.threads == 0) o.threads = std::max(1u, std::thread::hardware_concurrency());
    return o;
}

// ---- reading documents ------------------------------------------------------------------------------------

struct Document {
    std::string text;
    size_t file;  // index of the input it came from
};

class DocumentSource {
public:
    DocumentSource(const std::vector<std::string>& inputs, bool doc_per_file)
        : inputs_(inputs), doc_per_file_(doc_per_file) {
        for (const std::string& path : inputs_) {
            if (path == "-") continue;  // stdin: size unknown
            struct stat st;
            if (::stat(path.c_str(), &st) != 0) throw std::runtime_error(path + ": " + std::strerror(errno));
            if (S_ISDIR(st.st_mode)) throw std::runtime_error(path + ": is a directory");
            if (S_ISREG(st.st_mode)) total_bytes_ += static_cast<uint64_t>(st.st_size);  // not pipes
        }
    }

    // Appends whole documents to `docs` until they hold at least `min_bytes` of text or the input ends.
    void next_batch(size_t min_bytes, std::vector<Document>& docs) {
        size_t bytes = 0;
        auto emit = [&](size_t begin, size_t end) {
            if (end == begin) return;  // empty documents (e.g. after a trailing separator) are skipped
            docs.push_back({buffer_.substr(begin, end - begin), next_file_ - 1});
            bytes += end - begin;
        };
        while (bytes < min_bytes) {
            if (!reader_) {
                if (next_file_ == inputs_.size()) return;
                reader_ = std::make_unique<TextFileReader>(inputs_[next_file_++]);
                buffer_.clear();
                begin_ = search_ = 0;
            }
            if (!doc_per_file_) {
                size_t at = buffer_.find(kSeparator, search_);
                if (at != std::string::npos) {
                    emit(begin_, at);
                    begin_ = search_ = at + kSeparatorLength;
                    continue;
                }
                // A separator may straddle the next read: resume the search just before the end.
                search_ = std::max(begin_, buffer_.size() - std::min(buffer_.size(), kSeparatorLength - 1));
            }
            buffer_.erase(0, begin_);
            search_ -= begin_;
            begin_ = 0;
            const size_t old_size = buffer_.size();
            buffer_.resize(old_size + kChunk);
            const size_t got = reader_->read(&buffer_[old_size], kChunk);
            buffer_.resize(old_size + got);
            if (got == 0) {  // end of file: the rest is the last document
                emit(0, buffer_.size());
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
    size_t next_file_ = 0;
    std::unique_ptr<TextFileReader> reader_;
    std::string buffer_;  // unconsumed text of the current file starts at begin_
    size_t begin_ = 0, search_ = 0;
    uint64_t total_bytes_ = 0, done_bytes_ = 0;
};

// ---- encoding -------------------------------------------------------------------------------------------

// EOT + tokens of every document, encoded on `threads` threads; result i belongs to docs[i].
std::vector<std::vector<uint16_t>> encode_documents(const GPT2Tokenizer& tok, const std::vector<Document>& docs,
                                                    int threads) {
    std::vector<std::vector<uint16_t>> out(docs.size());
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
                out[i].push_back(static_cast<uint16_t>(tok.eot()));
                for (int id : ids) out[i].push_back(static_cast<uint16_t>(id));  // GPT-2 ids fit in uint16
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

// ---- writing ----------------------------------------------------------------------------------------------

std::string shard_path(const std::string& prefix, const std::string& split, int index) {
    char number[16];
    std::snprintf(number, sizeof number, "%06d", index);
    return prefix + "_" + split + "_" + number + ".bin";
}

// One split's shard sequence: full shards are written as they fill, the remainder by finish().
class SplitWriter {
public:
    SplitWriter(std::string prefix, std::string split, uint64_t shard_size)
        : prefix_(std::move(prefix)), split_(std::move(split)), shard_size_(shard_size) {}

    void append(const uint16_t* tokens, size_t n) {
        while (n > 0) {
            const size_t take = std::min<size_t>(n, shard_size_ - buffer_.size());
            buffer_.insert(buffer_.end(), tokens, tokens + take);
            tokens += take, n -= take;
            if (buffer_.size() == shard_size_) flush();
        }
    }

    void finish() {
        if (!buffer_.empty()) flush();
        int stale = 0;  // shards of an earlier, longer run with this prefix
        while (::unlink(shard_path(prefix_, split_, shards_ + stale).c_str()) == 0) ++stale;
        if (stale > 0) std::fprintf(stderr, "removed %d stale shard(s) %s from an earlier run\n", stale, pattern().c_str());
    }

    uint64_t tokens() const { return tokens_; }
    int shards() const { return shards_; }
    std::string pattern() const { return prefix_ + "_" + split_ + "_*.bin"; }

private:
    void flush() {
        write_shard(shard_path(prefix_, split_, shards_++), buffer_);
        tokens_ += buffer_.size();
        buffer_.clear();
    }

    std::string prefix_, split_;
    uint64_t shard_size_;
    std::vector<uint16_t> buffer_;
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

int run_count(const Options& o, const GPT2Tokenizer& tok) {
    uint64_t total = 0;
    for (const std::string& path : o.inputs) {
        const std::string text = read_text_file(path);
        const auto t0 = std::chrono::steady_clock::now();
        const size_t n = tok.encode(text).size();
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%zu\t%s\n", n, path.c_str());
        std::fprintf(stderr, "%s: %zu bytes, %zu tokens, encoded in %.3f s (%.1f MB/s, one thread)\n", path.c_str(),
                     text.size(), n, secs, secs > 0 ? text.size() / secs / 1e6 : 0.0);
        total += n;
    }
    if (o.inputs.size() > 1) std::printf("%llu\ttotal\n", static_cast<unsigned long long>(total));
    return 0;
}

void check_output_directory(const std::string& prefix) {
    const size_t slash = prefix.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : prefix.substr(0, slash);
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        throw std::runtime_error("output directory " + dir + " does not exist (from --out " + prefix + ")");
}

int run_shards(const Options& o, const GPT2Tokenizer& tok) {
    check_output_directory(o.out_prefix);
    std::vector<std::string> inputs = o.val_inputs;  // validation-only inputs first
    inputs.insert(inputs.end(), o.inputs.begin(), o.inputs.end());
    DocumentSource source(inputs, o.doc_per_file);
    SplitWriter train(o.out_prefix, "train", o.shard_size), val(o.out_prefix, "val", o.shard_size);
    std::vector<uint16_t> tail;  // --val-last-fraction only: every INPUT token, split at the end
    Progress progress(source.total_bytes());
    uint64_t docs_total = 0, doc_index = 0, tokens = 0;  // doc_index counts INPUT documents only
    // Enough text per batch to keep every thread busy, small enough for a lively progress bar.
    const size_t batch_bytes = std::max<size_t>(size_t(8) << 20, size_t(o.threads) << 20);
    std::vector<Document> docs;
    while (!source.finished()) {
        docs.clear();
        source.next_batch(batch_bytes, docs);
        const std::vector<std::vector<uint16_t>> encoded = encode_documents(tok, docs, o.threads);
        for (size_t d = 0; d < docs.size(); ++d) {
            const std::vector<uint16_t>& doc = encoded[d];
            tokens += doc.size();
            ++docs_total;
            if (docs[d].file < o.val_inputs.size()) {
                val.append(doc.data(), doc.size());
                continue;
            }
            bool is_val = false;
            switch (o.val_split) {
                case Options::ValSplit::kNone: break;
                case Options::ValSplit::kFirstDocs: is_val = doc_index < o.val_docs; break;
                case Options::ValSplit::kDocFraction:
                    is_val = std::floor((doc_index + 1) * o.val_fraction) > std::floor(doc_index * o.val_fraction);
                    break;
                case Options::ValSplit::kLastTokens: tail.insert(tail.end(), doc.begin(), doc.end()); break;
            }
            if (o.val_split != Options::ValSplit::kLastTokens) (is_val ? val : train).append(doc.data(), doc.size());
            ++doc_index;
        }
        progress.update(source.bytes_read(), tokens);
    }
    progress.update(source.bytes_read(), tokens, true);
    if (docs_total == 0) throw std::runtime_error("the input holds no documents");
    if (o.val_split == Options::ValSplit::kLastTokens) {
        // Like nanoGPT's split: the first floor((1-F) n) tokens train, the rest validate.
        const size_t cut = static_cast<size_t>(std::floor(tail.size() * (1.0 - o.val_fraction)));
        train.append(tail.data(), cut);
        val.append(tail.data() + cut, tail.size() - cut);
    }
    train.finish();
    val.finish();
    std::fprintf(stderr, "%llu documents: %llu train tokens in %d shard(s) %s, %llu val tokens in %d shard(s) %s\n",
                 static_cast<unsigned long long>(docs_total), static_cast<unsigned long long>(train.tokens()),
                 train.shards(), train.pattern().c_str(), static_cast<unsigned long long>(val.tokens()), val.shards(),
                 val.pattern().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = parse_args(argc, argv);
        const GPT2Tokenizer tok = GPT2Tokenizer::load(o.tokenizer_dir);
        return o.count ? run_count(o, tok) : run_shards(o, tok);
    } catch (const UsageError& e) {
        std::fprintf(stderr, "prepare_shards: %s (see --help)\n", e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "prepare_shards: %s\n", e.what());
    }
    return 1;
}
