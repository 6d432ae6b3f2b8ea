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
// non-zeros, the same in every lane. Every lane of the warp must call it.
template <typename T, int VEC>
__device__ __forceinline__ int pack_pair(const T* __restrict__ dense, long long n_cols,
                                         long long tiles, int tile_width, int slots, int mode,
                                         long long pair, int lane, T* __restrict__ data,
                                         unsigned short* __restrict__ indices,
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

// Dense (M, K) row-major -> TwELL, kModeCount and kModeSlots (kModeOverflow: the kernel
// below). Lane l reads VEC consecutive columns per step (16-byte loads when VEC > 1: the
// launcher checks that K, T and the base pointer are multiples of 16 bytes).
//   PAIRS == 1: one warp per (row, tile), stepping through the tile kWarp * VEC columns at a
//               time (any tile width).
//   PAIRS > 1:  one warp per PAIRS consecutive (row, tile) pairs, each of which fits in one
//               step (the launcher checks T <= kWarp * VEC); the warp issues the loads of all
//               its pairs before any scan or store, so PAIRS loads per lane are in flight.
// In kModeSlots every slot is written (zeros after the count), so data/indices need no prior
// memset, and the number of entries past the slots, sum over pairs of max(total - S, 0), is
// added to *n_overflow (zeroed by the launcher): one integer atomicAdd per warp with overflow,
// so the total is deterministic. kModeCount leaves *n_overflow alone.
// Grid: ceil(ceil(M * n_tiles / PAIRS) / warps per block) blocks of whole warps.
template <typename T, int VEC, int PAIRS>
__global__ void twell_pack_dense(const T* __restrict__ dense, long long n_rows, long long n_cols,
                                 int tile_width, int slots, int mode,
                                 int* __restrict__ totals, int* __restrict__ counts,
                                 T* __restrict__ data, unsigned short* __restrict__ indices,
                                 unsigned long long* __restrict__ n_overflow) {
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "VEC is 1 or one 16-byte vector");
  static_assert(PAIRS >= 1 && PAIRS <= 8, "PAIRS is a small number of pairs per warp");
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long n_pairs = n_rows * tiles;
  const long long first =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp * PAIRS;
  const int lane = threadIdx.x % kWarp;
  if (first >= n_pairs) return;  // whole warp
  int over = 0;  // entries past the slots in this warp's pairs (<= PAIRS * T)
  if constexpr (PAIRS == 1) {
    const long long pair = first;
    const int total = pack_pair<T, VEC>(dense, n_cols, tiles, tile_width, slots, mode, pair, lane,
                                        data, indices, nullptr, nullptr, nullptr);
    over = finish_pair<T>(total, lane, mode, pair, slots, totals, counts, data, indices);
  } else {
    const long long row0 = first / tiles;
    const long long tile0 = first - row0 * tiles;
    const long long j0 = static_cast<long long>(lane) * VEC;
    // live[q]: pair first + q exists; the same in every lane.
    bool live[PAIRS];
    T v[PAIRS][VEC];
    {
      long long row = row0, tile = tile0;
#pragma unroll
      for (int q = 0; q < PAIRS; ++q) {
        live[q] = first + q < n_pairs;
        const long long col0 = tile * tile_width;
        // A dead pair loads nothing (limit 0) from the matrix's start.
        const long long width =
            live[q] ? min(static_cast<long long>(tile_width), n_cols - col0) : 0;
        load_vec<T, VEC>(dense + (live[q] ? row * n_cols + col0 : 0), j0, width, v[q]);
        if (++tile == tiles) { tile = 0; ++row; }
      }
    }
    long long tile = tile0;
#pragma unroll
    for (int q = 0; q < PAIRS; ++q) {
      const long long pair = first + q;
      if (live[q]) {  // whole warp
        const int total = pack_chunk<T, VEC>(v[q], j0, 0, lane, mode, pair, tile * tile_width,
                                             slots, data, indices, 0, nullptr, nullptr);
        over += finish_pair<T>(total, lane, mode, pair, slots, totals, counts, data, indices);
      }
      if (++tile == tiles) tile = 0;
    }
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
    pack_pair<T, VEC>(dense, n_cols, tiles, tile_width, slots, kModeOverflow,
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
// Grid: ceil(M / warps per block) blocks of whole warps.
template <typename T>
__global__ void twell_pack_csr(const long long* __restrict__ indptr, const int* __restrict__ col_in,
                               const T* __restrict__ val_in, long long n_rows, long long n_cols,
                               int tile_width, int slots, int mode,
                               int* __restrict__ totals, int* __restrict__ counts,
                               T* __restrict__ data, unsigned short* __restrict__ indices,
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
      indices[pair * slots + rank] = static_cast<unsigned short>(col - tile_col0);
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
