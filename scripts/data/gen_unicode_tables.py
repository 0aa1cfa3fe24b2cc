#!/usr/bin/env python3
"""Generate dataloader/unicode_tables.h: the code-point classes the pre-tokenizer scanners need, and the data of
Unicode's canonical composition (NFC, the normalizer of Qwen 2.5's tokenizer.json).

Classes. The patterns we implement (dataloader/tokenizer.h) test \\p{L} = Lu Ll Lt Lm Lo, \\p{N} = Nd Nl No, \\s
(the White_Space property), and Mistral's Tekken pattern also \\p{Lu}, \\p{Ll}, \\p{Lt}, \\p{Lm}, \\p{Lo} and
\\p{M} = Mn Mc Me apart. Each code point gets one class; the low two bits of its value are the coarse class (0 other,
1 letter, 2 number, 3 space), so a mark is "other" to the patterns built on \\p{L} alone. The table lists sorted,
merged ranges; anything not listed is other.

NFC. Canonical combining classes (ranges of non-zero classes), one-step canonical decompositions, the primary
composites (pairs that compose: decompositions of two code points that are not excluded from composition), and the
code points whose NFC quick check is not "yes" or whose combining class is not 0: a text without any of these is
its own NFC. Hangul syllables compose algorithmically and are not listed.

Sources (the Unicode version is written into the header):
  --ucd DIR   the Unicode Character Database files DIR/UnicodeData.txt, DIR/PropList.txt and
              DIR/DerivedNormalizationProps.txt, e.g. Debian's unicode-data package (/usr/share/unicode) or a
              UCD release from unicode.org.
  (default)   Python's `unicodedata` (Python 3.13 has Unicode 15.1, the version checked in). It has no
              White_Space property, so that is derived: White_Space is exactly Zs + Zl + Zp plus U+0009..U+000D
              and U+0085 (PropList.txt, stable since Unicode 6.3); composition exclusions are derived from
              NFC(c) != c.
Either way the script checks that White_Space has its 25 code points.

Usage: python3 scripts/data/gen_unicode_tables.py [--ucd DIR] [--out FILE]   (default: dataloader/unicode_tables.h)
"""
import argparse
import os
import re
import sys
import unicodedata

N_CODE_POINTS = 0x110000
# value -> name; the low two bits are the coarse class
CLASSES = {0: "kOther", 4: "kMark", 1: "kUpper", 5: "kLower", 9: "kTitle", 13: "kModifier", 17: "kOtherLetter",
           2: "kNumber", 3: "kSpace"}
BY_CATEGORY = {"Lu": 1, "Ll": 5, "Lt": 9, "Lm": 13, "Lo": 17, "Mn": 4, "Mc": 4, "Me": 4, "Nd": 2, "Nl": 2, "No": 2}
SPACE = 3
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3


class Ucd:
    def __init__(self):
        self.classes = bytearray(N_CODE_POINTS)
        self.combining = {}       # code point -> non-zero canonical combining class
        self.decomposition = {}   # code point -> tuple of its one-step canonical decomposition
        self.excluded = set()     # Full_Composition_Exclusion
        self.quick_check_not_yes = set()  # NFC_QC = N or M


def from_unicodedata():
    u = Ucd()
    for cp in range(N_CODE_POINTS):
        c = chr(cp)
        cat = unicodedata.category(c)
        if cat in ("Zs", "Zl", "Zp") or 0x09 <= cp <= 0x0D or cp == 0x85:
            u.classes[cp] = SPACE
        else:
            u.classes[cp] = BY_CATEGORY.get(cat, 0)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if unicodedata.combining(c):
            u.combining[cp] = unicodedata.combining(c)
        d = unicodedata.decomposition(c)
        if d and not d.startswith("<"):
            u.decomposition[cp] = tuple(int(x, 16) for x in d.split())
            if unicodedata.normalize("NFC", c) != c:
                u.excluded.add(cp)
        if not unicodedata.is_normalized("NFC", c):
            u.quick_check_not_yes.add(cp)
    # NFC_QC = Maybe: the second code point of a composing pair (derivable only from the pairs)
    for cp, d in u.decomposition.items():
        if len(d) == 2 and cp not in u.excluded:
            u.quick_check_not_yes.add(d[1])
    u.quick_check_not_yes.update(range(0x1161, 0x1176))  # Hangul vowels and trailing consonants compose
    u.quick_check_not_yes.update(range(0x11A8, 0x11C3))
    return u, unicodedata.unidata_version, f"Python {sys.version.split()[0]} unicodedata"


def code_points(field):
    lo, _, hi = field.strip().partition("..")
    return range(int(lo, 16), int(hi or lo, 16) + 1)


def from_ucd(ucd_dir):
    u = Ucd()
    range_start = None
    with open(os.path.join(ucd_dir, "UnicodeData.txt"), encoding="utf-8") as f:
        for line in f:
            fields = line.split(";")
            cp, name, cat = int(fields[0], 16), fields[1], fields[2]
            if name.endswith(", First>"):  # large blocks are given as a First/Last pair of lines
                range_start = cp
                continue
            first = range_start if name.endswith(", Last>") else cp
            range_start = None
            u.classes[first:cp + 1] = bytes([BY_CATEGORY.get(cat, 0)]) * (cp + 1 - first)
            if int(fields[3]):
                u.combining[cp] = int(fields[3])
            if fields[5] and not fields[5].startswith("<"):
                u.decomposition[cp] = tuple(int(x, 16) for x in fields[5].split())
    version = None
    with open(os.path.join(ucd_dir, "PropList.txt"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"# PropList-(\d+\.\d+\.\d+)\.txt", line)
            if m:
                version = m.group(1)
            data = line.split("#")[0].split(";")
            if len(data) == 2 and data[1].strip() == "White_Space":
                for cp in code_points(data[0]):
                    u.classes[cp] = SPACE
    with open(os.path.join(ucd_dir, "DerivedNormalizationProps.txt"), encoding="utf-8") as f:
        for line in f:
            data = [x.strip() for x in line.split("#")[0].split(";")]
            if len(data) == 2 and data[1] == "Full_Composition_Exclusion":
                u.excluded.update(code_points(data[0]))
            if len(data) == 3 and data[1] == "NFC_QC":
                u.quick_check_not_yes.update(code_points(data[0]))
    if version is None:
        sys.exit(f"gen_unicode_tables.py: no version line in {ucd_dir}/PropList.txt")
    return u, version, f"UCD files in {ucd_dir}"


def ranges(values, skip):
    """(first, last, value) for maximal runs of code points sharing a value other than `skip`."""
    out, start = [], 0
    for cp in range(1, N_CODE_POINTS + 1):
        if cp == N_CODE_POINTS or values[cp] != values[start]:
            if values[start] != skip:
                out.append((start, cp - 1, values[start]))
            start = cp
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ucd", help="directory holding UnicodeData.txt, PropList.txt and DerivedNormalizationProps.txt")
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "dataloader", "unicode_tables.h"))
    args = ap.parse_args()

    u, version, source = from_ucd(args.ucd) if args.ucd else from_unicodedata()
    n_space = u.classes.count(SPACE)
    assert n_space == 25, f"White_Space has {n_space} code points, expected 25"
    class_ranges = ranges(u.classes, 0)
    combining = [0] * N_CODE_POINTS
    for cp, ccc in u.combining.items():
        combining[cp] = ccc
    combining_ranges = ranges(combining, 0)
    decompositions = sorted((cp, d[0], d[1] if len(d) == 2 else 0) for cp, d in u.decomposition.items()
                            if not HANGUL_FIRST <= cp <= HANGUL_LAST)
    # primary composites: two-code-point decompositions of starters, not excluded
    compositions = sorted((d[0], d[1], cp) for cp, d in u.decomposition.items()
                          if len(d) == 2 and cp not in u.excluded and not HANGUL_FIRST <= cp <= HANGUL_LAST)
    unstable = bytearray(N_CODE_POINTS)
    for cp in u.quick_check_not_yes | set(u.combining):
        unstable[cp] = 1
    unstable_ranges = ranges(unstable, 0)

    lines = [
        "// Generated by scripts/data/gen_unicode_tables.py -- do not edit.",
        f"// Unicode {version} ({source}).",
        "// Code-point classes for the pre-tokenizer scanners (\\p{L} by case, \\p{M}, \\p{N}, \\s = White_Space;",
        "// unlisted = other; a class's low two bits are its coarse class: 0 other, 1 letter, 2 number, 3 space), and",
        "// the data of canonical composition (NFC). Ranges are sorted, disjoint and inclusive.",
        "#pragma once",
        "#include <cstdint>",
        "",
        "namespace unicode_tables {",
        "",
        "enum CharClass : uint8_t {",
        "    kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3,  // coarse classes (kLetter: the low bits of every letter)",
        "    kMark = 4, kUpper = 1, kLower = 5, kTitle = 9, kModifier = 13, kOtherLetter = 17,",
        "};",
        "constexpr CharClass coarse(CharClass c) { return static_cast<CharClass>(c & 3); }",
        "",
        "struct Range {",
        "    uint32_t first, last;",
        "    CharClass cls;",
        "};",
        "struct CombiningRange {",
        "    uint32_t first, last;",
        "    uint8_t combining_class;",
        "};",
        "struct Decomposition {",
        "    uint32_t code_point, first, second;  // second 0: a one-code-point decomposition",
        "};",
        "struct Composition {",
        "    uint32_t first, second, composite;",
        "};",
        "struct CodePointRange {",
        "    uint32_t first, last;",
        "};",
        "",
        f"inline constexpr Range kRanges[{len(class_ranges)}] = {{",
    ]
    lines += [f"    {{0x{a:04X}, 0x{b:04X}, {CLASSES[v]}}}," for a, b, v in class_ranges]
    lines += ["};", "", "// canonical combining classes other than 0",
              f"inline constexpr CombiningRange kCombiningClasses[{len(combining_ranges)}] = {{"]
    lines += [f"    {{0x{a:04X}, 0x{b:04X}, {v}}}," for a, b, v in combining_ranges]
    lines += ["};", "", "// one-step canonical decompositions (Hangul syllables excepted), by code point",
              f"inline constexpr Decomposition kDecompositions[{len(decompositions)}] = {{"]
    lines += [f"    {{0x{a:04X}, 0x{b:04X}, 0x{c:04X}}}," for a, b, c in decompositions]
    lines += ["};", "", "// pairs that compose (primary composites, Hangul syllables excepted), by (first, second)",
              f"inline constexpr Composition kCompositions[{len(compositions)}] = {{"]
    lines += [f"    {{0x{a:04X}, 0x{b:04X}, 0x{c:04X}}}," for a, b, c in compositions]
    lines += ["};", "", "// code points that NFC may change or combine with what precedes them (quick check not \"yes\", or",
              "// a non-zero combining class): a text without any is its own NFC",
              f"inline constexpr CodePointRange kNfcUnstable[{len(unstable_ranges)}] = {{"]
    lines += [f"    {{0x{a:04X}, 0x{b:04X}}}," for a, b, _ in unstable_ranges]
    lines += ["};", "", "}  // namespace unicode_tables", ""]
    with open(args.out, "w", encoding="ascii") as f:
        f.write("\n".join(lines))
    print(f"wrote {args.out}: {len(class_ranges)} class ranges, {len(decompositions)} decompositions, "
          f"{len(compositions)} compositions, Unicode {version}")


if __name__ == "__main__":
    main()
