"""Probe: the gated dense kernel's up phase bound. Variants of matmul_pack_sm90.cu (source
patched in memory): 'base'; 'stage' (the up k loop waits and releases each stage, no wgmma);
'sddmmE' (the up k loop does E emulated entry dot products a thread a stage from the staged
swizzled tiles instead of wgmma). Calls queued back to back, medians of rounds, and torch's
GEMM + the dense layer for scale. Paper's shape, bf16, gate ~1%."""
import sys, numpy as np, cupy, torch
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
from arrays import cast
import twell
from twell._cuda import _compile, _ffn

M, D, H = 16384, 2048, 5632
rng = cupy.random.default_rng(0)
x = rng.standard_normal((M, D), dtype=np.float32); x[:, 0] = 1.0
wg = rng.standard_normal((H, D), dtype=np.float32) / np.sqrt(D); wg[:, 0] = -2.33
wu = rng.standard_normal((H, D), dtype=np.float32) / np.sqrt(D)
x, wg, wu = (cast(cupy, a, twell.bfloat16) for a in (x, wg, wu))

STAGE = r"""
    const auto stage_loop = [&]() {
      float acc = 0.f;
      for (int i = 0; i < 128; ++i) d[i] = 0.f;
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int g = first + kt, s = g % kStages;
        mbarrier_wait(bars.full(s), (g / kStages) & 1);
        __syncwarp();
#if TWELL_PROBE_E > 0
        const T* const a_s = smem + s * (kAStage + kBStage);
        const T* const b_s = a_s + kAStage;
#pragma unroll
        for (int e = 0; e < TWELL_PROBE_E; ++e) {
          const int r = (tid * 37 + e * 11 + kt) & 127, c = (tid * 53 + e * 29 + kt * 3) & 255;
          const uint4* xr = reinterpret_cast<const uint4*>(a_s + r * 64);
          const uint4* wr = reinterpret_cast<const uint4*>(b_s + c * 64);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const uint4 xa = xr[j ^ (r & 7)], wb = wr[j ^ (c & 7)];
            const unsigned xs[4] = {xa.x, xa.y, xa.z, xa.w}, ws[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              acc = fmaf(__uint_as_float(xs[q] << 16), __uint_as_float(ws[q] << 16), acc);
              acc = fmaf(__uint_as_float(xs[q] & 0xffff0000u), __uint_as_float(ws[q] & 0xffff0000u), acc);
            }
          }
        }
#endif
#if TWELL_PROBE_G > 0
        {
          const unsigned a_b = ring + s * kStageBytes, b_b = a_b + kAStage * 2;
          const int warp = tid / 32 % 8, wl = lane;
          const int arow = (warp / 4) * 64 + (warp % 4) * 16 + (wl & 15);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            unsigned a[4];
            const unsigned aa = a_b + arow * 128 + (((2 * kk + (wl >> 4)) ^ (arow & 7)) << 4);
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(aa));
#pragma unroll
            for (int gg = 0; gg < TWELL_PROBE_G; ++gg) {
              const int col = ((8 * gg + (wl & 7)) * 37 + warp * 11) & 255;
              const unsigned ba = b_b + col * 128 + (((2 * kk + ((wl >> 3) & 1)) ^ (col & 7)) << 4);
              unsigned b0, b1;
              asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                           : "=r"(b0), "=r"(b1) : "r"(ba));
              float* dd = d + 4 * gg;
              float (&d4)[4] = *reinterpret_cast<float(*)[4]>(dd);
              Mma<T>::run(d4, a, b0, b1);
            }
          }
        }
#endif
        release(bars.empty(s));
      }
      first = (first + k_tiles) % (2 * kStages);
      if (acc == 1234.5f) d[0] += 1.f;
    };
"""
orig = _compile.source_text
def variant(e):
    ee, gg = (0, 0) if e is None else ((e, 0) if e >= 0 else (0, -e))
    def text(name):
        t = orig(name)
        if name != "matmul_pack_sm90.cu" or e is None:
            return t
        anchor = "    for (long long p = first_pair; p < pairs; p += pair_step) {\n      k_loop();"
        assert t.count(anchor) == 1
        t = t.replace(anchor, STAGE + anchor)
        up = "        } else {\n          k_loop();\n        }"
        assert t.count(up) == 1
        t = t.replace(up, "        } else {\n          stage_loop();\n        }")
        return f"#define TWELL_PROBE_E {ee}\n#define TWELL_PROBE_G {gg}\n" + t
    _compile.source_text = text
    _compile._arch_module.cache_clear()

def batch(fn, reps=20, rounds=5):
    fn(); cupy.cuda.Device().synchronize()
    out = []
    for _ in range(rounds):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        for _ in range(reps): fn()
        e.record(); e.synchronize()
        out.append(cupy.cuda.get_elapsed_time(s, e) / reps)
    return float(np.median(out))

tx, tg, tu = (torch.as_tensor(a.view(np.int16), device="cuda").view(torch.bfloat16) for a in (x, wg, wu))
res = {}
for rnd in range(2):
    for name, e in (("base", None), ("stage", 0), ("sddmm1", 1), ("mma G5", -5), ("mma G8", -8)):
        variant(e)
        res.setdefault(name, []).append(batch(lambda: _ffn.gated_dense(x, wg, wu)))
    res.setdefault("torch GEMM", []).append(batch(lambda: tx @ tg.T))
    res.setdefault("torch gate+up GEMMs", []).append(batch(lambda: (tx @ tg.T, tx @ tu.T)))
for k, v in res.items():
    print(f"{k:22s} " + " ".join(f"{t:.4f}" for t in v) + " ms")
