// matmul_pack_sm90.cu: twell_matmul_pack_sm90_bf16 and _f16, the Hopper twell_matmul_pack
// (sm_90a only: wgmma and TMA). Same results as twell_matmul_pack<T> (ffn.cu):
// relu(x @ w^T) packed into TwELL, the dense product never written to global memory; the
// packing works on the accumulators in registers (pack_accumulators, wgmma.cuh) instead of a
// staged tile (pack_staged_block, as ffn.cu). Both kernels add the k steps of 16 in the same
// order in fp32 and round relu(acc) once to T; the tests hold them to the same bits.
// The loader (twell/_cuda/_compile.py) compiles this file with NVRTC for -arch=sm_90a, and
// only on a device of compute capability 9.0; CI compiles it with nvcc for sm_90a.
//
// GEMM: block tile 128 x 256 x 64 (as ffn.cu), 288 threads = 9 warps:
//   - warps 0-7 are two consumer warpgroups, each wgmma.m64n256k16 on its 64 rows (128 fp32
//     accumulators a thread) from 128-byte-swizzled shared memory (tiles 1024-byte aligned:
//     descriptors start >> 4, stride byte offset 1024, k step kk 32 bytes into each row);
//   - warp 8 is the producer: one lane issues the TMA copies (cp.async.bulk.tensor.2d, boxes
//     of 64 x 128 of x and 64 x 256 of w, 128-byte swizzle: the layout the consumers read;
//     rows past M or N and columns past K come zero-filled from the unit) into kStages stages.
//   - Per stage two mbarriers: `full` (the producer's arrive.expect_tx of the stage's 48 KB,
//     completed by the TMA) and `empty` (one arrival per consumer warp once the wgmma that
//     read the stage has completed). No block-wide barrier in the k loop.
// Then each consumer thread packs its two rows' relu(acc) (pack_accumulators).
// Both 16-bit types run here (the mma.sync kernel of ffn.cu takes about twice as long).
// Why TMA: cp.async by all 256 threads (12 copies each per k tile and a block-wide barrier per
// k tile) is about 15% slower at the paper's up projection; this kernel's GEMM alone runs
// as fast as cuBLAS's (docs/design.rst, the fused GEMM).
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
constexpr int kConsumerThreads = 256;                   // 2 warpgroups
constexpr int kConsumerWarps = kConsumerThreads / kWarp;
constexpr int kSm90Threads = kConsumerThreads + kWarp;  // + the producer warp
constexpr int kStageBytes = (kAStage + kBStage) * 2;    // 48 KB: what one stage's TMA brings

}  // namespace

// relu(x @ w^T) -> TwELL slots, counts, totals and the spill: twell_matmul_pack's contract
// (ffn.cu), for T = bf16 or fp16, with x and w read through their tensor maps (x: (M, K)
// boxes of 64 x 128; w: (N, K) boxes of 64 x 256; both 128-byte swizzle, zero fill).
template <typename T>
__device__ __forceinline__ void matmul_pack_sm90(
    const TensorMap& tmap_x, const TensorMap& tmap_w, long long n_rows, long long n_cols,
    long long depth, int tile_width, int slots, int zero_fill, int* __restrict__ totals,
    int* __restrict__ counts, T* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    T* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used) {
  const int tid = threadIdx.x, warp_id = tid / kWarp, lane = tid % kWarp;
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long m0 = static_cast<long long>(blockIdx.x) / col_blocks * kBM;
  const long long n0 = static_cast<long long>(blockIdx.x) % col_blocks * kBN;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  T* const smem = aligned_smem<T>();
  const unsigned stages = smem_address(smem);
  const StageBarriers<kStages> bars{stages + kStages * kStageBytes};

  // full: the producer's arrive; empty: one arrival per consumer warp.
  if (tid == 0) bars.init(1, kConsumerWarps);
  __syncthreads();

  float d[128];
  if (warp_id == kConsumerWarps) {
    // The producer: lane 0 keeps every stage it may fill in flight. The launcher keeps M and
    // N below 2^31, so the box coordinates fit the instruction's 32-bit operands.
    if (lane == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        mbarrier_wait(bars.empty(s), ((kt / kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(bars.full(s), kStageBytes);
        const unsigned a_s = stages + s * kStageBytes;
        tma_load_2d(a_s, &tmap_x, bars.full(s), kt * kBK, static_cast<int>(m0));
        tma_load_2d(a_s + kAStage * 2, &tmap_w, bars.full(s), kt * kBK, static_cast<int>(n0));
      }
    }
    __syncwarp();
  } else {
    // A released stage may be filled again: lane 0 arrives for its warp.
    consume_k_tiles(
        d, smem, bars, k_tiles, tid / 128,
        [](unsigned bar, unsigned parity) { mbarrier_wait(bar, parity); },
        [lane](unsigned bar) { if (lane == 0) mbarrier_arrive(bar); });
  }
  // Every stage is consumed (each TMA copy completed on a full barrier a consumer waited for,
  // and every wgmma that read a stage has completed): the pipeline's shared memory holds the
  // packing's words. The producer warp is done.
  __syncthreads();
  if (warp_id < kConsumerWarps)
    pack_accumulators(d, smem, m0, n0, n_rows, n_cols, tile_width, slots, zero_fill != 0,
                      totals, counts, data, indices, spill_start, spill_indices, spill_data,
                      spill_capacity, spill_used, tid / 128, tid % 128 / kWarp, lane);
}

// The kernels, one per dtype (NVRTC builds this file without name expressions). Grid:
// ceil(M / 128) * ceil(N / 256) blocks of 288 threads, column blocks varying fastest; dynamic
// shared memory kStages * kStageBytes + 2 * kStages * 8 (the mbarriers) + 1024 (alignment
// slack) bytes. The tensor maps come by value as __grid_constant__ parameters.
#define TWELL_MATMUL_PACK_SM90(name, T)                                                      \
  extern "C" __global__ void __launch_bounds__(kSm90Threads, 1) name(                       \
      const __grid_constant__ TensorMap tmap_x, const __grid_constant__ TensorMap tmap_w,   \
      long long n_rows, long long n_cols, long long depth, int tile_width, int slots,       \
      int zero_fill, int* __restrict__ totals, int* __restrict__ counts,                    \
      T* __restrict__ data, unsigned short* __restrict__ indices,                           \
      long long* __restrict__ spill_start, int* __restrict__ spill_indices,                 \
      T* __restrict__ spill_data, long long spill_capacity,                                 \
      unsigned long long* __restrict__ spill_used) {                                        \
    matmul_pack_sm90<T>(tmap_x, tmap_w, n_rows, n_cols, depth, tile_width, slots, zero_fill, \
                        totals, counts, data, indices, spill_start, spill_indices,          \
                        spill_data, spill_capacity, spill_used);                            \
  }

TWELL_MATMUL_PACK_SM90(twell_matmul_pack_sm90_bf16, __nv_bfloat16)
TWELL_MATMUL_PACK_SM90(twell_matmul_pack_sm90_f16, __half)
