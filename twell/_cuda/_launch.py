"""What every launcher of this package shares: block sizes, grid arithmetic, kernel instance
names and the storage arrays of a new layout on the device."""

import cupy
import numpy as np

from .. import _layout
from .._algorithms import Parts
from . import _compile

# Threads per block for the warp-per-item kernels (8 warps) and the thread-per-item ones.
BLOCK = 256
WARPS = BLOCK // 32
MODE_COUNT, MODE_SLOTS, MODE_OVERFLOW = 0, 1, 2

i32, i64 = np.int32, np.int64

def blocks(items, per_block):
    return (int(-(-items // per_block)),)


def aligned(*arrays):
    return all(a.data.ptr % 16 == 0 for a in arrays)


def vector_for(dtype, *conditions):
    """16-byte vectors when every condition holds, else one value at a time."""
    return _compile.vector_width(dtype) if all(conditions) else 1


def instance(kernel, dtype, vec=None):
    ctype = _compile.CTYPES[np.dtype(dtype)]
    return f"{kernel}<{ctype}>" if vec is None else f"{kernel}<{ctype}, {vec}>"


def dense_vector(dense, tile_width):
    v = _compile.vector_width(dense.dtype)
    return vector_for(dense.dtype, dense.shape[1] % v == 0, tile_width % v == 0, aligned(dense))


def empty_parts(m, nt, slots, dtype, zeroed=True, overflow=True, tile_width=None):
    """Parts of an ``M x n_tiles x slots`` layout: the slot arrays (zeros when ``zeroed``,
    else uninitialised), an empty overflow part (``overflow``) or none yet (its three arrays
    None). ``indices`` has the dtype of ``tile_width`` (uint16 when None: the fused GEMM's
    256-column tiles)."""
    fill = cupy.zeros if zeroed else cupy.empty
    index_dtype = _layout.INDEX_DTYPE if tile_width is None else _layout.index_dtype(tile_width)
    parts = Parts(
        fill((m, nt), dtype=_layout.COUNT_DTYPE),
        fill((m, nt, slots), dtype=dtype),
        fill((m, nt, slots), dtype=index_dtype),
        None, None, None,
    )
    return no_overflow(parts) if overflow else parts


#: Null storage arrays for the count passes, which write only the per-tile totals (CuPy
#: passes None as a null pointer).
NO_PARTS = Parts(None, None, None, None, None, None)


def no_overflow(parts):
    """``parts`` with an empty overflow part."""
    return parts._replace(
        overflow_indptr=cupy.zeros(parts.counts.shape[0] + 1,
                                   dtype=_layout.OVERFLOW_INDPTR_DTYPE),
        overflow_indices=cupy.zeros(0, dtype=_layout.OVERFLOW_INDEX_DTYPE),
        overflow_data=cupy.zeros(0, dtype=parts.data.dtype),
    )


def overflow_counter():
    """The pack kernels' device counter of entries past the slots (one uint64, zeroed)."""
    return cupy.zeros(1, dtype=np.uint64)


def overflow_size(counter):
    """Value of an overflow counter filled by a kModeSlots pack launch (one host sync)."""
    return int(counter.get()[0])  # device-to-host sync: the overflow size


def with_overflow(parts, row_starts, n_over):
    return parts._replace(
        overflow_indptr=row_starts,
        overflow_indices=cupy.empty(n_over, dtype=_layout.OVERFLOW_INDEX_DTYPE),
        overflow_data=cupy.empty(n_over, dtype=parts.data.dtype),
    )


def indexed(source, expression, index_dtype):
    """``(module key, name expression)`` of a kernel instance for ``indices`` of
    ``index_dtype``: as given for uint16 columns within a tile, else its instance for int
    columns (tiles wider than 65536 columns), compiled apart (:data:`_compile.WIDE`)."""
    if index_dtype == _layout.INDEX_DTYPE:
        return source, expression
    return source + _compile.WIDE, _compile.wide(expression)


def instance_n(kernel, dtype, *numbers):
    """The name expression ``kernel<ctype, n1, n2, ...>`` of an instance."""
    return f"{kernel}<{_compile.CTYPES[np.dtype(dtype)]}, {', '.join(map(str, numbers))}>"
