#!/usr/bin/env python3
"""Write test/fixtures/tokenizer_cases.txt: expected GPT-2 token ids for an edge-case suite and checksums of
two corpora, read by test/test_tokenizer.cpp.

Two ways to compute the expected ids:

  --reference tiktoken  (default; needs `pip install tiktoken`, which brings the `regex` module)
      The encoding is built from the local data/gpt2 files, never downloaded:
      tiktoken.Encoding(name="gpt2-local", pat_str=GPT-2's pattern, mergeable_ranks=<encoder.json with
      GPT-2's byte->character map undone>, special_tokens={"<|endoftext|>": 50256}).
  --reference python
      A pure-Python reference written independently of the C++ scanner: Python's `re` engine runs GPT-2's
      pattern with \\p{L}, \\p{N} and \\s spelled out as explicit character classes built from `unicodedata`
      (`re` has no \\p{..}, and its \\s is str.isspace(), which is not Unicode's White_Space), and the merge
      loop is tiktoken's rule (merge the adjacent pair whose concatenation has the lowest rank) rather than
      the C++ code's vocab.bpe pair table, so the two cross-check each other. Its Unicode version is the
      running Python's; the suite avoids characters whose class changed after Unicode 14.0 (Python 3.11).
      It needs only the standard library, so it regenerates the fixture where tiktoken is not installed.
The fixture's second line names the reference that wrote it.

Invalid UTF-8. tiktoken encodes only valid text (its private _encode_bytes handles a bad tail
approximately). Our rule, in both the C++ tokenizer and here: every byte that is not part of a well-formed
UTF-8 sequence is one character that is neither letter, number nor white space. Python's "surrogateescape"
error handler implements exactly that split (each such byte becomes one lone surrogate, category Cs), so
such cases are split by the regex on the escaped string, mapped back to bytes, and each piece is merged
with tiktoken's own single-piece BPE (tiktoken mode) or the reference BPE (python mode).

Output format (UTF-8 text, tab-separated, '#' lines are comments):
  case    NAME  MODE  HEX_INPUT_BYTES  SPACE_SEPARATED_IDS
  corpus  PATH  MODE  COUNT  SUM  FIRST_50_IDS  LAST_50_IDS
MODE is "ordinary" (encode_ordinary) or "special" (the literal <|endoftext|> is token 50256). A corpus PATH
is "repo:<path from the repository root>" or "shared:<path under the shared data folder>"; .xz files are
decompressed first.

Usage: python3 test/tools/make_tokenizer_fixtures.py [--reference tiktoken|python] [--gpt2-dir DIR]
           [--shared-data DIR] [--out FILE]
"""
import argparse
import json
import lzma
import os
import re
import sys
import unicodedata

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT_TEXT = "<|endoftext|>"
EOT = 50256

CORPORA = [
    ("repo:data/tinyshakespeare/input.txt", "ordinary"),
    ("shared:gutenberg/val.txt.xz", "special"),
]


def case_suite():
    """(name, mode, input bytes). Names are unique and contain no tabs."""
    s = lambda text: text.encode("utf-8")  # noqa: E731
    cases = [
        ("empty", "ordinary", b""),
        # White space: runs, the \s+(?!\S) backtracking, tabs, newlines, trailing spaces, non-ASCII spaces.
        ("one_space", "ordinary", s(" ")),
        ("two_spaces", "ordinary", s("  ")),
        ("tab", "ordinary", s("\t")),
        ("newline", "ordinary", s("\n")),
        ("blank_line", "ordinary", s("\n\n")),
        ("crlf_lines", "ordinary", s("line1\r\nline2\r\n")),
        ("double_space_between", "ordinary", s("a  b")),
        ("triple_space_between", "ordinary", s("a   b")),
        ("space_newline_space", "ordinary", s("a \n b")),
        ("trailing_spaces", "ordinary", s("hello world   ")),
        ("leading_spaces", "ordinary", s("   leading")),
        ("indented_code", "ordinary", s("def f(x):\n    return x  # comment\n\treturn\n")),
        ("tabs_between", "ordinary", s("tabs\t\tbetween\t")),
        ("mixed_space_tab", "ordinary", s(" \t \t x")),
        ("newline_then_word", "ordinary", s("\nword\n\n  word")),
        ("space_run_100", "ordinary", s(" " * 100)),
        ("space_run_then_word", "ordinary", s(" " * 17 + "x")),
        ("newline_run", "ordinary", s("\n" * 10 + "end")),
        ("nbsp", "ordinary", s("x\u00a0y \u00a0z")),
        ("ideographic_space", "ordinary", s("a\u3000b\u3000\u3000c")),
        ("vt_ff", "ordinary", s("a\x0bb\x0cc")),
        ("nel_linesep", "ordinary", s("a\u0085b\u2028c\u2029d")),
        ("en_em_spaces", "ordinary", s("a\u2002b\u2003 c\u205fd")),
        ("info_separators_not_space", "ordinary", s("a\x1cb\x1d\x1e\x1fc")),
        ("zero_width_not_space", "ordinary", s("a\u200bb\ufeffc\u180ed")),
        # White space before words, digits and quotes: tabs, newlines, CR and CRLF, mixed runs, blank lines before
        # tab-indented lines.
        ("tab_word", "ordinary", s("\tword")),
        ("newline_word", "ordinary", s("\nword")),
        ("crlf_word", "ordinary", s("\r\nword")),
        ("two_spaces_word", "ordinary", s("  word")),
        ("space_tab_word", "ordinary", s(" \tword")),
        ("tab_space_word", "ordinary", s("\t word")),
        ("newline_spaces_word", "ordinary", s("\n   word")),
        ("spaces_newline_word", "ordinary", s("   \nword")),
        ("mixed_runs_before_words", "ordinary", s("a \t\n word\t\t \nnext\r\n \tlast")),
        ("mixed_runs_before_digits", "ordinary", s("x\t42 \t7\n\n 3.14\r\n\t\t 2024 \u00a0\t5")),
        ("blank_line_then_tab_indent", "ordinary", s("{\n\tint x;\n\n\treturn x;\n}\n")),
        ("blank_crlf_line_then_tab_indent", "ordinary", s("a\r\n\r\n\tb\r\n")),
        ("tab_indented_quotes", "ordinary", s("{\n\t'size': 1,\n\t'type': 't',\n\t\"dim\": 2\n}")),
        ("cr_lines_quote", "ordinary", s("He said:\r'stop here'\rthen\r\rleft")),
        ("mixed_line_endings", "ordinary", s("a\n\n\r\nb\r\r\nc")),
        ("nbsp_tab_word", "ordinary", s("x \u00a0\tword\u00a0\u00a0\tend")),
        ("whitespace_run_end", "ordinary", s("end \t\n\r\n\t ")),
        ("newline_then_contraction", "ordinary", s("said\n'tis true,\n'twas so\r\n'sblood")),
        # Contractions: only lowercase ones are special; uppercase 'S falls to the punctuation rule.
        ("contraction_t", "ordinary", s("don't")),
        ("contractions_all", "ordinary", s("I'm you're we've they'll he'd it's")),
        ("contractions_upper", "ordinary", s("IT'S DON'T I'M YOU'RE WE'VE THEY'LL HE'D")),
        ("contraction_bare", "ordinary", s("'s 'S 're 'RE 'll 'd")),
        ("contraction_prefix", "ordinary", s("'sa 'tis 'rearm")),
        ("double_apostrophe", "ordinary", s("''s x''t")),
        ("apostrophes_names", "ordinary", s("rock 'n' roll, O'Neil's students' books")),
        ("apostrophe_after_punct", "ordinary", s("!'s ?'re")),
        # Numbers.
        ("digits", "ordinary", s("123")),
        ("digit_run", "ordinary", s("12345678901234567890")),
        ("year", "ordinary", s("in 2024, 1,000,000 and 3.14159")),
        ("alnum_mix", "ordinary", s("x1y2z3 A4")),
        ("arabic_indic_digits", "ordinary", s("\u0663\u0664\u0665 \u0661")),
        ("fullwidth_digits", "ordinary", s("\uff11\uff12\uff13")),
        ("roman_numeral_nl", "ordinary", s("\u216b \u2167")),
        ("fractions_superscripts_no", "ordinary", s("\u00bd x\u00b2 \u2460")),
        ("money", "ordinary", s("$100.00 and \u20ac5")),
        # Latin with diacritics, precomposed and combining.
        ("accented_latin", "ordinary", s("caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m")),
        ("accented_upper", "ordinary", s("\u00c9COLE \u00dcBER")),
        ("eszett_ligature", "ordinary", s("stra\u00dfe \ufb01le")),
        ("czech", "ordinary", s("Dvo\u0159\u00e1k")),
        ("combining_acute", "ordinary", s("cafe\u0301 ok")),
        ("combining_tilde", "ordinary", s("n\u0303o e\u0301\u0301")),
        ("titlecase_modifier", "ordinary", s("\u01c5 \u02b0 \u3005")),
        # Other scripts.
        ("japanese", "ordinary", s("\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8")),
        ("chinese", "ordinary", s("\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff0c\u597d\u3002")),
        ("korean", "ordinary", s("\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8")),
        ("cjk_latin_mix", "ordinary", s("GPT\u6a21\u578b 2\u4ee3")),
        ("arabic", "ordinary", s("\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645")),
        ("hebrew", "ordinary", s("\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd")),
        ("devanagari_marks", "ordinary",
         s("\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e")),
        ("thai_marks", "ordinary", s("\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35")),
        ("cyrillic", "ordinary", s("\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!")),
        ("greek", "ordinary", s("\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5")),
        ("math_alphanumerics", "ordinary", s("\U0001d400\U0001d41b \U0001d7d8 \u2115")),
        # Emoji and symbols (all "other"): sequences, ZWJ families, flags, modifiers, keycaps.
        ("emoji", "ordinary", s("\U0001f600")),
        ("emoji_run", "ordinary", s("hi \U0001f600\U0001f600!")),
        ("emoji_zwj_family", "ordinary", s("\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466")),
        ("emoji_flag", "ordinary", s("\U0001f1fa\U0001f1f8 \U0001f1ef\U0001f1f5")),
        ("emoji_skin_tone", "ordinary", s("\U0001f44d\U0001f3fd ok")),
        ("emoji_keycap", "ordinary", s("1\ufe0f\u20e3 \u2764\ufe0f")),
        # Punctuation and code-like text.
        ("hello_world", "ordinary", s("Hello, world!")),
        ("ellipsis_runs", "ordinary", s("... ?!?! ---")),
        ("brackets", "ordinary", s("(a)[b]{c} <d>")),
        ("quotes", "ordinary", s("\"quoted\" \u201csmart\u201d \u2018single\u2019 \u2014 em \u2013 en")),
        ("c_code", "ordinary", s("if (a != b) { c++; }\n")),
        ("url_email", "ordinary", s("http://example.com/path?q=1&r=2 user@example.com #tag @who")),
        ("equals_line", "ordinary", s("=" * 80 + "\n")),
        ("letter_run", "ordinary", s("a" * 300)),
        ("pair_run", "ordinary", s("ab" * 200)),
        ("one_run", "ordinary", s("1" * 50)),
        ("control_chars", "ordinary", s("\x00\x01\x1f\x7f")),
        ("private_use_unassigned", "ordinary", s("\ue000 \u0378 x")),
        # <|endoftext|>: text in ordinary mode, one token in special mode.
        ("eot_ordinary", "ordinary", s(EOT_TEXT)),
        ("eot_special", "special", s(EOT_TEXT)),
        ("eot_between_special", "special", s("a<|endoftext|>b")),
        ("eot_twice_special", "special", s(EOT_TEXT + EOT_TEXT)),
        ("eot_spaced_special", "special", s("hello <|endoftext|> world")),
        ("eot_spaced_ordinary", "ordinary", s("hello <|endoftext|> world")),
        ("eot_partial_special", "special", s("<|endoftext| <|endoftext")),
        ("eot_newlines_special", "special", s("end.\n<|endoftext|>\nStart")),
        # Invalid UTF-8: each bad byte is an "other" character (see the module docstring).
        ("invalid_ff", "ordinary", b"\xff"),
        ("invalid_lone_continuation", "ordinary", b"\x80abc"),
        ("invalid_truncated_end", "ordinary", b"abc\xc3"),
        ("invalid_bad_continuation", "ordinary", b"\xc3\x28"),
        ("invalid_truncated_3byte", "ordinary", b"\xe2\x82"),
        ("valid_euro_sign", "ordinary", b"\xe2\x82\xac"),
        ("invalid_surrogate", "ordinary", b"\xed\xa0\x80"),
        ("invalid_overlong", "ordinary", b"\xc0\xaf \xe0\x80\xaf"),
        ("invalid_above_max", "ordinary", b"\xf4\x90\x80\x80"),
        ("invalid_in_words", "ordinary", b"hello \xff world"),
        ("invalid_after_space", "ordinary", b" \xff\xfe"),
        ("invalid_truncated_emoji", "ordinary", b"\xf0\x9f\x98 x"),
        ("invalid_inside_word", "ordinary", b"a\xe2\x82b"),
        ("invalid_cp1252_apostrophe", "ordinary", b"don\x92t"),
        ("invalid_latin1_word", "ordinary", b"\xe9t\xe9 caf\xe9"),
        ("invalid_lead_then_valid", "ordinary", b"\xf0\xe2\x82\xac"),
        ("invalid_with_punct", "ordinary", b"!\xff? \x80."),
        ("invalid_apostrophe", "ordinary", b"'\xffs"),
    ]
    names = [c[0] for c in cases]
    assert len(set(names)) == len(names), "duplicate case names"
    return cases


# ---- vocabulary ---------------------------------------------------------------------------------------

def gpt2_printable_to_byte():
    """Inverse of GPT-2's bytes_to_unicode: printable character -> raw byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) +
                 list(range(0xAE, 0xFF + 1)))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + extra)] = b
            extra += 1
    return mapping


def load_mergeable_ranks(gpt2_dir):
    """bytes -> rank (= token id) for every token except <|endoftext|>."""
    with open(os.path.join(gpt2_dir, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    inverse = gpt2_printable_to_byte()
    ranks = {bytes(inverse[ch] for ch in token): rank for token, rank in encoder.items() if token != EOT_TEXT}
    assert encoder[EOT_TEXT] == EOT and len(ranks) == EOT
    return ranks


# ---- the pure-Python reference ---------------------------------------------------------------------------

def class_ranges():
    """(letters, numbers, spaces) as lists of inclusive code-point ranges, from unicodedata."""
    out = {"L": [], "N": [], "S": []}
    start, cur = 0, None
    for cp in range(0x110001):
        cls = None
        if cp < 0x110000:
            cat = unicodedata.category(chr(cp))
            if cat in ("Zs", "Zl", "Zp") or 0x09 <= cp <= 0x0D or cp == 0x85:
                cls = "S"  # Unicode White_Space (see scripts/data/gen_unicode_tables.py)
            elif cat[0] in "LN":
                cls = cat[0]
        if cls != cur:
            if cur:
                out[cur].append((start, cp - 1))
            start, cur = cp, cls
    return out["L"], out["N"], out["S"]


def reference_pattern():
    letters, numbers, spaces = class_ranges()
    body = lambda ranges: "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)  # noqa: E731
    L, N, S = body(letters), body(numbers), body(spaces)
    pat = (rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")
    return re.compile(pat)


class ReferenceEncoder:
    def __init__(self, ranks):
        self.ranks = ranks
        self.pattern = reference_pattern()
        self.cache = {}

    def split(self, data: bytes):
        text = data.decode("utf-8", "surrogateescape")
        return [p.encode("utf-8", "surrogateescape") for p in self.pattern.findall(text)]

    def bpe(self, piece: bytes):
        if piece in self.ranks:
            return [self.ranks[piece]]
        if piece in self.cache:
            return self.cache[piece]
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best_rank, best_i = None, -1
            for i in range(len(parts) - 1):
                rank = self.ranks.get(parts[i] + parts[i + 1])
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_i = rank, i
            if best_rank is None:
                break
            parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        ids = [self.ranks[p] for p in parts]
        self.cache[piece] = ids
        return ids

    def encode_ordinary(self, data: bytes):
        return [i for piece in self.split(data) for i in self.bpe(piece)]

    def encode_special(self, data: bytes):
        out = []
        for k, segment in enumerate(data.split(EOT_TEXT.encode())):
            if k:
                out.append(EOT)
            out += self.encode_ordinary(segment)
        return out

    def describe(self):
        return (f"--reference python, no tiktoken: GPT-2's pattern in Python's re with \\p{{L}}, \\p{{N}} and \\s "
                f"from unicodedata (Unicode {unicodedata.unidata_version}, Python {sys.version.split()[0]}), "
                "tiktoken's merge rule, local gpt2 files")


# ---- tiktoken --------------------------------------------------------------------------------------------

class TiktokenEncoder:
    def __init__(self, ranks):
        import regex  # a tiktoken dependency; used only to split invalid-UTF-8 cases
        import tiktoken
        self.tiktoken_version = getattr(tiktoken, "__version__", "unknown")
        self.enc = tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                     special_tokens={EOT_TEXT: EOT})
        self.pattern = regex.compile(GPT2_PATTERN)

    def encode_ordinary(self, data: bytes):
        try:
            return self.enc.encode_ordinary(data.decode("utf-8"))
        except UnicodeDecodeError:
            text = data.decode("utf-8", "surrogateescape")
            pieces = [p.encode("utf-8", "surrogateescape") for p in self.pattern.findall(text)]
            return [i for piece in pieces for i in self.enc._encode_single_piece(piece)]

    def encode_special(self, data: bytes):
        return self.enc.encode(data.decode("utf-8"), allowed_special={EOT_TEXT})

    def describe(self):
        return f"tiktoken {self.tiktoken_version} (local gpt2 files)"


# ---- output ----------------------------------------------------------------------------------------------

def read_corpus(path):
    if path.endswith(".xz"):
        with lzma.open(path, "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", choices=["tiktoken", "python"], default="tiktoken")
    ap.add_argument("--gpt2-dir", default=os.path.join(REPO, "data", "gpt2"))
    ap.add_argument("--shared-data", default=os.environ.get("SHARED_DATA",
                                                            os.path.join(REPO, "..", "shared", "data")))
    ap.add_argument("--out", default=os.path.join(REPO, "test", "fixtures", "tokenizer_cases.txt"))
    args = ap.parse_args()

    if args.reference == "tiktoken":  # a package that cannot be imported: one line naming it, no traceback
        for module in ("tiktoken", "regex"):  # regex comes with tiktoken
            try:
                __import__(module)
            except ImportError as e:
                why = "" if e.name == module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
                sys.exit(f"error: test/tools/make_tokenizer_fixtures.py needs {module}{why} for --reference tiktoken: "
                         f"pip install {module} (or use --reference python)")
    ranks = load_mergeable_ranks(args.gpt2_dir)
    if args.reference == "tiktoken":
        encoder = TiktokenEncoder(ranks)
    else:
        encoder = ReferenceEncoder(ranks)
    encode = {"ordinary": encoder.encode_ordinary, "special": encoder.encode_special}

    lines = [
        "# GPT-2 tokenizer fixtures, written by test/tools/make_tokenizer_fixtures.py -- do not edit.",
        f"# expected ids from: {encoder.describe()}",
        "# case NAME MODE HEX_INPUT IDS | corpus PATH MODE COUNT SUM FIRST_50 LAST_50 (tab-separated)",
    ]
    for name, mode, data in case_suite():
        ids = encode[mode](data)
        lines.append("\t".join(["case", name, mode, data.hex(), " ".join(map(str, ids))]))
    for spec, mode in CORPORA:
        where, rel = spec.split(":", 1)
        path = os.path.join(REPO if where == "repo" else args.shared_data, rel)
        if not os.path.exists(path):
            print(f"warning: {path} not found; corpus {spec} left out", file=sys.stderr)
            continue
        ids = encode[mode](read_corpus(path))
        lines.append("\t".join(["corpus", spec, mode, str(len(ids)), str(sum(ids)),
                                " ".join(map(str, ids[:50])), " ".join(map(str, ids[-50:]))]))
        print(f"{spec}: {len(ids)} tokens", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({len(case_suite())} cases)", file=sys.stderr)


if __name__ == "__main__":
    main()
