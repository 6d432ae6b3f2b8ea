// reduce.cu: small whole-array reductions that the launchers need before they size or gate
// their real work, each in one launch and without a host round trip of its own.
//
// twell_count_histogram: hist[c] = number of counts equal to c, for c < size; counts outside
//   [0, size) land in hist[size], which the launcher checks is zero (it never is for the
//   per-tile counts of a tile width of size - 1, but nothing is dropped silently). Integer
//   atomics: the result does not depend on the order of the additions. A block privatises
//   the histogram in shared memory when it fits (kSharedBins), else adds to global memory.
//   Grid-stride loop; any grid.
// twell_find_nonfinite: sets *found when any of the n values is Inf or NaN (decided on the
//   exponent bits, so no flush or comparison quirk can hide one). 16-byte loads when the
//   array is 16-byte aligned (the launcher says so with VEC); grid-stride loop; any grid.
// twell_count_positive16: adds to *count the number of n 16-bit values whose bits, read as a
//   signed short, are positive: the values above +0 of a float16 or bfloat16 array (a +NaN
//   too), as relu keeps them. Integer atomics, one a warp; grid-stride loop; any grid.
// twell_exclusive_scan: the prefix sums that place the overflow and every other CSR-style
//   output (described where it is defined, below).
#include "twell_layout.cuh"

using namespace twell;

namespace twell {

constexpr int kSharedBins = 4096;  // 16 KB of int counters per block

// Exponent field of a 16-bit float: all ones means Inf or NaN.
template <typename T> struct ExponentMask;
template <> struct ExponentMask<__half> { static constexpr unsigned short value = 0x7c00; };
template <> struct ExponentMask<__nv_bfloat16> { static constexpr unsigned short value = 0x7f80; };

}  // namespace twell

__global__ void twell_count_histogram(const int* __restrict__ counts, long long n, int size,
                                      unsigned long long* __restrict__ hist) {
  __shared__ int local[kSharedBins + 1];
  const bool shared = size < kSharedBins;
  if (shared) {
    for (int b = threadIdx.x; b <= size; b += blockDim.x) local[b] = 0;
    __syncthreads();
  }
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int c = counts[i];
    const int bin = (c >= 0 && c < size) ? c : size;
    if (shared) {
      atomicAdd(&local[bin], 1);
    } else {
      atomicAdd(&hist[bin], 1ull);
    }
  }
  if (shared) {
    __syncthreads();
    for (int b = threadIdx.x; b <= size; b += blockDim.x) {
      if (local[b]) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
    }
  }
}

__global__ void twell_count_positive16(const short* __restrict__ values, long long n,
                                       unsigned long long* __restrict__ count) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  unsigned long long c = 0;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    c += values[i] > 0;
  }
  for (int offset = 16; offset > 0; offset >>= 1) c += __shfl_down_sync(0xffffffffu, c, offset);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

template <typename T, int VEC>
__global__ void twell_find_nonfinite(const T* __restrict__ values, long long n,
                                     bool* __restrict__ found) {
  constexpr unsigned short mask = ExponentMask<T>::value;
  const unsigned short* bits = reinterpret_cast<const unsigned short*>(values);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  bool any = false;
  long long tail = 0;
  if (VEC > 1) {
    static_assert(VEC == 1 || VEC * sizeof(T) == 16, "VEC loads are 16 bytes");
    const long long vectors = n / VEC;
    const uint4* vec = reinterpret_cast<const uint4*>(values);
    for (long long i = first; i < vectors; i += stride) {
      const uint4 v = vec[i];
      const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        any |= (words[w] & mask) == mask;
        any |= ((words[w] >> 16) & mask) == mask;
      }
    }
    tail = vectors * VEC;
  }
  for (long long i = tail + first; i < n; i += stride) any |= (bits[i] & mask) == mask;
  // Every writer stores the same value, so the unordered stores are benign.
  if (__syncthreads_or(any) && threadIdx.x == 0) *found = true;
}

// twell_exclusive_scan<In, CLAMP>: out[0] = 0 and out[i + 1] = v[0] + ... + v[i] (int64), where
//   v[i] = max(in[i] - minus, 0) when CLAMP (the entries of a (row, tile) pair past its slots)
//   and in[i] otherwise. With starts (not null), also starts[r] = out[r * row_length] for
//   r = 0 .. n / row_length (the row pointer of an n / row_length-row layout), so the caller
//   needs no strided copy, each at most starts_cap (a row pointer into an overflow of
//   starts_cap entries, where the entries past it are not kept). One launch: a single-pass
//   scan with decoupled look-back. Each block scans one tile of kScanTile items (a warp 512,
//   16 rows of 32 coalesced items); warp 0 then reads the status words of the tiles before
//   it, 32 at a time, until it meets one whose inclusive prefix is known, and publishes its
//   own. A status word holds its state in the two high bits and a sum modulo 2^62 in the
//   others, so one 64-bit store publishes both; sums must stay within +-2^61. ``status`` is
//   one zeroed word per tile. Tiles follow blockIdx.x: a block waits only on blocks launched
//   before it (CUB's scan relies on the same order).
namespace twell {

constexpr int kScanThreads = 256;
constexpr int kScanRows = 16;  // 32-item rows per warp
constexpr long long kScanTile = static_cast<long long>(kScanThreads) * kScanRows;
constexpr unsigned long long kScanAggregate = 1ull << 62, kScanPrefix = 2ull << 62,
                             kScanValue = (1ull << 62) - 1;

__device__ __forceinline__ long long scan_status_value(unsigned long long word) {
  return static_cast<long long>(word << 2) >> 2;  // the low 62 bits, sign-extended
}

// Sum of every item before tile ``tile`` (> 0), read by one warp from the status words; the
// tile's own aggregate is published already.
__device__ long long scan_look_back(volatile unsigned long long* status, long long tile,
                                    int lane) {
  long long before = 0;
  for (long long last = tile - 1;; last -= kWarp) {
    const long long at = last - lane;  // lane 0 nearest to the tile
    unsigned long long word = kScanPrefix;  // before tile 0: a prefix of 0
    if (at >= 0) word = status[at];
    while (__any_sync(kFullMask, (word >> 62) == 0)) {
      if ((word >> 62) == 0) word = status[at];
    }
    const unsigned prefixes = __ballot_sync(kFullMask, (word >> 62) == 2);
    const int stop = prefixes ? __ffs(prefixes) - 1 : kWarp - 1;
    long long v = lane <= stop ? scan_status_value(word) : 0;
#pragma unroll
    for (int d = kWarp / 2; d > 0; d >>= 1) v += __shfl_xor_sync(kFullMask, v, d);
    before += v;
    if (prefixes) return before;
  }
}

}  // namespace twell

template <typename In, bool CLAMP>
__global__ void __launch_bounds__(kScanThreads)
twell_exclusive_scan(const In* __restrict__ in, long long n, long long minus,
                     long long* __restrict__ out, long long row_length,
                     long long* __restrict__ starts, long long starts_cap,
                     unsigned long long* status) {
  __shared__ long long warp_sums[kScanThreads / kWarp];
  __shared__ long long tile_before;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const long long tile = blockIdx.x;
  const long long first = tile * kScanTile + static_cast<long long>(warp) * kScanRows * kWarp;
  long long incl[kScanRows];  // inclusive sums within the warp's items
  long long carry = 0;
#pragma unroll
  for (int r = 0; r < kScanRows; ++r) {
    const long long i = first + r * kWarp + lane;
    long long v = 0;
    if (i < n) {
      v = static_cast<long long>(in[i]);
      if (CLAMP) v = v > minus ? v - minus : 0;
    }
    incl[r] = carry + warp_inclusive_scan(v, lane);
    carry = __shfl_sync(kFullMask, incl[r], kWarp - 1);
  }
  if (lane == 0) warp_sums[warp] = carry;
  __syncthreads();
  if (warp == 0) {
    const long long mine = lane < kScanThreads / kWarp ? warp_sums[lane] : 0;
    const long long upto = warp_inclusive_scan(mine, lane);
    if (lane < kScanThreads / kWarp) warp_sums[lane] = upto - mine;  // exclusive
    const long long aggregate = __shfl_sync(kFullMask, upto, kWarp - 1);
    volatile unsigned long long* words = status;
    long long before = 0;
    if (tile == 0) {
      if (lane == 0) words[0] = kScanPrefix | (static_cast<unsigned long long>(aggregate) &
                                               kScanValue);
    } else {
      if (lane == 0) words[tile] = kScanAggregate | (static_cast<unsigned long long>(aggregate) &
                                                     kScanValue);
      before = scan_look_back(words, tile, lane);
      if (lane == 0) words[tile] = kScanPrefix | (static_cast<unsigned long long>(before +
                                                                            aggregate) &
                                                  kScanValue);
    }
    if (lane == 0) tile_before = before;
  }
  __syncthreads();
  const long long base = tile_before + warp_sums[warp];
  if (tile == 0 && threadIdx.x == 0) {
    out[0] = 0;
    if (starts != nullptr) starts[0] = 0;
  }
#pragma unroll
  for (int r = 0; r < kScanRows; ++r) {
    const long long i = first + r * kWarp + lane;
    if (i < n) {
      const long long end = base + incl[r];
      out[i + 1] = end;
      if (starts != nullptr && (i + 1) % row_length == 0) {
        starts[(i + 1) / row_length] = end < starts_cap ? end : starts_cap;
      }
    }
  }
}
