"""CuPy backend: the primitives of ``_numpy_backend``, run as CUDA kernels.

One launch wrapper per kernel of ``cuda_src/``. Wrappers trust their inputs
(the public API validated them), cast every scalar to its C type, allocate
the outputs and compute the grid next to the launch. Everything runs on
CuPy's current stream; the device-to-host synchronisations are marked.
"""

import functools
import os
from typing import NamedTuple

import cupy
import numpy as np

from . import _algorithms, _kernels, _layout
from ._algorithms import Parts
from ._checks import check_csr
from ._validation import accumulator_dtype, check_storage

# Threads per block for the warp-per-item kernels (8 warps) and the thread-per-item ones.
_BLOCK = 256
_WARPS = _BLOCK // 32
_MODE_COUNT, _MODE_SLOTS, _MODE_OVERFLOW = 0, 1, 2

_i32, _i64 = np.int32, np.int64

#: Blocks of the grid-stride reductions of reduce.cu: enough to fill any current GPU.
_REDUCE_BLOCKS = 1024

#: Threads of twell_exclusive_scan's blocks (reduce.cu: kScanThreads).
_SCAN_THREADS = 256

#: CUDA's limit on gridDim.y (gridDim.x allows 2**31 - 1 blocks).
_MAX_GRID_Y = 65535


def _blocks(items, per_block):
    return (int(-(-items // per_block)),)


def _aligned(*arrays):
    return all(a.data.ptr % 16 == 0 for a in arrays)


def _vec(dtype, *conditions):
    """16-byte vectors when every condition holds, else one value at a time."""
    return _kernels.vector_width(dtype) if all(conditions) else 1


def _expr(kernel, dtype, vec=None):
    ctype = _kernels.CTYPES[np.dtype(dtype)]
    return f"{kernel}<{ctype}>" if vec is None else f"{kernel}<{ctype}, {vec}>"


def _dense_vec(dense, tile_width):
    v = _kernels.vector_width(dense.dtype)
    return _vec(dense.dtype, dense.shape[1] % v == 0, tile_width % v == 0, _aligned(dense))


def _empty_parts(m, nt, slots, dtype, zeroed=True, overflow=True):
    """Parts of an ``M x n_tiles x slots`` layout: the slot arrays (zeros when ``zeroed``,
    else uninitialised), an empty overflow part (``overflow``) or none yet (its three arrays
    None)."""
    fill = cupy.zeros if zeroed else cupy.empty
    parts = Parts(
        fill((m, nt), dtype=_layout.COUNT_DTYPE),
        fill((m, nt, slots), dtype=dtype),
        fill((m, nt, slots), dtype=_layout.INDEX_DTYPE),
        None, None, None,
    )
    return _no_overflow(parts) if overflow else parts


#: Null storage arrays for the count passes, which write only the per-tile totals (CuPy
#: passes None as a null pointer).
_NO_PARTS = Parts(None, None, None, None, None, None)


def _no_overflow(parts):
    """``parts`` with an empty overflow part."""
    return parts._replace(
        overflow_indptr=cupy.zeros(parts.counts.shape[0] + 1,
                                   dtype=_layout.OVERFLOW_INDPTR_DTYPE),
        overflow_indices=cupy.zeros(0, dtype=_layout.OVERFLOW_INDEX_DTYPE),
        overflow_data=cupy.zeros(0, dtype=parts.data.dtype),
    )


def _overflow_counter():
    """The pack kernels' device counter of entries past the slots (one uint64, zeroed)."""
    return cupy.zeros(1, dtype=np.uint64)


def _overflow_size(counter):
    """Value of an overflow counter filled by a kModeSlots pack launch (one host sync)."""
    return int(counter.get()[0])  # device-to-host sync: the overflow size


def _count_buffer(tile_width):
    """``(buffer, counter)``: zeroed uint64 device memory for a pack's one read-back,
    ``buffer``, which holds the histogram of its per-tile totals (``count_histogram(totals,
    tile_width + 1)``: ``tile_width + 2`` bins), then its overflow (spill) counter,
    ``counter``, a view of the last value (the launch's counter)."""
    buffer = cupy.zeros(tile_width + 3, dtype=np.uint64)
    return buffer, buffer[-1:]


def _read_counts(buffer, totals, tile_width):
    """``(hist, counter)``: the histogram of ``totals`` counted into ``buffer`` (from
    :func:`_count_buffer`, its counter filled by the launch before) and read back with the
    counter in one device-to-host copy, the histogram checked (``tile_width + 1`` bins). The
    histogram gives the entry count exactly, so a pack with the slots given knows its nnz at
    the cost of one small kernel, and the SpMM can pick its way by it."""
    count_histogram(totals, tile_width + 1, out=buffer[:-1])
    host = buffer.get().view(np.int64)  # device-to-host sync: histogram and overflow size
    return _layout.checked_histogram(host[:-1], tile_width), int(host[-1])


def _reduce_grid(items):
    """Grid of a reduce.cu kernel (a grid-stride loop) over ``items`` work items: one thread
    each, at most _REDUCE_BLOCKS blocks."""
    return (min(_blocks(items, _BLOCK)[0], _REDUCE_BLOCKS),)


def count_histogram(counts, size, out=None):
    """Histogram of integer counts: int64 ``hist`` of ``size + 1`` bins.

    ``hist[c]`` (``c < size``) is the number of counts equal to ``c`` and ``hist[size]`` the
    number outside ``[0, size)``. One kernel (``twell_count_histogram``, integer atomics: the
    same result in any order) and no host synchronisation; ``cupy.bincount`` synchronises
    twice before it starts (a negativity check and the maximum). ``out``: zeroed uint64
    device memory of ``size + 1`` values to count into (private: one read then fetches the
    histogram with what lies beside it).
    """
    flat = cupy.ascontiguousarray(counts, dtype=_layout.COUNT_DTYPE).reshape(-1)
    hist = cupy.zeros(size + 1, dtype=np.uint64) if out is None else out
    if flat.size:
        kernel = _kernels.function("reduce.cu", "twell_count_histogram")
        kernel(_reduce_grid(flat.size), (_BLOCK,), (flat, _i64(flat.size), _i32(size), hist))
    return hist.view(np.int64)


def _nonfinite(b):
    """Device bool scalar: whether the C-contiguous ``b`` holds an Inf or a NaN.

    16-bit values: one pass of ``twell_find_nonfinite`` over the bits;
    ``cupy.isfinite(b).all()`` would write and then reduce a boolean array as large as ``b``
    (wider values take that way: CuPy's isfinite sees their Inf and NaN without a flush).
    """
    if b.dtype.itemsize != 2:
        return ~cupy.isfinite(b).all()
    found = cupy.zeros((), dtype=bool)
    if b.size:
        vec = _vec(b.dtype, _aligned(b))
        kernel = _kernels.function("reduce.cu", _expr("twell_find_nonfinite", b.dtype, vec))
        kernel(_reduce_grid(-(-b.size // vec)), (_BLOCK,), (b, _i64(b.size), found))
    return found


#: Items per block of ``twell_exclusive_scan`` (reduce.cu: kScanThreads x kScanRows x 32).
_SCAN_TILE = 4096
_SCAN_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}


def exclusive_scan(values, minus=None, rows=None):
    """``[0, v0, v0 + v1, ...]`` of the flattened ``values`` (int64, one longer), in one
    launch of ``twell_exclusive_scan`` (a single-pass scan with decoupled look-back).

    ``v = max(values - minus, 0)`` when ``minus`` is given (the overflow of each (row,
    tile) pair past ``minus`` slots; ``values`` int32), ``values`` itself otherwise. With
    ``rows``, ``values`` holds ``rows`` equal rows and the result is ``(out, starts)``,
    ``starts = out[::values.size // rows]`` (``rows + 1`` entries: a row pointer) written by
    the same launch. Sums must stay within +-2**61. ``cupy.cumsum`` took 0.06-0.1 ms of
    GPU time and more of the host's for the 360 k pairs of the paper's FFN (H200): it
    dispatches CUB's two-pass scan, an element-wise kernel and a temporary each call.
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
        blocks = -(-n // _SCAN_TILE)
        status = cupy.zeros(blocks, dtype=np.uint64)  # one zeroed status word per tile
        clamp = "true" if minus is not None else "false"
        kernel = _kernels.function(
            "reduce.cu", f"twell_exclusive_scan<{_SCAN_TYPES[flat.dtype]}, {clamp}>")
        kernel((blocks,), (_SCAN_THREADS,), (
            flat, _i64(n), _i64(minus or 0), out, _i64(n // rows if rows else 1),
            starts, status))
    return out if rows is None else (out, starts)


def _overflow_offsets(totals, slots):
    """``(offset, row_starts)``: the exclusive prefix sum of the per-pair overflow
    ``max(total - slots, 0)`` of the (M, n_tiles) ``totals`` (int64, M * n_tiles + 1) and
    its value at each row's first pair (the overflow's row pointer, M + 1)."""
    return exclusive_scan(totals, minus=slots, rows=totals.shape[0])


def _with_overflow(parts, row_starts, n_over):
    return parts._replace(
        overflow_indptr=row_starts,
        overflow_indices=cupy.empty(n_over, dtype=_layout.OVERFLOW_INDEX_DTYPE),
        overflow_data=cupy.empty(n_over, dtype=parts.data.dtype),
    )


# -- dtype conversion --------------------------------------------------------

def cast(values, dtype):
    """``values`` converted to ``dtype`` (a new C-contiguous array), rounded once.

    Float to float conversions run ``twell_cast``, which keeps subnormals (CuPy's casts
    flush float32/bfloat16 subnormal results to zero); other sources use CuPy's cast.
    """
    dtype = np.dtype(dtype)
    if values.dtype not in _kernels.CTYPES or values.dtype == dtype:
        return cupy.ascontiguousarray(values).astype(dtype)
    src = cupy.ascontiguousarray(values)
    out = cupy.empty(src.shape, dtype=dtype)
    if src.size:
        kernel = _kernels.function("cast.cu", f"twell_cast<{_kernels.CTYPES[src.dtype]}, "
                                              f"{_kernels.CTYPES[dtype]}>")
        # One thread per element.
        kernel(_blocks(src.size, _BLOCK), (_BLOCK,), (src, _i64(src.size), out))
    return out


# -- dense -> TwELL ---------------------------------------------------------

@functools.cache
def _pack_dense_kernel(dtype, vec, loads, overflow, pairs, staged):
    """``(kernel, pairs per warp)`` of ``pack.cu`` for dense ``dtype`` values read ``vec`` at a
    time, with tiles of ``loads`` warp-wide vector loads (``overflow``: kModeOverflow's
    kernel), under ``_kernels.PACK_PAIRS`` = ``pairs`` and ``PACK_STAGED_CHUNKS`` =
    ``staged``. Kept: naming and finding the kernel cost the host microseconds a pack."""
    ctype = _kernels.CTYPES[dtype]
    if overflow:
        return _kernels.function("pack.cu", f"twell_pack_dense_overflow<{ctype}, {vec}>"), 32
    # PACK_PAIRS (row, tile) pairs per warp when a tile fits in one warp-wide vector load
    # (their loads are all in flight at once); with PACK_STAGED_CHUNKS, tiles of 2 or 4 such
    # loads take PACK_STAGED_SHAPES; else one pair per warp looping over the tile.
    if loads == 1:
        expr, per_warp = f"twell_pack_dense<{ctype}, {vec}, {pairs}>", pairs
    elif staged and loads <= 4:
        per_warp, chunks = _kernels.PACK_STAGED_SHAPES[2 if loads == 2 else 4]
        expr = f"twell_pack_dense<{ctype}, {vec}, {per_warp}, {chunks}>"
    else:
        expr, per_warp = f"twell_pack_dense<{ctype}, {vec}, 1>", 1
    return _kernels.function("pack.cu", expr), per_warp


def _launch_pack_dense(dense, tile_width, slots, mode, totals, parts, offset, counter):
    m, k = dense.shape
    pairs = m * _layout.n_tiles(k, tile_width)
    if pairs == 0:
        return
    vec = _dense_vec(dense, tile_width)
    kernel, per_warp = _pack_dense_kernel(dense.dtype, vec, -(-tile_width // (32 * vec)),
                                          mode == _MODE_OVERFLOW, _kernels.PACK_PAIRS,
                                          _kernels.PACK_STAGED_CHUNKS)
    # One warp per per_warp consecutive (row, tile) pairs. The block is _BLOCK threads:
    # kPackWarps warps in pack.cu, whose shared staging is sized per warp (its
    # __launch_bounds__ refuses a larger block).
    grid = _blocks(-(-pairs // per_warp), _WARPS)
    if mode == _MODE_OVERFLOW:
        kernel(grid, (_BLOCK,), (
            dense, _i64(m), _i64(k), _i32(tile_width), _i32(slots), totals, offset,
            parts.overflow_indices, parts.overflow_data))
        return
    kernel(grid, (_BLOCK,), (
        dense, _i64(m), _i64(k), _i32(tile_width), _i32(slots), _i32(mode), totals,
        parts.counts, parts.data, parts.indices, counter))


def tile_counts_dense(dense, tile_width):
    """Non-zeros of every (row, tile) of a dense matrix, int32 (M, n_tiles)."""
    m, k = dense.shape
    nt = _layout.n_tiles(k, tile_width)
    totals = cupy.empty((m, nt), dtype=_layout.COUNT_DTYPE)
    # kModeCount writes the totals alone: null slots, overflow and counter.
    _launch_pack_dense(dense, tile_width, 1, _MODE_COUNT, totals, _NO_PARTS, None, None)
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
    parts = _empty_parts(m, nt, slots, dense.dtype, zeroed=False, overflow=False)
    totals = cupy.empty((m, nt), dtype=_layout.COUNT_DTYPE)
    # The overflow size known, the kernel's counter is not read, and no histogram is made.
    both, counter = _count_buffer(tile_width) if n_over is None else (None, _overflow_counter())
    _launch_pack_dense(dense, tile_width, slots, _MODE_SLOTS, totals, parts, None, counter)
    nnz = None
    if n_over is None:
        no_overflow = _no_overflow(parts)  # made while the kernel runs
        hist, n_over = _read_counts(both, totals, tile_width)
        nnz = _layout.histogram_nnz(hist)
        if n_over == 0:
            return no_overflow, nnz
    elif n_over == 0:
        return _no_overflow(parts), nnz
    offset, row_starts = _overflow_offsets(totals, slots)
    parts = _with_overflow(parts, row_starts, n_over)
    _launch_pack_dense(dense, tile_width, slots, _MODE_OVERFLOW, totals, parts, offset, counter)
    return parts, nnz


# -- CSR -> TwELL -----------------------------------------------------------

#: Longest row out of column order that ``twell_csr_sort_rows`` sorts: a lane's work grows as
#: (length / 32)**2 dependent binary-search steps (about 0.3 ms for one warp at 2048 entries).
#: A longer one sends the whole input to the shared global sort (``_algorithms.canonical_csr``).
CSR_SORT_MAX_ROW = 2048

#: Blocks of the grid-stride canonical.cu kernels: enough warps to fill any current GPU, and a
#: bound on their atomic updates of the two counters.
_CANONICAL_BLOCKS = 4096


def canonical_csr(indptr, indices, data, shape, names=("indptr", "indices")):
    """CSR with rows in any column order -> canonical CSR ``(indptr int64, indices int32,
    data)``: columns sorted, duplicates summed in input order, zeros dropped.

    A warp per row (canonical.cu) instead of the global sort of 64-bit keys: 0.11 / 1.2 ms
    against 0.9 / 2.6 ms on cupyx input of the paper's activations at 99% / 90% (float32,
    H200; benchmarks/NOTES.md, eighth session). Synchronises once with the host, to read the
    number of dropped entries (the output size), whether a row was too long to sort here,
    and whether a row pointer or a column index was out of range: the kernel counts those
    faults as it reads, and :func:`twell._checks.check_csr` then names one (``names``).
    Indices other than int32 take the checks and the global sort.
    """
    m = shape[0]
    if m == 0 or indices.dtype != np.int32 or indptr.shape != (m + 1,):
        check_csr(indptr, indices, shape, names)
        return _algorithms.canonical_csr(indptr, indices, data, shape)
    indptr = cupy.ascontiguousarray(indptr, dtype=np.int64)
    indices, data = cupy.ascontiguousarray(indices), cupy.ascontiguousarray(data)
    scratch, col, val = cupy.empty_like(indices), cupy.empty_like(indices), cupy.empty_like(data)
    kept = cupy.empty(m, dtype=np.int64)
    info = cupy.zeros(3, dtype=np.uint64)
    grid = (min(_blocks(m, _WARPS)[0], _CANONICAL_BLOCKS),)
    kernel = _kernels.function("canonical.cu", _expr("twell_csr_sort_rows", data.dtype))
    kernel(grid, (_BLOCK,), (indptr, indices, data, _i64(m), _i64(shape[1]),
                             _i64(indices.size), _i64(CSR_SORT_MAX_ROW), scratch, col, val,
                             kept, info))
    unsorted, dropped, faults = (int(v) for v in info.get())  # device-to-host sync
    if faults or unsorted:  # the long rows' columns are checked here too
        check_csr(indptr, indices, shape, names)
    if faults:
        raise RuntimeError(f"twell_csr_sort_rows counted {faults} faults in a CSR input "
                           "that check_csr accepts")  # a bug in one or the other
    if unsorted:
        return _algorithms.canonical_csr(indptr, indices, data, shape)
    if dropped == 0:
        return indptr, col, val
    out_indptr = exclusive_scan(kept)
    n = indices.size - dropped
    out_col = cupy.empty(n, dtype=np.int32)
    out_val = cupy.empty(n, dtype=data.dtype)
    kernel = _kernels.function("canonical.cu", _expr("twell_csr_compact_rows", data.dtype))
    kernel(grid, (_BLOCK,), (indptr, col, val, _i64(m), out_indptr, out_col, out_val))
    return out_indptr, out_col, out_val


def _launch_pack_csr(indptr, indices, data, shape, tile_width, slots, mode, totals, parts,
                     offset, counter):
    m, k = shape
    if m == 0 or indices.size == 0:
        return
    kernel = _kernels.function("pack.cu", _expr("twell_pack_csr", data.dtype))
    # One warp per row.
    kernel(_blocks(m, _WARPS), (_BLOCK,), (
        indptr, indices, data, _i64(m), _i64(k), _i32(tile_width), _i32(slots), _i32(mode),
        totals, parts.counts, parts.data, parts.indices, offset, parts.overflow_indices,
        parts.overflow_data, counter))


def tile_counts_csr(indptr, indices, shape, tile_width):
    """Non-zeros of every (row, tile) of a canonical CSR matrix, int32 (M, n_tiles).

    ``twell_pack_csr`` in its count mode (a warp per row; the values are not read): the
    shared algorithm's binary search per (row, tile) took 174 us at 99% on the paper's FFN
    activations (float32, H200), the kernel a pass over the column indices.
    """
    m, k = shape
    totals = cupy.zeros((m, _layout.n_tiles(k, tile_width)), dtype=_layout.COUNT_DTYPE)
    no_values = cupy.empty(0, dtype=np.float32)  # kModeCount reads no values
    # kModeCount writes the totals alone: null slots, overflow and counter.
    _launch_pack_csr(cupy.ascontiguousarray(indptr, dtype=np.int64),
                     cupy.ascontiguousarray(indices, dtype=np.int32), no_values, shape,
                     tile_width, 1, _MODE_COUNT, totals, _NO_PARTS, None, None)
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
    parts = _empty_parts(m, nt, slots, data.dtype)  # the kernel writes only used slots
    totals = cupy.zeros((m, nt), dtype=_layout.COUNT_DTYPE)
    counter = _overflow_counter()
    _launch_pack_csr(indptr, indices, data, shape, tile_width, slots, _MODE_SLOTS, totals,
                     parts, parts.overflow_indptr, counter)
    if n_over is None:
        n_over = _overflow_size(counter)
    if n_over == 0:
        return parts
    offset, row_starts = _overflow_offsets(totals, slots)
    parts = _with_overflow(parts, row_starts, n_over)
    _launch_pack_csr(indptr, indices, data, shape, tile_width, slots, _MODE_OVERFLOW, totals,
                     parts, offset, counter)
    return parts


# -- TwELL -> dense / CSR ---------------------------------------------------

def _scatter_overflow(parts, shape, out):
    n_over = parts.overflow_indices.size
    if n_over == 0:
        return
    kernel = _kernels.function("unpack.cu", _expr("twell_scatter_csr", out.dtype))
    # One thread per overflow entry.
    kernel(_blocks(n_over, _BLOCK), (_BLOCK,), (
        parts.overflow_indptr, parts.overflow_indices, parts.overflow_data, _i64(shape[0]),
        _i64(n_over), _i64(shape[1]), out))


def to_dense(parts, shape, tile_width):
    """TwELL parts -> dense C-contiguous CuPy array (every element written by the kernels)."""
    m, k = shape
    out = cupy.empty(shape, dtype=parts.data.dtype)
    pairs = parts.counts.size
    if pairs:
        vec = _dense_vec(out, tile_width)
        kernel = _kernels.function("unpack.cu", _expr("twell_unpack_dense", out.dtype, vec))
        # One warp per (row, tile).
        kernel(_blocks(pairs, _WARPS), (_BLOCK,), (
            parts.counts, parts.data, parts.indices, _i64(m), _i64(k), _i32(tile_width),
            _i32(parts.data.shape[2]), out))
    _scatter_overflow(parts, shape, out)
    return out


def to_csr(parts, shape, tile_width):
    """TwELL parts -> canonical CSR ``(indptr int64, indices int32, data)``.

    ``twell_rows_to_csr``, a warp per row: it counts each row's entries, then, after a prefix
    sum over the rows, writes them (the shared ``csr_layout``, a dozen CuPy calls over every
    tile, took 0.37-0.54 ms of ``tocsr``'s 1.2 ms at 99%, float32, H200). Synchronises once
    with the host to size the output.
    """
    m, k = shape
    row_nnz = cupy.empty(m, dtype=np.int64)
    kernel = _kernels.function("unpack.cu", _expr("twell_rows_to_csr", parts.data.dtype))

    def launch(mode, row_info, indices, data):
        if m:  # one warp per row
            kernel(_blocks(m, _WARPS), (_BLOCK,), (
                parts.counts, parts.data, parts.indices, parts.overflow_indptr,
                parts.overflow_indices, parts.overflow_data, _i64(m), _i64(k),
                _i32(tile_width), _i32(parts.data.shape[2]), _i32(mode), row_info, indices,
                data))

    launch(_MODE_COUNT, row_nnz, cupy.empty(0, dtype=np.int32),
           cupy.empty(0, dtype=parts.data.dtype))  # not written in kModeCount
    indptr = exclusive_scan(row_nnz)
    nnz = int(indptr[-1])  # device-to-host sync: the output size
    indices = cupy.empty(nnz, dtype=_layout.OVERFLOW_INDEX_DTYPE)
    data = cupy.empty(nnz, dtype=parts.data.dtype)
    launch(_MODE_SLOTS, indptr, indices, data)
    return indptr, indices, data


# -- SpMM -------------------------------------------------------------------

#: Largest tile width of the tensor-core SpMM (its B tiles live in shared memory).
_MMA_MAX_TILE = 256
_MMA_COLS, _GROUP_ROWS = 64, 16


def _header_words(groups_per_block):
    return (groups_per_block + 2 + 3) // 4 * 4


def _mma_smem(tile_width, slots, shape):
    """Dynamic shared memory of twell_spmm_mma: per stage, B tile + header + records."""
    warps, groups_per_warp, stages = shape
    groups_per_block = warps * groups_per_warp
    return stages * (tile_width * _MMA_COLS * 2 + 4 * _header_words(groups_per_block)
                     + 4 * _segment_capacity(groups_per_block, slots))


def _segment_capacity(groups_per_block, slots):
    """Records per (row block, tile) segment: every group padded to a multiple of 16."""
    return groups_per_block * _GROUP_ROWS * (slots + 1)


def _block_records(parts, shape, tile_width, groups_per_block):
    """Slot entries as (row block, tile) record segments, for twell_spmm_mma."""
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    slots = parts.data.shape[2]
    rows_per_block = _GROUP_ROWS * groups_per_block
    blocks = -(-m // rows_per_block)
    headers = cupy.empty(max(blocks * nt, 1) * _header_words(groups_per_block), dtype=np.int32)
    records = cupy.empty(max(blocks * nt * _segment_capacity(groups_per_block, slots), 4),
                         dtype=np.uint32)
    if blocks * nt:
        kernel = _kernels.function("spmm.cu", _expr_n("twell_block_records", parts.data.dtype,
                                                       groups_per_block))
        smem = 4 * rows_per_block * slots  # the segment's records, staged in row order
        kernel.max_dynamic_shared_size_bytes = smem
        # One block of 16 * groups_per_block threads (one per row) per (row block, tile).
        kernel((blocks * nt,), (rows_per_block,), (
            parts.counts, parts.data, parts.indices, _i64(m), _i64(nt), _i32(tile_width),
            _i32(slots), headers, records), shared_mem=smem)
    return headers, records, blocks


def _expr_n(kernel, dtype, *numbers):
    return f"{kernel}<{_kernels.CTYPES[np.dtype(dtype)]}, {', '.join(map(str, numbers))}>"


#: Shared memory a block may use (H100/H200/A100 allow 227 KB; keep a margin).
_MMA_SMEM_LIMIT = 200 * 1024


def _mma_shape(dtype, tile_width, slots, b, requested=None):
    """The (warps, groups per warp, stages) of the tensor-core SpMM here, or None."""
    if not (np.dtype(dtype) in _kernels.HALF_DTYPES and tile_width <= _MMA_MAX_TILE
            and b.shape[1] % 8 == 0 and _aligned(b)):
        return None
    for shape in ([requested] if requested else _kernels.MMA_SHAPES):
        if _mma_smem(tile_width, slots, shape) <= _MMA_SMEM_LIMIT:
            return shape
    return None


def spmm(parts, shape, tile_width, b, out_dtype, mma_shape=None, variant=None, nnz_hint=None,
         tile_index=None):
    """``A @ b`` for TwELL ``A`` and a C-contiguous 2-D CuPy ``b`` of the parts' dtype.

    Two ways, chosen without a host synchronisation (:func:`spmm_way`):

    * the gather kernel ``twell_spmm_rows`` (8 to 32 lanes per row and up to 1024 columns of
      16-bit values, by N and the layout: :func:`_rows_shape`; the B row of each entry read
      from L2; for one column ``twell_spmv_thread_rows`` or ``twell_spmv_rows``,
      :func:`_spmv_lanes`), after
      ``twell_spmm_overflow_chunks`` when a row's overflow may be long enough to split
      (:func:`_split_chunk`), unless the next way is taken;
    * ``A.toarray() @ b`` by cuBLAS when :func:`twell._layout.dense_product_pays` says so for
      ``nnz_hint`` (A's entries, when known without reading the GPU), ``b`` has at most
      ``_MAX_GRID_Y * 32`` columns (wider products gather, in column chunks), the ``M x K`` dense
      temporary takes at most 1/8 of the device's memory (and can be allocated: if not, the
      gather kernel runs), and (float32) CuPy's matmul is not set to TF32. If ``b`` holds Inf
      or NaN, the dense product would multiply A's zeros by them (NaN where A has no entry),
      so then the gather kernel recomputes the product (gated on the device).

    With ``tile_index`` (the layout's :class:`~twell._algorithms.TileIndex`,
    ``TwELLMatrix.index_tiles``), where :func:`_index_pays`, the gather and SpMV kernels walk
    each row's listed tiles instead of all its counts (the ``Listed`` instances: the same
    order of sums for the same shape; not the SpMV's team of 32, see spmm.cu), and the
    shape rules read the longest row's tiles from it.

    ``variant`` (private: tests and benchmarks) forces ``"rows"``, ``"dense"`` or ``"mma"``:
    the tensor-core kernel ``twell_spmm_mma`` (shape ``mma_shape``, or the first that fits;
    giving ``mma_shape`` implies it) for 16-bit values with ``tile_width <= 256`` and
    ``N % 8 == 0``, gated the same way on ``b`` being finite. The gather kernel is faster
    on the benchmarked shapes (``benchmarks/NOTES.md``, 2026-12-03), so it is not the default.
    """
    m, k = shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return cupy.zeros((m, n), dtype=out_dtype)
    chosen = variant is None
    if chosen:
        variant = "mma" if mma_shape is not None else spmm_way(m, k, n, out_dtype, nnz_hint)
    if variant not in ("rows", "dense", "mma"):
        raise ValueError(f"variant must be None, 'rows', 'dense' or 'mma'; got {variant!r}")
    # twell_spmm_rows puts blocks of its columns on grid y, at most _MAX_GRID_Y of them:
    # wider products run in column chunks (a copy of each chunk of b).
    chunk = _MAX_GRID_Y * 32
    if n > chunk:
        out = cupy.empty((m, n), dtype=out_dtype)
        for c0 in range(0, n, chunk):
            part = cupy.ascontiguousarray(b[:, c0:c0 + chunk])
            out[:, c0:c0 + chunk] = spmm(parts, shape, tile_width, part, out_dtype, mma_shape,
                                         variant, tile_index=tile_index)
        return out
    common = (parts.counts, parts.data, parts.indices, parts.overflow_indptr,
              parts.overflow_indices, parts.overflow_data, _i64(m), _i64(k), _i32(tile_width),
              _i32(parts.data.shape[2]))
    if tile_index is not None and not _index_pays(parts, m, tile_index):
        tile_index = None
    if n == 1 and variant != "dense":
        out = cupy.empty((m, n), dtype=out_dtype)
        lanes = _spmv_lanes(parts, m, tile_index)
        if lanes == 1:  # a thread per row (kSpmvBlock = _BLOCK)
            expr = _expr("twell_spmv_thread_rows", out_dtype)
            listed, args = _listed_args(expr, parts, tile_index)
            kernel = _kernels.function("spmm.cu", listed)
            kernel(_blocks(m, _BLOCK), (_BLOCK,), (*common, *args, b, out))
        else:  # a team of `lanes` per row, which reads its counts (spmm.cu: not the index)
            kernel = _kernels.function("spmm.cu", _expr_n("twell_spmv_rows", out_dtype, lanes))
            kernel(_blocks(m, _BLOCK // lanes), (_BLOCK,), (*common, b, out))
        return out
    run_rows = cupy.ones((), dtype=bool)
    if variant == "dense":
        try:
            out = cupy.matmul(to_dense(parts, shape, tile_width), b)
        except cupy.cuda.memory.OutOfMemoryError:
            if not chosen:
                raise
            # The device's memory is in use elsewhere: the gather kernel needs no temporary.
            return spmm(parts, shape, tile_width, b, out_dtype, variant="rows",
                        tile_index=tile_index)
        run_rows = _nonfinite(b)
    else:
        out = cupy.empty((m, n), dtype=out_dtype)
        if variant == "mma":
            mma_shape = _mma_shape(out_dtype, tile_width, parts.data.shape[2], b, mma_shape)
            rows_per_block = _GROUP_ROWS * mma_shape[0] * mma_shape[1] if mma_shape else 0
            if mma_shape is not None and -(-m // rows_per_block) <= _MAX_GRID_Y:
                run_rows = _nonfinite(b)
                _spmm_mma(parts, shape, tile_width, b, ~run_rows, out, mma_shape)
    vec = _vec(out_dtype, n % _kernels.vector_width(out_dtype) == 0, _aligned(b, out))
    shape = (vec, *_rows_shape(n, out_dtype, _short_rows(parts, m, tile_index)))
    column_blocks = int(-(-n // (shape[0] * shape[1] * shape[2])))  # vec * G * C columns each
    teams = 32 // shape[1]  # rows (or overflow chunks) per warp
    # Rows with a long overflow are split (split_row in spmm.cu): the parts of their
    # overflow first, a warp per chunk of the overflow, into `partial`.
    n_over, acc = parts.overflow_indices.size, accumulator_dtype(out_dtype)
    chunk = _split_chunk(n_over, m, n, acc, out_dtype)
    partial = cupy.empty((2 * -(-n_over // chunk) if chunk else 0, n), dtype=acc)
    if chunk:
        kernel = _kernels.function("spmm.cu", _expr_n("twell_spmm_overflow_chunks", out_dtype,
                                                      *shape))
        # One team of G lanes per (chunk, column block).
        kernel((-(-partial.shape[0] // 2 // teams), column_blocks), (32,), (
            parts.overflow_indptr, parts.overflow_indices, parts.overflow_data, _i64(m), b,
            _i64(n), run_rows, _i32(chunk.bit_length() - 1), partial))
    listed, args = _listed_args(_expr_n("twell_spmm_rows", out_dtype, *shape), parts,
                                tile_index)
    kernel = _kernels.function("spmm.cu", listed)
    # One team of G lanes per (row, column block), one warp per block (__maxnreg__).
    kernel((-(-m // teams), column_blocks), (32,), (
        *common, *args, b, _i64(n), run_rows, partial, _i32(max(chunk.bit_length() - 1, 0)),
        out))
    return out


#: Entries per chunk of the overflow in the gather SpMM, a power of two: a row whose overflow
#: holds at least two chunks is split, its parts summed by one warp per chunk (spmm.cu,
#: split_row).
SPMM_SPLIT_CHUNK = 256


def _split_chunk(n_over, m, n, acc_dtype, out_dtype):
    """The chunk of the gather SpMM's split rows, or 0 for none.

    The launcher cannot know which rows are long without reading the GPU, so it sizes the
    partial sums (2 rows of ``n`` per chunk) for the whole overflow: rows are split only when
    the overflow can hold a long row and that buffer is no larger than the product itself
    (an overflow of at most 64 entries per row on average for 16-bit values, 128 for
    float32 and float64).
    """
    chunk = SPMM_SPLIT_CHUNK
    if n_over < 2 * chunk:
        return 0
    partial_bytes = 2 * -(-n_over // chunk) * n * np.dtype(acc_dtype).itemsize
    return chunk if partial_bytes <= m * n * np.dtype(out_dtype).itemsize else 0


#: A layout whose rows have room for at most this many entries, slots (``n_tiles * slots``)
#: plus an even share of the overflow, is one of short rows (:func:`_short_rows`).
SHORT_ROW_ENTRIES = 128

#: A layout whose rows have room for at most this many entries takes the SpMV with a thread
#: per row (:func:`_spmv_lanes`).
SPMV_THREAD_ROW_ENTRIES = 256


def _listed_args(expr, parts, tile_index):
    """The instance of ``expr`` that walks ``tile_index`` (or ``expr`` itself without one),
    and its two index arguments: the index, or arrays of their types that the instances
    without it never read."""
    if tile_index is None:
        return expr, (parts.overflow_indptr, parts.overflow_indices)
    return _kernels.listed(expr), (tile_index.indptr, tile_index.tiles)


#: The GPU kernels walk the tile index only for rows of more tiles than this (one round of
#: count reads of a team of 32: kCountWindows * 32 in spmm.cu), and when it lists at most
#: 1 / INDEX_MAX_SHARE of the (row, tile) pairs (:func:`_index_pays`).
INDEX_MIN_TILES = 128
INDEX_MAX_SHARE = 8


def _index_pays(parts, m, tile_index):
    """Whether the gather and SpMV kernels walk ``tile_index`` rather than every count.

    A listed tile costs a dependent read (its number, then its count), which a row of few
    tiles does not make up for: on the power-law graph at tile width 65536 (16 tiles a
    row, 9 listed) the SpMV took 0.82 ms with the index against 0.52 without, and at 4096
    the Poisson matrix (245 tiles, 1.5 listed) 0.10 against 0.51, its SpMM with 64 columns
    0.35 against 1.0 (H200, twelfth GPU session). From the arrays' sizes (no sync).
    """
    tiles = parts.data.shape[1]
    return (tiles > INDEX_MIN_TILES
            and INDEX_MAX_SHARE * tile_index.tiles.size <= tiles * max(m, 1))


def _row_room(parts, m, tile_index=None):
    """Entries a row of the layout has room for: ``n_tiles * slots`` (with the tile index,
    the longest row's tiles times ``slots``) plus an even share of the overflow. From the
    arrays' shapes alone, and the index's ``max_tiles`` (no sync)."""
    _, tiles, slots = parts.data.shape
    if tile_index is not None:
        tiles = tile_index.max_tiles
    return tiles * slots + parts.overflow_indices.size / max(m, 1)


def _short_rows(parts, m, tile_index=None):
    """Whether the gather kernels take the layout for one of short rows.

    Four narrow teams per warp pay on short rows of similar lengths: a team per row in lock
    step with its neighbours (a stencil). On long or skewed rows (a power-law graph, where
    ``slots`` follows the long rows) the teams of a warp diverge, and a row's entries are
    better spread over more lanes: ``benchmarks/NOTES.md``, tenth GPU session.
    """
    return _row_room(parts, m, tile_index) <= SHORT_ROW_ENTRIES


def _rows_shape(n, dtype, short):
    """(G, C, E) of ``twell_spmm_rows`` for ``n`` output columns (_kernels.SPMM_ROWS_SHAPES):
    G lanes per row, C column chunks and E entries in flight per lane.

    From N, the dtype's vector width and the layout's row length (``short``,
    :func:`_short_rows`), never from whether B is aligned: the shape fixes the order of the
    sums, and a B that needs the VEC = 1 instance must give the same bits. A row of B as wide
    as 4 warp-wide 16-byte loads takes a warp and one entry per step (the plain order).
    Narrower ones take fewer lanes per row (more rows per warp). For long rows the 4 loads a
    lane keeps in flight go to several entries, so that a long row is not read one dependent
    load after another; for short rows they go to column chunks, so that the team is as narrow
    as B allows (8 lanes: 4 rows per warp).
    """
    lanes = -(-n // _kernels.vector_width(dtype))  # 16-byte vectors in a row of B
    if lanes > 64:
        return 32, 4, 1
    if short:
        if lanes > 32:
            return 16, 4, 1
        if lanes > 16:
            return 8, 4, 1
        return (8, 2, 2) if lanes > 8 else (8, 1, 4)
    if lanes > 32:
        return 32, 2, 2
    if lanes > 16:
        return 32, 1, 4
    return (16, 1, 4) if lanes > 8 else (8, 1, 4)


def _spmv_lanes(parts, m, tile_index=None):
    """Lanes per row of the SpMV (_kernels.SPMV_LANES): 1 (``twell_spmv_thread_rows``) when
    the layout's rows have room for at most SPMV_THREAD_ROW_ENTRIES entries, else a team of
    32 (``twell_spmv_rows``).

    A thread per row shortens the chain of dependent loads per row and wins on short rows:
    the stencil at tile width 65536 (room 80) 0.081 ms against 0.155 for a team of 8, the
    paper's activations at 99% (room ~140) 0.021 against 0.037. A team wins on long rows: the
    power-law graph (room 464) 0.48 against 1.08, the activations at 90% (room ~700) 0.045
    against 0.169; at room 1225 (the stencil at tile width 4096) the two are even, 0.49
    (H200, eleventh GPU session; a team of 8 was never the fastest).
    """
    room = _row_room(parts, m, tile_index)
    return _kernels.SPMV_LANES[0] if room <= SPMV_THREAD_ROW_ENTRIES else _kernels.SPMV_LANES[-1]


def spmm_way(m, k, n, dtype, nnz_hint):
    """How :func:`spmm` runs ``A @ B`` by default: ``"dense"`` (cuBLAS on ``A.toarray()``) or
    ``"rows"`` (the gather kernel), by the conditions listed there, without a host sync.
    ``"dense"`` still falls back to the gather kernel if the temporary cannot be allocated."""
    itemsize = np.dtype(dtype).itemsize
    dense = (_layout.dense_product_pays(m, k, n, itemsize, nnz_hint)
             and n <= _MAX_GRID_Y * 32  # no column chunks (spmm)
             and not (itemsize == 4 and _float32_gemm_is_tf32())
             and m * k * itemsize <= _device_bytes() // _DENSE_SHARE)
    return "dense" if dense else "rows"


def _float32_gemm_is_tf32():
    """Whether CuPy's float32 matmul rounds its inputs to TF32 (``CUPY_TF32=1``, or
    ``cupy._core.set_compute_type``): the automatic dense path then stays away from float32,
    whose products twell promises in float32."""
    try:
        from cupy._core import _routines_linalg

        # 7 is COMPUTE_TYPE_TF32 (a Cython constant, cupy/_core/_routines_linalg.pxd).
        return int(_routines_linalg.get_compute_type(np.dtype(np.float32))) == 7
    except Exception:  # noqa: BLE001 - a CuPy without this private API: its documented switch
        try:
            return int(os.environ.get("CUPY_TF32", "0") or 0) > 0
        except ValueError:  # not a number: CuPy itself would refuse it at its first matmul
            return False


#: The dense path's ``M x K`` temporary may take up to this share of the device's memory.
#: The share is of the total, not of what is free at the call, so that the choice, and with it
#: the result's bits, does not change with memory pressure, except when the temporary cannot
#: be allocated: then the gather kernel runs instead.
_DENSE_SHARE = 8


def _device_bytes():
    """Total memory of the current device (no sync)."""
    return cupy.cuda.runtime.memGetInfo()[1]


def _spmm_mma(parts, shape, tile_width, b, gate, out, mma_shape):
    m, k = shape
    n = b.shape[1]
    warps, groups_per_warp, _ = mma_shape
    headers, records, blocks = _block_records(parts, shape, tile_width, warps * groups_per_warp)
    kernel = _kernels.function("spmm.cu", _expr_n("twell_spmm_mma", out.dtype, *mma_shape))
    smem = _mma_smem(tile_width, parts.data.shape[2], mma_shape)
    kernel.max_dynamic_shared_size_bytes = smem
    # Blocks: 64 output columns x one row block; column blocks vary fastest so that the blocks
    # sharing a row block run together and reuse its records from L2.
    grid = (int(-(-n // _MMA_COLS)), blocks)
    kernel(grid, (warps * 32,), (
        headers, records, parts.overflow_indptr, parts.overflow_indices, parts.overflow_data,
        _i64(m), _i64(k), _i32(tile_width), _i32(parts.data.shape[2]), b, _i64(n), gate, out),
        shared_mem=smem)


# -- relu(x @ w.T) -> TwELL (fused) --------------------------------------------

#: Block tile of twell_matmul_pack and twell_matmul_pack_sm90_* (rows, columns) and their
#: dynamic shared memory in bytes: 3 (4) pipeline stages of a 128 x 64 and a 256 x 64 tile of
#: 16-bit values; the Hopper kernel adds its 8 mbarriers and aligns its tiles to 1024 bytes by
#: hand (+1024 of slack). The Hopper kernel runs 288 threads (a producer warp), the other 256.
_MATMUL_TILE = (128, 256)
_MATMUL_SMEM = 3 * (128 + 256) * 64 * 2
_MATMUL_SM90_SMEM = 4 * (128 + 256) * 64 * 2 + 2 * 4 * 8 + 1024
_MATMUL_THREADS = {"mma": 256, "sm90": 288}
_SM90_SOURCE = "matmul_pack_sm90.cu"
_SM90_KERNELS = {"bfloat16": "twell_matmul_pack_sm90_bf16", "float16": "twell_matmul_pack_sm90_f16"}
#: Depth of a k tile of the GEMM: the Hopper kernel's x and w boxes are 64 columns wide.
_MATMUL_DEPTH = 64
#: TMA box coordinates are 32-bit: the Hopper kernel takes M and N below this.
_TMA_COORD_LIMIT = 2**31

#: Spill buffer of twell_matmul_pack, in entries: one per _SPILL_SHARE outputs (plus a floor).
#: Enough when the slots hold all but a few percent of ~10% non-zeros; when it is not, the
#: launcher reruns the kernel with exactly the room the first run counted.
_SPILL_SHARE = 64
_SPILL_FLOOR = 4096


def matmul_pack_supported(x, w, tile_width):
    """Whether twell_matmul_pack computes ``relu(x @ w.T)`` for these operands.

    Both float16 or both bfloat16, C-contiguous and 16-byte aligned, ``K % 8 == 0`` (whole
    16-byte chunks of each row) and a tile width in {8, 16, ..., 256} (a divisor of the
    kernel's 256 columns, so that a (row, tile) pair never spans two blocks).
    """
    return (x.dtype == w.dtype and x.dtype in _kernels.HALF_DTYPES and x.shape[1] % 8 == 0
            and 8 <= tile_width <= _MATMUL_TILE[1] and _MATMUL_TILE[1] % tile_width == 0
            and x.flags.c_contiguous and w.flags.c_contiguous and _aligned(x, w))


def _matmul_variant(x, w, variant):
    """The kernel that runs: ``"sm90"`` (wgmma and TMA) on a device of compute capability 9.0
    with a driver that encodes tensor maps, for K > 0 and M, N below 2^31; ``"mma"``
    (mma.sync) otherwise. ``variant`` forces one (a ValueError where sm90 cannot run these
    operands). Both take float16 and bfloat16."""
    if variant not in (None, "mma", "sm90"):
        raise ValueError(f"variant must be None, 'mma' or 'sm90'; got {variant!r}")
    if variant == "mma":
        return variant
    sm90 = x.shape[1] > 0 and max(x.shape[0], w.shape[0]) < _TMA_COORD_LIMIT
    if variant == "sm90" and not sm90:
        raise ValueError(f"the sm90 kernel takes K > 0 and M, N < 2**31; got "
                         f"x.shape={x.shape}, w.shape={w.shape}")
    if variant is None:
        sm90 = (sm90 and _kernels.arch_supported(_SM90_SOURCE)
                and _kernels.tensor_maps_supported())
    return "sm90" if sm90 else "mma"


def _matmul_operands(x, w, variant):
    """The kernel, its operand arguments and its shared memory for ``variant``."""
    if variant == "sm90":
        bm, bn = _MATMUL_TILE
        maps = (_kernels.tensor_map_2d(x, _MATMUL_DEPTH, bm),
                _kernels.tensor_map_2d(w, _MATMUL_DEPTH, bn))
        kernel = _kernels.function(_SM90_SOURCE, _SM90_KERNELS[x.dtype.name])
        return kernel, maps, _MATMUL_SM90_SMEM
    kernel = _kernels.function("ffn.cu", _expr("twell_matmul_pack", x.dtype))
    return kernel, (x, w), _MATMUL_SMEM


class MatmulPlan(NamedTuple):
    """The kernel variant and buffers of one fused GEMM -> TwELL call that do not depend on
    the slots (:func:`matmul_plan`)."""

    variant: str  # "sm90" or "mma"
    totals: object  # int32 (M, n_tiles): every pair's entries, slots or not
    spill_start: object  # int64 (M, n_tiles): where a pair's entries past the slots went
    spill_capacity: int
    spill_indices: object
    spill_data: object


def matmul_plan(x, w, tile_width, spill_capacity=None, variant=None):
    """The slot-independent buffers of a fused call on ``x``, ``w`` at ``tile_width``: the
    kernel variant, totals, spill starts and the spill buffer.

    The operands pass :func:`matmul_pack_supported`; ``spill_capacity`` and ``variant`` as
    for :func:`matmul_pack`. No host synchronisation.
    """
    m = x.shape[0]
    variant = _matmul_variant(x, w, variant)
    nt = _layout.n_tiles(w.shape[0], tile_width)
    if spill_capacity is None:
        spill_capacity = m * w.shape[0] // _SPILL_SHARE + _SPILL_FLOOR
    if spill_capacity < 1:
        raise ValueError(f"spill_capacity must be at least 1; got {spill_capacity}")
    return MatmulPlan(variant, cupy.empty((m, nt), dtype=_layout.COUNT_DTYPE),
                      cupy.empty((m, nt), dtype=np.int64), spill_capacity,
                      *_spill_buffers(spill_capacity, x.dtype))


def _spill_buffers(capacity, dtype):
    """Column indices and values of ``capacity`` spilled entries (uninitialised)."""
    return (cupy.empty(capacity, dtype=_layout.OVERFLOW_INDEX_DTYPE),
            cupy.empty(capacity, dtype=dtype))


def _launch_matmul_pack(x, w, variant, tile_width, slots, totals, parts, spill_start,
                        spill_capacity, spill_indices, spill_data, counter=None, zero_fill=True):
    """One launch of the fused kernel; returns its overflow counter (a device array:
    ``counter``, zeroed, or a new one). ``zero_fill=False`` leaves the slots past each pair's
    count unwritten, for a caller that reads only the counted ones."""
    m, k = x.shape
    n = w.shape[0]
    kernel, operands, smem = _matmul_operands(x, w, variant)
    kernel.max_dynamic_shared_size_bytes = smem
    bm, bn = _MATMUL_TILE
    counter = _overflow_counter() if counter is None else counter
    # Blocks: one 128 x 256 output tile each, the column tiles of a row block consecutive.
    kernel((-(-m // bm) * -(-n // bn),), (_MATMUL_THREADS[variant],), (
        *operands, _i64(m), _i64(n), _i64(k), _i32(tile_width), _i32(slots),
        _i32(zero_fill), totals,
        parts.counts, parts.data, parts.indices, spill_start, spill_indices, spill_data,
        _i64(spill_capacity), counter), shared_mem=smem)
    return counter


def matmul_pack(x, w, tile_width, slots, spill_capacity=None, variant=None):
    """``relu(x @ w.T)`` packed into TwELL parts by a fused GEMM -> TwELL kernel: returns
    ``(parts, nnz)``.

    The operands pass :func:`matmul_pack_supported`. Products accumulate in float32 and
    round once to the inputs' dtype; the dense product is never written to global memory.
    A device of compute capability 9.0 (H100/H200) runs ``twell_matmul_pack_sm90_bf16`` or
    ``_f16`` (wgmma fed by TMA), every other ``twell_matmul_pack`` (mma.sync); both give the
    same bits. Synchronises once with the host (the overflow size and the histogram of the
    per-tile totals, which gives ``nnz``), twice when the spill buffer (``spill_capacity``
    entries; private, for tests) was too small and the kernel reruns. ``variant`` (private:
    tests and benchmarks): ``"mma"`` forces the mma.sync kernel, ``"sm90"`` the Hopper one.
    """
    plan = matmul_plan(x, w, tile_width, spill_capacity, variant)
    m, nt = plan.totals.shape
    # The overflow part is made after the launch: the GPU need not wait for it.
    parts = _empty_parts(m, nt, slots, x.dtype, zeroed=False, overflow=False)
    if m * nt == 0:
        return _no_overflow(parts), 0
    capacity, spill_indices, spill_data = plan.spill_capacity, plan.spill_indices, plan.spill_data
    while True:
        both, counter = _count_buffer(tile_width)
        _launch_matmul_pack(x, w, plan.variant, tile_width, slots, plan.totals, parts,
                            plan.spill_start, capacity, spill_indices, spill_data,
                            counter=counter)
        no_overflow = _no_overflow(parts)  # made while the kernel runs
        hist, n_over = _read_counts(both, plan.totals, tile_width)
        if n_over <= capacity:
            break
        # A rerun gets a buffer of exactly the size counted: the same product spills
        # exactly that much again, so nothing is dropped.
        capacity = n_over
        spill_indices, spill_data = _spill_buffers(capacity, x.dtype)
    nnz = _layout.histogram_nnz(hist)
    if n_over == 0:
        return no_overflow, nnz
    offset, row_starts = _overflow_offsets(plan.totals, slots)
    parts = _with_overflow(parts, row_starts, n_over)
    move = _kernels.function("ffn.cu", _expr("twell_spill_to_overflow", x.dtype))
    # One warp per 32 consecutive (row, tile) pairs.
    move(_blocks(-(-m * nt // 32), _WARPS), (_BLOCK,), (
        plan.totals, _i64(m * nt), _i32(slots), plan.spill_start, spill_indices, spill_data,
        offset, parts.overflow_indices, parts.overflow_data))
    return parts, nnz


#: ``matmul_pack_auto`` packs at ``tile_width // _PROVISIONAL_SHARE`` slots before it knows
#: the counts: room for 12.5% non-zeros, past any slot count that ``slots="auto"`` picks for
#: a ReLU product at 90-99.9% sparsity (32 at tile width 256; 90% picks ~32, 99% ~6), with
#: the rest in the spill buffer.
_PROVISIONAL_SHARE = 8


def matmul_pack_auto(x, w, tile_width, spill_capacity=None, variant=None):
    """``relu(x @ w.T)`` packed with ``slots="auto"`` picked from its own per-tile counts.

    Returns ``(parts, slots, nnz)``. One fused launch packs the product at a provisional slot
    count (``tile_width // 8``, lowered to fit ``MAX_STORED_SLOTS``; entries past it spill;
    the empty slots are left unwritten), then the histogram of its totals gives
    :func:`twell._layout.auto_slots`, the overflow size and the entry count, read with the
    spill counter in one synchronisation, and ``twell_reslot`` moves every entry to its slot
    or overflow place. When the provisional spill did not fit its buffer (a dense product:
    more than 1/64 of the outputs past the provisional slots), the histogram is whole all the
    same, and :func:`matmul_pack` runs once more straight at the chosen slots with a spill
    buffer of exactly their overflow: never a third launch. The slots are those that
    ``TwELLMatrix`` picks for the dense product, and the result has the bits of
    :func:`matmul_pack` with them. Besides the result it holds the provisional layout
    (4 bytes per slot) until it returns.
    """
    m, n = x.shape[0], w.shape[0]
    nt = _layout.n_tiles(n, tile_width)
    if m * nt == 0:
        return _empty_parts(m, nt, 1, x.dtype), 1, 0
    provisional = max(1, min(tile_width // _PROVISIONAL_SHARE,
                             _layout.MAX_STORED_SLOTS // (m * nt)))
    plan = matmul_plan(x, w, tile_width, spill_capacity, variant)
    parts = _empty_parts(m, nt, provisional, x.dtype, zeroed=False, overflow=False)
    both, counter = _count_buffer(tile_width)
    _launch_matmul_pack(x, w, plan.variant, tile_width, provisional, plan.totals, parts,
                        plan.spill_start, plan.spill_capacity, plan.spill_indices,
                        plan.spill_data, counter=counter,
                        zero_fill=False)  # twell_reslot reads the counted slots only
    hist, spilled = _read_counts(both, plan.totals, tile_width)
    slots, n_over, nnz = _layout.auto_choice(hist, tile_width)
    check_storage((m, n), tile_width, slots)
    if spilled > plan.spill_capacity:
        variant = plan.variant
        del parts, plan  # freed before the second launch allocates its own
        return matmul_pack(x, w, tile_width, slots, max(n_over, 1), variant)[0], slots, nnz
    result = _empty_parts(m, nt, slots, x.dtype, zeroed=False, overflow=False)
    if n_over:
        offset, row_starts = _overflow_offsets(plan.totals, slots)
        result = _with_overflow(result, row_starts, n_over)
    else:
        offset, result = None, _no_overflow(result)
    kernel = _kernels.function("ffn.cu", _expr("twell_reslot", x.dtype))
    kernel(_blocks(m * nt, _BLOCK), (_BLOCK,), (
        plan.totals, _i64(m * nt), _i64(nt), _i32(tile_width), _i32(provisional), parts.data,
        parts.indices, plan.spill_start, plan.spill_indices, plan.spill_data, _i32(slots),
        result.counts, result.data, result.indices, offset, result.overflow_indices,
        result.overflow_data))
    return result, slots, nnz


#: cudaDataType_t of the 16-bit inputs and the float32 output of :func:`_gemm_nt_float32`
#: (CUDA's library_types.h).
_CUDA_R = {"float16": 2, "bfloat16": 14, "float32": 0}


def _gemm_nt_float32(x, w):
    """``x @ w.T`` as float32 (M, N) from 16-bit ``x`` (M, K) and ``w`` (N, K), both
    C-contiguous and of one dtype: cuBLAS ``GemmEx`` on tensor cores with float32 accumulation
    and a float32 output (``cupy.matmul`` would round the products to the inputs' dtype)."""
    from cupy_backends.cuda.libs import cublas

    m, k = x.shape
    n = w.shape[0]
    out = cupy.empty((m, n), dtype=np.float32)
    if k == 0:
        out.fill(0)
    if k == 0 or out.size == 0:
        return out
    limit = np.iinfo(np.int32).max
    if max(m, n, k) > limit:
        raise ValueError(f"cuBLAS takes dimensions up to {limit}; got x.shape={x.shape}, "
                         f"w.shape={w.shape}")
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(handle)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    dtype = _CUDA_R[x.dtype.name]
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        # Column-major view: out^T (N x M) = w^T (w is K x N column-major) @ x (K x M).
        cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, k,
                      one.ctypes.data, w.data.ptr, dtype, k, x.data.ptr, dtype, k,
                      zero.ctypes.data, out.data.ptr, _CUDA_R["float32"], n,
                      cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
    finally:
        cublas.setPointerMode(handle, mode)
    return out


def gated_up_way(m, h, d, dtype, nnz_hint):
    """How :func:`gated_up` runs by default: ``"dense"`` (cuBLAS's whole ``x @ w_up.T`` in
    float32, then ``twell_gated_take``) where :func:`twell._layout.dense_up_pays` says so for
    the gate's ``nnz_hint`` entries (16-bit values; the float32 product takes at most 1/8 of
    the device's memory), ``"dot"`` (``twell_gated_up``) otherwise. No host sync."""
    dense = (np.dtype(dtype).itemsize == 2 and _layout.dense_up_pays(m, h, d, nnz_hint)
             and m * h * 4 <= _device_bytes() // _DENSE_SHARE)
    return "dense" if dense else "dot"


def gated_up(parts, shape, tile_width, x, w_up, nnz_hint=None, variant=None):
    """Parts with the gate's structure and values ``gate * (x[row] . w_up[col])``.

    ``parts`` is the gate (M, H); ``x`` (M, D) and ``w_up`` (H, D) are C-contiguous and of the
    parts' dtype. Each product accumulates in float32 (float64) and rounds once, in one of two
    ways (:func:`gated_up_way`, by the gate's entry count ``nnz_hint``): ``twell_gated_up``, a
    warp's dot product per entry (x and w_up rows read from L2: its time grows with the
    entries), or, for a dense enough 16-bit gate, cuBLAS's whole ``x @ w_up.T`` in float32
    (an ``M x H`` float32 temporary) and ``twell_gated_take`` at the gate's entries; the
    dot product runs instead if the temporary cannot be allocated. Products that come out
    zero stay stored: the result feeds a product at once and is never handed to the user.
    ``variant`` (private: tests and benchmarks) forces ``"dot"`` or ``"dense"``.
    """
    m, k = shape
    depth = x.shape[1]
    dtype = parts.data.dtype
    chosen = variant is None
    if chosen:
        variant = gated_up_way(m, k, depth, dtype, nnz_hint)
    if variant not in ("dot", "dense"):
        raise ValueError(f"variant must be None, 'dot' or 'dense'; got {variant!r}")
    if variant == "dense" and dtype not in _kernels.HALF_DTYPES:
        raise ValueError(f"the dense up projection takes float16 or bfloat16; got {dtype}")
    out = cupy.empty_like(parts.data)
    overflow_out = cupy.empty_like(parts.overflow_data)
    n_over = parts.overflow_indices.size
    common = (parts.counts, parts.data, parts.indices, parts.overflow_indptr,
              parts.overflow_indices, parts.overflow_data, _i64(m), _i64(k), _i32(tile_width),
              _i32(parts.data.shape[2]), _i64(n_over))
    if variant == "dense":
        try:
            up = _gemm_nt_float32(x, w_up)
        except cupy.cuda.memory.OutOfMemoryError:
            if not chosen:
                raise
            return gated_up(parts, shape, tile_width, x, w_up, variant="dot")
        items = parts.data.size + n_over
        if items:
            kernel = _kernels.function("ffn.cu", _expr("twell_gated_take", dtype))
            # One thread per slot, then one per overflow entry.
            kernel(_blocks(items, _BLOCK), (_BLOCK,), (*common, up, out, overflow_out))
        return parts._replace(data=out, overflow_data=overflow_out)
    items = parts.counts.size + n_over
    if items:
        vec = _vec(dtype, depth % _kernels.vector_width(dtype) == 0, _aligned(x, w_up))
        kernel = _kernels.function("ffn.cu", _expr("twell_gated_up", dtype, vec))
        # One warp per (row, tile) pair, then one per overflow entry.
        kernel(_blocks(items, _WARPS), (_BLOCK,), (
            *common, x, w_up, _i64(depth), out, overflow_out))
    return parts._replace(data=out, overflow_data=overflow_out)
