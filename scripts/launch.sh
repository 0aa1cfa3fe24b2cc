#!/usr/bin/env bash
# Our launcher (no MPI needed): starts N processes of a command on this node, one per GPU, with the
# torchrun-style environment train_gpt reads (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
# If any process fails, the others are stopped and the launcher exits with its status.
#   scripts/launch.sh 4 ./train_gpt --zero-stage 2 ...
# Several nodes: run it on each node with NODE_RANK (0..NNODES-1), NNODES and the same MASTER_ADDR (an
# address of node 0 that the others reach) and MASTER_PORT, e.g. on two nodes of 8 GPUs:
#   node 0: NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 scripts/launch.sh 8 ./train_gpt ...
#   node 1: NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 scripts/launch.sh 8 ./train_gpt ...
# Several ranks on one GPU (tests of multi-rank code, e.g. tensor or pipeline parallelism, on a one-GPU
# machine): --one-gpu N starts N ranks that all use GPU 0 (LOCAL_RANK=0). NCCL refuses two ranks of one
# communicator on the same GPU unless each rank has its own NCCL_HOSTID: it then treats them as separate hosts
# and connects them over loopback sockets (NCCL_SOCKET_IFNAME=lo), so collectives are slow (a 64 MB
# all-reduce between two ranks takes ~40 ms on an H200) and the ranks share the GPU's memory. One node only.
#   scripts/launch.sh --one-gpu 4 ./train_gpt --model d6 ...   # rank r: LOCAL_RANK=0 NCCL_HOSTID=host<r>
set -u
usage="usage: $0 [--one-gpu] RANKS_PER_NODE COMMAND [ARGS...]"
one_gpu=0
if [ "${1:-}" = "--one-gpu" ]; then one_gpu=1; shift; fi
if [ $# -lt 2 ]; then echo "$usage" >&2; exit 2; fi
per_node=$1; shift
if ! [[ $per_node =~ ^[1-9][0-9]*$ ]]; then echo "launch.sh: the number of ranks must be a positive integer, not '$per_node'" >&2; echo "$usage" >&2; exit 2; fi
nodes=${NNODES:-1}; node=${NODE_RANK:-0}
if [ $one_gpu -eq 1 ] && [ "$nodes" -ne 1 ]; then echo "launch.sh: --one-gpu runs on one node (NNODES=$nodes)" >&2; exit 2; fi
export WORLD_SIZE=$((per_node * nodes))
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
export MASTER_PORT=${MASTER_PORT:-$((20000 + RANDOM % 12000))}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast off (see docs/parallel.md)
pids=()
for ((i = 0; i < per_node; i++)); do
    rank=$((node * per_node + i))
    if [ $one_gpu -eq 1 ]; then
        RANK=$rank LOCAL_RANK=0 NCCL_HOSTID=host$rank NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 "$@" &
    else
        RANK=$rank LOCAL_RANK=$i "$@" &
    fi
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
