// Hopper (sm_90a) forward and backward of the fused causal attention, FlashAttention-3 style (Shah et al.
// 2024): the same out, lse and dqkv as flash_attention.cuh's mma.sync kernels, for bf16 and fp16, head sizes 64
// and 128. Included at the end of flash_attention.cuh, whose forward and backward call these on a compute
// capability 9.x device when the binary holds sm_90a code (wgmma, TMA and setmaxnreg exist only there);
// everything else takes the mma.sync kernels. The backward is described above its kernel, below the forward.
// defines: flash::hopper::forward, flash::hopper::backward (and flash::hopper::available, which says whether
// they can run here)
//
// How the pipeline works. A persistent grid (one CTA per SM) walks a list of tiles of BM = 64 * NC query rows
// of one (b, head), longest first (the tiles closest to the end of the sequence see the most key blocks), in
// sections of heads whose K and V fit in 32 MB of L2 (the query heads of a kv head's group are consecutive, so
// that their tiles of a query block run side by side and read its K and V from L2). Each CTA starts with tile
// blockIdx.x and claims its next through an atomic counter, so that a CTA whose tiles ran short takes more of
// them: a static stride through the list (tile += gridDim.x) left the busiest CTA with 2-15% more key blocks than
// the mean at the benchmark's shapes, the least busy with 4-15% fewer. A CTA is NC + 1 warpgroups:
//   producer (warpgroup 0, one warp issues): TMA loads of the Q tile and of the key blocks (BN = 128 keys) of
//     its kv head's K and V into a ring of STAGES buffers, straight from the strided qkv (B,T,NH+2*KVH,hs)
//     through one tensor map (dims hs, NH+2*KVH, T, B: a dense 4-D view; rows past T come back as zeros). Each
//     buffer has a "full" mbarrier (the TMA's byte count completes it) and an "empty" one (one arrival per
//     consumer warp). K of block j is loaded before V of block j-1, the order in which they are used. It gives
//     its registers away (setmaxnreg.dec) to the consumers.
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
// NC = 3 (BM = 192, consumers at 160 registers) is FlashAttention-3's choice for hs 64 on long sequences;
// flash_attention.cuh dispatches it for hs 64 from T = 2048 on (measured faster there); at T = 1024 its 192-row
// tiles compute a third more masked and padded work than 128-row tiles and NC = 2 wins.
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
    // mbarriers: Q full[2], Q empty[2], then per stage K full, K empty, V full, V empty; then the tile index of
    // each Q buffer (the producer writes it before the buffer's "full" arrival)
    static constexpr int NUM_MBARS = 4 + 4 * STAGES;
    static constexpr uint32_t OFF_TILE = OFF_BAR + NUM_MBARS * 8;
    static constexpr size_t SMEM_BYTES = OFF_TILE + 2 * 4 + 1024;  // + slack to align the base
    // named barriers (0 is __syncthreads): the ping-pong ring, each warpgroup's epilogue
    static constexpr int BAR_SCHED = 1, BAR_EPILOGUE = 1 + NC;
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per CTA");
    static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * NC <= 65536, "register file");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---------------------------------------------------------------------------------------------
// PTX wrappers (sm_90a only); the mbarrier and bulk-copy ones are common.cuh's. `full` barriers count one arrival
// (the producer's expect_tx) plus the TMA's bytes, `empty` ones one arrival per consumer warp.

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

// Backward: D (64 x 64) (+)= A (64 x 16, shared, K-major) B (16 x 64, shared), B K-major (TB = 0: A B^T of two
// row-major tiles, as Q K^T) or MN-major (TB = 1: B transposed through the descriptor, as V in P V).
template <typename T, int TB> __device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t a, uint64_t b, int scale_d);
#define FLASH_WGMMA_SS64(T, TY, TB)                                                                                          \
    template <> __device__ __forceinline__ void wgmma_ss_n64<T, TB>(float (&d)[32], uint64_t a, uint64_t b, int scale_d) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                           \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " FLASH_D32 ", %32, %33, p, 1, 1, 0, " #TB ";\n}\n" \
                     : FLASH_ACC32(d)                                                                                        \
                     : "l"(a), "l"(b), "r"(scale_d));                                                                        \
    }
FLASH_WGMMA_SS64(__nv_bfloat16, "bf16", 0)
FLASH_WGMMA_SS64(__nv_bfloat16, "bf16", 1)
FLASH_WGMMA_SS64(__half, "f16", 0)
FLASH_WGMMA_SS64(__half, "f16", 1)
#undef FLASH_WGMMA_SS64
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

// O += P V for one warpgroup: p holds P as A fragments, one per 16 keys; v points at the stage's V. The k-steps
// FIRST .. FIRST + COUNT - 1 only (default all): the backward issues its dV product in two halves.
template <typename T, int HS, int BN, int FIRST = 0, int COUNT = BN / 16>
__device__ __forceinline__ void gemm_pv(float (&o)[HS / 2], const uint32_t (&p)[BN / 16][4], uint32_t v) {
    constexpr uint64_t bits = desc_bits(BN * 128, 1024);
#pragma unroll
    for (int kk = FIRST; kk < FIRST + COUNT; kk++) {
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

// Byte offset of 16-byte chunk c of row r in a tile of ROWS rows as the TMA lays it out with 128-byte swizzling:
// one 128-byte row per 64-column half (c / 8 picks the half), chunk c % 8 of row r at (c % 8) ^ (r % 8).
template <int ROWS> __device__ __forceinline__ uint32_t tma_chunk(int r, int c) {
    return (c / 8) * ROWS * 128 + swz<64>(r, c % 8);
}

// Tiles handed out so far beyond each CTA's first, over the current launch: the producers claim tiles
// gridDim.x + counter++, and the claim that takes the launch's last value (num_tiles - 1: every launch makes
// exactly num_tiles claims, one failing per CTA) sets it back to 0 for the next launch. One forward at a time per
// device, then: launches on one stream are ordered, and nothing here runs two forwards on two streams at once.
__device__ unsigned int forward_tiles_claimed;

// ---------------------------------------------------------------------------------------------
// The kernel. tm_q boxes 64 rows (one warpgroup's Q), tm_kv BN rows; both 64 values wide (one swizzle atom).
template <typename T, int HS, int NC>
__global__ void __launch_bounds__(Config<HS, NC>::THREADS, 1)
forward_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv, T* out, float* lse,
               int Tn, int NH, int KVH, int nqb, int num_tiles, int per_section, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = Config<HS, NC>;
    constexpr int BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES, HALVES = Cfg::HALVES;
    constexpr uint32_t KV_BYTES = Cfg::KV_BYTES;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
    unsigned char* smem = smem_raw + (base - raw);
    const uint32_t sQ = base + Cfg::OFF_Q, sK = base + Cfg::OFF_K, sV = base + Cfg::OFF_V, bars = base + Cfg::OFF_BAR;
    const uint32_t tile_of_buffer = base + Cfg::OFF_TILE;  // + 4 * buffer
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
        fence_mbarrier_init();  // visible to the TMA unit
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_q)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_kv)) : "memory");
    }
    __syncthreads();  // the last CTA-wide barrier: the producer's idle warps leave below

    if (wg == 0) {
        // ---- producer: one warp; lane 0 issues, the others follow its waits
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (tid >= 32) return;
        int it = 0;  // key blocks loaded so far over all tiles: block it uses stage it % STAGES
        for (int tile = blockIdx.x, ti = 0;; ti++) {
            const int qbuf = ti & 1;  // Q buffer of this tile, once the consumers are done with the tile two back
            if (tile >= num_tiles) {  // no tile left: tell the consumers through the buffer's tile index
                mbar_wait(q_empty(qbuf), ((ti >> 1) & 1) ^ 1);
                if (lane == 0) {
                    asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(tile_of_buffer + 4 * qbuf), "r"(tile) : "memory");
                    mbar_arrive(q_full(qbuf));
                }
                return;
            }
            // claim the next tile now, a tile ahead: the atomic's round trip hides behind this tile's loads
            int next = 0;
            if (lane == 0) {
                const unsigned claim = atomicAdd(&forward_tiles_claimed, 1u);
                if (claim == (unsigned)num_tiles - 1) atomicExch(&forward_tiles_claimed, 0u);
                next = (int)(gridDim.x + claim);
            }
            next = __shfl_sync(0xffffffff, next, 0);
            const Tile tl = tile_at(tile, nqb, heads, per_section);
            const int b = tl.bh / NH, h = tl.bh % NH, q0 = tl.qb * BM;
            const int kv = NH + kv_head(h, NH, KVH);  // the tensor map's head coordinate of its K (V: + KVH)
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
                        tma_load_4d(dst + hf * BN * 128, &tm_kv, full, hf * 64, kv + (which - 1) * KVH, n * BN, b);
                }
                __syncwarp();
            };
            load(1, nb - 1, it);
            mbar_wait(q_empty(qbuf), ((ti >> 1) & 1) ^ 1);  // the tile two back has staged its O in these rows
            if (lane == 0) {
                // before the arrival, which releases it to the consumers
                asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(tile_of_buffer + 4 * qbuf), "r"(tile) : "memory");
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
            tile = next;
        }
    }

    // ---- consumers: warpgroup cw owns query rows q0 + 64 cw .. q0 + 64 cw + 63 of each tile
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    const int cw = wg - 1, wtid = tid % 128, warp = wtid / 32, g = lane / 4, t = lane % 4;
    if (cw == 0) named_arrive(Cfg::BAR_SCHED, 256);  // the ping-pong token starts with warpgroup 0
    const int sched_own = Cfg::BAR_SCHED + cw, sched_next = Cfg::BAR_SCHED + (cw + 1) % NC;
    int it = 0;
    for (int ti = 0;; ti++) {
        const int qbuf = ti & 1;
        mbar_wait(q_full(qbuf), (ti >> 1) & 1);
        int tile;
        asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(tile) : "r"(tile_of_buffer + 4 * qbuf) : "memory");
        if (tile >= num_tiles) break;
        const Tile tl = tile_at(tile, nqb, heads, per_section);
        const int b = tl.bh / NH, h = tl.bh % NH, q0 = tl.qb * BM;
        const int nb = (min(q0 + BM, Tn) - 1) / BN + 1;
        const int nomask_max = (q0 + 1) / BN - 1;  // blocks <= this are below the diagonal of every row of the tile
        const int row0 = q0 + 64 * cw + 16 * warp + g;  // this thread's rows: row0 and row0 + 8
        const uint32_t q_addr = sQ + qbuf * Cfg::Q_BYTES + cw * 64 * 128;  // this warpgroup's rows, first half

        float o[HS / 2], s[BN / 2];
        uint32_t p[BN / 16][4];
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
#pragma unroll
        for (int i = 0; i < HS / 2; i++) o[i] = 0.0f;

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
                *reinterpret_cast<uint32_t*>(sO + tma_chunk<BM>(lr + 8 * r, c) + 4 * t) =
                    pack2<T>(o[4 * c + 2 * r] * inv[r], o[4 * c + 2 * r + 1] * inv[r]);
        named_sync(Cfg::BAR_EPILOGUE + cw, 128);
        constexpr int CPR = HS / 8;  // 16-byte chunks per row
        T* out_tile = out + ((long)b * Tn * NH + h) * HS;
#pragma unroll
        for (int i = 0; i < 64 * CPR / 128; i++) {
            const int idx = wtid + 128 * i, r = idx / CPR, c = idx % CPR, row = q0 + 64 * cw + r;
            if (row < Tn)
                *reinterpret_cast<uint4*>(out_tile + (long)row * NH * HS + c * 8) =
                    *reinterpret_cast<const uint4*>(sO + tma_chunk<BM>(r, c));
        }
        // the TMA (async proxy) writes these rows next: order this thread's generic accesses before it
        fence_proxy_async_shared();
        release(q_empty(qbuf), lane);
    }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// =============================================================================================
// Backward, FlashAttention-3 style. One CTA per key block of BN = 128 keys of one (b, kv head); K and V are
// loaded once (TMA) and stay in shared memory. Warpgroup 0 is the producer (one thread issues): for each query
// head of the kv head's group in turn and each of its query blocks of BM rows from the diagonal to T (in the
// order described at the kernel), the TMA loads of Q and dO and bulk copies of that block's lse and D into a ring
// of STAGES buffers; dK and dV accumulate over all of them. Two consumer warpgroups own 64 keys each and
// compute the transposed products, so that the matrices whose transposes the dK, dV products need sit in
// registers already in wgmma's A layout:
//   S^T  = K_w Q^T      (64 keys x BM, wgmma, both operands in shared memory)
//   dP^T = V_w dO^T     (the same)
//   P^T  = exp2(S^T * scale_log2 - lse_log2),  dS^T = P^T * (dP^T - D)   (fp32, registers)
//   dV_w += P^T dO,  dK_w += dS^T Q            (A = P^T, dS^T from registers as 16-bit fragments, B = dO, Q
//                                               from shared memory, transposed through the descriptor)
//   dQ   = dS K        (BM x hs: needs dS with queries as rows and all 128 keys, i.e. both warpgroups' parts:
//                       each writes its dS^T transposed to shared memory, a named barrier over both, then each
//                       computes one 64 x 64 tile of dQ by wgmma from shared memory)
// and stage the dQ block in shared memory; warp 1 of the producer warpgroup (the dQ writer) adds it to the fp32
// buffer with one bulk reduce-add (atomic mode; dq_convert_kernel then writes dQ), or in deterministic mode in a
// fixed order through the turn counters (lowest key block first, the first one storing), off the consumers'
// path; there the pair on a block's diagonal, which adds last, finishes it instead: its consumers add the lower
// pairs' fp32 sum (loaded into the staging buffer) to their own and stage 16-bit dQ, which the writer stores by
// TMA (no dq_convert_kernel). FlashAttention-3 takes the same S^T formulation and the same dQ writer. (The qkv
// bias gradient, dqkv's column sums, is the caller's: summed here by the producer warpgroup's idle warps, it
// lengthened every CTA by more than the separate pass over dqkv takes; one H200, 2026-11.)
// Those fp32 reductions in L2 bound the kernel (an H200 adds about 1.1 TB/s of them: without them the kernel
// ran 21-33% faster, with plain stores of the same bytes 14-28%), so CTAs come in clusters of two, key blocks 2p
// (the leader) and 2p + 1 (the follower) of one kv head: for each query block both see, the follower stores its dQ
// tile into a receive buffer of the leader through distributed shared memory, the leader adds its own, and one
// reduce-add of the sum goes to L2: half the traffic. The turn counters then order pairs.
// Tiles: BN = 128 keys, BM = 128 queries for hs 64 and 64 for hs 128. Registers of a consumer thread: dK and dV
// hs/2 fp32 each, S^T and dP^T BM/2 each, P^T and dS^T as fragments BM/4 each, dQ 32: hs 64 peaks at
// 32 + 32 + 64 + 64 = 192, hs 128 at 64 + 64 + 32 + 32 = 192 (of 232: the producer warpgroup keeps 40; at 24
// its TMA and writer warps spilled 16-56 bytes). Shared memory: K, V (BN x hs), two
// stages of Q and dO (BM x hs), two dS buffers (BM x 128, so that one barrier per query block suffices), lse
// and D, the fp32 dQ block the writer warp sends and the follower's one received: 227 KB (hs 64), 226 KB (hs 128).
// Rows of Q / dO past T are zero-filled by the TMA and their lse_log2 is +inf (written so by the prep kernel),
// so P = 0 and dS = 0 there; keys past T lie above the diagonal of every row < T and are masked.
template <int HS> struct BwdConfig {
    static_assert(HS == 64 || HS == 128, "head sizes 64 and 128");
    static constexpr int BN = 128;               // keys per CTA, 64 per consumer warpgroup
    static constexpr int BM = HS == 64 ? 128 : 64;  // query rows per block
    static constexpr int STAGES = 2;              // Q, dO, lse, D buffers in the ring
    static constexpr int THREADS = 384;           // producer + two consumer warpgroups
    static constexpr int HALVES = HS / 64;
    static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
    static constexpr uint32_t KV_BYTES = BN * HS * 2, QD_BYTES = BM * HS * 2, DS_BYTES = BM * BN * 2;
    // byte offsets from the 1024-aligned base; every tile a multiple of 1024 bytes (swizzle atoms)
    static constexpr uint32_t OFF_K = 0, OFF_V = KV_BYTES, OFF_Q = 2 * KV_BYTES, OFF_DO = OFF_Q + STAGES * QD_BYTES,
                              OFF_DS = OFF_DO + STAGES * QD_BYTES, OFF_LSE = OFF_DS + 2 * DS_BYTES,
                              OFF_D = OFF_LSE + STAGES * BM * 4, OFF_DQ = OFF_D + STAGES * BM * 4,
                              OFF_RECV = OFF_DQ + BM * HS * 4, OFF_BAR = OFF_RECV + BM * HS * 4;
    // the dQ of a query block (BM x hs fp32) staged for the bulk reduce: two 64 x 64 tiles (one per consumer
    // warpgroup) of 16 KB, each in the order of the accumulator fragment (see backward_kernel)
    static constexpr uint32_t DQ_BYTES = BM * HS * 4, DQ_TILE_FLOATS = 64 * 64;
    // mbarriers: K and V full, per stage full and empty, then the cluster pair's dQ hand-over: "partner dQ in"
    // (the leader's: the follower's tile has landed in its receive buffer) and "receive buffer free" (the
    // follower's), then "partial in" (deterministic mode: the lower pairs' fp32 sum of a block this pair finishes,
    // loaded into the staging buffer)
    static constexpr int NUM_MBARS = 1 + 2 * STAGES + 3;
    // slack to align the base to 1024 bytes: 960, not 1024, so that the two dS buffers, the staging and the
    // receive buffer fit (an sm_90 CTA's dynamic shared memory starts 1024-aligned, after the 1 KB the system
    // reserves, so none is needed; the kernel traps rather than overrun if a base ever needs more)
    static constexpr uint32_t ALIGN_SLACK = 960;
    static constexpr size_t SMEM_BYTES = OFF_BAR + NUM_MBARS * 8 + ALIGN_SLACK;
    static constexpr uint32_t STAGE_TX = 2 * QD_BYTES + 2 * BM * 4;  // bytes that complete a stage
    // named barriers: both consumer warpgroups (dS written), each warpgroup's epilogue, and between the
    // consumers and the dQ writer warp (288 threads): the dQ buffer full, and free again
    static constexpr int BAR_DS = 1, BAR_EPILOGUE = 2, BAR_DQ_FULL = 4, BAR_DQ_EMPTY = 5, DQ_SYNC_THREADS = 256 + 32;
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per CTA");
    // setmaxnreg moves registers within the CTA's allocation (168 per thread for 384 threads at one CTA per
    // SM): an increase past it would never be granted
    static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 256 <= 168 * THREADS, "register file");
    static_assert((BM / 64) * (HS / 64) == 2, "dQ of a query block = two 64 x 64 tiles, one per warpgroup");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// 1-D bulk copy / fp32 reduce-add shared -> global (one thread issues; 16-byte aligned, a multiple of 16 bytes),
// each closing its own bulk async-group. The reduce-add is atomic per element (fp32 add at L2, as red.add).
// wait_read: the shared-memory source may be overwritten; wait_done: the writes to global memory are performed.
__device__ __forceinline__ void bulk_store(float* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(reinterpret_cast<uint64_t>(dst)), "r"(src),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_reduce_add(float* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(reinterpret_cast<uint64_t>(dst)),
                 "r"(src), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_done() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// 4-D TMA box store from shared memory (the tensor map's swizzled layout), closing its own bulk async-group;
// rows past the tensor's end are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Four 8 x 8 16-bit matrices from registers in the mma fragment layout (register i: row lane / 4, columns
// 2 (lane % 4) and + 1 of matrix i) stored transposed: lane l gives the address of the 16-byte row l % 8 of
// matrix l / 8, which receives column l % 8 of the fragment.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
}
// The same, not transposed: lane l's address receives row l % 8 of matrix l / 8 as the fragment holds it.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]),
                 "r"(r[3])
                 : "memory");
}
// The CTA pair of a cluster of two: the same shared-memory offset in CTA `rank` of the cluster; an arrival on
// (or a 16-byte store completing transaction bytes of) an mbarrier in the other CTA; a wait that acquires at
// cluster scope what the other CTA released; all threads of both CTAs.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ void mbar_arrive_remote(uint32_t cluster_bar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
__device__ __forceinline__ void st_async_remote(uint32_t cluster_addr, float a, float b, float c, float d, uint32_t cluster_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(cluster_addr),
                 "f"(a), "f"(b), "f"(c), "f"(d), "r"(cluster_bar)
                 : "memory");
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Orders this thread's async-proxy (bulk) accesses to global memory with its generic ones (the turn counters).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// D (64 x N) = A B^T of two row-major 16-bit tiles in shared memory over the head dimension (K-major both):
// A's 64 rows at a, B's N rows at b, each stored as 64-column halves of A_ROWS / B_ROWS rows (hs 128: the
// second half A_ROWS * 128 / B_ROWS * 128 bytes further), as the TMA wrote them.
template <typename T, int HS, int A_ROWS, int N>
__device__ __forceinline__ void gemm_abt(float (&d)[N / 2], uint32_t a, uint32_t b) {
    constexpr uint64_t bits = desc_bits(16, 1024);
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        const uint32_t aa = a + (ks / 4) * A_ROWS * 128 + (ks % 4) * 32, bb = b + (ks / 4) * N * 128 + (ks % 4) * 32;
        if constexpr (N == 128) wgmma_ss_n128<T>(d, make_desc(bits, aa), make_desc(bits, bb), ks > 0);
        else wgmma_ss_n64<T, 0>(d, make_desc(bits, aa), make_desc(bits, bb), ks > 0);
    }
}

// dQ tile (64 x 64) = dS (64 rows at ds, 128 keys as two 64-key halves of BM rows) K (128 keys x 64 columns at
// k: key rows of 128 bytes, MN-major).
template <typename T, int BM, int BN>
__device__ __forceinline__ void gemm_dq(float (&d)[32], uint32_t ds, uint32_t k) {
    constexpr uint64_t a_bits = desc_bits(16, 1024), b_bits = desc_bits(BN * 128, 1024);
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++)
        wgmma_ss_n64<T, 1>(d, make_desc(a_bits, ds + (ks / 4) * BM * 128 + (ks % 4) * 32), make_desc(b_bits, k + ks * 16 * 128),
                           ks > 0);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The kernel. tm_q and tm_do box BM rows, tm_kv BN rows, all 64 values wide. Block order: sections of
// `per_section` kv heads whose group's Q, dO, lse, D and fp32 dQ fit in L2 (so that the pairs of a kv head, which
// all read those and add into the dQ, find them there), inside a section pair-major (a cluster is two consecutive
// blocks), from pair 0 up (longest first). Deterministic mode adds each query block's dQ in the same order, pair
// 0 first: a pair only waits for lower ones of its kv head, all launched before it.
template <typename T, int HS, bool DET>
__global__ void __launch_bounds__(BwdConfig<HS>::THREADS, 1)
backward_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_dq, T* dqkv, float* dq_accum,
                int* dq_turn, const float* lse2p, const float* Dp, int Tn, int Tpad, int NH, int KVH, int nkb, int nqb, int per_section,
                float scale, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = BwdConfig<HS>;
    constexpr int BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES, HALVES = Cfg::HALVES;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
    if (base - raw > Cfg::ALIGN_SLACK) __trap();
    unsigned char* smem = smem_raw + (base - raw);
    const uint32_t sK = base + Cfg::OFF_K, sV = base + Cfg::OFF_V, sQ = base + Cfg::OFF_Q, sdO = base + Cfg::OFF_DO,
                   sDS = base + Cfg::OFF_DS, bars = base + Cfg::OFF_BAR;
    const uint32_t kv_full = bars;
    auto q_full = [&](int st) { return bars + 8 * (1 + st); };
    auto q_empty = [&](int st) { return bars + 8 * (1 + STAGES + st); };
    const uint32_t partner_in = bars + 8 * (1 + 2 * STAGES), recv_free = partner_in + 8, partial_in = recv_free + 8;

    // Cluster pairs: CTA 0 (the leader) takes key block 2p, CTA 1 (the follower) 2p + 1 of the same kv head; a
    // key block past the last one (odd nkb) has no work.
    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
    const int npairs = (nkb + 1) / 2, kv_heads = (int)(gridDim.x / (2 * npairs));
    const int member = (int)(blockIdx.x & 1), slot = (int)(blockIdx.x >> 1);
    const int section = slot / (per_section * npairs), within = slot - section * per_section * npairs;
    const int in_section = min(per_section, kv_heads - section * per_section);
    const int pair = within / in_section;
    const int bkv = section * per_section + within % in_section, b = bkv / KVH, kvh = bkv % KVH, group = NH / KVH;
    const int kb = 2 * pair + member;
    const bool leader = member == 0, paired = kb / 2 * 2 + 1 < nkb;
    const int k0 = kb * BN, first_qb = k0 / BM, nq = nqb - first_qb;
    // Iteration n (of n_it) takes query head kvh * group + n / nq and its query block query_block(n % nq): the
    // group's heads in turn, each over its blocks as follows. Both CTAs of a pair see the shared query blocks (from
    // the follower's first one up) in the same order; the leader's own (diagonal) blocks below them come last, so
    // that the follower does not wait for them. In deterministic mode, where the pairs of a kv head add a block
    // from pair 0 up, every CTA goes from the last block down: a pair then meets each block at the same step as
    // the lower pairs (launched earlier) did, and the blocks it finishes come last. (Atomic mode keeps the upward
    // order: going down, ptxas spilled its hs 64 kernels.)
    const int n_it = group * nq;
    const int first_shared = (kb / 2 * 2 + 1) * BN / BM, nshared = paired ? nqb - first_shared : 0;
    auto is_shared = [&](int it) { return it < nshared; };
    auto query_block = [&](int it) { return DET ? nqb - 1 - it : is_shared(it) ? first_shared + it : first_qb + it - nshared; };
    // Deterministic mode: the pair on a query block's diagonal (the highest key block that sees it is its own)
    // adds last, so it finishes the block itself: it adds the lower pairs' fp32 sum, loaded into the staging
    // buffer, to its own, and writes dQ, with no dq_convert_kernel after.
    auto finishes = [&](int qb) { return DET && min(nkb - 1, (qb * BM + BM - 1) / BN) / 2 == pair; };
    if (tid == 0) {
        mbar_init(kv_full, 1);
        for (int st = 0; st < STAGES; st++) {
            mbar_init(q_full(st), 1);
            mbar_init(q_empty(st), 8);  // one arrival per consumer warp
        }
        mbar_init(partner_in, 1);  // armed with the tile's bytes by one leader consumer thread (here the first time)
        mbar_init(recv_free, 8);   // one arrival per leader consumer warp
        mbar_init(partial_in, 1);  // the dQ writer's expect_tx, then the bulk load's bytes
        if (leader && nshared > 0) mbar_arrive_expect_tx(partner_in, Cfg::DQ_BYTES);
        fence_mbarrier_init();
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_q)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_kv)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_do)) : "memory");
        if (DET) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_dq)) : "memory");
    }
    cluster_sync();  // both CTAs' barriers initialised before either touches the other's; the last CTA-wide barrier
    if (kb >= nkb) return;

    if (wg == 0) {
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (tid / 32 == 1) {
            // ---- dQ writer (warp 1; lane 0 issues), the leader's only: per query block, once both consumer
            // warpgroups have staged their dQ tiles (for a shared block, summed with the follower's), one bulk fp32
            // reduce-add of the whole block (contiguous in dq_accum) into global memory. Deterministic mode: first
            // wait for this block's turn (the lower pairs of the kv head have added theirs); the pair with no one
            // before it stores instead of adding (nothing to zero); after the add has been performed, hand the
            // block on. The waits stay off the consumers' path: they only stall if the buffer is still held when
            // they have the next block's dQ ready. A block this pair finishes (deterministic mode) comes staged as
            // two 16-bit tiles in the tensor map's layout instead: two TMA stores into dqkv; its lower pairs' fp32
            // sum goes into the staging buffer first, as soon as the buffer is free and they have all added theirs.
            if (!leader) return;
            // deterministic mode: until the lower pairs of the kv head, each of which sees every query block we
            // see, have added theirs to the block of turn counter `turn`
            auto wait_lower_pairs = [&](const int* turn) {
                while (ld_relaxed(turn) < pair) __nanosleep(64);
                fence_acq_rel();
                fence_proxy_async_global();
            };
            for (int n = 0; n < n_it; n++) {
                const int h = kvh * group + n / nq, qb = query_block(n % nq);
                const long bh = (long)b * NH + h;
                float* dq_block = dq_accum + (bh * nqb + qb) * (BM * HS);
                int* turn = dq_turn + bh * nqb + qb;  // deterministic mode: pairs that have added to this block
                const bool finished = finishes(qb);
                if (finished && pair > 0 && lane == 0) {
                    // the staging buffer is free (the previous block's copy has read it): the lower pairs' sum
                    wait_lower_pairs(turn);
                    mbar_arrive_expect_tx(partial_in, Cfg::DQ_BYTES);
                    bulk_load(base + Cfg::OFF_DQ, dq_block, Cfg::DQ_BYTES, partial_in);
                }
                __syncwarp();
                named_sync(Cfg::BAR_DQ_FULL, Cfg::DQ_SYNC_THREADS);
                if (finished) {
                    if (lane == 0) {
#pragma unroll
                        for (int tile = 0; tile < 2; tile++)
                            tma_store_4d(&tm_dq, base + Cfg::OFF_DQ + tile * (Cfg::DQ_TILE_FLOATS * 4), HS == 128 ? 64 * tile : 0, h,
                                         qb * BM + (BM == 128 ? 64 * tile : 0), b);
                        bulk_wait_read();
                    }
                    __syncwarp();
                } else if (lane == 0) {
                    if constexpr (DET) {
                        if (pair > 0) {
                            wait_lower_pairs(turn);
                            bulk_reduce_add(dq_block, base + Cfg::OFF_DQ, Cfg::DQ_BYTES);
                        } else {
                            bulk_store(dq_block, base + Cfg::OFF_DQ, Cfg::DQ_BYTES);
                        }
                    } else {
                        bulk_reduce_add(dq_block, base + Cfg::OFF_DQ, Cfg::DQ_BYTES);
                    }
                    bulk_wait_read();
                }
                __syncwarp();
                if (n + 1 < n_it) named_arrive(Cfg::BAR_DQ_EMPTY, Cfg::DQ_SYNC_THREADS);  // the buffer may be refilled
                if constexpr (DET) {
                    if (lane == 0 && !finished) {  // a finished block has no one after it
                        bulk_wait_done();
                        fence_proxy_async_global();
                        red_release_add(turn, 1);
                    }
                }
            }
            if (lane == 0) bulk_wait_done();
            return;
        }
        // ---- producer: thread 0 issues every load (warps 2 and 3 have nothing to do)
        if (tid != 0) return;
        mbar_arrive_expect_tx(kv_full, 2 * Cfg::KV_BYTES);
#pragma unroll
        for (int hf = 0; hf < HALVES; hf++) {
            tma_load_4d(sK + hf * BN * 128, &tm_kv, kv_full, hf * 64, NH + kvh, k0, b);
            tma_load_4d(sV + hf * BN * 128, &tm_kv, kv_full, hf * 64, NH + KVH + kvh, k0, b);
        }
        for (int n = 0; n < n_it; n++) {
            const int h = kvh * group + n / nq, st = n % STAGES, q0 = query_block(n % nq) * BM;
            const long bh = (long)b * NH + h;
            mbar_wait(q_empty(st), ((n / STAGES) & 1) ^ 1);
            const uint32_t full = q_full(st);
            mbar_arrive_expect_tx(full, Cfg::STAGE_TX);
#pragma unroll
            for (int hf = 0; hf < HALVES; hf++) {
                tma_load_4d(sQ + st * Cfg::QD_BYTES + hf * BM * 128, &tm_q, full, hf * 64, h, q0, b);
                tma_load_4d(sdO + st * Cfg::QD_BYTES + hf * BM * 128, &tm_do, full, hf * 64, h, q0, b);
            }
            bulk_load(base + Cfg::OFF_LSE + st * BM * 4, lse2p + bh * Tpad + q0, BM * 4, full);
            bulk_load(base + Cfg::OFF_D + st * BM * 4, Dp + bh * Tpad + q0, BM * 4, full);
        }
        return;
    }

    // ---- consumers: warpgroup cw owns keys k0 + 64 cw .. k0 + 64 cw + 63 (rows of dK, dV) and dQ tile cw
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    const int cw = wg - 1, wtid = tid % 128, warp = wtid / 32, g = lane / 4, t = lane % 4;
    const int lr = 16 * warp + g;                   // local row (key of S^T, dK, dV; query of dQ) of the thread's first row
    const int key0 = k0 + 64 * cw + lr;              // the thread's keys: key0 and key0 + 8
    const uint32_t k_rows = sK + cw * 64 * 128, v_rows = sV + cw * 64 * 128;  // this warpgroup's K, V rows
    // dQ tile cw: rows dq_r0.. of the query block, columns dq_c0.. (hs 64: two row halves; hs 128: two column halves)
    const int dq_r0 = BM == 128 ? 64 * cw : 0, dq_c0 = HS == 128 ? 64 * cw : 0;

    float dk[HS / 2], dv[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) dk[i] = dv[i] = 0.0f;
    int finished_blocks = 0;  // of this pair: the phases of "partial in"

    mbar_wait(kv_full, 0);
    for (int n = 0; n < n_it; n++) {
        const int it = n % nq, qb = query_block(it), q0 = qb * BM, st = n % STAGES;  // it: the block's place in its head
        const uint32_t q_st = sQ + st * Cfg::QD_BYTES, do_st = sdO + st * Cfg::QD_BYTES;
        const uint32_t ds_buf = sDS + (n & 1) * Cfg::DS_BYTES;
        const float* lse_s = reinterpret_cast<const float*>(smem + Cfg::OFF_LSE + st * BM * 4);
        const float* D_s = reinterpret_cast<const float*>(smem + Cfg::OFF_D + st * BM * 4);
        mbar_wait(q_full(st), (n / STAGES) & 1);

        // ---- S^T and dP^T
        float s[BM / 2], dp[BM / 2];
        wgmma_fence();
        gemm_abt<T, HS, BN, BM>(s, k_rows, q_st);
        wgmma_commit();
        gemm_abt<T, HS, BN, BM>(dp, v_rows, do_st);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(s);
        // P^T: register 4c + e is key key0 + 8 (e / 2), query q0 + 8c + 2t + e % 2. It goes straight to 16-bit
        // A fragments (pack2 of registers 4c + 2hr and 4c + 2hr + 1 is fragment [c / 2][2 (c % 2) + hr]), which
        // frees S^T's registers before dP^T's are needed; dS is computed from the rounded P, as in the mma.sync
        // backward.
        const bool masked = k0 + 64 * cw + 63 > q0;  // some key of this warpgroup is later than some query
        const int ahead = key0 - (q0 + 2 * t);
        uint32_t pp[BM / 16][4], pds[BM / 16][4];
#pragma unroll
        for (int c = 0; c < BM / 8; c++) {
            const float2 l2 = *reinterpret_cast<const float2*>(lse_s + 8 * c + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = 4 * c + e;
                s[i] = fast_exp2(fmaf(s[i], scale_log2, -((e & 1) ? l2.y : l2.x)));
                if (masked && ahead + 8 * (e >> 1) - 8 * c - (e & 1) > 0) s[i] = 0.0f;
            }
#pragma unroll
            for (int hr = 0; hr < 2; hr++) pp[c / 2][2 * (c % 2) + hr] = pack2<T>(s[4 * c + 2 * hr], s[4 * c + 2 * hr + 1]);
        }
        wgmma_wait<0>();
        fence_regs(dp);
        // dS^T = P^T (dP^T - D) as A fragments; dS also goes to shared memory transposed: row = query, the
        // warpgroup's 64 keys = its 128-byte half of the row (chunk (2 warp + hr) ^ (row % 8), key g in it).
        // Fragment [kk][e] (c = 2 kk + e / 2, hr = e % 2) is the 8 x 8 matrix keys 16 warp + 8 hr + 0..7 x queries
        // 8c + 0..7; transposed, its row j (query 8c + j) is exactly chunk (2 warp + hr) ^ j of row 8c + j: one
        // stmatrix.x4.trans per kk, lane l addressing row l % 8 of matrix e = l / 8.
        // In two halves of the query block: dV += P^T dO over the first half's queries runs on the tensor cores
        // while the second half's dS is computed (a running product's A fragments must not be accessed, and the
        // second half reads only its own).
        const int mi = lane >> 3, mj = lane & 7;
        const uint32_t ds_st = ds_buf + cw * BM * 128 + (8 * (mi >> 1) + mj) * 128 + (((2 * warp + (mi & 1)) ^ mj) << 4);
#pragma unroll
        for (int half = 0; half < 2; half++) {
#pragma unroll
            for (int c = half * (BM / 16); c < (half + 1) * (BM / 16); c++) {
                const float2 dd = *reinterpret_cast<const float2*>(D_s + 8 * c + 2 * t);
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const int i = 4 * c + 2 * hr;
                    const float2 p = unpack2<T>(pp[c / 2][2 * (c % 2) + hr]);
                    pds[c / 2][2 * (c % 2) + hr] = pack2<T>(p.x * (dp[i] - dd.x), p.y * (dp[i + 1] - dd.y));
                }
                if (c % 2 == 1) stmatrix_x4_trans(ds_st + (c / 2) * 16 * 128, pds[c / 2]);
            }
            wgmma_fence();
            if (half == 0) gemm_pv<T, HS, BM, 0, BM / 32>(dv, pp, do_st);
            else gemm_pv<T, HS, BM, BM / 32, BM / 32>(dv, pp, do_st);
            wgmma_commit();
        }
        // dS written by both warpgroups (generic proxy) before wgmma (async proxy) reads it. The buffer was last
        // read by the dQ products of iteration n - 2, which both warpgroups waited for before they wrote
        // iteration n - 1's dS and passed the barrier of n - 1.
        fence_proxy_async_shared();
        named_sync(Cfg::BAR_DS, 256);
        // ---- dQ tile = dS K, then dK += dS^T Q, which runs while the dQ tile is staged
        float dq[32];
        wgmma_fence();
        gemm_dq<T, BM, BN>(dq, ds_buf + dq_r0 * 128, sK + (dq_c0 / 64) * BN * 128);
        wgmma_commit();
        gemm_pv<T, HS, BM>(dk, pds, q_st);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(dq);

        // ---- dQ tile to the staging buffer in the order of the accumulator fragment: float4 c of thread wtid
        // (registers 4c .. 4c + 3: rows dq_r0 + lr and + 8, columns dq_c0 + 8c + 2t, + 1) at float4 index
        // 128 c + wtid of the warpgroup's 16 KB tile, so that a warp's stores cover 512 contiguous bytes (no bank
        // conflicts); dq_accum keeps this order (dq_convert_kernel undoes it). For a query block both CTAs of the
        // pair see, the follower stores its tile into the leader's receive buffer (st.async completing the
        // leader's "partner dQ in"), once the leader's consumer warps have read the previous one, and the leader
        // adds it to its own: one global reduce-add per pair, which halves the fp32 reduction traffic that bounds
        // this kernel. The staging buffer is free once the writer's bulk operation of the previous block has
        // read it. Every block the follower sees is shared: its iteration n is the pair's n-th shared block.
        const int dq_float4 = cw * (Cfg::DQ_TILE_FLOATS / 4) + wtid;
        if (!leader) {
            if (n > 0) mbar_wait<true>(recv_free, (n - 1) & 1);
            const uint32_t dst = cluster_map(base + Cfg::OFF_RECV, 0) + dq_float4 * 16, in = cluster_map(partner_in, 0);
#pragma unroll
            for (int c = 0; c < 8; c++) st_async_remote(dst + c * 128 * 16, dq[4 * c], dq[4 * c + 1], dq[4 * c + 2], dq[4 * c + 3], in);
        } else {
            if (is_shared(it)) {
                const int shared_index = n / nq * nshared + it;  // the pair's shared blocks before this one
                mbar_wait<true>(partner_in, shared_index & 1);
                const float4* recv = reinterpret_cast<const float4*>(smem + Cfg::OFF_RECV) + dq_float4;
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    const float4 f = recv[128 * c];
                    dq[4 * c] += f.x;
                    dq[4 * c + 1] += f.y;
                    dq[4 * c + 2] += f.z;
                    dq[4 * c + 3] += f.w;
                }
                if (shared_index + 1 < group * nshared) {
                    // arm the next tile's bytes (this phase is complete), then tell the follower that this warp is
                    // done with the buffer
                    if (tid == 128) mbar_arrive_expect_tx(partner_in, Cfg::DQ_BYTES);
                    __syncwarp();
                    if (lane == 0) mbar_arrive_remote(cluster_map(recv_free, 1));
                }
            }
            if (n > 0) named_sync(Cfg::BAR_DQ_EMPTY, Cfg::DQ_SYNC_THREADS);
            if (finishes(qb)) {
                // add the lower pairs' fp32 sum (the same sums as the reduce-add in L2 would make), then stage the
                // rounded, scaled dQ tile in the first half of this warpgroup's fp32 tile, in the layout of tm_dq
                if (pair > 0) {
                    mbar_wait(partial_in, finished_blocks & 1);
                    const float4* partial = reinterpret_cast<const float4*>(smem + Cfg::OFF_DQ) + dq_float4;
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        if (c == 4) asm volatile("" ::: "memory");  // four loads in flight at a time: no spill
                        const float4 f = partial[128 * c];
                        dq[4 * c] += f.x;
                        dq[4 * c + 1] += f.y;
                        dq[4 * c + 2] += f.z;
                        dq[4 * c + 3] += f.w;
                    }
                }
                finished_blocks++;
                named_sync(Cfg::BAR_EPILOGUE + cw, 128);  // the warpgroup has read its fp32 tile
                // four stmatrix.x4, k: 8 x 8 matrices m = (c - 2k) * 2 + hr of the fragment (rows 16 warp + 8 hr,
                // columns 8c); lane l addresses row l % 8 of matrix l / 8, at tma_chunk<64>(row, c)
                const int m = lane >> 3, row = 16 * warp + 8 * (m & 1) + (lane & 7);
                const uint32_t row_addr = base + Cfg::OFF_DQ + cw * (Cfg::DQ_TILE_FLOATS * 4) + row * 128;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    uint32_t r[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const int c = 2 * k + j / 2, hr = j % 2;
                        r[j] = pack2<T>(dq[4 * c + 2 * hr] * scale, dq[4 * c + 2 * hr + 1] * scale);
                    }
                    stmatrix_x4(row_addr + (((2 * k + (m >> 1)) ^ (lane & 7)) << 4), r);
                }
            } else {
                float4* dq_s = reinterpret_cast<float4*>(smem + Cfg::OFF_DQ) + dq_float4;
#pragma unroll
                for (int c = 0; c < 8; c++) dq_s[128 * c] = make_float4(dq[4 * c], dq[4 * c + 1], dq[4 * c + 2], dq[4 * c + 3]);
            }
            // generic-proxy writes before the bulk copy (async proxy) reads them, then tell the writer
            fence_proxy_async_shared();
            named_arrive(Cfg::BAR_DQ_FULL, Cfg::DQ_SYNC_THREADS);
        }
        wgmma_wait<0>();
        fence_regs(dv);
        fence_regs(dk);
        fence_regs(pp);
        fence_regs(pds);
        release(q_empty(st), lane);
    }
    // both warpgroups are past their last products (which read all of K)
    named_sync(Cfg::BAR_DS, 256);

    // ---- epilogue: dK (scaled) and dV staged in this warpgroup's own rows of the K and V tiles (the TMA's
    // layout, tma_chunk), then 16-byte stores
#pragma unroll
    for (int c = 0; c < HS / 8; c++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint32_t off = tma_chunk<BN>(cw * 64 + lr + 8 * r, c) + 4 * t;
            *reinterpret_cast<uint32_t*>(smem + Cfg::OFF_K + off) = pack2<T>(dk[4 * c + 2 * r] * scale, dk[4 * c + 2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(smem + Cfg::OFF_V + off) = pack2<T>(dv[4 * c + 2 * r], dv[4 * c + 2 * r + 1]);
        }
    named_sync(Cfg::BAR_EPILOGUE + cw, 128);
    constexpr int CPR = HS / 8;
    const long stride = (long)(NH + 2 * KVH) * HS;
    T* dk_g = dqkv + (long)b * Tn * stride + (long)(NH + kvh) * HS;
    T* dv_g = dk_g + (long)KVH * HS;
#pragma unroll
    for (int i = 0; i < 64 * CPR / 128; i++) {
        const int idx = wtid + 128 * i, r = cw * 64 + idx / CPR, c = idx % CPR, key = k0 + r;
        if (key < Tn) {
            const uint32_t off = tma_chunk<BN>(r, c);
            *reinterpret_cast<uint4*>(dk_g + (long)key * stride + c * 8) = *reinterpret_cast<const uint4*>(smem + Cfg::OFF_K + off);
            *reinterpret_cast<uint4*>(dv_g + (long)key * stride + c * 8) = *reinterpret_cast<const uint4*>(smem + Cfg::OFF_V + off);
        }
    }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// dQ (scaled) from dq_accum into its slice of dqkv. dq_accum holds, per (b, head) and query block of BM rows,
// two 64 x 64 fp32 tiles (hs 64: rows 0-63 and 64-127; hs 128: columns 0-63 and 64-127) in backward_kernel's
// fragment order (float4 c of thread w at float4 index 128 c + w: rows 16 (w / 32) + (w % 32) / 4 and + 8,
// columns 8c + 2 (w % 4), + 1). One CTA of 128 threads per tile: coalesced float4 reads, through shared
// memory back to rows, 16-byte stores of the rows < T.
template <typename T, int HS>
__global__ void __launch_bounds__(128) dq_convert_kernel(T* dqkv, const float* dq_accum, int Tn, int NH, int KVH, int nqb, float scale) {
    constexpr int BM = BwdConfig<HS>::BM, PITCH = 68;  // floats per staged row (16-byte aligned rows)
    constexpr int X = Packed128<T>::size;              // 8 values per 16-byte store
    __shared__ __align__(16) float tile[64 * PITCH];
    const long tile_idx = blockIdx.x;  // ((b * NH + h) * nqb + qb) * 2 + cw
    const int cw = (int)(tile_idx & 1);
    const long bq = tile_idx >> 1;
    const int qb = (int)(bq % nqb), bh = (int)(bq / nqb), b = bh / NH, h = bh % NH;
    const int w = threadIdx.x, lane = w % 32, g = lane / 4, t = lane % 4, lr = 16 * (w / 32) + g;
    const float4* src = reinterpret_cast<const float4*>(dq_accum + tile_idx * (64 * 64)) + w;
#pragma unroll
    for (int c = 0; c < 8; c++) {
        const float4 v = __ldcs(src + 128 * c);
        *reinterpret_cast<float2*>(tile + lr * PITCH + 8 * c + 2 * t) = make_float2(v.x, v.y);
        *reinterpret_cast<float2*>(tile + (lr + 8) * PITCH + 8 * c + 2 * t) = make_float2(v.z, v.w);
    }
    __syncthreads();
    const int row0 = qb * BM + (BM == 128 ? 64 * cw : 0), col0 = h * HS + (HS == 128 ? 64 * cw : 0);
    const long stride = (long)(NH + 2 * KVH) * HS;
    constexpr int CPR = 64 / X;  // 16-byte chunks of a tile row: a thread's chunk is always lane % CPR
#pragma unroll
    for (int k = 0; k < 64 * 64 / X / 128; k++) {
        const int idx = w + 128 * k, r = idx / CPR, ch = idx % CPR, row = row0 + r;
        if (row >= Tn) continue;
        Packed128<T> o;
#pragma unroll
        for (int i = 0; i < X; i += 4) {
            const float4 f = *reinterpret_cast<const float4*>(tile + r * PITCH + ch * X + i);
            o[i] = from_float<T>(f.x * scale);
            o[i + 1] = from_float<T>(f.y * scale);
            o[i + 2] = from_float<T>(f.z * scale);
            o[i + 3] = from_float<T>(f.w * scale);
        }
        store128(dqkv + ((long)b * Tn + row) * stride + col0 + ch * X, o);
    }
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

// A tensor map over qkv (B,T,NH+2*KVH,hs) as the dense 4-D array (hs, NH+2*KVH, T, B): the box of (64, 1, rows, 1)
// at (d0, head, t0, b) is `rows` rows of query head `head` (< NH), K of kv head head - NH or V of kv head
// head - NH - KVH, 64 values from d0, written to shared memory as rows of 128 bytes with the 128-byte swizzle.
// Rows at T or past it read as zeros. rows_tensor_map is the same over any (B,T,heads,hs) array: dout (B,T,NH,hs)
// with heads = NH.
template <typename T>
inline bool rows_tensor_map(CUtensorMap* map, const T* ptr, int B, int Tn, int heads, int hs, int rows) {
    const cuuint64_t dims[4] = {(cuuint64_t)hs, (cuuint64_t)heads, (cuuint64_t)Tn, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)hs * 2, (cuuint64_t)heads * hs * 2, (cuuint64_t)Tn * heads * hs * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, elem_strides[4] = {1, 1, 1, 1};
    const CUtensorMapDataType type = std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return encode_tiled()(map, type, 4, const_cast<T*>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
template <typename T>
inline bool qkv_tensor_map(CUtensorMap* map, const T* qkv, int B, int Tn, int NH, int KVH, int hs, int rows) {
    return rows_tensor_map(map, qkv, B, Tn, NH + 2 * KVH, hs, rows);
}

// Runs the Hopper forward with NC consumer warpgroups; false (nothing launched) where it cannot run: not an
// sm_90a build on a 9.x device, or pointers the TMA and the 16-byte stores cannot take.
template <typename T, int HS, int NC>
bool forward(T* out, float* lse, const T* qkv, int B, int Tn, int NH, int KVH, cudaStream_t stream) {
    static_assert(!std::is_same<T, float>::value, "the Hopper forward is for bf16 and fp16");
    using Cfg = Config<HS, NC>;
    if (!available() || reinterpret_cast<uintptr_t>(qkv) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) return false;
    CUtensorMap tm_q, tm_kv;
    if (!qkv_tensor_map(&tm_q, qkv, B, Tn, NH, KVH, HS, 64) || !qkv_tensor_map(&tm_kv, qkv, B, Tn, NH, KVH, HS, Cfg::BN)) return false;
    const int nqb = ceil_div(Tn, Cfg::BM), heads = B * NH, num_tiles = heads * nqb;
    // query heads per L2 section: a power of two whose K and V take at most 32 MB (a group's heads share theirs)
    const double kv_bytes = (double)Tn * HS * 2 * 2 / (NH / KVH);
    int per_section = 1;
    while (per_section * 2 * kv_bytes <= 32.0 * 1024 * 1024) per_section *= 2;
    const int grid = std::min(num_tiles, sm_count());
    auto kernel = forward_kernel<T, HS, NC>;
    set_smem(kernel, Cfg::SMEM_BYTES);
    kernel<<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(tm_q, tm_kv, out, lse, Tn, NH, KVH, nqb, num_tiles, per_section,
                                                           kLog2e / sqrtf((float)HS));
    cudaCheckLaunch();
    return true;
}

// The Hopper backward: dqkv (B,T,NH+2*KVH,hs) from dout, qkv, out and lse, as flash_attention_backward; scratch
// pointers from flash_attention.cuh's backward_hs: D and lse_log2 (B*NH*hopper_backward_padded_rows(T) each: whole
// query blocks), the fp32 dQ buffer (B*NH*hopper_backward_padded_rows(T)*hs: whole query blocks in fragment
// order), the turn counters (B*NH*ceil(T/64)). False (nothing launched) where it cannot run.
template <typename T, int HS>
bool backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* Dp, float* lse2p, float* dq_accum,
              int* turn, int B, int Tn, int NH, int KVH, bool deterministic, cudaStream_t stream) {
    static_assert(!std::is_same<T, float>::value, "the Hopper backward is for bf16 and fp16");
    using Cfg = BwdConfig<HS>;
    for (const void* p : {(const void*)dqkv, (const void*)dout, (const void*)qkv, (const void*)out})
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    if (!available()) return false;
    CUtensorMap tm_q, tm_kv, tm_do, tm_dq;
    if (!qkv_tensor_map(&tm_q, qkv, B, Tn, NH, KVH, HS, Cfg::BM) || !qkv_tensor_map(&tm_kv, qkv, B, Tn, NH, KVH, HS, Cfg::BN) ||
        !rows_tensor_map(&tm_do, dout, B, Tn, NH, HS, Cfg::BM) || !qkv_tensor_map(&tm_dq, dqkv, B, Tn, NH, KVH, HS, 64))
        return false;
    const int Tpad = (int)hopper_backward_padded_rows(Tn), nkb = ceil_div(Tn, Cfg::BN), nqb = ceil_div(Tn, Cfg::BM);
    const float scale = 1.0f / sqrtf((float)HS);
    // deterministic: the first key block of each query block stores its dQ (no zeroing), the turn counters start
    // at 0; atomic: every key block adds, into zeros (whole padded blocks: Tpad rows of hs)
    backward_prep<T, HS>(Dp, lse2p, deterministic ? nullptr : dq_accum, deterministic ? turn : nullptr, (long)B * NH * nqb, dout,
                         out, lse, B, Tn, Tpad, NH, stream);
    auto kernel = deterministic ? backward_kernel<T, HS, true> : backward_kernel<T, HS, false>;
    set_smem(kernel, Cfg::SMEM_BYTES);
    // kv heads per L2 section: what every pair of a kv head reads (its group's Q, dO, lse, D) and adds into (their
    // fp32 dQ) in 32 MB (on one H200, 32 and 48 MB ran forward + backward at T = 4096 5.5% faster than one section;
    // 8 MB 3% faster)
    const double kv_head_bytes = (double)(NH / KVH) * Tpad * (2 * HS * sizeof(T) + 2 * sizeof(float) + HS * sizeof(float));
    const int kv_heads = B * KVH, per_section = std::max(1, std::min(kv_heads, (int)(32.0 * 1024 * 1024 / kv_head_bytes)));
    // clusters of two CTAs: key blocks 2p and 2p + 1 of one kv head
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)((long)kv_heads * ((nkb + 1) / 2) * 2));
    config.blockDim = dim3(Cfg::THREADS);
    config.dynamicSmemBytes = Cfg::SMEM_BYTES;
    config.stream = stream;
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 2;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    cudaCheck(cudaLaunchKernelEx(&config, kernel, tm_q, tm_kv, tm_do, tm_dq, dqkv, dq_accum, turn, lse2p, Dp, Tn, Tpad, NH,
                                 KVH, nkb, nqb, per_section, scale, scale * kLog2e));
    if (!deterministic) {  // deterministic mode: the main kernel wrote dQ
        dq_convert_kernel<T, HS><<<(unsigned)((long)B * NH * nqb * 2), 128, 0, stream>>>(dqkv, dq_accum, Tn, NH, KVH, nqb, scale);
        cudaCheckLaunch();
    }
    return true;
}

}  // namespace hopper
}  // namespace flash
