#!/usr/bin/env python3
"""Holds GPU memory so that other processes see a smaller GPU: bench/bench_offload.sh's GPU_MEMORY_GIB.

    python3 bench/hold_gpu_memory.py --leave-gib 79.1 [--device 0]

Allocates one block of (free memory - leave) bytes on the device, prints one line "holding H GiB: F GiB left free"
and waits until it is killed. An H200 (about 140 GiB) left with 79.1 GiB free has the memory an H100 80GB offers a
process (cudaMemGetInfo's free after the CUDA context), so a run's memory plan and its allocations meet the smaller
GPU's limit; its speed stays the H200's (more memory bandwidth than an H100, the same dense tensor-core peak).
"""
import argparse
import signal
import sys

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("torch", "torch"),):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: bench/hold_gpu_memory.py needs {_module}{_why}: pip install {_pip}")
import torch  # noqa: E402

GIB = 1024 ** 3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--leave-gib", type=float, required=True, help="GiB to leave free for other processes")
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: bench/hold_gpu_memory.py: no CUDA device")
    torch.cuda.set_device(args.device)
    free, _ = torch.cuda.mem_get_info()
    hold = free - int(args.leave_gib * GIB)
    if hold <= 0:
        sys.exit(f"error: bench/hold_gpu_memory.py: --leave-gib {args.leave_gib} is not below the {free / GIB:.1f} GiB free")
    # one block through the caching allocator: a single cudaMalloc, rounded to 2 MiB
    block = torch.cuda.caching_allocator_alloc(hold)
    free_after, _ = torch.cuda.mem_get_info()
    print(f"holding {hold / GIB:.1f} GiB: {free_after / GIB:.1f} GiB left free", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    torch.cuda.caching_allocator_delete(block)


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
