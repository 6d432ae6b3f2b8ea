// spmm.cu: Y = A @ B and y = A @ x for a TwELL matrix A (M, K) and dense row-major B (K, N).
//
// Accumulation in fp32 (fp64 for double), in a fixed order (tiles, then slots, then the
// row's overflow entries): results are deterministic, no atomics.
#include "twell_layout.cuh"

using namespace twell;

// SpMM, the gather kernel. A team of G lanes per (row, block of output columns), 32 / G = P
// teams (rows) per warp: the team walks its row's entries and, for each, reads the B row it
// names and adds value * B row into its accumulators.
//   Entries: the team reads the counts of G tiles at once (one coalesced read) and their
//   slots G entries at a time, one per lane, whatever tile each comes from (a prefix sum of
//   the counts and a search by shuffles give a lane its tile): a row with one or two entries
//   per tile, as wide scientific matrices have, fills the team as a row with many does. Then
//   the row's overflow entries, G at a time. Entries are broadcast from their lane by
//   shuffles within the team (value in Acc, global column).
//   Columns: lane g of the team owns VEC consecutive columns per chunk (16-byte loads of the
//   B row) in C chunks of G * VEC columns. Per step a lane issues E * C independent loads: E
//   consecutive entries (one per accumulator set) times C chunks. A wide B takes G = 32 and
//   C = 4 (one entry per step); a narrow one (N of 64 float32 values is one 256-byte row)
//   takes fewer lanes per row, more rows per warp and more entries per step, so that short
//   rows are not read one dependent load after another by a whole warp each; for a layout of
//   short rows (a stencil) the team is as narrow as N allows and C takes the loads instead:
//   four teams per warp in lock step. The launcher picks (G, C, E) from N and the layout's
//   array shapes (_policy.rows_shape, short_rows); C * E = kChunks.
//   Order: entry e of each batch of G goes to accumulator set e % E, and the sets are summed
//   in order at the end: results are deterministic and do not depend on VEC (the shape comes
//   from N and the layout, and a VEC = 1 instance sums like the vector one). E = 1 (as for N
//   > 64 16-byte vectors) is the plain order: tiles, then slots, then the overflow.
//   Long overflows are split (split_row, below).
// Measured (docs/design.rst, the gather SpMM): kChunks = 4 chunks of one entry beat one
// 256-column chunk with 4 entries in flight at 99% on the paper's down projection; one warp
// per block at most kRowsMaxRegisters registers per thread (__maxnreg__, CUDA >= 12.4; older
// compilers choose freely) beat 256-thread blocks; several entries per step keep the long
// rows of a power-law graph from being read one dependent load after another.
// `gate` points to true unless cuBLAS computes the product (the launcher's dense way).
// Grid: (ceil(M / P), ceil(N / (C * G * VEC))), blocks of kWarp threads.
constexpr int kChunks = 4;
constexpr int kRowsMaxRegisters = 80;
// Narrow teams with column chunks of 16-bit or float64 vectors (the shapes for short rows)
// spilled 32-150 bytes of accumulators at kRowsMaxRegisters, and so did the Listed instances
// of narrow 16-bit teams with 4 entries in flight (104 bytes).
template <typename T, int VEC, int G, int C, bool Listed>
constexpr int rows_max_registers() {
  return sizeof(T) != 4 && VEC > 1 && G < kWarp && (C > 1 || Listed) ? 96 : kRowsMaxRegisters;
}
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4)
#define TWELL_ROWS_MAXNREG __maxnreg__((rows_max_registers<T, VEC, G, C, Listed>()))
#else
#define TWELL_ROWS_MAXNREG
#endif

// The lanes of a team of G: team t is lanes t * G .. t * G + G - 1. Shuffles within a team
// name its lanes alone (and width G), so teams on rows of different lengths never wait for
// each other.
template <int G> struct Team {
  int lane;       // within the team
  int index;      // of the team in its warp
  unsigned mask;  // the team's lanes
  __device__ explicit Team(int warp_lane)
      : lane(warp_lane % G), index(warp_lane / G),
        mask(G == kWarp ? kFullMask : ((1u << G) - 1u) << (warp_lane / G * G)) {}
  template <typename V> __device__ V shfl(V v, int src) const {
    return __shfl_sync(mask, v, src, G);
  }
  __device__ int inclusive_scan(int x) const {
#pragma unroll
    for (int offset = 1; offset < G; offset <<= 1) {
      const int y = __shfl_up_sync(mask, x, offset, G);
      if (lane >= offset) x += y;
    }
    return x;
  }
  __device__ bool any(bool p) const { return __any_sync(mask, p); }
  // The sum over the team's lanes by a fixed butterfly (the same bits on every lane).
  template <typename V> __device__ V sum(V v) const {
#pragma unroll
    for (int offset = G / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset, G);
    return v;
  }
};

// An entry held by one lane, broadcast within its team: its value (as Acc) and column in A.
template <typename T> struct Entry {
  using Acc = typename Value<T>::Acc;
  Acc value = Acc(0);
  int column = 0;
  Entry() = default;
  __device__ Entry(T v, long long c) : value(Value<T>::to_acc(v)), column(static_cast<int>(c)) {}
};

// acc[e % E] += the entries e < len held one per team lane by `entry` (every lane of the team
// calls it: it shuffles); n0: this lane's first column.
template <typename T, int VEC, int G, int C, int E>
__device__ __forceinline__ void gather_batch(const Team<G>& team, int len, const Entry<T>& entry,
                                             const T* __restrict__ b, long long n, long long n0,
                                             typename Value<T>::Acc (&acc)[E][C][VEC]) {
  constexpr int kSpan = G * VEC;
  for (int e0 = 0; e0 < len; e0 += E) {  // e0 + E <= G: E divides G
    typename Value<T>::Acc v[E];
    int c[E];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      v[k] = team.shfl(entry.value, e0 + k);
      c[k] = team.shfl(entry.column, e0 + k);
    }
    T bv[E][C][VEC];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const long long limit = e0 + k < len ? n : 0;  // 0: nothing read
#pragma unroll
      for (int cc = 0; cc < C; ++cc)
        load_vec<T, VEC>(b + static_cast<long long>(c[k]) * n, n0 + cc * kSpan, limit,
                         bv[k][cc]);
    }
#pragma unroll
    for (int k = 0; k < E; ++k) {
      if (e0 + k < len) {
#pragma unroll
        for (int cc = 0; cc < C; ++cc) {
          // Columns past n are skipped, not multiplied by zero padding: 0 * Inf would be NaN.
          if (n0 + cc * kSpan < n) {
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc[k][cc][i] += v[k] * Value<T>::to_acc(bv[k][cc][i]);
          }
        }
      }
    }
  }
}

// Windows of G tiles whose counts a team reads at once (independent loads) before it walks
// their entries: a wide layout's row (245 tiles at tile width 4096 for 10^6 columns) was
// bound by one dependent count read per G tiles, most of them of empty tiles.
constexpr int kCountWindows = 4;

// A tile number in no window (past any row's tiles): lanes past the end of a row's list.
constexpr int kNoTile = 0x7fffffff;

// f(entry, len) for each batch of one window's slot entries: lane l of the team holds the
// count of tile tile_of(l) (0 past the window's tiles), in tile order; entries j < len <= G
// of a batch, entry j held by team lane j (every lane of the team calls it, and f may
// shuffle; tile_of may too). Index: the type of a column within a tile (unsigned short, or int
// for tiles wider than 65536 columns), here and in the kernels below.
template <typename T, int G, typename TileOf, typename F, typename Index>
__device__ __forceinline__ void window_batches(const Team<G>& team, int my_count, TileOf tile_of,
                                               const T* __restrict__ data,
                                               const Index* __restrict__ indices,
                                               long long row, long long tiles, int tile_width,
                                               int slots, F& f) {
  const int inclusive = team.inclusive_scan(my_count);
  const int total = team.shfl(inclusive, G - 1);  // <= G * slots
  for (int j0 = 0; j0 < total; j0 += G) {
    const int j = j0 + team.lane;
    // Entry j of the window is in the tile of lane l: l tiles end at or before it.
    int l = 0;
#pragma unroll
    for (int step = G / 2; step > 0; step >>= 1)
      l += team.shfl(inclusive, l + step - 1) <= j ? step : 0;
    const int first = team.shfl(inclusive - my_count, l);
    const long long tile = tile_of(l);
    Entry<T> entry;
    if (j < total) {
      const long long s = (row * tiles + tile) * slots + (j - first);
      entry = Entry<T>(data[s], tile * tile_width + indices[s]);
    }
    f(entry, min(G, total - j0));
  }
}

// f(entry, len) for each batch of a row's slot entries, its tiles read from the tile index
// (list_tiles[start, end)): G listed tiles (and their counts) at a time, each window of G
// tiles among them walked whole, as for_each_slot_batch walks it. The last window of a load
// may go on past it: the next load starts at that window, unless it fills the load (a window
// has at most G tiles).
template <typename T, int G, typename F, typename Index>
__device__ __forceinline__ void for_each_listed_batch(const Team<G>& team,
                                                      const int* __restrict__ row_counts,
                                                      const T* __restrict__ data,
                                                      const Index* __restrict__ indices,
                                                      long long row, long long tiles,
                                                      int tile_width, int slots,
                                                      const int* __restrict__ list_tiles,
                                                      long long start, long long end, F& f) {
  for (long long q = start; q < end;) {
    const bool listed = q + team.lane < end;
    const int my_tile = listed ? list_tiles[q + team.lane] : kNoTile;
    const int loaded_count = listed ? row_counts[my_tile] : 0;
    const int loaded = static_cast<int>(min(static_cast<long long>(G), end - q));
    const bool more = end - q > G;
    const int last_window = team.shfl(my_tile, G - 1) / G;
    int done = 0;
    while (done < loaded) {
      const int window = team.shfl(my_tile, done) / G;
      if (more && done > 0 && window == last_window) break;
      const bool mine = team.lane >= done && my_tile / G == window;
      window_batches<T, G>(team, mine ? loaded_count : 0,
                           [&](int l) { return static_cast<long long>(team.shfl(my_tile, l)); },
                           data, indices, row, tiles, tile_width, slots, f);
      done += __popc(__ballot_sync(team.mask, mine) & team.mask);
    }
    q += done;
  }
}

// f(entry, len) for each batch of the row's slot entries, in order (tiles, then slots):
// entries j < len <= G of a batch, entry j held by team lane j (every lane of the team calls
// it, and f may shuffle). The row's tiles are cut into windows of G (tiles w * G ..
// w * G + G - 1), and each window's entries into batches of their own, so the batches, and
// the order of sums that follows from them, depend on the layout alone: not on
// kCountWindows, and not on whether the row's tiles come from the counts (Listed = false:
// a window of empty tiles costs one read and one vote) or from the tile index (Listed: the
// row's non-empty tiles, list_tiles[list_indptr[row] .. list_indptr[row + 1]), ascending;
// TwELLMatrix.index_tiles), which give the same bits.
template <typename T, int G, bool Listed, typename F, typename Index>
__device__ __forceinline__ void for_each_slot_batch(const Team<G>& team,
                                                    const int* __restrict__ counts,
                                                    const T* __restrict__ data,
                                                    const Index* __restrict__ indices,
                                                    long long row, long long tiles,
                                                    int tile_width, int slots,
                                                    const long long* __restrict__ list_indptr,
                                                    const int* __restrict__ list_tiles, F&& f) {
  const int* row_counts = counts + row * tiles;
  if constexpr (Listed) {
    for_each_listed_batch<T, G>(team, row_counts, data, indices, row, tiles, tile_width, slots,
                                list_tiles, list_indptr[row], list_indptr[row + 1], f);
    return;
  }
  if (tiles <= G) {
    // One window (the paper's activations at tile width 256, a 10^6-column matrix at 65536):
    // no other windows' counts to read ahead and vote on, which would cost such layouts
    // about 13% more instructions (ncu). The same batches.
    const int my_count = team.lane < tiles ? row_counts[team.lane] : 0;
    if (team.any(my_count != 0))
      window_batches<T, G>(team, my_count, [](int l) { return static_cast<long long>(l); }, data,
                           indices, row, tiles, tile_width, slots, f);
    return;
  }
  for (long long t0 = 0; t0 < tiles; t0 += kCountWindows * G) {
    int my_count = t0 + team.lane < tiles ? row_counts[t0 + team.lane] : 0;  // window 0
    int ahead[kCountWindows - 1];  // the other windows' counts, for the votes only
#pragma unroll
    for (int w = 1; w < kCountWindows; ++w) {
      const long long t = t0 + w * G + team.lane;
      ahead[w - 1] = t < tiles ? row_counts[t] : 0;
    }
    unsigned nonempty = team.any(my_count != 0) ? 1u : 0u;  // bit w: window w holds entries
#pragma unroll
    for (int w = 1; w < kCountWindows; ++w)
      nonempty |= team.any(ahead[w - 1] != 0) ? 1u << w : 0u;
    for (; nonempty != 0; nonempty &= nonempty - 1) {
      const int w = __ffs(nonempty) - 1;
      if (w > 0) {
        // Read again (from L1) rather than kept: kCountWindows live counts spilled the
        // accumulators of the 16-bit kernels. Window 0's (the only one of a row of at most
        // G tiles) is kept.
        const long long t = t0 + w * G + team.lane;
        my_count = t < tiles ? row_counts[t] : 0;
      }
      const long long tw = t0 + w * G;
      window_batches<T, G>(team, my_count, [&](int l) { return tw + l; }, data, indices, row,
                           tiles, tile_width, slots, f);
    }
  }
}

// acc += the overflow entries j0 <= j < j1, G at a time (every lane of the team calls it).
template <typename T, int VEC, int G, int C, int E>
__device__ __forceinline__ void gather_overflow(const Team<G>& team, long long j0, long long j1,
                                                const int* __restrict__ overflow_indices,
                                                const T* __restrict__ overflow_data,
                                                const T* __restrict__ b, long long n,
                                                long long n0,
                                                typename Value<T>::Acc (&acc)[E][C][VEC]) {
  for (; j0 < j1; j0 += G) {
    const long long j = j0 + team.lane;
    Entry<T> entry;
    if (j < j1) entry = Entry<T>(overflow_data[j], overflow_indices[j]);
    gather_batch<T, VEC, G, C, E>(team, static_cast<int>(min(static_cast<long long>(G), j1 - j0)),
                                  entry, b, n, n0, acc);
  }
}

// The E accumulator sets of each column summed into acc[0], in order.
template <typename Acc, int VEC, int C, int E>
__device__ __forceinline__ void combine_sets(Acc (&acc)[E][C][VEC]) {
#pragma unroll
  for (int cc = 0; cc < C; ++cc) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
#pragma unroll
      for (int k = 1; k < E; ++k) acc[0][cc][i] += acc[k][cc][i];
    }
  }
}

template <typename Acc, int VEC, int C, int E>
__device__ __forceinline__ void zero_sets(Acc (&acc)[E][C][VEC]) {
#pragma unroll
  for (int k = 0; k < E; ++k) {
#pragma unroll
    for (int cc = 0; cc < C; ++cc) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[k][cc][i] = Acc(0);
    }
  }
}

// A row's overflow is split when it holds at least 2 * chunk entries (chunk = 2^chunk_log2,
// chunk_log2 > 0): the overflow array is cut into chunks of `chunk` entries, and
// twell_spmm_overflow_chunks sums each chunk's part of a split row, one team per chunk, into
// partial[2 * c + slot] (Acc, n values; slot 1 for the row that starts inside chunk c, slot
// 0 for the one that started at or before its first entry: no other row touching a chunk
// can be split); the row's team adds the parts in chunk order after its slots. Both kernels
// decide with this one test; chunk_log2 is a shift because a 64-bit division spilled the
// accumulators. A power-law graph's row of ~8500 entries kept one warp ~1 ms (H200).
__device__ __forceinline__ bool split_row(long long o_start, long long o_end, int chunk_log2) {
  return chunk_log2 > 0 && o_end - o_start >= (2ll << chunk_log2);
}

// part(slot, j0, j1) for each split row's part of the overflow's chunk c (entries j0 <= j <
// j1 of the overflow): slot 0 for the row holding the chunk's first entry, slot 1 for the one
// holding its last when that is another row (rows between them are shorter than the chunk,
// so not split). Nothing for a chunk past the overflow. twell_spmm_overflow_chunks sums each
// part into partial[2 * c + slot].
template <typename Part>
__device__ __forceinline__ void for_each_split_part(const long long* __restrict__ overflow_indptr,
                                                    long long n_rows, long long c,
                                                    int chunk_log2, Part part) {
  const long long n_over = overflow_indptr[n_rows];
  const long long c0 = c << chunk_log2;
  if (c0 >= n_over) return;
  const long long c1 = min(c0 + (1ll << chunk_log2), n_over);
  const long long first_row = row_of(overflow_indptr, n_rows, c0);
  const long long last_row = row_of(overflow_indptr, n_rows, c1 - 1);
#pragma unroll 1
  for (int slot = 0; slot < 2; ++slot) {
    const long long row = slot == 0 ? first_row : last_row;
    const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
    if ((slot == 1 && row == first_row) || !split_row(o_start, o_end, chunk_log2)) continue;
    part(slot, max(c0, o_start), min(c1, o_end));
  }
}

template <typename T, int VEC, int G, int C, int E, bool Listed = false,
          typename Index = unsigned short>
__global__ void TWELL_ROWS_MAXNREG
twell_spmm_rows(const int* __restrict__ counts, const T* __restrict__ data,
                const Index* __restrict__ indices,
                const long long* __restrict__ overflow_indptr,
                const int* __restrict__ overflow_indices, const T* __restrict__ overflow_data,
                long long n_rows, long long n_cols, int tile_width, int slots,
                const long long* __restrict__ list_indptr, const int* __restrict__ list_tiles,
                const T* __restrict__ b, long long n, const bool* __restrict__ gate,
                const typename Value<T>::Acc* __restrict__ partial, int chunk_log2,
                T* __restrict__ out) {
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "VEC is 1 or one 16-byte vector");
  static_assert(G == 8 || G == 16 || G == 32, "G lanes per row: 8, 16 or 32");
  static_assert(C * E == kChunks && G % E == 0, "C chunks of E entries: kChunks loads per step");
  using Acc = typename Value<T>::Acc;
  constexpr int kSpan = G * VEC;
  if (!*gate) return;  // another kernel computes this product
  const Team<G> team(threadIdx.x % kWarp);
  const long long tiles = n_tiles(n_cols, tile_width);
  const long long row = static_cast<long long>(blockIdx.x) * (kWarp / G) + team.index;
  if (row >= n_rows) return;  // the whole team
  const long long n0 = (static_cast<long long>(blockIdx.y) * C * G + team.lane) * VEC;
  Acc acc[E][C][VEC];
  zero_sets<Acc, VEC, C, E>(acc);

  // Read before the slots, so that their latency overlaps the counts'.
  const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
  for_each_slot_batch<T, G, Listed>(team, counts, data, indices, row, tiles, tile_width, slots,
                                    list_indptr, list_tiles,
                                    [&](const Entry<T>& entry, int len) {
                                      gather_batch<T, VEC, G, C, E>(team, len, entry, b, n, n0,
                                                                    acc);
                                    });
  // A split row's overflow comes from `partial`, after the sums of its slots.
  gather_overflow<T, VEC, G, C, E>(team, o_start,
                                   split_row(o_start, o_end, chunk_log2) ? o_start : o_end,
                                   overflow_indices, overflow_data, b, n, n0, acc);
  combine_sets<Acc, VEC, C, E>(acc);
  if (split_row(o_start, o_end, chunk_log2)) {
    for (long long c = o_start >> chunk_log2; (c << chunk_log2) < o_end; ++c) {
      // Slot 1 of chunk c holds the part of a row that starts inside it, slot 0 the rest.
      const Acc* __restrict__ part = partial + (2 * c + ((c << chunk_log2) < o_start)) * n;
#pragma unroll
      for (int cc = 0; cc < C; ++cc) {
        if (n0 + cc * kSpan < n) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[0][cc][i] += part[n0 + cc * kSpan + i];
        }
      }
    }
  }
#pragma unroll
  for (int cc = 0; cc < C; ++cc) {
    const long long j = n0 + cc * kSpan;
    if (j < n) {
      T res[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) res[i] = Value<T>::from_acc(acc[0][cc][i]);
      store_vec<T, VEC>(out + row * n, j, res);
    }
  }
}

// The parts of split rows (split_row) in the overflow's chunk c, one team per chunk, each
// summed with the accumulator sets and order of twell_spmm_rows (same G, C, E; columns on
// grid y) into partial[2 * c + slot]; slots of rows that are not split are left unwritten.
// Few warps run it (no register cap: the cap of twell_spmm_rows spilled here).
// Grid: (ceil(chunks / P), as twell_spmm_rows), kWarp threads.
template <typename T, int VEC, int G, int C, int E>
__global__ void twell_spmm_overflow_chunks(const long long* __restrict__ overflow_indptr,
                           const int* __restrict__ overflow_indices,
                           const T* __restrict__ overflow_data, long long n_rows,
                           const T* __restrict__ b, long long n, const bool* __restrict__ gate,
                           int chunk_log2, typename Value<T>::Acc* __restrict__ partial) {
  using Acc = typename Value<T>::Acc;
  constexpr int kSpan = G * VEC;
  if (!*gate) return;
  const Team<G> team(threadIdx.x % kWarp);
  const long long c = static_cast<long long>(blockIdx.x) * (kWarp / G) + team.index;
  const long long n0 = (static_cast<long long>(blockIdx.y) * C * G + team.lane) * VEC;
  for_each_split_part(overflow_indptr, n_rows, c, chunk_log2,
                      [&](int slot, long long j0, long long j1) {
    Acc acc[E][C][VEC];
    zero_sets<Acc, VEC, C, E>(acc);
    gather_overflow<T, VEC, G, C, E>(team, j0, j1, overflow_indices, overflow_data, b, n, n0,
                                     acc);
    combine_sets<Acc, VEC, C, E>(acc);
    Acc* __restrict__ part = partial + (2 * c + slot) * n;
#pragma unroll
    for (int cc = 0; cc < C; ++cc) {
      if (n0 + cc * kSpan < n) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) part[n0 + cc * kSpan + i] = acc[0][cc][i];
      }
    }
  });
}

// SpMV, y = A @ x: twell_spmv_rows (a team of G lanes per row) for layouts of long rows,
// twell_spmv_thread_rows (a thread per row) for those of short rows; the launcher picks one
// from the layout's shape (_policy.spmv_lanes). Only the thread kernel walks the tile index:
// a team of 32 reads 128 counts a round, and with the index it was slower on the power-law
// graph at tile width 4096 (245 tiles a row, 15 listed), while the thread kernel's 31 rounds
// of 8 counts become one (docs/design.rst, the SpMV).
constexpr int kSpmvLoads = 4;  // entries, and then their x values, a lane reads at once

// acc plus the lane's share of sum_j values[j] * x[column(j)] over j0 <= j < j1: entries
// j0 + lane, j0 + lane + G, ..., Loads of them in flight, added in that order whatever
// Loads is (every lane of the G that share the run, a team, a warp or a block, calls it with
// the same j0 and j1; nothing is shuffled).
template <typename T, int G, typename Column, int Loads = kSpmvLoads>
__device__ __forceinline__ typename Value<T>::Acc dot_run(int lane, long long j0, long long j1,
                                                        const T* __restrict__ values,
                                                        Column column,
                                                        const T* __restrict__ x,
                                                        typename Value<T>::Acc acc = 0) {
  using Acc = typename Value<T>::Acc;
  for (; j0 < j1; j0 += Loads * G) {
    Acc products[Loads];
#pragma unroll
    for (int k = 0; k < Loads; ++k) {
      const long long j = j0 + k * G + lane;
      // Past the run nothing is read or multiplied (0 * Inf would be NaN).
      products[k] = j < j1 ? Value<T>::to_acc(values[j]) * Value<T>::to_acc(x[column(j)])
                           : Acc(0);
    }
#pragma unroll
    for (int k = 0; k < Loads; ++k) acc += products[k];
  }
  return acc;
}

// A team of G lanes per row (32 / G rows per warp): the row's slot entries as
// twell_spmm_rows takes them (for_each_slot_batch), each lane multiplying the entry it
// holds by x at its column, then its overflow entries (dot_run); the lanes' sums are added
// by a fixed butterfly (deterministic).
// Grid: ceil(M / (blockDim.x / G)).
template <typename T, int G, typename Index = unsigned short>
__global__ void twell_spmv_rows(const int* __restrict__ counts, const T* __restrict__ data,
                                const Index* __restrict__ indices,
                                const long long* __restrict__ overflow_indptr,
                                const int* __restrict__ overflow_indices,
                                const T* __restrict__ overflow_data, long long n_rows,
                                long long n_cols, int tile_width, int slots,
                                const T* __restrict__ x, T* __restrict__ y) {
  static_assert(G == 8 || G == 16 || G == 32, "G lanes per row: 8, 16 or 32");
  using Acc = typename Value<T>::Acc;
  const Team<G> team(threadIdx.x % kWarp);
  const long long row =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  if (row >= n_rows) return;  // the whole team
  const long long tiles = n_tiles(n_cols, tile_width);
  // Read before the slots, so that their latency overlaps the counts'.
  const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
  Acc acc = Acc(0);
  for_each_slot_batch<T, G, false>(team, counts, data, indices, row, tiles, tile_width, slots,
                                   nullptr, nullptr, [&](const Entry<T>& entry, int len) {
                              if (team.lane < len)
                                acc += entry.value * Value<T>::to_acc(x[entry.column]);
                            });
  acc += dot_run<T, G>(team.lane, o_start, o_end, overflow_data,
                       [&](long long j) { return overflow_indices[j]; }, x);
  acc = team.sum(acc);
  if (team.lane == 0) y[row] = Value<T>::from_acc(acc);
}

// Threads per block of the one-tile kernels (the launcher's BLOCK).
constexpr int kOneTileBlock = 256;
// y[row] of a hub row (one whose overflow holds at least hub_min entries: a power-law
// graph's few long rows) of a one-tile layout, by a whole block of kOneTileBlock threads:
// they read the row's slots, then its overflow kOneTileBlock * Loads entries a round, and
// add their sums by the warps' butterflies, then the warp sums in warp order
// (deterministic). The one-tile kernels give their first blocks one hub each.
template <typename T, int Loads, typename Index>
__device__ __forceinline__ void spmv_hub_row(
    const int* __restrict__ counts, const T* __restrict__ data, const Index* __restrict__ indices,
    const long long* __restrict__ overflow_indptr, const int* __restrict__ overflow_indices,
    const T* __restrict__ overflow_data, int slots, long long row, const T* __restrict__ x,
    T* __restrict__ y) {
  using Acc = typename Value<T>::Acc;
  const auto over_column = [&](long long j) { return overflow_indices[j]; };
  const long long base = row * slots;
  const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
  const int count = counts[row];
  Acc acc = Acc(0);
  for (int s = threadIdx.x; s < count; s += kOneTileBlock)
    acc += Value<T>::to_acc(data[base + s]) *
           Value<T>::to_acc(x[static_cast<int>(indices[base + s])]);
  acc = dot_run<T, kOneTileBlock, decltype(over_column), Loads>(threadIdx.x, o_start, o_end,
                                                                overflow_data, over_column, x, acc);
  const Team<kWarp> warp(threadIdx.x % kWarp);
  acc = warp.sum(acc);
  __shared__ Acc warp_sums[kOneTileBlock / kWarp];
  if (warp.lane == 0) warp_sums[threadIdx.x / kWarp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    Acc sum = warp_sums[0];
#pragma unroll
    for (int w = 1; w < kOneTileBlock / kWarp; ++w) sum += warp_sums[w];
    y[row] = Value<T>::from_acc(sum);
  }
}

// Blocks per SM the register cap of twell_spmv_one_tile allows: 8 (32 registers, every warp
// slot of the SM) for 4- and 2-byte values; 6 (40 registers) for float64, whose 32-register
// build spills. Uncapped, its teams took 56 (float32) and 94 (float64) registers and ran
// 1.2x-2x slower on the power-law graph (docs/design.rst, the SpMV).
template <typename T> struct OneTileBlocks {
  static constexpr int value = sizeof(typename Value<T>::Acc) == 8 ? 6 : 8;
};

// SpMV of a one-tile layout (tile_width >= K, what tile_width="auto" gives matrices of
// short rows) whose rows have room for few entries (a stencil): a row's slots are
// contiguous, as a CSR row is, so a team of G lanes reads them together (the launcher takes
// G = 1, a thread per row, with Loads = 8), Loads entries per lane and round, and sums by the
// team's butterfly. Overflow = false reads no overflow_indptr (a layout without overflow: 8
// bytes a row less). Rows with room for more entries take twell_spmv_one_tile_warp.
// Hub rows, those whose overflow holds at least hub_min entries (a power-law graph's few
// long rows), are listed in `hubs` and taken by the first n_hubs blocks, a block a row
// (spmv_hub_row), in the same launch; the teams skip those rows. Every y is written once, by
// one block, with no partial sums and no second kernel (a launch of a warp per chunk of 256
// overflow entries, before the rows, costs 25 of the graph's 200 us: docs/design.rst).
// Grid: n_hubs + ceil(M * G / kOneTileBlock), blocks of kOneTileBlock threads.
template <typename T, bool Overflow, int G, int Loads, typename Index = unsigned short>
__global__ void __launch_bounds__(kOneTileBlock, OneTileBlocks<T>::value)
twell_spmv_one_tile(const int* __restrict__ counts, const T* __restrict__ data,
                    const Index* __restrict__ indices,
                    const long long* __restrict__ overflow_indptr,
                    const int* __restrict__ overflow_indices, const T* __restrict__ overflow_data,
                    long long n_rows, int slots, const long long* __restrict__ hubs,
                    long long n_hubs, long long hub_min, const T* __restrict__ x,
                    T* __restrict__ y) {
  static_assert(G == 1 || G == 2 || G == 4 || G == 8 || G == 16 || G == 32, "G divides 32");
  using Acc = typename Value<T>::Acc;
  const auto column = [&](long long j) { return static_cast<int>(indices[j]); };
  const auto over_column = [&](long long j) { return overflow_indices[j]; };
  if constexpr (Overflow) {
    if (blockIdx.x < n_hubs) {  // the whole block: a hub row
      spmv_hub_row<T, Loads>(counts, data, indices, overflow_indptr, overflow_indices,
                             overflow_data, slots, hubs[blockIdx.x], x, y);
      return;
    }
  }
  const Team<G> team(threadIdx.x % kWarp);
  const long long row =
      ((static_cast<long long>(blockIdx.x) - n_hubs) * blockDim.x + threadIdx.x) / G;
  if (row >= n_rows) return;  // the whole team
  long long o_start = 0, o_end = 0;
  if constexpr (Overflow) {
    o_start = overflow_indptr[row];
    o_end = overflow_indptr[row + 1];
    if (o_end - o_start >= hub_min) return;  // the whole team: a hub block's row
  }
  const long long base = row * slots;
  Acc acc = dot_run<T, G, decltype(column), Loads>(team.lane, base, base + counts[row], data,
                                                   column, x);
  if constexpr (Overflow)
    acc += dot_run<T, G, decltype(over_column), Loads>(team.lane, o_start, o_end, overflow_data,
                                                       over_column, x);
  acc = team.sum(acc);
  if (team.lane == 0) y[row] = Value<T>::from_acc(acc);
}

// (batches in flight, blocks per SM) of twell_spmv_one_tile_warp: 2 batches (5 blocks of
// 256 an SM, up to 48 registers) for 4- and 2-byte values, 3 (4 blocks, up to 64 registers)
// for float64.
// Of the shapes measured on the graph and its Laplacian (docs/design.rst, the SpMV) these
// are the fastest; 4 batches cost float64 3% and 6 blocks cost float32 1%.
template <typename T> struct OneTileWarpShape {
  static constexpr bool double_acc = sizeof(typename Value<T>::Acc) == 8;
  static constexpr int batches = double_acc ? 3 : 2;
  static constexpr int blocks = double_acc ? 4 : 5;
};

// SpMV of a one-tile layout whose rows have room for more than a few entries (a graph):
// a warp takes 32 consecutive rows and streams their slots, then their overflow, as two
// contiguous runs, 32 entries an instruction, so that each 128-byte line of the matrix is
// asked of L2 once (a team per row asked for a line once per row and load, and L2's tag
// lookups bound the product: docs/design.rst). Lane l's entry belongs to row rho: the slot
// place over `slots` (a multiply by a 20-bit reciprocal up to 128 slots), the overflow place
// by a binary search of the 32 rows' overflow starts, held one per lane. A batch's products
// are added row by row by a segmented scan over the lanes (a fixed tree), and the last lane
// of each row's segment adds the sum to the row's accumulator in shared memory: batches in
// order, so the same bits on every run. Padding slots (past a row's count) add zeros and
// read no x. Hub rows are the first blocks' (spmv_hub_row); the warps skip their slots and
// their overflow runs. A warp whose overflow spans 2^31 entries or more (a hub of that
// length among its rows) sums each other row's overflow in its own lane instead.
// Grid: n_hubs + ceil(M / kOneTileBlock), blocks of kOneTileBlock threads, 8 warps of 32 rows.
template <typename T, bool Overflow, typename Index = unsigned short>
__global__ void __launch_bounds__(kOneTileBlock, OneTileWarpShape<T>::blocks)
twell_spmv_one_tile_warp(const int* __restrict__ counts, const T* __restrict__ data,
                         const Index* __restrict__ indices,
                         const long long* __restrict__ overflow_indptr,
                         const int* __restrict__ overflow_indices,
                         const T* __restrict__ overflow_data, long long n_rows, int slots,
                         const long long* __restrict__ hubs, long long n_hubs,
                         long long hub_min, const T* __restrict__ x, T* __restrict__ y) {
  using Acc = typename Value<T>::Acc;
  constexpr int U = OneTileWarpShape<T>::batches;
  if constexpr (Overflow) {
    if (blockIdx.x < n_hubs) {  // the whole block: a hub row
      spmv_hub_row<T, 2>(counts, data, indices, overflow_indptr, overflow_indices,
                         overflow_data, slots, hubs[blockIdx.x], x, y);
      return;
    }
  }
  __shared__ Acc row_sums[kOneTileBlock];
  const int lane = threadIdx.x % kWarp;
  Acc* sums = row_sums + threadIdx.x / kWarp * kWarp;
  const long long r0 = ((static_cast<long long>(blockIdx.x) - n_hubs) * (blockDim.x / kWarp)
                        + threadIdx.x / kWarp) * kWarp;
  if (r0 >= n_rows) return;  // the whole warp
  const long long row = r0 + lane;
  const bool in = row < n_rows;
  const int rows_here = static_cast<int>(n_rows - r0 < kWarp ? n_rows - r0 : kWarp);
  int count = in ? counts[row] : 0;
  long long own = 0;  // where the lane's row's overflow starts (the last row's end past M)
  bool hub = false;
  if constexpr (Overflow) {
    own = overflow_indptr[in ? row : n_rows];
    hub = in && overflow_indptr[row + 1] - own >= hub_min;
    if (hub) count = 0;
  }
  sums[lane] = Acc(0);
  __syncwarp();
  // Adds a batch's products (rho: the lane's row in the warp, kWarp for none) to the rows.
  const auto add_batch = [&](Acc v, int rho) {
#pragma unroll
    for (int d = 1; d < kWarp; d <<= 1) {
      const Acc up = __shfl_up_sync(kFullMask, v, d);
      const int rho_up = __shfl_up_sync(kFullMask, rho, d);
      if (lane >= d && rho_up == rho) v += up;
    }
    const int rho_next = __shfl_down_sync(kFullMask, rho, 1);
    if (rho < kWarp && (lane == kWarp - 1 || rho_next != rho)) sums[rho] += v;
    __syncwarp();
  };
  // Streams the places [begin, end) of a run, U batches of 32 at a time: row_of(p) is the
  // row in the warp of place p, entry_at(p, v, c) reads its value and column, counted(p, rho)
  // says whether it holds an entry (every lane calls it: it may shuffle); past `end` or
  // uncounted, nothing is read or multiplied (0 * Inf would be NaN).
  const auto stream = [&](int begin, int end, auto row_of, auto entry_at, auto counted) {
    for (int p0 = begin; p0 < end; p0 += kWarp * U) {
      T v[U];
      int c[U];
      int rho[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = p0 + u * kWarp + lane;
        const int r = row_of(p);
        rho[u] = kWarp;
        if (p < end) {
          entry_at(p, v[u], c[u]);
          rho[u] = r;
        }
      }
      Acc products[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool entry = counted(p0 + u * kWarp + lane, rho[u]);
        products[u] = rho[u] < kWarp && entry
                          ? Value<T>::to_acc(v[u]) * Value<T>::to_acc(x[c[u]])
                          : Acc(0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) add_batch(products[u], rho[u]);
    }
  };
  // The slots: rows_here * slots places from row r0's first; rho = p / slots as
  // (p * reciprocal) >> 20, exact for p < 32 * slots while slots <= 128.
  const long long base = r0 * slots;
  const unsigned reciprocal = slots <= 128 ? ((1u << 20) + slots - 1) / slots : 0u;
  stream(
      0, rows_here * slots,
      [&](int p) {
        return reciprocal ? static_cast<int>((static_cast<unsigned>(p) * reciprocal) >> 20)
                          : p / slots;
      },
      [&](int p, T& v, int& c) {
        v = data[base + p];
        c = static_cast<int>(indices[base + p]);
      },
      [&](int p, int rho) {  // padding slots past the row's count hold no entry
        return p - rho * slots < __shfl_sync(kFullMask, count, rho % kWarp);
      });
  if constexpr (Overflow) {
    const long long first = __shfl_sync(kFullMask, own, 0);
    const long long last = overflow_indptr[r0 + rows_here];
    if (last - first >= 0x7fffffffLL) {  // a hub of 2^31 entries: each row in its lane
      const auto over_column = [&](long long j) { return overflow_indices[j]; };
      if (in && !hub)
        sums[lane] = dot_run<T, 1, decltype(over_column), 2>(
            0, own, overflow_indptr[row + 1], overflow_data, over_column, x, sums[lane]);
    } else {
      // Places relative to the warp's first overflow entry, in 32 bits.
      const T* __restrict__ ov = overflow_data + first;
      const int* __restrict__ oc = overflow_indices + first;
      const int start_of = static_cast<int>((in ? own : last) - first);
      const int end = static_cast<int>(last - first);
      const auto row_of = [&](int p) {  // the last row whose overflow starts at or before p
        int r = 0;
#pragma unroll
        for (int step = kWarp / 2; step > 0; step >>= 1)
          if (__shfl_sync(kFullMask, start_of, r + step) <= p) r += step;
        return r;
      };
      const auto entry_at = [&](int p, T& v, int& c) {
        v = ov[p];
        c = oc[p];
      };
      const auto counted = [](int, int) { return true; };
      int start = 0;
      // Runs between hub rows, in row order.
      for (unsigned hubs_left = __ballot_sync(kFullMask, hub);; hubs_left &= hubs_left - 1) {
        const int h = hubs_left ? __ffs(hubs_left) - 1 : -1;
        const int stop = h >= 0 ? __shfl_sync(kFullMask, start_of, h) : end;
        stream(start, stop, row_of, entry_at, counted);
        if (h < 0) break;
        start = h + 1 < kWarp ? __shfl_sync(kFullMask, start_of, (h + 1) % kWarp) : end;
      }
    }
    __syncwarp();
  }
  if (in && !hub) y[row] = Value<T>::from_acc(sums[lane]);
}

// Threads per block of twell_spmv_thread_rows (the launcher's block), and blocks per SM its
// register cap allows: 64 registers, 32 warps per SM (uncapped the prototype took 94-96
// registers, 20 warps: too few rows in flight for a latency-bound kernel).
constexpr int kSpmvBlock = 256;
constexpr int kSpmvBlocksPerSM = 4;
// Counts a thread reads at once, and the longest overflow a thread sums alone.
constexpr int kSpmvCountsAhead = 8;
constexpr int kSpmvOwnOverflow = 16;

// A thread per row, for layouts whose rows have room for few entries (a stencil, the paper's
// activations at 99%): the chain per row is counts -> entries -> x, as CSR's is indptr ->
// entries -> x, with no shuffles, where a team's was count -> vote -> scan and search by
// shuffles -> entry -> x -> butterfly (about twice as fast on the stencil at tile width
// 65536; docs/design.rst). The counts of kSpmvCountsAhead tiles are read at once, then
// each non-empty tile's entries kSpmvLoads at a time (dot_run with a team of one), summed in
// the plain order: tiles, then slots, then the overflow. An overflow longer than
// kSpmvOwnOverflow entries is summed by the whole warp, one such row after another
// (dot_run over 32 lanes, then the butterfly, added to the row's sum by its thread): a hub
// row among short ones would otherwise be one thread's serial work.
// Grid: ceil(M / kSpmvBlock), blocks of kSpmvBlock threads.
template <typename T, bool Listed = false, typename Index = unsigned short>
__global__ void __launch_bounds__(kSpmvBlock, kSpmvBlocksPerSM)
twell_spmv_thread_rows(const int* __restrict__ counts, const T* __restrict__ data,
                       const Index* __restrict__ indices,
                       const long long* __restrict__ overflow_indptr,
                       const int* __restrict__ overflow_indices,
                       const T* __restrict__ overflow_data, long long n_rows, long long n_cols,
                       int tile_width, int slots, const long long* __restrict__ list_indptr,
                       const int* __restrict__ list_tiles, const T* __restrict__ x,
                       T* __restrict__ y) {
  using Acc = typename Value<T>::Acc;
  const int lane = threadIdx.x % kWarp;
  const long long row = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row - lane >= n_rows) return;  // the whole warp: the others vote below
  const bool live = row < n_rows;
  const long long tiles = n_tiles(n_cols, tile_width);
  long long o_start = 0, o_end = 0;
  Acc acc = Acc(0);
  if (live) {
    o_start = overflow_indptr[row];
    o_end = overflow_indptr[row + 1];
    const Team<1> self(lane);
    const int* __restrict__ row_counts = counts + row * tiles;
    // Positions q0 <= q < q1 of the row's tiles: every tile, or its listed ones.
    long long q0 = 0, q1 = tiles;
    if constexpr (Listed) {
      q0 = list_indptr[row];
      q1 = list_indptr[row + 1];
    }
    for (; q0 < q1; q0 += kSpmvCountsAhead) {
      long long t[kSpmvCountsAhead];
      int c[kSpmvCountsAhead];
#pragma unroll
      for (int k = 0; k < kSpmvCountsAhead; ++k) {
        if constexpr (Listed) t[k] = q0 + k < q1 ? list_tiles[q0 + k] : 0;
        else t[k] = q0 + k;
        c[k] = q0 + k < q1 ? row_counts[t[k]] : 0;
      }
#pragma unroll
      for (int k = 0; k < kSpmvCountsAhead; ++k) {
        const long long col0 = t[k] * tile_width, base = (row * tiles + t[k]) * slots;
        acc += dot_run<T, 1>(self.lane, base, base + c[k], data,
                             [&](long long j) { return static_cast<int>(col0 + indices[j]); },
                             x);
      }
    }
    if (o_end - o_start <= kSpmvOwnOverflow)
      acc += dot_run<T, 1>(self.lane, o_start, o_end, overflow_data,
                           [&](long long j) { return overflow_indices[j]; }, x);
  }
  const Team<kWarp> warp(lane);
  for (unsigned long_rows = __ballot_sync(kFullMask, o_end - o_start > kSpmvOwnOverflow);
       long_rows != 0u; long_rows &= long_rows - 1u) {
    const int owner = __ffs(long_rows) - 1;
    const Acc part = warp.sum(dot_run<T, kWarp>(
        warp.lane, warp.shfl(o_start, owner), warp.shfl(o_end, owner), overflow_data,
        [&](long long j) { return overflow_indices[j]; }, x));
    if (lane == owner) acc += part;
  }
  if (live) y[row] = Value<T>::from_acc(acc);
}
