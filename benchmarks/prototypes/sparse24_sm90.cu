// Prototype, not shipped (docs/design.rst, "What the floors leave open"): y = A @ w^T with A (M x K) 2:4 structured sparse, compressed to (M x K/2) plus
// metadata, on Hopper sparse tensor cores (wgmma.mma_async.sp m64n256k32). w is (N x K),
// nn.Linear layout (K-major B). bf16 in, fp32 accumulate, bf16 out.
// Block tile 128 x 256 x 64 (logical k), clusters of 2 CTAs along M sharing w (multicast),
// persistent, producer warp (TMA + bulk copy of metadata) + 2 consumer warpgroups.
// Stage: A 128 rows x 32 compressed values (64-byte rows, 64B swizzle) 8 KB, w 256 x 64
// (128-byte rows, 128B swizzle) 32 KB, metadata 1 KB (thread order).
#include "tma.cuh"

using namespace twell;

#ifndef SP_MODE
#define SP_MODE 0  // 0: normal, 1: loads only (no wgmma), 2: wgmma only (no loads past the ring)
#endif
#ifndef SP_CL4
#define SP_CL4 0  // 1: clusters of 2 x 2 CTAs (x and w halves multicast), else 2 along M
#endif
#ifndef SP_DENSE
#define SP_DENSE 0  // 1 (with SP_MODE 2): 4 dense wgmma k16 a stage instead, for calibration
#endif
#ifndef SP_GROUP
#define SP_GROUP 1  // stages whose wgmma run as one group between waits
#endif

namespace {

constexpr int kS = 5;
#ifndef SP_CLM
#define SP_CLM 2  // CTAs of a cluster along M (sharing w), without SP_CL4
#endif
constexpr int kCl = SP_CL4 ? 4 : SP_CLM;
constexpr int kBM_ = 128, kBN_ = 256, kBKL = 64;
constexpr int kAB = kBM_ * kBKL / 2 * 2;   // 8192 bytes
constexpr int kBB = kBN_ * kBKL * 2;       // 32768 bytes
constexpr int kMB = 1024;                   // metadata bytes per CTA stage
constexpr int kStage = kAB + kBB + kMB;     // 41984 (41 KB: keeps 1024 alignment)
constexpr int kCW = 8;                      // consumer warps

__device__ __forceinline__ unsigned long long desc64(unsigned addr) {
  const unsigned long long start = (addr & 0x3ffffu) >> 4;
  return start | (1ull << 16) | ((512ull >> 4) << 32) | (2ull << 62);
}
__device__ __forceinline__ unsigned long long desc128(unsigned addr) {
  const unsigned long long start = (addr & 0x3ffffu) >> 4;
  return start | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void bulk_copy_multicast(unsigned dst, const void* src,
                                                    unsigned bytes, unsigned bar,
                                                    unsigned short mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1], %2, [%3], %4;\n"
      ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(src)), "r"(bytes), "r"(bar),
      "h"(mask)
      : "memory");
}

__device__ __forceinline__ void wgmma_sp(float (&d)[128], unsigned long long a,
                                         unsigned long long b, unsigned e) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %131, 0;\n"
      "wgmma.mma_async.sp.sync.aligned.m64n256k32.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, %130, 0, accumulate, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(e), "r"(1));
}

}  // namespace

// meta: per (128-row block, logical k tile of 64) a 1 KB chunk of 256 words, chunk index
// block * k_tiles + kt; word ((wg * 2 + kk) * 4 + warp) * 16 + (lane / 4) * 2 + lane % 2 is the
// metadata register of lanes (lane / 4) * 4 + {lane % 2, lane % 2 + 2} of that warp.
extern "C" __global__ void __cluster_dims__(kCl, 1, 1) __launch_bounds__(288, 1)
    sparse24_gemm_bf16(const __grid_constant__ TensorMap tmap_a,
                       const __grid_constant__ TensorMap tmap_w,
                       const unsigned* __restrict__ meta, long long n_rows, long long n_cols,
                       long long depth, __nv_bfloat16* __restrict__ y) {
  const int tid = threadIdx.x, warp_id = tid / 32, lane = tid % 32;
  const unsigned rank = cluster_ctarank();
#if SP_CL4
  // Quads: 2 row blocks x 2 column blocks; rank = rm + 2 rn.
  const int rm = rank & 1, rn = rank >> 1;
  const long long col_blocks = n_cols / (2 * kBN_);
  const long long pairs = n_rows / (2 * kBM_) * col_blocks;
  const auto row0 = [&](long long p) { return (p / col_blocks * 2 + rm) * kBM_; };
  const auto col0 = [&](long long p) { return (p % col_blocks * 2 + rn) * kBN_; };
  const unsigned a_peer = rm + 2 * (1 - rn), b_peer = (1 - rm) + 2 * rn;
  constexpr int kWriters = 3;  // this CTA, the x half's peer, the w half's peer
#else
  const long long col_blocks = n_cols / kBN_;
  const long long row_pairs = n_rows / (kCl * kBM_);
  const long long pairs = row_pairs * col_blocks;
  const auto row0 = [&](long long p) { return (p / col_blocks * kCl + rank) * kBM_; };
  const auto col0 = [&](long long p) { return p % col_blocks * kBN_; };
  constexpr int kWriters = kCl;
#endif
  const long long first_pair = cluster_id(), pair_step = cluster_count();
  const int k_tiles = static_cast<int>(depth / kBKL);
  unsigned char* const smem = aligned_smem<unsigned char>();
  const unsigned ring = smem_address(smem);
  const StageBarriers<kS> bars{ring + kS * kStage};

  if (tid == 0) bars.init(1, kWriters * kCW);
  cluster_sync();

  if (warp_id >= kCW) {
    if (warp_id == kCW && lane == 0) {
      int g = 0;
      for (long long p = first_pair; p < pairs; p += pair_step) {
        const int m0 = static_cast<int>(row0(p)), n0 = static_cast<int>(col0(p));
        const unsigned char* mrow =
            reinterpret_cast<const unsigned char*>(meta) + (m0 / kBM_) * k_tiles * kMB;
        for (int kt = 0; kt < k_tiles; ++kt, g = (g + 1) % (2 * kS)) {
          const int s = g % kS;
          mbarrier_wait(bars.empty(s), ((g / kS) & 1) ^ 1);
          if (SP_MODE == 2 && (p != first_pair || kt >= kS)) {
            mbarrier_arrive_expect_tx(bars.full(s), 0);
            continue;
          }
          mbarrier_arrive_expect_tx(bars.full(s), kStage);
          const unsigned a_s = ring + s * kStage;
#if SP_CL4
          const unsigned short a_mask = (1u << rm) | (1u << (rm + 2));
          const unsigned short b_mask = (3u << (2 * rn));
          tma_load_2d_multicast(a_s + rn * (kAB / 2), &tmap_a, bars.full(s), kt * (kBKL / 2),
                                m0 + rn * (kBM_ / 2), a_mask);
          tma_load_2d_multicast(a_s + kAB + rm * (kBB / 2), &tmap_w, bars.full(s), kt * kBKL,
                                n0 + rm * (kBN_ / 2), b_mask);
          bulk_copy_multicast(a_s + kAB + kBB + rn * (kMB / 2), mrow + kt * kMB + rn * (kMB / 2),
                              kMB / 2, bars.full(s), a_mask);
#else
          tma_load_2d(a_s, &tmap_a, bars.full(s), kt * (kBKL / 2), m0);
          tma_load_2d_multicast(a_s + kAB + rank * (kBB / kCl), &tmap_w, bars.full(s),
                                kt * kBKL, n0 + static_cast<int>(rank) * (kBN_ / kCl),
                                static_cast<unsigned short>((1u << kCl) - 1));
          bulk_copy(a_s + kAB + kBB, mrow + kt * kMB, kMB, bars.full(s));
#endif
        }
      }
    }
    __syncwarp();
  } else {
    const int wg = tid / 128, w = (tid % 128) / 32;
#if SP_CL4
    const unsigned target = lane == 0 ? rank : lane == 1 ? a_peer : b_peer;
    const auto release = [lane, target](unsigned bar) {
      if (lane < kWriters) mbarrier_arrive_cluster(bar, target);
    };
#else
    const auto release = [lane](unsigned bar) {
      if (lane < kCl) mbarrier_arrive_cluster(bar, lane);
    };
#endif
    const int word = ((wg * 2) * 4 + w) * 16 + (lane / 4) * 2 + (lane % 2);
    float d[128];
    int first = 0;
    for (long long p = first_pair; p < pairs; p += pair_step) {
#pragma unroll
      for (int i = 0; i < 128; ++i) d[i] = 0.0f;
      // wgmma.sp reads its metadata register asynchronously: no instruction may define a
      // register of an in-flight group's metadata (ptxas serialises such groups), so each
      // group of SP_GROUP stages loads all its words first, then waits for completion.
      for (int k0 = 0; k0 < k_tiles; k0 += SP_GROUP) {
        // The prototype takes k_tiles % SP_GROUP == 0 (a divergent group serialises).
        unsigned e[2 * SP_GROUP];
#pragma unroll
        for (int i = 0; i < SP_GROUP; ++i) {
          const int g = first + k0 + i, s = g % kS;
          mbarrier_wait(bars.full(s), (g / kS) & 1);
          const unsigned* ms = reinterpret_cast<const unsigned*>(smem + s * kStage + kAB + kBB);
          e[2 * i] = ms[word];
          e[2 * i + 1] = ms[word + 64];
        }
        __syncwarp();
        fence_operands(d);
        if (SP_MODE != 1) {
          asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
          for (int i = 0; i < SP_GROUP; ++i) {
            const unsigned a_s = ring + ((first + k0 + i) % kS) * kStage;
#if SP_DENSE
            // The same logical depth as dense k16 steps (A's words reused: timing only).
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
              Wgmma<__nv_bfloat16>::m64n256k16(d, desc64(a_s + wg * 64 * 64) + 2 * (kk & 1),
                                               desc128(a_s + kAB) + 2 * kk);
#else
            wgmma_sp(d, desc64(a_s + wg * 64 * 64), desc128(a_s + kAB), e[2 * i]);
            wgmma_sp(d, desc64(a_s + wg * 64 * 64) + 2, desc128(a_s + kAB) + 4, e[2 * i + 1]);
#endif
          }
          asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
          asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        } else {
#pragma unroll
          for (int i = 0; i < 2 * SP_GROUP; ++i) d[i] += __uint_as_float(e[i]);
        }
        fence_operands(d);
#pragma unroll
        for (int i = 0; i < SP_GROUP; ++i) release(bars.empty((first + k0 + i) % kS));
      }
      first = (first + k_tiles) % (2 * kS);
      // Epilogue: rows r, r + 8 of this warp's 16; columns 8 j + 2 q, + 1.
      const long long r = row0(p) + wg * 64 + 16 * w + lane / 4;
      const long long c = col0(p) + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        __nv_bfloat162 lo = __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
        __nv_bfloat162 hi = __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
        *reinterpret_cast<__nv_bfloat162*>(y + r * n_cols + c + 8 * j) = lo;
        *reinterpret_cast<__nv_bfloat162*>(y + (r + 8) * n_cols + c + 8 * j) = hi;
      }
    }
  }
  __syncwarp();
  cluster_sync();
}
