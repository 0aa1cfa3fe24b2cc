#!/usr/bin/env bash
# Runs the whole test suite and prints one closing line "N passed, N failed, N skipped" (the checks themselves are
# in the suites; the benchmarks, in bench/, are not run here).
# A suite has one name X: its label here, its driver test/test_X.sh (if any) and its program build/test_X from
# test/test_X.cpp|cu (if any). Every check prints one line that starts with its suite's name: "PASS X name",
# "FAIL X name: why" or "SKIP X name: why" (so `grep '^PASS X '` lists a suite's checks).
# CPU tests always run; GPU tests run when nvidia-smi lists a GPU, and are reported as skipped otherwise. With a GPU the
# two run side by side (the CPU suites' lines come after the GPU suites'), the GPU suites in two chains (gpu_suites).
# TEST_TIER (exported to every suite): quick (`make test`) runs each GPU suite's reduced set, every component at
# least once; full (`make test-full`, and the default) runs every check, and the
# multi-rank suites once more with one rank per GPU on a machine with several. Each driver and program says what
# its quick set leaves out; the CPU suites run whole in both, but sharding (d12's layout at one rank count and not
# its tensor-parallel split; the smaller models' whole). Some suites run independent launches side by side (each
# driver says which).
set -u
cd "$(dirname "$0")/.."
export TEST_TIER=${TEST_TIER:-full}
case $TEST_TIER in quick|full) ;; *) echo "run_tests.sh: TEST_TIER must be quick or full, not '$TEST_TIER'" >&2; exit 2;; esac
LOG=${TEST_LOG:-build/test.log}
WORK=build/test_work
mkdir -p "$WORK"
: > "$LOG"

# TEST_SUITES="kernels attention ...": only the suites whose label's first word is listed run (all when empty).
selected() { [ -z "${TEST_SUITES:-}" ] || [[ " $TEST_SUITES " == *" ${1%% *} "* ]]; }

# Runs a command whose stdout holds check lines; a crash or non-zero exit without a FAIL line counts as one FAIL.
run() {
    local name=$1; shift
    selected "$name" || return 0
    local out rc start=$SECONDS
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" >> "$LOG"
    printf '%s\n' "$out" | grep -E '^(PASS|FAIL|SKIP) ' || true
    if [ $rc -ne 0 ] && ! printf '%s\n' "$out" | grep -q '^FAIL '; then
        echo "FAIL $name: exited $rc: $(printf '%s\n' "$out" | tail -n 1)" | tee -a "$LOG"
    fi
    echo "# $name: $((SECONDS - start)) s" | tee -a "$LOG"  # where the suite's time goes
}
skip() { selected "$1" || return 0; echo "SKIP $1: $2" | tee -a "$LOG"; }  # a suite left out by TEST_SUITES says nothing

gpu_count=$(scripts/visible_gpus.sh)

# The shards of data/ that suites read: made (and their maker checked, `prepare`) before any suite runs beside another.
run prepare bash test/test_prepare.sh

# ---- CPU tests
cpu_suites() {
    run tokenizer build/test_tokenizer
    run dataloader build/test_dataloader
    run chat build/test_chat  # chat templates, prepare_shards --chat, mask shards and the loader's -1 targets, the refusals
    run hellaswag build/test_hellaswag
    run mesh build/test_mesh
    run pipeline_schedule build/test_pipeline_schedule
    run layout build/test_layout  # the families' shapes and presets, every split and part of the parameter layout, the masks, a Llama model file
    run peft build/test_peft  # LoRA adapters as PEFT folders: round trips bitwise, the safetensors header and config, the refusals, the JSON reader
    run nf4 build/test_nf4  # QLoRA's NF4 storage bitwise against the NumPy reference (skipped without numpy), its error, bounds, bytes, refusals, speed
    run options build/test_options  # every flag's default, alias and range pinned; each range and validate_options' checks at their bounds
    run gpu_support build/test_gpu_support  # the refusal of GPUs below 8.0, the MFU peaks
    run adamw_cpu build/test_adamw_cpu  # the CPU AdamW (ZeRO-Offload's) against the kernel's arithmetic, its vector paths, its speed
    run checkpoints build/test_checkpoints  # committed checkpoints: manifests, resume's choice, retention, mixed files, the folder's lock
    run checkpoint_crash build/test_checkpoint_crash  # the save killed at every fault point, ranks as processes: no committed checkpoint lost or mixed
    run offload_dir build/test_offload_dir  # ZeRO-Offload's NVMe tier: AdamW through the optimizer file, bitwise; full disk, write errors, no O_DIRECT
    run stop_signals build/test_stop_signals  # SIGTERM/SIGINT/SIGUSR1 as stop requests, a second SIGINT, no EINTR anywhere
    run heartbeat build/test_heartbeat  # ranks as processes: a killed, stopped or failing one named and the others ended
    run fp8 build/test_fp8  # FP8 rounding (the host reference), scales from amaxes, the shapes the FP8 products take
    run launch bash test/test_launch.sh
    run cli bash test/test_cli.sh
    run repo bash test/test_repo.sh  # README's files table, the one error helper, docs/errors.md's flags, no history, scripts' imports
    run hf_files bash test/test_hf_interop.sh files  # Hugging Face folders written with NumPy (llama, qwen2, mistral) imported and exported bit for bit; their bad input
    run llama_reference bash test/test_llama_reference.sh  # the Llama-family PyTorch reference: its self-test, and against transformers (skipped without it)
    run commands bash test/test_commands.sh  # every command README and docs/ show: train_gpt's as dry runs, the scripts' as shown
    run fuzz bash test/test_fuzz.sh  # every parser of outside input under libFuzzer for 10 s, after replaying each crash it once found
    run sharding build/test_sharding
    run lora_files build/test_lora_files
    run formats build/test_formats
    run fp8_gpu build/test_fp8_gpu  # the FP8 cast, amax, products and the casts fused with LayerNorm and GELU on the GPU (skipped without one; its host checks run)
    run nf4_gpu build/test_nf4_gpu  # NF4 dequantization on the GPU to bf16 and fp32, bitwise model/nf4.h's; the fused 4-bit products against the dequantized weight's (skipped without one; its host checks run)
    fixture_rc=3  # not selected
    selected cpu_reference && { start=$SECONDS; fixture_out=$(bash test/tools/make_cpu_fixture.sh "$WORK/cpu_fixture" 2>&1); fixture_rc=$?
                                echo "# cpu_reference fixture (PyTorch on the CPU): $((SECONDS - start)) s" | tee -a "$LOG"; }
    if [ $fixture_rc -eq 3 ]; then :
    elif [ $fixture_rc -eq 0 ]; then
        run cpu_reference build/test_cpu_reference "$WORK/cpu_fixture/model.bin" "$WORK/cpu_fixture/debug_state.bin"
    elif [ $fixture_rc -eq 2 ]; then
        skip "cpu_reference vs PyTorch" "$(printf '%s' "$fixture_out" | tail -n 1)"
    else
        echo "FAIL cpu_reference fixture: $(printf '%s' "$fixture_out" | tail -n 1)" | tee -a "$LOG"
    fi

    lora_rc=3  # not selected
    # the CPU reference's LoRA: on a GPU machine a full-tier check (the GPU suites' quick tiers train and merge adapters
    # against PyTorch's merge); without a GPU the CPU checks are all there is, so every tier runs it
    { [ "$TEST_TIER" = full ] || [ "$gpu_count" -eq 0 ]; } && selected cpu_lora && { start=$SECONDS; lora_out=$(bash test/tools/make_cpu_fixture.sh --lora "$WORK/cpu_lora_fixture" 2>&1); lora_rc=$?
                                                   echo "# cpu_lora fixture (PyTorch on the CPU): $((SECONDS - start)) s" | tee -a "$LOG"; }
    if [ $lora_rc -eq 3 ]; then :
    elif [ $lora_rc -eq 0 ]; then
        run cpu_lora build/test_cpu_lora "$WORK/cpu_lora_fixture"
    elif [ $lora_rc -eq 2 ]; then
        skip "cpu_lora reference vs PyTorch" "$(printf '%s' "$lora_out" | tail -n 1)"
    else
        echo "FAIL cpu_lora fixture: $(printf '%s' "$lora_out" | tail -n 1)" | tee -a "$LOG"
    fi

}

# ---- GPU tests
# The GPU suites in two chains that share the GPU side by side (their models take a few GiB at most and leave most of
# it idle; no quick-tier check measures the GPU's memory or time), then on a machine with several GPUs the runs that
# need the GPUs to themselves. TEST_GPU_CHAINS=1 runs the chains one after the other.
gpu_chain_models() {
        run kernels build/test_kernels
        sdpa=""  # PyTorch SDPA outputs to compare the flash attention with, where torch with CUDA is at hand
        if ! selected attention; then :
        elif python3 test/tools/attention_vs_sdpa.py "$WORK/sdpa_ref.bin" > "$WORK/sdpa.log" 2>&1; then sdpa="$WORK/sdpa_ref.bin"
        else skip "attention vs PyTorch SDPA" "$(tail -n 1 "$WORK/sdpa.log")"; fi
        run attention build/test_attention $sdpa
        run model bash test/test_model.sh
        run fp8_model bash test/test_fp8_model.sh  # --precision fp8 against bf16: loss, gradients, steps, checkpoints across precisions
        run training bash test/test_training.sh
        run qlora bash test/test_qlora.sh  # --base-quant nf4: the loaded and initialised base against the NF4 reference, bitwise; its loss against the dequantized model's; QLoRA training and merge
        run chat_training bash test/test_chat_training.sh  # masked targets: all ones bitwise unmasked, uncounted tokens change nothing
        run sampling bash test/test_sampling.sh  # the KV cache against sampling without it, and transformers' greedy output
}
gpu_chain_ranks() {
        run checkpoint_resume bash test/test_checkpoint_resume.sh  # killed inside a save and resumed bitwise; LoRA resume and stop; exit 76; a folder's run
        run hf_interop bash test/test_hf_interop.sh transformers  # export to / import from Hugging Face transformers (skips without it)
        # scripts/train/finetune.sh end to end (full tier: it trains a stand-in model first): a Hugging Face folder
        # fine-tuned with LoRA (and fully), exported back, against transformers and PEFT; resumed; its refusals
        [ "$TEST_TIER" = full ] && run finetune bash test/test_finetune.sh
        run mesh_nccl bash test/test_mesh_nccl.sh  # the mesh's NCCL communicators, several ranks on one GPU
        run tensor_parallel bash test/test_tensor_parallel.sh  # tp ranks sharing one GPU
        run tensor_parallel_layers bash test/test_tensor_parallel_layers.sh  # split layers and gradients vs dense (ranks sharing one GPU)
        run pipeline bash test/test_pipeline.sh  # pipeline stages (and 3D) as ranks sharing one GPU
        # ZeRO on 2 ranks: one per GPU, or sharing GPU 0 on a machine with one (which skips the checks that need a GPU
        # per rank); the full tier also on 4 GPUs
        run "zero 2 ranks" bash test/test_zero.sh 2
}
gpu_suites() {
        if [ "${TEST_GPU_CHAINS:-2}" = 1 ]; then
            gpu_chain_models
            gpu_chain_ranks
        else
            (LOG=$WORK/gpu_chain_ranks.log; : > "$LOG"; gpu_chain_ranks) > "$WORK/gpu_chain_ranks.out" 2>&1 &
            local ranks_pid=$!
            gpu_chain_models
            wait $ranks_pid
            cat "$WORK/gpu_chain_ranks.out"
            cat "$WORK/gpu_chain_ranks.log" >> "$LOG"
        fi
        if [ "$TEST_TIER" = full ]; then
            if [ "$gpu_count" -ge 4 ]; then run "zero 4 GPUs" bash test/test_zero.sh 4; else skip "zero stages 0-3 on 4 GPUs" "$gpu_count GPU(s)"; fi
        fi
        # the full tier: the multi-rank suites again with one rank per GPU, for every run that has enough GPUs (the
        # others share GPU 0)
        if [ "$TEST_TIER" = full ] && [ "$gpu_count" -ge 2 ]; then
            export ONE_RANK_PER_GPU=1
            for suite in mesh_nccl tensor_parallel tensor_parallel_layers pipeline; do
                run "$suite on $gpu_count GPUs" bash -c 'set -o pipefail; bash "$0" | sed -E "s/^(PASS|FAIL|SKIP) [a-z0-9_]+ /&[one rank per GPU] /"' \
                    "test/test_$suite.sh"
            done
            unset ONE_RANK_PER_GPU
        elif [ "$TEST_TIER" = full ]; then
            for suite in mesh_nccl tensor_parallel tensor_parallel_layers pipeline; do skip "$suite with one rank per GPU" "$gpu_count GPU(s)"; done
        fi
}

# With a GPU the CPU suites run beside the GPU suites (they share no files; the GPU suites use few cores), their
# lines printed after the GPU suites' and their log appended to $LOG; without one, alone.
if [ "$gpu_count" -ge 1 ]; then
    cpu_out=$WORK/cpu_suites.out
    (LOG=$WORK/cpu_suites.log; : > "$LOG"; cpu_suites) > "$cpu_out" 2>&1 &
    cpu_pid=$!
    gpu_suites
    wait $cpu_pid
    cat "$cpu_out"
    cat "$WORK/cpu_suites.log" >> "$LOG"
else
    cpu_suites
        gpu_suites=("kernels vs CPU reference" "attention (flash) vs CPU reference and SDPA" "model vs PyTorch (fp32, bf16, fp16)" "fp8_model against bf16" "qlora NF4 base"
                    "training determinism, resume and curve parity" "chat_training with masked targets" "checkpoint_resume after a kill inside a save, LoRA resume" "hf_interop export to and import from Hugging Face"
                    "sampling with the KV cache against sampling without it" "mesh_nccl communicators" "tensor_parallel training" "tensor_parallel_layers vs dense" "pipeline and 3D"
                    "zero on 2 ranks")
        [ "$TEST_TIER" = full ] && gpu_suites+=("finetune recipe from a Hugging Face folder and back" "zero stages 0-3 on 4 GPUs")
        for t in "${gpu_suites[@]}"; do skip "$t" "no GPU"; done
fi

passed=$(grep -c '^PASS ' "$LOG"); failed=$(grep -c '^FAIL ' "$LOG"); skipped=$(grep -c '^SKIP ' "$LOG")
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
