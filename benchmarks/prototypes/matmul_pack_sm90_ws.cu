// matmul_pack_sm90_ws.cu: PROTOTYPE (written 2026-12-04 without a GPU run of its own). Not
// part of the package: matmul_pack_sm90_ws.py (beside it) compiles it with NVRTC for sm_90a,
// swaps it in for twell_matmul_pack_sm90_bf16 under the launcher, checks it bit for bit against the
// shipped kernels and times it.
//
// proto_matmul_pack_sm90_ws: the shipped twell_matmul_pack_sm90_bf16 (same arguments and results)
// made persistent and warp-specialised, so that packing a tile overlaps the next tile's GEMM.
// Why: on the paper's up projection (H200) the shipped kernel's GEMM alone takes 0.467 ms and
// the whole kernel 0.639: its packing epilogue runs after each tile's GEMM with the tensor
// cores idle (one block per SM), 0.17 ms in all (benchmarks/NOTES.md, fourteenth session).
//   - One block per SM (grid = the SM count, or fewer tiles), looping over the 128 x 256
//     output tiles blockIdx.x, blockIdx.x + gridDim.x, ... in the shipped kernel's order.
//   - 384 threads = 3 warpgroups. Warpgroup 0: warp 0 is the TMA producer (one lane), warps
//     1-3 pack; warpgroups 1 and 2 are the wgmma consumers (64 rows each, as shipped).
//   - The producer streams the k tiles of every tile of the block through one ring of
//     kStages = 3 stages (full/empty mbarriers as shipped; the ring's counter runs on across
//     tiles), so the next tile's first stages load while the consumers finish a tile.
//   - The staging tile (relu(acc) rounded to bf16, 128 x 264 values) has its own shared
//     memory, after the ring, with two mbarriers: `staged` (8 arrivals, one per consumer warp,
//     after its fragment stores) and `packed` (3 arrivals, one per packing warp, once it has
//     read its rows). The consumers stage tile i only after tile i - 1 is packed; the packers
//     pack tile i while the consumers run the GEMM of tile i + 1.
// Shared memory: 3 * 48 KB ring + 66 KB staging + 64 bytes of mbarriers + 1024 alignment slack
// = 216 128 bytes (the shipped kernel's 4-stage ring does not fit beside a staging tile).
// Registers: 65536 / 384 = 170 a thread at most (the shipped kernel uses 154), no setmaxnreg.
// Prediction (H200, M = 16384, K = 2048, N = 5632, S = 13, kernel alone): 0.50-0.55 ms
// against 0.639 shipped: the GEMM (0.467, slightly slower with 3 stages) then bounds it if 3
// packing warps keep up (their share per tile: 0.155 ms x 9 / 3 warps / 21.3 waves = 22 us,
// as long as the GEMM's 22 us per tile: the risk).
// The waits trap after 2^26 polls (a first run: a protocol error becomes a launch error).
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"
#include "tma.cuh"
#include "stage_relu.cuh"

using namespace twell;

namespace {

using namespace twell::gemm;

constexpr int kStages = 3;
constexpr int kWsThreads = 384;
constexpr int kConsumerWarps = 8;  // warpgroups 1 and 2
constexpr int kStageBytes = (kAStage + kBStage) * 2;
constexpr int kStagingBytes = kBM * kPitch * 2;

// The 256 consumer threads (warpgroups 1 and 2) only: named barrier 1.
__device__ __forceinline__ void consumer_barrier() {
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}

__device__ __forceinline__ void wait_phase(unsigned bar, unsigned parity) {
  mbarrier_wait_or_trap<false>(bar, parity);
}

}  // namespace

// The kernel's body: warpgroup 0 = the producer warp and 3 packing warps, warpgroups 1-2 the
// consumers. The consumers pack the staging tile's first kConsumerRows rows themselves
// (v2: 32), right after staging it, and the packing warps the rest while the consumers run
// the next GEMM: with 3 packing warps alone (v1, kConsumerRows 0) the packing of a tile took
// longer than its GEMM (call 9). A 4th warpgroup of packers does not compile: 512 threads
// cap the kernel at 128 registers, below what wgmma with 128 accumulators needs (154), and
// ptxas does not count setmaxnreg for that.
template <int kConsumerRows>
__device__ __forceinline__ void ws_body(
    const TensorMap& tmap_x, const TensorMap& tmap_w, long long n_rows, long long n_cols,
    long long depth, int tile_width, int slots, int* __restrict__ totals,
    int* __restrict__ counts, __nv_bfloat16* __restrict__ data,
    unsigned short* __restrict__ indices, long long* __restrict__ spill_start,
    int* __restrict__ spill_indices, __nv_bfloat16* __restrict__ spill_data,
    long long spill_capacity, unsigned long long* __restrict__ spill_used) {
  constexpr int kPackWarps = 3;
  constexpr int kPackerRows = kBM - kConsumerRows;
  const int tid = threadIdx.x, warp_id = tid / kWarp, lane = tid % kWarp;
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long n_blocks = (n_rows + kBM - 1) / kBM * col_blocks;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  __nv_bfloat16* const smem = aligned_smem<__nv_bfloat16>();
  const unsigned ring = smem_address(smem);
  __nv_bfloat16* const stage = smem + kStages * kStageBytes / 2;
  const StageBarriers<kStages> bars{ring + kStages * kStageBytes + kStagingBytes};
  const unsigned staged = bars.base + 16u * kStages, packed = staged + 8u;

  if (tid == 0) {
    bars.init(1, kConsumerWarps);
    mbarrier_init(staged, kConsumerWarps);
    mbarrier_init(packed, kPackWarps);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp_id == 0) {
    // The producer: every k tile of every tile of this block, through one ring.
    if (lane == 0) {
      long long g = 0;  // k tiles issued so far
      for (long long b = blockIdx.x; b < n_blocks; b += gridDim.x) {
        const int m0 = static_cast<int>(b / col_blocks * kBM);
        const int n0 = static_cast<int>(b % col_blocks * kBN);
        for (int kt = 0; kt < k_tiles; ++kt, ++g) {
          const int s = static_cast<int>(g % kStages);
          wait_phase(bars.empty(s), static_cast<unsigned>((g / kStages) & 1) ^ 1u);
          mbarrier_arrive_expect_tx(bars.full(s), kStageBytes);
          const unsigned a_s = ring + s * kStageBytes;
          tma_load_2d(a_s, &tmap_x, bars.full(s), kt * kBK, m0);
          tma_load_2d(a_s + kAStage * 2, &tmap_w, bars.full(s), kt * kBK, n0);
        }
      }
    }
  } else if (warp_id < 4) {
    // The packers: rows kConsumerRows.. of tile i once staged, then free the staging tile.
    unsigned i = 0;
    for (long long b = blockIdx.x; b < n_blocks; b += gridDim.x, ++i) {
      wait_phase(staged, i & 1u);
      pack_staged_block<__nv_bfloat16, kPackerRows, kBN, kPitch, kPackWarps>(
          stage + kConsumerRows * kPitch, b / col_blocks * kBM + kConsumerRows,
          b % col_blocks * kBN, n_rows, n_cols, tile_width, slots, totals, counts, data,
          indices, spill_start, spill_indices, spill_data, spill_capacity, spill_used,
          warp_id - 1, lane);
      __syncwarp();  // every lane's reads of the staging tile before the arrival
      if (lane == 0) mbarrier_arrive(packed);
    }
  } else {
    // The consumers: the GEMM of tile i, then stage it once tile i - 1 is packed.
    const int wg = tid / 128 - 1, warp = tid % 128 / kWarp;
    float d[128];
    long long g = 0;  // k tiles consumed so far
    unsigned i = 0;
    for (long long b = blockIdx.x; b < n_blocks; b += gridDim.x, ++i) {
#pragma unroll
      for (int j = 0; j < 128; ++j) d[j] = 0.0f;
      for (int kt = 0; kt < k_tiles; ++kt, ++g) {
        const int s = static_cast<int>(g % kStages);
        wait_phase(bars.full(s), static_cast<unsigned>((g / kStages) & 1));
        __syncwarp();  // the lanes leave the wait loop apart; wgmma is .aligned
        const __nv_bfloat16* const a_s = smem + s * (kAStage + kBStage);
        wgmma_stage(d, a_s, a_s + kAStage, wg);
        // The previous k tile's wgmma has completed: its stage may be refilled.
        if (kt > 0 && lane == 0)
          mbarrier_arrive(bars.empty(static_cast<int>((g - 1) % kStages)));
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      fence_operands(d);
      if (k_tiles > 0 && lane == 0)
        mbarrier_arrive(bars.empty(static_cast<int>((g - 1) % kStages)));
      wait_phase(packed, (i & 1u) ^ 1u);  // tile i - 1 packed (at once for the first tile)
      if (kConsumerRows > 0) consumer_barrier();  // ... and the consumers' rows of it too
      __syncwarp();
      stage_relu(d, stage, wg, warp, lane);
      __syncwarp();  // every lane's stores before the arrival
      if (lane == 0) mbarrier_arrive(staged);
      if (kConsumerRows > 0) {
        consumer_barrier();  // the whole tile staged
        pack_staged_block<__nv_bfloat16, kConsumerRows, kBN, kPitch, kConsumerWarps>(
            stage, b / col_blocks * kBM, b % col_blocks * kBN, n_rows, n_cols, tile_width,
            slots, totals, counts, data, indices, spill_start, spill_indices, spill_data,
            spill_capacity, spill_used, tid / kWarp - 4, lane);
      }
    }
  }
}

#define TWELL_WS_KERNEL(name, consumer_rows)                                                   \
  extern "C" __global__ void __launch_bounds__(kWsThreads, 1)                                 \
  name(const __grid_constant__ TensorMap tmap_x, const __grid_constant__ TensorMap tmap_w,    \
       long long n_rows, long long n_cols, long long depth, int tile_width, int slots,        \
       int /* zero_fill: always filled */, int* __restrict__ totals, int* __restrict__ counts, \
       __nv_bfloat16* __restrict__ data,                                                      \
       unsigned short* __restrict__ indices, long long* __restrict__ spill_start,             \
       int* __restrict__ spill_indices, __nv_bfloat16* __restrict__ spill_data,               \
       long long spill_capacity, unsigned long long* __restrict__ spill_used) {               \
    ws_body<consumer_rows>(                                                                   \
        tmap_x, tmap_w, n_rows, n_cols, depth, tile_width, slots, totals, counts, data,       \
        indices, spill_start, spill_indices, spill_data, spill_capacity, spill_used);         \
  }

// Grid: min(SM count, ceil(M / 128) * ceil(N / 256)) blocks of 384 threads; dynamic shared
// memory kStages * kStageBytes + kStagingBytes + (2 * kStages + 2) * 8 + 1024 bytes.
TWELL_WS_KERNEL(proto_matmul_pack_sm90_ws, 0)
TWELL_WS_KERNEL(proto_matmul_pack_sm90_ws2, 32)
