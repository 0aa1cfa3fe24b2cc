// Fuzzes PEFT folders (model/peft_adapters.h: read_peft_folder and its JSON reader). An input is a folder: its first
// byte picks the unit padding, the next 4 bytes (little-endian) the length of adapter_config.json, which follows;
// the rest is adapter_model.safetensors. The model is a small Llama-family one (2 layers of 64 channels, one
// head, an MLP of 128 units). An accepted folder must be written again by write_peft_folder and read back with the
// same rank, alpha, targets and values, bitwise.
#include "fuzz_util.h"
#include "model/peft_adapters.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    ModelConfig config;
    config_from_preset("smollm2-135m", config);
    config.num_layers = 2;
    config.channels = 64;
    config.num_heads = 1;
    config.kv_heads = 1;
    config.ffn = 128;
    config.max_seq_len = 8;
    config.vocab_size = 100;
    config.padded_vocab_size = 128;
    if (size < 5) return 0;
    const size_t unit_multiple = 8 * (1 + data[0] % 4);
    uint32_t n = 0;
    memcpy(&n, data + 1, 4);
    n = (uint32_t)std::min<size_t>(n, size - 5);
    const std::string dir = scratch_dir() + "/peft";
    mkdir(dir.c_str(), 0777);
    write_file(dir + "/" + kPeftConfigName, data + 5, n);
    write_file(dir + "/" + kPeftWeightsName, data + 5 + n, size - 5 - n);

    std::vector<float> values;
    LoraSpec spec;
    if (refused([&] { spec = read_peft_folder(dir, config, unit_multiple, values); })) return 0;
    const AdapterLayout layout(config, spec, unit_multiple);
    FUZZ_CHECK(values.size() == layout.total, "the adapters fill their padded layout");
    const std::string copy = scratch_dir() + "/peft_copy/";
    write_peft_folder(copy, layout, values);
    std::vector<float> again;
    const LoraSpec back = read_peft_folder(copy, config, unit_multiple, again);
    FUZZ_CHECK(back.rank == spec.rank && back.alpha == spec.alpha && back.targets == spec.targets, "the spec written reads back");
    FUZZ_CHECK(again.size() == values.size() && memcmp(again.data(), values.data(), values.size() * sizeof(float)) == 0,
               "the adapters written read back bitwise");
    return 0;
}
