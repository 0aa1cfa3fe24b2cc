#!/usr/bin/env bash
# ZeRO-3 at scale: a GPT-shaped model too large for one GPU at stage 0 -- LAYERS (default 32) layers, C=4096,
# 32 heads: 6.6B parameters, 106 GB of model states at 16 bytes each, beyond an 80 GB H100; LAYERS=48 gives
# 9.8B parameters, 157 GB, beyond a 141 GB H200 too -- trained for a few steps at stage 3.
# First asks one GPU (stage 0) for its memory plan (refused when it does not fit), then trains the model on N
# GPUs and prints the measured model states per GPU against the ZeRO formula, tokens/s, MFU and peak memory.
# Usage: bench/bench_zero3_scale.sh [gpus] [rows per GPU] [steps]   (default 4, 8 or 4 (see below), 20)
set -euo pipefail
cd "$(dirname "$0")/.."
# default rows per GPU: 8 where a GPU has over 100 GB (H200), else 4 (H100 80 GB)
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
N=${1:-4}; B=${2:-$([ "${gpu_mib:-0}" -gt 100000 ] && echo 8 || echo 4)}; STEPS=${3:-20}
W=build/zero3_scale; mkdir -p "$W"
export NCCL_NVLS_ENABLE=0  # NVLink multicast off (see docs/parallel.md)
PY=${PYTHON:-python3}
make -s train_gpt
[ -f "$W/random.bin" ] || $PY scripts/reference/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 2000000 > /dev/null
SHAPE=(--layers "${LAYERS:-32}" --heads 32 --channels 4096 --max-seq-len 1024 --seq-len 1024 --batch-size "$B" --train-data "$W/random.bin"
       --val-every 0 --sample-every 0 --precision bf16 --lr 1e-4)
echo "== one GPU, stage 0"
if ./train_gpt "${SHAPE[@]}" --steps 0 > "$W/one_gpu.log" 2>&1; then
    echo "the model fits one GPU: $(grep -m1 '^memory plan' "$W/one_gpu.log")"; else grep -m1 -E "error" "$W/one_gpu.log"; fi
echo "== $N GPUs, ZeRO stage 3, $STEPS steps"
scripts/launch.sh "$N" ./train_gpt "${SHAPE[@]}" --steps "$STEPS" --zero-stage 3 > "$W/zero3.log" 2>&1 \
    || { tail -n 20 "$W/zero3.log"; exit 1; }
grep -E "^(model:|batch:|data parallel|memory plan|device memory|model states|RESULT)" "$W/zero3.log"
grep -E "^step " "$W/zero3.log" | tail -n 3
