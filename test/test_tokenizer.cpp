// Tests for the GPT-2 tokenizer (dataloader/tokenizer.*): the fixture suite in
// test/fixtures/tokenizer_cases.txt, exact token counts of tinyshakespeare and Gutenberg val, decode/encode
// round trips, the safe cuts of long texts, thread safety of the piece cache, the llm.c tokenizer file, and load
// errors.
//
// Run from the repository root. Shared corpora are found in $SHARED_DATA or ../shared/data; checks that need
// them SKIP when absent. Prints one PASS/FAIL/SKIP line per check (test/check.h); exits 1 on any FAIL.
#include <algorithm>
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

std::vector<int> encode_mode(const GPT2Tokenizer& tok, const std::string& mode, const std::string& text) {
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
void run_fixtures(const GPT2Tokenizer& tok, std::vector<Corpus>& corpora, std::vector<std::string>& texts) {
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

void run_corpus(const GPT2Tokenizer& tok, const Corpus& c, size_t exact_count) {
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
void run_safe_parts(const GPT2Tokenizer& tok, const std::vector<std::string>& texts) {
    guarded("safe_parts_keep_tokens", [&] {
        int cuts = 0;
        std::string problem;
        for (const std::string& text : texts) {
            const std::vector<int> whole = tok.encode(text);
            for (size_t limit = 8; limit + 4 <= text.size() && problem.empty(); ++limit) {
                std::vector<size_t> ends;
                safe_parts(text, limit, 1, ends);  // one-byte chunks: a single part is a safe cut
                if (ends.size() != 1) continue;
                ++cuts;
                std::vector<int> parts = tok.encode(std::string_view(text).substr(0, ends[0]));
                tok.encode_append(std::string_view(text).substr(ends[0]), parts);
                if (parts != whole)
                    problem = "cut at byte " + std::to_string(ends[0]) + " of \"" + text.substr(0, 40) + "\": " + first_difference(parts, whole);
            }
        }
        check(problem.empty() && cuts > 0, "safe_parts_keep_tokens", problem.empty() ? std::to_string(cuts) + " safe cuts" : problem);
    });
}

// The piece cache is per thread; concurrent encoders must agree with a single-threaded run.
void run_threads(const GPT2Tokenizer& tok) {
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

void run_llmc_file(const GPT2Tokenizer& tok) {
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

void run_misc(const GPT2Tokenizer& tok) {
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
        GPT2Tokenizer::load("/nonexistent_dir");
        fail("load_missing_dir", "no error");
    } catch (const std::exception& e) {
        expect(std::string(e.what()).find("/nonexistent_dir/encoder.json") != std::string::npos, "load_missing_dir",
               e.what());
    }
}

}  // namespace

int main() {
    check_suite("tokenizer");
    try {
        GPT2Tokenizer tok = GPT2Tokenizer::load("data/gpt2");
        expect(tok.vocab_size() == 50257 && tok.decode_token(50256) == "<|endoftext|>", "load",
               "vocab size " + std::to_string(tok.vocab_size()));
        std::vector<Corpus> corpora;
        std::vector<std::string> texts;
        run_fixtures(tok, corpora, texts);
        run_safe_parts(tok, texts);
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
    } catch (const std::exception& e) {
        fail("setup", e.what());
    }
    return check_failures() ? 1 : 0;
}
