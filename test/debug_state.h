// Reader for the debug-state file written by scripts/reference/gpt2_reference.py (format: docs/formats.md; version 3,
// with LoRA: docs/lora.md).
// Host-only C++; used by the CPU-reference test and the GPU model test.
#pragma once
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct DebugState {
    int B = 0, T = 0, steps = 0, V = 0, Vp = 0, precision = 0;
    float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_clip = 0;
    std::vector<int> inputs, targets;
    std::vector<float> logits;  // (B*T, V)
    float loss = 0, grad_norm = 0;
    std::vector<float> grads;   // model-file order; with LoRA (version 3, docs/lora.md) the adapter gradients
    std::vector<float> losses;  // (steps)
    int lora_rank = 0;          // version 3 only
    float lora_alpha = 0;
    unsigned lora_targets = 0;
};

[[noreturn]] inline void debug_state_error(const std::string& path, const std::string& what) {
    fprintf(stderr, "error: %s: %s\n", path.c_str(), what.c_str());
    exit(EXIT_FAILURE);
}

inline DebugState read_debug_state(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) debug_state_error(path, std::string("cannot open debug state: ") + strerror(errno));
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) debug_state_error(path, "too short for a debug-state header");
    if (header[0] != 20240327) debug_state_error(path, "bad magic " + std::to_string(header[0]) + " (expected 20240327, a debug state)");
    if (header[1] != 2 && header[1] != 3)
        debug_state_error(path, "unsupported debug-state version " + std::to_string(header[1]) + " (expected 2, or 3 with LoRA)");
    DebugState s;
    s.B = header[2]; s.T = header[3]; s.steps = header[4]; s.V = header[5]; s.Vp = header[6]; s.precision = header[7];
    float* hf = reinterpret_cast<float*>(header);
    s.lr = hf[8]; s.beta1 = hf[9]; s.beta2 = hf[10]; s.eps = hf[11]; s.weight_decay = hf[12]; s.grad_clip = hf[13];
    if (header[1] == 3) { s.lora_rank = header[14]; s.lora_alpha = hf[15]; s.lora_targets = (unsigned)header[16]; }
    if (s.B <= 0 || s.T <= 0 || s.steps < 1 || s.V <= 0) debug_state_error(path, "invalid B, T, V or step count");
    const size_t N = (size_t)s.B * s.T;
    auto read = [&](void* dst, size_t bytes, const char* what) {
        if (fread(dst, 1, bytes, f) != bytes) debug_state_error(path, std::string("truncated while reading ") + what);
    };
    s.inputs.resize(N); s.targets.resize(N); s.logits.resize(N * s.V); s.losses.resize(s.steps);
    read(s.inputs.data(), N * 4, "inputs");
    read(s.targets.data(), N * 4, "targets");
    read(s.logits.data(), N * s.V * 4, "logits");
    read(&s.loss, 4, "loss");
    read(&s.grad_norm, 4, "grad norm");
    // the gradients fill the rest of the file except the step losses
    long here = ftell(f);
    fseek(f, 0, SEEK_END);
    long grad_bytes = ftell(f) - here - (long)s.steps * 4;
    if (grad_bytes <= 0 || grad_bytes % 4 != 0) debug_state_error(path, "gradient section has a bad size");
    fseek(f, here, SEEK_SET);
    s.grads.resize(grad_bytes / 4);
    read(s.grads.data(), grad_bytes, "gradients");
    read(s.losses.data(), (size_t)s.steps * 4, "losses");
    fclose(f);
    return s;
}
