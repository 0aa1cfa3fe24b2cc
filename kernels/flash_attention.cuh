// Fused causal attention with grouped-query heads, FlashAttention-2 style: softmax(Q K^T / sqrt(hs)) V and its
// backward without any T x T matrix in global memory. Q, K and V tiles live in shared memory, the softmax is computed
// online in fp32, key tiles above the diagonal are skipped and the diagonal tiles are masked.
//   bf16 / fp16: tensor cores (mma.sync m16n8k16 fed by ldmatrix from XOR-swizzled shared memory, cp.async
//                multi-buffering), head sizes 64 and 128. On Hopper (compute capability 9.x, binary built for
//                sm_90a) the forward and the backward are flash_attention_hopper.cuh's instead: wgmma, TMA and
//                warp-specialised producer / consumer warpgroups, which mma.sync cannot feed at Hopper's
//                tensor-core rate. The mma.sync kernels stay for every other GPU and build.
//   fp32:        plain FFMA kernels, exact up to summation order (for checks and the fp32 training mode).
// Layouts: qkv (B,T,NH+2*KVH,hs) as the qkv matmul writes it, each row [q: NH heads | k: KVH heads | v: KVH
// heads]: query head h reads kv head h / (NH/KVH) (grouped-query attention; KVH = NH is multi-head attention,
// GPT-2's (B,T,3,NH,hs), for which every index below reduces to the multi-head one); dqkv has qkv's layout; out
// and dout (B,T,NH,hs) = (B,T,C); lse (B,NH,T) holds the natural log-sum-exp of each row of scaled scores, saved
// by the forward for the backward. A forward CTA reads the K and V of its query head's kv head, which the other
// heads of the group read too (mostly from L2).
// Backward (bf16/fp16, mma.sync and Hopper alike): one CTA per key block of a kv head accumulates dK, dV in
// registers over the query blocks below the diagonal of each query head of its group in turn (K and V loaded
// once per group, the sums over the group in a fixed order in both modes); dQ partial sums from different key
// blocks meet in an fp32 buffer per query head:
//   deterministic = false: fp32 atomics in whatever order they arrive, a zeroing pass before and a
//                          conversion pass after.
//   deterministic = true:  a fixed order, highest key block first, handed on through one turn counter per
//                          query block; key block 0, always last, writes dQ itself (no extra passes). This
//                          relies on CTAs starting in launch order (a key block only ever waits for higher
//                          ones, which are launched before it), as stream-K style kernels do. Measured cost
//                          on an H200 (mma.sync backward): 17% (hs 64) to 31% (hs 128) longer.
// The Hopper backward differs (flash_attention_hopper.cuh): key blocks come in cluster pairs whose dQ tiles are
// summed in shared memory before one fp32 add; its ordered mode hands blocks on from the lowest pair up, the pair
// on a query block's diagonal, which adds last, writing dQ itself (no conversion pass; the atomic mode keeps it),
// and is faster than its atomic one (train_gpt takes it there).
// The fp32 backward computes dQ in its own pass and is always deterministic.
// defines: flash_attention_forward, flash_attention_backward, flash_attention_backward_scratch_bytes
#pragma once
#include "common.cuh"

namespace flash {

constexpr float kLn2 = 0.6931471805599453f;

// The kv head that query head h reads: heads h0 .. h0 + NH/KVH - 1 share one.
__host__ __device__ __forceinline__ int kv_head(int h, int NH, int KVH) { return h / (NH / KVH); }

// ---------------------------------------------------------------------------------------------
// PTX wrappers. The asm that touches shared memory is volatile so that it stays on its side of barriers.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16-byte global -> shared copy that bypasses the registers; `valid` false writes zeros (ragged tiles).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += a (16x16, row-major fragment) * b (16x8, column fragment), fp32 accumulators.
template <typename T> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values, `lo` in the low half (the lower column of a fragment).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t v);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
    return __half22float2(*reinterpret_cast<__half2*>(&v));
}

// Turn counters of the deterministic backward. A relaxed read does not stall the warp until its value is
// used; followed by fence_acq_rel it is an acquire (PTX memory model: acquire pattern).
__device__ __forceinline__ int ld_relaxed(const int* p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
// Release: everything this thread, and (through a preceding barrier) its CTA, wrote is visible before the add.
__device__ __forceinline__ void red_release_add(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles of 16-bit values, rows of COLS elements (COLS*2 >= 128 bytes): 16-byte chunk c of
// row r is stored at chunk c ^ (r % 8). ldmatrix reads one chunk column of 8 consecutive rows at a time,
// which this spreads over all 32 banks; unswizzled, the 8 rows would hit the same banks.
template <int COLS> __device__ __forceinline__ uint32_t swz(int r, int c) {
    return r * (COLS * 2) + ((c ^ (r & 7)) << 4);
}
// Per-lane ldmatrix.x4 offsets of the three fragment patterns. A fragment of 16 rows starting at a multiple
// of 8 and 2 chunks starting at an even chunk ce is then at (tile + offset + row0 * COLS * 2) ^ (ce << 4):
// the lane's chunk bit 0 never carries into the bits that ce sets, so the XOR equals the swizzled sum.
// This keeps one base register per pattern instead of one address per (row, chunk) pair. It needs the
// tiles 256-byte aligned (the dynamic shared memory is declared 1024-aligned, all tile sizes are multiples).
//   frag_rows16: rows +0..15 (lane % 16), chunk +lane/16. A of a row-major [m][k] tile (non-trans).
//   frag_rows8x2: rows +0..7 then +8..15 for lanes 16..31, chunk +(lane/8)%2. B of an [n][k] tile
//                 (non-trans: K in Q K^T) and A of a [k][m] tile (trans: P in P^T dO).
//   frag_krows: rows +0..15 over lanes 0..15 and again over 16..31, chunk +lane/16. B of a [k][n] tile
//               (trans: V in P V).
template <int COLS> __device__ __forceinline__ uint32_t frag_rows16(int lane) { return swz<COLS>(lane & 15, lane >> 4); }
template <int COLS> __device__ __forceinline__ uint32_t frag_rows8x2(int lane) {
    return swz<COLS>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
}
template <int COLS> __device__ __forceinline__ uint32_t frag_krows(int lane) {
    return swz<COLS>((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
}

// ROWS x COLS tile from global rows row0.. (row stride `stride` elements) into a swizzled tile at `dst`;
// rows at or past `rows_end` are zero-filled so the ragged last tile holds no garbage (NaN * 0 = NaN).
// Thread tid copies chunk tid % CPR of rows tid / CPR + i * RS: with RS a multiple of 8 all of its chunks
// share one swizzle and one running source pointer, so the copy holds few registers across a loop.
template <int ROWS, int COLS, int THREADS, typename T>
__device__ __forceinline__ void load_tile(uint32_t dst, const T* src, long stride, int row0, int rows_end, int tid) {
    constexpr int CPR = COLS / 8, RS = THREADS / CPR;  // 16-byte chunks per row, rows per pass
    static_assert(THREADS % CPR == 0 && RS % 8 == 0 && ROWS % RS == 0, "tile chunks must divide among the threads");
    const int r0 = tid / CPR, c = tid % CPR;
    const T* p = src + (long)(row0 + r0) * stride + c * 8;
    dst += swz<COLS>(r0, c);
#pragma unroll
    for (int i = 0; i < ROWS / RS; i++) {
        const bool valid = row0 + r0 + i * RS < rows_end;
        cp_async16(dst + i * RS * COLS * 2, valid ? p : src, valid);
        p += RS * stride;
    }
}

// Copies a swizzled ROWS x HS tile of 16-bit values to global rows row0.. (stride elements), 16 bytes per
// access, skipping rows at or past rows_end.
template <int ROWS, int HS, int THREADS, typename T>
__device__ __forceinline__ void store_tile(T* dst, long stride, const unsigned char* tile, int row0, int rows_end, int tid) {
    constexpr int CPR = HS / 8;
#pragma unroll
    for (int i = 0; i < ROWS * CPR / THREADS; i++) {
        const int idx = tid + i * THREADS, r = idx / CPR, c = idx % CPR;
        if (row0 + r < rows_end)
            *reinterpret_cast<uint4*>(dst + (long)(row0 + r) * stride + c * 8) =
                *reinterpret_cast<const uint4*>(tile + swz<HS>(r, c));
    }
}

// ---------------------------------------------------------------------------------------------
// Forward, tensor cores. One CTA = 4 warps of one (b, head); each warp owns MT = 2 16-row MMA tiles of
// query rows, so every K/V fragment read from shared memory feeds two MMAs. Key blocks of BC rows are
// double-buffered. Scores are kept in the log2 domain (scale * log2(e) folded in) for exp2.
// Two CTAs per SM (8 warps). hs 128 takes key blocks of 32: O alone holds 128 registers per thread, and
// with 64-key score tiles the warp spilled (measured: 267 against 252 TFLOP/s on an H200).
template <int HS> struct FwdConfig {
    static constexpr int MT = 2;                   // 16-row tiles per warp
    static constexpr int BC = HS == 128 ? 32 : 64;  // keys per block
    static constexpr int THREADS = 128, MIN_BLOCKS = 2, BR = 4 * 16 * MT;
    static constexpr size_t smem_bytes = (size_t)(BR + 4 * BC) * HS * 2;
};

template <typename T, int HS>
__global__ void __launch_bounds__(FwdConfig<HS>::THREADS, FwdConfig<HS>::MIN_BLOCKS)
flash_forward_kernel(T* out, float* lse, const T* qkv, int Tn, int NH, int KVH, int nqb, float scale_log2) {
    using Cfg = FwdConfig<HS>;
    constexpr int MT = Cfg::MT, BR = Cfg::BR, BC = Cfg::BC, THREADS = Cfg::THREADS, WR = 16 * MT;
    constexpr int KS = HS / 16;  // k-steps of Q K^T over the head dimension
    constexpr int NT = BC / 8;   // 8-key column tiles of S
    constexpr int DT = HS / 8;   // 8-wide column tiles of O
    // the warp's Q fragments stay in registers when they take at most 32
    constexpr bool Q_IN_REGS = MT * KS * 4 <= 32;
    constexpr uint32_t KV_BYTES = BC * HS * 2;
    constexpr uint32_t ROWB = HS * 2;
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t sQ = smem_u32(smem), sK0 = sQ + BR * ROWB, sV0 = sK0 + 2 * KV_BYTES;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
    const int qb = nqb - 1 - (int)(blockIdx.x % nqb);  // longest rows (most key blocks) first
    const long bh = blockIdx.x / nqb;
    const int b = (int)(bh / NH), h = (int)(bh % NH);
    const long C = (long)NH * HS, stride = (long)(NH + 2 * KVH) * HS;
    const T* q_g = qkv + (long)b * Tn * stride + h * HS;
    const T* k_g = qkv + (long)b * Tn * stride + C + (long)kv_head(h, NH, KVH) * HS;
    const T* v_g = k_g + (long)KVH * HS;
    const int q0 = qb * BR;
    const int n_kb = (min(q0 + BR, Tn) - 1) / BC + 1;  // key blocks up to the last query row
    const int row_w = q0 + warp * WR;                  // first query row of this warp
    const uint32_t aQ = sQ + warp * WR * ROWB + frag_rows16<HS>(lane);
    const uint32_t bK = frag_rows8x2<HS>(lane), bV = frag_krows<HS>(lane);

    load_tile<BR, HS, THREADS>(sQ, q_g, stride, q0, Tn, tid);
    cp_async_commit();
    load_tile<BC, HS, THREADS>(sK0, k_g, stride, 0, Tn, tid);
    load_tile<BC, HS, THREADS>(sV0, v_g, stride, 0, Tn, tid);
    cp_async_commit();

    uint32_t qf[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KS : 1][4];
    if constexpr (Q_IN_REGS) {
        cp_async_wait<1>();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                ldsm_x4(qf[mt][ks], (aQ ^ (ks << 5)) + mt * 16 * ROWB);
    }

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];  // running max (log2 domain) and this thread's partial row sums
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mt][dt][e] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    for (int j = 0; j < n_kb; j++) {
        if (j + 1 < n_kb) {
            load_tile<BC, HS, THREADS>(sK0 + ((j + 1) & 1) * KV_BYTES, k_g, stride, (j + 1) * BC, Tn, tid);
            load_tile<BC, HS, THREADS>(sV0 + ((j + 1) & 1) * KV_BYTES, v_g, stride, (j + 1) * BC, Tn, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint32_t sK = sK0 + (j & 1) * KV_BYTES + bK, sV = sV0 + (j & 1) * KV_BYTES + bV;
        const int k0 = j * BC;
        // Block 0 is never skipped and holds key 0, which every row sees: the running max is finite after it,
        // so exp2(m_old - m_new) and exp2(s - m_new) never meet -inf - -inf.
        if (k0 <= row_w + WR - 1) {  // else every key of the block is in this warp's future
            float s[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if constexpr (Q_IN_REGS) {
#pragma unroll
                        for (int e = 0; e < 4; e++) a[mt][e] = qf[mt][ks][e];
                    } else {
                        ldsm_x4(a[mt], (aQ ^ (ks << 5)) + mt * 16 * ROWB);
                    }
                }
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t kf[4];  // b-fragments of key tiles 2np (kf[0..1]) and 2np+1 (kf[2..3])
                    ldsm_x4(kf, (sK ^ (ks << 5)) + np * 16 * ROWB);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<T>(s[mt][2 * np], a[mt], kf[0], kf[1]);
                        mma16816<T>(s[mt][2 * np + 1], a[mt], kf[2], kf[3]);
                    }
                }
            }
            if (k0 + BC - 1 > row_w || k0 + BC > Tn) {  // diagonal or ragged block: mask the future and past-T keys
                // element (row_w + g + ro, col0 + co) with compile-time offsets ro, co: the tests compare the
                // two thread-dependent differences against constants (no per-element index registers)
                const int col0 = k0 + tig * 2, ahead = col0 - (row_w + g), past = col0 - Tn;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int ro = mt * 16 + (e >> 1) * 8, co = nt * 8 + (e & 1);
                            if (ahead + co > ro || past + co >= 0) s[mt][nt][e] = -INFINITY;
                        }
            }
            // online softmax: rows g and g+8 of each tile; the 4 threads of a quad share a row
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                    const float m_new = fmaxf(m[mt][hf], mx * scale_log2);
                    const float corr = fast_exp2(m[mt][hf] - m_new);
                    m[mt][hf] = m_new;
                    float sum = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float p = fast_exp2(fmaf(s[mt][nt][2 * hf + e], scale_log2, -m_new));
                            s[mt][nt][2 * hf + e] = p;
                            sum += p;
                        }
                    l[mt][hf] = l[mt][hf] * corr + sum;
#pragma unroll
                    for (int dt = 0; dt < DT; dt++) {
                        o[mt][dt][2 * hf] *= corr;
                        o[mt][dt][2 * hf + 1] *= corr;
                    }
                }
            // O += P V: the S accumulators of two adjacent key tiles are exactly an A fragment of P
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t vf[4];  // V is [key][d]: transposed loads give b-fragments with k = key
                    ldsm_x4_trans(vf, (sV ^ (dp << 5)) + kk * 16 * ROWB);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<T>(o[mt][2 * dp], pa[mt], vf[0], vf[1]);
                        mma16816<T>(o[mt][2 * dp + 1], pa[mt], vf[2], vf[3]);
                    }
                }
            }
        }
        __syncthreads();  // all warps are done with buffer j&1 before iteration j+1 refills it
    }

    // Epilogue: normalise, save the log-sum-exp, stage O in this warp's own Q rows (no other warp reads
    // them) and write it with 16-byte stores.
    unsigned char* sO = smem;
    // element pair (row warp*WR + g, column tile 0) of the staged O; tile dt at ^ (dt << 4)
    const uint32_t sOb = (warp * WR + g) * ROWB + (g << 4) + tig * 4;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float sum = l[mt][hf];
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            const float inv = 1.0f / sum;
            const int r = warp * WR + mt * 16 + g + hf * 8;
            if (tig == 0 && q0 + r < Tn) lse[bh * Tn + q0 + r] = (m[mt][hf] + log2f(sum)) * kLn2;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *reinterpret_cast<uint32_t*>(sO + (sOb ^ (dt << 4)) + (mt * 16 + hf * 8) * ROWB) =
                    pack2<T>(o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
        }
    __syncwarp();
    store_tile<WR, HS, 32>(out + (long)b * Tn * C + h * HS, C, sO + warp * WR * ROWB, row_w, Tn, lane);
}

// ---------------------------------------------------------------------------------------------
// Backward, tensor cores. One CTA = 8 warps = one key block of 128 rows of a kv head (K, V resident in shared
// memory), looping over the query heads of its group and, for each, over the query blocks of 64 rows at and
// below the diagonal (Q, dO, lse, D triple-buffered, so that the barrier at the top of an iteration protects
// both the buffers and P / dS; one more after P / dS are written, two per iteration in all):
//   S  = Q K^T, dP = dO V^T      warp tile 32 queries x 32 keys; P and dS = P * (dP - D) go to shared memory
//   dV += P^T dO, dK += dS^T Q   warp tile 32 keys x hs/2, accumulated in registers over all query blocks of
//                                all the group's heads
//   dQ  = dS K                   warp tile 32 queries x hs/4, added into the fp32 dQ buffer
// FLOPs per pair of blocks: 5 products, as counted by the usual 2.5x-forward convention.
constexpr int kBwdThreads = 256, kBwdBN = 128, kBwdBM = 64;
// Backward warp tile: acc (32 rows x 32 keys) = A B^T over the head dimension, A's rows (Q or dO) at
// shared address a, B's rows (K or V) at b, both swizzled rows of HS 16-bit values; zero when !live.
template <typename T, int HS>
__device__ __forceinline__ void warp_tile_abt(float (&acc)[2][4][4], uint32_t a, uint32_t b, bool live) {
    constexpr uint32_t ROWB = HS * 2;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    if (!live) return;
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        uint32_t fa[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) ldsm_x4(fa[mt], (a ^ (ks << 5)) + mt * 16 * ROWB);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t fb[4];
            ldsm_x4(fb, (b ^ (ks << 5)) + np * 16 * ROWB);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                mma16816<T>(acc[mt][2 * np], fa[mt], fb[0], fb[1]);
                mma16816<T>(acc[mt][2 * np + 1], fa[mt], fb[2], fb[3]);
            }
        }
    }
}

template <int HS> constexpr size_t bwd_smem_bytes() {
    // K, V + 3 x (Q, dO) + staged dQ + P, dS + 3 x (lse, D)
    return (size_t)(2 * kBwdBN * HS + 7 * kBwdBM * HS + 2 * kBwdBM * kBwdBN) * 2 + 6 * kBwdBM * sizeof(float);
}

template <typename T, int HS, bool DET>
__global__ void __launch_bounds__(kBwdThreads, 1)
flash_backward_kernel(T* dqkv, float* dq_accum, int* dq_turn, const T* dout, const T* qkv, const float* lse,
                      const float* Dvec, int Tn, int NH, int KVH, int nkb, int nqb, float scale, float scale_log2) {
    constexpr int BN = kBwdBN, BM = kBwdBM, THREADS = kBwdThreads;
    constexpr uint32_t KV_BYTES = BN * HS * 2, QD_BYTES = BM * HS * 2, PS_BYTES = BM * BN * 2;
    constexpr int DN = HS / 16;  // 8-wide column tiles of this warp's dK, dV (hs/2 columns)
    constexpr int QN = HS / 32;  // 8-wide column tiles of this warp's dQ (hs/4 columns)
    constexpr uint32_t ROWB = HS * 2, ROWB_P = BN * 2;
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = smem_u32(smem);
    constexpr uint32_t oK = 0, oV = KV_BYTES, oQ = 2 * KV_BYTES, oO = oQ + 3 * QD_BYTES, oDQ = oO + 3 * QD_BYTES,
                       oP = oDQ + QD_BYTES, oS = oP + PS_BYTES, oL = oS + PS_BYTES, oD = oL + 3 * BM * 4;
    const float* sL = reinterpret_cast<const float*>(smem + oL);
    const float* sD = reinterpret_cast<const float*>(smem + oD);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
    // Highest key block of each kv head first: in deterministic mode a key block waits on the higher ones, which
    // are then always launched before it.
    const int kb = nkb - 1 - (int)(blockIdx.x % nkb);
    const long bkv = blockIdx.x / nkb;
    const int b = (int)(bkv / KVH), kvh = (int)(bkv % KVH), group = NH / KVH;
    const long C = (long)NH * HS, stride = (long)(NH + 2 * KVH) * HS;
    const T* qkv_b = qkv + (long)b * Tn * stride;
    const T* k_g = qkv_b + C + (long)kvh * HS;
    const T* v_g = k_g + (long)KVH * HS;
    const int k0 = kb * BN;
    const int first_qb = k0 / BM, nq = nqb - first_qb, h_end = (kvh + 1) * group;
    // The iterations take the group's query heads h in turn, each over its nq query blocks qb from first_qb up, in
    // nested loops; the prefetch finds its block by subtraction. (A flat loop over the pairs, with a division or
    // with the prefetch's pair carried along, made the hs 128 kernels spill: ptxas sm_80, 140-170 bytes, not 0-28.)
    auto load_q_block = [&](int h, int qb, int buf) {
        const int row0 = qb * BM;
        const long bh = (long)b * NH + h;
        load_tile<BM, HS, THREADS>(base + oQ + buf * QD_BYTES, qkv_b + h * HS, stride, row0, Tn, tid);
        load_tile<BM, HS, THREADS>(base + oO + buf * QD_BYTES, dout + (long)b * Tn * C + h * HS, C, row0, Tn, tid);
        if (tid < 2 * BM) {
            const int r = tid % BM, row = row0 + r;
            const bool valid = row < Tn;
            const float* src = (tid < BM ? lse : Dvec) + bh * Tn;
            cp_async4(base + (tid < BM ? oL : oD) + (buf * BM + r) * 4, src + (valid ? row : 0), valid);
        }
    };
    // the block n <= 2 iterations after (h, qb), if there is one (n = 2 and nq = 1: two heads on)
    auto load_ahead = [&](int h, int qb, int n, int buf) {
        qb += n;
        if (qb >= nqb) {
            qb -= nq;
            h++;
        }
        if (qb >= nqb) {
            qb -= nq;
            h++;
        }
        if (h < h_end) load_q_block(h, qb, buf);
    };
    // one commit group per query block (empty past the end, so that the group counting stays uniform)
    load_tile<BN, HS, THREADS>(base + oK, k_g, stride, k0, Tn, tid);
    load_tile<BN, HS, THREADS>(base + oV, v_g, stride, k0, Tn, tid);
    load_q_block(kvh * group, first_qb, 0);
    cp_async_commit();
    load_ahead(kvh * group, first_qb, 1, 1);
    cp_async_commit();

    const int wm = warp >> 2, wn = warp & 3;  // S / dP tile: queries wm*32.., keys wn*32..
    const int wk = warp >> 1, wd = warp & 1;  // dK / dV tile: keys wk*32.., columns wd*hs/2..
    const int wq = warp >> 2, wc = warp & 3;  // dQ tile: queries wq*32.., columns wc*hs/4..
    // per-lane fragment bases (see frag_rows16 and friends)
    const uint32_t aS = wm * 32 * ROWB + frag_rows16<HS>(lane);               // Q, dO as A of S, dP
    const uint32_t bK = base + oK + wn * 32 * ROWB + frag_rows8x2<HS>(lane);  // K, V as B of S, dP
    const uint32_t bV = bK + (oV - oK);
    const uint32_t aP = (base + oP + frag_rows8x2<BN>(lane)) ^ (wk << 6);    // P^T, dS^T as A of dV, dK
    const uint32_t aDS = aP + (oS - oP);
    const uint32_t bT = frag_krows<HS>(lane) ^ (wd * DN << 4);               // dO, Q as B of dV, dK
    const uint32_t aQ = base + oS + wq * 32 * ROWB_P + frag_rows16<BN>(lane); // dS as A of dQ
    const uint32_t bKT = (base + oK + frag_krows<HS>(lane)) ^ (wc * QN << 4); // K as B of dQ
    // element pair (row wm*32 + g, key tile wn*4) of P / dS: tile nt is at ^ (nt << 4), rows +8k at + k*8*ROWB_P
    const uint32_t sPS = (wm * 32 + g) * ROWB_P + (((wn * 4) ^ g) << 4) + tig * 4;
    // the same for the staged dQ (row wq*32 + g, column tile wc*QN) and dK, dV (row wk*32 + g, tile wd*DN)
    const uint32_t sDQ = (wq * 32 + g) * ROWB + (((wc * QN) ^ g) << 4) + tig * 4;
    const uint32_t sKV = (wk * 32 + g) * ROWB + (((wd * DN) ^ g) << 4) + tig * 4;
    float dk[2][DN][4], dv[2][DN][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < DN; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[mt][nt][e] = dv[mt][nt][e] = 0.0f;

    int* prev_turns = nullptr;  // deterministic mode: the previous iteration's turn counter
    int buf = 0;  // the Q, dO, lse, D buffer of (h, qb), running on across the heads
    for (int h = kvh * group; h < h_end; h++)
        for (int qb = first_qb; qb < nqb; qb++, buf = buf == 2 ? 0 : buf + 1) {
            const long bh = (long)b * NH + h;
            int* turns = dq_turn + bh * nqb + qb;  // deterministic mode: key blocks that have added to this block
            cp_async_wait<1>();  // this block's group; the next one may still be in flight
            // Every warp is past the previous iteration: its buffer and P / dS are free to overwrite.
            __syncthreads();
            const int q0 = qb * BM;
            const uint32_t sQ = base + oQ + buf * QD_BYTES, sO = base + oO + buf * QD_BYTES;

            // ---- S = Q K^T -> P, then dP = dO V^T -> dS = P * (dP - D); both to shared memory. P waits for dP
            // packed in 16-bit pairs (as it is stored and used for dV): 16 registers instead of 32.
            {
                const int key_w = k0 + wn * 32, row_w = q0 + wm * 32;
                const bool live = key_w <= row_w + 31;  // else the whole tile is in the future: P = dS = 0
                const bool need_mask = key_w + 31 > row_w || q0 + BM > Tn;
                const int ahead = key_w + tig * 2 - (row_w + g);  // key - row of element (0, 0) of each tile
                uint32_t pp[2][2][4];                              // P of rows (mt, hf), key tile nt
                {
                    float s[2][4][4];
                    warp_tile_abt<T, HS>(s, sQ + aS, bK, live);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) {
                            const int r = wm * 32 + mt * 16 + g + hf * 8;
                            const bool row_past = q0 + r >= Tn;
                            const float lse2 = sL[buf * BM + r] * kLog2e;
#pragma unroll
                            for (int nt = 0; nt < 4; nt++) {
                                float p[2];
#pragma unroll
                                for (int e = 0; e < 2; e++) {
                                    p[e] = fast_exp2(fmaf(s[mt][nt][2 * hf + e], scale_log2, -lse2));
                                    // rows past T were zero-filled (lse 0), so they are masked too; keys past T
                                    // are always later than every valid row
                                    if (need_mask && (ahead + nt * 8 + e > mt * 16 + hf * 8 || row_past)) p[e] = 0.0f;
                                }
                                pp[mt][hf][nt] = pack2<T>(p[0], p[1]);
                                *reinterpret_cast<uint32_t*>(smem + oP + ((sPS ^ (nt << 4)) + (mt * 16 + hf * 8) * ROWB_P)) = pp[mt][hf][nt];
                            }
                        }
                }
                float dp[2][4][4];
                warp_tile_abt<T, HS>(dp, sO + aS, bV, live);
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int r = wm * 32 + mt * 16 + g + hf * 8;
                        const float Dr = sD[buf * BM + r];
#pragma unroll
                        for (int nt = 0; nt < 4; nt++) {
                            const float2 p = unpack2<T>(pp[mt][hf][nt]);
                            *reinterpret_cast<uint32_t*>(smem + oS + ((sPS ^ (nt << 4)) + (mt * 16 + hf * 8) * ROWB_P)) =
                                pack2<T>(p.x * (dp[mt][nt][2 * hf] - Dr), p.y * (dp[mt][nt][2 * hf + 1] - Dr));
                        }
                    }
            }
            __syncthreads();
            // Deterministic: every warp's dQ part of the previous iteration's block was written before this barrier,
            // a phase ago, so the release finds it completed: hand that block on to the next key block. And
            // look early at this block's counter; the value is needed only at the dQ writes.
            const int turn = min(nkb - 1, (q0 + BM - 1) / BN) - kb;  // key blocks that add to this block before us
            int seen = 0;
            if constexpr (DET) {
                if (tid == 0 && prev_turns != nullptr && kb > 0) red_release_add(prev_turns, 1);
                if (lane == 0 && turn > 0) seen = ld_relaxed(turns);
            }
            load_ahead(h, qb, 2, buf == 0 ? 2 : buf - 1);
            cp_async_commit();

            // ---- dV += P^T dO, dK += dS^T Q. P and dS are stored [query][key]: transposed loads give the
            // A fragments of P^T and dS^T.
#pragma unroll
            for (int kq = 0; kq < BM / 16; kq++) {
                if (k0 + wk * 32 > q0 + kq * 16 + 15) continue;  // all of these keys are later than these queries
                uint32_t pa[2][4], sa[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    ldsm_x4_trans(pa[mt], (aP ^ (mt << 5)) + kq * 16 * ROWB_P);
                    ldsm_x4_trans(sa[mt], (aDS ^ (mt << 5)) + kq * 16 * ROWB_P);
                }
#pragma unroll
                for (int np = 0; np < DN / 2; np++) {
                    uint32_t of[4], qf[4];
                    ldsm_x4_trans(of, ((sO + bT) ^ (np << 5)) + kq * 16 * ROWB);
                    ldsm_x4_trans(qf, ((sQ + bT) ^ (np << 5)) + kq * 16 * ROWB);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma16816<T>(dv[mt][2 * np], pa[mt], of[0], of[1]);
                        mma16816<T>(dv[mt][2 * np + 1], pa[mt], of[2], of[3]);
                        mma16816<T>(dk[mt][2 * np], sa[mt], qf[0], qf[1]);
                        mma16816<T>(dk[mt][2 * np + 1], sa[mt], qf[2], qf[3]);
                    }
                }
            }

            // ---- dQ partial = dS K over this key block
            float dq[2][QN][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < QN; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) dq[mt][nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                if (k0 + kk * 16 > q0 + wq * 32 + 31) continue;  // these keys are later than all of the warp's queries
                uint32_t sa[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    ldsm_x4(sa[mt], (aQ ^ (kk << 5)) + mt * 16 * ROWB_P);
#pragma unroll
                for (int np = 0; np < QN / 2; np++) {
                    uint32_t kf[4];
                    ldsm_x4_trans(kf, (bKT ^ (np << 5)) + kk * 16 * ROWB);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma16816<T>(dq[mt][2 * np], sa[mt], kf[0], kf[1]);
                        mma16816<T>(dq[mt][2 * np + 1], sa[mt], kf[2], kf[3]);
                    }
                }
            }

            // ---- dQ into the fp32 buffer. Atomic mode: atomics. Deterministic: the key blocks of a query block
            // take turns, highest first; each warp waits for its block's turn on its own (no CTA barrier), the
            // first stores, the middle ones add (atomics, but never two at once), and key block 0, always the
            // last, adds the sum to its own part and writes dQ itself.
            if constexpr (DET) {
                if (turn > 0) {
                    if (lane == 0) {
                        while (seen < turn) {
                            __nanosleep(32);
                            seen = ld_relaxed(turns);
                        }
                        fence_acq_rel();
                    }
                    __syncwarp();
                }
            }
            float* acc = dq_accum + (bh * Tn + q0) * HS;
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int r = wq * 32 + mt * 16 + g + hf * 8;
                    if (q0 + r >= Tn) continue;
#pragma unroll
                    for (int nt = 0; nt < QN; nt++) {
                        const int col = wc * (HS / 4) + nt * 8 + tig * 2;
                        float2* p = reinterpret_cast<float2*>(acc + (long)r * HS + col);
                        float2 v = make_float2(dq[mt][nt][2 * hf], dq[mt][nt][2 * hf + 1]);
                        if (!DET) {
                            atomic_add_float2(p, v);
                        } else if (kb == 0) {
                            if (turn > 0) {
                                const float2 prev = __ldcg(p);
                                v.x += prev.x;
                                v.y += prev.y;
                            }
                            *reinterpret_cast<uint32_t*>(smem + oDQ + ((sDQ ^ (nt << 4)) + (mt * 16 + hf * 8) * ROWB)) =
                                pack2<T>(v.x * scale, v.y * scale);
                        } else if (turn == 0) {
                            __stcg(p, v);
                        } else {
                            atomic_add_float2(p, v);
                        }
                    }
                }
            if (DET && kb == 0) {  // the warp's staged part of dQ, 16-byte stores
                __syncwarp();
                constexpr int CPR = HS / 32;  // chunks per row of the part
#pragma unroll
                for (int i = 0; i < CPR; i++) {
                    const int idx = lane + 32 * i, r = wq * 32 + idx / CPR, c = wc * CPR + idx % CPR;
                    if (q0 + r < Tn)
                        *reinterpret_cast<uint4*>(dqkv + ((long)b * Tn + q0 + r) * stride + h * HS + c * 8) =
                            *reinterpret_cast<const uint4*>(smem + oDQ + swz<HS>(r, c));
                }
            }
            prev_turns = turns;
        }
    __syncthreads();  // the last iteration's reads of K and V (and dQ writes) are done
    if (DET && tid == 0 && kb > 0) red_release_add(prev_turns, 1);

    // dK (scaled), dV: staged in the K and V tiles (free now), written with 16-byte stores
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
#pragma unroll
            for (int nt = 0; nt < DN; nt++) {
                const uint32_t off = (sKV ^ (nt << 4)) + (mt * 16 + hf * 8) * ROWB;
                *reinterpret_cast<uint32_t*>(smem + oK + off) = pack2<T>(dk[mt][nt][2 * hf] * scale, dk[mt][nt][2 * hf + 1] * scale);
                *reinterpret_cast<uint32_t*>(smem + oV + off) = pack2<T>(dv[mt][nt][2 * hf], dv[mt][nt][2 * hf + 1]);
            }
        }
    __syncthreads();
    T* dk_g = dqkv + (long)b * Tn * stride + C + (long)kvh * HS;
    store_tile<BN, HS, THREADS>(dk_g, stride, smem + oK, k0, Tn, tid);
    store_tile<BN, HS, THREADS>(dk_g + (long)KVH * HS, stride, smem + oV, k0, Tn, tid);
}

// ---------------------------------------------------------------------------------------------
// Backward helpers (all precisions). D = rowsum(dO * O) of each (b, head, t) into D[(b * NH + h) * Tpad + t],
// over rows = B * Tpad * NH, Tpad >= Tn (the Hopper backward pads to whole query blocks: D = 0 past T). 16-byte
// loads, one group of hs/X threads per row. With lse2 (else null), lse * log2 e (+inf past T) in D's layout too
// (the Hopper backward's exp2 domain). Where the mode asks, it also clears the dQ sums' starting state: with
// dq_zero (atomic mode), the fp32 dQ buffer's rows; with turns (deterministic mode), the first num_turns turn
// counters.
template <typename T, int HS>
__global__ void backward_prep_kernel(float* D, float* lse2, float* dq_zero, int* turns, long num_turns, const T* dout,
                                     const T* out, const float* lse, int Tn, int Tpad, int NH, long rows) {
    constexpr int X = Packed128<T>::size, TPR = HS / X;  // threads per row, a power of two <= 32
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (turns != nullptr && idx < num_turns) turns[idx] = 0;
    const long row = idx / TPR;  // over (B, Tpad, NH)
    const int c = (int)(idx % TPR);
    const bool valid = row < rows;
    const int h = (int)(row % NH);
    const long bt = row / NH, b = bt / Tpad;
    const int t = (int)(bt % Tpad);
    const bool live = valid && t < Tn;
    float sum = 0.0f;
    if (live) {
        const long src = ((b * Tn + t) * NH + h) * HS + c * X;
        const Packed128<T> d = load128cs(dout + src), o = load128cs(out + src);
#pragma unroll
        for (int i = 0; i < X; i++) sum += to_float(d[i]) * to_float(o[i]);
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, off);
    if (!valid) return;
    const long bh = b * NH + h, dst = bh * Tpad + t;
    if (c == 0) {
        D[dst] = sum;
        if (lse2 != nullptr) lse2[dst] = live ? lse[bh * Tn + t] * kLog2e : INFINITY;
    }
    if (dq_zero != nullptr) {
        float4* z = reinterpret_cast<float4*>(dq_zero + dst * HS);
        for (int i = c; i < HS / 4; i += TPR) z[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}
// num_turns <= rows * hs / X (one per thread): the turn counters are one per query block of at least 64 rows
template <typename T, int HS>
void backward_prep(float* D, float* lse2, float* dq_zero, int* turns, long num_turns, const T* dout, const T* out,
                   const float* lse, int B, int Tn, int Tpad, int NH, cudaStream_t stream) {
    const long rows = (long)B * Tpad * NH;
    constexpr int TPR = HS / Packed128<T>::size;
    backward_prep_kernel<T, HS><<<ceil_div(rows * TPR, 256), 256, 0, stream>>>(D, lse2, dq_zero, turns, num_turns, dout, out,
                                                                               lse, Tn, Tpad, NH, rows);
    cudaCheckLaunch();
}

// Atomic mode: dQ (scaled) from the fp32 buffer (B,NH,T,hs) into its slice of dqkv.
template <typename T, int HS>
__global__ void flash_dq_convert_kernel(T* dqkv, const float* dq_accum, int Tn, int NH, int KVH, long rows, float scale) {
    constexpr int X = Packed128<T>::size, CPR = HS / X;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const long row = idx / CPR;  // over (B, T, NH)
    const int c = (int)(idx % CPR);
    if (row >= rows) return;
    const int h = (int)(row % NH);
    const long bt = row / NH, b = bt / Tn, t = bt % Tn;
    const float* src = dq_accum + ((b * NH + h) * Tn + t) * HS + c * X;
    Packed128<T> v;
#pragma unroll
    for (int i = 0; i < X; i += 4) {
        const float4 f = __ldcs(reinterpret_cast<const float4*>(src + i));
        v[i] = from_float<T>(f.x * scale);
        v[i + 1] = from_float<T>(f.y * scale);
        v[i + 2] = from_float<T>(f.z * scale);
        v[i + 3] = from_float<T>(f.w * scale);
    }
    store128(dqkv + bt * (NH + 2 * KVH) * HS + h * HS + c * X, v);
}

// ---------------------------------------------------------------------------------------------
// fp32 path: the same tiling idea with plain FFMA. A warp owns 4 rows; its lanes take 32 keys (forward, dQ)
// or 32 queries (dK, dV) at a time, and the outer products go through warp shuffles. The tile read across
// lanes is padded by one float per row so that those reads hit 32 different banks. Exact: expf/logf and fp32
// sums of at most hs or 32 terms before each rescale.
constexpr int kF32Threads = 128, kF32Rows = 16, kF32Tile = 32;

template <int HS>
__global__ void __launch_bounds__(kF32Threads)
flash_forward_fp32_kernel(float* out, float* lse, const float* qkv, int Tn, int NH, int KVH, int nqb, float scale) {
    constexpr int DPL = HS / 32, RPW = kF32Rows / (kF32Threads / 32);
    extern __shared__ float fsm[];
    float* sQ = fsm;                        // [16][HS]
    float* sK = sQ + kF32Rows * HS;         // [32][HS + 1]
    float* sV = sK + kF32Tile * (HS + 1);   // [32][HS]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int qb = nqb - 1 - (int)(blockIdx.x % nqb);
    const long bh = blockIdx.x / nqb;
    const int b = (int)(bh / NH), h = (int)(bh % NH);
    const long C = (long)NH * HS, stride = (long)(NH + 2 * KVH) * HS, V = (long)KVH * HS;  // V: values after keys
    const float* q_g = qkv + (long)b * Tn * stride + h * HS;
    const float* k_g = qkv + (long)b * Tn * stride + C + (long)kv_head(h, NH, KVH) * HS;
    const int q0 = qb * kF32Rows;
    for (int i = tid; i < kF32Rows * HS; i += kF32Threads) {
        const int r = i / HS, t = q0 + r;
        sQ[i] = t < Tn ? q_g[(long)t * stride + i % HS] : 0.0f;
    }
    float m[RPW], l[RPW], o[RPW][DPL];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) o[i][d] = 0.0f;
    }
    const int n_kt = (min(q0 + kF32Rows, Tn) - 1) / kF32Tile + 1;
    for (int kt = 0; kt < n_kt; kt++) {
        const int k0 = kt * kF32Tile;
        __syncthreads();
        for (int i = tid; i < kF32Tile * HS; i += kF32Threads) {
            const int r = i / HS, d = i % HS, key = k0 + r;
            const float* src = k_g + (long)key * stride + d;
            sK[r * (HS + 1) + d] = key < Tn ? src[0] : 0.0f;
            sV[i] = key < Tn ? src[V] : 0.0f;
        }
        __syncthreads();
        float s[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++) s[i] = 0.0f;
        for (int d = 0; d < HS; d++) {
            const float kd = sK[lane * (HS + 1) + d];
#pragma unroll
            for (int i = 0; i < RPW; i++) s[i] += sQ[(warp * RPW + i) * HS + d] * kd;
        }
        const int key = k0 + lane;
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const int t = q0 + warp * RPW + i;
            if (t >= Tn || k0 > t) continue;  // warp-uniform; tile 0 always runs, so m is finite after it
            const bool valid = key <= t;
            const float si = s[i] * scale;
            const float m_new = fmaxf(m[i], warp_reduce_max(valid ? si : -INFINITY));
            const float corr = expf(m[i] - m_new);
            const float p = valid ? expf(si - m_new) : 0.0f;
            l[i] = l[i] * corr + warp_reduce_sum(p);
            m[i] = m_new;
#pragma unroll
            for (int d = 0; d < DPL; d++) o[i][d] *= corr;
            for (int j = 0; j < kF32Tile; j++) {
                const float pj = __shfl_sync(0xffffffff, p, j);
#pragma unroll
                for (int d = 0; d < DPL; d++) o[i][d] += pj * sV[j * HS + lane + 32 * d];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int t = q0 + warp * RPW + i;
        if (t >= Tn) continue;
        float* dst = out + ((long)b * Tn + t) * C + h * HS;
#pragma unroll
        for (int d = 0; d < DPL; d++) dst[lane + 32 * d] = o[i][d] / l[i];
        if (lane == 0) lse[bh * Tn + t] = m[i] + logf(l[i]);
    }
}

// dQ: 16 query rows per CTA, key tiles of 32 up to the diagonal.
template <int HS>
__global__ void __launch_bounds__(kF32Threads)
flash_backward_dq_fp32_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* Dvec,
                              int Tn, int NH, int KVH, int nqb, float scale) {
    constexpr int DPL = HS / 32, RPW = kF32Rows / (kF32Threads / 32);
    extern __shared__ float fsm[];
    float* sQ = fsm;                         // [16][HS]
    float* sO = sQ + kF32Rows * HS;          // dO [16][HS]
    float* sK = sO + kF32Rows * HS;          // [32][HS + 1]
    float* sV = sK + kF32Tile * (HS + 1);    // [32][HS + 1]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int qb = nqb - 1 - (int)(blockIdx.x % nqb);
    const long bh = blockIdx.x / nqb;
    const int b = (int)(bh / NH), h = (int)(bh % NH);
    const long C = (long)NH * HS, stride = (long)(NH + 2 * KVH) * HS, V = (long)KVH * HS;  // V: values after keys
    const float* q_g = qkv + (long)b * Tn * stride + h * HS;
    const float* k_g = qkv + (long)b * Tn * stride + C + (long)kv_head(h, NH, KVH) * HS;
    const float* do_g = dout + (long)b * Tn * C + h * HS;
    const int q0 = qb * kF32Rows;
    for (int i = tid; i < kF32Rows * HS; i += kF32Threads) {
        const int t = q0 + i / HS, d = i % HS;
        sQ[i] = t < Tn ? q_g[(long)t * stride + d] : 0.0f;
        sO[i] = t < Tn ? do_g[(long)t * C + d] : 0.0f;
    }
    float L[RPW], Dr[RPW], dq[RPW][DPL];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int t = min(q0 + warp * RPW + i, Tn - 1);
        L[i] = lse[bh * Tn + t];
        Dr[i] = Dvec[bh * Tn + t];
#pragma unroll
        for (int d = 0; d < DPL; d++) dq[i][d] = 0.0f;
    }
    const int n_kt = (min(q0 + kF32Rows, Tn) - 1) / kF32Tile + 1;
    for (int kt = 0; kt < n_kt; kt++) {
        const int k0 = kt * kF32Tile;
        __syncthreads();
        for (int i = tid; i < kF32Tile * HS; i += kF32Threads) {
            const int r = i / HS, d = i % HS, key = k0 + r;
            const float* src = k_g + (long)key * stride + d;
            sK[r * (HS + 1) + d] = key < Tn ? src[0] : 0.0f;
            sV[r * (HS + 1) + d] = key < Tn ? src[V] : 0.0f;
        }
        __syncthreads();
        float s[RPW], dp[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++) s[i] = dp[i] = 0.0f;
        for (int d = 0; d < HS; d++) {
            const float kd = sK[lane * (HS + 1) + d], vd = sV[lane * (HS + 1) + d];
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                s[i] += sQ[(warp * RPW + i) * HS + d] * kd;
                dp[i] += sO[(warp * RPW + i) * HS + d] * vd;
            }
        }
        const int key = k0 + lane;
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const int t = q0 + warp * RPW + i;
            if (t >= Tn || k0 > t) continue;
            const float p = key <= t ? expf(s[i] * scale - L[i]) : 0.0f;
            const float ds = p * (dp[i] - Dr[i]);
            for (int j = 0; j < kF32Tile; j++) {
                const float dsj = __shfl_sync(0xffffffff, ds, j);
#pragma unroll
                for (int d = 0; d < DPL; d++) dq[i][d] += dsj * sK[j * (HS + 1) + lane + 32 * d];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int t = q0 + warp * RPW + i;
        if (t >= Tn) continue;
        float* dst = dqkv + ((long)b * Tn + t) * stride + h * HS;
#pragma unroll
        for (int d = 0; d < DPL; d++) dst[lane + 32 * d] = dq[i][d] * scale;
    }
}

// dK, dV: 16 key rows of a kv head per CTA, query tiles of 32 from the diagonal to T of each query head of its
// group in turn.
template <int HS>
__global__ void __launch_bounds__(kF32Threads)
flash_backward_dkdv_fp32_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* Dvec,
                                int Tn, int NH, int KVH, int nkb, float scale) {
    constexpr int DPL = HS / 32, RPW = kF32Rows / (kF32Threads / 32);
    extern __shared__ float fsm[];
    float* sK = fsm;                         // [16][HS]
    float* sV = sK + kF32Rows * HS;          // [16][HS]
    float* sQ = sV + kF32Rows * HS;          // [32][HS + 1]
    float* sO = sQ + kF32Tile * (HS + 1);    // dO [32][HS + 1]
    float* sL = sO + kF32Tile * (HS + 1);    // [32]
    float* sD = sL + kF32Tile;               // [32]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int kb = (int)(blockIdx.x % nkb);
    const long bkv = blockIdx.x / nkb;
    const int b = (int)(bkv / KVH), kvh = (int)(bkv % KVH), group = NH / KVH;
    const long C = (long)NH * HS, stride = (long)(NH + 2 * KVH) * HS, V = (long)KVH * HS;  // V: values after keys
    const float* qkv_b = qkv + (long)b * Tn * stride;
    const float* k_g = qkv_b + C + (long)kvh * HS;
    const int k0 = kb * kF32Rows;
    for (int i = tid; i < kF32Rows * HS; i += kF32Threads) {
        const int key = k0 + i / HS, d = i % HS;
        sK[i] = key < Tn ? k_g[(long)key * stride + d] : 0.0f;
        sV[i] = key < Tn ? k_g[(long)key * stride + V + d] : 0.0f;
    }
    float dk[RPW][DPL], dv[RPW][DPL];
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
        for (int d = 0; d < DPL; d++) dk[i][d] = dv[i][d] = 0.0f;
    const int first_qt = k0 / kF32Tile, n_qt = (Tn - 1) / kF32Tile + 1 - first_qt;  // query tiles of each head
    // iteration it: query head kvh * group + it / n_qt, query tile first_qt + it % n_qt
    for (int it = 0; it < group * n_qt; it++) {
        const int h = kvh * group + it / n_qt, t0 = (first_qt + it % n_qt) * kF32Tile;
        const long bh = (long)b * NH + h;
        const float* q_g = qkv_b + h * HS;
        const float* do_g = dout + (long)b * Tn * C + h * HS;
        __syncthreads();
        for (int i = tid; i < kF32Tile * HS; i += kF32Threads) {
            const int r = i / HS, d = i % HS, t = t0 + r;
            sQ[r * (HS + 1) + d] = t < Tn ? q_g[(long)t * stride + d] : 0.0f;
            sO[r * (HS + 1) + d] = t < Tn ? do_g[(long)t * C + d] : 0.0f;
        }
        if (tid < kF32Tile) {
            const int t = t0 + tid;
            sL[tid] = t < Tn ? lse[bh * Tn + t] : 0.0f;
            sD[tid] = t < Tn ? Dvec[bh * Tn + t] : 0.0f;
        }
        __syncthreads();
        float s[RPW], dp[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++) s[i] = dp[i] = 0.0f;
        for (int d = 0; d < HS; d++) {
            const float qd = sQ[lane * (HS + 1) + d], od = sO[lane * (HS + 1) + d];
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                s[i] += sK[(warp * RPW + i) * HS + d] * qd;
                dp[i] += sV[(warp * RPW + i) * HS + d] * od;
            }
        }
        const int t = t0 + lane;
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const int key = k0 + warp * RPW + i;
            if (key >= Tn || t0 + kF32Tile - 1 < key) continue;  // warp-uniform
            const float p = (t >= key && t < Tn) ? expf(s[i] * scale - sL[lane]) : 0.0f;
            const float ds = p * (dp[i] - sD[lane]);
            for (int j = 0; j < kF32Tile; j++) {
                const float pj = __shfl_sync(0xffffffff, p, j), dsj = __shfl_sync(0xffffffff, ds, j);
#pragma unroll
                for (int d = 0; d < DPL; d++) {
                    dv[i][d] += pj * sO[j * (HS + 1) + lane + 32 * d];
                    dk[i][d] += dsj * sQ[j * (HS + 1) + lane + 32 * d];
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int key = k0 + warp * RPW + i;
        if (key >= Tn) continue;
        float* dst = dqkv + ((long)b * Tn + key) * stride + C + (long)kvh * HS;
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            dst[lane + 32 * d] = dk[i][d] * scale;
            dst[V + lane + 32 * d] = dv[i][d];
        }
    }
}

template <int HS> constexpr size_t fp32_fwd_smem_bytes() {
    return (kF32Rows * HS + kF32Tile * (HS + 1) + kF32Tile * HS) * sizeof(float);
}
template <int HS> constexpr size_t fp32_dq_smem_bytes() {
    return (2 * kF32Rows * HS + 2 * kF32Tile * (HS + 1)) * sizeof(float);
}
template <int HS> constexpr size_t fp32_dkdv_smem_bytes() {
    return (2 * kF32Rows * HS + 2 * kF32Tile * (HS + 1) + 2 * kF32Tile) * sizeof(float);
}

// Dynamic shared memory above 48 KB must be allowed per kernel before the launch.
template <typename Kernel> void set_smem(Kernel kernel, size_t bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// Scratch layout of the backward: D (B*NH*T floats, the Hopper backward has its own), the fp32 dQ buffer
// (B*NH*hopper_backward_padded_rows(T)*hs: the mma.sync backward uses its first B*NH*T*hs, the Hopper one whole
// 128-row blocks), the turn counters (B*NH*ceil(T/64) ints, one per query block), each 256-byte aligned; then,
// for the Hopper backward only, D and lse_log2 padded to whole 128-row blocks (B*NH*hopper_backward_padded_rows(T)
// floats each). All of them are per query head: the number of kv heads changes none.
inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }
inline size_t hopper_backward_padded_rows(int T) { return (size_t)ceil_div(T, 128) * 128; }
struct BackwardScratch {
    float* D;
    float* dq_accum;
    int* turn;
};
inline size_t backward_common_scratch_bytes(int B, int T, int NH, int hs) {
    const size_t bhtp = (size_t)B * NH * hopper_backward_padded_rows(T);
    return align256((size_t)B * NH * T * 4) + align256(bhtp * hs * 4) +
           align256((size_t)B * NH * ceil_div(T, kBwdBM) * sizeof(int));
}
inline BackwardScratch backward_scratch(void* scratch, int B, int T, int NH, int hs) {
    const size_t d_bytes = align256((size_t)B * NH * T * 4), bhtp = (size_t)B * NH * hopper_backward_padded_rows(T);
    char* p = static_cast<char*>(scratch);
    return {reinterpret_cast<float*>(p), reinterpret_cast<float*>(p + d_bytes), reinterpret_cast<int*>(p + d_bytes + align256(bhtp * hs * 4))};
}

// The mma.sync forward (bf16 / fp16), for every GPU from sm_80 on; Hopper takes flash_attention_hopper.cuh's.
template <typename floatX, int HS>
void forward_mma_sync(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int KVH, cudaStream_t stream) {
    using Cfg = FwdConfig<HS>;
    const int nqb = ceil_div(T, Cfg::BR);
    auto kernel = flash_forward_kernel<floatX, HS>;
    set_smem(kernel, Cfg::smem_bytes);
    kernel<<<(unsigned)((long)B * NH * nqb), Cfg::THREADS, Cfg::smem_bytes, stream>>>(out, lse, qkv, T, NH, KVH, nqb,
                                                                                    kLog2e / sqrtf((float)HS));
    cudaCheckLaunch();
}

namespace hopper {  // flash_attention_hopper.cuh, included at the end of this file
template <typename T, int HS, int NC> bool forward(T* out, float* lse, const T* qkv, int B, int Tn, int NH, int KVH, cudaStream_t stream);
}

template <typename floatX, int HS>
void forward_hs(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int KVH, cudaStream_t stream) {
    if constexpr (std::is_same<floatX, float>::value) {
        const int nqb = ceil_div(T, kF32Rows);
        auto kernel = flash_forward_fp32_kernel<HS>;
        set_smem(kernel, fp32_fwd_smem_bytes<HS>());
        kernel<<<(unsigned)((long)B * NH * nqb), kF32Threads, fp32_fwd_smem_bytes<HS>(), stream>>>(out, lse, qkv, T, NH, KVH, nqb,
                                                                                                   1.0f / sqrtf((float)HS));
        cudaCheckLaunch();
    } else {
        // Hopper built for sm_90a: wgmma / TMA kernel; anything else (or pointers TMA cannot take): mma.sync.
        // hs 64 from T = 2048 on takes three consumer warpgroups (192-row tiles); one H200, TFLOP/s NC=3 vs NC=2:
        // T 1024 289 vs 316, T 2048 387 vs 370 (B 32, 12 heads) and 372 vs 359 (B 16), T 4096 447 vs 424 with a
        // static stride through the tiles; with them claimed through a counter (as here; 2026-11) T 1024 290 vs
        // 322, T 4096 (B 16) 470-476 vs 436-437.
        bool done;
        if (HS == 64 && T >= 2048) done = hopper::forward<floatX, 64, 3>(out, lse, qkv, B, T, NH, KVH, stream);
        else done = hopper::forward<floatX, HS, 2>(out, lse, qkv, B, T, NH, KVH, stream);
        if (!done) forward_mma_sync<floatX, HS>(out, lse, qkv, B, T, NH, KVH, stream);
    }
}

// The mma.sync backward (bf16 / fp16), for every GPU from sm_80 on; Hopper takes flash_attention_hopper.cuh's.
template <typename floatX, int HS>
void backward_mma_sync(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                       void* scratch, int B, int T, int NH, int KVH, bool deterministic, cudaStream_t stream) {
    const float scale = 1.0f / sqrtf((float)HS);
    const BackwardScratch s = backward_scratch(scratch, B, T, NH, HS);
    const int nkb = ceil_div(T, kBwdBN), nqb = ceil_div(T, kBwdBM);
    backward_prep<floatX, HS>(s.D, nullptr, deterministic ? nullptr : s.dq_accum, deterministic ? s.turn : nullptr,
                              (long)B * NH * nqb, dout, out, lse, B, T, T, NH, stream);
    auto kernel = deterministic ? flash_backward_kernel<floatX, HS, true> : flash_backward_kernel<floatX, HS, false>;
    set_smem(kernel, bwd_smem_bytes<HS>());
    kernel<<<(unsigned)((long)B * KVH * nkb), kBwdThreads, bwd_smem_bytes<HS>(), stream>>>(
        dqkv, s.dq_accum, s.turn, dout, qkv, lse, s.D, T, NH, KVH, nkb, nqb, scale, scale * kLog2e);
    cudaCheckLaunch();
    if (!deterministic) {
        const long rows = (long)B * T * NH;
        constexpr int TPR = HS / Packed128<floatX>::size;
        flash_dq_convert_kernel<floatX, HS><<<ceil_div(rows * TPR, 256), 256, 0, stream>>>(dqkv, s.dq_accum, T, NH, KVH, rows, scale);
        cudaCheckLaunch();
    }
}

namespace hopper {
template <typename T, int HS>
bool backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* Dp, float* lse2p, float* dq_accum,
              int* turn, int B, int Tn, int NH, int KVH, bool deterministic, cudaStream_t stream);
}

template <typename floatX, int HS>
void backward_hs(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                 void* scratch, int B, int T, int NH, int KVH, bool deterministic, cudaStream_t stream) {
    const BackwardScratch s = backward_scratch(scratch, B, T, NH, HS);
    if constexpr (std::is_same<floatX, float>::value) {
        const float scale = 1.0f / sqrtf((float)HS);
        backward_prep<floatX, HS>(s.D, nullptr, nullptr, nullptr, 0, dout, out, lse, B, T, T, NH, stream);
        const int nqb = ceil_div(T, kF32Rows);
        auto dq_kernel = flash_backward_dq_fp32_kernel<HS>;
        set_smem(dq_kernel, fp32_dq_smem_bytes<HS>());
        dq_kernel<<<(unsigned)((long)B * NH * nqb), kF32Threads, fp32_dq_smem_bytes<HS>(), stream>>>(dqkv, dout, qkv, lse, s.D, T, NH, KVH, nqb, scale);
        cudaCheckLaunch();
        const int nkb = nqb;  // key blocks of the same 16 rows
        auto dkdv_kernel = flash_backward_dkdv_fp32_kernel<HS>;
        set_smem(dkdv_kernel, fp32_dkdv_smem_bytes<HS>());
        dkdv_kernel<<<(unsigned)((long)B * KVH * nkb), kF32Threads, fp32_dkdv_smem_bytes<HS>(), stream>>>(dqkv, dout, qkv, lse, s.D, T, NH, KVH,
                                                                                                         nkb, scale);
        cudaCheckLaunch();
    } else {
        // Hopper built for sm_90a: wgmma / TMA kernel, its padded D and lse_log2 after the common scratch;
        // anything else (or pointers TMA cannot take): mma.sync
        const size_t padded = (size_t)B * NH * hopper_backward_padded_rows(T);
        float* Dp = reinterpret_cast<float*>(static_cast<char*>(scratch) + backward_common_scratch_bytes(B, T, NH, HS));
        float* lse2p = reinterpret_cast<float*>(reinterpret_cast<char*>(Dp) + align256(padded * 4));
        if (!hopper::backward<floatX, HS>(dqkv, dout, qkv, out, lse, Dp, lse2p, s.dq_accum, s.turn, B, T, NH, KVH, deterministic, stream))
            backward_mma_sync<floatX, HS>(dqkv, dout, qkv, out, lse, scratch, B, T, NH, KVH, deterministic, stream);
    }
}

inline void unsupported_head_size(int hs) {
    die("flash attention supports head sizes 64 and 128, not " + std::to_string(hs));
}
inline void check_heads(int NH, int KVH) {
    if (KVH < 1 || NH % KVH != 0)
        die("flash attention: " + std::to_string(NH) + " query heads cannot share " + std::to_string(KVH) + " kv heads in equal groups");
}

}  // namespace flash

// out (B,T,NH*hs) and lse (B,NH,T) from qkv (B,T,(NH+2*KVH)*hs); NH a multiple of KVH (KVH = NH: multi-head).
template <typename floatX>
void flash_attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int KVH, int hs, cudaStream_t stream) {
    flash::check_heads(NH, KVH);
    if (hs == 64) flash::forward_hs<floatX, 64>(out, lse, qkv, B, T, NH, KVH, stream);
    else if (hs == 128) flash::forward_hs<floatX, 128>(out, lse, qkv, B, T, NH, KVH, stream);
    else flash::unsupported_head_size(hs);
}

// dqkv (qkv's layout), overwritten, from dout (B,T,NH*hs) and the forward's qkv, out and lse; a kv head's dK and
// dV sum over its group's query heads in a fixed order. deterministic = true adds the dQ parts of the key blocks
// in a fixed order too (bitwise reproducible); the fp32 path always is.
template <typename floatX>
void flash_attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                              void* scratch, int B, int T, int NH, int KVH, int hs, bool deterministic, cudaStream_t stream) {
    flash::check_heads(NH, KVH);
    if (hs == 64) flash::backward_hs<floatX, 64>(dqkv, dout, qkv, out, lse, scratch, B, T, NH, KVH, deterministic, stream);
    else if (hs == 128) flash::backward_hs<floatX, 128>(dqkv, dout, qkv, out, lse, scratch, B, T, NH, KVH, deterministic, stream);
    else flash::unsupported_head_size(hs);
}

// Bytes of `scratch` that flash_attention_backward needs (any precision, either mode). Backward calls that
// may overlap (other streams) need scratch of their own: it holds the deterministic mode's turn counters.
inline size_t flash_attention_backward_scratch_bytes(int B, int T, int NH, int KVH, int hs) {
    flash::check_heads(NH, KVH);
    return flash::backward_common_scratch_bytes(B, T, NH, hs) + 2 * flash::align256((size_t)B * NH * flash::hopper_backward_padded_rows(T) * 4);
}

#include "flash_attention_hopper.cuh"  // defines: flash::hopper::forward, flash::hopper::backward, flash::hopper::available
