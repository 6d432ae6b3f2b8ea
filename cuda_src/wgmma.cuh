// wgmma.cuh: the pieces of the Hopper (sm_90a) fused GEMM -> TwELL kernels: the wgmma
// m64n256k16 instruction (bf16 or fp16 operands) with fp32 accumulators, the shared-memory
// matrix descriptor of a K-major 128-byte-swizzled operand, the 1024-byte aligned dynamic
// shared memory, and the epilogue that packs relu(acc) into TwELL from the accumulators
// (pack_accumulators). Only sm_90a compiles it.
#pragma once

#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"

namespace twell {

// Shared-memory matrix descriptor of a K-major, 128-byte-swizzled operand.
__device__ __forceinline__ unsigned long long descriptor(const void* tile) {
  const unsigned long long start = (smem_address(tile) & 0x3ffffu) >> 4;
  const unsigned long long lead = 1;             // unused by swizzled K-major layouts
  const unsigned long long stride = 1024 >> 4;   // 8 rows of 128 bytes
  return start | (lead << 16) | (stride << 32) | (1ull << 62);
}

// d += a * b, one wgmma.m64n256k16 with fp32 accumulators (a, b: descriptors) of 16-bit
// operands of type T: Wgmma<T>::m64n256k16. TYPE is the instruction's operand type.
#define TWELL_WGMMA_M64N256K16(TYPE) \
  asm volatile( \
      "{\n" \
      ".reg .pred accumulate;\n" \
      "setp.ne.b32 accumulate, %130, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " " \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, accumulate, 1, 1, 0, 0;\n" \
      "}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
      : "l"(a), "l"(b), "r"(1));

template <typename T> struct Wgmma;

template <> struct Wgmma<__nv_bfloat16> {
  __device__ static void m64n256k16(float (&d)[128], unsigned long long a, unsigned long long b) {
    TWELL_WGMMA_M64N256K16("bf16");
  }
};

template <> struct Wgmma<__half> {
  __device__ static void m64n256k16(float (&d)[128], unsigned long long a, unsigned long long b) {
    TWELL_WGMMA_M64N256K16("f16");
  }
};

#undef TWELL_WGMMA_M64N256K16

// Pins the accumulators in their registers around asynchronous wgmma (no instruction).
__device__ __forceinline__ void fence_operands(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The dynamic shared memory, aligned by hand to 1024 bytes (the 128-byte swizzle needs it; the
// launcher allocates 1024 bytes of slack). Declared with 16-byte alignment only: with
// __align__(1024) the compiler takes the alignment as given and drops the adjustment.
template <typename T>
__device__ __forceinline__ T* aligned_smem() {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  return reinterpret_cast<T*>(
      smem_raw + ((1024 - (smem_address(smem_raw) & 1023u)) & 1023u));
}


// One 64-deep stage of the block's product into d: this warpgroup's 64 rows of the x tile at
// a_s (rows wg * 64 .. + 63, 8 KB in: 1024-byte aligned) times the 256-row w tile at b_s, as
// 4 wgmma k steps (k step kk is 32 bytes into every 128-byte row: the descriptor start
// advances by 2 units of 16 bytes), committed as one group; returns once at most this group
// is pending, i.e. the previous stage's wgmma has completed (its stage may be refilled).
template <typename T>
__device__ __forceinline__ void wgmma_stage(float (&d)[128], const T* a_s, const T* b_s, int wg) {
  fence_operands(d);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < gemm::kBK / 16; ++kk) {
    const unsigned long long a = descriptor(a_s + wg * 64 * gemm::kBK) + 2 * kk;
    const unsigned long long b = descriptor(b_s) + 2 * kk;
    Wgmma<T>::m64n256k16(d, a, b);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  fence_operands(d);
}

// The 16-bit value whose bits are b.
template <typename T> __device__ T from_bits(unsigned short b);
template <> __device__ __forceinline__ __nv_bfloat16 from_bits(unsigned short b) {
  return __ushort_as_bfloat16(b);
}
template <> __device__ __forceinline__ __half from_bits(unsigned short b) {
  return __ushort_as_half(b);
}

// Bits [first, first + count) of a 64-bit mask (first, count in 0..64).
__device__ __forceinline__ unsigned long long bit_range(int first, int count) {
  const unsigned long long ones = count >= 64 ? ~0ull : (1ull << count) - 1ull;
  return first >= 64 ? 0ull : ones << first;
}

// The 64-bit mask `mask` of lane `from` (of this warp).
__device__ __forceinline__ unsigned long long shfl_mask(unsigned long long mask, int from) {
  const unsigned lo = __shfl_sync(kFullMask, static_cast<unsigned>(mask), from);
  const unsigned hi = __shfl_sync(kFullMask, static_cast<unsigned>(mask >> 32), from);
  return static_cast<unsigned long long>(hi) << 32 | lo;
}

// Where a block's 256 columns fall among the tiles (tile_width is 8 times a power of two up
// to 256, so a tile is whole 8-column chunks: one contiguous range of tile_bits bits of a
// quad lane's 64-bit mask, see pack_accumulators).
struct TileSpan {
  long long tile0;   // the block's first tile
  long long tiles;   // the matrix's tiles
  int tiles_here;    // tiles in the block's 256 columns
  int log_chunks;    // log2(tile_width / 8)
  int tile_bits;     // mask bits per tile
  int tile_width;
  __device__ __forceinline__ TileSpan(long long n0, long long n_cols, int width)
      : tile0(n0 / width), tiles(n_tiles(n_cols, width)), tile_width(width) {
    log_chunks = __ffs(width >> 3) - 1;  // width / 8 is a power of two
    tiles_here = gemm::kBN >> (3 + log_chunks);
    tile_bits = 2 << log_chunks;
  }
};

// The bits of quad lane q's 64-bit mask (bit 2 j + b: column 8 j + 2 q + b of the block's
// 256 from n0) that lie inside N. Columns past N hold relu(0 * x), which may be NaN: never
// stored. Bit 2 j + b is inside N for j < ceil((cols - 2 q - b) / 8).
__device__ __forceinline__ unsigned long long quad_valid_bits(long long n0, long long n_cols,
                                                              int q) {
  const int cols = static_cast<int>(min(n_cols - n0, static_cast<long long>(gemm::kBN)));
  const int even = max(0, min(32, (cols - 2 * q + 7) >> 3));
  const int odd = max(0, min(32, (cols - 2 * q + 6) >> 3));
  return (bit_range(0, 2 * even) & 0x5555555555555555ull) |
         (bit_range(0, 2 * odd) & 0xaaaaaaaaaaaaaaaaull);
}

// The packing of one row from its quad's masks (the second half of pack_accumulators): lane
// q of each quad of the warp holds `mask`, the non-zero bits of its 64 columns of the row
// (bit 2 j + b: column 8 j + 2 q + b; only bits inside N), and value_of(j, b) gives the
// value of its own set bit 2 j + b. Per (row, tile) one lane of the quad writes count and
// total and reserves the spill; the quad zero-fills the slots past the count (unless
// !zero_fill); per entry (a loop over the set bits: ~0.6 a row at 99%) its owner writes slot
// `rank`, or its place in the spill (read back after a __syncwarp: rare). Every rank is a
// sum of popcounts: the quad's entries in the tile's chunks before j, those of lower lanes in
// chunk j, plus b. The warp calls it converged (it shuffles), every lane with its own row.
template <typename T, typename ValueOf>
__device__ __forceinline__ void pack_quad_row(
    unsigned long long mask, long long row, bool row_ok, const TileSpan& span, int slots,
    bool zero_fill, int* __restrict__ totals, int* __restrict__ counts, T* __restrict__ data,
    unsigned short* __restrict__ indices, long long* __restrict__ spill_start,
    int* __restrict__ spill_indices, T* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used, int lane, ValueOf value_of) {
  const int q = lane & 3, quad = lane & ~3;
  unsigned long long quad_masks[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) quad_masks[p] = shfl_mask(mask, quad | p);

  // Per (row, tile): count, total, spill reservation, zero fill.
  for (int t = 0; t < span.tiles_here; ++t) {
    const long long tile = span.tile0 + t;
    const unsigned long long range = bit_range(t * span.tile_bits, span.tile_bits);
    int total = 0;
#pragma unroll
    for (int p = 0; p < 4; ++p) total += __popcll(quad_masks[p] & range);
    const int owner = t & 3;
    const bool ok = row_ok && tile < span.tiles;
    const long long pair = row * span.tiles + tile;
    const bool spills = ok && total > slots;
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
    for (int s = used + q; zero_fill && s < slots; s += 4) {
      data[pair * slots + s] = Value<T>::zero();
      indices[pair * slots + s] = 0;
    }
  }
  __syncwarp();  // spill_start, written by the owner lanes, is read below
  if (!row_ok) return;

  // Per entry: its slot, or its place in the spill.
  for (unsigned long long rest = mask; rest != 0ull; rest &= rest - 1ull) {
    const int bit = __ffsll(static_cast<long long>(rest)) - 1;
    const int j = bit >> 1, b = bit & 1;
    const int t = j >> span.log_chunks;
    const long long tile = span.tile0 + t;
    if (tile >= span.tiles) continue;
    const unsigned long long before = bit_range(t * span.tile_bits, 2 * j - t * span.tile_bits);
    int r = b == 1 ? static_cast<int>(mask >> (2 * j) & 1ull) : 0;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      r += __popcll(quad_masks[p] & before);
      if (p < q) r += __popc(static_cast<unsigned>(quad_masks[p] >> (2 * j)) & 3u);
    }
    const T value = value_of(j, b);
    const long long pair = row * span.tiles + tile;
    const int in_tile = 8 * j + 2 * q + b - t * span.tile_width;
    if (r < slots) {
      data[pair * slots + r] = value;
      indices[pair * slots + r] = static_cast<unsigned short>(in_tile);
    } else {
      const long long start = spill_start[pair];
      if (start >= 0) {
        spill_indices[start + (r - slots)] = static_cast<int>(tile * span.tile_width + in_tile);
        spill_data[start + (r - slots)] = value;
      }
    }
  }
}

// Bit k of x's low half at bit 2 k and bit k of its high half at bit 2 k + 1 (k < 16): the
// outer perfect shuffle of Hacker's Delight 7-2 after one byte permute, about 10 instructions.
__device__ __forceinline__ unsigned interleave_halves(unsigned x) {
  x = __byte_perm(x, 0, 0x3120);  // bytes 0 2 1 3: the halves' bytes side by side
  x = (x & 0xf00ff00fu) | (x >> 4 & 0x00f000f0u) | (x << 4 & 0x0f000f00u);
  x = (x & 0xc3c3c3c3u) | (x >> 2 & 0x0c0c0c0cu) | (x << 2 & 0x30303030u);
  x = (x & 0x99999999u) | (x >> 1 & 0x22222222u) | (x << 1 & 0x44444444u);
  return x;
}

// relu(lo), relu(hi) rounded to T and packed as two 16-bit words (lo in the low half): rounded
// first, then one 16-bit max with zero that keeps NaN, for gemm::relu's two compares and
// selects a value. The same words as rounding relu(v) but for zeros, which are never stored.
template <typename T> __device__ unsigned relu_pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned relu_pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __hmax2_nan(__floats2bfloat162_rn(lo, hi), __nv_bfloat162(0.0f, 0.0f));
  return *reinterpret_cast<const unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned relu_pack2<__half>(float lo, float hi) {
  const __half2 v = __hmax2_nan(__floats2half2_rn(lo, hi), __half2(0.0f, 0.0f));
  return *reinterpret_cast<const unsigned*>(&v);
}

// The non-zero bits of a word of two T (columns 8 j + 2 q + {0, 1}) at bits j % 16 and
// 16 + j % 16, to be or-ed into flags[h][j / 16] (see pack_words). Without its sign bit a half
// is below 0x8000: adding 0x7fff carries into its top bit exactly when it is not zero (-0 is
// a zero), and never out of it. Bits 15 and 31 go to bits k and 16 + k.
__device__ __forceinline__ unsigned flag_bits(unsigned two, int j) {
  const unsigned t = (two & 0x7fff7fffu) + 0x7fff7fffu;
  const int k = j & 15;
  return (t >> (15 - k)) & ((1u << k) | (1u << (16 + k)));
}

// pack_accumulators' packing from a function of (j, h): the pair of T words (value, flag)
// of columns 8 j + 2 q + {0, 1} of row half h, `value` the two values to store and `flag`
// the two whose non-zero bits say which are entries, or-ed into `known` (flags gathered
// beforehand, as flag_bits gathers them; a flag word 0 adds none).
template <typename T, typename WordsOf>
__device__ __forceinline__ void pack_words(
    WordsOf words_of, const unsigned (&known)[2][2], void* words, long long m0, long long n0,
    long long n_rows,
    long long n_cols, int tile_width, int slots, bool zero_fill, int* __restrict__ totals,
    int* __restrict__ counts, T* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    T* __restrict__ spill_data,
    long long spill_capacity, unsigned long long* __restrict__ spill_used, int wg, int warp,
    int lane) {
  constexpr int kConsumers = 256;
  const TileSpan span(n0, n_cols, tile_width);
  const unsigned long long valid = quad_valid_bits(n0, n_cols, lane & 3);
  uint4* const groups = static_cast<uint4*>(words) + (wg * 128 + warp * kWarp + lane);
  // Both rows' words and masks first, so that the accumulators die before the packing.
  // The non-zero bits of row half h, chunks j of one half word each: flags[h][j / 16] holds
  // column 8 j + 2 q + b at bit 16 b + j % 16, one shift and one and-or a word; the masks'
  // order (bit 2 j + b) comes from one interleave per 32 bits after the loop.
  unsigned flags[2][2] = {{known[0][0], known[0][1]}, {known[1][0], known[1][1]}};
  uint4 later[8];  // the second row's groups
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    const int h = c >> 3;
    unsigned four[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = 4 * (c & 7) + e;
      const uint2 two = words_of(j, h);
      four[e] = two.x;
      flags[h][j >> 4] |= flag_bits(two.y, j);
    }
    if (c >= 8) {
      later[c & 7] = make_uint4(four[0], four[1], four[2], four[3]);
    } else {
      groups[c * kConsumers] = make_uint4(four[0], four[1], four[2], four[3]);
    }
  }
  unsigned long long masks[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    masks[h] = static_cast<unsigned long long>(interleave_halves(flags[h][0])) |
               static_cast<unsigned long long>(interleave_halves(flags[h][1])) << 32;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (h == 1) {
#pragma unroll
      for (int c = 0; c < 8; ++c) groups[c * kConsumers] = later[c];
    }
    const long long row = m0 + wg * 64 + 16 * warp + lane / 4 + 8 * h;
    // This thread's own word, stored above.
    const auto value_of = [groups](int j, int b) {
      const unsigned two =
          reinterpret_cast<const unsigned*>(groups + (j >> 2) * kConsumers)[j & 3];
      return from_bits<T>(static_cast<unsigned short>(two >> (16 * b)));
    };
    pack_quad_row<T>(masks[h] & valid, row, row < n_rows, span, slots, zero_fill, totals,
                     counts, data, indices, spill_start, spill_indices, spill_data,
                     spill_capacity, spill_used, lane, value_of);
  }
}

// relu(acc) of this consumer thread's two rows packed into the TwELL arrays straight from the
// accumulators, with pack_staged_block's contract (matmul_pack.cuh): the same slots, counts,
// totals, spill reservations and spill entries, so the same bits after the launcher's move.
//
// Accumulator layout (as mma.sync m16n8, per warp of the warpgroup): lane l of warp `warp` of
// warpgroup wg holds in d[4 j + 2 h + b] row 64 wg + 16 warp + l / 4 + 8 h, column
// 8 j + 2 (l % 4) + b (j < 32, h, b < 2). The four lanes of a quad hold one row between them.
// Each lane rounds relu(acc) to T (bf16 or fp16) words of two columns and builds a 64-bit
// mask of its non-zeros per row (bit 2 j + b; columns past N cleared); then pack_quad_row
// packs each row from the quad's masks (the rank arithmetic's NumPy model is in git history,
// benchmarks/prototypes/matmul_pack_sm90_regs_emulation.py). The non-zero test (the bits
// without the sign) is the same for bf16 and fp16: relu leaves no negative value, and -0 is
// a zero.
//
// The words wait for their entries in `words` (32 KB of shared memory past the pipeline's
// ring, which already holds the next tile's loads), a row at a time: word group c (4 words:
// j = 4 (c % 8) + e of row half h = c / 8) of consumer thread t as 16 bytes at
// ((c % 8) * 256 + t) * 16, conflict-free 128-bit stores; the second row's 8 groups wait in
// registers while the first row packs, then take its place. All 16 in registers would not
// fit: 9 warps put 3 on one quarter of the register file, 168 registers a thread at most,
// and the 64 words spilled. A thread reads only the words it wrote: no barrier.
// Why not stage and pack row by row (pack_staged_block, as ffn.cu does): at the paper's up
// projection that epilogue costs about a quarter more than this one, whose time goes
// mostly to rounding and masks, then counts, totals and zero fill, then the entries
// (docs/design.rst, the fused GEMM). The packing itself is pack_words, above.
template <typename T>
__device__ __forceinline__ void pack_accumulators(
    const float (&d)[128], void* words, long long m0, long long n0, long long n_rows,
    long long n_cols, int tile_width, int slots, bool zero_fill, int* __restrict__ totals,
    int* __restrict__ counts, T* __restrict__ data, unsigned short* __restrict__ indices,
    long long* __restrict__ spill_start, int* __restrict__ spill_indices,
    T* __restrict__ spill_data,
    long long spill_capacity, unsigned long long* __restrict__ spill_used, int wg, int warp,
    int lane) {
  const unsigned none[2][2] = {{0u, 0u}, {0u, 0u}};
  pack_words<T>(
      [&d](int j, int h) {
        const unsigned two = relu_pack2<T>(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        return make_uint2(two, two);
      },
      none, words, m0, n0, n_rows, n_cols, tile_width, slots, zero_fill, totals, counts, data,
      indices, spill_start, spill_indices, spill_data, spill_capacity, spill_used, wg, warp,
      lane);
}

// relu(acc) of the gate rounded to T, as pack_accumulators rounds it: gate[2 j + h] holds
// columns 8 j + 2 q + {0, 1} of row half h (the same columns as d[4 j + 2 h + {0, 1}]), and
// flags their non-zero bits as pack_words gathers them.
template <typename T>
__device__ __forceinline__ void gate_words(const float (&d)[128], unsigned (&gate)[64],
                                           unsigned (&flags)[2][2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) flags[h][0] = flags[h][1] = 0u;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      gate[2 * j + h] = relu_pack2<T>(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
      flags[h][j >> 4] |= flag_bits(gate[2 * j + h], j);
    }
  }
}

// The two T of a word times two floats, each product rounded once to T.
template <typename T> __device__ unsigned times_pack2(unsigned two, float lo, float hi);
template <> __device__ __forceinline__ unsigned times_pack2<__nv_bfloat16>(unsigned two,
                                                                           float lo, float hi) {
  // A bfloat16 is the top half of the float of the same value.
  const __nv_bfloat162 v =
      __floats2bfloat162_rn(__uint_as_float(two << 16) * lo,
                            __uint_as_float(two & 0xffff0000u) * hi);
  return *reinterpret_cast<const unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned times_pack2<__half>(unsigned two, float lo,
                                                                    float hi) {
  const float2 g = __half22float2(*reinterpret_cast<const __half2*>(&two));
  const __half2 v = __floats2half2_rn(g.x * lo, g.y * hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// times_pack2 where a zero of the word (either sign) gives +0 whatever its float holds
// (0 * Inf would be NaN): the dense hidden layer's zeros are those the TwELL one leaves out.
template <typename T> __device__ unsigned gated_pack2(unsigned two, float lo, float hi);
template <> __device__ __forceinline__ unsigned gated_pack2<__nv_bfloat16>(unsigned two,
                                                                           float lo, float hi) {
  const float g0 = __uint_as_float(two << 16), g1 = __uint_as_float(two & 0xffff0000u);
  const __nv_bfloat162 v =
      __floats2bfloat162_rn(g0 != 0.0f ? g0 * lo : 0.0f, g1 != 0.0f ? g1 * hi : 0.0f);
  return *reinterpret_cast<const unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned gated_pack2<__half>(unsigned two, float lo,
                                                                    float hi) {
  const float2 g = __half22float2(*reinterpret_cast<const __half2*>(&two));
  const __half2 v =
      __floats2half2_rn(g.x != 0.0f ? g.x * lo : 0.0f, g.y != 0.0f ? g.y * hi : 0.0f);
  return *reinterpret_cast<const unsigned*>(&v);
}

// The gated layer's hidden values packed as pack_accumulators packs relu(acc): the entries
// are the gate's non-zeros (gate and flags: gate_words of the gate's accumulators), each
// value the gate's T times the up projection's accumulator d, rounded once to T
// (twell_gated_take's arithmetic). A product that comes out zero stays an entry. The
// products replace the gate's words first, so that the accumulators die before the packing.
template <typename T>
__device__ __forceinline__ void pack_gated_accumulators(
    unsigned (&gate)[64], const unsigned (&flags)[2][2], const float (&d)[128], void* words,
    long long m0, long long n0, long long n_rows, long long n_cols, int tile_width, int slots,
    bool zero_fill, int* __restrict__ totals, int* __restrict__ counts, T* __restrict__ data,
    unsigned short* __restrict__ indices, long long* __restrict__ spill_start,
    int* __restrict__ spill_indices, T* __restrict__ spill_data, long long spill_capacity,
    unsigned long long* __restrict__ spill_used, int wg, int warp, int lane) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      gate[2 * j + h] = times_pack2<T>(gate[2 * j + h], d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
  }
  pack_words<T>([&gate](int j, int h) { return make_uint2(gate[2 * j + h], 0u); }, flags,
                words, m0, n0, n_rows, n_cols, tile_width, slots, zero_fill, totals, counts,
                data, indices, spill_start, spill_indices, spill_data, spill_capacity,
                spill_used, wg, warp, lane);
}

// The gated layer's hidden values relu(gate) * up written dense into `out` (row-major, n_cols
// a row, n_cols even), rounded once to T as pack_gated_accumulators rounds them: this
// consumer thread's two rows of the block at (m0, n0). Where the gate is zero the value is
// +0 whatever the up projection holds (gated_pack2): the dense matrix holds what the TwELL
// one holds, zeros where it stores no entry. Rows past M and columns past N are not written.
// Each warp stages a row half (8 rows x 512 bytes, 4 KB of `words`) and writes each row
// whole, 16 bytes a lane, instead of 16-byte pieces of 8 rows an instruction. Chunk j of
// row r lies at chunk j ^ r: the 8 rows' words of one j fall in distinct banks.
template <typename T>
__device__ __forceinline__ void store_gated_dense(
    const unsigned (&gate)[64], const float (&d)[128], T* __restrict__ out, void* words,
    long long m0, long long n0, long long n_rows, long long n_cols, int wg, int warp, int lane) {
  uint4* const stage = static_cast<uint4*>(words) + (wg * 4 + warp) * 256;
  const int q = lane & 3, r = lane >> 2;
  const int left = static_cast<int>(min(n_cols - n0, static_cast<long long>(gemm::kBN)));
  const bool vec = (n_cols & 7) == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // The row's 512-byte line is 512-aligned, so chunk j ^ r is one xor of a per-thread
    // base with the constant 16 j.
    const unsigned long long line =
        reinterpret_cast<unsigned long long>(stage + r * 32 + r) + 4 * q;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<unsigned*>(line ^ (16u * j)) =
          gated_pack2<T>(gate[2 * j + h], d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
    __syncwarp();
#pragma unroll 1
    for (int rr = 0; rr < 8; ++rr) {
      const long long row = m0 + wg * 64 + 16 * warp + rr + 8 * h;
      const uint4 v = stage[rr * 32 + (lane ^ rr)];
      if (row < n_rows && 8 * lane < left) {
        T* const at = out + row * n_cols + n0 + 8 * lane;
        const int words_left = (left - 8 * lane) >> 1;
        if (vec && words_left >= 4) {
          *reinterpret_cast<uint4*>(at) = v;
        } else {
          unsigned* const w = reinterpret_cast<unsigned*>(at);
          w[0] = v.x;
          if (words_left > 1) w[1] = v.y;
          if (words_left > 2) w[2] = v.z;
          if (words_left > 3) w[3] = v.w;
        }
      }
    }
    __syncwarp();
  }
}

}  // namespace twell
