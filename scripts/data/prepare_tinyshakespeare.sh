#!/usr/bin/env bash
# Tokenizes data/tinyshakespeare/input.txt into data/tinyshakespeare/tinyshakespeare_{train,val}_000000.bin.
#
# Recipe (llm.c's dev/data/tinyshakespeare.py): every blank-line-separated section (one speaker's turn) is a
# document, so EOT starts the text and follows each "\n\n". Split (nanoGPT style): the last 10% of the
# tokens is validation. The plain token count of the file (tiktoken encode_ordinary) is 338,025; check it
# with `prepare_shards --count data/tinyshakespeare/input.txt`.
#
# Needs the prepare_shards binary: $PREPARE_SHARDS, else build/prepare_shards (built by make when missing).
set -euo pipefail
cd "$(dirname "$0")/../.."

bin="${PREPARE_SHARDS:-build/prepare_shards}"
[[ -n "${PREPARE_SHARDS:-}" || -x "$bin" ]] || make -s build/prepare_shards >&2 || true
[[ -x "$bin" ]] || { echo "prepare_tinyshakespeare.sh: $bin not found (run make, or set PREPARE_SHARDS)" >&2; exit 1; }

input=data/tinyshakespeare/input.txt
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Mark each section boundary with the document separator prepare_shards understands.
python3 -c '
import sys
text = open(sys.argv[1], encoding="utf-8").read()
sys.stdout.write(text.replace("\n\n", "\n\n<|endoftext|>"))
' "$input" > "$tmp/sections.txt"

"$bin" --out data/tinyshakespeare/tinyshakespeare --val-last-fraction 0.1 "$tmp/sections.txt"
