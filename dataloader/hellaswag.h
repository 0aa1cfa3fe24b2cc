// HellaSwag evaluation: loading the jsonl file, rendering items into token sequences, packing them into
// fixed B x T batches, and scoring the model's per-position losses.
//
// Rendering follows llm.c / nanoGPT (dev/data/hellaswag.py): context tokens = encode(ctx); ending i's
// tokens = encode(" " + endings[i]); candidate i is context + ending i. The model's answer is the candidate
// whose ending tokens have the lowest loss: "acc" compares the summed loss over the ending, "acc_norm" (the
// number llm.c reports) the mean loss per ending token.
//
// Packing: each item takes 4 consecutive rows, row 4j+i holding candidate i of the batch's item j. A row
// with candidate tokens s[0..n-1] has inputs s[0..n-2] and targets s[1..n-1], padded to T with EOT; the
// mask is 1 where the target is an ending token (positions c-1 .. n-2 for c context tokens). Rows of a
// partial last batch are all EOT with mask 0. A candidate longer than T+1 tokens loses context tokens from
// the left (the ending stays whole); such items are counted in truncated().
//
// Errors (unreadable files, malformed JSON, missing or invalid fields) throw std::runtime_error with a
// one-line message naming the file and line.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

class Tokenizer;

struct HellaSwagItem {
    int ind = 0;
    std::string activity_label;
    std::string ctx;
    int label = 0;  // index of the correct ending, 0..3
    std::array<std::string, 4> endings;
};

// One JSON object per line with at least ind, activity_label, ctx, label (0..3) and endings (4 strings);
// other keys are skipped, so the original release's extra fields (ctx_a, split, ...) load too.
// `name` is used in error messages.
std::vector<HellaSwagItem> parse_hellaswag(const std::string& text, const std::string& name);
// Reads a plain or .xz file (see text_reader.h) and parses it.
std::vector<HellaSwagItem> load_hellaswag(const std::string& path);

struct HellaSwagScore {
    int items = 0;
    int correct_sum = 0;   // argmin of the summed ending loss is the label ("acc")
    int correct_mean = 0;  // argmin of the mean ending loss is the label ("acc_norm", llm.c's number)
};

class HellaSwagBatcher {
public:
    // Tokenizes every item. B must be a positive multiple of 4; throws std::invalid_argument otherwise,
    // and std::runtime_error for an item that cannot fit (an ending longer than T tokens, or an empty context).
    HellaSwagBatcher(const std::vector<HellaSwagItem>& items, const Tokenizer& tok, int B, int T);

    int num_items() const { return static_cast<int>(items_.size()); }
    int items_per_batch() const { return B_ / 4; }
    int num_batches() const { return (num_items() + items_per_batch() - 1) / items_per_batch(); }
    int truncated() const { return truncated_; }    // items whose context was cut to fit T
    int max_length() const { return max_length_; }  // longest candidate in tokens, before any cut

    // Fills batch `batch` (0 .. num_batches()-1; items batch*B/4 onwards) into arrays of B*T elements.
    // Returns the number of items in it.
    int fill(int batch, int32_t* inputs, int32_t* targets, uint8_t* mask) const;
    // Adds batch `batch`'s items to `score`, given the model's loss at every position of that batch (B*T;
    // positions outside the mask are not read, so they may hold anything).
    void score(int batch, const float* losses, HellaSwagScore& score) const;

private:
    struct Rendered {
        std::vector<int> ctx;  // already cut from the left where needed
        std::array<std::vector<int>, 4> endings;
        int label;
    };
    std::vector<Rendered> items_;
    int B_, T_;
    int eot_;
    int truncated_ = 0;
    int max_length_ = 0;
};
