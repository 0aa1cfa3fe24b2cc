// Writing and validated reading of llm.c token shards of both widths (the formats: shards.h, docs/formats.md).
// Which windows of a shard make a batch is the DataLoader's; tokenizing text into shards is prepare_shards'.
#include "shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw std::runtime_error(path + ": " + what);
}

// pread/write loops: both may transfer less than asked.
void read_exact(int fd, void* buf, size_t n, uint64_t offset, const std::string& path) {
    char* p = static_cast<char*>(buf);
    while (n > 0) {
        ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail(path, std::string("read error: ") + std::strerror(errno));
        if (got == 0) fail(path, "unexpected end of file (file changed while reading?)");
        p += got, n -= static_cast<size_t>(got), offset += static_cast<uint64_t>(got);
    }
}

void write_all(int fd, const void* buf, size_t n, const std::string& path) {
    const char* p = static_cast<const char*>(buf);
    while (n > 0) {
        ssize_t put = ::write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) fail(path, std::string("write error: ") + std::strerror(errno));
        p += put, n -= static_cast<size_t>(put);
    }
}

[[noreturn]] void fail_token(const std::string& path, uint32_t id, uint64_t index, int vocab_size) {
    fail(path, "token id " + std::to_string(id) + " at index " + std::to_string(index) + " is >= vocab size " +
                   std::to_string(vocab_size));
}

// The tokens go out in chunks, each checked against the vocabulary and converted to the file's width on the way.
template <typename FileToken, typename Token>
void write_tokens(int fd, const Token* tokens, size_t count, int vocab_size, const std::string& path,
                  const std::string& tmp) {
    std::vector<FileToken> chunk(std::min<size_t>(count, size_t(1) << 16));
    for (size_t done = 0; done < count;) {
        const size_t n = std::min(count - done, chunk.size());
        for (size_t i = 0; i < n; ++i) {
            const uint32_t id = tokens[done + i];
            if (id >= static_cast<uint32_t>(vocab_size)) fail_token(path, id, done + i, vocab_size);
            chunk[i] = static_cast<FileToken>(id);
        }
        write_all(fd, chunk.data(), n * sizeof(FileToken), tmp);
        done += n;
    }
}

// Writes the 256-int header, then body(fd, tmp), under a temporary name in the same directory, synced, then renamed
// over `path`: a reader (or a crash) never sees half a file, and two writers of the same path cannot interleave (the
// pid keeps their temporary files apart). Token and mask shards both go through here.
template <typename WriteBody>
void write_atomically(const std::string& path, const int32_t (&header)[256], WriteBody&& body) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(path, "cannot create the temporary file " + tmp + ": " + std::strerror(errno));
    try {
        write_all(fd, header, sizeof header, tmp);
        body(fd, tmp);
        if (::fsync(fd) != 0) fail(tmp, std::string("fsync: ") + std::strerror(errno));
    } catch (...) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw;
    }
    if (::close(fd) != 0) {
        ::unlink(tmp.c_str());
        fail(tmp, std::string("close: ") + std::strerror(errno));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        fail(path, std::string("cannot rename the temporary file into place: ") + std::strerror(err));
    }
}

template <typename Token>
void write_shard_of(const std::string& path, const Token* tokens, size_t count, int vocab_size) {
    if (vocab_size <= 0) fail(path, "vocab size " + std::to_string(vocab_size) + " is not positive");
    if (count > static_cast<size_t>(INT32_MAX)) fail(path, "too many tokens for one shard (header count is int32)");
    const bool wide = shard_token_bytes(vocab_size) == 4;
    int32_t header[256] = {};
    header[0] = wide ? kShard32Magic : kShard16Magic;
    header[1] = wide ? kShard32Version : kShard16Version;
    header[2] = static_cast<int32_t>(count);
    write_atomically(path, header, [&](int fd, const std::string& tmp) {
        if (wide) write_tokens<uint32_t>(fd, tokens, count, vocab_size, path, tmp);
        else write_tokens<uint16_t>(fd, tokens, count, vocab_size, path, tmp);
    });
}

// Mask bytes must be 0 or 1; `first_index` is mask[0]'s index in the file (for the message). Returns the ones.
uint64_t count_mask_ones(const std::string& path, const uint8_t* mask, size_t count, uint64_t first_index) {
    uint64_t ones = 0;
    for (size_t i = 0; i < count; ++i) {
        if (mask[i] > 1)
            fail(path, "mask byte " + std::to_string(mask[i]) + " at token " + std::to_string(first_index + i) +
                           " is neither 0 (not counted) nor 1 (counted)");
        ones += mask[i];
    }
    return ones;
}

}  // namespace

int shard_token_bytes(int vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

void write_shard(const std::string& path, const uint16_t* tokens, size_t count, int vocab_size) {
    write_shard_of(path, tokens, count, vocab_size);
}

void write_shard(const std::string& path, const uint32_t* tokens, size_t count, int vocab_size) {
    write_shard_of(path, tokens, count, vocab_size);
}

void check_token_ids(const std::string& path, const uint32_t* tokens, size_t count, uint64_t first_index,
                     int vocab_size) {
    for (size_t i = 0; i < count; ++i)
        if (tokens[i] >= static_cast<uint32_t>(vocab_size)) fail_token(path, tokens[i], first_index + i, vocab_size);
}

// Everything a later read relies on is checked here, once: the magic and the version, which give the token width,
// and a file size that agrees with the header's count (a truncated or still-growing shard is refused by name
// instead of read short).
ShardReader::ShardReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, std::string("cannot open shard: ") + std::strerror(errno));
    try {
        struct stat st;
        if (::fstat(fd_, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
        const uint64_t size = static_cast<uint64_t>(st.st_size);
        if (size < kShardHeaderBytes)
            fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 1024-byte shard header");
        int32_t header[256];
        read_exact(fd_, header, sizeof header, 0, path);
        if (header[0] != kShard16Magic && header[0] != kShard32Magic)
            fail(path, "bad magic " + std::to_string(header[0]) +
                           " (expected 20240520, uint16 tokens, or 20240801, uint32 tokens: not a token shard)");
        token_bytes_ = header[0] == kShard32Magic ? 4 : 2;
        if (header[1] != (token_bytes_ == 4 ? kShard32Version : kShard16Version))
            fail(path, "unsupported shard version " + std::to_string(header[1]) + " with magic " +
                           std::to_string(header[0]) +
                           (token_bytes_ == 4 ? " (expected 7, uint32 tokens; magic 20240520 takes version 1, uint16 tokens)"
                                              : " (expected 1, uint16 tokens; magic 20240801 takes version 7, uint32 tokens)"));
        if (header[2] < 0) fail(path, "negative token count " + std::to_string(header[2]) + " in the header");
        num_tokens_ = static_cast<uint64_t>(header[2]);
        const uint64_t expected = kShardHeaderBytes + token_bytes_ * num_tokens_;
        if (size != expected) {
            const char* width = token_bytes_ == 4 ? "uint32" : "uint16";
            const char* other_width = token_bytes_ == 4 ? "uint16" : "uint32";
            // tokens of one width under the other format's header: a writer that took the wrong dtype
            const uint64_t other_size = kShardHeaderBytes + (token_bytes_ == 4 ? 2 : 4) * num_tokens_;
            fail(path, "size mismatch: header says " + std::to_string(num_tokens_) + " " + width + " tokens (" +
                           std::to_string(expected) + " bytes) but the file is " + std::to_string(size) + " bytes" +
                           (size == other_size ? std::string(", the size of ") + other_width + " tokens under magic " +
                                                     std::to_string(header[0]) + ", the " + width + " format's"
                                               : ""));
        }
    } catch (...) {
        ::close(fd_);
        throw;
    }
}

ShardReader::~ShardReader() { ::close(fd_); }

// pread: reads at an absolute offset, with no file position to keep in step between reads or threads.
void ShardReader::read(uint64_t first, size_t count, uint32_t* out) const {
    if (first > num_tokens_ || count > num_tokens_ - first)
        fail(path_, "read of tokens [" + std::to_string(first) + ", " + std::to_string(first + count) +
                        ") passes the end (" + std::to_string(num_tokens_) + " tokens)");
    const uint64_t offset = kShardHeaderBytes + token_bytes_ * first;
    if (token_bytes_ == 4) return read_exact(fd_, out, count * sizeof(uint32_t), offset, path_);
    // uint16 tokens are read into the back half of `out` and widened in place, front to back: out[i] covers only
    // 16-bit tokens 0..i, all read by then, so no buffer is needed.
    char* narrow = reinterpret_cast<char*>(out) + count * sizeof(uint16_t);
    read_exact(fd_, narrow, count * sizeof(uint16_t), offset, path_);
    for (size_t i = 0; i < count; ++i) {
        uint16_t token;
        std::memcpy(&token, narrow + i * sizeof(uint16_t), sizeof token);
        out[i] = token;
    }
}

std::vector<uint32_t> read_shard(const std::string& path, int vocab_size) {
    ShardReader reader(path);
    std::vector<uint32_t> tokens(reader.num_tokens());
    reader.read(0, tokens.size(), tokens.data());
    check_token_ids(path, tokens.data(), tokens.size(), 0, vocab_size);
    return tokens;
}

// ---- mask shards ---------------------------------------------------------------------------------------------

namespace {
constexpr char kMaskSuffix[] = ".mask";
}

std::string mask_shard_path(const std::string& shard_path) { return shard_path + kMaskSuffix; }

bool is_mask_shard_path(const std::string& path) {
    const size_t n = sizeof kMaskSuffix - 1;
    return path.size() > n && path.compare(path.size() - n, n, kMaskSuffix) == 0;
}

void write_mask_shard(const std::string& path, const uint8_t* mask, size_t count, int window) {
    if (count > static_cast<size_t>(INT32_MAX)) fail(path, "too many tokens for one mask shard (header count is int32)");
    if (window <= 0) fail(path, "the window " + std::to_string(window) + " is not positive");
    const uint64_t ones = count_mask_ones(path, mask, count, 0);
    int32_t header[256] = {};
    header[0] = kMaskShardMagic;
    header[1] = kMaskShardVersion;
    header[2] = static_cast<int32_t>(count);
    header[3] = window;
    header[4] = static_cast<int32_t>(ones);
    write_atomically(path, header, [&](int fd, const std::string& tmp) { write_all(fd, mask, count, tmp); });
}

MaskReader::MaskReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, std::string("cannot open mask shard: ") + std::strerror(errno));
    try {
        struct stat st;
        if (::fstat(fd_, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
        const uint64_t size = static_cast<uint64_t>(st.st_size);
        if (size < kShardHeaderBytes)
            fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 1024-byte mask shard header");
        int32_t header[256];
        read_exact(fd_, header, sizeof header, 0, path);
        if (header[0] != kMaskShardMagic)
            fail(path, "bad magic " + std::to_string(header[0]) + " (expected " + std::to_string(kMaskShardMagic) +
                           ": not a mask shard)");
        if (header[1] != kMaskShardVersion)
            fail(path, "unsupported mask shard version " + std::to_string(header[1]) + " (expected " +
                           std::to_string(kMaskShardVersion) + ")");
        if (header[2] < 0) fail(path, "negative token count " + std::to_string(header[2]) + " in the header");
        if (header[3] <= 0) fail(path, "the window " + std::to_string(header[3]) + " in the header is not positive");
        if (header[4] < 0 || header[4] > header[2])
            fail(path, "counted tokens " + std::to_string(header[4]) + " in the header is not in [0, " +
                           std::to_string(header[2]) + "], the token count");
        num_tokens_ = static_cast<uint64_t>(header[2]);
        window_ = header[3];
        counted_tokens_ = static_cast<uint64_t>(header[4]);
        if (size != kShardHeaderBytes + num_tokens_)
            fail(path, "size mismatch: header says " + std::to_string(num_tokens_) + " mask bytes (" +
                           std::to_string(kShardHeaderBytes + num_tokens_) + " bytes) but the file is " +
                           std::to_string(size) + " bytes");
    } catch (...) {
        ::close(fd_);
        throw;
    }
}

MaskReader::~MaskReader() { ::close(fd_); }

void MaskReader::read(uint64_t first, size_t count, uint8_t* out) const {
    if (first > num_tokens_ || count > num_tokens_ - first)
        fail(path_, "read of mask bytes [" + std::to_string(first) + ", " + std::to_string(first + count) +
                        ") passes the end (" + std::to_string(num_tokens_) + " tokens)");
    read_exact(fd_, out, count, kShardHeaderBytes + first, path_);
    count_mask_ones(path_, out, count, first);
}

std::vector<uint8_t> read_mask_shard(const std::string& path) {
    MaskReader reader(path);
    std::vector<uint8_t> mask(reader.num_tokens());
    reader.read(0, mask.size(), mask.data());
    const uint64_t ones = std::count(mask.begin(), mask.end(), uint8_t(1));
    if (ones != reader.counted_tokens())
        fail(path, "the header counts " + std::to_string(reader.counted_tokens()) + " counted tokens but the mask holds " +
                       std::to_string(ones));
    return mask;
}
