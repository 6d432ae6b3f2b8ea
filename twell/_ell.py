"""Row-wise ELLPACK: the baseline format that TwELL refines."""

import numpy as np

from . import _algorithms, _arrays, _backend, _convert
from ._arguments import operator_index
from ._base import SparseMatrix
from ._dtypes import astype_dtype, value_dtype


class ELLMatrix(SparseMatrix):
    """Sparse matrix in row-wise ELLPACK format.

    Every row stores ``width`` (value, column) slots: its non-zeros sorted by
    column, then zero padding. ``width`` is the length of the longest row
    unless given.

    Parameters
    ----------
    arg : array_like, sparse matrix, TwELLMatrix, ELLMatrix or tuple
        What to convert: anything :class:`TwELLMatrix` accepts but its six
        storage arrays (``(M, K)``, ``(data, (row, col))`` and
        ``(data, indices, indptr)`` as in scipy).
    shape : tuple of int, optional
        ``(M, K)``, for the tuple forms; must match the input otherwise.
    dtype : dtype, optional
        Value dtype (float64, float32, float16 or bfloat16); bool and integer
        input becomes float64.
    copy : bool, optional
        From an ELLMatrix of the same dtype and width, copy its arrays
        (default False: the new matrix shares them, as scipy's constructors do).
    width : int, optional
        Slots per row; at least the longest row's length.
    maxprint : int, optional
        Entries that ``str(A)`` lists at most (default 50).

    Attributes
    ----------
    data : ndarray, shape (M, width)
        Values; a slot holds an entry exactly when its value is non-zero
        (entries are never zero), padding follows the entries.
    indices : ndarray of int32, shape (M, width)
        Global columns, sorted within each row; padding slots hold 0.
    shape : tuple of int
    dtype : numpy.dtype
    width : int
    nbytes : int
        Bytes of ``data`` and ``indices``, and of the caches it holds.

    Raises
    ------
    ValueError
        When ``width`` is shorter than some row; the message names the row.

    Notes
    -----
    The matrix offers scipy.sparse's common sparse-array API, as
    :class:`TwELLMatrix` does. Products (``A @ x``, ``x @ A``) run on a
    TwELLMatrix packed from it on first use and cached, and ``A.T`` is cached
    too; both count in :attr:`nbytes` and are dropped when ``data`` or
    ``indices`` is replaced. After writing into those arrays in place, call
    :meth:`drop_caches`.

    See Also
    --------
    TwELLMatrix : one width per (row, tile) instead of per row, with overflow.

    Examples
    --------
    >>> import numpy as np, twell
    >>> e = twell.ELLMatrix(np.array([[0., 2., 0., 3.], [1., 0., 0., 0.]]))
    >>> e.width, e.indices.tolist()
    (2, [[1, 3], [0, 0]])
    """

    format = "ell"

    def __init__(self, arg, shape=None, dtype=None, copy=False, *, width=None, maxprint=None):
        if maxprint is not None:
            self.maxprint = maxprint
        if (not isinstance(arg, tuple) and shape is not None
                and tuple(shape) != tuple(getattr(arg, "shape", shape))):
            raise ValueError(f"shape={shape!r} does not match the input's shape {arg.shape}")
        if (isinstance(arg, ELLMatrix) and width in (None, arg.width)
                and (dtype is None or np.dtype(dtype) == arg.dtype)):
            self._set(arg.data.copy() if copy else arg.data,
                      arg.indices.copy() if copy else arg.indices, arg.shape)
            return
        if isinstance(arg, SparseMatrix):
            src = arg._csr_input(dtype)
        else:
            src = _convert.coerce(arg, dtype, shape=shape)
            if src.kind == "dense":
                xp = _arrays.array_module(src.array)
                rows, cols = xp.nonzero(_algorithms.is_nonzero(src.array))
                src = _convert.CSR(*_algorithms.coo_to_csr(rows, cols, src.array[rows, cols],
                                                           src.shape[0]), src.shape)
        self._from_csr(src, width)

    def _set(self, data, indices, shape):
        self._data, self._indices, self._shape = data, indices, tuple(shape)
        self.__dict__.pop("_twell_cache", None)  # of the arrays being replaced
        self.__dict__.pop("_transpose_cache", None)

    def _from_csr(self, src, width):
        xp = _arrays.array_module(src.indptr)
        m = src.shape[0]
        lengths = xp.diff(src.indptr)
        longest = int(lengths.max()) if m else 0  # host sync on the GPU: the width
        if width is None:
            width = longest
        width = operator_index(width, "width")
        if width < 0:
            raise ValueError(f"width must be non-negative; got width={width}")
        if width < longest:
            row = int(xp.argmax(lengths))
            raise ValueError(
                f"width={width} is shorter than row {row}, which holds {longest} non-zeros"
            )
        rows = _algorithms.expand_indptr(src.indptr, src.indices.size)
        rank = xp.arange(rows.size, dtype=np.int64) - src.indptr[rows]
        data = xp.zeros((m, width), dtype=src.data.dtype)
        indices = xp.zeros((m, width), dtype=np.int32)
        data[rows, rank] = src.data
        indices[rows, rank] = src.indices
        self._set(data, indices, src.shape)

    @classmethod
    def _wrap(cls, data, indices, shape):
        out = cls.__new__(cls)
        out._set(data, indices, shape)
        return out

    # Replacing either array drops the caches keyed on it (see _storage_key).
    data = property(lambda self: self._data,
                    lambda self, value: self._set(value, self._indices, self._shape),
                    doc="Values, (M, width); padding slots hold zero.")
    indices = property(lambda self: self._indices,
                       lambda self, value: self._set(self._data, value, self._shape),
                       doc="Global columns, (M, width), sorted within each row.")
    shape = property(lambda self: self._shape, doc="``(M, K)``.")
    dtype = property(lambda self: self._data.dtype, doc="Value dtype.")
    _storage = property(lambda self: self._data)
    width = property(lambda self: self._data.shape[1], doc="Slots per row.")

    def _storage_key(self):
        return (self._data, self._indices)

    @property
    def nbytes(self):
        """Bytes of the storage arrays, ``M * width * (itemsize + 4)``, and of the cached
        TwELL form and transpose if the matrix holds them.

        Examples
        --------
        >>> import numpy as np, twell
        >>> twell.ELLMatrix(np.eye(3, dtype=np.float32)).nbytes
        24
        """
        twell_form = self._twell_form(build=False)
        return (int(self._data.nbytes + self._indices.nbytes) + self._cache_nbytes()
                + (0 if twell_form is None else twell_form.nbytes))

    @property
    def nnz(self):
        """Number of stored non-zeros."""
        return int(_algorithms.is_nonzero(self._data).sum())

    def __repr__(self):
        m, k = self.shape
        return f"<ELLMatrix {m}x{k}, dtype={self.dtype}, nnz={self.nnz}, width={self.width}>"

    def validate(self):
        """Check every invariant of the storage arrays.

        Raises
        ------
        TypeError
            An array of the wrong kind or dtype.
        ValueError
            A broken invariant; the message names it.
        """
        from ._invariants import validate_ell

        validate_ell(self._data, self._indices, self.shape)

    def drop_caches(self):
        """Drop the cached TwELL form and transpose (after writing into ``data`` or
        ``indices`` in place); they are built again on next use."""
        self.__dict__.pop("_twell_cache", None)
        self.has_transpose = False

    def _coo_arrays(self):
        xp = _arrays.array_module(self._data)
        rows, slot = xp.nonzero(_algorithms.is_nonzero(self._data))  # sorted by (row, column)
        return rows, self._indices[rows, slot].astype(np.int64), self._data[rows, slot]

    def _csr_input(self, dtype=None):
        rows, cols, vals = self._coo_arrays()
        if dtype is None:
            return _convert.CSR(*_algorithms.coo_to_csr(rows, cols, vals, self.shape[0]),
                                self.shape)
        # Casting can turn entries into zeros: canonicalise again so that they leave.
        return _convert.csr_from_coo(rows, cols, vals, self.shape, value_dtype(dtype))

    def _to_dense(self):
        xp = _arrays.array_module(self._data)
        out = xp.zeros(self.shape, dtype=self.dtype)
        rows, cols, vals = self._coo_arrays()
        out[rows, cols] = vals
        return out

    def _from_canonical(self, src):
        out = ELLMatrix.__new__(ELLMatrix)
        out._from_csr(src, None)
        return out

    def _replace(self, src):
        self._from_csr(src, None)

    def _take_rows(self, rows):
        rows = _arrays.array_module(self._data).asarray(rows, dtype=np.int64)
        return ELLMatrix._wrap(self._data[rows], self._indices[rows],
                               (int(rows.size), self.shape[1]))

    def _map_values(self, fn):
        """``fn`` on the stored values; entries that become zero leave (the rows are
        compacted again, the width kept)."""
        nonzero = _algorithms.is_nonzero(self._data)
        data = fn(self._data)  # a new array
        data[~nonzero] = 0
        if bool((nonzero & ~_algorithms.is_nonzero(data)).any()):  # host sync on the GPU
            rows, cols, _ = self._coo_arrays()
            vals = data[nonzero]
            keep = _algorithms.is_nonzero(vals)
            src = _convert.CSR(*_algorithms.coo_to_csr(rows[keep], cols[keep], vals[keep],
                                                       self.shape[0]), self.shape)
            out = ELLMatrix.__new__(ELLMatrix)
            out._from_csr(src, self.width)
            return out
        return ELLMatrix._wrap(data, self._indices.copy(), self.shape)

    def _sum(self, axis):
        """float64 sums in a fixed order, memory in proportion to the result and the storage:
        row sums add each row's slots (padding holds zeros), column sums each column's
        entries in row order (twell._algorithms.column_sums), the total the row sums."""
        cast = _backend.backend(_arrays.array_module(self._data)).cast
        with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are entries
            if axis == 0:
                _, cols, vals = self._coo_arrays()
                return _algorithms.column_sums(cols, cast(vals, np.float64), self.shape[1])
            sums = cast(self._data, np.float64).sum(axis=1)
            return sums.sum() if axis is None else sums

    def tocsr(self, copy=False):
        """scipy ``csr_array`` (host) or cupyx ``csr_matrix`` (device)."""
        return self._twell_form().tocsr()

    def get(self):
        """Host copy (itself when already on the host)."""
        if not _arrays.is_cupy_array(self._data):
            return self
        return ELLMatrix._wrap(self._data.get(), self._indices.get(), self.shape)

    def astype(self, dtype, casting="unsafe", copy=True):
        """Cast the values (entries that become zero are dropped); ``dtype``: float64,
        float32, float16 or bfloat16 (another is a TypeError that names them)."""
        dtype = astype_dtype(dtype)
        if dtype == self.dtype:
            return self.copy() if copy else self
        return ELLMatrix(self, dtype=dtype)

    def copy(self):
        """Deep copy."""
        return ELLMatrix._wrap(self._data.copy(), self._indices.copy(), self.shape)

    def _transpose(self):
        return ELLMatrix(self.to_twell()._transpose())

    def _twell_form(self, build=True):
        """The matrix as a TwELLMatrix (slots by ``"auto"``), packed once and cached for the
        products; keyed on the storage arrays, as the transpose is."""
        key = self._storage_key()
        cached = self.__dict__.get("_twell_cache")
        if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
            return cached[1]
        if not build:
            return None
        form = self.to_twell()
        self._twell_cache = (key, form)
        return form

    def _matmul_dense(self, other):
        """``A @ B`` through the cached TwELL form's SpMM."""
        return self._twell_form()._matmul_dense(other)
