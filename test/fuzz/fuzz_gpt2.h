// GPT-2's tokenizer (data/gpt2) for the harnesses that encode with it, loaded once. Included after fuzz_util.h, as
// every parser's header is.
// defines: gpt2_tokenizer
#pragma once
#include "fuzz_util.h"
#include "dataloader/tokenizer.h"

inline const Tokenizer& gpt2_tokenizer() {
    static const Tokenizer tok = Tokenizer::load(repository_path("data/gpt2"));
    return tok;
}
