// Fuzzes the tokenizer's files (dataloader/tokenizer.cpp) but vocab.bpe (fuzz_vocab_bpe.cpp, whose runs load all of
// GPT-2's encoder.json). The input's first byte picks the file, the rest is its content: 0 encoder.json (with GPT-2's
// vocab.bpe, data/gpt2's), 1 an llm.c tokenizer file (TokenDecoder::load_llmc). A vocabulary that loads must encode
// losslessly, and an llm.c file that loads must decode every id and be written again the same.
#include "fuzz_util.h"
#include "dataloader/tokenizer.h"

namespace {

const char kSample[] = "Hello world, it's 2024: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80!\n\n  tabs\tand \xff bytes<|endoftext|>";

void check_round_trip(const Tokenizer& tok) {
    const std::string text(kSample, sizeof kSample - 1);
    FUZZ_CHECK(tok.decode(tok.encode(text)) == text, "a loaded vocabulary encodes losslessly");
    FUZZ_CHECK(tok.decode(tok.encode_with_special(text)) == text, "and with the special token");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string content(reinterpret_cast<const char*>(data) + 1, size - 1);
    const std::string path = scratch_dir() + "/file";
    write_file(path, content);
    switch (data[0] % 2) {
        case 0:
            refused([&] { check_round_trip(Tokenizer::load_gpt2_files(path, repository_path("data/gpt2/vocab.bpe"))); });
            break;
        case 1: {
            TokenDecoder decoder;
            if (refused([&] { decoder = TokenDecoder::load_llmc(path); })) break;
            FUZZ_CHECK(decoder.eot() >= 0 && decoder.eot() < decoder.vocab_size(), "the eot id is a token");
            std::vector<int> ids;
            std::string expected;
            for (int id = 0; id < decoder.vocab_size(); id++) {
                ids.push_back(id);
                expected += decoder.decode_token(id);
            }
            FUZZ_CHECK(decoder.decode(ids) == expected, "decode is the tokens' bytes in order");
            FUZZ_CHECK(refused([&] { decoder.decode({decoder.vocab_size()}); }), "an id past the vocabulary is refused");
            const std::string copy = scratch_dir() + "/copy.bin";
            decoder.save_llmc(copy);
            const std::string written = read_file(copy);
            uint32_t version;
            memcpy(&version, content.data() + 4, 4);
            // version 1 files get version 2's eot word; the rest of the header is written as zeros
            FUZZ_CHECK(written.size() == content.size() && memcmp(written.data(), content.data(), 4) == 0 &&
                           memcmp(written.data() + 8, content.data() + 8, 4) == 0 &&
                           (version != 2 || memcmp(written.data() + 12, content.data() + 12, 4) == 0) &&
                           memcmp(written.data() + 1024, content.data() + 1024, content.size() - 1024) == 0,
                       "save_llmc writes the tokens loaded");
            break;
        }
    }
    return 0;
}
