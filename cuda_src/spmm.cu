// spmm.cu: Y = A @ B and y = A @ x for a TwELL matrix A (M, K) and dense row-major B (K, N).
//
// Accumulation in fp32 (fp64 for double), in a fixed order (tiles, then slots, then the
// row's overflow entries): results are deterministic, no atomics.
#include "twell_layout.cuh"

using namespace twell;

// SpMM. One warp per (row, 32 * VEC output columns): lane l owns columns
// n0 = (blockIdx.y * 32 + l) * VEC ... n0 + VEC - 1. The warp reads 32 slots at a time, one per
// lane, and broadcasts each entry with shuffles; for every entry each lane loads its VEC values
// of the B row (one 16-byte load when VEC > 1: the launcher checks N % VEC == 0 and alignment).
// Entries are taken four at a time so that four B loads are in flight before the FMAs.
// Grid: (ceil(M / warps per block), ceil(N / (32 * VEC))).
template <typename T, int VEC>
__global__ void twell_spmm_rows(const int* __restrict__ counts, const T* __restrict__ data,
                                const unsigned short* __restrict__ indices,
                                const long long* __restrict__ overflow_indptr,
                                const int* __restrict__ overflow_indices,
                                const T* __restrict__ overflow_data, long long n_rows,
                                long long n_cols, int tile_width, int slots,
                                const T* __restrict__ b, long long n, T* __restrict__ out) {
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "VEC is 1 or one 16-byte vector");
  using Acc = typename Value<T>::Acc;
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_rows) return;
  const long long n0 = (static_cast<long long>(blockIdx.y) * kWarp + lane) * VEC;
  const bool active = n0 < n;
  Acc acc[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) acc[i] = Acc(0);

  // Accumulate `len` entries held one per lane (lanes >= len hold zeros).
  auto consume = [&](int len, Acc my_val, long long my_col) {
    for (int e0 = 0; e0 < len; e0 += 4) {
      Acc v[4];
      T bv[4][VEC];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        v[u] = __shfl_sync(kFullMask, my_val, e0 + u);
        const long long col = __shfl_sync(kFullMask, my_col, e0 + u);
        // Entries past len (and idle lanes) read row 0 of B and multiply by zero... unless
        // B holds Inf/NaN, so they are skipped instead.
        if (active && e0 + u < len) load_vec<T, VEC>(b + col * n, n0, n, bv[u]);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (active && e0 + u < len) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[i] += v[u] * Value<T>::to_acc(bv[u][i]);
        }
      }
    }
  };

  for (long long tile = 0; tile < tiles; ++tile) {
    const long long pair = row * tiles + tile;
    const int used = counts[pair];
    for (int s0 = 0; s0 < used; s0 += kWarp) {
      const int s = s0 + lane;
      Acc my_val = Acc(0);
      long long my_col = 0;
      if (s < used) {
        my_val = Value<T>::to_acc(data[pair * slots + s]);
        my_col = tile * tile_width + indices[pair * slots + s];
      }
      consume(min(kWarp, used - s0), my_val, my_col);
    }
  }
  const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
  for (long long j0 = o_start; j0 < o_end; j0 += kWarp) {
    const long long j = j0 + lane;
    Acc my_val = Acc(0);
    long long my_col = 0;
    if (j < o_end) {
      my_val = Value<T>::to_acc(overflow_data[j]);
      my_col = overflow_indices[j];
    }
    consume(static_cast<int>(min(static_cast<long long>(kWarp), o_end - j0)), my_val, my_col);
  }
  if (active) {
    T res[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) res[i] = Value<T>::from_acc(acc[i]);
    if (VEC > 1) {
      store_vec<T, VEC>(out + row * n, n0, res);
    } else {
      out[row * n + n0] = res[0];
    }
  }
}

// SpMV. One warp per row; the lanes split the row's slots (all S of every tile, read
// contiguously) and overflow entries, then reduce with a fixed butterfly.
// Grid: ceil(M / warps per block).
template <typename T>
__global__ void twell_spmv(const int* __restrict__ counts, const T* __restrict__ data,
                           const unsigned short* __restrict__ indices,
                           const long long* __restrict__ overflow_indptr,
                           const int* __restrict__ overflow_indices,
                           const T* __restrict__ overflow_data, long long n_rows, long long n_cols,
                           int tile_width, int slots, const T* __restrict__ x, T* __restrict__ y) {
  using Acc = typename Value<T>::Acc;
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_rows) return;
  Acc acc = Acc(0);
  const long long base = row * tiles * slots;
  for (long long i = lane; i < tiles * slots; i += kWarp) {
    const long long tile = i / slots;
    if (i - tile * slots < counts[row * tiles + tile]) {
      acc += Value<T>::to_acc(data[base + i]) *
             Value<T>::to_acc(x[tile * tile_width + indices[base + i]]);
    }
  }
  for (long long j = overflow_indptr[row] + lane; j < overflow_indptr[row + 1]; j += kWarp) {
    acc += Value<T>::to_acc(overflow_data[j]) * Value<T>::to_acc(x[overflow_indices[j]]);
  }
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) acc += __shfl_xor_sync(kFullMask, acc, offset);
  if (lane == 0) y[row] = Value<T>::from_acc(acc);
}
