#!/usr/bin/env python3
"""Plain-PyTorch GPT-2 reference for the C++/CUDA trainer.

Subcommands:
  debug-state    write an initial model file and a debug-state file (docs/formats.md) for correctness tests
  train          train on llm.c token shards (loss-curve comparisons and throughput benchmarks); launched by
                 torchrun (WORLD_SIZE > 1) it trains data-parallel with DDP or FSDP (--parallel)
  make-shard     write a shard of random tokens (for smoke tests)
  export-merged  base model file + LoRA adapter file -> merged llm.c model file

debug-state and train fine-tune with LoRA given --lora-rank or --lora-load: the base model is frozen and only
the adapters train (adapter file and LoRA debug state: docs/lora.md).

Runs on torch 1.13 (CPU) and torch 2.x (CUDA). Hyper-parameters, file formats, AdamW, the lr schedule and
the batch order follow docs/formats.md exactly.
"""
import argparse
import contextlib
import functools
import glob
import math
import os
import statistics
import sys
import time

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("numpy", "numpy"), ("torch", "torch")):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: scripts/reference/gpt2_reference.py needs {_module}{_why}: pip install {_pip}")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

HEADER_INTS = 256
GPT2_VOCAB = 50257
MODEL_MAGIC = 20240326
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
STATE_MAGIC, STATE_VERSION = 20240327, 2
LORA_STATE_VERSION = 3  # the debug state of a LoRA run (docs/lora.md)
LORA_MAGIC, LORA_VERSION = 20261127, 1
PRECISION_CODE = {"fp32": 0, "bf16": 1, "fp16": 2}
AUTOCAST_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}

# Model-file tensors in llm.c order; the ones that get weight decay (2+-dim per layer).
TENSOR_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAY_NAMES = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}

# LoRA targets in their fixed order (the order of the adapter file): flag name, Block attribute, bitmask bit,
# and the adapted Linear's (in, out) features in units of C.
LORA_TARGETS = [("qkv", "qkv", 1, 1, 3), ("attn-proj", "attn_proj", 2, 1, 1),
                ("fc", "fc", 4, 1, 4), ("fc-proj", "fc_proj", 8, 4, 1)]
LORA_ALL_TARGETS = 15


class InputError(Exception):
    """Bad user input; main() prints it as one line and exits 1."""


def padded_vocab_size(vocab_size):
    return (vocab_size + 127) // 128 * 128


class Config:
    def __init__(self, max_seq_len, vocab_size, num_layers, num_heads, channels, padded=None):
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size
        self.padded_vocab_size = padded if padded is not None else padded_vocab_size(vocab_size)
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.channels = channels
        if min(max_seq_len, vocab_size, num_layers, num_heads, channels) <= 0:
            raise InputError("model dimensions must be positive")
        if channels % num_heads:
            raise InputError(f"channels {channels} not divisible by heads {num_heads}")
        if self.padded_vocab_size < vocab_size:
            raise InputError(f"padded vocab {self.padded_vocab_size} < vocab {vocab_size}")

    def header(self, version):
        return [MODEL_MAGIC, version, self.max_seq_len, self.vocab_size, self.num_layers,
                self.num_heads, self.channels, self.padded_vocab_size]


# ----------------------------------------------------------------------------------------------------------
# Model

class LoraConfig:
    """Rank r, alpha (held as the float32 the adapter file stores), target bitmask, adapter-input dropout."""

    def __init__(self, rank, alpha, mask, dropout=0.0):
        self.rank, self.alpha, self.mask, self.dropout = rank, float(np.float32(alpha)), mask, dropout

    @property
    def scale(self):
        """alpha / r, computed in float32 (as the C++ side does)."""
        return float(np.float32(self.alpha) / np.float32(self.rank))


class LoraAdapter(nn.Module):
    """LoRA's term (alpha/r) B A dropout(x) for a frozen nn.Linear(in_features, out_features):
    A (r, in_features), B (out_features, r). Created zero; init_adapters or load_adapters fill it."""

    def __init__(self, in_features, out_features, lora):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(lora.rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, lora.rank))
        self.scale, self.dropout = lora.scale, lora.dropout

    def forward(self, x):
        return F.linear(F.linear(F.dropout(x, self.dropout, self.training), self.A), self.B) * self.scale


class Block(nn.Module):
    def __init__(self, cfg, sdpa):
        super().__init__()
        C = cfg.channels
        self.num_heads = cfg.num_heads
        self.sdpa = sdpa
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)
        self.adapters = nn.ModuleDict()  # LoRA adapters, keyed by the attribute name of the Linear they adapt

    def linear(self, name, x):
        """The Linear `name` applied to x, plus its LoRA adapter's term where it has one."""
        y = getattr(self, name)(x)
        return y + self.adapters[name](x) if name in self.adapters else y

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.num_heads
        q, k, v = (t.view(B, T, self.num_heads, hs).transpose(1, 2) for t in self.linear("qkv", x).split(C, dim=2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            att = F.softmax(att.masked_fill(future, float("-inf")), dim=-1)
            y = att @ v
        return self.linear("attn_proj", y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.linear("fc_proj", F.gelu(self.linear("fc", self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg, sdpa=False):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.empty(cfg.padded_vocab_size, cfg.channels))
        self.wpe = nn.Parameter(torch.empty(cfg.max_seq_len, cfg.channels))
        self.blocks = nn.ModuleList(Block(cfg, sdpa) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.channels, eps=1e-5)
        self.lora = None  # LoraConfig once add_lora ran

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets)

    # embed and head are methods of their own so that torch.compile still compiles them where it runs forward
    # eagerly: FSDP units break the graph inside the loop over the blocks, and dynamo skips a frame whose loop
    # breaks (each block is compiled on its own then).
    def embed(self, idx):
        return F.embedding(idx, self.wte) + self.wpe[:idx.shape[1]]

    def head(self, x, targets):
        # LM head over all Vp rows (as the CUDA trainer does), then drop the padded columns.
        logits = F.linear(self.ln_f(x), self.wte)[..., :self.cfg.vocab_size]
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, self.cfg.vocab_size).float(), targets.reshape(-1))
        return logits, loss

    def file_layout(self):
        """[(name, [tensors concatenated in the file])] in model-file order."""
        per_layer = {
            "ln1w": lambda b: b.ln_1.weight, "ln1b": lambda b: b.ln_1.bias,
            "qkvw": lambda b: b.qkv.weight, "qkvb": lambda b: b.qkv.bias,
            "attprojw": lambda b: b.attn_proj.weight, "attprojb": lambda b: b.attn_proj.bias,
            "ln2w": lambda b: b.ln_2.weight, "ln2b": lambda b: b.ln_2.bias,
            "fcw": lambda b: b.fc.weight, "fcb": lambda b: b.fc.bias,
            "fcprojw": lambda b: b.fc_proj.weight, "fcprojb": lambda b: b.fc_proj.bias,
        }
        layout = [("wte", [self.wte]), ("wpe", [self.wpe])]
        layout += [(name, [get(b) for b in self.blocks]) for name, get in per_layer.items()]
        layout += [("lnfw", [self.ln_f.weight]), ("lnfb", [self.ln_f.bias])]
        assert [name for name, _ in layout] == TENSOR_NAMES
        return layout

    def add_lora(self, lora):
        """Freezes every base parameter and gives the targeted Linears of every block a (zero) adapter."""
        for p in self.parameters():
            p.requires_grad_(False)
        for block in self.blocks:
            for _, attr, bit, _, _ in LORA_TARGETS:
                if lora.mask & bit:
                    linear = getattr(block, attr)
                    block.adapters[attr] = LoraAdapter(linear.in_features, linear.out_features, lora)
        self.lora = lora

    def adapter_tensors(self):
        """[A, B, A, B, ...]: per layer, per target in LORA_TARGETS order (the adapter file's order)."""
        return [t for block in self.blocks for _, attr, _, _, _ in LORA_TARGETS if attr in block.adapters
                for t in (block.adapters[attr].A, block.adapters[attr].B)]

    def trainable(self):
        """(trainable tensors in file order, those that get weight decay, those that get none): with LoRA only
        the adapters, which all get it (A and B are 2-D); else every parameter, decay per DECAY_NAMES."""
        if self.lora is not None:
            adapters = self.adapter_tensors()
            return adapters, adapters, []
        decay, no_decay = [], []
        for name, tensors in self.file_layout():
            (decay if name in DECAY_NAMES else no_decay).extend(tensors)
        return [t for _, ts in self.file_layout() for t in ts], decay, no_decay


@torch.no_grad()
def init_weights(model, seed):
    """N(0, 0.02) weights, N(0, 0.02/sqrt(2L)) residual projections, zero biases, LN = (1, 0), zero wte padding."""
    gen = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * model.cfg.num_layers)
    std = {"wte": 0.02, "wpe": 0.02, "qkvw": 0.02, "attprojw": residual_std, "fcw": 0.02, "fcprojw": residual_std}
    for name, tensors in model.file_layout():
        for t in tensors:
            if name in std:
                t.normal_(0.0, std[name], generator=gen)
            elif name in ("ln1w", "ln2w", "lnfw"):
                t.fill_(1.0)
            else:
                t.zero_()
    model.wte[model.cfg.vocab_size:].zero_()


def read_exact(f, path, nbytes, what):
    data = f.read(nbytes)
    if len(data) != nbytes:
        raise InputError(f"{path}: truncated while reading {what}")
    return data


@torch.no_grad()
def load_model(path, sdpa):
    """Reads an llm.c model file (version 3 fp32 or 5 bf16) into a fresh fp32 CPU model."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such model file")
    with open(path, "rb") as f:
        header = np.frombuffer(read_exact(f, path, 4 * HEADER_INTS, "header"), dtype="<i4")
        if header[0] != MODEL_MAGIC:
            raise InputError(f"{path}: bad model magic {header[0]} (expected {MODEL_MAGIC})")
        version = int(header[1])
        if version not in (3, 5):
            raise InputError(f"{path}: unsupported model version {version} (expected 3 or 5)")
        cfg = Config(*(int(x) for x in header[2:7]), padded=int(header[7]))
        model = GPT(cfg, sdpa)
        layout = model.file_layout()
        total = sum(t.numel() for _, ts in layout for t in ts)
        elem = 4 if version == 3 else 2
        expected = 4 * HEADER_INTS + elem * total
        if os.path.getsize(path) != expected:
            raise InputError(f"{path}: file size {os.path.getsize(path)} != {expected} expected from its header")
        raw = np.frombuffer(read_exact(f, path, elem * total, "tensors"), dtype="<f4" if version == 3 else "<u2")
        if version == 5:  # bf16 is the top half of an fp32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        offset = 0
        for _, tensors in layout:
            for t in tensors:
                t.copy_(torch.from_numpy(raw[offset:offset + t.numel()].copy()).view_as(t))
                offset += t.numel()
    return model


@torch.no_grad()
def write_model(model, path, merge_lora=False):
    """Writes a version-3 (fp32) llm.c model file atomically. merge_lora: every weight that has a LoRA adapter
    is written as W0 + (alpha/r) B A, summed in float64 and rounded once to fp32 (as the C++ lora_merge)."""
    merged = {}
    if merge_lora:
        for block in model.blocks:
            for attr, adapter in block.adapters.items():
                w = getattr(block, attr).weight
                merged[id(w)] = (w.double() + adapter.scale * (adapter.B.double() @ adapter.A.double())).float()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header_bytes(model.cfg.header(3)))
        for _, tensors in model.file_layout():
            for t in tensors:
                f.write(merged.get(id(t), t).detach().float().cpu().numpy().astype("<f4").tobytes())
    os.replace(tmp, path)


def header_bytes(words):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:len(words)] = words
    return header.tobytes()


def f32_bits(x):
    return int(np.array([x], dtype="<f4").view("<i4")[0])


def build_model(args):
    """Model from --init-from, or from the config flags and --seed. Returns an fp32 CPU model."""
    config_flags = {"layers": args.layers, "heads": args.heads, "channels": args.channels,
                    "max_seq_len": args.max_seq_len}
    if args.init_from:
        model = load_model(args.init_from, args.sdpa)
        cfg = model.cfg
        from_file = {"layers": cfg.num_layers, "heads": cfg.num_heads, "channels": cfg.channels,
                     "max_seq_len": cfg.max_seq_len}
        for key, value in config_flags.items():
            if value is not None and value != from_file[key]:
                raise InputError(f"--{key.replace('_', '-')} {value} conflicts with {args.init_from} ({from_file[key]})")
        if args.vocab_size is not None and args.vocab_size != cfg.vocab_size:
            raise InputError(f"--vocab-size {args.vocab_size} conflicts with {args.init_from} ({cfg.vocab_size})")
        return model
    missing = [k for k in ("layers", "heads", "channels") if config_flags[k] is None]
    if missing:
        raise InputError("without --init-from, need " + ", ".join("--" + k for k in missing))
    max_seq_len = args.max_seq_len if args.max_seq_len is not None else args.seq_len
    vocab_size = args.vocab_size if args.vocab_size is not None else GPT2_VOCAB
    model = GPT(Config(max_seq_len, vocab_size, args.layers, args.heads, args.channels), args.sdpa)
    init_weights(model, args.seed)
    return model


# ----------------------------------------------------------------------------------------------------------
# LoRA (docs/lora.md)

def parse_lora_targets(text):
    """'qkv,fc' -> bitmask."""
    bits = {name: bit for name, _, bit, _, _ in LORA_TARGETS}
    mask = 0
    for name in text.split(","):
        if name not in bits:
            raise InputError(f"--lora-targets: unknown target {name!r} (choose from {', '.join(bits)})")
        mask |= bits[name]
    return mask


def adapter_shapes(rank, mask, layers, channels):
    """Shapes of the adapter tensors in file order: per layer, per target, A (r, in) then B (out, r)."""
    return [shape for _ in range(layers) for _, _, bit, fan_in, fan_out in LORA_TARGETS if mask & bit
            for shape in ((rank, fan_in * channels), (fan_out * channels, rank))]


@torch.no_grad()
def init_adapters(model, seed, b_std):
    """A Kaiming-uniform as nn.Linear's default weight init (kaiming_uniform_ with a = sqrt(5), which is
    U(-1/sqrt(in), 1/sqrt(in))); B stays zero as the paper has it, or is N(0, b_std) when b_std > 0 so that
    tests see a non-trivial adapter. Drawn in file order from one generator seeded with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    tensors = model.adapter_tensors()
    for a, b in zip(tensors[0::2], tensors[1::2]):
        bound = 1.0 / math.sqrt(a.shape[1])
        a.uniform_(-bound, bound, generator=gen)
        if b_std > 0:
            b.normal_(0.0, b_std, generator=gen)


def write_adapters(model, path):
    """Writes the model's adapters as an adapter file (docs/lora.md) atomically."""
    lora, cfg = model.lora, model.cfg
    tensors = model.adapter_tensors()
    header = [LORA_MAGIC, LORA_VERSION, lora.rank, f32_bits(lora.alpha), lora.mask, cfg.num_layers, cfg.channels,
              len(tensors)]
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header_bytes(header))
        for t in tensors:
            f.write(t.detach().float().cpu().numpy().astype("<f4").tobytes())
    os.replace(tmp, path)


@torch.no_grad()
def load_adapters(model, path, dropout=0.0):
    """Validates the adapter file `path` against the model, adds adapters of its configuration to the model
    and fills them. Returns the LoraConfig."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such adapter file")
    size = os.path.getsize(path)
    if size < 4 * HEADER_INTS:
        raise InputError(f"{path}: truncated adapter header ({size} bytes)")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, rank, _, mask, layers, channels, count = (int(x) for x in header[:8])
    alpha = float(header[3:4].view("<f4")[0])
    cfg = model.cfg
    if magic != LORA_MAGIC:
        raise InputError(f"{path}: bad adapter magic {magic} (expected {LORA_MAGIC})")
    if version != LORA_VERSION:
        raise InputError(f"{path}: unsupported adapter version {version} (expected {LORA_VERSION})")
    if rank <= 0:
        raise InputError(f"{path}: adapter rank {rank} must be positive")
    if not (math.isfinite(alpha) and alpha > 0):
        raise InputError(f"{path}: adapter alpha {alpha:g} must be finite and positive")
    if not 1 <= mask <= LORA_ALL_TARGETS:
        raise InputError(f"{path}: bad adapter target bitmask {mask} (expected 1..15: 1 qkv, 2 attn-proj, "
                         f"4 fc, 8 fc-proj)")
    if (layers, channels) != (cfg.num_layers, cfg.channels):
        raise InputError(f"{path}: adapters for {layers} layers, {channels} channels; the model has "
                         f"{cfg.num_layers} layers, {cfg.channels} channels")
    shapes = adapter_shapes(rank, mask, layers, channels)
    if count != len(shapes):
        raise InputError(f"{path}: header says {count} tensors, expected {len(shapes)} (A and B per layer and target)")
    expected = 4 * HEADER_INTS + 4 * sum(r * c for r, c in shapes)
    if size < expected:
        raise InputError(f"{path}: truncated: {size} bytes, its header implies {expected}")
    if size > expected:
        raise InputError(f"{path}: {size} bytes, its header implies {expected} (trailing data)")
    raw = np.fromfile(path, dtype="<f4", offset=4 * HEADER_INTS)
    lora = LoraConfig(rank, alpha, mask, dropout)
    model.add_lora(lora)
    offset = 0
    for t in model.adapter_tensors():
        t.copy_(torch.from_numpy(raw[offset:offset + t.numel()].copy()).view_as(t))
        offset += t.numel()
    return lora


def setup_lora(model, args):
    """Adds the adapters the --lora-* flags ask for (none without --lora-rank or --lora-load) to the fp32 CPU
    model: from --lora-load (its rank, alpha and targets; flags that disagree are an error), else initialised
    by init_adapters from --lora-init-seed. Returns the LoraConfig or None."""
    if not 0.0 <= args.lora_dropout < 1.0:
        raise InputError(f"--lora-dropout {args.lora_dropout} is not in [0, 1)")
    if args.lora_rank < 0:
        raise InputError(f"--lora-rank {args.lora_rank} must be >= 0 (0 = no LoRA)")
    init_flags = [flag for flag, value in (("--lora-init-seed", args.lora_init_seed),
                                           ("--lora-init-b-std", args.lora_init_b_std or None)) if value is not None]
    if args.lora_load:
        if init_flags:
            raise InputError(f"{init_flags[0]} does not apply with --lora-load (the adapters come from the file)")
        lora = load_adapters(model, args.lora_load, args.lora_dropout)
        targets = ",".join(name for name, _, bit, _, _ in LORA_TARGETS if lora.mask & bit)
        alpha = args.lora_alpha and float(np.float32(args.lora_alpha))  # as the file holds it
        given = {"--lora-rank": (args.lora_rank or None, lora.rank, lora.rank),
                 "--lora-alpha": (alpha, lora.alpha, f"{lora.alpha:g}"),
                 "--lora-targets": (args.lora_targets and parse_lora_targets(args.lora_targets), lora.mask, targets)}
        for flag, (value, from_file, shown) in given.items():
            if value is not None and value != from_file:
                raise InputError(f"{flag} conflicts with {args.lora_load} ({flag} {shown} there)")
    elif args.lora_rank > 0:
        if args.lora_init_b_std < 0:
            raise InputError(f"--lora-init-b-std {args.lora_init_b_std} must be >= 0")
        alpha = args.lora_alpha if args.lora_alpha is not None else args.lora_rank
        if not (math.isfinite(alpha) and alpha > 0):
            raise InputError(f"--lora-alpha {alpha} must be finite and positive")
        lora = LoraConfig(args.lora_rank, alpha, parse_lora_targets(args.lora_targets or "qkv"), args.lora_dropout)
        model.add_lora(lora)
        init_adapters(model, args.lora_init_seed if args.lora_init_seed is not None else args.seed + 1,
                      args.lora_init_b_std)
    else:
        others = [("--lora-alpha", args.lora_alpha), ("--lora-targets", args.lora_targets),
                  ("--lora-dropout", args.lora_dropout or None),
                  ("--lora-weight-decay", args.lora_weight_decay or None), ("--lora-out", args.lora_out)]
        if init_flags:
            raise InputError(f"{init_flags[0]} needs --lora-rank")
        stray = [flag for flag, value in others if value is not None]
        if stray:
            raise InputError(f"{stray[0]} needs --lora-rank or --lora-load")
        return None
    if lora.dropout > 0:
        torch.manual_seed(args.seed)  # dropout masks come from torch's global generator
    return lora


# ----------------------------------------------------------------------------------------------------------
# Optimisation pieces shared by both subcommands

class AdamW:
    """AdamW exactly as docs/formats.md (decay uses the pre-update parameter, bias-corrected moments).
    A parameter without a gradient is skipped: under FSDP that is one with no elements on this process."""

    def __init__(self, decay_params, no_decay_params, beta1, beta2, eps, weight_decay):
        self.entries = [(p, weight_decay) for p in decay_params] + [(p, 0.0) for p in no_decay_params]
        self.state = [(torch.zeros_like(p), torch.zeros_like(p)) for p, _ in self.entries]
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.t = 0

    @torch.no_grad()
    def step(self, lr):
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        bias1, bias2 = 1.0 - b1 ** self.t, 1.0 - b2 ** self.t
        for (p, wd), (m, v) in zip(self.entries, self.state):
            g = p.grad
            if g is None:
                continue
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            update = (m / bias1) / (v / bias2).sqrt_().add_(self.eps)
            if wd:
                update.add_(p, alpha=wd)
            p.add_(update, alpha=-lr)

    def zero_grad(self):
        for p, _ in self.entries:
            p.grad = None


class TorchFusedAdamW:
    """torch.optim.AdamW(fused=True) behind the same interface; benchmark only (its decay order differs)."""

    def __init__(self, decay_params, no_decay_params, beta1, beta2, eps, weight_decay):
        groups = [{"params": decay_params, "weight_decay": weight_decay},
                  {"params": no_decay_params, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]  # LoRA has no no-decay group
        self.opt = torch.optim.AdamW(groups, lr=0.0, betas=(beta1, beta2), eps=eps, fused=True)

    def step(self, lr):
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)


@torch.no_grad()
def grad_norm(params, sharded=False):
    """Global L2 norm of all gradients, accumulated in float64 (one tensor at a time). sharded (FSDP): each
    process holds a disjoint slice of the gradients (none for a parameter with no elements here), so the
    squares are summed over the processes."""
    sq = sum((torch.linalg.vector_norm(p.grad, dtype=torch.float64) ** 2 for p in params if p.grad is not None),
             torch.zeros((), dtype=torch.float64, device=params[0].device))
    if sharded:
        dist.all_reduce(sq)
    return math.sqrt(float(sq))


@torch.no_grad()
def clip_grads(params, norm, grad_clip):
    """llm.c-style clipping: scale by clip/norm only when the norm exceeds the clip."""
    if grad_clip > 0 and norm > grad_clip:
        scale = grad_clip / norm
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)


def lr_at(step, max_lr, warmup, total, schedule, final_frac):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    final = final_frac * max_lr
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "cosine":
        return final + 0.5 * (max_lr - final) * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return max_lr - (max_lr - final) * progress
    return max_lr


def setup_device(args):
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda but CUDA is not available")
    if args.dtype == "fp16" and device.type != "cuda":
        raise InputError("--dtype fp16 needs --device cuda (CPU autocast supports bf16 only)")
    if args.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        raise InputError("--sdpa needs torch >= 2.0")
    if args.dtype == "fp32" and device.type == "cuda":
        # The fp32 reference must be true fp32: no TF32 in matmuls or convolutions.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return device


def autocast(args, device):
    if args.dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPE[args.dtype])


# ----------------------------------------------------------------------------------------------------------
# debug-state

def cmd_debug_state(args):
    if args.steps < 1:
        raise InputError("--steps must be >= 1 (step 0 is what the state records)")
    device = setup_device(args)
    model = build_model(args)
    lora = setup_lora(model, args)
    # Hyper-parameters are stored as float32 in the state header: use exactly those values here.
    lr, beta1, beta2, eps, wd, clip = (float(np.float32(x)) for x in
                                       (args.lr, args.beta1, args.beta2, args.eps,
                                        args.lora_weight_decay if lora else args.weight_decay, args.grad_clip))
    cfg = model.cfg
    B, T, V = args.batch_size, args.seq_len, cfg.vocab_size
    if B <= 0 or T <= 0 or T > cfg.max_seq_len:
        raise InputError(f"need B > 0 and 0 < T <= max seq len {cfg.max_seq_len} (got B={B}, T={T})")
    write_model(model, args.model_out)  # the base model: adapters are not merged
    if args.lora_out:
        write_adapters(model, args.lora_out)
    model.to(device)

    # Tokens come from their own generator so they do not depend on the model size.
    tokens = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(args.seed))
    inputs, targets = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
    x, y = inputs.to(device), targets.to(device)

    params, decay, no_decay = model.trainable()  # with LoRA the adapters only: the state records their gradients
    optimizer = AdamW(decay, no_decay, beta1, beta2, eps, wd)
    losses = []
    for step in range(args.steps):
        optimizer.zero_grad()
        with autocast(args, device):
            logits, loss = model(x, y)
        # fp16: constant loss scale 1 (this is a correctness reference); a non-finite gradient is an error.
        loss.backward()
        norm = grad_norm(params)
        if not math.isfinite(norm):
            raise InputError(f"non-finite gradient norm at step {step} with --dtype {args.dtype}")
        if step == 0:
            # clone: on CPU .cpu() aliases the gradient that clipping scales in place below
            step0 = (logits.detach().float().cpu().clone(), loss.item(), norm,
                     [p.grad.detach().float().cpu().clone() for p in params])
        clip_grads(params, norm, clip)
        optimizer.step(lr)
        losses.append(loss.item())
        print(f"step {step} loss {losses[-1]:.6f} grad_norm {norm:.6f}")

    logits0, loss0, norm0, grads0 = step0
    header = [STATE_MAGIC, LORA_STATE_VERSION if lora else STATE_VERSION, B, T, args.steps, V, cfg.padded_vocab_size,
              PRECISION_CODE[args.dtype]]
    header += [f32_bits(v) for v in (lr, beta1, beta2, eps, wd, clip)]
    if lora:
        header += [lora.rank, f32_bits(lora.alpha), lora.mask]
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
    print(f"wrote {args.model_out} and {args.state_out}" + (f" and {args.lora_out}" if args.lora_out else ""))


# ----------------------------------------------------------------------------------------------------------
# train

def open_shard(path):
    """Validates an llm.c token shard and returns its tokens (memory-mapped uint16)."""
    size = os.path.getsize(path)
    if size < 4 * HEADER_INTS:
        raise InputError(f"{path}: too small for a shard header ({size} bytes)")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise InputError(f"{path}: bad shard magic {header[0]} (expected {SHARD_MAGIC})")
    if header[1] != SHARD_VERSION:
        raise InputError(f"{path}: unsupported shard version {header[1]} (expected {SHARD_VERSION})")
    n = int(header[2])
    if n < 0 or size != 4 * HEADER_INTS + 2 * n:
        raise InputError(f"{path}: file size {size} != {4 * HEADER_INTS + 2 * n} for {n} tokens")
    return np.memmap(path, dtype="<u2", mode="r", offset=4 * HEADER_INTS, shape=(n,))


class ShardLoader:
    """Unshuffled batches in the "Batch order" of docs/formats.md. With several processes each step's window
    holds num_ranks*B rows and process `rank` takes rows rank*B .. rank*B+B-1 of it."""

    def __init__(self, pattern, B, T, vocab_size, rank=0, num_ranks=1):
        self.files = sorted(glob.glob(pattern))
        if not self.files:
            raise InputError(f"no shard matches {pattern!r}")
        self.shards = [open_shard(f) for f in self.files]
        self.window = num_ranks * B * T  # tokens the window advances by (it reads one more: the last target)
        for path, tokens in zip(self.files, self.shards):
            if len(tokens) < self.window + 1:
                raise InputError(f"{path}: {len(tokens)} tokens, fewer than one batch needs ({self.window + 1})")
        self.B, self.T, self.rank, self.vocab_size = B, T, rank, vocab_size
        self.shard, self.offset = 0, 0

    def next_batch(self):
        B, T = self.B, self.T
        if self.offset + self.window + 1 > len(self.shards[self.shard]):
            self.shard, self.offset = (self.shard + 1) % len(self.shards), 0
        start = self.offset + self.rank * B * T
        rows = np.asarray(self.shards[self.shard][start:start + B * T + 1]).astype(np.int64)
        if rows.max() >= self.vocab_size:
            raise InputError(f"{self.files[self.shard]}: token {rows.max()} >= vocab size {self.vocab_size}")
        self.offset += self.window
        buf = torch.from_numpy(rows)
        return buf[:-1].view(B, T), buf[1:].view(B, T)


def init_data_parallel(args):
    """(rank, number of processes, device). torchrun (or scripts/launch.sh) starts one process per GPU with
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; with WORLD_SIZE > 1 they join one process
    group (NCCL on CUDA, gloo on CPU). Otherwise a single process: rank 0 of 1, no process group."""
    device = setup_device(args)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), world, device


def wrap_data_parallel(model, args, device):
    """The model (already on `device`) wrapped for --parallel.

    ddp: DistributedDataParallel; parameters stay fp32 and bf16 comes from autocast, as in single-process
    training (gradients are all-reduced in fp32).
    fsdp-*: FullyShardedDataParallel with one unit per transformer Block (the embeddings and the final
    LayerNorm form the root unit). SHARD_GRAD_OP keeps a block's gathered parameters from forward to backward
    (like our ZeRO-2), FULL_SHARD frees them after forward and gathers them again for backward (ZeRO-3). In
    bf16 FSDP's MixedPrecision stores fp32 shards, computes with bf16 copies and gathers and reduce-scatters
    in bf16, as train_gpt does (autocast over fp32 shards would gather fp32, twice the traffic).
    use_orig_params keeps the original parameters (torch.compile needs them, and the optimizer's decay and
    no-decay groups split each block's parameters)."""
    if args.parallel == "ddp":
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    # Imported here: torch 1.13 under Python 3.11 cannot import torch.distributed.fsdp at all.
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    bf16 = torch.bfloat16
    strategy = ShardingStrategy.SHARD_GRAD_OP if args.parallel == "fsdp-grad-op" else ShardingStrategy.FULL_SHARD
    mixed = MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16) if args.dtype == "bf16" else None
    return FullyShardedDataParallel(
        model,
        sharding_strategy=strategy,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
        mixed_precision=mixed,
        device_id=device if device.type == "cuda" else None,
        forward_prefetch=True,  # gather the next block during this one's forward (train_gpt's ZeRO-3 prefetches too)
        use_orig_params=True)


def cmd_train(args):
    rank, world, device = init_data_parallel(args)
    try:
        train(args, rank, world, device)
    finally:
        if world > 1:
            dist.destroy_process_group()


def train(args, rank, world, device):
    B, T = args.batch_size, args.seq_len  # B rows per process
    tokens_per_micro = B * T * world
    total_tokens = args.total_batch_tokens or tokens_per_micro
    if B <= 0 or T <= 0 or args.steps <= 0:
        raise InputError("--batch-size, --seq-len and --steps must be positive")
    if total_tokens % tokens_per_micro:
        raise InputError(f"--total-batch-tokens {total_tokens} is not a multiple of B*T*processes = {tokens_per_micro}")
    ddp = world > 1 and args.parallel == "ddp"
    fsdp = world > 1 and not ddp
    if fsdp and args.dtype == "fp16":
        raise InputError(f"--parallel {args.parallel} supports --dtype fp32 and bf16")
    grad_accum = total_tokens // tokens_per_micro
    model = build_model(args)
    lora = setup_lora(model, args)
    if T > model.cfg.max_seq_len:
        raise InputError(f"--seq-len {T} > max seq len {model.cfg.max_seq_len}")
    loader = ShardLoader(args.train_shards, B, T, model.cfg.vocab_size, rank, world)
    model.to(device)
    wrapped = wrap_data_parallel(model, args, device) if world > 1 else model
    # Taken after wrapping: under FSDP each parameter now holds only this process's slice.
    params, decay, no_decay = model.trainable()
    opt_class = TorchFusedAdamW if args.fused_adamw else AdamW
    optimizer = opt_class(decay, no_decay, args.beta1, args.beta2, args.eps,
                          args.lora_weight_decay if lora else args.weight_decay)
    forward = wrapped
    if args.compile:
        if not hasattr(torch, "compile"):
            raise InputError("--compile needs torch >= 2.0")
        # Around the DDP / FSDP wrapper, as PyTorch documents: compiled DDP splits its graph at the gradient
        # buckets so that the all-reduces still overlap the backward.
        forward = torch.compile(wrapped)

    def precision():  # FSDP's MixedPrecision already computes in bf16
        return contextlib.nullcontext() if fsdp else autocast(args, device)

    # fp16 needs loss scaling; a simple dynamic scheme (halve on overflow and skip, double after 1000 good steps).
    loss_scale = 65536.0 if args.dtype == "fp16" else 1.0
    good_steps = 0
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    log = open(args.log, "w") if args.log and rank == 0 else None
    if log:
        log.write("# step loss lr grad_norm ms tokens_per_s\n")
    step_ms = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        lr = lr_at(step, args.lr, args.warmup_steps, args.steps, args.lr_schedule, args.final_lr_frac)
        loss_sum = torch.zeros((), device=device)
        for micro in range(grad_accum):
            x, y = loader.next_batch()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            # DDP all-reduces only after the last micro-step; FSDP reduce-scatters after each (so do our
            # ZeRO stages 2 and 3), since it keeps no full gradients between micro-steps.
            with wrapped.no_sync() if ddp and micro < grad_accum - 1 else contextlib.nullcontext():
                with precision():
                    _, loss = forward(x, y)
                (loss * (loss_scale / grad_accum)).backward()
            loss_sum += loss.detach()
        if loss_scale != 1.0:
            with torch.no_grad():
                for p in params:
                    p.grad.div_(loss_scale)
        norm = grad_norm(params, sharded=fsdp)
        if math.isfinite(norm):
            clip_grads(params, norm, args.grad_clip)
            optimizer.step(lr)
            good_steps += 1
            if args.dtype == "fp16" and good_steps % 1000 == 0:
                loss_scale *= 2.0
        elif args.dtype == "fp16":
            loss_scale /= 2.0
            if rank == 0:
                print(f"step {step}: gradient overflow, skipped; loss scale now {loss_scale:g}")
        else:
            raise InputError(f"non-finite gradient norm at step {step}")
        optimizer.zero_grad()
        if world > 1:
            dist.all_reduce(loss_sum)  # the reported loss is the mean over all processes
        mean_loss = loss_sum.item() / (grad_accum * world)  # synchronises with the device
        if cuda:
            torch.cuda.synchronize(device)
        ms = 1000.0 * (time.perf_counter() - t0)
        step_ms.append(ms)
        tok_s = total_tokens / (ms / 1000.0)
        line = f"{step} {mean_loss:.6f} {lr:.6e} {norm:.6f} {ms:.3f} {tok_s:.1f}"
        if rank == 0:
            print("step " + line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()
    if log:
        log.close()
    if args.model_out or args.lora_out:
        # Under FSDP every process takes part in gathering the full parameters.
        with type(wrapped).summon_full_params(wrapped, writeback=False) if fsdp else contextlib.nullcontext():
            if rank == 0 and args.model_out:
                write_model(model, args.model_out, merge_lora=True)
            if rank == 0 and args.lora_out:
                write_adapters(model, args.lora_out)
    timed = step_ms[args.timing_warmup:] if len(step_ms) > args.timing_warmup else step_ms[-1:]
    ms = statistics.median(timed)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if cuda else 0.0
    if rank == 0:
        print(f"RESULT tokens_per_s={total_tokens / (ms / 1000.0):.1f} ms_per_step={ms:.3f} peak_mem_gib={peak:.3f}")


# ----------------------------------------------------------------------------------------------------------
# make-shard

def cmd_make_shard(args):
    if args.tokens <= 0 or not 0 < args.vocab_size <= 65536:
        raise InputError("need --tokens > 0 and 0 < --vocab-size <= 65536")
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, args.vocab_size, size=args.tokens, dtype=np.int64).astype("<u2")
    with open(args.out, "wb") as f:
        f.write(header_bytes([SHARD_MAGIC, SHARD_VERSION, args.tokens]))
        f.write(tokens.tobytes())
    print(f"wrote {args.out} ({args.tokens} tokens)")


# ----------------------------------------------------------------------------------------------------------
# export-merged

def cmd_export_merged(args):
    model = load_model(args.model, sdpa=False)
    lora = load_adapters(model, args.lora)
    write_model(model, args.out, merge_lora=True)
    print(f"wrote {args.out} ({args.model} + rank-{lora.rank} adapters of {args.lora} merged)")


# ----------------------------------------------------------------------------------------------------------

def add_model_args(p):
    p.add_argument("--init-from", help="llm.c model file (version 3 or 5); else built from the flags below")
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--channels", type=int)
    p.add_argument("--max-seq-len", type=int, help="default: --seq-len")
    p.add_argument("--vocab-size", type=int, help="default 50257; padded to a multiple of 128")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--dtype", choices=sorted(PRECISION_CODE), default="fp32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention (torch 2.x)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    g = p.add_argument_group("LoRA (docs/lora.md): base model frozen, only the adapters train")
    g.add_argument("--lora-rank", type=int, default=0, help="adapter rank r; 0 = no LoRA")
    g.add_argument("--lora-alpha", type=float, help="scale alpha (the term is alpha/r B A x); default r")
    g.add_argument("--lora-targets", help="comma list of qkv, attn-proj, fc, fc-proj; default qkv")
    g.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on the adapters' input")
    g.add_argument("--lora-init-seed", type=int, help="seed of the adapter init; default --seed + 1")
    g.add_argument("--lora-init-b-std", type=float, default=0.0,
                   help="B ~ N(0, this) instead of zero (tests: a non-trivial adapter from the start)")
    g.add_argument("--lora-weight-decay", type=float, default=0.0,
                   help="AdamW weight decay of A and B (--weight-decay applies to full training only)")
    g.add_argument("--lora-load", help="start from this adapter file (its rank, alpha and targets)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("debug-state", help="write a model file and a debug-state file")
    add_model_args(p)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--model-out", required=True, help="the initial (base) model")
    p.add_argument("--state-out", required=True)
    p.add_argument("--lora-out", help="the initial adapters")
    p.set_defaults(func=cmd_debug_state)

    p = sub.add_parser("train", help="train on llm.c token shards")
    add_model_args(p)
    p.add_argument("--train-shards", required=True, help="glob of token shards")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--total-batch-tokens", type=int,
                   help="tokens per step over all processes: a multiple of B*T*processes, the default "
                        "(gradient accumulation)")
    p.add_argument("--lr", type=float, default=6e-4, help="max learning rate")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--lr-schedule", choices=["cosine", "linear", "constant"], default="cosine")
    p.add_argument("--final-lr-frac", type=float, default=0.0)
    p.add_argument("--compile", action="store_true", help="torch.compile (torch 2.x)")
    p.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True); benchmark only")
    p.add_argument("--log", help="per-step log: step loss lr grad_norm ms tokens_per_s")
    p.add_argument("--timing-warmup", type=int, default=3, help="steps excluded from the RESULT median")
    p.add_argument("--model-out", help="write the final model here (with LoRA: the adapters merged into it)")
    p.add_argument("--lora-out", help="write the final adapters here")
    p.add_argument("--parallel", choices=["ddp", "fsdp-grad-op", "fsdp-full"], default="ddp",
                   help="with several processes (torchrun, WORLD_SIZE > 1; --batch-size is per process): "
                        "DistributedDataParallel, or FSDP with SHARD_GRAD_OP or FULL_SHARD")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("make-shard", help="write a shard of uniformly random tokens")
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--vocab-size", type=int, default=GPT2_VOCAB)
    p.add_argument("--seed", type=int, default=1337)
    p.set_defaults(func=cmd_make_shard)

    p = sub.add_parser("export-merged", help="merge LoRA adapters into a model: W = W0 + (alpha/r) B A")
    p.add_argument("--model", required=True, help="base llm.c model file (version 3 or 5)")
    p.add_argument("--lora", required=True, help="adapter file")
    p.add_argument("--out", required=True, help="merged model file (version 3, fp32)")
    p.set_defaults(func=cmd_export_merged)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (InputError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
