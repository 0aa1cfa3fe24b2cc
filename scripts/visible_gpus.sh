#!/usr/bin/env bash
# Prints how many GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES when it is set (as under
# Slurm, or when tests share a machine), else the GPUs nvidia-smi lists (0 without a driver).
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c '[^[:space:]]'
else
    (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU '
fi
exit 0
