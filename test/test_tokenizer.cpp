// Tests for the tokenizer (dataloader/tokenizer.*). GPT-2's files: the fixture suite in
// test/fixtures/tokenizer_cases.txt, exact token counts of tinyshakespeare and Gutenberg val, decode/encode
// round trips, the safe cuts of long texts, thread safety of the piece cache, the llm.c tokenizer file. tokenizer.json:
// GPT-2's files converted (test/tools/make_tokenizer_json.py) encode as the originals; the same vocabulary with each
// other pattern, digits, NFC, ignore_merges and added tokens: pieces where the pattern puts them, round trips of
// data/'s texts, safe cuts, added tokens, bos/eot; the parity fixtures of the `tokenizers` library
// (test/fixtures/tokenizer_json/, SKIP until made); and each refusal of a file we do not read, in one line.
//
// Run from the repository root. Shared corpora are found in $SHARED_DATA or ../shared/data; checks that need
// them SKIP when absent. Prints one PASS/FAIL/SKIP line per check (test/check.h); exits 1 on any FAIL.
//
// build/test_tokenizer --bench TOKENIZER FILE [THREADS]: encodes FILE with TOKENIZER (a tokenizer.json or a folder)
// on one thread and on THREADS (default: all cores), cut where safe_parts says, and prints MB/s.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "../dataloader/text_reader.h"
#include "../dataloader/tokenizer.h"
#include "check.h"

namespace {

std::string shared_data_dir() {
    const char* env = std::getenv("SHARED_DATA");
    return env && *env ? env : "../shared/data";
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (;;) {
        size_t at = s.find(sep, start);
        parts.push_back(s.substr(start, at - start));
        if (at == std::string::npos) return parts;
        start = at + 1;
    }
}

std::vector<int> parse_ids(const std::string& s) {
    std::vector<int> ids;
    std::istringstream in(s);
    int id;
    while (in >> id) ids.push_back(id);
    return ids;
}

std::string from_hex(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return out;
}

std::string ids_text(const std::vector<int>& ids, size_t from, size_t count) {
    std::string s;
    for (size_t i = from; i < ids.size() && i < from + count; ++i) s += (s.empty() ? "" : " ") + std::to_string(ids[i]);
    return s;
}

std::string first_difference(const std::vector<int>& got, const std::vector<int>& want) {
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    return "at index " + std::to_string(i) + ": got [" + ids_text(got, i, 8) + "] want [" + ids_text(want, i, 8) +
           "] (lengths " + std::to_string(got.size()) + " vs " + std::to_string(want.size()) + ")";
}

std::vector<int> encode_mode(const Tokenizer& tok, const std::string& mode, const std::string& text) {
    if (mode == "ordinary") return tok.encode(text);
    if (mode == "special") return tok.encode_with_special(text);
    throw std::runtime_error("unknown fixture mode " + mode);
}

struct Corpus {
    std::string spec, mode;
    size_t count;
    long long sum;
    std::vector<int> first, last;
};

// Fixture cases and corpus lines (the format is described in test/tools/make_tokenizer_fixtures.py); `texts` gets
// the cases' inputs.
void run_fixtures(const Tokenizer& tok, std::vector<Corpus>& corpora, std::vector<std::string>& texts) {
    const std::string path = "test/fixtures/tokenizer_cases.txt";
    std::ifstream in(path);
    if (!in) {
        fail("fixtures", path + ": cannot open (run from the repository root)");
        return;
    }
    std::string line;
    int cases = 0;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::vector<std::string> f = split(line, '\t');
        if (f[0] == "case" && f.size() == 5) {
            ++cases;
            const std::string name = "case/" + f[1];
            guarded(name, [&] {
                const std::string input = from_hex(f[3]);
                texts.push_back(input);
                std::vector<int> want = parse_ids(f[4]), got = encode_mode(tok, f[2], input);
                if (got != want) return fail(name, first_difference(got, want));
                std::string back = tok.decode(got);
                expect(back == input, name, "decode(encode(x)) != x");
            });
        } else if (f[0] == "corpus" && f.size() == 7) {
            corpora.push_back({f[1], f[2], std::stoul(f[3]), std::stoll(f[4]), parse_ids(f[5]), parse_ids(f[6])});
        } else {
            fail("fixtures", path + ": malformed line: " + line.substr(0, 60));
        }
    }
    expect(cases >= 50, "fixtures_present", path + " has only " + std::to_string(cases) + " cases");
}

void run_corpus(const Tokenizer& tok, const Corpus& c, size_t exact_count) {
    const std::string name = "corpus/" + c.spec;
    const size_t colon = c.spec.find(':');
    const std::string where = c.spec.substr(0, colon), rel = c.spec.substr(colon + 1);
    const std::string path = (where == "shared" ? shared_data_dir() + "/" : std::string()) + rel;
    if (!file_exists(path)) return skip(name, path + " not found (set SHARED_DATA)");
    guarded(name, [&] {
        const std::string text = read_text_file(path);
        std::vector<int> ids = encode_mode(tok, c.mode, text);
        long long sum = 0;
        for (int id : ids) sum += id;
        std::vector<int> first(ids.begin(), ids.begin() + std::min<size_t>(50, ids.size()));
        std::vector<int> last(ids.end() - std::min<size_t>(50, ids.size()), ids.end());
        if (exact_count) {
            expect(ids.size() == exact_count, name + "/count_" + std::to_string(exact_count),
                   "got " + std::to_string(ids.size()) + " tokens");
        }
        expect(ids.size() == c.count && sum == c.sum && first == c.first && last == c.last, name + "/fixture",
               "got count " + std::to_string(ids.size()) + " sum " + std::to_string(sum) + ", fixture has " +
                  std::to_string(c.count) + " / " + std::to_string(c.sum));
        expect(tok.decode(ids) == text, name + "/round_trip", "decode(encode(text)) != text");
    });
}

// prepare_shards encodes a long document in parts cut where safe_parts says no pre-token piece spans the cut (not
// after white space, which may belong to the next word; not inside a contraction): at every limit in every fixture
// case, a cut it calls safe must give the whole text's tokens.
void run_safe_parts(const Tokenizer& tok, const std::vector<std::string>& texts, const std::string& name) {
    guarded(name, [&] {
        int cuts = 0;
        std::string problem;
        for (const std::string& text : texts) {
            const std::vector<int> whole = tok.encode(text);
            for (size_t limit = 8; limit + 4 <= text.size() && problem.empty(); ++limit) {
                std::vector<size_t> ends;
                tok.safe_parts(text, limit, 1, ends);  // one-byte chunks: a single part is a safe cut
                if (ends.size() != 1) continue;
                ++cuts;
                std::vector<int> parts = tok.encode(std::string_view(text).substr(0, ends[0]));
                tok.encode_append(std::string_view(text).substr(ends[0]), parts);
                if (parts != whole)
                    problem = "cut at byte " + std::to_string(ends[0]) + " of \"" + text.substr(0, 40) + "\": " + first_difference(parts, whole);
            }
        }
        check(problem.empty() && cuts > 0, name, problem.empty() ? std::to_string(cuts) + " safe cuts" : problem);
    });
}

// The piece cache is per thread; concurrent encoders must agree with a single-threaded run.
void run_threads(const Tokenizer& tok) {
    guarded("threads_agree", [&] {
        const std::string text = read_text_file("data/tinyshakespeare/input.txt");
        const std::vector<int> want = tok.encode(text);
        std::vector<std::vector<int>> got(3);
        std::vector<std::thread> threads;
        for (size_t i = 0; i < got.size(); ++i) threads.emplace_back([&, i] { got[i] = tok.encode(text); });
        for (auto& t : threads) t.join();
        bool ok = true;
        for (const auto& g : got) ok = ok && g == want;
        expect(ok, "threads_agree", "a thread's encoding differs from the single-threaded one");
    });
}

void write_bytes(const std::string& path, const std::string& data) {
    std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::string llmc_header(uint32_t magic, uint32_t version, uint32_t vocab, uint32_t eot) {
    uint32_t h[256] = {};
    h[0] = magic, h[1] = version, h[2] = vocab, h[3] = eot;
    return std::string(reinterpret_cast<const char*>(h), sizeof h);
}

// Expects load_llmc(path) to throw with a message containing `needle`.
void expect_llmc_error(const std::string& name, const std::string& path, const std::string& needle) {
    try {
        TokenDecoder::load_llmc(path);
        fail(name, "no error");
    } catch (const std::exception& e) {
        std::string msg = e.what();
        expect(msg.find(needle) != std::string::npos && msg.find(path) != std::string::npos, name,
               "message \"" + msg + "\" lacks \"" + needle + "\" or the path");
    }
}

void run_llmc_file(const Tokenizer& tok) {
    char dir_template[] = "/tmp/test_tokenizer_XXXXXX";
    if (!::mkdtemp(dir_template)) return fail("llmc_file", "mkdtemp failed");
    const std::string dir = dir_template;
    const std::string path = dir + "/gpt2_tokenizer.bin";
    guarded("llmc_round_trip", [&] {
        tok.decoder().save_llmc(path);
        TokenDecoder back = TokenDecoder::load_llmc(path);
        bool same = back.vocab_size() == tok.vocab_size() && back.eot() == tok.eot();
        for (int i = 0; same && i < tok.vocab_size(); ++i) same = back.decode_token(i) == tok.decode_token(i);
        expect(same, "llmc_round_trip", "tokens, vocab size or eot differ after save/load");
    });
    guarded("llmc_version1", [&] {
        // Version 1 has no eot field; GPT-2's 50256 is implied (here: a 50257-token vocabulary of "x"s).
        std::string data = llmc_header(20240328, 1, 50257, 0);
        for (int i = 0; i < 50257; ++i) data += std::string("\x01x", 2);
        write_bytes(path, data);
        TokenDecoder v1 = TokenDecoder::load_llmc(path);
        expect(v1.vocab_size() == 50257 && v1.eot() == 50256 && v1.decode({0, 1}) == "xx", "llmc_version1",
               "vocab/eot/decode wrong");
    });
    write_bytes(path, llmc_header(20240326, 2, 2, 1) + std::string("\x01" "a\x01" "b", 4));
    expect_llmc_error("llmc_bad_magic", path, "bad magic");
    write_bytes(path, llmc_header(20240328, 3, 2, 1) + std::string("\x01" "a\x01" "b", 4));
    expect_llmc_error("llmc_bad_version", path, "version");
    write_bytes(path, llmc_header(20240328, 2, 3, 1) + std::string("\x01" "a\x01" "b", 4));
    expect_llmc_error("llmc_truncated", path, "truncated");
    write_bytes(path, std::string(100, '\0'));
    expect_llmc_error("llmc_short_header", path, "too short");
    expect_llmc_error("llmc_missing", dir + "/nonexistent.bin", "cannot open");
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
}

void run_misc(const Tokenizer& tok) {
    guarded("special_only_when_asked", [&] {
        const std::string text = "a<|endoftext|>b";
        std::vector<int> ordinary = tok.encode(text), special = tok.encode_with_special(text);
        expect(special == std::vector<int>{tok.encode("a")[0], 50256, tok.encode("b")[0]} && ordinary.size() > 3,
               "special_only_when_asked", "got " + ids_text(special, 0, 10) + " / " + ids_text(ordinary, 0, 10));
    });
    guarded("decode_range_check", [&] {
        try {
            tok.decode({50257});
            fail("decode_range_check", "no error for id 50257");
        } catch (const std::out_of_range&) {
            pass("decode_range_check");
        }
    });
    try {
        Tokenizer::load("/nonexistent_dir");
        fail("load_missing_dir", "no error");
    } catch (const std::exception& e) {
        expect(std::string(e.what()).find("/nonexistent_dir: cannot open") != std::string::npos, "load_missing_dir",
               e.what());
    }
}

// ---- tokenizer.json -------------------------------------------------------------------------------------

// A scratch folder for the tokenizer.json files written here, removed at exit.
const std::string& scratch_dir() {
    static const std::string dir = [] {
        char dir_template[] = "/tmp/test_tokenizer_json_XXXXXX";
        if (!::mkdtemp(dir_template)) throw std::runtime_error("mkdtemp failed");
        static std::string removed = dir_template;
        std::atexit([] { std::system(("rm -rf '" + removed + "'").c_str()); });
        return std::string(dir_template);
    }();
    return dir;
}

// Writes GPT-2's vocabulary as a tokenizer.json with test/tools/make_tokenizer_json.py OPTIONS; "" if python3 fails.
std::string converted_gpt2(const std::string& name, const std::string& options) {
    const std::string path = scratch_dir() + "/" + name + ".json";
    const std::string command = "python3 test/tools/make_tokenizer_json.py --out " + path + " " + options;
    return std::system(command.c_str()) == 0 ? path : "";
}

// Texts for the round trips: data/'s texts (hellaswag's decompressed), and the fixture cases' inputs.
std::vector<std::pair<std::string, std::string>> data_texts() {
    std::vector<std::pair<std::string, std::string>> texts;
    for (const char* path : {"data/tinyshakespeare/input.txt", "data/tinyshakespeare/README.md", "data/gpt2/README.md",
                             "data/gpt2/LICENSE", "data/hellaswag/README.md", "data/hellaswag/hellaswag_val.jsonl.xz"})
        if (file_exists(path)) texts.emplace_back(path, read_text_file(path));
    return texts;
}

// GPT-2's files converted to tokenizer.json (merges as strings, and as pairs) must encode and decode as the
// originals: every fixture case and tinyshakespeare, ordinary and with the special token.
void run_gpt2_json(const Tokenizer& gpt2, const std::vector<std::string>& texts) {
    const std::string shakespeare = read_text_file("data/tinyshakespeare/input.txt");
    for (const char* variant : {"strings", "pairs"}) {
        const std::string name = std::string("gpt2_json_") + variant;
        const std::string path = converted_gpt2(name, variant == std::string("pairs") ? "--merge-pairs" : "");
        if (path.empty()) return skip(name, "python3 test/tools/make_tokenizer_json.py failed (is python3 installed?)");
        guarded(name, [&] {
            const Tokenizer tok = Tokenizer::load(path);
            std::string problem;
            if (tok.vocab_size() != gpt2.vocab_size() || tok.eot() != gpt2.eot() || tok.bos() != -1)
                problem = "vocab " + std::to_string(tok.vocab_size()) + " eot " + std::to_string(tok.eot()) + " bos " + std::to_string(tok.bos());
            for (int id = 0; problem.empty() && id < tok.vocab_size(); ++id)
                if (tok.decode_token(id) != gpt2.decode_token(id)) problem = "token " + std::to_string(id) + " decodes differently";
            std::vector<std::string> all = texts;
            all.push_back(shakespeare);
            for (const std::string& text : all) {
                if (!problem.empty()) break;
                if (tok.encode(text) != gpt2.encode(text))
                    problem = "encode(\"" + text.substr(0, 30) + "\"): " + first_difference(tok.encode(text), gpt2.encode(text));
                else if (tok.encode_with_special(text) != gpt2.encode_with_special(text))
                    problem = "encode_with_special(\"" + text.substr(0, 30) + "\") differs";
            }
            expect(problem.empty(), name, problem);
        });
    }
}

// The pieces quoted, control characters as \xNN (a check line is one line).
std::string quoted_pieces(const std::vector<std::string>& pieces) {
    std::string s;
    for (const std::string& p : pieces) {
        s += s.empty() ? "\"" : " \"";
        for (unsigned char c : p) {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02X", c);
            s += c < 0x20 ? std::string(hex) : std::string(1, static_cast<char>(c));
        }
        s += "\"";
    }
    return s;
}

struct Variant {
    const char* name;
    const char* options;
    SplitPattern pattern;
    DigitSplit digits;
    bool nfc;
};
const Variant kVariants[] = {
    {"llama3", "--pattern llama3 --ignore-merges --merge-pairs --special '<|begin_of_text|>' --special '<|end_of_text|>' "
               "--special '<|eot_id|>' --template-bos '<|begin_of_text|>'", SplitPattern::kLlama3, DigitSplit::kNone, false},
    {"qwen2", "--pattern qwen2 --nfc --special '<|im_start|>' --special '<|im_end|>' --added '<tool_call>'",
     SplitPattern::kQwen2, DigitSplit::kNone, true},
    {"smollm2", "--digits individual --special '<|im_start|>'", SplitPattern::kGpt2, DigitSplit::kIndividual, false},
    {"digit_runs", "--pattern llama3 --digits runs", SplitPattern::kLlama3, DigitSplit::kRuns, false},
    {"tekken", "--pattern tekken --special '<s>' --special '</s>' --special '[INST]'", SplitPattern::kTekken, DigitSplit::kNone, false},
};

// Where each pattern puts its pieces, written from the patterns' regex semantics: the contractions' case folding, digit groups, the punctuation prefix of
// words, line breaks after punctuation, white-space backtracking, Tekken's case splits and marks.
struct PieceCase {
    const char* variant;
    std::string text;
    std::vector<std::string> pieces;
};
const std::vector<PieceCase> kPieceCases = {
    {"llama3", "I'M here", {"I", "'M", " here"}},
    {"llama3", "we'LL go'S", {"we", "'LL", " go", "'S"}},
    {"llama3", "x'\xC5\xBFx", {"x", "'\xC5\xBF", "x"}},  // U+017F folds to s
    {"llama3", "1234567", {"123", "456", "7"}},
    {"llama3", ",word", {",word"}},
    {"llama3", "!!\n\nabc", {"!!\n\n", "abc"}},
    {"llama3", "a  \n  b", {"a", "  \n", " ", " b"}},
    {"llama3", "\tword  ", {"\tword", "  "}},
    {"qwen2", "1234", {"1", "2", "3", "4"}},
    {"qwen2", "it'S 99", {"it", "'S", " ", "9", "9"}},
    {"smollm2", "abc 123def", {"abc", " ", "1", "2", "3", "def"}},
    {"digit_runs", "a12345b", {"a", "123", "45", "b"}},
    {"tekken", "HelloWorld", {"Hello", "World"}},
    {"tekken", "helloWORLD", {"hello", "WORLD"}},
    {"tekken", "ABCdef it's", {"ABCdef", " it", "'s"}},
    {"tekken", "a/b//\n/", {"a", "/b", "//\n/"}},
    {"tekken", "12", {"1", "2"}},
    {"tekken", "e\xCC\x81x \xCC\x81", {"e\xCC\x81x", " \xCC\x81"}},
};

void run_variants(const std::vector<std::string>& texts) {
    const auto data = data_texts();
    for (const Variant& v : kVariants) {
        const std::string name = std::string("json_") + v.name;
        const std::string path = converted_gpt2(v.name, v.options);
        if (path.empty()) {
            skip(name, "python3 test/tools/make_tokenizer_json.py failed (is python3 installed?)");
            continue;
        }
        guarded(name, [&] {
            const Tokenizer tok = Tokenizer::load(path);
            expect(tok.pattern() == v.pattern && tok.digit_split() == v.digits && tok.normalizes_nfc() == v.nfc,
                   name + "/read", "pattern, digits or normalizer not as written");
            for (size_t k = 0; k < kPieceCases.size(); ++k) {
                const PieceCase& c = kPieceCases[k];
                if (c.variant != std::string(v.name)) continue;
                const std::vector<std::string> got = tok.pre_tokenize(c.text);
                expect(got == c.pieces, name + "/pieces_" + std::to_string(k), "got " + quoted_pieces(got) + ", want " + quoted_pieces(c.pieces));
            }
            std::string problem;
            for (const auto& [where, text] : data) {
                if (problem.empty() && tok.decode(tok.encode(text)) != text) problem = where + ": decode(encode(x)) != x";
                if (problem.empty() && tok.decode(tok.encode_with_special(text)) != text) problem = where + ": with special tokens";
            }
            for (const std::string& text : texts)
                if (problem.empty() && !v.nfc && tok.decode(tok.encode(text)) != text) problem = "case \"" + text.substr(0, 30) + "\"";
            expect(problem.empty(), name + "/round_trip_data", problem);
            run_safe_parts(tok, texts, name + "/safe_parts_keep_tokens");
        });
    }
}

// Added tokens, bos/eot, NFC and ignore_merges, on the variants above and a tiny vocabulary.
void run_added_tokens() {
    guarded("json_llama3/special_tokens", [&] {
        const Tokenizer tok = Tokenizer::load(scratch_dir() + "/llama3.json");
        const int begin = tok.added_token_id("<|begin_of_text|>"), end = tok.added_token_id("<|end_of_text|>");
        const std::string text = "<|begin_of_text|>Hi<|eot_id|>";
        const std::vector<int> special = tok.encode_with_special(text), ordinary = tok.encode(text);
        expect(begin == 50257 && tok.bos() == begin && tok.eot() == 50256 &&
                   special == std::vector<int>{begin, tok.encode("Hi")[0], tok.added_token_id("<|eot_id|>")} &&
                   ordinary.size() > 5 && tok.decode(special) == text && tok.decode(ordinary) == text,
               "json_llama3/special_tokens", "bos " + std::to_string(tok.bos()) + " eot " + std::to_string(tok.eot()) +
                   " special [" + ids_text(special, 0, 8) + "]");
        Tokenizer chosen = tok;
        chosen.set_eot("<|end_of_text|>");
        expect(chosen.eot() == end && chosen.decoder().eot() == end, "json_llama3/set_eot", std::to_string(chosen.eot()));
    });
    guarded("end_tokens", [&] {
        // where generation stops: generation_config.json's eos_token_id (an id or a list), else eot() and the
        // end-of-turn tokens the vocabulary has
        const Tokenizer tok = Tokenizer::load(scratch_dir() + "/llama3.json");
        const int eot_id = tok.added_token_id("<|eot_id|>");
        const std::string folder = scratch_dir() + "/end_tokens";
        mkdir(folder.c_str(), 0755);
        const std::string config = folder + "/generation_config.json";
        unlink(config.c_str());
        const std::vector<int> fallback = tok.end_tokens(folder);
        expect(eot_id >= 0 && fallback == std::vector<int>{tok.eot(), eot_id}, "end_tokens/without_generation_config", "[" + ids_text(fallback, 0, 4) + "]");
        write_bytes(config, "{\"bos_token_id\": 50257, \"eos_token_id\": [50256, " + std::to_string(eot_id) + ", 7]}");
        const std::vector<int> listed = tok.end_tokens(folder);
        expect(listed == std::vector<int>{50256, eot_id, 7}, "end_tokens/list", "[" + ids_text(listed, 0, 4) + "]");
        write_bytes(config, "{\"eos_token_id\": 7}");
        expect(tok.end_tokens(folder) == std::vector<int>{7}, "end_tokens/one_id", "[" + ids_text(tok.end_tokens(folder), 0, 4) + "]");
        write_bytes(config, "{\"eos_token_id\": null}");
        expect(tok.end_tokens(folder) == fallback, "end_tokens/null_falls_back", "[" + ids_text(tok.end_tokens(folder), 0, 4) + "]");
        for (const std::string& bad : {std::string("{\"eos_token_id\": 99999999}"), std::string("{\"eos_token_id\": \"x\"}"), std::string("{\"eos_token_id\": [1, -2]}"),
                                       std::string("{\"eos_token_id\": 1,}")}) {
            write_bytes(config, bad);
            std::string message;
            try {
                tok.end_tokens(folder);
            } catch (const std::runtime_error& e) {
                message = e.what();
            }
            expect(message.rfind(config + ": ", 0) == 0 && message.find('\n') == std::string::npos, "end_tokens/refused " + bad, message);
        }
        const Tokenizer gpt2 = Tokenizer::load("data/gpt2");
        expect(gpt2.end_tokens("data/gpt2") == std::vector<int>{50256} && gpt2.bos() < 0, "end_tokens/gpt2", "[" + ids_text(gpt2.end_tokens("data/gpt2"), 0, 4) + "]");
    });
    guarded("json_qwen2/added_tokens", [&] {
        const Tokenizer tok = Tokenizer::load(scratch_dir() + "/qwen2.json");
        const int tool = tok.added_token_id("<tool_call>"), start = tok.added_token_id("<|im_start|>");
        // a token that is not special is matched in ordinary encoding too; a special one only when asked
        const std::vector<int> ordinary = tok.encode("a<tool_call>b<|im_start|>");
        const std::vector<int> special = tok.encode_with_special("a<tool_call>b<|im_start|>");
        expect(std::count(ordinary.begin(), ordinary.end(), tool) == 1 && std::count(ordinary.begin(), ordinary.end(), start) == 0 &&
                   special.back() == start && std::count(special.begin(), special.end(), tool) == 1,
               "json_qwen2/added_tokens", "[" + ids_text(ordinary, 0, 12) + "] / [" + ids_text(special, 0, 12) + "]");
        // NFC: decomposed and composed spellings encode alike; marks reordered by combining class; Hangul jamo
        const std::vector<std::pair<std::string, std::string>> nfc_pairs = {
            {"cafe\xCC\x81", "caf\xC3\xA9"},
            {"a\xCC\x81\xCC\xA3", "\xE1\xBA\xA1\xCC\x81"},           // U+0301 U+0323 reorder; a + U+0323 = U+1EA1
            {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"},  // jamo G A G = U+AC01
            {"\xE2\x84\xAB", "\xC3\x85"},                              // U+212B ANGSTROM SIGN = U+00C5
            {"\xCC\x81" "a", "\xCC\x81" "a"},                          // a leading mark stays
        };
        std::string problem;
        for (const auto& [decomposed, composed] : nfc_pairs)
            if (tok.encode(decomposed) != tok.encode(composed) || tok.decode(tok.encode(decomposed)) != composed)
                problem = "\"" + decomposed + "\" does not encode as \"" + composed + "\"";
        expect(problem.empty(), "json_qwen2/nfc", problem);
    });
}

// A small byte-level tokenizer.json: bytes 0..255 are ids 0..255 (spelled through GPT-2's byte map), "ab" 256 (one
// merge) and "abc" 257, which no merge makes. Its fields are replaced by the error cases.
struct TinyJson {
    std::string model_type = "\"BPE\"", normalizer = "null", pre_tokenizer = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})";
    std::string decoder = R"({"type":"ByteLevel"})", added = R"([{"id":258,"content":"<|end|>","special":true,"normalized":false}])";
    std::string merges = R"(["a b"])", extra_vocab = R"(,"ab":256,"abc":257)", model_flags = R"("byte_fallback":false,"ignore_merges":false)";
    std::string text() const {
        std::string vocab;
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            const int cp = printable ? b : 256 + extra++;
            std::string spelled;
            if (cp < 0x80) spelled = std::string(1, static_cast<char>(cp));
            else spelled = {static_cast<char>(0xC0 | cp >> 6), static_cast<char>(0x80 | (cp & 0x3F))};
            if (spelled == "\"" || spelled == "\\") spelled = "\\" + spelled;
            vocab += (b ? "," : "") + ("\"" + spelled + "\":" + std::to_string(b));
        }
        return R"({"version":"1.0","added_tokens":)" + added + R"(,"normalizer":)" + normalizer + R"(,"pre_tokenizer":)" +
               pre_tokenizer + R"(,"post_processor":null,"decoder":)" + decoder + R"(,"model":{"type":)" + model_type +
               R"(,"dropout":null,"unk_token":null,)" + model_flags + R"(,"vocab":{)" + vocab + extra_vocab +
               R"(},"merges":)" + merges + "}}";
    }
};

void run_tiny_json() {
    const std::string path = scratch_dir() + "/tiny.json";
    guarded("json_ignore_merges", [&] {
        TinyJson tiny;
        write_bytes(path, tiny.text());
        const Tokenizer plain = Tokenizer::load(path);
        tiny.model_flags = R"("byte_fallback":false,"ignore_merges":true)";
        write_bytes(path, tiny.text());
        const Tokenizer ignoring = Tokenizer::load(path);
        // "abc" is in the vocabulary but no merge makes it: one token only where ignore_merges says so
        expect(plain.encode("abc") == std::vector<int>{256, 'c'} && ignoring.encode("abc") == std::vector<int>{257} &&
                   plain.encode_with_special("x<|end|>") == std::vector<int>{'x', 258} && plain.eot() == -1,
               "json_ignore_merges", "[" + ids_text(plain.encode("abc"), 0, 4) + "] / [" + ids_text(ignoring.encode("abc"), 0, 4) + "]");
    });
    // Each file we do not read is refused in one line naming the file and the thing.
    struct ErrorCase {
        const char* name;
        std::function<void(TinyJson&)> change;
        const char* needle;
    };
    const ErrorCase cases[] = {
        {"not_json", [](TinyJson& t) { t.merges = "[\"a b\""; }, "not JSON"},
        {"wordpiece", [](TinyJson& t) { t.model_type = "\"WordPiece\""; }, "model type 'WordPiece' is not one we implement (BPE)"},
        {"unigram", [](TinyJson& t) { t.model_type = "\"Unigram\""; }, "model type 'Unigram' is not one we implement"},
        {"normalizer", [](TinyJson& t) { t.normalizer = R"({"type":"Lowercase"})"; }, "normalizer 'Lowercase' is not one we implement (none or NFC)"},
        {"metaspace", [](TinyJson& t) { t.pre_tokenizer = R"({"type":"Metaspace"})"; }, "pre_tokenizer 'Metaspace' is not one we implement"},
        {"no_pre_tokenizer", [](TinyJson& t) { t.pre_tokenizer = "null"; }, "not a byte-level tokenizer"},
        {"unknown_pattern",
         [](TinyJson& t) { t.pre_tokenizer = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","use_regex":false}]})"; },
         "pre_tokenizer pattern '\\w+' is not one we implement (GPT-2, Llama 3, Qwen 2.5, Mistral Tekken)"},
        {"split_behavior",
         [](TinyJson& t) { t.pre_tokenizer = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},"behavior":"Removed","invert":false},{"type":"ByteLevel","use_regex":false}]})"; },
         "Split behavior 'Removed'"},
        {"step_after_byte_level",
         [](TinyJson& t) { t.pre_tokenizer = R"({"type":"Sequence","pretokenizers":[{"type":"ByteLevel","use_regex":true},{"type":"Digits","individual_digits":true}]})"; },
         "follows ByteLevel"},
        {"prefix_space", [](TinyJson& t) { t.pre_tokenizer = R"({"type":"ByteLevel","add_prefix_space":true})"; }, "add_prefix_space true is not supported"},
        {"byte_fallback", [](TinyJson& t) { t.model_flags = R"("byte_fallback":true)"; }, "byte_fallback true"},
        {"lstrip", [](TinyJson& t) { t.added = R"([{"id":258,"content":"<|end|>","special":true,"lstrip":true}])"; }, "lstrip true is not supported"},
        {"merge_not_in_vocab", [](TinyJson& t) { t.merges = R"(["x y"])"; }, "model.merges[0]: merge uses or makes a token not in model.vocab"},
        {"merge_form", [](TinyJson& t) { t.merges = "[[1,2]]"; }, "model.merges[0] must be \"a b\" or [\"a\", \"b\"]"},
        {"id_gap", [](TinyJson& t) { t.extra_vocab = R"(,"ab":256,"abc":300)"; }, "no token has id 257"},
        {"id_twice", [](TinyJson& t) { t.extra_vocab = R"(,"ab":256,"abc":256)"; }, "has id 256, which is also 'ab'"},
        {"decoder", [](TinyJson& t) { t.decoder = R"({"type":"WordPiece"})"; }, "decoder 'WordPiece' is not one we implement (ByteLevel)"},
    };
    for (const ErrorCase& c : cases) {
        TinyJson tiny;
        c.change(tiny);
        write_bytes(path, tiny.text());
        const std::string name = std::string("json_refuses/") + c.name;
        try {
            Tokenizer::load(path);
            fail(name, "no error");
        } catch (const std::exception& e) {
            const std::string msg = e.what();
            expect(msg.rfind(path + ": ", 0) == 0 && msg.find(c.needle) != std::string::npos && msg.find('\n') == std::string::npos,
                   name, "message \"" + msg + "\" is not one line starting with the path and holding \"" + c.needle + "\"");
        }
    }
    // GPT-2's encoder.json, read by the same JSON reader: refused in one line naming the file.
    const std::string encoder = path + ".encoder.json", merges = path + ".vocab.bpe";
    write_bytes(merges, "#version: 0.2\n");
    const struct { const char* name; const char* text; const char* needle; } gpt2_cases[] = {
        {"not_json", "{\"a\": 0,", "malformed encoder.json: expected a key at byte 8"},
        {"not_object", "[0]", "expected a JSON object of token -> id"},
        {"id_not_number", "{\"a\": \"0\"}", "token \"a\" has no whole-number id"},
        {"id_out_of_range", "{\"a\": 1}", "token \"a\" has id 1"},
    };
    for (const auto& c : gpt2_cases) {
        write_bytes(encoder, c.text);
        const std::string name = std::string("gpt2_files_refuse/") + c.name;
        try {
            Tokenizer::load_gpt2_files(encoder, merges);
            fail(name, "no error");
        } catch (const std::exception& e) {
            const std::string msg = e.what();
            expect(msg.rfind(encoder + ": ", 0) == 0 && msg.find(c.needle) != std::string::npos && msg.find('\n') == std::string::npos,
                   name, "message \"" + msg + "\" is not one line starting with the path and holding \"" + c.needle + "\"");
        }
    }
}

// ---- parity with the `tokenizers` library ---------------------------------------------------------------

// FNV-1a over the ids' uint32 little-endian bytes (the fixture script's block_hash).
uint64_t block_hash(const int* ids, size_t count) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < count; ++i)
        for (int k = 0; k < 4; ++k) h = (h ^ ((static_cast<uint32_t>(ids[i]) >> (8 * k)) & 0xFF)) * 0x100000001B3ull;
    return h;
}

// test/fixtures/tokenizer_json/FAMILY.json with FAMILY.txt: the library's ids for each case, and for whole corpora
// the count and a hash per block of ids (format in test/tools/make_tokenizer_json_fixtures.py).
void run_parity(const std::string& family) {
    const std::string dir = "test/fixtures/tokenizer_json/", json = dir + family + ".json", ids = dir + family + ".txt";
    const std::string name = "parity/" + family;
    if (!file_exists(json) || !file_exists(ids))
        return skip(name, json + " absent: make the fixtures where the tokenizers library is installed with "
                           "`python3 test/tools/make_tokenizer_json_fixtures.py` and commit test/fixtures/tokenizer_json/");
    guarded(name, [&] {
        const Tokenizer tok = Tokenizer::load(json);
        std::ifstream in(ids);
        std::string line, problem;
        int cases = 0, corpora = 0;
        while (std::getline(in, line)) {
            if (line.empty() || line[0] == '#') continue;
            const std::vector<std::string> f = split(line, '\t');
            if (f[0] == "case" && f.size() == 5) {
                ++cases;
                const std::string input = from_hex(f[3]);
                const std::vector<int> got = encode_mode(tok, f[2], input), want = parse_ids(f[4]);
                if (got != want && problem.empty()) problem = "case " + f[1] + ": " + first_difference(got, want);
            } else if (f[0] == "corpus" && f.size() == 6) {
                ++corpora;
                const std::vector<int> got = encode_mode(tok, f[2], read_text_file(f[1]));
                const size_t block = std::stoul(f[4]);
                const std::vector<std::string> hashes = split(f[5], ' ');
                if (got.size() != std::stoul(f[3]) && problem.empty())
                    problem = f[1] + ": " + std::to_string(got.size()) + " tokens, the library " + f[3];
                for (size_t b = 0; b < hashes.size() && problem.empty(); ++b) {
                    const size_t from = b * block, count = std::min(block, got.size() - std::min(got.size(), from));
                    if (std::stoull(hashes[b], nullptr, 16) != block_hash(got.data() + from, count))
                        problem = f[1] + ": ids " + std::to_string(from) + ".." + std::to_string(from + block) + " differ";
                }
            } else {
                problem = ids + ": malformed line: " + line.substr(0, 60);
            }
        }
        expect(problem.empty() && cases >= 50 && corpora >= 1, name,
               problem.empty() ? std::to_string(cases) + " cases, " + std::to_string(corpora) + " corpora" : problem);
    });
}

// ---- --bench ---------------------------------------------------------------------------------------------

int bench(const std::string& tokenizer, const std::string& path, int threads) {
    const Tokenizer tok = Tokenizer::load(tokenizer);
    const std::string text = read_text_file(path);
    constexpr size_t kPart = size_t(1) << 18;  // parts enough for every core
    std::vector<std::pair<size_t, size_t>> parts;  // cut where safe_parts says, as prepare_shards does
    std::vector<size_t> ends;
    for (size_t begin = 0; begin < text.size();) {
        if (text.size() - begin < kPart + 16) {
            parts.emplace_back(begin, text.size());
            break;
        }
        tok.safe_parts(std::string_view(text).substr(begin), kPart, 64, ends);
        size_t from = begin;
        for (size_t end : ends) parts.emplace_back(from, begin + end), from = begin + end;
        begin = from;
    }
    auto run = [&](int n) {
        std::atomic<size_t> next{0}, tokens{0};
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        for (int t = 0; t < n; ++t)
            pool.emplace_back([&] {
                std::vector<int> ids;
                for (size_t k; (k = next++) < parts.size();) {
                    ids.clear();
                    tok.encode_append(std::string_view(text).substr(parts[k].first, parts[k].second - parts[k].first), ids);
                    tokens += ids.size();
                }
            });
        for (auto& t : pool) t.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("bench %s: %.1f MB, %zu tokens, %d thread%s: %.3f s, %.1f MB/s\n", path.c_str(), text.size() / 1e6,
                    tokens.load(), n, n == 1 ? "" : "s", s, text.size() / s / 1e6);
    };
    run(1);  // warms the piece caches too
    run(1);
    run(threads);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 4 && std::string(argv[1]) == "--bench")
        return bench(argv[2], argv[3], argc > 4 ? std::atoi(argv[4]) : static_cast<int>(std::thread::hardware_concurrency()));
    check_suite("tokenizer");
    try {
        Tokenizer tok = Tokenizer::load("data/gpt2");
        expect(tok.vocab_size() == 50257 && tok.decode_token(50256) == "<|endoftext|>", "load",
               "vocab size " + std::to_string(tok.vocab_size()));
        std::vector<Corpus> corpora;
        std::vector<std::string> texts;
        run_fixtures(tok, corpora, texts);
        run_safe_parts(tok, texts, "safe_parts_keep_tokens");
        for (const Corpus& c : corpora) {
            size_t exact = c.spec == "repo:data/tinyshakespeare/input.txt" ? 338025
                         : c.spec == "shared:gutenberg/val.txt.xz"        ? 1876092
                                                                           : 0;
            run_corpus(tok, c, exact);
        }
        expect(corpora.size() == 2, "corpora_in_fixture", std::to_string(corpora.size()) + " corpus lines");
        run_threads(tok);
        run_llmc_file(tok);
        run_misc(tok);
        run_gpt2_json(tok, texts);
        run_variants(texts);
        run_added_tokens();
        run_tiny_json();
        for (const char* family : {"gpt2", "llama3", "qwen2", "smollm2", "tekken"}) run_parity(family);
    } catch (const std::exception& e) {
        fail("setup", e.what());
    }
    return check_failures() ? 1 : 0;
}
