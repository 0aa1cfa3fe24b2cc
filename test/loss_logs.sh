# Shared by the multi-rank GPU suites (sourced): reading train_gpt's DIR/log.txt and comparing two runs' losses.
# losses DIR: "step loss" per training step
losses() { grep -v '^#' "$1/log.txt" | cut -d' ' -f1-2; }
# maxdiff A B [FROM]: the largest loss difference between run A (from step FROM on, default 0) and run B
maxdiff() { paste <(losses "$1" | awk -v from="${3:-0}" '$1 >= from') <(losses "$2") | awk 'BEGIN{m=0} {d=$2-$4; if (d<0) d=-d; if (d>m) m=d} END {print m}'; }
# within D TOL: succeeds when D <= TOL
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d <= t) }'; }
