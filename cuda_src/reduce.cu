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
