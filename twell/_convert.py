"""Turning whatever a user hands in into canonical arrays.

Every constructor of TwELLMatrix and ELLMatrix goes through :func:`coerce`,
which returns either a dense C-contiguous array or a canonical CSR triplet
(sorted columns, duplicates summed, explicit zeros dropped), on the host or on
the device depending on where the input lives.
"""

import numbers

import numpy as np
import scipy.sparse as sp

from . import _algorithms, _arrays, _backend
from ._arguments import check_dense, check_shape, check_storage
from ._dtypes import native, value_dtype
from ._invariants import check_coo


class Dense:
    """A validated dense input: C-contiguous 2-D array of a supported dtype."""

    kind = "dense"

    def __init__(self, array):
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype


class CSR:
    """A canonical CSR input: ``indptr`` int64, ``indices`` int32, ``data``."""

    kind = "csr"

    def __init__(self, indptr, indices, data, shape):
        self.indptr, self.indices, self.data, self.shape = indptr, indices, data, shape
        self.dtype = data.dtype


def dense(x, dtype=None, name="x"):
    """Validate and normalise a dense NumPy/CuPy array (or array-like)."""
    xp = _arrays.array_module(x)
    if xp is np and not isinstance(x, np.ndarray):
        x = np.asarray(x)
        if x.dtype == object:
            raise TypeError(f"{name} must be a numeric array; got an array of Python objects")
    vdtype = check_dense(x, name)
    if dtype is not None:
        vdtype = value_dtype(dtype)
        x = through_requested(x, dtype)
    return Dense(_backend.backend(xp).cast(x, vdtype) if x.dtype != vdtype
                 else xp.ascontiguousarray(x))


def through_requested(values, dtype):
    """``values`` cast to a requested bool or integer ``dtype`` first (NumPy's cast: 2.5
    becomes 2 for int32, True for bool), so that the float64 matrix holds the values of that
    dtype; ``values`` unchanged for the value dtypes twell holds."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biu" or values.dtype == dtype:
        return values
    with np.errstate(invalid="ignore", over="ignore"):
        return values.astype(dtype)


def csr_from_coo(rows, cols, vals, shape, dtype=None, names=None):
    """Any COO triplet (NumPy or CuPy) -> canonical :class:`CSR`.

    ``names``: the user's names of ``rows`` and ``cols``, whose every pair is then checked
    to lie within ``shape`` (:func:`twell._invariants.check_coo`); ``None`` for twell's own
    arrays, which need no check.
    """
    xp = _arrays.array_module(rows, cols, vals)
    if names is not None:
        check_coo(rows, cols, shape, names)
    vdtype = value_dtype(vals.dtype if dtype is None else dtype, "data.dtype")
    if dtype is not None:
        vals = through_requested(vals, dtype)
    if vals.dtype != vdtype:
        vals = _backend.backend(xp).cast(vals, vdtype)
    rows, cols, vals = _algorithms.canonical_coo(rows, cols, vals, shape)
    indptr, indices, vals = _algorithms.coo_to_csr(rows, cols, vals, shape[0])
    return CSR(indptr, xp.asarray(indices), vals, shape)


def csr_from_rows(indptr, indices, data, shape, dtype=None, names=("x.indptr", "x.indices")):
    """A user's CSR triplet (NumPy or CuPy; rows in any column order, duplicates and explicit
    zeros allowed) -> canonical :class:`CSR`.

    Sorted row by row on the GPU (``canonical.cu``), by the shared global sort on the host.
    The row pointer and the column indices are checked on the way (``names`` name them in
    the error): scipy and cupyx check them only when a matrix is built, and its arrays may
    have been changed since. The result may share ``indptr`` with the input (when it is
    int64 and nothing is dropped).
    """
    xp = _arrays.array_module(indptr, indices, data)
    vdtype = value_dtype(data.dtype if dtype is None else dtype, "data.dtype")
    if dtype is not None:
        data = through_requested(data, dtype)
    if data.dtype != vdtype:
        data = _backend.backend(xp).cast(data, vdtype)
    return CSR(*_backend.backend(xp).canonical_csr(indptr, indices, data, shape, names), shape)


def scipy_sparse(x, dtype=None, storage=None):
    """A scipy.sparse array or matrix -> canonical :class:`CSR` on the host.

    ``storage``: ``(tile_width, slots)`` of the TwELL matrix to be built, whose size is
    checked before the CSR row pointer (``M + 1`` elements) is allocated.
    """
    shape = check_shape(x.shape, "x.shape")
    if storage is not None:
        check_storage(shape, *storage)
    value_dtype(x.dtype, "x.dtype")
    # Arrays in the other byte order (scipy keeps them, from a file for example) are
    # converted once, here.
    if x.format == "csr":  # scipy may keep spare capacity past indptr[-1]: canonical_csr
        return csr_from_rows(np.asarray(x.indptr, dtype=np.int64), native(np.asarray(x.indices)),
                             native(np.asarray(x.data)), shape, dtype)
    coo = x.tocoo()
    return csr_from_coo(native(np.asarray(coo.row)), native(np.asarray(coo.col)),
                        native(np.asarray(coo.data)), shape, dtype, _coo_names(x))


def cupyx_sparse(x, dtype=None, storage=None):
    """A cupyx.scipy.sparse matrix -> canonical :class:`CSR` on the device (see scipy_sparse)."""
    shape = check_shape(x.shape, "x.shape")
    if storage is not None:
        check_storage(shape, *storage)
    value_dtype(x.dtype, "x.dtype")
    if x.format == "csr":
        return csr_from_rows(x.indptr, x.indices, x.data, shape, dtype)
    coo = x.tocoo(copy=True)
    return csr_from_coo(coo.row, coo.col, coo.data, shape, dtype, _coo_names(x))


def _coo_names(x):
    where = "x" if x.format == "coo" else "x.tocoo()"
    return f"{where}.row", f"{where}.col"


def coerce(x, dtype=None, storage=None, shape=None):
    """Classify and normalise constructor input.

    Returns a :class:`Dense` or :class:`CSR`. twell's own matrices are not input here:
    each container converts those itself. ``storage``: ``(tile_width, slots)`` of the
    TwELL matrix to be built from sparse input, checked against the storage limit before
    anything of size ``M`` is allocated. ``shape``: the constructor's ``shape`` argument, which
    the tuple forms (:func:`from_tuple`) read.
    """
    if isinstance(x, tuple):
        return from_tuple(x, shape, dtype, storage)
    if sp.issparse(x):
        return scipy_sparse(x, dtype, storage)
    if _arrays.is_cupyx_sparse(x):
        return cupyx_sparse(x, dtype, storage)
    return dense(x, dtype)


def is_shape(arg):
    """Whether a constructor tuple is a shape ``(M, K)``: two ints (bools excluded)."""
    return len(arg) == 2 and all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                                 for v in arg)


def from_tuple(arg, shape, dtype=None, storage=None):
    """scipy's tuple forms of constructor input -> canonical :class:`CSR`.

    ``(M, K)``: an empty matrix; ``(data, (row, col))``: COO triplets (duplicates summed,
    zeros dropped); ``(data, indices, indptr)``: a CSR structure. Without ``shape``, the
    shape is read off the indices as scipy reads it. The index arrays are checked
    (the message names them); ``storage`` as in :func:`coerce`.
    """
    if is_shape(arg):
        m, k = check_shape(arg, "arg")
        if shape is not None and check_shape(shape) != (m, k):
            raise ValueError(f"shape={shape!r} does not match the shape given as arg={arg!r}")
        if storage is not None:
            check_storage((m, k), *storage)
        vdtype = value_dtype(np.float64 if dtype is None else dtype)
        return CSR(np.zeros(m + 1, dtype=np.int64), np.zeros(0, dtype=np.int32),
                   np.zeros(0, dtype=vdtype), (m, k))
    if len(arg) == 2:
        data, coords = arg
        try:
            row, col = coords
        except (TypeError, ValueError):
            raise TypeError(
                "arg as (data, coords) must hold coords=(row, col), two index arrays; "
                f"got coords of type {type(coords).__name__}"
            ) from None
        data, row, col = _arrays_of(data=data, row=row, col=col)
        if row.shape != data.shape or col.shape != data.shape or data.ndim != 1:
            raise ValueError(
                "data, row and col must be 1-D arrays of one length; got shapes "
                f"{data.shape}, {row.shape}, {col.shape}"
            )
        if shape is None:
            shape = (_inferred(row, "row"), _inferred(col, "col"))
        shape = check_shape(shape)
        if storage is not None:
            check_storage(shape, *storage)
        return csr_from_coo(row, col, data, shape, dtype, ("row", "col"))
    if len(arg) == 3:
        data, indices, indptr = _arrays_of(*arg, names=("data", "indices", "indptr"))
        if data.ndim != 1 or indices.shape != data.shape or indptr.ndim != 1 or not indptr.size:
            raise ValueError(
                "data and indices must be 1-D arrays of one length and indptr a non-empty 1-D "
                f"array; got shapes {data.shape}, {indices.shape}, {indptr.shape}"
            )
        if shape is None:
            shape = (indptr.size - 1, _inferred(indices, "indices"))
        shape = check_shape(shape)
        if storage is not None:
            check_storage(shape, *storage)
        return csr_from_rows(indptr, indices, data, shape, dtype, ("indptr", "indices"))
    raise ValueError(
        "arg as a tuple must be (M, K), (data, (row, col)), (data, indices, indptr) or the 6 "
        "storage arrays (counts, data, indices, overflow_indptr, overflow_indices, "
        f"overflow_data) of a TwELLMatrix; got a tuple of {len(arg)}"
    )


def _arrays_of(*args, names=None, **kwargs):
    """The arrays of a tuple form, NumPy (lists too) or CuPy; indices must be integers."""
    names = names or tuple(kwargs)
    values = args or tuple(kwargs.values())
    # NumPy and CuPy arrays may not mix (array_module says how to move one); lists follow.
    xp = _arrays.array_module(*(v for v in values
                                if isinstance(v, np.ndarray) or _arrays.is_cupy_array(v)))
    out = []
    for name, value in zip(names, values, strict=True):
        a = value if _arrays.is_cupy_array(value) else np.asarray(value)
        if xp is not np:
            a = xp.asarray(a)
        if name != "data" and a.size and a.dtype.kind not in "iu":
            raise TypeError(f"{name} must be an integer array; got {name}.dtype={a.dtype}")
        if name != "data" and not a.size:
            a = a.astype(np.int64)
        out.append(a)
    return out


def _inferred(index, name):
    """One dimension as scipy infers it from an index array: its largest value plus one."""
    if not index.size:
        raise ValueError(f"cannot infer the shape from an empty {name} array; pass shape=")
    return int(index.max()) + 1  # host sync on the GPU
