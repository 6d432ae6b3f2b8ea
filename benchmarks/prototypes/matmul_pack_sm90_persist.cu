// matmul_pack_sm90_persist.cu: PROTOTYPE (eighteenth session). Not part of the package:
// matmul_pack_sm90_persist.py (beside it) compiles it with NVRTC for sm_90a, swaps it in for
// twell_matmul_pack_sm90_bf16 under the launcher, checks it bit for bit against the shipped
// kernels and times it.
//
// proto_matmul_pack_sm90_persist: the shipped twell_matmul_pack_sm90_bf16 (same arguments,
// same results) made persistent, its epilogue unchanged in kind: one block per SM loops over
// the 128 x 256 output tiles blockIdx.x, blockIdx.x + gridDim.x, ... (the shipped order), its
// producer warp streaming every k tile of every tile through one 4-stage ring, so that while
// the consumers pack tile i from their accumulators the producer already fills the ring with
// tile i + 1's first 4 k tiles (the shipped kernel starts each block with an empty ring, and
// pays a block launch and a prologue per tile). The packing's words need their own shared
// memory now (the ring is busy): pack_accumulators<T, true> packs a row at a time from 32 KB.
// Why: the persistent GEMM alone with 4 stages took 0.463-0.505 ms against the shipped GEMM's
// 0.472-0.527 (results/2026-12-04-h200-r/ws4.py); the epilogue is not overlapped with the
// tensor cores here (that needs a hand-off, NOTES question 5 (b)), only with the loads.
// Prediction (H200, M = 16384, K = 2048, N = 5632, S = 13, kernel alone): 0.52-0.55 ms
// against 0.565 shipped (the fill of 4 stages, ~1-2 us a tile, 21 tiles an SM, plus the
// persistent GEMM's 10-25 us), if splitting the words by row costs the epilogue nothing.
// Shared memory: 4 x 48 KB ring + 32 KB words + 64 bytes of mbarriers + 1024 alignment slack
// = 230 464 bytes (of 232 448). 288 threads, as shipped.
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"
#include "tma.cuh"
#include "persist.cuh"

using namespace twell;

namespace {

using namespace twell::gemm;

constexpr int kStages = 4;
constexpr int kConsumerWarps = 8;  // two warpgroups
constexpr int kPersistThreads = kConsumerWarps * kWarp + kWarp;  // + the producer warp
constexpr int kStageBytes = kPersistStageBytes;
constexpr int kWordBytes = 8 * 256 * 16;  // pack_accumulators<T, true>: one row's groups

}  // namespace

template <typename T>
__device__ __forceinline__ void persist_body(
    const TensorMap& tmap_x, const TensorMap& tmap_w, long long n_rows, long long n_cols,
    long long depth, int tile_width, int slots, int zero_fill, int* __restrict__ totals,
    int* __restrict__ counts, T* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    T* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used) {
  const int tid = threadIdx.x, warp_id = tid / kWarp, lane = tid % kWarp;
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long n_blocks = (n_rows + kBM - 1) / kBM * col_blocks;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  T* const smem = aligned_smem<T>();
  const unsigned ring = smem_address(smem);
  void* const words = reinterpret_cast<unsigned char*>(smem) + kStages * kStageBytes;
  const StageBarriers<kStages> bars{ring + kStages * kStageBytes + kWordBytes};

  if (tid == 0) bars.init(1, kConsumerWarps);
  __syncthreads();

  if (warp_id == kConsumerWarps) {
    if (lane == 0) produce_tiles(bars, ring, tmap_x, tmap_w, n_blocks, col_blocks, k_tiles);
    __syncwarp();
  } else {
    float d[128];
    int first = 0;  // ring position of the tile's first k tile, modulo 2 kStages
    for (long long b = blockIdx.x; b < n_blocks; b += gridDim.x) {
      consume_tile(d, smem, bars, k_tiles, tid / 128, lane, first);
      pack_accumulators<T, true>(d, words, b / col_blocks * kBM, b % col_blocks * kBN, n_rows,
                                 n_cols, tile_width, slots, zero_fill != 0, totals, counts,
                                 data, indices, spill_start, spill_indices, spill_data,
                                 spill_capacity, spill_used, tid / 128, tid % 128 / kWarp,
                                 lane);
    }
  }
}

// Grid: min(SM count, ceil(M / 128) * ceil(N / 256)) blocks of 288 threads; dynamic shared
// memory kStages * kStageBytes + kWordBytes + 2 * kStages * 8 + 1024 bytes.
extern "C" __global__ void __launch_bounds__(kPersistThreads, 1) proto_matmul_pack_sm90_persist(
    const __grid_constant__ TensorMap tmap_x, const __grid_constant__ TensorMap tmap_w,
    long long n_rows, long long n_cols, long long depth, int tile_width, int slots,
    int zero_fill, int* __restrict__ totals, int* __restrict__ counts,
    __nv_bfloat16* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    __nv_bfloat16* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used) {
  persist_body<__nv_bfloat16>(tmap_x, tmap_w, n_rows, n_cols, depth, tile_width, slots,
                              zero_fill, totals, counts, data, indices, spill_start,
                              spill_indices, spill_data, spill_capacity, spill_used);
}
