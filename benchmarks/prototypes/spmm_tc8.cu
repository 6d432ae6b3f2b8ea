// PROTOTYPE (not in the package): Y = A @ B for a bfloat16 TwELL A (tile width <= 256), on
// tensor cores, with the tokens (rows of A) as the MMA's n and each B tile staged in shared
// memory once per block of 512 rows and 64 columns.
//
// The question (benchmarks/NOTES.md, open question 3): the shipped gather kernel
// twell_spmm_rows reads the B row of every entry from L2 (3.8 GB at 99% on the paper's
// down projection: 0.47 ms, dense cuBLAS 0.42). Staging B[tile, 64 columns] once per
// 512-row block cuts L2 traffic to ~0.74 GB; every entry's 64 columns then come from
// shared memory. The earlier tensor-core kernel twell_spmm_mma (16 rows as the MMA's m,
// ldmatrix.trans of 8 gathered rows) spent 306 M instructions there (0.61 ms). Here:
//   * Y^T = B^T (gathered) x S, S[record][token] = the record's value where its row is the
//     token: the 8 tokens of a group are the MMA's n, so S wastes 8x, not 16x;
//   * no ldmatrix: the MMA's m index g of column tile j is output column 8g + 2j and g + 8 is
//     8g + 2j + 1, so lane (g, t) reads the 16-byte chunk g of each of its records' B rows
//     (LDS.128) and two byte permutes make each A register; lane (g, t) ends holding 8
//     contiguous output columns of tokens 2t and 2t + 1 (16-byte stores);
//   * the records of a (group, tile) are dealt (tc8_records) so that the 4 records one
//     LDS.128 reads (positions 2t + p of a k-step, t = 0..3) have distinct (row & 3), which
//     the B tile's layout maps to distinct bank groups.
// Records are built once per call by tc8_records (8 bytes each: value bits << 16 | token,
// and the byte offset of the record's B row in a stage). A pair of k-steps is one m16n8k16
// (the pair's second records are k = 8..15), an odd last one an m16n8k8.
// Three forms of the pipeline, all measured (NOTES, thirteenth session):
//   * v3 spmm_tc8s: every thread cp.asyncs 4 chunks of the B tile and its warp's records,
//     a block-wide barrier per tile (the B rows swizzled: chunk c of row r at c ^ 2 (r & 3));
//   * v4 spmm_tc8b<PRE = false>: warp 0 also produces, with bulk copies on `full`/`empty`
//     mbarriers, no block-wide barrier (B rows padded to 160 bytes: chunk c of row r in bank
//     group (c + 2r) mod 8). One bulk copy per 128-byte row made it 3x slower than v3;
//   * v5 spmm_tc8b<PRE = true>: one 32 KB bulk copy per tile, from b_tiles, a copy of B laid
//     out as [column block][row, padded to whole tiles][64 columns] with v3's swizzle (built
//     by the script). The fastest: 0.51 ms at 99%, bound by shared-memory wavefronts.
// The overflow is added at the end with the same k-steps, B rows from global memory.
// Sums: per output, the slot entries tile by tile in the dealt order, then the overflow,
// each MMA accumulating in fp32: deterministic, not the gather kernel's bits.
// Preconditions (the script): tile_width <= 256 and a multiple of 4, slots <= 16, N % 8 == 0,
// B and Y 16-byte aligned, B finite (0 * Inf in S). Grid: (ceil(N / 64), ceil(M / 512)),
// 512 threads.
// Earlier forms (v1: each warp building its records per tile; v2: v3 without its address
// and MMA changes) are in git at c5e9226.
#include "mbarrier.cuh"
#include "mma.cuh"

using namespace twell;

namespace {

constexpr int kTok = 8;                       // tokens per group: the MMA's n
constexpr int kCols = 64;                     // output columns per block
constexpr int kWarps = 16, kGroups = 4;       // 4 groups (32 rows) per warp
constexpr int kBlockRows = kWarps * kGroups * kTok;
constexpr int kMaxTile = 256;                 // B rows per stage; columns within a tile: 8 bits
constexpr int kRowBytes = 160;                // v4: a B row's 128 bytes, padded

template <typename T> struct Mma8;
template <> struct Mma8<__nv_bfloat16> {
  __device__ static void run(float (&d)[4], unsigned a0, unsigned a1, unsigned b) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(b));
  }
};
__device__ __forceinline__ int swizzled(unsigned row, unsigned chunk) {
  return static_cast<int>(row * 8u + (chunk ^ ((row & 3u) << 1)));
}

// Where sorted record i of a group goes: quad Q = i mod nq, member i div nq; quad Q is the
// positions 8 (Q >> 1) + 2 member + (Q & 1).
__device__ __forceinline__ int dealt(int i, int nq) {
  const int member = (i >= nq) + (i >= 2 * nq) + (i >= 3 * nq);
  const int q = i - member * nq;
  return 8 * (q >> 1) + 2 * member + (q & 1);
}

__device__ __forceinline__ unsigned selection_lo(unsigned lo, unsigned hi, unsigned g) {
  const unsigned l = (lo & 7u) == g ? lo >> 16 : 0u;
  const unsigned h = (hi & 7u) == g ? hi & 0xffff0000u : 0u;
  return l | h;
}

template <typename T>
__device__ __forceinline__ void kstep_lo(float (&acc)[4][4], unsigned lo, unsigned hi,
                                         const uint4& x, const uint4& y, unsigned g) {
  const unsigned s = selection_lo(lo, hi, g);
  const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    Mma8<T>::run(acc[j], __byte_perm(xs[j], ys[j], 0x5410), __byte_perm(xs[j], ys[j], 0x7632),
                 s);
  }
}

// One warp per 32 rows (4 groups), looping over the tiles. Grid: ceil(M / 256), 256 threads.
// One group's k-steps in a stage: pairs of k-steps as one m16n8k16 (the pair's second records
// are k = 8..15), an odd last one as m16n8k8. `recs`: this lane's first record pair (16 t
// bytes in); a record's offset names its B row's chunk 0, and lane g's chunk is at
// b_stage + (offset ^ 16 g) in swizzled rows (v3, v5) or b_stage + offset + 16 g in padded
// ones (v4).
template <typename T, bool SWIZZLED>
__device__ __forceinline__ void group_ksteps(float (&acc)[4][4], const char* recs, int steps,
                                             const char* b_stage, unsigned g) {
  const unsigned gx = 16u * g;
  auto chunk = [&](unsigned offset) {
    return *reinterpret_cast<const uint4*>(b_stage + (SWIZZLED ? offset ^ gx : offset + gx));
  };
  int i = 0;
  for (; i + 1 < steps; i += 2) {
    const uint4 r0 = *reinterpret_cast<const uint4*>(recs + 64 * i);
    const uint4 r1 = *reinterpret_cast<const uint4*>(recs + 64 * i + 64);
    const uint4 x0 = chunk(r0.y), y0 = chunk(r0.w), x1 = chunk(r1.y), y1 = chunk(r1.w);
    const unsigned s0 = selection_lo(r0.x, r0.z, g), s1 = selection_lo(r1.x, r1.z, g);
    const unsigned xa[4] = {x0.x, x0.y, x0.z, x0.w}, ya[4] = {y0.x, y0.y, y0.z, y0.w};
    const unsigned xb[4] = {x1.x, x1.y, x1.z, x1.w}, yb[4] = {y1.x, y1.y, y1.z, y1.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const unsigned a[4] = {__byte_perm(xa[j], ya[j], 0x5410), __byte_perm(xa[j], ya[j], 0x7632),
                             __byte_perm(xb[j], yb[j], 0x5410), __byte_perm(xb[j], yb[j], 0x7632)};
      Mma<T>::run(acc[j], a, s0, s1);
    }
  }
  if (i < steps) {
    const uint4 r0 = *reinterpret_cast<const uint4*>(recs + 64 * i);
    kstep_lo<T>(acc, r0.x, r0.z, chunk(r0.y), chunk(r0.w), g);
  }
}

template <typename T, int SMAX, bool DEAL, bool BLOCKED = false, bool PADDED = false>
__device__ __forceinline__ void tc8_records(
    const int* __restrict__ counts, const T* __restrict__ data,
    const unsigned short* __restrict__ indices, long long n_rows, long long n_cols,
    int tile_width, int slots, uint2* __restrict__ records, int* __restrict__ lens) {
  const int lane = threadIdx.x % kWarp;
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const long long row = warp * 32 + lane;
  if (warp * 32 >= n_rows) return;  // the whole warp
  const bool live = row < n_rows;
  const int tok = lane & 7;
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long group = row / kTok, groups4 = (n_rows + 31) / 32 * 4;
  const int cap = kTok * slots;
  const unsigned short* bits = reinterpret_cast<const unsigned short*>(data);
  for (long long tile = 0; tile < tiles; ++tile) {
    const long long pair = row * tiles + tile;
    const int cnt = live ? counts[pair] : 0;
    unsigned ent[SMAX];
#pragma unroll
    for (int s = 0; s < SMAX; ++s) {
      ent[s] = 0u;
      if (s < cnt) {
        ent[s] = static_cast<unsigned>(bits[pair * slots + s]) << 16 | indices[pair * slots + s];
      }
    }
    unsigned pc = 0;
    if (DEAL) {
#pragma unroll
      for (int s = 0; s < SMAX; ++s)
        if (s < cnt) pc += 1u << (8 * (ent[s] & 3u));
    } else {
      pc = static_cast<unsigned>(cnt);
    }
    unsigned incl = pc;
#pragma unroll
    for (int off = 1; off < kTok; off <<= 1) {
      const unsigned y = __shfl_up_sync(kFullMask, incl, off, kTok);
      if (tok >= off) incl += y;
    }
    const unsigned tot = __shfl_sync(kFullMask, incl, kTok - 1, kTok);
    const int total = DEAL ? static_cast<int>((tot & 0xff) + ((tot >> 8) & 0xff) +
                                              ((tot >> 16) & 0xff) + (tot >> 24))
                           : static_cast<int>(tot);
    const int len = (total + 7) & ~7, nq = len / 4;
    unsigned next = DEAL ? tot * 0x01010100u + (incl - pc) : incl - pc;
    const long long groups_pad = (n_rows + kBlockRows - 1) / kBlockRows * (kWarps * kGroups);
    uint2* out = records + (BLOCKED ? tile * groups_pad + group : group * tiles + tile) * cap;
#pragma unroll
    for (int s = 0; s < SMAX; ++s) {
      if (s < cnt) {
        int pos;
        if (DEAL) {
          const unsigned shift = 8 * (ent[s] & 3u);
          pos = dealt(static_cast<int>((next >> shift) & 0xffu), nq);
          next += 1u << shift;
        } else {
          pos = static_cast<int>(next++);
        }
        const unsigned r = ent[s] & 0xffu;
        out[pos] = make_uint2((ent[s] & 0xffff0000u) | static_cast<unsigned>(tok),
                              PADDED ? r * kRowBytes : r * 128u + 32u * (r & 3u));
      }
    }
    if (tok < len - total) out[DEAL ? dealt(total + tok, nq) : total + tok] = make_uint2(0u, 0u);
    if (tok == 0) lens[tile * (BLOCKED ? groups_pad : groups4) + group] = len;
  }
}

// v3's shared memory per stage: the B tile (rows of 128 bytes, swizzled), the block's
// records, the 64 lengths.
__host__ __device__ constexpr int tc8r_stage(int cap) {
  return kMaxTile * 128 + kWarps * kGroups * cap * 8 + kWarps * kGroups * 4;
}

// The rows' overflow entries, in rounds of up to 4 a row (the same k-steps, B rows read from
// global memory), then the stores: lane (g, t) holds columns n0 + 8g .. + 7 of tokens 2t
// and 2t + 1 of each group. `scratch`: 256 words of shared memory for the warp alone.
template <typename T>
__device__ __forceinline__ void overflow_and_store(
    float (&acc)[kGroups][4][4], unsigned* scratch, long long row0, int lane,
    const long long* __restrict__ overflow_indptr, const int* __restrict__ overflow_indices,
    const T* __restrict__ overflow_data, long long n_rows, const T* __restrict__ b,
    long long n, long long n0, T* __restrict__ out) {
  const unsigned g = lane >> 2, t = lane & 3;
  const int tok = lane & 7, mine = lane >> 3;
  const long long row = row0 + lane;
  const bool live = row < n_rows;
  long long o = live ? overflow_indptr[row] : 0;
  const long long o_end = live ? overflow_indptr[row + 1] : 0;
  unsigned* ov_recs = scratch + mine * 64;
  while (__any_sync(kFullMask, o < o_end)) {
    const int take = static_cast<int>(min(o_end - o, 4LL));
    int incl = take;
#pragma unroll
    for (int off = 1; off < kTok; off <<= 1) {
      const int y = __shfl_up_sync(kFullMask, incl, off, kTok);
      if (tok >= off) incl += y;
    }
    const int total = __shfl_sync(kFullMask, incl, kTok - 1, kTok);
    const int len = (total + 7) & ~7;
    __syncwarp();
    for (int e = 0; e < take; ++e) {
      const unsigned short v = reinterpret_cast<const unsigned short*>(overflow_data)[o + e];
      ov_recs[incl - take + e] = static_cast<unsigned>(v) << 16 | static_cast<unsigned>(tok);
      ov_recs[32 + incl - take + e] = static_cast<unsigned>(overflow_indices[o + e]);
    }
    if (tok < len - total) {
      ov_recs[total + tok] = 0u;
      ov_recs[32 + total + tok] = 0u;
    }
    o += take;
    __syncwarp();
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      const unsigned* recs = scratch + q * 64;
      const int lq = __shfl_sync(kFullMask, len, q * kTok);
      for (int k0 = 0; k0 < lq; k0 += 8) {
        const unsigned lo = recs[k0 + 2 * t], hi = recs[k0 + 2 * t + 1];
        const long long c = n0 + 8 * g;
        uint4 x = make_uint4(0u, 0u, 0u, 0u), y = x;
        if (c < n) {
          const long long lo_row = recs[32 + k0 + 2 * t], hi_row = recs[32 + k0 + 2 * t + 1];
          x = *reinterpret_cast<const uint4*>(b + lo_row * n + c);
          y = *reinterpret_cast<const uint4*>(b + hi_row * n + c);
        }
        kstep_lo<T>(acc[q], lo, hi, x, y, g);
      }
    }
  }

  const long long c = n0 + 8 * g;
  if (c >= n) return;
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long r = row0 + q * kTok + 2 * t + h;
      if (r >= n_rows) continue;
      uint4 w;
      w.x = Mma<T>::pack2(acc[q][0][h], acc[q][0][2 + h]);
      w.y = Mma<T>::pack2(acc[q][1][h], acc[q][1][2 + h]);
      w.z = Mma<T>::pack2(acc[q][2][h], acc[q][2][2 + h]);
      w.w = Mma<T>::pack2(acc[q][3][h], acc[q][3][2 + h]);
      *reinterpret_cast<uint4*>(out + r * n + c) = w;
    }
  }
}

// v3: the staging addresses computed once per thread (a running source pointer per chunk),
// stage indices as ints.
__device__ __forceinline__ void cp_async16_shared(unsigned dst, const void* src, bool inside) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(inside ? 16 : 0) : "memory");
}

template <typename T, int STAGES>
__device__ __forceinline__ void spmm_tc8s(
    const uint2* __restrict__ records, const int* __restrict__ lens, int cap,
    const long long* __restrict__ overflow_indptr, const int* __restrict__ overflow_indices,
    const T* __restrict__ overflow_data, long long n_rows, long long n_cols, int tile_width,
    const T* __restrict__ b, long long n, T* __restrict__ out) {
  extern __shared__ uint4 smem[];
  const int stage_bytes = tc8r_stage(cap);
  const char* base = reinterpret_cast<const char*>(smem);
  const unsigned sbase = smem_address(smem);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const unsigned g = lane >> 2, t = lane & 3;
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long n0 = static_cast<long long>(blockIdx.x) * kCols;
  const long long row0 = static_cast<long long>(blockIdx.y) * kBlockRows + warp * 32;
  const long long groups4 = (n_rows + 31) / 32 * 4;
  const long long group0 = row0 / kTok;
  const bool warp_live = row0 < n_rows;
  const int rec_off = kMaxTile * 128 + warp * kGroups * cap * 8;
  const int len_off = kMaxTile * 128 + kWarps * kGroups * cap * 8 + warp * kGroups * 4;

  // Staging: this thread's 4 chunks (rows r0 + 64 u, chunk c8) of every B tile.
  constexpr int kPer = kMaxTile * 8 / (kWarps * kWarp);
  const int c8 = threadIdx.x & 7, r_first = threadIdx.x >> 3;
  const bool col_ok = n0 + 8 * c8 < n;
  const T* src = b + static_cast<long long>(r_first) * n + (col_ok ? n0 + 8 * c8 : 0);
  const long long row_step = 64LL * n, tile_step = static_cast<long long>(tile_width) * n;
  const uint2* rec_src = records + group0 * tiles * cap;
  const long long group_step = tiles * cap;

  auto lens_of = [&](long long tile) {
    return warp_live && tile < tiles
               ? *reinterpret_cast<const int4*>(lens + tile * groups4 + group0)
               : make_int4(0, 0, 0, 0);
  };
  auto load_tile = [&](long long tile, int slot, int4 l) {
    const unsigned st = sbase + slot * stage_bytes;
    const T* s0 = src + tile * tile_step;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int r = r_first + 64 * u;
      if (r < tile_width) {
        const bool inside = col_ok && tile * tile_width + r < n_cols;
        cp_async16_shared(st + swizzled(r, c8) * 16, inside ? s0 + u * row_step : b, inside);
      }
    }
    const unsigned rd = st + rec_off;
    const uint2* rs = rec_src + tile * cap;
    const int ls[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      for (int i = lane; 2 * i < ls[q]; i += kWarp)
        cp_async16_shared(rd + (q * cap + 2 * i) * 8, rs + q * group_step + 2 * i, true);
    }
    if (lane == 0) {
      char* lens_at = reinterpret_cast<char*>(smem) + slot * stage_bytes + len_off;
      *reinterpret_cast<int4*>(lens_at) = l;
    }
  };

  float acc[kGroups][4][4];
#pragma unroll
  for (int q = 0; q < kGroups; ++q)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[q][j][i] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < tiles) load_tile(s, s, lens_of(s));
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  int4 next_lens = lens_of(STAGES - 1);
  asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 2) : "memory");
  __syncthreads();
  int cur = 0, nxt = STAGES - 1;
  for (long long tile = 0; tile < tiles; ++tile) {
    if (tile + STAGES - 1 < tiles) load_tile(tile + STAGES - 1, nxt, next_lens);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    next_lens = lens_of(tile + STAGES);
    const char* stage = base + cur * stage_bytes;
    const int4 l4 = *reinterpret_cast<const int4*>(stage + len_off);
    const int ls[4] = {l4.x, l4.y, l4.z, l4.w};
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      group_ksteps<T, true>(acc[q], stage + rec_off + q * cap * 8 + 16 * t, ls[q] >> 3, stage, g);
    }
    asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 2) : "memory");
    __syncthreads();  // the next stage is complete; this one is free
    cur = cur + 1 == STAGES ? 0 : cur + 1;
    nxt = nxt + 1 == STAGES ? 0 : nxt + 1;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();  // every warp is done with the stages: each borrows 1 KB of stage 0

  overflow_and_store<T>(acc, reinterpret_cast<unsigned*>(smem) + warp * 256, row0, lane,
                        overflow_indptr, overflow_indices, overflow_data, n_rows, b, n, n0, out);
}

// ---------------------------------------------------------------------------------------------
// v4: no block-wide barrier and no staging instructions in 15 of the 16 warps. Warp 0
// (also the producer) fills a ring of STAGES stages with bulk copies (cp.async.bulk, completing
// on the stage's `full` mbarrier): each B row's 64 columns into a row of 160 bytes (so that
// chunk c of row r sits in bank group (c + 2r) mod 8, the rotation the dealing expects), the
// block's records of the tile in one copy, and their 64 lengths. The 16 consumer warps wait
// on `full`, run the k-steps and arrive on the stage's `empty` mbarrier; the producer waits
// on `empty` before refilling. Records (tc8_records with V4): [tile][group][cap], the
// offset of the B row is row * 160; lens [tile][groups_pad], groups_pad = 64 ceil(M / 512).
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
               "%2, [%3];\n" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

template <bool PRE>
__host__ __device__ constexpr int tc8b_stage(int cap) {
  return kMaxTile * (PRE ? 128 : kRowBytes) + kWarps * kGroups * cap * 8 + kWarps * kGroups * 4;
}

template <typename T, int STAGES, bool PRE>
__device__ __forceinline__ void spmm_tc8b(
    const uint2* __restrict__ records, const int* __restrict__ lens, int cap,
    const long long* __restrict__ overflow_indptr, const int* __restrict__ overflow_indices,
    const T* __restrict__ overflow_data, long long n_rows, long long n_cols, int tile_width,
    const T* __restrict__ b, const T* __restrict__ b_tiles, long long n, T* __restrict__ out) {
  extern __shared__ uint4 smem[];
  const int stage_bytes = tc8b_stage<PRE>(cap);
  const char* base = reinterpret_cast<const char*>(smem);
  const unsigned sbase = smem_address(smem);
  const unsigned bars = sbase + STAGES * stage_bytes;  // full[s] at 8 s, empty[s] after
  unsigned* scratch_all =
      reinterpret_cast<unsigned*>(smem) + (STAGES * stage_bytes + 16 * STAGES) / 4;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long n0 = static_cast<long long>(blockIdx.x) * kCols;
  const long long groups_pad = (n_rows + kBlockRows - 1) / kBlockRows * (kWarps * kGroups);
  const int rec_off = kMaxTile * (PRE ? 128 : kRowBytes);
  const int len_off = rec_off + kWarps * kGroups * cap * 8;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(bars + 8 * s, 1);
      mbarrier_init(bars + 8 * (STAGES + s), kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Warp 0 also produces: it fills stage (tile % STAGES) once every warp has released it.
  const long long block_group = static_cast<long long>(blockIdx.y) * kWarps * kGroups;
  const unsigned row_bytes =
      static_cast<unsigned>(min(n - n0, static_cast<long long>(kCols))) * 2u;
  const unsigned rec_bytes = kWarps * kGroups * cap * 8;
  auto produce = [&](long long tile) {
    const int s = static_cast<int>(tile % STAGES);
    const unsigned round = static_cast<unsigned>(tile / STAGES);
    mbarrier_wait_or_trap<false>(bars + 8 * (STAGES + s), (round & 1u) ^ 1u);
    const int rows = static_cast<int>(min(static_cast<long long>(tile_width),
                                          n_cols - tile * tile_width));
    const unsigned stage = sbase + s * stage_bytes;
    const unsigned b_bytes = PRE ? tile_width * 128u : rows * row_bytes;
    if (lane == 0) {
      mbarrier_arrive_expect_tx(bars + 8 * s, b_bytes + rec_bytes + kWarps * kGroups * 4);
    }
    __syncwarp();
    if (PRE) {  // the tile's 64 columns, swizzled beforehand: one copy
      if (lane == 0)
        bulk_copy(stage, b_tiles + (blockIdx.x * tiles + tile) * tile_width * kCols, b_bytes,
                  bars + 8 * s);
    } else {
      const T* src = b + tile * tile_width * n + n0;
      for (int r = lane; r < rows; r += kWarp)
        bulk_copy(stage + r * kRowBytes, src + r * n, row_bytes, bars + 8 * s);
    }
    if (lane == 0) {
      bulk_copy(stage + rec_off, records + (tile * groups_pad + block_group) * cap, rec_bytes,
                bars + 8 * s);
      bulk_copy(stage + len_off, lens + tile * groups_pad + block_group, kWarps * kGroups * 4,
                bars + 8 * s);
    }
  };
  if (warp == 0) {
    for (int s = 0; s < STAGES - 1 && s < tiles; ++s) produce(s);
  }

  const unsigned g = lane >> 2, t = lane & 3;
  const long long row0 = static_cast<long long>(blockIdx.y) * kBlockRows + warp * 32;
  float acc[kGroups][4][4];
#pragma unroll
  for (int q = 0; q < kGroups; ++q)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[q][j][i] = 0.0f;

  for (long long tile = 0; tile < tiles; ++tile) {
    if (warp == 0 && tile + STAGES - 1 < tiles) produce(tile + STAGES - 1);
    const int s = static_cast<int>(tile % STAGES);
    mbarrier_wait_or_trap<false>(bars + 8 * s, static_cast<unsigned>(tile / STAGES) & 1u);
    const char* stage = base + s * stage_bytes;
    const int4 l4 = *reinterpret_cast<const int4*>(stage + len_off + warp * kGroups * 4);
    const int ls[4] = {l4.x, l4.y, l4.z, l4.w};
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      group_ksteps<T, PRE>(acc[q], stage + rec_off + (warp * kGroups + q) * cap * 8 + 16 * t,
                           ls[q] >> 3, stage, g);
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(bars + 8 * (STAGES + s));
  }

  overflow_and_store<T>(acc, scratch_all + warp * 256, row0, lane, overflow_indptr,
                        overflow_indices, overflow_data, n_rows, b, n, n0, out);
}

}  // namespace

#define PROTO_TC8_RECORDS(NAME, T, SMAX, DEAL, BLOCKED, PADDED)                                \
  extern "C" __global__ void __launch_bounds__(256) NAME(                                      \
      const int* __restrict__ counts, const T* __restrict__ data,                             \
      const unsigned short* __restrict__ indices, long long m, long long k, int tile_width,   \
      int slots, uint2* __restrict__ records, int* __restrict__ lens) {                       \
    tc8_records<T, SMAX, DEAL, BLOCKED, PADDED>(counts, data, indices, m, k, tile_width, slots,  \
                                                records, lens);                               \
  }

PROTO_TC8_RECORDS(proto_tc8_records_bf16_s8, __nv_bfloat16, 8, true, false, false)
PROTO_TC8_RECORDS(proto_tc8_records_bf16_s16, __nv_bfloat16, 16, true, false, false)
PROTO_TC8_RECORDS(proto_tc8_records_v4_bf16_s8, __nv_bfloat16, 8, true, true, true)
PROTO_TC8_RECORDS(proto_tc8_records_v4_bf16_s16, __nv_bfloat16, 16, true, true, true)
PROTO_TC8_RECORDS(proto_tc8_records_v5_bf16_s8, __nv_bfloat16, 8, true, true, false)
PROTO_TC8_RECORDS(proto_tc8_records_v5_bf16_s16, __nv_bfloat16, 16, true, true, false)

#define PROTO_SPMM(NAME, KERNEL, T, STAGES)                                                     \
  extern "C" __global__ void __launch_bounds__(kWarps * kWarp, 1) NAME(                        \
      const uint2* __restrict__ records, const int* __restrict__ lens, int cap,               \
      const long long* __restrict__ oi, const int* __restrict__ ox, const T* __restrict__ od, \
      long long m, long long k, int tile_width, const T* __restrict__ b, long long n,         \
      T* __restrict__ out) {                                                                  \
    KERNEL<T, STAGES>(records, lens, cap, oi, ox, od, m, k, tile_width, b, n, out);           \
  }

PROTO_SPMM(proto_spmm_tc8s_bf16_p2, spmm_tc8s, __nv_bfloat16, 2)
PROTO_SPMM(proto_spmm_tc8s_bf16_p3, spmm_tc8s, __nv_bfloat16, 3)

// v4 (PRE false: B read in place) and v5 (PRE true: b_tiles, B's tiles swizzled beforehand).
#define PROTO_SPMM_B(NAME, T, STAGES, PRE)                                                      \
  extern "C" __global__ void __launch_bounds__(kWarps * kWarp, 1) NAME(                        \
      const uint2* __restrict__ records, const int* __restrict__ lens, int cap,               \
      const long long* __restrict__ oi, const int* __restrict__ ox, const T* __restrict__ od, \
      long long m, long long k, int tile_width, const T* __restrict__ b,                      \
      const T* __restrict__ b_tiles, long long n, T* __restrict__ out) {                      \
    spmm_tc8b<T, STAGES, PRE>(records, lens, cap, oi, ox, od, m, k, tile_width, b, b_tiles, n, \
                              out);                                                           \
  }

PROTO_SPMM_B(proto_spmm_tc8b_bf16_p2, __nv_bfloat16, 2, false)
PROTO_SPMM_B(proto_spmm_tc8b_bf16_p3, __nv_bfloat16, 3, false)
PROTO_SPMM_B(proto_spmm_tc8t_bf16_p2, __nv_bfloat16, 2, true)
PROTO_SPMM_B(proto_spmm_tc8t_bf16_p3, __nv_bfloat16, 3, true)
