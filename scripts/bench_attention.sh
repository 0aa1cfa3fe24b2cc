#!/usr/bin/env bash
# Causal attention speed on the GPU machine: our fused flash attention (test/bench_attention.cu) against
# PyTorch SDPA's flash backend, bf16, forward and forward + backward, for (B=64, H=12, T=1024, d=64) and
# (B=8, H=16, T=2048, d=128). Both sides: CUDA events, warm-up, median of the repetitions.
# FLOP convention (causal): forward 4*B*H*T^2*d / 2, backward 2.5x forward, forward + backward 3.5x.
# Builds build/bench_attention (make). Usage: scripts/bench_attention.sh [reps]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-30}
mkdir -p build
make -s build/bench_attention
SHAPES="64 12 1024 64
8 16 2048 128"
OURS=$(while read -r B H T D; do ./build/bench_attention "$B" "$H" "$T" "$D" bf16 "$REPS"; done <<< "$SHAPES")
printf '%s\n' "$OURS"
REPS=$REPS OURS="$OURS" SHAPES="$SHAPES" python3 - <<'PY'
import os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

reps = int(os.environ["REPS"])
ours = {}
for line in os.environ["OURS"].splitlines():
    if not line.startswith("ours "):
        continue
    _, what, B, H, T, D, ms, tflops = line.split()
    ours[(what, int(B), int(H), int(T), int(D))] = float(tflops)


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


print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, causal, median of {reps}")
print(f"{'shape (B,H,T,d)':<22}{'pass':<10}{'ours TFLOP/s':>13}{'SDPA TFLOP/s':>14}{'ours/SDPA':>11}")
for shape in os.environ["SHAPES"].splitlines():
    B, H, T, D = map(int, shape.split())
    # the layout of our qkv (B, T, 3, H, D): SDPA reads strided q, k, v views of it
    qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    fwd_flops = 4 * B * H * T * T * D / 2
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        def fwd_bwd():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(out, (qkv,), dout)
        with torch.no_grad():
            sdpa_fwd = fwd_flops / (median_ms(fwd) * 1e-3) / 1e12
        sdpa_fb = 3.5 * fwd_flops / (median_ms(fwd_bwd) * 1e-3) / 1e12
    for label, what, sdpa in (("fwd", "fwd", sdpa_fwd), ("fwd+bwd", "fwdbwd_det", sdpa_fb),
                              ("fwd+bwd*", "fwdbwd_atomic", sdpa_fb)):
        mine = ours[(what, B, H, T, D)]
        print(f"{str((B, H, T, D)):<22}{label:<10}{mine:>13.1f}{sdpa:>14.1f}{mine / sdpa:>11.2f}")
print("fwd+bwd: our deterministic backward; fwd+bwd*: our atomic (nondeterministic) backward")
PY
