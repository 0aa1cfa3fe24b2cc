#!/usr/bin/env bash
# Per-kernel profile of one training step of train_gpt (GPT-2 124M by default, bf16, T=1024) with Nsight
# Compute: each kernel's time, share of the step, DRAM bytes and achieved bandwidth, summed by kernel name.
# The second of two steps is reported (the first includes one-time work).
# Then the same training unprofiled, with the SM clock sampled, to compare the step with its kernel time.
# Usage: bench/profile_step.sh [batch] [extra train_gpt flags...]   (default batch 64)
# Needs ncu with access to the hardware counters (Firecracker machines; not gVisor).
# Under ncu the default's autotuning times its candidate products through ncu's serialized replays, so the
# products a profiled run picks can differ from an unprofiled run's; --deterministic 1 profiles cuBLASLt's first choices.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-64}; shift || true
W=build/profile; mkdir -p "$W"
PY=${PYTHON:-python3}
make -s train_gpt
[ -f "$W/random.bin" ] || $PY scripts/reference/gpt2_reference.py make-shard --out "$W/random.bin" --tokens 2000000 > /dev/null
# no cache flush and no clock locking: kernels run as in training; both metrics come from one pass
ncu --clock-control none --cache-control none --csv --page raw --print-units base --metrics gpu__time_duration.sum,dram__bytes.sum \
    ./train_gpt --model d12 --train-data "$W/random.bin" --val-every 0 --sample-every 0 --batch-size "$B" --seq-len 1024 \
    --steps 2 --precision bf16 "$@" > "$W/ncu.csv" 2> "$W/ncu.err" || { tail -n 5 "$W/ncu.err"; exit 1; }
$PY bench/summarize_profile.py "$W/ncu.csv"
# The same training without the profiler, with the SM clock and power sampled every 100 ms: a step longer than
# its kernels' sum above is host time between kernels, or clocks lower under sustained load than in ncu's replays.
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv,noheader,nounits -lms 100 > "$W/clocks.csv" &
sampler=$!
./train_gpt --model d12 --train-data "$W/random.bin" --val-every 0 --sample-every 0 --batch-size "$B" --seq-len 1024 \
    --steps 20 --precision bf16 "$@" > "$W/run.log" 2>&1 || { kill $sampler; tail -n 3 "$W/run.log"; exit 1; }
kill $sampler
grep '^RESULT' "$W/run.log"
# samples while a step ran at full load (the upper half of the power readings)
sort -t, -k3 -n "$W/clocks.csv" | awk -F', *' '{ p[NR] = $3; c[NR] = $1; m = $2 } END {
    n = 0; s = 0; for (i = int(NR / 2) + 1; i <= NR; i++) { s += c[i]; n++ }
    if (n) printf "SM clock under load: %.0f MHz (max %s MHz), mean of the %d busiest samples\n", s / n, m, n }'
