"""TwELLMatrix operations and attributes (twell._twell): astype, scalar arithmetic, sum,
transpose, repr, counters, get and copy. Oracles: scipy.sparse and float64 NumPy."""

import decimal
import fractions
import re

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import (
    BF16,
    DTYPES,
    F16,
    F32,
    F64,
    PART_NAMES,
    SUM_RTOL,
    assert_dense_equal,
    assert_parts_equal,
    cast,
    dense_from_parts,
    parts_of,
    rel_err,
    tile_counts,
)
from hypothesis import given
from hypothesis import strategies as st
from strategies import EDGE_CASES, cases, edge_examples

import twell


def make(backend, case, dtype=F64):
    return twell.TwELLMatrix(backend.asarray(cast(case.dense, dtype)),
                             tile_width=case.tile_width, slots=case.slots)


# -- astype -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases(values="any"))
@edge_examples()
def test_astype_drops_entries_that_become_zero(backend, dtype, case):
    a = make(backend, case)
    before = dense_from_parts(a)
    b = a.astype(dtype)
    assert b.dtype == dtype and b.shape == a.shape and b.tile_width == a.tile_width
    b.validate()
    want = cast(case.dense, dtype)
    assert_dense_equal(dense_from_parts(b), cast(want, np.float64))
    assert b.nnz == np.count_nonzero(want)
    assert_dense_equal(dense_from_parts(a), before)  # the source is untouched


@pytest.mark.parametrize("src", DTYPES)
def test_astype_widening_is_exact(backend, src):
    x = cast(np.array([[0, 1.5, -3e-5], [65504.0, 0, -0.125]]), src)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=2, slots=1)
    b = a.astype(np.float64)
    assert_dense_equal(dense_from_parts(b), cast(x, np.float64))
    assert b.nnz == a.nnz


def test_astype_copy_flag(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(3)))
    assert a.astype(np.float64, copy=False) is a
    b = a.astype(np.float64)
    assert b is not a
    for name in PART_NAMES:
        assert not backend.xp.shares_memory(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, bool, np.complex128, "U3"],
                         ids=["int32", "int64", "bool", "complex128", "str"])
def test_astype_to_a_dtype_twell_cannot_hold_is_a_type_error(backend, dtype):
    """Regression: astype(np.int64) and astype(bool) returned float64 with the values
    unchanged; a cast twell cannot make is a TypeError that names the dtypes it holds."""
    a = twell.TwELLMatrix(backend.asarray(np.eye(3, dtype=np.float32) * 2.5))
    with pytest.raises(TypeError, match="float64, float32, float16, bfloat16.*got dtype="):
        a.astype(dtype)


# -- scalar arithmetic ---------------------------------------------------------------------

SCALARS = [pytest.param(v, id=i) for v, i in [
    (2, "int-2"), (-0.5, "-0.5"), (0, "zero"), (0.0, "zero-float"), (np.nan, "nan"),
    (np.inf, "inf"), (1e-300, "tiny-underflows"), (1e300, "huge-overflows"),
    (np.float64(3.0), "np.float64"), (np.int64(-2), "np.int64"),
]]


@pytest.mark.parametrize("scalar", SCALARS)
@given(case=cases(values="any", max_rows=20, max_cols=300))
@edge_examples(max_cols=300)
def test_scalar_multiplication_like_scipy(backend, scalar, case):
    """Values as scipy's ``A * s``; zeros it creates are dropped (scipy keeps them explicit)."""
    a = make(backend, case)
    with np.errstate(all="ignore"):
        want = (sp.csr_array(case.dense) * scalar).toarray()
        products = [a * scalar, scalar * a]
    for b in products:
        assert b.dtype == F64
        b.validate()
        assert_dense_equal(dense_from_parts(b), want)
        assert b.nnz == np.count_nonzero(want)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("scalar", [3, -0.5, 0, np.nan, 1e-30], ids=["3", "-0.5", "0", "nan",
                                                                     "1e-30"])
@given(case=cases(values="any", max_rows=20, max_cols=300))
def test_scalar_multiplication_in_narrow_dtypes(backend, dtype, scalar, case):
    """A Python scalar keeps the dtype; the products are NumPy's for the dense stored values
    in that dtype, bit for bit (the scalar rounds to the dtype first, as NumPy rounds it)."""
    a = make(backend, case, dtype)
    stored = cast(dense_from_parts(a), dtype)
    with np.errstate(all="ignore"):
        # The scalar in the matrix's dtype, NEP 50's rule, written out: some ml_dtypes
        # releases promote bfloat16 with a Python float to float64 instead.
        want = np.where(stored != 0, stored * np.asarray(scalar).astype(dtype)[()], 0.0)
    b = a * scalar
    assert b.dtype == dtype
    b.validate()
    assert_dense_equal(dense_from_parts(b), cast(want, np.float64))


@pytest.mark.parametrize("divisor", [2, -4.0, 3, 0.1, np.float64(7.0)],
                         ids=["2", "-4.0", "3", "0.1", "np.float64"])
@given(case=cases(values="any", max_rows=20, max_cols=300))
@edge_examples(max_cols=300)
def test_division_by_a_scalar_like_scipy(backend, divisor, case):
    a = make(backend, case)
    with np.errstate(all="ignore"):
        want = (sp.csr_array(case.dense) / divisor).toarray()
    b = a / divisor
    b.validate()
    np.testing.assert_allclose(dense_from_parts(b), want, rtol=1e-15, atol=0)
    assert b.nnz == np.count_nonzero(want)


@given(case=cases(values="any", max_rows=20, max_cols=300))
@edge_examples(max_cols=300)
def test_negation_like_scipy(backend, case):
    a = make(backend, case)
    b = -a
    b.validate()
    assert_dense_equal(dense_from_parts(b), (-sp.csr_array(case.dense)).toarray())
    assert_dense_equal(dense_from_parts(-b), case.dense)


@pytest.mark.parametrize("dtype, scalar, result", [
    (F16, np.float32(2.0), F32), (BF16, np.float32(2.0), F32), (F32, np.int64(2), F64),
    (F16, 2.0, F16), (BF16, 2, BF16),
], ids=["f16*np.f32", "bf16*np.f32", "f32*np.int64", "f16*float", "bf16*int"])
def test_scalar_result_dtype(backend, dtype, scalar, result):
    a = twell.TwELLMatrix(backend.asarray(np.eye(3, dtype=dtype)))
    assert (a * scalar).dtype == result
    assert (scalar * a).dtype == result


def test_division_promotes_like_multiplication():
    """Regression: A / np.float32(2) kept A's float16 dtype while A * np.float32(0.5) gave
    float32 (the divisor became a Python float)."""
    a = twell.TwELLMatrix(np.eye(3, dtype=np.float16))
    assert (a / np.float32(2.0)).dtype == (a * np.float32(0.5)).dtype == F32


@pytest.mark.parametrize("op", ["times", "divide", "negate"])
def test_scalar_arithmetic_on_the_gpu(gpu, op):
    """Regression: A * s, A / s and -A on CuPy-backed matrices raised TypeError 'Unsupported
    type numpy.ndarray' (a 0-d NumPy array was handed to CuPy)."""
    a = twell.TwELLMatrix(gpu.asarray(np.array([[0.0, 2.0], [-4.0, 0.0]])))
    b = {"times": lambda: a * 2, "divide": lambda: a / 2, "negate": lambda: -a}[op]()
    want = {"times": [[0, 4.0], [-8.0, 0]], "divide": [[0, 1.0], [-2.0, 0]],
            "negate": [[0, -2.0], [4.0, 0]]}[op]
    assert_dense_equal(gpu.to_host(b.toarray()), want)


def test_nan_scalar_keeps_padding_zero(backend):
    """NaN * 0 is NaN: the unused slots must stay zero all the same."""
    a = twell.TwELLMatrix(backend.asarray(np.array([[1.0, 0, 0, 0], [0, 0, 0, 0]])),
                          tile_width=2, slots=2)
    b = a * np.nan
    b.validate()
    d = dense_from_parts(b)
    assert np.isnan(d[0, 0]) and np.count_nonzero(d) == 1


@pytest.mark.parametrize("other", ["2", None, 2j], ids=["str", "None", "complex"])
def test_multiplication_by_non_numbers_is_a_type_error(backend, other):
    a = twell.TwELLMatrix(backend.asarray(np.eye(3)))
    other = backend.asarray(other) if isinstance(other, np.ndarray) else other
    with pytest.raises(TypeError):
        a * other
    with pytest.raises(TypeError):
        a / other


_UNSUPPORTED_SCALARS = [
    (fractions.Fraction(1, 3), "Fraction"), (decimal.Decimal("0.5"), "Decimal"),
    (1j, "complex"), (np.longdouble(2), "numpy.longdouble"), (np.complex64(1), "numpy.complex64"),
    (np.array(2j), "numpy.ndarray of dtype complex128"),
    (np.array(2.0, dtype=np.longdouble), f"numpy.ndarray of dtype {np.dtype(np.longdouble)}"),
]


@pytest.mark.parametrize(("scalar", "kind"), _UNSUPPORTED_SCALARS,
                         ids=[k for _, k in _UNSUPPORTED_SCALARS])
def test_an_unsupported_scalar_is_one_clear_type_error(scalar, kind):
    # Regression: A * Fraction(1, 3) said "dtype must be one of ... got dtype=object",
    # naming neither the scalar nor what a scalar may be.
    a = twell.TwELLMatrix(np.eye(3))
    for symbol, op in (("*", lambda: a * scalar), ("*", lambda: scalar * a),
                       ("/", lambda: a / scalar)):
        with pytest.raises(TypeError) as info:
            op()
        message = str(info.value)
        assert message.startswith(f"TwELLMatrix {symbol} x supports real scalars: bool, int, "
                                  "float, or a NumPy bool, integer or float64, float32, float16 "
                                  "or bfloat16 scalar or 0-d array; use @ for matrix products; "
                                  f"got x of type {kind}"), message


@pytest.mark.parametrize("other", [object(), "2", None], ids=["object", "str", "None"])
def test_an_operand_that_is_no_number_nor_array_is_a_type_error(other):
    # As in scipy: * takes scalars, dense arrays and sparse matrices (element-wise); any
    # other operand is Python's TypeError for unsupported operands.
    a = twell.TwELLMatrix(np.eye(3))
    with pytest.raises(TypeError, match="unsupported operand|supports real scalars"):
        a * other


def test_a_python_int_past_float64_is_a_value_error():
    a = twell.TwELLMatrix(np.eye(3))
    with pytest.raises(ValueError, match=r"TwELLMatrix \* x: x=10\*\*400 is past the float64 "
                                         r"range"):
        a * 10**400


# -- sum -------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [None, 0, 1, -1, -2], ids=lambda v: f"axis={v}")
@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases(values="finite"))
@edge_examples(finite=True)
def test_sum_like_scipy(backend, dtype, axis, case):
    a = make(backend, case, dtype)
    stored = dense_from_parts(a)
    want = np.asarray(sp.csr_array(stored).sum(axis=axis))
    got = a.sum(axis=axis)
    if axis is not None:
        assert backend.is_native(got)
    got = np.asarray(backend.to_host(got))
    assert got.dtype == dtype
    m, k = case.dense.shape
    assert got.shape == {None: (), 0: (k,), -2: (k,), 1: (m,), -1: (m,)}[axis]
    assert rel_err(got, cast(want, dtype)) <= SUM_RTOL[dtype]


@given(case=cases(values="any", max_rows=20, max_cols=300))
@edge_examples(max_cols=300)
def test_sum_with_nan_and_inf_like_scipy(backend, case):
    a = make(backend, case)
    for axis in (None, 0, 1):
        with np.errstate(all="ignore"):
            want = np.asarray(sp.csr_array(case.dense).sum(axis=axis))
        got = np.asarray(backend.to_host(a.sum(axis=axis)))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))


@pytest.mark.parametrize("axis", [2, -3, (0, 2)])
def test_sum_rejects_axes_out_of_range(backend, axis):
    a = twell.TwELLMatrix(backend.asarray(np.eye(2)))
    with pytest.raises(ValueError, match="axis out of range"):
        a.sum(axis=axis)


@pytest.mark.parametrize("axis", ["rows", 1.5])
def test_sum_rejects_axes_of_the_wrong_kind(backend, axis):
    a = twell.TwELLMatrix(backend.asarray(np.eye(2)))
    with pytest.raises(TypeError, match="axis must be an integer"):
        a.sum(axis=axis)


# -- transpose ---------------------------------------------------------------------------------

@given(case=cases(values="any"))
@edge_examples()
def test_transpose_like_scipy(backend, case):
    a = make(backend, case)
    for t in (a.T, a.transpose(), a.transpose(axes=(1, 0))):
        t.validate()
        assert t.shape == case.dense.shape[::-1]
        assert t.tile_width == a.tile_width
        assert backend.is_native(t.counts)
        assert_dense_equal(dense_from_parts(t), sp.csr_array(case.dense).T.toarray())
    assert_dense_equal(dense_from_parts(a.T.T), case.dense)


def test_transpose_rejects_other_axes(backend):
    with pytest.raises(ValueError, match="axes"):
        twell.TwELLMatrix(backend.asarray(np.eye(2))).transpose(axes=(0, 1))


# -- counters, repr, attributes ------------------------------------------------------------------

@given(case=cases(values="any"))
@edge_examples()
def test_counters_against_brute_force(backend, case):
    a = make(backend, case)
    per_tile = tile_counts(case.dense, case.tile_width)
    s = a.slots
    assert a.nnz == np.count_nonzero(case.dense)
    assert a.overflow_nnz == int(np.maximum(per_tile - s, 0).sum())
    assert a.overflow_rows == int((per_tile > s).any(axis=1).sum())
    tn = a.tile_nnz()
    assert backend.is_native(tn) and tn.dtype == np.int64
    np.testing.assert_array_equal(backend.to_host(tn), per_tile)
    counts = np.minimum(per_tile, s)
    assert a.occupancy == pytest.approx(counts.sum() / counts.size / s if counts.size else 1.0)
    # The storage, and on the host the compressed rows that products run on.
    rows = a._csr.nbytes if a._csr is not None else 0
    assert a.nbytes == sum(p.nbytes for p in parts_of(a)) + rows
    assert (a.shape, a.ndim, a.format, a.n_tiles) == (case.dense.shape, 2, "twell",
                                                      -(-case.dense.shape[1] // a.tile_width))


def test_public_arrays_have_the_documented_dtypes_and_shapes(backend):
    c = EDGE_CASES["capacity + 1, K == T + 1"]
    a = make(backend, c, F32)
    m, k = c.dense.shape
    nt, s = a.n_tiles, a.slots
    spec = {
        "counts": (np.int32, (m, nt)), "data": (np.float32, (m, nt, s)),
        "indices": (np.uint16, (m, nt, s)), "overflow_indptr": (np.int64, (m + 1,)),
        "overflow_indices": (np.int32, (a.overflow_nnz,)),
        "overflow_data": (np.float32, (a.overflow_nnz,)),
    }
    for name, p in zip(PART_NAMES, parts_of(a), strict=True):
        assert (p.dtype, p.shape) == (np.dtype(spec[name][0]), spec[name][1]), name


@given(case=cases(values="any"))
@edge_examples()
def test_repr_reports_the_layout(backend, case):
    a = make(backend, case)
    m, k = case.dense.shape
    text = repr(a)
    per_tile = tile_counts(case.dense, case.tile_width)
    over = int(np.maximum(per_tile - a.slots, 0).sum())
    over_rows = int((per_tile > a.slots).any(axis=1).sum())
    for piece in (f"{m}x{k}", "float64", f"nnz={np.count_nonzero(case.dense)}",
                  f"tile_width={case.tile_width}", f"slots={case.slots}",
                  f"overflow={over} entries in {over_rows} rows"):
        assert piece in text, f"{piece!r} not in {text!r}"
    occupancy = re.search(r"occupancy=([0-9.]+)%", text)
    assert occupancy is not None, text
    assert float(occupancy.group(1)) == pytest.approx(100 * a.occupancy, abs=0.051)
    assert ("on cpu" in text) != backend.on_gpu


def test_repr_of_a_known_matrix():
    x = np.zeros((2, 8))
    x[0, :5] = 1.0
    a = twell.TwELLMatrix(x, tile_width=4, slots=2)
    assert repr(a) == ("<TwELLMatrix 2x8, dtype=float64, nnz=5, tile_width=4, slots=2, "
                       "occupancy=37.5%, overflow=2 entries in 1 rows, on cpu>")


def test_len_and_truth_value(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(2)))
    with pytest.raises(TypeError):
        len(a)
    with pytest.raises(ValueError):
        bool(a)
    assert bool(twell.TwELLMatrix(backend.asarray(np.array([[2.0]]))))
    assert not bool(twell.TwELLMatrix(backend.asarray(np.array([[0.0]]))))


# -- get and copy --------------------------------------------------------------------------------

@given(case=cases(values="any", max_rows=20, max_cols=300))
@edge_examples(max_cols=300)
def test_get_gives_an_equal_host_matrix(backend, case):
    a = make(backend, case)
    h = a.get()
    assert isinstance(h, twell.TwELLMatrix)
    assert all(isinstance(p, np.ndarray) for p in (h.counts, h.data, h.indices,
                                                   h.overflow_indptr, h.overflow_indices,
                                                   h.overflow_data))
    if not backend.on_gpu:
        assert h is a  # documented: itself when already on the host
    assert_parts_equal(h, twell.TwELLMatrix(case.dense, tile_width=case.tile_width,
                                            slots=case.slots))


@pytest.mark.parametrize("poisoned", ["copy", "original"])
def test_copy_is_independent(backend, poisoned):
    c = EDGE_CASES["capacity + 1, K == T + 1"]
    a = make(backend, c)
    b = a.copy()
    assert_parts_equal(a, b)
    target, other = (b, a) if poisoned == "copy" else (a, b)
    for name in PART_NAMES:
        assert not backend.xp.shares_memory(getattr(target, name), getattr(other, name))
    if backend.xp is not np:  # twell's host storage is read-only: writes cannot happen there
        for name in PART_NAMES:
            getattr(target, name)[...] = 1
    other.validate()
    assert_dense_equal(dense_from_parts(other), c.dense)


@given(scalar=st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_scalar_gives_a_valid_matrix(scalar):
    x = EDGE_CASES["NaN, Inf, subnormal, cast-to-zero values"].dense
    a = twell.TwELLMatrix(x, tile_width=2, slots=1)
    with np.errstate(all="ignore"):
        b = a * scalar
        want = (sp.csr_array(x) * scalar).toarray()
    b.validate()
    assert_dense_equal(dense_from_parts(b), want)


def test_numpy_float64_scalar_promotes_like_numpy():
    """Regression: np.float64 is a float subclass, and A * np.float64(2) kept float32; NumPy 2
    (NEP 50) gives float64 for a float32 array times a NumPy float64 scalar."""
    a = twell.TwELLMatrix(np.eye(3, dtype=np.float32))
    want = (np.eye(3, dtype=np.float32) * np.float64(2)).dtype
    assert (a * np.float64(2)).dtype == want == F64
    assert (a * 2.0).dtype == F32


@pytest.mark.parametrize("op", [np.multiply, np.true_divide], ids=["multiply", "divide"])
@pytest.mark.parametrize("values_dtype, dtype", [(F32, F32), (BF16, BF16), (BF16, F32),
                                                 (F16, F32)],
                         ids=["f32", "bf16", "bf16*np.f32", "f16*np.f32"])
@given(bits=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=50),
       scalar=st.sampled_from([3.0, -0.5, 1e-30, 7.0, 1e30, 1.5e-45, np.nan, np.inf]))
def test_the_gpu_route_of_scalar_products_gives_numpys_bits(op, values_dtype, dtype, bits,
                                                             scalar):
    """The float64 route of scalar products and quotients (the GPU's: CuPy's float32 loops
    flush subnormals) equals NumPy's own float32 and ml_dtypes' bfloat16 loops, bit for bit,
    subnormals included, in the promoted dtype for 16-bit values and a float32 scalar."""
    from twell import _dtypes, _numpy_backend

    values = np.array(bits, dtype=np.uint32).view(np.float32)
    if values_dtype != F32:
        values = (np.array(bits, dtype=np.uint32) >> 16).astype(np.uint16).view(values_dtype)
    s = np.asarray(scalar).astype(dtype)[()]
    with np.errstate(all="ignore"):
        want = op(values, s)
        got = _dtypes.through_float64_map(op, values, s, _numpy_backend.cast, dtype)
    assert got.dtype == want.dtype == dtype
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    view = np.uint32 if dtype == F32 else np.uint16
    np.testing.assert_array_equal(got.view(view)[~nan], want.view(view)[~nan])
