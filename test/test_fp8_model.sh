#!/usr/bin/env bash
# --precision fp8 on the GPU: build/test_fp8_model (one forward's loss, the gradients and 10 AdamW steps against bf16
# from the same weights, the scaling states), then train_gpt on Tiny Shakespeare: checkpoints are bf16's in both
# precisions, so a bf16 checkpoint resumes in fp8 and an fp8 one in bf16 (the resumed losses within 0.1 of the
# uninterrupted run's: the two precisions' curves differ by the FP8 rounding, a few 1e-2 here); an fp8 run resumed in
# fp8 is bitwise the uninterrupted one (current scaling keeps no state across steps); --fp8-stats 1 prints a line a
# step, no non-finite amax and the saturated values' count. --fp8-scaling delayed: 10 steps within 0.1 of current
# scaling's, and resumed from its step-5 checkpoint within 0.1 of the uninterrupted run (the amax history is not in
# checkpoints: the resumed run's first step takes current scaling); at --recompute 2 (the backward refilling the FP8
# copies that the LayerNorms and the GELU write) bitwise the --recompute 0 run. Skipped, with the reason, on a GPU
# without FP8 (test_fp8_model says which). A Llama-family model trains in fp8 within 0.1 of its bf16 run (full tier).
# The quick tier (TEST_TIER=quick) runs test_fp8_model whole, then bf16 and fp8 (--fp8-stats 1) and the fp8 run resumed
# in fp8, and of the parallel runs below one rank, pp 2 zb1 (within the pipeline tolerance of one rank) and tp 2 x pp 2;
# the resumes across precisions, --fp8-scaling delayed through train_gpt (test_fp8_model checks delayed scaling and its
# recompute levels), pp 2 1f1b and interleaved (and zb1 bitwise 1f1b), tp 2 and sequence parallelism only in the full tier.
set -u
cd "$(dirname "$0")/.."
TIER=${TEST_TIER:-full}
W=build/test_work/fp8_model
rm -rf "$W"; mkdir -p "$W"
./build/test_fp8_model | tee "$W/test_fp8_model.out"
rc=${PIPESTATUS[0]}
grep -q '^SKIP fp8_model' "$W/test_fp8_model.out" && exit $rc  # no GPU with FP8: the training runs would refuse too
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
[ -n "$(ls $TRAIN 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL fp8_model training data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
SMALL=(--layers 2 --heads 2 --channels 128 --max-seq-len 64 --seq-len 64 --batch-size 4 --train-data "$TRAIN" --val-every 0
       --sample-every 0 --lr 1e-3 --seed 7 --deterministic 1 --steps 10)
train_log_lines() { grep -v '^#' "$1/log.txt" | cut -d' ' -f1-2; }  # step and loss (%.9g: every bit)

# train NAME PRECISION [FLAGS...]: a run into $W/NAME; its stdout in $W/NAME.out
train() {
    local name=$1 precision=$2; shift 2
    ./train_gpt "${SMALL[@]}" --precision "$precision" -o "$W/$name" "$@" > "$W/$name.out" 2>&1 \
        || { echo "FAIL fp8_model training $name ($precision): $(tail -n 1 "$W/$name.out")"; return 1; }
}
# resume NAME PRECISION FROM: NAME continues FROM's step-5 checkpoint in PRECISION
resume() {
    local name=$1 precision=$2 from=$3
    mkdir -p "$W/$name"
    cp "$W/$from"/*_00000005* "$W/$name/"
    train "$name" "$precision" --resume 1 --checkpoint-every 5
}
# close NAME A B [FROM TOL]: steps FROM-9 (default 5) of run B within TOL (default 0.1) of run A's, all finite
close() {
    local name=$1 a=$2 b=$3 from=${4:-5} tol=${5:-0.1} worst
    worst=$(paste <(train_log_lines "$W/$a" | awk -v f="$from" '$1 >= f') <(train_log_lines "$W/$b" | awk -v f="$from" '$1 >= f') |
            awk -v steps=$((10 - from)) 'BEGIN { w = 0; n = 0 } { n++; d = $2 - $4; if (d < 0) d = -d; if (d > w) w = d } END { if (n != steps) print "missing"; else print w }')
    train_log_lines "$W/$b" | grep -qiE 'nan|inf' && worst=non-finite
    if [ "$worst" != missing ] && [ "$worst" != non-finite ] && awk -v w="$worst" -v t="$tol" 'BEGIN { exit !(w <= t) }'; then
        echo "PASS fp8_model $name: steps $from-9 within $worst of run $a's losses (tolerance $tol)"
    else
        echo "FAIL fp8_model $name: max |loss difference| $worst (tolerance $tol)"; paste <(train_log_lines "$W/$a") <(train_log_lines "$W/$b") | head -10
    fi
}

# single_rank_runs: the training runs on one rank described above (prints their check lines)
single_rank_runs() {
    if train bf16 bf16 --checkpoint-every 5 && train fp8 fp8 --checkpoint-every 5 --fp8-stats 1; then
        close "fp8 against bf16 (10 steps, same batches)" bf16 fp8
        stats=$(grep -c '^fp8 step .*non-finite amax 0 ' "$W/fp8.out")
        if [ "$stats" -eq 10 ] && grep -q '^fp8 (rank 0' "$W/fp8.out" && grep -q 'dense FP8 peak' "$W/fp8.out"; then
            echo "PASS fp8_model --fp8-stats 1: 10 step lines, no non-finite amax, the end-of-run line, the FP8 peak named"
        else
            echo "FAIL fp8_model --fp8-stats 1: $stats step lines without a non-finite amax; $(grep -m1 '^fp8 step' "$W/fp8.out")"
        fi
        if [ "$TIER" = full ]; then
            resume bf16-to-fp8 fp8 bf16 && grep -q "resumed from" "$W/bf16-to-fp8.out" && close "bf16 checkpoint resumed in fp8" bf16 bf16-to-fp8
            resume fp8-to-bf16 bf16 fp8 && grep -q "resumed from" "$W/fp8-to-bf16.out" && close "fp8 checkpoint resumed in bf16" fp8 fp8-to-bf16
        fi
        if [ "$TIER" = full ] && train delayed fp8 --checkpoint-every 5 --fp8-stats 1 --fp8-scaling delayed --fp8-amax-history 4; then
            close "fp8 delayed scaling against current (10 steps)" fp8 delayed
            if [ "$(grep -c '^fp8 step .*non-finite amax 0 | saturated values [0-9]* |' "$W/delayed.out")" -eq 10 ] &&
               grep -q 'precision fp8 (delayed scaling, amax history 4)' "$W/delayed.out"; then
                echo "PASS fp8_model --fp8-scaling delayed --fp8-stats 1: 10 step lines with the saturated values' count ($(grep '^fp8 step 10:' "$W/delayed.out" | grep -o 'saturated values [0-9]*')), the scaling named"
            else
                echo "FAIL fp8_model --fp8-scaling delayed --fp8-stats 1: $(grep -m1 '^fp8 step' "$W/delayed.out"); $(grep -m1 '^batch:' "$W/delayed.out")"
            fi
            if train delayed-recompute fp8 --fp8-scaling delayed --fp8-amax-history 4 --recompute 2; then
                if [ "$(train_log_lines "$W/delayed")" == "$(train_log_lines "$W/delayed-recompute")" ]; then
                    echo "PASS fp8_model --fp8-scaling delayed --recompute 2: the 10 losses bitwise those of --recompute 0"
                else
                    echo "FAIL fp8_model --fp8-scaling delayed --recompute 2: the losses differ from --recompute 0's"
                    paste <(train_log_lines "$W/delayed") <(train_log_lines "$W/delayed-recompute") | head -10
                fi
            fi
            mkdir -p "$W/delayed-resumed"
            cp "$W/delayed"/*_00000005* "$W/delayed-resumed/"
            train delayed-resumed fp8 --resume 1 --checkpoint-every 5 --fp8-scaling delayed --fp8-amax-history 4 &&
                close "fp8 delayed scaling resumed (its history afresh)" delayed delayed-resumed
        fi
        if resume fp8-to-fp8 fp8 fp8; then
            if [ "$(train_log_lines "$W/fp8" | awk '$1 >= 5')" == "$(train_log_lines "$W/fp8-to-fp8")" ] &&
               cmp -s -i 1024 "$W/fp8/model_00000010.bin" "$W/fp8-to-fp8/model_00000010.bin"; then
                echo "PASS fp8_model fp8 resumed in fp8: steps 5-9 and the final model file bitwise equal to the uninterrupted run"
            else
                echo "FAIL fp8_model fp8 resumed in fp8: differs from the uninterrupted run"
            fi
        fi
    fi
    # The Llama family (full tier): its products in FP8, each layer casting its input (no fused casts from the RMSNorm or
    # the SwiGLU), within the fp8-against-bf16 tolerance of its bf16 run
    if [ "$TIER" = full ]; then
        local llama=(--arch llama --kv-heads 1 --ffn 352 --tied-head 0)
        train llama-bf16 bf16 "${llama[@]}" && train llama-fp8 fp8 "${llama[@]}" --fp8-stats 1 &&
            close "Llama family: fp8 against bf16 (10 steps, same batches)" llama-bf16 llama-fp8 0
    fi
}

# Tensor, sequence and pipeline parallelism, ranks sharing the GPU (scripts/launch.sh --one-gpu), 4 layers, 4
# micro-batches of 2 rows a step. Pipeline stages run the same FP8 products on the same values as one rank, their layers' scales
# their own: within bf16's pipeline tolerance of one rank's losses (3e-2, test_pipeline.sh: the tied embedding's
# gradient summed across stages rounds differently); zb1 (its W casting each output gradient again with the scale its
# B took) bitwise 1F1B's losses and final model. Tensor-parallel ranks scale their own slices (a slice's amax, not
# the whole tensor's): the FP8 rounding differs from one rank's, within the fp8-against-bf16 tolerance (0.1); the
# step-0 gradient norm, before any rounding has compounded, within 2% of one rank's (a dropped or doubled sum over
# the ranks moves it by far more).
PAR=(--batch-size 2 --total-batch-tokens 512 --checkpoint-every 10)
PSMALL=(--layers 4 "${SMALL[@]:2}")  # 4 layers: 2 chunks of one on each of 2 stages when interleaved
# ptrain NAME RANKS [FLAGS...]: an fp8 run on RANKS ranks sharing GPU 0
ptrain() {
    local name=$1 ranks=$2; shift 2
    if [ "$ranks" -eq 1 ]; then ./train_gpt "${PSMALL[@]}" "${PAR[@]}" --precision fp8 -o "$W/$name" "$@" > "$W/$name.out" 2>&1
    else scripts/launch.sh --one-gpu "$ranks" ./train_gpt "${PSMALL[@]}" "${PAR[@]}" --precision fp8 -o "$W/$name" "$@" > "$W/$name.out" 2>&1; fi \
        || { echo "FAIL fp8_model training $name ($ranks ranks): $(grep -m1 -iE 'error' "$W/$name.out" || tail -n 1 "$W/$name.out")"; return 1; }
}
# within_of NAME REF TOL: all 10 steps' losses of NAME within TOL of REF's
within_of() { close "$1" "$2" "$1" 0 "$3"; }
# norm_of NAME REF: step 0's gradient norm within 2% of REF's
norm_of() {
    local a b
    a=$(grep -v '^#' "$W/$2/log.txt" | awk '$1 == 0 { print $4 }'); b=$(grep -v '^#' "$W/$1/log.txt" | awk '$1 == 0 { print $4 }')
    if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d <= 0.02) }'; then
        echo "PASS fp8_model $1: step 0's gradient norm $b, $2's $a (within 2%)"
    else
        echo "FAIL fp8_model $1: step 0's gradient norm '$b' against $2's '$a' (2%)"
    fi
}
# parallel_runs: the runs described above, ranks sharing GPU 0 (prints their check lines)
parallel_runs() {
    if ptrain par1 1; then
        if [ "$TIER" != full ]; then
            # quick: zb1 alone, against one rank (the full tier: against 1f1b, bitwise)
            ptrain pp2z 2 --pipeline-parallel 2 --pipeline-schedule zb1 && within_of pp2z par1 3e-2
            ptrain tp2pp2 4 --tensor-parallel 2 --pipeline-parallel 2 && within_of tp2pp2 par1 0.1 && norm_of tp2pp2 par1
        else
            ptrain pp2 2 --pipeline-parallel 2 && within_of pp2 par1 3e-2
            ptrain pp2i 2 --pipeline-parallel 2 --pipeline-schedule interleaved && within_of pp2i par1 3e-2
            if ptrain pp2z 2 --pipeline-parallel 2 --pipeline-schedule zb1; then
                if [ "$(train_log_lines "$W/pp2")" == "$(train_log_lines "$W/pp2z")" ] && cmp -s -i 1024 "$W/pp2/model_00000010.bin" "$W/pp2z/model_00000010.bin"; then
                    echo "PASS fp8_model pp 2 zb1: the 10 losses and the final model bitwise 1f1b's"
                else
                    echo "FAIL fp8_model pp 2 zb1: differs from 1f1b"; paste <(train_log_lines "$W/pp2") <(train_log_lines "$W/pp2z") | head -4
                fi
            fi
            ptrain pp2z_delayed 2 --pipeline-parallel 2 --pipeline-schedule zb1 --fp8-scaling delayed --recompute 2 &&
                ptrain pp2_delayed 2 --pipeline-parallel 2 --fp8-scaling delayed --recompute 2 &&
                if [ "$(train_log_lines "$W/pp2_delayed")" == "$(train_log_lines "$W/pp2z_delayed")" ]; then
                    echo "PASS fp8_model pp 2 zb1 delayed scaling --recompute 2: the 10 losses bitwise 1f1b's"
                else
                    echo "FAIL fp8_model pp 2 zb1 delayed scaling --recompute 2: differs from 1f1b"
                fi
            ptrain tp2 2 --tensor-parallel 2 && within_of tp2 par1 0.1 && norm_of tp2 par1
            ptrain tp2_delayed 2 --tensor-parallel 2 --fp8-scaling delayed && ptrain par1_delayed 1 --fp8-scaling delayed && within_of tp2_delayed par1_delayed 0.1
            ptrain sp2 2 --tensor-parallel 2 --sequence-parallel 1 --fp8-scaling delayed && within_of sp2 par1_delayed 0.1 && norm_of sp2 par1_delayed
            ptrain tp2pp2 4 --tensor-parallel 2 --pipeline-parallel 2 && within_of tp2pp2 par1 0.1 && norm_of tp2pp2 par1
        fi
    fi
}

# The one-rank runs and the parallel ones run side by side, as two jobs (their time is mostly start-up: CUDA, NCCL),
# and their lines are printed in that order.
single_rank_runs > "$W/single_rank.checks" 2>&1 & single=$!
parallel_runs > "$W/parallel.checks" 2>&1 & parallel=$!
wait $single; wait $parallel
cat "$W/single_rank.checks" "$W/parallel.checks"
[ $rc -eq 0 ]
