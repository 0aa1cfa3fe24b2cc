#!/usr/bin/env bash
# QLoRA's NF4 base (--base-quant nf4) on a GPU, with train_gpt on a small Llama-family model (--model d2 --arch llama:
# 2 layers, C = 128, a 512-unit SwiGLU MLP, GPT-2's vocabulary) and tinyshakespeare:
#   1. a base trained 20 steps in bf16 is loaded with --base-quant nf4 and adapters on every linear layer whose B is zero
#      (--steps 0): --lora-merge writes the dequantized base, whose four linear weights of each block equal
#      scripts/reference/nf4_reference.py's quantization and dequantization (double quantization) of the base's, rounded
#      to bf16, bit for bit, and whose other tensors equal the base's; the same for the initialisation (no --model), against
#      the merge of an fp32 run without --base-quant (the fp32 values the NF4 run quantizes): the embeddings and LM head,
#      drawn in pieces, equal those drawn whole;
#   2. the NF4 run's validation loss (its products read the dequantized weights, the adapters add zeros) equals, as
#      printed, the validation loss of a bf16 run of the dequantized model file (--deterministic 1: the same products), or
#      is within 1e-4 of it (the PASS line says which);
#   3. QLoRA training from the base (40 steps, rank 8, every linear layer, lr 3e-3) against LoRA training of the
#      dequantized bf16 model file (1's merge) with the same flags: each step's loss within 1e-4 (the same bf16 products;
#      equal as printed is expected, within 1e-4 allowed as in 2), and the validation loss at least 0.01 lower after the
#      40 steps (0.031 on an H100); its merged model's validation loss is within 0.02 of the run's last one (the merge
#      adds B A into the dequantized weights in bf16);
#   4. the products reading the base packed (--nf4-products packed: kernels/nf4_matmul.cuh) against the dequantized
#      ones (the default, cuBLASLt on the ring's bf16 weights, which 1-3 ran): the loaded base's validation loss within
#      1e-3 (the same bf16 operands; each output's fp32 sum taken in another order, then rounded to bf16 once: relative
#      differences of 2^-9 an element, which average out over the loss), and the same 40 training steps' losses each
#      within 0.01 of 3's (those differences compound over the steps), with a sample drawn (sampling's one-row forwards);
#   6. a bitsandbytes 4-bit folder: 1's base exported to Hugging Face, written as bitsandbytes saves it in NF4 (double and
#      single quantization; test/tools/hf_llama_check.py make-bnb), imported (scripts/hf/import_hf.py: fp32, its weights
#      dequantized as bitsandbytes computes them) and loaded with --base-quant nf4 --nf4-double-quant 0 in fp32: the
#      merge of zero adapters (--steps 0) is the imported file, bit for bit (the 4-bit codes and absmaxes stored again
#      exactly);
#   5. (full tier) data parallelism: 2 ranks sharing the GPU, ZeRO-1 over the adapters, 4 rows each, against one rank of
#      8 rows: 10 steps' losses each within 2e-2 (bf16 products and a sum over ranks in another order: test_zero's bf16
#      tolerance), and the parameters bitwise the same on both ranks (--parameter-checksums 1).
# Independent runs go side by side on the GPU (below). Needs a GPU and NumPy (for the reference); skips without them.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/qlora
rm -rf "$W"; mkdir -p "$W"
PY=${PYTHON:-python3}
[ "$(scripts/visible_gpus.sh)" -gt 0 ] || { echo "SKIP qlora: no GPU"; exit 0; }
$PY -c "import numpy" 2> /dev/null || { echo "SKIP qlora: no numpy (the NF4 reference)"; exit 0; }
SHAPE=(--model d2 --arch llama)
RUN=(--seq-len 256 --batch-size 8 --sample-every 0 --deterministic 1 --val-batches 4)
LORA=(--lora-rank 8 --lora-alpha 16 --lora-targets q,k,v,o,gate,up,down)

source test/loss_logs.sh  # losses, maxdiff, within, launch_mode (its multi-rank `run` gives way to this suite's below)
# steps DIR: how many training steps DIR/log.txt holds
steps() { losses "$1" 2> /dev/null | wc -l; }
# run NAME ARGS...: train_gpt's output in $W/NAME.out; a FAIL line (and status 1) when it exits non-zero
run() {
    local name=$1; shift
    if ! ./train_gpt "$@" > "$W/$name.out" 2>&1; then
        echo "FAIL qlora $name: train_gpt exited non-zero: $(grep -m1 error "$W/$name.out" || tail -n 1 "$W/$name.out")"
        return 1
    fi
}
val_loss() { grep -m1 "val loss" "$1" | sed 's/.*val loss \([0-9.]*\).*/\1/'; }
last_val_loss() { grep "val loss" "$1" | tail -n 1 | sed 's/.*val loss \([0-9.]*\).*/\1/'; }

# compare_nf4 NAME BASE MERGED: MERGED's linear weights are the NF4 reference's of BASE's rounded to bf16, the rest BASE's
# rounded to bf16 (bitwise)
compare_nf4() {
    local name=$1 out
    out=$($PY - "$2" "$3" <<'PY'
import sys
import numpy as np
sys.path.insert(0, "scripts/reference")
import nf4_reference as nf4

def read(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    raw = np.fromfile(path, dtype="<f4" if header[1] == 3 else "<u2", offset=1024)
    if header[1] != 3:
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return header, raw

h, base = read(sys.argv[1])
_, merged = read(sys.argv[2])
L, NH, C, Vp, KV, F, flags = (int(h[i]) for i in (4, 5, 6, 7, 8, 9, 10))
hs = C // NH
Q = C + 2 * KV * hs
tensors = [("wte", Vp * C, None), ("ln1w", L * C, None), ("qkvw", L * Q * C, Q * C)]
if flags & 1:
    tensors.append(("qkvb", L * Q, None))
tensors += [("attprojw", L * C * C, C * C), ("ln2w", L * C, None), ("fcw", L * 2 * F * C, 2 * F * C),
            ("fcprojw", L * C * F, C * F), ("lnfw", C, None)]
if not flags & 2:
    tensors.append(("lm_head", Vp * C, None))
assert sum(n for _, n, _ in tensors) == base.size == merged.size, "file sizes"
problems, offset, quantized = [], 0, 0
for name, n, per_layer in tensors:
    b, m = base[offset:offset + n], merged[offset:offset + n]
    if per_layer is None:  # kept in bf16
        expected = (nf4.bf16_bits(b).astype(np.uint32) << 16).view(np.float32)
    else:
        expected = np.concatenate([nf4.dequantize(nf4.quantize(b[l * per_layer:(l + 1) * per_layer].copy(), True))
                                   for l in range(L)]).astype(np.float32)
        expected = (nf4.bf16_bits(expected).astype(np.uint32) << 16).view(np.float32)
        quantized += n
    differ = np.flatnonzero(expected.view(np.uint32) != m.view(np.uint32))
    if differ.size:
        problems.append(f"{name}: {differ.size} of {n} differ, the first at {differ[0]}: {m[differ[0]]!r} vs {expected[differ[0]]!r}")
    offset += n
print("; ".join(problems) if problems else f"{quantized} weights")
PY
)
    if [ $? -eq 0 ] && [[ $out =~ ^[0-9]+\ weights$ ]]; then
        echo "PASS qlora $name: the merged base's linear weights are the NF4 reference's of the base ($out), bitwise; the rest unchanged"
    else
        echo "FAIL qlora $name: $out"
    fi
}

# Independent runs go side by side on the GPU (--deterministic 1: the same results as one after the other): the
# initialisation's pair from the start; after the base, the 40-step runs and the bitsandbytes folders beside the checks
# of the loaded base. Each group's check lines are printed when it has been waited for.
# 1. the initialisation, drawn block by block (and the embeddings and LM head in pieces)
{
    if run init_nf4 "${SHAPE[@]}" "${RUN[@]}" "${LORA[@]}" --base-quant nf4 --steps 0 --lora-merge "$W/init_nf4.bin" &&
       run init_fp32 "${SHAPE[@]}" "${RUN[@]}" "${LORA[@]}" --precision fp32 --steps 0 --lora-merge "$W/init_fp32.bin"; then
        compare_nf4 "initialisation in NF4" "$W/init_fp32.bin" "$W/init_nf4.bin"
    fi
} > "$W/init.checks" 2>&1 &
init_runs=$!

# 6. a bitsandbytes NF4 folder of the base, imported and stored again with fp32 absmaxes: the same weights
bnb_folders() {
    if ! $PY scripts/hf/export_hf.py "$BASE" "$W/base_hf" > "$W/base_hf.out" 2>&1; then
        echo "FAIL qlora export of the base for the bitsandbytes folder: $(tail -n 1 "$W/base_hf.out")"
        return
    fi
    for q in double single; do
        if $PY test/tools/hf_llama_check.py make-bnb "$W/base_hf" "$W/bnb_$q" $([ $q = single ] && echo --single) > "$W/bnb_$q.make.out" 2>&1 &&
           $PY scripts/hf/import_hf.py "$W/bnb_$q" "$W/bnb_$q.bin" > "$W/bnb_$q.import.out" 2>&1 &&
           run bnb_$q --model "$W/bnb_$q.bin" "${RUN[@]}" "${LORA[@]}" --precision fp32 --base-quant nf4 --nf4-double-quant 0 --steps 0 \
               --lora-merge "$W/bnb_$q.merged.bin"; then
            if cmp -s -i 1024 "$W/bnb_$q.bin" "$W/bnb_$q.merged.bin" && grep -q "^base in NF4 (QLoRA, fp32 absmaxes, 0.5625 bytes a weight)" "$W/bnb_$q.out"; then
                echo "PASS qlora a bitsandbytes NF4 folder ($q quantization) imported and stored with fp32 absmaxes: its merged base is the imported model, bit for bit"
            else
                echo "FAIL qlora a bitsandbytes NF4 folder ($q quantization): the merged base differs from the imported model, or no fp32-absmax plan line"
            fi
        else
            echo "FAIL qlora a bitsandbytes NF4 folder ($q quantization): $(cat "$W"/bnb_$q.*.out 2>/dev/null | grep -m1 -i error)"
        fi
    done
}

# 1-2. a trained base, loaded in NF4
if run base "${SHAPE[@]}" "${RUN[@]}" --steps 20 --lr 1e-3 --val-every 0 --checkpoint-every 20 -o "$W/base"; then
    BASE=$W/base/model_00000020.bin
    bnb_folders > "$W/bnb.checks" 2>&1 &
    bnb_runs=$!
    # 3-4's runs that need only the base
    run train --model "$BASE" "${RUN[@]}" "${LORA[@]}" --base-quant nf4 --steps 40 --lr 3e-3 --val-every 40 \
        --lora-save "$W/adapters.bin" --lora-merge "$W/trained_merged.bin" -o "$W/train" > "$W/train.checks" 2>&1 &
    train_run=$!
    run train_packed --model "$BASE" "${RUN[@]}" "${LORA[@]}" --base-quant nf4 --nf4-products packed --steps 40 --lr 3e-3 --val-every 40 \
        --sample-every 40 --sample-tokens 16 -o "$W/train_packed" > "$W/train_packed.checks" 2>&1 &
    train_packed_run=$!
    if run load_nf4 --model "$BASE" "${RUN[@]}" "${LORA[@]}" --base-quant nf4 --steps 0 --lora-merge "$W/load_merged.bin"; then
        grep -q "^base in NF4" "$W/load_nf4.out" || echo "FAIL qlora the start-up report names the NF4 base: $(grep -m1 '^memory plan' "$W/load_nf4.out")"
        compare_nf4 "model file loaded in NF4" "$BASE" "$W/load_merged.bin"
        run train_dequantized --model "$W/load_merged.bin" "${RUN[@]}" "${LORA[@]}" --steps 40 --lr 3e-3 --val-every 40 -o "$W/train_dequantized" \
            > "$W/train_dequantized.checks" 2>&1 &
        train_dequantized_run=$!
        run dequantized --model "$W/load_merged.bin" "${RUN[@]}" --steps 0 & dequantized_run=$!
        run bf16_base --model "$BASE" "${RUN[@]}" --steps 0 & bf16_base_run=$!
        run load_packed --model "$BASE" "${RUN[@]}" "${LORA[@]}" --base-quant nf4 --nf4-products packed --steps 0 & load_packed_run=$!
        wait $dequantized_run; dequantized_ok=$?
        wait $bf16_base_run; bf16_base_ok=$?
        if [ $dequantized_ok -eq 0 ] && [ $bf16_base_ok -eq 0 ]; then
            nf4=$(val_loss "$W/load_nf4.out") dense=$(val_loss "$W/dequantized.out") original=$(val_loss "$W/bf16_base.out")
            if [ -n "$nf4" ] && [ "$nf4" = "$dense" ]; then
                echo "PASS qlora the NF4 base's validation loss $nf4 equals the dequantized bf16 model's as printed (the unquantized base: $original)"
            elif [ -n "$nf4" ] && [ -n "$dense" ] && awk -v a="$nf4" -v b="$dense" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }'; then
                echo "PASS qlora the NF4 base's validation loss $nf4 is within 1e-4 of the dequantized bf16 model's $dense, not equal (the unquantized base: $original)"
            else
                echo "FAIL qlora the NF4 base's validation loss '$nf4' against the dequantized bf16 model's '$dense'"
            fi
        fi
        # 4. the loaded base's validation loss with packed products
        if wait $load_packed_run && [ -n "${nf4:-}" ]; then
            packed=$(val_loss "$W/load_packed.out")
            if [ -n "$packed" ] && awk -v a="$packed" -v b="$nf4" 'BEGIN { d = a - b; exit !(d < 1e-3 && d > -1e-3) }'; then
                echo "PASS qlora the NF4 base's validation loss with packed products $packed is within 1e-3 of the dequantized products' $nf4"
            else
                echo "FAIL qlora the NF4 base's validation loss with packed products '$packed' against the dequantized products' '$nf4' (within 1e-3)"
            fi
        fi
    fi
    # 3. training: QLoRA against LoRA on the dequantized base in bf16 (the same bf16 operands), then packed products
    wait $train_run; train_ok=$?
    wait ${train_dequantized_run:-$train_run}; train_dequantized_ok=$?
    wait $train_packed_run; train_packed_ok=$?
    cat "$W"/train*.checks
    if [ $train_ok -eq 0 ] && [ -f "$W/load_merged.bin" ] && [ $train_dequantized_ok -eq 0 ]; then
        first=$(val_loss "$W/train.out") last=$(last_val_loss "$W/train.out")
        d=$(maxdiff "$W/train" "$W/train_dequantized")
        if [ "$(steps "$W/train")" -eq 40 ] && [ "$(steps "$W/train_dequantized")" -eq 40 ] && within "$d" 1e-4 &&
           awk -v f="$first" -v t="$last" 'BEGIN { exit !(t < f - 0.01) }'; then
            echo "PASS qlora 40 QLoRA steps: each step's loss within 1e-4 of LoRA's on the dequantized bf16 base (largest difference $d), validation loss $first -> $last"
        else
            echo "FAIL qlora 40 QLoRA steps: largest step-loss difference from LoRA on the dequantized bf16 base '$d' (tol 1e-4), validation loss '$first' -> '$last' (expected 0.01 lower)"
        fi
        if [ $train_packed_ok -eq 0 ]; then
            d=$(maxdiff "$W/train" "$W/train_packed")
            if [ "$(steps "$W/train_packed")" -eq 40 ] && within "$d" 0.01 && grep -q "^step 40 sample: " "$W/train_packed.out"; then
                echo "PASS qlora 40 QLoRA steps with packed products: each step's loss within 0.01 of the dequantized products' (largest difference $d), a sample drawn"
            else
                echo "FAIL qlora 40 QLoRA steps with packed products: largest step-loss difference from the dequantized products' '$d' (tol 0.01), or no sample"
            fi
        fi
        if run merged --model "$W/trained_merged.bin" "${RUN[@]}" --steps 0; then
            trained=$(last_val_loss "$W/train.out") merged=$(val_loss "$W/merged.out")
            if [ -n "$trained" ] && awk -v a="$trained" -v b="$merged" 'BEGIN { d = a - b; exit !(d < 0.02 && d > -0.02) }'; then
                echo "PASS qlora the merged model's validation loss $merged is within 0.02 of the QLoRA run's $trained"
            else
                echo "FAIL qlora the merged model's validation loss '$merged' against the QLoRA run's '$trained'"
            fi
        fi
    fi
    wait $bnb_runs
    cat "$W/bnb.checks"
fi
wait $init_runs
cat "$W/init.checks"

# 5. data parallelism (full tier): 2 ranks sharing the GPU (or one a GPU with ONE_RANK_PER_GPU=1: test/loss_logs.sh),
#    4 rows each, ZeRO-1 over the adapters, against one rank of 8 rows (--shuffle 0: both read the same tokens)
if [ "${TEST_TIER:-full}" = full ] && [ -f "${BASE:-}" ]; then
    DP=(--model "$BASE" --seq-len 256 --sample-every 0 --val-every 0 --deterministic 1 --shuffle 0 "${LORA[@]}" --base-quant nf4 --steps 10
        --lr 3e-3 --parameter-checksums 1)
    if run dp_one "${DP[@]}" --batch-size 8 -o "$W/dp_one"; then
        if NCCL_NVLS_ENABLE=0 scripts/launch.sh $(launch_mode 2) 2 ./train_gpt "${DP[@]}" --batch-size 4 --zero-stage 1 -o "$W/dp_two" > "$W/dp_two.out" 2>&1; then
            d=$(maxdiff "$W/dp_one" "$W/dp_two")
            sums=$(grep -o 'parameter checksum [0-9a-f]*' "$W/dp_two.out" | sort -u | wc -l)
            ranks=$(grep -c 'parameter checksum' "$W/dp_two.out")
            if [ "$(steps "$W/dp_one")" -eq 10 ] && [ "$(steps "$W/dp_two")" -eq 10 ] && within "$d" 2e-2 && [ "$ranks" -eq 2 ] && [ "$sums" -eq 1 ]; then
                echo "PASS qlora 2 data-parallel ranks (ZeRO-1 over the adapters): 10 losses within 2e-2 of one rank's (largest difference $d), the same parameters on both ranks"
            else
                echo "FAIL qlora 2 data-parallel ranks: largest step-loss difference from one rank '$d' (tol 2e-2), $ranks ranks reported, $sums distinct parameter checksums"
            fi
        else
            echo "FAIL qlora 2 data-parallel ranks: $(grep -m1 error "$W/dp_two.out" || tail -n 1 "$W/dp_two.out")"
        fi
    fi
fi
