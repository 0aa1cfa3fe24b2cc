#!/usr/bin/env bash
# Tokenizes the Gutenberg corpus into data/gutenberg/gutenberg_{train,val}_NNNNNN.bin (10M-token shards).
#
# Copies train.txt.xz and val.txt.xz (books separated by <|endoftext|>) from the shared data folder into
# data/gutenberg/ (git-ignored, kept compressed) and tokenizes them there: every book of val.txt.xz goes to
# the validation split, every book of train.txt.xz to the training split, each book starting with EOT.
# Expected: 1,876,092 val tokens (24 books) and 26,667,435 train tokens (262 books).
#
# Shared data: $SHARED_DATA, else ../shared/data relative to the repository root.
# Needs the prepare_shards binary: $PREPARE_SHARDS, else build/prepare_shards.
set -euo pipefail
cd "$(dirname "$0")/../.."

bin="${PREPARE_SHARDS:-build/prepare_shards}"
[[ -x "$bin" ]] || { echo "prepare_gutenberg.sh: $bin not found (run make, or set PREPARE_SHARDS)" >&2; exit 1; }

shared="${SHARED_DATA:-../shared/data}"
mkdir -p data/gutenberg
for split in train val; do
    src="$shared/gutenberg/$split.txt.xz"
    if [[ ! -f "$src" ]]; then
        echo "prepare_gutenberg.sh: $src not found (set SHARED_DATA)" >&2
        exit 1
    fi
    cp -u "$src" "data/gutenberg/$split.txt.xz"
done

"$bin" --out data/gutenberg/gutenberg --shard-size 10000000 \
    --val-input data/gutenberg/val.txt.xz data/gutenberg/train.txt.xz
