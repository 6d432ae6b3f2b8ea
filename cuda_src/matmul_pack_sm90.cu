// matmul_pack_sm90.cu: twell_matmul_pack_sm90_bf16 and _f16, the Hopper twell_matmul_pack
// (sm_90a only: wgmma and TMA). Same results as twell_matmul_pack<T> (ffn.cu):
// relu(x @ w^T) packed into TwELL, the dense product never written to global memory; the
// packing works on the accumulators in registers (pack_accumulators, wgmma.cuh) instead of a
// staged tile (pack_staged_block, as ffn.cu). Both kernels add the k steps of 16 in the same
// order in fp32 and round relu(acc) once to T; the tests hold them to the same bits.
// The loader (twell/_cuda/_compile.py) compiles this file with NVRTC for -arch=sm_90a, and
// only on a device of compute capability 9.0; CI compiles it with nvcc for sm_90a.
//
// GEMM: block tile 128 x 256 x 64 (as ffn.cu), 288 threads = 9 warps, persistent, in clusters
// of 2 CTAs along M:
//   - the grid holds as many clusters as the device runs at once; cluster c computes the
//     tile pairs c, c + clusters, ...: pair p is row blocks 2 (p / col_blocks) and
//     2 (p / col_blocks) + 1 of column block p % col_blocks, CTA rank r taking the first or
//     the second (a padding CTA past M loads zero-filled rows and packs nothing);
//   - warps 0-7 are two consumer warpgroups, each wgmma.m64n256k16 on its 64 rows (128 fp32
//     accumulators a thread) from 128-byte-swizzled shared memory (tiles 1024-byte aligned:
//     descriptors start >> 4, stride byte offset 1024, k step kk 32 bytes into each row);
//   - warp 8 is the producer: one lane streams every k tile of every pair of its cluster
//     through one kStages-deep ring (its position runs on across tiles, so the next tile's
//     first loads overlap a tile's packing): the CTA's own x box (64 x 128) and its half of
//     the w tile (64 x 128), multicast into both CTAs of the cluster; 128-byte swizzle (the
//     layout the consumers read); rows past M or N and columns past K come zero-filled.
//   - Per stage two mbarriers: `full` (the producer's arrive.expect_tx of the stage's 48 KB,
//     completed by its own and its peer's TMA copies) and `empty` (one arrival per consumer
//     warp of either CTA once the wgmma that read the stage has completed: the producer
//     refills a stage, which its multicast writes in both CTAs, once both released it). No
//     block-wide barrier in the k loop; cluster barriers after the mbarrier init and before
//     exit (a peer's arrivals must find the barriers alive).
// Then each consumer thread packs its two rows' relu(acc) (pack_accumulators, a row at a time
// from 32 KB of words of its own: the ring is busy with the next tile).
// Both 16-bit types run here (the mma.sync kernel of ffn.cu takes about twice as long).
// Why clusters: the multicast halves the w traffic from L2 (a block's k tile needs 48 KB, of
// which it loads 32); without it the consumers waited on the TMA 39% of their time at the
// paper's up projection (docs/design.rst, the fused GEMM).
// The tensor maps come by value as __grid_constant__ parameters (TensorMap, tma.cuh).
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"
#include "tma.cuh"

using namespace twell;

namespace {

using namespace twell::gemm;

constexpr int kStages = 4;
constexpr int kCluster = 2;                             // CTAs sharing a w tile
constexpr int kConsumerThreads = 256;                   // 2 warpgroups
constexpr int kConsumerWarps = kConsumerThreads / kWarp;
constexpr int kSm90Threads = kConsumerThreads + kWarp;  // + the producer warp
// The gated kernel: the producer's warp in a warpgroup of its own, which gives its registers
// to the consumers (setmaxnreg is per warpgroup): the gate's 64 words stay in registers
// through the up projection's k loop, 232 a consumer thread (9 warps allow 168).
constexpr int kGatedThreads = kConsumerThreads + 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(2 * 128 * kConsumerRegs + 128 * kProducerRegs <= 65536, "one register file");
constexpr int kStageBytes = (kAStage + kBStage) * 2;    // 48 KB land in each CTA per stage
constexpr int kHalfB = kBStage / kCluster;              // values of half a w tile
constexpr int kWordBytes = 8 * 256 * 16;                // pack_accumulators' words

}  // namespace

// relu(x @ w^T) -> TwELL slots, counts, totals and the spill: twell_matmul_pack's contract
// (ffn.cu), for T = bf16 or fp16, with x and w read through their tensor maps (x: (M, K)
// boxes of 64 x 128; w: (N, K) boxes of 64 x 128, half a w tile; both 128-byte swizzle, zero
// fill). Persistent clusters of 2 CTAs: cluster c computes the tile pairs c, c + clusters,
// ... (pair p: row blocks 2 (p / col_blocks) + rank of column block p % col_blocks).
template <typename T, bool Gated = false, bool DenseOut = false>
__device__ __forceinline__ void matmul_pack_sm90(
    const TensorMap& tmap_x, const TensorMap& tmap_w, const TensorMap& tmap_u, long long n_rows,
    long long n_cols,
    long long depth, int tile_width, int slots, int zero_fill, int* __restrict__ totals,
    int* __restrict__ counts, T* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    T* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used) {
  const int tid = threadIdx.x, warp_id = tid / kWarp, lane = tid % kWarp;
  const unsigned rank = cluster_ctarank();
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long row_pairs = (n_rows + kCluster * kBM - 1) / (kCluster * kBM);
  const long long pairs = row_pairs * col_blocks;
  const long long first_pair = cluster_id(), pair_step = cluster_count();
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  // Gated: the gate's k tiles, then the up projection's, through the same ring.
  const int pair_tiles = Gated ? 2 * k_tiles : k_tiles;
  T* const smem = aligned_smem<T>();
  const unsigned ring = smem_address(smem);
  void* const words = reinterpret_cast<unsigned char*>(smem) + kStages * kStageBytes;
  const StageBarriers<kStages> bars{ring + kStages * kStageBytes + kWordBytes};
  // This CTA's block of pair p: its first row, and its first column.
  const auto row0 = [&](long long p) { return (p / col_blocks * kCluster + rank) * kBM; };
  const auto col0 = [&](long long p) { return p % col_blocks * kBN; };

  // full: this CTA's producer; empty: every consumer warp of the cluster. The peer's
  // arrivals and multicasts must find initialised barriers.
  if (tid == 0) bars.init(1, kCluster * kConsumerWarps);
  cluster_sync();

  if (warp_id >= kConsumerWarps) {
    if constexpr (Gated)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    // The producer: lane 0 of the first warp streams every k tile of the cluster's pairs
    // through the ring (its position g runs on across tiles, modulo 2 kStages): this CTA's
    // x tile, and its half of the w tile multicast into both CTAs (gated: the gate's k
    // tiles of a pair, then the up projection's). A stage is refilled once both CTAs
    // released it.
    // The launcher keeps M and N below 2^31, so the box coordinates fit the instruction's
    // 32-bit operands.
    if (warp_id == kConsumerWarps && lane == 0) {
      int g = 0;
      for (long long p = first_pair; p < pairs; p += pair_step) {
        const int m0 = static_cast<int>(row0(p)), n0 = static_cast<int>(col0(p));
        for (int i = 0; i < pair_tiles; ++i, g = (g + 1) % (2 * kStages)) {
          const int s = g % kStages;
          const bool up = Gated && i >= k_tiles;
          const int kt = up ? i - k_tiles : i;
          mbarrier_wait(bars.empty(s), ((g / kStages) & 1) ^ 1);
          mbarrier_arrive_expect_tx(bars.full(s), kStageBytes);
          const unsigned a_s = ring + s * kStageBytes;
          tma_load_2d(a_s, &tmap_x, bars.full(s), kt * kBK, m0);
          tma_load_2d_multicast(a_s + (kAStage + rank * kHalfB) * 2, up ? &tmap_u : &tmap_w,
                                bars.full(s), kt * kBK,
                                n0 + static_cast<int>(rank) * (kBN / kCluster),
                                static_cast<unsigned short>((1u << kCluster) - 1));
        }
      }
    }
    __syncwarp();
  } else {
    if constexpr (Gated)
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    // A stage is released in both CTAs: lane r arrives on CTA r's empty barrier.
    const auto release = [lane](unsigned bar) {
      if (lane < kCluster) mbarrier_arrive_cluster(bar, lane);
    };
    float d[128];
    int first = 0;  // ring position of the tile's first k tile
    const auto k_loop = [&]() {
      consume_k_tiles(
          d, smem, bars, k_tiles, tid / 128,
          [](unsigned bar, unsigned parity) { mbarrier_wait(bar, parity); }, release, first);
      if (k_tiles > 0) release(bars.empty((first + k_tiles - 1) % kStages));
      first = (first + k_tiles) % (2 * kStages);
    };
    for (long long p = first_pair; p < pairs; p += pair_step) {
      k_loop();
      if constexpr (Gated) {
        // The gate rounded and relu'd into 64 words, then the up projection's accumulators.
        unsigned gate[64], flags[2][2];
        gate_words<T>(d, gate, flags);
        k_loop();
        if constexpr (DenseOut) {
          if (row0(p) < n_rows)  // else a padding CTA past M
            store_gated_dense<T>(gate, d, data, words, row0(p), col0(p), n_rows, n_cols, tid / 128,
                                 tid % 128 / kWarp, lane);
        } else if (row0(p) < n_rows)  // else a padding CTA past M
          pack_gated_accumulators<T>(gate, flags, d, words, row0(p), col0(p), n_rows, n_cols,
                                     tile_width, slots, zero_fill != 0, totals, counts, data,
                                     indices, spill_start, spill_indices, spill_data,
                                     spill_capacity, spill_used, tid / 128, tid % 128 / kWarp,
                                     lane);
      } else {
        if (row0(p) < n_rows)  // else a padding CTA past M
          pack_accumulators<T>(d, words, row0(p), col0(p), n_rows, n_cols, tile_width, slots,
                               zero_fill != 0, totals, counts, data, indices, spill_start,
                               spill_indices, spill_data, spill_capacity, spill_used,
                               tid / 128, tid % 128 / kWarp, lane);
      }
    }
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  __syncwarp();
  cluster_sync();
}

// The kernels, one per dtype (NVRTC builds this file without name expressions). Grid: 2 x
// (at most the co-resident clusters, at most ceil(M / 256) * ceil(N / 256)) blocks of 288
// threads in clusters of 2; dynamic shared memory kStages * kStageBytes + kWordBytes +
// 2 * kStages * 8 (the mbarriers) + 1024 (alignment slack) bytes. The tensor maps come by
// value as __grid_constant__ parameters.
#define TWELL_MATMUL_PACK_SM90(name, T)                                                      \
  extern "C" __global__ void __cluster_dims__(kCluster, 1, 1)                               \
      __launch_bounds__(kSm90Threads, 1) name(                                              \
      const __grid_constant__ TensorMap tmap_x, const __grid_constant__ TensorMap tmap_w,   \
      long long n_rows, long long n_cols, long long depth, int tile_width, int slots,       \
      int zero_fill, int* __restrict__ totals, int* __restrict__ counts,                    \
      T* __restrict__ data, unsigned short* __restrict__ indices,                           \
      long long* __restrict__ spill_start, int* __restrict__ spill_indices,                 \
      T* __restrict__ spill_data, long long spill_capacity,                                 \
      unsigned long long* __restrict__ spill_used) {                                        \
    matmul_pack_sm90<T>(tmap_x, tmap_w, tmap_w, n_rows, n_cols, depth, tile_width, slots,   \
                        zero_fill, totals, counts, data, indices, spill_start,              \
                        spill_indices, spill_data, spill_capacity, spill_used);             \
  }

// The gated layer's hidden values relu(x @ w_gate^T) * (x @ w_up^T) at the gate's non-zeros,
// packed as twell_matmul_pack_sm90_* packs relu(x @ w^T) (the same grid and shared memory,
// 384 threads; tmap_u is w_up's map, as tmap_w is w_gate's): each pair's gate k tiles, then
// its up k tiles, through the one ring; the gate's accumulators wait rounded in 64 registers.
#define TWELL_GATED_PACK_SM90(name, T)                                                       \
  extern "C" __global__ void __cluster_dims__(kCluster, 1, 1)                               \
      __launch_bounds__(kGatedThreads, 1) name(                                              \
      const __grid_constant__ TensorMap tmap_x, const __grid_constant__ TensorMap tmap_w,   \
      const __grid_constant__ TensorMap tmap_u, long long n_rows, long long n_cols,         \
      long long depth, int tile_width, int slots, int zero_fill, int* __restrict__ totals,  \
      int* __restrict__ counts, T* __restrict__ data, unsigned short* __restrict__ indices, \
      long long* __restrict__ spill_start, int* __restrict__ spill_indices,                 \
      T* __restrict__ spill_data, long long spill_capacity,                                 \
      unsigned long long* __restrict__ spill_used) {                                        \
    matmul_pack_sm90<T, true>(tmap_x, tmap_w, tmap_u, n_rows, n_cols, depth, tile_width,    \
                              slots, zero_fill, totals, counts, data, indices, spill_start, \
                              spill_indices, spill_data, spill_capacity, spill_used);       \
  }

// The gated layer's hidden values relu(x @ w_gate^T) * (x @ w_up^T), zero where the gate is,
// written dense into out (M x N, row-major): the gated kernel's GEMMs and products with a
// dense epilogue, for a down projection that cuBLAS runs faster than the SpMM (the same grid,
// threads and shared memory as twell_gated_pack_sm90_*; the pack's `words` stage the rows).
#define TWELL_GATED_DENSE_SM90(name, T)                                                      \
  extern "C" __global__ void __cluster_dims__(kCluster, 1, 1)                               \
      __launch_bounds__(kGatedThreads, 1) name(                                              \
      const __grid_constant__ TensorMap tmap_x, const __grid_constant__ TensorMap tmap_w,   \
      const __grid_constant__ TensorMap tmap_u, long long n_rows, long long n_cols,         \
      long long depth, T* __restrict__ out) {                                               \
    matmul_pack_sm90<T, true, true>(tmap_x, tmap_w, tmap_u, n_rows, n_cols, depth,          \
                                    gemm::kBN, 1, 0, nullptr, nullptr, out, nullptr,        \
                                    nullptr, nullptr, nullptr, 0, nullptr);                 \
  }

TWELL_MATMUL_PACK_SM90(twell_matmul_pack_sm90_bf16, __nv_bfloat16)
TWELL_MATMUL_PACK_SM90(twell_matmul_pack_sm90_f16, __half)
TWELL_GATED_PACK_SM90(twell_gated_pack_sm90_bf16, __nv_bfloat16)
TWELL_GATED_PACK_SM90(twell_gated_pack_sm90_f16, __half)
TWELL_GATED_DENSE_SM90(twell_gated_dense_sm90_bf16, __nv_bfloat16)
TWELL_GATED_DENSE_SM90(twell_gated_dense_sm90_f16, __half)
