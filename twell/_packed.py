"""The packed layout of the reference TwELL kernels (SakanaAI/sparser-faster-llms).

One uint32 matrix of shape (M, K / C): per row and 256-column tile, 256 / C
words; word 0 is the count, words 1..count hold ``bf16_bits << 16 | column``
with the *global* column. twell writes entries sorted and the unused words
zero; it reads whatever order the reference producer left, and ignores the
stale words after the count.
"""

import numpy as np

from . import _arrays, _layout
from ._algorithms import Parts, slot_mask
from ._arguments import check_compression, check_shape
from ._dtypes import bfloat16, native

_T = _layout.PACKED_TILE_WIDTH


def _check_columns(k, where):
    if k % _T:
        raise ValueError(f"{where}: K must be a multiple of {_T}; got K={k}")
    if k > _layout.PACKED_MAX_COLUMNS:
        raise ValueError(
            f"{where}: K must be at most {_layout.PACKED_MAX_COLUMNS} (16-bit columns); got K={k}"
        )


def to_packed(a, compression):
    """TwELLMatrix -> uint32 words (see ``TwELLMatrix.to_packed``)."""
    c = check_compression(compression)
    m, k = a.shape
    if a.dtype != bfloat16:
        raise TypeError(
            f"to_packed needs bfloat16 values; got dtype={a.dtype}; "
            "cast first with .astype(ml_dtypes.bfloat16)"
        )
    _check_columns(k, "to_packed")
    cap = _layout.packed_capacity(c)
    b = a if a.tile_width == _T else a._relayout(_T, min(cap, a.slots))
    tile_nnz = b.tile_nnz()
    too_full = tile_nnz > cap
    n_bad = int(too_full.sum())  # host sync on the GPU: an error must be raised here
    if n_bad:
        worst = int(tile_nnz.max())
        fits = [f for f in sorted(_layout.PACKED_COMPRESSIONS, reverse=True)
                if _layout.packed_capacity(f) >= worst]
        hint = (f"compression={fits[0]} (capacity {_layout.packed_capacity(fits[0])}) fits"
                if fits else "no compression fits (the largest capacity is 127)")
        raise ValueError(
            f"to_packed(compression={c}): {n_bad} of {tile_nnz.size} (row, tile) pairs hold "
            f"more than {cap} entries (at most {worst}); the packed layout has no overflow; {hint}"
        )
    if b.overflow_nnz or b.slots > cap:
        b = b._repack(_T, cap)
    xp = b._xp
    nt, s, w = b.n_tiles, b.slots, _layout.packed_words_per_tile(c)
    words = xp.zeros((m, nt, w), dtype=np.uint32)
    words[:, :, 0] = b.counts.astype(np.uint32)
    col = b.indices.astype(np.uint32) + (xp.arange(nt, dtype=np.uint32) * _T)[None, :, None]
    entry = (b.data.view(np.uint16).astype(np.uint32) << 16) | col
    words[:, :, 1:1 + s] = xp.where(slot_mask(b.counts, s), entry, np.uint32(0))
    return words.reshape(m, nt * w)


def from_packed(words, shape, compression):
    """uint32 words -> ``(parts, shape, has_zeros)``, T=256, S=256/C-1: the parts in
    canonical order, except that entries whose value is an explicit zero are still stored
    when ``has_zeros`` (the caller repacks them away)."""
    c = check_compression(compression)
    m, k = check_shape(shape)
    _check_columns(k, "from_packed")
    if not (isinstance(words, np.ndarray) or _arrays.is_cupy_array(words)):
        words = np.asarray(words)
    xp = _arrays.array_module(words)
    words = native(words)  # big-endian words: converted once
    if words.dtype != np.uint32:
        raise TypeError(f"words must be uint32; got words.dtype={words.dtype}")
    if words.shape != (m, k // c):
        raise ValueError(
            f"words must have shape (M, K // compression) = {(m, k // c)}; got {words.shape}"
        )
    cap, w, nt = _layout.packed_capacity(c), _layout.packed_words_per_tile(c), k // _T
    tiles = words.reshape(m, nt, w)
    counts = tiles[:, :, 0]
    n_bad = int((counts > cap).sum())  # host sync on the GPU: an error must be raised here
    if n_bad:
        raise ValueError(
            f"from_packed(compression={c}): {n_bad} (row, tile) counts exceed the capacity "
            f"{cap}; the largest is {int(counts.max())}"
        )
    counts = counts.astype(_layout.COUNT_DTYPE)
    entries = tiles[:, :, 1:]
    mask = slot_mask(counts, cap)
    local = (entries & np.uint32(0xFFFF)).astype(np.int64) - (
        xp.arange(nt, dtype=np.int64) * _T)[None, :, None]
    outside = mask & ((local < 0) | (local >= _T))
    if bool(outside.any()):  # host sync on the GPU
        r, t, s = (int(v[0]) for v in xp.nonzero(outside))
        raise ValueError(
            f"from_packed: row {r}, tile {t} holds column {int(local[r, t, s]) + t * _T}, "
            f"outside the tile's columns [{t * _T}, {(t + 1) * _T})"
        )
    # Canonical order: sort each tile's entries by column; unused words last.
    key = xp.where(mask, local, _T)
    order = xp.argsort(key, axis=-1)
    local = xp.take_along_axis(key, order, axis=-1)
    entries = xp.take_along_axis(entries, order, axis=-1)
    if bool((mask[..., 1:] & (local[..., 1:] == local[..., :-1])).any()):  # host sync
        raise ValueError("from_packed: a (row, tile) holds the same column twice")
    bits = xp.where(mask, entries >> 16, np.uint32(0)).astype(np.uint16)
    data = bits.view(bfloat16)
    indices = xp.where(mask, local, 0).astype(_layout.INDEX_DTYPE)
    parts = Parts(
        counts,
        data,
        indices,
        xp.zeros(m + 1, dtype=_layout.OVERFLOW_INDPTR_DTYPE),
        xp.zeros(0, dtype=_layout.OVERFLOW_INDEX_DTYPE),
        xp.zeros(0, dtype=bfloat16),
    )
    has_zeros = bool((mask & ((bits & np.uint16(0x7FFF)) == 0)).any())  # host sync
    return parts, (m, k), has_zeros
