// mbarrier.cuh: mbarriers in shared memory and the cluster's pieces, as inline PTX for sm_90
// (init, arrivals with an expected transaction or on a peer CTA's barrier, parity waits, the
// CTA's rank, the cluster barrier): the stage ring of the Hopper fused GEMM -> TwELL kernel
// (tma.cuh, matmul_pack_sm90.cu).
#pragma once

namespace twell {

__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::
          "r"(bar), "r"(bytes)
      : "memory");
}

// One poll of the phase of parity `parity`: whether it has completed (a fresh barrier counts
// the phase before its first as completed: parity 1 answers true at once).
__device__ __forceinline__ bool mbarrier_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

// One arrival on the mbarrier at shared-memory offset `bar` of the cluster's CTA `rank`.
// The default semantics (release at CTA scope), as CUTLASS's ClusterBarrier: the stage it
// releases was read by wgmma, complete before the arrival; a cluster-scope release would
// also wait for this thread's earlier global stores (the previous tile's packing).
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

__device__ __forceinline__ unsigned cluster_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(id));
  return id;
}

__device__ __forceinline__ unsigned cluster_count() {
  unsigned n;
  asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(n));
  return n;
}

// Every thread of every CTA of the cluster (converged warps: the barrier is .aligned).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
               ::: "memory");
}

}  // namespace twell
