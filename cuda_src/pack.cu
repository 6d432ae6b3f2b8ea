// pack.cu: dense -> TwELL and CSR -> TwELL.
//
// Both kernels run in one of three modes (twell::kMode*), launched in this order:
//   kModeCount    totals[pair] = number of non-zeros of the (row, tile)            (slots="auto")
//   kModeSlots    the first S non-zeros of each (row, tile) go to the slots in column order;
//                 counts[pair] = min(total, S); totals[pair] = total;
//                 *n_overflow += sum over pairs of max(total - S, 0)
//   kModeOverflow the non-zeros of rank >= S go to overflow position
//                 overflow_offset[pair] + rank - S (an exclusive prefix sum of max(total - S, 0)
//                 over pairs in row-major order, so the overflow is a CSR in column order);
//                 launched only when *n_overflow > 0 (for dense input by its own kernel,
//                 twell_pack_dense_overflow)
// Ranks come from warp-wide prefix sums (dense) or binary searches (CSR), never from atomics:
// packing is deterministic and canonical. The one atomic, on the n_overflow counter, adds
// integers, so its total is deterministic too.
#include "twell_layout.cuh"
#include "pack_warp.cuh"

using namespace twell;

// One (row, tile) pair of the dense matrix, any tile width: the warp steps through the tile
// kWarp * VEC columns at a time, each chunk packed by pack_chunk in `mode` (the slot pointers
// are unused in kModeOverflow, the overflow pointers outside it). Returns the pair's number of
// non-zeros, the same in every lane. Every lane of the warp must call it. Index: the type of a
// column within a tile (unsigned short, or int for tiles wider than 65536 columns).
template <typename T, int VEC, typename Index>
__device__ __forceinline__ int pack_pair(const T* __restrict__ dense, long long n_cols,
                                         long long tiles, int tile_width, int slots, int mode,
                                         long long pair, int lane, T* __restrict__ data,
                                         Index* __restrict__ indices,
                                         const long long* __restrict__ overflow_offset,
                                         int* __restrict__ overflow_indices,
                                         T* __restrict__ overflow_data) {
  const long long row = pair / tiles;
  const long long col0 = (pair - row * tiles) * tile_width;
  const long long width = min(static_cast<long long>(tile_width), n_cols - col0);
  const T* __restrict__ src = dense + row * n_cols + col0;
  int base = 0;  // non-zeros in the chunks before this one
  for (long long c0 = 0; c0 < width; c0 += kWarp * VEC) {
    const long long j0 = c0 + lane * VEC;
    T v[VEC];
    load_vec<T, VEC>(src, j0, width, v);
    base += pack_chunk<T, VEC>(v, j0, base, lane, mode, pair, col0, slots, data, indices,
                               mode == kModeOverflow ? overflow_offset[pair] : 0,
                               overflow_indices, overflow_data);
  }
  return base;
}

// Warps per block of twell_pack_dense (the launcher's block size; its shared memory is per warp).
constexpr int kPackWarps = 8;

// The raw bits of VEC values as one warp-wide load moves them: a 16-byte vector, or one value.
template <typename T, int VEC> struct Raw {
  using type = uint4;
  __device__ static type zero() { return make_uint4(0u, 0u, 0u, 0u); }
};
template <typename T> struct Raw<T, 1> {
  using type = T;
  __device__ static type zero() { return Value<T>::zero(); }
};

// Bit i set where value i of `w` is non-zero (is_nonzero). For 16-bit values all 8 at once from
// the 4 words (SWAR): the low 15 bits of each half plus 0x7fff carry into the half's bit 15
// exactly when they are not all zero (no carry crosses a half: 0x7fff + 0x7fff < 0x10000).
// Unpacking and comparing 8 values one by one made the pack bound by instruction issue.
template <typename T, int VEC>
__device__ __forceinline__ unsigned nonzero_bits(const typename Raw<T, VEC>::type& w) {
  if constexpr (VEC == 1) {
    return static_cast<unsigned>(is_nonzero(w));
  } else if constexpr (sizeof(T) == 2) {
    const auto high = [](unsigned x) { return ((x & 0x7fff7fffu) + 0x7fff7fffu) & 0x80008000u; };
    // Bit 15 of word k (value 2k) to bit 2k, bit 31 (value 2k + 1) to bit 16 + 2k.
    const unsigned x = high(w.x) >> 15 | high(w.y) >> 13 | high(w.z) >> 11 | high(w.w) >> 9;
    return (x & 0x55u) | (x >> 15 & 0xaau);
  } else {
    const Vec<T, VEC> v = *reinterpret_cast<const Vec<T, VEC>*>(&w);
    unsigned bits = 0;
#pragma unroll
    for (int i = 0; i < VEC; ++i) bits |= static_cast<unsigned>(is_nonzero(v.v[i])) << i;
    return bits;
  }
}

// PAIRS consecutive (row, tile) pairs first, first + 1, ... of one warp, each fitting in
// CHUNKS warp-wide vector loads (T <= CHUNKS * kWarp * VEC), kModeCount or kModeSlots. Returns
// the warp's entries past the slots, sum over its pairs of max(total - S, 0) (kModeSlots), the
// same in every lane.
// The PAIRS * CHUNKS loads are issued before anything else. The count pass sums the lanes'
// counts with one reduction a pair. The slots pass ranks a lane's non-zeros with one ballot per
// bit of the largest count in the warp (one in most warps at 99% sparsity), then the
// slots go out through shared memory: each lane writes the columns of its non-zeros of rank < S
// to stage_cols[pair][rank] (its values are already in stage_vals, the tile as loaded), and the
// warp writes the PAIRS * S consecutive slots of its pairs, zeros after each count included,
// with coalesced stores (per-non-zero 2-byte stores scattered over the slots, a select chain
// per value and a second loop for the zeros made an earlier version bound by instruction issue).
// The kernel is bound by instruction issue, not memory (ncu; docs/design.rst, the pack):
// each cut above is in instructions a pair.
template <typename T, int VEC, int PAIRS, int CHUNKS>
__device__ __forceinline__ int pack_pairs_staged(
    const T* __restrict__ dense, long long n_cols, long long tiles, int tile_width, int slots,
    int mode, long long first, long long n_pairs, int lane, int* __restrict__ totals,
    int* __restrict__ counts, T* __restrict__ data, unsigned short* __restrict__ indices) {
  using R = typename Raw<T, VEC>::type;
  constexpr int kSpan = kWarp * VEC;     // columns of one warp-wide load
  constexpr int kTile = CHUNKS * kSpan;  // the widest tile this path takes
  __shared__ R stage_vals[kPackWarps][PAIRS][CHUNKS * kWarp];
  __shared__ unsigned short stage_cols[kPackWarps][PAIRS][kTile];
  const int warp = threadIdx.x / kWarp;  // < kPackWarps (__launch_bounds__)
  const int j0 = lane * VEC;             // the lane's first column of each load
  // Pairs first .. first + n_live - 1 exist (n_live >= 1: the caller returned otherwise).
  const int n_live = static_cast<int>(min(static_cast<long long>(PAIRS), n_pairs - first));
  // Lane q < n_live finds pair first + q's start in the matrix and its width (a partial last
  // tile is narrower), and the warp reads them by shuffle: the 64-bit row, tile and address
  // arithmetic runs once a pair instead of once a pair in every lane (in every lane it was
  // ~170 of the slots pass's ~620 instructions a warp, by ncu). A dead pair has
  // width 0 and loads nothing.
  long long start = 0;
  int width = 0;
  if (lane < n_live) {
    const long long pair = first + lane;
    long long row, tile;
    if (n_pairs <= 0xffffffffll) {  // a 32-bit division: a 64-bit one is a long routine
      const unsigned p = static_cast<unsigned>(pair), t = static_cast<unsigned>(tiles);
      row = p / t;
      tile = p - static_cast<unsigned>(row) * t;
    } else {
      row = pair / tiles;
      tile = pair - row * tiles;
    }
    const long long col0 = tile * tile_width;
    width = static_cast<int>(min(static_cast<long long>(tile_width), n_cols - col0));
    start = row * n_cols + col0;
  }
  R w[PAIRS][CHUNKS];
#pragma unroll
  for (int q = 0; q < PAIRS; ++q) {
    const long long start_q = __shfl_sync(kFullMask, start, q);
    const int width_q = __shfl_sync(kFullMask, width, q);
    const R* src = reinterpret_cast<const R*>(dense + start_q + j0);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c)
      w[q][c] = j0 + c * kSpan < width_q ? src[c * kWarp] : Raw<T, VEC>::zero();
  }
  // total[q] for a run-time q is pick(total, q): a select chain keeps total[] in registers.
  int total[PAIRS];
  if (mode != kModeSlots) {
#pragma unroll
    for (int q = 0; q < PAIRS; ++q) {
      int n = 0;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) n += __popc(nonzero_bits<T, VEC>(w[q][c]));
      total[q] = __reduce_add_sync(kFullMask, n);
    }
    if (lane < n_live) totals[first + lane] = pick(total, lane);
    return 0;
  }
  const unsigned below = (1u << lane) - 1u;  // the lanes before this one
#pragma unroll
  for (int q = 0; q < PAIRS; ++q) {
    int sum = 0;  // non-zeros of the chunks before this one
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const unsigned bits = nonzero_bits<T, VEC>(w[q][c]);
      const int n = __popc(bits);
      // Bit b of every lane's count in one ballot gives the sums before this lane and over
      // the warp; bits above the largest count in the warp are zero everywhere.
      const int widest = 32 - __clz(__reduce_or_sync(kFullMask, static_cast<unsigned>(n)));
      int before = sum;
#pragma unroll
      for (int b = 0; (1 << b) <= VEC; ++b) {
        if (b < widest) {
          const unsigned m = __ballot_sync(kFullMask, (n >> b) & 1);
          before += __popc(m & below) << b;
          sum += __popc(m) << b;
        }
      }
      stage_vals[warp][q][c * kWarp + lane] = w[q][c];
      const int j = static_cast<int>(j0) + c * kSpan;
      int rank = before;
      for (unsigned rest = bits; rest != 0u && rank < slots; rest &= rest - 1u, ++rank)
        stage_cols[warp][q][rank] = static_cast<unsigned short>(j + __ffs(rest) - 1);
    }
    total[q] = sum;  // a dead pair loaded zeros: 0
  }
  int over = 0;
#pragma unroll
  for (int q = 0; q < PAIRS; ++q) over += max(total[q] - slots, 0);
  if (lane < n_live) {
    const int t = pick(total, lane);
    totals[first + lane] = t;
    counts[first + lane] = min(t, slots);
  }
  __syncwarp();  // stage_vals and stage_cols written by every lane
  const T* staged = reinterpret_cast<const T*>(stage_vals[warp]);
  T* __restrict__ out_data = data + first * slots;
  unsigned short* __restrict__ out_indices = indices + first * slots;
  // e / S by a multiply-high with ceil(2^32 / S): exact for e < 2^16 and S <= 2^16 (e <
  // PAIRS * S <= 4 * 1024 here), where a division is a routine of ~20 instructions.
  const unsigned inverse = 0xffffffffu / static_cast<unsigned>(slots) + 1u;
  for (int e = lane; e < n_live * slots; e += kWarp) {
    const int q = slots == 1 ? e : static_cast<int>(__umulhi(static_cast<unsigned>(e), inverse));
    const int s = e - q * slots;
    T value = Value<T>::zero();
    unsigned short col = 0;
    if (s < pick(total, q)) {
      col = stage_cols[warp][q][s];
      value = staged[q * kTile + col];
    }
    out_data[e] = value;
    out_indices[e] = col;
  }
  return over;
}

// Dense (M, K) row-major -> TwELL, kModeCount and kModeSlots (kModeOverflow: the kernel
// below). Lane l reads VEC consecutive columns per step (16-byte loads when VEC > 1: the
// launcher checks that K, T and the base pointer are multiples of 16 bytes).
//   PAIRS == CHUNKS == 1: one warp per (row, tile), stepping through the tile kWarp * VEC
//               columns at a time (any tile width).
//   otherwise:  one warp per PAIRS consecutive (row, tile) pairs, each of which fits in CHUNKS
//               steps (the launcher checks T <= CHUNKS * kWarp * VEC): pack_pairs_staged.
// In kModeSlots every slot is written (zeros after the count), so data/indices need no prior
// memset, and the number of entries past the slots, sum over pairs of max(total - S, 0), is
// added to *n_overflow (zeroed by the launcher): one integer atomicAdd per warp with overflow,
// so the total is deterministic. kModeCount leaves *n_overflow alone.
// Index: the type of a column within a tile; int (tiles wider than 65536 columns) takes one
// pair per warp.
// Grid: ceil(ceil(M * n_tiles / PAIRS) / kPackWarps) blocks of kPackWarps warps.
template <typename T, int VEC, int PAIRS, int CHUNKS = 1, typename Index = unsigned short>
__global__ void __launch_bounds__(kPackWarps * kWarp)
twell_pack_dense(const T* __restrict__ dense, long long n_rows, long long n_cols,
                 int tile_width, int slots, int mode,
                 int* __restrict__ totals, int* __restrict__ counts,
                 T* __restrict__ data, Index* __restrict__ indices,
                 unsigned long long* __restrict__ n_overflow) {
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "VEC is 1 or one 16-byte vector");
  static_assert(PAIRS >= 1 && CHUNKS >= 1 && PAIRS * CHUNKS <= 4,
                "PAIRS * CHUNKS is a small number of loads per lane");
  static_assert(sizeof(Index) == 2 || (PAIRS == 1 && CHUNKS == 1),
                "wide tiles (int columns) take one pair per warp");
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long n_pairs = n_rows * tiles;
  const long long first =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp * PAIRS;
  const int lane = threadIdx.x % kWarp;
  if (first >= n_pairs) return;  // whole warp
  int over;  // entries past the slots in this warp's pairs (<= PAIRS * T)
  if constexpr (PAIRS == 1 && CHUNKS == 1) {
    const int total = pack_pair<T, VEC, Index>(dense, n_cols, tiles, tile_width, slots, mode,
                                               first, lane, data, indices, nullptr, nullptr,
                                               nullptr);
    over = finish_pair<T, Index>(total, lane, mode, first, slots, totals, counts, data, indices);
  } else {
    over = pack_pairs_staged<T, VEC, PAIRS, CHUNKS>(dense, n_cols, tiles, tile_width, slots,
                                                    mode, first, n_pairs, lane, totals, counts,
                                                    data, indices);
  }
  if (mode == kModeSlots && lane == 0 && over > 0)
    atomicAdd(n_overflow, static_cast<unsigned long long>(over));
}

// Dense -> TwELL, kModeOverflow: the entries of rank >= S of the pairs with totals > S go to
// the overflow. One warp per 32 consecutive (row, tile) pairs: lane l reads totals[first + l]
// (one coalesced load), and the warp then packs the overflowing pairs among them one after the
// other (pack_pair). Overflowing pairs are few (the slots hold most entries), so the launch
// touches the totals, not the matrix, except where it must: a warp per pair, as the slots
// pass has, spent most of its time starting warps that had nothing to do.
// Grid: ceil(ceil(M * n_tiles / kWarp) / warps per block) blocks of whole warps.
template <typename T, int VEC>
__global__ void twell_pack_dense_overflow(const T* __restrict__ dense, long long n_rows,
                                          long long n_cols, int tile_width, int slots,
                                          const int* __restrict__ totals,
                                          const long long* __restrict__ overflow_offset,
                                          int* __restrict__ overflow_indices,
                                          T* __restrict__ overflow_data) {
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "VEC is 1 or one 16-byte vector");
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long n_pairs = n_rows * tiles;
  const long long first =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp * kWarp;
  const int lane = threadIdx.x % kWarp;
  if (first >= n_pairs) return;  // whole warp
  const bool overflows = first + lane < n_pairs && totals[first + lane] > slots;
  for (unsigned rest = __ballot_sync(kFullMask, overflows); rest != 0u; rest &= rest - 1u) {
    pack_pair<T, VEC, unsigned short>(dense, n_cols, tiles, tile_width, slots, kModeOverflow,
                      first + (__ffs(rest) - 1), lane, nullptr, nullptr, overflow_offset,
                      overflow_indices, overflow_data);
  }
}

// Canonical CSR (sorted, no duplicates, no zeros) -> TwELL. One warp per row; lane l takes
// entries start + l, start + l + 32, ...; an entry's rank in its tile is its distance to the
// tile's first entry, found by binary search. The entry that ends a tile writes its
// totals/counts, so totals, counts, data and indices must be zero-filled before kModeSlots.
// In kModeSlots the entries past the slots, sum over pairs of max(total - S, 0), are added to
// *n_overflow (zeroed by the launcher): one integer atomicAdd per warp (row) with overflow.
// Index: the type of a column within a tile (unsigned short, or int for tiles wider than 65536
// columns).
// Grid: ceil(M / warps per block) blocks of whole warps.
template <typename T, typename Index = unsigned short>
__global__ void twell_pack_csr(const long long* __restrict__ indptr, const int* __restrict__ col_in,
                               const T* __restrict__ val_in, long long n_rows, long long n_cols,
                               int tile_width, int slots, int mode,
                               int* __restrict__ totals, int* __restrict__ counts,
                               T* __restrict__ data, Index* __restrict__ indices,
                               const long long* __restrict__ overflow_offset,
                               int* __restrict__ overflow_indices, T* __restrict__ overflow_data,
                               unsigned long long* __restrict__ n_overflow) {
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_rows) return;
  const long long start = indptr[row], end = indptr[row + 1];
  long long over = 0;  // this lane's entries past the slots (kModeSlots)
  for (long long j = start + lane; j < end; j += kWarp) {
    const int col = col_in[j];
    const int tile = col / tile_width;
    const int tile_col0 = tile * tile_width;
    const int rank = static_cast<int>(j - lower_bound(col_in, start, j, tile_col0));
    const long long pair = row * tiles + tile;
    const bool ends_tile = j + 1 == end || col_in[j + 1] / tile_width != tile;
    if (mode == kModeOverflow) {
      if (rank >= slots) {
        const long long o = overflow_offset[pair] + (rank - slots);
        overflow_indices[o] = col;
        overflow_data[o] = val_in[j];
      }
      continue;
    }
    if (mode == kModeSlots && rank < slots) {
      data[pair * slots + rank] = val_in[j];
      indices[pair * slots + rank] = static_cast<Index>(col - tile_col0);
    }
    if (ends_tile) {
      totals[pair] = rank + 1;
      if (mode == kModeSlots) counts[pair] = min(rank + 1, slots);
      over += max(rank + 1 - slots, 0);
    }
  }
  if (mode == kModeSlots) {  // whole warp: every lane has left the loop
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset >>= 1)
      over += __shfl_xor_sync(kFullMask, over, offset);
    if (lane == 0 && over > 0) atomicAdd(n_overflow, static_cast<unsigned long long>(over));
  }
}
