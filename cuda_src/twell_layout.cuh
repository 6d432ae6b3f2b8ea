// twell_layout.cuh: the TwELL layout and value-type helpers shared by every kernel.
//
// Mirrors twell/_layout.py (a test runs twell_layout_probe and compares with Python):
//   n_tiles = ceil(K / T); pair = row * n_tiles + tile; slot s of a pair lives at pair * S + s;
//   slots 0..count-1 hold the (row, tile)'s first non-zeros by column, column within the tile
//   as uint16 (T <= 65536) or int (wider tiles: the kernels' Index template argument); the
//   slots after the count hold zeros; entries past S go to a CSR overflow (int64 row
//   pointer, int32 global columns).
// The loader inlines this file into each .cu source (CuPy caches by source text).
//
// Index widths: every position in an array whose size grows with the matrix (pair, slot,
// dense element, CSR entry, B and output element) is computed in long long, because
// M * n_tiles * S, M * K and nnz pass 2^31 on today's GPUs; blockIdx.x * blockDim.x is widened
// before the product. int is kept only for quantities bounded by one tile or one block
// (counts, ranks and slots <= T < 2^31, shared-memory offsets) and for columns (< 2^31).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace twell {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Pack kernels run in one of three modes (see pack.cu).
constexpr int kModeCount = 0;     // count the non-zeros of every (row, tile)
constexpr int kModeSlots = 1;     // write the slots, counts and totals
constexpr int kModeOverflow = 2;  // write the entries past the slots to the overflow

__host__ __device__ inline long long n_tiles(long long n_cols, int tile_width) {
  return (n_cols + tile_width - 1) / tile_width;
}

__host__ __device__ inline int packed_capacity(int compression) { return 256 / compression - 1; }

// Value types: storage type T, accumulation type Acc (fp32 for 16-bit and fp32, fp64 for fp64).
template <typename T> struct Value;

template <> struct Value<double> {
  using Acc = double;
  __device__ static Acc to_acc(double v) { return v; }
  __device__ static double from_acc(Acc v) { return v; }
  __device__ static double zero() { return 0.0; }
};

template <> struct Value<float> {
  using Acc = float;
  __device__ static Acc to_acc(float v) { return v; }
  __device__ static float from_acc(Acc v) { return v; }
  __device__ static float zero() { return 0.0f; }
};

template <> struct Value<__half> {
  using Acc = float;
  __device__ static Acc to_acc(__half v) { return __half2float(v); }
  __device__ static __half from_acc(Acc v) { return __float2half_rn(v); }
  __device__ static __half zero() { return __float2half_rn(0.0f); }
};

template <> struct Value<__nv_bfloat16> {
  using Acc = float;
  __device__ static Acc to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_acc(Acc v) { return __float2bfloat16_rn(v); }
  __device__ static __nv_bfloat16 zero() { return __float2bfloat16_rn(0.0f); }
};

// Any value != 0 is a non-zero: NaN, Inf and subnormals included, -0.0 excluded (as in
// NumPy). Decided on the bits: a float comparison may flush subnormals to zero.
__device__ inline bool is_nonzero(double v) { return (__double_as_longlong(v) << 1) != 0; }
__device__ inline bool is_nonzero(float v) { return (__float_as_uint(v) << 1) != 0u; }
__device__ inline bool is_nonzero(__half v) { return (__half_as_ushort(v) & 0x7fffu) != 0u; }
__device__ inline bool is_nonzero(__nv_bfloat16 v) {
  return (__bfloat16_as_ushort(v) & 0x7fffu) != 0u;
}

// VEC consecutive values; VEC * sizeof(T) is 16 bytes or VEC == 1.
template <typename T, int VEC> struct alignas(VEC * sizeof(T)) Vec {
  T v[VEC];
};

// Load v[0..VEC) = src[j0 .. j0+VEC), zeros at and past `limit`. For VEC > 1 the launcher
// guarantees 16-byte alignment and that a vector never straddles `limit`.
template <typename T, int VEC>
__device__ inline void load_vec(const T* __restrict__ src, long long j0, long long limit, T (&v)[VEC]) {
  if (VEC > 1) {
    if (j0 < limit) {
      const Vec<T, VEC> w = *reinterpret_cast<const Vec<T, VEC>*>(src + j0);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = w.v[i];
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = Value<T>::zero();
    }
  } else {
    v[0] = j0 < limit ? src[j0] : Value<T>::zero();
  }
}

template <typename T, int VEC>
__device__ inline void store_vec(T* __restrict__ dst, long long j0, const T (&v)[VEC]) {
  if (VEC > 1) {
    Vec<T, VEC> w;
#pragma unroll
    for (int i = 0; i < VEC; ++i) w.v[i] = v[i];
    *reinterpret_cast<Vec<T, VEC>*>(dst + j0) = w;
  } else {
    dst[j0] = v[0];
  }
}

// Inclusive prefix sum over the lanes of a warp (int or long long).
template <typename I>
__device__ inline I warp_inclusive_scan(I x, int lane) {
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const I y = __shfl_up_sync(kFullMask, x, offset);
    if (lane >= offset) x += y;
  }
  return x;
}

// Index of the first element of sorted a[lo, hi) that is >= key.
template <typename I, typename K>
__device__ inline long long lower_bound(const I* __restrict__ a, long long lo, long long hi, K key) {
  while (lo < hi) {
    const long long mid = lo + ((hi - lo) >> 1);
    if (a[mid] < key) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Row of entry j in a CSR structure: the last r with indptr[r] <= j.
__device__ inline long long row_of(const long long* __restrict__ indptr, long long n_rows, long long j) {
  long long lo = 0, hi = n_rows;  // answer in [0, n_rows)
  while (lo < hi) {
    const long long mid = lo + ((hi - lo + 1) >> 1);
    if (indptr[mid] <= j) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace twell
