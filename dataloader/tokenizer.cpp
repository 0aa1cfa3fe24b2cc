// GPT-2 byte-level BPE: vocabulary loading (encoder.json / vocab.bpe, llm.c tokenizer file), the
// pre-tokenizer scanner, rank-ordered BPE merging with a per-thread piece cache, and decoding.
#include "tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <stdexcept>

#include "unicode_tables.h"

namespace {

using unicode_tables::CharClass;

constexpr uint32_t kLlmcTokenizerMagic = 20240328;
constexpr int kLlmcHeaderWords = 256;
constexpr const char* kEndOfText = "<|endoftext|>";

std::string read_whole_file(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
    std::string data;
    char buf[1 << 16];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, got);
    bool failed = std::ferror(f);
    std::fclose(f);
    if (failed) throw std::runtime_error(path + ": read error");
    return data;
}

// ---- UTF-8 and character classes -------------------------------------------------------------------

// Length (1-4) of the well-formed UTF-8 sequence starting at s[i] (Unicode Table 3-7: no overlongs, no
// surrogates, nothing above U+10FFFF), storing its code point in cp; 0 if s[i] does not start one.
inline int decode_utf8(const unsigned char* s, size_t n, size_t i, uint32_t& cp) {
    unsigned char b0 = s[i];
    if (b0 < 0x80) {
        cp = b0;
        return 1;
    }
    auto cont = [&](size_t k) { return i + k < n && (s[i + k] & 0xC0) == 0x80; };
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (!cont(1)) return 0;
        cp = (b0 & 0x1Fu) << 6 | (s[i + 1] & 0x3Fu);
        return 2;
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (!cont(1) || !cont(2)) return 0;
        unsigned char b1 = s[i + 1];
        if ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F)) return 0;
        cp = (b0 & 0x0Fu) << 12 | (b1 & 0x3Fu) << 6 | (s[i + 2] & 0x3Fu);
        return 3;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (!cont(1) || !cont(2) || !cont(3)) return 0;
        unsigned char b1 = s[i + 1];
        if ((b0 == 0xF0 && b1 < 0x90) || (b0 == 0xF4 && b1 > 0x8F)) return 0;
        cp = (b0 & 0x07u) << 18 | (b1 & 0x3Fu) << 12 | (s[i + 2] & 0x3Fu) << 6 | (s[i + 3] & 0x3Fu);
        return 4;
    }
    return 0;
}

CharClass class_of_code_point(uint32_t cp) {
    const auto* lo = std::begin(unicode_tables::kRanges);
    const auto* hi = std::end(unicode_tables::kRanges);
    while (lo < hi) {  // first range whose last >= cp
        const auto* mid = lo + (hi - lo) / 2;
        if (mid->last < cp) lo = mid + 1;
        else hi = mid;
    }
    return (lo != std::end(unicode_tables::kRanges) && lo->first <= cp) ? lo->cls : unicode_tables::kOther;
}

struct AsciiClasses {
    CharClass cls[128];
    AsciiClasses() {
        for (uint32_t c = 0; c < 128; ++c) cls[c] = class_of_code_point(c);
    }
};
const AsciiClasses kAscii;

struct Char {
    CharClass cls;
    size_t len;
};

// The character at s[i]; an invalid UTF-8 byte is a one-byte character of class "other".
inline Char char_at(const unsigned char* s, size_t n, size_t i) {
    if (s[i] < 0x80) return {kAscii.cls[s[i]], 1};
    uint32_t cp;
    int len = decode_utf8(s, n, i, cp);
    if (len == 0) return {unicode_tables::kOther, 1};
    return {class_of_code_point(cp), static_cast<size_t>(len)};
}

inline size_t run_end(const unsigned char* s, size_t n, size_t i, CharClass cls) {
    while (i < n) {
        Char c = char_at(s, n, i);
        if (c.cls != cls) break;
        i += c.len;
    }
    return i;
}

// End of the pre-token piece starting at s[i] (i < n). Tries the alternatives of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// in order, as a backtracking regex engine would (first matching alternative wins, each greedy).
size_t piece_end(const unsigned char* s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            unsigned char b = s[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    Char c = char_at(s, n, i);
    if (c.cls != unicode_tables::kSpace) return run_end(s, n, i + c.len, c.cls);
    if (s[i] == ' ' && i + 1 < n) {  // the optional leading space of the three run alternatives
        Char d = char_at(s, n, i + 1);
        if (d.cls != unicode_tables::kSpace) return run_end(s, n, i + 1 + d.len, d.cls);
    }
    // White space: \s+(?!\S) backtracks to leave the run's last character to the following non-space
    // piece; a single space character followed by non-space falls through to \s+ and stands alone.
    size_t last = i, j = i + c.len;
    while (j < n) {
        Char d = char_at(s, n, j);
        if (d.cls != unicode_tables::kSpace) break;
        last = j;
        j += d.len;
    }
    return (j == n || last == i) ? j : last;
}

bool starts_contraction(unsigned char c) {  // 's 't 'm 'd, and 're 've 'll
    return c == 's' || c == 't' || c == 'm' || c == 'd' || c == 'r' || c == 'v' || c == 'l';
}

// ---- GPT-2's byte <-> printable-character map (bytes_to_unicode in OpenAI's encoder.py) --------------

// encoder.json / vocab.bpe spell each byte as a printable code point: printable Latin-1 bytes stand for
// themselves, the other 68 bytes map to U+0100.. in byte order. Returns code point -> byte (-1: none).
std::vector<int> printable_to_byte() {
    std::vector<int> inverse(256 + 68, -1);
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    int extra = 0;
    for (int b = 0; b < 256; ++b) inverse[printable(b) ? b : 256 + extra++] = b;
    return inverse;
}

// Turns a vocabulary string (UTF-8 of mapped code points) back into the token's raw bytes.
std::string unmap_token(std::string_view mapped, const std::vector<int>& inverse, const std::string& where) {
    std::string bytes;
    const auto* s = reinterpret_cast<const unsigned char*>(mapped.data());
    for (size_t i = 0; i < mapped.size();) {
        uint32_t cp;
        int len = decode_utf8(s, mapped.size(), i, cp);
        if (len == 0 || cp >= inverse.size() || inverse[cp] < 0)
            throw std::runtime_error(where + ": token \"" + std::string(mapped) + "\" is not in GPT-2's byte map");
        bytes.push_back(static_cast<char>(inverse[cp]));
        i += len;
    }
    return bytes;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | cp >> 6));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | cp >> 12));
        out.push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | cp >> 18));
        out.push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

// ---- encoder.json: one flat JSON object of string -> integer -----------------------------------------

class EncoderJsonParser {
public:
    EncoderJsonParser(const std::string& text, const std::string& path) : t_(text), path_(path) {}

    std::vector<std::pair<std::string, int>> parse() {
        std::vector<std::pair<std::string, int>> entries;
        skip_ws();
        expect('{');
        skip_ws();
        if (peek() == '}') return entries;
        for (;;) {
            skip_ws();
            std::string key = parse_string();
            skip_ws();
            expect(':');
            skip_ws();
            entries.emplace_back(std::move(key), parse_int());
            skip_ws();
            if (peek() == '}') break;
            expect(',');
        }
        ++i_;
        skip_ws();
        if (i_ != t_.size()) fail("trailing data after the object");
        return entries;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw std::runtime_error(path_ + ": malformed encoder.json at byte " + std::to_string(i_) + ": " + what);
    }
    char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
    void expect(char c) {
        if (peek() != c) fail(std::string("expected '") + c + "'");
        ++i_;
    }
    void skip_ws() {
        while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) ++i_;
    }
    int parse_int() {
        size_t start = i_;
        long v = 0;
        while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9' && i_ - start < 9) v = v * 10 + (t_[i_++] - '0');
        if (i_ == start) fail("expected a non-negative integer");
        return static_cast<int>(v);
    }
    uint32_t parse_hex4() {
        if (i_ + 4 > t_.size()) fail("truncated \\u escape");
        uint32_t v = 0;
        for (int k = 0; k < 4; ++k) {
            char c = t_[i_++];
            int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                                     : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
            if (d < 0) fail("bad hex digit in \\u escape");
            v = v << 4 | d;
        }
        return v;
    }
    std::string parse_string() {
        expect('"');
        std::string s;
        for (;;) {
            if (i_ >= t_.size()) fail("unterminated string");
            char c = t_[i_++];
            if (c == '"') return s;
            if (c != '\\') {
                s.push_back(c);
                continue;
            }
            if (i_ >= t_.size()) fail("unterminated escape");
            char e = t_[i_++];
            switch (e) {
                case '"': case '\\': case '/': s.push_back(e); break;
                case 'b': s.push_back('\b'); break;
                case 'f': s.push_back('\f'); break;
                case 'n': s.push_back('\n'); break;
                case 'r': s.push_back('\r'); break;
                case 't': s.push_back('\t'); break;
                case 'u': {
                    uint32_t cp = parse_hex4();
                    if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair spells one supplementary code point
                        if (peek() != '\\' || i_ + 1 >= t_.size() || t_[i_ + 1] != 'u') fail("lone surrogate");
                        i_ += 2;
                        uint32_t low = parse_hex4();
                        if (low < 0xDC00 || low > 0xDFFF) fail("bad low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        fail("lone surrogate");
                    }
                    append_utf8(s, cp);
                    break;
                }
                default: fail(std::string("unknown escape \\") + e);
            }
        }
    }

    const std::string& t_;
    const std::string& path_;
    size_t i_ = 0;
};

// ---- per-thread cache of BPE results for pieces that are not a single token ----------------------------

struct PieceCache {
    uint64_t owner = 0;     // instance id of the tokenizer the entries belong to
    ByteStringTable index;  // piece -> offset into ids
    std::vector<int> ids;   // at each offset: the token count, then the tokens
};
thread_local PieceCache t_piece_cache;
// Bounds memory on long multilingual corpora; English text needs far fewer entries than this.
constexpr size_t kMaxCachedPieces = size_t(1) << 18;

std::atomic<uint64_t> g_next_instance_id{1};

[[noreturn]] void throw_bad_token_id(int id, int vocab_size) {
    throw std::out_of_range("token id " + std::to_string(id) + " out of range [0, " + std::to_string(vocab_size) +
                            ")");
}

uint64_t hash_bytes(std::string_view key) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ key.size();
    const char* p = key.data();
    size_t n = key.size();
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    if (n) {
        uint64_t w = 0;
        std::memcpy(&w, p, n);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    }
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    return h;
}

}  // namespace

void safe_parts(std::string_view text, size_t limit, size_t chunk, std::vector<size_t>& ends) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    Char c = char_at(s, n, 0);
    CharClass prev = c.cls;
    bool prev_apostrophe = s[0] == '\'';
    size_t safe = 0, boundary = 0;
    ends.clear();
    // a cut before character i is safe when the character before it is not white space, and i starts another
    // class and no contraction ('s, 're, ...): no pre-token piece spans it
    for (size_t i = c.len; i <= limit; i += c.len) {
        c = char_at(s, n, i);
        if (prev != unicode_tables::kSpace && c.cls != prev && !(prev_apostrophe && starts_contraction(s[i]))) safe = i;
        if (safe == 0 && i - (ends.empty() ? 0 : ends.back()) >= chunk) ends.push_back(i);
        boundary = i;
        prev = c.cls;
        prev_apostrophe = s[i] == '\'';
    }
    if (safe > 0) {
        ends.assign(1, safe);
    } else if (ends.empty() || ends.back() < boundary) {
        ends.push_back(boundary);
    }
}

// ---- ByteStringTable -------------------------------------------------------------------------------------

const uint32_t* ByteStringTable::find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    uint64_t h = hash_bytes(key);
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const Slot& s = slots_[i];
        if (s.key_length == kEmpty) return nullptr;
        if (s.hash == h && s.key_length == key.size() &&
            std::memcmp(arena_.data() + s.key_offset, key.data(), key.size()) == 0)
            return &s.value;
    }
}

void ByteStringTable::insert(std::string_view key, uint32_t value) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    uint64_t h = hash_bytes(key);
    size_t mask = slots_.size() - 1;
    size_t i = h & mask;
    while (slots_[i].key_length != kEmpty) i = (i + 1) & mask;
    slots_[i] = Slot{h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), value};
    arena_.append(key);
    ++count_;
}

void ByteStringTable::grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.key_length == kEmpty) continue;
        size_t i = s.hash & mask;
        while (slots_[i].key_length != kEmpty) i = (i + 1) & mask;
        slots_[i] = s;
    }
}

void ByteStringTable::clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    arena_.clear();
    count_ = 0;
}

// ---- MergeTable -----------------------------------------------------------------------------------------

const MergeTable::Merge* MergeTable::find(int left, int right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = key_of(left, right);
    const size_t mask = slots_.size() - 1;
    for (size_t i = slot_of(key);; i = (i + 1) & mask) {
        if (slots_[i].key == key) return &slots_[i].merge;
        if (slots_[i].key == kEmpty) return nullptr;
    }
}

bool MergeTable::insert(int left, int right, Merge merge) {
    if (find(left, right)) return false;
    if ((count_ + 1) * 2 > slots_.size()) grow();
    const uint64_t key = key_of(left, right);
    const size_t mask = slots_.size() - 1;
    size_t i = slot_of(key);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask;
    slots_[i] = Slot{key, merge};
    ++count_;
    return true;
}

void MergeTable::grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
    shift_ = 64 - __builtin_ctzll(slots_.size());
    const size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.key == kEmpty) continue;
        size_t i = slot_of(s.key);
        while (slots_[i].key != kEmpty) i = (i + 1) & mask;
        slots_[i] = s;
    }
}

// ---- TokenDecoder ----------------------------------------------------------------------------------------

TokenDecoder::TokenDecoder(std::vector<std::string> token_bytes, int eot) : eot_(eot) {
    offsets_.reserve(token_bytes.size() + 1);
    offsets_.push_back(0);
    for (const std::string& t : token_bytes) {
        bytes_ += t;
        offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
    }
}

std::string TokenDecoder::decode_token(int id) const {
    if (id < 0 || id >= vocab_size()) throw_bad_token_id(id, vocab_size());
    return bytes_.substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

std::string TokenDecoder::decode(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) {
        if (id < 0 || id >= vocab_size()) throw_bad_token_id(id, vocab_size());
        out.append(bytes_, offsets_[id], offsets_[id + 1] - offsets_[id]);
    }
    return out;
}

TokenDecoder TokenDecoder::load_llmc(const std::string& path) {
    std::string data = read_whole_file(path);
    auto fail = [&](const std::string& what) { throw std::runtime_error(path + ": " + what); };
    if (data.size() < kLlmcHeaderWords * 4) fail("too short for an llm.c tokenizer header");
    uint32_t header[kLlmcHeaderWords];
    std::memcpy(header, data.data(), sizeof header);
    if (header[0] != kLlmcTokenizerMagic) fail("bad magic " + std::to_string(header[0]) + " (expected 20240328)");
    if (header[1] != 1 && header[1] != 2) fail("unsupported tokenizer version " + std::to_string(header[1]));
    uint32_t vocab = header[2];
    // Version 1 files predate the eot field; they were all GPT-2, whose eot is 50256.
    int eot = header[1] == 2 ? static_cast<int>(header[3]) : 50256;
    if (eot < 0 || static_cast<uint32_t>(eot) >= vocab) fail("eot id " + std::to_string(eot) + " >= vocab size");
    std::vector<std::string> tokens;
    // no more than the file can hold (2 bytes a token at least): a corrupt count must not reserve gigabytes
    tokens.reserve(std::min<size_t>(vocab, (data.size() - kLlmcHeaderWords * 4) / 2));
    size_t pos = kLlmcHeaderWords * 4;
    for (uint32_t i = 0; i < vocab; ++i) {
        if (pos >= data.size()) fail("truncated at token " + std::to_string(i));
        size_t len = static_cast<unsigned char>(data[pos++]);
        if (len == 0) fail("token " + std::to_string(i) + " has length 0");
        if (pos + len > data.size()) fail("truncated at token " + std::to_string(i));
        tokens.emplace_back(data, pos, len);
        pos += len;
    }
    if (pos != data.size()) fail(std::to_string(data.size() - pos) + " trailing bytes after the last token");
    return TokenDecoder(std::move(tokens), eot);
}

void TokenDecoder::save_llmc(const std::string& path) const {
    uint32_t header[kLlmcHeaderWords] = {};
    header[0] = kLlmcTokenizerMagic;
    header[1] = 2;
    header[2] = static_cast<uint32_t>(vocab_size());
    header[3] = static_cast<uint32_t>(eot_);
    std::string data(reinterpret_cast<const char*>(header), sizeof header);
    for (int i = 0; i < vocab_size(); ++i) {
        size_t len = offsets_[i + 1] - offsets_[i];
        if (len == 0 || len > 255)
            throw std::runtime_error(path + ": token " + std::to_string(i) + " has length " +
                                     std::to_string(len) + ", not representable (1..255)");
        data.push_back(static_cast<char>(len));
        data.append(bytes_, offsets_[i], len);
    }
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
    bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) throw std::runtime_error(path + ": write error");
}

// ---- GPT2Tokenizer: loading ------------------------------------------------------------------------------

GPT2Tokenizer GPT2Tokenizer::load(const std::string& dir) {
    return load_files(dir + "/encoder.json", dir + "/vocab.bpe");
}

GPT2Tokenizer GPT2Tokenizer::load_files(const std::string& encoder_json, const std::string& vocab_bpe) {
    GPT2Tokenizer tok;
    const std::vector<int> inverse = printable_to_byte();

    auto entries = EncoderJsonParser(read_whole_file(encoder_json), encoder_json).parse();
    std::vector<std::string> token_bytes(entries.size());
    std::vector<bool> seen(entries.size(), false);
    for (const auto& [mapped, id] : entries) {
        if (id < 0 || static_cast<size_t>(id) >= entries.size() || seen[id])
            throw std::runtime_error(encoder_json + ": token ids must be 0..N-1, each once (bad id " +
                                     std::to_string(id) + ")");
        seen[id] = true;
        // The special token is spelled literally, not through the byte map.
        token_bytes[id] = mapped == kEndOfText ? mapped : unmap_token(mapped, inverse, encoder_json);
    }
    if (static_cast<int>(token_bytes.size()) <= tok.eot() || token_bytes[tok.eot()] != kEndOfText)
        throw std::runtime_error(encoder_json + ": token 50256 is not <|endoftext|>");
    for (int id = 0; id < static_cast<int>(token_bytes.size()); ++id)
        if (id != tok.eot()) tok.vocab_.insert(token_bytes[id], static_cast<uint32_t>(id));
    for (int b = 0; b < 256; ++b) {
        const uint32_t* id = tok.vocab_.find(std::string(1, static_cast<char>(b)));
        if (!id) throw std::runtime_error(encoder_json + ": no token for byte " + std::to_string(b));
        tok.byte_token_[b] = static_cast<int>(*id);
    }

    std::string merges_text = read_whole_file(vocab_bpe);
    size_t pos = 0;
    int line_no = 0, rank = 0;
    while (pos < merges_text.size()) {
        size_t eol = merges_text.find('\n', pos);
        if (eol == std::string::npos) eol = merges_text.size();
        std::string_view line(merges_text.data() + pos, eol - pos);
        pos = eol + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
        std::string where = vocab_bpe + ":" + std::to_string(line_no);
        size_t space = line.find(' ');
        if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
            throw std::runtime_error(where + ": expected two tokens separated by one space");
        std::string left = unmap_token(line.substr(0, space), inverse, where);
        std::string right = unmap_token(line.substr(space + 1), inverse, where);
        const uint32_t* l = tok.vocab_.find(left);
        const uint32_t* r = tok.vocab_.find(right);
        const uint32_t* m = tok.vocab_.find(left + right);
        if (!l || !r || !m) throw std::runtime_error(where + ": merge uses or makes a token not in encoder.json");
        if (!tok.merges_.insert(static_cast<int>(*l), static_cast<int>(*r), {rank++, static_cast<int>(*m)}))
            throw std::runtime_error(where + ": duplicate merge");
    }
    tok.decoder_ = TokenDecoder(std::move(token_bytes), tok.eot());
    tok.instance_id_ = g_next_instance_id++;
    return tok;
}

// ---- GPT2Tokenizer: encoding -----------------------------------------------------------------------------

// Merges the piece's bytes: repeatedly the adjacent pair with the lowest merge rank, leftmost first on ties.
// A min-heap of candidate pairs over a linked list of symbols keeps long pieces (runs of spaces or
// punctuation) O(n log n); entries made stale by an earlier merge are detected and skipped when popped.
void GPT2Tokenizer::byte_pair_merge(std::string_view piece, std::vector<int>& out) const {
    struct Scratch {  // reused across calls, to keep allocation out of the loop
        std::vector<int> sym, next, prev;
        std::vector<std::pair<int, int>> heap;  // (rank, left symbol index)
    };
    thread_local Scratch scratch;
    const int n = static_cast<int>(piece.size());
    std::vector<int>& sym = scratch.sym;
    std::vector<int>& next = scratch.next;  // -1: last symbol; kMerged: merged into its left neighbour
    std::vector<int>& prev = scratch.prev;
    constexpr int kMerged = -2;
    sym.resize(n), next.resize(n), prev.resize(n);
    for (int i = 0; i < n; ++i) {
        sym[i] = byte_token_[static_cast<unsigned char>(piece[i])];
        next[i] = i + 1 < n ? i + 1 : -1;
        prev[i] = i - 1;
    }
    auto& heap = scratch.heap;
    heap.clear();
    const std::greater<std::pair<int, int>> later;  // makes the std heap functions keep the minimum on top
    auto push = [&](int left) {
        if (left < 0 || next[left] < 0) return;
        if (const MergeTable::Merge* m = merges_.find(sym[left], sym[next[left]])) {
            heap.emplace_back(m->rank, left);
            std::push_heap(heap.begin(), heap.end(), later);
        }
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), later);
        const auto [rank, left] = heap.back();
        heap.pop_back();
        const int right = next[left];
        if (right < 0) continue;  // left was merged away or is now the last symbol
        const MergeTable::Merge* m = merges_.find(sym[left], sym[right]);
        if (!m || m->rank != rank) continue;  // stale: a neighbour changed since this entry was pushed
        sym[left] = m->result;
        next[left] = next[right];
        next[right] = kMerged;
        if (next[left] >= 0) prev[next[left]] = left;
        push(prev[left]);
        push(left);
    }
    for (int i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
}

void GPT2Tokenizer::encode_piece(std::string_view piece, std::vector<int>& out) const {
    // Whole-piece lookup first, as tiktoken does: most words are one token.
    if (const uint32_t* id = vocab_.find(piece)) {
        out.push_back(static_cast<int>(*id));
        return;
    }
    PieceCache& cache = t_piece_cache;
    if (cache.owner != instance_id_) {
        cache.index.clear();
        cache.ids.clear();
        cache.owner = instance_id_;
    }
    if (const uint32_t* offset = cache.index.find(piece)) {
        const int* p = cache.ids.data() + *offset;
        out.insert(out.end(), p + 1, p + 1 + p[0]);
        return;
    }
    size_t start = out.size();
    byte_pair_merge(piece, out);
    if (cache.index.size() >= kMaxCachedPieces) {
        cache.index.clear();
        cache.ids.clear();
    }
    cache.index.insert(piece, static_cast<uint32_t>(cache.ids.size()));
    cache.ids.push_back(static_cast<int>(out.size() - start));
    cache.ids.insert(cache.ids.end(), out.begin() + start, out.end());
}

void GPT2Tokenizer::encode_append(std::string_view text, std::vector<int>& out) const {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
        size_t j = piece_end(s, n, i);
        encode_piece(text.substr(i, j - i), out);
        i = j;
    }
}

std::vector<int> GPT2Tokenizer::encode(std::string_view text) const {
    std::vector<int> out;
    out.reserve(text.size() / 4);
    encode_append(text, out);
    return out;
}

std::vector<int> GPT2Tokenizer::encode_with_special(std::string_view text) const {
    std::vector<int> out;
    out.reserve(text.size() / 4);
    const std::string_view eot_text(kEndOfText);
    for (;;) {
        size_t at = text.find(eot_text);
        encode_append(text.substr(0, at), out);
        if (at == std::string_view::npos) break;
        out.push_back(eot());
        text.remove_prefix(at + eot_text.size());
    }
    return out;
}
