// Fuzzes tokenizer.json (dataloader/tokenizer.cpp: Tokenizer::load_tokenizer_json, and dataloader/json.h under it).
// The input is the file. A tokenizer that loads must give ids of its vocabulary, decode what it encodes to the text
// (ordinary and with added tokens matched; the sample is its own NFC), split it into pre-token pieces that
// concatenate to it, and cut it only where encoding the parts gives the whole's tokens.
#include "fuzz_util.h"
#include "dataloader/tokenizer.h"

namespace {

const char kSample[] =
    "Hello World, it's 2024: caf\xc3\xa9 I'M \xe6\x97\xa5\xe6\x9c\xac 12345 \xf0\x9f\x98\x80!\r\n\n  tabs\tand \xff bytes"
    "<|endoftext|><s>[INST]HelloWorld a/b//\n/ x\xcc\x81y 'S<tool_call>";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = scratch_dir() + "/tokenizer.json";
    write_file(path, data, size);
    Tokenizer tok;
    if (refused([&] { tok = Tokenizer::load_tokenizer_json(path); })) return 0;
    const std::string text(kSample, sizeof kSample - 1);
    const std::vector<int> ids = tok.encode(text), special = tok.encode_with_special(text);
    for (const std::vector<int>* v : {&ids, &special})
        for (int id : *v) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "encode gives ids of the vocabulary");
    FUZZ_CHECK(tok.decode(ids) == text, "decode(encode(text)) is the text");
    FUZZ_CHECK(tok.decode(special) == text, "decode(encode_with_special(text)) is the text");
    std::string joined;
    for (const std::string& piece : tok.pre_tokenize(text)) {
        FUZZ_CHECK(!piece.empty(), "pieces are not empty");
        joined += piece;
    }
    FUZZ_CHECK(joined == text, "the pieces concatenate to the text");
    for (size_t limit = 8; limit + 4 <= text.size(); limit += 7) {
        std::vector<size_t> ends;
        tok.safe_parts(text, limit, 1, ends);
        if (ends.size() != 1) continue;
        std::vector<int> parts = tok.encode(std::string_view(text).substr(0, ends[0]));
        tok.encode_append(std::string_view(text).substr(ends[0]), parts);
        FUZZ_CHECK(parts == ids, "a cut that safe_parts calls safe keeps the tokens");
    }
    FUZZ_CHECK(tok.eot() < tok.vocab_size() && tok.bos() < tok.vocab_size(), "bos and eot are tokens or -1");
    return 0;
}
