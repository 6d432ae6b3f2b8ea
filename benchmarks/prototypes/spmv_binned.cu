// Prototype (not shipped): the one-tile SpMV over a list of rows, so that rows of similar
// length share a warp (rows binned by length at plan time, a launch per bin with its own team
// width). Appended to spmm.cu's source by spmv_binned.py; uses its Team, Value, dot_run and
// split_row. Same per-row order of sums as twell_spmv_one_tile with the same G and Loads.
template <typename T, bool Overflow, int G, int Loads>
__global__ void __launch_bounds__(256)
proto_spmv_binned(const int* __restrict__ counts, const T* __restrict__ data,
                  const int* __restrict__ indices, const long long* __restrict__ overflow_indptr,
                  const int* __restrict__ overflow_indices, const T* __restrict__ overflow_data,
                  const long long* __restrict__ rows, long long n_list, int slots,
                  const typename Value<T>::Acc* __restrict__ partial, int chunk_log2,
                  const T* __restrict__ x, T* __restrict__ y) {
  using Acc = typename Value<T>::Acc;
  const Team<G> team(threadIdx.x % kWarp);
  const long long item = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  if (item >= n_list) return;
  const long long row = rows[item];
  long long o_start = 0, o_end = 0;
  if constexpr (Overflow) {
    o_start = overflow_indptr[row];
    o_end = overflow_indptr[row + 1];
  }
  const long long base = row * slots;
  const auto column = [&](long long j) { return indices[j]; };
  const auto over_column = [&](long long j) { return overflow_indices[j]; };
  Acc acc = dot_run<T, G, decltype(column), Loads>(team, base, base + counts[row], data, column,
                                                   x);
  bool split = false;
  if constexpr (Overflow) {
    split = split_row(o_start, o_end, chunk_log2);
    acc += dot_run<T, G, decltype(over_column), Loads>(team, o_start, split ? o_start : o_end,
                                                       overflow_data, over_column, x);
  }
  acc = team.sum(acc);
  if (team.lane != 0) return;
  if (split) {
    for (long long c = o_start >> chunk_log2; (c << chunk_log2) < o_end; ++c)
      acc += partial[2 * c + ((c << chunk_log2) < o_start)];
  }
  y[row] = Value<T>::from_acc(acc);
}
