// Fuzzes HellaSwag's jsonl lines (dataloader/hellaswag.cpp: parse_hellaswag) and the batcher over the items that
// parse, with GPT-2's tokenizer: the input is the file's text; its first and last bytes pick B (4, 8 or 12 rows) and
// T (1..64). Every batch must mask exactly its items' ending tokens and score every item once.
#include "fuzz_util.h"
#include "dataloader/hellaswag.h"
#include "fuzz_gpt2.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    gpt2_tokenizer();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    std::vector<HellaSwagItem> items;
    if (refused([&] { items = parse_hellaswag(text, "fuzz.jsonl"); })) return 0;
    for (const HellaSwagItem& item : items) FUZZ_CHECK(item.label >= 0 && item.label <= 3, "labels are 0..3");
    if (size == 0) return 0;
    const int B = 4 * (1 + data[0] % 3), T = 1 + data[size - 1] % 64;
    refused([&] {
        const int vocab = gpt2_tokenizer().vocab_size();
        const HellaSwagBatcher batcher(items, gpt2_tokenizer(), B, T);
        std::vector<int32_t> inputs(B * T), targets(B * T);
        std::vector<uint8_t> mask(B * T);
        std::vector<float> losses(B * T);
        for (int k = 0; k < B * T; k++) losses[k] = (float)(k * 7919 % 13);
        HellaSwagScore score;
        for (int b = 0; b < batcher.num_batches(); b++) {
            const int count = batcher.fill(b, inputs.data(), targets.data(), mask.data());
            FUZZ_CHECK(count >= 1 && count <= B / 4, "a batch holds 1 to B/4 items");
            for (int k = 0; k < B * T; k++) {
                FUZZ_CHECK(inputs[k] >= 0 && inputs[k] < vocab && targets[k] >= 0 && targets[k] < vocab,
                           "batches hold token ids");
                FUZZ_CHECK(mask[k] <= 1 && (k < 4 * count * T || mask[k] == 0), "rows past the batch's items are masked out");
            }
            batcher.score(b, losses.data(), score);
        }
        FUZZ_CHECK(score.items == batcher.num_items() && score.correct_sum <= score.items && score.correct_mean <= score.items,
                   "every item is scored once");
    });
    return 0;
}
