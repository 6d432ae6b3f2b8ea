"""The TwELLMatrix container."""

import operator

import numpy as np
import scipy.sparse as sp

from . import (
    _algorithms,
    _arrays,
    _backend,
    _convert,
    _dlpack,
    _host,
    _layout,
    _numpy_backend,
    _packed,
)
from ._algorithms import Parts
from ._arguments import check_shape, check_slots, check_tile_width
from ._base import SparseMatrix
from ._build import build as _build_layout
from ._build import host_layout
from ._dtypes import SUPPORTED_DTYPES, astype_dtype, bfloat16, native, result_dtype, value_dtype


def _backend_of(xp):
    return _backend.backend(xp)


class TwELLMatrix(SparseMatrix):
    """Sparse matrix in TwELL (Tile-wise ELLPACK) format.

    The columns are split into tiles of ``tile_width`` consecutive columns.
    Every (row, tile) pair stores up to ``slots`` non-zeros ELLPACK-style: a
    count and fixed-size arrays of values and columns within the tile, sorted
    by column. Non-zeros beyond ``slots`` in a tile are kept, losslessly, in a
    CSR overflow part.

    Parameters
    ----------
    arg : array_like, sparse matrix, ELLMatrix, TwELLMatrix or tuple
        What to convert: a dense 2-D NumPy or CuPy array (or array-like), any
        ``scipy.sparse`` array or matrix, any ``cupyx.scipy.sparse`` matrix,
        an :class:`ELLMatrix` or another :class:`TwELLMatrix`. Or a tuple,
        read by its length as scipy reads it: ``(M, K)`` (two ints) for an
        empty matrix; ``(data, (row, col))`` for COO triplets (duplicates
        summed, zeros dropped); ``(data, indices, indptr)`` for a CSR
        structure; or the six storage arrays ``(counts, data, indices,
        overflow_indptr, overflow_indices, overflow_data)``, with ``shape``,
        checked with :meth:`validate`.
    shape : tuple of int, optional
        ``(M, K)``; required with a tuple of storage arrays, read off the
        indices for the COO and CSR tuples when not given.
    dtype : dtype, optional
        Value dtype: float64, float32, float16 or bfloat16. Default: that of
        the input; bool and integer input becomes float64 (a requested bool or
        integer dtype rounds the values through it first).
    copy : bool, optional
        With storage arrays, copy them (default False: the matrix shares them, except
        those in the other byte order, which it converts).
    tile_width : int or "auto", optional
        Columns per tile, in [1, 65536]. ``"auto"`` (default) takes 256 where a row's
        entries average one or more per 256 columns, else one tile as wide as the row
        (:func:`twell.auto_tile_width`); from a TwELLMatrix it keeps that matrix's.
    slots : int or "auto", optional
        Slots per (row, tile), in [1, tile_width]. ``"auto"`` (default)
        chooses the smallest count whose overflow holds at most 1% of the
        non-zeros, but at most 4 times the count that 99% of the non-empty
        (row, tile) pairs fit in (see :func:`twell.auto_slots`); from a TwELLMatrix with the
        same tile width it keeps that matrix's slot count.
    maxprint : int, optional
        Entries that ``str(A)`` lists at most (scipy's ``maxprint``, default 50).

    Attributes
    ----------
    shape : tuple of int
        ``(M, K)``.
    dtype : numpy.dtype
        Value dtype.
    tile_width : int
        Columns per tile, ``T``.
    slots : int
        Slots per (row, tile), ``S``.
    n_tiles : int
        ``ceil(K / T)``.
    counts : ndarray of int32, shape (M, n_tiles)
        Entries held in the slots of each (row, tile), at most ``S``.
    data : ndarray, shape (M, n_tiles, S)
        Slot values; slots at and after the count hold zero.
    indices : ndarray of uint16 (int32 when ``T > 65536``), shape (M, n_tiles, S)
        Column of each slot entry within its tile, sorted; unused slots zero.
    overflow_indptr : ndarray of int64, shape (M + 1,)
        CSR row pointer of the overflow part.
    overflow_indices : ndarray of int32
        Global columns of the overflow entries, sorted within each row.
    overflow_data : ndarray
        Values of the overflow entries.
    has_tile_index : bool
        Whether products walk the list of each row's non-empty tiles
        (:meth:`index_tiles`) instead of every count.

    Raises
    ------
    TypeError
        Input of an unsupported kind or dtype (complex, object, str, datetime).
    ValueError
        A bad shape, tile width or slot count, storage arrays that break an
        invariant, or a size past a limit: ``M`` and ``K`` at most
        ``2**31 - 1``, ``M * n_tiles * slots`` at most ``(2**31 - 1) * 8``
        (``twell._layout.MAX_STORED_SLOTS``), checked before allocating.

    Notes
    -----
    The arrays live where the input lived: NumPy arrays on the host or CuPy
    arrays on the current GPU. Operations on a CuPy-backed matrix run CUDA
    kernels and return CuPy arrays; twell never copies between host and
    device unless asked (:meth:`get`).

    The matrix offers scipy.sparse's common sparse-array API (``A[i:j]``,
    ``A.multiply(B)``, ``A + B``, ``A == B``, ``A.max()``, ...): value maps,
    row selections, reductions and products with dense operands run
    natively; the rest goes through scipy's ``csr_array`` (cupyx's
    ``csr_matrix`` on the GPU) and returns what that returns. The structure
    is immutable: item assignment raises TypeError. See the page "twell with
    scipy.sparse and cupyx".

    The canonical form makes packing deterministic: equal matrices have equal
    storage arrays, whatever their construction path.

    See Also
    --------
    scipy.sparse.csr_array : the compressed-row format.
    ELLMatrix : row-wise ELLPACK, the baseline TwELL refines.

    Examples
    --------
    >>> import numpy as np
    >>> import twell
    >>> x = np.zeros((2, 512), dtype=np.float32)
    >>> x[0, 3], x[0, 100], x[0, 300], x[1, 511] = 1.5, 2.0, 0.25, -1.0
    >>> a = twell.TwELLMatrix(x, slots=2)
    >>> a.counts
    array([[2, 1],
           [0, 1]], dtype=int32)
    >>> a.indices[0]
    array([[  3, 100],
           [ 44,   0]], dtype=uint16)
    >>> float((a @ np.ones(512, dtype=np.float32))[0])
    3.75
    """

    format = "twell"
    _nnz_hint = None  # see _set; a class default for objects that never went through _set
    _tile_index = None  # see index_tiles

    def __init__(self, arg, shape=None, dtype=None, copy=False, *, tile_width="auto",
                 slots="auto", maxprint=None):
        tile_width = check_tile_width(tile_width)
        slots = check_slots(slots, tile_width)
        if maxprint is not None:
            self.maxprint = maxprint
        if isinstance(arg, tuple) and len(arg) == len(Parts._fields):
            self._init_from_parts(arg, shape, tile_width, dtype, copy)
            return
        if (not isinstance(arg, tuple) and shape is not None
                and tuple(shape) != tuple(getattr(arg, "shape", shape))):
            raise ValueError(f"shape={shape!r} does not match the input's shape {arg.shape}")
        if isinstance(arg, TwELLMatrix) and (dtype is None or np.dtype(dtype) in SUPPORTED_DTYPES):
            other = arg if dtype is None else arg.astype(dtype, copy=False)
            if tile_width == "auto":
                tile_width = other.tile_width
            if slots == "auto" and tile_width == other.tile_width:
                slots = other.slots
            result = other._relayout(tile_width, slots)
            if copy and result is arg:
                result = result.copy()
            self._adopt(result)
            return
        if isinstance(arg, SparseMatrix):
            src = arg._csr_input(dtype)
        else:
            storage = (_layout.MAX_TILE_WIDTH if tile_width == "auto" else tile_width,
                       1 if slots == "auto" else slots)
            src = _convert.coerce(arg, dtype, storage, shape)
        self._adopt(_build(src, tile_width, slots))

    # -- construction ----------------------------------------------------

    def _set(self, parts, shape, tile_width, nnz_hint=None, *, csr=None, layout=None,
             shared=False):
        """Hold ``parts``, or, on the host, ``csr`` alone (``parts`` None), the storage to be
        built from it when first asked for with ``layout = (slots, n_over, dtype)``.

        A host matrix whose storage twell made keeps it read-only (twell._host), so that its
        compressed rows, made when first needed, always hold what the storage holds;
        ``shared`` arrays, which the caller may write, stay writable and the matrix keeps
        no compressed rows."""
        self._p = None if parts is None else Parts(*parts)
        self._csr = csr
        if parts is not None:
            data = self._p.data  # of any shape here: validate() names a wrong one
            layout = (data.shape[-1] if data.ndim else 0, int(self._p.overflow_indices.size),
                      data.dtype)
            if not shared and _arrays.array_module(self._p.counts) is np:
                _host.freeze(self._p)
        self._layout_info = layout
        self._shared = shared
        self._shape = tuple(int(v) for v in shape)
        self._tile_width = int(tile_width)
        # The stored-entry count when twell knew it without reading the GPU (None otherwise),
        # only to choose how A @ B runs: if the storage arrays are edited in place and it goes
        # stale, a product may take the slower path, never a wrong one.
        self._nnz_hint = nnz_hint
        self._tile_index = None  # from the counts; _from_parts passes it where they are kept
        self.__dict__.pop("_transpose_cache", None)  # of the arrays being replaced
        self.__dict__.pop("_spmv", None)

    def __getstate__(self):
        # The kept SpMV launch (_fast_matvec) holds compiled kernels: rebuilt after unpickling.
        state = dict(self.__dict__)
        state.pop("_spmv", None)
        return state

    def __setstate__(self, state):
        # A pickle carries the arrays writable: a host matrix's own storage is read-only again.
        self.__dict__.update(state)
        if self._p is not None and not self._shared and self._xp is np:
            _host.freeze(self._p)

    def _adopt(self, other):
        """Take over ``other``'s state (a constructor's result)."""
        self.__dict__.pop("_transpose_cache", None)
        self.__dict__.pop("_spmv", None)
        self.__dict__.update(other.__dict__)

    @property
    def _parts(self):
        """The six storage arrays, built from the host's compressed rows on first use."""
        if self._p is None:
            slots, n_over, dtype = self._layout_info
            c = self._csr
            parts = _numpy_backend.pack_csr(c.indptr, c.indices, _host.values(c, dtype),
                                            self._shape, self._tile_width, slots, n_over)
            self._p = _host.freeze(Parts(*parts))
        return self._p

    def _compute_form(self):
        """The host's compressed rows (twell._host), built from the storage on first use;
        None on the GPU and for storage shared with the caller."""
        if self._csr is None and not self._shared and self._xp is np:
            indptr, indices, data = _numpy_backend.to_csr(self._p, self._shape,
                                                          self._tile_width)
            self._csr = _host.host_csr(indptr, indices, data)
        return self._csr

    @classmethod
    def _from_csr(cls, csr, shape, tile_width, slots, n_over, dtype):
        """A host matrix of the canonical compressed rows ``csr`` (twell._host.HostCSR),
        its storage laid out with ``slots`` (leaving ``n_over`` entries to the overflow)
        when first asked for (internal)."""
        obj = cls.__new__(cls)
        obj._set(None, shape, tile_width, int(csr.indices.size), csr=csr,
                 layout=(slots, n_over, np.dtype(dtype)))
        return obj

    @classmethod
    def _from_built(cls, built):
        """The matrix of a layout built from entries (twell._build.Built)."""
        if built.parts is None:
            return cls._from_csr(built.csr, built.shape, built.tile_width, built.slots,
                                 built.n_over, built.dtype)
        return cls._from_parts(built.parts, built.shape, built.tile_width, built.nnz)

    def _init_from_parts(self, arrays, shape, tile_width, dtype, copy):
        if shape is None:
            raise ValueError("shape is required with a tuple of storage arrays")
        shape = check_shape(shape)
        if len(arrays) != len(Parts._fields):
            raise ValueError(
                f"arg must be a tuple of the {len(Parts._fields)} storage arrays "
                f"{Parts._fields}; got a tuple of {len(arrays)}"
            )
        if tile_width == "auto":
            raise ValueError("tile_width is required with a tuple of storage arrays: give "
                             "the tile width the arrays were laid out with")
        xp = _arrays.array_module(*arrays)
        parts = Parts(*(native(xp.asarray(a)) for a in arrays))  # converts the other order
        if copy:
            parts = Parts(*(a.copy() for a in parts))
        self._set(parts, shape, tile_width, shared=not copy)
        self.validate()
        if dtype is not None:
            self._adopt(self.astype(dtype))

    @classmethod
    def _from_parts(cls, parts, shape, tile_width, nnz_hint=None, tile_index=None):
        """Wrap trusted storage arrays without checks (internal); ``tile_index`` must be
        that of ``parts.counts``."""
        obj = cls.__new__(cls)
        obj._set(parts, shape, tile_width, nnz_hint)
        obj._tile_index = tile_index
        return obj

    @classmethod
    def from_dense(cls, x, *, tile_width="auto", slots="auto", dtype=None):
        """Pack a dense 2-D NumPy or CuPy array.

        Every value ``!= 0`` is a non-zero, NaN and Inf included.

        See Also
        --------
        TwELLMatrix : the constructor, which accepts any input.
        """
        tile_width = check_tile_width(tile_width)
        return _build(_convert.dense(x, dtype), tile_width, check_slots(slots, tile_width))

    @classmethod
    def from_csr(cls, x, *, tile_width="auto", slots="auto", dtype=None):
        """Pack a scipy.sparse or cupyx.scipy.sparse matrix (any format).

        Duplicates are summed and explicit zeros dropped.
        """
        return cls(x, tile_width=tile_width, slots=slots, dtype=dtype)

    from_coo = from_csr

    @classmethod
    def from_ell(cls, x, *, tile_width="auto", slots="auto"):
        """Convert an :class:`ELLMatrix`."""
        return cls(x, tile_width=tile_width, slots=slots)

    @classmethod
    def from_packed(cls, words, shape, compression=8):
        """Read the packed layout of the reference TwELL kernels.

        Parameters
        ----------
        words : ndarray of uint32, shape (M, K // compression)
            Packed words as the reference producer writes them: per row and
            256-column tile, word 0 is the count and words ``1..count`` hold
            ``bf16_bits << 16 | global_column``, in any order; words after the
            count are ignored.
        shape : tuple of int
            ``(M, K)``, ``K`` a multiple of 256 and at most 65536.
        compression : {8, 4, 2}
            The reference's compression factor ``C``: 256 / C words per tile.

        Returns
        -------
        TwELLMatrix
            bfloat16 matrix with ``tile_width=256`` and
            ``slots=256 // compression - 1``, in canonical form.

        Raises
        ------
        ValueError
            On a count above the capacity, a column outside its tile, a
            repeated column, or words that do not match ``shape``.
        """
        parts, shape, has_zeros = _packed.from_packed(words, shape, compression)
        a = cls._from_parts(parts, shape, _layout.PACKED_TILE_WIDTH)
        # Explicit zeros (+0 or -0 bits) are not entries: drop them the general way.
        return a._repack(a.tile_width, a.slots) if has_zeros else a

    # -- attributes ------------------------------------------------------

    shape = property(lambda self: self._shape, doc="``(M, K)``.")
    dtype = property(lambda self: self._layout_info[2], doc="Value dtype.")
    tile_width = property(lambda self: self._tile_width, doc="Columns per tile.")
    slots = property(lambda self: self._layout_info[0], doc="Slots per (row, tile).")
    n_tiles = property(lambda self: _layout.n_tiles(self._shape[1], self._tile_width),
                       doc="Number of column tiles.")
    counts = property(lambda self: self._parts.counts, doc="Entries in the slots, (M, n_tiles).")
    data = property(lambda self: self._parts.data, doc="Slot values, (M, n_tiles, slots).")
    indices = property(lambda self: self._parts.indices,
                       doc="Slot columns within the tile, (M, n_tiles, slots).")
    overflow_indptr = property(lambda self: self._parts.overflow_indptr,
                               doc="CSR row pointer of the overflow part, (M + 1,).")
    overflow_indices = property(lambda self: self._parts.overflow_indices,
                                doc="Global columns of the overflow entries.")
    overflow_data = property(lambda self: self._parts.overflow_data,
                             doc="Values of the overflow entries.")

    @property
    def _storage(self):
        return self._csr.indices if self._p is None else self._p.counts

    @property
    def nnz(self):
        """Number of stored non-zeros (slots plus overflow). Synchronises on the GPU."""
        if self._csr is not None:
            return int(self._csr.indices.size)
        return int(self._parts.counts.sum()) + self.overflow_nnz

    @property
    def overflow_nnz(self):
        """Number of entries in the overflow part."""
        return self._layout_info[1]

    @property
    def overflow_rows(self):
        """Number of rows with at least one overflow entry. Synchronises on the GPU."""
        if self.overflow_nnz == 0:
            return 0
        if self._p is None:
            return _host.overflow_rows(self._csr, self._shape, self._tile_width, self.slots)
        return int((self._xp.diff(self._p.overflow_indptr) > 0).sum())

    @property
    def occupancy(self):
        """Share of slots that hold an entry (1.0 for a matrix without slots)."""
        total = self._shape[0] * self.n_tiles * self.slots
        return (self.nnz - self.overflow_nnz) / total if total else 1.0

    @property
    def nbytes(self):
        """Bytes of the six storage arrays, plus, on the host, the compressed-row form that
        products and conversions run on, plus the cached transpose if the matrix holds one
        (:attr:`has_transpose`).

        The storage takes ``M * n_tiles * (4 + slots * (itemsize + 2)) + 8 * (M + 1)
        + overflow_nnz * (4 + itemsize)`` bytes, counted whether or not it has been built
        yet (a host matrix builds it when first asked for). The compressed rows take
        ``nnz * 8 + 4 * (M + 1)`` bytes (int32 indices; float32 values for 16-bit
        dtypes), once made.
        """
        storage = _layout.storage_bytes(self._shape, self._tile_width, self.slots,
                                        self.overflow_nnz, self.dtype.itemsize)
        return int(storage + (0 if self._csr is None else self._csr.nbytes)
                   + self._cache_nbytes())

    def tile_nnz(self):
        """Non-zeros of every (row, tile), overflow included: int64 (M, n_tiles).

        The distribution of these numbers guides the choice of ``slots``.
        """
        over = _algorithms.overflow_tile_counts(self._parts, self.shape, self.tile_width)
        return self._parts.counts.astype(np.int64) + over.reshape(self._parts.counts.shape)

    def __repr__(self):
        m, k = self.shape
        where = "cpu" if self._xp is np else f"cuda:{self._parts.counts.device.id}"
        return (
            f"<TwELLMatrix {m}x{k}, dtype={self.dtype}, nnz={self.nnz}, "
            f"tile_width={self.tile_width}, slots={self.slots}, "
            f"occupancy={self.occupancy:.1%}, overflow={self.overflow_nnz} entries "
            f"in {self.overflow_rows} rows, on {where}>"
        )

    # -- the tile index ----------------------------------------------------

    def index_tiles(self):
        """Build, or rebuild, the list of each row's non-empty tiles, which products walk
        instead of every count.

        A row of a wide layout stores a count for every tile, most of them zero: 245 tiles
        a row for 10**6 columns at tile width 4096, 980 MB of counts for 10**6 rows, read by
        every product. The index lists the tiles whose count is not zero (int64 row pointer
        and int32 tile numbers, 8 bytes a row plus 4 a listed tile), so that a product reads
        the counts of those alone (the 2-D Poisson matrix at tile width 4096 times 64
        vectors runs about three times faster with it on a GPU).

        The GPU kernels walk it where it pays: rows of more than 128 tiles (more than one
        round of count reads), at most one in 8 of them listed on average, and not in the
        matrix-vector product of long rows (32 lanes a row read the counts faster).
        Elsewhere products ignore it. On the host it spares the scan of empty slots; the result is
        the same. On the GPU a product that walks it sums in the order it would without it,
        except where the index changes the kernel's shape (it knows the longest row's
        tiles, which the layout's shape alone does not): then the last bits may differ.
        Either way results are deterministic.

        Like ``scipy.sparse``'s ``has_sorted_indices``, the index describes the arrays as
        they were when it was built: after writing into :attr:`counts` in place, call this
        again (or set :attr:`has_tile_index` to False). Every operation that returns a new
        matrix builds its own arrays, and those start without an index, except
        :meth:`copy`, :meth:`get` and value-only maps (:meth:`astype`, scalar ``*`` and
        ``/``), which keep the counts and so the index. On the GPU this synchronises twice
        with the host (the index's size and its longest row).

        Examples
        --------
        >>> import numpy as np
        >>> import twell
        >>> x = np.zeros((2, 1024), dtype=np.float32)
        >>> x[0, 5], x[0, 900], x[1, 300] = 1.0, 2.0, 3.0
        >>> a = twell.TwELLMatrix(x, tile_width=256, slots=1)
        >>> a.index_tiles()
        >>> a.has_tile_index
        True
        >>> a.tile_index.tiles, a.tile_index.indptr, a.tile_index.max_tiles
        (array([0, 3, 1], dtype=int32), array([0, 2, 3]), 2)
        """
        self._tile_index = _algorithms.tile_index(self._parts.counts)

    @property
    def has_tile_index(self):
        """Whether the matrix holds a tile index (:meth:`index_tiles`). Setting it to True
        builds the index (again), to False drops it."""
        return self._tile_index is not None

    @has_tile_index.setter
    def has_tile_index(self, value):
        if value:
            self.index_tiles()
        else:
            self._tile_index = None

    @property
    def tile_index(self):
        """The tile index, ``TileIndex(indptr, tiles, max_tiles)``, or None
        (:meth:`index_tiles`): row ``r``'s non-empty tiles are
        ``tiles[indptr[r]:indptr[r + 1]]``, ascending, and no row has more than
        ``max_tiles``."""
        return self._tile_index

    # -- checks ----------------------------------------------------------

    def validate(self):
        """Check every invariant of the storage arrays.

        Raises
        ------
        TypeError
            An array of the wrong kind or dtype.
        ValueError
            A broken invariant; the message names it.
        """
        from ._invariants import validate_parts

        validate_parts(self._parts, self.shape, self.tile_width)

    # -- conversions -----------------------------------------------------

    def _to_dense(self):
        csr = self._compute_form()
        if csr is not None:
            return _host.to_dense(csr, self.shape, self.dtype)
        return _backend_of(self._xp).to_dense(self._parts, self.shape, self.tile_width)

    def _csr_arrays(self):
        """Canonical CSR ``(indptr int64, indices int32, data)`` of the matrix's dtype."""
        csr = self._compute_form()
        if csr is not None:
            return (csr.indptr.astype(np.int64), csr.indices.astype(np.int32),
                    _host.values(csr, self.dtype))
        return _backend_of(self._xp).to_csr(self._parts, self.shape, self.tile_width)

    def _csr_input(self, dtype=None):
        if dtype is not None and np.dtype(dtype) not in SUPPORTED_DTYPES:
            # A bool or integer request: the values through that dtype (csr_from_coo's rule).
            return _convert.csr_from_coo(*self._coo_arrays(), self.shape, dtype)
        a = self if dtype is None else self.astype(dtype, copy=False)
        return _convert.CSR(*a._csr_arrays(), a.shape)

    # -- the hooks of the sparse-array API (twell._sparse_api) -----------

    def _coo_arrays(self):
        csr = self._compute_form()
        if csr is not None:
            rows = np.repeat(np.arange(self._shape[0], dtype=np.int64), np.diff(csr.indptr))
            return rows, csr.indices.astype(np.int64), _host.values(csr, self.dtype)
        return _algorithms.to_coo(self._parts, self.shape, self.tile_width, self._tile_index)

    def _storage_key(self):
        # A new layout tuple comes with every new storage (_set); building the storage or the
        # host's compressed rows of the same entries later keeps it.
        return (self._layout_info,)

    def _from_canonical(self, src):
        return _build(src, self.tile_width, "auto")

    def _replace(self, src):
        self._adopt(_build(src, self.tile_width, self.slots))

    def _take_rows(self, rows):
        """The rows ``rows`` (int64, any order, repeats allowed), in this layout: on the host
        from the compressed rows, else from the storage (the rows' slots, and their overflow
        entries found through the overflow's row pointer). Rows are independent here."""
        xp = self._xp
        rows = xp.asarray(rows, dtype=np.int64)
        shape = (int(rows.size), self.shape[1])
        csr = self._compute_form()
        if csr is not None:
            sub = csr.scipy(self.shape)[rows]
            return _from_host_csr(_host.host_csr(sub.indptr, sub.indices, sub.data), shape,
                                  self.tile_width, self.slots, self.dtype)
        p = self._parts
        starts = p.overflow_indptr[rows]
        indptr = _algorithms.exclusive_cumsum(p.overflow_indptr[rows + 1] - starts)
        n = int(indptr[-1])  # host sync on the GPU: the overflow's size
        owner = _algorithms.expand_indptr(indptr, n)
        src = starts[owner] + (xp.arange(n, dtype=np.int64) - indptr[owner])
        parts = Parts(p.counts[rows], p.data[rows], p.indices[rows], indptr,
                      p.overflow_indices[src], p.overflow_data[src])
        return TwELLMatrix._from_parts(parts, shape, self.tile_width)

    def diagonal(self, k=0):
        """The ``k``-th diagonal (``A[i, i + k]``) as a dense 1-D array of the matrix's
        dtype; on the host read from the kept compressed rows by scipy's kernel."""
        kept = self._kept_csr()
        if kept is None:
            return super().diagonal(k)
        # float32 holds 16-bit values exactly: the cast back is exact.
        return kept.diagonal(operator.index(k)).astype(self.dtype, copy=False)

    def _csr_operand(self):
        kept = self._kept_csr()
        return super()._csr_operand() if kept is None else kept

    def _kept_csr(self):
        # The kept compressed rows, read-only: scipy's operations build new arrays, and
        # _private copies any result that would share these.
        csr = self._compute_form()
        return None if csr is None else csr.read_only().scipy(self.shape)

    def tocsr(self, copy=False):
        """Convert to ``scipy.sparse.csr_array`` (host) or ``cupyx.scipy.sparse.csr_matrix``.

        scipy.sparse and cupyx hold neither bfloat16 nor float16: such a
        matrix raises TypeError; cast it with ``astype(numpy.float32)`` first.
        cupyx indexes with int32: on the GPU, ``nnz`` above ``2**31 - 1`` is a
        ValueError (``.get().tocsr()`` gives a host array with int64 indices).
        """
        self._check_cupyx_size()
        csr = self._compute_form()
        if csr is not None:
            _sparse_type(np, "csr", self.dtype)  # refuses 16-bit values
            return csr.scipy(self.shape).copy()
        indptr, indices, data = self._csr_arrays()
        if self._xp is not np:
            # int32 like the indices (nnz fits: checked above), so that cupyx keeps the
            # arrays instead of reading both back to choose an index type.
            indptr = indptr.astype(np.int32)
        return _sparse_type(self._xp, "csr", data.dtype)(
            (data, indices, indptr), shape=self.shape
        )

    def tocoo(self, copy=False):
        """Convert to ``scipy.sparse.coo_array`` (host) or ``cupyx.scipy.sparse.coo_matrix``."""
        self._check_cupyx_size()
        csr = self._compute_form()
        if csr is not None:
            _sparse_type(np, "coo", self.dtype)  # refuses 16-bit values
            # scipy's expansion of the rows, then the columns and values copied once:
            # tocsr() copied them and scipy's tocoo(copy=True) copies all three again.
            coo = csr.scipy(self.shape).tocoo(copy=False)
            coo.col = coo.col.copy()
            coo.data = coo.data.copy()
            return coo
        rows, cols, vals = _algorithms.to_coo(self._parts, self.shape, self.tile_width)
        idx = np.int32 if self._xp is not np else np.int64
        return _sparse_type(self._xp, "coo", vals.dtype)(
            (vals, (rows.astype(idx), cols.astype(idx))), shape=self.shape
        )

    def _check_cupyx_size(self):
        """cupyx.scipy.sparse indexes with int32: refuse what it would wrap around."""
        if self._xp is np:
            return
        nnz = self.nnz  # host sync; tocsr/tocoo synchronise for their size anyway
        if nnz > _layout.MAX_COLUMNS:
            raise ValueError(
                f"cupyx.scipy.sparse indexes with int32: nnz must be at most "
                f"{_layout.MAX_COLUMNS} for tocsr()/tocoo() on the GPU; got nnz={nnz} (use "
                f".get().tocsr() for a host scipy array with int64 indices)"
            )

    def to_packed(self, compression=8):
        """Write the packed layout of the reference TwELL kernels.

        Parameters
        ----------
        compression : {8, 4, 2}
            ``C``: each 256-column tile takes 256 / C uint32 words (one count,
            ``256 / C - 1`` entries).

        Returns
        -------
        ndarray of uint32, shape (M, K // compression)
            Word 0 of a tile is the count, words ``1..count`` are
            ``bf16_bits << 16 | global_column`` sorted by column, the rest zero.

        Raises
        ------
        TypeError
            When the dtype is not bfloat16 (cast with ``astype`` first).
        ValueError
            When ``K % 256 != 0``, ``K > 65536``, or a (row, tile) holds more
            entries than the layout's capacity (the message says how many and
            which compression would fit).
        """
        return _packed.to_packed(self, compression)

    def to_torch(self):
        """The six storage arrays as torch tensors sharing memory with the matrix.

        Needs PyTorch (twell does not otherwise). Each array crosses through
        DLPack, so nothing is copied: ``to_torch().counts.data_ptr()`` is the
        address of ``counts``, and a write through either is seen by the other. On the
        host this makes the storage arrays writable (they are read-only otherwise) and
        the matrix drops its compressed rows, which a write would make disagree: its
        products then run on the storage arrays themselves, more slowly.

        Returns
        -------
        TorchParts
            A NamedTuple ``(counts, data, indices, overflow_indptr,
            overflow_indices, overflow_data)`` of tensors, on the CPU for a
            NumPy-backed matrix and on the matrix's GPU for a CuPy-backed one:
            ``counts`` torch.int32 (M, n_tiles); ``data`` (M, n_tiles, slots)
            of the matrix's dtype, bfloat16 as ``torch.bfloat16``; ``indices``
            torch.uint16 (torch.int32 for tiles wider than 65536 columns)
            (M, n_tiles, slots); ``overflow_indptr`` torch.int64
            (M + 1,); ``overflow_indices`` torch.int32 and ``overflow_data``
            of the matrix's dtype, one element per overflow entry.

        Raises
        ------
        ImportError
            Without PyTorch.
        TypeError
            With a torch older than 2.3, which has no ``torch.uint16``.

        See Also
        --------
        twell.from_torch_parts : the inverse.
        twell.to_torch : one array (``A.toarray()``, ``A @ B``, ``A.to_packed()``).
        twell.from_torch : a matrix from a dense tensor.

        Notes
        -----
        The tuple holds the tensors only, as the constructor's tuple form does:
        ``shape`` and ``tile_width`` stay on the matrix, and
        ``twell.from_torch_parts(A.to_torch(), A.shape, A.tile_width)`` gives
        ``A`` back on the same memory. Neither can be read off the arrays
        (``K`` is known only up to the width of the last tile), and a tuple of
        tensors alone can be handed on, moved or saved as tensors.

        ``indices`` keeps the uint16 that twell stores, as ``torch.uint16``:
        exact for every tile width up to 65536 and no copy (wider tiles store
        int32, ``torch.int32``). torch supports few
        operations on uint16 tensors beyond copies and conversions:
        ``parts.indices.long()`` converts (a copy) for indexing or arithmetic,
        and ``parts.indices.view(torch.int16)`` (no copy) holds the same values
        when ``tile_width <= 32768``. bfloat16 values cross DLPack as int16 bits
        and are viewed as ``torch.bfloat16`` on the torch side.

        Examples
        --------
        >>> import numpy as np, twell                          # doctest: +SKIP
        >>> a = twell.TwELLMatrix(np.eye(2, 300, dtype=np.float32), slots=1)  # doctest: +SKIP
        >>> p = a.to_torch()                                   # doctest: +SKIP
        >>> p.counts                                           # doctest: +SKIP
        tensor([[1, 0],
                [1, 0]], dtype=torch.int32)
        >>> p.indices.dtype, p.counts.data_ptr() == a.counts.ctypes.data  # doctest: +SKIP
        (torch.uint16, True)
        """
        _dlpack._torch()  # before the matrix changes: without PyTorch it stays as it is
        if self._xp is np and not self._shared:
            # The tensors may be written: the storage becomes the caller's to share, and
            # the compressed rows, which could then disagree with it, go (after the storage
            # is built from them).
            parts = self._parts
            self._csr = None
            for a in parts:
                a.flags.writeable = True
            self._shared = True
        return _dlpack.parts_to_torch(self._parts)

    def get(self):
        """Host copy: a NumPy-backed TwELLMatrix (itself when already on the host), with
        a host copy of the tile index if it has one."""
        if self._xp is np:
            return self
        return TwELLMatrix._from_parts(Parts(*(a.get() for a in self._parts)),
                                       self.shape, self.tile_width, self._nnz_hint,
                                       self._mapped_tile_index(lambda a: a.get()))

    def copy(self):
        """Deep copy (the tile index too, if there is one)."""
        if self._csr is not None:  # the host's compressed rows; the storage follows them
            slots, n_over, dtype = self._layout_info
            out = TwELLMatrix._from_csr(_host.HostCSR(*(a.copy() for a in self._csr)),
                                        self.shape, self.tile_width, slots, n_over, dtype)
            out._tile_index = self._mapped_tile_index(lambda a: a.copy())
            return out
        return TwELLMatrix._from_parts(Parts(*(a.copy() for a in self._p)),
                                       self.shape, self.tile_width, self._nnz_hint,
                                       self._mapped_tile_index(lambda a: a.copy()))

    def _mapped_tile_index(self, fn):
        index = self._tile_index
        return None if index is None else index._replace(indptr=fn(index.indptr),
                                                         tiles=fn(index.tiles))

    def astype(self, dtype, casting="unsafe", copy=True):
        """Cast the values to ``dtype``; entries that become zero are dropped.

        Parameters
        ----------
        dtype : dtype
            float64, float32, float16 or bfloat16; any other is a TypeError that names them.
        casting : str, optional
            Accepted for scipy's signature; every cast rounds to nearest.
        copy : bool, optional
            With ``copy=False``, the matrix itself when the dtype is unchanged.
        """
        dtype = astype_dtype(dtype)
        if dtype == self.dtype:
            return self.copy() if copy else self
        return self._map_values(lambda v: _backend_of(self._xp).cast(v, dtype))

    def _map_values(self, fn):
        """Apply ``fn`` to the stored values, then restore the canonical form.

        Padding slots stay zero whatever ``fn`` does to zero (NaN * 0), and
        entries that ``fn`` turns into zeros leave the matrix.
        """
        if self._csr is not None:  # the host's compressed rows: map their values
            c = self._csr
            data = fn(_host.values(c, self.dtype))
            keep = _algorithms.zeros_mask(data)
            if keep is not None:
                csr = _host.host_csr(*_algorithms.kept_rows(c.indptr, keep, c.indices, data))
                return _from_host_csr(csr, self.shape, self.tile_width, self.slots, data.dtype)
            # The same entries where they were: the same layout (slots, overflow), counts
            # and tile index, nothing to count again.
            csr = _host.host_csr(c.indptr.copy(), c.indices.copy(), data)
            result = TwELLMatrix._from_csr(csr, self.shape, self.tile_width, self.slots,
                                           self.overflow_nnz, data.dtype)
            result._tile_index = self._tile_index
            return result
        p = self._parts
        mask = _algorithms.slot_mask(p.counts, self.slots)
        data = fn(p.data)  # a new array
        data[~mask] = 0
        over = fn(p.overflow_data)
        lost = (int((mask & ~_algorithms.is_nonzero(data)).sum())
                + int((~_algorithms.is_nonzero(over)).sum()))  # host sync
        # Same counts, same tile index (the index arrays are never written after index_tiles).
        result = TwELLMatrix._from_parts(p._replace(data=data, overflow_data=over),
                                         self.shape, self.tile_width, self._nnz_hint,
                                         self._tile_index)
        if lost:
            result = result._repack(self.tile_width, self.slots)  # knows its exact count
        return result

    def _repack(self, tile_width, slots):
        """Re-pack through canonical CSR (drops zeros; new tile width/slots)."""
        indptr, indices, data = self._csr_arrays()
        keep = _algorithms.zeros_mask(data)  # host sync on the GPU
        if keep is not None:
            indptr, indices, data = _algorithms.kept_rows(indptr, keep, indices, data)
        return _build(_convert.CSR(indptr, indices, data, self.shape), tile_width, slots)

    def _relayout(self, tile_width, slots):
        """This matrix with another tile width and slot count (itself if unchanged)."""
        if tile_width == self.tile_width and slots in (self.slots, "auto"):
            return self
        return self._repack(tile_width, slots)

    def _transpose(self):
        """A new transpose, keeping the tile width; slots chosen again by ``"auto"``."""
        m, k = self.shape
        csr = self._compute_form()
        if csr is not None:
            return _from_host_csr(_host.transpose(csr, self.shape), (k, m), self.tile_width,
                                  "auto", self.dtype)
        rows, cols, vals = _algorithms.to_coo(self._parts, self.shape, self.tile_width)
        src = _convert.csr_from_coo(cols, rows, vals, (k, m))
        return _build(src, self.tile_width, "auto")

    # -- arithmetic ------------------------------------------------------

    def _matmul_dense(self, other):
        return _matmul(self, other)

    def _fast_matvec(self, x):
        """``self @ x`` for a C-contiguous vector ``x`` of the matrix's dtype with ``K`` values
        on the matrix's device, through a launch kept from the first such product: on the GPU
        the SpMV's kernel, grid and arguments (twell._cuda._spmm.spmv: one allocation and one
        launch a call), on the host scipy's CSR matrix of the kept compressed rows (float32
        and float64). What an iterative solver pays per product is then little more than the
        kernel. None for any other operand (the general path). The launch is kept while the
        storage (or the compressed rows) and the tile index are the same objects."""
        kept = self.__dict__.get("_spmv")
        if (kept is not None and type(x) is kept[0] and kept[2] is self._tile_index
                and kept[1] is (self._p if self._csr is None else self._csr)
                and x.dtype == kept[3] and x.shape == kept[4] and x.flags.c_contiguous):
            return kept[5](x)
        dtype = self._layout_info[2]
        host = type(x) is np.ndarray
        if (not (host or _arrays.is_cupy_array(x)) or x.dtype != dtype
                or x.shape != (self._shape[1],) or not x.flags.c_contiguous):
            return None
        if self._xp is np:
            csr = self._compute_form()
            if not host or csr is None or csr.data.dtype != dtype:
                return None  # a device vector, shared storage, 16-bit values: the general path
            run, key = csr.scipy(self._shape).__matmul__, csr
        else:
            if host:
                return None
            run = _backend_of(self._xp).spmv(self._p, self._shape, self._tile_width, dtype,
                                             self._tile_index)
            key = self._p
        self.__dict__["_spmv"] = (type(x), key, self._tile_index, x.dtype, x.shape, run)
        return run(x)

    def _sum(self, axis):
        """float64 sums: of every entry (a 0-d array, ``axis=None``) or along ``axis``.

        Deterministic on both backends, memory in proportion to the result and the storage
        (never to ``K`` or ``M`` alone where the result does not need it): row sums add each
        row's entries in a fixed order (twell._algorithms.segment_sums; on the host the
        compressed rows, in column order; else the slots, whose padding holds zeros, then the
        overflow), column sums each column's entries in row order
        (twell._algorithms.column_sums), the total the row sums. A histogram with float
        weights (``bincount``) would add with atomics, whose order, and so whose last bits,
        vary from run to run on a GPU.
        """
        csr = self._compute_form()
        if csr is not None:
            vals = csr.data.astype(np.float64)
            with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are entries
                if axis == 0:
                    return _algorithms.column_sums(csr.indices, vals, self.shape[1],
                                                   csr.indptr)
                sums = _algorithms.segment_sums(csr.indptr, vals)
                return sums.sum() if axis is None else sums
        be = _backend_of(self._xp)
        p = self._parts
        if axis == 0:
            # The entries where they are stored (no canonical order needed): the used slots,
            # by (row, tile), then the overflow, by row.
            xp, s = self._xp, self.slots
            pair, slot = xp.nonzero(_algorithms.slot_mask(p.counts, s).reshape(-1, s))
            cols = xp.concatenate([
                (pair % max(self.n_tiles, 1)) * self.tile_width
                + p.indices.reshape(-1, s)[pair, slot], p.overflow_indices.astype(np.int64)])
            vals = xp.concatenate([be.cast(p.data.reshape(-1, s)[pair, slot], np.float64),
                                   be.cast(p.overflow_data, np.float64)])
            return _algorithms.column_sums(cols, vals, self.shape[1])
        m = self.shape[0]
        # CuPy's own casts flush float32 subnormals: the backend's cast keeps them.
        data = be.cast(p.data, np.float64).reshape(m, p.data.size // max(m, 1))
        with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are entries
            sums = data.sum(axis=1)
            sums += _algorithms.segment_sums(p.overflow_indptr,
                                             be.cast(p.overflow_data, np.float64))
            return sums.sum() if axis is None else sums


def _is_array(x):
    return isinstance(x, np.ndarray) or _arrays.is_cupy_array(x)


def _matmul(a, b):
    """``a @ b`` for TwELL ``a`` and a dense vector or matrix ``b``."""
    xp = _arrays.array_module(a._storage, b if _is_array(b) else None)
    if not _is_array(b):
        b = xp.asarray(b)
    if b.ndim not in (1, 2):
        raise ValueError(f"other must be 1-D or 2-D; got other.ndim={b.ndim}")
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(
            f"matmul: dimension mismatch, A.shape={a.shape} and other.shape={b.shape} "
            f"(A.shape[1]={k} must equal other.shape[0]={b.shape[0]})"
        )
    out_dtype = result_dtype(a.dtype, value_dtype(b.dtype, "other.dtype"))
    csr = a._compute_form()
    if csr is not None:
        return _host.matmul(csr, a.shape, b, out_dtype)
    cast = _backend_of(xp).cast
    parts = a._parts
    if parts.data.dtype != out_dtype:
        parts = parts._replace(data=cast(parts.data, out_dtype),
                               overflow_data=cast(parts.overflow_data, out_dtype))
    vector = b.ndim == 1
    b2 = b.reshape(k, 1) if vector else b
    b2 = cast(b2, out_dtype) if b2.dtype != out_dtype else xp.ascontiguousarray(b2)
    out = _backend_of(xp).spmm(parts, a.shape, a.tile_width, b2, out_dtype,
                               nnz_hint=a._nnz_hint, tile_index=a._tile_index)
    return out.reshape(m) if vector else out


def _build(src, tile_width, slots):
    """Dense or canonical CSR input -> TwELLMatrix (twell._build), choosing the tile width and
    the slots where they are "auto"."""
    return TwELLMatrix._from_built(_build_layout(src, tile_width, slots))


def _from_host_csr(csr, shape, tile_width, slots, dtype):
    """A host TwELLMatrix of compressed rows (twell._build.host_layout)."""
    return TwELLMatrix._from_built(host_layout(csr, shape, tile_width, slots, dtype))


def _sparse_type(xp, fmt, dtype):
    """scipy's ``csr_array``/``coo_array`` on the host, cupyx's matrices on the device."""
    if xp is np:
        if dtype in (bfloat16, np.float16):
            raise TypeError(
                f"scipy.sparse cannot hold {dtype}; convert with .astype(numpy.float32) first"
            )
        return {"csr": sp.csr_array, "coo": sp.coo_array}[fmt]
    cs = _arrays.cupyx_sparse()
    if dtype not in (np.float32, np.float64):
        raise TypeError(
            f"cupyx.scipy.sparse holds float32/float64 only; got dtype={dtype}; "
            "convert with .astype(numpy.float32) first"
        )
    return {"csr": cs.csr_matrix, "coo": cs.coo_matrix}[fmt]
