#!/usr/bin/env bash
# Data parallelism on 2 or more ranks, one per GPU (argument: the number, default all GPUs): for ZeRO stages 0-3
# the losses of 10 steps equal the one-GPU run with the same global batch (fp32 within 1e-5, bf16 within 2e-2),
# and all ranks end with bitwise identical parameters; gradient accumulation; resume on the same and on a
# different number of GPUs; per-GPU memory falls from stage to stage; launches through our launcher and
# (when built with MPI) mpirun. With 4 GPUs also 3 ranks: GPT-2 shapes (C a multiple of 64) divide evenly
# by 2, 4 and 8, so 3 ranks are what exercises padded, uneven shards. ZeRO-Offload (--offload optimizer) at stages
# 2 and 3 (at 3 also with the parameter shards on the host): bitwise the GPU-resident run at the same stage, and its
# checkpoints resumed across offload and data-parallel sizes; at stage 2 its one-step delayed update (against the
# non-delayed run, twice, resumed) and its NVMe tier (--offload-dir, bitwise the in-memory offload run). A stop signal to one rank stops both after the same step, and the resumed run
# equals the uninterrupted one. A Llama-family model (grouped-query attention, an untied head) at stages 0-3, with
# offload at stages 2 and 3, and its stage-3 checkpoint resumed on one rank.
# On a machine with fewer GPUs than ranks, the ranks share GPU 0 (scripts/launch.sh --one-gpu) and the checks that
# need a GPU per rank (memory per GPU, the killed rank, mpirun) are skipped. The quick tier (TEST_TIER=quick) runs
# stage 3 in fp32 (losses, identical parameters), its step-5 checkpoint resumed on one rank (fp32, within 1e-5), and
# the stop signal to one rank (whose resume is the same-ranks one, bitwise, at stage 0); the bf16 stage-1 and stage-3
# checkpoints resumed on the same ranks and the stage-3 one on one rank are full-tier checks, as is the rest (the
# Llama family's runs among them).
set -u
cd "$(dirname "$0")/.."
N=${1:-$(scripts/visible_gpus.sh)}
W=build/test_work/zero$N
rm -rf "$W"; mkdir -p "$W"
export NCCL_NVLS_ENABLE=0
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
[ -n "$(ls $TRAIN 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL zero training data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
# B per GPU = 8/N keeps the global batch at 8 rows
BG=$((8 / N))
MODEL=(--layers 3 --heads 1 --channels 64 --max-seq-len 128 --seq-len 128 --train-data "$TRAIN" --val-every 0
       --sample-every 0 --lr 1e-3 --warmup-steps 2 --seed 5 --shuffle 0 --parameter-checksums 1)  # the files' order: runs of other batch shapes read the same tokens
source test/loss_logs.sh  # losses, maxdiff, within, VISIBLE_GPUS
source test/watchdog.sh  # watchdog, watchdog_off
TIER=${TEST_TIER:-full}
ONE_GPU=$([ "$VISIBLE_GPUS" -lt "$N" ] && echo --one-gpu)  # launch.sh's flag: the ranks share GPU 0
WHERE=$([ -n "$ONE_GPU" ] && echo "$N ranks on one GPU" || echo "$N GPUs")

for p in fp32 $([ "$TIER" = full ] && echo bf16); do
    tol=$([ $p = fp32 ] && echo 1e-5 || echo 2e-2)
    ./train_gpt "${MODEL[@]}" --precision $p --batch-size 8 --steps 10 -o "$W/single_$p" > "$W/single_$p.out" 2>&1 \
        || { echo "FAIL zero $p single-GPU baseline: $(tail -n 1 "$W/single_$p.out")"; continue; }
    for stage in $([ "$TIER" = full ] && echo 0 1 2) 3; do
        name="$WHERE stage $stage $p"
        # the quick tier resumes this run's step-5 checkpoint on one rank below
        scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" --precision $p --batch-size $BG --steps 10 --zero-stage $stage \
            $([ "$TIER" = full ] || echo --checkpoint-every 5) -o "$W/s${stage}_$p" > "$W/s${stage}_$p.out" 2>&1 ||
            { echo "FAIL zero $name: $(grep -m1 error "$W/s${stage}_$p.out")"; continue; }
        d=$(maxdiff "$W/single_$p" "$W/s${stage}_$p")
        if [ "$(losses "$W/s${stage}_$p" | wc -l)" -eq 10 ] && within "$d" "$tol"; then
            echo "PASS zero $name: 10 losses match one GPU, max diff $d (tol $tol)"
        else
            echo "FAIL zero $name: max loss diff $d (tol $tol)"
        fi
        sums=$(grep -o 'parameter checksum [0-9a-f]*' "$W/s${stage}_$p.out" | sort -u | wc -l)
        ranks=$(grep -c 'parameter checksum' "$W/s${stage}_$p.out")
        if [ "$ranks" -eq "$N" ] && [ "$sums" -eq 1 ]; then echo "PASS zero $name: parameters bitwise identical on all $N ranks"
        else echo "FAIL zero $name: $ranks ranks reported, $sums distinct parameter checksums"; fi
    done
done

# resume on the same ranks, bitwise, in bf16 (--deterministic 1: the default's atomic attention sums and timed
# choice of product algorithms are not bitwise reproducible)
for stage in $([ "$TIER" = full ] && echo 1 3); do
    scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" --precision bf16 --batch-size $BG --steps 10 --zero-stage $stage \
        --deterministic 1 --checkpoint-every 5 -o "$W/ckpt$stage" > "$W/ckpt$stage.out" 2>&1
    mkdir -p "$W/resume$stage"; cp "$W/ckpt$stage"/*_00000005* "$W/resume$stage/"
    scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" --precision bf16 --batch-size $BG --steps 10 --zero-stage $stage \
        --deterministic 1 -o "$W/resume$stage" --resume 1 > "$W/resume$stage.out" 2>&1
    if [ "$(losses "$W/ckpt$stage" | awk '$1 >= 5')" == "$(losses "$W/resume$stage")" ] && [ "$(losses "$W/resume$stage" | wc -l)" -eq 5 ]; then
        echo "PASS zero $WHERE stage $stage resume on the same ranks: steps 5-9 bitwise equal"
    else
        echo "FAIL zero $WHERE stage $stage resume on the same ranks: $(grep -m1 error "$W/resume$stage.out")"
    fi
done
# a different number of ranks: the stage-3 checkpoint of N ranks continues on one (stage 0): the bf16 one above (full
# tier), or the fp32 run's (quick tier: another data-parallel size sums the gradients in another order, within 1e-5)
read -r from p tol <<< "$([ "$TIER" = full ] && echo "ckpt3 bf16 2e-2" || echo "s3_fp32 fp32 1e-5")"
mkdir -p "$W/resume_one"; cp "$W/$from"/*_00000005* "$W/resume_one/"
./train_gpt "${MODEL[@]}" --precision $p --batch-size 8 --steps 10 -o "$W/resume_one" --resume 1 > "$W/resume_one.out" 2>&1
d=$(maxdiff "$W/$from" "$W/resume_one" 5)
if [ "$(losses "$W/resume_one" | wc -l)" -eq 5 ] && within "$d" $tol; then
    echo "PASS zero resume of a $N-rank stage-3 checkpoint on 1 rank: steps 5-9 within $d ($p tol $tol)"
else
    echo "FAIL zero resume of a $N-rank checkpoint on 1 rank: diff $d $(grep -m1 error "$W/resume_one.out")"
fi
# A stop signal to one rank: 2 ranks started by hand (as srun starts them) at ZeRO stage 0, where only the losses'
# gathering carries rank 1's vote to rank 0; SIGTERM to rank 1 alone once rank 0 logged step 7 of 20. Both ranks
# stop after the same step (the checkpoint's save is collective) with exit status 75, rank 0 saying it was "a signal
# to another rank"; --resume 1 through the launcher finishes the run with the uninterrupted run's losses, bit for bit.
STOP=("${MODEL[@]}" --precision bf16 --batch-size $BG --total-batch-tokens $((8 * 128 * 8)) --steps 20 --zero-stage 0 --deterministic 1
      --checkpoint-every 10 --nccl-timeout 60)
scripts/launch.sh $ONE_GPU $N ./train_gpt "${STOP[@]}" -o "$W/stop-ref" > "$W/stop-ref.out" 2>&1
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + RANDOM % 12000)) WORLD_SIZE=$N
pids=()
for ((r = 0; r < N; r++)); do
    if [ -n "$ONE_GPU" ]; then place=(LOCAL_RANK=0 NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo); else place=(LOCAL_RANK=$r); fi
    env RANK=$r "${place[@]}" ./train_gpt "${STOP[@]}" -o "$W/stop" > "$W/stop_$r.out" 2>&1 &
    pids+=($!)
done
unset MASTER_ADDR MASTER_PORT WORLD_SIZE
for _ in $(seq 30000); do grep -qF "$(printf 'step %5d/' 7)" "$W/stop_0.out" && break; kill -0 "${pids[0]}" 2> /dev/null || break; sleep 0.01; done
kill -TERM "${pids[1]}"
watchdog 300 "${pids[@]}"
statuses=""; for p in "${pids[@]}"; do wait "$p"; statuses="$statuses $?"; done
watchdog_off
line=$(grep -m1 '^stopped by' "$W/stop_0.out")
at=$(printf '%s' "$line" | sed -nE 's|^stopped by a signal to another rank after step ([0-9]+)/20: committed checkpoint .*|\1|p')
if [ "$statuses" = "$(printf ' 75%.0s' $(seq $N))" ] && [ -n "$at" ] && [ -f "$W/stop/model_$(printf %08d "$at").bin" ] &&
    grep -q "^SIGTERM: stopping after the current step" "$W/stop_1.out" && ! grep -q "^SIGTERM" "$W/stop_0.out"; then
    echo "PASS zero $WHERE SIGTERM to rank 1 alone: every rank stops after step $at with exit status 75: $line"
    scripts/launch.sh $ONE_GPU $N ./train_gpt "${STOP[@]}" -o "$W/stop" --resume 1 > "$W/stop-resume.out" 2>&1; rc=$?
    if [ $rc -eq 0 ] && [ "$(losses "$W/stop-ref")" == "$(losses "$W/stop")" ] && [ "$(losses "$W/stop" | wc -l)" -eq 20 ]; then
        echo "PASS zero $WHERE SIGTERM to rank 1, then --resume 1: steps 0-19 bitwise equal to the uninterrupted run"
    else
        echo "FAIL zero $WHERE SIGTERM to rank 1, then --resume 1: exit $rc $(grep -m1 error "$W/stop-resume.out")"
    fi
else
    echo "FAIL zero $WHERE SIGTERM to rank 1 alone: exit statuses$statuses, '${line:-no stop line}' $(grep -h -m1 error "$W"/stop_*.out)"
fi

[ "$TIER" = full ] || exit 0  # the quick tier ends here

# gradient accumulation (2 micro-steps of half the rows), at stage 2 in fp32
scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" --precision fp32 --batch-size $((BG / 2 > 0 ? BG / 2 : 1)) \
    --total-batch-tokens $((8 * 128)) --steps 10 --zero-stage 2 -o "$W/accum" > "$W/accum.out" 2>&1
if [ $BG -ge 2 ]; then
    d=$(maxdiff "$W/single_fp32" "$W/accum")
    if within "$d" 1e-5; then echo "PASS zero $WHERE gradient accumulation (2 micro-steps) matches one GPU: max diff $d"
    else echo "FAIL zero $WHERE gradient accumulation: max diff $d"; fi
fi
# a different number of GPUs both ways: N -> N/2 and N/2 -> N, stage 3 in bf16 (the same global batch)
if [ $N -ge 4 ]; then
    H=$((N / 2))
    for move in "$N $H" "$H $N"; do
        read -r from to <<< "$move"
        src="$W/ckpt3"
        if [ "$from" -ne $N ]; then
            src="$W/ckpt3_on$from"
            scripts/launch.sh $ONE_GPU $from ./train_gpt "${MODEL[@]}" --precision bf16 --batch-size $((8 / from)) --steps 10 --zero-stage 3 \
                --checkpoint-every 5 -o "$src" > "$src.out" 2>&1
        fi
        dst="$W/move_${from}_to_$to"; mkdir -p "$dst"; cp "$src"/*_00000005* "$dst/"
        scripts/launch.sh $ONE_GPU $to ./train_gpt "${MODEL[@]}" --precision bf16 --batch-size $((8 / to)) --steps 10 --zero-stage 3 \
            -o "$dst" --resume 1 > "$dst.out" 2>&1
        d=$(maxdiff "$src" "$dst" 5)
        if [ "$(losses "$dst" | wc -l)" -eq 5 ] && within "$d" 2e-2; then
            echo "PASS zero stage-3 checkpoint of $from GPUs resumed on $to GPUs: steps 5-9 within $d (bf16 tol 2e-2)"
        else
            echo "FAIL zero stage-3 checkpoint of $from GPUs resumed on $to GPUs: diff $d $(grep -m1 error "$dst.out")"
        fi
    done
fi
# uneven shards: 3 ranks (the units are not multiples of 8 x 3), every stage, fp32
if [ "$(scripts/visible_gpus.sh)" -ge 3 ]; then
    ./train_gpt "${MODEL[@]}" --precision fp32 --batch-size 24 --steps 10 -o "$W/three_single" > /dev/null 2>&1
    for stage in 0 1 2 3; do
        scripts/launch.sh 3 ./train_gpt "${MODEL[@]}" --precision fp32 --batch-size 8 --total-batch-tokens $((24 * 128)) \
            --steps 10 --zero-stage $stage -o "$W/three$stage" > "$W/three$stage.out" 2>&1
        d=$(maxdiff "$W/three_single" "$W/three$stage")
        if [ "$(losses "$W/three$stage" | wc -l)" -eq 10 ] && within "$d" 1e-5 && [ "$(grep -o 'parameter checksum [0-9a-f]*' "$W/three$stage.out" | sort -u | wc -l)" -eq 1 ]; then
            echo "PASS zero 3 GPUs (uneven, padded shards) stage $stage fp32: losses match one GPU (max diff $d), ranks identical"
        else
            echo "FAIL zero 3 GPUs (uneven shards) stage $stage: max diff $d $(grep -m1 error "$W/three$stage.out")"
        fi
    done
fi
# LoRA with ZeRO-1 and ZeRO-2: the adapters train the same on N GPUs as on one (fp32)
LORA=(--lora-rank 4 --lora-targets qkv,attn-proj,fc,fc-proj --lora-weight-decay 0.01)
./train_gpt "${MODEL[@]}" "${LORA[@]}" --precision fp32 --batch-size 8 --steps 10 -o "$W/lora_single" > "$W/lora_single.out" 2>&1
for stage in 1 2; do
    scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" "${LORA[@]}" --precision fp32 --batch-size $BG --steps 10 --zero-stage $stage \
        -o "$W/lora$stage" > "$W/lora$stage.out" 2>&1
    d=$(maxdiff "$W/lora_single" "$W/lora$stage")
    if [ "$(losses "$W/lora$stage" | wc -l)" -eq 10 ] && within "$d" 1e-5; then
        echo "PASS zero $WHERE stage $stage LoRA: 10 losses match one GPU (max diff $d)"
    else
        echo "FAIL zero $WHERE stage $stage LoRA: max diff $d $(grep -m1 error "$W/lora$stage.out")"
    fi
done
# ZeRO-Offload at stages 2 and 3 (fp32, --deterministic 1): each rank's shard of the optimizer state on the host (at
# stage 3 also, separately, its parameter shard), AdamW on the CPU, which is the kernel's arithmetic bit for bit on the
# same shard; 20 losses, the final model file and every rank's optimizer-state file equal the GPU-resident run's at
# the same stage
for stage in 2 3; do
    for mode in none optimizer $([ $stage -eq 3 ] && echo optimizer,parameters); do
        scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" --precision fp32 --deterministic 1 --batch-size $BG --steps 20 \
            --zero-stage $stage --offload $mode --checkpoint-every 5 -o "$W/offload_${mode/,/_}_s$stage" > "$W/offload_${mode/,/_}_s$stage.out" 2>&1
        [ $mode = none ] && continue
        a="$W/offload_none_s$stage" b="$W/offload_${mode/,/_}_s$stage"
        states=0
        for r in $(seq 0 $((N - 1))); do cmp -s -i 1024 "$a/state_00000020_$(printf %05d $r).bin" "$b/state_00000020_$(printf %05d $r).bin" && states=$((states + 1)); done
        if [ "$(losses "$b" | wc -l)" -eq 20 ] && [ "$(losses "$a")" == "$(losses "$b")" ] && cmp -s -i 1024 "$a/model_00000020.bin" "$b/model_00000020.bin" &&
            [ $states -eq $N ]; then
            echo "PASS zero $WHERE stage $stage fp32 offload $mode: 20 losses, the model file and all $N state files bitwise equal to the GPU-resident run"
        else
            echo "FAIL zero $WHERE stage $stage fp32 offload $mode: $states of $N state files equal $(grep -m1 error "$b.out")"
        fi
    done
done
# the one-step delayed update at stage 2 (fp32, --deterministic 1): the 2 warm-up steps' updates land within their
# step, so steps 0-2 are the non-delayed offload run's bit for bit and step 3, whose forward misses step 2's update,
# differs; every loss within the non-delayed run's largest loss change over two steps (it trails by about one update);
# the same run twice gives the same losses, model file and state files; its step-10 checkpoint resumed on the same
# ranks continues it bit for bit
DELAYED=(--precision fp32 --deterministic 1 --batch-size $BG --steps 20 --zero-stage 2 --offload optimizer --offload-delayed-update 1 --checkpoint-every 10)
for run in delayed_s2 delayed_s2_again; do
    scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" "${DELAYED[@]}" -o "$W/$run" > "$W/$run.out" 2>&1
done
mkdir -p "$W/delayed_s2_resumed"; cp "$W/delayed_s2"/*_00000010* "$W/delayed_s2_resumed/"
scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" "${DELAYED[@]}" -o "$W/delayed_s2_resumed" --resume 1 > "$W/delayed_s2_resumed.out" 2>&1
a="$W/offload_optimizer_s2" b="$W/delayed_s2"
three_ref=$(losses "$a" | awk '$1 == 3') three=$(losses "$b" | awk '$1 == 3')
if [ "$(losses "$b" | wc -l)" -eq 20 ] && [ "$(losses "$a" | awk '$1 <= 2')" == "$(losses "$b" | awk '$1 <= 2')" ] && [ -n "$three" ] && [ "$three" != "$three_ref" ]; then
    echo "PASS zero $WHERE stage 2 fp32 offload delayed update: steps 0-2 (the warm-up's updates land at once) bitwise the non-delayed run's, step 3 not"
else
    echo "FAIL zero $WHERE stage 2 fp32 offload delayed update: steps 0-2 differ from the non-delayed run or step 3 does not ($three vs $three_ref) $(grep -m1 error "$b.out")"
fi
d=$(maxdiff "$a" "$b")
tol=$(losses "$a" | awk '{ l[NR] = $2 } END { m = 0; for (i = 3; i <= NR; i++) { d = l[i] - l[i - 2]; if (d < 0) d = -d; if (d > m) m = d } print m }')
if [ "$(losses "$b" | wc -l)" -eq 20 ] && within "$d" "$tol"; then
    echo "PASS zero $WHERE stage 2 fp32 offload delayed update: 20 losses within $d of the non-delayed run's (tol $tol: its largest change over two steps)"
else
    echo "FAIL zero $WHERE stage 2 fp32 offload delayed update: max loss difference $d from the non-delayed run (tol $tol)"
fi
for check in again resumed; do
    c="$W/delayed_s2_$check" from=$([ $check = again ] && echo 0 || echo 10)
    states=0
    for r in $(seq 0 $((N - 1))); do cmp -s -i 1024 "$b/state_00000020_$(printf %05d $r).bin" "$c/state_00000020_$(printf %05d $r).bin" && states=$((states + 1)); done
    if [ "$(losses "$c" | wc -l)" -eq $((20 - from)) ] && [ "$(losses "$b" | awk -v f=$from '$1 >= f')" == "$(losses "$c")" ] &&
        cmp -s -i 1024 "$b/model_00000020.bin" "$c/model_00000020.bin" && [ $states -eq $N ]; then
        echo "PASS zero $WHERE stage 2 fp32 offload delayed update $([ $check = again ] && echo twice || echo "resumed at step 10"): steps $from-19, the model file and all $N state files bitwise equal"
    else
        echo "FAIL zero $WHERE stage 2 fp32 offload delayed update $check: $states of $N state files equal $(grep -m1 error "$c.out")"
    fi
done
# the NVMe tier at stage 2 (--offload-dir): each rank's master weights and Adam moments in its own file of one folder,
# read and written tile by tile: 20 losses, the model file and every rank's state file bitwise the in-memory offload
# run's, and no file left in the folder
mkdir -p "$W/offload_dir_files"
scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" --precision fp32 --deterministic 1 --batch-size $BG --steps 20 --zero-stage 2 \
    --offload optimizer --offload-dir "$W/offload_dir_files" --checkpoint-every 5 -o "$W/offload_dir_s2" > "$W/offload_dir_s2.out" 2>&1
a="$W/offload_optimizer_s2" b="$W/offload_dir_s2"
states=0
for r in $(seq 0 $((N - 1))); do cmp -s -i 1024 "$a/state_00000020_$(printf %05d $r).bin" "$b/state_00000020_$(printf %05d $r).bin" && states=$((states + 1)); done
if [ "$(losses "$b" | wc -l)" -eq 20 ] && [ "$(losses "$a")" == "$(losses "$b")" ] && cmp -s -i 1024 "$a/model_00000020.bin" "$b/model_00000020.bin" &&
    [ $states -eq $N ] && [ -z "$(ls -A "$W/offload_dir_files")" ]; then
    echo "PASS zero $WHERE stage 2 fp32 offload-dir: 20 losses, the model file and all $N state files bitwise equal to --offload optimizer, the files removed"
else
    echo "FAIL zero $WHERE stage 2 fp32 offload-dir: $states of $N state files equal, left: $(ls "$W/offload_dir_files" | tr '\n' ' ') $(grep -m1 error "$b.out")"
fi

# resume across offload and data-parallel sizes: the offloaded stage-2 run's step-5 checkpoint continues on one GPU
# without offload, whose step-10 checkpoint continues on N ranks at stage 3 with the optimizer state and the parameter
# shards on the host; both within fp32's 1e-5 of the uninterrupted run (another data-parallel size sums the gradients
# in another order)
mkdir -p "$W/offload_on_one" "$W/offload_back"
cp "$W/offload_optimizer_s2"/*_00000005* "$W/offload_on_one/"
./train_gpt "${MODEL[@]}" --precision fp32 --deterministic 1 --batch-size 8 --steps 20 --checkpoint-every 5 -o "$W/offload_on_one" --resume 1 \
    > "$W/offload_on_one.out" 2>&1
cp "$W/offload_on_one"/*_00000010* "$W/offload_back/"
scripts/launch.sh $ONE_GPU $N ./train_gpt "${MODEL[@]}" --precision fp32 --deterministic 1 --batch-size $BG --steps 20 --zero-stage 3 \
    --offload optimizer,parameters -o "$W/offload_back" --resume 1 > "$W/offload_back.out" 2>&1
d1=$(maxdiff "$W/offload_none_s2" "$W/offload_on_one" 5) d2=$(maxdiff "$W/offload_none_s2" "$W/offload_back" 10)
if [ "$(losses "$W/offload_on_one" | wc -l)" -eq 15 ] && [ "$(losses "$W/offload_back" | wc -l)" -eq 10 ] && within "$d1" 1e-5 && within "$d2" 1e-5; then
    echo "PASS zero resume offload ($N ranks, stage 2) -> no offload (1 GPU) -> offload with the parameters ($N ranks, stage 3): steps 5-19 within $d1, 10-19 within $d2 (tol 1e-5)"
else
    echo "FAIL zero resume across offload and data-parallel sizes: diffs $d1 $d2 $(grep -m1 error "$W/offload_on_one.out" "$W/offload_back.out")"
fi
# The Llama family (1 key/value head for 2 heads of 64, an untied head: the LM head a unit of its own; no wpe), fp32,
# --deterministic 1, 10 steps: at stages 0-3 on N ranks the losses within 1e-5 of one GPU's and the parameters bitwise
# identical on every rank; --offload optimizer at stage 2 and optimizer,parameters at stage 3 bitwise the GPU-resident
# run at the same stage (losses, the model file, every rank's state file); the stage-3 run's step-5 checkpoint
# continued on one GPU within 1e-5 of it.
LLAMA=(--model d2 --arch llama --channels 128 --heads 2 --kv-heads 1 --tied-head 0 --max-seq-len 128 --seq-len 128 --train-data "$TRAIN"
       --val-every 0 --sample-every 0 --lr 1e-3 --warmup-steps 2 --seed 5 --shuffle 0 --parameter-checksums 1 --precision fp32
       --deterministic 1 --steps 10)
./train_gpt "${LLAMA[@]}" --batch-size 8 -o "$W/llama_single" > "$W/llama_single.out" 2>&1
grep -q "^model: Llama family, 2 layers, 2 heads (1 key/value), 128 channels, .*untied head" "$W/llama_single.out" ||
    echo "FAIL zero llama single-GPU baseline: not a Llama-family run: $(grep -m1 -E '^model:|error' "$W/llama_single.out")"
for stage in 0 1 2 3; do
    name="$WHERE llama stage $stage fp32"
    scripts/launch.sh $ONE_GPU $N ./train_gpt "${LLAMA[@]}" --batch-size $BG --zero-stage $stage --checkpoint-every 5 \
        -o "$W/llama_s$stage" > "$W/llama_s$stage.out" 2>&1
    d=$(maxdiff "$W/llama_single" "$W/llama_s$stage")
    sums=$(grep -o 'parameter checksum [0-9a-f]*' "$W/llama_s$stage.out" | sort -u | wc -l)
    ranks=$(grep -c 'parameter checksum' "$W/llama_s$stage.out")
    if [ "$(losses "$W/llama_s$stage" | wc -l)" -eq 10 ] && within "$d" 1e-5 && [ "$ranks" -eq "$N" ] && [ "$sums" -eq 1 ]; then
        echo "PASS zero $name: 10 losses match one GPU (max diff $d, tol 1e-5), parameters bitwise identical on all $N ranks"
    else
        echo "FAIL zero $name: max loss diff $d (tol 1e-5), $ranks ranks reported $sums distinct checksums $(grep -m1 error "$W/llama_s$stage.out")"
    fi
done
for run in "2 optimizer" "3 optimizer,parameters"; do
    read -r stage mode <<< "$run"
    a="$W/llama_s$stage" b="$W/llama_offload_s$stage"
    scripts/launch.sh $ONE_GPU $N ./train_gpt "${LLAMA[@]}" --batch-size $BG --zero-stage $stage --offload $mode --checkpoint-every 5 \
        -o "$b" > "$b.out" 2>&1
    states=0
    for r in $(seq 0 $((N - 1))); do cmp -s -i 1024 "$a/state_00000010_$(printf %05d $r).bin" "$b/state_00000010_$(printf %05d $r).bin" && states=$((states + 1)); done
    if [ "$(losses "$b" | wc -l)" -eq 10 ] && [ "$(losses "$a")" == "$(losses "$b")" ] && cmp -s -i 1024 "$a/model_00000010.bin" "$b/model_00000010.bin" &&
        [ $states -eq $N ]; then
        echo "PASS zero $WHERE llama stage $stage fp32 offload $mode: 10 losses, the model file and all $N state files bitwise equal to the GPU-resident run"
    else
        echo "FAIL zero $WHERE llama stage $stage fp32 offload $mode: $states of $N state files equal $(grep -m1 error "$b.out")"
    fi
done
mkdir -p "$W/llama_resume_one"; cp "$W/llama_s3"/*_00000005* "$W/llama_resume_one/"
./train_gpt "${LLAMA[@]}" --batch-size 8 -o "$W/llama_resume_one" --resume 1 > "$W/llama_resume_one.out" 2>&1
d=$(maxdiff "$W/llama_s3" "$W/llama_resume_one" 5)
if grep -q "resumed from" "$W/llama_resume_one.out" && [ "$(losses "$W/llama_resume_one" | wc -l)" -eq 5 ] && within "$d" 1e-5; then
    echo "PASS zero llama: a $N-rank stage-3 checkpoint resumed on 1 rank: steps 5-9 within $d (fp32 tol 1e-5)"
else
    echo "FAIL zero llama: a $N-rank stage-3 checkpoint resumed on 1 rank: diff $d $(grep -m1 error "$W/llama_resume_one.out")"
fi

if [ -n "$ONE_GPU" ]; then
    echo "SKIP zero memory per GPU, killed rank, mpirun: $N ranks share one GPU ($VISIBLE_GPUS GPU(s))"
    exit 0
fi
# memory, on GPT-2 124M (d12): the measured allocation per GPU falls with every stage
for stage in 0 1 2 3; do
    scripts/launch.sh $N ./train_gpt --model d12 --batch-size 1 --seq-len 64 --steps 0 --val-every 0 --sample-every 0 \
        --train-data "$TRAIN" --zero-stage $stage > "$W/memory$stage.out" 2>&1
    grep -E '^(data parallel|memory plan|device memory)' "$W/memory$stage.out" >> "$W/memory.txt"
    # this process's allocations: the memory in use after allocating less that in use before ("CUDA context"),
    # so that another process on the same GPU cancels out
    grep -m1 'device memory in use after allocation' "$W/memory$stage.out" | awk -v s=$stage '{printf "%d %.2f\n", s, $7 - $13}' >> "$W/memory_d12.txt"
    # the sharded part of the model states (measured less the unsharded working buffers) is the formula's
    states=$(grep -m1 '^model states per GPU' "$W/memory$stage.out")
    read -r measured formula working < <(printf '%s\n' "$states" | sed -E 's/.*measured ([0-9.]+) GiB, formula ([0-9.]+) GiB .* of which ([0-9.]+) GiB.*/\1 \2 \3/')
    if [ -n "$states" ] && awk -v m="$measured" -v f="$formula" -v w="$working" 'BEGIN { d = (m - w) / f - 1; exit !(d < 0.10 && d > -0.10) }'; then
        echo "PASS zero d12 stage $stage model states on $N GPUs: measured $measured GiB = $working GiB working buffers + shards within 10% of the formula's $formula GiB"
    else
        echo "FAIL zero d12 stage $stage model states on $N GPUs: ${states:-no model-states line}"
    fi
done
if [ "$(wc -l < "$W/memory_d12.txt")" -eq 4 ] && awk 'NR > 1 && $2 >= prev { bad = 1 } { prev = $2 } END { exit bad }' "$W/memory_d12.txt"; then
    echo "PASS zero d12 memory per GPU falls with the stage: $(tr '\n' ' ' < "$W/memory_d12.txt")(stage GiB)"
else
    echo "FAIL zero d12 memory per GPU does not fall with the stage: $(tr '\n' ' ' < "$W/memory_d12.txt")"
fi

# a rank that dies mid-run: the other one must end with a message naming it (its heartbeats stop, heartbeat.h), not hang
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + RANDOM % 12000)) WORLD_SIZE=2
RANK=0 LOCAL_RANK=0 ./train_gpt "${MODEL[@]}" --batch-size 4 --steps 100000 --nccl-timeout 30 > "$W/survivor.out" 2>&1 &
survivor=$!
RANK=1 LOCAL_RANK=1 ./train_gpt "${MODEL[@]}" --batch-size 4 --steps 100000 --nccl-timeout 30 > "$W/victim.out" 2>&1 &
victim=$!
sleep 20; kill -9 $victim 2> /dev/null
start=$(date +%s)
watchdog 90 $survivor
wait $survivor; rc=$?
elapsed=$(( $(date +%s) - start ))
watchdog_off
unset MASTER_ADDR MASTER_PORT WORLD_SIZE
if [ $rc -ne 0 ] && [ $rc -ne 137 ] && grep -q "rank 0: .*rank 1 was lost" "$W/survivor.out"; then
    echo "PASS zero a killed rank ends the job in ${elapsed} s with: $(grep -m1 'rank 0:' "$W/survivor.out")"
else
    echo "FAIL zero after a rank was killed the other exited with $rc after ${elapsed} s: $(tail -n 1 "$W/survivor.out")"
fi
# mpirun, when train_gpt was built with MPI
if command -v mpirun > /dev/null && ldd ./train_gpt | grep -q libmpi; then
    mpirun --allow-run-as-root -np $N -x NCCL_NVLS_ENABLE=0 ./train_gpt "${MODEL[@]}" --precision fp32 --batch-size $BG \
        --steps 10 --zero-stage 1 -o "$W/mpi" > "$W/mpi.out" 2>&1
    d=$(maxdiff "$W/single_fp32" "$W/mpi")
    if grep -q "(MPI)" "$W/mpi.out" && within "$d" 1e-5; then echo "PASS zero mpirun -np $N: losses match one GPU (max diff $d)"
    else echo "FAIL zero mpirun -np $N: $(grep -m1 -E 'error|MPI' "$W/mpi.out")"; fi
else
    echo "SKIP zero mpirun: train_gpt built without MPI"
fi
