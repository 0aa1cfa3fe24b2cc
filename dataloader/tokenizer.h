// GPT-2 byte-level BPE tokenizer (encode + decode), and the decode-only token table that llm.c's tokenizer
// file (gpt2_tokenizer.bin) holds.
//
// Encoding matches OpenAI's GPT-2 / tiktoken "gpt2": text is split by GPT-2's pre-tokenizer regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (implemented as a hand-written scanner with the Unicode tables in unicode_tables.h), then each piece is
// merged by BPE rank. Bytes that are not valid UTF-8 each count as one character that is neither letter,
// number nor space (tiktoken only accepts valid text; this is our rule for raw bytes, see
// test/tools/make_tokenizer_fixtures.py).
//
// Unicode version: unicode_tables.h is generated from Unicode 15.1; tiktoken 0.14's regex engine uses
// Unicode 16.0. The two split text differently only around characters first assigned in Unicode 16.0
// (rare scripts such as Garay or Egyptian Hieroglyphs Extended-A), which are "other" here. Regenerating
// the tables from the UCD 16.0 files (scripts/data/gen_unicode_tables.py --ucd) closes that gap.
//
// Errors (missing or malformed files, bad token ids) are thrown as std::runtime_error / std::out_of_range
// with a one-line message naming the file.
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
    int eot() const { return eot_; }

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

class GPT2Tokenizer {
public:
    // Reads DIR/encoder.json and DIR/vocab.bpe.
    static GPT2Tokenizer load(const std::string& dir);
    static GPT2Tokenizer load_files(const std::string& encoder_json, const std::string& vocab_bpe);

    // Like tiktoken's encode_ordinary: the text "<|endoftext|>" is encoded as ordinary text.
    std::vector<int> encode(std::string_view text) const;
    void encode_append(std::string_view text, std::vector<int>& out) const;
    // Like tiktoken's encode(allowed_special={"<|endoftext|>"}): each literal "<|endoftext|>" is token eot().
    std::vector<int> encode_with_special(std::string_view text) const;

    std::string decode(const std::vector<int>& ids) const { return decoder_.decode(ids); }
    std::string decode_token(int id) const { return decoder_.decode_token(id); }
    int eot() const { return 50256; }
    int vocab_size() const { return decoder_.vocab_size(); }
    const TokenDecoder& decoder() const { return decoder_; }

private:
    void encode_piece(std::string_view piece, std::vector<int>& out) const;
    void byte_pair_merge(std::string_view piece, std::vector<int>& out) const;

    TokenDecoder decoder_;
    ByteStringTable vocab_;     // token bytes -> id (the special token excluded)
    int byte_token_[256] = {};  // single byte -> token id
    MergeTable merges_;         // from vocab.bpe
    uint64_t instance_id_ = 0;  // identifies this vocabulary to the per-thread cache
};

// Where `text` (starting at a character boundary, at least `limit` + 4 bytes long) can be cut so that encoding
// the parts gives the tokens of the whole: `ends` gets one part, up to the last safe cut at or before `limit`
// (no pre-token piece spans it); or, when there is none (a pathological piece of one class), parts of about
// `chunk` bytes up to the last character boundary there, which changes that piece's tokens only.
void safe_parts(std::string_view text, size_t limit, size_t chunk, std::vector<size_t>& ends);
