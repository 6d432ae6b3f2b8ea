// canonical.cu: CSR input -> canonical CSR (each row's columns sorted, duplicates summed,
// explicit zeros dropped), the form every CSR -> TwELL kernel expects.
//
// The host's algorithm (twell/_algorithms.py, canonical_coo) sorts every entry by a 64-bit
// (row, column) key. CSR input is ordered by rows already, so here a warp sorts one row:
//   twell_csr_sort_rows     each row's entries, stably by column, into (col_out, val_out) at
//                           the row's own positions; row_kept[row] = its canonical entries;
//                           info[0] += rows left unsorted (longer than max_row and out of
//                           order), info[1] += entries the canonical form drops (duplicates,
//                           zeros, and any storage past indptr[M]), info[2] += faults:
//                           rows whose pointers are out of order or out of the storage
//                           (then skipped) and columns outside [0, n_cols);
//   twell_csr_compact_rows  when info[1] > 0: each sorted row's canonical entries to
//                           out_indptr[row] (an exclusive prefix sum of row_kept).
// A row in column order (the usual case, duplicates allowed) is copied; a row out of order
// is sorted stably by rank: an entry's position is the number of entries before it in
// (column, position) order, counted by shuffles within its chunk of 32 entries and by a
// binary search in each other chunk, sorted first into `scratch` (L / 32 chunks x 5 steps
// per entry; max_row bounds a warp's work, and the launcher falls back to the global sort
// when info[0] > 0). On the paper's activations at 90% sparsity (L = 563), full chunks
// ranked and searched in unrolled fixed steps took half the time of comparing every pair
// (L^2 / 32 steps per warp; docs/design.rst, canonical CSR).
// Duplicates are summed in their input order in the accumulation type (Value<T>::Acc), like
// the host's level-by-level sum; a value with no duplicate is copied bit for bit. No atomics
// touch the output: the result is deterministic. Grid: whole warps, a grid-stride loop over
// rows.
#include "twell_layout.cuh"

using namespace twell;

namespace {

constexpr int kCanonicalWarps = 8;

__device__ inline unsigned lanes_below(int lane) { return (1u << lane) - 1u; }

// CuPy compiles every RawModule with -ftz=true after twell's options, so a float `+` flushes
// subnormal operands and sums to zero, where the host's sums keep them (the canonical form
// must have the host's bits). add.rn.f32 written out carries no .ftz, and ptxas keeps it.
__device__ inline float add_keeping_subnormals(float a, float b) {
  float sum;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
  return sum;
}
__device__ inline double add_keeping_subnormals(double a, double b) { return a + b; }

// A sum rounded to T. bfloat16 by its bits (to nearest, ties to even; a NaN stays a NaN), so
// that no float conversion can flush a subnormal; the others as Value<T>::from_acc (a float32
// subnormal is far below float16's smallest subnormal, and double is never flushed).
template <typename T>
__device__ inline T round_sum(typename Value<T>::Acc sum) { return Value<T>::from_acc(sum); }
template <>
__device__ inline __nv_bfloat16 round_sum<__nv_bfloat16>(float sum) {
  const unsigned bits = __float_as_uint(sum);
  const unsigned top = (bits & 0x7fffffffu) > 0x7f800000u
                           ? (bits >> 16) | 0x40u                           // quiet NaN
                           : (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // nearest even
  return __ushort_as_bfloat16(static_cast<unsigned short>(top));
}

// Whether a[start .. end) is in non-decreasing order, i.e. sorted stably already (the same
// answer in every lane).
__device__ inline bool in_column_order(const int* __restrict__ a, long long start,
                                       long long end, int lane) {
  bool ok = true;
  for (long long j = start + 1 + lane; j < end && ok; j += kWarp) ok = a[j - 1] <= a[j];
  return __all_sync(kFullMask, ok);
}

// Rank of this lane's column c among the first `width` lanes' columns (every lane calls it),
// ties broken by lane: its position once the chunk is sorted stably. A full chunk (every
// chunk of a row but its last) takes the unrolled loop (4% faster at 90% sparsity, H200;
// most of v3's gain came from count_before's fixed steps).
__device__ __forceinline__ int rank_in_chunk(int c, int lane, int width) {
  int r = 0;
  if (width == kWarp) {
#pragma unroll
    for (int t = 0; t < kWarp; ++t) {
      const int other = __shfl_sync(kFullMask, c, t);
      r += (other < c) | ((other == c) & (t < lane));
    }
    return r;
  }
  for (int t = 0; t < width; ++t) {
    const int other = __shfl_sync(kFullMask, c, t);
    r += (other < c) | ((other == c) & (t < lane));
  }
  return r;
}

// Entries of the sorted chunk a[0 .. n) that come before column c: those <= c when the chunk
// precedes c's own (`earlier`: ties go to the earlier position), else those < c. A full chunk
// takes five fixed halving steps and one more for its last entry, branch-free and in 32-bit
// arithmetic; a short one a binary search. Not __restrict__: the sort kernel reads here what
// its warp has just written (no read-only cache path).
__device__ __forceinline__ int count_before(const int* a, int n, int c, bool earlier) {
  if (n == kWarp) {
    int p = 0;
#pragma unroll
    for (int step = kWarp / 2; step > 0; step >>= 1) {
      const int v = a[p + step - 1];
      p += (v < c || (earlier && v == c)) ? step : 0;
    }
    const int v = a[p];
    return p + ((v < c || (earlier && v == c)) ? 1 : 0);
  }
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const int v = a[mid];
    if (v < c || (earlier && v == c)) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Walk the sorted row col[start .. end), val[start .. end) in order; every lane must call it.
// With kWrite, its canonical entries go to out_col/out_val[out_start ...]. Returns the number
// of canonical entries (the same in every lane). col and val are not __restrict__: the sort
// kernel reads here what its warp has just written (no read-only cache path).
template <bool kWrite, typename T>
__device__ __forceinline__ long long canonical_entries(const int* col, const T* val,
                                       long long start, long long end, int lane,
                                       int* __restrict__ out_col, T* __restrict__ out_val,
                                       long long out_start) {
  using Acc = typename Value<T>::Acc;
  long long kept = 0;
  for (long long i0 = start; i0 < end; i0 += kWarp) {
    const long long i = i0 + lane;
    bool keep = false;
    int c = 0;
    T v = Value<T>::zero();
    if (i < end) {
      c = col[i];
      if (i == start || col[i - 1] != c) {  // the first of its column: sums the run
        v = val[i];
        long long j = i + 1;
        if (j < end && col[j] == c) {
          Acc sum = Value<T>::to_acc(v);
          for (; j < end && col[j] == c; ++j)
            sum = add_keeping_subnormals(sum, Value<T>::to_acc(val[j]));
          v = round_sum<T>(sum);
        }
        keep = is_nonzero(v);
      }
    }
    const unsigned ballot = __ballot_sync(kFullMask, keep);
    if (kWrite && keep) {
      const long long o = out_start + kept + __popc(ballot & lanes_below(lane));
      out_col[o] = c;
      out_val[o] = v;
    }
    kept += __popc(ballot);
  }
  return kept;
}

}  // namespace

// scratch, col_out and val_out have the input's length; info (3 counters) is zeroed by the
// launcher. A fault makes the launcher raise (it names one with a host check), so a faulty
// row's output is left unwritten; its pointers are checked before anything in it is read. The launch bounds name one block per SM as the minimum: with the block size alone,
// ptxas (nvcc 13.0, sm_90) held this kernel to 32 registers and spilled.
template <typename T>
__global__ void __launch_bounds__(kCanonicalWarps * kWarp, 1)
twell_csr_sort_rows(const long long* __restrict__ indptr, const int* __restrict__ col_in,
                    const T* __restrict__ val_in, long long n_rows, long long n_cols,
                    long long n_stored, long long max_row, int* scratch, int* __restrict__ col_out,
                    T* __restrict__ val_out, long long* __restrict__ row_kept,
                    unsigned long long* __restrict__ info) {
  const int lane = threadIdx.x % kWarp;
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / kWarp);
  unsigned long long unsorted = 0, dropped = 0;  // lane 0's tallies
  unsigned long long faults = 0;                  // every lane's
  for (long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
       row < n_rows; row += warps) {
    const long long start = indptr[row], end = indptr[row + 1], n = end - start;
    if (start < 0 || end < start || end > n_stored || (row == 0 && start != 0)) {
      faults += lane == 0;
      continue;
    }
    if (in_column_order(col_in, start, end, lane)) {
      for (long long j = start + lane; j < end; j += kWarp) {
        const int c = col_in[j];
        faults += c < 0 || c >= n_cols;
        col_out[j] = c;
        val_out[j] = val_in[j];
      }
    } else if (n > max_row) {
      unsorted += 1;
      continue;
    } else {  // n <= max_row < 2^31: positions within the row fit in int
      // Pass 1: each chunk of 32 entries sorted into scratch (its own positions).
      const int len = static_cast<int>(n);
      for (int i0 = 0; i0 < len; i0 += kWarp) {
        const int c = i0 + lane < len ? col_in[start + i0 + lane] : 0;
        faults += i0 + lane < len && (c < 0 || c >= n_cols);
        const int r = rank_in_chunk(c, lane, min(kWarp, len - i0));
        if (i0 + lane < len) scratch[start + i0 + r] = c;
      }
      __syncwarp();  // orders the warp's writes of the sorted chunks before its reads
      // Pass 2: an entry's place in the row is its rank in its chunk plus, in every other
      // chunk, the entries before it: those of a column <= its own in an earlier chunk, of a
      // column < its own in a later one (the positions break the ties).
      for (int i0 = 0; i0 < len; i0 += kWarp) {
        const int c = i0 + lane < len ? col_in[start + i0 + lane] : 0;
        int pos = rank_in_chunk(c, lane, min(kWarp, len - i0));
        if (i0 + lane < len) {
          for (int b0 = 0; b0 < len; b0 += kWarp) {
            if (b0 == i0) continue;
            pos += count_before(scratch + start + b0, min(kWarp, len - b0), c, b0 < i0);
          }
          col_out[start + pos] = c;
          val_out[start + pos] = val_in[start + i0 + lane];
        }
      }
    }
    __syncwarp();  // orders the warp's writes of the sorted row before its reads
    const long long kept = canonical_entries<false>(col_out, val_out, start, end, lane,
                                                    static_cast<int*>(nullptr),
                                                    static_cast<T*>(nullptr), 0);
    if (lane == 0) {
      row_kept[row] = kept;
      dropped += n - kept;
      if (row == n_rows - 1) dropped += n_stored - end;  // storage after the last row
    }
  }
  if (lane == 0 && unsorted > 0) atomicAdd(&info[0], unsorted);
  if (lane == 0 && dropped > 0) atomicAdd(&info[1], dropped);
  if (faults > 0) atomicAdd(&info[2], faults);
}

// The rows sorted by twell_csr_sort_rows (none skipped), compacted to out_indptr.
template <typename T>
__global__ void __launch_bounds__(kCanonicalWarps * kWarp, 1)
twell_csr_compact_rows(const long long* __restrict__ indptr, const int* __restrict__ col,
                       const T* __restrict__ val, long long n_rows,
                       const long long* __restrict__ out_indptr, int* __restrict__ out_col,
                       T* __restrict__ out_val) {
  const int lane = threadIdx.x % kWarp;
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / kWarp);
  for (long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
       row < n_rows; row += warps)
    canonical_entries<true>(col, val, indptr[row], indptr[row + 1], lane, out_col, out_val,
                            out_indptr[row]);
}
