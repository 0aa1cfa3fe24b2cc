#!/usr/bin/env bash
# Training runs on the GPU: bitwise determinism (same seed twice), bitwise resume (from a checkpoint vs the
# uninterrupted run) in fp32, bf16 and fp16, a damaged newest checkpoint skipped on resume, stops for a signal and their
# bitwise resume, --recompute levels (bitwise equal losses, less activation memory), non-finite steps, ZeRO-Offload on
# one GPU (bitwise the GPU-resident run, resumed across offload and not; its NVMe tier bitwise it and resumed across it;
# its one-step delayed update against it, resumed, and twice), checkpoint retention, resume checks, the memory plan's
# refusals, and loss-curve parity with the PyTorch reference (200 steps of d12 in bf16, B=16, T=512, lr 1e-4, from the
# same initial model file and batches, within 3e-2 at every step; PARITY_* variables change the setting; plotted to
# build/test_work/training/curve_parity.png).
# The quick tier (TEST_TIER=quick) runs bf16 only: resume and the damaged checkpoint (not the same-seed rerun),
# --recompute 3, the non-finite steps, the delayed update in fp32 against offload (ZeRO-Offload's one quick run here:
# test_model's quick tier checks the host's steps bitwise the GPU's in every precision, test_offload_dir the NVMe
# tier's file), and LoRA, retention and the refusals as in full; the full tier adds fp32 and fp16, the same seed twice,
# the stops for a signal (the quick tier's stop is test_zero's SIGTERM to one rank of 2), --recompute 1 and 2, the
# activation sizes of d12, offload against the resident run in fp32, bf16 and fp16 with its resume chain and
# non-finite steps, --offload-dir in fp32 and bf16 with its resume chain, the delayed update resumed, in bf16 and
# twice, a Llama-family model's resume, same-seed rerun, recompute levels and offload, and the curve parity.
# The LoRA and non-finite runs, independent of the others, go beside them on the GPU.
set -u
cd "$(dirname "$0")/.."
source test/watchdog.sh  # watchdog, watchdog_off
W=build/test_work/training
rm -rf "$W"; mkdir -p "$W"
PY=${PYTHON:-python3}
TIER=${TEST_TIER:-full}
PRECISIONS=$([ "$TIER" = full ] && echo fp32 bf16 fp16 || echo bf16)
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
[ -n "$(ls $TRAIN 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL training data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
# --deterministic 1: bitwise comparisons need the fixed attention sums and cuBLASLt's first choices (the default
# times the candidates, so its choice can change from run to run)
SMALL=(--layers 4 --heads 4 --channels 256 --max-seq-len 256 --seq-len 256 --batch-size 8 --train-data "$TRAIN"
       --val-every 10 --val-batches 2 --sample-every 0 --lr 1e-3 --warmup-steps 5 --seed 7 --shuffle 1 --deterministic 1)

train_log_lines() { grep -v '^#' "$1/log.txt" | cut -d' ' -f1-2; }  # step and loss (%.9g: every bit)

# LoRA: fine-tune adapters, save them, merge them; the merged model equals the reference's merge of the same
# files (fp32: within 1e-6 relative, both sum the product in double and round once)
lora_checks() {
    ./train_gpt "${SMALL[@]}" --precision fp32 --steps 10 --checkpoint-every 10 -o "$W/lora_base" > "$W/lora_base.out" 2>&1
    ./train_gpt --model "$W/lora_base/model_00000010.bin" --train-data "$TRAIN" --seq-len 256 --batch-size 8 --val-every 0 \
        --sample-every 0 --precision fp32 --steps 10 --lr 1e-3 --lora-rank 8 --lora-targets qkv,fc-proj \
        --lora-save "$W/lora_adapters.bin" --lora-merge "$W/lora_merged.bin" > "$W/lora.out" 2>&1
    if grep -q "trainable parameters" "$W/lora.out" && [ -f "$W/lora_adapters.bin" ] && \
       $PY scripts/reference/gpt2_reference.py export-merged --model "$W/lora_base/model_00000010.bin" --lora "$W/lora_adapters.bin" \
           --out "$W/lora_merged_ref.bin" > /dev/null 2>&1 && \
       $PY - "$W/lora_merged.bin" "$W/lora_merged_ref.bin" <<'PY'
import sys, numpy as np
a, b = (np.fromfile(p, dtype=np.float32, offset=1024) for p in sys.argv[1:3])
sys.exit(0 if a.shape == b.shape and np.abs(a - b).max() <= 1e-6 * np.abs(b).max() else 1)
PY
    then
        echo "PASS training LoRA fine-tune: adapters saved; --lora-merge equals the reference's merge ($(grep -m1 -o '[0-9]* trainable parameters' "$W/lora.out"))"
    else
        echo "FAIL training LoRA fine-tune/merge: $(grep -m1 error "$W/lora.out")"
    fi
}
# Non-finite steps: --lr 1e4 drives the loss to NaN within a few steps. In every precision each such step is
# skipped and counted in the step log, and after --max-skipped-steps 3 in a row the run stops with exit 1, naming
# the step and the newest checkpoint.
nonfinite_checks() {
    for p in $PRECISIONS; do
        ./train_gpt "${SMALL[@]}" --precision $p --lr 1e4 --warmup-steps 0 --steps 40 --val-every 0 --checkpoint-every 2 \
            --max-skipped-steps 3 -o "$W/nan-$p" > "$W/nan-$p.out" 2> "$W/nan-$p.err"; rc=$?
        newest=$(ls "$W/nan-$p"/model_*.bin 2> /dev/null | sort | tail -n 1)
        if [ $rc -ne 0 ] && grep -q "3 steps in a row .* had a non-finite loss or gradient norm" "$W/nan-$p.err" && [ -n "$newest" ] \
            && grep -qF "the newest checkpoint is $newest" "$W/nan-$p.err" && grep -q "skipped 3 (this step: non-finite" "$W/nan-$p.out"; then
            echo "PASS training $p non-finite steps: skipped, counted, and the run stops after 3 in a row naming $(basename "$newest")"
        else
            echo "FAIL training $p non-finite steps: rc=$rc: $(tail -n 1 "$W/nan-$p.err") / $(grep -m1 skipped "$W/nan-$p.out")"
        fi
    done
}
# both independent of the runs before them: started beside them, their lines printed when waited for
{ lora_checks; nonfinite_checks; } > "$W/side.checks" 2>&1 &
side_runs=$!

for p in $PRECISIONS; do
    ./train_gpt "${SMALL[@]}" --precision $p --steps 20 --checkpoint-every 10 -o "$W/$p-a" > "$W/$p-a.out" 2>&1 \
        || { echo "FAIL training $p: $(tail -n 1 "$W/$p-a.out")"; continue; }
    if [ "$TIER" = full ]; then
        ./train_gpt "${SMALL[@]}" --precision $p --steps 20 -o "$W/$p-b" > "$W/$p-b.out" 2>&1
        if [ "$(train_log_lines "$W/$p-a")" == "$(train_log_lines "$W/$p-b")" ] && [ "$(train_log_lines "$W/$p-a" | wc -l)" -eq 20 ]; then
            echo "PASS training $p same seed twice: 20 losses bitwise equal"
        else
            echo "FAIL training $p same seed twice: losses differ"; diff <(train_log_lines "$W/$p-a") <(train_log_lines "$W/$p-b") | head -4
        fi
    fi
    # resume from the step-10 checkpoint of run a, in a fresh folder
    mkdir -p "$W/$p-r"
    cp "$W/$p-a"/*_00000010* "$W/$p-r/"
    ./train_gpt "${SMALL[@]}" --precision $p --steps 20 --checkpoint-every 10 -o "$W/$p-r" --resume 1 > "$W/$p-r.out" 2>&1
    expected=$(train_log_lines "$W/$p-a" | awk '$1 >= 10')
    if grep -q "resumed from" "$W/$p-r.out" && [ "$expected" == "$(train_log_lines "$W/$p-r")" ]; then
        echo "PASS training $p resume at step 10: steps 10-19 bitwise equal to the uninterrupted run"
    else
        echo "FAIL training $p resume: $(tail -n 1 "$W/$p-r.out")"; diff <(echo "$expected") <(train_log_lines "$W/$p-r") | head -4
    fi
    if cmp -s -i 1024 "$W/$p-a/model_00000020.bin" "$W/$p-r/model_00000020.bin"; then
        echo "PASS training $p resume: final model file bitwise equal"
    else
        echo "FAIL training $p resume: final model files differ"
    fi
    # a damaged newest checkpoint (one byte of its state file changed after its header): the load's checksum finds it;
    # set aside with a line naming the file and the rank (the rank's line gives the checksums), the step-10 one loaded
    # over it, and the run continues as the uninterrupted one
    mkdir -p "$W/$p-d"
    cp "$W/$p-a"/*_000000[12]0* "$W/$p-d/"
    python3 -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(3000); b = f.read(1); f.seek(3000); f.write(bytes([b[0] ^ 1]))" \
        "$W/$p-d/state_00000020_00000.bin"
    ./train_gpt "${SMALL[@]}" --precision $p --steps 20 --checkpoint-every 10 -o "$W/$p-d" --resume 1 > "$W/$p-d.out" 2>&1
    if grep -q "^--resume 1: set checkpoint 20 aside as \*.damaged: the load found damaged: state_00000020_00000.bin (rank 0)" "$W/$p-d.out" &&
        grep -q "^rank 0: checkpoint 20: $W/$p-d/state_00000020_00000.bin: checksum mismatch" "$W/$p-d.out" &&
        grep -q "resumed from $W/$p-d/manifest_00000010.txt" "$W/$p-d.out" && [ "$expected" == "$(train_log_lines "$W/$p-d")" ] &&
        [ -f "$W/$p-d/state_00000020_00000.bin.damaged" ] && cmp -s -i 1024 "$W/$p-a/model_00000020.bin" "$W/$p-d/model_00000020.bin"; then
        echo "PASS training $p resume past a damaged checkpoint: step 20's set aside as *.damaged (named), steps 10-19 and the model file bitwise equal"
    else
        echo "FAIL training $p resume past a damaged checkpoint: $(grep -m1 -E 'aside|error' "$W/$p-d.out")"
    fi
done

# Stop signals (docs/reliability.md): a signal after step 7 of 20 (that step's line seen, then the signal) stops the
# run at the end of a step with its checkpoint, one line naming the signal, the step and the file, and exit status
# 75; --resume 1 then finishes the run, and its steps, losses and final model file equal the uninterrupted run's bit
# for bit. 16 micro-steps a step keep a step long enough for the signal to land mid-run. Full tier: SIGTERM, SIGUSR1,
# SIGINT twice (the second ends the run at once: status 130, no checkpoint) and SIGTERM while a checkpoint is being
# written (the save finishes first; the run stops after the next step). The quick tier's stop is test_zero's.
STOP=("${SMALL[@]}" --precision bf16 --steps 20 --total-batch-tokens $((8 * 256 * 16)) --checkpoint-every 10)
if [ "$TIER" = full ]; then
    ./train_gpt "${STOP[@]}" -o "$W/stop-ref" > "$W/stop-ref.out" 2>&1 || echo "FAIL training stop signals: the uninterrupted run: $(tail -n 1 "$W/stop-ref.out")"
fi
# interrupt NAME WHEN GAP SIGNAL... -- ARGS: runs train_gpt ARGS (stdout and stderr, in order, in $W/NAME.out); once
# the shell test WHEN holds (polled every 10 ms) sends each SIGNAL, GAP seconds apart; sets rc and `sent` (the
# signals sent, which a run that ended too early did not get)
interrupt() {
    local name=$1 when=$2 gap=$3; shift 3
    local signals=() sig
    while [ "$1" != "--" ]; do signals+=("$1"); shift; done; shift
    ./train_gpt "$@" > "$W/$name.out" 2>&1 & local pid=$!
    for _ in $(seq 30000); do eval "$when" && break; kill -0 $pid 2> /dev/null || break; sleep 0.01; done
    sent=""
    for sig in "${signals[@]}"; do kill -s "$sig" $pid 2> /dev/null && sent="$sent $sig"; sleep "$gap"; done
    watchdog 300 $pid
    wait $pid; rc=$?
    watchdog_off
}
step_line() { grep -qF "$(printf 'step %5d/' "$2")" "$W/$1.out"; }  # step_line NAME N: step N's line is out
# stop_and_resume SIGNAL: SIGNAL after step 7 of the STOP run, then --resume 1, against the uninterrupted run
stop_and_resume() {
    local sig=$1 name=stop-$1 line at
    interrupt "$name" "step_line $name 7" 0 "$sig" -- "${STOP[@]}" -o "$W/$name"
    line=$(grep -m1 '^stopped by' "$W/$name.out")
    at=$(printf '%s' "$line" | sed -nE 's|^stopped by [A-Z0-9]+ after step ([0-9]+)/20: .*|\1|p')
    if [ $rc -eq 75 ] && [ -n "$at" ] && [ "$at" -ge 7 ] && [ "$at" -lt 20 ] && [ -f "$W/$name/model_$(printf %08d "$at").bin" ] &&
        printf '%s' "$line" | grep -qF "stopped by $sig after step $at/20: committed checkpoint $W/$name/manifest_$(printf %08d "$at").txt" &&
        [ "$(train_log_lines "$W/$name" | wc -l)" -eq "$at" ]; then
        echo "PASS training $sig after step 7: the run stops at the end of step $at with its checkpoint, exit status 75: $line"
    else
        echo "FAIL training $sig after step 7 (sent:$sent): exit $rc, '${line:-no stop line}': $(tail -n 1 "$W/$name.out")"
        return
    fi
    ./train_gpt "${STOP[@]}" -o "$W/$name" --resume 1 > "$W/$name-resume.out" 2>&1; rc=$?
    if [ $rc -eq 0 ] && [ "$(train_log_lines "$W/stop-ref")" == "$(train_log_lines "$W/$name")" ] &&
        [ "$(train_log_lines "$W/$name" | wc -l)" -eq 20 ] && cmp -s -i 1024 "$W/stop-ref/model_00000020.bin" "$W/$name/model_00000020.bin"; then
        echo "PASS training $sig, then --resume 1: steps 0-19, their losses and the final model file bitwise equal to the uninterrupted run"
    else
        echo "FAIL training $sig, then --resume 1: exit $rc: $(tail -n 1 "$W/$name-resume.out")"
        diff <(train_log_lines "$W/stop-ref") <(train_log_lines "$W/$name") | head -4
    fi
}
if [ "$TIER" = full ]; then
    stop_and_resume SIGTERM
    stop_and_resume SIGUSR1
    # SIGINT, then SIGINT 5 ms later (taken apart, within the step): the second ends the run at once
    interrupt stop-int-twice "step_line stop-int-twice 7" 0.005 SIGINT SIGINT -- "${STOP[@]}" -o "$W/stop-int-twice"
    if [ $rc -eq 130 ] && grep -q "^SIGINT while stopping: stopping at once, without a checkpoint" "$W/stop-int-twice.out" &&
        ! grep -q '^stopped by' "$W/stop-int-twice.out" && [ -z "$(ls "$W/stop-int-twice"/model_* 2> /dev/null)" ]; then
        echo "PASS training SIGINT twice: the second ends the run at once (status 130), without a checkpoint"
    else
        echo "FAIL training SIGINT twice (sent:$sent): exit $rc: $(tail -n 2 "$W/stop-int-twice.out" | tr '\n' ' ')"
    fi
    # SIGTERM while the step-2 checkpoint is being written (d6: 360 MB of optimizer state; its temporary file seen):
    # the signal's note comes before the save's line, the save completes, and the run stops after the next step
    SAVE=(--model d6 --max-seq-len 256 --seq-len 256 --batch-size 8 --train-data "$TRAIN" --val-every 0 --sample-every 0
          --steps 6 --checkpoint-every 2 --deterministic 1)
    interrupt stop-save "[ -e $W/stop-save/state_00000002_00000.bin.tmp ]" 0 SIGTERM -- "${SAVE[@]}" -o "$W/stop-save"
    noted=$(grep -n -m1 '^SIGTERM: stopping after the current step' "$W/stop-save.out" | cut -d: -f1)
    saved=$(grep -n -m1 "^wrote checkpoint $W/stop-save/model_00000002.bin" "$W/stop-save.out" | cut -d: -f1)
    size() { stat -c %s "$W/stop-save/$1" 2> /dev/null; }
    if [ $rc -eq 75 ] && [ -n "$noted" ] && [ -n "$saved" ] && [ "$noted" -lt "$saved" ] &&
        grep -q "^stopped by SIGTERM after step 3/6: committed checkpoint $W/stop-save/manifest_00000003.txt" "$W/stop-save.out" &&
        [ -n "$(size model_00000002.bin)" ] && [ "$(size model_00000002.bin)" = "$(size model_00000003.bin)" ] &&
        [ -n "$(size state_00000002_00000.bin)" ] && [ "$(size state_00000002_00000.bin)" = "$(size state_00000003_00000.bin)" ] &&
        [ -z "$(ls "$W/stop-save"/*.tmp 2> /dev/null)" ]; then
        echo "PASS training SIGTERM during a checkpoint's save: the save completes, the run stops after the next step with its checkpoint"
    else
        echo "FAIL training SIGTERM during a save (sent:$sent): exit $rc, note at line ${noted:-none}, step-2 save at line ${saved:-none}: $(tail -n 1 "$W/stop-save.out")"
    fi
fi

# --recompute: the backward recomputes what it did not keep with the forward's deterministic kernels, so the
# losses must equal the run that kept everything, bit for bit, while the activation memory falls. Levels 1-2
# keep the GELU out of the fc product (--gelu-fusion has no effect there), so their reference run is the
# unfused one; level 3 recomputes the fused product itself (its reference: run a, bf16).
[ "$TIER" = full ] && ./train_gpt "${SMALL[@]}" --precision bf16 --steps 20 --gelu-fusion 0 -o "$W/unfused" > "$W/unfused.out" 2>&1
for r in $([ "$TIER" = full ] && echo 1 2) 3; do
    ./train_gpt "${SMALL[@]}" --precision bf16 --steps 20 --recompute $r -o "$W/recompute$r" > "$W/recompute$r.out" 2>&1
    reference=$([ $r -lt 3 ] && echo unfused || echo bf16-a)
    if [ "$(train_log_lines "$W/$reference")" == "$(train_log_lines "$W/recompute$r")" ] && [ "$(train_log_lines "$W/recompute$r" | wc -l)" -eq 20 ]; then
        echo "PASS training recompute $r: 20 bf16 losses bitwise equal to keeping every activation ($reference run)"
    else
        echo "FAIL training recompute $r: losses differ from --recompute 0 ($reference run): $(grep -m1 error "$W/recompute$r.out")"
    fi
done
# activation memory of d12 at B=8, T=1024 (allocation only) for each level (full tier)
if [ "$TIER" = full ]; then
    activations() { grep -o 'activations [0-9.]*' "$1" | awk '{print $2}'; }
    for r in 0 1 2 3; do
        ./train_gpt --model d12 --batch-size 8 --seq-len 1024 --steps 0 --val-every 0 --sample-every 0 --train-data "$TRAIN" \
            --recompute $r > "$W/memory$r.out" 2>&1
    done
    sizes=$(for r in 0 1 2 3; do activations "$W/memory$r.out"; done | tr '\n' ' ')
    if echo "$sizes" | awk '{ exit !(NF == 4 && $1 > $2 && $2 > $3 && $3 > $4) }'; then
        echo "PASS training recompute levels 0-3 shrink d12's activations (B=8, T=1024): $sizes GiB"
    else
        echo "FAIL training recompute levels do not shrink the activations: $sizes"
    fi
fi

wait $side_runs
cat "$W/side.checks"


# ZeRO-Offload on one GPU (--offload optimizer): master weights and Adam moments in pinned host memory, AdamW on the
# CPU, which is the kernel's arithmetic bit for bit (stochastic rounding included), so the run is the GPU-resident
# run's: 20 losses bitwise equal (--deterministic 1), the final model files and the optimizer-state files (the same
# format) byte for byte, and the start-up line of the host memory. fp32, bf16 and fp16 in the full tier (the quick
# tier's offload: the delayed update's runs below).
for p in $([ "$TIER" = full ] && echo fp32 bf16 fp16); do
    ./train_gpt "${SMALL[@]}" --precision $p --steps 20 --checkpoint-every 5 -o "$W/resident-$p" > "$W/resident-$p.out" 2>&1
    ./train_gpt "${SMALL[@]}" --precision $p --steps 20 --checkpoint-every 5 --offload optimizer -o "$W/offload-$p" > "$W/offload-$p.out" 2>&1
    if grep -q "^host memory per rank (GiB, pinned): master weights" "$W/offload-$p.out" && [ "$(train_log_lines "$W/offload-$p" | wc -l)" -eq 20 ] &&
        [ "$(train_log_lines "$W/resident-$p")" == "$(train_log_lines "$W/offload-$p")" ] &&
        cmp -s -i 1024 "$W/resident-$p/model_00000020.bin" "$W/offload-$p/model_00000020.bin" &&
        cmp -s -i 1024 "$W/resident-$p/state_00000020_00000.bin" "$W/offload-$p/state_00000020_00000.bin"; then
        echo "PASS training $p offload optimizer: 20 losses, the final model file and the optimizer state bitwise equal to the GPU-resident run"
    else
        echo "FAIL training $p offload optimizer: $(grep -m1 error "$W/offload-$p.out")"; diff <(train_log_lines "$W/resident-$p") <(train_log_lines "$W/offload-$p") | head -4
    fi
done
# The NVMe tier (--offload-dir): the master weights and Adam moments in a file, read and written tile by tile (this
# model's 16.1M parameters: 3 tiles of 2^22 and a partial one) by the I/O thread, so the run is --offload optimizer's bit
# for bit: 20 losses, the final model file and the optimizer state; the start-up lines of the file and the disk, the
# end-of-run line of its I/O, and no file left. fp32 and bf16 in the full tier, with bf16's resume chain --offload-dir
# -> --offload optimizer -> --offload-dir against the uninterrupted run.
mkdir -p "$W/offload_dir"
for p in $([ "$TIER" = full ] && echo fp32 bf16); do
    ./train_gpt "${SMALL[@]}" --precision $p --steps 20 --checkpoint-every 5 --offload optimizer --offload-dir "$W/offload_dir" -o "$W/offload-dir-$p" \
        > "$W/offload-dir-$p.out" 2>&1
    if grep -q "^disk per rank (GiB, --offload-dir $W/offload_dir): optimizer file" "$W/offload-dir-$p.out" &&
        grep -q "^optimizer file $W/offload_dir/optimizer_rank0.bin: .* GiB preallocated, 4 tiles" "$W/offload-dir-$p.out" &&
        grep -q "^optimizer file: .* GB read and .* GB written a step over 20 steps" "$W/offload-dir-$p.out" && [ -z "$(ls -A "$W/offload_dir")" ] &&
        [ "$(train_log_lines "$W/offload-dir-$p" | wc -l)" -eq 20 ] && [ "$(train_log_lines "$W/offload-$p")" == "$(train_log_lines "$W/offload-dir-$p")" ] &&
        cmp -s -i 1024 "$W/offload-$p/model_00000020.bin" "$W/offload-dir-$p/model_00000020.bin" &&
        cmp -s -i 1024 "$W/offload-$p/state_00000020_00000.bin" "$W/offload-dir-$p/state_00000020_00000.bin"; then
        echo "PASS training $p offload-dir: 20 losses, the final model file and the optimizer state bitwise equal to --offload optimizer, the file removed"
    else
        echo "FAIL training $p offload-dir: $(grep -m1 error "$W/offload-dir-$p.out") left: $(ls "$W/offload_dir" | tr '\n' ' ')"
        diff <(train_log_lines "$W/offload-$p") <(train_log_lines "$W/offload-dir-$p") | head -4
    fi
done
if [ "$TIER" = full ]; then
    # resume --offload-dir -> --offload optimizer -> --offload-dir: the checkpoints are the same format either way
    mkdir -p "$W/offload-dir-chain-host" "$W/offload-dir-chain-disk"
    cp "$W/offload-dir-bf16"/*_00000005* "$W/offload-dir-chain-host/"
    ./train_gpt "${SMALL[@]}" --precision bf16 --steps 20 --checkpoint-every 5 --offload optimizer -o "$W/offload-dir-chain-host" --resume 1 \
        > "$W/offload-dir-chain-host.out" 2>&1
    cp "$W/offload-dir-chain-host"/*_00000010* "$W/offload-dir-chain-disk/"
    ./train_gpt "${SMALL[@]}" --precision bf16 --steps 20 --checkpoint-every 5 --offload optimizer --offload-dir "$W/offload_dir" \
        -o "$W/offload-dir-chain-disk" --resume 1 > "$W/offload-dir-chain-disk.out" 2>&1
    if [ "$(train_log_lines "$W/offload-bf16" | awk '$1 >= 5')" == "$(train_log_lines "$W/offload-dir-chain-host")" ] &&
        [ "$(train_log_lines "$W/offload-bf16" | awk '$1 >= 10')" == "$(train_log_lines "$W/offload-dir-chain-disk")" ] &&
        [ "$(train_log_lines "$W/offload-dir-chain-disk" | wc -l)" -eq 10 ] &&
        cmp -s -i 1024 "$W/offload-bf16/model_00000020.bin" "$W/offload-dir-chain-disk/model_00000020.bin" &&
        cmp -s -i 1024 "$W/offload-bf16/state_00000020_00000.bin" "$W/offload-dir-chain-disk/state_00000020_00000.bin"; then
        echo "PASS training bf16 resume offload-dir -> offload -> offload-dir: steps 5-19, the final model file and optimizer state bitwise equal to the uninterrupted run"
    else
        echo "FAIL training bf16 resume offload-dir -> offload -> offload-dir: $(grep -m1 error "$W/offload-dir-chain-host.out" "$W/offload-dir-chain-disk.out")"
    fi
fi
if [ "$TIER" = full ]; then
    # resume offload -> GPU-resident -> offload: the offloaded run's step-5 checkpoint continues without offload, whose
    # step-10 checkpoint continues with it; both continuations equal the uninterrupted resident run bit for bit
    mkdir -p "$W/offload-chain-gpu" "$W/offload-chain-host"
    cp "$W/offload-bf16"/*_00000005* "$W/offload-chain-gpu/"
    ./train_gpt "${SMALL[@]}" --precision bf16 --steps 20 --checkpoint-every 5 -o "$W/offload-chain-gpu" --resume 1 > "$W/offload-chain-gpu.out" 2>&1
    cp "$W/offload-chain-gpu"/*_00000010* "$W/offload-chain-host/"
    ./train_gpt "${SMALL[@]}" --precision bf16 --steps 20 --checkpoint-every 5 --offload optimizer -o "$W/offload-chain-host" --resume 1 \
        > "$W/offload-chain-host.out" 2>&1
    if [ "$(train_log_lines "$W/resident-bf16" | awk '$1 >= 5')" == "$(train_log_lines "$W/offload-chain-gpu")" ] &&
        [ "$(train_log_lines "$W/resident-bf16" | awk '$1 >= 10')" == "$(train_log_lines "$W/offload-chain-host")" ] &&
        [ "$(train_log_lines "$W/offload-chain-host" | wc -l)" -eq 10 ] &&
        cmp -s -i 1024 "$W/resident-bf16/model_00000020.bin" "$W/offload-chain-host/model_00000020.bin"; then
        echo "PASS training bf16 resume offload -> GPU -> offload: steps 5-19 and the final model file bitwise equal to the uninterrupted run"
    else
        echo "FAIL training bf16 resume offload -> GPU -> offload: $(grep -m1 error "$W/offload-chain-gpu.out" "$W/offload-chain-host.out")"
    fi
    # non-finite steps under offload: the host's update skips the same steps as the GPU's, with the same log and stop
    ./train_gpt "${SMALL[@]}" --precision bf16 --lr 1e4 --warmup-steps 0 --steps 40 --val-every 0 --checkpoint-every 2 \
        --max-skipped-steps 3 --offload optimizer -o "$W/nan-offload" > "$W/nan-offload.out" 2> "$W/nan-offload.err"; rc=$?
    nan_log() { grep -v '^#' "$1/log.txt" | cut -d' ' -f1-4; }  # step, loss, lr, norm
    if [ $rc -ne 0 ] && [ "$(nan_log "$W/nan-bf16")" == "$(nan_log "$W/nan-offload")" ] && [ "$(sed 's|/nan-offload/|/nan-bf16/|' "$W/nan-offload.err")" == "$(cat "$W/nan-bf16.err")" ]; then
        echo "PASS training bf16 offload non-finite steps: the same steps skipped, the same log and the same stop as the GPU's update"
    else
        echo "FAIL training bf16 offload non-finite steps: rc=$rc: $(tail -n 1 "$W/nan-offload.err")"
    fi
fi

# ZeRO-Offload's one-step delayed update (--offload-delayed-update 1): the CPU's AdamW of step N runs while the GPU
# computes step N+1 on the parameters without it. Against the non-delayed offload run at the same --lr 3e-4 (at 1e-3
# this small model, 2,048 tokens a step, spikes under the stale update): the 5 warm-up steps' updates land within
# their step, so steps 0-5 are its bit for bit, and step 6, whose forward misses step 5's update, differs; the mean
# loss of steps 15-19 within 5% of its (the run trails by about one update) and at least 1 below step 0's (it
# trains: an update lost or applied twice fails one or the other). Its step-10 checkpoint (where the running update
# landed) resumes bit for bit. fp32 in the quick tier, without the resume; the full tier adds the resume, bf16 and the
# same run twice (bitwise the same losses, model file and optimizer state).
mean_of_last_five() { train_log_lines "$1" | awk '$1 >= 15 { s += $2; n++ } END { if (n == 5) printf "%.6f", s / n }'; }
for p in fp32 $([ "$TIER" = full ] && echo bf16); do
    D="$W/delayed-$p" ref="$W/delayed-ref-$p"
    DELAYED=(--precision $p --lr 3e-4 --steps 20 --checkpoint-every 10 --offload optimizer --offload-delayed-update 1)
    # the two runs side by side (each its own folder)
    ./train_gpt "${SMALL[@]}" --precision $p --lr 3e-4 --steps 20 --offload optimizer -o "$ref" > "$ref.out" 2>&1 & ref_run=$!
    ./train_gpt "${SMALL[@]}" "${DELAYED[@]}" -o "$D" > "$D.out" 2>&1
    wait $ref_run
    six_ref=$(train_log_lines "$ref" | awk '$1 == 6') six=$(train_log_lines "$D" | awk '$1 == 6')
    if grep -q "^host memory per rank (GiB, pinned): .* | gradients .*delayed one step after the 5 warm-up steps" "$D.out" &&
        [ "$(train_log_lines "$D" | wc -l)" -eq 20 ] && [ "$(train_log_lines "$ref" | awk '$1 <= 5')" == "$(train_log_lines "$D" | awk '$1 <= 5')" ] &&
        [ -n "$six" ] && [ "$six" != "$six_ref" ]; then
        echo "PASS training $p offload delayed update: steps 0-5 (the warm-up's updates land at once) bitwise the non-delayed run's, step 6 not ($six vs $six_ref)"
    else
        echo "FAIL training $p offload delayed update: steps 0-5 differ from the non-delayed run or step 6 does not ($six vs $six_ref) $(grep -m1 error "$D.out")"
    fi
    last=$(mean_of_last_five "$D") last_ref=$(mean_of_last_five "$ref") first=$(train_log_lines "$D" | awk '$1 == 0 { print $2 }')
    if [ -n "$last" ] && [ -n "$last_ref" ] && [ -n "$first" ] &&
        awk -v a="$last" -v b="$last_ref" -v f="$first" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d <= 0.05 && a <= f - 1) }'; then
        echo "PASS training $p offload delayed update: steps 15-19 mean loss $last, the non-delayed run's $last_ref (within 5%), step 0's $first"
    else
        echo "FAIL training $p offload delayed update: steps 15-19 mean loss ${last:-none}, the non-delayed run's ${last_ref:-none} (tol 5%), step 0's ${first:-none} (at least 1 below)"
    fi
    [ "$TIER" = full ] || continue
    mkdir -p "$D-resumed"
    cp "$D"/*_00000010* "$D-resumed/"
    ./train_gpt "${SMALL[@]}" "${DELAYED[@]}" -o "$D-resumed" --resume 1 > "$D-resumed.out" 2>&1
    if grep -q "resumed from" "$D-resumed.out" && [ "$(train_log_lines "$D" | awk '$1 >= 10')" == "$(train_log_lines "$D-resumed")" ] &&
        [ "$(train_log_lines "$D-resumed" | wc -l)" -eq 10 ] && cmp -s -i 1024 "$D/model_00000020.bin" "$D-resumed/model_00000020.bin" &&
        cmp -s -i 1024 "$D/state_00000020_00000.bin" "$D-resumed/state_00000020_00000.bin"; then
        echo "PASS training $p offload delayed update resumed at step 10: steps 10-19, the final model file and optimizer state bitwise the uninterrupted run's"
    else
        echo "FAIL training $p offload delayed update resumed at step 10: $(grep -m1 error "$D-resumed.out")"; diff <(train_log_lines "$D" | awk '$1 >= 10') <(train_log_lines "$D-resumed") | head -4
    fi
    ./train_gpt "${SMALL[@]}" "${DELAYED[@]}" -o "$D-again" > "$D-again.out" 2>&1
    if [ "$(train_log_lines "$D" | wc -l)" -eq 20 ] && [ "$(train_log_lines "$D")" == "$(train_log_lines "$D-again")" ] &&
        cmp -s -i 1024 "$D/model_00000020.bin" "$D-again/model_00000020.bin" && cmp -s -i 1024 "$D/state_00000020_00000.bin" "$D-again/state_00000020_00000.bin"; then
        echo "PASS training $p offload delayed update twice: 20 losses, the final model file and optimizer state bitwise equal"
    else
        echo "FAIL training $p offload delayed update twice: $(grep -m1 error "$D-again.out")"; diff <(train_log_lines "$D") <(train_log_lines "$D-again") | head -4
    fi
done

# Checkpoint retention: checkpoints at steps 3, 6, ..., 18 and the last (20); --keep-checkpoints 2 keeps 18 and 20,
# --keep-every 9 the milestone 9; the others' model and state files are gone, and no temporary file is left.
./train_gpt "${SMALL[@]}" --precision bf16 --steps 20 --val-every 0 --checkpoint-every 3 --keep-checkpoints 2 --keep-every 9 \
    -o "$W/keep" > "$W/keep.out" 2>&1
left=$(cd "$W/keep" && ls model_* state_* 2> /dev/null | tr '\n' ' ')
expected="model_00000009.bin model_00000018.bin model_00000020.bin state_00000009_00000.bin state_00000018_00000.bin state_00000020_00000.bin "
if [ "$left" == "$expected" ] && [ "$(grep -c '^deleted checkpoint' "$W/keep.out")" -eq 4 ]; then
    echo "PASS training retention: --keep-checkpoints 2 --keep-every 9 over 7 checkpoints leaves steps 9, 18 and 20"
else
    echo "FAIL training retention: left '$left', expected '$expected': $(tail -n 1 "$W/keep.out")"
fi

# Resume checks: a checkpoint of another shape or precision is refused in one line naming both values, before any
# GPU work; --resume 1 in a folder without a checkpoint says so and starts from scratch.
expect_refusal() {
    local name=$1 pattern=$2; shift 2
    local err rc
    err=$(./train_gpt "${SMALL[@]}" --steps 22 --val-every 0 --resume 1 -o "$W/keep" "$@" 2>&1 > /dev/null); rc=$?
    if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && printf '%s' "$err" | grep -q -- "$pattern"; then
        echo "PASS training resume refuses $name: $err"
    else
        echo "FAIL training resume refuses $name: rc=$rc: $err"
    fi
}
expect_refusal "another head count" "model_00000020.bin: the checkpoint's heads is 4, this run's 2" --precision bf16 --heads 2
expect_refusal "another depth" "the checkpoint's layers is 4, this run's 3" --precision bf16 --layers 3
expect_refusal "another maximum T" "the checkpoint's maximum sequence length is 256, this run's 512" --precision bf16 --max-seq-len 512
expect_refusal "another precision" "state_00000020_00000.bin: saved with --precision bf16, this run uses fp32" --precision fp32
./train_gpt "${SMALL[@]}" --steps 2 --val-every 0 --resume 1 -o "$W/fresh" > "$W/fresh.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "^--resume 1: no checkpoint in $W/fresh, starting from scratch" "$W/fresh.out" && grep -q "step     2/2" "$W/fresh.out"; then
    echo "PASS training resume without a checkpoint: says so and trains from scratch"
else
    echo "FAIL training resume without a checkpoint: rc=$rc: $(tail -n 1 "$W/fresh.out")"
fi

# The memory plan refuses what does not fit before allocating, in one line with the hint that can help: a smaller
# batch when the activations overflow (96 thin layers, 256,000 tokens a step: a plan of 215 GiB, 1.4 of it model
# states), more GPUs when the model states alone do (80 layers of C = 8192: 972 GiB).
expect_plan_refusal() {
    local name=$1 pattern=$2; shift 2
    local err rc
    err=$(./train_gpt --train-data "$TRAIN" --val-every 0 --sample-every 0 --steps 1 --precision bf16 --max-seq-len 256 \
        --seq-len 256 -o "$W/plan" "$@" 2>&1 > /dev/null); rc=$?
    if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && printf '%s' "$err" | grep -q -- "$pattern"; then
        echo "PASS training memory plan refuses $name: $err"
    else
        echo "FAIL training memory plan refuses $name: rc=$rc: $err"
    fi
}
expect_plan_refusal "activations past the GPU" "GiB free: lower --batch-size" --layers 96 --heads 4 --channels 256 --batch-size 1000
expect_plan_refusal "model states past the GPU" "the model states and scratch alone need .* GiB: spread the model over more GPUs" \
    --layers 80 --heads 64 --channels 8192 --batch-size 1
# ZeRO-Offload: the optimizer state past the host budget (0.2 GiB of pinned memory against --host-memory-gib 0.01)
expect_plan_refusal "offloaded state past the host budget" "GiB of pinned host memory on this machine (1 rank x .* GiB) but the budget is .* GiB (--host-memory-gib)" \
    --layers 4 --heads 4 --channels 256 --batch-size 1 --offload optimizer --host-memory-gib 0.01

[ "$TIER" = full ] || exit 0  # the quick tier ends here

# The Llama family (RMSNorm, rotary positions, a SwiGLU MLP, grouped-query attention: 1 key/value head for 2 heads of
# 64, an untied head; GPT-2's vocabulary, so the tinyshakespeare shards serve): in fp32, bf16 and fp16 the resume at
# step 10 bitwise the uninterrupted run (steps 10-19 and the final model file); in bf16 the same seed twice,
# --recompute 1, 2 and 3, and --offload optimizer, each bitwise the default run (the SwiGLU has no product epilogue to
# fuse, so the reference of every recompute level is the default run).
LLAMA=(--model d2 --arch llama --channels 128 --heads 2 --kv-heads 1 --tied-head 0 --max-seq-len 128 --seq-len 128 --batch-size 8
       --train-data "$TRAIN" --val-every 10 --val-batches 2 --sample-every 0 --lr 1e-3 --warmup-steps 5 --seed 7 --shuffle 1
       --deterministic 1 --steps 20 --checkpoint-every 10)
LLAMA_MODEL_LINE="^model: Llama family, 2 layers, 2 heads (1 key/value), 128 channels, 512 hidden units, .*untied head"
for p in fp32 bf16 fp16; do
    ./train_gpt "${LLAMA[@]}" --precision $p -o "$W/llama-$p" > "$W/llama-$p.out" 2>&1
    if ! grep -q "$LLAMA_MODEL_LINE" "$W/llama-$p.out" || [ "$(train_log_lines "$W/llama-$p" | wc -l)" -ne 20 ]; then
        echo "FAIL training llama $p: not a Llama-family run of 20 steps: $(grep -m1 -E '^model:|error' "$W/llama-$p.out")"; continue
    fi
    mkdir -p "$W/llama-$p-r"
    cp "$W/llama-$p"/*_00000010* "$W/llama-$p-r/"
    ./train_gpt "${LLAMA[@]}" --precision $p -o "$W/llama-$p-r" --resume 1 > "$W/llama-$p-r.out" 2>&1
    if grep -q "resumed from" "$W/llama-$p-r.out" && [ "$(train_log_lines "$W/llama-$p" | awk '$1 >= 10')" == "$(train_log_lines "$W/llama-$p-r")" ] &&
        [ "$(train_log_lines "$W/llama-$p-r" | wc -l)" -eq 10 ] && cmp -s -i 1024 "$W/llama-$p/model_00000020.bin" "$W/llama-$p-r/model_00000020.bin"; then
        echo "PASS training llama $p resume at step 10: steps 10-19 and the final model file bitwise the uninterrupted run's"
    else
        echo "FAIL training llama $p resume at step 10: $(grep -m1 error "$W/llama-$p-r.out")"
        diff <(train_log_lines "$W/llama-$p" | awk '$1 >= 10') <(train_log_lines "$W/llama-$p-r") | head -4
    fi
done
# bitwise_llama NAME WHAT FLAGS...: the bf16 Llama run with FLAGS equals the default one (20 losses, the final model file)
bitwise_llama() {
    local name=$1 what=$2; shift 2
    ./train_gpt "${LLAMA[@]}" --precision bf16 "$@" -o "$W/$name" > "$W/$name.out" 2>&1
    if [ "$(train_log_lines "$W/$name" | wc -l)" -eq 20 ] && [ "$(train_log_lines "$W/llama-bf16")" == "$(train_log_lines "$W/$name")" ] &&
        cmp -s -i 1024 "$W/llama-bf16/model_00000020.bin" "$W/$name/model_00000020.bin"; then
        echo "PASS training llama bf16 $what: 20 losses and the final model file bitwise the default run's"
    else
        echo "FAIL training llama bf16 $what: $(grep -m1 error "$W/$name.out")"; diff <(train_log_lines "$W/llama-bf16") <(train_log_lines "$W/$name") | head -4
    fi
}
bitwise_llama llama-again "same seed twice"
for r in 1 2 3; do bitwise_llama llama-recompute$r "--recompute $r" --recompute $r; done
bitwise_llama llama-offload "--offload optimizer" --offload optimizer
if cmp -s -i 1024 "$W/llama-bf16/state_00000020_00000.bin" "$W/llama-offload/state_00000020_00000.bin"; then
    echo "PASS training llama bf16 --offload optimizer: the optimizer state bitwise the GPU-resident run's"
else
    echo "FAIL training llama bf16 --offload optimizer: the optimizer state differs from the GPU-resident run's"
fi

# curve parity (full tier): same initial model file, same batches, same schedule
PARITY_MODEL=${PARITY_MODEL:---layers 12 --heads 12 --channels 768}
$PY scripts/reference/gpt2_reference.py debug-state --device cuda --steps 1 --batch-size 1 --seq-len 8 --seed 11 \
    $PARITY_MODEL --max-seq-len 1024 --model-out "$W/d12_init.bin" --state-out "$W/unused.bin" > /dev/null
COMMON=(--batch-size ${PARITY_B:-16} --seq-len ${PARITY_T:-512} --steps ${PARITY_STEPS:-200} --lr ${PARITY_LR:-1e-4} --warmup-steps 20 --lr-schedule cosine --final-lr-frac 0.1)
PRECISION=${PARITY_PRECISION:-bf16}
$PY scripts/reference/gpt2_reference.py train --init-from "$W/d12_init.bin" --train-shards "$TRAIN" "${COMMON[@]}" \
    --weight-decay 0.1 --grad-clip 1.0 --dtype $PRECISION --device cuda --log "$W/pytorch.log" > "$W/pytorch.out" 2>&1 \
    || echo "FAIL training curve parity: reference: $(tail -n 1 "$W/pytorch.out")"
./train_gpt --model "$W/d12_init.bin" --train-data "$TRAIN" "${COMMON[@]}" --weight-decay 0.1 --grad-clip 1.0 --shuffle 0 \
    --precision $PRECISION --val-every 0 --sample-every 0 -o "$W/ours" > "$W/ours.out" 2>&1 \
    || echo "FAIL training curve parity: train_gpt: $(tail -n 1 "$W/ours.out")"
out=$($PY scripts/reference/plot_losses.py --out "$W/curve_parity.svg" "$W/pytorch.log" "$W/ours/log.txt" --labels pytorch train_gpt 2>&1)
echo "$out" > "$W/curve_parity.txt"
maxdiff=$(printf '%s\n' "$out" | grep -o 'max |difference| [0-9.e+-]*' | awk '{print $3}' | head -n 1)
if [ -n "$maxdiff" ] && awk -v d="$maxdiff" 'BEGIN { exit !(d <= 0.03) }'; then
    echo "PASS training curve parity $PARITY_MODEL $PRECISION ${COMMON[*]}: max |loss difference| $maxdiff (tol 0.03)"
else
    echo "FAIL training curve parity $PARITY_MODEL $PRECISION ${COMMON[*]}: $out"
fi
