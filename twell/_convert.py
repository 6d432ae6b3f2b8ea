"""Turning whatever a user hands in into canonical arrays.

Every constructor of TwELLMatrix and ELLMatrix goes through :func:`coerce`,
which returns either a dense C-contiguous array or a canonical CSR triplet
(sorted columns, duplicates summed, explicit zeros dropped), on the host or on
the device depending on where the input lives.
"""

import numpy as np
import scipy.sparse as sp

from . import _algorithms, _backend
from ._checks import check_coo
from ._validation import check_dense, check_shape, check_storage, native, value_dtype


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
    xp = _backend.array_module(x)
    if xp is np and not isinstance(x, np.ndarray):
        x = np.asarray(x)
        if x.dtype == object:
            raise TypeError(f"{name} must be a numeric array; got an array of Python objects")
    vdtype = check_dense(x, name)
    if dtype is not None:
        vdtype = value_dtype(dtype)
    return Dense(_backend.backend(xp).cast(x, vdtype) if x.dtype != vdtype
                 else xp.ascontiguousarray(x))


def csr_from_coo(rows, cols, vals, shape, dtype=None, names=None):
    """Any COO triplet (NumPy or CuPy) -> canonical :class:`CSR`.

    ``names``: the user's names of ``rows`` and ``cols``, whose every pair is then checked
    to lie within ``shape`` (:func:`twell._checks.check_coo`); ``None`` for twell's own
    arrays, which need no check.
    """
    xp = _backend.array_module(rows, cols, vals)
    if names is not None:
        check_coo(rows, cols, shape, names)
    vdtype = value_dtype(vals.dtype if dtype is None else dtype, "data.dtype")
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
    xp = _backend.array_module(indptr, indices, data)
    vdtype = value_dtype(data.dtype if dtype is None else dtype, "data.dtype")
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


def coerce(x, dtype=None, storage=None):
    """Classify and normalise constructor input.

    Returns a :class:`Dense` or :class:`CSR`, or the TwELLMatrix/ELLMatrix
    itself (the caller converts those). ``storage``: ``(tile_width, slots)``
    of the TwELL matrix to be built from sparse input, checked against the
    storage limit before anything of size ``M`` is allocated.
    """
    from ._ell import ELLMatrix
    from ._twell import TwELLMatrix

    if isinstance(x, (TwELLMatrix, ELLMatrix)):
        return x
    if sp.issparse(x):
        return scipy_sparse(x, dtype, storage)
    if _backend.is_cupyx_sparse(x):
        return cupyx_sparse(x, dtype, storage)
    return dense(x, dtype)
