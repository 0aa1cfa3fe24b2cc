// Token + position embedding: forward (gather and add) and a deterministic backward, of the whole table or of one
// tensor-parallel rank's vocabulary range.
// defines: encoder_forward, encoder_backward, encoder_buckets (host-side grouping of positions by token)
#pragma once
#include <climits>
#include <vector>
#include "common.cuh"

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
// Vocabulary range (tensor parallelism): `wte` is one rank's slice of the table, tokens
// [vocab_begin, vocab_begin + vocab_count) (its row 0 is token vocab_begin), and a token outside it contributes 0:
// the rank holding it adds its row, and the ranks' outputs are summed. wpe null: no position term (one rank adds it).
template <typename floatX>
__global__ void encoder_forward_kernel(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe,
                                       int B, int T, int C, int vocab_begin, int vocab_count) {
    constexpr int X = Packed128<floatX>::size;
    long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;
    if (idx >= (long)B * T * C) return;
    long bt = idx / C;
    int t = bt % T, c = idx % C;
    // one unsigned compare tests both ends of the range (a token below vocab_begin wraps to a huge row)
    const unsigned row = (unsigned)(tokens[bt] - vocab_begin);
    Packed128<floatX> e = row < (unsigned)vocab_count ? load128(wte + (long)row * C + c) : Packed128<floatX>::zeros();
    Packed128<floatX> p = wpe != nullptr ? load128(wpe + (long)t * C + c) : Packed128<floatX>::zeros();
    Packed128<floatX> o;
    for (int i = 0; i < X; i++) o[i] = from_float<floatX>(to_float(e[i]) + to_float(p[i]));
    store128(out + idx, o);
}

// The defaults take the whole table (every token in range).
template <typename floatX>
void encoder_forward(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe, int B, int T, int C,
                     cudaStream_t stream, int vocab_begin = 0, int vocab_count = INT_MAX) {
    const int block = 256;
    const long n = (long)B * T * C / Packed128<floatX>::size;
    encoder_forward_kernel<<<ceil_div(n, block), block, 0, stream>>>(out, tokens, wte, wpe, B, T, C, vocab_begin,
                                                                     vocab_count);
    cudaCheckLaunch();
}

// The backward scatter-adds each position's gradient into its token's row of dwte. Atomics would make
// the sum order (and so the bits) vary between runs; instead the host groups the positions by token and
// one thread sums each group in position order. The grouping is a counting sort, O(n + vocab_size).
// Writes `out` = tokens[U] | starts[U+1] | positions[n] (group g covers positions[starts[g] .. starts[g+1]))
// and returns U, the number of distinct tokens. `counts` is scratch.
inline int encoder_buckets(const int* inputs, int n, int vocab_size, int* out, std::vector<int>& counts) {
    counts.assign(vocab_size, 0);
    for (int i = 0; i < n; i++) counts[inputs[i]]++;
    int num_buckets = 0;
    for (int v = 0; v < vocab_size; v++) num_buckets += counts[v] > 0;
    int* tokens = out;
    int* starts = out + num_buckets;
    int* positions = starts + num_buckets + 1;
    int bucket = 0, offset = 0;
    for (int v = 0; v < vocab_size; v++) {
        if (counts[v] == 0) continue;
        tokens[bucket] = v;
        starts[bucket++] = offset;
        const int count = counts[v];
        counts[v] = offset;  // from here on: the next free slot of token v's group
        offset += count;
    }
    starts[num_buckets] = n;
    for (int i = 0; i < n; i++) positions[counts[inputs[i]]++] = i;
    return num_buckets;
}

// `dwte` is the slice of tokens [vocab_begin, vocab_begin + vocab_count) (see encoder_forward_kernel); the buckets are
// of all tokens, and the blocks of the others exit after reading their token. (The buckets are in token order, so a
// rank's are contiguous, but only the host's copy could name them without a search.)
template <typename floatX>
__global__ void encoder_backward_wte_kernel(floatX* dwte, const floatX* dout, const int* bucket_tokens,
                                            const int* bucket_starts, const int* positions, int C, int vocab_begin,
                                            int vocab_count) {
    constexpr int X = Packed128<floatX>::size;
    const int bucket = blockIdx.x;
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * X;
    const unsigned token_row = (unsigned)(bucket_tokens[bucket] - vocab_begin);  // as in encoder_forward_kernel
    if (c >= C || token_row >= (unsigned)vocab_count) return;
    float acc[X];
    floatX* row = dwte + (long)token_row * C + c;
    Packed128<floatX> current = load128(row);
    for (int i = 0; i < X; i++) acc[i] = to_float(current[i]);
    for (int p = bucket_starts[bucket]; p < bucket_starts[bucket + 1]; p++) {
        Packed128<floatX> d = load128(dout + (long)positions[p] * C + c);
        for (int i = 0; i < X; i++) acc[i] += to_float(d[i]);
    }
    for (int i = 0; i < X; i++) current[i] = from_float<floatX>(acc[i]);
    store128(row, current);
}

// dwpe[t,:] += sum over b of dout[b,t,:], summed in b order.
template <typename floatX>
__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    constexpr int X = Packed128<floatX>::size;
    long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * X;
    if (idx >= (long)T * C) return;
    float acc[X];
    Packed128<floatX> current = load128(dwpe + idx);
    for (int i = 0; i < X; i++) acc[i] = to_float(current[i]);
    for (int b = 0; b < B; b++) {
        Packed128<floatX> d = load128(dout + (long)b * T * C + idx);
        for (int i = 0; i < X; i++) acc[i] += to_float(d[i]);
    }
    for (int i = 0; i < X; i++) current[i] = from_float<floatX>(acc[i]);
    store128(dwpe + idx, current);
}

// Accumulates (+=) into dwte and dwpe. `buckets_device` holds encoder_buckets() of the same batch. With a vocabulary
// range, dwte is that range's slice (rows of other tokens are another rank's); dwpe null: no position gradient
// (the rank that adds wpe in the forward computes it).
template <typename floatX>
void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* buckets_device, int num_buckets,
                      int B, int T, int C, cudaStream_t stream, int vocab_begin = 0, int vocab_count = INT_MAX) {
    constexpr int X = Packed128<floatX>::size;
    const int block = 128;
    const int* bucket_tokens = buckets_device;
    const int* bucket_starts = buckets_device + num_buckets;
    const int* positions = bucket_starts + num_buckets + 1;
    dim3 grid(num_buckets, ceil_div(C / X, block));
    encoder_backward_wte_kernel<<<grid, block, 0, stream>>>(dwte, dout, bucket_tokens, bucket_starts, positions, C,
                                                            vocab_begin, vocab_count);
    cudaCheckLaunch();
    if (dwpe == nullptr) return;
    encoder_backward_wpe_kernel<<<ceil_div((long)T * C / X, 256), 256, 0, stream>>>(dwpe, dout, B, T, C);
    cudaCheckLaunch();
}
