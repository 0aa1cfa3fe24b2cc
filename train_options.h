// train_options.h: train_gpt's command line. Options holds every flag's value; one table (flag_table) drives the
// parser, --help and each flag's range or choices, so they cannot disagree (test_cli checks every message).
// validate_options adds the checks that need several flags at once and turns the options into the run's shape:
// the process mesh, the model's configuration, the pipeline's schedule and layer split, the LoRA adapters, what
// ZeRO-Offload runs with. None of it touches a GPU, so every flag and shape error comes before one is used. What the
// run does is train_gpt.cu's.
// defines: Options, parse_options, print_help, PipelineOptions, micro_batches_per_step, RunShape, validate_options
#pragma once
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <string>
#include <vector>
#include <sys/stat.h>
#include "kernels/die.h"                    // defines: die
#include "distributed/mesh.h"               // defines: MeshShape, mesh_shape_problem
#include "distributed/pipeline_schedule.h"  // defines: PipelineScheduleKind, pipeline_layer_split, pipeline_balanced_split, lm_head_work
#include "model/config.h"                   // defines: ModelConfig, config_from_descriptor, config_problem, tensor_parallel_problem, kMaxLayers
#include "model/lora.h"                     // defines: LoraSpec, read_adapter_file, parse_lora_targets
#include "model/peft_adapters.h"            // defines: is_peft_folder_path, read_peft_folder, peft_targets_problem
#include "model/model_file.h"               // defines: read_model_config
#include "distributed/optimizer_file.h"     // defines: optimizer_file_bytes, offload_dir_problem, offload_dir_space_problem

// ---------------------------------------------------------------------------------------------
// Command-line flags. One table drives both the parser and --help, so they cannot disagree.

struct Options {
    std::string model = "d12";  // dN, a Llama-family preset, or a model file to start from
    int layers = -1, heads = -1, channels = -1, max_seq_len = -1;  // override the dN or preset shape (random init only)
    std::string arch;                                               // gpt2 | llama (empty: --model's family)
    int kv_heads = -1, ffn = -1, vocab = -1, qkv_bias = -1, tied_head = -1;
    float norm_eps = -1.0f, rope_theta = -1.0f;
    std::string rope_scaling;  // "off" or FACTOR,LOW,HIGH,POSITIONS (empty: the preset's)
    std::string train_data = "data/tinyshakespeare/tinyshakespeare_train_*.bin";
    std::string val_data = "data/tinyshakespeare/tinyshakespeare_val_*.bin";
    std::string tokenizer = "data/gpt2";
    int batch_size = 4;
    int seq_len = 1024;
    long total_batch_tokens = -1;  // -1: one micro-batch per step
    std::string precision = "bf16";
    int fp8_stats = 0;
    std::string fp8_scaling = "current";
    int fp8_amax_history = -1;  // -1: kFp8DefaultAmaxHistory (16) with delayed scaling
    int tf32 = 0;
    float lr = 3e-4f;
    int warmup_steps = 0;
    std::string lr_schedule = "cosine";
    float final_lr_frac = 1.0f;
    float weight_decay = 0.1f;
    float grad_clip = 1.0f;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    int steps = -1;  // -1: one epoch of the training data
    int val_every = 20, val_batches = 20;
    int sample_every = 20, sample_tokens = 64, top_k = 40;
    float temperature = 1.0f;
    int kv_cache = 1;
    int stop_at_end = 1;  // sampling stops after the model's end-of-text token
    int hellaswag = 0;
    std::string hellaswag_data = "data/hellaswag/hellaswag_val.jsonl.xz";
    std::string prompt = "";
    int generate = 0;  // > 0: only generate this many tokens from --prompt with --model, no training
    std::string output_dir = "";
    int checkpoint_every = 0;
    int keep_checkpoints = 0;  // 0: keep every checkpoint
    int keep_every = 0;        // 0: no milestones
    int resume = 0;
    int overwrite_output = 0;  // 1: a fresh run moves another run's checkpoints in --output-dir aside
    std::string verify_checkpoints = "";  // a folder: check its checkpoints' files, print, exit (no GPU)
    int max_skipped_steps = 16;
    long seed = 1337;
    int shuffle = 1;  // a seeded random order, as llm.c and nanoGPT draw their windows
    float fp16_initial_scale = 65536.0f;
    int fp16_growth_interval = 2000;
    int zero_stage = 1;
    std::string offload = "none";
    int offload_delayed_update = 0;
    float host_memory_gib = -1.0f;  // -1: MemTotal
    std::string offload_dir;        // ZeRO-Offload's NVMe tier: the optimizer files' folder (empty: host memory)
    int tensor_parallel = 1;
    int sequence_parallel = 0;
    int pipeline_parallel = 1;
    std::string pipeline_schedule = "1f1b";
    int virtual_stages = 0;  // 0: 2 for the interleaved schedule, 1 for 1f1b
    std::string pipeline_layers = "";
    int lora_rank = 0;
    float lora_alpha = -1.0f;  // -1: the rank
    std::string lora_targets = "qkv";
    float lora_dropout = 0.0f;
    float lora_weight_decay = 0.0f;
    std::string lora_load = "", lora_save = "", lora_merge = "";
    std::string base_quant = "none";  // nf4: the frozen base's linear weights in QLoRA's 4-bit NF4 (with LoRA)
    std::string nf4_products = "dequantized";  // how the products read the NF4 base: dequantized | packed
    int nf4_double_quant = 1;                  // the NF4 base's absmaxes in 8 bits (1) or in fp32 (0)
    int deterministic = 0;
    int parameter_checksums = 0;
    int gelu_fusion = 1;
    int recompute = 0;
    std::string nccl_init_file = "";
    int nccl_timeout = 600;
    int dry_run = 0;                // 1: every check that needs no GPU, the plan printed, exit (train_gpt.cu's dry_run)
    float dry_run_gpu_gib = 80.0f;  // the free GPU memory the dry run checks the memory plan against
};

// What a flag accepts: numbers in a range, each bound inclusive or exclusive (with -1 as well where -1 means
// "from elsewhere"), or one of a list of choices (integers as std::to_string writes them). Integer flags are also
// bounded by their type, so that no value is cut to fit, and float flags take finite values only.
struct Accepts {
    double lo = -INFINITY, hi = INFINITY;
    bool lo_open = false, hi_open = false;
    bool minus_one = false;
    std::vector<std::string> choices;
};
static Accepts anything() { return {}; }
static Accepts at_least(double lo) { Accepts a; a.lo = lo; return a; }
static Accepts above(double lo) { Accepts a; a.lo = lo; a.lo_open = true; return a; }
static Accepts closed(double lo, double hi) { Accepts a; a.lo = lo; a.hi = hi; return a; }                       // [lo, hi]
static Accepts open_interval(double lo, double hi) { Accepts a = above(lo); a.hi = hi; a.hi_open = true; return a; }  // (lo, hi)
static Accepts half_open(double lo, double hi) { Accepts a; a.lo = lo; a.hi = hi; a.hi_open = true; return a; }  // [lo, hi)
static Accepts or_minus_one(Accepts a) { a.minus_one = true; return a; }
static Accepts one_of(std::vector<std::string> choices) { Accepts a; a.choices = std::move(choices); return a; }
static const Accepts kOffOn = one_of({"0", "1"});

struct Flag {
    const char* name;
    const char* alias;  // llm.c's single-letter flag where one exists
    enum Kind { INT, LONG, FLOAT, STRING } kind;
    void* target;
    Accepts accepts;
    const char* help;
};

// Whether any flag that shapes only a Llama-family model was given.
inline bool llama_shape_flag_given(const Options& o) {
    return o.kv_heads > 0 || o.ffn > 0 || o.vocab > 0 || o.qkv_bias >= 0 || o.tied_head >= 0 || o.norm_eps > 0 || o.rope_theta > 0 ||
           !o.rope_scaling.empty();
}

static std::vector<Flag> flag_table(Options& o) {
    return {
        {"--model", "-e", Flag::STRING, &o.model, anything(), "dN (d12 = 124M, d24, d36, d48 = 1.5B, any N), a Llama-family preset (llama3-1b, llama3-3b, llama3-8b, smollm2-135m, smollm2-360m, qwen2.5-0.5b, qwen2.5-7b), or a model file to start from"},
        {"--arch", nullptr, Flag::STRING, &o.arch, one_of({"gpt2", "llama"}), "the family of a dN model: gpt2 (default) | llama (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases, tied head)"},
        {"--kv-heads", nullptr, Flag::INT, &o.kv_heads, or_minus_one(closed(1, kMaxChannels / 64)), "Llama family: key/value heads, dividing --heads (-1: the preset's; --heads for dN)"},
        {"--ffn", nullptr, Flag::INT, &o.ffn, or_minus_one(closed(8, 4 * kMaxChannels)), "Llama family: the MLP's hidden units, a multiple of 8 (-1: the preset's; for dN 8C/3 rounded up to 256)"},
        {"--vocab", nullptr, Flag::INT, &o.vocab, or_minus_one(closed(2, kMaxVocab)), "Llama family: the vocabulary (-1: the preset's; 50257 for dN, GPT-2's tokenizer)"},
        {"--qkv-bias", nullptr, Flag::INT, &o.qkv_bias, one_of({"-1", "0", "1"}), "Llama family: 1 for biases on q, k and v as Qwen 2.5 (-1: the preset's; 0 for dN)"},
        {"--tied-head", nullptr, Flag::INT, &o.tied_head, one_of({"-1", "0", "1"}), "Llama family: 1 to tie the LM head to the token embeddings, 0 for a head of its own (-1: the preset's; 1 for dN)"},
        {"--norm-eps", nullptr, Flag::FLOAT, &o.norm_eps, or_minus_one(open_interval(0, 1)), "Llama family: the RMSNorms' epsilon (-1: the preset's; 1e-5 for dN)"},
        {"--rope-theta", nullptr, Flag::FLOAT, &o.rope_theta, or_minus_one(above(1)), "Llama family: the rotary embeddings' base (-1: the preset's; 10000 for dN)"},
        {"--rope-scaling", nullptr, Flag::STRING, &o.rope_scaling, anything(), "Llama family: Llama 3's frequency scaling, FACTOR,LOW,HIGH,POSITIONS (8,1,4,8192 for Llama 3.1) or off (empty: the preset's; off for dN)"},
        {"--init-from", nullptr, Flag::STRING, &o.model, anything(), "same as --model (a model file)"},
        {"--layers", nullptr, Flag::INT, &o.layers, or_minus_one(closed(1, kMaxLayers)), "override the number of layers (-1: from --model)"},
        {"--heads", nullptr, Flag::INT, &o.heads, or_minus_one(closed(1, kMaxChannels / 64)), "override the number of attention heads (-1: from --model)"},
        {"--channels", nullptr, Flag::INT, &o.channels, or_minus_one(closed(1, kMaxChannels)), "override the width C (-1: from --model)"},
        {"--max-seq-len", nullptr, Flag::INT, &o.max_seq_len, or_minus_one(closed(1, kMaxSeqLen)), "override the maximum sequence length (-1: 1024)"},
        {"--train-data", "-i", Flag::STRING, &o.train_data, anything(), "training token shards (glob)"},
        {"--val-data", "-j", Flag::STRING, &o.val_data, anything(), "validation token shards (glob; empty: none)"},
        {"--tokenizer", nullptr, Flag::STRING, &o.tokenizer, anything(), "the vocabulary of prompts, samples and HellaSwag: a tokenizer.json (or a folder holding one and, optionally, generation_config.json, whose eos_token_id ends samples), a folder with GPT-2's encoder.json and vocab.bpe, or a decode-only llm.c tokenizer file"},
        {"--batch-size", "-b", Flag::INT, &o.batch_size, at_least(1), "sequences per micro-batch on each GPU"},
        {"--seq-len", "-t", Flag::INT, &o.seq_len, closed(1, kMaxSeqLen), "tokens per sequence (at most the model's maximum sequence length)"},
        {"--total-batch-tokens", "-d", Flag::LONG, &o.total_batch_tokens, or_minus_one(closed(1, INT_MAX)), "tokens per optimizer step over all GPUs; gradient accumulation fills it (-1: batch-size x seq-len x GPUs)"},
        {"--precision", nullptr, Flag::STRING, &o.precision, one_of({"bf16", "fp16", "fp32", "fp8"}), "bf16 | fp16 (dynamic loss scaling) | fp32 | fp8 (bf16 training whose blocks' four linear layers multiply in FP8: E4M3 forward, E5M2 output gradients; GPUs of compute capability 8.9+; no LoRA)"},
        {"--fp8-stats", nullptr, Flag::INT, &o.fp8_stats, kOffOn, "1: with --precision fp8, a line per step with the FP8 scaling states: non-finite amaxes and saturated values counted so far, the range of the weights', inputs' and output gradients' scales"},
        {"--fp8-scaling", nullptr, Flag::STRING, &o.fp8_scaling, one_of({"current", "delayed"}), "with --precision fp8, each tensor's scale: current (from its own amax, an extra pass before each cast) | delayed (from the max of its last --fp8-amax-history amaxes, which the casts record; updated once per step; the first step current)"},
        {"--fp8-amax-history", nullptr, Flag::INT, &o.fp8_amax_history, or_minus_one(closed(1, 1024)), "with --fp8-scaling delayed, the amaxes per tensor that its scale comes from (-1: 16)"},
        {"--tf32", nullptr, Flag::INT, &o.tf32, kOffOn, "1: allow TF32 matrix products in fp32 mode"},
        {"--lr", "-l", Flag::FLOAT, &o.lr, at_least(0), "maximum learning rate"},
        {"--warmup-steps", "-u", Flag::INT, &o.warmup_steps, at_least(0), "linear warm-up steps"},
        {"--lr-schedule", nullptr, Flag::STRING, &o.lr_schedule, one_of({"cosine", "linear", "constant"}), "decay after warm-up"},
        {"--final-lr-frac", "-q", Flag::FLOAT, &o.final_lr_frac, closed(0, 1), "final learning rate as a fraction of --lr"},
        {"--weight-decay", "-c", Flag::FLOAT, &o.weight_decay, at_least(0), "AdamW weight decay (matrices and embeddings only)"},
        {"--grad-clip", nullptr, Flag::FLOAT, &o.grad_clip, at_least(0), "clip the global gradient norm to this (0: off)"},
        {"--beta1", nullptr, Flag::FLOAT, &o.beta1, half_open(0, 1), "AdamW beta1"},
        {"--beta2", nullptr, Flag::FLOAT, &o.beta2, half_open(0, 1), "AdamW beta2"},
        {"--eps", nullptr, Flag::FLOAT, &o.eps, above(0), "AdamW epsilon"},
        {"--steps", "-x", Flag::INT, &o.steps, or_minus_one(at_least(0)), "optimizer steps (-1: one epoch of --train-data; 0: only evaluate)"},
        {"--val-every", "-v", Flag::INT, &o.val_every, at_least(0), "validation loss every N steps (0: never)"},
        {"--val-batches", "-m", Flag::INT, &o.val_batches, at_least(1), "batches per validation"},
        {"--hellaswag", nullptr, Flag::INT, &o.hellaswag, kOffOn, "1: HellaSwag accuracy at every validation (with --steps 0: evaluate only)"},
        {"--hellaswag-data", nullptr, Flag::STRING, &o.hellaswag_data, anything(), "HellaSwag items (jsonl, plain or .xz)"},
        {"--sample-every", "-s", Flag::INT, &o.sample_every, at_least(0), "print a text sample every N steps (0: never)"},
        {"--sample-tokens", "-g", Flag::INT, &o.sample_tokens, at_least(1), "tokens per sample"},
        {"--temperature", nullptr, Flag::FLOAT, &o.temperature, at_least(0), "sampling temperature (0: the most likely token)"},
        {"--top-k", nullptr, Flag::INT, &o.top_k, at_least(0), "sample from the k most likely tokens (0: all)"},
        {"--kv-cache", nullptr, Flag::INT, &o.kv_cache, kOffOn, "1: sampling keeps each block's keys and values, one new position per token; 0: each token re-runs the sequence"},
        {"--stop-at-end", nullptr, Flag::INT, &o.stop_at_end, kOffOn, "1: sampling (--generate and the samples) stops after the tokenizer's end-of-text token, as transformers' generate does; 0: keeps going for the whole count"},
        {"--prompt", nullptr, Flag::STRING, &o.prompt, anything(), "text that samples continue (after <|endoftext|>)"},
        {"--generate", nullptr, Flag::INT, &o.generate, at_least(0), "only generate this many tokens from --prompt with --model, then exit (no training data needed; 0: train)"},
        {"--output-dir", "-o", Flag::STRING, &o.output_dir, anything(), "folder for checkpoints and the log (empty: none)"},
        {"--checkpoint-every", "-n", Flag::INT, &o.checkpoint_every, at_least(0), "write a checkpoint every N steps (0: never)"},
        {"--keep-checkpoints", nullptr, Flag::INT, &o.keep_checkpoints, at_least(0), "keep only the newest K checkpoints whose files are whole, deleting older ones once a new one has committed; the new one is always kept (0: keep all)"},
        {"--keep-every", nullptr, Flag::INT, &o.keep_every, at_least(0), "with --keep-checkpoints: also keep every checkpoint whose step is a multiple of M (0: none)"},
        {"--resume", "-y", Flag::INT, &o.resume, kOffOn, "1: continue from the newest committed checkpoint in --output-dir whose files match its manifest, full and LoRA runs alike (none there: start from scratch)"},
        {"--overwrite-output", nullptr, Flag::INT, &o.overwrite_output, kOffOn, "1: start a fresh run in an --output-dir that holds another run's checkpoints, moving them and log.txt aside into DIR/replaced_DATE_TIME (nothing is deleted); without it such a start is refused"},
        {"--verify-checkpoints", nullptr, Flag::STRING, &o.verify_checkpoints, anything(), "check every checkpoint in this folder (checksums, files present), print a line each and exit: 0 when the newest is whole; no GPU"},
        {"--max-skipped-steps", nullptr, Flag::INT, &o.max_skipped_steps, at_least(0), "stop after K steps in a row skipped for a non-finite loss or gradient norm (0: never stop); 16 lets fp16 halve the default loss scale down to 1"},
        {"--seed", nullptr, Flag::LONG, &o.seed, anything(), "seed for initialisation, shuffling, rounding and sampling"},
        {"--shuffle", nullptr, Flag::INT, &o.shuffle, kOffOn, "1: a seeded random order of shards and windows each epoch (--seed); 0: the files' order"},
        {"--fp16-initial-scale", nullptr, Flag::FLOAT, &o.fp16_initial_scale, above(0), "fp16: initial loss scale"},
        {"--fp16-growth-interval", nullptr, Flag::INT, &o.fp16_growth_interval, at_least(1), "fp16: double the loss scale after this many clean steps"},
        {"--gelu-fusion", "-ge", Flag::INT, &o.gelu_fusion, kOffOn, "1: the MLP's GELU in the cuBLASLt products' epilogues (not with --recompute 1-2 or LoRA on fc/fc-proj); 0: separate kernels"},
        {"--recompute", "-r", Flag::INT, &o.recompute, one_of({"0", "1", "2", "3"}), "activations recomputed in the backward instead of kept: 0 none, 1 GELU, 2 GELU + LayerNorm, 3 whole block"},
        {"--parameter-checksums", nullptr, Flag::INT, &o.parameter_checksums, kOffOn, "1: at the end of a run on several ranks each prints a checksum of its parameters on stderr (replicas must agree; a pass over the whole model on the host: minutes for tens of billions of parameters)"},
        {"--deterministic", nullptr, Flag::INT, &o.deterministic, kOffOn, "1: bitwise reproducible runs (attention dQ summed in a fixed order, cuBLASLt's first heuristic choice for every product); 0: products autotuned at their first call and, except on Hopper, atomic dQ sums, faster"},
        {"--lora-rank", nullptr, Flag::INT, &o.lora_rank, at_least(0), "LoRA: adapter rank r (0: off, train the whole model)"},
        {"--lora-alpha", nullptr, Flag::FLOAT, &o.lora_alpha, or_minus_one(above(0)), "LoRA: alpha; the adapters are scaled by alpha / r (-1: r)"},
        {"--lora-targets", nullptr, Flag::STRING, &o.lora_targets, anything(), "LoRA: comma list of qkv, attn-proj (o), fc, fc-proj (down), q, k, v, gate, up (q, k, v: slices of qkv's output; gate, up: of the Llama family's fc)"},
        {"--lora-dropout", nullptr, Flag::FLOAT, &o.lora_dropout, half_open(0, 1), "LoRA: dropout on the adapters' input while training"},
        {"--lora-weight-decay", nullptr, Flag::FLOAT, &o.lora_weight_decay, at_least(0), "LoRA: AdamW weight decay of A and B"},
        {"--lora-load", nullptr, Flag::STRING, &o.lora_load, anything(), "LoRA: start from this adapter file or PEFT folder (its rank, alpha and targets)"},
        {"--lora-save", nullptr, Flag::STRING, &o.lora_save, anything(), "LoRA: write the adapters to this file at the end (DIR/ or a folder: a PEFT folder)"},
        {"--lora-merge", nullptr, Flag::STRING, &o.lora_merge, anything(), "LoRA: write base + adapters as an llm.c model file at the end"},
        {"--base-quant", nullptr, Flag::STRING, &o.base_quant, one_of({"none", "nf4"}), "LoRA: the frozen base's storage: none (the training precision) | nf4 (QLoRA: the blocks' linear weights in 4-bit NormalFloat with double quantization, 0.516 bytes a weight; embeddings, norms, biases and the LM head stay bf16)"},
        {"--nf4-double-quant", nullptr, Flag::INT, &o.nf4_double_quant, kOffOn, "with --base-quant nf4: 1 double-quantizes the absmaxes to 8 bits (QLoRA's 0.516 bytes a weight); 0 keeps them fp32 (0.5625 bytes a weight), which stores weights imported from a bitsandbytes NF4 folder exactly as bitsandbytes computes with them"},
        {"--nf4-products", nullptr, Flag::STRING, &o.nf4_products, one_of({"dequantized", "packed"}), "with --base-quant nf4, how the blocks' products read the base: dequantized (each block written to bf16 ahead of its products, which cuBLASLt runs; faster at every shape measured) | packed (our kernels dequantize it inside the product; forwards of at most 8 rows, sampling's, in a small-rows kernel)"},
        {"--zero-stage", "-z", Flag::INT, &o.zero_stage, one_of({"0", "1", "2", "3"}), "ZeRO stage with several GPUs: 0 replicate all, 1 shard optimizer state, 2 + gradients, 3 + parameters"},
        {"--offload", nullptr, Flag::STRING, &o.offload, one_of({"none", "optimizer", "optimizer,parameters"}), "ZeRO-Offload: none | optimizer: this rank's shard of the master weights and Adam moments in pinned host memory, AdamW on the CPU (ZeRO stages 1-3) | optimizer,parameters: also the parameter shards (ZeRO-3)"},
        {"--offload-delayed-update", nullptr, Flag::INT, &o.offload_delayed_update, kOffOn, "1: with --offload optimizer, the CPU's AdamW of a step runs while the GPU computes the next step on the parameters without that update (one-step delayed update; the warm-up steps' updates are not delayed, and evaluations, samples and checkpoints wait for the running one)"},
        {"--offload-dir", nullptr, Flag::STRING, &o.offload_dir, anything(), "with --offload: the folder (on a local NVMe disk) where each rank's master weights and Adam moments live, in a file of 12 bytes a parameter of its shard (8 in fp32), read and written tile by tile with direct I/O each step; the host keeps 3 tiles (empty: in host memory)"},
        {"--host-memory-gib", nullptr, Flag::FLOAT, &o.host_memory_gib, or_minus_one(above(0)), "with --offload: the pinned host memory this machine's ranks may take together, in GiB (-1: MemTotal of /proc/meminfo)"},
        {"--tensor-parallel", nullptr, Flag::INT, &o.tensor_parallel, at_least(1), "GPUs that split every layer (Megatron tensor parallelism); the rest of the GPUs are data parallel"},
        {"--sequence-parallel", nullptr, Flag::INT, &o.sequence_parallel, kOffOn, "1: with --tensor-parallel > 1, the LayerNorm and residual activations split along the sequence (less memory)"},
        {"--pipeline-parallel", nullptr, Flag::INT, &o.pipeline_parallel, at_least(1), "GPUs that split the layers into pipeline stages; the gradient-accumulation steps are the micro-batches"},
        {"--pipeline-schedule", nullptr, Flag::STRING, &o.pipeline_schedule, one_of({"1f1b", "interleaved", "zb1"}), "1f1b; interleaved (several model chunks per stage: a smaller bubble; micro-batches a multiple of the stages); zb1 (ZB-H1: weight gradients deferred into 1f1b's idle time; more activation memory)"},
        {"--virtual-stages", nullptr, Flag::INT, &o.virtual_stages, at_least(0), "model chunks per stage for --pipeline-schedule interleaved (0: 2 for interleaved, 1 for 1f1b)"},
        {"--pipeline-layers", nullptr, Flag::STRING, &o.pipeline_layers, anything(), "layers per (virtual) stage, e.g. 3,3,2,4; balanced: the split whose simulated step is shortest, counting the LM head's work on the last stage; empty: an even split, the remainder to the last stages"},
        {"--nccl-init-file", nullptr, Flag::STRING, &o.nccl_init_file, anything(), "several GPUs without MPI: a new file on a shared file system for the NCCL id (empty: TCP to MASTER_ADDR:MASTER_PORT)"},
        {"--nccl-timeout", nullptr, Flag::INT, &o.nccl_timeout, at_least(1), "seconds before a hung or failed rank ends the job"},
        {"--dry-run", nullptr, Flag::INT, &o.dry_run, kOffOn, "1: check everything that needs no GPU (flags, files, data, mesh, step shape and pipeline schedule, the memory plan against --dry-run-gpu-gib), print the plan and exit 0; no GPU or network is touched (the launcher's environment gives the rank and world size)"},
        {"--dry-run-gpu-gib", nullptr, Flag::FLOAT, &o.dry_run_gpu_gib, above(0), "with --dry-run 1: the free memory per GPU, in GiB, that the memory plan must fit in"},
    };
}

static std::string flag_value_string(const Flag& f) {
    char buf[64];
    switch (f.kind) {
        case Flag::INT: return std::to_string(*(int*)f.target);
        case Flag::LONG: return std::to_string(*(long*)f.target);
        case Flag::FLOAT: snprintf(buf, sizeof(buf), "%g", *(float*)f.target); return buf;
        case Flag::STRING: return "\"" + *(std::string*)f.target + "\"";
    }
    return "";
}

// The range of values an integer flag's type holds (all doubles for a float flag).
static double type_min(const Flag& f) { return f.kind == Flag::INT ? INT_MIN : f.kind == Flag::LONG ? (double)LONG_MIN : -INFINITY; }
static double type_max(const Flag& f) { return f.kind == Flag::INT ? INT_MAX : f.kind == Flag::LONG ? (double)LONG_MAX : INFINITY; }

static bool flag_accepts(const Flag& f, double v) {
    const Accepts& a = f.accepts;
    if (!a.choices.empty()) return std::find(a.choices.begin(), a.choices.end(), std::to_string((long long)v)) != a.choices.end();
    if (a.minus_one && v == -1) return true;
    return (a.lo_open ? v > a.lo : v >= a.lo) && (a.hi_open ? v < a.hi : v <= a.hi);
}

// What a flag accepts, in words: for --help (empty when anything goes), or for an error, which spells out the
// bounds of an integer flag's type and says that floats must be finite.
static std::string flag_accepts_string(const Flag& f, bool for_error) {
    const Accepts& a = f.accepts;
    if (!a.choices.empty()) {
        std::string s = "one of ";
        for (size_t i = 0; i < a.choices.size(); i++) s += (i ? ", " : "") + a.choices[i];
        return s;
    }
    if (f.kind == Flag::STRING) return "";
    auto bound = [&](double x, bool upper) {
        if (std::isinf(x) && f.kind == Flag::INT) return std::to_string(upper ? INT_MAX : INT_MIN);
        if (std::isinf(x) && f.kind == Flag::LONG) return std::to_string(upper ? LONG_MAX : LONG_MIN);
        char buf[32];
        snprintf(buf, sizeof(buf), "%.10g", x);
        return std::string(buf);
    };
    const bool no_lo = a.lo <= type_min(f), no_hi = a.hi >= type_max(f);
    const std::string number = f.kind == Flag::FLOAT ? "a finite number" : "an integer";
    std::string s;
    if (no_lo && no_hi) s = for_error ? number + " in [" + bound(a.lo, false) + ", " + bound(a.hi, true) + "]" : "";
    else if (no_hi && (f.kind == Flag::FLOAT || !for_error))
        s = (for_error ? number + " " : "") + (a.lo_open ? "> " : ">= ") + bound(a.lo, false);
    else s = std::string("in ") + (a.lo_open ? "(" : "[") + bound(a.lo, false) + ", " + bound(a.hi, true) + (a.hi_open ? ")" : "]");
    return a.minus_one ? "-1 or " + s : s;
}

static void print_help(const char* program) {
    Options defaults;
    printf("usage: %s [flags]\nTrains GPT-2 on one or more GPUs (several: launch with mpirun, srun or scripts/launch.sh).\n"
           "Flags (in brackets: the default; then the values accepted):\n", program);
    for (const Flag& f : flag_table(defaults)) {
        std::string names = std::string(f.name) + (f.alias ? std::string(", ") + f.alias : "");
        const std::string accepts = flag_accepts_string(f, false);
        printf("  %-26s %s [%s%s]\n", names.c_str(), f.help, flag_value_string(f).c_str(), accepts.empty() ? "" : ("; " + accepts).c_str());
    }
    printf("  %-26s %s\n", "--help, -h", "print this help");
}

// Sets the flag's option from `value` (the flag was given as `given`: its name or its alias), or dies with one
// line naming the flag, the values it accepts and the value given.
static void set_flag(const Flag& f, const std::string& given, const std::string& value) {
    const std::string name = given == f.name ? given : given + " (" + f.name + ")";
    auto refuse = [&](const std::string& shown) { die(name + " must be " + flag_accepts_string(f, true) + ", got " + shown); };
    char* end = nullptr;
    errno = 0;
    switch (f.kind) {
        case Flag::STRING:
            if (!f.accepts.choices.empty() && std::find(f.accepts.choices.begin(), f.accepts.choices.end(), value) == f.accepts.choices.end())
                refuse("'" + value + "'");
            *(std::string*)f.target = value;
            return;
        case Flag::FLOAT: {
            const double v = strtod(value.c_str(), &end);  // not strtof: it sets ERANGE for denormals such as 1e-40
            if (value.empty() || *end != '\0') die("flag " + given + " expects a number, got '" + value + "'");
            const float stored = (float)v;  // checked as stored: 1e39 becomes inf, 1e-50 becomes 0
            if (!std::isfinite(stored) || !flag_accepts(f, stored)) refuse(value);
            *(float*)f.target = stored;
            return;
        }
        case Flag::INT:
        case Flag::LONG: {
            const long long v = strtoll(value.c_str(), &end, 10);
            if (value.empty() || *end != '\0') die("flag " + given + " expects an integer, got '" + value + "'");
            if (errno == ERANGE || v < type_min(f) || v > type_max(f) || !flag_accepts(f, (double)v)) refuse(value);
            if (f.kind == Flag::INT) *(int*)f.target = (int)v;
            else *(long*)f.target = (long)v;
            return;
        }
    }
}

static Options parse_options(int argc, char** argv) {
    Options o;
    std::vector<Flag> table = flag_table(o);
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") { print_help(argv[0]); exit(EXIT_SUCCESS); }
        std::string value;
        bool has_value = false;
        size_t eq = arg.find('=');
        if (arg.rfind("--", 0) == 0 && eq != std::string::npos) { value = arg.substr(eq + 1); arg = arg.substr(0, eq); has_value = true; }
        const Flag* flag = nullptr;
        for (const Flag& f : table)
            if (arg == f.name || (f.alias && arg == f.alias)) flag = &f;
        if (flag == nullptr) die("unknown flag '" + arg + "' (see --help)");
        if (!has_value) {
            if (i + 1 >= argc) die("flag " + arg + " needs a value");
            value = argv[++i];
        }
        set_flag(*flag, arg, value);
    }
    return o;
}

// The pipeline's shape from the flags: schedule, chunks per stage and layers per virtual stage.
struct PipelineOptions {
    PipelineScheduleKind kind = PipelineScheduleKind::kOneFOneB;
    int virtual_stages = 1;
    std::vector<int> per_virtual_stage;
};

// The micro-batches of a step (gradient-accumulation steps, and the pipeline's micro-batches): --total-batch-tokens
// (default: one micro-batch) over the tokens of a micro-batch on all data-parallel ranks; 0 when it does not divide.
static int micro_batches_per_step(const Options& o, int dp) {
    const long per_micro = (long)o.batch_size * o.seq_len * dp;
    const long total = o.total_batch_tokens > 0 ? o.total_batch_tokens : per_micro;
    return total % per_micro == 0 ? (int)(total / per_micro) : 0;
}

// What validate_options makes of the flags: everything train() and generate_only() need besides the flags.
struct RunShape {
    MeshShape shape;                       // data parallel x pipeline parallel x tensor parallel
    PipelineOptions pipeline;
    ModelConfig config;
    std::string initial_model;             // a model file to start from; empty: a random initialisation
    LoraSpec lora;
    std::vector<float> initial_adapters;   // from --lora-load; empty: drawn at start
};

// The checks that need several flags (each flag's own range and choices are parse_options'), for `world` ranks;
// dies with one line naming the flags at the first problem.
inline RunShape validate_options(const Options& o, int world) {
    // the process mesh: data parallel x pipeline parallel x tensor parallel
    const std::string mesh_problem = mesh_shape_problem(world, o.tensor_parallel, o.pipeline_parallel);
    if (!mesh_problem.empty()) die(mesh_problem);
    RunShape run;
    MeshShape& shape = run.shape;
    shape.tp = o.tensor_parallel;
    shape.pp = o.pipeline_parallel;
    shape.dp = world / (o.tensor_parallel * o.pipeline_parallel);
    // each flag's own range and choices are checked by parse_options (the flag table); these checks need several values
    PipelineOptions& pipeline = run.pipeline;
    parse_pipeline_schedule(o.pipeline_schedule, &pipeline.kind);  // one of the table's choices
    pipeline.virtual_stages = o.virtual_stages > 0 ? o.virtual_stages : pipeline.kind == PipelineScheduleKind::kInterleaved ? 2 : 1;
    // model shape: a dN descriptor or a Llama-family preset (plus overrides), or a model file
    ModelConfig& config = run.config;
    std::string descriptor_problem;
    const bool preset = config_from_preset(o.model, config);
    const bool from_file = !preset && !config_from_descriptor(o.model, config, &descriptor_problem);
    if (!descriptor_problem.empty()) die("--model " + o.model + ": " + descriptor_problem);
    struct stat model_stat;
    if (from_file && stat(o.model.c_str(), &model_stat) == 0 && S_ISDIR(model_stat.st_mode))
        die("--model " + o.model + ": is a directory; expected dN (e.g. d12) or an llm.c model file");
    if (from_file) {
        config = read_model_config(o.model);  // its shape and size; each rank reads its part later
        const FileChecksum checksum = check_file_checksum(o.model);  // a damaged download or copy stops here
        if (checksum.status == FileChecksum::kDamaged) die("--model " + checksum.problem);
        if (o.layers > 0 || o.heads > 0 || o.channels > 0 || o.max_seq_len > 0 || !o.arch.empty() || llama_shape_flag_given(o))
            die("--layers/--heads/--channels/--max-seq-len/--arch and the Llama shape flags apply to a dN model or a preset, not to a model file (" +
                o.model + ")");
    } else {
        if (preset && o.arch == "gpt2") die("--arch gpt2: --model " + o.model + " is a Llama-family preset");
        if (!config.llama() && o.arch != "llama" && llama_shape_flag_given(o))
            die("--kv-heads/--ffn/--vocab/--qkv-bias/--tied-head/--norm-eps/--rope-theta/--rope-scaling shape a Llama-family model: add --arch llama "
                "or use a preset (" + std::string(kPresetNames) + ")");
        if (o.layers > 0) config.num_layers = o.layers;
        if (o.heads > 0) config.num_heads = o.heads;
        if (o.channels > 0) config.channels = o.channels;
        if (o.max_seq_len > 0) config.max_seq_len = o.max_seq_len;
        if (o.arch == "llama" && !config.llama()) config = llama_of_shape(config);
        if (o.kv_heads > 0) config.kv_heads = o.kv_heads;
        if (o.ffn > 0) config.ffn = o.ffn;
        if (o.vocab > 0) {
            config.vocab_size = o.vocab;
            config.padded_vocab_size = pad_vocab(o.vocab);
        }
        if (o.qkv_bias >= 0) config.qkv_bias = o.qkv_bias == 1;
        if (o.tied_head >= 0) config.tied_head = o.tied_head == 1;
        if (o.norm_eps > 0) config.norm_eps = o.norm_eps;
        if (o.rope_theta > 0) config.rope_theta = o.rope_theta;
        if (!o.rope_scaling.empty() && !parse_rope_scaling(o.rope_scaling, &config.rope_scaling))
            die("--rope-scaling " + o.rope_scaling + ": expected off or FACTOR,LOW,HIGH,POSITIONS (Llama 3.1: 8,1,4,8192)");
        std::string problem = config_problem(config);
        if (!problem.empty()) die("model " + o.model + ": " + problem);
    }
    const std::string split_problem = tensor_parallel_problem(config, shape.tp);
    if (!split_problem.empty()) die(split_problem);
    // the balanced split simulates the step, which needs a micro-batch count the schedule accepts; otherwise the even
    // split stands in and train() refuses the count with its own message
    const int micro_batches = micro_batches_per_step(o, shape.dp);
    if (o.pipeline_layers == "balanced" && micro_batches > 0 &&
        pipeline_schedule_problem(pipeline.kind, shape.pp, micro_batches, pipeline.virtual_stages, config.num_layers).empty()) {
        const LayerBackwardWork layer = layer_backward_actions_work(pipeline.kind, o.recompute);
        pipeline.per_virtual_stage = pipeline_balanced_split(pipeline.kind, config.num_layers, shape.pp, micro_batches, pipeline.virtual_stages,
                                                             layer.backward, lm_head_work(config.padded_vocab_size, config.channels, o.seq_len),
                                                             layer.weight_gradient);
    } else {
        const std::string layers_problem = pipeline_layer_split(config.num_layers, shape.pp, pipeline.virtual_stages,
                                                                o.pipeline_layers == "balanced" ? "" : o.pipeline_layers, &pipeline.per_virtual_stage);
        if (!layers_problem.empty()) die(layers_problem);
    }
    if (shape.pp > 1 && o.zero_stage >= 2)
        die("--pipeline-parallel " + std::to_string(shape.pp) + " runs with --zero-stage 0 or 1 (got " + std::to_string(o.zero_stage) +
            "): stages 2-3 would reduce-scatter every micro-batch's gradients, which a pipeline's interleaved micro-batches make a "
            "reduction per micro-batch instead of one per step");
    if (o.sequence_parallel && o.seq_len % shape.tp != 0)
        die("--sequence-parallel 1: --seq-len " + std::to_string(o.seq_len) + " must be a multiple of --tensor-parallel " + std::to_string(shape.tp));
    if (o.seq_len > config.max_seq_len && o.generate == 0)  // --generate's window is the model's whole length
        die("--seq-len must be in 1.." + std::to_string(config.max_seq_len) + " (the model's maximum sequence length), got " + std::to_string(o.seq_len));
    if ((long)o.batch_size * o.seq_len > INT_MAX)  // the kernels count a micro-batch's rows in an int
        die("--batch-size x --seq-len = " + std::to_string((long)o.batch_size * o.seq_len) + " tokens per micro-batch must be at most " +
            std::to_string(INT_MAX));
    // LoRA: from flags, or from an adapter file
    LoraSpec& lora = run.lora;
    std::vector<float>& initial_adapters = run.initial_adapters;
    if (!o.lora_load.empty()) {
        lora = is_peft_folder_path(o.lora_load) ? read_peft_folder(o.lora_load, config, 8 * shape.dp, initial_adapters)
                                                : read_adapter_file(o.lora_load, config, 8 * shape.dp, initial_adapters);
        if (o.lora_rank > 0 && o.lora_rank != lora.rank) die("--lora-rank " + std::to_string(o.lora_rank) + " disagrees with " + o.lora_load);
    } else if (o.lora_rank > 0) {
        lora.rank = o.lora_rank;
        lora.alpha = o.lora_alpha > 0.0f ? o.lora_alpha : (float)o.lora_rank;
        lora.targets = parse_lora_targets(o.lora_targets);
        if (lora.targets == 0) die("--lora-targets '" + o.lora_targets + "': expected a comma list of " + kLoraTargetNames);
        const std::string problem = lora_targets_problem(lora.targets, config);
        if (!problem.empty()) die("--lora-targets '" + o.lora_targets + "': " + problem);
    } else if (!o.lora_save.empty() || !o.lora_merge.empty()) {
        die("--lora-save and --lora-merge need LoRA (--lora-rank or --lora-load)");
    }
    lora.dropout = o.lora_dropout;
    if (lora.enabled() && is_peft_folder_path(o.lora_save)) {  // refused now, not after the training
        const std::string problem = peft_targets_problem(lora.targets, config);
        if (!problem.empty()) die("--lora-save " + o.lora_save + ": " + problem);
    }
    if (lora.enabled() && o.zero_stage == 3 && world > 1) die("LoRA runs with --zero-stage 0, 1 or 2 (the frozen base is replicated)");
    if (lora.enabled() && shape.tp > 1)
        die("LoRA runs with --tensor-parallel 1 (got " + std::to_string(shape.tp) + "): fine-tune on data-parallel ranks, whose frozen base is replicated");
    if (lora.enabled() && o.generate > 0) die("--generate runs a model file: merge the adapters first (--lora-merge)");
    // QLoRA's NF4 base: frozen weights under LoRA, dequantized for bf16 (or fp32) products, whole blocks on one rank
    if (o.base_quant == "nf4") {
        if (!lora.enabled()) die("--base-quant nf4 quantizes the frozen base of a LoRA run: add --lora-rank (or --lora-load)");
        if (o.precision == "fp8" || o.precision == "fp16")
            die("--base-quant nf4 runs in --precision bf16 (or fp32), got " + o.precision + ": the weights are dequantized to the training precision for the products");
        lora.nf4_base = true;
        if (o.nf4_products == "packed" && o.precision != "bf16")
            die("--nf4-products packed multiplies in bf16, got --precision " + o.precision + ": use --nf4-products dequantized");
        lora.nf4_products = o.nf4_products == "packed" ? Nf4Products::kPacked : Nf4Products::kDequantized;
        lora.nf4_double_quant = o.nf4_double_quant != 0;
    } else if (o.nf4_products != "dequantized") {
        die("--nf4-products " + o.nf4_products + " chooses how the products read an NF4 base: add --base-quant nf4");
    } else if (o.nf4_double_quant != 1) {
        die("--nf4-double-quant " + std::to_string(o.nf4_double_quant) + " chooses how the NF4 base keeps its absmaxes: add --base-quant nf4");
    }
    // ZeRO-Offload: the host holds a data-parallel rank's shard of the optimizer state (ZeRO stages 1-3; one GPU counts
    // as one rank's shard of everything), at stage 3 optionally its parameter shard too
    if (o.offload != "none") {
        if (o.zero_stage == 0)
            die("--offload " + o.offload + " runs with --zero-stage 1, 2 or 3 (got 0): the host holds a data-parallel rank's shard of the "
                "optimizer state, which stage 0 does not shard");
        if (o.offload == "optimizer,parameters" && o.zero_stage != 3)
            die("--offload optimizer,parameters runs with --zero-stage 3 (got " + std::to_string(o.zero_stage) + "): only stage 3 shards the parameters");
        if (o.offload == "optimizer,parameters" && shape.dp < 2)
            die("--offload optimizer,parameters needs at least 2 data-parallel ranks (got " + std::to_string(shape.dp) + "): on one rank ZeRO-3 keeps "
                "the whole parameters on the GPU; --offload optimizer moves its optimizer state");
        if (shape.pp > 1)
            die("--offload runs with --pipeline-parallel 1 (got " + std::to_string(shape.pp) + "): a pipeline runs ZeRO stages 0-1, whose GPUs "
                "keep the whole stage's parameters and gradients anyway; offload over data-parallel ranks at --zero-stage 2 or 3 instead");
        if (lora.enabled())
            die("--offload runs without LoRA: the adapters' optimizer state is a few MiB, and the frozen base has none");
    } else if (o.host_memory_gib != -1.0f) {
        die("--host-memory-gib bounds the pinned host memory of --offload, which is none");
    }
    if (o.offload_delayed_update && o.offload == "none")
        die("--offload-delayed-update 1 runs with --offload optimizer (got none): it delays the CPU's update, which runs only with offload");
    if (o.offload_delayed_update && o.offload == "optimizer,parameters")
        die("--offload-delayed-update 1 runs with --offload optimizer (got optimizer,parameters): the next step's gathers read the host's "
            "parameter shard, which the delayed update would be rewriting; --offload optimizer keeps the parameters on the GPU");
    // the NVMe tier: the folder takes this rank's optimizer file (the machine's files together: the start-up plan)
    if (!o.offload_dir.empty()) {
        if (o.offload == "none")
            die("--offload-dir runs with --offload optimizer or optimizer,parameters (got none): it holds the offloaded optimizer state");
        if (o.offload_delayed_update)
            die("--offload-dir runs with --offload-delayed-update 0: the delayed update runs on whole-shard host arrays of the optimizer state");
        const std::string problem = offload_dir_problem(o.offload_dir);
        if (!problem.empty()) die(problem);
        const size_t shard = ParameterLayout(config, 8 * shape.dp, shape.tp).total / shape.dp;  // stages 1-3, or one rank's everything
        const std::string space = offload_dir_space_problem(o.offload_dir, optimizer_file_bytes(shard, o.precision == "fp32" ? 2 : 3), 1);
        if (!space.empty()) die(space);
    }
    // --precision fp8: bf16 training with FP8 products in the blocks' linear layers (model/fp8_linear.cuh): each
    // rank's products on its own slices and stages (data parallelism and ZeRO see only the bf16 parameters and
    // gradients); the GPU's FP8 support is checked once it is there (train_gpt.cu's connect_gpu). The products'
    // widths (C, 3C, 4C, and their 1/tp) are multiples of 16 as FP8 needs: C / tp is a multiple of the head size, 64
    // or 128 (config_problem)
    if (o.precision == "fp8") {
        if (config.hidden_units() / shape.tp % 16 != 0)
            die("--precision fp8 needs the MLP's hidden units per tensor-parallel rank to be a multiple of 16 (FP8 products' widths), got " +
                std::to_string(config.hidden_units()) + " / " + std::to_string(shape.tp));
        if (lora.enabled())
            die("--precision fp8 runs without LoRA: the adapters add to the products in bf16; fine-tune in --precision bf16");
        if ((long)o.batch_size * o.seq_len % 16 != 0)
            die("--precision fp8 needs --batch-size x --seq-len to be a multiple of 16, got " + std::to_string(o.batch_size) + " x " +
                std::to_string(o.seq_len) + " = " + std::to_string((long)o.batch_size * o.seq_len) +
                ": the backward's FP8 casts transpose the rows in tiles of 16");
    } else if (o.fp8_stats) {
        die("--fp8-stats 1 runs with --precision fp8 (got " + o.precision + "): it reports the FP8 products' scaling");
    } else if (o.fp8_scaling != "current") {
        die("--fp8-scaling " + o.fp8_scaling + " runs with --precision fp8 (got " + o.precision + "): it chooses the FP8 products' scales");
    }
    if (o.fp8_amax_history != -1 && o.fp8_scaling != "delayed")
        die("--fp8-amax-history " + std::to_string(o.fp8_amax_history) + " runs with --fp8-scaling delayed (got " + o.fp8_scaling +
            "): current scaling keeps no history");
    if (o.resume && o.output_dir.empty()) die("--resume needs --output-dir (where the checkpoints are)");
    if (o.overwrite_output && (o.output_dir.empty() || o.resume))
        die(std::string("--overwrite-output 1 ") + (o.resume ? "and --resume 1 exclude each other: one continues the folder's run, the other replaces it"
                                                              : "needs --output-dir (the folder whose checkpoints it moves aside)"));
    if (o.keep_every > 0 && o.keep_checkpoints == 0)
        die("--keep-every " + std::to_string(o.keep_every) + " needs --keep-checkpoints K (without it every checkpoint is kept)");
    if ((o.keep_checkpoints > 0 || o.checkpoint_every > 0) && o.output_dir.empty())
        die(std::string(o.keep_checkpoints > 0 ? "--keep-checkpoints" : "--checkpoint-every") + " needs --output-dir (where the checkpoints go)");
    if (!o.dry_run && o.dry_run_gpu_gib != Options().dry_run_gpu_gib) {
        char gib[32];
        snprintf(gib, sizeof(gib), "%g", o.dry_run_gpu_gib);
        die(std::string("--dry-run-gpu-gib ") + gib + " runs with --dry-run 1 (got 0): a run checks its memory plan against the GPU's free memory");
    }
    run.initial_model = from_file ? o.model : "";
    return run;
}
