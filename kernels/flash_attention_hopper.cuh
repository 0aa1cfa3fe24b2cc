// Hopper (sm_90a) forward of the fused causal attention, FlashAttention-3 style (Shah et al. 2024): the same
// out and lse as flash_attention.cuh's mma.sync forward, for bf16 and fp16, head sizes 64 and 128. Included at
// the end of flash_attention.cuh, whose forward calls it on a compute capability 9.x device when the binary
// holds sm_90a code (wgmma, TMA and setmaxnreg exist only there); everything else takes the mma.sync kernel.
// defines: flash::hopper::forward (and flash::hopper::available, which says whether it can run here)
//
// How the pipeline works. A persistent grid (one CTA per SM) walks a static list of tiles of BM = 64 * NC
// query rows of one (b, head), longest first (the tiles closest to the end of the sequence see the most key
// blocks), in sections of heads whose K and V fit in 32 MB of L2. A CTA is NC + 1 warpgroups:
//   producer (warpgroup 0, one warp issues): TMA loads of the Q tile and of the key blocks (BN = 128 keys) of
//     K and V into a ring of STAGES buffers, straight from the strided qkv (B,T,3,NH,hs) through one tensor map
//     (dims hs, 3*NH, T, B: a dense 4-D view; rows past T come back as zeros). Each buffer has a "full"
//     mbarrier (the TMA's byte count completes it) and an "empty" one (one arrival per consumer warp). K of
//     block j is loaded before V of block j-1, the order in which they are used. It gives its registers away
//     (setmaxnreg.dec) to the consumers.
//   consumers (NC warpgroups of 64 query rows each, setmaxnreg.inc): per key block, S = Q K^T by wgmma with
//     both operands in shared memory, the online softmax in fp32 registers (exp2 domain, running max and sum
//     per row), then O += P V by wgmma with P taken from registers (the S accumulators converted to 16 bits
//     are exactly wgmma's A-fragment layout) and V from shared memory (B transposed through the descriptor).
// Two overlaps hide the softmax behind the tensor cores:
//   within a warpgroup, step j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} together, then computes the
//     softmax of S_j while the second product still runs (wgmma.wait_group 1);
//   between warpgroups, named barriers pass a token round the ring (bar.sync on one's own barrier before
//     issuing the two products, bar.arrive on the next one's after): the warpgroups take turns on the tensor
//     cores, so one's softmax runs during the other's products (ping-pong).
// Key blocks run from the diagonal down; only those that cross the diagonal of some row of the tile are
// masked, the blocks above it are never loaded. Q is double-buffered (tiles alternate): the producer loads the
// next tile's Q while the consumers still work on this one. The epilogue normalises O by the row sums, stages
// it in the warpgroup's own rows of the finished Q buffer and writes it with 16-byte stores of the rows < T;
// lse = (m + log2 l) ln 2. Only then do the consumers release that Q buffer ("empty" mbarrier).
// Tile sizes (per CTA, H100/H200: 227 KB shared memory, 64K registers): NC = 2 (BM = 128) and BN = 128 for both
// head sizes. Registers: 128 producer threads at 24 and 256 consumer threads at 240 (64,512 of 65,536); a
// consumer holds O (hs/2 fp32), S (64 fp32) and P (32 packed) = 128 (hs 64) or 160 (hs 128) plus addresses.
// Shared memory: two Q buffers 128 x hs, two stages of K and V 128 x hs each: 96 KB (hs 64), 192 KB (hs 128).
// NC = 3 (BM = 192, consumers at 160 registers) is FlashAttention-3's choice for hs 64 on long sequences; it is
// kept as a template argument (bench_attention times it) but not dispatched: at T = 1024 its 192-row tiles
// compute a third more masked and padded work than 128-row tiles.
#pragma once
#include <atomic>
#include <cuda.h>          // CUtensorMap and its enums (the driver entry point is fetched at run time: no -lcuda)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

namespace flash {
namespace hopper {

template <int HS, int NC> struct Config {
    static_assert(HS == 64 || HS == 128, "head sizes 64 and 128");
    static_assert(NC == 2 || (NC == 3 && HS == 64), "two consumer warpgroups, or three for hs 64 (160 registers each)");
    static constexpr int BM = 64 * NC;      // query rows per tile, 64 per consumer warpgroup
    static constexpr int BN = 128;          // keys per block (the S product is one m64n128 wgmma per k-step)
    static constexpr int STAGES = 2;        // K and V buffers in the ring
    static constexpr int THREADS = 128 * (NC + 1);
    static constexpr int HALVES = HS / 64;  // a row of hs values = HALVES 128-byte swizzle atoms
    static constexpr int PRODUCER_REGS = NC == 2 ? 24 : 32, CONSUMER_REGS = NC == 2 ? 240 : 160;
    static constexpr uint32_t Q_BYTES = BM * HS * 2, KV_BYTES = BN * HS * 2;
    // byte offsets from the 1024-aligned base (the 128-byte swizzle repeats every 1024 bytes and both the TMA
    // and the wgmma descriptors apply it to absolute address bits): two Q buffers (tiles alternate), the K
    // and V rings
    static constexpr uint32_t OFF_Q = 0, OFF_K = OFF_Q + 2 * Q_BYTES, OFF_V = OFF_K + STAGES * KV_BYTES,
                              OFF_BAR = OFF_V + STAGES * KV_BYTES;
    // mbarriers: Q full[2], Q empty[2], then per stage K full, K empty, V full, V empty
    static constexpr int NUM_MBARS = 4 + 4 * STAGES;
    static constexpr size_t SMEM_BYTES = OFF_BAR + NUM_MBARS * 8 + 1024;  // + slack to align the base
    // named barriers (0 is __syncthreads): the ping-pong ring, each warpgroup's epilogue
    static constexpr int BAR_SCHED = 1, BAR_EPILOGUE = 1 + NC;
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per CTA");
    static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * NC <= 65536, "register file");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---------------------------------------------------------------------------------------------
// PTX wrappers (sm_90a only). mbarriers: `full` barriers count one arrival (the producer's expect_tx) plus
// the TMA's bytes, `empty` ones one arrival per consumer warp. A phase's parity alternates 0, 1, 0, ...; a
// wait on the parity of the phase before the first (1 on a fresh barrier) returns at once.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "LAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra LAB_WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// 4-D TMA box load into shared memory, completing `bar`'s transaction bytes.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// Named barriers over `count` threads (a multiple of 32): sync waits, arrive does not.
__device__ __forceinline__ void named_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }

template <int N> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// wgmma: fence before a warpgroup's products when registers they use were written by other instructions;
// commit closes a group of products; wait_group N returns when at most N groups are still running.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// The compiler does not know that a running wgmma owns its accumulators and A registers: this empty asm,
// placed after a wait, makes every later use of the registers depend on it (so none moves above the wait).
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(r[i][e])::"memory");
}

// Shared-memory matrix descriptors, 128-byte swizzle (layout type 1 in bits 62-63); fields in 16-byte units:
// start address in bits 0-13, leading byte offset (LBO) in 16-29, stride byte offset (SBO) in 32-45, base
// offset 0 (every start address used here has address bits 7-9 clear, i.e. sits at row 0 of a swizzle atom).
//   K-major (Q as A, K as B of S = Q K^T): rows of 64 values = 128 bytes, 8-row groups 1024 bytes apart (SBO);
//     LBO is unused by swizzled K-major layouts (1 by convention). A k-step of 16 moves the start 32 bytes
//     along the row; the hardware applies the swizzle to the final address, as the TMA did when writing.
//   MN-major (V as B of O = P V, transposed): each key is a 128-byte row of 64 head-dim values; 8-key groups
//     1024 bytes apart (SBO), the second 64-wide half of hs 128 LBO = BN * 128 bytes further. A k-step of 16
//     keys moves the start 2048 bytes.
__host__ __device__ constexpr uint64_t desc_bits(uint32_t lbo, uint32_t sbo) {
    return (1ull << 62) | ((uint64_t)(sbo >> 4) << 32) | ((uint64_t)(lbo >> 4) << 16);
}
__device__ __forceinline__ uint64_t make_desc(uint64_t bits, uint32_t smem_addr) { return bits | ((smem_addr & 0x3FFFF) >> 4); }

// The accumulator fragment of m64nNk16 (per warpgroup; warp w of the group owns rows 16w..16w+15): with
// g = lane / 4, t = lane % 4, register 4c + e holds row 16w + g + 8 (e / 2), column 8c + 2t + (e % 2), the
// mma.sync m16n8 C layout repeated over N / 8 column chunks. The register A fragment of one k-step (16 keys)
// is the mma.sync m16n8k16 A layout: {row g, k 2t..2t+1}, {row g+8, same}, {row g, k 2t+8..}, {row g+8, same}.
#define FLASH_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLASH_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FLASH_F8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FLASH_ACC32(d) FLASH_F8(d, 0), FLASH_F8(d, 8), FLASH_F8(d, 16), FLASH_F8(d, 24)
#define FLASH_ACC64(d) FLASH_ACC32(d), FLASH_F8(d, 32), FLASH_F8(d, 40), FLASH_F8(d, 48), FLASH_F8(d, 56)

// S (64 x 128) (+)= A (64 x 16, shared, K-major) B^T (128 x 16, shared, K-major); scale_d 0 overwrites S.
template <typename T> __device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t a, uint64_t b, int scale_d);
// O (64 x N) += A (64 x 16, registers) B (16 x N, shared, MN-major: transposed).
template <typename T> __device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b);
template <typename T> __device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b);

#define FLASH_WGMMA_DEFS(T, TY)                                                                                          \
    template <> __device__ __forceinline__ void wgmma_ss_n128<T>(float (&d)[64], uint64_t a, uint64_t b, int scale_d) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                       \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " FLASH_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n" \
                     : FLASH_ACC64(d)                                                                                    \
                     : "l"(a), "l"(b), "r"(scale_d));                                                                    \
    }                                                                                                                    \
    template <> __device__ __forceinline__ void wgmma_rs_n64<T>(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {   \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                       \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " FLASH_D32                              \
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                    \
                     : FLASH_ACC32(d)                                                                                    \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                                      \
    }                                                                                                                    \
    template <> __device__ __forceinline__ void wgmma_rs_n128<T>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {  \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                       \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " FLASH_D64                             \
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                    \
                     : FLASH_ACC64(d)                                                                                    \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                                      \
    }
FLASH_WGMMA_DEFS(__nv_bfloat16, "bf16")
FLASH_WGMMA_DEFS(__half, "f16")
#undef FLASH_WGMMA_DEFS
#undef FLASH_ACC64
#undef FLASH_ACC32
#undef FLASH_F8
#undef FLASH_D64
#undef FLASH_D32

// ---------------------------------------------------------------------------------------------
// A tile's place in the launch-wide list: sections of `per_section` heads (their K and V fit in L2), inside a
// section the query blocks from the last (longest) to the first, and the heads inside each query block.
struct Tile {
    int qb, bh;
};
__device__ __forceinline__ Tile tile_at(int tile, int nqb, int heads, int per_section) {
    const int section = tile / (per_section * nqb);
    const int within = tile - section * per_section * nqb;
    const int in_section = min(per_section, heads - section * per_section);
    return {nqb - 1 - within / in_section, section * per_section + within % in_section};
}

// S = Q K^T for one warpgroup: q and k point at the first 64-column half of the warpgroup's Q rows and of the
// stage's K; the second half (hs 128) sits BM * 128 (Q) and BN * 128 (K) bytes further.
template <typename T, int HS, int BM, int BN>
__device__ __forceinline__ void gemm_qk(float (&s)[BN / 2], uint32_t q, uint32_t k) {
    constexpr uint64_t bits = desc_bits(16, 1024);
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        const uint32_t qa = q + (ks / 4) * BM * 128 + (ks % 4) * 32, ka = k + (ks / 4) * BN * 128 + (ks % 4) * 32;
        wgmma_ss_n128<T>(s, make_desc(bits, qa), make_desc(bits, ka), ks > 0);
    }
}

// O += P V for one warpgroup: p holds P as A fragments, one per 16 keys; v points at the stage's V.
template <typename T, int HS, int BN>
__device__ __forceinline__ void gemm_pv(float (&o)[HS / 2], const uint32_t (&p)[BN / 16][4], uint32_t v) {
    constexpr uint64_t bits = desc_bits(BN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        if constexpr (HS == 64) wgmma_rs_n64<T>(o, p[kk], make_desc(bits, v + kk * 16 * 128));
        else wgmma_rs_n128<T>(o, p[kk], make_desc(bits, v + kk * 16 * 128));
    }
}

// Online softmax over one block of scores s (this thread's two rows, g and g + 8 of its warp's 16), scaled by
// scale_log2 into the exp2 domain. Leaves P = exp2(s * scale - m_new) in s, updates the running max m and the
// thread's partial row sums l, and returns in corr the factor the accumulated O must be multiplied by. A row
// with every score masked so far keeps m = -inf; its exponentials are taken against 0 instead (all give 0).
template <int NS>
__device__ __forceinline__ void softmax_update(float (&s)[NS], float (&m)[2], float (&l)[2], float (&corr)[2], float scale_log2) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < NS; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));  // the 4 threads of a quad share a row
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
        const float m_new = fmaxf(m[r], mx[r] * scale_log2);
        base[r] = m_new == -INFINITY ? 0.0f : m_new;
        corr[r] = fast_exp2(m[r] - base[r]);
        m[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NS; i++) {
        const int r = (i >> 1) & 1;
        s[i] = fast_exp2(fmaf(s[i], scale_log2, -base[r]));
        sum[r] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * corr[r] + sum[r];
}

// Causal mask of one block: score (row, key) with key > row becomes -inf. `ahead` = key of this thread's
// column 0 (block start + 2t) minus its first row; register 4c + e is column 8c + e%2, row + 8 (e/2).
template <int NS> __device__ __forceinline__ void mask_causal(float (&s)[NS], int ahead) {
#pragma unroll
    for (int i = 0; i < NS; i++)
        if (ahead + 8 * (i >> 2) + (i & 1) > 8 * ((i >> 1) & 1)) s[i] = -INFINITY;
}

// S accumulators (now P) to the A fragments of P V, rounded to 16 bits.
template <typename T, int BN> __device__ __forceinline__ void to_a_fragments(uint32_t (&p)[BN / 16][4], const float (&s)[BN / 2]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
        for (int e = 0; e < 4; e++) p[kk][e] = pack2<T>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
}

// Consumer warps give a buffer back: after their wgmma.wait_group, one arrival per warp.
__device__ __forceinline__ void release(uint32_t bar, int lane) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---------------------------------------------------------------------------------------------
// The kernel. tm_q boxes 64 rows (one warpgroup's Q), tm_kv BN rows; both 64 values wide (one swizzle atom).
template <typename T, int HS, int NC>
__global__ void __launch_bounds__(Config<HS, NC>::THREADS, 1)
forward_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv, T* out, float* lse,
               int Tn, int NH, int nqb, int num_tiles, int per_section, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = Config<HS, NC>;
    constexpr int BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES, HALVES = Cfg::HALVES;
    constexpr uint32_t KV_BYTES = Cfg::KV_BYTES;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
    unsigned char* smem = smem_raw + (base - raw);
    const uint32_t sQ = base + Cfg::OFF_Q, sK = base + Cfg::OFF_K, sV = base + Cfg::OFF_V, bars = base + Cfg::OFF_BAR;
    auto q_full = [&](int buf) { return bars + 8 * buf; };
    auto q_empty = [&](int buf) { return bars + 8 * (2 + buf); };
    auto k_full = [&](int st) { return bars + 8 * (4 + st); };
    auto k_empty = [&](int st) { return bars + 8 * (4 + STAGES + st); };
    auto v_full = [&](int st) { return bars + 8 * (4 + 2 * STAGES + st); };
    auto v_empty = [&](int st) { return bars + 8 * (4 + 3 * STAGES + st); };

    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
    const int heads = (int)(num_tiles / nqb);
    if (tid == 0) {
        for (int buf = 0; buf < 2; buf++) {
            mbar_init(q_full(buf), 1);
            mbar_init(q_empty(buf), 4 * NC);
        }
        for (int st = 0; st < STAGES; st++) {
            mbar_init(k_full(st), 1);
            mbar_init(v_full(st), 1);
            mbar_init(k_empty(st), 4 * NC);
            mbar_init(v_empty(st), 4 * NC);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_q)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_kv)) : "memory");
    }
    __syncthreads();  // the last CTA-wide barrier: the producer's idle warps leave below

    if (wg == 0) {
        // ---- producer: one warp; lane 0 issues, the others follow its waits
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (tid >= 32) return;
        int it = 0;  // key blocks loaded so far over all tiles: block it uses stage it % STAGES
        for (int tile = blockIdx.x, ti = 0; tile < num_tiles; tile += gridDim.x, ti++) {
            const Tile tl = tile_at(tile, nqb, heads, per_section);
            const int b = tl.bh / NH, h = tl.bh % NH, q0 = tl.qb * BM;
            const int nb = (min(q0 + BM, Tn) - 1) / BN + 1;  // key blocks up to the tile's last row
            // K (which = 1) or V (which = 2) of key block n into the stage of block counter i
            auto load = [&](int which, int n, int i) {
                const int st = i % STAGES;
                const uint32_t full = which == 1 ? k_full(st) : v_full(st);
                mbar_wait(which == 1 ? k_empty(st) : v_empty(st), ((i / STAGES) & 1) ^ 1);
                if (lane == 0) {
                    mbar_arrive_expect_tx(full, KV_BYTES);
                    const uint32_t dst = (which == 1 ? sK : sV) + st * KV_BYTES;
#pragma unroll
                    for (int hf = 0; hf < HALVES; hf++)
                        tma_load_4d(dst + hf * BN * 128, &tm_kv, full, hf * 64, which * NH + h, n * BN, b);
                }
                __syncwarp();
            };
            load(1, nb - 1, it);
            // Q buffer ti % 2, once the consumers are done with the tile two back (its rows staged their O)
            const int qbuf = ti & 1;
            mbar_wait(q_empty(qbuf), ((ti >> 1) & 1) ^ 1);
            if (lane == 0) {
                // a warpgroup whose rows all lie past T gets rows from T - 1 on (it computes rows nobody reads):
                // every box then starts inside the tensor
                mbar_arrive_expect_tx(q_full(qbuf), Cfg::Q_BYTES);
#pragma unroll
                for (int c = 0; c < NC; c++)
#pragma unroll
                    for (int hf = 0; hf < HALVES; hf++)
                        tma_load_4d(sQ + qbuf * Cfg::Q_BYTES + hf * BM * 128 + c * 64 * 128, &tm_q, q_full(qbuf), hf * 64, h,
                                    min(q0 + c * 64, Tn - 1), b);
            }
            __syncwarp();
            for (int j = 1; j < nb; j++) {
                load(1, nb - 1 - j, it + j);  // K of the next block first: S_j is issued before P_{j-1} V_{j-1}
                load(2, nb - j, it + j - 1);
            }
            load(2, 0, it + nb - 1);
            it += nb;
        }
        return;
    }

    // ---- consumers: warpgroup cw owns query rows q0 + 64 cw .. q0 + 64 cw + 63 of each tile
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    const int cw = wg - 1, wtid = tid % 128, warp = wtid / 32, g = lane / 4, t = lane % 4;
    if (cw == 0) named_arrive(Cfg::BAR_SCHED, 256);  // the ping-pong token starts with warpgroup 0
    const int sched_own = Cfg::BAR_SCHED + cw, sched_next = Cfg::BAR_SCHED + (cw + 1) % NC;
    int it = 0;
    for (int tile = blockIdx.x, ti = 0; tile < num_tiles; tile += gridDim.x, ti++) {
        const Tile tl = tile_at(tile, nqb, heads, per_section);
        const int b = tl.bh / NH, h = tl.bh % NH, q0 = tl.qb * BM;
        const int nb = (min(q0 + BM, Tn) - 1) / BN + 1;
        const int nomask_max = (q0 + 1) / BN - 1;  // blocks <= this are below the diagonal of every row of the tile
        const int row0 = q0 + 64 * cw + 16 * warp + g;  // this thread's rows: row0 and row0 + 8
        const int qbuf = ti & 1;
        const uint32_t q_addr = sQ + qbuf * Cfg::Q_BYTES + cw * 64 * 128;  // this warpgroup's rows, first half

        float o[HS / 2], s[BN / 2];
        uint32_t p[BN / 16][4];
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
#pragma unroll
        for (int i = 0; i < HS / 2; i++) o[i] = 0.0f;

        mbar_wait(q_full(qbuf), (ti >> 1) & 1);
        {  // first block (the diagonal one): S, softmax, P
            const int st = it % STAGES;
            mbar_wait(k_full(st), (it / STAGES) & 1);
            wgmma_fence();
            gemm_qk<T, HS, BM, BN>(s, q_addr, sK + st * KV_BYTES);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(s);
            release(k_empty(st), lane);
            if (nb - 1 > nomask_max) mask_causal(s, (nb - 1) * BN + 2 * t - row0);
            softmax_update(s, m, l, corr, scale_log2);
            to_a_fragments<T, BN>(p, s);
        }
        for (int j = 1; j < nb; j++) {
            const int n = nb - 1 - j, ik = it + j, iv = it + j - 1;
            const int stk = ik % STAGES, stv = iv % STAGES;
            mbar_wait(k_full(stk), (ik / STAGES) & 1);
            named_sync(sched_own, 256);  // our turn on the tensor cores
            wgmma_fence();
            gemm_qk<T, HS, BM, BN>(s, q_addr, sK + stk * KV_BYTES);
            wgmma_commit();
            mbar_wait(v_full(stv), (iv / STAGES) & 1);
            wgmma_fence();
            gemm_pv<T, HS, BN>(o, p, sV + stv * KV_BYTES);
            wgmma_commit();
            named_arrive(sched_next, 256);  // the next warpgroup's turn
            wgmma_wait<1>();  // S_j is done, P_{j-1} V_{j-1} may still run
            fence_regs(s);
            release(k_empty(stk), lane);
            if (n > nomask_max) mask_causal(s, n * BN + 2 * t - row0);
            softmax_update(s, m, l, corr, scale_log2);
            wgmma_wait<0>();
            fence_regs(o);
            fence_regs(p);
            release(v_empty(stv), lane);
            to_a_fragments<T, BN>(p, s);
#pragma unroll
            for (int i = 0; i < HS / 2; i++) o[i] *= corr[(i >> 1) & 1];
        }
        {  // last P V
            const int iv = it + nb - 1, stv = iv % STAGES;
            mbar_wait(v_full(stv), (iv / STAGES) & 1);
            wgmma_fence();
            gemm_pv<T, HS, BN>(o, p, sV + stv * KV_BYTES);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(o);
            fence_regs(p);
            release(v_empty(stv), lane);
        }
        it += nb;

        // ---- epilogue: O / l staged in this warpgroup's own Q rows (read by no one else, and not reloaded
        // before q_empty says so), laid out as the TMA wrote them: 128-byte rows per 64-column half, 16-byte
        // chunk c of row r at chunk c ^ (r % 8), conflict-free for the fragment writes and the row reads;
        // then 16-byte stores of the rows < T.
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
            inv[r] = 1.0f / l[r];
            const int row = row0 + 8 * r;
            if (t == 0 && row < Tn) lse[(long)tl.bh * Tn + row] = (m[r] + log2f(l[r])) * kLn2;
        }
        unsigned char* sO = smem + (q_addr - base);
        named_sync(Cfg::BAR_EPILOGUE + cw, 128);  // all four warps are past their products that read these rows
        const int lr = 16 * warp + g;            // local row of the first of the thread's two rows
#pragma unroll
        for (int c = 0; c < HS / 8; c++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                *reinterpret_cast<uint32_t*>(sO + (c / 8) * BM * 128 + (lr + 8 * r) * 128 + (((c % 8) ^ g) << 4) + 4 * t) =
                    pack2<T>(o[4 * c + 2 * r] * inv[r], o[4 * c + 2 * r + 1] * inv[r]);
        named_sync(Cfg::BAR_EPILOGUE + cw, 128);
        constexpr int CPR = HS / 8;  // 16-byte chunks per row
        T* out_tile = out + ((long)b * Tn * NH + h) * HS;
#pragma unroll
        for (int i = 0; i < 64 * CPR / 128; i++) {
            const int idx = wtid + 128 * i, r = idx / CPR, c = idx % CPR, row = q0 + 64 * cw + r;
            if (row < Tn)
                *reinterpret_cast<uint4*>(out_tile + (long)row * NH * HS + c * 8) =
                    *reinterpret_cast<const uint4*>(sO + (c / 8) * BM * 128 + r * 128 + (((c % 8) ^ (r & 7)) << 4));
        }
        // the TMA (async proxy) writes these rows next: order this thread's generic accesses before it
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        release(q_empty(qbuf), lane);
    }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ---------------------------------------------------------------------------------------------
// Host side.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__global__ void probe_kernel(int* flag) { *flag = 1; }
#else
__global__ void probe_kernel(int* flag) { *flag = 0; }
#endif

// cuTensorMapEncodeTiled from the driver, through the runtime (no -lcuda at link time).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found;
        const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
        if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            return (PFN_cuTensorMapEncodeTiled_v12000) nullptr;
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// Whether the Hopper forward can run on the current device: compute capability 9.x, and this binary's code
// for it was compiled for sm_90a (a probe kernel reports which variant the device loaded: an sm_80 build, or
// PTX of another target JIT-compiled here, has no wgmma). Asked once per device, then cached.
inline bool available() {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> known[kMaxDevices];  // 0 not asked yet, 1 no, 2 yes
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    if (dev >= kMaxDevices) return false;
    if (const int k = known[dev].load()) return k == 2;
    int major = 0, ok = 0;
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major == 9 && encode_tiled() != nullptr) {
        int* flag = nullptr;
        cudaCheck(cudaMalloc(&flag, sizeof(int)));
        cudaCheck(cudaMemset(flag, 0, sizeof(int)));
        probe_kernel<<<1, 1>>>(flag);
        if (cudaGetLastError() == cudaSuccess) cudaCheck(cudaMemcpy(&ok, flag, sizeof(int), cudaMemcpyDeviceToHost));
        cudaCheck(cudaFree(flag));
    }
    known[dev].store(ok == 1 ? 2 : 1);
    return ok == 1;
}

inline int sm_count() {
    int dev = 0, n = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
}

// A tensor map over qkv (B,T,3,NH,hs) as the dense 4-D array (hs, 3*NH, T, B): the box of (64, 1, rows, 1) at
// (d0, s*NH + h, t0, b) is `rows` rows of Q (s = 0), K (1) or V (2) of head h, 64 values from d0, written to
// shared memory as rows of 128 bytes with the 128-byte swizzle. Rows at T or past it read as zeros.
template <typename T>
inline bool qkv_tensor_map(CUtensorMap* map, const T* qkv, int B, int Tn, int NH, int hs, int rows) {
    const cuuint64_t dims[4] = {(cuuint64_t)hs, (cuuint64_t)3 * NH, (cuuint64_t)Tn, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)hs * 2, (cuuint64_t)3 * NH * hs * 2, (cuuint64_t)Tn * 3 * NH * hs * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, elem_strides[4] = {1, 1, 1, 1};
    const CUtensorMapDataType type = std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return encode_tiled()(map, type, 4, const_cast<T*>(qkv), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Runs the Hopper forward with NC consumer warpgroups; false (nothing launched) where it cannot run: not an
// sm_90a build on a 9.x device, or pointers the TMA and the 16-byte stores cannot take.
template <typename T, int HS, int NC>
bool forward(T* out, float* lse, const T* qkv, int B, int Tn, int NH, cudaStream_t stream) {
    static_assert(!std::is_same<T, float>::value, "the Hopper forward is for bf16 and fp16");
    using Cfg = Config<HS, NC>;
    if (!available() || reinterpret_cast<uintptr_t>(qkv) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) return false;
    CUtensorMap tm_q, tm_kv;
    if (!qkv_tensor_map(&tm_q, qkv, B, Tn, NH, HS, 64) || !qkv_tensor_map(&tm_kv, qkv, B, Tn, NH, HS, Cfg::BN)) return false;
    const int nqb = ceil_div(Tn, Cfg::BM), heads = B * NH, num_tiles = heads * nqb;
    // heads per L2 section: a power of two whose K and V take at most 32 MB
    const double kv_bytes = (double)Tn * HS * 2 * 2;
    int per_section = 1;
    while (per_section * 2 * kv_bytes <= 32.0 * 1024 * 1024) per_section *= 2;
    const int grid = std::min(num_tiles, sm_count());
    auto kernel = forward_kernel<T, HS, NC>;
    set_smem(kernel, Cfg::SMEM_BYTES);
    kernel<<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(tm_q, tm_kv, out, lse, Tn, NH, nqb, num_tiles, per_section,
                                                           kLog2e / sqrtf((float)HS));
    cudaCheckLaunch();
    return true;
}

}  // namespace hopper
}  // namespace flash
