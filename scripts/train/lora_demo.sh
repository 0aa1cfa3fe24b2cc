#!/usr/bin/env bash
# LoRA demonstration on one GPU: a GPT-2 124M pretrained on the Gutenberg corpus (scripts/train/train_gutenberg.sh,
# run first if its model is missing) is fine-tuned on tinyshakespeare three ways - full fine-tuning, LoRA r=8
# on qkv, LoRA r=16 on all four targets - with the same batches and steps. Prints, for each: validation loss
# on tinyshakespeare before and after, tokens/s, peak memory, trainable parameters, checkpoint size.
# Usage: scripts/train/lora_demo.sh [steps]   (default 200)
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${1:-200}
W=build/lora_demo; mkdir -p "$W"
make -s train_gpt build/prepare_shards
BASE=log/gutenberg/model_00000200.bin
[ -f "$BASE" ] || bash scripts/train/train_gutenberg.sh > "$W/pretrain.log" 2>&1
ls data/tinyshakespeare/tinyshakespeare_train_*.bin > /dev/null 2>&1 || bash scripts/data/prepare_tinyshakespeare.sh > /dev/null
COMMON=(--model "$BASE" --train-data "data/tinyshakespeare/tinyshakespeare_train_*.bin"
        --val-data "data/tinyshakespeare/tinyshakespeare_val_*.bin" --batch-size 16 --seq-len 512 --steps "$STEPS"
        --warmup-steps 20 --val-every "$STEPS" --val-batches 4 --sample-every 0)
val_loss() { grep -o "step $2: val loss [0-9.]*" "$1" | awk '{print $NF}'; }
field() { grep '^RESULT' "$1" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }
rm -rf "$W/full"
./train_gpt "${COMMON[@]}" --lr 1e-4 --checkpoint-every "$STEPS" -o "$W/full" > "$W/full.log" 2>&1
./train_gpt "${COMMON[@]}" --lr 1e-3 --lora-rank 8 --lora-targets qkv --lora-save "$W/r8_qkv.bin" > "$W/r8_qkv.log" 2>&1
./train_gpt "${COMMON[@]}" --lr 1e-3 --lora-rank 16 --lora-targets qkv,attn-proj,fc,fc-proj --lora-save "$W/r16_all.bin" \
    > "$W/r16_all.log" 2>&1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
printf '\n%s, GPT-2 124M (Gutenberg) fine-tuned on tinyshakespeare, %s steps of 16 x 512 tokens, bf16\n' "$gpu" "$STEPS"
printf '%-22s %9s %9s %11s %9s %14s %12s\n' run val_before val_after tokens/s peak_GiB trainable checkpoint_MB
params=$(grep -m1 -o '[0-9]* parameters' "$W/full.log" | awk '{print $1}')
ckpt=$(du -cb "$W/full"/*_"$(printf '%08d' "$STEPS")"* | tail -n 1 | awk '{printf "%.1f", $1 / 1e6}')
printf '%-22s %9s %9s %11s %9s %14s %12s\n' "full fine-tuning" "$(val_loss "$W/full.log" 0)" "$(val_loss "$W/full.log" "$STEPS")" \
    "$(field "$W/full.log" tokens_per_s)" "$(field "$W/full.log" peak_mem_gib)" "$params" "$ckpt"
for run in r8_qkv r16_all; do
    trainable=$(grep -m1 -o '[0-9]* trainable parameters' "$W/$run.log" | awk '{print $1}')
    size=$(du -b "$W/$run.bin" | awk '{printf "%.2f", $1 / 1e6}')
    printf '%-22s %9s %9s %11s %9s %14s %12s\n' "LoRA $run" "$(val_loss "$W/$run.log" 0)" "$(val_loss "$W/$run.log" "$STEPS")" \
        "$(field "$W/$run.log" tokens_per_s)" "$(field "$W/$run.log" peak_mem_gib)" "$trainable" "$size"
done
grep -h '^LoRA r=' "$W"/r*.log
