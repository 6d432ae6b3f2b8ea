"""Reading an index of ``A[...]``: the part that selects rows, which twell's formats serve
natively (their rows are independent), and the rest, which scipy's or cupyx's CSR type serves.

Only the common shapes of a two-dimensional index are taken apart here: at most one
Ellipsis, no ``None``, and a row part that is an int, a slice, a 1-D integer array (or list)
or a 1-D boolean mask. Any other index goes whole to the CSR type, which checks it and raises
scipy's errors.
"""

import numbers
import operator

import numpy as np

from . import _arrays

FULL = slice(None)


def split_key(key):
    """``(row_part, column_part)`` of an index, or None for an index of another shape."""
    if key is Ellipsis:
        return FULL, FULL
    if not isinstance(key, tuple):
        key = (key,)
    if any(k is None for k in key) or sum(k is Ellipsis for k in key) > 1:
        return None
    parts = [k for k in key if k is not Ellipsis]
    if len(parts) > 2 or any(np.ndim(k) > 1 for k in parts if not _arrays.is_cupy_array(k)):
        return None  # a 2-D index (a mask of the whole matrix, an index grid) spans both axes
    if any(_arrays.is_cupy_array(k) and k.ndim > 1 for k in parts):
        return None
    if len(parts) == 1:
        # An Ellipsis before the one part makes it the column part: a[..., j].
        return (FULL, parts[0]) if key[0] is Ellipsis else (parts[0], FULL)
    return tuple(parts) if parts else (FULL, FULL)


def is_full(part):
    """Whether an index part is ``:`` (every row or column, in order)."""
    return isinstance(part, slice) and part == FULL


def is_int(part):
    """A Python or NumPy integer (bools excluded) or a 0-d integer array."""
    if isinstance(part, (bool, np.bool_)):
        return False
    if isinstance(part, numbers.Integral):
        return True
    dtype = getattr(part, "dtype", None)
    return getattr(part, "ndim", None) == 0 and dtype is not None and dtype.kind in "iu"


def rows_of(part, m, xp):
    """The rows a row part selects, or None for a part of another kind.

    Returns ``("int", i)`` for one row (its axis leaves the result, as in NumPy),
    ``("rows", index)`` for a slice, an integer array or a boolean mask (``index``: int64 on
    ``xp``). Out-of-range rows and masks of the wrong length raise scipy's IndexError.
    """
    if isinstance(part, slice):
        return "rows", xp.arange(*part.indices(m), dtype=np.int64)
    if is_int(part):
        i = operator.index(part)
        if not -m <= i < m:
            raise IndexError(f"index ({i}) out of range")
        return "int", i % m
    if isinstance(part, list):
        part = np.asarray(part)
    if not (isinstance(part, np.ndarray) or _arrays.is_cupy_array(part)) or part.ndim != 1:
        return None
    if part.dtype == bool:
        if part.shape != (m,):
            raise IndexError(f"bool index 0 has shape {(m,)} instead of {part.shape}")
        return "rows", xp.nonzero(xp.asarray(part))[0].astype(np.int64)
    if part.size == 0:
        return "rows", xp.zeros(0, dtype=np.int64)
    if part.dtype.kind not in "iu":
        return None
    index = xp.asarray(part).astype(np.int64)
    high, low = int(index.max()), int(index.min())  # host syncs on the GPU: the bounds
    if high >= m:
        raise IndexError(f"index ({high}) out of range")
    if low < -m:
        raise IndexError(f"index ({low}) out of range")
    return "rows", xp.where(index < 0, index + m, index) if low < 0 else index
