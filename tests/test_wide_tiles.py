"""Tiles wider than 65536 columns: int32 columns within a tile, several such tiles a row, and
the layout that ``tile_width="auto"`` gives rows of few entries over many columns (one tile as
wide as the row). scipy.sparse and NumPy float64 are the references."""

import io

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import MATMUL_RTOL, dense_from_parts, parts_of

import twell
from twell import _layout

F64, F32 = np.dtype(np.float64), np.dtype(np.float32)


def stencil(grid, dtype=np.float64):
    """The 2-D Poisson matrix of a grid x grid mesh (5 entries a row), CSR."""
    t = sp.diags([-1.0, 4.0, -1.0], [-1, 0, 1], shape=(grid, grid))
    eye = sp.identity(grid)
    return sp.csr_array(sp.kron(eye, t) + sp.kron(t, eye)).astype(dtype)


def spread(rng, m, k, per_row, dtype=np.float64):
    """``per_row`` entries a row at random columns of ``k`` (at least one per 65536-column
    band somewhere), as CSR."""
    rows = np.repeat(np.arange(m), per_row)
    cols = rng.integers(0, k, rows.size)
    cols[: min(rows.size, k // 65536 + 1)] = np.arange(0, k, 65536)[: min(rows.size,
                                                                         k // 65536 + 1)]
    c = sp.csr_array((rng.uniform(-2, 2, rows.size), (rows, cols)), shape=(m, k))
    c.sum_duplicates()
    return c.astype(dtype)


@pytest.mark.parametrize("tile_width", [65536, 65537, 70000, 2**17])
def test_index_dtype_follows_the_tile_width(backend, rng, tile_width):
    c = spread(rng, 5, 150_000, 40)
    a = twell.TwELLMatrix(backend.asarray(c), tile_width=tile_width, slots=7)
    want = np.uint16 if tile_width <= 65536 else np.int32
    assert a.indices.dtype == want == _layout.index_dtype(tile_width)
    assert a.n_tiles == -(-150_000 // tile_width) and a.overflow_nnz > 0
    a.validate()
    np.testing.assert_array_equal(dense_from_parts(a), c.toarray())
    got = backend.to_host(a.tocsr())
    assert (abs(sp.csr_array(got) - c)).nnz == 0


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("tile_width", [70000, 2**20])
def test_products_on_wide_tiles_like_scipy(backend, rng, dtype, tile_width):
    """Several tiles of int32 columns a row (70000), and one (2**20): SpMV, SpMM, A.T @ x."""
    c = spread(rng, 300, 200_000, 30, dtype)
    a = twell.TwELLMatrix(backend.asarray(c), tile_width=tile_width, slots=12)
    x = rng.uniform(-1, 1, 200_000).astype(dtype)
    b = rng.uniform(-1, 1, (200_000, 9)).astype(dtype)
    y = rng.uniform(-1, 1, 300).astype(dtype)
    c64 = c.astype(np.float64)
    for got, want in [(a @ backend.asarray(x), c64 @ x.astype(np.float64)),
                      (a @ backend.asarray(b), c64 @ b.astype(np.float64)),
                      (a.T @ backend.asarray(y), c64.T @ y.astype(np.float64))]:
        got = np.asarray(backend.to_host(got), dtype=np.float64)
        assert np.linalg.norm(got - want) <= MATMUL_RTOL[dtype] * max(np.linalg.norm(want), 1)


def test_auto_takes_one_tile_for_the_stencil_within_twice_csr(backend):
    """The 10^6-row stencil: one tile of 2**20 columns, five slots, no overflow, and storage
    within twice the CSR's bytes (at tile width 65536 it took 4.4 times)."""
    c = stencil(1000)
    a = twell.TwELLMatrix(backend.asarray(c))
    assert (a.tile_width, a.n_tiles, a.slots, a.overflow_nnz) == (2**20, 1, 5, 0)
    storage = sum(p.nbytes for p in (a.counts, a.data, a.indices, a.overflow_indptr,
                                     a.overflow_indices, a.overflow_data))
    csr_bytes = c.data.nbytes + c.indices.nbytes + 4 * (c.shape[0] + 1)
    assert storage <= 2 * csr_bytes
    x = np.random.default_rng(5).uniform(-1, 1, c.shape[1])
    got = backend.to_host(a @ backend.asarray(x))
    np.testing.assert_allclose(got, c @ x, rtol=1e-12, atol=1e-12)


def test_validate_rejects_columns_outside_a_wide_tile():
    c = sp.csr_array(np.array([[0.0, 1.0, 0.0, 2.0]]))
    for bad, message in [(-1, "negative, or at or past tile_width=70000"),
                         (70000, "negative, or at or past tile_width=70000")]:
        counts, data, indices, *rest = parts_of(twell.TwELLMatrix(c, tile_width=70000, slots=2))
        indices = indices.copy()
        indices[0, 0, 0] = bad
        with pytest.raises(ValueError, match=message):
            twell.TwELLMatrix((counts, data, indices, *rest), shape=(1, 4), tile_width=70000)


def test_validate_wants_the_dtype_of_the_tile_width():
    a = twell.TwELLMatrix(np.eye(3), tile_width=70000, slots=1)
    counts, data, indices, *rest = parts_of(a)
    with pytest.raises(TypeError, match="indices must have dtype int32; got indices.dtype=uint16"):
        twell.TwELLMatrix((counts, data, indices.astype(np.uint16), *rest), shape=(3, 3),
                          tile_width=70000)
    b = twell.TwELLMatrix(np.eye(3), tile_width=65536, slots=1)
    counts, data, indices, *rest = parts_of(b)
    with pytest.raises(TypeError, match="indices must have dtype uint16; got indices.dtype=int32"):
        twell.TwELLMatrix((counts, data, indices.astype(np.int32), *rest), shape=(3, 3),
                          tile_width=65536)


def test_files_keep_wide_tiles(rng, tmp_path):
    c = spread(rng, 20, 300_000, 10)
    a = twell.TwELLMatrix(c, tile_width=100_000, slots=3)
    path = tmp_path / "wide.twell"
    twell.save(path, a)
    b = twell.load(path)
    assert b.tile_width == 100_000 and b.indices.dtype == np.int32
    for x, y in zip(parts_of(a), parts_of(b), strict=True):
        np.testing.assert_array_equal(x, y)
    buf = io.BytesIO()
    np.savez(buf, **{**dict(np.load(path)), "indices": b.indices.astype(np.uint16)})
    (tmp_path / "narrowed.twell").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="indices.*int32"):
        twell.load(tmp_path / "narrowed.twell")


def test_relayout_between_narrow_and_wide_tiles(backend, rng):
    c = spread(rng, 50, 140_000, 25)
    wide = twell.TwELLMatrix(backend.asarray(c), tile_width=2**18)
    narrow = twell.TwELLMatrix(wide, tile_width=256)
    back = twell.TwELLMatrix(narrow, tile_width=2**18)
    assert (wide.indices.dtype, narrow.indices.dtype) == (np.int32, np.uint16)
    for x, y in zip(parts_of(wide), parts_of(back), strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(dense_from_parts(narrow), c.toarray())


def test_tile_index_is_left_alone_on_wide_tiles(backend, rng):
    """A product with the tile index of a wide layout: the same bits as without it."""
    c = spread(rng, 200, 150_000, 20)
    a = twell.TwELLMatrix(backend.asarray(c), tile_width=70000, slots=8)
    x = backend.asarray(rng.uniform(-1, 1, (150_000, 3)))
    before = backend.to_host(a @ x)
    a.index_tiles()
    np.testing.assert_array_equal(backend.to_host(a @ x), before)
    np.testing.assert_allclose(before, c @ backend.to_host(x), rtol=1e-12, atol=1e-12)


def test_gated_layer_with_wide_tiles(backend, rng):
    """A gated layer asked for tiles wider than 65536 columns: as the dense layer."""
    x = rng.standard_normal((6, 8))
    wg, wu, wd = (rng.standard_normal(s) for s in [(40, 8), (40, 8), (8, 40)])
    want = (np.maximum(x @ wg.T, 0) * (x @ wu.T)) @ wd.T
    got = twell.sparse_ffn(*(backend.asarray(a) for a in (x, wg, wu, wd)), tile_width=70000)
    np.testing.assert_allclose(backend.to_host(got), want, rtol=1e-12, atol=1e-12)
