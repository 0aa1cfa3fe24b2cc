#!/usr/bin/env bash
# The fuzz harnesses of test/fuzz/ (one per parser of outside input, libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer) and the safetensors reader's fuzz loop: builds the harnesses (make fuzz-build), replays
# every regression input (test/fuzz/regressions/), then fuzzes with each for FUZZ_TEST_SECONDS (default 10), all
# side by side; one line per harness. Both tiers run the same; `make fuzz` runs them for longer (FUZZ_SECONDS).
# Without a clang++ (FUZZ_CXX) that links -fsanitize=fuzzer the C++ harnesses are skipped, saying why; without
# numpy the safetensors loop is.
set -u
cd "$(dirname "$0")/.."
cxx=${FUZZ_CXX:-clang++}
only=""  # every harness (run_fuzz.sh's list); only the safetensors loop without the C++ harnesses
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$probe/probe.cpp"
mkdir -p build
if ! command -v "$cxx" > /dev/null 2>&1; then
    echo "SKIP fuzz harnesses: no $cxx (Debian: apt-get install clang libclang-rt-dev)"
    only=safetensors
elif ! why=$("$cxx" -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" 2>&1); then
    echo "SKIP fuzz harnesses: $cxx cannot link -fsanitize=fuzzer,address,undefined ($(printf '%s' "$why" | tail -n 1); Debian: apt-get install clang libclang-rt-dev)"
    only=safetensors
elif ! make -s -j"$(nproc)" fuzz-build FUZZ_CXX="$cxx" > build/fuzz_build.log 2>&1; then
    echo "FAIL fuzz build: make fuzz-build: $(grep -m 1 -E 'error|Error' build/fuzz_build.log) (build/fuzz_build.log)"
    only=safetensors
fi
# from the seeds alone (a fresh corpus folder): a test run does not lengthen with what earlier runs kept
FUZZ_SECONDS=${FUZZ_TEST_SECONDS:-10} FUZZ_JOBS=all FUZZ_HARNESSES=$only FUZZ_CORPUS=$probe/corpus bash test/fuzz/run_fuzz.sh
