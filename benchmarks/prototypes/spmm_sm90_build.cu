// spmm_sm90_build.cu (prototype, benchmarks/prototypes/README.md): twell_spmm_sm90_bf16 and _f16,
// A @ B for a TwELL A of 16-bit values on Hopper (sm_90a: wgmma and TMA) as a dense tensor-core
// GEMM whose A operand is built in shared memory from the TwELL arrays, instead of
// A.toarray() + cuBLAS (a dense M x K temporary written and read again: 0.14 ms of the 0.56
// at the paper's down projection at 95%, H200). Run in the twentieth session (H200, calls 1-4,
// benchmarks/results/2026-12-04-h200-t/): right (the GPU tests of that session, 10 passed),
// but slower than the ways it was to replace at every density (benchmarks/NOTES.md).
//
// Block tile 128 x 256 of the (M, N) output, k in stages of 64 (a "slab"), 384 threads:
//   - warps 0-7 are two consumer warpgroups, each wgmma.m64n256k16 on its 64 rows (128 fp32
//     accumulators a thread), the k loop of the fused D2T (consume_k_tiles, tma.cuh);
//   - warps 8-11 are the builders, a thread per row of the block: for each slab, once the
//     consumers have released its stage, a thread writes its row of the stage's A tile (zeros,
//     then its entries with columns in the slab: the slots of the (row, tile) pair, then the
//     row's overflow entries, in the 128-byte-swizzled layout that TMA would have written),
//     fences its writes for the async proxy and arrives on the stage's `full` barrier; the
//     first builder also starts the TMA copy of the stage's 64 x 256 box of B^T.
//   - `full` completes with the 128 builders' arrivals plus the TMA's 32 KB; `empty` with one
//     arrival per consumer warp (as in the D2T).
// A builder loads the next tile's first kChunk slots (values and columns as 32-bit words) while
// it builds the current tile's slabs, so that the loads' latency hides behind the ring; slots
// past kChunk (S > kChunk) and the overflow (sorted by column within a row: a cursor) are read
// when their slab is built. Tile widths are multiples of 64, so a slab lies in one tile.
// The sums: each output is the fp32 sum over k steps of 16 in order, rounded once to T; the
// A operand holds zeros where A has no entry, so B's Inf or NaN there would poison the sum
// (a launcher must recompute such products with the gather kernel, as the library's dense
// way does when B holds Inf or NaN).
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"
#include "tma.cuh"

using namespace twell;

namespace {

using namespace twell::gemm;

constexpr int kStages = 4;
constexpr int kConsumerThreads = 256;  // 2 warpgroups
constexpr int kConsumerWarps = kConsumerThreads / kWarp;
constexpr int kBuilders = kBM;  // a builder thread per row of the block
constexpr int kSpmmThreads = kConsumerThreads + kBuilders;
constexpr int kBBytes = kBStage * 2;  // what one stage's TMA brings: 64 x 256 of B^T
constexpr int kNoColumn = 0x7fffffff;
constexpr unsigned kNoSlab = 511;  // tile widths up to 256 slabs of 64 (16384 columns)

// The 32-bit word w of a 16-bit array of `total` values; a half past the end reads as 0.
__device__ __forceinline__ unsigned load_word(const unsigned short* __restrict__ base,
                                              long long w, long long total) {
  if (2 * w + 2 <= total) return __ldg(reinterpret_cast<const unsigned*>(base) + w);
  return 2 * w < total ? static_cast<unsigned>(__ldg(base + 2 * w)) : 0u;
}

__device__ __forceinline__ void st_shared_u16(unsigned address, unsigned short value) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(address), "h"(value) : "memory");
}

// st_shared_u16 where `store`, as a predicated instruction instead of a divergent branch around
// it (the second form stored every slot of a slab this way; the third, a round's front keys).
__device__ __forceinline__ void st_shared_u16_if(bool store, unsigned address,
                                                 unsigned short value) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.shared.u16 [%0], %1;\n}\n" ::"r"(address),
      "h"(value), "r"(static_cast<int>(store)));
}

__device__ __forceinline__ void st_shared_zero16(unsigned address) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(address), "r"(0) : "memory");
}

// Byte offset of column c (0..63) in row `row` of a 128-byte-swizzled stage tile.
__device__ __forceinline__ unsigned swizzled_byte(int row, int c) {
  return static_cast<unsigned>(row * 128 + ((((c >> 3) ^ row) & 7) << 4) + ((c & 7) << 1));
}

// The first kChunk slots of one (row, tile) pair as loaded: values and columns as the 32-bit
// words that hold them (word 0 starts at the pair's first slot rounded down to an even slot;
// `odd` says it started one half early), and the pair's count.
template <int kChunk>
struct SlotWords {
  static constexpr int kWords = kChunk / 2 + 1;
  unsigned values[kWords];
  unsigned columns[kWords];
  int count;
  int odd;

  __device__ __forceinline__ void load(const int* __restrict__ counts,
                                       const unsigned short* __restrict__ data,
                                       const unsigned short* __restrict__ indices, long long pair,
                                       int slots, long long total, bool ok) {
    const long long first = pair * slots;
    odd = static_cast<int>(first & 1);
    const long long w0 = first >> 1;
    const int words = ok ? (odd + min(slots, kChunk) + 1) >> 1 : 0;
    count = ok ? __ldg(counts + pair) : 0;
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      values[j] = j < words ? load_word(data, w0 + j, total) : 0u;
      columns[j] = j < words ? load_word(indices, w0 + j, total) : 0u;
    }
  }

  // Slot s is half (s & 1) of word s >> 1 afterwards.
  __device__ __forceinline__ void align() {
    if (odd) {
#pragma unroll
      for (int j = 0; j + 1 < kWords; ++j) {
        values[j] = __funnelshift_r(values[j], values[j + 1], 16);
        columns[j] = __funnelshift_r(columns[j], columns[j + 1], 16);
      }
    }
  }

  // Slot s as one word: its value's 16 bits, its slab within the tile (bits 7-15: 0..255,
  // 511 for a slot past the count) and its byte offset in row r of a stage (bits 0-6, with
  // the row's swizzle).
  __device__ __forceinline__ unsigned key(int s, int r) const {
    const unsigned value = values[s >> 1] >> (16 * (s & 1)) & 0xffffu;
    const int c = static_cast<int>(columns[s >> 1] >> (16 * (s & 1)) & 0xffffu);
    const unsigned slab = s < count ? static_cast<unsigned>(c >> 6) : kNoSlab;
    return value << 16 | slab << 7 | (swizzled_byte(r, c & 63) & 127u);
  }
};

}  // namespace

// A (TwELL, M x K, tile width a multiple of 64, values of T = bf16 or fp16) @ B -> out (M, N)
// of T, with B read as B^T (N, K) through its tensor map (boxes of 64 x 256, 128-byte swizzle,
// zero fill past N and K).
template <typename T, int kChunk>
__device__ __forceinline__ void spmm_sm90(
    const TensorMap& tmap_bt, const int* __restrict__ counts,
    const unsigned short* __restrict__ data, const unsigned short* __restrict__ indices,
    const long long* __restrict__ overflow_indptr, const int* __restrict__ overflow_indices,
    const unsigned short* __restrict__ overflow_data, long long n_rows, long long n_cols,
    long long depth, int tile_width, int slots, T* __restrict__ out) {
  const int tid = threadIdx.x, lane = tid % kWarp;
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long m0 = static_cast<long long>(blockIdx.x) / col_blocks * kBM;
  const long long n0 = static_cast<long long>(blockIdx.x) % col_blocks * kBN;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  T* const smem = aligned_smem<T>();
  const unsigned stages = smem_address(smem);
  const StageBarriers<kStages> bars{stages + kStages * (kAStage + kBStage) * 2};

  // full: every builder's arrival plus the first builder's arrive.expect_tx for the TMA;
  // empty: one arrival per consumer warp.
  if (tid == 0) bars.init(kBuilders + 1, kConsumerWarps);
  __syncthreads();

  if (tid >= kConsumerThreads) {
    const int r = tid - kConsumerThreads;
    const long long row = m0 + r;
    const bool row_ok = row < n_rows;
    const long long tiles = n_tiles(depth, tile_width);
    const long long total = n_rows * tiles * slots;
    const int slabs_per_tile = tile_width / kBK;
    // The row's overflow, sorted by column: the next entry waits in (next_col, next_value).
    long long next = row_ok ? overflow_indptr[row] : 0;
    const long long end = row_ok ? overflow_indptr[row + 1] : 0;
    int next_col = next < end ? overflow_indices[next] : kNoColumn;
    unsigned short next_value = next < end ? overflow_data[next] : 0;

    SlotWords<kChunk> ahead;
    ahead.load(counts, data, indices, row * tiles, slots, total, row_ok);
    int kt = 0;
    for (long long tile = 0; tile < tiles; ++tile) {
      SlotWords<kChunk> cur = ahead;
      if (tile + 1 < tiles)
        ahead.load(counts, data, indices, row * tiles + tile + 1, slots, total, row_ok);
      cur.align();
      unsigned keys[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) keys[i] = cur.key(i, r);
      const long long pair = row * tiles + tile;
      if (next < end) {  // the row's next overflow entries into L1 before their slab needs them
        asm volatile("prefetch.global.L1 [%0];\n" ::"l"(overflow_indices + next));
        asm volatile("prefetch.global.L1 [%0];\n" ::"l"(overflow_data + next));
      }
      const int last = min(static_cast<int>((tile + 1) * slabs_per_tile), k_tiles);
      for (int slab = 0; kt < last; ++kt, ++slab) {
        const int s = kt % kStages;
        mbarrier_wait(bars.empty(s), ((kt / kStages) & 1) ^ 1);
        const unsigned a_s = stages + s * (kAStage + kBStage) * 2;
        if (r == 0) {
          mbarrier_arrive_expect_tx(bars.full(s), kBBytes);
          tma_load_2d(a_s + kAStage * 2, &tmap_bt, bars.full(s), kt * kBK,
                      static_cast<int>(n0));
        }
        // Zeros over the row first (chunk j ^ (r % 8) at step j: 8 rows of a warp cover all
        // 32 banks), then the entries: the same thread's later store wins.
        const unsigned a_row = a_s + r * 128;
#pragma unroll
        for (int j = 0; j < 8; ++j) st_shared_zero16(a_row + (((j ^ r) & 7) << 4));
        // The slab's slot entries: the front key while it is this slab's (the slots ascend by
        // column), then the keys move up one. A round stores one entry of each lane that has
        // one left: as many stores as the warp's busiest row has entries in the slab.
        while (true) {
          const bool mine = (keys[0] >> 7 & kNoSlab) == static_cast<unsigned>(slab);
          if (!__any_sync(kFullMask, mine)) break;
          st_shared_u16_if(mine, a_row + (keys[0] & 127u),
                           static_cast<unsigned short>(keys[0] >> 16));
#pragma unroll
          for (int i = 0; i + 1 < kChunk; ++i) keys[i] = mine ? keys[i + 1] : keys[i];
          keys[kChunk - 1] = mine ? kNoSlab << 7 : keys[kChunk - 1];
        }
        for (int i = kChunk; i < cur.count; ++i) {  // S > kChunk: the rest from global
          const int c = indices[pair * slots + i];
          if ((c >> 6) == slab)
            st_shared_u16(a_s + swizzled_byte(r, c & 63), data[pair * slots + i]);
        }
        const int k0 = kt * kBK;
        while (next_col < k0 + kBK) {
          st_shared_u16(a_s + swizzled_byte(r, next_col - k0), next_value);
          ++next;
          next_col = next < end ? overflow_indices[next] : kNoColumn;
          next_value = next < end ? overflow_data[next] : 0;
        }
        // The stage's A is written by the generic proxy and read by wgmma (the async proxy).
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        mbarrier_arrive(bars.full(s));
      }
    }
    return;
  }

  float d[128];
  const int wg = tid / 128;
  consume_k_tiles(
      d, smem, bars, k_tiles, wg,
      [](unsigned bar, unsigned parity) { mbarrier_wait(bar, parity); },
      [lane](unsigned bar) { if (lane == 0) mbarrier_arrive(bar); });

  // d[4 j + 2 h + b]: row 64 wg + 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + b.
  const int warp = tid % 128 / kWarp;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const long long row = m0 + wg * 64 + 16 * warp + lane / 4 + 8 * h;
    if (row >= n_rows) continue;
    T* const dst = out + row * n_cols;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const long long col = n0 + 8 * j + 2 * (lane % 4);
      if ((n_cols & 1) == 0) {  // col is even: both columns or neither inside N, 4-byte aligned
        if (col < n_cols)
          *reinterpret_cast<unsigned*>(dst + col) = Mma<T>::pack2(d[4 * j + 2 * h],
                                                                   d[4 * j + 2 * h + 1]);
      } else {
        if (col < n_cols) dst[col] = Value<T>::from_acc(d[4 * j + 2 * h]);
        if (col + 1 < n_cols) dst[col + 1] = Value<T>::from_acc(d[4 * j + 2 * h + 1]);
      }
    }
  }
}

// The kernels, one per (dtype, chunk) (NVRTC builds this file without name expressions).
// Grid: ceil(M / 128) * ceil(N / 256) blocks of 384 threads, column blocks varying fastest;
// dynamic shared memory kStages * 48 KB + 2 * kStages * 8 (the mbarriers) + 1024 (alignment
// slack) bytes. Values travel as their 16-bit patterns.
#define TWELL_SPMM_SM90(name, T, CHUNK)                                                        \
  extern "C" __global__ void __launch_bounds__(kSpmmThreads, 1) name(                         \
      const __grid_constant__ TensorMap tmap_bt, const int* __restrict__ counts,              \
      const unsigned short* __restrict__ data, const unsigned short* __restrict__ indices,    \
      const long long* __restrict__ overflow_indptr, const int* __restrict__ overflow_indices, \
      const unsigned short* __restrict__ overflow_data, long long n_rows, long long n_cols,   \
      long long depth, int tile_width, int slots, T* __restrict__ out) {                      \
    spmm_sm90<T, CHUNK>(tmap_bt, counts, data, indices, overflow_indptr, overflow_indices,    \
                        overflow_data, n_rows, n_cols, depth, tile_width, slots, out);        \
  }

TWELL_SPMM_SM90(twell_spmm_sm90_bf16_c8, __nv_bfloat16, 8)
TWELL_SPMM_SM90(twell_spmm_sm90_bf16_c16, __nv_bfloat16, 16)
TWELL_SPMM_SM90(twell_spmm_sm90_bf16_c32, __nv_bfloat16, 32)
TWELL_SPMM_SM90(twell_spmm_sm90_f16_c8, __half, 8)
TWELL_SPMM_SM90(twell_spmm_sm90_f16_c16, __half, 16)
TWELL_SPMM_SM90(twell_spmm_sm90_f16_c32, __half, 32)
