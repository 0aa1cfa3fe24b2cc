#!/usr/bin/env python3
"""Hugging Face transformers GPT-2, Llama, Qwen2 or Mistral folder -> a model file that `train_gpt --model MODEL.bin`
trains from (llm.c's for GPT-2, our Llama-family one for the others).

    python3 scripts/hf/import_hf.py HF_DIR MODEL.bin [--bf16]

Llama family (model_type llama, qwen2, mistral): config.json and model.safetensors (F32, F16 or BF16; or
model.safetensors.index.json and its shards). q_proj, k_proj, v_proj rows -> qkvw [q | k | v] (Qwen2's biases ->
qkvb), gate_proj and up_proj -> fcw [gate | up], as they are: transformers' rotary layout (rotate_half) is ours.
Refused, one line naming the key: another rope type than default or llama3, an active sliding window, MoE, head_dim
other than hidden_size / heads, hidden_act other than silu, Llama's attention_bias or mlp_bias, an lm_head that
differs from embed_tokens when tied or none when untied. Tensors are streamed one at a time into the file.
A bitsandbytes 4-bit folder (quantization_config: quant_method bitsandbytes, load_in_4bit, bnb_4bit_quant_type nf4,
with or without double quantization): each Linear4bit weight is dequantized as bitsandbytes' dequantize_4bit does it
in float32 (the NumPy reference, scripts/reference/nf4_reference.py), so an fp32 model file holds exactly the weights
bitsandbytes computes with; `train_gpt --base-quant nf4 --nf4-double-quant 0` then stores them again as the same
4-bit codes and absmaxes (docs/lora.md). FP4, 8-bit weights, other block sizes and other quantization methods are
refused.

GPT-2: config.json (model_type gpt2) and model.safetensors (F32, F16 or BF16; or model.safetensors.index.json
and its shards), or pytorch_model.bin when torch is installed. Tensor names with or without the "transformer."
prefix. The configuration must be one train_gpt runs: GELU with the tanh approximation (gelu_new), n_inner
4 x n_embd, LayerNorm epsilon 1e-5, attention scaled by 1/sqrt(head size) only, lm_head tied to wte, and
train_gpt's own checks (head size 64 or 128). Conv1D weights (in, out) are transposed to llm.c's (out, in); the
vocabulary is padded with zero rows to a multiple of 128. Written fp32 (version 3), or bf16 (version 5,
rounded to nearest even) with --bf16, through MODEL.bin.tmp and a rename.
Bad input: one line on stderr, exit 1, nothing written. Needs numpy (torch only for pytorch_model.bin).
"""
import json
import math
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
from export_hf import (BLOCK_TENSORS, LLAMA_BLOCK, InputError, config_problem, f32, file_tensor_shapes,  # noqa: E402
                       llama_parts, load_stored, load_tensor, pad_vocab, read_safetensors, read_safetensors_header,
                       write_model_file)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import nf4_reference as nf4  # noqa: E402

# GPT2Config's defaults, for keys a config.json leaves out (as transformers reads it)
DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False, "tie_word_embeddings": True}
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")  # the same function: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
IGNORED = re.compile(r"h\.\d+\.attn\.(masked_)?bias$")  # causal-mask buffers that old checkpoints store


# The transformers config classes' defaults, for keys a config.json leaves out (LlamaConfig, Qwen2Config,
# MistralConfig of transformers 4.4x; num_key_value_heads null: as many as heads).
LLAMA_DEFAULTS = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0, "use_sliding_window": False},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0, "sliding_window": 4096},
}
FLOAT32_MAX = 3.4028234663852886e38  # the header holds float32s: a larger value would not convert
MOE_KEYS = ("num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "n_routed_experts")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


def read_config(hf_dir):
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isdir(hf_dir):
        raise InputError(f"{hf_dir}: not a folder (expected a transformers folder with config.json)")
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: missing (expected a transformers folder)")
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested too deeply for json
        raise InputError(f"{path}: not readable JSON ({e})")
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object")
    if isinstance(raw.get("model_type"), str) and raw["model_type"] in LLAMA_DEFAULTS:
        return read_llama_config(path, raw)
    if raw.get("model_type") != "gpt2":
        given = f"is {json.dumps(raw['model_type'])}" if "model_type" in raw else "missing"
        raise InputError(f"{path}: model_type {given}, expected \"gpt2\", \"llama\", \"qwen2\" or \"mistral\"")
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
        (h.get("quantization_config") is None, "quantization_config", "absent (bitsandbytes' 4-bit NF4 is read for the Llama family)"),
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


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def rope_settings(path, h):
    """-> (theta, factor, low, high, original positions) from rope_parameters (transformers 5) or rope_theta and
    rope_scaling (4.x); factor 0 when not scaled. Other rope types are refused: the trainer's RoPE has only these."""
    params = h.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = h.get("rope_scaling"), "rope_scaling"
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InputError(f"{path}: {key} is {json.dumps(params)}, expected an object or null")
    theta = params.get("rope_theta", h.get("rope_theta", 10000.0))
    if not is_number(theta) or abs(theta) > FLOAT32_MAX:
        raise InputError(f"{path}: rope_theta is {json.dumps(theta)}, expected a number (a float32)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, 0.0, 1.0, 4.0, 8192  # model/config.h RopeScaling's defaults: the file's bytes for "none"
    if kind != "llama3":
        raise InputError(f"{path}: {key}.rope_type is {json.dumps(kind)}, expected \"default\" or \"llama3\" "
                         f"(the trainer's RoPE has no other scaling)")
    values = []
    for name in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        v = params.get(name)
        integral = name == "original_max_position_embeddings"
        if not (isinstance(v, int) if integral else is_number(v) and abs(v) <= FLOAT32_MAX) or isinstance(v, bool):
            raise InputError(f"{path}: {key}.{name} is {json.dumps(v)}, expected {'an integer' if integral else 'a number'}")
        values.append(v)
    return (theta, *values)


def read_llama_config(path, raw):
    """config.json of LlamaForCausalLM, Qwen2ForCausalLM or MistralForCausalLM -> our Llama-family shape."""
    kind = raw["model_type"]
    h = {**LLAMA_DEFAULTS[kind], **raw}
    if h.get("num_key_value_heads") is None:
        h["num_key_value_heads"] = h["num_attention_heads"]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings"):
        if not isinstance(h[key], int) or isinstance(h[key], bool) or abs(h[key]) >= 1 << 31:
            raise InputError(f"{path}: {key} is {json.dumps(h[key])}, expected an integer")
    C, NH = h["hidden_size"], h["num_attention_heads"]
    head_dim = h.get("head_dim")
    moe = [k for k in MOE_KEYS if h.get(k) not in (None, 0, 1, False)]
    layer_types = h.get("layer_types")
    window = h.get("sliding_window")
    checks = [
        (not moe, moe[0] if moe else "", "absent (mixture of experts is not supported)"),
        (h.get("hidden_act", "silu") in ("silu", "swish"), "hidden_act", "\"silu\" (SwiGLU)"),
        (NH > 0 and head_dim in (None, C // NH), "head_dim", f"null or hidden_size / num_attention_heads = {C // NH if NH > 0 else '?'}"),
        (h.get("partial_rotary_factor", 1.0) == 1.0, "partial_rotary_factor", "1"),
        (is_number(h["rms_norm_eps"]) and 0 < h["rms_norm_eps"] < 1, "rms_norm_eps", "a number in (0, 1)"),
        (isinstance(h["tie_word_embeddings"], bool), "tie_word_embeddings", "true or false"),
        (kind != "llama" or h["attention_bias"] is False, "attention_bias", "false (biases on q, k, v and o: Qwen2's are on q, k, v only)"),
        (kind != "llama" or h["mlp_bias"] is False, "mlp_bias", "false"),
        (kind != "qwen2" or h["use_sliding_window"] is False, "use_sliding_window", "false (sliding-window attention is not supported)"),
        (kind != "mistral" or window is None or (is_number(window) and window >= h["max_position_embeddings"]),
         "sliding_window", "null or at least max_position_embeddings (sliding-window attention is not supported)"),
        (layer_types is None or (isinstance(layer_types, list) and all(t == "full_attention" for t in layer_types)),
         "layer_types", "all \"full_attention\""),
    ]
    for ok, key, expected in checks:
        if not ok:
            raise InputError(f"{path}: {key} is {json.dumps(h.get(key))}, expected {expected}")
    quantized = read_quantization(path, h.get("quantization_config"))
    theta, factor, low, high, positions = rope_settings(path, h)
    V = h["vocab_size"]
    c = dict(family="llama", hf_type=kind, max_seq_len=h["max_position_embeddings"], vocab=V,
             layers=h["num_hidden_layers"], heads=NH, channels=C, padded_vocab=pad_vocab(V),
             kv_heads=h["num_key_value_heads"], ffn=h["intermediate_size"], qkv_bias=kind == "qwen2",
             tied=h["tie_word_embeddings"], norm_eps=f32(h["rms_norm_eps"]), rope_theta=f32(theta),
             rope_factor=f32(factor), rope_low=f32(low), rope_high=f32(high), rope_positions=positions, quantized=quantized)
    if not 0 < positions < 1 << 31:
        raise InputError(f"{path}: rope_scaling.original_max_position_embeddings is {positions}, expected a positive integer")
    problem = config_problem(c)
    if problem:
        raise InputError(f"{path}: train_gpt cannot run this shape: {problem}")
    return c


def read_quantization(path, q):
    """config.json's quantization_config: absent (False), or bitsandbytes' 4-bit NF4 (True: its weights are dequantized
    as bitsandbytes does, bnb_nf4_weight); anything else refused in one line naming the key."""
    if q is None:
        return False
    if not isinstance(q, dict):
        raise InputError(f"{path}: quantization_config is {json.dumps(q)}, expected an object (bitsandbytes 4-bit NF4) or absent")
    checks = [("quant_method", q.get("quant_method") == "bitsandbytes", "\"bitsandbytes\" (other quantization methods are not read)"),
              ("load_in_4bit", q.get("load_in_4bit") is True, "true (bitsandbytes' 8-bit weights are not read)"),
              ("bnb_4bit_quant_type", q.get("bnb_4bit_quant_type", "fp4") == "nf4", "\"nf4\" (FP4 is not read)"),
              ("bnb_4bit_quant_storage", q.get("bnb_4bit_quant_storage", "uint8") == "uint8", "\"uint8\"")]
    for key, ok, expected in checks:
        if not ok:
            raise InputError(f"{path}: quantization_config.{key} is {json.dumps(q.get(key))}, expected {expected}")
    return True


QUANT_STATE = ".quant_state.bitsandbytes__nf4"  # a bitsandbytes NF4 weight's quant state: JSON in a U8 tensor


def bnb_nf4_weight(index, name, shape, source):
    """Linear4bit weight `name` of a bitsandbytes folder (the packed codes, two a byte, the first in the high nibble;
    absmax, quant_map, and with double quantization nested_absmax, nested_quant_map and the quant state's
    nested_offset) -> float32 of `shape`, dequantized as bitsandbytes' dequantize_4bit does in float32
    (nf4_reference.dequantize: bitwise), with the file's own 8-bit map. Blocks of 64 weights, nested groups of 256
    absmaxes, NF4's table; anything else refused in one line naming the tensor."""
    def stored(suffix, dtype, count):
        key = name + suffix
        if key not in index:
            raise InputError(f"{source}: missing tensor {key} (part of bitsandbytes' NF4 weight {name})")
        path, entry = index[key]
        if entry[0] != dtype or (count is not None and math.prod(entry[1]) != count):
            raise InputError(f"{source}: tensor {key} is {entry[0]} {list(entry[1])}, expected {dtype} of "
                             f"{count if count is not None else 'any'} elements")
        return load_stored(path, entry).reshape(-1)

    try:
        state = json.loads(stored(QUANT_STATE, "U8", None).tobytes())
        if not isinstance(state, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InputError(f"{source}: tensor {name}{QUANT_STATE} is not a JSON object ({e})")
    nested = "nested_offset" in state
    checks = [("quant_type", state.get("quant_type") == "nf4", "\"nf4\""), ("blocksize", state.get("blocksize") == nf4.BLOCK, nf4.BLOCK),
              ("shape", state.get("shape") == list(shape), list(shape))]
    if nested:
        checks += [("nested_blocksize", state.get("nested_blocksize") == nf4.NESTED_BLOCK, nf4.NESTED_BLOCK),
                   ("nested_offset", is_number(state["nested_offset"]) and abs(state["nested_offset"]) <= FLOAT32_MAX, "a float32")]
    for key, ok, expected in checks:
        if not ok:
            raise InputError(f"{source}: {name}{QUANT_STATE}: {key} is {json.dumps(state.get(key))}, expected {expected}")
    n = math.prod(shape)
    blocks = -(-n // nf4.BLOCK)
    if not np.array_equal(stored(".quant_map", "F32", 16).view(np.uint32), nf4.NF4.view(np.uint32)):
        raise InputError(f"{source}: tensor {name}.quant_map differs from NF4's 16 values")
    if nested:  # absmax = map[code] x nested + offset, two float32 roundings as bitsandbytes' dequantize_blockwise and its add
        table = stored(".nested_quant_map", "F32", 256)  # the file's own: torch versions round a few values 1 ulp apart
        if not np.isfinite(table).all():
            raise InputError(f"{source}: tensor {name}.nested_quant_map holds a value that is not finite")
        nested_absmax = stored(".nested_absmax", "F32", -(-blocks // nf4.NESTED_BLOCK))
        absmax = table[stored(".absmax", "U8", blocks)] * np.repeat(nested_absmax, nf4.NESTED_BLOCK)[:blocks] + \
            np.float32(state["nested_offset"])
    else:
        absmax = stored(".absmax", "F32", blocks)
    q = {"count": n, "packed": stored("", "U8", (n + 1) // 2), "absmax": absmax}
    return nf4.dequantize(q).reshape(shape)


def safetensors_index(hf_dir):
    """-> ({tensor name: (file, (dtype, shape, byte offset))}, where they came from) of model.safetensors or the
    shards that model.safetensors.index.json names; headers only, no tensor read."""
    single = os.path.join(hf_dir, "model.safetensors")
    if os.path.exists(single):
        return {name: (single, e) for name, e in read_safetensors_header(single).items()}, single
    index_path = os.path.join(hf_dir, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        other = "pytorch_model.bin" if os.path.exists(os.path.join(hf_dir, "pytorch_model.bin")) else ""
        raise InputError(f"{hf_dir}: no model.safetensors or model.safetensors.index.json next to config.json" +
                         (" (pytorch_model.bin is read for GPT-2 only: save with safe_serialization=True)" if other else ""))
    try:
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
        if not all(isinstance(name, str) for name in files):
            raise TypeError("a file name is not a string")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise InputError(f"{index_path}: not a readable shard index ({e})")
    found = {}
    for name in files:
        shard = os.path.join(hf_dir, name)
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise InputError(f"{index_path}: shard {json.dumps(name)} is not a file name (expected one in the folder)")
        if not os.path.isfile(shard):
            raise InputError(f"{shard}: missing (a shard that {os.path.basename(index_path)} names)")
        for tensor, entry in read_safetensors_header(shard).items():
            if tensor in found:
                raise InputError(f"{shard}: tensor {tensor} is also in {found[tensor][0]}")
            found[tensor] = (shard, entry)
    return found, index_path


def llama_writer(c, index, source):
    """Checks every tensor that LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM of the shape has (names,
    shapes, nothing extra), then -> {our tensor: a function giving its rows in pieces}, each piece one HF tensor
    read when it is written (the vocabulary padded with zero rows)."""
    V, Vp, L, C = c["vocab"], c["padded_vocab"], c["layers"], c["channels"]
    expected = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    per_layer = {}
    for ours, _ in LLAMA_BLOCK:
        if ours == "qkvb" and not c["qkv_bias"]:
            continue
        inputs = C if ours != "fcprojw" else c["ffn"]
        parts = llama_parts(c, ours)
        per_layer[ours] = parts
        for name, rows in parts:
            shape = (C,) if ours in ("ln1w", "ln2w") else (rows,) if ours == "qkvb" else \
                (C, inputs) if rows is None else (rows, C)
            for l in range(L):
                expected[f"model.layers.{l}.{name}"] = shape
    head = "lm_head.weight"
    if not c["tied"]:
        expected[head] = (V, C)
    # bitsandbytes' NF4 weights: those with a quant state (its shape is the weight's; the stored tensor is packed)
    quantized = {name for name in expected if name + QUANT_STATE in index}
    if quantized and not c["quantized"]:
        raise InputError(f"{source}: tensor {min(quantized)}{QUANT_STATE} is bitsandbytes' NF4 quant state, but config.json "
                         f"has no quantization_config")
    for name, shape in expected.items():
        if name not in index:
            raise InputError(f"{source}: missing tensor {name} (expected shape {shape} for the config's {L} layers, "
                             f"{C} channels, {c['kv_heads']} key/value heads, {c['ffn']} MLP units, vocab {V})")
        if name not in quantized and index[name][1][1] != shape:
            raise InputError(f"{source}: tensor {name} has shape {index[name][1][1]}, expected {shape}")
    rotary = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")  # a buffer older checkpoints store
    companion = re.compile(r"(.*\.weight)\.(absmax|quant_map|nested_absmax|nested_quant_map|quant_state\.bitsandbytes__nf4)$")
    extra = sorted(n for n in set(index) - set(expected) if not rotary.match(n) and n != head and
                   not ((m := companion.match(n)) and m.group(1) in quantized))
    if extra:
        raise InputError(f"{source}: unexpected tensor {extra[0]}{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}"
                         f" (expected only {ARCHITECTURES[c['hf_type']]}'s" +
                         (", without biases)" if not c["qkv_bias"] else ", biases on q, k, v only)"))
    if c["tied"] and head in index:
        # some checkpoints store the tied head: accepted when it is embed_tokens, bit for bit
        if index[head][1][1] != (V, C) or not np.array_equal(load(index, head), load(index, "model.embed_tokens.weight")):
            raise InputError(f"{source}: lm_head.weight differs from model.embed_tokens.weight but "
                             f"tie_word_embeddings is true")

    def weight(name):  # a float tensor, or bitsandbytes' NF4 weight dequantized
        return bnb_nf4_weight(index, name, expected[name], source) if name in quantized else load(index, name)

    def vocab(name):
        def pieces():
            yield weight(name)
            yield np.zeros((Vp - V, C), dtype=np.float32)
        return pieces

    def block(parts):
        def pieces():
            for l in range(L):
                for name, _ in parts:
                    yield weight(f"model.layers.{l}.{name}")
        return pieces

    writer = {"wte": vocab("model.embed_tokens.weight"), "lnfw": lambda: [load(index, "model.norm.weight")]}
    writer.update({ours: block(parts) for ours, parts in per_layer.items()})
    if not c["tied"]:
        writer["lm_head"] = vocab(head)
    return writer


def load(index, name):
    path, entry = index[name]
    return load_tensor(path, entry)


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
    usage = ("usage: import_hf.py HF_DIR MODEL.bin [--bf16]  (Hugging Face GPT-2, Llama, Qwen2 or Mistral folder -> "
             "model file, fp32 unless --bf16)")
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
        if c.get("family") == "llama":
            index, source = safetensors_index(hf_dir)
            t = llama_writer(c, index, source)
        else:
            tensors, source = read_tensors(hf_dir)
            t = to_llmc(c, tensors, source)
        write_model_file(out, c, t, bf16)
    except InputError as e:
        print(f"import_hf.py: error: {e}", file=sys.stderr)
        return 1
    precision = f"version {5 if bf16 else 3} ({'bf16' if bf16 else 'fp32'})"
    if c.get("family") == "llama":
        padding = (c["padded_vocab"] - c["vocab"]) * c["channels"] * (1 if c["tied"] else 2)
        params = sum(int(np.prod(s)) for _, s in file_tensor_shapes(c)) - padding
        scaling = (f", llama3 rope scaling {c['rope_factor']:g}/{c['rope_low']:g}/{c['rope_high']:g}/{c['rope_positions']}"
                   if c["rope_factor"] else "")
        print(f"wrote {out}: Llama-family model file {precision} from {source} ({c['hf_type']}): {c['layers']} layers, "
              f"{c['heads']} heads ({c['kv_heads']} key/value), {c['channels']} channels, {c['ffn']} MLP units, "
              f"max T {c['max_seq_len']}, vocab {c['vocab']} (padded {c['padded_vocab']}), "
              f"{'tied' if c['tied'] else 'untied'} head{', q/k/v biases' if c['qkv_bias'] else ''}, "
              f"RMSNorm eps {c['norm_eps']:g}, rope theta {c['rope_theta']:g}{scaling}: {params:,} parameters")
        return 0
    params = sum(a.size for a in t.values()) - (c["padded_vocab"] - c["vocab"]) * c["channels"]
    print(f"wrote {out}: llm.c model file {precision} from {source}: "
          f"{c['layers']} layers, {c['heads']} heads, {c['channels']} channels, max T {c['max_seq_len']}, "
          f"vocab {c['vocab']} (padded {c['padded_vocab']}): {params:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
