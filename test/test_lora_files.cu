// train_gpt's LoRA host code against the CPU reference, without a GPU: adapter files written by the CPU
// reference are read back and rewritten byte for byte (also through the padded layout of 3 ranks), and
// train_gpt's merge of base + adapters equals the reference's lora_merge. The Llama family's PEFT targets (q, k, v,
// o, gate, up, down), which the reference does not write: their file round trip, and their merge against W0 + s B A
// on each slice's rows of its product's weight.
#define TESTING
#include <random>
#include "../train_gpt.cu"
#include "cpu_reference.h"
#include "check.h"

static std::vector<char> file_bytes(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    std::vector<char> bytes;
    if (!f) return bytes;
    int c;
    while ((c = fgetc(f)) != EOF) bytes.push_back((char)c);
    fclose(f);
    return bytes;
}

int main() {
    check_suite("lora_files");
    const std::string dir = "build/test_work/lora_files";
    make_directories(dir);
    ModelConfig config;
    config.num_layers = 2; config.num_heads = 1; config.channels = 64; config.max_seq_len = 32;
    const ParameterLayout layout(config);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> base(layout.total, 0.0f);
    layout.for_each_file_run([&](size_t, size_t device_offset, size_t count) {
        for (size_t i = 0; i < count; i++) base[device_offset + i] = normal(rng);
    });
    const std::string model_path = dir + "/base.bin";
    write_model_file(model_path, layout, base, false);

    // the reference's adapters, with non-zero B
    cpuref::Model* ref = cpuref::model_load(model_path.c_str());
    const cpuref::LoraConfig lc{4, 8.0f, 15};
    cpuref::model_enable_lora(ref, lc, 3);
    float* adapters = cpuref::model_lora_params(ref);
    for (size_t i = 0; i < cpuref::model_lora_num_params(ref); i++) adapters[i] = normal(rng);
    std::string error;
    const std::string ref_path = dir + "/reference_adapters.bin";
    check(cpuref::lora_save(ref, ref_path.c_str(), &error), "lora files: reference writes adapters", error);

    // read and rewrite: the same bytes, also through the padded layout of 3 ranks
    for (size_t multiple : {8, 24}) {
        std::vector<float> values;
        const LoraSpec spec = read_adapter_file(ref_path, config, multiple, values);
        check(spec.rank == lc.rank && spec.alpha == lc.alpha && spec.targets == lc.targets,
              "lora files: rank, alpha and targets read back (unit multiple " + std::to_string(multiple) + ")", "");
        const std::string ours = dir + "/ours_" + std::to_string(multiple) + ".bin";
        write_adapter_file(ours, AdapterLayout(config, spec, multiple), values);
        // ours carries the CRC-32C in header ints 254-255 (the reference writes none): every other byte equal
        std::vector<char> ours_bytes = file_bytes(ours);
        const bool sealed = check_file_checksum(ours).status == FileChecksum::kValid;
        if (ours_bytes.size() >= 1024) std::fill(ours_bytes.begin() + 4 * kChecksumTagSlot, ours_bytes.begin() + 1024, '\0');
        check(sealed && ours_bytes == file_bytes(ref_path),
              "lora files: adapter file round trip byte for byte but its checksum, which matches (unit multiple " + std::to_string(multiple) + ")", "");
    }

    // merge: train_gpt's merge_adapters against the reference's lora_merge
    std::vector<float> values;
    const LoraSpec spec = read_adapter_file(ref_path, config, 8, values);
    const std::vector<float> merged = merge_adapters(layout, base, AdapterLayout(config, spec, 8), values);
    cpuref::lora_merge(ref);
    const float* ref_merged = cpuref::model_params(ref);  // model-file order
    double worst = 0.0, largest = 0.0;
    layout.for_each_file_run([&](size_t file_offset, size_t device_offset, size_t count) {
        for (size_t i = 0; i < count; i++) {
            worst = std::max(worst, (double)fabsf(merged[device_offset + i] - ref_merged[file_offset + i]));
            largest = std::max(largest, (double)fabsf(ref_merged[file_offset + i]));
        }
    });
    // both sum B A in double and round once: they may differ only in the last bit of a few weights
    check(worst <= 1e-6 * largest, "lora files: merged weights equal the reference's merge",
          fmt("max abs difference %.3g (tolerance %.3g)", worst, 1e-6 * largest));
    cpuref::model_free(ref);

    // the Llama family's seven PEFT targets: q, k and v (grouped-query: k and v narrower than q), o, gate, up, down
    ModelConfig llama;
    llama.family = ModelFamily::kLlama;
    llama.num_layers = 2; llama.num_heads = 4; llama.kv_heads = 2; llama.channels = 64; llama.ffn = 96; llama.max_seq_len = 32;
    llama.qkv_bias = false; llama.tied_head = false; llama.vocab_size = llama.padded_vocab_size = 128;
    const ParameterLayout llama_layout(llama);
    std::vector<float> llama_base(llama_layout.total, 0.0f);
    for (float& v : llama_base) v = normal(rng);
    LoraSpec peft;
    peft.rank = 4;
    peft.alpha = 8.0f;
    peft.targets = parse_lora_targets("q,k,v,o,gate,up,down");
    check(peft.targets == (1u << kLoraQ | 1u << kLoraK | 1u << kLoraV | 1u << kLoraAttnProj | 1u << kLoraGate | 1u << kLoraUp | 1u << kLoraFcProj),
          "lora files: q,k,v,o,gate,up,down parse to their targets", std::to_string(peft.targets));
    const AdapterLayout peft_layout(llama, peft, 8);
    std::vector<float> peft_values(peft_layout.total, 0.0f);
    for (int l = 0; l < llama.num_layers; l++)
        for (size_t i = 0; i < peft_layout.layer_size(); i++) peft_values[peft_layout.unit_begin(l) + i] = normal(rng);
    const std::string peft_path = dir + "/peft_adapters.bin";
    write_adapter_file(peft_path, peft_layout, peft_values);
    for (size_t multiple : {8, 24}) {
        std::vector<float> values;
        const LoraSpec spec = read_adapter_file(peft_path, llama, multiple, values);
        const AdapterLayout read_layout(llama, spec, multiple);
        bool same = spec.rank == peft.rank && spec.alpha == peft.alpha && spec.targets == peft.targets;
        for (int l = 0; l < llama.num_layers; l++)
            same = same && std::equal(peft_values.begin() + peft_layout.unit_begin(l), peft_values.begin() + peft_layout.unit_begin(l) + peft_layout.layer_size(),
                                      values.begin() + read_layout.unit_begin(l));
        const std::string again = dir + "/peft_again_" + std::to_string(multiple) + ".bin";
        write_adapter_file(again, read_layout, values);
        check(same && file_bytes(again) == file_bytes(peft_path) && (long)file_bytes(peft_path).size() == 1024 + 4 * (long)peft_layout.count,
              "lora files: q, k, v, o, gate, up, down adapters round trip byte for byte (unit multiple " + std::to_string(multiple) + ")", "");
    }
    // merge: each target's s B A added to its rows of the product's weight (q, k, v: the qkv weight's [q | k | v]
    // rows; gate, up: fc's [gate | up]), in double
    const std::vector<float> peft_merged = merge_adapters(llama_layout, llama_base, peft_layout, peft_values);
    std::vector<double> expected(llama_base.begin(), llama_base.end());
    const int C = llama.channels, KV = llama.kv_channels(), F = llama.hidden_units();
    struct Rows { int target; BlockTensor weight; int first_row, rows, in; };
    const Rows rows[] = {{kLoraQ, QKVW, 0, C, C},      {kLoraK, QKVW, C, KV, C},       {kLoraV, QKVW, C + KV, KV, C}, {kLoraAttnProj, ATTPROJW, 0, C, C},
                         {kLoraGate, FCW, 0, F, C},    {kLoraUp, FCW, F, F, C},        {kLoraFcProj, FCPROJW, 0, C, F}};
    const double scale = peft.scale();
    for (int l = 0; l < llama.num_layers; l++)
        for (const Rows& t : rows) {
            const float* A = &peft_values[peft_layout.a(l, t.target)];
            const float* Bm = &peft_values[peft_layout.b(l, t.target)];
            const size_t W = llama_layout.tensor(l, t.weight) + (size_t)t.first_row * t.in;
            for (int o = 0; o < t.rows; o++)
                for (int i = 0; i < t.in; i++) {
                    double acc = 0.0;
                    for (int k = 0; k < peft.rank; k++) acc += (double)Bm[(size_t)o * peft.rank + k] * A[(size_t)k * t.in + i];
                    expected[W + (size_t)o * t.in + i] += scale * acc;
                }
        }
    double peft_worst = 0.0;
    for (size_t i = 0; i < expected.size(); i++) peft_worst = std::max(peft_worst, std::fabs((double)peft_merged[i] - expected[i]));
    check(peft_worst <= 1e-6, "lora files: q, k, v, o, gate, up, down merge into their rows of the products' weights",
          fmt("max abs difference %.3g (tolerance 1e-6)", peft_worst));
    return check_failures() == 0 ? 0 : 1;
}
