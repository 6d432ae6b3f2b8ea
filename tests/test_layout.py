"""twell._layout: tile arithmetic, packed-layout constants and ``slots="auto"``."""

import math
import re

import numpy as np
import pytest
from helpers import gpu_test, tile_counts
from hypothesis import given
from hypothesis import strategies as st
from strategies import cases, edge_examples, histograms

import twell
from twell import _layout


def brute_overflow(hist, slots):
    """Entries beyond ``slots`` summed over (row, tile) pairs, straight from the definition."""
    return sum(h * max(c - slots, 0) for c, h in enumerate(hist))


def brute_typical(hist):
    """The count that 99% of the non-empty pairs fit in, from the sorted list of counts."""
    counts = np.repeat(np.arange(len(hist)), hist)
    counts = np.sort(counts[counts > 0])
    return int(counts[math.ceil(0.99 * counts.size) - 1]) if counts.size else 0


def brute_auto_slots(hist, tile_width, fraction=twell.AUTO_OVERFLOW_FRACTION,
                     max_factor=twell.AUTO_MAX_FACTOR):
    """The documented definition: the smallest s >= 1 whose overflow is <= fraction * nnz,
    but at most max_factor times the typical count (when that is smaller), and the width."""
    nnz = sum(c * h for c, h in enumerate(hist))
    cap = tile_width if max_factor is None else max(1, min(tile_width, math.floor(
        max_factor * brute_typical(hist))))
    for s in range(1, cap + 1):
        if brute_overflow(hist, s) <= fraction * nnz:
            return s
    return cap


def test_public_constants():
    assert twell.GEMM_TILE_WIDTH == 256
    assert twell.AUTO_OVERFLOW_FRACTION == 0.01
    assert twell.AUTO_MAX_FACTOR == 4
    assert twell.ONE_TILE_PADDING == 1 / 16


def _widest(hist, tile_width):
    """A tile width that the histogram fits: at least its largest count."""
    occupied = np.flatnonzero(hist)
    return max(tile_width, int(occupied[-1]) if occupied.size else 1)


@given(hist=histograms(), tile_width=st.integers(1, 300),
       fraction=st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.5, 1.0]),
       max_factor=st.sampled_from([None, 1, 2, 4, 2.5, 100]))
def test_auto_slots_matches_its_definition(hist, tile_width, fraction, max_factor):
    tile_width = _widest(hist, tile_width)
    assert _layout.auto_slots(np.array(hist), tile_width, fraction, max_factor) == \
        brute_auto_slots(hist, tile_width, fraction, max_factor)


@given(hist=histograms(), tile_width=st.integers(1, 300))
def test_auto_slots_default_fraction(hist, tile_width):
    tile_width = _widest(hist, tile_width)
    assert twell.auto_slots(np.array(hist), tile_width) == brute_auto_slots(hist, tile_width)


@pytest.mark.parametrize(("tile_width", "error", "message"), [
    (0, ValueError, "tile_width must be between 1 and 2147483647; got tile_width=0"),
    (-3, ValueError, "tile_width must be between 1 and 2147483647; got tile_width=-3"),
    (2**31, ValueError, "tile_width must be between 1 and 2147483647; got tile_width=2147483648"),
    (2.0, TypeError, "tile_width must be an int; got tile_width=2.0"),
    (True, TypeError, "tile_width must be an int; got tile_width=True"),
    ("8", TypeError, "tile_width must be an int; got tile_width='8'"),
], ids=["0", "-3", "2**31", "float", "bool", "str"])
def test_auto_slots_refuses_a_bad_tile_width(tile_width, error, message):
    # Regression: a tile width of 0 or -3 came back as the slot count, 0 or -3.
    with pytest.raises(error, match=re.escape(message)):
        twell.auto_slots(np.array([0, 5, 3]), tile_width)


@pytest.mark.parametrize(("hist", "error", "message"), [
    (np.array([-1, 5]), ValueError,
     "tile_counts_histogram must hold non-negative counts; got tile_counts_histogram[0]=-1"),
    (np.array([1.5, 2.0]), TypeError,
     "tile_counts_histogram must hold integers; got dtype float64"),
    ([0, 1.0], TypeError, "tile_counts_histogram must hold integers; got dtype float64"),
    (np.array([True, False]), TypeError,
     "tile_counts_histogram must hold integers; got dtype bool"),
    (np.array(["1", "2"]), TypeError, "tile_counts_histogram must hold integers; got dtype <U1"),
    (np.zeros((2, 3), dtype=int), ValueError,
     "tile_counts_histogram must be 1-D; got shape (2, 3)"),
    (np.array(7), ValueError, "tile_counts_histogram must be 1-D; got shape ()"),
    (np.array([0, 0, 0, 0, 0, 50]), ValueError,
     "tile_counts_histogram[c] must be 0 for c > tile_width=4 (a (row, tile) pair holds at most "
     "4 non-zeros); got tile_counts_histogram[5]=50"),
    (np.array([0, 2**64 - 1], dtype=np.uint64), ValueError,
     "tile_counts_histogram must hold counts below 2**63; got tile_counts_histogram[1]="
     "18446744073709551615"),
], ids=["negative", "floats", "float list", "bool", "str", "2-D", "0-d", "past the tile width",
        "uint64"])
def test_auto_slots_refuses_a_bad_histogram(hist, error, message):
    # Regression: negative and float histograms were taken.
    with pytest.raises(error, match=re.escape(message)):
        twell.auto_slots(hist, 4)


@pytest.mark.parametrize("fraction", ["0.01", None, 1j, True])
def test_auto_slots_refuses_a_fraction_of_the_wrong_kind(fraction):
    with pytest.raises(TypeError, match=re.escape(f"fraction must be a real number; got "
                                                  f"fraction={fraction!r}")):
        twell.auto_slots(np.array([0, 5]), 4, fraction)


def test_auto_slots_takes_trailing_empty_bins_and_lists():
    assert twell.auto_slots([0, 4, 0, 0, 0, 0, 0, 0], 4) == 1
    assert twell.auto_slots(np.array([], dtype=np.int64), 4) == 1
    assert type(twell.auto_slots(np.array([0, 3], dtype=np.uint8), np.int64(4))) is int


@given(hist=histograms(), tile_width=st.integers(1, 300))
def test_auto_choice_is_auto_slots_its_overflow_and_nnz(hist, tile_width):
    # The one-pass choice of the launchers against the definitions, one at a time; trailing
    # empty bins (a wide histogram of a sparse matrix) change nothing.
    slots = brute_auto_slots(hist, tile_width)
    nnz = sum(c * n for c, n in enumerate(hist))
    want = (slots, brute_overflow(hist, slots), nnz)
    assert _layout.auto_choice(np.array(hist), tile_width) == want
    assert _layout.auto_choice(np.array(hist + [0] * 300), tile_width) == want
    assert _layout.histogram_nnz(hist) == nnz


def test_auto_slots_refuses_a_negative_fraction():
    with pytest.raises(ValueError, match="fraction must be at least 0; got fraction=-0.1"):
        twell.auto_slots(np.array([0, 5, 3]), 8, -0.1)


@pytest.mark.parametrize("max_factor", [0, 0.5, -1, float("nan")])
def test_auto_slots_refuses_a_factor_below_one(max_factor):
    with pytest.raises(ValueError, match=f"max_factor must be None or at least 1; got "
                                         f"max_factor={max_factor!r}"):
        twell.auto_slots(np.array([0, 5, 3]), 8, max_factor=max_factor)


@pytest.mark.parametrize("hist, tile_width, expected", [
    pytest.param([7], 256, 1, id="no-nonzeros"),
    pytest.param([0, 100], 256, 1, id="all-ones"),
    pytest.param([0, 0, 0, 0, 50], 256, 4, id="all-fours"),
    pytest.param([0, 0, 0, 0, 50], 4, 4, id="full-tiles"),
    # 99 tiles of 1 and one of 40: nnz 139, budget 1.39; slots=39 would leave 1 entry
    # over, but 99% of the non-empty tiles hold 1: the cap is 4 (36 entries over).
    pytest.param([0, 99] + [0] * 38 + [1], 256, 4, id="one-outlier"),
    # 98 of 1 and two of 40: the 99th percentile is 40, so the fraction decides (nnz 178,
    # budget 1.78): 40.
    pytest.param([0, 98] + [0] * 38 + [2], 256, 40, id="two-outliers"),
    # 990 of 2 and 10 of 50: cap 4 x 2 = 8 (the fraction alone would take 48).
    pytest.param([0, 0, 990] + [0] * 47 + [10], 256, 8, id="hub-capped"),
])
def test_auto_slots_known_values(hist, tile_width, expected):
    assert twell.auto_slots(np.array(hist), tile_width) == expected


def test_auto_slots_without_the_cap_is_the_fraction_alone():
    hist = np.array([0, 99] + [0] * 38 + [1])
    assert twell.auto_slots(hist, 256, max_factor=None) == 39
    assert twell.auto_slots(hist, 256, max_factor=40) == 39
    assert twell.auto_slots(hist, 256, max_factor=38) == 38


@given(hist=histograms(), slots=st.integers(0, 50))
def test_slot_overflow_matches_its_definition(hist, slots):
    assert _layout.slot_overflow(np.array(hist), slots) == brute_overflow(hist, slots)


@given(k=st.integers(0, 2**31 - 1), t=st.integers(1, _layout.MAX_TILE_WIDTH))
def test_tile_arithmetic(k, t):
    nt = _layout.n_tiles(k, t)
    assert nt == math.ceil(k / t)
    if nt:
        last = nt - 1
        assert _layout.tile_start(last, t) <= k - 1 < _layout.tile_start(last, t) + t
        assert _layout.tile_of(k - 1, t) == last
        assert _layout.tile_extent(last, k, t) == k - last * t
        assert 1 <= _layout.tile_extent(last, k, t) <= t
        assert _layout.tile_extent(0, k, t) == min(t, k)


@pytest.mark.parametrize("compression, capacity", [(2, 127), (4, 63), (8, 31)])
def test_packed_capacity(compression, capacity):
    assert _layout.packed_capacity(compression) == capacity
    assert _layout.packed_words_per_tile(compression) == capacity + 1


@given(case=cases())
@edge_examples()
def test_matrix_auto_slots_follows_the_per_tile_counts(backend, case):
    """slots="auto" on a matrix: the definition applied to its own per-tile counts."""
    t = case.tile_width
    a = twell.TwELLMatrix(backend.asarray(case.dense), tile_width=t)
    per_tile = tile_counts(case.dense, t)
    hist = np.bincount(per_tile.ravel(), minlength=1).tolist()
    assert a.slots == brute_budget_slots(hist, t, case.dense.shape, a.dtype.itemsize)
    assert a.slots <= brute_auto_slots(hist, t)
    assert a.n_tiles == -(-case.dense.shape[1] // t)


def brute_storage(hist, tile_width, shape, slots, itemsize):
    """Bytes of the storage arrays with ``slots``, from the definition (a column within a tile
    takes 2 bytes, 4 in tiles wider than 65536 columns)."""
    m, k = shape
    over = sum(n * max(c - slots, 0) for c, n in enumerate(hist))
    column = 2 if tile_width <= 65536 else 4
    return (m * -(-k // tile_width) * (4 + slots * (itemsize + column)) + 8 * (m + 1)
            + over * (4 + itemsize))


def brute_padding(hist, slots):
    """Empty slots of the pairs holding fewer than ``slots`` entries, from the definition."""
    return sum(n * max(slots - c, 0) for c, n in enumerate(hist))


def brute_one_tile_slots(hist, tile_width, shape, top, itemsize=None):
    """On a layout of one tile as wide as the row (wider than 256): the largest count in
    [1, top] whose padding is at most ONE_TILE_PADDING of the non-zeros, 1 if none is, and
    (given ``itemsize``) whose values take at most ONE_TILE_SLOT_BYTES (at least 1);
    elsewhere ``top``."""
    if not (tile_width > 256 and -(-shape[1] // tile_width) == 1):
        return top
    nnz = sum(c * n for c, n in enumerate(hist))
    fitting = [s for s in range(1, top + 1)
               if brute_padding(hist, s) <= twell.ONE_TILE_PADDING * nnz]
    best = max(fitting, default=1)
    if itemsize is not None:
        best = min(best, max(1, twell.ONE_TILE_SLOT_BYTES // itemsize))
    return best


def brute_budget_slots(hist, tile_width, shape, itemsize):
    """slots="auto": auto_slots's count, lowered by the one-tile rule, then to the largest
    whose storage takes at most STORAGE_BUDGET times the matrix's CSR bytes, or the one of
    fewest bytes if none does."""
    top = brute_one_tile_slots(hist, tile_width, shape, brute_auto_slots(hist, tile_width),
                               itemsize)
    nnz = sum(c * n for c, n in enumerate(hist))
    budget = _layout.STORAGE_BUDGET * (nnz * (itemsize + 4) + 4 * (shape[0] + 1))
    sizes = {s: brute_storage(hist, tile_width, shape, s, itemsize) for s in range(1, top + 1)}
    fitting = [s for s, b in sizes.items() if b <= budget]
    return max(fitting) if fitting else min(sizes, key=lambda s: (sizes[s], s))


@given(hist=histograms(), tile_width=st.integers(1, 300), rows=st.integers(1, 500),
       itemsize=st.sampled_from([2, 4, 8]))
def test_auto_choice_meets_the_storage_budget_by_its_definition(hist, tile_width, rows,
                                                                 itemsize):
    hist = hist[: tile_width + 1]
    pairs = sum(hist)
    shape = (rows, max(1, -(-pairs // rows)) * tile_width)
    slots, n_over, nnz = _layout.auto_choice(np.array(hist), tile_width, shape, itemsize)
    assert slots == brute_budget_slots(hist, tile_width, shape, itemsize)
    assert n_over == sum(n * max(c - slots, 0) for c, n in enumerate(hist))
    assert nnz == sum(c * n for c, n in enumerate(hist))


@given(hist=histograms(), tile_width=st.integers(257, 2**20), rows=st.integers(1, 500),
       extra=st.integers(0, 3))
def test_one_tile_auto_slots_leaves_little_padding_by_its_definition(hist, tile_width, rows,
                                                                     extra):
    # One tile as wide as the row (K <= tile_width) or, with extra tiles, the 1% rule alone.
    tile_width = _widest(hist, tile_width)
    shape = (rows, tile_width * (1 + extra) - (tile_width - 1) // 2)
    top = brute_auto_slots(hist, tile_width)
    want = brute_one_tile_slots(hist, tile_width, shape, top)
    assert twell.auto_slots(np.array(hist), tile_width, shape=shape) == want
    if extra:
        assert want == top
    elif want < top:
        nnz = sum(c * n for c, n in enumerate(hist))
        assert brute_padding(hist, want + 1) > twell.ONE_TILE_PADDING * nnz


@pytest.mark.parametrize(("hist", "expected"), [
    # The 10^6-row stencil: 996,004 rows of 5 entries, 3,992 of 4, 4 of 3; one more slot
    # would pad 20% of the entries.
    ({3: 4, 4: 3992, 5: 996_004}, 5),
    # Rows of 8 to 12 entries (400 of each): 10 slots pad 1,200 slots (6% of 20,000
    # entries), 11 pad 2,400 (12%); the 1% rule alone takes 12.
    ({8: 400, 9: 400, 10: 400, 11: 400, 12: 400}, 10),
    # Half the rows empty: one slot pads 50 of the 200 entries, the least there is.
    ({0: 50, 4: 50}, 1),
])
def test_one_tile_auto_slots_known_values(hist, expected):
    hist = np.bincount(list(hist), weights=list(hist.values())).astype(np.int64)
    rows = int(hist.sum())
    assert twell.auto_slots(hist, 2**20, shape=(rows, 10**6)) == expected
    assert twell.auto_slots(hist, 2**20, shape=(rows, 3 * 2**20)) == twell.auto_slots(hist, 2**20)


@pytest.mark.parametrize(("itemsize", "expected"), [(2, 30), (4, 16), (8, 8), (16, 4)])
def test_one_tile_auto_slots_hold_at_most_64_bytes_of_values(itemsize, expected):
    # Rows of 25 to 35 entries (a graph Laplacian's middle): the padding rule takes 30, the
    # byte cap 64 // itemsize where that is fewer; two tiles a row take neither rule.
    hist = np.bincount(np.arange(25, 36), minlength=36) * 100
    rows = int(hist.sum())
    assert twell.auto_slots(hist, 2**20, shape=(rows, 10**6)) == 30
    assert twell.auto_slots(hist, 2**20, shape=(rows, 10**6), itemsize=itemsize) == expected
    assert twell.auto_slots(hist, 2**19, shape=(rows, 10**6), itemsize=itemsize) == 28


@pytest.mark.parametrize(("shape", "nnz", "slots", "width"), [
    ((4096, 5632), 230_000, "auto", 256),      # ReLU activations at 1%: ~2.6 per 256 columns
    ((4096, 5632), 4096 * 10, "auto", 8192),   # 10 a row: one tile as wide as the row
    ((90_000, 90_000), 448_800, "auto", 131072),  # a stencil: one tile, int32 columns
    ((10**6, 10**6), 4_996_000, "auto", 2**20),   # the 10^6-row stencil: one tile
    ((2, 2**31 - 1), 4, "auto", 2**31 - 1),     # the widest matrix: the widest tile
    ((10, 200), 20, "auto", 256),              # K <= 256: one tile of 256
    ((10, 5000), 10, 300, 8192),               # at least as wide as the slots given...
    ((10, 5000), 50_000, 300, 512),            # ... rounded up to a power of two
    ((0, 5000), 0, "auto", 256),               # nothing to choose from
])
def test_auto_tile_width(shape, nnz, slots, width):
    assert _layout.auto_tile_width(shape, nnz, slots) == width


@given(counts=st.lists(st.integers(-3, 40), max_size=300), size=st.integers(1, 40))
def test_count_histogram_is_bincount_with_an_outside_bin(backend, counts, size):
    """The backends' histogram of per-tile counts: bins 0..size-1, then everything outside."""
    counts = np.array(counts, dtype=np.int32).reshape(1, -1)
    from twell import _backend

    be = _backend.backend(backend.xp)
    got = backend.to_host(be.count_histogram(backend.asarray(counts), size))
    flat = counts.ravel()
    inside = flat[(flat >= 0) & (flat < size)]
    want = [int(np.sum(inside == c)) for c in range(size)] + [flat.size - inside.size]
    assert got.dtype == np.int64 and got.tolist() == want


def test_auto_slots_refuses_counts_beyond_the_tile_width():
    # An internal invariant (a count never exceeds its tile's width): broken, it is an error
    # rather than a silently clipped histogram.
    from twell._build import _tile_counts_histogram

    with pytest.raises(RuntimeError, match="outside"):
        _tile_counts_histogram(np.array([[0, 3, 9]], dtype=np.int32), 8)


@given(m=st.integers(0, 6), k=st.integers(0, 1200), density=st.sampled_from([0, 0.002, 0.3]),
       slots=st.sampled_from(["auto", 1, 5, 300, 700]), seed=st.integers(0, 2**16))
def test_automatic_width_of_a_dense_array_is_the_rules_with_its_histogram(m, k, density, slots,
                                                                          seed):
    # A dense GPU input answers tile_width="auto" from its 256-column counts summed into the
    # two widths the rule can answer (twell._build._auto_dense_tiles; run here on the NumPy
    # backend, which has the same primitives): the width is auto_tile_width's for the entry
    # count, and the histogram is that of the per-tile counts at that width, counted from the
    # definition.
    from twell import _build, _numpy_backend

    rng = np.random.default_rng(seed)
    x = (rng.random((m, k)) < density).astype(np.float32)
    width, hist = _build._auto_dense_tiles(_numpy_backend, x, slots)
    assert width == _layout.auto_tile_width((m, k), int(np.count_nonzero(x)), slots)
    n_tiles = _layout.n_tiles(k, width)
    per_tile = [int(np.count_nonzero(x[r, t * width:(t + 1) * width]))
                for r in range(m) for t in range(n_tiles)]
    want = np.bincount(per_tile, minlength=width + 1) if per_tile else np.zeros(width + 1)
    assert hist.tolist() == want.tolist()


@gpu_test
def test_cuda_header_agrees_with_python_layout():
    """cuda_src/twell_layout.cuh computes n_tiles and packed capacities like _layout.py."""
    import cupy

    from twell._cuda import _compile

    rng = np.random.default_rng(7)
    n_cols = np.concatenate([[0, 1, 255, 256, 257, 65536, 2**31 - 1],
                             rng.integers(0, 2**31, 500)]).astype(np.int64)
    tile_width = np.concatenate([[1, 256, 256, 256, 256, 65536, 3],
                                 rng.integers(1, 65537, 500)]).astype(np.int32)
    n = n_cols.size
    out_tiles = cupy.full(n, -1, dtype=np.int64)
    out_capacity = cupy.full(n, -1, dtype=np.int32)
    probe = _compile.function("unpack.cu", "twell_layout_probe")
    probe((-(-n // 128),), (128,), (cupy.asarray(n_cols), cupy.asarray(tile_width), np.int32(n),
                                   out_tiles, out_capacity))
    want = [_layout.n_tiles(int(k), int(t)) for k, t in zip(n_cols, tile_width, strict=True)]
    np.testing.assert_array_equal(out_tiles.get(), want)
    np.testing.assert_array_equal(out_capacity.get()[:3],
                                  [_layout.packed_capacity(c) for c in (2, 4, 8)])
