// Fuzzes the chat JSONL reader and the templates (dataloader/chat.cpp): the input is one line of a JSONL file. A
// refused line must throw; an accepted conversation must render through every template into tokens and a mask of
// the same length whose first byte is 0 and which counts at least its end-of-turn token (it has an assistant turn).
#include "fuzz_util.h"
#include "dataloader/chat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view line(reinterpret_cast<const char*>(data), size);
    Conversation conversation;
    if (refused([&] { conversation = parse_chat_line(line, "fuzz.jsonl", 1); })) return 0;
    // every byte of text is one token and every special token one id: what the mask must line up with
    const ChatTokenizer tokenizer{[](std::string_view text, std::vector<int>& out) {
                                      for (unsigned char c : text) out.push_back(c);
                                  },
                                  [](const std::string& name) { return 256 + static_cast<int>(name.size()); }};
    for (ChatTemplate t : {ChatTemplate::kLlama3, ChatTemplate::kChatml, ChatTemplate::kPlain}) {
        for (ChatLoss loss : {ChatLoss::kAssistant, ChatLoss::kAllTokens}) {
            const TokenizedChat chat = tokenize_chat(render_chat(conversation, t), tokenizer, loss);
            FUZZ_CHECK(chat.tokens.size() == chat.mask.size() && !chat.tokens.empty(), "a mask byte per token");
            FUZZ_CHECK(chat.mask[0] == 0, "the first token never counts");
            FUZZ_CHECK(chat.counted() >= 1, "an assistant turn counts its end-of-turn token at least");
        }
    }
    return 0;
}
