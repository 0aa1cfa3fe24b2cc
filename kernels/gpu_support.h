// Which GPUs train_gpt runs on, and each one's dense bf16 tensor-core peak for MFU. Plain C++ (no CUDA), so
// that a CPU test checks the refusal and the table; the query of the device itself is in common.cuh
// (require_supported_gpu).
// Every kernel needs compute capability 8.0 (bf16 tensor cores, cp.async, mma.sync m16n8k16); Hopper (9.x) with
// sm_90a code in the binary runs its own attention kernels (wgmma, TMA), every other GPU the mma.sync ones.
// FP8 tensor cores (E4M3, E5M2) come with compute capability 8.9 (Ada) and later: fp8_support_problem.
// defines: gpu_support_problem, fp8_support_problem, dense_bf16_peak_tflops
#pragma once
#include <string>
#include <vector>

constexpr int kMinComputeMajor = 8;

// "" when train_gpt runs on this GPU, else the one-line reason.
inline std::string gpu_support_problem(const std::string& name, int major, int minor) {
    if (major >= kMinComputeMajor) return "";
    return name + " has compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           "; train_gpt needs 8.0 or newer (bf16 tensor cores: Ampere, Ada, Hopper, Blackwell, e.g. A100, RTX 3090/4090, L40S, H100)";
}

constexpr int kMinFp8ComputeMajor = 8, kMinFp8ComputeMinor = 9;

// "" when the GPU has FP8 tensor cores (the FP8 casts and products of kernels/fp8.cuh and matmul.cuh), else the
// one-line reason.
inline std::string fp8_support_problem(const std::string& name, int major, int minor) {
    if (major > kMinFp8ComputeMajor || (major == kMinFp8ComputeMajor && minor >= kMinFp8ComputeMinor)) return "";
    return name + " has compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           "; FP8 needs 8.9 or newer (FP8 tensor cores: Ada, Hopper, Blackwell, e.g. L4, L40S, RTX 4090, H100, H200, B200)";
}

// Dense (no sparsity) bf16 tensor-core peak with fp32 accumulation, in TFLOP/s, from the vendor's datasheets and
// architecture whitepapers at boost clock; 0 for a GPU not in the table (MFU is then printed as n/a). GeForce
// cards accumulate in fp32 at half their fp16-accumulate rate; these are the fp32-accumulate figures, the ones a
// training step uses. Matched on the name that cudaGetDeviceProperties gives; the first entry whose every word
// the name contains (as whole words) wins, so specific names come before the general ones.
struct GpuPeak {
    std::vector<std::string> words;
    double tflops;
};
inline const std::vector<GpuPeak>& gpu_peak_table() {
    static const std::vector<GpuPeak> table = {
        // Blackwell
        {{"GB200"}, 2500}, {{"B200"}, 2250}, {{"RTX", "5090"}, 209.5},
        // Hopper: SXM (the "HBM3" / "HBM3e" names and H200) against PCIe and NVL boards
        {{"H100", "PCIe"}, 756}, {{"H100", "NVL"}, 835}, {{"H800", "PCIe"}, 756}, {{"H200", "NVL"}, 835},
        {{"GH200"}, 989}, {{"H100"}, 989}, {{"H800"}, 989}, {{"H200"}, 989}, {{"H20"}, 148},
        // Ada
        {{"L40S"}, 362}, {{"L40"}, 181}, {{"L4"}, 121}, {{"RTX", "6000", "Ada"}, 364},
        {{"RTX", "4090"}, 165.2}, {{"RTX", "4080"}, 97.5},
        // Ampere
        {{"A100"}, 312}, {{"A800"}, 312}, {{"A30"}, 165}, {{"A40"}, 149.7}, {{"A10"}, 125},
        {{"RTX", "A6000"}, 154.8}, {{"RTX", "A5000"}, 111.1}, {{"RTX", "A4000"}, 76.7},
        {{"RTX", "3090", "Ti"}, 80}, {{"RTX", "3090"}, 71}, {{"RTX", "3080"}, 59.5},
    };
    return table;
}

// The name's words, split at spaces, dashes and underscores ("NVIDIA A100-SXM4-80GB": NVIDIA, A100, SXM4, 80GB).
inline std::vector<std::string> gpu_name_words(const std::string& name) {
    std::vector<std::string> words(1);
    for (char c : name) {
        if (c == ' ' || c == '-' || c == '_') {
            if (!words.back().empty()) words.emplace_back();
        } else {
            words.back() += c;
        }
    }
    if (words.back().empty()) words.pop_back();
    return words;
}

inline double dense_bf16_peak_tflops(const std::string& name) {
    const std::vector<std::string> words = gpu_name_words(name);
    for (const GpuPeak& entry : gpu_peak_table()) {
        bool all = true;
        for (const std::string& w : entry.words) {
            bool found = false;
            for (const std::string& n : words) found = found || n == w;
            all = all && found;
        }
        if (all) return entry.tflops;
    }
    return 0;
}
