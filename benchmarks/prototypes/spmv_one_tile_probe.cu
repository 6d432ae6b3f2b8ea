// Probe kernels: SpMV on the one-tile TwELL layout (tiles == 1): counts (m), data (m, slots),
// indices int32 (m, slots), overflow CSR.
template <typename T, typename Acc>
__device__ __forceinline__ Acc overflow_sum(long long o0, long long o1, const int* __restrict__ oidx,
                                            const T* __restrict__ odata, const T* __restrict__ x) {
  Acc acc = Acc(0);
  for (long long j = o0; j < o1; ++j) acc += Acc(odata[j]) * Acc(x[oidx[j]]);
  return acc;
}

// A thread per row, the row's slots read 8 at a time, all loads before the x gathers.
template <typename T, typename Acc>
__device__ void thread_rows(const int* __restrict__ counts, const T* __restrict__ data,
                            const int* __restrict__ indices, const long long* __restrict__ oip,
                            const int* __restrict__ oidx, const T* __restrict__ odata,
                            long long m, int slots, const T* __restrict__ x, T* __restrict__ y) {
  const long long row = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= m) return;
  const long long o0 = oip[row], o1 = oip[row + 1];
  const int c = counts[row];
  const T* __restrict__ d = data + row * slots;
  const int* __restrict__ ix = indices + row * slots;
  Acc acc = Acc(0);
  for (int s0 = 0; s0 < c; s0 += 8) {
    T v[8];
    int col[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const bool ok = s0 + k < c;
      v[k] = ok ? d[s0 + k] : T(0);
      col[k] = ok ? ix[s0 + k] : 0;
    }
    T xv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) xv[k] = s0 + k < c ? x[col[k]] : T(0);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc += Acc(v[k]) * Acc(xv[k]);
  }
  if (o1 > o0) acc += overflow_sum<T, Acc>(o0, o1, oidx, odata, x);
  y[row] = T(acc);
}

// A warp stages its 32 rows' slots in shared memory with coalesced loads, then a lane per row.
template <typename T, typename Acc>
__device__ void warp_staged(const int* __restrict__ counts, const T* __restrict__ data,
                            const int* __restrict__ indices, const long long* __restrict__ oip,
                            const int* __restrict__ oidx, const T* __restrict__ odata,
                            long long m, int slots, const T* __restrict__ x, T* __restrict__ y) {
  extern __shared__ unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_warp = 32 * slots;
  T* sv = reinterpret_cast<T*>(smem) + warp * per_warp;
  int* si = reinterpret_cast<int*>(smem + sizeof(T) * per_warp * (blockDim.x / 32)) + warp * per_warp;
  const long long row0 = (static_cast<long long>(blockIdx.x) * blockDim.x) + warp * 32;
  if (row0 >= m) return;
  const long long rows = min(32ll, m - row0);
  const long long row = row0 + lane;
  long long o0 = 0, o1 = 0;
  int c = 0;
  if (lane < rows) {
    o0 = oip[row];
    o1 = oip[row + 1];
    c = counts[row];
  }
  const long long base = row0 * slots, n = rows * slots;
  for (int j = lane; j < n; j += 32) {
    sv[j] = data[base + j];
    si[j] = indices[base + j];
  }
  __syncwarp();
  if (lane >= rows) return;
  Acc acc = Acc(0);
  for (int s = 0; s < c; ++s) acc += Acc(sv[lane * slots + s]) * Acc(x[si[lane * slots + s]]);
  if (o1 > o0) acc += overflow_sum<T, Acc>(o0, o1, oidx, odata, x);
  y[row] = T(acc);
}

#define INSTANCES(T, ACC, S)                                                                   \
  extern "C" __global__ void __launch_bounds__(256) thread_rows_##S(                           \
      const int* counts, const T* data, const int* indices, const long long* oip,             \
      const int* oidx, const T* odata, long long m, int slots, const T* x, T* y) {            \
    thread_rows<T, ACC>(counts, data, indices, oip, oidx, odata, m, slots, x, y);              \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) warp_staged_##S(                           \
      const int* counts, const T* data, const int* indices, const long long* oip,             \
      const int* oidx, const T* odata, long long m, int slots, const T* x, T* y) {            \
    warp_staged<T, ACC>(counts, data, indices, oip, oidx, odata, m, slots, x, y);              \
  }
INSTANCES(float, float, f32)
INSTANCES(double, double, f64)
