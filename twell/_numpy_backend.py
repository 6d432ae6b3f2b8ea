"""NumPy backend: the executable specification of every TwELL primitive.

Each public function here is one of the backend contract (:mod:`twell._contract`), which
the CuPy backend (:mod:`twell._cuda`) implements with the same names and signatures as
CUDA kernels. The code is vectorised (no Python
loop visits every row or entry: spmm's loops run over the ranks of a row's
entries and over the few rows longer than the ranks it steps through) and uses
NumPy alone, so that scipy.sparse stays an independent oracle in the tests.

Inputs are trusted: the public API validated them. Dense inputs are
C-contiguous 2-D arrays of a supported value dtype; CSR inputs are canonical
(sorted columns, no duplicates, no explicit zeros).
"""

import numpy as np

from . import _algorithms, _layout
from ._algorithms import (  # noqa: F401 - tile_counts_csr: this backend's API
    coo_to_csr,
    expand_indptr,
    is_nonzero,
    pack_sorted_coo,
    tile_counts_csr,
    to_coo,
)
from ._arguments import check_storage
from ._dtypes import accumulator_dtype, bfloat16
from ._invariants import check_csr


def canonical_csr(indptr, indices, data, shape, names=("indptr", "indices")):
    """CSR with rows in any column order -> canonical CSR ``(indptr int64, indices int32,
    data)``: columns sorted, duplicates summed in input order, zeros dropped.

    The one function here that takes a user's arrays as they are: ``indptr`` and
    ``indices`` are checked first (:func:`twell._invariants.check_csr`; ``names`` name them in
    the message), then sorted by the shared global sort.
    """
    check_csr(indptr, indices, shape, names)
    n = int(indptr[-1])
    indices, data = indices[:n], data[:n]
    if _sorted_and_unique(indptr, indices, shape):
        # Already canonical but for explicit zeros: no sum changes, so no value's bits do.
        keep = _algorithms.zeros_mask(data)
        if keep is None:
            # Copies of the caller's indices and values: the matrix never aliases its input.
            return indptr.astype(np.int64, copy=False), indices.astype(np.int32), data.copy()
        indptr, indices, data = _algorithms.kept_rows(indptr, keep, indices, data)
        return indptr, indices.astype(np.int32, copy=False), data
    return _algorithms.canonical_csr(indptr, indices, data, shape)


def _sorted_and_unique(indptr, indices, shape):
    """Whether every row's columns strictly increase (scipy's compiled check)."""
    import scipy.sparse as sp

    # indptr of the indices' integer type: scipy would otherwise copy both to a common one.
    index = indices.dtype if indices.dtype in (np.int32, np.int64) else np.int64
    if index == np.int32 and indices.size > np.iinfo(np.int32).max:
        index = np.int64
    a = sp.csr_array((np.empty(indices.size, dtype=np.int8), indices.astype(index, copy=False),
                      indptr.astype(index, copy=False)), shape=shape, copy=False)
    return bool(a.has_canonical_format)


#: ``numpy.errstate`` of arithmetic on a user's values: NaN and Inf are entries like any
#: other, and a result past a dtype's range is Inf; NumPy's warnings about them would be
#: noise from twell's own lines.
QUIET = {"over": "ignore", "invalid": "ignore", "divide": "ignore", "under": "ignore"}


def cast(values, dtype):
    """``values`` converted to ``dtype`` (a new C-contiguous array), rounded once."""
    dtype = np.dtype(dtype)
    if dtype == bfloat16 and values.dtype == np.float64:
        return _float64_to_bfloat16(values)
    with np.errstate(**QUIET):  # past the dtype's range is Inf, as rounding defines
        return np.ascontiguousarray(values).astype(dtype)


def _float64_to_bfloat16(values):
    """float64 -> bfloat16 rounded once, to nearest, ties to even.

    Some ml_dtypes releases convert float64 through float32, which rounds twice: 1 + 2**-8 +
    2**-30 became 1.0 instead of 1.0078125. Rounding here to bfloat16's 8 significant bits
    (exponent range of float32) first makes the final conversion exact on every release.
    """
    x = np.ascontiguousarray(values, dtype=np.float64)
    with np.errstate(all="ignore"):
        _, exponent = np.frexp(x)  # |x| = m * 2**exponent, 0.5 <= m < 1
        quantum = np.maximum(exponent - 1, -126) - 7  # bfloat16's spacing at |x|
        rounded = np.ldexp(np.rint(np.ldexp(x, -quantum)), quantum)  # exact scalings
        rounded = np.where(np.isfinite(x), rounded, x)
        return rounded.astype(bfloat16)  # exact; past the largest bfloat16: Inf


def tile_counts_dense(dense, tile_width):
    """Non-zeros of every (row, tile) of a dense matrix, int32 (M, n_tiles)."""
    m, k = dense.shape
    nt = _layout.n_tiles(k, tile_width)
    if m == 0 or nt == 0:
        return np.zeros((m, nt), dtype=_layout.COUNT_DTYPE)
    nonzero = is_nonzero(dense).view(np.int8)
    starts = np.arange(0, k, tile_width)
    return np.add.reduceat(nonzero, starts, axis=1, dtype=_layout.COUNT_DTYPE)


def count_histogram(counts, size):
    """Histogram of integer counts: int64 ``hist`` of ``size + 1`` bins.

    ``hist[c]`` (``c < size``) is the number of counts equal to ``c`` and ``hist[size]`` the
    number outside ``[0, size)``.
    """
    flat = counts.reshape(-1)
    inside = (flat >= 0) & (flat < size)
    hist = np.bincount(flat[inside], minlength=size).astype(np.int64)
    return np.append(hist, np.int64(flat.size - int(inside.sum())))


def pack_dense(dense, tile_width, slots, n_over=None):
    """Dense matrix -> ``(parts, nnz)``. NaN and Inf count as non-zeros.

    ``n_over`` (the overflow size, when the caller knows it) is for the GPU twin, which would
    otherwise read it back; here it is not needed.
    """
    rows, cols = np.nonzero(is_nonzero(dense))  # row-major order: sorted by (row, column)
    parts = pack_sorted_coo(rows, cols, dense[rows, cols], dense.shape, tile_width, slots)
    return parts, rows.size


def pack_csr(indptr, indices, data, shape, tile_width, slots, n_over=None):
    """Canonical CSR -> TwELL parts (``n_over``: as for :func:`pack_dense`)."""
    rows = expand_indptr(indptr, indices.size)
    return pack_sorted_coo(rows, indices, data, shape, tile_width, slots)


# Bound on the slots that to_dense addresses at once (an int64 position each).
_UNPACK_CHUNK = 1 << 22


def to_dense(parts, shape, tile_width):
    """TwELL parts -> dense C-contiguous array of the parts' dtype.

    Every used slot goes straight to its place, ``row * K + tile * T + index``, as the GPU's
    ``twell_unpack_dense`` writes it; the overflow entries follow. The entries are never put
    in order (:func:`to_coo`'s layout and scatters take 1.4-3.8x longer on 4096 x 5632
    float32 activations at 1-10%).
    """
    m, k = shape
    out = np.zeros(shape, dtype=parts.data.dtype)
    flat_out = out.reshape(-1)
    _, nt, slots = parts.data.shape
    tile_start = np.arange(nt, dtype=np.int64)[:, None] * tile_width
    step = max(1, _UNPACK_CHUNK // max(nt * slots, 1))
    for lo in range(0, m, step):  # blocks of rows bound the positions' memory
        hi = min(lo + step, m)
        used = _algorithms.slot_mask(parts.counts[lo:hi], slots)
        where = parts.indices[lo:hi].astype(np.int64)
        where += tile_start
        where += np.arange(lo, hi, dtype=np.int64)[:, None, None] * k
        flat_out[where[used]] = parts.data[lo:hi][used]
    n_over = parts.overflow_indices.size
    out[expand_indptr(parts.overflow_indptr, n_over), parts.overflow_indices] = \
        parts.overflow_data
    return out


def to_csr(parts, shape, tile_width):
    """TwELL parts -> canonical CSR ``(indptr int64, indices int32, data)``."""
    return coo_to_csr(*to_coo(parts, shape, tile_width), shape[0])


# Bound on the temporary (rows x right-hand sides) blocks of spmm, in elements.
_SPMM_CHUNK = 1 << 22


@np.errstate(**QUIET)
def spmm(parts, shape, tile_width, b, out_dtype, nnz_hint=None, tile_index=None):
    """``A @ b`` for TwELL ``A`` and a dense 2-D ``b`` of the parts' value dtype.

    Products accumulate in float32 (float64 for float64 data), then round to
    ``out_dtype``: each row's products are added one after the other in column order
    (:func:`_sorted_coo_times_dense`). ``nnz_hint`` is unused here: the host has one way
    (the GPU backend chooses between two with it). With ``tile_index`` (the layout's
    :class:`~twell._algorithms.TileIndex`) only the listed tiles' slots are looked at.
    """
    rows, cols, vals = to_coo(parts, shape, tile_width, tile_index)
    acc = accumulator_dtype(out_dtype)
    out = np.zeros((shape[0], b.shape[1]), dtype=acc)
    if rows.size and b.shape[1]:
        _sorted_coo_times_dense(rows, cols, vals.astype(acc), b.astype(acc, copy=False), out)
    return out.astype(out_dtype, copy=False)


def spmv(parts, shape, tile_width, dtype, tile_index=None):
    """The function ``x -> A @ x``: :func:`spmm` with ``x`` as its one column."""
    return lambda x: spmm(parts, shape, tile_width, x.reshape(-1, 1), dtype,
                          tile_index=tile_index).reshape(-1)


def _sorted_coo_times_dense(rows, cols, vals, b, out):
    """``out[i] = sum over row i's entries e, in order, of vals[e] * b[cols[e]]`` for entries
    sorted by row, ``out`` zeros of ``b``'s dtype.

    Every row's sum runs from zero through its products one at a time: the order, and the
    bits, of ``np.add.at(out, rows, vals[:, None] * b[cols])``, which pays ~8 ns an element
    (4096 x 5632 float32 at 1% times 512 columns: 1.02 s here against 0.18 s; scipy's C loop
    takes 0.027 s). Rows go longest first, so the rows that have a k-th entry are a leading
    block of that order, and step k adds all their k-th products at once (a gather of ``b``
    rows, a product, an add into contiguous rows). Rows longer than the ``depth`` steps
    taken (the hubs of a power-law graph, a few rows with many entries) add their remaining
    entries one row at a time, in one running sum each: ``depth`` minimises the number of
    steps plus the number of such rows, the NumPy calls that set the time when they are
    small. Temporaries are blocks of at most ``_SPMM_CHUNK`` elements.
    """
    m, n = out.shape
    lengths = _algorithms.count_sorted(rows, m)
    indptr = _algorithms.exclusive_cumsum(lengths)
    order = np.argsort(-lengths, kind="stable")  # longest first
    block = max(1, _SPMM_CHUNK // n)
    product = np.empty((min(block, m), n), dtype=out.dtype)
    for lo in range(0, m, block):
        these = order[lo:lo + block]
        length = lengths[these]  # non-increasing
        if length[0] == 0:
            break  # these rows and all later ones are empty: their zeros stay
        start = indptr[these]
        sums = np.zeros((these.size, n), dtype=out.dtype)
        # longer[k]: rows with more than k entries (a k-th one, counting from 0). A depth past
        # the block's row count costs more calls than depth 0 (at most that many rows), so
        # the candidates stop there, however long the longest row.
        depths = np.arange(min(int(length[0]), length.size) + 1)
        longer = np.searchsorted(-length, -depths, side="left")
        depth = int(np.argmin(depths + longer))
        for k in range(depth):
            live = int(longer[k])
            entry = start[:live] + k
            np.take(b, cols[entry], axis=0, out=product[:live])
            product[:live] *= vals[entry, None]
            sums[:live] += product[:live]
        for i in range(int(longer[depth])):  # the few rows longer than depth
            _add_in_order(sums[i], start[i] + depth, start[i] + length[i], cols, vals, b)
        out[these] = sums


def _add_in_order(total, lo, hi, cols, vals, b):
    """``total += vals[e] * b[cols[e]]`` for ``e = lo, ..., hi - 1``, one after the other.

    A running sum (``np.add.accumulate``) whose first term is ``total``: its last row is
    the sum added in order, in chunks of at most ``_SPMM_CHUNK`` elements.
    """
    step = max(1, _SPMM_CHUNK // b.shape[1])
    for e0 in range(lo, hi, step):
        e = slice(e0, min(e0 + step, hi))
        terms = np.take(b, cols[e], axis=0)
        terms *= vals[e, None]
        terms[0] += total
        np.add.accumulate(terms, axis=0, out=terms)
        total[...] = terms[-1]


def exclusive_scan(values):
    """``[0, v0, v0 + v1, ...]`` of the flattened integer ``values`` (int64, one longer)."""
    return _algorithms.exclusive_cumsum(values.reshape(-1))


def matmul_pack_supported(x, w, tile_width):
    """Whether :func:`matmul_pack` takes these operands: both of one value dtype."""
    return x.dtype == w.dtype


def _as(values, dtype):
    """``values`` as ``dtype``: themselves where they are (read only: no copy), else
    :func:`cast`."""
    return values if values.dtype == dtype else cast(values, dtype)


def _relu_product(x, w):
    """``relu(x @ w.T)`` accumulated in float32 (float64 for float64) and rounded once."""
    acc = accumulator_dtype(x.dtype)
    z = _as(x, acc) @ _as(w, acc).T
    np.maximum(z, 0, out=z)  # keeps NaN, as relu does
    return z if z.dtype == x.dtype else cast(z, x.dtype)


def matmul_pack(x, w, tile_width, slots, w_up=None, nnz_hint=None):
    """``relu(x @ w.T)`` packed into TwELL parts: ``(parts, nnz)``. The host has no fused
    kernel: the product is computed whole, then packed (:func:`pack_dense`). With ``w_up``,
    the gated layer's hidden values: then :func:`gated_up` at the entries, by the exact
    count (``nnz_hint`` unused)."""
    z = _relu_product(x, w)
    parts, nnz = pack_dense(z, tile_width, slots)
    return _gated(parts, z.shape, tile_width, x, w_up, nnz), nnz


def matmul_pack_auto(x, w, tile_width, w_up=None, nnz_hint=None):
    """:func:`matmul_pack` with ``slots="auto"`` picked from the product's per-tile counts:
    ``(parts, slots, nnz)``."""
    z = _relu_product(x, w)
    hist = count_histogram(tile_counts_dense(z, tile_width), tile_width + 1)
    slots, n_over, nnz = _layout.auto_choice(_layout.checked_histogram(hist, tile_width),
                                             tile_width)
    check_storage(z.shape, tile_width, slots)
    parts = pack_dense(z, tile_width, slots, n_over)[0]
    return _gated(parts, z.shape, tile_width, x, w_up, nnz), slots, nnz


def gated_ffn_by_sample(x, w_gate, w_up, w_down):
    """``(None, None)``: the host's gated layer takes one way at every density (the gate
    packed, the product computed whole, then the dot products at the gate's entries)."""
    return None, None


def _gated(parts, shape, tile_width, x, w_up, nnz):
    """The gate's ``parts`` as they are, or (with ``w_up``) :func:`gated_up`'s."""
    return parts if w_up is None else gated_up(parts, shape, tile_width, x, w_up, nnz)


# Elements of the (entries x D) rows that gated_up gathers from x and w_up at a time: two
# such blocks stay in a core's L2 (64 entries at D = 2048), where blocks 32x larger ran from
# memory at half the speed (58 ms against 26 for 29 k entries of 512 x 2048 x 5632).
_UP_CHUNK = 1 << 17


@np.errstate(**QUIET)
def gated_up(parts, shape, tile_width, x, w_up, nnz_hint=None):
    """Parts with the gate's structure and values ``gate * (x[row] . w_up[col])``.

    As the CuPy backend's: the dot products accumulate in float32 (float64 for
    float64) and round once; products that come out zero stay stored. ``nnz_hint`` (the
    GPU's choice of way) is not used: the host counts the gate's entries itself and, past
    :data:`HOST_DENSE_UP_DENSITY` of the ``M x hidden`` outputs, takes them from the whole
    product ``x @ w_up.T`` (BLAS, accumulated in the same dtype) instead of a dot product
    each.
    """
    m, nt, slots = parts.data.shape
    used = np.arange(slots) < parts.counts[..., None]
    rows = np.broadcast_to(np.arange(m)[:, None, None], used.shape)[used]
    cols = (np.arange(nt)[None, :, None] * tile_width + parts.indices.astype(np.int64))[used]
    n_over = parts.overflow_indices.size
    over_rows = expand_indptr(parts.overflow_indptr, n_over)
    whole = None
    if rows.size + n_over > HOST_DENSE_UP_DENSITY * shape[0] * shape[1]:
        acc = accumulator_dtype(parts.data.dtype)
        whole = _as(x, acc) @ _as(w_up, acc).T
    data = np.zeros_like(parts.data)
    data[used] = _gated_products(parts.data[used], rows, cols, x, w_up, whole)
    overflow_data = _gated_products(parts.overflow_data, over_rows, parts.overflow_indices, x,
                                    w_up, whole)
    return parts._replace(data=data, overflow_data=overflow_data)


#: Share of a gate's outputs past which the host's gated_up takes its up values from the
#: whole product rather than a dot product per entry: the dot products ran at about 4.4e-10
#: s per multiply-add (29 k entries of depth 2048 in 26 ms), BLAS's product at about 1.7e-11
#: on two cores, a crossover near 4%. On 512 x 2048 x 5632 (float32, 2 cores) the gated
#: layer took 271 ms at 5% with the dot products (torch's dense layer 118).
HOST_DENSE_UP_DENSITY = 0.04


def _gated_products(gate, rows, cols, x, w_up, whole=None):
    """``gate * (x[rows] . w_up[cols])`` in the gate's dtype, the dot products read from
    ``whole`` (``x @ w_up.T`` in the accumulation dtype) where it is given."""
    acc = accumulator_dtype(gate.dtype)
    if whole is not None:
        up = whole[rows, cols]
    else:
        up = np.empty(rows.size, dtype=acc)
        step = max(1, _UP_CHUNK // max(x.shape[1], 1))
        for lo in range(0, rows.size, step):  # chunks bound memory; not a loop over entries
            hi = lo + step
            up[lo:hi] = np.einsum("ij,ij->i", _as(x[rows[lo:hi]], acc),
                                  _as(w_up[cols[lo:hi]], acc))
    up *= _as(gate, acc)
    return up if up.dtype == gate.dtype else cast(up, gate.dtype)
