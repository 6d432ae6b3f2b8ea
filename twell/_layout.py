"""Tile and slot arithmetic shared by every part of twell.

This module is the single Python statement of the TwELL layout; the CUDA
header ``cuda_src/twell_layout.cuh`` mirrors it and a test checks that the
two agree.

A TwELL matrix of shape ``(M, K)`` with tile width ``T`` and ``S`` slots
stores, for every row ``m`` and tile ``t`` (``n_tiles = ceil(K / T)``):

* ``counts[m, t]``: how many non-zeros of columns ``[t*T, min((t+1)*T, K))``
  sit in the slots (at most ``S``);
* ``data[m, t, :counts[m, t]]`` and ``indices[m, t, :counts[m, t]]``: their
  values and their columns *within the tile*, sorted by column; the slots
  after the count hold zeros;
* the non-zeros beyond the first ``S`` of a tile (the overflow) in a CSR
  remainder ``overflow_indptr``, ``overflow_indices`` (global columns),
  ``overflow_data``.
"""

import math
import numbers

import numpy as np

#: The N-tile of the Hopper GEMM that produces TwELL: the tile width of the fused GEMM's
#: output (``matmul_to_twell``) and of the reference's packed layout, and the one that
#: ``tile_width="auto"`` takes wherever a row's entries average one or more per tile of it.
GEMM_TILE_WIDTH = 256

#: Widest tile whose columns within it are stored as uint16 (2 bytes a slot); wider tiles
#: store them as int32 (:func:`index_dtype`).
NARROW_TILE_WIDTH = 65536

#: Largest tile width: one tile spans any row (columns are int32).
MAX_TILE_WIDTH = 2**31 - 1

#: ``slots="auto"`` picks the smallest slot count whose overflow holds at most
#: this fraction of the non-zeros...
AUTO_OVERFLOW_FRACTION = 0.01

#: ... but at most this many times the count that 99% of the non-empty (row, tile) pairs
#: fit in (:func:`auto_slots`): on rows with heavy tails the fraction alone would store
#: mostly padding.
AUTO_MAX_FACTOR = 4

#: ``slots="auto"`` on a layout of one tile as wide as the row (``tile_width`` above
#: :data:`GEMM_TILE_WIDTH` and at least ``K``: a stencil, a graph) takes at most the largest
#: slot count whose padding (the empty slots of rows shorter than it) is at most this fraction
#: of the non-zeros. Such a row's slots are read as a CSR row is, and the entries past them
#: as one more run of the row: padding is bytes the SpMV reads for nothing, and an
#: overflowing entry costs what a slot costs. On a Pareto(2) graph of 10^6 rows (rows of 8
#: or more entries, 16.5 on average) the rule takes 11 slots where the 1% rule takes 30, and
#: the SpMV runs 10% faster in float32 (docs/design.rst); the stencil keeps its 5.
ONE_TILE_PADDING = 1 / 16

#: ... and at most the slot count whose values take this many bytes (16 float32 slots, 8
#: float64): the SpMV's team reads a row's slots in one round of loads and the rest of the row
#: from the overflow, where more slots would give the long rows more rounds over their slots
#: and every row more padding. On an H100 the Laplacian of that graph (rows of 12 or more
#: entries, 30 at the median, where the padding rule takes 29) runs its SpMV 5% faster in
#: float32 at 16 slots and 7% faster in float64 at 8; the graph keeps its 11 slots in float32
#: and takes 8 in float64 (1.4% faster); the stencil keeps its 5 (docs/design.rst).
ONE_TILE_SLOT_BYTES = 64

#: Largest number of columns (overflow columns are stored as int32).
MAX_COLUMNS = 2**31 - 1

#: Largest number of rows: the transpose of an (M, K) matrix has M columns.
MAX_ROWS = MAX_COLUMNS

#: Largest number of stored slots, ``M * n_tiles * slots``: the CUDA grid limit
#: (2**31 - 1 blocks) times the 8 (row, tile) pairs a block of the pack and unpack
#: kernels handles. Also bounds ``M * n_tiles`` (slots >= 1). About 1.7e10 slots, 64 GiB of
#: bfloat16 values and uint16 columns (96 GiB with int32 columns); a request below it that
#: does not fit in memory raises the allocator's MemoryError.
MAX_STORED_SLOTS = (2**31 - 1) * 8

#: ``tile_width="auto"`` and ``slots="auto"`` keep the storage arrays within this many times
#: the bytes of the same matrix in CSR (int32 indices) where the layout allows it
#: (:func:`auto_choice`); a host matrix also keeps its compressed-row form beside them.
STORAGE_BUDGET = 2

#: Reference packed layout: tile width and index width.
PACKED_TILE_WIDTH = GEMM_TILE_WIDTH
PACKED_MAX_COLUMNS = 65536
PACKED_COMPRESSIONS = (2, 4, 8)

# Dtypes of the index arrays.
COUNT_DTYPE = np.dtype(np.int32)
INDEX_DTYPE = np.dtype(np.uint16)  # columns within tiles of at most NARROW_TILE_WIDTH
WIDE_INDEX_DTYPE = np.dtype(np.int32)  # columns within wider tiles
OVERFLOW_INDPTR_DTYPE = np.dtype(np.int64)
OVERFLOW_INDEX_DTYPE = np.dtype(np.int32)


def index_dtype(tile_width):
    """Dtype of ``indices`` (columns within a tile): uint16 up to :data:`NARROW_TILE_WIDTH`
    columns a tile, int32 beyond."""
    return INDEX_DTYPE if tile_width <= NARROW_TILE_WIDTH else WIDE_INDEX_DTYPE


def n_tiles(n_cols, tile_width):
    """Number of column tiles: ``ceil(n_cols / tile_width)``."""
    return -(-n_cols // tile_width)


def tile_of(col, tile_width):
    """Tile holding global column ``col`` (array or int)."""
    return col // tile_width


def tile_start(tile, tile_width):
    """First global column of ``tile``."""
    return tile * tile_width


def tile_extent(tile, n_cols, tile_width):
    """Number of columns of ``tile``: ``tile_width`` except for a partial last tile."""
    return min(tile_width, n_cols - tile * tile_width)


def packed_capacity(compression):
    """Entries one 256-column tile holds in the reference packed layout (word 0 is the count)."""
    return PACKED_TILE_WIDTH // compression - 1


def packed_words_per_tile(compression):
    """uint32 words per (row, tile) in the reference packed layout."""
    return PACKED_TILE_WIDTH // compression


def _counts(tile_counts_histogram):
    """The histogram as a list of Python ints without its trailing zero bins. The choice of
    slots runs on the host after the GPU's read-back while the GPU waits: plain integers over
    the few occupied bins take a few microseconds where a dozen NumPy calls on all
    ``tile_width + 1`` bins take tens."""
    hist = np.asarray(tile_counts_histogram, dtype=np.int64).reshape(-1)
    occupied = np.flatnonzero(hist)
    return hist[: occupied[-1] + 1].tolist() if occupied.size else []


def _nnz(counts):
    return sum(c * n for c, n in enumerate(counts))


def _overflow(counts, slots):
    return sum((c - slots) * n for c, n in enumerate(counts[slots + 1:], slots + 1))


def _typical(counts):
    """The count that 99% of the non-empty pairs fit in: the smallest ``c`` with at least
    99% of them holding at most ``c`` entries (0 when every pair is empty)."""
    nonempty = sum(counts[1:])
    run = 0
    for c, n in enumerate(counts[1:], 1):
        run += n
        if 100 * run >= 99 * nonempty:
            return c
    return 0


def _one_tile_slots(counts, nnz, slots):
    """The largest count in ``[1, slots]`` whose padding is at most :data:`ONE_TILE_PADDING`
    of ``nnz`` (1 where none is)."""
    # padding(s + 1) = padding(s) + (pairs holding at most s entries): walk s up from 1.
    below, pad, s = counts[0] if counts else 0, counts[0] if counts else 0, 1
    while s < slots:
        below += counts[s] if s < len(counts) else 0
        if ONE_TILE_PADDING * nnz < pad + below:
            break
        pad += below
        s += 1
    return s


def one_tile(shape, tile_width):
    """Whether an ``(M, K)`` layout of ``tile_width`` is one tile as wide as the row, wider
    than :data:`GEMM_TILE_WIDTH`: the layouts of :data:`ONE_TILE_PADDING`'s rule."""
    return tile_width > GEMM_TILE_WIDTH and n_tiles(shape[1], tile_width) == 1


def _shaped_slots(counts, nnz, slots, shape, tile_width, itemsize):
    """``slots`` lowered by the rules that need the matrix's shape: the one-tile padding rule
    and (with ``itemsize``) the one-tile byte cap, then (with ``itemsize``) the storage
    budget."""
    if shape is None:
        return slots
    if one_tile(shape, tile_width):
        slots = _one_tile_slots(counts, nnz, slots)
        if itemsize is not None:
            slots = min(slots, max(1, ONE_TILE_SLOT_BYTES // itemsize))
    if itemsize is not None:
        slots = _within_budget(counts, nnz, slots, shape, tile_width, itemsize)
    return slots


def _auto_slots(counts, nnz, tile_width, fraction, max_factor=AUTO_MAX_FACTOR):
    # Overflow with s slots: sum over c > s of hist[c] * (c - s) = tail_nnz - s * tail_pairs,
    # non-increasing in s; walk s up from 0, dropping bin s + 1 from the tails at each step.
    cap = len(counts) if max_factor is None else math.floor(max_factor * _typical(counts))
    tail_pairs, tail_nnz, s = sum(counts[1:]), nnz, 0
    while tail_nnz - s * tail_pairs > fraction * nnz and s + 1 < len(counts) and s < cap:
        s += 1
        tail_pairs -= counts[s]
        tail_nnz -= s * counts[s]
    return min(max(s, 1), tile_width)


def slot_overflow(tile_counts_histogram, slots):
    """Overflow entries for a slot count, from a histogram of per-tile counts.

    ``tile_counts_histogram[c]`` is the number of (row, tile) pairs holding
    ``c`` non-zeros; the overflow is ``sum_c hist[c] * max(c - slots, 0)``.
    """
    return _overflow(_counts(tile_counts_histogram), slots)


def auto_slots(tile_counts_histogram, tile_width, fraction=AUTO_OVERFLOW_FRACTION,
               max_factor=AUTO_MAX_FACTOR, *, shape=None, itemsize=None):
    """Smallest slot count (>= 1) whose overflow is at most ``fraction`` of the non-zeros,
    but no more than ``max_factor`` times the count that 99% of the non-empty (row, tile)
    pairs fit in; with ``shape``, on a layout of one tile as wide as the row (``tile_width``
    above 256 and at least ``K``), lowered to the largest count whose padding is at most
    :data:`ONE_TILE_PADDING` of the non-zeros; with ``shape`` and ``itemsize`` too, on such a
    layout to at most :data:`ONE_TILE_SLOT_BYTES` of values a row, then lowered while the
    storage arrays would take more than :data:`STORAGE_BUDGET` times the matrix's bytes in
    CSR (the choice of ``slots="auto"``, :func:`auto_choice`).

    The cap matters only where a few pairs hold far more entries than the rest (the hubs
    of a power-law graph): the fraction alone would give every pair the room of those few,
    and the layout, which stores the slots of every pair, would be mostly padding. A
    Pareto(1.5)-degree graph of 200 000 rows (mean degree 16, 3.4 M entries, 28 MB as CSR)
    at ``tile_width=65536`` needs 1980 slots for 1% of overflow, 9.5 GB in float32; the
    cap, 4 x 41 = 164 slots, leaves 7% of the entries in the overflow and 0.79 GB. It leaves
    the choice alone on the activations of a ReLU layer (6-7, 19 and 32 slots at 99%, 95%
    and 90% sparsity, uniform or hot columns, ``tile_width=256``) and on the benchmark's
    10^6-row stencil and Pareto(2) graph.

    Parameters
    ----------
    tile_counts_histogram : array_like of int, 1-D
        ``hist[c]`` = number of (row, tile) pairs with ``c`` non-zeros, non-negative. A
        pair holds at most ``tile_width`` non-zeros: bins past ``tile_width`` (as
        ``numpy.bincount(..., minlength=...)`` may give) must be zero.
        ``numpy.bincount(A.tile_nnz().ravel())`` is the histogram of a matrix ``A``.
    tile_width : int
        The tile width, in [1, 2**31 - 1]; also the largest answer.
    fraction : float
        Allowed share of non-zeros in the overflow, at least 0.
    max_factor : float or None
        The cap, in multiples of the count that 99% of the non-empty pairs fit in, at
        least 1; None for no cap.
    shape : tuple of int, optional
        ``(M, K)`` of the matrix, for the one-tile rule and the storage budget (with
        ``itemsize``).
    itemsize : int, optional
        Bytes of a value, for the storage budget (with ``shape``).

    Returns
    -------
    int
        The slot count, in [1, tile_width].

    Raises
    ------
    TypeError
        A tile width that is not an int, a histogram that does not hold integers, a
        fraction or factor that is not a real number.
    ValueError
        A tile width outside [1, 2**31 - 1], a histogram that is not 1-D, holds a negative
        count, a count of 2**63 or more, or pairs of more than ``tile_width`` non-zeros,
        a negative fraction, a factor below 1.

    Examples
    --------
    >>> import numpy as np, twell
    >>> twell.auto_slots(np.array([0, 990, 0, 0, 10]), 256)  # 10 of 1030 entries overflow
    3
    """
    if isinstance(tile_width, (bool, np.bool_)) or not isinstance(tile_width, numbers.Integral):
        raise TypeError(f"tile_width must be an int; got tile_width={tile_width!r}")
    if not 1 <= tile_width <= MAX_TILE_WIDTH:
        raise ValueError(f"tile_width must be between 1 and {MAX_TILE_WIDTH}; got "
                         f"tile_width={tile_width}")
    for name, value in (("fraction", fraction), ("max_factor", max_factor)):
        if value is None and name == "max_factor":
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number; got {name}={value!r}")
    if not fraction >= 0:
        raise ValueError(f"fraction must be at least 0; got fraction={fraction!r}")
    if max_factor is not None and not max_factor >= 1:
        raise ValueError(f"max_factor must be None or at least 1; got max_factor={max_factor!r}")
    hist = _checked_counts(tile_counts_histogram, int(tile_width))
    counts = _counts(hist)
    nnz = _nnz(counts)
    slots = _auto_slots(counts, nnz, int(tile_width), fraction, max_factor)
    return _shaped_slots(counts, nnz, slots, shape, int(tile_width), itemsize)


def _checked_counts(hist, tile_width, name="tile_counts_histogram"):
    """A user's histogram of per-tile counts as a 1-D int64 array, or the error naming what
    is wrong with it."""
    hist = np.asarray(hist)
    if hist.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {hist.shape}")
    if hist.size == 0:
        return hist.astype(np.int64)
    if hist.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers; got dtype {hist.dtype}")
    if hist.dtype.kind == "u" and hist.max() > np.iinfo(np.int64).max:
        at = int(np.argmax(hist > np.iinfo(np.int64).max))
        raise ValueError(f"{name} must hold counts below 2**63; got {name}[{at}]={hist[at]}")
    if hist.dtype.kind == "i" and hist.min() < 0:
        at = int(np.argmax(hist < 0))
        raise ValueError(f"{name} must hold non-negative counts; got {name}[{at}]={hist[at]}")
    occupied = np.flatnonzero(hist)
    if occupied.size and occupied[-1] > tile_width:
        at = int(occupied[-1])
        raise ValueError(f"{name}[c] must be 0 for c > tile_width={tile_width} (a (row, tile) "
                         f"pair holds at most {tile_width} non-zeros); got {name}[{at}]="
                         f"{hist[at]}")
    return hist.astype(np.int64)


def auto_tile_width(shape, nnz, slots="auto"):
    """The tile width of ``tile_width="auto"`` for an ``(M, K)`` matrix of ``nnz`` entries.

    :data:`GEMM_TILE_WIDTH` (256) where a row's entries average one or more per 256 columns
    (the activations of a ReLU layer, the reference's packed layout) or where ``K`` is at
    most 256; otherwise one tile as wide as the row (the power of two at or above ``K``; at
    most :data:`MAX_TILE_WIDTH`). A row of few entries spread over many columns (a stencil, a
    graph) then stores one count and one set of slots instead of a count and slots for every
    narrow tile, most of them empty: the layout's bytes grow with the number of tiles. Past
    :data:`NARROW_TILE_WIDTH` columns its columns take 4 bytes instead of 2, which costs less
    than a second tile's count and slots. With ``slots`` given, the tile is at least that
    wide.
    """
    m, k = shape
    width = GEMM_TILE_WIDTH
    if m and k > width and nnz * width < m * k:
        width = _power_of_two_at_least(k)
    if slots != "auto":
        width = max(width, _power_of_two_at_least(slots))
    return width


def _power_of_two_at_least(n):
    """The power of two at or above ``n``, at most :data:`MAX_TILE_WIDTH` (which is at
    least ``n``)."""
    return min(MAX_TILE_WIDTH, 1 << (n - 1).bit_length())


def csr_bytes(shape, nnz, itemsize):
    """Bytes of an ``(M, K)`` matrix of ``nnz`` entries in CSR with int32 indices (scipy's
    ``csr_array`` where ``nnz`` fits int32)."""
    return nnz * (itemsize + 4) + 4 * (shape[0] + 1)


def storage_bytes(shape, tile_width, slots, n_over, itemsize):
    """Bytes of the six storage arrays: ``M * n_tiles * (4 + slots * (itemsize + i)) +
    8 * (M + 1) + n_over * (4 + itemsize)``, ``i`` the bytes of a column within a tile (2, or
    4 for tiles wider than :data:`NARROW_TILE_WIDTH`)."""
    m, k = shape
    index_size = index_dtype(tile_width).itemsize
    return (m * n_tiles(k, tile_width) * (COUNT_DTYPE.itemsize
                                          + slots * (itemsize + index_size))
            + OVERFLOW_INDPTR_DTYPE.itemsize * (m + 1)
            + n_over * (OVERFLOW_INDEX_DTYPE.itemsize + itemsize))


def auto_choice(tile_counts_histogram, tile_width, shape=None, itemsize=None):
    """``(slots, n_over, nnz)`` of ``slots="auto"`` from a histogram of per-tile counts: the
    slot count, the overflow it leaves and the entries counted.

    The slot count is :func:`auto_slots`'s, lowered on a one-tile layout to the largest
    count whose padding is at most :data:`ONE_TILE_PADDING` of the non-zeros and to at most
    :data:`ONE_TILE_SLOT_BYTES` of values a row, then while the
    storage arrays would take more than :data:`STORAGE_BUDGET` times the bytes of the same
    matrix in CSR (given ``shape`` and ``itemsize``): fewer slots move entries to the
    overflow, which costs 4 bytes of column and the value each, where a slot costs its bytes
    in every (row, tile) pair. Where no slot count meets the budget (a count per tile costs
    4 bytes a row for every tile, so rows of few entries over many tiles cannot), the one of
    fewest bytes is taken.
    """
    counts = _counts(tile_counts_histogram)
    nnz = _nnz(counts)
    slots = _auto_slots(counts, nnz, tile_width, AUTO_OVERFLOW_FRACTION)
    slots = _shaped_slots(counts, nnz, slots, shape, tile_width, itemsize)
    return slots, _overflow(counts, slots), nnz


def _within_budget(counts, nnz, slots, shape, tile_width, itemsize):
    """The largest slot count up to ``slots`` whose storage meets the budget, else the one of
    fewest bytes (the storage's bytes, from each count's overflow)."""
    budget = STORAGE_BUDGET * csr_bytes(shape, nnz, itemsize)
    # Overflow with s slots, for s = 1 .. slots: tail_nnz - s * tail_pairs (as _auto_slots).
    tail_pairs, tail_nnz = sum(counts[2:]), nnz - counts[1] if len(counts) > 1 else 0
    best, best_bytes, fitting = 1, None, None
    for s in range(1, slots + 1):
        if s > 1 and s < len(counts):
            tail_pairs -= counts[s]
            tail_nnz -= s * counts[s]
        over = max(tail_nnz - s * tail_pairs, 0) if s < len(counts) else 0
        size = storage_bytes(shape, tile_width, s, over, itemsize)
        if best_bytes is None or size < best_bytes:
            best, best_bytes = s, size
        if size <= budget:
            fitting = s
    return fitting if fitting is not None else best


def checked_histogram(hist, tile_width):
    """A host copy of ``count_histogram(counts, tile_width + 1)`` without its last bin, the
    counts outside ``[0, tile_width]``, which must be empty: a per-tile count never exceeds
    its tile's width, and a broken invariant is an error rather than a silently clipped
    histogram."""
    if hist[-1]:
        raise RuntimeError(f"internal error: {int(hist[-1])} per-tile counts outside "
                           f"[0, {tile_width}]")
    return hist[:-1]


def histogram_nnz(tile_counts_histogram):
    """Non-zeros counted by a histogram of per-tile counts: ``sum_c hist[c] * c``."""
    return _nnz(_counts(tile_counts_histogram))
