// Attention for sampling with a KV cache: the queries of a few new positions of one sequence against the keys and
// values of every position so far, read from the qkv buffer where the forward left them (the cache is each block's
// qkv activation: position p's keys and values stay at its row p, one per kv head, which the query heads of its
// group share). The prompt itself goes through the training forward (flash_attention.cuh) once; each later token is
// one row (a few, padded, under sequence parallelism).
// The work per token is small (one query row per head against at most T keys) and bound by the latency of its
// loads: one block per (query, head) of 256 threads, a thread per key for the scores and a group of threads per
// position for the weighted values, each reading 16 bytes at a time so that many loads are in flight; fp32 softmax
// and sums in a fixed order, so the result does not depend on timing.
// defines: attention_decode
#pragma once
#include "common.cuh"

constexpr int kDecodeThreads = 256;

// out (rows, NH * hs): for row r, the query at position pos + r of qkv (Tmax, NH + 2 * KVH, hs) (each row
// [q: NH heads | k: KVH heads | v: KVH heads], flash_attention.cuh's layout: query head h reads kv head
// h / (NH / KVH)), against keys and values 0..pos + r (causal). One block per (query head, row); the scores live in
// dynamic shared memory.
template <typename floatX>
__global__ void __launch_bounds__(kDecodeThreads)
attention_decode_kernel(floatX* out, const floatX* qkv, int pos, int NH, int KVH, int hs, float scale) {
    using Vec = Packed128<floatX>;
    constexpr int V = Vec::size;
    extern __shared__ float shared[];
    float* q = shared;                          // hs: the query, times the scale
    float* partial = q + hs;                    // kDecodeThreads: the block's reductions
    float* sums = partial + kDecodeThreads;     // kDecodeThreads * V: each group's weighted values
    float* scores = sums + kDecodeThreads * V;  // n
    const int h = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
    const int n = pos + r + 1;      // the keys this query sees
    const long row = (long)(NH + 2 * KVH) * hs;  // one position's q, k and v
    const floatX* keys = qkv + (long)(NH + h / (NH / KVH)) * hs;
    const floatX* values = keys + (long)KVH * hs;
    for (int d = tid; d < hs; d += kDecodeThreads) q[d] = to_float(qkv[(long)(pos + r) * row + (long)h * hs + d]) * scale;
    __syncthreads();
    float local_max = -INFINITY;
    for (int i = tid; i < n; i += kDecodeThreads) {
        const floatX* key = keys + (long)i * row;
        float s = 0.0f;
#pragma unroll 4
        for (int d = 0; d < hs; d += V) {
            const Vec k = load128(key + d);
            for (int j = 0; j < V; j++) s += q[d + j] * to_float(k[j]);
        }
        scores[i] = s;
        local_max = fmaxf(local_max, s);
    }
    // block maximum, then the exponentials and their sum
    partial[tid] = local_max;
    __syncthreads();
    for (int stride = kDecodeThreads / 2; stride > 0; stride /= 2) {
        if (tid < stride) partial[tid] = fmaxf(partial[tid], partial[tid + stride]);
        __syncthreads();
    }
    const float max_score = partial[0];
    __syncthreads();
    float local_sum = 0.0f;
    for (int i = tid; i < n; i += kDecodeThreads) {
        scores[i] = expf(scores[i] - max_score);
        local_sum += scores[i];
    }
    partial[tid] = local_sum;
    __syncthreads();
    for (int stride = kDecodeThreads / 2; stride > 0; stride /= 2) {
        if (tid < stride) partial[tid] += partial[tid + stride];
        __syncthreads();
    }
    const float inv_sum = 1.0f / partial[0];
    // hs / V threads cover one position's values, V each; group g sums positions g, g + groups, ...
    const int lanes = hs / V, groups = kDecodeThreads / lanes, g = tid / lanes, c = (tid % lanes) * V;
    if (g < groups) {
        float acc[V] = {};
#pragma unroll 4
        for (int i = g; i < n; i += groups) {
            const Vec v = load128(values + (long)i * row + c);
            const float w = scores[i];
            for (int j = 0; j < V; j++) acc[j] += w * to_float(v[j]);
        }
        for (int j = 0; j < V; j++) sums[g * hs + c + j] = acc[j];
    }
    __syncthreads();
    for (int d = tid; d < hs; d += kDecodeThreads) {
        float total = 0.0f;
        for (int k = 0; k < groups; k++) total += sums[k * hs + d];
        out[(long)r * NH * hs + (long)h * hs + d] = from_float<floatX>(total * inv_sum);
    }
}

template <typename floatX>
void attention_decode(floatX* out, const floatX* qkv, int pos, int rows, int NH, int KVH, int hs, cudaStream_t stream) {
    constexpr int V = Packed128<floatX>::size;
    if (KVH < 1 || NH % KVH != 0)
        die("attention_decode: " + std::to_string(NH) + " query heads cannot share " + std::to_string(KVH) + " kv heads in equal groups");
    if (hs % V != 0 || hs / V > kDecodeThreads)
        die("attention_decode: head size " + std::to_string(hs) + " must be a multiple of " + std::to_string(V) + " and at most " + std::to_string(kDecodeThreads * V));
    const size_t smem = (hs + kDecodeThreads + (size_t)kDecodeThreads * V + (size_t)(pos + rows)) * sizeof(float);
    auto kernel = attention_decode_kernel<floatX>;
    if (smem > 48 * 1024) cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<dim3(NH, rows), kDecodeThreads, smem, stream>>>(out, qkv, pos, NH, KVH, hs, 1.0f / sqrtf((float)hs));
    cudaCheckLaunch();
}
