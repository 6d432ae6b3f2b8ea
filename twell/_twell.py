"""The TwELLMatrix container."""

import numbers

import numpy as np

from . import _algorithms, _backend, _convert, _layout, _packed
from ._algorithms import Parts
from ._validation import (
    SUPPORTED_DTYPES,
    bfloat16,
    check_shape,
    check_slots,
    check_storage,
    check_tile_width,
    native,
    result_dtype,
    value_dtype,
)


def _backend_of(xp):
    return _backend.backend(xp)


class TwELLMatrix:
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
        an :class:`ELLMatrix` or another :class:`TwELLMatrix`. Or the six
        storage arrays ``(counts, data, indices, overflow_indptr,
        overflow_indices, overflow_data)``, with ``shape``; they are checked
        with :meth:`validate`.
    shape : tuple of int, optional
        ``(M, K)``; required with a tuple of storage arrays.
    tile_width : int, optional
        Columns per tile, in [1, 65536]. Default 256.
    slots : int or "auto", optional
        Slots per (row, tile), in [1, tile_width]. ``"auto"`` (default)
        chooses the smallest count whose overflow holds at most 1% of the
        non-zeros, but at most 4 times the count that 99% of the non-empty
        (row, tile) pairs fit in (see :func:`twell.auto_slots`); from a TwELLMatrix with the
        same tile width it keeps that matrix's slot count.
    dtype : dtype, optional
        Value dtype: float64, float32, float16 or bfloat16. Default: that of
        the input; bool and integer input becomes float64.
    copy : bool, optional
        With storage arrays, copy them (default False: the matrix shares them, except
        those in the other byte order, which it converts).

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
    indices : ndarray of uint16, shape (M, n_tiles, S)
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
    ndim = 2
    # Let ``ndarray @ TwELLMatrix`` reach __rmatmul__ instead of NumPy's ufunc.
    __array_ufunc__ = None
    __array_priority__ = 100.0
    _nnz_hint = None  # see _set; a class default for objects that never went through _set
    _tile_index = None  # see index_tiles

    def __init__(self, arg, shape=None, *, tile_width=_layout.DEFAULT_TILE_WIDTH, slots="auto",
                 dtype=None, copy=False):
        tile_width = check_tile_width(tile_width)
        slots = check_slots(slots, tile_width)
        if isinstance(arg, tuple):
            self._init_from_parts(arg, shape, tile_width, dtype, copy)
            return
        if shape is not None and tuple(shape) != tuple(getattr(arg, "shape", shape)):
            raise ValueError(f"shape={shape!r} does not match the input's shape {arg.shape}")
        src = _convert.coerce(arg, dtype, (tile_width, 1 if slots == "auto" else slots))
        if isinstance(src, TwELLMatrix):
            other = src if dtype is None else src.astype(dtype, copy=False)
            if slots == "auto" and tile_width == other.tile_width:
                slots = other.slots
            result = other._relayout(tile_width, slots)
            if copy and result is src:
                result = result.copy()
            self._set(result._parts, result.shape, result.tile_width, result._nnz_hint)
            return
        if not isinstance(src, (_convert.Dense, _convert.CSR)):  # an ELLMatrix
            src = src._as_csr_input(dtype)
        parts, nnz = _pack(src, tile_width, slots)
        self._set(parts, src.shape, tile_width, nnz)

    # -- construction ----------------------------------------------------

    def _set(self, parts, shape, tile_width, nnz_hint=None):
        self._parts = Parts(*parts)
        self._shape = tuple(int(v) for v in shape)
        self._tile_width = int(tile_width)
        # The stored-entry count when twell knew it without reading the GPU (None otherwise),
        # only to choose how A @ B runs: if the storage arrays are edited in place and it goes
        # stale, a product may take the slower path, never a wrong one.
        self._nnz_hint = nnz_hint
        self._tile_index = None  # from the counts; _from_parts passes it where they are kept

    def _init_from_parts(self, arrays, shape, tile_width, dtype, copy):
        if shape is None:
            raise ValueError("shape is required with a tuple of storage arrays")
        shape = check_shape(shape)
        if len(arrays) != len(Parts._fields):
            raise ValueError(
                f"arg must be a tuple of the {len(Parts._fields)} storage arrays "
                f"{Parts._fields}; got a tuple of {len(arrays)}"
            )
        xp = _backend.array_module(*arrays)
        parts = Parts(*(native(xp.asarray(a)) for a in arrays))  # converts the other order
        if copy:
            parts = Parts(*(a.copy() for a in parts))
        self._set(parts, shape, tile_width)
        self.validate()
        if dtype is not None:
            self._set(self.astype(dtype)._parts, shape, tile_width)

    @classmethod
    def _from_parts(cls, parts, shape, tile_width, nnz_hint=None, tile_index=None):
        """Wrap trusted storage arrays without checks (internal); ``tile_index`` must be
        that of ``parts.counts``."""
        obj = cls.__new__(cls)
        obj._set(parts, shape, tile_width, nnz_hint)
        obj._tile_index = tile_index
        return obj

    @classmethod
    def from_dense(cls, x, *, tile_width=_layout.DEFAULT_TILE_WIDTH, slots="auto", dtype=None):
        """Pack a dense 2-D NumPy or CuPy array.

        Every value ``!= 0`` is a non-zero, NaN and Inf included.

        See Also
        --------
        TwELLMatrix : the constructor, which accepts any input.
        """
        src = _convert.dense(x, dtype)
        parts, nnz = _pack(src, check_tile_width(tile_width), check_slots(slots, tile_width))
        return cls._from_parts(parts, src.shape, tile_width, nnz)

    @classmethod
    def from_csr(cls, x, *, tile_width=_layout.DEFAULT_TILE_WIDTH, slots="auto", dtype=None):
        """Pack a scipy.sparse or cupyx.scipy.sparse matrix (any format).

        Duplicates are summed and explicit zeros dropped.
        """
        return cls(x, tile_width=tile_width, slots=slots, dtype=dtype)

    from_coo = from_csr

    @classmethod
    def from_ell(cls, x, *, tile_width=_layout.DEFAULT_TILE_WIDTH, slots="auto"):
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
        parts, shape = _packed.from_packed(words, shape, compression)
        return cls._from_parts(parts, shape, _layout.PACKED_TILE_WIDTH)

    # -- attributes ------------------------------------------------------

    shape = property(lambda self: self._shape, doc="``(M, K)``.")
    dtype = property(lambda self: self._parts.data.dtype, doc="Value dtype.")
    tile_width = property(lambda self: self._tile_width, doc="Columns per tile.")
    slots = property(lambda self: self._parts.data.shape[2], doc="Slots per (row, tile).")
    n_tiles = property(lambda self: self._parts.counts.shape[1], doc="Number of column tiles.")
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
    def _xp(self):
        return _backend.array_module(self._parts.counts)

    @property
    def device(self):
        """``"cpu"`` for NumPy-backed matrices, else the CuPy device."""
        return "cpu" if self._xp is np else self._parts.counts.device

    @property
    def nnz(self):
        """Number of stored non-zeros (slots plus overflow). Synchronises on the GPU."""
        return int(self._parts.counts.sum()) + self.overflow_nnz

    @property
    def overflow_nnz(self):
        """Number of entries in the overflow part."""
        return int(self._parts.overflow_indices.size)

    @property
    def overflow_rows(self):
        """Number of rows with at least one overflow entry. Synchronises on the GPU."""
        return int((self._xp.diff(self._parts.overflow_indptr) > 0).sum())

    @property
    def occupancy(self):
        """Share of slots that hold an entry (1.0 for a matrix without slots)."""
        total = self._parts.data.size
        return float(self._parts.counts.sum()) / total if total else 1.0

    @property
    def nbytes(self):
        """Bytes of all six storage arrays.

        ``M * n_tiles * (4 + slots * (itemsize + 2)) + 8 * (M + 1)
        + overflow_nnz * (4 + itemsize)``.
        """
        return int(sum(a.nbytes for a in self._parts))

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

    def __len__(self):
        raise TypeError("sparse matrix length is ambiguous; use .nnz or .shape[0]")

    def __bool__(self):
        if self.shape == (1, 1):
            return self.nnz != 0
        raise ValueError("the truth value of a matrix with more than one element is ambiguous")

    # -- the tile index ----------------------------------------------------

    def index_tiles(self):
        """Build, or rebuild, the list of each row's non-empty tiles, which products walk
        instead of every count.

        A row of a wide layout stores a count for every tile, most of them zero: 245 tiles
        a row for 10**6 columns at tile width 4096, 980 MB of counts for 10**6 rows, read by
        every product. The index lists the tiles whose count is not zero (int64 row pointer
        and int32 tile numbers, 8 bytes a row plus 4 a listed tile), so that a product reads
        the counts of those alone: the 2-D Poisson matrix at tile width 4096 times 64
        vectors took 0.35 ms with it and 1.0 ms without (float32, H200).

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
        from ._checks import validate_parts

        validate_parts(self._parts, self.shape, self.tile_width)

    # -- conversions -----------------------------------------------------

    def toarray(self):
        """Dense array (NumPy or CuPy, where the matrix lives).

        See Also
        --------
        scipy.sparse.csr_array.toarray
        """
        return _backend_of(self._xp).to_dense(self._parts, self.shape, self.tile_width)

    def _csr_arrays(self):
        return _backend_of(self._xp).to_csr(self._parts, self.shape, self.tile_width)

    def tocsr(self, copy=False):
        """Convert to ``scipy.sparse.csr_array`` (host) or ``cupyx.scipy.sparse.csr_matrix``.

        scipy.sparse and cupyx hold neither bfloat16 nor float16: such a
        matrix raises TypeError; cast it with ``astype(numpy.float32)`` first.
        cupyx indexes with int32: on the GPU, ``nnz`` above ``2**31 - 1`` is a
        ValueError (``.get().tocsr()`` gives a host array with int64 indices).
        """
        self._check_cupyx_size()
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

    def to_ell(self, width=None):
        """Convert to row-wise :class:`ELLMatrix` (``width``: see ELLMatrix)."""
        from ._ell import ELLMatrix

        return ELLMatrix(self, width=width)

    def asformat(self, format, copy=False):
        """Convert to ``"twell"``, ``"csr"``, ``"coo"``, ``"ell"`` or ``"array"``."""
        conversions = {
            "twell": lambda: self.copy() if copy else self,
            "csr": self.tocsr,
            "coo": self.tocoo,
            "ell": self.to_ell,
            "array": self.toarray,
            None: lambda: self,
        }
        if format not in conversions:
            raise ValueError(
                "format must be one of 'twell', 'csr', 'coo', 'ell', 'array'; "
                f"got format={format!r}"
            )
        return conversions[format]()

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
        address of ``counts``, and a write through either is seen by the other.

        Returns
        -------
        TorchParts
            A NamedTuple ``(counts, data, indices, overflow_indptr,
            overflow_indices, overflow_data)`` of tensors, on the CPU for a
            NumPy-backed matrix and on the matrix's GPU for a CuPy-backed one:
            ``counts`` torch.int32 (M, n_tiles); ``data`` (M, n_tiles, slots)
            of the matrix's dtype, bfloat16 as ``torch.bfloat16``; ``indices``
            torch.uint16 (M, n_tiles, slots); ``overflow_indptr`` torch.int64
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
        exact for every tile width up to 65536 and no copy. torch supports few
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
        from ._torch import matrix_to_torch

        return matrix_to_torch(self)

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
        return TwELLMatrix._from_parts(Parts(*(a.copy() for a in self._parts)),
                                       self.shape, self.tile_width, self._nnz_hint,
                                       self._mapped_tile_index(lambda a: a.copy()))

    def _mapped_tile_index(self, fn):
        index = self._tile_index
        return None if index is None else index._replace(indptr=fn(index.indptr),
                                                         tiles=fn(index.tiles))

    def astype(self, dtype, copy=True):
        """Cast the values to ``dtype``; entries that become zero are dropped."""
        dtype = value_dtype(dtype)
        if dtype == self.dtype:
            return self.copy() if copy else self
        return self._map_values(lambda v: _backend_of(self._xp).cast(v, dtype))

    def _map_values(self, fn):
        """Apply ``fn`` to the stored values, then restore the canonical form.

        Padding slots stay zero whatever ``fn`` does to zero (NaN * 0), and
        entries that ``fn`` turns into zeros leave the matrix.
        """
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
        keep = _algorithms.is_nonzero(data)
        if not bool(keep.all()):  # host sync on the GPU
            rows = _algorithms.expand_indptr(indptr, indices.size)[keep]
            indptr = _algorithms.exclusive_cumsum(_algorithms.count_sorted(rows, self.shape[0]))
            indices, data = indices[keep], data[keep]
        src = _convert.CSR(indptr, indices, data, self.shape)
        parts, _ = _pack(src, tile_width, slots)
        # The kept entries' count is the CSR's length, known on the host whatever the slots.
        return TwELLMatrix._from_parts(parts, self.shape, tile_width, int(indices.size))

    def _relayout(self, tile_width, slots):
        """This matrix with another tile width and slot count (itself if unchanged)."""
        if tile_width == self.tile_width and slots in (self.slots, "auto"):
            return self
        return self._repack(tile_width, slots)

    def transpose(self, axes=None, copy=False):
        """Transpose, keeping the tile width; slots chosen again by ``"auto"``.

        See Also
        --------
        scipy.sparse.csr_array.transpose
        """
        if axes is not None and tuple(axes) != (1, 0):
            raise ValueError(f"axes must be None or (1, 0); got axes={axes!r}")
        rows, cols, vals = _algorithms.to_coo(self._parts, self.shape, self.tile_width)
        m, k = self.shape
        src = _convert.csr_from_coo(cols, rows, vals, (k, m))
        parts, nnz = _pack(src, self.tile_width, "auto")
        return TwELLMatrix._from_parts(parts, (k, m), self.tile_width, nnz)

    T = property(transpose, doc="Transpose (see :meth:`transpose`).")

    # -- arithmetic ------------------------------------------------------

    def __matmul__(self, other):
        if isinstance(other, TwELLMatrix) or _is_sparse(other):
            raise TypeError(
                "sparse @ sparse is not supported; multiply by a dense array, or convert one "
                "side with .tocsr()"
            )
        return _matmul(self, other)

    def __rmatmul__(self, other):
        if _is_sparse(other):
            return NotImplemented
        xp = _backend.array_module(self._parts.counts, other if _is_array(other) else None)
        other = other if _is_array(other) else xp.asarray(other)
        if other.ndim not in (1, 2):
            raise ValueError(f"other must be 1-D or 2-D; got other.ndim={other.ndim}")
        if other.shape[-1] != self.shape[0]:
            raise ValueError(
                f"matmul: dimension mismatch, other.shape={other.shape} and A.shape={self.shape} "
                f"(other.shape[-1]={other.shape[-1]} must equal A.shape[0]={self.shape[0]})"
            )
        if other.ndim == 1:
            return _matmul(self.T, other)
        return _matmul(self.T, other.T).T

    def dot(self, other):
        """Same as ``self @ other``."""
        return self @ other

    def _scalar_op(self, other, op, symbol):
        """``op(values, other)`` for a real scalar, computed in float64, NumPy's result dtype."""
        kind = _scalar_kind(other)
        if kind is None and _is_number(other):  # a number of a kind twell does not take
            raise TypeError(
                f"TwELLMatrix {symbol} x supports real scalars: int, float, or a NumPy integer "
                "or float64, float32, float16 or bfloat16 scalar or 0-d array; use @ for "
                f"matrix products; got x of type {_type_name(other)}"
            )
        if kind is None:  # a matrix, an array, anything else
            raise TypeError(
                f"TwELLMatrix {symbol} x supports real scalars only (elementwise); use @ for "
                f"matrix products; got {type(other).__name__}"
            )
        # Python int/float are weak (NEP 50): they keep the matrix dtype; NumPy scalars,
        # np.float64 included (a float subclass), promote like arrays.
        dtype = self.dtype if kind == "python" else result_dtype(self.dtype, other.dtype)
        try:
            scalar = float(np.float64(other))  # a Python float: CuPy takes no NumPy 0-d arrays
        except OverflowError:  # a Python int past the float64 range
            raise ValueError(f"TwELLMatrix {symbol} x: x={_int_text(other)} is past the float64 "
                             "range (about 1.8e308)") from None
        cast = _backend_of(self._xp).cast
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self._map_values(lambda v: cast(op(cast(v, np.float64), scalar), dtype))

    def __mul__(self, other):
        return self._scalar_op(other, np.multiply, "*")

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self._scalar_op(other, np.true_divide, "/")

    def __neg__(self):
        return self * -1

    def sum(self, axis=None):
        """Sum of the entries: a scalar (``axis=None``) or a 1-D array (``axis=0|1``).

        Accumulates in float64, returns the matrix dtype (as ``scipy.sparse`` arrays do,
        it returns 1-D arrays, not matrices). Row sums add each row's slots (padding slots
        hold zeros) and then its overflow entries; column sums add each column's slot
        entries, then its overflow entries, each in row order; the total adds the row
        sums. Every sum takes a fixed order (:func:`twell._algorithms.segment_sums`), so
        results are deterministic on both backends: a histogram with float weights
        (``bincount``) would add with atomics, whose order, and so whose last bits, vary
        from run to run on a GPU.

        Memory is in proportion to the result and the storage, never to ``K`` or ``M``
        alone where the result does not need it: the row sums of a 1 x (2**31 - 1) matrix
        take a few values, its column sums 2**31 - 1. On the GPU this synchronises with the
        host once or twice (the longest overflow row, the entry count).

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
        be = _backend_of(self._xp)
        p = self._parts
        if axis is not None and axis % 2 == 0:
            # The entries where they are stored (no canonical order needed): the used slots,
            # by (row, tile), then the overflow, by row.
            xp, s = self._xp, self.slots
            pair, slot = xp.nonzero(_algorithms.slot_mask(p.counts, s).reshape(-1, s))
            cols = xp.concatenate([
                (pair % max(self.n_tiles, 1)) * self.tile_width
                + p.indices.reshape(-1, s)[pair, slot], p.overflow_indices.astype(np.int64)])
            vals = xp.concatenate([be.cast(p.data.reshape(-1, s)[pair, slot], np.float64),
                                   be.cast(p.overflow_data, np.float64)])
            sums = _algorithms.column_sums(cols, vals, self.shape[1])
        else:
            m = self.shape[0]
            # CuPy's own casts flush float32 subnormals: the backend's cast keeps them.
            data = be.cast(p.data, np.float64).reshape(m, p.data.size // max(m, 1))
            with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are entries
                sums = data.sum(axis=1)
                sums += _algorithms.segment_sums(p.overflow_indptr,
                                                 be.cast(p.overflow_data, np.float64))
                if axis is None:
                    return be.cast(sums.sum().reshape(1), self.dtype).reshape(())[()]
        return be.cast(sums, self.dtype)


def _is_array(x):
    return isinstance(x, np.ndarray) or _backend.is_cupy_array(x)


def _is_sparse(x):
    import scipy.sparse as sp

    return sp.issparse(x) or _backend.is_cupyx_sparse(x)


def _scalar_kind(x):
    """``"python"`` for a Python int or float (bool excluded), ``"numpy"`` for a NumPy
    integer or supported float scalar or 0-d array, None for anything else (complex,
    Fraction, Decimal, long double, ...)."""
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (np.generic, np.ndarray)):
        if x.ndim != 0:
            return None
        supported = x.dtype.kind in "iu" or x.dtype.newbyteorder("=") in SUPPORTED_DTYPES
        return "numpy" if supported else None
    if isinstance(x, (int, float)):  # subclasses too (IntEnum, ...)
        return "python"
    return None


def _is_number(x):
    """A scalar number of any kind: Python's (bool, complex, Fraction, Decimal, ...) or
    NumPy's (scalars and 0-d arrays)."""
    return isinstance(x, (numbers.Number, np.generic)) or (isinstance(x, np.ndarray)
                                                          and x.ndim == 0)


def _type_name(x):
    """``x``'s type as a user would name it: ``Fraction``, ``numpy.longdouble``,
    ``numpy.ndarray of dtype complex128``."""
    name = type(x).__name__
    if isinstance(x, np.ndarray):
        return f"numpy.ndarray of dtype {x.dtype}"
    if isinstance(x, np.generic):
        return f"numpy.{name}"
    return name


def _int_text(n):
    """A huge int as ``10**k`` when it is one, else its first digits."""
    text = str(n)
    if text.lstrip("-") == "1" + "0" * (len(text.lstrip("-")) - 1):
        return f"{'-' if n < 0 else ''}10**{len(text.lstrip('-')) - 1}"
    return f"{text[:12]}... ({len(text.lstrip('-'))} digits)"


def _matmul(a, b):
    """``a @ b`` for TwELL ``a`` and a dense vector or matrix ``b``."""
    xp = _backend.array_module(a._parts.counts, b if _is_array(b) else None)
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


def _pack(src, tile_width, slots):
    """Dense or CSR input -> ``(Parts, nnz)``, choosing slots when asked for "auto".

    Every TwELL matrix that twell builds passes here: the storage limit is checked
    before the per-(row, tile) arrays are allocated. With ``slots="auto"`` the per-tile
    counts give the overflow size and the number of entries too, so the pack need not read
    them back from the GPU; with slots given, a dense input's pack counts ``nnz`` in the read
    it makes anyway (the overflow size), and a canonical CSR input's is its length.
    """
    be = _backend_of(_backend.array_module(src.data if src.kind == "csr" else src.array))
    check_storage(src.shape, tile_width, 1 if slots == "auto" else slots)
    n_over = nnz = None
    if slots == "auto":
        if src.kind == "dense":
            counts = be.tile_counts_dense(src.array, tile_width)
        else:
            counts = be.tile_counts_csr(src.indptr, src.indices, src.shape, tile_width)
        hist = _tile_counts_histogram(counts, tile_width)
        slots, n_over, nnz = _layout.auto_choice(hist, tile_width)
        check_storage(src.shape, tile_width, slots)
    if src.kind == "dense":
        parts, counted = be.pack_dense(src.array, tile_width, slots, n_over=n_over)
        return parts, counted if nnz is None else nnz
    # A canonical CSR holds exactly its entries: its length is the count, with no read.
    return be.pack_csr(src.indptr, src.indices, src.data, src.shape, tile_width, slots,
                       n_over=n_over), int(src.indices.size)


def _tile_counts_histogram(tile_counts, tile_width):
    """``hist[c]``: how many (row, tile) pairs hold ``c`` non-zeros (NumPy int64).

    On the GPU: one kernel and one small device-to-host copy, the only synchronisation.
    """
    be = _backend_of(_backend.array_module(tile_counts))
    hist = be.count_histogram(tile_counts, tile_width + 1)
    return _layout.checked_histogram(_backend.to_numpy(hist), tile_width)  # GPU: the sync


def _sparse_type(xp, fmt, dtype):
    """scipy's ``csr_array``/``coo_array`` on the host, cupyx's matrices on the device."""
    if xp is np:
        import scipy.sparse as sp

        if dtype in (bfloat16, np.float16):
            raise TypeError(
                f"scipy.sparse cannot hold {dtype}; convert with .astype(numpy.float32) first"
            )
        return {"csr": sp.csr_array, "coo": sp.coo_array}[fmt]
    cs = _backend.cupyx_sparse()
    if dtype not in (np.float32, np.float64):
        raise TypeError(
            f"cupyx.scipy.sparse holds float32/float64 only; got dtype={dtype}; "
            "convert with .astype(numpy.float32) first"
        )
    return {"csr": cs.csr_matrix, "coo": cs.coo_matrix}[fmt]
