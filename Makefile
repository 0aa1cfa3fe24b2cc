# Builds train_gpt, the data tools, every test (test/) and the kernel benchmarks (bench/). `make test` builds them
# and runs the quick tier of the suite (every component at least once), `make
# test-full` every check; on a machine without a GPU both report the GPU parts as skipped. `make test-portable`
# runs the full suite on a build with only compute_80 PTX, which the driver compiles for the GPU at hand: the
# mma.sync kernels every Ampere, Ada and Blackwell GPU runs, checked on a Hopper GPU. Scripts (data, training,
# interop) are in scripts/.
NVCC ?= nvcc
CXX ?= g++
# Target GPUs (scripts/gpu_code.sh): the compute capability of each GPU nvidia-smi lists, sm_90a on Hopper (wgmma
# and TMA); without a GPU, every supported architecture in one binary (machine code for each, plus compute_120 PTX
# that newer GPUs compile at load). GPU_ARCH="-gencode arch=compute_86,code=sm_86" (or several) overrides.
ifeq ($(origin GPU_ARCH),undefined)
  GPU_ARCH := $(shell bash scripts/gpu_code.sh flags)
  GPU_ARCH_REASON := $(shell bash scripts/gpu_code.sh reason)
else
  GPU_ARCH_REASON := GPU_ARCH given
endif
comma = ,
$(info GPU code: $(patsubst code=%,%,$(filter code=%,$(subst $(comma), ,$(GPU_ARCH)))) ($(GPU_ARCH_REASON)))
# Binaries are rebuilt when the target GPUs change: every CUDA target depends on this file, rewritten only then.
GPU_CODE_STAMP := build/gpu_code.txt
$(shell mkdir -p build && (echo '$(GPU_ARCH)' | cmp -s - $(GPU_CODE_STAMP) || echo '$(GPU_ARCH)' > $(GPU_CODE_STAMP)))
NVCC_FLAGS ?= -O3 -std=c++17 --threads 0 $(GPU_ARCH) -Xcompiler -Wall,-fopenmp -Wno-deprecated-gpu-targets
CXX_FLAGS ?= -O3 -std=c++17 -Wall -Wextra -pthread
CUDA_LIBS = -lcublasLt -lcublas -lnccl -lgomp
# MPI is optional: with mpicxx found (or USE_MPI=1) train_gpt bootstraps from mpirun; without it, from
# Slurm or environment variables (scripts/launch.sh).
USE_MPI ?= $(if $(shell command -v mpicxx 2> /dev/null),1,0)
ifeq ($(USE_MPI),1)
  MPI_FLAGS = -DUSE_MPI $(shell mpicxx --showme:compile 2> /dev/null) $(shell mpicxx --showme:link 2> /dev/null | sed 's/-Wl,[^ ]*//g')
endif
BUILD = build

KERNELS = $(wildcard kernels/*.cuh) $(wildcard kernels/*.h) $(wildcard distributed/*.cuh) distributed/process_group.h distributed/mesh.h distributed/pipeline_schedule.h \
          distributed/heartbeat.h distributed/stop_signals.h distributed/optimizer_file.h distributed/shard_plan.h \
          $(wildcard model/*.h) $(wildcard model/*.cuh) train_options.h $(GPU_CODE_STAMP)
DISTRIBUTED_SRCS = distributed/process_group.cpp distributed/mesh.cpp distributed/heartbeat.cpp
DATALOADER_SRCS = dataloader/tokenizer.cpp dataloader/shards.cpp dataloader/dataloader.cpp dataloader/text_reader.cpp \
                  dataloader/hellaswag.cpp dataloader/chat.cpp
DATALOADER_HDRS = $(wildcard dataloader/*.h)
# Test binaries: build/test_X from test/test_X.cpp|cu is the suite X of test/run_tests.sh (its driver, if any,
# test/test_X.sh). CPU_TESTS build with g++ alone; GPU_TESTS with nvcc (sharding, lora_files and formats run
# without a GPU). BENCHES: the kernel benchmarks of bench/, built with the tests so that a change breaking them
# fails the build.
CPU_TESTS = $(BUILD)/test_cpu_reference $(BUILD)/test_cpu_lora $(BUILD)/test_tokenizer $(BUILD)/test_dataloader $(BUILD)/test_hellaswag \
            $(BUILD)/test_mesh $(BUILD)/test_pipeline_schedule $(BUILD)/test_gpu_support $(BUILD)/test_adamw_cpu $(BUILD)/test_stop_signals \
            $(BUILD)/test_heartbeat $(BUILD)/test_offload_dir $(BUILD)/test_fp8 $(BUILD)/test_checkpoints $(BUILD)/test_checkpoint_crash \
            $(BUILD)/test_options $(BUILD)/test_layout $(BUILD)/test_peft $(BUILD)/test_chat $(BUILD)/test_nf4
GPU_TESTS = $(BUILD)/test_kernels $(BUILD)/test_attention $(BUILD)/test_model $(BUILD)/test_sharding $(BUILD)/test_lora_files $(BUILD)/test_formats \
            $(BUILD)/test_mesh_nccl $(BUILD)/test_tensor_parallel_layers $(BUILD)/test_fp8_gpu $(BUILD)/test_fp8_model \
            $(BUILD)/test_nf4_gpu
BENCHES = $(BUILD)/bench_attention $(BUILD)/bench_memory_bound $(BUILD)/bench_adamw_cpu $(BUILD)/bench_offload_dir $(BUILD)/bench_fp8 \
          $(BUILD)/bench_nf4

.PHONY: all tests benches test test-full test-portable train clean fuzz fuzz-build
all: train_gpt $(BUILD)/prepare_shards
tests: $(CPU_TESTS) $(GPU_TESTS) benches
benches: $(BENCHES)

$(BUILD):
	mkdir -p $(BUILD)

train_gpt: train_gpt.cu $(KERNELS) $(DATALOADER_SRCS) $(DATALOADER_HDRS) $(DISTRIBUTED_SRCS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) $(MPI_FLAGS) train_gpt.cu $(DATALOADER_SRCS) $(DISTRIBUTED_SRCS) $(CUDA_LIBS) -o $@

$(BUILD)/prepare_shards: dataloader/prepare_shards.cpp $(DATALOADER_SRCS) $(DATALOADER_HDRS) | $(BUILD)
	$(CXX) $(CXX_FLAGS) dataloader/prepare_shards.cpp $(DATALOADER_SRCS) -o $@

$(BUILD)/test_cpu_reference: test/test_cpu_reference.cpp test/cpu_reference.cpp test/cpu_reference.h test/debug_state.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) -fopenmp test/test_cpu_reference.cpp test/cpu_reference.cpp -o $@

$(BUILD)/test_cpu_lora: test/test_cpu_lora.cpp test/cpu_reference.cpp test/cpu_reference.h test/debug_state.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) -fopenmp test/test_cpu_lora.cpp test/cpu_reference.cpp -o $@

$(BUILD)/test_tokenizer: test/test_tokenizer.cpp $(DATALOADER_SRCS) $(DATALOADER_HDRS) | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_tokenizer.cpp $(DATALOADER_SRCS) -o $@

$(BUILD)/test_dataloader: test/test_dataloader.cpp $(DATALOADER_SRCS) $(DATALOADER_HDRS) | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_dataloader.cpp $(DATALOADER_SRCS) -o $@

# chat data: templates, prepare_shards --chat (run as a program), mask shards and the loader's -1 targets
$(BUILD)/test_chat: test/test_chat.cpp $(DATALOADER_SRCS) $(DATALOADER_HDRS) $(BUILD)/prepare_shards | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_chat.cpp $(DATALOADER_SRCS) -o $@

$(BUILD)/test_hellaswag: test/test_hellaswag.cpp $(DATALOADER_SRCS) $(DATALOADER_HDRS) | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_hellaswag.cpp $(DATALOADER_SRCS) -o $@

# The mesh's rank arithmetic is inline in distributed/mesh.h and needs no CUDA or NCCL: a plain g++ test.
$(BUILD)/test_mesh: test/test_mesh.cpp distributed/mesh.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_mesh.cpp -o $@

# The pipeline schedules are header-only too (distributed/pipeline_schedule.h): a plain g++ test.
$(BUILD)/test_pipeline_schedule: test/test_pipeline_schedule.cpp distributed/pipeline_schedule.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_pipeline_schedule.cpp -o $@

# train_gpt's command line (train_options.h) parses and validates without CUDA: a g++ test, refusals in forked processes.
$(BUILD)/test_options: test/test_options.cpp train_options.h $(wildcard model/*.h) distributed/mesh.h distributed/pipeline_schedule.h \
                       distributed/optimizer_file.h kernels/die.h kernels/host_device.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_options.cpp -o $@

# The GPU support check and the MFU peaks are plain C++ (kernels/gpu_support.h): a plain g++ test.
$(BUILD)/test_gpu_support: test/test_gpu_support.cpp kernels/gpu_support.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_gpu_support.cpp -o $@

# The CPU AdamW is plain C++ (kernels/adamw_cpu.h: its vector paths are chosen at run time): a g++ test with OpenMP.
$(BUILD)/test_adamw_cpu: test/test_adamw_cpu.cpp kernels/adamw_cpu.h kernels/host_device.h kernels/die.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) -fopenmp test/test_adamw_cpu.cpp -o $@

# FP8's formats, scales and shape rules are plain C++ (kernels/fp8_formats.h): a plain g++ test.
$(BUILD)/test_fp8: test/test_fp8.cpp kernels/fp8_formats.h kernels/host_device.h kernels/gpu_support.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_fp8.cpp -o $@

# The stop signals and the heartbeats are plain threads, signals and sockets (distributed/stop_signals.h,
# distributed/heartbeat.cpp): g++ tests on forked processes.
$(BUILD)/test_stop_signals: test/test_stop_signals.cpp distributed/stop_signals.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_stop_signals.cpp -o $@

$(BUILD)/test_heartbeat: test/test_heartbeat.cpp distributed/heartbeat.cpp distributed/heartbeat.h distributed/stop_signals.h kernels/die.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_heartbeat.cpp distributed/heartbeat.cpp -o $@

$(BUILD)/test_mesh_nccl: test/test_mesh_nccl.cu $(GPU_CODE_STAMP) distributed/mesh.h distributed/process_group.h distributed/heartbeat.h $(DISTRIBUTED_SRCS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_mesh_nccl.cu $(DISTRIBUTED_SRCS) $(CUDA_LIBS) -o $@

$(BUILD)/test_kernels: test/test_kernels.cu test/cpu_reference.cpp test/cpu_reference.h test/gpu_check.h test/check.h $(KERNELS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_kernels.cu test/cpu_reference.cpp $(CUDA_LIBS) -o $@

$(BUILD)/test_attention: test/test_attention.cu test/cpu_reference.cpp test/cpu_reference.h test/gpu_check.h test/check.h $(KERNELS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_attention.cu test/cpu_reference.cpp $(CUDA_LIBS) -o $@

# The FP8 casts and products on the GPU (its host reference checks run without one)
$(BUILD)/test_fp8_gpu: test/test_fp8_gpu.cu test/gpu_check.h test/check.h $(KERNELS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_fp8_gpu.cu $(CUDA_LIBS) -o $@

# NF4 dequantization on the GPU against model/nf4.h (its host checks run without one)
$(BUILD)/test_nf4_gpu: test/test_nf4_gpu.cu test/gpu_check.h test/check.h $(KERNELS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_nf4_gpu.cu $(CUDA_LIBS) -o $@

$(BUILD)/bench_attention: bench/bench_attention.cu bench/bench_util.h $(KERNELS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) bench/bench_attention.cu $(CUDA_LIBS) -o $@

$(BUILD)/bench_memory_bound: bench/bench_memory_bound.cu bench/bench_util.h $(KERNELS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) bench/bench_memory_bound.cu $(CUDA_LIBS) -o $@

$(BUILD)/bench_fp8: bench/bench_fp8.cu bench/bench_util.h $(KERNELS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) bench/bench_fp8.cu $(CUDA_LIBS) -o $@

# NF4 products dequantized in the kernel against dequantization + cuBLASLt (kernels/nf4_matmul.cuh)
$(BUILD)/bench_nf4: bench/bench_nf4.cu bench/bench_util.h $(KERNELS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) bench/bench_nf4.cu $(CUDA_LIBS) -o $@

# ZeRO-Offload's CPU AdamW against the same memory traffic (plain C++ with OpenMP, as test_adamw_cpu)
$(BUILD)/bench_adamw_cpu: bench/bench_adamw_cpu.cpp kernels/adamw_cpu.h kernels/host_device.h kernels/die.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) -fopenmp bench/bench_adamw_cpu.cpp -o $@

# the NVMe tier's disk and its AdamW pass through the optimizer file (bench/bench_offload.sh's nvme section)
$(BUILD)/bench_offload_dir: bench/bench_offload_dir.cpp distributed/optimizer_file.h model/run_identity.h kernels/adamw_cpu.h kernels/host_device.h kernels/die.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) -fopenmp bench/bench_offload_dir.cpp -o $@

# ZeRO-Offload's NVMe tier (--offload-dir): AdamW through the optimizer file against AdamW in memory
CHECKPOINT_HDRS = model/checkpoint_store.h model/checked_reads.h model/file_integrity.h model/model_file.h model/state_file.h model/run_identity.h model/config.h \
                  kernels/die.h kernels/host_device.h distributed/mesh.h dataloader/dataloader.h test/check.h
$(BUILD)/test_peft: test/test_peft.cpp train_options.h $(wildcard model/*.h) distributed/mesh.h distributed/pipeline_schedule.h \
                    distributed/optimizer_file.h kernels/die.h kernels/host_device.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_peft.cpp -o $@
# QLoRA's NF4 storage on the host (model/nf4.h: std::thread, no OpenMP), against scripts/reference/nf4_reference.py
$(BUILD)/test_nf4: test/test_nf4.cpp model/nf4.h model/model_file.h model/config.h model/file_integrity.h kernels/die.h kernels/host_device.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_nf4.cpp -o $@
$(BUILD)/test_layout: test/test_layout.cpp model/config.h model/model_file.h model/file_integrity.h kernels/host_device.h kernels/die.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_layout.cpp -o $@
$(BUILD)/test_checkpoints: test/test_checkpoints.cpp test/private_mount.h $(CHECKPOINT_HDRS) | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_checkpoints.cpp -o $@
$(BUILD)/test_checkpoint_crash: test/test_checkpoint_crash.cpp $(CHECKPOINT_HDRS) | $(BUILD)
	$(CXX) $(CXX_FLAGS) test/test_checkpoint_crash.cpp -o $@
$(BUILD)/test_offload_dir: test/test_offload_dir.cpp test/private_mount.h distributed/optimizer_file.h model/run_identity.h kernels/adamw_cpu.h kernels/host_device.h kernels/die.h test/check.h | $(BUILD)
	$(CXX) $(CXX_FLAGS) -fopenmp test/test_offload_dir.cpp -o $@

$(BUILD)/test_sharding: test/test_sharding.cu train_gpt.cu test/check.h $(KERNELS) $(DATALOADER_SRCS) $(DATALOADER_HDRS) $(DISTRIBUTED_SRCS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_sharding.cu $(DATALOADER_SRCS) $(DISTRIBUTED_SRCS) $(CUDA_LIBS) -o $@

$(BUILD)/test_lora_files: test/test_lora_files.cu train_gpt.cu test/cpu_reference.cpp test/cpu_reference.h test/check.h $(KERNELS) $(DATALOADER_SRCS) $(DATALOADER_HDRS) $(DISTRIBUTED_SRCS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_lora_files.cu test/cpu_reference.cpp $(DATALOADER_SRCS) $(DISTRIBUTED_SRCS) $(CUDA_LIBS) -o $@

$(BUILD)/test_formats: test/test_formats.cu train_gpt.cu test/check.h $(KERNELS) $(DATALOADER_SRCS) $(DATALOADER_HDRS) $(DISTRIBUTED_SRCS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_formats.cu $(DATALOADER_SRCS) $(DISTRIBUTED_SRCS) $(CUDA_LIBS) -o $@

$(BUILD)/test_fp8_model: test/test_fp8_model.cu train_gpt.cu test/gpu_check.h test/check.h $(KERNELS) $(DATALOADER_SRCS) $(DATALOADER_HDRS) $(DISTRIBUTED_SRCS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_fp8_model.cu $(DATALOADER_SRCS) $(DISTRIBUTED_SRCS) $(CUDA_LIBS) -o $@

$(BUILD)/test_model: test/test_model.cu train_gpt.cu test/debug_state.h test/check.h $(KERNELS) $(DATALOADER_SRCS) $(DATALOADER_HDRS) $(DISTRIBUTED_SRCS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_model.cu $(DATALOADER_SRCS) $(DISTRIBUTED_SRCS) $(CUDA_LIBS) -o $@

$(BUILD)/test_tensor_parallel_layers: test/test_tensor_parallel_layers.cu train_gpt.cu test/check.h $(KERNELS) $(DATALOADER_SRCS) $(DATALOADER_HDRS) $(DISTRIBUTED_SRCS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) test/test_tensor_parallel_layers.cu $(DATALOADER_SRCS) $(DISTRIBUTED_SRCS) $(CUDA_LIBS) -o $@

# Fuzzing (test/fuzz/): a libFuzzer harness per parser of outside input, built with clang++ (FUZZ_CXX) under
# AddressSanitizer and UndefinedBehaviorSanitizer, with die() throwing (kernels/die.h). `make fuzz` builds them and
# runs each for FUZZ_SECONDS (the Python safetensors reader's fuzz loop too); `make test`'s suite fuzz runs them for
# 10 s each.
FUZZ_CXX ?= clang++
FUZZ_FLAGS = -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DDIE_THROWS -I.
FUZZ_SECONDS ?= 60
FUZZ_HARNESSES = shards model_file state_file manifest adapter_file peft_folder tokenizer_files tokenizer_json vocab_bpe tokenize hellaswag train_options chat_jsonl mask_shards
FUZZ_DATALOADER_OBJS = $(DATALOADER_SRCS:dataloader/%.cpp=$(BUILD)/fuzz/dataloader_%.o)
FUZZ_HDRS = test/fuzz/fuzz_util.h test/fuzz/fuzz_gpt2.h $(DATALOADER_HDRS) $(wildcard model/*.h) kernels/die.h kernels/host_device.h distributed/mesh.h \
            distributed/pipeline_schedule.h train_options.h

fuzz-build: $(FUZZ_HARNESSES:%=$(BUILD)/fuzz/fuzz_%)

fuzz: fuzz-build
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash test/fuzz/run_fuzz.sh

$(BUILD)/fuzz:
	mkdir -p $@

# the dataloader objects are kept (a pattern rule's intermediates would be deleted after each build)
.PRECIOUS: $(BUILD)/fuzz/dataloader_%.o
$(BUILD)/fuzz/dataloader_%.o: dataloader/%.cpp $(DATALOADER_HDRS) | $(BUILD)/fuzz
	$(FUZZ_CXX) $(FUZZ_FLAGS) -c $< -o $@

$(BUILD)/fuzz/fuzz_%: test/fuzz/fuzz_%.cpp $(FUZZ_HDRS) $(FUZZ_DATALOADER_OBJS) | $(BUILD)/fuzz
	$(FUZZ_CXX) $(FUZZ_FLAGS) $< $(FUZZ_DATALOADER_OBJS) -o $@

# `make test`: the quick tier (TEST_TIER=quick, test/run_tests.sh); `make test-full`: every check. Both build `all`
# and `tests` first, with one job per core unless make was given -j. SUITES="kernels attention ..." runs only the
# suites of those names (run_tests.sh's labels).
BUILD_JOBS = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc))
test test-full:
	$(MAKE) --no-print-directory $(BUILD_JOBS) all tests
	TEST_TIER=$(if $(filter test-full,$@),full,quick) TEST_SUITES="$(SUITES)" bash test/run_tests.sh

# The full suite on a build with compute_80 PTX only (no sm_90a code), which the driver compiles for the GPU at
# load: on a Hopper GPU this runs and checks the mma.sync kernels that Ampere, Ada and Blackwell GPUs run. The
# JIT cache is raised to hold every kernel, so only the first run of each program compiles.
test-portable:
	CUDA_CACHE_MAXSIZE=4294967296 $(MAKE) GPU_ARCH="-gencode arch=compute_80,code=compute_80" test-full

# The default job: a small GPT-2 (d12) trained from scratch on tinyshakespeare for a few minutes.
train: all
	@ls data/tinyshakespeare/tinyshakespeare_train_*.bin > /dev/null 2>&1 || bash scripts/data/prepare_tinyshakespeare.sh
	./train_gpt --model d12 --batch-size 32 --seq-len 512 --steps 250 --lr 6e-4 --warmup-steps 25 --final-lr-frac 0.1 \
	    --val-every 50 --val-batches 8 --sample-every 125 --sample-tokens 128 --checkpoint-every 250 --output-dir log/tinyshakespeare

clean:
	rm -rf $(BUILD) train_gpt
