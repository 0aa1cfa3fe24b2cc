#!/usr/bin/env bash
# Sampling with the KV cache (model/sampling.cuh, kernels/attention_decode.cuh) against sampling without it, on a
# d2 GPT (T = 64) trained for 20 steps on tinyshakespeare:
#  1. --generate 100 --temperature 0 (greedy; past T = 64 the window slides) gives the same text with --kv-cache 1
#     and 0, in fp32 and bf16; the tokens/s of both are printed
#  2. the greedy samples during training (the last step's) are the same with and without the cache under tensor
#     parallelism (tp 2), tensor + sequence parallelism (tp 2, the rows padded to the split) and pipeline
#     parallelism (pp 2, interleaved, on d4), ranks sharing one GPU
#     (--stop-at-end 0); the default run (--stop-at-end 1) gives that text cut after its first <|endoftext|>
#  3. with transformers at hand: the fp32 model exported to Hugging Face (scripts/hf/export_hf.py) continues
#     <|endoftext|> with generate(do_sample=False) into the same text as train_gpt --generate 40 --temperature 0, both
#     stopping at the end-of-text token (the exported generation config's eos_token_id)
# 1 and 2 also for Llama-family models (rotary positions, grouped-query attention, an untied head; 1 with Llama 3's
# rope scaling; 2 under tp 2 with a key/value head per rank and pp 2 interleaved).
# The quick tier (TEST_TIER=quick) runs 1 in fp32 and 2 under tp 2 with sequence parallelism, for GPT-2 only. 2 runs
# beside 1.
# Greedy tokens are compared exactly: the cached and uncached attentions differ only in the order of their fp32
# sums, far below the gaps between the largest logits of a trained model.
set -u
cd "$(dirname "$0")/.."
SUITE=sampling
TIER=${TEST_TIER:-full}
W=build/test_work/sampling
rm -rf "$W"; mkdir -p "$W"
source test/loss_logs.sh  # run, launch_mode
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
VAL="data/tinyshakespeare/tinyshakespeare_val_*.bin"
[ -n "$(ls $TRAIN $VAL 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL sampling data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
SHAPE=(--model d2 --max-seq-len 64)
RUN=(--seq-len 64 --batch-size 4 --train-data "$TRAIN" --val-data "$VAL" --val-every 0 --lr 1e-3 --warmup-steps 2 --seed 3
     --deterministic 1)
text_of() { sed '/^---$/,$d' "$1"; }                       # --generate's text: the lines before its "---"
speed_of() { grep -o '[0-9.]* tokens/s' "$1" | head -n 1; }
sample_of() { grep -m1 "^step $2 sample:" "$1"; }           # the sample printed at step $2

# ---- 2. the samples during training under tensor, sequence and pipeline parallelism: they need no other run, so they
# run beside section 1 (below), their lines printed after its
parallel_samples() {
    while read -r name ranks tiers flags; do
        [[ $tiers == *$TIER* ]] || continue
        for kv in 1 0; do
            # shellcheck disable=SC2086
            run "${name}_$kv" "$ranks" --precision fp32 --steps 2 --sample-every 2 --sample-tokens 80 --temperature 0 --kv-cache $kv $flags
        done
        a=$(sample_of "$W/${name}_1.out" 2); b=$(sample_of "$W/${name}_0.out" 2)
        if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS sampling $name: the greedy sample of 80 tokens is the same with and without the KV cache"
        else echo "FAIL sampling $name: samples with and without the KV cache differ or are missing ($(grep -m1 -iE 'error' "$W/${name}_1.out" "$W/${name}_0.out"))"; fi
    done << 'EOF'
tp2 2 full --tensor-parallel 2
tp2_sequence_parallel 2 quick,full --tensor-parallel 2 --sequence-parallel 1
pp2_interleaved 2 full --model d4 --max-seq-len 64 --pipeline-parallel 2 --pipeline-schedule interleaved --total-batch-tokens 512
llama_tp2 2 full --model d2 --arch llama --channels 256 --heads 4 --kv-heads 2 --tied-head 0 --max-seq-len 64 --tensor-parallel 2
llama_pp2_interleaved 2 full --model d4 --arch llama --channels 256 --heads 4 --kv-heads 2 --max-seq-len 64 --pipeline-parallel 2 --pipeline-schedule interleaved --total-batch-tokens 512
EOF
}
parallel_samples > "$W/parallel_samples.checks" 2>&1 & parallel_samples_run=$!

# ---- 1. --generate with and without the cache
for p in fp32 $([ "$TIER" = full ] && echo bf16); do
    run "train_$p" 1 --precision $p --steps 20 --sample-every 0 --checkpoint-every 20 \
        || { echo "FAIL sampling $p training: $(tail -n 1 "$W/train_$p.out")"; continue; }
    for kv in 1 0; do
        ./train_gpt --model "$W/train_$p/model_00000020.bin" --precision $p --generate 100 --temperature 0 --kv-cache $kv --stop-at-end 0 \
            > "$W/generate_${p}_$kv.out" 2>&1 || echo "FAIL sampling $p --generate --kv-cache $kv: $(tail -n 1 "$W/generate_${p}_$kv.out")"
    done
    if grep -q '^generated 100 tokens' "$W/generate_${p}_1.out" && grep -q '^generated 100 tokens' "$W/generate_${p}_0.out" && cmp -s <(text_of "$W/generate_${p}_1.out") <(text_of "$W/generate_${p}_0.out"); then
        echo "PASS sampling $p greedy --generate 100 (T 64): the same text with the KV cache ($(speed_of "$W/generate_${p}_1.out")) and without ($(speed_of "$W/generate_${p}_0.out"))"
    else
        echo "FAIL sampling $p greedy --generate 100: the KV cache's text differs from the uncached one (diff $W/generate_${p}_1.out $W/generate_${p}_0.out)"
    fi
    # --stop-at-end 1 (the default): the same text, cut after its first <|endoftext|>, if it has one
    ./train_gpt --model "$W/train_$p/model_00000020.bin" --precision $p --generate 100 --temperature 0 > "$W/generate_${p}_stop.out" 2>&1
    full=$(text_of "$W/generate_${p}_0.out")
    if [[ $full == *"<|endoftext|>"* ]]; then want="${full%%<|endoftext|>*}<|endoftext|>"; else want=$full; fi
    if [ "$(text_of "$W/generate_${p}_stop.out")" == "$want" ]; then
        echo "PASS sampling $p greedy --generate 100 stops after the first <|endoftext|> ($(grep -o '^generated [0-9]* tokens' "$W/generate_${p}_stop.out"))"
    else
        echo "FAIL sampling $p greedy --generate 100: with --stop-at-end 1 the text is not the --stop-at-end 0 text cut after its first <|endoftext|> (diff $W/generate_${p}_stop.out $W/generate_${p}_0.out)"
    fi
done

# the same for the Llama family (full tier): rotary positions at the cache's offset, the decode kernel's grouped-query
# attention (1 key/value head for 2 heads of 64), Llama 3's rope scaling, an untied head
LLAMA=(--model d2 --arch llama --channels 128 --heads 2 --kv-heads 1 --tied-head 0 --max-seq-len 64 --rope-scaling 8,1,4,32)
for p in $([ "$TIER" = full ] && echo fp32 bf16); do
    run "llama_train_$p" 1 "${LLAMA[@]}" --precision $p --steps 20 --sample-every 0 --checkpoint-every 20
    if ! grep -q "^model: Llama family, 2 layers, 2 heads (1 key/value), 128 channels, .*untied head" "$W/llama_train_$p.out" ||
        [ ! -f "$W/llama_train_$p/model_00000020.bin" ]; then
        echo "FAIL sampling llama $p training: $(grep -m1 -E '^model:|error' "$W/llama_train_$p.out")"; continue
    fi
    for kv in 1 0; do
        ./train_gpt --model "$W/llama_train_$p/model_00000020.bin" --precision $p --generate 100 --temperature 0 --kv-cache $kv --stop-at-end 0 \
            > "$W/llama_generate_${p}_$kv.out" 2>&1 || echo "FAIL sampling llama $p --generate --kv-cache $kv: $(tail -n 1 "$W/llama_generate_${p}_$kv.out")"
    done
    a="$W/llama_generate_${p}_1.out" b="$W/llama_generate_${p}_0.out"
    if grep -q '^generated 100 tokens' "$a" && grep -q '^generated 100 tokens' "$b" && cmp -s <(text_of "$a") <(text_of "$b"); then
        echo "PASS sampling llama $p greedy --generate 100 (T 64): the same text with the KV cache ($(speed_of "$a")) and without ($(speed_of "$b"))"
    else
        echo "FAIL sampling llama $p greedy --generate 100: the KV cache's text differs from the uncached one (diff $a $b)"
    fi
done

wait $parallel_samples_run
cat "$W/parallel_samples.checks"

# ---- 3. transformers' greedy generation on the exported model
PY=${PYTHON:-python3}
if [ "$TIER" != full ]; then :
elif ! $PY -c "import torch, transformers, safetensors" > /dev/null 2>&1; then
    echo "SKIP sampling greedy vs transformers: $PY cannot import torch, transformers and safetensors"
elif [ ! -f "$W/train_fp32/model_00000020.bin" ]; then
    echo "FAIL sampling greedy vs transformers: no fp32 model file"
else
    ./train_gpt --model "$W/train_fp32/model_00000020.bin" --precision fp32 --generate 40 --temperature 0 > "$W/ours_40.out" 2>&1
    if $PY scripts/hf/export_hf.py "$W/train_fp32/model_00000020.bin" "$W/hf" > "$W/export.out" 2>&1 &&
       $PY test/tools/hf_interop_check.py greedy "$W/hf" --new-tokens 40 > "$W/theirs_40.txt" 2> "$W/theirs_40.err"; then
        if grep -q '^generated [0-9]* tokens' "$W/ours_40.out" && cmp -s <(text_of "$W/ours_40.out") "$W/theirs_40.txt"; then
            echo "PASS sampling fp32 greedy 40 tokens after <|endoftext|>: train_gpt's text ($(grep -o '^generated [0-9]* tokens' "$W/ours_40.out")) equals transformers' generate(do_sample=False), both stopping at the end-of-text token"
        else
            echo "FAIL sampling greedy vs transformers: texts differ (diff $W/ours_40.out $W/theirs_40.txt)"
        fi
    else
        echo "FAIL sampling greedy vs transformers: $(tail -q -n 1 "$W/export.out" "$W/theirs_40.err" 2>/dev/null | tail -n 1)"
    fi
fi
