#!/usr/bin/env bash
# Data parallelism of the PyTorch reference (`gpt2_reference.py train` in several processes): on a tiny model
# in fp32, 2 processes with DDP, FSDP SHARD_GRAD_OP and FSDP FULL_SHARD give the same 3 losses and gradient
# norms as 1 process with the doubled batch, and write the same final model (all within 1e-5); once with
# 2 rows per process and once with 1 row per process and 2 micro-steps of gradient accumulation.
# Usage: test/test_reference_parallel.sh [cpu|cuda] [bf16]
#   cpu (default): gloo. torch 1.x cannot run FSDP on the CPU (it needs CUDA there): those checks are skipped.
#   cuda: NCCL, needs 2 GPUs. bf16 adds the benchmark's configuration (bf16, --compile --sdpa --fused-adamw)
#   for each mode, checked against one process within 5e-2 (autocast there, FSDP's bf16 parameters here).
# Processes are started by scripts/launch.sh, which sets the environment torchrun sets (RANK, WORLD_SIZE,
# LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Prints "PASS reference_parallel ..." (FAIL, SKIP) lines like the test suite;
# run by hand, not by test/run_tests.sh.
# PYTHON overrides the interpreter (default: the first of /usr/bin/python3 and python3 that imports torch).
set -u
cd "$(dirname "$0")/.." || exit 1
DEVICE=${1:-cpu}
BF16=${2:-}
W=build/test_work/reference_parallel
rm -rf "$W"; mkdir -p "$W"

python=""
for candidate in ${PYTHON:-} /usr/bin/python3 python3; do
    if "$candidate" -c "import torch, numpy" > /dev/null 2>&1; then python=$candidate; break; fi
done
if [ -z "$python" ]; then echo "SKIP reference_parallel data parallel: no python3 with torch and numpy"; exit 0; fi
if [ "$DEVICE" = cuda ] && [ "$(scripts/visible_gpus.sh)" -lt 2 ]; then
    echo "SKIP reference_parallel data parallel on cuda: fewer than 2 GPUs"; exit 0
fi
torch_major=$("$python" -c "import torch; print(torch.__version__.split('.')[0])")
export OMP_NUM_THREADS=1  # two processes share the cores

"$python" scripts/reference/gpt2_reference.py make-shard --out "$W/shard.bin" --tokens 20000 --vocab-size 256 > /dev/null
MODEL=(--layers 2 --heads 2 --channels 32 --seq-len 16 --vocab-size 256 --seed 7 --lr 1e-3 --warmup-steps 1
       --steps 3 --device "$DEVICE" --train-shards "$W/shard.bin")
GLOBAL_TOKENS=$((4 * 16))  # 4 rows of 16 tokens per step

# run NAME PROCESSES ARGS...: trains, writing $W/NAME.log (the per-step log) and $W/NAME.bin (the final model).
run() {
    local name=$1 procs=$2; shift 2
    local cmd=("$python" scripts/reference/gpt2_reference.py train "${MODEL[@]}" --log "$W/$name.log" --model-out "$W/$name.bin" "$@")
    if [ "$procs" -gt 1 ]; then cmd=(scripts/launch.sh "$procs" "${cmd[@]}"); fi
    "${cmd[@]}" > "$W/$name.out" 2>&1
}
# maxdiff A B COLUMN: the largest absolute difference of a log column (2 loss, 4 gradient norm) over the steps
maxdiff() {
    paste <(grep -v '^#' "$W/$1.log" | cut -d' ' -f"$3") <(grep -v '^#' "$W/$2.log" | cut -d' ' -f"$3") |
        awk 'BEGIN { m = 0 } { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.2g", m }'
}
model_diff() {
    "$python" -c "import numpy as np, sys; a, b = (np.fromfile(f, '<f4', offset=1024) for f in sys.argv[1:]); \
print(f'{np.abs(a - b).max():.2g}' if a.shape == b.shape else 'inf')" "$W/$1.bin" "$W/$2.bin"
}
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d <= t) }'; }

# check NAME BASELINE TOLERANCE DESCRIPTION [model]: compares NAME's losses with BASELINE's, and with "model"
# also the gradient norms and the final parameters.
check() {
    local name=$1 base=$2 tol=$3 what=$4 compare_model=${5:-}
    local steps dl dn dm ok=1 detail
    steps=$(grep -vc '^#' "$W/$name.log")
    dl=$(maxdiff "$base" "$name" 2)
    detail="loss $dl"
    if [ "$steps" -ne 3 ] || ! within "$dl" "$tol"; then ok=0; fi
    if [ -n "$compare_model" ]; then
        dn=$(maxdiff "$base" "$name" 4); dm=$(model_diff "$base" "$name")
        detail+=", grad norm $dn, final parameters $dm"
        if ! within "$dn" "$tol" || ! within "$dm" "$tol"; then ok=0; fi
    fi
    if [ $ok = 1 ]; then echo "PASS reference_parallel $what: 3 steps match one process (max diff $detail; tol $tol)"
    else echo "FAIL reference_parallel $what: $steps steps, max diff $detail (tol $tol)"; fi
}

if ! run single 1 --batch-size 4; then
    echo "FAIL reference_parallel data parallel: one-process baseline failed: $(tail -n 1 "$W/single.out")"; exit 1
fi
for mode in ddp fsdp-grad-op fsdp-full; do
    for variant in "rows 2" "accum 1"; do
        read -r kind rows <<< "$variant"
        name="${mode}_$kind"
        what="$mode 2 processes $DEVICE fp32 ($rows row(s) per process$([ "$kind" = accum ] && echo ", 2 micro-steps"))"
        if [[ $mode == fsdp-* && $DEVICE == cpu && $torch_major -lt 2 ]]; then
            echo "SKIP reference_parallel $what: torch $torch_major.x runs FSDP only on CUDA"; continue
        fi
        if run "$name" 2 --parallel "$mode" --batch-size "$rows" --total-batch-tokens $GLOBAL_TOKENS; then
            check "$name" single 1e-5 "$what" model
        else
            echo "FAIL reference_parallel $what: exited with an error: $(grep -v '^launch.sh' "$W/$name.out" | tail -n 1)"
        fi
    done
done

if [ "$BF16" = bf16 ]; then
    FAST=(--dtype bf16 --compile --sdpa --fused-adamw)
    if ! run single_bf16 1 --batch-size 4 "${FAST[@]}"; then
        echo "FAIL reference_parallel data parallel bf16: one-process baseline failed: $(tail -n 1 "$W/single_bf16.out")"; exit 1
    fi
    for mode in ddp fsdp-grad-op fsdp-full; do
        what="$mode 2 processes $DEVICE bf16 --compile --sdpa --fused-adamw"
        if run "${mode}_bf16" 2 --parallel "$mode" --batch-size 2 "${FAST[@]}"; then
            check "${mode}_bf16" single_bf16 5e-2 "$what"
        else
            echo "FAIL reference_parallel $what: exited with an error: $(grep -v '^launch.sh' "$W/${mode}_bf16.out" | tail -n 1)"
        fi
    done
fi
