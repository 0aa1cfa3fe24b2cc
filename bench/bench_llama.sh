#!/usr/bin/env bash
# Llama-family training throughput on the GPU machine: train_gpt against the strongest plain PyTorch, in one call on one
# GPU, T=2048 (SEQ_LEN), bf16, the same batch, sequence and vocabulary on both sides, random tokens.
# PyTorch side: bench/bench_pytorch_llama.py, a self-contained Llama (F.rms_norm, rotary positions, SwiGLU, SDPA with
# grouped-query attention by enable_gqa or repeat_interleave, whichever each SDPA backend runs, fused AdamW, gradient
# clipping, bf16 autocast over fp32 parameters), each block compiled (TorchTitan's way); every compile mode of
# COMPILE_MODE x every SDPA backend of BACKENDS timed in one process, the fastest the baseline. For llama3-8b, which
# does not fit an 80 GB GPU resident: PyTorch FSDP2 (fully_shard) on one rank with CPUOffloadPolicy (parameters,
# gradients and AdamW on the host, bf16 parameters: fp32 ones would need 128 GB of host memory), against train_gpt
# --offload optimizer (recompute only if that does not fit).
# Both sides: tokens/s of the median timed step after the warm-up (train_gpt: its first 3 steps; PyTorch: TORCH_WARMUP
# steps, the first compiles), MFU against the GPU's dense bf16 peak with train_gpt's FLOP count (6 x the parameters that
# multiply + 12 L C T a token), peak GPU memory. The GPT-2 124M B=64 comparison (bench/bench_gpt2.sh 124M-64) runs in the
# same call, for no regression. One table at the end: tokens/s, MFU, ratio and target per configuration.
#
# Usage: bench/bench_llama.sh [CONFIG...]
#   llama3-1b[-B]      B rows of SEQ_LEN tokens a step (default 8); target 1.2
#   smollm2-135m[-B]   (default B 32); target 1.15
#   llama3-8b[-B]      B rows a micro-batch for train_gpt (default 4), steps of TOKENS_8B tokens (default 65,536);
#                      PyTorch FSDP2 + CPU offload with FSDP_ROWS rows a micro-batch (default 4); target 1.5
#   gpt2               bench/bench_gpt2.sh 124M-64 (BACKENDS=GPT2_BACKENDS, default cudnn, and COMPILE_MODE=
#                      GPT2_COMPILE_MODE, default "default": PyTorch's fastest at 124M B=64 in docs/perf.md); target 1.15
#   default: gpt2 llama3-1b smollm2-135m llama3-8b
# Environment: STEPS (timed steps, default 10), TORCH_WARMUP (default 4), BACKENDS (both | flash | cudnn),
#   COMPILE_MODE (default "default reduce-overhead"), COMPILE_SCOPE (blocks | model: torch.compile(model) instead of each
#   block; slower to compile), TORCH_DTYPE (autocast | bf16: bf16 parameters and AdamW state), SEQ_LEN (default 2048),
#   STEPS_8B (timed steps of llama3-8b, default 2; PyTorch's after 1 warm-up step), TOKENS_8B, FSDP_ROWS, FSDP_COMPILE
#   (default | none; eager is retried when the compiled FSDP run gives no result), FSDP_DTYPE (bf16 | fp32), FSDP_BACKEND
#   (the FSDP run's SDPA backend: cudnn, default, flash where cuDNN cannot run; or flash),
#   OURS_8B_FLAGS (default "--offload optimizer"; "--recompute 2" is added and the run retried if it gives no result),
#   GPU_MEMORY_GIB (llama3-8b: bench/hold_gpu_memory.py holds all but this many GiB of GPU 0 for both sides, e.g. 79.1 on
#   an H200 for an H100 80GB's memory), GPT2_STEPS (default 20), OURS_FLAGS (extra train_gpt flags), NO_TORCH=1
#   (train_gpt only), PYTHON (default python3). Logs: build/bench_llama/ (gpt2: build/bench/).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
STEPS=${STEPS:-10}
TORCH_WARMUP=${TORCH_WARMUP:-4}
BACKENDS=${BACKENDS:-both}
COMPILE_MODE=${COMPILE_MODE:-default reduce-overhead}
COMPILE_SCOPE=${COMPILE_SCOPE:-blocks}
TORCH_DTYPE=${TORCH_DTYPE:-autocast}
T=${SEQ_LEN:-2048}
STEPS_8B=${STEPS_8B:-2}
TOKENS_8B=${TOKENS_8B:-65536}
FSDP_ROWS=${FSDP_ROWS:-4}
FSDP_COMPILE=${FSDP_COMPILE:-default}
FSDP_DTYPE=${FSDP_DTYPE:-bf16}
FSDP_BACKEND=${FSDP_BACKEND:-cudnn}
OURS_8B_FLAGS=${OURS_8B_FLAGS:---offload optimizer}
read -r -a EXTRA <<< "${OURS_FLAGS:-}"
PY=${PYTHON:-python3}
W=build/bench_llama; mkdir -p "$W"
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(gpt2 llama3-1b smollm2-135m llama3-8b)

# model_of CONFIG / rows_of CONFIG: the preset and the rows (B) of a configuration
model_of() { case $1 in gpt2) echo gpt2 ;; llama3-1b*) echo llama3-1b ;; smollm2-135m*) echo smollm2-135m ;; llama3-8b*) echo llama3-8b ;; esac; }
rows_of() {
    local m; m=$(model_of "$1")
    if [ "$1" = "$m" ]; then case $m in llama3-1b) echo 8 ;; smollm2-135m) echo 32 ;; llama3-8b) echo 4 ;; esac
    else echo "${1#"$m"-}"; fi
}
vocab_of() { case $1 in smollm2-135m) echo 49152 ;; *) echo 128256 ;; esac; }
target_of() { case $1 in gpt2) echo 1.15 ;; llama3-1b) echo 1.2 ;; smollm2-135m) echo 1.15 ;; llama3-8b) echo 1.5 ;; esac; }
for c in "${CONFIGS[@]}"; do
    m=$(model_of "$c")
    { [ -n "$m" ] && { [ "$m" = gpt2 ] && [ "$c" = gpt2 ] || [[ $(rows_of "$c") =~ ^[1-9][0-9]*$ ]]; }; } \
        || { echo "bench_llama.sh: unknown configuration '$c' (gpt2, llama3-1b[-B], smollm2-135m[-B], llama3-8b[-B])" >&2; exit 2; }
done
[[ $TOKENS_8B =~ ^[1-9][0-9]*$ && $FSDP_ROWS =~ ^[1-9][0-9]*$ ]] || { echo "bench_llama.sh: TOKENS_8B and FSDP_ROWS must be positive integers" >&2; exit 2; }
case $COMPILE_SCOPE in blocks|model) ;; *) echo "bench_llama.sh: COMPILE_SCOPE takes blocks or model" >&2; exit 2 ;; esac

make -s -j"$(nproc)" train_gpt || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
source bench/bench_util.sh  # kv, ratio_of
failed=0
SUMMARY=()
torch_version=""
# row CONFIG OURS_TOK OURS_MFU TORCH_TOK TORCH_MFU SETUP TARGET OURS_GIB TORCH_GIB
row() {
    local r; r=$(ratio_of "$2" "$4")
    SUMMARY+=("$(printf '%-18s %11s %6s %11s %6s %-34s %6s %6s %8s %s' "$1" "${2:--}" "${3:--}" "${4:--}" "${5:--}" "${6:--}" "$r" "$7" "${8:--}" "${9:--}")")
    [ "$r" != - ] && echo "  ratio train_gpt / PyTorch ($6): $r (target $7)"
}
shard_for() {  # shard_for VOCAB: a random-token shard of that vocabulary (uint32 tokens above 65,536)
    local path="$W/random_v$1.bin"
    [ -f "$path" ] || $PY bench/bench_pytorch_llama.py --write-shard "$path" --vocab "$1" --tokens 8000000 > /dev/null || return 1
    echo "$path"
}
# ours LOG [flags...]: train_gpt on its flags; prints its row and leaves its RESULT line in OURS
ours() {
    local log=$1; shift
    local t0=$SECONDS
    OURS=""
    if ./train_gpt --val-every 0 --sample-every 0 --precision bf16 --lr 3e-4 "$@" "${EXTRA[@]}" > "$log" 2>&1 \
        && OURS=$(grep '^RESULT' "$log" | head -n 1) && [ -n "$OURS" ]; then
        printf '  %-44s %12s tok/s %10s ms %6s%% MFU %8s GiB   (%ds)\n' "train_gpt" "$(kv "$OURS" tokens_per_s)" \
            "$(kv "$OURS" ms_per_step)" "$(kv "$OURS" mfu)" "$(kv "$OURS" peak_mem_gib)" $((SECONDS - t0))
        grep -m1 '^memory plan per GPU' "$log" | sed 's/^/  /'
        grep -m1 '^host memory per rank' "$log" | sed 's/^/  /'
    else
        local why; why=$(grep -m1 -E '^error|out of memory' "$log")
        echo "  train_gpt failed ($log):"; { if [ -n "$why" ]; then echo "$why"; else tail -n 3 "$log"; fi; } | sed 's/^/    /'
        OURS=""
    fi
}
hold_memory() {  # GPU_MEMORY_GIB: all but that many GiB of GPU 0 held while the 8B runs
    [ -n "${GPU_MEMORY_GIB:-}" ] || return 0
    $PY bench/hold_gpu_memory.py --leave-gib "$GPU_MEMORY_GIB" > "$W/hold_gpu_memory.log" 2>&1 &
    holder=$!
    until grep -q -e '^holding' -e 'error' "$W/hold_gpu_memory.log" 2>/dev/null; do kill -0 $holder 2>/dev/null || break; sleep 1; done
    grep -q '^holding' "$W/hold_gpu_memory.log" || { echo "  GPU_MEMORY_GIB: $(tail -n 1 "$W/hold_gpu_memory.log")"; return 1; }
    echo "  GPU made smaller: $(cat "$W/hold_gpu_memory.log")"
}
release_memory() { [ -n "${holder:-}" ] && kill "$holder" 2>/dev/null && wait "$holder" 2>/dev/null; holder=""; }
trap release_memory EXIT

for c in "${CONFIGS[@]}"; do
    m=$(model_of "$c")
    case $m in
    gpt2)
        printf '\n== GPT-2 124M B=64 T=1024 (bench/bench_gpt2.sh 124M-64, the no-regression check) ==\n'
        NO_TORCH=${NO_TORCH:-0} STEPS=${GPT2_STEPS:-20} BACKENDS=${GPT2_BACKENDS:-cudnn} COMPILE_MODE=${GPT2_COMPILE_MODE:-default} \
            PYTHON=$PY bench/bench_gpt2.sh 124M-64 > "$W/gpt2.log" 2>&1
        sed -n '/^== /,/^$/p' "$W/gpt2.log" | grep -v '^== \|^$\|^  ratio'
        line=$(awk '$1 == "124M-64"' "$W/gpt2.log" | tail -n 1)
        ours_line=$(grep -m1 '^RESULT' build/bench/ours_d12_b64.log 2>/dev/null)
        if [ -z "$line" ] || [ -z "$ours_line" ]; then
            echo "  bench_gpt2.sh gave no result ($W/gpt2.log):"; tail -n 5 "$W/gpt2.log" | sed 's/^/    /'; failed=1; continue
        fi
        read -r _ o_tok t_tok setup _ o_gib t_gib <<< "$line"
        o_mfu=$(kv "$ours_line" mfu)
        t_mfu=$(awk -v m="$o_mfu" -v a="$o_tok" -v b="$t_tok" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%.1f", m * b / a; else printf "-" }')
        [ -n "$torch_version" ] || [ "$t_tok" = - ] || torch_version=$(grep -h -o -m 1 'torch [0-9][^,]*' build/bench/torch_d12_b64_*.log 2>/dev/null | head -n 1)
        row "gpt2-124M-64" "$o_tok" "$o_mfu" "$t_tok" "$t_mfu" "T=1024 $setup" "$(target_of gpt2)" "$o_gib" "$t_gib"
        ;;
    llama3-1b|smollm2-135m)
        B=$(rows_of "$c"); V=$(vocab_of "$m")
        printf '\n== %s B=%s T=%s bf16 (vocabulary %s) ==\n' "$m" "$B" "$T" "$V"
        data=$(shard_for "$V") || { echo "  cannot write the token shard"; failed=1; continue; }
        ours "$W/ours_${m}_b$B.log" --model "$m" --train-data "$data" --batch-size "$B" --seq-len "$T" --steps $((STEPS + 3))
        ours_line=$OURS
        [ -n "$ours_line" ] || failed=1
        if [ "${NO_TORCH:-0}" = 1 ]; then
            row "$m-$B" "$(kv "$ours_line" tokens_per_s)" "$(kv "$ours_line" mfu)" - - - "$(target_of "$m")" "$(kv "$ours_line" peak_mem_gib)" -
            continue
        fi
        log="$W/torch_${m}_b$B.log"; t0=$SECONDS
        $PY bench/bench_pytorch_llama.py --model "$m" --batch-size "$B" --seq-len "$T" --steps "$STEPS" --warmup "$TORCH_WARMUP" \
            --backend "$BACKENDS" --compile-modes "$COMPILE_MODE" --compile-scope "$COMPILE_SCOPE" --dtype "$TORCH_DTYPE" \
            --train-data "$data" > "$log" 2>&1
        grep -E '^backend |WARNING|failed:' "$log" | sed 's/^/  PyTorch: /'
        while read -r line; do
            printf '  %-44s %12s tok/s %10s ms %6s%% MFU %8s GiB (reserved %s; its SDPA operator ran: %s; compile %s s)\n' \
                "PyTorch $(kv "$line" mode)/$(kv "$line" backend)/$(kv "$line" gqa)" "$(kv "$line" tokens_per_s)" \
                "$(kv "$line" ms_per_step)" "$(kv "$line" mfu)" "$(kv "$line" peak_mem_gib)" "$(kv "$line" peak_reserved_gib)" \
                "$(kv "$line" verified)" "$(kv "$line" compile_s)"
        done < <(grep '^RESULT' "$log")
        best=$(grep -m1 '^BEST' "$log")
        [ -n "$torch_version" ] || torch_version=$(grep -o -m 1 'torch [0-9][^,]*' "$log" | head -n 1)
        if [ -z "$best" ]; then
            echo "  PyTorch failed ($log):"; tail -n 5 "$log" | sed 's/^/    /'; failed=1
            row "$m-$B" "$(kv "$ours_line" tokens_per_s)" "$(kv "$ours_line" mfu)" failed - - "$(target_of "$m")" "$(kv "$ours_line" peak_mem_gib)" -
            continue
        fi
        echo "  (PyTorch process: $((SECONDS - t0)) s, compiles included)"
        row "$m-$B" "$(kv "$ours_line" tokens_per_s)" "$(kv "$ours_line" mfu)" "$(kv "$best" tokens_per_s)" "$(kv "$best" mfu)" \
            "$(kv "$best" mode)/$(kv "$best" backend)/$(kv "$best" gqa)" "$(target_of "$m")" "$(kv "$ours_line" peak_mem_gib)" \
            "$(kv "$best" peak_mem_gib)/$(kv "$best" peak_reserved_gib)"
        ;;
    llama3-8b)
        B=$(rows_of "$c"); V=$(vocab_of "$m")
        if [ $((TOKENS_8B % (B * T))) -ne 0 ] || [ $((TOKENS_8B % (FSDP_ROWS * T))) -ne 0 ]; then
            echo "bench_llama.sh: TOKENS_8B ($TOKENS_8B) must be a multiple of B x T ($((B * T))) and FSDP_ROWS x T ($((FSDP_ROWS * T)))" >&2
            failed=1; continue
        fi
        printf '\n== llama3-8b T=%s bf16, %s tokens a step, on one GPU that cannot hold it resident ==\n' "$T" "$TOKENS_8B"
        data=$(shard_for "$V") || { echo "  cannot write the token shard"; failed=1; continue; }
        hold_memory || { failed=1; continue; }
        shape=(--model llama3-8b --train-data "$data" --batch-size "$B" --seq-len "$T" --total-batch-tokens "$TOKENS_8B")
        resident=$(./train_gpt "${shape[@]}" --val-every 0 --sample-every 0 --steps 1 --dry-run 1 --dry-run-gpu-gib "${GPU_MEMORY_GIB:-79.1}" 2>&1 \
            | grep -E '^error: the plan needs|^memory plan per GPU' | tail -n 1 | cut -c1-150)
        echo "  resident (train_gpt --dry-run 1 at ${GPU_MEMORY_GIB:-79.1} GiB free): ${resident:-?}"
        read -r -a flags8 <<< "$OURS_8B_FLAGS"
        ours "$W/ours_${m}_b$B.log" "${shape[@]}" --steps $((STEPS_8B + 3)) "${flags8[@]}"
        if [ -z "$OURS" ]; then
            echo "  again with --recompute 2"
            flags8+=(--recompute 2)
            ours "$W/ours_${m}_b${B}_r2.log" "${shape[@]}" --steps $((STEPS_8B + 3)) "${flags8[@]}"
        fi
        ours_line=$OURS; ours_setup="${flags8[*]}"
        [ -n "$ours_line" ] || failed=1
        if [ "${NO_TORCH:-0}" = 1 ]; then
            release_memory
            row "$m-$B" "$(kv "$ours_line" tokens_per_s)" "$(kv "$ours_line" mfu)" - - - "$(target_of "$m")" "$(kv "$ours_line" peak_mem_gib)" -
            continue
        fi
        micro=$((TOKENS_8B / FSDP_ROWS / T)); t0=$SECONDS
        torch_line=""
        for compile in $FSDP_COMPILE $([ "$FSDP_COMPILE" != none ] && echo none); do
            log="$W/torch_${m}_fsdp_$compile.log"
            $PY bench/bench_pytorch_llama.py --mode fsdp --model "$m" --batch-size "$FSDP_ROWS" --microbatches "$micro" --seq-len "$T" \
                --steps "$STEPS_8B" --warmup 1 --backend "$FSDP_BACKEND" \
                --compile-mode "$compile" --fsdp-dtype "$FSDP_DTYPE" > "$log" 2>&1
            grep -E '^(PyTorch|SDPA|fused|steps)' "$log" | sed 's/^/  /'
            torch_line=$(grep -m1 '^RESULT' "$log")
            [ -n "$torch_line" ] && break
            echo "  PyTorch FSDP (compile $compile) gave no result ($log):"; grep -E 'Error|error' "$log" | tail -n 2 | sed 's/^/    /'
        done
        release_memory
        [ -n "$torch_version" ] || torch_version=$(grep -o -m 1 'torch [0-9][^,]*' "$log" | head -n 1)
        if [ -z "$torch_line" ]; then
            failed=1
            row "$m-$B" "$(kv "$ours_line" tokens_per_s)" "$(kv "$ours_line" mfu)" failed - - "$(target_of "$m")" "$(kv "$ours_line" peak_mem_gib)" -
            continue
        fi
        printf '  %-44s %12s tok/s %10s ms %6s%% MFU %8s GiB (host peak %s GiB; %s s)\n' "PyTorch FSDP2 + CPU offload" \
            "$(kv "$torch_line" tokens_per_s)" "$(kv "$torch_line" ms_per_step)" "$(kv "$torch_line" mfu)" \
            "$(kv "$torch_line" peak_mem_gib)" "$(kv "$torch_line" host_peak_gib)" $((SECONDS - t0))
        echo "  train_gpt: $ours_setup, $B rows a micro-batch"
        row "$m-$B" "$(kv "$ours_line" tokens_per_s)" "$(kv "$ours_line" mfu)" "$(kv "$torch_line" tokens_per_s)" "$(kv "$torch_line" mfu)" \
            "fsdp2-offload/$(kv "$torch_line" compile)/$(kv "$torch_line" backend)/$(kv "$torch_line" dtype)" "$(target_of "$m")" \
            "$(kv "$ours_line" peak_mem_gib)" "$(kv "$torch_line" peak_mem_gib)"
        ;;
    esac
done

printf '\n%s; PyTorch: %s; Llama T=%s, median of %s timed steps (llama3-8b %s, %s tokens a step); GPT-2 T=1024\n' \
    "${gpu:-GPU ?}" "${torch_version:-torch ?}" "$T" "$STEPS" "$STEPS_8B" "$TOKENS_8B"
printf 'PyTorch single GPU: compile modes (%s, scope %s) x SDPA %s, %s, the fastest taken; MFU: train_gpt'"'"'s FLOP count against the dense bf16 peak\n' \
    "$COMPILE_MODE" "$COMPILE_SCOPE" "$BACKENDS" "$TORCH_DTYPE"
printf '%-18s %11s %6s %11s %6s %-34s %6s %6s %8s %s\n' config "ours tok/s" "MFU%" "torch tok/s" "MFU%" "PyTorch setup" ratio target "ours GiB" "torch GiB"
for r in "${SUMMARY[@]}"; do printf '%s\n' "$r"; done
exit $failed
