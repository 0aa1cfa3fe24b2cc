#!/usr/bin/env bash
# Data-parallel benchmark on the GPU machine: tokens/s, scaling efficiency and per-GPU peak memory of
# train_gpt's ZeRO stages 0-3 on 1, 2, 4 and 8 GPUs, and of PyTorch on the same model file, token shard and GPUs
# in the same run: DDP (next to stage 0), FSDP SHARD_GRAD_OP (stage 2) and FSDP FULL_SHARD (stage 3), each with
# torch.compile, SDPA flash attention, fused AdamW and bf16 (scripts/reference/gpt2_reference.py train --parallel).
# On one GPU both train plainly: that run is the baseline of the scaling efficiency,
#   efficiency = tokens/s on N GPUs / (N x tokens/s on one GPU).
# Sizes: 124M (d12, 64 rows per GPU) and 1.5B (d48, 8 rows per GPU), T = 1024, random tokens. Every run of a
# size takes the same optimizer step, rows x T x G tokens, where G is the largest of 1, 2, 4, 8 that the machine
# has: fewer GPUs fill it by gradient accumulation (stages 0-1 and DDP reduce after the last micro-step,
# stages 2-3 and FSDP after every one), so runs restricted with --gpus compare with the full run.
# train_gpt runs through scripts/launch.sh, PyTorch through torchrun; NVLink multicast is off for both.
# The result of each run is the median step time after 3 warm-up steps (the RESULT line of either trainer).
#
# Usage: bench/bench_zero.sh [--sizes "124M 1.5B"] [--gpus "1 2 4 8"] [--torch-gpus "1 4"] [--stages "0 1 2 3"]
#                              [--steps 20] [--no-torch] [--each-gpu]
#   --each-gpu: train_gpt's one-GPU run also on each other GPU of the largest count, one at a time; the column
#     "eff each" divides by the sum of the N GPUs' own one-GPU tokens/s, which separates the scaling from
#     differences between the GPUs (clocks under a power limit), which "eff" (GPU 0's run times N) includes
#   --torch-gpus: the GPU counts at which PyTorch runs too (default: all of --gpus; each of its runs compiles)
#   e.g. bench/bench_zero.sh --sizes 124M --gpus "1 2" --steps 10
# OURS_FLAGS adds train_gpt flags to its runs (e.g. OURS_FLAGS="--deterministic 1"), whose logs are kept apart.
# ROWS_124M / ROWS_1_5B override the rows per GPU; PYTHON the interpreter with torch (default python3).
# Work files (model files, the shard, every run's log) go to build/bench_zero. Where --gpus leaves out 1, the
# efficiency uses the one-GPU logs of an earlier run there with the same size, step and step count.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

die() { echo "bench_zero: $*" >&2; exit 2; }
usage() { sed -n '/^# Usage:/,/^# ROWS_124M/p' "$0" | sed 's/^# \{0,1\}//'; }
SIZES="124M 1.5B"; GPUS="1 2 4 8"; TORCH_GPUS=""; STAGES="0 1 2 3"; STEPS=20; TORCH=1; EACH=0
while [ $# -gt 0 ]; do
    case $1 in
        --sizes|--gpus|--torch-gpus|--stages|--steps)
            [ $# -ge 2 ] || die "$1 needs a value"
            case $1 in --sizes) SIZES=$2 ;; --gpus) GPUS=$2 ;; --torch-gpus) TORCH_GPUS=$2 ;; --stages) STAGES=$2 ;; --steps) STEPS=$2 ;; esac
            shift 2 ;;
        --no-torch) TORCH=0; shift ;;
        --each-gpu) EACH=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument $1" ;;
    esac
done
for s in $STAGES; do case $s in 0|1|2|3) ;; *) die "no ZeRO stage $s" ;; esac; done
TORCH_GPUS=${TORCH_GPUS:-$GPUS}
torch_at() { [ $TORCH = 1 ] && [[ " $TORCH_GPUS " == *" $1 "* ]]; }  # does PyTorch run at $1 GPUs?
for size in $SIZES; do case $size in 124M|1.5B) ;; *) die "unknown size $size (124M or 1.5B)" ;; esac; done
if ! [[ $STEPS =~ ^[0-9]+$ ]] || [ "$STEPS" -le 3 ]; then die "--steps must be more than the 3 warm-up steps"; fi

PY=${PYTHON:-python3}
T=1024
W=build/bench_zero; mkdir -p "$W"
read -ra OURS_EXTRA <<< "${OURS_FLAGS:-}"
FLAGS_TAG=$(printf '%s' "${OURS_FLAGS:-}" | tr -c 'A-Za-z0-9' '_')  # in the log folder's name
export NCCL_NVLS_ENABLE=0  # NVLink multicast off (see docs/parallel.md)
make -s train_gpt || exit 1
available=$(scripts/visible_gpus.sh)
[ "$available" -ge 1 ] || { echo "bench_zero: no GPU (nvidia-smi -L lists none)" >&2; exit 1; }
G=1; for n in 2 4 8; do [ "$available" -ge $n ] && G=$n; done
counts=""
for n in $GPUS; do
    if [ "$n" -le "$available" ]; then counts="$counts $n"
    else echo "bench_zero: skipping $n GPUs (this machine has $available)"; fi
done
largest=1; for n in $counts; do [ "$n" -gt "$largest" ] && largest=$n; done
# the device id of visible GPU i (what LOCAL_RANK i selects): the i-th entry of CUDA_VISIBLE_DEVICES when set
device_id() {
    if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | sed -n "$(($1 + 1))p"; else echo "$1"; fi
}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
torch_version=$("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null || echo "not importable with $PY")

if [ ! -f "$W/random.bin" ]; then
    "$PY" scripts/reference/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 8000000 > /dev/null || exit 1
fi

rows_of() { case $1 in 124M) echo "${ROWS_124M:-64}" ;; 1.5B) echo "${ROWS_1_5B:-8}" ;; esac; }
# A size's log folder: runs with other rows, step, step count or OURS_FLAGS keep theirs apart.
logs_dir() {
    local rows; rows=$(rows_of "$1")
    echo "$W/${1}_rows${rows}_total$((rows * T * G))_steps${STEPS}${FLAGS_TAG:+_$FLAGS_TAG}"
}
shape_of() {
    case $1 in
        124M) echo "--layers 12 --heads 12 --channels 768" ;;
        1.5B) echo "--layers 48 --heads 25 --channels 1600" ;;
    esac
}
torch_mode() { case $1 in 0) echo ddp ;; 2) echo fsdp-grad-op ;; 3) echo fsdp-full ;; esac; }  # stage 1: no counterpart
label() {
    case $1 in
        0) echo "ZeRO-0 | DDP" ;;
        1) echo "ZeRO-1 | -" ;;
        2) echo "ZeRO-2 | FSDP SHARD_GRAD_OP" ;;
        3) echo "ZeRO-3 | FSDP FULL_SHARD" ;;
    esac
}
field() { [ -f "$1" ] && grep '^RESULT' "$1" | tail -n 1 | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }

# The initial model of a size, written once by the PyTorch reference; both trainers start from it.
model_file() {
    local size=$1 out="$W/$1.bin"
    if [ ! -f "$out" ]; then
        echo "writing the $size initial model to $out" >&2
        # shellcheck disable=SC2046  # shape_of's flags are meant to split
        "$PY" scripts/reference/gpt2_reference.py debug-state $(shape_of "$size") --max-seq-len $T --batch-size 1 --seq-len 8 \
            --steps 1 --model-out "$out.tmp" --state-out "$W/unused_state.bin" > "$W/model_$size.log" 2>&1 \
            || { echo "bench_zero: writing the $size model failed:" >&2; tail -n 15 "$W/model_$size.log" >&2; return 1; }
        rm -f "$W/unused_state.bin"
        mv "$out.tmp" "$out"
    fi
    echo "$out"
}

failures=0
declare -A ran=()  # the logs this invocation wrote
# bench LOG DESCRIPTION COMMAND...: runs one trainer; on failure prints the last lines of its log.
bench() {
    local log=$1 what=$2; shift 2
    local rc
    rm -f "$log"; ran[$log]=1
    "$@" > "$log" 2>&1; rc=$?
    if [ $rc -eq 0 ] && [ -n "$(field "$log" tokens_per_s)" ]; then
        printf '  %-40s %12.0f tokens/s  %6.2f GiB\n' "$what" "$(field "$log" tokens_per_s)" "$(field "$log" peak_mem_gib)"
    else
        failures=$((failures + 1))
        echo "  FAILED: $what (exit $rc); the last lines of $log:"
        tail -n 15 "$log" | sed 's/^/    | /'
    fi
}

for size in $SIZES; do
    rows=$(rows_of "$size"); total=$((rows * T * G))
    model=$(model_file "$size") || { failures=$((failures + 1)); continue; }
    D=$(logs_dir "$size"); mkdir -p "$D"
    echo "$size: $rows rows x $T tokens per GPU, $total tokens per step, $STEPS steps"
    OURS=(./train_gpt --model "$model" --train-data "$W/random.bin" --val-data "" --val-every 0 --sample-every 0
          --batch-size "$rows" --seq-len "$T" --total-batch-tokens "$total" --steps "$STEPS" --precision bf16 --lr 6e-4
          "${OURS_EXTRA[@]}")
    REF=(scripts/reference/gpt2_reference.py train --init-from "$model" --train-shards "$W/random.bin" --batch-size "$rows"
         --seq-len "$T" --total-batch-tokens "$total" --steps "$STEPS" --dtype bf16 --device cuda --compile --sdpa
         --fused-adamw --lr 6e-4)
    for n in $counts; do
        if [ "$n" -eq 1 ]; then
            bench "$D/ours_1gpu.log" "train_gpt, 1 GPU" "${OURS[@]}"
            if [ $EACH = 1 ]; then
                for ((i = 1; i < largest; i++)); do
                    bench "$D/ours_1gpu_on$i.log" "train_gpt, 1 GPU (visible GPU $i)" \
                        env CUDA_VISIBLE_DEVICES="$(device_id $i)" "${OURS[@]}"
                done
            fi
            torch_at 1 && bench "$D/torch_1gpu.log" "PyTorch, 1 GPU" "$PY" "${REF[@]}"
            continue
        fi
        for s in $STAGES; do
            bench "$D/ours_stage${s}_${n}gpu.log" "train_gpt ZeRO-$s, $n GPUs" \
                scripts/launch.sh "$n" "${OURS[@]}" --zero-stage "$s"
            mode=$(torch_mode "$s")
            if torch_at "$n" && [ -n "$mode" ]; then
                bench "$D/torch_${mode}_${n}gpu.log" "PyTorch $mode, $n GPUs" \
                    "$PY" -m torch.distributed.run --standalone --nproc_per_node "$n" "${REF[@]}" --parallel "$mode"
            fi
        done
    done
done

# ---- the table
# The table shows this invocation's runs only, except for the one-GPU baseline of the efficiency.
result() { [ -n "${ran[$1]:-}" ] && field "$1" "$2"; }
cell() {  # tokens/s of a run: the number, FAIL (no RESULT line) or - (not run)
    local v; v=$(result "$1" tokens_per_s)
    if [ -n "$v" ]; then printf '%.0f' "$v"; elif [ -n "${ran[$1]:-}" ]; then printf FAIL; else printf -- '-'; fi
}
ratio() {
    if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; else printf -- '-'; fi
}
efficiency() {
    if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.2f", a / (n * b) }'
    else printf -- '-'; fi
}
# tokens/s on N GPUs / the sum of GPUs 0..N-1's own one-GPU tokens/s (--each-gpu), for the directory $3
efficiency_each() {
    local sum=0 v i
    [ -n "$1" ] || { printf -- '-'; return; }
    for ((i = 0; i < $2; i++)); do
        v=$(field "$3/ours_1gpu$([ $i -gt 0 ] && echo "_on$i").log" tokens_per_s)
        [ -n "$v" ] || { printf -- '-'; return; }
        sum=$(awk -v s="$sum" -v v="$v" 'BEGIN { print s + v }')
    done
    awk -v a="$1" -v s="$sum" 'BEGIN { printf "%.3f", a / s }'
}
gib() { if [ -n "$1" ]; then printf '%.1f' "$1"; else printf -- '-'; fi; }
row() { printf '%-5s %-28s %4s %11s %11s %7s %8s %8s %9s %8s %9s\n' "$@"; }

printf '\n%s x %s, GPT-2, T=%d, bf16, %d steps (median after 3 warm-up steps)\n' "$gpu" "$available" "$T" "$STEPS"
printf 'PyTorch %s: torch.compile, SDPA, fused AdamW; DDP with autocast, FSDP with bf16 MixedPrecision\n' "$torch_version"
notes=""
row size "train_gpt | PyTorch" GPUs "ours tok/s" "torch tok/s" ours/pt "eff ours" "eff each" "eff torch" "GiB ours" "GiB torch"
for size in $SIZES; do
    D=$(logs_dir "$size")
    base_ours=$(field "$D/ours_1gpu.log" tokens_per_s)
    base_torch=$([ $TORCH = 1 ] && field "$D/torch_1gpu.log" tokens_per_s)
    for f in ours $([ $TORCH = 1 ] && echo torch); do
        log="$D/${f}_1gpu.log"
        if [ -z "${ran[$log]:-}" ] && [ -n "$(field "$log" tokens_per_s)" ]; then
            notes+="one-GPU baseline from an earlier run: $log"$'\n'
        fi
    done
    for n in $counts; do
        for s in $([ "$n" -eq 1 ] && echo single || echo "$STAGES"); do
            if [ "$s" = single ]; then
                what="single GPU | single GPU"; ours="$D/ours_1gpu.log"; ref="$D/torch_1gpu.log"
            else
                what=$(label "$s"); ours="$D/ours_stage${s}_${n}gpu.log"; ref="$D/torch_$(torch_mode "$s")_${n}gpu.log"
            fi
            o=$(result "$ours" tokens_per_s); t=$(result "$ref" tokens_per_s)
            row "$size" "$what" "$n" "$(cell "$ours")" "$(cell "$ref")" "$(ratio "$o" "$t")" \
                "$(efficiency "$o" "$base_ours" "$n")" "$(efficiency_each "$o" "$n" "$D")" "$(efficiency "$t" "$base_torch" "$n")" \
                "$(gib "$(result "$ours" peak_mem_gib)")" "$(gib "$(result "$ref" peak_mem_gib)")"
        done
    done
done
printf '%s' "$notes"
echo "eff: tokens/s on N GPUs / (N x one-GPU tokens/s); eff each (--each-gpu): / the sum of the N GPUs' own one-GPU tokens/s."
echo "Peak memory of rank 0: train_gpt, the device memory in use"
echo "(cudaMemGetInfo) less that before its first allocation; PyTorch, torch.cuda.max_memory_allocated (live tensors)."
[ "$failures" -eq 0 ] || { echo "bench_zero: $failures run(s) failed (their last lines are above)"; exit 1; }
