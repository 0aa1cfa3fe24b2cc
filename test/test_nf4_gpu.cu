// NF4 dequantization on the GPU (kernels/nf4.cuh) against model/nf4.h's host dequantization, bitwise:
//   without a GPU: the device layout's bytes against nf4_bytes for every count up to 5000 and a few large ones, both
//     modes; the refusals (an Nf4Weight whose arrays disagree with its count or shape, a weight never uploaded, a
//     misaligned output), each one line and exit status 1 in a child process;
//   on a GPU (skipped below): N(0, 1) weights from a fixed seed (and one case with blocks of zeros and a huge weight),
//     quantized on the host by nf4.h with and without double quantization, uploaded and dequantized to bf16 and to fp32
//     on shapes 4096 x 4096, 14336 x 4096 (Llama 3 8B's gate and up projections), 1000 x 777 (a partial last block and
//     nested group), 37 x 3 (odd, less than one warp's span) and 1 x 1: every element's bits equal to
//     dequantize_nf4_bf16 / dequantize_nf4's, and nothing written past the end; the same weights quantized on the GPU
//     (quantize_nf4_device: codes and absmaxes by the kernel, the absmaxes' double quantization on the host), every
//     byte of codes, absmaxes, absmax codes, nested absmaxes and the offset equal to quantize_nf4's. Then, as '# '
//     information lines, the kernels' bandwidth on 14336 x 4096 against the GPU's memory bandwidth (speed is not
//     checked here).
// Usage: test_nf4_gpu
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <type_traits>
#include <vector>
#include "../kernels/nf4.cuh"
#include "gpu_check.h"

static void expect_refusal(const std::string& name, const std::string& line, const std::function<void()>& body) {
    const std::string err = refusal(body);
    expect(err == "error: " + line + "\n", name, "expected 'error: " + line + "', got: " + (err.empty() ? "no refusal" : err));
}

// N(0, 1) weights: chunks of 2^16, each from its own generator seeded by (seed, chunk), so the values do not depend on
// the thread count.
static std::vector<float> normal_weights(size_t n, uint64_t seed) {
    constexpr size_t kChunk = 1 << 16;
    std::vector<float> weights(n);
    nf4_parallel((n + kChunk - 1) / kChunk, 4, 0, [&](size_t first, size_t last) {
        for (size_t c = first; c < last; c++) {
            std::mt19937_64 rng(splitmix64(seed ^ splitmix64(c)));
            std::normal_distribution<float> normal(0.0f, 1.0f);
            for (size_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); i++) weights[i] = normal(rng);
        }
    });
    return weights;
}

// ---------------------------------------------------------------------------------------------
// Without a GPU

static void check_device_bytes() {
    size_t compared = 0, mismatches = 0;
    std::string first;
    std::vector<size_t> counts;
    for (size_t n = 1; n <= 5000; n++) counts.push_back(n);
    for (size_t n : {(size_t)1000 * 777, (size_t)4096 * 4096, (size_t)14336 * 4096, (size_t)128256 * 4096 + 1}) counts.push_back(n);
    for (size_t n : counts) {
        for (bool double_quant : {false, true}) {
            Nf4DeviceWeight d;
            d.count = n;
            d.double_quant = double_quant;
            compared++;
            const bool padded = d.padded_code_bytes() % kNf4CodeVectorBytes == 0 && d.padded_code_bytes() - d.code_bytes() < kNf4CodeVectorBytes;
            if ((d.bytes() != nf4_bytes(n, double_quant) || !padded) && mismatches++ == 0)
                first = "n " + std::to_string(n) + (double_quant ? " double" : " single") + ": " + std::to_string(d.bytes()) +
                        " bytes, nf4_bytes " + std::to_string(nf4_bytes(n, double_quant)) + ", codes padded to " + std::to_string(d.padded_code_bytes());
        }
    }
    expect(mismatches == 0, "device layout's bytes equal nf4_bytes on " + std::to_string(compared) + " counts and modes, codes padded to 16",
           std::to_string(mismatches) + " mismatches, the first " + first);
}

// Each refusal happens before any CUDA call, so they run (and are checked) without a GPU.
static void check_refusals() {
    const std::vector<float> weights = normal_weights(100, 7);
    const Nf4Weight single = quantize_nf4(weights.data(), weights.size(), false), doubled = quantize_nf4(weights.data(), weights.size(), true);
    expect_refusal("upload of codes short of the count refused", "upload_nf4: NF4 weight: packed holds 49 entries, expected 50", [&] {
        Nf4Weight w = single;
        w.packed.pop_back();
        upload_nf4(w);
    });
    expect_refusal("upload of a missing absmax refused", "upload_nf4: NF4 weight: absmax holds 1 entries, expected 2", [&] {
        Nf4Weight w = single;
        w.absmax.pop_back();
        upload_nf4(w);
    });
    expect_refusal("upload of double quantization without nested absmaxes refused",
                   "upload_nf4: NF4 weight: nested_absmax holds 0 entries, expected 1", [&] {
                       Nf4Weight w = doubled;
                       w.nested_absmax.clear();
                       upload_nf4(w);
                   });
    expect_refusal("upload of a shape that is not the count refused", "upload_nf4: NF4 weight: shape's product 99 is not the count 100", [&] {
        Nf4Weight w = single;
        w.shape = {3, 33};
        upload_nf4(w);
    });
    expect_refusal("dequantization of a weight never uploaded refused",
                   "dequantize_nf4_device: the NF4 weight holds no weights (not uploaded?)",
                   [] { dequantize_nf4_device(reinterpret_cast<__nv_bfloat16*>(256), Nf4DeviceWeight(), 0); });
    expect_refusal("quantization into a weight never allocated refused", "quantize_nf4_device: the NF4 weight is not allocated (allocate_nf4)", [] {
        Nf4DeviceWeight w;
        Nf4QuantizeScratch scratch;
        quantize_nf4_device(w, nullptr, scratch, 0);
    });
    expect_refusal("dequantization into a misaligned output refused",
                   "dequantize_nf4_device: the output must be 16-byte aligned (vector stores)", [] {
                       Nf4DeviceWeight w;
                       w.count = 100;
                       dequantize_nf4_device(reinterpret_cast<float*>(264), w, 0);
                   });
}

// ---------------------------------------------------------------------------------------------
// On a GPU

constexpr size_t kGuard = 64;  // poisoned elements after the output, which the kernel must leave alone

template <typename OutT> using Bits = std::conditional_t<sizeof(OutT) == 4, uint32_t, uint16_t>;

// nf4.h's dequantization of w, as bits.
template <typename OutT> static std::vector<Bits<OutT>> host_bits(const Nf4Weight& w) {
    std::vector<Bits<OutT>> bits(w.count);
    if constexpr (std::is_same_v<OutT, float>) {
        std::vector<float> values(w.count);
        dequantize_nf4(w, values.data());
        memcpy(bits.data(), values.data(), w.count * sizeof(float));
    } else {
        dequantize_nf4_bf16(w, bits.data());
    }
    return bits;
}

template <typename OutT>
static void check_dequantization(const std::string& name, const Nf4Weight& w, const Nf4DeviceWeight& d, cudaStream_t stream) {
    const std::vector<Bits<OutT>> expected = host_bits<OutT>(w);
    DeviceBuffer<OutT> out(w.count + kGuard);
    dequantize_nf4_device(out.ptr, d, stream);
    cudaCheck(cudaStreamSynchronize(stream));
    std::vector<Bits<OutT>> got(w.count + kGuard);
    cudaCheck(cudaMemcpy(got.data(), out.ptr, got.size() * sizeof(OutT), cudaMemcpyDeviceToHost));
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < w.count; i++)
        if (got[i] != expected[i] && mismatches++ == 0) first = i;
    size_t overwritten = 0;
    for (size_t i = w.count; i < got.size(); i++) overwritten += got[i] != (Bits<OutT>)~Bits<OutT>(0);
    std::string detail;
    if (mismatches) {
        char bits[64];
        snprintf(bits, sizeof bits, ": GPU 0x%x, host 0x%x", (unsigned)got[first], (unsigned)expected[first]);
        detail = std::to_string(mismatches) + " of " + std::to_string(w.count) + " differ, the first at " + std::to_string(first) + bits;
    }
    if (overwritten) detail += (detail.empty() ? "" : "; ") + std::to_string(overwritten) + " elements written past the end";
    expect(detail.empty(), name + (w.double_quant ? " double-quantized" : "") + " to " + type_name<OutT>() + " bitwise nf4.h's", detail);
}

// Median time of the dequantization into out, as a '# ' line with the bytes it moves a second.
template <typename OutT> static void report_bandwidth(const std::string& name, const Nf4DeviceWeight& d, cudaStream_t stream) {
    DeviceBuffer<OutT> out(d.count);
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    std::vector<double> ms;
    for (int rep = 0; rep < 23; rep++) {
        cudaCheck(cudaEventRecord(start, stream));
        dequantize_nf4_device(out.ptr, d, stream);
        cudaCheck(cudaEventRecord(stop, stream));
        cudaCheck(cudaEventSynchronize(stop));
        float elapsed = 0.0f;
        cudaCheck(cudaEventElapsedTime(&elapsed, start, stop));
        if (rep >= 3) ms.push_back(elapsed);  // the first runs warm up
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    const double seconds = median_of(ms) * 1e-3;
    const size_t scale_bytes = d.double_quant ? d.blocks() + d.nested_blocks() * sizeof(float) : d.blocks() * sizeof(float);
    const double bytes = (double)d.padded_code_bytes() + (double)scale_bytes + (double)d.count * sizeof(OutT);
    int device = 0, memory_khz = 0, bus_bits = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, device));
    cudaCheck(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
    const double peak_gbs = 2.0 * memory_khz * 1e3 * bus_bits / 8 / 1e9;  // double data rate
    printf("# nf4_gpu %s%s to %s: %.1f us, %.0f GB/s of codes, absmaxes and output", name.c_str(),
           d.double_quant ? " double-quantized" : "", type_name<OutT>(), seconds * 1e6, bytes / seconds / 1e9);
    if (peak_gbs > 0) printf(" (%.0f%% of the GPU's %.0f GB/s)", 100.0 * bytes / seconds / 1e9 / peak_gbs, peak_gbs);
    printf("\n");
    fflush(stdout);
}

// The weights quantized on the GPU against quantize_nf4's arrays, byte for byte (the offset's bits too).
static void check_quantization(const std::string& name, const std::vector<float>& weights, const Nf4Weight& expected, cudaStream_t stream,
                               bool timed) {
    DeviceBuffer<float> device_weights(weights.size());
    cudaCheck(cudaMemcpy(device_weights.ptr, weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice));
    Nf4DeviceWeight d = allocate_nf4(expected.shape, expected.double_quant);
    Nf4QuantizeScratch scratch;
    scratch.allocate(weights.size());
    quantize_nf4_device(d, device_weights.ptr, scratch, stream);
    const Nf4Weight got = download_nf4(d);
    std::string detail;
    auto compare = [&](const char* what, const void* a, const void* b, size_t bytes) {
        if (bytes == 0 || memcmp(a, b, bytes) == 0) return;
        size_t i = 0;
        while (((const uint8_t*)a)[i] == ((const uint8_t*)b)[i]) i++;
        detail += (detail.empty() ? "" : "; ") + std::string(what) + " differ from byte " + std::to_string(i);
    };
    compare("codes", got.packed.data(), expected.packed.data(), expected.packed.size());
    compare("absmax", got.absmax.data(), expected.absmax.data(), expected.absmax.size() * sizeof(float));
    compare("absmax codes", got.absmax_codes.data(), expected.absmax_codes.data(), expected.absmax_codes.size());
    compare("nested absmax", got.nested_absmax.data(), expected.nested_absmax.data(), expected.nested_absmax.size() * sizeof(float));
    compare("offset", &got.absmax_offset, &expected.absmax_offset, sizeof(float));
    expect(detail.empty(), name + (expected.double_quant ? " double-quantized" : "") + " quantized on the GPU bitwise quantize_nf4's", detail);
    if (timed) {  // the kernel and the host's part together, as a load pays them
        const auto start = std::chrono::steady_clock::now();
        for (int rep = 0; rep < 5; rep++) quantize_nf4_device(d, device_weights.ptr, scratch, stream);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 5;
        printf("# nf4_gpu %s%s quantized on the GPU: %.2f ms (%.0f M weights a second)\n", name.c_str(),
               expected.double_quant ? " double-quantized" : "", seconds * 1e3, weights.size() / seconds / 1e6);
    }
    scratch.free();
    free_nf4(d);
}

struct Case {
    std::string name;
    std::vector<size_t> shape;
    bool specials = false;  // blocks of zeros (dequantized to -0.0) and one huge weight
    bool timed = false;
};

static void run_case(const Case& c, cudaStream_t stream) {
    size_t n = 1;
    for (size_t d : c.shape) n *= d;
    std::vector<float> weights = normal_weights(n, 1234 + n);
    if (c.specials) {
        std::fill(weights.begin() + 128, weights.begin() + std::min(n, (size_t)128 + 3 * kNf4BlockSize), 0.0f);
        weights[n / 2] = 3e38f;
    }
    for (bool double_quant : {false, true}) {
        const Nf4Weight w = quantize_nf4(weights.data(), n, double_quant, c.shape);
        check_quantization(c.name, weights, w, stream, c.timed);
        Nf4DeviceWeight d = upload_nf4(w);
        check_dequantization<__nv_bfloat16>(c.name, w, d, stream);
        check_dequantization<float>(c.name, w, d, stream);
        if (c.timed) {
            report_bandwidth<__nv_bfloat16>(c.name, d, stream);
            report_bandwidth<float>(c.name, d, stream);
        }
        free_nf4(d);
    }
}

int main() {
    check_suite("nf4_gpu");
    check_device_bytes();
    check_refusals();
    if (!gpu_present("NF4 dequantization on the GPU")) return check_failures() ? 1 : 0;
    current_gpu();
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    const Case cases[] = {
        {"4096 x 4096", {4096, 4096}},
        {"14336 x 4096", {14336, 4096}, false, true},
        {"1000 x 777", {1000, 777}},
        {"1000 x 777 with zero blocks and a huge weight", {1000, 777}, true},
        {"37 x 3", {37, 3}},
        {"1 x 1", {1, 1}},
    };
    for (const Case& c : cases) guarded(c.name, [&] { run_case(c, stream); });
    cudaCheck(cudaStreamDestroy(stream));
    return check_failures() ? 1 : 0;
}
