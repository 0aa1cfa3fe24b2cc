#!/usr/bin/env python3
"""PyTorch's AdamW on the CPU, the baseline of bench/bench_offload.sh's cpu_adam section.

    python3 bench/bench_pytorch_adamw_cpu.py [--elements N] [--threads T] [--reps R]

One fp32 parameter tensor of N elements with an fp32 gradient (as a CPU-offloaded optimizer holds them: FSDP's and
DeepSpeed's host copies are fp32), torch.optim.AdamW(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1) with
foreach=True, and with fused=True where this torch has a fused CPU AdamW; torch.set_num_threads(T). Each variant
takes one untimed step (its state is created there) and R timed steps; best and median seconds. The bytes an element
are counted as bench_adamw_cpu counts its fp32 run: gradient 4, parameter 4 + 4, m and v 16 (28), whatever
temporaries PyTorch makes. One line a variant:
  RESULT torch_adamw_cpu <foreach|fused> elements=N threads=T best_s=... median_s=... params_per_s=... GB_per_s=...
A variant this torch cannot run prints SKIP with the reason.
"""
import argparse
import sys
import time

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("torch", "torch"),):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: bench/bench_pytorch_adamw_cpu.py needs {_module}{_why}: pip install {_pip}")
import torch  # noqa: E402


def time_variant(name, n, threads, reps, **kind):
    param = torch.nn.Parameter(torch.full((n,), 0.0078125, dtype=torch.float32))
    param.grad = torch.full((n,), 0.001, dtype=torch.float32)
    try:
        opt = torch.optim.AdamW([param], lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kind)
        opt.step()  # creates m and v
    except (RuntimeError, TypeError, ValueError) as e:
        print(f"SKIP torch_adamw_cpu {name}: {(str(e).splitlines() or [repr(e)])[0]}")
        return
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        opt.step()
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    best, median = seconds[0], seconds[len(seconds) // 2]
    print(f"RESULT torch_adamw_cpu {name} elements={n} threads={threads} best_s={best:.4f} median_s={median:.4f} "
          f"params_per_s={n / best:.4g} GB_per_s={28.0 * n / best / 1e9:.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=1 << 28)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    for flag in ("elements", "threads", "reps"):
        if getattr(args, flag) <= 0:
            sys.exit(f"error: --{flag} must be a positive integer, got {getattr(args, flag)}")
    torch.set_num_threads(args.threads)
    print(f"bench_pytorch_adamw_cpu: torch {torch.__version__}, {args.elements} elements, {args.threads} threads", flush=True)
    time_variant("foreach", args.elements, args.threads, args.reps, foreach=True)
    time_variant("fused", args.elements, args.threads, args.reps, fused=True)


if __name__ == "__main__":
    main()
