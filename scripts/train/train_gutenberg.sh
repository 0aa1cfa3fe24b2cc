#!/usr/bin/env bash
# A shorter GPT-2 124M recipe that runs on one GPU here: one epoch of the Gutenberg corpus (26.7M tokens),
# 128K tokens per step, lr 6e-4 with 100 warm-up steps and cosine decay to 10%, validation every 50 steps.
# Usage: scripts/train/train_gutenberg.sh [extra train_gpt flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
ls data/gutenberg/gutenberg_train_*.bin > /dev/null 2>&1 || bash scripts/data/prepare_gutenberg.sh
exec ./train_gpt --model d12 --batch-size 32 --seq-len 1024 --total-batch-tokens 131072 --steps 200 \
    --lr 6e-4 --warmup-steps 100 --final-lr-frac 0.1 --weight-decay 0.1 \
    --train-data "data/gutenberg/gutenberg_train_*.bin" --val-data "data/gutenberg/gutenberg_val_*.bin" \
    --val-every 50 --val-batches 20 --sample-every 100 --checkpoint-every 100 --output-dir log/gutenberg "$@"
