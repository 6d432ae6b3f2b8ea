// matmul_pack_sm90_tma.cu: PROTOTYPE (written without a GPU; first run 2026-12-03, H200: the
// shipped kernels' bits on five shapes, 0.923 ms against 1.048 ms for the shipped kernel). Not
// part of the package: matmul_pack_sm90_tma.py (beside it) compiles it with NVRTC for sm_90a,
// swaps it in for twell_matmul_pack_sm90 under twell.matmul_to_twell, checks it bit for bit
// against the shipped kernels and times it.
//
// proto_matmul_pack_sm90_tma: twell_matmul_pack_sm90's arguments and results, plus `tmaps`
// (two CUtensorMaps in global memory: x, then w). What changes is who feeds the tensor cores:
//   - 9 warps: warps 0-7 are the two consumer warpgroups (wgmma m64n256k16 on 64 rows each,
//     as the shipped kernel), warp 8 is the producer; one of its lanes issues the TMA copies.
//   - The operands come by TMA (cp.async.bulk.tensor.2d, 128-byte swizzle: the same layout
//     the shipped kernel's cp.async writes by hand; rows past M or N and columns past K are
//     zero-filled by the unit) into kStages stages of a 128 x 64 x tile and a 256 x 64 w tile.
//   - Per stage two mbarriers: `full` (the producer's arrive.expect_tx of the stage's bytes,
//     completed by the TMA) and `empty` (one arrival per consumer warp once the wgmma that
//     read the stage has completed). No block-wide barrier in the k loop: the consumers wait
//     only for their stage, the producer only for a free one.
// Why: the shipped kernel's threads issue 12 cp.async each per k tile and all 256 meet at a
// barrier per k tile; its GEMM runs at 278 TFLOP/s against 738 for cuBLAS (H200, NOTES.md).
// Prediction (H200, M = 16384, K = 2048, N = 5632, S = 13): 0.75-0.9 ms against 0.98-1.2 ms
// for the shipped wgmma kernel; the L2 -> SM traffic (4.4 GB, no multicast yet) bounds it
// near 0.7 ms. Clusters with multicast are the step after this one.
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"
#include "tma.cuh"

using namespace twell;

namespace {

using namespace twell::gemm;
using namespace twell_proto;

constexpr int kStages = 4;
constexpr int kConsumerThreads = 256;                  // 2 warpgroups
constexpr int kProtoThreads = kConsumerThreads + kWarp;  // + the producer warp
constexpr int kStageBytes = (kAStage + kBStage) * 2;    // 48 KB: what one stage's TMA brings

}  // namespace

// Grid as twell_matmul_pack_sm90; 288 threads; dynamic shared memory
// kStages * kStageBytes + 2 * kStages * 8 (the mbarriers) + 1024 (alignment slack) bytes.
extern "C" __global__ void __launch_bounds__(kProtoThreads, 1)
proto_matmul_pack_sm90_tma(const __nv_bfloat16* __restrict__ x,
                           const __nv_bfloat16* __restrict__ w, long long n_rows,
                           long long n_cols, long long depth, int tile_width, int slots,
                           int* __restrict__ totals, int* __restrict__ counts,
                           __nv_bfloat16* __restrict__ data, unsigned short* __restrict__ indices,
                           long long* __restrict__ spill_start, int* __restrict__ spill_indices,
                           __nv_bfloat16* __restrict__ spill_data, long long spill_capacity,
                           unsigned long long* __restrict__ spill_used,
                           const unsigned long long* __restrict__ tmaps) {
  const int tid = threadIdx.x, warp_id = tid / kWarp, lane = tid % kWarp;
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long m0 = static_cast<long long>(blockIdx.x) / col_blocks * kBM;
  const long long n0 = static_cast<long long>(blockIdx.x) % col_blocks * kBN;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  __nv_bfloat16* const smem = aligned_smem();
  const unsigned stages = smem_address(smem);
  const StageBarriers<kStages> bars{stages + kStages * kStageBytes};
  const void* const tmap_x = tmaps;
  const void* const tmap_w = tmaps + 16;  // a CUtensorMap is 128 bytes

  // full: the producer's arrive; empty: one arrival per consumer warp.
  if (tid == 0) bars.init(1, kConsumerThreads / kWarp);
  __syncthreads();

  float d[128];
  if (warp_id == kConsumerThreads / kWarp) {
    // The producer: lane 0 keeps every stage it may fill in flight.
    if (lane == 0) {
      acquire_tensor_map(tmap_x);
      acquire_tensor_map(tmap_w);
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        mbarrier_wait(bars.empty(s), ((kt / kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(bars.full(s), kStageBytes);
        const unsigned a_s = stages + s * kStageBytes;
        tma_load_2d(a_s, tmap_x, bars.full(s), kt * kBK, static_cast<int>(m0));
        tma_load_2d(a_s + kAStage * 2, tmap_w, bars.full(s), kt * kBK, static_cast<int>(n0));
      }
    }
  } else {
    // A released stage may be filled again: lane 0 arrives for its warp.
    consume_k_tiles(
        d, smem, bars, k_tiles, tid / 128,
        [](unsigned bar, unsigned parity) { mbarrier_wait(bar, parity); },
        [lane](unsigned bar) { if (lane == 0) mbarrier_arrive(bar); });
  }
  __syncthreads();  // every stage consumed: the shared memory becomes the staging tile
  __nv_bfloat16* const stage = smem;
  if (warp_id < kConsumerThreads / kWarp)
    stage_relu(d, stage, tid / 128, tid % 128 / kWarp, lane);
  __syncthreads();
  pack_staged_block<__nv_bfloat16, kBM, kBN, kPitch, kProtoThreads / kWarp>(
      stage, m0, n0, n_rows, n_cols, tile_width, slots, totals, counts, data, indices,
      spill_start, spill_indices, spill_data, spill_capacity, spill_used, warp_id, lane);
}
