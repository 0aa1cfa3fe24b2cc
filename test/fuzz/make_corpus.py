#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz harnesses: test/fuzz/corpus/X/ for each harness X of test/fuzz/ (and the
safetensors files that fuzz_safetensors.py mutates besides the GPT-2 folder it builds).

    python3 test/fuzz/make_corpus.py [--out DIR]   (default: test/fuzz/corpus next to this script)

Small valid files and a few edge cases per format (docs/formats.md), a few kilobytes in all. The harnesses pad a
header whose shape needs a large body (model and state files), so the seeds hold headers only where the body
would be large. Only the standard library: no numpy or torch needed.
"""
import argparse
import json
import os
import re
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODEL_MAGIC, STATE_MAGIC, ADAPTER_MAGIC, SHARD_MAGIC, TOKENIZER_MAGIC = 20240326, 20261126, 20261127, 20240520, 20240328
SHARD32_MAGIC = 20240801  # uint32 tokens, version 7
MASK_MAGIC = 20261215  # mask shards (dataloader/shards.h)


def header(words):
    """A 256 x int32 header: the given words (ints, or floats stored as their bits), zeros after them."""
    raw = b"".join(struct.pack("<f", w) if isinstance(w, float) else struct.pack("<i", w) for w in words)
    return raw + b"\0" * (1024 - len(raw))


def shards():
    tokens = struct.pack("<100H", *[(i * 7919) % 50257 for i in range(100)])
    return {
        "valid_100_tokens": header([SHARD_MAGIC, 1, 100, 50257, 1, 8]) + tokens,
        "valid_shuffled": header([SHARD_MAGIC, 1, 100, 50257, 3, 5, 10, 20] + [0] * 16 + [1]) + tokens,
        "empty": header([SHARD_MAGIC, 1, 0]),
        "truncated": header([SHARD_MAGIC, 1, 100]) + tokens[:77],
        "token_above_vocab": header([SHARD_MAGIC, 1, 4, 10]) + struct.pack("<4H", 1, 2, 11, 3),
        "bad_magic": header([20240521, 1, 0]),
        # uint32 tokens, ids past 65,535 (vocabulary 200,000 in [3])
        "uint32_100_tokens": header([SHARD32_MAGIC, 7, 100, 200000, 2, 8, 10, 20])
        + struct.pack("<100I", *[(60000 + i * 7919) % 200000 for i in range(100)]),
        "uint32_version_1": header([SHARD32_MAGIC, 1, 4, 200000]) + struct.pack("<4I", 1, 65536, 70000, 3),
    }


def model_files():
    # headers of small shapes (the harness pads the body): magic, version, T, V, L, NH, C, Vp
    return {
        "fp32_1_layer": header([MODEL_MAGIC, 3, 4, 50, 1, 1, 64, 128]),
        "bf16_2_layers_2_heads": header([MODEL_MAGIC, 5, 8, 100, 2, 2, 128, 128, 1]),
        "bf16_head_size_128": header([MODEL_MAGIC, 5, 2, 128, 3, 1, 128, 256, 3]),
        "bad_head_size": header([MODEL_MAGIC, 3, 4, 50, 1, 3, 64, 128]),
        "short": header([MODEL_MAGIC, 3])[:100],
    }


def state_files():
    # the harness's model: 2 layers, 64 channels, vocabulary 100 (padded 128): 108800 parameters
    def state(step=1, precision=1, dp=1, tp=1, pp=1, stage=1, has_master=1, elements=108800, first=1, last=1, layers=(0, 1), side=0):
        h = [STATE_MAGIC, 5, 72, 64, step, precision, dp, tp, pp, 0, 0, 0, stage, has_master, 0, 1.0, 0, 0, elements, 0, 0x1234, 0]
        h += [0] * (100 - len(h)) + [side]
        h += [0] * (128 - len(h)) + [first, last, len(layers)] + list(layers)
        return header(h)
    return {
        "one_rank": state(),
        "two_ranks_stage_1": state(dp=2, elements=54400, has_master=0, side=1),
        "two_ranks_stage_0": state(dp=2, stage=0),
        "pipeline_first_stage": state(pp=2, elements=8192 + 512 + 49984, last=0, layers=(0,), side=2),
        "no_blocks": state(layers=()),
    }


def manifests():
    """Checkpoint manifests (model/checkpoint_store.h): the text and its closing CRC-32C line."""
    def crc32c(data):
        crc = 0xFFFFFFFF
        for byte in data:
            crc ^= byte
            for _ in range(8):
                crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
        return crc ^ 0xFFFFFFFF
    def manifest(lines):
        text = "".join(line + "\n" for line in lines).encode()
        return text + b"end %08x\n" % crc32c(text)
    whole = ["train_gpt checkpoint 1", "run 0123456789abcdef", "step 250", "precision bf16", "mesh 2 1 1 zero 1", "setting lr 0.0006",
             "setting train_shards 2 shards 1a2b3c4d (data/x_*.bin)", "file model_00000250.bin 1024 deadbeef",
             "file state_00000250_00000.bin 2048 00000001", "file state_00000250_00001.bin 2048 00000002"]
    return {
        "two_ranks": manifest(whole),
        "lora": manifest(whole[:6] + ["setting base_model base.bin, crc 0badf00d", "file adapters_00000250.bin 4096 12345678"]),
        "no_files": manifest(whole[:5]),
        "cut_short": manifest(whole)[:-7],
    }


def adapter_files():
    def adapters(rank, targets, layers=2, channels=64, alpha=None, tensors=None, body=b""):
        count = bin(targets).count("1")
        return header([ADAPTER_MAGIC, 1, rank, float(alpha if alpha is not None else rank), targets, layers, channels,
                       tensors if tensors is not None else 2 * layers * count]) + body
    qkv_body = b"".join(struct.pack("<f", 0.01 * (i % 17)) for i in range(2 * (64 + 3 * 64)))  # rank 1: A (1, 64), B (192, 1), 2 layers
    return {
        "rank_1_qkv": adapters(1, 1, body=qkv_body),
        "rank_4_all_targets": adapters(4, 15, layers=1, channels=128),
        "nan_alpha": adapters(2, 3, alpha=float("nan")),
        "tensor_count_off": adapters(1, 1, tensors=3, body=qkv_body),
    }


def peft_folders():
    """fuzz_peft_folder's inputs: a byte (unit padding), adapter_config.json's length and text, then
    adapter_model.safetensors, for its model: 2 layers, C = 64, KV = 64, MLP 128 units."""
    shapes = {"self_attn.q_proj": (64, 64), "self_attn.k_proj": (64, 64), "self_attn.v_proj": (64, 64), "self_attn.o_proj": (64, 64),
              "mlp.gate_proj": (64, 128), "mlp.up_proj": (64, 128), "mlp.down_proj": (128, 64)}  # (in, out)

    def folder(modules, r=2, dtype="F32", config=None, pad=0):
        entries, data = {"__metadata__": {"format": "pt"}}, b""
        for l in range(2):
            for m in modules:
                i, o = shapes[m]
                for ab, shape in (("A", [r, i]), ("B", [o, r])):
                    count = shape[0] * shape[1]
                    raw = (struct.pack(f"<{count}f", *[0.01 * (k % 13) for k in range(count)]) if dtype == "F32"
                           else struct.pack(f"<{count}H", *[0x3C00 + k % 97 for k in range(count)]))
                    entries[f"base_model.model.model.layers.{l}.{m}.lora_{ab}.weight"] = {"dtype": dtype, "shape": shape,
                                                                                        "data_offsets": [len(data), len(data) + len(raw)]}
                    data += raw
        text = json.dumps(entries, separators=(",", ":")).encode() + b" " * pad
        cfg = json.dumps(config or {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 16, "lora_dropout": 0.05,
                                    "target_modules": [m.split(".")[1] for m in modules], "bias": "none", "fan_in_fan_out": False,
                                    "base_model_name_or_path": None, "use_rslora": False}).encode()
        return b"\0" + struct.pack("<I", len(cfg)) + cfg + struct.pack("<Q", len(text)) + text + data
    return {
        "q_v_f32": folder(["self_attn.q_proj", "self_attn.v_proj"]),
        "all_seven_bf16": folder(list(shapes), r=1, dtype="BF16", pad=5),
        "config_not_lora": folder(["self_attn.o_proj"], config={"peft_type": "IA3", "r": 2, "target_modules": ["o_proj"]}),
    }


def tokenizer_files():
    def llmc(version, tokens, eot=None):
        words = [TOKENIZER_MAGIC, version, len(tokens)] + ([eot] if version == 2 else [])
        return header(words) + b"".join(bytes([len(t)]) + t for t in tokens)
    # first byte: 0 encoder.json, 1 llm.c tokenizer file
    return {
        "encoder_json": b"\0" + json.dumps({"!": 0, "\"": 1, "\u0120t": 2, "<|endoftext|>": 3}).encode(),
        "encoder_json_escapes": b"\0" + b'{"\\u0120\\ud83d\\ude00": 0, "\\n": 1, "a": 123456789}',
        "llmc_version_2": b"\1" + llmc(2, [b"a", b"b", b"ab", b"<|endoftext|>"], eot=3),
        "llmc_version_1": b"\1" + llmc(1, [b"x", b"\xff"]),
    }


def vocab_bpe():
    return {
        "merges": "#version: 0.2\n\u0120 t\n\u0120 a\nh e\ni n\nr e\no n\n\u0120t he\r\n".encode(),
        "bad_line": "#version: 0.2\n\u0120 t x\n".encode(),
        "duplicate": "h e\nh e\n".encode(),
    }


def tokenize():
    return {
        "english": b"Hello world! It's a test: they've said we'll go, I'm sure you'd agree.\n\nNumbers 12345 and 3.14.",
        "unicode": "café 日本語 😀 naïve Ωmega \u00a0nbsp\u2003em-space".encode(),
        "whitespace": b"a  b   c\t\t d \n\n\n e     \r\n",
        "special": b"x<|endoftext|>y <|endoftext|><|endoftext|> z<|endo",
        "invalid_utf8": b"ab\xff\xfe c\xc3 d\xe6\x97 e\xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf end",
    }


def byte_level_alphabet():
    """GPT-2's map of the 256 bytes to printable characters (a byte-level vocabulary's first 256 tokens)."""
    printable = [b for b in range(256) if ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or b >= 0xAE]
    others = [b for b in range(256) if b not in printable]
    spelled = {b: chr(b) for b in printable}
    spelled.update({b: chr(256 + i) for i, b in enumerate(others)})
    return [spelled[b] for b in range(256)]


def tokenizer_json():
    """tokenizer.json files of each family the reader takes (the bytes, 12 merged tokens, the family's
    pre-tokenizer, normalizer and added tokens), and one of a model type it refuses."""
    alphabet = byte_level_alphabet()
    vocab = {c: i for i, c in enumerate(alphabet)}
    spell = lambda raw: "".join(alphabet[b] for b in raw)  # noqa: E731
    pairs = [(b"l", b"o"), (b"H", b"e"), (b"He", b"l"), (b"Hel", b"lo"), (b"o", b"r"), (b" ", b"W"), (b" W", b"or"), (b"1", b"2"),
             (b"'", b"s"), (b" ", b"t"), ("\u0301".encode(), b""), (b"e", "\u0301".encode())]
    merges = [spell(a) + " " + spell(b) for a, b in pairs if b]
    for a, b in pairs:  # U+0301's two bytes are one token, merged with a preceding e
        vocab.setdefault(spell(a + b), len(vocab))

    def added(*tokens):
        return [{"id": 268 + i, "content": text, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                 "special": special} for i, (text, special) in enumerate(tokens)]

    def split(pattern):
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    tekken = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
              r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    families = {  # name: added tokens, normalizer, pre-tokenizer, post-processor, ignore_merges, merges as pairs
        "gpt2": (added(("<|endoftext|>", True)), None, byte_level, None, False, False),
        "llama3": (added(("<|begin_of_text|>", True), ("<|end_of_text|>", True)), None, split(llama3),
                   {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                                             {"Sequence": {"id": "A", "type_id": 0}}]}, True, True),
        "qwen2": (added(("<|endoftext|>", True), ("<tool_call>", False)), {"type": "NFC"}, split(llama3.replace(r"\p{N}{1,3}", r"\p{N}")),
                  None, False, False),
        "smollm2": (added(("<|endoftext|>", True)), None,
                    {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}, None, False, False),
        "tekken": (added(("<s>", True), ("[INST]", True)), None, split(tekken), None, False, False),
    }
    files = {}
    for name, (tokens, normalizer, pre_tokenizer, post_processor, ignore_merges, pairs) in families.items():
        model = {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False, "ignore_merges": ignore_merges,
                 "vocab": vocab, "merges": [m.split(" ") for m in merges] if pairs else merges}
        files[name] = json.dumps({"version": "1.0", "added_tokens": tokens, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
                                  "post_processor": post_processor, "decoder": {"type": "ByteLevel"}, "model": model}).encode()
    files["refused_wordpiece"] = json.dumps({"version": "1.0", "added_tokens": added(("<|endoftext|>", True)), "normalizer": None,
                                             "pre_tokenizer": byte_level, "post_processor": None, "decoder": {"type": "ByteLevel"},
                                             "model": {"type": "WordPiece", "vocab": {"a": 0}}}).encode()
    return files


def chat_jsonl():
    return {
        "messages": b'{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}',
        "prompt_completion": b'{"prompt": "2+2=", "completion": "4", "id": 17}',
        "extra_keys": b'{"messages": [{"role": "user", "content": "x", "name": null}, {"role": "assistant", "content": "y", "weight": 1.5e3}], "meta": {"a": [true, false]}}',
        "escapes": b'{"prompt": "a\\"\\u00e9\\ud83d\\ude00\\n\\t", "completion": "<|eot_id|>"}',
        "no_assistant": b'{"messages": [{"role": "user", "content": "x"}]}',
        "unknown_role": b'{"messages": [{"role": "tool", "content": "x"}]}',
        "trailing_comma": b'{"messages": [{"role": "user", "content": "x"},]}',
        "unpaired_surrogate": b'{"prompt": "\\ud83d", "completion": "y"}',
    }


def mask_shards():
    """Mask shards (docs/formats.md): header [magic, version, tokens N, window T, counted], then N bytes of 0 or 1.
    fuzz_mask_shards.cpp reads the words the format leaves unused as its own choices: [5] & 1 a token shard one
    longer than the mask, [6] B, [7] shuffling and its seed."""
    def mask(data, window=8, magic=MASK_MAGIC, count=None, extra=(0, 0, 0)):
        return header([magic, 1, len(data), window, sum(data) if count is None else count, *extra]) + bytes(data)
    period = [0, 1, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1]
    windows = period * 2 + [0]  # 6 windows of 8 and the shard's closing padding token
    return {
        "valid_6_windows_of_8": mask(windows, extra=(0, 1, 0)),
        "valid_shuffled_B2": mask(windows, extra=(0, 1, 3)),
        "bad_magic": mask(windows, magic=MASK_MAGIC + 1),
        "byte_2": mask(windows[:10] + [2] + windows[11:]),
        "count_off": mask(windows, count=3),
        "length_mismatch": mask(windows, extra=(1, 0, 0)),
        "window_0": mask(windows, window=0),
        "truncated": mask(windows)[:1030],
        "empty": b"",
    }

def hellaswag():
    fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hellaswag_tiny.jsonl")
    with open(fixture, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    return {
        "tiny": b"".join(lines[:2]),
        "one_item": lines[0],
        "nested_extra": b'{"ind":1,"x":[[[{"y":[]}]]],"activity_label":"","ctx":"a","label":0,"endings":["b","c","d","e"]}\n',
        "bad_label": b'{"ind":1,"activity_label":"a","ctx":"b","label":4,"endings":["b","c","d","e"]}',
    }


def train_options():
    def argv(world, *args):
        return bytes([world - 1]) + b"\0".join(a.encode() for a in args)
    return {
        "defaults": argv(1),
        "small": argv(1, "--model", "d2", "--batch-size", "4", "--seq-len", "64", "--steps", "10", "-l", "1e-3"),
        "model_file": argv(2, "--model", "@model.bin", "--seq-len", "16", "--zero-stage", "2"),
        "lora": argv(1, "--model", "@model.bin", "--seq-len", "8", "--lora-load", "@adapters.bin", "--lora-save", "out.bin"),
        "lora_flags": argv(2, "--model", "d4", "--lora-rank", "4", "--lora-targets", "qkv,fc-proj", "--lora-alpha", "8"),
        "pipeline": argv(4, "--model", "d6", "--pipeline-parallel", "2", "--pipeline-layers", "2,4", "--seq-len", "32"),
        "balanced": argv(4, "--model", "d8", "--pipeline-parallel", "4", "--pipeline-layers", "balanced", "--seq-len", "16",
                         "--total-batch-tokens", "256", "--batch-size", "4"),
        "interleaved": argv(2, "--model", "d8", "--pipeline-parallel", "2", "--pipeline-schedule", "interleaved",
                            "--virtual-stages", "2", "--seq-len", "16", "--total-batch-tokens", "128", "--batch-size", "4"),
        "tensor_parallel": argv(8, "--model", "d12", "--tensor-parallel", "4", "--sequence-parallel", "1", "--seq-len", "128"),
        "offload": argv(4, "--model", "d2", "--zero-stage=3", "--offload=optimizer,parameters", "--host-memory-gib", "1.5"),
        "resume": argv(1, "--model", "d2", "--resume", "1", "--output-dir", "out", "--keep-checkpoints", "2", "--keep-every", "10"),
        "bad_value": argv(1, "--batch-size", "99999999999999999999"),
    }


def safetensors():
    def file(entries, data, pad=0):
        text = json.dumps(entries, separators=(",", ":")).encode() + b" " * pad
        return struct.pack("<Q", len(text)) + text + data
    f32 = struct.pack("<6f", *[0.5 * i for i in range(6)])
    bf16 = struct.pack("<4H", 0x3F80, 0xBF80, 0x0000, 0x7F80)
    return {
        "two_tensors": file({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                             "transformer.wpe.weight": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}, f32 + bf16, pad=3),
        "f16_scalar": file({"s": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]}}, b"\x00\x3c"),
        "empty": file({}, b""),
    }


def flag_dictionary():
    """train_options.h's flags, aliases and choices, and a few values: the libFuzzer dictionary of train_options
    (run_fuzz.sh passes test/fuzz/X.dict to harness X)."""
    with open(os.path.join(ROOT, "train_options.h")) as f:
        table = f.read()
    entries = {"balanced", "-1", "0", "1", "2147483647", "2147483648", "1e39", "nan", "inf", "@model.bin", "@adapters.bin"}
    for name, alias in re.findall(r'\{"(--[a-z0-9-]+)", (?:"(-[a-z]+)"|nullptr)', table):
        entries.update(w for w in (name, alias) if w)
    for choices in re.findall(r'one_of\(\{([^}]*)\}\)', table):
        entries.update(re.findall(r'"([^"]*)"', choices))
    return "# train_gpt's flags and values they take (written by make_corpus.py)\n" + "".join(json.dumps(e) + "\n" for e in sorted(entries))


def main(argv):
    parser = argparse.ArgumentParser(description="Writes the fuzz harnesses' seed corpus (test/fuzz/corpus/X/).")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"),
                        help="folder of the corpus (default: test/fuzz/corpus)")
    args = parser.parse_args(argv)
    corpus = {"shards": shards(), "model_file": model_files(), "state_file": state_files(), "manifest": manifests(), "adapter_file": adapter_files(), "peft_folder": peft_folders(),
              "tokenizer_files": tokenizer_files(), "vocab_bpe": vocab_bpe(), "tokenize": tokenize(), "hellaswag": hellaswag(),
              "train_options": train_options(), "safetensors": safetensors(), "tokenizer_json": tokenizer_json(), "chat_jsonl": chat_jsonl(),
              "mask_shards": mask_shards()}
    for harness, files in corpus.items():
        folder = os.path.join(args.out, harness)
        os.makedirs(folder, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_options.dict"), "w") as f:
        f.write(flag_dictionary())
    print(f"wrote {sum(len(f) for f in corpus.values())} seeds for {len(corpus)} harnesses into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
