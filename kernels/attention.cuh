// Causal multi-head self-attention, softmax(Q K^T / sqrt(hs)) V, as cuBLAS batched products around our
// own permute and causal-softmax kernels. The T x T probabilities of each layer are kept for the
// backward; the fused flash kernel (no T x T matrix) replaces this path in a later issue.
// defines: attention_forward, attention_backward
#pragma once
#include "common.cuh"
#include "matmul.cuh"

// qkv (B,T,3,NH,hs) -> q, k, v each (B,NH,T,hs): each head's rows become contiguous for the batched products.
template <typename floatX>
__global__ void permute_qkv_kernel(floatX* q, floatX* k, floatX* v, const floatX* qkv, int B, int T, int NH, int hs) {
    constexpr int X = Packed128<floatX>::size;
    long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;  // index into (B,NH,T,hs)
    if (idx >= (long)B * NH * T * hs) return;
    int d = idx % hs;
    int t = (idx / hs) % T;
    int h = (idx / ((long)hs * T)) % NH;
    long b = idx / ((long)hs * T * NH);
    const long C = (long)NH * hs;
    const floatX* src = qkv + (b * T + t) * 3 * C + h * hs + d;
    store128(q + idx, load128(src));
    store128(k + idx, load128(src + C));
    store128(v + idx, load128(src + 2 * C));
}

// The reverse direction for gradients: dq, dk, dv (B,NH,T,hs) -> dqkv (B,T,3,NH,hs).
template <typename floatX>
__global__ void unpermute_qkv_kernel(floatX* dqkv, const floatX* dq, const floatX* dk, const floatX* dv, int B, int T,
                                     int NH, int hs) {
    constexpr int X = Packed128<floatX>::size;
    long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;
    if (idx >= (long)B * NH * T * hs) return;
    int d = idx % hs;
    int t = (idx / hs) % T;
    int h = (idx / ((long)hs * T)) % NH;
    long b = idx / ((long)hs * T * NH);
    const long C = (long)NH * hs;
    floatX* dst = dqkv + (b * T + t) * 3 * C + h * hs + d;
    store128(dst, load128(dq + idx));
    store128(dst + C, load128(dk + idx));
    store128(dst + 2 * C, load128(dv + idx));
}

// (B,NH,T,hs) <-> (B,T,NH,hs) = (B,T,C). `forward` selects the direction.
template <typename floatX>
__global__ void permute_heads_kernel(floatX* out, const floatX* inp, int B, int T, int NH, int hs, bool heads_to_tokens) {
    constexpr int X = Packed128<floatX>::size;
    long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;  // index into (B,NH,T,hs)
    if (idx >= (long)B * NH * T * hs) return;
    int d = idx % hs;
    int t = (idx / hs) % T;
    int h = (idx / ((long)hs * T)) % NH;
    long b = idx / ((long)hs * T * NH);
    long other = ((b * T + t) * NH + h) * hs + d;
    if (heads_to_tokens) store128(out + other, load128(inp + idx));
    else store128(out + idx, load128(inp + other));
}

// One warp per query row t: probabilities over keys 0..t (the scale is already applied by the product),
// zeros after, so that the following full-size product is correct.
template <typename floatX>
__global__ void causal_softmax_forward_kernel(floatX* att, const floatX* preatt, int rows, int T) {
    const int lane = threadIdx.x % 32;
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    const int t = row % T;
    const floatX* x = preatt + row * T;
    float max_value = -INFINITY;
    for (int j = lane; j <= t; j += 32) max_value = fmaxf(max_value, to_float(x[j]));
    max_value = warp_reduce_max(max_value);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) sum += expf(to_float(x[j]) - max_value);
    const float inv_sum = 1.0f / warp_reduce_sum(sum);
    floatX* y = att + row * T;
    for (int j = lane; j < T; j += 32)
        y[j] = from_float<floatX>(j <= t ? expf(to_float(x[j]) - max_value) * inv_sum : 0.0f);
}

// In place: datt becomes d(scaled scores) = att * (datt - sum_j att_j datt_j), zero above the diagonal.
template <typename floatX>
__global__ void causal_softmax_backward_kernel(floatX* datt, const floatX* att, int rows, int T) {
    const int lane = threadIdx.x % 32;
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    const int t = row % T;
    const floatX* p = att + row * T;
    floatX* g = datt + row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += to_float(p[j]) * to_float(g[j]);
    dot = warp_reduce_sum(dot);
    for (int j = lane; j < T; j += 32)
        g[j] = from_float<floatX>(j <= t ? to_float(p[j]) * (to_float(g[j]) - dot) : 0.0f);
}

// Column-major strided-batched product, one batch entry per (b, head).
template <typename floatX>
void batched_matmul(floatX* d, const floatX* a, const floatX* b, int m, int n, int k, bool trans_a, bool trans_b,
                    long stride_a, long stride_b, long stride_d, int batch, float alpha, cudaStream_t stream) {
    MatmulContext& ctx = matmul_context();
    const cudaDataType_t type = cuda_data_type<floatX>();
    const float beta = 0.0f;
    cublasCheck(cublasSetStream(ctx.blas, stream));
    cublasCheck(cublasGemmStridedBatchedEx(ctx.blas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, type,
                                           trans_a ? k : m, stride_a, b, type, trans_b ? n : k, stride_b, &beta, d,
                                           type, m, stride_d, batch, matmul_compute_type<floatX>(),
                                           CUBLAS_GEMM_DEFAULT));
}

// out (B,T,C) from qkv (B,T,3C). Keeps att (B,NH,T,T) for the backward.
// Scratch: qkvr 3*B*T*C (q, k, v permuted), preatt B*NH*T*T, vaccum B*T*C.
template <typename floatX>
void attention_forward(floatX* out, floatX* att, floatX* qkvr, floatX* preatt, floatX* vaccum, const floatX* qkv,
                       int B, int T, int C, int NH, cudaStream_t stream) {
    constexpr int X = Packed128<floatX>::size;
    const int hs = C / NH;
    const long n = (long)B * T * C;
    floatX *q = qkvr, *k = qkvr + n, *v = qkvr + 2 * n;
    permute_qkv_kernel<<<ceil_div(n / X, 256), 256, 0, stream>>>(q, k, v, qkv, B, T, NH, hs);
    cudaCheckLaunch();
    const float scale = 1.0f / sqrtf((float)hs);
    const long tt = (long)T * T, ths = (long)T * hs;
    // preatt (row-major Tq x Tk) = scale * q k^T  <=> column-major (Tk x Tq) = k^T(cm) q(cm)
    batched_matmul(preatt, k, q, T, T, hs, true, false, ths, ths, tt, B * NH, scale, stream);
    const int rows = B * NH * T;
    causal_softmax_forward_kernel<<<ceil_div(rows, 8), 256, 0, stream>>>(att, preatt, rows, T);
    cudaCheckLaunch();
    // vaccum (Tq x hs) = att v  <=> column-major (hs x Tq) = v(cm) att(cm)
    batched_matmul(vaccum, v, att, hs, T, T, false, false, ths, tt, ths, B * NH, 1.0f, stream);
    permute_heads_kernel<<<ceil_div(n / X, 256), 256, 0, stream>>>(out, vaccum, B, T, NH, hs, true);
    cudaCheckLaunch();
}

// dqkv (B,T,3C) from dout (B,T,C) (overwritten, not accumulated).
// Scratch: qkvr 3*B*T*C (recomputed q, k, v), dqkvr 3*B*T*C, datt B*NH*T*T, dvaccum B*T*C.
template <typename floatX>
void attention_backward(floatX* dqkv, floatX* qkvr, floatX* dqkvr, floatX* datt, floatX* dvaccum, const floatX* dout,
                        const floatX* qkv, const floatX* att, int B, int T, int C, int NH, cudaStream_t stream) {
    constexpr int X = Packed128<floatX>::size;
    const int hs = C / NH;
    const long n = (long)B * T * C;
    floatX *q = qkvr, *k = qkvr + n, *v = qkvr + 2 * n;
    floatX *dq = dqkvr, *dk = dqkvr + n, *dv = dqkvr + 2 * n;
    permute_qkv_kernel<<<ceil_div(n / X, 256), 256, 0, stream>>>(q, k, v, qkv, B, T, NH, hs);
    cudaCheckLaunch();
    permute_heads_kernel<<<ceil_div(n / X, 256), 256, 0, stream>>>(dvaccum, dout, B, T, NH, hs, false);
    cudaCheckLaunch();
    const float scale = 1.0f / sqrtf((float)hs);
    const long tt = (long)T * T, ths = (long)T * hs;
    // datt (Tq x Tk) = dvaccum v^T  <=> column-major (Tk x Tq) = v^T(cm) dvaccum(cm)
    batched_matmul(datt, v, dvaccum, T, T, hs, true, false, ths, ths, tt, B * NH, 1.0f, stream);
    // dv (Tk x hs) = att^T dvaccum  <=> column-major (hs x Tk) = dvaccum(cm) att(cm)^T
    batched_matmul(dv, dvaccum, att, hs, T, T, false, true, ths, tt, ths, B * NH, 1.0f, stream);
    const int rows = B * NH * T;
    causal_softmax_backward_kernel<<<ceil_div(rows, 8), 256, 0, stream>>>(datt, att, rows, T);
    cudaCheckLaunch();
    // dq (Tq x hs) = scale * dscores k  <=> column-major (hs x Tq) = k(cm) dscores(cm)
    batched_matmul(dq, k, datt, hs, T, T, false, false, ths, tt, ths, B * NH, scale, stream);
    // dk (Tk x hs) = scale * dscores^T q  <=> column-major (hs x Tk) = q(cm) dscores(cm)^T
    batched_matmul(dk, q, datt, hs, T, T, false, true, ths, tt, ths, B * NH, scale, stream);
    unpermute_qkv_kernel<<<ceil_div(n / X, 256), 256, 0, stream>>>(dqkv, dq, dk, dv, B, T, NH, hs);
    cudaCheckLaunch();
}
