"""Launcher of ``cuda_src/canonical.cu``: CSR input sorted and compacted into canonical CSR."""

import cupy
import numpy as np

from .. import _algorithms
from .._invariants import check_csr
from . import _compile
from ._launch import BLOCK, WARPS, blocks, i64, instance
from ._reduce import scan

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

    A warp per row (canonical.cu) instead of the global sort of 64-bit keys, several times
    faster on cupyx input of the paper's activations (docs/design.rst, canonical CSR).
    Synchronises once with the host, to read the
    number of dropped entries (the output size), whether a row was too long to sort here,
    and whether a row pointer or a column index was out of range: the kernel counts those
    faults as it reads, and :func:`twell._invariants.check_csr` then names one (``names``).
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
    grid = (min(blocks(m, WARPS)[0], _CANONICAL_BLOCKS),)
    kernel = _compile.function("canonical.cu", instance("twell_csr_sort_rows", data.dtype))
    kernel(grid, (BLOCK,), (indptr, indices, data, i64(m), i64(shape[1]),
                             i64(indices.size), i64(CSR_SORT_MAX_ROW), scratch, col, val,
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
    out_indptr = scan(kept)
    n = indices.size - dropped
    out_col = cupy.empty(n, dtype=np.int32)
    out_val = cupy.empty(n, dtype=data.dtype)
    kernel = _compile.function("canonical.cu", instance("twell_csr_compact_rows", data.dtype))
    kernel(grid, (BLOCK,), (indptr, col, val, i64(m), out_indptr, out_col, out_val))
    return out_indptr, out_col, out_val

