#!/usr/bin/env python3
"""Hugging Face transformers GPT-2 folder -> llm.c model file that `train_gpt --model MODEL.bin` trains from.

    python3 scripts/hf/import_hf.py HF_DIR MODEL.bin [--bf16]

HF_DIR: config.json (model_type gpt2) and model.safetensors (F32, F16 or BF16; or model.safetensors.index.json
and its shards), or pytorch_model.bin when torch is installed. Tensor names with or without the "transformer."
prefix. The configuration must be one train_gpt runs: GELU with the tanh approximation (gelu_new), n_inner
4 x n_embd, LayerNorm epsilon 1e-5, attention scaled by 1/sqrt(head size) only, lm_head tied to wte, and
train_gpt's own checks (head size 64 or 128). Conv1D weights (in, out) are transposed to llm.c's (out, in); the
vocabulary is padded with zero rows to a multiple of 128. Written fp32 (version 3), or bf16 (version 5,
rounded to nearest even) with --bf16, through MODEL.bin.tmp and a rename.
Bad input: one line on stderr, exit 1, nothing written. Needs numpy (torch only for pytorch_model.bin).
"""
import json
import os
import re
import sys

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("numpy", "numpy"),):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: scripts/hf/import_hf.py needs {_module}{_why}: pip install {_pip}")
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_hf import BLOCK_TENSORS, InputError, config_problem, pad_vocab, read_safetensors, write_model_file  # noqa: E402

# GPT2Config's defaults, for keys a config.json leaves out (as transformers reads it)
DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False, "tie_word_embeddings": True}
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")  # the same function: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
IGNORED = re.compile(r"h\.\d+\.attn\.(masked_)?bias$")  # causal-mask buffers that old checkpoints store


def read_config(hf_dir):
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isdir(hf_dir):
        raise InputError(f"{hf_dir}: not a folder (expected a transformers GPT-2 folder with config.json)")
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: missing (expected a transformers GPT-2 folder)")
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested too deeply for json
        raise InputError(f"{path}: not readable JSON ({e})")
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object")
    if raw.get("model_type") != "gpt2":
        given = f"is {json.dumps(raw['model_type'])}" if "model_type" in raw else "missing"
        raise InputError(f"{path}: model_type {given}, expected \"gpt2\"")
    h = {**DEFAULTS, **raw}
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        if not isinstance(h[key], int) or isinstance(h[key], bool):
            raise InputError(f"{path}: {key} is {h[key]!r}, expected an integer")
    C = h["n_embd"]
    checks = [
        (h["n_inner"] in (None, 4 * C), "n_inner", f"null or 4 x n_embd = {4 * C}"),
        (h["activation_function"] in TANH_GELUS, "activation_function", "\"gelu_new\" (GELU, tanh approximation)"),
        (isinstance(h["layer_norm_epsilon"], (int, float)) and -1 < h["layer_norm_epsilon"] < 1 and  # compared exactly, even with a huge int
         abs(h["layer_norm_epsilon"] - 1e-5) < 1e-12, "layer_norm_epsilon", "1e-05"),
        (h["scale_attn_weights"] is True, "scale_attn_weights", "true"),
        (h["scale_attn_by_inverse_layer_idx"] is False, "scale_attn_by_inverse_layer_idx", "false"),
        (h["add_cross_attention"] is False, "add_cross_attention", "false"),
        (h["tie_word_embeddings"] is True, "tie_word_embeddings", "true (train_gpt's LM head is wte)"),
    ]
    for ok, key, expected in checks:
        if not ok:
            raise InputError(f"{path}: {key} is {json.dumps(h[key])}, expected {expected}")
    c = dict(max_seq_len=h["n_positions"], vocab=h["vocab_size"], layers=h["n_layer"], heads=h["n_head"],
             channels=C, padded_vocab=pad_vocab(h["vocab_size"]))
    problem = config_problem(c)
    if problem:
        raise InputError(f"{path}: train_gpt cannot run this shape: {problem}")
    return c


def load_torch_bin(path):
    try:
        import torch
    except ImportError:
        raise InputError(f"{path}: reading pytorch_model.bin needs torch (not installed); "
                         f"save the model with safe_serialization=True for model.safetensors")
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except TypeError:  # torch older than 1.13
            state = torch.load(path, map_location="cpu")
    except Exception as e:  # torch raises many kinds for a bad file
        raise InputError(f"{path}: cannot load with torch.load: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    if not isinstance(state, dict):
        raise InputError(f"{path}: expected a state dict, got {type(state).__name__}")
    return {k: v.detach().float().numpy() for k, v in state.items() if hasattr(v, "detach")}


def read_tensors(hf_dir):
    """-> ({name: float32 array}, where the tensors came from)."""
    def sharded(index_path, loader):
        try:
            with open(index_path) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise InputError(f"{index_path}: not a readable shard index ({e})")
        tensors = {}
        for name in files:
            tensors.update(loader(os.path.join(hf_dir, name)))
        return tensors, index_path

    candidates = [("model.safetensors", lambda p: (read_safetensors(p), p)),
                  ("model.safetensors.index.json", lambda p: sharded(p, read_safetensors)),
                  ("pytorch_model.bin", lambda p: (load_torch_bin(p), p)),
                  ("pytorch_model.bin.index.json", lambda p: sharded(p, load_torch_bin))]
    for name, load in candidates:
        path = os.path.join(hf_dir, name)
        if os.path.exists(path):
            return load(path)
    raise InputError(f"{hf_dir}: no model.safetensors (or pytorch_model.bin) next to config.json")


def to_llmc(c, tensors, source):
    """HF state dict (float32) -> the llm.c file's tensors; every expected tensor present with its shape."""
    V, Vp, T, L, C = c["vocab"], c["padded_vocab"], c["max_seq_len"], c["layers"], c["channels"]
    hf, original = {}, {}  # without the prefix; the name in the file, for messages
    for name, a in tensors.items():
        key = name[len("transformer."):] if name.startswith("transformer.") else name
        if IGNORED.match(key):
            continue
        if key in hf:
            raise InputError(f"{source}: tensor {key} appears twice (as {original[key]} and {name})")
        hf[key], original[key] = a, name
    block_shapes = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
                    "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
                    "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C),
                    "mlp.c_proj.bias": (C,)}
    expected = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for l in range(L):
        expected.update({f"h.{l}.{k}": s for k, s in block_shapes.items()})
    for key, shape in expected.items():
        if key not in hf:
            raise InputError(f"{source}: missing tensor [transformer.]{key} (expected shape {shape} for the config's "
                             f"{L} layers, {C} channels, vocab {V}, {T} positions)")
        if tuple(hf[key].shape) != shape:
            raise InputError(f"{source}: tensor {original[key]} has shape {tuple(hf[key].shape)}, expected {shape}")
    if "lm_head.weight" in hf:
        if not np.array_equal(hf["lm_head.weight"], hf["wte.weight"]):
            raise InputError(f"{source}: lm_head.weight differs from wte.weight (expected them tied, as train_gpt's LM head is wte)")
        del hf["lm_head.weight"]
    extra = sorted(set(hf) - set(expected))
    if extra:
        raise InputError(f"{source}: unexpected tensor {original[extra[0]]}{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}"
                         f" (expected only GPT2LMHeadModel's)")
    t = {"wte": np.zeros((Vp, C), dtype=np.float32), "wpe": hf["wpe.weight"],
         "lnfw": hf["ln_f.weight"], "lnfb": hf["ln_f.bias"]}
    t["wte"][:V] = hf["wte.weight"]
    for ours, theirs, transposed in BLOCK_TENSORS:
        t[ours] = np.stack([hf[f"h.{l}.{theirs}"].T if transposed else hf[f"h.{l}.{theirs}"] for l in range(L)])
    return t


def main(argv):
    usage = "usage: import_hf.py HF_DIR MODEL.bin [--bf16]  (Hugging Face GPT-2 folder -> llm.c model file, fp32 unless --bf16)"
    if argv in (["-h"], ["--help"]):
        print(usage)
        return 0
    bf16 = "--bf16" in argv
    args = [a for a in argv if a != "--bf16"]
    if len(args) != 2 or any(a.startswith("-") for a in args):
        print(usage, file=sys.stderr)
        return 1
    hf_dir, out = args
    try:
        c = read_config(hf_dir)
        tensors, source = read_tensors(hf_dir)
        t = to_llmc(c, tensors, source)
        write_model_file(out, c, t, bf16)
    except InputError as e:
        print(f"import_hf.py: error: {e}", file=sys.stderr)
        return 1
    params = sum(a.size for a in t.values()) - (c["padded_vocab"] - c["vocab"]) * c["channels"]
    print(f"wrote {out}: llm.c model file version {5 if bf16 else 3} ({'bf16' if bf16 else 'fp32'}) from {source}: "
          f"{c['layers']} layers, {c['heads']} heads, {c['channels']} channels, max T {c['max_seq_len']}, "
          f"vocab {c['vocab']} (padded {c['padded_vocab']}): {params:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
