// pack_stream.cu: PROTOTYPE (twenty-first session). Not part of the package:
// pack_stream.py (beside it) compiles it with NVRTC, checks it bit for bit against the shipped
// twell_pack_dense (pack.cu) and times both in one process. The session's second form,
// proto_pack_lean (v4 with fewer instructions a pair), shipped as pack.cu's pack_pairs_staged
// and left this file (in git at 1e7a340, with the 32-bit tile count that call 8 timed).
//
// proto_pack_stream<T, VEC, PAIRS, CHUNKS, STAGES>: the dense pack's count and slots passes
// (kModeCount, kModeSlots) with the shipped kernel's per-group work (pack_pairs_staged: one
// ballot per bit of a lane's count, the slots written through shared memory), but with the
// loads taken off the registers (NOTES, open question 4). v4 is a warp per group of PAIRS
// (row, tile) pairs: its loads go out, then it ranks and stores with nothing in flight, and
// exits; ncu saw neither DRAM nor issue saturated (94 us for 185 MB read, 46% of a copy).
// v5 (each warp looping, the next group in registers) took 89 registers and fewer warps, and
// was slower. Here each warp loops over the groups gw, gw + W, ... (W: the grid's warps, what
// the device holds at once) with a ring of STAGES groups in shared memory filled by cp.async
// (16 bytes a lane a vector, zero-filled past the matrix, as load_vec): STAGES - 1 groups are
// always in flight, and they cost no registers.
//
// Shared memory (dynamic): kStreamWarps * STAGES * PAIRS * CHUNKS * 32 vectors of 16 bytes,
// then kStreamWarps * PAIRS * CHUNKS * 32 * VEC column numbers (uint16) of the slots.
// Floors (H200, bf16 99%, M 16384, K 5632, S 13): read 185 MB, write ~22 MB: ~50 us at the
// copy's 4.2 TB/s. Prediction: the slots pass ~60 us (v4 94), the count pass ~50 (v4 70).
#include "twell_layout.cuh"

using namespace twell;

namespace {

constexpr int kStreamWarps = 8;

__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace

// Grid: at most the blocks the device holds at once (the launcher's choice), kStreamWarps
// warps each; dynamic shared memory as above.
template <typename T, int VEC, int PAIRS, int CHUNKS, int STAGES>
__global__ void __launch_bounds__(kStreamWarps * kWarp)
proto_pack_stream(const T* __restrict__ dense, long long n_rows, long long n_cols,
                  int tile_width, int slots, int mode, int* __restrict__ totals,
                  int* __restrict__ counts, T* __restrict__ data,
                  unsigned short* __restrict__ indices,
                  unsigned long long* __restrict__ n_overflow) {
  static_assert(VEC * sizeof(T) == 16, "cp.async moves 16-byte vectors");
  constexpr int kSpan = kWarp * VEC;
  constexpr int kTile = CHUNKS * kSpan;
  constexpr int kGroup = PAIRS * CHUNKS * kWarp;  // vectors of a group
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  V* const ring = reinterpret_cast<V*>(smem_raw) + warp * STAGES * kGroup;
  unsigned short* const stage_cols =
      reinterpret_cast<unsigned short*>(smem_raw + kStreamWarps * STAGES * kGroup * 16) +
      warp * PAIRS * kTile;
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long n_pairs = n_rows * tiles;
  const long long n_groups = (n_pairs + PAIRS - 1) / PAIRS;
  const long long step = static_cast<long long>(gridDim.x) * kStreamWarps;
  const long long g0 = static_cast<long long>(blockIdx.x) * kStreamWarps + warp;
  const long long j0 = static_cast<long long>(lane) * VEC;

  // Group g's vectors into ring stage `stage`; one commit group whether or not g exists, so
  // that wait_group counts stay uniform.
  const auto issue = [&](long long g, int stage) {
    if (g < n_groups) {
      const long long first = g * PAIRS;
      long long row = first / tiles, tile = first - row * tiles;
#pragma unroll
      for (int q = 0; q < PAIRS; ++q) {
        const long long col0 = tile * tile_width;
        const long long width =
            first + q < n_pairs ? min(static_cast<long long>(tile_width), n_cols - col0) : 0;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
          const long long j = j0 + c * kSpan;
          const bool in = j < width;
          cp_async16(ring + stage * kGroup + (q * CHUNKS + c) * kWarp + lane,
                     in ? dense + row * n_cols + col0 + j : dense, in ? 16 : 0);
        }
        if (++tile == tiles) { tile = 0; ++row; }
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(g0 + s * step, s);
  const unsigned below = (1u << lane) - 1u;
  long long over = 0;  // entries past the slots in this warp's groups (the same in every lane)
  int stage = 0;
  for (long long g = g0; g < n_groups; g += step) {
    issue(g + (STAGES - 1) * step, stage == 0 ? STAGES - 1 : stage - 1);
    cp_async_wait<STAGES - 1>();
    __syncwarp();  // every lane's vectors of group g have landed
    const V* const staged_v = ring + stage * kGroup;
    const long long first = g * PAIRS;
    const int n_live = static_cast<int>(min(static_cast<long long>(PAIRS), n_pairs - first));
    int total[PAIRS];
#pragma unroll
    for (int q = 0; q < PAIRS; ++q) {
      int sum = 0;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        const V vec = staged_v[(q * CHUNKS + c) * kWarp + lane];
        unsigned bits = 0;
#pragma unroll
        for (int i = 0; i < VEC; ++i) bits |= static_cast<unsigned>(is_nonzero(vec.v[i])) << i;
        const int n = __popc(bits);
        int before = sum;
#pragma unroll
        for (int b = 0; (1 << b) <= VEC; ++b) {
          const unsigned m = __ballot_sync(kFullMask, (n >> b) & 1);
          before += __popc(m & below) << b;
          sum += __popc(m) << b;
        }
        if (mode == kModeSlots) {
          const long long j = j0 + c * kSpan;
          int rank = before;
          for (unsigned rest = bits; rest != 0u && rank < slots; rest &= rest - 1u, ++rank)
            stage_cols[q * kTile + rank] = static_cast<unsigned short>(j + __ffs(rest) - 1);
        }
      }
      total[q] = sum;
    }
    const auto total_of = [&](int q) {
      int t = total[0];
#pragma unroll
      for (int k = 1; k < PAIRS; ++k) t = k == q ? total[k] : t;
      return t;
    };
#pragma unroll
    for (int q = 0; q < PAIRS; ++q) over += max(total[q] - slots, 0);
    if (lane < n_live) {
      const int t = total_of(lane);
      totals[first + lane] = t;
      if (mode == kModeSlots) counts[first + lane] = min(t, slots);
    }
    if (mode == kModeSlots) {
      __syncwarp();  // stage_cols written by every lane
      const T* const staged = reinterpret_cast<const T*>(staged_v);
      T* __restrict__ out_data = data + first * slots;
      unsigned short* __restrict__ out_indices = indices + first * slots;
      for (int e = lane; e < n_live * slots; e += kWarp) {
        const int q = e / slots, s = e - q * slots;
        T value = Value<T>::zero();
        unsigned short col = 0;
        if (s < total_of(q)) {
          col = stage_cols[q * kTile + s];
          value = staged[q * kTile + col];
        }
        out_data[e] = value;
        out_indices[e] = col;
      }
    }
    __syncwarp();  // done with the stage (refilled next iteration) and stage_cols
    stage = stage == STAGES - 1 ? 0 : stage + 1;
  }
  cp_async_wait<0>();  // no copy outlives the block (the pending groups are empty)
  if (mode == kModeSlots && lane == 0 && over > 0)
    atomicAdd(n_overflow, static_cast<unsigned long long>(over));
}

// A read of the matrix and nothing else (the floor of any pack on this card): each thread
// sums its 16-byte vectors (grid-stride, 4 in flight) and writes one word.
extern "C" __global__ void proto_read_only(const uint4* __restrict__ src, long long n_vec,
                                           unsigned* __restrict__ sink) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n_vec; i += 4 * stride) {
    uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
           d.z ^ d.w;
  }
  for (; i < n_vec; i += stride) {
    const uint4 a = src[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
}
