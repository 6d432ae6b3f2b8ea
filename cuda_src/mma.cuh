// mma.cuh: the 16-bit tensor-core step (mma.sync m16n8k16, fp32 accumulation), bf16x2/half2
// packing, and the cp.async copy into shared memory, shared by spmm.cu and ffn.cu.
#pragma once

#include "twell_layout.cuh"

namespace twell {

template <typename T> struct Mma;

template <> struct Mma<__nv_bfloat16> {
  __device__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm(  // pure: the compiler may schedule it freely among the ldmatrix loads
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static unsigned pack2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
  __device__ static float2 unpack2(unsigned w) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  }
};

template <> struct Mma<__half> {
  __device__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm(  // pure: the compiler may schedule it freely among the ldmatrix loads
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static unsigned pack2(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
  __device__ static float2 unpack2(unsigned w) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
  }
};

__device__ inline unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ inline void cp_async16(void* dst, const void* src, bool inside) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(smem_address(dst)), "l"(src), "r"(inside ? 16 : 0) : "memory");
}

}  // namespace twell
