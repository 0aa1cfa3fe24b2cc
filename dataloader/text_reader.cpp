// TextFileReader: plain files are read directly; .xz files through an `xz -dc` child process (text_reader.h says
// why a child process rather than liblzma). Tokenizing what it reads is the tokenizer's and prepare_shards'.
#include "text_reader.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TextFileReader::TextFileReader(const std::string& path) : path_(path) {
    if (path == "-") {
        text_fd_ = STDIN_FILENO;
        return;
    }
    file_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (file_fd_ < 0) fail(std::string("cannot open: ") + std::strerror(errno));
    try {
        struct stat st;
        if (::fstat(file_fd_, &st) != 0) fail(std::string("cannot stat: ") + std::strerror(errno));
        if (S_ISDIR(st.st_mode)) fail("is a directory");
        file_size_ = static_cast<uint64_t>(st.st_size);
        if (ends_with(path, ".xz")) {
            start_xz();
        } else {
            text_fd_ = file_fd_;
        }
    } catch (...) {
        ::close(file_fd_);
        throw;
    }
}

// posix_spawnp rather than fork + exec: nothing runs in the child between the two, so it is safe in a program
// with threads (prepare_shards tokenizes on several). xz's stderr goes to a pipe of its own so that its message
// can be reported with the file's name if it fails. xz starts with no signal blocked: train_gpt blocks its stop
// signals in every thread (distributed/stop_signals.h), and a child would inherit that.
void TextFileReader::start_xz() {
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) fail(std::string("pipe: ") + std::strerror(errno));
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
        ::close(out_pipe[0]);
        ::close(out_pipe[1]);
        fail(std::string("pipe: ") + std::strerror(errno));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, file_fd_, STDIN_FILENO);  // dup2 clears O_CLOEXEC
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
    char arg0[] = "xz", arg1[] = "-dc";
    char* argv[] = {arg0, arg1, nullptr};
    pid_t pid;
    int rc = posix_spawnp(&pid, "xz", &actions, &attributes, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    if (rc != 0) {
        ::close(out_pipe[0]);
        ::close(err_pipe[0]);
        fail(std::string("cannot run `xz -dc` to decompress it: ") + std::strerror(rc));
    }
    xz_ = true;
    child_pid_ = pid;
    text_fd_ = out_pipe[0];
    stderr_fd_ = err_pipe[0];
}

TextFileReader::~TextFileReader() {
    if (child_pid_ > 0) {
        ::close(text_fd_);  // an unfinished xz gets SIGPIPE and exits
        int status;
        ::waitpid(child_pid_, &status, 0);
        ::close(stderr_fd_);
    }
    if (file_fd_ >= 0) ::close(file_fd_);
}

void TextFileReader::fail(const std::string& what) const {
    throw std::runtime_error(path_ + ": " + what);
}

size_t TextFileReader::read(char* buf, size_t n) {
    if (n == 0 || text_fd_ < 0) return 0;
    for (;;) {
        ssize_t got = ::read(text_fd_, buf, n);
        if (got > 0) {
            bytes_read_ += static_cast<uint64_t>(got);
            return static_cast<size_t>(got);
        }
        if (got == 0) {
            finish_child();
            return 0;
        }
        if (errno != EINTR) fail(std::string("read error: ") + std::strerror(errno));
    }
}

void TextFileReader::finish_child() {
    if (child_pid_ <= 0) return;
    int status = 0;
    while (::waitpid(child_pid_, &status, 0) < 0 && errno == EINTR) {
    }
    child_pid_ = -1;
    std::string message;
    char buf[512];
    ssize_t got;
    while (message.size() < 2048 && (got = ::read(stderr_fd_, buf, sizeof buf)) > 0) message.append(buf, got);
    ::close(stderr_fd_);
    ::close(text_fd_);
    text_fd_ = stderr_fd_ = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    // xz's message names "(stdin)"; keep its first line, which carries the reason.
    message = message.substr(0, message.find('\n'));
    fail("`xz -dc` failed" + (message.empty() ? std::string() : ": " + message));
}

uint64_t TextFileReader::file_position() const {
    if (!xz_) return bytes_read_;  // plain file or stdin: what we read is what was consumed
    off_t pos = ::lseek(file_fd_, 0, SEEK_CUR);
    return pos < 0 ? 0 : static_cast<uint64_t>(pos);
}

std::string read_text_file(const std::string& path) {
    TextFileReader reader(path);
    std::string text;
    text.reserve(reader.file_size());
    char buf[1 << 16];
    size_t got;
    while ((got = reader.read(buf, sizeof buf)) > 0) text.append(buf, got);
    return text;
}
