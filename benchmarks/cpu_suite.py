"""The CPU suite (``--cpu``): twell's NumPy backend against scipy.sparse CSR in one process.

Matrices: activations (4096 x 5632, 1% non-zeros, the feed-forward workload's generator), the
2-D Poisson matrix of a 300 x 300 grid (90,000 rows) and a power-law graph (100,000 rows,
mean degree 16, Pareto tail index 2), each in float32 and float64. ``A = TwELLMatrix(csr)``
with default arguments. Operations and contenders (twell | scipy):

=============  =========================  ====================
op             twell                      scipy
=============  =========================  ====================
spmv           ``A @ v``                  ``csr @ v``
spmm N=64      ``A @ B``                  ``csr @ B``
transpose      ``A.T``                    ``csr.T.tocsr()``
csr->twell     ``TwELLMatrix(csr)``       ``csr.tocsc()``
twell->csr     ``A.tocsr()``              ``csr.tocsc()``
twell->dense   ``A.toarray()``            ``csr.toarray()``
pack           ``TwELLMatrix(dense)``     ``csr_array(dense)``
nbytes         ``A.nbytes``               the CSR's bytes
sum axis=0, 1  ``A.sum(axis)``            ``csr.sum(axis)``
columns        ``A[:, K/4:3K/4]``         ``csr[:, K/4:3K/4]``
=============  =========================  ====================

The dense operations run on the activations only (the others' dense forms take tens of GB).
``csr.tocsc()`` stands for a conversion between compressed formats of the same matrix.
Every result is checked first: conversions and the transpose exactly (the canonical CSR of
the result against scipy's), products and sums by relative error against scipy's float64
product or sum (``HOST_TOLERANCE``). Times: ``perf_counter`` around each call, best of
``--reps`` (7); a call slower than ``--max-timing-s`` / ``--reps`` gets fewer runs, at least
``--min-reps``.
"""

import time

import numpy as np
import scipy.sparse
from arrays import DTYPES, HOST_TOLERANCE, RNG, cast, short_error, sparse_nbytes
from checks import Checks
from harness import Case
from workloads import ffn_inputs32, poisson2d, powerlaw_graph

import twell

MATRICES = ("activations", "poisson", "graph")
CPU_DTYPES = ("fp32", "fp64")
ACT_M, ACT_K, ACT_D, ACT_SPARSITY = 4096, 5632, 2048, 0.99
POISSON_GRID = 300
GRAPH_N, GRAPH_DEGREE, GRAPH_ALPHA = 100_000, 16.0, 2.0
#: Columns of the dense right-hand side of ``A @ B``.
RHS = 64
#: Bytes of the copy whose bandwidth the suite measures, for context.
COPY_BYTES = 1 << 26


def plan_cases(args):
    """(matrix, dtype) of every case, in run order."""
    return [(mat, d) for mat in args.cpu_matrices for d in args.cpu_dtypes]


def prepare(bench):
    """The host's copy bandwidth (bytes read + written), best of 10."""
    bench.progress.start("copy bandwidth")
    try:
        a = np.arange(COPY_BYTES // 4, dtype=np.uint32)
        b = np.empty_like(a)
        ms = bench.time_only(bench.dev.copy_fn(a, b), reps=10)
        bench.ceilings.update(copy_GBps=2 * COPY_BYTES / ms / 1e6, copy_bytes=COPY_BYTES,
                              copy_ms=ms)
    except Exception as exc:  # noqa: BLE001 - context only
        bench.notes.append(f"copy bandwidth failed: {short_error(exc)}")
    bench.budget_t0 = time.perf_counter()


def make_matrix(name, args):
    """``(float64 canonical csr_array, info)`` of one matrix; each dtype casts it."""
    sp = scipy.sparse
    if name == "activations":
        inp = ffn_inputs32(np, args.act_m, ACT_K, ACT_D, ACT_SPARSITY, 1, args.seed,
                           with_x=False)
        a = sp.csr_array(inp.z[0].astype(np.float64))
        info = {"generator": "relu(X W^T), bias-column trick", "sparsity": ACT_SPARSITY,
                "d_model": ACT_D}
    elif name == "poisson":
        a, info = poisson2d(np, sp, args.cpu_grid, np.float64)
    else:
        a, info = powerlaw_graph(np, sp, args.cpu_graph_n, GRAPH_DEGREE, args.graph_alpha,
                                 args.seed + 5, np.float64)
    a = sp.csr_array(a)
    a.sum_duplicates()
    return a, info


def run(bench, plan):
    args = bench.args
    made = {}
    for mat, dname in plan:
        case = Case(f"cpu-{mat}-{dname}", "cpu", dname, mat, matrix=mat)
        if bench.stopped():
            case.info["skipped"] = "over the time budget"
            bench.cases.append(case)
            bench.progress.done()
            continue
        bench.progress.start(f"{mat} {dname}")
        t = time.perf_counter()
        try:
            if mat not in made:
                made.clear()  # one matrix at a time in memory
                made[mat] = make_matrix(mat, args)
            base, info = made[mat]
            case.info.update(info)
            run_case(bench, case, base.astype(DTYPES[dname]), DTYPES[dname])
        except Exception as exc:  # noqa: BLE001 - a set-up failure must not cost other cases
            case.info["error"] = short_error(exc)
            bench.notes.append(f"{case.id}: case set-up failed: {short_error(exc)}")
        case.info["wall_s"] = round(time.perf_counter() - t, 2)
        add_twell_over_scipy(bench.rows, case.id)
        bench.finish_case(case)
        bench.progress.done()


def run_case(bench, case, csr, dt):
    """Every operation of one (matrix, dtype): scipy first, then twell, on the same arrays."""
    ck = Checks(bench)
    tol = HOST_TOLERANCE[case.dtype]
    m, k = csr.shape
    rows = np.diff(csr.indptr)
    csr_bytes = sparse_nbytes(csr)
    case.label = f"{case.matrix} {m}x{k}"
    case.info.update(shape=[m, k], nnz=int(csr.nnz), density=csr.nnz / (m * k),
                     max_row_nnz=int(rows.max()), mean_row_nnz=float(rows.mean()),
                     bytes_csr=csr_bytes, bytes_dense=m * k * dt.itemsize)
    g = RNG(np, 7)
    v = cast(np, g.normal((k,)), dt)
    b = cast(np, g.normal((k, RHS)), dt)
    c64 = csr.astype(np.float64)
    same = ck.same_sparse(csr)

    # CSR -> TwELL first: its result is the A of every other operation.
    bench.measure(case, "csr->twell", "csr.tocsc()", lambda _: csr.tocsc(), family="scipy",
                  check=same)
    row, a = bench.measure(case, "csr->twell", "TwELLMatrix(csr)",
                           lambda _: twell.TwELLMatrix(csr), family="twell", check=same,
                           keep=True)
    if row is None:  # csr->twell not asked for: the other operations still need A
        a = twell.TwELLMatrix(csr)
    if a is None:
        why = (row.get("note") if row["status"] == "skipped" else
               f"TwELLMatrix(csr) {row['status']}: {row.get('error', '')}")
        for op, name in (("nbytes", "A.nbytes"), ("twell->csr", "A.tocsr()"),
                         ("transpose", "A.T"), ("spmv", "A @ v"), ("spmm", "A @ B")):
            bench.skip(case, op, name, why, family="twell", param=f"N={RHS}" * (op == "spmm"))
        a_variant = ""
    else:
        a_variant = f"T={a.tile_width} S={a.slots}"
        if row is not None:
            row["variant"] = a_variant
        case.info["twell"] = {"tile_width": a.tile_width, "slots": a.slots,
                              "n_tiles": a.n_tiles, "overflow_nnz": a.overflow_nnz,
                              "occupancy": a.occupancy, "bytes": a.nbytes}
        bench.size(case, "nbytes", "CSR bytes", csr_bytes, family="scipy",
                   note="data + indices + indptr as stored")
        bench.size(case, "nbytes", "A.nbytes", a.nbytes, family="twell", variant=a_variant)
        bench.measure(case, "twell->csr", "csr.tocsc()", lambda _: csr.tocsc(), family="scipy",
                      check=same)
        bench.measure(case, "twell->csr", "A.tocsr()", lambda _: a.tocsr(), family="twell",
                      variant=a_variant, check=same)
        transposed = csr.T.tocsr()
        transposed.sum_duplicates()
        same_t = ck.same_sparse(transposed)
        bench.measure(case, "transpose", "csr.T.tocsr()", lambda _: csr.T.tocsr(),
                      family="scipy", check=same_t)
        bench.measure(case, "transpose", "A.T", lambda _: _fresh_transpose(a), family="twell",
                      variant=a_variant, check=same_t)
        del transposed
        close_v = ck.close(c64 @ v.astype(np.float64), np.float64, tol=tol)
        bench.measure(case, "spmv", "csr @ v", lambda _: csr @ v, family="scipy", check=close_v)
        bench.measure(case, "spmv", "A @ v", lambda _: a @ v, family="twell", variant=a_variant,
                      check=close_v)
        close_b = ck.close(c64 @ b.astype(np.float64), np.float64, tol=tol)
        bench.measure(case, "spmm", "csr @ B", lambda _: csr @ b, family="scipy",
                      check=close_b, param=f"N={RHS}")
        bench.measure(case, "spmm", "A @ B", lambda _: a @ b, family="twell", variant=a_variant,
                      check=close_b, param=f"N={RHS}")
        run_api_ops(bench, ck, case, csr, a, a_variant, c64, tol)

    if case.matrix != "activations":
        why = (f"dense forms run on the activations only: this {m} x {k} matrix would take "
               f"{m * k * dt.itemsize / 1e9:.3g} GB dense")
        for op, names in (("twell->dense", ("csr.toarray()", "A.toarray()")),
                          ("pack", ("csr_array(dense)", "TwELLMatrix(dense)"))):
            for name, family in zip(names, ("scipy", "twell"), strict=True):
                bench.skip(case, op, name, why, family=family, not_applicable=True)
        return
    dense = csr.toarray()
    equal = ck.equal(dense, dt)
    bench.measure(case, "twell->dense", "csr.toarray()", lambda _: csr.toarray(),
                  family="scipy", check=equal)
    if a is None:
        bench.skip(case, "twell->dense", "A.toarray()", "TwELLMatrix(csr) failed",
                   family="twell")
    else:
        bench.measure(case, "twell->dense", "A.toarray()", lambda _: a.toarray(),
                      family="twell", variant=a_variant, check=equal)
    bench.measure(case, "pack", "csr_array(dense)", lambda _: scipy.sparse.csr_array(dense),
                  family="scipy", check=same)
    row, packed = bench.measure(case, "pack", "TwELLMatrix(dense)",
                                lambda _: twell.TwELLMatrix(dense), family="twell", check=same,
                                keep=True)
    if packed is not None:
        row["variant"] = f"T={packed.tile_width} S={packed.slots}"


def run_api_ops(bench, ck, case, csr, a, a_variant, c64, tol):
    """scipy's array API on the matrix: sums along each axis (checked against the float64
    sums) and the middle half of the columns over every row (exactly)."""
    for axis in (0, 1):
        close_s = ck.close(c64.sum(axis=axis), np.float64, tol=tol)
        bench.measure(case, "sum", "csr.sum(axis)", lambda _, axis=axis: csr.sum(axis=axis),
                      family="scipy", check=close_s, param=f"axis={axis}")
        bench.measure(case, "sum", "A.sum(axis)", lambda _, axis=axis: a.sum(axis=axis),
                      family="twell", variant=a_variant, check=close_s, param=f"axis={axis}")
    k = csr.shape[1]
    cols = slice(k // 4, 3 * k // 4)
    same_c = ck.same_sparse(csr[:, cols])
    bench.measure(case, "columns", "csr[:, K/4:3K/4]", lambda _: csr[:, cols], family="scipy",
                  check=same_c)
    bench.measure(case, "columns", "A[:, K/4:3K/4]", lambda _: a[:, cols], family="twell",
                  variant=a_variant, check=same_c)


def add_twell_over_scipy(rows, case_id):
    """``twell_over_scipy`` on every twell row of the case: twell ms / scipy ms (bytes /
    bytes for ``nbytes``), the ratio issue 36 states its targets in (above 1: twell slower)."""
    groups = {}
    for r in rows:
        if r["case"] == case_id:
            groups.setdefault((r["op"], r["param"]), []).append(r)
    for group in groups.values():
        sc = next((r for r in group if r["family"] == "scipy"), None)
        for tw in (r for r in group if r["family"] == "twell"):
            if sc is None:
                continue
            if tw["status"] == "size" and sc["status"] == "size" and sc["bytes"]:
                tw["twell_over_scipy"] = tw["bytes"] / sc["bytes"]
            elif tw["status"] in ("ok", "wrong") and sc["status"] in ("ok", "wrong") \
                    and sc["ms"]:
                tw["twell_over_scipy"] = tw["ms"] / sc["ms"]


def _fresh_transpose(a):
    """``A.T`` built anew: the matrix keeps the transpose it built (``has_transpose``), and
    a repeated ``A.T`` would time the cache."""
    a.has_transpose = False
    return a.T
