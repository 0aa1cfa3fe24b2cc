// Chat JSONL reading, the built-in templates and their tokenizing (the conventions are in chat.h).
#include "chat.h"

#include <algorithm>
#include <stdexcept>

#include "json.h"

namespace {

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
    const std::string at = name + ": line " + std::to_string(line_number);
    auto fail = [&](const std::string& what) -> void { throw std::runtime_error(at + ": " + what); };
    JsonValue root;
    JsonParser parser(line.data(), line.size());
    if (!parser.parse(root).empty()) fail("column " + std::to_string(parser.error_offset() + 1) + ": " + parser.error_what() + " (not JSON)");
    if (root.kind != JsonValue::kObject) fail("expected a JSON object");
    auto text_of = [&](const JsonValue& v, const std::string& what) -> std::string {
        if (v.kind != JsonValue::kString) fail(what + " must be a string");
        return v.text;
    };
    Conversation c;
    const JsonValue *messages = root.find("messages"), *prompt = root.find("prompt"), *completion = root.find("completion");
    if (messages && (prompt || completion)) fail("both \"messages\" and \"prompt\"/\"completion\": expected one form");
    if ((prompt != nullptr) != (completion != nullptr))
        fail(std::string("\"") + (prompt ? "prompt" : "completion") + "\" without \"" + (prompt ? "completion" : "prompt") + "\"");
    if (prompt) {
        c.prompt_completion = true;
        c.messages = {{ChatMessage::kUser, text_of(*prompt, "\"prompt\"")}, {ChatMessage::kAssistant, text_of(*completion, "\"completion\"")}};
    } else if (messages) {
        if (messages->kind != JsonValue::kArray) fail("\"messages\" must be an array");
        if (messages->items.empty()) fail("\"messages\" is empty");
        for (size_t i = 0; i < messages->items.size(); i++) {
            const JsonValue& item = messages->items[i];
            const std::string where = "message " + std::to_string(i);
            if (item.kind != JsonValue::kObject) fail(where + " must be an object");
            const JsonValue *role = item.find("role"), *content = item.find("content");
            if (!role) fail(where + " has no \"role\"");
            if (!content) fail(where + " has no \"content\"");
            const std::string name_of_role = text_of(*role, where + "'s \"role\"");
            ChatMessage m{ChatMessage::kUser, text_of(*content, where + "'s \"content\"")};
            if (name_of_role == "system") m.role = ChatMessage::kSystem;
            else if (name_of_role == "user") m.role = ChatMessage::kUser;
            else if (name_of_role == "assistant") m.role = ChatMessage::kAssistant;
            else fail(where + " has the unknown role \"" + name_of_role + "\" (expected system, user or assistant)");
            c.messages.push_back(std::move(m));
        }
    } else {
        fail("expected a \"messages\" array or \"prompt\" and \"completion\" strings");
    }
    if (std::none_of(c.messages.begin(), c.messages.end(), [](const ChatMessage& m) { return m.role == ChatMessage::kAssistant; }))
        fail("the conversation has no assistant turn (nothing to learn from)");
    return c;
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
