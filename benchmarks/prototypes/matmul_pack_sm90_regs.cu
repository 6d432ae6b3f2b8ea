// PROTOTYPE: twell_matmul_pack_sm90 with the TwELL packing done from the wgmma accumulators in
// registers (masks and popcounts), instead of packing a staged tile row by row with warp
// scans (pack_staged_block). Right, and 5% faster; see "Outcome" below.
//
// Why: the shipped kernel takes 0.639 ms at the paper's up projection (H200, M = 16384,
// K = 2048, N = 5632, 99%, S = 13), its GEMM alone 0.467 and GEMM + staging 0.483: the packing
// from the staging tile costs 0.155 ms, latency-bound chains of shared-memory loads, warp scans
// and stores with 9 warps per SM (benchmarks/NOTES.md, fourteenth session).
//
// Layout used: a consumer thread of warpgroup wg, warp w (of 4), lane l holds for rows
// r_h = 64 wg + 16 w + l / 4 + 8 h (h = 0, 1) the columns 8 j + 2 q + b (j < 32, q = l % 4,
// b < 2) in d[4 j + 2 h + b] (the layout stage_relu writes out). The four lanes of a quad hold
// one row between them. Each lane rounds relu(acc) to bf16 words (stored to its own column of
// the free pipeline memory: kept in registers they spilled, below) and makes a 64-bit mask
// of its non-zeros per row (bit 2 j + b, columns past N cleared); the quad swaps masks (two
// shuffles per lane and row), and every rank is a sum of popcounts: the entries of the quad's
// four masks in the tile's chunks before j, plus those of lower lanes in chunk j, plus b.
// Tiles are whole chunks (tile_width in {8, 16, ..., 256} is 8 times a power of two), so a
// tile is a contiguous bit range of every mask (benchmarks/prototypes/
// matmul_pack_sm90_regs_emulation.py checks this arithmetic on the CPU).
//
// Per row and tile (a loop uniform across the warp): lane t % 4 of the quad writes count and
// total, reserves the spill (atomicAdd) and writes spill_start; the quad's lanes zero the
// slots past the count. Per entry (a loop over the set bits of the lane's mask: ~0.6 a row at
// 99%): the owner lane writes slot `rank`, or the spill at spill_start[pair] + rank - S (read
// back from global memory after a __syncwarp: rare). The same values, ranks and spill
// contract as pack_staged_block, so the same bits after the launcher's move.
//
// How: this file defines the new epilogue, then includes the shipped kernel's source with two
// names redirected by macros, so that the GEMM, the TMA pipeline, the block barriers and the
// arguments are the shipped ones, not a copy: stage_relu(...) becomes pack_accumulators(...)
// on the kernel's own variables, and pack_staged_block becomes a no-op. Registers: 9 warps
// put 3 on one quarter of the register file, so 168 a thread at most (a form with
// __maxnreg__(192) compiled but could not launch: "too many resources"); the words in
// registers spilled 156-576 bytes at 168, in shared memory nothing spills.
//
// Prediction: the epilogue from 0.17 ms (staging + packing) to ~10-20 us (about 800
// independent instructions a thread, few dependent chains), the kernel from 0.639 to
// ~0.48-0.50 ms.
// Outcome (fifteenth GPU session, H200, call 14, results/2026-12-04-h200-o/call14_regs.txt):
// the shipped bits on the six cases of the cluster script (the one-entry spill too); alone
// 0.609 ms against 0.640 at T = 256, S = 13, 0.653 against 0.657 at T = 64, S = 3; in the
// launcher 0.699 against 0.745. The prediction failed: the epilogue still costs ~0.13 ms,
// ~6 us per tile and SM, far above its instruction count. Timing-only switches (wrong
// outputs): TWELL_PROTO_GEMM_ONLY (no epilogue), TWELL_PROTO_NO_PACK (words and masks only),
// TWELL_PROTO_NO_FILL (no zero fill), TWELL_PROTO_NO_ENTRIES (no per-entry loop). Run in the
// sixteenth session (call 1, results/2026-12-04-h200-p/call1_regs.txt): 0.472, 0.537, 0.597,
// 0.578 ms against 0.608 in all: rounding and masks 0.065, counts, totals and fill 0.041
// (the fill 0.011), the entries 0.030.
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"
#include "wgmma.cuh"
#include "tma.cuh"

namespace twell {
namespace regs {

using namespace twell::gemm;

__device__ __forceinline__ unsigned long long quad_mask(unsigned long long mask, int from) {
  const unsigned lo = __shfl_sync(kFullMask, static_cast<unsigned>(mask), from);
  const unsigned hi = __shfl_sync(kFullMask, static_cast<unsigned>(mask >> 32), from);
  return static_cast<unsigned long long>(hi) << 32 | lo;
}

// Bits [first, first + count) of a 64-bit mask (count in 0..64).
__device__ __forceinline__ unsigned long long bit_range(int first, int count) {
  const unsigned long long ones = count >= 64 ? ~0ull : (1ull << count) - 1ull;
  return first >= 64 ? 0ull : ones << first;
}

// relu(acc) of this thread's two rows packed into the TwELL arrays; the contract of
// pack_staged_block (matmul_pack.cuh).
__device__ __forceinline__ void pack_accumulators(
    const float (&d)[128], __nv_bfloat16* stage, long long m0, long long n0, long long n_rows,
    long long n_cols,
    int tile_width, int slots, int* __restrict__ totals,
    int* __restrict__ counts, __nv_bfloat16* __restrict__ data,
    unsigned short* __restrict__ indices, long long* __restrict__ spill_start,
    int* __restrict__ spill_indices, __nv_bfloat16* __restrict__ spill_data,
    long long spill_capacity, unsigned long long* __restrict__ spill_used, int wg, int warp,
    int lane) {
#ifdef TWELL_PROTO_GEMM_ONLY  // timing only: no epilogue at all
  if (d[0] == 12345.0f && d[127] == -1.0f) counts[0] = 0;  // keeps the accumulators alive
  return;
#endif
  const int q = lane & 3, quad = lane & ~3;
  const int log_chunks = __ffs(tile_width >> 3) - 1;  // tile_width / 8 is a power of two
  const long long tiles = n_tiles(n_cols, tile_width);
  const int tiles_here = kBN >> (3 + log_chunks);  // tiles in the block's 256 columns
  const long long tile0 = n0 / tile_width;
  const int tile_bits = 2 << log_chunks;  // mask bits per tile
  // relu(acc) rounded to bf16, two columns a word, goes to this thread's column of the free
  // pipeline memory (word i of thread t at i * 256 + t: conflict-free), where the rare entries
  // read it back: kept in registers, the 64 words pushed the kernel past the 168 registers
  // that 9 warps allow (3 warps share one quarter of the register file) and it spilled.
  // Both rows' words and masks first, so that all the accumulators die before the packing.
  unsigned* const words = reinterpret_cast<unsigned*>(stage) + (wg * 128 + warp * kWarp + lane);
  unsigned long long masks[2] = {0ull, 0ull};
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const long long col = n0 + 8 * j + 2 * q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const unsigned two = Mma<__nv_bfloat16>::pack2(relu(d[4 * j + 2 * h]),
                                                     relu(d[4 * j + 2 * h + 1]));
      words[(32 * h + j) * 256] = two;
      const unsigned bits = static_cast<unsigned>((two & 0x7fffu) != 0u && col < n_cols) |
                            static_cast<unsigned>((two & 0x7fff0000u) != 0u && col + 1 < n_cols)
                                << 1;
      masks[h] |= static_cast<unsigned long long>(bits) << (2 * j);
    }
  }
#ifdef TWELL_PROTO_NO_PACK  // timing only: the words written, nothing packed
  if (masks[0] == 1ull && masks[1] == 3ull) counts[0] = 0;  // keeps the masks alive
  return;
#endif
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const long long row = m0 + wg * 64 + 16 * warp + lane / 4 + 8 * h;
    const bool row_ok = row < n_rows;  // the same for the quad
    const unsigned long long mask = masks[h];
    unsigned long long quad_masks[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) quad_masks[p] = quad_mask(mask, quad | p);

    // Per (row, tile): count, total, spill reservation, zero fill.
    for (int t = 0; t < tiles_here; ++t) {
      const long long tile = tile0 + t;
      const unsigned long long range = bit_range(t * tile_bits, tile_bits);
      int total = 0;
#pragma unroll
      for (int p = 0; p < 4; ++p) total += __popcll(quad_masks[p] & range);
      const int owner = t & 3;
      const bool ok = row_ok && tile < tiles;
      const long long pair = row * tiles + tile;
      const bool spills = ok && total > slots && spill_capacity > 0;
      unsigned long long start = 0;
      if (spills && q == owner)
        start = atomicAdd(spill_used, static_cast<unsigned long long>(total - slots));
      start = __shfl_sync(kFullMask, start, quad | owner);
      if (!ok) continue;
      const int used = min(total, slots);
      if (q == owner) {
        counts[pair] = used;
        totals[pair] = total;
        if (spills) {
          const bool fits = static_cast<long long>(start) + (total - slots) <= spill_capacity;
          spill_start[pair] = fits ? static_cast<long long>(start) : -1;
        }
      }
#ifndef TWELL_PROTO_NO_FILL  // timing only: the slots past the count left as they were
      for (int s = used + q; s < slots; s += 4) {
        data[pair * slots + s] = Value<__nv_bfloat16>::zero();
        indices[pair * slots + s] = 0;
      }
#endif
    }
    __syncwarp();  // spill_start, written by the owner lanes, is read below

    // Per entry (a loop over the set bits: ~0.6 a row at 99%): its slot, or its place in the
    // spill.
    if (!row_ok) continue;
#ifdef TWELL_PROTO_NO_ENTRIES  // timing only: counts, totals and the fill; no entry written
    continue;
#endif
    for (unsigned long long rest = mask; rest != 0ull; rest &= rest - 1ull) {
      const int bit = __ffsll(static_cast<long long>(rest)) - 1;
      const int j = bit >> 1, b = bit & 1;
      const int t = j >> log_chunks;
      const long long tile = tile0 + t;
      if (tile >= tiles) continue;
      const unsigned long long before = bit_range(t * tile_bits, 2 * j - t * tile_bits);
      int r = b == 1 ? static_cast<int>(mask >> (2 * j) & 1ull) : 0;
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        r += __popcll(quad_masks[p] & before);
        if (p < q) r += __popc(static_cast<unsigned>(quad_masks[p] >> (2 * j)) & 3u);
      }
      const unsigned two = words[(32 * h + j) * 256];  // this thread's own store
      const __nv_bfloat16 value = __ushort_as_bfloat16(static_cast<unsigned short>(two >> (16 * b)));
      const long long pair = row * tiles + tile;
      const int in_tile = 8 * j + 2 * q + b - t * tile_width;
      if (r < slots) {
        data[pair * slots + r] = value;
        indices[pair * slots + r] = static_cast<unsigned short>(in_tile);
      } else if (spill_capacity > 0) {
        const long long start = spill_start[pair];
        if (start >= 0) {
          spill_indices[start + (r - slots)] = static_cast<int>(tile * tile_width + in_tile);
          spill_data[start + (r - slots)] = value;
        }
      }
    }
  }
}

// pack_staged_block's stand-in: the packing is done already.
template <typename T, int kRows, int kCols, int kPitch, int kWarps, typename... Args>
__device__ __forceinline__ void packed_already(Args&&...) {}

}  // namespace regs
}  // namespace twell

#define stage_relu(acc, stage_, wg_, warp_, lane_)                                              \
  twell::regs::pack_accumulators(acc, stage_, m0, n0, n_rows, n_cols, tile_width, slots,      \
                                 totals, counts, data, indices, spill_start, spill_indices,   \
                                 spill_data, spill_capacity, spill_used, wg_, warp_, lane_)
#define pack_staged_block twell::regs::packed_already
#include "matmul_pack_sm90.cu"
