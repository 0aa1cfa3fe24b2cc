// llm.c token shards (docs/formats.md): a 256 x int32 header ([0] magic, [1] version, [2] token count N) followed
// by N tokens, in one of llm.c's two formats: magic 20240520 version 1 with uint16 tokens (its GPT-2 shards) or
// magic 20240801 version 7 with uint32 tokens (its Llama 3 shards, for vocabularies beyond uint16). The file is
// exactly 1024 + 2N or 1024 + 4N bytes. Readers take either; a shard's format follows from its vocabulary.
//
// Every error throws std::runtime_error whose message is one line starting with the file's path, so tests
// can check it in-process and binaries can print it and exit 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

constexpr int32_t kShard16Magic = 20240520;
constexpr int32_t kShard16Version = 1;
constexpr int32_t kShard32Magic = 20240801;
constexpr int32_t kShard32Version = 7;
constexpr size_t kShardHeaderBytes = 256 * sizeof(int32_t);

// Bytes per token of the shards of a vocabulary: 2 while every id fits in uint16 (vocab_size <= 65536), else 4.
// The vocabulary decides, not the tokens a shard happens to hold, so all shards of a corpus share one format:
// the one llm.c's trainer for that vocabulary reads (train_gpt2 only the uint16 one).
int shard_token_bytes(int vocab_size);

// Writes a shard in the format of vocab_size (shard_token_bytes) atomically: to a temporary file in the same
// directory, then renamed over `path`, so a reader never sees a partial shard. Throws if a token is >= vocab_size,
// so no id is ever cut to 16 bits. The token type is the caller's storage, not the format.
void write_shard(const std::string& path, const uint16_t* tokens, size_t count, int vocab_size);
void write_shard(const std::string& path, const uint32_t* tokens, size_t count, int vocab_size);
template <typename Token>
void write_shard(const std::string& path, const std::vector<Token>& tokens, int vocab_size) {
    write_shard(path, tokens.data(), tokens.size(), vocab_size);
}

// Throws if any of tokens[0..count) is >= vocab_size; `first_index` is tokens[0]'s index in the shard
// (for the message).
void check_token_ids(const std::string& path, const uint32_t* tokens, size_t count, uint64_t first_index,
                     int vocab_size);

// An open shard with a validated header (magic, version, file size); tokens are read on demand, as uint32 from
// either format.
class ShardReader {
public:
    explicit ShardReader(const std::string& path);
    ~ShardReader();
    ShardReader(const ShardReader&) = delete;
    ShardReader& operator=(const ShardReader&) = delete;

    uint64_t num_tokens() const { return num_tokens_; }
    int token_bytes() const { return token_bytes_; }  // 2 or 4: the file's format
    const std::string& path() const { return path_; }
    // Reads tokens [first, first + count); throws if that passes the end or the read fails.
    void read(uint64_t first, size_t count, uint32_t* out) const;

private:
    std::string path_;
    int fd_ = -1;
    uint64_t num_tokens_ = 0;
    int token_bytes_ = 2;
};

// Reads a whole shard and checks every token id against vocab_size.
std::vector<uint32_t> read_shard(const std::string& path, int vocab_size);

// ---- mask shards (docs/formats.md): which targets of a token shard count in the loss (chat fine-tuning) ----------
// A 256 x int32 header ([0] magic, [1] version, [2] token count N, [3] the window T the shard's conversations are laid
// out for, [4] the number of counted tokens) followed by N bytes, byte i = 1 when token i counts as a target (is
// predicted in the loss), 0 when it does not. The file is exactly 1024 + N bytes and sits beside its token shard,
// named mask_shard_path(shard): "X_train_000000.bin.mask", which no "*.bin" glob of token shards matches.
constexpr int32_t kMaskShardMagic = 20261215;
constexpr int32_t kMaskShardVersion = 1;

std::string mask_shard_path(const std::string& shard_path);
bool is_mask_shard_path(const std::string& path);

// Writes a mask shard atomically (write_shard's temporary name, fsync and rename). Throws if a byte is not 0 or 1 or
// the window is not positive.
void write_mask_shard(const std::string& path, const uint8_t* mask, size_t count, int window);
inline void write_mask_shard(const std::string& path, const std::vector<uint8_t>& mask, int window) {
    write_mask_shard(path, mask.data(), mask.size(), window);
}

// An open mask shard with a validated header (magic, version, window, counted tokens <= N, file size); bytes are
// read on demand and each is checked to be 0 or 1.
class MaskReader {
public:
    explicit MaskReader(const std::string& path);
    ~MaskReader();
    MaskReader(const MaskReader&) = delete;
    MaskReader& operator=(const MaskReader&) = delete;

    uint64_t num_tokens() const { return num_tokens_; }
    int window() const { return window_; }
    uint64_t counted_tokens() const { return counted_tokens_; }  // the header's count
    const std::string& path() const { return path_; }
    // Reads bytes [first, first + count); throws if that passes the end, the read fails or a byte is not 0 or 1.
    void read(uint64_t first, size_t count, uint8_t* out) const;

private:
    std::string path_;
    int fd_ = -1;
    uint64_t num_tokens_ = 0;
    int window_ = 0;
    uint64_t counted_tokens_ = 0;
};

// Reads a whole mask shard; throws if its ones do not add up to the header's counted tokens.
std::vector<uint8_t> read_mask_shard(const std::string& path);
