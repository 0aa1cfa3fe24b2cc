# Shared by the multi-rank GPU suites (sourced): starting ranks, running train_gpt on them, reading its DIR/log.txt
# and comparing two runs' losses.
# Where ranks run: all on GPU 0 (scripts/launch.sh --one-gpu), or with ONE_RANK_PER_GPU=1 on a machine with at
# least as many GPUs as ranks, one rank per GPU (the suites on several GPUs).
# spreads RANKS: succeeds when RANKS ranks get a GPU each; launch_mode RANKS: launch.sh's flag for them.
VISIBLE_GPUS=$(scripts/visible_gpus.sh)
spreads() { [ "${ONE_RANK_PER_GPU:-0}" = 1 ] && [ "$VISIBLE_GPUS" -ge "$1" ]; }
launch_mode() { spreads "$1" || printf -- '--one-gpu'; }
# losses DIR: "step loss" per training step
losses() { grep -v '^#' "$1/log.txt" | cut -d' ' -f1-2; }
# maxdiff A B [FROM]: the largest loss difference between run A (from step FROM on, default 0) and run B
maxdiff() { paste <(losses "$1" | awk -v from="${3:-0}" '$1 >= from') <(losses "$2") | awk 'BEGIN{m=0} {d=$2-$4; if (d<0) d=-d; if (d>m) m=d} END {print m}'; }
# within D TOL: succeeds when D <= TOL
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d <= t) }'; }

# The multi-rank suites' runs, with the suite's W (work folder), SHAPE (model flags) and RUN (common flags).
# run NAME RANKS ARGS...: train_gpt on RANKS ranks (launch_mode), log and checkpoints in $W/NAME (the model shape
# unless ARGS name a --model file or --layers)
run() {
    local name=$1 ranks=$2; shift 2
    local model=("${SHAPE[@]}")
    case " $* " in *" --model "*|*" --layers "*) model=();; esac
    if [ "$ranks" -eq 1 ]; then ./train_gpt "${model[@]}" "${RUN[@]}" "$@" -o "$W/$name" > "$W/$name.out" 2>&1
    else scripts/launch.sh $(launch_mode "$ranks") "$ranks" ./train_gpt "${model[@]}" "${RUN[@]}" "$@" -o "$W/$name" > "$W/$name.out" 2>&1; fi
}
# compare NAME REFERENCE TOL FROM_STEP STEPS WHAT: one check line, prefixed with the suite's $SUITE
compare() {
    local name=$1 ref=$2 tol=$3 from=$4 steps=$5 what=$6
    local d; d=$(maxdiff "$W/$ref" "$W/$name" "$from")
    if [ -f "$W/$name/log.txt" ] && [ "$(losses "$W/$name" | wc -l)" -eq "$steps" ] && within "$d" "$tol"; then
        echo "PASS $SUITE $what: max loss diff $d (tol $tol)"
    else
        echo "FAIL $SUITE $what: max loss diff ${d:-none} (tol $tol) $(grep -m1 -iE 'error|abort' "$W/$name.out")"
    fi
}
