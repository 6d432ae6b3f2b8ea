"""From entries to a TwELL layout: the choice of the tile width and the slots, and the pack.

Every TwELL matrix that twell builds from entries passes here, before the container wraps
the result: the storage limit is checked before the per-(row, tile) arrays are allocated.
On the host the entries are kept as compressed rows (twell._host), from which the choices
are read; the storage is built from them when first asked for. On the GPU the per-tile
counts give the choices, the overflow size and the number of entries in one read-back;
with the slots given, a dense input's pack counts ``nnz`` in the read it makes anyway (the
overflow size), and a canonical CSR input's is its length.
"""

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from . import _algorithms, _arrays, _backend, _host, _layout
from ._arguments import check_storage


class Built(NamedTuple):
    """A layout built from entries: ``parts`` (the storage; None on the host, where ``csr``
    holds the compressed rows it is built from), ``shape``, the chosen ``tile_width`` and
    ``slots``, the overflow size ``n_over``, the value ``dtype`` and the entry count ``nnz``
    (None where counting it would take a read-back)."""

    parts: object
    csr: object
    shape: tuple
    tile_width: int
    slots: int
    n_over: object
    dtype: np.dtype
    nnz: object


def build(src, tile_width, slots):
    """Dense or canonical CSR input (twell._convert) -> :class:`Built`, choosing the tile
    width and the slots where they are "auto"."""
    if src.kind == "csr":
        xp, dtype = _arrays.array_module(src.data), src.data.dtype
    else:
        xp, dtype = _arrays.array_module(src.array), src.array.dtype
    if xp is np:
        return host_layout(host_rows(src), src.shape, tile_width, slots, dtype)
    be = _backend.backend(xp)
    shape, hist = src.shape, None
    if src.kind == "dense" and tile_width == "auto":
        tile_width, hist = _auto_dense_tiles(be, src.array, slots)
    elif tile_width == "auto":
        tile_width = _layout.auto_tile_width(shape, int(src.indices.size), slots)
    check_storage(shape, tile_width, 1 if slots == "auto" else slots)
    n_over = nnz = None
    if hist is None and slots == "auto":
        if src.kind == "dense":
            counts = be.tile_counts_dense(src.array, tile_width)
        else:
            counts = be.tile_counts_csr(src.indptr, src.indices, shape, tile_width)
        hist = _tile_counts_histogram(counts, tile_width)
    if hist is not None:
        if slots == "auto":
            slots, n_over, nnz = _layout.auto_choice(hist, tile_width, shape, dtype.itemsize)
            check_storage(shape, tile_width, slots)
        else:
            n_over, nnz = _layout.slot_overflow(hist, slots), _layout.histogram_nnz(hist)
    if src.kind == "dense":
        parts, counted = be.pack_dense(src.array, tile_width, slots, n_over=n_over)
        nnz = counted if nnz is None else nnz
    else:
        parts = be.pack_csr(src.indptr, src.indices, src.data, shape, tile_width, slots,
                            n_over=n_over)
        nnz = int(src.indices.size)  # a canonical CSR holds exactly its entries: no read
    return Built(parts, None, shape, tile_width, slots, int(parts.overflow_indices.size),
                 dtype, nnz)


def _auto_dense_tiles(be, dense, slots):
    """``(tile_width, hist)`` of ``tile_width="auto"`` for a dense device array.

    :func:`twell._layout.auto_tile_width` answers one of two widths: the narrow one (256
    columns, or the slots' power of two) or the wide one (one tile as wide as the row), by the
    entry count. The counts of every 256-column tile are summed into those of both widths
    and the two histograms are read back together (one synchronisation, a handful of
    launches whatever the shape); the narrow one gives the entry count, which chooses the
    width, whose histogram chooses the slots.
    """
    m, k = dense.shape
    narrow = _layout.auto_tile_width((m, k), m * k, slots)  # every entry non-zero
    wide = _layout.auto_tile_width((m, k), 0, slots)
    counts = be.tile_counts_dense(dense, _layout.GEMM_TILE_WIDTH)
    widths = [narrow] if wide == narrow else [narrow, wide]
    hists = [be.count_histogram(_wider_counts(counts, w // _layout.GEMM_TILE_WIDTH), w + 1)
             for w in widths]
    xp = _arrays.array_module(dense)
    host = _arrays.to_numpy(xp.concatenate(hists))  # the one device-to-host sync
    checked = [_layout.checked_histogram(h, w)
               for h, w in zip(np.split(host, [narrow + 2])[:len(widths)], widths, strict=True)]
    tile_width = _layout.auto_tile_width((m, k), _layout.histogram_nnz(checked[0]), slots)
    return tile_width, checked[widths.index(tile_width)]


def _wider_counts(counts, factor):
    """Per-tile counts (M, n) -> those of tiles ``factor`` times as wide (a power of two)."""
    m, n = counts.shape
    if factor == 1 or m == 0 or n == 0:  # no tiles: an empty histogram whatever the width
        return counts
    if factor >= n:  # one tile a row
        return counts.sum(axis=1, keepdims=True, dtype=counts.dtype)
    xp = _arrays.array_module(counts)
    if n % factor:
        pad = xp.zeros((m, factor - n % factor), dtype=counts.dtype)
        counts = xp.concatenate([counts, pad], axis=1)
    return counts.reshape(m, -1, factor).sum(axis=2, dtype=counts.dtype)


def host_rows(src):
    """The host's compressed rows (twell._host.HostCSR) of dense or canonical CSR input: a
    dense float32/float64 array through scipy's kernel (``!= 0`` keeps NaN, Inf and
    subnormals and drops -0.0, as twell's bit-pattern test does), 16-bit values through
    NumPy's ``nonzero``."""
    if src.kind == "csr":
        return _host.host_csr(src.indptr, src.indices, src.data)
    x = src.array
    if x.dtype == _host.compute_dtype(x.dtype):
        c = sp.csr_array(x)
        return _host.host_csr(c.indptr, c.indices, c.data)
    rows, cols = np.nonzero(_algorithms.is_nonzero(x))
    indptr = _algorithms.exclusive_cumsum(np.bincount(rows, minlength=x.shape[0]))
    return _host.host_csr(indptr, cols, x[rows, cols])


def host_layout(csr, shape, tile_width, slots, dtype):
    """The :class:`Built` of a host matrix of compressed rows, choosing the tile width and
    the slots where they are "auto" from the rows' lengths and the per-tile counts."""
    if tile_width == "auto":
        tile_width = _layout.auto_tile_width(shape, int(csr.indices.size), slots)
    check_storage(shape, tile_width, 1 if slots == "auto" else slots)
    hist = _host.tile_counts_histogram(csr, shape, tile_width)
    if slots == "auto":
        slots, n_over, _ = _layout.auto_choice(hist, tile_width, shape, np.dtype(dtype).itemsize)
        check_storage(shape, tile_width, slots)
    else:
        n_over = _layout.slot_overflow(hist, slots)
    return Built(None, csr, shape, tile_width, slots, n_over, np.dtype(dtype),
                 int(csr.indices.size))


def _tile_counts_histogram(tile_counts, tile_width):
    """``hist[c]``: how many (row, tile) pairs hold ``c`` non-zeros (NumPy int64).

    On the GPU: one kernel and one small device-to-host copy, the only synchronisation.
    """
    be = _backend.backend(_arrays.array_module(tile_counts))
    hist = be.count_histogram(tile_counts, tile_width + 1)
    return _layout.checked_histogram(_arrays.to_numpy(hist), tile_width)  # GPU: the sync
