#!/usr/bin/env python3
"""Plain-PyTorch reference of the Llama family (Llama 3, Qwen 2.5, SmolLM2, Mistral) for the C++/CUDA trainer.

Builds a random model of the given shape and
  --model-out FILE        writes it as our Llama-family model file (docs/formats.md), read back to check it
  --state-out FILE        writes a debug state in gpt2_reference.py's format (docs/formats.md "Debug state"): the
                          batch, step-0 logits, loss, grad norm and every gradient in model-file order, and the
                          losses of --steps AdamW steps on that batch
  --check-transformers    compares logits, loss and every gradient with transformers' LlamaForCausalLM
                          (Qwen2ForCausalLM with --qkv-bias 1) holding the same weights, in fp32
  --self-test             checks this file on the CPU without transformers (GQA, RoPE, finite differences, files)

The model: token embedding; per block x += o(attention(rope(q), rope(k), v)) over rmsnorm(x) and
x += down(silu(gate) * up) over rmsnorm(x); a final rmsnorm; the LM head (tied to the embedding or its own).
Examples:
  llama_reference.py --layers 2 --channels 256 --heads 4 --kv-heads 2 --ffn 512 --vocab-size 1000 \\
      --batch-size 2 --seq-len 64 --model-out model.bin --state-out state.bin
  llama_reference.py --arch smollm2-135m --layers 2 --vocab-size 2048 --batch-size 1 --seq-len 32 --check-transformers
  llama_reference.py --self-test

Runs on torch 1.13 (CPU) and torch 2.x (CUDA).
"""
import argparse
import contextlib
import io
import math
import os
import sys
import tempfile

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("numpy", "numpy"), ("torch", "torch")):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: scripts/reference/llama_reference.py needs {_module}{_why}: pip install {_pip}")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The optimizer, clipping, headers and debug-state constants are gpt2_reference.py's, so both debug states follow
# one definition (docs/formats.md).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as g2  # noqa: E402
from gpt2_reference import InputError, f32_bits, header_bytes, padded_vocab_size  # noqa: E402

LLAMA_MODEL_MAGIC = 20261207  # model/model_file.h kLlamaModelMagic
MODEL_VERSION_FP32, MODEL_VERSION_BF16 = 3, 5
GPT2_VOCAB = 50257

# model/config.h config_from_preset: layers, channels, heads, kv heads, ffn, vocab, max seq len, theta, eps,
# Llama 3 rope factor (low 1, high 4, 8192 positions), tied head, q/k/v biases.
PRESETS = {
    "llama3-1b": (16, 2048, 32, 8, 8192, 128256, 131072, 500000.0, 1e-5, 32.0, True, False),
    "llama3-3b": (28, 3072, 24, 8, 8192, 128256, 131072, 500000.0, 1e-5, 32.0, True, False),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 131072, 500000.0, 1e-5, 8.0, False, False),
    "smollm2-135m": (30, 576, 9, 3, 1536, 49152, 8192, 100000.0, 1e-5, 0.0, True, False),
    "smollm2-360m": (32, 960, 15, 5, 2560, 49152, 8192, 100000.0, 1e-5, 0.0, True, False),
    "qwen2.5-0.5b": (24, 896, 14, 2, 4864, 151936, 32768, 1000000.0, 1e-6, 0.0, True, True),
    "qwen2.5-7b": (28, 3584, 28, 4, 18944, 152064, 131072, 1000000.0, 1e-6, 0.0, False, True),
}
# Their published parameter counts (test/test_layout.cpp): the file's tensors must add up to these.
PRESET_PARAMETERS = {"llama3-1b": 1235814400, "llama3-3b": 3212749824, "llama3-8b": 8030261248,
                     "smollm2-135m": 134515008, "smollm2-360m": 361821120, "qwen2.5-0.5b": 494032768,
                     "qwen2.5-7b": 7615616512}
DECAY_NAMES = {"wte", "qkvw", "attprojw", "fcw", "fcprojw", "lm_head"}  # 2-D tensors (docs/formats.md AdamW)


def f32(x):
    """x as the float32 the model file's header holds (every float of the model is used at that value)."""
    return float(np.float32(x))


class Config:
    """A Llama-family shape: the fields of our model file's header (model/config.h ModelConfig)."""

    def __init__(self, layers, channels, heads, kv_heads, ffn, vocab_size, max_seq_len, rope_theta=10000.0,
                 norm_eps=1e-5, rope_scaling=(0.0, 1.0, 4.0, 8192), tied_head=True, qkv_bias=False, padded=None):
        self.num_layers, self.channels, self.num_heads, self.kv_heads, self.ffn = layers, channels, heads, kv_heads, ffn
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len
        self.padded_vocab_size = padded if padded is not None else padded_vocab_size(vocab_size)
        self.rope_theta, self.norm_eps = f32(rope_theta), f32(norm_eps)
        factor, low, high, positions = rope_scaling
        self.rope_factor, self.rope_low, self.rope_high = f32(factor), f32(low), f32(high)
        self.rope_positions = int(positions)
        self.tied_head, self.qkv_bias = bool(tied_head), bool(qkv_bias)

    @property
    def head_size(self):
        return self.channels // self.num_heads

    @property
    def qkv_rows(self):
        return self.channels + 2 * self.kv_heads * self.head_size

    def problem(self, strict=True):
        """Why the trainer cannot take this shape (model/config.h config_problem), or ''. strict=False (the
        self-test's tiny models) keeps only what the math here needs."""
        if min(self.num_layers, self.channels, self.num_heads, self.kv_heads, self.ffn, self.vocab_size,
               self.max_seq_len) <= 0:
            return "layers, channels, heads, kv heads, ffn, vocabulary and max sequence length must be positive"
        if self.channels % self.num_heads:
            return f"channels ({self.channels}) must be divisible by heads ({self.num_heads})"
        if self.head_size % 2:
            return f"head size {self.head_size} must be even (rotary pairs)"
        if self.num_heads % self.kv_heads:
            return f"key/value heads ({self.kv_heads}) must divide the {self.num_heads} attention heads"
        if self.padded_vocab_size < self.vocab_size:
            return f"padded vocabulary ({self.padded_vocab_size}) must be >= vocabulary ({self.vocab_size})"
        if not 0.0 < self.norm_eps < 1.0:
            return "the RMSNorm's epsilon must be in (0, 1)"
        if not self.rope_theta > 1.0:
            return "the rotary base theta must be above 1"
        if self.rope_factor != 0.0 and not (self.rope_factor >= 1.0 and 0.0 < self.rope_low < self.rope_high
                                            and self.rope_positions > 0):
            return ("Llama 3's rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
                    "original positions > 0")
        if not strict:
            return ""
        if self.head_size not in (64, 128):
            return (f"head size channels/heads = {self.channels}/{self.num_heads} must be 64 or 128 "
                    f"(the trainer's attention kernels)")
        if self.padded_vocab_size % 128:
            return f"padded vocabulary ({self.padded_vocab_size}) must be a multiple of 128"
        if self.ffn % 8:
            return f"MLP hidden units ({self.ffn}) must be a multiple of 8"
        return ""

    def header(self, version):
        """Ints 0-16 of the model file's header (model/model_file.h fill_model_header)."""
        return [LLAMA_MODEL_MAGIC, version, self.max_seq_len, self.vocab_size, self.num_layers, self.num_heads,
                self.channels, self.padded_vocab_size, self.kv_heads, self.ffn,
                (1 if self.qkv_bias else 0) | (2 if self.tied_head else 0), f32_bits(self.norm_eps),
                f32_bits(self.rope_theta), f32_bits(self.rope_factor), f32_bits(self.rope_low),
                f32_bits(self.rope_high), self.rope_positions]

    def file_tensors(self):
        """[(name, shape)] in model-file order (model/config.h ParameterLayout::for_each_file_run; the GPT-2-only
        tensors wpe, ln1b, attprojb, ln2b, fcb, fcprojb, lnfb have no elements in this family)."""
        L, C, Vp, F_ = self.num_layers, self.channels, self.padded_vocab_size, self.ffn
        shapes = [("wte", (Vp, C)), ("ln1w", (L, C)), ("qkvw", (L, self.qkv_rows, C))]
        if self.qkv_bias:
            shapes.append(("qkvb", (L, self.qkv_rows)))
        shapes += [("attprojw", (L, C, C)), ("ln2w", (L, C)), ("fcw", (L, 2 * F_, C)), ("fcprojw", (L, C, F_)),
                   ("lnfw", (C,))]
        if not self.tied_head:
            shapes.append(("lm_head", (Vp, C)))
        return shapes

    def num_parameters(self):
        return sum(math.prod(shape) for _, shape in self.file_tensors())

    def describe(self):
        rope = ("none" if self.rope_factor == 0 else
                f"{self.rope_factor:g}/{self.rope_low:g}/{self.rope_high:g}/{self.rope_positions}")
        return (f"L={self.num_layers} C={self.channels} heads={self.num_heads} kv={self.kv_heads} "
                f"D={self.head_size} ffn={self.ffn} V={self.vocab_size} (Vp {self.padded_vocab_size}) "
                f"theta={self.rope_theta:g} scaling={rope} eps={self.norm_eps:g} "
                f"head={'tied' if self.tied_head else 'untied'} qkv-bias={int(self.qkv_bias)}")


# ----------------------------------------------------------------------------------------------------------
# Model: transformers' Llama arithmetic (modeling_llama.py, modeling_rope_utils.py), op for op where it matters for
# bitwise-equal inputs (RoPE frequencies, the RMSNorm), with q/k/v and gate/up as one product each, as our file has.

def upcast(t):
    """At least float32: transformers upcasts half-precision norms, softmaxes and losses to float32; float64 (the
    self-test's finite differences) stays float64."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def rope_inv_freq(head_size, theta, factor=0.0, low=1.0, high=4.0, positions=8192):
    """RoPE's inverse frequencies in float32 as transformers computes them: rope_type "default", or "llama3"
    (_compute_llama3_parameters) when factor != 0; same ops, same Python scalar types, so equal bit for bit."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.int64).to(dtype=torch.float) / head_size))
    if factor == 0.0:
        return inv_freq
    low_freq_wavelen = positions / low
    high_freq_wavelen = positions / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (positions / wavelen - low) / (high - low)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """x (B, heads, T, D); cos, sin (B, T, D): dimension i pairs with i + D/2 (transformers' layout)."""
    return (x * cos.unsqueeze(1)) + (rotate_half(x) * sin.unsqueeze(1))


def repeat_kv(x, n_rep):
    """(B, KVH, T, D) -> (B, KVH * n_rep, T, D): query head h reads key/value head h // n_rep."""
    B, kvh, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, kvh, n_rep, T, D).reshape(B, kvh * n_rep, T, D)


def rmsnorm(x, weight, eps):
    """transformers' LlamaRMSNorm: normalised in float32 (or float64), cast back, then scaled."""
    dtype = x.dtype
    h = upcast(x)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, F_ = cfg.channels, cfg.ffn
        self.cfg = cfg
        self.ln1w = nn.Parameter(torch.ones(C))
        self.qkvw = nn.Parameter(torch.zeros(cfg.qkv_rows, C))  # rows [q (C); k (KV*D); v (KV*D)]
        self.qkvb = nn.Parameter(torch.zeros(cfg.qkv_rows)) if cfg.qkv_bias else None
        self.attprojw = nn.Parameter(torch.zeros(C, C))
        self.ln2w = nn.Parameter(torch.ones(C))
        self.fcw = nn.Parameter(torch.zeros(2 * F_, C))  # rows [gate (F); up (F)]
        self.fcprojw = nn.Parameter(torch.zeros(C, F_))

    def attention(self, x, cos, sin):
        """o(softmax(rope(q) rope(k)^T / sqrt(D) + causal) v) of x (B, T, C), already normalised."""
        cfg = self.cfg
        B, T, C = x.shape
        D, NH, KVH = cfg.head_size, cfg.num_heads, cfg.kv_heads
        q, k, v = F.linear(x, self.qkvw, self.qkvb).split([NH * D, KVH * D, KVH * D], dim=-1)
        q = q.view(B, T, NH, D).transpose(1, 2)
        k = k.view(B, T, KVH, D).transpose(1, 2)
        v = v.view(B, T, KVH, D).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = repeat_kv(k, NH // KVH), repeat_kv(v, NH // KVH)
        att = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(future, float("-inf"))
        att = F.softmax(upcast(att), dim=-1).to(q.dtype)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        return F.linear(y, self.attprojw)

    def mlp(self, x):
        gate, up = F.linear(x, self.fcw).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.fcprojw)

    def forward(self, x, cos, sin):
        x = x + self.attention(rmsnorm(x, self.ln1w, self.cfg.norm_eps), cos, sin)
        return x + self.mlp(rmsnorm(x, self.ln2w, self.cfg.norm_eps))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.zeros(cfg.padded_vocab_size, cfg.channels))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.lnfw = nn.Parameter(torch.ones(cfg.channels))
        self.lm_head = None if cfg.tied_head else nn.Parameter(torch.zeros(cfg.padded_vocab_size, cfg.channels))
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_size, cfg.rope_theta, cfg.rope_factor, cfg.rope_low,
                                                       cfg.rope_high, cfg.rope_positions), persistent=False)

    def rope_tables(self, x):
        """cos, sin (1, T, D) for positions 0..T-1, as transformers' LlamaRotaryEmbedding: the angles as a
        float32 matmul outside autocast, cast to x's dtype (float64 throughout for a float64 model)."""
        T = x.shape[1]
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        positions = torch.arange(T, device=x.device)[None, None, :].to(dtype)
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (self.inv_freq[None, :, None].to(dtype) @ positions).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
        return cos.to(x.dtype), sin.to(x.dtype)

    def head_weight(self):
        return self.wte if self.lm_head is None else self.lm_head

    def forward(self, idx, targets=None):
        x = F.embedding(idx, self.wte)
        cos, sin = self.rope_tables(x)
        for block in self.blocks:
            x = block(x, cos, sin)
        # LM head over all Vp rows (as the CUDA trainer does), then drop the padded columns.
        logits = F.linear(rmsnorm(x, self.lnfw, self.cfg.norm_eps), self.head_weight())[..., :self.cfg.vocab_size]
        if targets is None:
            return logits, None
        loss = F.cross_entropy(upcast(logits).reshape(-1, self.cfg.vocab_size), targets.reshape(-1))
        return logits, loss

    def file_layout(self):
        """[(name, [tensors concatenated in the file])] in model-file order (Config.file_tensors)."""
        per_layer = ["ln1w", "qkvw"] + (["qkvb"] if self.cfg.qkv_bias else []) + ["attprojw", "ln2w", "fcw", "fcprojw"]
        layout = [("wte", [self.wte])]
        layout += [(name, [getattr(b, name) for b in self.blocks]) for name in per_layer]
        layout.append(("lnfw", [self.lnfw]))
        if self.lm_head is not None:
            layout.append(("lm_head", [self.lm_head]))
        expected = self.cfg.file_tensors()
        assert [n for n, _ in layout] == [n for n, _ in expected]
        assert all(sum(t.numel() for t in ts) == math.prod(shape) for (_, ts), (_, shape) in zip(layout, expected))
        return layout

    def parameters_in_file_order(self):
        return [t for _, ts in self.file_layout() for t in ts]


@torch.no_grad()
def init_weights(model, seed, std=0.02, perturb=0.0):
    """N(0, std) matrices, N(0, std/sqrt(2L)) residual projections (attprojw, fcprojw), norms 1 and biases 0, zero
    padded vocabulary rows; perturb > 0 draws the norms from N(1, perturb) and the biases from N(0, perturb)
    instead, so that a check sees non-trivial ones. One generator, drawn in file order."""
    gen = torch.Generator().manual_seed(seed)
    residual = std / math.sqrt(2 * model.cfg.num_layers)
    for name, tensors in model.file_layout():
        for t in tensors:
            if name in ("attprojw", "fcprojw"):
                t.normal_(0.0, residual, generator=gen)
            elif name in ("wte", "qkvw", "fcw", "lm_head"):
                t.normal_(0.0, std, generator=gen)
            elif name in ("ln1w", "ln2w", "lnfw"):
                t.fill_(1.0)
                if perturb > 0:
                    t.add_(torch.randn(t.shape, generator=gen), alpha=perturb)
            else:  # qkvb
                t.zero_()
                if perturb > 0:
                    t.normal_(0.0, perturb, generator=gen)
    V = model.cfg.vocab_size
    model.wte[V:].zero_()
    if model.lm_head is not None:
        model.lm_head[V:].zero_()


# ----------------------------------------------------------------------------------------------------------
# Model files (docs/formats.md "Llama-family model file (ours)")

@torch.no_grad()
def write_model(model, path):
    """Writes a version-3 (fp32) Llama-family model file atomically, then reads it back (verify_model_file)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header_bytes(model.cfg.header(MODEL_VERSION_FP32)))
        for _, tensors in model.file_layout():
            for t in tensors:
                f.write(t.detach().float().cpu().numpy().astype("<f4").tobytes())
    os.replace(tmp, path)
    verify_model_file(model, path)


@torch.no_grad()
def verify_model_file(model, path):
    """The file at `path` holds the model's header and every tensor bit for bit, read back one tensor at a time
    (a preset-sized model is not held twice)."""
    expected_header = model.cfg.header(MODEL_VERSION_FP32)
    header = np.fromfile(path, dtype="<i4", count=g2.HEADER_INTS)
    if list(header[:len(expected_header)]) != expected_header or header[len(expected_header):].any():
        raise InputError(f"{path}: header read back differs from the one written")
    size = 4 * g2.HEADER_INTS + 4 * model.cfg.num_parameters()
    if os.path.getsize(path) != size:
        raise InputError(f"{path}: {os.path.getsize(path)} bytes read back, expected {size}")
    offset = 4 * g2.HEADER_INTS
    for name, tensors in model.file_layout():
        for i, t in enumerate(tensors):
            back = np.fromfile(path, dtype="<f4", count=t.numel(), offset=offset)
            if not np.array_equal(back.view("<i4"), t.detach().float().cpu().numpy().reshape(-1).view("<i4")):
                raise InputError(f"{path}: tensor {name} (part {i}) read back differs from the one written")
            offset += 4 * t.numel()


def config_from_header(header, path):
    if header[0] != LLAMA_MODEL_MAGIC:
        raise InputError(f"{path}: bad magic {header[0]} (expected {LLAMA_MODEL_MAGIC}, a Llama-family model file)")
    if header[1] not in (MODEL_VERSION_FP32, MODEL_VERSION_BF16):
        raise InputError(f"{path}: unsupported model version {header[1]} (expected 3 = fp32 or 5 = bf16)")
    if header[10] & ~3:
        raise InputError(f"{path}: unknown flags {header[10]} in header int 10 (1: q, k, v biases; 2: tied head)")
    floats = header.view("<f4")
    cfg = Config(layers=int(header[4]), channels=int(header[6]), heads=int(header[5]), kv_heads=int(header[8]),
                 ffn=int(header[9]), vocab_size=int(header[3]), max_seq_len=int(header[2]),
                 rope_theta=float(floats[12]), norm_eps=float(floats[11]),
                 rope_scaling=(float(floats[13]), float(floats[14]), float(floats[15]), int(header[16])),
                 tied_head=bool(header[10] & 2), qkv_bias=bool(header[10] & 1), padded=int(header[7]))
    problem = cfg.problem(strict=False)
    if problem:
        raise InputError(f"{path}: {problem}")
    return cfg


@torch.no_grad()
def read_model(path):
    """A Llama-family model file (version 3 fp32 or 5 bf16) as a fresh fp32 CPU model."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such model file")
    if os.path.getsize(path) < 4 * g2.HEADER_INTS:
        raise InputError(f"{path}: too short for a model header (1024 bytes)")
    header = np.fromfile(path, dtype="<i4", count=g2.HEADER_INTS)
    cfg = config_from_header(header, path)
    elem = 4 if header[1] == MODEL_VERSION_FP32 else 2
    expected = 4 * g2.HEADER_INTS + elem * cfg.num_parameters()
    if os.path.getsize(path) != expected:
        raise InputError(f"{path}: size {os.path.getsize(path)} bytes, expected {expected} for its header's shape")
    raw = np.fromfile(path, dtype="<f4" if elem == 4 else "<u2", offset=4 * g2.HEADER_INTS)
    if elem == 2:  # bf16 is the top half of an fp32
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    model = Llama(cfg)
    offset = 0
    for t in model.parameters_in_file_order():
        t.copy_(torch.from_numpy(raw[offset:offset + t.numel()].copy()).view_as(t))
        offset += t.numel()
    return model


# ----------------------------------------------------------------------------------------------------------
# Building the model from the flags

def parse_rope_scaling(text):
    """'none' | '0' | FACTOR | FACTOR/LOW/HIGH/POSITIONS (Llama 3's defaults: low 1, high 4, 8192 positions)."""
    if text in ("none", "0"):
        return (0.0, 1.0, 4.0, 8192)
    parts = text.split("/")
    try:
        if len(parts) == 1:
            return (float(parts[0]), 1.0, 4.0, 8192)
        if len(parts) == 4:
            return (float(parts[0]), float(parts[1]), float(parts[2]), int(parts[3]))
    except ValueError:
        pass
    raise InputError(f"--rope-scaling {text!r}: expected none, FACTOR or FACTOR/LOW/HIGH/POSITIONS (e.g. 8/1/4/8192)")


SHAPE_FLAGS = ["layers", "channels", "heads", "kv_heads", "ffn", "vocab_size", "max_seq_len", "rope_theta",
               "rope_scaling", "norm_eps", "tied_head", "qkv_bias"]


def flag_name(key):
    return "--" + key.replace("_", "-")


def config_from_args(args):
    """The shape: a preset (--arch NAME) or --arch llama's flags; any shape flag given overrides the preset."""
    given = {k: getattr(args, k) for k in SHAPE_FLAGS if getattr(args, k) is not None}
    if "rope_scaling" in given:
        given["rope_scaling"] = parse_rope_scaling(given["rope_scaling"])
    if args.arch == "llama":
        missing = [flag_name(k) for k in ("layers", "channels", "heads") if k not in given]
        if missing:
            raise InputError(f"--arch llama needs {', '.join(missing)} (or --arch with a preset: {', '.join(PRESETS)})")
        shape = {"kv_heads": given["heads"], "ffn": 4 * given["channels"], "vocab_size": GPT2_VOCAB,
                 "max_seq_len": args.seq_len, "rope_theta": 10000.0, "rope_scaling": (0.0, 1.0, 4.0, 8192),
                 "norm_eps": 1e-5, "tied_head": 1, "qkv_bias": 0}
    else:
        L, C, NH, KVH, F_, V, T, theta, eps, factor, tied, bias = PRESETS[args.arch]
        shape = {"layers": L, "channels": C, "heads": NH, "kv_heads": KVH, "ffn": F_, "vocab_size": V,
                 "max_seq_len": T, "rope_theta": theta, "rope_scaling": (factor, 1.0, 4.0, 8192), "norm_eps": eps,
                 "tied_head": tied, "qkv_bias": bias}
    shape.update(given)
    cfg = Config(shape["layers"], shape["channels"], shape["heads"], shape["kv_heads"], shape["ffn"],
                 shape["vocab_size"], shape["max_seq_len"], shape["rope_theta"], shape["norm_eps"],
                 shape["rope_scaling"], shape["tied_head"], shape["qkv_bias"])
    problem = cfg.problem()
    if problem:
        raise InputError(problem)
    return cfg


def build_model(args):
    """An fp32 CPU model: --init-from's, or a random one of the flags' shape from --seed."""
    if args.init_from:
        model = read_model(args.init_from)
        stray = [flag_name(k) for k in SHAPE_FLAGS if getattr(args, k) is not None]
        if args.arch != "llama":
            stray.insert(0, "--arch")
        if stray:
            raise InputError(f"{stray[0]} does not apply with --init-from (the shape comes from {args.init_from})")
        return model
    model = Llama(config_from_args(args))
    init_weights(model, args.seed, perturb=args.init_perturb)
    return model


def make_batch(cfg, B, T, seed):
    """gpt2_reference.py's batch: B rows of T+1 tokens from their own generator, so they do not depend on the model."""
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()


# ----------------------------------------------------------------------------------------------------------
# Debug state (docs/formats.md): exactly what gpt2_reference.py's debug-state writes, with this model.

def write_debug_state(model, args, device):
    lr, beta1, beta2, eps, wd, clip = (f32(x) for x in (args.lr, args.beta1, args.beta2, args.eps, args.weight_decay,
                                                         args.grad_clip))
    cfg = model.cfg
    B, T, V = args.batch_size, args.seq_len, cfg.vocab_size
    inputs, targets = make_batch(cfg, B, T, args.seed)
    x, y = inputs.to(device), targets.to(device)
    params = model.parameters_in_file_order()
    decay = [t for name, ts in model.file_layout() if name in DECAY_NAMES for t in ts]
    no_decay = [t for name, ts in model.file_layout() if name not in DECAY_NAMES for t in ts]
    optimizer = g2.AdamW(decay, no_decay, beta1, beta2, eps, wd)
    losses = []
    for step in range(args.steps):
        optimizer.zero_grad()
        with g2.autocast(args, device):
            logits, loss = model(x, y)
        loss.backward()  # fp16: loss scale 1 (a correctness reference); a non-finite gradient is an error
        norm = g2.grad_norm(params)
        if not math.isfinite(norm):
            raise InputError(f"non-finite gradient norm at step {step} with --dtype {args.dtype}")
        if step == 0:
            # clone: on CPU .cpu() aliases the gradient that clipping scales in place below
            step0 = (logits.detach().float().cpu().clone(), loss.item(), norm,
                     [p.grad.detach().float().cpu().clone() for p in params])
        g2.clip_grads(params, norm, clip)
        optimizer.step(lr)
        losses.append(loss.item())
        print(f"step {step} loss {losses[-1]:.6f} grad_norm {norm:.6f}")
    logits0, loss0, norm0, grads0 = step0
    header = [g2.STATE_MAGIC, g2.STATE_VERSION, B, T, args.steps, V, cfg.padded_vocab_size,
              g2.PRECISION_CODE[args.dtype]]
    header += [f32_bits(v) for v in (lr, beta1, beta2, eps, wd, clip)]
    tmp = args.state_out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header_bytes(header))
        f.write(inputs.numpy().astype("<i4").tobytes())
        f.write(targets.numpy().astype("<i4").tobytes())
        f.write(logits0.numpy().astype("<f4").tobytes())
        f.write(np.array([loss0, norm0], dtype="<f4").tobytes())
        for g in grads0:
            f.write(g.numpy().astype("<f4").tobytes())
        f.write(np.array(losses, dtype="<f4").tobytes())
    os.replace(tmp, args.state_out)


# ----------------------------------------------------------------------------------------------------------
# --check-transformers

# fp32 on both sides, the same formulas; what differs is the order of the sums inside the products (q, k, v as
# one product here, three there; different GEMM blockings), worth ~1e-6 of a tensor's scale after a few layers
# and the backward pass. A real difference (a row out of place, a query head on the wrong key/value head, a wrong
# rotary frequency, a missing bias or epsilon) moves entries by a sizable part of the scale. So: the largest
# |ours - transformers| of each tensor at most 1e-4 of its largest |transformers| entry (100x above the rounding).
# The RoPE frequencies come out of the same float32 ops and must agree to 1e-6 (a scaling error in the lowest
# frequencies hardly shows in a short sequence's logits), the loss to 1e-5 of itself.
TOL_TENSOR, TOL_LOSS, TOL_ROPE = 1e-4, 1e-5, 1e-6


def import_transformers():
    try:
        import transformers
    except ImportError as e:
        why = "" if e.name == "transformers" else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        raise InputError(f"--check-transformers needs transformers{why}: pip install transformers")
    return transformers


def set_transformers_rope(hf_config, cfg):
    """RoPE settings on a transformers config: transformers 5 reads them from config.rope_parameters (theta
    included), 4.x from rope_theta and rope_scaling."""
    params = {"rope_type": "default"}
    if cfg.rope_factor != 0.0:
        params = {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": cfg.rope_low,
                  "high_freq_factor": cfg.rope_high, "original_max_position_embeddings": cfg.rope_positions}
    if hasattr(hf_config, "rope_parameters"):
        hf_config.rope_parameters = dict(params, rope_theta=cfg.rope_theta)
    else:
        hf_config.rope_theta = cfg.rope_theta
        hf_config.rope_scaling = params if cfg.rope_factor != 0.0 else None


@torch.no_grad()
def build_transformers_model(model, device):
    """LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases: biases on q, k, v only) of the model's shape, eager
    attention, fp32, holding the model's weights (the unpadded vocabulary rows). No download."""
    transformers = import_transformers()
    cfg = model.cfg
    V, C, D, F_ = cfg.vocab_size, cfg.channels, cfg.head_size, cfg.ffn
    common = dict(vocab_size=V, hidden_size=C, intermediate_size=F_, num_hidden_layers=cfg.num_layers,
                  num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads, hidden_act="silu",
                  max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
                  tie_word_embeddings=cfg.tied_head, attention_dropout=0.0, use_cache=False, pad_token_id=None,
                  attn_implementation="eager")
    if cfg.qkv_bias:
        hf_config = transformers.Qwen2Config(use_sliding_window=False, **common)
        cls = transformers.Qwen2ForCausalLM
    else:
        hf_config = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, head_dim=D, **common)
        cls = transformers.LlamaForCausalLM
    set_transformers_rope(hf_config, cfg)
    hf = cls(hf_config).float().eval()
    implementation = getattr(hf.config, "_attn_implementation", "eager")
    if implementation != "eager":
        raise InputError(f"transformers chose attention {implementation!r}, not the eager one asked for")
    embed, head = hf.model.embed_tokens.weight, hf.lm_head.weight
    if (embed.data_ptr() == head.data_ptr()) != cfg.tied_head:
        raise InputError(f"transformers' LM head is {'not ' if cfg.tied_head else ''}tied to its embedding, ours is"
                         f"{'' if cfg.tied_head else ' not'}")
    theirs = sum(p.numel() for p in hf.parameters())
    ours = cfg.num_parameters() - (cfg.padded_vocab_size - V) * C * (1 if cfg.tied_head else 2)
    if theirs != ours:
        raise InputError(f"transformers' {cls.__name__} has {theirs} parameters, this shape {ours} (without padding)")
    embed.copy_(model.wte[:V])
    for block, layer in zip(model.blocks, hf.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        layer.input_layernorm.weight.copy_(block.ln1w)
        q, k, v = block.qkvw.split([C, cfg.kv_heads * D, cfg.kv_heads * D])
        for proj, w in ((attn.q_proj, q), (attn.k_proj, k), (attn.v_proj, v)):
            proj.weight.copy_(w)
        if cfg.qkv_bias:
            q, k, v = block.qkvb.split([C, cfg.kv_heads * D, cfg.kv_heads * D])
            for proj, b in ((attn.q_proj, q), (attn.k_proj, k), (attn.v_proj, v)):
                proj.bias.copy_(b)
        attn.o_proj.weight.copy_(block.attprojw)
        layer.post_attention_layernorm.weight.copy_(block.ln2w)
        gate, up = block.fcw.split([F_, F_])
        mlp.gate_proj.weight.copy_(gate)
        mlp.up_proj.weight.copy_(up)
        mlp.down_proj.weight.copy_(block.fcprojw)
    hf.model.norm.weight.copy_(model.lnfw)
    if not cfg.tied_head:
        head.copy_(model.lm_head[:V])
    return hf.to(device), transformers.__version__


def transformers_gradients(hf, cfg):
    """transformers' gradients as our file's tensors: {name: tensor of the file's shape, unpadded rows}."""
    C, F_ = cfg.channels, cfg.ffn
    layers = hf.model.layers

    def stack(get):
        return torch.stack([get(layer) for layer in layers])

    grads = {"wte": hf.model.embed_tokens.weight.grad,
             "ln1w": stack(lambda l: l.input_layernorm.weight.grad),
             "qkvw": stack(lambda l: torch.cat([l.self_attn.q_proj.weight.grad, l.self_attn.k_proj.weight.grad,
                                                l.self_attn.v_proj.weight.grad])),
             "attprojw": stack(lambda l: l.self_attn.o_proj.weight.grad),
             "ln2w": stack(lambda l: l.post_attention_layernorm.weight.grad),
             "fcw": stack(lambda l: torch.cat([l.mlp.gate_proj.weight.grad, l.mlp.up_proj.weight.grad])),
             "fcprojw": stack(lambda l: l.mlp.down_proj.weight.grad),
             "lnfw": hf.model.norm.weight.grad}
    if cfg.qkv_bias:
        grads["qkvb"] = stack(lambda l: torch.cat([l.self_attn.q_proj.bias.grad, l.self_attn.k_proj.bias.grad,
                                                   l.self_attn.v_proj.bias.grad]))
    if not cfg.tied_head:
        grads["lm_head"] = hf.lm_head.weight.grad
    assert grads["qkvw"].shape[1:] == (cfg.qkv_rows, C) and grads["fcw"].shape[1:] == (2 * F_, C)
    return grads


def compare(name, ours, theirs, tol, elementwise=False):
    """One line: the largest |ours - theirs| against the largest |theirs| (elementwise: the largest relative
    difference of any element). Returns whether it is within tol."""
    a, b = ours.detach().double().cpu(), theirs.detach().double().cpu()
    if a.shape != b.shape:
        print(f"FAIL {name}: shape {tuple(a.shape)} here, {tuple(b.shape)} in transformers")
        return False
    diff = (a - b).abs()
    scale = b.abs().max().item() if b.numel() else 0.0
    if elementwise:
        ratio = (diff / b.abs().clamp_min(1e-30)).max().item()
        what = "max relative difference"
    else:
        ratio = diff.max().item() / scale if scale > 0 else diff.max().item()
        what = "max |difference| / max |transformers|"
    ok = math.isfinite(ratio) and ratio <= tol and bool(torch.isfinite(a).all())
    print(f"{'ok' if ok else 'FAIL'} {name}: {what} {ratio:.2e} (tol {tol:g}; max |difference| "
          f"{diff.max().item():.3e}, max |transformers| {scale:.3e})")
    return ratio / tol if ok else None


def check_transformers(model, args, device):
    """Forward and backward of the (initial) model and of transformers' on the debug state's batch, in fp32;
    raises InputError when any comparison fails."""
    cfg = model.cfg
    hf, version = build_transformers_model(model, device)
    print(f"transformers {version}, torch {torch.__version__}, {device}, fp32: {cfg.describe()}")
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # true fp32 on both sides
    try:
        inputs, targets = make_batch(cfg, args.batch_size, args.seq_len, args.seed)
        x, y = inputs.to(device), targets.to(device)
        model.zero_grad(set_to_none=True)
        logits, loss = model(x, y)
        loss.backward()
        hf_logits = hf(input_ids=x, use_cache=False).logits
        # transformers' causal-LM loss shifts its labels by one itself; ours are shifted already, so its loss is
        # the mean cross-entropy of its logits against them (its ForCausalLMLoss with shift_labels).
        hf_loss = F.cross_entropy(hf_logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1))
        hf_loss.backward()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, cudnn_tf32
    rotary = getattr(hf.model, "rotary_emb", None) or hf.model.layers[0].self_attn.rotary_emb
    results = [compare("rope inv_freq", model.inv_freq, rotary.inv_freq, TOL_ROPE, elementwise=True),
               compare("logits", logits, hf_logits, TOL_TENSOR),
               compare("loss", loss.reshape(1), hf_loss.reshape(1), TOL_LOSS, elementwise=True)]
    if getattr(rotary, "attention_scaling", 1.0) != 1.0:
        print(f"FAIL rope attention scaling: transformers scales cos and sin by {rotary.attention_scaling}")
        results.append(None)
    theirs = transformers_gradients(hf, cfg)
    V = cfg.vocab_size
    shapes = dict(cfg.file_tensors())
    for name, tensors in model.file_layout():
        grad = torch.cat([t.grad.reshape(-1) for t in tensors]).view(shapes[name])
        if name in ("wte", "lm_head"):
            padding = grad[V:]
            if padding.numel() and padding.abs().max().item() != 0.0:
                print(f"FAIL grad {name} padded rows {V}..{cfg.padded_vocab_size - 1}: not zero")
                results.append(None)
            grad = grad[:V]
        results.append(compare(f"grad {name}", grad, theirs[name], TOL_TENSOR))
    failed = results.count(None)
    model.zero_grad(set_to_none=True)
    if failed:
        raise InputError(f"{failed} of {len(results)} comparisons with transformers {version} failed "
                         f"({cfg.describe()})")
    print(f"transformers {version} agrees: {len(results)} comparisons, the largest difference at "
          f"{100 * max(results):.2g}% of its tolerance")


# ----------------------------------------------------------------------------------------------------------
# --self-test (CPU, no transformers)

class SelfTest:
    def __init__(self):
        self.failed = 0
        self.count = 0

    def check(self, name, ok, detail):
        self.count += 1
        self.failed += 0 if ok else 1
        print(f"{'ok' if ok else 'FAIL'} {name}: {detail}", flush=True)


def tiny_config(kv_heads=2, tied=True, bias=False, scaling=(0.0, 1.0, 4.0, 8192), heads=4, channels=16):
    """A shape small enough for finite differences; Vp > V with padding not a multiple of 128 on purpose."""
    return Config(layers=2, channels=channels, heads=heads, kv_heads=kv_heads, ffn=24, vocab_size=13, max_seq_len=8,
                  rope_theta=100.0, norm_eps=1e-5, rope_scaling=scaling, tied_head=tied, qkv_bias=bias, padded=16)


def tiny_model(cfg, seed=1, dtype=torch.float64):
    """Weights large enough (std 0.3, norms and biases perturbed) that attention is far from uniform."""
    model = Llama(cfg)
    init_weights(model, seed, std=0.3, perturb=0.3)
    return model.to(dtype)


def reference_attention(block, x):
    """Multi-head attention written plainly: one (batch, head, position) at a time, the rotation of each pair
    (i, i + D/2) by angle t * inv_freq[i] spelled out, key/value head h // (NH/KVH) read explicitly."""
    cfg = block.cfg
    B, T, C = x.shape
    D, NH, KVH = cfg.head_size, cfg.num_heads, cfg.kv_heads
    qkv = x @ block.qkvw.t() + (block.qkvb if block.qkvb is not None else 0)
    q, k, v = qkv[..., :C], qkv[..., C:C + KVH * D], qkv[..., C + KVH * D:]
    inv = rope_inv_freq(D, cfg.rope_theta, cfg.rope_factor, cfg.rope_low, cfg.rope_high, cfg.rope_positions).double()

    def rotate(vec, t):
        half = D // 2
        angle = t * inv
        a, b = vec[:half], vec[half:]
        return torch.cat([a * torch.cos(angle) - b * torch.sin(angle), b * torch.cos(angle) + a * torch.sin(angle)])

    y = torch.zeros(B, T, C, dtype=x.dtype)
    for bi in range(B):
        for h in range(NH):
            g = h // (NH // KVH)
            keys = torch.stack([rotate(k[bi, s, g * D:(g + 1) * D], s) for s in range(T)])
            for t in range(T):
                query = rotate(q[bi, t, h * D:(h + 1) * D], t)
                scores = torch.stack([query @ keys[s] for s in range(t + 1)]) / math.sqrt(D)
                weights = torch.softmax(scores, dim=0)
                y[bi, t, h * D:(h + 1) * D] = sum(weights[s] * v[bi, s, g * D:(g + 1) * D] for s in range(t + 1))
    return y @ block.attprojw.t()


@torch.no_grad()
def expanded_to_mha(model, index):
    """An MHA copy (kv heads = heads) of a GQA model whose query head h gets key/value head index(h)'s rows."""
    cfg = model.cfg
    D, C = cfg.head_size, cfg.channels
    mha_cfg = Config(cfg.num_layers, C, cfg.num_heads, cfg.num_heads, cfg.ffn, cfg.vocab_size, cfg.max_seq_len,
                     cfg.rope_theta, cfg.norm_eps, (cfg.rope_factor, cfg.rope_low, cfg.rope_high, cfg.rope_positions),
                     cfg.tied_head, cfg.qkv_bias, cfg.padded_vocab_size)
    mha = Llama(mha_cfg).to(torch.float64)
    for name in ("wte", "lnfw") + (() if cfg.tied_head else ("lm_head",)):
        getattr(mha, name).copy_(getattr(model, name))
    rows = [list(range(C))]
    for part in (0, 1):  # k, then v
        for h in range(cfg.num_heads):
            start = C + part * cfg.kv_heads * D + index(h) * D
            rows.append(list(range(start, start + D)))
    rows = torch.tensor([r for rs in rows for r in rs])
    for src, dst in zip(model.blocks, mha.blocks):
        for name in ("ln1w", "attprojw", "ln2w", "fcw", "fcprojw"):
            getattr(dst, name).copy_(getattr(src, name))
        dst.qkvw.copy_(src.qkvw[rows])
        if cfg.qkv_bias:
            dst.qkvb.copy_(src.qkvb[rows])
    return mha


def self_test_gqa(st):
    gen = torch.Generator().manual_seed(3)
    for kv in (4, 2, 1):
        cfg = tiny_config(kv_heads=kv, bias=True)
        model = tiny_model(cfg)
        x = torch.randn(2, 7, cfg.channels, generator=gen, dtype=torch.float64)
        cos, sin = model.rope_tables(x)
        with torch.no_grad():
            diff = (model.blocks[0].attention(x, cos, sin) - reference_attention(model.blocks[0], x)).abs().max().item()
        what = ("plain MHA" if kv == cfg.num_heads else
                f"attention written out with head h on kv head h // {cfg.num_heads // kv}")
        st.check(f"gqa {cfg.num_heads} heads, {kv} kv heads", diff < 1e-12,
                 f"equals {what}: max |difference| {diff:.1e}")
    cfg = tiny_config(kv_heads=2)
    model = tiny_model(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 7), generator=gen)
    with torch.no_grad():
        logits = model(idx)[0]
        same = (expanded_to_mha(model, lambda h: h // 2)(idx)[0] - logits).abs().max().item()
        other = (expanded_to_mha(model, lambda h: h % 2)(idx)[0] - logits).abs().max().item()
    st.check("gqa equals MHA with repeated kv heads", same < 1e-12 and other > 1e-6,
             f"4 heads on 2 kv heads = MHA with kv rows [0 0 1 1]: max |difference| {same:.1e}; "
             f"with [0 1 0 1] (the wrong mapping) {other:.1e}")


def self_test_rope(st):
    for D, theta in ((64, 500000.0), (128, 1000000.0), (64, 100000.0), (128, 10000.0)):
        exact = torch.tensor([theta ** (-i / D) for i in range(0, D, 2)], dtype=torch.float64)
        ours = rope_inv_freq(D, theta)
        rel = ((ours.double() - exact) / exact).abs().max().item()
        st.check(f"rope D={D} theta={theta:g} unscaled", ours.dtype == torch.float32 and rel < 1e-6,
                 f"inv_freq = theta^(-2i/D) to {rel:.1e} (float32)")
    # Scaling off is the theta-only table bit for bit; factor 1 scales nothing (up to rounding).
    D, theta = 128, 500000.0
    plain = rope_inv_freq(D, theta)
    off = Llama(Config(1, 2 * D, 2, 1, 8, 16, 8, theta, rope_scaling=(0.0, 1.0, 4.0, 8192))).inv_freq
    one = rope_inv_freq(D, theta, 1.0, 1.0, 4.0, 8192)
    rel_one = ((one - plain) / plain).abs().max().item()
    st.check("rope scaling off", torch.equal(off, plain) and rel_one < 1e-6,
             f"factor 0 gives the theta-only frequencies exactly; factor 1 within {rel_one:.1e}")
    # Llama 3.1's published scaling, evaluated independently in float64 band by band.
    factor, low, high, positions = 8.0, 1.0, 4.0, 8192
    ours = rope_inv_freq(D, theta, factor, low, high, positions).double()
    base = plain.double()
    expected, bands = [], [0, 0, 0]
    for f in base.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < positions / high:
            expected.append(f)
            bands[0] += 1
        elif wavelen > positions / low:
            expected.append(f / factor)
            bands[2] += 1
        else:
            s = (positions / wavelen - low) / (high - low)
            expected.append((1 - s) * f / factor + s * f)
            bands[1] += 1
    expected = torch.tensor(expected, dtype=torch.float64)
    rel = ((ours - expected) / expected).abs().max().item()
    st.check("rope llama3 scaling 8/1/4/8192", rel < 1e-6 and min(bands) > 0,
             f"matches the piecewise formula to {rel:.1e}; {bands[0]} high, {bands[1]} medium, {bands[2]} low "
             f"frequencies of {D // 2}")
    # Attention scores depend on relative position only.
    cfg = tiny_config()
    model = tiny_model(cfg)
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 1, 1, cfg.head_size, generator=gen, dtype=torch.float64).unbind(0)
    x = torch.zeros(1, 12, cfg.channels, dtype=torch.float64)
    cos, sin = model.rope_tables(x)

    def at(vec, t):
        return apply_rope(vec.view(1, 1, 1, -1), cos[:, t:t + 1], sin[:, t:t + 1]).reshape(-1)

    diff = max(abs((at(q, m) @ at(k, n) - at(q, m + s) @ at(k, n + s)).item())
               for m, n, s in ((3, 1, 4), (5, 5, 6), (2, 0, 9)))
    st.check("rope relative positions", diff < 1e-12, f"<rope(q, m), rope(k, n)> depends on m - n only: {diff:.1e}")


def self_test_gradients(st):
    """Autograd against central differences in float64, every tensor of two tiny models (sampled elements of the
    larger ones); the padded vocabulary rows get exactly zero gradient."""
    gen = torch.Generator().manual_seed(7)
    for cfg in (tiny_config(kv_heads=1, tied=True, bias=False),
                tiny_config(kv_heads=2, tied=False, bias=True, scaling=(4.0, 1.0, 4.0, 16))):
        model = tiny_model(cfg, seed=11)
        idx = torch.randint(0, cfg.vocab_size, (2, 6), generator=gen)
        tgt = torch.randint(0, cfg.vocab_size, (2, 6), generator=gen)
        model(idx, tgt)[1].backward()
        h, worst, checked, padding_ok = 1e-6, 0.0, 0, True
        for name, tensors in model.file_layout():
            for t in tensors:
                flat, grad = t.data.view(-1), t.grad.view(-1)
                rows = t.shape[0] if name in ("wte", "lm_head") else None
                if rows is not None:
                    padding_ok &= bool((t.grad[cfg.vocab_size:] == 0).all())
                candidates = torch.arange(cfg.vocab_size * cfg.channels if rows is not None else flat.numel())
                if candidates.numel() > 48:
                    candidates = candidates[torch.randperm(candidates.numel(), generator=gen)[:48]]
                for i in candidates.tolist():
                    saved = flat[i].item()
                    with torch.no_grad():
                        flat[i] = saved + h
                        up = model(idx, tgt)[1].item()
                        flat[i] = saved - h
                        down = model(idx, tgt)[1].item()
                        flat[i] = saved
                    fd = (up - down) / (2 * h)
                    worst = max(worst, abs(fd - grad[i].item()) / (1e-7 + 1e-5 * abs(grad[i].item())))
                    checked += 1
        st.check(f"gradients vs finite differences ({cfg.describe()})", worst <= 1.0 and padding_ok,
                 f"{checked} elements of every tensor, worst |autograd - central difference| at {worst:.2f} of "
                 f"1e-7 + 1e-5 |grad|; padded rows {'zero' if padding_ok else 'NOT zero'}")


def self_test_files(st, work):
    # Every tensor of a file read back as written, both head kinds, with and without biases.
    for tied, bias in ((True, False), (False, True)):
        cfg = Config(2, 128, 2, 1, 96, 300, 64, 500000.0, 1e-6, (32.0, 1.0, 4.0, 8192), tied, bias)
        model = Llama(cfg)
        init_weights(model, 5, perturb=0.1)
        path = os.path.join(work, f"model_{int(tied)}{int(bias)}.bin")
        write_model(model, path)
        back = read_model(path)
        same = all(torch.equal(a, b) for a, b in zip(model.parameters_in_file_order(), back.parameters_in_file_order()))
        same &= back.cfg.header(3) == cfg.header(3)
        size = os.path.getsize(path)
        st.check(f"model file {'tied' if tied else 'untied'}{' qkv-bias' if bias else ''}", same and
                 size == 1024 + 4 * cfg.num_parameters(),
                 f"{len(cfg.file_tensors())} tensors ({', '.join(n for n, _ in cfg.file_tensors())}) read back "
                 f"bit for bit, {size} bytes")
    counts = {name: config_from_args(argparse.Namespace(arch=name, seq_len=1, **{k: None for k in SHAPE_FLAGS}))
              .num_parameters() for name in PRESETS}
    st.check("preset parameter counts", counts == PRESET_PARAMETERS,
             ", ".join(f"{n} {c}" for n, c in counts.items()) + " (the published models')")
    # The command line end to end: the debug state holds what the model recomputes from the file.
    model_path, state_path = os.path.join(work, "cli_model.bin"), os.path.join(work, "cli_state.bin")
    B, T, steps = 2, 8, 3
    argv = ["--layers", "1", "--channels", "128", "--heads", "2", "--kv-heads", "1", "--ffn", "64", "--vocab-size",
            "300", "--rope-scaling", "8/1/4/16", "--tied-head", "0", "--qkv-bias", "1", "--init-perturb", "0.1",
            "--batch-size", str(B), "--seq-len", str(T), "--steps", str(steps), "--device", "cpu",
            "--model-out", model_path, "--state-out", state_path]
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    if rc != 0:
        st.check("command line debug state", False, f"exit {rc}")
        return
    model = read_model(model_path)
    cfg = model.cfg
    header = np.fromfile(state_path, dtype="<i4", count=256)
    body = np.fromfile(state_path, dtype="<f4", offset=1024)
    N, V, P = B * T, cfg.vocab_size, cfg.num_parameters()
    inputs = torch.from_numpy(body[:N].view("<i4").astype(np.int64)).view(B, T)
    targets = torch.from_numpy(body[N:2 * N].view("<i4").astype(np.int64)).view(B, T)
    at = 2 * N
    logits0 = torch.from_numpy(body[at:at + N * V].copy())
    loss0, norm0 = body[at + N * V], body[at + N * V + 1]
    grads0 = torch.from_numpy(body[at + N * V + 2:at + N * V + 2 + P].copy())
    logits, loss = model(inputs, targets)
    loss.backward()
    grads = torch.cat([t.grad.reshape(-1) for t in model.parameters_in_file_order()])
    ok = (list(header[:8]) == [g2.STATE_MAGIC, g2.STATE_VERSION, B, T, steps, V, cfg.padded_vocab_size, 0]
          and body.size == 2 * N + N * V + 2 + P + steps
          and torch.equal(inputs[:, 1:], targets[:, :-1])
          and (logits.detach().reshape(-1) - logits0).abs().max().item() < 1e-5
          and abs(loss.item() - loss0) < 1e-5 and abs(grads.norm().item() - norm0) < 1e-5 * max(1.0, norm0)
          and (grads - grads0).abs().max().item() < 1e-6)
    st.check("command line debug state", ok,
             f"header, {body.size} floats after it (B*T inputs and targets, B*T*V logits, loss, norm, {P} "
             f"gradients, {steps} losses); the model file's forward and backward reproduce them")


def self_test():
    st = SelfTest()
    torch.manual_seed(0)
    self_test_rope(st)
    self_test_gqa(st)
    self_test_gradients(st)
    with tempfile.TemporaryDirectory() as work:
        self_test_files(st, work)
    if st.failed:
        raise InputError(f"self-test: {st.failed} of {st.count} checks failed")
    print(f"self-test: all {st.count} checks passed")


# ----------------------------------------------------------------------------------------------------------

def zero_one(text):
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"expected 0 or 1, not {text!r}")
    return int(text)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other error here, not the usage block
        sys.exit(f"error: {message} (see --help)")


def build_parser():
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("shape (the preset's, else these; a flag given overrides the preset)")
    g.add_argument("--arch", choices=["llama"] + list(PRESETS), default="llama",
                   help="llama: the shape flags below; or a published shape (model/config.h presets)")
    g.add_argument("--init-from", help="a Llama-family model file (version 3 or 5) instead of a random model")
    g.add_argument("--layers", type=int)
    g.add_argument("--channels", type=int)
    g.add_argument("--heads", type=int)
    g.add_argument("--kv-heads", type=int, help="key/value heads (grouped-query attention); default --heads")
    g.add_argument("--ffn", type=int, help="MLP hidden units (gate and up each); default 4 x channels")
    g.add_argument("--vocab-size", "--vocab", type=int, help="default 50257; padded to a multiple of 128")
    g.add_argument("--max-seq-len", type=int, help="the header's longest sequence; default --seq-len")
    g.add_argument("--rope-theta", type=float, help="rotary base; default 10000")
    g.add_argument("--rope-scaling", help="Llama 3's: FACTOR/LOW/HIGH/POSITIONS, FACTOR (1/4/8192) or none (default)")
    g.add_argument("--qkv-bias", type=zero_one, help="1: biases on q, k and v (Qwen 2.5); default 0")
    g.add_argument("--tied-head", type=zero_one, help="1: the LM head is the token embedding (default); 0: its own")
    g.add_argument("--norm-eps", type=float, help="RMSNorm epsilon; default 1e-5")
    g.add_argument("--seed", type=int, default=1337, help="initialisation and batch")
    g.add_argument("--init-perturb", type=float, default=0.0,
                   help="norm weights ~ N(1, this) and q/k/v biases ~ N(0, this) instead of 1 and 0")
    g = p.add_argument_group("run")
    g.add_argument("--batch-size", type=int)
    g.add_argument("--seq-len", type=int)
    g.add_argument("--dtype", choices=sorted(g2.PRECISION_CODE), default="fp32",
                   help="the debug state's precision (autocast); --check-transformers is always fp32")
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    g.add_argument("--steps", type=int, default=10, help="AdamW steps on the batch recorded in the debug state")
    g.add_argument("--lr", type=float, default=1e-4)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.95)
    g.add_argument("--eps", type=float, default=1e-8)
    g = p.add_argument_group("outputs and checks (at least one)")
    g.add_argument("--model-out", help="the (initial) model file")
    g.add_argument("--state-out", help="the debug state")
    g.add_argument("--check-transformers", action="store_true",
                   help="compare logits, loss and gradients with transformers (fp32), one line each; exit 1 on a "
                        "mismatch")
    g.add_argument("--self-test", action="store_true", help="this file's own checks, on the CPU, without transformers")
    p.set_defaults(sdpa=False)  # gpt2_reference's setup_device reads it
    return p


def run(args):
    if args.self_test:
        others = [a for a in ("model_out", "state_out", "check_transformers", "init_from") if getattr(args, a)]
        if others:
            raise InputError(f"--self-test takes no {flag_name(others[0])}")
        self_test()
        return
    if not (args.model_out or args.state_out or args.check_transformers):
        raise InputError("nothing to do: give --model-out, --state-out, --check-transformers or --self-test")
    if args.batch_size is None or args.seq_len is None:
        raise InputError("need --batch-size and --seq-len")
    if args.batch_size <= 0 or args.seq_len <= 0 or args.steps < 1:
        raise InputError("--batch-size, --seq-len and --steps must be positive")
    if args.init_perturb < 0:
        raise InputError(f"--init-perturb {args.init_perturb} must be >= 0")
    device = g2.setup_device(args)
    if args.check_transformers:
        import_transformers()  # before any work
    model = build_model(args)
    if args.seq_len > model.cfg.max_seq_len:
        raise InputError(f"--seq-len {args.seq_len} > max seq len {model.cfg.max_seq_len}")
    print(model.cfg.describe())
    if args.model_out:
        write_model(model, args.model_out)
    model.to(device)
    if args.check_transformers:
        check_transformers(model, args, device)
    if args.state_out:
        write_debug_state(model, args, device)
    print("wrote " + " and ".join(p for p in (args.model_out, args.state_out) if p) if args.model_out or args.state_out
          else "done")


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (InputError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
