// matmul_pack_sm90_cluster.cu: PROTOTYPE (written 2026-12-03 without a GPU; first run in the
// seventh session, H200: the shipped bits on six shapes, 0.993 ms against 0.802 for the TMA
// form that now ships). Not part of the package: matmul_pack_sm90_cluster.py (beside it)
// compiles it with NVRTC for sm_90a, swaps it in for twell_matmul_pack_sm90_bf16 under
// twell.matmul_to_twell, checks it bit for bit against the shipped kernels and times it.
//
// proto_matmul_pack_sm90_cluster: the shipped twell_matmul_pack_sm90_bf16 (cuda_src/
// matmul_pack_sm90.cu: a producer warp, two consumer warpgroups, full/empty mbarriers per
// stage) in clusters of 2 CTAs along M.
// The two CTAs of a cluster compute row blocks 2p and 2p + 1 of the same 256 columns, so they
// need the same w tile: CTA r loads w rows n0 + 128 r ... n0 + 128 r + 127 of each k tile and
// multicasts them into both CTAs' shared memory. Each CTA still loads its own x tile. L2 -> SM
// traffic for w halves: (4.4 GB -> ~2.9 GB on the paper's up projection, x being the smaller
// operand per block).
//   - full[s] (per CTA): the CTA's producer arrives with expect_tx = x tile + the whole w
//     tile (48 KB); the peer's multicast may complete bytes on it before that arrival, which
//     the barrier allows (its phase needs the arrival too).
//   - empty[s] (per CTA, 16 arrivals): each consumer warp of either CTA arrives on both CTAs'
//     empty[s] once the wgmma that read the stage has completed, so a producer refills a stage
//     (its multicast writes into the peer too) only when both CTAs have released it.
//   - Cluster barriers after the mbarrier init (the peer's arrivals and multicasts must find
//     initialised barriers) and after the k loop (no CTA leaves, or reuses its stages as the
//     staging tile, while its peer may still arrive on its barriers).
// Grid: 2 x ceil(row blocks / 2) x column blocks, blockIdx.x = 2 (pair * column blocks +
// column block) + rank; the padding CTA of an odd row-block count loads zero-filled x rows and
// packs nothing (rows >= M). 288 threads; dynamic shared memory as the shipped kernel.
// The arguments are the shipped kernel's: the tensor maps by value as __grid_constant__
// parameters, x with 64 x 128 boxes, w with 64 x 128 boxes (half a w tile, not 64 x 256).
// The waits trap after 2^26 polls (a protocol error becomes a launch error).
// Reviewed 2026-12-03 against CUTLASS's PipelineTmaAsync (no defect found).
// Prediction (H200, M = 16384, K = 2048, N = 5632, S = 13): 0.7-0.8 ms (TMA form: 0.923);
// measured 0.993 (not profiled yet).
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"
#include "tma.cuh"
#include "stage_relu.cuh"
#include "cluster.cuh"

using namespace twell;

namespace {

using namespace twell::gemm;

constexpr int kStages = 4;
constexpr int kCluster = 2;
constexpr int kConsumerThreads = 256;                    // 2 warpgroups
constexpr int kConsumerWarps = kConsumerThreads / kWarp;
constexpr int kProtoThreads = kConsumerThreads + kWarp;  // + the producer warp
constexpr int kStageBytes = (kAStage + kBStage) * 2;      // 48 KB land in each CTA per stage
constexpr int kHalfB = kBStage / kCluster;                // elements of half a w tile

}  // namespace

extern "C" __global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kProtoThreads, 1)
proto_matmul_pack_sm90_cluster(const __grid_constant__ TensorMap tmap_x,
                               const __grid_constant__ TensorMap tmap_w, long long n_rows,
                               long long n_cols, long long depth, int tile_width, int slots,
                               int zero_fill, int* __restrict__ totals, int* __restrict__ counts,
                               __nv_bfloat16* __restrict__ data,
                               unsigned short* __restrict__ indices,
                               long long* __restrict__ spill_start,
                               int* __restrict__ spill_indices,
                               __nv_bfloat16* __restrict__ spill_data, long long spill_capacity,
                               unsigned long long* __restrict__ spill_used) {
  const int tid = threadIdx.x, warp_id = tid / kWarp, lane = tid % kWarp;
  const unsigned rank = cluster_ctarank();
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long pair = static_cast<long long>(blockIdx.x) / kCluster;
  const long long m0 = (pair / col_blocks * kCluster + rank) * kBM;
  const long long n0 = pair % col_blocks * kBN;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  __nv_bfloat16* const smem = aligned_smem<__nv_bfloat16>();
  const unsigned stages = smem_address(smem);
  const StageBarriers<kStages> bars{stages + kStages * kStageBytes};

  // full: this CTA's producer; empty: every consumer warp of the cluster.
  if (tid == 0) bars.init(1, kCluster * kConsumerWarps);
  cluster_sync();

  float d[128];
  if (warp_id == kConsumerWarps) {
    if (lane == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        mbarrier_wait_or_trap<true>(bars.empty(s), ((kt / kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(bars.full(s), kStageBytes);
        const unsigned a_s = stages + s * kStageBytes;
        tma_load_2d(a_s, &tmap_x, bars.full(s), kt * kBK, static_cast<int>(m0));
        tma_load_2d_multicast(a_s + (kAStage + rank * kHalfB) * 2, &tmap_w, bars.full(s),
                              kt * kBK, static_cast<int>(n0 + rank * (kBN / kCluster)),
                              static_cast<unsigned short>((1u << kCluster) - 1));
      }
    }
  } else {
    // A released stage is released in both CTAs: lane r arrives on CTA r's barrier.
    consume_k_tiles(
        d, smem, bars, k_tiles, tid / 128,
        [](unsigned bar, unsigned parity) { mbarrier_wait_or_trap<false>(bar, parity); },
        [lane](unsigned bar) { if (lane < kCluster) mbarrier_arrive_cluster(bar, lane); });
  }
  // Both CTAs are past their k loops: no arrival or multicast is still on its way to either
  // (each multicast into this CTA completed on a full barrier that its consumers waited for).
  __syncwarp();  // the producer warp's lanes meet again: the cluster barrier is .aligned
  cluster_sync();
  __nv_bfloat16* const stage = smem;
  if (warp_id < kConsumerWarps) stage_relu(d, stage, tid / 128, tid % 128 / kWarp, lane);
  __syncthreads();
  pack_staged_block<__nv_bfloat16, kBM, kBN, kPitch, kProtoThreads / kWarp>(
      stage, m0, n0, n_rows, n_cols, tile_width, slots, totals, counts, data, indices,
      spill_start, spill_indices, spill_data, spill_capacity, spill_used, warp_id, lane,
      zero_fill != 0);
}
