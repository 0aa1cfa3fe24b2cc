#!/usr/bin/env bash
# GPT-2 training throughput on the GPU machine: train_gpt against the strongest plain PyTorch, in one call on
# one GPU, T=1024, bf16, the same random-token shard.
# PyTorch side: bench/bench_pytorch_gpt2.py, a nanoGPT-style model (nn.Linear, nn.LayerNorm,
# F.scaled_dot_product_attention(is_causal=True), F.cross_entropy on the bf16-autocast logits, fused AdamW,
# gradient clipping, torch.compile), timed with the flash and the cuDNN SDPA backends one after the other in one
# process; the faster is the baseline. (scripts/reference/gpt2_reference.py is the tests' correctness reference, not the
# baseline: its compiled path is slower.)
# Both sides: tokens/s of the median of STEPS timed steps after the warm-up (train_gpt: its first 3 steps;
# PyTorch: TORCH_WARMUP steps, the first of which compiles), and peak memory (train_gpt: device memory it
# allocated; PyTorch: torch.cuda.max_memory_allocated, and max_memory_reserved, the allocator's pool).
#
# Usage: bench/bench_gpt2.sh [CONFIG...]
#   MODEL-B         train_gpt and PyTorch; MODEL 124M | 350M | 774M | 1.5B (or d12 | d24 | d36 | d48), B rows
#                   of 1024 tokens, e.g. 124M-64
#   recompute[-B]   train_gpt alone at 124M, --recompute 0-3 (speed against activation memory); B default 64
#   deterministic[-B]  train_gpt --deterministic 1 at 124M (ratio against 124M-B's PyTorch if that ran before)
#   fp8-MODEL-B     train_gpt alone, --precision fp8 against bf16 (tokens/s, MFU against the bf16 peak, memory, fp8 / bf16),
#                   bf16 once, then fp8 with each --fp8-scaling of FP8_SCALING (default "current delayed");
#                   MODEL also 6.6B (32 layers, C=4096, 32 heads; --recompute 3, as its resident states take 106 GB),
#                   e.g. "fp8-124M-64 fp8-1.5B-8 fp8-6.6B-4" in one call
#   default: 124M-64 124M-8 350M-16 1.5B-8 (the sizes of the speed targets against PyTorch; mostly torch.compile
#   time: if one call runs too long, split it, e.g. "124M-64 124M-8" then "350M-16 1.5B-8")
#   old form: bench/bench_gpt2.sh STEPS [B...] = STEPS=STEPS bench/bench_gpt2.sh 124M-B... recompute-B1
#   deterministic-B1 (B default 64 32, B1 the first)
# Environment: STEPS (timed steps, default 30), TORCH_WARMUP (default 5), BACKENDS (both | flash | cudnn),
#   COMPILE_MODE (space-separated torch.compile modes, each timed, the fastest taken; default "default
#   reduce-overhead"; under reduce-overhead, whose replayed CUDA graphs dispatch no operator, the SDPA operator
#   is checked on the first step, before the graphs are recorded), OURS_FLAGS (extra train_gpt flags), NO_TORCH=1
#   (train_gpt only), PYTHON (default python3), FP8_SCALING (the fp8 configurations' --fp8-scaling values, each run
#   against the one bf16 run; default "current delayed"). Logs: build/bench/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ -n "${SIZES:-}" ]; then
    echo "bench_gpt2.sh: SIZES is gone; name the configurations instead, e.g. bench/bench_gpt2.sh 350M-16 1.5B-8" >&2
    exit 2
fi
STEPS=${STEPS:-30}
CONFIGS=("$@")
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then  # old form: STEPS [B...]
    STEPS=$1; shift
    batches=("$@"); [ ${#batches[@]} -gt 0 ] || batches=(64 32)
    CONFIGS=()
    for b in "${batches[@]}"; do CONFIGS+=("124M-$b"); done
    CONFIGS+=("recompute-${batches[0]}" "deterministic-${batches[0]}")
fi
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(124M-64 124M-8 350M-16 1.5B-8)
TORCH_WARMUP=${TORCH_WARMUP:-5}
BACKENDS=${BACKENDS:-both}
# reduce-overhead (CUDA graphs) is PyTorch's fastest at small batches, where launches dominate (124M B=8: 455k
# against 421k tok/s by default, one H200); at large batches the modes are within noise
COMPILE_MODE=${COMPILE_MODE:-default reduce-overhead}
read -r -a EXTRA <<< "${OURS_FLAGS:-}"
PY=${PYTHON:-python3}
T=1024
W=build/bench; mkdir -p "$W"

size_of() {  # MODEL -> dN, or nothing
    case $1 in 124M|d12) echo d12 ;; 350M|d24) echo d24 ;; 774M|d36) echo d36 ;; 1.5B|d48) echo d48 ;; esac
}
label_of() { case $1 in d12) echo 124M ;; d24) echo 350M ;; d36) echo 774M ;; d48) echo 1.5B ;; esac; }
# checks every configuration before anything runs
for c in "${CONFIGS[@]}"; do
    case $c in
        recompute|deterministic|recompute-[0-9]*|deterministic-[0-9]*) ;;
        fp8-6.6B-[0-9]*) [[ ${c##*-} =~ ^[1-9][0-9]*$ ]] || { echo "bench_gpt2.sh: unknown configuration '$c' (fp8-MODEL-B)" >&2; exit 2; } ;;
        fp8-*-[0-9]*) m=${c#fp8-}; [ -n "$(size_of "${m%-*}")" ] && [[ ${c##*-} =~ ^[1-9][0-9]*$ ]] \
                          || { echo "bench_gpt2.sh: unknown configuration '$c' (fp8-MODEL-B, e.g. fp8-124M-64)" >&2; exit 2; } ;;
        *-[0-9]*) [ -n "$(size_of "${c%-*}")" ] && [[ ${c##*-} =~ ^[1-9][0-9]*$ ]] \
                      || { echo "bench_gpt2.sh: unknown configuration '$c' (MODEL-B, e.g. 124M-64)" >&2; exit 2; } ;;
        *) echo "bench_gpt2.sh: unknown configuration '$c' (MODEL-B, recompute[-B], deterministic[-B], fp8-MODEL-B)" >&2; exit 2 ;;
    esac
done
for scaling in ${FP8_SCALING:-current delayed}; do
    case $scaling in current|delayed) ;; *) echo "bench_gpt2.sh: FP8_SCALING takes current and delayed, got '$scaling'" >&2; exit 2 ;; esac
done

make -s -j"$(nproc)" train_gpt || exit 1
[ -f "$W/random.bin" ] || $PY scripts/reference/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 8000000 > /dev/null || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
source bench/bench_util.sh  # kv, ratio_of
failed=0
SUMMARY=()
torch_version=""
declare -A TORCH_BEST

# ours LOG dN B [flags...]: train_gpt with the old script's flags; prints its row, leaves its RESULT line in OURS
ours() {
    local log=$1 size=$2 B=$3; shift 3
    local t0=$SECONDS
    OURS=""
    if ./train_gpt --model "$size" --train-data "$W/random.bin" --val-every 0 --sample-every 0 --batch-size "$B" \
        --seq-len $T --steps $((STEPS + 3)) --precision bf16 --lr 6e-4 "${EXTRA[@]}" "$@" > "$log" 2>&1 \
        && OURS=$(grep '^RESULT' "$log" | head -n 1) && [ -n "$OURS" ]; then
        printf '  %-28s %12s tok/s %9s ms %8s GiB   (%ds)\n' "train_gpt $*" "$(kv "$OURS" tokens_per_s)" \
            "$(kv "$OURS" ms_per_step)" "$(kv "$OURS" peak_mem_gib)" $((SECONDS - t0))
    else
        echo "  train_gpt failed ($log):"; tail -n 5 "$log" | sed 's/^/    /'; failed=1; OURS=""
    fi
}

for c in "${CONFIGS[@]}"; do
    case $c in
    recompute*)
        B=${c#recompute}; B=${B#-}; B=${B:-64}
        printf '\n== 124M B=%s T=%s: train_gpt --recompute levels (speed against activation memory) ==\n' "$B" $T
        for r in 0 1 2 3; do
            ours "$W/ours_d12_b${B}_r$r.log" d12 "$B" --recompute $r
            [ -n "$OURS" ] && SUMMARY+=("$(printf '%-16s %12s %12s %-22s %6s %9s %s' "124M-$B r$r" "$(kv "$OURS" tokens_per_s)" - - - \
                "$(kv "$OURS" peak_mem_gib)" -)")
        done ;;
    deterministic*)
        B=${c#deterministic}; B=${B#-}; B=${B:-64}
        printf '\n== 124M B=%s T=%s: train_gpt --deterministic 1 (bitwise reproducible: fixed-order dQ sums, first heuristic products) ==\n' "$B" $T
        ours "$W/ours_d12_b${B}_deterministic.log" d12 "$B" --deterministic 1
        if [ -n "$OURS" ]; then
            ref=${TORCH_BEST[124M-$B]:-}
            ratio=-; tb=-; tback=-; tpeak=-
            if [ -n "$ref" ]; then
                tb=$(kv "$ref" tokens_per_s); tback=$(kv "$ref" backend); tpeak=$(kv "$ref" peak_mem_gib)/$(kv "$ref" peak_reserved_gib)
                ratio=$(ratio_of "$(kv "$OURS" tokens_per_s)" "$tb")
                echo "  ratio train_gpt --deterministic 1 / PyTorch ($tback, from 124M-$B above): $ratio"
            fi
            SUMMARY+=("$(printf '%-16s %12s %12s %-22s %6s %9s %s' "124M-$B det" "$(kv "$OURS" tokens_per_s)" "$tb" "$tback" "$ratio" \
                "$(kv "$OURS" peak_mem_gib)" "$tpeak")")
        fi ;;
    fp8-*)
        m=${c#fp8-}; model=${m%-*}; B=${c##*-}
        if [ "$model" = 6.6B ]; then size=d32; label=6.6B; shape=(--layers 32 --channels 4096 --heads 32 --recompute 3)
        else size=$(size_of "$model"); label=$(label_of "$size"); shape=(); fi
        printf '\n== GPT-%s B=%s T=%s: train_gpt --precision fp8 against bf16 ==\n' "$label" "$B" $T
        ours "$W/ours_${label}_b${B}_bf16.log" "$size" "$B" "${shape[@]}" --precision bf16
        bf16_line=$OURS
        for scaling in ${FP8_SCALING:-current delayed}; do
            ours "$W/ours_${label}_b${B}_fp8_$scaling.log" "$size" "$B" "${shape[@]}" --precision fp8 --fp8-scaling "$scaling"
            if [ -n "$OURS" ] && [ -n "$bf16_line" ]; then
                ratio=$(ratio_of "$(kv "$OURS" tokens_per_s)" "$(kv "$bf16_line" tokens_per_s)")
                echo "  ratio fp8 ($scaling scaling) / bf16: $ratio (MFU against the bf16 peak: fp8 $(kv "$OURS" mfu)%, bf16 $(kv "$bf16_line" mfu)%)"
                SUMMARY+=("$(printf '%-16s %12s %12s %-22s %6s %9s %s' "$label-$B fp8 ${scaling:0:3}" "$(kv "$OURS" tokens_per_s)" \
                    "$(kv "$bf16_line" tokens_per_s)" "train_gpt bf16" "$ratio" "$(kv "$OURS" peak_mem_gib)" "$(kv "$bf16_line" peak_mem_gib) (bf16)")")
            fi
        done ;;
    *)
        model=${c%-*}; B=${c##*-}; size=$(size_of "$model"); label=$(label_of "$size")
        printf '\n== GPT-2 %s (%s) B=%s T=%s bf16 ==\n' "$label" "$size" "$B" $T
        ours "$W/ours_${size}_b$B.log" "$size" "$B"
        ours_line=$OURS
        [ "${NO_TORCH:-0}" = 1 ] && { SUMMARY+=("$(printf '%-16s %12s %12s %-22s %6s %9s %s' "$label-$B" \
            "$(kv "$ours_line" tokens_per_s)" - - - "$(kv "$ours_line" peak_mem_gib)" -)"); continue; }
        # every compile mode in COMPILE_MODE, each with both SDPA backends; the fastest of all is the baseline
        best=""; best_mode=""; t0=$SECONDS
        for mode in $COMPILE_MODE; do
            log="$W/torch_${size}_b${B}_$mode.log"
            $PY bench/bench_pytorch_gpt2.py --model "$size" --batch-size "$B" --seq-len $T --steps "$STEPS" \
                --warmup "$TORCH_WARMUP" --backend "$BACKENDS" --compile-mode "$mode" --train-data "$W/random.bin" \
                > "$log" 2>&1
            grep -E '^backend .*(unavailable|failed|WARNING)|^WARNING|^using ' "$log" | sed "s/^/  PyTorch $mode: /"
            while read -r line; do
                printf '  %-40s %12s tok/s %9s ms %8s GiB (reserved %s; ran its SDPA operator: %s; compile %s s)\n' \
                    "PyTorch $mode $(kv "$line" backend)" "$(kv "$line" tokens_per_s)" "$(kv "$line" ms_per_step)" \
                    "$(kv "$line" peak_mem_gib)" "$(kv "$line" peak_reserved_gib)" "$(kv "$line" verified)" "$(kv "$line" compile_s)"
            done < <(grep '^RESULT' "$log")
            candidate=$(grep '^BEST' "$log" | head -n 1)
            if [ -n "$candidate" ] && { [ -z "$best" ] || awk -v a="$(kv "$candidate" tokens_per_s)" -v b="$(kv "$best" tokens_per_s)" 'BEGIN { exit !(a > b) }'; }; then
                best=$candidate; best_mode=$mode
            fi
        done
        if [ -z "$best" ]; then
            echo "  PyTorch failed ($log):"; tail -n 5 "$log" | sed 's/^/    /'; failed=1
            [ -n "$ours_line" ] && SUMMARY+=("$(printf '%-16s %12s %12s %-22s %6s %9s %s' "$label-$B" \
                "$(kv "$ours_line" tokens_per_s)" failed - - "$(kv "$ours_line" peak_mem_gib)" -)")
            continue
        fi
        echo "  (PyTorch process: $((SECONDS - t0)) s, compile included)"
        torch_version=$(grep -o -m 1 'torch [0-9][^,]*' "$log" | head -n 1)
        TORCH_BEST[$label-$B]=$best
        [ -n "$ours_line" ] || continue
        ratio=$(ratio_of "$(kv "$ours_line" tokens_per_s)" "$(kv "$best" tokens_per_s)")
        echo "  ratio train_gpt / PyTorch ($best_mode, $(kv "$best" backend): the fastest): $ratio"
        SUMMARY+=("$(printf '%-16s %12s %12s %-22s %6s %9s %s' "$label-$B" "$(kv "$ours_line" tokens_per_s)" \
            "$(kv "$best" tokens_per_s)" "$best_mode/$(kv "$best" backend)" "$ratio" "$(kv "$ours_line" peak_mem_gib)" \
            "$(kv "$best" peak_mem_gib)/$(kv "$best" peak_reserved_gib)")")
        ;;
    esac
done

printf '\n%s, T=%s, bf16, median of %s timed steps; PyTorch: %s, torch.compile modes (%s) x SDPA %s (the fastest taken)\n' \
    "${gpu:-GPU ?}" $T "$STEPS" "${torch_version:-torch ?}" "$COMPILE_MODE" "$BACKENDS"
printf '%-16s %12s %12s %-22s %6s %9s %s\n' config "ours tok/s" "torch tok/s" "mode/backend" ratio "ours GiB" "torch GiB alloc/reserved"
for row in "${SUMMARY[@]}"; do printf '%s\n' "$row"; done
exit $failed
