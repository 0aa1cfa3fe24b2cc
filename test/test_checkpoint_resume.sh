#!/usr/bin/env bash
# Committed checkpoints on the GPU: a run killed (SIGKILL, TRAIN_GPT_KILL_AT) at fault points inside its checkpoint's
# save - its state file, its part of the model file, the model file's seal, the manifest - then --resume 1 continues
# from the newest committed checkpoint, its losses and final model bitwise the uninterrupted run's (with
# --deterministic 1) and its run id kept; a LoRA run resumed with --resume 1 (adapters, their Adam moments, step, data
# position, schedule) bitwise the uninterrupted LoRA run, and a LoRA run stopped by SIGTERM exits 75 with a committed
# checkpoint; a stop without --output-dir exits 76; a fresh run over a folder of checkpoints is refused and
# --overwrite-output 1 moves them aside; a Llama-family model killed inside a save, resumed, and its LoRA run resumed,
# each bitwise the uninterrupted run. The quick tier (TEST_TIER=quick) kills at two fault points of the second
# save (inside the model file's seal, before the commit; and the manifest's last, after it); the full tier at each of
# the save's 13, and runs the Llama family's checks.
# Model files are compared past their 1024-byte header (`cmp -i 1024`): the header holds the run id, which differs
# between two runs.
set -u
cd "$(dirname "$0")/.."
source test/watchdog.sh  # watchdog, watchdog_off
W=build/test_work/checkpoint_resume
rm -rf "$W"; mkdir -p "$W"
TIER=${TEST_TIER:-full}
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
[ -n "$(ls $TRAIN 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL checkpoint_resume data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
SMALL=(--layers 2 --heads 2 --channels 128 --max-seq-len 128 --seq-len 128 --batch-size 8 --train-data "$TRAIN" --val-every 0
       --sample-every 0 --lr 1e-3 --warmup-steps 3 --seed 7 --shuffle 1 --deterministic 1 --precision bf16 --steps 12 --checkpoint-every 4)

# the step -> loss of a log.txt, the last line of each step (a run killed and resumed logs some steps twice)
losses() { grep -v '^#' "$1/log.txt" | awk '{loss[$1] = $2} END {for (s in loss) print s, loss[s]}' | sort -n; }
run_id() { sed -n 's/^run //p' "$1"; }

./train_gpt "${SMALL[@]}" -o "$W/ref" > "$W/ref.out" 2>&1 || { echo "FAIL checkpoint_resume the uninterrupted run: $(tail -n 1 "$W/ref.out")"; exit 1; }

# the fault points of one save (the first one's count, from a run killed past them all: TRAIN_GPT_KILL_AT counts from 1)
points=13  # a single rank's save: its state file 4 (write, fsync, rename, folder fsync), its model part 1, the seal 4, the manifest 4
if [ "$TIER" = full ]; then kills=$(seq $((points + 1)) $((2 * points))); else kills="$((points + 7)) $((2 * points))"; fi
for at in $kills; do
    name=kill$at
    TRAIN_GPT_KILL_AT=$at ./train_gpt "${SMALL[@]}" -o "$W/$name" > "$W/$name.out" 2>&1; rc=$?
    ./train_gpt "${SMALL[@]}" -o "$W/$name" --resume 1 > "$W/$name-resume.out" 2>&1; rrc=$?
    from=$(sed -n 's|^resumed from .*/manifest_\([0-9]*\)\.txt at step.*|\1|p' "$W/$name-resume.out")
    # each condition that fails is named
    wrong=""
    [ $rc -eq 137 ] || wrong="$wrong; the killed run exited $rc, not 137"
    [ $rrc -eq 0 ] && [ -n "$from" ] || wrong="$wrong; the resume exited $rrc from '$from': $(tail -n 1 "$W/$name-resume.out")"
    [ "$(losses "$W/ref")" == "$(losses "$W/$name")" ] || wrong="$wrong; losses differ: $(diff <(losses "$W/ref") <(losses "$W/$name") | head -3 | tr '\n' ' ')"
    cmp -s -i 1024 "$W/ref/model_00000012.bin" "$W/$name/model_00000012.bin" ||
        wrong="$wrong; the step-12 model files differ: $(cmp -i 1024 "$W/ref/model_00000012.bin" "$W/$name/model_00000012.bin" 2>&1 | head -n 1)"
    [ "$(run_id "$W/$name/manifest_00000004.txt")" = "$(run_id "$W/$name/manifest_00000012.txt")" ] ||
        wrong="$wrong; run ids '$(run_id "$W/$name/manifest_00000004.txt")' at step 4, '$(run_id "$W/$name/manifest_00000012.txt")' at step 12"
    left=$(ls "$W/$name" | grep -E '\.tmp$|\.damaged$' | tr '\n' ' ')
    [ -z "$left" ] || wrong="$wrong; left over: $left"
    if [ -z "$wrong" ]; then
        echo "PASS checkpoint_resume killed at fault point $at (inside the step-8 save), resumed from step $((10#$from)): losses and final model bitwise the uninterrupted run's, the run id kept, nothing left over"
    else
        echo "FAIL checkpoint_resume killed at fault point $at${wrong}"
    fi
done

# The Llama family (full tier; 1 key/value head for 2 heads of 64, an untied head): killed at the quick tier's
# first fault point (inside the step-8 save's model-file seal) and resumed, as above; the step-4 checkpoint resumed in
# a fresh folder; a LoRA run on every target (q/k/v, the attention's projection, the [gate | up] product and the
# MLP's projection) resumed from its step-4 checkpoint: each bitwise the uninterrupted run
if [ "$TIER" = full ]; then
    LLAMA=("${SMALL[@]}" --model d2 --arch llama --kv-heads 1 --tied-head 0)
    ./train_gpt "${LLAMA[@]}" -o "$W/llama" > "$W/llama.out" 2>&1
    if ! grep -q "^model: Llama family, 2 layers, 2 heads (1 key/value), 128 channels, .*untied head" "$W/llama.out" || [ ! -f "$W/llama/model_00000012.bin" ]; then
        echo "FAIL checkpoint_resume llama: the uninterrupted run: $(grep -m1 -E '^model:|error' "$W/llama.out")"
    else
        at=$((points + 7))
        TRAIN_GPT_KILL_AT=$at ./train_gpt "${LLAMA[@]}" -o "$W/llama-kill" > "$W/llama-kill.out" 2>&1; rc=$?
        ./train_gpt "${LLAMA[@]}" -o "$W/llama-kill" --resume 1 > "$W/llama-kill-resume.out" 2>&1; rrc=$?
        if [ $rc -eq 137 ] && [ $rrc -eq 0 ] && grep -q "^resumed from $W/llama-kill/manifest_00000004.txt" "$W/llama-kill-resume.out" &&
            [ "$(losses "$W/llama")" == "$(losses "$W/llama-kill")" ] && cmp -s -i 1024 "$W/llama/model_00000012.bin" "$W/llama-kill/model_00000012.bin"; then
            echo "PASS checkpoint_resume llama killed at fault point $at (inside the step-8 save), resumed from step 4: losses and final model bitwise the uninterrupted run's"
        else
            echo "FAIL checkpoint_resume llama killed at fault point $at: exit $rc, resume exit $rrc: $(tail -n 1 "$W/llama-kill-resume.out")"
        fi
        mkdir -p "$W/llama-r"; cp "$W/llama"/*_00000004* "$W/llama-r/"
        ./train_gpt "${LLAMA[@]}" -o "$W/llama-r" --resume 1 > "$W/llama-r.out" 2>&1; rc=$?
        if [ $rc -eq 0 ] && grep -q "^resumed from $W/llama-r/manifest_00000004.txt at step 4" "$W/llama-r.out" &&
            [ "$(losses "$W/llama" | awk '$1 >= 4')" == "$(losses "$W/llama-r")" ] && cmp -s -i 1024 "$W/llama/model_00000012.bin" "$W/llama-r/model_00000012.bin"; then
            echo "PASS checkpoint_resume llama --resume 1 from step 4 in a fresh folder: steps 4-11 and the final model bitwise the uninterrupted run's"
        else
            echo "FAIL checkpoint_resume llama --resume 1 from step 4: exit $rc: $(tail -n 1 "$W/llama-r.out")"
            diff <(losses "$W/llama" | awk '$1 >= 4') <(losses "$W/llama-r") | head -4
        fi
    fi
    LLAMA_LORA=("${LLAMA[@]}" --lora-rank 4 --lora-targets qkv,attn-proj,fc,fc-proj --lr 1e-2)
    ./train_gpt "${LLAMA_LORA[@]}" -o "$W/llama-lora" --lora-save "$W/llama-lora.bin" > "$W/llama-lora.out" 2>&1
    mkdir -p "$W/llama-lora-r"; cp "$W/llama-lora"/*_00000004* "$W/llama-lora-r/"
    ./train_gpt "${LLAMA_LORA[@]}" -o "$W/llama-lora-r" --resume 1 --lora-save "$W/llama-lora-r.bin" > "$W/llama-lora-r.out" 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "trainable parameters" "$W/llama-lora.out" && grep -q "resumed from $W/llama-lora-r/manifest_00000004.txt at step 4" "$W/llama-lora-r.out" &&
        [ "$(losses "$W/llama-lora" | wc -l)" -eq 12 ] && [ "$(losses "$W/llama-lora" | awk '$1 >= 4')" == "$(losses "$W/llama-lora-r")" ] &&
        cmp -s -i 1024 "$W/llama-lora.bin" "$W/llama-lora-r.bin"; then
        echo "PASS checkpoint_resume llama LoRA (all four targets) --resume 1 from step 4: steps 4-11 and the final adapters bitwise the uninterrupted LoRA run's"
    else
        echo "FAIL checkpoint_resume llama LoRA --resume 1: exit $rc: $(grep -m1 error "$W/llama-lora.out" "$W/llama-lora-r.out")"
        diff <(losses "$W/llama-lora" | awk '$1 >= 4') <(losses "$W/llama-lora-r") | head -4
    fi
fi

# LoRA: 12 steps with checkpoints every 4 against a resume from step 4's checkpoint in a fresh folder
LORA=("${SMALL[@]}" --lora-rank 4 --lora-targets qkv,fc --lr 1e-2)
./train_gpt "${LORA[@]}" -o "$W/lora" --lora-save "$W/lora.bin" > "$W/lora.out" 2>&1 || echo "FAIL checkpoint_resume LoRA run: $(tail -n 1 "$W/lora.out")"
mkdir -p "$W/lora-r"
cp "$W/lora"/*_00000004* "$W/lora-r/"
./train_gpt "${LORA[@]}" -o "$W/lora-r" --resume 1 --lora-save "$W/lora-r.bin" > "$W/lora-r.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "resumed from $W/lora-r/manifest_00000004.txt at step 4" "$W/lora-r.out" && [ -f "$W/lora/adapters_00000012.bin" ] &&
    [ "$(losses "$W/lora" | awk '$1 >= 4')" == "$(losses "$W/lora-r")" ] && cmp -s -i 1024 "$W/lora.bin" "$W/lora-r.bin" &&
    cmp -s -i 1024 "$W/lora/adapters_00000012.bin" "$W/lora-r/adapters_00000012.bin"; then
    echo "PASS checkpoint_resume LoRA --resume 1 from step 4: steps 4-11 and the final adapters bitwise the uninterrupted LoRA run's"
else
    echo "FAIL checkpoint_resume LoRA --resume 1: exit $rc: $(tail -n 1 "$W/lora-r.out")"
    diff <(losses "$W/lora" | awk '$1 >= 4') <(losses "$W/lora-r") | head -4
fi
# SIGTERM to a LoRA run: exit 75 once its checkpoint committed
./train_gpt "${LORA[@]}" --steps 400 -o "$W/lora-stop" > "$W/lora-stop.out" 2>&1 & pid=$!
for _ in $(seq 3000); do grep -q 'step     2/' "$W/lora-stop.out" 2> /dev/null && break; kill -0 $pid 2> /dev/null || break; sleep 0.01; done
kill -TERM $pid 2> /dev/null
watchdog 120 $pid; wait $pid; rc=$?; watchdog_off
line=$(grep '^stopped by SIGTERM' "$W/lora-stop.out")
at=$(printf '%s' "$line" | sed -nE 's|^stopped by SIGTERM after step ([0-9]+)/400.*|\1|p')
if [ $rc -eq 75 ] && [ -n "$at" ] && printf '%s' "$line" | grep -qF "committed checkpoint $W/lora-stop/manifest_$(printf %08d "$at").txt" &&
    [ -f "$W/lora-stop/adapters_$(printf %08d "$at").bin" ]; then
    echo "PASS checkpoint_resume SIGTERM to a LoRA run: exit 75 with its committed checkpoint (adapters and their optimizer state): $line"
else
    echo "FAIL checkpoint_resume SIGTERM to a LoRA run: exit $rc: $line"
fi
# SIGTERM without --output-dir: nothing to continue from, exit 76
./train_gpt "${SMALL[@]}" --steps 400 --checkpoint-every 0 > "$W/unsaved.out" 2>&1 & pid=$!
for _ in $(seq 3000); do grep -q 'step     2/' "$W/unsaved.out" 2> /dev/null && break; kill -0 $pid 2> /dev/null || break; sleep 0.01; done
kill -TERM $pid 2> /dev/null
watchdog 120 $pid; wait $pid; rc=$?; watchdog_off
if [ $rc -eq 76 ] && grep -q '^stopped by SIGTERM after step .*: nothing saved (no --output-dir); exit status 76' "$W/unsaved.out"; then
    echo "PASS checkpoint_resume SIGTERM without --output-dir: exit 76 (stopped, nothing saved), not 75"
else
    echo "FAIL checkpoint_resume SIGTERM without --output-dir: exit $rc: $(grep '^stopped' "$W/unsaved.out")"
fi
# a fresh run over another run's checkpoints: refused before the GPU is touched; --overwrite-output 1 moves them aside
err=$(./train_gpt "${SMALL[@]}" -o "$W/ref" 2>&1 >/dev/null); rc=$?
./train_gpt "${SMALL[@]}" --steps 4 -o "$W/ref" --overwrite-output 1 > "$W/overwrite.out" 2>&1; orc=$?
aside=$(ls -d "$W"/ref/replaced_* 2> /dev/null | head -n 1)
if [ $rc -ne 0 ] && printf '%s' "$err" | grep -q "^error: --output-dir $W/ref holds 3 checkpoint(s) of run" && [ $orc -eq 0 ] && [ -n "$aside" ] &&
    [ -f "$aside/manifest_00000012.txt" ] && [ -f "$aside/log.txt" ] && [ -f "$W/ref/manifest_00000004.txt" ] &&
    [ "$(run_id "$W/ref/manifest_00000004.txt")" != "$(run_id "$aside/manifest_00000012.txt")" ]; then
    echo "PASS checkpoint_resume a fresh run over another run's checkpoints is refused; --overwrite-output 1 moves them and log.txt aside, a new run id"
else
    echo "FAIL checkpoint_resume folder of another run: exit $rc ($err), --overwrite-output exit $orc: $(tail -n 1 "$W/overwrite.out")"
fi
