// Fuzzes llm.c token shards of both widths (dataloader/shards.cpp) and the DataLoader over one
// (dataloader/dataloader.cpp): the input is the shard file. Header words the format leaves unused choose the rest:
// [3] the vocabulary size, [4] B, [5] T, [6]-[7] a token range to read, [8]-[23] a DataLoaderState to restore, [24]
// shuffling and its seed (a valid shard stays valid whatever they hold). What a refused shard must do is throw; an
// accepted one must serve batches whose tokens are its own.
#include "fuzz_util.h"
#include "dataloader/dataloader.h"
#include "dataloader/shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = scratch_dir() + "/shard_000000.bin";
    write_file(path, data, size);
    const int32_t vocab_word = header_word(data, size, 3);
    const int vocab = vocab_word >= 1 ? vocab_word : 50257;
    std::vector<uint32_t> tokens;
    const bool whole_refused = refused([&] { tokens = read_shard(path, vocab); });

    refused([&] {
        ShardReader reader(path);
        FUZZ_CHECK(whole_refused || reader.num_tokens() == tokens.size(), "the reader's token count is read_shard's");
        const uint64_t first = (uint32_t)header_word(data, size, 6) % (reader.num_tokens() + 2);
        const size_t count = (uint32_t)header_word(data, size, 7) % (reader.num_tokens() + 2);
        std::vector<uint32_t> part(count);
        reader.read(first, count, part.data());  // throws past the end
        FUZZ_CHECK(first + count <= reader.num_tokens(), "a read past the end was served");
    });

    if (whole_refused) return 0;
    DataLoaderConfig config;
    config.pattern = path;
    config.B = 1 + (uint32_t)header_word(data, size, 4) % 4;
    config.T = 1 + (uint32_t)header_word(data, size, 5) % 64;
    config.shuffle = header_word(data, size, 24) & 1;
    config.seed = (uint32_t)header_word(data, size, 24);
    config.prefetch_depth = 0;
    config.vocab_size = vocab;
    refused([&] {
        DataLoader loader(config);
        for (int i = 0; i < 3; i++) {
            const Batch batch = loader.next();
            for (int k = 0; k < config.B * config.T; k++)
                FUZZ_CHECK(batch.inputs[k] >= 0 && batch.inputs[k] < vocab && batch.targets[k] >= 0 && batch.targets[k] < vocab,
                           "a served token is a valid id");
        }
        loader.restore(loader.state());
        DataLoaderState state;
        memset(&state, 0, sizeof state);
        if (size >= 4 * 8 + sizeof state) memcpy(&state, data + 4 * 8, sizeof state);
        loader.restore(state);  // throws unless it is a position of this loader
        loader.next();
    });
    return 0;
}
