// Tests for the HellaSwag eval (dataloader/hellaswag.*): parsing test/fixtures/hellaswag_tiny.jsonl (escapes,
// raw UTF-8, unknown keys, loose whitespace), JSON errors, the exact tokens of one item, packing, masks,
// left truncation, and scoring with synthetic losses; on the real validation file (data/hellaswag or the
// shared data folder): item count, labels, lengths at T=1024 and the accuracy of random losses.
//
// Run from the repository root. Prints one PASS/FAIL/SKIP line per check (test/check.h); exits 1 on any FAIL.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "../dataloader/hellaswag.h"
#include "../dataloader/tokenizer.h"
#include "check.h"

namespace {

const char* const kFixture = "test/fixtures/hellaswag_tiny.jsonl";
constexpr int kEot = 50256;




std::string ids_text(const std::vector<int>& ids) {
    std::string s;
    for (int id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
    return s;
}

// One packed batch, as the trainer would hold it.
struct Batch {
    std::vector<int32_t> inputs, targets;
    std::vector<uint8_t> mask;
    int items = 0;
    Batch(const HellaSwagBatcher& hs, int B, int T, int b) : inputs(B * T), targets(B * T), mask(B * T) {
        items = hs.fill(b, inputs.data(), targets.data(), mask.data());
    }
};

// Scores every batch with losses from loss(item, ending, position in row) at masked positions and NaN
// elsewhere (the scorer must read only masked positions).
HellaSwagScore score_all(const HellaSwagBatcher& hs, int B, int T, const std::function<float(int, int, int)>& loss) {
    HellaSwagScore score;
    for (int b = 0; b < hs.num_batches(); ++b) {
        Batch batch(hs, B, T, b);
        std::vector<float> losses(B * T, NAN);
        for (int p = 0; p < B * T; ++p)
            if (batch.mask[p]) losses[p] = loss(b * hs.items_per_batch() + p / T / 4, p / T % 4, p % T);
        hs.score(b, losses.data(), score);
    }
    return score;
}

std::string score_text(const HellaSwagScore& s) {
    return "items " + std::to_string(s.items) + ", correct_sum " + std::to_string(s.correct_sum) + ", correct_mean " +
           std::to_string(s.correct_mean);
}

void test_parse(const std::vector<HellaSwagItem>& items) {
    expect(items.size() == 5, "parse/count", std::to_string(items.size()) + " items");
    if (items.size() != 5) return;
    const HellaSwagItem& a = items[0];
    expect(a.ind == 0 && a.label == 3 && a.activity_label == "Roof shingle removal" &&
               a.ctx == "A man is sitting on a roof. he" && a.endings[3] == "starts pulling up roofing on a roof.",
           "parse/plain", "item 0 fields differ");
    const HellaSwagItem& e = items[1];
    expect(e.activity_label == "Caf\xC3\xA9 \"quotes\"" && e.ctx == "She says \"hi\" \\ waves/smiles.\tThen\nshe" &&
               e.endings[0] == "orders a cr\xC3\xA8me br\xC3\xBBl\xC3\xA9" "e." &&
               e.endings[1] == "laughs \xF0\x9F\x98\x80 loudly." && e.endings[2] == "leaves.\b\f" &&
               e.endings[3] == "sits down\r\nquietly.",
           "parse/escapes", "escaped strings of item 1 differ (\\\" \\\\ \\/ \\t \\n \\b \\f \\r \\u, surrogate pair)");
    const HellaSwagItem& u = items[2];
    expect(u.ind == 2 && u.label == 2 &&
               u.ctx == "Der Mann f\xC3\xA4hrt nach M\xC3\xBCnchen. \xE6\x9D\xB1\xE4\xBA\xAC is" &&
               u.endings[1] == "\xCE\xA9 big." && u.endings[2] == "a city \xF0\x9F\x98\x80." && u.endings[3] == "ABC.",
           "parse/utf8_and_unknown_keys", "item 2 (raw UTF-8, nested unknown keys) differs");
    const HellaSwagItem& w = items[3];
    expect(w.ind == 3 && w.label == 1 && w.activity_label.empty() && w.ctx == "The cat" && w.endings[3].empty(),
           "parse/whitespace", "item 3 (spaces, tab, empty strings) differs");
}

// Expects parse_hellaswag to fail on line 2 (after a good line 1) with `needle` in the message.
void expect_parse_error(const std::string& name, const std::string& bad_line, const std::string& needle) {
    const std::string good =
        R"({"ind": 0, "activity_label": "a", "ctx": "b", "label": 1, "endings": ["w", "x", "y", "z"]})";
    try {
        parse_hellaswag(good + "\n" + bad_line + "\n", "bad.jsonl");
        fail("error/" + name, "no error");
    } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        expect(msg.rfind("bad.jsonl: line 2: ", 0) == 0 && msg.find(needle) != std::string::npos &&
                   msg.find('\n') == std::string::npos,
               "error/" + name, "message \"" + msg + "\" lacks the file, line 2 or \"" + needle + "\"");
    }
}

void test_errors() {
    const std::string tail = R"(, "label": 1, "endings": ["w", "x", "y", "z"]})";
    const std::string head = R"({"ind": 1, "activity_label": "a", "ctx": )";
    // not JSON: the column of the byte where the reader stopped
    expect_parse_error("bad_escape", head + R"("b\x")" + tail, "column 46: bad escape (not JSON)");
    expect_parse_error("short_unicode", head + R"("\u12")" + tail, "bad \\u escape");
    expect_parse_error("lone_high_surrogate", head + R"("\ud83dx")" + tail, "unpaired surrogate");
    expect_parse_error("lone_low_surrogate", head + R"("\ude00")" + tail, "unpaired surrogate");
    expect_parse_error("control_char", head + "\"a\tb\"" + tail, "control character");
    expect_parse_error("unterminated", head + R"("abc)", "unterminated string");
    expect_parse_error("truncated", head + R"("b", "label": 1, "endings": ["w", "x")", "unterminated array");
    expect_parse_error("duplicate_key", head + R"("b", "ctx": "c")" + tail, "duplicate key \"ctx\"");
    expect_parse_error("leading_zero", head + R"("b", "label": 01, "endings": ["w", "x", "y", "z"]})", "expected , or }");
    expect_parse_error("trailing", head + R"("b")" + tail + " x", "trailing characters");
    expect_parse_error("blank_line", "", "unexpected end");
    expect_parse_error("missing_comma", head + R"("b" "label": 1)", "expected , or }");
    // JSON, but not an item
    expect_parse_error("not_object", R"(["a"])", "expected a JSON object");
    expect_parse_error("missing_key", R"({"ind": 1, "activity_label": "a", "ctx": "b", "label": 1})",
                       "missing key \"endings\"");
    expect_parse_error("three_endings", head + R"("b", "label": 1, "endings": ["w", "x", "y"]})", "array of 4 strings (it has 3)");
    expect_parse_error("ending_not_string", head + R"("b", "label": 1, "endings": ["w", "x", "y", 4]})", "ending 3 must be a string");
    expect_parse_error("label_range", head + R"("b", "label": 4, "endings": ["w", "x", "y", "z"]})", "label 4");
    expect_parse_error("float_label", head + R"("b", "label": 1.5, "endings": ["w", "x", "y", "z"]})", "\"label\" must be an integer");
    expect_parse_error("huge_int", R"({"ind": 99999999999, "activity_label": "a"})", "\"ind\" must be an integer of int range");
    expect_parse_error("string_label", head + R"("b", "label": "1", "endings": ["w", "x", "y", "z"]})", "\"label\" must be an integer");
    expect_parse_error("null_ctx", head + "null" + tail, "\"ctx\" must be a string");
    {  // keys the reader does not use may hold any JSON value (the original release's ctx_a, split, ...)
        const auto items = parse_hellaswag(head + R"("b", "split": null, "x": [true, 1.5e3, {"y": false}])" + tail + "\n", "extra.jsonl");
        expect(items.size() == 1 && items[0].ctx == "b" && items[0].endings[3] == "z", "parse/extra_keys_any_value",
               std::to_string(items.size()) + " items");
    }
    try {
        parse_hellaswag("", "empty.jsonl");
        fail("error/empty", "no error");
    } catch (const std::runtime_error& e) {
        expect(std::string(e.what()) == "empty.jsonl: no items", "error/empty", e.what());
    }
    try {
        load_hellaswag("test/fixtures/no_such_file.jsonl");
        fail("error/missing_file", "no error");
    } catch (const std::runtime_error& e) {
        expect(std::string(e.what()).find("no_such_file.jsonl") != std::string::npos, "error/missing_file", e.what());
    }
}

// Item 0's tokens, from our tokenizer and checked piece by piece against data/gpt2/encoder.json.
void test_tokens(const std::vector<HellaSwagItem>& items, const Tokenizer& tok) {
    // Pieces: A| man| is| sitting| on| a| roof|.| he, then
    //  is| using| wrap| to| wrap| a| pair| of| sk|is|.    is| ripping| level| tiles| off|.
    //  is| holding| a| rub|ik|'s| cube|.    starts| pulling| up| roof|ing| on| a| roof|.
    const std::vector<int> ctx = {32, 582, 318, 5586, 319, 257, 9753, 13, 339};
    const std::vector<std::vector<int>> endings = {
        {318, 1262, 14441, 284, 14441, 257, 5166, 286, 1341, 271, 13},
        {318, 34759, 1241, 19867, 572, 13},
        {318, 4769, 257, 6437, 1134, 338, 23441, 13},
        {4940, 10427, 510, 9753, 278, 319, 257, 9753, 13},
    };
    const int B = 8, T = 24;
    HellaSwagBatcher hs(items, tok, B, T);
    Batch batch(hs, B, T, 0);
    bool ok = true;
    std::string detail;
    for (int i = 0; i < 4; ++i) {
        std::vector<int> seq = ctx;
        seq.insert(seq.end(), endings[i].begin(), endings[i].end());
        const int n = static_cast<int>(seq.size());
        std::vector<int> in(T, kEot), tg(T, kEot), mask(T, 0);
        for (int t = 0; t + 1 < n; ++t) in[t] = seq[t], tg[t] = seq[t + 1];
        for (int t = static_cast<int>(ctx.size()) - 1; t < n - 1; ++t) mask[t] = 1;
        const std::vector<int> got_in(batch.inputs.begin() + i * T, batch.inputs.begin() + (i + 1) * T);
        const std::vector<int> got_tg(batch.targets.begin() + i * T, batch.targets.begin() + (i + 1) * T);
        const std::vector<int> got_mask(batch.mask.begin() + i * T, batch.mask.begin() + (i + 1) * T);
        if (got_in != in || got_tg != tg || got_mask != mask) {
            ok = false;
            detail += "row " + std::to_string(i) + ": inputs [" + ids_text(got_in) + "] targets [" + ids_text(got_tg) +
                      "] want inputs [" + ids_text(in) + "]; ";
        }
    }
    expect(ok, "pack/exact_tokens_item0", detail);
}

// Every row of every batch decodes to ctx + " " + ending; masks cover exactly the ending; padding is EOT.
void test_packing(const std::vector<HellaSwagItem>& items, const Tokenizer& tok) {
    const int B = 8, T = 48;
    HellaSwagBatcher hs(items, tok, B, T);
    expect(hs.num_items() == 5 && hs.items_per_batch() == 2 && hs.num_batches() == 3 && hs.truncated() == 0,
           "pack/shape", "items " + std::to_string(hs.num_items()) + ", batches " + std::to_string(hs.num_batches()) +
                             ", truncated " + std::to_string(hs.truncated()));
    bool rows_ok = true, masks_ok = true, unused_ok = true;
    std::string detail;
    for (int b = 0; b < hs.num_batches(); ++b) {
        Batch batch(hs, B, T, b);
        expect(batch.items == (b < 2 ? 2 : 1), "pack/items_in_batch_" + std::to_string(b), std::to_string(batch.items));
        for (int r = 0; r < B; ++r) {
            const int32_t* in = &batch.inputs[r * T];
            const int32_t* tg = &batch.targets[r * T];
            const uint8_t* m = &batch.mask[r * T];
            if (r / 4 >= batch.items) {  // an unused row of the partial last batch
                for (int t = 0; t < T; ++t) unused_ok = unused_ok && in[t] == kEot && tg[t] == kEot && m[t] == 0;
                continue;
            }
            const HellaSwagItem& item = items[b * 2 + r / 4];
            const std::vector<int> ctx = tok.encode(item.ctx), ending = tok.encode(" " + item.endings[r % 4]);
            const int n = static_cast<int>(ctx.size() + ending.size());
            std::vector<int> seq(in, in + n - 1);
            seq.push_back(tg[n - 2]);
            for (int t = 0; t + 2 < n; ++t) rows_ok = rows_ok && tg[t] == in[t + 1];
            for (int t = n - 1; t < T; ++t) rows_ok = rows_ok && in[t] == kEot && tg[t] == kEot;
            if (tok.decode(seq) != item.ctx + " " + item.endings[r % 4]) {
                rows_ok = false;
                detail += "batch " + std::to_string(b) + " row " + std::to_string(r) + " decodes wrong; ";
            }
            for (int t = 0; t < T; ++t) {
                const bool want = t >= static_cast<int>(ctx.size()) - 1 && t < n - 1;
                masks_ok = masks_ok && (m[t] == 1) == want && (!want || tg[t] == ending[t - ctx.size() + 1]);
            }
        }
    }
    expect(rows_ok, "pack/rows_decode", detail);
    expect(masks_ok, "pack/masks_cover_endings", "a mask differs from the ending's target positions");
    expect(unused_ok, "pack/unused_rows_eot", "unused rows of the last batch are not all EOT with mask 0");
}

void test_truncation(const std::vector<HellaSwagItem>& items, const Tokenizer& tok) {
    // Item 4 has 24 context tokens and endings of 4/15/2/3 tokens (39 at most); items 0..3 need at most 25.
    const int B = 4, T = 30;
    HellaSwagBatcher hs(items, tok, B, T);
    expect(hs.truncated() == 1 && hs.max_length() == 39, "truncate/count",
           "truncated " + std::to_string(hs.truncated()) + ", max_length " + std::to_string(hs.max_length()));
    Batch batch(hs, B, T, 4);
    const std::vector<int> ctx = tok.encode(items[4].ctx);
    const std::vector<int> kept(ctx.begin() + (39 - (T + 1)), ctx.end());  // 8 tokens cut from the left
    bool ok = true;
    for (int i = 0; i < 4; ++i) {
        std::vector<int> seq = kept;
        const std::vector<int> ending = tok.encode(" " + items[4].endings[i]);
        seq.insert(seq.end(), ending.begin(), ending.end());
        const int n = static_cast<int>(seq.size());
        for (int t = 0; t < T; ++t) {
            ok = ok && batch.inputs[i * T + t] == (t < n - 1 ? seq[t] : kEot);
            ok = ok && batch.targets[i * T + t] == (t < n - 1 ? seq[t + 1] : kEot);
            ok = ok && batch.mask[i * T + t] == (t >= static_cast<int>(kept.size()) - 1 && t < n - 1);
        }
        if (i == 1) ok = ok && n == T + 1;  // the longest candidate fills the row exactly
    }
    expect(ok, "truncate/left_cut_keeps_ending", "item 4's rows at T=30 differ from its context tail + ending");

    try {
        HellaSwagBatcher(items, tok, 4, 14);  // item 4's 15-token ending cannot fit with any context
        fail("truncate/ending_too_long", "no error");
    } catch (const std::runtime_error& e) {
        expect(std::string(e.what()).find("ind 4") != std::string::npos, "truncate/ending_too_long", e.what());
    }
    try {
        HellaSwagBatcher(items, tok, 6, 64);
        fail("batcher/B_multiple_of_4", "no error");
    } catch (const std::invalid_argument&) {
        check(true, "batcher/B_multiple_of_4", "");
    }
    try {
        std::vector<HellaSwagItem> empty_ctx = {items[0]};
        empty_ctx[0].ctx.clear();
        HellaSwagBatcher(empty_ctx, tok, 4, 64);
        fail("batcher/empty_context", "no error");
    } catch (const std::runtime_error& e) {
        expect(std::string(e.what()).find("context is empty") != std::string::npos, "batcher/empty_context", e.what());
    }
}

void test_scoring(const std::vector<HellaSwagItem>& items, const Tokenizer& tok) {
    const int B = 8, T = 48;  // fixture labels: 3, 0, 2, 1, 2
    HellaSwagBatcher hs(items, tok, B, T);
    auto favor = [&](std::function<int(int)> best) {
        return score_all(hs, B, T, [&](int item, int ending, int) { return ending == best(item) ? 1.0f : 3.0f; });
    };
    HellaSwagScore s = favor([](int) { return 2; });
    expect(s.items == 5 && s.correct_sum == 2 && s.correct_mean == 2, "score/ending2_best", score_text(s));
    s = favor([&](int item) { return items[item].label; });
    expect(s.items == 5 && s.correct_sum == 5 && s.correct_mean == 5, "score/label_best", score_text(s));
    s = favor([&](int item) { return (items[item].label + 1) % 4; });
    expect(s.items == 5 && s.correct_sum == 0 && s.correct_mean == 0, "score/label_worst", score_text(s));
    // Equal losses tie every mean; ties go to ending 0, like torch.argmin (item 1's label is 0).
    HellaSwagBatcher tie({items[1]}, tok, 4, T);
    s = score_all(tie, 4, T, [](int, int, int) { return 2.0f; });
    expect(s.items == 1 && s.correct_mean == 1, "score/ties_lowest_index", score_text(s));
    // Item 4 (label 2): the 15-token ending 1 has the lowest mean, the 2-token ending 2 the lowest sum.
    HellaSwagBatcher one({items[4]}, tok, 4, T);
    s = score_all(one, 4, T, [](int, int ending, int) { return ending == 1 ? 0.5f : 1.0f; });
    expect(s.items == 1 && s.correct_sum == 1 && s.correct_mean == 0, "score/sum_vs_mean", score_text(s));
    // The loss at position t of a row is the loss of predicting targets[t]: raising only the first
    // masked position of ending 0 (which predicts the first ending token) must move the choice away from it.
    HellaSwagBatcher first({items[1]}, tok, 4, T);  // label 0
    const int c = static_cast<int>(tok.encode(items[1].ctx).size());
    s = score_all(first, 4, T, [&](int, int ending, int t) { return ending ? 1.0f : t == c - 1 ? 20.0f : 0.0f; });
    expect(s.correct_mean == 0 && s.correct_sum == 0, "score/first_ending_token_counts", score_text(s));
}

void test_real(const Tokenizer& tok) {
    const char* env = std::getenv("SHARED_DATA");
    const std::string shared = std::string(env && *env ? env : "../shared/data") + "/hellaswag/hellaswag_val.jsonl.xz";
    const std::string repo = "data/hellaswag/hellaswag_val.jsonl.xz";
    const std::string path = file_exists(repo) ? repo : shared;
    if (!file_exists(path)) return skip("real", path + " not found (set SHARED_DATA)");
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<HellaSwagItem> items = load_hellaswag(path);
    const auto t1 = std::chrono::steady_clock::now();
    bool ok = items.size() == 10042;
    int label_counts[4] = {};
    for (size_t i = 0; i < items.size(); ++i) {
        ok = ok && items[i].ind == static_cast<int>(i);  // the file lists items in order
        ++label_counts[items[i].label];
    }
    std::string labels = "labels 0..3:";
    for (int count : label_counts) labels += " " + std::to_string(count);
    check(ok, "real/load_10042", std::to_string(items.size()) + " items, " + labels + ", parsed in " +
                                     std::to_string(std::chrono::duration<double>(t1 - t0).count()) + " s");

    const int B = 64, T = 1024;
    const HellaSwagBatcher hs(items, tok, B, T);
    const auto t2 = std::chrono::steady_clock::now();
    check(hs.truncated() == 0 && hs.max_length() <= T + 1, "real/fits_T1024",
          "max candidate " + std::to_string(hs.max_length()) + " tokens, truncated " + std::to_string(hs.truncated()) +
              ", tokenized in " + std::to_string(std::chrono::duration<double>(t2 - t1).count()) + " s");

    // A model with no knowledge: i.i.d. uniform losses at every position (fixed seed, portable generator).
    std::mt19937 rng(1337);
    HellaSwagScore s;
    std::vector<float> losses(B * T);
    for (int b = 0; b < hs.num_batches(); ++b) {
        for (float& l : losses) l = static_cast<float>(rng() >> 8) * (1.0f / 16777216.0f);
        hs.score(b, losses.data(), s);
    }
    const double acc = double(s.correct_sum) / s.items, acc_norm = double(s.correct_mean) / s.items;
    // Summed random losses favour short endings, so acc also tests that ending length does not give the
    // label away.
    check(s.items == 10042 && std::fabs(acc_norm - 0.25) <= 0.015 && std::fabs(acc - 0.25) <= 0.015,
          "real/random_losses_25pct", "acc_norm " + std::to_string(acc_norm) + ", acc " + std::to_string(acc));
}

}  // namespace

int main() {
    check_suite("hellaswag");
    try {
        const Tokenizer tok = Tokenizer::load("data/gpt2");
        const std::vector<HellaSwagItem> items = load_hellaswag(kFixture);
        test_parse(items);
        test_errors();
        if (items.size() == 5) {
            guarded("pack/exact_tokens_item0", [&] { test_tokens(items, tok); });
            guarded("pack", [&] { test_packing(items, tok); });
            guarded("truncate", [&] { test_truncation(items, tok); });
            guarded("score", [&] { test_scoring(items, tok); });
        }
        guarded("real", [&] { test_real(tok); });
    } catch (const std::exception& e) {
        fail("setup", e.what());
    }
    return check_failures() ? 1 : 0;
}
