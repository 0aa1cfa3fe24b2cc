// Fuzzes mask shards (dataloader/shards.cpp) and the DataLoader over a token shard with one (dataloader/dataloader.cpp):
// the input is the mask file. The token shard beside it is written here with as many tokens as the mask's header
// says (header word [5] & 1 makes it one longer: a mask of another length than its shard). Header words the format
// leaves unused choose the rest: [6] B, [7] shuffling and its seed, [8]-[9] a byte range to read. What a refused mask
// must do is throw; an accepted one must serve -1 exactly where its bytes are 0 and count the targets it serves.
#include "fuzz_util.h"
#include "dataloader/dataloader.h"
#include "dataloader/shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string shard = scratch_dir() + "/chat_000000.bin", mask_path = mask_shard_path(shard);
    write_file(mask_path, data, size);
    const uint32_t count = std::min<uint32_t>((uint32_t)std::max(header_word(data, size, 2), 0), 1 << 16) + (header_word(data, size, 5) & 1);
    std::vector<uint32_t> tokens(count);
    for (uint32_t i = 0; i < count; i++) tokens[i] = i % 50257;
    write_shard(shard, tokens, 50257);
    std::vector<uint8_t> mask;
    const bool whole_refused = refused([&] { mask = read_mask_shard(mask_path); });
    refused([&] {
        MaskReader reader(mask_path);
        FUZZ_CHECK(whole_refused || reader.num_tokens() == mask.size(), "the reader's count is read_mask_shard's");
        const uint64_t first = (uint32_t)header_word(data, size, 8) % (reader.num_tokens() + 2);
        const size_t n = (uint32_t)header_word(data, size, 9) % (reader.num_tokens() + 2);
        std::vector<uint8_t> part(n);
        reader.read(first, n, part.data());  // throws past the end or on a byte that is not 0 or 1
        FUZZ_CHECK(first + n <= reader.num_tokens(), "a read past the end was served");
    });
    if (whole_refused) return 0;
    DataLoaderConfig config;
    config.pattern = shard;
    config.B = 1 + (uint32_t)header_word(data, size, 6) % 4;
    config.T = header_word(data, size, 3);  // the mask's window: any other T is refused
    config.shuffle = header_word(data, size, 7) & 1;
    config.seed = (uint32_t)header_word(data, size, 7);
    config.prefetch_depth = 0;
    refused([&] {
        DataLoader loader(config);
        FUZZ_CHECK(mask.size() == tokens.size(), "a mask of another length than its shard was accepted");
        for (int i = 0; i < 3; i++) {
            const uint64_t counted = loader.counted_targets_ahead(1);
            const Batch batch = loader.next();
            uint64_t served = 0;
            const size_t first = (size_t)batch.inputs[0];  // token i is i here (count < 50257 ... or wrapped)
            for (int k = 0; k < config.B * config.T; k++) {
                FUZZ_CHECK(batch.targets[k] == -1 || batch.targets[k] == batch.inputs[k] + 1 || batch.targets[k] == 0,
                           "a served target is the next token or -1");
                if (first + k + 1 < mask.size() && count < 50257)
                    FUZZ_CHECK((batch.targets[k] == -1) == (mask[first + k + 1] == 0), "-1 exactly where the mask is 0");
                served += batch.targets[k] != -1;
            }
            FUZZ_CHECK(served == counted, "counted_targets_ahead counts the served targets");
        }
    });
    return 0;
}
