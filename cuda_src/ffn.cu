// ffn.cu: the feed-forward kernels. twell_matmul_pack computes relu(x @ w^T) on tensor cores
// and packs each block of its output into TwELL in the epilogue, so the dense M x N product is
// never written to global memory; twell_spill_to_overflow then moves the entries past the slots
// into the CSR overflow. twell_gated_up (at the end) computes the gated FFN's up projection
// at the gate's entries only; twell_gated_take takes it from a dense up projection instead.
//
// The GEMM (mma.sync m16n8k16, 16-bit inputs, fp32 accumulation; sm_80+):
//   block tile 128 x 256 x 64, 8 warps as 2 x 4, each 64 x 64 (128 fp32 accumulators a thread);
//   a 3-stage cp.async pipeline; shared-memory rows of 64 values (128 bytes) with their eight
//   16-byte chunks XOR-swizzled by row % 8, which makes every ldmatrix phase and every
//   cp.async store touch 8 distinct 16-byte bank groups; rows past M or N and chunks past K
//   are zero-filled by cp.async (K % 8 == 0: a chunk is wholly inside or outside). Each
//   thread always loads the same chunk column of 4 rows of x and 8 rows of w: their pointers
//   and row checks are computed once, not per step.
// The epilogue:
//   each warp rounds relu(acc) once to T and stages it in shared memory (pitch 256 + 8 values:
//   conflict-free fragment stores); then pack_staged_block (matmul_pack.cuh) packs the staged
//   block, each warp kPackRows rows at once: the slots, counts and totals as the dense pack
//   kernel writes them. A pair with more than S non-zeros reserves room for its extra entries
//   in a spill buffer (an integer atomicAdd: where they land varies, what lands does not) and
//   writes them there in column order with their global columns; spill_start[pair] records
//   where. The tile width divides 256 (a pair never spans two blocks) and is at least 8.
// twell_spill_to_overflow copies each pair's spilled run to its place in the overflow (an
// exclusive prefix sum of max(total - S, 0) over pairs): the overflow, like the slots, is the
// same bits on every run. When the spill buffer was too small (spill_used > capacity) the
// launcher reruns the GEMM with a buffer of exactly spill_used entries: nothing is dropped.
// twell_reslot moves a product packed at a provisional slot count to the count chosen from its
// totals (slots="auto": one fused launch, one read of the histogram).
#include "twell_layout.cuh"
#include "mma.cuh"
#include "matmul_pack.cuh"

using namespace twell;

namespace {

using namespace twell::gemm;

constexpr int kStages = 3;
constexpr int kWM = 64, kWN = 64;      // warp tile: 8 warps as 2 along M x 4 along N
constexpr int kMI = kWM / 16, kNI = kWN / 8;  // mma tiles per warp: 4 x 8

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

}  // namespace

// act(x @ w^T) -> TwELL slots, counts, totals and the spill (see the top of the file).
//   x (M, K) and w (N, K) row-major T, K % 8 == 0, 16-byte aligned; tile_width in
//   {8, 16, ..., 256}; counts, totals (M, n_tiles) int; data, indices (M, n_tiles, S);
//   spill_start (M, n_tiles) (written only for pairs with total > S); *spill_used zeroed by the
//   launcher, holds sum over pairs of max(total - S, 0) afterwards; spill_capacity >= 1 (a
//   pair whose run does not fit gets spill_start -1 and writes nothing: the launcher sees
//   *spill_used > spill_capacity and reruns with room for all).
//   zero_fill 0 leaves the slots past each pair's count unwritten: for a caller that reads
//   only the first counts[pair] slots (twell_reslot, after the slots="auto" launch), it saves
//   the writes of every empty slot (most of them at a provisional S of tile_width / 8).
// Grid: ceil(M / 128) * ceil(N / 256) blocks of 256 threads, column blocks varying fastest
// (the blocks running together share x's rows; w stays in L2); dynamic shared memory
// kStages * (kAStage + kBStage) * sizeof(T) bytes.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
twell_matmul_pack(const T* __restrict__ x, const T* __restrict__ w, long long n_rows,
                  long long n_cols, long long depth, int tile_width, int slots, int zero_fill,
                  int* __restrict__ totals, int* __restrict__ counts, T* __restrict__ data,
                  unsigned short* __restrict__ indices, long long* __restrict__ spill_start,
                  int* __restrict__ spill_indices, T* __restrict__ spill_data,
                  long long spill_capacity, unsigned long long* __restrict__ spill_used) {
  static_assert(sizeof(T) == 2, "16-bit inputs");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const smem = reinterpret_cast<T*>(smem_raw);
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int wm = warp / (kBN / kWN), wn = warp % (kBN / kWN);
  const long long col_blocks = (n_cols + kBN - 1) / kBN;
  const long long m0 = static_cast<long long>(blockIdx.x) / col_blocks * kBM;
  const long long n0 = static_cast<long long>(blockIdx.x) % col_blocks * kBN;
  const int k_tiles = static_cast<int>((depth + kBK - 1) / kBK);

  const TileLoader<T> loader(x, w, n_rows, n_cols, depth, m0, n0, tid);
  auto load_stage = [&](int stage, int kt) { loader.load(smem + stage * (kAStage + kBStage), kt); };

  float acc[kMI][kNI][4];
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();  // empty groups too: the wait below counts groups
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();  // stage kt has landed (for this thread) ...
    __syncthreads();               // ... for every thread; and stage kt - 1 is consumed
    if (kt + kStages - 1 < k_tiles) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();
    const T* const a_s = smem + (kt % kStages) * (kAStage + kBStage);
    const T* const b_s = a_s + kAStage;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      unsigned a[kMI][4], b[kNI][2];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {
        // Matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15): lane l gives row l % 16, chunk l / 16.
        const int row = wm * kWM + mi * 16 + lane % 16;
        ldmatrix_x4(a[mi], a_s + swizzle(row, kk * 2 + lane / 16));
      }
#pragma unroll
      for (int nj = 0; nj < kNI / 2; ++nj) {
        // Matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
        const int q = lane / 8;
        const int row = wn * kWN + nj * 16 + (q / 2) * 8 + lane % 8;
        unsigned r[4];
        ldmatrix_x4(r, b_s + swizzle(row, kk * 2 + q % 2));
        b[2 * nj][0] = r[0];
        b[2 * nj][1] = r[1];
        b[2 * nj + 1][0] = r[2];
        b[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) Mma<T>::run(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the staging tile

  // Stage act(acc), rounded once to T: accumulator (i, j) of mma tile (mi, ni) is row
  // mi * 16 + lane / 4 + 8 * (i / 2), column ni * 8 + 2 * (lane % 4) + i % 2.
  T* const stage = smem;
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wm * kWM + mi * 16 + lane / 4 + 8 * h;
        const int col = wn * kWN + ni * 8 + 2 * (lane % 4);
        *reinterpret_cast<unsigned*>(stage + row * kPitch + col) =
            Mma<T>::pack2(relu(acc[mi][ni][2 * h]), relu(acc[mi][ni][2 * h + 1]));
      }
  __syncthreads();

  pack_staged_block<T, kBM, kBN, kPitch, kThreads / kWarp>(
      stage, m0, n0, n_rows, n_cols, tile_width, slots, totals, counts, data, indices,
      spill_start, spill_indices, spill_data, spill_capacity, spill_used, warp, lane,
      zero_fill != 0);
}

// Spilled runs -> overflow: pair p's max(totals[p] - S, 0) entries move from spill_start[p] to
// overflow_offset[p]. One warp per 32 consecutive pairs (lane l reads totals[first + l]); the
// warp copies the runs of its overflowing pairs one after the other, lanes striding a run.
// The overflow arrays hold `capacity` entries: places at or past it are not written, and a
// pair whose run did not fit the spill buffer (spill_start -1) writes zeros at column 0 in its
// places. Both happen only in the layer's pack without a host synchronisation, whose rows that
// lost entries so are recomputed by twell_ffn_fixup; the launcher that reads the counter first
// passes capacity = the overflow's size and never a lost run.
// Grid: ceil(ceil(M * n_tiles / 32) / warps per block) blocks of whole warps.
template <typename T>
__global__ void twell_spill_to_overflow(const int* __restrict__ totals, long long n_pairs,
                                        int slots, const long long* __restrict__ spill_start,
                                        const int* __restrict__ spill_indices,
                                        const T* __restrict__ spill_data,
                                        const long long* __restrict__ overflow_offset,
                                        long long capacity, int* __restrict__ overflow_indices,
                                        T* __restrict__ overflow_data) {
  const long long first =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp * kWarp;
  const int lane = threadIdx.x % kWarp;
  if (first >= n_pairs) return;  // whole warp
  const int extra = first + lane < n_pairs ? max(totals[first + lane] - slots, 0) : 0;
  for (unsigned rest = __ballot_sync(kFullMask, extra > 0); rest != 0u; rest &= rest - 1u) {
    const int q = __ffs(rest) - 1;
    const long long pair = first + q;
    const int n = __shfl_sync(kFullMask, extra, q);
    const long long src = spill_start[pair], dst = overflow_offset[pair];
    const int fits = static_cast<int>(max(min(capacity - dst, static_cast<long long>(n)), 0ll));
    for (int j = lane; j < fits; j += kWarp) {
      overflow_indices[dst + j] = src < 0 ? 0 : spill_indices[src + j];
      overflow_data[dst + j] = src < 0 ? Value<T>::zero() : spill_data[src + j];
    }
  }
}

// The fused kernel's output at a provisional slot count S_old (its slots, totals and spill)
// -> S_new slots and the CSR overflow, for slots="auto" chosen from the histogram of the
// product's own totals after one fused launch. Entry r of a pair (its rank in column order,
// r < totals[pair]) is old slot r (r < S_old; index within the tile) or spill entry
// spill_start[pair] + r - S_old (global column), and goes to new slot r (r < S_new) or to
// overflow entry overflow_offset[pair] + r - S_new (an exclusive prefix sum of
// max(total - S_new, 0) over pairs; global column). New slots past the count are zero, as
// every pack writes them. One thread per pair: at 99% a pair holds ~2.5 entries.
// Grid: ceil(M * n_tiles / block) blocks.
template <typename T>
__global__ void twell_reslot(const int* __restrict__ totals, long long n_pairs, long long tiles,
                             int tile_width, int old_slots, const T* __restrict__ old_data,
                             const unsigned short* __restrict__ old_indices,
                             const long long* __restrict__ spill_start,
                             const int* __restrict__ spill_indices,
                             const T* __restrict__ spill_data, int new_slots,
                             int* __restrict__ counts, T* __restrict__ data,
                             unsigned short* __restrict__ indices,
                             const long long* __restrict__ overflow_offset,
                             int* __restrict__ overflow_indices, T* __restrict__ overflow_data) {
  const long long pair = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pair >= n_pairs) return;
  const int total = totals[pair];
  const long long col0 = pair % tiles * tile_width;  // the tile's first column
  // Read only where they were written: spill_start for pairs past S_old, the offsets for
  // pairs past S_new.
  const long long spill = total > old_slots ? spill_start[pair] - old_slots : 0;
  const long long over = total > new_slots ? overflow_offset[pair] - new_slots : 0;
  const T* const from = old_data + pair * old_slots;
  const unsigned short* const from_index = old_indices + pair * old_slots;
  T* const to = data + pair * new_slots;
  unsigned short* const to_index = indices + pair * new_slots;
  for (int r = 0; r < total; ++r) {
    const bool slot = r < old_slots;
    const T v = slot ? from[r] : spill_data[spill + r];
    const int in_tile = slot ? static_cast<int>(from_index[r])
                             : static_cast<int>(spill_indices[spill + r] - col0);
    if (r < new_slots) {
      to[r] = v;
      to_index[r] = static_cast<unsigned short>(in_tile);
    } else {
      overflow_indices[over + r] = static_cast<int>(col0 + in_tile);
      overflow_data[over + r] = v;
    }
  }
  const int used = min(total, new_slots);
  counts[pair] = used;
  for (int s = used; s < new_slots; ++s) {
    to[s] = Value<T>::zero();
    to_index[s] = 0;
  }
}

// One lane's products of the VEC values at d of a and w, added to sum.
template <typename T, int VEC>
__device__ __forceinline__ void add_products(const T* a, long long a_limit,
                                             const T* __restrict__ w, long long depth,
                                             long long d, typename Value<T>::Acc& sum) {
  T u[VEC], v[VEC];
  load_vec<T, VEC>(a, d, a_limit, u);
  load_vec<T, VEC>(w, d, depth, v);
#pragma unroll
  for (int i = 0; i < VEC; ++i) sum += Value<T>::to_acc(u[i]) * Value<T>::to_acc(v[i]);
}

// Dot product of two rows of `depth` values, x's first `staged` values read from shared memory
// (xs) and the rest of both rows from global memory; fp32 (fp64 for double) accumulation:
// lane l takes values l * VEC, l * VEC + 32 * VEC, ...; a butterfly reduction gives every lane
// the same sum, in a fixed order, whichever part of x was staged (staged is 0, depth, or a
// multiple of kWarp * VEC) and however many loads are in flight (UNROLL steps of the staged
// part are unrolled, their loads issued before their products).
template <typename T, int VEC, int UNROLL = 4>
__device__ __forceinline__ typename Value<T>::Acc staged_dot(const T* xs, long long staged,
                                                             const T* __restrict__ x,
                                                             const T* __restrict__ w,
                                                             long long depth, int lane) {
  typename Value<T>::Acc sum = 0;
  long long d = static_cast<long long>(lane) * VEC;
#pragma unroll UNROLL
  for (; d < staged; d += kWarp * VEC) add_products<T, VEC>(xs, staged, w, depth, d, sum);
  for (; d < depth; d += kWarp * VEC) add_products<T, VEC>(x, depth, w, depth, d, sum);
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1)
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  return sum;
}

// The dot product of two rows of global memory (staged_dot with nothing staged).
template <typename T, int VEC>
__device__ __forceinline__ typename Value<T>::Acc warp_dot(const T* __restrict__ a,
                                                           const T* __restrict__ b,
                                                           long long depth, int lane) {
  return staged_dot<T, VEC>(nullptr, 0, a, b, depth, lane);
}

// Values of a row of x that twell_gated_up keeps in shared memory: 48 KB, the most a launch
// takes without opting in, and a multiple of kWarp * VEC for every T and VEC.
template <typename T>
constexpr long long kGatedStaged = 49152 / sizeof(T);

// Loads of w_up a lane keeps in flight per entry in twell_gated_up: eight 16-byte loads, a
// whole 2048-value bfloat16 row of w_up across the warp in one round trip.
constexpr int kGatedUnroll = 8;

// The gated FFN's hidden activations at the gate's entries: out = gate * (x[row] . w_up[col]),
// rounded once to T, in the gate's storage (same counts, indices and overflow structure; the
// slots past a count are written as zeros). x (M, D), w_up (H, D) row-major; VEC > 1 needs D
// and both base pointers 16-byte aligned.
// A block takes one row: it stages x[row] (up to kGatedStaged values) in shared memory once,
// and its threads write zeros to the row's empty slots. Its warps then take the row's entries
// in turn, numbered across its tiles by a prefix sum of the counts of 32 tiles at a time (a
// warp never visits an empty slot: at 13 slots and 1% non-zero a row has 286 slots and 56
// entries), then its overflow entries (overflow_indptr[row] .. overflow_indptr[row + 1],
// within n_over: the overflow arrays may be longer than the entries they hold, the layer's
// capacity-sized overflow). The grid is the rows whatever the overflow's capacity: a warp per
// place of it, most of them idle, cost the layer without a sync 0.1 ms at 99.9%
// (docs/design.rst). Each product is one warp's dot product, summed in warp_dot's order
// whatever is staged or unrolled: deterministic.
// Grid: M blocks; dynamic shared memory min(D, kGatedStaged<T>) * sizeof(T) bytes.
template <typename T, int VEC>
__global__ void twell_gated_up(const int* __restrict__ counts, const T* __restrict__ gate,
                               const unsigned short* __restrict__ indices,
                               const long long* __restrict__ overflow_indptr,
                               const int* __restrict__ overflow_indices,
                               const T* __restrict__ overflow_gate, long long n_rows,
                               long long n_cols, int tile_width, int slots, long long n_over,
                               const T* __restrict__ x, const T* __restrict__ w_up,
                               long long depth, T* __restrict__ out,
                               T* __restrict__ overflow_out) {
  extern __shared__ __align__(16) unsigned char gated_smem[];
  T* const xs = reinterpret_cast<T*>(gated_smem);
  const long long row = blockIdx.x;
  const T* const x_row = x + row * depth;
  const long long staged = depth < kGatedStaged<T> ? depth : kGatedStaged<T>;
  for (long long d = static_cast<long long>(threadIdx.x) * VEC; d < staged;
       d += static_cast<long long>(blockDim.x) * VEC) {
    T v[VEC];
    load_vec<T, VEC>(x_row, d, staged, v);
    store_vec<T, VEC>(xs, d, v);
  }
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long first = row * tiles * slots;  // the row's first slot
  const int* const row_counts = counts + row * tiles;
  for (long long p = threadIdx.x; p < tiles * slots; p += blockDim.x) {
    const long long tile = p / slots;
    if (p - tile * slots >= row_counts[tile]) out[first + p] = Value<T>::zero();
  }
  __syncthreads();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  for (long long window = 0; window < tiles; window += kWarp) {  // whole warp
    // Lane i: its tile's count, and `through`, the entries of tiles window .. window + i.
    const int count = window + lane < tiles ? row_counts[window + lane] : 0;
    const int through = warp_inclusive_scan(count, lane);
    const int entries = __shfl_sync(kFullMask, through, kWarp - 1);
    for (int q = warp; q < entries; q += warps) {
      const int owner = __popc(__ballot_sync(kFullMask, through <= q));  // q's tile in window
      const int before = __shfl_sync(kFullMask, through - count, owner);
      const long long tile = window + owner;
      const long long at = first + tile * slots + (q - before);
      const long long col = tile * tile_width + indices[at];
      const auto up = staged_dot<T, VEC, kGatedUnroll>(xs, staged, x_row, w_up + col * depth,
                                                       depth, lane);
      if (lane == 0) out[at] = Value<T>::from_acc(Value<T>::to_acc(gate[at]) * up);
    }
  }
  const long long begin = min(overflow_indptr[row], n_over);
  const long long end = min(overflow_indptr[row + 1], n_over);
  for (long long e = begin + warp; e < end; e += warps) {
    const long long col = overflow_indices[e];
    const auto up = staged_dot<T, VEC, kGatedUnroll>(xs, staged, x_row, w_up + col * depth,
                                                     depth, lane);
    if (lane == 0) overflow_out[e] = Value<T>::from_acc(Value<T>::to_acc(overflow_gate[e]) * up);
  }
}

// The gated FFN's hidden activations from a dense up projection: out = gate * up[row, col] at
// each of the gate's entries, rounded once to T, in the gate's storage (the slots past a count
// written as zeros). up (M, H) float32 row-major holds x @ w_up^T (cuBLAS, fp32 accumulation
// and output): where the gate is dense enough, computing it all on tensor cores beats
// twell_gated_up's dot product per entry (the launcher's cost model).
// Threads 0 .. M * n_tiles * S - 1 take one slot each; the next n_over one overflow entry each
// (its row by binary search in overflow_indptr), up to overflow_indptr[M] (as twell_gated_up).
// Grid: ceil((M * n_tiles * S + n_over) / block) blocks.
template <typename T>
__global__ void twell_gated_take(const int* __restrict__ counts, const T* __restrict__ gate,
                                 const unsigned short* __restrict__ indices,
                                 const long long* __restrict__ overflow_indptr,
                                 const int* __restrict__ overflow_indices,
                                 const T* __restrict__ overflow_gate, long long n_rows,
                                 long long n_cols, int tile_width, int slots, long long n_over,
                                 const float* __restrict__ up, T* __restrict__ out,
                                 T* __restrict__ overflow_out) {
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long n_slots = n_rows * tiles * slots;
  const long long at = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (at < n_slots) {
    const long long pair = at / slots;
    T h = Value<T>::zero();
    if (at - pair * slots < counts[pair]) {
      const long long row = pair / tiles;
      const long long col = (pair - row * tiles) * tile_width + indices[at];
      h = Value<T>::from_acc(Value<T>::to_acc(gate[at]) * up[row * n_cols + col]);
    }
    out[at] = h;
  } else if (at - n_slots < n_over && at - n_slots < overflow_indptr[n_rows]) {
    const long long e = at - n_slots;
    const long long row = row_of(overflow_indptr, n_rows, e);
    overflow_out[e] = Value<T>::from_acc(Value<T>::to_acc(overflow_gate[e]) *
                                         up[row * n_cols + overflow_indices[e]]);
  }
}

// The rows of a feed-forward layer whose pack lost entries, recomputed whole. The layer's pack
// without a host synchronisation (the launcher's matmul_pack_bounded) keeps its overflow in
// buffers of a fixed capacity; a product that overflows more than that loses entries: the runs
// of pairs that found the spill buffer full (spill_start -1) and the overflow places at or past
// the capacity. The rows that hold them get a wrong down projection from the SpMM. Which runs
// found the buffer full depends on the order of the fused GEMM's atomic claims, so that this
// kernel, launched after the SpMM, recomputes every row with entries past its slots once
// anything was lost: a set that depends on the product alone, so that the layer's bits do too
// (the recomputed rows' bits are this kernel's, not the SpMM's). It writes their outputs from
// the layer's definition: h[j] = relu(x[row] . w_gate[j]) rounded to T (the fused GEMM's
// rounding), times x[row] . w_up[j] in float32, rounded once to T (twell_gated_up's; without
// the gate, h[j] = relu(x[row] . w_up[j]) rounded), then y[row, i] = sum_j h[j] * w_down[i, j]
// in float32, rounded once. The dot products of h are one warp's each (warp_dot), the sums over
// j one thread's, in a fixed order: deterministic.
// When nothing was lost (*spill_used <= capacity: the spilled entries all fit, so their
// overflow places do too; the counter sums every pair's request, whatever fitted) every block
// returns after one read.
// totals (M, tiles) and spill_used: the fused GEMM's. x (M, D), w_gate and w_up (H, D),
// w_down_t (H, D: w_down transposed, as the SpMM reads it), y (M, D) row-major; scratch:
// gridDim.x * H floats.
// Grid: any number of blocks (a block takes rows blockIdx.x, + gridDim.x, ...), 256 threads.
template <typename T, int VEC>
__global__ void twell_ffn_fixup(const int* __restrict__ totals,
                                const unsigned long long* __restrict__ spill_used,
                                long long n_rows, long long tiles, int slots, long long capacity,
                                int gated, const T* __restrict__ x, const T* __restrict__ w_gate,
                                const T* __restrict__ w_up, const T* __restrict__ w_down_t,
                                long long depth, long long hidden, float* __restrict__ scratch,
                                T* __restrict__ y) {
  if (*spill_used <= static_cast<unsigned long long>(capacity)) return;  // nothing lost
  __shared__ int lost;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  float* __restrict__ h = scratch + static_cast<long long>(blockIdx.x) * hidden;
  const T* __restrict__ first = gated ? w_gate : w_up;
  for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
    if (threadIdx.x == 0) lost = 0;
    __syncthreads();
    for (long long t = threadIdx.x; t < tiles; t += blockDim.x)
      if (totals[row * tiles + t] > slots) lost = 1;  // every writer writes 1
    __syncthreads();
    if (lost) {
      const T* __restrict__ xr = x + row * depth;
      for (long long j = warp; j < hidden; j += warps) {
        const float a = warp_dot<T, VEC>(xr, first + j * depth, depth, lane);
        float v = Value<T>::to_acc(Value<T>::from_acc(a < 0.0f ? 0.0f : a));
        if (gated) {
          const float u = warp_dot<T, VEC>(xr, w_up + j * depth, depth, lane);
          v = Value<T>::to_acc(Value<T>::from_acc(v * u));
        }
        if (lane == 0) h[j] = v;
      }
      __syncthreads();
      for (long long i = threadIdx.x; i < depth; i += blockDim.x) {
        float acc = 0.0f;  // in the order of j; the block's threads read a row of w_down_t
        for (long long j = 0; j < hidden; ++j)
          acc += h[j] * Value<T>::to_acc(w_down_t[j * depth + i]);
        y[row * depth + i] = Value<T>::from_acc(acc);
      }
    }
    __syncthreads();  // lost and h are rewritten for the next row
  }
}
