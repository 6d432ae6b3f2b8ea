// tma.cuh: PROTOTYPE helpers (not part of the package) shared by the TMA prototypes of the
// Hopper fused GEMM -> TwELL kernel: rings of mbarriers (the mbarriers themselves are in
// mbarrier.cuh), TMA loads (one CTA, or multicast to the CTAs of a cluster) and cluster
// synchronisation, as inline PTX for sm_90a.
#pragma once

#include "mbarrier.cuh"
#include "wgmma.cuh"

namespace twell_proto {

// The ring's mbarriers, after its stages in shared memory: full[s] at 8 s, empty[s] after
// them. Thread 0 initialises them (init), before a barrier of the block or cluster.
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
// (release_empty(its empty barrier), called by every lane: the prototype picks the arriving
// lanes and barriers). Returns with d complete.
template <int kStages, typename WaitFull, typename ReleaseEmpty>
__device__ __forceinline__ void consume_k_tiles(float (&d)[128], const __nv_bfloat16* smem,
                                                const StageBarriers<kStages>& bars, int k_tiles,
                                                int wg, WaitFull wait_full,
                                                ReleaseEmpty release_empty) {
  using namespace twell;
  using namespace twell::gemm;
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStages;
    wait_full(bars.full(s), (kt / kStages) & 1);
    __syncwarp();  // the lanes leave the wait loop apart; wgmma is .aligned
    const __nv_bfloat16* const a_s = smem + s * (kAStage + kBStage);
    const __nv_bfloat16* const b_s = a_s + kAStage;
    wgmma_stage(d, a_s, b_s, wg);
    if (kt > 0) release_empty(bars.empty((kt - 1) % kStages));
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  fence_operands(d);
}

// The box at (column c0, row c1) of the tensor `tmap` describes, into shared memory at dst;
// its bytes count towards the transaction of the mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void* tmap, unsigned bar, int c0,
                                            int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// The same box, written at the same shared-memory offset (and completing the transaction of
// the mbarrier at the same offset) in every CTA of the cluster named in cta_mask.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const void* tmap, unsigned bar,
                                                      int c0, int c1, unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(bar), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// One arrival on the mbarrier at shared-memory offset `bar` of the cluster's CTA `rank`
// (release at cluster scope: this thread's earlier reads of the stage happen before).
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
               ::: "memory");
}

// The tensor maps were written by a host copy: order that write before the TMA unit reads
// them through its own proxy (scope .sys: the writer is the host, as the CUDA programming
// guide's example for maps in global memory says).
__device__ __forceinline__ void acquire_tensor_map(const void* tmap) {
  asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(
                   reinterpret_cast<unsigned long long>(tmap))
               : "memory");
}

}  // namespace twell_proto
