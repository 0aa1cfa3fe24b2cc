#!/usr/bin/env bash
# The process mesh's communicators on one GPU (several ranks per GPU: scripts/launch.sh --one-gpu): for
# several shapes, every group's all-gather and all-reduce reach exactly its members in order
# (build/test_mesh_gpu); and a rank that leaves while its tensor-parallel partner waits on a collective
# ends the partner with a message, not a hang. Prints PASS/FAIL lines.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/mesh_gpu
rm -rf "$W"; mkdir -p "$W"

# ranks tp pp: tp innermost (2x2x2), middle pipeline stages without an embedding group (1x4x1, 2x3x1),
# a tensor group of 3 and data parallelism (3x1x2), and 8 ranks of pure data or pipeline parallelism.
for shape in "8 2 2" "4 1 4" "6 2 3" "6 3 1" "8 1 1" "8 1 8"; do
    set -- $shape
    log="$W/mesh_$1_$2_$3.log"
    timeout 300 scripts/launch.sh --one-gpu "$1" build/test_mesh_gpu "$2" "$3" > "$log" 2>&1; rc=$?
    grep -E '^(PASS|FAIL) ' "$log"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$log"; then
        echo "FAIL mesh communicators ($1 ranks, tp $2, pp $3): exit status $rc: $(grep -m 1 error "$log" || tail -n 1 "$log")"
    fi
done

# A peer that leaves: rank 0's wait on the tensor-parallel all-reduce must end it with NCCL's error found in
# the tensor-parallel communicator (seconds on one H200), before the deadline (--nccl-timeout 20 s in the test):
# a wait that polled only the world's communicator (unused here since the split) would end only at the deadline.
start=$SECONDS
timeout 120 scripts/launch.sh --one-gpu 2 build/test_mesh_gpu 2 1 --die > "$W/die.log" 2>&1; rc=$?
elapsed=$((SECONDS - start))
message=$(grep -m 1 "rank 0: " "$W/die.log")
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' "$message" | grep -q "NCCL failed .* in the tensor-parallel communicator"; then
    echo "PASS mesh: a peer that left ends its tensor-parallel partner in ${elapsed} s with: ${message#error: }"
else
    echo "FAIL mesh: after a peer left, rank 0 exited $rc after ${elapsed} s: $(tail -n 2 "$W/die.log" | tr '\n' ' ')"
fi
