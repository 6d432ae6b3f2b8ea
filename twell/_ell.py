"""Row-wise ELLPACK: the baseline format that TwELL refines."""

import numpy as np

from . import _algorithms, _backend, _convert
from ._validation import operator_index, value_dtype


class ELLMatrix:
    """Sparse matrix in row-wise ELLPACK format.

    Every row stores ``width`` (value, column) slots: its non-zeros sorted by
    column, then zero padding. ``width`` is the length of the longest row
    unless given.

    Parameters
    ----------
    arg : array_like, sparse matrix, TwELLMatrix or ELLMatrix
        What to convert (anything :class:`TwELLMatrix` accepts).
    width : int, optional
        Slots per row; at least the longest row's length.
    dtype : dtype, optional
        Value dtype (float64, float32, float16 or bfloat16).

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
        Bytes of ``data`` and ``indices``.

    Raises
    ------
    ValueError
        When ``width`` is shorter than some row; the message names the row.

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
    ndim = 2
    __array_ufunc__ = None
    __array_priority__ = 100.0

    def __init__(self, arg, *, width=None, dtype=None):
        from ._twell import TwELLMatrix

        if isinstance(arg, ELLMatrix):
            rows, cols, vals = arg._coo()
            src = _convert.csr_from_coo(rows, cols, vals, arg.shape, dtype)
        elif isinstance(arg, TwELLMatrix):
            a = arg if dtype is None else arg.astype(dtype)
            indptr, indices, data = a._csr_arrays()
            src = _convert.CSR(indptr, indices, data, a.shape)
        else:
            src = _convert.coerce(arg, dtype)
            if src.kind == "dense":
                xp = _backend.array_module(src.array)
                rows, cols = xp.nonzero(_algorithms.is_nonzero(src.array))
                src = _convert.CSR(*_algorithms.coo_to_csr(rows, cols, src.array[rows, cols],
                                                           src.shape[0]), src.shape)
        self._from_csr(src, width)

    def _from_csr(self, src, width):
        xp = _backend.array_module(src.indptr)
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
        self.data = xp.zeros((m, width), dtype=src.data.dtype)
        self.indices = xp.zeros((m, width), dtype=np.int32)
        self.data[rows, rank] = src.data
        self.indices[rows, rank] = src.indices
        self.shape = src.shape

    dtype = property(lambda self: self.data.dtype, doc="Value dtype.")
    width = property(lambda self: self.data.shape[1], doc="Slots per row.")

    @property
    def nbytes(self):
        """Bytes of the storage arrays: ``M * width * (itemsize + 4)``.

        Examples
        --------
        >>> import numpy as np, twell
        >>> twell.ELLMatrix(np.eye(3, dtype=np.float32)).nbytes
        24
        """
        return int(self.data.nbytes + self.indices.nbytes)

    @property
    def nnz(self):
        """Number of stored non-zeros."""
        return int(_algorithms.is_nonzero(self.data).sum())

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
        from ._checks import validate_ell

        validate_ell(self.data, self.indices, self.shape)

    def _coo(self):
        xp = _backend.array_module(self.data)
        rows, slot = xp.nonzero(_algorithms.is_nonzero(self.data))  # sorted by (row, column)
        return rows, self.indices[rows, slot].astype(np.int64), self.data[rows, slot]

    def _as_csr_input(self, dtype=None):
        rows, cols, vals = self._coo()
        if dtype is None:
            return _convert.CSR(*_algorithms.coo_to_csr(rows, cols, vals, self.shape[0]),
                                self.shape)
        # Casting can turn entries into zeros: canonicalise again so that they leave.
        return _convert.csr_from_coo(rows, cols, vals, self.shape, value_dtype(dtype))

    def toarray(self):
        """Dense array (NumPy or CuPy, where the matrix lives)."""
        xp = _backend.array_module(self.data)
        out = xp.zeros(self.shape, dtype=self.dtype)
        rows, cols, vals = self._coo()
        out[rows, cols] = vals
        return out

    def tocsr(self):
        """scipy ``csr_array`` (host) or cupyx ``csr_matrix`` (device)."""
        return self.to_twell().tocsr()

    def tocoo(self):
        """scipy ``coo_array`` (host) or cupyx ``coo_matrix`` (device)."""
        return self.to_twell().tocoo()

    def to_twell(self, tile_width=256, slots="auto"):
        """Convert to :class:`TwELLMatrix`."""
        from ._twell import TwELLMatrix

        return TwELLMatrix(self, tile_width=tile_width, slots=slots)

    def get(self):
        """Host copy (itself when already on the host)."""
        if not _backend.is_cupy_array(self.data):
            return self
        out = ELLMatrix.__new__(ELLMatrix)
        out.data, out.indices, out.shape = self.data.get(), self.indices.get(), self.shape
        return out

    def astype(self, dtype):
        """Cast the values (entries that become zero are dropped)."""
        return ELLMatrix(self, dtype=dtype)

    def copy(self):
        """Deep copy."""
        out = ELLMatrix.__new__(ELLMatrix)
        out.data, out.indices, out.shape = self.data.copy(), self.indices.copy(), self.shape
        return out

    def transpose(self):
        """Transpose (width chosen again)."""
        return ELLMatrix(self.to_twell().T)

    T = property(transpose)

    def sum(self, axis=None):
        """Sum of the entries: a scalar (``axis=None``) or a 1-D array (``axis=0|1``).

        As :meth:`TwELLMatrix.sum`: float64 accumulation in a fixed order, the matrix dtype
        returned, memory in proportion to the result and the storage. Row sums add each
        row's slots (padding holds zeros), column sums each column's entries in row order,
        the total the row sums.

        Raises
        ------
        ValueError
            When ``axis`` is not None, 0, 1, -1 or -2.

        See Also
        --------
        scipy.sparse.csr_array.sum
        """
        if axis not in (None, 0, 1, -1, -2):
            raise ValueError(f"axis must be None, 0 or 1; got axis={axis!r}")
        be = _backend.backend(_backend.array_module(self.data))
        if axis is not None and axis % 2 == 0:
            _, cols, vals = self._coo()
            sums = _algorithms.column_sums(cols, be.cast(vals, np.float64), self.shape[1])
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are entries
                sums = be.cast(self.data, np.float64).sum(axis=1)
                if axis is None:
                    return be.cast(sums.sum().reshape(1), self.dtype).reshape(())[()]
        return be.cast(sums, self.dtype)

    def __matmul__(self, other):
        """``A @ B`` through the TwELL SpMM (slots chosen by ``"auto"``)."""
        return self.to_twell() @ other

    def __rmatmul__(self, other):
        return other @ self.to_twell()
