// tma.cuh: the Tensor Memory Accelerator side of the Hopper (sm_90a) fused GEMM -> TwELL
// kernel (matmul_pack_sm90.cu): the tensor map as a kernel parameter, the 2-D TMA load that
// completes on an mbarrier, the ring of full/empty mbarriers per pipeline stage, and the
// consumers' k loop over that ring. Only sm_90a compiles it.
#pragma once

#include "mbarrier.cuh"
#include "wgmma.cuh"

namespace twell {

// A CUtensorMap (cuda.h): 128 opaque bytes, 64-byte aligned, encoded on the host by
// cuTensorMapEncodeTiled (twell/_cuda/_tma.py) and passed by value as a __grid_constant__
// kernel parameter, so that the TMA unit reads it from parameter space: no copy to global
// memory and no proxy fence (NVRTC has no cuda.h, hence this stand-in of the same size).
struct alignas(64) TensorMap {
  unsigned long long words[16];
};

// The box at (column c0, row c1) of the tensor `tmap` describes, into shared memory at dst;
// its bytes count towards the transaction of the mbarrier `bar`. `tmap` is a generic address
// (of a __grid_constant__ parameter, or of a map in global memory).
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void* tmap, unsigned bar, int c0,
                                            int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// The ring's mbarriers, after its stages in shared memory: full[s] at 8 s, empty[s] after
// them. Thread 0 initialises them (init), before a barrier of the block or cluster.
// tma_load_2d's box written at the same shared-memory offset dst of every CTA of the
// cluster named in cta_mask, each completing bytes on its own mbarrier at offset `bar`.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const void* tmap,
                                                      unsigned bar, int c0, int c1,
                                                      unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(bar), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

template <int kStages>
struct StageBarriers {
  unsigned base;
  __device__ unsigned full(int s) const { return base + 8u * s; }
  __device__ unsigned empty(int s) const { return base + 8u * (kStages + s); }
  __device__ void init(unsigned full_arrivals, unsigned empty_arrivals) const {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full(s), full_arrivals);
      mbarrier_init(empty(s), empty_arrivals);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
};

// The k loop of the consumer warpgroups (warpgroup wg: 64 rows of the block tile): for each
// k tile, wait on its stage's full barrier (wait_full(barrier, parity)), run the stage's
// wgmma, and once the previous tile's wgmma has completed, release that stage
// (release_empty(its empty barrier), called by every lane: the caller picks the arriving
// lanes and barriers). Returns with d complete; the last k tile's stage is not released.
// `first`: the ring position of the first k tile modulo 2 kStages (the stage and the
// barriers' phase repeat with that period), for a kernel whose ring runs on across tiles.
template <int kStages, typename T, typename WaitFull, typename ReleaseEmpty>
__device__ __forceinline__ void consume_k_tiles(float (&d)[128], const T* smem,
                                                const StageBarriers<kStages>& bars, int k_tiles,
                                                int wg, WaitFull wait_full,
                                                ReleaseEmpty release_empty, int first = 0) {
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int g = first + kt;
    const int s = g % kStages;
    wait_full(bars.full(s), (g / kStages) & 1);
    __syncwarp();  // the lanes leave the wait loop apart; wgmma is .aligned
    const T* const a_s = smem + s * (gemm::kAStage + gemm::kBStage);
    const T* const b_s = a_s + gemm::kAStage;
    wgmma_stage(d, a_s, b_s, wg);
    if (kt > 0) release_empty(bars.empty((g - 1) % kStages));
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  fence_operands(d);
}

}  // namespace twell
