// PROTOTYPE (not part of the package): twell_spmm_rows with wider warps, bf16 only.
//
// One warp per (row, CHUNKS * 256 output columns): lane l owns, in each chunk c, the 8 columns
// c * 256 + 8 * l ... (16-byte loads; a warp's load per chunk is 512 contiguous bytes of one
// B row). Per entry a lane has CHUNKS independent 16-byte loads in flight, U entries at a time,
// so a warp keeps CHUNKS * U loads in flight while it reads the row's slots once instead of
// once per 256 columns. A slot travels as one 32-bit word (value bits << 16 | column in tile),
// one shuffle per entry (the shipped kernel uses three). Same accumulation order as
// twell_spmm_rows (tiles, slots, overflow; one fp32 FMA per product): the same bits.
// Needs N % 8 == 0 and 16-byte aligned b and out (the script checks). Kernels:
// proto_spmm_wide_<CHUNKS>_<U>, extern "C" (grid: ceil(M / 8) x ceil(N / (256 * CHUNKS))).
#include "twell_layout.cuh"

using namespace twell;

// Entries held one per lane; entry e reaches every lane by shuffles (all lanes call it).
struct SlotEntry {  // value bits << 16 | column in the tile
  unsigned word;
  long long col0;
  __device__ void operator()(int e, float& v, long long& col) const {
    const unsigned w = __shfl_sync(kFullMask, word, e);
    v = __uint_as_float(w & 0xffff0000u);
    col = col0 + (w & 0xffffu);
  }
};

struct OverflowEntry {
  float val;
  int col;
  __device__ void operator()(int e, float& v, long long& c) const {
    v = __shfl_sync(kFullMask, val, e);
    c = __shfl_sync(kFullMask, col, e);
  }
};

// Accumulates `len` entries into acc: CHUNKS 16-byte loads per entry, U entries at a time.
template <int CHUNKS, int U>
struct Gather {
  static constexpr int kSpan = kWarp * 8;
  const __nv_bfloat16* __restrict__ b;
  long long n, n0;
  const bool (&active)[CHUNKS];
  float (&acc)[CHUNKS][8];

  template <typename Entry>
  __device__ void operator()(int len, const Entry& entry) const {
    for (int e0 = 0; e0 < len; e0 += U) {
      float v[U];
      uint4 bv[U][CHUNKS];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        long long col;
        entry(e0 + u, v[u], col);
        const __nv_bfloat16* src = b + col * n + n0;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
          if (active[c] && e0 + u < len) {
            bv[u][c] = __ldg(reinterpret_cast<const uint4*>(src + c * kSpan));
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (e0 + u < len) {
#pragma unroll
          for (int c = 0; c < CHUNKS; ++c) {
            if (active[c]) {
              const unsigned w[4] = {bv[u][c].x, bv[u][c].y, bv[u][c].z, bv[u][c].w};
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                acc[c][2 * j] += v[u] * __uint_as_float(w[j] << 16);
                acc[c][2 * j + 1] += v[u] * __uint_as_float(w[j] & 0xffff0000u);
              }
            }
          }
        }
      }
    }
  }
};

template <int CHUNKS, int U>
__device__ __forceinline__ void spmm_wide(const int* __restrict__ counts,
                                const __nv_bfloat16* __restrict__ data,
                                const unsigned short* __restrict__ indices,
                                const long long* __restrict__ overflow_indptr,
                                const int* __restrict__ overflow_indices,
                                const __nv_bfloat16* __restrict__ overflow_data,
                                long long n_rows, long long n_cols, int tile_width, int slots,
                                const __nv_bfloat16* __restrict__ b, long long n,
                                __nv_bfloat16* __restrict__ out) {
  constexpr int kSpan = kWarp * 8;
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_rows) return;
  const long long n0 = static_cast<long long>(blockIdx.y) * kSpan * CHUNKS + lane * 8;
  bool active[CHUNKS];
  float acc[CHUNKS][8];
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    active[c] = n0 + c * kSpan < n;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[c][i] = 0.0f;
  }

  Gather<CHUNKS, U> gather{b, n, n0, active, acc};

  for (long long tile = 0; tile < tiles; ++tile) {
    const long long pair = row * tiles + tile;
    const int used = counts[pair];
    const long long col0 = tile * tile_width;
    for (int s0 = 0; s0 < used; s0 += kWarp) {
      const int s = s0 + lane;
      unsigned word = 0;
      if (s < used) {
        word = (static_cast<unsigned>(__bfloat16_as_ushort(data[pair * slots + s])) << 16) |
               indices[pair * slots + s];
      }
      gather(min(kWarp, used - s0), SlotEntry{word, col0});
    }
  }
  const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
  for (long long j0 = o_start; j0 < o_end; j0 += kWarp) {
    const long long j = j0 + lane;
    float my_val = 0.0f;
    int my_col = 0;
    if (j < o_end) {
      my_val = __bfloat162float(overflow_data[j]);
      my_col = overflow_indices[j];
    }
    gather(static_cast<int>(min(static_cast<long long>(kWarp), o_end - j0)),
           OverflowEntry{my_val, my_col});
  }
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    if (active[c]) {
      unsigned w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(acc[c][2 * j], acc[c][2 * j + 1]);
        w[j] = *reinterpret_cast<const unsigned*>(&pair);
      }
      *reinterpret_cast<uint4*>(out + row * n + n0 + c * kSpan) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

#define TWELL_PROTO_WIDE(CHUNKS, U)                                                               \
  extern "C" __global__ void proto_spmm_wide_##CHUNKS##_##U(                                     \
      const int* counts, const __nv_bfloat16* data, const unsigned short* indices,                \
      const long long* overflow_indptr, const int* overflow_indices,                              \
      const __nv_bfloat16* overflow_data, long long n_rows, long long n_cols, int tile_width,    \
      int slots, const __nv_bfloat16* b, long long n, __nv_bfloat16* out) {                       \
    spmm_wide<CHUNKS, U>(counts, data, indices, overflow_indptr, overflow_indices,                \
                         overflow_data, n_rows, n_cols, tile_width, slots, b, n, out);           \
  }

TWELL_PROTO_WIDE(1, 4)
TWELL_PROTO_WIDE(2, 2)
TWELL_PROTO_WIDE(2, 4)
TWELL_PROTO_WIDE(4, 1)
TWELL_PROTO_WIDE(4, 2)
TWELL_PROTO_WIDE(8, 1)
TWELL_PROTO_WIDE(8, 2)
