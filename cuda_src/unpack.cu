// unpack.cu: TwELL -> dense and TwELL -> CSR, plus the overflow scatter both need.
#include "twell_layout.cuh"

using namespace twell;

// TwELL slots -> dense (M, K) row-major. One warp per (row, tile): it writes zeros over the
// tile's columns of its row, then (after __syncwarp, which orders the warp's global writes)
// its slot entries. Every output element is written, so the output needs no memset; the
// overflow follows in twell_scatter_csr. VEC > 1 needs K, T and the base pointer 16-byte
// aligned (the launcher checks).
// Grid: ceil(M * n_tiles / warps per block) blocks of whole warps.
template <typename T, int VEC>
__global__ void twell_unpack_dense(const int* __restrict__ counts, const T* __restrict__ data,
                                   const unsigned short* __restrict__ indices, long long n_rows,
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
  for (long long j0 = lane * VEC; j0 < width; j0 += kWarp * VEC) store_vec<T, VEC>(dst, j0, zeros);
  __syncwarp();
  const int used = counts[pair];
  for (int s = lane; s < used; s += kWarp) dst[indices[pair * slots + s]] = data[pair * slots + s];
}

// CSR entries -> dense (M, K): out[row, col] = value, one thread per entry; the row comes from
// a binary search in indptr. Used for the overflow after twell_unpack_dense.
// Grid: ceil(nnz / threads per block).
template <typename T>
__global__ void twell_scatter_csr(const long long* __restrict__ indptr, const int* __restrict__ cols,
                                  const T* __restrict__ vals, long long n_rows, long long nnz,
                                  long long n_cols, T* __restrict__ out) {
  const long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= nnz) return;
  out[row_of(indptr, n_rows, j) * n_cols + cols[j]] = vals[j];
}

// TwELL slots -> CSR positions: slot s of pair p goes to tile_offset[p] + s, where tile_offset
// is the exclusive prefix sum over pairs of (count + overflow entries of the pair): a tile's
// slot entries come first, then its overflow entries (placed by the caller).
// One thread per slot. Grid: ceil(M * n_tiles * S / threads per block).
template <typename T>
__global__ void twell_slots_to_csr(const int* __restrict__ counts, const T* __restrict__ data,
                                   const unsigned short* __restrict__ indices, long long n_pairs,
                                   long long tiles, int tile_width, int slots,
                                   const long long* __restrict__ tile_offset,
                                   int* __restrict__ out_indices, T* __restrict__ out_data) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_pairs * slots) return;
  const long long pair = i / slots;
  const int s = static_cast<int>(i - pair * slots);
  if (s >= counts[pair]) return;
  const long long pos = tile_offset[pair] + s;
  out_indices[pos] = static_cast<int>((pair % tiles) * tile_width + indices[i]);
  out_data[pos] = data[i];
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
