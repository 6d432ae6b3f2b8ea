"""Launcher of ``cuda_src/spmm.cu``: ``A @ B`` and ``A @ x`` for a TwELL ``A``.

Which way a product runs (the gather kernel, or cuBLAS on ``A.toarray()``), the shape of the
gather kernel and the SpMV's lanes per row are chosen in :mod:`._policy`.
"""

import cupy
import numpy as np

from .. import _layout
from .._dtypes import accumulator_dtype
from . import _compile, _policy
from ._launch import BLOCK, aligned, blocks, i32, i64, indexed, instance, instance_n, vector_for
from ._reduce import nonfinite
from ._unpack import to_dense


def spmm(parts, shape, tile_width, b, out_dtype, nnz_hint=None, tile_index=None):
    """``A @ b`` for TwELL ``A`` and a C-contiguous 2-D CuPy ``b`` of the parts' dtype.

    Two ways, chosen without a host synchronisation (:func:`._policy.spmm_way`):

    * the gather kernel ``twell_spmm_rows`` (8 to 32 lanes per row and up to 1024 columns of
      16-bit values, by N and the layout: :func:`._policy.rows_shape`; the B row of each
      entry read from L2; one column takes the SpMV, :func:`spmv`), after
      ``twell_spmm_overflow_chunks`` when a row's overflow may be long enough to split
      (:func:`._policy.split_chunk`);
    * ``A.toarray() @ b`` by cuBLAS (``cupy.matmul``; :func:`spmm_with` takes another)
      where the cost model says it pays. If the ``M x K``
      temporary cannot be allocated, the gather kernel runs instead. If ``b`` holds Inf or
      NaN, the dense product would multiply A's zeros by them (NaN where A has no entry), so
      then the gather kernel recomputes the product (gated on the device).

    With ``tile_index`` (the layout's :class:`~twell._algorithms.TileIndex`,
    ``TwELLMatrix.index_tiles``), where :func:`._policy.index_pays`, the gather and SpMV
    kernels walk each row's listed tiles instead of all its counts (the ``Listed``
    instances: the same order of sums for the same shape; not the SpMV's team of 32, see
    spmm.cu), and the shape rules read the longest row's tiles from it. Tiles wider than
    65536 columns (int32 ``indices``) take the kernels' int instances and leave the tile index
    alone (such a row has few tiles).
    """
    return spmm_with(cupy.matmul, parts, shape, tile_width, b, out_dtype, nnz_hint, tile_index)


def spmm_with(matmul, parts, shape, tile_width, b, out_dtype, nnz_hint=None, tile_index=None):
    """:func:`spmm` whose dense way multiplies ``A.toarray()`` by ``b`` with ``matmul`` (a
    function of the two CuPy arrays), for a caller that needs another cuBLAS handle than
    CuPy's (``_ffn.sparse_ffn_without_sync``: CuPy's refuses a CUDA graph capture)."""
    m, k = shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return cupy.zeros((m, n), dtype=out_dtype)
    # twell_spmm_rows puts blocks of its columns on grid y, at most MAX_GRID_Y of them:
    # wider products run in column chunks (a copy of each chunk of b).
    chunk = _policy.MAX_GRID_Y * 32
    if n > chunk:
        out = cupy.empty((m, n), dtype=out_dtype)
        for c0 in range(0, n, chunk):
            part = cupy.ascontiguousarray(b[:, c0:c0 + chunk])
            out[:, c0:c0 + chunk] = spmm_with(matmul, parts, shape, tile_width, part,
                                              out_dtype, tile_index=tile_index)
        return out
    wide = parts.indices.dtype != _layout.INDEX_DTYPE
    if tile_index is not None and (wide or not _policy.index_pays(parts, m, tile_index)):
        tile_index = None
    way = _policy.spmm_way(m, k, n, out_dtype, nnz_hint)
    run_rows = None  # the gather kernels' gate (below: every row, unless set here)
    out = None
    if way == "dense":
        try:
            out = matmul(to_dense(parts, shape, tile_width), b)
        except cupy.cuda.memory.OutOfMemoryError:
            way = "rows"  # the memory is in use elsewhere: the gather kernels need none
        else:
            run_rows = nonfinite(b)
    if out is None:
        out = cupy.empty((m, n), dtype=out_dtype)
    if n == 1 and way != "dense":  # a matrix-vector product never densifies (_policy)
        return spmv(parts, shape, tile_width, out_dtype, tile_index)(b.reshape(k)).reshape(m, 1)
    common = _common_args(parts, shape, tile_width)
    if run_rows is None:  # not for the SpMV above: a fill kernel per product in a solver
        run_rows = cupy.ones((), dtype=bool)
    vec = vector_for(out_dtype, n % _compile.vector_width(out_dtype) == 0, aligned(b, out))
    shape = (vec, *_policy.rows_shape(n, out_dtype, _policy.short_rows(parts, m, tile_index)))
    column_blocks = int(-(-n // (shape[0] * shape[1] * shape[2])))  # vec * G * C columns each
    teams = 32 // shape[1]  # rows (or overflow chunks) per warp
    # Rows with a long overflow are split (split_row in spmm.cu): the parts of their
    # overflow first, a warp per chunk of the overflow, into `partial`.
    n_over, acc = parts.overflow_indices.size, accumulator_dtype(out_dtype)
    chunk = _policy.split_chunk(n_over, m, n, acc, out_dtype)
    partial = cupy.empty((2 * -(-n_over // chunk) if chunk else 0, n), dtype=acc)
    if chunk:
        kernel = _compile.function("spmm.cu", instance_n("twell_spmm_overflow_chunks",
                                                         out_dtype, *shape))
        # One team of G lanes per (chunk, column block).
        kernel((-(-partial.shape[0] // 2 // teams), column_blocks), (32,), (
            parts.overflow_indptr, parts.overflow_indices, parts.overflow_data, i64(m), b,
            i64(n), run_rows, i32(chunk.bit_length() - 1), partial))
    expr, args = _listed_args(instance_n("twell_spmm_rows", out_dtype, *shape), parts,
                              tile_index)
    kernel = _compile.function(*indexed("spmm.cu", expr, parts.indices.dtype))
    # One team of G lanes per (row, column block), one warp per block (__maxnreg__).
    kernel((-(-m // teams), column_blocks), (32,), (
        *common, *args, b, i64(n), run_rows, partial, i32(max(chunk.bit_length() - 1, 0)),
        out))
    return out


def _listed_args(expr, parts, tile_index):
    """The instance of ``expr`` that walks ``tile_index`` (or ``expr`` itself without one),
    and its two index arguments: the index, or arrays of their types that the instances
    without it never read."""
    if tile_index is None:
        return expr, (parts.overflow_indptr, parts.overflow_indices)
    return _compile.listed(expr), (tile_index.indptr, tile_index.tiles)


def _common_args(parts, shape, tile_width):
    """The storage arguments that the gather and SpMV kernels share."""
    return (parts.counts, parts.data, parts.indices, parts.overflow_indptr,
            parts.overflow_indices, parts.overflow_data, i64(shape[0]), i64(shape[1]),
            i32(tile_width), i32(parts.data.shape[2]))


def spmv(parts, shape, tile_width, dtype, tile_index=None):
    """The function ``x -> A @ x`` for a C-contiguous CuPy vector ``x`` of ``dtype`` (the
    parts' dtype) with ``K`` values.

    The kernel, its grid and its arguments are chosen here, once: a call allocates ``y``
    and launches one kernel, which is what an iterative solver pays per product
    (``TwELLMatrix.matvec`` keeps this function). The kernels, by the layout:

    * one tile a row (``tile_width >= K``, what ``tile_width="auto"`` gives matrices of short
      rows), by :func:`._policy.one_tile_way`: ``twell_spmv_one_tile``, a thread per row
      reading its slots as a CSR row is read, without the overflow's row pointer when there
      is no overflow, for rows with room for few entries; else
      ``twell_spmv_one_tile_warp``, a warp streaming 32 rows' slots and then their overflow
      with coalesced loads; in both a row whose overflow holds at least
      :data:`._policy.SPMV_HUB_MIN` entries (a hub) is summed by a block of its own in the
      same launch;
    * else a thread per row (``twell_spmv_thread_rows``, walking ``tile_index`` where it
      pays) or a team of 32 (``twell_spmv_rows``), by :func:`._policy.spmv_lanes`.
    """
    m, k = shape
    if m == 0:
        return lambda x: cupy.zeros(0, dtype=dtype)
    wide = parts.indices.dtype != _layout.INDEX_DTYPE
    if tile_index is not None and (wide or not _policy.index_pays(parts, m, tile_index)):
        tile_index = None
    if parts.data.shape[1] == 1:
        return _one_tile_spmv(parts, m, dtype)
    common = _common_args(parts, shape, tile_width)
    if _policy.spmv_lanes(parts, m, tile_index) == 1:  # a thread per row (kSpmvBlock)
        expr, extra = _listed_args(instance("twell_spmv_thread_rows", dtype), parts, tile_index)
        kernel = _compile.function(*indexed("spmm.cu", expr, parts.indices.dtype))
        grid, args = blocks(m, BLOCK), (*common, *extra)
    else:  # a team of 32 lanes per row, which reads its counts (spmm.cu: not the index)
        lanes = _compile.SPMV_LANES[-1]
        kernel = _compile.function(*indexed(
            "spmm.cu", instance_n("twell_spmv_rows", dtype, lanes), parts.indices.dtype))
        grid, args = blocks(m, BLOCK // lanes), common

    def run(x):
        y = cupy.empty(m, dtype=dtype)
        kernel(grid, (BLOCK,), (*args, x, y))
        return y

    return run


def _one_tile_spmv(parts, m, dtype):
    """:func:`spmv` for a layout of one tile a row."""
    n_over = int(parts.overflow_indices.size)
    over = "true" if n_over else "false"
    if _policy.one_tile_way(parts, m) == "warp":
        expr = instance_n("twell_spmv_one_tile_warp", dtype, over)
        rows_per_block = BLOCK  # 8 warps of 32 rows
    else:
        expr = instance_n("twell_spmv_one_tile", dtype, over, *_compile.SPMV_ONE_TILE_THREAD)
        rows_per_block = BLOCK // _compile.SPMV_ONE_TILE_THREAD[0]
    kernel = _compile.function(*indexed("spmm.cu", expr, parts.indices.dtype))
    hub_min = _policy.SPMV_HUB_MIN
    if n_over:  # the hub rows, listed once here (a read-back of the list's length)
        hubs = cupy.flatnonzero(cupy.diff(parts.overflow_indptr) >= hub_min)
    else:
        hubs = cupy.empty(0, dtype=np.int64)
    grid = (hubs.size + blocks(m, rows_per_block)[0],)
    args = (parts.counts, parts.data, parts.indices, parts.overflow_indptr,
            parts.overflow_indices, parts.overflow_data, i64(m), i32(parts.data.shape[2]),
            hubs, i64(hubs.size), i64(hub_min))

    def run(x):
        y = cupy.empty(m, dtype=dtype)
        kernel(grid, (BLOCK,), (*args, x, y))
        return y

    return run
