"""Overflow stress: matrices that live mostly in the overflow part stay exact everywhere.

Issue 6: rows that are dense, tiles that are all over capacity, one huge row. Every
conversion (dense, CSR, COO, ELL, TwELL with another layout, packed where it fits,
save/load) and SpMM/SpMV must reproduce scipy exactly. Values are multiples of 1/4 in
[-4, 4] and right-hand sides multiples of 1/4 in [-2, 2], so every product and sum here
is exact in float32 and float64: the comparisons are equalities, not tolerances.
Sizes stay small so the file runs in seconds on the CPU.
"""

import io

import numpy as np
import pytest
import scipy.sparse as sp

import twell


def _dyadic(rng, n):
    v = rng.integers(1, 17, n) / 4.0
    return v * rng.choice([-1.0, 1.0], n)


def dense_rows(rng):
    """Every element of every row is an entry: all tiles hold T entries."""
    return _dyadic(rng, 24 * 300).reshape(24, 300)


def all_over_capacity(rng, tile_width=16, slots=2):
    """Every (row, tile) holds between slots + 1 and tile_width entries."""
    m, k = 30, 10 * tile_width + 5
    x = np.zeros((m, k))
    for t0 in range(0, k, tile_width):
        width = min(tile_width, k - t0)
        for r in range(m):
            n = rng.integers(min(slots + 1, width), width + 1)
            cols = t0 + rng.choice(width, n, replace=False)
            x[r, cols] = _dyadic(rng, n)
    return x


def one_huge_row(rng):
    """One dense row of 5000 columns among rows with a few entries."""
    m, k = 40, 5000
    x = np.zeros((m, k))
    r, c = rng.integers(0, m, 200), rng.integers(0, k, 200)
    x[r, c] = _dyadic(rng, 200)
    x[17] = _dyadic(rng, k)
    return x


MATRICES = {"dense rows": dense_rows, "all tiles over capacity": all_over_capacity,
            "one huge row": one_huge_row}
LAYOUTS = [(16, 1), (16, 2), (256, 1), (256, 4), (3, 1), (1, 1)]


@pytest.fixture(params=list(MATRICES), ids=list(MATRICES))
def matrix(request, rng):
    return MATRICES[request.param](rng)


@pytest.mark.parametrize(("tile_width", "slots"), LAYOUTS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_every_conversion_is_exact(backend, matrix, tile_width, slots, dtype):
    x = matrix.astype(dtype)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=tile_width, slots=slots)
    a.validate()
    want = sp.csr_array(x)
    assert a.nnz == want.nnz
    assert a.overflow_nnz == want.nnz - int(backend.to_host(a.counts).sum())
    assert a.overflow_nnz > 0 or slots == tile_width  # T = S = 1 cannot overflow
    np.testing.assert_array_equal(backend.to_host(a.toarray()), x)
    got = backend.to_host(a.tocsr())
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
    coo = backend.to_host(a.tocoo())
    np.testing.assert_array_equal(sp.coo_array(coo).toarray(), x)
    ell = a.to_ell()
    ell.validate()
    assert ell.width == int(np.diff(want.indptr).max())
    np.testing.assert_array_equal(backend.to_host(ell.toarray()), x)
    # Back from every format, with the same layout: the same storage arrays (canonical form).
    for src in (backend.sparse(want), ell, a.tocoo(), twell.TwELLMatrix(a, tile_width=5)):
        b = twell.TwELLMatrix(src, tile_width=tile_width, slots=slots)
        for p, q in zip(_parts(b), _parts(a), strict=True):
            np.testing.assert_array_equal(backend.to_host(p), backend.to_host(q))
    np.testing.assert_array_equal(backend.to_host(a.T.toarray()), x.T)


def _parts(a):
    return (a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices,
            a.overflow_data)


@pytest.mark.parametrize(("tile_width", "slots"), LAYOUTS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_spmm_and_spmv_are_exact(backend, matrix, tile_width, slots, dtype, rng):
    x = matrix.astype(dtype)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=tile_width, slots=slots)
    ref = sp.csr_array(matrix)
    k = x.shape[1]
    for n in (1, 3, 8, 33):
        b = (rng.integers(-8, 9, (k, n)) / 4.0).astype(dtype)
        got = backend.to_host(a @ backend.asarray(b))
        np.testing.assert_array_equal(got, (ref @ b.astype(np.float64)).astype(dtype))
    v = (rng.integers(-8, 9, k) / 4.0).astype(dtype)
    np.testing.assert_array_equal(backend.to_host(a @ backend.asarray(v)),
                                  (ref @ v.astype(np.float64)).astype(dtype))
    w = (rng.integers(-8, 9, x.shape[0]) / 4.0).astype(dtype)
    np.testing.assert_array_equal(backend.to_host(backend.asarray(w) @ a),
                                  (ref.T @ w.astype(np.float64)).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, twell.bfloat16], ids=["f32", "bf16"])
def test_products_with_tensor_core_shapes_round_once(backend, matrix, dtype, rng):
    # bfloat16 holds k/4 for k <= 16 exactly; fp32 accumulation keeps the sums exact; N = 16
    # and tile_width=256 take the tensor-core SpMM on the GPU for bfloat16.
    # The result is rounded once, from the exact sum, to the output dtype.
    x = matrix.astype(dtype)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=256, slots=2)
    ref = sp.csr_array(matrix)
    b = (rng.integers(-8, 9, (x.shape[1], 16)) / 4.0)
    got = backend.to_host(a @ backend.asarray(b.astype(dtype)))
    want = (ref @ b).astype(np.float32).astype(dtype)
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_save_and_load_keep_every_overflow_entry(matrix, tmp_path):
    for tile_width, slots in LAYOUTS:
        a = twell.TwELLMatrix(matrix, tile_width=tile_width, slots=slots)
        f = io.BytesIO()
        twell.save(f, a, compressed=True)
        f.seek(0)
        b = twell.load(f)
        for p, q in zip(_parts(b), _parts(a), strict=True):
            np.testing.assert_array_equal(p, q)
        np.testing.assert_array_equal(b.toarray(), matrix)


def test_packed_where_it_fits_and_a_clear_error_where_it_does_not(backend, rng):
    # Tiles of up to 127 entries: compression 2 (capacity 127) holds them, 8 (31) does not.
    m, k = 12, 512
    x = np.zeros((m, k))
    for r in range(m):
        for t0 in (0, 256):
            n = rng.integers(32, 128)
            x[r, t0 + rng.choice(256, n, replace=False)] = _dyadic(rng, n)
    x[0, :256] = 0
    x[0, :127] = _dyadic(rng, 127)  # one tile exactly at the capacity of compression 2
    a = twell.TwELLMatrix(backend.asarray(x.astype(twell.bfloat16)), tile_width=256, slots=4)
    assert a.overflow_nnz > 0
    words = a.to_packed(compression=2)
    b = twell.TwELLMatrix.from_packed(words, (m, k), compression=2)
    np.testing.assert_array_equal(backend.to_host(b.toarray()).astype(np.float64), x)
    with pytest.raises(ValueError, match="compression"):
        a.to_packed(compression=8)
