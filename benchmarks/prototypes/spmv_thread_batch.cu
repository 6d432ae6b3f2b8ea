// PROTOTYPE (not in the package): y = A @ x for a TwELL A, a thread per row, the entries of a
// whole count batch read before any of their x values.
//
// The question (benchmarks/NOTES.md, eleventh session, open question 6): the shipped
// twell_spmv_thread_rows walks a batch's non-empty tiles one after another, each tile's chain
// being entries -> x, so a stencil row whose 5 entries sit in 2 tiles waits for counts ->
// entries -> x -> entries -> x (0.083 ms at tile width 65536, torch's cuSPARSE 0.031, floor
// ~0.034). Here the counts of kAhead tiles give, by an unrolled prefix sum in registers, where
// each of the batch's entries lies; the thread loads kBuf entries (values and columns) from
// whichever tiles hold them, then their kBuf x values, then multiplies: the chain per batch is
// counts -> entries -> x. Summed in the plain order (tiles, then slots, then the overflow),
// one product after another. Overflows longer than kOwnOverflow entries are summed by the
// whole warp, as the shipped kernel does (dot products by lanes, then a fixed butterfly).
// Grid: ceil(M / kBlock), blocks of kBlock threads.
#include "twell_layout.cuh"

using namespace twell;

namespace {

constexpr int kAhead = 8;        // counts read at once
constexpr int kBuf = 8;          // entries read before their x values
constexpr int kBlock = 256;      // threads per block
constexpr int kBlocksPerSM = 4;  // 64 registers
constexpr int kOwnOverflow = 16;

template <typename T>
__device__ __forceinline__ void spmv_thread_batch(
    const int* __restrict__ counts, const T* __restrict__ data,
    const unsigned short* __restrict__ indices, const long long* __restrict__ overflow_indptr,
    const int* __restrict__ overflow_indices, const T* __restrict__ overflow_data,
    long long n_rows, long long n_cols, int tile_width, int slots, const T* __restrict__ x,
    T* __restrict__ y) {
  using Acc = typename Value<T>::Acc;
  const int lane = threadIdx.x % kWarp;
  const long long row = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row - lane >= n_rows) return;  // the whole warp
  const bool live = row < n_rows;
  const long long tiles = n_tiles(n_cols, tile_width);
  long long o_start = 0, o_end = 0;
  Acc acc = Acc(0);
  if (live) {
    o_start = overflow_indptr[row];
    o_end = overflow_indptr[row + 1];
    const int* __restrict__ row_counts = counts + row * tiles;
    for (long long t0 = 0; t0 < tiles; t0 += kAhead) {
      int start[kAhead + 1];  // start[k]: the batch's entries before tile t0 + k
      start[0] = 0;
#pragma unroll
      for (int k = 0; k < kAhead; ++k)
        start[k + 1] = start[k] + (t0 + k < tiles ? row_counts[t0 + k] : 0);
      const int total = start[kAhead];
      for (int e0 = 0; e0 < total; e0 += kBuf) {
        T v[kBuf];
        int col[kBuf];  // global column, -1 past the batch
#pragma unroll
        for (int u = 0; u < kBuf; ++u) {
          const int e = e0 + u;
          // The tile of entry e: how many tiles of the batch end at or before it.
          int k = 0, first = 0;
#pragma unroll
          for (int q = 1; q < kAhead; ++q) {
            const bool past = start[q] <= e;
            k += past;
            first = past ? start[q] : first;
          }
          const bool in = e < total;
          const long long s = (row * tiles + t0 + k) * slots + (e - first);
          v[u] = in ? data[s] : Value<T>::zero();
          col[u] = in ? static_cast<int>((t0 + k) * tile_width + indices[s]) : -1;
        }
        T xv[kBuf];
#pragma unroll
        for (int u = 0; u < kBuf; ++u) xv[u] = col[u] >= 0 ? x[col[u]] : Value<T>::zero();
#pragma unroll
        for (int u = 0; u < kBuf; ++u) {
          // Past the batch nothing is multiplied (0 * Inf would be NaN).
          if (col[u] >= 0) acc += Value<T>::to_acc(v[u]) * Value<T>::to_acc(xv[u]);
        }
      }
    }
    if (o_end - o_start <= kOwnOverflow) {
      for (long long j0 = o_start; j0 < o_end; j0 += kBuf) {
        T v[kBuf], xv[kBuf];
#pragma unroll
        for (int u = 0; u < kBuf; ++u) {
          const bool in = j0 + u < o_end;
          v[u] = in ? overflow_data[j0 + u] : Value<T>::zero();
          xv[u] = in ? x[overflow_indices[j0 + u]] : Value<T>::zero();
        }
#pragma unroll
        for (int u = 0; u < kBuf; ++u) {
          if (j0 + u < o_end) acc += Value<T>::to_acc(v[u]) * Value<T>::to_acc(xv[u]);
        }
      }
    }
  }
  for (unsigned long_rows = __ballot_sync(kFullMask, o_end - o_start > kOwnOverflow);
       long_rows != 0u; long_rows &= long_rows - 1u) {
    const int owner = __ffs(long_rows) - 1;
    const long long s = __shfl_sync(kFullMask, o_start, owner);
    const long long e = __shfl_sync(kFullMask, o_end, owner);
    Acc part = Acc(0);
    for (long long j = s + lane; j < e; j += kWarp)
      part += Value<T>::to_acc(overflow_data[j]) * Value<T>::to_acc(x[overflow_indices[j]]);
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset >>= 1)
      part += __shfl_xor_sync(kFullMask, part, offset);
    if (lane == owner) acc += part;
  }
  if (live) y[row] = Value<T>::from_acc(acc);
}

}  // namespace

#define TWELL_PROTO_SPMV(NAME, T)                                                              \
  extern "C" __global__ void __launch_bounds__(kBlock, kBlocksPerSM) NAME(                     \
      const int* __restrict__ counts, const T* __restrict__ data,                              \
      const unsigned short* __restrict__ indices, const long long* __restrict__ overflow_indptr, \
      const int* __restrict__ overflow_indices, const T* __restrict__ overflow_data,            \
      long long n_rows, long long n_cols, int tile_width, int slots, const T* __restrict__ x,   \
      T* __restrict__ y) {                                                                     \
    spmv_thread_batch<T>(counts, data, indices, overflow_indptr, overflow_indices,             \
                         overflow_data, n_rows, n_cols, tile_width, slots, x, y);              \
  }

TWELL_PROTO_SPMV(proto_spmv_thread_batch_f32, float)
TWELL_PROTO_SPMV(proto_spmv_thread_batch_f64, double)
TWELL_PROTO_SPMV(proto_spmv_thread_batch_bf16, __nv_bfloat16)
