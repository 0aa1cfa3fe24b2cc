#!/usr/bin/env python3
"""The PyTorch baselines of bench/bench_llama.sh: a plain, self-contained Llama trainer in PyTorch (no transformers).

The model: Llama 3 / SmolLM2 shapes (the presets of model/config.h), nn.Embedding, RMSNorm by F.rms_norm (torch >= 2.4;
its formula written out before), one q|k|v nn.Linear and one gate|up nn.Linear (the widest products, as train_gpt's),
rotary positions (rotate-half form, Llama 3's frequency scaling) from cos/sin tables made once, grouped-query
attention by F.scaled_dot_product_attention(is_causal=True) with enable_gqa=True where the SDPA backend takes it, else
k and v repeat_interleave'd to the query heads, SwiGLU (F.silu(gate) * up), no biases (Qwen 2.5: q, k, v), the head
tied to wte or its own, F.cross_entropy on the logits (the model returns the loss only), vocabulary padded to a
multiple of 128 as train_gpt pads it (the padded columns take part in the softmax, as nanoGPT's do).

--mode single (one GPU): bf16 autocast over fp32 parameters (--dtype autocast, default; the numerics of train_gpt's
  bf16 weights with fp32 master weights) or bf16 parameters and AdamW state (--dtype bf16), TF32 for fp32 products,
  fused AdamW (beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1 on the matrices and embeddings), gradient clipping at
  1.0, a warm-up + cosine learning rate, torch.compile. Every compile mode of --compile-modes (default "default
  reduce-overhead", i.e. also CUDA graphs) is timed with every SDPA backend of --backend (flash, cuDNN), each
  (mode, backend) with the model built and compiled afresh in this process, and the fastest is BEST.
  --compile-scope blocks (default): each block under its own torch.compile and the final norm + head + loss under
  another, as TorchTitan compiles Llama (identical blocks share one compiled graph, so compiling takes a block's time,
  not the model's: about 4x to 10x less here); model: torch.compile(model), the whole forward and loss in one graph
  (as bench_pytorch_gpt2.py; the extra fusions are each block's last residual add with the next block's first
  norm).
  GQA: each backend is probed first (a causal bf16 forward and backward of this shape, checked against an fp32
  reference): enable_gqa=True if the torch has it and the backend runs it (flash does; cuDNN refuses unequal head
  counts in the torch versions this was written against), else repeat_interleave. A profiled untimed step checks that
  the backend's SDPA operator ran (verified=yes|NO|unchecked; under reduce-overhead the first step, before the CUDA
  graphs, is profiled too); an enable_gqa run that did not run it is timed again with repeat_interleave; a NO result
  is left out of BEST.
  Inductor's FX graph cache and AOTAutograd's cache are off (they ignore the SDPA backend, pytorch/pytorch#185449);
  the Triton kernel cache stays on.
--mode fsdp (one GPU, a model that does not fit it resident, e.g. llama3-8b on an 80 GB H100): FSDP2 (fully_shard) on
  a one-rank mesh, each block a unit and the root holding wte, the final norm and the head, CPUOffloadPolicy (the
  parameters, their gradients and AdamW on the CPU; the parameters pinned), reshard after forward, --microbatches
  micro-batches of --batch-size rows a step, all but the last with set_requires_gradient_sync(False) (the gradients
  accumulate on the GPU, are copied down once a step); clipping at 1.0 over the host gradients (one rank: the local
  tensors are the whole); AdamW fused on the CPU (foreach where the fused one refuses the parameters).
  --fsdp-dtype bf16 (default): bf16 parameters, gradients and AdamW state (8 bytes a parameter on the host: 64 GB for
  8B); fp32: fp32 parameters under MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (16 bytes a parameter,
  128 GB for 8B, more than a 128 GiB machine holds beside the rest). --compile-mode default (default): each block under
  torch.compile before fully_shard (TorchTitan's order: the FSDP hooks stay outside the graphs), and the head + loss;
  none: eager. Timed by wall clock with a device synchronisation at each step's end (the step waits for the CPU's
  update anyway).

Timing (single): CUDA events at every step boundary, no host wait inside the loop; the median step of --steps timed
steps after --warmup steps (the first of which compiles). tokens/s = B*T (fsdp: microbatches*B*T) / median.
MFU as train_gpt computes it: (6 x (parameters that multiply: all but an untied head's wte) + 12 L C T) FLOPs a token
against the GPU's dense bf16 peak (kernels/gpu_support.h's table; H100/H200 SXM 989 TFLOP/s).

Output, per (mode, backend) of --mode single:
  RESULT tokens_per_s=... ms_per_step=... peak_mem_gib=... peak_reserved_gib=... mfu=... mode=... backend=... gqa=...
then
  BEST tokens_per_s=... ms_per_step=... peak_mem_gib=... peak_reserved_gib=... mfu=... mode=... backend=... gqa=...
--mode fsdp: one RESULT line (with host_peak_gib, optimizer=fused|foreach).

Other uses:
  --write-shard PATH --vocab V [--tokens N]: a shard of N random tokens below V in llm.c's format for V
    (docs/formats.md: uint16, magic 20240520 version 1, while V <= 65536; else uint32, magic 20240801 version 7)
  --smoke: CPU only, any torch >= 1.13: every preset's parameter count against its published one (on the meta device),
    a tiny model's forward, backward and two AdamW steps, the attention paths against each other, the shard writer

  bench_pytorch_llama.py --model llama3-1b -b 8 -t 2048 --steps 10 --train-data build/bench_llama/random_v128256.bin
  bench_pytorch_llama.py --mode fsdp --model llama3-8b -b 4 --microbatches 8 -t 2048 --steps 2 --warmup 1
"""
import argparse
import gc
import glob
import math
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
import traceback
import warnings

# The compiled-graph caches do not key on the SDPA backend chosen when the graph was traced (pytorch/pytorch#185449):
# off, so that the cuDNN run cannot reuse the flash graph (and again below, on the configs).
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
for _module, _pip in (("numpy", "numpy"), ("torch", "torch")):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: bench/bench_pytorch_llama.py needs {_module}{_why}: pip install {_pip}")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:  # torch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    SDPBackend = sdpa_kernel = None

# model/config.h config_from_preset: layers, channels, heads, kv heads, ffn, vocab, max seq len, rope theta, norm eps,
# Llama 3 rope factor (low 1, high 4, over 8192 positions; 0: none), tied head, q/k/v biases
PRESETS = {
    "llama3-1b": (16, 2048, 32, 8, 8192, 128256, 131072, 500000.0, 1e-5, 32.0, True, False),
    "llama3-3b": (28, 3072, 24, 8, 8192, 128256, 131072, 500000.0, 1e-5, 32.0, True, False),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 131072, 500000.0, 1e-5, 8.0, False, False),
    "smollm2-135m": (30, 576, 9, 3, 1536, 49152, 8192, 100000.0, 1e-5, 0.0, True, False),
    "smollm2-360m": (32, 960, 15, 5, 2560, 49152, 8192, 100000.0, 1e-5, 0.0, True, False),
    "qwen2.5-0.5b": (24, 896, 14, 2, 4864, 151936, 32768, 1000000.0, 1e-6, 0.0, True, True),
    "qwen2.5-7b": (28, 3584, 28, 4, 18944, 152064, 131072, 1000000.0, 1e-6, 0.0, False, True),
}
# the published parameter counts (test/test_layout.cpp), checked by --smoke
PRESET_PARAMETERS = {"llama3-1b": 1235814400, "llama3-3b": 3212749824, "llama3-8b": 8030261248,
                     "smollm2-135m": 134515008, "smollm2-360m": 361821120, "qwen2.5-0.5b": 494032768,
                     "qwen2.5-7b": 7615616512}
SHARD_FORMATS = {1: (20240520, "<u2", 2), 7: (20240801, "<u4", 4)}  # version: magic, token dtype, bytes
HEADER_INTS = 256
# kernels/gpu_support.h's dense bf16 peaks (TFLOP/s): the first entry whose every word the GPU's name holds
GPU_PEAKS = [(("GB200",), 2500), (("B200",), 2250), (("RTX", "5090"), 209.5),
             (("H100", "PCIe"), 756), (("H100", "NVL"), 835), (("H800", "PCIe"), 756), (("H200", "NVL"), 835),
             (("GH200",), 989), (("H100",), 989), (("H800",), 989), (("H200",), 989), (("H20",), 148),
             (("L40S",), 362), (("L40",), 181), (("L4",), 121), (("RTX", "6000", "Ada"), 364),
             (("RTX", "4090"), 165.2), (("RTX", "4080"), 97.5),
             (("A100",), 312), (("A800",), 312), (("A30",), 165), (("A40",), 149.7), (("A10",), 125),
             (("RTX", "A6000"), 154.8), (("RTX", "A5000"), 111.1), (("RTX", "A4000"), 76.7),
             (("RTX", "3090", "Ti"), 80), (("RTX", "3090"), 71), (("RTX", "3080"), 59.5)]


def dense_bf16_peak_tflops(name):
    words = set(name.replace("-", " ").replace("_", " ").split())
    for needed, tflops in GPU_PEAKS:
        if all(w in words for w in needed):
            return tflops
    return 0.0


def first_line(text):
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


# ----------------------------------------------------------------------------------------------------------
# the model

class Config:
    def __init__(self, layers, channels, heads, kv_heads, ffn, vocab, max_seq_len, theta, eps, rope_factor, tied,
                 qkv_bias):
        self.layers, self.channels, self.heads, self.kv_heads, self.ffn = layers, channels, heads, kv_heads, ffn
        self.vocab, self.padded_vocab = vocab, (vocab + 127) // 128 * 128  # model/config.h pad_vocab
        self.max_seq_len, self.theta, self.eps, self.rope_factor = max_seq_len, theta, eps, rope_factor
        self.tied, self.qkv_bias = tied, qkv_bias
        self.head_size = channels // heads

    def text(self):
        return (f"L={self.layers} C={self.channels} heads={self.heads} kv_heads={self.kv_heads} ffn={self.ffn} "
                f"V={self.vocab} (padded {self.padded_vocab}) {'tied' if self.tied else 'untied'} head")


def rope_inv_freq(head_size, theta, factor=0.0, low=1.0, high=4.0, positions=8192):
    """RoPE's inverse frequencies; with factor != 0 Llama 3's scaling (as transformers' "llama3" rope type)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.int64).to(dtype=torch.float) / head_size))
    if factor == 0.0:
        return inv_freq
    low_freq_wavelen, high_freq_wavelen = positions / low, positions / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (positions / wavelen - low) / (high - low)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_tables(cfg, T, device):
    """cos and sin of every position and rotary frequency, (T, head_size), fp32, halves repeated (rotate-half form)."""
    inv_freq = rope_inv_freq(cfg.head_size, cfg.theta, cfg.rope_factor)
    if device is not None:
        inv_freq = inv_freq.to(device)
    freqs = torch.outer(torch.arange(T, device=device, dtype=torch.float), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rms_norm(x, weight, eps):
    if hasattr(F, "rms_norm"):  # torch >= 2.4
        return F.rms_norm(x, (x.size(-1),), weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, C, eps, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def apply_rope(x, cos, sin):
    """x (B, T, heads, head_size); cos and sin (T, head_size)."""
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def attention(q, k, v, gqa):
    """Causal attention of q (B, H, T, hs) over k and v (B, KV, T, hs). gqa: enable_gqa (SDPA broadcasts the key/value
    heads), repeat (repeat_interleave to H heads, then SDPA), math (written out, for torches without SDPA)."""
    groups = q.size(1) // k.size(1)
    if gqa == "enable_gqa" and groups > 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if gqa != "math":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


class Attention(nn.Module):
    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        C, kv = cfg.channels, cfg.kv_heads * cfg.head_size
        self.qkv = nn.Linear(C, C + 2 * kv, bias=cfg.qkv_bias, device=device, dtype=dtype)
        self.proj = nn.Linear(C, C, bias=False, device=device, dtype=dtype)
        self.heads, self.kv_heads, self.head_size = cfg.heads, cfg.kv_heads, cfg.head_size
        self.gqa = "enable_gqa"

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        kv = self.kv_heads * self.head_size
        q, k, v = self.qkv(x).split([C, kv, kv], dim=-1)
        q = apply_rope(q.view(B, T, self.heads, self.head_size), cos, sin).transpose(1, 2)
        k = apply_rope(k.view(B, T, self.kv_heads, self.head_size), cos, sin).transpose(1, 2)
        v = v.view(B, T, self.kv_heads, self.head_size).transpose(1, 2)
        y = attention(q, k, v, self.gqa)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        self.gate_up = nn.Linear(cfg.channels, 2 * cfg.ffn, bias=False, device=device, dtype=dtype)
        self.down = nn.Linear(cfg.ffn, cfg.channels, bias=False, device=device, dtype=dtype)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        self.norm1 = RMSNorm(cfg.channels, cfg.eps, device, dtype)
        self.attn = Attention(cfg, device, dtype)
        self.norm2 = RMSNorm(cfg.channels, cfg.eps, device, dtype)
        self.mlp = MLP(cfg, device, dtype)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    """The final norm, the LM head and the loss (one compiled graph under --compile-scope blocks)."""

    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        self.norm = RMSNorm(cfg.channels, cfg.eps, device, dtype)
        self.lm_head = nn.Linear(cfg.channels, cfg.padded_vocab, bias=False, device=device, dtype=dtype)

    def forward(self, x, targets):
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class Llama(nn.Module):
    def __init__(self, cfg, T, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.channels, device=device, dtype=dtype)
        self.blocks = nn.ModuleList(Block(cfg, device, dtype) for _ in range(cfg.layers))
        self.head = Head(cfg, device, dtype)
        if cfg.tied:
            self.head.lm_head.weight = self.wte.weight
        if device is None or torch.device(device).type != "meta":
            cos, sin = rope_tables(cfg, T, device)
        else:
            cos, sin = torch.empty(T, cfg.head_size, device="meta"), torch.empty(T, cfg.head_size, device="meta")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def set_gqa(self, gqa):
        for m in self.modules():
            if isinstance(m, Attention):
                m.gqa = gqa

    def init_weights(self):
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith("norm2.weight"):
                    p.fill_(1.0)
                elif p.dim() == 1:
                    p.zero_()  # q/k/v biases
                else:
                    std = 0.02 / math.sqrt(2 * self.cfg.layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                    p.normal_(0.0, std)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(x, targets)


def unique_parameters(model):
    seen, out = set(), []
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def flops_per_token(cfg, n_params, T):
    """train_gpt's StepLog: 6 per parameter that multiplies (not an untied head's wte, which is looked up) + 12 L C T."""
    looked_up = 0 if cfg.tied else cfg.padded_vocab * cfg.channels
    return 6.0 * (n_params - looked_up) + 12.0 * cfg.layers * cfg.channels * T


def param_groups(params, weight_decay):
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lr_at(step, max_lr, warmup, total):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    final = 0.1 * max_lr
    return final + 0.5 * (max_lr - final) * (1.0 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------------------------------------
# token shards

def write_shard(path, vocab, n, seed):
    version = 1 if vocab <= 65536 else 7
    magic, dtype, _ = SHARD_FORMATS[version]
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (magic, version, n)
    tokens = np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.int64).astype(dtype)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    os.replace(tmp, path)
    return version


def read_shards(pattern, needed):
    paths = sorted(glob.glob(pattern))
    if not paths:
        sys.exit(f"--train-data {pattern}: no file matches")
    parts, have = [], 0
    for path in paths:
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
        fmt = SHARD_FORMATS.get(int(header[1])) if len(header) == HEADER_INTS else None
        if fmt is None or header[0] != fmt[0]:
            sys.exit(f"{path}: not an llm.c token shard (magic 20240520 version 1, or 20240801 version 7)")
        n = int(header[2])
        if os.path.getsize(path) != 4 * HEADER_INTS + fmt[2] * n:
            sys.exit(f"{path}: file size != {4 * HEADER_INTS + fmt[2] * n} for {n} tokens")
        take = min(n, needed - have)
        parts.append(np.fromfile(path, dtype=fmt[1], count=take, offset=4 * HEADER_INTS).astype(np.int64))
        have += take
        if have >= needed:
            break
    return np.concatenate(parts)


def load_tokens(args, cfg, needed, device):
    if args.train_data:
        tokens = torch.from_numpy(read_shards(args.train_data, needed))
        if int(tokens.max()) >= cfg.vocab:
            sys.exit(f"--train-data holds token {int(tokens.max())}, not below the vocabulary {cfg.vocab}")
        if len(tokens) < needed:  # wrap around
            tokens = tokens.repeat((needed + len(tokens) - 1) // len(tokens))[:needed]
        return tokens.to(device)
    g = torch.Generator(device=device)
    g.manual_seed(args.seed)
    return torch.randint(0, cfg.vocab, (needed,), device=device, dtype=torch.long, generator=g)


# ----------------------------------------------------------------------------------------------------------
# SDPA backends and what ran

EXPECTED_OP = {"flash": "_scaled_dot_product_flash_attention", "cudnn": "_scaled_dot_product_cudnn_attention"}


def backend_context(name):
    if sdpa_kernel is not None:
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION if name == "flash" else SDPBackend.CUDNN_ATTENTION)
    return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)


def has_enable_gqa():
    try:
        import inspect
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try it
        try:
            x = torch.zeros(1, 2, 4, 8)
            F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
            return True
        except (TypeError, RuntimeError, AttributeError):
            return False


def probe_backend(name, cfg, T, device):
    """(gqa, None): the GQA path this backend runs for a causal bf16 forward and backward of this shape, checked
    against an fp32 reference; (None, why) if none does."""
    if name == "cudnn":
        if sdpa_kernel is None or not hasattr(SDPBackend, "CUDNN_ATTENTION"):
            return None, f"torch {torch.__version__} has no SDPBackend.CUDNN_ATTENTION (torch >= 2.3 needed)"
        if not torch.backends.cudnn.is_available():
            return None, "torch.backends.cudnn.is_available() is False"
    H, KV, hs = cfg.heads, cfg.kv_heads, cfg.head_size
    candidates = (["enable_gqa"] if KV != H and has_enable_gqa() else []) + ["repeat"]
    g = torch.Generator(device=device)
    g.manual_seed(0)
    Tp = min(T, 512)
    q, k, v = (torch.randn(1, n, Tp, hs, device=device, generator=g).requires_grad_() for n in (H, KV, KV))
    dout = torch.randn(1, H, Tp, hs, device=device, generator=g)
    reference = attention(q, k, v, "math")
    reference.backward(dout)
    why = []
    for gqa in candidates:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                qb, kb, vb = (t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
                with backend_context(name):
                    out = attention(qb, kb, vb, gqa)
                    out.backward(dout.to(torch.bfloat16))
                torch.cuda.synchronize(device)
                # bf16 against fp32: relative to each tensor's largest value
                err = max(((a.float() - b).abs().max() / b.abs().max()).item()
                          for a, b in ((out, reference), (qb.grad, q.grad), (kb.grad, k.grad), (vb.grad, v.grad)))
                if not err < 0.05:
                    why.append(f"{gqa}: relative error {err:.3g} against fp32 (output or gradients)")
                    continue
                return gqa, None
            except Exception as e:  # noqa: BLE001 (any failure means: not this path)
                warned = [first_line(w.message) for w in caught if first_line(w.message)]
                why.append(f"{gqa}: " + "; ".join([f"{type(e).__name__}: {first_line(e)}"] + warned[:2]))
    return None, " | ".join(why)


def attention_ops(prof):
    keys = ("scaled_dot_product", "flash", "fmha", "sdpa", "cudnn", "attention")
    found = [(not evt.key.startswith("aten::"), f"{evt.key[:100]} x{evt.count}") for evt in prof.key_averages()
             if any(k in evt.key.lower() for k in keys)]
    return [text for _, text in sorted(found)]


def profiled(fn, activities):
    """fn() under the profiler: its result and the attention operators it ran (or why the profiler failed)."""
    try:
        from torch.profiler import profile
        prof = profile(activities=activities)
        prof.__enter__()
    except Exception as e:  # noqa: BLE001 (the check is informative only)
        return fn(), [f"(profiler failed: {type(e).__name__}: {first_line(e)})"]
    try:
        result = fn()
    except BaseException:
        prof.__exit__(None, None, None)
        raise
    try:
        prof.__exit__(None, None, None)
        return result, attention_ops(prof)
    except Exception as e:  # noqa: BLE001
        return result, [f"(profiler failed: {type(e).__name__}: {first_line(e)})"]


def profiler_failed(ops):
    return bool(ops) and ops[0].startswith("(profiler failed")


def configure_dynamo():
    """No compiled graph from a cache that ignores the SDPA backend; identical blocks share one compiled graph
    (parameters as inputs: inline_inbuilt_nn_modules, the default from torch 2.5 on), with room for the
    recompilations an older torch makes per block."""
    try:
        import torch._inductor.config as inductor_config
        inductor_config.fx_graph_cache = False
    except (ImportError, AttributeError):
        pass
    try:
        import torch._functorch.config as functorch_config
        if hasattr(functorch_config, "enable_autograd_cache"):
            functorch_config.enable_autograd_cache = False
    except ImportError:
        pass
    try:
        import torch._dynamo.config as dynamo_config
        if hasattr(dynamo_config, "inline_inbuilt_nn_modules"):
            dynamo_config.inline_inbuilt_nn_modules = True
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), 128))
        if hasattr(dynamo_config, "accumulated_cache_size_limit"):
            dynamo_config.accumulated_cache_size_limit = max(dynamo_config.accumulated_cache_size_limit, 1024)
    except ImportError:
        pass


def reset_compiled():
    torch._dynamo.reset()
    try:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        reset_cudagraph_trees()
    except Exception:  # noqa: BLE001 (older torch: dynamo's reset did it)
        pass


def compile_kwargs(mode):
    return {} if mode == "default" else {"mode": mode}


def compiled_graphs():
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001
        return -1


# ----------------------------------------------------------------------------------------------------------
# --mode single: one (compile mode, backend) run

def run_single(args, cfg, mode, backend, gqa, tokens, device, peak_tflops):
    B, T = args.batch_size, args.seq_len
    reset_compiled()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(args.seed)
    model = optimizer = step_fn = None
    try:
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        model = Llama(cfg, T, device=device, dtype=dtype)
        model.init_weights()
        model.set_gqa(gqa)
        params = unique_parameters(model)
        n_params = sum(p.numel() for p in params)
        fpt = flops_per_token(cfg, n_params, T)
        optimizer = torch.optim.AdamW(param_groups(params, args.weight_decay), lr=args.lr, betas=(0.9, 0.95),
                                      eps=1e-8, fused=True)
        graphs_before = compiled_graphs()
        if mode == "none":
            step_fn = model
        elif args.compile_scope == "model":
            step_fn = torch.compile(model, **compile_kwargs(mode))
        else:  # TorchTitan's: each block, and the head with the loss
            for i, block in enumerate(model.blocks):
                model.blocks[i] = torch.compile(block, **compile_kwargs(mode))
            model.head = torch.compile(model.head, **compile_kwargs(mode))
            step_fn = model
        count = (len(tokens) - 1) // (B * T)
        total_steps = args.warmup + args.steps
        cudagraphs = mode in ("reduce-overhead", "max-autotune")
        autocast = args.dtype == "autocast"

        def train_step(i):
            if cudagraphs and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
                torch.compiler.cudagraph_mark_step_begin()
            start = (i % count) * B * T
            window = tokens[start:start + B * T + 1]
            x, y = window[:-1].view(B, T).clone(), window[1:].view(B, T).clone()
            if autocast:
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = step_fn(x, y)
            else:
                loss = step_fn(x, y)
            loss.backward()
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(i, args.lr, args.lr_warmup, total_steps)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach().clone() if cudagraphs else loss.detach()

        losses, first_ops = [], []
        with backend_context(backend):
            t0 = time.perf_counter()
            if cudagraphs and not args.no_kernel_check:  # a replayed graph dispatches no operator: check step 0
                from torch.profiler import ProfilerActivity
                loss0, first_ops = profiled(lambda: train_step(0), [ProfilerActivity.CPU])
                losses.append(loss0)
            else:
                losses.append(train_step(0))  # compiles
            torch.cuda.synchronize(device)
            first_s = time.perf_counter() - t0
            for i in range(1, args.warmup):
                losses.append(train_step(i))
            torch.cuda.synchronize(device)
            warm_s = time.perf_counter() - t0
            events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
            t1 = time.perf_counter()
            for i in range(args.steps):
                events[i].record()
                losses.append(train_step(args.warmup + i))
            events[-1].record()
            torch.cuda.synchronize(device)
            wall_s = time.perf_counter() - t1
            peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
            reserved = torch.cuda.max_memory_reserved(device) / 2 ** 30
            ops, verified = [], "unchecked"
            if not args.no_kernel_check:
                from torch.profiler import ProfilerActivity
                _, ops = profiled(lambda: (train_step(total_steps), torch.cuda.synchronize(device)),
                                  [ProfilerActivity.CPU, ProfilerActivity.CUDA])
                profiles = [p for p in ([ops, first_ops] if cudagraphs else [ops]) if not profiler_failed(p)]
                if profiles:
                    verified = "yes" if any(EXPECTED_OP[backend] in op for p in profiles for op in p) else "NO"
        graphs = compiled_graphs() - graphs_before if graphs_before >= 0 else -1
        step_ms = [events[i].elapsed_time(events[i + 1]) for i in range(args.steps)]
        ms = statistics.median(step_ms)
        loss_values = torch.stack(losses).float().cpu().tolist()
        if not all(math.isfinite(v) for v in loss_values):
            raise RuntimeError(f"non-finite loss: {loss_values}")
        tag = f"{mode}/{backend}/{gqa}"
        print(f"{tag}: first step (compiles) {first_s:.1f} s, {args.warmup} warm-up steps {warm_s:.1f} s, "
              f"{args.steps} timed steps {wall_s:.2f} s wall; step ms min {min(step_ms):.2f} median {ms:.2f} "
              f"max {max(step_ms):.2f}; loss {loss_values[0]:.4f} -> {loss_values[-1]:.4f}; "
              f"dynamo graphs compiled {graphs}", flush=True)
        if first_ops:
            print(f"{tag}: attention ops of the first step (before the CUDA graphs): {'; '.join(first_ops[:8])}",
                  flush=True)
        if ops:
            print(f"{tag}: attention ops of one profiled step: {'; '.join(ops[:8])}", flush=True)
        tok_s = B * T / (ms / 1000.0)
        mfu = 100.0 * fpt * tok_s / (peak_tflops * 1e12) if peak_tflops > 0 else float("nan")
        result = dict(mode=mode, backend=backend, gqa=gqa, tokens_per_s=tok_s, ms_per_step=ms, peak_mem_gib=peak,
                      peak_reserved_gib=reserved, mfu=mfu, verified=verified, compile_s=first_s)
        print("RESULT " + result_text(result) + f" compile_s={first_s:.1f} verified={verified}", flush=True)
        return result
    finally:
        model = optimizer = step_fn = None
        reset_compiled()


def result_text(r):
    return (f"tokens_per_s={r['tokens_per_s']:.1f} ms_per_step={r['ms_per_step']:.3f} peak_mem_gib={r['peak_mem_gib']:.3f} "
            f"peak_reserved_gib={r['peak_reserved_gib']:.3f} mfu={r['mfu']:.1f} mode={r['mode']} backend={r['backend']} "
            f"gqa={r['gqa']}")


def main_single(args, cfg, device, gpu, peak_tflops):
    B, T = args.batch_size, args.seq_len
    print(f"PyTorch Llama {args.model} ({cfg.text()}), B={B} T={T}, "
          f"{'bf16 autocast over fp32 parameters' if args.dtype == 'autocast' else 'bf16 parameters'}, "
          f"fused AdamW, grad clip {args.grad_clip}, compile scope {args.compile_scope}; torch {torch.__version__}, "
          f"{gpu}, cuDNN {torch.backends.cudnn.version()}, peak {peak_tflops:g} TFLOP/s", flush=True)
    wanted = ["flash", "cudnn"] if args.backend == "both" else [args.backend]
    backends = []
    for name in wanted:
        gqa, why = probe_backend(name, cfg, T, device)
        if gqa is None:
            print(f"backend {name} unavailable: {why}", flush=True)
        else:
            print(f"backend {name}: GQA by {gqa}{'' if cfg.kv_heads != cfg.heads else ' (no GQA: as many kv heads as heads)'}",
                  flush=True)
            backends.append((name, gqa))
    if not backends:
        print("no SDPA backend available; trying flash with repeat_interleave anyway", flush=True)
        backends = [("flash", "repeat")]
    needed = min(args.warmup + args.steps + 2, 64) * B * T + 1
    tokens = load_tokens(args, cfg, needed, device)

    results = []
    for mode in args.compile_modes.split():
        for name, gqa in backends:
            tries = [gqa] + (["repeat"] if gqa == "enable_gqa" else [])
            for attempt in tries:
                try:
                    r = run_single(args, cfg, mode, name, attempt, tokens, device, peak_tflops)
                except Exception as e:  # noqa: BLE001 (one run failing must not hide the others)
                    print(f"{mode}/{name}/{attempt} failed: {type(e).__name__}: {first_line(e)}", flush=True)
                    traceback.print_exc(file=sys.stdout)
                    if isinstance(e, torch.cuda.OutOfMemoryError):
                        print("(out of GPU memory: try a smaller --batch-size)", flush=True)
                    break
                results.append(r)
                if r["verified"] != "NO":
                    break
                print(f"{mode}/{name}/{attempt}: WARNING: the profiled step did not run {EXPECTED_OP[name]}; left out "
                      f"of BEST{'; again with repeat_interleave' if attempt != tries[-1] else ''}", flush=True)
    if not results:
        print("no run finished", flush=True)
        return 1
    valid = [r for r in results if r["verified"] != "NO"]
    if not valid:
        print("WARNING: no run's profiled step ran the SDPA operator it asked for; BEST is unverified", flush=True)
        valid = results
    best = max(valid, key=lambda r: r["tokens_per_s"])
    others = "; ".join(f"{r['mode']}/{r['backend']}/{r['gqa']} {r['tokens_per_s']:.1f}" for r in results)
    print(f"BEST {result_text(best)} verified={best['verified']} (of: {others})", flush=True)
    return 0


# ----------------------------------------------------------------------------------------------------------
# --mode fsdp: FSDP2 with CPU offload on one rank

def fsdp_api():
    try:  # torch >= 2.6
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    return fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main_fsdp(args, cfg, device, gpu, peak_tflops):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy = fsdp_api()
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())), ("RANK", "0"),
                       ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    if int(os.environ["WORLD_SIZE"]) != 1:
        sys.exit("--mode fsdp runs one rank (the single-GPU baseline)")
    dist.init_process_group("cpu:gloo,cuda:nccl")  # gloo: the offloaded (host) gradients' norm
    B, T, m = args.batch_size, args.seq_len, args.microbatches
    bf16 = torch.bfloat16
    store = bf16 if args.fsdp_dtype == "bf16" else torch.float32
    mesh = init_device_mesh("cuda", (1,))
    mp = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=None if store == bf16 else torch.float32)
    offload = CPUOffloadPolicy(pin_memory=True)
    torch.manual_seed(args.seed)
    with torch.device("meta"):
        model = Llama(cfg, T, device="meta", dtype=store)
    gqa, why = probe_backend(args.backend if args.backend != "both" else "cudnn", cfg, T, device)
    backend = args.backend if args.backend != "both" else "cudnn"
    if gqa is None and backend == "cudnn":
        print(f"SDPA cudnn unavailable ({why}): flash", flush=True)
        backend = "flash"
        gqa, why = probe_backend(backend, cfg, T, device)
    if gqa is None:
        sys.exit(f"SDPA {backend} unavailable: {why}")
    model.set_gqa(gqa)
    if args.compile_mode != "none":  # TorchTitan's order: compile each block, then shard it
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, **compile_kwargs(args.compile_mode))
        model.head = torch.compile(model.head, **compile_kwargs(args.compile_mode))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=True)
    model.to_empty(device="cpu")
    with torch.no_grad():  # initialised on the GPU a tensor at a time (a CPU normal_ of 8B values takes minutes)
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
                local.fill_(1.0)
            elif local.dim() == 1:
                local.zero_()
            else:
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                local.copy_(torch.empty(local.shape, device=device, dtype=local.dtype).normal_(0.0, std))
    cos, sin = rope_tables(cfg, T, device)
    model.cos, model.sin = cos, sin
    params = unique_parameters(model)
    n_params = sum(p.numel() for p in params)
    fpt = flops_per_token(cfg, n_params, T)
    print(f"PyTorch FSDP2 (fully_shard, one rank) with CPUOffloadPolicy: Llama {args.model} ({cfg.text()}), "
          f"{n_params / 1e9:.3f}B parameters stored in {args.fsdp_dtype} on the host, bf16 compute, {m} micro-batches "
          f"of {B} x {T} a step, SDPA {backend} (GQA by {gqa}), compile {args.compile_mode}; torch {torch.__version__}, "
          f"{gpu}, peak {peak_tflops:g} TFLOP/s", flush=True)

    def make_optimizer(fused):
        kind = {"fused": True} if fused else {"foreach": True}
        return torch.optim.AdamW(param_groups(params, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                 **kind)

    fused = True
    try:
        optimizer = make_optimizer(True)
    except (RuntimeError, ValueError) as e:
        print(f"fused AdamW refuses these parameters ({type(e).__name__}: {first_line(e)[:120]}): foreach", flush=True)
        fused, optimizer = False, make_optimizer(False)
    steps = args.warmup + args.steps
    g = torch.Generator(device=device)
    g.manual_seed(args.seed)
    data = torch.randint(0, cfg.vocab, (steps, m * B, T + 1), device=device, generator=g)

    def train_step(i):
        nonlocal optimizer, fused
        total = torch.zeros((), device=device)
        with backend_context(backend):
            for k in range(m):
                model.set_requires_gradient_sync(k == m - 1)
                rows = data[i, k * B:(k + 1) * B]
                loss = model(rows[:, :-1].contiguous(), rows[:, 1:].contiguous())
                (loss / m).backward()
                total += loss.detach().float()
        grads = [p.grad for p in params if p.grad is not None]
        local = [q.to_local() if hasattr(q, "to_local") else q for q in grads]
        if args.grad_clip > 0:  # one rank: the local (host) gradients are the whole, as clip_grad_norm_ would see
            norm = torch.stack([n.float() for n in torch._foreach_norm(local, 2.0)]).norm()
            torch._foreach_mul_(local, torch.clamp(args.grad_clip / (norm + 1e-6), max=1.0).to(local[0].dtype))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(i, args.lr, args.lr_warmup, steps)
        try:
            optimizer.step()
        except (RuntimeError, NotImplementedError) as e:
            if not fused:
                raise
            print(f"fused AdamW refuses these parameters ({type(e).__name__}: {first_line(e)[:120]}): foreach",
                  flush=True)
            fused, optimizer = False, make_optimizer(False)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total / m

    losses, step_s = [], []
    t0 = time.perf_counter()
    for i in range(args.warmup):
        losses.append(train_step(i))
        torch.cuda.synchronize(device)
        print(f"warm-up step {i + 1}: {time.perf_counter() - t0:.1f} s since the first", flush=True)
    torch.cuda.reset_peak_memory_stats(device)
    for i in range(args.steps):
        t = time.perf_counter()
        losses.append(train_step(args.warmup + i))
        torch.cuda.synchronize(device)
        step_s.append(time.perf_counter() - t)
    ms = statistics.median(step_s) * 1e3
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    loss_values = [x.item() for x in losses]
    print(f"steps ms {', '.join(f'{s * 1e3:.0f}' for s in step_s)}; loss {loss_values[0]:.4f} -> {loss_values[-1]:.4f}",
          flush=True)
    dist.destroy_process_group()
    if not all(math.isfinite(v) for v in loss_values):
        print("non-finite loss", flush=True)
        return 1
    tok_s = m * B * T / (ms / 1000.0)
    mfu = 100.0 * fpt * tok_s / (peak_tflops * 1e12) if peak_tflops > 0 else float("nan")
    print(f"RESULT tokens_per_s={tok_s:.1f} ms_per_step={ms:.3f} peak_mem_gib={peak:.3f} peak_reserved_gib="
          f"{torch.cuda.max_memory_reserved(device) / 2 ** 30:.3f} host_peak_gib={host_peak:.2f} mfu={mfu:.1f} "
          f"mode=fsdp2-offload backend={backend} gqa={gqa} dtype={args.fsdp_dtype} compile={args.compile_mode} "
          f"microbatches={m} optimizer={'fused' if fused else 'foreach'}", flush=True)
    return 0


# ----------------------------------------------------------------------------------------------------------
# --smoke (CPU)

def smoke():
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    for name, shape in PRESETS.items():
        cfg = Config(*shape)
        model = Llama(cfg, 16, device="meta")
        n = sum(p.numel() for p in unique_parameters(model))
        check(n == PRESET_PARAMETERS[name], f"{name}: {n} parameters (published {PRESET_PARAMETERS[name]})")
    torch.manual_seed(0)
    for tied, kv in ((True, 2), (False, 4)):
        cfg = Config(2, 64, 4, kv, 96, 300, 64, 10000.0, 1e-5, 8.0, tied, False)
        model = Llama(cfg, 32)
        model.init_weights()
        x = torch.randint(0, cfg.vocab, (2, 32))
        y = torch.randint(0, cfg.vocab, (2, 32))
        paths = ["math", "repeat"] if hasattr(F, "scaled_dot_product_attention") else ["math"]
        if hasattr(F, "scaled_dot_product_attention") and has_enable_gqa():
            paths.append("enable_gqa")
        losses = {}
        for gqa in paths:
            model.set_gqa(gqa)
            losses[gqa] = model(x, y).item()
        ref = losses["math"]
        check(all(abs(v - ref) < 1e-4 for v in losses.values()), f"tied={tied} kv={kv}: attention paths agree {losses}")
        check(abs(ref - math.log(cfg.padded_vocab)) < 0.5, f"tied={tied}: initial loss {ref:.3f} near ln(Vp) "
              f"{math.log(cfg.padded_vocab):.3f}")
        opt = torch.optim.AdamW(param_groups(unique_parameters(model), 0.1), lr=3e-3, betas=(0.9, 0.95))
        model.set_gqa("math")
        values = []
        for _ in range(3):
            loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            values.append(loss.item())
        check(values[-1] < values[0], f"tied={tied}: loss falls over 3 steps {[round(v, 4) for v in values]}")
        check(model.head.lm_head.weight is model.wte.weight if tied else model.head.lm_head.weight is not model.wte.weight,
              f"tied={tied}: head {'is' if tied else 'is not'} wte")
    # causal: a later token does not change an earlier position's output
    cfg = Config(1, 32, 4, 2, 64, 50, 16, 10000.0, 1e-5, 0.0, True, False)
    att = Attention(cfg)
    att.gqa = "math"
    cos, sin = rope_tables(cfg, 8, None)
    a = torch.randn(1, 8, 32)
    b = a.clone()
    b[0, 7] += 1.0
    check(torch.allclose(att(a, cos, sin)[0, :7], att(b, cos, sin)[0, :7], atol=1e-6), "attention is causal")
    with tempfile.TemporaryDirectory() as d:
        for vocab, version in ((49152, 1), (128256, 7)):
            path = os.path.join(d, f"s{vocab}.bin")
            v = write_shard(path, vocab, 1000, 1)
            tokens = read_shards(path, 10 ** 6)
            header = np.fromfile(path, dtype="<i4", count=3)
            check(v == version and header[0] == SHARD_FORMATS[version][0] and len(tokens) == 1000 and tokens.max() < vocab
                  and os.path.getsize(path) == 1024 + SHARD_FORMATS[version][2] * 1000,
                  f"shard of vocabulary {vocab}: version {v}, magic {header[0]}, {len(tokens)} tokens, max {tokens.max()}")
    check(dense_bf16_peak_tflops("NVIDIA H100 80GB HBM3") == 989 and dense_bf16_peak_tflops("NVIDIA H100 PCIe") == 756
          and dense_bf16_peak_tflops("NVIDIA H200") == 989, "peak table: H100 SXM 989, PCIe 756, H200 989")
    print(f"smoke: {len(failures)} failure(s)", flush=True)
    return 1 if failures else 0


# ----------------------------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="single", choices=["single", "fsdp"])
    p.add_argument("--model", default="llama3-1b", help=", ".join(PRESETS))
    p.add_argument("--batch-size", "-b", type=int, default=8, help="rows a step (fsdp: a micro-batch)")
    p.add_argument("--seq-len", "-t", type=int, default=2048)
    p.add_argument("--microbatches", type=int, default=1, help="fsdp: micro-batches a step")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after the warm-up steps)")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps first; the first compiles (>= 1)")
    p.add_argument("--backend", default="both", choices=["flash", "cudnn", "both"],
                   help="SDPA backend(s); fsdp: one (both: cuDNN, flash where cuDNN cannot run)")
    p.add_argument("--compile-modes", default="default reduce-overhead",
                   help="single: the torch.compile modes timed, space-separated (default, reduce-overhead, "
                        "max-autotune-no-cudagraphs, max-autotune, none = eager)")
    p.add_argument("--compile-scope", default="blocks", choices=["blocks", "model"])
    p.add_argument("--compile-mode", default="default", choices=["default", "none"], help="fsdp: compile the blocks")
    p.add_argument("--dtype", default="autocast", choices=["autocast", "bf16"], help="single: the parameters' setup")
    p.add_argument("--fsdp-dtype", default="bf16", choices=["bf16", "fp32"], help="fsdp: the stored parameters")
    p.add_argument("--train-data", default="", help="token shards (glob); default: random tokens made here")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--lr-warmup", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--no-kernel-check", action="store_true", help="single: skip the profiled steps")
    p.add_argument("--write-shard", default="", help="write a random-token shard to this path and exit")
    p.add_argument("--vocab", type=int, default=0, help="--write-shard: tokens below this (default: the model's)")
    p.add_argument("--tokens", type=int, default=8_000_000, help="--write-shard: how many")
    p.add_argument("--smoke", action="store_true", help="CPU self-check of the model code and the shard writer")
    args = p.parse_args()

    if args.smoke:
        return smoke()
    if args.model not in PRESETS:
        sys.exit(f"--model {args.model}: not one of {', '.join(PRESETS)}")
    cfg = Config(*PRESETS[args.model])
    if args.write_shard:
        vocab = args.vocab or cfg.vocab
        if not 0 < vocab <= 2 ** 31 or args.tokens <= 0:
            sys.exit("--write-shard needs --vocab and --tokens > 0")
        version = write_shard(args.write_shard, vocab, args.tokens, args.seed)
        print(f"wrote {args.write_shard}: {args.tokens} random tokens below {vocab}, "
              f"{'uint16 (magic 20240520 version 1)' if version == 1 else 'uint32 (magic 20240801 version 7)'}")
        return 0
    if min(args.batch_size, args.seq_len, args.steps, args.warmup, args.microbatches) <= 0:
        sys.exit("--batch-size, --seq-len, --steps, --warmup and --microbatches must be positive")
    if args.seq_len > cfg.max_seq_len:
        sys.exit(f"--seq-len {args.seq_len}: {args.model} is for at most {cfg.max_seq_len}")
    if not hasattr(torch, "compile") or not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"torch {torch.__version__} has no torch.compile or SDPA (torch >= 2.0 needed; --smoke runs on older)")
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    configure_dynamo()
    with warnings.catch_warnings():  # TF32 for what autocast leaves in fp32 (the legacy call only; see bench_pytorch_gpt2)
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision("high")
    gpu = torch.cuda.get_device_name(device)
    peak_tflops = dense_bf16_peak_tflops(gpu)
    if args.mode == "fsdp":
        return main_fsdp(args, cfg, device, gpu, peak_tflops)
    return main_single(args, cfg, device, gpu, peak_tflops)


if __name__ == "__main__":
    sys.exit(main())
