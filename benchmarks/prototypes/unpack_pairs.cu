// unpack_pairs.cu (prototype, benchmarks/prototypes/README.md): the shipped twell_unpack_dense
// (cuda_src/unpack.cu) with PAIRS consecutive (row, tile) pairs a warp: a warp issues the
// reads of all its pairs before the first store, and the grid has PAIRS times fewer blocks to
// schedule. Same writes, same order per pair, same bits. Run in the twentieth session (H200,
// call 8): no gain at 2, 4 or 8 pairs; the shipped kernel already writes at a copy's rate
// (benchmarks/NOTES.md).
#include "twell_layout.cuh"

using namespace twell;

template <typename T, int VEC, int PAIRS>
__device__ __forceinline__ void unpack_pairs(const int* __restrict__ counts,
                                             const T* __restrict__ data,
                                             const unsigned short* __restrict__ indices,
                                             long long n_rows, long long n_cols, int tile_width,
                                             int slots, T* __restrict__ out) {
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long total = n_rows * tiles;
  const long long first =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp * PAIRS;
  const int lane = threadIdx.x % kWarp;
  if (first >= total) return;  // whole warps
  int column[PAIRS], used[PAIRS];
  T value[PAIRS];
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const long long pair = first + p;
    const bool ok = pair < total, slot = ok && lane < slots;
    column[p] = slot ? indices[pair * slots + lane] : 0;
    value[p] = slot ? data[pair * slots + lane] : Value<T>::zero();
    used[p] = ok ? counts[pair] : 0;
  }
  T zeros[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) zeros[i] = Value<T>::zero();
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const long long pair = first + p;
    if (pair >= total) break;
    const long long row = pair / tiles;
    const long long col0 = (pair - row * tiles) * tile_width;
    const long long width = min(static_cast<long long>(tile_width), n_cols - col0);
    T* __restrict__ dst = out + row * n_cols + col0;
    for (long long j0 = lane * VEC; j0 < width; j0 += kWarp * VEC)
      store_vec<T, VEC>(dst, j0, zeros);
  }
  __syncwarp();  // the zeros before the entries over them
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const long long pair = first + p;
    if (pair >= total) break;
    const long long row = pair / tiles;
    T* __restrict__ dst = out + row * n_cols + (pair - row * tiles) * tile_width;
    if (lane < used[p]) dst[column[p]] = value[p];
    for (int s = lane + kWarp; s < used[p]; s += kWarp)
      dst[indices[pair * slots + s]] = data[pair * slots + s];
  }
}

// bf16 with 16-byte vectors (the paper's shapes), PAIRS 1 (the shipped kernel's work), 2, 4, 8.
// Grid: ceil(ceil(M * n_tiles / PAIRS) / 8) blocks of 256 threads.
#define TWELL_UNPACK_PAIRS(PAIRS)                                                          \
  extern "C" __global__ void __launch_bounds__(256) proto_unpack_pairs_bf16_##PAIRS(       \
      const int* __restrict__ counts, const __nv_bfloat16* __restrict__ data,              \
      const unsigned short* __restrict__ indices, long long n_rows, long long n_cols,      \
      int tile_width, int slots, __nv_bfloat16* __restrict__ out) {                        \
    unpack_pairs<__nv_bfloat16, 8, PAIRS>(counts, data, indices, n_rows, n_cols, tile_width, \
                                          slots, out);                                     \
  }

TWELL_UNPACK_PAIRS(1)
TWELL_UNPACK_PAIRS(2)
TWELL_UNPACK_PAIRS(4)
TWELL_UNPACK_PAIRS(8)
