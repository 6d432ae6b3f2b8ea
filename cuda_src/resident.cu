// resident.cu: Y = A @ B for a TwELL A (M, K) of 16-bit values with B (K, N) resident in
// shared memory, 8 columns of it a block, widened to float32 ("the resident SpMM").
//
// The gather kernel (spmm.cu) reads a B row from L2 for every entry of A: at 1% non-zeros on
// the paper's down projection that is 3.8 GB at the L2's rate, no faster than cuBLAS's dense
// product. Here a block keeps columns [8 s, 8 s + 8) of B for every k in shared memory
// (32 bytes a row: K <= 7000 fits an H100's 227 KB) and reads every row of A: each entry
// costs a 32-byte shared-memory read and four multiply-adds a lane, and A is read from L2
// once per column block, as a list of 32-bit words (the value's bits << 16 | the column)
// that two kernels build first.
//
// Shared memory serves 128 bytes a cycle, four 32-byte rows; a quarter-warp reads four rows
// in one wavefront only when they lie in four distinct 32-byte bank groups, which is k % 4.
// So the lists are ordered: a pair of lanes owns a row of A (4 output columns a lane), the
// four pairs of a quarter-warp own rows r with r % 4 = 0..3, and entry u of each group of
// four of row r has k % 4 == (r + u) % 4. Where a row has no entry of the class a position
// needs, a padding word points at one of four zero rows past K (k = K .. K + 3), whose
// products add +0.0. A row whose ordered list would be more than twice as long as its entries
// rounded up to four (a row of few entries in one class) is listed in column order instead:
// its reads conflict, its sums are the same. Every row's list starts at a multiple of four
// words and holds a multiple of four, at least four.
//
// Sums are float32, in list order (deterministic: the order depends on the layout only).
#include "twell_layout.cuh"

using namespace twell;

constexpr int kResidentColumns = 8;
constexpr int kResidentThreads = 1024;
constexpr int kResidentClasses = 4;
#ifndef TWELL_RESIDENT_AHEAD
#define TWELL_RESIDENT_AHEAD 3
#endif
constexpr int kResidentAhead = TWELL_RESIDENT_AHEAD;  // groups read ahead of the products

// The four class counts of one row: its slots' columns, then its overflow's.
__device__ inline void resident_class_counts(const int* counts, const unsigned short* indices,
                                             const long long* overflow_indptr,
                                             const int* overflow_indices, long long row,
                                             long long n_tiles, int tile_width, int slots,
                                             int lane, int (&c)[kResidentClasses]) {
  for (int j = 0; j < kResidentClasses; ++j) c[j] = 0;
  for (long long t = lane; t < n_tiles; t += kWarp) {
    const long long pair = row * n_tiles + t;
    const int count = counts[pair];
    for (int s = 0; s < count; ++s) {
      const long long col = t * tile_width + indices[pair * slots + s];
      ++c[col & 3];
    }
  }
  for (long long e = overflow_indptr[row] + lane; e < overflow_indptr[row + 1]; e += kWarp)
    ++c[overflow_indices[e] & 3];
  for (int j = 0; j < kResidentClasses; ++j)
    for (int off = kWarp / 2; off > 0; off >>= 1) c[j] += __shfl_xor_sync(kFullMask, c[j], off);
}

// Whether a row with class counts c is listed in class order, and its list's length.
__device__ inline long long resident_length(const int (&c)[kResidentClasses], bool& ordered) {
  int most = 0, all = 0;
  for (int j = 0; j < kResidentClasses; ++j) {
    most = max(most, c[j]);
    all += c[j];
  }
  const long long plain = 4LL * ((all + 3) / 4);
  ordered = 4LL * most <= 2 * plain;
  // At least one group, so that the SpMM finds every row's end in its list (an empty row's
  // group is padding, its products +0.0).
  return max(4LL, ordered ? 4LL * most : plain);
}

// lengths[row] = the length of the row's list (words). A warp per row; blocks of BLOCK.
__global__ void twell_resident_lengths(
    const int* __restrict__ counts, const unsigned short* __restrict__ indices,
    const long long* __restrict__ overflow_indptr, const int* __restrict__ overflow_indices,
    long long m, long long n_tiles, int tile_width, int slots, long long* __restrict__ lengths) {
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (row >= m) return;
  const int lane = threadIdx.x % kWarp;
  int c[kResidentClasses];
  resident_class_counts(counts, indices, overflow_indptr, overflow_indices, row, n_tiles,
                        tile_width, slots, lane, c);
  bool ordered;
  const long long length = resident_length(c, ordered);
  if (lane == 0) lengths[row] = length;
}

// Places one entry per valid lane at its rank: in class order, word u of each group of four
// holds class (row + u) % 4; else in the order the entries come. `run` counts the entries
// placed so far (per class where ordered, all in run[0] else), the same in every lane.
__device__ inline void resident_place(bool valid, long long col, unsigned short bits,
                                      bool ordered, int row_class, unsigned* list,
                                      int (&run)[kResidentClasses]) {
  const unsigned below = (1u << (threadIdx.x % kWarp)) - 1u;
  const unsigned word = (static_cast<unsigned>(bits) << 16) | static_cast<unsigned>(col);
  if (!ordered) {
    const unsigned mask = __ballot_sync(kFullMask, valid);
    if (valid) list[run[0] + __popc(mask & below)] = word;
    run[0] += __popc(mask);
    return;
  }
  const int cls = static_cast<int>(col & 3);
  for (int j = 0; j < kResidentClasses; ++j) {
    const unsigned mask = __ballot_sync(kFullMask, valid && cls == j);
    if (valid && cls == j) {
      const int rank = run[j] + __popc(mask & below);
      list[4LL * rank + ((j - row_class) & 3)] = word;
    }
    run[j] += __popc(mask);
  }
}

// words[offsets[row] ..] = the row's list (offsets: the exclusive scan of lengths, M + 1).
// A warp per row: the padding first, then the entries over it (slots by (slot, tile), then
// the overflow), so that a row's words depend on the layout alone.
__global__ void twell_resident_fill(
    const int* __restrict__ counts, const unsigned short* __restrict__ data,
    const unsigned short* __restrict__ indices, const long long* __restrict__ overflow_indptr,
    const int* __restrict__ overflow_indices, const unsigned short* __restrict__ overflow_data,
    long long m, long long k, long long n_tiles, int tile_width, int slots,
    const long long* __restrict__ offsets, unsigned* __restrict__ words) {
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (row >= m) return;
  const int lane = threadIdx.x % kWarp;
  int c[kResidentClasses];
  resident_class_counts(counts, indices, overflow_indptr, overflow_indices, row, n_tiles,
                        tile_width, slots, lane, c);
  bool ordered;
  const long long length = resident_length(c, ordered);
  unsigned* list = words + offsets[row];
  const int row_class = static_cast<int>(row & 3);
  for (long long t = lane; t < length; t += kWarp) {
    const long long want = ordered ? (row_class + t) & 3 : k & 3;  // k + 0 is a zero row
    list[t] = static_cast<unsigned>(k + ((want - k) & 3));
  }
  __syncwarp();
  int run[kResidentClasses] = {0, 0, 0, 0};
  for (long long t0 = 0; t0 < n_tiles; t0 += kWarp) {
    const long long t = t0 + lane;
    const long long pair = row * n_tiles + t;
    const int count = t < n_tiles ? counts[pair] : 0;
    int most = count;
    for (int off = kWarp / 2; off > 0; off >>= 1)
      most = max(most, __shfl_xor_sync(kFullMask, most, off));
    for (int s = 0; s < most; ++s) {
      const bool valid = s < count;
      const long long col = valid ? t * tile_width + indices[pair * slots + s] : 0;
      const unsigned short bits = valid ? data[pair * slots + s] : 0;
      resident_place(valid, col, bits, ordered, row_class, list, run);
    }
  }
  const long long end = overflow_indptr[row + 1];
  for (long long e0 = overflow_indptr[row]; e0 < end; e0 += kWarp) {
    const long long e = e0 + lane;
    const bool valid = e < end;
    resident_place(valid, valid ? overflow_indices[e] : 0, valid ? overflow_data[e] : 0,
                   ordered, row_class, list, run);
  }
}

// The two values of a 32-bit word of 16-bit values as float32.
template <typename T> struct Halves;
template <> struct Halves<__nv_bfloat16> {
  __device__ static float lo(unsigned w) { return __uint_as_float(w << 16); }
  __device__ static float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
  __device__ static unsigned pack(float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&v);
  }
};
template <> struct Halves<__half> {
  __device__ static float lo(unsigned w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  }
  __device__ static float hi(unsigned w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  __device__ static unsigned pack(float a, float b) {
    const __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&v);
  }
};

// out (M, N) = A @ b from the lists. Grid (ceil(N / 8), row blocks), kResidentThreads
// threads, (K + 4) * 32 bytes of dynamic shared memory. Block (s, y) keeps columns 8 s ..
// 8 s + 7 of b as float32 (zeros past N) and computes them for rows y * P + pair + j * P *
// gridDim.y (P pairs a block): a row's class position, row % 4, is its pair's within the
// quarter-warp. B is widened once as it is staged: 16-bit values held as they come would
// need a conversion per multiply-add, on the integer pipe, which issues at half the rate of
// the float32 one and bound an earlier form of this kernel (16 columns a block, 0.42 ms at
// the paper's 1%: docs/design.rst). `vec`: N % 8 == 0 and b 16-byte aligned (16-byte loads,
// 8-byte stores).
template <typename T>
__global__ void __launch_bounds__(kResidentThreads, 1) twell_spmm_resident(
    const uint4* __restrict__ words, const long long* __restrict__ offsets,
    const T* __restrict__ b, long long m, int k, int n, int vec, T* __restrict__ out) {
  extern __shared__ float4 rows[];  // rows[2 * kk + h]: columns 4 h .. 4 h + 3 of b's row kk
  const int col0 = blockIdx.x * kResidentColumns;
  if (vec) {
    // A 16-byte load is a row's 8 columns; four in flight a thread before their stores.
    const int total = k + 4;
    for (int i0 = threadIdx.x; i0 < total; i0 += 4 * blockDim.x) {
      uint4 t[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int kk = i0 + u * blockDim.x;
        t[u] = kk < k && col0 < n
                   ? __ldg(reinterpret_cast<const uint4*>(b + static_cast<long long>(kk) * n + col0))
                   : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int kk = i0 + u * blockDim.x;
        if (kk < total) {
          rows[2 * kk] = make_float4(Halves<T>::lo(t[u].x), Halves<T>::hi(t[u].x),
                                     Halves<T>::lo(t[u].y), Halves<T>::hi(t[u].y));
          rows[2 * kk + 1] = make_float4(Halves<T>::lo(t[u].z), Halves<T>::hi(t[u].z),
                                         Halves<T>::lo(t[u].w), Halves<T>::hi(t[u].w));
        }
      }
    }
  } else {
    float* r = reinterpret_cast<float*>(rows);
    for (int i = threadIdx.x; i < kResidentColumns * (k + 4); i += blockDim.x) {
      const int kk = i / kResidentColumns, c = col0 + i % kResidentColumns;
      r[i] = kk < k && c < n ? Value<T>::to_acc(b[static_cast<long long>(kk) * n + c]) : 0.f;
    }
  }
  __syncthreads();
  const int h = threadIdx.x & 1;
  const int pairs = blockDim.x / 2;
  const long long stride = static_cast<long long>(pairs) * gridDim.y;
  const char* base = reinterpret_cast<const char*>(rows) + 16 * h;
  long long row = static_cast<long long>(blockIdx.y) * pairs + threadIdx.x / 2;
  if (row >= m) return;
  // The pair's rows are one stream of groups (every list holds at least one), read
  // kResidentAhead groups ahead of the products; the next row's bounds are read a row
  // ahead. A group carries whether it ends its row (bit i of `ends` for buf[i]).
  long long f_q = offsets[row] / 4, f_end = offsets[row + 1] / 4;
  long long n_row = row + stride, n_q = 0, n_end = 0;
  if (n_row < m) n_q = offsets[n_row] / 4, n_end = offsets[n_row + 1] / 4;
  const auto fetch = [&](uint4& g) -> unsigned {
    if (f_q >= f_end) {  // past the pair's last row
      g = make_uint4(0u, 0u, 0u, 0u);
      return 0u;
    }
    g = __ldg(words + f_q);
    if (++f_q < f_end) return 0u;
    f_q = n_q, f_end = n_end;
    n_row += stride;
    n_q = n_end = 0;
    if (n_row < m) n_q = offsets[n_row] / 4, n_end = offsets[n_row + 1] / 4;
    return 1u;
  };
  uint4 buf[kResidentAhead];
  unsigned ends = 0;
#pragma unroll
  for (int i = 0; i < kResidentAhead; ++i) ends |= fetch(buf[i]) << i;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  while (true) {
    const uint4 g = buf[0];
    const bool last = ends & 1u;
#pragma unroll
    for (int i = 0; i + 1 < kResidentAhead; ++i) buf[i] = buf[i + 1];
    ends = (ends >> 1) | (fetch(buf[kResidentAhead - 1]) << (kResidentAhead - 1));
    const unsigned w[4] = {g.x, g.y, g.z, g.w};
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      v[u] = *reinterpret_cast<const float4*>(base + 32 * (w[u] & 0xffffu));
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float a = Halves<T>::hi(w[u]);
      acc[0] = fmaf(a, v[u].x, acc[0]);
      acc[1] = fmaf(a, v[u].y, acc[1]);
      acc[2] = fmaf(a, v[u].z, acc[2]);
      acc[3] = fmaf(a, v[u].w, acc[3]);
    }
    if (last) {
      const int c = col0 + 4 * h;
      T* dst = out + row * n + c;
      if (vec && c < n) {
        *reinterpret_cast<uint2*>(dst) =
            make_uint2(Halves<T>::pack(acc[0], acc[1]), Halves<T>::pack(acc[2], acc[3]));
      } else if (!vec) {
        for (int j = 0; j < 4 && c + j < n; ++j) dst[j] = Value<T>::from_acc(acc[j]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j] = 0.f;
      row += stride;
      if (row >= m) break;
    }
  }
}
