"""Row-wise ELLPACK: the baseline format that TwELL refines."""

import numpy as np

from . import _algorithms, _arrays, _convert
from ._base import SparseMatrix
from ._validation import operator_index, value_dtype


class ELLMatrix(SparseMatrix):
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

    def __init__(self, arg, *, width=None, dtype=None):
        if isinstance(arg, SparseMatrix):
            src = arg._csr_input(dtype)
        else:
            src = _convert.coerce(arg, dtype)
            if src.kind == "dense":
                xp = _arrays.array_module(src.array)
                rows, cols = xp.nonzero(_algorithms.is_nonzero(src.array))
                src = _convert.CSR(*_algorithms.coo_to_csr(rows, cols, src.array[rows, cols],
                                                           src.shape[0]), src.shape)
        self._from_csr(src, width)

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
        self.data = xp.zeros((m, width), dtype=src.data.dtype)
        self.indices = xp.zeros((m, width), dtype=np.int32)
        self.data[rows, rank] = src.data
        self.indices[rows, rank] = src.indices
        self.shape = src.shape

    dtype = property(lambda self: self.data.dtype, doc="Value dtype.")
    _storage = property(lambda self: self.data)
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
        xp = _arrays.array_module(self.data)
        rows, slot = xp.nonzero(_algorithms.is_nonzero(self.data))  # sorted by (row, column)
        return rows, self.indices[rows, slot].astype(np.int64), self.data[rows, slot]

    def _csr_input(self, dtype=None):
        rows, cols, vals = self._coo()
        if dtype is None:
            return _convert.CSR(*_algorithms.coo_to_csr(rows, cols, vals, self.shape[0]),
                                self.shape)
        # Casting can turn entries into zeros: canonicalise again so that they leave.
        return _convert.csr_from_coo(rows, cols, vals, self.shape, value_dtype(dtype))

    def toarray(self):
        """Dense array (NumPy or CuPy, where the matrix lives)."""
        xp = _arrays.array_module(self.data)
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

    def get(self):
        """Host copy (itself when already on the host)."""
        if not _arrays.is_cupy_array(self.data):
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

    def __matmul__(self, other):
        """``A @ B`` through the TwELL SpMM (slots chosen by ``"auto"``)."""
        return self.to_twell() @ other

    def __rmatmul__(self, other):
        return other @ self.to_twell()
