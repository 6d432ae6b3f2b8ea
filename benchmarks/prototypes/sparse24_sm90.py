"""Prototype, not shipped (docs/design.rst): 2:4 sparse tensor-core GEMM y = A @ w.T (A 2:4 structured, compressed).

Checks the metadata layout hypotheses on small shapes against float64, then times the
paper's down projection (M=16384, N=2048, K=5632) against cuBLAS's dense GEMM. Run from the
repository root on an H100/H200: ``PYTHONPATH=. python benchmarks/prototypes/sparse24_sm90.py``.
"""
import ctypes, math, sys, time
import numpy as np, cupy, torch
from twell._cuda import _compile, _tma

SRC = open("benchmarks/prototypes/sparse24_sm90.cu").read().replace('#include "tma.cuh"', "")
out = []
_compile._inline(_compile.source_dir(), "tma.cuh", out, set())
CODE = "\n".join(out) + "\n" + SRC
KS, KSTAGE = 5, 41984
SMEM = KS * KSTAGE + 2 * KS * 8 + 1024

def build(mode, group, cl):
    size = int(cl[1])
    code = (f"#define SP_MODE {mode}\n#define SP_GROUP {group}\n#define SP_CL4 {int(cl == 'q4')}\n"
            f"#define SP_CLM {size if cl[0] == 'm' else 2}\n" + CODE)
    mod = _compile.nvrtc_module(code, "sparse24.cu", "sm_90a")
    k = _compile.ArchKernel(mod.get_function("sparse24_gemm_bf16"), mod)
    k.max_dynamic_shared_size_bytes = SMEM
    k.cl = cl
    k.clusters = k.max_active_clusters(288, SMEM, size) or 132 // size
    return k


KEYS = ((0, 1, "m2"), (0, 2, "m2"), (0, 2, "m4"), (2, 1, "m2"), (2, 2, "m2"), (2, 4, "m2"),
        (1, 1, "m4"))
KERNELS = {key: build(*key) for key in KEYS}
kern = KERNELS[(0, 1, "m2")]
CLUSTERS = None
print("max active clusters", {k: v.clusters for k, v in KERNELS.items()}, flush=True)


def tmap(array, box_cols, box_rows, swizzle):
    rows, cols = array.shape
    encode = _tma._encode_tiled()
    raw = (ctypes.c_uint8 * 256)()
    buf = ctypes.addressof(raw)
    al = buf + (-buf) % 64
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    r = encode(ctypes.c_void_p(al), 9, 2, ctypes.c_void_p(array.data.ptr), (u64 * 2)(cols, rows),
               (u64 * 1)(cols * 2), (u32 * 2)(box_cols, box_rows), (u32 * 2)(1, 1), 0, swizzle,
               3, 0)
    assert r == 0, r
    return np.frombuffer(ctypes.string_at(al, 128), dtype=np.dtype((np.void, 128))).copy()


def bf(a):
    return cupy.from_dlpack(torch.as_tensor(np.ascontiguousarray(a), device="cuda").to(torch.bfloat16))


def make_24(m, k, density, rng, full=False):
    """A dense (m, k) float32 matrix, 2:4 compliant, values bf16-exact."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    if full:  # exactly two non-zeros per group, random positions
        g = a.reshape(m, k // 4, 4)
        keep = np.argsort(rng.random((m, k // 4, 4)), axis=2)[:, :, :2]
        mask = np.zeros_like(g, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=2)
        a = np.where(mask, g, 0).reshape(m, k)
    else:
        a *= rng.random((m, k)) < density
        g = a.reshape(m, k // 4, 4)
        over = (g != 0).sum(axis=2) > 2
        g[over] = 0  # the prototype drops violating groups (the layer keeps them apart)
        a = g.reshape(m, k)
    return torch.as_tensor(a).to(torch.bfloat16).to(torch.float32).numpy()


def compress(a):
    """(values (m, k/2) float32, nibbles (m, k/4) uint8: i0 | i1 << 2)."""
    m, k = a.shape
    g = a.reshape(m, k // 4, 4)
    nz = g != 0
    # score: non-zeros first (by position), then zeros by position; take 2, sort them
    score = np.where(nz, 0, 4) + np.arange(4)
    idx = np.sort(np.argsort(score, axis=2)[:, :, :2], axis=2)
    vals = np.take_along_axis(g, idx, axis=2).reshape(m, k // 2)
    nib = (idx[:, :, 0] | (idx[:, :, 1] << 2)).astype(np.uint32)
    return vals, nib


def meta_words(nib, hyp):
    m, kg = nib.shape
    k = kg * 4
    h16 = nib.reshape(m, k // 16, 4)
    if hyp == "H4":
        h16 = ((h16 >> 2) | ((h16 & 3) << 2))
    h16 = (h16[:, :, 0] | (h16[:, :, 1] << 4) | (h16[:, :, 2] << 8) | (h16[:, :, 3] << 12))
    nb, kt = m // 128, k // 64
    B, KT, WG, KK, W, T2, T0 = np.ix_(np.arange(nb), np.arange(kt), np.arange(2), np.arange(2),
                                      np.arange(4), np.arange(8), np.arange(2))
    R = B * 128 + WG * 64 + 16 * W + T2
    if hyp in ("H1", "H3", "H4"):
        c = KT * 4 + KK * 2 + T0
        lo, hi = h16[R, c], h16[R + 8, c]
        if hyp == "H3":
            lo, hi = hi, lo
        words = lo | (hi << 16)
    elif hyp == "H2":
        row = R + 8 * T0
        c = KT * 4 + KK * 2
        words = h16[row, c] | (h16[row, c + 1] << 16)
    return cupy.asarray(np.ascontiguousarray(words, dtype=np.uint32).reshape(-1))


def run(a_c, w, meta, m, n, k, y=None, kern=kern):
    if y is None:
        y = cupy.from_dlpack(torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16))
    cl = kern.cl
    size = int(cl[1])
    if cl == "q4":
        units, a_rows, w_rows = (m // 256) * (n // 512), 64, 128
    else:
        units, a_rows, w_rows = (m // (128 * size)) * (n // 256), 128, 256 // size
    grid = size * min(units, CLUSTERS or kern.clusters)
    ma = tmap(a_c, 32, a_rows, 2)  # 64B swizzle
    mw = tmap(w, 64, w_rows, 3)    # 128B swizzle
    kern((grid,), (288,), (ma, mw, meta, np.int64(m), np.int64(n), np.int64(k), y),
         shared_mem=SMEM)
    return y


def check(m, n, k, hyp, full, rng, clusters=None, kern=kern):
    global CLUSTERS
    saved = CLUSTERS
    CLUSTERS = clusters
    a = make_24(m, k, 0.3, rng, full=full)
    w = (rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    w = torch.as_tensor(w).to(torch.bfloat16).to(torch.float32).numpy()
    vals, nib = compress(a)
    y = run(bf(vals), bf(w), meta_words(nib, hyp), m, n, k, kern=kern)
    cupy.cuda.Device().synchronize()
    CLUSTERS = saved
    got = torch.from_dlpack(y).float().cpu().numpy()
    ref = a.astype(np.float64) @ w.T.astype(np.float64)
    err = np.abs(got - ref) / (np.abs(ref) + 1e-2)
    bad = ~(err < 2e-2)
    return float(np.nanmax(err)) if not np.isnan(got).any() else float("nan"), int(bad.sum()), bad.size


rng = np.random.default_rng(0)
ok_hyp = "H1"
for key in ((0, 1, "m2"), (0, 2, "m2"), (0, 2, "m4")):
    for shape, cl in (((1024, 512, 1024), 2), ((2048, 2048, 5632), None)):
        res = check(*shape, ok_hyp, False, rng, clusters=cl, kern=KERNELS[key])
        print(f"{key} {shape} clusters={cl}: max rel err {res[0]:.3g}, bad {res[1]}/{res[2]}",
              flush=True)

# The paper's down projection, built compressed on the GPU: about 1% non-zero.
M, N, K = 16384, 2048, 5632
g = torch.Generator(device="cuda").manual_seed(0)
combos = torch.tensor([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)], device="cuda")
pick = combos[torch.randint(0, 6, (M, K // 4), device="cuda", generator=g)]
vals = torch.randn(M, K // 2, device="cuda", generator=g)
vals = torch.where(torch.rand(M, K // 2, device="cuda", generator=g) < 0.02, vals, 0.0)
vals = vals.to(torch.bfloat16)
h = torch.zeros(M, K // 4, 4, device="cuda", dtype=torch.bfloat16)
h.scatter_(2, pick, vals.view(M, K // 4, 2))
h = h.view(M, K)
nib = (pick[..., 0] | (pick[..., 1] << 2)).to(torch.int32).cpu().numpy().astype(np.uint32)
a_c = cupy.from_dlpack(vals)
meta = meta_words(nib, ok_hyp)
w = (torch.randn(N, K, device="cuda", generator=g) / math.sqrt(K)).to(torch.bfloat16)
wc = cupy.from_dlpack(w)
ref = (h.float() @ w.float().T)
print("density", float((h != 0).float().mean()), flush=True)
for key in ((0, 1, "m2"), (0, 2, "m2"), (0, 2, "m4")):
    y = run(a_c, wc, meta, M, N, K, kern=KERNELS[key])
    got = torch.from_dlpack(y).float()
    bad = int(((got - ref).abs() > 0.02 * ref.abs() + 1e-2).sum())
    print(f"paper shape {key}: max abs err", float((got - ref).abs().max()), "ref max",
          float(ref.abs().max()), "bad", bad, flush=True)


def timeit(fn, n=20, rounds=5):
    fn(); torch.cuda.synchronize()
    res = []
    for _ in range(rounds):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n):
            fn()
        e1.record(); e1.synchronize(); res.append(e0.elapsed_time(e1) / n)
    return sorted(res)[len(res) // 2]


yy = cupy.from_dlpack(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
out_t = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
names = {k: ("", "loads only ", "wgmma only ")[k[0]] + f"G{k[1]} {k[2]}" for k in KEYS}
for rnd in range(2):
    t_dn = timeit(lambda: torch.mm(h, w.T, out=out_t))
    line = [f"round {rnd}: torch dense {t_dn:.4f} ms"]
    for key, kk in KERNELS.items():
        t = timeit(lambda: run(a_c, wc, meta, M, N, K, yy, kern=kk))
        line.append(f"{names[key]} {t:.4f} ({t_dn / t:.3f}x)")
    print("; ".join(line), flush=True)
