// PROTOTYPE (not in the package): y = A @ x for a TwELL A, one thread per row.
//
// The question (benchmarks/NOTES.md, tenth session, open question 1): the shipped SpMV
// (twell_spmv_rows, a team of 8 or 32 lanes per row) is 2-4x slower than cuSPARSE's CSR on
// the 10^6-row stencil and graph at tile width 65536, and latency-bound (floors 0.03-0.05
// ms, measured 0.16-0.52). Its chain per row: count read, vote, scan and search by
// shuffles, entry read, x read, a butterfly. Here a thread takes a row: it reads the counts
// of kAhead tiles at once (independent loads), then the entries of each non-empty tile, up
// to kEntries of them at once (values and columns, then the x values), and the overflow
// kEntries at a time. No shuffles: the chain is counts -> entries -> x, as CSR's is
// indptr -> entries -> x, and a warp holds 32 rows. The sums are in the plain order
// (tiles, then slots, then the overflow), one after another.
//
// Expected to pay on short rows of similar lengths (the stencil: a warp's 32 rows end
// together) and to lose on skewed ones (the graph's hub would be one thread's serial work);
// the runner, spmv_tuning.py, times it on both against the shipped kernel and torch.
// Grid: ceil(M / kBlock), blocks of kBlock threads.
#include "twell_layout.cuh"

using namespace twell;

namespace {

constexpr int kAhead = 8;    // counts read at once
constexpr int kEntries = 4;  // entries (and then x values) read at once
// Blocks of kBlock threads, at least kBlocksPerSM of them per SM: 64 registers a thread, 32
// warps per SM (uncapped it took 94-96 registers, 20 warps: too few rows in flight for a
// latency-bound kernel).
constexpr int kBlock = 256;
constexpr int kBlocksPerSM = 4;

template <typename T>
__device__ __forceinline__ void spmv_thread_rows(
    const int* __restrict__ counts, const T* __restrict__ data,
    const unsigned short* __restrict__ indices, const long long* __restrict__ overflow_indptr,
    const int* __restrict__ overflow_indices, const T* __restrict__ overflow_data,
    long long n_rows, long long n_cols, int tile_width, int slots, const T* __restrict__ x,
    T* __restrict__ y) {
  using Acc = typename Value<T>::Acc;
  const long long row = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= n_rows) return;
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
  const int* row_counts = counts + row * tiles;
  Acc acc = Acc(0);
  for (long long t0 = 0; t0 < tiles; t0 += kAhead) {
    int c[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) c[k] = t0 + k < tiles ? row_counts[t0 + k] : 0;
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const long long tile = t0 + k, base = (row * tiles + tile) * slots;
      for (int s0 = 0; s0 < c[k]; s0 += kEntries) {
        T v[kEntries];
        int col[kEntries];  // global column (< 2^31: the layout's rule), -1 past the count
#pragma unroll
        for (int u = 0; u < kEntries; ++u) {
          const bool in = s0 + u < c[k];
          v[u] = in ? data[base + s0 + u] : Value<T>::zero();
          col[u] = in ? static_cast<int>(tile * tile_width + indices[base + s0 + u]) : -1;
        }
        T xv[kEntries];
#pragma unroll
        for (int u = 0; u < kEntries; ++u) xv[u] = col[u] >= 0 ? x[col[u]] : Value<T>::zero();
#pragma unroll
        for (int u = 0; u < kEntries; ++u) {
          // Past the count nothing is multiplied (0 * Inf would be NaN).
          if (col[u] >= 0) acc += Value<T>::to_acc(v[u]) * Value<T>::to_acc(xv[u]);
        }
      }
    }
  }
  for (long long j0 = o_start; j0 < o_end; j0 += kEntries) {
    T v[kEntries], xv[kEntries];
#pragma unroll
    for (int u = 0; u < kEntries; ++u) {
      const bool in = j0 + u < o_end;
      v[u] = in ? overflow_data[j0 + u] : Value<T>::zero();
      xv[u] = in ? x[overflow_indices[j0 + u]] : Value<T>::zero();
    }
#pragma unroll
    for (int u = 0; u < kEntries; ++u) {
      if (j0 + u < o_end) acc += Value<T>::to_acc(v[u]) * Value<T>::to_acc(xv[u]);
    }
  }
  y[row] = Value<T>::from_acc(acc);
}

}  // namespace

#define TWELL_PROTO_SPMV(NAME, T)                                                             \
  extern "C" __global__ void __launch_bounds__(kBlock, kBlocksPerSM) NAME(                    \
      const int* __restrict__ counts, const T* __restrict__ data,                             \
      const unsigned short* __restrict__ indices, const long long* __restrict__ overflow_indptr, \
      const int* __restrict__ overflow_indices, const T* __restrict__ overflow_data,           \
      long long n_rows, long long n_cols, int tile_width, int slots, const T* __restrict__ x,  \
      T* __restrict__ y) {                                                                    \
    spmv_thread_rows<T>(counts, data, indices, overflow_indptr, overflow_indices,             \
                        overflow_data, n_rows, n_cols, tile_width, slots, x, y);              \
  }

TWELL_PROTO_SPMV(proto_spmv_thread_rows_f32, float)
TWELL_PROTO_SPMV(proto_spmv_thread_rows_f64, double)
TWELL_PROTO_SPMV(proto_spmv_thread_rows_bf16, __nv_bfloat16)
