// QLoRA's NF4 format (model/nf4.h, docs/formats.md "QLoRA's NF4 format") against the NumPy reference
// scripts/reference/nf4_reference.py, bitwise: the reference writes its fixtures into a scratch folder (run by
// /usr/bin/python3 or python3, whichever imports numpy; skipped without one) and every case is quantized here and
// compared byte for byte: packed codes, absmaxes (or their 8-bit codes, nested absmaxes and offset), the dequantized
// fp32 and bf16. The cases: N(0, 1) weights (n not a multiple of 64, an absmax count not a multiple of 256), rows of
// different scales, blocks of zeros, an all-zero tensor, one huge weight, weights at and beside every threshold,
// subnormal absmaxes; the 8-bit quantizer alone at every midpoint of the dynamic map; the two tables.
// Without the reference: the reconstruction error of N(0, 1) weights, each code the nearest NF4 value, double
// quantization's change within its bound and the codes unchanged, the bytes against the formula, the same bits on 1,
// 3 and all threads, the refusals (NaN, inf, empty, bad shape, inconsistent arrays; each in a forked child, as die()
// ends the process), and the speed of quantize and dequantize.
// Prints one PASS/FAIL/SKIP line per check (test/check.h); exits 1 on any FAIL.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include "../model/nf4.h"
#include "check.h"

namespace {

// The child must die with exactly the one line `line`.
void expect_refusal(const std::string& name, const std::string& line, const std::function<void()>& body) {
    const std::string err = refusal(body);
    expect(err == "error: " + line + "\n", name, "expected 'error: " + line + "', got: " + (err.empty() ? "no refusal" : err));
}

template <typename T>
bool read_array(const std::string& path, std::vector<T>& out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    out.resize(bytes.size() / sizeof(T));
    memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
    return bytes.size() % sizeof(T) == 0;
}

// "" when got and expected hold the same bits, else where they first differ.
template <typename T>
std::string bitwise_difference(const char* what, const std::vector<T>& got, const std::vector<T>& expected) {
    if (got.size() != expected.size())
        return std::string(what) + ": " + std::to_string(got.size()) + " entries, the reference " + std::to_string(expected.size());
    for (size_t i = 0; i < got.size(); i++)
        if (memcmp(&got[i], &expected[i], sizeof(T)) != 0) {
            std::ostringstream s;
            s.precision(9);
            s << what << "[" << i << "]: " << +got[i] << ", the reference " << +expected[i];
            return s.str();
        }
    return "";
}

// The python that imports numpy ("" if none).
std::string python_with_numpy() {
    for (const char* python : {"/usr/bin/python3", "python3"})
        if (std::system((std::string(python) + " -c 'import numpy' > /dev/null 2>&1").c_str()) == 0) return python;
    return "";
}

// One fixture case: quantized here, every stored array and both dequantizations against the reference's bits.
void check_case(const std::string& dir, const std::string& name, size_t count, bool double_quant) {
    const std::string base = dir + "/" + name;
    std::vector<float> weights, expected_absmax, expected_nested, expected_offset, expected_f32;
    std::vector<uint8_t> expected_packed, expected_codes;
    std::vector<uint16_t> expected_bf16;
    bool read = read_array(base + ".weights.f32", weights) && read_array(base + ".packed.u8", expected_packed) &&
                read_array(base + ".dequant.f32", expected_f32) && read_array(base + ".dequant.bf16", expected_bf16);
    read = read && (double_quant ? read_array(base + ".absmax_codes.u8", expected_codes) &&
                                       read_array(base + ".nested_absmax.f32", expected_nested) &&
                                       read_array(base + ".offset.f32", expected_offset) && expected_offset.size() == 1
                                 : read_array(base + ".absmax.f32", expected_absmax));
    if (!read || weights.size() != count) {
        fail("fixture " + name, "cannot read its files in " + dir);
        return;
    }
    const Nf4Weight w = quantize_nf4(weights.data(), count, double_quant);
    std::vector<float> dequantized(count);
    std::vector<uint16_t> bf16(count);
    dequantize_nf4(w, dequantized.data());
    dequantize_nf4_bf16(w, bf16.data());
    std::string difference = bitwise_difference("packed", w.packed, expected_packed);
    if (double_quant) {
        if (difference.empty()) difference = bitwise_difference("absmax_codes", w.absmax_codes, expected_codes);
        if (difference.empty()) difference = bitwise_difference("nested_absmax", w.nested_absmax, expected_nested);
        if (difference.empty()) difference = bitwise_difference("offset", std::vector<float>{w.absmax_offset}, expected_offset);
    } else if (difference.empty()) {
        difference = bitwise_difference("absmax", w.absmax, expected_absmax);
    }
    if (difference.empty()) difference = bitwise_difference("dequantized fp32", dequantized, expected_f32);
    if (difference.empty()) difference = bitwise_difference("dequantized bf16", bf16, expected_bf16);
    expect(difference.empty(), "fixture " + name,
           difference + " (n " + std::to_string(count) + ", " + (double_quant ? "double" : "single") + " quantization)");
}

// The NumPy reference's fixtures, bitwise: the tables, the 8-bit quantizer at its ties, every case.
void test_against_reference() {
    const std::string script = "scripts/reference/nf4_reference.py";
    if (!file_exists(script)) {
        fail("reference fixtures", script + " not found: run from the repository root");
        return;
    }
    const std::string python = python_with_numpy();
    if (python.empty()) {
        skip("reference fixtures", "no python3 that imports numpy (tried /usr/bin/python3 and python3)");
        return;
    }
    char dir_template[] = "/tmp/test_nf4_XXXXXX";
    if (!mkdtemp(dir_template)) {
        fail("reference fixtures", "mkdtemp failed");
        return;
    }
    const std::string dir = dir_template;
    const std::string command = python + " " + script + " --fixtures " + dir + " 2>&1";
    FILE* p = popen(command.c_str(), "r");
    std::string output;
    char buf[512];
    for (size_t n; p && (n = fread(buf, 1, sizeof buf, p)) > 0;) output.append(buf, n);
    const int rc = p ? pclose(p) : -1;
    std::vector<char> cases_text;
    if (rc != 0 || !read_array(dir + "/cases.txt", cases_text)) {
        fail("reference fixtures", command + " failed: " + output.substr(0, 400));
        return;
    }
    pass("reference fixtures written by " + python + " " + script);

    std::vector<float> thresholds, map;
    const bool tables = read_array(dir + "/nf4_thresholds.f32", thresholds) && read_array(dir + "/dynamic_map.f32", map);
    const std::vector<float> our_thresholds(nf4_thresholds().begin(), nf4_thresholds().end());
    const std::vector<float> our_map(dynamic_map().begin(), dynamic_map().end());
    std::string difference = tables ? bitwise_difference("NF4 threshold", our_thresholds, thresholds) : "cannot read them";
    if (difference.empty()) difference = bitwise_difference("dynamic map", our_map, map);
    expect(difference.empty(), "NF4 thresholds and the 8-bit dynamic map equal the reference's", difference);

    std::vector<float> values, expected_absmax;
    std::vector<uint8_t> expected_codes;
    if (!read_array(dir + "/dynamic8_ties.values.f32", values) || !read_array(dir + "/dynamic8_ties.codes.u8", expected_codes) ||
        !read_array(dir + "/dynamic8_ties.absmax.f32", expected_absmax)) {
        fail("8-bit quantizer at the dynamic map's midpoints", "cannot read the dynamic8_ties files");
    } else {
        std::vector<uint8_t> codes(values.size());
        std::vector<float> absmax((values.size() + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize);
        quantize_dynamic8(values.data(), values.size(), codes.data(), absmax.data());
        difference = bitwise_difference("code", codes, expected_codes);
        if (difference.empty()) difference = bitwise_difference("absmax", absmax, expected_absmax);
        expect(difference.empty(), "8-bit quantizer at the dynamic map's midpoints and their neighbours (" + std::to_string(values.size()) + " values)",
               difference);
    }

    std::istringstream cases(std::string(cases_text.begin(), cases_text.end()));
    std::string name;
    size_t count = 0;
    int double_quant = 0, checked = 0;
    while (cases >> name >> count >> double_quant) {
        check_case(dir, name, count, double_quant != 0);
        checked++;
    }
    expect(checked == 14, "every fixture case read", std::to_string(checked) + " cases in cases.txt, expected 14");
    if (check_failures() == 0 && std::system(("rm -rf '" + dir + "'").c_str()) != 0) printf("cannot remove %s\n", dir.c_str());
}

std::vector<float> normal_weights(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(n);
    for (float& x : w) x = normal(rng);
    return w;
}

uint8_t code_at(const Nf4Weight& w, size_t i) { return i % 2 ? w.packed[i / 2] & 0x0F : w.packed[i / 2] >> 4; }

// N(0, 1) weights: the mean absolute reconstruction error (NF4 with blocks of 64: 0.0729 in the reference), each code
// the nearest NF4 value to its scaled weight, double quantization within its bound and with the same codes.
void test_properties() {
    const size_t n = (size_t)1 << 22;
    const std::vector<float> x = normal_weights(n, 20230523);
    const Nf4Weight single = quantize_nf4(x.data(), n, false), doubled = quantize_nf4(x.data(), n, true);
    std::vector<float> single_out(n), double_out(n);
    dequantize_nf4(single, single_out.data());
    dequantize_nf4(doubled, double_out.data());
    double abs_single = 0, abs_double = 0, square_single = 0;
    for (size_t i = 0; i < n; i++) {
        abs_single += std::fabs((double)single_out[i] - x[i]);
        abs_double += std::fabs((double)double_out[i] - x[i]);
        square_single += ((double)single_out[i] - x[i]) * ((double)single_out[i] - x[i]);
    }
    const double mae_single = abs_single / n, mae_double = abs_double / n;
    check(mae_single > 0.071 && mae_single < 0.075 && mae_double > 0.071 && mae_double < 0.075,
          "reconstruction error of N(0, 1) weights", fmt("mean |error| %.5f single, %.5f double (expected 0.071..0.075), rms %.5f", mae_single,
                                                       mae_double, std::sqrt(square_single / n)));

    // nearest: ties may go either way up to the threshold's rounding (1 ulp of the scaled value)
    size_t far = 0;
    for (size_t i = 0; i < n; i++) {
        const float scaled = x[i] * (1.0f / single.absmax[i / kNf4BlockSize]);
        const double distance = std::fabs((double)scaled - kNf4Values[code_at(single, i)]);
        for (float v : kNf4Values) far += distance > std::fabs((double)scaled - v) + 0x1p-24;
    }
    expect(far == 0, "each code is the NF4 value nearest its scaled weight", std::to_string(far) + " codes have a nearer value");

    // double quantization keeps the codes and moves each absmax by at most half the dynamic map's widest step (or
    // the distance from -1 to its first value) times the group's nested absmax, plus two roundings
    const std::array<float, 256>& map = dynamic_map();
    double half_step = 1.0 + map[0];
    for (size_t k = 0; k + 1 < map.size(); k++) half_step = std::max(half_step, ((double)map[k + 1] - map[k]) / 2);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t b = i / kNf4BlockSize;
        const double bound = half_step * doubled.nested_absmax[b / kNf4NestedBlockSize] + 0x1p-22 * single.absmax[b];
        worst = std::max(worst, std::fabs((double)double_out[i] - single_out[i]) / bound);
    }
    expect(doubled.packed == single.packed, "double quantization keeps the 4-bit codes", "the packed codes differ");
    check(worst <= 1.0, "double quantization moves a weight by at most its bound",
          fmt("worst change %.3f of the bound (%.6f x the nested absmax + 2^-22 x the block's absmax)", worst, half_step));

    // NF4 weights quantized again without double quantization (--nf4-double-quant 0 on a model imported from a
    // bitsandbytes folder, docs/lora.md): the same weights bit for bit, from either mode, for blocks whose absmax is
    // not negative (all of these; scripts' exact-requantize covers the degenerate ones)
    for (const Nf4Weight* w : {&single, &doubled}) {
        const std::vector<float>& first = w == &single ? single_out : double_out;
        const Nf4Weight again = quantize_nf4(first.data(), n, false);
        std::vector<float> again_out(n);
        dequantize_nf4(again, again_out.data());
        const std::vector<float> scales = nf4_block_scales(*w);
        const bool none_negative = std::all_of(scales.begin(), scales.end(), [](float a) { return a >= 0.0f; });
        expect(none_negative && memcmp(first.data(), again_out.data(), n * sizeof(float)) == 0 && again.absmax == scales,
               std::string("NF4 weights (") + (w == &single ? "single" : "double") + " quantization) quantized again with fp32 absmaxes: the same weights and absmaxes",
               none_negative ? "the weights or absmaxes differ" : "a block's absmax dequantizes negative");
    }

    // the same bits on any number of threads
    bool same = true;
    for (int threads : {1, 3}) {
        const Nf4Weight s = quantize_nf4(x.data(), n, false, {}, threads), d = quantize_nf4(x.data(), n, true, {}, threads);
        std::vector<float> out(n);
        dequantize_nf4(d, out.data(), threads);
        same = same && s.packed == single.packed && s.absmax == single.absmax && d.absmax_codes == doubled.absmax_codes &&
               d.nested_absmax == doubled.nested_absmax && memcmp(out.data(), double_out.data(), n * sizeof(float)) == 0;
    }
    expect(same, "1, 3 and all threads give the same bits", "a thread count changes the result");
}

// The bytes a weight takes: the stored arrays' sizes against nf4_bytes, and the formula's limits 4.5 and 4.127 bits.
void test_bytes() {
    std::string wrong;
    for (size_t n : {1, 63, 64, 65, 127, 16384, 16385, 1000003}) {
        const std::vector<float> zeros(n, 0.0f);
        for (bool double_quant : {false, true}) {
            const Nf4Weight w = quantize_nf4(zeros.data(), n, double_quant);
            if (w.bytes() != nf4_bytes(n, double_quant))
                wrong += " n " + std::to_string(n) + (double_quant ? " double: " : " single: ") + std::to_string(w.bytes()) + " vs " +
                         std::to_string(nf4_bytes(n, double_quant));
        }
    }
    expect(wrong.empty(), "a weight's stored bytes equal nf4_bytes", wrong);
    const size_t n = kNf4BlockSize * kNf4NestedBlockSize * 4096;  // 2^26 weights: whole blocks and groups
    const bool exact = 8.0 * nf4_bytes(n, false) == nf4_bits_per_weight(false) * n &&
                       8.0 * nf4_bytes(n, true) == nf4_bits_per_weight(true) * n + 32;  // + the offset
    check(exact && nf4_bits_per_weight(false) == 4.5 && std::fabs(nf4_bits_per_weight(true) - 4.127) < 0.0005,
          "bits per weight", fmt("%.4f single, %.6f double (QLoRA's 4.127); 2^26 weights: %.0f bytes double", nf4_bits_per_weight(false),
                                nf4_bits_per_weight(true), (double)nf4_bytes(n, true)));
}

void test_refusals() {
    std::vector<float> x = normal_weights(128, 7);
    x[70] = NAN;
    expect_refusal("NaN refused", "quantize_nf4: weight 70 of 128 is nan; NF4 quantizes finite weights only",
                   [&] { quantize_nf4(x.data(), x.size(), false); });
    x[70] = 0.5f;
    x[5] = INFINITY;
    x[100] = NAN;  // the first bad weight is named
    expect_refusal("inf refused", "quantize_nf4: weight 5 of 128 is inf; NF4 quantizes finite weights only",
                   [&] { quantize_nf4(x.data(), x.size(), true); });
    x[5] = -INFINITY;
    expect_refusal("-inf refused", "quantize_nf4: weight 5 of 128 is -inf; NF4 quantizes finite weights only",
                   [&] { quantize_nf4(x.data(), x.size(), false); });
    expect_refusal("no weights refused", "quantize_nf4: no weights (n = 0)", [&] { quantize_nf4(x.data(), 0, false); });
    expect_refusal("a shape of another count refused", "quantize_nf4: the shape's product 120 is not the weight count 128",
                   [&] { quantize_nf4(x.data(), 128, false, {8, 15}); });
    const std::vector<float> y = normal_weights(130, 8);
    const Nf4Weight good = quantize_nf4(y.data(), y.size(), true, {13, 10});
    std::vector<float> out(y.size());
    Nf4Weight w = good;
    w.packed.pop_back();
    expect_refusal("truncated codes refused", "NF4 weight: packed holds 64 entries, expected 65", [&] { dequantize_nf4(w, out.data()); });
    w = good;
    w.nested_absmax.clear();
    expect_refusal("missing nested absmax refused", "NF4 weight: nested_absmax holds 0 entries, expected 1", [&] { dequantize_nf4(w, out.data()); });
    w = good;
    w.double_quant = false;
    expect_refusal("double-quantized arrays read as single refused", "NF4 weight: absmax holds 0 entries, expected 3",
                   [&] { dequantize_nf4(w, out.data()); });
}

// Prints the weights a second of quantize (single, double) and dequantize (fp32, bf16) on 2^24 N(0, 1) weights, all
// threads, median of 3.
void print_throughput() {
    const size_t n = (size_t)1 << 24;
    const std::vector<float> x = normal_weights(n, 99);
    std::vector<float> out(n);
    std::vector<uint16_t> out_bf16(n);
    const Nf4Weight w = quantize_nf4(x.data(), n, true);
    const std::pair<const char*, std::function<void()>> jobs[] = {
        {"quantize single", [&] { quantize_nf4(x.data(), n, false); }},
        {"quantize double", [&] { quantize_nf4(x.data(), n, true); }},
        {"dequantize to fp32", [&] { dequantize_nf4(w, out.data()); }},
        {"dequantize to bf16", [&] { dequantize_nf4_bf16(w, out_bf16.data()); }},
    };
    for (const auto& [name, job] : jobs) {
        std::vector<double> seconds;
        for (int rep = 0; rep < 3; rep++) {
            const auto start = std::chrono::steady_clock::now();
            job();
            seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        std::sort(seconds.begin(), seconds.end());
        // a figure for the log, not a check: speed is the benchmarks' to judge
        printf("# nf4 throughput %s: %.3g weights/s (%.1f ms for %.0f weights, %u threads, median of 3)\n", name, n / seconds[1],
               1e3 * seconds[1], (double)n, std::thread::hardware_concurrency());
    }
}

}  // namespace

int main() {
    check_suite("nf4");
    test_against_reference();
    test_properties();
    test_bytes();
    test_refusals();
    print_throughput();
    return check_failures() == 0 ? 0 : 1;
}
