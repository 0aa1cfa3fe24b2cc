#!/usr/bin/env bash
# Per-kernel profile of one training step of train_gpt (GPT-2 124M by default, bf16, T=1024) with Nsight
# Compute: each kernel's time, share of the step, and achieved DRAM and SM throughput (% of the GPU's peak),
# summed by kernel name. The second of two steps is reported (the first includes one-time work).
# Usage: scripts/profile_step.sh [batch] [extra train_gpt flags...]   (default batch 64)
# Needs ncu with access to the hardware counters (Firecracker machines; not gVisor).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-64}; shift || true
W=build/profile; mkdir -p "$W"
PY=${PYTHON:-python3}
make -s train_gpt
[ -f "$W/random.bin" ] || $PY scripts/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 2000000 > /dev/null
# no cache flush and no clock locking: kernels run as in training; both metrics come from one pass
ncu --clock-control none --cache-control none --csv --page raw --print-units base --metrics gpu__time_duration.sum,dram__bytes.sum \
    ./train_gpt --model d12 --train-data "$W/random.bin" --val-every 0 --sample-every 0 --batch-size "$B" --seq-len 1024 \
    --steps 2 --precision bf16 "$@" > "$W/ncu.csv" 2> "$W/ncu.err" || { tail -n 5 "$W/ncu.err"; exit 1; }
$PY scripts/summarize_profile.py "$W/ncu.csv"
