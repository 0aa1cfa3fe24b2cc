#!/usr/bin/env python3
"""Convert GPT-2's encoder.json + vocab.bpe (data/gpt2) into a Hugging Face tokenizer.json, as transformers'
GPT2TokenizerFast saves it, for test/test_tokenizer.cpp: the C++ tokenizer must encode the same with either.

Options make variants of it that exercise the other pre-tokenizers and features we read (GPT-2's vocabulary with
another family's pattern is not that family's tokenizer, but it drives the same scanner, added-token and NFC code):

  --pattern gpt2|llama3|qwen2|tekken   the pre-tokenizer: GPT-2's ByteLevel(use_regex) or a Split with that pattern
  --digits individual|runs             a Digits step first (SmolLM2: individual)
  --nfc                                the NFC normalizer (Qwen 2.5)
  --ignore-merges                      model.ignore_merges true (Llama 3)
  --merge-pairs                        merges as ["a", "b"] pairs (newer files) rather than "a b" strings
  --special TEXT, --added TEXT         more added tokens, special or not, after id 50256
  --template-bos TEXT                  a TemplateProcessing post_processor with TEXT before the text

Standard library only. Usage: python3 test/tools/make_tokenizer_json.py [--gpt2-dir DIR] --out FILE [options]
"""
import argparse
import json
import os

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PATTERNS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "tekken": r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}


def added_token(token_id, text, special):
    return {"id": token_id, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt2-dir", default=os.path.join(REPO, "data", "gpt2"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--pattern", choices=sorted(PATTERNS), default="gpt2")
    ap.add_argument("--digits", choices=["individual", "runs"])
    ap.add_argument("--nfc", action="store_true")
    ap.add_argument("--ignore-merges", action="store_true")
    ap.add_argument("--merge-pairs", action="store_true")
    ap.add_argument("--special", action="append", default=[])
    ap.add_argument("--added", action="append", default=[])
    ap.add_argument("--template-bos")
    args = ap.parse_args()

    with open(os.path.join(args.gpt2_dir, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(args.gpt2_dir, "vocab.bpe"), encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    merges = [line for line in lines[1:] if line]  # the first line is "#version: 0.2"
    if args.merge_pairs:
        merges = [line.split(" ") for line in merges]

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    if args.pattern == "gpt2":
        steps = [dict(byte_level, use_regex=True)]
    else:
        steps = [{"type": "Split", "pattern": {"Regex": PATTERNS[args.pattern]}, "behavior": "Isolated", "invert": False},
                 dict(byte_level, use_regex=False)]
    if args.digits:
        steps.insert(0, {"type": "Digits", "individual_digits": args.digits == "individual"})
    pre_tokenizer = steps[0] if len(steps) == 1 else {"type": "Sequence", "pretokenizers": steps}

    added = [dict(added_token(50256, "<|endoftext|>", True), normalized=True)]
    next_id = len(vocab)
    for text, special in [(t, True) for t in args.special] + [(t, False) for t in args.added]:
        added.append(added_token(next_id, text, special))
        next_id += 1
    post_processor = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    if args.template_bos:
        post_processor = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": args.template_bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {args.template_bos: {"id": args.template_bos, "ids": [next(a["id"] for a in added if a["content"] == args.template_bos)],
                                                   "tokens": [args.template_bos]}},
        }
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if args.nfc else None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": args.ignore_merges, "vocab": vocab, "merges": merges},
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
