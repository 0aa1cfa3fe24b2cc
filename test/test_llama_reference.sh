#!/usr/bin/env bash
# The Llama-family PyTorch reference (scripts/reference/llama_reference.py), which the GPU model tests compare with:
#  1. --self-test on the CPU: RoPE against theta^(-2i/D) and Llama 3's piecewise scaling, grouped-query attention
#     against plain multi-head attention, every gradient against float64 finite differences, model files read back
#     bit for bit, the presets' published parameter counts, a debug state its model file reproduces
#  2. a debug state in fp32 and in bf16 autocast (the same file sizes), and bad flags: exit 1, one line, nothing written
#  3. --check-transformers: logits, loss and every gradient equal transformers' LlamaForCausalLM (Qwen2ForCausalLM
#     with q/k/v biases) in fp32 for head sizes 64 and 128, 1, 2, 3 and 8 key/value heads, tied and untied heads,
#     Qwen's biases, Llama 3's rope scaling on and off, three presets cut to 1-2 layers; skipped without transformers
# The quick tier (TEST_TIER=quick) runs 1 and the first of the transformers shapes (each Python process takes seconds to
# import torch and transformers); 2 and the other shapes run in the full tier. Python: the first of $PYTHON, python3, /usr/bin/python3 that has
# torch and numpy (and, for 3, transformers).
# Prints one PASS/FAIL/SKIP line per check.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/llama_reference
rm -rf "$W"; mkdir -p "$W"
TIER=${TEST_TIER:-full}
REF=scripts/reference/llama_reference.py

# found, not imported (importing transformers takes seconds; the checks import it anyway)
PY=""; PYT=""
for candidate in ${PYTHON:-} python3 /usr/bin/python3; do
    command -v "$candidate" > /dev/null 2>&1 || continue
    [ -n "$PY" ] || { "$candidate" -c "import torch, numpy" > /dev/null 2>&1 && PY=$candidate; }
    [ -n "$PYT" ] || { "$candidate" -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ('torch', 'numpy', 'transformers')) else 1)" \
        > /dev/null 2>&1 && PYT=$candidate; }
done
if [ -z "$PY" ]; then
    echo "SKIP llama_reference all checks: no python3 (\$PYTHON, python3, /usr/bin/python3) imports torch and numpy"
    exit 0
fi

# ---- 1. the self-test: its "ok NAME: DETAIL" lines as check lines
"$PY" "$REF" --self-test > "$W/self_test.out" 2>&1; rc=$?
sed -nE 's/^ok (.*)$/PASS llama_reference self-test \1/p; s/^FAIL (.*)$/FAIL llama_reference self-test \1/p' "$W/self_test.out"
if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$W/self_test.out"; then
    echo "FAIL llama_reference self-test: exited $rc: $(tail -n 1 "$W/self_test.out")"
fi

# ---- 2. debug states, and bad flags (full tier)
if [ "$TIER" = full ]; then
SMALL=(--layers 2 --channels 128 --heads 2 --kv-heads 1 --ffn 256 --vocab-size 500 --rope-theta 500000
       --rope-scaling 8/1/4/32 --tied-head 0 --init-perturb 0.1 --batch-size 2 --seq-len 32 --steps 3 --device cpu)
sizes=""
for dtype in fp32 bf16; do
    if "$PY" "$REF" "${SMALL[@]}" --dtype $dtype --model-out "$W/model_$dtype.bin" --state-out "$W/state_$dtype.bin" \
            > "$W/state_$dtype.out" 2>&1; then
        sizes="$sizes $(stat -c %s "$W/model_$dtype.bin" "$W/state_$dtype.bin" | tr '\n' ' ')"
    else
        echo "FAIL llama_reference debug state $dtype: $(tail -n 1 "$W/state_$dtype.out")"
    fi
done
read -r m32 s32 m16 s16 <<< "$sizes"
if [ -n "${s16:-}" ] && [ "$m32" = "$m16" ] && [ "$s32" = "$s16" ] && cmp -s "$W/model_fp32.bin" "$W/model_bf16.bin"; then
    echo "PASS llama_reference debug state fp32 and bf16 autocast: model file $m32 bytes (the same model), state $s32 bytes each"
elif [ -n "${s16:-}" ]; then
    echo "FAIL llama_reference debug state fp32 and bf16: model files $m32 / $m16 bytes (equal: $(cmp -s "$W/model_fp32.bin" "$W/model_bf16.bin" && echo yes || echo no)), states $s32 / $s16"
fi

# bad NAME EXPECTED-STDERR ARGS...: exit 1, nothing on stdout, exactly EXPECTED-STDERR, no model file
bad() {
    local name=$1 expected=$2 out err rc; shift 2
    rm -f "$W/bad.bin"
    out=$("$PY" "$REF" "$@" --batch-size 1 --seq-len 16 --model-out "$W/bad.bin" 2> "$W/bad.err"); rc=$?
    err=$(cat "$W/bad.err")
    if [ $rc -eq 1 ] && [ -z "$out" ] && [ "$err" = "$expected" ] && [ ! -e "$W/bad.bin" ] && [ ! -e "$W/bad.bin.tmp" ]; then
        echo "PASS llama_reference bad flags: $name: one line"
    else
        echo "FAIL llama_reference bad flags: $name: rc=$rc stdout '$out' stderr '$err'"
    fi
}
bad "kv heads" "error: key/value heads (3) must divide the 4 attention heads" --layers 1 --channels 256 --heads 4 --kv-heads 3
bad "head size" "error: head size channels/heads = 200/4 must be 64 or 128 (the trainer's attention kernels)" --layers 1 --channels 200 --heads 4
bad "rope scaling" "error: --rope-scaling '8/1': expected none, FACTOR or FACTOR/LOW/HIGH/POSITIONS (e.g. 8/1/4/8192)" \
    --layers 1 --channels 128 --heads 2 --rope-scaling 8/1
bad "rope scaling bands" "error: Llama 3's rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and original positions > 0" \
    --layers 1 --channels 128 --heads 2 --rope-scaling 8/4/1/8192
bad "shape missing" "error: --arch llama needs --channels, --heads (or --arch with a preset: llama3-1b, llama3-3b, llama3-8b, smollm2-135m, smollm2-360m, qwen2.5-0.5b, qwen2.5-7b)" --layers 2
bad "flag value" "error: argument --tied-head: expected 0 or 1, not '2' (see --help)" --layers 1 --channels 128 --heads 2 --tied-head 2
bad "shape with --init-from" "error: --layers does not apply with --init-from (the shape comes from $W/model_fp32.bin)" \
    --init-from "$W/model_fp32.bin" --layers 2
fi

# ---- 3. against transformers
# NAME|ARGS (each with --init-perturb: norm weights and biases away from 1 and 0)
CASES=(
    "D=64 2 kv heads, llama3 scaling 8/1/4/64, untied|--layers 2 --channels 256 --heads 4 --kv-heads 2 --ffn 512 --vocab-size 1000 --rope-theta 500000 --rope-scaling 8/1/4/64 --tied-head 0"
)
[ "$TIER" = full ] && CASES+=(
    "D=64 Qwen biases, 2 kv heads, tied, eps 1e-6|--layers 2 --channels 256 --heads 4 --kv-heads 2 --ffn 384 --vocab-size 1000 --rope-theta 1000000 --norm-eps 1e-6 --qkv-bias 1"
    "D=128 1 kv head, tied, no scaling|--layers 2 --channels 256 --heads 2 --kv-heads 1 --ffn 512 --vocab-size 1000 --rope-theta 10000"
    "D=128 8 kv heads (MHA), llama3 scaling 32/1/4/8192, untied|--layers 2 --channels 1024 --heads 8 --kv-heads 8 --ffn 1024 --vocab-size 1000 --rope-theta 500000 --rope-scaling 32/1/4/8192 --tied-head 0"
    "D=64 8 kv heads of 16, tied|--layers 2 --channels 1024 --heads 16 --kv-heads 8 --ffn 1024 --vocab-size 1000 --rope-theta 100000"
    "D=128 Qwen biases, 2 kv heads, untied|--layers 2 --channels 512 --heads 4 --kv-heads 2 --ffn 768 --vocab-size 1000 --rope-theta 1000000 --norm-eps 1e-6 --qkv-bias 1 --tied-head 0"
    "preset smollm2-135m, 2 layers (9 heads on 3 kv heads)|--arch smollm2-135m --layers 2 --vocab-size 2048"
    "preset llama3-1b, 1 layer (32 heads on 8, scaling 32/1/4/8192)|--arch llama3-1b --layers 1 --vocab-size 1024"
    "preset qwen2.5-0.5b, 2 layers (14 heads on 2, biases)|--arch qwen2.5-0.5b --layers 2 --vocab-size 2048"
)
for i in "${!CASES[@]}"; do
    name=${CASES[$i]%%|*}; read -r -a args <<< "${CASES[$i]#*|}"
    if [ -z "$PYT" ]; then
        echo "SKIP llama_reference vs transformers: $name: no python3 (\$PYTHON, python3, /usr/bin/python3) has transformers"
        continue
    fi
    # the first case also writes the model file and debug state, checked after the comparison
    outputs=(); [ "$i" -eq 0 ] && outputs=(--model-out "$W/hf_model.bin" --state-out "$W/hf_state.bin" --steps 2)
    "$PYT" "$REF" "${args[@]}" --init-perturb 0.1 --batch-size 2 --seq-len 64 --seed $((100 + i)) \
        --check-transformers "${outputs[@]}" > "$W/hf_$i.out" 2>&1; rc=$?
    summary=$(grep '^transformers .* agrees' "$W/hf_$i.out" | tail -n 1)
    if [ $rc -eq 0 ] && [ -n "$summary" ] && ! grep -q '^FAIL ' "$W/hf_$i.out"; then
        echo "PASS llama_reference vs transformers: $name: $summary"
    else
        echo "FAIL llama_reference vs transformers: $name: $(grep '^FAIL ' "$W/hf_$i.out" | head -n 3 | tr '\n' ';') $(tail -n 1 "$W/hf_$i.out")"
    fi
done
