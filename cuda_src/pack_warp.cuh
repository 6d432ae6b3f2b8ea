// pack_warp.cuh: one warp packs one (row, tile) pair, the step shared by the dense pack
// kernels (pack.cu) and the GEMM epilogue that packs its own output (ffn.cu).
// Ranks come from a warp-wide prefix sum, never from atomics: the packing is deterministic.
#pragma once

#include "twell_layout.cuh"

namespace twell {

// v[i] for a run-time i < VEC: a chain of selects, so that v stays in registers (an indexed
// read of a register array would put it in local memory).
template <typename T, int VEC>
__device__ __forceinline__ T pick(const T (&v)[VEC], int i) {
  T out = v[0];
#pragma unroll
  for (int k = 1; k < VEC; ++k) out = k == i ? v[k] : out;
  return out;
}

// One chunk of a (row, tile) pair: lane l holds v = columns j0 .. j0 + VEC - 1 of the tile
// (zeros past its width) and `base` non-zeros precede the chunk. Writes the chunk's slots
// (kModeSlots) or its entries of rank >= S, to overflow position overflow_start + rank - S
// (kModeOverflow); returns the chunk's number of non-zeros, the same in every lane. Every lane of the warp must call it (warp shuffles).
// The stores loop over the lane's non-zeros only: at the sparsities TwELL is for, most lanes
// hold none and the warp takes one or two steps, where a loop over all VEC values took VEC
// (the kernel was bound by instruction issue, not by memory). Index: the type of a column
// within a tile (unsigned short, or int for tiles wider than 65536 columns).
template <typename T, int VEC, typename Index>
__device__ __forceinline__ int pack_chunk(const T (&v)[VEC], long long j0, int base, int lane,
                                          int mode, long long pair, long long col0, int slots,
                                          T* __restrict__ data,
                                          Index* __restrict__ indices,
                                          long long overflow_start,
                                          int* __restrict__ overflow_indices,
                                          T* __restrict__ overflow_data) {
  unsigned bits = 0;
#pragma unroll
  for (int i = 0; i < VEC; ++i) bits |= static_cast<unsigned>(is_nonzero(v[i])) << i;
  const int n = __popc(bits);
  if (mode == kModeCount) return __reduce_add_sync(kFullMask, n);  // no ranks needed
  const int inclusive = warp_inclusive_scan(n, lane);
  int rank = base + inclusive - n;
  for (unsigned rest = bits; rest != 0u; rest &= rest - 1u, ++rank) {
    const int i = __ffs(rest) - 1;
    if (mode == kModeSlots) {
      if (rank < slots) {
        data[pair * slots + rank] = pick(v, i);
        indices[pair * slots + rank] = static_cast<Index>(j0 + i);
      }
    } else if (rank >= slots) {  // kModeOverflow
      const long long o = overflow_start + (rank - slots);
      overflow_indices[o] = static_cast<int>(col0 + j0 + i);
      overflow_data[o] = pick(v, i);
    }
  }
  return __shfl_sync(kFullMask, inclusive, kWarp - 1);
}

// End of a (row, tile) with `total` non-zeros (kModeCount, kModeSlots): zero the slots past the
// count, write counts and totals. Returns the pair's overflow max(total - S, 0).
template <typename T, typename Index>
__device__ __forceinline__ int finish_pair(int total, int lane, int mode, long long pair,
                                           int slots, int* __restrict__ totals,
                                           int* __restrict__ counts, T* __restrict__ data,
                                           Index* __restrict__ indices) {
  if (mode == kModeSlots) {
    const int used = min(total, slots);
    for (int s = used + lane; s < slots; s += kWarp) {
      data[pair * slots + s] = Value<T>::zero();
      indices[pair * slots + s] = 0;
    }
    if (lane == 0) counts[pair] = used;
  }
  if (lane == 0) totals[pair] = total;
  return max(total - slots, 0);
}

}  // namespace twell
