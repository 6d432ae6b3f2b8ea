// pack.cu: dense -> TwELL and CSR -> TwELL.
//
// Both kernels run in one of three modes (twell::kMode*), launched in this order:
//   kModeCount    totals[pair] = number of non-zeros of the (row, tile)            (slots="auto")
//   kModeSlots    the first S non-zeros of each (row, tile) go to the slots in column order;
//                 counts[pair] = min(total, S); totals[pair] = total
//   kModeOverflow the non-zeros of rank >= S go to overflow position
//                 overflow_offset[pair] + rank - S (an exclusive prefix sum of max(total - S, 0)
//                 over pairs in row-major order, so the overflow is a CSR in column order)
// Ranks come from warp-wide prefix sums (dense) or binary searches (CSR), never from atomics:
// packing is deterministic and canonical.
#include "twell_layout.cuh"

using namespace twell;

// Dense (M, K) row-major -> TwELL. One warp per (row, tile); lane l reads VEC consecutive
// columns per step (16-byte loads when VEC > 1: the launcher checks that K, T and the base
// pointer are multiples of 16 bytes). In kModeSlots every slot is written (zeros after the
// count), so data/indices need no prior memset.
// Grid: ceil(M * n_tiles / warps per block) blocks of whole warps.
template <typename T, int VEC>
__global__ void twell_pack_dense(const T* __restrict__ dense, long long n_rows, long long n_cols,
                                 int tile_width, int slots, int mode,
                                 int* __restrict__ totals, int* __restrict__ counts,
                                 T* __restrict__ data, unsigned short* __restrict__ indices,
                                 const long long* __restrict__ overflow_offset,
                                 int* __restrict__ overflow_indices, T* __restrict__ overflow_data) {
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "VEC is 1 or one 16-byte vector");
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long pair = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (pair >= n_rows * tiles) return;                                  // whole warp
  if (mode == kModeOverflow && totals[pair] <= slots) return;          // whole warp
  const long long row = pair / tiles;
  const long long col0 = (pair - row * tiles) * tile_width;
  const long long width = min(static_cast<long long>(tile_width), n_cols - col0);
  const T* __restrict__ src = dense + row * n_cols + col0;
  int base = 0;  // non-zeros in the chunks before this one
  for (long long c0 = 0; c0 < width; c0 += kWarp * VEC) {
    const long long j0 = c0 + lane * VEC;
    T v[VEC];
    load_vec<T, VEC>(src, j0, width, v);
    unsigned bits = 0;
#pragma unroll
    for (int i = 0; i < VEC; ++i) bits |= static_cast<unsigned>(is_nonzero(v[i])) << i;
    const int n = __popc(bits);
    const int inclusive = warp_inclusive_scan(n, lane);
    int rank = base + inclusive - n;
    if (mode == kModeSlots) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        if ((bits >> i) & 1u) {
          if (rank < slots) {
            data[pair * slots + rank] = v[i];
            indices[pair * slots + rank] = static_cast<unsigned short>(j0 + i);
          }
          ++rank;
        }
      }
    } else if (mode == kModeOverflow) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        if ((bits >> i) & 1u) {
          if (rank >= slots) {
            const long long o = overflow_offset[pair] + (rank - slots);
            overflow_indices[o] = static_cast<int>(col0 + j0 + i);
            overflow_data[o] = v[i];
          }
          ++rank;
        }
      }
    }
    base += __shfl_sync(kFullMask, inclusive, kWarp - 1);
  }
  if (mode == kModeSlots) {
    const int used = min(base, slots);
    for (int s = used + lane; s < slots; s += kWarp) {
      data[pair * slots + s] = Value<T>::zero();
      indices[pair * slots + s] = 0;
    }
    if (lane == 0) counts[pair] = used;
  }
  if (lane == 0 && mode != kModeOverflow) totals[pair] = base;
}

// Canonical CSR (sorted, no duplicates, no zeros) -> TwELL. One warp per row; lane l takes
// entries start + l, start + l + 32, ...; an entry's rank in its tile is its distance to the
// tile's first entry, found by binary search. The entry that ends a tile writes its
// totals/counts, so totals, counts, data and indices must be zero-filled before kModeSlots.
// Grid: ceil(M / warps per block) blocks of whole warps.
template <typename T>
__global__ void twell_pack_csr(const long long* __restrict__ indptr, const int* __restrict__ col_in,
                               const T* __restrict__ val_in, long long n_rows, long long n_cols,
                               int tile_width, int slots, int mode,
                               int* __restrict__ totals, int* __restrict__ counts,
                               T* __restrict__ data, unsigned short* __restrict__ indices,
                               const long long* __restrict__ overflow_offset,
                               int* __restrict__ overflow_indices, T* __restrict__ overflow_data) {
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_rows) return;
  const long long start = indptr[row], end = indptr[row + 1];
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
    }
  }
}
