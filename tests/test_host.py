"""twell._host: a host matrix's compressed rows, the scipy kernels that use them, and the
read-only storage that keeps the two forms equal."""

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import BF16, F16, F32, F64, assert_parts_equal, cast, dense_from_parts, tile_counts
from hypothesis import given
from hypothesis import strategies as st
from strategies import cases, edge_examples

import twell
from twell import _host, _layout, _numpy_backend


def poisson(grid):
    """The 2-D Poisson matrix (5-point stencil) of a ``grid`` x ``grid`` mesh, float64 CSR."""
    t = sp.diags_array([-1.0, 2.0, -1.0], offsets=[-1, 0, 1], shape=(grid, grid))
    eye = sp.identity(grid, format="csr")
    return sp.csr_array(sp.kron(eye, t) + sp.kron(t, eye))


def powerlaw(rng, n, mean_degree, alpha):
    """Pareto(alpha) out-degrees with mean ~mean_degree, uniform columns, float64 CSR."""
    xmin = mean_degree * (alpha - 1) / alpha
    degrees = np.minimum((xmin * (1 + rng.pareto(alpha, n))).astype(np.int64), n)
    rows = np.repeat(np.arange(n), degrees)
    cols = rng.integers(0, n, rows.size)
    a = sp.csr_array((rng.standard_normal(rows.size), (rows, cols)), shape=(n, n))
    a.sum_duplicates()
    return a


def activations(rng, m=4096, k=5632, density=0.01, dtype=np.float32):
    x = rng.standard_normal((m, k)).astype(dtype)
    return np.where(rng.random((m, k)) < density, x, 0).astype(dtype)


def csr_bytes(c):
    return c.data.nbytes + c.indices.nbytes + c.indptr.nbytes


@pytest.mark.parametrize("name", ["poisson", "powerlaw", "activations"])
def test_default_layout_takes_at_most_three_times_csr(rng, name):
    # Issue 36's budget: with default arguments, a host TwELLMatrix (storage and compressed
    # rows together, the storage built) takes at most 3x the bytes of the CSR it came from.
    c = {"poisson": lambda: poisson(300),
         "powerlaw": lambda: powerlaw(rng, 100_000, 16, 2.0),
         "activations": lambda: sp.csr_array(activations(rng))}[name]()
    a = twell.TwELLMatrix(c)
    a.validate()  # builds the storage too
    storage = sum(p.nbytes for p in (a.counts, a.data, a.indices, a.overflow_indptr,
                                     a.overflow_indices, a.overflow_data))
    assert storage <= _layout.STORAGE_BUDGET * csr_bytes(c)
    assert a.nbytes <= 3 * csr_bytes(c)
    if name != "activations":  # wide rows of few entries: one tile as wide as the row
        assert a.tile_width == 1 << (c.shape[1] - 1).bit_length()
    else:
        assert a.tile_width == 256


@given(case=cases(values="finite"))
@edge_examples(finite=True)
def test_tile_counts_histogram_of_the_compressed_rows(case):
    csr = sp.csr_array(case.dense)
    rows = _host.host_csr(csr.indptr, csr.indices, csr.data)
    got = _host.tile_counts_histogram(rows, case.dense.shape, case.tile_width)
    per_tile = tile_counts(case.dense, case.tile_width).ravel()
    # Up to the largest count: the empty bins past it are left out.
    want = np.bincount(per_tile, minlength=1)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int64 and len(got) <= case.tile_width + 1
    assert rows.indptr.tolist() == csr.indptr.tolist()  # left as it was


@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16], ids=["f64", "f32", "f16", "bf16"])
@given(case=cases(values="finite", max_rows=24), n=st.sampled_from([None, 1, 5]))
@edge_examples(finite=True, n=3)
def test_host_products_are_scipys_and_the_specifications(dtype, case, n):
    # A host product runs scipy's kernel on the compressed rows: column order from zero, in
    # float32 for 16-bit values, rounded once. The NumPy backend's spmm (the specification
    # the GPU is held to) sums in the same order: the same bits.
    x = cast(case.dense, dtype)
    a = twell.TwELLMatrix(x, tile_width=case.tile_width, slots=case.slots)
    rng = np.random.default_rng(case.dense.shape[0])
    k = x.shape[1]
    b = cast(rng.uniform(-2, 2, (k,) if n is None else (k, n)), dtype)
    got = a @ b
    acc = np.float64 if dtype == F64 else np.float32
    want = (sp.csr_array(x.astype(acc)) @ b.astype(acc)).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.view(f"u{dtype.itemsize}"),
                                  want.view(f"u{dtype.itemsize}"))
    b2 = b.reshape(k, 1 if n is None else n)
    spec = _numpy_backend.spmm(a._parts, a.shape, a.tile_width, np.ascontiguousarray(b2),
                               dtype).reshape(got.shape)
    np.testing.assert_array_equal(spec.view(f"u{dtype.itemsize}"), got.view(f"u{dtype.itemsize}"))


def test_construction_from_csr_builds_no_storage_until_asked(rng):
    c = poisson(30)
    a = twell.TwELLMatrix(c)
    assert a._p is None  # compressed rows only
    assert (a @ np.ones(900)).shape == (900,) and a._p is None
    assert a.T._p is None and a.tocsr().nnz == c.nnz and a._p is None
    np.testing.assert_array_equal(a.toarray(), c.toarray())
    assert a._p is None
    a.validate()  # the storage, built from the rows
    assert a._p is not None
    np.testing.assert_array_equal(dense_from_parts(a), c.toarray())
    assert a.overflow_nnz == int(a.overflow_indices.size) and a.slots == a.data.shape[2]


def test_the_storage_of_a_host_matrix_is_read_only(rng):
    # The compressed rows and the storage hold the same entries: the storage cannot be
    # written, so they never disagree.
    a = twell.TwELLMatrix(activations(rng, 50, 600), tile_width=64, slots=2)
    a @ np.ones(600, np.float32)
    for array in (a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices,
                  a.overflow_data):
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0


def test_shared_storage_stays_writable_and_products_follow_it(rng):
    # The tuple form shares the caller's arrays: no compressed rows are kept, and a write
    # into the arrays shows in the next product.
    x = activations(rng, 20, 300, 0.05)
    a = twell.TwELLMatrix(x, tile_width=64, slots=2)
    arrays = tuple(p.copy() for p in (a.counts, a.data, a.indices, a.overflow_indptr,
                                      a.overflow_indices, a.overflow_data))
    b = twell.TwELLMatrix(arrays, shape=a.shape, tile_width=64)
    v = np.ones(300, np.float32)
    np.testing.assert_allclose(b @ v, x @ v, rtol=1e-5)
    arrays[1][...] *= 2  # every slot value doubled
    assert b._csr is None
    over = _overflow_part(a)
    want = 2 * (dense_from_parts(a) - over) @ v + over @ v
    np.testing.assert_allclose(b @ v, want, rtol=1e-5)


def _overflow_part(a):
    """The overflow entries alone as a dense array."""
    out = np.zeros(a.shape)
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.overflow_indptr))
    out[rows, a.overflow_indices] = a.overflow_data
    return out


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=["f64", "f32", "bf16"])
def test_conversions_and_transposes_from_the_compressed_rows(rng, dtype):
    x = cast(activations(rng, 60, 900, 0.03, np.float64), dtype)
    a = twell.TwELLMatrix(x)
    np.testing.assert_array_equal(a.toarray().view(f"u{dtype.itemsize}"),
                                  x.view(f"u{dtype.itemsize}"))
    t = a.T
    assert t.shape == (900, 60) and t.tile_width == a.tile_width
    np.testing.assert_array_equal(t.toarray().view(f"u{dtype.itemsize}"),
                                  np.ascontiguousarray(x.T).view(f"u{dtype.itemsize}"))
    np.testing.assert_array_equal(dense_from_parts(t), x.T.astype(np.float64))
    t.validate()
    if dtype != BF16:
        c = a.tocsr()
        assert c.has_canonical_format and c.dtype == dtype
        np.testing.assert_array_equal(c.toarray(), x)
        c.data[...] = 0  # a copy: the matrix keeps its values
        np.testing.assert_array_equal(a.toarray(), x)


def test_a_matrix_from_its_own_storage_equals_it(rng):
    x = activations(rng, 40, 700, 0.02)
    a = twell.TwELLMatrix(x, tile_width=128, slots=3)
    b = twell.TwELLMatrix._from_parts(a._parts, a.shape, a.tile_width)  # storage first
    assert b._csr is None
    np.testing.assert_array_equal(b @ np.ones(700, np.float32), a @ np.ones(700, np.float32))
    assert b._csr is not None  # made for the product
    assert_parts_equal(a, b)


def test_a_pickled_host_matrix_keeps_its_storage_read_only(rng):
    import pickle

    a = twell.TwELLMatrix(activations(rng, 30, 500, 0.03), tile_width=64, slots=2)
    a.validate()  # builds the storage
    b = pickle.loads(pickle.dumps(a))
    assert not b.data.flags.writeable and not b.counts.flags.writeable
    np.testing.assert_array_equal(b.toarray(), a.toarray())
    np.testing.assert_array_equal(b @ np.ones(500, np.float32), a @ np.ones(500, np.float32))


@given(keys=st.lists(st.integers(0, 2**40), max_size=300),
       bits=st.sampled_from([1, 15, 16, 17, 32, 33, 41]), repeat=st.booleans())
def test_stable_argsort_is_numpys_stable_argsort(keys, bits, repeat):
    # The radix sort by 16-bit digits against NumPy's stable sort: keys reduced below
    # bound = 2**bits (one, two and three digits), repeated keys kept in input order.
    bound = 2**bits
    key = np.array(keys, dtype=np.int64) % bound
    if repeat:
        key = np.concatenate([key, key[::-1], key[: len(key) // 2]])
    np.testing.assert_array_equal(_host.stable_argsort(key, bound),
                                  np.argsort(key, kind="stable"))


@pytest.mark.parametrize("shape", [(1, 5000), (65, 63), (200, 333), (4096, 70)], ids=str)
def test_c_contiguous_copies_a_transposed_operand_exactly(shape):
    # A transposed array (F-ordered) is copied tile by tile; the copy is C-ordered and holds
    # the same values; a C-contiguous array is returned as it is; others go through NumPy.
    rng = np.random.default_rng(0)
    b = rng.standard_normal(shape[::-1]).astype(np.float32).T
    got = _host.c_contiguous(b)
    assert got.flags.c_contiguous and (got is b) == b.flags.c_contiguous
    np.testing.assert_array_equal(got, b)
    assert _host.c_contiguous(got) is got
    strided = rng.standard_normal((shape[0], 2 * shape[1]))[:, ::2]
    np.testing.assert_array_equal(_host.c_contiguous(strided), strided)
