"""Launchers of ``cuda_src/pack.cu``: dense and CSR input packed into TwELL storage.

Each pack runs in passes of one kernel: a count pass (the per-tile totals alone, for
``slots="auto"``), a slots pass that fills the slots and counts what is past them, and, only
when something is, an overflow pass over the overflowing tiles after a prefix sum.
"""

import functools

import cupy
import numpy as np

from .. import _layout
from . import _compile
from ._launch import (
    BLOCK,
    MODE_COUNT,
    MODE_OVERFLOW,
    MODE_SLOTS,
    NO_PARTS,
    WARPS,
    blocks,
    dense_vector,
    empty_parts,
    i32,
    i64,
    indexed,
    instance,
    no_overflow,
    overflow_counter,
    overflow_size,
    with_overflow,
)
from ._reduce import count_buffer, overflow_offsets, read_counts


@functools.cache
def _pack_dense_kernel(dtype, vec, loads, overflow, index_dtype=_layout.INDEX_DTYPE):
    """``(kernel, pairs per warp)`` of ``pack.cu`` for dense ``dtype`` values read ``vec`` at a
    time, with tiles of ``loads`` warp-wide vector loads (``overflow``: kModeOverflow's
    kernel), writing ``indices`` of ``index_dtype``. Kept: naming and finding the kernel cost
    the host microseconds a pack."""
    ctype = _compile.CTYPES[dtype]
    if overflow:
        return _compile.function("pack.cu", f"twell_pack_dense_overflow<{ctype}, {vec}>"), 32
    # PACK_PAIRS (row, tile) pairs per warp when a tile fits in one warp-wide vector load
    # (their loads are all in flight at once); tiles of 2 or 4 such loads take
    # PACK_STAGED_SHAPES; else one pair per warp looping over the tile.
    pairs = _compile.PACK_PAIRS
    if loads == 1:
        expr, per_warp = f"twell_pack_dense<{ctype}, {vec}, {pairs}>", pairs
    elif loads <= 4:
        per_warp, chunks = _compile.PACK_STAGED_SHAPES[2 if loads == 2 else 4]
        expr = f"twell_pack_dense<{ctype}, {vec}, {per_warp}, {chunks}>"
    else:
        expr, per_warp = f"twell_pack_dense<{ctype}, {vec}, 1>", 1
    return _compile.function(*indexed("pack.cu", expr, index_dtype)), per_warp


def _launch_pack_dense(dense, tile_width, slots, mode, totals, parts, offset, counter):
    m, k = dense.shape
    pairs = m * _layout.n_tiles(k, tile_width)
    if pairs == 0:
        return
    vec = dense_vector(dense, tile_width)
    # The count pass writes no columns: its kernel is the narrow one whatever the width.
    index_dtype = parts.indices.dtype if mode == MODE_SLOTS else _layout.INDEX_DTYPE
    kernel, per_warp = _pack_dense_kernel(dense.dtype, vec, -(-tile_width // (32 * vec)),
                                          mode == MODE_OVERFLOW, index_dtype)
    # One warp per per_warp consecutive (row, tile) pairs. The block is BLOCK threads:
    # kPackWarps warps in pack.cu, whose shared staging is sized per warp (its
    # __launch_bounds__ refuses a larger block).
    grid = blocks(-(-pairs // per_warp), WARPS)
    if mode == MODE_OVERFLOW:
        kernel(grid, (BLOCK,), (
            dense, i64(m), i64(k), i32(tile_width), i32(slots), totals, offset,
            parts.overflow_indices, parts.overflow_data))
        return
    kernel(grid, (BLOCK,), (
        dense, i64(m), i64(k), i32(tile_width), i32(slots), i32(mode), totals,
        parts.counts, parts.data, parts.indices, counter))


def tile_counts_dense(dense, tile_width):
    """Non-zeros of every (row, tile) of a dense matrix, int32 (M, n_tiles)."""
    m, k = dense.shape
    nt = _layout.n_tiles(k, tile_width)
    totals = cupy.empty((m, nt), dtype=_layout.COUNT_DTYPE)
    # kModeCount writes the totals alone: null slots, overflow and counter.
    _launch_pack_dense(dense, tile_width, 1, MODE_COUNT, totals, NO_PARTS, None, None)
    return totals


def pack_dense(dense, tile_width, slots, n_over=None):
    """Dense matrix -> ``(parts, nnz)`` (NaN and Inf count as non-zeros).

    One pass over the dense matrix writes the slots and counts the entries
    past them; only when there are some, a prefix sum sizes the overflow and a
    second pass, over the overflowing tiles only, writes it. Synchronises once
    with the host (reading that count and the histogram of the per-tile totals, which gives
    ``nnz``) to size the overflow, unless the caller knows it exactly (``n_over``, from the
    per-tile counts of ``slots="auto"``; then ``nnz`` is None: the caller has it too).
    """
    m, k = dense.shape
    nt = _layout.n_tiles(k, tile_width)
    # The overflow part is made after the launch: the kernel need not wait for its memset.
    parts = empty_parts(m, nt, slots, dense.dtype, zeroed=False, overflow=False,
                        tile_width=tile_width)
    totals = cupy.empty((m, nt), dtype=_layout.COUNT_DTYPE)
    # The overflow size known, the kernel's counter is not read, and no histogram is made.
    both, counter = count_buffer(tile_width) if n_over is None else (None, overflow_counter())
    _launch_pack_dense(dense, tile_width, slots, MODE_SLOTS, totals, parts, None, counter)
    nnz = None
    if n_over is None:
        without = no_overflow(parts)  # made while the kernel runs
        hist, n_over = read_counts(both, totals, tile_width)
        nnz = _layout.histogram_nnz(hist)
        if n_over == 0:
            return without, nnz
    elif n_over == 0:
        return no_overflow(parts), nnz
    offset, row_starts = overflow_offsets(totals, slots)
    parts = with_overflow(parts, row_starts, n_over)
    _launch_pack_dense(dense, tile_width, slots, MODE_OVERFLOW, totals, parts, offset, counter)
    return parts, nnz



def _launch_pack_csr(indptr, indices, data, shape, tile_width, slots, mode, totals, parts,
                     offset, counter):
    m, k = shape
    if m == 0 or indices.size == 0:
        return
    # The count and overflow passes write no columns: their kernel is the narrow one.
    index_dtype = parts.indices.dtype if mode == MODE_SLOTS else _layout.INDEX_DTYPE
    kernel = _compile.function(*indexed("pack.cu", instance("twell_pack_csr", data.dtype),
                                        index_dtype))
    # One warp per row.
    kernel(blocks(m, WARPS), (BLOCK,), (
        indptr, indices, data, i64(m), i64(k), i32(tile_width), i32(slots), i32(mode),
        totals, parts.counts, parts.data, parts.indices, offset, parts.overflow_indices,
        parts.overflow_data, counter))


def tile_counts_csr(indptr, indices, shape, tile_width):
    """Non-zeros of every (row, tile) of a canonical CSR matrix, int32 (M, n_tiles).

    ``twell_pack_csr`` in its count mode (a warp per row; the values are not read): one pass
    over the column indices, where the shared algorithm binary-searches every (row, tile).
    """
    m, k = shape
    totals = cupy.zeros((m, _layout.n_tiles(k, tile_width)), dtype=_layout.COUNT_DTYPE)
    no_values = cupy.empty(0, dtype=np.float32)  # kModeCount reads no values
    # kModeCount writes the totals alone: null slots, overflow and counter.
    _launch_pack_csr(cupy.ascontiguousarray(indptr, dtype=np.int64),
                     cupy.ascontiguousarray(indices, dtype=np.int32), no_values, shape,
                     tile_width, 1, MODE_COUNT, totals, NO_PARTS, None, None)
    return totals


def pack_csr(indptr, indices, data, shape, tile_width, slots, n_over=None):
    """Canonical CSR -> TwELL parts.

    Synchronises once with the host to size the overflow, unless the caller knows it
    exactly (``n_over``, as for :func:`pack_dense`).
    """
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    indptr = cupy.ascontiguousarray(indptr, dtype=np.int64)
    indices = cupy.ascontiguousarray(indices, dtype=np.int32)
    data = cupy.ascontiguousarray(data)
    parts = empty_parts(m, nt, slots, data.dtype, tile_width=tile_width)  # it writes used slots
    totals = cupy.zeros((m, nt), dtype=_layout.COUNT_DTYPE)
    counter = overflow_counter()
    _launch_pack_csr(indptr, indices, data, shape, tile_width, slots, MODE_SLOTS, totals,
                     parts, parts.overflow_indptr, counter)
    if n_over is None:
        n_over = overflow_size(counter)
    if n_over == 0:
        return parts
    offset, row_starts = overflow_offsets(totals, slots)
    parts = with_overflow(parts, row_starts, n_over)
    _launch_pack_csr(indptr, indices, data, shape, tile_width, slots, MODE_OVERFLOW, totals,
                     parts, offset, counter)
    return parts

