// spmv_panels_sm90.cu: twell_spmv_panels_<dtype>, y = A @ x through a panel plan, for matrices
// whose rows gather x from all over (a power-law graph, its Laplacian): sm_90 only (bulk
// copies multicast into a cluster's shared memory). The loader compiles this file with NVRTC
// for -arch=sm_90a on a device of compute capability 9.0; CI compiles it with nvcc.
//
// Why: a one-tile SpMV of such a matrix reads one 32-byte sector of x from L2 for every
// entry (16.5 M sectors on a Pareto(2) graph of 10^6 rows: 70% of its L2 traffic, and
// cuSPARSE's CSR SpMV is bound by that traffic as well). Here x comes in panels of kWidth
// columns (64 KB) that a cluster of kCluster CTAs loads once, each CTA a slice multicast into
// all of them: x is read from L2 once per cluster, and every entry's x value from shared
// memory. The entries come in the plan's order (twell/_cuda/_panels.py): CTA c owns the rows
// [row0[c], row0[c + 1]) (at most kRows of them), and its entries with columns in panel p
// are one run, sorted by row and column, padded with sentinel entries to kRunAlign; a
// run's entry is its value and one 32-bit word, the row within the CTA above the column
// within the panel (kColBits).
//
// 288 threads: warps 0-7 consume, warp 8 produces. A kStages-deep ring of stages, each the
// x panel and this CTA's run of it, completed on a `full` mbarrier (the producer's
// arrive.expect_tx of both, the copies' bytes) and released on an `empty` one (one arrival
// per consumer warp of every CTA of the cluster: a stage's multicast writes all of them).
// The producer also prefetches the runs two panels ahead into L2.
// Each consumer warp takes an eighth of the run, its ends moved to the next row's first
// entry, so no row is split between warps within a panel; the warp takes 32 entries a round,
// kRounds rounds at once, multiplies each by x from the stage, adds a row's products by a
// segmented scan over the lanes (fixed shuffles) and adds each row's sum into the CTA's
// accumulators in shared memory (the lane that ends the row's segment, rounds in order).
// The consumers meet at a named barrier after each panel (a row's next panel may fall to
// another warp), and at the end write the CTA's rows of y once, coalesced. Every y is the
// same sum in the same order on every run: no atomics.
#include "twell_layout.cuh"
#include "mbarrier.cuh"

using namespace twell;

namespace {

constexpr int kCluster = 8;  // CTAs that share each x panel
constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * kWarp;
constexpr int kThreads = kConsumers + kWarp;
constexpr int kRounds = 4;    // rounds of 32 entries a warp takes at once
constexpr int kHeader = 16;   // words before a run's: its warps' starts, then its length
constexpr unsigned kSentinel = 0xffffffffu;

#ifndef TWELL_PANELS_MULTICAST
#define TWELL_PANELS_MULTICAST 1
#endif
#ifndef TWELL_PANELS_COMPUTE
#define TWELL_PANELS_COMPUTE 1
#endif
#ifndef TWELL_PANELS_LOCAL_DONE
#define TWELL_PANELS_LOCAL_DONE 1
#endif
#ifndef TWELL_PANELS_SHAPE
// Per value size: x bytes a panel holds, the stages of the ring, the entries a stage holds
// and the rows a CTA owns (their sums stay in shared memory), so that the ring and the sums
// fit the 227 KB of an SM (twell/_cuda/_panels.py: SHAPES).
#define TWELL_PANELS_SHAPE(size)                                                  \
  (size) == 8 ? PanelConfig{32768, 3, 1360, 8192}                                \
              : (size) == 4 ? PanelConfig{32768, 3, 3072, 8192}                  \
                            : PanelConfig{32768, 4, 2560, 8192}
#endif

struct PanelConfig {
  int panel_bytes, stages, run_cap, rows;
};

__host__ __device__ constexpr int log2_of(int v) {
  int bits = 0;
  while ((1 << bits) < v) ++bits;
  return bits;
}

template <typename T> struct PanelShape {
  using Acc = typename Value<T>::Acc;
  static constexpr PanelConfig kConfig = TWELL_PANELS_SHAPE(static_cast<int>(sizeof(T)));
  static constexpr int kPanelBytes = kConfig.panel_bytes;
  static constexpr int kStages = kConfig.stages;
  static constexpr int kRunCap = kConfig.run_cap;
  static constexpr int kRows = kConfig.rows;
  static constexpr int kWidth = kPanelBytes / static_cast<int>(sizeof(T));
  static constexpr int kColBits = log2_of(kWidth);
  static constexpr int kValueBytes = kRunCap * static_cast<int>(sizeof(T));
  static constexpr int kStageBytes = kPanelBytes + kValueBytes + (kHeader + kRunCap) * 4;
  static constexpr int kSmem = kStages * kStageBytes + kRows * static_cast<int>(sizeof(Acc)) +
                               3 * kStages * 8;
  static_assert((1 << kColBits) == kWidth, "a panel is a power of two columns");
  static_assert(kStages + 1 <= kWarp, "the producer's starts reach kStages + 1 ahead");
  static_assert(kValueBytes % 16 == 0 && kStageBytes % 16 == 0, "16-byte copies");
  static_assert(kSmem <= 227 * 1024, "the ring and the sums fit an SM");
  static_assert((static_cast<long long>(kRows) << kColBits) <= 0xffffffffll,
                "a row and a column in 32 bits, the sentinel's row past kRows");
};

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// `bytes` (a multiple of 16) from global `src` to shared `dst` of every CTA of the cluster
// in `cta_mask`, completing on the mbarrier at offset `bar` of each.
__device__ __forceinline__ void bulk_copy_multicast(unsigned dst, const void* src,
                                                    unsigned bytes, unsigned bar,
                                                    unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "h"(cta_mask)
      : "memory");
}

// The same into this CTA only.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes)
               : "memory");
}

// The consumer warps' barrier (named barrier 1; the producer warp is not in it).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
}

template <typename T>
__device__ __forceinline__ void spmv_panels(const T* __restrict__ values,
                                            const unsigned* __restrict__ words,
                                            const long long* __restrict__ run_start,
                                            const long long* __restrict__ row0, int n_panels,
                                            long long n_cols, const T* __restrict__ x,
                                            T* __restrict__ y) {
  using S = PanelShape<T>;
  using Acc = typename S::Acc;
  constexpr int kStages = S::kStages;
  constexpr unsigned kColMask = (1u << S::kColBits) - 1u;
  constexpr unsigned kSentRow = kSentinel >> S::kColBits;
  extern __shared__ __align__(128) unsigned char smem[];
  Acc* const acc = reinterpret_cast<Acc*>(smem + kStages * S::kStageBytes);
  const unsigned bars = shared_address(smem) + kStages * S::kStageBytes +
                        S::kRows * static_cast<unsigned>(sizeof(Acc));
  const auto full = [&](int s) { return bars + 8u * s; };
  const auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  const auto done = [&](int s) { return bars + 8u * (2 * kStages + s); };
  constexpr bool kLocalDone = TWELL_PANELS_MULTICAST && TWELL_PANELS_LOCAL_DONE;
  const auto x_stage = [&](int s) { return reinterpret_cast<const T*>(smem + s * S::kStageBytes); };
  const auto v_stage = [&](int s) {
    return reinterpret_cast<const T*>(smem + s * S::kStageBytes + S::kPanelBytes);
  };
  const auto w_stage = [&](int s) {
    return reinterpret_cast<const unsigned*>(smem + s * S::kStageBytes + S::kPanelBytes +
                                             S::kValueBytes);
  };
  const int tid = threadIdx.x, warp_id = tid / kWarp, lane = tid % kWarp;
  const unsigned rank = cluster_ctarank();
  const long long cta = blockIdx.x;
  const long long first_row = row0[cta];
  const int rows = static_cast<int>(row0[cta + 1] - first_row);
  const long long group0 = cta * n_panels;  // the CTA's first (CTA, panel) group

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full(s), 1);
      mbarrier_init(empty(s), kLocalDone ? kCluster
                              : (TWELL_PANELS_MULTICAST ? kCluster : 1) * kConsumerWarps);
      mbarrier_init(done(s), kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  for (int r = tid; r < rows; r += kThreads) acc[r] = Acc(0);
  cluster_sync();  // the peers' multicasts and arrivals find initialised barriers

  if (warp_id == kConsumerWarps) {
    // The producer warp walks the panels; lane 0 issues the copies. The runs' starts come
    // 32 at a time, each lane holding one, a chunk ahead (a start read from global memory
    // at each panel put its latency on every step of the ring).
    const auto start_at = [&](long long i) {
      const long long last = group0 + n_panels;
      return i <= last ? run_start[i] : run_start[last];
    };
    long long here = start_at(group0 + lane), next = start_at(group0 + kWarp + lane);
    for (int p = 0; p < n_panels; ++p) {
      const int s = p % kStages, q = p % kWarp;
      if (q == 0 && p > 0) {
        here = next;
        next = start_at(group0 + p + kWarp + lane);
      }
      // Run start i panels after p's chunk position q (i <= kWarp).
      const auto start = [&](int i) {
        const int at = q + i;
        const long long from_here = __shfl_sync(kFullMask, here, at % kWarp);
        const long long from_next = __shfl_sync(kFullMask, next, at % kWarp);
        return at < kWarp ? from_here : from_next;
      };
      const long long a = start(0), n = start(1) - a;
      const long long ahead = start(kStages), ahead_n = start(kStages + 1) - ahead;
      if (kLocalDone && p >= kStages) {
        if (lane == 0) mbarrier_wait(done(s), ((p / kStages) - 1) & 1);
        __syncwarp();
        if (lane < kCluster) mbarrier_arrive_cluster(empty(s), lane);
      }
      if (lane == 0) {
        const long long g = group0 + p;
        if (p + kStages < n_panels) {  // the run kStages panels ahead, into L2
          if (ahead_n > 0)
            bulk_prefetch_l2(values + ahead, static_cast<unsigned>(ahead_n * sizeof(T)));
          bulk_prefetch_l2(words + ahead + kHeader * (g + kStages),
                           static_cast<unsigned>((kHeader + ahead_n) * 4));
        }
        const long long c0 = static_cast<long long>(p) * S::kWidth;
        const long long width = n_cols - c0 < S::kWidth ? n_cols - c0 : S::kWidth;
        // The launcher pads x to a multiple of 16 bytes: the last panel's copy stays inside.
        const unsigned panel = static_cast<unsigned>((width * sizeof(T) + 15) / 16 * 16);
        const unsigned slice = (panel / kCluster + 15u) / 16u * 16u;
        const unsigned run_values = static_cast<unsigned>(n * sizeof(T));
        const unsigned run_words = static_cast<unsigned>((kHeader + n) * 4);
        mbarrier_wait(empty(s), ((p / kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(full(s), panel + run_values + run_words);
#if TWELL_PANELS_MULTICAST
        const unsigned lo = rank * slice, hi = lo + slice < panel ? lo + slice : panel;
        if (lo < hi)
          bulk_copy_multicast(shared_address(x_stage(s)) + lo,
                              reinterpret_cast<const unsigned char*>(x + c0) + lo, hi - lo,
                              full(s), static_cast<unsigned short>((1u << kCluster) - 1u));
#else
        (void)slice;
        bulk_copy(shared_address(x_stage(s)), x + c0, panel, full(s));
#endif
        if (n > 0) bulk_copy(shared_address(v_stage(s)), values + a, run_values, full(s));
        bulk_copy(shared_address(w_stage(s)), words + a + kHeader * g, run_words, full(s));
      }
      __syncwarp();
    }
  } else {
    for (int p = 0; p < n_panels; ++p) {
      const int s = p % kStages;
      mbarrier_wait(full(s), (p / kStages) & 1);
      __syncwarp();
      const T* const xs = x_stage(s);
      const T* const vs = v_stage(s);
      const unsigned* const header = w_stage(s);
      const unsigned* const ws = header + kHeader;
      // This warp's rows' entries of the panel: [t0, t1) of the run.
      const int t0 = static_cast<int>(header[warp_id]);
      const int t1 = static_cast<int>(header[warp_id + 1]);
      for (int base = t0; TWELL_PANELS_COMPUTE && base < t1; base += kRounds * kWarp) {
        Acc sum[kRounds];
        unsigned row[kRounds], heads[kRounds];
#pragma unroll
        for (int u = 0; u < kRounds; ++u) {
          const int j = base + u * kWarp + lane;
          const unsigned w = j < t1 ? ws[j] : kSentinel;
          row[u] = w >> S::kColBits;
          // Lanes past the warp's entries multiply nothing (0 * Inf would be NaN).
          sum[u] = row[u] != kSentRow
                       ? Value<T>::to_acc(vs[j]) * Value<T>::to_acc(xs[w & kColMask])
                       : Acc(0);
        }
#pragma unroll
        for (int u = 0; u < kRounds; ++u) {
          const unsigned before = __shfl_up_sync(kFullMask, row[u], 1);
          heads[u] = __ballot_sync(kFullMask, lane == 0 || before != row[u]);
          // The lane where this lane's row starts (its segment), then an inclusive scan
          // within segments: after step d a lane holds its segment's sum over 2d lanes.
          const int start = 31 - __clz(heads[u] & (kFullMask >> (31 - lane)));
#pragma unroll
          for (int d = 1; d < kWarp; d *= 2) {
            const Acc up = __shfl_up_sync(kFullMask, sum[u], d);
            if (lane - d >= start) sum[u] += up;
          }
        }
#pragma unroll
        for (int u = 0; u < kRounds; ++u) {
          const bool ends = lane == kWarp - 1 || ((heads[u] >> (lane + 1)) & 1u) != 0u;
          if (ends && row[u] != kSentRow) acc[row[u]] += sum[u];
          __syncwarp();  // a row continued in the next round: its lane reads this sum
        }
      }
#if TWELL_PANELS_MULTICAST
      if (kLocalDone) {
        if (lane == 0) mbarrier_arrive_cluster(done(s), rank);
      } else if (lane < kCluster) {
        mbarrier_arrive_cluster(empty(s), lane);
      }
#else
      if (lane == 0) mbarrier_arrive_cluster(empty(s), rank);
#endif
    }
    consumers_sync();  // every warp's sums are in
    for (int r = tid; r < rows; r += kConsumers) y[first_row + r] = Value<T>::from_acc(acc[r]);
  }
  __syncwarp();
  cluster_sync();  // no CTA leaves while its peers may still write or arrive on its barriers
}

}  // namespace

// The kernels, one per dtype (NVRTC builds this file without name expressions). Grid: the
// plan's CTAs, a multiple of kCluster; 288 threads; dynamic shared memory
// PanelShape<T>::kSmem bytes (the launcher's _panels.SMEM).
#define TWELL_SPMV_PANELS(name, T)                                                            \
  extern "C" __global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 1) \
      name(const T* __restrict__ values, const unsigned* __restrict__ words,                 \
           const long long* __restrict__ run_start, const long long* __restrict__ row0,      \
           int n_panels, long long n_cols, const T* __restrict__ x, T* __restrict__ y) {      \
    spmv_panels<T>(values, words, run_start, row0, n_panels, n_cols, x, y);                  \
  }

TWELL_SPMV_PANELS(twell_spmv_panels_f64, double)
TWELL_SPMV_PANELS(twell_spmv_panels_f32, float)
TWELL_SPMV_PANELS(twell_spmv_panels_f16, __half)
TWELL_SPMV_PANELS(twell_spmv_panels_bf16, __nv_bfloat16)
