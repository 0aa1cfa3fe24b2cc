// Matrix products through cuBLASLt (forward with a fused bias epilogue, backward for inputs and weights),
// the MLP's GELU fused into the products' epilogues, FP8 products (E4M3/E5M2 operands, bf16 output), and our own
// deterministic bias-gradient kernels.
// defines: matmul_setup, matmul_teardown, matmul_context, overlaps, matmul_forward, matmul_forward_gelu, matmul_backward
//          (matmul_backward_input, matmul_backward_weights),
//          matmul_gelu_epilogues, kFuseGeluInFp32, bias_backward, bias_backward_scratch_floats, colsum_times_weight,
//          colsum_times_weight_scratch_floats, matmul_compute_type, matmul_fp8
#pragma once
#include <algorithm>
#include <map>
#include <tuple>
#include <vector>
#include "common.cuh"
#include "fp8.cuh"   // defines: the FP8 types' cuBLASLt types, require_fp8_gpu, fp8_matmul_shape_problem (fp8_formats.h)
#include "gelu.cuh"  // defines: gelu_tanh (the small-row products' GELU)

// A product as cuBLASLt's algorithm heuristic sees it, plus whether it accumulates. The heuristic reads the
// bias and aux pointers from the description and picks algorithms their alignments allow, so their
// alignments are part of the key. The operands have D's type but in FP8 products (matmul_fp8: FP8 A and B, bf16 D).
struct MatmulKey {
    int m, n, k;
    bool trans_a, trans_b, accumulate;
    cublasLtEpilogue_t epilogue;
    cudaDataType_t a_type, b_type, d_type;
    cublasComputeType_t compute;
    int bias_alignment, aux_alignment;
    bool operator<(const MatmulKey& o) const {
        return std::tie(m, n, k, trans_a, trans_b, accumulate, epilogue, a_type, b_type, d_type, compute, bias_alignment,
                        aux_alignment) <
               std::tie(o.m, o.n, o.k, o.trans_a, o.trans_b, o.accumulate, o.epilogue, o.a_type, o.b_type, o.d_type, o.compute,
                        o.bias_alignment, o.aux_alignment);
    }
};
// What changes from one product of a plan to the next: the pointers. a_scale and b_scale, FP8 products' factors
// (device floats) that cuBLASLt multiplies the product by; null in the others.
struct MatmulOperands {
    void* d;
    const void* a;
    const void* b;
    const void* bias;
    void* aux;
    const float* a_scale;
    const float* b_scale;
};

struct MatmulContext {
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 32ull << 20;
    bool allow_tf32 = false;  // fp32 mode is exact unless the user asks for TF32
    // Time the heuristic's candidates at a problem's first product and keep the fastest (fastest_candidate).
    // On an H200 the heuristic's first choices for GPT-2 124M's products at B=64 take 74.1 ms a step against
    // 69.8 for the fastest candidates (up to 16% slower for one product: the DGELU product, the LM head);
    // off, the first choice is kept, so that runs are bitwise reproducible.
    bool autotune = false;
    cudaEvent_t timer_start = nullptr, timer_stop = nullptr;
    // Per problem, made once and not on each of the ~150 products of a step: the descriptors (only the bias and
    // aux pointers change from call to call) and the algorithm.
    struct Plan {
        cublasLtMatmulDesc_t desc;
        cublasLtMatrixLayout_t a, b, d;
        cublasLtMatmulAlgo_t algo;
    };
    std::map<MatmulKey, Plan> plans;
};
inline MatmulContext& matmul_context() {
    static MatmulContext context;
    return context;
}

inline void matmul_setup(bool allow_tf32, bool autotune = false) {
    MatmulContext& ctx = matmul_context();
    ctx.allow_tf32 = allow_tf32;
    ctx.autotune = autotune;
    cublasCheck(cublasLtCreate(&ctx.lt));
    cudaCheck(cudaMalloc(&ctx.workspace, ctx.workspace_bytes));
    cudaCheck(cudaEventCreate(&ctx.timer_start));
    cudaCheck(cudaEventCreate(&ctx.timer_stop));
}
inline void matmul_teardown() {
    MatmulContext& ctx = matmul_context();
    for (auto& entry : ctx.plans) {
        cublasCheck(cublasLtMatmulDescDestroy(entry.second.desc));
        for (cublasLtMatrixLayout_t layout : {entry.second.a, entry.second.b, entry.second.d}) cublasCheck(cublasLtMatrixLayoutDestroy(layout));
    }
    cublasCheck(cublasLtDestroy(ctx.lt));
    cudaCheck(cudaFree(ctx.workspace));
    cudaCheck(cudaEventDestroy(ctx.timer_start));
    cudaCheck(cudaEventDestroy(ctx.timer_stop));
    ctx = MatmulContext();
}

template <typename floatX> inline cublasComputeType_t matmul_compute_type() {
    if (std::is_same<floatX, float>::value)
        return matmul_context().allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    return CUBLAS_COMPUTE_32F;
}

// Whether fp32 products take cuBLASLt's GELU epilogues too (bf16 and fp16 always do). cuBLASLt computes the
// tanh approximation of kernels/gelu.cuh, but does not document its fp32 accuracy: if the fp32 tests of
// matmul_forward_gelu / matmul_backward's gelu_inp miss their 1e-5 tolerance on the GPU, set this to false
// and fp32 runs the product and kernels/gelu.cuh's kernels separately.
constexpr bool kFuseGeluInFp32 = true;
template <typename floatX> constexpr bool matmul_gelu_epilogues() {
    return kFuseGeluInFp32 || !std::is_same<floatX, float>::value;
}

// What the epilogue does after the product (and the bias): nothing; GELU (the pre-activation written to aux);
// or the GELU's backward (the product times gelu'(aux)).
enum class MatmulGelu { kNone, kForward, kBackward };

// The largest power of two, up to 256, that divides the address (0 for null).
inline int pointer_alignment(const void* p) {
    const uintptr_t address = (uintptr_t)p;
    return p == nullptr ? 0 : (int)std::min<uintptr_t>(256, address & (~address + 1));
}
// Whether the byte ranges [p, p + p_bytes) and [q, q + q_bytes) share a byte (never for null).
inline bool overlaps(const void* p, size_t p_bytes, const void* q, size_t q_bytes) {
    const uintptr_t x = (uintptr_t)p, y = (uintptr_t)q;
    return p != nullptr && q != nullptr && x < y + q_bytes && y < x + p_bytes;
}
// How many of the heuristic's candidates autotuning times (cuBLASLt returns up to 8 for GPT-2's products).
constexpr int kMatmulCandidates = 8;

inline size_t cuda_type_bytes(cudaDataType_t type) {
    switch (type) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16BF: case CUDA_R_16F: return 2;
        case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2: return 1;
        default: die("matmul: unexpected data type " + std::to_string((int)type));
    }
}
inline bool epilogue_writes_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
inline bool epilogue_uses_aux(cublasLtEpilogue_t e) { return epilogue_writes_aux(e) || e == CUBLASLT_EPILOGUE_DGELU; }

// Sets a call's pointers in a plan's description (every other attribute is the key's).
inline void matmul_set_pointers(cublasLtMatmulDesc_t desc, const MatmulKey& key, const MatmulOperands& p) {
    if (p.bias != nullptr) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
    if (epilogue_uses_aux(key.epilogue)) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux)));
    if (p.a_scale != nullptr) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.a_scale, sizeof(p.a_scale)));
    if (p.b_scale != nullptr) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.b_scale, sizeof(p.b_scale)));
}

// Autotuning: times each of the heuristic's candidates and returns the fastest one's index. Each candidate runs
// kTuneRounds times kTuneReps products, the rounds interleaved across candidates, and its fastest round counts:
// one round of 3 picked a candidate 1-7% slower than the fastest in 2 to 10 of 10 tries for 4 of GPT-2 124M's
// 15 products on an H200 (the clock drifts under load). The candidates write the product's own outputs where that
// rewrites nothing but them (the product itself then writes them again); where it would (accumulating into D,
// or an output overlapping an input) they write a temporary buffer of D's (and aux's) size instead, or, if
// that does not fit in memory, the heuristic's first choice is kept.
constexpr int kTuneRounds = 3, kTuneReps = 5;
inline int fastest_candidate(const cublasLtMatmulHeuristicResult_t* heuristics, int found, cublasLtMatmulDesc_t desc,
                             cublasLtMatrixLayout_t layout_a, cublasLtMatrixLayout_t layout_b, cublasLtMatrixLayout_t layout_d,
                             const MatmulKey& key, const MatmulOperands& p, float alpha, cudaStream_t stream) {
    MatmulContext& ctx = matmul_context();
    const size_t d_bytes = (size_t)key.m * key.n * cuda_type_bytes(key.d_type);
    const size_t a_bytes = (size_t)key.m * key.k * cuda_type_bytes(key.a_type), b_bytes = (size_t)key.k * key.n * cuda_type_bytes(key.b_type);
    const size_t bias_bytes = (size_t)key.m * cuda_type_bytes(key.d_type);
    const bool aux_written = epilogue_writes_aux(key.epilogue);
    const bool outputs_apart =
        !overlaps(p.d, d_bytes, p.a, a_bytes) && !overlaps(p.d, d_bytes, p.b, b_bytes) && !overlaps(p.d, d_bytes, p.bias, bias_bytes) &&
        !overlaps(p.d, d_bytes, p.aux, d_bytes) &&
        (!aux_written || (!overlaps(p.aux, d_bytes, p.a, a_bytes) && !overlaps(p.aux, d_bytes, p.b, b_bytes)));
    MatmulOperands tune = p;
    char* temporary = nullptr;
    if (key.accumulate || !outputs_apart) {
        if (cudaMalloc(&temporary, d_bytes * (aux_written ? 2 : 1)) != cudaSuccess) {
            (void)cudaGetLastError();  // clears the failed allocation's error: no room to tune, keep the first choice
            return 0;
        }
        cudaCheck(cudaMemsetAsync(temporary, 0, d_bytes * (aux_written ? 2 : 1), stream));
        tune.d = temporary;
        if (aux_written) {
            tune.aux = temporary + d_bytes;
            matmul_set_pointers(desc, key, tune);
        }
    }
    const float beta = key.accumulate ? 1.0f : 0.0f;
    auto run = [&](int i) {
        return cublasLtMatmul(ctx.lt, desc, &alpha, p.a, layout_a, p.b, layout_b, &beta, tune.d, layout_d, tune.d, layout_d,
                              &heuristics[i].algo, ctx.workspace, ctx.workspace_bytes, stream);
    };
    std::vector<float> best_ms(found, INFINITY);
    std::vector<bool> runs(found);
    for (int i = 0; i < found; i++) runs[i] = run(i) == CUBLAS_STATUS_SUCCESS;  // a warm-up; skip what fails
    for (int round = 0; round < kTuneRounds; round++) {
        for (int i = 0; i < found; i++) {
            if (!runs[i]) continue;
            cudaCheck(cudaEventRecord(ctx.timer_start, stream));
            for (int r = 0; r < kTuneReps; r++) cublasCheck(run(i));
            cudaCheck(cudaEventRecord(ctx.timer_stop, stream));
            cudaCheck(cudaEventSynchronize(ctx.timer_stop));
            float ms;
            cudaCheck(cudaEventElapsedTime(&ms, ctx.timer_start, ctx.timer_stop));
            best_ms[i] = std::min(best_ms[i], ms);
        }
    }
    if (temporary != nullptr) {
        if (aux_written) matmul_set_pointers(desc, key, p);
        cudaCheck(cudaFree(temporary));
    }
    return (int)(std::min_element(best_ms.begin(), best_ms.end()) - best_ms.begin());
}

// Runs the product `key` on the operands p: D = alpha op(A) op(B) [* a_scale * b_scale] [+ bias] [+ D], then the
// epilogue. The plan (descriptors and algorithm) is made at a key's first product and kept.
inline void matmul_run(const MatmulKey& key, const MatmulOperands& p, float alpha, cudaStream_t stream) {
    MatmulContext& ctx = matmul_context();
    auto cached = ctx.plans.find(key);
    if (cached == ctx.plans.end()) {
        const int m = key.m, n = key.n, k = key.k;
        MatmulContext::Plan plan;
        cublasCheck(cublasLtMatmulDescCreate(&plan.desc, key.compute, CUDA_R_32F));
        cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue, sizeof(key.epilogue)));
        if (p.bias != nullptr) {
            cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &key.d_type, sizeof(key.d_type)));
        }
        if (epilogue_uses_aux(key.epilogue)) {
            const int64_t aux_ld = m;  // aux has D's layout and type (the default aux data type: D's)
            cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        }
        matmul_set_pointers(plan.desc, key, p);
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.a, key.a_type, key.trans_a ? k : m, key.trans_a ? m : k, key.trans_a ? k : m));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.b, key.b_type, key.trans_b ? n : k, key.trans_b ? k : n, key.trans_b ? n : k));
        cublasCheck(cublasLtMatrixLayoutCreate(&plan.d, key.d_type, m, n, m));
        cublasLtMatmulPreference_t preference;
        cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &ctx.workspace_bytes, sizeof(ctx.workspace_bytes)));
        cublasLtMatmulHeuristicResult_t heuristics[kMatmulCandidates];
        int found = 0, chosen_algorithm = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.lt, plan.desc, plan.a, plan.b, plan.d, plan.d, preference,
                                                   ctx.autotune ? kMatmulCandidates : 1, heuristics, &found));
        cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
        if (found == 0) {
            die("cuBLASLt has no algorithm for m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                " trans_a=" + std::to_string(key.trans_a) + " trans_b=" + std::to_string(key.trans_b) + " epilogue=" +
                std::to_string((int)key.epilogue) + " types a=" + std::to_string((int)key.a_type) + " b=" +
                std::to_string((int)key.b_type) + " d=" + std::to_string((int)key.d_type));
        }
        if (found > 1) chosen_algorithm = fastest_candidate(heuristics, found, plan.desc, plan.a, plan.b, plan.d, key, p, alpha, stream);
        plan.algo = heuristics[chosen_algorithm].algo;
        cached = ctx.plans.emplace(key, plan).first;
    }
    const MatmulContext::Plan& plan = cached->second;
    matmul_set_pointers(plan.desc, key, p);
    const float beta = key.accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(ctx.lt, plan.desc, &alpha, p.a, plan.a, p.b, plan.b, &beta, p.d, plan.d, p.d, plan.d, &plan.algo,
                               ctx.workspace, ctx.workspace_bytes, stream));
}

// Column-major D(m,n) = alpha op(A)(m,k) * op(B)(k,n) [+ bias(m) broadcast over n] [+ D if accumulate],
// then the `gelu` step (kBackward takes no bias) with aux, an (m,n) matrix in D's layout; cuBLASLt needs its
// leading dimension m to be a multiple of 8. Row-major callers pass their matrices as the transposed
// column-major ones (see matmul_forward).
template <typename floatX>
void matmul_cublaslt(floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
                     bool trans_a, bool trans_b, bool accumulate, cudaStream_t stream, float alpha = 1.0f,
                     MatmulGelu gelu = MatmulGelu::kNone, floatX* aux = nullptr) {
    const cudaDataType_t type = cuda_data_type<floatX>();
    const cublasLtEpilogue_t epilogue =
        gelu == MatmulGelu::kBackward ? CUBLASLT_EPILOGUE_DGELU
        : gelu == MatmulGelu::kForward ? (bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                       : (bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    if (gelu != MatmulGelu::kNone && m % 8 != 0) {
        die("cuBLASLt's GELU epilogues need the GELU's width to be a multiple of 8, got " + std::to_string(m));
    }
    const MatmulKey key{m, n, k, trans_a, trans_b, accumulate, epilogue, type, type, type, matmul_compute_type<floatX>(),
                        pointer_alignment(bias), pointer_alignment(aux)};
    matmul_run(key, MatmulOperands{d, a, b, bias, aux, nullptr, nullptr}, alpha, stream);
}

// FP8 product, in row-major terms: out[n, m] = a[m, k] b[n, k]^T * a_scale * b_scale [+ bias[m]] [+ out if
// accumulate], both operands with the reduction dimension k contiguous (cuBLASLt's FP8 kernels take A transposed
// and B not, the "TN" layout), fp32 accumulation, a bf16 output. As a Linear layer: the forward is
// a = weight[OC, C] (E4M3), b = inp[N, C] (E4M3); the input gradient a = weight^T[C, OC] (E4M3), b = dout[N, OC]
// (E5M2); the weight gradient a = inp^T[C, N] (E4M3), b = dout^T[OC, N] (E5M2), accumulating: the transposed
// copies come from fp8_cast. a_scale and b_scale point to the operands' inverse scales (Fp8Scaling's
// inverse_scale). m and k must be multiples of 16 (fp8_matmul_shape_problem), the buffers and scale pointers 16-byte aligned, the GPU
// of compute capability 8.9 or newer; each is refused in one line. cuBLASLt has no E5M2 x E5M2 product.
template <typename fp8A, typename fp8B>
void matmul_fp8(__nv_bfloat16* out, const fp8A* a, const fp8B* b, const float* a_scale, const float* b_scale,
                const __nv_bfloat16* bias, int m, int n, int k, bool accumulate, cudaStream_t stream) {
    static_assert(!(std::is_same<fp8A, __nv_fp8_e5m2>::value && std::is_same<fp8B, __nv_fp8_e5m2>::value),
                  "cuBLASLt has no E5M2 x E5M2 product: one operand must be E4M3");
    const std::string shape = fp8_matmul_shape_problem(m, n, k);
    if (!shape.empty()) die(shape);
    if ((uintptr_t)out % 16 != 0 || (uintptr_t)a % 16 != 0 || (uintptr_t)b % 16 != 0 || (uintptr_t)bias % 16 != 0)
        die("FP8 product: the operands, the output and the bias must be 16-byte aligned");
    if ((uintptr_t)a_scale % 16 != 0 || (uintptr_t)b_scale % 16 != 0) die("FP8 product: the scale pointers must be 16-byte aligned");
    require_fp8_gpu();
    const cublasLtEpilogue_t epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const MatmulKey key{m, n, k, true, false, accumulate, epilogue, cuda_data_type<fp8A>(), cuda_data_type<fp8B>(),
                        CUDA_R_16BF, CUBLAS_COMPUTE_32F, pointer_alignment(bias), 0};
    matmul_run(key, MatmulOperands{out, a, b, bias, nullptr, a_scale, b_scale}, 1.0f, stream);
}

// Products of at most kSmallProductRows rows (sampling's forward of one new position): a warp per output column
// reads its weight row once, 16 bytes a lane at a time, and keeps every input row's dot product; the row's sums in
// fp32, the bias and the GELU (of the unrounded sum, as cuBLASLt's epilogue) added before rounding once. At these
// sizes the GPU work is a few microseconds, less than cuBLASLt's host work per call.
constexpr int kSmallProductRows = 8;
template <typename floatX>
bool small_row_product(int N, int C, const void* inp, const void* weight) {
    constexpr int V = Packed128<floatX>::size;
    return N <= kSmallProductRows && C % V == 0 && (uintptr_t)inp % 16 == 0 && (uintptr_t)weight % 16 == 0;
}
template <typename floatX, bool kGelu>
__global__ void small_rows_matmul_kernel(floatX* out, floatX* pre, const floatX* inp, const floatX* weight, const floatX* bias,
                                         int N, int C, int OC) {
    using Vec = Packed128<floatX>;
    constexpr int V = Vec::size;
    const int column = (int)(((long)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (column >= OC) return;
    const floatX* w = weight + (size_t)column * C;
    float acc[kSmallProductRows] = {};
    for (int k = lane * V; k < C; k += 32 * V) {
        const Vec wv = load128(w + k);
#pragma unroll
        for (int r = 0; r < kSmallProductRows; r++) {
            if (r >= N) break;
            const Vec x = load128(inp + (size_t)r * C + k);
            for (int j = 0; j < V; j++) acc[r] += to_float(wv[j]) * to_float(x[j]);
        }
    }
#pragma unroll
    for (int r = 0; r < kSmallProductRows; r++) {
        if (r >= N) break;
        const float sum = warp_reduce_sum(acc[r]) + (bias != nullptr ? to_float(bias[column]) : 0.0f);
        if (lane != 0) continue;
        if (kGelu) {
            pre[(size_t)r * OC + column] = from_float<floatX>(sum);
            out[(size_t)r * OC + column] = from_float<floatX>(gelu_tanh(sum));
        } else {
            out[(size_t)r * OC + column] = from_float<floatX>(sum);
        }
    }
}
template <typename floatX, bool kGelu>
void small_rows_matmul(floatX* out, floatX* pre, const floatX* inp, const floatX* weight, const floatX* bias, int N, int C, int OC,
                       cudaStream_t stream) {
    constexpr int block = 256;
    small_rows_matmul_kernel<floatX, kGelu><<<ceil_div(OC * 32, block), block, 0, stream>>>(out, pre, inp, weight, bias, N, C, OC);
    cudaCheckLaunch();
}

// out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] (row-major, PyTorch Linear layout).
template <typename floatX>
void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int N, int C, int OC,
                    cudaStream_t stream) {
    if (small_row_product<floatX>(N, C, inp, weight)) small_rows_matmul<floatX, false>(out, nullptr, inp, weight, bias, N, C, OC, stream);
    else matmul_cublaslt(out, weight, inp, bias, OC, N, C, true, false, false, stream);
}

// pre[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] and out = gelu(pre) (tanh approximation), in one product whose
// epilogue applies the GELU to the fp32 pre-activation before rounding either output to floatX.
// OC must be a multiple of 8. The model uses it where matmul_gelu_epilogues<floatX>().
template <typename floatX>
void matmul_forward_gelu(floatX* out, floatX* pre, const floatX* inp, const floatX* weight, const floatX* bias, int N,
                         int C, int OC, cudaStream_t stream) {
    if (small_row_product<floatX>(N, C, inp, weight)) small_rows_matmul<floatX, true>(out, pre, inp, weight, bias, N, C, OC, stream);
    else matmul_cublaslt(out, weight, inp, bias, OC, N, C, true, false, false, stream, 1.0f, MatmulGelu::kForward, pre);
}

// dbias[OC] += column sums of dout[N,OC] (rows ld apart: OC unless dout is a column slice of wider rows).
// Each thread owns one 16-byte group of columns; blockDim.y
// threads split the rows, their sums are combined in shared memory in a fixed order, and each block
// writes one fp32 partial row that partials_accumulate adds in block order: deterministic, no atomics.
constexpr int kBiasRowThreads = 8;
inline int bias_backward_row_blocks(int OC, int X) {
    const int column_blocks = ceil_div(OC, 32 * X);
    return std::max(1, 4 * device_sm_count() / column_blocks);
}
// Enough for bias_backward over any column count up to OC (a column slice of a wider product included): a block
// row takes 32 X columns, so row_blocks(k) k <= max(k, 4 SMs x 32 X), which is not monotone in k.
template <typename floatX>
inline size_t bias_backward_scratch_floats(int OC) {
    return std::max((size_t)OC, (size_t)4 * device_sm_count() * 32 * Packed128<floatX>::size);
}

template <typename floatX>
__global__ void bias_backward_kernel(float* partials, const floatX* dout, int N, int OC, long ld) {
    constexpr int X = Packed128<floatX>::size;
    __shared__ float shared[kBiasRowThreads][32 * X];
    const int c = (blockIdx.x * 32 + threadIdx.x) * X;
    float acc[X] = {};
    if (c < OC) {
        // four rows' loads in flight per thread: one at a time leaves the memory system mostly idle
        const long stride = (long)gridDim.y * blockDim.y;
        long row = (long)blockIdx.y * blockDim.y + threadIdx.y;
        for (; row + 3 * stride < N; row += 4 * stride) {
            Packed128<floatX> v[4];
            for (int u = 0; u < 4; u++) v[u] = load128cs(dout + (row + u * stride) * ld + c);
            for (int u = 0; u < 4; u++)
                for (int i = 0; i < X; i++) acc[i] += to_float(v[u][i]);
        }
        for (; row < N; row += stride) {
            Packed128<floatX> v = load128cs(dout + row * ld + c);
            for (int i = 0; i < X; i++) acc[i] += to_float(v[i]);
        }
    }
    for (int i = 0; i < X; i++) shared[threadIdx.y][threadIdx.x * X + i] = acc[i];
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        for (int y = 1; y < kBiasRowThreads; y++)
            for (int i = 0; i < X; i++) acc[i] += shared[y][threadIdx.x * X + i];
        for (int i = 0; i < X; i++) partials[(long)blockIdx.y * OC + c + i] = acc[i];
    }
}

template <typename floatX>
void bias_backward(floatX* dbias, float* scratch, const floatX* dout, int N, int OC, cudaStream_t stream, long ld = 0) {
    constexpr int X = Packed128<floatX>::size;
    dim3 grid(ceil_div(OC, 32 * X), bias_backward_row_blocks(OC, X));
    bias_backward_kernel<<<grid, dim3(32, kBiasRowThreads), 0, stream>>>(scratch, dout, N, OC, ld > 0 ? ld : OC);
    cudaCheckLaunch();
    partials_accumulate(dbias, scratch, grid.y, OC, stream);
}

// out[K] += s weight, where s[c] is the sum of the num_partials rows (C wide) of `partials` and weight is [C, K]
// row-major: the column sums of a product's input gradient dinp = dout weight, taken from dout's column sums
// (colsum(dout weight) = colsum(dout) weight) without reading dinp. Each block owns kColsumProductRows rows of
// weight: it adds their partials in row order (partial_rows_sum), multiplies, and writes one fp32 partial row of K that
// partials_accumulate adds in block order: deterministic, no atomics. `scratch` holds
// colsum_times_weight_scratch_floats(C, K) floats.
constexpr int kColsumProductRows = 32, kColsumPartialThreads = 32;
static_assert(kColsumProductRows == 32, "partial_rows_sum takes one column per thread of a 32-wide block");
inline size_t colsum_times_weight_scratch_floats(int C, int K) { return (size_t)ceil_div(C, kColsumProductRows) * K; }

template <typename floatX>
__global__ void colsum_times_weight_kernel(float* out_partials, const float* partials, int num_partials, const floatX* weight,
                                           int C, int K) {
    __shared__ float s[kColsumProductRows];
    const int c0 = blockIdx.x * kColsumProductRows;
    const float total = partial_rows_sum<kColsumPartialThreads>(partials, num_partials, C, c0 + threadIdx.x, 0.0f);
    if (threadIdx.y == 0) s[threadIdx.x] = total;
    __syncthreads();
    const int rows = min(kColsumProductRows, C - c0);
    for (int k = threadIdx.y * kColsumProductRows + threadIdx.x; k < K; k += kColsumPartialThreads * kColsumProductRows) {
        float sum = 0.0f;
        for (int r = 0; r < rows; r++) sum += s[r] * to_float(weight[(long)(c0 + r) * K + k]);
        out_partials[(long)blockIdx.x * K + k] = sum;
    }
}

template <typename floatX>
void colsum_times_weight(floatX* out, float* scratch, const float* partials, int num_partials, const floatX* weight, int C,
                         int K, cudaStream_t stream) {
    const int blocks = ceil_div(C, kColsumProductRows);
    colsum_times_weight_kernel<<<blocks, dim3(kColsumProductRows, kColsumPartialThreads), 0, stream>>>(
        scratch, partials, num_partials, weight, C, K);
    cudaCheckLaunch();
    partials_accumulate(out, scratch, blocks, K, stream);
}

// Given dout[N,OC]: dinp[N,C] = dout weight (overwritten), dweight[OC,C] += dout^T inp,
// dbias[OC] += column sums of dout. dweight == nullptr skips the weight and bias gradients
// (frozen weights); dbias == nullptr skips the bias gradient. With gelu_inp (N,C; inp = gelu(gelu_inp)),
// dinp goes on through the GELU's backward, dinp = (dout weight) * gelu'(gelu_inp), in the product's epilogue:
// C must be a multiple of 8; the model uses it where matmul_gelu_epilogues<floatX>(). (The next bias gradient,
// column sums of this dinp, stays with bias_backward: DGELU_BGRAD would write it in floatX, cublasLt.h's bias
// gradient type, where our gradients accumulate from fp32 partials.) The row-parallel projections' bias gradients,
// the residual gradient's column sums, come from layernorm_backward (dinp_colsum) where it can: no dbias here then.
// Its two halves are also callable alone, so that a collective on dinp can run while the weight gradients compute
// (tensor parallelism): matmul_backward_input and matmul_backward_weights.
template <typename floatX>
void matmul_backward_input(floatX* dinp, const floatX* dout, const floatX* weight, int N, int C, int OC, cudaStream_t stream,
                           const floatX* gelu_inp = nullptr) {
    // the DGELU epilogue only reads aux
    matmul_cublaslt(dinp, weight, dout, (const floatX*)nullptr, C, N, OC, false, false, false, stream, 1.0f,
                    gelu_inp != nullptr ? MatmulGelu::kBackward : MatmulGelu::kNone, const_cast<floatX*>(gelu_inp));
}
template <typename floatX>
void matmul_backward_weights(floatX* dweight, floatX* dbias, float* scratch, const floatX* dout, const floatX* inp, int N,
                             int C, int OC, cudaStream_t stream) {
    if (dweight != nullptr) matmul_cublaslt(dweight, inp, dout, (const floatX*)nullptr, C, OC, N, false, true, true, stream);
    if (dbias != nullptr) bias_backward(dbias, scratch, dout, N, OC, stream);
}
template <typename floatX>
void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                     const floatX* inp, const floatX* weight, int N, int C, int OC, cudaStream_t stream,
                     const floatX* gelu_inp = nullptr) {
    matmul_backward_input(dinp, dout, weight, N, C, OC, stream, gelu_inp);
    matmul_backward_weights(dweight, dbias, scratch, dout, inp, N, C, OC, stream);
}
