// Writing and validated reading of llm.c token shards (the format: shards.h, docs/formats.md). Which windows of
// a shard make a batch is the DataLoader's; tokenizing text into shards is prepare_shards'.
#include "shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

}  // namespace

void write_shard(const std::string& path, const uint16_t* tokens, size_t count) {
    if (count > static_cast<size_t>(INT32_MAX)) fail(path, "too many tokens for one shard (header count is int32)");
    int32_t header[256] = {};
    header[0] = kShardMagic;
    header[1] = kShardVersion;
    header[2] = static_cast<int32_t>(count);
    // written under a temporary name, synced, then renamed into place: a reader (or a crash) never sees half a
    // shard, and two writers of the same path cannot interleave (the pid keeps their temporary files apart)
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(path, "cannot create the temporary file " + tmp + ": " + std::strerror(errno));
    try {
        write_all(fd, header, sizeof header, tmp);
        write_all(fd, tokens, count * sizeof(uint16_t), tmp);
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

void check_token_ids(const std::string& path, const uint16_t* tokens, size_t count, uint64_t first_index,
                     int vocab_size) {
    for (size_t i = 0; i < count; ++i) {
        if (tokens[i] >= vocab_size)
            fail(path, "token id " + std::to_string(tokens[i]) + " at index " + std::to_string(first_index + i) +
                           " is >= vocab size " + std::to_string(vocab_size));
    }
}

// Everything a later read relies on is checked here, once: the magic, the version, and a file size that agrees
// with the header's count (a truncated or still-growing shard is refused by name instead of read short).
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
        if (header[0] != kShardMagic)
            fail(path, "bad magic " + std::to_string(header[0]) + " (expected 20240520: not a token shard)");
        if (header[1] != kShardVersion)
            fail(path, "unsupported shard version " + std::to_string(header[1]) + " (expected 1)");
        if (header[2] < 0) fail(path, "negative token count " + std::to_string(header[2]) + " in the header");
        num_tokens_ = static_cast<uint64_t>(header[2]);
        const uint64_t expected = kShardHeaderBytes + 2 * num_tokens_;
        if (size != expected)
            fail(path, "size mismatch: header says " + std::to_string(num_tokens_) + " tokens (" +
                           std::to_string(expected) + " bytes) but the file is " + std::to_string(size) + " bytes");
    } catch (...) {
        ::close(fd_);
        throw;
    }
}

ShardReader::~ShardReader() { ::close(fd_); }

// pread: reads at an absolute offset, with no file position to keep in step between reads or threads.
void ShardReader::read(uint64_t first, size_t count, uint16_t* out) const {
    if (first > num_tokens_ || count > num_tokens_ - first)
        fail(path_, "read of tokens [" + std::to_string(first) + ", " + std::to_string(first + count) +
                        ") passes the end (" + std::to_string(num_tokens_) + " tokens)");
    read_exact(fd_, out, count * sizeof(uint16_t), kShardHeaderBytes + 2 * first, path_);
}

std::vector<uint16_t> read_shard(const std::string& path, int vocab_size) {
    ShardReader reader(path);
    std::vector<uint16_t> tokens(reader.num_tokens());
    reader.read(0, tokens.size(), tokens.data());
    check_token_ids(path, tokens.data(), tokens.size(), 0, vocab_size);
    return tokens;
}
