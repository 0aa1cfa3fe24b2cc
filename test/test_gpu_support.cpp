// Tests for kernels/gpu_support.h: which GPUs train_gpt refuses (below compute capability 8.0, with one line
// naming the GPU, its capability and what is needed) and the dense bf16 peaks MFU is computed against, looked
// up by the names cudaGetDeviceProperties reports. Needs no GPU. One PASS/FAIL line per check (test/check.h).
#include <string>
#include "../kernels/gpu_support.h"
#include "check.h"

int main() {
    check_suite("gpu_support");
    // refused below 8.0, with the name, the capability and the requirement in one line
    const std::string v100 = gpu_support_problem("Tesla V100-SXM2-16GB", 7, 0);
    expect(v100.find("Tesla V100-SXM2-16GB") != std::string::npos && v100.find("compute capability 7.0") != std::string::npos &&
               v100.find("8.0 or newer") != std::string::npos && v100.find('\n') == std::string::npos,
           "refuses a V100 (7.0) in one line naming it", "message: " + v100);
    const std::string t4 = gpu_support_problem("Tesla T4", 7, 5);
    expect(t4.find("compute capability 7.5") != std::string::npos, "refuses a T4 (7.5)", "message: " + t4);
    for (int major : {8, 9, 10, 12})
        expect(gpu_support_problem("some GPU", major, 0).empty(), "accepts compute capability " + std::to_string(major) + ".0",
               gpu_support_problem("some GPU", major, 0));

    // the peaks, for names as the driver reports them; specific boards before their family, whole words only
    struct Case { const char* name; double tflops; };
    const Case cases[] = {
        {"NVIDIA H100 80GB HBM3", 989}, {"NVIDIA H100 PCIe", 756}, {"NVIDIA H100 NVL", 835}, {"NVIDIA H200", 989},
        {"NVIDIA H200 NVL", 835}, {"NVIDIA GH200 480GB", 989}, {"NVIDIA H20", 148}, {"NVIDIA A100-SXM4-80GB", 312},
        {"NVIDIA A100-PCIE-40GB", 312}, {"NVIDIA A10", 125}, {"NVIDIA A10G", 0}, {"NVIDIA L4", 121}, {"NVIDIA L40", 181},
        {"NVIDIA L40S", 362}, {"NVIDIA GeForce RTX 4090", 165.2}, {"NVIDIA GeForce RTX 3090", 71}, {"NVIDIA GeForce RTX 3090 Ti", 80},
        {"NVIDIA RTX A6000", 154.8}, {"NVIDIA RTX 6000 Ada Generation", 364}, {"NVIDIA B200", 2250}, {"NVIDIA GeForce RTX 5090", 209.5},
        {"Some Future GPU", 0},
    };
    for (const Case& c : cases) {
        const double got = dense_bf16_peak_tflops(c.name);
        check(got == c.tflops, std::string("peak of ") + c.name, fmt("%g TFLOP/s (expected %g; 0: unknown, MFU n/a)", got, c.tflops));
    }
    return check_failures() ? 1 : 0;
}
