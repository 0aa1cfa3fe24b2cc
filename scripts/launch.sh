#!/usr/bin/env bash
# Our launcher (no MPI needed): starts N processes of a command on this node, one per GPU, with the
# torchrun-style environment train_gpt reads (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
# If any process fails, the others are stopped and the launcher exits with its status (below).
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
# Signals: SIGTERM, SIGINT, SIGUSR1 and SIGHUP sent to the launcher (Slurm's `--signal=B:USR1@120`, `scancel
# --signal`, Ctrl-C, a closed terminal) go to every rank. On the first three train_gpt's ranks stop after the same
# step, commit that step's checkpoint and exit 75 (76 without --output-dir: nothing saved; docs/reliability.md), and a
# second Ctrl-C stops them at once; SIGHUP ends them. Each rank runs under setsid, out of the terminal's process
# group, so that a terminal's signals reach it once, through the launcher. A process that exits with 75 or 76 (stopped
# by a signal) is no failure: the others stop at the same step. When a process fails (any other non-zero status) the
# others get SIGTERM, and SIGCONT for one stopped with SIGSTOP; any still running LAUNCH_KILL_AFTER seconds later
# (default 30) gets SIGKILL.
# Exit status: the first status other than 0, 75 and 76 that the launcher sees (a failure, whatever the others did);
# else 0 when every process exited 0; 75 when every one exited 75 (a rank exits 75 only once the checkpoint of its
# step committed: requeue with --resume 1); 76 when every one stopped and some saved nothing; else 1, with a line
# saying so (some finished and some stopped: the processes did not stop after the same step).
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
kill_after=${LAUNCH_KILL_AFTER:-30}
if ! [[ $kill_after =~ ^[0-9]+$ ]]; then echo "launch.sh: LAUNCH_KILL_AFTER must be a number of seconds, not '$kill_after'" >&2; exit 2; fi
stopped=75    # a rank stopped by a signal, once its checkpoint committed (train_gpt's kExitStopped)
unsaved=76    # a rank stopped by a signal without a checkpoint (train_gpt's kExitStoppedUnsaved)
# The signals are taken before the ranks start: one that arrives while they start is kept and forwarded to all of
# them once they are (a rank could miss it otherwise, or the launcher die of it).
pids=(); started=0; pending=()
signalled=0  # a trap ran: a `wait` it interrupted must be repeated
forward() { signalled=1; if [ $started -eq 1 ]; then kill -s "$1" "${pids[@]}" 2> /dev/null; else pending+=("$1"); fi; }
for sig in TERM INT USR1 HUP; do trap "forward $sig" $sig; done
for ((i = 0; i < per_node; i++)); do
    rank=$((node * per_node + i))
    # a background command of a script starts with SIGINT ignored: restored (and the launcher's traps dropped), so
    # that a forwarded Ctrl-C counts
    if [ $one_gpu -eq 1 ]; then
        (trap - TERM INT USR1 HUP; RANK=$rank LOCAL_RANK=0 NCCL_HOSTID=host$rank NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 exec setsid "$@") &
    else
        (trap - TERM INT USR1 HUP; RANK=$rank LOCAL_RANK=$i exec setsid "$@") &
    fi
    pids+=($!)
done
started=1
for sig in "${pending[@]}"; do kill -s "$sig" "${pids[@]}" 2> /dev/null; done

# Polls rather than `wait -n`: a rank stopped with SIGSTOP must not block the launcher, which must go on forwarding
# signals and escalating after a failure.
failed=""; finished=0; stops=0; unsaved_stops=0; running=$per_node; kill_at=""; killed=0
ended=()
while [ $running -gt 0 ]; do
    for i in "${!pids[@]}"; do
        [ -n "${ended[$i]:-}" ] && continue
        kill -0 "${pids[$i]}" 2> /dev/null && continue
        while :; do signalled=0; wait "${pids[$i]}"; rc=$?; [ $signalled -eq 0 ] && break; done
        ended[$i]=1; running=$((running - 1))
        [ $rc -eq 0 ] && { finished=$((finished + 1)); continue; }
        [ $rc -eq $stopped ] && { stops=$((stops + 1)); continue; }
        [ $rc -eq $unsaved ] && { stops=$((stops + 1)); unsaved_stops=$((unsaved_stops + 1)); continue; }
        [ -n "$failed" ] || failed=$rc
        if [ -z "$kill_at" ]; then
            echo "launch.sh: a process exited with status $rc; stopping the others" >&2
            kill -TERM "${pids[@]}" 2> /dev/null; kill -CONT "${pids[@]}" 2> /dev/null
            kill_at=$((SECONDS + kill_after))
        fi
    done
    if [ -n "$kill_at" ] && [ $killed -eq 0 ] && [ $running -gt 0 ] && [ $SECONDS -ge "$kill_at" ]; then
        echo "launch.sh: $running process(es) still running ${kill_after} s after the failure: SIGKILL" >&2
        for i in "${!pids[@]}"; do [ -n "${ended[$i]:-}" ] || kill -KILL "${pids[$i]}" 2> /dev/null; done
        killed=1
    fi
    [ $running -gt 0 ] && sleep 0.2
done
[ -n "$failed" ] && exit "$failed"
[ $stops -eq 0 ] && exit 0
[ $finished -eq 0 ] && [ $unsaved_stops -gt 0 ] && exit $unsaved
[ $finished -eq 0 ] && exit $stopped
echo "launch.sh: $stops process(es) stopped after a step (exit $stopped or $unsaved) but $finished exited 0 (finished): they did not" \
    "stop after the same step; exit status 1" >&2
exit 1
