"""scipy.sparse's common sparse-array API on TwELLMatrix and ELLMatrix (twell._sparse_api).

Oracles: scipy's ``csr_array`` of the same matrix on the host, cupyx's ``csr_matrix`` on the
GPU (the ``backend`` fixture), and NumPy on the dense stored values for the value maps.
What goes through CSR must equal the CSR type's own answer exactly; what runs natively must
equal it too, except sums, which accumulate in float64 (compared within rounding).
"""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import BF16, F16, F32, F64, Backend, assert_dense_equal, cast, dense_from_parts
from hypothesis import given
from hypothesis import strategies as st
from strategies import coo_cases, csr_cases, edge_examples

import twell
import twell._sparse_api

pytestmark = pytest.mark.filterwarnings("ignore::scipy.sparse.SparseEfficiencyWarning")

FORMATS = [pytest.param("twell", id="twell"), pytest.param("ell", id="ell")]
_HOST = Backend("numpy")  # for the tests of host-only behaviour
SMALL = {"max_rows": 12, "max_cols": 40, "tile_widths": (1, 3, 8, 16)}


@st.composite
def small_cases(draw, values="any"):
    """A small matrix with the tile width and slots to pack it with (the shapes and per-tile
    counts of strategies.cases)."""
    from strategies import cases

    return draw(cases(values=values, **SMALL))


def make(backend, case, fmt="twell", dtype=F64):
    x = backend.asarray(cast(case.dense, dtype))
    if fmt == "ell":
        return twell.ELLMatrix(x)
    return twell.TwELLMatrix(x, tile_width=case.tile_width, slots=case.slots)


def reference(backend, dense, dtype=F64):
    """scipy's csr_array (host) or cupyx's csr_matrix (GPU) of the same matrix."""
    return backend.sparse(sp.csr_array(cast(dense, dtype)))


def oracle(backend, dense):
    """The backend whose CSR type answers for a matrix of ``dense``'s shape: scipy's on the
    host for a matrix without elements (cupyx's element-wise operations divide by the row
    and column counts there), else the backend's own."""
    return _HOST if backend.on_gpu and not dense.size else backend


def host(x):
    """A result of either library as a NumPy array: sparse ones densified."""
    if hasattr(x, "toarray"):
        x = x.toarray()
    if hasattr(x, "get") and not isinstance(x, np.generic):
        x = x.get()
    return np.asarray(x)


def assert_like(got, want):
    """The same values (NaN-aware), shape and dtype."""
    g, w = host(got), host(want)
    assert g.dtype == w.dtype, f"dtype {g.dtype} != {w.dtype}"
    assert_dense_equal(g, w)


# -- row selection, natively ----------------------------------------------------------------

def row_key(kind, m, seed):
    """A slice, an integer array (repeats, negatives) or a boolean mask over ``m`` rows."""
    rng = np.random.default_rng(seed)
    if kind == "slice":
        start, stop = (None if rng.random() < 0.3 else int(rng.integers(-m - 2, m + 3))
                       for _ in range(2))
        return slice(start, stop, [None, 1, 2, 3, -1, -2][rng.integers(6)])
    if kind == "array":
        return rng.integers(-m, m, rng.integers(0, 2 * m + 1)) if m else np.zeros(0, np.int64)
    return rng.random(m) < 0.5


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["slice", "array", "mask"])
@given(case=small_cases(), seed=st.integers(0, 2**32 - 1))
@edge_examples(max_cols=40, seed=0)
def test_row_selection_is_native_and_like_scipy(backend, fmt, kind, case, seed):
    """A[rows] and A[rows, :]: the same format (no CSR), the CSR type's values."""
    a = make(backend, case, fmt)
    key = row_key(kind, case.dense.shape[0], seed)
    ref = reference(backend, case.dense)
    key = backend.asarray(key) if isinstance(key, np.ndarray) else key
    for k in (key, (key, slice(None))):
        got = a[k]
        assert type(got) is type(a)
        got.validate()
        if fmt == "twell":
            assert (got.tile_width, got.slots) == (a.tile_width, a.slots)
        assert_like(got, ref[k])


@pytest.mark.parametrize("fmt", FORMATS)
@given(case=small_cases(), data=st.data())
def test_rows_columns_and_elements_like_scipy(backend, fmt, case, data):
    """One row (its axis dropped), elements, columns and point-wise pairs: the CSR type's."""
    m, k = case.dense.shape
    if not m or not k:
        return
    a = make(backend, case, fmt)
    ref = reference(backend, case.dense)
    i = data.draw(st.integers(-m, m - 1))
    j = data.draw(st.integers(-k, k - 1))
    lo, hi = sorted(data.draw(st.lists(st.integers(0, k), min_size=2, max_size=2)))
    rows = np.array(data.draw(st.lists(st.integers(0, m - 1), min_size=1, max_size=4)))
    cols = np.array(data.draw(st.lists(st.integers(0, k - 1), min_size=rows.size,
                                       max_size=rows.size)))
    for key in [i, (i, slice(None)), (i, j), (i, slice(lo, hi)), (slice(None), j),
                (slice(1, None), slice(lo, hi)), (rows, cols), (..., j)]:
        got, want = a[key], ref[key]
        if np.isscalar(want) or getattr(want, "ndim", 1) == 0:
            assert_dense_equal(host(got), host(want))
        else:
            assert_like(got, want)


def test_element_of_a_16_bit_matrix_keeps_its_dtype(backend):
    a = twell.TwELLMatrix(backend.asarray(np.array([[0, 1.5], [2.0, 0]], dtype=np.float16)))
    assert host(a[1, 0]).dtype == F16 and float(a[1, 0]) == 2.0


def test_out_of_range_rows_are_index_errors(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(3)))
    for key in (3, -4, [0, 3], np.array([True, False])):
        with pytest.raises(IndexError):
            a[key]


@pytest.mark.parametrize("fmt", FORMATS)
def test_iteration_yields_scipys_rows(backend, fmt):
    x = np.arange(12.0).reshape(3, 4) % 3
    a = make(backend, _case(x), fmt)
    rows = list(a)
    assert len(rows) == 3
    for got, want in zip(rows, reference(backend, x), strict=True):
        assert_like(got, want)


def _case(x, tile_width=2, slots=1):
    from strategies import Case

    return Case(np.asarray(x, dtype=np.float64), tile_width, slots)


# -- operators with another matrix, a dense array or a scalar ----------------------------------

SPARSE_OPS = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "multiply": (lambda a, b: a.multiply(b), lambda a, b: a.multiply(b)),
    "star": (lambda a, b: a * b, lambda a, b: a.multiply(b)),  # * is matmul for cupyx
    "maximum": (lambda a, b: a.maximum(b), lambda a, b: a.maximum(b)),
    "minimum": (lambda a, b: a.minimum(b), lambda a, b: a.minimum(b)),
    "eq": (lambda a, b: a == b, lambda a, b: a == b),
    "ne": (lambda a, b: a != b, lambda a, b: a != b),
    "lt": (lambda a, b: a < b, lambda a, b: a < b),
    "gt": (lambda a, b: a > b, lambda a, b: a > b),
    "le": (lambda a, b: a <= b, lambda a, b: a <= b),
    "ge": (lambda a, b: a >= b, lambda a, b: a >= b),
    "matmul_T": (lambda a, b: a @ b.T, lambda a, b: a @ b.T),
}


def _partner(case, seed):
    """Another matrix of the same shape, sharing some entries with the case's."""
    rng = np.random.default_rng(seed)
    other = case.dense.copy()
    other[rng.random(other.shape) < 0.4] = 0.0
    fresh = rng.random(other.shape) < 0.2
    other[fresh] = rng.integers(-3, 4, int(fresh.sum()))
    return other


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("op", list(SPARSE_OPS))
@given(case=small_cases(values="finite"), seed=st.integers(0, 2**32 - 1))
def test_sparse_operand_through_csr_like_scipy(backend, fmt, op, case, seed):
    """With a sparse operand (twell's or the CSR type's own): the CSR type's answer."""
    ours, theirs = SPARSE_OPS[op]
    other = _partner(case, seed)
    a, b = make(backend, case, fmt), make(backend, _case(other), fmt)
    ref = oracle(backend, case.dense)
    want = theirs(reference(ref, case.dense), reference(ref, other))
    assert_like(ours(a, b), want)
    assert_like(ours(a, reference(backend, other)), want)


def _writable_arrays(result):
    """Every NumPy array a result holds (a dense result, or a sparse one's arrays)."""
    if isinstance(result, np.ndarray):
        return [result]
    found = [getattr(result, n, None) for n in ("data", "indices", "indptr", "coords")]
    return [x for a in found for x in (a if isinstance(a, tuple) else (a,))
            if isinstance(x, np.ndarray)]


HOST_CSR_RESULTS = {
    **{op: ours for op, (ours, _) in SPARSE_OPS.items()},
    "maximum-0": lambda a, b: a.maximum(0),
    "max-axis": lambda a, b: a.max(axis=0),
    "argmin-axis": lambda a, b: a.argmin(axis=1),
    "sparse-matmul": lambda a, b: a @ b.T,
    "sparse-rmatmul": lambda a, b: a.tocsr() @ b.T,
    "columns": lambda a, b: a[:, 1:],
    "all": lambda a, b: a[:, :-1] if a.shape[1] else a[:, 0:0],
    "column-list": lambda a, b: a[:, [0, 0]] if a.shape[1] else a[:, []],
    "row-range-columns": lambda a, b: a[1:, 1:],
    "one-row": lambda a, b: a[0, :] if a.shape[0] else a[:, 0:0],
    "reshape": lambda a, b: (a.reshape((1, -1)) if a.shape[0] > 1 else
                             a.reshape((-1, 1)) if a.shape[1] > 1 else a.tocsr()),
    "tocoo": lambda a, b: a.tocoo(),
    "tocsc": lambda a, b: a.tocsc(),
}


@pytest.mark.parametrize("op", list(HOST_CSR_RESULTS))
@given(case=small_cases(values="finite"), seed=st.integers(0, 2**32 - 1))
def test_results_through_host_csr_are_the_callers_own(op, case, seed):
    # Operations through CSR read a host matrix's kept compressed rows without copying
    # them (read-only views): each result is the CSR type's answer, its arrays writable,
    # and writing into them changes neither operand.
    a = twell.TwELLMatrix(case.dense)
    b = twell.TwELLMatrix(_partner(case, seed))
    before = a.toarray(), b.toarray()
    try:
        want = HOST_CSR_RESULTS[op](sp.csr_array(before[0]), sp.csr_array(before[1]))
    except ValueError:  # an extremum of an empty matrix, as scipy refuses it
        with pytest.raises(ValueError):
            HOST_CSR_RESULTS[op](a, b)
        return
    got = HOST_CSR_RESULTS[op](a, b)
    assert_like(got, want)
    for x in _writable_arrays(got):
        assert x.flags.writeable
        x[...] = 7 if x.dtype != bool else True
    np.testing.assert_array_equal(a.toarray(), before[0])
    np.testing.assert_array_equal(b.toarray(), before[1])


def test_a_result_sharing_kept_rows_is_copied():
    # _private's rule on its own: a CSR result on read-only arrays (what scipy would give for
    # an operation that returned its operand's arrays) comes back as a writable copy.
    a = twell.TwELLMatrix(np.array([[0.0, 2.0], [3.0, 0.0]]))
    view = a._csr_operand()
    assert not view.data.flags.writeable
    out = twell._sparse_api._private(view)
    assert out is not view and out.data.flags.writeable
    np.testing.assert_array_equal(out.toarray(), a.toarray())
    fresh = sp.csr_array(np.eye(2))
    assert twell._sparse_api._private(fresh) is fresh


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@given(case=small_cases(), seed=st.integers(0, 2**32 - 1))
def test_dense_operand_like_scipy(backend, fmt, dtype, case, seed):
    """A + D natively, D + A, A - D, D - A: NumPy's dense results, as scipy gives them."""
    a = make(backend, case, fmt, dtype)
    ref_backend = oracle(backend, case.dense)
    ref = reference(ref_backend, case.dense, dtype)
    dense = np.random.default_rng(seed).uniform(-2, 2, case.dense.shape)
    d, e = backend.asarray(dense), ref_backend.asarray(dense)
    with np.errstate(all="ignore"):
        for got, want in [(a + d, ref + e), (d + a, e + ref), (a - d, ref - e),
                          (d - a, e - ref), (a.multiply(d), ref.multiply(e)),
                          (a + d[:1], ref + e[:1])]:
            assert_like(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scalar", [0, 1, -1.5, np.float64(2.0), np.nan],
                         ids=["0", "1", "-1.5", "np.float64", "nan"])
@given(case=small_cases())
def test_scalar_comparisons_and_extrema_like_scipy(backend, fmt, scalar, case):
    a = make(backend, case, fmt)
    ref = reference(oracle(backend, case.dense), case.dense)
    with np.errstate(all="ignore"):
        for name in ("eq", "ne", "lt", "gt", "le", "ge", "maximum", "minimum"):
            ours, theirs = SPARSE_OPS[name]
            assert_like(ours(a, scalar), theirs(ref, scalar))


def test_adding_a_nonzero_scalar_is_refused_as_in_scipy(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(2)))
    assert_like(a + 0, a)
    for op in (lambda: a + 1, lambda: 1 - a, lambda: a - 2.5):
        with pytest.raises(NotImplementedError, match="dense"):
            op()


def test_shapes_must_agree(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(2, 3)))
    with pytest.raises(ValueError, match="inconsistent shapes"):
        a + a.T
    with pytest.raises(ValueError, match="inconsistent shapes"):
        a.__lt__(a.T)
    assert (a == a.T) is False and (a != a.T) is True  # scipy's answer for unequal shapes


# -- values, natively -------------------------------------------------------------------------

#: (twell's operation, NumPy's on the dense values ``x`` for a matrix whose scalar type is
#: ``t``: a Python scalar is rounded to the matrix's dtype first, NEP 50's rule)
VALUE_MAPS = {
    "abs": (abs, lambda x, t: np.abs(x)),
    "neg": (lambda a: -a, lambda x, t: -x),
    "round": (lambda a: round(a, 1), lambda x, t: np.around(x, 1)),
    "power2": (lambda a: a.power(2), lambda x, t: np.power(x, t(2))),
    "pow_half": (lambda a: a ** 0.5, lambda x, t: np.power(x, t(0.5))),
    "sqrt": (lambda a: a.sqrt(), lambda x, t: np.sqrt(x)),
    "sin": (lambda a: np.sin(a), lambda x, t: np.sin(x)),
    "expm1": (lambda a: a.expm1(), lambda x, t: np.expm1(x)),
    "rint": (lambda a: a.rint(), lambda x, t: np.rint(x)),
    "times": (lambda a: a * 17.3, lambda x, t: x * t(17.3)),
    "rtimes": (lambda a: 0.375 * a, lambda x, t: x * t(0.375)),
    "divide": (lambda a: a / 0.3, lambda x, t: x / t(0.3)),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16], ids=["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("name", list(VALUE_MAPS))
@given(case=small_cases())
def test_value_maps_are_native_and_round_like_numpy(backend, fmt, dtype, name, case):
    """The same format and dtype; the stored values mapped as NumPy maps the dense array in
    that dtype, bit for bit (bfloat16: computed in float32, rounded once, as ml_dtypes does);
    entries that become zero leave."""
    ours, numpy_fn = VALUE_MAPS[name]
    a = make(backend, case, fmt, dtype)
    stored = host(a.toarray())
    with np.errstate(all="ignore"):
        if dtype == BF16:
            want = cast(numpy_fn(stored.astype(F32), dtype.type), BF16)
        else:
            want = numpy_fn(stored, dtype.type)
        want = np.where(stored != 0, want, 0).astype(dtype)
        got = ours(a)
    assert type(got) is type(a) and got.dtype == dtype
    got.validate()
    assert_dense_equal(host(got.toarray()), want)
    assert got.nnz == np.count_nonzero(want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", twell._sparse_api.UFUNCS_AT_ZERO)
def test_every_ufunc_method_like_numpy(backend, fmt, name):
    """numpy.<name>(A) (NumPy's object-array protocol calls A.<name>()) for every ufunc that
    scipy's sparse arrays offer as a method; its values are NumPy's on the dense array."""
    x = np.array([[0.0, -0.75, 0.5], [0.25, 0.0, -0.125]])
    a = make(backend, _case(x), fmt)
    # numpy.sign(A) compares A with 0, element-wise here (as in scipy): the method it is.
    calls_method = name == "sign"
    got = getattr(a, name)() if calls_method else getattr(np, name)(a)
    assert type(got) is type(a)
    assert_dense_equal(host(got.toarray()), getattr(np, name)(x))


def test_scalar_rounding_matches_numpy_bit_for_bit():
    """Regression: A * s and A / s computed in float64 and rounded once, an ulp away from
    NumPy's float32 and float16 results (which round the scalar to the dtype first)."""
    for dtype, op, x, s in [(np.float32, np.multiply, 0.375, 17.3),
                            (np.float32, np.true_divide, 0.875, 0.3),
                            (np.float16, np.true_divide, 0.125, 0.3)]:
        dense = np.array([[x, 0.0]], dtype=dtype)
        a = twell.TwELLMatrix(dense)
        want = op(dense, s)
        assert want[0, 0] != dtype(op(np.float64(x), s))  # the case tells the two apart
        assert_dense_equal(op(a, s).toarray(), want, dtype)


# -- reductions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@given(case=small_cases(values="finite"))
@edge_examples(max_cols=40, finite=True)
def test_reductions_like_scipy(backend, fmt, dtype, case):
    a = make(backend, case, fmt, dtype)
    ref = reference(backend, case.dense, dtype)
    m, k = case.dense.shape
    tol = {F32: 1e-5, F64: 1e-12}[dtype]
    for axis in (None, 0, 1, -1, -2):
        shape = () if axis is None else ((k,) if axis % 2 == 0 else (m,))
        for name in ("sum", "mean"):
            if name == "mean" and (m == 0 or k == 0):
                continue
            # 1-D along an axis on both backends (cupyx's own are 2-D, a matrix's)
            got, want = host(getattr(a, name)(axis=axis)), host(getattr(ref, name)(axis=axis))
            assert got.dtype == dtype and got.shape == shape
            np.testing.assert_allclose(got.ravel(), want.ravel(), rtol=tol, atol=tol)
        assert_dense_equal(host(a.count_nonzero(axis=axis)),
                           np.count_nonzero(case.dense, axis=axis))
    for k_diag in {0, min(1, k - 1), max(-2, 1 - m)}:
        assert_like(a.diagonal(k_diag), ref.diagonal(k_diag))
    if m and k:
        for name in ("max", "min", "argmax", "argmin"):
            for axis in (None, 0, 1):
                assert_like(getattr(a, name)(axis=axis), getattr(ref, name)(axis=axis))


def test_sum_and_mean_take_dtype_and_out(backend):
    """Regression: sum(dtype=, out=) (and numpy.sum(A), which passes them) were refused."""
    x = np.array([[0.0, 1, 2], [3, -4, 5], [-6, 7, 9]])
    a = twell.TwELLMatrix(backend.asarray(x))
    assert host(a.sum(dtype=np.float32)).dtype == F32
    out = backend.xp.zeros(3)
    assert a.sum(axis=1, out=out) is out
    assert_dense_equal(host(out), x.sum(axis=1))
    assert float(np.sum(a)) == x.sum() and float(np.mean(a)) == x.mean()
    with pytest.raises(ValueError, match="output parameter.*wrong.*dimension"):
        a.mean(out=backend.xp.zeros(1))
    assert float(a.sum(axis=(0, 1))) == x.sum()


@pytest.mark.parametrize("fmt", FORMATS)
def test_integer_and_bool_sum_dtypes_cast_the_elements_first(backend, fmt):
    """As NumPy and scipy 1.18: sum(dtype=int) truncates each element, then adds."""
    x = np.array([[0.6, 0.7, 0.0], [0.8, -1.9, 2.5], [0.0, 0.0, -0.3]])
    a = make(backend, _case(x), fmt)
    for dtype in (np.int64, np.int32, bool):
        for axis in (None, 0, 1):
            got = host(a.sum(axis=axis, dtype=dtype))
            want = x.astype(dtype).sum(axis=axis, dtype=dtype)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


# -- shape, conversions, text ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@given(case=small_cases(values="finite"))
def test_reshape_resize_and_conversions_like_scipy(backend, fmt, case):
    m, k = case.dense.shape
    a = make(backend, case, fmt)
    ref = reference(backend, case.dense)
    assert a.reshape(m, k) is a and a.reshape((m, k), copy=True) is not a
    if m * k:
        assert a.reshape((m, -1)) is a
        assert_like(a.reshape(k, m), ref.reshape(k, m))
    formats = ["csr", "csc", "coo"] + ([] if backend.on_gpu else ["bsr", "dia", "dok", "lil"])
    for f in formats:
        got = a.asformat(f)
        assert got.format == f
        assert_like(got, ref)
    b = a.copy()
    b.resize(m + 1, max(k - 1, 0))
    want = sp.csr_array(case.dense)
    want.resize(m + 1, max(k - 1, 0))
    b.validate()
    assert_dense_equal(host(b.toarray()), want.toarray())


@pytest.mark.parametrize("fmt", FORMATS)
@given(case=small_cases(values="finite"), grow=st.tuples(st.integers(-3, 3), st.integers(-3, 3)))
def test_resize_to_any_shape_like_scipy(backend, fmt, case, grow):
    # Rows and columns cut or added in every combination: scipy's result, a valid matrix,
    # and the matrix copied from is unchanged (the resized one has arrays of its own).
    m, k = case.dense.shape
    shape = (max(m + grow[0], 0), max(k + grow[1], 0))
    a = make(backend, case, fmt)
    b = a.copy()
    b.resize(shape)
    want = sp.csr_array(case.dense)
    want.resize(shape)
    b.validate()
    assert b.shape == shape and b.nnz == want.nnz
    assert_dense_equal(host(b.toarray()), want.toarray())
    assert_dense_equal(host(a.toarray()), case.dense)


@pytest.mark.parametrize("fmt", FORMATS)
@given(case=small_cases(values="finite"), dtype=st.sampled_from([F64, F32, np.float16,
                                                                twell.bfloat16]))
def test_every_diagonal_is_numpys(backend, fmt, case, dtype):
    # Each diagonal from below the first row to past the last column (empty there), in the
    # matrix's dtype, its values NumPy's.
    m, k = case.dense.shape
    a = make(backend, case, fmt, dtype)
    x = host(a.toarray())
    for d in range(-m - 1, k + 2):
        got = host(a.diagonal(d))
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, np.diagonal(x, d))


def test_toarray_order_and_out(backend):
    x = np.arange(6.0).reshape(2, 3)
    a = twell.TwELLMatrix(backend.asarray(x))
    assert a.toarray(order="F").flags.f_contiguous
    out = backend.xp.ones((2, 3))
    assert a.toarray(out=out) is out and a.todense(out=out) is out
    assert_dense_equal(host(out), x)
    with pytest.raises(ValueError, match="shape"):
        a.toarray(out=backend.xp.ones((3, 2)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_str_lists_entries_as_scipy(fmt):
    a = make(_HOST, _case(np.arange(12.0).reshape(3, 4)), fmt)
    lines = str(a).split("\n")
    assert lines[0] == repr(a) and lines[1] == "  Coords\tValues"
    assert lines[2:] == str(sp.csr_array(np.arange(12.0).reshape(3, 4))).split("\n")[3:]
    a.maxprint = 4
    assert len(str(a).split("\n")) == 2 + 4 + 1


# -- construction -----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@given(c=coo_cases(max_cols=40))
def test_coo_tuple_like_scipy(backend, fmt, c):
    cls = {"twell": twell.TwELLMatrix, "ell": twell.ELLMatrix}[fmt]
    a = cls((backend.asarray(c.vals), (backend.asarray(c.rows), backend.asarray(c.cols))),
            shape=c.shape)
    a.validate()
    assert_dense_equal(host(a.toarray()), c.dense())


@pytest.mark.parametrize("fmt", FORMATS)
@given(c=csr_cases(max_cols=40))
def test_csr_tuple_like_scipy(backend, fmt, c):
    csr, _, _ = c
    cls = {"twell": twell.TwELLMatrix, "ell": twell.ELLMatrix}[fmt]
    a = cls((backend.asarray(csr.data), backend.asarray(csr.indices),
             backend.asarray(csr.indptr)), shape=csr.shape)
    a.validate()
    assert_dense_equal(host(a.toarray()), csr.toarray())


@pytest.mark.parametrize("fmt", FORMATS)
@given(c=csr_cases(max_cols=40))
def test_canonical_format_calls_leave_scipys_canonical_matrix(backend, fmt, c):
    """scipy code canonicalises what it built (sum_duplicates, eliminate_zeros, sort_indices,
    prune): on a matrix built from the same non-canonical CSR those calls change nothing and
    leave exactly what scipy's calls leave."""
    csr, _, _ = c
    want = csr.copy()
    want.sum_duplicates()
    want.eliminate_zeros()
    cls = {"twell": twell.TwELLMatrix, "ell": twell.ELLMatrix}[fmt]
    a = cls((backend.asarray(csr.data), backend.asarray(csr.indices),
             backend.asarray(csr.indptr)), shape=csr.shape)
    assert a.has_canonical_format and a.has_sorted_indices
    for name in ("sum_duplicates", "eliminate_zeros", "sort_indices", "prune"):
        assert getattr(a, name)() is None
    assert a.nnz == want.nnz
    assert_dense_equal(host(a.toarray()), want.toarray())
    b = a.sorted_indices()
    assert b is not a and type(b) is type(a)
    assert_dense_equal(host(b.toarray()), want.toarray())
    assert a.check_format() is None and a.check_format(full_check=False) is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_format_is_the_invariant_check(fmt, monkeypatch):
    a = make(_HOST, _case(np.eye(3)), fmt)

    def broken(self):
        raise ValueError("counts: a broken invariant")

    monkeypatch.setattr(type(a), "validate", broken)
    with pytest.raises(ValueError, match="broken invariant"):
        a.check_format()


def test_tuple_forms(backend):
    xp = backend.xp
    e = twell.TwELLMatrix((3, 4), dtype=np.float32)
    assert e.shape == (3, 4) and e.nnz == 0 and e.dtype == F32
    a = twell.TwELLMatrix((xp.asarray([1.0, 2.0, 3.0]), (xp.asarray([0, 2, 2]),
                                                          xp.asarray([1, 0, 1]))))
    assert a.shape == (3, 2)  # read off the indices, as scipy reads them
    b = twell.TwELLMatrix((xp.asarray([1.0, 2.0]), xp.asarray([1, 0]), xp.asarray([0, 1, 2])))
    assert_dense_equal(host(b.toarray()), [[0, 1.0], [2.0, 0]])
    with pytest.raises(ValueError, match="row must be in"):
        twell.TwELLMatrix((xp.asarray([1.0]), (xp.asarray([5]), xp.asarray([0]))), shape=(2, 2))
    with pytest.raises(TypeError, match="integer"):
        twell.TwELLMatrix((xp.asarray([1.0]), (xp.asarray([0.5]), xp.asarray([0]))))
    with pytest.raises(ValueError, match="tuple of 4"):
        twell.TwELLMatrix((1, 2, 3, 4))


def test_constructor_dtype_rounds_through_a_requested_integer_dtype():
    """Regression: TwELLMatrix(x, dtype=bool) and dtype=np.int32 stored x's values unchanged
    as float64; they hold the values of that dtype (stored as float64)."""
    x = np.array([[0.0, 2.5], [-1.75, 0.0]])
    for dtype, want in [(bool, x != 0), (np.int32, x.astype(np.int32))]:
        for a in (twell.TwELLMatrix(x, dtype=dtype), twell.ELLMatrix(x, dtype=dtype),
                  twell.TwELLMatrix(sp.csr_array(x), dtype=dtype),
                  twell.TwELLMatrix(twell.TwELLMatrix(x), dtype=dtype)):
            assert a.dtype == F64
            assert_dense_equal(a.toarray(), want.astype(F64))


# -- semantics that surprise nobody -------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_equality_with_a_copy_is_element_wise(backend, fmt):
    """Regression: A == A.copy() was False (identity); it is scipy's element-wise answer."""
    a = make(backend, _case(np.array([[1.0, 0, 2], [0, 0, 3]])), fmt)
    eq = a == a.copy()
    assert_dense_equal(host(eq), np.ones((2, 3), dtype=bool))
    assert (a != a.copy()).nnz == 0
    with pytest.raises(ValueError, match="ambiguous"):
        bool(eq)


@pytest.mark.parametrize("fmt", FORMATS)
def test_truth_value_as_scipy(fmt):
    """Regression: bool(ELLMatrix(...)) was always True."""
    cls = {"twell": twell.TwELLMatrix, "ell": twell.ELLMatrix}[fmt]
    assert bool(cls(np.array([[2.0]]))) and not bool(cls(np.array([[0.0]])))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(cls(np.eye(2)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_item_assignment_is_a_type_error_that_says_what_to_do(fmt):
    a = make(_HOST, _case(np.eye(3)), fmt)
    for assign in (lambda: a.__setitem__((0, 1), 2.0), lambda: a.setdiag(1.0)):
        with pytest.raises(TypeError, match="does not support item assignment.*tocsr"):
            assign()


@pytest.mark.parametrize("fmt", FORMATS)
def test_numpy_functions_as_on_scipy_arrays(fmt):
    """numpy.sum/abs/sin/transpose/nonzero call the matrix's methods (no __array__, nothing
    densified); ndarray operators defer to the matrix."""
    x = np.array([[0.0, -1, 2], [3, 0, -4]])
    a, ref = make(_HOST, _case(x), fmt), sp.csr_array(x)
    assert not hasattr(a, "__array__")
    assert np.sum(a) == np.sum(ref) and np.sum(a, axis=0).tolist() == [3.0, -1.0, -2.0]
    for got, want in [(np.abs(a), np.abs(x)), (np.sin(a), np.sin(x)),
                      (np.transpose(a), x.T), (np.ones((2, 3)) + a, x + 1),
                      (np.ones((2, 3)) * a, x)]:
        assert_dense_equal(host(got), want)
    assert type(np.abs(a)) is type(a)
    assert [r.tolist() for r in np.nonzero(a)] == [r.tolist() for r in np.nonzero(x)]
    with pytest.raises(TypeError, match="exp"):  # not a method: NumPy says which
        np.exp(a)


def test_not_a_scipy_sparse_array():
    """issparse is False (see the guide): scipy's functions that check it refuse the matrix,
    and A.tocsr() is the hand-off."""
    a = twell.TwELLMatrix(np.eye(3))
    assert not sp.issparse(a)
    with pytest.raises((TypeError, ValueError)):
        sp.vstack([a, a])
    assert_dense_equal(sp.vstack([a.tocsr(), a.tocsr()]).toarray(), np.vstack([np.eye(3)] * 2))


# -- the cached transpose ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_transpose_is_built_once_and_never_stale(backend, fmt):
    x = np.array([[1.0, 0, 2], [0, 3, 0]])
    a = make(backend, _case(x), fmt)
    own = a.nbytes
    assert not a.has_transpose
    t = a.T
    assert a.T is t and a.transpose() is t and a.has_transpose
    assert a.nbytes == own + t.nbytes  # the cache counts in nbytes
    v = backend.asarray(np.array([1.0, -2.0]))
    assert_dense_equal(host(v @ a), host(v) @ x)
    assert_dense_equal(host(a.rmatvec(v)), x.T @ host(v))
    assert a.T is t  # products used the cache
    c = a.transpose(copy=True)
    assert c is not t
    assert_dense_equal(host(c.toarray()), x.T)
    a.has_transpose = False
    assert not a.has_transpose and a.nbytes == own
    a.resize(3, 3)  # replaces the storage arrays: a transpose built before must not be reused
    t2 = a.T
    assert t2.shape == (3, 3)
    assert_dense_equal(host(t2.toarray()), np.pad(x, ((0, 1), (0, 0))).T)


def test_ell_caches_follow_replaced_arrays():
    e = twell.ELLMatrix(np.array([[1.0, 0], [0, 2.0]]))
    e @ np.ones(2)
    before = e.nbytes
    assert before > e.data.nbytes + e.indices.nbytes  # the TwELL form is counted
    e.data = e.data * 3  # a new array: the cached form must go
    assert e.nbytes == e.data.nbytes + e.indices.nbytes
    assert_dense_equal(e @ np.ones(2), [3.0, 6.0])


def test_pickle_round_trip():
    a = twell.TwELLMatrix(np.array([[1.0, 0, 2], [0, 3, 0]]), tile_width=2, slots=1)
    b = pickle.loads(pickle.dumps(a))
    assert_dense_equal(dense_from_parts(b), dense_from_parts(a))
    assert (b.tile_width, b.slots) == (a.tile_width, a.slots)
