"""Launchers of ``cuda_src/unpack.cu``: TwELL storage to dense and to canonical CSR."""

import cupy
import numpy as np

from .. import _layout
from . import _compile
from ._launch import (
    BLOCK,
    MODE_COUNT,
    MODE_SLOTS,
    WARPS,
    blocks,
    dense_vector,
    i32,
    i64,
    indexed,
    instance,
)
from ._reduce import scan


def _scatter_overflow(parts, shape, out):
    n_over = parts.overflow_indices.size
    if n_over == 0:
        return
    kernel = _compile.function("unpack.cu", instance("twell_scatter_csr", out.dtype))
    # One thread per overflow entry.
    kernel(blocks(n_over, BLOCK), (BLOCK,), (
        parts.overflow_indptr, parts.overflow_indices, parts.overflow_data, i64(shape[0]),
        i64(n_over), i64(shape[1]), out))


def to_dense(parts, shape, tile_width):
    """TwELL parts -> dense C-contiguous CuPy array (every element written by the kernels)."""
    m, k = shape
    out = cupy.empty(shape, dtype=parts.data.dtype)
    pairs = parts.counts.size
    if pairs:
        vec = dense_vector(out, tile_width)
        kernel = _compile.function(*indexed(
            "unpack.cu", instance("twell_unpack_dense", out.dtype, vec), parts.indices.dtype))
        # One warp per (row, tile).
        kernel(blocks(pairs, WARPS), (BLOCK,), (
            parts.counts, parts.data, parts.indices, i64(m), i64(k), i32(tile_width),
            i32(parts.data.shape[2]), out))
    _scatter_overflow(parts, shape, out)
    return out


def to_csr(parts, shape, tile_width):
    """TwELL parts -> canonical CSR ``(indptr int64, indices int32, data)``.

    ``twell_rows_to_csr``, a warp per row: it counts each row's entries, then, after a prefix
    sum over the rows, writes them (the shared ``csr_layout`` makes a dozen CuPy calls over
    every tile). Synchronises once with the host to size the output.
    """
    m, k = shape
    row_nnz = cupy.empty(m, dtype=np.int64)
    kernel = _compile.function(*indexed(
        "unpack.cu", instance("twell_rows_to_csr", parts.data.dtype), parts.indices.dtype))

    def launch(mode, row_info, indices, data):
        if m:  # one warp per row
            kernel(blocks(m, WARPS), (BLOCK,), (
                parts.counts, parts.data, parts.indices, parts.overflow_indptr,
                parts.overflow_indices, parts.overflow_data, i64(m), i64(k),
                i32(tile_width), i32(parts.data.shape[2]), i32(mode), row_info, indices,
                data))

    launch(MODE_COUNT, row_nnz, cupy.empty(0, dtype=np.int32),
           cupy.empty(0, dtype=parts.data.dtype))  # not written in kModeCount
    indptr = scan(row_nnz)
    nnz = int(indptr[-1])  # device-to-host sync: the output size
    indices = cupy.empty(nnz, dtype=_layout.OVERFLOW_INDEX_DTYPE)
    data = cupy.empty(nnz, dtype=parts.data.dtype)
    launch(MODE_SLOTS, indptr, indices, data)
    return indptr, indices, data

