// Byte-level BPE: loading (encoder.json / vocab.bpe, tokenizer.json, llm.c tokenizer file), the pre-tokenizer
// scanners, NFC, added tokens, rank-ordered BPE merging with a per-thread piece cache, and decoding.
#include "tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <stdexcept>

#include "json.h"
#include "unicode_tables.h"

namespace {

using unicode_tables::CharClass;
using unicode_tables::kLetter;
using unicode_tables::kMark;
using unicode_tables::kNumber;
using unicode_tables::kOther;
using unicode_tables::kSpace;

constexpr uint32_t kLlmcTokenizerMagic = 20240328;
constexpr int kLlmcHeaderWords = 256;
constexpr const char* kEndOfText = "<|endoftext|>";
constexpr int kGpt2EndOfText = 50256;

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

// ---- UTF-8 -------------------------------------------------------------------------------

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

// ---- character classes ---------------------------------------------------------------------------------

// A code point's class: a direct table for the Basic Multilingual Plane, a binary search of the ranges above it.
CharClass search_ranges(uint32_t cp) {
    const auto* lo = std::begin(unicode_tables::kRanges);
    const auto* hi = std::end(unicode_tables::kRanges);
    while (lo < hi) {  // first range whose last >= cp
        const auto* mid = lo + (hi - lo) / 2;
        if (mid->last < cp) lo = mid + 1;
        else hi = mid;
    }
    return (lo != std::end(unicode_tables::kRanges) && lo->first <= cp) ? lo->cls : unicode_tables::kOther;
}

struct BmpClasses {
    CharClass cls[0x10000];
    BmpClasses() {
        std::fill(std::begin(cls), std::end(cls), unicode_tables::kOther);
        for (const auto& r : unicode_tables::kRanges)
            for (uint32_t cp = r.first; cp <= r.last && cp < 0x10000; ++cp) cls[cp] = r.cls;
    }
};
const BmpClasses kBmp;

inline CharClass class_of_code_point(uint32_t cp) { return cp < 0x10000 ? kBmp.cls[cp] : search_ranges(cp); }

struct Char {
    CharClass cls;
    size_t len;
};

// The character at s[i]; an invalid UTF-8 byte is a one-byte character of class "other".
inline Char char_at(const unsigned char* s, size_t n, size_t i) {
    if (s[i] < 0x80) return {kBmp.cls[s[i]], 1};
    uint32_t cp;
    int len = decode_utf8(s, n, i, cp);
    if (len == 0) return {kOther, 1};
    return {class_of_code_point(cp), static_cast<size_t>(len)};
}

// End of the run of characters from s[i] whose coarse class is `cls` (marks are "other").
inline size_t run_end(const unsigned char* s, size_t n, size_t i, CharClass cls) {
    while (i < n) {
        Char c = char_at(s, n, i);
        if (coarse(c.cls) != cls) break;
        i += c.len;
    }
    return i;
}

// Sets of fine classes, as bit masks over CharClass values.
constexpr uint32_t bit(CharClass c) { return uint32_t(1) << c; }
constexpr uint32_t kTekkenUpper =  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
    bit(unicode_tables::kUpper) | bit(unicode_tables::kTitle) | bit(unicode_tables::kModifier) |
    bit(unicode_tables::kOtherLetter) | bit(kMark);
constexpr uint32_t kTekkenLower =  // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
    bit(unicode_tables::kLower) | bit(unicode_tables::kModifier) | bit(unicode_tables::kOtherLetter) | bit(kMark);
inline bool in_set(uint32_t set, CharClass c) { return (set >> c) & 1; }

inline size_t set_run_end(const unsigned char* s, size_t n, size_t i, uint32_t set) {
    while (i < n) {
        Char c = char_at(s, n, i);
        if (!in_set(set, c.cls)) break;
        i += c.len;
    }
    return i;
}

inline bool is_line_break(unsigned char b) { return b == '\r' || b == '\n'; }

// ---- the pre-tokenizer scanners ---------------------------------------------------------------------------
// Each returns the end of the pre-token piece starting at s[i] (i < n), trying its pattern's alternatives in order
// as a backtracking regex engine does (the first alternative that matches wins; each quantifier greedy, giving
// back only what the rest of its alternative needs).

// \s+(?!\S)|\s+ from the white-space character at s[i]: the lookahead gives back the run's last character to the
// following non-space piece; a single space character followed by non-space falls through to \s+ and stands
// alone. With `line_breaks`, \s*[\r\n]+ is tried first: the run up to its last CR or LF.
size_t space_piece_end(const unsigned char* s, size_t n, size_t i, bool line_breaks) {
    size_t last = i, j = i, after_break = 0;
    while (j < n) {
        Char d = char_at(s, n, j);
        if (coarse(d.cls) != kSpace) break;
        if (is_line_break(s[j])) after_break = j + 1;
        last = j;
        j += d.len;
    }
    if (line_breaks && after_break) return after_break;
    return (j == n || last == i) ? j : last;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_piece_end(const unsigned char* s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            unsigned char b = s[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    Char c = char_at(s, n, i);
    if (coarse(c.cls) != kSpace) return run_end(s, n, i + c.len, coarse(c.cls));
    if (s[i] == ' ' && i + 1 < n) {  // the optional leading space of the three run alternatives
        Char d = char_at(s, n, i + 1);
        if (coarse(d.cls) != kSpace) return run_end(s, n, i + 1 + d.len, coarse(d.cls));
    }
    return space_piece_end(s, n, i, false);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at the apostrophe s[i]: its end, or 0. Case folding also matches U+017F (long s,
// whose simple case folding is 's') for s.
size_t contraction_end_ignoring_case(const unsigned char* s, size_t n, size_t i) {
    auto lower = [&](size_t k) -> int { return k >= n ? -1 : (s[k] >= 'A' && s[k] <= 'Z') ? s[k] + 32 : s[k]; };
    const int a = lower(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (a == 0xC5 && lower(i + 2) == 0xBF) return i + 3;  // U+017F
    const int b = lower(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

// Llama 3 (max_digits 3) and Qwen 2.5 (max_digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t llama3_piece_end(const unsigned char* s, size_t n, size_t i, int max_digits) {
    if (s[i] == '\'') {
        if (size_t end = contraction_end_ignoring_case(s, n, i)) return end;
    }
    const Char c = char_at(s, n, i);
    const CharClass cls = coarse(c.cls);
    if (cls == kLetter) return run_end(s, n, i + c.len, kLetter);
    if (cls != kNumber && !is_line_break(s[i]) && i + c.len < n) {  // one character of the prefix class, then letters
        Char d = char_at(s, n, i + c.len);
        if (coarse(d.cls) == kLetter) return run_end(s, n, i + c.len + d.len, kLetter);
    }
    if (cls == kNumber) {
        size_t j = i + c.len;
        for (int k = 1; k < max_digits && j < n; ++k) {
            Char d = char_at(s, n, j);
            if (coarse(d.cls) != kNumber) break;
            j += d.len;
        }
        return j;
    }
    const bool space_then_punctuation = s[i] == ' ' && i + 1 < n && coarse(char_at(s, n, i + 1).cls) == kOther;
    if (space_then_punctuation || cls == kOther) {
        size_t j = run_end(s, n, space_then_punctuation ? i + 1 : i, kOther);
        while (j < n && is_line_break(s[j])) ++j;
        return j;
    }
    return space_piece_end(s, n, i, true);
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ at s[j]: its end, or npos. The upper run is taken
// whole; if the character after it is lower, the lower run goes on from there, else the match backtracks to end
// just after the run's last character that is also lower (Lm, Lo, M are both).
size_t tekken_upper_lower_end(const unsigned char* s, size_t n, size_t j) {
    size_t last_lower_end = std::string_view::npos;
    while (j < n) {
        Char c = char_at(s, n, j);
        if (!in_set(kTekkenUpper, c.cls)) {
            if (in_set(kTekkenLower, c.cls)) return set_run_end(s, n, j, kTekkenLower);
            break;
        }
        j += c.len;
        if (in_set(kTekkenLower, c.cls)) last_lower_end = j;
    }
    return last_lower_end;
}

// Mistral's Tekken:
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|
// \p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t tekken_piece_end(const unsigned char* s, size_t n, size_t i) {
    constexpr size_t npos = std::string_view::npos;
    const Char c = char_at(s, n, i);
    const CharClass cls = coarse(c.cls);
    const bool prefix = cls != kLetter && cls != kNumber && !is_line_break(s[i]);  // may take [^\r\n\p{L}\p{N}]?
    size_t end;
    if (prefix && (end = tekken_upper_lower_end(s, n, i + c.len)) != npos) return end;
    if ((end = tekken_upper_lower_end(s, n, i)) != npos) return end;
    // The second alternative: reached only when the upper run has no lower character in or after it, so it is
    // the upper run alone.
    if (prefix && i + c.len < n && in_set(kTekkenUpper, char_at(s, n, i + c.len).cls))
        return set_run_end(s, n, i + c.len, kTekkenUpper);
    if (in_set(kTekkenUpper, c.cls)) return set_run_end(s, n, i, kTekkenUpper);
    if (cls == kNumber) return i + c.len;
    const bool space_then_punctuation = s[i] == ' ' && i + 1 < n && coarse(char_at(s, n, i + 1).cls) == kOther;
    if (space_then_punctuation || cls == kOther) {
        size_t j = run_end(s, n, space_then_punctuation ? i + 1 : i, kOther);
        while (j < n && (is_line_break(s[j]) || s[j] == '/')) ++j;
        return j;
    }
    return space_piece_end(s, n, i, true);
}

// Whether no piece of any pattern we implement, and no NFC composition, spans a cut between a character of class
// `before` and one of class `after` (starting with the byte `after_byte`).
bool cut_is_safe(CharClass before, CharClass after, unsigned char after_byte) {
    const CharClass b = coarse(before), a = coarse(after);
    if (b == kSpace || b == a) return false;  // white space may join what follows it; runs of one class
    if (before == kMark || after == kMark) return false;  // marks join letters (Tekken), punctuation (GPT-2), NFC
    // [^\r\n\p{L}\p{N}]?\p{L}+ takes punctuation (and an apostrophe's contraction) into the word after it;
    // punctuation's [\r\n]* the line breaks after it
    return !(b == kOther && (a == kLetter || is_line_break(after_byte)));
}

// ---- NFC (canonical decomposition, then canonical composition) -------------------------------------------

// A raw byte (not valid UTF-8) in a code point sequence: above U+10FFFF, combining class 0, composes with nothing.
constexpr uint32_t kRawByte = 0x110000;
constexpr uint32_t kHangulFirst = 0xAC00, kHangulCount = 11172, kJamoL = 0x1100, kJamoV = 0x1161, kJamoT = 0x11A7;
constexpr uint32_t kJamoVCount = 21, kJamoTCount = 28;

bool nfc_unstable(uint32_t cp) {
    if (cp < 0x300) return false;  // the first unstable code point is U+0300
    const auto* end = std::end(unicode_tables::kNfcUnstable);
    const auto* r = std::lower_bound(std::begin(unicode_tables::kNfcUnstable), end, cp,
                                     [](const unicode_tables::CodePointRange& r, uint32_t v) { return r.last < v; });
    return r != end && r->first <= cp;
}

int combining_class(uint32_t cp) {
    if (cp < 0x300 || cp >= kRawByte) return 0;
    const auto* end = std::end(unicode_tables::kCombiningClasses);
    const auto* r = std::lower_bound(std::begin(unicode_tables::kCombiningClasses), end, cp,
                                     [](const unicode_tables::CombiningRange& r, uint32_t v) { return r.last < v; });
    return r != end && r->first <= cp ? r->combining_class : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
    if (cp >= kHangulFirst && cp < kHangulFirst + kHangulCount) {
        const uint32_t index = cp - kHangulFirst;
        out.push_back(kJamoL + index / (kJamoVCount * kJamoTCount));
        out.push_back(kJamoV + index % (kJamoVCount * kJamoTCount) / kJamoTCount);
        if (index % kJamoTCount) out.push_back(kJamoT + index % kJamoTCount);
        return;
    }
    const auto* end = std::end(unicode_tables::kDecompositions);
    const auto* d = std::lower_bound(std::begin(unicode_tables::kDecompositions), end, cp,
                                     [](const unicode_tables::Decomposition& d, uint32_t v) { return d.code_point < v; });
    if (d == end || d->code_point != cp) return out.push_back(cp);
    decompose(d->first, out);
    if (d->second) decompose(d->second, out);
}

uint32_t compose(uint32_t first, uint32_t second) {  // 0: the pair does not compose
    if (first >= kJamoL && first < kJamoL + 19 && second >= kJamoV && second < kJamoV + kJamoVCount)
        return kHangulFirst + ((first - kJamoL) * kJamoVCount + (second - kJamoV)) * kJamoTCount;
    if (first >= kHangulFirst && first < kHangulFirst + kHangulCount && (first - kHangulFirst) % kJamoTCount == 0 &&
        second > kJamoT && second < kJamoT + kJamoTCount)
        return first + (second - kJamoT);
    const auto* end = std::end(unicode_tables::kCompositions);
    const auto* c = std::lower_bound(std::begin(unicode_tables::kCompositions), end, std::make_pair(first, second),
                                     [](const unicode_tables::Composition& c, std::pair<uint32_t, uint32_t> v) {
                                         return std::make_pair(c.first, c.second) < v;
                                     });
    return c != end && c->first == first && c->second == second ? c->composite : 0;
}

// Appends the NFC of `text` (a span that starts with a stable code point or at the text's start, and ends before
// one or at the text's end, so that nothing outside it composes with it).
void append_nfc(std::string_view text, std::string& out) {
    thread_local std::vector<uint32_t> cps;
    cps.clear();
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t i = 0; i < text.size();) {
        uint32_t cp;
        int len = decode_utf8(s, text.size(), i, cp);
        if (len == 0) {
            cps.push_back(kRawByte + s[i++]);
            continue;
        }
        decompose(cp, cps);
        i += len;
    }
    for (size_t i = 1; i < cps.size(); ++i) {  // canonical order: marks sorted by combining class, stably
        const int cc = combining_class(cps[i]);
        if (cc == 0) continue;
        for (size_t j = i; j > 0 && combining_class(cps[j - 1]) > cc; --j) std::swap(cps[j], cps[j - 1]);
    }
    // compose: each code point with the last starter, unless a code point of its class or 0 stands between them
    size_t kept = 0, starter = 0;
    bool have_starter = false;
    int last_class = 0;  // of the last code point kept
    for (size_t i = 0; i < cps.size(); ++i) {
        const int cc = combining_class(cps[i]);
        if (have_starter && (last_class < cc || last_class == 0)) {
            if (uint32_t composite = compose(cps[starter], cps[i])) {
                cps[starter] = composite;
                continue;
            }
        }
        if (cc == 0) starter = kept, have_starter = true;
        last_class = cc;
        cps[kept++] = cps[i];
    }
    for (size_t i = 0; i < kept; ++i) {
        if (cps[i] >= kRawByte) out.push_back(static_cast<char>(cps[i] - kRawByte));
        else append_utf8(out, cps[i]);
    }
}

// The NFC of `text` into `out`, or false when `text` is its own NFC (no code point NFC may change).
bool nfc(std::string_view text, std::string& out) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t copied = 0, last_stable = 0;
    bool changed = false;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            last_stable = i++;
            continue;
        }
        uint32_t cp;
        const int len = decode_utf8(s, n, i, cp);
        if (len == 0 || !nfc_unstable(cp)) {
            last_stable = i;
            i += len == 0 ? 1 : len;
            continue;
        }
        // an unstable code point: normalize from the last stable one before it to the next stable one after it
        size_t j = i + len;
        while (j < n) {
            const int l = decode_utf8(s, n, j, cp);
            if (l == 0 || !nfc_unstable(cp)) break;
            j += l;
        }
        if (!changed) out.clear();
        changed = true;
        const size_t from = std::max(copied, last_stable);
        out.append(text.substr(copied, from - copied));
        append_nfc(text.substr(from, j - from), out);
        copied = i = j;
    }
    if (changed) out.append(text.substr(copied));
    return changed;
}

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

void TokenDecoder::set_eot(int id) {
    if (id < 0 || id >= vocab_size()) throw_bad_token_id(id, vocab_size());
    eot_ = id;
}

void TokenDecoder::save_llmc(const std::string& path) const {
    if (eot_ < 0) throw std::runtime_error(path + ": the tokenizer has no end-of-text token to write (set one)");
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

// ---- AddedTokenMatcher -----------------------------------------------------------------------------------

void AddedTokenMatcher::add(std::string_view text, int token) {
    int node = 0;
    for (unsigned char b : text) {
        auto& children = nodes_[node].children;
        auto it = std::find_if(children.begin(), children.end(), [&](const auto& c) { return c.first == b; });
        if (it != children.end()) {
            node = it->second;
            continue;
        }
        children.emplace_back(b, static_cast<int>(nodes_.size()));
        node = static_cast<int>(nodes_.size());
        nodes_.emplace_back();
    }
    nodes_[node].token = token;
    starts_token_[static_cast<unsigned char>(text[0])] = true;
}

size_t AddedTokenMatcher::find(std::string_view text, size_t from, size_t& length, int& token) const {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t at = from; at < text.size(); ++at) {
        if (!starts_token_[s[at]]) continue;
        int node = 0;
        length = 0;
        for (size_t k = at; k < text.size(); ++k) {
            const auto& children = nodes_[node].children;
            auto it = std::find_if(children.begin(), children.end(), [&](const auto& c) { return c.first == s[k]; });
            if (it == children.end()) break;
            node = it->second;
            if (nodes_[node].token >= 0) length = k + 1 - at, token = nodes_[node].token;
        }
        if (length > 0) return at;
    }
    return std::string_view::npos;
}

// ---- Tokenizer: safe cuts --------------------------------------------------------------------------------

void Tokenizer::safe_parts(std::string_view text, size_t limit, size_t chunk, std::vector<size_t>& ends) const {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    // Added tokens that encode() matches must not be cut either: their spans (the longest is 4 KiB at most).
    std::vector<std::pair<size_t, size_t>> spans;
    if (ordinary_added_) {
        const std::string_view window = text.substr(0, std::min(n, limit + kMaxAddedTokenBytes));
        for (const AddedTokenMatcher* matcher : {&raw_matcher_, &normalized_matcher_}) {
            size_t length;
            int token;
            for (size_t at = 0; (at = matcher->find(window, at, length, token)) != std::string_view::npos; at += length)
                spans.emplace_back(at, at + length);
        }
        std::sort(spans.begin(), spans.end());
    }
    size_t next_span = 0;
    Char c = char_at(s, n, 0);
    CharClass prev = c.cls;
    size_t safe = 0, boundary = 0;
    ends.clear();
    for (size_t i = c.len; i <= limit; i += c.len) {
        c = char_at(s, n, i);
        while (next_span < spans.size() && spans[next_span].second <= i) ++next_span;
        bool in_added_token = false;
        for (size_t k = next_span; k < spans.size() && spans[k].first < i && !in_added_token; ++k)
            in_added_token = spans[k].second > i;
        if (!in_added_token && cut_is_safe(prev, c.cls, s[i])) safe = i;
        if (safe == 0 && i - (ends.empty() ? 0 : ends.back()) >= chunk) ends.push_back(i);
        boundary = i;
        prev = c.cls;
    }
    if (safe > 0) {
        ends.assign(1, safe);
    } else if (ends.empty() || ends.back() < boundary) {
        ends.push_back(boundary);
    }
}

// ---- Tokenizer: loading ----------------------------------------------------------------------------------

Tokenizer Tokenizer::load(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
    if (!S_ISDIR(st.st_mode)) return load_tokenizer_json(path);
    const std::string tokenizer_json = path + "/tokenizer.json";
    if (::stat(tokenizer_json.c_str(), &st) == 0) return load_tokenizer_json(tokenizer_json);
    return load_gpt2_files(path + "/encoder.json", path + "/vocab.bpe");
}

std::vector<int> Tokenizer::end_tokens(const std::string& folder) const {
    const std::string path = folder + "/generation_config.json";
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
        JsonValue root;
        const std::string problem = parse_json(read_whole_file(path), root);
        if (!problem.empty()) throw std::runtime_error(path + ": not JSON: " + problem);
        const JsonValue* eos = root.kind == JsonValue::kObject ? root.find("eos_token_id") : nullptr;
        std::vector<int> ids;
        if (eos && eos->kind == JsonValue::kArray)
            for (const JsonValue& item : eos->items) ids.push_back(item.natural() && item.number < vocab_size() ? static_cast<int>(item.number) : -1);
        else if (eos && eos->natural() && eos->number < vocab_size()) ids.push_back(static_cast<int>(eos->number));
        else if (eos && eos->kind != JsonValue::kNull) ids.push_back(-1);
        if (std::find(ids.begin(), ids.end(), -1) != ids.end())
            throw std::runtime_error(path + ": eos_token_id must be a token id below the vocabulary's " + std::to_string(vocab_size()) +
                                     " or a list of them");
        if (eos && eos->kind != JsonValue::kNull) return ids;
    }
    std::vector<int> ids;
    if (eot_ >= 0) ids.push_back(eot_);
    for (const char* turn_end : {"<|eot_id|>", "<|im_end|>"}) {
        const int id = added_token_id(turn_end);
        if (id >= 0 && id != eot_) ids.push_back(id);
    }
    return ids;
}

// Builds what encoding needs from the tokens' bytes (by id), the model's vocabulary and the merges.
void Tokenizer::finish_loading(std::vector<std::string> token_bytes, const ByteStringTable& model_vocab,
                               bool ignore_merges, const std::string& path) {
    for (int b = 0; b < 256; ++b) {
        const uint32_t* id = model_vocab.find(std::string(1, static_cast<char>(b)));
        if (!id) throw std::runtime_error(path + ": no token for byte " + std::to_string(b) + " (a byte-level vocabulary has all 256)");
        byte_token_[b] = static_cast<int>(*id);
    }
    // The whole-piece lookup: with ignore_merges (Llama 3) every token of the model's vocabulary is one token as
    // a piece; else only the tokens that merging their own bytes gives (the others are not reachable by the
    // merges, and a piece of their bytes merges into several tokens).
    std::vector<int> merged;
    for (int id = 0; id < static_cast<int>(token_bytes.size()); ++id) {
        const uint32_t* model_id = model_vocab.find(token_bytes[id]);
        if (!model_id || *model_id != static_cast<uint32_t>(id)) continue;
        if (!ignore_merges) {
            merged.clear();
            byte_pair_merge(token_bytes[id], merged);
            if (merged.size() != 1 || merged[0] != id) continue;
        }
        whole_pieces_.insert(token_bytes[id], static_cast<uint32_t>(id));
    }
    for (size_t k = 0; k < added_.size(); ++k) {
        (added_[k].normalized ? normalized_matcher_ : raw_matcher_).add(added_[k].text, static_cast<int>(k));
        ordinary_added_ = ordinary_added_ || !added_[k].special;
    }
    decoder_ = TokenDecoder(std::move(token_bytes), eot_);
    instance_id_ = g_next_instance_id++;
}

Tokenizer Tokenizer::load_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe) {
    Tokenizer tok;
    const std::vector<int> inverse = printable_to_byte();

    // encoder.json: one flat object of token string -> id
    JsonValue root;
    const std::string problem = parse_json(read_whole_file(encoder_json), root);
    if (!problem.empty()) throw std::runtime_error(encoder_json + ": malformed encoder.json: " + problem);
    if (root.kind != JsonValue::kObject) throw std::runtime_error(encoder_json + ": expected a JSON object of token -> id");
    const auto& entries = root.members;
    std::vector<std::string> token_bytes(entries.size());
    std::vector<bool> seen(entries.size(), false);
    for (const auto& [mapped, value] : entries) {
        const long long id = value.natural() ? static_cast<long long>(value.number) : -1;
        if (id < 0 || static_cast<size_t>(id) >= entries.size() || seen[id])
            throw std::runtime_error(encoder_json + ": token ids must be 0..N-1, each once (token \"" + mapped + "\" has " +
                                     (id < 0 ? std::string("no whole-number id") : "id " + std::to_string(id)) + ")");
        seen[id] = true;
        // The special token is spelled literally, not through the byte map.
        token_bytes[id] = mapped == kEndOfText ? mapped : unmap_token(mapped, inverse, encoder_json);
    }
    if (token_bytes.size() <= size_t(kGpt2EndOfText) || token_bytes[kGpt2EndOfText] != kEndOfText)
        throw std::runtime_error(encoder_json + ": token 50256 is not <|endoftext|>");
    ByteStringTable vocab;
    for (int id = 0; id < static_cast<int>(token_bytes.size()); ++id)
        if (id != kGpt2EndOfText) vocab.insert(token_bytes[id], static_cast<uint32_t>(id));

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
        const uint32_t* l = vocab.find(left);
        const uint32_t* r = vocab.find(right);
        const uint32_t* m = vocab.find(left + right);
        if (!l || !r || !m) throw std::runtime_error(where + ": merge uses or makes a token not in encoder.json");
        if (!tok.merges_.insert(static_cast<int>(*l), static_cast<int>(*r), {rank++, static_cast<int>(*m)}))
            throw std::runtime_error(where + ": duplicate merge");
    }
    tok.added_.push_back({kEndOfText, kGpt2EndOfText, true, false});
    tok.eot_ = kGpt2EndOfText;
    tok.finish_loading(std::move(token_bytes), vocab, false, encoder_json);
    return tok;
}

namespace {

// tokenizer.json's fields, read strictly: each accessor names the file and the field in its error.
struct JsonFile {
    const std::string& path;
    [[noreturn]] void refuse(const std::string& what) const { throw std::runtime_error(path + ": " + what); }
    const JsonValue& member(const JsonValue& object, const char* key, JsonValue::Kind kind, const std::string& where) const {
        const JsonValue* v = object.find(key);
        if (!v || v->kind != kind)
            refuse(where + key + " must be " + (kind == JsonValue::kString ? "a string" : kind == JsonValue::kArray ? "an array"
                                                : kind == JsonValue::kObject ? "an object" : kind == JsonValue::kBool ? "true or false" : "a number"));
        return *v;
    }
    bool flag(const JsonValue& object, const char* key, bool absent) const {  // a boolean member, `absent` if missing
        const JsonValue* v = object.find(key);
        if (!v || v->kind == JsonValue::kNull) return absent;
        if (v->kind != JsonValue::kBool) refuse(std::string(key) + " must be true or false");
        return v->boolean;
    }
    std::string type_of(const JsonValue& step, const std::string& where) const {
        if (step.kind != JsonValue::kObject) refuse(where + " must be an object");
        return member(step, "type", JsonValue::kString, where + ".").text;
    }
};

struct KnownPattern {
    const char* regex;
    SplitPattern pattern;
};
const KnownPattern kKnownPatterns[] = {
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", SplitPattern::kGpt2},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitPattern::kLlama3},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitPattern::kQwen2},
    {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitPattern::kTekken},
};

// The pre_tokenizer: [Digits,] ByteLevel(use_regex: true), or [Digits,] Split(a known pattern, Isolated),
// ByteLevel(use_regex: false), alone or as a Sequence.
void read_pre_tokenizer(const JsonFile& file, const JsonValue& root, SplitPattern& pattern, DigitSplit& digits) {
    const JsonValue* pre = root.find("pre_tokenizer");
    if (!pre || pre->kind == JsonValue::kNull) file.refuse("pre_tokenizer is null: not a byte-level tokenizer (we read ByteLevel BPE)");
    std::vector<const JsonValue*> steps;
    if (file.type_of(*pre, "pre_tokenizer") == "Sequence") {
        for (const JsonValue& step : file.member(*pre, "pretokenizers", JsonValue::kArray, "pre_tokenizer.").items) steps.push_back(&step);
    } else {
        steps.push_back(pre);
    }
    bool split = false, byte_level = false;
    digits = DigitSplit::kNone;
    for (size_t k = 0; k < steps.size(); ++k) {
        const JsonValue& step = *steps[k];
        const std::string where = "pre_tokenizer step " + std::to_string(k);
        const std::string type = file.type_of(step, where);
        if (byte_level) file.refuse(where + " (" + type + ") follows ByteLevel; we read ByteLevel as the last step only");
        if (type == "Digits") {
            if (k != 0) file.refuse(where + ": Digits must be the first step (we split digits before the pattern only)");
            digits = file.flag(step, "individual_digits", false) ? DigitSplit::kIndividual : DigitSplit::kRuns;
        } else if (type == "Split") {
            if (split) file.refuse(where + ": a second Split (we read one)");
            split = true;
            const JsonValue& p = file.member(step, "pattern", JsonValue::kObject, where + ".");
            const JsonValue* regex = p.find("Regex");
            if (!regex || regex->kind != JsonValue::kString)
                file.refuse(where + ": Split pattern must be {\"Regex\": ...} (a String pattern is not one we implement)");
            const KnownPattern* known = nullptr;
            for (const KnownPattern& kp : kKnownPatterns)
                if (regex->text == kp.regex) known = &kp;
            if (!known)
                file.refuse("pre_tokenizer pattern '" + regex->text.substr(0, 200) +
                            "' is not one we implement (GPT-2, Llama 3, Qwen 2.5, Mistral Tekken)");
            pattern = known->pattern;
            const std::string behavior = file.member(step, "behavior", JsonValue::kString, where + ".").text;
            if (behavior != "Isolated") file.refuse(where + ": Split behavior '" + behavior + "' (we implement Isolated)");
            if (file.flag(step, "invert", false)) file.refuse(where + ": Split invert true (we implement false)");
        } else if (type == "ByteLevel") {
            byte_level = true;
            if (file.flag(step, "add_prefix_space", false)) file.refuse(where + ": ByteLevel add_prefix_space true is not supported (false)");
            const bool regex = file.flag(step, "use_regex", true);
            if (regex && split) file.refuse(where + ": ByteLevel use_regex true after a Split (we read use_regex false there)");
            if (!regex && !split) file.refuse(where + ": ByteLevel use_regex false without a Split: nothing splits the text");
            if (regex) pattern = SplitPattern::kGpt2;
        } else {
            file.refuse("pre_tokenizer '" + type + "' is not one we implement (ByteLevel, Split, Digits, Sequence)");
        }
    }
    if (!byte_level) file.refuse("pre_tokenizer has no ByteLevel step: not a byte-level tokenizer (we read ByteLevel BPE)");
}

// The normalizer: none, or NFC (Qwen 2.5). One that changes text otherwise is refused.
bool read_nfc_normalizer(const JsonFile& file, const JsonValue& root) {
    const JsonValue* normalizer = root.find("normalizer");
    if (!normalizer || normalizer->kind == JsonValue::kNull) return false;
    const std::string type = file.type_of(*normalizer, "normalizer");
    if (type == "NFC") return true;
    if (type == "Sequence") {
        const auto& items = file.member(*normalizer, "normalizers", JsonValue::kArray, "normalizer.").items;
        if (items.empty()) return false;
        if (items.size() == 1 && file.type_of(items[0], "normalizer step 0") == "NFC") return true;
    }
    file.refuse("normalizer '" + type + "' is not one we implement (none or NFC)");
}

// The added tokens before and after the text in the post_processor's TemplateProcessing, if any.
void read_template_tokens(const JsonValue& root, std::string& before, std::string& after) {
    const JsonValue* post = root.find("post_processor");
    if (!post || post->kind != JsonValue::kObject) return;
    std::vector<const JsonValue*> processors{post};
    const JsonValue* type = post->find("type");
    const JsonValue* list = post->find("processors");
    if (type && type->kind == JsonValue::kString && type->text == "Sequence" && list && list->kind == JsonValue::kArray)
        for (const JsonValue& p : list->items) processors.push_back(&p);
    for (const JsonValue* p : processors) {
        const JsonValue* t = p->find("type");
        const JsonValue* single = p->find("single");
        if (!t || t->kind != JsonValue::kString || t->text != "TemplateProcessing" || !single || single->kind != JsonValue::kArray)
            continue;
        bool text_seen = false;
        for (const JsonValue& item : single->items) {
            if (item.find("Sequence")) text_seen = true;
            const JsonValue* special = item.find("SpecialToken");
            const JsonValue* id = special ? special->find("id") : nullptr;
            if (id && id->kind == JsonValue::kString) (text_seen ? after : before) = id->text;
        }
    }
}

}  // namespace

Tokenizer Tokenizer::load_tokenizer_json(const std::string& path) {
    const JsonFile file{path};
    JsonValue root;
    const std::string problem = parse_json(read_whole_file(path), root);
    if (!problem.empty()) file.refuse("not JSON: " + problem);
    if (root.kind != JsonValue::kObject) file.refuse("expected a JSON object");
    Tokenizer tok;

    const JsonValue& model = file.member(root, "model", JsonValue::kObject, "");
    const JsonValue* model_type = model.find("type");
    if (!model_type || model_type->kind != JsonValue::kString || model_type->text != "BPE")
        file.refuse("model type '" + (model_type && model_type->kind == JsonValue::kString ? model_type->text : std::string("?")) +
                    "' is not one we implement (BPE)");
    if (file.flag(model, "byte_fallback", false)) file.refuse("model.byte_fallback true: a sentencepiece-style BPE, not byte-level");
    for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
        const JsonValue* v = model.find(key);
        if (v && v->kind != JsonValue::kNull && !(v->kind == JsonValue::kString && v->text.empty()))
            file.refuse(std::string("model.") + key + " must be null (we implement plain byte-level BPE)");
    }
    const bool ignore_merges = file.flag(model, "ignore_merges", false);
    tok.nfc_ = read_nfc_normalizer(file, root);
    read_pre_tokenizer(file, root, tok.pattern_, tok.digits_);
    if (const JsonValue* decoder = root.find("decoder"); decoder && decoder->kind != JsonValue::kNull) {
        const std::string type = file.type_of(*decoder, "decoder");
        if (type != "ByteLevel") file.refuse("decoder '" + type + "' is not one we implement (ByteLevel)");
    }

    // The model's vocabulary: byte-level spelled token -> id.
    const std::vector<int> inverse = printable_to_byte();
    const auto& vocab_members = file.member(model, "vocab", JsonValue::kObject, "model.").members;
    std::vector<std::string> token_bytes;
    std::vector<const std::string*> spelling;  // by id: the vocabulary's key, or the added token's text
    ByteStringTable vocab;
    auto claim = [&](double number, const std::string* spelled, const std::string& what) -> size_t {
        if (!(number >= 0 && number < (1 << 24) && number == std::floor(number)))
            file.refuse(what + " has id " + std::to_string(number) + " (expected an integer in 0..2^24)");
        const size_t id = static_cast<size_t>(number);
        if (id >= spelling.size()) spelling.resize(id + 1, nullptr), token_bytes.resize(id + 1);
        if (spelling[id] && *spelling[id] != *spelled)
            file.refuse(what + " has id " + std::to_string(id) + ", which is also '" + *spelling[id] + "'");
        spelling[id] = spelled;
        return id;
    };
    for (const auto& [key, value] : vocab_members) {
        if (value.kind != JsonValue::kNumber) file.refuse("model.vocab['" + key + "'] must be a number");
        const size_t id = claim(value.number, &key, "model.vocab token '" + key + "'");
        token_bytes[id] = unmap_token(key, inverse, path + ": model.vocab");
        if (vocab.find(token_bytes[id])) file.refuse("model.vocab token '" + key + "' is spelled twice");
        vocab.insert(token_bytes[id], static_cast<uint32_t>(id));
    }

    // Merges: "a b" strings or ["a", "b"] pairs, in rank order.
    const auto& merges = file.member(model, "merges", JsonValue::kArray, "model.").items;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const JsonValue& m = merges[rank];
        std::string_view left, right;
        if (m.kind == JsonValue::kString && std::count(m.text.begin(), m.text.end(), ' ') == 1) {
            const size_t space = m.text.find(' ');
            left = std::string_view(m.text).substr(0, space);
            right = std::string_view(m.text).substr(space + 1);
        } else if (m.kind == JsonValue::kArray && m.items.size() == 2 && m.items[0].kind == JsonValue::kString &&
                   m.items[1].kind == JsonValue::kString) {
            left = m.items[0].text;
            right = m.items[1].text;
        } else {
            file.refuse("model.merges[" + std::to_string(rank) + "] must be \"a b\" or [\"a\", \"b\"]");
        }
        const std::string where = path + ": model.merges[" + std::to_string(rank) + "]";
        const std::string left_bytes = unmap_token(left, inverse, where), right_bytes = unmap_token(right, inverse, where);
        const uint32_t* l = vocab.find(left_bytes);
        const uint32_t* r = vocab.find(right_bytes);
        const uint32_t* merged = vocab.find(left_bytes + right_bytes);
        if (!l || !r || !merged) throw std::runtime_error(where + ": merge uses or makes a token not in model.vocab");
        if (!tok.merges_.insert(static_cast<int>(*l), static_cast<int>(*r), {static_cast<int>(rank), static_cast<int>(*merged)}))
            throw std::runtime_error(where + ": duplicate merge");
    }

    // Added tokens: matched in the text before the pre-tokenizer, decoded as their text.
    const JsonValue* added = root.find("added_tokens");
    if (added && added->kind != JsonValue::kNull) {
        if (added->kind != JsonValue::kArray) file.refuse("added_tokens must be an array");
        for (size_t k = 0; k < added->items.size(); ++k) {
            const JsonValue& t = added->items[k];
            const std::string where = "added_tokens[" + std::to_string(k) + "]";
            if (t.kind != JsonValue::kObject) file.refuse(where + " must be an object");
            const std::string& text = file.member(t, "content", JsonValue::kString, where + ".").text;
            if (text.empty() || text.size() > kMaxAddedTokenBytes)
                file.refuse(where + ": content of " + std::to_string(text.size()) + " bytes (expected 1.." + std::to_string(kMaxAddedTokenBytes) + ")");
            for (const char* key : {"lstrip", "rstrip", "single_word"})
                if (file.flag(t, key, false)) file.refuse(where + " '" + text + "': " + key + " true is not supported (false)");
            const size_t id = claim(file.member(t, "id", JsonValue::kNumber, where + ".").number, &text, where + " '" + text + "'");
            token_bytes[id] = text;
            tok.added_.push_back({text, static_cast<int>(id), file.flag(t, "special", false), file.flag(t, "normalized", false)});
        }
    }
    for (size_t id = 0; id < spelling.size(); ++id)
        if (!spelling[id]) file.refuse("no token has id " + std::to_string(id) + " (ids must be 0..N-1)");
    if (tok.nfc_) {  // normalized added tokens are matched in the normalized text, as the normalizer writes them
        for (AddedToken& t : tok.added_) {
            std::string normalized;
            if (t.normalized && nfc(t.text, normalized)) t.text = normalized;
        }
    }

    std::string before, after;
    read_template_tokens(root, before, after);
    tok.bos_ = tok.added_token_id(before);
    tok.eot_ = tok.added_token_id(after);
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
        if (tok.eot_ < 0) tok.eot_ = tok.added_token_id(name);
    tok.finish_loading(std::move(token_bytes), vocab, ignore_merges, path);
    return tok;
}

int Tokenizer::added_token_id(std::string_view text) const {
    for (const AddedToken& t : added_)
        if (t.text == text) return t.id;
    return -1;
}

void Tokenizer::set_eot(const std::string& added_token_text) {
    const int id = added_token_id(added_token_text);
    if (id < 0) throw std::runtime_error("end token '" + added_token_text + "' is not an added token of this tokenizer");
    eot_ = id;
    decoder_.set_eot(id);
}

// ---- Tokenizer: encoding ---------------------------------------------------------------------------------

// Merges the piece's bytes: repeatedly the adjacent pair with the lowest merge rank, leftmost first on ties.
// A min-heap of candidate pairs over a linked list of symbols keeps long pieces (runs of spaces or
// punctuation) O(n log n); entries made stale by an earlier merge are detected and skipped when popped.
void Tokenizer::byte_pair_merge(std::string_view piece, std::vector<int>& out) const {
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

void Tokenizer::encode_piece(std::string_view piece, std::vector<int>& out) const {
    // Whole-piece lookup first, as tiktoken does: most words are one token.
    if (const uint32_t* id = whole_pieces_.find(piece)) {
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

// Calls piece(begin, end) for each pre-token piece of `text` (no added token in it, normalized), in order.
template <typename Piece>
void Tokenizer::for_each_piece(std::string_view text, const Piece& piece) const {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
        size_t segment_end = n;  // a Digits step's pieces: the pattern sees each as a text of its own
        if (digits_ != DigitSplit::kNone) {
            const Char c = char_at(s, n, i);
            const bool number = coarse(c.cls) == kNumber;
            if (number && digits_ == DigitSplit::kIndividual) {
                segment_end = i + c.len;
            } else {
                for (segment_end = i + c.len; segment_end < n;) {
                    const Char d = char_at(s, n, segment_end);
                    if ((coarse(d.cls) == kNumber) != number) break;
                    segment_end += d.len;
                }
            }
        }
        while (i < segment_end) {
            size_t j = segment_end;
            switch (pattern_) {
                case SplitPattern::kGpt2: j = gpt2_piece_end(s, segment_end, i); break;
                case SplitPattern::kLlama3: j = llama3_piece_end(s, segment_end, i, 3); break;
                case SplitPattern::kQwen2: j = llama3_piece_end(s, segment_end, i, 1); break;
                case SplitPattern::kTekken: j = tekken_piece_end(s, segment_end, i); break;
            }
            piece(i, j);
            i = j;
        }
    }
}

void Tokenizer::encode_pieces(std::string_view text, std::vector<int>& out) const {
    for_each_piece(text, [&](size_t begin, size_t end) { encode_piece(text.substr(begin, end - begin), out); });
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
    std::string normalized;
    if (nfc_ && nfc(text, normalized)) text = normalized;
    std::vector<std::string> pieces;
    for_each_piece(text, [&](size_t begin, size_t end) { pieces.emplace_back(text.substr(begin, end - begin)); });
    return pieces;
}

namespace {

// Finds the added tokens of `matcher` in `text` and encodes the text between them with `between`; a special
// token's match is passed over unless `match_special` (its text is then ordinary text, and no other token is
// looked for inside it, as the `tokenizers` library does).
template <typename Between>
void split_at_added_tokens(std::string_view text, const AddedTokenMatcher& matcher,
                           const std::vector<Tokenizer::AddedToken>& added, bool match_special, std::vector<int>& out,
                           const Between& between) {
    size_t done = 0, search = 0, length;
    int token;
    for (size_t at; (at = matcher.find(text, search, length, token)) != std::string_view::npos;) {
        search = at + length;
        if (!match_special && added[token].special) continue;
        between(text.substr(done, at - done));
        out.push_back(added[token].id);
        done = search;
    }
    between(text.substr(done));
}

}  // namespace

void Tokenizer::encode_added(std::string_view text, bool match_special, std::vector<int>& out) const {
    if (raw_matcher_.empty() || !(match_special || ordinary_added_)) return encode_normalized(text, match_special, out);
    split_at_added_tokens(text, raw_matcher_, added_, match_special, out,
                          [&](std::string_view between) { encode_normalized(between, match_special, out); });
}

void Tokenizer::encode_normalized(std::string_view text, bool match_special, std::vector<int>& out) const {
    thread_local std::string normalized;
    if (text.empty()) return;
    if (nfc_ && nfc(text, normalized)) text = normalized;
    if (normalized_matcher_.empty() || !(match_special || ordinary_added_)) return encode_pieces(text, out);
    split_at_added_tokens(text, normalized_matcher_, added_, match_special, out,
                          [&](std::string_view between) { encode_pieces(between, out); });
}

void Tokenizer::encode_append(std::string_view text, std::vector<int>& out) const { encode_added(text, false, out); }

std::vector<int> Tokenizer::encode(std::string_view text) const {
    std::vector<int> out;
    out.reserve(text.size() / 4);
    encode_added(text, false, out);
    return out;
}

std::vector<int> Tokenizer::encode_with_special(std::string_view text) const {
    std::vector<int> out;
    out.reserve(text.size() / 4);
    encode_added(text, true, out);
    return out;
}
