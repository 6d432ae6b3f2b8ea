// matmul_pack_sm90_handoff.cu: PROTOTYPE (nineteenth session). Not part of the package:
// matmul_pack_sm90_handoff.py (beside it) compiles it with NVRTC for sm_90a, swaps it in for
// twell_matmul_pack_sm90_bf16 under the launcher, checks it bit for bit against the shipped
// kernels and times it.
//
// proto_matmul_pack_sm90_handoff: the persistent prototype (matmul_pack_sm90_persist.cu: one
// block per SM over the 128 x 256 output tiles, one 4-stage TMA ring across them) with the
// second half of the epilogue taken off the consumers, so that it overlaps the next tile's
// wgmma (NOTES, open question 5 (b)). 384 threads = 12 warps:
//   - warps 0-7, two consumer warpgroups: the k loop, then per tile the first half of the
//     epilogue (rounding relu(acc) to T and the per-row masks), handing off per thread its
//     two rows' 64-bit masks and only its non-zero values, then straight on to the next tile;
//   - warp 8, the producer (one lane issues the TMA copies, as before);
//   - warps 9-11, the packers: each plays, in turn, the lanes of one consumer warp for one of
//     its two rows (pack_quad_row, wgmma.cuh: counts, totals, spill, zero fill, entries),
//     reading a value at the rank of its bit in the thread's mask.
// The hand-off, 32 KB: consumer thread t owns 8 groups of 16 bytes at (c * 256 + t) * 16
// (c < 8): group 0 its two masks, groups 1-7 up to 56 non-zero 16-bit values in mask order
// (row 0's, then row 1's). A consumer warp with a thread of more than 56 positive accumulators
// (a tile denser than ~44%; counted before the rounding, so that d stays whole for it) packs
// its rows itself from the same 32 KB (pack_accumulators<T, true>, as the persistent
// prototype) and flags its warp so that the packers skip it. Two mbarriers: `full` (one
// arrival per consumer warp once its masks, values and flag are written) and `empty` (one per
// packing warp once it is done with the tile); a consumer waits for `empty` of the previous
// tile before it writes.
// Registers: 384 threads cap them at 168 (the consumers need ~164; setmaxnreg does not help:
// ptxas allocates the whole kernel under the launch bound).
// Prediction (H200, M = 16384, K = 2048, N = 5632, S = 13, 99%, kernel alone): ~0.50-0.52 ms
// against 0.55 for the persistent prototype and 0.565 shipped: the consumers keep rounding
// and masks (~0.065 ms of the shipped 0.136 epilogue), the packers' ~9 us a tile hide under a
// tile's ~22 us GEMM. Outcome: benchmarks/prototypes/README.md.
// Shared memory: 4 x 48 KB ring + 32 KB hand-off + 80 bytes of mbarriers + 32 bytes of flags
// + 1024 alignment slack = 230 512 bytes (of 232 448).
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"
#include "tma.cuh"
#include "persist.cuh"

// Diagnosis (the .py compiles each): 0 the kernel; 1 the packers skip their work (wrong
// results: the consumers' side alone); 2 the consumers hand off empty masks (wrong results:
// the packers' counts and zero fill alone); 3 the packers store a constant for every value
// (wrong results: their entries without reading the values). HANDOFF_PACKERS: 1-3 packing
// warps (the block has 9 + HANDOFF_PACKERS warps).
#ifndef HANDOFF_DIAG
#define HANDOFF_DIAG 0
#endif
#ifndef HANDOFF_PACKERS
#define HANDOFF_PACKERS 3
#endif

using namespace twell;

namespace {

using namespace twell::gemm;

constexpr int kStages = 4;
constexpr int kConsumerWarps = 8;  // two warpgroups
constexpr int kPackerWarps = HANDOFF_PACKERS;
constexpr int kHandoffThreads = (kConsumerWarps + 1 + kPackerWarps) * kWarp;  // 384
constexpr int kStageBytes = kPersistStageBytes;
constexpr int kHandoffBytes = 8 * 256 * 16;
constexpr int kCompact = 56;  // values a consumer thread hands off: groups 1-7, 8 each

}  // namespace

// Value k of consumer thread t's compact list in the hand-off.
__device__ __forceinline__ unsigned short* handoff_value(unsigned char* handoff, int t, int k) {
  return reinterpret_cast<unsigned short*>(handoff) + ((1 + (k >> 3)) * 256 + t) * 8 + (k & 7);
}

// Word e (0-7) of eight by a tree of selects on the bits of e (an index unknown at compile
// time would put the words in local memory).
__device__ __forceinline__ unsigned select_word(const unsigned (&eight)[8], int e) {
  unsigned four[4], two[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) four[i] = (e & 1) ? eight[2 * i + 1] : eight[2 * i];
#pragma unroll
  for (int i = 0; i < 2; ++i) two[i] = (e & 2) ? four[2 * i + 1] : four[2 * i];
  return (e & 4) ? two[1] : two[0];
}

// Whether every thread of the warp has at most kCompact positive accumulators (bf16 or fp16
// rounding keeps a zero a zero and may only turn a positive into one: relu(acc) has at most as
// many non-zeros, inside N or not, so hand_off's values fit). Counted before hand_off, so that
// a warp that packs its own rows keeps d whole and no more: with the vote after hand_off, d
// lived beside its state and the kernel spilled at 168 registers.
__device__ __forceinline__ bool fits_hand_off(const float (&d)[128]) {
  int positive = 0;
#pragma unroll
  for (int i = 0; i < 128; ++i) positive += d[i] > 0.0f ? 1 : 0;
  return !__any_sync(kFullMask, positive > kCompact);
}

// The consumers' half of the epilogue for thread t (0-255), once fits_hand_off: relu(acc)
// rounded to T, each row's mask of non-zeros inside N and, in mask order, its non-zero values
// in the hand-off, 8 words (16 values) at a time: a loop over the group's set bits (~0.16 a
// group at 99%) finds each value by select_word; then the masks. (A first form stored each
// value as its word was rounded, in 128 branches: 0.12 ms slower than without the stores.)
template <typename T>
__device__ __forceinline__ void hand_off(const float (&d)[128], unsigned char* handoff,
                                         unsigned long long valid, int t) {
  unsigned long long masks[2] = {0ull, 0ull};
#if HANDOFF_DIAG != 2
  int k = 0;  // the thread's values stored so far
#endif
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      unsigned eight[8];
      unsigned group = 0;  // bit 2 e + b: value b of word e
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int j = 8 * g + e;
        eight[e] = Mma<T>::pack2(relu(d[4 * j + 2 * h]), relu(d[4 * j + 2 * h + 1]));
        group |= (static_cast<unsigned>((eight[e] & 0x7fffu) != 0u) |
                  static_cast<unsigned>((eight[e] & 0x7fff0000u) != 0u) << 1) << (2 * e);
      }
      group &= static_cast<unsigned>(valid >> (16 * g)) & 0xffffu;
      masks[h] |= static_cast<unsigned long long>(group) << (16 * g);
#if HANDOFF_DIAG != 2
      for (unsigned rest = group; rest != 0u; rest &= rest - 1u, ++k) {
        const int bit = __ffs(static_cast<int>(rest)) - 1;
        *handoff_value(handoff, t, k) =
            static_cast<unsigned short>(select_word(eight, bit >> 1) >> (16 * (bit & 1)));
      }
#endif
    }
  }
#if HANDOFF_DIAG == 2
  masks[0] = masks[1] = 0ull;  // diagnosis: the packers get no entries
#endif
  reinterpret_cast<ulonglong2*>(handoff)[t] = make_ulonglong2(masks[0], masks[1]);
}

template <typename T>
__device__ __forceinline__ void handoff_body(
    const TensorMap& tmap_x, const TensorMap& tmap_w, long long n_rows, long long n_cols,
    long long depth, int tile_width, int slots, int zero_fill, int* __restrict__ totals,
    int* __restrict__ counts, T* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    T* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used) {
  const int tid = threadIdx.x, warp_id = tid / kWarp, lane = tid % kWarp;
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long n_blocks = (n_rows + kBM - 1) / kBM * col_blocks;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  T* const smem = aligned_smem<T>();
  const unsigned ring = smem_address(smem);
  unsigned char* const handoff = reinterpret_cast<unsigned char*>(smem) + kStages * kStageBytes;
  const StageBarriers<kStages> bars{ring + kStages * kStageBytes + kHandoffBytes};
  const unsigned handoff_full = bars.empty(kStages);  // after the ring's 2 kStages barriers
  const unsigned handoff_empty = handoff_full + 8;
  volatile int* const own_packing =
      reinterpret_cast<volatile int*>(handoff + kHandoffBytes + 2 * kStages * 8 + 16);

  if (tid == 0) {
    bars.init(1, kConsumerWarps);
    mbarrier_init(handoff_full, kConsumerWarps);
    mbarrier_init(handoff_empty, kPackerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp_id == kConsumerWarps) {
    if (lane == 0) produce_tiles(bars, ring, tmap_x, tmap_w, n_blocks, col_blocks, k_tiles);
    __syncwarp();
  } else if (warp_id > kConsumerWarps) {
    // A packer: units u = packer, packer + 3, ... of the tile's 16 (consumer warp u / 2, row
    // half u % 2), each played with the consumer warp's lane layout.
    const int packer = warp_id - kConsumerWarps - 1;
    int i = 0;
    for (long long b = blockIdx.x; b < n_blocks; b += gridDim.x, ++i) {
      const long long m0 = b / col_blocks * kBM;
      const TileSpan span(b % col_blocks * kBN, n_cols, tile_width);
      mbarrier_wait(handoff_full, i & 1);
      __syncwarp();
      for (int u = packer; u < 2 * kConsumerWarps; u += kPackerWarps) {
        const int cw = u >> 1, h = u & 1;
        if (HANDOFF_DIAG == 1 || own_packing[cw] != 0) continue;  // packed by its warp
        const int t = cw * kWarp + lane;
        const ulonglong2 both = reinterpret_cast<const ulonglong2*>(handoff)[t];
        const unsigned long long mask = h == 0 ? both.x : both.y;
        const int base = h == 0 ? 0 : __popcll(both.x);
        const long long row = m0 + (cw >> 2) * 64 + 16 * (cw & 3) + lane / 4 + 8 * h;
        // Values 0-15 of the thread's list (groups 1 and 2) in registers, read once with the
        // mask: while the wgmma of the next tile runs, every shared-memory read waits behind
        // its operand fetches, and one read per entry made the packers the bottleneck.
        const int listed = base + __popcll(mask);
        uint4 low = make_uint4(0u, 0u, 0u, 0u), high = low;
        if (listed > 0) low = reinterpret_cast<const uint4*>(handoff)[256 + t];
        if (listed > 8) high = reinterpret_cast<const uint4*>(handoff)[512 + t];
        const unsigned cached[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
        pack_quad_row<T>(mask, row, row < n_rows, span, slots, zero_fill != 0, totals, counts,
                         data, indices, spill_start, spill_indices, spill_data,
                         spill_capacity, spill_used, lane,
                         [handoff, t, mask, base, &cached](int j, int bb) {
                           if (HANDOFF_DIAG == 3) return from_bits<T>(0x3f80);
                           const int bit = 2 * j + bb;
                           const int k = base + __popcll(mask & ((1ull << bit) - 1ull));
                           const unsigned short v =
                               k < 16 ? static_cast<unsigned short>(
                                            select_word(cached, k >> 1) >> (16 * (k & 1)))
                                      : *handoff_value(handoff, t, k);
                           return from_bits<T>(v);
                         });
      }
      __syncwarp();
      if (lane == 0) mbarrier_arrive(handoff_empty);
    }
  } else {
    float d[128];
    int first = 0;  // ring position of the tile's first k tile, modulo 2 kStages
    int i = 0;
    for (long long b = blockIdx.x; b < n_blocks; b += gridDim.x, ++i) {
      consume_tile(d, smem, bars, k_tiles, tid / 128, lane, first);
      const long long m0 = b / col_blocks * kBM, n0 = b % col_blocks * kBN;
      mbarrier_wait(handoff_empty, (i & 1) ^ 1);  // the packers are done with the last tile
      __syncwarp();
      const bool fits = fits_hand_off(d);
      if (fits) hand_off<T>(d, handoff, quad_valid_bits(n0, n_cols, lane & 3), tid);
      if (lane == 0) own_packing[warp_id] = fits ? 0 : 1;
      __syncwarp();
      if (lane == 0) mbarrier_arrive(handoff_full);
      if (!fits)
        pack_accumulators<T, true>(d, handoff, m0, n0, n_rows, n_cols, tile_width, slots,
                                   zero_fill != 0, totals, counts, data, indices, spill_start,
                                   spill_indices, spill_data, spill_capacity, spill_used,
                                   tid / 128, tid % 128 / kWarp, lane);
    }
  }
}

// Grid: min(SM count, ceil(M / 128) * ceil(N / 256)) blocks of 384 threads; dynamic shared
// memory kStages * kStageBytes + kHandoffBytes + (2 * kStages + 2) * 8 + 32 + 1024 bytes.
extern "C" __global__ void __launch_bounds__(kHandoffThreads, 1) proto_matmul_pack_sm90_handoff(
    const __grid_constant__ TensorMap tmap_x, const __grid_constant__ TensorMap tmap_w,
    long long n_rows, long long n_cols, long long depth, int tile_width, int slots,
    int zero_fill, int* __restrict__ totals, int* __restrict__ counts,
    __nv_bfloat16* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    __nv_bfloat16* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used) {
  handoff_body<__nv_bfloat16>(tmap_x, tmap_w, n_rows, n_cols, depth, tile_width, slots,
                              zero_fill, totals, counts, data, indices, spill_start,
                              spill_indices, spill_data, spill_capacity, spill_used);
}
