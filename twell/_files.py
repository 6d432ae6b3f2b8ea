"""Matrix files of the command line: Matrix Market, scipy .npz, NumPy .npy and twell files.

The format of a file comes from its name unless given:

============  ===============================  ===========================================
name ends     reading                          writing
============  ===============================  ===========================================
``.mtx``      Matrix Market (scipy.io.mmread)  Matrix Market, coordinate, real
``.npy``      a dense 2-D NumPy array          the dense array
``.npz``      by content (below)               scipy.sparse.save_npz (CSR, compressed)
``.twell``    by content (below)               twell.save (uncompressed)
============  ===============================  ===========================================

``.twell.npz`` is a twell file when writing. Read by content, an ``.npz``
or ``.twell`` file is a twell file when it has the field ``twell_format``,
a scipy.sparse file when it has the field ``format`` (see
:func:`twell._io.npz_kind`).

What each format holds: Matrix Market and scipy's ``.npz`` have no float16
or bfloat16, NumPy's ``.npy`` no bfloat16 (it would be written as opaque
2-byte records): such values are written as float32, which holds them
exactly. Matrix Market text is written from float64 values, whose shortest
decimal form reads back exactly; it is read as float64 (integer files too),
so pass a dtype to get float32 back.
"""

import os

import numpy as np

#: Format names (the values of --from and --to) and what they are.
FORMATS = {
    "mtx": "Matrix Market",
    "npz": "scipy.sparse .npz",
    "npy": "NumPy .npy, dense",
    "twell": "twell file",
}

_SUFFIXES = ((".twell.npz", "twell"), (".twell", "twell"), (".mtx", "mtx"), (".npy", "npy"),
             (".npz", "npz"))


def format_from_name(path, writing):
    """The format that ``path``'s name gives, or None when its extension is not known.

    When reading, ``.npz`` and ``.twell`` give ``"npz?"``: the content decides.
    """
    name = os.path.basename(os.fspath(path)).lower()
    for suffix, fmt in _SUFFIXES:
        if name.endswith(suffix):
            if not writing and fmt in ("twell", "npz"):
                return "npz?"
            return fmt
    return None


def _unknown(path, option):
    return ValueError(
        f"{path}: cannot tell the file format from the name (known: .mtx, .npz, .npy, .twell, "
        f".twell.npz); give it with {option} {'|'.join(FORMATS)}"
    )


def output_format(path, given=None):
    """The format to write ``path`` in: ``given``, else from the name (ValueError if unknown)."""
    fmt = given or format_from_name(path, writing=True)
    if fmt is None:
        raise _unknown(path, "--to")
    return fmt


def read(path, given=None):
    """Read a matrix file.

    Returns
    -------
    matrix : scipy.sparse array/matrix, numpy.ndarray, TwELLMatrix or ELLMatrix
    fmt : str
        The format it was read as (a key of :data:`FORMATS`).

    Raises
    ------
    OSError
        The file cannot be opened (FileNotFoundError when missing).
    ValueError
        The format is unknown, or the file is not valid in it; the message
        starts with the path.
    """
    from . import _io

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a matrix file")
    fmt = given or format_from_name(path, writing=False)
    if fmt is None:
        raise _unknown(path, "--from")
    if fmt == "npz?":
        kind = _io.npz_kind(path)
        if kind is None and path.lower().endswith(".npz") and _is_zip(path):
            raise ValueError(f"{path}: neither a twell file (no field 'twell_format') nor a "
                             "scipy.sparse .npz file (no field 'format')")
        fmt = "npz" if kind == "scipy" else "twell"  # twell.load explains any other problem
    return _READERS[fmt](path), fmt


def _is_zip(path):
    import zipfile

    return zipfile.is_zipfile(path)


def _read_twell(path):
    from . import _io

    return _io.load(path)


def _read_npz(path):
    import zipfile

    import scipy.sparse as sp

    from . import _io

    if _io.npz_kind(path) == "twell":
        raise ValueError(f"{path}: is a twell file, not a scipy.sparse .npz file "
                         "(read it as twell)")
    try:
        return sp.load_npz(path)  # numpy.load(allow_pickle=False) inside
    except (ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        detail = f"no field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{path}: not a valid scipy.sparse .npz file ({detail})") from None


def _read_mtx(path):
    import scipy.io

    try:
        with open(path, "rb") as f:  # a file object: scipy would try other names for a path
            return scipy.io.mmread(f)
    except (ValueError, TypeError, OverflowError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a valid Matrix Market file ({exc})") from None


def _read_npy(path):
    from ._validation import value_dtype

    try:
        x = np.load(path, allow_pickle=False)
    except (ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not a valid .npy file ({exc})") from None
    if not isinstance(x, np.ndarray):
        x.close()
        raise ValueError(f"{path}: is an .npz archive, not a .npy array file")
    if x.ndim != 2:
        raise ValueError(f"{path}: the array must be 2-D (a matrix); got shape {x.shape}")
    try:
        value_dtype(x.dtype, "the array's dtype")
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return x


_READERS = {"mtx": _read_mtx, "npz": _read_npz, "npy": _read_npy, "twell": _read_twell}


def write(path, fmt, a):
    """Write the TwELLMatrix ``a`` to ``path`` in format ``fmt``.

    The file is written under a temporary name in the same folder and then
    renamed, so a failed write leaves no partial output.

    Returns
    -------
    numpy.dtype
        The dtype of the values written (see the module notes).
    """
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: the folder {folder!r} does not exist")
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            written = _WRITERS[fmt](f, a)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return written


def _storable(a, narrow):
    """``a`` cast to float32 when its dtype is in ``narrow`` (exact), else ``a``."""
    return a.astype(np.float32) if a.dtype in narrow else a


def _write_twell(f, a):
    from . import _io

    _io.save(f, a)
    return a.dtype


def _write_npz(f, a):
    import scipy.sparse as sp

    from ._validation import bfloat16

    a = _storable(a, (np.float16, bfloat16))
    sp.save_npz(f, sp.csr_array(a.tocsr()), compressed=True)
    return a.dtype


def _write_mtx(f, a):
    import scipy.io

    from ._validation import bfloat16

    a = _storable(a, (np.float16, bfloat16))
    # float64 values: their shortest decimals read back exactly, also for float32 input.
    scipy.io.mmwrite(f, a.tocsr().astype(np.float64))
    return a.dtype


def _write_npy(f, a):
    from ._validation import bfloat16

    a = _storable(a, (bfloat16,))
    np.save(f, a.toarray(), allow_pickle=False)
    return a.dtype


_WRITERS = {"mtx": _write_mtx, "npz": _write_npz, "npy": _write_npy, "twell": _write_twell}
