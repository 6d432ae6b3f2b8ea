// cluster.cuh: PROTOTYPE helpers (not part of the package) of the cluster prototype of the
// Hopper fused GEMM -> TwELL kernel (matmul_pack_sm90_cluster.cu): what it needs beyond the
// shipped cuda_src/tma.cuh (tensor map, TMA load, stage ring, consumers' k loop) and
// cuda_src/mbarrier.cuh: the TMA load multicast to the CTAs of a cluster, an arrival on a
// peer CTA's mbarrier, the CTA's rank and the cluster barrier, as inline PTX for sm_90a.
#pragma once

#include "tma.cuh"

namespace twell {

// The box at (column c0, row c1) of the tensor `tmap` describes, written at the same
// shared-memory offset dst (and completing the transaction of the mbarrier at the same offset
// bar) in every CTA of the cluster named in cta_mask.
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

}  // namespace twell
