// HellaSwag: a strict reader for the jsonl lines, and the batcher that renders, packs and scores items (the
// rendering convention is in hellaswag.h). The model's forward and the per-position losses are the trainer's.
#include "hellaswag.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "text_reader.h"
#include "tokenizer.h"

namespace {

// Parses one line as a JSON object of HellaSwag fields. Accepts only what the data holds: objects, arrays,
// strings (every JSON escape) and integers; true/false/null and non-integral numbers are errors.
class LineParser {
public:
    LineParser(std::string_view line, const std::string& name, int line_no)
        : line_(line), name_(name), line_no_(line_no) {}

    HellaSwagItem item() {
        static const char* const kKeys[] = {"ind", "activity_label", "ctx", "label", "endings"};
        HellaSwagItem item;
        bool seen[5] = {};
        skip_ws();
        expect('{');
        skip_ws();
        if (peek() == '}') {
            ++pos_;
        } else {
            for (;;) {
                skip_ws();
                const std::string key = string();
                skip_ws();
                expect(':');
                skip_ws();
                const int k = static_cast<int>(std::find(std::begin(kKeys), std::end(kKeys), key) - std::begin(kKeys));
                if (k < 5) {
                    if (seen[k]) fail("duplicate key \"" + key + "\"");
                    seen[k] = true;
                }
                switch (k) {
                    case 0: item.ind = integer(); break;
                    case 1: item.activity_label = string(); break;
                    case 2: item.ctx = string(); break;
                    case 3:
                        item.label = integer();
                        if (item.label < 0 || item.label > 3)
                            fail("label " + std::to_string(item.label) + " is not 0..3");
                        break;
                    case 4: endings(item.endings); break;
                    default: skip_value(0);
                }
                skip_ws();
                if (peek() != ',') break;
                ++pos_;
            }
            expect('}');
        }
        skip_ws();
        if (pos_ < line_.size()) fail("unexpected " + found() + " after the object");
        for (int k = 0; k < 5; ++k)
            if (!seen[k]) fail(std::string("missing key \"") + kKeys[k] + "\"");
        return item;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw std::runtime_error(name_ + ": line " + std::to_string(line_no_) + ", column " +
                                 std::to_string(pos_ + 1) + ": " + what);
    }
    int peek() const { return pos_ < line_.size() ? static_cast<unsigned char>(line_[pos_]) : -1; }
    std::string found() const {
        const int c = peek();
        if (c < 0) return "end of line";
        if (c < 0x20 || c >= 0x7f) return "byte " + std::to_string(c);
        return std::string("'") + static_cast<char>(c) + "'";
    }
    void skip_ws() {
        while (peek() == ' ' || peek() == '\t' || peek() == '\r') ++pos_;  // '\n' ends the line
    }
    void expect(char c) {
        if (peek() != c) fail(std::string("expected '") + c + "', found " + found());
        ++pos_;
    }
    bool digit() const { return peek() >= '0' && peek() <= '9'; }

    int integer() {
        const bool negative = peek() == '-';
        if (negative) ++pos_;
        if (!digit()) fail("expected an integer, found " + found());
        if (peek() == '0' && pos_ + 1 < line_.size() && line_[pos_ + 1] >= '0' && line_[pos_ + 1] <= '9')
            fail("integer with a leading zero");
        long long value = 0;
        while (digit()) {
            value = value * 10 + (line_[pos_++] - '0');
            if (value > static_cast<long long>(INT_MAX) + 1) fail("integer out of range");
        }
        if (peek() == '.' || peek() == 'e' || peek() == 'E') fail("expected an integer, found a fraction or exponent");
        if (!negative && value > INT_MAX) fail("integer out of range");
        return static_cast<int>(negative ? -value : value);
    }

    unsigned hex4() {
        unsigned v = 0;
        for (int i = 0; i < 4; ++i) {
            const int c = peek();
            const int d = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
            if (d < 0) fail("expected 4 hex digits after \\u, found " + found());
            v = v * 16 + d;
            ++pos_;
        }
        return v;
    }

    static void append_utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | cp >> 6);
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | cp >> 12);
            out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | cp >> 18);
            out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
            out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    // Bytes outside escapes are copied as they are (the tokenizer accepts any bytes).
    std::string string() {
        expect('"');
        std::string out;
        for (;;) {
            const int c = peek();
            if (c < 0) fail("unterminated string");
            if (c < 0x20) fail("raw control character " + std::to_string(c) + " in a string");
            ++pos_;
            if (c == '"') return out;
            if (c != '\\') {
                out += static_cast<char>(c);
                continue;
            }
            const int e = peek();
            if (e < 0) fail("unterminated string");
            if (e != 'u') {
                static const char kFrom[] = "\"\\/bfnrt", kTo[] = "\"\\/\b\f\n\r\t";
                const char* at = e ? std::strchr(kFrom, e) : nullptr;
                if (!at) fail("invalid escape: backslash followed by " + found());
                out += kTo[at - kFrom];
                ++pos_;
                continue;
            }
            ++pos_;
            unsigned cp = hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {  // a character beyond the BMP, as a surrogate pair
                if (peek() != '\\' || pos_ + 1 >= line_.size() || line_[pos_ + 1] != 'u')
                    fail("high surrogate \\u escape not followed by a low one");
                pos_ += 2;
                const unsigned low = hex4();
                if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate \\u escape not followed by a low one");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            append_utf8(out, cp);
        }
    }

    void endings(std::array<std::string, 4>& out) {
        expect('[');
        size_t n = 0;
        skip_ws();
        if (peek() != ']') {
            for (;;) {
                skip_ws();
                std::string s = string();
                if (n < out.size()) out[n] = std::move(s);
                ++n;
                skip_ws();
                if (peek() != ',') break;
                ++pos_;
            }
        }
        expect(']');
        if (n != out.size()) fail("endings has " + std::to_string(n) + " strings, expected 4");
    }

    // Skips the value of a key this reader does not use; depth bounds the recursion on hostile input.
    void skip_value(int depth) {
        if (depth > 64) fail("nested too deeply");
        const int c = peek();
        if (c == '"') {
            string();
        } else if (c == '-' || digit()) {
            integer();
        } else if (c == '[' || c == '{') {
            const char close = c == '[' ? ']' : '}';
            ++pos_;
            skip_ws();
            if (peek() == close) {
                ++pos_;
                return;
            }
            for (;;) {
                skip_ws();
                if (close == '}') {
                    string();
                    skip_ws();
                    expect(':');
                    skip_ws();
                }
                skip_value(depth + 1);
                skip_ws();
                if (peek() != ',') break;
                ++pos_;
            }
            expect(close);
        } else {
            fail("expected a string, integer, array or object, found " + found());
        }
    }

    std::string_view line_;
    const std::string& name_;
    int line_no_;
    size_t pos_ = 0;
};

}  // namespace

std::vector<HellaSwagItem> parse_hellaswag(const std::string& text, const std::string& name) {
    std::vector<HellaSwagItem> items;
    size_t start = 0;
    int line_no = 0;
    while (start < text.size()) {  // a final newline ends the last line rather than starting an empty one
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        items.push_back(LineParser(std::string_view(text).substr(start, end - start), name, ++line_no).item());
        start = end + 1;
    }
    if (items.empty()) throw std::runtime_error(name + ": no items");
    return items;
}

std::vector<HellaSwagItem> load_hellaswag(const std::string& path) {
    return parse_hellaswag(read_text_file(path), path);
}

HellaSwagBatcher::HellaSwagBatcher(const std::vector<HellaSwagItem>& items, const Tokenizer& tok, int B, int T)
    : B_(B), T_(T), eot_(std::max(tok.eot(), 0)) {  // the padding's token: any id (padded positions are not scored)
    if (B <= 0 || B % 4 != 0 || T <= 0)
        throw std::invalid_argument("HellaSwagBatcher: B must be a positive multiple of 4 and T positive (B=" +
                                    std::to_string(B) + ", T=" + std::to_string(T) + ")");
    items_.reserve(items.size());
    for (const HellaSwagItem& item : items) {
        const std::string where = "hellaswag item ind " + std::to_string(item.ind) + ": ";
        Rendered r;
        r.ctx = tok.encode(item.ctx);
        r.label = item.label;
        size_t longest = 0;
        for (int i = 0; i < 4; ++i) {
            r.endings[i] = tok.encode(" " + item.endings[i]);
            longest = std::max(longest, r.endings[i].size());
        }
        // The first ending token is predicted at the last context position, so one context token must stay.
        if (r.ctx.empty()) throw std::runtime_error(where + "the context is empty");
        if (longest > static_cast<size_t>(T))
            throw std::runtime_error(where + "an ending of " + std::to_string(longest) +
                                     " tokens leaves no room for context at T=" + std::to_string(T));
        const size_t length = r.ctx.size() + longest;
        max_length_ = std::max(max_length_, static_cast<int>(length));
        // too long for a row of T + 1 tokens: the context loses its oldest tokens (counted in truncated_)
        if (length > static_cast<size_t>(T) + 1) {
            r.ctx.erase(r.ctx.begin(), r.ctx.begin() + (length - T - 1));
            ++truncated_;
        }
        items_.push_back(std::move(r));
    }
}

int HellaSwagBatcher::fill(int batch, int32_t* inputs, int32_t* targets, uint8_t* mask) const {
    if (batch < 0 || batch >= num_batches())
        throw std::out_of_range("HellaSwagBatcher::fill: batch " + std::to_string(batch) + " of " +
                                std::to_string(num_batches()));
    // an item is 4 rows, one per candidate; rows past the last item stay EOT with nothing masked, so a short
    // last batch runs at full shape and scores only its items
    const size_t size = static_cast<size_t>(B_) * T_;
    std::fill(inputs, inputs + size, eot_);
    std::fill(targets, targets + size, eot_);
    std::fill(mask, mask + size, 0);
    const int first = batch * items_per_batch();
    const int count = std::min(items_per_batch(), num_items() - first);
    for (int j = 0; j < count; ++j) {
        const Rendered& r = items_[first + j];
        const int c = static_cast<int>(r.ctx.size());
        for (int i = 0; i < 4; ++i) {
            const std::vector<int>& ending = r.endings[i];
            const int n = c + static_cast<int>(ending.size());
            auto token = [&](int k) { return k < c ? r.ctx[k] : ending[k - c]; };
            const size_t row = static_cast<size_t>(4 * j + i) * T_;
            for (int t = 0; t + 1 < n; ++t) {
                inputs[row + t] = token(t);
                targets[row + t] = token(t + 1);
            }
            std::fill(mask + row + c - 1, mask + row + n - 1, 1);  // the positions whose targets are the ending
        }
    }
    return count;
}

void HellaSwagBatcher::score(int batch, const float* losses, HellaSwagScore& score) const {
    if (batch < 0 || batch >= num_batches())
        throw std::out_of_range("HellaSwagBatcher::score: batch " + std::to_string(batch) + " of " +
                                std::to_string(num_batches()));
    const int first = batch * items_per_batch();
    const int count = std::min(items_per_batch(), num_items() - first);
    for (int j = 0; j < count; ++j) {
        const Rendered& r = items_[first + j];
        int best_sum = 0, best_mean = 0;
        double min_sum = 0.0, min_mean = 0.0;
        for (int i = 0; i < 4; ++i) {
            // The masked positions of row 4j+i: c-1 .. c+len-2, the targets that are ending tokens.
            const size_t len = r.endings[i].size();
            const float* l = losses + static_cast<size_t>(4 * j + i) * T_ + r.ctx.size() - 1;
            double sum = 0.0;
            for (size_t t = 0; t < len; ++t) sum += l[t];
            const double mean = sum / static_cast<double>(len);
            // Strict comparisons: ties go to the lower index, like torch.argmin.
            if (i == 0 || sum < min_sum) min_sum = sum, best_sum = i;
            if (i == 0 || mean < min_mean) min_mean = mean, best_mean = i;
        }
        ++score.items;
        score.correct_sum += best_sum == r.label;
        score.correct_mean += best_mean == r.label;
    }
}
