"""twell._packed: the packed layout of the reference kernels, bit for bit.

Oracle: :func:`reference_words`, a word-by-word writer of the layout in the
background note (count in word 0, ``bf16_bits << 16 | global_column`` after
it, entries sorted, unused words zero), written with Python loops.
"""

import numpy as np
import pytest
from helpers import BF16, F32, assert_dense_equal, assert_parts_equal, cast, dense_from_parts
from hypothesis import given
from hypothesis import strategies as st
from strategies import dense_from_counts

import twell

T = 256


def bits(x):
    """The 16 bits of a bfloat16 value."""
    return int(np.array(x, dtype=BF16).view(np.uint16))


def reference_words(dense_bf16, compression):
    """The packed words of a dense bfloat16 matrix, one Python loop per row and tile."""
    m, k = dense_bf16.shape
    w = T // compression
    words = np.zeros((m, k // compression), dtype=np.uint32)
    for r in range(m):
        for t in range(k // T):
            cols = [c for c in range(t * T, (t + 1) * T) if dense_bf16[r, c] != 0]
            base = t * w
            words[r, base] = len(cols)
            for i, c in enumerate(cols):
                words[r, base + 1 + i] = (bits(dense_bf16[r, c]) << 16) | c
    return words


def worked_example():
    x = np.zeros((1, 512), dtype=BF16)
    x[0, 3], x[0, 100], x[0, 300] = 1.5, 2.0, 0.25
    return x


def test_worked_example_of_the_background_note_bit_for_bit(backend):
    a = twell.TwELLMatrix(backend.asarray(worked_example()))
    backend.poison()
    words = a.to_packed()
    assert backend.is_native(words)
    words = backend.to_host(words)
    assert words.dtype == np.uint32 and words.shape == (1, 64)
    want = np.zeros((1, 64), dtype=np.uint32)
    want[0, :3] = [2, 0x3FC00003, 0x40000064]
    want[0, 32:34] = [1, 0x3E80012C]  # global column 300, not the local 44
    np.testing.assert_array_equal(words, want)


def test_worked_example_reads_back(backend):
    words = np.zeros((1, 64), dtype=np.uint32)
    words[0, :3] = [2, 0x40000064, 0x3FC00003]  # entries in the other order
    words[0, 32:34] = [1, 0x3E80012C]
    a = twell.from_packed(backend.asarray(words), (1, 512))
    assert (a.tile_width, a.slots, a.dtype) == (256, 31, BF16)
    a.validate()
    assert_dense_equal(backend.to_host(a.toarray()), worked_example(), BF16)
    np.testing.assert_array_equal(backend.to_host(a.indices)[0, :, :2], [[3, 100], [44, 0]])


@st.composite
def packable(draw):
    """A bfloat16 matrix whose tiles fit a compression, with that compression."""
    compression = draw(st.sampled_from([2, 4, 8]))
    cap = T // compression - 1
    m = draw(st.integers(0, 6))
    nt = draw(st.integers(0, 3))
    profile = draw(st.sampled_from(["empty", "few", "at capacity", "mixed"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    counts = {"empty": np.zeros((m, nt), dtype=int),
              "few": rng.integers(0, 3, (m, nt)),
              "at capacity": np.full((m, nt), cap),
              "mixed": rng.integers(0, cap + 1, (m, nt))}[profile]
    dense = dense_from_counts(rng, counts, (m, nt * T), T, "finite")
    return cast(dense, BF16), compression


@given(case=packable(), slots=st.sampled_from([1, 5, 31, 64, 256]),
       tile_width=st.sampled_from([16, 256, 100]))
def test_to_packed_matches_the_reference_layout(backend, case, slots, tile_width):
    """Any layout of the matrix (tile width, slots, overflow) packs to the same words."""
    x, compression = case
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=tile_width,
                          slots=min(slots, tile_width))
    backend.poison()
    words = backend.to_host(a.to_packed(compression))
    np.testing.assert_array_equal(words, reference_words(x, compression))


@given(case=packable())
def test_packed_round_trip(backend, case):
    x, compression = case
    cap = T // compression - 1
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=T, slots=cap)
    b = twell.from_packed(a.to_packed(compression), x.shape, compression=compression)
    b.validate()
    assert_parts_equal(b, a)
    assert_dense_equal(backend.to_host(b.toarray()), x, BF16)


@given(case=packable(), seed=st.integers(0, 2**32 - 1))
def test_from_packed_canonicalises_what_the_reference_writes(backend, case, seed):
    """Unordered entries and stale words after the count give the canonical matrix."""
    x, compression = case
    rng = np.random.default_rng(seed)
    w = T // compression
    words = reference_words(x, compression)
    m, n = words.shape
    tiles = words.reshape(m, n // w, w)
    for r in range(m):
        for t in range(n // w):
            c = int(tiles[r, t, 0])
            tiles[r, t, 1:1 + c] = rng.permutation(tiles[r, t, 1:1 + c])
            tiles[r, t, 1 + c:] = rng.integers(0, 2**32, w - 1 - c, dtype=np.uint32)  # stale
    a = twell.from_packed(backend.asarray(words), x.shape, compression=compression)
    a.validate()
    want = twell.TwELLMatrix(x, tile_width=T, slots=T // compression - 1)
    assert_parts_equal(a, want)


def test_from_packed_drops_zero_valued_entries(backend):
    """An entry whose bf16 bits are +0 or -0 is not a non-zero."""
    words = np.zeros((1, 32), dtype=np.uint32)
    words[0, :4] = [3, (bits(1.0) << 16) | 3, (0x8000 << 16) | 5, 7]
    a = twell.from_packed(backend.asarray(words), (1, 256))
    a.validate()
    assert a.nnz == 1
    assert_dense_equal(dense_from_parts(a)[0, :8], [0, 0, 0, 1.0, 0, 0, 0, 0])


def test_from_packed_keeps_nan_and_inf(backend):
    words = np.zeros((1, 32), dtype=np.uint32)
    words[0, :3] = [2, (bits(np.inf) << 16) | 1, (bits(np.nan) << 16) | 0]
    a = twell.from_packed(backend.asarray(words), (1, 256))
    row = dense_from_parts(a)[0, :2]
    assert np.isnan(row[0]) and row[1] == np.inf


@pytest.mark.parametrize("shape", [(0, 256), (3, 0), (2, 65536)])
def test_packed_edge_shapes(backend, shape):
    x = np.zeros(shape, dtype=BF16)
    if x.size:
        x[-1, -1] = 3.0
    a = twell.TwELLMatrix(backend.asarray(x))
    words = a.to_packed()
    assert words.shape == (shape[0], shape[1] // 8)
    b = twell.from_packed(words, shape)
    assert_dense_equal(backend.to_host(b.toarray()), x, BF16)


# -- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [255, 300, 257])
def test_to_packed_needs_k_multiple_of_256(backend, k):
    a = twell.TwELLMatrix(backend.asarray(np.zeros((1, k), dtype=BF16)))
    with pytest.raises(ValueError, match=rf"K must be a multiple of 256; got K={k}"):
        a.to_packed()


def test_to_packed_needs_16_bit_columns(backend):
    a = twell.TwELLMatrix(backend.asarray(np.zeros((1, 65536 + 256), dtype=BF16)))
    with pytest.raises(ValueError, match=r"at most 65536.*K=65792"):
        a.to_packed()


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16],
                         ids=["f64", "f32", "f16"])
def test_to_packed_needs_bfloat16(backend, dtype):
    a = twell.TwELLMatrix(backend.asarray(np.ones((1, 256), dtype=dtype)))
    with pytest.raises(TypeError, match=rf"bfloat16.*{np.dtype(dtype).name}.*astype"):
        a.to_packed()


@pytest.mark.parametrize("compression", [0, 1, 3, 16, 256])
def test_bad_compression(backend, compression):
    a = twell.TwELLMatrix(backend.asarray(np.zeros((1, 256), dtype=BF16)))
    with pytest.raises(ValueError, match=rf"compression must be one of 2, 4, 8; "
                                         rf"got compression={compression}"):
        a.to_packed(compression)
    with pytest.raises(ValueError, match="compression"):
        twell.from_packed(backend.asarray(np.zeros((1, 32), dtype=np.uint32)), (1, 256),
                          compression)


@pytest.mark.parametrize("per_tile, compression, hint", [
    (32, 8, "compression=4 (capacity 63) fits"),
    (64, 8, "compression=2 (capacity 127) fits"),
    (64, 4, "compression=2 (capacity 127) fits"),
    (128, 2, "no compression fits"),
    (256, 8, "no compression fits"),
])
def test_to_packed_rejects_too_full_tiles(backend, per_tile, compression, hint):
    """The layout has no overflow: say how many tiles are too full and which C would fit."""
    x = np.zeros((3, 768), dtype=BF16)
    x[0, :per_tile] = 1.0  # too full
    x[2, 512:512 + per_tile] = 2.0  # too full
    x[1, 256:256 + 3] = 3.0  # fits
    a = twell.TwELLMatrix(backend.asarray(x), slots=1)
    cap = 256 // compression - 1
    with pytest.raises(ValueError) as info:
        a.to_packed(compression)
    msg = str(info.value)
    assert f"2 of 9 (row, tile) pairs hold more than {cap} entries" in msg
    assert f"at most {per_tile}" in msg
    assert hint in msg


def test_to_packed_at_capacity_is_accepted(backend):
    x = np.zeros((1, 256), dtype=BF16)
    x[0, :31] = 1.0
    words = backend.to_host(twell.TwELLMatrix(backend.asarray(x), slots=1).to_packed(8))
    assert words[0, 0] == 31
    np.testing.assert_array_equal(words, reference_words(x, 8))


def _words(*tile, compression=8):
    words = np.zeros((1, 256 // compression), dtype=np.uint32)
    words[0, :len(tile)] = tile
    return words


@pytest.mark.parametrize("compression", [2, 4, 8])
def test_from_packed_rejects_counts_above_capacity(backend, compression):
    cap = 256 // compression - 1
    words = _words(cap + 1, compression=compression)
    with pytest.raises(ValueError, match=rf"exceed the capacity {cap}.*largest is {cap + 1}"):
        twell.from_packed(backend.asarray(words), (1, 256), compression)


def test_from_packed_rejects_columns_outside_the_tile(backend):
    words = np.zeros((1, 64), dtype=np.uint32)
    words[0, 32:34] = [1, (bits(1.0) << 16) | 44]  # tile 1 holds columns 256..511
    with pytest.raises(ValueError, match=r"row 0, tile 1 holds column 44, outside.*\[256, 512\)"):
        twell.from_packed(backend.asarray(words), (1, 512))


def test_from_packed_rejects_duplicate_columns(backend):
    words = _words(2, (bits(1.0) << 16) | 9, (bits(2.0) << 16) | 9)
    with pytest.raises(ValueError, match="same column twice"):
        twell.from_packed(backend.asarray(words), (1, 256))


@pytest.mark.parametrize("shape, cols", [((1, 300), 37), ((1, 65792), 8224)])
def test_from_packed_rejects_bad_k(backend, shape, cols):
    with pytest.raises(ValueError, match=r"K=\d+"):
        twell.from_packed(backend.asarray(np.zeros((1, cols), dtype=np.uint32)), shape)


def test_from_packed_rejects_wrong_word_shape(backend):
    with pytest.raises(ValueError, match=r"\(1, 64\).*\(1, 32\)"):
        twell.from_packed(backend.asarray(np.zeros((1, 32), dtype=np.uint32)), (1, 512))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64, np.float32],
                         ids=lambda d: np.dtype(d).name)
def test_from_packed_rejects_non_uint32_words(backend, dtype):
    with pytest.raises(TypeError, match="uint32"):
        twell.from_packed(backend.asarray(np.zeros((1, 32), dtype=dtype)), (1, 256))


def test_from_packed_is_the_classmethod():
    assert twell.from_packed == twell.TwELLMatrix.from_packed
    words = _words(1, (bits(-2.0) << 16) | 255)
    a = twell.TwELLMatrix.from_packed(words, (1, 256))
    assert float(dense_from_parts(a)[0, 255]) == -2.0
    assert a.astype(F32).dtype == F32
