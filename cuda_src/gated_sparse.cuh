// gated_sparse.cuh: the gated Hopper kernels' up projection at the gate's non-zeros only
// (matmul_pack_sm90.cu with sparse_up set): for a sparse gate, each warp multiplies its 16 rows
// of x by only the rows of w_up that its rows' gate entries name, on mma.sync tensor cores,
// from the stages the producer streams as for the whole up GEMM. Only sm_90a compiles it.
//
// Why: at 1% non-zero a warp's 16 rows name about 38 of the tile's 256 columns, so the up
// projection's tensor-core work drops to about a sixth, and the up pass is bound by the
// stages' transfer from L2 instead (docs/design.rst, the gated layer's sparse up projection).
//
// Per tile pair, after the gate's k loop (gate_words):
//   - plan_columns: the warp's needed columns (an OR of its lanes' gate flags), numbered
//     residue by residue (column 8 j + s, s = column % 8, in the order (s, j)): slot t of
//     the compact list; groups G = ceil(needed / 8) of 8 slots;
//   - up_k_tiles: per k tile, the warp's A fragments (its 16 rows of the x stage) and, per
//     group, the B fragments of its 8 columns' rows of the w_up stage by ldmatrix (each lane
//     naming one column's row: no copy), into accumulator group g = d[4 g .. 4 g + 3] (the
//     m16n8 layout: lane l holds rows l / 4 and l / 4 + 8, slots 8 g + 2 (l % 4) + {0, 1});
//   - remap: through the warp's own 4 KB of the epilogue's shared memory, each lane takes
//     the value of every column 8 j + 2 q + b of its two rows back into d[4 j + 2 h + b],
//     wgmma's layout, which the packing and dense epilogues read as after the whole GEMM.
//     Columns that no gate entry names read another slot's value: the epilogues never use
//     them (the packing stores no entry there, the dense store writes +0 for a zero gate).
// The accumulation order differs from wgmma's (k steps of 16 in order, each an mma.sync), so
// the values may differ from the whole GEMM's in the last bits; both kernels of the gated
// layer (packed and dense) take the same way for the same launch, so their bits agree.
#pragma once

#include "mma.cuh"
#include "tma.cuh"

namespace twell {
namespace gated_sparse {

// Position of the n-th set bit of mask (n from 0, n < popc(mask)).
__device__ __forceinline__ int nth_set_bit(unsigned mask, int n) {
  int pos = 0;
#pragma unroll
  for (int step = 16; step > 0; step >>= 1)
    if (__popc(mask & ((1u << (pos + step)) - 1u)) <= n) pos += step;
  return pos;
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// One warp's compact list of the tile's columns that its 16 rows' gate entries name.
struct Columns {
  unsigned needed[2];  // residue 2 q + b (q = lane % 4): bit j for column 8 j + 2 q + b
  int base[2];         // the slot of residue 2 q + b's first needed column
  int groups;          // ceil(needed columns / 8), the same in every lane
};

// The warp's Columns from its lanes' gate flags (gate_words: flags[h][w] holds column
// 8 j + 2 q + b of row half h at bit 16 b + j % 16, j in 16 w .. 16 w + 15), and in
// `slots` (the warp's stage, 1 KB of it) byte 32 g + l: the column whose row lane l names in
// group g (slot 8 g + l % 8). In shared memory rather than registers: the accumulators and
// the gate's words hold 192 of a consumer's 232.
__device__ __forceinline__ Columns plan_columns(const unsigned (&flags)[2][2], int lane,
                                                unsigned char* slots) {
  Columns c;
  const int q = lane & 3;
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    unsigned own = 0;
#pragma unroll
    for (int w = 0; w < 2; ++w)
      own |= (((flags[0][w] | flags[1][w]) >> (16 * b)) & 0xffffu) << (16 * w);
    // The lanes of one q hold the same columns in the warp's other rows.
    own |= __shfl_xor_sync(0xffffffffu, own, 4);
    own |= __shfl_xor_sync(0xffffffffu, own, 8);
    own |= __shfl_xor_sync(0xffffffffu, own, 16);
    c.needed[b] = own;
  }
  // The slot where this lane's residues start: the needed columns of the residues before.
  const int own_count = __popc(c.needed[0]) + __popc(c.needed[1]);
  int before = 0, total = 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int n = __shfl_sync(0xffffffffu, own_count, r);
    before += r < q ? n : 0;
    total += n;
  }
  c.base[0] = before;
  c.base[1] = before + __popc(c.needed[0]);
  c.groups = (total + 7) >> 3;
  // Every residue's mask in every lane (lane q' holds residues 2 q' and 2 q' + 1).
  unsigned mask[8];
#pragma unroll
  for (int s = 0; s < 8; ++s) mask[s] = __shfl_sync(0xffffffffu, c.needed[s & 1], s >> 1);
#pragma unroll
  for (int g = 0; g < 32; ++g) {
    if (g >= c.groups) break;
    const int t = 8 * g + (lane & 7);
    unsigned m = 0;
    int s_of = 0, first = 0, start = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const int next = start + __popc(mask[s]);
      if (t >= start && t < next) {
        m = mask[s];
        s_of = s;
        first = start;
      }
      start = next;
    }
    // A slot past the last needed column (the last group's tail) reads column 0.
    slots[32 * g + lane] = t < total ? 8 * nth_set_bit(m, t - first) + s_of : 0;
  }
  __syncwarp();
  return c;
}

// The up projection's k tiles of one tile pair through the ring (as consume_k_tiles: wait on
// each stage's full barrier; every lane calls release(empty barrier) once the warp has read
// the stage), accumulated into d by groups of 8 needed columns (`slots`: plan_columns'). `ring`: the shared-memory
// address of stage 0 (stages of kStageBytes: the x tile, then the w_up tile, 128 rows of
// 128 bytes a half, 128-byte swizzle: chunk k of row r at (k ^ (r % 8)) * 16); `first`: the
// ring position of the pair's first up k tile modulo 2 kStages.
template <typename T, int kStages, typename Release>
__device__ __forceinline__ void up_k_tiles(float (&d)[128], const Columns& c,
                                           const unsigned char* slots, unsigned ring,
                                           const StageBarriers<kStages>& bars, int k_tiles,
                                           int first, int wg, int warp, int lane,
                                           Release release) {
  constexpr unsigned kStageBytes = (gemm::kAStage + gemm::kBStage) * 2;
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  const int arow = wg * 64 + warp * 16 + (lane & 15);
  const unsigned a_row = arow * 128u, a_xor = arow & 7;
  const unsigned b_chunk = lane >> 3;  // the B fragment's k chunk that this lane addresses
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int g_ring = first + kt;
    const int s = g_ring % kStages;
    mbarrier_wait(bars.full(s), (g_ring / kStages) & 1);
    __syncwarp();  // the lanes leave the wait loop apart; ldmatrix and mma are .aligned
    const unsigned a_s = ring + s * kStageBytes;
    const unsigned b_s = a_s + gemm::kAStage * 2;
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // k steps 2 half and 2 half + 1
      unsigned a[2][4];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        ldmatrix_x4(a[kk], a_s + a_row +
                               (((4u * half + 2u * kk + (lane >> 4)) ^ a_xor) << 4));
#pragma unroll
      for (int g = 0; g < 32; ++g) {
        if (g >= c.groups) break;
        const unsigned col = slots[32 * g + lane];
        unsigned b[4];  // chunks 4 half .. 4 half + 3 of the column's row: two k steps
        ldmatrix_x4(b, b_s + col * 128u + (((4u * half + b_chunk) ^ (col & 7u)) << 4));
        float(&acc)[4] = *reinterpret_cast<float(*)[4]>(d + 4 * g);
        Mma<T>::run(acc, a[0], b[0], b[1]);
        Mma<T>::run(acc, a[1], b[2], b[3]);
      }
    }
    __syncwarp();
    release(bars.empty(s));
  }
}

// d from up_k_tiles' groups back to wgmma's layout (d[4 j + 2 h + b]: column 8 j + 2 q + b of
// row half h), through `stage`, the warp's own 4 KB of shared memory (1024 floats): 8 rows a
// pass while the groups fit 128 slots a row, else 4.
__device__ __forceinline__ void remap(float (&d)[128], const Columns& c, float* stage, int lane) {
  const int q = lane & 3, rg = lane >> 2;
  const bool wide = c.groups > 16;
  const int stride = wide ? 256 : 128;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int sub = 0; sub < 2; ++sub) {
      if (sub == 1 && !wide) break;
      const bool mine = !wide || (rg >> 2) == sub;
      float* const row = stage + (wide ? rg & 3 : rg) * stride;
      __syncwarp();
      if (mine) {
#pragma unroll
        for (int g = 0; g < 32; ++g) {
          if (g >= c.groups) break;
          *reinterpret_cast<float2*>(row + 8 * g + 2 * q) =
              make_float2(d[4 * g + 2 * h], d[4 * g + 2 * h + 1]);
        }
      }
      __syncwarp();
      if (mine) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const int slot = c.base[b] + __popc(c.needed[b] & ((1u << j) - 1u));
            d[4 * j + 2 * h + b] = row[min(slot, stride - 1)];
          }
        }
      }
    }
  }
  __syncwarp();
}

}  // namespace gated_sparse
}  // namespace twell
