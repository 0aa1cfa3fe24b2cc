// Tests for chat data (dataloader/chat.*, prepare_shards --chat, mask shards in dataloader/shards.* and the
// DataLoader): each template rendered to its exact tokens and mask with GPT-2's tokenizer (data/gpt2; the Llama 3 and
// ChatML special tokens from a table of their real ids), --chat-loss all; prepare_shards --chat end to end (shards and
// masks written window by window, the counts, conversations cut and dropped, a later plain set removing the masks);
// the DataLoader serving -1 where the mask is 0 on every rank, shuffled and read ahead, and counting the global
// window's targets; and each refusal as one line naming the file (and line): no assistant turn, an unknown role,
// malformed JSON, a mask of another length than its shard, masks beside some shards only, another window, a mask
// byte that is not 0 or 1, with nothing written by a failed prepare_shards.
//
// Run from the repository root (build/prepare_shards, data/gpt2). Works in a temporary directory. Prints one
// PASS/FAIL line per check (test/check.h); exits 1 on any FAIL.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "../dataloader/chat.h"
#include "../dataloader/dataloader.h"
#include "../dataloader/shards.h"
#include "../dataloader/tokenizer.h"
#include "check.h"

namespace {

std::string g_dir;

// Expects body() to throw one line containing every one of `needles`.
void expect_error(const std::string& name, const std::vector<std::string>& needles, const std::function<void()>& body) {
    try {
        body();
        fail(name, "no error");
    } catch (const std::exception& e) {
        const std::string msg = e.what();
        for (const std::string& needle : needles)
            if (msg.find(needle) == std::string::npos) return fail(name, "message \"" + msg + "\" lacks \"" + needle + "\"");
        if (msg.find('\n') != std::string::npos) return fail(name, "message spans several lines: " + msg);
        pass(name);
    }
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The real ids of the Llama 3 and Qwen 2.5 special tokens the templates use, and GPT-2's <|endoftext|>.
const std::map<std::string, int> kSpecialIds = {
    {"<|begin_of_text|>", 128000}, {"<|end_of_text|>", 128001}, {"<|start_header_id|>", 128006},
    {"<|end_header_id|>", 128007}, {"<|eot_id|>", 128009},      {"<|im_start|>", 151644},
    {"<|im_end|>", 151645},        {"<|endoftext|>", 50256}};

ChatTokenizer test_tokenizer(const Tokenizer& tok) {
    return {[&tok](std::string_view text, std::vector<int>& out) { tok.encode_append(text, out); },
            [](const std::string& name) {
                const auto it = kSpecialIds.find(name);
                if (it == kSpecialIds.end()) throw std::runtime_error("no special token " + name);
                return it->second;
            }};
}

// A template's expected rendering, written out piece by piece: a special token's name (in <|...|>) or text, and
// whether it counts. The ids are each piece's own: a special token's from the table, text's GPT-2 encoding.
struct Piece {
    std::string text;
    bool counted;
};
TokenizedChat expected_tokens(const std::vector<Piece>& pieces, const Tokenizer& tok) {
    TokenizedChat out;
    for (const Piece& p : pieces) {
        std::vector<int> ids;
        if (p.text.size() > 4 && p.text.compare(0, 2, "<|") == 0 && kSpecialIds.count(p.text)) ids = {kSpecialIds.at(p.text)};
        else ids = tok.encode(p.text);
        for (int id : ids) {
            out.tokens.push_back(static_cast<uint32_t>(id));
            out.mask.push_back(p.counted ? 1 : 0);
        }
    }
    out.mask[0] = 0;
    return out;
}

std::string describe(const TokenizedChat& c) {
    std::string s;
    for (size_t i = 0; i < c.tokens.size(); ++i) s += std::to_string(c.tokens[i]) + (c.mask[i] ? "* " : " ");
    return s;
}

void check_tokens(const std::string& name, const TokenizedChat& got, const TokenizedChat& expected) {
    expect(got.tokens == expected.tokens && got.mask == expected.mask, name,
           "got " + describe(got) + "\nexpected " + describe(expected) + " (* = counted)");
}

const char* kConversation =
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, )"
    R"({"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye."}]})";

void test_templates(const Tokenizer& tok) {
    const ChatTokenizer t = test_tokenizer(tok);
    const Conversation c = parse_chat_line(kConversation, "t.jsonl", 1);
    check_tokens("llama3 template: tokens and mask",
                 tokenize_chat(render_chat(c, ChatTemplate::kLlama3), t, ChatLoss::kAssistant),
                 expected_tokens({{"<|begin_of_text|>", false},
                                  {"<|start_header_id|>", false}, {"system", false}, {"<|end_header_id|>", false}, {"\n\n", false},
                                  {"Be brief.", false}, {"<|eot_id|>", false},
                                  {"<|start_header_id|>", false}, {"user", false}, {"<|end_header_id|>", false}, {"\n\n", false},
                                  {"Hi", false}, {"<|eot_id|>", false},
                                  {"<|start_header_id|>", false}, {"assistant", false}, {"<|end_header_id|>", false}, {"\n\n", false},
                                  {"Hello!", true}, {"<|eot_id|>", true},  // trimmed, as Llama 3's template does
                                  {"<|start_header_id|>", false}, {"user", false}, {"<|end_header_id|>", false}, {"\n\n", false},
                                  {"Bye", false}, {"<|eot_id|>", false},
                                  {"<|start_header_id|>", false}, {"assistant", false}, {"<|end_header_id|>", false}, {"\n\n", false},
                                  {"Bye.", true}, {"<|eot_id|>", true}},
                                 tok));
    check_tokens("chatml template: tokens and mask",
                 tokenize_chat(render_chat(c, ChatTemplate::kChatml), t, ChatLoss::kAssistant),
                 expected_tokens({{"<|im_start|>", false}, {"system\n", false}, {"Be brief.", false}, {"<|im_end|>", false}, {"\n", false},
                                  {"<|im_start|>", false}, {"user\n", false}, {"Hi", false}, {"<|im_end|>", false}, {"\n", false},
                                  {"<|im_start|>", false}, {"assistant\n", false}, {" Hello! ", true}, {"<|im_end|>", true}, {"\n", false},
                                  {"<|im_start|>", false}, {"user\n", false}, {"Bye", false}, {"<|im_end|>", false}, {"\n", false},
                                  {"<|im_start|>", false}, {"assistant\n", false}, {"Bye.", true}, {"<|im_end|>", true}, {"\n", false}},
                                 tok));
    const TokenizedChat plain = tokenize_chat(render_chat(c, ChatTemplate::kPlain), t, ChatLoss::kAssistant);
    check_tokens("plain template: tokens and mask", plain,
                 expected_tokens({{"<|endoftext|>", false}, {"System: Be brief.\n\n", false}, {"User: Hi\n\n", false},
                                  {"Assistant:", false}, {"  Hello! ", true}, {"<|endoftext|>", true},
                                  {"User: Bye\n\n", false}, {"Assistant:", false}, {" Bye.", true}, {"<|endoftext|>", true}},
                                 tok));
    // the same plain rendering as GPT-2 ids written out (tiktoken "gpt2" encodes each piece so), pinning the tokenizer
    // side too: <|endoftext|> "System" ":" " Be" " brief" "." "\n\n" "User" ":" " Hi" "\n\n" "Ass" "istant" ":" " "
    // " Hello" "!" " " <|endoftext|> ...
    const std::vector<uint32_t> plain_ids = {50256, 11964, 25, 1355, 4506, 13, 628, 12982, 25, 15902, 628, 48902, 25, 220,
                                             18435, 0, 220, 50256, 12982, 25, 47843, 628, 48902, 25, 47843, 13, 50256};
    expect(plain.tokens == plain_ids, "plain template: GPT-2 ids written out", "got " + describe(plain));

    const Conversation pair = parse_chat_line(R"({"prompt": "2+2=", "completion": "4", "id": [1, {"x": null}]})", "t.jsonl", 1);
    check_tokens("plain template: a prompt/completion pair is raw text",
                 tokenize_chat(render_chat(pair, ChatTemplate::kPlain), t, ChatLoss::kAssistant),
                 expected_tokens({{"<|endoftext|>", false}, {"2+2=", false}, {"4", true}, {"<|endoftext|>", true}}, tok));
    check_tokens("chatml template: a prompt/completion pair is a user and an assistant turn",
                 tokenize_chat(render_chat(pair, ChatTemplate::kChatml), t, ChatLoss::kAssistant),
                 expected_tokens({{"<|im_start|>", false}, {"user\n", false}, {"2+2=", false}, {"<|im_end|>", false}, {"\n", false},
                                  {"<|im_start|>", false}, {"assistant\n", false}, {"4", true}, {"<|im_end|>", true}, {"\n", false}},
                                 tok));
    const TokenizedChat all = tokenize_chat(render_chat(c, ChatTemplate::kLlama3), t, ChatLoss::kAllTokens);
    expect(all.mask[0] == 0 && std::all_of(all.mask.begin() + 1, all.mask.end(), [](uint8_t m) { return m == 1; }),
           "--chat-loss all: every token counts but the first", describe(all));
    expect_error("--chat-template of another name", {"--chat-template", "jinja", "llama3, chatml or plain"},
                 [] { parse_chat_template("jinja", "--chat-template"); });
}

void test_parse_errors() {
    const std::string f = "data/chat.jsonl";
    expect_error("no assistant turn: file, line", {f, "line 7", "no assistant turn"},
                 [&] { parse_chat_line(R"({"messages": [{"role": "user", "content": "x"}]})", f, 7); });
    expect_error("an unknown role: file, line, the role", {f, "line 3", "unknown role \"tool\"", "system, user or assistant"},
                 [&] { parse_chat_line(R"({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]})", f, 3); });
    expect_error("malformed JSON: file, line, column", {f, "line 12", "column"},
                 [&] { parse_chat_line(R"({"messages": [{"role": "user", "content": "x"},]})", f, 12); });
    expect_error("a non-string content", {f, "line 1", "message 0's \"content\" must be a string"},
                 [&] { parse_chat_line(R"({"messages": [{"role": "user", "content": null}]})", f, 1); });
    expect_error("a prompt without a completion", {f, "\"prompt\" without \"completion\""},
                 [&] { parse_chat_line(R"({"prompt": "x"})", f, 1); });
    expect_error("a duplicate key", {f, "duplicate key \"prompt\""},
                 [&] { parse_chat_line(R"({"prompt": "x", "completion": "y", "prompt": "z"})", f, 1); });
    expect_error("text after the object", {f, "line 1", "column 36", "trailing characters"},
                 [&] { parse_chat_line(R"({"prompt": "x", "completion": "y"} x)", f, 1); });
    const Conversation escaped = parse_chat_line(R"({"prompt": "a\"\u00e9\ud83d\ude00\n", "completion": "b"})", f, 1);
    expect(escaped.messages[0].content == "a\"\xc3\xa9\xf0\x9f\x98\x80\n", "JSON escapes, a surrogate pair",
           escaped.messages[0].content);
}

// Runs a command with stderr captured; returns its exit status.
int run(const std::string& command, std::string& err) {
    const std::string log = g_dir + "/stderr.txt";
    const int status = std::system((command + " 2> " + log).c_str());
    err = read_text(log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void test_prepare_shards(const Tokenizer& tok) {
    const int T = 24;
    const std::string in = g_dir + "/conversations.jsonl", prefix = g_dir + "/out/chat";
    const std::string long_answer = std::string(200, 'a') + " b";  // far past the window
    std::string text;
    text += R"({"prompt": "Q0", "completion": "A0"})" "\n";
    text += "\n";  // a blank line holds nothing
    text += R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]})" "\n";
    text += R"({"messages": [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": ")" + long_answer + R"("}]})" "\n";
    text += R"({"messages": [{"role": "user", "content": ")" + std::string(300, 'q') + R"("}, {"role": "assistant", "content": "lost"}]})" "\n";
    for (int i = 0; i < 5; ++i) text += R"({"prompt": "P", "completion": "C)" + std::to_string(i) + "\"}\n";
    write_text(in, text);
    std::string err;
    // --shard-size 3T+1: three windows a shard; --val-docs 1: the first conversation is validation
    const int rc = run("build/prepare_shards --chat --seq-len " + std::to_string(T) + " --shard-size " + std::to_string(3 * T + 1) +
                           " --val-docs 1 --threads 2 --out " + prefix + " " + in, err);
    if (rc != 0) return fail("prepare_shards --chat", "exit " + std::to_string(rc) + ": " + err);
    expect(err.find("9 conversations") != std::string::npos && err.find("2 cut to the window of 24 tokens") != std::string::npos &&
               err.find("1 of them dropped") != std::string::npos,
           "prepare_shards --chat: counts conversations, cut and dropped", err);
    expect(err.find("padding: ") != std::string::npos, "prepare_shards --chat: reports the padding", err);
    // train: 7 conversations (8 train lines, one dropped) in shards of 3, 3 and 1 windows; val: 1
    const ChatTokenizer t = test_tokenizer(tok);
    std::vector<TokenizedChat> expected;
    for (const std::string& line : {std::string(R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]})"),
                                    R"({"messages": [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": ")" + long_answer + "\"}]}"}) {
        expected.push_back(tokenize_chat(render_chat(parse_chat_line(line, "x", 1), ChatTemplate::kPlain), t, ChatLoss::kAssistant));
    }
    for (int i = 0; i < 5; ++i)
        expected.push_back(tokenize_chat(render_chat(parse_chat_line(R"({"prompt": "P", "completion": "C)" + std::to_string(i) + "\"}", "x", 1),
                                                     ChatTemplate::kPlain), t, ChatLoss::kAssistant));
    std::vector<uint32_t> all_tokens;
    std::vector<uint8_t> all_mask;
    bool layout_ok = true;
    std::string why;
    for (int s = 0; s < 3; ++s) {
        char name[64];
        std::snprintf(name, sizeof name, "_train_%06d.bin", s);
        const std::string shard = prefix + name;
        const int windows = s < 2 ? 3 : 1;
        try {
            const std::vector<uint32_t> tokens = read_shard(shard, 50257);
            const std::vector<uint8_t> mask = read_mask_shard(mask_shard_path(shard));
            const MaskReader header(mask_shard_path(shard));
            if (tokens.size() != size_t(windows) * T + 1 || mask.size() != tokens.size() || header.window() != T)
                layout_ok = false, why += shard + ": " + std::to_string(tokens.size()) + " tokens, window " + std::to_string(header.window()) + "; ";
            if (tokens.back() != 50256 || mask.back() != 0) layout_ok = false, why += shard + ": no padding token at the end; ";
            all_tokens.insert(all_tokens.end(), tokens.begin(), tokens.end() - 1);
            all_mask.insert(all_mask.end(), mask.begin(), mask.end() - 1);
        } catch (const std::exception& e) {
            layout_ok = false, why += e.what();
        }
    }
    expect(layout_ok && !file_exists(prefix + "_train_000003.bin"), "prepare_shards --chat: shards of whole windows, a mask beside each", why);
    bool windows_ok = all_tokens.size() == expected.size() * T;
    for (size_t w = 0; windows_ok && w < expected.size(); ++w) {
        TokenizedChat e = expected[w];
        if (e.tokens.size() > size_t(T)) e.tokens.resize(T), e.mask.resize(T);  // the long answer, cut
        e.tokens.resize(T, 50256);
        e.mask.resize(T, 0);
        windows_ok = std::equal(e.tokens.begin(), e.tokens.end(), all_tokens.begin() + w * T) &&
                     std::equal(e.mask.begin(), e.mask.end(), all_mask.begin() + w * T);
        if (!windows_ok) why = "window " + std::to_string(w) + " differs";
    }
    expect(windows_ok, "prepare_shards --chat: each conversation in its own window, cut or padded, masks as rendered", why);
    try {
        const std::vector<uint8_t> val_mask = read_mask_shard(mask_shard_path(prefix + "_val_000000.bin"));
        expect(val_mask.size() == size_t(T) + 1 && read_shard(prefix + "_val_000000.bin", 50257).size() == val_mask.size(),
               "prepare_shards --chat --val-docs 1: the first conversation is validation", std::to_string(val_mask.size()));
    } catch (const std::exception& e) {
        fail("prepare_shards --chat --val-docs 1: the first conversation is validation", e.what());
    }

    // refusals: one line naming the file and line; nothing replaced (the set above stays whole)
    write_text(g_dir + "/bad.jsonl", R"({"prompt": "x", "completion": "y"})" "\n" R"({"messages": [{"role": "user", "content": "x"}]})" "\n");
    const int bad_rc = run("build/prepare_shards --chat --seq-len 24 --out " + prefix + " " + g_dir + "/bad.jsonl", err);
    expect(bad_rc == 1 && err.find("bad.jsonl: line 2") != std::string::npos && err.find("no assistant turn") != std::string::npos &&
               std::count(err.begin(), err.end(), '\n') == 1,
           "prepare_shards --chat: a conversation without an answer, one line with file and line", err);
    write_text(g_dir + "/broken.jsonl", "\n" R"({"prompt": "x", "completion": "y")" "\n");
    const int broken_rc = run("build/prepare_shards --chat --seq-len 24 --out " + prefix + " " + g_dir + "/broken.jsonl", err);
    expect(broken_rc == 1 && err.find("broken.jsonl: line 2") != std::string::npos, "prepare_shards --chat: malformed JSON's line", err);
    expect(file_exists(prefix + "_train_000002.bin.mask") && read_shard(prefix + "_train_000000.bin", 50257).size() == size_t(3 * T + 1),
           "prepare_shards --chat: a refused input replaces nothing", "");
    const int usage_rc = run("build/prepare_shards --chat --out " + prefix + " " + in, err);
    expect(usage_rc == 1 && err.find("--seq-len") != std::string::npos, "prepare_shards --chat without --seq-len is refused", err);
    const int llama_rc = run("build/prepare_shards --chat --seq-len 24 --chat-template llama3 --out " + prefix + " " + in, err);
    expect(llama_rc == 1 && err.find("<|begin_of_text|>") != std::string::npos && err.find("tokenizer.json") != std::string::npos,
           "prepare_shards --chat-template llama3 with GPT-2's tokenizer names the missing special token", err);

    // a later plain set under the same prefix leaves no mask behind (the loader would take it for chat data)
    write_text(g_dir + "/plain.txt", "some plain text for a plain set of shards");
    const int plain_rc = run("build/prepare_shards --out " + prefix + " " + g_dir + "/plain.txt", err);
    expect(plain_rc == 0 && file_exists(prefix + "_train_000000.bin") && !file_exists(prefix + "_train_000000.bin.mask") &&
               !file_exists(prefix + "_val_000000.bin.mask") && !file_exists(prefix + "_train_000001.bin"),
           "a plain set replacing a chat set removes its masks", err);
}

// Shards of 4 windows of T (as prepare_shards --chat lays them out) with a mask of a known pattern, two shards.
void write_masked_shards(const std::string& prefix, int T, int windows, std::vector<std::vector<uint32_t>>& tokens,
                         std::vector<std::vector<uint8_t>>& masks) {
    for (int s = 0; s < 2; ++s) {
        std::vector<uint32_t> t(size_t(windows) * T + 1);
        std::vector<uint8_t> m(t.size());
        for (size_t i = 0; i < t.size(); ++i) {
            t[i] = static_cast<uint32_t>(1000 * s + i);
            m[i] = (i % T) != 0 && ((i * 7 + s) % 3 != 0);  // a window's first token never counts
        }
        char name[64];
        std::snprintf(name, sizeof name, "_train_%06d.bin", s);
        write_shard(prefix + name, t, 50257);
        write_mask_shard(mask_shard_path(prefix + name), m, T);
        tokens.push_back(t);
        masks.push_back(m);
    }
}

void test_dataloader() {
    const int T = 8, B = 2, windows = 8;
    const std::string prefix = g_dir + "/masked/m";
    ::mkdir((g_dir + "/masked").c_str(), 0755);
    std::vector<std::vector<uint32_t>> tokens;
    std::vector<std::vector<uint8_t>> masks;
    write_masked_shards(prefix, T, windows, tokens, masks);
    for (bool shuffle : {false, true}) {
        const std::string how = shuffle ? " (shuffled, read ahead)" : "";
        DataLoaderConfig config;
        config.pattern = prefix + "_train_*";  // also matches the masks: they are not shards
        config.B = B, config.T = T, config.num_ranks = 2, config.shuffle = shuffle, config.seed = 5;
        config.prefetch_depth = shuffle ? 2 : 0;
        try {
            std::vector<std::unique_ptr<DataLoader>> ranks;
            for (int r = 0; r < 2; ++r) {
                config.rank = r;
                ranks.emplace_back(new DataLoader(config));
            }
            bool served_ok = ranks[0]->has_masks() && ranks[0]->num_shards() == 2, counts_ok = true;
            std::string why;
            const uint64_t batches = ranks[0]->batches_per_epoch();
            const uint64_t ahead = ranks[0]->counted_targets_ahead(batches), ahead_1 = ranks[1]->counted_targets_ahead(batches);
            uint64_t counted = 0;
            for (uint64_t b = 0; b < batches; ++b) {
                const uint64_t expected_step = ranks[0]->counted_targets_ahead(1);
                uint64_t step = 0;
                for (int r = 0; r < 2; ++r) {
                    const Batch batch = ranks[r]->next();
                    // the window's first input token tells where the rank's rows start: 1000*shard + offset
                    const uint32_t first = static_cast<uint32_t>(batch.inputs[0]);
                    const int s = first >= 1000 ? 1 : 0;
                    const size_t offset = first - 1000 * s;
                    if (offset % T != 0) served_ok = false, why = "a row starts inside a window";
                    for (int i = 0; i < B * T; ++i) {
                        const bool counts = masks[s][offset + i + 1] == 1;
                        const int expected = counts ? static_cast<int>(tokens[s][offset + i + 1]) : -1;
                        if (batch.targets[i] != expected || batch.inputs[i] != static_cast<int>(tokens[s][offset + i])) {
                            served_ok = false;
                            why = "rank " + std::to_string(r) + " batch " + std::to_string(b) + " position " + std::to_string(i) +
                                  ": target " + std::to_string(batch.targets[i]) + ", expected " + std::to_string(expected);
                        }
                        step += counts;
                    }
                }
                if (step != expected_step) counts_ok = false;
                counted += step;
            }
            expect(served_ok, "DataLoader serves -1 where the mask is 0, on both ranks" + how, why);
            expect(counts_ok && ahead == counted && ahead_1 == counted,
                   "DataLoader::counted_targets_ahead: the global windows' counted targets, the same on every rank" + how,
                   std::to_string(ahead) + " and " + std::to_string(ahead_1) + " ahead, " + std::to_string(counted) + " served");
        } catch (const std::exception& e) {
            fail("DataLoader with masks" + how, e.what());
        }
    }
    DataLoaderConfig plain;
    plain.B = B, plain.T = T, plain.prefetch_depth = 0;
    plain.pattern = g_dir + "/unmasked_*.bin";
    write_shard(g_dir + "/unmasked_000000.bin", tokens[0], 50257);
    try {
        DataLoader loader(plain);
        expect(!loader.has_masks() && loader.counted_targets_ahead(3) == 3 * uint64_t(B) * T,
               "counted_targets_ahead without masks: every target", std::to_string(loader.counted_targets_ahead(3)));
    } catch (const std::exception& e) {
        fail("counted_targets_ahead without masks", e.what());
    }
    plain.pattern = prefix + "_train_*.bin";

    // refusals, each naming the file
    const std::string shard1 = prefix + "_train_000001.bin";
    ::rename(mask_shard_path(shard1).c_str(), (g_dir + "/aside.mask").c_str());
    expect_error("a mask beside some shards only", {shard1, "has no mask shard", "_train_000000.bin has one"},
                 [&] { DataLoader loader(plain); });
    write_mask_shard(mask_shard_path(shard1), std::vector<uint8_t>(masks[1].begin(), masks[1].end() - 1), T);
    expect_error("a mask shorter than its shard", {mask_shard_path(shard1), std::to_string(masks[1].size() - 1) + " mask bytes",
                                                    std::to_string(masks[1].size()) + " tokens"},
                 [&] { DataLoader loader(plain); });
    write_mask_shard(mask_shard_path(shard1), masks[1], 2 * T);
    expect_error("a mask laid out for another window", {mask_shard_path(shard1), "windows of 16 tokens", "T is 8"},
                 [&] { DataLoader loader(plain); });
    write_mask_shard(mask_shard_path(shard1), masks[1], T);
    {  // a byte that is neither 0 nor 1, found when the batch holding it is read
        std::string bytes = read_text(mask_shard_path(shard1));
        bytes[kShardHeaderBytes + 1] = 7;
        write_text(mask_shard_path(shard1), bytes);
        expect_error("a mask byte of 7", {mask_shard_path(shard1), "mask byte 7 at token 1"}, [&] { read_mask_shard(mask_shard_path(shard1)); });
        DataLoaderConfig second = plain;
        second.pattern = shard1;
        expect_error("a mask byte of 7 in a served batch", {mask_shard_path(shard1), "mask byte 7"}, [&] {
            DataLoader loader(second);
            loader.next();
        });
    }
    write_text(mask_shard_path(shard1), read_text(mask_shard_path(shard1)).substr(0, kShardHeaderBytes + 10));
    expect_error("a truncated mask shard", {mask_shard_path(shard1), "size mismatch"}, [&] { MaskReader reader(mask_shard_path(shard1)); });
    write_mask_shard(mask_shard_path(shard1), masks[1], T);
    expect_error("a mask byte of 2 is not written", {"x.mask", "mask byte 2"},
                 [&] { write_mask_shard(g_dir + "/x.mask", std::vector<uint8_t>{0, 2}, T); });
    expect(!file_exists(g_dir + "/x.mask"), "a refused mask leaves no file", "");
    DataLoaderConfig fit = plain;
    fit.fit_to_data = true;
    fit.T = T;
    fit.num_ranks = 2 * windows + 1;  // fewer windows than ranks: a row could only be shorter than T
    fit.rank = 0;
    expect_error("fit_to_data cannot shorten chat windows", {"chat windows cannot be shortened"}, [&] { DataLoader loader(fit); });
}

}  // namespace

int main() {
    check_suite("chat");
    char dir[] = "/tmp/test_chat_XXXXXX";
    if (!::mkdtemp(dir)) {
        std::perror("mkdtemp");
        return 1;
    }
    g_dir = dir;
    try {
        const Tokenizer tok = Tokenizer::load("data/gpt2");
        test_templates(tok);
        test_parse_errors();
        test_prepare_shards(tok);
    } catch (const std::exception& e) {
        fail("data/gpt2 tokenizer", e.what());
    }
    test_dataloader();
    if (std::system(("rm -rf '" + g_dir + "'").c_str()) != 0) std::fprintf(stderr, "cannot remove %s\n", g_dir.c_str());
    return check_failures() == 0 ? 0 : 1;
}
