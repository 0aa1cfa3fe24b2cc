#!/usr/bin/env python3
"""The PyTorch baseline of bench/bench_gpt2.sh: the strongest plain PyTorch GPT-2 trainer a user would pick.

A nanoGPT-style model: nn.Linear and nn.LayerNorm modules (with biases), GELU (tanh), wte tied to the LM head,
vocabulary padded to 50304 (as in nanoGPT, the padded columns take part in the softmax),
F.scaled_dot_product_attention(is_causal=True), F.cross_entropy on the bf16-autocast
logits (the model returns the loss only, so no logits tensor outlives the step), bf16 autocast over fp32
parameters, TF32 for the fp32 products that are left, fused AdamW (torch.optim.AdamW(fused=True); beta1 0.9,
beta2 0.95, eps 1e-8, weight decay 0.1 on the matrices and embeddings only, as nanoGPT groups them), gradient
clipping at 1.0 (clip_grad_norm_, as nanoGPT and train_gpt do), a warm-up + cosine learning rate, one micro-step
per step (no gradient accumulation), and torch.compile(model).

It is not scripts/reference/gpt2_reference.py: that is the correctness reference of the tests (its losses follow
docs/formats.md exactly); its compiled path is slower (by its code, most likely its fp32 copy of the logits and
the host wait for the gradient norm in every step).

SDPA backends: --backend flash | cudnn | both. With both, each is timed in this process one after the other
(the compiled model is built afresh for each under torch.nn.attention.sdpa_kernel, since the backend is chosen
when the graph is traced), and the faster is reported. A backend that cannot run here (an old torch, a cuDNN
without SDPA, a shape it refuses) is reported with the reason and left out. Inductor's FX graph cache and
AOTAutograd's cache are off (they ignore the SDPA backend, pytorch/pytorch#185449, so the cuDNN run could reuse
the flash graph), and one more untimed step runs under the profiler to check which SDPA operator ran
(verified=yes|NO|unchecked; a NO result is left out of BEST). Under CUDA graphs (reduce-overhead) a replayed step
dispatches no operator, so the first step, which runs the compiled graphs before they are recorded, is profiled
too (CPU activity: the operators) and counts.

Timing: CUDA events recorded at every step boundary; the host never waits inside the loop (unless
--sync-every-step), so the host launches the next step while the GPU runs this one. Reported: the median step of the timed steps after
the warm-up steps (the first of which compiles), tokens/s = B*T / median, and torch.cuda.max_memory_allocated
(peak_mem_gib) and max_memory_reserved (peak_reserved_gib) over that backend's steps.

Output, per backend:
  RESULT tokens_per_s=... ms_per_step=... peak_mem_gib=... peak_reserved_gib=... mfu=... backend=flash ...
then
  BEST backend=... tokens_per_s=... ms_per_step=... peak_mem_gib=... peak_reserved_gib=...
MFU as train_gpt computes it: (6 x (parameters - wpe) + 12 L C T) FLOPs per token against 989 TFLOP/s.

Usage: bench_pytorch_gpt2.py [--model d12|d24|d36|d48|124M|350M|774M|1.5B] [--batch-size 64] [--seq-len 1024]
                             [--steps 30] [--warmup 5] [--backend both] [--compile-mode default]
                             [--train-data "shards_*.bin"]
"""
import argparse
import gc
import glob
import math
import os
import statistics
import sys
import time
import traceback
import warnings

# The compiled-graph caches (inductor's FX graph cache, AOTAutograd's cache) do not key on the SDPA backend chosen
# when the graph was traced (pytorch/pytorch#185449): with them on, the cuDNN run could silently reuse the graph
# compiled for flash, in this process or from an earlier one. Off here (and again below, on the configs); the
# Triton kernels' own cache stays on.
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("numpy", "numpy"), ("torch", "torch")):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: bench/bench_pytorch_gpt2.py needs {_module}{_why}: pip install {_pip}")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:  # torch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    SDPBackend = sdpa_kernel = None

# GPT-2's shapes: layers, channels, heads
SIZES = {"d12": (12, 768, 12), "d24": (24, 1024, 16), "d36": (36, 1280, 20), "d48": (48, 1600, 25)}
ALIASES = {"124M": "d12", "350M": "d24", "774M": "d36", "1.5B": "d48"}
VOCAB_SIZE = 50257
PADDED_VOCAB_SIZE = 50304  # nanoGPT's padding (a multiple of 64; train_gpt pads to 50304 too)
PEAK_FLOPS = 989e12  # H100/H200 dense bf16, as train_gpt's MFU
SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256


# ----------------------------------------------------------------------------------------------------------
# the model (nanoGPT's, with biases and dropout 0)

class CausalSelfAttention(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, n_head)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, C, n_head, block_size, vocab_size=PADDED_VOCAB_SIZE):
        super().__init__()
        self.n_layer, self.C, self.block_size = n_layer, C, block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, C),
            wpe=nn.Embedding(block_size, C),
            h=nn.ModuleList(Block(C, n_head) for _ in range(n_layer)),
            ln_f=nn.LayerNorm(C),
        ))
        self.lm_head = nn.Linear(C, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def configure_optimizer(model, lr, weight_decay):
    params = [p for p in model.parameters() if p.requires_grad]  # the tied wte / lm_head once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def lr_at(step, max_lr, warmup, total):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    final = 0.1 * max_lr
    return final + 0.5 * (max_lr - final) * (1.0 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------------------------------------
# tokens: llm.c shards or random, all on the GPU before timing

def load_tokens(args, needed, device):
    if not args.train_data:
        g = torch.Generator(device=device)
        g.manual_seed(args.seed)
        return torch.randint(0, VOCAB_SIZE, (needed,), device=device, dtype=torch.long, generator=g)
    paths = sorted(glob.glob(args.train_data))
    if not paths:
        sys.exit(f"--train-data {args.train_data}: no file matches")
    parts, have = [], 0
    for path in paths:
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
        if len(header) < HEADER_INTS or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
            sys.exit(f"{path}: not an llm.c token shard (magic {SHARD_MAGIC}, version {SHARD_VERSION})")
        n = int(header[2])
        if os.path.getsize(path) != 4 * HEADER_INTS + 2 * n:
            sys.exit(f"{path}: file size != {4 * HEADER_INTS + 2 * n} for {n} tokens")
        take = min(n, needed - have)
        parts.append(np.fromfile(path, dtype="<u2", count=take, offset=4 * HEADER_INTS))
        have += take
        if have >= needed:
            break
    tokens = np.concatenate(parts).astype(np.int64)
    if len(tokens) < args.batch_size * args.seq_len + 1:
        sys.exit(f"--train-data holds {len(tokens)} tokens, fewer than one batch (B*T+1 = "
                 f"{args.batch_size * args.seq_len + 1})")
    return torch.from_numpy(tokens).to(device)


class Batches:
    """nanoGPT's batches: B rows of T consecutive tokens from a window of B*T+1, targets shifted by one;
    windows in order, wrapping around."""

    def __init__(self, tokens, B, T):
        self.tokens, self.B, self.T = tokens, B, T
        self.count = (len(tokens) - 1) // (B * T)

    def get(self, i):
        B, T = self.B, self.T
        start = (i % self.count) * B * T
        window = self.tokens[start:start + B * T + 1]
        # copies, so that every step's inputs are fresh, contiguous and aligned (no recompiles, no re-layout)
        return window[:-1].view(B, T).clone(), window[1:].view(B, T).clone()


# ----------------------------------------------------------------------------------------------------------
# SDPA backends

def backend_context(name):
    if sdpa_kernel is not None:
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION if name == "flash" else SDPBackend.CUDNN_ATTENTION)
    # torch 2.0-2.2: only the flash backend can be chosen alone
    return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)


def first_line(text):
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


def probe_backend(name, n_head, head_size, T, device):
    """None if SDPA with this backend runs a causal bf16 forward and backward of this head count, head size and
    length here; otherwise why not."""
    if name == "cudnn":
        if sdpa_kernel is None or not hasattr(SDPBackend, "CUDNN_ATTENTION"):
            return f"torch {torch.__version__} has no SDPBackend.CUDNN_ATTENTION (torch >= 2.3 needed)"
        if not torch.backends.cudnn.is_available():
            return "torch.backends.cudnn.is_available() is False"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            q, k, v = (torch.randn(1, n_head, T, head_size, device=device, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            with backend_context(name):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.backward(torch.randn_like(out))
            torch.cuda.synchronize(device)
            return None
        except Exception as e:  # noqa: BLE001 (any failure means: not this backend)
            why = [first_line(w.message) for w in caught if first_line(w.message)]
            return "; ".join([f"{type(e).__name__}: {first_line(e)}"] + why[:3])


# ----------------------------------------------------------------------------------------------------------
# one backend's run

# the aten operator each backend's SDPA runs (in eager mode and in a compiled graph alike)
EXPECTED_OP = {"flash": "_scaled_dot_product_flash_attention", "cudnn": "_scaled_dot_product_cudnn_attention"}


def disable_graph_caches():
    """See the comment at the imports: no compiled graph may come from a cache that ignores the SDPA backend."""
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


def attention_ops(prof):
    """Names of the attention operators and kernels one profiled step ran, with their counts: the aten
    operators first."""
    keys = ("scaled_dot_product", "flash", "fmha", "sdpa", "cudnn", "attention")
    found = [(not evt.key.startswith("aten::"), f"{evt.key[:100]} x{evt.count}") for evt in prof.key_averages()
             if any(k in evt.key.lower() for k in keys)]
    return [text for _, text in sorted(found)]


def profiler_failed(ops):
    return bool(ops) and ops[0].startswith("(profiler failed")


def profiled(fn, activities):
    """fn() under the profiler: its result, and attention_ops of what it ran (or why the profiler failed; fn
    then runs unprofiled). An exception of fn itself propagates."""
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


def run_backend(name, args, shape, tokens, device):
    n_layer, C, n_head = shape
    B, T = args.batch_size, args.seq_len
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(args.seed)
    model = optimizer = step_fn = None
    try:
        with torch.device(device):  # initialised on the GPU (fast for 1.5B)
            model = GPT(n_layer, C, n_head, max(1024, T))
        n_params = sum(p.numel() for p in model.parameters())
        flops_per_token = 6.0 * (n_params - model.transformer.wpe.weight.numel()) + 12.0 * n_layer * C * T
        optimizer = configure_optimizer(model, args.lr, args.weight_decay)
        if args.compile_mode == "none":
            step_fn = model
        elif args.compile_mode == "default":
            step_fn = torch.compile(model)
        else:
            step_fn = torch.compile(model, mode=args.compile_mode)
        batches = Batches(tokens, B, T)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        total_steps = args.warmup + args.steps

        # modes with CUDA graphs replay into the same output buffers: mark each step, keep copies of the losses
        cudagraphs = args.compile_mode in ("reduce-overhead", "max-autotune")

        def train_step(i):
            if cudagraphs and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
                torch.compiler.cudagraph_mark_step_begin()
            x, y = batches.get(i)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = step_fn(x, y)
            loss.backward()
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
            lr = lr_at(i, args.lr, args.lr_warmup, total_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach().clone() if cudagraphs else loss.detach()

        losses = []
        first_ops = []
        with backend_context(name):
            t0 = time.perf_counter()
            if cudagraphs and not args.no_kernel_check:
                # a replayed CUDA graph dispatches no operator for the profiler to see: the operators are checked
                # on this first step instead, which runs the compiled graphs before they are recorded
                from torch.profiler import ProfilerActivity
                loss0, first_ops = profiled(lambda: train_step(0), [ProfilerActivity.CPU])
                losses.append(loss0)
            else:
                losses.append(train_step(0))  # traces and compiles the forward and the backward
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
                if args.sync_every_step:
                    losses[-1].item()
            events[-1].record()
            torch.cuda.synchronize(device)
            wall_s = time.perf_counter() - t1
            peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
            reserved = torch.cuda.max_memory_reserved(device) / 2 ** 30
            ops, verified = [], "unchecked"
            if not args.no_kernel_check:  # one more (untimed) step under the profiler: which attention ran
                from torch.profiler import ProfilerActivity
                _, ops = profiled(lambda: (train_step(total_steps), torch.cuda.synchronize(device)),
                                  [ProfilerActivity.CPU, ProfilerActivity.CUDA])
                profiles = [p for p in ([ops, first_ops] if cudagraphs else [ops]) if not profiler_failed(p)]
                if profiles:
                    verified = "yes" if any(EXPECTED_OP[name] in op for p in profiles for op in p) else "NO"
        step_ms = [events[i].elapsed_time(events[i + 1]) for i in range(args.steps)]
        ms = statistics.median(step_ms)
        loss_values = torch.stack(losses).float().cpu().tolist()
        if not all(math.isfinite(v) for v in loss_values):
            raise RuntimeError(f"non-finite loss: {loss_values}")
        print(f"backend {name}: first step (compiles) {first_s:.1f} s, {args.warmup} warm-up steps {warm_s:.1f} s, "
              f"{args.steps} timed steps {wall_s:.2f} s wall; step ms min {min(step_ms):.2f} median {ms:.2f} "
              f"mean {statistics.mean(step_ms):.2f} max {max(step_ms):.2f}; loss {loss_values[0]:.4f} -> "
              f"{loss_values[-1]:.4f}", flush=True)
        if first_ops:
            print(f"backend {name}: attention ops of the first step (before the CUDA graphs): {'; '.join(first_ops[:8])}",
                  flush=True)
        if ops:
            print(f"backend {name}: attention ops of one profiled step: {'; '.join(ops[:8])}", flush=True)
        if verified == "NO":
            print(f"backend {name}: WARNING: the profiled step did not run {EXPECTED_OP[name]}; this result is "
                  f"not {name}'s and is left out of BEST", flush=True)
        tok_s = B * T / (ms / 1000.0)
        result = dict(backend=name, tokens_per_s=tok_s, ms_per_step=ms, peak_mem_gib=peak, peak_reserved_gib=reserved,
                      mfu=100.0 * flops_per_token * tok_s / PEAK_FLOPS, verified=verified)
        print(f"RESULT tokens_per_s={tok_s:.1f} ms_per_step={ms:.3f} peak_mem_gib={peak:.3f} "
              f"peak_reserved_gib={reserved:.3f} mfu={result['mfu']:.1f} backend={name} "
              f"mean_ms={statistics.mean(step_ms):.3f} compile_s={first_s:.1f} verified={verified}", flush=True)
        return result
    finally:  # the next backend starts from a clean slate (its caller's frame drops the rest)
        model = optimizer = step_fn = None
        torch._dynamo.reset()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="d12", help="d12 | d24 | d36 | d48 (or 124M | 350M | 774M | 1.5B)")
    p.add_argument("--batch-size", "-b", type=int, default=64)
    p.add_argument("--seq-len", "-t", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30, help="timed steps (after the warm-up steps)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first; the first compiles (>= 1)")
    p.add_argument("--backend", default="both", choices=["flash", "cudnn", "both"], help="SDPA backend(s) to time")
    p.add_argument("--compile-mode", default="default",
                   help="default (torch.compile(model)), max-autotune-no-cudagraphs, max-autotune, "
                        "reduce-overhead, or none (eager)")
    p.add_argument("--train-data", default="", help="llm.c token shards (glob); default: random tokens")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--lr-warmup", type=int, default=10, help="learning-rate warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--sync-every-step", action="store_true",
                   help="wait for each step's loss on the host (as nanoGPT's loss.item() does)")
    p.add_argument("--no-kernel-check", action="store_true",
                   help="skip the profiled step that names the attention operators each backend ran")
    args = p.parse_args()

    size = ALIASES.get(args.model, args.model)
    if size not in SIZES:
        sys.exit(f"--model {args.model}: not one of {', '.join(list(SIZES) + list(ALIASES))}")
    if args.batch_size <= 0 or args.seq_len <= 0 or args.steps <= 0 or args.warmup <= 0:
        sys.exit("--batch-size, --seq-len, --steps and --warmup must be positive")
    if args.compile_mode != "none" and not hasattr(torch, "compile"):
        sys.exit(f"torch {torch.__version__} has no torch.compile (torch >= 2.0 needed)")
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    n_layer, C, n_head = SIZES[size]
    device = torch.device("cuda")
    disable_graph_caches()
    # TF32 for the products autocast leaves in fp32. Only this legacy call (as llm.c's train_gpt2.py makes): mixing
    # it with torch 2.9's fp32_precision settings can make inductor refuse to compile ("mix of the legacy and new
    # APIs"); cuDNN's TF32 is on by default and no convolution runs here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision("high")

    B, T = args.batch_size, args.seq_len
    print(f"PyTorch GPT-2 {size} (L={n_layer} C={C} H={n_head}), B={B} T={T}, bf16 autocast, "
          f"compile={args.compile_mode}, fused AdamW, grad clip {args.grad_clip}; torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(device)}, cuDNN {torch.backends.cudnn.version()}", flush=True)

    wanted = ["flash", "cudnn"] if args.backend == "both" else [args.backend]
    backends = []
    for name in wanted:
        why = probe_backend(name, n_head, C // n_head, T, device)
        if why is None:
            backends.append(name)
        else:
            print(f"backend {name} unavailable: {why}", flush=True)
    if not backends:
        print("no SDPA backend available; trying flash anyway", flush=True)
        backends = ["flash"]
    elif "cudnn" in wanted and "cudnn" not in backends:
        print(f"using {', '.join(backends)} only", flush=True)

    needed = (min(args.warmup + args.steps + 1, 64)) * B * T + 1
    tokens = load_tokens(args, needed, device)

    results = []
    for name in backends:
        try:
            results.append(run_backend(name, args, (n_layer, C, n_head), tokens, device))
        except Exception as e:  # noqa: BLE001 (a backend failing must not hide the other's result)
            print(f"backend {name} failed: {type(e).__name__}: {first_line(e)}", flush=True)
            traceback.print_exc(file=sys.stdout)
            if isinstance(e, torch.cuda.OutOfMemoryError):
                print("(out of GPU memory: try a smaller --batch-size)", flush=True)
    if not results:
        print("no backend ran", flush=True)
        return 1
    valid = [r for r in results if r["verified"] != "NO"]
    if not valid:
        print("WARNING: no backend's profiled step ran the operator it asked for; BEST is unverified", flush=True)
        valid = results
    best = max(valid, key=lambda r: r["tokens_per_s"])
    others = "; ".join(f"{r['backend']} {r['tokens_per_s']:.1f}" for r in results)
    print(f"BEST backend={best['backend']} tokens_per_s={best['tokens_per_s']:.1f} ms_per_step={best['ms_per_step']:.3f} "
          f"peak_mem_gib={best['peak_mem_gib']:.3f} peak_reserved_gib={best['peak_reserved_gib']:.3f} "
          f"mfu={best['mfu']:.1f} verified={best['verified']} (of: {others})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
