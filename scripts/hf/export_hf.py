#!/usr/bin/env python3
"""llm.c model file (fp32 or bf16) -> Hugging Face transformers GPT-2 folder; our Llama-family model file ->
LlamaForCausalLM (Qwen2ForCausalLM when it has q/k/v biases) folder.

    python3 scripts/hf/export_hf.py MODEL.bin OUT_DIR

GPT-2: OUT_DIR gets config.json, model.safetensors and the GPT-2 tokenizer (vocab.json, merges.txt: OpenAI's
encoder.json and vocab.bpe from data/gpt2 under the names transformers reads, tokenizer_config.json), and
loads with GPT2LMHeadModel.from_pretrained(OUT_DIR) and AutoTokenizer.from_pretrained(OUT_DIR).
Llama family: config.json (model_type llama, or qwen2 with q/k/v biases), generation_config.json and
model.safetensors; no tokenizer (the file does not name one), bos/eos null. qkvw's rows split into q_proj, k_proj,
v_proj, fcw's into gate_proj and up_proj; the rotary layout is transformers' (rotate_half), so no row moves.

GPT-2:
- HF's Conv1D weights are (in, out): c_attn, attn.c_proj, c_fc and mlp.c_proj are llm.c's (out, in) transposed.
- The padded vocabulary rows (V..Vp-1 of wte) are dropped; lm_head is tied to wte (not stored, as
  save_pretrained does it).
- Tensors keep the file's precision: an fp32 file gives F32, a bf16 file BF16 (the bf16 values exactly, half
  the size; transformers upcasts them when asked for float32).
- The folder is built next to OUT_DIR and renamed into place; an existing OUT_DIR is replaced only when it
  holds nothing but the files an export writes.

Needs only numpy: the safetensors file is written by write_safetensors below. import_hf.py shares the
model-file and safetensors code of this file. Bad input: one line on stderr, exit 1, nothing written.
"""
import json
import math
import os
import shutil
import struct
import sys
import tempfile

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("numpy", "numpy"),):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: scripts/hf/export_hf.py needs {_module}{_why}: pip install {_pip}")
import numpy as np  # noqa: E402

MODEL_MAGIC = 20240326
LLAMA_MAGIC = 20261207  # model/model_file.h kLlamaModelMagic: the family's shape in header ints 8-16
VERSION_FP32, VERSION_BF16 = 3, 5
HEADER_INTS = 256
MAX_LAYERS, MAX_CHANNELS, MAX_SEQ_LEN, MAX_VOCAB = 1024, 16384, 1 << 20, 1 << 20  # model/config.h's kMaxLayers, ...
GPT2_EOT = 50256
TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "gpt2")
# files an export writes: an OUT_DIR holding only these (or nothing) may be replaced
EXPORT_FILES = {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json",
                "special_tokens_map.json", "generation_config.json"}

# Per-layer tensors: llm.c name, HF name inside h.{l}., and whether HF stores it transposed (Conv1D, (in, out)).
BLOCK_TENSORS = [
    ("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
    ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
    ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
    ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
    ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
    ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False),
]


class InputError(Exception):
    """Bad input: main() prints it as one line on stderr and exits 1. Control characters that the input put into the
    message (a tensor name's newline) are escaped, so that it stays one line."""

    def __init__(self, message):
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in message))


def pad_vocab(vocab_size):
    return (vocab_size + 127) // 128 * 128


def config_problem(c):
    """model/config.h's config_problem(): '' when train_gpt can run the shape, else why not."""
    if min(c["layers"], c["heads"], c["channels"], c["max_seq_len"], c["vocab"]) <= 0:
        return "layers, heads, channels, max sequence length and vocabulary must be positive"
    for name, value, limit in (("layers", c["layers"], MAX_LAYERS), ("channels", c["channels"], MAX_CHANNELS),
                               ("max sequence length", c["max_seq_len"], MAX_SEQ_LEN),
                               ("padded vocabulary", c["padded_vocab"], MAX_VOCAB)):
        if value > limit:
            return f"{name} ({value}) must be at most {limit}"
    if c["channels"] % c["heads"]:
        return f"channels ({c['channels']}) must be divisible by heads ({c['heads']})"
    if c["channels"] // c["heads"] not in (64, 128):
        return (f"head size channels/heads = {c['channels']}/{c['heads']} must be 64 (all GPT-2 sizes) "
                f"or 128 (the flash attention kernels)")
    if c["padded_vocab"] < c["vocab"] or c["padded_vocab"] % 128:
        return f"padded vocabulary ({c['padded_vocab']}) must be >= vocabulary ({c['vocab']}) and a multiple of 128"
    if not is_llama(c):
        return ""
    if c["kv_heads"] <= 0 or c["heads"] % c["kv_heads"]:
        return f"key/value heads ({c['kv_heads']}) must divide the {c['heads']} attention heads"
    if c["ffn"] <= 0 or c["ffn"] % 8 or c["ffn"] > 4 * MAX_CHANNELS:
        return f"MLP hidden units ({c['ffn']}) must be a positive multiple of 8, at most {4 * MAX_CHANNELS}"
    if not 0.0 < c["norm_eps"] < 1.0:
        return "the RMSNorm's epsilon must be in (0, 1)"
    if not c["rope_theta"] > 1.0:
        return "the rotary base theta must be above 1"
    if c["rope_factor"] != 0.0 and not (c["rope_factor"] >= 1.0 and 0.0 < c["rope_low"] < c["rope_high"] and
                                        c["rope_positions"] > 0):
        return ("Llama 3's rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
                "original positions > 0")
    return ""


def is_llama(c):
    return c.get("family") == "llama"


def f32(x):
    """x as the float32 that the model file's header holds."""
    return float(np.float32(x))


def f32_text(x):
    """The shortest decimal that reads back as the same float32 (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def llama_shape(c):
    """(q rows, k or v rows) of qkvw: C, and KV x head size."""
    return c["channels"], c["kv_heads"] * (c["channels"] // c["heads"])


def file_tensor_shapes(c):
    """[(name, shape)] of an llm.c model file, in file order (docs/formats.md; model/config.h
    ParameterLayout::for_each_file_run)."""
    V, T, L, C = c["padded_vocab"], c["max_seq_len"], c["layers"], c["channels"]
    if is_llama(c):
        Q, KV = llama_shape(c)
        F = c["ffn"]
        shapes = [("wte", (V, C)), ("ln1w", (L, C)), ("qkvw", (L, Q + 2 * KV, C))]
        if c["qkv_bias"]:
            shapes.append(("qkvb", (L, Q + 2 * KV)))
        shapes += [("attprojw", (L, C, C)), ("ln2w", (L, C)), ("fcw", (L, 2 * F, C)), ("fcprojw", (L, C, F)),
                   ("lnfw", (C,))]
        return shapes + ([] if c["tied"] else [("lm_head", (V, C))])
    per_layer = {"ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C), "qkvb": (3 * C,), "attprojw": (C, C),
                 "attprojb": (C,), "ln2w": (C,), "ln2b": (C,), "fcw": (4 * C, C), "fcb": (4 * C,),
                 "fcprojw": (C, 4 * C), "fcprojb": (C,)}
    return ([("wte", (V, C)), ("wpe", (T, C))] + [(n, (L,) + s) for n, s in per_layer.items()] +
            [("lnfw", (C,)), ("lnfb", (C,))])


def bf16_bits(x):
    """float32 -> bf16 bit patterns (uint16), round to nearest even; inf/nan truncated (train_gpt's float_to_bf16_bits)."""
    bits = np.ascontiguousarray(x, dtype="<f4").view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return np.where(special, bits >> 16, rounded).astype("<u2")


def bf16_to_f32(bits):
    # a uint32 shift: with a Python int a 0-d array (a scalar tensor) would widen to int64 and not view as float32
    return (np.asarray(bits, dtype=np.uint32) << np.uint32(16)).view(np.float32)


def read_model_file(path):
    """-> (config dict, version, {name: array}): arrays in the file's shapes, float32 (version 3) or uint16
    bf16 bit patterns (version 5). Checks what train_gpt's read_model_header/read_model_file check."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(4 * HEADER_INTS)
    except OSError as e:
        raise InputError(f"{path}: cannot read model file: {e.strerror}")
    if len(head) < 4 * HEADER_INTS:
        raise InputError(f"{path}: too short for a model header ({size} bytes, expected at least {4 * HEADER_INTS})")
    h = np.frombuffer(head, dtype="<i4")
    if h[0] not in (MODEL_MAGIC, LLAMA_MAGIC):
        raise InputError(f"{path}: bad magic {h[0]} (expected {MODEL_MAGIC}, an llm.c GPT-2 model file, or "
                         f"{LLAMA_MAGIC}, a Llama-family one)")
    version = int(h[1])
    if version not in (VERSION_FP32, VERSION_BF16):
        raise InputError(f"{path}: unsupported model version {version} (expected 3 = fp32 or 5 = bf16)")
    c = dict(max_seq_len=int(h[2]), vocab=int(h[3]), layers=int(h[4]), heads=int(h[5]), channels=int(h[6]),
             padded_vocab=int(h[7]))
    if h[0] == LLAMA_MAGIC:
        if h[10] & ~3:
            raise InputError(f"{path}: unknown flags {h[10]} in header int 10 (1: q, k, v biases; 2: tied head)")
        floats = h.view("<f4")
        c.update(family="llama", kv_heads=int(h[8]), ffn=int(h[9]), qkv_bias=bool(h[10] & 1), tied=bool(h[10] & 2),
                 norm_eps=float(floats[11]), rope_theta=float(floats[12]), rope_factor=float(floats[13]),
                 rope_low=float(floats[14]), rope_high=float(floats[15]), rope_positions=int(h[16]))
    problem = config_problem(c)
    if problem:
        raise InputError(f"{path}: {problem}")
    shapes = file_tensor_shapes(c)
    count = sum(int(np.prod(s)) for _, s in shapes)
    elem = 4 if version == VERSION_FP32 else 2
    expected = 4 * HEADER_INTS + elem * count
    if size != expected:
        raise InputError(f"{path}: size {size} bytes, expected {expected} for its header's shape "
                         f"({count} {'fp32' if elem == 4 else 'bf16'} values)")
    raw = np.fromfile(path, dtype="<f4" if elem == 4 else "<u2", offset=4 * HEADER_INTS, count=count)
    tensors, offset = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        tensors[name] = raw[offset:offset + n].reshape(shape)
        offset += n
    return c, version, tensors


def model_header(c, bf16):
    """The 256 header ints (model/model_file.h fill_model_header); the checksum and run identity slots 0."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [LLAMA_MAGIC if is_llama(c) else MODEL_MAGIC, VERSION_BF16 if bf16 else VERSION_FP32,
                  c["max_seq_len"], c["vocab"], c["layers"], c["heads"], c["channels"], c["padded_vocab"]]
    if is_llama(c):
        header[8:11] = [c["kv_heads"], c["ffn"], (1 if c["qkv_bias"] else 0) | (2 if c["tied"] else 0)]
        header[11:16] = np.array([c["norm_eps"], c["rope_theta"], c["rope_factor"], c["rope_low"], c["rope_high"]],
                                 dtype="<f4").view("<i4")
        header[16] = c["rope_positions"]
    return header


def write_model_file(path, c, tensors, bf16):
    """Writes an llm.c model file (version 5 when bf16, else 3) through path.tmp and a rename. tensors[name]: a
    float32 array of the file's shape, or a function giving its rows in pieces (arrays, in order), so that an import
    holds one source tensor at a time."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(model_header(c, bf16).tobytes())
            for name, shape in file_tensor_shapes(c):
                pieces, written = tensors[name], 0
                for t in (pieces() if callable(pieces) else [pieces]):
                    t = np.asarray(t, dtype=np.float32)
                    f.write(bf16_bits(t).tobytes() if bf16 else t.astype("<f4").tobytes())
                    written += t.size
                assert written == math.prod(shape), (name, written, shape)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise InputError(f"{tmp}: cannot write: {e.strerror}")
    except BaseException:  # an InputError while a piece is read: nothing stays under either name
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# ---- safetensors: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}
# (offsets relative to the byte buffer that follows), then the tensors' bytes, contiguous, in offset order.

# U8: bitsandbytes' packed 4-bit weights and their quant state (import_hf.py reads them; load_tensor does not)
SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "U8": "u1"}


def write_safetensors(path, named, dtype, metadata=None):
    """named: [(name, array)] all written as one dtype ("F32" or "F16": float arrays, converted; "BF16": uint16 bit
    patterns; "U8": bytes), or as dtype[name] when dtype is a dict."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    types = dtype if isinstance(dtype, dict) else {name: dtype for name, _ in named}
    for name, a in named:
        nbytes = a.size * np.dtype(SAFETENSORS_DTYPES[types[name]]).itemsize
        header[name] = {"dtype": types[name], "shape": list(a.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned (as the safetensors library writes it)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, a in named:
            f.write(np.ascontiguousarray(a, dtype=SAFETENSORS_DTYPES[types[name]]).tobytes())


def read_safetensors(path):
    """-> {name: float32 array} (F32, F16, BF16, F64 tensors)."""
    return {name: load_tensor(path, entry) for name, entry in read_safetensors_header(path).items()}


def load_tensor(path, entry):
    """One tensor of read_safetensors_header's entries as float32 (bf16 and f16 widen exactly)."""
    dtype, shape, offset = entry
    if dtype == "U8":
        raise InputError(f"{path}: a tensor of dtype U8 where a float tensor (F32, F16 or BF16) belongs")
    a = load_stored(path, entry)
    return bf16_to_f32(a) if dtype == "BF16" else a.astype(np.float32)


def load_stored(path, entry):
    """One tensor as it is stored (BF16: uint16 bit patterns; U8: bytes)."""
    dtype, shape, offset = entry
    try:
        return np.fromfile(path, dtype=np.dtype(SAFETENSORS_DTYPES[dtype]), offset=offset, count=math.prod(shape)).reshape(shape)
    except (OSError, ValueError) as e:  # the file changed since its header was read
        raise InputError(f"{path}: cannot read a tensor: {getattr(e, 'strerror', None) or e}")


def read_safetensors_header(path):
    """-> {name: (dtype, shape, byte offset in the file)}, every entry checked to lie inside the file; no data read."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8).ljust(8, b"\0"))[0]
            if size < 8 or n > size - 8:
                raise InputError(f"{path}: not a safetensors file (header length {n}, file size {size} bytes)")
            header = json.loads(f.read(n))
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}")
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply for json
        raise InputError(f"{path}: not a safetensors file (its header is not JSON)")
    if not isinstance(header, dict):
        raise InputError(f"{path}: not a safetensors file (its header is a JSON {type(header).__name__}, not an object)")

    def natural(x):  # a JSON integer >= 0 (not a bool)
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, offsets = (info.get("dtype"), info.get("shape"), info.get("data_offsets")) if isinstance(info, dict) else (None,) * 3
        if not (isinstance(dtype, str) and isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2 and
                all(natural(x) for x in shape + offsets)):
            raise InputError(f"{path}: tensor {name}: malformed header entry {info}")
        begin, end = offsets
        if dtype not in SAFETENSORS_DTYPES:
            raise InputError(f"{path}: tensor {name} has dtype {dtype} (expected F32, F16, BF16, or U8 for bitsandbytes' 4-bit weights)")
        np_dtype = np.dtype(SAFETENSORS_DTYPES[dtype])
        count = math.prod(shape)  # exact: numpy's product would wrap around at 2^64
        if end - begin != count * np_dtype.itemsize or 8 + n + end > size:
            raise InputError(f"{path}: tensor {name}: data_offsets {begin}..{end} do not hold {dtype} {shape} "
                             f"inside the file ({size} bytes)")
        tensors[name] = (dtype, tuple(shape), 8 + n + begin)
    return tensors


# ---- llm.c -> HF

def hf_config(c, dtype):
    V = c["vocab"]
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": V, "n_positions": c["max_seq_len"], "n_ctx": c["max_seq_len"],
        "n_embd": c["channels"], "n_layer": c["layers"], "n_head": c["heads"], "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        # train_gpt trains without dropout; set these to 0.1 (GPT-2's values) to fine-tune as OpenAI did
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True, "use_cache": True,
        "torch_dtype": "bfloat16" if dtype == "BF16" else "float32",
    }
    if V > GPT2_EOT:
        config["bos_token_id"] = config["eos_token_id"] = GPT2_EOT
    return config


def hf_tensors(c, t):
    """[(HF name, array)] of GPT2LMHeadModel's state dict (without the tied lm_head) from the file's tensors."""
    out = [("transformer.wte.weight", t["wte"][:c["vocab"]]), ("transformer.wpe.weight", t["wpe"])]
    for l in range(c["layers"]):
        for ours, theirs, transposed in BLOCK_TENSORS:
            a = t[ours][l]
            out.append((f"transformer.h.{l}.{theirs}", np.ascontiguousarray(a.T) if transposed else a))
    out += [("transformer.ln_f.weight", t["lnfw"]), ("transformer.ln_f.bias", t["lnfb"])]
    return out


# Per-layer tensors of the Llama family: our name -> [(HF name inside model.layers.{l}., rows)] in the order of
# our rows ("qkv" and "fc" are filled in by llama_rows for the shape).
LLAMA_BLOCK = [("ln1w", "input_layernorm.weight"), ("qkvw", "self_attn.{}_proj.weight"), ("qkvb", "self_attn.{}_proj.bias"),
               ("attprojw", "self_attn.o_proj.weight"), ("ln2w", "post_attention_layernorm.weight"),
               ("fcw", "mlp.{}_proj.weight"), ("fcprojw", "mlp.down_proj.weight")]


def llama_parts(c, ours):
    """[(HF name pattern, rows)] that our per-layer tensor `ours` is cut into, in row order."""
    Q, KV = llama_shape(c)
    pattern = dict(LLAMA_BLOCK)[ours]
    if ours in ("qkvw", "qkvb"):
        return [(pattern.format("q"), Q), (pattern.format("k"), KV), (pattern.format("v"), KV)]
    if ours == "fcw":
        return [(pattern.format("gate"), c["ffn"]), (pattern.format("up"), c["ffn"])]
    return [(pattern, None)]


def hf_llama_config(c, dtype):
    """config.json of LlamaForCausalLM, or of Qwen2ForCausalLM for q/k/v biases (Qwen2's attention has them and no
    o_proj bias; Llama's attention_bias would put one on o_proj too). RoPE as rope_theta and rope_scaling, which
    transformers 4.x reads and 5.x converts to rope_parameters."""
    qwen = c["qkv_bias"]
    config = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"], "model_type": "qwen2" if qwen else "llama",
        "vocab_size": c["vocab"], "hidden_size": c["channels"], "intermediate_size": c["ffn"],
        "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
        "hidden_act": "silu", "max_position_embeddings": c["max_seq_len"], "rms_norm_eps": f32_text(c["norm_eps"]),
        "rope_theta": f32_text(c["rope_theta"]), "rope_scaling": None,
        "tie_word_embeddings": c["tied"], "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        # the file names no tokenizer: null rather than the configs' defaults (Llama's 1 and 2, Qwen2's none)
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
        "torch_dtype": "bfloat16" if dtype == "BF16" else "float32",
    }
    if qwen:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=c["layers"])
    else:
        config.update(attention_bias=False, mlp_bias=False, head_dim=c["channels"] // c["heads"])
    if c["rope_factor"] != 0.0:
        config["rope_scaling"] = {"rope_type": "llama3", "factor": f32_text(c["rope_factor"]),
                                  "low_freq_factor": f32_text(c["rope_low"]), "high_freq_factor": f32_text(c["rope_high"]),
                                  "original_max_position_embeddings": c["rope_positions"]}
    return config


def hf_llama_tensors(c, t):
    """[(HF name, array)] of LlamaForCausalLM's / Qwen2ForCausalLM's state dict from the file's tensors (views of
    them: rows of a row-major array are contiguous, so nothing is copied)."""
    V = c["vocab"]
    out = [("model.embed_tokens.weight", t["wte"][:V])]
    for l in range(c["layers"]):
        for ours, _ in LLAMA_BLOCK:
            if ours == "qkvb" and not c["qkv_bias"]:
                continue
            row = 0
            for name, rows in llama_parts(c, ours):
                a = t[ours][l]
                out.append((f"model.layers.{l}.{name}", a if rows is None else a[row:row + rows]))
                row += rows or 0
    out.append(("model.norm.weight", t["lnfw"]))
    if not c["tied"]:
        out.append(("lm_head.weight", t["lm_head"][:V]))
    return out


def tokenizer_files(c):
    """{file name in the HF folder: bytes} for the GPT-2 tokenizer (only for GPT-2's 50257-token vocabulary)."""
    files = {}
    for ours, theirs in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        path = os.path.join(TOKENIZER_DIR, ours)
        try:
            with open(path, "rb") as f:
                files[theirs] = f.read()
        except OSError as e:
            raise InputError(f"{os.path.normpath(path)}: cannot read the GPT-2 tokenizer: {e.strerror}")
    eot = "<|endoftext|>"
    special = {"bos_token": eot, "eos_token": eot, "unk_token": eot}
    files["tokenizer_config.json"] = json.dumps(dict(
        tokenizer_class="GPT2Tokenizer", model_max_length=c["max_seq_len"], add_prefix_space=False,
        add_bos_token=False, clean_up_tokenization_spaces=False, errors="replace", **special), indent=2).encode()
    files["special_tokens_map.json"] = json.dumps(special, indent=2).encode()
    return files


def replaceable(out_dir):
    """OUT_DIR may be replaced: absent, or a folder holding only files an export writes."""
    if not os.path.lexists(out_dir):
        return True
    if not os.path.isdir(out_dir) or os.path.islink(out_dir):
        raise InputError(f"{out_dir}: exists and is not a folder (expected a new or earlier export folder)")
    other = sorted(set(os.listdir(out_dir)) - EXPORT_FILES)
    if other:
        raise InputError(f"{out_dir}: exists and holds other files than an export ({', '.join(other[:3])}"
                         f"{', ...' if len(other) > 3 else ''}): not replacing it")
    return True


def export(model_path, out_dir):
    c, version, t = read_model_file(model_path)
    out_dir = os.path.normpath(out_dir)
    replaceable(out_dir)
    dtype = "BF16" if version == VERSION_BF16 else "F32"
    if is_llama(c):
        config = hf_llama_config(c, dtype)
        files = {"generation_config.json": json.dumps({"_from_model_config": True, "bos_token_id": None,
                                                        "eos_token_id": None}, indent=2).encode() + b"\n"}
        named = hf_llama_tensors(c, t)
    else:
        config = hf_config(c, dtype)
        files = tokenizer_files(c) if c["vocab"] == GPT2_EOT + 1 else {}
        named = hf_tensors(c, t)
    parent = os.path.dirname(out_dir) or "."
    try:
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(out_dir) + ".tmp", dir=parent)
    except OSError as e:
        raise InputError(f"{parent}: cannot create a folder there: {e.strerror}")
    try:
        write_safetensors(os.path.join(tmp, "model.safetensors"), named, dtype, {"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        os.chmod(tmp, 0o755)
        if os.path.exists(out_dir):  # an earlier export: swap, then remove it
            old = tempfile.mkdtemp(prefix="." + os.path.basename(out_dir) + ".old", dir=parent)
            os.rename(out_dir, os.path.join(old, "x"))
            try:
                os.rename(tmp, out_dir)
            except OSError:
                os.rename(os.path.join(old, "x"), out_dir)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"{out_dir}: cannot write the export: {e.strerror}")
    params = sum(a.size for _, a in named)
    heads = f"{c['heads']} heads" + (f" ({c['kv_heads']} key/value)" if is_llama(c) else "")
    if is_llama(c):
        what = "config.json, generation_config.json, model.safetensors, no tokenizer (the model file names none)"
    else:
        what = "config.json, model.safetensors" + (", tokenizer files" if files else ", no tokenizer (not GPT-2's vocabulary)")
    print(f"wrote {out_dir}: {config['architectures'][0]}, {c['layers']} layers, {heads}, {c['channels']} channels, "
          f"max T {c['max_seq_len']}, vocab {c['vocab']} (padding rows {c['vocab']}..{c['padded_vocab'] - 1} dropped): "
          f"{params:,} parameters, {dtype} (from a {'bf16' if dtype == 'BF16' else 'fp32'} model file); {what}")


def main(argv):
    usage = ("usage: export_hf.py MODEL.bin OUT_DIR  (llm.c GPT-2 or our Llama-family model file, fp32 or bf16 -> "
             "Hugging Face folder)")
    if argv in (["-h"], ["--help"]):
        print(usage)
        return 0
    if len(argv) != 2 or argv[0].startswith("-") or argv[1].startswith("-"):
        print(usage, file=sys.stderr)
        return 1
    try:
        export(argv[0], argv[1])
    except InputError as e:
        print(f"export_hf.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
