// train_gpt.cu: GPT-2 training on one GPU, read top to bottom as the recipe.
//   1. command-line flags and the learning-rate schedule
//   2. sampling and the HellaSwag evaluation
//   3. the training loop
// The model lives in model/ (configuration and parameter layout, LoRA, model files, GPT2, checkpoints), the
// kernels in kernels/ (one file per layer), data loading and the tokenizer in dataloader/.
// Tests include this file with TESTING defined, which leaves out main().
#include <string>
#include <vector>
#include <cstring>
#include <cerrno>
#include <climits>
#include <cmath>
#include <chrono>
#include <sys/stat.h>
#include "dataloader/dataloader.h"   // defines: DataLoader (token shards, prefetching, resumable position)
#include "dataloader/tokenizer.h"    // defines: GPT2Tokenizer, TokenDecoder (to decode samples)
#include "dataloader/hellaswag.h"    // defines: HellaSwagBatcher (packing and scoring the HellaSwag eval)
#include "kernels/common.cuh"              // defines: die (kernels/die.h), cudaCheck, the precisions and packed loads
#include "kernels/matmul.cuh"             // defines: matmul_setup, matmul_teardown, matmul_context (cuBLASLt handle, autotuning)
#include "distributed/process_group.h"    // defines: ProcessGroup (ranks, NCCL communicator, bootstrap)
#include "distributed/mesh.h"             // defines: MeshShape, ProcessMesh (rank arithmetic; tp, pp, dp communicators)
#include "distributed/zero.cuh"           // defines: ZeroOptimizer (ZeRO stages 0-3: sharding, collectives, AdamW)
#include "distributed/pipeline_schedule.h"  // defines: make_pipeline_schedule (1F1B, interleaved), pipeline_layer_split
#include "distributed/pipeline_parallel.cuh"  // defines: PipelineParallel (runs a stage's schedule: compute and transfers)
#include "model/config.h"                 // defines: ModelConfig, config_problem, StageModel, pipeline_stage_model, ParameterLayout
#include "model/lora.h"                   // defines: LoraSpec, AdapterLayout, read_adapter_file, write_adapter_file, merge_adapters
#include "model/model_file.h"             // defines: read_model_header, read_model_config, read_model_part, write_model_file (llm.c model files)
#include "model/gpt2.cuh"                 // defines: GPT2 (allocation, initialisation, forward, backward), MemoryPlan
#include "model/checkpoint.cuh"           // defines: save_checkpoint, load_checkpoint, latest_checkpoint, make_directories
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

// ---------------------------------------------------------------------------------------------
// Sampling: each new token is one forward over the sequence so far (no KV cache: a 64-token sample of
// d12 takes ~64 short forwards, well under a second, so the periodic samples cost little).

template <typename floatX>
std::vector<int> generate(GPT2<floatX>& model, std::vector<int> tokens, int count, float temperature, int top_k, uint64_t seed) {
    const int B = model.B, T = model.T, Vp = model.config.padded_vocab_size, V = model.config.vocab_size;
    const int Vl = model.layout.vocab_rows();
    // every new length is a new product shape, run once: timing its candidates would cost more than it saves
    const bool autotune = matmul_context().autotune;
    matmul_context().autotune = false;
    floatX* row;  // the last position's logits, whole (their columns are spread over tensor-parallel ranks)
    cudaCheck(cudaMalloc(&row, Vp * sizeof(floatX)));
    std::vector<float> logits;
    std::vector<std::pair<float, int>> candidates(V);
    std::vector<int> window;
    for (int i = 0; i < count; i++) {
        const int start = std::max(0, (int)tokens.size() - T);  // a window of at most T tokens
        const int t = (int)tokens.size() - start;
        // sequence parallelism splits the rows evenly: pad the window at its end, which the causal attention
        // keeps from changing the positions before it (T is a multiple of the split)
        const int split = model.sequence_split();
        window.assign(tokens.begin() + start, tokens.end());
        window.resize((t + split - 1) / split * split, 0);
        model.B = 1;
        model.T = (int)window.size();
        model.upload_batch(window.data(), nullptr);
        model.forward_all_stages(false);
        // the logits are on the last pipeline stage, which sends the row to the others: every rank draws the same token
        if (model.layout.part.last) model.tensor_parallel.all_gather(model.logits + (size_t)(t - 1) * Vl, row, Vl, model.stream);
        const Communicator& stages = model.mesh.pipeline;
        if (stages.size > 1) ncclCheck(ncclBroadcast(row, row, Vp, nccl_type<floatX>(), stages.size - 1, stages.comm, model.stream));
        model.pg.synchronize(model.stream);
        logits = GPT2<floatX>::to_host(row, V);
        for (int j = 0; j < V; j++) candidates[j] = {logits[j] / std::max(temperature, 1e-6f), j};
        int k = (top_k > 0 && top_k < V) ? top_k : V;
        std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(), std::greater<>());
        double sum = 0.0;
        for (int j = 0; j < k; j++) sum += exp(candidates[j].first - candidates[0].first);
        const double u = (splitmix64(seed + i) >> 11) * (1.0 / 9007199254740992.0) * sum;
        double acc = 0.0;
        int chosen = candidates[k - 1].second;
        for (int j = 0; j < k; j++) {
            acc += exp(candidates[j].first - candidates[0].first);
            if (u < acc) { chosen = candidates[j].second; break; }
        }
        tokens.push_back(chosen);
    }
    cudaCheck(cudaFree(row));
    model.B = B;
    model.T = T;
    matmul_context().autotune = autotune;
    return tokens;
}

// Encodes prompts and decodes samples with the GPT-2 vocabulary when one is found (a folder with
// encoder.json and vocab.bpe, or a decode-only llm.c tokenizer file); token ids otherwise.
struct SampleText {
    std::unique_ptr<GPT2Tokenizer> tokenizer;
    TokenDecoder decoder;
    bool can_decode = false;
    explicit SampleText(const std::string& path) {
        try {
            struct stat st;
            if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
                tokenizer.reset(new GPT2Tokenizer(GPT2Tokenizer::load(path)));
                decoder = tokenizer->decoder();
            } else {
                decoder = TokenDecoder::load_llmc(path);
            }
            can_decode = true;
        } catch (const std::exception& e) {
            fprintf(stderr, "warning: no tokenizer (%s): samples are printed as token ids\n", e.what());
        }
    }
    // <|endoftext|> followed by the prompt's tokens.
    std::vector<int> prompt_tokens(const std::string& prompt) const {
        std::vector<int> tokens = {50256};
        if (prompt.empty()) return tokens;
        if (!tokenizer) die("--prompt needs the GPT-2 vocabulary: --tokenizer must be a folder with encoder.json and vocab.bpe");
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

// Selects this rank's GPU and connects the ranks; first refuses, with one line and before anything is allocated, a
// GPU that train_gpt cannot run on, or that this binary holds no code for.
static GpuInfo connect_gpu(ProcessGroup& pg, const ProcessGroupOptions& options) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && pg.local_rank < devices) require_supported_gpu(pg.local_rank);
    pg.connect(options);
    return current_gpu();
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
        GPT2<floatX> model(config, pg, single, 0, stream);
        model.allocate(1, config.max_seq_len);
        if (!model_file.empty()) model.load_parameters(model_file);
        else model.init_parameters((uint64_t)o.seed);
        SampleText text(o.tokenizer);
        std::vector<int> prompt = text.prompt_tokens(o.prompt);
        const auto start = std::chrono::steady_clock::now();
        std::vector<int> tokens = generate(model, prompt, o.generate, o.temperature, o.top_k, (uint64_t)o.seed);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        printf("%s\n---\ngenerated %d tokens in %.2f s (%.1f tokens/s; no KV cache: each token re-runs the prefix)\n",
               text(std::vector<int>(tokens.begin() + 1, tokens.end())).c_str(), o.generate, seconds, o.generate / seconds);
    }
    cudaCheck(cudaStreamDestroy(stream));
    matmul_teardown();
    return 0;
}

// ---------------------------------------------------------------------------------------------
// HellaSwag: each item's four candidate completions are four rows; the completion whose tokens have the
// lowest mean loss is the model's answer. Candidates are short (at most 149 tokens), so the eval runs the
// model at a reduced sequence length with proportionally more rows: the same activation buffers, a fraction
// of the work of padding every row to T.

template <typename floatX>
HellaSwagScore evaluate_hellaswag(GPT2<floatX>& model, const std::vector<HellaSwagItem>& items, const GPT2Tokenizer& tokenizer) {
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
        model.forward(true, 0.0f);
        cudaCheck(cudaMemcpyAsync(losses.data(), model.losses, N * sizeof(float), cudaMemcpyDeviceToHost, model.stream));
        cudaCheck(cudaStreamSynchronize(model.stream));
        batcher.score(b, losses.data(), score);
    }
    model.B = B;
    model.T = T;
    return score;
}

// ---------------------------------------------------------------------------------------------
// The training loop



// Checksums of a rank's parameters, fed in index order a unit at a time (the whole model need not be in host
// memory): of all of them, of those that tensor parallelism replicates (not in `split`), and of the token
// embedding's range [wte_begin, wte_end). All and replicated hash chunks of 2^20 elements on all cores and chain
// the chunks' hashes in order: the same values for any thread count and any cut into units (on one thread about
// 3.6 ns an element: 6 s at the end of a 6.6B GPT's run at tp 4, 24 s for a whole 6.6B model).
struct ParameterChecksums {
    static constexpr size_t kChunk = (size_t)1 << 20;
    LayoutMask split;  // a copy: callers pass split_mask()'s temporary
    size_t wte_begin = 0, wte_end = 0;
    uint64_t all = 0, replicated = 0, wte = 0;
    size_t next = 0;                               // index of the next element
    uint64_t chunk_all = 0, chunk_replicated = 0;  // the running hashes of the chunk `next` is in

    ParameterChecksums(const LayoutMask& split_mask, size_t wte_from, size_t wte_to) : split(split_mask), wte_begin(wte_from), wte_end(wte_to) {}
    static uint64_t mixed(uint64_t h, float value) {
        uint32_t bits;
        memcpy(&bits, &value, 4);
        return splitmix64(h ^ bits);
    }
    void add(size_t index, float value, uint64_t* h, uint64_t* r) const {
        *h = mixed(*h, value);
        if (!split.contains((long)index)) *r = mixed(*r, value);
    }
    void chain(uint64_t h, uint64_t r) {
        all = splitmix64(all ^ h);
        replicated = splitmix64(replicated ^ r);
    }
    // values[i] is element offset + i; offset must be where the last feed ended.
    void feed(size_t offset, const float* values, size_t n) {
        if (offset != next) die("parameter checksums: a unit at " + std::to_string(offset) + ", expected the next at " + std::to_string(next));
        for (size_t i = std::max(offset, wte_begin); i < std::min(offset + n, wte_end); i++) wte = mixed(wte, values[i - offset]);
        size_t i = 0;
        for (; i < n && next % kChunk != 0; i++, next++) {  // the open chunk's rest
            add(next, values[i], &chunk_all, &chunk_replicated);
            if ((next + 1) % kChunk == 0) {
                chain(chunk_all, chunk_replicated);
                chunk_all = chunk_replicated = 0;
            }
        }
        const size_t whole = (n - i) / kChunk;  // whole chunks, on all cores
        std::vector<uint64_t> all_of(whole), replicated_of(whole);
#pragma omp parallel for schedule(static)
        for (long c = 0; c < (long)whole; c++) {
            uint64_t h = 0, r = 0;
            for (size_t k = i + c * kChunk; k < i + (c + 1) * kChunk; k++) add(next + k - i, values[k], &h, &r);
            all_of[c] = h;
            replicated_of[c] = r;
        }
        for (size_t c = 0; c < whole; c++) chain(all_of[c], replicated_of[c]);
        i += whole * kChunk;
        next += whole * kChunk;
        for (; i < n; i++, next++) add(next, values[i], &chunk_all, &chunk_replicated);  // opens the next chunk
    }
    void finish() {
        if (next % kChunk != 0) chain(chunk_all, chunk_replicated);
        chunk_all = chunk_replicated = 0;
    }
};


template <typename floatX>
int train(const Options& o, ProcessGroup& pg, const RunShape& run) {
    const MeshShape& shape = run.shape;
    const ModelConfig& config = run.config;
    const std::string& model_file = run.initial_model;
    const LoraSpec& lora = run.lora;
    const std::vector<float>* initial_adapters = run.initial_adapters.empty() ? nullptr : &run.initial_adapters;
    const PipelineOptions& po = run.pipeline;
    const int B = o.batch_size, T = o.seq_len;  // per data-parallel rank (its tensor-parallel ranks share the rows)
    const MeshCoord coord = mesh_coord(shape, pg.rank);
    const long tokens_per_micro = (long)B * T * shape.dp;
    const int grad_accum = micro_batches_per_step(o, shape.dp);
    if (grad_accum == 0)
        die("--total-batch-tokens " + std::to_string(o.total_batch_tokens) + " is not a multiple of --batch-size x --seq-len" +
            (shape.dp > 1 ? " x data-parallel ranks (" + std::to_string(shape.dp) + ")" : std::string()) + " = " + std::to_string(tokens_per_micro));
    const long total_batch_tokens = grad_accum * tokens_per_micro;
    // pipeline parallelism: the gradient-accumulation steps are the micro-batches
    const std::string schedule_problem = pipeline_schedule_problem(po.kind, shape.pp, grad_accum, po.virtual_stages, config.num_layers);
    if (!schedule_problem.empty()) die(schedule_problem);
    std::vector<StageModel> stage_parts;
    std::vector<std::vector<int>> stage_chunks(shape.pp);
    for (int s = 0; s < shape.pp; s++) stage_parts.push_back(pipeline_stage_model(po.per_virtual_stage, shape.pp, s, &stage_chunks[s]));
    std::unique_ptr<PipelineSchedule> schedule;
    double bubble_with_work = 0;  // the first stage's idle share simulated with each stage's work (the LM head's on the last)
    std::vector<double> forward_work, backward_work;  // each virtual stage's, in layer forwards
    if (shape.pp > 1) {
        schedule.reset(new PipelineSchedule(make_pipeline_schedule(po.kind, shape.pp, grad_accum, po.virtual_stages)));
        pipeline_stage_work(po.per_virtual_stage, layer_backward_work(o.recompute), lm_head_work(config.padded_vocab_size, config.channels, T), &forward_work, &backward_work);
        bubble_with_work = simulate_pipeline(po.kind, shape.pp, grad_accum, po.virtual_stages, forward_work, backward_work).idle_share[0];
    }
    FILE* out = pg.is_main() ? stdout : fopen("/dev/null", "w");  // rank 0 reports

    // data first: a bad shard is reported before anything else can fail (also on a machine without a GPU)
    int device_count = 0;
    const bool have_gpu = cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0;
    HostAllocator pinned{[](size_t bytes) { void* p; cudaCheck(cudaMallocHost(&p, bytes)); return p; },
                         [](void* p) { cudaFreeHost(p); }};
    DataLoaderConfig train_config;
    train_config.pattern = o.train_data;
    train_config.B = B;
    train_config.T = T;
    train_config.shuffle = o.shuffle != 0;
    train_config.seed = (uint64_t)o.seed;
    train_config.vocab_size = config.vocab_size;
    train_config.num_ranks = shape.dp;
    train_config.rank = coord.dp;
    train_config.allocator = have_gpu ? pinned : HostAllocator::system();
    std::unique_ptr<DataLoader> train_loader, val_loader;
    try {
        train_loader.reset(new DataLoader(train_config));
        if (!o.val_data.empty() && o.val_every > 0) {
            DataLoaderConfig val_config = train_config;
            val_config.pattern = o.val_data;
            val_config.shuffle = false;
            val_loader.reset(new DataLoader(val_config));
        }
    } catch (const std::exception& e) {
        die(e.what());
    }
    // a checkpoint to continue from must hold this model in this precision (its mesh and ZeRO stage may differ)
    const int resume_step = o.resume ? latest_checkpoint(o.output_dir) : -1;
    if (resume_step >= 0) {
        const std::string problem = resume_problem(o.output_dir, resume_step, config, PrecisionOf<floatX>::value);
        if (!problem.empty()) die(problem);
    } else if (o.resume) {
        fprintf(out, "--resume 1: no checkpoint in %s, starting from scratch\n", o.output_dir.c_str());
    }
    if (!have_gpu) die("no CUDA GPU found");
    const GpuInfo gpu = connect_gpu(pg, {o.nccl_init_file, o.nccl_timeout});
    ProcessMesh mesh;
    mesh.build(pg, shape);
    matmul_setup(o.tf32 != 0, o.deterministic == 0);
    const int steps = o.steps >= 0 ? o.steps : std::max<long>(1, (long)train_loader->batches_per_epoch() / grad_accum);
    const int val_batches = val_loader ? (int)std::min<uint64_t>(o.val_batches, val_loader->batches_per_epoch()) : 0;

    // memory plan, predicted before allocating
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    GPT2<floatX> model(config, pg, mesh, o.zero_stage, stream, lora, stage_parts[coord.pp], stage_chunks[coord.pp]);
    model.stage_parts = stage_parts;
    const int stage = model.trained().stage();
    const int split = o.sequence_parallel ? shape.tp : 1;
    // pipeline stage s's plan: its part of the model and one activation set per micro-batch in flight on each chunk
    auto stage_plan = [&](int s, int with_split) {
        const ActivationPlan sets{stage_chunks[s], schedule ? schedule->stages[s].slots : std::vector<int>{1}, stage_parts[s].last};
        return GPT2<floatX>::plan(config, B, T, shape.dp, shape.tp, with_split, stage, o.recompute, lora, stage_parts[s], sets);
    };
    const MemoryPlan plan = stage_plan(coord.pp, split);
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    fprintf(out, "model: %d layers, %d heads, %d channels, max T %d, vocab %d (padded %d): %zu parameters\n", config.num_layers,
            config.num_heads, config.channels, config.max_seq_len, config.vocab_size, config.padded_vocab_size, model.num_parameters());
    fprintf(out, "batch: %d x %d tokens x %d data-parallel ranks, %d micro-steps per step = %ld tokens per step; %d steps; precision %s\n", B, T,
            shape.dp, grad_accum, total_batch_tokens, steps, o.precision.c_str());
    // ZeRO's model states per GPU for Psi parameters on N data-parallel ranks (stages 0-3); under tensor
    // parallelism Psi is one rank's share: its slices plus the replicated tensors
    const double P = (double)model.layout.count, N = shape.dp;
    const double zero_formula = std::vector<double>{16 * P, 4 * P + 12 * P / N, 2 * P + 14 * P / N, 16 * P / N}[stage];
    if (pg.world > 1)
        fprintf(out, "mesh: %d GPUs (%s) = data parallel %d x pipeline parallel %d x tensor parallel %d; ZeRO stage %d: model states per GPU by "
                     "the formula %.2f GiB for %zu parameters per rank (bf16 parameters and gradients, fp32 master + Adam)\n",
                pg.world, pg.launcher.c_str(), shape.dp, shape.pp, shape.tp, stage, gib((size_t)zero_formula), model.layout.count);
    if (schedule) {
        fprintf(out, "pipeline: %d stages, schedule %s with %d model chunk%s per stage, %d micro-batches: bubble %.1f%% by the formula, %.1f%% "
                     "on the first stage simulated with each stage's work (the LM head adds %.1f layer forwards to the last); per stage:\n",
                shape.pp, pipeline_schedule_name(po.kind), po.virtual_stages, po.virtual_stages > 1 ? "s" : "", grad_accum,
                100.0 * pipeline_bubble_theory(po.kind, shape.pp, grad_accum, po.virtual_stages), 100.0 * bubble_with_work, lm_head_work(config.padded_vocab_size, config.channels, T));
        for (int s = 0; s < shape.pp; s++) {
            const MemoryPlan p = stage_plan(s, split);
            std::string chunks, slots;
            for (size_t k = 0; k < stage_chunks[s].size(); k++) {
                chunks += (k ? "+" : "") + std::to_string(stage_chunks[s][k]);
                slots += (k ? "+" : "") + std::to_string(schedule->stages[s].slots[k]);
            }
            fprintf(out, "  stage %d: %s blocks%s%s, %s micro-batches in flight: parameters+gradients+optimizer %.2f GiB, activations %.2f GiB, total %.2f GiB\n",
                    s, chunks.c_str(), stage_parts[s].first ? " + embeddings" : "", stage_parts[s].last ? " + final LayerNorm and LM head" : "",
                    slots.c_str(), gib(p.parameters + p.gradients + p.master_weights + p.adam_state), gib(p.activations), gib(p.total()));
        }
    }
    if (lora.enabled()) {
        const MemoryPlan full = GPT2<floatX>::plan(config, B, T, shape.dp, shape.tp, split, stage, o.recompute);
        const size_t states = plan.parameters + plan.gradients + plan.master_weights + plan.adam_state;
        const size_t full_states = full.parameters + full.gradients + full.master_weights + full.adam_state;
        fprintf(out, "LoRA r=%d alpha=%g targets %s: %zu trainable parameters (%.3f%% of %zu); model states %.3f GiB vs %.3f GiB for full fine-tuning\n",
                lora.rank, lora.alpha, o.lora_targets.c_str(), model.trainable_parameters(),
                100.0 * model.trainable_parameters() / model.num_parameters(), model.num_parameters(), gib(states), gib(full_states));
    }
    fprintf(out, "memory plan per GPU (GiB): parameters %.2f | gradients %.2f | master weights %.2f | Adam m+v %.2f | activations %.2f | scratch %.2f | total %.2f of %.2f free\n",
            gib(plan.parameters), gib(plan.gradients), gib(plan.master_weights), gib(plan.adam_state), gib(plan.activations),
            gib(plan.scratch), gib(plan.total()), gib(free_bytes));
    if (split > 1)
        fprintf(out, "sequence parallel: activations %.2f GiB per GPU, against %.2f GiB without it (the LayerNorm and residual regions hold 1/%d of the rows)\n",
                gib(plan.activations), gib(stage_plan(coord.pp, 1).activations), split);
    if (plan.total() > free_bytes) {
        // a smaller batch only shrinks the activations: when the rest alone does not fit, only more GPUs help. A
        // higher ZeRO stage helps only with data-parallel ranks to shard over, and pipelines run stages 0-1
        auto gib_text = [](size_t bytes) { return std::to_string(gib(bytes)).substr(0, 5); };
        const size_t without_activations = plan.total() - plan.activations;
        const std::string hint = without_activations > free_bytes
            ? "the model states and scratch alone need " + gib_text(without_activations) +
                  " GiB: spread the model over more GPUs (--tensor-parallel, --pipeline-parallel, or more data-parallel ranks under --zero-stage 3)"
            : "lower --batch-size (and raise --total-batch-tokens to keep the step size)";
        die("the plan needs " + gib_text(plan.total()) + " GiB but the GPU has " + gib_text(free_bytes) + " GiB free: " + hint +
            (stage < 3 && shape.pp == 1 && shape.dp > 1 ? ", or raise --zero-stage" : ""));
    }
    const size_t in_use_before = device_memory_in_use();
    // the Hopper attention backward's ordered dQ sum is also its faster one (124M B=64 step, one H200: 0.45%
    // faster than with atomic sums), so it is taken there either way
    model.deterministic_attention = o.deterministic != 0 || flash::hopper::available();
    model.gelu_fusion = o.gelu_fusion != 0;
    model.sequence_parallel = split > 1;
    model.allocate(B, T, o.recompute, schedule ? schedule->stages[coord.pp].slots : std::vector<int>());
    std::unique_ptr<PipelineParallel<GPT2<floatX>>> pipeline;
    if (schedule) {
        pipeline.reset(new PipelineParallel<GPT2<floatX>>(*schedule, mesh.pipeline));
        pipeline->allocate();
    }
    fprintf(out, "device memory in use after allocation: %.2f GiB (plan %.2f GiB + %.2f GiB CUDA context)\n",
            gib(device_memory_in_use()), gib(plan.total()), gib(in_use_before));
    if (pg.world > 1 && !lora.enabled()) {
        // the formula counts shards only; stages 2 and 3 also keep full buffers of the units being worked on
        fprintf(out, "model states per GPU: measured %.3f GiB, formula %.3f GiB (%+.1f%%), of which %.3f GiB are unsharded working buffers "
                     "(stage 2: gradients, stage 3: also parameters, of the embeddings, final LayerNorm and a two-block ring)\n",
                gib(model.model_state_bytes), gib((size_t)zero_formula), 100.0 * (model.model_state_bytes / zero_formula - 1.0),
                gib(plan.working));
    }
    if (std::is_same<floatX, __half>::value) model.enable_loss_scaling(o.fp16_initial_scale, o.fp16_growth_interval);

    int start_step = 0;
    if (resume_step >= 0) {
        DataLoaderState data_state = load_checkpoint(o.output_dir, resume_step, model);
        try { train_loader->restore(data_state); } catch (const std::exception& e) { die(state_path(o.output_dir, resume_step, 0) + ": " + e.what()); }
        start_step = resume_step;
        fprintf(out, "resumed from %s at step %d\n", checkpoint_path(o.output_dir, "model", resume_step).c_str(), resume_step);
    }
    if (resume_step < 0) {
        if (!model_file.empty()) model.load_parameters(model_file);
        else model.init_parameters((uint64_t)o.seed);
        if (lora.enabled()) {
            if (initial_adapters) model.adapters->set_parameters(*initial_adapters);
            else model.init_adapters((uint64_t)o.seed + 1);
        }
    }

    FILE* log = nullptr;
    if (!o.output_dir.empty() && pg.is_main()) {
        make_directories(o.output_dir);
        log = fopen((o.output_dir + "/log.txt").c_str(), start_step > 0 ? "a" : "w");
        if (log == nullptr) die(o.output_dir + "/log.txt: cannot open for writing");
        if (start_step == 0) fprintf(log, "# step loss lr grad_norm ms (steps 0-based; validation lines start with '# val')\n");
        setvbuf(log, nullptr, _IOLBF, 0);
    }
    SampleText text(o.tokenizer);
    const std::vector<int> sample_prompt = text.prompt_tokens(o.prompt);
    std::vector<HellaSwagItem> hellaswag_items;
    if (o.hellaswag) {
        if (!text.tokenizer) die("--hellaswag needs the GPT-2 vocabulary: --tokenizer must be a folder with encoder.json and vocab.bpe");
        try { hellaswag_items = load_hellaswag(o.hellaswag_data); } catch (const std::exception& e) { die(e.what()); }
    }
    // FLOPs per token for forward + backward: 6 per parameter that multiplies (all but wpe) plus attention's
    // scores and weighted sum (12 L C T, counting the masked half as llm.c and PaLM do).
    const double flops_per_token = 6.0 * (model.num_parameters() - (size_t)config.max_seq_len * config.channels) +
                                   12.0 * config.num_layers * config.channels * T;
    // MFU is of all GPUs together, against the GPU's dense bf16 peak (kernels/gpu_support.h); n/a when not known
    const double peak_flops = gpu.peak_tflops * 1e12 * pg.world;
    auto mfu_text = [&](double tokens_per_second) {
        char text[32] = "n/a";
        if (peak_flops > 0) snprintf(text, sizeof(text), "%.1f%%", 100.0 * flops_per_token * tokens_per_second / peak_flops);
        return std::string(text);
    };
    if (peak_flops > 0) fprintf(out, "MFU against the dense bf16 peak of %s: %g TFLOP/s per GPU\n", gpu.name.c_str(), gpu.peak_tflops);
    else fprintf(out, "MFU: n/a (%s is not in the table of dense bf16 peaks, kernels/gpu_support.h)\n", gpu.name.c_str());
    std::vector<double> step_ms;  // for the closing summary
    std::vector<typename PipelineParallel<GPT2<floatX>>::StageTiming> stage_timings;  // this rank's stage, per step
    size_t peak_memory = 0;
    int skipped_in_a_row = 0;  // steps skipped for a non-finite loss or gradient norm, up to this one

    for (int step = start_step; step <= steps; step++) {
        const bool last = step == steps;
        const bool evaluate = o.val_every > 0 && (step % o.val_every == 0 || last);
        if (evaluate && o.hellaswag) {
            const auto start = std::chrono::steady_clock::now();
            HellaSwagScore score = evaluate_hellaswag(model, hellaswag_items, *text.tokenizer);
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            fprintf(out, "step %d: HellaSwag acc_norm %.4f (%d/%d), acc %.4f, %.1f s\n", step, (double)score.correct_mean / score.items,
                   score.correct_mean, score.items, (double)score.correct_sum / score.items, seconds);
            if (log) fprintf(log, "# hellaswag step %d acc_norm %.6f acc %.6f\n", step, (double)score.correct_mean / score.items,
                             (double)score.correct_sum / score.items);
        }
        if (evaluate && val_loader) {
            val_loader->reset();
            for (int i = 0; i < val_batches; i++) {
                Batch batch = val_loader->next();
                model.upload_batch(batch.inputs, batch.targets);
                model.forward_all_stages(true);
                model.accumulate_loss();
            }
            const float val_loss = model.take_mean_loss();
            fprintf(out, "step %d: val loss %.6f\n", step, val_loss);
            if (log) fprintf(log, "# val step %d loss %.9g\n", step, val_loss);
        }
        if (o.sample_every > 0 && step > 0 && (step % o.sample_every == 0 || last)) {
            std::vector<int> sample = generate(model, sample_prompt, o.sample_tokens, o.temperature, o.top_k,
                                               splitmix64((uint64_t)o.seed ^ (uint64_t)step));
            fprintf(out, "step %d sample: %s\n---\n", step, text(std::vector<int>(sample.begin() + 1, sample.end())).c_str());
        }
        if (o.checkpoint_every > 0 && step > start_step && (step % o.checkpoint_every == 0 || last)) {
            save_checkpoint(o.output_dir, step, model, train_loader->state());
            fprintf(out, "wrote checkpoint %s\n", checkpoint_path(o.output_dir, "model", step).c_str());
            if (pg.is_main() && o.keep_checkpoints > 0)  // the new checkpoint is complete: its model file is written
                for (int deleted : prune_checkpoints(o.output_dir, o.keep_checkpoints, o.keep_every))
                    fprintf(out, "deleted checkpoint %s (--keep-checkpoints %d%s)\n", checkpoint_path(o.output_dir, "model", deleted).c_str(),
                            o.keep_checkpoints, o.keep_every > 0 ? (", --keep-every " + std::to_string(o.keep_every)).c_str() : "");
        }
        if (last) break;

        const auto start = std::chrono::steady_clock::now();
        double data_seconds = 0.0;
        model.zero_grad();
        model.training = true;
        if (pipeline) {  // the micro-batches go through the pipeline's schedule
            std::vector<std::vector<int>> inputs(grad_accum), targets(grad_accum);
            for (int micro = 0; micro < grad_accum; micro++) {
                Batch batch;
                try { batch = train_loader->next(); } catch (const std::exception& e) { die(e.what()); }
                data_seconds += batch.wait_seconds;
                inputs[micro].assign(batch.inputs, batch.inputs + (size_t)B * T);
                targets[micro].assign(batch.targets, batch.targets + (size_t)B * T);
            }
            pipeline->run_step(model, inputs, targets, model.dloss(grad_accum));
        }
        for (int micro = 0; micro < grad_accum && !pipeline; micro++) {
            model.lora_dropout_seed = splitmix64(((uint64_t)o.seed << 20) ^ ((uint64_t)step << 8) ^ (uint64_t)micro);
            Batch batch;
            try { batch = train_loader->next(); } catch (const std::exception& e) { die(e.what()); }
            data_seconds += batch.wait_seconds;
            model.upload_batch(batch.inputs, batch.targets);
            model.forward(true, model.dloss(grad_accum));
            model.accumulate_loss();
            model.backward(micro == grad_accum - 1);
        }
        model.training = false;
        // one wait per step: the losses' copy and the optimizer step are enqueued first
        model.request_losses();
        const float lr = learning_rate(step, steps, o.lr, o.warmup_steps, o.final_lr_frac, o.lr_schedule);
        AdamWHyper h{lr, o.beta1, o.beta2, o.eps, lora.enabled() ? o.lora_weight_decay : o.weight_decay, o.grad_clip, 1.0f, step + 1,
                     splitmix64((uint64_t)o.seed + 0x5EED + step)};
        model.step(h);
        const float loss = model.take_mean_loss();  // waits for the step
        const typename ZeroOptimizer<floatX>::StepResult result = model.trained().finish_step();
        skipped_in_a_row = result.skipped ? skipped_in_a_row + 1 : 0;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double tokens_per_second = total_batch_tokens / seconds;
        fprintf(out, "step %5d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s | MFU %s | data %.2f ms | mem %.1f GiB",
               step + 1, steps, loss, lr, result.grad_norm, seconds * 1e3, tokens_per_second, mfu_text(tokens_per_second).c_str(),
               data_seconds * 1e3, gib(device_memory_in_use()));
        if (std::is_same<floatX, __half>::value) fprintf(out, " | scale %g", model.trained().scaler.scale);
        fprintf(out, " | skipped %ld%s", model.trained().scaler.skipped_steps, result.skipped ? " (this step: non-finite loss or gradients)" : "");
        if (pipeline) {  // rank 0's stage: the first
            stage_timings.push_back(pipeline->measured());
            fprintf(out, " | bubble %.1f%% (theory %.1f%%, with the head %.1f%%)", 100.0 * stage_timings.back().bubble(),
                    100.0 * pipeline_bubble_theory(po.kind, shape.pp, grad_accum, po.virtual_stages), 100.0 * bubble_with_work);
        }
        fprintf(out, "\n");
        fflush(out);
        if (log) fprintf(log, "%d %.9g %.9g %.9g %.3f\n", step, loss, lr, result.grad_norm, seconds * 1e3);
        step_ms.push_back(seconds * 1e3);
        peak_memory = std::max(peak_memory, device_memory_in_use() - in_use_before);  // ours, without the CUDA context
        if (o.max_skipped_steps > 0 && skipped_in_a_row >= o.max_skipped_steps) {
            // every rank saw the same norm (summed over all of them) and stops at the same step; rank 0 says why
            const int newest = o.output_dir.empty() ? -1 : latest_checkpoint(o.output_dir);
            if (!pg.is_main()) exit(EXIT_FAILURE);
            die("step " + std::to_string(step + 1) + ": " + std::to_string(skipped_in_a_row) + " steps in a row (from step " +
                std::to_string(step + 2 - skipped_in_a_row) + ") had a non-finite loss or gradient norm (loss " + std::to_string(loss) +
                ", norm " + std::to_string(result.grad_norm) + ") and were skipped (--max-skipped-steps " + std::to_string(o.max_skipped_steps) +
                "); " + (newest >= 0 ? "the newest checkpoint is " + checkpoint_path(o.output_dir, "model", newest) + " (continue with --resume 1, e.g. with a lower --lr)"
                                     : std::string("no checkpoint was written")));
        }
    }
    // Summary for benchmarks: the median step time, leaving out the first steps (cuBLAS heuristics, warm-up).
    if (step_ms.size() > 3) {
        auto median = [](std::vector<double> v) { std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end()); return v[v.size() / 2]; };
        const double ms = median(std::vector<double>(step_ms.begin() + 3, step_ms.end()));
        std::string mfu = mfu_text(total_batch_tokens / (ms * 1e-3));
        if (mfu.back() == '%') mfu.pop_back();
        fprintf(out, "RESULT tokens_per_s=%.0f ms_per_step=%.2f peak_mem_gib=%.2f mfu=%s\n", total_batch_tokens / ms * 1e3, ms,
               gib(peak_memory), mfu.c_str());
        // every stage's timing (the step log shows the first stage's): a slower stage makes the others wait
        if (pipeline && coord.tp == 0 && coord.dp == 0) {
            std::vector<double> busy, forward, backward, span, bubble;
            for (size_t i = 3; i < stage_timings.size(); i++) {
                busy.push_back(stage_timings[i].busy_ms);
                forward.push_back(stage_timings[i].forward_ms);
                backward.push_back(stage_timings[i].backward_ms);
                span.push_back(stage_timings[i].span_ms);
                bubble.push_back(stage_timings[i].bubble());
            }
            printf("pipeline stage %d: median over the timed steps: busy %.2f ms (forward actions %.2f%s, backward %.2f) of a %.2f ms span, "
                   "bubble %.1f%%\n", coord.pp, median(busy), median(forward), model.layout.part.last ? " with the LM head's forward and backward" : "",
                   median(backward), median(span), 100.0 * median(bubble));
            fflush(stdout);
            // the schedule simulated with each stage's measured busy time (split over its chunks, and each chunk's
            // over forward and backward, as the work model splits them): what the stages' unequal speeds alone leave
            const std::vector<std::vector<float>> stage_busy = model.gather_over_pipeline({(float)median(busy)});
            if (coord.pp == 0) {
                const int P = shape.pp, K = P * po.virtual_stages;
                std::vector<double> chunk_forward(K), chunk_backward(K);
                for (int s = 0; s < P; s++) {
                    double work = 0;  // the stage's modelled work per micro-batch
                    for (int k = s; k < K; k += P) work += forward_work[k] + backward_work[k];
                    for (int k = s; k < K; k += P) {
                        chunk_forward[k] = stage_busy[s][0] / grad_accum * forward_work[k] / work;
                        chunk_backward[k] = stage_busy[s][0] / grad_accum * backward_work[k] / work;
                    }
                }
                printf("pipeline: the schedule simulated with each stage's measured busy time leaves the first stage %.1f%% idle\n",
                       100.0 * simulate_pipeline(po.kind, P, grad_accum, po.virtual_stages, chunk_forward, chunk_backward).idle_share[0]);
                fflush(stdout);
            }
        }
    }
    if (lora.enabled() && (!o.lora_save.empty() || !o.lora_merge.empty())) {
        const std::vector<float> adapter_values = model.adapters->parameters_host();
        const std::vector<float> base_values = model.zero->parameters_host();
        if (pg.is_main() && !o.lora_save.empty()) {
            write_adapter_file(o.lora_save, *model.adapter_layout, adapter_values);
            fprintf(out, "wrote adapters %s\n", o.lora_save.c_str());
        }
        if (pg.is_main() && !o.lora_merge.empty()) {
            write_model_file(o.lora_merge, model.layout, merge_adapters(model.layout, base_values, *model.adapter_layout, adapter_values), false);
            fprintf(out, "wrote the merged model %s\n", o.lora_merge.c_str());
        }
    }
    if (pg.world > 1) {
        // the ranks of a data-parallel group must end with the same parameters, and the tensors that tensor
        // parallelism replicates must be the same on every rank: each rank prints checksums of its copies
        const bool tied_copy = shape.pp > 1 && model.layout.part.has_wte();  // the two copies of the tied token embedding must agree
        ParameterChecksums sums(model.layout.split_mask(), tied_copy ? model.layout.wte : 0, tied_copy ? model.layout.wte_end() : 0);
        model.trained().for_each_unit_host([&](size_t offset, const float* values, size_t n) { sums.feed(offset, values, n); });
        sums.finish();
        fprintf(stderr, "rank %d parameter checksum %016llx tensor-parallel rank %d replicated checksum %016llx\n", pg.rank,
                (unsigned long long)sums.all, mesh.tensor.rank, (unsigned long long)sums.replicated);
        if (tied_copy)
            fprintf(stderr, "rank %d pipeline stage %d tensor-parallel rank %d data-parallel rank %d wte checksum %016llx\n", pg.rank, mesh.pipeline.rank,
                    mesh.tensor.rank, mesh.data.rank, (unsigned long long)sums.wte);
    }
    if (log) fclose(log);
    if (out != stdout) fclose(out);
    matmul_teardown();
    mesh.destroy();
    return 0;
}

#ifndef TESTING
int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // a line at a time also into a file or a pipe (launchers, Slurm), not at exit
    ProcessGroup pg = ProcessGroup::from_environment(&argc, &argv);
    const Options o = parse_options(argc, argv);
    const RunShape run = validate_options(o, pg.world);  // every flag and shape error, before a GPU is touched
    int rc;
    if (o.generate > 0)
        rc = o.precision == "fp32" ? generate_only<float>(o, pg, run) : o.precision == "fp16" ? generate_only<__half>(o, pg, run)
                                                                      : generate_only<__nv_bfloat16>(o, pg, run);
    else
        rc = o.precision == "fp32" ? train<float>(o, pg, run) : o.precision == "fp16" ? train<__half>(o, pg, run)
                                                              : train<__nv_bfloat16>(o, pg, run);
    pg.destroy();
    return rc;
}
#endif
