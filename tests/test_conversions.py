"""Conversions (twell._convert, twell._algorithms and the backends' pack/unpack).

Oracles: the dense float64 matrix a test starts from, scipy's canonical CSR,
and an independent rebuild of the dense matrix from the public arrays.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import (
    BF16,
    DTYPES,
    F16,
    F32,
    F64,
    assert_csr_equal,
    assert_dense_equal,
    assert_parts_equal,
    canonical_csr,
    cast,
    dense_from_parts,
    tile_counts,
)
from hypothesis import given
from strategies import cases, coo_cases, csr_cases, edge_examples

import twell

FORMATS = ["dense", "csr", "coo", "ell", "twell"]


def host_csr(backend, x):
    """A CSR result on the host as a scipy csr_array, after checking its type on its backend."""
    if backend.on_gpu:
        import cupyx.scipy.sparse as cs

        assert isinstance(x, cs.csr_matrix)
        x = x.get()
    else:
        assert isinstance(x, sp.csr_array)
    return sp.csr_array(x)


def host_coo(backend, x):
    if backend.on_gpu:
        import cupyx.scipy.sparse as cs

        assert isinstance(x, cs.coo_matrix)
        x = x.get()
    else:
        assert isinstance(x, sp.coo_array)
    return sp.coo_array(x)


# -- dense <-> TwELL ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases())
@edge_examples()
def test_dense_round_trip_is_exact(backend, dtype, case):
    x = cast(case.dense, dtype)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=case.tile_width, slots=case.slots)
    a.validate()
    backend.poison()
    out = a.toarray()
    assert backend.is_native(out)
    out = backend.to_host(out)
    assert out.flags.c_contiguous
    assert_dense_equal(out, x, dtype)
    assert_dense_equal(dense_from_parts(a), cast(x, np.float64))
    assert a.nnz == np.count_nonzero(x)


@given(case=cases(values="any"))
@edge_examples()
def test_overflow_is_lossless(backend, case):
    """With slots=1 most tiles overflow; nothing may be lost and the overflow is reported."""
    a = twell.TwELLMatrix(backend.asarray(case.dense), tile_width=case.tile_width, slots=1)
    a.validate()
    ref = sp.csr_array(case.dense)
    assert a.nnz == ref.count_nonzero() == np.count_nonzero(case.dense)
    per_tile = tile_counts(case.dense, case.tile_width)
    assert a.overflow_nnz == int(np.maximum(per_tile - 1, 0).sum())
    assert a.overflow_rows == int((per_tile > 1).any(axis=1).sum())
    assert_dense_equal(backend.to_host(a.toarray()), case.dense)


# -- CSR / COO <-> TwELL -----------------------------------------------------------

@given(case=csr_cases())
def test_csr_round_trip_gives_scipy_canonical_csr(backend, case):
    """Non-canonical CSR in (explicit zeros, duplicates, unsorted) -> scipy's canonical form out."""
    csr, t, s = case
    a = twell.TwELLMatrix(backend.sparse(csr), tile_width=t, slots=s)
    a.validate()
    backend.poison()
    out = host_csr(backend, a.tocsr())
    want = canonical_csr(csr)
    assert out.dtype == F64
    assert_csr_equal(out, want)
    assert a.nnz == want.nnz


@given(case=csr_cases())
def test_csr_input_is_canonicalised_whatever_its_flags_say(backend, case):
    """A CSR matrix that claims to be canonical is sorted and summed all the same.

    cupyx's ``csr_matrix(dense)`` wrote each row's columns out of order and flagged the
    result canonical (CuPy 14.2 with cuSPARSE's denseToSparse, H200, 2026-12-03): twell must
    never take a format flag's word for it."""
    csr, t, s = case
    want = canonical_csr(csr)  # before the flag is set: scipy's own methods trust it
    x = backend.sparse(csr.copy())
    x.has_canonical_format = True  # a lie unless the draw happens to be canonical
    a = twell.TwELLMatrix(x, tile_width=t, slots=s)
    a.validate()
    assert_csr_equal(host_csr(backend, a.tocsr()), want)


def test_scipy_csr_storage_past_its_last_row_is_ignored():
    # A scipy CSR matrix may hold arrays longer than indptr[-1] (scipy's own toarray and nnz
    # ignore the rest; its constructor trims them, so they are set afterwards, as code that
    # resizes in place leaves them); what lies past indptr[-1] (here NaN in a column out of
    # range) belongs to no row.
    indptr = np.array([0, 2, 2, 3])
    indices = np.array([3, 1, 0, 99, 7], dtype=np.int32)
    data = np.array([1.5, -2.0, 4.0, np.nan, 1.0])
    x = sp.csr_array((data[:3], indices[:3], indptr), shape=(3, 5))
    x.indices, x.data = indices, data
    assert x.nnz == 3
    a = twell.TwELLMatrix(x, tile_width=2)
    a.validate()
    assert a.nnz == 3
    want = np.zeros((3, 5))
    want[0, 1], want[0, 3], want[2, 0] = -2.0, 1.5, 4.0
    assert_dense_equal(a.toarray(), want)


@given(case=coo_cases())
def test_coo_duplicates_are_summed_and_zeros_dropped(backend, case):
    coo = sp.coo_array((case.vals, (case.rows, case.cols)), shape=case.shape)
    a = twell.TwELLMatrix(backend.sparse(coo), tile_width=case.tile_width, slots=case.slots)
    a.validate()
    assert_dense_equal(backend.to_host(a.toarray()), case.dense())  # np.add.at oracle
    assert_csr_equal(host_csr(backend, a.tocsr()), canonical_csr(coo))


@given(case=cases(values="any"))
@edge_examples()
def test_tocoo_is_canonical(backend, case):
    a = twell.TwELLMatrix(backend.asarray(case.dense), tile_width=case.tile_width,
                          slots=case.slots)
    coo = host_coo(backend, a.tocoo())
    want = canonical_csr(case.dense).tocoo()
    assert coo.shape == case.dense.shape
    np.testing.assert_array_equal(coo.row, want.row)
    np.testing.assert_array_equal(coo.col, want.col)
    assert_dense_equal(coo.data, want.data)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_tocsr_keeps_the_dtype(backend, dtype):
    x = cast(np.array([[0, 1.5], [2.0, 0]]), dtype)
    a = twell.TwELLMatrix(backend.asarray(x))
    assert a.tocsr().dtype == dtype
    assert a.tocoo().dtype == dtype


def test_bfloat16_tocsr_is_a_type_error(backend):
    a = twell.TwELLMatrix(backend.asarray(cast(np.eye(2), BF16)))
    with pytest.raises(TypeError, match="astype"):
        a.tocsr()
    with pytest.raises(TypeError, match="astype"):
        a.tocoo()


@pytest.mark.parametrize("method", ["tocsr", "tocoo"])
def test_float16_export_to_scipy_is_usable_or_a_type_error(method):
    """Regression: on the host, tocsr() of a float16 matrix returned a csr_array scipy cannot
    use (its toarray() raised) and tocoo() raised scipy's ValueError. Either works or says to
    cast, as for bfloat16."""
    a = twell.TwELLMatrix(np.array([[0, 1.5], [2.0, 0]], dtype=np.float16))
    try:
        out = getattr(a, method)()
    except TypeError as e:
        assert "astype" in str(e)
        return
    assert_dense_equal(np.asarray(out.toarray(), dtype=np.float64), [[0, 1.5], [2.0, 0]])


def test_float16_tocsr_is_a_type_error_on_the_gpu(gpu):
    a = twell.TwELLMatrix(gpu.asarray(np.eye(2, dtype=np.float16)))
    with pytest.raises(TypeError, match="float32"):
        a.tocsr()


# -- ELL round trips ----------------------------------------------------------------

@given(case=cases(values="any"))
@edge_examples()
def test_ell_round_trips(backend, case):
    x = backend.asarray(case.dense)
    e = twell.ELLMatrix(x)
    assert_dense_equal(backend.to_host(e.toarray()), case.dense)
    a = twell.TwELLMatrix(e, tile_width=case.tile_width, slots=case.slots)
    a.validate()
    assert_dense_equal(dense_from_parts(a), case.dense)
    e2 = a.to_ell()
    assert e2.width == e.width
    np.testing.assert_array_equal(backend.to_host(e2.indices), backend.to_host(e.indices))
    assert_dense_equal(backend.to_host(e2.data), backend.to_host(e.data))
    assert_parts_equal(twell.TwELLMatrix(e2, tile_width=case.tile_width, slots=case.slots), a)


# -- all pairs of formats -------------------------------------------------------------

def make(backend, fmt, dense, t, s):
    """``dense`` in format ``fmt`` on ``backend``."""
    if fmt == "dense":
        return backend.asarray(dense)
    if fmt == "csr":
        return backend.sparse(sp.csr_array(dense))
    if fmt == "coo":
        return backend.sparse(sp.coo_array(dense))
    if fmt == "ell":
        return twell.ELLMatrix(backend.asarray(dense))
    return twell.TwELLMatrix(backend.asarray(dense), tile_width=t, slots=s)


def convert(obj, fmt, via, t, s):
    """``obj`` converted to ``fmt`` with twell's API, through a TwELL or an ELL matrix."""
    if fmt == "twell":
        return twell.TwELLMatrix(obj, tile_width=t, slots=s)
    if fmt == "ell":
        return twell.ELLMatrix(obj)
    hub = twell.TwELLMatrix(obj, tile_width=t, slots=s) if via == "twell" else twell.ELLMatrix(obj)
    return {"dense": hub.toarray, "csr": hub.tocsr, "coo": hub.tocoo}[fmt]()


def check_format(backend, out, fmt, dense, t, s):
    """``out`` is ``dense`` in format ``fmt``, canonical, on ``backend``."""
    if fmt == "dense":
        assert backend.is_native(out)
        assert_dense_equal(backend.to_host(out), dense, F64)
    elif fmt == "csr":
        assert_csr_equal(host_csr(backend, out), canonical_csr(dense))
    elif fmt == "coo":
        coo = host_coo(backend, out)
        assert coo.nnz == np.count_nonzero(dense)
        assert_dense_equal(coo.toarray(), dense)
    elif fmt == "ell":
        assert isinstance(out, twell.ELLMatrix) and backend.is_native(out.data)
        assert out.width == (int((dense != 0).sum(axis=1).max()) if dense.shape[0] else 0)
        assert_dense_equal(backend.to_host(out.toarray()), dense)
        assert out.nnz == np.count_nonzero(dense)
    else:
        assert isinstance(out, twell.TwELLMatrix) and backend.is_native(out.counts)
        out.validate()
        assert_parts_equal(out, twell.TwELLMatrix.from_dense(dense, tile_width=t, slots=s))


PAIRS = [pytest.param(src, dst, via, id=f"{src}-to-{dst}" + (f"-via-{via}" if via else ""))
         for src in FORMATS for dst in FORMATS
         for via in (["twell", "ell"] if dst in ("dense", "csr", "coo") else [None])]


@pytest.mark.parametrize("src, dst, via", PAIRS)
@given(case=cases(values="any", max_rows=16, max_cols=300))
@edge_examples(max_cols=300)
def test_conversion_between_every_pair_of_formats(backend, src, dst, via, case):
    t, s = case.tile_width, case.slots
    obj = make(backend, src, case.dense, t, s)
    out = convert(obj, dst, via, t, s)
    check_format(backend, out, dst, case.dense, t, s)


@pytest.mark.parametrize("fmt", ["twell", "csr", "coo", "ell", "array", None])
def test_asformat(backend, fmt):
    x = np.array([[0, 1.0, 0], [2.0, 0, 3.0]])
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=2)
    out = a.asformat(fmt)
    if fmt in ("twell", None):
        assert out is a
        assert a.asformat("twell", copy=True) is not a
        return
    check_format(backend, out, {"array": "dense"}.get(fmt, fmt), x, 2, 1)


# -- canonical form -------------------------------------------------------------------------

@given(case=cases(values="any", max_rows=20, max_cols=300))
@edge_examples(max_cols=300)
def test_canonical_form_whatever_the_path(backend, case):
    """Equal matrices have equal storage arrays, whatever the input and whatever the slot
    count or tile width they went through; GPU results equal NumPy results bit for bit."""
    t, s = case.tile_width, case.slots
    dense = case.dense
    x = backend.asarray(dense)
    want = twell.TwELLMatrix.from_dense(dense, tile_width=t, slots=s)  # host
    r, c = np.nonzero(dense)
    perm = np.random.default_rng(0).permutation(r.size)
    shuffled = sp.coo_array((dense[r, c][perm], (r[perm], c[perm])), shape=dense.shape)

    def twell_(obj, **kw):
        return twell.TwELLMatrix(obj, **{"tile_width": t, "slots": s, **kw})

    base = twell_(x)
    paths = {
        "dense": lambda: base,
        "csr": lambda: twell_(backend.sparse(sp.csr_array(dense))),
        "csc": lambda: twell_(backend.sparse(sp.csc_array(dense))),
        "shuffled coo": lambda: twell_(backend.sparse(shuffled)),
        "ell": lambda: twell_(twell.ELLMatrix(x)),
        "from slots=1": lambda: twell_(twell_(x, slots=1)),
        "from slots=tile_width": lambda: twell_(twell_(x, slots=t)),
        "from tile_width=3": lambda: twell_(twell_(x, tile_width=3, slots=2)),
        "transposed twice": lambda: twell_(base.T.T),
        "storage tuple": lambda: twell.TwELLMatrix(
            (base.counts, base.data, base.indices, base.overflow_indptr, base.overflow_indices,
             base.overflow_data), shape=dense.shape, tile_width=t),
        "copy": base.copy,
        "times one": lambda: base * 1,
    }
    for name, path in paths.items():
        got = path()
        assert isinstance(got, twell.TwELLMatrix), name
        try:
            assert_parts_equal(got, want)
        except AssertionError as e:
            raise AssertionError(f"path {name!r}: {e}") from None


@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
@given(case=cases(values="any", max_rows=20, max_cols=300))
def test_canonical_form_in_narrow_dtypes(backend, dtype, case):
    t, s = case.tile_width, case.slots
    dense = case.dense
    x = cast(dense, dtype)
    want = twell.TwELLMatrix.from_dense(x, tile_width=t, slots=s)
    got = [
        twell.TwELLMatrix(backend.asarray(x), tile_width=t, slots=s),
        twell.TwELLMatrix(twell.TwELLMatrix(backend.asarray(dense), tile_width=t,
                                            slots=1).astype(dtype), tile_width=t, slots=s),
        twell.TwELLMatrix(backend.asarray(dense), tile_width=t, slots=s, dtype=dtype),
    ]
    for a in got:
        a.validate()
        assert_parts_equal(a, want)


# -- regressions found on the GPU --------------------------------------------------------------

@pytest.mark.parametrize("path", ["twell", "ell", "astype"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_subnormals_are_non_zeros_on_the_gpu(gpu, dtype, path):
    """Regression: GPU float comparisons flushed float32/bfloat16 subnormals to zero, so TwELL
    and ELL packing dropped -1e-40, a non-zero in NumPy; so did CuPy's float64 -> float32
    cast in astype (twell_cast now converts in integer arithmetic)."""
    x = np.array([[-1e-40, 1.0, 0.0]])
    assert np.count_nonzero(cast(x, dtype)) == 2
    if path == "twell":
        m = twell.TwELLMatrix(gpu.asarray(cast(x, dtype)))
    elif path == "ell":
        m = twell.ELLMatrix(gpu.asarray(cast(x, dtype)))
    else:
        m = twell.TwELLMatrix(gpu.asarray(x)).astype(dtype)
    assert m.nnz == 2
    assert_dense_equal(gpu.to_host(m.toarray()), cast(x, dtype), dtype)


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_duplicates_with_inf_on_the_gpu(gpu, fmt):
    """Regression: on the GPU, summing duplicates (cupy's add.reduceat) let the Inf of row 0
    spill into row 1: [[inf], [nan]] instead of [[inf], [-0.25]]."""
    rows, cols = np.array([0, 1, 0, 1, 0]), np.zeros(5, dtype=int)
    vals = np.array([np.inf, 1.0, 2.0, -1.25, 1.0])
    coo = sp.coo_array((vals, (rows, cols)), shape=(2, 1))
    x = gpu.sparse(coo) if fmt == "coo" else gpu.sparse(sp.csr_array(
        (vals[[0, 2, 4, 1, 3]], cols, np.array([0, 3, 5])), shape=(2, 1)))
    a = twell.TwELLMatrix(x)
    assert_dense_equal(gpu.to_host(a.toarray()), [[np.inf], [-0.25]])


def test_float64_to_bfloat16_rounds_once(backend):
    """Regression: ml_dtypes releases that convert float64 through float32 round twice, so
    1 + 2**-8 + 2**-30 became 1.0 (seen on the GPU machine's ml_dtypes); twell rounds once,
    on both backends, whatever the release."""
    x = np.array([[1 + 2**-8 + 2**-30, 1 + 2**-8, -(1 + 3 * 2**-8), 2.0**-134 + 2.0**-160]])
    want = np.array([[1 + 2**-7, 1.0, -(1 + 2**-6), 2.0**-133]])
    for a in (twell.TwELLMatrix(backend.asarray(x)).astype(BF16),
              twell.TwELLMatrix(backend.asarray(x), dtype=BF16)):
        got = backend.to_host(a.toarray()).astype(np.float64)
        assert np.array_equal(got, want)
