#!/usr/bin/env bash
# Checks of the repository itself, without a GPU: README's files table names every source file of kernels/,
# model/, distributed/ and dataloader/; errors are printed only by the one helper (kernels/die.h: die, print_error);
# every flag with a range or choices in train_gpt's table (train_options.h) appears in docs/errors.md's flag table, and
# every flag in a row of docs/training.md's table (test_commands.sh compares their defaults with --help); every test program
# test/test_X.cpp|cu names its suite X in its check lines (check_suite("X"), test/check.h); no file tells the
# development history; every Python script names a package it cannot import in one line.
set -u
cd "$(dirname "$0")/.."

missing=""
for f in kernels/* model/* distributed/* dataloader/*; do
    base=$(basename "$f"); stem=${base%%.*}
    grep -q -- "$stem" README.md || missing="$missing $f"
done
if [ -z "$missing" ]; then echo "PASS repo README's files table names every source file"; else echo "FAIL repo README does not name:$missing"; fi

# an "error: " line printed anywhere but the helper (tests have their own reporting)
others=$(grep -rn --include=*.h --include=*.cuh --include=*.cpp --include=*.cu -E 'fprintf\(stderr, *"error|(^|[^_])exit\(EXIT_FAILURE\)|(^|[^_])exit\(1\)' \
    kernels model distributed dataloader train_gpt.cu train_options.h | grep -v '^kernels/die.h:' | grep -v 'if (!pg.is_main()) exit(EXIT_FAILURE)')
if [ -z "$others" ]; then echo "PASS repo fatal errors go through kernels/die.h only"; else echo "FAIL repo other error exits: $others"; fi

missing=""
for flag in $(grep '{"--[a-z0-9-]*"' train_options.h | grep -v 'anything()' | grep -o '{"--[a-z0-9-]*"' | tr -d '{"'); do
    grep -q -- "\`$flag\`" docs/errors.md || missing="$missing $flag"
done
if [ -z "$missing" ]; then echo "PASS repo docs/errors.md lists every flag's accepted values"; else echo "FAIL repo docs/errors.md lacks:$missing"; fi

missing=""
for flag in $(grep -o '{"--[a-z0-9-]*"' train_options.h | tr -d '{"'); do
    grep -q -- "^| \`$flag\`" docs/training.md || missing="$missing $flag"
done
if [ -z "$missing" ]; then echo "PASS repo docs/training.md's table has a row for every flag"; else echo "FAIL repo docs/training.md's table lacks:$missing"; fi

misnamed=""
for f in test/test_*.cpp test/test_*.cu; do
    base=$(basename "$f"); suite=${base#test_}; suite=${suite%.*}
    grep -q 'check.h' "$f" && ! grep -q "check_suite(\"$suite\")" "$f" && misnamed="$misnamed $f"
done
if [ -z "$misnamed" ]; then echo "PASS repo every test program's check lines start with its suite's name"
else echo "FAIL repo test programs without check_suite(\"X\") for test_X:$misnamed"; fi

# The repository speaks of the product, not of how it was made: no mention of a development session or its number,
# no issue or pull-request numbers (an upstream reference qualified by its repository, owner/name then a hash and
# the number, stays), no notes of a run or a measurement still to come. Every tracked text file (every
# file outside a git checkout) but data/; the only lines left out are this check's own patterns and messages.
history_re='\b[Ii]ssues? #?[0-9]|\b[Ii]ssue'"'"'s\b|\b(from|in|per|by|of) the issue\b'
history_re+='|(^|[^A-Za-z0-9_/&$#{:])#[0-9]{1,5}\b|\b(PR|[Pp]ull [Rr]equest) #?[0-9]|\b[Uu]n(run|measured)\b'
history_re+='|\b[Nn]ot (yet )?(been )?(run|measured|tested|timed|verified|benchmarked|profiled)( [A-Za-z0-9-]+){0,4}'
history_re+=' yet\b|\b[Nn]ot yet (been )?(run|measured|tested|timed|verified|benchmarked|profiled)\b'
history_re+='|\b(has|have|was|were) (not|never) (yet )?(been )?(run|measured|timed|benchmarked)\b'
session_re='\b[Ss]essions?\b'  # any mention, but of the sessions below
session_ok='\b(ssh|SSH|login|tmux|screen|shell|terminal|interactive|user|browser|HTTP|TLS) sessions?\b'
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    mapfile -d '' files < <(git ls-files -z | grep -zv '^data/')
else
    mapfile -d '' files < <(find . -type f ! -path './.git/*' ! -path './data/*' ! -path './build/*' -print0 | sed -z 's|^\./||')
fi
history=$( (grep -nIE -- "$history_re" "${files[@]}"; grep -nIE -- "$session_re" "${files[@]}" | grep -vE -- "$session_ok") 2> /dev/null |
    grep -vE '^test/test_repo\.sh:[0-9]+:.*(history_re|session_re|session_ok|development history|development session)' |
    sort -t: -k1,1 -k2,2n -u)
if [ -z "$history" ]; then
    echo "PASS repo no development history (session or issue numbers, \"not run yet\" notes) in the repository"
else
    echo "FAIL repo development history in: $(printf '%s\n' "$history" | cut -d: -f1,2 | head -8 | tr '\n' ' ')"\
"($(printf '%s\n' "$history" | wc -l) lines)"
fi

# Every Python script where the packages it needs cannot be imported (stand-ins first on PYTHONPATH that raise
# ModuleNotFoundError): `--help` works (nothing needed up front) or the script exits non-zero with one line on
# stderr, "error: SCRIPT needs PACKAGE: pip install ...", and no traceback. So do the packages needed only for
# some inputs: prepare_fineweb.py's datasets (no --input) and pyarrow (.parquet input), make_tokenizer_fixtures.py's
# tiktoken (its default reference); and a package that is there but fails to import is named with its error.
if ! command -v python3 > /dev/null 2>&1; then
    echo "SKIP repo python scripts name a missing package in one line: no python3"
else
    fake=$(mktemp -d); trap 'rm -rf "$fake"' EXIT
    mkdir "$fake/missing" "$fake/broken"
    for m in numpy torch transformers safetensors matplotlib tiktoken regex pyarrow datasets; do
        echo "raise ModuleNotFoundError(\"No module named '$m'\", name='$m')" > "$fake/missing/$m.py"
    done
    echo 'raise ImportError("numpy C-extensions failed\nsecond line")' > "$fake/broken/numpy.py"
    if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
        mapfile -t scripts < <(git ls-files '*.py' | grep -v '^data/')
    else
        mapfile -t scripts < <(find . -name '*.py' ! -path './data/*' ! -path './build/*' ! -path './.git/*' | sed 's|^\./||' | sort)
    fi
    bad=""; needing=0
    # one_line NAME PATTERN PYTHONPATH ARGS...: non-zero exit, nothing on stdout, one stderr line matching PATTERN
    one_line() {
        local name=$1 pattern=$2 path=$3; shift 3
        local out err rc
        out=$(PYTHONPATH=$path python3 "$@" 2> "$fake/err"); rc=$?; err=$(cat "$fake/err")
        if [ $rc -eq 0 ] || [ -n "$out" ] || [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] || ! printf '%s' "$err" | grep -qE -- "$pattern"; then
            bad="$bad; $name: rc=$rc stderr: $(printf '%s' "$err" | tail -n 1)"
        fi
    }
    for s in "${scripts[@]}"; do
        if PYTHONPATH=$fake/missing python3 "$s" --help > /dev/null 2> "$fake/err"; then
            [ -s "$fake/err" ] && bad="$bad; $s --help: $(tail -n 1 "$fake/err")"
        else
            needing=$((needing + 1))
            one_line "$s --help" "^error: $s needs [A-Za-z_.]+( [^:]*)?: pip install [^ ]" "$fake/missing" "$s" --help
        fi
    done
    one_line "prepare_fineweb.py from the hub" "^error: scripts/data/prepare_fineweb.py needs datasets .*: pip install datasets" \
        "$fake/missing" scripts/data/prepare_fineweb.py --out "$fake/shards"
    one_line "prepare_fineweb.py .parquet" "^error: scripts/data/prepare_fineweb.py needs pyarrow .*: pip install pyarrow$" \
        "$fake/missing" scripts/data/prepare_fineweb.py --input "$fake/docs.parquet" --out "$fake/shards"
    one_line "make_tokenizer_fixtures.py tiktoken" "^error: test/tools/make_tokenizer_fixtures.py needs tiktoken .*: pip install tiktoken" \
        "$fake/missing" test/tools/make_tokenizer_fixtures.py --out "$fake/cases.txt"
    one_line "export_hf.py broken numpy" \
        "^error: scripts/hf/export_hf.py needs numpy \(importing it failed: numpy C-extensions failed\): pip install numpy$" \
        "$fake/broken" scripts/hf/export_hf.py --help
    if [ -z "$bad" ]; then
        echo "PASS repo python scripts name a missing package in one line (${#scripts[@]} scripts, $needing need one up front)"
    else
        echo "FAIL repo python scripts with a package missing:${bad#;}"
    fi
fi

# scripts/reference/plot_losses.py: two runs' logs give an SVG with each run's curve and the difference curve, each
# validation dot, and the last validation loss in the legend, and the max |difference| line; a log it cannot read
# gives one line and a non-zero exit.
if ! command -v python3 > /dev/null 2>&1; then
    echo "SKIP repo plot_losses.py: no python3"
else
    plot=$(mktemp -d)
    for run in a b; do
        { echo "# step loss lr grad_norm ms"; echo "# val step 0 loss 11.0"
          for s in $(seq 0 29); do echo "$s $(awk -v s=$s -v d=$([ $run = b ] && echo 0.25 || echo 0) 'BEGIN { print 11 - s / 10 + (s == 7) * d }') 1e-4 1.0 10.0"; done
          echo "# val step 29 loss $([ $run = b ] && echo 8.2 || echo 8.1)"; } > "$plot/$run.txt"
    done
    out=$(python3 scripts/reference/plot_losses.py --out "$plot/p.svg" --window 5 "$plot/a.txt" "$plot/b.txt" --labels A B 2>&1)
    if [ $? -eq 0 ] && [ "$(grep -c '<polyline' "$plot/p.svg")" -eq 3 ] && [ "$(grep -c '<circle' "$plot/p.svg")" -eq 4 ] &&
       grep -q '>B (val 8.200)<' "$plot/p.svg" && [[ $out == *"B vs A: max |difference| 0.25 at step 7 over 30 common steps"* ]] &&
       [ ! -e "$plot/p.svg.tmp" ]; then
        echo "PASS repo plot_losses.py draws each run, the difference and the validation losses, and names the largest difference"
    else
        echo "FAIL repo plot_losses.py: $out; $(grep -c '<polyline' "$plot/p.svg" 2>/dev/null) curves, $(grep -c '<circle' "$plot/p.svg" 2>/dev/null) dots"
    fi
    err=$(python3 scripts/reference/plot_losses.py --out "$plot/q.svg" "$plot/a.txt" "$plot/none.txt" 2>&1 > /dev/null); rc=$?
    if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == "error: $plot/none.txt: No such file or directory" ]] && [ ! -e "$plot/q.svg" ]; then
        echo "PASS repo plot_losses.py names a log it cannot read"
    else
        echo "FAIL repo plot_losses.py on a missing log: rc=$rc: $err"
    fi
    rm -rf "$plot"
fi
