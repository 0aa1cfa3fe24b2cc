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
