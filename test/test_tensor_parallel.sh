#!/usr/bin/env bash
# Tensor parallelism on one GPU, through real NCCL: every rank shares GPU 0 (scripts/launch.sh --one-gpu, each
# rank its own NCCL_HOSTID, loopback sockets); with ONE_RANK_PER_GPU=1, one rank per GPU wherever the machine has
# enough (test/loss_logs.sh). A 2-layer model with 4 heads of 64, 10 steps, the same global
# batch as one rank:
#   - tp 2 and 4 give the losses of tp 1 (fp32 within 1e-5, bf16 and fp16 within 2e-2), the tensors that tensor
#     parallelism replicates end bitwise identical on every rank, and a sample continues the same way;
#   - tp 2 x dp 2 with ZeRO 1 and 3 (4 ranks) give the losses of one rank;
#   - checkpoints resume across tensor- and data-parallel sizes (2 -> 1, 1 -> 2, 2 -> 2 x dp 2, 2 -> 4);
#   - the model file a tp 2 run exports equals the whole model it started from (one step at learning rate 0);
#   - sequence parallelism on gives the losses of off (also with accumulation, recompute and ZeRO-3) and shows
#     its activation saving in the memory plan;
#   - the Llama family: key/value heads split over the ranks (with an untied head, sequence parallelism, ZeRO-3 over
#     dp 2, q/k/v biases, a resume 2 -> 1) give the losses of tp 1; fewer key/value heads than ranks are refused.
# fp32 differences between tp sizes come from the order of the sums (the all-reduces add partial products).
# The quick tier (TEST_TIER=quick) runs tp 2 in fp32, tp 2 x dp 2 with sequence parallelism and ZeRO-3, the
# resume 2 -> 1 and the Llama refusal; the rest (tp 4, bf16 and fp16, the other sequence-parallel runs and the plan,
# the samples, ZeRO-1, the other resumes, the export, the Llama runs) only in the full tier (test_fp8_model's quick tier runs tp 2 x pp 2 on bf16 weights).
set -u
cd "$(dirname "$0")/.."
W=build/test_work/tensor_parallel
rm -rf "$W"; mkdir -p "$W"
export NCCL_NVLS_ENABLE=0
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
[ -n "$(ls $TRAIN 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1 \
    || { echo "FAIL tensor_parallel training data: $(tail -n 1 "$W/prepare.log")"; exit 1; }
SHAPE=(--layers 2 --heads 4 --channels 256 --max-seq-len 64)
RUN=(--seq-len 64 --train-data "$TRAIN" --val-every 0 --sample-every 0 --lr 1e-3 --warmup-steps 2 --seed 5 --deterministic 1 --steps 10
     --shuffle 0 --parameter-checksums 1)  # the files' order: runs of other batch shapes read the same tokens
SUITE="tensor_parallel"
source test/loss_logs.sh  # losses, maxdiff, within, run, compare
# tp 2 x dp 2 with sequence parallelism and ZeRO-3 (checked below) needs no other run: it starts now, beside the others
run sp2dp2_s3 4 --precision fp32 --batch-size 2 --tensor-parallel 2 --sequence-parallel 1 --zero-stage 3 & sp2dp2_run=$!
TIER=${TEST_TIER:-full}
# the replicated tensors' checksum is the same on every rank; ranks of one tensor-parallel rank share all
replicated_identical() {
    local name=$1 ranks=$2 what=$3
    local reported distinct
    reported=$(grep -c 'replicated checksum' "$W/$name.out")
    distinct=$(grep -o 'replicated checksum [0-9a-f]*' "$W/$name.out" | sort -u | wc -l)
    local groups; groups=$(grep -o 'parameter checksum [0-9a-f]* tensor-parallel rank [0-9]*' "$W/$name.out" | sort -u | awk '{print $6}' | sort | uniq -d | wc -l)
    if [ "$reported" -eq "$ranks" ] && [ "$distinct" -eq 1 ] && [ "$groups" -eq 0 ]; then
        echo "PASS tensor_parallel $what: replicated tensors bitwise identical on all $ranks ranks"
    else
        echo "FAIL tensor_parallel $what: $reported ranks reported, $distinct distinct replicated checksums, $groups tensor-parallel ranks with differing copies"
    fi
}

for p in fp32 $([ "$TIER" = full ] && echo bf16 fp16); do
    tol=$([ $p = fp32 ] && echo 1e-5 || echo 2e-2)
    run single_$p 1 --precision $p --batch-size 4 --checkpoint-every 5 \
        || { echo "FAIL tensor_parallel $p one-rank baseline: $(tail -n 1 "$W/single_$p.out")"; continue; }
    for tp in 2 $([ "$TIER" = full ] && echo 4); do
        run tp${tp}_$p $tp --precision $p --batch-size 4 --tensor-parallel $tp --checkpoint-every 5
        compare tp${tp}_$p single_$p $tol 0 10 "tp $tp $p: 10 losses match tp 1"
        replicated_identical tp${tp}_$p $tp "tp $tp $p"
    done
done

# tp 2 x dp 2 (4 ranks, 2 rows each) with sequence parallelism and ZeRO-3 against one rank with the same 4 rows
wait $sp2dp2_run  # started at the top
compare sp2dp2_s3 single_fp32 1e-5 0 10 "tp 2 x dp 2 sequence parallel ZeRO-3 fp32: 10 losses match one rank"
replicated_identical sp2dp2_s3 4 "tp 2 x dp 2 sequence parallel ZeRO-3"

# resume across sizes: the step-5 checkpoint of one mesh continues on another (fp32, steps 5-9)
resume() {
    local from=$1 name=$2 ranks=$3; shift 3
    mkdir -p "$W/$name"; cp "$W/$from"/*_00000005* "$W/$name/"
    run "$name" "$ranks" --precision fp32 --resume 1 "$@"
    compare "$name" "$from" 1e-5 5 5 "resume of $from on $ranks ranks ($*): steps 5-9"
}
resume tp2_fp32 tp2_to_1 1 --batch-size 4
# the Llama family: a degree above the key/value heads is refused on every rank before any GPU work, in one line
# (tensor_parallel_problem, model/config.h)
run llama_kv_refused 2 --model d2 --arch llama --channels 256 --heads 4 --kv-heads 1 --max-seq-len 64 --precision fp32 --batch-size 4 \
    --tensor-parallel 2; rc=$?
refusal="error: --tensor-parallel 2: the 1 key/value heads do not split into 2 equal groups (a degree above the key/value heads would need them replicated"
if [ $rc -ne 0 ] && grep -qF "$refusal" "$W/llama_kv_refused.out" && ! grep -q '^step ' "$W/llama_kv_refused.out"; then
    echo "PASS tensor_parallel llama: 1 key/value head at tp 2 refused before any step: $(grep -m1 -F "$refusal" "$W/llama_kv_refused.out" | cut -c1-80)..."
else
    echo "FAIL tensor_parallel llama: 1 key/value head at tp 2 not refused as expected: exit $rc: $(grep -m1 error "$W/llama_kv_refused.out")"
fi
[ "$TIER" = full ] || exit 0  # the quick tier ends here

# sequence parallelism: the same losses as without it, also with gradient accumulation (the LayerNorm gradients
# of several micro-steps summed over the ranks once) and with whole blocks recomputed; less activation memory
run sp2_fp32 2 --precision fp32 --batch-size 4 --tensor-parallel 2 --sequence-parallel 1
compare sp2_fp32 tp2_fp32 1e-5 0 10 "tp 2 sequence parallel on against off fp32"
replicated_identical sp2_fp32 2 "tp 2 sequence parallel"
run sp4_bf16 4 --precision bf16 --batch-size 4 --tensor-parallel 4 --sequence-parallel 1
compare sp4_bf16 single_bf16 2e-2 0 10 "tp 4 sequence parallel bf16: 10 losses match tp 1"
run sp2_accum 2 --precision fp32 --batch-size 2 --total-batch-tokens 256 --tensor-parallel 2 --sequence-parallel 1
compare sp2_accum single_fp32 1e-5 0 10 "tp 2 sequence parallel with 2 micro-steps fp32: 10 losses match one rank"
run sp2_recompute 2 --precision fp32 --batch-size 4 --tensor-parallel 2 --sequence-parallel 1 --recompute 3
compare sp2_recompute single_fp32 1e-5 0 10 "tp 2 sequence parallel with --recompute 3 fp32: 10 losses match one rank"
# the plan of GPT-2 124M (d12) at B = 8, T = 1024, tp 4 (--steps 0: start-up only): the activations must shrink
scripts/launch.sh $(launch_mode 4) 4 ./train_gpt --model d12 --batch-size 8 --seq-len 1024 --steps 0 --val-every 0 --sample-every 0 \
    --train-data "$TRAIN" --tensor-parallel 4 --sequence-parallel 1 > "$W/sp_plan.out" 2>&1
read -r with without < <(sed -nE 's/^sequence parallel: activations ([0-9.]+) GiB per GPU, against ([0-9.]+) GiB.*/\1 \2/p' "$W/sp_plan.out")
if [ -n "${with:-}" ] && awk -v a="$with" -v b="$without" 'BEGIN { exit !(a < b) }'; then
    echo "PASS tensor_parallel d12 tp 4 sequence parallel plan: activations $with GiB per GPU against $without GiB without"
else
    echo "FAIL tensor_parallel sequence parallel plan: no saving shown: $(grep -m1 -E 'sequence parallel|error' "$W/sp_plan.out")"
fi

# a sample (fp32) continues the prompt with the same tokens at tp 2 (with and without sequence parallelism,
# which pads the window) as at tp 1
SAMPLE=(--precision fp32 --batch-size 4 --steps 2 --sample-every 2 --sample-tokens 16 --top-k 1)
run sample1 1 "${SAMPLE[@]}"; run sample2 2 "${SAMPLE[@]}" --tensor-parallel 2
run sample2sp 2 "${SAMPLE[@]}" --tensor-parallel 2 --sequence-parallel 1
s1=$(grep -A1 'sample:' "$W/sample1.out")
for name in sample2 sample2sp; do
    s2=$(grep -A1 'sample:' "$W/$name.out")
    if [ -n "$s1" ] && [ "$s1" == "$s2" ]; then echo "PASS tensor_parallel $name: the tp 2 sample equals tp 1's (greedy, 16 tokens)"
    else echo "FAIL tensor_parallel $name: the tp 2 sample differs: '$s2' vs '$s1'"; fi
done

# tp 2 x dp 2 (4 ranks, 2 rows each) against one rank with the same 4 rows
for stage in 1 3; do
    run tp2dp2_s$stage 4 --precision fp32 --batch-size 2 --tensor-parallel 2 --zero-stage $stage
    compare tp2dp2_s$stage single_fp32 1e-5 0 10 "tp 2 x dp 2 ZeRO-$stage fp32: 10 losses match one rank"
    replicated_identical tp2dp2_s$stage 4 "tp 2 x dp 2 ZeRO-$stage"
done

# the other resumes across sizes
resume single_fp32 tp1_to_2 2 --batch-size 4 --tensor-parallel 2
resume tp2_fp32 tp2_to_tp2dp2 4 --batch-size 2 --tensor-parallel 2 --zero-stage 1
resume tp2_fp32 tp2_to_4 4 --batch-size 4 --tensor-parallel 4

# export: one step at learning rate 0 from a model file leaves every parameter as it was (fp32, no weight
# decay effect at lr 0), so the model file that the tp 2 run assembles must equal its input bit for bit
run export 2 --precision fp32 --batch-size 4 --tensor-parallel 2 --model "$W/single_fp32/model_00000005.bin" \
    --steps 1 --lr 0 --checkpoint-every 1
if [ -f "$W/export/model_00000001.bin" ] && cmp -s -i 1024 "$W/export/model_00000001.bin" "$W/single_fp32/model_00000005.bin"; then
    echo "PASS tensor_parallel tp 2 export equals the whole model it loaded (bitwise)"
else
    echo "FAIL tensor_parallel tp 2 export differs from the model it loaded: $(grep -m1 -i error "$W/export.out")"
fi

# The Llama family, fp32 against one rank with the same 4 rows: grouped-query attention (2 key/value heads for 4 heads
# of 64: one of each per rank at tp 2) with an untied head (split by vocabulary rows like wte) at tp 2, with sequence
# parallelism (RMSNorm along the sequence) and at tp 2 x dp 2 with ZeRO-3; Qwen's q/k/v biases (split with their
# heads) and a tied head at tp 2 with sequence parallelism; the tp 2 run's step-5 checkpoint continued on one rank.
LLAMA=(--model d2 --arch llama --channels 256 --heads 4 --kv-heads 2 --max-seq-len 64 --precision fp32)
run llama_single 1 "${LLAMA[@]}" --tied-head 0 --batch-size 4 --checkpoint-every 5
if grep -q "^model: Llama family, 2 layers, 4 heads (2 key/value), 256 channels, .*untied head" "$W/llama_single.out"; then
    run llama_tp2 2 "${LLAMA[@]}" --tied-head 0 --batch-size 4 --tensor-parallel 2 --checkpoint-every 5
    compare llama_tp2 llama_single 1e-5 0 10 "llama tp 2 (2 key/value heads, untied head) fp32: 10 losses match tp 1"
    replicated_identical llama_tp2 2 "llama tp 2"
    run llama_sp2 2 "${LLAMA[@]}" --tied-head 0 --batch-size 4 --tensor-parallel 2 --sequence-parallel 1
    compare llama_sp2 llama_single 1e-5 0 10 "llama tp 2 sequence parallel fp32: 10 losses match tp 1"
    run llama_tp2dp2_s3 4 "${LLAMA[@]}" --tied-head 0 --batch-size 2 --tensor-parallel 2 --zero-stage 3
    compare llama_tp2dp2_s3 llama_single 1e-5 0 10 "llama tp 2 x dp 2 ZeRO-3 fp32: 10 losses match one rank"
    replicated_identical llama_tp2dp2_s3 4 "llama tp 2 x dp 2 ZeRO-3"
    mkdir -p "$W/llama_tp2_to_1"; cp "$W/llama_tp2"/*_00000005* "$W/llama_tp2_to_1/"
    run llama_tp2_to_1 1 "${LLAMA[@]}" --tied-head 0 --batch-size 4 --resume 1
    compare llama_tp2_to_1 llama_tp2 1e-5 5 5 "llama resume of the tp 2 checkpoint on 1 rank: steps 5-9"
else
    echo "FAIL tensor_parallel llama one-rank baseline: not a Llama-family run: $(grep -m1 -E '^model:|error' "$W/llama_single.out")"
fi
run llama_qwen_single 1 "${LLAMA[@]}" --qkv-bias 1 --tied-head 1 --batch-size 4
run llama_qwen_sp2 2 "${LLAMA[@]}" --qkv-bias 1 --tied-head 1 --batch-size 4 --tensor-parallel 2 --sequence-parallel 1
compare llama_qwen_sp2 llama_qwen_single 1e-5 0 10 "llama with q/k/v biases and a tied head, tp 2 sequence parallel fp32: 10 losses match tp 1"
replicated_identical llama_qwen_sp2 2 "llama with q/k/v biases, tp 2 sequence parallel"
