#!/usr/bin/env bash
# QLoRA (--base-quant nf4) on the GPU machine, one call on one GPU: speed and peak memory against our own bf16 LoRA and
# PEFT's, the 70B shape, the 4-bit products, and the loss against a bf16 base.
#
# Usage: bench/bench_qlora.sh [CONFIG...]
#   8b       llama3-8b, T = SEQ_LEN (2048), B = 1, LoRA rank 16 on q, k, v, o, gate, up, down (random tokens):
#            train_gpt --base-quant nf4, train_gpt with the bf16 base, and PEFT's bf16 LoRA on transformers'
#            LlamaForCausalLM (bench/bench_peft_lora.py: SDPA, gradient checkpointing). Targets: NF4 peak GPU memory
#            <= 10 GiB, NF4 tokens/s >= 0.75 x our bf16 LoRA and >= 1.5 x PEFT's.
#   70b      the 70B shape (80 layers, C = 8192, 64 query and 8 KV heads, FFN 28672, vocabulary 128,256) with the NF4
#            base, T = SEQ_LEN, B = 1: tokens/s, MFU, peak GPU memory (target: it trains on one 80 GB GPU).
#   kernels  build/bench_nf4: the fused 4-bit products against dequantization + cuBLASLt and against bf16.
#   loss     a small Llama-family model (--model d6 --arch llama) pre-trained PRE_STEPS steps on tinyshakespeare, then
#            LORA_STEPS (200) steps of LoRA from it twice, with the bf16 base and the NF4 base (same seed, data,
#            --deterministic 1): the mean loss of the last 20 steps of each, their relative difference (target <= 2%),
#            and the two step logs plotted (scripts/reference/plot_losses.py) as build/bench_qlora/qlora_loss.svg.
#   default: 8b 70b kernels loss
# Environment: STEPS (timed steps, default 10; the first 3 of train_gpt's are its warm-up), STEPS_70B (default 3),
#   RECOMPUTE (train_gpt's --recompute for 8b and 70b, default 3), PEFT_WARMUP (default 3), PRE_STEPS (default 300),
#   LORA_STEPS (default 200), NO_TORCH=1 (no PEFT run), PYTHON (default python3). Logs: build/bench_qlora/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
STEPS=${STEPS:-10}
STEPS_70B=${STEPS_70B:-3}
RECOMPUTE=${RECOMPUTE:-3}
PEFT_WARMUP=${PEFT_WARMUP:-3}
PRE_STEPS=${PRE_STEPS:-300}
LORA_STEPS=${LORA_STEPS:-200}
T=${SEQ_LEN:-2048}
PY=${PYTHON:-python3}
W=build/bench_qlora; mkdir -p "$W"
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(8b 70b kernels loss)
for c in "${CONFIGS[@]}"; do
    case $c in 8b|70b|kernels|loss) ;; *) echo "bench_qlora.sh: unknown configuration '$c' (8b, 70b, kernels, loss)" >&2; exit 2 ;; esac
done
for v in STEPS STEPS_70B PEFT_WARMUP PRE_STEPS LORA_STEPS T; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench_qlora.sh: $v must be a positive integer, not '${!v}'" >&2; exit 2; }
done
[ "$LORA_STEPS" -ge 20 ] || { echo "bench_qlora.sh: LORA_STEPS must be at least 20 (the mean of the last 20 steps)" >&2; exit 2; }

make -s -j"$(nproc)" train_gpt build/prepare_shards build/bench_nf4 || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
source bench/bench_util.sh  # kv, ratio_of
failed=0
SUMMARY=()
LORA=(--lora-rank 16 --lora-alpha 32 --lora-targets q,k,v,o,gate,up,down)
# ours LOG FLAGS...: train_gpt; its RESULT line in OURS (empty when it failed)
ours() {
    local log=$1; shift
    local t0=$SECONDS
    OURS=""
    if ./train_gpt --val-every 0 --sample-every 0 --precision bf16 --lr 2e-4 "$@" > "$log" 2>&1 \
        && OURS=$(grep '^RESULT' "$log" | head -n 1) && [ -n "$OURS" ]; then
        printf '  %-34s %10s tok/s %10s ms %6s%% MFU %8s GiB   (%ds)\n' "$(basename "$log" .log)" "$(kv "$OURS" tokens_per_s)" \
            "$(kv "$OURS" ms_per_step)" "$(kv "$OURS" mfu)" "$(kv "$OURS" peak_mem_gib)" $((SECONDS - t0))
        grep -m1 -E '^memory plan per GPU' "$log" | sed 's/^/    /'
        grep -m1 -E '^base in NF4' "$log" | sed 's/^/    /'
    else
        local why; why=$(grep -m1 -E '^error|out of memory' "$log")
        echo "  train_gpt failed ($log):"; { if [ -n "$why" ]; then echo "$why"; else tail -n 3 "$log"; fi; } | sed 's/^/    /'
        OURS=""
    fi
}
data=""
random_shard() {  # a random-token shard of Llama 3's vocabulary
    data="$W/random_v128256.bin"
    [ -f "$data" ] || $PY bench/bench_pytorch_llama.py --write-shard "$data" --vocab 128256 --tokens 4000000 > /dev/null
}
# last_mean LOG N: the mean loss of the last N step lines of a train_gpt log.txt
last_mean() { grep -v '^#' "$1" | tail -n "$2" | awk '{ s += $2; n++ } END { if (n) printf "%.4f", s / n }'; }

for c in "${CONFIGS[@]}"; do
    case $c in
    8b)
        printf '\n== llama3-8b T=%s B=1, LoRA rank 16 on every linear layer, --recompute %s ==\n' "$T" "$RECOMPUTE"
        random_shard || { echo "  cannot write the token shard"; failed=1; continue; }
        shape=(--model llama3-8b --train-data "$data" --batch-size 1 --seq-len "$T" --recompute "$RECOMPUTE" --steps $((STEPS + 3)) "${LORA[@]}")
        ours "$W/ours_nf4_8b.log" "${shape[@]}" --base-quant nf4; nf4=$OURS
        ours "$W/ours_bf16_8b.log" "${shape[@]}"; bf16=$OURS
        [ -n "$nf4" ] && [ -n "$bf16" ] || failed=1
        peft=""
        if [ "${NO_TORCH:-0}" != 1 ]; then
            log="$W/peft_8b.log"
            if $PY bench/bench_peft_lora.py --model llama3-8b -b 1 -t "$T" --rank 16 --steps "$STEPS" --warmup "$PEFT_WARMUP" > "$log" 2>&1 \
                && peft=$(grep -m1 '^RESULT' "$log") && [ -n "$peft" ]; then
                head -n 1 "$log" | sed 's/^/  PEFT: /'
                printf '  %-34s %10s tok/s %10s ms %6s     %8s GiB (reserved %s)\n' "PEFT bf16 LoRA" "$(kv "$peft" tokens_per_s)" \
                    "$(kv "$peft" ms_per_step)" "" "$(kv "$peft" peak_mem_gib)" "$(kv "$peft" peak_reserved_gib)"
            else
                echo "  PEFT failed ($log):"; tail -n 3 "$log" | sed 's/^/    /'; failed=1; peft=""
            fi
        fi
        n=$(kv "$nf4" tokens_per_s)
        SUMMARY+=("$(printf '8b  NF4 %s tok/s (MFU %s%%), peak %s GiB (target <= 10); / our bf16 LoRA %s: %s (target >= 0.75); / PEFT %s: %s (target >= 1.5)' \
            "${n:--}" "$(kv "$nf4" mfu)" "$(kv "$nf4" peak_mem_gib)" "$(kv "$bf16" tokens_per_s)" "$(ratio_of "$n" "$(kv "$bf16" tokens_per_s)")" \
            "$(kv "$peft" tokens_per_s)" "$(ratio_of "$n" "$(kv "$peft" tokens_per_s)")")")
        ;;
    70b)
        printf '\n== 70B shape T=%s B=1, NF4 base, LoRA rank 16 on every linear layer, --recompute %s ==\n' "$T" "$RECOMPUTE"
        random_shard || { echo "  cannot write the token shard"; failed=1; continue; }
        ours "$W/ours_nf4_70b.log" --model llama3-8b --layers 80 --channels 8192 --heads 64 --kv-heads 8 --ffn 28672 \
            --train-data "$data" --batch-size 1 --seq-len "$T" --recompute "$RECOMPUTE" --steps $((STEPS_70B + 3)) "${LORA[@]}" --base-quant nf4
        [ -n "$OURS" ] || failed=1
        SUMMARY+=("$(printf '70b NF4 %s tok/s (MFU %s%%), peak %s GiB' "$(kv "$OURS" tokens_per_s)" "$(kv "$OURS" mfu)" "$(kv "$OURS" peak_mem_gib)")")
        ;;
    kernels)
        printf '\n== the 4-bit products (build/bench_nf4) ==\n'
        build/bench_nf4 | tee "$W/bench_nf4.log" || failed=1
        ;;
    loss)
        printf '\n== loss: %s LoRA steps from a d6 Llama pre-trained %s steps, bf16 base against NF4 base ==\n' "$LORA_STEPS" "$PRE_STEPS"
        ls data/tinyshakespeare/tinyshakespeare_train_*.bin > /dev/null 2>&1 || bash scripts/data/prepare_tinyshakespeare.sh > /dev/null || { failed=1; continue; }
        run=(--train-data "data/tinyshakespeare/tinyshakespeare_train_*.bin" --val-data "data/tinyshakespeare/tinyshakespeare_val_*.bin"
             --batch-size 16 --seq-len 512 --sample-every 0 --deterministic 1 --seed 1337)
        rm -rf "$W/base" "$W/lora_bf16" "$W/lora_nf4"
        if ! ./train_gpt --model d6 --arch llama "${run[@]}" --steps "$PRE_STEPS" --lr 1e-3 --warmup-steps 50 --val-every 0 \
            --checkpoint-every "$PRE_STEPS" -o "$W/base" > "$W/base.log" 2>&1; then
            echo "  pre-training failed ($W/base.log): $(tail -n 1 "$W/base.log")"; failed=1; continue
        fi
        base=$(printf '%s/base/model_%08d.bin' "$W" "$PRE_STEPS")
        echo "  base: $base, last loss $(last_mean "$W/base/log.txt" 1)"
        for q in bf16 nf4; do
            extra=(); [ $q = nf4 ] && extra=(--base-quant nf4)
            ./train_gpt --model "$base" "${run[@]}" "${LORA[@]}" "${extra[@]}" --steps "$LORA_STEPS" --lr 1e-3 --warmup-steps 10 \
                --val-every "$LORA_STEPS" --val-batches 8 -o "$W/lora_$q" > "$W/lora_$q.log" 2>&1 \
                || { echo "  LoRA with the $q base failed ($W/lora_$q.log): $(tail -n 1 "$W/lora_$q.log")"; failed=1; }
        done
        b=$(last_mean "$W/lora_bf16/log.txt" 20); n=$(last_mean "$W/lora_nf4/log.txt" 20)
        rel=$(awk -v a="$n" -v b="$b" 'BEGIN { if (b > 0) printf "%.2f", 100 * (a - b) / b; else printf "-" }')
        echo "  mean loss of the last 20 steps: bf16 base $b, NF4 base $n: ${rel}% (target within 2%)"
        grep -h 'val loss' "$W/lora_bf16.log" "$W/lora_nf4.log" | tail -n 2 | sed 's/^/  /'
        $PY scripts/reference/plot_losses.py --out "$W/qlora_loss.svg" --window 10 "$W/lora_bf16/log.txt" "$W/lora_nf4/log.txt" \
            --labels "bf16 base" "NF4 base" | sed 's/^/  /'
        SUMMARY+=("loss last-20 mean: bf16 base $b, NF4 base $n (${rel}%, target within 2%); plot $W/qlora_loss.svg")
        ;;
    esac
done

printf '\n%s, %s; T=%s\n' "$gpu" "$(date -u +%Y-%m-%d)" "$T"
for r in "${SUMMARY[@]}"; do printf '%s\n' "$r"; done
exit $failed
