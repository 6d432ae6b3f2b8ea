// Prototype: one-tile SpMV with hub rows (overflow >= hub_min entries) taken by a whole block
// each in the same launch (blocks [0, n_hubs)), the other rows by teams of G lanes; every y
// written once, no partial sums, no second kernel.
template <typename T, int G, int Loads, typename Index, int MinBlocks>
__global__ void __launch_bounds__(256, MinBlocks)
proto_spmv_hub(const int* __restrict__ counts, const T* __restrict__ data,
               const Index* __restrict__ indices, const long long* __restrict__ overflow_indptr,
               const int* __restrict__ overflow_indices, const T* __restrict__ overflow_data,
               long long n_rows, int slots, const long long* __restrict__ hubs, long long n_hubs,
               long long hub_min, const T* __restrict__ x, T* __restrict__ y) {
  using Acc = typename Value<T>::Acc;
  if (blockIdx.x < n_hubs) {
    const long long row = hubs[blockIdx.x];
    const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
    const long long base = row * slots;
    const int count = counts[row];
    Acc acc = Acc(0);
    for (int s = threadIdx.x; s < count; s += 256)
      acc += Value<T>::to_acc(data[base + s]) * Value<T>::to_acc(x[static_cast<int>(indices[base + s])]);
    for (long long j0 = o_start; j0 < o_end; j0 += Loads * 256) {
      Acc p[Loads];
#pragma unroll
      for (int k = 0; k < Loads; ++k) {
        const long long j = j0 + k * 256 + threadIdx.x;
        p[k] = j < o_end ? Value<T>::to_acc(overflow_data[j]) * Value<T>::to_acc(x[overflow_indices[j]]) : Acc(0);
      }
#pragma unroll
      for (int k = 0; k < Loads; ++k) acc += p[k];
    }
    const Team<kWarp> warp(threadIdx.x % kWarp);
    acc = warp.sum(acc);
    __shared__ Acc part[8];
    if (warp.lane == 0) part[threadIdx.x / kWarp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      Acc s = part[0];
      for (int w = 1; w < 8; ++w) s += part[w];
      y[row] = Value<T>::from_acc(s);
    }
    return;
  }
  const Team<G> team(threadIdx.x % kWarp);
  const long long row =
      (static_cast<long long>(blockIdx.x - n_hubs) * blockDim.x + threadIdx.x) / G;
  if (row >= n_rows) return;
  const long long o_start = overflow_indptr[row], o_end = overflow_indptr[row + 1];
  if (o_end - o_start >= hub_min) return;  // a hub block's row
  const long long base = row * slots;
  const auto column = [&](long long j) { return static_cast<int>(indices[j]); };
  const auto over_column = [&](long long j) { return overflow_indices[j]; };
  Acc acc = dot_run<T, G, decltype(column), Loads>(team, base, base + counts[row], data, column, x);
  acc += dot_run<T, G, decltype(over_column), Loads>(team, o_start, o_end, overflow_data, over_column, x);
  acc = team.sum(acc);
  if (team.lane == 0) y[row] = Value<T>::from_acc(acc);
}
