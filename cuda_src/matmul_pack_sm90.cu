// matmul_pack_sm90.cu: twell_matmul_pack_sm90, the Hopper twell_matmul_pack (bf16, sm_90a
// only: wgmma). Same arguments, results and epilogue as twell_matmul_pack<__nv_bfloat16>
// (ffn.cu): relu(x @ w^T) packed into TwELL by pack_staged_block (matmul_pack.cuh), the dense
// product never written to global memory. Both kernels add the k steps of 16 in the same
// order in fp32 and round relu(acc) once to bf16; the tests hold them to the same bits.
// The loader (twell/_kernels.py) compiles this file with NVRTC for -arch=sm_90a, and only on a
// device of compute capability 9.0; CI compiles it with nvcc for sm_90a.
//
// GEMM: block tile 128 x 256 x 64 (as ffn.cu), 256 threads = 2 warpgroups, each
// wgmma.m64n256k16 on its 64 rows (128 fp32 accumulators a thread). A 4-stage cp.async
// pipeline (TileLoader: the same swizzled rows as ffn.cu, which is wgmma's "128-byte
// swizzle" for K-major operands; tiles 1024-byte aligned), so the shared-memory descriptors
// are: start >> 4, stride byte offset 1024 (8 rows), layout 128B swizzle; k step kk of a stage
// starts kk * 32 bytes into the row. Per k tile: wait for the stage's copies,
// fence.proxy.async (cp.async writes are generic-proxy writes, wgmma reads through the async
// proxy), barrier, issue the copies of the tile two ahead, the 4 wgmma of this tile, commit,
// and wait until at most one wgmma group is pending. The stage a copy overwrites is two tiles
// old, since the previous tile's wgmma may still be reading it.
// Measured (H200, M = 16384, K = 2048, N = 5632, S = 13, 2026-12-03): 1.21 ms against 1.39 ms
// for the mma.sync kernel and 0.51 ms for the cuBLAS GEMM alone (benchmarks/NOTES.md).
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"

using namespace twell;

namespace {

using namespace twell::gemm;

constexpr int kStages = 4;
constexpr int kAhead = kStages - 2;  // k tiles whose copies are in flight ahead of the wgmma

}  // namespace

// relu(x @ w^T) -> TwELL slots, counts, totals and the spill: twell_matmul_pack's contract
// (ffn.cu), for bf16. Grid: ceil(M / 128) * ceil(N / 256) blocks of 256 threads, column
// blocks varying fastest; dynamic shared memory kStages * (kAStage + kBStage) * 2 + 1024 bytes.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
twell_matmul_pack_sm90(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                       long long n_rows, long long n_cols, long long depth, int tile_width,
                       int slots, int* __restrict__ totals, int* __restrict__ counts,
                       __nv_bfloat16* __restrict__ data, unsigned short* __restrict__ indices,
                       long long* __restrict__ spill_start, int* __restrict__ spill_indices,
                       __nv_bfloat16* __restrict__ spill_data, long long spill_capacity,
                       unsigned long long* __restrict__ spill_used) {
  const int tid = threadIdx.x, wg = tid / 128, warp = tid % 128 / 32, lane = tid % 32;
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long m0 = static_cast<long long>(blockIdx.x) / col_blocks * kBM;
  const long long n0 = static_cast<long long>(blockIdx.x) % col_blocks * kBN;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);
  __nv_bfloat16* const smem = aligned_smem();
  const TileLoader<__nv_bfloat16> loader(x, w, n_rows, n_cols, depth, m0, n0, tid);

  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_tiles) loader.load(smem + s * (kAStage + kBStage), s);
    asm volatile("cp.async.commit_group;\n");  // empty groups too: the wait counts groups
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (kt + kAhead < k_tiles)
      loader.load(smem + (kt + kAhead) % kStages * (kAStage + kBStage), kt + kAhead);
    asm volatile("cp.async.commit_group;\n");
    const __nv_bfloat16* const a_s = smem + (kt % kStages) * (kAStage + kBStage);
    const __nv_bfloat16* const b_s = a_s + kAStage;
    wgmma_stage(d, a_s, b_s, wg);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  fence_operands(d);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();  // the pipeline's shared memory becomes the staging tile (both warpgroups)

  __nv_bfloat16* const stage = smem;
  stage_relu(d, stage, wg, warp, lane);
  __syncthreads();
  pack_staged_block<__nv_bfloat16, kBM, kBN, kPitch, kThreads / kWarp>(
      stage, m0, n0, n_rows, n_cols, tile_width, slots, totals, counts, data, indices,
      spill_start, spill_indices, spill_data, spill_capacity, spill_used, tid / kWarp, lane);
}
