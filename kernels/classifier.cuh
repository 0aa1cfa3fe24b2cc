// LM-head softmax fused with cross-entropy. Per row: the loss, and (optionally) the logits gradient
// written in place over the logits, so the full-vocabulary probabilities are never stored. fused_classifier
// reads each row from memory once where two rows fit in a block's shared memory on sm_90 (bf16 and fp16 rows of
// GPT-2's 50304 columns on an H100/H200), else twice (fp32 GPT-2 rows; code for GPUs before sm_90).
// defines: fused_classifier (and fused_classifier_is_single_pass: which of its two kernels runs),
// vocab_parallel_stats / vocab_parallel_rescale / vocab_parallel_loss (the same over tensor-parallel ranks'
// vocabulary ranges), accumulate_losses, kIgnoredTarget
// A row whose target is kIgnoredTarget (-1: a target that does not count, dataloader.h's masks) gets a loss of 0 and,
// with dloss != 0, a zero gradient row.
#pragma once
#include <cfloat>
#include "common.cuh"

constexpr int kIgnoredTarget = -1;

// Online softmax statistics: running max and sum of exp(x - max).
struct SoftmaxStats {
    float max_value, sum;
};
__device__ __forceinline__ SoftmaxStats combine(SoftmaxStats a, SoftmaxStats b) {
    float m = fmaxf(a.max_value, b.max_value);
    return {m, a.sum * expf(a.max_value - m) + b.sum * expf(b.max_value - m)};
}

// This thread's share of the online softmax statistics of a row's first n columns x[0, n): its 16-byte vectors
// threadIdx.x, + blockDim.x, ... The row is 16-byte aligned and readable up to n rounded up to a whole vector.
// Per vector: its maximum, then one rescale of the running sum and one exponential per element (combining element
// by element took two accurate expf each and made the classifier compute-bound).
// __expf (relative error ~1e-6 for the arguments here, all <= 0) is well inside the fp32 tests' 1e-5.
template <typename floatX>
__device__ __forceinline__ SoftmaxStats thread_softmax_stats(const floatX* x, int n) {
    constexpr int X = Packed128<floatX>::size;
    SoftmaxStats stats = {-FLT_MAX, 0.0f};  // -FLT_MAX, not -inf: combining two empty stats stays finite
    for (int j = threadIdx.x * X; j < n; j += blockDim.x * X) {
        Packed128<floatX> v = load128(x + j);
        float vector_max = -FLT_MAX;
        for (int i = 0; i < X && j + i < n; i++) vector_max = fmaxf(vector_max, to_float(v[i]));
        const float m = fmaxf(stats.max_value, vector_max);
        float sum = stats.sum * __expf(stats.max_value - m);
        for (int i = 0; i < X && j + i < n; i++) sum += __expf(to_float(v[i]) - m);
        stats = {m, sum};
    }
    return stats;
}

// The block's statistics from its threads', combined in a fixed order (deterministic), returned to every thread.
// An empty row (no thread saw a column) gives {-FLT_MAX, 0}. `shared_max` and `shared_sum` hold 32 floats each.
__device__ __forceinline__ SoftmaxStats block_softmax_stats(SoftmaxStats stats, float* shared_max, float* shared_sum) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    for (int offset = 16; offset > 0; offset >>= 1) {
        SoftmaxStats other = {__shfl_xor_sync(0xffffffff, stats.max_value, offset),
                              __shfl_xor_sync(0xffffffff, stats.sum, offset)};
        stats = combine(stats, other);
    }
    if (lane == 0) { shared_max[warp] = stats.max_value; shared_sum[warp] = stats.sum; }
    __syncthreads();
    stats = {-FLT_MAX, 0.0f};
    for (int w = 0; w < num_warps; w++) stats = combine(stats, {shared_max[w], shared_sum[w]});
    return stats;
}

// Overwrites the row x[0, n) (n a multiple of the vector size) with zeros: an ignored target's gradient.
template <typename floatX>
__device__ __forceinline__ void write_zero_gradient(floatX* x, int n) {
    constexpr int X = Packed128<floatX>::size;
    Packed128<floatX> zero;
    for (int i = 0; i < X; i++) zero[i] = from_float<floatX>(0.0f);
    for (int j = threadIdx.x * X; j < n; j += blockDim.x * X) store128cs(x + j, zero);
}

// Overwrites the row x[0, n) (n a multiple of the vector size) with the logits gradient:
// (exp(x_j - max_value) * inv_sum - [j == target]) * dloss for the real columns j < real, 0 for the rest (padding).
template <typename floatX>
__device__ __forceinline__ void write_softmax_gradient(floatX* x, int n, int real, int target, float max_value,
                                                       float inv_sum, float dloss) {
    constexpr int X = Packed128<floatX>::size;
    for (int j = threadIdx.x * X; j < n; j += blockDim.x * X) {
        Packed128<floatX> v = load128(x + j);
        for (int i = 0; i < X; i++) {
            const int col = j + i;
            float grad = 0.0f;
            if (col < real) {
                const float p = __expf(to_float(v[i]) - max_value) * inv_sum;
                grad = (p - (col == target ? 1.0f : 0.0f)) * dloss;
            }
            v[i] = from_float<floatX>(grad);
        }
        store128cs(x + j, v);  // streamed: the LM-head backward reads it next, far beyond what L2 holds
    }
}

// Two-pass kernel, the fallback where fused_classifier_single_pass_kernel cannot run: one block per row of logits
// (stride Vp, the first V columns real). losses[row] = logsumexp - logit[target].
// The row (100 KB in bf16) is read twice, and both reads reach memory: the profile of a d12 step shows 3x the
// logits' bytes moved.
// When dloss != 0: logits[row, j] = (softmax_j - [j == target]) * dloss for j < V, and 0 for padded columns.
// 256 threads a row: measured on an H200 (bf16, 65536 x 50304), 5.0 ms against 6.7 ms with 1024 threads and 5.4
// with 512 -- more, smaller blocks per SM overlap one row's reduction with other rows' loads. Fewer blocks per SM,
// so that the second read would hit L2, were slower (5 blocks 6.1 ms, 2 blocks 9.9).
constexpr int kClassifierThreads = 256;
template <typename floatX>
__global__ void fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    __shared__ float shared_max[32], shared_sum[32];
    const long row = blockIdx.x;
    floatX* x = logits + row * Vp;
    const int target = targets[row];
    if (target == kIgnoredTarget) {  // the whole block returns: no barrier below is left waiting
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if (dloss != 0.0f) write_zero_gradient(x, Vp);
        return;
    }
    const SoftmaxStats stats = block_softmax_stats(thread_softmax_stats(x, V), shared_max, shared_sum);
    const float log_sum = logf(stats.sum);
    if (threadIdx.x == 0) losses[row] = log_sum + stats.max_value - to_float(x[target]);
    if (dloss == 0.0f) return;
    __syncthreads();  // every thread has read x[target] before it is overwritten
    write_softmax_gradient(x, Vp, V, target, stats.max_value, 1.0f / stats.sum, dloss);
}

// Single-pass kernel: the same losses and gradient as fused_classifier_kernel, each row read from memory once
// (13.2 GB moved at GPT-2 124M B=64 instead of 19.7). Holding a row in registers instead (2 blocks of 256 threads
// per SM) measured 8.9 ms against the two-pass 5.1 on an H200: with 2 rows per SM, loads and compute did not
// overlap. Here a persistent CTA per SM takes rows blockIdx.x, + gridDim.x, ... through two shared-memory row
// buffers: thread 0 bulk-copies the next row into one buffer (mbarrier with expect_tx) while the block computes
// the current row from the other.
// Per row, each thread takes the 16-byte vectors threadIdx.x, + blockDim.x, ... of the padded row (the same in
// every pass): its exact max m_t over its real columns, then e = exp(x - m_t) summed in fp32 and written back in
// place into the buffer as floatX (0 for padded columns), so the gradient needs no second exponential. In bf16
// that rounds e once more (relative error up to 2^-8) before the final multiply, within test_kernels' bf16
// tolerance of 1e-2 relative L2 (fp16: 2^-11 against 2e-3; fp32 keeps e exact). The row max and sum come from
// fixed-order block reductions (deterministic): max first, then the threads' sums rescaled by exp(m_t - max), a
// shorter dependency chain than block_softmax_stats' serial combines. The target's owner writes the loss; with
// dloss != 0 the gradient e * exp(m_t - max) / sum * dloss (- dloss at the target) goes to the logits row with
// streaming stores. Only that pass writes the logits, so dloss == 0 leaves them untouched.
// Buffer reuse: at the end of each row every thread fences its shared-memory accesses against the async proxy
// and the block syncs; only then does thread 0 issue the copy that refills the buffer just used (the row after
// next). Reads of a row wait on its buffer's mbarrier, parity (row iteration / 2) % 2.
constexpr int kClassifierSinglePassThreads = 512;
template <typename floatX>
__global__ void __launch_bounds__(kClassifierSinglePassThreads, 1)
fused_classifier_single_pass_kernel(floatX* logits, float* losses, const int* targets, float dloss, int N, int V,
                                    int Vp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int X = Packed128<floatX>::size;
    extern __shared__ __align__(16) unsigned char classifier_rows[];  // two buffers of Vp floatX
    __shared__ uint64_t full[2];                                       // an mbarrier per buffer
    __shared__ float shared[32];
    const uint32_t row_bytes = Vp * sizeof(floatX);
    const uint32_t rows_base = (uint32_t)__cvta_generic_to_shared(classifier_rows);
    const uint32_t full_base = (uint32_t)__cvta_generic_to_shared(full);
    const int num_vectors = Vp / X, full_vectors = V / X;
    // row r into buffer b, completing its mbarrier's phase (one arrival: the expect_tx, plus the copy's bytes)
    auto load_row = [&](long r, int b) {
        mbar_arrive_expect_tx(full_base + 8 * b, row_bytes);
        bulk_load(rows_base + b * row_bytes, logits + r * Vp, row_bytes, full_base + 8 * b);
    };
    if (threadIdx.x == 0) {
        mbar_init(full_base, 1);
        mbar_init(full_base + 8, 1);
        fence_mbarrier_init();
        load_row(blockIdx.x, 0);
    }
    __syncthreads();  // the mbarriers are initialised before anyone waits on them
    int it = 0;       // rows done by this CTA: row `it` uses buffer it % 2
    for (long row = blockIdx.x; row < N; row += gridDim.x, it++) {
        const int b = it & 1;
        if (threadIdx.x == 0 && row + gridDim.x < N) load_row(row + gridDim.x, b ^ 1);
        floatX* x = reinterpret_cast<floatX*>(classifier_rows + b * row_bytes);
        const int target = targets[row];
        mbar_wait(full_base + 8 * b, (it >> 1) & 1);  // also for an ignored row: its buffer's phase must complete
        if (target == kIgnoredTarget) {
            if (threadIdx.x == 0) losses[row] = 0.0f;
            if (dloss != 0.0f) write_zero_gradient(logits + row * Vp, Vp);
            fence_proxy_async_shared();
            __syncthreads();
            continue;
        }
        const bool owns_target = (target / X) % blockDim.x == threadIdx.x;

        // Vectors below full_vectors hold only real columns; the rest (one partly real, then padding) are masked.
        // The lambdas are inlined with `masked` a constant, so the full vectors pay no per-column test.
        float thread_max = -FLT_MAX;  // stays so for a thread without real columns
        auto vector_max = [&](int v, bool masked) {
            const Packed128<floatX> p = load128(x + v * X);
            for (int i = 0; i < X; i++)
                if (!masked || v * X + i < V) thread_max = fmaxf(thread_max, to_float(p[i]));
        };
        int v = threadIdx.x;
        for (; v < full_vectors; v += blockDim.x) vector_max(v, false);
        for (; v < num_vectors; v += blockDim.x) vector_max(v, true);
        const float x_target = owns_target ? to_float(x[target]) : 0.0f;  // before this thread overwrites it
        const float max_log2 = thread_max * kLog2e;
        float thread_sum = 0.0f;
        auto vector_exp = [&](int v, bool masked) {
            Packed128<floatX> p = load128(x + v * X);
            for (int i = 0; i < X; i++) {
                const bool real = !masked || v * X + i < V;
                const float e = real ? fast_exp2(fmaf(to_float(p[i]), kLog2e, -max_log2)) : 0.0f;
                thread_sum += e;
                p[i] = from_float<floatX>(e);
            }
            store128(x + v * X, p);
        };
        for (v = threadIdx.x; v < full_vectors; v += blockDim.x) vector_exp(v, false);
        for (; v < num_vectors; v += blockDim.x) vector_exp(v, true);
        const float row_max = block_reduce_max(thread_max, shared);
        const float rescale = expf(thread_max - row_max);  // 0 for a thread without real columns
        const float row_sum = block_reduce_sum(thread_sum * rescale, shared);
        if (owns_target) losses[row] = logf(row_sum) + row_max - x_target;

        if (dloss != 0.0f) {
            const float scale = rescale * (dloss / row_sum);
            floatX* out = logits + row * Vp;
            for (v = threadIdx.x; v < num_vectors; v += blockDim.x) {
                Packed128<floatX> p = load128(x + v * X);
                for (int i = 0; i < X; i++) p[i] = from_float<floatX>(to_float(p[i]) * scale);
                store128cs(out + v * X, p);  // streamed, as in write_softmax_gradient
            }
            // the target's column, - dloss, over the store of its vector (the same thread's: ordered after it)
            if (owns_target) out[target] = from_float<floatX>(to_float(x[target]) * scale - dloss);
        }
        fence_proxy_async_shared();
        __syncthreads();  // buffer b is refilled (next iteration's load_row) only after every thread is done with it
    }
#endif
}

// Whether fused_classifier takes the single-pass kernel for rows of Vp columns on the current device: the code
// loaded for the device was compiled for sm_90 or later (bulk copies), and two rows fit in the opt-in shared
// memory of a block (227 KB on an H100/H200: bf16 and fp16 rows of 50304 columns do, fp32 ones do not). Asked once
// per floatX, for the device current then (one device per process, as device_sm_count).
template <typename floatX>
bool fused_classifier_is_single_pass(int Vp) {
    static const size_t max_dynamic = [] {
        auto kernel = fused_classifier_single_pass_kernel<floatX>;
        cudaFuncAttributes attributes;
        cudaCheck(cudaFuncGetAttributes(&attributes, kernel));
        if (attributes.ptxVersion < 90) return (size_t)0;
        int device = 0, optin = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        const size_t dynamic = optin - attributes.sharedSizeBytes;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dynamic));
        return dynamic;
    }();
    return 2 * (size_t)Vp * sizeof(floatX) <= max_dynamic;
}

// logits (N, Vp), 16-byte aligned; losses (N) fp32; targets (N), each below V or kIgnoredTarget.
// dloss = d(total loss)/d(row loss), e.g. loss_scale / (B*T*grad_accum_steps), or loss_scale over the counted targets
// with masks; pass 0 for a forward-only evaluation (logits are kept).
template <typename floatX>
void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                      cudaStream_t stream) {
    if (Vp % Packed128<floatX>::size != 0) {
        die("padded vocabulary " + std::to_string(Vp) + " must be a multiple of " + std::to_string(Packed128<floatX>::size));
    }
    if (fused_classifier_is_single_pass<floatX>(Vp)) {
        fused_classifier_single_pass_kernel<<<std::min(N, device_sm_count()), kClassifierSinglePassThreads,
                                              2 * (size_t)Vp * sizeof(floatX), stream>>>(logits, losses, targets,
                                                                                         dloss, N, V, Vp);
    } else {
        fused_classifier_kernel<<<N, kClassifierThreads, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    }
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel cross-entropy (Megatron-style tensor parallelism): rank r holds the logits columns
// [vocab_begin, vocab_begin + Vl) of the padded vocabulary (row stride Vl; real columns are those below V, so the
// last ranks may hold fewer, or none). The logits are never gathered; per row, only the softmax statistics cross
// ranks, in three kernels with the caller's collectives between them:
//   vocab_parallel_stats    stats = this rank's {max m_r, sum_r exp(x - m_r), target logit or 0}
//   (caller)                global_max = stats[0, N) all-reduced with ncclMax
//   vocab_parallel_rescale  stats[N, 2N) *= exp(m_r - global_max): each rank's sum relative to the global max
//   (caller)                stats[N, 3N) all-reduced with ncclSum (the target logit is nonzero on one rank only)
//   vocab_parallel_loss     the loss (the same on every rank) and this rank's columns of the logits gradient
// stats: 3N floats, [0, N) row max, [N, 2N) row sum of exp, [2N, 3N) target logit.

// The real columns of a rank's range: those below V.
__device__ __forceinline__ int vocab_parallel_real_columns(int vocab_begin, int Vl, int V) {
    return min(max(V - vocab_begin, 0), Vl);
}

// Pass 1: one block per row. A rank with no real column gives {-FLT_MAX, 0} (block_softmax_stats' empty row),
// which the rescale turns into a sum of 0.
template <typename floatX>
__global__ void vocab_parallel_stats_kernel(const floatX* logits, float* stats, const int* targets, int N,
                                            int vocab_begin, int Vl, int V) {
    __shared__ float shared_max[32], shared_sum[32];
    const long row = blockIdx.x;
    const floatX* x = logits + row * Vl;
    const SoftmaxStats s = block_softmax_stats(thread_softmax_stats(x, vocab_parallel_real_columns(vocab_begin, Vl, V)),
                                               shared_max, shared_sum);
    if (threadIdx.x != 0) return;
    const int target = targets[row] - vocab_begin;  // local column
    stats[row] = s.max_value;
    stats[N + row] = s.sum;
    stats[2L * N + row] = target >= 0 && target < Vl ? to_float(x[target]) : 0.0f;
}

// Pass 2. stats[i] <= global_max[i], so the factor is at most 1; an empty row's -FLT_MAX gives exp(-huge) = 0,
// and its sum stays 0.
__global__ void vocab_parallel_rescale_kernel(float* stats, const float* global_max, int N) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) stats[N + i] *= expf(stats[i] - global_max[i]);
}

// Pass 3's loss of row i from the reduced statistics: logsumexp - target logit, as fused_classifier_kernel (0 for an
// ignored target).
__device__ __forceinline__ float vocab_parallel_row_loss(const float* stats, const float* global_max, const int* targets,
                                                         long i, int N) {
    if (targets[i] == kIgnoredTarget) return 0.0f;
    return logf(stats[N + i]) + global_max[i] - stats[2L * N + i];
}

// Pass 3 with the gradient: one block per row, the loss from thread 0 and the gradient over this rank's Vl columns
// (the target's local column, if it is this rank's, gets the -1). The target logit comes from the reduced
// statistics, so unlike fused_classifier_kernel no thread reads a logit that another overwrites: no barrier.
template <typename floatX>
__global__ void vocab_parallel_loss_kernel(floatX* logits, float* losses, const int* targets, const float* stats,
                                           const float* global_max, float dloss, int N, int vocab_begin, int Vl,
                                           int V) {
    const long row = blockIdx.x;
    if (threadIdx.x == 0) losses[row] = vocab_parallel_row_loss(stats, global_max, targets, row, N);
    if (targets[row] == kIgnoredTarget) return write_zero_gradient(logits + row * Vl, Vl);
    write_softmax_gradient(logits + row * Vl, Vl, vocab_parallel_real_columns(vocab_begin, Vl, V),
                           targets[row] - vocab_begin, global_max[row], 1.0f / stats[N + row], dloss);
}

// Pass 3 without the gradient (dloss == 0, an evaluation): the losses alone, one thread a row.
__global__ void vocab_parallel_losses_kernel(float* losses, const float* stats, const float* global_max, const int* targets,
                                             int N) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) losses[i] = vocab_parallel_row_loss(stats, global_max, targets, i, N);
}

inline void check_vocab_parallel_columns(int Vl, int size) {
    if (Vl % size != 0) {
        die("vocabulary columns per tensor-parallel rank " + std::to_string(Vl) + " must be a multiple of " + std::to_string(size));
    }
}

// logits (N, Vl): this rank's columns [vocab_begin, vocab_begin + Vl); targets (N) global token ids below V;
// stats (3N) as above.
// 128 threads a row, where the gradient pass keeps fused_classifier's 256: a read-only pass over a short row is
// bound by each block's closing reduction. Measured on an H200 (bf16, 65536 rows, the last rank's range):
// 0.36 ms against 0.49 with 256 threads at tp 8 (Vl 6288), 0.63 against 0.76 at tp 4, 2.26 against 2.39 at tp 1.
constexpr int kVocabParallelStatsThreads = 128;
template <typename floatX>
void vocab_parallel_stats(const floatX* logits, float* stats, const int* targets, int N, int vocab_begin, int Vl,
                          int V, cudaStream_t stream) {
    check_vocab_parallel_columns(Vl, Packed128<floatX>::size);
    vocab_parallel_stats_kernel<<<N, kVocabParallelStatsThreads, 0, stream>>>(logits, stats, targets, N, vocab_begin,
                                                                               Vl, V);
    cudaCheckLaunch();
}

// global_max (N): stats[0, N) after the all-reduce with ncclMax.
inline void vocab_parallel_rescale(float* stats, const float* global_max, int N, cudaStream_t stream) {
    vocab_parallel_rescale_kernel<<<ceil_div(N, 256), 256, 0, stream>>>(stats, global_max, N);
    cudaCheckLaunch();
}

// stats[N, 3N) all-reduced with ncclSum; global_max as for vocab_parallel_rescale. losses (N) fp32. dloss as for
// fused_classifier: != 0 writes the gradient of this rank's columns in place over `logits` (0 for padded columns,
// those at or above V); 0 keeps the logits.
template <typename floatX>
void vocab_parallel_loss(floatX* logits, float* losses, const int* targets, const float* stats, const float* global_max,
                         float dloss, int N, int vocab_begin, int Vl, int V, cudaStream_t stream) {
    check_vocab_parallel_columns(Vl, Packed128<floatX>::size);
    if (dloss == 0.0f) {
        vocab_parallel_losses_kernel<<<ceil_div(N, 256), 256, 0, stream>>>(losses, stats, global_max, targets, N);
    } else {
        vocab_parallel_loss_kernel<<<N, kClassifierThreads, 0, stream>>>(logits, losses, targets, stats, global_max,
                                                                          dloss, N, vocab_begin, Vl, V);
    }
    cudaCheckLaunch();
}

// sums[i] += losses[i]: per-row losses summed over micro-steps on the device, so the host reads them once
// per step instead of synchronising after every micro-batch.
__global__ void accumulate_losses_kernel(float* sums, const float* losses, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) sums[i] += losses[i];
}
inline void accumulate_losses(float* sums, const float* losses, int n, cudaStream_t stream) {
    accumulate_losses_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(sums, losses, n);
    cudaCheckLaunch();
}
