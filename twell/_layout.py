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

#: Default tile width: the N-tile of the Hopper GEMM that produces TwELL.
DEFAULT_TILE_WIDTH = 256

#: Largest tile width: columns within a tile are stored as uint16.
MAX_TILE_WIDTH = 65536

#: ``slots="auto"`` picks the smallest slot count whose overflow holds at most
#: this fraction of the non-zeros...
AUTO_OVERFLOW_FRACTION = 0.01

#: ... but at most this many times the count that 99% of the non-empty (row, tile) pairs
#: fit in (:func:`auto_slots`): on rows with heavy tails the fraction alone would store
#: mostly padding.
AUTO_MAX_FACTOR = 4

#: Largest number of columns (overflow columns are stored as int32).
MAX_COLUMNS = 2**31 - 1

#: Largest number of rows: the transpose of an (M, K) matrix has M columns.
MAX_ROWS = MAX_COLUMNS

#: Largest number of stored slots, ``M * n_tiles * slots``: the CUDA grid limit
#: (2**31 - 1 blocks) times the 8 (row, tile) pairs a block of the pack and unpack
#: kernels handles. Also bounds ``M * n_tiles`` (slots >= 1). About 1.7e10 slots, 64 GiB of
#: bfloat16 values and uint16 columns; a request below it that does not fit in memory
#: raises the allocator's MemoryError.
MAX_STORED_SLOTS = (2**31 - 1) * 8

#: Reference packed layout: tile width and index width.
PACKED_TILE_WIDTH = 256
PACKED_MAX_COLUMNS = 65536
PACKED_COMPRESSIONS = (2, 4, 8)

# Dtypes of the index arrays.
COUNT_DTYPE = np.dtype(np.int32)
INDEX_DTYPE = np.dtype(np.uint16)
OVERFLOW_INDPTR_DTYPE = np.dtype(np.int64)
OVERFLOW_INDEX_DTYPE = np.dtype(np.int32)


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
    ``tile_width + 1`` bins took ~50 (H200 host, eighteenth session)."""
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
               max_factor=AUTO_MAX_FACTOR):
    """Smallest slot count (>= 1) whose overflow is at most ``fraction`` of the non-zeros,
    but no more than ``max_factor`` times the count that 99% of the non-empty (row, tile)
    pairs fit in.

    The cap matters only where a few pairs hold far more entries than the rest (the hubs
    of a power-law graph): the fraction alone would give every pair the room of those few,
    and the layout, which stores the slots of every pair, would be mostly padding. A
    Pareto(1.5)-degree graph of 200 000 rows (mean degree 16, 3.4 M entries, 28 MB as CSR)
    at ``tile_width=65536`` needs 1980 slots for 1% of overflow, 9.5 GB in float32; the
    cap, 4 x 41 = 164 slots, leaves 7% of the entries in the overflow and 0.79 GB. It leaves
    the choice alone on the activations of a ReLU layer (6-7, 19 and 32 slots at 99%, 95%
    and 90% sparsity, uniform or hot columns, ``tile_width=256``) and on the benchmark's
    10^6-row stencil and Pareto(2) graph (``benchmarks/NOTES.md``).

    Parameters
    ----------
    tile_counts_histogram : array_like of int, 1-D
        ``hist[c]`` = number of (row, tile) pairs with ``c`` non-zeros, non-negative. A
        pair holds at most ``tile_width`` non-zeros: bins past ``tile_width`` (as
        ``numpy.bincount(..., minlength=...)`` may give) must be zero.
        ``numpy.bincount(A.tile_nnz().ravel())`` is the histogram of a matrix ``A``.
    tile_width : int
        The tile width, in [1, 65536]; also the largest answer.
    fraction : float
        Allowed share of non-zeros in the overflow, at least 0.
    max_factor : float or None
        The cap, in multiples of the count that 99% of the non-empty pairs fit in, at
        least 1; None for no cap.

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
        A tile width outside [1, 65536], a histogram that is not 1-D, holds a negative
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
    return _auto_slots(counts, _nnz(counts), int(tile_width), fraction, max_factor)


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


def auto_choice(tile_counts_histogram, tile_width):
    """``(slots, n_over, nnz)`` of ``slots="auto"`` from a histogram of per-tile counts: the
    slot count :func:`auto_slots` picks, the overflow it leaves and the entries counted."""
    counts = _counts(tile_counts_histogram)
    nnz = _nnz(counts)
    slots = _auto_slots(counts, nnz, tile_width, AUTO_OVERFLOW_FRACTION)
    return slots, _overflow(counts, slots), nnz


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


#: The cost model that chooses how ``A @ B`` runs on a GPU, by value itemsize, from the
#: paper's down projection on an H200 (M = 16384, K = 5632, N = 2048; ``benchmarks/NOTES.md``,
#: 2026-12-03): ``GATHER_SECONDS`` per (stored entry x column of B) for the gather kernel
#: (16-bit: 2.6e-13, which puts the model's crossover where the gather kernel with one warp
#: per block and cuBLAS measured theirs, 1.06% at N = 2048 (the slope alone, 2.34e-13,
#: leaves out the kernel's fixed ~0.07 ms); float32: 3.5e-13 at 90-99%; float64: twice
#: float32's bytes, not measured on this shape), ``GEMM_MACS`` multiply-adds per second of
#: cuBLAS (16-bit on tensor cores: 4.5e14; float32 without TF32: 2.5e13; float64: 3.1e13),
#: and ``DENSIFY_BYTES`` per second for ``A.toarray()`` (written, then read by the GEMM).
GATHER_SECONDS = {2: 2.6e-13, 4: 3.5e-13, 8: 7e-13}
GEMM_MACS = {2: 4.5e14, 4: 2.5e13, 8: 3.1e13}
DENSIFY_BYTES = 1.8e12

#: Products with fewer multiply-adds (``M * K * N``) always gather: below this the
#: densified product's extra launches and its ``M x K`` temporary do not pay.
DENSE_PRODUCT_MIN_WORK = 2**32


def dense_product_density(n, itemsize):
    """Density of A above which ``A.toarray() @ B`` (B with ``n`` columns) beats the gather
    kernel in the model: ``nnz * n * gather > M * K * n / gemm + M * K * itemsize / densify``.

    At ``n = 2048``: 1.06% for 16-bit values (0.85% from the GEMM's term), 11.7% for float32.
    The densification's term grows as ``n`` shrinks (above 1 for 16-bit values below about
    ``n = 5``: a matrix-vector product never densifies).
    """
    g = GATHER_SECONDS[itemsize]
    return 1.0 / (GEMM_MACS[itemsize] * g) + itemsize / (n * DENSIFY_BYTES * g)


def dense_product_pays(m, k, n, itemsize, nnz):
    """Whether ``A @ B`` (A of shape ``(m, k)`` with ``nnz`` entries, B with ``n`` columns)
    is faster as ``A.toarray() @ B`` on a GPU, by :func:`dense_product_density`. ``nnz=None``
    (not known without reading the GPU) answers False: the choice never costs a
    synchronisation."""
    if nnz is None or n < 1 or m * k * n < DENSE_PRODUCT_MIN_WORK:
        return False
    return nnz > dense_product_density(n, itemsize) * m * k


#: The gated FFN's up projection on a GPU for 16-bit values (``_cupy_backend.gated_up``):
#: seconds per (gate entry x d_model) of ``twell_gated_up``, a warp's dot product per entry
#: whose x and w_up rows come from L2. Its alternative is cuBLAS's whole product in float32
#: (``GEMM_MACS``, written at ``DENSIFY_BYTES``) read at the entries. On the paper's gate
#: (M = 16384, hidden 5632, d_model 2048; H200, ``benchmarks/NOTES.md``, eighteenth session)
#: the dot products took 0.624 ms at 0.99% non-zero, 0.825 at 1.5%, 1.044 at 2.0%, 2.24 at
#: 5.0% and 4.32 at 10%, the whole product 0.558 to 0.646; but in the whole layer the whole
#: product's extra host work (the cuBLAS calls, with the GPU waiting after the gate's read)
#: made it 0.036 ms slower at 0.99% and 0.21 faster at 1.5%: even at ~1.05%, where this
#: value puts the model's crossover.
GATED_DOT_SECONDS = 3.2e-13


def dense_up_pays(m, h, d, nnz):
    """Whether the gated FFN's up projection (``x`` of shape ``(m, d)``, ``w_up`` ``(h, d)``)
    at a gate of ``nnz`` entries is faster computed whole (``x @ w_up.T`` in float32 by cuBLAS,
    then read at the entries) than as a dot product per entry, in the model above:
    ``nnz * d * GATED_DOT_SECONDS > m * h * d / GEMM_MACS + 4 * m * h / DENSIFY_BYTES``, for
    16-bit values. At the paper's shape the crossover is ~1% of the gate non-zero.
    ``nnz=None`` answers False, as do products below ``DENSE_PRODUCT_MIN_WORK``."""
    if nnz is None or m * h * d < DENSE_PRODUCT_MIN_WORK:
        return False
    dense = m * h * d / GEMM_MACS[2] + 4 * m * h / DENSIFY_BYTES
    return nnz * d * GATED_DOT_SECONDS > dense
