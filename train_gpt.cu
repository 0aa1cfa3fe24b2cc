// train_gpt.cu: GPT-2 training on one GPU, read top to bottom as the recipe.
//   1. configuration and the block-major parameter layout
//   2. llm.c model files
//   3. the model: allocation, initialisation, forward, backward, update (one kernel call per operation)
//   4. command-line flags, learning-rate schedule, checkpoints
//   5. the training loop
// The kernels live in kernels/ (one file per layer), data loading and the tokenizer in dataloader/.
// Tests include this file with TESTING defined, which leaves out main().
#include <string>
#include <vector>
#include <cstring>
#include "kernels/common.cuh"
#include "kernels/init.cuh"
#include "kernels/encoder.cuh"            // defines: encoder_forward, encoder_backward, EncoderBuckets
#include "kernels/layernorm.cuh"          // defines: layernorm_forward, residual_layernorm_forward, layernorm_backward
#include "kernels/matmul.cuh"             // defines: matmul_forward, matmul_backward (cuBLASLt), bias_backward
#include "kernels/attention.cuh"          // defines: attention_forward, attention_backward
#include "kernels/gelu.cuh"               // defines: gelu_forward, gelu_backward
#include "kernels/classifier.cuh"         // defines: fused_classifier (softmax + cross-entropy)
#include "kernels/adamw.cuh"              // defines: adamw_update, DecayMask
#include "kernels/global_norm.cuh"        // defines: global_norm_squared

// ---------------------------------------------------------------------------------------------
// Configuration

constexpr int kModelMagic = 20240326;
constexpr int kModelVersionFP32 = 3, kModelVersionBF16 = 5;

struct ModelConfig {
    int max_seq_len = 1024;
    int vocab_size = 50257;
    int padded_vocab_size = 50304;
    int num_layers = 12;
    int num_heads = 12;
    int channels = 768;
};

inline int pad_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

// "dN": GPT-2's published shapes for 12/24/36/48 layers, llm.c's for its larger ones; any other depth N
// gets C = 64 N and N heads (the aspect ratio and head size of GPT-2 124M).
inline bool config_from_descriptor(const std::string& descriptor, ModelConfig& config) {
    if (descriptor.size() < 2 || descriptor[0] != 'd') return false;
    for (size_t i = 1; i < descriptor.size(); i++)
        if (!isdigit((unsigned char)descriptor[i])) return false;
    const int depth = atoi(descriptor.c_str() + 1);
    if (depth <= 0) return false;
    const int known[][3] = {{6, 384, 6},    {12, 768, 12},  {24, 1024, 16}, {36, 1280, 20},
                            {48, 1600, 25}, {60, 1920, 30}, {72, 2880, 30}, {84, 3456, 36}};
    config = ModelConfig();
    config.num_layers = depth;
    config.channels = 64 * depth;
    config.num_heads = depth;
    for (auto& k : known)
        if (k[0] == depth) { config.channels = k[1]; config.num_heads = k[2]; }
    return true;
}

// Returns an empty string when the configuration is usable, else why not.
inline std::string config_problem(const ModelConfig& c) {
    char buf[256];
    if (c.num_layers <= 0 || c.num_heads <= 0 || c.channels <= 0 || c.max_seq_len <= 0 || c.vocab_size <= 0)
        return "layers, heads, channels, max sequence length and vocabulary must be positive";
    if (c.channels % c.num_heads != 0) {
        snprintf(buf, sizeof(buf), "channels (%d) must be divisible by heads (%d)", c.channels, c.num_heads);
        return buf;
    }
    if ((c.channels / c.num_heads) % 8 != 0 || c.channels % 8 != 0) {
        snprintf(buf, sizeof(buf), "head size (%d) and channels (%d) must be multiples of 8 (16-byte vectors)",
                 c.channels / c.num_heads, c.channels);
        return buf;
    }
    if (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size % 128 != 0) {
        snprintf(buf, sizeof(buf), "padded vocabulary (%d) must be >= vocabulary (%d) and a multiple of 128",
                 c.padded_vocab_size, c.vocab_size);
        return buf;
    }
    return "";
}

// ---------------------------------------------------------------------------------------------
// Parameter layout. On the device the parameters are one flat buffer, block-major:
//   [wte (Vp,C)][wpe (T,C)][block 0][block 1]...[block L-1][lnfw (C)][lnfb (C)]
// with each block's 12 tensors contiguous, so that one layer can be gathered (ZeRO-3), owned by a
// pipeline stage, or split for tensor parallelism as one piece. Gradients, master weights and Adam
// moments use the same layout. The llm.c file order (tensor-major) is converted only at file I/O.

enum BlockTensor { LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, kBlockTensors };
inline const char* block_tensor_name(int t) {
    static const char* names[] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                  "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
    return names[t];
}

struct ParameterLayout {
    ModelConfig config;
    size_t wte = 0, wpe = 0, blocks_begin = 0, block_size = 0, lnfw = 0, lnfb = 0, total = 0;
    size_t block_offset[kBlockTensors] = {}, block_tensor_size[kBlockTensors] = {};

    explicit ParameterLayout(const ModelConfig& c = ModelConfig()) : config(c) {
        const size_t C = c.channels;
        const size_t sizes[kBlockTensors] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
        for (int t = 0; t < kBlockTensors; t++) {
            block_offset[t] = block_size;
            block_tensor_size[t] = sizes[t];
            block_size += sizes[t];
        }
        wte = 0;
        wpe = (size_t)c.padded_vocab_size * C;
        blocks_begin = wpe + (size_t)c.max_seq_len * C;
        lnfw = blocks_begin + block_size * c.num_layers;
        lnfb = lnfw + C;
        total = lnfb + C;
    }
    size_t tensor(int layer, BlockTensor t) const { return blocks_begin + layer * block_size + block_offset[t]; }

    // The llm.c file order: 16 tensors, the 12 block tensors each spanning all layers.
    // Calls visit(file_offset, device_offset, count) for every contiguous run.
    template <typename F> void for_each_file_run(F visit) const {
        size_t file_offset = 0;
        auto run = [&](size_t device_offset, size_t count) { visit(file_offset, device_offset, count); file_offset += count; };
        run(wte, wpe - wte);
        run(wpe, blocks_begin - wpe);
        for (int t = 0; t < kBlockTensors; t++)
            for (int l = 0; l < config.num_layers; l++) run(tensor(l, (BlockTensor)t), block_tensor_size[t]);
        run(lnfw, config.channels);
        run(lnfb, config.channels);
    }

    // Weight decay on embeddings and the four matrices of each block (tensors with 2+ dimensions).
    DecayMask decay_mask() const {
        DecayMask mask;
        mask.head_end = blocks_begin;
        mask.block_size = block_size;
        mask.blocks_end = lnfw;
        for (BlockTensor t : {QKVW, ATTPROJW, FCW, FCPROJW}) {
            mask.range_begin[mask.num_ranges] = block_offset[t];
            mask.range_end[mask.num_ranges] = block_offset[t] + block_tensor_size[t];
            mask.num_ranges++;
        }
        return mask;
    }
};

// ---------------------------------------------------------------------------------------------
// llm.c model files. Values travel as fp32 on the host in device (block-major) order.

inline void die(const std::string& message) {
    fprintf(stderr, "error: %s\n", message.c_str());
    exit(EXIT_FAILURE);
}

inline uint16_t float_to_bf16_bits(float x) {  // round to nearest even
    uint32_t bits;
    memcpy(&bits, &x, 4);
    if ((bits & 0x7F800000u) == 0x7F800000u) return (uint16_t)(bits >> 16);  // inf / nan
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}
inline float bf16_bits_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

inline ModelConfig read_model_header(FILE* f, const std::string& path, int* version) {
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) die(path + ": too short for a model header (1024 bytes)");
    if (header[0] != kModelMagic)
        die(path + ": bad magic " + std::to_string(header[0]) + " (expected " + std::to_string(kModelMagic) + ", an llm.c model file)");
    if (header[1] != kModelVersionFP32 && header[1] != kModelVersionBF16)
        die(path + ": unsupported model version " + std::to_string(header[1]) + " (expected 3 = fp32 or 5 = bf16)");
    *version = header[1];
    ModelConfig c;
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    std::string problem = config_problem(c);
    if (!problem.empty()) die(path + ": " + problem);
    return c;
}

// Reads an llm.c model file into `values` (fp32, device order).
inline ModelConfig read_model_file(const std::string& path, std::vector<float>& values) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) die(path + ": cannot open model file: " + strerror(errno));
    int version;
    ModelConfig config = read_model_header(f, path, &version);
    ParameterLayout layout(config);
    const size_t element_bytes = version == kModelVersionFP32 ? 4 : 2;
    fseek(f, 0, SEEK_END);
    const long file_size = ftell(f);
    const long expected = 1024 + (long)(layout.total * element_bytes);
    if (file_size != expected)
        die(path + ": size " + std::to_string(file_size) + " bytes, expected " + std::to_string(expected) + " for its header's shape");
    fseek(f, 1024, SEEK_SET);
    std::vector<uint8_t> raw(layout.total * element_bytes);
    if (fread(raw.data(), 1, raw.size(), f) != raw.size()) die(path + ": read failed");
    fclose(f);
    values.resize(layout.total);
    layout.for_each_file_run([&](size_t file_offset, size_t device_offset, size_t count) {
        for (size_t i = 0; i < count; i++) {
            if (element_bytes == 4) memcpy(&values[device_offset + i], &raw[(file_offset + i) * 4], 4);
            else {
                uint16_t b;
                memcpy(&b, &raw[(file_offset + i) * 2], 2);
                values[device_offset + i] = bf16_bits_to_float(b);
            }
        }
    });
    return config;
}

// Writes `values` (fp32, device order) as an llm.c model file: fp32 (version 3) or bf16 (version 5).
// Written to a temporary name and renamed, so a crash never leaves a half-written file.
inline void write_model_file(const std::string& path, const ModelConfig& c, const std::vector<float>& values, bool bf16) {
    ParameterLayout layout(c);
    int header[256] = {};
    header[0] = kModelMagic;
    header[1] = bf16 ? kModelVersionBF16 : kModelVersionFP32;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    const size_t element_bytes = bf16 ? 2 : 4;
    std::vector<uint8_t> raw(layout.total * element_bytes);
    layout.for_each_file_run([&](size_t file_offset, size_t device_offset, size_t count) {
        for (size_t i = 0; i < count; i++) {
            if (!bf16) memcpy(&raw[(file_offset + i) * 4], &values[device_offset + i], 4);
            else {
                uint16_t b = float_to_bf16_bits(values[device_offset + i]);
                memcpy(&raw[(file_offset + i) * 2], &b, 2);
            }
        }
    });
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (f == nullptr) die(tmp + ": cannot create: " + strerror(errno));
    bool ok = fwrite(header, sizeof(int), 256, f) == 256 && fwrite(raw.data(), 1, raw.size(), f) == raw.size();
    ok = (fclose(f) == 0) && ok;
    if (!ok) die(tmp + ": write failed (disk full?)");
    if (rename(tmp.c_str(), path.c_str()) != 0) die(path + ": rename failed: " + strerror(errno));
}

// ---------------------------------------------------------------------------------------------
// The model

template <typename floatX>
struct LayerActivations {
    floatX *ln1, *qkv, *atty, *att, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
};

// Bytes of every buffer, for the start-up memory plan (predicted before anything is allocated).
struct MemoryPlan {
    size_t parameters = 0, gradients = 0, master_weights = 0, adam_state = 0, activations = 0, scratch = 0;
    size_t total() const { return parameters + gradients + master_weights + adam_state + activations + scratch; }
};

template <typename floatX>
struct GPT2 {
    static constexpr bool kHasMaster = !std::is_same<floatX, float>::value;

    ModelConfig config;
    ParameterLayout layout;
    int B = 0, T = 0;  // activation shape
    cudaStream_t stream = nullptr;

    floatX* params = nullptr;  // compute precision, block-major
    floatX* grads = nullptr;
    float* master = nullptr;   // fp32 master weights (bf16 / fp16 modes only)
    float* adam_m = nullptr;
    float* adam_v = nullptr;

    // activations
    floatX* activation_memory = nullptr;
    float* statistics_memory = nullptr;
    floatX *encoded = nullptr, *lnf = nullptr, *logits = nullptr;
    float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr;
    std::vector<LayerActivations<floatX>> layers;
    // scratch shared by all layers
    floatX *qkvr = nullptr, *dqkvr = nullptr, *scores = nullptr, *head_buffer = nullptr, *proj_out = nullptr;
    floatX *dresidual = nullptr, *dbtc = nullptr, *dbig = nullptr;
    float* reduce_scratch = nullptr;  // partial sums of the deterministic reductions
    float* norm_squared = nullptr;    // one float
    int* tokens_device = nullptr;     // inputs, targets (B*T each), encoder buckets
    int num_buckets = 0;
    EncoderBuckets buckets;
    std::vector<int> packed_buckets;

    GPT2(const ModelConfig& c) : config(c), layout(c) {}

    size_t num_parameters() const { return layout.total; }

    static size_t reduce_scratch_floats(const ModelConfig& c) {
        const int C = c.channels;
        return std::max({layernorm_backward_scratch_floats(C), bias_backward_scratch_floats<floatX>(4 * C),
                         bias_backward_scratch_floats<floatX>(c.padded_vocab_size), global_norm_scratch_floats()});
    }

    // Activation-buffer element counts, in allocation order, shared by the plan and the allocation.
    static void activation_counts(const ModelConfig& c, int B, int T, size_t* x_elements, size_t* stat_elements) {
        const size_t N = (size_t)B * T, C = c.channels, NH = c.num_heads, L = c.num_layers;
        const size_t per_layer = N * C * 6 + N * 3 * C + N * 4 * C * 2 + (size_t)B * NH * T * T;
        const size_t global = N * C * 2 + N * c.padded_vocab_size;
        const size_t scratch = N * 3 * C * 2 + (size_t)B * NH * T * T + N * C * 2 + N * C * 2 + N * 4 * C;
        *x_elements = per_layer * L + global + scratch;
        *stat_elements = N * 4 * L + N * 2 + N;
    }

    static MemoryPlan plan(const ModelConfig& c, int B, int T) {
        MemoryPlan p;
        const size_t P = ParameterLayout(c).total;
        p.parameters = P * sizeof(floatX);
        p.gradients = P * sizeof(floatX);
        p.master_weights = kHasMaster ? P * sizeof(float) : 0;
        p.adam_state = 2 * P * sizeof(float);
        size_t x_elements, stat_elements;
        activation_counts(c, B, T, &x_elements, &stat_elements);
        p.activations = x_elements * sizeof(floatX) + stat_elements * sizeof(float);
        p.scratch = reduce_scratch_floats(c) * sizeof(float) + matmul_context().workspace_bytes +
                    (size_t)B * T * 5 * sizeof(int);
        return p;
    }

    void allocate(int batch, int seq_len, cudaStream_t s) {
        B = batch;
        T = seq_len;
        stream = s;
        const size_t P = layout.total;
        cudaCheck(cudaMalloc(&params, P * sizeof(floatX)));
        cudaCheck(cudaMalloc(&grads, P * sizeof(floatX)));
        if (kHasMaster) cudaCheck(cudaMalloc(&master, P * sizeof(float)));
        cudaCheck(cudaMalloc(&adam_m, P * sizeof(float)));
        cudaCheck(cudaMalloc(&adam_v, P * sizeof(float)));
        cudaCheck(cudaMemset(adam_m, 0, P * sizeof(float)));
        cudaCheck(cudaMemset(adam_v, 0, P * sizeof(float)));
        cudaCheck(cudaMemset(grads, 0, P * sizeof(floatX)));

        size_t x_elements, stat_elements;
        activation_counts(config, B, T, &x_elements, &stat_elements);
        cudaCheck(cudaMalloc(&activation_memory, x_elements * sizeof(floatX)));
        cudaCheck(cudaMalloc(&statistics_memory, stat_elements * sizeof(float)));
        const size_t N = (size_t)B * T, C = config.channels, NH = config.num_heads;
        floatX* x = activation_memory;
        auto take = [&](size_t n) { floatX* p = x; x += n; return p; };
        float* f = statistics_memory;
        auto take_f = [&](size_t n) { float* p = f; f += n; return p; };
        layers.resize(config.num_layers);
        for (auto& a : layers) {
            a.ln1 = take(N * C); a.qkv = take(N * 3 * C); a.atty = take(N * C); a.att = take((size_t)B * NH * T * T);
            a.residual2 = take(N * C); a.ln2 = take(N * C); a.fch = take(N * 4 * C); a.fch_gelu = take(N * 4 * C);
            a.residual3 = take(N * C);
            a.ln1_mean = take_f(N); a.ln1_rstd = take_f(N); a.ln2_mean = take_f(N); a.ln2_rstd = take_f(N);
        }
        encoded = take(N * C); lnf = take(N * C); logits = take(N * config.padded_vocab_size);
        qkvr = take(N * 3 * C); dqkvr = take(N * 3 * C); scores = take((size_t)B * NH * T * T);
        head_buffer = take(N * C); proj_out = take(N * C); dresidual = take(N * C); dbtc = take(N * C);
        dbig = take(N * 4 * C);
        lnf_mean = take_f(N); lnf_rstd = take_f(N); losses = take_f(N);
        if (x != activation_memory + x_elements || f != statistics_memory + stat_elements)
            die("internal: activation plan and allocation disagree");
        cudaCheck(cudaMalloc(&reduce_scratch, reduce_scratch_floats(config) * sizeof(float)));
        cudaCheck(cudaMalloc(&norm_squared, sizeof(float)));
        cudaCheck(cudaMalloc(&tokens_device, N * 5 * sizeof(int)));  // inputs, targets, buckets (<= 2N + 1 + N)
    }

    ~GPT2() {
        for (void* p : {(void*)params, (void*)grads, (void*)master, (void*)adam_m, (void*)adam_v, (void*)activation_memory,
                        (void*)statistics_memory, (void*)reduce_scratch, (void*)norm_squared, (void*)tokens_device})
            if (p != nullptr) cudaFree(p);
    }

    // GPT-2 initialisation into the fp32 master copy: N(0, 0.02) weights, residual projections scaled by
    // 1/sqrt(2L), zero biases, unit LayerNorm weights, zero padded vocabulary rows. Each tensor draws
    // from its own seed, so the values do not depend on the layout.
    void init_random(uint64_t seed, float* values_device) {
        const size_t C = config.channels, V = config.vocab_size;
        const float std = 0.02f, residual_std = 0.02f / sqrtf(2.0f * config.num_layers);
        cudaCheck(cudaMemsetAsync(values_device, 0, layout.total * sizeof(float), stream));
        uint64_t tensor_id = 0;
        auto next_seed = [&]() { return splitmix64(seed * 1000003ull + tensor_id++); };
        fill_normal(values_device + layout.wte, V * C, std, next_seed(), stream);
        fill_normal(values_device + layout.wpe, (size_t)config.max_seq_len * C, std, next_seed(), stream);
        for (int l = 0; l < config.num_layers; l++) {
            fill_constant(values_device + layout.tensor(l, LN1W), C, 1.0f, stream);
            fill_normal(values_device + layout.tensor(l, QKVW), 3 * C * C, std, next_seed(), stream);
            fill_normal(values_device + layout.tensor(l, ATTPROJW), C * C, residual_std, next_seed(), stream);
            fill_constant(values_device + layout.tensor(l, LN2W), C, 1.0f, stream);
            fill_normal(values_device + layout.tensor(l, FCW), 4 * C * C, std, next_seed(), stream);
            fill_normal(values_device + layout.tensor(l, FCPROJW), 4 * C * C, residual_std, next_seed(), stream);
        }
        fill_constant(values_device + layout.lnfw, C, 1.0f, stream);
    }

    // Sets the parameters (and master weights) from fp32 values on the device.
    void set_parameters_from_fp32_device(const float* values_device) {
        if (kHasMaster) cudaCheck(cudaMemcpyAsync(master, values_device, layout.total * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        convert_precision(params, values_device, layout.total, stream);
    }
    void set_parameters(const std::vector<float>& values) {
        float* staging;
        cudaCheck(cudaMalloc(&staging, layout.total * sizeof(float)));
        cudaCheck(cudaMemcpy(staging, values.data(), layout.total * sizeof(float), cudaMemcpyHostToDevice));
        set_parameters_from_fp32_device(staging);
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(staging));
    }
    void init_parameters(uint64_t seed) {
        float* staging;
        cudaCheck(cudaMalloc(&staging, layout.total * sizeof(float)));
        init_random(seed, staging);
        set_parameters_from_fp32_device(staging);
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(staging));
    }

    // Copies a device buffer of `count` elements to fp32 on the host.
    template <typename T> static std::vector<float> to_host(const T* device, size_t count) {
        std::vector<T> raw(count);
        cudaCheck(cudaMemcpy(raw.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
        std::vector<float> out(count);
        for (size_t i = 0; i < count; i++) out[i] = host_to_float(raw[i]);
        return out;
    }
    static float host_to_float(float x) { return x; }
    static float host_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
    static float host_to_float(__half x) { return __half2float(x); }

    std::vector<float> parameters_host() const { return to_host(params, layout.total); }
    std::vector<float> gradients_host() const { return to_host(grads, layout.total); }
    std::vector<float> master_host() const { return kHasMaster ? to_host(master, layout.total) : parameters_host(); }

    floatX* param(int l, BlockTensor t) const { return params + layout.tensor(l, t); }
    floatX* grad(int l, BlockTensor t) const { return grads + layout.tensor(l, t); }

    // Uploads a batch (host int32, B*T each; targets may be null) and the encoder's token grouping.
    void upload_batch(const int* inputs, const int* targets) {
        const size_t N = (size_t)B * T;
        for (size_t i = 0; i < N; i++)
            if (inputs[i] < 0 || inputs[i] >= config.vocab_size || (targets && (targets[i] < 0 || targets[i] >= config.vocab_size)))
                die("token id out of range [0, " + std::to_string(config.vocab_size) + ") in the batch");
        cudaCheck(cudaMemcpyAsync(tokens_device, inputs, N * sizeof(int), cudaMemcpyHostToDevice, stream));
        if (targets) cudaCheck(cudaMemcpyAsync(tokens_device + N, targets, N * sizeof(int), cudaMemcpyHostToDevice, stream));
        buckets.build(inputs, (int)N);
        buckets.pack(packed_buckets);
        num_buckets = (int)buckets.tokens.size();
        cudaCheck(cudaMemcpyAsync(tokens_device + 2 * N, packed_buckets.data(), packed_buckets.size() * sizeof(int),
                                  cudaMemcpyHostToDevice, stream));
        // the host vectors are reused by the next batch: the copy must have read them
        cudaCheck(cudaStreamSynchronize(stream));
    }

    // Forward over the uploaded batch. With dloss != 0 the classifier also leaves the logits gradient in
    // `logits` (see fused_classifier); with dloss == 0 `logits` keeps the logits. Per-row losses in `losses`
    // when `with_loss`.
    void forward(bool with_loss, float dloss) {
        const int N = B * T, C = config.channels, NH = config.num_heads, L = config.num_layers;
        const int* inputs = tokens_device;
        const int* targets = tokens_device + (size_t)B * T;
        encoder_forward(encoded, inputs, params + layout.wte, params + layout.wpe, B, T, C, stream);
        layernorm_forward(layers[0].ln1, layers[0].ln1_mean, layers[0].ln1_rstd, encoded, param(0, LN1W), param(0, LN1B), N, C, stream);
        for (int l = 0; l < L; l++) {
            LayerActivations<floatX>& a = layers[l];
            const floatX* residual_in = l == 0 ? encoded : layers[l - 1].residual3;
            matmul_forward(a.qkv, a.ln1, param(l, QKVW), param(l, QKVB), N, C, 3 * C, stream);
            attention_forward(a.atty, a.att, qkvr, scores, head_buffer, a.qkv, B, T, C, NH, stream);
            matmul_forward(proj_out, a.atty, param(l, ATTPROJW), param(l, ATTPROJB), N, C, C, stream);
            residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, residual_in, proj_out,
                                       param(l, LN2W), param(l, LN2B), N, C, stream);
            matmul_forward(a.fch, a.ln2, param(l, FCW), param(l, FCB), N, C, 4 * C, stream);
            gelu_forward(a.fch_gelu, a.fch, (long)N * 4 * C, stream);
            matmul_forward(proj_out, a.fch_gelu, param(l, FCPROJW), param(l, FCPROJB), N, 4 * C, C, stream);
            // residual3 = residual2 + mlp, normalised by the next layer's first LayerNorm (or the final one)
            const bool last = l == L - 1;
            residual_layernorm_forward(a.residual3, last ? lnf : layers[l + 1].ln1,
                                       last ? lnf_mean : layers[l + 1].ln1_mean, last ? lnf_rstd : layers[l + 1].ln1_rstd,
                                       a.residual2, proj_out, last ? params + layout.lnfw : param(l + 1, LN1W),
                                       last ? params + layout.lnfb : param(l + 1, LN1B), N, C, stream);
        }
        matmul_forward(logits, lnf, params + layout.wte, (const floatX*)nullptr, N, C, config.padded_vocab_size, stream);
        if (with_loss) fused_classifier(logits, losses, targets, dloss, N, config.vocab_size, config.padded_vocab_size, stream);
    }

    // Backward after forward(true, dloss != 0). Gradients accumulate (+=) into `grads`, so micro-steps
    // of gradient accumulation just call forward/backward repeatedly between zero_grad() calls.
    void backward() {
        const int N = B * T, C = config.channels, NH = config.num_heads, L = config.num_layers;
        const int Vp = config.padded_vocab_size;
        cudaCheck(cudaMemsetAsync(dresidual, 0, (size_t)N * C * sizeof(floatX), stream));
        matmul_backward(dbtc, grads + layout.wte, (floatX*)nullptr, reduce_scratch, logits, lnf, params + layout.wte, N, C, Vp, stream);
        layernorm_backward(dresidual, grads + layout.lnfw, reduce_scratch, dbtc, layers[L - 1].residual3,
                           params + layout.lnfw, lnf_mean, lnf_rstd, N, C, stream);
        for (int l = L - 1; l >= 0; l--) {
            LayerActivations<floatX>& a = layers[l];
            const floatX* residual_in = l == 0 ? encoded : layers[l - 1].residual3;
            // dresidual is d(loss)/d(residual3); it passes unchanged to residual2 and into the MLP
            matmul_backward(dbig, grad(l, FCPROJW), grad(l, FCPROJB), reduce_scratch, dresidual, a.fch_gelu,
                            param(l, FCPROJW), N, 4 * C, C, stream);
            gelu_backward(dbig, a.fch, dbig, (long)N * 4 * C, stream);
            matmul_backward(dbtc, grad(l, FCW), grad(l, FCB), reduce_scratch, dbig, a.ln2, param(l, FCW), N, C, 4 * C, stream);
            layernorm_backward(dresidual, grad(l, LN2W), reduce_scratch, dbtc, a.residual2, param(l, LN2W),
                               a.ln2_mean, a.ln2_rstd, N, C, stream);
            // now d(loss)/d(residual2), which passes to residual_in and into the attention
            matmul_backward(dbtc, grad(l, ATTPROJW), grad(l, ATTPROJB), reduce_scratch, dresidual, a.atty,
                            param(l, ATTPROJW), N, C, C, stream);
            attention_backward(dbig, qkvr, dqkvr, scores, head_buffer, dbtc, a.qkv, a.att, B, T, C, NH, stream);
            matmul_backward(dbtc, grad(l, QKVW), grad(l, QKVB), reduce_scratch, dbig, a.ln1, param(l, QKVW), N, C, 3 * C, stream);
            layernorm_backward(dresidual, grad(l, LN1W), reduce_scratch, dbtc, residual_in, param(l, LN1W),
                               a.ln1_mean, a.ln1_rstd, N, C, stream);
        }
        const int* bucket_data = tokens_device + 2 * (size_t)B * T;
        encoder_backward(grads + layout.wte, grads + layout.wpe, dresidual, bucket_data, num_buckets, B, T, C, stream);
    }

    void zero_grad() { cudaCheck(cudaMemsetAsync(grads, 0, layout.total * sizeof(floatX), stream)); }

    // Squared L2 norm of all gradients (still multiplied by the loss scale). Synchronises.
    float gradient_norm_squared() {
        global_norm_squared(norm_squared, grads, (long)layout.total, reduce_scratch, stream);
        float value;
        cudaCheck(cudaMemcpyAsync(&value, norm_squared, sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        return value;
    }

    // Mean of the per-row losses of the last forward (divided back by nothing: plain cross-entropy).
    // Synchronises; summed in double on the host so the value does not depend on a reduction order.
    float mean_loss() {
        const size_t N = (size_t)B * T;
        loss_host.resize(N);
        cudaCheck(cudaMemcpyAsync(loss_host.data(), losses, N * sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        double sum = 0.0;
        for (float x : loss_host) sum += x;
        return (float)(sum / N);
    }
    std::vector<float> loss_host;

    // fp16 dynamic loss scaling (a no-op scale of 1 in bf16 and fp32): the loss is multiplied by `scale`
    // before backward; a step whose gradients hold inf/NaN is skipped and the scale halved; after
    // `growth_interval` clean steps in a row the scale doubles.
    struct LossScaler {
        float scale = 1.0f;
        int growth_interval = 2000;
        int clean_steps = 0;
        long skipped_steps = 0;
    } scaler;
    void enable_loss_scaling(float initial_scale, int growth_interval) {
        scaler.scale = initial_scale;
        scaler.growth_interval = growth_interval;
    }
    // d(summed loss)/d(row loss) for a micro-step: the mean over all rows of all micro-steps, scaled.
    float dloss(int grad_accum_steps) const { return scaler.scale / ((float)B * T * grad_accum_steps); }

    struct StepResult {
        float grad_norm;  // of the unscaled gradients, before clipping
        bool skipped;
    };
    // Clips the global gradient norm to `grad_clip` (<= 0: no clipping), unscales fp16 gradients, and runs
    // AdamW with step number t (1-based). Skips the update when the gradients are not finite.
    StepResult optimizer_step(AdamWHyper h, float grad_clip) {
        const float norm = sqrtf(gradient_norm_squared()) / scaler.scale;
        if (!std::isfinite(norm)) {
            scaler.skipped_steps++;
            scaler.clean_steps = 0;
            scaler.scale = std::max(scaler.scale * 0.5f, 1.0f);
            return {norm, true};
        }
        const float clip = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
        h.grad_scale = clip / scaler.scale;
        adamw_update(params, master, grads, adam_m, adam_v, (long)layout.total, 0, h, layout.decay_mask(), stream);
        if (std::is_same<floatX, __half>::value && ++scaler.clean_steps >= scaler.growth_interval) {
            scaler.scale *= 2.0f;
            scaler.clean_steps = 0;
        }
        return {norm, false};
    }
};

// ---------------------------------------------------------------------------------------------
// Command-line flags. One table drives both the parser and --help, so they cannot disagree.

struct Options {
    std::string model = "d12";  // dN, or an llm.c model file to start from
    int layers = -1, heads = -1, channels = -1, max_seq_len = -1;  // override the dN shape (random init only)
    std::string train_data = "data/tinyshakespeare/tiny_shakespeare_train.bin";
    std::string val_data = "data/tinyshakespeare/tiny_shakespeare_val.bin";
    std::string tokenizer = "data/gpt2";
    int batch_size = 4;
    int seq_len = 1024;
    long total_batch_tokens = -1;  // -1: one micro-batch per step
    std::string precision = "bf16";
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
    std::string output_dir = "";
    int checkpoint_every = 0;
    int resume = 0;
    long seed = 1337;
    int shuffle = 0;
    float fp16_initial_scale = 65536.0f;
    int fp16_growth_interval = 2000;
};

struct Flag {
    const char* name;
    const char* alias;  // llm.c's single-letter flag where one exists
    enum Kind { INT, LONG, FLOAT, STRING } kind;
    void* target;
    const char* help;
};

static std::vector<Flag> flag_table(Options& o) {
    return {
        {"--model", "-e", Flag::STRING, &o.model, "dN (d12 = 124M, d24, d36, d48 = 1.5B, any N) or an llm.c model file to start from"},
        {"--init-from", nullptr, Flag::STRING, &o.model, "same as --model (a model file)"},
        {"--layers", nullptr, Flag::INT, &o.layers, "override the number of layers (-1: from --model)"},
        {"--heads", nullptr, Flag::INT, &o.heads, "override the number of attention heads (-1: from --model)"},
        {"--channels", nullptr, Flag::INT, &o.channels, "override the width C (-1: from --model)"},
        {"--max-seq-len", nullptr, Flag::INT, &o.max_seq_len, "override the maximum sequence length (-1: 1024)"},
        {"--train-data", "-i", Flag::STRING, &o.train_data, "training token shards (glob)"},
        {"--val-data", "-j", Flag::STRING, &o.val_data, "validation token shards (glob; empty: none)"},
        {"--tokenizer", nullptr, Flag::STRING, &o.tokenizer, "folder with encoder.json and vocab.bpe, or an llm.c tokenizer file, to decode samples"},
        {"--batch-size", "-b", Flag::INT, &o.batch_size, "sequences per micro-batch"},
        {"--seq-len", "-t", Flag::INT, &o.seq_len, "tokens per sequence"},
        {"--total-batch-tokens", "-d", Flag::LONG, &o.total_batch_tokens, "tokens per optimizer step; gradient accumulation fills it (-1: batch-size x seq-len)"},
        {"--precision", nullptr, Flag::STRING, &o.precision, "bf16 | fp16 (dynamic loss scaling) | fp32"},
        {"--tf32", nullptr, Flag::INT, &o.tf32, "1: allow TF32 matrix products in fp32 mode"},
        {"--lr", "-l", Flag::FLOAT, &o.lr, "maximum learning rate"},
        {"--warmup-steps", "-u", Flag::INT, &o.warmup_steps, "linear warm-up steps"},
        {"--lr-schedule", nullptr, Flag::STRING, &o.lr_schedule, "decay after warm-up: cosine | linear | constant"},
        {"--final-lr-frac", "-q", Flag::FLOAT, &o.final_lr_frac, "final learning rate as a fraction of --lr"},
        {"--weight-decay", "-c", Flag::FLOAT, &o.weight_decay, "AdamW weight decay (matrices and embeddings only)"},
        {"--grad-clip", nullptr, Flag::FLOAT, &o.grad_clip, "clip the global gradient norm to this (0: off)"},
        {"--beta1", nullptr, Flag::FLOAT, &o.beta1, "AdamW beta1"},
        {"--beta2", nullptr, Flag::FLOAT, &o.beta2, "AdamW beta2"},
        {"--eps", nullptr, Flag::FLOAT, &o.eps, "AdamW epsilon"},
        {"--steps", "-x", Flag::INT, &o.steps, "optimizer steps (-1: one epoch of --train-data)"},
        {"--val-every", "-v", Flag::INT, &o.val_every, "validation loss every N steps (0: never)"},
        {"--val-batches", "-m", Flag::INT, &o.val_batches, "batches per validation"},
        {"--sample-every", "-s", Flag::INT, &o.sample_every, "print a text sample every N steps (0: never)"},
        {"--sample-tokens", "-g", Flag::INT, &o.sample_tokens, "tokens per sample"},
        {"--temperature", nullptr, Flag::FLOAT, &o.temperature, "sampling temperature"},
        {"--top-k", nullptr, Flag::INT, &o.top_k, "sample from the k most likely tokens (0: all)"},
        {"--output-dir", "-o", Flag::STRING, &o.output_dir, "folder for checkpoints and the log (empty: none)"},
        {"--checkpoint-every", "-n", Flag::INT, &o.checkpoint_every, "write a checkpoint every N steps (0: never)"},
        {"--resume", "-y", Flag::INT, &o.resume, "1: continue from the latest checkpoint in --output-dir"},
        {"--seed", nullptr, Flag::LONG, &o.seed, "seed for initialisation, shuffling, rounding and sampling"},
        {"--shuffle", nullptr, Flag::INT, &o.shuffle, "1: shuffle shard and window order each epoch"},
        {"--fp16-initial-scale", nullptr, Flag::FLOAT, &o.fp16_initial_scale, "fp16: initial loss scale"},
        {"--fp16-growth-interval", nullptr, Flag::INT, &o.fp16_growth_interval, "fp16: double the loss scale after this many clean steps"},
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

static void print_help(const char* program) {
    Options defaults;
    printf("usage: %s [flags]\nTrains GPT-2 on one GPU. Flags (default in brackets):\n", program);
    for (const Flag& f : flag_table(defaults)) {
        std::string names = std::string(f.name) + (f.alias ? std::string(", ") + f.alias : "");
        printf("  %-26s %s [%s]\n", names.c_str(), f.help, flag_value_string(f).c_str());
    }
    printf("  %-26s %s\n", "--help, -h", "print this help");
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
        char* end = nullptr;
        errno = 0;
        switch (flag->kind) {
            case Flag::INT: { long v = strtol(value.c_str(), &end, 10); *(int*)flag->target = (int)v; break; }
            case Flag::LONG: *(long*)flag->target = strtol(value.c_str(), &end, 10); break;
            case Flag::FLOAT: *(float*)flag->target = strtof(value.c_str(), &end); break;
            case Flag::STRING: *(std::string*)flag->target = value; break;
        }
        if (flag->kind != Flag::STRING && (value.empty() || *end != '\0' || errno != 0))
            die("flag " + arg + " expects a " + (flag->kind == Flag::FLOAT ? "number" : "integer") + ", got '" + value + "'");
    }
    return o;
}

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
