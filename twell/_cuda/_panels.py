"""Launcher of ``cuda_src/spmv_panels_sm90.cu``: ``A @ x`` through a panel plan, on Hopper.

A one-tile SpMV reads, for every entry, the 32-byte sector of ``x`` that holds its column
from L2. Where the columns of a row lie all over (a power-law graph, its Laplacian) that is
one sector an entry, 70% of the product's L2 traffic, and cuSPARSE's CSR product is bound by
it as well. The panel plan reads ``x`` in panels of 64 KB instead, once per cluster of 8 CTAs
(a bulk copy multicast into their shared memory), and each entry's ``x`` value from shared
memory. Its entries are a copy of the matrix's, reordered: CTA ``c`` owns a range of rows
(at most :data:`ROWS` of them, about the same entries as the others) and its entries in
panel ``p`` form one run, sorted by row and column, padded to whole 16-byte copies.

The plan is built once, on the first product (``TwELLMatrix`` keeps the SpMV's launch, and
with it the plan), from the matrix's compressed rows: a sort of the entries by (CTA, panel)
and a few read-backs of sizes. It holds as many bytes as the matrix's entries (the values and
one 32-bit word an entry), for as long as the matrix keeps its launch.
:func:`plan_pays` says when it is built (docs/design.rst, the SpMV).
"""

import typing

import cupy
import numpy as np

from . import _compile
from ._launch import i32, i64
from ._unpack import to_csr

SOURCE = "spmv_panels_sm90.cu"

#: CTAs that share each panel of x (spmv_panels_sm90.cu: kCluster), and the consumer warps
#: of a CTA, each owning a range of its rows.
CLUSTER = 8
WARPS = 8

#: Threads of a CTA: the consumer warps and the producer's.
THREADS = 32 * (WARPS + 1)

#: Words before a run's: its warps' starts and its length (kHeader).
HEADER = 16


class Shape(typing.NamedTuple):
    """The kernel's shape for one value size (TWELL_PANELS_SHAPE): x bytes a panel holds, the
    stages of the ring, the entries a stage holds, the rows a CTA owns."""

    panel_bytes: int
    stages: int
    run_cap: int
    rows: int


SHAPES = {8: Shape(32768, 3, 1360, 8192), 4: Shape(32768, 3, 3072, 8192),
          2: Shape(32768, 4, 2560, 8192)}

#: The fewest entries for which the plan is built: below them the launch and the panels'
#: steps cost more than the gathers they save.
MIN_NNZ = 1 << 20

#: The most waves of CTAs a plan may take (every wave reads all of x into every SM).
MAX_WAVES = 2

_KERNELS = {"float64": "twell_spmv_panels_f64", "float32": "twell_spmv_panels_f32",
            "float16": "twell_spmv_panels_f16", "bfloat16": "twell_spmv_panels_bf16"}


def shape_of(dtype):
    return SHAPES[np.dtype(dtype).itemsize]


def width(dtype):
    """Columns of x in a panel."""
    return shape_of(dtype).panel_bytes // np.dtype(dtype).itemsize


def col_bits(dtype):
    """Bits of an entry's word that hold its column within the panel."""
    return int(width(dtype)).bit_length() - 1


def run_align(dtype):
    """Entries a run is padded to: its values and its words in whole 16-byte copies."""
    return max(4, 16 // np.dtype(dtype).itemsize)


def shared_bytes(dtype):
    """Dynamic shared memory of the kernel (PanelShape<T>::kSmem)."""
    size = np.dtype(dtype).itemsize
    shape = SHAPES[size]
    acc = 8 if size == 8 else 4
    stage = shape.panel_bytes + shape.run_cap * size + (HEADER + shape.run_cap) * 4
    return shape.stages * stage + shape.rows * acc + 3 * shape.stages * 8


def plan_pays(indptr, indices, shape, dtype, rows=None):
    """Whether the panel plan pays for a matrix in compressed rows (device arrays): a device
    of compute capability 9.0, at least :data:`MIN_NNZ` entries, and columns spread wider
    than a panel around the diagonal (a stencil's lie within a few hundred, and its gathers
    hit the caches). One read-back (the spread)."""
    m, k = shape
    nnz = int(indices.size)
    if (nnz < MIN_NNZ or not _compile.arch_supported(SOURCE)
            or np.dtype(dtype).name not in _KERNELS):
        return False
    if rows is None:
        rows = _entry_rows(indptr, nnz)
    diagonal = rows * k // max(m, 1)
    return int(cupy.abs(indices.astype(np.int64) - diagonal).max()) > width(dtype)


def _entry_rows(indptr, nnz):
    return cupy.searchsorted(indptr, cupy.arange(nnz, dtype=np.int64), side="right") - 1


class Plan:
    """The panel plan of a matrix: its entries in the kernel's order and the CTAs' ranges."""

    def __init__(self, values, words, run_start, row0, n_panels, shape):
        self.values, self.words = values, words
        self.run_start, self.row0 = run_start, row0
        self.n_panels, self.shape = n_panels, shape
        self.kernel = _compile.function(SOURCE, _KERNELS[values.dtype.name])
        self.smem = shared_bytes(values.dtype)
        self.kernel.max_dynamic_shared_size_bytes = self.smem

    @property
    def n_ctas(self):
        return int(self.row0.size) - 1

    def __call__(self, x):
        """``A @ x`` for a C-contiguous vector of the plan's dtype with ``K`` values."""
        m, k = self.shape
        dtype = self.values.dtype
        if (k * dtype.itemsize) % 16 or x.data.ptr % 16:
            # A panel's copy is whole 16-byte pieces: x padded (a device copy) where its end
            # or start is not.
            padded = cupy.zeros(-(-k * dtype.itemsize // 16) * 16 // dtype.itemsize, dtype)
            padded[:k] = x
            x = padded
        y = cupy.empty(m, dtype=dtype)
        self.kernel((self.n_ctas,), (THREADS,), (
            self.values, self.words, self.run_start, self.row0, i32(self.n_panels), i64(k),
            x, y), shared_mem=self.smem)
        return y


def _cta_bounds(indptr, m, nnz, target, rows_cap):
    """Row bounds of about ``target`` CTAs of equal entries, those of more than ``rows_cap``
    rows split evenly (host arrays: a few hundred bounds)."""
    per_cta = max(1, -(-nnz // target))
    cuts = cupy.searchsorted(indptr, cupy.arange(1, target, dtype=np.int64) * per_cta).get()
    bounds = np.unique(np.concatenate(([0, m], cuts))).astype(np.int64)
    out = [0]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        parts = -(-(hi - lo) // rows_cap)
        out.extend(lo + (hi - lo) * np.arange(1, parts + 1) // parts)
    return np.asarray(out, dtype=np.int64)


def build(indptr, indices, data, shape, target_ctas=None, rows=None):
    """The :class:`Plan` of a matrix in canonical compressed rows (device arrays: int64
    ``indptr``, int32 ``indices``), or None where it would take more than :data:`MAX_WAVES`
    waves of CTAs for their runs of a panel to fit a stage. ``target_ctas``: the CTAs the
    entries are shared among (default: one wave)."""
    m, k = shape
    dtype = data.dtype
    size = dtype.itemsize
    config = SHAPES[size]
    nnz = int(indices.size)
    w = width(dtype)
    n_panels = -(-k // w)
    if target_ctas is None:
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        target_ctas = max(CLUSTER, sms // CLUSTER * CLUSTER)
    wave = target_ctas
    if rows is None:
        rows = _entry_rows(indptr, nnz)
    cols = indices.astype(np.int64)
    panel = cols // w
    align = run_align(dtype)
    while True:
        bounds = _cta_bounds(indptr, m, nnz, target_ctas, config.rows)
        n_ctas = bounds.size - 1
        if n_ctas > MAX_WAVES * wave:
            return None
        padded_ctas = -(-n_ctas // CLUSTER) * CLUSTER
        row0 = np.concatenate((bounds, np.full(padded_ctas - n_ctas, m, dtype=np.int64)))
        # Each CTA's rows among its warps, by entries (a row is never split).
        first = indptr[cupy.asarray(bounds)]
        targets = (first[:-1, None] + (first[1:] - first[:-1])[:, None]
                   * cupy.arange(WARPS, dtype=np.int64) // WARPS)
        warp_rows = cupy.searchsorted(indptr, targets.ravel())
        warp_rows = cupy.maximum(warp_rows, cupy.repeat(cupy.asarray(bounds[:-1]), WARPS))
        warp_rows = cupy.concatenate((warp_rows, cupy.asarray([m], dtype=np.int64)))
        wid = cupy.searchsorted(warp_rows, rows, side="right") - 1
        cta = wid // WARPS
        key = (cta * n_panels + panel) * WARPS + wid % WARPS
        lengths = cupy.bincount(key, minlength=padded_ctas * n_panels * WARPS)
        lengths = lengths.reshape(padded_ctas * n_panels, WARPS)
        group = lengths.sum(axis=1)
        longest = int(group.max()) if group.size else 0
        needed = -(-longest // align) * align
        if needed <= config.run_cap:
            break
        target_ctas = max(target_ctas + 1, int(target_ctas * needed / config.run_cap * 1.05))
    padded = (group + (align - 1)) // align * align
    run_start = cupy.concatenate((cupy.zeros(1, dtype=np.int64), cupy.cumsum(padded)))
    starts = cupy.cumsum(lengths, axis=1) - lengths  # each warp's start within its run
    flat_start = cupy.concatenate((cupy.zeros(1, dtype=np.int64),
                                   cupy.cumsum(lengths.ravel())))[:-1]
    order = cupy.argsort(key * max(nnz, 1) + cupy.arange(nnz, dtype=np.int64))
    skey = key[order]
    g = skey // WARPS
    within = starts.ravel()[skey] + cupy.arange(nnz, dtype=np.int64) - flat_start[skey]
    n_groups = padded_ctas * n_panels
    values = cupy.zeros(int(run_start[-1]), dtype=dtype)
    values[run_start[g] + within] = data[order]
    words = cupy.full(int(run_start[-1]) + HEADER * n_groups, 0xFFFFFFFF, dtype=np.uint32)
    header = cupy.zeros((n_groups, HEADER), dtype=np.uint32)
    header[:, :WARPS] = starts
    header[:, WARPS] = group
    base = run_start[:-1] + HEADER * cupy.arange(n_groups, dtype=np.int64)
    words[(base[:, None] + cupy.arange(HEADER)).ravel()] = header.ravel()
    local_row = rows[order] - cupy.asarray(row0)[cta[order]]
    local_col = cols[order] - panel[order] * w
    words[base[g] + HEADER + within] = ((local_row << col_bits(dtype)) | local_col).astype(
        np.uint32)
    return Plan(values, words, run_start, cupy.asarray(row0), n_panels, (m, k))


def plan_for(parts, shape, tile_width):
    """The panel plan of TwELL parts where :func:`plan_pays`, else None."""
    if int(parts.data.size) + int(parts.overflow_indices.size) < MIN_NNZ:
        return None
    if not _compile.arch_supported(SOURCE):
        return None
    indptr, indices, data = to_csr(parts, shape, tile_width)
    rows = _entry_rows(indptr, int(indices.size))
    if not plan_pays(indptr, indices, shape, data.dtype, rows):
        return None
    return build(indptr, indices, data, shape, rows=rows)
