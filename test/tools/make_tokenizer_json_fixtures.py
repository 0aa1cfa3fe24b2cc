#!/usr/bin/env python3
"""Parity fixtures for the C++ tokenizer.json reader (dataloader/tokenizer.*), made with the `tokenizers` library,
and a speed comparison with it. Where `tokenizers` is importable (the GPU machine; not this repository's CPU
machines), this trains a small byte-level BPE (vocabulary --vocab-size, default 3000) on tinyshakespeare for each
family's pre-tokenizer, normalizer and added tokens, and writes

  test/fixtures/tokenizer_json/FAMILY.json   the tokenizer, as the library saves it (each well under 300 KB)
  test/fixtures/tokenizer_json/FAMILY.txt    the library's ids for the cases and for all of tinyshakespeare

which test/test_tokenizer.cpp checks token for token (it prints SKIP for each family while they are absent).

Families: gpt2 (ByteLevel with GPT-2's regex, <|endoftext|>), llama3 (Split with Llama 3's pattern, ignore_merges,
<|begin_of_text|> <|end_of_text|> <|eot_id|> <|start_header_id|> <|end_header_id|>, a bos template), qwen2 (Qwen
2.5's pattern, the NFC normalizer, <|endoftext|> <|im_start|> <|im_end|>, and <tool_call> </tool_call> as added
tokens that are not special), smollm2 (Digits(individual_digits) then ByteLevel with GPT-2's regex), tekken
(Mistral's Tekken pattern, <unk> <s> </s> [INST] [/INST]).

Cases: the inputs of test/fixtures/tokenizer_cases.txt and the extra ones below (emoji, CJK, Devanagari, Arabic,
control characters, long digit and white-space runs, CRLF, contractions in capitals for (?i:), U+017F, NFD text
and Hangul jamo for NFC, special-token literals). Invalid UTF-8: the library takes str, so it has no answer for
bytes that are not UTF-8; such inputs are left out here (we take bytes: each invalid byte is one character of class
"other"; test_tokenizer's round trips and the fuzz harnesses cover them). MODE "ordinary" is the library with
encode_special_tokens = True (special tokens' text is text; added tokens that are not special still match),
"special" with it False; add_special_tokens=False always (no template tokens).

Format of FAMILY.txt (tab-separated; '#' lines are comments):
  case    NAME  MODE  HEX_INPUT_BYTES  SPACE_SEPARATED_IDS
  corpus  PATH  MODE  COUNT  BLOCK  HASHES
PATH is from the repository root; HASHES are, space-separated, the 64-bit FNV-1a hex of each BLOCK ids (as uint32
little-endian bytes), so a mismatch is located to a block.

--bench: the library's encode on one thread (TOKENIZERS_PARALLELISM=false) against ours on all cores
(build/test_tokenizer --bench, which `make build/test_tokenizer` builds), in MB/s, on tinyshakespeare repeated
--bench-repeat times, for each family; --bench-tokenizer FILE also times a real tokenizer.json (e.g. Llama 3's).

Usage (from anywhere; run on the machine that has `tokenizers`, then commit test/fixtures/tokenizer_json/):
  make build/test_tokenizer && python3 test/tools/make_tokenizer_json_fixtures.py --bench
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the library's single-threaded speed

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT_DIR = os.path.join(REPO, "test", "fixtures", "tokenizer_json")
CORPUS = "data/tinyshakespeare/input.txt"
BLOCK = 1024
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
TEKKEN = r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
FAMILIES = {
    "gpt2": dict(specials=["<|endoftext|>"]),
    "llama3": dict(split=LLAMA3, ignore_merges=True, bos="<|begin_of_text|>",
                   specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]),
    "qwen2": dict(split=QWEN2, nfc=True, specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                  added=["<tool_call>", "</tool_call>"]),
    "smollm2": dict(digits=True, specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    "tekken": dict(split=TEKKEN, bos="<s>", specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]),
}

EXTRA_CASES = [
    ("emoji", "Hi 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵!"),
    ("cjk", "日本語のテキスト、中文文本。한국어 텍스트"),
    ("devanagari", "नमस्ते दुनिया, यह एक परीक्षण है।"),
    ("arabic", "مرحبا بالعالم، هذا اختبار ١٢٣٤٥."),
    ("hebrew_points", "שָׁלוֹם עוֹלָם"),
    ("control_chars", "a\x00b\x01c\x07d\x1be\x7ff\x1c g\x85h"),
    ("long_digits", "1234567890" * 5 + " 3.14159265358979 1,000,000 ١٢٣٤ ²³"),
    ("long_spaces", "a" + " " * 50 + "b" + "\t" * 10 + "c" + " \n" * 8 + "   "),
    ("crlf", "line one\r\nline two\r\n\r\n  indented\r\nend\r"),
    ("contractions_caps", "I'M HE'S THEY'RE WE'VE I'D YOU'LL IT'S DON'T 'S 'LL 'Re 'vE"),
    ("contraction_long_s", "it'ſ ſtill 'ſ"),
    ("special_literals", "<|endoftext|>a<|im_start|>b<|im_end|><|begin_of_text|><|eot_id|><s>[INST]x[/INST]</s><tool_call>y</tool_call>"),
    ("special_partial", "<|endoftext| <|im_start <s <|im_end|>>"),
    ("nfd_text", "cafe\u0301 nai\u0308ve A\u030a \u212b e\u0323\u0302 \u1100\u1161\u11a8 Ko\u0308ln"),
    ("marks_alone", "\u0301abc \u0300\u0301 x\u0308\u0308"),
    ("camel_case", "HelloWorld camelCaseName XMLHttpRequest iPhone ÉCOLE élève ǅungla"),
    ("slashes", "a/b//c/\n/d http://x.org/path/ </tag>\n/"),
    ("punctuation_newlines", "end.\n\nNext!\r\n...\n\"quoted\"\n"),
    ("mixed_scripts", "Русский текст, Ελληνικά, ไทย, Tiếng Việt, ქართული"),
    ("nbsp_and_spaces", "a\u00a0b\u2009c\u3000d \u00a0 e\u202f"),
]


def read_cases():
    cases = []
    with open(os.path.join(REPO, "test", "fixtures", "tokenizer_cases.txt"), encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "case" and len(fields) == 5:
                cases.append((fields[1], fields[2], bytes.fromhex(fields[3])))
    for name, text in EXTRA_CASES:
        for mode in ("ordinary", "special"):
            cases.append((f"{name}_{mode}", mode, text.encode("utf-8")))
    return cases


def build(family, spec, vocab_size):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    if spec.get("nfc"):
        tok.normalizer = normalizers.NFC()
    steps = [pre_tokenizers.Digits(individual_digits=True)] if spec.get("digits") else []
    if spec.get("split"):
        steps += [pre_tokenizers.Split(Regex(spec["split"]), behavior="isolated", invert=False),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    else:
        steps += [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=spec["specials"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with open(os.path.join(REPO, CORPUS), encoding="utf-8") as f:
        corpus = f.read()
    extra = "\n".join(text for _, text in EXTRA_CASES)
    tok.train_from_iterator([corpus] + [extra] * 20, trainer)  # some merges of the other scripts too
    if spec.get("added"):
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec["added"]])
    bos = spec.get("bos")
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    if spec.get("ignore_merges"):  # set through the file: older versions' BPE() lacks the argument
        data = json.loads(tok.to_str())
        data["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(data))
        if not json.loads(tok.to_str())["model"].get("ignore_merges"):
            sys.exit(f"{family}: this tokenizers version drops model.ignore_merges; use tokenizers >= 0.19")
    return tok


def encode(tok, mode, text):
    if hasattr(tok, "encode_special_tokens"):
        tok.encode_special_tokens = mode == "ordinary"
    elif mode == "ordinary":
        return None
    return tok.encode(text, add_special_tokens=False).ids


def block_hash(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_fixtures(family, tok, cases, version):
    json_path = os.path.join(OUT_DIR, family + ".json")
    tok.save(json_path)
    size = os.path.getsize(json_path)
    lines = [f"# {family}: ids from tokenizers {version}, written by test/tools/make_tokenizer_json_fixtures.py -- do not edit",
             "# case NAME MODE HEX_INPUT IDS | corpus PATH MODE COUNT BLOCK HASHES (tab-separated)"]
    skipped = 0
    for name, mode, data in cases:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            lines.append(f"# {name}: not UTF-8, no reference (the library takes str)")
            continue
        ids = encode(tok, mode, text)
        if ids is None:
            skipped += 1
            continue
        lines.append(f"case\t{name}\t{mode}\t{data.hex()}\t{' '.join(map(str, ids))}")
    with open(os.path.join(REPO, CORPUS), encoding="utf-8") as f:
        corpus = f.read()
    for mode in ("ordinary", "special"):
        ids = encode(tok, mode, corpus)
        if ids is None:
            continue
        hashes = " ".join(f"{block_hash(ids[k:k + BLOCK]):x}" for k in range(0, len(ids), BLOCK))
        lines.append(f"corpus\t{CORPUS}\t{mode}\t{len(ids)}\t{BLOCK}\t{hashes}")
    with open(os.path.join(OUT_DIR, family + ".txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    note = f", {skipped} ordinary cases left out (no encode_special_tokens in this version)" if skipped else ""
    print(f"{family}: {json_path} ({size // 1024} KB){note}")
    if size > 300 * 1024:
        print(f"  warning: {family}.json is over 300 KB; pass a smaller --vocab-size", file=sys.stderr)


def bench(name, tokenizer_path, tok, text_path, text):
    start = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    library = len(text.encode("utf-8")) / (time.perf_counter() - start) / 1e6
    binary = os.path.join(REPO, "build", "test_tokenizer")
    if not os.path.exists(binary):
        sys.exit(f"{binary} is missing: make build/test_tokenizer")
    out = subprocess.run([binary, "--bench", tokenizer_path, text_path], capture_output=True, text=True, check=True).stdout
    rates = [float(line.rsplit(" ", 2)[-2]) for line in out.splitlines() if line.endswith("MB/s")]
    ours_one, ours_all = rates[-2], rates[-1]
    print(f"bench {name}: tokenizers 1 thread {library:.1f} MB/s ({len(ids)} tokens); ours 1 thread {ours_one:.1f} MB/s, "
          f"all cores {ours_all:.1f} MB/s = {ours_all / library:.1f}x the library")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--vocab-size", type=int, default=3000)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--bench-repeat", type=int, default=10)
    ap.add_argument("--bench-tokenizer", help="a real tokenizer.json to time as well")
    args = ap.parse_args()
    try:
        import tokenizers
    except ImportError:
        sys.exit("make_tokenizer_json_fixtures.py: the tokenizers library is not installed here (pip install tokenizers); "
                 "run this where it is, e.g. the GPU machine")
    os.makedirs(OUT_DIR, exist_ok=True)
    cases = read_cases()
    built = {}
    for family in args.families.split(","):
        built[family] = build(family, FAMILIES[family], args.vocab_size)
        write_fixtures(family, built[family], cases, tokenizers.__version__)
    if args.bench:
        with open(os.path.join(REPO, CORPUS), encoding="utf-8") as f:
            text = f.read() * args.bench_repeat
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
            f.write(text)
        try:
            for family, tok in built.items():
                tok.encode_special_tokens = False
                bench(family, os.path.join(OUT_DIR, family + ".json"), tok, f.name, text)
            if args.bench_tokenizer:
                real = tokenizers.Tokenizer.from_file(args.bench_tokenizer)
                bench(args.bench_tokenizer, args.bench_tokenizer, real, f.name, text)
        finally:
            os.unlink(f.name)


if __name__ == "__main__":
    main()
