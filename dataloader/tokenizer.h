// Byte-level BPE tokenizers (encode + decode), loaded from GPT-2's encoder.json + vocab.bpe or from a Hugging Face
// tokenizer.json of the byte-level BPE families (GPT-2, Llama 3, Qwen 2.5, SmolLM2, Mistral's Tekken; the files we
// read and refuse are in docs/formats.md), and the decode-only token table of llm.c's tokenizer file.
//
// Encoding follows the `tokenizers` library (which agrees with tiktoken on GPT-2's files): the added tokens
// (<|endoftext|>, <|im_start|>, ...) are found in the text first, leftmost and longest; the text between them is
// normalized (NFC, where the file asks), split into pre-token pieces by the file's pattern, and each piece is merged
// by BPE rank. Each pattern we know is a hand-written scanner over the Unicode classes of unicode_tables.h (no regex
// engine: std::regex has no \p{L}); an unknown pattern is refused. Bytes that are not valid UTF-8 each count as
// one character that is neither letter, mark, number nor space (the reference libraries take only valid text;
// this is our rule for raw bytes, see test/tools/make_tokenizer_fixtures.py).
//
// Unicode version: unicode_tables.h is generated from Unicode 15.1; tiktoken 0.14's regex engine uses
// Unicode 16.0. The two split text differently only around characters first assigned in Unicode 16.0
// (rare scripts such as Garay or Egyptian Hieroglyphs Extended-A), which are "other" here. Regenerating
// the tables from the UCD 16.0 files (scripts/data/gen_unicode_tables.py --ucd) closes that gap.
//
// Errors (missing, malformed or unsupported files, bad token ids) are thrown as std::runtime_error /
// std::out_of_range with a one-line message naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// Token id -> bytes table: everything decoding needs. Loadable from llm.c's tokenizer file, so a program
// can decode without encoder.json / vocab.bpe.
class TokenDecoder {
public:
    TokenDecoder() = default;
    TokenDecoder(std::vector<std::string> token_bytes, int eot);

    // llm.c tokenizer file: 256 uint32 header ([0] magic 20240328, [1] version 1 or 2, [2] vocab size,
    // [3] eot id in version 2; version 1 implies 50256), then per token a uint8 length and the bytes.
    static TokenDecoder load_llmc(const std::string& path);
    void save_llmc(const std::string& path) const;  // writes version 2

    std::string decode(const std::vector<int>& ids) const;
    std::string decode_token(int id) const;
    int vocab_size() const { return static_cast<int>(offsets_.size()) - 1; }
    int eot() const { return eot_; }  // -1: none
    void set_eot(int id);

private:
    std::string bytes_;              // all tokens' bytes, concatenated
    std::vector<uint32_t> offsets_;  // token i is bytes_[offsets_[i], offsets_[i+1])
    int eot_ = -1;
};

// Open-addressing hash table from byte strings (copied into its own arena) to uint32 values.
// The tokenizer's hot path is one lookup per pre-token piece, so this avoids std::string keys.
class ByteStringTable {
public:
    const uint32_t* find(std::string_view key) const;
    void insert(std::string_view key, uint32_t value);  // key must not be present
    size_t size() const { return count_; }
    void clear();

private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t key_offset = 0;
        uint32_t key_length = kEmpty;
        uint32_t value = 0;
    };
    static constexpr uint32_t kEmpty = UINT32_MAX;
    void grow();

    std::vector<Slot> slots_;
    std::string arena_;
    size_t count_ = 0;
};

// Open-addressing hash table from a pair of token ids to the merge that joins them (BPE's inner loop).
class MergeTable {
public:
    struct Merge {
        int rank;    // position in vocab.bpe: lower merges first
        int result;  // token id of the merged pair
    };
    const Merge* find(int left, int right) const;
    bool insert(int left, int right, Merge merge);  // false if the pair is already present

private:
    struct Slot {
        uint64_t key = kEmpty;
        Merge merge{};
    };
    static constexpr uint64_t kEmpty = UINT64_MAX;
    static uint64_t key_of(int left, int right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }
    size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
    void grow();

    std::vector<Slot> slots_;
    int shift_ = 64;
    size_t count_ = 0;
};

// Finds added tokens in a text: leftmost first, and of those starting there the longest (the `tokenizers`
// library's Aho-Corasick LeftmostLongest).
class AddedTokenMatcher {
public:
    void add(std::string_view text, int token);
    bool empty() const { return nodes_.size() <= 1; }
    // The first match at or after `from`: its position (npos if none), length and token.
    size_t find(std::string_view text, size_t from, size_t& length, int& token) const;

private:
    struct Node {
        std::vector<std::pair<unsigned char, int>> children;  // byte -> node
        int token = -1;                                        // a token ends here
    };
    std::vector<Node> nodes_{1};  // nodes_[0] is the root
    bool starts_token_[256] = {};
};

// The pre-tokenizer patterns we implement, each as a scanner (tokenizer.cpp: gpt2_piece_end, ...).
enum class SplitPattern {
    kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    kLlama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    kQwen2,   // Llama 3's with \p{N} (single digits) for \p{N}{1,3}
    kTekken,  // Mistral's: words split at case changes (\p{Lu}.. \p{Ll}.. with \p{M}), single digits, [\r\n/]* after punctuation
};
// A Digits pre-tokenizer before the pattern: each number character alone (SmolLM2), or each run of them.
enum class DigitSplit { kNone, kIndividual, kRuns };

class Tokenizer {
public:
    struct AddedToken {
        std::string text;  // matched literally in the text, decoded as itself
        int id;
        bool special;     // matched only by encode_with_special (the others are always matched)
        bool normalized;  // matched in the normalized text rather than the raw text
    };

    // PATH: a tokenizer.json file, or a folder holding tokenizer.json, or else encoder.json and vocab.bpe.
    static Tokenizer load(const std::string& path);
    static Tokenizer load_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe);
    static Tokenizer load_tokenizer_json(const std::string& path);

    // The special tokens' text is encoded as ordinary text (tiktoken's encode_ordinary, the `tokenizers` library's
    // split_special_tokens); added tokens that are not special are still matched.
    std::vector<int> encode(std::string_view text) const;
    void encode_append(std::string_view text, std::vector<int>& out) const;
    // Every added token is matched: each literal "<|endoftext|>" is that token (the `tokenizers` library's encode
    // with add_special_tokens=False).
    std::vector<int> encode_with_special(std::string_view text) const;

    std::string decode(const std::vector<int>& ids) const { return decoder_.decode(ids); }
    std::string decode_token(int id) const { return decoder_.decode_token(id); }
    int vocab_size() const { return decoder_.vocab_size(); }
    const TokenDecoder& decoder() const { return decoder_; }

    // The token that ends a document (GPT-2: 50256), and the one that starts it; -1 where the file names none.
    // tokenizer.json: its post_processor template's tokens after and before the text, else (end) the added token
    // <|endoftext|>, <|end_of_text|> or </s>.
    int eot() const { return eot_; }
    int bos() const { return bos_; }
    void set_eot(const std::string& added_token_text);  // the caller's choice; throws if no such added token
    // The tokens that end a generated text, as transformers' generate reads them: generation_config.json's
    // eos_token_id (an id or a list) where `folder` holds one; else eot() and the chat models' end-of-turn tokens the
    // vocabulary has (<|eot_id|>, <|im_end|>). Throws, naming the file, on a generation config it cannot read.
    std::vector<int> end_tokens(const std::string& folder) const;
    const std::vector<AddedToken>& added_tokens() const { return added_; }
    int added_token_id(std::string_view text) const;  // -1 if none
    // The pre-token pieces of a text without added tokens, after normalization (what BPE merges one by one).
    std::vector<std::string> pre_tokenize(std::string_view text) const;
    SplitPattern pattern() const { return pattern_; }
    DigitSplit digit_split() const { return digits_; }
    bool normalizes_nfc() const { return nfc_; }

    // Where `text` (starting at a character boundary, at least `limit` + 4 bytes long) can be cut so that encoding
    // the parts gives the tokens of the whole: `ends` gets one part, up to the last safe cut at or before `limit`
    // (no pre-token piece, added token or NFC composition spans it, whatever the pattern); or, when there is none
    // (a pathological piece of one class), parts of about `chunk` bytes up to the last character boundary there,
    // which changes that piece's tokens only.
    void safe_parts(std::string_view text, size_t limit, size_t chunk, std::vector<size_t>& ends) const;

private:
    void encode_added(std::string_view text, bool match_special, std::vector<int>& out) const;
    void encode_normalized(std::string_view text, bool match_special, std::vector<int>& out) const;
    void encode_pieces(std::string_view text, std::vector<int>& out) const;
    template <typename Piece>
    void for_each_piece(std::string_view text, const Piece& piece) const;
    void encode_piece(std::string_view piece, std::vector<int>& out) const;
    void byte_pair_merge(std::string_view piece, std::vector<int>& out) const;
    void finish_loading(std::vector<std::string> token_bytes, const ByteStringTable& model_vocab, bool ignore_merges,
                        const std::string& path);
    static constexpr size_t kMaxAddedTokenBytes = 4096;

    TokenDecoder decoder_;
    ByteStringTable whole_pieces_;  // token bytes -> id, for the pieces that are one token as a whole
    int byte_token_[256] = {};      // single byte -> token id
    MergeTable merges_;
    SplitPattern pattern_ = SplitPattern::kGpt2;
    DigitSplit digits_ = DigitSplit::kNone;
    bool nfc_ = false;
    std::vector<AddedToken> added_;
    AddedTokenMatcher raw_matcher_, normalized_matcher_;  // indices into added_
    bool ordinary_added_ = false;                         // an added token that is not special
    int eot_ = -1, bos_ = -1;
    uint64_t instance_id_ = 0;  // identifies this vocabulary to the per-thread cache
};
