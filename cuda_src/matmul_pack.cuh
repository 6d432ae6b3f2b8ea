// matmul_pack.cuh: what the two fused GEMM -> TwELL kernels share, twell_matmul_pack
// (ffn.cu, mma.sync, sm_80+) and twell_matmul_pack_sm90 (matmul_pack_sm90.cu, wgmma, sm_90a):
// the 128 x 256 x 64 block tile, the cp.async loads of its operands into 128-byte-swizzled
// shared-memory rows, ReLU, and the packing half of the epilogue (a block of act(x @ w^T),
// already rounded to T and staged in shared memory, goes into the TwELL slots, counts and
// totals, and the entries past the slots into the spill buffer; see ffn.cu).
#pragma once

#include "twell_layout.cuh"
#include "mma.cuh"
#include "pack_warp.cuh"

namespace twell {
namespace gemm {

constexpr int kBM = 128, kBN = 256, kBK = 64;   // block tile: rows, columns, depth per stage
constexpr int kThreads = 256;
constexpr int kVec = 8;                           // 16-bit values per 16-byte chunk
constexpr int kChunks = kBK / kVec;               // 16-byte chunks per stage row: 8
constexpr int kRowsPerPass = kThreads / kChunks;  // stage rows one pass of the block loads: 32
constexpr int kALoads = kBM / kRowsPerPass, kBLoads = kBN / kRowsPerPass;  // 4, 8 per thread
constexpr int kAStage = kBM * kBK, kBStage = kBN * kBK;  // values per stage
constexpr int kPitch = kBN + 8;  // staging row pitch (values): +16 bytes per row

// Offset (values) of 16-byte chunk `chunk` (0..7) of row `row` in a [rows][kBK] stage tile:
// row r at r * 128 bytes, its chunk c at (c ^ (r % 8)) * 16. Every ldmatrix phase and every
// cp.async store of a warp touch 8 distinct 16-byte bank groups, and it is the layout wgmma
// reads as "128-byte swizzle" (from 1024-byte aligned tiles).
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 7)) * kVec);
}

// ReLU that keeps NaN (as NumPy's maximum(z, 0) does): only values below zero become zero.
__device__ __forceinline__ float relu(float v) { return v < 0.0f ? 0.0f : v; }

// This thread's share of the cp.async loads of one stage: chunk column tid % 8 of stage rows
// tid / 8 + 32 i of the x tile (4) and of the w tile (8). Rows past M or N and chunks past K
// are zero-filled (K % 8 == 0: a chunk is wholly inside or outside). Pointers and row checks
// are computed once, not per stage.
template <typename T>
struct TileLoader {
  const T* x;
  const T* w;
  long long depth;
  int chunk, row0;
  const T* a_src[kALoads];
  const T* b_src[kBLoads];
  unsigned a_rows = 0, b_rows = 0;  // bit i: that row exists (is below M, or N)

  __device__ __forceinline__ TileLoader(const T* x_, const T* w_, long long n_rows,
                                        long long n_cols, long long depth_, long long m0,
                                        long long n0, int tid)
      : x(x_), w(w_), depth(depth_), chunk(tid % kChunks), row0(tid / kChunks) {
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const long long r = m0 + row0 + i * kRowsPerPass;
      a_rows |= static_cast<unsigned>(r < n_rows) << i;
      a_src[i] = x + (r < n_rows ? r * depth : 0) + chunk * kVec;
    }
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const long long r = n0 + row0 + i * kRowsPerPass;
      b_rows |= static_cast<unsigned>(r < n_cols) << i;
      b_src[i] = w + (r < n_cols ? r * depth : 0) + chunk * kVec;
    }
  }

  // k tile kt into the stage whose x tile is at a_s (its w tile follows).
  __device__ __forceinline__ void load(T* a_s, int kt) const {
    T* const b_s = a_s + kAStage;
    const long long k0 = static_cast<long long>(kt) * kBK;
    const bool k_ok = k0 + chunk * kVec < depth;
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const bool ok = k_ok && (a_rows >> i & 1u);
      cp_async16(a_s + swizzle(row0 + i * kRowsPerPass, chunk), ok ? a_src[i] + k0 : x, ok);
    }
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const bool ok = k_ok && (b_rows >> i & 1u);
      cp_async16(b_s + swizzle(row0 + i * kRowsPerPass, chunk), ok ? b_src[i] + k0 : w, ok);
    }
  }
};

}  // namespace gemm

// Rows a warp of pack_staged_block packs at once: their dependency chains (shared-memory load,
// warp scan, stores) interleave. One row at a time, the epilogue is latency-bound (a third of
// the Hopper kernel's time at the paper's up projection; docs/design.rst, the fused GEMM).
constexpr int kPackRows = 4;

// stage: kRows x kCols values of the block whose first output is (m0, n0), row pitch kPitch
// values; kWarps warps of the block call this together (warp, lane: this thread's).
// Warp w packs rows w + kWarps (kPackRows p + k), k < kPackRows, in pass p; lane l holds
// columns 8l .. 8l + 7 of the block, which lie in the block's tile l / (tile_width / 8). One
// warp scan per row ranks the entries of every tile of the row at once (a tile's ranks are the
// scan minus its value at the tile's first lane): the slots, counts, totals and spill are
// those pack_chunk and finish_pair (pack_warp.cuh) write for the dense pack, one pair at a time.
template <typename T, int kRows, int kCols, int kPitch, int kWarps>
__device__ __forceinline__ void pack_staged_block(
    const T* stage, long long m0, long long n0, long long n_rows, long long n_cols,
    int tile_width, int slots, int* __restrict__ totals, int* __restrict__ counts,
    T* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    T* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used, int warp, int lane, bool zero_fill = true) {
  constexpr int kVec = 8;  // 16-bit values per 16-byte chunk: a warp covers 256 columns
  static_assert(kCols == kWarp * kVec, "one 16-byte chunk per lane covers the block's columns");
  const long long tiles = n_tiles(n_cols, tile_width);
  const int lanes_per_tile = tile_width / kVec;
  const int first = lane / lanes_per_tile * lanes_per_tile;  // the first lane of this tile
  const int last = first + lanes_per_tile - 1;
  const int lane_in_tile = lane - first;
  const long long tile = n0 / tile_width + lane / lanes_per_tile;
  const bool tile_ok = tile < tiles;  // tiles past N get nothing written
  const int j0 = lane_in_tile * kVec;  // this lane's first column in its tile
  const long long col0 = tile * tile_width;
  unsigned valid = 0;  // columns past N hold act(0 * x), which may be NaN: never stored
#pragma unroll
  for (int i = 0; i < kVec; ++i) valid |= static_cast<unsigned>(n0 + lane * kVec + i < n_cols) << i;

  for (int r0 = warp; r0 < kRows; r0 += kWarps * kPackRows) {
    Vec<T, kVec> chunk[kPackRows];
    unsigned bits[kPackRows];
    int n[kPackRows], incl[kPackRows];
#pragma unroll
    for (int k = 0; k < kPackRows; ++k) {
      const int r = r0 + k * kWarps;
      bits[k] = 0;
      if (r < kRows && m0 + r < n_rows) {  // whole warp
        chunk[k] = *reinterpret_cast<const Vec<T, kVec>*>(stage + r * kPitch + lane * kVec);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          bits[k] |= static_cast<unsigned>(is_nonzero(chunk[k].v[i])) << i;
        bits[k] &= valid;
      }
      n[k] = __popc(bits[k]);
      incl[k] = n[k];
    }
#pragma unroll
    for (int offset = 1; offset < kWarp; offset <<= 1) {
#pragma unroll
      for (int k = 0; k < kPackRows; ++k) {
        const int y = __shfl_up_sync(kFullMask, incl[k], offset);
        if (lane >= offset) incl[k] += y;
      }
    }
#pragma unroll
    for (int k = 0; k < kPackRows; ++k) {
      const int r = r0 + k * kWarps;
      if (r >= kRows || m0 + r >= n_rows) break;  // whole warp; the later rows are past too
      const int before = __shfl_sync(kFullMask, incl[k] - n[k], first);
      const int total = __shfl_sync(kFullMask, incl[k], last) - before;
      const long long pair = (m0 + r) * tiles + tile;
      const int rank0 = incl[k] - n[k] - before;  // rank of this lane's first entry
      if (tile_ok) {
        int rank = rank0;
        for (unsigned rest = bits[k]; rest != 0u && rank < slots; rest &= rest - 1u, ++rank) {
          const int i = __ffs(rest) - 1;
          data[pair * slots + rank] = pick(chunk[k].v, i);
          indices[pair * slots + rank] = static_cast<unsigned short>(j0 + i);
        }
        const int used = min(total, slots);
        for (int s = used + lane_in_tile; zero_fill && s < slots; s += lanes_per_tile) {
          data[pair * slots + s] = Value<T>::zero();
          indices[pair * slots + s] = 0;
        }
        if (lane_in_tile == 0) {
          counts[pair] = used;
          totals[pair] = total;
        }
      }
      const bool spills = tile_ok && total > slots;
      if (__any_sync(kFullMask, spills)) {
        unsigned long long start = 0;
        if (spills && lane_in_tile == 0)
          start = atomicAdd(spill_used, static_cast<unsigned long long>(total - slots));
        start = __shfl_sync(kFullMask, start, first);
        if (spills) {
          const bool fits = static_cast<long long>(start) + (total - slots) <= spill_capacity;
          if (lane_in_tile == 0) spill_start[pair] = fits ? static_cast<long long>(start) : -1;
          int rank = rank0;
          for (unsigned rest = fits ? bits[k] : 0u; rest != 0u; rest &= rest - 1u, ++rank) {
            if (rank < slots) continue;
            const int i = __ffs(rest) - 1;
            const long long o = static_cast<long long>(start) + (rank - slots);
            spill_indices[o] = static_cast<int>(col0 + j0 + i);
            spill_data[o] = pick(chunk[k].v, i);
          }
        }
      }
    }
  }
}

}  // namespace twell
