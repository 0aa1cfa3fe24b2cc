#!/usr/bin/env bash
# Shard preparation end to end, without a GPU: the FineWeb path (prepare_fineweb.py on a small local jsonl
# sample) gives the same shards as prepare_shards on the same documents; the output does not depend on the
# thread count; the tinyshakespeare recipe gives llm.c's split.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/prepare
rm -rf "$W"; mkdir -p "$W"
BIN=build/prepare_shards
python3 - "$W" <<'PY'
import json, sys
d = sys.argv[1]
docs = [f"Document {i}: caf\u00e9 \u65e5\u672c {i * 7919} words, words\n\nand lines.  " * (1 + i % 5) for i in range(40)]
with open(f"{d}/sample.jsonl", "w") as f:
    for doc in docs:
        f.write(json.dumps({"text": doc, "id": len(doc)}) + "\n")
with open(f"{d}/sample.txt", "w") as f:
    f.write("<|endoftext|>".join(docs))
PY
python3 scripts/prepare_fineweb.py --input "$W/sample.jsonl" --out "$W/fw/fineweb" --val-docs 5 --shard-size 2000 \
    --prepare-shards "$BIN" > "$W/fineweb.out" 2>&1 || echo "FAIL prepare fineweb sample: $(tail -n 1 "$W/fineweb.out")"
mkdir -p "$W/direct" "$W/threads"
$BIN --out "$W/direct/fineweb" --val-docs 5 --shard-size 2000 --threads 1 "$W/sample.txt" > /dev/null 2>&1
$BIN --out "$W/threads/fineweb" --val-docs 5 --shard-size 2000 --threads 2 "$W/sample.txt" > /dev/null 2>&1
n=$(ls "$W/fw" | wc -l)
if [ "$n" -ge 3 ] && diff -r "$W/fw" "$W/direct" > /dev/null; then
    echo "PASS prepare fineweb sample: $n shards, identical to prepare_shards on the same documents"
else
    echo "FAIL prepare fineweb sample: $n shards; differs from prepare_shards: $(diff -rq "$W/fw" "$W/direct" | head -n 1)"
fi
if diff -r "$W/direct" "$W/threads" > /dev/null; then echo "PASS prepare_shards output independent of thread count"
else echo "FAIL prepare_shards output depends on the thread count"; fi

PREPARE_SHARDS=$BIN bash scripts/prepare_tinyshakespeare.sh > "$W/tiny.out" 2>&1
count() { python3 -c "import struct,sys; print(struct.unpack('<3i', open(sys.argv[1],'rb').read(12))[2])" "$1"; }
train=$(count data/tinyshakespeare/tinyshakespeare_train_000000.bin); val=$(count data/tinyshakespeare/tinyshakespeare_val_000000.bin)
if [ "$train" = 304225 ] && [ "$val" = 33803 ]; then echo "PASS tinyshakespeare shards: 304225 train + 33803 val tokens"
else echo "FAIL tinyshakespeare shards: train $train val $val (expected 304225 + 33803)"; fi
