"""Launcher of ``cuda_src/cast.cu``: value dtype conversions that keep subnormals."""

import cupy
import numpy as np

from . import _compile
from ._launch import BLOCK, blocks, i64


def cast(values, dtype):
    """``values`` converted to ``dtype`` (a new C-contiguous array), rounded once.

    Float to float conversions run ``twell_cast``, which keeps subnormals (CuPy's casts
    flush float32/bfloat16 subnormal results to zero); other sources use CuPy's cast.
    """
    dtype = np.dtype(dtype)
    if values.dtype not in _compile.CTYPES or values.dtype == dtype:
        return cupy.ascontiguousarray(values).astype(dtype)
    src = cupy.ascontiguousarray(values)
    out = cupy.empty(src.shape, dtype=dtype)
    if src.size:
        kernel = _compile.function("cast.cu", f"twell_cast<{_compile.CTYPES[src.dtype]}, "
                                              f"{_compile.CTYPES[dtype]}>")
        # One thread per element.
        kernel(blocks(src.size, BLOCK), (BLOCK,), (src, i64(src.size), out))
    return out
