#!/usr/bin/env bash
# Training on chat data (masked targets) on the GPU, a few steps of a small GPT-2 each:
#  - all ones: tinyshakespeare's shards with a mask of all ones beside them train bitwise as without masks (losses and
#    validation losses, with gradient accumulation): the counted-token mean is the row mean then;
#  - uncounted tokens: chat shards from prepare_shards --chat, and a copy whose padding (every token after a window's
#    last counted one) is changed: the losses are bitwise equal (those tokens are targets that do not count, and
#    inputs only to positions that do not count either); a copy with one counted token per window changed differs
#    (the check can fail);
#  - the loss is the mean over the counted targets: an untrained model's first loss on the chat shards is about
#    ln(V), as every counted target is equally unknown to it (a mean over every row would add the uncounted rows'
#    zeros and lie far below).
#  - every mode (full tier): data, pipeline and tensor (with sequence) parallelism on masked data against one rank.
# The quick tier runs the first three (a few seconds a run).
set -u
cd "$(dirname "$0")/.."
source test/watchdog.sh  # watchdog, watchdog_off
W=build/test_work/chat_training
rm -rf "$W"; mkdir -p "$W"
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
[ -n "$(ls $TRAIN 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL chat_training data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
T=128
SMALL=(--layers 4 --heads 4 --channels 256 --max-seq-len $T --seq-len $T --batch-size 8 --total-batch-tokens $((2 * 8 * T))
       --val-every 5 --val-batches 2 --sample-every 0 --lr 1e-3 --warmup-steps 2 --seed 7 --shuffle 1 --deterministic 1)
losses() { grep -v '^#' "$1/log.txt" | cut -d' ' -f1-2; grep '^# val' "$1/log.txt"; }  # step, loss (%.9g: every bit), val lines
train() {  # train DIR TRAIN_GLOB VAL_GLOB
    ./train_gpt "${SMALL[@]}" --steps 10 --train-data "$2" --val-data "$3" -o "$W/$1" > "$W/$1.out" 2>&1 \
        || { echo "FAIL chat_training $1: $(tail -n 1 "$W/$1.out")"; return 1; }
}
# write_mask SHARD WINDOW ones: a mask shard of all ones (docs/formats.md) beside SHARD
write_mask() {
    python3 - "$@" << 'PY'
import sys, numpy as np
shard, window = sys.argv[1], int(sys.argv[2])
n = int(np.fromfile(shard, dtype=np.int32, count=256)[2])
mask = np.ones(n, dtype=np.uint8)
header = np.zeros(256, dtype=np.int32)
header[:5] = [20261215, 1, n, window, int(mask.sum())]
with open(shard + ".mask", "wb") as f:
    f.write(header.tobytes()); f.write(mask.tobytes())
PY
}

# (a) all ones
mkdir -p "$W/ones_data"
for s in data/tinyshakespeare/tinyshakespeare_{train,val}_000000.bin; do cp "$s" "$W/ones_data/"; done
for s in "$W"/ones_data/*.bin; do write_mask "$s" $T ones; done
if train plain "$TRAIN" "data/tinyshakespeare/tinyshakespeare_val_*.bin" && train ones "$W/ones_data/tinyshakespeare_train_*.bin" "$W/ones_data/tinyshakespeare_val_*.bin"; then
    if [ "$(losses "$W/plain")" == "$(losses "$W/ones")" ] && [ "$(losses "$W/plain" | wc -l)" -ge 12 ]; then
        echo "PASS chat_training a mask of all ones: losses and validation losses bitwise those without masks"
    else
        echo "FAIL chat_training a mask of all ones: losses differ"; diff <(losses "$W/plain") <(losses "$W/ones") | head -4
    fi
fi

# (b) chat shards: conversations of tinyshakespeare's paragraphs (a paragraph asks, the next answers)
python3 - "$W/conversations.jsonl" << 'PY'
import json, sys
paragraphs = [p.strip() for p in open("data/tinyshakespeare/input.txt").read().split("\n\n") if p.strip()]
with open(sys.argv[1], "w") as f:
    for q, a in zip(paragraphs[0::2], paragraphs[1::2]):
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
PY
build/prepare_shards --chat --seq-len $T --val-fraction 0.05 --out "$W/chat/c" "$W/conversations.jsonl" > "$W/prepare_chat.log" 2>&1 \
    || { echo "FAIL chat_training prepare_shards --chat: $(tail -n 1 "$W/prepare_chat.log")"; exit 1; }
echo "# chat_training: $(grep padding "$W/prepare_chat.log")"
# copies with the padding changed, and with one counted token a window changed
change() {  # change DIR padding|counted
    mkdir -p "$W/$1"
    python3 - "$W/chat" "$W/$1" "$2" $T << 'PY'
import glob, os, shutil, sys, numpy as np
src, dst, what, T = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
for shard in sorted(glob.glob(src + "/*.bin")):
    header = np.fromfile(shard, dtype=np.int32, count=256)
    tokens = np.fromfile(shard, dtype=np.uint16, offset=1024)
    mask = np.fromfile(shard + ".mask", dtype=np.uint8, offset=1024)
    for w in range(len(tokens) // T):
        counted = np.nonzero(mask[w * T:(w + 1) * T])[0]
        if what == "padding":
            start = w * T + counted[-1] + 1  # after the window's last counted token
            tokens[start:(w + 1) * T] = (np.arange(start, (w + 1) * T) * 7919) % 50000
        else:
            tokens[w * T + counted[0]] = (tokens[w * T + counted[0]] + 1) % 50000
    out = os.path.join(dst, os.path.basename(shard))
    with open(out, "wb") as f:
        f.write(header.tobytes()); f.write(tokens.tobytes())
    shutil.copy(shard + ".mask", out + ".mask")
PY
}
change padded padding
change recounted counted
if train chat "$W/chat/c_train_*.bin" "$W/chat/c_val_*.bin" && train padded "$W/padded/c_train_*.bin" "$W/padded/c_val_*.bin" &&
   train recounted "$W/recounted/c_train_*.bin" "$W/recounted/c_val_*.bin"; then
    if [ "$(losses "$W/chat")" == "$(losses "$W/padded")" ] && [ "$(losses "$W/chat" | wc -l)" -ge 12 ]; then
        echo "PASS chat_training uncounted targets changed: losses and validation losses bitwise equal"
    else
        echo "FAIL chat_training uncounted targets changed: losses differ"; diff <(losses "$W/chat") <(losses "$W/padded") | head -4
    fi
    if [ "$(losses "$W/chat" | head -n 1)" != "$(losses "$W/recounted" | head -n 1)" ]; then
        echo "PASS chat_training a counted token changed: the first loss differs"
    else
        echo "FAIL chat_training a counted token changed: the loss did not change (are the masks read?)"
    fi
    # an untrained model's loss is about ln(50257) = 10.8 on every counted target; a row mean over the window would
    # count the uncounted rows' zeros and lie far below (the windows are mostly prompt and padding)
    first=$(losses "$W/chat" | head -n 1 | cut -d' ' -f2)
    if python3 -c "import sys; sys.exit(0 if abs(float('$first') - 10.82) < 0.5 else 1)"; then
        echo "PASS chat_training the loss is the mean over counted targets: step 0 loss $first, about ln(V) = 10.82"
    else
        echo "FAIL chat_training the loss is the mean over counted targets: step 0 loss $first, expected about ln(V) = 10.82"
    fi
fi

# (d) every mode (full tier): the chat shards in fp32 on 2 data-parallel ranks, 2 pipeline stages and 2 tensor-parallel
# ranks with sequence parallelism (ranks sharing GPU 0 where there is one), against one rank with the same global batch:
# each mode serves the masked targets and divides by the step's counted targets over all ranks. Tolerance: fp32's
# reduction orders, as the tensor_parallel, pipeline and zero suites (1e-5; pipeline 2e-5).
if [ "${TEST_TIER:-full}" = full ] && [ -f "$W/chat.out" ]; then
    source test/loss_logs.sh  # launch_mode, losses (training steps only from here on), maxdiff, within
    chat=(--precision fp32 --steps 6 --val-every 0 --train-data "$W/chat/c_train_*.bin")
    ./train_gpt "${SMALL[@]}" "${chat[@]}" -o "$W/mode_one" > "$W/mode_one.out" 2>&1 || echo "FAIL chat_training one rank (fp32): $(tail -n 1 "$W/mode_one.out")"
    while read -r name tol flags; do
        read -ra extra <<< "$flags"
        scripts/launch.sh $(launch_mode 2) 2 ./train_gpt "${SMALL[@]}" "${chat[@]}" "${extra[@]}" -o "$W/mode_$name" > "$W/mode_$name.out" 2>&1
        d=$(maxdiff "$W/mode_one" "$W/mode_$name")
        if [ "$(losses "$W/mode_$name" | wc -l)" -eq 6 ] && within "$d" "$tol"; then
            echo "PASS chat_training masked targets under $name ($flags): 6 steps' losses against one rank's: max diff $d (tol $tol)"
        else
            echo "FAIL chat_training masked targets under $name: max loss diff ${d:-none} (tol $tol) $(grep -m1 -iE 'error' "$W/mode_$name.out")"
        fi
    done << 'MODES'
data_parallel 1e-5 --zero-stage 1
pipeline 2e-5 --pipeline-parallel 2
tensor_sequence_parallel 1e-5 --tensor-parallel 2 --sequence-parallel 1
MODES
fi
