// LoRA adapters as PEFT folders (model/peft_adapters.h, docs/lora.md "PEFT folders"), on the CPU: a write/read round
// trip bitwise for a small Llama-family model with all seven PEFT targets and with a subset; the safetensors header
// (names, shapes, dtypes, contiguous offsets, 8-byte alignment) and adapter_config.json's keys as written; BF16
// tensors widened on reading; the refusals (GPT-2, the fused targets, at flag-check time too) and a malformed folder's
// one-line errors; the JSON reader against malformed input; and, where python3 is at hand, the files read back by
// Python's own json and struct.
//
// A refusal ends the process (die()), so each runs in a forked child. Prints one PASS/FAIL line per check
// (test/check.h); exits 1 on any FAIL.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>
#include "../train_options.h"
#include "../model/peft_adapters.h"
#include "check.h"

static std::string g_dir;  // this run's scratch folder

static ModelConfig small_llama(int layers) {  // 4 query heads over 2 KV heads of 64, an MLP of 384 units
    ModelConfig c;
    if (!config_from_preset("smollm2-135m", c)) die("no preset smollm2-135m");
    c.num_layers = layers;
    c.channels = 256;
    c.num_heads = 4;
    c.kv_heads = 2;
    c.ffn = 384;
    c.vocab_size = 1000;
    c.padded_vocab_size = pad_vocab(1000);
    c.max_seq_len = 64;
    return c;
}

// The child must die with one line containing `text`.
static void expect_refusal(const std::string& name, const std::string& text, const std::function<void()>& body) {
    const std::string err = refusal(body);
    const bool one_line = !err.empty() && err.find('\n') == err.size() - 1;
    expect(one_line && err.find(text) != std::string::npos, name, "expected one line with '" + text + "', got: " + (err.empty() ? "no refusal" : err));
}

static std::string read_text(const std::string& path) {
    std::string s;
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) return s;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
    fclose(f);
    return s;
}
static void write_text(const std::string& path, const std::string& text) {
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
}

static unsigned targets_of(const char* list) {
    const unsigned t = parse_lora_targets(list);
    if (t == 0) die(std::string("bad targets ") + list);
    return t;
}

// Adapters with random values (every bit pattern class: signs, tiny, large) in the device layout, padding zero.
static std::vector<float> random_values(const AdapterLayout& layout, unsigned seed) {
    std::vector<float> v(layout.total, 0.0f);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int l = 0; l < layout.config.num_layers; l++)
        for (size_t i = 0; i < layout.layer_size(); i++) v[layout.unit_begin(l) + i] = normal(rng) * (i % 7 == 0 ? 1e-30f : i % 11 == 0 ? 1e20f : 1.0f);
    return v;
}

// Writes a folder, reads it back (also for another unit multiple), compares bitwise; returns the layout written.
static void test_round_trip(const std::string& label, const ModelConfig& c, const char* targets, float dropout) {
    LoraSpec spec;
    spec.rank = 4;
    spec.alpha = 8.5f;
    spec.dropout = dropout;
    spec.targets = targets_of(targets);
    const AdapterLayout layout(c, spec, 8);
    const std::vector<float> values = random_values(layout, 1234);
    const std::string dir = g_dir + "/" + label + "/";
    write_peft_folder(dir, layout, values);
    std::vector<float> back;
    const LoraSpec read = read_peft_folder(dir, c, 8, back);
    expect(read.rank == spec.rank && read.alpha == spec.alpha && read.targets == spec.targets && read.dropout == 0.0f,
           label + " spec round trip", "rank " + std::to_string(read.rank) + " targets " + std::to_string(read.targets));
    expect(back.size() == values.size() && memcmp(back.data(), values.data(), values.size() * sizeof(float)) == 0, label + " values bitwise",
           "the values read differ from those written");
    // another padding (a run on 3 data-parallel ranks): the same tensors at other offsets
    std::vector<float> wide;
    read_peft_folder(dir.substr(0, dir.size() - 1), c, 24, wide);  // a folder named without its trailing '/'
    const AdapterLayout other(c, spec, 24);
    bool same = wide.size() == other.total;
    for (int l = 0; l < c.num_layers && same; l++)
        same = memcmp(&wide[other.unit_begin(l)], &values[layout.unit_begin(l)], layout.layer_size() * sizeof(float)) == 0;
    expect(same, label + " values bitwise at another unit multiple", "differ");
    // rewriting over an existing folder (no trailing '/': an existing folder is a PEFT folder) gives the same bytes
    const std::string weights = read_text(peft_file(dir, kPeftWeightsName)), config = read_text(peft_file(dir, kPeftConfigName));
    expect(is_peft_folder_path(dir.substr(0, dir.size() - 1)), label + " an existing folder is a PEFT folder path", "not recognised");
    write_peft_folder(dir.substr(0, dir.size() - 1), layout, values);
    expect(read_text(peft_file(dir, kPeftWeightsName)) == weights && read_text(peft_file(dir, kPeftConfigName)) == config,
           label + " rewrite is byte-identical", "the files changed");
    expect(!file_exists(peft_file(dir, kPeftWeightsName) + ".tmp") && !file_exists(peft_file(dir, kPeftConfigName) + ".tmp"),
           label + " no temporary files left", "a .tmp file remains");

    // the safetensors header: every tensor's name, dtype, shape and contiguous offsets, the data 8-byte aligned
    uint64_t n = 0;
    memcpy(&n, weights.data(), 8);
    JsonValue header;
    const std::string problem = n <= weights.size() - 8 ? parse_json(weights.substr(8, n), header) : "header length past the end";
    std::string wrong = problem;
    if (wrong.empty() && (n % 8 != 0 || header.kind != JsonValue::kObject)) wrong = "header length " + std::to_string(n) + " or kind";
    const JsonValue* meta = header.find("__metadata__");
    if (wrong.empty() && (meta == nullptr || meta->find("format") == nullptr || meta->find("format")->text != "pt")) wrong = "no __metadata__ format pt";
    uint64_t offset = 0;
    size_t tensors = 0;
    for (int l = 0; l < c.num_layers && wrong.empty(); l++)
        for (int t = 0; t < kLoraTargets && wrong.empty(); t++) {
            if (!spec.targets_has(t)) continue;
            for (const char ab : {'A', 'B'}) {
                const std::string name = peft_tensor_name(l, t, ab);
                const JsonValue* e = header.find(name);
                const uint64_t rows = ab == 'A' ? spec.rank : lora_out(t, c), cols = ab == 'A' ? lora_in(t, c) : spec.rank;
                if (e == nullptr || e->find("dtype") == nullptr || e->find("dtype")->text != "F32" || e->find("shape")->items.size() != 2 ||
                    e->find("shape")->items[0].number != rows || e->find("shape")->items[1].number != cols ||
                    e->find("data_offsets")->items[0].number != offset || e->find("data_offsets")->items[1].number != offset + rows * cols * 4) {
                    wrong = name + " missing or wrong";
                    break;
                }
                offset += rows * cols * 4;
                tensors++;
            }
        }
    if (wrong.empty() && header.members.size() != tensors + 1) wrong = std::to_string(header.members.size()) + " header entries";
    if (wrong.empty() && 8 + n + offset != weights.size()) wrong = "data size " + std::to_string(weights.size() - 8 - n) + ", offsets end at " + std::to_string(offset);
    expect(wrong.empty(), label + " safetensors header: names, F32, shapes, contiguous offsets", wrong);
    // the names PEFT gives Llama's modules, spelled out once
    if (spec.targets_has(kLoraFcProj))
        expect(header.find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight") != nullptr &&
                   header.find("base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight") != nullptr,
               label + " PEFT's names of o_proj and down_proj", "absent");

    // adapter_config.json: every key PEFT's LoraConfig needs here, with its value
    JsonValue json;
    wrong = parse_json(config, json);
    const auto has = [&](const char* key, JsonValue::Kind kind) { return json.find(key) != nullptr && json.find(key)->kind == kind; };
    if (wrong.empty()) {
        if (!has("peft_type", JsonValue::kString) || json.find("peft_type")->text != "LORA") wrong += " peft_type";
        if (!has("task_type", JsonValue::kString) || json.find("task_type")->text != "CAUSAL_LM") wrong += " task_type";
        if (!has("r", JsonValue::kNumber) || json.find("r")->number != spec.rank) wrong += " r";
        if (!has("lora_alpha", JsonValue::kNumber) || (float)json.find("lora_alpha")->number != spec.alpha) wrong += " lora_alpha";
        if (!has("lora_dropout", JsonValue::kNumber) || (float)json.find("lora_dropout")->number != dropout) wrong += " lora_dropout";
        if (!has("bias", JsonValue::kString) || json.find("bias")->text != "none") wrong += " bias";
        for (const char* key : {"fan_in_fan_out", "use_rslora"})
            if (!has(key, JsonValue::kBool) || json.find(key)->boolean) wrong += std::string(" ") + key;
        for (const char* key : {"inference_mode", "init_lora_weights"})
            if (!has(key, JsonValue::kBool) || !json.find(key)->boolean) wrong += std::string(" ") + key;
        for (const char* key : {"base_model_name_or_path", "modules_to_save"})
            if (!has(key, JsonValue::kNull)) wrong += std::string(" ") + key;
        unsigned modules = 0;
        if (has("target_modules", JsonValue::kArray))
            for (const JsonValue& m : json.find("target_modules")->items)
                for (int t = 0; t < kLoraTargets; t++)
                    if (peft_module_name(t) != nullptr && m.text == peft_module_name(t)) modules |= 1u << t;
        if (modules != spec.targets) wrong += " target_modules";
        if (json.members.size() != 13) wrong += " " + std::to_string(json.members.size()) + " keys";
    }
    expect(wrong.empty(), label + " adapter_config.json keys and values", wrong);
}

// A safetensors file from (name, dtype, shape, bytes) entries.
struct Entry {
    std::string name, dtype;
    std::vector<uint64_t> shape;
    std::string bytes;
};
static void write_safetensors(const std::string& path, const std::vector<Entry>& entries) {
    std::string h = "{", data;
    for (const Entry& e : entries) {
        std::string shape;
        for (uint64_t d : e.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
        h += (h.size() > 1 ? "," : "") + std::string("\"") + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
             std::to_string(data.size()) + "," + std::to_string(data.size() + e.bytes.size()) + "]}";
        data += e.bytes;
    }
    h += "}";
    const uint64_t n = h.size();
    write_text(path, std::string((const char*)&n, 8) + h + data);
}

// One layer's q and v adapters of rank 2 as a folder; `edit` changes the entries or the config first.
static std::string make_folder(const std::string& label, const ModelConfig& c, const std::function<void(std::vector<Entry>&, std::string&)>& edit) {
    const std::string dir = g_dir + "/" + label;
    mkdir(dir.c_str(), 0777);
    std::vector<Entry> entries;
    for (int l = 0; l < c.num_layers; l++)
        for (const int t : {kLoraQ, kLoraV}) {
            entries.push_back({peft_tensor_name(l, t, 'A'), "F32", {2, (uint64_t)lora_in(t, c)}, std::string(2 * lora_in(t, c) * 4, '\0')});
            entries.push_back({peft_tensor_name(l, t, 'B'), "F32", {(uint64_t)lora_out(t, c), 2}, std::string(2 * lora_out(t, c) * 4, '\0')});
        }
    std::string config = "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 16, \"target_modules\": [\"v_proj\", \"q_proj\"], \"bias\": \"none\"}";
    edit(entries, config);
    write_safetensors(dir + "/" + kPeftWeightsName, entries);
    write_text(dir + "/" + kPeftConfigName, config);
    return dir;
}

static void test_bf16_and_foreign_order(const ModelConfig& c) {
    // BF16 tensors (PEFT's usual dtype for bf16 models) widen exactly; entries in any order, config keys PEFT adds
    std::vector<float> expected;
    const std::string dir = make_folder("bf16", c, [&](std::vector<Entry>& entries, std::string& config) {
        for (Entry& e : entries) {
            const uint64_t count = e.shape[0] * e.shape[1];
            e.dtype = "BF16";
            e.bytes.assign(2 * count, '\0');
            for (uint64_t i = 0; i < count; i++) {
                const uint16_t bits = (uint16_t)(0x3F80 + (i % 97) * 3 + (e.name.find("lora_B") != std::string::npos ? 0x8000 : 0));
                memcpy(&e.bytes[2 * i], &bits, 2);
            }
        }
        std::swap(entries.front(), entries.back());
        config = "{\"alpha_pattern\": {}, \"rank_pattern\": {}, \"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 16, \"lora_dropout\": 0.1,"
                 " \"target_modules\": [\"v_proj\", \"q_proj\"], \"modules_to_save\": null, \"layers_pattern\": null, \"revision\": null}";
    });
    std::vector<float> values;
    const LoraSpec spec = read_peft_folder(dir, c, 8, values);
    const AdapterLayout layout(c, spec, 8);
    bool same = spec.targets == (1u << kLoraQ | 1u << kLoraV) && spec.rank == 2 && spec.alpha == 16.0f;
    for (int l = 0; l < c.num_layers && same; l++)
        for (const int t : {kLoraQ, kLoraV})
            for (const char ab : {'A', 'B'}) {
                const size_t count = ab == 'A' ? 2 * lora_in(t, c) : 2 * lora_out(t, c);
                const float* got = &values[ab == 'A' ? layout.a(l, t) : layout.b(l, t)];
                for (size_t i = 0; i < count && same; i++) {
                    const uint32_t bits = (uint32_t)(0x3F80 + (i % 97) * 3 + (ab == 'B' ? 0x8000 : 0)) << 16;
                    float want;
                    memcpy(&want, &bits, 4);
                    same = memcmp(&got[i], &want, 4) == 0;
                }
            }
    expect(same, "BF16 tensors widen exactly, any entry order, PEFT's other keys", "values or spec differ");
}

static void test_refusals(const ModelConfig& llama) {
    ModelConfig gpt2;
    config_from_descriptor("d6", gpt2);
    gpt2.num_layers = 2;
    LoraSpec spec;
    spec.rank = 2;
    spec.alpha = 2;
    spec.targets = targets_of("q,v");
    expect_refusal("GPT-2 adapters refused", "a PEFT folder holds adapters of a Llama-family model", [&] {
        write_peft_folder(g_dir + "/gpt2/", AdapterLayout(gpt2, spec, 8), std::vector<float>(AdapterLayout(gpt2, spec, 8).total));
    });
    for (const char* fused : {"qkv", "fc", "q,fc"}) {
        LoraSpec s = spec;
        s.targets = targets_of(fused);
        expect_refusal(std::string("fused target refused: ") + fused, std::string("PEFT has no module for the fused target ") + (fused[0] == 'q' && fused[1] == 'k' ? "qkv" : "fc"),
                       [&] { write_peft_folder(g_dir + "/fused/", AdapterLayout(llama, s, 8), std::vector<float>(AdapterLayout(llama, s, 8).total)); });
    }
    expect(!file_exists(g_dir + "/fused") && !file_exists(g_dir + "/gpt2"), "a refused save creates no folder", "a folder was created");
    // at flag-check time, before any GPU work (validate_options)
    const auto validate = [](std::vector<std::string> args) {
        return [args] {
            std::vector<std::string> storage = {"train_gpt"};
            storage.insert(storage.end(), args.begin(), args.end());
            std::vector<char*> argv;
            for (std::string& a : storage) argv.push_back(&a[0]);
            const Options o = parse_options((int)argv.size(), argv.data());
            validate_options(o, 1);
        };
    };
    const std::vector<std::string> small = {"--layers", "2", "--heads", "1", "--channels", "64", "--max-seq-len", "64", "--seq-len", "32", "--lora-rank", "4"};
    const std::string folder = g_dir + "/flags/";
    std::vector<std::string> args = small;
    args.insert(args.end(), {"--lora-save", folder});
    expect_refusal("--lora-save DIR/ with GPT-2 refused by validate_options", "--lora-save " + folder + ": a PEFT folder holds adapters of a Llama-family model", validate(args));
    args = small;
    args.insert(args.end(), {"--arch", "llama", "--lora-targets", "q,fc", "--lora-save", folder});
    expect_refusal("--lora-save DIR/ with fc refused by validate_options", "--lora-save " + folder + ": PEFT has no module for the fused target fc: use gate,up", validate(args));
    args = small;
    args.insert(args.end(), {"--arch", "llama", "--lora-targets", "q,k,v,o,gate,up,down", "--lora-save", folder});
    expect(refusal(validate(args)).empty(), "--lora-save DIR/ with the seven targets accepted", refusal(validate(args)));
    args = small;
    args.insert(args.end(), {"--arch", "llama", "--lora-targets", "qkv", "--lora-save", g_dir + "/adapters.bin"});
    expect(refusal(validate(args)).empty(), "--lora-save FILE with qkv accepted (an adapter file)", refusal(validate(args)));

    // a malformed folder: one line naming the file
    const auto read = [&](const std::string& dir, const ModelConfig& c) {
        return [dir, c] {
            std::vector<float> values;
            read_peft_folder(dir, c, 8, values);
        };
    };
    const auto none = [](std::vector<Entry>&, std::string&) {};
    const std::string good = make_folder("good", llama, none);
    expect(refusal(read(good, llama)).empty(), "a hand-made folder reads", refusal(read(good, llama)));
    expect_refusal("GPT-2 model refuses a PEFT folder", good + ": a PEFT folder holds adapters of a Llama-family model", read(good, gpt2));
    expect_refusal("missing config", g_dir + "/nothing/adapter_config.json: cannot open: No such file or directory", read(g_dir + "/nothing/", llama));
    struct Case {
        const char* name;
        std::function<void(std::vector<Entry>&, std::string&)> edit;
        std::string file, text;
    };
    const std::string cfg = std::string("/") + kPeftConfigName + ": ", st = std::string("/") + kPeftWeightsName + ": ";
    const std::vector<Case> cases = {
        {"config not JSON", [](std::vector<Entry>&, std::string& c) { c = "{\"r\": 2,}"; }, cfg, "not JSON: expected a key at byte 8"},
        {"config not an object", [](std::vector<Entry>&, std::string& c) { c = "[]"; }, cfg, "expected a JSON object"},
        {"peft_type other", [](std::vector<Entry>&, std::string& c) { c.replace(c.find("LORA"), 4, "IA3"); }, cfg, "peft_type must be \"LORA\""},
        {"r not an integer", [](std::vector<Entry>&, std::string& c) { c.replace(c.find("\"r\": 2"), 6, "\"r\": 2.5"); }, cfg, "r must be an integer in 1..65536"},
        {"alpha zero", [](std::vector<Entry>&, std::string& c) { c.replace(c.find("16"), 2, "0"); }, cfg, "lora_alpha must be a finite positive number"},
        {"unknown module", [](std::vector<Entry>&, std::string& c) { c.replace(c.find("v_proj"), 6, "lm_head"); }, cfg,
         "unknown module \"lm_head\" in target_modules (expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"},
        {"target_modules a string", [](std::vector<Entry>&, std::string& c) { c.replace(c.find("[\"v_proj\", \"q_proj\"]"), 20, "\"all-linear\""); }, cfg,
         "target_modules must be a non-empty list of module names"},
        {"rslora", [](std::vector<Entry>&, std::string& c) { c.insert(1, "\"use_rslora\": true, "); }, cfg, "use_rslora must be false (the scale is alpha / r)"},
        {"rank pattern", [](std::vector<Entry>&, std::string& c) { c.insert(1, "\"rank_pattern\": {\"q_proj\": 4}, "); }, cfg, "rank_pattern must be empty"},
        {"missing tensor", [](std::vector<Entry>& e, std::string&) { e.erase(e.begin() + 1); }, st,
         "missing tensor base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"},
        {"wrong shape", [](std::vector<Entry>& e, std::string&) { e[0].shape = {4, 128}; }, st,
         "tensor base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has shape [4, 128], the model and r give [2, 256]"},
        {"F16 tensor", [](std::vector<Entry>& e, std::string&) { e[2].dtype = "F16"; e[2].bytes.resize(e[2].bytes.size() / 2); }, st,
         "tensor base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight has dtype F16 (expected F32 or BF16)"},
        {"unknown tensor", [](std::vector<Entry>& e, std::string&) { e.push_back({"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", "F32", {2, 256}, std::string(2048, '\0')}); }, st,
         "unknown tensor base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight (not an adapter of target_modules)"},
        {"short data", [](std::vector<Entry>& e, std::string&) { e.back().bytes.resize(8); }, st,
         "tensor base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight: data_offsets 13312..13320 do not hold F32 [128, 2] inside the file"},
    };
    for (const Case& k : cases) {
        const std::string dir = make_folder(std::string("bad_") + k.name, llama, k.edit);
        expect_refusal(std::string("refused: ") + k.name, dir + k.file + k.text, read(dir, llama));
    }
    const std::string dir = make_folder("bad_header_length", llama, none);
    write_text(dir + "/" + kPeftWeightsName, std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10));
    expect_refusal("refused: header length past the end", dir + st + "not a safetensors file (header length 4294967295, file size 10 bytes)", read(dir, llama));
}

static void test_json() {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"", "unexpected end"},   {"{\"a\":1,}", "expected a key"},      {"{\"a\":1,\"a\":2}", "duplicate key"},
        {"[1,]", "unexpected character"}, {"01", "trailing characters"}, {"\"a\nb\"", "control character"},
        {"\"\\x\"", "bad escape"}, {"\"\\ud800\"", "unpaired surrogate"}, {"\"abc", "unterminated string"},
        {"1.", "bad number"},     {"-", "unexpected character"},         {"tru", "unexpected character"},
        {std::string(100000, '['), "nested too deeply"}, {"{\"a\" 1}", "expected :"}, {"[1 2]", "expected , or ]"},
    };
    std::string wrong;
    for (const auto& b : bad) {
        JsonValue v;
        const std::string problem = parse_json(b.first, v);
        if (problem.find(b.second) == std::string::npos) wrong += " [" + b.first.substr(0, 20) + "]: '" + problem + "'";
    }
    expect(wrong.empty(), "JSON reader refuses malformed input", wrong);
    JsonValue v;
    const std::string problem = parse_json(" {\"s\": \"a\\u00e9\\ud83d\\ude00\\n\", \"n\": -1.5e2, \"l\": [true, false, null, {}], \"z\": 0}\n", v);
    const bool ok = problem.empty() && v.find("s")->text == "a\xc3\xa9\xf0\x9f\x98\x80\n" && v.find("n")->number == -150.0 && v.find("l")->items.size() == 4 &&
                    v.find("l")->items[2].kind == JsonValue::kNull && v.find("z")->natural();
    expect(ok, "JSON reader reads strings, escapes, numbers, literals", problem);
}

// Python's json and struct read the files back (skipped without python3): every tensor's first and last float.
static void test_python(const std::string& dir, const AdapterLayout& layout, const std::vector<float>& values) {
    if (system("python3 -c '' > /dev/null 2>&1") != 0) {
        skip("python3 reads the folder", "no python3");
        return;
    }
    const std::string script = g_dir + "/read.py";
    write_text(script,
               "import json, struct, sys\n"
               "d = sys.argv[1]\n"
               "cfg = json.load(open(d + '/adapter_config.json'))\n"
               "assert cfg['peft_type'] == 'LORA' and cfg['r'] == 4, cfg\n"
               "b = open(d + '/adapter_model.safetensors', 'rb').read()\n"
               "n = struct.unpack('<Q', b[:8])[0]\n"
               "h = json.loads(b[8:8 + n])\n"
               "for name, e in h.items():\n"
               "    if name == '__metadata__': continue\n"
               "    s, t = e['data_offsets']\n"
               "    assert e['dtype'] == 'F32' and t - s == 4 * e['shape'][0] * e['shape'][1], name\n"
               "    print(name, struct.unpack('<I', b[8 + n + s:8 + n + s + 4])[0], struct.unpack('<I', b[8 + n + t - 4:8 + n + t])[0])\n");
    FILE* p = popen(("python3 " + script + " " + dir + " 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int rc = pclose(p);
    std::string expected;
    for (int l = 0; l < layout.config.num_layers; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            if (!layout.spec.targets_has(t)) continue;
            for (const char ab : {'A', 'B'}) {
                const size_t begin = ab == 'A' ? layout.a(l, t) : layout.b(l, t);
                const size_t count = ab == 'A' ? (size_t)layout.spec.rank * lora_in(t, layout.config) : (size_t)lora_out(t, layout.config) * layout.spec.rank;
                uint32_t first, last;
                memcpy(&first, &values[begin], 4);
                memcpy(&last, &values[begin + count - 1], 4);
                expected += peft_tensor_name(l, t, ab) + " " + std::to_string(first) + " " + std::to_string(last) + "\n";
            }
        }
    expect(rc == 0 && out == expected, "python3's json and struct read the folder: names, shapes, offsets, values", "rc " + std::to_string(rc) + ": " + out.substr(0, 300));
}

int main() {
    check_suite("peft");
    char dir_template[] = "/tmp/test_peft_XXXXXX";
    g_dir = mkdtemp(dir_template);
    const ModelConfig llama = small_llama(2);
    guarded("round trips", [&] {
        test_round_trip("all seven", llama, "q,k,v,o,gate,up,down", 0.05f);
        test_round_trip("subset q,v", small_llama(3), "q,v", 0.0f);
        test_round_trip("subset o,down", llama, "attn-proj,fc-proj", 0.1f);
    });
    test_bf16_and_foreign_order(llama);
    test_refusals(llama);
    test_json();
    LoraSpec spec;
    spec.rank = 4;
    spec.alpha = 4;
    spec.targets = targets_of("q,k,v,o,gate,up,down");
    const AdapterLayout layout(llama, spec, 8);
    const std::vector<float> values = random_values(layout, 99);
    write_peft_folder(g_dir + "/python/", layout, values);
    test_python(g_dir + "/python", layout, values);
    if (check_failures() == 0) system(("rm -rf " + g_dir).c_str());
    return check_failures() > 0 ? 1 : 0;
}
