"""scipy.sparse.linalg's and cupyx.scipy.sparse.linalg's solvers on TwELLMatrix and ELLMatrix.

The solvers reach the matrix through ``aslinearoperator`` (``shape``, ``dtype``, ``matvec``,
``rmatvec``, ``rmatmat``), never densify it, and must return what they return for the CSR
matrix of the same entries: the same iterations, the solutions within 1e-8 relative.
"""

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

import twell


def poisson(grid):
    """The 2-D Poisson matrix (5-point stencil) of a grid x grid mesh, scipy CSR, float64."""
    ones = np.ones(grid)
    t = sp.diags_array([-ones[1:], 2 * ones, -ones[1:]], offsets=[-1, 0, 1], shape=(grid, grid))
    return sp.csr_array(sp.kronsum(t, t))


def _cg(a, b):
    iterations = []
    x, info = sla.cg(a, b, rtol=1e-10, callback=lambda xk: iterations.append(1))
    assert info == 0
    return x, len(iterations)


def _rel(x, y):
    return np.linalg.norm(x - y) / np.linalg.norm(y)


@pytest.mark.parametrize("grid", [pytest.param(30, id="30x30"),
                                  pytest.param(300, id="300x300", marks=pytest.mark.slow)])
def test_cg_on_poisson_as_on_csr(grid):
    """Regression: cg(TwELLMatrix) raised "type not understood". Now the same iterations as
    on CSR and the same solution within 1e-8 relative."""
    csr = poisson(grid)
    b = np.random.default_rng(grid).standard_normal(csr.shape[0])
    want, n_csr = _cg(csr, b)
    got, n_twell = _cg(twell.TwELLMatrix(csr), b)  # the automatic layout: one wide tile
    assert n_twell == n_csr
    assert _rel(got, want) <= 1e-8


@pytest.mark.parametrize("solver", [sla.gmres, sla.bicgstab, sla.minres, sla.cg])
@pytest.mark.parametrize("fmt", ["twell", "ell"])
def test_krylov_solvers_as_on_csr(solver, fmt):
    csr = poisson(20)
    a = twell.TwELLMatrix(csr, tile_width=64) if fmt == "twell" else twell.ELLMatrix(csr)
    b = np.random.default_rng(1).standard_normal(csr.shape[0])
    want, info_csr = solver(csr, b, rtol=1e-10)
    got, info = solver(a, b, rtol=1e-10)
    assert info == info_csr == 0
    assert _rel(got, want) <= 1e-8


def test_least_squares_use_the_cached_transpose(monkeypatch):
    """lsqr and lsmr call rmatvec every iteration: the transpose is built once."""
    rng = np.random.default_rng(2)
    csr = sp.random_array((60, 40), density=0.15, rng=rng, format="csr") + sp.eye_array(60, 40)
    a = twell.TwELLMatrix(csr, tile_width=16, slots=2)
    built = []
    real = twell.TwELLMatrix._transpose
    monkeypatch.setattr(twell.TwELLMatrix, "_transpose",
                        lambda self: built.append(1) or real(self))
    b = rng.standard_normal(60)
    for solver in (sla.lsqr, sla.lsmr):
        got, want = solver(a, b, atol=1e-12, btol=1e-12)[0], solver(csr, b, atol=1e-12,
                                                                      btol=1e-12)[0]
        assert _rel(got, want) <= 1e-8
    assert len(built) == 1 and a.has_transpose


def test_eigsh_and_svds_as_on_csr():
    csr = poisson(12)
    a = twell.TwELLMatrix(csr, tile_width=64)
    v0 = np.ones(csr.shape[0])
    want = sla.eigsh(csr, k=4, v0=v0, return_eigenvectors=False)
    got = sla.eigsh(a, k=4, v0=v0, return_eigenvectors=False)
    np.testing.assert_allclose(np.sort(got), np.sort(want), rtol=1e-10)
    rect = twell.TwELLMatrix(csr[:, :100], tile_width=32)
    want = sla.svds(csr[:, :100], k=3, random_state=0, return_singular_vectors=False)
    got = sla.svds(rect, k=3, random_state=0, return_singular_vectors=False)
    np.testing.assert_allclose(np.sort(got), np.sort(want), rtol=1e-10)


@pytest.mark.parametrize("fmt", ["twell", "ell"])
def test_aslinearoperator(fmt):
    x = np.array([[1.0, 0, 2], [0, 3, 0]], dtype=np.float32)
    a = twell.TwELLMatrix(x) if fmt == "twell" else twell.ELLMatrix(x)
    op = sla.aslinearoperator(a)
    assert op.shape == (2, 3) and op.dtype == np.float32
    np.testing.assert_array_equal(op.matvec(np.ones(3, np.float32)), x @ np.ones(3))
    np.testing.assert_array_equal(op.rmatvec(np.ones(2, np.float32)), x.T @ np.ones(2))
    np.testing.assert_array_equal(op.matmat(np.eye(3, dtype=np.float32)), x)
    np.testing.assert_array_equal(op.rmatmat(np.eye(2, dtype=np.float32)), x.T)


# -- the GPU: cupyx.scipy.sparse.linalg ----------------------------------------------------------

#: cupyx's Krylov solvers and their tolerance keyword.
CUPYX_KRYLOV = {"cg": "rtol", "gmres": "rtol", "bicgstab": "rtol", "cgs": "rtol", "minres": "tol"}


@pytest.mark.parametrize("name", list(CUPYX_KRYLOV))
def test_cupyx_krylov_solvers_as_on_cupyx_csr(gpu, name):
    import cupyx.scipy.sparse as cs
    import cupyx.scipy.sparse.linalg as cla

    csr = cs.csr_matrix(poisson(20))
    a = twell.TwELLMatrix(csr, tile_width=64)
    b = gpu.xp.asarray(np.random.default_rng(3).standard_normal(csr.shape[0]))
    solver = getattr(cla, name)
    kwargs = {CUPYX_KRYLOV[name]: 1e-10, "maxiter": 2000}
    want, info_csr = solver(csr, b, **kwargs)
    got, info = solver(a, b, **kwargs)
    assert info == info_csr == 0
    assert _rel(gpu.to_host(got), gpu.to_host(want)) <= 1e-8


def test_cupyx_lsmr_eigsh_svds_as_on_cupyx_csr(gpu):
    import cupyx.scipy.sparse as cs
    import cupyx.scipy.sparse.linalg as cla

    host = poisson(12)
    csr = cs.csr_matrix(host)
    a = twell.TwELLMatrix(csr, tile_width=64)
    b = gpu.xp.asarray(np.random.default_rng(4).standard_normal(csr.shape[0]))
    want, got = cla.lsmr(csr, b, atol=1e-12, btol=1e-12)[0], cla.lsmr(a, b, atol=1e-12,
                                                                     btol=1e-12)[0]
    assert _rel(gpu.to_host(got), gpu.to_host(want)) <= 1e-8
    want = np.sort(gpu.to_host(sla.eigsh(host, k=3, return_eigenvectors=False)))
    got = np.sort(gpu.to_host(cla.eigsh(a, k=3, return_eigenvectors=False)))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    rect = cs.csr_matrix(host[:, :100])
    want = np.sort(gpu.to_host(cla.svds(rect, k=3, return_singular_vectors=False)))
    got = np.sort(gpu.to_host(cla.svds(twell.TwELLMatrix(rect, tile_width=32), k=3,
                                       return_singular_vectors=False)))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cupyx_cg_on_poisson_as_on_cupyx_csr(gpu):
    """The issue's check on the GPU: cupyx's cg on a TwELLMatrix returns cupyx CSR's."""
    import cupyx.scipy.sparse as cs
    import cupyx.scipy.sparse.linalg as cla

    csr = cs.csr_matrix(poisson(100))
    b = gpu.xp.ones(csr.shape[0])
    want, _ = cla.cg(csr, b, rtol=1e-10, maxiter=5000)
    got, info = cla.cg(twell.TwELLMatrix(csr), b, rtol=1e-10, maxiter=5000)
    assert info == 0
    assert _rel(gpu.to_host(got), gpu.to_host(want)) <= 1e-8
