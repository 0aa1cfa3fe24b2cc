// Chat JSONL reading, the built-in templates and their tokenizing (the conventions are in chat.h).
#include "chat.h"

#include <algorithm>
#include <stdexcept>

namespace {

// A strict JSON reader for one line (RFC 8259: no comments, no trailing commas, no duplicate keys of the fields
// read), holding only what a conversation needs: the values of other keys are checked and skipped.
class ChatLineParser {
public:
    ChatLineParser(std::string_view line, const std::string& name, uint64_t line_number)
        : line_(line), name_(name), line_number_(line_number) {}

    Conversation conversation() {
        Conversation c;
        bool has_messages = false, has_prompt = false, has_completion = false;
        std::string prompt, completion;
        object([&](const std::string& key) {
            if (key == "messages") {
                once(has_messages, key);
                messages(c.messages);
            } else if (key == "prompt") {
                once(has_prompt, key);
                prompt = string_value(key);
            } else if (key == "completion") {
                once(has_completion, key);
                completion = string_value(key);
            } else {
                skip_value(0);
            }
        });
        skip_space();
        if (pos_ < line_.size()) fail("unexpected " + found() + " after the object");
        if (has_messages && (has_prompt || has_completion))
            fail("both \"messages\" and \"prompt\"/\"completion\": expected one form");
        if (has_prompt != has_completion)
            fail(std::string("\"") + (has_prompt ? "prompt" : "completion") + "\" without \"" +
                 (has_prompt ? "completion" : "prompt") + "\"");
        if (has_prompt) {
            c.prompt_completion = true;
            c.messages = {{ChatMessage::kUser, prompt}, {ChatMessage::kAssistant, completion}};
        }
        if (!has_messages && !has_prompt) fail("expected a \"messages\" array or \"prompt\" and \"completion\" strings");
        if (std::none_of(c.messages.begin(), c.messages.end(),
                         [](const ChatMessage& m) { return m.role == ChatMessage::kAssistant; }))
            fail("the conversation has no assistant turn (nothing to learn from)");
        return c;
    }

private:
    static constexpr int kMaxDepth = 64;  // a hostile line cannot exhaust the stack

    [[noreturn]] void fail(const std::string& what) const {
        throw std::runtime_error(name_ + ": line " + std::to_string(line_number_) + ", column " +
                                 std::to_string(pos_ + 1) + ": " + what);
    }
    int peek() const { return pos_ < line_.size() ? static_cast<unsigned char>(line_[pos_]) : -1; }
    std::string found() const {
        const int c = peek();
        if (c < 0) return "end of line";
        if (c < 0x20 || c >= 0x7f) return "byte " + std::to_string(c);
        return std::string("'") + static_cast<char>(c) + "'";
    }
    void skip_space() {
        while (peek() == ' ' || peek() == '\t' || peek() == '\r') ++pos_;
    }
    void expect(char c) {
        skip_space();
        if (peek() != c) fail(std::string("expected '") + c + "', found " + found());
        ++pos_;
    }
    void once(bool& seen, const std::string& key) {
        if (seen) fail("duplicate key \"" + key + "\"");
        seen = true;
    }

    // {"key": value, ...}: member(key) reads each value.
    template <typename Member>
    void object(Member&& member) {
        expect('{');
        skip_space();
        if (peek() == '}') {
            ++pos_;
            return;
        }
        for (;;) {
            skip_space();
            if (peek() != '"') fail("expected a key, found " + found());
            const std::string key = string();
            expect(':');
            skip_space();
            member(key);
            skip_space();
            if (peek() == '}') {
                ++pos_;
                return;
            }
            expect(',');
        }
    }

    void messages(std::vector<ChatMessage>& out) {
        skip_space();
        if (peek() != '[') fail("\"messages\" must be an array, found " + found());
        ++pos_;
        skip_space();
        if (peek() == ']') fail("\"messages\" is empty");
        for (;;) {
            out.push_back(message(out.size()));
            skip_space();
            if (peek() == ']') {
                ++pos_;
                return;
            }
            expect(',');
        }
    }

    ChatMessage message(size_t index) {
        skip_space();
        const std::string where = "message " + std::to_string(index);
        if (peek() != '{') fail(where + " must be an object, found " + found());
        bool has_role = false, has_content = false;
        std::string role;
        ChatMessage m{ChatMessage::kUser, ""};
        object([&](const std::string& key) {
            if (key == "role") {
                once(has_role, key);
                role = string_value(where + "'s \"role\"");
            } else if (key == "content") {
                once(has_content, key);
                m.content = string_value(where + "'s \"content\"");
            } else {
                skip_value(0);
            }
        });
        if (!has_role) fail(where + " has no \"role\"");
        if (!has_content) fail(where + " has no \"content\"");
        if (role == "system") m.role = ChatMessage::kSystem;
        else if (role == "user") m.role = ChatMessage::kUser;
        else if (role == "assistant") m.role = ChatMessage::kAssistant;
        else fail(where + " has the unknown role \"" + role + "\" (expected system, user or assistant)");
        return m;
    }

    std::string string_value(const std::string& what) {
        skip_space();
        if (peek() != '"') fail(what + " must be a string, found " + found());
        return string();
    }

    unsigned hex4() {
        unsigned v = 0;
        for (int i = 0; i < 4; ++i) {
            const int c = peek();
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) fail("bad \\u escape: expected a hex digit, found " + found());
            v = v << 4 | static_cast<unsigned>(d);
            ++pos_;
        }
        return v;
    }
    static void append_utf8(std::string& s, unsigned c) {
        if (c < 0x80) {
            s += static_cast<char>(c);
        } else if (c < 0x800) {
            s += static_cast<char>(0xC0 | c >> 6);
            s += static_cast<char>(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            s += static_cast<char>(0xE0 | c >> 12);
            s += static_cast<char>(0x80 | (c >> 6 & 0x3F));
            s += static_cast<char>(0x80 | (c & 0x3F));
        } else {
            s += static_cast<char>(0xF0 | c >> 18);
            s += static_cast<char>(0x80 | (c >> 12 & 0x3F));
            s += static_cast<char>(0x80 | (c >> 6 & 0x3F));
            s += static_cast<char>(0x80 | (c & 0x3F));
        }
    }
    // At the opening quote.
    std::string string() {
        ++pos_;
        std::string s;
        for (;;) {
            const int c = peek();
            if (c < 0) fail("unterminated string");
            ++pos_;
            if (c == '"') return s;
            if (c < 0x20) fail("control character " + std::to_string(c) + " in a string");
            if (c != '\\') {
                s += static_cast<char>(c);
                continue;
            }
            const int e = peek();
            ++pos_;
            switch (e) {
                case '"': case '\\': case '/': s += static_cast<char>(e); break;
                case 'b': s += '\b'; break;
                case 'f': s += '\f'; break;
                case 'n': s += '\n'; break;
                case 'r': s += '\r'; break;
                case 't': s += '\t'; break;
                case 'u': {
                    unsigned code = hex4();
                    if (code >= 0xD800 && code < 0xDC00) {  // a surrogate pair's first half: the second must follow
                        if (peek() != '\\' || pos_ + 1 >= line_.size() || line_[pos_ + 1] != 'u') fail("unpaired surrogate");
                        pos_ += 2;
                        const unsigned low = hex4();
                        if (low < 0xDC00 || low >= 0xE000) fail("unpaired surrogate");
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                    } else if (code >= 0xDC00 && code < 0xE000) {
                        fail("unpaired surrogate");
                    }
                    append_utf8(s, code);
                    break;
                }
                default: --pos_; fail("bad escape \\" + found());
            }
        }
    }

    void skip_digits() {
        if (!(peek() >= '0' && peek() <= '9')) fail("bad number: expected a digit, found " + found());
        while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    void skip_value(int depth) {
        if (depth > kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
        skip_space();
        const int c = peek();
        if (c == '"') {
            string();
        } else if (c == '{') {
            object([&](const std::string&) { skip_value(depth + 1); });
        } else if (c == '[') {
            ++pos_;
            skip_space();
            if (peek() == ']') {
                ++pos_;
                return;
            }
            for (;;) {
                skip_value(depth + 1);
                skip_space();
                if (peek() == ']') {
                    ++pos_;
                    return;
                }
                expect(',');
            }
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (c == '-') ++pos_;
            if (peek() == '0') ++pos_;
            else skip_digits();
            if (peek() == '.') ++pos_, skip_digits();
            if (peek() == 'e' || peek() == 'E') {
                ++pos_;
                if (peek() == '+' || peek() == '-') ++pos_;
                skip_digits();
            }
        } else {
            for (const char* word : {"true", "false", "null"})
                if (line_.substr(pos_, std::string_view(word).size()) == word) {
                    pos_ += std::string_view(word).size();
                    return;
                }
            fail("expected a value, found " + found());
        }
    }

    std::string_view line_;
    const std::string& name_;
    uint64_t line_number_;
    size_t pos_ = 0;
};

std::string trim(const std::string& s) {
    const char* space = " \t\n\r\f\v";
    const size_t begin = s.find_first_not_of(space);
    if (begin == std::string::npos) return "";
    return s.substr(begin, s.find_last_not_of(space) - begin + 1);
}

const char* role_name(ChatMessage::Role role) {
    switch (role) {
        case ChatMessage::kSystem: return "system";
        case ChatMessage::kUser: return "user";
        case ChatMessage::kAssistant: return "assistant";
    }
    return "";
}

}  // namespace

ChatTemplate parse_chat_template(const std::string& name, const std::string& flag) {
    if (name == "llama3") return ChatTemplate::kLlama3;
    if (name == "chatml") return ChatTemplate::kChatml;
    if (name == "plain") return ChatTemplate::kPlain;
    throw std::runtime_error(flag + " " + name + ": expected llama3, chatml or plain (a built-in template's name)");
}

const char* chat_template_name(ChatTemplate t) {
    switch (t) {
        case ChatTemplate::kLlama3: return "llama3";
        case ChatTemplate::kChatml: return "chatml";
        case ChatTemplate::kPlain: return "plain";
    }
    return "";
}

const char* chat_padding_token(ChatTemplate t) {
    switch (t) {
        case ChatTemplate::kLlama3: return "<|end_of_text|>";
        case ChatTemplate::kChatml: return "<|endoftext|>";  // Qwen 2.5's pad token
        case ChatTemplate::kPlain: return "<|endoftext|>";
    }
    return "";
}

Conversation parse_chat_line(std::string_view line, const std::string& name, uint64_t line_number) {
    return ChatLineParser(line, name, line_number).conversation();
}

std::vector<ChatSegment> render_chat(const Conversation& conversation, ChatTemplate t) {
    std::vector<ChatSegment> out;
    auto text = [&](std::string s, bool counted = false) {
        if (!s.empty()) out.push_back({false, std::move(s), counted});
    };
    auto special = [&](const char* name, bool counted = false) { out.push_back({true, name, counted}); };
    switch (t) {
        case ChatTemplate::kLlama3:
            special("<|begin_of_text|>");
            for (const ChatMessage& m : conversation.messages) {
                const bool answer = m.role == ChatMessage::kAssistant;
                special("<|start_header_id|>");
                text(role_name(m.role));
                special("<|end_header_id|>");
                text("\n\n");
                text(trim(m.content), answer);
                special("<|eot_id|>", answer);
            }
            break;
        case ChatTemplate::kChatml:
            for (const ChatMessage& m : conversation.messages) {
                const bool answer = m.role == ChatMessage::kAssistant;
                special("<|im_start|>");
                text(std::string(role_name(m.role)) + "\n");
                text(m.content, answer);
                special("<|im_end|>", answer);
                text("\n");
            }
            break;
        case ChatTemplate::kPlain:
            special("<|endoftext|>");
            for (const ChatMessage& m : conversation.messages) {
                if (m.role == ChatMessage::kAssistant) {
                    if (!conversation.prompt_completion) text("Assistant:");
                    text(conversation.prompt_completion ? m.content : " " + m.content, true);
                    special("<|endoftext|>", true);
                } else if (conversation.prompt_completion) {
                    text(m.content);
                } else {
                    text(std::string(m.role == ChatMessage::kSystem ? "System: " : "User: ") + m.content + "\n\n");
                }
            }
            break;
    }
    return out;
}

uint64_t TokenizedChat::counted() const { return static_cast<uint64_t>(std::count(mask.begin(), mask.end(), uint8_t(1))); }

TokenizedChat tokenize_chat(const std::vector<ChatSegment>& segments, const ChatTokenizer& tokenizer, ChatLoss loss) {
    TokenizedChat out;
    std::vector<int> ids;
    for (const ChatSegment& segment : segments) {
        ids.clear();
        if (segment.special) ids.push_back(tokenizer.special_id(segment.text));
        else tokenizer.encode_text(segment.text, ids);
        const uint8_t counted = loss == ChatLoss::kAllTokens || segment.counted ? 1 : 0;
        for (int id : ids) {
            out.tokens.push_back(static_cast<uint32_t>(id));
            out.mask.push_back(counted);
        }
    }
    if (!out.mask.empty()) out.mask[0] = 0;  // the conversation's first token: nothing before it in its window
    return out;
}
