// A small strict JSON reader (RFC 8259: no comments, no trailing commas, no duplicate keys), for PEFT folders
// (adapter_config.json, safetensors headers) and tokenizer.json; nesting is bounded so that a hostile file cannot
// exhaust the stack.
// defines: JsonValue, JsonParser, parse_json
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

struct JsonValue {
    enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
    bool boolean = false;
    double number = 0.0;
    std::string text;                                        // kString
    std::vector<JsonValue> items;                            // kArray
    std::vector<std::pair<std::string, JsonValue>> members;  // kObject, in file order
    const JsonValue* find(const std::string& key) const {
        for (const auto& m : members)
            if (m.first == key) return &m.second;
        return nullptr;
    }
    // A number that is an integer in 0..2^53 (exact in a double).
    bool natural() const { return kind == kNumber && number >= 0 && number <= 9007199254740992.0 && number == std::floor(number); }
};

class JsonParser {
public:
    JsonParser(const char* p, size_t n) : p_(p), end_(p + n) {}
    // "" or what is wrong, with the byte offset.
    std::string parse(JsonValue& out) {
        if (!value(out, 0)) return error_;
        space();
        if (p_ != end_) return fail("trailing characters");
        return "";
    }
    // After a failed parse(): what is wrong, without the offset, and the offset of the byte where it was found (a
    // caller that counts lines or columns words it its own way).
    const std::string& error_what() const { return error_what_; }
    size_t error_offset() const { return error_offset_; }

private:
    const char* p_;
    const char* const end_;
    const char* begin_ = p_;
    std::string error_, error_what_;
    size_t error_offset_ = 0;
    static constexpr int kMaxDepth = 64;
    bool fail_(const std::string& what) {
        if (error_.empty()) {
            error_what_ = what;
            error_offset_ = (size_t)(p_ - begin_);
            error_ = what + " at byte " + std::to_string(error_offset_);
        }
        return false;
    }
    std::string fail(const std::string& what) {
        fail_(what);
        return error_;
    }
    void space() {
        while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) p_++;
    }
    bool literal(const char* word) {
        const size_t n = strlen(word);
        if ((size_t)(end_ - p_) < n || memcmp(p_, word, n) != 0) return fail_("unexpected character");
        p_ += n;
        return true;
    }
    bool value(JsonValue& v, int depth) {
        if (depth > kMaxDepth) return fail_("nested too deeply");
        space();
        if (p_ == end_) return fail_("unexpected end");
        switch (*p_) {
            case '{': return object(v, depth);
            case '[': return array(v, depth);
            case '"': v.kind = JsonValue::kString; return string(v.text);
            case 't': v.kind = JsonValue::kBool; v.boolean = true; return literal("true");
            case 'f': v.kind = JsonValue::kBool; v.boolean = false; return literal("false");
            case 'n': v.kind = JsonValue::kNull; return literal("null");
            default: return number(v);
        }
    }
    bool digits() {
        const char* start = p_;
        while (p_ != end_ && *p_ >= '0' && *p_ <= '9') p_++;
        return p_ != start;
    }
    bool number(JsonValue& v) {
        const char* start = p_;
        if (p_ != end_ && *p_ == '-') p_++;
        if (p_ != end_ && *p_ == '0') p_++;
        else if (!digits()) return fail_("unexpected character");
        if (p_ != end_ && *p_ == '.' && (++p_, !digits())) return fail_("bad number");
        if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
            p_++;
            if (p_ != end_ && (*p_ == '+' || *p_ == '-')) p_++;
            if (!digits()) return fail_("bad number");
        }
        v.kind = JsonValue::kNumber;
        v.number = strtod(std::string(start, p_).c_str(), nullptr);
        return true;
    }
    static void utf8(std::string& s, uint32_t c) {
        if (c < 0x80) s += (char)c;
        else if (c < 0x800) s += (char)(0xC0 | c >> 6), s += (char)(0x80 | (c & 0x3F));
        else if (c < 0x10000) s += (char)(0xE0 | c >> 12), s += (char)(0x80 | (c >> 6 & 0x3F)), s += (char)(0x80 | (c & 0x3F));
        else s += (char)(0xF0 | c >> 18), s += (char)(0x80 | (c >> 12 & 0x3F)), s += (char)(0x80 | (c >> 6 & 0x3F)), s += (char)(0x80 | (c & 0x3F));
    }
    bool hex4(uint32_t& c) {
        if (end_ - p_ < 4) return fail_("bad \\u escape");
        c = 0;
        for (int i = 0; i < 4; i++, p_++) {
            const char h = *p_;
            const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return fail_("bad \\u escape");
            c = c << 4 | d;
        }
        return true;
    }
    bool string(std::string& s) {
        p_++;  // the opening quote
        s.clear();
        while (true) {
            if (p_ == end_) return fail_("unterminated string");
            const unsigned char ch = *p_++;
            if (ch == '"') return true;
            if (ch < 0x20) return fail_("control character in a string");
            if (ch != '\\') {
                s += (char)ch;
                continue;
            }
            if (p_ == end_) return fail_("unterminated string");
            const char e = *p_++;
            switch (e) {
                case '"': case '\\': case '/': s += e; break;
                case 'b': s += '\b'; break;
                case 'f': s += '\f'; break;
                case 'n': s += '\n'; break;
                case 'r': s += '\r'; break;
                case 't': s += '\t'; break;
                case 'u': {
                    uint32_t c = 0;
                    if (!hex4(c)) return false;
                    if (c >= 0xD800 && c < 0xDC00) {  // a surrogate pair's first half: its second must follow
                        uint32_t low = 0;
                        if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u' || (p_ += 2, !hex4(low)) || low < 0xDC00 || low >= 0xE000)
                            return fail_("unpaired surrogate");
                        c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
                    } else if (c >= 0xDC00 && c < 0xE000) {
                        return fail_("unpaired surrogate");
                    }
                    utf8(s, c);
                    break;
                }
                default: return fail_("bad escape");
            }
        }
    }
    bool array(JsonValue& v, int depth) {
        v.kind = JsonValue::kArray;
        p_++;
        space();
        if (p_ != end_ && *p_ == ']') return p_++, true;
        while (true) {
            v.items.emplace_back();
            if (!value(v.items.back(), depth + 1)) return false;
            space();
            if (p_ == end_) return fail_("unterminated array");
            if (*p_ == ']') return p_++, true;
            if (*p_++ != ',') return fail_("expected , or ]");
        }
    }
    // Objects of more members (a tokenizer's vocabulary: 100k+) are checked once, sorted, when they close.
    static constexpr size_t kLinearKeyCheck = 32;
    bool no_duplicate_keys(const JsonValue& v) {
        if (v.members.size() <= kLinearKeyCheck) return true;
        std::vector<const std::string*> keys;
        keys.reserve(v.members.size());
        for (const auto& m : v.members) keys.push_back(&m.first);
        std::sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
        for (size_t i = 1; i < keys.size(); i++)
            if (*keys[i] == *keys[i - 1]) return fail_("duplicate key \"" + *keys[i] + "\"");
        return true;
    }
    bool object(JsonValue& v, int depth) {
        v.kind = JsonValue::kObject;
        p_++;
        space();
        if (p_ != end_ && *p_ == '}') return p_++, true;
        while (true) {
            space();
            if (p_ == end_ || *p_ != '"') return fail_("expected a key");
            std::string key;
            if (!string(key)) return false;
            if (v.members.size() < kLinearKeyCheck && v.find(key) != nullptr) return fail_("duplicate key \"" + key + "\"");
            space();
            if (p_ == end_ || *p_++ != ':') return fail_("expected :");
            v.members.emplace_back(key, JsonValue());
            if (!value(v.members.back().second, depth + 1)) return false;
            space();
            if (p_ == end_) return fail_("unterminated object");
            if (*p_ == '}') return p_++, no_duplicate_keys(v);
            if (*p_++ != ',') return fail_("expected , or }");
        }
    }
};
// "" or what is wrong.
inline std::string parse_json(const std::string& text, JsonValue& out) { return JsonParser(text.data(), text.size()).parse(out); }
