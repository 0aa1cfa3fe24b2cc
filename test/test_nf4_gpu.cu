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
//     checked here);
//   the products with the NF4 weight dequantized inside the kernel (kernels/nf4_matmul.cuh), forward out = x W^T and
//     backward_input dx = dout W (overwriting and accumulating), single and double quantization, against a reference
//     product over dequantize_nf4_device's bf16 weight with fp32 sums in k order (an N(0, 1) weight [OC, IC], N(0, 1)
//     bf16 inputs): (N, IC, OC) = (256, 512, 768), (2048, 4096, 1024), (192, 448, 320), (64, 64, 64), (16, 512, 768)
//     and (77, 320, 448) (partial row and column tiles, N not a multiple of 64), backward with IC != OC; the forward's
//     small-rows kernel (N <= kNf4SmallRows) at (1, 512, 768), (5, 448, 320) and (8, 4096, 1024); the forward with a
//     bias (added to every row) at (192, 448, 320), (77, 320, 448), (1, 512, 768) and (5, 448, 320); nothing written
//     past the output. Both products' operands are the same
//     bf16 values, so only the order of the fp32 sums and the output's rounding differ: each element within
//     2^-8 |ref| (bf16's half ulp) + (K + 1) 2^-22 sum_k |a_k b_k| (a worst-case bound on two fp32 sums of K terms in
//     any order, tensor cores' truncating adds included). The tolerance is shown to reject a weight read transposed
//     and codes read with their half-bytes swapped (references made that way fail on most elements). Without a GPU:
//     the products' refusals (a weight never uploaded or not 2-D, IC / OC not multiples of 64, N 0, misaligned pointers).
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
#include "../kernels/nf4_matmul.cuh"
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
    // the products' refusals: a fake weight of the given shape at aligned (never dereferenced) addresses
    auto fake = [](std::vector<size_t> shape) {
        Nf4DeviceWeight w;
        w.shape = shape;
        w.count = 1;
        for (size_t d : shape) w.count *= d;
        w.packed = reinterpret_cast<uint8_t*>(256);
        w.absmax = reinterpret_cast<float*>(512);
        return w;
    };
    auto bf16_at = [](uintptr_t address) { return reinterpret_cast<__nv_bfloat16*>(address); };
    expect_refusal("product with a weight never uploaded refused", "nf4_matmul_forward: the NF4 weight holds no weights (not uploaded?)",
                   [&] { nf4_matmul_forward(bf16_at(1024), bf16_at(2048), Nf4DeviceWeight(), nullptr, 64, 0); });
    expect_refusal("product with a 1-D weight refused",
                   "nf4_matmul_forward: the NF4 weight must be 2-D [out_features, in_features], it has 1 dimensions",
                   [&] { nf4_matmul_forward(bf16_at(1024), bf16_at(2048), fake({4096}), nullptr, 64, 0); });
    expect_refusal("product with N 0 refused", "nf4_matmul_forward: N must be positive, got 0",
                   [&] { nf4_matmul_forward(bf16_at(1024), bf16_at(2048), fake({128, 64}), nullptr, 0, 0); });
    expect_refusal("input-gradient product with in_features not a multiple of 64 refused",
                   "nf4_matmul_backward_input: the weight's in_features and out_features must be multiples of 64, got [64, 96]",
                   [&] { nf4_matmul_backward_input(bf16_at(1024), bf16_at(2048), fake({64, 96}), 64, false, 0); });
    expect_refusal("input-gradient product with out_features not a multiple of 64 refused",
                   "nf4_matmul_backward_input: the weight's in_features and out_features must be multiples of 64, got [32, 64]",
                   [&] { nf4_matmul_backward_input(bf16_at(1024), bf16_at(2048), fake({32, 64}), 64, true, 0); });
    expect_refusal("product with out_features not a multiple of 64 refused",
                   "nf4_matmul_forward: the weight's in_features and out_features must be multiples of 64, got [100, 64]",
                   [&] { nf4_matmul_forward(bf16_at(1024), bf16_at(2048), fake({100, 64}), nullptr, 64, 0); });
    expect_refusal("product into a misaligned output refused", "nf4_matmul_forward: the input and the output must be 16-byte aligned",
                   [&] { nf4_matmul_forward(bf16_at(1026), bf16_at(2048), fake({64, 64}), nullptr, 64, 0); });
    expect_refusal("product with misaligned absmaxes refused",
                   "nf4_matmul_backward_input: the NF4 weight's codes must be 16-byte aligned and its absmax arrays 4-byte aligned", [&] {
                       Nf4DeviceWeight w = fake({64, 64});
                       w.absmax = reinterpret_cast<float*>(514);
                       nf4_matmul_backward_input(bf16_at(1024), bf16_at(2048), w, 64, false, 0);
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

// ---------------------------------------------------------------------------------------------
// The products with an NF4 weight (kernels/nf4_matmul.cuh)

using bf16 = __nv_bfloat16;

// ref[n][m] = start[n][m] + sum_k a[n][k] B(k, m) in fp32, k in order, and abssum the same sum of absolute values; B(k, m)
// = wd[m][k] (forward: wd is [M][K]) or wd[k][m] (kTransposedRead: wd is [K][M], the input gradient's read). 16 x 16
// tiles through shared memory; K and M multiples of 16.
template <bool kTransposedRead>
__global__ void reference_product_kernel(float* ref, float* abssum, const bf16* a, const bf16* wd, const bf16* start, int N, int K, int M) {
    __shared__ float as[16][17], bs[16][17];
    const int tx = threadIdx.x, ty = threadIdx.y, n = blockIdx.y * 16 + ty, m = blockIdx.x * 16 + tx;
    const bool row = n < N;
    float sum = start != nullptr && row ? __bfloat162float(start[(long)n * M + m]) : 0.0f, abs_sum = fabsf(sum);
    for (int k0 = 0; k0 < K; k0 += 16) {
        as[ty][tx] = row ? __bfloat162float(a[(long)n * K + k0 + tx]) : 0.0f;
        const int k = k0 + ty, column = blockIdx.x * 16 + tx;
        bs[ty][tx] = __bfloat162float(kTransposedRead ? wd[(long)k * M + column] : wd[(long)column * K + k]);
        __syncthreads();
        for (int j = 0; j < 16; j++) {
            const float p = as[ty][j] * bs[j][tx];
            sum += p;
            abs_sum += fabsf(p);
        }
        __syncthreads();
    }
    if (!row) return;
    ref[(long)n * M + m] = sum;
    abssum[(long)n * M + m] = abs_sum;
}

struct Reference {
    std::vector<float> value, abssum;
};
// The reference product over w's bf16 dequantization (dequantize_nf4_device): forward out[N, M = OC] = a[N, K = IC]
// W^T, or (transposed_read) a[N, K = OC] W, out[N, M = IC]; plus start when given.
static Reference reference_product(const Nf4DeviceWeight& w, const bf16* a, const bf16* start, int N, int K, int M, bool transposed_read,
                                   cudaStream_t stream) {
    DeviceBuffer<bf16> wd(w.count);
    dequantize_nf4_device(wd.ptr, w, stream);
    DeviceBuffer<float> value((size_t)N * M), abssum((size_t)N * M);
    const dim3 grid(M / 16, ceil_div(N, 16)), block(16, 16);
    if (transposed_read) reference_product_kernel<true><<<grid, block, 0, stream>>>(value.ptr, abssum.ptr, a, wd.ptr, start, N, K, M);
    else reference_product_kernel<false><<<grid, block, 0, stream>>>(value.ptr, abssum.ptr, a, wd.ptr, start, N, K, M);
    cudaCheckLaunch();
    cudaCheck(cudaStreamSynchronize(stream));
    return {value.download(), abssum.download()};
}

// How far got is from ref, element by element, against the tolerance 2^-8 |ref| + (K + 1) 2^-22 abssum (see the top).
struct ProductComparison {
    size_t outside = 0, first = 0;  // elements past the tolerance (or not finite), the first of them
    double worst = 0.0;             // the largest |got - ref| / tolerance
};
static ProductComparison compare_product(const std::vector<float>& got, const Reference& ref, int K) {
    ProductComparison c;
    const double order = (K + 1) * std::ldexp(1.0, -22);
    for (size_t i = 0; i < ref.value.size(); i++) {
        const double tolerance = std::ldexp(std::fabs((double)ref.value[i]), -8) + order * ref.abssum[i];
        const double ratio = std::fabs((double)got[i] - ref.value[i]) / tolerance;
        if (!(ratio <= 1.0)) {
            if (c.outside++ == 0) c.first = i;
        }
        if (std::isfinite(ratio)) c.worst = std::max(c.worst, ratio);
        else c.worst = INFINITY;
    }
    return c;
}

struct ProductCase {
    int N, IC, OC;
};

// accumulate: the backward adds into dx; the forward adds a bias
static std::string product_name(const char* what, const ProductCase& c, bool double_quant, bool accumulate) {
    const bool forward = std::string(what) == "nf4_matmul_forward";
    return std::string(what) + " N " + std::to_string(c.N) + " IC " + std::to_string(c.IC) + " OC " + std::to_string(c.OC) +
           (double_quant ? " double-quantized" : "") + (accumulate ? (forward ? " with bias" : " accumulating") : "");
}

// An N(0, 1) weight [OC, IC] quantized on the host and uploaded, and N(0, 1) bf16 activations.
struct ProductOperands {
    Nf4Weight host;
    Nf4DeviceWeight w;
    ProductOperands(const ProductCase& c, bool double_quant, uint64_t seed) {
        const std::vector<float> weights = normal_weights((size_t)c.OC * c.IC, seed);
        host = quantize_nf4(weights.data(), weights.size(), double_quant, {(size_t)c.OC, (size_t)c.IC});
        w = upload_nf4(host);
    }
    ~ProductOperands() { free_nf4(w); }
};

// The product (forward, or backward_input) of case c against the reference (accumulate: the backward adds into dx, the
// forward adds a bias, the reference adding it to every row); negative controls: the same output
// against references made from the weight read transposed (square weights only) and from codes with swapped
// half-bytes, which the tolerance must reject on most elements.
static void check_product(bool backward, const ProductCase& c, bool double_quant, bool accumulate, bool controls, cudaStream_t stream) {
    const std::string name = product_name(backward ? "nf4_matmul_backward_input" : "nf4_matmul_forward", c, double_quant, accumulate);
    const uint64_t seed = 99 + (uint64_t)c.N * 7919 + (uint64_t)c.IC * 31 + (uint64_t)c.OC + (double_quant ? 1 : 0);
    ProductOperands op(c, double_quant, seed);
    const int K = backward ? c.OC : c.IC, M = backward ? c.IC : c.OC;
    const size_t outputs = (size_t)c.N * M;
    DeviceBuffer<bf16> a(normal_weights((size_t)c.N * K, seed + 1));
    DeviceBuffer<bf16> out(outputs + kGuard);  // poisoned: an element never written stays NaN
    DeviceBuffer<bf16> start((size_t)(accumulate ? outputs : 1));  // what the product adds to: dx, or the bias in every row
    if (accumulate) {
        std::vector<float> added = normal_weights(outputs, seed + 2);
        for (size_t i = M; !backward && i < outputs; i++) added[i] = added[i % M];
        start.upload(added);
        if (backward) cudaCheck(cudaMemcpy(out.ptr, start.ptr, outputs * sizeof(bf16), cudaMemcpyDeviceToDevice));
    }
    if (backward) nf4_matmul_backward_input(out.ptr, a.ptr, op.w, c.N, accumulate, stream);
    else nf4_matmul_forward(out.ptr, a.ptr, op.w, accumulate ? start.ptr : nullptr, c.N, stream);
    cudaCheck(cudaStreamSynchronize(stream));
    std::vector<uint16_t> raw(outputs + kGuard);
    cudaCheck(cudaMemcpy(raw.data(), out.ptr, raw.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    std::vector<float> got(outputs);
    for (size_t i = 0; i < outputs; i++) {
        const uint32_t bits = (uint32_t)raw[i] << 16;
        memcpy(&got[i], &bits, sizeof bits);
    }
    size_t overwritten = 0;
    for (size_t i = outputs; i < raw.size(); i++) overwritten += raw[i] != 0xFFFFu;

    const Reference ref = reference_product(op.w, a.ptr, accumulate ? start.ptr : nullptr, c.N, K, M, backward, stream);
    const ProductComparison cmp = compare_product(got, ref, K);
    std::string detail;
    if (cmp.outside)
        detail = std::to_string(cmp.outside) + " of " + std::to_string(outputs) + " elements past the tolerance, the first (" +
                 std::to_string(cmp.first / M) + ", " + std::to_string(cmp.first % M) + "): " + fmt("%.6g against %.6g, abs-sum %.4g", got[cmp.first],
                 ref.value[cmp.first], ref.abssum[cmp.first]);
    if (overwritten) detail += (detail.empty() ? "" : "; ") + std::to_string(overwritten) + " elements written past the end";
    check(detail.empty(), name + " against the dequantized weight's fp32 product",
          detail.empty() ? fmt("largest |diff| %.3f of the tolerance 2^-8 |ref| + (K + 1) 2^-22 abs-sum", cmp.worst) : detail);
    if (!controls) return;

    auto rejected = [&](const std::string& what, const Reference& wrong) {
        const ProductComparison bad = compare_product(got, wrong, K);
        expect(bad.outside > outputs / 2, name + ": the tolerance rejects " + what,
               "only " + std::to_string(bad.outside) + " of " + std::to_string(outputs) + " elements outside it");
    };
    Nf4Weight swapped = op.host;
    for (uint8_t& byte : swapped.packed) byte = (uint8_t)(byte << 4 | byte >> 4);
    Nf4DeviceWeight swapped_w = upload_nf4(swapped);
    rejected("codes read with their half-bytes swapped",
             reference_product(swapped_w, a.ptr, accumulate ? start.ptr : nullptr, c.N, K, M, backward, stream));
    free_nf4(swapped_w);
    if (c.IC == c.OC)
        rejected("the weight read transposed", reference_product(op.w, a.ptr, accumulate ? start.ptr : nullptr, c.N, K, M, !backward, stream));
}

static void check_products(cudaStream_t stream) {
    const ProductCase small{256, 512, 768}, large{2048, 4096, 1024}, partial{192, 448, 320}, tiny{64, 64, 64}, few{16, 512, 768},
        ragged{77, 320, 448}, square{256, 512, 512};
    // forwards of at most kNf4SmallRows rows: the small-rows kernel
    const ProductCase one{1, 512, 768}, some{5, 448, 320}, most{kNf4SmallRows, 4096, 1024};
    for (bool double_quant : {false, true}) {
        for (const ProductCase& c : {small, large, partial, tiny, few, ragged, one, some, most})
            guarded(product_name("nf4_matmul_forward", c, double_quant, false), [&] { check_product(false, c, double_quant, false, false, stream); });
        for (const ProductCase& c : {partial, ragged, one, some})
            guarded(product_name("nf4_matmul_forward", c, double_quant, true), [&] { check_product(false, c, double_quant, true, false, stream); });
        for (const ProductCase& c : {small, large, partial, tiny, few, ragged})
            for (bool accumulate : {false, true})
                guarded(product_name("nf4_matmul_backward_input", c, double_quant, accumulate),
                        [&] { check_product(true, c, double_quant, accumulate, false, stream); });
        guarded("controls", [&] {
            check_product(false, square, double_quant, false, true, stream);
            check_product(true, square, double_quant, true, true, stream);
        });
    }
}

int main() {
    check_suite("nf4_gpu");
    check_device_bytes();
    check_refusals();
    if (!gpu_present("NF4 dequantization on the GPU")) {
        skip("NF4 products (nf4_matmul_forward, nf4_matmul_backward_input) on the GPU", "no GPU");
        return check_failures() ? 1 : 0;
    }
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
    check_products(stream);
    cudaCheck(cudaStreamDestroy(stream));
    return check_failures() ? 1 : 0;
}
