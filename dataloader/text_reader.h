// Streaming reader for input text files, plain or xz-compressed (by the ".xz" suffix); "-" is stdin.
//
// .xz files are decompressed by running `xz -dc` as a child process (no shell; the file is opened here and
// handed to xz as its stdin). That keeps every binary free of a liblzma build dependency; only reading .xz
// input needs the xz tool, which any machine holding .xz files has. Because xz reads through a duplicate
// of our descriptor, the shared file offset tells how much of the compressed file is consumed, which
// drives progress bars for plain and compressed input alike.
//
// Errors throw std::runtime_error with a one-line message naming the file (xz's own message included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

class TextFileReader {
public:
    explicit TextFileReader(const std::string& path);
    ~TextFileReader();
    TextFileReader(const TextFileReader&) = delete;
    TextFileReader& operator=(const TextFileReader&) = delete;

    // Reads up to n bytes of (decompressed) text; returns 0 at the end of the text.
    size_t read(char* buf, size_t n);

    uint64_t file_size() const { return file_size_; }  // bytes on disk; 0 for stdin (unknown)
    uint64_t file_position() const;                     // bytes on disk consumed so far
    const std::string& path() const { return path_; }

private:
    [[noreturn]] void fail(const std::string& what) const;
    void start_xz();
    void finish_child();  // waits for xz and throws if it failed

    std::string path_;
    int file_fd_ = -1;
    int text_fd_ = -1;    // file_fd_ for plain files; the read end of xz's stdout pipe otherwise
    int stderr_fd_ = -1;  // read end of xz's stderr pipe
    bool xz_ = false;
    int child_pid_ = -1;
    uint64_t file_size_ = 0;
    uint64_t bytes_read_ = 0;  // of text_fd_
};

// The whole (decompressed) text of a file.
std::string read_text_file(const std::string& path);
