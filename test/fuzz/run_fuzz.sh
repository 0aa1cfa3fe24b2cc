#!/usr/bin/env bash
# Runs the fuzz harnesses of test/fuzz/ (built by `make fuzz-build`) and the safetensors reader's loop
# (fuzz_safetensors.py): each first replays its regression inputs (test/fuzz/regressions/X/, every input that once
# crashed it), then fuzzes for FUZZ_SECONDS (default 60) from its seed corpus (test/fuzz/corpus/X/) and what its
# earlier runs kept (FUZZ_CORPUS/X/, default build/fuzz/corpus/X/), FUZZ_JOBS of them side by side (default: one per
# core; all: every one).
# FUZZ_HARNESSES="model_file tokenize" runs some; PYTHON is the safetensors loop's interpreter (default: the first of
# /usr/bin/python3 and python3 with numpy). One line per harness:
#   PASS fuzz X: N runs in S s, no crash
#   FAIL fuzz X: what libFuzzer reported; reproducer build/fuzz/crashes/X/crash-... (replay: build/fuzz/fuzz_X FILE)
# Exit status 1 if any failed.
set -u
cd "$(dirname "$0")/../.."
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
[ "$jobs" = all ] && jobs=1000
harnesses=${FUZZ_HARNESSES:-"shards model_file state_file manifest adapter_file peft_folder tokenizer_files tokenizer_json vocab_bpe tokenize hellaswag train_options chat_jsonl mask_shards safetensors"}
work=build/fuzz
corpus=${FUZZ_CORPUS:-$work/corpus}
mkdir -p "$work/logs"

# One harness: its result line into $work/logs/X.result, its output into $work/logs/X.log.
fuzz_one() {
    local h=$1 log=$work/logs/$1.log result=$work/logs/$1.result
    : > "$log"
    if [ "$h" = safetensors ]; then
        local python=python3 candidate  # PYTHON, else the first of /usr/bin/python3 and python3 with numpy (import_hf.py's)
        for candidate in ${PYTHON:-} /usr/bin/python3 python3; do
            if "$candidate" -c "import numpy" > /dev/null 2>&1; then python=$candidate; break; fi
        done
        "$python" test/fuzz/fuzz_safetensors.py --seconds "$seconds" > "$result" 2> "$log"
        [ -s "$result" ] || echo "FAIL fuzz safetensors: fuzz_safetensors.py printed no result: $(tail -n 1 "$log")" > "$result"
        return
    fi
    local binary=$work/fuzz_$h
    if [ ! -x "$binary" ]; then
        echo "FAIL fuzz $h: $binary is missing (make fuzz-build)" > "$result"
        return
    fi
    local regressions=(test/fuzz/regressions/$h/*)
    [ -e "${regressions[0]}" ] || regressions=()
    if [ ${#regressions[@]} -gt 0 ] && ! "$binary" "${regressions[@]}" < /dev/null > "$log" 2>&1; then
        local input
        input=$(grep -o '^Running: .*' "$log" | tail -n 1 | cut -d' ' -f2-)
        echo "FAIL fuzz $h: regression input $input crashes it again: $(grep -m 1 -E '^==[0-9]+==ERROR|fuzz check failed|runtime error|deadly signal|timeout' "$log") (log $log)" > "$result"
        return
    fi
    mkdir -p "$corpus/$h" "$work/crashes/$h"
    local dict=()  # the flags' names and values for train_options (make_corpus.py writes it)
    [ -f "test/fuzz/$h.dict" ] && dict=(-dict="test/fuzz/$h.dict")
    "$binary" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/crashes/$h/" \
        "${dict[@]}" "$corpus/$h" "test/fuzz/corpus/$h" < /dev/null >> "$log" 2>&1
    local rc=$? runs
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
    if [ $rc -eq 0 ]; then
        echo "PASS fuzz $h: ${runs:-?} runs in $seconds s, no crash (${#regressions[@]} regression inputs replayed)" > "$result"
    else
        local artifact what
        artifact=$(grep -o 'Test unit written to [^ ]*' "$log" | tail -n 1 | cut -d' ' -f5)
        what=$(grep -m 1 -E '^==[0-9]+==ERROR|fuzz check failed|runtime error|deadly signal|-timeout=|out-of-memory' "$log" | sed 's/^==[0-9]*==//')
        echo "FAIL fuzz $h: ${what:-exit status $rc}; reproducer ${artifact:-none written} (replay: $binary ${artifact:-FILE}; log $log)" > "$result"
    fi
}

running=0
for h in $harnesses; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    rm -f "$work/logs/$h.result"
    fuzz_one "$h" &
    running=$((running + 1))
done
wait
failed=0
for h in $harnesses; do
    cat "$work/logs/$h.result"
    grep -q '^FAIL ' "$work/logs/$h.result" && failed=1
done
exit $failed
