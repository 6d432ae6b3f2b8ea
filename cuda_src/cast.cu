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
// pattern (bfloat16 takes its top 16 bits, which are then exact). Integer arithmetic only:
// an earlier rint/ldexp version rounded exact ties up under one host compiler, and integers
// leave no room for a library's or a compiler's rounding choices.
__host__ __device__ inline unsigned double_to_f32_bits(double v, int precision) {
  const unsigned long long u = double_bits(v);
  const unsigned sign = static_cast<unsigned>(u >> 63) << 31;
  const int biased = static_cast<int>((u >> 52) & 0x7ff);
  const unsigned long long fraction = u & ((1ull << 52) - 1);
  if (biased == 0x7ff) {  // Inf, or NaN with its payload's top bits kept and made quiet
    return fraction == 0 ? sign | 0x7f800000u
                         : sign | 0x7fc00000u | static_cast<unsigned>((u >> 29) & 0x3fffffu);
  }
  if (biased == 0) return sign;  // zero or a double subnormal: far below half of 2^-149
  const int e = biased - 1023;
  if (e > 127) return sign | 0x7f800000u;
  // v = m * 2^(e - 52); the target's quantum is 2^(qe), qe = max(e, -126) - precision + 1.
  const unsigned long long m = fraction | (1ull << 52);
  const int qe = (e < -126 ? -126 : e) - precision + 1;
  const int shift = qe - (e - 52);  // >= 53 - precision > 0
  if (shift >= 64) return sign;     // below a quarter of the quantum
  const unsigned long long half = 1ull << (shift - 1), rest = m & ((half << 1) - 1);
  unsigned long long q = m >> shift;  // at most 2^precision after rounding
  if (rest > half || (rest == half && (q & 1))) ++q;
  // float32 bits of q * 2^qe. For normals, adding q's leading bit into the exponent field
  // carries a rounding up to 2^precision into the next binade; for subnormals, q aligned to
  // 2^-149 is the mantissa, and 2^(precision-1) lands on the smallest normal.
  const unsigned long long aligned = q << (24 - precision);
  const unsigned long long bits =
      e < -126 ? aligned : (static_cast<unsigned long long>(e + 127) << 23) + aligned - (1ull << 23);
  return bits >= 0x7f800000ull ? sign | 0x7f800000u : sign | static_cast<unsigned>(bits);
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
