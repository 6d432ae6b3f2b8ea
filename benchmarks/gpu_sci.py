"""The GPU suite's scientific matrices (``sci``): the 2-D Poisson stencil and a power-law
graph, converted from CSR with several tile widths; conversions, ``A @ B`` for several
right-hand-side counts and ``A @ v`` against cuSPARSE (cupyx and torch) and a modelled dense
product.
"""

import numpy as np
from arrays import RNG, SHORT, acc_dtype, cast, csr_nbytes, rows_of, short_error, widen
from checks import Checks
from contenders import to_torch
from gpu_solve import run_solvers

import twell


def twell_estimate(bench, a, tile_width, itemsize):
    """Slots ``"auto"`` would choose, TwELL bytes, and a peak-memory estimate for packing.

    The auto choice comes from the run lengths of (row, tile) keys of the canonical CSR,
    so no (M x n_tiles) array is needed to decide whether one fits.
    """
    xp = bench.xp
    m, k = a.shape
    nt = -(-k // tile_width)
    pairs = m * nt
    nnz = int(a.nnz)
    key = rows_of(xp, a.indptr, nnz).astype(np.int64) * nt + a.indices.astype(np.int64) // \
        tile_width
    _, counts = xp.unique(key, return_counts=True)
    del key
    hist = xp.bincount(counts)
    hist = np.asarray(hist.get() if bench.dev.gpu else hist, dtype=np.int64)  # host copy
    hist[0] += pairs - int(counts.size)
    slots = twell.auto_slots(hist, tile_width)
    c = np.arange(hist.size)
    overflow = int((hist * np.maximum(c - slots, 0)).sum())
    column = 2 if tile_width <= 65536 else 4  # uint16 or int32 columns within a tile
    parts = pairs * (4 + slots * (itemsize + column)) + overflow * (itemsize + 4) + (m + 1) * 8
    # Packing holds per-pair counts, totals and int64 offsets beside the parts, and a few
    # nnz-long index arrays (COO, sort keys); the timed conversion holds a second copy.
    peak = 2 * parts + pairs * 24 + nnz * 48
    return {"tile_width": tile_width, "n_tiles": nt, "pairs": pairs, "slots_est": slots,
            "overflow_est": overflow, "bytes_est": parts, "peak_est": peak,
            "max_per_tile": int(hist.size - 1)}


def _sci_spmm(bench, case, mats, tcsr, a64, layouts, dt, nrhs, g):
    """SpMM with ``nrhs`` right-hand sides: cupyx, torch, dense model, every TwELL layout."""
    xp, torch, ck = bench.xp, bench.torch, Checks(bench)
    n, nnz, nb, isz, acc = mats[0].shape[0], int(mats[0].nnz), len(mats), dt.itemsize, \
        acc_dtype(dt)
    param = f"N={nrhs}"
    need = (3 + nb) * n * nrhs * 8
    free = bench.dev.free_bytes()
    if need > 0.8 * free:
        reason = f"N={nrhs}: right-hand sides and outputs ~{need / 1e9:.1f} GB > 80% free"
        bench.skip(case, "spmm", "twell", reason, family="twell", param=param)
        return
    b = [cast(xp, g.normal((n, nrhs)), dt) for _ in range(nb)]
    ref = a64 @ widen(xp, b[0], np.float64)
    chk = ck.close(ref if dt == np.float64 else ref.astype(acc), dt)
    del ref
    flops = 2 * nnz * nrhs
    gemm = bench.ceilings.get(f"{SHORT[dt]}_gemm_TFLOPs")
    if gemm:
        bench.model(case, "spmm", "dense (model)", 2 * n * n * nrhs / gemm / 1e9,
                    family="dense", param=param,
                    note=f"2 n^2 N at the measured {SHORT[dt]} GEMM rate; "
                         f"the dense matrix would take {n * n * isz / 1e12:.1f} TB")
    bench.measure(case, "spmm", f"{bench.dev.sparse_name} csr", lambda i: mats[i] @ b[i],
                  family="cupyx", nbuf=nb, check=chk, flops=flops, param=param,
                  impl="cuSPARSE")
    if tcsr is not None:
        tb = [to_torch(torch, x) for x in b]
        bench.measure(case, "spmm", "torch csr", lambda i: tcsr[i] @ tb[i], family="torch",
                      nbuf=nb, check=chk, flops=flops, param=param, impl="cuSPARSE")
    for var, built in layouts:
        bench.measure(case, "spmm", "twell", lambda i, a=built: a[i] @ b[i], family="twell",
                      variant=var, nbuf=nb, check=chk, flops=flops, param=param,
                      nbytes=built[0].nbytes + 2 * n * nrhs * isz)


#: The storage arrays of a TwELLMatrix, in the order of its tuple constructor.
TWELL_PARTS = ("counts", "data", "indices", "overflow_indptr", "overflow_indices",
               "overflow_data")


def _sci_layout(bench, case, mats, t, rhs_list, eq_sparse):
    """CSR -> TwELL (timed) and TwELL -> CSR for tile width ``t``; None, or two layouts
    ``(variant, matrices)``: the matrices as built, and the same arrays with the tile index
    (``TwELLMatrix.index_tiles``, its build time in ``case.info``), whose products the
    consumers time as a variant of their own.

    Skipped, with the numbers, when packing would not fit in memory.
    """
    n, nb, isz = mats[0].shape[0], len(mats), mats[0].dtype.itemsize
    nnz = int(mats[0].nnz)
    csr_bytes = csr_nbytes(nnz, n, isz)
    try:
        est = twell_estimate(bench, mats[0], t, isz)
    except Exception as exc:  # noqa: BLE001 - the estimate only guards memory
        bench.notes.append(f"{case.id}: size estimate for T={t} failed: {short_error(exc)}")
        est = {"peak_est": 0}
    free = bench.dev.free_bytes()
    case.info[f"twell_T{t}"] = est
    var = f"T={t} S=auto"
    if est["peak_est"] > 0.85 * free:
        reason = (f"tile_width={t}: {est['pairs']:.3g} (row, tile) pairs, slots~"
                  f"{est['slots_est']}; TwELL ~{est['bytes_est'] / 1e9:.1f} GB, packing peak "
                  f"~{est['peak_est'] / 1e9:.1f} GB > 85% of {free / 1e9:.1f} GB free")
        for op in ("csr->twell", "twell->csr", "spmm", "spmv"):
            for p in [f"N={r}" for r in rhs_list] if op == "spmm" else [""]:
                bench.skip(case, op, "twell", reason, family="twell", variant=var, param=p)
        return None
    row, first = bench.measure(
        case, "csr->twell", "twell",
        lambda i: twell.TwELLMatrix(mats[i], tile_width=t, slots="auto"),
        family="twell", variant=var, nbuf=nb, check=eq_sparse,
        nbytes=lambda a: csr_bytes + a.nbytes, keep=True)
    if first is None:  # not timed (filtered or failed): build it for the consumers anyway
        first = twell.TwELLMatrix(mats[0], tile_width=t, slots="auto")
    built = [first] + [twell.TwELLMatrix(c, tile_width=t, slots="auto") for c in mats[1:]]
    var = f"T={t} S=auto({first.slots})"
    if row is not None:
        row["variant"] = var
    case.info[f"twell_T{t}"].update(slots=first.slots, bytes=first.nbytes,
                                    overflow_nnz=first.overflow_nnz, occupancy=first.occupancy)
    bench.measure(case, "twell->csr", "twell", lambda i: built[i].tocsr(), family="twell",
                  variant=var, nbuf=nb, check=eq_sparse,
                  nbytes=first.nbytes + csr_nbytes(nnz, n, isz))
    # The same storage arrays (not copied) in matrices that carry the tile index.
    indexed = [twell.TwELLMatrix(tuple(getattr(a, f) for f in TWELL_PARTS), shape=a.shape,
                                 tile_width=t) for a in built]
    case.info[f"twell_T{t}"]["index_ms"] = bench.time_only(lambda _: indexed[0].index_tiles())
    for a in indexed:
        a.index_tiles()
    case.info[f"twell_T{t}"]["index_tiles"] = int(indexed[0].tile_index.tiles.size)
    return [(var, built), (f"{var} +index", indexed)]


def run_sci_case(bench, case, base, dt, rhs_list, tile_widths, nbuf_rule):
    """Conversions, SpMM for each right-hand-side count, SpMV: every contender, same inputs."""
    xp, torch, ck = bench.xp, bench.torch, Checks(bench)
    dt = np.dtype(dt)
    isz = dt.itemsize
    n = base.shape[0]
    nnz = int(base.nnz)
    csr_bytes = csr_nbytes(nnz, n, isz)
    nb = nbuf_rule(csr_bytes + n * min(rhs_list) * isz)
    # Rotating sets: the same structure, other arrays (values scaled: never zeros).
    mats = []
    for i in range(nb):
        c = base.copy()
        if i:
            c.data *= dt.type(1 + 0.25 * i)
        mats.append(c)
    a64 = mats[0].astype(np.float64) if dt != np.float64 else mats[0]
    case.info.update(n=n, nnz=nnz, density=nnz / (n * n), buffers=nb, bytes_csr=csr_bytes,
                     bytes_dense=n * n * isz)
    row_nnz = xp.diff(base.indptr)
    case.info.update(max_row_nnz=int(row_nnz.max()), mean_row_nnz=float(row_nnz.mean()))
    del row_nnz
    tcsr = None
    if torch is not None:
        try:
            tcsr = [torch.sparse_csr_tensor(to_torch(torch, c.indptr), to_torch(torch, c.indices),
                                            to_torch(torch, c.data), size=(n, n)) for c in mats]
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch CSR failed: {short_error(exc)}")

    # -- TwELL layouts: CSR -> TwELL (timed), TwELL -> CSR
    # Exact: the canonical CSR of the result equals the input's (no dense n x n).
    eq_sparse = ck.same_sparse(mats[0])

    layouts = []
    # The width tile_width="auto" takes (one tile as wide as the row here) first.
    for t in dict.fromkeys([twell.auto_tile_width(base.shape, nnz), *tile_widths]):
        try:
            layout = _sci_layout(bench, case, mats, t, rhs_list, eq_sparse)
        except Exception as exc:  # noqa: BLE001 - other tile widths may still fit
            layout = None
            bench.notes.append(f"{case.id}: TwELL T={t} failed: {short_error(exc)}")
            bench.dev.release()
        if layout is not None:
            layouts.extend(layout)

    # -- SpMM, one right-hand-side count at a time (B and the reference freed in between)
    g = RNG(xp, 7)
    for nrhs in rhs_list:
        bench.guarded(case, "spmm", lambda r=nrhs: _sci_spmm(
            bench, case, mats, tcsr, a64, layouts, dt, r, g), param=f"N={nrhs}")
        bench.dev.release()
    bench.guarded(case, "spmv", lambda: _sci_spmv(bench, case, mats, tcsr, a64, layouts, dt, g))
    bench.dev.release()
    for op in ("cg", "gmres"):  # run_solvers times both; guarded by either op
        if op in bench.ops:
            bench.guarded(case, op, lambda: run_solvers(bench, case, base, dt))
            break


def _sci_spmv(bench, case, mats, tcsr, a64, layouts, dt, g):
    """SpMV: cupyx, torch, every TwELL layout."""
    xp, torch, ck = bench.xp, bench.torch, Checks(bench)
    n, nb, isz, acc = mats[0].shape[0], len(mats), dt.itemsize, acc_dtype(dt)
    csr_bytes = csr_nbytes(mats[0].nnz, n, isz)
    v = [cast(xp, g.normal((n,)), dt) for _ in range(nb)]
    vref = a64 @ widen(xp, v[0], np.float64)
    chk = ck.close(vref if dt == np.float64 else vref.astype(acc), dt)
    bench.measure(case, "spmv", f"{bench.dev.sparse_name} csr", lambda i: mats[i] @ v[i],
                  family="cupyx", nbuf=nb, check=chk, impl="cuSPARSE",
                  nbytes=csr_bytes + 2 * n * isz)
    if tcsr is not None:
        tv = [to_torch(torch, x) for x in v]
        bench.measure(case, "spmv", "torch csr", lambda i: tcsr[i] @ tv[i], family="torch",
                      nbuf=nb, check=chk, impl="cuSPARSE")
    for var, built in layouts:
        bench.measure(case, "spmv", "twell", lambda i, a=built: a[i] @ v[i], family="twell",
                      variant=var, nbuf=nb, check=chk, nbytes=built[0].nbytes + 2 * n * isz)
