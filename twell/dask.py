"""Row-partitioned TwELL matrices for Dask: ``twell.dask``.

A :class:`DaskTwELLMatrix` is a stack of row blocks, each an ordinary
:class:`twell.TwELLMatrix` (NumPy- or CuPy-backed), held lazily as Dask
tasks: a block is built, multiplied, converted or saved where Dask's
scheduler runs it (a thread, a process, or a worker of a
``dask_cuda.LocalCUDACluster``, one GPU each). Blocks split rows only;
every block has all the columns, so its column tiles are exactly those of
the whole matrix and no tile is ever cut.

Install with ``pip install 'twell[dask]'`` (``dask[array]``). This module
imports without Dask; its functions raise ImportError until Dask is there.

Examples
--------
>>> import dask, dask.array as da, numpy as np
>>> import twell.dask
>>> x = np.zeros((6, 300), dtype=np.float32)
>>> x[0, 1], x[3, 299], x[5, 10] = 1.0, 2.0, 3.0
>>> A = twell.dask.from_dask_array(da.from_array(x, chunks=(4, 100)))
>>> A
<DaskTwELLMatrix 6x300, dtype=float32, tile_width=256, 2 row blocks of (4, 2) rows, on cpu>
>>> with dask.config.set(scheduler="synchronous"):
...     y = (A @ np.ones(300, dtype=np.float32)).compute()
...     nnz = A.nnz
>>> y
array([1., 0., 0., 2., 0., 3.], dtype=float32)
>>> nnz
3
"""

import json
import math
import numbers
import os
import uuid

import numpy as np

from . import _arrays
from ._arguments import check_shape, check_slots, check_tile_width
from ._dtypes import SUPPORTED_DTYPES, result_dtype, value_dtype
from ._io import load as _load_block_file
from ._io import save as _save_block_file
from ._layout import GEMM_TILE_WIDTH
from ._twell import TwELLMatrix

__all__ = ["DaskTwELLMatrix", "from_blocks", "from_dask_array", "load"]

#: The manifest file of a saved matrix, and its format version.
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "DaskTwELLMatrix"
MANIFEST_VERSION = 1
_MANIFEST_KEYS = ("twell_format", "twell_version", "shape", "dtype", "tile_width",
                  "row_chunks", "blocks")
_DTYPES = {str(d): d for d in SUPPORTED_DTYPES}


def _dask():
    """``(dask, dask.array)``, or an ImportError that says how to get them."""
    try:
        import dask
        import dask.array as da
    except ImportError as exc:
        raise ImportError(
            "twell.dask needs Dask arrays; install them with pip install 'twell[dask]' "
            "(or pip install 'dask[array]')"
        ) from exc
    return dask, da


def _delayed_value(obj, prefix):
    """A Delayed holding ``obj`` under a fresh key: no hashing of large arrays or blocks."""
    dask, _ = _dask()
    return dask.delayed(obj, name=f"{prefix}-{uuid.uuid4().hex}", traverse=False)


def _is_dask_array(x):
    try:
        import dask.array as da
    except ImportError:
        return False
    return isinstance(x, da.Array)


class DaskTwELLMatrix:
    """A TwELL matrix split into row blocks, each a :class:`twell.TwELLMatrix` held by Dask.

    Build one with :func:`from_dask_array`, :func:`from_blocks` or
    :func:`load`; the constructor is internal. Every block has all ``K``
    columns and the same ``tile_width`` and dtype; blocks may differ in
    ``slots`` (each chooses its own with ``"auto"``) and in row count
    (zero included).

    Attributes
    ----------
    shape : tuple of int
        ``(M, K)``.
    dtype : numpy.dtype
        Value dtype of every block.
    tile_width : int
        Columns per tile, the same in every block.
    row_chunks : tuple of int
        Rows of each block; they add up to ``M``.
    numblocks : int
        Number of row blocks.

    Notes
    -----
    Nothing is computed until asked: ``A @ B`` and :meth:`to_dask_array`
    return lazy Dask arrays whose row chunks are ``row_chunks``; the
    statistics (:attr:`nnz`, :meth:`stats`), :meth:`to_blocks`,
    :meth:`tocsr` and :meth:`save` compute with the current Dask scheduler.
    :meth:`persist` keeps the blocks in memory (on the workers of a
    distributed cluster) so that later operations do not build them again.

    See Also
    --------
    twell.TwELLMatrix : one block.
    dask.array.Array : the Dask arrays it takes and returns.

    Examples
    --------
    >>> import dask, numpy as np, scipy.sparse as sp
    >>> import twell, twell.dask
    >>> blocks = [twell.TwELLMatrix(np.eye(3, 5)), twell.TwELLMatrix(np.ones((2, 5)))]
    >>> A = twell.dask.from_blocks(blocks)
    >>> A.shape, A.row_chunks
    ((5, 5), (3, 2))
    >>> with dask.config.set(scheduler="synchronous"):
    ...     dense = A.to_dask_array().compute()
    ...     csr = A.tocsr()
    >>> dense[3:]
    array([[1., 1., 1., 1., 1.],
           [1., 1., 1., 1., 1.]])
    >>> bool((sp.vstack(csr).toarray() == dense).all())
    True
    """

    format = "twell"
    ndim = 2
    # ``ndarray @ DaskTwELLMatrix`` is a TypeError, not an object array.
    __array_ufunc__ = None

    def __init__(self, blocks, row_chunks, shape, dtype, tile_width, on_gpu):
        self._blocks = list(blocks)  # Delayed objects, each computing to a TwELLMatrix
        self._row_chunks = tuple(int(r) for r in row_chunks)
        self._shape = tuple(int(v) for v in shape)
        self._dtype = np.dtype(dtype)
        self._tile_width = int(tile_width)
        self._on_gpu = bool(on_gpu)

    # -- attributes ------------------------------------------------------

    shape = property(lambda self: self._shape, doc="``(M, K)``.")
    dtype = property(lambda self: self._dtype, doc="Value dtype of every block.")
    tile_width = property(lambda self: self._tile_width, doc="Columns per tile.")
    row_chunks = property(lambda self: self._row_chunks, doc="Rows of each block.")
    numblocks = property(lambda self: len(self._blocks), doc="Number of row blocks.")

    @property
    def n_tiles(self):
        """``ceil(K / tile_width)``, the same in every block."""
        return -(-self._shape[1] // self._tile_width)

    @property
    def device(self):
        """``"cpu"`` for NumPy-backed blocks, ``"cuda"`` for CuPy-backed ones."""
        return "cuda" if self._on_gpu else "cpu"

    def _xp(self):
        return _arrays.cupy_module() if self._on_gpu else np

    def __repr__(self):
        m, k = self._shape
        rows = self._row_chunks if len(self._row_chunks) <= 8 else (
            f"{self._row_chunks[:3]} ... {self._row_chunks[-2:]}")
        return (
            f"<DaskTwELLMatrix {m}x{k}, dtype={self._dtype}, tile_width={self._tile_width}, "
            f"{self.numblocks} row blocks of {rows} rows, on {self.device}>"
        )

    def __len__(self):
        raise TypeError("sparse matrix length is ambiguous; use .nnz or .shape[0]")

    def _like(self, blocks, dtype=None, on_gpu=None):
        return DaskTwELLMatrix(blocks, self._row_chunks, self._shape,
                               self._dtype if dtype is None else dtype, self._tile_width,
                               self._on_gpu if on_gpu is None else on_gpu)

    def _map(self, func, *args, **kwargs):
        """``func(block, *args, **kwargs)`` as one Delayed per block."""
        dask, _ = _dask()
        f = dask.delayed(func)
        return [f(b, *args, **kwargs) for b in self._blocks]

    # -- the blocks ------------------------------------------------------

    def to_delayed(self):
        """The blocks as a list of ``dask.delayed`` objects, each computing to a TwELLMatrix."""
        return list(self._blocks)

    def to_blocks(self):
        """Compute the blocks: a list of :class:`twell.TwELLMatrix`, top to bottom."""
        dask, _ = _dask()
        return list(dask.compute(*self._blocks))

    def persist(self):
        """Compute the blocks and keep them (in memory, or on the workers of a cluster).

        Returns
        -------
        DaskTwELLMatrix
            The same matrix, whose blocks later operations reuse.
        """
        dask, _ = _dask()
        return self._like(dask.persist(*self._blocks))

    # -- statistics ------------------------------------------------------

    def stats(self):
        """Layout statistics summed over the blocks (computes the blocks).

        Returns
        -------
        dict
            ``nnz``, ``overflow_nnz``, ``overflow_rows`` (ints, totals),
            ``slots`` (list: each block's slot count), ``nbytes`` (storage of
            all blocks) and ``tile_nnz_histogram`` (int64 NumPy array: entry
            ``c`` is the number of (row, tile) pairs holding ``c`` non-zeros,
            overflow included; ``TwELLMatrix.tile_nnz`` per block, counted).
        """
        dask, _ = _dask()
        per_block = dask.compute(*self._map(_block_stats))
        width = max((len(s["tile_nnz_histogram"]) for s in per_block), default=1)
        hist = np.zeros(width, dtype=np.int64)
        for s in per_block:
            hist[: len(s["tile_nnz_histogram"])] += s["tile_nnz_histogram"]
        return {
            "nnz": sum(s["nnz"] for s in per_block),
            "overflow_nnz": sum(s["overflow_nnz"] for s in per_block),
            "overflow_rows": sum(s["overflow_rows"] for s in per_block),
            "slots": [s["slots"] for s in per_block],
            "nbytes": sum(s["nbytes"] for s in per_block),
            "tile_nnz_histogram": hist,
        }

    @property
    def nnz(self):
        """Stored non-zeros of all blocks, overflow included (computes the blocks)."""
        return self.stats()["nnz"]

    @property
    def overflow_nnz(self):
        """Overflow entries of all blocks (computes the blocks)."""
        return self.stats()["overflow_nnz"]

    def tile_nnz_histogram(self):
        """Histogram of the non-zeros per (row, tile) over all blocks (see :meth:`stats`)."""
        return self.stats()["tile_nnz_histogram"]

    # -- conversions -----------------------------------------------------

    def _stack(self, func, prefix, chunks, meta, columns=((),), dependencies=()):
        """A Dask array whose chunk (i, j) is ``func(block_i, *columns[j])``.

        Built as one graph layer, not with ``dask.array.concatenate``, which
        would drop the chunks of empty blocks: the result's row chunks are
        always ``row_chunks``.
        """
        _, da = _dask()
        from dask.highlevelgraph import HighLevelGraph

        name = f"{prefix}-{uuid.uuid4().hex}"
        layer = {}
        for i, block in enumerate(self._blocks):
            for j, args in enumerate(columns):
                key = (name, i) if len(chunks) == 1 else (name, i, j)
                layer[key] = (func, block.key, *args)
        graph = HighLevelGraph.from_collections(name, layer,
                                                dependencies=[*self._blocks, *dependencies])
        return da.Array(graph, name, chunks, meta=meta)

    def to_dask_array(self):
        """The dense matrix as a lazy Dask array with row chunks ``row_chunks``, columns whole.

        Chunks are NumPy or CuPy arrays, where the blocks live.
        """
        meta = self._xp().empty((0, 0), dtype=self._dtype)
        return self._stack(_block_toarray, "twell-toarray", (self._row_chunks, (self._shape[1],)),
                           meta)

    def tocsr(self):
        """Compute every block's :meth:`twell.TwELLMatrix.tocsr`: a list of CSR matrices.

        ``scipy.sparse.vstack`` (or cupyx's) of the list is the whole matrix.
        """
        dask, _ = _dask()
        return list(dask.compute(*self._map(_block_tocsr)))

    def astype(self, dtype):
        """Cast every block's values to ``dtype`` (lazy; see :meth:`twell.TwELLMatrix.astype`)."""
        dtype = value_dtype(dtype)
        return self._like(self._map(_block_astype, dtype), dtype=dtype)

    def get(self):
        """NumPy-backed blocks (lazy device-to-host copies; itself when already on the host)."""
        if not self._on_gpu:
            return self
        return self._like(self._map(_block_get), on_gpu=False)

    # -- products --------------------------------------------------------

    def __matmul__(self, other):
        """``A @ B`` for a dense B: a Dask array, NumPy/CuPy array or array-like.

        B is (K,) or (K, N). The result is a lazy Dask array of shape (M,)
        or (M, N), with A's row chunks and, for a Dask B, B's column
        chunks (B's row chunks are merged: every block needs all of B's
        rows). The dtype is that of ``TwELLMatrix @ B``.
        """
        if isinstance(other, (TwELLMatrix, DaskTwELLMatrix)) or _is_sparse(other):
            raise TypeError("sparse @ sparse is not supported; multiply by a dense array")
        _dask()
        lazy = _is_dask_array(other)
        if not lazy and not (isinstance(other, np.ndarray) or _arrays.is_cupy_array(other)):
            other = self._xp().asarray(other)
        if other.ndim not in (1, 2):
            raise ValueError(f"other must be 1-D or 2-D; got other.ndim={other.ndim}")
        m, k = self._shape
        n = other.shape[1] if other.ndim == 2 else None
        if other.shape[0] != k:
            raise ValueError(
                f"matmul: dimension mismatch, A.shape={self._shape} and other.shape={other.shape} "
                f"(A.shape[1]={k} must equal other.shape[0]={other.shape[0]})"
            )
        out_dtype = result_dtype(self._dtype, value_dtype(other.dtype, "other.dtype"))
        meta = self._xp().empty((0,) * other.ndim, dtype=out_dtype)
        vector = other.ndim == 1
        if lazy:
            if any(math.isnan(c) for axis in other.chunks for c in axis):
                raise ValueError("other has unknown chunk sizes; call other.compute_chunk_sizes()")
            other = other.rechunk({0: -1})  # every block needs all of B's rows
            col_chunks = () if vector else other.chunks[1]
            keys = [(other.name, 0)] if vector else [(other.name, 0, j)
                                                     for j in range(len(col_chunks))]
        else:
            other = _delayed_value(other, "twell-rhs")
            col_chunks = () if vector else (n,)
            keys = [other.key]
        chunks = (self._row_chunks, *([col_chunks] if not vector else []))
        return self._stack(_block_matmul, "twell-matmul", chunks, meta,
                           columns=[(key,) for key in keys], dependencies=[other])

    def dot(self, other):
        """Same as ``self @ other``."""
        return self @ other

    # -- files -----------------------------------------------------------

    def save(self, directory, *, overwrite=False):
        """Write the blocks, one twell file each, and a manifest into ``directory``.

        Each block goes to ``block-NNNNN.twell`` (:func:`twell.save`),
        written by the task that holds it; then ``manifest.json`` records the
        shape, dtype, tile width, row chunks and file names.

        Parameters
        ----------
        directory : str or os.PathLike
            Created if missing. With a distributed cluster it must be
            reachable from every worker.
        overwrite : bool, optional
            Replace a matrix saved there before. Default False.

        Raises
        ------
        FileExistsError
            When ``directory`` already holds a manifest and not ``overwrite``.

        See Also
        --------
        load : read it back.
        """
        dask, _ = _dask()
        directory = os.fspath(directory)
        manifest_path = os.path.join(directory, MANIFEST)
        if os.path.exists(manifest_path) and not overwrite:
            raise FileExistsError(
                f"{manifest_path} exists: directory holds a saved matrix; pass overwrite=True "
                "to replace it"
            )
        os.makedirs(directory, exist_ok=True)
        names = [f"block-{i:05d}.twell" for i in range(self.numblocks)]
        save = dask.delayed(_save_block_file)
        dask.compute(*[save(os.path.join(directory, n), b)
                       for n, b in zip(names, self._blocks, strict=True)])
        manifest = {
            "twell_format": MANIFEST_FORMAT,
            "twell_version": MANIFEST_VERSION,
            "shape": list(self._shape),
            "dtype": str(self._dtype),
            "tile_width": self._tile_width,
            "row_chunks": list(self._row_chunks),
            "blocks": names,
        }
        with open(manifest_path, "w", encoding="utf-8") as f:  # last: a manifest means complete
            json.dump(manifest, f, indent=1)
            f.write("\n")


# -- task functions (run by Dask; named for its dashboards) ---------------------------------------

def _block_stats(block):
    hist = np.bincount(_arrays.to_numpy(block.tile_nnz()).reshape(-1), minlength=1)
    return {"nnz": block.nnz, "overflow_nnz": block.overflow_nnz,
            "overflow_rows": block.overflow_rows, "slots": block.slots, "nbytes": block.nbytes,
            "tile_nnz_histogram": hist.astype(np.int64)}


def _block_toarray(block):
    return block.toarray()


def _block_tocsr(block):
    return block.tocsr()


def _block_astype(block, dtype):
    return block.astype(dtype)


def _block_get(block):
    return block.get()


def _block_matmul(block, b):
    return block @ b


def _pack_row_block(*chunks, tile_width, slots, dtype):
    """One row of chunks -> one TwELLMatrix: columns joined first, so tiles stay whole."""
    x = chunks[0] if len(chunks) == 1 else _hstack(chunks)
    return TwELLMatrix(x, tile_width=tile_width, slots=slots, dtype=dtype)


def _hstack(chunks):
    import scipy.sparse as sp

    if sp.issparse(chunks[0]):
        return sp.hstack(chunks, format="csr")
    if _arrays.is_cupyx_sparse(chunks[0]):
        return _arrays.cupyx_sparse().hstack(chunks, format="csr")
    return _arrays.array_module(*chunks).concatenate(chunks, axis=1)


def _check_loaded_block(path, rows, k, tile_width, dtype):
    block = _load_block_file(path)
    if not isinstance(block, TwELLMatrix):
        raise ValueError(f"{path}: holds a {type(block).__name__}, not a TwELLMatrix")
    expected = ((rows, k), tile_width, dtype)
    found = (block.shape, block.tile_width, block.dtype)
    if found != expected:
        raise ValueError(
            f"{path}: does not match the manifest: expected shape {expected[0]}, tile_width "
            f"{tile_width}, dtype {dtype}; got shape {block.shape}, tile_width "
            f"{block.tile_width}, dtype {block.dtype}"
        )
    return block


# -- constructors -----------------------------------------------------------------------------

def _is_sparse(x):
    import scipy.sparse as sp

    return sp.issparse(x) or _arrays.is_cupyx_sparse(x)


def _meta_on_gpu(meta):
    return _arrays.is_cupy_array(meta) or _arrays.is_cupyx_sparse(meta)


def from_dask_array(x, *, tile_width=GEMM_TILE_WIDTH, slots="auto", dtype=None,
                    rechunk=True):
    """Pack a 2-D Dask array, one row block of chunks at a time.

    Parameters
    ----------
    x : dask.array.Array, shape (M, K)
        Chunks may be dense (NumPy or CuPy) or sparse (``scipy.sparse`` or
        ``cupyx.scipy.sparse``); the blocks live where the chunks do.
    tile_width : int, optional
        Columns per tile, in [1, 65536]. Default 256. Not ``"auto"``: the blocks share one
        width, packed apart (:func:`twell.auto_tile_width` gives the one ``TwELLMatrix``
        would take from the shape and the entry count).
    slots : int or "auto", optional
        Slots per (row, tile); ``"auto"`` (default) lets every block choose
        its own (see :func:`twell.auto_slots`).
    dtype : dtype, optional
        Value dtype; default that of ``x`` (bool and integers become float64).
    rechunk : bool, optional
        When ``x`` has several column chunks, join each row of chunks into
        one block (columns whole, so that no tile is cut). Default True;
        with False, such an ``x`` is an error instead.

    Returns
    -------
    DaskTwELLMatrix
        One block per row chunk of ``x``; nothing is computed yet.

    Raises
    ------
    TypeError
        When ``x`` is not a Dask array, or has an unsupported dtype.
    ValueError
        When ``x`` is not 2-D, has unknown chunk sizes (call
        ``x.compute_chunk_sizes()``), is split along its columns with
        ``rechunk=False``, or ``tile_width`` is ``"auto"``.
    ImportError
        When Dask is not installed.

    See Also
    --------
    from_blocks : from TwELLMatrix blocks.
    twell.TwELLMatrix : the constructor every block goes through.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> import twell.dask
    >>> x = da.from_array(np.eye(5, dtype=np.float32), chunks=(2, 3))
    >>> A = twell.dask.from_dask_array(x, tile_width=4, slots=1)
    >>> A.row_chunks, A.tile_width
    ((2, 2, 1), 4)
    """
    dask, da = _dask()
    if not isinstance(x, da.Array):
        raise TypeError(
            f"x must be a dask.array.Array; got {type(x).__name__} (wrap it with "
            "dask.array.from_array, or use twell.TwELLMatrix for an in-memory array)"
        )
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D; got x.ndim={x.ndim}")
    tile_width = check_tile_width(tile_width)
    if tile_width == "auto":
        # The blocks are packed apart and share one width: "auto" would need every block's
        # entries counted first.
        raise ValueError(
            'tile_width must be an int for a Dask array, whose blocks share one tile width; '
            'got tile_width="auto" (twell.auto_tile_width(shape, nnz) gives the width that '
            "TwELLMatrix would take)"
        )
    slots = check_slots(slots, tile_width)
    dtype = value_dtype(x.dtype if dtype is None else dtype, "x.dtype" if dtype is None else
                        "dtype")
    if any(math.isnan(c) for axis in x.chunks for c in axis):
        raise ValueError(
            "x has unknown chunk sizes, so its rows cannot be partitioned nor its columns "
            "rechunked; call x.compute_chunk_sizes() first"
        )
    shape = check_shape(x.shape, "x.shape")
    if x.numblocks[1] > 1 and not rechunk:
        raise ValueError(
            f"x is split into {x.numblocks[1]} column chunks {x.chunks[1]}; twell.dask "
            "partitions rows only, so that tiles stay whole: pass rechunk=True or rechunk x "
            "with x.rechunk({1: -1})"
        )
    pack = dask.delayed(_pack_row_block)
    chunk_grid = x.to_delayed()  # object array of Delayed, (row chunks, column chunks)
    blocks = [pack(*row, tile_width=tile_width, slots=slots, dtype=dtype) for row in chunk_grid]
    return DaskTwELLMatrix(blocks, x.chunks[0], shape, dtype, tile_width, _meta_on_gpu(x._meta))


def from_blocks(blocks):
    """Stack TwELLMatrix row blocks, top to bottom, without copying them.

    Parameters
    ----------
    blocks : sequence of TwELLMatrix
        At least one. All NumPy- or all CuPy-backed, with the same number
        of columns, tile width and dtype; any row counts (zero included) and
        slot counts.

    Returns
    -------
    DaskTwELLMatrix

    Raises
    ------
    TypeError
        When a block is not a TwELLMatrix, or NumPy and CuPy blocks are mixed.
    ValueError
        When there is no block, or the blocks differ in columns, tile width
        or dtype (the message names the first block that differs).

    Examples
    --------
    >>> import numpy as np, twell, twell.dask
    >>> a = twell.TwELLMatrix(np.eye(2, 8), tile_width=4)
    >>> b = twell.TwELLMatrix(np.ones((3, 8)), tile_width=4)
    >>> twell.dask.from_blocks([a, b])
    <DaskTwELLMatrix 5x8, dtype=float64, tile_width=4, 2 row blocks of (2, 3) rows, on cpu>
    >>> twell.dask.from_blocks([a, twell.TwELLMatrix(np.ones((3, 8)))])
    Traceback (most recent call last):
    ...
    ValueError: blocks must share one tile_width; blocks[0].tile_width=4 but ...=256
    """
    _dask()
    if isinstance(blocks, TwELLMatrix) or not isinstance(blocks, (list, tuple)):
        raise TypeError(f"blocks must be a list of TwELLMatrix; got {type(blocks).__name__}")
    if not blocks:
        raise ValueError("blocks must hold at least one TwELLMatrix; got an empty list")
    for i, b in enumerate(blocks):
        if not isinstance(b, TwELLMatrix):
            raise TypeError(f"blocks[{i}] must be a TwELLMatrix; got {type(b).__name__}")
    first = blocks[0]
    for i, b in enumerate(blocks[1:], start=1):
        for name, mine, theirs in (("columns", first.shape[1], b.shape[1]),
                                   ("tile_width", first.tile_width, b.tile_width),
                                   ("dtype", first.dtype, b.dtype)):
            if mine != theirs:
                attr = "shape[1]" if name == "columns" else name
                raise ValueError(f"blocks must share one {name}; blocks[0].{attr}={mine} but "
                                 f"blocks[{i}].{attr}={theirs}")
    on_gpu = [b.device != "cpu" for b in blocks]
    if any(on_gpu) and not all(on_gpu):
        raise TypeError("blocks must be all NumPy-backed or all CuPy-backed; move them "
                        "explicitly with .get() or cupy")
    delayed = [_delayed_value(b, "twell-block") for b in blocks]
    shape = (sum(b.shape[0] for b in blocks), first.shape[1])
    return DaskTwELLMatrix(delayed, [b.shape[0] for b in blocks], shape, first.dtype,
                           first.tile_width, on_gpu[0])


def load(directory):
    """Read a matrix written by :meth:`DaskTwELLMatrix.save`.

    The manifest is read and checked now; each block file is read (with
    :func:`twell.load`, which checks it fully) and compared with the
    manifest by the task that needs it, when the matrix is computed.

    Parameters
    ----------
    directory : str or os.PathLike

    Returns
    -------
    DaskTwELLMatrix
        NumPy-backed blocks.

    Raises
    ------
    FileNotFoundError
        When the manifest or a block file is missing.
    ValueError
        When the manifest is not valid JSON, lacks a key or has an unknown
        one, holds a value of the wrong type, or its row chunks do not add
        up to the shape; at compute time, when a block file is not a valid
        twell file or does not match the manifest. Messages name the file.

    Examples
    --------
    >>> import tempfile, dask, numpy as np, twell, twell.dask
    >>> A = twell.dask.from_blocks([twell.TwELLMatrix(np.eye(2, 3)),
    ...                             twell.TwELLMatrix(np.ones((1, 3)))])
    >>> with tempfile.TemporaryDirectory() as d, dask.config.set(scheduler="synchronous"):
    ...     A.save(d)
    ...     B = twell.dask.load(d)
    ...     dense = B.to_dask_array().compute()
    >>> B
    <DaskTwELLMatrix 3x3, dtype=float64, tile_width=256, 2 row blocks of (2, 1) rows, on cpu>
    >>> dense
    array([[1., 0., 0.],
           [0., 1., 0.],
           [1., 1., 1.]])
    """
    dask, _ = _dask()
    directory = os.fspath(directory)
    path = os.path.join(directory, MANIFEST)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = _check_manifest(text, path)
    check = dask.delayed(_check_loaded_block)
    blocks = []
    for name, rows in zip(m["blocks"], m["row_chunks"], strict=True):
        block_path = os.path.join(directory, name)
        if not os.path.isfile(block_path):
            raise FileNotFoundError(f"{block_path}: block file named in {path} is missing")
        blocks.append(check(block_path, rows, m["shape"][1], m["tile_width"], m["dtype"]))
    return DaskTwELLMatrix(blocks, m["row_chunks"], m["shape"], m["dtype"], m["tile_width"],
                           on_gpu=False)


def _check_manifest(text, path):
    """The parsed manifest, every value checked; ValueError naming ``path`` otherwise."""
    def error(message):
        return ValueError(f"{path}: invalid twell.dask manifest: {message}")

    try:
        m = json.loads(text)
    except ValueError as exc:
        raise error(f"not valid JSON ({exc})") from None
    if not isinstance(m, dict):
        raise error(f"must be a JSON object; got {type(m).__name__}")
    if m.get("twell_format") != MANIFEST_FORMAT:
        raise error(f"twell_format must be {MANIFEST_FORMAT!r}; got {m.get('twell_format')!r}")
    missing = [key for key in _MANIFEST_KEYS if key not in m]
    if missing:
        raise error(f"missing key{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(map(repr, missing))}")
    unknown = sorted(set(m) - set(_MANIFEST_KEYS))
    if unknown:
        raise error(f"unexpected key{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(map(repr, unknown))}")

    def is_int(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    version = m["twell_version"]
    if not is_int(version) or version != MANIFEST_VERSION:
        newer = " (written by a newer twell: upgrade twell)" if (
            is_int(version) and version > MANIFEST_VERSION) else ""
        raise error(f"twell_version must be {MANIFEST_VERSION}; got {version!r}{newer}")
    shape = m["shape"]
    if not (isinstance(shape, list) and len(shape) == 2 and all(map(is_int, shape))):
        raise error(f"shape must be a list of two ints; got {shape!r}")
    try:
        shape = check_shape(shape)
        tile_width = m["tile_width"]
        if not is_int(tile_width):
            raise ValueError(f"tile_width must be an int; got {tile_width!r}")
        tile_width = check_tile_width(tile_width)
    except (TypeError, ValueError) as exc:
        raise error(str(exc)) from None
    if m["dtype"] not in _DTYPES:
        raise error(f"dtype must be one of {', '.join(_DTYPES)}; got {m['dtype']!r}")
    rows, names = m["row_chunks"], m["blocks"]
    if not (isinstance(rows, list) and rows and all(is_int(r) and r >= 0 for r in rows)):
        raise error(f"row_chunks must be a non-empty list of non-negative ints; got {rows!r}")
    if sum(rows) != shape[0]:
        raise error(f"row_chunks add up to {sum(rows)} rows; shape says {shape[0]}")
    if not (isinstance(names, list) and len(names) == len(rows)):
        raise error(f"blocks must be a list of {len(rows)} file names, one per row chunk; "
                    f"got {names!r}")
    for name in names:
        # Plain names only: a manifest never points outside its directory.
        if not (isinstance(name, str) and name and os.path.basename(name) == name
                and name not in (".", "..") and "/" not in name and "\\" not in name):
            raise error(f"blocks must hold plain file names in the directory; got {name!r}")
    if len(set(names)) != len(names):
        raise error("blocks names a file twice")
    return {"shape": shape, "dtype": _DTYPES[m["dtype"]], "tile_width": tile_width,
            "row_chunks": rows, "blocks": names}
