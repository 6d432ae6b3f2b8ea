"""Backend-neutral TwELL algorithms, written once for NumPy and CuPy.

These functions use only the array operations NumPy and CuPy share
(``searchsorted``, ``cumsum``, fancy indexing), so one text
serves both backends. The NumPy backend builds on them directly; the CuPy
backend replaces the hot ones with CUDA kernels and keeps these for the
rest. Where NumPy has a faster way to the same result (the pairwise sums,
the stable ordering by column), these hand it to :mod:`twell._host`.

``parts`` is a :class:`Parts` tuple of the six storage arrays of a TwELL
matrix; the layout is documented in ``_layout``.
"""

from typing import NamedTuple

import numpy as np

from . import _host, _layout
from ._arrays import array_module


class Parts(NamedTuple):
    """The six storage arrays of a TwELL matrix."""

    counts: object
    data: object
    indices: object
    overflow_indptr: object
    overflow_indices: object
    overflow_data: object


class TileIndex(NamedTuple):
    """Each row's non-empty tiles (``TwELLMatrix.index_tiles``), a CSR structure over the
    (row, tile) pairs: row ``r``'s tiles are ``tiles[indptr[r]:indptr[r + 1]]``, ascending;
    ``max_tiles`` (a Python int) is the most any row has."""

    indptr: object  # int64 (M + 1,)
    tiles: object  # int32
    max_tiles: int


def tile_index(counts):
    """The :class:`TileIndex` of a layout's ``counts`` (M, n_tiles).

    On CuPy this synchronises twice with the host (``nonzero``: the index's size, and
    ``max_tiles``).
    """
    xp = array_module(counts)
    nonempty = counts != 0
    per_row = nonempty.sum(axis=1)
    _, tiles = xp.nonzero(nonempty)  # row-major: by row, then tile
    return TileIndex(exclusive_cumsum(per_row), tiles.astype(np.int32),
                     int(per_row.max()) if per_row.size else 0)  # CuPy's max has no initial


_BITS = {8: (np.uint64, 0x7FFF_FFFF_FFFF_FFFF), 4: (np.uint32, 0x7FFF_FFFF),
         2: (np.uint16, 0x7FFF)}


def is_nonzero(values):
    """``values != 0`` decided on the bit pattern: NaN, Inf and subnormals are non-zeros.

    Comparing floats on the GPU can flush subnormals to zero; the bits cannot.
    """
    utype, magnitude = _BITS[values.dtype.itemsize]
    return (values.view(utype) & utype(magnitude)) != 0


def zeros_mask(values):
    """None where every value is a non-zero by :func:`is_nonzero`'s test, else that test's
    mask (a host sync on CuPy).

    On the host one comparison with zero answers first, about 6x faster than the bits'
    mask: a value whose bits are zero always equals zero, so no equal value means no zero;
    where a value does equal zero (or a subnormal does, under flush-to-zero), the bits
    decide.
    """
    if array_module(values) is np and not (values == 0).any():
        return None
    keep = is_nonzero(values)
    return None if bool(keep.all()) else keep


#: Exclusive scans faster than ``xp.cumsum``, by array module. A backend that has one
#: registers it when it loads (:func:`register_scan`); the results are the same integers.
_SCANS = {}


def register_scan(xp, scan):
    """Have :func:`exclusive_cumsum` use ``scan(x)`` for ``xp`` arrays (the CuPy backend's
    one-kernel scan, where ``cupy.cumsum`` launches several kernels and a temporary)."""
    _SCANS[xp] = scan


def exclusive_cumsum(x):
    """``[0, x0, x0+x1, ...]`` as int64, one element longer than ``x`` (flattened)."""
    xp = array_module(x)
    scan = _SCANS.get(xp)
    if scan is not None:
        return scan(x)
    out = xp.zeros(x.size + 1, dtype=np.int64)
    xp.cumsum(x.reshape(-1), out=out[1:])
    return out


def count_sorted(keys, size):
    """``bincount(keys, minlength=size)`` for sorted integer keys in ``[0, size)`` (int64).

    On the GPU two binary searches per key value instead of a histogram: memory grows with
    ``size`` and the keys, never with the launch. CuPy's ``bincount`` runs CUB's privatised
    histogram, whose scratch holds one ``size``-long histogram per thread block: hundreds of
    MB to count the 360 k (row, tile) pairs of the paper's FFN activations, ~10 GB for a
    10^6-row Poisson matrix with 4096-wide tiles. On the host ``bincount`` itself. Every
    caller's keys are sorted (they follow canonical CSR order).
    """
    xp = array_module(keys)
    if xp is np and (keys.size == 0 or (keys[0] >= 0 and keys[-1] < size)):
        # On the host a histogram is one pass and its memory is the result's.
        return np.bincount(keys, minlength=size).astype(np.int64, copy=False)
    edges = xp.searchsorted(keys, xp.arange(size + 1, dtype=np.int64), side="left")
    return xp.diff(edges)


def kept(keep, *arrays):
    """``tuple(a[keep] for a in arrays)`` for a boolean mask ``keep`` over their first axis.

    On the host through the kept positions: NumPy's boolean indexing branches on every
    element, 5x slower than ``flatnonzero`` and ``take`` where the mask is irregular (half
    the entries of 10^6 dropped: 9.6 ms for two arrays against 1.5).
    """
    if array_module(keep) is not np:
        return tuple(a[keep] for a in arrays)
    at = np.flatnonzero(keep)
    return tuple(a[at] for a in arrays)


def kept_rows(indptr, keep, *arrays):
    """``(indptr, *arrays)`` of the entries that ``keep`` (a boolean mask over the entries
    of the CSR structure ``indptr``) selects: each row's start moved back by the entries
    dropped before it, and each entry array masked as :func:`kept` masks it. No row index
    per entry."""
    if array_module(keep) is not np:
        return (exclusive_cumsum(keep)[indptr], *(a[keep] for a in arrays))
    at = np.flatnonzero(keep)
    # A row's new start: the kept entries before its old one.
    return (np.searchsorted(at, indptr).astype(np.int64, copy=False),
            *(a[at] for a in arrays))


def expand_indptr(indptr, nnz):
    """Row index of each of the ``nnz`` entries of a CSR structure (int64).

    ``nnz`` is the length of the entry arrays (``indptr[-1]``), passed in because the caller
    knows it on the host. Entry ``e`` belongs to the last row whose start is ``<= e``: one
    binary search per entry on the GPU, where ``repeat`` with per-row counts would read the
    counts back to the host (a hidden synchronisation); on the host ``repeat``, one pass.
    """
    xp = array_module(indptr)
    if xp is np and indptr.size and indptr[0] == 0 and indptr[-1] == nnz:
        return np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))
    indptr = indptr.astype(np.int64, copy=False)
    entries = xp.arange(nnz, dtype=np.int64)
    return xp.searchsorted(indptr, entries, side="right") - 1


def pack_sorted_coo(rows, cols, vals, shape, tile_width, slots):
    """Pack non-zero entries sorted by (row, column) into TwELL parts.

    The packing rule in one place: an entry's rank within its (row, tile)
    decides whether it takes a slot (rank < slots) or goes to the overflow.
    """
    xp = array_module(rows, cols, vals)
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    rows = rows.astype(np.int64, copy=False)
    cols = cols.astype(np.int64, copy=False)
    key = rows * nt + cols // tile_width
    # Keys are sorted: an entry's rank in its (row, tile) is its distance to
    # the first entry with the same key.
    rank = xp.arange(key.size, dtype=np.int64) - xp.searchsorted(key, key, side="left")
    in_slot = rank < slots
    slot_key = key[in_slot]
    counts = count_sorted(slot_key, m * nt).astype(_layout.COUNT_DTYPE)
    data = xp.zeros((m, nt, slots), dtype=vals.dtype)
    index_dtype = _layout.index_dtype(tile_width)
    indices = xp.zeros((m, nt, slots), dtype=index_dtype)
    flat = slot_key * slots + rank[in_slot]
    data.reshape(-1)[flat] = vals[in_slot]
    indices.reshape(-1)[flat] = (cols[in_slot] % tile_width).astype(index_dtype)
    spill = ~in_slot
    overflow_indptr = exclusive_cumsum(count_sorted(rows[spill], m))
    return Parts(
        counts.reshape(m, nt),
        data,
        indices,
        overflow_indptr,
        cols[spill].astype(_layout.OVERFLOW_INDEX_DTYPE),
        vals[spill],
    )


def slot_mask(counts, slots):
    """Boolean (M, n_tiles, slots): which slots hold an entry."""
    xp = array_module(counts)
    return xp.arange(slots, dtype=counts.dtype) < counts[..., None]


def tile_counts_csr(indptr, indices, shape, tile_width):
    """Non-zeros of every (row, tile) of a canonical CSR matrix, int32 (M, n_tiles)."""
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    key = expand_indptr(indptr, indices.size) * nt + indices.astype(np.int64) // tile_width
    return count_sorted(key, m * nt).astype(_layout.COUNT_DTYPE).reshape(m, nt)


def overflow_tile_counts(parts, shape, tile_width):
    """Overflow entries of every (row, tile), int64 (M * n_tiles,)."""
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    rows = expand_indptr(parts.overflow_indptr, parts.overflow_indices.size)
    key = rows * nt + parts.overflow_indices.astype(np.int64) // tile_width
    return count_sorted(key, m * nt)


def csr_layout(parts, shape, tile_width):
    """Where every entry goes in canonical (row, column) order.

    A tile's slot entries precede its overflow entries and both are sorted,
    so positions follow from prefix sums of per-tile sizes: no sort is needed.

    Returns
    -------
    tile_offset : int64 (M * n_tiles + 1,)
        Position of each (row, tile)'s first entry; slot ``s`` of pair ``p``
        goes to ``tile_offset[p] + s``; ``tile_offset[-1]`` is the nnz.
    overflow_rows : int64 (n_overflow,)
        Row of every overflow entry.
    overflow_pos : int64 (n_overflow,)
        Position of every overflow entry.
    """
    xp = array_module(parts.counts)
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    counts = parts.counts.reshape(-1).astype(np.int64)
    over_rows = expand_indptr(parts.overflow_indptr, parts.overflow_indices.size)
    over_key = over_rows * nt + parts.overflow_indices.astype(np.int64) // tile_width
    over_per_tile = count_sorted(over_key, m * nt)
    tile_offset = exclusive_cumsum(counts + over_per_tile)
    # An overflow entry's rank in its tile: its distance to the tile's first one (the keys are
    # sorted), a search among the few overflow keys rather than a scan over every tile.
    over_rank = (xp.arange(over_key.size, dtype=np.int64)
                 - xp.searchsorted(over_key, over_key, side="left"))
    return tile_offset, over_rows, tile_offset[over_key] + counts[over_key] + over_rank


def to_coo(parts, shape, tile_width, tile_index=None):
    """TwELL parts -> ``(rows, cols, vals)`` sorted by (row, column), int64 indices.

    With the layout's :class:`TileIndex`, the slots of the listed (row, tile) pairs alone are
    looked at (the same result). On CuPy this synchronises once with the host to learn the
    number of non-zeros (the output size).
    """
    xp = array_module(parts.counts)
    m, k = shape
    nt = max(_layout.n_tiles(k, tile_width), 1)
    slots = parts.data.shape[2]
    tile_offset, over_rows, over_pos = csr_layout(parts, shape, tile_width)
    nnz = int(tile_offset[-1])  # device-to-host sync on CuPy: the output size
    rows = xp.empty(nnz, dtype=np.int64)
    cols = xp.empty(nnz, dtype=np.int64)
    vals = xp.empty(nnz, dtype=parts.data.dtype)
    if tile_index is None:
        key, s = xp.nonzero(slot_mask(parts.counts, slots).reshape(-1, slots))
    else:
        listed = (expand_indptr(tile_index.indptr, tile_index.tiles.size) * nt
                  + tile_index.tiles)
        i, s = xp.nonzero(slot_mask(parts.counts.reshape(-1)[listed], slots))
        key = listed[i]
    pos = tile_offset[key] + s
    rows[pos] = key // nt
    cols[pos] = (key % nt) * tile_width + parts.indices.reshape(-1, slots)[key, s]
    vals[pos] = parts.data.reshape(-1, slots)[key, s]
    rows[over_pos] = over_rows
    cols[over_pos] = parts.overflow_indices
    vals[over_pos] = parts.overflow_data
    return rows, cols, vals


def coo_to_csr(rows, cols, vals, n_rows):
    """Sorted COO -> canonical CSR ``(indptr int64, indices int32, data)``."""
    indptr = exclusive_cumsum(count_sorted(rows, n_rows))
    return indptr, cols.astype(_layout.OVERFLOW_INDEX_DTYPE), vals


def canonical_csr(indptr, indices, data, shape):
    """CSR with rows in any column order -> canonical CSR ``(indptr int64, indices int32,
    data)``: columns sorted, duplicates summed in input order, zeros dropped.

    The global sort of :func:`canonical_coo` over the entries ``indptr[0]`` (0, as scipy
    and cupyx write it) to ``indptr[-1]``; on CuPy, reading ``indptr[-1]`` synchronises once
    with the host.
    """
    nnz = int(indptr[-1])
    rows = expand_indptr(indptr, nnz)
    rows, cols, vals = canonical_coo(rows, indices[:nnz], data[:nnz], shape)
    return coo_to_csr(rows, cols, vals, shape[0])


def canonical_coo(rows, cols, vals, shape):
    """Any COO triplet -> sorted by (row, column), duplicates summed, zeros dropped.

    Duplicates are summed in their input order (a stable sort), in float32
    for 16-bit values, like scipy's ``sum_duplicates``.
    """
    xp = array_module(rows, cols, vals)
    rows = rows.astype(np.int64, copy=False)
    cols = cols.astype(np.int64, copy=False)
    key = rows * shape[1] + cols
    # On the host, input in order already (twell's own entries, most files) is not sorted
    # again, and the ranks of duplicates (a binary search per entry) are found only where a
    # key repeats (neighbours once sorted). The columns come along with the sort rather
    # than from the key (an int64 division).
    host = xp is np
    if not host or (key.size > 1 and not bool((key[1:] >= key[:-1]).all())):
        order = (_host.stable_argsort(key, shape[0] * shape[1]) if host
                 else xp.argsort(key, kind="stable"))
        key, rows, cols, vals = key[order], rows[order], cols[order], vals[order]
    if not host or (key.size > 1 and bool((key[1:] == key[:-1]).any())):
        first = xp.searchsorted(key, key, side="left")
        rank = xp.arange(key.size, dtype=np.int64) - first
        most = int(rank.max()) if key.size else 0  # device-to-host sync on CuPy
        if most:
            # Sum each run of duplicates in input order, one rank level at a time: the same
            # order as a sequential sum on every backend, so results are deterministic.
            acc = np.float64 if vals.dtype == np.float64 else np.float32
            total = vals.astype(acc)
            # Inf + -Inf is NaN and a sum past the dtype's range Inf: values, not warnings.
            with np.errstate(over="ignore", invalid="ignore"):
                for level in range(1, most + 1):
                    at = rank == level
                    total[first[at]] += total[at]
                starts = rank == 0
                rows, cols = rows[starts], cols[starts]
                vals = total[starts].astype(vals.dtype)
    keep = zeros_mask(vals)
    if keep is None:  # new arrays all the same: the result never aliases the input
        return rows.copy(), cols.copy(), vals.copy()
    return kept(keep, rows, cols, vals)


def segment_sums(indptr, values):
    """``out[i] = values[indptr[i]:indptr[i + 1]].sum()`` for float64 ``values``: float64,
    one element per segment, zero for an empty one.

    Each segment is summed pairwise (neighbours, then pairs of pairs, ...), one step per
    doubling of the longest segment: a fixed order, so the same values on every run and on
    both backends, with no atomics and memory in proportion to the values and the segments.
    CuPy runs :func:`_pairwise_whole`, NumPy the same additions by
    :func:`twell._host.segment_sums`.
    """
    xp = array_module(indptr, values)
    if values.size == 0 or indptr.size < 2:
        return xp.zeros(max(indptr.size - 1, 0), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # Inf + -Inf is NaN, no warning
        if xp is np:
            return _host.segment_sums(indptr, values)
        return _pairwise_whole(indptr, values)


def _pairwise_whole(indptr, values):
    """:func:`segment_sums` by whole-array steps, for CuPy (one synchronisation: the longest
    segment's length, the step count): at step ``s`` each entry whose rank in its segment is
    a multiple of ``2 s`` adds the entry ``s`` after it, if the segment holds one; each
    segment's sum ends at its first entry."""
    xp = array_module(indptr, values)
    n = values.size
    starts, ends = indptr[:-1], indptr[1:]
    longest = int((ends - starts).max())  # device-to-host sync on CuPy: the step count
    segment = expand_indptr(indptr, n)
    rank = xp.arange(n, dtype=np.int64) - starts[segment]
    length = (ends - starts)[segment]
    acc = values.astype(np.float64, copy=True)
    step = 1
    while step < longest:
        partner = xp.minimum(xp.arange(n, dtype=np.int64) + step, n - 1)
        add = (rank % (2 * step) == 0) & (rank + step < length)
        acc = xp.where(add, acc + acc[partner], acc)
        step *= 2
    return xp.where(ends > starts, acc[xp.minimum(starts, n - 1)], 0.0)


def column_sums(cols, values, n_cols, indptr=None):
    """Sums of float64 ``values`` by column (``cols``: int64, any order): float64
    ``(n_cols,)``, each column's entries summed pairwise in the order they come (a stable
    sort), as :func:`segment_sums` does. ``indptr``: the row pointer of entries in CSR order
    (the host orders them as scipy's CSR -> CSC conversion does, faster). Memory: the
    entries and the result."""
    xp = array_module(cols, values)
    if xp is np:
        return segment_sums(*_host.by_column(cols, values, n_cols, indptr))
    order = xp.argsort(cols, kind="stable")
    # Where each column starts among the sorted entries: the CSR row pointer of the
    # transpose, with no bincount (see count_sorted).
    indptr = xp.searchsorted(cols[order], xp.arange(n_cols + 1, dtype=np.int64), side="left")
    return segment_sums(indptr, values[order])
