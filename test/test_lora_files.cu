// train_gpt's LoRA host code against the CPU reference, without a GPU: adapter files written by the CPU
// reference are read back and rewritten byte for byte (also through the padded layout of 3 ranks), and
// train_gpt's merge of base + adapters equals the reference's lora_merge.
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
    return check_failures() == 0 ? 0 : 1;
}
