"""twell's file format: :func:`save` and :func:`load`.

A twell file is a NumPy ``.npz`` archive (a zip of ``.npy`` arrays, written
uncompressed unless asked) holding one :class:`TwELLMatrix` or
:class:`ELLMatrix`. Every field is a plain numeric or string array, so the
file is read with ``allow_pickle=False``: loading never runs code from the
file. Format version 1 has these fields, and no others:

=================  ===========  =================================================
field              dtype        value
=================  ===========  =================================================
``twell_format``   str, 0-d     ``"TwELLMatrix"`` or ``"ELLMatrix"``
``twell_version``  int64, 0-d   ``1``
``shape``          int64 (2,)   ``(M, K)``
``dtype``          str, 0-d     ``"float64"``, ``"float32"``, ``"float16"`` or
                                ``"bfloat16"``: the value dtype
=================  ===========  =================================================

A TwELLMatrix adds ``tile_width`` (int64, 0-d) and its six storage arrays
with their in-memory dtypes and shapes: ``counts`` (int32), ``data``,
``indices`` (uint16, or int32 for tiles wider than 65536 columns),
``overflow_indptr`` (int64), ``overflow_indices`` (int32), ``overflow_data``.
An ELLMatrix adds ``data`` and ``indices`` (int32). Value arrays have the
dtype that ``dtype`` names, except bfloat16, which ``.npy`` cannot describe
without pickling: its values are stored as their uint16 bit patterns.

An ``.npz`` file is a twell file when it has the field ``twell_format``
(the member ``twell_format.npy``); ``scipy.sparse.save_npz`` files have a
``format`` field instead. :func:`npz_kind` applies this rule.

Loading checks the archive (zip structure and the CRC-32 of every member),
the version, that every field is present and no other, every field's dtype
and shape, then every invariant of the matrix (``validate()``). A
truncated or corrupted file, or one whose fields break these rules, is a
``ValueError`` whose message names the file and the problem. (An edit that
keeps every rule and recomputes the CRC-32s gives another valid matrix: the
format carries no signature.)

Each member's ``.npy`` header (dtype, shape, order) is read and checked
against the sizes that the file's own fields imply before its data is: the
shape and tile width give ``counts`` its shape; ``data`` (slots at most the
tile width, within the storage limit) gives ``indices`` theirs; the counts
bound the overflow (at most ``tile_width - slots`` entries a full (row,
tile)); an ELL file's width is at most its column count. A member must hold
exactly the bytes its header describes. So loading takes memory in
proportion to the matrix the fields describe (about twice the file plus the
result, plus a small constant), never to what a member claims: a small
compressed file cannot make it decompress gigabytes.
"""

import math
import os
import zipfile

import numpy as np

from . import _layout
from ._arguments import check_shape, check_storage, check_tile_width
from ._dtypes import SUPPORTED_DTYPES, bfloat16

#: The version this twell writes and reads.
FORMAT_VERSION = 1

#: Name of the field that marks a twell file (and tells which class it holds).
MARKER = "twell_format"

_DTYPES = {str(d): d for d in SUPPORTED_DTYPES}  # "float64", ..., "bfloat16"
_COMMON = (MARKER, "twell_version", "shape", "dtype")
_TWELL_ARRAYS = ("counts", "data", "indices", "overflow_indptr", "overflow_indices",
                 "overflow_data")
_FIELDS = {
    "TwELLMatrix": _COMMON + ("tile_width",) + _TWELL_ARRAYS,
    "ELLMatrix": _COMMON + ("data", "indices"),
}
_ELL_INDEX_DTYPE = np.dtype(np.int32)


def save(path, A, *, compressed=False):
    """Write a TwELLMatrix or ELLMatrix to a twell file.

    Parameters
    ----------
    path : str, os.PathLike or binary file object
        Where to write. The name is used as given (unlike ``numpy.savez``,
        no ``.npz`` is appended); ``.twell`` is the customary extension.
    A : TwELLMatrix or ELLMatrix
        The matrix. A CuPy-backed matrix is first copied to the host
        (``A.get()``); the file is the same as for its NumPy twin.
    compressed : bool, optional
        Deflate the arrays (``numpy.savez_compressed``). Default False:
        writing and reading are then as fast as the disk; padding slots,
        which compress well, cost at most what they cost in memory.

    Raises
    ------
    TypeError
        When ``A`` is neither a TwELLMatrix nor an ELLMatrix.
    OSError
        When the file cannot be written.

    See Also
    --------
    load : read it back.
    scipy.sparse.save_npz : the scipy.sparse counterpart.

    Notes
    -----
    The file format is described in the module :mod:`twell._io`: an
    ``.npz`` archive of plain arrays with a version field, readable with
    ``numpy.load(path, allow_pickle=False)`` by any NumPy program.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, twell
    >>> a = twell.TwELLMatrix(np.eye(3, dtype=twell.bfloat16), tile_width=2, slots=1)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = os.path.join(tmp, "eye.twell")
    ...     twell.save(path, a)
    ...     b = twell.load(path)
    >>> b
    <TwELLMatrix 3x3, dtype=bfloat16, nnz=3, tile_width=2, slots=1, ...>
    >>> bool((b.toarray() == a.toarray()).all())
    True
    """
    fields = _fields(A)
    writer = np.savez_compressed if compressed else np.savez
    if hasattr(path, "write"):
        writer(path, **fields)
        return
    with open(os.fspath(path), "wb") as f:  # an open file: savez would append ".npz" to a name
        writer(f, **fields)


def _fields(A):
    from ._ell import ELLMatrix
    from ._twell import TwELLMatrix

    if not isinstance(A, (TwELLMatrix, ELLMatrix)):
        raise TypeError(
            f"A must be a TwELLMatrix or an ELLMatrix; got {type(A).__name__} (convert it with "
            "twell.TwELLMatrix(A) first)"
        )
    A = A.get()  # device-to-host copy for a CuPy-backed matrix
    fields = {
        MARKER: np.array("TwELLMatrix" if isinstance(A, TwELLMatrix) else "ELLMatrix"),
        "twell_version": np.array(FORMAT_VERSION, dtype=np.int64),
        "shape": np.array(A.shape, dtype=np.int64),
        "dtype": np.array(str(A.dtype)),
    }
    if isinstance(A, TwELLMatrix):
        fields["tile_width"] = np.array(A.tile_width, dtype=np.int64)
        arrays = {name: getattr(A, name) for name in _TWELL_ARRAYS}
    else:
        arrays = {"data": A.data, "indices": A.indices}
    for name, a in arrays.items():
        fields[name] = a.view(np.uint16) if a.dtype == bfloat16 else a
    return fields


def load(path):
    """Read a matrix written by :func:`save`.

    Parameters
    ----------
    path : str, os.PathLike or binary file object
        A twell file.

    Returns
    -------
    TwELLMatrix or ELLMatrix
        NumPy-backed, as written. For the GPU, hand its storage arrays as
        CuPy arrays to the constructor: ``TwELLMatrix(tuple(cupy.asarray(a)
        for a in arrays), shape=..., tile_width=...)``.

    Raises
    ------
    OSError
        When the file cannot be opened (``FileNotFoundError`` when missing).
    ValueError
        When the file is not a twell file, is truncated or corrupted (zip
        structure, CRC-32), was written by a newer format version, lacks a
        field or has an unknown one, holds a field of the wrong dtype or
        shape (checked from its ``.npy`` header before its data is read: a
        member that claims more than the file's fields imply is never read)
        or a pickled object, or when the matrix breaks an invariant (for
        example a count above the slot count). The message starts with the
        file name and names the problem.

    See Also
    --------
    save : the writer, and the file format.
    scipy.sparse.load_npz : the scipy.sparse counterpart.

    Examples
    --------
    >>> import io
    >>> import numpy as np, twell
    >>> e = twell.ELLMatrix(np.array([[0.0, 2.0], [1.0, 0.0]]))
    >>> f = io.BytesIO()
    >>> twell.save(f, e)
    >>> _ = f.seek(0)
    >>> twell.load(f)
    <ELLMatrix 2x2, dtype=float64, nnz=2, width=1>
    """
    label = _label(path)
    npz = _open(path, label)
    with npz:
        return _read(npz, label)


def _label(path):
    """The file's name for messages."""
    if hasattr(path, "read"):
        return str(getattr(path, "name", "<file object>"))
    return os.fspath(path)


def _open(path, label):
    """``numpy.load`` of an .npz archive; anything else is a ValueError naming the file."""
    if hasattr(path, "read"):
        start = path.tell()
        is_zip = zipfile.is_zipfile(path)
        path.seek(start)
    else:
        with open(os.fspath(path), "rb"):  # OSError (missing, unreadable) as it is
            pass
        is_zip = zipfile.is_zipfile(path)
    if not is_zip:
        raise ValueError(f"{label}: not a twell file: not a zip (.npz) archive, or a truncated one")
    try:
        npz = np.load(path, allow_pickle=False)
    except OSError:
        raise
    except Exception as exc:  # a damaged zip directory fails in many ways (see _Fields.get)
        raise ValueError(f"{label}: not a twell file: unreadable .npz archive "
                         f"({type(exc).__name__}: {exc})") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise ValueError(f"{label}: not a twell file: not an .npz archive")
    return npz


class _Fields:
    """Checked access to the fields of an open twell archive.

    Every read checks the member's ``.npy`` header first (:meth:`header`), so that nothing
    is decompressed or allocated before its size is known to be the one expected.
    """

    #: The longest string a field may hold, in characters (the longest valid one is 11).
    MAX_STRING = 64

    def __init__(self, npz, label):
        self.npz, self.label = npz, label
        self.names = set(npz.zip.namelist())
        self.starts = {}  # member -> where its data starts (after the .npy header)

    def error(self, message):
        return ValueError(f"{self.label}: invalid twell file: {message}")

    def unreadable(self, name, exc):
        # Whatever the damage: a bad .npy header (ValueError), a bad CRC-32 (BadZipFile), a
        # flipped compression method (NotImplementedError), broken deflate data
        # (zlib.error), an "encrypted" flag (RuntimeError), truncated data (EOFError), ...
        return self.error(f"field {name!r} cannot be read: {type(exc).__name__}: {exc}")

    def member(self, name):
        return f"{name}.npy" if f"{name}.npy" in self.names else name

    def header(self, name):
        """``(shape, fortran_order, dtype)`` from the member's ``.npy`` header, its data
        unread. Objects (pickles) are refused here."""
        try:
            with self.npz.zip.open(self.member(name)) as fp:
                shape, fortran, dtype = npy_header(fp)
                self.starts[name] = fp.tell()
        except Exception as exc:
            raise self.unreadable(name, exc) from None
        if dtype.hasobject:
            raise self.error(f"field {name!r} holds Python objects (dtype {dtype}); twell "
                             "files hold plain arrays")
        return shape, fortran, dtype

    def get(self, name, shape, dtype):
        """The array of a member whose header (``shape``, ``dtype``) passed the checks."""
        # Nothing past the described data: numpy would leave it unread, and the zip CRC-32,
        # checked when the member is read to its end, unchecked.
        size = self.npz.zip.getinfo(self.member(name)).file_size
        described = self.starts[name] + math.prod(shape) * dtype.itemsize
        if size != described:
            raise self.error(f"field {name!r}: the member holds {size} bytes; its .npy header "
                             f"describes {described}")
        try:
            return self.npz[name]
        except Exception as exc:
            raise self.unreadable(name, exc) from None

    def array(self, name, dtype, shape):
        """Field ``name`` with exactly ``dtype`` (either byte order), C order, and a shape
        that ``shape`` accepts: a function of the header's shape that returns what is wrong
        with it, or None."""
        got, fortran, stored = self.header(name)
        if stored.newbyteorder("=") != dtype:
            raise self.error(f"field {name!r} must have dtype {dtype}; got {stored}")
        problem = shape(got)
        if problem:
            raise self.error(f"{name} {problem}")
        if fortran and len(got) > 1:
            # Written by numpy.savez from C-ordered arrays: Fortran order means tampering,
            # and reading the bytes in the other order would scramble the matrix.
            raise self.error(f"field {name!r} is stored in Fortran order; twell writes C order")
        return self.get(name, got, stored).astype(dtype, copy=False)  # native byte order

    def string(self, name):
        return str(self.scalar(name, "U", "str"))

    def integer(self, name):
        return int(self.scalar(name, "iu", "int"))

    def scalar(self, name, kinds, what):
        shape, _, dtype = self.header(name)
        if shape != () or dtype.kind not in kinds:
            raise self.error(f"field {name!r} must be a single {what}; got an array of dtype "
                             f"{dtype} and shape {shape}")
        if dtype.kind == "U" and dtype.itemsize > 4 * self.MAX_STRING:
            raise self.error(f"field {name!r} must be a string of at most {self.MAX_STRING} "
                             f"characters; got dtype {dtype}")
        return self.get(name, shape, dtype)[()]


def npz_kind(path):
    """``"twell"``, ``"scipy"`` or None: which writer made an .npz file, from its field names.

    twell files have the field ``twell_format``; ``scipy.sparse.save_npz``
    writes ``format``. Reads only the zip directory; raises OSError when
    the file cannot be opened and returns None when it is not a zip archive.
    """
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
    except OSError:
        raise
    except Exception:  # not a zip, or a damaged one (see _Fields.get)
        return None
    if f"{MARKER}.npy" in names:
        return "twell"
    if "format.npy" in names:
        return "scipy"
    return None


def _read(npz, label):
    f = _Fields(npz, label)
    names = set(npz.files)
    if MARKER not in names:
        hint = (" (it looks like a scipy.sparse.save_npz file: read it with "
                "scipy.sparse.load_npz)" if "format" in names else "")
        raise ValueError(f"{label}: not a twell file: it has no {MARKER!r} field{hint}")
    kind = f.string(MARKER)
    if kind not in _FIELDS:
        raise f.error(f"{MARKER} must be one of {', '.join(map(repr, _FIELDS))}; got {kind!r}")
    if "twell_version" not in names:
        raise f.error("missing field 'twell_version'")
    version = f.integer("twell_version")
    if version != FORMAT_VERSION:
        newer = " (written by a newer twell: upgrade twell)" if version > FORMAT_VERSION else ""
        raise f.error(f"format version {version}; this twell reads version "
                      f"{FORMAT_VERSION}{newer}")
    expected = _FIELDS[kind]
    missing = [n for n in expected if n not in names]
    if missing:
        raise f.error(f"missing field{'s' if len(missing) > 1 else ''} "
                      f"{', '.join(map(repr, missing))}")
    unknown = sorted(names - set(expected))
    if unknown:
        raise f.error(f"unexpected field{'s' if len(unknown) > 1 else ''} "
                      f"{', '.join(map(repr, unknown))} for a {kind}")

    shape = tuple(int(v) for v in f.array("shape", np.dtype(np.int64), lambda got: None if (
        got == (2,)) else f"must hold two ints (M, K); got shape {got}"))
    dtype_name = f.string("dtype")
    if dtype_name not in _DTYPES:
        raise f.error(f"dtype must be one of {', '.join(_DTYPES)}; got {dtype_name!r}")
    dtype = _DTYPES[dtype_name]
    stored = np.dtype(np.uint16) if dtype == bfloat16 else dtype

    def values(name, shape):
        a = f.array(name, stored, shape)
        return a.view(bfloat16) if dtype == bfloat16 else a

    try:
        shape = check_shape(shape)
        m, k = shape
        if kind == "ELLMatrix":
            def ell_shape(got):
                # A row holds at most K entries: a wider width is padding only.
                if len(got) != 2 or got[0] != m or (m and got[1] > k):
                    return (f"must have shape (M, width) with M = {m} and width at most K = "
                            f"{k}; got {got}")
                return None

            data = values("data", ell_shape)
            return _ell(data, f.array("indices", _ELL_INDEX_DTYPE, _expect_shape(
                data.shape, "the shape of data")), shape)
        from ._twell import TwELLMatrix

        tile_width = check_tile_width(f.integer("tile_width"))
        nt = _layout.n_tiles(k, tile_width)
        counts = f.array("counts", _layout.COUNT_DTYPE, _expect_shape(
            (m, nt), "(M, n_tiles)"))

        def data_shape(got):
            if len(got) != 3:
                return f"must have 3 dimensions; got shape {got}"
            if got[:2] != (m, nt):
                return f"must have shape (M, n_tiles, slots) with (M, n_tiles) = {(m, nt)}; " \
                       f"got {got}"
            if not 1 <= got[2] <= tile_width:
                return f"must have between 1 and tile_width={tile_width} slots; got shape {got}"
            check_storage(shape, tile_width, got[2])
            return None

        data = values("data", data_shape)
        slots = data.shape[2]
        indices = f.array("indices", _layout.index_dtype(tile_width), _expect_shape(
            data.shape, "the shape of data"))
        indptr = f.array("overflow_indptr", _layout.OVERFLOW_INDPTR_DTYPE, _expect_shape(
            (m + 1,), "(M + 1,)"))
        # Entries overflow only the (row, tile) pairs whose slots are all used, at most
        # tile_width - slots each: the counts bound the overflow before it is read. (A count
        # above the slots counts here too: validate() names it.)
        room = int(np.count_nonzero(counts >= slots)) * (tile_width - slots)

        def overflow_shape(got):
            if len(got) != 1:
                return f"must have 1 dimension; got shape {got}"
            if got[0] > room:
                return (f"holds {got[0]} entries; the counts leave room for at most {room} "
                        "overflow entries")
            return None

        ocols = f.array("overflow_indices", _layout.OVERFLOW_INDEX_DTYPE, overflow_shape)
        odata = values("overflow_data", _expect_shape(ocols.shape, "like overflow_indices",
                                                      named=False))
        arrays = (counts, data, indices, indptr, ocols, odata)
        # The validating constructor: validate() checks every invariant.
        return TwELLMatrix(arrays, shape=shape, tile_width=tile_width)
    except (TypeError, ValueError) as exc:
        if str(exc).startswith(f"{label}: "):
            raise
        raise f.error(str(exc)) from None


def _expect_shape(want, what, named=True):
    """A shape check for :meth:`_Fields.array`: exactly ``want``, called ``what``."""
    def check(got):
        if tuple(got) == tuple(want):
            return None
        if named:
            return (f"must have {what} {want}; got {got}" if what.startswith("the ")
                    else f"must have shape {what} = {want}; got {got}")
        return f"must have shape {want} {what}; got {got}"
    return check


def _ell(data, indices, shape):
    from ._ell import ELLMatrix

    e = ELLMatrix._wrap(data, indices, shape)
    e.validate()
    return e


def npy_header(fp):
    """``(shape, fortran_order, dtype)`` of the ``.npy`` array at ``fp``'s position, which
    is left at its data (read unread): NumPy's header readers, version 1.0 or 2.0."""
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fp)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(fp)
    raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
