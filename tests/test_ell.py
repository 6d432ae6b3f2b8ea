"""twell._ell: row-wise ELLPACK, the baseline format. Oracles: scipy.sparse, float64 NumPy."""

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import (
    DTYPES,
    F16,
    F64,
    MATMUL_RTOL,
    SUM_RTOL,
    assert_csr_equal,
    assert_dense_equal,
    canonical_csr,
    cast,
    rel_err,
)
from hypothesis import given
from hypothesis import strategies as st
from strategies import cases, coo_cases, edge_examples

import twell


def ell_oracle(dense, width=None):
    """Row-wise ELL arrays of a dense host matrix, with Python loops."""
    rows = [np.flatnonzero(r) for r in dense]
    w = max((len(r) for r in rows), default=0) if width is None else width
    data = np.zeros((dense.shape[0], w), dtype=dense.dtype)
    indices = np.zeros((dense.shape[0], w), dtype=np.int32)
    for i, cols in enumerate(rows):
        data[i, :len(cols)] = dense[i, cols]
        indices[i, :len(cols)] = cols
    return data, indices


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases(values="any", max_cols=300), extra=st.sampled_from([None, 0, 3]))
@edge_examples(max_cols=300, extra=None)
def test_ell_arrays_match_the_definition(backend, dtype, case, extra):
    x = cast(case.dense, dtype)
    longest = int((x != 0).sum(axis=1).max()) if x.shape[0] else 0
    width = None if extra is None else longest + extra
    e = twell.ELLMatrix(backend.asarray(x), width=width)
    data, indices = ell_oracle(x, width)
    assert (e.shape, e.dtype, e.width, e.format, e.ndim) == (x.shape, dtype, data.shape[1],
                                                             "ell", 2)
    assert backend.is_native(e.data) and backend.is_native(e.indices)
    assert e.indices.dtype == np.int32
    np.testing.assert_array_equal(backend.to_host(e.indices), indices)
    assert_dense_equal(backend.to_host(e.data), data, dtype)
    assert e.nnz == np.count_nonzero(x)
    assert_dense_equal(backend.to_host(e.toarray()), x, dtype)


@pytest.mark.filterwarnings("ignore::scipy.sparse.SparseEfficiencyWarning")
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil", "dok", "dia"])
def test_ell_from_scipy(fmt, rng):
    x = rng.standard_normal((7, 30)) * (rng.random((7, 30)) < 0.3)
    e = twell.ELLMatrix(getattr(sp, f"{fmt}_array")(x))
    assert_dense_equal(e.toarray(), x, F64)
    assert e.width == int((x != 0).sum(axis=1).max())


@given(case=coo_cases())
def test_ell_from_coo_sums_duplicates(backend, case):
    coo = sp.coo_array((case.vals, (case.rows, case.cols)), shape=case.shape)
    e = twell.ELLMatrix(backend.sparse(coo))
    assert_dense_equal(backend.to_host(e.toarray()), case.dense())
    assert e.nnz == canonical_csr(coo).nnz


@given(case=cases(values="any", max_cols=300))
@edge_examples(max_cols=300)
def test_ell_conversions(backend, case):
    x = backend.asarray(case.dense)
    e = twell.ELLMatrix(x)
    for other in (twell.ELLMatrix(e), twell.ELLMatrix(twell.TwELLMatrix(x, tile_width=3,
                                                                        slots=1)),
                  twell.ELLMatrix(backend.sparse(sp.csr_array(case.dense))), e.copy()):
        assert other.width == e.width
        np.testing.assert_array_equal(backend.to_host(other.indices), backend.to_host(e.indices))
        assert_dense_equal(backend.to_host(other.data), backend.to_host(e.data))
    csr = e.tocsr()
    csr = csr.get() if backend.on_gpu else csr
    assert_csr_equal(sp.csr_array(csr), canonical_csr(case.dense))
    coo = e.tocoo()
    coo = coo.get() if backend.on_gpu else coo
    assert_dense_equal(coo.toarray(), case.dense)
    a = e.to_twell(tile_width=case.tile_width, slots=case.slots)
    a.validate()
    assert isinstance(a, twell.TwELLMatrix) and a.tile_width == case.tile_width
    assert_dense_equal(backend.to_host(a.toarray()), case.dense)


@given(case=cases(values="any", max_cols=300))
@edge_examples(max_cols=300)
def test_ell_transpose(backend, case):
    e = twell.ELLMatrix(backend.asarray(case.dense))
    t = e.T
    assert isinstance(t, twell.ELLMatrix) and t.shape == case.dense.shape[::-1]
    assert_dense_equal(backend.to_host(t.toarray()), case.dense.T)
    assert_dense_equal(backend.to_host(e.transpose().toarray()), case.dense.T)


@pytest.mark.parametrize("n", [None, 1, 5])
@given(case=cases(values="finite", max_cols=300, min_cols=1, min_rows=1))
def test_ell_matmul_against_scipy(backend, n, case):
    m, k = case.dense.shape
    e = twell.ELLMatrix(backend.asarray(case.dense))
    rng = np.random.default_rng(0)
    b = rng.uniform(-4, 4, (k,) if n is None else (k, n))
    out = backend.to_host(e @ backend.asarray(b))
    assert out.shape == ((m,) if n is None else (m, n))
    assert rel_err(out, sp.csr_array(case.dense) @ b) <= MATMUL_RTOL[F64]
    c = rng.uniform(-4, 4, (m,) if n is None else (n, m))
    out = backend.to_host(backend.asarray(c) @ e)
    assert rel_err(out, (sp.csr_array(case.dense).T @ c.T).T) <= MATMUL_RTOL[F64]


def test_ell_astype_drops_entries_that_become_zero(backend):
    x = np.array([[1e-8, 1.0, 0.0, 3.0], [0, 0, 1e-8, 0]])
    e = twell.ELLMatrix(backend.asarray(x)).astype(np.float16)
    assert e.dtype == F16
    assert e.nnz == 2 and e.width == 2
    assert_dense_equal(backend.to_host(e.toarray()), cast(x, F16), F16)
    assert backend.to_host(e.indices).tolist() == [[1, 3], [0, 0]]


def test_ell_dtype_argument(backend):
    x = np.array([[1e-8, 2.0]])
    assert twell.ELLMatrix(backend.asarray(x), dtype=np.float16).nnz == 1
    assert twell.ELLMatrix(backend.asarray(np.array([[1, 0], [0, 1]]))).dtype == F64


def test_ell_width_shorter_than_a_row_names_the_row(backend):
    x = np.zeros((4, 6))
    x[1, :2] = 1.0
    x[2, :5] = 1.0  # the longest row
    x[3, :5] = 1.0
    with pytest.raises(ValueError, match=r"width=3 is shorter than row 2, which holds 5"):
        twell.ELLMatrix(backend.asarray(x), width=3)


@pytest.mark.parametrize("shape", [(2, 2), (0, 2)])
def test_ell_negative_width_is_reported_as_such(shape):
    """Regression: width=-1 gave 'width=-1 is shorter than row 0, which holds 0 non-zeros', or
    numpy's 'attempt to get argmax of an empty sequence' without rows."""
    with pytest.raises(ValueError, match=r"width must be .*non-negative.*got width=-1"):
        twell.ELLMatrix(np.zeros(shape), width=-1)


def test_ell_width_must_be_an_int():
    with pytest.raises(TypeError, match="width must be an int; got width=2.0"):
        twell.ELLMatrix(np.eye(2), width=2.0)


def test_ell_get_copy_and_repr(backend):
    x = np.array([[0, 2.0, 0, 3.0], [1.0, 0, 0, 0]])
    e = twell.ELLMatrix(backend.asarray(x))
    h = e.get()
    assert isinstance(h.data, np.ndarray)
    if not backend.on_gpu:
        assert h is e
    assert_dense_equal(h.toarray(), x)
    c = e.copy()
    c.data[...] = 9.0
    assert_dense_equal(backend.to_host(e.toarray()), x)
    assert repr(e) == "<ELLMatrix 2x4, dtype=float64, nnz=3, width=2>"


def test_ell_empty_shapes(backend):
    for shape in [(0, 0), (0, 4), (3, 0)]:
        e = twell.ELLMatrix(backend.asarray(np.zeros(shape)))
        assert e.width == 0 and e.shape == shape and e.nnz == 0
        assert backend.to_host(e.toarray()).shape == shape


@pytest.mark.parametrize("axis", [None, 0, 1, -1, -2], ids=lambda v: f"axis={v}")
@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases(values="finite", max_cols=300))
@edge_examples(finite=True, max_cols=300)
def test_ell_sum_like_scipy(backend, dtype, axis, case):
    x = cast(case.dense, dtype)
    e = twell.ELLMatrix(backend.asarray(x), width=None)
    want = np.asarray(sp.csr_array(x.astype(np.float64)).sum(axis=axis))
    got = e.sum(axis=axis)
    if axis is not None:
        assert backend.is_native(got)
    got = np.asarray(backend.to_host(got))
    m, k = x.shape
    assert got.dtype == dtype
    assert got.shape == {None: (), 0: (k,), -2: (k,), 1: (m,), -1: (m,)}[axis]
    assert rel_err(got, cast(want, dtype)) <= SUM_RTOL[dtype]


@pytest.mark.parametrize(("axis", "error"), [(2, ValueError), (-3, ValueError),
                                             ("rows", TypeError)])
def test_ell_sum_rejects_bad_axes(axis, error):
    # scipy's errors: an axis out of range is a ValueError, one of the wrong kind a TypeError.
    with pytest.raises(error, match="axis"):
        twell.ELLMatrix(np.eye(2)).sum(axis=axis)
