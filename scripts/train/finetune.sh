#!/usr/bin/env bash
# Fine-tunes a Hugging Face model on chat data and gives it back as a Hugging Face folder.
#   scripts/train/finetune.sh HF_FOLDER DATA.jsonl [OUT_DIR] [train_gpt flags...]
# HF_FOLDER: a transformers folder (config.json; model.safetensors or model.safetensors.index.json and its shards;
# tokenizer.json; maybe generation_config.json) of a model import_hf.py reads: Llama, Qwen2, Mistral or GPT-2.
# DATA.jsonl: one conversation a line, {"messages": [{"role": ..., "content": ...}, ...]} or {"prompt", "completion"}.
# OUT_DIR (default log/finetune_NAME in the repository, NAME the folder's name) gets, one step each:
#   1. import  base.bin: the folder as a model file (import_hf.py), in the folder's precision: bf16 when its tensors
#              are BF16 (their values exactly, at half the size of fp32), else fp32 (F16 and F32 exactly);
#              skipped when base.bin is newer than every file of the folder and of that precision
#   2. shards  data/chat_{train,val}_*.bin and their masks (prepare_shards --chat): the template from the family,
#              llama3 for a Llama whose tokenizer.json has <|start_header_id|>, chatml for Qwen2 or a tokenizer with
#              <|im_start|> (SmolLM2), else plain
#   3. check   train_gpt --dry-run 1 with the run's flags: every check that needs no GPU, and the steps of an epoch
#   4. train   run/ (checkpoints, log.txt; --resume 1 continues them); LoRA on every projection by default, writing
#              adapters/ (a PEFT folder; GPT-2: adapters.bin, our adapter file) and merged.bin (base + adapters, fp32),
#              or with FULL=1 the whole model (its last checkpoint's model file is the result: bf16 after bf16 or
#              fp8 training, else fp32)
#   5. export  hf/: the result as a transformers folder (export_hf.py) with the folder's tokenizer files and token ids
# Each step prints one line; a failing one prints one line on stderr naming the step and exits 1 (the tools' output
# is in OUT_DIR/logs/, and train_gpt's shows as it trains). Flags after OUT_DIR go to train_gpt, after the recipe's
# (so they override it); with --dry-run 1 among them the recipe stops after the check.
# Environment (defaults in brackets):
#   FULL [0]            1: full fine-tuning instead of LoRA
#   STEPS [-1]          optimizer steps (-1: one epoch of the chat shards)
#   LR                  peak learning rate [2e-4 for LoRA, 2e-5 for full fine-tuning]
#   BATCH [8]           sequences per micro-batch on each GPU
#   TOTAL_BATCH_TOKENS [-1]  tokens per step, gradient accumulation filling it (-1: BATCH x SEQ_LEN x GPUS)
#   SEQ_LEN             the window of each conversation [1024, or the model's maximum if smaller]
#   WARMUP_STEPS        linear warm-up, then cosine decay to 0 [3% of the steps]
#   WEIGHT_DECAY [0]    AdamW weight decay (of the adapters with LoRA)
#   PRECISION [bf16]    training precision: bf16, fp16 or fp32 (fp8 for full fine-tuning)
#   BASE_PRECISION      base.bin's precision, fp32 or bf16 [the folder's]
#   LORA_RANK [16], LORA_ALPHA [32], LORA_TARGETS [q,k,v,o,gate,up,down; GPT-2: qkv,attn-proj,fc,fc-proj]
#   CHAT_TEMPLATE       llama3, chatml or plain [from the family, above]
#   VAL_FRACTION [0.02] conversations held out for validation (0: none)
#   VAL_EVERY           validation every N steps [a tenth of the steps]
#   CHECKPOINT_EVERY    a checkpoint every N steps, the newest 2 kept [a quarter of the steps]
#   GPUS [1]            GPUs of this machine to train on (scripts/launch.sh)
#   PYTHON [python3]    the Python with NumPy that runs import_hf.py and export_hf.py
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
usage="usage: scripts/train/finetune.sh HF_FOLDER DATA.jsonl [OUT_DIR] [train_gpt flags...]"
fail() { echo "finetune.sh: $*" >&2; exit 1; }
say() { echo "finetune.sh: $*"; }

[ $# -ge 2 ] || fail "$usage"
HF=${1%/}; DATA=$2; shift 2
OUT=$ROOT/log/finetune_$(basename "$HF")
if [ $# -ge 1 ] && [[ $1 != -* ]]; then OUT=${1%/}; shift; fi
EXTRA=("$@")
stop_after_check=0
for ((i = 0; i + 1 < ${#EXTRA[@]}; i++)); do
    [ "${EXTRA[i]}" = --dry-run ] && [ "${EXTRA[i + 1]}" = 1 ] && stop_after_check=1
done

FULL=${FULL:-0}
case $FULL in 0|1) ;; *) fail "FULL is '$FULL', expected 0 (LoRA) or 1 (full fine-tuning)";; esac
[ -d "$HF" ] || fail "$HF: no such folder (expected a Hugging Face model folder)"
[ -f "$HF/config.json" ] || fail "$HF/config.json: missing (expected a Hugging Face model folder)"
[ -f "$HF/tokenizer.json" ] || fail "$HF/tokenizer.json: missing (the chat shards and train_gpt need the model's tokenizer.json)"
[ -f "$DATA" ] || fail "$DATA: no such file (expected JSONL conversations)"
for tool in "$ROOT/train_gpt" "$ROOT/build/prepare_shards"; do
    [ -x "$tool" ] || fail "$tool: missing (run make in $ROOT)"
done
mkdir -p "$OUT/logs" || fail "$OUT: cannot create the folder"
LOGS=$OUT/logs

# step NAME COMMAND...: runs COMMAND with its output in logs/NAME.log; on failure one line with its last line
step() {
    local name=$1; shift
    "$@" > "$LOGS/$name.log" 2>&1 || fail "$name failed: $(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1) (log: $LOGS/$name.log)"
}

# The folder's model_type, its tensors' precision (bf16 when every one is BF16) and maximum positions: the standard
# library only, as this runs before the import checks the folder (which says what is wrong with it)
read -r model_type folder_precision positions <<< "$("$PY" - "$HF" << 'PY'
import json, os, struct, sys
folder = sys.argv[1]
def json_of(name):
    try:
        with open(os.path.join(folder, name)) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}
config = json_of("config.json")
weight_map = json_of("model.safetensors.index.json").get("weight_map")
files = sorted({str(name) for name in weight_map.values()}) if isinstance(weight_map, dict) else ["model.safetensors"]
dtypes = set()
for name in files:
    try:
        with open(os.path.join(folder, name), "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        dtypes |= {entry.get("dtype") for key, entry in header.items() if key != "__metadata__" and isinstance(entry, dict)}
    except (OSError, ValueError, struct.error, AttributeError, MemoryError, OverflowError):
        dtypes.add(None)
positions = config.get("max_position_embeddings", config.get("n_positions", 1024))
print(str(config.get("model_type", "unknown")).replace(" ", "_"), "bf16" if dtypes == {"BF16"} else "fp32",
      positions if type(positions) is int and positions > 0 else 1024)
PY
)"
[ -n "${positions:-}" ] || fail "$PY cannot read $HF/config.json"

# ---- 1. import
BASE=$OUT/base.bin
BASE_PRECISION=${BASE_PRECISION:-$folder_precision}
case $BASE_PRECISION in
    bf16) bf16_flag=(--bf16); version=5; why="bf16, as the folder's tensors are BF16 (their values exactly)" ;;
    fp32) bf16_flag=(); version=3; why="fp32, as the folder's tensors are not all BF16 (F32 and F16 exactly)" ;;
    *) fail "BASE_PRECISION is '$BASE_PRECISION', expected fp32 or bf16" ;;
esac
[ "$BASE_PRECISION" = "$folder_precision" ] || why="$BASE_PRECISION (BASE_PRECISION)"
if [ -f "$BASE" ] && [ -z "$(find -L "$HF" -maxdepth 1 -type f -newer "$BASE" | head -n 1)" ] &&
   [ "$(od -An -t d4 -j 4 -N 4 "$BASE" | tr -d ' ')" = "$version" ]; then
    say "[1/5] import: $BASE ($BASE_PRECISION) is newer than every file of $HF: kept"
else
    say "[1/5] import: $HF ($model_type) -> $BASE in $why"
    step import "$PY" "$ROOT/scripts/hf/import_hf.py" "$HF" "$BASE" "${bf16_flag[@]}"
fi

# ---- 2. chat shards
has_token() { grep -qF "\"$1\"" "$HF/tokenizer.json"; }
if [ -z "${CHAT_TEMPLATE:-}" ]; then
    if [ "$model_type" = llama ] && has_token '<|start_header_id|>'; then CHAT_TEMPLATE=llama3
    elif [ "$model_type" = qwen2 ] || { has_token '<|im_start|>' && has_token '<|im_end|>'; }; then CHAT_TEMPLATE=chatml
    else CHAT_TEMPLATE=plain; fi
fi
SEQ_LEN=${SEQ_LEN:-$((positions < 1024 ? positions : 1024))}
VAL_FRACTION=${VAL_FRACTION:-0.02}
no_validation=$(awk -v f="$VAL_FRACTION" 'BEGIN { print (f + 0 == 0) ? 1 : 0 }')
SHARDS=$OUT/data/chat
say "[2/5] shards: $DATA -> ${SHARDS}_{train,val}_*.bin, template $CHAT_TEMPLATE, windows of $SEQ_LEN tokens, validation fraction $VAL_FRACTION"
val_split=(--val-fraction "$VAL_FRACTION")
[ "$no_validation" = 0 ] || val_split=()
step shards "$ROOT/build/prepare_shards" --chat --tokenizer "$HF/tokenizer.json" --chat-template "$CHAT_TEMPLATE" \
    --seq-len "$SEQ_LEN" "${val_split[@]}" --out "$SHARDS" "$DATA"

# ---- 3. the run's flags, checked without a GPU
RUN=$OUT/run
GPUS=${GPUS:-1}
if [ "$model_type" = gpt2 ]; then
    targets=qkv,attn-proj,fc,fc-proj; ADAPTERS=$OUT/adapters.bin  # PEFT has no modules for GPT-2's fused products
else
    targets=q,k,v,o,gate,up,down; ADAPTERS=$OUT/adapters/  # a path ending in /: a PEFT folder
fi
if [ "$FULL" = 1 ]; then
    mode="full fine-tuning"
    mode_flags=(--weight-decay "${WEIGHT_DECAY:-0}")
    LR=${LR:-2e-5}
else
    mode="LoRA r=${LORA_RANK:-16} alpha=${LORA_ALPHA:-32} on ${LORA_TARGETS:-$targets}"
    mode_flags=(--lora-rank "${LORA_RANK:-16}" --lora-alpha "${LORA_ALPHA:-32}" --lora-targets "${LORA_TARGETS:-$targets}"
                --lora-weight-decay "${WEIGHT_DECAY:-0}" --lora-save "$ADAPTERS" --lora-merge "$OUT/merged.bin")
    LR=${LR:-2e-4}
fi
val_data="${SHARDS}_val_*.bin"
[ "$no_validation" = 0 ] || val_data=""
common=(--model "$BASE" --tokenizer "$HF" --train-data "${SHARDS}_train_*.bin" --val-data "$val_data" --seq-len "$SEQ_LEN"
        --batch-size "${BATCH:-8}" --total-batch-tokens "${TOTAL_BATCH_TOKENS:--1}" --precision "${PRECISION:-bf16}" --lr "$LR"
        --lr-schedule cosine --final-lr-frac 0 --sample-every 0 --output-dir "$RUN" --resume 1 --keep-checkpoints 2
        "${mode_flags[@]}")
launcher=()
dry_run_env=()
if [ "$GPUS" != 1 ]; then
    launcher=("$ROOT/scripts/launch.sh" "$GPUS")
    dry_run_env=(WORLD_SIZE="$GPUS" RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500)  # rank 0 as launched
fi
say "[3/5] check: train_gpt --dry-run 1, $mode, lr $LR, ${PRECISION:-bf16}"
step check env "${dry_run_env[@]}" "$ROOT/train_gpt" "${common[@]}" --steps "${STEPS:--1}" "${EXTRA[@]}" --dry-run 1
steps=$(sed -n 's/^batch: .*; \([0-9]*\) steps; precision .*/\1/p' "$LOGS/check.log")
[ -n "$steps" ] || fail "check failed: no step count in train_gpt's plan (log: $LOGS/check.log)"
if [ $stop_after_check = 1 ]; then
    say "stopping after the check (--dry-run 1): $steps steps would train; the plan is in $LOGS/check.log"
    exit 0
fi

# ---- 4. training
warmup=${WARMUP_STEPS:-$((steps * 3 / 100))}
val_every=${VAL_EVERY:-$(((steps + 9) / 10))}
[ "$no_validation" = 0 ] || val_every=0
checkpoint_every=${CHECKPOINT_EVERY:-$(((steps + 3) / 4))}
say "[4/5] train: $mode, $steps steps (warm-up $warmup), checkpoints in $RUN (output also in $LOGS/train.log)"
"${launcher[@]}" "$ROOT/train_gpt" "${common[@]}" --steps "$steps" --warmup-steps "$warmup" --val-every "$val_every" \
    --checkpoint-every "$checkpoint_every" "${EXTRA[@]}" 2>&1 | tee "$LOGS/train.log" || {
    status=${PIPESTATUS[0]}
    last=$(grep -v '^\s*$' "$LOGS/train.log" | tail -n 1)
    # 75: stopped by a signal after committing a checkpoint (docs/reliability.md), which a second run continues
    [ "$status" = 75 ] && { echo "finetune.sh: train stopped: $last; run the recipe again to continue" >&2; exit 75; }
    fail "train failed: $last (log: $LOGS/train.log)"
}

# ---- 5. export, with the folder's tokenizer and token ids
if [ "$FULL" = 1 ]; then RESULT=$RUN/model_$(printf '%08d' "$steps").bin; else RESULT=$OUT/merged.bin; fi
HF_OUT=$OUT/hf
say "[5/5] export: $RESULT -> $HF_OUT, with $HF's tokenizer files"
rm -rf "$HF_OUT.new"  # an interrupted export's
step export "$PY" "$ROOT/scripts/hf/export_hf.py" "$RESULT" "$HF_OUT.new"
for file in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json chat_template.jinja; do
    if [ -f "$HF/$file" ]; then cp "$HF/$file" "$HF_OUT.new/" || fail "export failed: cannot copy $HF/$file"; fi
done
# the export names no tokenizer, so its bos/eos/pad ids are null: the folder's
step export_token_ids "$PY" - "$HF/config.json" "$HF_OUT.new/config.json" << 'PY'
import json, sys
with open(sys.argv[1]) as f:
    source = json.load(f)
with open(sys.argv[2]) as f:
    config = json.load(f)
config.update({key: source[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if key in source})
with open(sys.argv[2], "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
PY
if ! { rm -rf "$HF_OUT" && mv "$HF_OUT.new" "$HF_OUT"; }; then fail "export failed: cannot move $HF_OUT.new to $HF_OUT"; fi

say "done: $HF_OUT loads with AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained"
if [ "$FULL" = 0 ] && [ "$model_type" != gpt2 ]; then
    say "the adapters alone: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(\"$HF\"), \"${ADAPTERS%/}\") (peft; $HF is the base they were trained on)"
fi
