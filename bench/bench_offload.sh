#!/usr/bin/env bash
# ZeRO-Offload benchmark on the GPU machine; sections chosen by SECTIONS (default "cpu_adam single"):
#   cpu_adam  the CPU AdamW of --offload (build/bench_adamw_cpu: bf16 with fp32 master weights, and fp32) against
#             a pass over the same bytes with one add an element (the memory system's limit), and against PyTorch's
#             CPU AdamW (bench/bench_pytorch_adamw_cpu.py: foreach and fused, fp32), on the same cores: ours / limit
#             and ours / the faster PyTorch, both counting 28 bytes an element.
#   single    the 6.6B GPT (32 layers, C=4096, 32 heads, T=1024) on one GPU with steps of TOKENS tokens (default
#             524,288: ROWS rows a micro-batch, accumulated), VARIANTS of them (default all three): resident
#             (on the GPU), offload (--offload optimizer), delayed (also --offload-delayed-update 1); random
#             tokens: tokens/s, MFU, peak GPU memory, the host plan line, and offload / resident. A run the memory plan refuses (the resident states of 6.6B need 106 GB: more than
#             an 80 GB GPU) prints the refusal and the ratio is left out.
#   fsdp      PyTorch FSDP with CPUOffload(offload_params=True) (bench/bench_pytorch_parallel.py --mode fsdp: eager,
#             bf16 mixed precision, the micro-batches under no_sync) against train_gpt --offload optimizer, the same
#             6.6B GPT on one GPU, TOKENS tokens a step of FSDP_ROWS rows a micro-batch (default 8): tokens/s, peak
#             GPU memory, ours / FSDP. FSDP_RUNS (default "ours torch") picks the runs.
#   nvme      the NVMe tier (--offload-dir) on the disk under OFFLOAD_DIR (required), on the CPU alone
#             (build/bench_offload_dir): the disk's sequential write and read GB/s with direct I/O in records of the tile
#             (2^22 elements x 12 bytes), then the double-buffered AdamW pass over a shard of ELEMENTS parameters whose
#             master weights and moments are in a file: params/s and the fraction of the disk's bandwidth it reaches.
#             The single section takes the variant disk (--offload optimizer --offload-dir OFFLOAD_DIR) with it.
#   large     the 30B GPT (60 layers, C=6656, 52 heads) on LARGE_GPUS GPUs (default 4) through scripts/launch.sh,
#             ZeRO-3 with --offload optimizer, TOKENS tokens a step of LARGE_ROWS rows a micro-batch (default 2):
#             tokens/s, MFU, peak GPU memory, the memory plan's lines (GPU and pinned host).
# Each train_gpt result is its RESULT line: the median step after 3 warm-up steps of STEPS + 3; PyTorch's the median
# of STEPS steps after one.
# Usage: SECTIONS="cpu_adam" bench/bench_offload.sh
#   ELEMENTS (cpu_adam and nvme, default 2^28), THREADS (default: every core), REPS (default 5; nvme 3);
#   OFFLOAD_DIR (nvme, the single section's disk variant), NVME_GIB (nvme: the disk probe's file, default 8);
#   TOKENS, ROWS (default 4), STEPS (default 2), VARIANTS, OURS_FLAGS (more train_gpt flags, e.g. "--recompute 1");
#   FSDP_ROWS, FSDP_RUNS; LARGE_GPUS, LARGE_ROWS;
#   GPU_MEMORY_GIB: the single and fsdp sections' GPU made smaller, bench/hold_gpu_memory.py holding all but this many
#   GiB of GPU 0 (79.1: an H100 80GB's free memory, on an H200);
#   PYTHON: the interpreter with torch (default python3). Work files go to build/bench_offload.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
W=build/bench_offload; mkdir -p "$W"
PY=${PYTHON:-python3}
SECTIONS=${SECTIONS:-cpu_adam single}
THREADS=${THREADS:-$(nproc)}
source bench/bench_util.sh  # kv, ratio_of
for s in $SECTIONS; do
    case $s in cpu_adam|single|fsdp|large|nvme) ;; *) echo "bench_offload: SECTIONS takes cpu_adam, single, fsdp, large and nvme, got '$s'" >&2; exit 2 ;; esac
done

if [[ " $SECTIONS " == *" cpu_adam "* ]]; then
    make -s build/bench_adamw_cpu || exit 1
    n=${ELEMENTS:-268435456}; reps=${REPS:-5}
    echo "== cpu_adam: $n elements, $THREADS threads ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
    OMP_NUM_THREADS=$THREADS build/bench_adamw_cpu --elements "$n" --threads "$THREADS" --reps "$reps" | tee "$W/ours_cpu_adam.log"
    $PY bench/bench_pytorch_adamw_cpu.py --elements "$n" --threads "$THREADS" --reps "$reps" 2>&1 | tee "$W/torch_cpu_adam.log"
    rate() { kv "$(grep -m1 "^RESULT $1" "$2")" params_per_s; }
    ours_bf16=$(rate "adamw_cpu bf16+master" "$W/ours_cpu_adam.log"); ours_fp32=$(rate "adamw_cpu fp32" "$W/ours_cpu_adam.log")
    limit_bf16=$(rate "same_traffic bf16+master" "$W/ours_cpu_adam.log"); limit_fp32=$(rate "same_traffic fp32" "$W/ours_cpu_adam.log")
    torch_best=$(grep '^RESULT torch_adamw_cpu' "$W/torch_cpu_adam.log" | while read -r line; do kv "$line" params_per_s; done | sort -g | tail -n 1)
    awk -v b="$ours_bf16" -v f="$ours_fp32" -v lb="$limit_bf16" -v lf="$limit_fp32" -v t="${torch_best:-0}" 'BEGIN {
        printf "cpu_adam: ours bf16+master %.3g params/s = %.0f%% of the same traffic; fp32 %.3g params/s = %.0f%%\n", b, 100 * b / lb, f, 100 * f / lf
        if (t > 0) printf "cpu_adam: ours / PyTorch (the faster of foreach and fused, fp32): bf16+master %.2fx, fp32 %.2fx\n", b / t, f / t
        else print "cpu_adam: no PyTorch result"
    }' | tee "$W/cpu_adam_summary.txt"
fi

if [[ " $SECTIONS " == *" nvme "* ]]; then
    [ -n "${OFFLOAD_DIR:-}" ] || { echo "bench_offload: the nvme section needs OFFLOAD_DIR, a folder on the disk to measure" >&2; exit 2; }
    make -s build/bench_offload_dir || exit 1
    n=${ELEMENTS:-268435456}
    echo "== nvme: $OFFLOAD_DIR on $(df --output=source,fstype "$OFFLOAD_DIR" | tail -n 1 | tr -s ' '), $n parameters, $THREADS threads"
    build/bench_offload_dir --dir "$OFFLOAD_DIR" --gib "${NVME_GIB:-8}" --elements "$n" --threads "$THREADS" --reps "${REPS:-3}" | tee "$W/nvme.log"
    line() { grep -m1 "^RESULT $1" "$W/nvme.log"; }
    awk -v w="$(kv "$(line 'disk write')" GB_per_s)" -v r="$(kv "$(line 'disk read')" GB_per_s)" -v p="$(kv "$(line offload_dir_adamw)" params_per_s)" \
        -v f="$(kv "$(line offload_dir_adamw)" disk_fraction)" 'BEGIN {
        if (p == "") { print "nvme: no result"; exit }
        printf "nvme: disk %.2f GB/s write, %.2f GB/s read; AdamW through the file %.3g params/s = %.0f%% of the disk'"'"'s limit (12 bytes read and written a parameter)\n", w, r, p, 100 * f
    }' | tee "$W/nvme_summary.txt"
fi

T=1024; tokens=${TOKENS:-524288}; steps=${STEPS:-2}
SHAPE_6_6B=(--layers 32 --channels 4096 --heads 32)
# micro_steps ROWS NAME: a step of `tokens` in micro-batches of ROWS rows of T tokens (NAME: the rows' variable)
micro_steps() {
    [ $((tokens % ($1 * T))) -eq 0 ] || { echo "bench_offload: TOKENS ($tokens) must be a multiple of $2 x $T ($(($1 * T)))" >&2; exit 2; }
    echo $((tokens / $1 / T))
}
# ours NAME ROWS [LAUNCHER...] -- FLAGS...: train_gpt on random tokens, its log $W/NAME.log; prints its RESULT (or why
# none) and sets RESULT_LINE
ours() {
    local name=$1 rows=$2 launcher=(); shift 2
    while [ "$1" != "--" ]; do launcher+=("$1"); shift; done; shift
    # shellcheck disable=SC2086
    "${launcher[@]}" ./train_gpt --model d48 --train-data "$W/random.bin" --val-every 0 --sample-every 0 --seq-len $T --batch-size "$rows" \
        --total-batch-tokens "$tokens" --precision bf16 --steps $((steps + 3)) "$@" ${OURS_FLAGS:-} > "$W/$name.log" 2>&1
    RESULT_LINE=$(grep -m1 '^RESULT' "$W/$name.log")
    if [ -n "$RESULT_LINE" ]; then
        echo "$name: ${RESULT_LINE#RESULT }"
        grep -m1 -E '^memory plan per GPU' "$W/$name.log"
        grep -m1 '^host memory per rank' "$W/$name.log"
        grep -E '^(disk per rank|optimizer file:)' "$W/$name.log" | head -n 2
    else
        echo "$name: no result: $(grep -m1 -iE 'error|out of memory' "$W/$name.log" || tail -n 1 "$W/$name.log")"
    fi
}
ratio() {  # ratio LABEL RESULT_A RESULT_B: A's tokens/s over B's, where both ran
    if [ -n "$2" ] && [ -n "$3" ]; then awk -v a="$(kv "$2" tokens_per_s)" -v b="$(kv "$3" tokens_per_s)" -v n="$1" 'BEGIN { printf "%s = %.3f\n", n, a / b }'; fi
}
if [[ " $SECTIONS " =~ " "(single|fsdp|large)" " ]]; then
    make -s train_gpt || exit 1
    [ -f "$W/random.bin" ] || $PY scripts/reference/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 4000000 > /dev/null || exit 1
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
fi
if [ -n "${GPU_MEMORY_GIB:-}" ] && [[ " $SECTIONS " =~ " "(single|fsdp)" " ]]; then
    $PY bench/hold_gpu_memory.py --leave-gib "$GPU_MEMORY_GIB" > "$W/hold_gpu_memory.log" 2>&1 &
    holder=$!; trap 'kill $holder 2>/dev/null' EXIT
    until grep -q -e '^holding' -e 'error' "$W/hold_gpu_memory.log" 2>/dev/null; do
        kill -0 $holder 2>/dev/null || break; sleep 1
    done
    grep -q '^holding' "$W/hold_gpu_memory.log" || { echo "bench_offload: GPU_MEMORY_GIB: $(tail -n 1 "$W/hold_gpu_memory.log")" >&2; exit 1; }
    gpu="$gpu with $GPU_MEMORY_GIB GiB free ($(cat "$W/hold_gpu_memory.log"))"
fi

if [[ " $SECTIONS " == *" single "* ]]; then
    rows=${ROWS:-4}; m=$(micro_steps "$rows" ROWS) || exit 2
    echo "== single: 6.6B GPT on one $gpu, $tokens tokens a step ($rows rows x $m micro-steps), bf16, $steps timed steps"
    declare -A flags_of=([resident]="" [offload]="--offload optimizer" [delayed]="--offload optimizer --offload-delayed-update 1") result
    [ -n "${OFFLOAD_DIR:-}" ] && flags_of[disk]="--offload optimizer --offload-dir $OFFLOAD_DIR"
    for name in ${VARIANTS:-resident offload delayed}; do
        [ -n "${flags_of[$name]+set}" ] || { echo "bench_offload: VARIANTS takes resident, offload, delayed and (with OFFLOAD_DIR) disk, got '$name'" >&2; exit 2; }
        # shellcheck disable=SC2086
        ours "single_$name" "$rows" -- "${SHAPE_6_6B[@]}" ${flags_of[$name]}
        result[$name]=$RESULT_LINE
    done
    ratio "single: offload / resident" "${result[offload]:-}" "${result[resident]:-}"
    ratio "single: delayed / resident" "${result[delayed]:-}" "${result[resident]:-}"
    ratio "single: disk / offload" "${result[disk]:-}" "${result[offload]:-}"
fi

if [[ " $SECTIONS " == *" fsdp "* ]]; then
    rows=${FSDP_ROWS:-8}; m=$(micro_steps "$rows" FSDP_ROWS) || exit 2
    echo "== fsdp: 6.6B GPT on one $gpu, $tokens tokens a step ($rows rows x $m micro-batches), bf16: --offload optimizer against FSDP with CPU offload"
    ours_line="" torch_line=""
    for run in ${FSDP_RUNS:-ours torch}; do
        case $run in
            ours) ours fsdp_ours "$rows" -- "${SHAPE_6_6B[@]}" --offload optimizer; ours_line=$RESULT_LINE ;;
            torch)
                $PY -m torch.distributed.run --standalone --nproc-per-node 1 bench/bench_pytorch_parallel.py --mode fsdp --cpu-offload 1 \
                    "${SHAPE_6_6B[@]}" -b "$rows" --microbatches "$m" --steps "$steps" --warmup 1 > "$W/fsdp_torch.log" 2>&1
                torch_line=$(grep -m1 '^RESULT' "$W/fsdp_torch.log")
                echo "fsdp_torch: ${torch_line:-no result: $(tail -n 1 "$W/fsdp_torch.log")}" ;;
            *) echo "bench_offload: FSDP_RUNS takes ours and torch, got '$run'" >&2; exit 2 ;;
        esac
    done
    ratio "fsdp: ours / PyTorch FSDP with CPU offload" "$ours_line" "$torch_line"
fi

if [[ " $SECTIONS " == *" large "* ]]; then
    gpus=${LARGE_GPUS:-4}; rows=${LARGE_ROWS:-2}; m=$(micro_steps "$rows" LARGE_ROWS) || exit 2
    [ $((m % gpus)) -eq 0 ] || { echo "bench_offload: $m micro-batches a step do not divide over LARGE_GPUS $gpus" >&2; exit 2; }
    echo "== large: 30B GPT on $gpus x $gpu, ZeRO-3 + --offload optimizer, $tokens tokens a step ($rows rows x $((m / gpus)) micro-steps a GPU), bf16"
    ours large_30b "$rows" scripts/launch.sh "$gpus" -- --layers 60 --channels 6656 --heads 52 --zero-stage 3 --offload optimizer
fi
