#!/usr/bin/env bash
# Development check on the GPU machine: builds the GPU tests and runs kernels and the whole model against
# the PyTorch reference in three precisions. Logs go to $OUT (or /tmp/gpu_smoke).
set -u
OUT=${OUT:-/tmp/gpu_smoke}
mkdir -p build "$OUT"
nvidia-smi -L
NV="nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fopenmp"
$NV test/test_kernels.cu test/cpu_reference.cpp -lcublasLt -lcublas -lgomp -o build/test_kernels &
$NV test/test_gpt2.cu -lcublasLt -lcublas -o build/test_gpt2 &
FX=/tmp/fx; mkdir -p $FX
ref() { python3 scripts/gpt2_reference.py debug-state --device cuda --steps 10 --seed 1337 "$@" > /dev/null; }
ref --layers 2 --heads 4 --channels 128 --max-seq-len 64 --batch-size 4 --seq-len 64 --dtype fp32 --model-out $FX/small.bin --state-out $FX/small_fp32.bin
ref --layers 2 --heads 4 --channels 128 --max-seq-len 64 --batch-size 4 --seq-len 64 --dtype bf16 --model-out $FX/small.bin --state-out $FX/small_bf16.bin
ref --layers 2 --heads 4 --channels 128 --max-seq-len 64 --batch-size 4 --seq-len 64 --dtype fp16 --model-out $FX/small.bin --state-out $FX/small_fp16.bin
ref --layers 12 --heads 12 --channels 768 --max-seq-len 1024 --batch-size 4 --seq-len 64 --dtype fp32 --model-out $FX/d12.bin --state-out $FX/d12_fp32.bin
ref --layers 12 --heads 12 --channels 768 --max-seq-len 1024 --batch-size 4 --seq-len 64 --dtype bf16 --model-out $FX/d12.bin --state-out $FX/d12_bf16.bin
wait
./build/test_kernels 2>&1 | tee $OUT/test_kernels.log | grep -v "^PASS"
for p in fp32 bf16 fp16; do ./build/test_gpt2 $FX/small.bin $FX/small_$p.bin $p small-$p; done 2>&1 | tee $OUT/test_gpt2.log
for p in fp32 bf16; do ./build/test_gpt2 $FX/d12.bin $FX/d12_$p.bin $p d12-$p; done 2>&1 | tee -a $OUT/test_gpt2.log
echo "SUMMARY: $(cat $OUT/*.log | grep -c '^PASS') passed, $(cat $OUT/*.log | grep -c '^FAIL') failed"
