// wgmma.cuh: the pieces of the Hopper (sm_90a) fused GEMM -> TwELL kernels: the wgmma
// m64n256k16 bf16 instruction with fp32 accumulators, the shared-memory matrix descriptor of
// a K-major 128-byte-swizzled operand, the 1024-byte aligned dynamic shared memory, and the
// staging of relu(acc) for pack_staged_block (matmul_pack.cuh). Only sm_90a compiles it.
#pragma once

#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"

namespace twell {

// Shared-memory matrix descriptor of a K-major, 128-byte-swizzled operand.
__device__ __forceinline__ unsigned long long descriptor(const void* tile) {
  const unsigned long long start = (smem_address(tile) & 0x3ffffu) >> 4;
  const unsigned long long lead = 1;             // unused by swizzled K-major layouts
  const unsigned long long stride = 1024 >> 4;   // 8 rows of 128 bytes
  return start | (lead << 16) | (stride << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], unsigned long long a,
                                                 unsigned long long b) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, accumulate, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1));
}


// Pins the accumulators in their registers around asynchronous wgmma (no instruction).
__device__ __forceinline__ void fence_operands(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The dynamic shared memory, aligned by hand to 1024 bytes (the 128-byte swizzle needs it; the
// launcher allocates 1024 bytes of slack). Declared with 16-byte alignment only: with
// __align__(1024) the compiler takes the alignment as given and drops the adjustment.
__device__ __forceinline__ __nv_bfloat16* aligned_smem() {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  return reinterpret_cast<__nv_bfloat16*>(
      smem_raw + ((1024 - (smem_address(smem_raw) & 1023u)) & 1023u));
}


// One 64-deep stage of the block's product into d: this warpgroup's 64 rows of the x tile at
// a_s (rows wg * 64 .. + 63, 8 KB in: 1024-byte aligned) times the 256-row w tile at b_s, as
// 4 wgmma k steps (k step kk is 32 bytes into every 128-byte row: the descriptor start
// advances by 2 units of 16 bytes), committed as one group; returns once at most this group
// is pending, i.e. the previous stage's wgmma has completed (its stage may be refilled).
__device__ __forceinline__ void wgmma_stage(float (&d)[128], const __nv_bfloat16* a_s,
                                            const __nv_bfloat16* b_s, int wg) {
  fence_operands(d);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < gemm::kBK / 16; ++kk) {
    const unsigned long long a = descriptor(a_s + wg * 64 * gemm::kBK) + 2 * kk;
    const unsigned long long b = descriptor(b_s) + 2 * kk;
    wgmma_m64n256k16(d, a, b);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  fence_operands(d);
}

// Stages relu(acc) rounded to bf16 in the [128][kPitch] tile `stage` (the pipeline's shared
// memory, once every warpgroup is done with it). Accumulator layout (as mma.sync m16n8, per
// warp of the warpgroup): d[4j + i] is row 64 wg + 16 warp + lane / 4 + 8 (i / 2), column
// 8 j + 2 (lane % 4) + i % 2.
__device__ __forceinline__ void stage_relu(const float (&d)[128], __nv_bfloat16* stage, int wg,
                                           int warp, int lane) {
#pragma unroll
  for (int j = 0; j < 32; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wg * 64 + 16 * warp + lane / 4 + 8 * h;
      const int col = 8 * j + 2 * (lane % 4);
      *reinterpret_cast<unsigned*>(stage + row * gemm::kPitch + col) = Mma<__nv_bfloat16>::pack2(
          gemm::relu(d[4 * j + 2 * h]), gemm::relu(d[4 * j + 2 * h + 1]));
    }
}

}  // namespace twell
