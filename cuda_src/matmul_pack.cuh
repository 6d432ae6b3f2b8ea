// matmul_pack.cuh: the packing half of the fused GEMM -> TwELL epilogue, shared by
// twell_matmul_pack (ffn.cu) and the Hopper prototype (benchmarks/prototypes/): a block of
// act(x @ w^T), already rounded to T and staged in shared memory, goes into the TwELL slots,
// counts and totals, and the entries past the slots into the spill buffer (see ffn.cu).
#pragma once

#include "twell_layout.cuh"
#include "pack_warp.cuh"

namespace twell {

// stage: kRows x kCols values of the block whose first output is (m0, n0), row pitch kPitch
// values; kWarps warps of the block call this together (warp, lane: this thread's).
template <typename T, int kRows, int kCols, int kPitch, int kWarps>
__device__ __forceinline__ void pack_staged_block(
    const T* stage, long long m0, long long n0, long long n_rows, long long n_cols,
    int tile_width, int slots, int* __restrict__ totals, int* __restrict__ counts,
    T* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    T* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used, int warp, int lane) {
  constexpr int kVec = 8;  // 16-bit values per 16-byte chunk: a warp covers 256 columns
  static_assert(kCols == kWarp * kVec, "one 16-byte chunk per lane covers the block's columns");
  // Warp w takes rows w, w + kWarps, ...; lane l holds columns 8l .. 8l + 7 of the block.
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long tile0 = n0 / tile_width;
  const int lanes_per_tile = tile_width / kVec;
  for (int r = warp; r < kRows; r += kWarps) {
    const long long row = m0 + r;
    if (row >= n_rows) break;  // whole warp
    const Vec<T, kVec> chunk =
        *reinterpret_cast<const Vec<T, kVec>*>(stage + r * kPitch + lane * kVec);
    T v[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i)  // columns past N hold act(0 * x), which may be NaN
      v[i] = n0 + lane * kVec + i < n_cols ? chunk.v[i] : Value<T>::zero();
    for (int t = 0; t < kCols / tile_width; ++t) {
      const long long tile = tile0 + t;
      if (tile >= tiles) break;  // whole warp
      const bool mine = lane / lanes_per_tile == t;
      T u[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) u[i] = mine ? v[i] : Value<T>::zero();
      const long long pair = row * tiles + tile;
      const long long col0 = tile * tile_width;
      const int j0 = lane * kVec - t * tile_width;  // column in the tile (used when mine)
      const int total = pack_chunk<T, kVec>(u, j0, 0, lane, kModeSlots, pair, col0, slots, data,
                                            indices, 0, nullptr, nullptr);
      finish_pair<T>(total, lane, kModeSlots, pair, slots, totals, counts, data, indices);
      if (total > slots) {  // whole warp
        unsigned long long start = 0;
        if (lane == 0) start = atomicAdd(spill_used, static_cast<unsigned long long>(total - slots));
        start = __shfl_sync(kFullMask, start, 0);
        const bool fits = static_cast<long long>(start) + (total - slots) <= spill_capacity;
        if (lane == 0) spill_start[pair] = fits ? static_cast<long long>(start) : -1;
        if (fits)
          pack_chunk<T, kVec>(u, j0, 0, lane, kModeOverflow, pair, col0, slots, nullptr, nullptr,
                              static_cast<long long>(start), spill_indices, spill_data);
      }
    }
  }
}

}  // namespace twell
