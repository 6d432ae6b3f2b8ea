// cast.cu: value dtype conversions that keep subnormals.
//
// out[i] = in[i] rounded once (to nearest, ties to even) to D, as NumPy and ml_dtypes do:
// every source widens exactly to double, which rounds directly to D. Compiled without
// flush-to-zero, so float32/bfloat16/float16 subnormal results survive (CuPy's own casts
// flush them, which would drop entries from a sparse matrix).
// One thread per element. Grid: ceil(n / threads per block).
#include "twell_layout.cuh"

using namespace twell;

template <typename T> __device__ inline double widen(T v);
template <> __device__ inline double widen(double v) { return v; }
template <> __device__ inline double widen(float v) { return static_cast<double>(v); }
template <> __device__ inline double widen(__half v) { return static_cast<double>(__half2float(v)); }
template <> __device__ inline double widen(__nv_bfloat16 v) {
  return static_cast<double>(__bfloat162float(v));
}

template <typename T> __device__ inline T narrow(double v);
template <> __device__ inline double narrow(double v) { return v; }
template <> __device__ inline float narrow(double v) { return __double2float_rn(v); }
template <> __device__ inline __half narrow(double v) { return __double2half(v); }
template <> __device__ inline __nv_bfloat16 narrow(double v) { return __double2bfloat16(v); }

template <typename S, typename D>
__global__ void twell_cast(const S* __restrict__ in, long long n, D* __restrict__ out) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = narrow<D>(widen(in[i]));
}
