#!/usr/bin/env bash
# Tensor parallelism layer by layer and gradient by gradient (build/test_tensor_parallel_layers, fp32): at 1, 2 and 4
# ranks sharing GPU 0 (scripts/launch.sh --one-gpu; with ONE_RANK_PER_GPU=1, one rank per GPU wherever the machine
# has enough; tp = the number of ranks), each split product against the
# dense one (relative L2 <= 1e-6) and the whole model's reassembled gradients, loss and logits against tp 1
# (1e-4, 1e-5, 1e-5). Prints the program's PASS/FAIL lines (rank 0's), and a FAIL line for a launch that exits
# non-zero without one or prints no check at all. The quick tier (TEST_TIER=quick) runs tp 2 only.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/tensor_parallel_layers
rm -rf "$W"; mkdir -p "$W"
source test/loss_logs.sh  # launch_mode
export NCCL_NVLS_ENABLE=0
for n in $([ "${TEST_TIER:-full}" = full ] && echo 1 2 4 || echo 2); do
    log="$W/tp$n.log"
    timeout 300 scripts/launch.sh $(launch_mode "$n") "$n" build/test_tensor_parallel_layers > "$log" 2>&1; rc=$?
    grep -E '^(PASS|FAIL) ' "$log"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$log"; then
        echo "FAIL tensor_parallel_layers tp $n: exit status $rc: $(grep -m 1 -i error "$log" || tail -n 1 "$log")"
    elif [ $rc -eq 0 ] && ! grep -q '^PASS ' "$log"; then
        echo "FAIL tensor_parallel_layers tp $n: exit status 0 but no check ran: $(tail -n 1 "$log")"
    fi
done
