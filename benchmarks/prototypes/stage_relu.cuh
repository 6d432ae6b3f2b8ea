// stage_relu.cuh: PROTOTYPE helper (not part of the package) of the cluster and
// warp-specialised prototypes of the Hopper fused kernel: relu(acc) staged in shared memory
// for pack_staged_block (cuda_src/matmul_pack.cuh). The shipped kernel packs from the
// accumulators instead (pack_accumulators, cuda_src/wgmma.cuh); this left cuda_src/wgmma.cuh
// with it.
#pragma once

#include "wgmma.cuh"

namespace twell {

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
