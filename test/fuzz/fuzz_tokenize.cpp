// Fuzzes the tokenizer's encoding of arbitrary bytes (dataloader/tokenizer.cpp) with GPT-2's vocabulary: the input
// is the text. Encoding must be lossless (decode gives the bytes back, with or without the special token), give only
// ids of the vocabulary (the ordinary encoding never the eot id), and a cut that safe_parts calls safe must split
// the tokens too (prepare_shards encodes long documents in such parts).
#include "fuzz_util.h"
#include "fuzz_gpt2.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    gpt2_tokenizer();  // loaded once, before the first input
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const Tokenizer& tok = gpt2_tokenizer();
    const std::string text(reinterpret_cast<const char*>(data), size);
    const std::vector<int> ids = tok.encode(text);
    for (int id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size() && id != tok.eot(), "encode gives ordinary token ids");
    FUZZ_CHECK(tok.decode(ids) == text, "decode(encode(text)) is the text");
    FUZZ_CHECK(tok.decode(tok.encode_with_special(text)) == text, "decode(encode_with_special(text)) is the text");

    // safe_parts with one-byte chunks: a single part means a safe cut (8 bytes hold at least two characters, so
    // without one the fallback would cut at each of them)
    if (size < 12) return 0;
    const size_t limit = 8 + data[0] % (size - 11);
    std::vector<size_t> ends;
    tok.safe_parts(text, limit, 1, ends);
    FUZZ_CHECK(!ends.empty() && ends.back() <= limit, "safe_parts cuts within the limit");
    for (size_t i = 0; i < ends.size(); i++) FUZZ_CHECK(ends[i] > (i ? ends[i - 1] : 0), "safe_parts' cuts ascend");
    if (ends.size() == 1) {
        std::vector<int> parts = tok.encode(std::string_view(text).substr(0, ends[0]));
        tok.encode_append(std::string_view(text).substr(ends[0]), parts);
        FUZZ_CHECK(parts == ids, "the tokens of the parts of a safe cut are the whole's");
    }
    return 0;
}
