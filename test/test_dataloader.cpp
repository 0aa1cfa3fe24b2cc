// Tests for token shards (dataloader/shards.*) and the DataLoader (dataloader/dataloader.*): shard round trips in
// both widths (uint16, uint32) and the width a vocabulary takes, header validation errors, the docs/formats.md
// batch order and windows per shard, rank partitioning,
// shuffling (one seed's order pinned, every order equally likely), state save/restore in any epoch and its
// refusals, read-ahead versus synchronous reads, reset, allocator use, and error propagation.
//
// Works in a temporary directory. Prints one PASS/FAIL line per check (test/check.h); exits 1 on any FAIL.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "../dataloader/dataloader.h"
#include "../dataloader/shards.h"
#include "check.h"

namespace {


// Expects body() to throw a message containing every one of `needles`.
void expect_error(const std::string& name, const std::vector<std::string>& needles, const std::function<void()>& body) {
    try {
        body();
        fail(name, "no error");
    } catch (const std::exception& e) {
        const std::string msg = e.what();
        for (const std::string& needle : needles) {
            if (msg.find(needle) == std::string::npos)
                return fail(name, "message \"" + msg + "\" lacks \"" + needle + "\"");
        }
        if (msg.find('\n') != std::string::npos) return fail(name, "message spans several lines: " + msg);
        pass(name);
    }
}

std::string g_dir;

std::string path_in_dir(const std::string& name) { return g_dir + "/" + name; }

void write_bytes(const std::string& path, const std::string& data) {
    std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
}

const int kGpt2Vocab = 50257;  // uint16 shards
const int kWideVocab = 200000;  // uint32 shards

std::string shard_header(int32_t magic, int32_t version, int32_t count) {
    int32_t h[256] = {};
    h[0] = magic, h[1] = version, h[2] = count;
    return std::string(reinterpret_cast<const char*>(h), sizeof h);
}

// A header and `token_bytes` zero bytes: any header word, any size.
std::string shard_bytes(int32_t magic, int32_t version, int32_t count, size_t token_bytes) {
    return shard_header(magic, version, count) + std::string(token_bytes, '\0');
}

template <typename Token>
std::string shard_bytes(int32_t magic, int32_t version, const std::vector<Token>& tokens) {
    return shard_header(magic, version, static_cast<int32_t>(tokens.size())) +
           std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(Token));
}

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Distinct, recognisable tokens: shard s, index i (from `base` on, below `vocab`).
std::vector<uint32_t> make_tokens(int shard, size_t n, uint32_t base = 0, int vocab = kGpt2Vocab) {
    std::vector<uint32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(base + (shard * 7919 + i) % (vocab - base));
    return t;
}

// A batch copied out of the loader: inputs then targets.
std::vector<int32_t> take(DataLoader& loader, int B, int T) {
    Batch b = loader.next();
    std::vector<int32_t> out(b.inputs, b.inputs + size_t(B) * T);
    out.insert(out.end(), b.targets, b.targets + size_t(B) * T);
    return out;
}

std::vector<std::vector<int32_t>> take_n(DataLoader& loader, int B, int T, int n) {
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) out.push_back(take(loader, B, T));
    return out;
}

DataLoaderConfig config(const std::string& pattern, int B, int T) {
    DataLoaderConfig c;
    c.pattern = pattern;
    c.B = B;
    c.T = T;
    return c;
}

// ---- shards ------------------------------------------------------------------------------------------------

// The header words and the file size of a shard as written.
struct ShardFile {
    int32_t magic = 0, version = 0, count = 0;
    size_t size = 0;
};
ShardFile shard_file(const std::string& path) {
    const std::string bytes = read_bytes(path);
    ShardFile f;
    f.size = bytes.size();
    if (bytes.size() >= 12) {
        std::memcpy(&f.magic, bytes.data(), 4);
        std::memcpy(&f.version, bytes.data() + 4, 4);
        std::memcpy(&f.count, bytes.data() + 8, 4);
    }
    return f;
}

std::string describe(const ShardFile& f) {
    return "magic " + std::to_string(f.magic) + " version " + std::to_string(f.version) + " count " +
           std::to_string(f.count) + ", " + std::to_string(f.size) + " bytes";
}

void test_shards() {
    guarded("shard_round_trip", [] {
        const std::string p = path_in_dir("round_trip.bin");
        const std::vector<uint32_t> tokens = make_tokens(1, 1000);
        write_shard(p, tokens, kGpt2Vocab);
        const ShardFile f = shard_file(p);
        ShardReader reader(p);
        std::vector<uint32_t> middle(10);
        reader.read(500, 10, middle.data());
        expect(read_shard(p, kGpt2Vocab) == tokens && reader.num_tokens() == 1000 && reader.token_bytes() == 2 &&
                   f.magic == 20240520 && f.version == 1 && f.count == 1000 && f.size == 1024 + 2000 &&
                   std::equal(middle.begin(), middle.end(), tokens.begin() + 500),
               "shard_round_trip", "tokens or file differ: " + describe(f));
    });
    guarded("shard_round_trip_uint32", [] {
        // ids on both sides of 2^16 (a 16-bit cut maps 65536 to 0 and 70000 to 4464), llm.c's Llama 3 format
        const std::string p = path_in_dir("round_trip32.bin");
        std::vector<uint32_t> tokens = make_tokens(2, 1000, 60000, kWideVocab);
        tokens[0] = 0, tokens[1] = 65535, tokens[2] = 65536, tokens[3] = 70000, tokens[4] = kWideVocab - 1;
        write_shard(p, tokens, kWideVocab);
        const ShardFile f = shard_file(p);
        ShardReader reader(p);
        std::vector<uint32_t> middle(7);
        reader.read(1, 7, middle.data());
        expect(read_shard(p, kWideVocab) == tokens && reader.num_tokens() == 1000 && reader.token_bytes() == 4 &&
                   f.magic == 20240801 && f.version == 7 && f.count == 1000 && f.size == 1024 + 4000 &&
                   std::equal(middle.begin(), middle.end(), tokens.begin() + 1),
               "shard_round_trip_uint32", "tokens or file differ: " + describe(f));
    });
    guarded("shard_uint16_read", [] {
        // a uint16 shard as llm.c writes it, read as uint32 ids (no sign extension at 32768 and up, no byte mixing)
        const std::string p = path_in_dir("llmc16.bin");
        const std::vector<uint16_t> tokens = {50256, 0, 32767, 32768, 65535, 258, 1, 50000};
        write_bytes(p, shard_bytes(20240520, 1, tokens));
        ShardReader reader(p);
        std::vector<uint32_t> part(5);
        reader.read(3, 5, part.data());
        const std::vector<uint32_t> whole = read_shard(p, 65536);
        expect(reader.token_bytes() == 2 && whole == std::vector<uint32_t>(tokens.begin(), tokens.end()) &&
                   part == std::vector<uint32_t>(tokens.begin() + 3, tokens.end()),
               "shard_uint16_read", "ids differ from the file's");
    });
    guarded("shard_width_from_vocab", [] {
        // the vocabulary picks the format, whatever the tokens or their storage: 65,536 ids fit in uint16, 65,537 not
        const std::string p = path_in_dir("width.bin");
        std::string got;
        auto written = [&](auto tokens, int vocab) {
            write_shard(p, tokens, vocab);
            const ShardFile f = shard_file(p);
            got += " " + std::to_string(f.magic) + "/" + std::to_string(f.size - 1024);
            return read_shard(p, vocab) == std::vector<uint32_t>(tokens.begin(), tokens.end());
        };
        const bool same = written(std::vector<uint32_t>{7, 65535}, 65536) && written(std::vector<uint32_t>{7, 9}, 65537) &&
                          written(std::vector<uint16_t>{7, 9}, kWideVocab) && written(std::vector<uint16_t>{7, 9}, kGpt2Vocab);
        expect(same && got == " 20240520/4 20240801/8 20240801/8 20240520/4" && shard_token_bytes(65536) == 2 &&
                   shard_token_bytes(65537) == 4,
               "shard_width_from_vocab", "magic/token bytes" + got + (same ? "" : "; tokens differ"));
    });
    guarded("shard_empty", [] {
        write_shard(path_in_dir("empty.bin"), std::vector<uint16_t>{}, kGpt2Vocab);
        write_shard(path_in_dir("empty32.bin"), std::vector<uint32_t>{}, kWideVocab);
        expect(read_shard(path_in_dir("empty.bin"), kGpt2Vocab).empty() && read_shard(path_in_dir("empty32.bin"), kWideVocab).empty() &&
                   shard_file(path_in_dir("empty32.bin")).magic == 20240801,
               "shard_empty", "not empty");
    });
    // a token the vocabulary lacks is refused before the file is in place: a uint16 shard never holds a cut id
    const std::string refused = path_in_dir("refused.bin");
    expect_error("shard_write_token_out_of_vocab", {refused, "token id 70000 at index 1", "vocab size 65536"},
                 [&] { write_shard(refused, std::vector<uint32_t>{1, 70000, 2}, 65536); });
    expect_error("shard_write_token_out_of_vocab_uint32", {refused, "token id 200000 at index 2", "vocab size 200000"},
                 [&] { write_shard(refused, std::vector<uint32_t>{1, 70000, 200000}, kWideVocab); });
    expect(!file_exists(refused), "shard_write_refused_leaves_nothing", "the refused shard was written");
    guarded("shard_no_temp_left", [] {
        bool temp_found = false;
        DIR* d = ::opendir(g_dir.c_str());
        while (dirent* e = ::readdir(d)) temp_found |= std::strstr(e->d_name, ".tmp.") != nullptr;
        ::closedir(d);
        expect(!temp_found, "shard_no_temp_left", "a temporary file was left behind");
    });

    const std::string bad = path_in_dir("bad.bin");
    expect_error("shard_missing", {path_in_dir("missing.bin"), "cannot open"},
                 [] { ShardReader r(path_in_dir("missing.bin")); });
    write_bytes(bad, std::string(100, '\0'));
    expect_error("shard_short", {bad, "shorter than the 1024-byte shard header"}, [&] { ShardReader r(bad); });
    write_bytes(bad, shard_bytes(20240326, 1, 4, 8));
    expect_error("shard_wrong_magic", {bad, "bad magic 20240326", "20240520, uint16 tokens", "20240801, uint32 tokens"},
                 [&] { ShardReader r(bad); });
    write_bytes(bad, shard_bytes(20240520, 2, 4, 8));
    expect_error("shard_wrong_version", {bad, "unsupported shard version 2 with magic 20240520", "expected 1"},
                 [&] { ShardReader r(bad); });
    // each magic with the other format's version: the pair must match, as llm.c's readers require
    write_bytes(bad, shard_bytes(20240801, 1, 4, 16));
    expect_error("shard_uint32_wrong_version", {bad, "unsupported shard version 1 with magic 20240801", "expected 7", "20240520 takes version 1"},
                 [&] { ShardReader r(bad); });
    write_bytes(bad, shard_bytes(20240520, 7, 4, 8));
    expect_error("shard_uint16_version_7", {bad, "unsupported shard version 7 with magic 20240520", "20240801 takes version 7"},
                 [&] { ShardReader r(bad); });
    write_bytes(bad, shard_bytes(20240520, 1, 10, 8));
    expect_error("shard_truncated", {bad, "size mismatch", "10 uint16 tokens (1044 bytes)"}, [&] { ShardReader r(bad); });
    write_bytes(bad, shard_bytes(20240520, 1, 4, 10));
    expect_error("shard_too_long", {bad, "size mismatch"}, [&] { ShardReader r(bad); });
    write_bytes(bad, shard_bytes(20240801, 7, 10, 38));
    expect_error("shard_uint32_truncated", {bad, "size mismatch", "10 uint32 tokens (1064 bytes) but the file is 1062 bytes"},
                 [&] { ShardReader r(bad); });
    // one width's tokens under the other's header: refused, the message naming both
    write_bytes(bad, shard_bytes(20240520, 1, std::vector<uint32_t>{1, 2, 3, 4}));
    expect_error("shard_uint32_tokens_under_uint16_header", {bad, "4 uint16 tokens", "the size of uint32 tokens under magic 20240520"},
                 [&] { ShardReader r(bad); });
    write_bytes(bad, shard_bytes(20240801, 7, std::vector<uint16_t>{1, 2, 3, 4}));
    expect_error("shard_uint16_tokens_under_uint32_header", {bad, "4 uint32 tokens", "the size of uint16 tokens under magic 20240801"},
                 [&] { ShardReader r(bad); });
    write_bytes(bad, shard_bytes(20240520, 1, -1, 0));
    expect_error("shard_negative_count", {bad, "negative token count"}, [&] { ShardReader r(bad); });
    write_shard(bad, std::vector<uint16_t>{1, 2, 60000, 3}, 65536);
    expect_error("shard_token_out_of_vocab", {bad, "token id 60000 at index 2", "vocab size 50257"},
                 [&] { read_shard(bad, kGpt2Vocab); });
    write_shard(bad, std::vector<uint32_t>{1, 2, 150000, 3}, kWideVocab);
    expect_error("shard_uint32_token_out_of_vocab", {bad, "token id 150000 at index 2", "vocab size 100000"},
                 [&] { read_shard(bad, 100000); });
    expect_error("shard_read_past_end", {bad, "passes the end"}, [&] {
        uint32_t out[8];
        ShardReader(bad).read(2, 8, out);
    });
    expect_error("shard_write_bad_dir", {"/nonexistent_dir/x.bin"},
                 [] { write_shard("/nonexistent_dir/x.bin", std::vector<uint16_t>{1}, kGpt2Vocab); });
}

// ---- DataLoader ----------------------------------------------------------------------------------------------

// Shards a_0..a_3 with different lengths (one too short for a batch of the sizes used below).
const std::vector<size_t> kShardLengths = {1000, 40, 777, 1301};
std::vector<std::vector<uint32_t>> g_shards;

void write_loader_shards() {
    for (size_t s = 0; s < kShardLengths.size(); ++s) {
        g_shards.push_back(make_tokens(static_cast<int>(s), kShardLengths[s]));
        char name[32];
        std::snprintf(name, sizeof name, "a_%06zu.bin", s);
        write_shard(path_in_dir(name), g_shards.back(), kGpt2Vocab);
    }
}

const std::string kPattern() { return path_in_dir("a_*.bin"); }

// Shards PREFIX_000000.bin, ... of the given lengths (tokens as make_tokens draws them for shard first_id + s), in
// the format of `vocab`.
std::vector<std::vector<uint32_t>> write_shards(const std::string& prefix, const std::vector<size_t>& lengths, int first_id,
                                                int vocab = kGpt2Vocab) {
    std::vector<std::vector<uint32_t>> shards;
    for (size_t s = 0; s < lengths.size(); ++s) {
        shards.push_back(make_tokens(first_id + static_cast<int>(s), lengths[s]));
        char name[64];
        std::snprintf(name, sizeof name, "%s_%06zu.bin", prefix.c_str(), s);
        write_shard(path_in_dir(name), shards.back(), vocab);
    }
    return shards;
}

// (shard, window) of a single-rank batch, found by its first token among the windows' first tokens (G tokens apart).
using Window = std::pair<int, int>;
struct WindowFinder {
    std::map<int32_t, Window> by_first_token;
    WindowFinder(const std::vector<std::vector<uint32_t>>& shards, size_t G) {
        for (size_t s = 0; s < shards.size(); ++s)
            for (size_t o = 0; o + G + 1 <= shards[s].size(); o += G) by_first_token[shards[s][o]] = {int(s), int(o / G)};
    }
    Window operator()(const std::vector<int32_t>& batch) const {
        auto it = by_first_token.find(batch[0]);
        return it == by_first_token.end() ? Window{-1, -1} : it->second;
    }
};

// The docs/formats.md order, computed directly: global windows of G+1 tokens, stepping G, next shard when
// o + G + 1 would pass the end, wrapping after the last. Returns the rank's inputs+targets per step.
std::vector<std::vector<int32_t>> expected_unshuffled(int B, int T, int ranks, int rank, int steps) {
    const size_t G = size_t(ranks) * B * T;
    std::vector<std::vector<int32_t>> out;
    size_t s = 0, o = 0;
    auto skip_short = [&] {
        while (g_shards[s].size() < o + G + 1) s = (s + 1) % g_shards.size(), o = 0;
    };
    skip_short();
    for (int step = 0; step < steps; ++step) {
        std::vector<int32_t> inputs, targets;
        for (int i = rank * B; i < (rank + 1) * B; ++i) {
            for (int t = 0; t < T; ++t) {
                inputs.push_back(g_shards[s][o + size_t(i) * T + t]);
                targets.push_back(g_shards[s][o + size_t(i) * T + t + 1]);
            }
        }
        inputs.insert(inputs.end(), targets.begin(), targets.end());
        out.push_back(inputs);
        o += G;
        if (o + G + 1 > g_shards[s].size()) s = (s + 1) % g_shards.size(), o = 0;
        skip_short();
    }
    return out;
}

// Rank r's share of single-process batches: rows r*B..r*B+B-1 of inputs and of targets.
std::vector<int32_t> rank_rows(const std::vector<int32_t>& global, int B, int T, int r) {
    const size_t half = global.size() / 2, n = size_t(B) * T;
    std::vector<int32_t> out(global.begin() + r * n, global.begin() + (r + 1) * n);
    out.insert(out.end(), global.begin() + half + r * n, global.begin() + half + (r + 1) * n);
    return out;
}

void test_order() {
    guarded("order_unshuffled", [] {
        // B=3, T=16: G=48, windows per shard 20, 0, 16, 27 = 63 per epoch; 150 steps wrap twice.
        DataLoader loader(config(kPattern(), 3, 16));
        bool ok = take_n(loader, 3, 16, 150) == expected_unshuffled(3, 16, 1, 0, 150);
        expect(ok && loader.batches_per_epoch() == 63, "order_unshuffled",
               "batches differ from docs/formats.md order (batches/epoch " +
                   std::to_string(loader.batches_per_epoch()) + ")");
    });
    guarded("num_tokens", [] {
        DataLoader loader(config(kPattern(), 3, 16));
        expect(loader.num_tokens() == 1000 + 40 + 777 + 1301 && loader.num_shards() == 4, "num_tokens",
               std::to_string(loader.num_tokens()));
    });
    for (bool shuffle : {false, true}) {
        const std::string name = std::string("ranks_partition_") + (shuffle ? "shuffled" : "unshuffled");
        guarded(name, [&] {
            const int B = 2, T = 8, R = 3, steps = 100;
            DataLoaderConfig single = config(kPattern(), R * B, T);
            single.shuffle = shuffle;
            single.seed = 7;
            DataLoader whole(single);
            std::vector<std::vector<int32_t>> global = take_n(whole, R * B, T, steps);
            bool ok = true;
            for (int r = 0; r < R; ++r) {
                DataLoaderConfig c = config(kPattern(), B, T);
                c.num_ranks = R, c.rank = r, c.shuffle = shuffle, c.seed = 7;
                DataLoader part(c);
                for (int step = 0; step < steps; ++step)
                    ok = ok && take(part, B, T) == rank_rows(global[step], B, T, r);
            }
            if (!shuffle) ok = ok && global == expected_unshuffled(R * B, T, 1, 0, steps);
            expect(ok, name, "the ranks' rows do not add up to the single-process batches");
        });
    }
    guarded("windows_at_shard_length_bounds", [] {
        // G = B*T = 8: a window needs G+1 tokens, so shards of 8, 9, 16 and 17 tokens hold 0, 1, 1 and 2 windows
        // (the first, too short, is skipped from the start).
        const std::vector<std::vector<uint32_t>> shards = write_shards("w", {8, 9, 16, 17}, 20);
        DataLoader loader(config(path_in_dir("w_*.bin"), 2, 4));
        const WindowFinder where(shards, 8);
        std::vector<Window> served;
        for (int i = 0; i < 8; ++i) served.push_back(where(take(loader, 2, 4)));
        const std::vector<Window> want = {{1, 0}, {2, 0}, {3, 0}, {3, 1}, {1, 0}, {2, 0}, {3, 0}, {3, 1}};
        std::string order;
        for (const Window& w : served) order += " " + std::to_string(w.first) + ":" + std::to_string(w.second);
        expect(loader.batches_per_epoch() == 4 && served == want, "windows_at_shard_length_bounds",
               std::to_string(loader.batches_per_epoch()) + " batches per epoch (want 4), served" + order);
    });
    guarded("ranks_formats_md", [] {
        // Directly against the formats.md rule for rank 1 of 2.
        DataLoaderConfig c = config(kPattern(), 4, 8);
        c.num_ranks = 2, c.rank = 1;
        DataLoader loader(c);
        expect(take_n(loader, 4, 8, 80) == expected_unshuffled(4, 8, 2, 1, 80), "ranks_formats_md",
               "rank 1's batches differ");
    });
}

void test_shuffle() {
    const int B = 2, T = 8;  // G=16: windows 62, 2, 48, 81 = 193 per epoch
    auto shuffled = [&](uint64_t seed, int depth) {
        DataLoaderConfig c = config(kPattern(), B, T);
        c.shuffle = true, c.seed = seed, c.prefetch_depth = depth;
        return c;
    };
    guarded("shuffle_deterministic", [&] {
        DataLoader a(shuffled(42, 2)), b(shuffled(42, 0));
        expect(take_n(a, B, T, 500) == take_n(b, B, T, 500), "shuffle_deterministic", "same seed, different batches");
    });
    guarded("shuffle_seed_matters", [&] {
        DataLoader a(shuffled(42, 2)), b(shuffled(43, 2));
        expect(take_n(a, B, T, 50) != take_n(b, B, T, 50), "shuffle_seed_matters",
               "seeds 42 and 43 give the same batches");
    });
    guarded("shuffle_is_permutation", [&] {
        // Each epoch serves every window exactly once, and epochs differ in order.
        DataLoader plain(config(kPattern(), B, T)), mixed(shuffled(5, 2));
        const int per_epoch = static_cast<int>(plain.batches_per_epoch());
        auto unshuffled = take_n(plain, B, T, per_epoch);
        auto epoch0 = take_n(mixed, B, T, per_epoch), epoch1 = take_n(mixed, B, T, per_epoch);
        std::multiset<std::vector<int32_t>> want(unshuffled.begin(), unshuffled.end());
        bool ok = std::multiset<std::vector<int32_t>>(epoch0.begin(), epoch0.end()) == want &&
                  std::multiset<std::vector<int32_t>>(epoch1.begin(), epoch1.end()) == want && epoch0 != unshuffled &&
                  epoch0 != epoch1;
        expect(ok && per_epoch == 193, "shuffle_is_permutation", "an epoch is not a reordering of all windows");
    });
    guarded("shuffle_order_pinned", [&] {
        // Seed 42's order is the same on every machine and in every build (resumed runs recompute it): per epoch, the
        // shards in their order, each with the first windows it serves (shard:window window ...).
        const std::vector<std::string> pinned = {
            "3: 13 36 38 47, 1: 0 1, 0: 13 34 7 25, 2: 19 36 23 9",
            "2: 1 20 47 34, 1: 1 0, 3: 28 35 49 32, 0: 45 13 41 25",
        };
        DataLoader loader(shuffled(42, 0));
        const WindowFinder where(g_shards, size_t(B) * T);
        std::vector<std::string> got;
        for (int epoch = 0; epoch < 2; ++epoch) {
            std::string order;
            int shard = -1, shown = 0;
            for (uint64_t i = 0; i < loader.batches_per_epoch(); ++i) {
                const Window w = where(take(loader, B, T));
                if (w.first != shard) shard = w.first, shown = 0, order += (order.empty() ? "" : ", ") + std::to_string(shard) + ":";
                if (shown++ < 4) order += " " + std::to_string(w.second);
            }
            got.push_back(order);
        }
        expect(got == pinned, "shuffle_order_pinned", "epoch 0 \"" + got[0] + "\", epoch 1 \"" + got[1] + "\"");
    });
    guarded("shuffle_uniform", [&] {
        // Every order equally likely: over 2400 epochs the shard order of 3 shards (6 orders) and the window order of
        // a shard of 4 windows (24 orders) each take every order, with counts a chi-square test at p = 0.001 accepts.
        // (Draws from a range one too short, or from the whole array instead of its unshuffled part, a loop one step
        // short, or one order for every epoch fail it.)
        const int epochs = 2400;
        const std::vector<std::vector<uint32_t>> shards = write_shards("u", {17, 5, 5}, 10);  // 4, 1 and 1 windows of 4
        DataLoaderConfig c = config(path_in_dir("u_*.bin"), 1, 4);
        c.shuffle = true, c.seed = 2024, c.prefetch_depth = 0;
        DataLoader loader(c);
        const WindowFinder where(shards, 4);
        std::map<std::vector<int>, int> shard_orders, window_orders;
        for (int e = 0; e < epochs; ++e) {
            std::vector<int> shard_order, window_order;
            for (int i = 0; i < 6; ++i) {
                const Window w = where(take(loader, 1, 4));
                if (shard_order.empty() || shard_order.back() != w.first) shard_order.push_back(w.first);
                if (w.first == 0) window_order.push_back(w.second);
            }
            ++shard_orders[shard_order], ++window_orders[window_order];
        }
        auto chi_square = [&](const std::map<std::vector<int>, int>& counts, int orders) {
            const double expected = double(epochs) / orders;
            double x = 0;
            for (const auto& kv : counts) x += (kv.second - expected) * (kv.second - expected) / expected;
            return x + (orders - int(counts.size())) * expected;  // the orders never seen
        };
        const double shard_x = chi_square(shard_orders, 6), window_x = chi_square(window_orders, 24);
        check(shard_orders.size() == 6 && window_orders.size() == 24 && shard_x < 20.52 && window_x < 49.73, "shuffle_uniform",
              fmt("%.0f of 6 shard orders (chi-square %.1f, limit 20.52), ", shard_orders.size(), shard_x) +
                  fmt("%.0f of 24 window orders (chi-square %.1f, limit 49.73)", window_orders.size(), window_x));
    });
}

void test_state_and_prefetch() {
    const int B = 2, T = 8;
    for (bool shuffle : {false, true}) {
        const std::string name = std::string("state_restore_") + (shuffle ? "shuffled" : "unshuffled");
        guarded(name, [&] {
            DataLoaderConfig c = config(kPattern(), B, T);
            c.shuffle = shuffle, c.seed = 11;
            DataLoader a(c);
            take_n(a, B, T, 190);  // close to the end of epoch 0, so the resumed part crosses into epoch 1
            DataLoaderState saved = a.state();
            std::vector<std::vector<int32_t>> after = take_n(a, B, T, 30);
            DataLoader b(c);
            b.restore(saved);
            bool ok = take_n(b, B, T, 30) == after;
            a.restore(saved);  // also within the same loader, discarding its read-ahead
            ok = ok && take_n(a, B, T, 30) == after;
            expect(ok && saved.epoch == 0 && a.state().epoch == 1, name, "batches after restore differ");
        });
    }
    for (bool shuffle : {false, true}) {
        // States saved in epoch 1 and later (each epoch has its own order): a fresh loader restored from each continues
        // with the batches the saver served next, across the following epoch boundary too.
        const std::string name = std::string("state_restore_later_epochs_") + (shuffle ? "shuffled" : "unshuffled");
        guarded(name, [&] {
            DataLoaderConfig c = config(kPattern(), B, T);
            c.shuffle = shuffle, c.seed = 11;
            DataLoader a(c);
            const uint64_t per_epoch = a.batches_per_epoch();
            uint64_t served = 0;
            std::string problem;
            for (uint64_t at : {per_epoch + 57, 2 * per_epoch - 6, 2 * per_epoch + 114, 4 * per_epoch - 2}) {
                take_n(a, B, T, static_cast<int>(at - served));
                const DataLoaderState saved = a.state();
                const std::vector<std::vector<int32_t>> after = take_n(a, B, T, 30);
                served = at + 30;
                DataLoader b(c);
                b.restore(saved);
                const uint64_t restored_epoch = b.state().epoch;
                const bool ok = saved.epoch == at / per_epoch && restored_epoch == saved.epoch && take_n(b, B, T, 30) == after;
                if (!ok && problem.empty())
                    problem = "saved after " + std::to_string(at) + " batches in epoch " + std::to_string(saved.epoch) + ", restored in epoch " +
                              std::to_string(restored_epoch) + ": the batches after it differ or the epoch is wrong";
            }
            expect(problem.empty(), name, problem);
        });
    }
    guarded("state_restore_position_bounds", [&] {
        // Unshuffled, shard 3 (the last) has 81 windows: its window 80 is restored and served next; window 81 and
        // shard 4 do not exist.
        DataLoader a(config(kPattern(), B, T));
        DataLoaderState s = a.state();
        s.shard_pos = 3, s.window_pos = 80;
        a.restore(s);
        const WindowFinder where(g_shards, size_t(B) * T);
        const Window first = where(take(a, B, T)), second = where(take(a, B, T));
        bool refused_window = false, refused_shard = false;
        s.window_pos = 81;
        try {
            a.restore(s);
        } catch (const std::runtime_error& e) {
            refused_window = std::string(e.what()).find("does not exist") != std::string::npos;
        }
        s.shard_pos = 4, s.window_pos = 0;
        try {
            a.restore(s);
        } catch (const std::runtime_error& e) {
            refused_shard = std::string(e.what()).find("does not exist") != std::string::npos;
        }
        expect(first == Window{3, 80} && second == Window{0, 0} && refused_window && refused_shard, "state_restore_position_bounds",
               "served " + std::to_string(first.first) + ":" + std::to_string(first.second) + " then " + std::to_string(second.first) + ":" +
                   std::to_string(second.second) + (refused_window ? "" : "; window 81 not refused") + (refused_shard ? "" : "; shard 4 not refused"));
    });
    {
        // A state of another setup is refused, naming what differs.
        DataLoaderConfig c = config(kPattern(), B, T);
        c.shuffle = true, c.seed = 1;
        const DataLoaderState saved = DataLoader(c).state();
        auto restore_into = [](const DataLoaderConfig& other, const DataLoaderState& state) {
            return [other, state] { DataLoader(other).restore(state); };
        };
        DataLoaderConfig other = c;
        other.T = 4;
        expect_error("state_restore_other_T", {"T is 8 in the state but 4 here"}, restore_into(other, saved));
        other = c, other.B = 3;
        expect_error("state_restore_other_rows", {"num_ranks*B is 2 in the state but 3 here"}, restore_into(other, saved));
        other = c, other.shuffle = false;
        expect_error("state_restore_other_shuffle", {"shuffle is 1 in the state but 0 here"}, restore_into(other, saved));
        other = c, other.pattern = path_in_dir("a_00000[012].bin");
        expect_error("state_restore_other_shards", {"the shard count is 4 in the state but 3 here"}, restore_into(other, saved));
        DataLoaderState bad = saved;
        bad.version += 1;
        expect_error("state_restore_other_version", {"not a DataLoader state"}, restore_into(c, bad));
        bad = saved, bad.magic += 1;
        expect_error("state_restore_other_magic", {"not a DataLoader state"}, restore_into(c, bad));
    }
    guarded("state_restore_other_rank_split", [&] {
        // One process with 2B rows saves; two ranks of B rows each resume and split the same batches.
        DataLoaderConfig one = config(kPattern(), 2 * B, T);
        one.shuffle = true, one.seed = 3;
        DataLoader whole(one);
        take_n(whole, 2 * B, T, 17);
        DataLoaderState saved = whole.state();
        std::vector<int32_t> want = take(whole, 2 * B, T);
        bool ok = true;
        for (int r = 0; r < 2; ++r) {
            DataLoaderConfig c = config(kPattern(), B, T);
            c.shuffle = true, c.seed = 3, c.num_ranks = 2, c.rank = r;
            DataLoader part(c);
            part.restore(saved);
            ok = ok && take(part, B, T) == rank_rows(want, B, T, r);
        }
        expect(ok, "state_restore_other_rank_split", "ranks resumed from a single-process state disagree");
    });
    {
        DataLoaderConfig c = config(kPattern(), B, T);
        c.shuffle = true, c.seed = 1;
        DataLoader a(c);
        DataLoaderState s = a.state();
        s.seed = 2;
        expect_error("state_restore_wrong_seed", {"seed"}, [&] { a.restore(s); });
        s = a.state();
        s.window_pos = 1000000;
        expect_error("state_restore_bad_position", {"does not exist"}, [&] { a.restore(s); });
        guarded("state_usable_after_bad_restore", [&] {
            DataLoader fresh(c);
            expect(take(a, B, T) == take(fresh, B, T), "state_usable_after_bad_restore", "loader moved");
        });
    }
    guarded("reset", [&] {
        DataLoaderConfig c = config(kPattern(), B, T);
        c.shuffle = true, c.seed = 9;
        DataLoader a(c);
        auto first = take_n(a, B, T, 5);
        take_n(a, B, T, 300);
        a.reset();
        expect(take_n(a, B, T, 5) == first && a.state().epoch == 0, "reset", "batches after reset differ");
    });
    guarded("prefetch_matches_sync", [&] {
        bool ok = true;
        for (bool shuffle : {false, true}) {
            std::vector<std::vector<std::vector<int32_t>>> runs;
            for (int depth : {0, 1, 2, 8}) {
                DataLoaderConfig c = config(kPattern(), 3, 5);
                c.shuffle = shuffle, c.seed = 4, c.prefetch_depth = depth;
                DataLoader loader(c);
                runs.push_back(take_n(loader, 3, 5, 400));
            }
            for (const auto& run : runs) ok = ok && run == runs[0];
        }
        expect(ok, "prefetch_matches_sync", "read-ahead depth changes the batches");
    });
    guarded("allocator_used", [&] {
        int allocs = 0, frees = 0;
        {
            DataLoaderConfig c = config(kPattern(), B, T);
            c.prefetch_depth = 3;
            c.allocator = {[&](size_t n) { ++allocs; return std::malloc(n); }, [&](void* p) { ++frees; std::free(p); }};
            DataLoader loader(c);
            take_n(loader, B, T, 10);
        }
        expect(allocs == 4 && frees == 4, "allocator_used",
               std::to_string(allocs) + " allocations, " + std::to_string(frees) + " frees (want 4, 4)");
    });
    guarded("wait_time_reported", [&] {
        DataLoader loader(config(kPattern(), B, T));
        Batch b = loader.next();
        expect(b.wait_seconds >= 0 && b.wait_seconds < 10, "wait_time_reported", std::to_string(b.wait_seconds));
    });
    guarded("shutdown_while_reading_ahead", [&] {
        for (int i = 0; i < 20; ++i) {
            DataLoaderConfig c = config(kPattern(), B, T);
            c.prefetch_depth = 4;
            DataLoader loader(c);  // destroyed with the reader thread blocked on a full queue or mid-read
            if (i % 2) take(loader, B, T);
        }
        pass("shutdown_while_reading_ahead");
    });
}

void test_loader_errors() {
    expect_error("loader_empty_glob", {"no shard files match", path_in_dir("nothing_*.bin")},
                 [] { DataLoader l(config(path_in_dir("nothing_*.bin"), 2, 8)); });
    expect_error("loader_shard_too_small", {"one batch needs"}, [] { DataLoader l(config(kPattern(), 100, 64)); });
    expect_error("loader_bad_rank", {"rank 2"}, [] {
        DataLoaderConfig c = config(kPattern(), 2, 8);
        c.num_ranks = 2, c.rank = 2;
        DataLoader l(c);
    });
    write_bytes(path_in_dir("b_000000.bin"), shard_bytes(20240520, 1, 10, 8));
    expect_error("loader_bad_shard", {path_in_dir("b_000000.bin"), "size mismatch"},
                 [] { DataLoader l(config(path_in_dir("b_*.bin"), 1, 2)); });
    // A bad token id in the third window: the first two batches arrive, the third next() throws; in either width.
    for (const bool wide : {false, true}) {
        const uint32_t bad_id = wide ? 150000 : 65535;
        const std::string shard = wide ? "c32_000000.bin" : "c_000000.bin";
        std::vector<uint32_t> tokens = make_tokens(0, 100);
        tokens[2 * 16 + 5] = bad_id;
        write_shard(path_in_dir(shard), tokens, wide ? kWideVocab : 65536);
        for (int depth : {0, 2}) {
            const std::string name = std::string("loader_bad_token_") + (wide ? "uint32_" : "") + "depth" + std::to_string(depth);
            int served = 0;
            DataLoaderConfig c = config(path_in_dir(wide ? "c32_*.bin" : "c_*.bin"), 2, 8);
            c.prefetch_depth = depth;
            c.vocab_size = wide ? 100000 : kGpt2Vocab;
            try {
                DataLoader loader(c);
                for (; served < 5; ++served) loader.next();
                fail(name, "no error");
            } catch (const std::exception& e) {
                const std::string msg = e.what();
                expect(served == 2 && msg.find("token id " + std::to_string(bad_id) + " at index 37") != std::string::npos &&
                           msg.find(shard) != std::string::npos,
                       name, "after " + std::to_string(served) + " batches: " + msg);
            }
        }
    }
}

// uint32 shards through the loader: the same batches as uint16 shards of the same tokens, and ids past 65,535 whole.
void test_loader_widths() {
    guarded("loader_uint32_equals_uint16", [] {
        // windows of G = 16: 18, 2 and 32 per epoch; 120 steps cross two epoch boundaries
        const std::vector<size_t> lengths = {300, 41, 517};
        write_shards("n16", lengths, 30, kGpt2Vocab);
        write_shards("n32", lengths, 30, kWideVocab);
        bool ok = shard_file(path_in_dir("n16_000000.bin")).magic == 20240520 && shard_file(path_in_dir("n32_000000.bin")).magic == 20240801;
        std::string which;
        for (bool shuffle : {false, true}) {
            for (int depth : {0, 2}) {
                DataLoaderConfig narrow = config(path_in_dir("n16_*.bin"), 2, 8), wide = config(path_in_dir("n32_*.bin"), 2, 8);
                narrow.shuffle = wide.shuffle = shuffle;
                narrow.seed = wide.seed = 13;
                narrow.prefetch_depth = wide.prefetch_depth = depth;
                DataLoader a(narrow), b(wide);
                if (a.num_tokens() != b.num_tokens() || take_n(a, 2, 8, 120) != take_n(b, 2, 8, 120))
                    ok = false, which += fmt(" shuffle %.0f", shuffle) + fmt(" depth %.0f", depth);
            }
        }
        expect(ok, "loader_uint32_equals_uint16", "the uint32 shards' batches differ from the uint16 shards':" + which);
    });
    guarded("loader_uint32_ids_above_uint16", [] {
        // a glob of a uint16 shard then a uint32 one of ids 119,679 and up; unshuffled, B = 1, T = 8: window k of a
        // shard is its tokens [8k, 8k + 9), 4 windows in the first, 5 in the second
        const std::vector<uint32_t> narrow = make_tokens(40, 33), wide = make_tokens(41, 41, 65000, kWideVocab);
        write_shard(path_in_dir("m_000000.bin"), narrow, kGpt2Vocab);
        write_shard(path_in_dir("m_000001.bin"), wide, kWideVocab);
        DataLoaderConfig c = config(path_in_dir("m_*.bin"), 1, 8);
        c.vocab_size = kWideVocab;
        DataLoader loader(c);
        std::vector<std::vector<int32_t>> want;
        for (const std::vector<uint32_t>* tokens : {&narrow, &wide}) {
            for (size_t o = 0; o + 9 <= tokens->size(); o += 8) {
                std::vector<int32_t> batch(tokens->begin() + o, tokens->begin() + o + 8);
                batch.insert(batch.end(), tokens->begin() + o + 1, tokens->begin() + o + 9);
                want.push_back(batch);
            }
        }
        expect(want.size() == 9 && loader.batches_per_epoch() == 9 && take_n(loader, 1, 8, 9) == want,
               "loader_uint32_ids_above_uint16", "batches differ from the shards' tokens");
    });
}

void remove_dir(const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) ::unlink((dir + "/" + e->d_name).c_str());
    }
    ::closedir(d);
    ::rmdir(dir.c_str());
}

}  // namespace

int main() {
    check_suite("dataloader");
    char dir_template[] = "/tmp/test_dataloader_XXXXXX";
    if (!::mkdtemp(dir_template)) {
        std::printf("FAIL dataloader setup: mkdtemp failed\n");
        return 1;
    }
    g_dir = dir_template;
    try {
        test_shards();
        write_loader_shards();
        test_order();
        test_shuffle();
        test_state_and_prefetch();
        test_loader_errors();
        test_loader_widths();
    } catch (const std::exception& e) {
        fail("setup", e.what());
    }
    remove_dir(g_dir);
    return check_failures() ? 1 : 0;
}
