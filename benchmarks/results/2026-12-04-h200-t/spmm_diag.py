"""Where twell_spmm_sm90's time goes: the kernel alone (B^T given) in diagnostic forms built
from its source text, interleaved in one process with cuBLAS on the dense A, on the paper's
down projection (M = 16384, K = 5632, N = 2048, bf16, uniform activations), two passes.

Forms: the second version (scratch/spmm_sm90_v2.cu: a predicated store per slot and slab), the
current one (rounds of one store per lane with entries left), and the current one without the
overflow entries, without any entries (zeros only), without the proxy fence, and with A
brought dense by TMA instead of built (this kernel's GEMM: its floor); at 99% also the 32-slot
kernel. Only the current form's results are checked. Then the
launcher's steps around the kernel (B^T copy, the non-finite check).

Run from the repository root: PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-t/spmm_diag.py
"""

import pathlib
import sys
import tempfile

import cupy
import numpy as np

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend, _kernels  # noqa: E402

M, K, N = 16384, 5632, 2048
SRC = _kernels.source_dir()
SLOT_ROUND = "if (!__any_sync(kFullMask, mine)) break;"
OVERFLOW = "while (next_col < k0 + kBK) {"
FENCE = 'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");'
ZEROS = "for (int j = 0; j < 8; ++j) st_shared_zero16(a_row + (((j ^ r) & 7) << 4));"
# "A by TMA": the builders write nothing; the first one also brings the dense A's box by TMA
# (this kernel's GEMM with both operands as the D2T loads them).
TMA_A = [
    ("    const TensorMap& tmap_bt, const int* __restrict__ counts,",
     "    const TensorMap& tmap_a, const TensorMap& tmap_bt, const int* __restrict__ counts,"),
    ("      const __grid_constant__ TensorMap tmap_bt, const int* __restrict__ counts,",
     "      const __grid_constant__ TensorMap tmap_a, const __grid_constant__ TensorMap tmap_bt, "
     "const int* __restrict__ counts,"),
    ("    spmm_sm90<T, CHUNK>(tmap_bt, counts,",
     "    spmm_sm90<T, CHUNK>(tmap_a, tmap_bt, counts,"),
    ("          mbarrier_arrive_expect_tx(bars.full(s), kBBytes);",
     "          mbarrier_arrive_expect_tx(bars.full(s), kBBytes + kAStage * 2);\n"
     "          tma_load_2d(a_s, &tmap_a, bars.full(s), kt * kBK, static_cast<int>(m0));"),
    (ZEROS, ""), (SLOT_ROUND, "break;"), (OVERFLOW, "while (false) {")]


def text(path, *patches):
    """The source at ``path`` with its cuda_src headers inlined, each (old, new) patch applied
    (each must match), and only the bf16 kernels instantiated."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        for h in SRC.glob("*.cuh"):
            (folder / h.name).write_text(h.read_text())
        (folder / "k.cu").write_text(pathlib.Path(path).read_text())
        out = []
        _kernels._inline(folder, "k.cu", out, set())
    code = "\n".join(out) + "\n"
    for old, new in patches:
        assert old in code, old
        code = code.replace(old, new)
    f16 = "TWELL_SPMM_SM90(twell_spmm_sm90_f16"
    return "\n".join(line for line in code.splitlines() if not line.startswith(f16))


def load(code, tag):
    module = _kernels.nvrtc_module(code, f"spmm_{tag}.cu", "sm_90a")
    return {c: _kernels.ArchKernel(module.get_function(f"twell_spmm_sm90_bf16_c{c}"), module)
            for c in (8, 16, 32)}


forms = {
    "v2 (32 predicated stores)": load(text("scratch/spmm_sm90_v2.cu"), "v2"),
    "current": load(text(SRC / "spmm_sm90.cu"), "cur"),
    "no overflow": load(text(SRC / "spmm_sm90.cu", (OVERFLOW, "while (false) {")), "noov"),
    "zeros only": load(text(SRC / "spmm_sm90.cu", (SLOT_ROUND, "break;"),
                            (OVERFLOW, "while (false) {")), "zeros"),
    "no fence": load(text(SRC / "spmm_sm90.cu", (FENCE, "")), "nofence"),
    "A by TMA (dense A)": load(text(SRC / "spmm_sm90.cu", *TMA_A), "tmaa"),
}
SMEM = _cupy_backend._MATMUL_SM90_SMEM


def launch(kernels, a, bt, out, chunk=None, z=None):
    p = a._parts
    slots = p.data.shape[2]
    chunk = chunk or next(c for c in (8, 16, 32, 10**9) if slots <= c)
    kernel = kernels[min(chunk, 32)]
    kernel.max_dynamic_shared_size_bytes = SMEM
    maps = (_kernels.tensor_map_2d(bt, 64, 256),)
    if z is not None:
        maps = (_kernels.tensor_map_2d(z, 64, 128), *maps)
    kernel((-(-M // 128) * -(-N // 256),), (384,), (
        *maps, p.counts, p.data, p.indices, p.overflow_indptr,
        p.overflow_indices, p.overflow_data, np.int64(M), np.int64(N), np.int64(K),
        np.int32(a.tile_width), np.int32(slots), out), shared_mem=SMEM)


rng = np.random.default_rng(0)
dt = twell.bfloat16
b = (cupy.asarray(rng.standard_normal((K, N), dtype=np.float32)) / np.sqrt(K)).astype(dt)
bt = cupy.ascontiguousarray(b.T)
out = cupy.empty((M, N), dtype=dt)
results = []
for s in (0.999, 0.99, 0.95, 0.90):
    z = _dev.activations(M, K, 2048, s, rng).astype(dt)
    a = twell.TwELLMatrix(z)
    want = z.astype(np.float32) @ b.astype(np.float32)
    out.fill(np.nan)
    launch(forms["current"], a, bt, out)
    err = float(cupy.abs(out.astype(np.float32) - want).max() / cupy.abs(want).max())
    ways = {f: (lambda k=k, a=a, z=z, f=f: launch(k, a, bt, out, z=z if "TMA" in f else None))
            for f, k in forms.items()}
    if s == 0.99:
        ways["current, 32-slot kernel"] = lambda a=a: launch(forms["current"], a, bt, out, 32)
    ways["cuBLAS dense"] = lambda z=z: z @ b
    times = {w: [] for w in ways}
    for _ in range(2):
        for w, f in ways.items():
            times[w].append(_dev.timed(f, 20))
    results.append((s, a.slots, a.overflow_nnz, err, times))
    del z, a, want

steps = {"cupy.ascontiguousarray(b.T)": lambda: cupy.ascontiguousarray(b.T),
         "b.copy()": lambda: b.copy(), "_nonfinite(b)": lambda: _cupy_backend._nonfinite(b)}
step_ms = {w: _dev.timed(f, 20) for w, f in steps.items()}

print(f"\nH200 twell_spmm_sm90 forms, M={M} K={K} N={N} bf16; kernel alone, ms, two passes")
for s, slots, over, err, times in results:
    print(f"\nsparsity {s}: slots {slots}, overflow {over}, current form's max rel err {err:.2e}")
    for w, t in times.items():
        print(f"  {w:28s} " + " / ".join(f"{x:.3f}" for x in t))
print("\nlauncher steps (ms): " + ", ".join(f"{w} {t:.3f}" for w, t in step_ms.items()))
