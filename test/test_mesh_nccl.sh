#!/usr/bin/env bash
# The process mesh's communicators on one GPU (several ranks per GPU: scripts/launch.sh --one-gpu; with
# ONE_RANK_PER_GPU=1, one rank per GPU wherever the machine has enough, test/loss_logs.sh): for
# several shapes, every group's all-gather and all-reduce reach exactly its members in order
# (build/test_mesh_nccl); a rank that leaves while its tensor-parallel partner waits on a collective
# ends the partner with a message, not a hang; training ranks started by hand (as srun starts them) of which one
# is killed or stopped (SIGSTOP) end with a line naming it (also under mpirun, and in a 3D run: tp 2 x pp 2 x dp 2);
# and a stop signal to one rank of a 3D run stops all 8 after the same step. Prints PASS/FAIL lines. The quick tier
# (TEST_TIER=quick) checks the communicators of one shape, the 3D one (tp 2 x pp 2 x dp 2), the peer that leaves
# and a killed rank of 3 (ended in seconds; a stopped one waits out --nccl-timeout, and test_heartbeat checks silence
# on the CPU); the rest, the stopped ranks included, only in the full tier.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/mesh_nccl
rm -rf "$W"; mkdir -p "$W"
source test/loss_logs.sh  # launch_mode, spreads
TIER=${TEST_TIER:-full}

# ranks tp pp: tp innermost (2x2x2), middle pipeline stages without an embedding group (1x4x1, 2x3x1),
# a tensor group of 3 and data parallelism (3x1x2), and 8 ranks of pure data or pipeline parallelism.
shapes=("8 2 2")
[ "$TIER" = full ] && shapes+=("4 1 4" "6 2 3" "6 3 1" "8 1 1" "8 1 8")
for shape in "${shapes[@]}"; do
    set -- $shape
    log="$W/mesh_$1_$2_$3.log"
    timeout 300 scripts/launch.sh $(launch_mode "$1") "$1" build/test_mesh_nccl "$2" "$3" > "$log" 2>&1; rc=$?
    grep -E '^(PASS|FAIL) ' "$log"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$log"; then
        echo "FAIL mesh_nccl communicators ($1 ranks, tp $2, pp $3): exit status $rc: $(grep -m 1 error "$log" || tail -n 1 "$log")"
    fi
done

# A peer that leaves: rank 0's wait on the tensor-parallel all-reduce must end it with NCCL's error found in
# the tensor-parallel communicator (seconds on one H200), before the deadline (--nccl-timeout 20 s in the test):
# a wait that polled only the world's communicator (unused here since the split) would end only at the deadline.
start=$SECONDS
timeout 120 scripts/launch.sh $(launch_mode 2) 2 build/test_mesh_nccl 2 1 --die > "$W/die.log" 2>&1; rc=$?
elapsed=$((SECONDS - start))
message=$(grep -m 1 "rank 0: " "$W/die.log")
# With one rank per GPU, NCCL's peer-to-peer transport (NVLink) reports no error when a peer leaves (two H200s,
# 2026-11: rank 0 ends at the deadline, 23 s), so there the deadline's message within 35 s passes; the
# communicator polling is checked by the run that shares a GPU (socket transport). Rank 1 ends normally, so the
# heartbeats know of no problem and cannot end rank 0 first; rank 0 gives them 3 s to name one before its message.
expected="NCCL failed .* in the tensor-parallel communicator"
spreads 2 && [ $elapsed -le 35 ] && expected="$expected|a collective did not finish within 20 s"
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' "$message" | grep -qE "$expected"; then
    echo "PASS mesh_nccl a peer that left ends its tensor-parallel partner in ${elapsed} s with: ${message#error: }"
else
    echo "FAIL mesh_nccl after a peer left, rank 0 exited $rc after ${elapsed} s: $(tail -n 2 "$W/die.log" | tr '\n' ' ')"
fi

# Ranks started by hand, as srun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; no launcher to
# stop the others), training a small model. A rank killed with -9 or stopped with SIGSTOP must end every other rank
# within --nccl-timeout + 10 s, exit status 1, with one line naming it (the heartbeats, distributed/heartbeat.h); a
# stopped rank, continued once the others ended, ends within 15 s; no process is left. The measured times are
# printed. Quick tier: a killed rank of 3; full tier: also a stopped one and a stopped rank 0, a rank killed in a 3D
# run (tp 2 x pp 2 x dp 2, 8 ranks), the same under mpirun (a build with MPI, a GPU per rank), and a stop signal to one
# rank of the 3D run.
TRAIN="data/tinyshakespeare/tinyshakespeare_train_*.bin"
[ -n "$(ls $TRAIN 2>/dev/null)" ] || bash scripts/data/prepare_tinyshakespeare.sh > "$W/prepare.log" 2>&1
if [ -z "$(ls $TRAIN 2>/dev/null)" ]; then
    echo "FAIL mesh_nccl ranks started by hand: no training data ($(tail -n 1 "$W/prepare.log"))"
    exit 1
fi
SMALL=(--layers 4 --heads 2 --channels 128 --max-seq-len 128 --seq-len 128 --train-data "$TRAIN" --val-every 0 --sample-every 0 --batch-size 2)
DP3=("${SMALL[@]}" --total-batch-tokens $((2 * 128 * 3)) --steps 1000000)
DP2=("${SMALL[@]}" --total-batch-tokens $((2 * 128 * 2)) --steps 1000000)
THREE_D=("${SMALL[@]}" --total-batch-tokens 2048 --tensor-parallel 2 --pipeline-parallel 2 --zero-stage 1)

# start_by_hand NAME WORLD ARGS...: WORLD ranks of train_gpt ARGS, output in $W/NAME_RANK.out, pids in `pids`; one rank
# per GPU where the machine has enough, 8 ranks on four GPUs as two nodes of four, else all on GPU 0 (each rank its own
# NCCL host, over loopback); `placement` says which
start_by_hand() {
    local name=$1 world=$2; shift 2
    local r place port=$((20000 + RANDOM % 12000))
    pids=()
    for ((r = 0; r < world; r++)); do
        if spreads "$world"; then place=(LOCAL_RANK=$r); placement="one rank per GPU"
        elif [ "$world" -eq 8 ] && spreads 4; then place=(LOCAL_RANK=$((r % 4)) NCCL_HOSTID=node$((r / 4)) NCCL_SOCKET_IFNAME=lo); placement="two nodes of 4 GPUs"
        else place=(LOCAL_RANK=0 NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo); placement="all on GPU 0"; fi
        env RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${place[@]}" NCCL_NVLS_ENABLE=0 ./train_gpt "$@" \
            > "$W/${name}_$r.out" 2>&1 &
        pids+=($!)
    done
}
# wait_for_step FILE N: until FILE holds step N's line (or 300 s)
wait_for_step() { for _ in $(seq 30000); do grep -qF "$(printf 'step %5d/' "$2")" "$1" && return; sleep 0.01; done; }
# within SECONDS PID: waits for PID (a child of this shell) up to SECONDS; sets rc (124 when it had not ended)
within() {
    local limit=$((SECONDS + $1))
    while kill -0 "$2" 2> /dev/null && [ $SECONDS -lt $limit ]; do sleep 0.1; done
    if kill -0 "$2" 2> /dev/null; then rc=124; else wait "$2"; rc=$?; fi
}

# lose_rank NAME WORLD VICTIM kill|stop TIMEOUT ARGS...: WORLD ranks by hand; once rank 0 logged step 3, VICTIM is
# killed with -9 or stopped with SIGSTOP; the checks above, one line
lose_rank() {
    local name=$1 world=$2 victim=$3 how=$4 timeout=$5; shift 5
    start_by_hand "$name" "$world" "$@" --nccl-timeout "$timeout"
    wait_for_step "$W/${name}_0.out" 3
    if [ "$how" = kill ]; then kill -KILL "${pids[$victim]}"; else kill -STOP "${pids[$victim]}"; fi
    local start=$SECONDS r t worst=0 bad="" expected="rank $victim was lost" what="a rank killed with -9" after=""
    [ "$how" = stop ] && expected="rank $victim is silent" && what="a rank stopped with SIGSTOP"
    for ((r = 0; r < world; r++)); do
        [ $r -eq "$victim" ] && continue
        within $((timeout + 60 - (SECONDS - start))) "${pids[$r]}"
        t=$((SECONDS - start)); [ $t -gt $worst ] && worst=$t
        if [ $rc -ne 1 ] || [ "$(grep -c '^error: ' "$W/${name}_$r.out")" -ne 1 ] || ! grep -q "^error: rank $r: .*$expected" "$W/${name}_$r.out"; then
            bad="$bad rank $r (exit $rc after $t s: $(grep -m1 '^error' "$W/${name}_$r.out" || tail -n 1 "$W/${name}_$r.out"));"
        fi
    done
    if [ "$how" = stop ]; then
        local continued=$SECONDS
        kill -CONT "${pids[$victim]}"
        within 15 "${pids[$victim]}"
        after=", the stopped rank $((SECONDS - continued)) s after SIGCONT"
        [ $rc -ne 0 ] && [ $rc -ne 124 ] || bad="$bad rank $victim after SIGCONT: exit $rc after $((SECONDS - continued)) s;"
    else
        wait "${pids[$victim]}" 2> /dev/null
    fi
    local p left=""
    for p in "${pids[@]}"; do kill -0 "$p" 2> /dev/null && left="$left $p"; done
    for p in $left; do kill -KILL "$p"; kill -CONT "$p"; done 2> /dev/null
    if [ -z "$bad" ] && [ -z "$left" ] && [ $worst -le $((timeout + 10)) ]; then
        echo "PASS mesh_nccl $what ($world ranks by hand, $placement, rank $victim): the others ended in ${worst} s (--nccl-timeout $timeout)$after, none left, e.g. $(grep -h '^error' "$W/${name}"_*.out | head -n 1)"
    else
        echo "FAIL mesh_nccl $what ($world ranks by hand, $placement, rank $victim): the last ended after ${worst} s (--nccl-timeout $timeout);$bad${left:+ left:$left}"
    fi
}
lose_rank kill1 3 1 kill 15 "${DP3[@]}"
[ "$TIER" = full ] || exit 0
lose_rank stop1 3 1 stop 15 "${DP3[@]}"
lose_rank stop0 3 0 stop 15 "${DP3[@]}"
# 3D: rank 5 is tp 1, pp 0, dp 1
lose_rank kill3d 8 5 kill 30 "${THREE_D[@]}" --steps 1000000

# mpirun: the same for a killed and a stopped rank (rank 1 of 2). mpirun may end the job itself once it sees a rank
# gone, so its own report naming rank 1 counts too; a rank it leaves stopped is continued as above.
# mpi_rank_pid ROOT RANK: the train_gpt process of MPI rank RANK among ROOT's descendants (from its environment)
mpi_rank_pid() {
    local todo=("$1") p
    while [ ${#todo[@]} -gt 0 ]; do
        p=${todo[0]}; todo=("${todo[@]:1}")
        if [ "$(cat /proc/$p/comm 2> /dev/null)" = train_gpt ] &&
            tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qxE "(OMPI_COMM_WORLD_RANK|PMIX_RANK|PMI_RANK)=$2"; then echo "$p"; return; fi
        todo+=($(ps -o pid= --ppid "$p"))
    done
}
if ! command -v mpirun > /dev/null || ! ldd ./train_gpt | grep -q libmpi; then
    echo "SKIP mesh_nccl mpirun, a killed or stopped rank: train_gpt built without MPI"
elif ! spreads 2; then
    echo "SKIP mesh_nccl mpirun, a killed or stopped rank: needs a GPU per rank (2; ONE_RANK_PER_GPU=1 on a machine with them)"
else
    for how in kill stop; do
        mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE=0 ./train_gpt "${DP2[@]}" --nccl-timeout 15 > "$W/mpi_$how.out" 2>&1 & launcher=$!
        wait_for_step "$W/mpi_$how.out" 3
        victim=$(mpi_rank_pid $launcher 1); rank0=$(mpi_rank_pid $launcher 0)
        if [ -z "$victim" ] || [ -z "$rank0" ]; then
            echo "FAIL mesh_nccl mpirun $how: no train_gpt process of rank 1 and 0 under mpirun ($launcher)"
            kill -KILL $launcher 2> /dev/null; continue
        fi
        start=$SECONDS
        if [ $how = kill ]; then kill -KILL "$victim"; else kill -STOP "$victim"; fi
        within 75 $launcher; t=$((SECONDS - start))
        kill -CONT "$victim" 2> /dev/null
        for _ in $(seq 150); do kill -0 "$victim" 2> /dev/null || kill -0 "$rank0" 2> /dev/null || break; sleep 0.1; done
        left=$(for p in "$victim" "$rank0"; do kill -0 "$p" 2> /dev/null && echo "$p"; done)
        for p in $left; do kill -KILL "$p"; done 2> /dev/null
        named=$(grep -m1 -E "rank 1 (was lost|is silent)|rank 1 .*(exited|signal)" "$W/mpi_$how.out")
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $t -le 25 ] && [ -n "$named" ] && [ -z "$left" ]; then
            echo "PASS mesh_nccl mpirun, rank 1 of 2 $([ $how = kill ] && echo killed with -9 || echo stopped with SIGSTOP): the job ended in ${t} s (--nccl-timeout 15), none left: $named"
        else
            echo "FAIL mesh_nccl mpirun, rank 1 $how: exit $rc after ${t} s, left: ${left:-none}: $(tail -n 2 "$W/mpi_$how.out" | tr '\n' ' ')"
        fi
    done
fi

# A stop signal to one rank of the 3D run (rank 5: tp 1, pp 0, dp 1, once rank 0 logged step 3): the losses' gathering
# carries its vote over the data-parallel and pipeline groups, the gradient norm's reduction over the tensor-parallel
# one, so all 8 ranks stop after the same step (the checkpoint's save is collective) with exit status 75.
start_by_hand stop3d 8 "${THREE_D[@]}" --steps 1000000 --nccl-timeout 60 -o "$W/stop3d"
wait_for_step "$W/stop3d_0.out" 3
kill -TERM "${pids[5]}"
statuses=""
for p in "${pids[@]}"; do within 120 "$p"; statuses="$statuses $rc"; done
for p in "${pids[@]}"; do kill -KILL "$p" 2> /dev/null; done
line=$(grep -m1 '^stopped by' "$W/stop3d_0.out")
at=$(printf '%s' "$line" | sed -nE 's|^stopped by a signal to another rank after step ([0-9]+)/[0-9]+: committed checkpoint .*|\1|p')
if [ "$statuses" = "$(printf ' 75%.0s' $(seq 8))" ] && [ -n "$at" ] && [ -f "$W/stop3d/model_$(printf %08d "$at").bin" ] &&
    grep -q "^SIGTERM: stopping after the current step" "$W/stop3d_5.out"; then
    echo "PASS mesh_nccl SIGTERM to rank 5 of a 3D run ($placement): all 8 ranks stop after step $at with exit status 75: $line"
else
    echo "FAIL mesh_nccl SIGTERM to rank 5 of a 3D run ($placement): exit statuses$statuses, '${line:-no stop line}' $(grep -h -m1 '^error' "$W"/stop3d_*.out | head -n 1)"
fi
