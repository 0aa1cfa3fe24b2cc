#!/usr/bin/env bash
# Throughput benchmark on the GPU machine: GPT-2 124M (d12), T=1024, bf16, at B=64 and B=32, trained by
# train_gpt and by the PyTorch reference (torch.compile, bf16 autocast, SDPA flash attention, fused AdamW)
# in the same run on the same GPU. Prints tokens/s, ms/step, peak memory and the ratio ours/PyTorch, then
# train_gpt's --recompute levels 0-3 at the first batch size, and level 0 with --deterministic 1.
# Usage: scripts/bench_gpt2.sh [steps] [batch sizes...]   (default: 30 steps, B = 64 32)
# SIZES="d24 d36 d48" adds GPT-2 350M / 774M / 1.5B, each trainer at the largest batch (32, 16, 8, 4, 2, 1) that
# fits the GPU (train_gpt: its memory plan; PyTorch: the first that does not run out of memory).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-30}; shift || true
BATCHES=${*:-64 32}
W=build/bench; mkdir -p "$W"
PY=${PYTHON:-python3}
make -s train_gpt
[ -f "$W/random.bin" ] || $PY scripts/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 8000000 > /dev/null
$PY scripts/gpt2_reference.py debug-state --device cuda --steps 1 --batch-size 1 --seq-len 8 --layers 12 --heads 12 \
    --channels 768 --max-seq-len 1024 --model-out "$W/d12.bin" --state-out "$W/unused.bin" > /dev/null
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
field() { grep '^RESULT' "$1" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }
printf '\n%s, GPT-2 124M, T=1024, bf16, %s steps (median after warm-up)\n' "$gpu" "$STEPS"
printf '%-4s %-10s %12s %10s %10s\n' B trainer tokens/s ms/step peak_GiB
for B in $BATCHES; do
    ./train_gpt --model "$W/d12.bin" --train-data "$W/random.bin" --val-every 0 --sample-every 0 --batch-size "$B" \
        --seq-len 1024 --steps "$STEPS" --precision bf16 --lr 6e-4 > "$W/ours_b$B.log" 2>&1 || { tail -n 3 "$W/ours_b$B.log"; exit 1; }
    $PY scripts/gpt2_reference.py train --init-from "$W/d12.bin" --train-shards "$W/random.bin" --batch-size "$B" \
        --seq-len 1024 --steps "$STEPS" --dtype bf16 --device cuda --compile --sdpa --fused-adamw --lr 6e-4 \
        > "$W/torch_b$B.log" 2>&1 || { tail -n 3 "$W/torch_b$B.log"; exit 1; }
    for who in ours torch; do
        printf '%-4s %-10s %12s %10s %10s\n' "$B" "$who" "$(field "$W/${who}_b$B.log" tokens_per_s)" \
            "$(field "$W/${who}_b$B.log" ms_per_step)" "$(field "$W/${who}_b$B.log" peak_mem_gib)"
    done
    awk -v a="$(field "$W/ours_b$B.log" tokens_per_s)" -v b="$(field "$W/torch_b$B.log" tokens_per_s)" -v B="$B" \
        'BEGIN { printf "B=%s ratio train_gpt / PyTorch tokens/s: %.3f\n", B, a / b }'
done
# --recompute levels at the first batch size: speed against activation memory
B=${BATCHES%% *}
printf '\n%-4s %-10s %12s %10s %10s\n' B recompute tokens/s ms/step peak_GiB
for r in 0 1 2 3; do
    ./train_gpt --model "$W/d12.bin" --train-data "$W/random.bin" --val-every 0 --sample-every 0 --batch-size "$B" \
        --seq-len 1024 --steps "$STEPS" --precision bf16 --lr 6e-4 --recompute $r > "$W/ours_b${B}_r$r.log" 2>&1 \
        || { tail -n 3 "$W/ours_b${B}_r$r.log"; exit 1; }
    printf '%-4s %-10s %12s %10s %10s\n' "$B" "$r" "$(field "$W/ours_b${B}_r$r.log" tokens_per_s)" \
        "$(field "$W/ours_b${B}_r$r.log" ms_per_step)" "$(field "$W/ours_b${B}_r$r.log" peak_mem_gib)"
done

# --deterministic 1: bitwise reproducible runs (the attention backward's dQ summed in a fixed order instead of
# atomically, as PyTorch's SDPA backward does; cuBLASLt's first heuristic choice instead of the fastest timed one)
./train_gpt --model "$W/d12.bin" --train-data "$W/random.bin" --val-every 0 --sample-every 0 --batch-size "$B" \
    --seq-len 1024 --steps "$STEPS" --precision bf16 --lr 6e-4 --deterministic 1 > "$W/ours_b${B}_deterministic.log" 2>&1 \
    || { tail -n 3 "$W/ours_b${B}_deterministic.log"; exit 1; }
printf '%-4s %-10s %12s %10s %10s   (--deterministic 1)\n' "$B" 0 "$(field "$W/ours_b${B}_deterministic.log" tokens_per_s)" \
    "$(field "$W/ours_b${B}_deterministic.log" ms_per_step)" "$(field "$W/ours_b${B}_deterministic.log" peak_mem_gib)"

# larger models, each at its largest batch that fits
layers() { echo "${1#d}"; }
for size in ${SIZES:-}; do
    case $size in d24) C=1024; H=16 ;; d36) C=1280; H=20 ;; d48) C=1600; H=25 ;; *) echo "unknown size $size"; exit 1 ;; esac
    ours_b=""; torch_b=""
    for b in 32 16 8 4 2 1; do
        if [ -z "$ours_b" ] && ./train_gpt --model "$size" --train-data "$W/random.bin" --batch-size $b --seq-len 1024 --steps 0 \
            --val-every 0 --sample-every 0 > /dev/null 2>&1; then ours_b=$b; fi
        if [ -z "$torch_b" ] && $PY scripts/gpt2_reference.py train --layers "$(layers $size)" --heads $H --channels $C \
            --max-seq-len 1024 --train-shards "$W/random.bin" --batch-size $b --seq-len 1024 --steps 2 --timing-warmup 0 \
            --dtype bf16 --device cuda --sdpa --fused-adamw > /dev/null 2>&1; then torch_b=$b; fi
    done
    ./train_gpt --model "$size" --train-data "$W/random.bin" --val-every 0 --sample-every 0 --batch-size "$ours_b" \
        --seq-len 1024 --steps "$STEPS" --precision bf16 > "$W/ours_$size.log" 2>&1 || { tail -n 3 "$W/ours_$size.log"; exit 1; }
    $PY scripts/gpt2_reference.py train --layers "$(layers $size)" --heads $H --channels $C --max-seq-len 1024 \
        --train-shards "$W/random.bin" --batch-size "$torch_b" --seq-len 1024 --steps "$STEPS" --dtype bf16 --device cuda \
        --compile --sdpa --fused-adamw > "$W/torch_$size.log" 2>&1 || { tail -n 3 "$W/torch_$size.log"; exit 1; }
    printf '%-4s %-10s %12s %10s %10s   (B ours %s, PyTorch %s)\n' "$size" ours "$(field "$W/ours_$size.log" tokens_per_s)" \
        "$(field "$W/ours_$size.log" ms_per_step)" "$(field "$W/ours_$size.log" peak_mem_gib)" "$ours_b" "$torch_b"
    printf '%-4s %-10s %12s %10s %10s\n' "$size" torch "$(field "$W/torch_$size.log" tokens_per_s)" \
        "$(field "$W/torch_$size.log" ms_per_step)" "$(field "$W/torch_$size.log" peak_mem_gib)"
done
