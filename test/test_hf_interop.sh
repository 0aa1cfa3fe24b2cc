#!/usr/bin/env bash
# Hugging Face transformers interoperability (scripts/hf/export_hf.py, scripts/hf/import_hf.py; transformers' side in
# test/tools/hf_interop_check.py, on the CPU in fp32):
#  1. a random GPT2LMHeadModel (2 layers, C=128, 2 heads, 64 positions, vocab 50257) -> fp32 model file -> HF:
#     the same logits (max abs difference <= 1e-5); the exported tokenizer encodes as GPT-2
#  2. train_gpt trains d2 (T=64) for 10 steps in fp32 and in bf16; its model files exported: transformers' loss on
#     the validation batches of train_gpt's last "val loss" line within 1e-5 (fp32) and 1e-3 (bf16); export then
#     import gives the model files back bit for bit
#     (2b: the same for a Llama-family d2: transformers' logits of the export against llama_reference.py's of the
#     checkpoint, tol 1e-4 of the largest; export then import bit for bit; 2c, with peft: a LoRA run's PEFT folder
#     loaded by PeftModel.from_pretrained on the exported base gives the exported merged model's logits, tol 1e-5)
#  3. the random model of 1 imported: `train_gpt --model FILE --steps 0` (evaluation only) gives transformers'
#     validation loss within 1e-5 (fp32)
#  4. Llama family (test/tools/hf_llama_check.py): a random LlamaForCausalLM (grouped-query attention, untied head,
#     llama3 rope scaling) and Qwen2ForCausalLM (q/k/v biases, tied head) saved with save_pretrained, imported: our
#     file's logits (scripts/reference/llama_reference.py's model read from it) within 1e-4 of the largest
#     transformers logit (llama_reference.py's tolerance); exported back, from_pretrained gives the same logits
#  and bad input (a truncated model file, a config train_gpt cannot run): exit 1, one line, nothing written.
# Before those, with NumPy only (no torch, no GPU): folders written with numpy (llama, qwen2, mistral; fp32, bf16 and
# f16; single and sharded) imported and exported back bit for bit, ours -> HF -> ours bit for bit, and the Llama
# family's bad input (rope type, sliding window, attention_bias, a missing shard, a truncated safetensors file);
# bitsandbytes 4-bit NF4 folders (double and single quantization) imported as the NumPy reference dequantizes them, those
# weights quantized again without double quantization bit for bit, and bitsandbytes' bad input (FP4, 8-bit, GPTQ, a
# quant state without quantization_config, a missing absmax, another quant_map, block size 128);
# with torch also llama_reference.py's model files through export and import, and its reading of imported files.
# The rest needs torch, transformers and safetensors in python3 ($PYTHON); skipped without them. The quick tier
# (TEST_TIER=quick) runs 2, 2b and 2c in fp32 only (export, transformers' loss, import back, PEFT): each
# transformers process takes seconds to start, so 2 runs beside 2b-2c; 1, 3, 4 and the bad input are full-tier checks. The
# modules are looked for, not imported, before the checks (an import costs seconds).
# Usage: test_hf_interop.sh [files | transformers]: only the NumPy section (a CPU suite, hf_files: no GPU) or only
# the rest (the GPU suite, hf_interop); both without an argument.
set -u
cd "$(dirname "$0")/.."
PART=${1:-all}
case $PART in all|files|transformers) ;; *) echo "test_hf_interop.sh: the argument takes files or transformers, not '$PART'" >&2; exit 2;; esac
W=build/test_work/hf_interop_$PART
PY=${PYTHON:-python3}
TIER=${TEST_TIER:-full}
rm -rf "$W"; mkdir -p "$W"
# found, not imported (importing torch and transformers takes seconds, and the checks import them anyway; an install
# that is found but does not import fails the checks that use it)
has() { $PY -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in sys.argv[1:]) else 1)" "$@" > /dev/null 2>&1; }

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

# ---- 0. Llama family with NumPy only: HF -> ours -> HF and ours -> HF -> ours bit for bit
LCHECK="$PY test/tools/hf_llama_check.py"
IMPORT="$PY scripts/hf/import_hf.py"
EXPORT="$PY scripts/hf/export_hf.py"
edit_config() {  # edit_config FROM_DIR TO_DIR PYTHON_STATEMENTS_ON_c: a copy of the folder with config.json changed
    rm -rf "$2"; cp -r "$1" "$2"
    $PY -c "import json, sys; c = json.load(open(sys.argv[1])); $3; json.dump(c, open(sys.argv[1], 'w'))" "$2/config.json"
}
llama_round_trip() {  # llama_round_trip ID NAME ARCH DTYPE SHARDS: the folder $W/l_ID
    local d="$W/l_$1" name=$2 flag=$([ "$4" = BF16 ] && echo --bf16)
    if ! { $LCHECK make "$d" --arch "$3" --dtype "$4" --shards "$5" > "$d.make.out" 2>&1 &&
           $IMPORT "$d" "$d.bin" $flag > "$d.import.out" 2>&1 && $EXPORT "$d.bin" "$d.hf" > "$d.export.out" 2>&1 &&
           $IMPORT "$d.hf" "$d.back.bin" $flag > "$d.reimport.out" 2>&1; }; then
        echo "FAIL hf_interop llama $name: $(tail -q -n 1 "$d".*.out 2>/dev/null | grep -i error | head -n 1)"; return
    fi
    same=$($LCHECK same-tensors "$d" "$d.hf" 2>&1 | tail -n 1)
    case "$same" in ok*) echo "PASS hf_interop llama $name: HF -> model file -> HF: $same";;
                    *) echo "FAIL hf_interop llama $name: HF -> model file -> HF: $same";; esac
    if cmp -s "$d.bin" "$d.back.bin"; then echo "PASS hf_interop llama $name: model file -> HF -> model file bitwise"
    else echo "FAIL hf_interop llama $name: model file -> HF -> model file: files differ"; fi
}
if [ "$PART" = transformers ]; then :
elif ! has numpy; then
    echo "SKIP hf_interop llama checks: $PY cannot find numpy"
else
    llama_round_trip llama32 "llama fp32 (GQA, untied head, llama3 rope scaling)" llama F32 1
    llama_round_trip llama16 "llama bf16, 3 shards" llama BF16 3
    llama_round_trip qwen32 "qwen2 fp32 (q/k/v biases, tied head)" qwen2 F32 1
    llama_round_trip qwen16 "qwen2 bf16" qwen2 BF16 1
    L="$W/l_llama32" Q="$W/l_qwen32"
    # F16 tensors: imported to fp32 exactly, exported as F32 with the same values
    if $LCHECK make "$W/f16" --arch llama --dtype F16 > "$W/f16.out" 2>&1 && $IMPORT "$W/f16" "$W/f16.bin" >> "$W/f16.out" 2>&1 &&
       $EXPORT "$W/f16.bin" "$W/f16.hf" >> "$W/f16.out" 2>&1 && same=$($LCHECK same-tensors "$W/f16" "$W/f16.hf" --values 2>&1); then
        echo "PASS hf_interop llama F16 -> fp32 model file -> F32: $same"
    else echo "FAIL hf_interop llama F16 -> fp32 model file -> F32: $(tail -n 1 "$W/f16.out") $same"; fi
    # Mistral: Llama's tensors under another model_type; no sliding window
    edit_config "$L" "$W/mistral" "c['model_type'] = 'mistral'; c['architectures'] = ['MistralForCausalLM']; c['sliding_window'] = None"
    if $IMPORT "$W/mistral" "$W/mistral.bin" > "$W/mistral.out" 2>&1 && cmp -s "$W/mistral.bin" "$L.bin"; then
        echo "PASS hf_interop llama mistral (sliding_window null): the same model file as llama's"
    else echo "FAIL hf_interop llama mistral: $(tail -n 1 "$W/mistral.out")"; fi
    # transformers 5's rope_parameters instead of rope_theta and rope_scaling
    edit_config "$L" "$W/rope5" "c['rope_parameters'] = dict(c.pop('rope_scaling'), rope_theta=c.pop('rope_theta'))"
    if $IMPORT "$W/rope5" "$W/rope5.bin" > "$W/rope5.out" 2>&1 && cmp -s "$W/rope5.bin" "$L.bin"; then
        echo "PASS hf_interop llama rope_parameters (transformers 5): the same model file"
    else echo "FAIL hf_interop llama rope_parameters: $(tail -n 1 "$W/rope5.out")"; fi
    if has torch; then
        # llama_reference.py writes the model file as the trainer reads it: an imported file read and written back by
        # it is the same file, and its own files go through export and import unchanged
        REF="$PY scripts/reference/llama_reference.py"
        for a in llama qwen; do
            if $REF --init-from "$W/l_${a}32.bin" --batch-size 1 --seq-len 8 --model-out "$W/ref_read.bin" > "$W/ref_read.out" 2>&1 &&
               cmp -s "$W/l_${a}32.bin" "$W/ref_read.bin"; then
                echo "PASS hf_interop llama $a import read and rewritten by llama_reference.py: the same file"
            else echo "FAIL hf_interop llama $a import read by llama_reference.py: $(tail -n 1 "$W/ref_read.out")"; fi
        done
        if $REF --layers 2 --channels 256 --heads 4 --kv-heads 2 --ffn 344 --vocab-size 1000 --seq-len 16 --batch-size 1 \
                --tied-head 0 --qkv-bias 1 --rope-theta 1000000 --norm-eps 1e-6 --model-out "$W/ref.bin" > "$W/ref.out" 2>&1 &&
           $EXPORT "$W/ref.bin" "$W/ref_hf" > "$W/ref_export.out" 2>&1 && $IMPORT "$W/ref_hf" "$W/ref_back.bin" > "$W/ref_import.out" 2>&1 &&
           cmp -s "$W/ref.bin" "$W/ref_back.bin"; then
            echo "PASS hf_interop llama llama_reference.py model file (biases, untied head) -> HF -> model file bitwise"
        else echo "FAIL hf_interop llama llama_reference.py model file -> HF -> model file: $(tail -q -n 1 "$W/ref.out" "$W/ref_export.out" "$W/ref_import.out" 2>/dev/null | grep -i error | head -n 1)"; fi
    else
        echo "SKIP hf_interop llama checks with llama_reference.py: $PY cannot find torch"
    fi
    # bad input
    edit_config "$L" "$W/b_rope" "c['rope_scaling'] = {'rope_type': 'yarn', 'factor': 4.0}"
    bad "llama rope type yarn" "$W/bad.bin" $IMPORT "$W/b_rope" "$W/bad.bin"
    edit_config "$L" "$W/b_window" "c['model_type'] = 'mistral'; c['sliding_window'] = 32"
    bad "mistral sliding window" "$W/bad.bin" $IMPORT "$W/b_window" "$W/bad.bin"
    edit_config "$Q" "$W/b_qwindow" "c['use_sliding_window'] = True; c['sliding_window'] = 32"
    bad "qwen2 use_sliding_window" "$W/bad.bin" $IMPORT "$W/b_qwindow" "$W/bad.bin"
    edit_config "$L" "$W/b_bias" "c['attention_bias'] = True"
    bad "llama attention_bias" "$W/bad.bin" $IMPORT "$W/b_bias" "$W/bad.bin"
    edit_config "$L" "$W/b_head" "c['tie_word_embeddings'] = True"
    bad "llama lm_head.weight while tied" "$W/bad.bin" $IMPORT "$W/b_head" "$W/bad.bin"
    rm -rf "$W/b_shard"; cp -r "$W/l_llama16" "$W/b_shard"; rm "$W/b_shard/model-00002-of-00003.safetensors"
    bad "missing shard" "$W/bad.bin" $IMPORT "$W/b_shard" "$W/bad.bin"
    rm -rf "$W/b_trunc"; cp -r "$L" "$W/b_trunc"
    head -c 100000 "$L/model.safetensors" > "$W/b_trunc/model.safetensors"
    bad "truncated safetensors" "$W/bad.bin" $IMPORT "$W/b_trunc" "$W/bad.bin"
    # bitsandbytes 4-bit NF4 folders (double and single quantization, written as bitsandbytes saves them): imported
    # bit for bit as the NumPy reference dequantizes them; quantizing those weights again without double quantization
    # gives them back bit for bit; the refusals
    for q in double single; do
        if $LCHECK make-bnb "$L" "$W/bnb_$q" --dequantized "$W/bnb_${q}_dequantized" $([ $q = single ] && echo --single) > "$W/bnb_$q.out" 2>&1 &&
           $IMPORT "$W/bnb_$q" "$W/bnb_$q.bin" >> "$W/bnb_$q.out" 2>&1 &&
           $IMPORT "$W/bnb_${q}_dequantized" "$W/bnb_${q}_dequantized.bin" >> "$W/bnb_$q.out" 2>&1 &&
           cmp -s "$W/bnb_$q.bin" "$W/bnb_${q}_dequantized.bin"; then
            echo "PASS hf_interop llama bitsandbytes NF4 folder ($q quantization): its weights imported as the NumPy reference dequantizes them, bit for bit"
        else echo "FAIL hf_interop llama bitsandbytes NF4 folder ($q quantization): $(grep -i error "$W/bnb_$q.out" | head -n 1)"; fi
    done
    if out=$($LCHECK exact-requantize "$L" 2>&1); then echo "PASS hf_interop llama NF4 weights quantized again without double quantization: $out"
    else echo "FAIL hf_interop llama NF4 weights quantized again: $out"; fi
    B="$W/bnb_double"
    edit_config "$B" "$W/b_fp4" "c['quantization_config']['bnb_4bit_quant_type'] = 'fp4'"
    bad "bitsandbytes FP4" "$W/bad.bin" $IMPORT "$W/b_fp4" "$W/bad.bin"
    edit_config "$B" "$W/b_int8" "c['quantization_config'].update(load_in_4bit=False, load_in_8bit=True)"
    bad "bitsandbytes 8-bit" "$W/bad.bin" $IMPORT "$W/b_int8" "$W/bad.bin"
    edit_config "$B" "$W/b_gptq" "c['quantization_config'] = {'quant_method': 'gptq', 'bits': 4}"
    bad "GPTQ" "$W/bad.bin" $IMPORT "$W/b_gptq" "$W/bad.bin"
    edit_config "$B" "$W/b_noconfig" "del c['quantization_config']"
    bad "NF4 quant state without quantization_config" "$W/bad.bin" $IMPORT "$W/b_noconfig" "$W/bad.bin"
    # edit_tensors FROM_DIR TO_DIR PYTHON_STATEMENTS_ON_t: a copy of the folder with model.safetensors rewritten from
    # t = {name: stored array}
    edit_tensors() {
        rm -rf "$2"; cp -r "$1" "$2"
        $PY - "$2/model.safetensors" "$3" <<'PY'
import sys
sys.path.insert(0, "scripts/hf")
from export_hf import load_stored, read_safetensors_header, write_safetensors
path = sys.argv[1]
entries = read_safetensors_header(path)
t = {name: load_stored(path, e) for name, e in entries.items()}
exec(sys.argv[2])
write_safetensors(path, list(t.items()), {name: entries[name][0] if name in entries else "U8" for name in t})
PY
    }
    Q0="model.layers.0.self_attn.q_proj.weight"
    edit_tensors "$B" "$W/b_absmax" "del t['$Q0.absmax']"
    bad "bitsandbytes weight without its absmax" "$W/bad.bin" $IMPORT "$W/b_absmax" "$W/bad.bin"
    edit_tensors "$B" "$W/b_map" "t['$Q0.quant_map'] = t['$Q0.quant_map'][::-1].copy()"
    bad "bitsandbytes quant_map other than NF4's" "$W/bad.bin" $IMPORT "$W/b_map" "$W/bad.bin"
    edit_tensors "$B" "$W/b_block" "import json, numpy as np; k = '$Q0.quant_state.bitsandbytes__nf4'; s = json.loads(t[k].tobytes()); s['blocksize'] = 128; t[k] = np.frombuffer(json.dumps(s).encode(), dtype=np.uint8)"
    bad "bitsandbytes block size 128" "$W/bad.bin" $IMPORT "$W/b_block" "$W/bad.bin"
fi

if [ "$PART" = files ]; then exit 0
elif ! has torch transformers safetensors; then
    echo "SKIP hf_interop transformers checks: $PY cannot find torch, transformers and safetensors"
    exit 0
fi
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
# 2 and 2b-2c run side by side (each mostly waits for Python processes to import torch and transformers)
gpt2_files() {
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

}
llama_files() {
# ---- 2b. a Llama-family train_gpt checkpoint (d2 --arch llama) exported: transformers' logits are llama_reference.py's
# of the checkpoint (tol 1e-4 of the largest); imported back, the same bytes but the run identity and the checksum
for p in fp32 $([ "$TIER" = full ] && echo bf16); do
    o="$W/train_llama_$p"
    ./train_gpt "${SMALL[@]}" --arch llama --precision $p -o "$o" > "$o.out" 2>&1 \
        || { echo "FAIL hf_interop export of a $p Llama train_gpt model: training: $(tail -n 1 "$o.out")"; continue; }
    model="$o/model_00000010.bin"
    if ! { $EXPORT "$model" "$o.hf" > "$o.export.out" 2>&1 &&
           $IMPORT "$o.hf" "$o.back.bin" $([ $p = bf16 ] && echo --bf16) > "$o.import.out" 2>&1; }; then
        echo "FAIL hf_interop export of a $p Llama train_gpt model: $(tail -q -n 1 "$o.export.out" "$o.import.out" 2>/dev/null | tail -n 1)"; continue
    fi
    r=$($LCHECK ours-vs-hf "$model" "$o.hf" 2> "$o.logits.err" | tail -n 1)
    if within "$r" 0 1e-4; then echo "PASS hf_interop export of a $p Llama train_gpt model (d2, 10 steps): transformers' logits vs llama_reference.py's: max |diff| / max |logit| $r (tol 1e-4)"
    else echo "FAIL hf_interop export of a $p Llama train_gpt model: logits '$r' (tol 1e-4) $(tail -n 1 "$o.logits.err")"; fi
    if cmp -s -n 960 "$model" "$o.back.bin" && cmp -s -i 976 -n 40 "$model" "$o.back.bin" && cmp -s -i 1024 "$model" "$o.back.bin"; then
        echo "PASS hf_interop $p Llama model file -> export -> import: bitwise equal but the run identity and the checksum"
    else echo "FAIL hf_interop $p Llama model file -> export -> import: files differ"; fi
done

# ---- 2c. PEFT: a LoRA run of 5 steps on 2b's fp32 Llama model (every per-projection target, alpha 2r) writes a PEFT folder (--lora-save DIR/) and the merged model
# (--lora-merge); PeftModel.from_pretrained on the exported base gives the logits of the exported merged model
base="$W/train_llama_fp32/model_00000010.bin"
if ! $PY -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('peft') else 1)" > /dev/null 2>&1; then
    echo "SKIP hf_interop PEFT adapters: $PY cannot find peft"
elif [ ! -f "$base" ]; then
    echo "FAIL hf_interop PEFT adapters: no Llama model file from 2b"
else
    o="$W/peft"; mkdir -p "$o"
    if ./train_gpt --model "$base" --precision fp32 --seq-len $T --batch-size $B --train-data "$TRAIN" --val-every 0 --sample-every 0 --steps 5 \
           --lr 1e-3 --seed 3 --deterministic 1 --lora-rank 4 --lora-alpha 8 --lora-targets q,k,v,o,gate,up,down \
           --lora-save "$o/adapters/" --lora-merge "$o/merged.bin" > "$o.out" 2>&1 &&
       $EXPORT "$base" "$o/base_hf" > "$o.export.out" 2>&1 && $EXPORT "$o/merged.bin" "$o/merged_hf" >> "$o.export.out" 2>&1; then
        r=$($LCHECK peft-vs-merged "$o/base_hf" "$o/adapters" "$o/merged_hf" 2> "$o.peft.err" | tail -n 1)
        d=$($LCHECK hf-vs-hf "$o/base_hf" "$o/merged_hf" 2> /dev/null | tail -n 1)
        if within "$r" 0 1e-5 && ! within "$d" 0 1e-6; then
            echo "PASS hf_interop PEFT adapters (--lora-save DIR/, 7 targets): PeftModel.from_pretrained on the exported base gives the merged model's logits: max |diff| / max |logit| $r (tol 1e-5; the adapters move the logits by $d)"
        else echo "FAIL hf_interop PEFT adapters: PeftModel vs merged '$r' (tol 1e-5), base vs merged '$d' (must differ) $(tail -n 1 "$o.peft.err")"; fi
    else echo "FAIL hf_interop PEFT adapters: $(tail -q -n 1 "$o.out" "$o.export.out" 2>/dev/null | grep -i error | head -n 1)"; fi
fi

}
gpt2_files > "$W/gpt2_files.out" 2>&1 &
llama_files > "$W/llama_files.out" 2>&1
wait
cat "$W/gpt2_files.out" "$W/llama_files.out"

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

# ---- 4. Llama family: transformers -> our model file (its logits) -> transformers (the same logits)
for arch in $([ "$TIER" = full ] && echo llama qwen2); do
    d="$W/t_$arch"
    if ! { $LCHECK random "$d" --arch $arch > "$d.random.out" 2>&1 && $IMPORT "$d" "$d.bin" > "$d.import.out" 2>&1 &&
           $EXPORT "$d.bin" "$d.hf" > "$d.export.out" 2>&1; }; then
        echo "FAIL hf_interop $arch transformers -> model file -> transformers: $(tail -q -n 1 "$d".*.out | tail -n 1)"; continue
    fi
    r=$($LCHECK ours-vs-hf "$d.bin" "$d" 2> "$d.ours.err" | tail -n 1)
    if within "$r" 0 1e-4; then echo "PASS hf_interop $arch import: llama_reference.py's logits of the model file vs transformers': max |diff| / max |logit| $r (tol 1e-4)"
    else echo "FAIL hf_interop $arch import: logits of the model file vs transformers': '$r' (tol 1e-4) $(tail -n 1 "$d.ours.err")"; fi
    e=$($LCHECK hf-vs-hf "$d" "$d.hf" 2> "$d.hf.err" | tail -n 1)
    if [ "$e" = 0 ]; then echo "PASS hf_interop $arch export: from_pretrained of the export gives the same logits (max |diff| 0)"
    else echo "FAIL hf_interop $arch export: from_pretrained of the export: max |logit diff| '$e' $(tail -n 1 "$d.hf.err")"; fi
done

if [ -f "$W/imported.bin" ]; then
    head -c 100000 "$W/imported.bin" > "$W/truncated.bin"
    bad "truncated model file" "$W/hf_bad" $PY scripts/hf/export_hf.py "$W/truncated.bin" "$W/hf_bad"
    mkdir -p "$W/hf_inner"; cp "$W/hf_random/model.safetensors" "$W/hf_inner/"
    $PY -c "import json, sys; c = json.load(open(sys.argv[1])); c['n_inner'] = 1000; json.dump(c, open(sys.argv[2], 'w'))" \
        "$W/hf_random/config.json" "$W/hf_inner/config.json"
    bad "n_inner not 4 x n_embd" "$W/bad.bin" $PY scripts/hf/import_hf.py "$W/hf_inner" "$W/bad.bin"
fi
