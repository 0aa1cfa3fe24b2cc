#!/usr/bin/env bash
# Our launcher (no MPI needed): starts N processes of a command on this node, one per GPU, with the
# torchrun-style environment train_gpt reads (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
# If any process fails, the others are stopped and the launcher exits with its status.
#   scripts/launch.sh 4 ./train_gpt --zero-stage 2 ...
# Several nodes: run it on each node with NODE_RANK (0..NNODES-1), NNODES and the same MASTER_ADDR (an
# address of node 0 that the others reach) and MASTER_PORT, e.g. on two nodes of 8 GPUs:
#   node 0: NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 scripts/launch.sh 8 ./train_gpt ...
#   node 1: NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 scripts/launch.sh 8 ./train_gpt ...
set -u
if [ $# -lt 2 ]; then echo "usage: $0 GPUS_PER_NODE COMMAND [ARGS...]" >&2; exit 2; fi
per_node=$1; shift
nodes=${NNODES:-1}; node=${NODE_RANK:-0}
export WORLD_SIZE=$((per_node * nodes))
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
export MASTER_PORT=${MASTER_PORT:-$((20000 + RANDOM % 12000))}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast off (see README)
pids=()
for ((i = 0; i < per_node; i++)); do
    RANK=$((node * per_node + i)) LOCAL_RANK=$i "$@" &
    pids+=($!)
done
status=0
for ((i = 0; i < per_node; i++)); do
    wait -n; rc=$?
    if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
        status=$rc
        echo "launch.sh: a process exited with status $rc; stopping the others" >&2
        kill "${pids[@]}" 2> /dev/null
    fi
done
exit $status
