// Fuzzes LoRA adapter files (model/lora.h: read_adapter_file). The model the adapters are read for is the one the
// header names when it is small (1-4 layers, 64 or 128 channels), else 2 layers of 64 channels; header word [8]
// (unused by the format) picks the unit padding. Each input is read as it is and, when its header's rank and
// targets are usable, again with its body cut or padded with zeros to the size they need. An accepted file must
// be written again the same by write_adapter_file (its header's first 8 words and its body).
#include "fuzz_util.h"
#include "model/lora.h"

namespace {

void read_and_check(const std::string& path, const ModelConfig& config, size_t unit_multiple) {
    std::vector<float> values;
    LoraSpec spec;
    if (refused([&] { spec = read_adapter_file(path, config, unit_multiple, values); })) return;
    const AdapterLayout layout(config, spec, unit_multiple);
    FUZZ_CHECK(values.size() == layout.total, "the adapters fill their padded layout");
    const std::string copy = scratch_dir() + "/copy.bin";
    write_adapter_file(copy, layout, values);
    const std::string original = read_file(path), written = read_file(copy);
    FUZZ_CHECK(original.size() == written.size() && memcmp(original.data(), written.data(), 32) == 0 &&
                   memcmp(original.data() + 1024, written.data() + 1024, original.size() - 1024) == 0,
               "write_adapter_file gives back the header and the adapters read");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    ModelConfig config;
    config.num_layers = 2;
    config.channels = 64;
    const int layers = header_word(data, size, 5), channels = header_word(data, size, 6);
    if (layers >= 1 && layers <= 4 && (channels == 64 || channels == 128)) config.num_layers = layers, config.channels = channels;
    config.num_heads = config.channels / 64;
    config.max_seq_len = 8;
    config.vocab_size = 100;
    config.padded_vocab_size = 128;
    const size_t unit_multiple = 8 * (1 + (uint32_t)header_word(data, size, 8) % 4);

    const std::string path = scratch_dir() + "/adapters.bin";
    write_file(path, data, size);
    read_and_check(path, config, unit_multiple);

    LoraSpec spec;
    spec.rank = header_word(data, size, 2);
    spec.targets = (uint32_t)header_word(data, size, 4);
    if (size < 1024 || spec.rank < 1 || spec.rank > 64 || spec.targets < 1 || spec.targets > 15) return 0;
    const size_t needed = 1024 + 4 * AdapterLayout(config, spec, 8).count;
    if (needed == size) return 0;
    std::vector<uint8_t> padded(data, data + std::min(size, needed));
    padded.resize(needed, 0);
    write_file(path, padded.data(), padded.size());
    read_and_check(path, config, unit_multiple);
    return 0;
}
