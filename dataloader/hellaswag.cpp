// HellaSwag: the jsonl lines' reader, and the batcher that renders, packs and scores items (the
// rendering convention is in hellaswag.h). The model's forward and the per-position losses are the trainer's.
#include "hellaswag.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "json.h"
#include "text_reader.h"
#include "tokenizer.h"

namespace {

// One line as a JSON object of HellaSwag fields (dataloader/json.h reads it; keys it does not use may hold anything).
HellaSwagItem parse_item(std::string_view line, const std::string& name, int line_no) {
    const std::string at = name + ": line " + std::to_string(line_no);
    auto fail = [&](const std::string& what) { throw std::runtime_error(at + ": " + what); };
    JsonValue root;
    JsonParser parser(line.data(), line.size());
    if (!parser.parse(root).empty()) fail("column " + std::to_string(parser.error_offset() + 1) + ": " + parser.error_what() + " (not JSON)");
    if (root.kind != JsonValue::kObject) fail("expected a JSON object");
    auto field = [&](const char* key) -> const JsonValue& {
        const JsonValue* v = root.find(key);
        if (!v) fail(std::string("missing key \"") + key + "\"");
        return *v;
    };
    auto text = [&](const JsonValue& v, const std::string& what) -> std::string {
        if (v.kind != JsonValue::kString) fail(what + " must be a string");
        return v.text;
    };
    auto integer = [&](const char* key) -> int {
        const JsonValue& v = field(key);
        if (v.kind != JsonValue::kNumber || v.number != std::floor(v.number) || std::fabs(v.number) > INT_MAX)
            fail(std::string("\"") + key + "\" must be an integer of int range");
        return static_cast<int>(v.number);
    };
    HellaSwagItem item;
    item.ind = integer("ind");
    item.activity_label = text(field("activity_label"), "\"activity_label\"");
    item.ctx = text(field("ctx"), "\"ctx\"");
    item.label = integer("label");
    if (item.label < 0 || item.label > 3) fail("label " + std::to_string(item.label) + " is not 0..3");
    const JsonValue& endings = field("endings");
    if (endings.kind != JsonValue::kArray || endings.items.size() != item.endings.size())
        fail("\"endings\" must be an array of 4 strings" +
             (endings.kind == JsonValue::kArray ? " (it has " + std::to_string(endings.items.size()) + ")" : std::string()));
    for (size_t i = 0; i < item.endings.size(); ++i) item.endings[i] = text(endings.items[i], "ending " + std::to_string(i));
    return item;
}

}  // namespace

std::vector<HellaSwagItem> parse_hellaswag(const std::string& text, const std::string& name) {
    std::vector<HellaSwagItem> items;
    size_t start = 0;
    int line_no = 0;
    while (start < text.size()) {  // a final newline ends the last line rather than starting an empty one
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        items.push_back(parse_item(std::string_view(text).substr(start, end - start), name, ++line_no));
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
