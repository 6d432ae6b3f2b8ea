"""Prototype for #39: an SpMV plan whose warps own rows and stream their entries ordered by
(column band, row), so that the warps of an SM sweep x together and gather it from L1.
Non-deterministic (shared atomics): measures the potential only. Against torch cuSPARSE.
Usage: PYTHONPATH=. python probe/spmv_band.py"""
import sys, pathlib, itertools
import numpy as np, cupy, cupyx.scipy.sparse as csp, torch
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent)); sys.path.insert(0, str(HERE.parent / "benchmarks"))
from workloads import powerlaw_graph
from gpu_solve import laplacian

SRC = r"""
template <typename T, int U>
__global__ void band_spmv(const int* __restrict__ col, const unsigned short* __restrict__ rl,
                          const T* __restrict__ val, const long long* __restrict__ woff,
                          const long long* __restrict__ bfirst, const T* __restrict__ x,
                          T* __restrict__ yv) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* acc = reinterpret_cast<T*>(smem);
  const int nw = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long v0 = bfirst[blockIdx.x];
  const int nrows = (int)(bfirst[blockIdx.x + 1] - v0);
  for (int i = threadIdx.x; i < nrows; i += blockDim.x) acc[i] = T(0);
  __syncthreads();
  const long long gw = (long long)blockIdx.x * nw + w;
  const long long s = woff[gw], e = woff[gw + 1];
  for (long long p0 = s; p0 < e; p0 += 32 * U) {
    int c[U]; int r[U]; T v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long p = p0 + u * 32 + lane;
      r[u] = -1;
      if (p < e) { c[u] = col[p]; r[u] = rl[p]; v[u] = val[p]; }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r[u] >= 0) atomicAdd(&acc[r[u]], v[u] * x[c[u]]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nrows; i += blockDim.x) yv[v0 + i] = acc[i];
}
template <typename T>
__global__ void band_fixup(const long long* __restrict__ vptr, long long m,
                           const T* __restrict__ yv, T* __restrict__ y) {
  const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= m) return;
  const long long s = vptr[r], e = vptr[r + 1];
  T a = yv[s];
  for (long long k = s + 1; k < e; ++k) a += yv[k];
  y[r] = a;
}
"""
EXPRS = [f"band_spmv<{t}, {u}>" for t in ("float", "double") for u in (2, 4, 8)] + [f"band_fixup<{t}>" for t in ("float", "double")]
MOD = cupy.RawModule(code=SRC, options=("-std=c++17",), name_expressions=EXPRS)
CT = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
N_SM = cupy.cuda.Device().attributes["MultiProcessorCount"]


def plan(csr, bps, nw, W, C):
    m, n = csr.shape
    nnz = csr.nnz
    indptr = csr.indptr.astype(cupy.int64)
    deg = cupy.diff(indptr)
    nch = cupy.maximum(1, -(-deg // C))
    vptr = cupy.zeros(m + 1, dtype=cupy.int64); vptr[1:] = cupy.cumsum(nch)
    V = int(vptr[-1])
    coo = csr.tocoo()
    row = coo.row.astype(cupy.int64)
    e = cupy.arange(nnz, dtype=cupy.int64)
    vent = vptr[row] + (e - indptr[row]) // C
    vcount = cupy.bincount(vent, minlength=V)
    cum = cupy.zeros(V + 1, dtype=cupy.int64); cum[1:] = cupy.cumsum(vcount)
    grid = N_SM * bps
    T = grid * nw
    targets = (cupy.arange(T + 1, dtype=cupy.int64) * nnz) // T
    wfv = cupy.searchsorted(cum, targets, side="left").astype(cupy.int64)
    wfv[0] = 0; wfv[-1] = V
    woff = cum[wfv]
    bfirst = wfv[::nw].copy()
    if bfirst.size < grid + 1:
        bfirst = cupy.concatenate([bfirst, cupy.asarray([V])])
    wv = cupy.searchsorted(wfv, vent, side="right") - 1
    blk = wv // nw
    rloc = vent - bfirst[blk]
    Rmax = int(cupy.diff(bfirst).max())
    assert Rmax <= 65535, Rmax
    nb = -(-n // W)
    key = (wv * nb + coo.col.astype(cupy.int64) // W) * (Rmax + 1) + rloc
    order = cupy.argsort(key)
    return dict(col=coo.col[order].astype(cupy.int32), rl=rloc[order].astype(cupy.uint16),
                val=coo.data[order], woff=woff, bfirst=bfirst, grid=grid, R=Rmax, nw=nw, m=m,
                vptr=vptr, V=V)


def runner(p, dt, U):
    fn = MOD.get_function(f"band_spmv<{CT[np.dtype(dt)]}, {U}>")
    fix = MOD.get_function(f"band_fixup<{CT[np.dtype(dt)]}>")
    shm = p["R"] * np.dtype(dt).itemsize
    yv = cupy.empty(p["V"], dtype=dt)
    m = p["m"]
    def run(x, y, fixup=True):
        fn((p["grid"],), (32 * p["nw"],), (p["col"], p["rl"], p["val"], p["woff"], p["bfirst"],
           x, yv), shared_mem=shm)
        if fixup:
            fix(((m + 255) // 256,), (256,), (p["vptr"], np.int64(m), yv, y))
    return run


def timeit(fn, nb, reps=300):
    for i in range(10): fn(i % nb)
    cupy.cuda.Device().synchronize()
    s, e = cupy.cuda.Event(), cupy.cuda.Event()
    ts = []
    for r in range(reps):
        s.record(); fn(r % nb); e.record(); e.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(s, e))
    return float(np.median(ts))


rows = []
for dname, dt in (("fp32", np.float32), ("fp64", np.float64)):
    graph, _ = powerlaw_graph(cupy, csp, 1_000_000, 16.0, 2.0, 5, dt)
    for mname, A in (("graph", graph), ("laplacian", None)):
        A = laplacian(cupy, csp, graph) if A is None else A
        nb = 3
        g = cupy.random.default_rng(7)
        v = [g.standard_normal(A.shape[0]).astype(dt) for _ in range(nb)]
        ref = A.astype(np.float64) @ v[0].astype(np.float64)
        tA = torch.sparse_csr_tensor(torch.from_dlpack(A.indptr), torch.from_dlpack(A.indices),
                                     torch.from_dlpack(A.data), size=A.shape)
        tv = [torch.from_dlpack(x) for x in v]
        rows.append((dname, mname, "torch csr", timeit(lambda i: tA @ tv[i], nb)))
        rows.append((dname, mname, "cupyx csr", timeit(lambda i: A @ v[i], nb)))
        import time
        for _ in range(2):
            cupy.cuda.Device().synchronize(); t0 = time.perf_counter()
            plan(A, 4, 8, 2048, 256); cupy.cuda.Device().synchronize()
            tb = (time.perf_counter() - t0) * 1e3
        rows.append((dname, mname, f"plan build (nnz={A.nnz}, max row {int(cupy.diff(A.indptr).max())})", tb))
        for bps, nw, W, C in itertools.chain(
                ((4, 8, W, 256) for W in (1, 2048, 8192, 1 << 30)),
                ((b, n, 2048, c) for b, n, c in ((8, 8, 256), (6, 8, 256), (4, 8, 1024), (4, 16, 256)))):
            try:
                p = plan(A, bps, nw, W, C)
            except AssertionError as exc:
                rows.append((dname, mname, f"band bps={bps} nw={nw} W={W} C={C} skipped {exc}", 0.0))
                continue
            for U in (4, 8):
                run = runner(p, dt, U)
                ys = [cupy.full(A.shape[0], np.nan, dtype=dt) for _ in range(nb)]
                run(v[0], ys[0])
                err = float(cupy.abs(ys[0] - ref).max() / cupy.abs(ref).max())
                rows.append((dname, mname, f"band bps={bps} nw={nw} W={W} C={C} U={U} R={p['R']} err={err:.0e}",
                             timeit(lambda i: run(v[i], ys[i]), nb)))
                rows.append((dname, mname, f"  kernel only",
                             timeit(lambda i: run(v[i], ys[i], False), nb)))
            del p
        del tA, tv
        cupy.get_default_memory_pool().free_all_blocks()
for r in rows:
    print(f"{r[0]:5s} {r[1]:10s} {r[2]:60s} {r[3]:.4f} ms")
