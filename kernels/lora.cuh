// LoRA adapters (Hu et al. 2021) on a frozen linear layer: y = W0 x + b + s B A dropout(x), s = alpha / r,
// A (r, in), B (out, r). The adapter path is four small cuBLASLt products around the base product, which
// stays as it is (so with B = 0 the output is bitwise the base model's); the rank-r intermediate
// u = A dropout(x) (N x r) is kept for the backward. Dropout masks come from (seed, element index), so the
// backward regenerates them instead of storing them.
// defines: lora_forward, lora_backward, lora_dropout, lora_strided_matmul
#pragma once
#include <map>
#include <tuple>
#include "common.cuh"
#include "matmul.cuh"

// out = x * keep / (1 - p), keep drawn with probability 1 - p from (seed, i).
template <typename floatX>
__global__ void lora_dropout_kernel(floatX* out, const floatX* x, long n, float p, uint64_t seed) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float u = (random_u32(seed, i) >> 8) / 16777216.0f;
        out[i] = from_float<floatX>(u >= p ? to_float(x[i]) / (1.0f - p) : 0.0f);
    }
}
template <typename floatX>
void lora_dropout(floatX* out, const floatX* x, long n, float p, uint64_t seed, cudaStream_t stream) {
    lora_dropout_kernel<<<std::min<long>(ceil_div(n, 256), 65535), 256, 0, stream>>>(out, x, n, p, seed);
    cudaCheckLaunch();
}

// Column-major D (m, n; leading dimension ldd) = alpha op(A) op(B) [+ D], B's leading dimension ldb: the products
// of an adapter on a column slice of a wider output (q, k, v of qkv's; gate, up of fc's), whose rows in D and dout
// are ld apart. matmul_cublaslt's products have no leading dimensions of their own; these keep their own plans, made
// at a problem's first product (the heuristic's first choice, for the pointers' alignments).
struct LoraStridedKey {
    int m, n, k, ldb, ldd;
    bool trans_a, trans_b, accumulate;
    cudaDataType_t type;
    cublasComputeType_t compute;
    int align_a, align_b, align_d;
    bool operator<(const LoraStridedKey& o) const {
        return std::tie(m, n, k, ldb, ldd, trans_a, trans_b, accumulate, type, compute, align_a, align_b, align_d) <
               std::tie(o.m, o.n, o.k, o.ldb, o.ldd, o.trans_a, o.trans_b, o.accumulate, o.type, o.compute, o.align_a, o.align_b, o.align_d);
    }
};
struct LoraStridedPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};
template <typename floatX>
void lora_strided_matmul(floatX* d, const floatX* a, const floatX* b, int m, int n, int k, int ldb, int ldd, bool trans_a, bool trans_b,
                         bool accumulate, float alpha, cudaStream_t stream) {
    static std::map<LoraStridedKey, LoraStridedPlan> plans;  // kept for the process: no plan depends on the handle
    MatmulContext& ctx = matmul_context();
    const LoraStridedKey key{m, n, k, ldb, ldd, trans_a, trans_b, accumulate, cuda_data_type<floatX>(), matmul_compute_type<floatX>(),
                             pointer_alignment(a), pointer_alignment(b), pointer_alignment(d)};
    auto cached = plans.find(key);
    if (cached == plans.end()) {
        LoraStridedPlan plan;
        cublasCheck(cublasLtMatmulDescCreate(&plan.desc, key.compute, CUDA_R_32F));
        const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.a, key.type, trans_a ? k : m, trans_a ? m : k, trans_a ? k : m));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.b, key.type, trans_b ? n : k, trans_b ? k : n, ldb));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.d, key.type, m, n, ldd));
        cublasLtMatmulPreference_t preference;
        cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx.workspace_bytes,
                                                         sizeof(ctx.workspace_bytes)));
        // a slice starts where its columns do: the algorithm must allow its pointers' alignments
        const uint32_t align_a = key.align_a, align_b = key.align_b, align_d = key.align_d;
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
        cublasLtMatmulHeuristicResult_t heuristic;
        int found = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.lt, plan.desc, plan.a, plan.b, plan.d, plan.d, preference, 1, &heuristic, &found));
        cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
        if (found == 0)
            die("cuBLASLt has no algorithm for LoRA's slice product m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                std::to_string(k) + " ldb=" + std::to_string(ldb) + " ldd=" + std::to_string(ldd));
        plan.algo = heuristic.algo;
        cached = plans.emplace(key, plan).first;
    }
    const LoraStridedPlan& plan = cached->second;
    const float beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(ctx.lt, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d, &plan.algo, ctx.workspace,
                               ctx.workspace_bytes, stream));
}

// out (N, out) += s * (x_in A^T) B^T, keeping u = x_in A^T (N, r). x_in is the (dropped-out) input (N, in). out's rows
// are `ld` apart (0: out_features, a whole product's output; more: a column slice of a wider one, `out` at its first
// column).
template <typename floatX>
void lora_forward(floatX* out, floatX* u, const floatX* x_in, const floatX* A, const floatX* B, float scale, int N, int in,
                  int out_features, int r, cudaStream_t stream, int ld = 0) {
    matmul_forward(u, x_in, A, (const floatX*)nullptr, N, in, r, stream);
    if (ld == 0 || ld == out_features) matmul_cublaslt(out, B, u, (const floatX*)nullptr, out_features, N, r, true, false, true, stream, scale);
    else lora_strided_matmul(out, B, u, out_features, N, r, r, ld, true, false, true, scale, stream);
}

// Given dout (N, out; rows `ld` apart as in lora_forward): dB += s dout^T u, du = s dout B (scratch, N x r),
// dA += du^T x_in, and the input gradient of the adapter path du A, added into dx_in (which the caller masks when
// there is dropout).
template <typename floatX>
void lora_backward(floatX* dx_in, floatX* dA, floatX* dB, floatX* du, const floatX* dout, const floatX* u, const floatX* x_in,
                   const floatX* A, const floatX* B, float scale, int N, int in, int out_features, int r, bool accumulate_dx,
                   cudaStream_t stream, int ld = 0) {
    if (ld == 0 || ld == out_features) {
        matmul_cublaslt(dB, u, dout, (const floatX*)nullptr, r, out_features, N, false, true, true, stream, scale);
        matmul_cublaslt(du, B, dout, (const floatX*)nullptr, r, N, out_features, false, false, false, stream, scale);
    } else {
        lora_strided_matmul(dB, u, dout, r, out_features, N, ld, r, false, true, true, scale, stream);
        lora_strided_matmul(du, B, dout, r, N, out_features, ld, r, false, false, false, scale, stream);
    }
    matmul_cublaslt(dA, x_in, du, (const floatX*)nullptr, in, r, N, false, true, true, stream);
    matmul_cublaslt(dx_in, A, du, (const floatX*)nullptr, in, N, r, false, false, accumulate_dx, stream);
}
