"""The GPU suite's iterative solvers on the scientific matrices (ops ``cg`` and ``gmres``):
``cupyx.scipy.sparse.linalg`` with a TwELLMatrix against the same solver with cupyx's CSR.

Per iteration: a solve of exactly ``SOLVE_ITERS`` iterations (``rtol=0``: no early exit),
timed by the harness (CUDA events around the whole solve, median of the reps), divided by
the iterations. To a residual: one untimed solve each, to ``SOLVE_RTOL``, whose count of
matrix-vector products the rows carry (the same matrix in two formats should take the same).
The power-law graph is not symmetric, so the solvers run on its Laplacian: ``S = |A| +
|A|^T`` with unit weights, ``L = diag(S 1) - S + I`` (symmetric positive definite).
"""

import importlib
import inspect

import numpy as np
from arrays import RNG, cast, short_error, widen

import twell

#: Iterations of each timed solve.
SOLVE_ITERS = 100
#: GMRES's iterations between restarts (cupyx's default).
GMRES_RESTART = 20
#: Relative residuals the to-convergence solves stop at, by dtype, and their iteration cap.
SOLVE_RTOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-6}
SOLVE_MAX_ITERS = 5000
#: GMRES: the relative difference allowed between the two formats' residuals after
#: SOLVE_ITERS iterations (their products round differently, and GMRES's residual, minimal
#: over the Krylov space, drifts slowly with them). On the graph's Laplacian in float64 it
#: moves from run to run on the same inputs and the same twell: 4.6e-7, 1.7e-6 and 1.2e-4 in
#: three runs on one H100 (float32: 8.6e-5 to 1.3e-4), with the same products to
#: SOLVE_RTOL each time, so float64 allows 1e-3.
RESIDUAL_TOL = {np.dtype(np.float32): 5e-2, np.dtype(np.float64): 1e-3}
#: CG: the factor allowed between the two residuals, either way. CG's residual is not
#: monotone: on the graph's Laplacian (condition ~1e5) it swings by 10x from one iteration to
#: the next, and rounding shifts the swings, so at a fixed iteration the two formats' differ
#: by tens of percent in float64 while they reach SOLVE_RTOL within a product or two of each
#: other (the rows' ``products_to_rtol``, the check of equal convergence; cupyx's own count
#: on the graph's Laplacian moves by one between runs on the same inputs).
CG_RESIDUAL_FACTOR = 2.0


def laplacian(xp, sp, a):
    """``diag(S 1) - S + I`` for ``S = |A| + |A|^T`` with unit weights, CSR of a's dtype."""
    s = sp.csr_matrix(abs(a) + abs(a).T)
    s.data[:] = 1
    n = a.shape[0]
    degree = s @ xp.ones(n, dtype=s.dtype)
    return sp.csr_matrix(sp.diags(degree + 1, 0, shape=(n, n), format="csr") - s).astype(a.dtype)


def _linalg(bench):
    """cupyx.scipy.sparse.linalg on the GPU, scipy.sparse.linalg in a dry run."""
    return importlib.import_module(bench.sp.__name__ + ".linalg")


def _tolerance_name(solver):
    """``rtol`` (CuPy 14, scipy 1.12 and newer) or ``tol`` (older)."""
    return "rtol" if "rtol" in inspect.signature(solver).parameters else "tol"


def _solve(solver, a, b, rtol, maxiter, **kw):
    kw[_tolerance_name(solver)] = rtol
    x, _ = solver(a, b, maxiter=maxiter, **kw)
    return x


def run_solvers(bench, case, base, dt):
    """cg and gmres with cupyx's CSR and with the TwELLMatrix of ``tile_width="auto"``."""
    xp, sp = bench.xp, bench.sp
    dt = np.dtype(dt)
    lin = _linalg(bench)
    a = base if case.matrix == "poisson" else laplacian(xp, sp, base)
    try:
        tw = twell.TwELLMatrix(a)
    except Exception as exc:  # noqa: BLE001 - the CSR rows still run
        bench.notes.append(f"{case.id}: TwELL of the solver matrix failed: {short_error(exc)}")
        tw = None
    a64 = a.astype(np.float64)
    b = cast(xp, RNG(xp, 11).normal((a.shape[0],)), dt)
    b64 = widen(xp, b, np.float64)
    norm_b = float(xp.linalg.norm(b64))

    def residual(x):
        return float(xp.linalg.norm(b64 - a64 @ widen(xp, x, np.float64))) / norm_b

    variant = f"T={tw.tile_width} S=auto({tw.slots})" if tw is not None else ""
    case.info.setdefault("solve", {}).update(
        n=a.shape[0], nnz=int(a.nnz), iters=SOLVE_ITERS, restart=GMRES_RESTART,
        matrix="poisson" if case.matrix == "poisson" else "laplacian of the graph",
        twell_tile_width=tw.tile_width if tw is not None else None,
        twell_bytes=tw.nbytes if tw is not None else None)
    for name, extra in (("cg", {}), ("gmres", {"restart": GMRES_RESTART})):
        solver = getattr(lin, name)
        # GMRES counts iterations in whole restarts: maxiter rounds up to them.
        iters = SOLVE_ITERS if name == "cg" else \
            -(-SOLVE_ITERS // GMRES_RESTART) * GMRES_RESTART
        ref = {}

        maxiter = _maxiter(lin, name, iters)

        def timed(matrix, solver=solver, extra=extra, maxiter=maxiter):
            return lambda _: _solve(solver, matrix, b, 0.0, maxiter, **extra)

        def check(x, ref=ref, dt=dt, name=name):
            res = residual(x)
            if "csr" not in ref:  # the CSR row runs first: its residual is the reference
                ref["csr"] = res
                return 0.0, 0.0
            if name == "cg":  # the ratio's excess over 1, either way
                ratio = max(res, 1e-300) / max(ref["csr"], 1e-300)
                return max(ratio, 1 / ratio) - 1, CG_RESIDUAL_FACTOR - 1
            return abs(res - ref["csr"]) / max(ref["csr"], 1e-300), RESIDUAL_TOL[dt]

        param = f"{iters} iterations"
        rows = [bench.measure(case, name, f"{bench.dev.sparse_name} csr", timed(a),
                              family="cupyx", check=check, param=param, impl="cuSPARSE")]
        if tw is not None:
            rows.append(bench.measure(case, name, "twell", timed(tw), family="twell",
                                      variant=variant, check=check, param=param))
        for row, matrix in zip(rows, (a, tw), strict=False):
            if row is None:
                continue
            if row.get("ms"):
                row["ms_per_iteration"] = row["ms"] / iters
            row["products_to_rtol"], row["rtol"] = _products_to(
                lin, name, matrix, b, SOLVE_RTOL[dt], extra, residual, bench)
        bench.dev.release()


def _maxiter(lin, name, iterations):
    """``maxiter`` for ``iterations``: scipy's gmres counts restarts in it, cupyx's the
    iterations within them."""
    if name == "gmres" and lin.__name__.startswith("scipy"):
        return -(-iterations // GMRES_RESTART)
    return iterations


def _products_to(lin, name, matrix, b, rtol, extra, residual, bench):
    """Matrix-vector products an untimed solve takes to ``rtol`` (None if it does not get
    there within SOLVE_MAX_ITERS iterations), counted by a LinearOperator around the matrix:
    the same count whatever each library calls an iteration."""
    count = [0]

    def matvec(v):
        count[0] += 1
        return matrix @ v

    operator = lin.LinearOperator(matrix.shape, matvec=matvec, dtype=matrix.dtype)
    solver = getattr(lin, name)
    try:
        x = _solve(solver, operator, b, rtol, _maxiter(lin, name, SOLVE_MAX_ITERS), **extra)
        bench.dev.sync()
    except Exception as exc:  # noqa: BLE001 - the timed rows stand without it
        bench.notes.append(f"{name} to rtol={rtol:g} failed: {short_error(exc)}")
        return None, rtol
    return (count[0] if residual(x) <= 10 * rtol else None), rtol
