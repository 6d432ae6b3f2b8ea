// persist.cuh: PROTOTYPE pieces shared by the persistent Hopper D2T prototypes
// (matmul_pack_sm90_persist.cu, matmul_pack_sm90_handoff.cu). Not part of the package.
// A persistent block loops over the 128 x 256 output tiles b = blockIdx.x, blockIdx.x +
// gridDim.x, ... (the shipped kernel's order); one kStages-deep TMA ring streams every k tile
// of every tile, its ring position g (stage g % kStages, barrier phase (g / kStages) & 1)
// running on across the tiles, modulo 2 kStages.
#pragma once

#include "tma.cuh"

namespace twell {

// Bytes one stage's TMA brings: a 128 x 64 tile of x and a 256 x 64 tile of w, 16-bit values.
constexpr int kPersistStageBytes = (gemm::kAStage + gemm::kBStage) * 2;

// The producer lane: every k tile of this block's tiles into the ring at `ring` (stage s at
// s * kPersistStageBytes), each stage once its `empty` barrier says the consumers are done.
template <int kStages>
__device__ __forceinline__ void produce_tiles(const StageBarriers<kStages>& bars, unsigned ring,
                                              const TensorMap& tmap_x, const TensorMap& tmap_w,
                                              long long n_blocks, long long col_blocks,
                                              int k_tiles) {
  int g = 0;  // ring position of the next k tile, modulo 2 kStages
  for (long long b = blockIdx.x; b < n_blocks; b += gridDim.x) {
    const int m0 = static_cast<int>(b / col_blocks * gemm::kBM);
    const int n0 = static_cast<int>(b % col_blocks * gemm::kBN);
    for (int kt = 0; kt < k_tiles; ++kt, g = (g + 1) % (2 * kStages)) {
      const int s = g % kStages;
      mbarrier_wait(bars.empty(s), ((g / kStages) & 1) ^ 1);
      mbarrier_arrive_expect_tx(bars.full(s), kPersistStageBytes);
      const unsigned a_s = ring + s * kPersistStageBytes;
      tma_load_2d(a_s, &tmap_x, bars.full(s), kt * gemm::kBK, m0);
      tma_load_2d(a_s + gemm::kAStage * 2, &tmap_w, bars.full(s), kt * gemm::kBK, n0);
    }
  }
}

// A consumer warp's GEMM of one tile from the ring: d complete, every stage it read released
// (lane 0 arrives for the warp; the last stage once its wgmma has completed, so that the
// producer may refill it for the next tile), and `first`, the ring position of the tile's
// first k tile, advanced to the next tile's.
template <int kStages, typename T>
__device__ __forceinline__ void consume_tile(float (&d)[128], const T* smem,
                                             const StageBarriers<kStages>& bars, int k_tiles,
                                             int wg, int lane, int& first) {
  const auto release = [lane](unsigned bar) { if (lane == 0) mbarrier_arrive(bar); };
  consume_k_tiles(
      d, smem, bars, k_tiles, wg,
      [](unsigned bar, unsigned parity) { mbarrier_wait(bar, parity); }, release, first);
  if (k_tiles > 0) release(bars.empty((first + k_tiles - 1) % kStages));
  first = (first + k_tiles) % (2 * kStages);
}

}  // namespace twell
