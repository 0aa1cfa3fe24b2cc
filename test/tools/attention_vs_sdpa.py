#!/usr/bin/env python3
"""PyTorch reference for the fused flash attention: random q, k, v, dout (fixed seed) on the GPU, causal
scaled_dot_product_attention forward and backward through the flash backend, all written to one binary file
that test/test_attention reads (usage: test_attention OUT_FILE).

File: b"SDPAREF1", then per case int32 dtype (1 = bf16, 2 = fp16), B, H, T, D, then q, k, v, dout, out, dq, dk,
dv, each (B, T, H, D) row-major in that dtype: the layout of one slice of our (B, T, 3, NH, hs) qkv.

Usage: attention_vs_sdpa.py OUT_FILE [--seed N]
"""
import argparse
import struct
import sys

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("torch", "torch"), ("torch.nn.attention", "'torch>=2.3'")):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: test/tools/attention_vs_sdpa.py needs {_module}{_why}: pip install {_pip}")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

# (dtype, B, H, T, D): odd head counts, ragged lengths, both head sizes, both 16-bit types
CASES = [
    (torch.bfloat16, 2, 3, 1000, 64),
    (torch.float16, 1, 5, 257, 128),
    (torch.bfloat16, 1, 3, 2048, 128),
    (torch.float16, 3, 1, 65, 64),
]
DTYPE_CODE = {torch.bfloat16: 1, torch.float16: 2}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_file")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    with open(args.out_file, "wb") as f:
        f.write(b"SDPAREF1")
        for dtype, B, H, T, D in CASES:
            q, k, v, dout = (torch.randn(B, T, H, D, device="cuda", dtype=dtype) for _ in range(4))
            q.requires_grad_(True)
            k.requires_grad_(True)
            v.requires_grad_(True)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=True).transpose(1, 2)
                dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
            f.write(struct.pack("<5i", DTYPE_CODE[dtype], B, H, T, D))
            for t in (q, k, v, dout, out, dq, dk, dv):
                f.write(t.detach().contiguous().view(torch.int16).cpu().numpy().tobytes())
            print(f"case {dtype} B={B} H={H} T={T} D={D} written")


if __name__ == "__main__":
    main()
