#!/usr/bin/env bash
# train_gpt's command line and input checks, without a GPU: --help, bad flags and values, bad model files,
# bad shards, sizes that don't divide. Each case must exit non-zero with a one-line error naming the
# flag or file.
set -u
cd "$(dirname "$0")/.."
BIN=./train_gpt
W=build/test_work/cli
rm -rf "$W"; mkdir -p "$W"

# expect_error NAME PATTERN ARGS...: non-zero exit, and the first stderr line matches PATTERN
expect_error() {
    local name=$1 pattern=$2; shift 2
    local err rc
    err=$("$BIN" "$@" 2>&1 >/dev/null); rc=$?
    local first=$(printf '%s\n' "$err" | head -n 1)
    if [ $rc -ne 0 ] && printf '%s' "$first" | grep -q -- "$pattern" && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]; then
        echo "PASS cli $name"
    else
        echo "FAIL cli $name: rc=$rc, stderr: $err"
    fi
}

help=$($BIN --help); rc=$?
missing=""
for flag in $(grep -o '{"--[a-z0-9-]*"' train_gpt.cu | tr -d '{"'); do
    printf '%s' "$help" | grep -q -- "$flag" || missing="$missing $flag"
done
if [ $rc -eq 0 ] && [ -z "$missing" ]; then echo "PASS cli --help lists every flag"; else echo "FAIL cli --help: rc=$rc missing:$missing"; fi

# shards: one good, one with a wrong magic, one truncated
python3 - "$W" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(path, tokens, magic=20240520, version=1, count=None, cut=0):
    header = [magic, version, len(tokens) if count is None else count] + [0] * 253
    data = struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)
    open(path, "wb").write(data[:len(data) - cut] if cut else data)
shard(f"{d}/good.bin", [i % 1000 for i in range(5000)])
shard(f"{d}/badmagic.bin", list(range(100)), magic=1234)
shard(f"{d}/truncated.bin", list(range(100)), cut=10)
open(f"{d}/badmodel.bin", "wb").write(struct.pack("<256i", *([999] + [0] * 255)))
PY
SMALL="--layers 2 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data="
expect_error "unknown flag" "unknown flag '--bogus'" --bogus 1
expect_error "flag without value" "flag --steps needs a value" --steps
expect_error "integer flag with text" "flag -b expects an integer, got 'x'" -b x
expect_error "float flag with text" "flag --lr expects a number" --lr fast
expect_error "bad precision" "--precision must be bf16, fp16 or fp32" --precision fp8
expect_error "bad schedule" "--lr-schedule must be" --lr-schedule step
expect_error "heads do not divide channels" "channels (100) must be divisible by heads (3)" --channels 100 --heads 3
expect_error "seq-len above max" "--seq-len must be in 1..64" --layers 2 --heads 1 --channels 64 --max-seq-len 64 --seq-len 128
expect_error "unsupported head size" "head size channels/heads = 96/3 must be 64" --channels 96 --heads 3
expect_error "missing model file" "cannot open model file" --model "$W/none.bin"
expect_error "bad model magic" "badmodel.bin: bad magic 999" --model "$W/badmodel.bin"
expect_error "no shards match" "no shard files match" $SMALL --train-data "$W/nothing_*.bin"
expect_error "shard with bad magic" "badmagic.bin" $SMALL --train-data "$W/badmagic.bin"
expect_error "truncated shard" "truncated.bin" $SMALL --train-data "$W/truncated.bin"
expect_error "total batch not a multiple" "--total-batch-tokens 100 is not a multiple of --batch-size x --seq-len = 64" $SMALL --train-data "$W/good.bin" --total-batch-tokens 100
expect_error "resume without output dir" "--resume needs --output-dir" $SMALL --resume 1
expect_error "bad ZeRO stage" "--zero-stage must be 0, 1, 2 or 3, got 4" $SMALL --zero-stage 4
expect_error "bad recompute level" "--recompute must be 0, 1, 2 or 3, got 5" $SMALL --recompute 5
expect_error "bad GELU fusion" "--gelu-fusion must be 0 or 1, got 2" $SMALL --gelu-fusion 2
expect_error "bad deterministic" "--deterministic must be 0 or 1, got 3" $SMALL --deterministic 3
expect_error "bad LoRA targets" "--lora-targets 'qkv,mlp': expected a comma list of qkv, attn-proj, fc, fc-proj" $SMALL --lora-rank 4 --lora-targets qkv,mlp
expect_error "LoRA save without LoRA" "--lora-save and --lora-merge need LoRA" $SMALL --lora-save "$W/a.bin"
expect_error "missing adapter file" "none.bin: cannot open adapter file" $SMALL --lora-load "$W/none.bin"
expect_error "adapter file with bad magic" "badmodel.bin: bad magic 999 (expected 20261127, an adapter file)" $SMALL --lora-load "$W/badmodel.bin"
expect_error "LoRA dropout out of range" "--lora-dropout must be in \[0, 1)" $SMALL --lora-rank 4 --lora-dropout 1.5
expect_error "LoRA with checkpoints" "--checkpoint-every and --resume are for full training" $SMALL --lora-rank 4 --checkpoint-every 5 -o "$W/ck"
# batch vs GPUs: 2 ranks x 2 rows x 32 tokens = 128 tokens per micro-step
export WORLD_SIZE=2 RANK=0
expect_error "total batch vs GPUs" "--total-batch-tokens 64 is not a multiple of --batch-size x --seq-len x data-parallel ranks (2) = 128" $SMALL --train-data "$W/good.bin" --total-batch-tokens 64
# tensor parallelism: the mesh and the split are checked before any GPU is touched
expect_error "tensor parallel does not divide the ranks" "--tensor-parallel 3 x --pipeline-parallel 1 = 3 does not divide the 2 ranks" $SMALL --tensor-parallel 3
expect_error "tensor parallel below 1" "--tensor-parallel 0 must be at least 1" $SMALL --tensor-parallel 0
expect_error "tensor parallel splits whole heads" "--tensor-parallel 2: the 3 attention heads do not split into 2 equal groups" --model d3 --tensor-parallel 2
expect_error "sequence parallel splits the sequence evenly" "--sequence-parallel 1: --seq-len 33 must be a multiple of --tensor-parallel 2" $SMALL --heads 2 --channels 128 --tensor-parallel 2 --sequence-parallel 1 --seq-len 33
expect_error "tensor parallel refuses LoRA" "LoRA runs with --tensor-parallel 1 (got 2)" $SMALL --heads 2 --channels 128 --tensor-parallel 2 --lora-rank 4
expect_error "pipeline parallel does not divide the ranks" "--tensor-parallel 1 x --pipeline-parallel 4 = 4 does not divide the 2 ranks" $SMALL --pipeline-parallel 4
expect_error "pipeline needs a layer per stage" "--pipeline-parallel 2 x --virtual-stages 2: the 2 layers cannot fill 4 virtual stages" $SMALL --pipeline-parallel 2 --pipeline-schedule interleaved
expect_error "pipeline schedule name" "--pipeline-schedule must be 1f1b or interleaved, got 'gpipe'" $SMALL --pipeline-parallel 2 --pipeline-schedule gpipe
expect_error "pipeline layers list" "--pipeline-layers" $SMALL --pipeline-parallel 2 --pipeline-layers 1,2
expect_error "pipeline refuses ZeRO-2" "--pipeline-parallel 2 runs with --zero-stage 0 or 1 (got 2)" $SMALL --pipeline-parallel 2 --zero-stage 2
expect_error "pipeline refuses LoRA" "LoRA runs with --pipeline-parallel 1 (got 2)" $SMALL --pipeline-parallel 2 --lora-rank 4
expect_error "interleaved micro-batch count" "--pipeline-schedule interleaved needs the 3 micro-batches (gradient-accumulation steps) to be a multiple of --pipeline-parallel 2" --layers 4 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data= --pipeline-parallel 2 --pipeline-schedule interleaved --total-batch-tokens 192
unset WORLD_SIZE RANK
exit 0
