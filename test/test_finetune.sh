#!/usr/bin/env bash
# scripts/train/finetune.sh end to end, with no network. The stand-in for a downloaded model: a Llama-family d2 (T=128,
# GPT-2's vocabulary) trained 40 steps in bf16 by train_gpt and exported (export_hf.py: BF16 tensors), with GPT-2's
# tokenizer as a tokenizer.json (test/tools/make_tokenizer_json.py), tokenizer_config.json, special_tokens_map.json,
# generation_config.json and eos/bos ids 50256; the data: tinyshakespeare's paragraphs as conversations (a paragraph
# asks, the next answers). Checked:
#  - LoRA, the recipe's defaults but for 200 steps at a higher lr: every step's files; the import is the stand-in's
#    model file (bf16, bitwise but the run identity and checksum); the plain template (no Llama 3 tokens); the loss
#    and the validation loss fall; the exported folder holds the source's tokenizer files and token ids, and
#    transformers loads it: its logits are train_gpt's merged model's (llama_reference.py, tol 1e-4 of the largest),
#    its tokenizer is GPT-2's; with peft, PeftModel.from_pretrained(the source folder, adapters/) gives those logits
#    (tol 1e-5) while the base's differ; the masked loss: the fine-tuned model's validation loss in fp32 (counted
#    targets only) equals PyTorch's cross-entropy with ignore_index over the same windows (tol 1e-4);
#  - the same command again: the import kept, the training resumed at its last checkpoint (no step trained), the
#    merged model bitwise the same;
#  - full tier: FULL=1 in fp32: the loss falls, the export's logits are its last checkpoint's (tol 1e-4);
#  - refusals, one line on stderr naming the step or the file: a missing folder, data file or tokenizer.json, and a
#    config the import refuses (its own message).
# Needs numpy (the import and export); the transformers and peft checks are skipped without them.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/finetune
PY=${PYTHON:-python3}
TIER=${TEST_TIER:-full}
rm -rf "$W"; mkdir -p "$W"
has() { $PY -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in sys.argv[1:]) else 1)" "$@" > /dev/null 2>&1; }
if ! has numpy; then echo "SKIP finetune: $PY cannot find numpy (import_hf.py and export_hf.py need it)"; exit 0; fi
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
[ -n "$(ls $TRAIN 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL finetune data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
LCHECK="$PY test/tools/hf_llama_check.py"
num='^-?[0-9][0-9.]*([eE][-+]?[0-9]+)?$'
within() { awk -v a="$1" -v b="$2" -v t="$3" -v n="$num" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a ~ n && b ~ n && d <= t) }'; }
# bitwise but a checkpoint's run identity (header ints 240-243) and checksum (254-255), which an import leaves 0
same_model() { cmp -s -n 960 "$1" "$2" && cmp -s -i 976 -n 40 "$1" "$2" && cmp -s -i 1024 "$1" "$2"; }

# ---- the stand-in for a downloaded model, and the conversations
HF=$W/hf_model
./train_gpt --model d2 --arch llama --max-seq-len 128 --seq-len 128 --batch-size 8 --train-data "$TRAIN" --val-every 0 \
    --sample-every 0 --steps 40 --lr 1e-3 --warmup-steps 4 --seed 5 --checkpoint-every 40 -o "$W/pretrain" > "$W/pretrain.out" 2>&1 \
    || { echo "FAIL finetune stand-in model: training: $(tail -n 1 "$W/pretrain.out")"; exit 1; }
STAND_IN=$W/pretrain/model_00000040.bin
$PY scripts/hf/export_hf.py "$STAND_IN" "$HF" > "$W/stand_in_export.out" 2>&1 \
    || { echo "FAIL finetune stand-in model: export: $(tail -n 1 "$W/stand_in_export.out")"; exit 1; }
$PY test/tools/make_tokenizer_json.py --out "$HF/tokenizer.json" > "$W/tokenizer.out" 2>&1 \
    || { echo "FAIL finetune stand-in tokenizer: $(tail -n 1 "$W/tokenizer.out")"; exit 1; }
$PY - "$HF" "data/tinyshakespeare/input.txt" "$W/conversations.jsonl" << 'PY'
import json, os, sys
folder, text, conversations = sys.argv[1:]
def write(name, value):
    with open(os.path.join(folder, name), "w") as f:
        json.dump(value, f, indent=2)
with open(os.path.join(folder, "config.json")) as f:
    config = json.load(f)
write("config.json", dict(config, bos_token_id=50256, eos_token_id=50256))
write("generation_config.json", {"bos_token_id": 50256, "eos_token_id": 50256})
write("tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
                                "eos_token": "<|endoftext|>", "model_max_length": 128})
write("special_tokens_map.json", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})
paragraphs = [p.strip() for p in open(text, encoding="utf-8").read().split("\n\n") if p.strip()]
with open(conversations, "w", encoding="utf-8") as f:
    for question, answer in zip(paragraphs[0::2], paragraphs[1::2]):
        f.write(json.dumps({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}) + "\n")
PY
DATA=$W/conversations.jsonl

losses_fall() {  # losses_fall NAME RUN_DIR: the mean of the last 5 step losses below the first, and the last validation below step 0's
    local name=$1 log=$2/log.txt
    local first last val0 valn
    first=$(grep -v '^#' "$log" | head -n 1 | cut -d' ' -f2)
    last=$(grep -v '^#' "$log" | tail -n 5 | awk '{ s += $2 } END { if (NR) printf "%.6f", s / NR }')
    val0=$(grep '^# val step 0 ' "$log" | awk '{print $NF}'); valn=$(grep '^# val step' "$log" | tail -n 1 | awk '{print $NF}')
    if awk -v a="$first" -v b="$last" -v c="$val0" -v d="$valn" 'BEGIN { exit !(b < a && d < c) }'; then
        echo "PASS finetune $name: the loss falls (first step $first, mean of the last 5 $last; validation $val0 -> $valn)"
    else echo "FAIL finetune $name: the loss does not fall (first step '$first', last 5 '$last'; validation '$val0' -> '$valn')"; fi
}
files_exist() {  # files_exist NAME FILE...
    local name=$1 missing=""; shift
    for f in "$@"; do [ -s "$f" ] || missing="$missing $f"; done
    if [ -z "$missing" ]; then echo "PASS finetune $name: every step's files ($#)"; else echo "FAIL finetune $name: missing:$missing"; fi
}
TRANSFORMERS=0; has torch transformers safetensors && TRANSFORMERS=1

# ---- LoRA (the default): 200 steps at a higher lr, every other setting the recipe's
OUT=$W/lora
RECIPE=(env PYTHON="$PY" STEPS=200 LR=1e-3 VAL_FRACTION=0.05 timeout 600 bash scripts/train/finetune.sh "$HF" "$DATA" "$OUT" --seed 7 --val-batches 4)
"${RECIPE[@]}" > "$W/lora.out" 2> "$W/lora.err"; rc=$?
if [ $rc -ne 0 ]; then
    echo "FAIL finetune LoRA recipe: exit $rc: $(tail -n 1 "$W/lora.err")"
else
    steps_shown=$(grep -c '^finetune.sh: \[[1-5]/5\] ' "$W/lora.out")
    if [ "$steps_shown" -eq 5 ] && grep -q 'import: .* in bf16' "$W/lora.out" && grep -q 'template plain' "$W/lora.out" && [ ! -s "$W/lora.err" ]; then
        echo "PASS finetune LoRA recipe: 5 steps, each one line (import in bf16 as the folder's BF16 tensors, the plain template)"
    else echo "FAIL finetune LoRA recipe: step lines $steps_shown of 5, '$(grep -m1 'import:' "$W/lora.out")', '$(grep -m1 'shards:' "$W/lora.out")', stderr '$(head -c 200 "$W/lora.err")'"; fi
    files_exist "LoRA outputs" "$OUT/base.bin" "$OUT/data/chat_train_000000.bin" "$OUT/data/chat_train_000000.bin.mask" \
        "$OUT/data/chat_val_000000.bin" "$OUT/data/chat_val_000000.bin.mask" "$OUT/run/log.txt" "$OUT/run/adapters_00000200.bin" \
        "$OUT/adapters/adapter_config.json" "$OUT/adapters/adapter_model.safetensors" "$OUT/merged.bin" "$OUT/hf/config.json" \
        "$OUT/hf/model.safetensors" "$OUT/hf/tokenizer.json" "$OUT/hf/tokenizer_config.json" "$OUT/hf/special_tokens_map.json" \
        "$OUT/hf/generation_config.json"
    if same_model "$STAND_IN" "$OUT/base.bin"; then echo "PASS finetune import: base.bin is the stand-in's bf16 model file (but the run identity and checksum)"
    else echo "FAIL finetune import: base.bin differs from the stand-in's model file"; fi
    losses_fall "LoRA" "$OUT/run"
    copied=""
    for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do cmp -s "$HF/$f" "$OUT/hf/$f" || copied="$copied $f"; done
    ids=$($PY -c "import json, sys; c = json.load(open(sys.argv[1])); print(c.get('bos_token_id'), c.get('eos_token_id'))" "$OUT/hf/config.json" 2>&1)
    if [ -z "$copied" ] && [ "$ids" = "50256 50256" ]; then echo "PASS finetune export: the source's tokenizer files and token ids (bos, eos $ids)"
    else echo "FAIL finetune export: files not the source's:${copied:- none}; bos, eos '$ids'"; fi

    if [ $TRANSFORMERS = 0 ]; then
        echo "SKIP finetune transformers checks: $PY cannot find torch, transformers and safetensors"
    else
        r=$($LCHECK ours-vs-hf "$OUT/merged.bin" "$OUT/hf" 2> "$W/lora_logits.err" | tail -n 1)
        if within "$r" 0 1e-4; then echo "PASS finetune export loads in transformers: its logits vs train_gpt's merged model's (llama_reference.py): max |diff| / max |logit| $r (tol 1e-4)"
        else echo "FAIL finetune export's logits vs the merged model's: '$r' (tol 1e-4) $(tail -n 1 "$W/lora_logits.err")"; fi
        tok=$($PY -c "
import sys, transformers
t = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
print(t('Hello world').input_ids, t.eos_token_id, len(t))" "$OUT/hf" 2> "$W/tokenizer_load.err" | tail -n 1)
        if [ "$tok" = "[15496, 995] 50256 50257" ]; then echo "PASS finetune export's tokenizer loads with AutoTokenizer: GPT-2's ids, eos 50256, 50257 tokens"
        else echo "FAIL finetune export's tokenizer: '$tok' (expected '[15496, 995] 50256 50257') $(tail -n 1 "$W/tokenizer_load.err")"; fi
        if ! has peft; then
            echo "SKIP finetune PEFT adapters: $PY cannot find peft"
        else
            r=$($LCHECK peft-vs-merged "$HF" "$OUT/adapters" "$OUT/hf" 2> "$W/peft.err" | tail -n 1)
            d=$($LCHECK hf-vs-hf "$HF" "$OUT/hf" 2> /dev/null | tail -n 1)
            if within "$r" 0 1e-5 && ! within "$d" 0 1e-6; then
                echo "PASS finetune PEFT adapters: PeftModel.from_pretrained(the source folder, adapters/) gives the export's logits: max |diff| / max |logit| $r (tol 1e-5; the adapters move them by $d)"
            else echo "FAIL finetune PEFT adapters: PeftModel vs export '$r' (tol 1e-5), source vs export '$d' (must differ) $(tail -n 1 "$W/peft.err")"; fi
        fi
    fi

    # the masked loss against PyTorch: train_gpt's validation loss of the merged model in fp32 (the mean over the
    # counted targets of the validation shard's first 4 x 8 windows) against F.cross_entropy(ignore_index) over the same
    # windows in llama_reference.py (fp32 on the CPU). Tolerance 1e-4: fp32 on both sides differ in the order of their
    # sums (about 1e-6 of a logit); a loss over every target, or a mask shifted by one, moves it by more than 0.1.
    if ! has torch; then
        echo "SKIP finetune masked loss vs PyTorch: $PY cannot find torch"
    else
        ./train_gpt --model "$OUT/merged.bin" --tokenizer "$HF" --train-data "$OUT/data/chat_train_*.bin" --val-data "$OUT/data/chat_val_*.bin" \
            --seq-len 128 --batch-size 8 --precision fp32 --steps 0 --val-every 1 --val-batches 4 --sample-every 0 > "$W/masked_val.out" 2>&1
        ours=$(grep -m1 '^step 0: val loss' "$W/masked_val.out" | awk '{print $5}')
        ref=$($LCHECK masked-loss "$OUT/merged.bin" "$OUT/data/chat_val_000000.bin" 32 2> "$W/masked_ref.err" | tail -n 1)
        if within "$ours" "${ref%% *}" 1e-4; then
            echo "PASS finetune masked loss vs PyTorch: the fine-tuned model's validation loss $ours, F.cross_entropy over the counted targets ${ref%% *} (${ref##* } targets; tol 1e-4)"
        else echo "FAIL finetune masked loss vs PyTorch: train_gpt '$ours' ($(tail -n 1 "$W/masked_val.out")), PyTorch '$ref' $(tail -n 1 "$W/masked_ref.err")"; fi
    fi

    # the same command again: nothing imported or trained anew, the same merged model
    cp "$OUT/merged.bin" "$W/merged_first.bin"
    trained=$(grep -vc '^#' "$OUT/run/log.txt")
    "${RECIPE[@]}" > "$W/again.out" 2> "$W/again.err"; rc=$?
    if [ $rc -eq 0 ] && grep -q 'import: .* kept' "$W/again.out" && [ "$(grep -vc '^#' "$OUT/run/log.txt")" = "$trained" ] &&
       cmp -s "$W/merged_first.bin" "$OUT/merged.bin"; then
        echo "PASS finetune run again: the import kept, the training resumed at its last checkpoint (no step trained), the merged model bitwise the same"
    else echo "FAIL finetune run again: exit $rc, '$(grep -m1 'import' "$W/again.out")', step lines $trained -> $(grep -vc '^#' "$OUT/run/log.txt"), $(tail -n 1 "$W/again.err")"; fi
fi

# ---- full fine-tuning in fp32 (full tier)
if [ "$TIER" = full ]; then
    OUT=$W/full
    env PYTHON="$PY" FULL=1 PRECISION=fp32 STEPS=20 LR=3e-4 VAL_FRACTION=0.05 timeout 600 bash scripts/train/finetune.sh "$HF" "$DATA" "$OUT" \
        --seed 7 --val-batches 4 > "$W/full.out" 2> "$W/full.err"; rc=$?
    if [ $rc -ne 0 ]; then
        echo "FAIL finetune full fine-tuning recipe: exit $rc: $(tail -n 1 "$W/full.err")"
    else
        files_exist "full fine-tuning outputs" "$OUT/base.bin" "$OUT/run/model_00000020.bin" "$OUT/hf/config.json" "$OUT/hf/model.safetensors" \
            "$OUT/hf/tokenizer.json"
        losses_fall "full fine-tuning" "$OUT/run"
        if [ $TRANSFORMERS = 1 ]; then
            r=$($LCHECK ours-vs-hf "$OUT/run/model_00000020.bin" "$OUT/hf" 2> "$W/full_logits.err" | tail -n 1)
            if within "$r" 0 1e-4; then echo "PASS finetune full fine-tuning export: its logits vs the last checkpoint's: max |diff| / max |logit| $r (tol 1e-4)"
            else echo "FAIL finetune full fine-tuning export's logits: '$r' (tol 1e-4) $(tail -n 1 "$W/full_logits.err")"; fi
        fi
    fi
fi

# ---- refusals: exit 1, one line on stderr
refused() {  # refused NAME EXPECTED_TEXT HF_FOLDER DATA
    local name=$1 expected=$2
    env PYTHON="$PY" bash scripts/train/finetune.sh "$3" "$4" "$W/refused" > /dev/null 2> "$W/refused.err"; local rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l < "$W/refused.err")" -eq 1 ] && grep -qF -- "$expected" "$W/refused.err"; then
        echo "PASS finetune refuses $name: $(cat "$W/refused.err")"
    else echo "FAIL finetune refuses $name: exit $rc, stderr '$(head -c 300 "$W/refused.err")' (expected one line with '$expected')"; fi
}
refused "a missing folder" "$W/nowhere: no such folder" "$W/nowhere" "$DATA"
refused "a missing data file" "$W/none.jsonl: no such file" "$HF" "$W/none.jsonl"
mkdir -p "$W/no_tokenizer"; cp "$HF/config.json" "$HF/model.safetensors" "$W/no_tokenizer/"
refused "a folder without tokenizer.json" "$W/no_tokenizer/tokenizer.json: missing" "$W/no_tokenizer" "$DATA"
cp -r "$HF" "$W/yarn"
$PY -c "import json, sys; c = json.load(open(sys.argv[1])); c['rope_scaling'] = {'rope_type': 'yarn', 'factor': 4.0}; json.dump(c, open(sys.argv[1], 'w'))" \
    "$W/yarn/config.json"
refused "a config the import refuses" 'import failed: import_hf.py: error: '"$W"'/yarn/config.json: rope_scaling.rope_type is "yarn"' "$W/yarn" "$DATA"
