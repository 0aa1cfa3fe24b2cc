// Fuzzes llm.c model files (model/model_file.h): read_model_config, read_model_file and read_model_part. Each input
// is read twice: as it is, and, when its first 1024 bytes are a header of a small enough shape, as that header with
// the input's body cut or padded with zeros to the size the shape needs, so that the parameter reader runs on any
// shape the fuzzer finds without the input carrying megabytes. Header word [8] (unused by the format) picks the
// unit padding. An accepted file must read back the same through the whole and the part readers, and be
// written again byte for byte by write_model_file.
#include "fuzz_util.h"
#include "model/model_file.h"

namespace {

constexpr size_t kMaxPaddedBytes = 1 << 20;

void read_and_check(const std::string& path, const uint8_t* data, size_t size) {
    ModelConfig config;
    if (refused([&] { config = read_model_config(path); })) return;
    const size_t unit_multiple = 8 * (1 + (uint32_t)header_word(data, size, 8) % 4);
    std::vector<float> values;
    if (refused([&] { read_model_file(path, values, unit_multiple); })) return;
    const ParameterLayout whole(config, unit_multiple);
    FUZZ_CHECK(values.size() == whole.total, "read_model_file fills the padded layout");

    // the whole model back as a file: the same bytes (fp32 copies, bf16 widened and rounded back exactly)
    const bool bf16 = header_word(data, size, 1) == kModelVersionBF16;
    const std::string copy = scratch_dir() + "/copy.bin";
    write_model_file(copy, whole, values, bf16);
    const std::string original = read_file(path), written = read_file(copy);
    FUZZ_CHECK(original.size() == written.size() && memcmp(original.data(), written.data(), 32) == 0 &&
                   memcmp(original.data() + 1024, written.data() + 1024, original.size() - 1024) == 0,
               "write_model_file gives back the header and the parameters read");

    // a tensor-parallel rank's slices of a pipeline stage: the same values as the whole model's
    for (int tp : {1, 2}) {
        if (!tensor_parallel_problem(config, tp).empty()) continue;
        StageModel stage;
        stage.first = false;
        for (int l = config.num_layers / 2; l < config.num_layers; l++) stage.layers.push_back(l);
        const ParameterLayout part(config, 8, tp, stage), full(config, unit_multiple);
        const std::vector<float> slices = read_model_part(path, part, tp - 1);
        FUZZ_CHECK(slices.size() == part.total, "read_model_part fills the part's layout");
        part.for_each_full_run(full, tp - 1, [&](size_t at_full, size_t at_part, size_t n) {
            FUZZ_CHECK(memcmp(&values[at_full], &slices[at_part], n * sizeof(float)) == 0, "a part holds the whole model's values");
        });
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = scratch_dir() + "/model.bin";
    write_file(path, data, size);
    read_and_check(path, data, size);

    // the header's shape, and the file that shape needs
    if (size < 1024) return 0;
    ModelConfig config;
    int version = 0;
    if (refused([&] {
            FILE* f = fopen(path.c_str(), "rb");
            config = read_model_header(f, path, &version);
            fclose(f);
        }))
        return 0;
    const size_t needed = 1024 + ParameterLayout(config).count * (version == kModelVersionFP32 ? 4 : 2);
    if (needed > kMaxPaddedBytes || needed == size) return 0;
    std::vector<uint8_t> padded(data, data + std::min(size, needed));
    padded.resize(needed, 0);
    write_file(path, padded.data(), padded.size());
    read_and_check(path, padded.data(), padded.size());
    return 0;
}
