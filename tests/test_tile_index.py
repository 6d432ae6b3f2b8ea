"""The tile index (``TwELLMatrix.index_tiles``): each row's non-empty tiles, which products walk
instead of every count. Checked against scipy's CSR structure of the counts, and products
against the same products without the index (same bits) and against scipy in float64."""

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import BF16, F16, F32, F64, cast, dense_from_parts, editable
from hypothesis import given
from strategies import RHS, cases, edge_examples, rhs
from test_matmul import check_product, reference

import twell

DTYPES = [F64, F32, F16, BF16]
DTYPE_IDS = ["f64", "f32", "f16", "bf16"]


def _bits(backend, x):
    x = backend.to_host(x)
    return x.view(f"u{x.dtype.itemsize}")


@given(case=cases(max_rows=30, max_cols=600))
@edge_examples()
def test_the_index_lists_each_rows_non_empty_tiles(backend, case):
    a = twell.TwELLMatrix(backend.asarray(case.dense), tile_width=case.tile_width,
                          slots=case.slots)
    assert not a.has_tile_index and a.tile_index is None
    a.index_tiles()
    want = sp.csr_array(backend.to_host(a.counts) != 0)  # an independent CSR of the pairs
    index = a.tile_index
    assert backend.is_native(index.indptr) and backend.is_native(index.tiles)
    assert index.indptr.dtype == np.int64 and index.tiles.dtype == np.int32
    np.testing.assert_array_equal(backend.to_host(index.indptr), want.indptr)
    np.testing.assert_array_equal(backend.to_host(index.tiles), want.indices)
    assert index.max_tiles == int(np.diff(want.indptr).max(initial=0))
    assert isinstance(index.max_tiles, int)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@given(case=cases(values="finite", max_rows=24, max_cols=600), rhs=rhs())
@edge_examples(finite=True, rhs=RHS(3, 0))
def test_products_with_the_index_match_scipy(backend, dtype, case, rhs):
    # On the host the index only spares the scan of empty slots: the same bits. On the GPU
    # the kernels' shape may follow the index (tests/test_cuda_kernels.py holds the Listed
    # kernels to the bits of the others for one shape): within rounding of float64.
    m, k = case.dense.shape
    a = twell.TwELLMatrix(backend.asarray(cast(case.dense, dtype)), tile_width=case.tile_width,
                          slots=case.slots)
    b = backend.asarray(rhs.make(k, dtype))
    backend.poison()
    plain = a @ b
    a.index_tiles()
    backend.poison()
    listed = a @ b
    if not backend.on_gpu:
        np.testing.assert_array_equal(_bits(backend, listed), _bits(backend, plain))
    shape = (m,) if rhs.n is None else (m, rhs.n)
    magnitude = (sp.csr_array(np.abs(dense_from_parts(a)))
                 @ np.abs(cast(backend.to_host(b), np.float64)))
    check_product(backend, listed, reference(a, backend.to_host(b)), dtype, shape, magnitude)


def _wide(backend, rng, dtype=F32):
    """A wide layout: 3000 columns at tile width 16 (188 tiles), a few entries a row."""
    x = np.zeros((40, 3000))
    for r in range(x.shape[0]):
        cols = rng.choice(3000, size=r % 7 * 3, replace=False)
        x[r, cols] = rng.standard_normal(cols.size) + 2.0
    return twell.TwELLMatrix(backend.asarray(cast(x, dtype)), tile_width=16, slots=2)


def test_has_tile_index_builds_and_drops_the_index(backend, rng):
    a = _wide(backend, rng)
    a.has_tile_index = True
    assert a.has_tile_index
    first = a.tile_index
    a.has_tile_index = True  # builds it again
    assert a.tile_index is not first
    a.has_tile_index = False
    assert not a.has_tile_index and a.tile_index is None


def test_the_index_goes_where_the_counts_go(backend, rng):
    # copy, astype and scalar maps keep the counts, so the index; a new layout has none.
    a = _wide(backend, rng)
    a.index_tiles()
    c = a.copy()
    assert c.has_tile_index and c.tile_index.tiles is not a.tile_index.tiles
    np.testing.assert_array_equal(backend.to_host(c.tile_index.tiles),
                                  backend.to_host(a.tile_index.tiles))
    for kept in (a.astype(np.float64), a * 2.0, -a, a / 4):
        assert kept.has_tile_index
        np.testing.assert_array_equal(backend.to_host(kept.tile_index.indptr),
                                      backend.to_host(a.tile_index.indptr))
    for fresh in (a.T, twell.TwELLMatrix(a, tile_width=32), twell.TwELLMatrix(a.toarray()),
                  a * 0.0):
        assert not fresh.has_tile_index
    if backend.on_gpu:
        host = a.get()
        assert isinstance(host.tile_index.tiles, np.ndarray)
        np.testing.assert_array_equal(host.tile_index.tiles, a.tile_index.tiles.get())


def test_an_index_built_again_follows_counts_written_in_place(backend, rng):
    # The index describes the counts when it was built: after an edit in place (row 6's
    # entries moved to its first tile), index_tiles() again gives the new product.
    a = editable(_wide(backend, rng, F64))  # storage the caller may write, shared
    a.index_tiles()
    row = 6
    counts = backend.to_host(a.counts).copy()
    assert counts[row].sum() == 18 and a.overflow_nnz == 0
    kept = int(counts[row].sum() != 0)
    for part in (a.counts, a.data, a.indices):
        part[row] = 0
    a.counts[row, 0] = kept
    a.data[row, 0, 0] = 5.0
    a.indices[row, 0, 0] = 3
    a.validate()
    a.index_tiles()
    assert backend.to_host(a.tile_index.tiles)[
        int(a.tile_index.indptr[row]):int(a.tile_index.indptr[row + 1])].tolist() == [0]
    v = backend.asarray(rng.standard_normal(3000))
    want = sp.csr_array(dense_from_parts(a)) @ backend.to_host(v)
    got = backend.to_host(a @ v)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got[row] == 5.0 * backend.to_host(v)[3]


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
def test_row_sums_with_the_index(backend, rng, dtype):
    a = _wide(backend, rng, dtype)
    plain = a.sum(axis=1)
    a.index_tiles()
    listed = a.sum(axis=1)
    if not backend.on_gpu:  # see test_products_with_the_index_match_scipy
        np.testing.assert_array_equal(_bits(backend, listed), _bits(backend, plain))
    want = cast(dense_from_parts(a), np.float64).sum(axis=1)
    for got in (plain, listed):
        np.testing.assert_allclose(cast(backend.to_host(got), np.float64), want, rtol=1e-6)
