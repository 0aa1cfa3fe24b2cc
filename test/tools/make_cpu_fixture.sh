#!/usr/bin/env bash
# Generates a CPU-reference fixture into OUTPUT_DIR with the PyTorch reference:
#   default: model.bin, debug_state.bin (test_cpu_reference)
#   --lora:  model.bin, lora_init.bin, lora_state.bin, merged.bin, lora_dropout.bin (test_cpu_lora; docs/lora.md)
# Exit 2 when torch/numpy cannot be imported (the test runner reports that as SKIP).
# PYTHON overrides the interpreter (default /usr/bin/python3, Debian's python3-torch).
set -euo pipefail

lora=0
if [ "${1:-}" = "--lora" ]; then lora=1; shift; fi
if [ $# -ne 1 ]; then
    echo "usage: $0 [--lora] OUTPUT_DIR" >&2
    exit 1
fi
out_dir=$1
repo_root=$(cd "$(dirname "$0")/../.." && pwd)

# The first interpreter that has torch and numpy: $PYTHON, Debian's /usr/bin/python3, then python3 on PATH.
python=""
for candidate in ${PYTHON:-} /usr/bin/python3 python3; do
    if why=$("$candidate" -c "import torch, numpy" 2>&1); then python=$candidate; break; fi
done
if [ -z "$python" ]; then
    echo "make_cpu_fixture: cannot import torch/numpy with ${PYTHON:-/usr/bin/python3} or python3: $(printf '%s' "$why" | tail -n 1)"
    exit 2
fi

mkdir -p "$out_dir"
reference=("$python" "$repo_root/scripts/reference/gpt2_reference.py")
if [ $lora -eq 1 ]; then
    # Rank-4 adapters on all four targets with B ~ N(0, 0.02) instead of zero, so that the adapters shape the
    # logits and every gradient from step 0. Adam's update hardly depends on the gradient's scale, so weight
    # decay and clipping move the losses little: a large lr and weight decay, and a clip the gradient norm
    # (0.25-0.28) crosses in steps 3-6, make a missing decay or clip fail the 1e-5 loss checks.
    "${reference[@]}" debug-state \
        --layers 2 --heads 2 --channels 128 --max-seq-len 64 --vocab-size 50257 \
        --batch-size 4 --seq-len 64 --steps 10 --seed 1337 --dtype fp32 --device cpu \
        --lr 3e-3 --grad-clip 0.27 \
        --lora-rank 4 --lora-alpha 8 --lora-targets qkv,attn-proj,fc,fc-proj --lora-init-b-std 0.02 \
        --lora-weight-decay 1.0 \
        --model-out "$out_dir/model.bin" --state-out "$out_dir/lora_state.bin" --lora-out "$out_dir/lora_init.bin"
    "${reference[@]}" export-merged --model "$out_dir/model.bin" --lora "$out_dir/lora_init.bin" \
        --out "$out_dir/merged.bin"
    # Adapter dropout must at least run in training (the C++ reference has none, so the debug state uses none).
    "${reference[@]}" make-shard --out "$out_dir/shard.bin" --tokens 1024 --seed 1
    "${reference[@]}" train --init-from "$out_dir/model.bin" --lora-load "$out_dir/lora_init.bin" \
        --lora-dropout 0.1 --train-shards "$out_dir/shard.bin" --batch-size 4 --seq-len 64 --steps 2 \
        --lr 1e-3 --device cpu --lora-out "$out_dir/lora_dropout.bin"
    exit 0
fi
"${reference[@]}" debug-state \
    --layers 2 --heads 4 --channels 128 --max-seq-len 64 --vocab-size 50257 \
    --batch-size 4 --seq-len 64 --steps 10 --seed 1337 --dtype fp32 --device cpu \
    --lr 1e-4 --weight-decay 0.1 --grad-clip 1.0 \
    --model-out "$out_dir/model.bin" --state-out "$out_dir/debug_state.bin"
