// Products with a frozen NF4 weight (QLoRA's base, kernels/nf4.cuh), dequantized inside the product: no bf16 copy of
// the weight is ever written to global memory. W is an Nf4DeviceWeight of shape [OC, IC] (nn.Linear's layout):
//   nf4_matmul_forward:        out[N, OC] = x[N, IC] W^T (+ bias[OC], added to the fp32 sums before the rounding)
//   nf4_matmul_backward_input: dx[N, IC]  = dout[N, OC] W   (overwriting dx, or adding into it: `accumulate`)
// (the frozen base has no weight gradient). Activations and outputs are bf16, row-major; the products accumulate in
// fp32 on tensor cores (mma.sync m16n8k16, sm_80 and later) and round to bf16 once, at the end.
// Each W value the tensor cores see is bitwise dequantize_nf4_device<__nv_bfloat16>'s: NF4[code] * absmax rounded to
// fp32 (absmax = DYNAMIC[code8] * nested + offset, rounded after the product and after the sum, when double-quantized),
// then to bf16, with __fmul_rn / __fadd_rn as that kernel has them.
// Tiles: a CTA of 8 warps computes a 128 x 128 output tile over k-tiles of 64. Per k-tile the activation tile
// (128 x 64 bf16) and the weight's packed tile (128 NF4 blocks: 4 KB of codes and their absmaxes, or absmax codes and
// nested absmaxes) arrive by cp.async in a 3-stage ring, the weight's one k-tile ahead of the activation's; the codes
// are dequantized into a double-buffered bf16 tile in shared memory, one k-tile ahead of the MMAs, so one barrier a
// k-tile suffices. Both operands are XOR-swizzled and read by ldmatrix (flash_attention.cuh's helpers); a warp owns 64
// output rows x 32 columns (64 fp32 accumulators a thread).
// Limits: IC and OC positive multiples of 64 (every weight of the NF4 base: qkv, attproj, fc, fcproj of the model
// shapes here), so an NF4 block (64 consecutive weights of a row) never straddles a tile; N any positive count (rows
// past N are zero-filled and never stored: sampling's few rows too); a partial last tile (N, or a width of 64 modulo
// 128) is masked. Operand and output pointers 16-byte aligned; the weight's arrays as upload_nf4 / allocate_nf4 / the
// NF4 base allocate them (codes 16-byte, absmax codes and absmaxes 4-byte aligned). Anything else is refused in one
// line before any CUDA call. A small N under-fills the GPU (one row tile of CTAs; no split over k): forwards of at most
// kNf4SmallRows rows run a small-rows kernel instead (a warp per output feature). The model takes these or dequantize +
// cuBLASLt by --nf4-products (model/nf4.h's Nf4Products); bench/bench_nf4.cu times them against each other.
// defines: nf4_matmul_shape_problem, nf4_matmul_forward, nf4_matmul_backward_input
#pragma once
#include <climits>
#include <string>
#include "common.cuh"
#include "flash_attention.cuh"  // flash:: cp.async, ldmatrix, mma.sync wrappers, the swizzled tile layout, set_smem
#include "nf4.cuh"              // Nf4DeviceWeight, Nf4Tables, nf4_tables

// Forwards of at most this many rows take the small-rows kernel.
constexpr int kNf4SmallRows = 8;

namespace nf4mm {

using flash::cp_async16;
using flash::cp_async4;
using flash::cp_async_commit;
using flash::cp_async_wait;
using flash::ldsm_x4;
using flash::ldsm_x4_trans;
using flash::smem_u32;
using flash::swz;

constexpr int kThreads = 256, kBM = 128, kBN = 128, kBK = 64, kStages = 3;
constexpr int kWarpRows = 64, kWarpCols = 32;  // 2 x 4 warps
constexpr int kTileBlocks = kBN * kBK / (int)kNf4BlockSize;  // NF4 blocks in a weight tile (128)
constexpr int kPackedTileBytes = kBN * kBK / 2;              // their codes (4 KB)
static_assert(kNf4BlockSize == 64 && kBK == 64, "weight tiles of whole NF4 blocks: a forward k-tile is one block wide");
static_assert(kPackedTileBytes == 16 * kThreads, "one 16-byte vector of codes a thread: each dequantizes what it loaded");
static_assert(2 * kTileBlocks == kThreads, "two threads per NF4 block (32 weights each)");
static_assert((kBM / kWarpRows) * (kBN / kWarpCols) * 32 == kThreads, "warp grid");

// Dynamic shared memory (byte offsets); every tile 1024-aligned for the swizzle's XOR addressing.
constexpr uint32_t kATileBytes = kBM * kBK * 2, kWTileBytes = kBN * kBK * 2;
constexpr uint32_t kOffA = 0;                                       // activation tiles, kStages
constexpr uint32_t kOffW = kOffA + kStages * kATileBytes;           // dequantized bf16 weight tiles, 2
constexpr uint32_t kOffPacked = kOffW + 2 * kWTileBytes;            // packed codes, kStages
constexpr uint32_t kOffScale = kOffPacked + kStages * kPackedTileBytes;  // per block: fp32 absmax, or the 4-byte word
                                                                        // holding its 8-bit absmax code; kStages
constexpr uint32_t kOffNested = kOffScale + kStages * kTileBlocks * 4;  // per block: its nested absmax; kStages
constexpr uint32_t kOffNf4 = kOffNested + kStages * kTileBlocks * 4;    // NF4's 16 values
constexpr uint32_t kOffDynamic = kOffNf4 + 16 * 4;                     // the dynamic map's 256
constexpr size_t kSmemBytes = kOffDynamic + 256 * 4;                   // 98368: two CTAs an SM on H100 / H200

// The weight tile of a k-tile in W's own layout: WR rows (of OC) x WC columns (of IC), starting at (row0, col0); WC a
// multiple of 64, so it holds WR * WC / 64 whole NF4 blocks. Forward: WR = kBN output features x WC = kBK inputs;
// backward: WR = kBK output features (the reduction) x WC = kBN inputs. Rows at or past rows_end, columns at or past
// cols_end (a partial last tile) are zero-filled: finite values whose products land in outputs never stored.
template <int WR, int WC> struct WeightTile {
    static constexpr int kRowBytes = WC / 2, kBlocksPerRow = WC / 64, kThreadsPerRow = WC / 32;
    static_assert(WR * WC == kBN * kBK, "both weight tiles hold kTileBlocks blocks");
};

struct Nf4Operand {
    const uint8_t* packed;
    const float* absmax;          // single quantization
    const uint8_t* absmax_codes;  // double
    const float* nested_absmax;   // double
    float absmax_offset;          // double
};

// NF4 block index of tile block i (row-major over the tile's WR x WC / 64 blocks).
template <int WR, int WC>
__device__ __forceinline__ long tile_block(int i, int row0, int col0, long IC) {
    using T = WeightTile<WR, WC>;
    return ((long)(row0 + i / T::kBlocksPerRow) * IC + col0) / 64 + i % T::kBlocksPerRow;
}

// cp.async of a weight tile's codes (thread t: bytes 16t .. 16t + 15 of the tile, row-major) and of what its blocks'
// absmaxes are made of (threads 0..127: the fp32 absmax, or the aligned 4-byte word holding the 8-bit absmax code:
// cp.async moves 4 bytes at least, and a weight's block count is a multiple of 64 here, so the word is inside the
// array; threads 128..255: the nested absmax).
template <int WR, int WC, bool kDoubleQuant>
__device__ __forceinline__ void load_weight_tile(uint32_t packed_s, uint32_t scale_s, uint32_t nested_s, const Nf4Operand& w,
                                                 int row0, int col0, int rows_end, int cols_end, long IC, int tid) {
    using T = WeightTile<WR, WC>;
    {
        const int r = tid / (T::kRowBytes / 16), byte = tid % (T::kRowBytes / 16) * 16;
        const bool valid = row0 + r < rows_end && col0 + 2 * byte < cols_end;
        const uint8_t* src = w.packed + ((long)(row0 + r) * IC + col0) / 2 + byte;
        cp_async16(packed_s + 16 * tid, valid ? src : w.packed, valid);
    }
    const int i = tid % kTileBlocks;
    const bool valid = row0 + i / T::kBlocksPerRow < rows_end && col0 + 64 * (i % T::kBlocksPerRow) < cols_end;
    const long b = tile_block<WR, WC>(i, row0, col0, IC);
    if constexpr (kDoubleQuant) {
        if (tid < kTileBlocks) cp_async4(scale_s + 4 * i, valid ? w.absmax_codes + (b & ~3L) : w.absmax_codes, valid);
        else cp_async4(nested_s + 4 * i, valid ? w.nested_absmax + b / (long)kNf4NestedBlockSize : w.nested_absmax, valid);
    } else {
        if (tid < kTileBlocks) cp_async4(scale_s + 4 * i, valid ? w.absmax + b : w.absmax, valid);
    }
}

// The loaded codes of a weight tile -> its bf16 values, swizzled rows of WC (flash::swz<WC>). Thread t takes the 32
// weights whose codes it loaded (tile block t / 2, 4 chunks of 8 values); where 4 threads share a row (WC = 128) the
// odd pairs store their chunks in the order 2, 3, 0, 1, so that each 8 lanes' 16-byte stores hit 8 distinct bank groups.
template <int WR, int WC, bool kDoubleQuant>
__device__ __forceinline__ void dequantize_weight_tile(unsigned char* tile, const unsigned char* packed, const uint32_t* scale,
                                                       const float* nested, const float* nf4, const float* dynamic, float offset,
                                                       int row0, int col0, long IC, int tid) {
    using T = WeightTile<WR, WC>;
    const int i = tid / 2;
    float s;
    if constexpr (kDoubleQuant) {
        const long b = tile_block<WR, WC>(i, row0, col0, IC);
        const uint32_t code = (scale[i] >> (8 * (int)(b & 3))) & 0xFFu;  // little-endian: block b is byte b % 4 of its word
        s = nf4_double_quant_absmax(dynamic[code], nested[i], offset);
    } else {
        s = __uint_as_float(scale[i]);
    }
    const uint4 codes = *reinterpret_cast<const uint4*>(packed + 16 * tid);
    const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
    uint4 chunk[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t v[4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            // weight 2j is byte j's high nibble, 2j + 1 its low one (nf4.h's packing); bf16 pairs hold the lower column low
            const uint32_t byte = (words[q] >> (8 * m)) & 0xFFu;
            v[m] = flash::pack2<__nv_bfloat16>(__fmul_rn(nf4[byte >> 4], s), __fmul_rn(nf4[byte & 0xFu], s));
        }
        chunk[q] = make_uint4(v[0], v[1], v[2], v[3]);
    }
    const int row = tid / T::kThreadsPerRow, c0 = tid % T::kThreadsPerRow * 4;
    const bool rotate = T::kThreadsPerRow == 4 && (tid & 2);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int c = rotate ? (q + 2) & 3 : q;
        *reinterpret_cast<uint4*>(tile + swz<WC>(row, c0 + c)) = rotate ? chunk[(q + 2) & 3] : chunk[q];
    }
}

// out[N, M] (+)= A[N, K] B, B[k][m] = W[m][k] (forward: K = IC, M = OC) or W[k][m] (backward: K = OC, M = IC).
// Grid: x over row tiles (consecutive CTAs share a weight tile, read from DRAM once), y over column tiles.
template <bool kBackward, bool kDoubleQuant>
__global__ void __launch_bounds__(kThreads, 2)
nf4_matmul_kernel(__nv_bfloat16* out, const __nv_bfloat16* a, const Nf4Operand w, const __nv_bfloat16* bias, int N, int K, int M,
                  bool accumulate, const Nf4Tables tables) {
    constexpr int WR = kBackward ? kBK : kBN, WC = kBackward ? kBN : kBK;
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = smem_u32(smem);
    float* nf4 = reinterpret_cast<float*>(smem + kOffNf4);
    float* dynamic = reinterpret_cast<float*>(smem + kOffDynamic);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / (kBN / kWarpCols), wn = warp % (kBN / kWarpCols);
    if (tid < 16) nf4[tid] = tables.nf4[tid];
    if constexpr (kDoubleQuant) dynamic[tid] = tables.dynamic[tid];

    const int n0 = blockIdx.x * kBM, m0 = blockIdx.y * kBN, KT = K / kBK;
    const long IC = kBackward ? M : K;
    // the weight tile of k-tile kt starts at (w_row0, w_col0) in W
    auto w_row0 = [&](int kt) { return kBackward ? kt * kBK : m0; };
    auto w_col0 = [&](int kt) { return kBackward ? m0 : kt * kBK; };
    const int w_rows_end = kBackward ? K : M, w_cols_end = kBackward ? M : K;

    auto load_a = [&](int kt) {
        if (kt < KT) flash::load_tile<kBM, kBK, kThreads>(base + kOffA + (kt % kStages) * kATileBytes, a + (long)kt * kBK, K, n0, N, tid);
    };
    auto load_w = [&](int kt) {
        if (kt < KT) {
            const int s = kt % kStages;
            load_weight_tile<WR, WC, kDoubleQuant>(base + kOffPacked + s * kPackedTileBytes, base + kOffScale + s * kTileBlocks * 4,
                                                   base + kOffNested + s * kTileBlocks * 4, w, w_row0(kt), w_col0(kt), w_rows_end,
                                                   w_cols_end, IC, tid);
        }
    };
    auto dequantize = [&](int kt) {
        const int s = kt % kStages;
        dequantize_weight_tile<WR, WC, kDoubleQuant>(smem + kOffW + (kt & 1) * kWTileBytes, smem + kOffPacked + s * kPackedTileBytes,
                                                     reinterpret_cast<const uint32_t*>(smem + kOffScale + s * kTileBlocks * 4),
                                                     reinterpret_cast<const float*>(smem + kOffNested + s * kTileBlocks * 4), nf4,
                                                     dynamic, w.absmax_offset, w_row0(kt), w_col0(kt), IC, tid);
    };

    // Commit group g holds A's k-tile g and W's k-tile g + 1 (group 0 also W's 0): at the top of iteration kt, group kt
    // complete gives the A tile its MMAs read and the codes it dequantizes for kt + 1, while groups kt + 1 and kt + 2
    // are in flight.
    load_w(0);
    load_a(0);
    load_w(1);
    cp_async_commit();
    load_a(1);
    load_w(2);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // group 0 and the tables, from every thread
    dequantize(0);

    float acc[kWarpRows / 16][kWarpCols / 8][4];
#pragma unroll
    for (int mt = 0; mt < kWarpRows / 16; mt++)
#pragma unroll
        for (int nt = 0; nt < kWarpCols / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;

    constexpr uint32_t A_ROWB = kBK * 2, W_ROWB = WC * 2;
    const uint32_t a_frag = (uint32_t)(wm * kWarpRows) * A_ROWB + flash::frag_rows16<kBK>(lane);
    // forward: W tile [n][k] (non-transposed ldmatrix, the warp's n rows); backward: [k][n] (transposed, its n chunks)
    const uint32_t w_frag = kBackward ? flash::frag_krows<kBN>(lane) : (uint32_t)(wn * kWarpCols) * W_ROWB + flash::frag_rows8x2<kBK>(lane);

    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<1>();
        // Group kt has landed everywhere; every warp is done with iteration kt - 1: its MMAs (A stage (kt - 1) % 3 and
        // W tile (kt - 1) & 1, both refilled below) and its dequantization of kt (W codes stage kt % 3, refilled below).
        __syncthreads();
        load_a(kt + 2);
        load_w(kt + 3);
        cp_async_commit();  // possibly empty: keeps the group count uniform

        const uint32_t sA = base + kOffA + (kt % kStages) * kATileBytes + a_frag;
        const uint32_t sW = base + kOffW + (kt & 1) * kWTileBytes + w_frag;
#pragma unroll
        for (int ks = 0; ks < kBK / 16; ks++) {
            uint32_t fa[kWarpRows / 16][4];
#pragma unroll
            for (int mt = 0; mt < kWarpRows / 16; mt++) ldsm_x4(fa[mt], (sA ^ (ks << 5)) + mt * 16 * A_ROWB);
#pragma unroll
            for (int np = 0; np < kWarpCols / 16; np++) {
                uint32_t fb[4];  // b-fragments of column tiles 2np (fb[0..1]) and 2np + 1 (fb[2..3])
                if constexpr (kBackward) ldsm_x4_trans(fb, (sW ^ ((wn * (kWarpCols / 16) + np) << 5)) + ks * 16 * W_ROWB);
                else ldsm_x4(fb, (sW ^ (ks << 5)) + np * 16 * W_ROWB);
#pragma unroll
                for (int mt = 0; mt < kWarpRows / 16; mt++) {
                    flash::mma16816<__nv_bfloat16>(acc[mt][2 * np], fa[mt], fb[0], fb[1]);
                    flash::mma16816<__nv_bfloat16>(acc[mt][2 * np + 1], fa[mt], fb[2], fb[3]);
                }
            }
        }
        // after the MMAs are issued, so that the tensor cores work while this warp dequantizes
        if (kt + 1 < KT) dequantize(kt + 1);
    }

    // Rows g and g + 8 of each 16 x 8 accumulator tile, two adjacent columns a thread: 4-byte stores (the products
    // here have K >= 64 per output, so the stores are a small part of the time).
    const int g = lane / 4, tig = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kWarpRows / 16; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = n0 + wm * kWarpRows + mt * 16 + g + hf * 8;
            if (row >= N) continue;
#pragma unroll
            for (int nt = 0; nt < kWarpCols / 8; nt++) {
                const int col = m0 + wn * kWarpCols + nt * 8 + 2 * tig;
                if (col >= M) continue;
                uint32_t* p = reinterpret_cast<uint32_t*>(out + (long)row * M + col);
                float v0 = acc[mt][nt][2 * hf], v1 = acc[mt][nt][2 * hf + 1];
                if (bias != nullptr) {
                    v0 += __bfloat162float(bias[col]);
                    v1 += __bfloat162float(bias[col + 1]);
                }
                if (accumulate) {
                    const float2 old = flash::unpack2<__nv_bfloat16>(*p);
                    v0 += old.x;
                    v1 += old.y;
                }
                *p = flash::pack2<__nv_bfloat16>(v0, v1);
            }
        }
}

// Forwards of at most kNf4SmallRows rows (sampling's one new position): a warp per output feature streams its
// weight row's codes once, 16 bytes (32 weights, half an NF4 block) a lane a step, the warp's 512 bytes contiguous;
// each lane dequantizes its 32 weights to bf16 as the tiled kernel does and adds their products with every input
// row into fp32 sums, which the warp reduces; the bias is added before the one rounding. It reads 0.52 bytes a weight
// once, where dequantizing first writes 2 and the product reads them back.
constexpr int kSmallRowsThreads = 256;
template <bool kDoubleQuant>
__global__ void __launch_bounds__(kSmallRowsThreads)
nf4_small_rows_kernel(__nv_bfloat16* out, const __nv_bfloat16* x, const Nf4Operand w, const __nv_bfloat16* bias, int N, int IC, int OC,
                      const Nf4Tables tables) {
    __shared__ float nf4[16];
    __shared__ float dynamic[kDoubleQuant ? 256 : 1];
    if (threadIdx.x < 16) nf4[threadIdx.x] = tables.nf4[threadIdx.x];
    if constexpr (kDoubleQuant) dynamic[threadIdx.x] = tables.dynamic[threadIdx.x];
    __syncthreads();
    const int row = blockIdx.x * (kSmallRowsThreads / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= OC) return;
    float acc[kNf4SmallRows] = {};
    for (int k = lane * 32; k < IC; k += 32 * 32) {
        const long first = (long)row * IC + k;  // the lane's first weight: a multiple of 32, in one NF4 block
        const int4 codes = __ldcs(reinterpret_cast<const int4*>(w.packed + first / 2));
        const long block = first / 64;
        float scale;
        if constexpr (kDoubleQuant)
            scale = nf4_double_quant_absmax(dynamic[w.absmax_codes[block]], w.nested_absmax[block / (long)kNf4NestedBlockSize], w.absmax_offset);
        else
            scale = w.absmax[block];
        // weight 2b is byte b's high nibble, 2b + 1 its low one
        const uint32_t words[4] = {(uint32_t)codes.x, (uint32_t)codes.y, (uint32_t)codes.z, (uint32_t)codes.w};
        float wv[32];
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const uint32_t code = (words[i / 8] >> (8 * ((i % 8) / 2) + (i % 2 ? 0 : 4))) & 0xF;
            wv[i] = __bfloat162float(__float2bfloat16(__fmul_rn(nf4[code], scale)));
        }
#pragma unroll
        for (int r = 0; r < kNf4SmallRows; r++) {
            if (r >= N) break;
            const int4* xr = reinterpret_cast<const int4*>(x + (long)r * IC + k);
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int4 packed = xr[v];
                const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float2 f = __bfloat1622float2(pairs[j]);
                    acc[r] += wv[8 * v + 2 * j] * f.x + wv[8 * v + 2 * j + 1] * f.y;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kNf4SmallRows; r++) {
        if (r >= N) break;
        const float sum = warp_reduce_sum(acc[r]);
        if (lane == 0) out[(long)r * OC + row] = __float2bfloat16(sum + (bias != nullptr ? __bfloat162float(bias[row]) : 0.0f));
    }
}

template <bool kBackward>
void launch(__nv_bfloat16* out, const __nv_bfloat16* a, const Nf4DeviceWeight& w, const __nv_bfloat16* bias, int N, int K, int M,
            bool accumulate, cudaStream_t stream) {
    const Nf4Operand operand{w.packed, w.absmax, w.absmax_codes, w.nested_absmax, w.absmax_offset};
    const dim3 grid(ceil_div(N, kBM), ceil_div(M, kBN));
    auto kernel = w.double_quant ? nf4_matmul_kernel<kBackward, true> : nf4_matmul_kernel<kBackward, false>;
    flash::set_smem(kernel, kSmemBytes);
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(out, a, operand, bias, N, K, M, accumulate, nf4_tables());
    cudaCheckLaunch();
}

inline void launch_small_rows(__nv_bfloat16* out, const __nv_bfloat16* x, const Nf4DeviceWeight& w, const __nv_bfloat16* bias, int N,
                              int IC, int OC, cudaStream_t stream) {
    const Nf4Operand operand{w.packed, w.absmax, w.absmax_codes, w.nested_absmax, w.absmax_offset};
    const int grid = ceil_div(OC, kSmallRowsThreads / 32);
    if (w.double_quant) nf4_small_rows_kernel<true><<<grid, kSmallRowsThreads, 0, stream>>>(out, x, operand, bias, N, IC, OC, nf4_tables());
    else nf4_small_rows_kernel<false><<<grid, kSmallRowsThreads, 0, stream>>>(out, x, operand, bias, N, IC, OC, nf4_tables());
    cudaCheckLaunch();
}

}  // namespace nf4mm

// Why `what` cannot run on these operands ("" when it can): a weight never uploaded or not 2-D, IC / OC not positive
// multiples of 64 (or past int), N not positive, misaligned pointers. Reads no device memory.
inline std::string nf4_matmul_shape_problem(const char* what, const Nf4DeviceWeight& w, int N, const void* out, const void* in) {
    const std::string name(what);
    if (w.count == 0 || w.packed == nullptr) return name + ": the NF4 weight holds no weights (not uploaded?)";
    if (w.shape.size() != 2) return name + ": the NF4 weight must be 2-D [out_features, in_features], it has " + std::to_string(w.shape.size()) + " dimensions";
    const size_t OC = w.shape[0], IC = w.shape[1];
    if (OC == 0 || IC == 0 || OC % 64 != 0 || IC % 64 != 0 || OC > (size_t)INT_MAX || IC > (size_t)INT_MAX)
        return name + ": the weight's in_features and out_features must be multiples of 64, got [" + std::to_string(OC) + ", " +
               std::to_string(IC) + "]";
    if (N <= 0) return name + ": N must be positive, got " + std::to_string(N);
    if ((uintptr_t)out % 16 != 0 || (uintptr_t)in % 16 != 0) return name + ": the input and the output must be 16-byte aligned";
    const bool arrays_aligned = w.double_quant ? (uintptr_t)w.absmax_codes % 4 == 0 && (uintptr_t)w.nested_absmax % 4 == 0
                                               : (uintptr_t)w.absmax % 4 == 0;
    if ((uintptr_t)w.packed % 16 != 0 || !arrays_aligned)
        return name + ": the NF4 weight's codes must be 16-byte aligned and its absmax arrays 4-byte aligned";
    return "";
}

// out[N, OC] = x[N, IC] W^T + bias (bf16, row-major; bias [OC] or nullptr), W the NF4 weight [OC, IC], on `stream`:
// the small-rows kernel for N <= kNf4SmallRows, the tiled one above.
inline void nf4_matmul_forward(__nv_bfloat16* out, const __nv_bfloat16* x, const Nf4DeviceWeight& w, const __nv_bfloat16* bias, int N,
                               cudaStream_t stream) {
    if (const std::string problem = nf4_matmul_shape_problem("nf4_matmul_forward", w, N, out, x); !problem.empty()) die(problem);
    if (N <= kNf4SmallRows) nf4mm::launch_small_rows(out, x, w, bias, N, (int)w.shape[1], (int)w.shape[0], stream);
    else nf4mm::launch<false>(out, x, w, bias, N, (int)w.shape[1], (int)w.shape[0], false, stream);
}

// dx[N, IC] = dout[N, OC] W (bf16, row-major) on `stream`; accumulate: dx = bf16(dx + the fp32 product) instead, one
// rounding (where LoRA's input gradient is already in dx). dx must not overlap dout.
inline void nf4_matmul_backward_input(__nv_bfloat16* dx, const __nv_bfloat16* dout, const Nf4DeviceWeight& w, int N, bool accumulate,
                                      cudaStream_t stream) {
    if (const std::string problem = nf4_matmul_shape_problem("nf4_matmul_backward_input", w, N, dx, dout); !problem.empty()) die(problem);
    nf4mm::launch<true>(dx, dout, w, nullptr, N, (int)w.shape[0], (int)w.shape[1], accumulate, stream);
}
