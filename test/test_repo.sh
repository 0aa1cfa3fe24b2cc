#!/usr/bin/env bash
# Checks of the repository itself, without a GPU: README's files table names every source file of kernels/,
# model/, distributed/ and dataloader/; errors are printed only by the one helper (kernels/die.h: die, print_error);
# every flag with a range or choices in train_gpt's table (train_options.h) appears in docs/errors.md's flag table; every test program
# test/test_X.cpp|cu names its suite X in its check lines (check_suite("X"), test/check.h).
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
