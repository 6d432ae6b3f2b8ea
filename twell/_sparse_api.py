"""scipy.sparse's common sparse-array API for twell's matrices.

:class:`SparseArrayAPI` is the part of :class:`twell._base.SparseMatrix` that makes a
:class:`~twell.TwELLMatrix` or an :class:`~twell.ELLMatrix` behave as a scipy sparse array does.
Each operation either runs natively on the format's own arrays (a value map, a row selection,
a reduction, the products with dense operands) or goes through the CSR type of the array
library that holds the matrix: scipy's ``csr_array`` on the host, cupyx's ``csr_matrix`` on the
GPU, as scipy's own DIA and BSR formats go through CSR. Those return what scipy or cupyx return
for their own formats. 16-bit values go through CSR as float32 (:mod:`twell._dtypes`).

A container provides, besides ``shape``, ``dtype``, ``nnz``, ``nbytes``, ``tocsr()``, ``copy()``,
``get()`` and ``validate()``:

``_storage_key()``
    Its storage arrays, whose identity keys the caches (:meth:`SparseArrayAPI._transposed`).
``_csr_input(dtype)``, ``_coo_arrays()``, ``_to_dense()``
    Its entries as canonical CSR (:class:`twell._convert.CSR`), as ``(rows, cols, values)``
    sorted by (row, column) with int64 indices, and as a dense C-ordered array.
``_map_values(fn)``
    The same structure with ``fn`` applied to the stored values (entries that become zero
    leave), in the same format.
``_take_rows(rows)``
    The rows ``rows`` (int64 on the matrix's array module), in the same format.
``_from_canonical(src)``, ``_replace(src)``
    A new matrix of this format and layout from a canonical CSR, and the same in place (for
    ``resize``).
``_transpose()``, ``_sum(axis)``, ``_matmul_dense(b)``
    A new transposed matrix, float64 sums (a scalar array for ``axis=None``), and the product
    with a dense vector or matrix.
``_fast_matvec(x)`` (optional)
    ``self @ x`` by a shorter path for the vectors it takes, None for others.
"""

import math
import operator

import numpy as np
import scipy.sparse as sp

from . import _algorithms, _arrays, _backend, _convert, _dtypes, _indexing
from ._arguments import check_shape
from ._dtypes import SUPPORTED_DTYPES, bfloat16, result_dtype

#: The formats scipy's ``asformat`` knows, reached through CSR.
SCIPY_FORMATS = ("csr", "csc", "coo", "bsr", "dia", "dok", "lil")

#: NumPy's unary ufuncs that map zero to zero, which scipy's sparse arrays offer as methods
#: (``A.sin()``, and ``numpy.sin(A)`` through NumPy's object-array protocol).
UFUNCS_AT_ZERO = ("sin", "tan", "arcsin", "arctan", "sinh", "tanh", "arcsinh", "arctanh",
                  "rint", "sign", "expm1", "log1p", "deg2rad", "rad2deg", "floor", "ceil",
                  "trunc", "sqrt")

_FLOAT32 = np.dtype(np.float32)

_IMMUTABLE = (
    "{cls} does not support item assignment: the structure of a TwELL or ELL matrix (its "
    "counts, slots and overflow) is fixed once packed. Edit a scipy copy and pack it again, "
    "e.g. B = A.tocsr(); B[i, j] = v; A = twell.{cls}(B)"
)


_SCALAR_MATMUL = ("matmul: other must be 1-D or 2-D, not a scalar (scipy refuses scalar operands "
                  "of @); use * for the product with a scalar")


def _is_dense(x):
    return isinstance(x, np.ndarray) or _arrays.is_cupy_array(x)


def _is_scalar(x):
    """scipy's ``isscalarlike``: a scalar or a 0-d array."""
    return np.isscalar(x) or (_is_dense(x) and x.ndim == 0)


def _is_sparse(x):
    return (isinstance(x, SparseArrayAPI) or sp.issparse(x)
            or _arrays.is_cupyx_sparse(x))


def _as_csr(x):
    """A sparse operand in the form scipy/cupyx take: twell's matrices become their CSR
    (:meth:`SparseArrayAPI._csr_operand`: read-only where it is kept storage, for
    operations whose results :func:`_private` copies where they share it)."""
    return x._csr_operand() if isinstance(x, SparseArrayAPI) else x


def _private(result):
    """``result`` of an operation on :meth:`SparseArrayAPI._csr_operand` arrays, copied where
    it holds a read-only array (one it shares with an operand's kept storage): the caller
    owns what it gets, writable, as scipy's results are."""
    arrays = ([result] if isinstance(result, np.ndarray)
              else [getattr(result, n, None) for n in ("data", "indices", "indptr", "coords")])
    for a in arrays:
        for x in (a if isinstance(a, tuple) else (a,)):
            if isinstance(x, np.ndarray) and not x.flags.writeable:
                return result.copy()
    return result


def _unknown(other):
    """Whether ``other`` is neither array-like nor sparse: then an operator returns
    NotImplemented, so that ``other``'s reflected method may answer (as in scipy)."""
    a = np.asanyarray(other)
    return a.ndim == 0 and a.dtype == object


def _axis(axis):
    """A reduction's axis: None (every element), 0 or 1, with scipy's errors."""
    if isinstance(axis, tuple):
        if len(axis) == 1:
            axis = axis[0]
        else:
            if len(set(axis)) != len(axis):
                raise ValueError(f"duplicate value in axis={axis!r}")
            for a in axis:
                _axis(a)
            return None
    if axis is None:
        return None
    if not _indexing.is_int(axis):
        raise TypeError(f"axis must be an integer, a tuple of integers or None; got axis={axis!r}")
    axis = operator.index(axis)
    if not -2 <= axis < 2:
        raise ValueError(f"axis out of range: axis must be None, 0 or 1; got axis={axis}")
    return axis % 2


def _reduced_shape(shape, axis):
    return () if axis is None else (shape[1 - axis],)


def _finish(result, dtype, out, shape, cast):
    """A reduction's float64 ``result`` in ``dtype``, written into ``out`` if given."""
    if out is not None:
        if tuple(out.shape) != shape:
            raise ValueError(
                f"output parameter out has the wrong dimensions: its shape must be {shape} "
                f"(the reduction's shape); got out.shape={out.shape}"
            )
        out[...] = result
        return out
    dtype = np.dtype(dtype)
    if dtype in SUPPORTED_DTYPES:
        result = cast(result.reshape(-1), dtype).reshape(result.shape)
    else:
        result = result.astype(dtype)
    return result[()] if result.ndim == 0 else result


def _ufunc_method(name):
    def method(self):
        ufunc = getattr(self._xp, name)
        fn = ufunc
        if self.dtype == bfloat16:  # computed in float32, rounded once, as ml_dtypes does
            cast = self._cast

            def fn(values):
                return cast(ufunc(cast(values, _FLOAT32)), bfloat16)

        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self._map_values(fn)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"Element-wise {name} of the stored values, natively, in the same format "
        f"(``numpy.{name}(A)`` calls it). See ``numpy.{name}``.\n\n"
        "float16 values compute as NumPy computes them, bfloat16 values in float32 with one "
        "rounding. Entries that become zero leave the matrix."
    )
    return method


def _sign_bits(values, op):
    """``op`` on the sign bit of each value (negation, absolute value): exact for every
    dtype on both backends, 16-bit ones included."""
    utype = {8: np.uint64, 4: np.uint32, 2: np.uint16}[values.dtype.itemsize]
    sign = utype(1 << (8 * values.dtype.itemsize - 1))
    return op(values.view(utype), sign).view(values.dtype)


class SparseArrayAPI:
    """The common API of scipy's sparse arrays (see the module docstring)."""

    #: Entries that ``str(A)`` lists at most (scipy's ``maxprint``).
    maxprint = 50

    # -- helpers ------------------------------------------------------------

    @property
    def _cast(self):
        """The backend's value cast (keeps subnormals)."""
        return _backend.backend(self._xp).cast

    def _via_csr(self):
        """This matrix as the CSR type of its array library, float32 for 16-bit values:
        what operations through CSR compute on."""
        dtype = _dtypes.scipy_dtype(self.dtype)
        return (self if dtype == self.dtype else self.astype(dtype, copy=False)).tocsr()

    def _csr_operand(self):
        """:meth:`_via_csr` for an operation whose result goes through :func:`_private`: a
        format that keeps host CSR hands it out without a copy, read-only."""
        return self._via_csr()

    def _kept_csr(self):
        """The host CSR this matrix keeps, as :meth:`_csr_operand` hands it out (read-only,
        no copy), or None where it keeps none (the GPU, other formats)."""
        return None

    def _csr_op(self, fn, other):
        """``fn(C, other)`` for this matrix's CSR ``C`` (:meth:`_csr_operand`, the result
        made the caller's own by :func:`_private`): an element-wise operation through the
        CSR type of the array library.

        cupyx's element-wise operations divide by the operands' row and column counts, and
        its sparse sum allocates what cuSPARSE reports for an empty matrix (garbage): where
        an operand has no elements on the GPU, the result is cupyx's type and dtype for
        1 x 1 operands of the same types and dtypes, empty, of the broadcast shape.
        """
        shape = getattr(other, "shape", ())
        if self._xp is np or (math.prod(self.shape) and math.prod(shape)):
            return _private(fn(self._csr_operand(), other))
        cs = _arrays.cupyx_sparse()
        one = cs.csr_matrix((1, 1), dtype=_dtypes.scipy_dtype(self.dtype))
        if _is_sparse(other):
            probe = cs.csr_matrix((1, 1), dtype=other.dtype)
        elif _is_dense(other) and other.ndim:
            probe = self._xp.zeros((1,) * other.ndim, other.dtype)
        else:
            probe = other
        result = fn(one, probe)
        shape = np.broadcast_shapes(self.shape, tuple(shape))
        if _arrays.is_cupyx_sparse(result):
            return type(result)(shape, dtype=result.dtype)
        return self._xp.zeros(shape, result.dtype)

    def _scalar_op(self, op, scalar):
        fn, _ = _dtypes.scalar_map(op, scalar, self.dtype, self._cast)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            return self._map_values(fn)

    # -- attributes ---------------------------------------------------------

    @property
    def size(self):
        """Number of stored values, as scipy's ``size`` (the same as :attr:`nnz`)."""
        return self.nnz

    @property
    def real(self):
        """The real part: a copy (the values are real)."""
        return self.copy()

    @property
    def imag(self):
        """The imaginary part: an empty matrix of the same shape, format and dtype."""
        xp = self._xp
        m, k = self.shape
        return self._from_canonical(_convert.CSR(
            xp.zeros(m + 1, dtype=np.int64), xp.zeros(0, dtype=np.int32),
            xp.zeros(0, dtype=self.dtype), self.shape))

    def conjugate(self, copy=True):
        """Complex conjugate: the matrix itself (a copy unless ``copy=False``)."""
        return self.copy() if copy else self

    def conj(self, copy=True):
        """Same as :meth:`conjugate`."""
        return self.conjugate(copy=copy)

    # -- canonical format ---------------------------------------------------
    # The formats are canonical by construction (each (row, column) once, no explicit zeros,
    # the columns in the format's order): scipy code that canonicalises a matrix it built runs
    # unchanged.

    @property
    def has_canonical_format(self):
        """True: no duplicate entries, no explicit zeros and the columns in the format's
        canonical order, as scipy's ``has_canonical_format`` says of a canonical CSR matrix."""
        return True

    @property
    def has_sorted_indices(self):
        """True: the columns ascend within each row (ELL) or within each (row, tile)'s slots
        and each row's overflow (TwELL)."""
        return True

    def sum_duplicates(self):
        """Nothing to do: the constructors sum duplicates (in place for scipy; returns None)."""

    def eliminate_zeros(self):
        """Nothing to do: no explicit zeros are stored (in place for scipy; returns None)."""

    def sort_indices(self):
        """Nothing to do: the columns are in order (in place for scipy; returns None)."""

    def prune(self):
        """Nothing to trim: scipy cuts its arrays to ``nnz``, and the padding of the slots is
        part of the layout (returns None)."""

    def sorted_indices(self):
        """A copy, as scipy returns one with sorted indices (these are sorted already)."""
        return self.copy()

    def check_format(self, full_check=True):
        """scipy's format check: :meth:`validate`, which checks every invariant of the storage
        whatever ``full_check`` and raises TypeError or ValueError naming a broken one."""
        self.validate()

    # -- dense output ---------------------------------------------------------

    def toarray(self, order=None, out=None):
        """Dense array (NumPy or CuPy, where the matrix lives).

        Parameters
        ----------
        order : {None, "C", "F"}, optional
            Memory order of the result (C by default).
        out : ndarray, optional
            Array of the matrix's shape and dtype, on the same device, to write into (every
            element is written); returned.

        See Also
        --------
        scipy.sparse.csr_array.toarray
        """
        if out is not None:
            if order is not None:
                raise ValueError(f"order and out cannot both be given; got order={order!r}")
            _arrays.array_module(self._storage, out)  # no copy between host and device
            if tuple(out.shape) != self.shape or out.dtype != self.dtype:
                raise ValueError(
                    f"out must have the matrix's shape {self.shape} and dtype {self.dtype}; "
                    f"got out.shape={out.shape}, out.dtype={out.dtype}"
                )
            out[...] = self._to_dense()
            return out
        if order not in (None, "C", "F"):
            raise ValueError(f"order must be None, 'C' or 'F'; got order={order!r}")
        dense = self._to_dense()
        return self._xp.asfortranarray(dense) if order == "F" else dense

    def todense(self, order=None, out=None):
        """Same as :meth:`toarray` (a sparse array's ``todense`` returns an ndarray)."""
        return self.toarray(order=order, out=out)

    # -- conversions ----------------------------------------------------------

    def tocoo(self, copy=False):
        """Convert to ``scipy.sparse.coo_array`` (host) or cupyx's ``coo_matrix`` (GPU)."""
        return self.tocsr().tocoo()

    def tocsc(self, copy=False):
        """Convert to scipy's ``csc_array`` (host) or cupyx's ``csc_matrix`` (GPU), through
        CSR."""
        return self.tocsr().tocsc()

    def tobsr(self, blocksize=None, copy=False):
        """Convert to scipy's ``bsr_array`` through CSR (host only: cupyx has no BSR)."""
        return self.tocsr().tobsr(blocksize=blocksize)

    def todia(self, copy=False):
        """Convert to scipy's ``dia_array`` through CSR (cupyx's CSR converts as it can)."""
        return self.tocsr().todia()

    def todok(self, copy=False):
        """Convert to scipy's ``dok_array`` through CSR (host only)."""
        return self.tocsr().todok()

    def tolil(self, copy=False):
        """Convert to scipy's ``lil_array`` through CSR (host only)."""
        return self.tocsr().tolil()

    def asformat(self, format, copy=False):
        """This matrix in another format.

        Parameters
        ----------
        format : str or None
            twell's formats (``"twell"``, ``"ell"``), scipy's (``"csr"``, ``"csc"``, ``"coo"``,
            ``"bsr"``, ``"dia"``, ``"dok"``, ``"lil"``), or ``"array"``/``"dense"`` for a dense
            array; None or the matrix's own format for itself.
        copy : bool, optional
            With the matrix's own format, return a copy.
        """
        if format is None or format == self.format:
            return self.copy() if copy else self
        if format in ("array", "dense"):
            return self.toarray()
        if format in self._formats or format in SCIPY_FORMATS:
            return getattr(self, "to" + format)(copy=copy)
        twell_formats = sorted(self._formats, reverse=True)  # "twell", "ell"
        known = ", ".join(repr(f) for f in (*twell_formats, *SCIPY_FORMATS, "array", "dense"))
        raise ValueError(f"format must be one of {known}; got format={format!r}")

    # -- shape ----------------------------------------------------------------

    def reshape(self, *args, **kwargs):
        """A matrix of another shape holding the same elements, as scipy reshapes.

        ``reshape(shape, order="C", copy=False)``: the matrix itself (a copy with
        ``copy=True``) when the shape is unchanged, else scipy's (or cupyx's) COO reshaped.
        """
        unknown = set(kwargs) - {"order", "copy"}
        if unknown:
            raise TypeError(f"reshape() got unexpected keyword arguments {sorted(unknown)}")
        order, copy = kwargs.get("order", "C"), kwargs.get("copy", False)
        shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        shape = tuple(shape)
        size = math.prod(self.shape)
        if len(shape) == 2 and sum(1 for s in shape if s == -1) == 1:
            known = math.prod(s for s in shape if s != -1)
            if known and size % known == 0:
                shape = tuple(size // known if s == -1 else s for s in shape)
        if shape == self.shape:
            return self.copy() if copy else self
        kept = self._kept_csr()
        if kept is None:
            return self._via_csr().tocoo().reshape(shape, order=order)
        # The kept rows' COO: new row and column indices, the values copied once (the
        # reshape builds new coordinates and keeps the values it is given).
        coo = kept.tocoo()
        coo.data = coo.data.copy()
        return coo.reshape(shape, order=order)

    def resize(self, *shape):
        """Resize in place to ``shape``: entries inside it stay, the others leave.

        The matrix's storage arrays are replaced (its cached transpose goes with them).
        """
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if len(shape) != 2:
            raise ValueError(f"shape must be (M, K) for a 2-D matrix; got shape={shape!r}")
        m, k = check_shape(shape)
        # The canonical rows cut or extended as they are: the first min(M, m) rows, their
        # columns below k (an order-keeping mask), empty rows after. Still canonical.
        src = self._csr_input()
        xp = self._xp
        rows = min(m, self.shape[0])
        end = int(src.indptr[rows])  # a host sync on the GPU
        indptr = src.indptr[:rows + 1]
        indices, data = src.indices[:end], src.data[:end]
        if k < self.shape[1]:
            indptr, indices, data = _algorithms.kept_rows(indptr, indices < k, indices, data)
        else:  # _csr_input's indices are a new array; its values may be the kept ones
            data = data.copy()
        indptr = xp.concatenate([indptr, xp.repeat(indptr[-1:], m - rows)])
        self._replace(_convert.CSR(indptr, indices, data, (m, k)))

    def transpose(self, axes=None, copy=False):
        """The transpose, built once and cached on the matrix (see :attr:`has_transpose`).

        ``A.T`` and ``A.transpose()`` return the cached matrix, which shares its arrays with
        the cache (as scipy's transpose shares its arrays with the matrix): write into a copy
        (``transpose(copy=True)``), not into its arrays.

        See Also
        --------
        scipy.sparse.csr_array.transpose
        """
        if axes is not None and (not isinstance(axes, (tuple, list)) or tuple(axes) != (1, 0)):
            raise ValueError(f"axes must be None or (1, 0); got axes={axes!r}")
        t = self._transposed()
        return t.copy() if copy else t

    T = property(transpose, doc="The transpose (see :meth:`transpose`).")
    mT = property(transpose, doc="The matrix transpose, as scipy's sparse arrays name it "
                                 "(the same as :attr:`T` for a 2-D matrix).")

    def _transposed(self):
        """The cached transpose, rebuilt when the storage arrays are not those it was built
        from."""
        key = self._storage_key()
        cached = self.__dict__.get("_transpose_cache")
        if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
            return cached[1]
        t = self._transpose()
        self._transpose_cache = (key, t)
        return t

    @property
    def has_transpose(self):
        """Whether the matrix holds its transpose, which ``A.T``, ``x @ A``, ``rmatvec`` and
        column sums use: built on first use, counted in :attr:`nbytes`, and dropped when the
        storage arrays are replaced. After writing into the storage arrays in place, set this
        to False (True builds it now)."""
        cached = self.__dict__.get("_transpose_cache")
        return cached is not None and all(
            a is b for a, b in zip(cached[0], self._storage_key(), strict=True))

    @has_transpose.setter
    def has_transpose(self, value):
        if value:
            self.__dict__.pop("_transpose_cache", None)
            self._transposed()
        else:
            self.__dict__.pop("_transpose_cache", None)

    def _cache_nbytes(self):
        """Bytes of the cached transpose (0 without one)."""
        return self._transposed().nbytes if self.has_transpose else 0

    # -- linear operator ----------------------------------------------------

    def matvec(self, x):
        """``A @ x`` for a vector ``x`` of shape (K,) or (K, 1): what
        ``scipy.sparse.linalg.aslinearoperator`` and cupyx's call."""
        return self @ x  # which takes the format's fast path first (_fast_matvec)

    def rmatvec(self, x):
        """``A.T @ x`` (the adjoint for real values) through the cached transpose."""
        return self._transposed() @ x

    def matmat(self, x):
        """``A @ X`` for a dense matrix ``X``."""
        return self @ x

    def rmatmat(self, x):
        """``A.T @ X`` through the cached transpose."""
        return self._transposed() @ x

    # -- reductions -----------------------------------------------------------

    def sum(self, axis=None, dtype=None, out=None):
        """Sum of the elements (a scalar, ``axis=None``) or along an axis (a 1-D array).

        Natively, accumulated in float64 in a fixed order (deterministic on both backends),
        rounded once to ``dtype`` (default: the matrix's). An integer or boolean ``dtype``
        applies to the elements before they are summed, as in NumPy and scipy (1.18 on):
        ``sum(dtype=int)`` of 0.6 and 0.7 is 0, and the float64 sum of the truncated elements
        is exact while it stays within 2**53. ``out``: an array of the result's shape to
        write into, as in scipy.

        See Also
        --------
        scipy.sparse.csr_array.sum
        """
        axis = _axis(axis)
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        a = self
        if dtype.kind in "biu":
            # NumPy's float -> bool and float -> integer casts, kept as float64 values.
            a = self.astype(np.float64, copy=False)
            a = a._map_values((lambda v: (v != 0).astype(v.dtype)) if dtype.kind == "b"
                              else self._xp.trunc)
        return _finish(a._sum(axis), dtype, out, _reduced_shape(self.shape, axis),
                       self._cast)

    def mean(self, axis=None, dtype=None, out=None):
        """Mean of the elements or along an axis: the float64 sum divided by the count,
        rounded once to ``dtype`` (default: the matrix's)."""
        axis = _axis(axis)
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        count = math.prod(self.shape) if axis is None else self.shape[axis]
        with np.errstate(invalid="ignore", divide="ignore"):
            result = self._sum(axis) / np.float64(count)
        return _finish(result, dtype, out, _reduced_shape(self.shape, axis), self._cast)

    def count_nonzero(self, axis=None):
        """Non-zero entries of the whole matrix (an int) or of each row or column (int64).

        Every stored entry is non-zero (NaN included), so ``count_nonzero()`` is :attr:`nnz`.
        """
        axis = _axis(axis)
        if axis is None:
            return self.nnz
        kept = self._kept_csr()
        if kept is not None:  # the host's compressed rows: their lengths, or a histogram
            if axis == 1:
                return np.diff(kept.indptr).astype(np.int64)
            return np.bincount(kept.indices, minlength=self.shape[1]).astype(np.int64)
        rows, cols, _ = self._coo_arrays()
        # Rows come sorted; columns are sorted first. count_sorted's memory follows the keys
        # (CuPy's bincount would hold a histogram of the axis' length per thread block).
        keys = rows if axis == 1 else self._xp.sort(cols)
        return _algorithms.count_sorted(keys, self.shape[1 - axis]).astype(np.int64)

    def nonzero(self):
        """``(rows, cols)`` of the non-zero entries, sorted by row then column (int64)."""
        rows, cols, _ = self._coo_arrays()
        return rows, cols

    def diagonal(self, k=0):
        """The ``k``-th diagonal, natively (``A[i, i + k]``), as a dense 1-D array."""
        k = operator.index(k)
        m, n = self.shape
        xp = self._xp
        length = max(0, min(m + min(k, 0), n - max(k, 0)))
        out = xp.zeros(length, dtype=self.dtype)
        if length:
            rows, cols, vals = self._coo_arrays()
            on = (cols - rows) == k
            out[(rows if k >= 0 else cols)[on]] = vals[on]
        return out

    def trace(self, offset=0):
        """Sum of the ``offset``-th diagonal."""
        return self.diagonal(offset).sum()

    def _through_csr(self, name, *args, **kwargs):
        fn = getattr(self._csr_operand(), name, None)
        if fn is None:
            raise NotImplementedError(
                f"{name} goes through CSR, and cupyx.scipy.sparse's csr_matrix has no {name}: "
                f"use A.get().{name}(...) for a host result"
            )
        return _private(fn(*args, **kwargs))

    def max(self, axis=None, out=None, *, explicit=False):
        """Maximum, through CSR (see ``scipy.sparse.csr_array.max``)."""
        return self._through_csr("max", axis=axis, out=out, explicit=explicit)

    def min(self, axis=None, out=None, *, explicit=False):
        """Minimum, through CSR (see ``scipy.sparse.csr_array.min``)."""
        return self._through_csr("min", axis=axis, out=out, explicit=explicit)

    def nanmax(self, axis=None, out=None, *, explicit=False):
        """Maximum ignoring NaN, through CSR (see ``scipy.sparse.csr_array.nanmax``)."""
        return self._through_csr("nanmax", axis=axis, out=out, explicit=explicit)

    def nanmin(self, axis=None, out=None, *, explicit=False):
        """Minimum ignoring NaN, through CSR (see ``scipy.sparse.csr_array.nanmin``)."""
        return self._through_csr("nanmin", axis=axis, out=out, explicit=explicit)

    def argmax(self, axis=None, out=None, *, explicit=False):
        """Index of the maximum, through CSR (see ``scipy.sparse.csr_array.argmax``)."""
        kwargs = {"explicit": explicit} if explicit else {}
        return self._through_csr("argmax", axis=axis, out=out, **kwargs)

    def argmin(self, axis=None, out=None, *, explicit=False):
        """Index of the minimum, through CSR (see ``scipy.sparse.csr_array.argmin``)."""
        kwargs = {"explicit": explicit} if explicit else {}
        return self._through_csr("argmin", axis=axis, out=out, **kwargs)

    # -- element-wise, natively ---------------------------------------------

    def __neg__(self):
        return self._map_values(lambda v: _sign_bits(v, operator.xor))

    def __abs__(self):
        return self._map_values(lambda v: _sign_bits(v, lambda bits, sign: bits & ~sign))

    def __round__(self, ndigits=0):
        xp, cast = self._xp, self._cast
        if self.dtype == bfloat16:
            return self._map_values(
                lambda v: cast(xp.around(cast(v, _FLOAT32), ndigits), bfloat16))
        return self._map_values(lambda v: xp.around(v, ndigits))

    def power(self, n, dtype=None):
        """Element-wise power of the stored values, natively (``A ** n`` too).

        ``n`` is a non-zero real scalar (zero would make every element one); ``dtype``
        casts first. Rounded as NumPy rounds ``values ** n`` for the value dtype.
        """
        if not _is_scalar(n):
            raise NotImplementedError("power: the exponent must be a scalar (element-wise)")
        if not _dtypes.is_real_scalar(n):
            raise TypeError(f"power: the exponent must be a real number; got {n!r}")
        if n == 0:
            raise NotImplementedError(
                "power with exponent 0 would make every element 1 (dense); use "
                "numpy.ones(A.shape, dtype=A.dtype)"
            )
        a = self if dtype is None else self.astype(dtype, copy=False)
        return a._scalar_op(np.power, n)

    def __pow__(self, n):
        return self.power(n)

    def multiply(self, other):
        """Element-wise product: natively with a scalar (the same format), through CSR
        with a sparse or dense operand (what scipy or cupyx return)."""
        if _is_scalar(other) or _dtypes.is_number(other):
            return self._scalar_op(np.multiply, _dtypes.check_scalar(other, "*"))
        if _is_sparse(other):
            return self._csr_op(lambda a, b: a.multiply(b), _as_csr(other))
        if not _is_dense(other) and _unknown(other):
            return NotImplemented
        return self._csr_op(lambda a, b: a.multiply(b), other)

    def __mul__(self, other):
        return self.multiply(other)

    def __rmul__(self, other):
        return self.multiply(other)

    def __truediv__(self, other):
        if _is_scalar(other) or _dtypes.is_number(other):
            return self._scalar_op(np.true_divide, _dtypes.check_scalar(other, "/"))
        if _is_sparse(other):
            return self._csr_op(operator.truediv, _as_csr(other))
        if not _is_dense(other) and _unknown(other):
            return NotImplemented
        return self._csr_op(operator.truediv, other)

    def __rtruediv__(self, other):
        if _is_sparse(other):  # a scipy/cupyx matrix, whose __truediv__ did not know twell's
            return self._csr_op(lambda a, b: b / a, _as_csr(other))
        # As in scipy: dividing a scalar or a dense array by a sparse matrix is not offered.
        return NotImplemented

    def maximum(self, other):
        """Element-wise maximum with a scalar, dense or sparse operand, through CSR."""
        return self._csr_op(lambda a, b: a.maximum(b), _as_csr(other))

    def minimum(self, other):
        """Element-wise minimum with a scalar, dense or sparse operand, through CSR."""
        return self._csr_op(lambda a, b: a.minimum(b), _as_csr(other))

    # -- addition -------------------------------------------------------------

    def _dense_operand(self, other):
        """A dense operand broadcast to the matrix's shape (scipy's rule)."""
        return self._xp.broadcast_to(np.asarray(other) if isinstance(other, np.matrix)
                                     else other, self.shape)

    def _dense_op(self, op, a, b):
        """``op(a, b)`` for dense arrays in NumPy's result dtype (bfloat16 in float32)."""
        dtype = result_dtype(a.dtype, b.dtype)
        cast = self._cast
        if dtype == bfloat16:
            return cast(op(cast(a, _FLOAT32), cast(b, _FLOAT32)), bfloat16)
        return op(a if a.dtype == dtype else cast(a, dtype),
                  b if b.dtype == dtype else cast(b, dtype))

    def __add__(self, other):
        if _is_scalar(other):
            if other == 0:
                return self.copy()
            raise NotImplementedError(
                "adding a non-zero scalar to a sparse matrix would make every element "
                "non-zero; use A.toarray() + s for the dense result"
            )
        if _is_sparse(other):
            if tuple(other.shape) != self.shape:
                raise ValueError(f"inconsistent shapes: {self.shape} and {other.shape}")
            return self._csr_op(operator.add, _as_csr(other))
        if _is_dense(other):
            other = self._dense_operand(other)
            # Natively: the dense operand plus the entries, in NumPy's result dtype.
            dtype = result_dtype(self.dtype, other.dtype)
            work = _FLOAT32 if dtype == bfloat16 else dtype
            out = self._cast(other, work)
            rows, cols, vals = self._coo_arrays()
            out[rows, cols] += self._cast(vals, work)
            return out if work == dtype else self._cast(out, dtype)
        return NotImplemented

    def __radd__(self, other):
        return self.__add__(other)

    def __sub__(self, other):
        if _is_scalar(other):
            if other == 0:
                return self.copy()
            raise NotImplementedError(
                "subtracting a non-zero scalar from a sparse matrix would make every element "
                "non-zero; use A.toarray() - s for the dense result"
            )
        if _is_sparse(other):
            if tuple(other.shape) != self.shape:
                raise ValueError(f"inconsistent shapes: {self.shape} and {other.shape}")
            return self._csr_op(operator.sub, _as_csr(other))
        if _is_dense(other):
            return self._dense_op(operator.sub, self.toarray(), self._dense_operand(other))
        return NotImplemented

    def __rsub__(self, other):
        if _is_sparse(other):  # a scipy/cupyx matrix, whose __sub__ did not know twell's
            if tuple(other.shape) != self.shape:
                raise ValueError(f"inconsistent shapes: {other.shape} and {self.shape}")
            return self._csr_op(lambda a, b: b - a, _as_csr(other))
        if _is_scalar(other):
            if other == 0:
                return -self
            raise NotImplementedError(
                "subtracting a sparse matrix from a non-zero scalar would make every element "
                "non-zero; use s - A.toarray() for the dense result"
            )
        if _is_dense(other):
            return self._dense_op(operator.sub, self._dense_operand(other), self.toarray())
        return NotImplemented

    # -- comparisons ----------------------------------------------------------

    def _comparison(self, other, op):
        """Element-wise, through CSR: what scipy (cupyx) returns for its CSR type."""
        if _is_sparse(other):
            if tuple(other.shape) != self.shape:
                if op in (operator.eq, operator.ne):
                    return op is operator.ne  # scipy's answer for unequal shapes
                raise ValueError(f"inconsistent shapes: {self.shape} and {other.shape}")
            return self._csr_op(op, _as_csr(other))
        if not (_is_dense(other) or _is_scalar(other)) and _unknown(other):
            return NotImplemented
        return self._csr_op(op, other)

    def __eq__(self, other):
        return self._comparison(other, operator.eq)

    def __ne__(self, other):
        return self._comparison(other, operator.ne)

    def __lt__(self, other):
        return self._comparison(other, operator.lt)

    def __gt__(self, other):
        return self._comparison(other, operator.gt)

    def __le__(self, other):
        return self._comparison(other, operator.le)

    def __ge__(self, other):
        return self._comparison(other, operator.ge)

    __hash__ = None  # comparisons are element-wise, as in scipy

    # -- products -------------------------------------------------------------

    def _fast_matvec(self, x):
        """``self @ x`` by a format's fast path for a matrix-vector product, or None where
        it has none for ``x`` (the general path then runs)."""
        return None

    def __matmul__(self, other):
        fast = self._fast_matvec(other)
        if fast is not None:
            return fast
        if _is_scalar(other):
            raise ValueError(_SCALAR_MATMUL)
        if _is_sparse(other):
            if other.shape[0] != self.shape[1]:
                raise ValueError(
                    f"matmul: dimension mismatch, A.shape={self.shape} and other.shape="
                    f"{other.shape} (A.shape[1]={self.shape[1]} must equal other.shape[0]="
                    f"{other.shape[0]})"
                )
            return _private(self._csr_operand() @ _as_csr(other))
        if not _is_dense(other) and _unknown(other):
            return NotImplemented
        if isinstance(other, np.matrix):
            other = np.asarray(other)
        return self._matmul_dense(other)

    def __rmatmul__(self, other):
        if _is_scalar(other):
            raise ValueError(_SCALAR_MATMUL)
        if _is_sparse(other):
            return _private(_as_csr(other) @ self._csr_operand())
        if not _is_dense(other):
            if _unknown(other):
                return NotImplemented
            other = self._xp.asarray(other)
        if isinstance(other, np.matrix):
            other = np.asarray(other)
        if other.ndim not in (1, 2):
            raise ValueError(f"other must be 1-D or 2-D; got other.ndim={other.ndim}")
        if other.shape[-1] != self.shape[0]:
            raise ValueError(
                f"matmul: dimension mismatch, other.shape={other.shape} and A.shape="
                f"{self.shape} (other.shape[-1]={other.shape[-1]} must equal A.shape[0]="
                f"{self.shape[0]})"
            )
        t = self._transposed()
        return t._matmul_dense(other) if other.ndim == 1 else t._matmul_dense(other.T).T

    def dot(self, other):
        """``self * other`` for a scalar, else ``self @ other`` (scipy's ``dot``)."""
        return self * other if np.isscalar(other) else self @ other

    # -- indexing -------------------------------------------------------------

    def __getitem__(self, key):
        """``A[rows]``, ``A[rows, :]`` (a slice, an integer array or a boolean mask):
        the selected rows in the same format, natively. Any other index (one row, elements,
        columns) goes through CSR and returns what scipy (cupyx) returns; an integer row or
        slice is cut natively first, so ``A[i, j]`` converts one row only."""
        split = _indexing.split_key(key)
        if split is not None:
            selected = _indexing.rows_of(split[0], self.shape[0], self._xp)
            if selected is not None:
                kind, rows = selected
                if kind == "rows" and _indexing.is_full(split[1]):
                    return self._take_rows(rows)
                kept = self._kept_csr() if kind == "int" or isinstance(split[0], slice) else None
                if kept is not None:
                    # The kept rows indexed by scipy in place (A[i, j] in 0.01 ms, not the
                    # 0.1 of cutting the row first); results sharing them are copied.
                    result = kept[rows if kind == "int" else split[0], split[1]]
                    if _is_scalar(result) and self.dtype in _dtypes.SIXTEEN_BIT:
                        return self.dtype.type(result)  # exact: a 16-bit value in float32
                    return _private(result)
                if kind == "int":
                    one = self._take_rows(self._xp.asarray([rows], dtype=np.int64))
                    result = one._via_csr()[0, split[1]]
                    if _is_scalar(result) and self.dtype in _dtypes.SIXTEEN_BIT:
                        # exact: a 16-bit value, computed in float32
                        return (self.dtype.type(result) if self._xp is np
                                else result.astype(self.dtype))
                    return result
                if _indexing.is_full(split[0]):  # every row: the CSR type alone
                    return _private(self._csr_operand()[:, split[1]])
                if isinstance(split[0], slice):
                    return self._take_rows(rows)._via_csr()[:, split[1]]
        return self._via_csr()[key]

    def __setitem__(self, key, value):
        raise TypeError(_IMMUTABLE.format(cls=type(self).__name__))

    def setdiag(self, values, k=0):
        """Not supported: the structure is immutable (see ``__setitem__``)."""
        raise TypeError(_IMMUTABLE.format(cls=type(self).__name__))

    def __iter__(self):
        for i in range(self.shape[0]):
            yield self[i]

    # -- text -----------------------------------------------------------------

    def __str__(self):
        """The ``repr``, then up to :attr:`maxprint` entries as scipy lists them."""
        out = repr(self)
        rows, cols, vals = (_arrays.to_numpy(a) for a in self._coo_arrays())  # GPU: a copy
        if not vals.size:
            return out

        def lines(r, c, v):
            pairs = zip(r.tolist(), c.tolist(), v, strict=True)
            return "\n".join(f"  ({i}, {j})\t{x}" for i, j, x in pairs)

        out += "\n  Coords\tValues\n"
        if vals.size > self.maxprint:
            half = self.maxprint // 2
            rest = self.maxprint - half
            return (out + lines(rows[:half], cols[:half], vals[:half]) + "\n  :\t:\n"
                    + lines(rows[-rest:], cols[-rest:], vals[-rest:]))
        return out + lines(rows, cols, vals)


for _name in UFUNCS_AT_ZERO:
    setattr(SparseArrayAPI, _name, _ufunc_method(_name))
del _name

# NumPy's object loops of floor, ceil and trunc call Python's math.floor(A), math.ceil(A) and
# math.trunc(A): with these, numpy.floor(A) works (scipy's sparse arrays raise there).
# numpy.sign(A) compares A with zero, which is element-wise here: A.sign() is the method.
SparseArrayAPI.__floor__ = SparseArrayAPI.floor
SparseArrayAPI.__ceil__ = SparseArrayAPI.ceil
SparseArrayAPI.__trunc__ = SparseArrayAPI.trunc
