// train_gpt.cu: the training recipe, for one GPU or many (data, tensor, pipeline parallelism and ZeRO, as the flags
// say), read top to bottom:
//   1. the learning-rate schedule, the samples' flags and text (--generate, and the samples during training; the
//      sampler is model/sampling.cuh), the HellaSwag evaluation
//   2. the set-up steps, each called once by train(): the step's shape, the pipeline's stages, the data, the
//      checkpoint to resume, the memory plan and allocation, the starting parameters, the step log
//   3. one training step, the work between steps (evaluation, samples, checkpoints), the stop for a signal, and
//      train() itself
//   4. dry_run (--dry-run 1: the checks that need no GPU, and the plan), and main(): take the stop signals, parse and
//      validate the flags (train_options.h), then train, generate or dry-run
// What it leaves to others: the flags to train_options.h; the model, its memory plan, initial values, losses and
// files to model/; the kernels to kernels/ (one file per layer); the parallel modes to distributed/; data loading
// and the tokenizer to dataloader/. Tests include this file with TESTING defined, which leaves out main().
#include <string>
#include <vector>
#include <cstring>
#include <cerrno>
#include <climits>
#include <cmath>
#include <chrono>
#include <sys/stat.h>
#include <unistd.h>
#include <omp.h>
#include "dataloader/dataloader.h"   // defines: DataLoader (token shards, prefetching, resumable position)
#include "dataloader/tokenizer.h"    // defines: Tokenizer, TokenDecoder (to decode samples)
#include "dataloader/hellaswag.h"    // defines: HellaSwagBatcher (packing and scoring the HellaSwag eval)
#include "kernels/common.cuh"              // defines: die (kernels/die.h), cudaCheck, the precisions and packed loads
#include "kernels/matmul.cuh"             // defines: matmul_setup, matmul_teardown, matmul_context (cuBLASLt handle, autotuning)
#include "distributed/process_group.h"    // defines: ProcessGroup (ranks, NCCL communicator, bootstrap, heartbeats)
#include "distributed/stop_signals.h"     // defines: install_stop_signals, accept_stop_requests, stop_signal_received, kExitStopped
#include "distributed/mesh.h"             // defines: MeshShape, ProcessMesh (rank arithmetic; tp, pp, dp communicators)
#include "distributed/zero.cuh"           // defines: ZeroOptimizer (ZeRO stages 0-3: sharding, collectives, AdamW)
#include "distributed/pipeline_schedule.h"  // defines: make_pipeline_schedule (1F1B, interleaved, ZB-H1), pipeline_layer_split
#include "distributed/pipeline_parallel.cuh"  // defines: PipelineParallel (runs a stage's schedule: compute and transfers)
#include "model/config.h"                 // defines: ModelConfig, config_problem, StageModel, pipeline_stage_model, ParameterLayout
#include "model/lora.h"                   // defines: LoraSpec, AdapterLayout, read_adapter_file, write_adapter_file, merge_adapters
#include "model/model_file.h"             // defines: read_model_header, read_model_config, read_model_part, write_model_file (llm.c model files)
#include "model/transformer.cuh"          // defines: Transformer (allocation, initialisation, forward, backward), MemoryPlan
#include "model/memory_plan.h"            // defines: StagePlans, report_memory_plan, zero_states_formula, gib, device_memory_in_use
#include "model/initialization.cuh"         // defines: init_parameters (GPT-2's initialisation, on the device)
#include "model/whole_model.cuh"          // defines: set_adapters (a pipeline stage keeps its blocks' adapters)
#include "model/checkpoint.cuh"           // defines: save_checkpoint, load_checkpoint, latest_checkpoint, make_directories, save_lora_outputs
#include "model/checksums.h"              // defines: print_parameter_checksums
#include "model/run_identity.h"           // defines: new_run_id, run_id_text (a run's id, which its files carry)
#include "model/sampling.cuh"             // defines: SamplingRule, generate (sampling with a KV cache)
#include "train_options.h"                // defines: Options, parse_options, validate_options, RunShape, micro_batches_per_step

// ---------------------------------------------------------------------------------------------
// Learning-rate schedule (docs/formats.md): linear warm-up, then cosine, linear or constant decay to
// final_frac * max_lr at the last step.
inline float learning_rate(int step, int total_steps, float max_lr, int warmup, float final_frac, const std::string& schedule) {
    if (step < warmup) return max_lr * (step + 1) / warmup;
    const float final_lr = max_lr * final_frac;
    const float progress = (float)(step - warmup) / std::max(1, total_steps - warmup);
    if (schedule == "cosine") return final_lr + 0.5f * (max_lr - final_lr) * (1.0f + cosf((float)M_PI * progress));
    if (schedule == "linear") return max_lr - (max_lr - final_lr) * progress;
    return max_lr;
}

// The sampling flags (--temperature, --top-k, --kv-cache) with a seed.

// Encodes prompts and decodes samples with the run's tokenizer (--tokenizer: a tokenizer.json, a folder holding one or
// GPT-2's encoder.json and vocab.bpe, or a decode-only llm.c tokenizer file); token ids without one.
struct SampleText {
    std::unique_ptr<Tokenizer> tokenizer;
    TokenDecoder decoder;
    bool can_decode = false;
    int start = 50256;                // a prompt's first token: the vocabulary's bos, else its end of text (-1: none)
    std::vector<int> ends = {50256};  // where a sample ends (Tokenizer::end_tokens; GPT-2's <|endoftext|> without one)
    explicit SampleText(const std::string& path) {
        struct stat st;
        const bool folder = stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
        const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
        try {
            if (folder || json) {
                tokenizer.reset(new Tokenizer(Tokenizer::load(path)));
                decoder = tokenizer->decoder();
            } else {
                decoder = TokenDecoder::load_llmc(path);
            }
            can_decode = true;
        } catch (const std::exception& e) {
            fprintf(stderr, "warning: no tokenizer (%s): samples are printed as token ids\n", e.what());
        }
        if (tokenizer) {
            start = tokenizer->bos() >= 0 ? tokenizer->bos() : tokenizer->eot();
            const size_t slash = path.rfind('/');
            try {
                ends = tokenizer->end_tokens(folder ? path : slash == std::string::npos ? "." : path.substr(0, slash));
            } catch (const std::exception& e) {
                die(std::string("--tokenizer: ") + e.what());
            }
        } else if (can_decode) {
            start = decoder.eot();
            ends = {decoder.eot()};
        }
    }
    // The start token followed by the prompt's tokens.
    std::vector<int> prompt_tokens(const std::string& prompt) const {
        if (start < 0) die("--tokenizer: the vocabulary names no bos or end-of-text token to start a sample with");
        std::vector<int> tokens = {start};
        if (prompt.empty()) return tokens;
        if (!tokenizer) die("--prompt needs a vocabulary: --tokenizer must be a tokenizer.json or a folder with one (or with encoder.json and vocab.bpe)");
        std::vector<int> encoded = tokenizer->encode(prompt);
        tokens.insert(tokens.end(), encoded.begin(), encoded.end());
        return tokens;
    }
    std::string operator()(const std::vector<int>& ids) const {
        if (can_decode) return decoder.decode(ids);
        std::string s;
        for (int id : ids) s += std::to_string(id) + " ";
        return s;
    }
};

// How the samples are drawn: --temperature, --top-k, the seed, --kv-cache, and where they end (--stop-at-end).
inline SamplingRule sampling_rule(const Options& o, uint64_t seed, const SampleText& text) {
    return {o.temperature, o.top_k, seed, o.kv_cache != 0, o.stop_at_end ? text.ends : std::vector<int>()};
}

// Selects this rank's GPU and connects the ranks; first refuses, with one line and before anything is allocated, a
// GPU that train_gpt cannot run on, or that this binary holds no code for; with fp8 (--precision fp8) also one
// without FP8 tensor cores, or whose code in this binary has no FP8 (kernels/fp8.cuh's fp8_gpu_problem).
static GpuInfo connect_gpu(ProcessGroup& pg, const ProcessGroupOptions& options, bool fp8 = false) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && pg.local_rank < devices) {
        require_supported_gpu(pg.local_rank);
        cudaDeviceProp prop;
        cudaCheck(cudaGetDeviceProperties(&prop, pg.local_rank));
        const std::string problem = fp8 ? fp8_support_problem(prop.name, prop.major, prop.minor) : "";
        if (!problem.empty()) die("--precision fp8: " + problem);
    }
    pg.connect(options);
    const GpuInfo gpu = current_gpu();
    if (fp8 && !fp8_gpu_problem().empty()) die("--precision fp8: " + fp8_gpu_problem());
    return gpu;
}

// --generate: continue --prompt with a trained (or freshly initialised) model, and report the speed.
template <typename floatX>
int generate_only(const Options& o, ProcessGroup& pg, const RunShape& run) {
    const ModelConfig& config = run.config;
    const std::string& model_file = run.initial_model;
    if (pg.world > 1) die("--generate runs on one GPU");
    connect_gpu(pg, {o.nccl_init_file, o.nccl_timeout});
    matmul_setup(o.tf32 != 0);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    {
        const ProcessMesh single;  // one rank: no communicators
        Transformer<floatX> model(config, pg, single, 0, stream);
        model.allocate(1, config.max_seq_len);
        if (!model_file.empty()) model.load_parameters(model_file);
        else init_parameters(model, (uint64_t)o.seed);
        SampleText text(o.tokenizer);
        std::vector<int> prompt = text.prompt_tokens(o.prompt);
        const auto start = std::chrono::steady_clock::now();
        std::vector<int> tokens = generate(model, prompt, o.generate, sampling_rule(o, (uint64_t)o.seed, text));
        const int generated = (int)(tokens.size() - prompt.size());
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        printf("%s\n---\ngenerated %d tokens%s in %.2f s (%.1f tokens/s; %s)\n", text(std::vector<int>(tokens.begin() + 1, tokens.end())).c_str(),
               generated, generated < o.generate ? " (stopped at the end-of-text token; --stop-at-end 0 keeps going)" : "", seconds, generated / seconds,
               o.kv_cache ? "KV cache: one new position per token" : "--kv-cache 0: each token re-runs the sequence");
    }
    cudaCheck(cudaStreamDestroy(stream));
    matmul_teardown();
    return 0;
}

// ---------------------------------------------------------------------------------------------
// HellaSwag: each item's four candidate completions are four rows; the completion whose tokens have the
// lowest mean loss is the model's answer. Candidates are short (at most 149 tokens), so the eval runs the
// model at a reduced sequence length with proportionally more rows: the same activation buffers, a fraction
// of the work of padding every row to T. Under pipeline parallelism the batches go through every stage and the
// last one, which has the losses, scores them; every stage returns its score.

template <typename floatX>
HellaSwagScore evaluate_hellaswag(Transformer<floatX>& model, const std::vector<HellaSwagItem>& items, const Tokenizer& tokenizer) {
    const int B = model.B, T = model.T;
    const int longest = HellaSwagBatcher(items, tokenizer, 4, T).max_length();
    const int multiple = 8 * model.sequence_split();  // sequence parallelism: rows split evenly (T is a multiple of the split)
    const int eval_T = std::min(T, (longest + multiple - 1) / multiple * multiple);
    const int eval_B = std::max(4, (int)((long)B * T / eval_T) / 4 * 4);
    if ((long)eval_B * eval_T > (long)B * T) die("HellaSwag needs --batch-size x --seq-len >= 4 x the longest candidate");
    HellaSwagBatcher batcher(items, tokenizer, eval_B, eval_T);
    const size_t N = (size_t)eval_B * eval_T;
    std::vector<int32_t> inputs(N), targets(N);
    std::vector<uint8_t> mask(N);
    std::vector<float> losses(N);
    HellaSwagScore score;
    model.B = eval_B;
    model.T = eval_T;
    for (int b = 0; b < batcher.num_batches(); b++) {
        batcher.fill(b, inputs.data(), targets.data(), mask.data());
        model.upload_batch(inputs.data(), targets.data());
        forward_all_stages(model, true);
        if (!model.layout.part.last) continue;
        cudaCheck(cudaMemcpyAsync(losses.data(), model.losses, N * sizeof(float), cudaMemcpyDeviceToHost, model.stream));
        cudaCheck(cudaStreamSynchronize(model.stream));
        batcher.score(b, losses.data(), score);
    }
    model.B = B;
    model.T = T;
    if (model.mesh.pipeline.size > 1) {  // the last stage's score (counts below 2^24: exact in floats)
        const std::vector<std::vector<float>> scores =
            gather_over_pipeline(model, {(float)score.items, (float)score.correct_sum, (float)score.correct_mean});
        score = {(int)scores.back()[0], (int)scores.back()[1], (int)scores.back()[2]};
    }
    return score;
}

// ---------------------------------------------------------------------------------------------
// The training loop, and the set-up steps it calls once each

// The batch of a step: B x T tokens per data-parallel rank (its tensor-parallel ranks share the rows), in
// `micro_batches` micro-batches (gradient accumulation; the pipeline's micro-batches).
struct StepShape {
    int B = 0, T = 0, micro_batches = 0;
    long tokens = 0;  // per step, over all data-parallel ranks
};
static StepShape step_shape(const Options& o, const RunShape& run) {
    const MeshShape& shape = run.shape;
    StepShape s{o.batch_size, o.seq_len, micro_batches_per_step(o, shape.dp), 0};
    const long tokens_per_micro = (long)s.B * s.T * shape.dp;
    if (s.micro_batches == 0)
        die("--total-batch-tokens " + std::to_string(o.total_batch_tokens) + " is not a multiple of --batch-size x --seq-len" +
            (shape.dp > 1 ? " x data-parallel ranks (" + std::to_string(shape.dp) + ")" : std::string()) + " = " + std::to_string(tokens_per_micro));
    s.tokens = s.micro_batches * tokens_per_micro;
    const PipelineOptions& po = run.pipeline;  // pipeline parallelism: the gradient-accumulation steps are the micro-batches
    const std::string schedule_problem = pipeline_schedule_problem(po.kind, shape.pp, s.micro_batches, po.virtual_stages, run.config.num_layers);
    if (!schedule_problem.empty()) die(schedule_problem);
    return s;
}

// Every pipeline stage's part of the model, in chunks of blocks, and with several stages the schedule and what it
// predicts for the bubble (one stage, the whole model: no schedule).
struct PipelineStages {
    std::vector<StageModel> parts;
    std::vector<std::vector<int>> chunks;
    std::unique_ptr<PipelineSchedule> schedule;
    PipelineForecast forecast;
    std::vector<int> slots(int s) const { return schedule ? schedule->stages[s].slots : std::vector<int>{1}; }
    // ZB-H1's gradient slots (0 for the other schedules, none without a schedule)
    std::vector<int> grad_slots(int s) const { return schedule ? schedule->stages[s].grad_slots : std::vector<int>(); }
};
static PipelineStages pipeline_stages(const Options& o, const RunShape& run, const StepShape& batch) {
    const PipelineOptions& po = run.pipeline;
    const int P = run.shape.pp;
    PipelineStages p;
    p.chunks.resize(P);
    for (int s = 0; s < P; s++) p.parts.push_back(pipeline_stage_model(po.per_virtual_stage, P, s, &p.chunks[s]));
    if (P > 1) {
        p.schedule.reset(new PipelineSchedule(make_pipeline_schedule(po.kind, P, batch.micro_batches, po.virtual_stages)));
        p.forecast = forecast_pipeline(po.kind, P, batch.micro_batches, po.virtual_stages, po.per_virtual_stage, layer_backward_actions_work(po.kind, o.recompute),
                                       lm_head_work(run.config.padded_vocab_size, run.config.channels, batch.T));
    }
    return p;
}

// The training batches, and the validation batches with --val-every: opened before anything else, so that a bad
// shard is reported first (also on a machine without a GPU). Batches go to pinned memory where a GPU is.
struct RunData {
    std::unique_ptr<DataLoader> train, val;
};
static RunData open_data(const Options& o, const RunShape& run, const MeshCoord& coord, bool have_gpu) {
    HostAllocator pinned{[](size_t bytes) { void* p; cudaCheck(cudaMallocHost(&p, bytes)); return p; },
                         [](void* p) { cudaFreeHost(p); }};
    DataLoaderConfig train_config;
    train_config.pattern = o.train_data;
    train_config.B = o.batch_size;
    train_config.T = o.seq_len;
    train_config.shuffle = o.shuffle != 0;
    train_config.seed = (uint64_t)o.seed;
    train_config.vocab_size = run.config.vocab_size;
    train_config.num_ranks = run.shape.dp;
    train_config.rank = coord.dp;
    train_config.allocator = have_gpu ? pinned : HostAllocator::system();
    RunData data;
    try {
        data.train.reset(new DataLoader(train_config));
        if (!o.val_data.empty() && o.val_every > 0) {
            DataLoaderConfig val_config = train_config;
            val_config.pattern = o.val_data;
            val_config.shuffle = false;
            val_config.fit_to_data = true;  // a validation split shorter than one batch is evaluated over what it holds
            data.val.reset(new DataLoader(val_config));
        }
    } catch (const std::exception& e) {
        die(e.what());
    }
    return data;
}

// A LoRA run's frozen base, as its checkpoints record it: the model file and the checksum in its header (our files
// carry one: no need to read 8B parameters), or its size; or the initialisation's seed.
static std::string base_model_identity(const std::string& path, int seed) {
    if (path.empty()) return "initialised from --seed " + std::to_string(seed);
    int header[256] = {};
    struct stat st;
    const bool read = read_file_header(path, header);
    char crc[32];
    snprintf(crc, sizeof(crc), "crc %08x", (unsigned)header[kChecksumSlot]);
    return path + ", " + (read && header[kChecksumTagSlot] == kChecksumTag ? std::string(crc)
                                                                           : std::to_string(stat(path.c_str(), &st) == 0 ? (long long)st.st_size : -1LL) + " bytes");
}

// The settings a checkpoint's manifest records and a resume compares: the schedule's flags (a difference is reported:
// a longer --steps or a lower --lr after a divergence are deliberate) and the training data's identity (its shards'
// names and sizes: a difference refuses the resume, whose data position would point into other data).
static std::vector<std::pair<std::string, std::string>> run_settings(const Options& o, const RunShape& run, const StepShape& batch,
                                                                     const DataLoader& train_data, int steps) {
    Crc32c shards;
    for (const std::string& path : train_data.shard_paths()) {
        struct stat st;
        const std::string entry = path.substr(path.rfind('/') + 1) + " " + std::to_string(stat(path.c_str(), &st) == 0 ? (long long)st.st_size : -1LL) + "\n";
        shards.update(entry.data(), entry.size());
    }
    char crc[16];
    snprintf(crc, sizeof(crc), "%08x", shards.value());
    auto text = [](double x) {
        char t[32];
        snprintf(t, sizeof(t), "%.9g", x);
        return std::string(t);
    };
    return {{"steps", std::to_string(steps)},
            {"lr", text(o.lr)},
            {"warmup_steps", std::to_string(o.warmup_steps)},
            {"lr_schedule", o.lr_schedule},
            {"final_lr_frac", text(o.final_lr_frac)},
            {"weight_decay", text(o.weight_decay)},
            {"batch", std::to_string(batch.B) + " x " + std::to_string(batch.T) + ", " + std::to_string(batch.tokens) + " tokens a step"},
            {"seed", std::to_string(o.seed)},
            {"train_shards", std::to_string(train_data.num_shards()) + " shards " + crc + " (" + o.train_data + ")"},
            {"base_model", run.lora.enabled() ? base_model_identity(run.initial_model, o.seed) +
                                                    (!run.lora.nf4_base               ? ""
                                                     : run.lora.nf4_double_quant ? ", in NF4 (--base-quant nf4)"
                                                                                 : ", in NF4 with fp32 absmaxes (--base-quant nf4 --nf4-double-quant 0)")
                                              : std::string("none (the checkpoint holds the model)")}};
}

// What every checkpoint of this run records: its id and the settings a resume compares (run_settings).
struct CheckpointIdentity {
    uint64_t run_id;
    std::vector<std::pair<std::string, std::string>> settings;
};

// Where a run starts: a checkpoint (step >= 0, its manifest) or scratch (step -1), and the run's id (the checkpoint's,
// or a new one).
struct StartPoint {
    int step = -1;
    uint64_t run_id = 0;
    CheckpointManifest manifest;
};

// A checkpoint this run could not write is refused before any work is done: a state file records at most
// kStateMaxLayers blocks of a pipeline stage.
static void refuse_uncheckpointable_stages(const Options& o, const PipelineStages& stages) {
    if (o.output_dir.empty()) return;
    for (size_t s = 0; s < stages.parts.size(); s++)
        if ((int)stages.parts[s].layers.size() > kStateMaxLayers)
            die("pipeline stage " + std::to_string(s) + " holds " + std::to_string(stages.parts[s].layers.size()) + " blocks, but a checkpoint's state "
                "file records at most " + std::to_string(kStateMaxLayers) + " a stage: use more pipeline stages (--pipeline-parallel, "
                "--pipeline-layers), or run without --output-dir");
}

// A fresh run (no --resume 1) where checkpoint files are (`held`: folder_checkpoints_text) is refused, unless
// --overwrite-output 1 moves them aside.
static void refuse_foreign_checkpoints(const Options& o, const std::string& held) {
    if (!o.resume && !held.empty() && !o.overwrite_output)
        die("--output-dir " + o.output_dir + " holds " + held + ": continue that run with --resume 1, or start over there with --overwrite-output 1 "
            "(moves them aside), or give another folder");
}

// Checkpoint `step` (its manifest `m`) against this run: the model's shape and the precision (resume_problem), then
// the recorded settings: other training data or another LoRA base refuse the resume; any other difference is a note.
template <typename floatX>
void check_resume_against(const Options& o, const RunShape& run, int step, const CheckpointManifest& m,
                          const std::vector<std::pair<std::string, std::string>>& settings, FILE* out) {
    const std::string problem = resume_problem(o.output_dir, step, run.config, PrecisionOf<floatX>::value, run.lora, run.shape, o.zero_stage);
    if (!problem.empty()) die(problem);
    for (const auto& d : setting_differences(m, settings)) {
        const bool recorded = !m.setting(d.first).empty();
        if (d.first == "base_model" && recorded && run.lora.enabled())
            die(manifest_path(o.output_dir, step) + ": the LoRA run's frozen base differs from the checkpoint's (" + d.second +
                "): its adapters were trained on the other; resume with the same --model");
        if (d.first == "train_shards" && recorded)
            die(manifest_path(o.output_dir, step) + ": the training data differ from the checkpoint's (" + d.second +
                "): its data position would point into other data; resume with the same --train-data, or start a new run from its model with "
                "--model " + checkpoint_path(o.output_dir, "model", step));
        fprintf(out, "note: --resume 1 with a setting that differs from the checkpoint's run: %s\n", d.second.c_str());
    }
}

// Rank 0 starts from `choice` (choose_resume_checkpoint's): its checkpoint, checked against this run
// (check_resume_against); or scratch, under the id of the run whose first save did not commit where the choice found
// one.
template <typename floatX>
void take_choice(const Options& o, const RunShape& run, const ResumeChoice& choice, const std::vector<std::pair<std::string, std::string>>& settings,
                 FILE* out, StartPoint* start) {
    start->step = choice.step;
    start->manifest = choice.manifest;
    if (choice.step < 0) {
        if (choice.run_id != 0) start->run_id = choice.run_id;
        fprintf(out, "--resume 1: no checkpoint in %s, starting from scratch (run %s)\n", o.output_dir.c_str(), run_id_text(start->run_id).c_str());
        return;
    }
    check_resume_against<floatX>(o, run, choice.step, choice.manifest, settings, out);
    start->run_id = choice.manifest.run_id;
}

// --output-dir before the GPU is touched: rank 0 takes the folder's lock (one job a folder); without --resume 1, a
// folder holding checkpoints is refused on every rank (another run's) or, with --overwrite-output 1, moved aside by
// rank 0; with --resume 1, rank 0 chooses the checkpoint (checkpoint_store.h), which must hold this model in this
// precision, and whose recorded settings are compared with this run's. The other ranks learn the choice in
// agree_on_start.
template <typename floatX>
StartPoint prepare_output_dir(const Options& o, const ProcessGroup& pg, const RunShape& run, const std::vector<std::pair<std::string, std::string>>& settings,
                              FILE* out) {
    StartPoint start;
    start.run_id = new_run_id();
    if (o.output_dir.empty()) return start;
    const std::string held = folder_checkpoints_text(o.output_dir);
    if (!pg.is_main() && (o.resume || o.overwrite_output || held.empty())) return start;  // the refusal below on every rank: all end alike
    if (pg.is_main()) lock_output_dir(o.output_dir);
    if (!o.resume) {
        refuse_foreign_checkpoints(o, held);
        if (!held.empty()) fprintf(out, "--overwrite-output 1: moved %s and log.txt aside to %s\n", held.c_str(), move_run_aside(o.output_dir).c_str());
        return start;
    }
    take_choice<floatX>(o, run, choose_resume_checkpoint(o.output_dir, out), settings, out, &start);
    return start;
}

// Every rank starts from rank 0's choice: the run id and the checkpoint, whose own files (own_checkpoint_files) each
// rank gives the cheap check (file_header_problem: its view of the folder may be another node's); their bytes are
// verified by the load, which reads them once (start_parameters). If any rank finds one wanting, rank 0 sets the
// checkpoint aside and chooses again (take_choice: checked against this run as the first choice was), so all ranks
// continue from the same checkpoint or stop together with the reason. Then the other ranks check the checkpoint holds
// this model in this precision (resume_problem), before allocating.
template <typename floatX>
StartPoint agree_on_start(const Options& o, const ProcessGroup& pg, const RunShape& run, const std::vector<std::pair<std::string, std::string>>& settings,
                          StartPoint start, FILE* out) {
    for (;;) {
        const std::vector<uint64_t> chosen = pg.all_gather_host({(uint64_t)(start.step + 1), start.run_id});
        start.step = (int)chosen[0] - 1;
        start.run_id = chosen[1];
        if (start.step < 0) return start;
        std::string problem;
        if (!pg.is_main()) {
            problem = read_manifest(o.output_dir, start.step, &start.manifest);
            for (const FileRecord& f : problem.empty() ? std::vector<FileRecord>() : own_checkpoint_files(start.manifest, pg.rank, pg.world))
                if (problem.empty()) problem = file_header_problem(o.output_dir, f);
            if (!problem.empty()) fprintf(stderr, "rank %d: checkpoint %d: %s\n", pg.rank, start.step, problem.c_str());
        }
        const std::vector<uint64_t> failed = pg.all_gather_host({problem.empty() ? 0u : 1u});
        std::string ranks;
        for (int r = 0; r < pg.world; r++)
            if (failed[r] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        if (ranks.empty()) break;
        if (pg.is_main()) {
            set_checkpoint_aside(o.output_dir, start.step);
            fprintf(out, "--resume 1: set checkpoint %d aside as *.damaged: rank(s) %s found their files of it damaged (their lines on stderr)\n",
                    start.step, ranks.c_str());
            take_choice<floatX>(o, run, choose_resume_checkpoint(o.output_dir, out), settings, out, &start);
        }
    }
    if (!pg.is_main()) {  // rank 0 checked its choice in take_choice
        const std::string problem = resume_problem(o.output_dir, start.step, run.config, PrecisionOf<floatX>::value, run.lora, run.shape, o.zero_stage);
        if (!problem.empty()) die(problem);
    }
    return start;
}

// What --offload moves to the host.
static Offload offload_mode(const std::string& flag) {
    return flag == "optimizer,parameters" ? Offload::kOptimizerParameters : flag == "optimizer" ? Offload::kOptimizer : Offload::kNone;
}

// ZeRO-Offload's CPU threads for one of the `ranks_on_host` ranks of this machine: OpenMP's default team (0) when
// OMP_NUM_THREADS sets it; all the processors this process may run on when a launcher bound it to fewer than the
// machine's; otherwise an equal share of the machine's. The delayed update runs beside the thread that launches the
// next step's kernels, so it leaves that thread a processor (a static split over all of them would wait for the
// thread that shares one).
static int offload_cpu_threads(int ranks_on_host, bool delayed_update) {
    if (getenv("OMP_NUM_THREADS") != nullptr) return 0;
    const int mine = omp_get_num_procs(), online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const int share = mine < online ? mine : std::max(1, online / ranks_on_host);
    return delayed_update ? std::max(1, share - 1) : share;
}

// What the memory plan counts for every pipeline stage (model/memory_plan.h), for a run of these flags whose optimizer
// runs ZeRO stage `stage` (its own: 0 on one data-parallel rank).
template <typename floatX>
StagePlans<floatX> stage_plans(const Options& o, const RunShape& run, const PipelineStages& stages, const StepShape& batch, int stage) {
    const MeshShape& shape = run.shape;
    StagePlans<floatX> plans{run.config, batch.B, batch.T, shape.dp, shape.tp, stage, o.recompute, offload_mode(o.offload), o.offload_delayed_update != 0,
                             run.lora, stages.parts, stages.chunks, {}, !o.offload_dir.empty()};
    // ZB-H1 runs each backward as B and W, which keeps the blocks' output gradients in gradient slots between them
    for (int s = 0; s < shape.pp; s++) {
        plans.slots.push_back(stages.slots(s));
        plans.grad_slots.push_back(stages.grad_slots(s));
    }
    plans.fp8 = o.precision == "fp8";
    plans.fp8_options = {o.fp8_scaling == "delayed", o.fp8_amax_history > 0 ? o.fp8_amax_history : kFp8DefaultAmaxHistory};
    return plans;
}

// The start-up report (model, batch, mesh, pipeline, the memory plan against the GPU's free memory, which refuses a
// run that does not fit; under ZeRO-Offload the host's plan against the machine's budget, which refuses too), then
// the model's allocation and the memory it took. Returns the memory in use before the allocation (the CUDA context
// and whatever else holds the GPU), from which the peak is measured.
template <typename floatX>
size_t plan_and_allocate(FILE* out, Transformer<floatX>& model, std::unique_ptr<PipelineParallel<Transformer<floatX>>>& pipeline, const Options& o,
                         const ProcessGroup& pg, const RunShape& run, const PipelineStages& stages, const StepShape& batch, int steps,
                         uint64_t run_id) {
    const MeshShape& shape = run.shape;
    const ModelConfig& config = run.config;
    const int stage = model.trained().stage(), split = o.sequence_parallel ? shape.tp : 1;
    const int my_stage = mesh_coord(shape, pg.rank).pp;
    const Offload offload = offload_mode(o.offload);
    const bool delayed_update = o.offload_delayed_update != 0;
    const StagePlans<floatX> plans = stage_plans<floatX>(o, run, stages, batch, stage);
    const std::string precision = !plans.fp8 ? o.precision
                                  : !plans.fp8_options.delayed ? "fp8 (current scaling)"
                                  : "fp8 (delayed scaling, amax history " + std::to_string(plans.fp8_options.amax_history) + ")";
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    fprintf(out, "model: %s: %zu parameters\n", config_text(config).c_str(), model.num_parameters());
    fprintf(out, "batch: %d x %d tokens x %d data-parallel ranks, %d micro-steps per step = %ld tokens per step; %d steps; precision %s\n",
            batch.B, batch.T, shape.dp, batch.micro_batches, batch.tokens, steps, precision.c_str());
    const double zero_formula = zero_states_formula((double)model.layout.count, shape.dp, stage, (int)sizeof(floatX), offload);
    if (pg.world > 1)
        fprintf(out, "mesh: %d GPUs (%s) = data parallel %d x pipeline parallel %d x tensor parallel %d; ZeRO stage %d: model states per GPU by "
                     "the formula %.2f GiB for %zu parameters per rank (%s)\n",
                pg.world, pg.launcher.c_str(), shape.dp, shape.pp, shape.tp, stage, gib((size_t)zero_formula), model.layout.count,
                zero_states_words(o.precision == "fp8" ? "bf16" : o.precision, offload).c_str());
    if (stages.schedule) print_pipeline_plan(out, stages.forecast);
    const MemoryPlan plan = report_memory_plan(out, plans, my_stage, split, free_bytes, model.num_parameters(),
                                               model.trainable_parameters(), o.lora_targets);
    if (offload != Offload::kNone) {
        const int ranks_on_host = pg.ranks_on_this_host();
        const int threads = offload_cpu_threads(ranks_on_host, delayed_update);
        const std::string cpu = std::string(adamw_cpu::isa_name(adamw_cpu::best_isa())) + ", " +
                                std::to_string(threads > 0 ? threads : omp_get_max_threads()) + " threads a rank" +
                                (!delayed_update ? "" : o.warmup_steps > 0 ? ", delayed one step after the " + std::to_string(o.warmup_steps) + " warm-up steps"
                                                                            : std::string(", delayed one step"));
        report_host_memory_plan(out, plan.host, ranks_on_host, host_memory_budget(o.host_memory_gib), cpu, o.offload_dir, run_id);
        model.trained().set_offload(offload, threads, delayed_update, o.offload_dir, run_id);
    }
    const size_t in_use_before = device_memory_in_use();
    // the Hopper attention backward's ordered dQ sum is also its faster one (124M B=64 step, one H200: 0.45%
    // faster than with atomic sums), so it is taken there either way
    model.deterministic_attention = o.deterministic != 0 || flash::hopper::available();
    model.linear.gelu_fusion = o.gelu_fusion != 0;
    model.sequence_parallel = split > 1;
    model.linear.fp8 = plans.fp8;
    model.linear.fp8_options = plans.fp8_options;
    model.allocate(batch.B, batch.T, o.recompute, stages.schedule ? stages.slots(my_stage) : std::vector<int>(), stages.grad_slots(my_stage));
    if (stages.schedule) {
        pipeline.reset(new PipelineParallel<Transformer<floatX>>(*stages.schedule, model.mesh.pipeline));
        pipeline->allocate();
    }
    fprintf(out, "device memory in use after allocation: %.2f GiB (plan %.2f GiB + %.2f GiB CUDA context)\n",
            gib(device_memory_in_use()), gib(plan.total()), gib(in_use_before));
    if (const OptimizerFile* file = model.trained().optimizer_file())
        fprintf(out, "optimizer file %s: %.2f GiB preallocated, %d tiles of %.0f MiB, %s\n", file->path().c_str(), gib(file->file_bytes()),
                file->num_tiles(), file->buffer_bytes() / (1024.0 * 1024.0),
                file->direct() ? "direct I/O (O_DIRECT)" : "buffered I/O: the file system refuses direct I/O (O_DIRECT)");
    if (pg.world > 1 && !run.lora.enabled())  // the formula counts shards only; stages 2 and 3 also keep whole units being worked on
        fprintf(out, "model states per GPU: measured %.3f GiB, formula %.3f GiB (%+.1f%%), of which %.3f GiB are unsharded working buffers "
                     "(stage 2: gradients, stage 3: also parameters, of the embeddings, final LayerNorm and a two-block ring)\n",
                gib(model.model_state_bytes), gib((size_t)zero_formula), 100.0 * (model.model_state_bytes / zero_formula - 1.0), gib(plan.working));
    return in_use_before;
}

// The model's starting parameters: a checkpoint's (--resume 1; also the data position; a LoRA run's base from its
// --model or the initialisation first), a model file's, or the GPT-2 initialisation from --seed; LoRA's adapters from
// the checkpoint, --lora-load or drawn. A checkpoint is loaded and verified in one read of its files, and the ranks
// agree on it after the load (load_agreed_checkpoint): a damaged one is set aside and the next older one loaded
// (chosen by rank 0 and agreed as the first was); the data position is restored once they agree. Returns the first
// step to train; `start` becomes the checkpoint loaded.
template <typename floatX>
int start_parameters(FILE* out, Transformer<floatX>& model, DataLoader& train_data, const Options& o, const RunShape& run,
                     const std::vector<std::pair<std::string, std::string>>& settings, StartPoint& start) {
    if (start.step < 0 || run.lora.enabled()) {
        if (!run.initial_model.empty()) model.load_parameters(run.initial_model);
        else init_parameters(model, (uint64_t)o.seed);
    }
    if (start.step >= 0) {
        const ProcessGroup& pg = model.pg;
        DataLoaderState data_state;
        auto load = [&](const CheckpointManifest& m, CheckpointReads& reads) { data_state = load_checkpoint(o.output_dir, m.step, model, reads); };
        auto all_gather = [&](const std::vector<uint64_t>& mine) { return pg.all_gather_host(mine); };
        auto choose_again = [&](int damaged) {
            StartPoint next = start;
            if (pg.is_main()) take_choice<floatX>(o, run, choose_after_damage(o.output_dir, damaged, out), settings, out, &next);
            return agree_on_start<floatX>(o, pg, run, settings, next, out).manifest;
        };
        start.manifest = load_agreed_checkpoint(o.output_dir, start.manifest, pg.rank, pg.world, load, all_gather, choose_again, out);
        start.step = start.manifest.step;
        start.run_id = start.manifest.run_id;
        const int step = start.step;
        try { train_data.restore(data_state); } catch (const std::exception& e) { die(state_path(o.output_dir, step, 0) + ": " + e.what()); }
        fprintf(out, "resumed from %s at step %d\n", manifest_path(o.output_dir, step).c_str(), step);
        return step;
    }
    if (run.lora.enabled()) {
        if (!run.initial_adapters.empty()) set_adapters(model, run.initial_adapters);
        else model.init_adapters((uint64_t)o.seed + 1);
    }
    return 0;
}

// One training step: the step's micro-batches forward and backward (through the pipeline's schedule with several
// stages, which takes all of them at once), then the optimizer, with one wait for the GPU. A stop signal received by
// then is this rank's vote to stop after the step; the report says whether any rank voted.
template <typename floatX>
StepReport train_step(Transformer<floatX>& model, PipelineParallel<Transformer<floatX>>* pipeline, DataLoader& data, const Options& o,
                      const StepShape& batch, int step, const AdamWHyper& h, double* data_seconds) {
    const int m = batch.micro_batches;
    auto next_batch = [&] {
        Batch b;
        try { b = data.next(); } catch (const std::exception& e) { die(e.what()); }
        *data_seconds += b.wait_seconds;
        return b;
    };
    model.zero_grad();
    model.training = true;
    model.lora_hooks.step_key = ((uint64_t)o.seed << 20) ^ ((uint64_t)step << 8);  // with the micro-batch: LoRA's dropout masks
    // masked (chat) data: the loss is the mean over the step's counted targets, on every rank the same count
    float dloss = model.dloss(m);
    if (data.has_masks()) {
        const uint64_t counted = data.counted_targets_ahead(m);
        if (counted == 0) die("--train-data " + o.train_data + ": the masks of step " + std::to_string(step + 1) + "'s batches count no target (expected at least one)");
        model.loss.count_targets(counted);
        dloss = model.dloss_over_counted(counted);
    }
    if (pipeline) {
        std::vector<std::vector<int>> inputs(m), targets(m);
        for (int micro = 0; micro < m; micro++) {
            const Batch b = next_batch();
            inputs[micro].assign(b.inputs, b.inputs + (size_t)batch.B * batch.T);
            targets[micro].assign(b.targets, b.targets + (size_t)batch.B * batch.T);
        }
        pipeline->run_step(model, inputs, targets, dloss);
    }
    for (int micro = 0; micro < m && !pipeline; micro++) {
        model.begin_micro_batch(micro);
        const Batch b = next_batch();
        model.upload_batch(b.inputs, b.targets);
        model.forward(true, dloss);
        model.accumulate_loss();
        model.backward(micro == m - 1);
    }
    model.training = false;
    return model.step(h, stop_signal_received() != 0);
}

// The step log: one line per step on rank 0's stdout and, with --output-dir, in log.txt; MFU against the GPU's dense
// bf16 peak (kernels/gpu_support.h), of all GPUs together; and the closing RESULT line of the benchmarks.
template <typename floatX>
struct StepLog {
    FILE* out = nullptr;
    FILE* file = nullptr;  // --output-dir's log.txt, on the main rank
    double flops_per_token = 0, peak_flops = 0;
    long tokens_per_step = 0;
    int steps = 0;
    size_t in_use_before = 0, peak_memory = 0;  // the peak is ours: without the CUDA context and the other processes
    std::vector<double> step_ms;
    std::vector<typename PipelineParallel<Transformer<floatX>>::StageTiming> stage_timings;  // this rank's stage, per step

    StepLog(FILE* stdout_or_null, const Options& o, bool main_rank, int start_step, const Transformer<floatX>& model, const GpuInfo& gpu, int world,
            const StepShape& batch, int total_steps, size_t memory_before)
        : out(stdout_or_null), tokens_per_step(batch.tokens), steps(total_steps), in_use_before(memory_before) {
        if (!o.output_dir.empty() && main_rank) {
            make_directories(o.output_dir);
            file = fopen((o.output_dir + "/log.txt").c_str(), o.resume ? "a" : "w");  // a resumed run continues its log
            if (file == nullptr) die(o.output_dir + "/log.txt: cannot open for writing");
            // each line reaches the file as it is written, so a run killed later keeps its log (setvbuf only takes
            // effect before the stream's first output)
            setvbuf(file, nullptr, _IOLBF, 0);
            if (start_step == 0) fprintf(file, "# step loss lr grad_norm ms (steps 0-based; validation lines start with '# val')\n");
        }
        // FLOPs per token for forward + backward: 6 per parameter that multiplies (all but wpe) plus attention's
        // scores and weighted sum (12 L C T, counting the masked half as llm.c and PaLM do).
        const ModelConfig& c = model.config;
        // 6 per parameter that multiplies (not wpe's, nor an untied head's wte, which are looked up) and the attention's scores
        const size_t looked_up = (c.has_wpe() ? (size_t)c.max_seq_len * c.channels : 0) + (c.tied_head ? 0 : (size_t)c.padded_vocab_size * c.channels);
        flops_per_token = 6.0 * (model.num_parameters() - looked_up) + 12.0 * c.num_layers * c.channels * batch.T;
        peak_flops = gpu.peak_tflops * 1e12 * world;
    }
    ~StepLog() {
        if (file) fclose(file);
    }
    // fp8: the FP8 tensor cores' dense peak is twice the bf16 one on every GPU that has them (Ada, Hopper, Blackwell);
    // the step log's MFU stays against bf16's, as only the blocks' linear layers multiply in FP8.
    void print_peak(const GpuInfo& gpu, bool fp8) const {
        if (peak_flops > 0 && fp8)
            fprintf(out, "MFU against the dense bf16 peak of %s: %g TFLOP/s per GPU (its dense FP8 peak, 2x: %g TFLOP/s; the MFU against it "
                         "is half the one shown)\n", gpu.name.c_str(), gpu.peak_tflops, 2 * gpu.peak_tflops);
        else if (peak_flops > 0) fprintf(out, "MFU against the dense bf16 peak of %s: %g TFLOP/s per GPU\n", gpu.name.c_str(), gpu.peak_tflops);
        else fprintf(out, "MFU: n/a (%s is not in the table of dense bf16 peaks, kernels/gpu_support.h)\n", gpu.name.c_str());
    }
    std::string mfu_text(double tokens_per_second) const {
        char text[32] = "n/a";
        if (peak_flops > 0) snprintf(text, sizeof(text), "%.1f%%", 100.0 * flops_per_token * tokens_per_second / peak_flops);
        return text;
    }
    void step(int step, const StepReport& r, float lr, double seconds, double data_seconds, PipelineParallel<Transformer<floatX>>* pipeline,
              const PipelineForecast& forecast) {
        const double tokens_per_second = tokens_per_step / seconds;
        fprintf(out, "step %5d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s | MFU %s | data %.2f ms | mem %.1f GiB",
                step + 1, steps, r.loss, lr, r.grad_norm, seconds * 1e3, tokens_per_second, mfu_text(tokens_per_second).c_str(),
                data_seconds * 1e3, gib(device_memory_in_use()));
        if (std::is_same<floatX, __half>::value) fprintf(out, " | scale %g", r.loss_scale);
        fprintf(out, " | skipped %ld%s", r.skipped_steps, r.skipped ? " (this step: non-finite loss or gradients)" : "");
        if (pipeline) {  // rank 0's stage: the first
            stage_timings.push_back(pipeline->measured());
            fprintf(out, " | bubble %.1f%% (theory %.1f%%, with the head %.1f%%)", 100.0 * stage_timings.back().bubble(), 100.0 * forecast.theory,
                    100.0 * forecast.with_work);
        }
        fprintf(out, "\n");
        fflush(out);
        if (file) fprintf(file, "%d %.9g %.9g %.9g %.3f\n", step, r.loss, lr, r.grad_norm, seconds * 1e3);
        step_ms.push_back(seconds * 1e3);
        peak_memory = std::max(peak_memory, device_memory_in_use() - in_use_before);
    }
    // The median step after the first 3 (cuBLAS heuristics, warm-up): tokens/s, ms, peak memory and MFU; then, under
    // pipeline parallelism, every stage's timing (on the first replica's first tensor-parallel rank of each stage).
    void summary(PipelineParallel<Transformer<floatX>>* pipeline, const Transformer<floatX>& model, const PipelineForecast& forecast, bool reports_stage) {
        if (step_ms.size() <= 3) return;
        const double ms = median_of(std::vector<double>(step_ms.begin() + 3, step_ms.end()));
        std::string mfu = mfu_text(tokens_per_step / (ms * 1e-3));
        if (mfu.back() == '%') mfu.pop_back();
        fprintf(out, "RESULT tokens_per_s=%.0f ms_per_step=%.2f peak_mem_gib=%.2f mfu=%s\n", tokens_per_step / ms * 1e3, ms, gib(peak_memory), mfu.c_str());
        if (pipeline && reports_stage)
            pipeline->report_timings(model, std::vector<typename PipelineParallel<Transformer<floatX>>::StageTiming>(stage_timings.begin() + 3, stage_timings.end()),
                                     forecast);
    }
};

// --offload-dir at the end of the run: what this rank's optimizer file moved over `steps` steps (a step reads and writes
// it once; checkpoints and the initialisation add theirs), the I/O thread's rates, and how long the updates waited for
// it (bench/bench_offload_dir measures what the disk itself reaches).
static void report_optimizer_file(FILE* out, const OptimizerFile& file, int steps) {
    const OptimizerFile::Counters c = file.counters();
    const double n = std::max(steps, 1);
    fprintf(out, "optimizer file: %.2f GB read and %.2f GB written a step over %d steps; the disk ran at %.2f GB/s reading and %.2f GB/s "
                 "writing; the update waited %.3f s a step for it\n",
            c.bytes_read / n * 1e-9, c.bytes_written / n * 1e-9, steps, c.read_seconds > 0 ? c.bytes_read / c.read_seconds * 1e-9 : 0.0,
            c.write_seconds > 0 ? c.bytes_written / c.write_seconds * 1e-9 : 0.0, c.wait_seconds / n);
}

// The checkpoint of step `step` committed as one unit (every rank takes part), then, on rank 0, the old ones that
// --keep-checkpoints no longer keeps. Returns whether it committed (on every rank alike).
template <typename floatX>
bool save_and_prune(FILE* out, Transformer<floatX>& model, RunData& data, const Options& o, const ProcessGroup& pg, const CheckpointIdentity& identity,
                    int step) {
    CheckpointManifest manifest;
    manifest.run_id = identity.run_id;
    manifest.step = step;
    manifest.precision = o.precision;
    manifest.data_parallel = model.mesh.data.size;
    manifest.tensor_parallel = model.mesh.tensor.size;
    manifest.pipeline_parallel = model.mesh.pipeline.size;
    manifest.zero_stage = model.trained().stage();
    manifest.settings = identity.settings;
    const bool committed = save_checkpoint(o.output_dir, manifest, model, data.train->state());
    if (!committed) return false;
    fprintf(out, "wrote checkpoint %s (committed: %s)\n", checkpoint_path(o.output_dir, model.lora.enabled() ? "adapters" : "model", step).c_str(),
            manifest_path(o.output_dir, step).c_str());
    if (pg.is_main())
        for (int deleted : prune_checkpoints(o.output_dir, step, identity.run_id, o.keep_checkpoints, o.keep_every, out))
            fprintf(out, "deleted checkpoint %d (--keep-checkpoints %d%s)\n", deleted, o.keep_checkpoints,
                    o.keep_every > 0 ? (", --keep-every " + std::to_string(o.keep_every)).c_str() : "");
    return true;
}

// Between steps, before step `step` (and after the last): HellaSwag and the validation loss every --val-every
// steps, a sample every --sample-every, a checkpoint every --checkpoint-every (then the old ones pruned).
template <typename floatX>
void evaluate_and_save(FILE* out, FILE* log, Transformer<floatX>& model, RunData& data, const Options& o, const ProcessGroup& pg,
                       const CheckpointIdentity& identity, const SampleText& text, const std::vector<int>& prompt, const std::vector<HellaSwagItem>& hellaswag_items, int step, int start_step, int steps) {
    const bool last = step == steps;
    const bool evaluate = o.val_every > 0 && (step % o.val_every == 0 || last);
    const bool hellaswag = evaluate && o.hellaswag, validate = evaluate && data.val;
    const bool sample = o.sample_every > 0 && step > 0 && (step % o.sample_every == 0 || last);
    const bool checkpoint = o.checkpoint_every > 0 && step > start_step && (step % o.checkpoint_every == 0 || last);
    // ZeRO-Offload's delayed update: the last step's update lands first, so that these see every update and a
    // checkpoint holds one consistent state (a run resumed from it lands at the same steps)
    if (hellaswag || validate || sample || checkpoint || last) model.trained().finish_update();
    if (hellaswag) {
        const auto start = std::chrono::steady_clock::now();
        HellaSwagScore score = evaluate_hellaswag(model, hellaswag_items, *text.tokenizer);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        fprintf(out, "step %d: HellaSwag acc_norm %.4f (%d/%d), acc %.4f, %.1f s\n", step, (double)score.correct_mean / score.items,
                score.correct_mean, score.items, (double)score.correct_sum / score.items, seconds);
        if (log) fprintf(log, "# hellaswag step %d acc_norm %.6f acc %.6f\n", step, (double)score.correct_mean / score.items,
                         (double)score.correct_sum / score.items);
    }
    if (validate) {
        DataLoader& val = *data.val;
        const int val_batches = (int)std::min<uint64_t>(o.val_batches, val.batches_per_epoch());
        // a validation split shorter than one batch: the loader's fewer rows (or one shorter row) fill the start of the
        // model's B x T positions, the rest is padding, and only the loader's positions' losses are summed
        const size_t tokens = (size_t)val.B() * val.T(), positions = (size_t)model.B * model.T;
        std::vector<int> inputs(tokens < positions ? positions : 0), targets(inputs.size());
        val.reset();
        if (val.has_masks()) {
            const uint64_t counted = val.counted_targets_ahead(val_batches);
            if (counted == 0) die("--val-data " + o.val_data + ": the masks of its first " + std::to_string(val_batches) + " batches count no target (expected at least one)");
            model.loss.count_targets(counted);
        }
        for (int i = 0; i < val_batches; i++) {
            Batch batch = val.next();
            if (tokens < positions) {
                std::copy(batch.inputs, batch.inputs + tokens, inputs.begin());
                std::copy(batch.targets, batch.targets + tokens, targets.begin());
                model.upload_batch(inputs.data(), targets.data());
            } else {
                model.upload_batch(batch.inputs, batch.targets);
            }
            forward_all_stages(model, true);
            model.loss.accumulate(model.layout.part.last ? model.losses : nullptr, (int)tokens, model.stream);
        }
        // the mean over B x T positions a forward, of which the padding's add nothing
        // (masked data: the mean over the counted targets already, whatever the padding)
        const float val_loss = val.has_masks() ? model.take_mean_loss() : (float)((double)model.take_mean_loss() * positions / tokens);
        const std::string over = tokens == positions ? ""
            : " (over " + std::to_string(val_batches) + (val_batches == 1 ? " batch" : " batches") + " of " + std::to_string(val.B()) + " x " +
                  std::to_string(val.T()) + " tokens a data-parallel rank: --val-data holds fewer tokens than one batch of " +
                  std::to_string(model.B) + " x " + std::to_string(model.T) + ")";
        fprintf(out, "step %d: val loss %.6f%s\n", step, val_loss, over.c_str());
        if (log) fprintf(log, "# val step %d loss %.9g\n", step, val_loss);
    }
    if (sample) {
        std::vector<int> tokens = generate(model, prompt, o.sample_tokens, sampling_rule(o, splitmix64((uint64_t)o.seed ^ (uint64_t)step), text));
        fprintf(out, "step %d sample: %s\n---\n", step, text(std::vector<int>(tokens.begin() + 1, tokens.end())).c_str());
    }
    if (checkpoint) save_and_prune(out, model, data, o, pg, identity, step);
}

// Every rank saw the same norm (summed over all of them) and stops at the same step; rank 0 says why.
static void stop_after_skipped_steps(const Options& o, const ProcessGroup& pg, bool lora, int step, int skipped_in_a_row, const StepReport& r) {
    const std::vector<int> committed = o.output_dir.empty() ? std::vector<int>() : committed_checkpoints(o.output_dir);
    const int newest = committed.empty() ? -1 : committed.back();
    if (!pg.is_main()) exit(EXIT_FAILURE);
    die("step " + std::to_string(step + 1) + ": " + std::to_string(skipped_in_a_row) + " steps in a row (from step " +
        std::to_string(step + 2 - skipped_in_a_row) + ") had a non-finite loss or gradient norm (loss " + std::to_string(r.loss) +
        ", norm " + std::to_string(r.grad_norm) + ") and were skipped (--max-skipped-steps " + std::to_string(o.max_skipped_steps) +
        "); " + (newest >= 0 ? "the newest checkpoint is " + checkpoint_path(o.output_dir, lora ? "adapters" : "model", newest) + " (continue with --resume 1, e.g. with a lower --lr)"
                             : std::string("no checkpoint was written")));
}

// The stop for a signal (distributed/stop_signals.h), after the step `step` that every rank agreed to end with: the
// checkpoint of that step where --output-dir is set (a LoRA run's too, then its --lora-save and --lora-merge files),
// saved as --checkpoint-every saves, and one line in the step log (and log.txt) saying which signal and what was saved. The
// step loop reads the signal only between steps, so a checkpoint being written when it comes is finished first.
// Returns the exit status: kExitStopped once the checkpoint committed (a requeue continues it with --resume 1),
// kExitStoppedUnsaved when nothing a resume could continue was saved.
template <typename floatX>
int stop_for_signal(FILE* out, FILE* log, Transformer<floatX>& model, RunData& data, const Options& o, const ProcessGroup& pg,
                    const CheckpointIdentity& identity, int step, int steps) {
    model.trained().finish_update();  // the delayed update of `step` lands: the checkpoint holds it, no host thread outlives the run
    std::string saved;
    int status = kExitStoppedUnsaved;
    if (!o.output_dir.empty() && save_and_prune(out, model, data, o, pg, identity, step)) {
        saved = "committed checkpoint " + manifest_path(o.output_dir, step) + " (continue with --resume 1)";
        status = kExitStopped;
    } else {
        saved = "nothing saved (no --output-dir)";
    }
    if (model.lora.enabled()) save_lora_outputs(out, model, o.lora_save, o.lora_merge, pg.is_main());
    const int sig = stop_signal_received();
    const std::string why = sig != 0 ? signal_name(sig) : "a signal to another rank";
    fprintf(out, "stopped by %s after step %d/%d: %s; exit status %d\n", why.c_str(), step, steps, saved.c_str(), status);
    if (log) fprintf(log, "# stopped by %s after step %d of %d: %s\n", why.c_str(), step, steps, saved.c_str());
    return status;
}

// The recipe: set up (data, checkpoint to resume, GPU and mesh, model and memory plan, parameters, log), then the
// loop (evaluate and save between steps; train a step; log it; stop there for a signal), then the end of the run
// (summary, LoRA files, checksums). Every rank runs it; rank 0 reports. Returns the exit status: 0, or stop_for_signal's
// after a stop for a signal (one during the last step changes nothing: the run ends as it would have).
template <typename floatX>
int train(const Options& o, ProcessGroup& pg, const RunShape& run) {
    const MeshCoord coord = mesh_coord(run.shape, pg.rank);
    const StepShape batch = step_shape(o, run);
    const PipelineStages stages = pipeline_stages(o, run, batch);
    FILE* out = pg.is_main() ? stdout : fopen("/dev/null", "w");
    int device_count = 0;
    const bool have_gpu = cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0;
    RunData data = open_data(o, run, coord, have_gpu);
    const int steps = o.steps >= 0 ? o.steps : std::max<long>(1, (long)data.train->batches_per_epoch() / batch.micro_batches);
    refuse_uncheckpointable_stages(o, stages);
    const std::vector<std::pair<std::string, std::string>> settings = run_settings(o, run, batch, *data.train, steps);
    StartPoint start = prepare_output_dir<floatX>(o, pg, run, settings, out);
    if (!have_gpu) die("no CUDA GPU found");
    const GpuInfo gpu = connect_gpu(pg, {o.nccl_init_file, o.nccl_timeout}, o.precision == "fp8");
    ProcessMesh mesh;
    mesh.build(pg, run.shape);
    matmul_setup(o.tf32 != 0, o.deterministic == 0);
    start = agree_on_start<floatX>(o, pg, run, settings, start, out);

    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    Transformer<floatX> model(run.config, pg, mesh, o.zero_stage, stream, run.lora, stages.parts[coord.pp], stages.chunks[coord.pp]);
    model.stage_parts = stages.parts;
    std::unique_ptr<PipelineParallel<Transformer<floatX>>> pipeline;
    const size_t in_use_before = plan_and_allocate(out, model, pipeline, o, pg, run, stages, batch, steps, start.run_id);
    if (std::is_same<floatX, __half>::value) model.trained().scaler = {o.fp16_initial_scale, o.fp16_growth_interval};
    const int start_step = start_parameters(out, model, *data.train, o, run, settings, start);
    const CheckpointIdentity identity{start.run_id, settings};
    StepLog<floatX> log(out, o, pg.is_main(), start_step, model, gpu, pg.world, batch, steps, in_use_before);
    SampleText text(o.tokenizer);
    const std::vector<int> sample_prompt = text.prompt_tokens(o.prompt);
    std::vector<HellaSwagItem> hellaswag_items;
    if (o.hellaswag) {
        if (!text.tokenizer) die("--hellaswag needs a vocabulary: --tokenizer must be a tokenizer.json or a folder with one (or with encoder.json and vocab.bpe)");
        try { hellaswag_items = load_hellaswag(o.hellaswag_data); } catch (const std::exception& e) { die(e.what()); }
    }
    log.print_peak(gpu, model.linear.fp8);

    int skipped_in_a_row = 0;  // steps skipped for a non-finite loss or gradient norm, up to this one
    int status = 0;
    accept_stop_requests();
    for (int step = start_step; step <= steps; step++) {
        evaluate_and_save(out, log.file, model, data, o, pg, identity, text, sample_prompt, hellaswag_items, step, start_step, steps);
        if (step == steps) break;
        const auto start = std::chrono::steady_clock::now();
        double data_seconds = 0.0;
        const float lr = learning_rate(step, steps, o.lr, o.warmup_steps, o.final_lr_frac, o.lr_schedule);
        const AdamWHyper h{lr, o.beta1, o.beta2, o.eps, run.lora.enabled() ? o.lora_weight_decay : o.weight_decay, o.grad_clip, 1.0f, step + 1,
                           splitmix64((uint64_t)o.seed + 0x5EED + step)};
        // --offload-delayed-update: the warm-up steps' updates land within their step, as the gradients change fastest
        // there; from then on each runs on the host while the next step computes
        model.trained().delay_update(step >= o.warmup_steps);
        const StepReport r = train_step(model, pipeline.get(), *data.train, o, batch, step, h, &data_seconds);
        log.step(step, r, lr, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), data_seconds, pipeline.get(),
                 stages.forecast);
        if (o.fp8_stats) fprintf(out, "fp8 step %d: %s\n", step + 1, model.linear.fp8_stats().line().c_str());
        skipped_in_a_row = r.skipped ? skipped_in_a_row + 1 : 0;
        if (o.max_skipped_steps > 0 && skipped_in_a_row >= o.max_skipped_steps) stop_after_skipped_steps(o, pg, run.lora.enabled(), step, skipped_in_a_row, r);
        if (r.stop_requested && step + 1 < steps) {
            status = stop_for_signal(out, log.file, model, data, o, pg, identity, step + 1, steps);
            break;
        }
    }

    if (status == 0) {
        log.summary(pipeline.get(), model, stages.forecast, coord.tp == 0 && coord.dp == 0);
        if (const OptimizerFile* file = model.trained().optimizer_file()) report_optimizer_file(out, *file, steps - start_step);
        if (model.linear.fp8) fprintf(out, "fp8 (rank 0's scaling states at the end): %s\n", model.linear.fp8_stats().line().c_str());
        if (run.lora.enabled()) save_lora_outputs(out, model, o.lora_save, o.lora_merge, pg.is_main());
        if (pg.world > 1 && o.parameter_checksums) print_parameter_checksums(model, pg.rank, run.shape, mesh);
    }
    if (out != stdout) fclose(out);
    matmul_teardown();
    mesh.destroy();
    return status;
}

// --dry-run 1: the checks of a run that need no GPU, in the run's order and with the run's messages, each part of the
// plan printed as the run prints it; then exit 0. Touches no GPU and connects to no rank: the rank and world size are
// the launcher's environment's (ProcessGroup::from_environment), and the memory plan is checked against
// --dry-run-gpu-gib instead of the GPU's free memory. Every stage's plan is checked (a run checks its own rank's).
// The model's sizes come from its layouts (model/config.h, model/lora.h), nothing is constructed. What only a GPU or
// the other ranks can tell is named as not checked.
template <typename floatX>
int dry_run(const Options& o, const ProcessGroup& pg, const RunShape& run) {
    const MeshShape& shape = run.shape;
    const ModelConfig& config = run.config;
    FILE* out = pg.is_main() ? stdout : fopen("/dev/null", "w");
    const size_t gpu_bytes = (size_t)((double)o.dry_run_gpu_gib * 1024 * 1024 * 1024);
    const MeshCoord coord = mesh_coord(shape, pg.rank);
    fprintf(out, "dry run: rank %d of %d (%s), %.2f GiB free per GPU (--dry-run-gpu-gib); no GPU is touched and no rank connected\n", pg.rank,
            pg.world, pg.launcher.c_str(), gib(gpu_bytes));
    if (o.generate > 0 && pg.world > 1) die("--generate runs on one GPU");
    if (pg.world > 1) {  // the bootstrap the ranks would connect through (distributed/process_group.cpp), checked as it is there
        std::string bootstrap = "over MPI";
        struct stat st;
        if (pg.launcher != "MPI" && !o.nccl_init_file.empty()) {
            if (pg.is_main() && stat(o.nccl_init_file.c_str(), &st) == 0)
                die(o.nccl_init_file + ": --nccl-init-file already exists (left by an earlier job?): remove it or use a new name");
            bootstrap = "through --nccl-init-file " + o.nccl_init_file + ", written by rank 0";
        } else if (pg.launcher != "MPI") {
            const char* address = getenv("MASTER_ADDR");
            const char* port = getenv("MASTER_PORT");
            if (!address || !port) die("several processes without MPI need MASTER_ADDR and MASTER_PORT (TCP bootstrap) or --nccl-init-file");
            bootstrap = std::string("over TCP from rank 0 at ") + address + ":" + port;
        }
        fprintf(out, "mesh: data parallel %d x pipeline parallel %d x tensor parallel %d; this rank: data %d, pipeline stage %d, tensor %d; "
                     "NCCL id %s\n", shape.dp, shape.pp, shape.tp, coord.dp, coord.pp, coord.tp, bootstrap.c_str());
    }
    fprintf(out, "model %s: %s%s\n", o.model.c_str(), config_text(config).c_str(),
            run.initial_model.empty() ? ": initialised from --seed" : ": its header, size and checksum checked");
    if (!o.lora_load.empty())
        fprintf(out, "LoRA adapters %s: %s checked\n", o.lora_load.c_str(),
                is_peft_folder_path(o.lora_load) ? "the PEFT folder's config, tensor names and shapes" : "their header, size and checksum");
    SampleText text(o.tokenizer);  // a tokenizer that cannot be read is a warning, as in the run
    const std::vector<int> prompt = text.prompt_tokens(o.prompt);
    const std::string after = "<|endoftext|>" + (o.prompt.empty() ? std::string() : " and a prompt of " + std::to_string(prompt.size() - 1) + " tokens");
    if (o.generate > 0) {  // generate_only's needs: one GPU, the prompt, the model at batch 1 x its whole length
        const size_t bytes = plan_memory<floatX>(config, 1, config.max_seq_len, 1, 1, 1, 0, kKeepAll, Offload::kNone, false, LoraSpec(),
                                                 StageModel(), ActivationPlan(), false, nullptr, false).total() +
                             (size_t)config.padded_vocab_size * sizeof(floatX);  // + sampling's row of logits
        fprintf(out, "generate: %d tokens after %s; memory %.2f GiB of %.2f free (the model at batch 1 x %d, whose activations hold the KV "
                     "cache)\n", o.generate, after.c_str(), gib(bytes), gib(gpu_bytes), config.max_seq_len);
        if (bytes > gpu_bytes)
            die("--generate needs " + gib_text(bytes) + " GiB of GPU memory but the GPU has " + gib_text(gpu_bytes) + " GiB free");
        fprintf(out, "not checked without a GPU: its compute capability (8.0 or newer) and this binary's code for it\n");
        if (out != stdout) fclose(out);
        return 0;
    }
    // train()'s set-up before the GPU: the step's shape and the pipeline's schedule, the data, the output folder
    const StepShape batch = step_shape(o, run);
    const PipelineStages stages = pipeline_stages(o, run, batch);
    RunData data = open_data(o, run, coord, false);
    const int steps = o.steps >= 0 ? o.steps : std::max<long>(1, (long)data.train->batches_per_epoch() / batch.micro_batches);
    fprintf(out, "train data: %lu tokens in %zu shard(s) matching '%s': %lu batches of %d x %d tokens x %d data-parallel ranks an epoch\n",
            (unsigned long)data.train->num_tokens(), data.train->num_shards(), o.train_data.c_str(), (unsigned long)data.train->batches_per_epoch(),
            batch.B, batch.T, shape.dp);
    if (data.val) {
        const DataLoader& val = *data.val;
        const bool fitted = val.B() != batch.B || val.T() != batch.T;
        fprintf(out, "validation every %d steps: %d batch(es) of %d x %d tokens a data-parallel rank from %lu tokens in %zu shard(s) matching '%s'%s\n",
                o.val_every, (int)std::min<uint64_t>(o.val_batches, val.batches_per_epoch()), val.B(), val.T(), (unsigned long)val.num_tokens(),
                val.num_shards(), o.val_data.c_str(), fitted ? " (fewer tokens than one batch of --batch-size x --seq-len: evaluated over what it holds)" : "");
    } else {
        fprintf(out, "validation: none (%s)\n", o.val_every == 0 ? "--val-every 0" : "--val-data empty");
    }
    if (!o.output_dir.empty()) {
        refuse_uncheckpointable_stages(o, stages);
        // rank 0's choice of a checkpoint to resume, read only: the run also verifies the files' checksums, sets damaged ones
        // aside and locks the folder
        const std::string held = folder_checkpoints_text(o.output_dir);
        const std::vector<int> committed = committed_checkpoints(o.output_dir);
        std::string what = held.empty() ? "no checkpoint there" : "holds " + held;
        refuse_foreign_checkpoints(o, held);
        if (o.resume && !committed.empty()) {
            const int step = committed.back();
            CheckpointManifest manifest;
            std::string problem = read_manifest(o.output_dir, step, &manifest);
            if (problem.empty()) problem = manifest_files_problem(o.output_dir, manifest);
            if (!problem.empty()) die(problem);
            check_resume_against<floatX>(o, run, step, manifest, run_settings(o, run, batch, *data.train, steps), out);
            what += ": resumes from step " + std::to_string(step);
        }
        fprintf(out, "output: %s (%s); checkpoints every %d steps%s\n", o.output_dir.c_str(), what.c_str(), o.checkpoint_every,
                o.checkpoint_every == 0 ? " (none)" : "");
    }
    // the step's shape and the memory plan, as plan_and_allocate prints and checks them, for every pipeline stage
    const int stage = shape.dp == 1 ? 0 : o.zero_stage;  // ZeroOptimizer's: one data-parallel rank shards nothing
    const int split = o.sequence_parallel ? shape.tp : 1;
    const Offload offload = offload_mode(o.offload);
    const bool delayed_update = o.offload_delayed_update != 0;
    StagePlans<floatX> plans = stage_plans<floatX>(o, run, stages, batch, stage);
    plans.device_scratch = false;
    const size_t parameters = ParameterLayout(config, 8 * shape.dp).count;
    const size_t trainable = run.lora.enabled() ? AdapterLayout(config, run.lora, 8 * shape.dp).count : parameters;
    const size_t rank_parameters = ParameterLayout(config, 8 * shape.dp, shape.tp, stages.parts[coord.pp]).count;
    fprintf(out, "batch: %d x %d tokens x %d data-parallel ranks, %d micro-steps per step = %ld tokens per step; %d steps; precision %s\n", batch.B,
            batch.T, shape.dp, batch.micro_batches, batch.tokens, steps, o.precision.c_str());
    if (pg.world > 1 && !run.lora.enabled())  // as the run prints it
        fprintf(out, "ZeRO stage %d: model states per GPU by the formula %.2f GiB for %zu parameters per rank (%s)\n", stage,
                gib((size_t)zero_states_formula((double)rank_parameters, shape.dp, stage, (int)sizeof(floatX), offload)), rank_parameters,
                zero_states_words(o.precision == "fp8" ? "bf16" : o.precision, offload).c_str());
    if (stages.schedule) print_pipeline_plan(out, stages.forecast);
    const MemoryPlan plan = report_memory_plan(out, plans, coord.pp, split, gpu_bytes, parameters, trainable, o.lora_targets);
    if (shape.pp > 1) {  // the other stages' ranks refuse theirs with the same message
        FILE* quiet = fopen("/dev/null", "w");
        for (int s = 0; s < shape.pp; s++)
            if (s != coord.pp) report_memory_plan(quiet, plans, s, split, gpu_bytes, parameters, trainable, o.lora_targets);
        fclose(quiet);
    }
    if (offload != Offload::kNone) {
        // the ranks sharing this machine: the launcher's count where it gives one (the run counts them over NCCL)
        const char* local = getenv("LOCAL_WORLD_SIZE") ? getenv("LOCAL_WORLD_SIZE") : getenv("SLURM_NTASKS_PER_NODE");
        const int ranks_on_host = local ? std::max(1, atoi(local)) : std::max(1, pg.world / std::max(1, atoi(getenv("NNODES") ? getenv("NNODES") : "1")));
        const int threads = offload_cpu_threads(ranks_on_host, delayed_update);
        report_host_memory_plan(out, plan.host, ranks_on_host, host_memory_budget(o.host_memory_gib),
                                std::string(adamw_cpu::isa_name(adamw_cpu::best_isa())) + ", " +
                                    std::to_string(threads > 0 ? threads : omp_get_max_threads()) + " threads a rank",
                                o.offload_dir);
    }
    if (o.hellaswag) {  // train()'s and evaluate_hellaswag's checks: the vocabulary, the items, the rows they need
        if (!text.tokenizer) die("--hellaswag needs a vocabulary: --tokenizer must be a tokenizer.json or a folder with one (or with encoder.json and vocab.bpe)");
        std::vector<HellaSwagItem> items;
        try { items = load_hellaswag(o.hellaswag_data); } catch (const std::exception& e) { die(e.what()); }
        const int longest = HellaSwagBatcher(items, *text.tokenizer, 4, batch.T).max_length();
        const int multiple = 8 * split, eval_T = std::min(batch.T, (longest + multiple - 1) / multiple * multiple);
        if (4L * eval_T > (long)batch.B * batch.T) die("HellaSwag needs --batch-size x --seq-len >= 4 x the longest candidate");
        fprintf(out, "HellaSwag: %zu items from %s, the longest candidate %d tokens\n", items.size(), o.hellaswag_data.c_str(), longest);
    }
    if (o.sample_every > 0) fprintf(out, "samples every %d steps: %d tokens after %s\n", o.sample_every, o.sample_tokens, after.c_str());
    fprintf(out, "not checked without a GPU: its compute capability (8.0 or newer%s) and this binary's code for it; the memory beside the plan's "
                 "figures: the CUDA context's, and the deterministic reductions' scratch, which grows with the GPU's SM count (48 bytes x SMs x "
                 "C = %.1f MiB on 132 SMs)%s\n", plans.fp8 ? "; 8.9 or newer for fp8" : "", 48.0 * 132 * config.channels / (1024 * 1024),
            pg.world > 1 ? "; the connection to the other ranks" : "");
    if (out != stdout) fclose(out);
    return 0;
}

#ifndef TESTING
int main(int argc, char** argv) {
    install_stop_signals();  // first: every thread started from here on (MPI's, CUDA's, NCCL's, the data loader's) leaves them to it
    setvbuf(stdout, nullptr, _IOLBF, 0);  // a line at a time also into a file or a pipe (launchers, Slurm), not at exit
    ProcessGroup pg = ProcessGroup::from_environment(&argc, &argv);
    const Options o = parse_options(argc, argv);
    if (!o.verify_checkpoints.empty()) return verify_checkpoint_folder(o.verify_checkpoints, stdout);  // no GPU
    const RunShape run = validate_options(o, pg.world);  // every flag and shape error, before a GPU is touched
    // fp8 is bf16 training whose blocks' linear layers multiply in FP8 (LinearLayers::fp8): a bf16 model, bf16
    // checkpoints; --generate runs every product in bf16
    int rc;
    if (o.dry_run)
        rc = o.precision == "fp32" ? dry_run<float>(o, pg, run) : o.precision == "fp16" ? dry_run<__half>(o, pg, run) : dry_run<__nv_bfloat16>(o, pg, run);
    else if (o.generate > 0)
        rc = o.precision == "fp32" ? generate_only<float>(o, pg, run) : o.precision == "fp16" ? generate_only<__half>(o, pg, run)
                                                                      : generate_only<__nv_bfloat16>(o, pg, run);
    else
        rc = o.precision == "fp32" ? train<float>(o, pg, run) : o.precision == "fp16" ? train<__half>(o, pg, run)
                                                              : train<__nv_bfloat16>(o, pg, run);
    pg.destroy();
    return rc;
}
#endif
