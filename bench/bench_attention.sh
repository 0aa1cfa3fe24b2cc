#!/usr/bin/env bash
# Causal attention speed on the GPU machine: our fused flash attention (build/bench_attention, from
# bench/bench_attention.cu) against PyTorch SDPA with the flash backend (FlashAttention-2) and the cuDNN backend,
# the faster of the two per pass being the baseline; bf16, forward and forward + backward, for (B, H, T, d) =
# (64, 12, 1024, 64), (8, 16, 2048, 128), (16, 12, 4096, 64). Both sides: CUDA events around each repetition,
# 3 warm-up runs, median of the repetitions, random inputs.
# SDPA is timed on two layouts and the faster is kept: "qkv", q, k, v as strided (B, H, T, d) views of one
# (B, T, 3, H, d) tensor (what a GPT-2 block passes, and what ours reads), and "bhtd", three contiguous
# (B, H, T, d) tensors. Its backward returns dq, dk, dv (gradients of the three leaves: no assembly into a
# qkv gradient is timed); dout has the strides of out.
# FLOP convention (causal, as bench/bench_attention.cu): forward 4*B*H*T^2*d / 2, backward 2.5x forward,
# forward + backward 3.5x.
# ROUNDS=R (default 1): R rounds, each timing ours and then SDPA on one shape before the next shape, so that both
# sides of a shape run close together; each side keeps its best round (the backward's time at T = 4096 moves by
# up to 6% with a state of the GPU that its sampled clock does not show: one H200, 2026-11, docs/perf.md).
# Usage: bench/bench_attention.sh [reps]   (default 30; SHAPES="B H T D" lines override the shapes;
#        SDPA_LAYOUTS="qkv bhtd" the layouts; SDPA_BACKENDS="flash cudnn" the backends; ROUNDS)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-30}
mkdir -p build
make -s build/bench_attention
SHAPES=${SHAPES:-"64 12 1024 64
8 16 2048 128
16 12 4096 64"}
REPS=$REPS ROUNDS=${ROUNDS:-1} SHAPES="$SHAPES" SDPA_LAYOUTS=${SDPA_LAYOUTS:-"qkv bhtd"} SDPA_BACKENDS=${SDPA_BACKENDS:-"flash cudnn"} \
    ${PYTHON:-python3} - <<'PY'
import os
import subprocess
import sys
import warnings

import torch
import torch.nn.functional as F

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    sys.exit(f"torch {torch.__version__}: torch.nn.attention.sdpa_kernel needed (torch >= 2.3)")

reps = int(os.environ["REPS"])
rounds = int(os.environ["ROUNDS"])
layouts = os.environ["SDPA_LAYOUTS"].split()
ours = {}  # (what, B, H, T, D) -> best TFLOP/s over the rounds


def run_ours(B, H, T, D):
    """build/bench_attention on one shape: its lines printed, its "ours WHAT B H T D MS TFLOPS" lines kept."""
    done = subprocess.run(["./build/bench_attention", str(B), str(H), str(T), str(D), "bf16", str(reps)],
                          capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.exit(f"build/bench_attention {B} {H} {T} {D} exited {done.returncode}: {first_line(done.stderr)}")
    for line in done.stdout.splitlines():
        if line.startswith("ours "):
            _, what, b, h, t, d, ms, tflops = line.split()
            key = (what, int(b), int(h), int(t), int(d))
            ours[key] = max(ours.get(key, 0.0), float(tflops))

BACKENDS = {}
for name in os.environ["SDPA_BACKENDS"].split():
    if name == "flash":
        BACKENDS[name] = SDPBackend.FLASH_ATTENTION
    elif name == "cudnn" and hasattr(SDPBackend, "CUDNN_ATTENTION"):
        BACKENDS[name] = SDPBackend.CUDNN_ATTENTION
    else:
        print(f"SDPA backend {name}: not in torch {torch.__version__}; left out")


def first_line(text):
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


def median_ms(fn, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def leaves(layout, B, H, T, D):
    """q, k, v (B, H, T, D), each a leaf that requires grad."""
    if layout == "qkv":  # strided views of one (B, T, 3, H, D) tensor, as a GPT-2 block makes them
        qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=torch.bfloat16)
        return [qkv[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3)]
    return [torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]


def time_sdpa(backend, layout, B, H, T, D):
    """(forward ms, forward + backward ms) of SDPA with one backend on one layout."""
    q, k, v = leaves(layout, B, H, T, D)
    with sdpa_kernel(backend):
        with torch.no_grad():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        dout = torch.randn_like(out)  # the strides of out (preserve_format)
        del out

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(out, (q, k, v), dout)

        return median_ms(fwd), median_ms(fwd_bwd)


def time_shape(shape):
    """SDPA on one shape with every backend and layout; keeps each backend's best and the best of all."""
    B, H, T, D = shape
    fwd_flops = 4 * B * H * T * T * D / 2
    for name, backend in BACKENDS.items():
        for layout in layouts:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    fwd_ms, fb_ms = time_sdpa(backend, layout, B, H, T, D)
                except Exception as e:  # noqa: BLE001 (a backend that cannot run this is reported and left out)
                    why = [first_line(w.message) for w in caught if first_line(w.message)]
                    print(f"sdpa {name} {layout} {B} {H} {T} {D}: unavailable: {type(e).__name__}: {first_line(e)}"
                          + (f" ({'; '.join(why[:2])})" if why else ""))
                    torch.cuda.synchronize()
                    continue
            tf = {"fwd": fwd_flops / (fwd_ms * 1e-3) / 1e12, "fwdbwd": 3.5 * fwd_flops / (fb_ms * 1e-3) / 1e12}
            print(f"sdpa {name} {layout} {B} {H} {T} {D} fwd {fwd_ms:.4f} ms {tf['fwd']:.1f} TFLOP/s, "
                  f"fwd+bwd {fb_ms:.4f} ms {tf['fwdbwd']:.1f} TFLOP/s")
            for what in ("fwd", "fwdbwd"):
                mine = per_backend[shape][name]
                if mine[what] is None or tf[what] > mine[what]:
                    mine[what] = tf[what]
                if tf[what] > best[shape][what][0]:
                    best[shape][what] = (tf[what], f"{name}/{layout}")


print(f"\nGPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
      f"bf16, causal, median of {reps}" + (f", best of {rounds} rounds (ours and SDPA alternated per shape)" if rounds > 1 else ""))
print("FLOPs: forward 4*B*H*T^2*d/2, backward 2.5x forward, forward + backward 3.5x (as bench/bench_attention.cu)")
shapes = [tuple(map(int, line.split())) for line in os.environ["SHAPES"].splitlines() if line.strip()]
best = {shape: {"fwd": (0.0, "-"), "fwdbwd": (0.0, "-")} for shape in shapes}
per_backend = {shape: {name: {"fwd": None, "fwdbwd": None} for name in BACKENDS} for shape in shapes}
for r in range(rounds):
    if rounds > 1:
        print(f"round {r + 1} of {rounds}")
    for shape in shapes:
        run_ours(*shape)
        time_shape(shape)
rows = []
for shape in shapes:
    B, H, T, D = shape
    for label, what, mine_key in (("fwd", "fwd", "fwd"), ("fwd+bwd", "fwdbwd", "fwdbwd_det"),
                                  ("fwd+bwd*", "fwdbwd", "fwdbwd_atomic")):
        rows.append((shape, label, ours.get((mine_key, B, H, T, D)),
                     {name: per_backend[shape][name][what] for name in BACKENDS}, best[shape][what]))

names = list(BACKENDS)
fmt = lambda x: f"{x:.1f}" if x else "n/a"
print(f"\n{'shape (B,H,T,d)':<20}{'pass':<10}{'ours':>8}" + "".join(f"{'SDPA ' + n:>12}" for n in names)
      + f"{'best SDPA':>20}{'ours/best':>11}   (TFLOP/s)")
for shape, label, mine, per, (best_tf, best_tag) in rows:
    ratio = f"{mine / best_tf:.2f}" if mine and best_tf else "n/a"
    print(f"{str(shape):<20}{label:<10}{fmt(mine):>8}" + "".join(f"{fmt(per[n]):>12}" for n in names)
          + f"{fmt(best_tf) + ' ' + best_tag:>20}{ratio:>11}")
print("fwd+bwd: our deterministic backward (train_gpt's on Hopper); fwd+bwd*: our atomic (nondeterministic) one, "
      "train_gpt's --deterministic 0 elsewhere; "
      "SDPA per backend: its faster layout; best: backend/layout")
PY
