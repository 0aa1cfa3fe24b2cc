#!/usr/bin/env bash
# Tensor, pipeline and 3D parallelism on the GPUs of one machine: train_gpt through scripts/launch.sh
# and, in the same call on the same GPUs, PyTorch's own tensor parallelism and pipelining
# (bench/bench_pytorch_parallel.py through torchrun) on the same GPT shapes, T = 1024, bf16, random tokens.
#   tp       GPT-2 1.5B's shape with 24 heads (48 layers, C=1536: 1.4B; its 25 heads of 64 do not split into 2, 4
#            or 8 groups) at B=8, and a 6.6B GPT (32 layers, C=4096, 32 heads) at B=4, at tp = 1, 2, 4, 8 (as many
#            as there are GPUs), without and with sequence parallelism: tokens/s, MFU, per-GPU peak memory, ratio.
#   pp       the 6.6B GPT at pp = 2, 4, 8 with m = 2P, 4P, 8P micro-batches of 2 rows, 1F1B, interleaved
#            (2 chunks per stage) and zb1 (ZB-H1): tokens/s, ratio against torch.distributed.pipelining's Schedule1F1B /
#            ScheduleInterleaved1F1B (zb1: none, torch has no ZB-H1 of one chunk per stage), and train_gpt's measured bubble (median over the timed steps of its step
#            log) against the formula's, the schedule simulated with the LM head's work on the last stage, and the
#            schedule simulated with each stage's measured busy time.
#            PP_LAYERS=balanced passes --pipeline-layers balanced to train_gpt (default: the even split).
#   3d       8 GPUs, dp 2 x tp 2 x pp 2 (4 GPUs: dp 1) (ZeRO-1, interleaved, 8 micro-batches of 2 rows per data-parallel rank),
#            the 1.4B GPT of tp and a 13B GPT (40 layers, C=5120, 40 heads): tokens/s, MFU, peak memory against the
#            memory plan train_gpt prints (train_gpt only).
#   fp8      4 GPUs: the 13B GPT at tp 2 x pp 2 (interleaved, 8 micro-batches of 2 rows), --precision bf16 against
#            fp8 with each --fp8-scaling of FP8_SCALING (default "current delayed"): tokens/s, MFU against the bf16
#            peak, peak memory, fp8 / bf16 (train_gpt only).
#   largest  the largest of a list of GPTs (70B, 40B, 30B, 20B, 13B, 6.6B) that trains 20 steps with tp 2 x pp 2 x
#            the rest data parallel under ZeRO-1 (pipelines take stages 0-1; fewer than 4 GPUs: tp 2 or one GPU, under
#            ZeRO-3; with one data-parallel rank, as on 4 GPUs, nothing is sharded), 1 row per micro-batch, 2
#            micro-batches per pipeline stage: train_gpt's memory plan refuses what does not fit before allocating
#            (train_gpt only). LARGEST_PP=1: no pipeline, the GPUs beyond tp 2 data parallel under ZeRO-3 (4 GPUs:
#            tp 2 x dp 2, so that ZeRO has a data-parallel group to shard over).
# Usage: bench/bench_parallel.sh [tp] [pp] [3d] [fp8] [largest]   (default: all that the GPUs allow)
# SMOKE=1: a check of the plumbing on one GPU, not a speed: 2 ranks sharing GPU 0 (scripts/launch.sh --one-gpu,
#   bench_pytorch_parallel.py --one-gpu), tiny GPTs (4 layers, C=256, 4 heads), sections tp and pp at 2 only.
# Environment: STEPS (timed steps, default 10; train_gpt runs 3 more as warm-up, PyTorch WARMUP more),
#   WARMUP (PyTorch's untimed steps, the first compiles; default 3), NO_TORCH=1 (train_gpt only), PYTHON.
#   Subsets, so that a section fits a device call: TP_MODELS (labels, default "1.4B 6.6B"), TP_SIZES (default
#   "1 2 4 8"), TP_SP (sequence parallelism off and on at tp > 1, default "0 1"), PP_SIZES (default "2 4 8"),
#   PP_MICRO (micro-batches per stage, default "2 4 8"), PP_SCHEDULES
#   (default "1f1b interleaved zb1"), LARGEST_PP (1 or 2); sizes above the GPU count are skipped.
# Logs: build/bench_parallel/. Summary lines start with "| ".
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
STEPS=${STEPS:-10}; WARMUP=${WARMUP:-3}; PY=${PYTHON:-python3}; T=1024
W=build/bench_parallel; mkdir -p "$W"
export NCCL_NVLS_ENABLE=0  # NVLink multicast off (see docs/parallel.md)
SECTIONS=("$@"); [ ${#SECTIONS[@]} -gt 0 ] || { [ "${SMOKE:-0}" = 1 ] && SECTIONS=(tp pp) || SECTIONS=(tp pp 3d fp8 largest); }
for s in "${SECTIONS[@]}"; do case $s in tp|pp|3d|fp8|largest) ;; *) echo "bench_parallel: unknown section '$s' (tp, pp, 3d, fp8, largest)" >&2; exit 2 ;; esac; done
for s in ${FP8_SCALING:-current delayed}; do case $s in current|delayed) ;; *) echo "bench_parallel: FP8_SCALING takes current and delayed, got '$s'" >&2; exit 2 ;; esac; done
case ${LARGEST_PP:-2} in 1|2) ;; *) echo "bench_parallel: LARGEST_PP must be 1 or 2, got '$LARGEST_PP'" >&2; exit 2 ;; esac
make -s train_gpt || exit 1
G=$(scripts/visible_gpus.sh)
[ "$G" -ge 1 ] || { echo "bench_parallel: no GPU" >&2; exit 1; }
SMOKE=${SMOKE:-0}; ONE_GPU=(); TORCH_ONE_GPU=()
if [ "$SMOKE" = 1 ]; then G=2; ONE_GPU=(--one-gpu); TORCH_ONE_GPU=(--one-gpu); fi
[ -f "$W/random.bin" ] || $PY scripts/reference/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 4000000 > /dev/null || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "bench_parallel: $G x $gpu, T=$T, bf16, $STEPS timed steps"
source bench/bench_util.sh  # kv, ratio_of
counts_upto() { local n; for n in "$@"; do [ "$n" -le "$G" ] && printf '%s ' "$n"; done; }

# ours NAME RANKS FLAGS...: train_gpt on RANKS GPUs; leaves its RESULT line in OURS ("" if it failed)
ours() {
    local name=$1 ranks=$2; shift 2
    OURS=""
    if scripts/launch.sh "${ONE_GPU[@]}" "$ranks" ./train_gpt --train-data "$W/random.bin" --val-every 0 --sample-every 0 --seq-len $T \
        --precision bf16 --steps $((STEPS + 3)) --nccl-timeout 300 "$@" > "$W/$name.log" 2>&1; then
        OURS=$(grep -m1 '^RESULT' "$W/$name.log")
    fi
    [ -n "$OURS" ] || echo "  train_gpt $name failed: $(grep -m1 -iE 'error|fatal|out of memory|needs' "$W/$name.log" || tail -n 1 "$W/$name.log")"
}
# torch NAME RANKS FLAGS...: bench_pytorch_parallel.py on RANKS GPUs; leaves its RESULT line in TORCH
torch_run() {
    local name=$1 ranks=$2; shift 2
    TORCH=""
    [ "${NO_TORCH:-0}" = 1 ] && return
    if $PY -m torch.distributed.run --standalone --nproc-per-node "$ranks" bench/bench_pytorch_parallel.py \
        "${TORCH_ONE_GPU[@]}" --steps "$STEPS" --warmup "$WARMUP" "$@" > "$W/torch_$name.log" 2>&1; then
        TORCH=$(grep -m1 '^RESULT' "$W/torch_$name.log")
    fi
    [ -n "$TORCH" ] || echo "  PyTorch $name failed: $(grep -m1 -iE 'Error|out of memory' "$W/torch_$name.log" || tail -n 1 "$W/torch_$name.log")"
}
ratio() { ratio_of "$(kv "$OURS" tokens_per_s)" "$(kv "$TORCH" tokens_per_s)"; }
row() {  # row LABEL: one summary line from OURS and TORCH
    printf '| %-34s | %10s | %5s | %6s | %10s | %5s | %6s | %5s |\n' "$1" "$(kv "$OURS" tokens_per_s)" "$(kv "$OURS" mfu)" \
        "$(kv "$OURS" peak_mem_gib)" "$(kv "$TORCH" tokens_per_s)" "$(kv "$TORCH" mfu)" "$(kv "$TORCH" peak_mem_gib)" "$(ratio)"
}
header() {
    echo "| $1 | ours tok/s | MFU % | GiB | torch tok/s | MFU % | GiB | ratio |"
    echo "|---|---|---|---|---|---|---|---|"
}

# name layers channels heads rows
MODELS_TP=("1.4B 48 1536 24 8" "6.6B 32 4096 32 4")
P66=(--layers 32 --channels 4096 --heads 32)
if [ "$SMOKE" = 1 ]; then
    MODELS_TP=("tiny 4 256 4 4"); P66=(--layers 4 --channels 256 --heads 4)
    for s in "${SECTIONS[@]}"; do [ "$s" = tp ] || [ "$s" = pp ] || { echo "bench_parallel: SMOKE=1 runs tp and pp only" >&2; exit 2; }; done
fi
for section in "${SECTIONS[@]}"; do
    case $section in
    tp)
        echo; echo "== tensor parallelism (train_gpt --tensor-parallel vs torch.distributed.tensor.parallel) =="
        header "model, tp, sequence parallel"
        for m in "${MODELS_TP[@]}"; do
            read -r label L C H B <<< "$m"
            [ "$SMOKE" = 1 ] || [[ " ${TP_MODELS:-1.4B 6.6B} " == *" $label "* ]] || continue
            shape=(--layers "$L" --channels "$C" --heads "$H")
            for tp in $(counts_upto ${TP_SIZES:-1 2 4 8}); do
                for sp in ${TP_SP:-0 1}; do
                    [ "$tp" = 1 ] && [ $sp = 1 ] && continue
                    name="tp_${label}_tp${tp}_sp${sp}"
                    ours "$name" "$tp" --model d48 "${shape[@]}" --batch-size "$B" --tensor-parallel "$tp" --sequence-parallel $sp
                    torch_run "$name" "$tp" --mode tp "${shape[@]}" -b "$B" --sequence-parallel $sp
                    row "$label tp $tp sp $sp"
                done
            done
        done ;;
    pp)
        echo; echo "== pipeline parallelism, 6.6B GPT, 2 rows per micro-batch (train_gpt vs torch.distributed.pipelining) =="
        echo "| pp, schedule, micro-batches | ours tok/s | MFU % | GiB | torch tok/s | MFU % | GiB | ratio | bubble measured / theory / with the head / with the stages' busy times | busy ms per stage |"
        echo "|---|---|---|---|---|---|---|---|---|---|"
        for P in $(counts_upto ${PP_SIZES:-2 4 8}); do
            for per_stage in ${PP_MICRO:-2 4 8}; do
                m=$((per_stage * P))
                for sched in ${PP_SCHEDULES:-1f1b interleaved zb1}; do
                    name="pp_p${P}_m${m}_$sched"
                    ours "$name" "$P" --model d48 "${P66[@]}" --batch-size 2 --total-batch-tokens $((2 * T * m)) \
                        --pipeline-parallel "$P" --pipeline-schedule $sched --zero-stage 0 ${PP_LAYERS:+--pipeline-layers $PP_LAYERS}
                    TORCH=""
                    [ $sched = zb1 ] || torch_run "$name" "$P" --mode pp "${P66[@]}" -b 2 --microbatches $m --schedule $sched --virtual-stages 2
                    # the step log's "bubble X% (theory Y%, with the head Z%)" of the timed steps: median measured, the
                    # formula, and the schedule simulated with each stage's work (the LM head's on the last)
                    bubble=$(grep -E '^step' "$W/$name.log" | tail -n "$STEPS" |
                             sed -n 's/.*bubble \([0-9.]*\)% (theory \([0-9.]*\)%, with the head \([0-9.]*\)%).*/\1 \2 \3/p' |
                             sort -n | awk '{ v[NR] = $1; t = $2; h = $3 } END { if (NR) printf "%.1f%% / %.1f%% / %.1f%%", v[int((NR + 1) / 2)], t, h; else printf "-" }')
                    # the schedule simulated with the stages' measured busy times (train_gpt's closing line)
                    staged=$(sed -n 's/^pipeline: the schedule simulated with .* leaves the first stage \([0-9.]*\)% idle/\1/p' "$W/$name.log")
                    if [ "$bubble" != "-" ]; then [ -n "$staged" ] && bubble="$bubble / $staged%" || bubble="$bubble / -"; fi
                    # each stage's median busy time (train_gpt's closing "pipeline stage S: ..." lines), stage 0 first
                    busy=$(sed -n 's/^pipeline stage \([0-9]*\): .* busy \([0-9.]*\) ms.*/\1 \2/p' "$W/$name.log" | sort -n | awk '{ printf "%s%s", (NR > 1 ? " / " : ""), $2 }')
                    printf '%s | %s | %s |\n' "$(row "pp $P $sched m=$m" | sed 's/ |$//')" "$bubble" "${busy:--}"
                done
            done
        done ;;
    3d)
        # dp 2 on 8 GPUs; on 4, the same tp 2 x pp 2 without data parallelism
        dp=0; [ "$G" -ge 4 ] && dp=1; [ "$G" -ge 8 ] && dp=2
        echo; echo "== 3D: dp $dp x tp 2 x pp 2, ZeRO-1, interleaved, 8 micro-batches of 2 rows per data-parallel rank (train_gpt) =="
        if [ $dp = 0 ]; then echo "  not run: needs 4 GPUs (8 for dp 2), this machine has $G"; continue; fi
        echo "| model | tok/s | MFU % | peak GiB | plan GiB |"; echo "|---|---|---|---|---|"
        for m in "1.4B 48 1536 24" "13B 40 5120 40"; do
            read -r label L C H <<< "$m"
            name="3d_dp${dp}_$label"
            ours "$name" $((dp * 4)) --model d48 --layers "$L" --channels "$C" --heads "$H" --batch-size 2 --total-batch-tokens $((dp * 2 * T * 8)) \
                --tensor-parallel 2 --pipeline-parallel 2 --pipeline-schedule interleaved --zero-stage 1
            plan=$(grep -m1 'memory plan per GPU' "$W/$name.log" | sed -n 's/.*| total \([0-9.]*\) of.*/\1/p')
            echo "| $label | $(kv "$OURS" tokens_per_s) | $(kv "$OURS" mfu) | $(kv "$OURS" peak_mem_gib) | ${plan:--} |"
        done ;;
    fp8)
        echo; echo "== fp8 against bf16: the 13B GPT (40 layers, C=5120, 40 heads), tp 2 x pp 2, interleaved, 8 micro-batches of 2 rows (train_gpt) =="
        if [ "$G" -lt 4 ]; then echo "  not run: needs 4 GPUs, this machine has $G"; continue; fi
        echo "| precision | tok/s | MFU % (bf16 peak) | peak GiB | / bf16 |"; echo "|---|---|---|---|---|"
        FP8_13B=(--model d48 --layers 40 --channels 5120 --heads 40 --batch-size 2 --total-batch-tokens $((2 * T * 8))
                 --tensor-parallel 2 --pipeline-parallel 2 --pipeline-schedule interleaved --zero-stage 1)
        ours fp8_13b_bf16 4 "${FP8_13B[@]}"; BF16=$OURS
        echo "| bf16 | $(kv "$BF16" tokens_per_s) | $(kv "$BF16" mfu) | $(kv "$BF16" peak_mem_gib) | |"
        for scaling in ${FP8_SCALING:-current delayed}; do
            ours "fp8_13b_$scaling" 4 "${FP8_13B[@]}" --precision fp8 --fp8-scaling "$scaling"
            ratio=$(ratio_of "$(kv "$OURS" tokens_per_s)" "$(kv "$BF16" tokens_per_s)")
            echo "| fp8 $scaling | $(kv "$OURS" tokens_per_s) | $(kv "$OURS" mfu) | $(kv "$OURS" peak_mem_gib) | $ratio |"
        done ;;
    largest)
        tp=1; pp=1; [ "$G" -ge 2 ] && tp=2; [ "$G" -ge 4 ] && pp=${LARGEST_PP:-2}
        dp=$((G / (tp * pp))); zero=3; [ $pp -gt 1 ] && zero=1  # pipelines run ZeRO stages 0-1 only
        zero_label="ZeRO-$zero"; [ $dp -eq 1 ] && zero_label="no ZeRO (one data-parallel rank: nothing to shard)"
        echo; echo "== the largest GPT that trains 20 steps here with tp $tp x pp $pp x dp $dp, $zero_label (train_gpt) =="
        found=""
        for m in "70B 80 8192 64" "40B 48 8192 64" "30B 60 6656 52" "20B 44 6144 48" "13B 40 5120 40" "6.6B 32 4096 32"; do
            read -r label L C H <<< "$m"
            name="largest_$label"
            STEPS_SAVED=$STEPS; STEPS=17  # 20 steps in all
            ours "$name" "$G" --model d48 --layers "$L" --channels "$C" --heads "$H" --batch-size 1 \
                --total-batch-tokens $((dp * T * 2 * pp)) --tensor-parallel $tp --pipeline-parallel $pp --zero-stage $zero
            STEPS=$STEPS_SAVED
            if [ -n "$OURS" ]; then
                echo "| $label (L=$L C=$C H=$H), tp $tp x pp $pp x dp $dp, $zero_label: $(kv "$OURS" tokens_per_s) tok/s, MFU $(kv "$OURS" mfu)%, peak $(kv "$OURS" peak_mem_gib) GiB"
                echo "|   $(grep -m1 'memory plan per GPU' "$W/$name.log")"
                found=$label; break
            fi
        done
        [ -n "$found" ] || echo "  none of the list trained here" ;;
    esac
done
