// Fuzzes the tokenizer's merges file, vocab.bpe (dataloader/tokenizer.cpp: Tokenizer::load_gpt2_files), with GPT-2's
// encoder.json (data/gpt2's): the input is the file. Every run loads the whole vocabulary (50257 tokens), so this
// harness runs far fewer inputs a second than the others. A vocabulary that loads must encode losslessly, whatever
// its merges.
#include "fuzz_util.h"
#include "dataloader/tokenizer.h"

namespace {

const char kSample[] = "Hello world, it's 2024: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80!\n\n  tabs\tand \xff bytes<|endoftext|>";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = scratch_dir() + "/vocab.bpe";
    write_file(path, data, size);
    refused([&] {
        const Tokenizer tok = Tokenizer::load_gpt2_files(repository_path("data/gpt2/encoder.json"), path);
        const std::string text(kSample, sizeof kSample - 1);
        FUZZ_CHECK(tok.decode(tok.encode(text)) == text, "a loaded vocabulary encodes losslessly");
        FUZZ_CHECK(tok.decode(tok.encode_with_special(text)) == text, "and with the special token");
    });
    return 0;
}
