"""The CUDA side: layout header vs Python, launch variants, determinism, no host copies."""

import numpy as np
import pytest
import scipy.sparse
from helpers import (
    GPU_SKIP_REASON,
    Backend,
    assert_values_equal,
    cast,
    force_short_rows,
    gpu_spmm,
    misaligned,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import twell
from twell import _algorithms, _layout

if not twell.cuda_available():
    pytest.skip(GPU_SKIP_REASON, allow_module_level=True)
import cupy  # noqa: E402

from twell._cuda import _backend as cuda  # noqa: E402
from twell._cuda import _canonical, _compile, _pack, _policy, _reduce, _spmm  # noqa: E402

pytestmark = pytest.mark.gpu  # every test here runs kernels ("-m gpu" selects them)


def test_layout_header_agrees_with_python():
    # Guards the rule that layout arithmetic lives once in Python and once in the header.
    n_cols = np.array([0, 1, 255, 256, 257, 5632, 65536, 2**31 - 1], dtype=np.int64)
    widths = np.array([1, 3, 256, 256, 256, 256, 65536, 7], dtype=np.int32)
    tiles = cupy.zeros(n_cols.size, dtype=np.int64)
    capacity = cupy.zeros(n_cols.size, dtype=np.int32)
    kernel = _compile.function("unpack.cu", "twell_layout_probe")
    kernel((1,), (32,), (cupy.asarray(n_cols), cupy.asarray(widths), np.int32(n_cols.size),
                         tiles, capacity))
    expect = [_layout.n_tiles(int(k), int(t)) for k, t in zip(n_cols, widths, strict=True)]
    assert tiles.get().tolist() == expect
    assert capacity.get()[:3].tolist() == [_layout.packed_capacity(c) for c in (2, 4, 8)]


def _activations(rng, m, k, density, dtype):
    x = rng.standard_normal((m, k)) * (rng.random((m, k)) < density)
    return cupy.asarray(x.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, twell.bfloat16, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_vector_and_scalar_paths_agree(rng, dtype):
    # A view starting one element in is not 16-byte aligned: the launchers must fall back
    # to one value at a time and give the same matrix as the aligned copy.
    x = _activations(rng, 33, 1025, 0.05, dtype)
    aligned = cupy.ascontiguousarray(x[:, 1:])
    shifted = cupy.empty((33 * 1024 + 1,), dtype=x.dtype)[1:].reshape(33, 1024)
    shifted[...] = aligned
    a = twell.TwELLMatrix(aligned, slots=4)
    b = twell.TwELLMatrix(shifted, slots=4)
    for f in ("counts", "data", "indices", "overflow_indptr", "overflow_indices"):
        assert cupy.array_equal(getattr(a, f).view(np.uint8), getattr(b, f).view(np.uint8)), f
    rhs = _activations(rng, 1024, 24, 1.0, dtype)
    odd = cupy.empty((1024 * 24 + 1,), dtype=rhs.dtype)[1:].reshape(1024, 24)
    odd[...] = rhs
    assert cupy.array_equal((a @ rhs).view(np.uint8), (a @ odd).view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float16, twell.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("tile_width", "slots"), [(256, 6), (256, "auto"), (64, 3), (1024, 40)])
def test_pack_sees_every_16_bit_pattern(rng, dtype, tile_width, slots):
    # The 16-bit pack tests 8 values at once on their bits (pack.cu, nonzero_bits): each of
    # the 65536 patterns, at a random place of a sparse matrix, must be an entry exactly when
    # its low 15 bits are not all zero (NaN, Inf and subnormals of either sign are entries;
    # +0.0 and -0.0 are not), and come back with its bits. Tile widths of one vector load a
    # pair (256), a partial one (64) and four (1024); slots that leave an overflow.
    patterns = np.arange(2**16, dtype=np.uint16)
    raw = np.zeros(1024 * 1024, dtype=np.uint16)
    raw[rng.permutation(raw.size)[: patterns.size]] = patterns  # ~6% of the matrix
    raw = raw.reshape(1024, 1024)
    a = twell.TwELLMatrix(cupy.asarray(raw).view(dtype), tile_width=tile_width, slots=slots)
    entry = (raw & 0x7FFF) != 0
    assert a.nnz == int(entry.sum()) == 2**16 - 2
    assert slots == "auto" or a.overflow_nnz > 0
    assert np.array_equal(a.toarray().get().view(np.uint16), np.where(entry, raw, 0))


@pytest.mark.parametrize("slots", [1, 3, 64])
def test_packing_and_spmm_are_bitwise_deterministic(rng, slots):
    x = _activations(rng, 200, 777, 0.1, twell.bfloat16)
    rhs = _activations(rng, 777, 130, 1.0, twell.bfloat16)
    first = twell.TwELLMatrix(x, slots=slots)
    y0 = first @ rhs
    for _ in range(3):
        again = twell.TwELLMatrix(x, slots=slots)
        for f in _algorithms.Parts._fields:
            assert cupy.array_equal(getattr(first, f).view(np.uint8),
                                    getattr(again, f).view(np.uint8))
        assert cupy.array_equal((again @ rhs).view(np.uint16), y0.view(np.uint16))


def test_every_output_element_is_written(rng):
    # to_dense allocates with cupy.empty: poison the pool's next block and check nothing leaks.
    x = _activations(rng, 64, 700, 0.03, np.float32)
    a = twell.TwELLMatrix(x, tile_width=100, slots=2)
    poison = cupy.full(x.shape, np.nan, dtype=np.float32)
    del poison  # freed into CuPy's pool: the next same-size allocation reuses it
    assert cupy.array_equal(a.toarray(), x)
    y = a @ cupy.ones((700, 40), dtype=np.float32)
    assert not bool(cupy.isnan(y).any())


@pytest.mark.parametrize("dtype", [np.float32, np.float16, twell.bfloat16, np.float64],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("tile_width", "slots"), [(4096, 100), (4096, 3), (8, 1), (264, 40)])
@pytest.mark.parametrize("k", [9000, 9001])
def test_to_dense_on_wide_and_narrow_tiles(rng, dtype, tile_width, slots, k):
    # twell_unpack_dense, a warp per (row, tile): wide tiles take many zero stores a lane and
    # several slots a lane (slots past 32), narrow ones leave most lanes idle; K = 9001 takes
    # one value at a time (VEC = 1) and a partial last tile. Poisoned output; the values
    # compared exactly (-0.0 is not an entry, so the dense matrix holds +0.0 there).
    x = _activations(rng, 37, k, 0.05, dtype)
    a = twell.TwELLMatrix(x, tile_width=tile_width, slots=slots)
    Backend("cupy").poison()
    assert_values_equal(a.toarray().get(), x.get(), "toarray")


def test_gpu_results_stay_on_the_gpu(rng):
    x = _activations(rng, 20, 300, 0.1, np.float32)
    a = twell.TwELLMatrix(x)
    assert isinstance(a.counts, cupy.ndarray) and isinstance(a.toarray(), cupy.ndarray)
    assert isinstance(a @ cupy.ones((300, 3), np.float32), cupy.ndarray)
    assert isinstance(a @ cupy.ones(300, np.float32), cupy.ndarray)
    with pytest.raises(TypeError, match="cannot mix NumPy"):
        a @ np.ones((300, 3), np.float32)


def test_kernels_run_on_the_current_stream(rng):
    x = _activations(rng, 50, 600, 0.05, np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        a = twell.TwELLMatrix(x, slots=3)
        y = a @ cupy.ones((600, 8), np.float32)
    stream.synchronize()
    want = x.astype(np.float64) @ cupy.ones((600, 8))
    assert float(cupy.abs(y - want).max()) < 1e-4


def test_spmm_launcher_handles_wide_and_one_column_right_hand_sides(rng):
    x = _activations(rng, 40, 513, 0.2, np.float64)
    a = twell.TwELLMatrix(x, slots=7)
    for n in (1, 2, 255, 257, 1000):
        b = _activations(rng, 513, n, 1.0, np.float64)
        want = x @ b
        got = cuda.spmm(a._parts, a.shape, a.tile_width, b, np.dtype(np.float64))
        assert float(cupy.abs(got - want).max()) < 1e-10, n


_ALL = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), twell.bfloat16]


@pytest.mark.parametrize("src", _ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("dst", _ALL, ids=lambda d: d.name)
def test_cast_kernel_rounds_like_numpy_and_keeps_subnormals(rng, src, dst):
    # Guards twell_cast: CuPy's casts flush float32/bfloat16 subnormals, which dropped entries.
    if src == dst:
        pytest.skip("no conversion")
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -1e-40, 1e-45, 3e-39, 6e-8, 1e-300,
               1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-40, 1 + 2**-8, 1 + 2**-24, 2.0**-150,
               3 * 2.0**-150, 2.0**-134, 2.0**-25, 65520.0, 3.5e38, -2.0**-126]
    x = np.concatenate([special, rng.standard_normal(1000) * 10.0 ** rng.integers(-45, 39, 1000)])
    with np.errstate(all="ignore"):
        x = x.astype(src)
        want = cast(x, dst)
    got = cuda.cast(cupy.asarray(x), dst).get()
    assert got.dtype == dst
    assert np.array_equal(got.view(f"u{dst.itemsize}"), want.view(f"u{dst.itemsize}")) or (
        np.array_equal(np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64)))
        and np.array_equal(got[~np.isnan(want.astype(np.float64))].view(f"u{dst.itemsize}"),
                           want[~np.isnan(want.astype(np.float64))].view(f"u{dst.itemsize}")))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, twell.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("m", "k", "n", "tile_width", "slots", "density"), [
    (1, 1, 8, 256, 1, 1.0),           # one row, one column
    (513, 700, 72, 256, 3, 0.02),     # a partial row block, last tile and column block
    (1100, 600, 64, 100, 20, 0.3),    # every slot in use, odd tile width
    (700, 600, 16, 100, 32, 0.4),     # many slots
    (40, 2048, 136, 320, 5, 0.05),    # wide tiles; overflow in most tiles
    (600, 300, 8, 16, 2, 0.5),        # narrow tiles
    (64, 700, 40, 16, 3, 0.02),       # 44 tiles a row: the non-empty ones found 32 at a time
    (50, 4000, 300, 32, 2, 0.3),      # 125 tiles of ~10 entries, 2 slots: a batch of 32
                                      # entries spans tiles; heavy overflow
    (300, 5000, 600, 64, 4, 0.005),   # ~1 entry per non-empty tile; N = 600: 4 column chunks
])
@pytest.mark.parametrize("short", [False, True], ids=["long-rows", "short-rows"])
def test_every_spmm_kernel_matches_the_float64_product(rng, monkeypatch, dtype, m, k, n,
                                                       tile_width, slots, density, short):
    # Every way of the SpMM (the default, the gather kernel twell_spmm_rows, and
    # A.toarray() @ B by cuBLAS), within rounding of the float64 product, on edge shapes of
    # the kernels' blockings (twell_spmm_rows: a shape (G, C, E) per N and kind of layout,
    # _policy.rows_shape; these N, with the layout taken for
    # one of short rows and then not, take every one for 16-bit values and float32).
    force_short_rows(monkeypatch, short)
    x = _activations(rng, m, k, density, dtype)
    a = twell.TwELLMatrix(x, tile_width=tile_width, slots=slots)
    assert a.slots == slots
    rhs = _activations(rng, k, n, 1.0, dtype)
    want = x.astype(np.float64).get() @ rhs.astype(np.float64).get()
    scale = np.abs(x.astype(np.float64).get()) @ np.abs(rhs.astype(np.float64).get())
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-2
    args = (a._parts, a.shape, a.tile_width, rhs, np.dtype(dtype))
    for way in (None, "rows", "dense"):
        Backend("cupy").poison()  # an output element left unwritten shows as NaN
        got = gpu_spmm(*args, way=way).astype(np.float64).get()
        assert np.all(np.abs(got - want) <= tol * scale + 1e-30), way
    np.testing.assert_array_equal((a @ rhs).get(), gpu_spmm(*args).get())
    # The Listed instances (the tile index, here whatever its rule) give the rows kernel's
    # bits for the same shape, with their windows of G tiles loaded G listed tiles at a time
    # (44 and 125 tiles a row above).
    monkeypatch.setattr(_policy, "index_pays", lambda *_: True)
    bits = f"u{np.dtype(dtype).itemsize}"
    rows = gpu_spmm(*args, way="rows").get().view(bits)
    Backend("cupy").poison()
    listed = gpu_spmm(*args, way="rows", tile_index=_algorithms.tile_index(a.counts))
    np.testing.assert_array_equal(listed.get().view(bits), rows)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, twell.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [8, 48, 200, 600])
@pytest.mark.parametrize("chunk", [32, 256])
@pytest.mark.parametrize("short", [False, True], ids=["long-rows", "short-rows"])
def test_gather_spmm_splits_rows_with_a_long_overflow(rng, monkeypatch, dtype, n, chunk, short):
    # A row whose overflow holds two chunks or more is summed by a warp per chunk of the
    # overflow plus its own (split_row in spmm.cu). Rows with overflows just below, at and
    # above that, starting on and off chunk boundaries, next to each other, to short rows and
    # to empty ones; the budget rule of split_chunk is set aside so that small products
    # split too. Within rounding of the float64 product, every output element written, and
    # the same bits for B one element past a 16-byte boundary (the VEC = 1 instances).
    force_short_rows(monkeypatch, short)
    monkeypatch.setattr(_policy, "SPMM_SPLIT_CHUNK", chunk)
    monkeypatch.setattr(_policy, "split_chunk",
                        lambda n_over, *_: chunk if n_over >= 2 * chunk else 0)
    k, t = 4096, 256  # 16 tiles, one slot each: a row's overflow is its entries past 16
    lengths = [0, 3, 16 + 2 * chunk - 1, 16 + 2 * chunk, 16 + 2 * chunk + 1, 0, 5,
               16 + 5 * chunk + 7, 16 + 2 * chunk, 40, 16 + 9 * chunk + 31, 1, 16 + chunk]
    x = np.zeros((len(lengths), k))
    for r, length in enumerate(lengths):
        if length >= 16:  # every tile's first column, then others: length - 16 overflow
            rest = np.setdiff1d(np.arange(k), np.arange(0, k, t))
            cols = np.concatenate([np.arange(0, k, t), rng.choice(rest, length - 16, False)])
        else:
            cols = rng.choice(k, size=length, replace=False)
        x[r, cols] = rng.standard_normal(length) + np.sign(rng.standard_normal(length)) * 0.5
    x = cast(x, dtype)
    a = twell.TwELLMatrix(cupy.asarray(x), tile_width=t, slots=1)
    over = np.diff(a.overflow_indptr.get())
    assert (over >= 2 * chunk).sum() == 5 and (over == 2 * chunk - 1).sum() == 1
    rhs = cast(rng.standard_normal((k, n)), dtype)
    want = x.astype(np.float64) @ rhs.astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(rhs.astype(np.float64))
    tol = {8: 1e-12, 4: 1e-5}.get(np.dtype(dtype).itemsize, 1e-2)
    got = {}
    index = _algorithms.tile_index(a.counts)
    monkeypatch.setattr(_policy, "index_pays", lambda *_: True)
    for name, b, listed in (("aligned", cupy.asarray(rhs), None),
                            ("misaligned", misaligned(cupy, rhs), None),
                            ("listed", cupy.asarray(rhs), index)):
        Backend("cupy").poison()  # an output element left unwritten shows as NaN
        y = gpu_spmm(a._parts, a.shape, t, b, np.dtype(dtype), way="rows", tile_index=listed)
        got[name] = y.get()
        assert np.all(np.abs(got[name].astype(np.float64) - want) <= tol * scale), name
    bits = f"u{np.dtype(dtype).itemsize}"
    np.testing.assert_array_equal(got["misaligned"].view(bits), got["aligned"].view(bits))
    np.testing.assert_array_equal(got["listed"].view(bits), got["aligned"].view(bits))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, twell.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("lanes", _compile.SPMV_LANES, ids=lambda g: f"{g}-lanes")
@pytest.mark.parametrize(("tile_width", "slots"), [(16, 2), (256, 3), (4096, 1)])
def test_spmv_matches_the_float64_product_on_every_team_width(rng, monkeypatch, dtype, lanes,
                                                              tile_width, slots):
    # The SpMV takes a thread per row (twell_spmv_thread_rows) or a team of 32 lanes
    # (twell_spmv_rows), by the layout (_policy.spmv_lanes): rows empty, short,
    # spanning windows of empty tiles (4 windows of counts are read at once: 288 tiles at
    # tile width 16), with an overflow a thread sums alone (at most 16 entries) and one the
    # warp sums (several such rows in one warp), long enough for several rounds of 4 loads
    # per lane. Within rounding of the float64 product, every element written.
    monkeypatch.setattr(_policy, "spmv_lanes", lambda *_: lanes)
    k = 4608
    lengths = [0, 1, 5, 0, 37, 300, 1500, 2, 0, 129, 4000, 17]
    x = np.zeros((len(lengths) * 7, k))  # every length at 7 row offsets within a warp
    for r in range(x.shape[0]):
        length = lengths[r % len(lengths)]
        cols = rng.choice(k, size=length, replace=False)
        x[r, cols] = rng.standard_normal(length) + np.sign(rng.standard_normal(length)) * 0.5
    x = cast(x, dtype)
    a = twell.TwELLMatrix(cupy.asarray(x), tile_width=tile_width, slots=slots)
    assert a.overflow_nnz > 0
    v = cast(rng.standard_normal(k), dtype)
    want = x.astype(np.float64) @ v.astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(v.astype(np.float64))
    tol = {8: 1e-12, 4: 1e-5}.get(np.dtype(dtype).itemsize, 1e-2)
    bits = f"u{np.dtype(dtype).itemsize}"
    got = {}
    monkeypatch.setattr(_policy, "index_pays", lambda *_: True)
    for listed in (None, _algorithms.tile_index(a.counts)):  # the Listed instance too
        Backend("cupy").poison()  # an output element left unwritten shows as NaN
        y = gpu_spmm(a._parts, a.shape, tile_width, cupy.asarray(v).reshape(k, 1),
                     np.dtype(dtype), way="rows", tile_index=listed)
        got[listed is None] = y.get().ravel()
        assert np.all(np.abs(got[listed is None].astype(np.float64) - want) <= tol * scale)
    np.testing.assert_array_equal(got[False].view(bits), got[True].view(bits))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, twell.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("way", ["thread", "warp"])
@pytest.mark.parametrize("k", [3000, 70000], ids=["uint16-columns", "int-columns"])
@pytest.mark.parametrize("hub_min", [None, 16], ids=["hub-min-default", "hub-min-16"])
def test_one_tile_spmv_matches_the_float64_product(rng, monkeypatch, dtype, way, k, hub_min):
    # One tile a row (tile width >= K) takes twell_spmv_one_tile (a thread per row) or
    # twell_spmv_one_tile_warp (a warp streams 32 rows): rows empty, within their slots, just
    # past them, with overflows and hub rows (overflow of SPMV_HUB_MIN entries or more) that
    # the first blocks sum, a block a row: at the default bound (256) the rows of 2,500
    # overflow entries (rounds of 256 * Loads), at 16 also those of 16 to 100 (one just at
    # the bound, one below), several next to each other, so that a warp's overflow runs
    # between hubs; every length at several offsets within a warp, and a last warp of 16
    # rows; then without any overflow (the instance that reads no overflow row pointer) at
    # 2,504 slots (the warp's slot rows by division, not by its reciprocal). Within rounding
    # of the float64 product, every element written, the same bits from A @ x's kept launch,
    # from A @ X with one column and twice.
    monkeypatch.setattr(_policy, "one_tile_way", lambda *_: way)
    if hub_min:
        monkeypatch.setattr(_policy, "SPMV_HUB_MIN", hub_min)
    slots = 4
    lengths = [0, 1, 3, 4, 5, 4 + 15, 4 + 16, 4 + 17, 0, 2, 4 + 40, 4 + 100, 7, 4 + 16, 4 + 33,
               4 + 2500]
    rows = [lengths[r % len(lengths)] for r in range(len(lengths) * 9)]
    x = np.zeros((len(rows), k))
    for r, length in enumerate(rows):
        cols = rng.choice(k, size=length, replace=False)
        x[r, cols] = rng.standard_normal(length) + np.sign(rng.standard_normal(length)) * 0.5
    x = cast(x, dtype)
    v = cast(rng.standard_normal(k), dtype)
    want = x.astype(np.float64) @ v.astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(v.astype(np.float64))
    tol = {8: 1e-12, 4: 1e-5}.get(np.dtype(dtype).itemsize, 1e-2)
    bits = f"u{np.dtype(dtype).itemsize}"
    width = 1 << (k - 1).bit_length()
    for kept in (slots, max(lengths)):  # with an overflow, then without
        a = twell.TwELLMatrix(cupy.asarray(x), tile_width=width, slots=kept)
        assert a.n_tiles == 1 and (a.overflow_nnz > 0) == (kept == slots)
        vd = cupy.asarray(v)
        results = []
        for column in (False, True, False):  # A @ x, A @ X of one column, A @ x again
            Backend("cupy").poison()  # an output element left unwritten shows as NaN
            results.append((a @ vd.reshape(k, 1)).ravel().get() if column else (a @ vd).get())
            assert np.all(np.abs(results[-1].astype(np.float64) - want) <= tol * scale)
        for other in results[1:]:
            np.testing.assert_array_equal(other.view(bits), results[0].view(bits))


def test_matvec_keeps_its_launch_only_for_the_same_storage(rng):
    # A @ x keeps the SpMV's launch (TwELLMatrix._fast_matvec) while the storage arrays and
    # the tile index are the same objects: a new storage in the same matrix (resize) or a
    # tile index made later gives the new product; operands it does not take (another
    # dtype, a strided vector, a matrix) take the general path; a pickle leaves it behind.
    import pickle

    x = _activations(rng, 300, 4000, 0.01, np.float32)
    a = twell.TwELLMatrix(x, tile_width=256, slots=3)
    v = cupy.asarray(rng.standard_normal(4000).astype(np.float32))
    np.testing.assert_allclose((a @ v).get(), x.get() @ v.get(), rtol=1e-5, atol=1e-5)
    assert "_spmv" in a.__dict__
    np.testing.assert_allclose(a.matvec(v).get(), x.get() @ v.get(), rtol=1e-5, atol=1e-5)
    a.resize((200, 4000))
    assert "_spmv" not in a.__dict__
    np.testing.assert_allclose((a @ v).get(), x.get()[:200] @ v.get(), rtol=1e-5, atol=1e-5)
    a.index_tiles()
    np.testing.assert_allclose((a @ v).get(), x.get()[:200] @ v.get(), rtol=1e-5, atol=1e-5)
    assert a.__dict__["_spmv"][2] is a._tile_index
    wide = cupy.asarray(rng.standard_normal((8000,)).astype(np.float32))[::2]
    np.testing.assert_allclose((a @ wide).get(), x.get()[:200] @ wide.get(), rtol=1e-5,
                               atol=1e-5)
    v64 = v.astype(np.float64)
    assert (a @ v64).dtype == np.float64
    assert "_spmv" not in pickle.loads(pickle.dumps(a)).__dict__


@pytest.mark.parametrize(("slots", "tile_width", "lanes"),
                         [(5, 65536, 1), (10, 16384, 1), (1, 512, 1), (2, 256, 32),
                          (3, 256, 32)])
def test_spmv_takes_a_thread_per_row_when_rows_have_room_for_few_entries(rng, slots,
                                                                         tile_width, lanes):
    # The rule reads the layout's shape (n_tiles * slots, plus the overflow's even share):
    # at most SPMV_THREAD_ROW_ENTRIES = 256 entries a row take a thread per row.
    x = _activations(rng, 64, 65536, 0.0005, np.float32)
    a = twell.TwELLMatrix(x, tile_width=tile_width, slots=slots)
    assert _policy.spmv_lanes(a._parts, a.shape[0]) == lanes
    # With the tile index, the room is the longest row's listed tiles times the slots.
    index = _algorithms.tile_index(a.counts)
    assert index.max_tiles * slots < 256
    assert _policy.spmv_lanes(a._parts, a.shape[0], index) == 1


@pytest.mark.parametrize("dtype", [np.float64, np.float32, twell.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 8, 48, 200, 600])
@pytest.mark.parametrize("short", [False, True], ids=["long-rows", "short-rows"])
def test_the_listed_kernels_sum_like_the_others(rng, monkeypatch, dtype, n, short):
    # The Listed instances walk a row's listed tiles G at a time, each window of G tiles
    # whole even when a load of G listed tiles ends inside it (for_each_listed_batch in
    # spmm.cu). For one kernel shape they give the bits of the instances without the index
    # (the SpMV's team of 32 reads its counts either way). Rows: clusters of a few entries
    # per tile over 20-tile spans (several listed tiles per window, loads ending
    # mid-window), hubs listing most of their 1024 tiles, empty rows, an overflow.
    force_short_rows(monkeypatch, short)
    monkeypatch.setattr(_policy, "index_pays", lambda *_: True)
    k, t = 8192, 8
    x = np.zeros((96, k))
    for r in range(x.shape[0]):
        if r % 6 == 0:
            cols = rng.choice(k, size=2000, replace=False)  # ~880 tiles: reads its counts
        elif r % 6 == 3:
            continue
        else:
            spans = [rng.integers(0, k - 160) for _ in range(1 + r % 4)]
            cols = np.unique(np.concatenate([s + rng.choice(160, 12, replace=False)
                                             for s in spans]))
        x[r, cols] = rng.standard_normal(cols.size) + np.sign(rng.standard_normal(cols.size))
    x = cast(x, dtype)
    a = twell.TwELLMatrix(cupy.asarray(x), tile_width=t, slots=2)
    index = _algorithms.tile_index(a.counts)
    listed = np.diff(index.indptr.get())
    assert (listed[listed > 0] <= 128).sum() >= 60 and (listed > 800).sum() == 16
    assert a.overflow_nnz > 0
    rhs = cast(rng.standard_normal((k, n)), dtype)
    want = x.astype(np.float64) @ rhs.astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(rhs.astype(np.float64))
    tol = {8: 1e-12, 4: 1e-5}.get(np.dtype(dtype).itemsize, 1e-2)
    bits = f"u{np.dtype(dtype).itemsize}"
    lanes = _compile.SPMV_LANES if n == 1 else [None]
    for g in lanes:
        if g is not None:
            monkeypatch.setattr(_policy, "spmv_lanes", lambda *_, g=g: g)
        got = []
        for tile_index in (None, index):
            Backend("cupy").poison()  # an output element left unwritten shows as NaN
            y = gpu_spmm(a._parts, a.shape, t, cupy.asarray(rhs), np.dtype(dtype),
                         way="rows", tile_index=tile_index).get()
            assert np.all(np.abs(y.astype(np.float64) - want) <= tol * scale), (g, tile_index)
            got.append(y.view(bits))
        np.testing.assert_array_equal(got[1], got[0])


@pytest.mark.parametrize(("k", "tile_width", "per_row", "pays"), [
    (65536, 512, 4, False),    # 128 tiles: one round of count reads
    (65536, 256, 4, True),     # 256 tiles, ~4 listed
    (65536, 256, 40, False),   # 256 tiles, ~38 listed: more than 1 in 8
    (1_000_000, 4096, 5, True),
])
def test_the_kernels_walk_the_tile_index_where_rows_span_many_tiles(rng, k, tile_width, per_row,
                                                                    pays):
    # index_pays: more than INDEX_MIN_TILES tiles a row, at most 1 in INDEX_MAX_SHARE listed.
    x = np.zeros((64, k), dtype=np.float32)
    for r in range(64):
        x[r, rng.choice(k, size=per_row, replace=False)] = 1.0 + r
    a = twell.TwELLMatrix(cupy.asarray(x), tile_width=tile_width, slots=2)
    a.index_tiles()
    assert _policy.index_pays(a._parts, a.shape[0], a.tile_index) == pays


@pytest.mark.parametrize("dtype", [twell.bfloat16, np.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("way", [None, "rows", "dense"])
def test_spmm_propagates_inf_and_nan_only_where_a_has_entries(rng, dtype, way):
    # The dense product multiplies A's zeros by B: the launcher must hand B with Inf/NaN to
    # twell_spmm_rows (gated on the device).
    x = _activations(rng, 600, 512, 0.01, dtype)
    rhs = _activations(rng, 512, 64, 1.0, dtype)
    rhs[3, 5], rhs[300, 7] = np.inf, np.nan
    a = twell.TwELLMatrix(x, slots=8)
    Backend("cupy").poison()
    got = gpu_spmm(a._parts, a.shape, a.tile_width, rhs, np.dtype(dtype),
                   way=way).astype(np.float64).get()
    want = scipy.sparse.csr_array(x.astype(np.float64).get()) @ rhs.astype(np.float64).get()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [twell.bfloat16, np.float32], ids=["bf16", "f32"])
def test_default_spmm_densifies_above_the_measured_density(rng, monkeypatch, dtype):
    # A @ B takes A.toarray() @ B (cuBLAS) when the entry count known from construction puts
    # the density above _policy.dense_product_density, and the gather kernel otherwise or
    # when the count is unknown, with no host synchronisation either way. A dense pack
    # knows the count with the slots given too (its one read carries the histogram of the
    # per-tile totals); parts wrapped without it do not. The minimum work is lowered so that
    # a test-sized product qualifies.
    monkeypatch.setattr(_policy, "DENSE_PRODUCT_MIN_WORK", 1)
    densified = []
    to_dense = _spmm.to_dense
    monkeypatch.setattr(_spmm, "to_dense",
                        lambda *args: densified.append(args[1]) or to_dense(*args))
    itemsize = np.dtype(dtype).itemsize
    threshold = _policy.dense_product_density(40, itemsize)  # 0.12 (bf16), 0.27 (float32)
    rhs = _activations(rng, 700, 40, 1.0, dtype)
    for density, slots, dense in [(2 * threshold, "auto", True), (threshold / 3, "auto", False),
                                  (2 * threshold, 40, True), (threshold / 3, 40, False),
                                  (2 * threshold, None, False)]:
        x = _activations(rng, 300, 700, density, dtype)
        a = twell.TwELLMatrix(x, slots=40 if slots is None else slots)
        assert a._nnz_hint == int(cupy.count_nonzero(x))
        if slots is None:  # the count unknown
            a = twell.TwELLMatrix._from_parts(a._parts, a.shape, a.tile_width)
        densified.clear()
        Backend("cupy").poison()
        got = (a @ rhs).astype(np.float64).get()
        assert densified == ([(300, 700)] if dense else []), (density, slots)
        want = x.astype(np.float64).get() @ rhs.astype(np.float64).get()
        scale = np.abs(x.astype(np.float64).get()) @ np.abs(rhs.astype(np.float64).get())
        tol = 1e-5 if itemsize == 4 else 1e-2
        assert np.all(np.abs(got - want) <= tol * scale + 1e-30), (density, slots)


@pytest.mark.parametrize("dtype", [twell.bfloat16, np.float16, np.float32],
                         ids=["bf16", "f16", "f32"])
def test_spmm_reads_the_last_column_of_the_widest_tile(rng, dtype):
    # tile_width 65536: a 16-bit slot travels as value bits << 16 | column, and column 65535
    # fills the low half of that word.
    k = 65536
    x = np.zeros((5, k), dtype=np.float64)
    x[0, [0, 1, k - 1]] = [1.5, -2.0, 3.0]
    x[3, k - 1], x[4, 32768] = -0.75, 2.5
    a = twell.TwELLMatrix(cupy.asarray(x.astype(dtype)), tile_width=k, slots=2)
    assert a.overflow_nnz == 1  # row 0 holds three entries in its one tile
    rhs = _activations(rng, k, 24, 1.0, dtype)
    want = x @ rhs.astype(np.float64).get()
    for way in (None, "rows", "dense"):
        Backend("cupy").poison()
        got = gpu_spmm(a._parts, a.shape, a.tile_width, rhs, np.dtype(dtype),
                       way=way).astype(np.float64).get()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2, err_msg=str(way))


def test_float32_products_never_densify_into_tf32(rng, monkeypatch):
    # With CuPy's float32 matmul set to TF32 (CUPY_TF32=1), the dense path would round the
    # inputs to 10-bit mantissas: the automatic choice then keeps float32 on the gather kernel.
    import os

    on = os.environ.get("CUPY_TF32", "0") not in ("", "0")
    assert _policy.float32_gemm_is_tf32() is on
    monkeypatch.setattr(_policy, "DENSE_PRODUCT_MIN_WORK", 1)
    monkeypatch.setattr(_policy, "float32_gemm_is_tf32", lambda: True)
    monkeypatch.setattr(_spmm, "to_dense", lambda *args: pytest.fail("densified"))
    x = _activations(rng, 300, 700, 0.9, np.float32)
    rhs = _activations(rng, 700, 40, 1.0, np.float32)
    want = x.astype(np.float64).get() @ rhs.astype(np.float64).get()
    np.testing.assert_allclose((twell.TwELLMatrix(x) @ rhs).get(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("why", ["too large for the device", "allocation fails"])
def test_default_spmm_gathers_when_the_dense_temporary_does_not_fit(rng, monkeypatch, why):
    # The temporary may take 1/8 of the device's memory (of the total, so that the choice does
    # not depend on what is free at the call); when it cannot be allocated anyway, the gather
    # kernel runs.
    monkeypatch.setattr(_policy, "DENSE_PRODUCT_MIN_WORK", 1)
    if why == "too large for the device":
        monkeypatch.setattr(_policy, "device_bytes", lambda: 1)
        monkeypatch.setattr(_spmm, "to_dense", lambda *args: pytest.fail("densified"))
    else:
        def out_of_memory(*args):
            raise cupy.cuda.memory.OutOfMemoryError(1 << 40, 0)
        monkeypatch.setattr(_spmm, "to_dense", out_of_memory)
    x = _activations(rng, 300, 700, 0.5, twell.bfloat16)
    rhs = _activations(rng, 700, 40, 1.0, twell.bfloat16)
    a = twell.TwELLMatrix(x)
    want = x.astype(np.float64).get() @ rhs.astype(np.float64).get()
    Backend("cupy").poison()
    np.testing.assert_allclose((a @ rhs).astype(np.float64).get(), want, rtol=2e-2, atol=0.1)


@pytest.mark.parametrize("size", [1, 257, 4095, 4096, 70000])
def test_count_histogram_is_bincount(rng, size):
    # Sizes on both sides of the shared-memory histogram (4096 bins); values outside
    # [0, size) are counted in the last bin, never dropped or wrapped.
    counts = rng.integers(-3, size + 3, size=100_003).astype(np.int32)
    counts[:50_000] = rng.integers(0, min(size, 3), size=50_000)  # crowded bins: contention
    got = cuda.count_histogram(cupy.asarray(counts.reshape(1, -1)), size).get()
    inside = (counts >= 0) & (counts < size)
    want = np.append(np.bincount(counts[inside], minlength=size), np.sum(~inside))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    from twell import _numpy_backend
    np.testing.assert_array_equal(_numpy_backend.count_histogram(counts, size), want)


def _scan_reference(values, minus):
    v = values.astype(np.int64).reshape(-1)
    if minus is not None:
        v = np.maximum(v - minus, 0)
    return np.concatenate([[0], np.cumsum(v)])


# Sizes around the scan's 4096-item tiles and its 32-tile look-back window (131072 items);
# 300_000 pairs are ~73 tiles, as the paper's FFN layout gives 88.
@pytest.mark.parametrize("n", [1, 31, 4095, 4096, 4097, 131_072, 131_073, 300_000])
@pytest.mark.parametrize(("dtype", "minus"), [(np.int32, None), (np.int32, 13),
                                               (np.int64, None)])
def test_exclusive_scan_is_cumsum(rng, n, dtype, minus):
    # Against NumPy's int64 cumsum; negative values (not clamped) and values past 2**31 in
    # the sum check the sign and width of the status words' sums; the output is poisoned.
    hi = 2**40 if dtype == np.int64 else 2**20
    values = rng.integers(-hi // 4, hi, size=n).astype(dtype)
    values[: n // 2] = rng.integers(0, 30, size=n // 2)  # counts, some past the 13 slots
    Backend("cupy").poison()
    got = _reduce.scan(cupy.asarray(values), minus=minus)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.get(), _scan_reference(values, minus))


@pytest.mark.parametrize(("rows", "row_length"), [(1, 1), (7, 1), (300, 22), (16384, 22),
                                                  (3, 5000), (1000, 257)])
def test_exclusive_scan_writes_row_starts(rng, rows, row_length):
    # The overflow's row pointer: starts[r] = out[r * row_length], rows + 1 entries.
    totals = rng.integers(0, 20, size=(rows, row_length)).astype(np.int32)
    Backend("cupy").poison()
    out, starts = _reduce.scan(cupy.asarray(totals), minus=6, rows=rows)
    want = _scan_reference(totals, 6)
    np.testing.assert_array_equal(out.get(), want)
    np.testing.assert_array_equal(starts.get(), want[::row_length])
    assert starts.size == rows + 1


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_exclusive_scan_clamps_row_starts_to_a_capacity(rng, share):
    # The bounded pack's row pointer into an overflow that keeps `cap` entries: the offsets
    # stay whole, the row starts stop at the capacity.
    totals = rng.integers(0, 20, size=(500, 22)).astype(np.int32)
    want = _scan_reference(totals, 6)
    cap = int(want[-1] * share)
    Backend("cupy").poison()
    out, starts = _reduce.scan(cupy.asarray(totals), minus=6, rows=500, cap=cap)
    np.testing.assert_array_equal(out.get(), want)
    np.testing.assert_array_equal(starts.get(), np.minimum(want[::22], cap))


def test_exclusive_scan_of_nothing():
    out, starts = _reduce.scan(cupy.zeros((4, 0), np.int32), minus=1, rows=4)
    assert out.get().tolist() == [0] and starts.get().tolist() == [0] * 5
    assert _algorithms.exclusive_cumsum(cupy.zeros(0, np.int64)).get().tolist() == [0]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), max_size=9000), st.sampled_from([None, 0, 5]))
def test_exclusive_cumsum_agrees_across_backends(values, minus):
    # One function, two backends: the CuPy kernel against NumPy's cumsum, bool input too.
    host = np.array(values, dtype=np.int64)
    got = _reduce.scan(cupy.asarray(host.astype(np.int32)), minus=minus)
    np.testing.assert_array_equal(got.get(), _scan_reference(host, minus))
    flags = host % 3 == 0
    np.testing.assert_array_equal(_algorithms.exclusive_cumsum(cupy.asarray(flags)).get(),
                                  _algorithms.exclusive_cumsum(flags))


@pytest.mark.parametrize(("m", "k", "tile_width", "density"),
                         [(300, 700, 256, 0.05), (64, 5000, 7, 0.3), (40, 70, 70, 1.0),
                          (5, 9, 4, 0.0), (1000, 300, 256, 0.002)])
def test_tile_counts_csr_kernel_counts_every_tile(rng, m, k, tile_width, density):
    # The CuPy backend counts with twell_pack_csr's count mode, the NumPy one with binary
    # searches over sorted keys; the reference is a bincount of (row, tile) keys, and the
    # counts must add up to the entries, every row and tile included (empty ones too).
    x = scipy.sparse.csr_array(
        (rng.standard_normal((m, k)) * (rng.random((m, k)) < density)).astype(np.float32))
    nt = _layout.n_tiles(k, tile_width)
    rows = np.repeat(np.arange(m), np.diff(x.indptr))
    want = np.bincount(rows * nt + x.indices // tile_width, minlength=m * nt).reshape(m, nt)
    got = cuda.tile_counts_csr(cupy.asarray(x.indptr), cupy.asarray(x.indices),
                                        (m, k), tile_width)
    assert got.dtype == _layout.COUNT_DTYPE and got.shape == (m, nt)
    np.testing.assert_array_equal(got.get(), want)
    np.testing.assert_array_equal(
        _algorithms.tile_counts_csr(x.indptr.astype(np.int64), x.indices, (m, k), tile_width),
        want)


@pytest.mark.parametrize("dtype", [np.float16, twell.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "shifted"])
def test_find_nonfinite_sees_every_position(dtype, aligned):
    # The SpMM's tensor-core gate: one Inf or NaN anywhere in B, including the elements past
    # the last whole 16-byte vector and in a view that is not 16-byte aligned.
    n = 8 * 1000 + 5
    base = cupy.empty(n + 1, dtype=dtype)
    b = base[:n] if aligned else base[1:]
    b[...] = 1.5
    b[::7] = -0.0  # zeros and negative values are finite
    b[1::11] = 6e-8 if dtype == np.float16 else 1e-40  # subnormals are finite
    assert not bool(_reduce.nonfinite(b))
    for pos in (0, 3, 7, 8, n // 2, n - 6, n - 1):
        for bad in (np.inf, -np.inf, np.nan):
            b[pos] = bad
            assert bool(_reduce.nonfinite(b)), (pos, bad)
            b[pos] = 1.5
    assert not bool(_reduce.nonfinite(b[:0]))


@pytest.mark.parametrize("dtype", [np.float16, twell.bfloat16], ids=lambda d: np.dtype(d).name)
def test_count_positive_counts_what_relu_keeps(rng, dtype):
    # gate_nnz_hint's count: the values whose int16 bits are positive (above +0, and +NaN),
    # never -0, a negative value or -NaN; every position of an odd length, and a view.
    n = 3 * 4096 + 77
    bits = rng.integers(-(1 << 15), 1 << 15, size=n, dtype=np.int16)
    bits[::13] = 0            # +0
    bits[1::17] = -(1 << 15)  # -0
    bits[2::19] = 1           # the smallest positive subnormal
    values = cupy.asarray(bits).view(dtype)
    assert _reduce.count_positive(values).dtype == np.uint64
    assert int(_reduce.count_positive(values)) == int((bits > 0).sum())
    assert int(_reduce.count_positive(values[1000:1777])) == int((bits[1000:1777] > 0).sum())
    assert int(_reduce.count_positive(values[:0])) == 0


def test_auto_slots_pack_knows_its_overflow_without_reading_it_back(rng, monkeypatch):
    # slots="auto" sizes the overflow from the per-tile counts: the pack must not read the
    # kernel's counter, and must give the same bits as packing with those slots given.
    x = _activations(rng, 300, 1000, 0.08, np.float32)
    x[7, :256] = 1.0  # a full tile: overflow for sure
    want = twell.TwELLMatrix(x, tile_width=256, slots=twell.TwELLMatrix(x).slots)
    csr = want.tocsr()

    def no_read_back(counter):
        raise AssertionError("the overflow size was read back")

    monkeypatch.setattr(_pack, "overflow_size", no_read_back)
    for src in (x, csr):
        got = twell.TwELLMatrix(src, tile_width=256)
        assert got.slots == want.slots and got.overflow_indices.size > 0
        for f in ("counts", "data", "indices", "overflow_indptr", "overflow_indices",
                  "overflow_data"):
            assert cupy.array_equal(getattr(got, f).view(np.uint8),
                                    getattr(want, f).view(np.uint8)), f


# -- canonical.cu: CSR input in any column order -> canonical CSR --------------------------

_SPECIALS = {np.dtype(np.float64): [0.0, -0.0, np.nan, np.inf, 5e-324],
             np.dtype(np.float32): [0.0, -0.0, np.nan, -np.inf, 1e-45],
             np.dtype(np.float16): [0.0, -0.0, np.nan, np.inf, 6e-8],
             twell.bfloat16: [0.0, -0.0, np.nan, -np.inf, 1e-40]}


@st.composite
def _messy_csr(draw):
    """Host CSR arrays whose rows are in any column order (some in order), with duplicates
    (runs across warp chunks too), zeros of both signs, NaN, Inf, subnormals, values that
    cancel, and sometimes spare storage past indptr[-1]."""
    dtype = draw(st.sampled_from(list(_SPECIALS)))
    m = draw(st.integers(1, 12))
    k = draw(st.sampled_from([1, 3, 40, 300, 70000]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lengths = rng.choice([0, 1, 5, 31, 32, 33, 70, 200], size=m)
    rows = []
    for n in lengths:
        cols = rng.integers(0, k, size=n)
        if rng.random() < 0.3:
            cols.sort()  # in column order: copied, duplicates summed in place
        rows.append(cols)
    indices = np.concatenate(rows).astype(np.int32) if m else np.zeros(0, np.int32)
    vals = rng.standard_normal(indices.size)
    special = rng.random(indices.size) < 0.15
    vals[special] = rng.choice(_SPECIALS[dtype], size=int(special.sum()))
    if indices.size > 1:
        vals[1] = -vals[0]  # a pair that may cancel if the two land in one column
    spare = draw(st.sampled_from([0, 0, 3]))
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    data = cast(vals, dtype)
    return (indptr, np.concatenate([indices, np.zeros(spare, np.int32)]),
            np.concatenate([data, cast(np.ones(spare), dtype)]), (m, k))


@settings(max_examples=40)
@given(case=_messy_csr())
def test_canonical_csr_kernel_gives_the_host_bits(case):
    # The row sort of canonical.cu against the shared global sort on the host
    # (_algorithms.canonical_csr): the same structure and the same values bit for bit
    # (NaN's payload aside: a GPU sum with a NaN gives the canonical NaN), duplicates summed
    # in input order in the accumulation type, -0.0 and cancelled sums dropped.
    indptr, indices, data, shape = case
    want = _algorithms.canonical_csr(indptr, indices, data, shape)
    got = cuda.canonical_csr(cupy.asarray(indptr), cupy.asarray(indices), cupy.asarray(data),
                             shape)
    assert [x.dtype for x in got] == [np.int64, np.int32, data.dtype]
    np.testing.assert_array_equal(got[0].get(), want[0], err_msg="indptr")
    np.testing.assert_array_equal(got[1].get(), want[1], err_msg="indices")
    assert_values_equal(got[2].get(), want[2], "data", signed_zeros=True)
    if data.dtype in (np.float32, np.float64):  # and against scipy, independently
        n = indptr[-1]
        # scipy sums duplicates in its own order: within n * eps of the sum of magnitudes.
        mags = scipy.sparse.csr_array((np.abs(data[:n]).astype(np.float64), indices[:n].copy(),
                                       indptr.copy()), shape=shape).toarray()
        counts = scipy.sparse.csr_array((np.ones(n), indices[:n].copy(), indptr.copy()),
                                        shape=shape).toarray()
        x = scipy.sparse.csr_array((data[:n].copy(), indices[:n].copy(), indptr.copy()),
                                   shape=shape)
        x.sum_duplicates()  # in place, on the arrays it was given
        x.eliminate_zeros()
        np.testing.assert_array_equal(got[0].get(), x.indptr)
        np.testing.assert_array_equal(got[1].get(), x.indices)
        rows = np.repeat(np.arange(shape[0]), np.diff(x.indptr))
        bound = (counts * mags * np.finfo(data.dtype).eps)[rows, x.indices]
        got_data, finite = got[2].get(), np.isfinite(x.data)
        assert_values_equal(got_data[~finite], x.data[~finite], "data")
        assert np.all(np.abs(got_data[finite] - x.data[finite]) <= bound[finite])


def test_canonical_csr_falls_back_to_the_global_sort_for_long_rows(rng, monkeypatch):
    # A row out of order longer than CSR_SORT_MAX_ROW sends the whole input to the global
    # sort; a long row in order does not (it is copied). Both give the same bits.
    m, k = 50, 3000
    x = scipy.sparse.csr_array((rng.standard_normal((m, k)) * (rng.random((m, k)) < 0.05))
                               .astype(np.float32))
    x.indices[x.indptr[3]:x.indptr[4]] = x.indices[x.indptr[3]:x.indptr[4]][::-1].copy()
    args = [cupy.asarray(a) for a in (x.indptr, x.indices, x.data)]
    calls = []
    global_sort = _algorithms.canonical_csr
    monkeypatch.setattr(_algorithms, "canonical_csr",
                        lambda *a: calls.append(1) or global_sort(*a))
    fast = cuda.canonical_csr(*args, (m, k))
    assert not calls
    longest = int(np.diff(x.indptr).max())
    monkeypatch.setattr(_canonical, "CSR_SORT_MAX_ROW", int(np.diff(x.indptr)[3]) - 1)
    slow = cuda.canonical_csr(*args, (m, k))
    assert calls and longest > _canonical.CSR_SORT_MAX_ROW
    x.sort_indices()
    for g, s, w in zip(fast, slow, (x.indptr, x.indices, x.data), strict=True):
        np.testing.assert_array_equal(g.get(), w)
        np.testing.assert_array_equal(s.get(), w)
    monkeypatch.setattr(_canonical, "CSR_SORT_MAX_ROW", 1)  # every row in order: no sort
    calls.clear()
    _canonical.canonical_csr(*[cupy.asarray(a) for a in (x.indptr, x.indices, x.data)],
                             (m, k))
    assert not calls
