"""The GPU backend's choices, in one place: which way a product runs, the shapes of the gather
kernels, the tile index, the fused GEMM's kernel and buffers, and the cost model behind them.

Every choice is made from sizes the host knows (array shapes, entry counts known without a
read-back), never by reading the GPU: a choice costs no synchronisation. Where a constant was
set by a measurement, its comment says what was measured; docs/design.rst has the numbers.
"""

import functools
import os

import numpy as np

from . import _compile
from ._tma import tensor_maps_supported

#: The cost model that chooses how ``A @ B`` runs on a GPU, by value itemsize:
#: ``GATHER_SECONDS`` per (stored entry x column of B) for the gather kernel, ``GEMM_MACS``
#: multiply-adds per second of cuBLAS (16-bit on tensor cores; float32 without TF32) and
#: ``DENSIFY_BYTES`` per second for ``A.toarray()`` (written, then read by the GEMM). Measured
#: on the paper's down projection (M = 16384, K = 5632, N = 2048), where the 16-bit gather
#: rate puts the crossover at the measured 1.06% density; the float32 gather took 4.7-5.1e-13
#: at 1-10% non-zero on an H100 and 4.1-4.4e-13 on an H200 (the committed benchmark results);
#: float64 is taken at twice float32's bytes (docs/design.rst, the SpMM's two ways).
GATHER_SECONDS = {2: 2.6e-13, 4: 4.6e-13, 8: 9.2e-13}
GEMM_MACS = {2: 4.5e14, 4: 2.5e13, 8: 3.1e13}
DENSIFY_BYTES = 1.8e12

#: Products with fewer multiply-adds (``M * K * N``) always gather: below this the
#: densified product's extra launches and its ``M x K`` temporary do not pay.
DENSE_PRODUCT_MIN_WORK = 2**32


def dense_product_density(n, itemsize):
    """Density of A above which ``A.toarray() @ B`` (B with ``n`` columns) beats the gather
    kernel in the model: ``nnz * n * gather > M * K * n / gemm + M * K * itemsize / densify``.

    At ``n = 2048``: 1.06% for 16-bit values (0.85% from the GEMM's term), 8.9% for float32.
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


#: The gated FFN's up projection on a GPU (``_ffn.gated_up``), by value itemsize: seconds per
#: (gate entry x d_model) of ``twell_gated_up``, a warp's dot product per entry whose w_up
#: row comes from L2. Its alternative is cuBLAS's whole product in float32 (``GEMM_MACS``,
#: written at ``DENSIFY_BYTES``) read at the entries. Measured on the paper's gate
#: (M = 16384, hidden 5632, d_model 2048) on an H100: for 16-bit values the dot products
#: take 0.58 ms at 1.0% non-zero (0.92 M entries: 3.1e-13) and 0.32 ms at 0.5% (3.4e-13),
#: the whole product and its reading 0.637 ms at 5% (the model's 0.625), so the crossover is
#: ~1.05%; for float32 (the layer's time less its gate's and down projection's in the
#: committed benchmark results) 9.5 ms at 10% (5.0e-13) and 4.8 ms at 5% on an H100, 8.6
#: and 4.3 ms on an H200 (4.5e-13), so the crossover is ~8.5% (docs/design.rst, the gated
#: layer). float64 always takes the dot products.
GATED_DOT_SECONDS = {2: 3.1e-13, 4: 4.8e-13}


def dense_up_pays(m, h, d, nnz, itemsize=2):
    """Whether the gated FFN's up projection (``x`` of shape ``(m, d)``, ``w_up`` ``(h, d)``)
    at a gate of ``nnz`` entries is faster computed whole (``x @ w_up.T`` in float32 by cuBLAS,
    then read at the entries) than as a dot product per entry, in the model above:
    ``nnz * d * GATED_DOT_SECONDS > m * h * d / GEMM_MACS + 4 * m * h / DENSIFY_BYTES``, for
    values of ``itemsize`` bytes (16-bit or float32; float64 never). At the paper's shape the
    crossover is ~1.05% of the gate non-zero for 16-bit values and ~8.5% for float32.
    ``nnz=None`` answers False, as do products below ``DENSE_PRODUCT_MIN_WORK``."""
    if nnz is None or itemsize not in GATED_DOT_SECONDS or m * h * d < DENSE_PRODUCT_MIN_WORK:
        return False
    dense = m * h * d / GEMM_MACS[itemsize] + 4 * m * h / DENSIFY_BYTES
    return nnz * d * GATED_DOT_SECONDS[itemsize] > dense


#: CUDA's limit on gridDim.y (gridDim.x allows 2**31 - 1 blocks).
MAX_GRID_Y = 65535


#: Entries per chunk of the overflow in the gather SpMM, a power of two: a row whose overflow
#: holds at least two chunks is split, its parts summed by one warp per chunk (spmm.cu,
#: split_row).
SPMM_SPLIT_CHUNK = 256


def split_chunk(n_over, m, n, acc_dtype, out_dtype):
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
#: plus an even share of the overflow, is one of short rows (:func:`short_rows`).
SHORT_ROW_ENTRIES = 128

#: A layout whose rows have room for at most this many entries takes the SpMV with a thread
#: per row (:func:`spmv_lanes`).
SPMV_THREAD_ROW_ENTRIES = 256


#: The GPU kernels walk the tile index only for rows of more tiles than this (one round of
#: count reads of a team of 32: kCountWindows * 32 in spmm.cu), and when it lists at most
#: 1 / INDEX_MAX_SHARE of the (row, tile) pairs (:func:`index_pays`).
INDEX_MIN_TILES = 128
INDEX_MAX_SHARE = 8


def index_pays(parts, m, tile_index):
    """Whether the gather and SpMV kernels walk ``tile_index`` rather than every count.

    A listed tile costs a dependent read (its number, then its count), which a row of few
    tiles does not make up for: measured on the power-law graph at tile width 65536 (16
    tiles a row, 9 listed: the index is slower) and the Poisson matrix at 4096 (245 tiles,
    1.5 listed: five times faster; docs/design.rst, the tile index). From the arrays' sizes
    (no sync).
    """
    tiles = parts.data.shape[1]
    return (tiles > INDEX_MIN_TILES
            and INDEX_MAX_SHARE * tile_index.tiles.size <= tiles * max(m, 1))


def row_room(parts, m, tile_index=None):
    """Entries a row of the layout has room for: ``n_tiles * slots`` (with the tile index,
    the longest row's tiles times ``slots``) plus an even share of the overflow. From the
    arrays' shapes alone, and the index's ``max_tiles`` (no sync)."""
    _, tiles, slots = parts.data.shape
    if tile_index is not None:
        tiles = tile_index.max_tiles
    return tiles * slots + parts.overflow_indices.size / max(m, 1)


def short_rows(parts, m, tile_index=None):
    """Whether the gather kernels take the layout for one of short rows.

    Four narrow teams per warp pay on short rows of similar lengths: a team per row in lock
    step with its neighbours (a stencil). On long or skewed rows (a power-law graph, where
    ``slots`` follows the long rows) the teams of a warp diverge, and a row's entries are
    better spread over more lanes (docs/design.rst, the gather SpMM).
    """
    return row_room(parts, m, tile_index) <= SHORT_ROW_ENTRIES


def rows_shape(n, dtype, short):
    """(G, C, E) of ``twell_spmm_rows`` for ``n`` output columns (_compile.SPMM_ROWS_SHAPES):
    G lanes per row, C column chunks and E entries in flight per lane.

    From N, the dtype's vector width and the layout's row length (``short``,
    :func:`short_rows`), never from whether B is aligned: the shape fixes the order of the
    sums, and a B that needs the VEC = 1 instance must give the same bits. A row of B as wide
    as 4 warp-wide 16-byte loads takes a warp and one entry per step (the plain order).
    Narrower ones take fewer lanes per row (more rows per warp). For long rows the 4 loads a
    lane keeps in flight go to several entries, so that a long row is not read one dependent
    load after another; for short rows they go to column chunks, so that the team is as narrow
    as B allows (8 lanes: 4 rows per warp).
    """
    lanes = -(-n // _compile.vector_width(dtype))  # 16-byte vectors in a row of B
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


def spmv_lanes(parts, m, tile_index=None):
    """Lanes per row of the SpMV (_compile.SPMV_LANES): 1 (``twell_spmv_thread_rows``) when
    the layout's rows have room for at most SPMV_THREAD_ROW_ENTRIES entries, else a team of
    32 (``twell_spmv_rows``).

    A thread per row shortens the chain of dependent loads per row and wins on short rows
    (the stencil at tile width 65536, room 80; the paper's activations at 99%, room ~140); a
    team wins on long rows (the power-law graph, room 464; the activations at 90%, room
    ~700); at room ~1200 the two are even (docs/design.rst, the SpMV).
    """
    room = row_room(parts, m, tile_index)
    return _compile.SPMV_LANES[0] if room <= SPMV_THREAD_ROW_ENTRIES else _compile.SPMV_LANES[-1]


#: Room of a row (:func:`row_room`) up to which the one-tile SpMV takes a thread per row:
#: see :func:`one_tile_way`.
ONE_TILE_ROOM = 8

#: The most slots for which the one-tile SpMV streams 32 rows' slots a warp
#: (``twell_spmv_one_tile_warp`` counts a warp's slot places in 32 bits); more take a thread
#: per row.
ONE_TILE_WARP_MAX_SLOTS = 1 << 20

#: Overflow entries from which a row of the one-tile SpMV is a hub, summed by a block of its
#: own (``twell_spmv_one_tile``'s first blocks) rather than by a team of lanes, so that a
#: power-law graph's longest rows (8,000 to 25,000 entries in a Pareto(2) graph of 10^6 rows)
#: are not one team's serial work. Measured on such a graph (H100, float32, 32 registers):
#: 256 (~1,000 hub rows) and 128 (~4,000) within 1%, 512 (~300) 4% slower, 1024 (64) 15%
#: slower.
SPMV_HUB_MIN = 256


def one_tile_way(parts, m):
    """The one-tile SpMV's kernel from the row's room (slots plus an even share of the
    overflow; no sync): ``"thread"`` (``twell_spmv_one_tile``, a thread per row reading 8
    entries at once) up to :data:`ONE_TILE_ROOM`, else ``"warp"``
    (``twell_spmv_one_tile_warp``, a warp streaming 32 rows' slots and overflow).

    Measured on an H100 (docs/design.rst, the SpMV): a thread per row on the Poisson stencil
    (room 5: 0.0230 ms in float32 against 0.0275 for teams of 2 lanes and 0.035 for 4); the
    warp on the power-law graph (room about 17: 0.1588 ms in float32 and 0.1786 in float64
    against 0.171 and 0.188 for the fastest teams of lanes a row) and on its Laplacian (room
    about 34: 0.3076 ms in float32 against 0.3238 for teams of 16, 0.3454 in float64 against
    0.3464 for teams of 8)."""
    if row_room(parts, m) <= ONE_TILE_ROOM or parts.data.shape[2] > ONE_TILE_WARP_MAX_SLOTS:
        return "thread"
    return "warp"


def spmm_way(m, k, n, dtype, nnz_hint):
    """How :func:`spmm` runs ``A @ B`` by default: ``"dense"`` (cuBLAS on ``A.toarray()``) or
    ``"rows"`` (the gather kernel), by the conditions listed there, without a host sync.
    ``"dense"`` still falls back to the gather kernel if the temporary cannot be allocated."""
    itemsize = np.dtype(dtype).itemsize
    dense = (dense_product_pays(m, k, n, itemsize, nnz_hint)
             and n <= MAX_GRID_Y * 32  # no column chunks (spmm)
             and not (itemsize == 4 and float32_gemm_is_tf32())
             and m * k * itemsize <= device_bytes() // DENSE_SHARE)
    return "dense" if dense else "rows"


def float32_gemm_is_tf32():
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
DENSE_SHARE = 8


def device_bytes():
    """Total memory of the current device (no sync; asked once per device, so that a CUDA
    graph capture makes no runtime call here)."""
    import cupy

    return _total_memory(cupy.cuda.Device().id)


@functools.cache
def _total_memory(device_id):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.cuda.runtime.memGetInfo()[1]



# -- the fused GEMM -> TwELL and the gated up projection ---------------------------------------

#: The Hopper source of the fused GEMM (wgmma fed by TMA loads).
SM90_SOURCE = "matmul_pack_sm90.cu"
#: TMA box coordinates are 32-bit: the Hopper kernel takes M and N below this.
_TMA_COORD_LIMIT = 2**31


def matmul_variant(x, w):
    """The fused GEMM's kernel: ``"sm90"`` (wgmma and TMA) on a device of compute capability
    9.0 with a driver that encodes tensor maps, for K > 0 and M, N below 2**31; ``"mma"``
    (mma.sync) otherwise. Both take float16 and bfloat16 and give the same bits."""
    sm90 = (x.shape[1] > 0 and max(x.shape[0], w.shape[0]) < _TMA_COORD_LIMIT
            and _compile.arch_supported(SM90_SOURCE) and tensor_maps_supported())
    return "sm90" if sm90 else "mma"


def gated_fused(x, w_gate, w_up, nnz_hint=None):
    """Whether the gated layer's hidden values come from one fused kernel
    (``twell_gated_pack_sm90_*``: the gate's and the up projection's GEMMs through one
    pipeline, the products taken in the epilogue) rather than the gate's fused GEMM and
    ``_ffn.gated_up``: on the Hopper variant (:func:`matmul_variant`), for ``w_up`` of the
    gate's shape and dtype, C-contiguous and 16-byte aligned, where :func:`fused_up_pays`
    for the gate's expected ``nnz_hint`` entries (unknown: fused, the better way at the
    densities of ReLU feed-forward layers, 1% to 10%)."""
    return (w_up.shape == w_gate.shape and w_up.dtype == w_gate.dtype
            and w_up.flags.c_contiguous and w_up.data.ptr % 16 == 0
            and (nnz_hint is None or fused_up_pays(x.shape[0], w_up.shape[0], nnz_hint))
            and matmul_variant(x, w_gate) == "sm90")


#: Rows of x whose gate ``_ffn.gate_nnz_hint`` computes to estimate the gate's density for
#: ``sparse_ffn``: at the paper's layer (hidden 5632) 1.4 M outputs, about 14,000 entries at
#: 1% non-zero (a relative error near 1% for independent rows), for a GEMM of 1/64 of the
#: gate's work at 16384 tokens.
GATE_SAMPLE_ROWS = 256


def dense_hidden(x, w_gate, w_up, w_down, nnz_hint):
    """Whether the gated layer runs with its hidden layer dense (``_ffn.gated_dense``: the
    gated Hopper kernel writing ``relu(gate) * up`` whole, then cuBLAS's down projection)
    rather than packed and multiplied by the SpMM: where the gated kernel runs
    (:func:`gated_fused`), :func:`dense_hidden_allowed`, and the gate's expected ``nnz_hint``
    entries make the SpMM's gather slower than the down projection's GEMM
    (:func:`dense_hidden_pays_at`). ``nnz_hint=None`` answers False. No host sync."""
    return (nnz_hint is not None and gated_fused(x, w_gate, w_up)
            and dense_hidden_allowed(x, w_gate, w_down)
            and dense_hidden_pays_at(x.shape[0], w_gate.shape[0], w_down.shape[0], nnz_hint))


def dense_hidden_allowed(x, w_gate, w_down):
    """The part of :func:`dense_hidden` that neither the gated kernel's operands
    (:func:`gated_fused`) nor the gate's density decide: ``w_down`` has x's dtype, the
    hidden size is even (the dense epilogue's 32-bit stores) and the ``M x hidden`` hidden
    layer takes at most 1/8 of the device's memory."""
    m, h = x.shape[0], w_gate.shape[0]
    return (w_down.dtype == x.dtype and h % 2 == 0
            and m * h * x.dtype.itemsize <= device_bytes() // DENSE_SHARE)


def dense_hidden_pays_at(m, h, d, nnz):
    """The part of :func:`dense_hidden` that depends on the gate's ``nnz`` entries (of an
    ``m x h`` hidden layer, ``d`` output columns): the gated kernel's up projection beats
    the dot products (:func:`fused_up_pays`) and cuBLAS's down projection beats the gather
    (:func:`dense_hidden_pays`)."""
    return fused_up_pays(m, h, nnz) and dense_hidden_pays(m, h, d, nnz)


def dense_hidden_pays(m, h, d, nnz):
    """Whether the down projection of a hidden layer ``(m, h)`` with ``nnz`` entries to
    ``d`` columns is faster by cuBLAS on the dense hidden layer than by the gather kernel
    on the packed one, 16-bit values, in the model of :func:`dense_product_density` less its
    densification (the dense epilogue writes the hidden layer instead of packing it):
    ``nnz * d * GATHER_SECONDS > m * h * d / GEMM_MACS``, about 0.85% non-zero."""
    if nnz is None or m * h * d < DENSE_PRODUCT_MIN_WORK:
        return False
    return nnz * d * GATHER_SECONDS[2] > m * h * d / GEMM_MACS[2]


#: Density of the gate from which the gated Hopper kernel's up projection (a second GEMM,
#: whatever the density) beats one dot product per gate entry (:func:`fused_up_pays`).
#: Measured at the paper's shape, the module replayed from a CUDA graph with each way forced,
#: each way after the other in one process on one H100 (same inputs, best of two rounds,
#: dense layer 1.82-1.85 ms by the clock): the dot products' layer against the fused one took
#: 1.134 ms against 1.387 at 0.5% non-zero, 1.377 against 1.498 at 0.7%, 1.638 against 1.577
#: at 0.9% and 1.719 against 1.623 at 1%: the crossover is at about 0.83%, where the layer
#: with its hidden layer dense (:func:`dense_hidden`, from about 0.85%) takes over. The parts
#: agree: the gated kernel takes 1.07-1.10 ms at any density, the gate's pack about 0.6 ms,
#: and the dot products 0.32 ms at 0.5%, 0.43 at 0.7% and 0.58 at 1%.
FUSED_UP_MIN_DENSITY = 0.0085


def fused_up_pays(m, h, nnz):
    """Whether the up projection inside the gated kernel beats the dot products at the
    gate's ``nnz`` entries of ``m * h``: from :data:`FUSED_UP_MIN_DENSITY` (the depth scales
    both alike)."""
    return nnz >= FUSED_UP_MIN_DENSITY * m * h


#: Spill buffer of the fused GEMM, in entries: one per SPILL_SHARE outputs (plus a floor).
#: Enough when the slots hold all but a few percent of ~10% non-zeros; when it is not, the
#: launcher reruns the kernel with exactly the room the first run counted.
SPILL_SHARE = 64
SPILL_FLOOR = 4096


def spill_capacity(m, n):
    """Entries of the fused GEMM's spill buffer for an ``m x n`` product."""
    return m * n // SPILL_SHARE + SPILL_FLOOR


def gated_up_way(m, h, d, dtype, nnz_hint):
    """How ``_ffn.gated_up`` runs by default: ``"dense"`` (cuBLAS's whole ``x @ w_up.T`` in
    float32, then ``twell_gated_take``) where :func:`dense_up_pays` says so for the gate's
    ``nnz_hint`` entries (16-bit or float32 values; the float32 product takes at most 1/8 of
    the device's memory), ``"dot"`` (``twell_gated_up``) otherwise. No host sync."""
    dense = (dense_up_pays(m, h, d, nnz_hint, np.dtype(dtype).itemsize)
             and m * h * 4 <= device_bytes() // DENSE_SHARE)
    return "dense" if dense else "dot"
