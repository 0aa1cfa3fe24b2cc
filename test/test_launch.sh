#!/usr/bin/env bash
# scripts/launch.sh without a GPU: the environment each rank gets (one rank per GPU, and --one-gpu's several
# ranks on GPU 0, each its own NCCL host over loopback), a failing rank stopping the others, and bad usage.
# Prints one PASS/FAIL line per check.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/launch
rm -rf "$W"; mkdir -p "$W"

# check NAME CONDITION-STATUS DETAIL
check() { if [ "$2" -eq 0 ]; then echo "PASS launch $1"; else echo "FAIL launch $1: $3"; fi; }

# value FILE NAME: the value of NAME in an `env` dump ("<unset>" when absent)
value() { local line; line=$(grep -m 1 "^$2=" "$1") && printf '%s' "${line#*=}" || printf '<unset>'; }

# expect_env NAME DIR N MODE: the N env dumps in DIR hold the expected RANK, WORLD_SIZE, LOCAL_RANK, NCCL_HOSTID...
expect_env() {
    local name=$1 dir=$2 n=$3 mode=$4 bad="" r port0="" f
    for ((r = 0; r < n; r++)); do
        f=$dir/env.$r
        if [ ! -f "$f" ]; then bad="$bad rank $r did not run;"; continue; fi
        local want_local=$r want_host="<unset>" want_ifname="<unset>"
        if [ "$mode" = one-gpu ]; then want_local=0; want_host=host$r; want_ifname=lo; fi
        [ "$(value "$f" RANK)" = "$r" ] || bad="$bad rank $r: RANK=$(value "$f" RANK);"
        [ "$(value "$f" WORLD_SIZE)" = "$n" ] || bad="$bad rank $r: WORLD_SIZE=$(value "$f" WORLD_SIZE);"
        [ "$(value "$f" LOCAL_RANK)" = "$want_local" ] || bad="$bad rank $r: LOCAL_RANK=$(value "$f" LOCAL_RANK) (want $want_local);"
        [ "$(value "$f" NCCL_HOSTID)" = "$want_host" ] || bad="$bad rank $r: NCCL_HOSTID=$(value "$f" NCCL_HOSTID) (want $want_host);"
        [ "$(value "$f" NCCL_SOCKET_IFNAME)" = "$want_ifname" ] || bad="$bad rank $r: NCCL_SOCKET_IFNAME=$(value "$f" NCCL_SOCKET_IFNAME);"
        [ "$(value "$f" NCCL_NVLS_ENABLE)" = 0 ] || bad="$bad rank $r: NCCL_NVLS_ENABLE=$(value "$f" NCCL_NVLS_ENABLE);"
        [ "$(value "$f" MASTER_ADDR)" = 127.0.0.1 ] || bad="$bad rank $r: MASTER_ADDR=$(value "$f" MASTER_ADDR);"
        [ -n "$port0" ] || port0=$(value "$f" MASTER_PORT)
        [ "$(value "$f" MASTER_PORT)" = "$port0" ] && [ "$port0" != "<unset>" ] || bad="$bad rank $r: MASTER_PORT=$(value "$f" MASTER_PORT);"
    done
    [ -z "$bad" ]; check "$name" $? "$bad"
}

# The launcher's own settings must come from it, not from the caller's environment.
unset RANK WORLD_SIZE LOCAL_RANK NCCL_HOSTID NCCL_SOCKET_IFNAME NCCL_NVLS_ENABLE MASTER_ADDR MASTER_PORT NNODES NODE_RANK

mkdir -p "$W/one_gpu"
scripts/launch.sh --one-gpu 3 sh -c 'env > "$0/env.$RANK"' "$W/one_gpu"; rc=$?
check "--one-gpu 3 exits 0" $rc "exit status $rc"
expect_env "--one-gpu 3: RANK 0-2, LOCAL_RANK 0, NCCL_HOSTID host<rank>, loopback sockets, NVLS off" "$W/one_gpu" 3 one-gpu

mkdir -p "$W/per_gpu"
scripts/launch.sh 2 sh -c 'env > "$0/env.$RANK"' "$W/per_gpu"; rc=$?
check "2 ranks exit 0" $rc "exit status $rc"
expect_env "2 ranks, one per GPU: LOCAL_RANK = RANK, no NCCL_HOSTID" "$W/per_gpu" 2 per-gpu

# A rank that fails stops the others (rank 1 would sleep for a minute), and its status is the launcher's.
start=$SECONDS
scripts/launch.sh --one-gpu 2 sh -c 'if [ "$RANK" = 0 ]; then exit 3; else exec sleep 60; fi' 2> "$W/fail.err"; rc=$?
elapsed=$((SECONDS - start))
[ $rc -eq 3 ] && [ $elapsed -lt 30 ] && grep -q "status 3" "$W/fail.err"
check "a failing rank stops the others and sets the exit status" $? "exit status $rc after ${elapsed}s, stderr: $(cat "$W/fail.err")"

# Bad usage: no count, a count that is not a positive number, --one-gpu on several nodes.
for args in "--one-gpu" "--one-gpu 0 true" "two true" "--one-gpu -1 true"; do
    err=$(scripts/launch.sh $args 2>&1 > /dev/null); rc=$?
    [ $rc -eq 2 ] && printf '%s' "$err" | grep -q usage
    check "usage error for '$args'" $? "exit status $rc, stderr: $err"
done
err=$(NNODES=2 NODE_RANK=0 scripts/launch.sh --one-gpu 2 true 2>&1 > /dev/null); rc=$?
[ $rc -eq 2 ] && printf '%s' "$err" | grep -q -- "--one-gpu runs on one node"
check "--one-gpu refuses several nodes" $? "exit status $rc, stderr: $err"
