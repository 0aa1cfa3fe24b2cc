#!/usr/bin/env bash
# Hugging Face transformers interoperability (scripts/hf/export_hf.py, scripts/hf/import_hf.py; transformers' side in
# test/tools/hf_interop_check.py, on the CPU in fp32):
#  1. a random GPT2LMHeadModel (2 layers, C=128, 2 heads, 64 positions, vocab 50257) -> fp32 model file -> HF:
#     the same logits (max abs difference <= 1e-5); the exported tokenizer encodes as GPT-2
#  2. train_gpt trains d2 (T=64) for 10 steps in fp32 and in bf16; its model files exported: transformers' loss on
#     the validation batches of train_gpt's last "val loss" line within 1e-5 (fp32) and 1e-3 (bf16); export then
#     import gives the model files back bit for bit
#  3. the random model of 1 imported: `train_gpt --model FILE --steps 0` (evaluation only) gives transformers'
#     validation loss within 1e-5 (fp32)
#  and bad input (a truncated model file, a config train_gpt cannot run): exit 1, one line, nothing written.
# Needs torch, transformers and safetensors in python3 ($PYTHON); skipped without them. The quick tier
# (TEST_TIER=quick) runs 2 in fp32 only (export, transformers' loss, import back): each transformers process
# takes seconds to start; 1, 3 and the bad input are full-tier checks. The modules are looked for, not imported,
# before the checks (an import costs seconds).
set -u
cd "$(dirname "$0")/.."
W=build/test_work/hf_interop
PY=${PYTHON:-python3}
TIER=${TEST_TIER:-full}
# found, not imported (importing torch and transformers takes seconds, and the checks import them anyway; an install
# that is found but does not import fails the checks that use it)
if ! $PY -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ('torch', 'transformers', 'safetensors')) else 1)" \
        > /dev/null 2>&1; then
    echo "SKIP hf_interop all checks: $PY cannot find torch, transformers and safetensors"
    exit 0
fi
rm -rf "$W"; mkdir -p "$W"
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
VAL="data/tinyshakespeare/tinyshakespeare_val_*.bin"
[ -n "$(ls $TRAIN $VAL 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL hf_interop data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
B=4; T=64; NB=4  # validation: the first NB batches of B x T tokens (train_gpt's --val-batches, --batch-size, --seq-len)
CHECK="$PY test/tools/hf_interop_check.py"
num='^-?[0-9][0-9.]*([eE][-+]?[0-9]+)?$'
within() { awk -v a="$1" -v b="$2" -v t="$3" -v n="$num" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a ~ n && b ~ n && d <= t) }'; }
absdiff() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.3g", d }'; }
val_loss_of_log() { grep "^# val step $2 loss" "$1/log.txt" | tail -n 1 | awk '{print $NF}'; }  # train_gpt's %.9g
hf_val_loss() { $CHECK val-loss "$1" --val-data "$VAL" --batch-size $B --seq-len $T --batches $NB 2> "$W/val_loss.err" | tail -n 1
    [ "${PIPESTATUS[0]}" -eq 0 ] || echo "error: $(tail -n 1 "$W/val_loss.err")"; }

# ---- 1. transformers -> fp32 model file -> transformers (full tier)
if [ "$TIER" = full ]; then
    $CHECK random "$W/hf_random" --layers 2 --channels 128 --heads 2 --positions $T --seed 5 > "$W/random.out" 2> "$W/random.err" \
        || { echo "FAIL hf_interop random model: $(tail -n 1 "$W/random.err")"; exit 1; }
    if ! { $PY scripts/hf/import_hf.py "$W/hf_random" "$W/imported.bin" > "$W/import.out" 2>&1 &&
           $PY scripts/hf/export_hf.py "$W/imported.bin" "$W/hf_roundtrip" > "$W/export.out" 2>&1; }; then
        echo "FAIL hf_interop hf -> fp32 model file -> hf: $(tail -q -n 1 "$W/import.out" "$W/export.out" 2>/dev/null | tail -n 1)"
    else
        d=$($CHECK logits "$W/hf_random" "$W/hf_roundtrip" 2> "$W/logits.err" | tail -n 1)
        if within "$d" 0 1e-5; then echo "PASS hf_interop hf -> fp32 model file -> hf: max abs logit difference $d (tol 1e-5; $(tail -n 1 "$W/random.out") parameters)"
        else echo "FAIL hf_interop hf -> fp32 model file -> hf: max abs logit difference '$d' (tol 1e-5) $(tail -n 1 "$W/logits.err")"; fi
        tok=$($CHECK tokenizer "$W/hf_roundtrip" 2> "$W/tokenizer.err" | tail -n 1)
        case "$tok" in ok*) echo "PASS hf_interop export tokenizer: $tok";; *) echo "FAIL hf_interop export tokenizer: '$tok' $(tail -n 1 "$W/tokenizer.err")";; esac
    fi
fi

# ---- 2. train_gpt's model files (fp32 and bf16) -> transformers: the same validation loss
SMALL=(--model d2 --max-seq-len $T --seq-len $T --batch-size $B --train-data "$TRAIN" --val-data "$VAL" --val-batches $NB
       --val-every 10 --sample-every 0 --steps 10 --lr 1e-3 --warmup-steps 2 --seed 3 --deterministic 1 --checkpoint-every 10)
for p in fp32 $([ "$TIER" = full ] && echo bf16); do
    tol=$([ $p = fp32 ] && echo 1e-5 || echo 1e-3)
    ./train_gpt "${SMALL[@]}" --precision $p -o "$W/train_$p" > "$W/train_$p.out" 2>&1 \
        || { echo "FAIL hf_interop export of a $p train_gpt model: training: $(tail -n 1 "$W/train_$p.out")"; continue; }
    model="$W/train_$p/model_00000010.bin"
    $PY scripts/hf/export_hf.py "$model" "$W/hf_$p" > "$W/export_$p.out" 2>&1 \
        || { echo "FAIL hf_interop export of a $p train_gpt model: $(tail -n 1 "$W/export_$p.out")"; continue; }
    ours=$(val_loss_of_log "$W/train_$p" 10); theirs=$(hf_val_loss "$W/hf_$p")
    if within "$ours" "$theirs" $tol; then
        echo "PASS hf_interop export of a $p train_gpt model (d2, 10 steps): val loss train_gpt $ours, transformers $theirs, |diff| $(absdiff "$ours" "$theirs") (tol $tol)"
    else
        echo "FAIL hf_interop export of a $p train_gpt model: val loss train_gpt '$ours', transformers '$theirs' (tol $tol)"
    fi
    $PY scripts/hf/import_hf.py "$W/hf_$p" "$W/reimported_$p.bin" $([ $p = bf16 ] && echo --bf16) > "$W/reimport_$p.out" 2>&1
    # bitwise but the checkpoint's run identity, header ints 240-243 (bytes 960-975), and the checksum, ints 254-255
    # (1016-1023), which import_hf.py leaves 0 (docs/formats.md)
    if cmp -s -n 960 "$model" "$W/reimported_$p.bin" && cmp -s -i 976 -n 40 "$model" "$W/reimported_$p.bin" &&
        cmp -s -i 1024 "$model" "$W/reimported_$p.bin"; then
        echo "PASS hf_interop $p model file -> export -> import: bitwise equal but the run identity and the checksum"
    else echo "FAIL hf_interop $p model file -> export -> import: files differ ($(tail -n 1 "$W/reimport_$p.out"))"; fi
done

# ---- 3. a transformers model evaluated by train_gpt (--steps 0: only the validation at step 0)
if [ -f "$W/imported.bin" ]; then
    ./train_gpt --model "$W/imported.bin" --steps 0 --precision fp32 --seq-len $T --batch-size $B --train-data "$TRAIN" \
        --val-data "$VAL" --val-every 1 --val-batches $NB --sample-every 0 --deterministic 1 -o "$W/eval" > "$W/eval.out" 2>&1
    ours=$(val_loss_of_log "$W/eval" 0); theirs=$(hf_val_loss "$W/hf_random")
    if within "$ours" "$theirs" 1e-5; then
        echo "PASS hf_interop import evaluated by train_gpt --steps 0 (fp32): val loss train_gpt $ours, transformers $theirs, |diff| $(absdiff "$ours" "$theirs") (tol 1e-5)"
    else
        echo "FAIL hf_interop import evaluated by train_gpt --steps 0: val loss train_gpt '$ours' ($(tail -n 1 "$W/eval.out")), transformers '$theirs' (tol 1e-5)"
    fi
fi

# ---- bad input: exit 1, one line on stderr naming the file, nothing written
bad() {  # bad NAME WRITTEN_PATH COMMAND...
    local name=$1 written=$2; shift 2
    "$@" > "$W/bad.out" 2> "$W/bad.err"; local rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l < "$W/bad.err")" -eq 1 ] && [ ! -e "$written" ] && [ -z "$(ls -d "$written".* "$(dirname "$written")"/.*tmp* 2>/dev/null)" ]; then
        echo "PASS hf_interop bad input, $name: $(cat "$W/bad.err")"
    else
        echo "FAIL hf_interop bad input, $name: exit $rc, stderr '$(head -c 300 "$W/bad.err")', written: $(ls -d "$written"* 2>/dev/null)"
    fi
}
if [ -f "$W/imported.bin" ]; then
    head -c 100000 "$W/imported.bin" > "$W/truncated.bin"
    bad "truncated model file" "$W/hf_bad" $PY scripts/hf/export_hf.py "$W/truncated.bin" "$W/hf_bad"
    mkdir -p "$W/hf_inner"; cp "$W/hf_random/model.safetensors" "$W/hf_inner/"
    $PY -c "import json, sys; c = json.load(open(sys.argv[1])); c['n_inner'] = 1000; json.dump(c, open(sys.argv[2], 'w'))" \
        "$W/hf_random/config.json" "$W/hf_inner/config.json"
    bad "n_inner not 4 x n_embd" "$W/bad.bin" $PY scripts/hf/import_hf.py "$W/hf_inner" "$W/bad.bin"
fi
