"""TwELLMatrix construction (twell._twell, twell._convert): every input kind and the dtype rules.

Every constructed matrix is checked against the dense matrix it came from
through an independent rebuild from its public arrays (``dense_from_parts``),
with ``validate()``, and against the canonical arrays of ``from_dense``.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import (
    DTYPES,
    F16,
    F64,
    assert_dense_equal,
    assert_parts_equal,
    cast,
    dense_from_parts,
    editable,
    parts_of,
)
from hypothesis import given
from strategies import EDGE_CASES, cases, edge_examples

import twell

SCIPY_KINDS = [f"{fmt}_{kind}" for fmt in ("csr", "csc", "coo", "lil", "dok", "bsr", "dia")
               for kind in ("array", "matrix")]

SMALL = dict(max_rows=12, max_cols=80)


def check_matrix(a, dense, backend=None, dtype=None):
    """``a`` is valid, holds exactly ``dense`` and lives on ``backend``."""
    a.validate()
    want = cast(dense, dtype or a.dtype)
    assert a.shape == want.shape
    assert a.dtype == (dtype or a.dtype)
    assert_dense_equal(dense_from_parts(a), cast(want, np.float64))
    assert a.nnz == np.count_nonzero(want)
    if backend is not None:
        assert all(backend.is_native(p) for p in (a.counts, a.data, a.indices, a.overflow_indptr,
                                                  a.overflow_indices, a.overflow_data))


# -- every input kind -------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::scipy.sparse.SparseEfficiencyWarning")
@pytest.mark.parametrize("kind", SCIPY_KINDS)
@given(case=cases(**SMALL))
@edge_examples()
def test_from_any_scipy_sparse(kind, case):
    x = getattr(sp, kind)(case.dense)
    a = twell.TwELLMatrix(x, tile_width=case.tile_width, slots=case.slots)
    check_matrix(a, case.dense, dtype=F64)
    assert_parts_equal(a, twell.TwELLMatrix.from_dense(case.dense, tile_width=case.tile_width,
                                                       slots=case.slots))


def _input(backend, kind, dense, tile_width, slots):
    """``dense`` as the given kind of input, on ``backend``."""
    if kind == "dense":
        return backend.asarray(dense)
    if kind in ("csr", "csc", "coo"):
        return backend.sparse(sp.csr_array(dense), kind)
    if kind == "ell":
        return twell.ELLMatrix(backend.asarray(dense))
    if kind == "twell":  # another layout, so the constructor has to re-pack
        return twell.TwELLMatrix(backend.asarray(dense), tile_width=3, slots=1)
    if kind == "tuple":
        a = twell.TwELLMatrix(backend.asarray(dense), tile_width=tile_width, slots=slots)
        return (a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices,
                a.overflow_data)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["dense", "csr", "csc", "coo", "ell", "twell", "tuple"])
@given(case=cases(**SMALL))
@edge_examples()
def test_every_input_kind_on_each_backend(backend, kind, case):
    """Dense, (cupyx.)scipy.sparse, ELL, TwELL and storage tuples, on the backend they live on."""
    x = _input(backend, kind, case.dense, case.tile_width, case.slots)
    backend.poison()
    kwargs = dict(shape=case.dense.shape) if kind == "tuple" else {}
    a = twell.TwELLMatrix(x, tile_width=case.tile_width, slots=case.slots, **kwargs)
    check_matrix(a, case.dense, backend, F64)
    want = twell.TwELLMatrix.from_dense(case.dense, tile_width=case.tile_width, slots=case.slots)
    assert_parts_equal(a, want)


def test_from_nested_lists():
    a = twell.TwELLMatrix([[0, 1.5, 0], [2, 0, 0]], tile_width=2)
    check_matrix(a, np.array([[0, 1.5, 0], [2, 0, 0]]), dtype=F64)


VIEWS = {
    "fortran": lambda xp, v: xp.asfortranarray(v),
    "transposed-view": lambda xp, v: v.T,
    "strided": lambda xp, v: v[::2, ::3],
    "negative-strides": lambda xp, v: v[::-1, ::-1],
}


@pytest.mark.parametrize("layout", sorted(VIEWS))
def test_non_contiguous_dense_input(backend, layout, rng):
    base = rng.standard_normal((40, 60)) * (rng.random((40, 60)) < 0.2)
    view = VIEWS[layout](np, base)
    x = VIEWS[layout](backend.xp, backend.asarray(base))
    a = twell.TwELLMatrix(x, tile_width=8, slots=2)
    check_matrix(a, view, backend)


# -- named constructors ---------------------------------------------------------------

@given(case=cases(**SMALL))
@edge_examples()
def test_named_constructors_agree(backend, case):
    t, s = case.tile_width, case.slots
    want = twell.TwELLMatrix(backend.asarray(case.dense), tile_width=t, slots=s)
    got = {
        "from_dense": twell.TwELLMatrix.from_dense(backend.asarray(case.dense), tile_width=t,
                                                   slots=s),
        "from_csr": twell.TwELLMatrix.from_csr(backend.sparse(sp.csr_array(case.dense)),
                                               tile_width=t, slots=s),
        "from_coo": twell.TwELLMatrix.from_coo(backend.sparse(sp.coo_array(case.dense)),
                                               tile_width=t, slots=s),
        "from_ell": twell.TwELLMatrix.from_ell(twell.ELLMatrix(backend.asarray(case.dense)),
                                               tile_width=t, slots=s),
    }
    for name, a in got.items():
        assert isinstance(a, twell.TwELLMatrix), name
        check_matrix(a, case.dense, backend)
        assert_parts_equal(a, want)


def test_from_dense_validates_its_arguments():
    with pytest.raises(ValueError, match="slots"):
        twell.TwELLMatrix.from_dense(np.eye(3), tile_width=2, slots=3)
    with pytest.raises(ValueError, match="2-D"):
        twell.TwELLMatrix.from_dense(np.ones(3))


# -- dtype rules -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_float_dtypes_are_kept(backend, dtype):
    x = cast(np.array([[0, 1.5, -2.0], [0.25, 0, 0]]), dtype)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=2)
    assert a.dtype == dtype
    assert a.data.dtype == dtype and a.overflow_data.dtype == dtype
    check_matrix(a, x, backend, dtype)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64,
                                   np.uint64], ids=lambda d: np.dtype(d).name)
def test_bool_and_integer_input_becomes_float64(backend, dtype):
    x = np.array([[0, 1, 0], [1, 1, 0]]).astype(dtype)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=2)
    assert a.dtype == F64
    check_matrix(a, x.astype(np.float64), backend, F64)


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.bool_], ids=lambda d: np.dtype(d).name)
def test_integer_scipy_input_becomes_float64(dtype):
    x = np.array([[0, 1, 0], [1, 0, 1]]).astype(dtype)
    a = twell.TwELLMatrix(sp.csr_array(x))
    assert a.dtype == F64
    check_matrix(a, x.astype(np.float64), dtype=F64)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["c64", "c128"])
def test_complex_input_is_a_type_error(backend, dtype):
    x = np.array([[1 + 1j, 0]], dtype=dtype)
    with pytest.raises(TypeError, match="complex"):
        twell.TwELLMatrix(backend.asarray(x))
    with pytest.raises(TypeError, match="complex"):
        twell.TwELLMatrix(np.ones((2, 2)), dtype=dtype)


def test_complex_scipy_input_is_a_type_error():
    with pytest.raises(TypeError, match="complex"):
        twell.TwELLMatrix(sp.csr_array(np.array([[1j, 0]])))


@pytest.mark.parametrize("dtype", ["U1", "O"], ids=["strings", "objects"])
def test_non_numeric_input_is_a_type_error(dtype):
    with pytest.raises(TypeError):
        twell.TwELLMatrix(np.array([["a", "b"]], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("source", ["dense", "csr", "twell", "ell"])
def test_dtype_argument_casts_and_drops_entries_that_become_zero(backend, source, dtype):
    """``dtype=`` casts the input; values that round to zero are not entries (1e-46, 1e-8)."""
    x = np.array([[1e-46, 1.0, 0.0, 3.0], [1e-8, 0.0, 1e-300, -2.5]])
    if source == "dense":
        src = backend.asarray(x)
    elif source == "csr":
        src = backend.sparse(sp.csr_array(x))
    elif source == "twell":
        src = twell.TwELLMatrix(backend.asarray(x), tile_width=2, slots=1)
    else:
        src = twell.ELLMatrix(backend.asarray(x))
    a = twell.TwELLMatrix(src, tile_width=2, slots=1, dtype=dtype)
    check_matrix(a, x, backend, dtype)


def test_twell_from_ell_with_dtype_drops_values_that_round_to_zero():
    """Regression: TwELLMatrix(ELLMatrix, dtype=float16) kept the entries that rounded to zero
    as explicit zeros (nnz 3 instead of 2, validate() failed)."""
    e = twell.ELLMatrix(np.array([[1e-8, 1.0, 0.0, 3.0]]))
    a = twell.TwELLMatrix(e, dtype=np.float16)
    assert a.nnz == 2
    a.validate()


# -- storage tuples, copies and aliasing ------------------------------------------------

def test_tuple_constructor_copy_flag(backend):
    a = twell.TwELLMatrix(backend.asarray(EDGE_CASES["capacity + 1, K == T + 1"].dense),
                          tile_width=8, slots=3)
    # The caller's own (writable) arrays: twell keeps its host matrices' storage read-only.
    arrays = tuple(x.copy() for x in (a.counts, a.data, a.indices, a.overflow_indptr,
                                      a.overflow_indices, a.overflow_data))
    shared = twell.TwELLMatrix(arrays, shape=a.shape, tile_width=8)
    copied = twell.TwELLMatrix(arrays, shape=a.shape, tile_width=8, copy=True)
    before = dense_from_parts(a)
    arrays[1][...] = 7.0  # poison the source arrays
    assert_dense_equal(dense_from_parts(copied), before)
    assert float(backend.to_host(shared.data).max()) == 7.0  # copy=False shares, as documented


def test_tuple_constructor_with_dtype(backend):
    x = np.array([[1e-8, 2.0, 0.0]])
    a = twell.TwELLMatrix(backend.asarray(x))
    b = twell.TwELLMatrix(parts_of_backend(a), shape=a.shape, tile_width=a.tile_width,
                          dtype=np.float16)
    check_matrix(b, x, backend, F16)


def parts_of_backend(a):
    return (a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices, a.overflow_data)


@pytest.mark.parametrize("kind", ["dense", "csr", "coo"])
def test_matrix_does_not_alias_its_input(backend, kind, rng):
    x = rng.standard_normal((6, 20)) * (rng.random((6, 20)) < 0.4)
    src = backend.asarray(x.copy()) if kind == "dense" else backend.sparse(sp.csr_array(x), kind)
    a = twell.TwELLMatrix(src, tile_width=4, slots=1)
    # Poison the input afterwards: the matrix must not change.
    if kind == "dense":
        src[...] = np.nan
    else:
        src.data[...] = np.nan
    assert_dense_equal(dense_from_parts(a), x)


def test_constructor_leaves_its_input_alone(rng):
    x = rng.standard_normal((5, 9)) * (rng.random((5, 9)) < 0.5)
    coo = sp.coo_array((np.array([1.0, 2.0, 0.0]), (np.array([0, 0, 1]), np.array([1, 1, 2]))),
                       shape=(2, 3))
    x0, coo0 = x.copy(), coo.copy()
    twell.TwELLMatrix(x, tile_width=2, slots=1)
    twell.TwELLMatrix(coo)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(coo.row, coo0.row)
    np.testing.assert_array_equal(coo.data, coo0.data)  # duplicates not summed in place


def test_twell_input_with_copy_is_independent(backend):
    a = editable(twell.TwELLMatrix(backend.asarray(np.eye(4)), tile_width=2))
    b = twell.TwELLMatrix(a, copy=True)
    a.data[...] = 9.0
    assert_dense_equal(dense_from_parts(b), np.eye(4))


@pytest.mark.parametrize("tile_width, slots", [(1, 1), (3, 2), (256, 5), (8, "auto")])
def test_twell_input_is_relaid_out(backend, rng, tile_width, slots):
    x = rng.standard_normal((9, 50)) * (rng.random((9, 50)) < 0.5)
    src = twell.TwELLMatrix(backend.asarray(x), tile_width=4, slots=2)
    a = twell.TwELLMatrix(src, tile_width=tile_width, slots=slots)
    assert a.tile_width == tile_width
    check_matrix(a, x, backend)
    want = twell.TwELLMatrix(x, tile_width=tile_width, slots=slots)
    if slots != "auto":
        assert_parts_equal(a, want)


# -- shape argument ---------------------------------------------------------------

def test_matching_shape_argument_is_accepted(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(3)), shape=(3, 3))
    assert a.shape == (3, 3)


@pytest.mark.parametrize("kind", ["dense", "csr"])
def test_mismatched_shape_argument_is_a_value_error(backend, kind):
    x = backend.asarray(np.eye(3)) if kind == "dense" else backend.sparse(sp.csr_array(np.eye(3)))
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(3, 3\)"):
        twell.TwELLMatrix(x, shape=(3, 4))


@pytest.mark.parametrize("bad", [np.ones(3), np.ones((2, 2, 2)), np.float64(1.0)],
                         ids=["1-D", "3-D", "scalar"])
def test_dense_input_must_be_2d(backend, bad):
    with pytest.raises(ValueError, match="2-D"):
        twell.TwELLMatrix(backend.asarray(bad))


def test_device_attribute(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(2)))
    if backend.on_gpu:
        assert a.device.id == backend.xp.cuda.Device().id
    else:
        assert a.device == "cpu"


def test_parts_of_helper_is_complete():
    """Guard for the tests: parts_of returns the six documented arrays, in order."""
    a = twell.TwELLMatrix(np.eye(2))
    assert [p is q for p, q in zip(parts_of(a), parts_of_backend(a), strict=True)] == [True] * 6
