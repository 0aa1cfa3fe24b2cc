// Fuzzes train_gpt's command line (train_options.h: parse_options, then validate_options): the input's first byte
// picks the number of ranks (1..16), the rest is the arguments, separated by NUL bytes. An argument starting with
// '@' names a file of the harness's own (the rest of the argument), among them a small model file, model.bin, and
// adapters for it, adapters.bin: --model @model.bin, --lora-load @adapters.bin. --help and -h are left out (they
// print and exit, as they should). Flags that validate_options accepts must give a run it can start: the mesh of
// the ranks given, a usable model, a pipeline split of its layers.
#include "fuzz_util.h"
#include "train_options.h"

namespace {

ModelConfig small_model() {
    ModelConfig c;
    c.num_layers = 4;
    c.channels = 128;
    c.num_heads = 2;
    c.max_seq_len = 16;
    c.vocab_size = 100;
    c.padded_vocab_size = 128;
    return c;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const ModelConfig config = small_model();
    const ParameterLayout layout(config);
    write_model_file(scratch_dir() + "/model.bin", layout, std::vector<float>(layout.total, 0.5f), true);
    LoraSpec spec;
    spec.rank = 2;
    spec.alpha = 4.0f;
    spec.targets = 1u << kLoraQkv | 1u << kLoraFc;
    const AdapterLayout adapters(config, spec, 8);
    write_adapter_file(scratch_dir() + "/adapters.bin", adapters, std::vector<float>(adapters.total, 0.25f));
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const int world = 1 + data[0] % 16;
    std::vector<std::string> args = {"train_gpt"};
    std::string arg;
    for (size_t i = 1; i <= size; i++) {
        if (i < size && data[i] != 0) {
            arg += (char)data[i];
            continue;
        }
        if (arg == "--help" || arg == "-h") return 0;
        args.push_back(arg[0] == '@' ? scratch_dir() + "/" + arg.substr(1) : arg);
        arg.clear();
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);

    Options options;
    if (refused([&] { options = parse_options((int)args.size(), argv.data()); })) return 0;
    RunShape run;
    if (refused([&] { run = validate_options(options, world); })) return 0;
    FUZZ_CHECK(run.shape.world() == world && run.shape.tp == options.tensor_parallel && run.shape.pp == options.pipeline_parallel,
               "the mesh holds the ranks given");
    FUZZ_CHECK(config_problem(run.config).empty() && tensor_parallel_problem(run.config, run.shape.tp).empty(), "the model is usable");
    const std::vector<int>& split = run.pipeline.per_virtual_stage;
    long layers = 0;
    for (int n : split) {
        FUZZ_CHECK(n >= 1, "every virtual stage holds a layer");
        layers += n;
    }
    FUZZ_CHECK((int)split.size() == run.shape.pp * run.pipeline.virtual_stages && layers == run.config.num_layers,
               "the pipeline split covers the model's layers");
    FUZZ_CHECK(!run.lora.enabled() || (run.lora.targets >= 1 && run.lora.targets <= 15), "LoRA has targets");
    return 0;
}
