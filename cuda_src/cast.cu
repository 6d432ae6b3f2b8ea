// cast.cu: value dtype conversions that keep subnormals.
//
// out[i] = in[i] rounded once (to nearest, ties to even) to D, as NumPy and ml_dtypes do:
// every source widens exactly to double, which rounds directly to D.
//
// CuPy compiles every RawModule with -ftz=true (appended after our options), so float32
// instructions flush subnormal inputs and results to zero. Conversions that can meet a float32
// or bfloat16 subnormal are therefore done in integer and double arithmetic (double is never
// flushed). The conversion functions are __host__ __device__ so that a CPU test compiles them
// into a host program and compares them with NumPy and ml_dtypes bit for bit.
// One thread per element. Grid: ceil(n / threads per block).
#include "twell_layout.cuh"

namespace twell {

__host__ __device__ inline unsigned long long double_bits(double v) {
  unsigned long long u;
  memcpy(&u, &v, sizeof u);
  return u;
}

__host__ __device__ inline double bits_double(unsigned long long u) {
  double v;
  memcpy(&v, &u, sizeof v);
  return v;
}

// float32 bits -> double, exactly, subnormals included, without float32 arithmetic.
__host__ __device__ inline double f32_bits_to_double(unsigned bits) {
  const unsigned long long sign = static_cast<unsigned long long>(bits >> 31) << 63;
  const unsigned exponent = (bits >> 23) & 0xffu, mantissa = bits & 0x7fffffu;
  if (exponent == 0xffu) {  // Inf or NaN (payload kept in the top mantissa bits)
    return bits_double(sign | (0x7ffull << 52) | (static_cast<unsigned long long>(mantissa) << 29));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-149
    return bits_double(sign | double_bits(static_cast<double>(mantissa) * 0x1p-149));
  }
  return bits_double(sign | (static_cast<unsigned long long>(exponent - 127 + 1023) << 52) |
                     (static_cast<unsigned long long>(mantissa) << 29));
}

// double -> the bits of the nearest value with `precision` significant bits and the exponent
// range of float32 (precision 24: float32, 8: bfloat16), ties to even, as a float32 bit
// pattern (bfloat16 takes its top 16 bits, which are then exact).
__host__ __device__ inline unsigned double_to_f32_bits(double v, int precision) {
  const unsigned long long u = double_bits(v);
  const unsigned sign = static_cast<unsigned>(u >> 63) << 31;
  const double a = fabs(v);
  if (a != a) return sign | 0x7fc00000u | static_cast<unsigned>((u >> 29) & 0x3fffffu);  // NaN
  if (a == 0.0) return sign;
  // Quantum of the target at a's binade; below 2^-126 it stays that of the subnormals.
  const int e = a < 0x1p-126 ? -126 : ilogb(a);
  const double q = ldexp(1.0, e - precision + 1);
  const double r = rint(a / q) * q;  // exact scaling by a power of two; rint ties to even
  if (!(r < 0x1p128)) return sign | 0x7f800000u;  // rounds past the largest finite: Inf
  // r fits the target exactly: assemble its float32 bits from double bits.
  const unsigned long long rb = double_bits(r);
  const int re = static_cast<int>((rb >> 52) & 0x7ff) - 1023;
  if (re < -126) {  // float32 subnormal: r / 2^-149 is an integer below 2^23
    return sign | static_cast<unsigned>(r * 0x1p149);
  }
  return sign | (static_cast<unsigned>(re + 127) << 23) |
         static_cast<unsigned>((rb >> 29) & 0x7fffffu);
}

template <typename T> __host__ __device__ inline double widen(T v);
template <> __host__ __device__ inline double widen(double v) { return v; }
template <> __host__ __device__ inline double widen(float v) {
  unsigned bits;
  memcpy(&bits, &v, sizeof bits);
  return f32_bits_to_double(bits);
}
template <> __host__ __device__ inline double widen(__half v) {
  return static_cast<double>(__half2float(v));  // every float16 is a normal float32
}
template <> __host__ __device__ inline double widen(__nv_bfloat16 v) {
  return f32_bits_to_double(static_cast<unsigned>(__bfloat16_as_ushort(v)) << 16);
}

template <typename T> __host__ __device__ inline T narrow(double v);
template <> __host__ __device__ inline double narrow(double v) { return v; }
template <> __host__ __device__ inline float narrow(double v) {
  const unsigned bits = double_to_f32_bits(v, 24);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
template <> __host__ __device__ inline __half narrow(double v) {
  return __double2half(v);  // float16 results are never float32 subnormals
}
template <> __host__ __device__ inline __nv_bfloat16 narrow(double v) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(double_to_f32_bits(v, 8) >> 16));
}

}  // namespace twell

using namespace twell;

template <typename S, typename D>
__global__ void twell_cast(const S* __restrict__ in, long long n, D* __restrict__ out) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = narrow<D>(widen(in[i]));
}
