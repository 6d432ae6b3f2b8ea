"""The host's compressed-row form of a TwELL matrix, and the scipy kernels that use it.

On the CPU, scipy.sparse's compiled CSR kernels are faster than any composition of NumPy
calls over the tile layout. A NumPy-backed :class:`~twell.TwELLMatrix` therefore keeps its
entries also as canonical CSR (:class:`HostCSR`: sorted columns, no duplicates, no explicit
zeros, int32 indices where they fit) and runs its products, transposes and conversions on
it; the storage arrays (``counts``, ``data``, ...) are built from it when first asked for.
Both forms hold the same entries. So that they never disagree, the storage arrays of a
matrix that keeps this form are read-only (:func:`freeze`).

16-bit values, which scipy does not hold, are kept here as float32 (exactly): products
accumulate in float32 and round once to the result's dtype, as the NumPy backend's do.
"""

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from numpy.lib.stride_tricks import sliding_window_view

from . import _layout

#: Value dtypes scipy.sparse holds as they are; others are kept as float32.
_SCIPY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class HostCSR(NamedTuple):
    """Canonical CSR of a host matrix: ``indptr`` and ``indices`` of one integer dtype
    (int32 where the entries fit, else int64, as scipy chooses), ``data`` of the matrix's
    dtype, or float32 for 16-bit values."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray

    @property
    def nbytes(self):
        return int(self.indptr.nbytes + self.indices.nbytes + self.data.nbytes)

    def scipy(self, shape):
        """A ``csr_array`` on these arrays (no copy, no checks)."""
        a = sp.csr_array((self.data, self.indices, self.indptr), shape=shape, copy=False)
        a.has_canonical_format = True
        return a

    def read_only(self):
        """The same arrays as read-only views: an operand that nothing can write through."""
        views = [a.view() for a in self]
        for v in views:
            v.flags.writeable = False
        return HostCSR(*views)


def compute_dtype(dtype):
    """The dtype :class:`HostCSR` keeps values of ``dtype`` in."""
    return np.dtype(dtype) if np.dtype(dtype) in _SCIPY_DTYPES else np.dtype(np.float32)


def host_csr(indptr, indices, data):
    """A :class:`HostCSR` of canonical CSR arrays (copies where a dtype changes)."""
    nnz = indices.size
    index = np.int32 if nnz <= np.iinfo(np.int32).max else np.int64
    return HostCSR(np.asarray(indptr).astype(index, copy=False),
                   np.asarray(indices).astype(index, copy=False),
                   np.asarray(data).astype(compute_dtype(data.dtype), copy=False))


def values(csr, dtype):
    """The entries' values in the matrix's ``dtype`` (exact: float32 holds every 16-bit
    value)."""
    return csr.data if csr.data.dtype == dtype else csr.data.astype(dtype)


def freeze(parts):
    """Make the storage arrays read-only (see the module notes); returns ``parts``."""
    for a in parts:
        a.flags.writeable = False
    return parts


def matmul(csr, shape, b, out_dtype):
    """``A @ b`` for a 2-D ``b`` (or 1-D): scipy's kernel in the accumulation dtype of
    ``out_dtype`` (float32 for 16-bit values), rounded once to ``out_dtype``."""
    acc = compute_dtype(out_dtype)
    data = csr.data if csr.data.dtype == acc else csr.data.astype(acc)
    a = sp.csr_array((data, csr.indices, csr.indptr), shape=shape, copy=False)
    a.has_canonical_format = True
    rhs = c_contiguous(b)  # scipy's kernel reads rows of b: it would copy one anyway
    rhs = rhs if rhs.dtype == acc else rhs.astype(acc)
    out = a @ rhs
    return out if out.dtype == out_dtype else out.astype(out_dtype)


#: Tiles of c_contiguous's copy of a transposed array: 64 x 64 values stay in L1.
_TRANSPOSE_TILE = 64


def c_contiguous(b):
    """``b`` itself where it is C-contiguous, else a C-contiguous copy. A transposed 2-D
    array (F-contiguous: a weight's ``.T``) is copied tile by tile, where NumPy's copy walks
    one side with a stride: 23 ms against 91 for a 2048 x 5632 float32 weight."""
    if b.flags.c_contiguous:
        return b
    if b.ndim != 2 or not b.flags.f_contiguous or b.size < _TRANSPOSE_TILE ** 2:
        return np.ascontiguousarray(b)
    out = np.empty(b.shape, dtype=b.dtype)
    step = _TRANSPOSE_TILE
    for i in range(0, b.shape[0], step):
        for j in range(0, b.shape[1], step):
            out[i:i + step, j:j + step] = b[i:i + step, j:j + step]
    return out


def transpose(csr, shape):
    """The canonical CSR of the transpose (scipy's ``tocsr`` of the CSC view)."""
    t = csr.scipy(shape).T.tocsr()
    t.has_canonical_format = True
    return host_csr(t.indptr, t.indices, t.data)


def segment_sums(indptr, values):
    """:func:`twell._algorithms.segment_sums` on the host, the same additions in the same
    order. A segment of one value is that value. Longer segments whose lengths round up to
    one power of two, ``P`` (at least 4), are the rows of a ``(segments, P)`` block: each
    row a window of ``P`` values from the segment's start, the places past its end set to
    -0.0 (``x + -0.0`` is ``x`` for every float, so the padding adds nothing, not even to a
    zero's sign); then ``log2(P)`` halvings, column ``2 j`` plus column ``2 j + 1``. O(n)
    work where the whole-array steps take O(n log(longest)); blocks at most twice their
    entries, or four values a segment."""
    starts = indptr[:-1]
    lengths = indptr[1:] - starts
    out = np.zeros(starts.size, dtype=np.float64)
    one = np.flatnonzero(lengths == 1)
    out[one] = values[starts[one]]
    used = np.flatnonzero(lengths > 1)
    if used.size == 0:
        return out
    longer = lengths[used]
    # ceil(log2(length)): the exponent frexp gives length - 1 (exact below 2**53).
    power = np.frexp((longer - 1).astype(np.float64))[1]
    np.maximum(power, _MIN_POWER, out=power)
    top = 1 << int(power.max())
    # Windows read past the last segment's end: -0.0 there, as past any other.
    padded = np.empty(values.size + top, dtype=np.float64)
    padded[:values.size] = values
    padded[values.size:] = -0.0
    for p in np.unique(power):
        chosen = power == p
        rows = used[chosen]
        width = 1 << int(p)
        block = sliding_window_view(padded, width)[starts[rows]]
        # A segment of this power holds more than width / 2 values, unless the width is the
        # smallest (then at least 2).
        keep = width // 2 if p > _MIN_POWER else 2
        np.copyto(block[:, keep:], -0.0, where=np.arange(keep, width) >= longer[chosen, None])
        while block.shape[1] > 1:
            block = block[:, 0::2] + block[:, 1::2]
        out[rows] = block[:, 0]
    return out


#: :func:`segment_sums` sums segments of 2-4 values in one block of 4 (2**2) values a row:
#: fewer blocks where most rows are short.
_MIN_POWER = 2


def stable_argsort(key, bound):
    """``numpy.argsort(key, kind="stable")`` for non-negative integer keys below ``bound``:
    a least-significant-digit radix sort, one stable pass of NumPy's 16-bit radix sort per
    16 bits of ``bound``. NumPy sorts int64 keys by timsort, 2.4x slower on a million
    random (row, column) keys of a 20000 x 20000 matrix."""
    order = None
    shift = 0
    while True:
        digit = ((key if order is None else key[order]) >> shift).astype(np.uint16)
        sub = np.argsort(digit, kind="stable")
        order = sub if order is None else order[sub]
        shift += 16
        if bound <= 1 << shift:
            return order


def by_column(cols, values, n_cols, indptr=None):
    """``(indptr, ordered)``: ``values`` ordered by their columns ``cols`` (any order), each
    column's in the order they come, and where each column starts. scipy's CSR -> CSC
    conversion is a stable counting sort, O(n) where a stable argsort of the columns is
    O(n log n): each entry a row of its own, or, with the row pointer ``indptr`` of entries
    in CSR order, the matrix itself (fewer rows to walk: 1.3-1.7x faster)."""
    if indptr is None:
        indptr = np.arange(cols.size + 1)
    t = sp.csr_array((values, cols, indptr), shape=(indptr.size - 1, n_cols)).tocsc()
    return t.indptr.astype(np.int64, copy=False), t.data


def to_dense(csr, shape, dtype):
    """Dense array of ``dtype`` (scipy's kernel; 16-bit values converted exactly after)."""
    out = csr.scipy(shape).toarray()
    return out if out.dtype == dtype else out.astype(dtype)


def _pair_counts(csr, shape, tile_width):
    """``(counts, indptr)``: the entry count of every non-empty (row, tile) pair, in row
    order, and the row pointer over them. A row's entries in one tile are consecutive (its
    columns are sorted), so the counts are the lengths of the runs of equal tile numbers,
    which scipy's duplicate-summing kernel finds in one pass without sorting."""
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    if nt == 1:
        return np.diff(csr.indptr), np.arange(m + 1)
    tiles = csr.indices // tile_width if tile_width & (tile_width - 1) else (
        csr.indices >> (tile_width.bit_length() - 1))
    # sum_duplicates rewrites the arrays in place: the row pointer is a copy.
    runs = sp.csr_array((np.ones(tiles.size, dtype=np.int32), tiles, csr.indptr.copy()),
                        shape=(m, nt), copy=False)
    runs.has_sorted_indices = True
    runs.sum_duplicates()
    return runs.data, runs.indptr


#: Layouts of at most this many tiles a row count their pairs by runs (tile_counts_histogram).
_FEW_TILES = 4


def tile_counts_histogram(csr, shape, tile_width):
    """``hist[c]``: the (row, tile) pairs holding ``c`` entries, int64, up to the largest
    count (at most ``tile_width + 1`` bins; the empty ones past it are left out, as the
    choice of slots drops them: 131073 bins of a stencil's one-tile layout cost more than
    its counts).

    With one tile a row, the row lengths. With many tiles a row, and no more pairs than
    entries, every pair's count at once (a histogram of ``row * n_tiles + tile``: the ReLU
    activations' 22 tiles, their entries spread over them); else the runs
    (:func:`_pair_counts`), fewer than the entries where a row's entries cluster in a few
    wide tiles, whose memory grows with the entries alone.
    """
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    if nt == 1:
        counts = np.diff(csr.indptr)
    elif _FEW_TILES < nt and m * nt <= csr.indices.size:
        # int32 keys, computed in place: every temporary the size of the entries is a fresh
        # allocation, whose first touch costs more than the arithmetic.
        index = np.int32 if m * nt <= np.iinfo(np.int32).max else np.int64
        keys = np.repeat(np.arange(m, dtype=index), np.diff(csr.indptr))
        keys *= index(nt)
        if tile_width & (tile_width - 1):
            keys += csr.indices // tile_width
        else:
            keys += csr.indices >> (tile_width.bit_length() - 1)
        counts = np.bincount(keys, minlength=m * nt)
    else:
        counts, _ = _pair_counts(csr, shape, tile_width)
    hist = np.bincount(counts, minlength=1).astype(np.int64, copy=False)
    hist[0] += m * nt - counts.size
    return hist


def overflow_rows(csr, shape, tile_width, slots):
    """Rows with a (row, tile) pair of more than ``slots`` entries."""
    counts, indptr = _pair_counts(csr, shape, tile_width)
    over = np.flatnonzero(counts > slots)
    return int(np.unique(np.searchsorted(indptr, over, side="right")).size)
