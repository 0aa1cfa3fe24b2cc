#!/usr/bin/env bash
# GPT-2 reproduction recipes on FineWeb (prepare it first: scripts/data/prepare_fineweb.py), with llm.c's published
# hyper-parameters: total batch 0.5M tokens (1M for 774M and 1.5B), warm-up 700 steps, weight decay 0.1,
# cosine decay, T=1024.
# Usage: scripts/train/train_gpt2.sh 124M|350M|774M|1558M [extra train_gpt flags]
#   124M : d12, lr 6e-4, 0.5M tokens/step, 19,073 steps (10B tokens)
#   350M : d24, lr 3e-4, 0.5M tokens/step, 60,000 steps (31B tokens)
#   774M : d36, lr 2.5e-4, 1M tokens/step, 143,000 steps (150B tokens)
#   1558M: d48, lr 6e-4 to 10%, 1M tokens/step, 32,000 steps (33.6B tokens)
# --batch-size is the micro-batch for one 80 GB GPU; gradient accumulation fills the total batch.
set -euo pipefail
cd "$(dirname "$0")/../.."
size=${1:?usage: $0 124M|350M|774M|1558M [flags]}; shift
DATA=${FINEWEB:-data/fineweb}
case $size in
    124M)  args=(--model d12 --batch-size 64 --total-batch-tokens 524288 --lr 6e-4 --final-lr-frac 0.0 --steps 19073) ;;
    350M)  args=(--model d24 --batch-size 16 --total-batch-tokens 524288 --lr 3e-4 --final-lr-frac 0.0 --steps 60000) ;;
    774M)  args=(--model d36 --batch-size 16 --total-batch-tokens 1048576 --lr 2.5e-4 --final-lr-frac 0.0 --steps 143000) ;;
    1558M) args=(--model d48 --batch-size 16 --total-batch-tokens 1048576 --lr 6e-4 --final-lr-frac 0.1 --steps 32000) ;;
    *) echo "error: unknown size '$size' (expected 124M, 350M, 774M or 1558M)" >&2; exit 1 ;;
esac
exec ./train_gpt "${args[@]}" --seq-len 1024 --warmup-steps 700 --weight-decay 0.1 --lr-schedule cosine \
    --train-data "$DATA/fineweb_train_*.bin" --val-data "$DATA/fineweb_val_*.bin" --val-every 250 --val-batches 20 \
    --sample-every 20000 --checkpoint-every 5000 --output-dir "log/gpt2_$size" --resume 1 "$@"
