// Chat data for fine-tuning where only the answers count: reading conversations from JSONL, rendering them through
// a built-in chat template into segments (ordinary text or a special token, each counted in the loss or not), and
// turning segments into tokens and a mask through a small tokenizer interface (ChatTokenizer), so that any tokenizer
// that can encode text and look up a special token's id serves (GPT-2's now; a tokenizer.json's for Llama 3 and Qwen).
// prepare_shards --chat writes the tokens and masks as token and mask shards (docs/formats.md, docs/training.md).
//
// Input, one JSON object per line (blank lines skipped): {"messages": [{"role": "system"|"user"|"assistant",
// "content": "..."}, ...]} or {"prompt": "...", "completion": "..."} (a user turn and the assistant's answer). Other
// keys are skipped. Errors throw std::runtime_error with one line naming the file and the line.
//
// Templates (the `--chat-template` names; a template is ours to render, never a Jinja string):
//   llama3  <|begin_of_text|> then per message <|start_header_id|>ROLE<|end_header_id|> "\n\n" CONTENT <|eot_id|>,
//           CONTENT with leading and trailing white space trimmed (Llama 3 Instruct's template)
//   chatml  per message <|im_start|> "ROLE\n" CONTENT <|im_end|> "\n" (Qwen 2.5's ChatML, without the default system
//           message Qwen's template adds when there is none: put one in the data to have it)
//   plain   <|endoftext|> then per message "System: " / "User: " CONTENT "\n\n", and "Assistant:" " CONTENT"
//           <|endoftext|>; a prompt/completion pair is the raw PROMPT then COMPLETION <|endoftext|> (GPT-2 has no
//           chat tokens: its one special token ends each answer)
// Counted: the assistant's CONTENT and its end-of-turn token (<|eot_id|>, <|im_end|>, <|endoftext|>), or, with
// ChatLoss::kAllTokens, every token but the conversation's first (which nothing in its window predicts).
// Text segments are encoded one by one, so the mask's boundaries are token boundaries.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

enum class ChatTemplate { kLlama3, kChatml, kPlain };
enum class ChatLoss { kAssistant, kAllTokens };

// "llama3", "chatml" or "plain"; throws naming `flag` and the accepted names otherwise.
ChatTemplate parse_chat_template(const std::string& name, const std::string& flag);
const char* chat_template_name(ChatTemplate t);
// The special token that pads a window after a conversation: never counted, never attended to by the conversation.
const char* chat_padding_token(ChatTemplate t);

struct ChatMessage {
    enum Role { kSystem, kUser, kAssistant } role;
    std::string content;
};

struct Conversation {
    std::vector<ChatMessage> messages;
    bool prompt_completion = false;  // from {"prompt", "completion"}: messages are one user and one assistant turn
};

// One JSONL line; `name` and `line_number` (1-based) go into errors.
Conversation parse_chat_line(std::string_view line, const std::string& name, uint64_t line_number);

struct ChatSegment {
    bool special;      // text is a special token's name, e.g. "<|eot_id|>", else ordinary text
    std::string text;
    bool counted;      // its tokens count in the loss (ChatLoss::kAssistant)
};

std::vector<ChatSegment> render_chat(const Conversation& conversation, ChatTemplate t);

// What tokenizing needs of a tokenizer: ordinary text appended as tokens (special-token names in it stay text), and a
// special token's id (throwing, with one line, for a name the tokenizer lacks).
struct ChatTokenizer {
    std::function<void(std::string_view text, std::vector<int>& out)> encode_text;
    std::function<int(const std::string& name)> special_id;
};

struct TokenizedChat {
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;  // 1: the token counts as a target
    uint64_t counted() const;
};

TokenizedChat tokenize_chat(const std::vector<ChatSegment>& segments, const ChatTokenizer& tokenizer, ChatLoss loss);
