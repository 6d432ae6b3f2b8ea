// unpack.cu: TwELL -> dense (with the overflow scatter) and TwELL -> CSR.
#include "twell_layout.cuh"

using namespace twell;

// TwELL slots -> dense (M, K) row-major. One warp per (row, tile): it writes zeros over the
// tile's columns of its row, then (after __syncwarp, which orders the warp's global writes)
// its slot entries. Every output element is written, so the output needs no memset; the
// overflow follows in twell_scatter_csr. Each lane reads its first slot together with the
// count (slots past the count hold zeros: reading them is harmless), so that a pair costs one
// round trip to memory, not two. Reading the count first was latency-bound; this way writes
// the paper's down projection as fast as a copy writes, and more pairs a warp do not help
// (docs/design.rst, the unpack). VEC > 1 needs K, T and the base
// pointer 16-byte aligned (the launcher checks). Index: the type of a column within a tile
// (unsigned short, or int for tiles wider than 65536 columns).
// Grid: ceil(M * n_tiles / warps per block) blocks of whole warps.
template <typename T, int VEC, typename Index = unsigned short>
__global__ void twell_unpack_dense(const int* __restrict__ counts, const T* __restrict__ data,
                                   const Index* __restrict__ indices, long long n_rows,
                                   long long n_cols, int tile_width, int slots, T* __restrict__ out) {
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "VEC is 1 or one 16-byte vector");
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long pair = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (pair >= n_rows * tiles) return;
  const long long row = pair / tiles;
  const long long col0 = (pair - row * tiles) * tile_width;
  const long long width = min(static_cast<long long>(tile_width), n_cols - col0);
  T* __restrict__ dst = out + row * n_cols + col0;
  T zeros[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) zeros[i] = Value<T>::zero();
  const long long base = pair * slots;
  const bool first = lane < slots;
  const int column = first ? indices[base + lane] : 0;
  const T value = first ? data[base + lane] : Value<T>::zero();
  const int used = counts[pair];
  for (long long j0 = lane * VEC; j0 < width; j0 += kWarp * VEC) store_vec<T, VEC>(dst, j0, zeros);
  __syncwarp();
  if (lane < used) dst[column] = value;
  for (int s = lane + kWarp; s < used; s += kWarp) dst[indices[base + s]] = data[base + s];
}

// CSR entries -> dense (M, K): out[row, col] = value, one thread per entry up to indptr[M] (the
// arrays may be longer: the layer's capacity-sized overflow); the row comes from a binary
// search in indptr. Used for the overflow after twell_unpack_dense.
// Grid: ceil(nnz / threads per block).
template <typename T>
__global__ void twell_scatter_csr(const long long* __restrict__ indptr, const int* __restrict__ cols,
                                  const T* __restrict__ vals, long long n_rows, long long nnz,
                                  long long n_cols, T* __restrict__ out) {
  const long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= nnz || j >= indptr[n_rows]) return;
  out[row_of(indptr, n_rows, j) * n_cols + cols[j]] = vals[j];
}

// TwELL -> CSR, one warp per row, in two modes:
//   kModeCount  row_info[row] = the row's entries (its slot counts plus its overflow entries);
//   kModeSlots  the row's entries in column order from out position row_info[row] (an
//               exclusive prefix sum of the counts): tile by tile, the tile's slot entries,
//               then its overflow entries, which follow the slots in column order. A lane takes
//               one tile; its overflow entries are found by two binary searches in the row's
//               overflow (sorted by column), and a warp-wide prefix sum places the tiles.
// Index: the type of a column within a tile, as for twell_unpack_dense.
// Grid: ceil(M / warps per block) blocks of whole warps.
template <typename T, typename Index = unsigned short>
__global__ void twell_rows_to_csr(const int* __restrict__ counts, const T* __restrict__ data,
                                  const Index* __restrict__ indices,
                                  const long long* __restrict__ overflow_indptr,
                                  const int* __restrict__ overflow_indices,
                                  const T* __restrict__ overflow_data, long long n_rows,
                                  long long n_cols, int tile_width, int slots, int mode,
                                  long long* __restrict__ row_info, int* __restrict__ out_indices,
                                  T* __restrict__ out_data) {
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_rows) return;
  const long long over_start = overflow_indptr[row], over_end = overflow_indptr[row + 1];
  if (mode == kModeCount) {
    long long n = 0;
    for (long long t = lane; t < tiles; t += kWarp) n += counts[row * tiles + t];
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset >>= 1) n += __shfl_xor_sync(kFullMask, n, offset);
    if (lane == 0) row_info[row] = n + (over_end - over_start);
    return;
  }
  long long base = row_info[row];
  for (long long t0 = 0; t0 < tiles; t0 += kWarp) {
    const long long t = t0 + lane, pair = row * tiles + t;
    const long long col0 = t * tile_width;
    int used = 0, over = 0;
    long long lo = over_start;
    if (t < tiles) {
      used = counts[pair];
      if (over_end > over_start) {
        lo = lower_bound(overflow_indices, over_start, over_end, col0);
        over = static_cast<int>(lower_bound(overflow_indices, lo, over_end, col0 + tile_width) - lo);
      }
    }
    const int total = used + over;  // <= tile_width
    const int inclusive = warp_inclusive_scan(total, lane);
    const long long at = base + (inclusive - total);
    for (int s = 0; s < used; ++s) {
      out_indices[at + s] = static_cast<int>(col0 + indices[pair * slots + s]);
      out_data[at + s] = data[pair * slots + s];
    }
    for (int q = 0; q < over; ++q) {
      out_indices[at + used + q] = overflow_indices[lo + q];
      out_data[at + used + q] = overflow_data[lo + q];
    }
    base += __shfl_sync(kFullMask, inclusive, kWarp - 1);
  }
}

// Writes what twell_layout.cuh computes for given inputs, so that a test can compare it with
// twell/_layout.py. One thread per query.
__global__ void twell_layout_probe(const long long* __restrict__ n_cols, const int* __restrict__ tile_width,
                                   int n, long long* __restrict__ out_tiles, int* __restrict__ out_capacity) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out_tiles[i] = n_tiles(n_cols[i], tile_width[i]);
  out_capacity[i] = i < 3 ? packed_capacity(2 << i) : 0;  // compressions 2, 4, 8
}
