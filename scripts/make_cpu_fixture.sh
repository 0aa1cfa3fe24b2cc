#!/usr/bin/env bash
# Generates the CPU-reference fixture (model.bin, debug_state.bin) into DIR with the PyTorch reference.
# Exit 2 when torch/numpy cannot be imported (the test runner reports that as SKIP).
# PYTHON overrides the interpreter (default /usr/bin/python3, Debian's python3-torch).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTPUT_DIR" >&2
    exit 1
fi
out_dir=$1
repo_root=$(cd "$(dirname "$0")/.." && pwd)

# The first interpreter that has torch and numpy: $PYTHON, Debian's /usr/bin/python3, then python3 on PATH.
python=""
for candidate in ${PYTHON:-} /usr/bin/python3 python3; do
    if why=$("$candidate" -c "import torch, numpy" 2>&1); then python=$candidate; break; fi
done
if [ -z "$python" ]; then
    echo "make_cpu_fixture: cannot import torch/numpy with ${PYTHON:-/usr/bin/python3} or python3: $(printf '%s' "$why" | tail -n 1)"
    exit 2
fi

mkdir -p "$out_dir"
"$python" "$repo_root/scripts/gpt2_reference.py" debug-state \
    --layers 2 --heads 4 --channels 128 --max-seq-len 64 --vocab-size 50257 \
    --batch-size 4 --seq-len 64 --steps 10 --seed 1337 --dtype fp32 --device cpu \
    --lr 1e-4 --weight-decay 0.1 --grad-clip 1.0 \
    --model-out "$out_dir/model.bin" --state-out "$out_dir/debug_state.bin"
