#!/usr/bin/env bash
# ZeRO-Offload benchmark on the GPU machine; sections chosen by SECTIONS (default "cpu_adam single"):
#   cpu_adam  the CPU AdamW of --offload (build/bench_adamw_cpu: bf16 with fp32 master weights, and fp32) against
#             a pass over the same bytes with one add an element (the memory system's limit), and against PyTorch's
#             CPU AdamW (bench/bench_pytorch_adamw_cpu.py: foreach and fused, fp32), on the same cores: ours / limit
#             and ours / the faster PyTorch, both counting 28 bytes an element.
#   single    the 6.6B GPT (32 layers, C=4096, 32 heads, T=1024) on one GPU with steps of TOKENS tokens (default
#             524,288: ROWS rows a micro-batch, accumulated), VARIANTS of them (default both): resident (on the
#             GPU) and offload (--offload optimizer); random tokens: tokens/s, MFU, peak GPU memory, the host plan line, and
#             offload / resident. A run the memory plan refuses (the resident states of 6.6B need 106 GB: more than
#             an 80 GB GPU) prints the refusal and the ratio is left out.
# Each train_gpt result is its RESULT line: the median step after 3 warm-up steps of STEPS + 3.
# Usage: SECTIONS="cpu_adam" bench/bench_offload.sh
#   ELEMENTS (cpu_adam, default 2^28), THREADS (default: every core), REPS (default 5);
#   TOKENS, ROWS (default 4), STEPS (default 2), VARIANTS, OURS_FLAGS (more train_gpt flags, e.g. "--recompute 1");
#   PYTHON: the interpreter with torch (default python3). Work files go to build/bench_offload.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
W=build/bench_offload; mkdir -p "$W"
PY=${PYTHON:-python3}
SECTIONS=${SECTIONS:-cpu_adam single}
THREADS=${THREADS:-$(nproc)}
kv() { tr ' ' '\n' <<< "$1" | grep "^$2=" | head -n 1 | cut -d= -f2; }
for s in $SECTIONS; do
    case $s in cpu_adam|single) ;; *) echo "bench_offload: SECTIONS takes cpu_adam and single, got '$s'" >&2; exit 2 ;; esac
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

if [[ " $SECTIONS " == *" single "* ]]; then
    make -s train_gpt || exit 1
    T=1024; rows=${ROWS:-4}; tokens=${TOKENS:-524288}; steps=${STEPS:-2}
    [ $((tokens % (rows * T))) -eq 0 ] || { echo "bench_offload: TOKENS ($tokens) must be a multiple of ROWS x 1024 ($((rows * T)))" >&2; exit 2; }
    [ -f "$W/random.bin" ] || $PY scripts/reference/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 4000000 > /dev/null || exit 1
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    echo "== single: 6.6B GPT on one $gpu, $tokens tokens a step ($rows rows x $((tokens / rows / T)) micro-steps), bf16, $steps timed steps"
    declare -A flags_of=([resident]="" [offload]="--offload optimizer")
    declare -A result
    for name in ${VARIANTS:-resident offload}; do
        [ -n "${flags_of[$name]+set}" ] || { echo "bench_offload: VARIANTS takes resident and offload, got '$name'" >&2; exit 2; }
        flags=${flags_of[$name]}
        # shellcheck disable=SC2086
        ./train_gpt --model d48 --layers 32 --channels 4096 --heads 32 --train-data "$W/random.bin" --val-every 0 --sample-every 0 \
            --seq-len $T --batch-size "$rows" --total-batch-tokens "$tokens" --precision bf16 --steps $((steps + 3)) $flags \
            ${OURS_FLAGS:-} > "$W/single_$name.log" 2>&1
        result[$name]=$(grep -m1 '^RESULT' "$W/single_$name.log")
        if [ -n "${result[$name]}" ]; then
            echo "single $name: ${result[$name]#RESULT }"
            grep -m1 '^host memory per rank' "$W/single_$name.log"
        else
            echo "single $name: no result: $(grep -m1 -iE 'error|out of memory' "$W/single_$name.log" || tail -n 1 "$W/single_$name.log")"
        fi
    done
    for name in offload; do
        [ -n "${result[$name]:-}" ] && [ -n "${result[resident]:-}" ] &&
            awk -v a="$(kv "${result[$name]}" tokens_per_s)" -v b="$(kv "${result[resident]}" tokens_per_s)" -v n="$name" \
                'BEGIN { printf "single: %s / resident = %.3f\n", n, a / b }'
    done
fi
