#!/usr/bin/env bash
# Whole model on the GPU against the PyTorch reference (scripts/reference/gpt2_reference.py on the same GPU), in fp32,
# bf16 and fp16, for a small config and for d12 at B=4, T=64, and for Llama-family models against
# scripts/reference/llama_reference.py: logits, loss, gradient norm, every gradient tensor, and the losses of 10 AdamW
# steps (tolerances in test/test_model.cu), and for the Llama model in fp32 LoRA on slices of a product (q, k, v, gate,
# up) against the same adapters as whole-product ones; the same steps with the optimizer state
# on the host (ZeRO-Offload) bitwise equal to the GPU's, and its skip of a NaN gradient. Then LoRA (r=4 on all four
# targets, non-zero B) in fp32 and bf16: logits, loss, adapter gradients, 10 losses, base weights unchanged,
# and with B = 0 the base model's logits bitwise. The quick tier (TEST_TIER=quick) runs the small config in each
# precision: d12 and LoRA only in the full tier (the training suite's quick tier trains and merges adapters).
# The three precisions run side by side (the reference and then test_model, one job each: their time is mostly
# PyTorch's and CUDA's start-up), their lines printed in order.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/model
mkdir -p "$W"
PY=${PYTHON:-python3}
TIER=${TEST_TIER:-full}
# reference: debug-state NAME DTYPE LR SHAPE... (the initial model in $W/NAME_model_DTYPE.bin, the state in $W/NAME_DTYPE.bin)
reference() {
    local name=$1 dtype=$2 lr=$3; shift 3
    if ! $PY scripts/reference/gpt2_reference.py debug-state --device cuda --steps 10 --seed 1337 --lr "$lr" --dtype "$dtype" \
        --batch-size 4 --seq-len 64 --model-out "$W/${name}_model_$dtype.bin" --state-out "$W/${name}_$dtype.bin" "$@" > "$W/${name}_$dtype.log" 2>&1; then
        echo "FAIL model reference $name $dtype: $(tail -n 1 "$W/${name}_$dtype.log")"
        return 1
    fi
}
SMALL="--layers 2 --heads 2 --channels 128 --max-seq-len 64"
D12="--layers 12 --heads 12 --channels 768 --max-seq-len 1024"
# compare NAME DTYPE: test_model on the reference's files (its lines; one FAIL line if it ends non-zero without one)
compare() {
    local out
    out=$(./build/test_model "$W/${1}_model_$2.bin" "$W/${1}_$2.bin" "$2" "$1-$2" 2>&1); local rc=$?
    printf '%s\n' "$out"
    [ $rc -eq 0 ] || printf '%s\n' "$out" | grep -q '^FAIL ' || echo "FAIL model $1-$2: test_model exited $rc: $(printf '%s\n' "$out" | tail -n 1)"
}
# job DTYPE: the small config's reference and test_model in DTYPE (and d12's in the full tier); its files carry DTYPE.
# d12 uses lr 3e-5: at 1e-4 it memorises the 256-token batch (loss 10.9 -> 3.4 in 10 steps, ~0.7 per step),
# and there the bf16 rounding differences between us and autocast grow chaotically beyond any fixed bound.
# llama_reference NAME DTYPE LR SHAPE...: as reference, for a Llama-family model (scripts/reference/llama_reference.py)
llama_reference() {
    local name=$1 dtype=$2 lr=$3; shift 3
    if ! $PY scripts/reference/llama_reference.py --device cuda --steps 10 --seed 1337 --lr "$lr" --dtype "$dtype" --init-perturb 0.1 \
        --batch-size 4 --seq-len 64 --model-out "$W/${name}_model_$dtype.bin" --state-out "$W/${name}_$dtype.bin" "$@" > "$W/${name}_$dtype.log" 2>&1; then
        echo "FAIL model reference $name $dtype: $(tail -n 1 "$W/${name}_$dtype.log")"
        return 1
    fi
}
# Llama family: head size 64 with one key/value head for two query heads, an untied head and Llama 3's rope scaling;
# in the full tier also head size 128 with 2 key/value heads of 4, Qwen's q/k/v biases and a tied head
LLAMA_GQA="--layers 2 --channels 128 --heads 2 --kv-heads 1 --ffn 352 --max-seq-len 64 --tied-head 0 --rope-scaling 8/1/4/32"
LLAMA_QWEN="--layers 2 --channels 512 --heads 4 --kv-heads 2 --ffn 1024 --max-seq-len 64 --qkv-bias 1 --rope-theta 1000000 --norm-eps 1e-6"
job() {
    local dtype=$1
    reference small $dtype 1e-4 $SMALL && compare small $dtype
    llama_reference llama_gqa $dtype 1e-4 $LLAMA_GQA && compare llama_gqa $dtype
    [ "$TIER" = full ] && reference d12 $dtype 3e-5 $D12 && compare d12 $dtype
    [ "$TIER" = full ] && llama_reference llama_qwen $dtype 1e-4 $LLAMA_QWEN && compare llama_qwen $dtype
    return 0
}
pids=()
for dtype in fp32 bf16 fp16; do job $dtype > "$W/job_$dtype.out" 2>&1 & pids+=($!); done
for i in 0 1 2; do wait "${pids[$i]}"; done
for dtype in fp32 bf16 fp16; do cat "$W/job_$dtype.out"; done

LORA="--lora-rank 4 --lora-alpha 8 --lora-targets qkv,attn-proj,fc,fc-proj --lora-init-b-std 0.02"
for dtype in $([ "$TIER" = full ] && echo fp32 bf16); do
    if $PY scripts/reference/gpt2_reference.py debug-state --device cuda --steps 10 --seed 1337 --lr 1e-3 --dtype $dtype \
        --batch-size 4 --seq-len 64 $SMALL $LORA --lora-out "$W/adapters.bin" \
        --model-out "$W/lora_base.bin" --state-out "$W/lora_$dtype.bin" > "$W/lora_$dtype.log" 2>&1; then
        ./build/test_model "$W/lora_base.bin" "$W/lora_$dtype.bin" $dtype "lora-small-$dtype" "$W/adapters.bin"
    else
        echo "FAIL model reference lora $dtype: $(tail -n 1 "$W/lora_$dtype.log")"
    fi
done
