#!/usr/bin/env python3
"""PyTorch's own tensor and pipeline parallelism, and FSDP with CPU offload, on train_gpt's GPT: the comparisons of
bench/bench_parallel.sh and of bench/bench_offload.sh's fsdp section.

Started by torchrun, one process per GPU (all ranks form one tensor-parallel, pipeline-parallel or FSDP group). The model is
bench/bench_pytorch_gpt2.py's nanoGPT-style GPT (biases, tanh GELU, vocabulary padded to 50304) at any shape
(--layers, --channels, --heads), bf16 autocast over fp32 parameters, fused AdamW (foreach where fused cannot take
the parameters), gradient clipping at 1.0 over the whole model, random tokens, SDPA (cuDNN backend where it runs,
else flash), each block under torch.compile.

--mode tp: Megatron-style tensor parallelism with torch.distributed.tensor.parallel over all ranks (one rank: the
  plain model): qkv and fc
  ColwiseParallel, both projections RowwiseParallel, the embedding RowwiseParallel (vocabulary rows) and the LM
  head ColwiseParallel with the vocabulary-parallel cross entropy (loss_parallel), the embedding tied to the LM
  head as in GPT-2. --sequence-parallel 1: the LayerNorms SequenceParallel and the residual stream split along
  the sequence (all-gather before qkv and fc, reduce-scatter after the projections), as TorchTitan does.
  (Each rank's slice of qkv holds a third of its rows for each of q, k and v after the split, so its heads are a
  permutation of an unsharded model's: the same products and the same speed.)
--mode pp: torch.distributed.pipelining: --schedule 1f1b (Schedule1F1B, a stage per rank) or interleaved
  (ScheduleInterleaved1F1B, --virtual-stages stages per rank, stage s on rank s % P), the layers split evenly over
  the stages, --microbatches micro-batches of --batch-size rows per step. The embedding and the LM head are not
  tied (they live on the first and the last stage).
--mode fsdp: FullyShardedDataParallel (FSDP1) over all ranks, FULL_SHARD (one rank: NO_SHARD, as FSDP switches to it),
  each block a unit, the embeddings, final LayerNorm and LM head the root's; MixedPrecision bf16 (parameters,
  reduction, buffers) over fp32 parameters; --cpu-offload 1: CPUOffload(offload_params=True), the parameters, their
  gradients and AdamW on the CPU. Each rank takes --microbatches micro-batches of --batch-size rows a step, all but
  the last under no_sync() (FSDP accumulates gradients with CPU offload only there); gradient clipping by FSDP's
  clip_grad_norm_. Eager (no torch.compile). FSDP's flat parameters are 1-D, so AdamW has one group, without weight
  decay.

Timing: CUDA events at the step boundaries of every rank, no host wait inside the loop (fsdp with CPU offload waits
for its gradients on the host, as FSDP does); the median of the timed steps after --warmup steps (the first
compiles); ms_per_step is the largest rank's median. tokens/s = tokens per step (B*T for tp, m*B*T for pp, m*B*T
x ranks for fsdp) / ms_per_step; MFU as train_gpt computes it, (6 x (parameters - wpe) + 12 L C T) FLOPs per token
against 989 TFLOP/s per GPU; peak_mem_gib is the largest rank's torch.cuda.max_memory_allocated, host_peak_gib the
largest rank's peak resident host memory (ru_maxrss: pinned buffers included).
Output (rank 0): RESULT tokens_per_s=... ms_per_step=... peak_mem_gib=... host_peak_gib=... mfu=... mode=... (one line).

  torchrun --nproc-per-node 4 bench/bench_pytorch_parallel.py --mode tp --layers 48 --channels 1600 --heads 25 -b 8
  torchrun --nproc-per-node 4 bench/bench_pytorch_parallel.py --mode pp --schedule interleaved --microbatches 16 ...
  torchrun --nproc-per-node 1 bench/bench_pytorch_parallel.py --mode fsdp --cpu-offload 1 --layers 32 --channels 4096 \
      --heads 32 -b 8 --microbatches 64
"""
import argparse
import contextlib
import math
import os
import resource
import statistics
import sys
import warnings

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("numpy", "numpy"), ("torch", "torch")):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: bench/bench_pytorch_parallel.py needs {_module}{_why}: pip install {_pip}")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pytorch_gpt2 import (GPT, PADDED_VOCAB_SIZE, PEAK_FLOPS, VOCAB_SIZE, Block,  # noqa: E402
                                backend_context, disable_graph_caches, lr_at, probe_backend)


def flops_per_token(L, C, T, V=PADDED_VOCAB_SIZE):
    # train_gpt's count: the tied model's parameters without wpe, plus the attention's 12 L C T
    params = V * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6.0 * params + 12.0 * L * C * T


def attention_forward_local(self, x):
    """CausalSelfAttention.forward on this rank's heads: the width comes from c_attn's (local) output."""
    qkv = self.c_attn(x)
    B, T, W = qkv.shape
    c = W // 3
    h = self.n_head_local
    q, k, v = (t.view(B, T, h, c // h).transpose(1, 2) for t in qkv.split(c, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).reshape(B, T, c))


# ----------------------------------------------------------------------------------------------------------
# tensor parallelism

def build_tp(args, device, world, rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    L, C, H, T = args.layers, args.channels, args.heads, args.seq_len
    if H % world or (4 * C) % world or PADDED_VOCAB_SIZE % world or (args.sequence_parallel and T % world):
        sys.exit(f"tp {world}: the heads ({H}), 4C ({4 * C}), the vocabulary ({PADDED_VOCAB_SIZE})"
                 f"{f' and T ({T})' if args.sequence_parallel else ''} must be multiples of it")
    mesh = init_device_mesh("cuda", (world,))
    with torch.device(device):
        model = GPT(L, C, H, max(1024, T))
    if world == 1:  # tp 1: the plain model (DTensor's dispatch would only add overhead), blocks compiled as below
        blocks = [torch.compile(b) if args.compile else b for b in model.transformer.h]
        positions = torch.arange(T, device=device)

        def plain_loss_of(x, y):
            h = model.transformer.wte(x) + model.transformer.wpe(positions)
            for block in blocks:
                h = block(h)
            logits = model.lm_head(model.transformer.ln_f(h))
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(0, 1))
            loss.backward()
            return loss

        return model, plain_loss_of, mesh
    sp = args.sequence_parallel
    for block in model.transformer.h:
        block.attn.n_head_local = H // world
        block.attn.forward = attention_forward_local.__get__(block.attn)
        plan = {"attn.c_attn": ColwiseParallel(), "mlp.c_fc": ColwiseParallel()}
        if sp:
            plan.update({
                "ln_1": SequenceParallel(), "ln_2": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
                "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            })
        else:
            plan.update({"attn.c_proj": RowwiseParallel(), "mlp.c_proj": RowwiseParallel()})
        parallelize_module(block, mesh, plan)
    top = {
        "transformer.wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
        "lm_head": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1),
                                   use_local_output=False),
    }
    if sp:
        top["transformer.ln_f"] = SequenceParallel()
    parallelize_module(model, mesh, top)
    model.transformer.wte.weight = model.lm_head.weight  # tied again: both hold the vocabulary rows Shard(0)
    blocks = [torch.compile(b) if args.compile else b for b in model.transformer.h]
    Tl = T // world if sp else T
    positions = torch.arange(rank * Tl if sp else 0, (rank + 1) * Tl if sp else T, device=device)

    def loss_of(x, y):
        from torch.distributed.tensor.parallel import loss_parallel
        h = model.transformer.wte(x) + model.transformer.wpe(positions)  # this rank's rows of the sequence under sp
        for block in blocks:
            h = block(h)
        logits = model.lm_head(model.transformer.ln_f(h))  # DTensor, the vocabulary split over the ranks
        with loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(0, 1))
            loss.backward()
        return loss.full_tensor() if hasattr(loss, "full_tensor") else loss  # a plain tensor for the loss log

    return model, loss_of, mesh


def replicate_partial_grads(params):
    """Gradients that DTensor left Partial (summands on each rank) made whole, so that the norm and AdamW see
    the model's gradient; under sequence parallelism wpe's (plain) gradient holds only this rank's positions."""
    from torch.distributed.tensor import DTensor, Replicate
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(placements=[Replicate()] * len(g.placements))


def tp_grad_norm_sq(params, group, device):
    """The squared gradient norm of the whole model: sharded gradients' local parts summed over the group,
    replicated ones counted once."""
    from torch.distributed.tensor import DTensor
    sharded, replicated = [], []
    for p in params:
        g = p.grad
        if isinstance(g, DTensor):
            (sharded if any(pl.is_shard() for pl in g.placements) else replicated).append(g.to_local())
        else:
            replicated.append(g)
    total = torch.zeros((), device=device, dtype=torch.float32)
    if sharded:
        s = torch.stack([n.float() for n in torch._foreach_norm(sharded)]).pow(2).sum()
        dist.all_reduce(s, group=group)
        total = total + s
    if replicated:
        total = total + torch.stack([n.float() for n in torch._foreach_norm(replicated)]).pow(2).sum()
    return total


# ----------------------------------------------------------------------------------------------------------
# pipeline parallelism

class StageModule(nn.Module):
    """Blocks [first, last) of the GPT, with the embeddings on the first stage and the head on the last."""

    def __init__(self, L, C, H, T, first_layer, end_layer, has_embedding, has_head):
        super().__init__()
        self.has_embedding, self.has_head = has_embedding, has_head
        if has_embedding:
            self.wte = nn.Embedding(PADDED_VOCAB_SIZE, C)
            self.wpe = nn.Embedding(max(1024, T), C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(first_layer, end_layer))
        if has_head:
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, PADDED_VOCAB_SIZE, bias=False)
        self.apply(GPT._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * L))

    def forward(self, x):
        if self.has_embedding:
            x = self.wte(x) + self.wpe(torch.arange(x.size(1), device=x.device))
        for block in self.h:
            x = block(x)
        if self.has_head:
            x = self.lm_head(self.ln_f(x))
        return x


def build_pp(args, device, world, rank):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
    L, C, H, T = args.layers, args.channels, args.heads, args.seq_len
    v = args.virtual_stages if args.schedule == "interleaved" else 1
    S = world * v
    if L < S:
        sys.exit(f"{L} layers cannot fill {S} stages")
    if args.schedule == "interleaved" and args.microbatches % world:
        sys.exit(f"--microbatches {args.microbatches} must be a multiple of the {world} ranks for interleaved")
    bounds = [L * s // S for s in range(S + 1)]
    modules, stages = [], []
    for k in range(v):
        s = rank + k * world
        with torch.device(device):
            m = StageModule(L, C, H, T, bounds[s], bounds[s + 1], s == 0, s == S - 1)
        if args.compile:
            for i, block in enumerate(m.h):
                m.h[i] = torch.compile(block)
        modules.append(m)
        stages.append(PipelineStage(m, s, S, device))

    def loss_fn(logits, y):
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(0, 1))

    if args.schedule == "1f1b":
        schedule = Schedule1F1B(stages[0], args.microbatches, loss_fn=loss_fn)
    else:
        schedule = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn)
    holds_first, holds_last = rank == 0, rank == (S - 1) % world

    def loss_of(x, y):
        losses = []
        if holds_first:
            schedule.step(x, target=y if holds_last else None, losses=losses if holds_last else None)
        elif holds_last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        if holds_last and losses:
            return torch.stack([l.detach().float() for l in losses]).mean()
        return torch.zeros((), device=device)

    return modules, loss_of


# ----------------------------------------------------------------------------------------------------------
# FSDP (with CPU offload)

def build_fsdp(args, device, world):
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    L, C, H, T, B, m = args.layers, args.channels, args.heads, args.seq_len, args.batch_size, args.microbatches
    with torch.device(device):
        model = GPT(L, C, H, max(1024, T))
    bf16 = torch.bfloat16
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}),
                 sharding_strategy=ShardingStrategy.NO_SHARD if world == 1 else ShardingStrategy.FULL_SHARD,
                 mixed_precision=MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16),
                 cpu_offload=CPUOffload(offload_params=bool(args.cpu_offload)), device_id=device)

    def loss_of(x, y):
        """The step's m micro-batches of B rows, forward and backward, gradients synchronised after the last."""
        total = torch.zeros((), device=device)
        for k in range(m):
            rows = slice(k * B, (k + 1) * B)
            with model.no_sync() if k < m - 1 else contextlib.nullcontext():
                loss = model(x[rows], y[rows])
                (loss / m).backward()
            total += loss.detach().float()
        return total / m

    return model, loss_of


# ----------------------------------------------------------------------------------------------------------

def make_optimizer(params, lr, weight_decay, fused):
    """AdamW with nanoGPT's groups; DTensor and plain parameters in groups of their own (one fused call may not
    mix them)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        DTensor = ()
    groups = []
    for is_dtensor in (True, False):
        mine = [p for p in params if isinstance(p, DTensor) == is_dtensor]
        for decay in (True, False):
            chosen = [p for p in mine if (p.dim() >= 2) == decay]
            if chosen:
                groups.append({"params": chosen, "weight_decay": weight_decay if decay else 0.0})
    kind = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **kind)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=["tp", "pp", "fsdp"])
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--channels", type=int, default=1600)
    p.add_argument("--heads", type=int, default=25)
    p.add_argument("--batch-size", "-b", type=int, default=8, help="rows per step (tp) or per micro-batch (pp)")
    p.add_argument("--seq-len", "-t", type=int, default=1024)
    p.add_argument("--sequence-parallel", type=int, default=0, choices=[0, 1])
    p.add_argument("--schedule", default="1f1b", choices=["1f1b", "interleaved"])
    p.add_argument("--virtual-stages", type=int, default=2, help="stages per rank for --schedule interleaved")
    p.add_argument("--microbatches", type=int, default=8, help="pp: micro-batches a step; fsdp: micro-batches a rank a step")
    p.add_argument("--cpu-offload", type=int, default=0, choices=[0, 1], help="fsdp: CPUOffload(offload_params=True)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after the warm-up steps)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first; the first compiles (>= 1)")
    p.add_argument("--compile", type=int, default=None, choices=[0, 1],
                   help="torch.compile each block (tp and pp; default 1); fsdp runs eager")
    p.add_argument("--backend", default="cudnn", choices=["flash", "cudnn"], help="SDPA backend (flash if cudnn cannot run)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--one-gpu", action="store_true",
                   help="every rank on GPU 0, each with its own NCCL_HOSTID (NCCL then connects them over loopback "
                        "sockets, as scripts/launch.sh --one-gpu does): a check of this script on one GPU, not a speed")
    args = p.parse_args()
    if min(args.layers, args.channels, args.heads, args.batch_size, args.seq_len, args.steps, args.warmup,
           args.microbatches, args.virtual_stages) <= 0 or args.channels % args.heads:
        sys.exit("the sizes, --steps, --warmup, --microbatches and --virtual-stages must be positive, and "
                 "--channels a multiple of --heads")
    if args.mode == "fsdp" and args.compile:
        sys.exit("--mode fsdp runs eager: --compile applies to tp and pp")
    if args.cpu_offload and args.mode != "fsdp":
        sys.exit("--cpu-offload 1 applies to --mode fsdp")
    if args.compile is None:
        args.compile = 0 if args.mode == "fsdp" else 1

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if args.one_gpu:  # read by NCCL when the process group starts
        local = 0
        os.environ["NCCL_HOSTID"] = f"host{rank}"
        os.environ["NCCL_SOCKET_IFNAME"] = "lo"
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    disable_graph_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision("high")
    L, C, H, T, B = args.layers, args.channels, args.heads, args.seq_len, args.batch_size
    heads_local = H // world if args.mode == "tp" else H
    backend = args.backend
    why = probe_backend(backend, heads_local, C // H, T, device)
    if why is not None and backend == "cudnn":
        if rank == 0:
            print(f"SDPA cudnn unavailable ({why}): flash", flush=True)
        backend = "flash"
    torch.manual_seed(args.seed)

    rows = B * args.microbatches if args.mode in ("pp", "fsdp") else B
    g = torch.Generator(device=device)
    g.manual_seed(args.seed)  # the same tokens on every rank
    steps = args.warmup + args.steps
    data = torch.randint(0, VOCAB_SIZE, (steps, rows, T + 1), device=device, generator=g)

    if args.mode == "tp":
        model, loss_of, mesh = build_tp(args, device, world, rank)
        params = [q for q in model.parameters() if q.requires_grad]
        group = mesh.get_group()
        what = f"tp {world}{' + sequence parallel' if args.sequence_parallel else ''}"
    elif args.mode == "pp":
        modules, loss_of = build_pp(args, device, world, rank)
        params = [q for m in modules for q in m.parameters()]
        group = dist.group.WORLD
        what = f"pp {world} {args.schedule}" + (f" x{args.virtual_stages}" if args.schedule == "interleaved" else "") + \
               f", {args.microbatches} micro-batches"
    else:
        model, loss_of = build_fsdp(args, device, world)
        params = list(model.parameters())
        what = (f"FSDP {'NO_SHARD' if world == 1 else 'FULL_SHARD'} over {world}, bf16 mixed precision"
                f"{', CPU offload' if args.cpu_offload else ''}, {args.microbatches} micro-batches a rank")
    if rank == 0:
        print(f"PyTorch {what}: GPT L={L} C={C} H={H}, B={B} T={T}, SDPA {backend}, compile {args.compile}; "
              f"torch {torch.__version__}, {world} x {torch.cuda.get_device_name(device)}", flush=True)

    fused = True
    try:  # a torch without the fused AdamW on the CPU refuses FSDP's offloaded parameters here
        optimizer = make_optimizer(params, args.lr, 0.1, fused)
    except (RuntimeError, ValueError) as e:
        if rank == 0:
            print(f"fused AdamW cannot take these parameters ({type(e).__name__}: {str(e).splitlines()[0][:120]}): "
                  f"foreach AdamW", flush=True)
        fused = False
        optimizer = make_optimizer(params, args.lr, 0.1, fused)

    def train_step(i):
        nonlocal optimizer, fused
        x, y = data[i, :, :-1].contiguous(), data[i, :, 1:].contiguous()
        with backend_context(backend), torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = loss_of(x, y)  # forward and backward
        if args.mode == "tp":
            replicate_partial_grads(params)
            if args.sequence_parallel:
                dist.all_reduce(model.transformer.wpe.weight.grad, group=group)
            sq = tp_grad_norm_sq(params, group, device)
        elif args.mode == "fsdp":  # FSDP's own clipping, over its sharded (with offload, host) gradients
            sq = None
            if args.grad_clip > 0:
                model.clip_grad_norm_(args.grad_clip)
        else:
            grads = [q.grad for q in params if q.grad is not None]
            sq = torch.stack([n.float() for n in torch._foreach_norm(grads)]).pow(2).sum()
            dist.all_reduce(sq, group=group)
        if args.grad_clip > 0 and sq is not None:  # on the local tensors: DTensor ops refuse a plain coefficient tensor
            coef = torch.clamp(args.grad_clip / (sq.sqrt() + 1e-6), max=1.0)
            local = [q.grad.to_local() if hasattr(q.grad, "to_local") else q.grad for q in params if q.grad is not None]
            torch._foreach_mul_(local, coef)
        for grp in optimizer.param_groups:
            grp["lr"] = lr_at(i, args.lr, 10, steps)
        try:
            optimizer.step()
        except (RuntimeError, NotImplementedError) as e:
            if not fused:
                raise
            if rank == 0:
                print(f"fused AdamW cannot take these parameters ({type(e).__name__}: {str(e).splitlines()[0][:120]}): "
                      f"foreach AdamW", flush=True)
            fused = False
            optimizer = make_optimizer(params, args.lr, 0.1, fused)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    losses = []
    for i in range(args.warmup):
        losses.append(train_step(i))
    torch.cuda.synchronize(device)
    dist.barrier()
    torch.cuda.reset_peak_memory_stats(device)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
    for i in range(args.steps):
        events[i].record()
        losses.append(train_step(args.warmup + i))
    events[-1].record()
    torch.cuda.synchronize(device)
    ms = statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(args.steps))
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux
    stats = torch.tensor([ms, peak, host_peak], device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    loss_values = torch.stack(losses).float()
    dist.all_reduce(loss_values, op=dist.ReduceOp.MAX)  # pp: only the last stage's are not zero
    ms, peak, host_peak = stats.tolist()
    tokens = rows * T * (world if args.mode == "fsdp" else 1)
    tok_s = tokens / (ms / 1000.0)
    mfu = 100.0 * flops_per_token(L, C, T) * tok_s / (PEAK_FLOPS * world)
    if rank == 0:
        first, last = loss_values[0].item(), loss_values[-1].item()
        print(f"loss {first:.4f} -> {last:.4f}", flush=True)
        if not (math.isfinite(first) and math.isfinite(last)):
            print("non-finite loss", flush=True)
            dist.destroy_process_group()
            return 1
        print(f"RESULT tokens_per_s={tok_s:.1f} ms_per_step={ms:.3f} peak_mem_gib={peak:.3f} host_peak_gib={host_peak:.2f} "
              f"mfu={mfu:.1f} mode={args.mode} world={world} sp={args.sequence_parallel} schedule={args.schedule} "
              f"microbatches={args.microbatches if args.mode in ('pp', 'fsdp') else 1} cpu_offload={args.cpu_offload} "
              f"backend={backend} "
              f"optimizer={'fused' if fused else 'foreach'}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
