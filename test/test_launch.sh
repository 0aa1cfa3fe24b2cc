#!/usr/bin/env bash
# scripts/launch.sh without a GPU: the environment each rank gets (one rank per GPU, and --one-gpu's several
# ranks on GPU 0, each its own NCCL host over loopback), a failing rank stopping the others (also one stopped with
# SIGSTOP, and one deaf to SIGTERM), the launcher's exit status from the ranks' (75 only when every rank stopped
# with 75), the signals it forwards to the ranks, and bad usage.
# Prints one PASS/FAIL line per check.
set -u
cd "$(dirname "$0")/.."
source test/watchdog.sh  # watchdog, watchdog_off
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

# The launcher's status from its ranks' (3 ranks, each exiting with the status its RANK picks): 75 only when every
# rank exited 75; the first failure whatever the others did (also one after the others' 75, and one whose SIGTERM
# makes the others exit 75, as train_gpt's ranks do); 0 when all finished; 76 when all stopped and some saved nothing;
# 1 with a line when some finished and some stopped. status_case NAME WANT STDERR-PATTERN SCRIPT (sh, with $RANK)
status_case() {
    local name=$1 want=$2 pattern=$3 script=$4 rc err
    err=$(timeout 30 scripts/launch.sh --one-gpu 3 sh -c "$script" 2>&1 > /dev/null); rc=$?
    [ $rc -eq "$want" ] && { [ -z "$pattern" ] || printf '%s' "$err" | grep -q -- "$pattern"; }
    check "exit status $want: $name" $? "exit status $rc, stderr: $err"
}
status_case "every rank exited 75 (stopped with a checkpoint)" 75 "" 'exit 75'
status_case "every rank exited 0" 0 "" 'exit 0'
status_case "rank 1 failed with 1 and the others, stopped by the launcher's SIGTERM, exited 75" 1 "status 1" \
    'if [ "$RANK" = 1 ]; then exit 1; fi; trap "exit 75" TERM; for _ in $(seq 200); do sleep 0.1; done; exit 0'
status_case "rank 0 failed with 1 after the others exited 75" 1 "status 1" 'if [ "$RANK" = 0 ]; then sleep 1; exit 1; fi; exit 75'
status_case "rank 0 exited 0 and the others 75: the ranks disagree on the step" 1 "did not stop after the same step" \
    'if [ "$RANK" = 0 ]; then exit 0; fi; exit 75'
status_case "every rank exited 76 (stopped, nothing saved): no failure, 76" 76 "" 'exit 76'
status_case "rank 2 exited 76 and the others 75: not every rank committed, 76" 76 "" 'if [ "$RANK" = 2 ]; then exit 76; fi; exit 75'

# Signals sent to the launcher reach every rank once. A test rank records each signal it gets in $DIR/got.RANK and
# exits with $EXIT_CODE after $EXIT_AFTER of them. The launcher starts under setsid, as a process group of its own,
# so that a signal to its process group is what a terminal's Ctrl-C sends.
cat > "$W/rank.sh" <<'SH'
n=0
on() { echo "$1" >> "$DIR/got.$RANK"; n=$((n + 1)); [ "$n" -ge "$EXIT_AFTER" ] && exit "$EXIT_CODE"; }
trap 'on TERM' TERM; trap 'on INT' INT; trap 'on USR1' USR1
echo $$ > "$DIR/pid.$RANK"
while :; do sleep 0.1; done
SH
# signal_run NAME EXIT_AFTER EXIT_CODE SIGNAL...: starts 2 ranks, sends each SIGNAL (TERM, or -INT: to the
# launcher's process group) 0.5 s apart once both ranks run; sets rc, got0, got1 (the signals each rank got, one
# line), elapsed
signal_run() {
    local name=$1 after=$2 code=$3; shift 3
    local dir=$W/$name launcher _ sig
    mkdir -p "$dir"
    # SIGINT restored: a script starts its background commands with it ignored, a terminal its foreground ones not
    (trap - INT; DIR=$dir EXIT_AFTER=$after EXIT_CODE=$code exec setsid scripts/launch.sh --one-gpu 2 sh "$W/rank.sh" 2> "$dir/err") & launcher=$!
    for _ in $(seq 100); do [ -f "$dir/pid.0" ] && [ -f "$dir/pid.1" ] && break; sleep 0.1; done
    local start=$SECONDS
    for sig in "$@"; do
        if [ "${sig#-}" != "$sig" ]; then kill -s "${sig#-}" -- "-$launcher"; else kill -s "$sig" "$launcher"; fi
        sleep 0.5
    done
    watchdog 20 "$launcher" $(cat "$dir"/pid.* 2> /dev/null)
    wait "$launcher"; rc=$?
    elapsed=$((SECONDS - start))
    watchdog_off
    got0=$(tr '\n' ' ' < "$dir/got.0" 2> /dev/null); got1=$(tr '\n' ' ' < "$dir/got.1" 2> /dev/null)
}
signal_run term 1 75 TERM
[ $rc -eq 75 ] && [ "$got0" = "TERM " ] && [ "$got1" = "TERM " ]
check "SIGTERM to the launcher reaches each rank once; their status 75 (stopped) is the launcher's" $? "exit $rc, rank 0 got '$got0', rank 1 '$got1'"
signal_run usr1 1 75 USR1
[ $rc -eq 75 ] && [ "$got0" = "USR1 " ] && [ "$got1" = "USR1 " ]
check "SIGUSR1 (Slurm's --signal=B:USR1@120) reaches each rank once" $? "exit $rc, rank 0 got '$got0', rank 1 '$got1'"
# A shell started with SIGINT ignored (a background command of a script, nohup) can neither trap nor restore it, so
# neither the launcher nor the test's shell ranks could see a Ctrl-C there (train_gpt's ranks install their handlers
# themselves): SigIgn's bit 1 is SIGINT.
sigint_ignored=$(awk '/^SigIgn:/ { print $2 }' /proc/$$/status 2> /dev/null)
if [ -n "$sigint_ignored" ] && (( (16#$sigint_ignored >> 1) & 1 )); then
    echo "SKIP launch Ctrl-C twice, then SIGTERM: this shell was started with SIGINT ignored (in the background), which no shell can undo"
else
    signal_run ctrl_c 3 130 -INT -INT TERM
    [ $rc -eq 130 ] && [ "$got0" = "INT INT TERM " ] && [ "$got1" = "INT INT TERM " ]
    check "Ctrl-C twice (SIGINT to the launcher's process group), then SIGTERM: each rank gets each once, through the launcher" $? \
        "exit $rc, rank 0 got '$got0', rank 1 '$got1'"
fi

# A rank stopped with SIGSTOP while another fails: SIGTERM and SIGCONT end it, nothing is left behind.
start=$SECONDS
scripts/launch.sh --one-gpu 2 sh -c 'echo $$ > "$0/stop.pid.$RANK"; if [ "$RANK" = 0 ]; then kill -STOP $$; exec sleep 60; else sleep 1; exit 3; fi' "$W" \
    2> "$W/stop.err" & launcher=$!
watchdog 30 $launcher $(cat "$W"/stop.pid.* 2> /dev/null)
wait $launcher; rc=$?
elapsed=$((SECONDS - start)); watchdog_off
left=$(for f in "$W"/stop.pid.*; do kill -0 "$(cat "$f")" 2> /dev/null && echo "$f"; done)
[ $rc -eq 3 ] && [ $elapsed -lt 10 ] && [ -z "$left" ]
check "a rank stopped with SIGSTOP ends once another fails (SIGTERM, SIGCONT): exit 3 after ${elapsed} s, none left" $? \
    "exit $rc after ${elapsed} s, left: $left"
# A rank that ignores SIGTERM gets SIGKILL LAUNCH_KILL_AFTER seconds after another failed.
start=$SECONDS
LAUNCH_KILL_AFTER=2 scripts/launch.sh --one-gpu 2 sh -c 'echo $$ > "$0/deaf.pid.$RANK"; if [ "$RANK" = 0 ]; then trap "" TERM; while :; do sleep 0.2; done; else sleep 1; exit 3; fi' \
    "$W" 2> "$W/deaf.err" & launcher=$!
watchdog 30 $launcher $(cat "$W"/deaf.pid.* 2> /dev/null)
wait $launcher; rc=$?
elapsed=$((SECONDS - start)); watchdog_off
left=$(kill -0 "$(cat "$W/deaf.pid.0")" 2> /dev/null && echo "rank 0")
[ $rc -eq 3 ] && [ $elapsed -ge 3 ] && [ $elapsed -lt 10 ] && [ -z "$left" ] && grep -q "SIGKILL" "$W/deaf.err"
check "a rank that ignores SIGTERM gets SIGKILL LAUNCH_KILL_AFTER=2 s after the failure (ended after ${elapsed} s)" $? \
    "exit $rc after ${elapsed} s, $left left, stderr: $(cat "$W/deaf.err")"

# Bad usage: no count, a count that is not a positive number, --one-gpu on several nodes.
for args in "--one-gpu" "--one-gpu 0 true" "two true" "--one-gpu -1 true"; do
    err=$(scripts/launch.sh $args 2>&1 > /dev/null); rc=$?
    [ $rc -eq 2 ] && printf '%s' "$err" | grep -q usage
    check "usage error for '$args'" $? "exit status $rc, stderr: $err"
done
err=$(NNODES=2 NODE_RANK=0 scripts/launch.sh --one-gpu 2 true 2>&1 > /dev/null); rc=$?
[ $rc -eq 2 ] && printf '%s' "$err" | grep -q -- "--one-gpu runs on one node"
check "--one-gpu refuses several nodes" $? "exit status $rc, stderr: $err"
