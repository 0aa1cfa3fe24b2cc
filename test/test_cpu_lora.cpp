// Checks LoRA in the C++ CPU reference (cpu_reference.h) against the PyTorch reference and on its own.
//
// Usage: test_cpu_lora [FIXTURE_DIR]. Without a fixture: train_gpt's slice targets (model/lora.h: q, k, v of the qkv
// product's output, gate and up of the Llama family's fc) against a dense reference, an adapter on the whole product
// whose A stacks the slices' and whose B is block-diagonal, which computes the same: the forward and backward as
// lora_forward/lora_backward compute them (the slice's rows `stride` apart from its first column), the merge, and
// the adapter file's round trip. With FIXTURE_DIR, a directory written by
// `test/tools/make_cpu_fixture.sh --lora FIXTURE_DIR`, also the CPU reference against PyTorch:
//   model.bin         base model (2 layers, C=128, 2 heads)
//   lora_init.bin     its initial adapters: r=4, alpha=8, all four targets, B ~ N(0, 0.02) so that the adapters
//                     matter from step 0
//   lora_state.bin    LoRA debug state of 10 steps from there (docs/lora.md)
//   merged.bin        export-merged of model.bin and lora_init.bin
//   lora_dropout.bin  the adapters after 2 steps of `train` from lora_init.bin with adapter dropout 0.1
// Scratch files go to FIXTURE_DIR too. Prints one line per check (check.h) and exits 1 if any failed; a bad
// fixture file is a one-line error and exit 1.
//
// Tolerances: 1e-5 relative against PyTorch (fp32 on both sides; see test_cpu_reference.cpp for why), 1e-5
// absolute between merged and unmerged logits (the merged weights are rounded once more), 1e-6 absolute for
// merge-then-unmerge (W0 + D - D is W0 to within an ulp of W0 + D) and for our merge against PyTorch's
// export-merged (both sum in double and round once). Bitwise where nothing is rounded differently: logits with
// B = 0, base weights after training, adapter file bytes, save/load.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../model/lora.h"
#include "check.h"
#include "cpu_reference.h"
#include "debug_state.h"

namespace {

constexpr double kTol = 1e-5;
constexpr double kMergeTol = 1e-6;

// The adapter layout docs/lora.md specifies (written out here independently of cpu_reference.cpp): per layer, per
// target in this order, A (r, in) then B (out, r); in and out in units of C.
struct TargetInfo {
    const char* name;
    unsigned bit;
    int in_mult, out_mult;
};
constexpr TargetInfo kTargets[4] = {{"qkv", cpuref::kLoraQkv, 1, 3},
                                    {"attn-proj", cpuref::kLoraAttnProj, 1, 1},
                                    {"fc", cpuref::kLoraFc, 1, 4},
                                    {"fc-proj", cpuref::kLoraFcProj, 4, 1}};

struct AdapterTensor {
    std::string name;  // e.g. "l1_fc_B"
    size_t offset, size;
};

std::vector<AdapterTensor> adapter_layout(const cpuref::Config& c, const cpuref::LoraConfig& lc) {
    std::vector<AdapterTensor> out;
    size_t offset = 0;
    for (int l = 0; l < c.num_layers; l++)
        for (const TargetInfo& t : kTargets) {
            if (!(lc.targets & t.bit)) continue;
            const size_t a = (size_t)lc.rank * t.in_mult * c.channels, b = (size_t)t.out_mult * c.channels * lc.rank;
            const std::string prefix = "l" + std::to_string(l) + "_" + t.name;
            out.push_back({prefix + "_A", offset, a});
            out.push_back({prefix + "_B", offset + a, b});
            offset += a + b;
        }
    return out;
}

double max_abs_diff(const float* a, const float* b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = std::fmax(m, std::isfinite(a[i]) ? std::fabs((double)a[i] - b[i]) : INFINITY);
    return m;
}

void check_max_abs(const std::string& name, const float* ours, const float* ref, size_t n, double tol) {
    const double err = max_abs_diff(ours, ref, n);
    check(err <= tol, name, fmt("max abs error %.3e (tolerance %.0e)", err, tol));
}

bool same_bits(const std::vector<float>& a, const float* b) {
    return std::memcmp(a.data(), b, a.size() * sizeof(float)) == 0;
}

std::vector<char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
}

// Logits (B*T, V) of the last forward without the padded columns.
std::vector<float> unpadded_logits(const cpuref::Model* model, size_t rows) {
    const cpuref::Config& c = cpuref::model_config(model);
    const float* logits = cpuref::model_logits(model);
    std::vector<float> out(rows * c.vocab_size);
    for (size_t n = 0; n < rows; n++)
        std::memcpy(&out[n * c.vocab_size], logits + n * c.padded_vocab_size, c.vocab_size * sizeof(float));
    return out;
}

std::vector<float> lora_params_copy(cpuref::Model* model) {
    const float* p = cpuref::model_lora_params(model);
    return std::vector<float>(p, p + cpuref::model_lora_num_params(model));
}

// Every listed adapter tensor differs from its value in `before` in at least one element.
bool all_tensors_changed(const std::vector<AdapterTensor>& layout, const std::vector<float>& before, const float* now) {
    for (const AdapterTensor& t : layout)
        if (std::memcmp(before.data() + t.offset, now + t.offset, t.size * sizeof(float)) == 0) return false;
    return true;
}


// ---- Slice targets (model/lora.h) against a dense adapter on the whole product.

// What lora_forward computes, in double: u = x A^T (N, r), out[n, j * ld] += s (u B^T)[n, j] for the adapter's
// out_w columns, `out` at its first column.
void slice_forward(double* out, int ld, std::vector<double>& u, const double* x, const double* A, const double* Bm, double s, int N,
                   int in, int out_w, int r) {
    u.assign((size_t)N * r, 0.0);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < r; k++)
            for (int i = 0; i < in; i++) u[(size_t)n * r + k] += x[(size_t)n * in + i] * A[(size_t)k * in + i];
    for (int n = 0; n < N; n++)
        for (int o = 0; o < out_w; o++) {
            double acc = 0.0;
            for (int k = 0; k < r; k++) acc += u[(size_t)n * r + k] * Bm[(size_t)o * r + k];
            out[(size_t)n * ld + o] += s * acc;
        }
}
// What lora_backward computes, in double, from dout's columns of the adapter (rows ld apart): dB += s dout^T u,
// du = s dout B, dA += du^T x, dx += du A.
void slice_backward(double* dx, double* dA, double* dB, const double* dout, int ld, const std::vector<double>& u, const double* x,
                    const double* A, const double* Bm, double s, int N, int in, int out_w, int r) {
    std::vector<double> du((size_t)N * r, 0.0);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < out_w; o++) {
            const double g = dout[(size_t)n * ld + o];
            for (int k = 0; k < r; k++) {
                dB[(size_t)o * r + k] += s * g * u[(size_t)n * r + k];
                du[(size_t)n * r + k] += s * g * Bm[(size_t)o * r + k];
            }
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < r; k++)
            for (int i = 0; i < in; i++) {
                dA[(size_t)k * in + i] += du[(size_t)n * r + k] * x[(size_t)n * in + i];
                dx[(size_t)n * in + i] += du[(size_t)n * r + k] * A[(size_t)k * in + i];
            }
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
    double m = a.size() == b.size() ? 0.0 : INFINITY;
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++) m = std::fmax(m, std::fabs(a[i] - b[i]));
    return m;
}

// Slice targets `slices` of product p (kLoraQkv or kLoraFc) of a model of shape c, rank r: their forward, backward
// and merge against the dense adapter of rank r x slices on p. The slices must tile the product's output in order.
void check_slices_against_dense(const std::string& label, const ModelConfig& c, int p, const std::vector<int>& slices, int r) {
    uint64_t state = 12345;
    auto uniform = [&]() {  // deterministic values in (-1, 1) without <random>'s distribution differences
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return (double)(state >> 11) / (double)(1ull << 52) - 1.0;
    };
    const int N = 6, in = lora_in(p, c), W = lora_out(p, c), R = r * (int)slices.size();
    const double s = 2.0 / r;
    // the slices tile the product's output
    int column = 0;
    bool tiles = true;
    for (int t : slices) {
        tiles = tiles && lora_product(t) == p && lora_out_offset(t, c) == column && lora_out_stride(t, c) == W && lora_in(t, c) == in;
        column += lora_out(t, c);
    }
    expect(tiles && column == W, label + "_slices_tile_the_product", "offsets, widths and strides do not tile the output");
    std::vector<double> x((size_t)N * in), dout((size_t)N * W), base((size_t)N * W);
    for (double& v : x) v = uniform();
    for (double& v : dout) v = uniform();
    for (double& v : base) v = uniform();
    // the slices' adapters, and the dense one: A stacked, B block-diagonal
    std::vector<std::vector<double>> As, Bs;
    std::vector<double> A_dense((size_t)R * in, 0.0), B_dense((size_t)W * R, 0.0);
    for (size_t j = 0; j < slices.size(); j++) {
        const int w = lora_out(slices[j], c), offset = lora_out_offset(slices[j], c);
        As.emplace_back((size_t)r * in);
        Bs.emplace_back((size_t)w * r);
        for (double& v : As[j]) v = uniform();
        for (double& v : Bs[j]) v = uniform();
        std::copy(As[j].begin(), As[j].end(), A_dense.begin() + (size_t)j * r * in);
        for (int o = 0; o < w; o++)
            for (int k = 0; k < r; k++) B_dense[(size_t)(offset + o) * R + j * r + k] = Bs[j][(size_t)o * r + k];
    }
    // forward and backward
    std::vector<double> out_slices = base, out_dense = base, u, dx_slices((size_t)N * in, 0.0), dx_dense((size_t)N * in, 0.0);
    std::vector<double> dA_dense((size_t)R * in, 0.0), dB_dense((size_t)W * R, 0.0), dA_slices((size_t)R * in, 0.0), dB_slices((size_t)W * R, 0.0);
    slice_forward(out_dense.data(), W, u, x.data(), A_dense.data(), B_dense.data(), s, N, in, W, R);
    slice_backward(dx_dense.data(), dA_dense.data(), dB_dense.data(), dout.data(), W, u, x.data(), A_dense.data(), B_dense.data(), s, N, in, W, R);
    for (size_t j = 0; j < slices.size(); j++) {
        const int t = slices[j], w = lora_out(t, c), offset = lora_out_offset(t, c), ld = lora_out_stride(t, c);
        std::vector<double> dA((size_t)r * in, 0.0), dB((size_t)w * r, 0.0);
        slice_forward(out_slices.data() + offset, ld, u, x.data(), As[j].data(), Bs[j].data(), s, N, in, w, r);
        slice_backward(dx_slices.data(), dA.data(), dB.data(), dout.data() + offset, ld, u, x.data(), As[j].data(), Bs[j].data(), s, N, in, w, r);
        std::copy(dA.begin(), dA.end(), dA_slices.begin() + (size_t)j * r * in);
        for (int o = 0; o < w; o++)
            for (int k = 0; k < r; k++) dB_slices[(size_t)(offset + o) * R + j * r + k] = dB[(size_t)o * r + k];
    }
    // the dense adapter's B gradient off its diagonal blocks is what a block-diagonal B never trains: zero it
    for (size_t j = 0; j < slices.size(); j++) {
        const int offset = lora_out_offset(slices[j], c), w = lora_out(slices[j], c);
        for (int o = 0; o < W; o++)
            if (o < offset || o >= offset + w)
                for (int k = 0; k < r; k++) dB_dense[(size_t)o * R + j * r + k] = 0.0;
    }
    constexpr double kSliceTol = 1e-12;  // double sums of the same terms, the dense ones with exact zeros among them
    check(max_abs_diff(out_slices, out_dense) <= kSliceTol, label + "_forward_matches_dense", fmt("max abs difference %.3g", max_abs_diff(out_slices, out_dense)));
    check(max_abs_diff(dx_slices, dx_dense) <= kSliceTol, label + "_dx_matches_dense", fmt("max abs difference %.3g", max_abs_diff(dx_slices, dx_dense)));
    check(max_abs_diff(dA_slices, dA_dense) <= kSliceTol, label + "_dA_matches_dense", fmt("max abs difference %.3g", max_abs_diff(dA_slices, dA_dense)));
    check(max_abs_diff(dB_slices, dB_dense) <= kSliceTol, label + "_dB_matches_dense", fmt("max abs difference %.3g", max_abs_diff(dB_slices, dB_dense)));

    // merge_adapters: the slices' adapters and the dense one (alpha scaled with the rank: the same s) give the same
    // weights, bit for bit (the same double sums but for exact zeros), and only the product's weight changes
    const ParameterLayout layout(c);
    std::vector<float> weights(layout.total);
    for (float& v : weights) v = (float)uniform();
    LoraSpec slice_spec, dense_spec;
    slice_spec.rank = r;
    slice_spec.alpha = 2.0f;
    for (int t : slices) slice_spec.targets |= 1u << t;
    dense_spec.rank = R;
    dense_spec.alpha = 2.0f * (float)slices.size();
    dense_spec.targets = 1u << p;
    const AdapterLayout slice_layout(c, slice_spec, 8), dense_layout(c, dense_spec, 8);
    std::vector<float> slice_values(slice_layout.total, 0.0f), dense_values(dense_layout.total, 0.0f);
    for (int l = 0; l < c.num_layers; l++)
        for (size_t j = 0; j < slices.size(); j++) {
            const int t = slices[j], w = lora_out(t, c), offset = lora_out_offset(t, c);
            for (size_t i = 0; i < (size_t)r * in; i++) {
                const float a = (float)uniform();
                slice_values[slice_layout.a(l, t) + i] = a;
                dense_values[dense_layout.a(l, p) + j * r * in + i] = a;
            }
            for (int o = 0; o < w; o++)
                for (int k = 0; k < r; k++) {
                    const float b = (float)uniform();
                    slice_values[slice_layout.b(l, t) + (size_t)o * r + k] = b;
                    dense_values[dense_layout.b(l, p) + (size_t)(offset + o) * R + j * r + k] = b;
                }
        }
    const std::vector<float> merged_slices = merge_adapters(layout, weights, slice_layout, slice_values);
    const std::vector<float> merged_dense = merge_adapters(layout, weights, dense_layout, dense_values);
    expect(merged_slices == merged_dense, label + "_merge_matches_dense_bitwise", "the merged weights differ");
    size_t changed_elsewhere = 0;
    for (int l = 0; l < c.num_layers; l++)
        for (int b = 0; b < kBlockTensors; b++) {
            if (b == lora_target_weight(p)) continue;
            const size_t begin = layout.tensor(l, (BlockTensor)b), size = layout.block_tensor_size[b];
            for (size_t i = begin; i < begin + size; i++) changed_elsewhere += merged_slices[i] != weights[i];
        }
    expect(changed_elsewhere == 0, label + "_merge_changes_only_the_product", std::to_string(changed_elsewhere) + " other weights changed");

    // the adapter file: written and read back, the same values and targets, and the same bytes when rewritten
    const std::string path = "/tmp/test_cpu_lora_" + label + "_" + std::to_string((long)getpid()) + ".bin";
    write_adapter_file(path, slice_layout, slice_values);
    std::vector<float> read_values;
    const LoraSpec read_spec = read_adapter_file(path, c, 24, read_values);
    const AdapterLayout read_layout(c, read_spec, 24);
    bool same = read_spec.rank == r && read_spec.alpha == slice_spec.alpha && read_spec.targets == slice_spec.targets;
    for (int l = 0; l < c.num_layers; l++)
        same = same && std::equal(slice_values.begin() + slice_layout.unit_begin(l), slice_values.begin() + slice_layout.unit_begin(l) + slice_layout.layer_size(),
                                  read_values.begin() + read_layout.unit_begin(l));
    const std::string rewritten = path + ".again";
    write_adapter_file(rewritten, read_layout, read_values);
    expect(same && read_bytes(path) == read_bytes(rewritten) &&
               (long)read_bytes(path).size() == 1024 + 4 * (long)slice_layout.count,
           label + "_adapter_file_round_trip", "the file read back differs");
    std::remove(path.c_str());
    std::remove(rewritten.c_str());
}

// Target names (PEFT's o and down are attn-proj and fc-proj) and which family takes which.
void check_target_names() {
    expect(parse_lora_targets("q,k,v,o,gate,up,down") ==
               (1u << kLoraQ | 1u << kLoraK | 1u << kLoraV | 1u << kLoraAttnProj | 1u << kLoraGate | 1u << kLoraUp | 1u << kLoraFcProj),
           "targets_peft_names", "q,k,v,o,gate,up,down parsed wrong");
    expect(parse_lora_targets("qkv,attn-proj,fc,fc-proj") == 15u, "targets_gpt2_names", "qkv,attn-proj,fc,fc-proj is not 15");
    expect(parse_lora_targets("o") == parse_lora_targets("attn-proj") && parse_lora_targets("down") == parse_lora_targets("fc-proj"),
           "targets_aliases", "o or down is not its product's name");
    expect(parse_lora_targets("q_proj") == 0 && parse_lora_targets("q,") == 0 && parse_lora_targets("") == 0, "targets_unknown_names",
           "an unknown or empty name parsed");
    ModelConfig gpt2, llama;
    llama.family = ModelFamily::kLlama;
    expect(!lora_targets_problem(1u << kLoraGate, gpt2).empty() && !lora_targets_problem(1u << kLoraUp, gpt2).empty() &&
               lora_targets_problem(1u << kLoraGate | 1u << kLoraUp, llama).empty() &&
               lora_targets_problem(1u << kLoraQ | 1u << kLoraK | 1u << kLoraV | 15u, gpt2).empty(),
           "targets_per_family", "gate and up must be the Llama family's only, the rest both families'");
}

// Pipeline stages' adapters: each stage's AdapterLayout holds its blocks (interleaved: two runs of them), cut from
// the whole model's and put back; the parts cover every block once and the whole comes back bit for bit.
void check_stage_parts() {
    ModelConfig c;
    c.num_layers = 8;
    c.channels = 64;
    c.num_heads = 2;
    LoraSpec spec;
    spec.rank = 4;
    spec.alpha = 8.0f;
    spec.targets = parse_lora_targets("qkv,fc-proj");
    const size_t multiple = 16;  // 2 data-parallel ranks
    const AdapterLayout whole(c, spec, multiple);
    std::vector<float> values(whole.total, 0.0f);
    for (int l = 0; l < c.num_layers; l++)
        for (size_t i = 0; i < whole.layer_size(); i++) values[whole.unit_begin(l) + i] = (float)(l * 100000 + i + 1);
    const int P = 2;
    const std::vector<int> per_virtual_stage = {1, 3, 2, 2};  // interleaved: 2 chunks per stage, uneven
    std::vector<float> rebuilt(whole.total, 0.0f);
    size_t blocks = 0, counted = 0;
    bool parts_right = true;
    for (int s = 0; s < P; s++) {
        std::vector<int> chunks;
        const StageModel m = pipeline_stage_model(per_virtual_stage, P, s, &chunks);
        const AdapterLayout part(c, spec, multiple, m.layers);
        const std::vector<float> mine = adapter_part(part, whole, values);
        for (int l = 0; l < part.num_blocks(); l++)  // local block l is global block m.layers[l]
            parts_right = parts_right && std::equal(mine.begin() + part.unit_begin(l), mine.begin() + part.unit_begin(l) + part.layer_size(),
                                                    values.begin() + whole.unit_begin(m.layers[l]));
        parts_right = parts_right && part.unit_sizes().size() == m.layers.size() + 2 && part.total % multiple == 0;
        put_adapter_part(part, mine, whole, rebuilt);
        blocks += part.num_blocks();
        counted += part.count;
    }
    expect(parts_right, "stage_parts_hold_their_blocks", "a stage's part differs from its blocks' adapters");
    expect(blocks == (size_t)c.num_layers && counted == whole.count && rebuilt == values, "stage_parts_rebuild_the_whole",
           std::to_string(blocks) + " blocks, " + std::to_string(counted) + " of " + std::to_string(whole.count) + " parameters");
    expect(lora_activation_elements(spec, c, 128, 3, 2) == 128 * 4 * 2 * 3 * 2 + 128 * 4, "activation_elements_per_slot_and_block",
           std::to_string(lora_activation_elements(spec, c, 128, 3, 2)) + " elements");
}

void check_slice_targets() {
    check_target_names();
    check_stage_parts();
    ModelConfig llama;  // grouped-query attention: k and v narrower than q
    llama.family = ModelFamily::kLlama;
    llama.num_layers = 2;
    llama.num_heads = 4;
    llama.kv_heads = 2;
    llama.channels = 32;
    llama.ffn = 48;
    llama.qkv_bias = false;
    llama.tied_head = false;
    llama.vocab_size = llama.padded_vocab_size = 64;
    llama.max_seq_len = 16;
    check_slices_against_dense("llama_qkv", llama, kLoraQkv, {kLoraQ, kLoraK, kLoraV}, 3);
    check_slices_against_dense("llama_gate_up", llama, kLoraFc, {kLoraGate, kLoraUp}, 2);
    ModelConfig gpt2;
    gpt2.num_layers = 2;
    gpt2.num_heads = 2;
    gpt2.channels = 32;
    gpt2.vocab_size = gpt2.padded_vocab_size = 64;
    gpt2.max_seq_len = 16;
    check_slices_against_dense("gpt2_qkv", gpt2, kLoraQkv, {kLoraQ, kLoraK, kLoraV}, 2);
}

}  // namespace

int main(int argc, char** argv) {
    check_suite("cpu_lora");
    if (argc > 2) {
        std::fprintf(stderr, "usage: %s [FIXTURE_DIR] (from test/tools/make_cpu_fixture.sh --lora)\n", argv[0]);
        return 1;
    }
    check_slice_targets();
    if (argc == 1) return check_failures() ? 1 : 0;
    const std::string dir = argv[1];
    const std::string model_path = dir + "/model.bin", init_path = dir + "/lora_init.bin";
    const std::string state_path = dir + "/lora_state.bin";
    std::string error;

    // ---- Against PyTorch: step 0 and 10 training steps from the same base model and initial adapters.
    cpuref::Model* model = cpuref::model_load(model_path.c_str());
    const cpuref::Config& cfg = cpuref::model_config(model);
    const size_t P = cpuref::model_num_params(model);
    const std::vector<float> base(cpuref::model_params(model), cpuref::model_params(model) + P);
    const DebugState s = read_debug_state(state_path);
    if (s.lora_rank == 0) debug_state_error(state_path, "not a LoRA debug state (version 3)");
    if (s.V != cfg.vocab_size || s.Vp != cfg.padded_vocab_size || s.T > cfg.max_seq_len)
        debug_state_error(state_path, "B, T or vocab sizes do not fit the model");
    if (s.precision != 0) debug_state_error(state_path, "not an fp32 debug state (these tolerances are for fp32)");
    if (!cpuref::lora_load(model, init_path.c_str(), &error)) {
        fail("adapter_load", error);
        return 1;
    }
    const cpuref::LoraConfig lc = *cpuref::model_lora(model);
    check(lc.rank == s.lora_rank && lc.alpha == s.lora_alpha && lc.targets == s.lora_targets,
          "adapter_config_matches_state",
          fmt("rank %g, alpha %g, targets %g", lc.rank, lc.alpha, lc.targets) +
              fmt(" (state: rank %g, alpha %g, targets %g)", s.lora_rank, s.lora_alpha, s.lora_targets));
    const std::vector<AdapterTensor> layout = adapter_layout(cfg, lc);
    const size_t A = cpuref::model_lora_num_params(model);
    if (layout.back().offset + layout.back().size != A || s.grads.size() != A)
        debug_state_error(state_path, "holds " + std::to_string(s.grads.size()) +
                                          " adapter gradients, the adapters have " + std::to_string(A) + " parameters");
    const std::vector<float> init_adapters = lora_params_copy(model);
    const int B = s.B, T = s.T;
    const size_t BT = (size_t)B * T;

    const float loss0 = cpuref::model_forward(model, s.inputs.data(), s.targets.data(), B, T);
    const std::vector<float> adapted_logits = unpadded_logits(model, BT);
    check_max_abs("logits_max_abs", adapted_logits.data(), s.logits.data(), adapted_logits.size(), kTol);
    check_rel_l2("logits_rel_l2", adapted_logits.data(), s.logits.data(), adapted_logits.size(), kTol);
    check_scalar("loss", loss0, s.loss, kTol);

    cpuref::model_zero_grad(model);
    cpuref::model_backward(model);
    const float* grads = cpuref::model_lora_grads(model);
    check_scalar("adapter_grad_norm", cpuref::global_norm(grads, A), s.grad_norm, kTol);
    for (const AdapterTensor& t : layout)
        check_rel_l2("grad_" + t.name, grads + t.offset, s.grads.data() + t.offset, t.size, kTol);
    const std::vector<float> zeros(P, 0.0f);
    expect(same_bits(zeros, cpuref::model_grads(model)), "no_base_gradients", "a base parameter got a gradient");

    for (int step = 0; step < s.steps; step++) {
        float step_loss = loss0;
        if (step > 0) {
            step_loss = cpuref::model_forward(model, s.inputs.data(), s.targets.data(), B, T);
            cpuref::model_zero_grad(model);
            cpuref::model_backward(model);
        }
        check_scalar("train_loss_step_" + std::to_string(step), step_loss, s.losses[step], kTol);
        cpuref::model_update(model, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.grad_clip, step + 1);
    }
    expect(same_bits(base, cpuref::model_params(model)), "base_weights_bitwise_unchanged",
           "a base parameter changed in training");
    expect(all_tensors_changed(layout, init_adapters, cpuref::model_lora_params(model)), "every_adapter_trained",
           "an adapter tensor did not change in training");

    // ---- B = 0 (the paper's init): the model computes exactly what the base model does.
    cpuref::Model* other = cpuref::model_load(model_path.c_str());
    const float base_loss = cpuref::model_forward(other, s.inputs.data(), s.targets.data(), B, T);
    const std::vector<float> base_logits = unpadded_logits(other, BT);
    cpuref::model_enable_lora(other, {lc.rank, lc.alpha, lc.targets}, 1);
    {
        const float* p = cpuref::model_lora_params(other);
        bool a_ok = true, b_zero = true;
        for (const AdapterTensor& t : layout) {
            const bool is_a = t.name.back() == 'A';
            const double bound = 1.0 / std::sqrt((double)(t.size / lc.rank));  // A is (r, in)
            bool nonzero = false;
            for (size_t i = t.offset; i < t.offset + t.size; i++) {
                if (is_a) a_ok = a_ok && std::fabs(p[i]) <= bound;
                nonzero = nonzero || p[i] != 0.0f;
                b_zero = b_zero && (is_a || p[i] == 0.0f);
            }
            a_ok = a_ok && (!is_a || nonzero);
        }
        expect(a_ok && b_zero, "enable_lora_init", "A must be nonzero within +-1/sqrt(in), B zero");
    }
    const float zero_b_loss = cpuref::model_forward(other, s.inputs.data(), s.targets.data(), B, T);
    expect(same_bits(base_logits, unpadded_logits(other, BT).data()) && zero_b_loss == base_loss,
           "zero_b_logits_bitwise", "logits or loss with B = 0 differ from the base model's");

    // ---- Merging: the initial adapters (nonzero B) into the base weights, and back out.
    if (!cpuref::lora_load(other, init_path.c_str(), &error)) fail("adapter_reload", error);
    cpuref::lora_merge(other);
    cpuref::Model* exported = cpuref::model_load((dir + "/merged.bin").c_str());
    check_max_abs("merge_matches_pytorch_export", cpuref::model_params(other), cpuref::model_params(exported), P,
                  kMergeTol);
    cpuref::model_free(exported);
    cpuref::model_forward(other, s.inputs.data(), s.targets.data(), B, T);
    check_max_abs("merged_logits_vs_adapters", unpadded_logits(other, BT).data(), adapted_logits.data(),
                  adapted_logits.size(), kTol);
    cpuref::lora_unmerge(other);
    check_max_abs("unmerge_restores_base", cpuref::model_params(other), base.data(), P, kMergeTol);

    // ---- Adapter files: our writer produces PyTorch's bytes, and save + load is exact.
    const std::string saved_init = dir + "/saved_init.bin", saved_trained = dir + "/saved_trained.bin";
    expect(cpuref::lora_save(other, saved_init.c_str(), &error) && read_bytes(saved_init) == read_bytes(init_path),
           "adapter_file_bytes_match_pytorch", error.empty() ? "the files differ" : error);
    const std::vector<float> trained = lora_params_copy(model);
    error.clear();
    const bool round_trip = cpuref::lora_save(model, saved_trained.c_str(), &error) &&
                            cpuref::lora_load(other, saved_trained.c_str(), &error);
    const cpuref::LoraConfig* loaded = cpuref::model_lora(other);
    expect(round_trip && same_bits(trained, cpuref::model_lora_params(other)) && loaded->rank == lc.rank &&
               loaded->alpha == lc.alpha && loaded->targets == lc.targets,
           "adapter_save_load_round_trip", error.empty() ? "loaded adapters differ from the saved ones" : error);

    // ---- Bad adapter files: the expected one-line error, and the model's adapters untouched.
    const std::vector<char> good = read_bytes(init_path);
    struct BadFile {
        const char* name;
        int word;        // header word to set, or -1
        int value;       // its new value
        long resize_by;  // bytes to add (> 0) or cut (< 0) at the end
        std::string message;
    };
    const long good_size = (long)good.size();
    const unsigned nan_bits = 0x7fc00000u, zero_bits = 0u;
    const std::string bad_bitmask = "(expected 1..15: 1 qkv, 2 attn-proj, 4 fc, 8 fc-proj)";
    const std::vector<BadFile> bad_files = {
        {"bad_magic", 0, 20240326, 0, "bad adapter magic 20240326 (expected 20261127)"},
        {"bad_version", 1, 2, 0, "unsupported adapter version 2 (expected 1)"},
        {"zero_rank", 2, 0, 0, "adapter rank 0 must be positive"},
        {"negative_rank", 2, -4, 0, "adapter rank -4 must be positive"},
        {"nan_alpha", 3, (int)nan_bits, 0, "adapter alpha nan must be finite and positive"},
        {"zero_alpha", 3, (int)zero_bits, 0, "adapter alpha 0 must be finite and positive"},
        {"zero_bitmask", 4, 0, 0, "bad adapter target bitmask 0 " + bad_bitmask},
        {"big_bitmask", 4, 16, 0, "bad adapter target bitmask 16 " + bad_bitmask},
        {"layer_mismatch", 5, 3, 0, "adapters for 3 layers, 128 channels; the model has 2 layers, 128 channels"},
        {"channel_mismatch", 6, 64, 0, "adapters for 2 layers, 64 channels; the model has 2 layers, 128 channels"},
        {"tensor_count", 7, 15, 0, "header says 15 tensors, expected 16 (A and B per layer and target)"},
        {"rank_vs_data", 2, 8, 0, "truncated: " + std::to_string(good_size) + " bytes, its header implies " +
                                       std::to_string(1024 + 2 * (good_size - 1024))},
        {"truncated_tensors", -1, 0, -4, "truncated: " + std::to_string(good_size - 4) + " bytes, its header implies " +
                                             std::to_string(good_size)},
        {"trailing_data", -1, 0, 4, std::to_string(good_size + 4) + " bytes, its header implies " +
                                        std::to_string(good_size) + " (trailing data)"},
        {"truncated_header", -1, 0, 100 - good_size, "truncated adapter header (100 bytes)"},
    };
    for (const BadFile& b : bad_files) {
        std::vector<char> bytes = good;
        if (b.word >= 0) std::memcpy(bytes.data() + 4 * b.word, &b.value, 4);
        bytes.resize((size_t)(good_size + b.resize_by));
        const std::string path = dir + "/bad_" + b.name + ".bin";
        write_bytes(path, bytes);
        error.clear();
        const bool loaded_bad = cpuref::lora_load(other, path.c_str(), &error);
        const std::string want = path + ": " + b.message;
        expect(!loaded_bad && error == want && same_bits(trained, cpuref::model_lora_params(other)),
               std::string("bad_adapter_") + b.name,
               loaded_bad ? "accepted" : "got \"" + error + "\", expected \"" + want + "\" and the adapters unchanged");
    }
    {
        const std::string path = dir + "/no_such_adapter.bin";
        error.clear();
        const bool loaded_missing = cpuref::lora_load(other, path.c_str(), &error);
        expect(!loaded_missing && error.rfind(path + ": cannot open adapter file", 0) == 0 &&
                   error.find('\n') == std::string::npos,
               "bad_adapter_missing_file", "got \"" + error + "\"");
    }

    // ---- Adapter dropout 0.1 in PyTorch training ran and trained every adapter tensor.
    error.clear();
    const bool dropout_loaded = cpuref::lora_load(other, (dir + "/lora_dropout.bin").c_str(), &error);
    expect(dropout_loaded && all_tensors_changed(layout, init_adapters, cpuref::model_lora_params(other)),
           "dropout_training_ran", dropout_loaded ? "an adapter tensor did not change" : error);

    cpuref::model_free(other);
    cpuref::model_free(model);
    return check_failures() ? 1 : 0;
}
