"""Launchers of ``cuda_src/reduce.cu``: histograms, prefix sums and the search for NaN/Inf."""

import cupy
import numpy as np

from .. import _layout
from . import _compile
from ._launch import BLOCK, aligned, blocks, i32, i64, instance, vector_for

#: Blocks of the grid-stride reductions of reduce.cu: enough to fill any current GPU.
_REDUCE_BLOCKS = 1024

#: Threads of twell_exclusive_scan's blocks (reduce.cu: kScanThreads).
_SCAN_THREADS = 256


def reduce_grid(items):
    """Grid of a reduce.cu kernel (a grid-stride loop) over ``items`` work items: one thread
    each, at most _REDUCE_BLOCKS blocks."""
    return (min(blocks(items, BLOCK)[0], _REDUCE_BLOCKS),)


def count_histogram(counts, size):
    """Histogram of integer counts: int64 ``hist`` of ``size + 1`` bins.

    ``hist[c]`` (``c < size``) is the number of counts equal to ``c`` and ``hist[size]`` the
    number outside ``[0, size)``. One kernel (``twell_count_histogram``, integer atomics: the
    same result in any order) and no host synchronisation; ``cupy.bincount`` synchronises
    twice before it starts (a negativity check and the maximum).
    """
    return _count_into(counts, size, cupy.zeros(size + 1, dtype=np.uint64))


def _count_into(counts, size, hist):
    """:func:`count_histogram` counted into ``hist``, zeroed uint64 device memory of
    ``size + 1`` values (so that one read can fetch it with what lies beside it)."""
    flat = cupy.ascontiguousarray(counts, dtype=_layout.COUNT_DTYPE).reshape(-1)
    if flat.size:
        kernel = _compile.function("reduce.cu", "twell_count_histogram")
        kernel(reduce_grid(flat.size), (BLOCK,), (flat, i64(flat.size), i32(size), hist))
    return hist.view(np.int64)


def count_positive(values):
    """Device uint64 scalar: how many of the C-contiguous 16-bit ``values`` are positive
    (their bits, read as int16, above zero: the values above +0, a +NaN too), as relu keeps
    them. One launch of ``twell_count_positive16`` into zeroed memory; no host
    synchronisation. ``cupy.count_nonzero(values.view(int16) > 0)`` would write a boolean
    array as large as ``values`` and launch twice."""
    count = cupy.zeros((), dtype=np.uint64)
    if values.size:
        kernel = _compile.function("reduce.cu", "twell_count_positive16")
        kernel(reduce_grid(values.size), (BLOCK,), (values, i64(values.size), count))
    return count


def nonfinite(b):
    """Device bool scalar: whether the C-contiguous ``b`` holds an Inf or a NaN.

    16-bit values: one pass of ``twell_find_nonfinite`` over the bits;
    ``cupy.isfinite(b).all()`` would write and then reduce a boolean array as large as ``b``
    (wider values take that way: CuPy's isfinite sees their Inf and NaN without a flush).
    """
    if b.dtype.itemsize != 2:
        return ~cupy.isfinite(b).all()
    found = cupy.zeros((), dtype=bool)
    if b.size:
        vec = vector_for(b.dtype, aligned(b))
        kernel = _compile.function("reduce.cu", instance("twell_find_nonfinite", b.dtype, vec))
        kernel(reduce_grid(-(-b.size // vec)), (BLOCK,), (b, i64(b.size), found))
    return found


#: Items per block of ``twell_exclusive_scan`` (reduce.cu: kScanThreads x kScanRows x 32).
_SCAN_TILE = 4096
#: ``starts_cap`` of twell_exclusive_scan for row pointers that are not clamped.
_NO_CAP = np.iinfo(np.int64).max
_SCAN_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}


def exclusive_scan(values):
    """``[0, v0, v0 + v1, ...]`` of the flattened integer ``values`` (int64, one longer), in
    one launch (:func:`scan`)."""
    return scan(values)


def scan(values, minus=None, rows=None, cap=None):
    """``[0, v0, v0 + v1, ...]`` of the flattened ``values`` (int64, one longer), in one
    launch of ``twell_exclusive_scan`` (a single-pass scan with decoupled look-back).

    ``v = max(values - minus, 0)`` when ``minus`` is given (the overflow of each (row,
    tile) pair past ``minus`` slots; ``values`` int32), ``values`` itself otherwise. With
    ``rows``, ``values`` holds ``rows`` equal rows and the result is ``(out, starts)``,
    ``starts = out[::values.size // rows]`` (``rows + 1`` entries: a row pointer) written by
    the same launch, each at most ``cap`` when it is given. Sums must stay within +-2**61.
    ``cupy.cumsum`` dispatches CUB's two-pass scan, an element-wise kernel and a temporary
    each call.
    """
    flat = cupy.ascontiguousarray(values).reshape(-1)
    if flat.dtype not in _SCAN_TYPES:
        flat = flat.astype(np.int64)
    n = flat.size
    out = cupy.empty(n + 1, dtype=np.int64)
    starts = None if rows is None else cupy.empty(rows + 1, dtype=np.int64)
    if n == 0:
        out.fill(0)
        if starts is not None:
            starts.fill(0)
    else:
        tiles = -(-n // _SCAN_TILE)
        status = cupy.zeros(tiles, dtype=np.uint64)  # one zeroed status word per tile
        clamp = "true" if minus is not None else "false"
        kernel = _compile.function(
            "reduce.cu", f"twell_exclusive_scan<{_SCAN_TYPES[flat.dtype]}, {clamp}>")
        kernel((tiles,), (_SCAN_THREADS,), (
            flat, i64(n), i64(minus or 0), out, i64(n // rows if rows else 1),
            starts, i64(_NO_CAP if cap is None else cap), status))
    return out if rows is None else (out, starts)


def overflow_offsets(totals, slots, capacity=None):
    """``(offset, row_starts)``: the exclusive prefix sum of the per-pair overflow
    ``max(total - slots, 0)`` of the (M, n_tiles) ``totals`` (int64, M * n_tiles + 1) and
    its value at each row's first pair (the overflow's row pointer, M + 1), clamped to
    ``capacity`` when given (an overflow that keeps at most ``capacity`` entries)."""
    return scan(totals, minus=slots, rows=totals.shape[0], cap=capacity)


def count_buffer(tile_width):
    """``(buffer, counter)``: zeroed uint64 device memory for a pack's one read-back,
    ``buffer``, which holds the histogram of its per-tile totals (``count_histogram(totals,
    tile_width + 1)``: ``tile_width + 2`` bins), then its overflow (spill) counter,
    ``counter``, a view of the last value (the launch's counter)."""
    buffer = cupy.zeros(tile_width + 3, dtype=np.uint64)
    return buffer, buffer[-1:]


def read_counts(buffer, totals, tile_width):
    """``(hist, counter)``: the histogram of ``totals`` counted into ``buffer`` (from
    :func:`count_buffer`, its counter filled by the launch before) and read back with the
    counter in one device-to-host copy, the histogram checked (``tile_width + 1`` bins). The
    histogram gives the entry count exactly, so a pack with the slots given knows its nnz at
    the cost of one small kernel, and the SpMM can pick its way by it."""
    _count_into(totals, tile_width + 1, buffer[:-1])
    host = buffer.get().view(np.int64)  # device-to-host sync: histogram and overflow size
    return _layout.checked_histogram(host[:-1], tile_width), int(host[-1])

