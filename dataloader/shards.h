// llm.c token shards (docs/formats.md): a 256 x int32 header ([0] magic 20240520, [1] version 1, [2] token
// count N) followed by N uint16 tokens; the file is exactly 1024 + 2N bytes.
//
// Every error throws std::runtime_error whose message is one line starting with the file's path, so tests
// can check it in-process and binaries can print it and exit 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 256 * sizeof(int32_t);

// Writes a shard atomically: to a temporary file in the same directory, then renamed over `path`, so a
// reader never sees a partial shard.
void write_shard(const std::string& path, const uint16_t* tokens, size_t count);
inline void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
    write_shard(path, tokens.data(), tokens.size());
}

// Throws if any of tokens[0..count) is >= vocab_size; `first_index` is tokens[0]'s index in the shard
// (for the message).
void check_token_ids(const std::string& path, const uint16_t* tokens, size_t count, uint64_t first_index,
                     int vocab_size);

// An open shard with a validated header (magic, version, file size); tokens are read on demand.
class ShardReader {
public:
    explicit ShardReader(const std::string& path);
    ~ShardReader();
    ShardReader(const ShardReader&) = delete;
    ShardReader& operator=(const ShardReader&) = delete;

    uint64_t num_tokens() const { return num_tokens_; }
    const std::string& path() const { return path_; }
    // Reads tokens [first, first + count); throws if that passes the end or the read fails.
    void read(uint64_t first, size_t count, uint16_t* out) const;

private:
    std::string path_;
    int fd_ = -1;
    uint64_t num_tokens_ = 0;
};

// Reads a whole shard and checks every token id against vocab_size.
std::vector<uint16_t> read_shard(const std::string& path, int vocab_size);
