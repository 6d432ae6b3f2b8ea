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

Matrix Market files are checked before scipy reads them (:func:`read_mtx_header`,
:func:`check_mtx_body`): the banner and the size line, the sizes against twell's limits,
every byte of the entries (numbers only: digits, minus signs, points, exponents, ``nan``,
``inf``; scipy's parser takes no ``+`` before a number), the numbers on each line and the
count of lines. scipy's parser ends the process on some malformed input (a NUL byte, a
dense array of zero rows holding a value), reads some silently wrong (``1.5abc`` as 1.5,
``0x10`` as 0) and allocates what the size line declares before reading a line; after
these checks it gets well-formed text only, and its allocation is bounded by the file's
length. Compressed Matrix Market files (``.gz``, ``.bz2``) are not read: decompress them
first.

What each format holds: Matrix Market and scipy's ``.npz`` have no float16
or bfloat16, NumPy's ``.npy`` no bfloat16 (it would be written as opaque
2-byte records): such values are written as float32, which holds them
exactly. Matrix Market text is written from float64 values, whose shortest
decimal form reads back exactly; it is read as float64 (integer files too),
so pass a dtype to get float32 back.
"""

import functools
import math
import os
from typing import NamedTuple

import numpy as np

from . import _io, _layout

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
    x = _READERS[fmt](path)
    _check_matrix(path, x.dtype, x.shape)
    return x, fmt


def _check_matrix(path, dtype, shape):
    """What a file holds, in twell's terms: real values of a supported kind, and at most
    2**31 - 1 rows and columns. ValueError naming the file otherwise (the constructor would
    name its parameter ``x`` instead)."""
    from ._dtypes import value_dtype

    try:
        value_dtype(dtype)
    except TypeError:
        raise ValueError(f"{path}: {_values(dtype)}; twell holds real numbers: float64, "
                         "float32, float16 or bfloat16 (bool and integer values become "
                         "float64)") from None
    for size, what, limit in zip(shape, ("rows", "columns"),
                                 (_layout.MAX_ROWS, _layout.MAX_COLUMNS), strict=True):
        if size > limit:
            raise ValueError(f"{path}: the matrix has {size} {what}; twell holds at most "
                             f"{limit}")


def _values(dtype):
    """The values of ``dtype`` in words."""
    kinds = {"c": "complex numbers", "U": "text", "S": "bytes", "M": "dates",
             "m": "durations", "O": "Python objects"}
    if dtype.kind in kinds:
        return f"the values are {kinds[dtype.kind]} (dtype {dtype})"
    if dtype.kind == "V":
        hint = (": NumPy writes bfloat16 so, which a twell file keeps" if dtype.itemsize == 2
                else "")
        return f"the values are raw {dtype.itemsize}-byte records (dtype {dtype.str}){hint}"
    return f"the values have dtype {dtype}"


def _is_zip(path):
    import zipfile

    return zipfile.is_zipfile(path)


def _read_twell(path):
    return _io.load(path)


def _read_npz(path):
    import scipy.sparse as sp

    if _io.npz_kind(path) == "twell":
        raise ValueError(f"{path}: is a twell file, not a scipy.sparse .npz file "
                         "(read it as twell)")
    _check_npz_members(path)
    try:
        return sp.load_npz(path)  # numpy.load(allow_pickle=False) inside
    except OSError:
        raise
    except Exception as exc:  # a damaged archive fails in many ways (see _io._Fields)
        detail = f"no field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{path}: not a valid scipy.sparse .npz file ({detail})") from None


def _check_npz_members(path):
    """Check the members of a scipy.sparse .npz archive before scipy reads them.

    Every member's ``.npy`` header is read first (no objects, exactly the bytes it
    describes), the ``shape`` field read, and no array may hold more values than
    ``2 * (M + 1) * (K + 1)`` (every format's arrays fit in that): scipy reads every
    member whole, so a small compressed member claiming gigabytes would be decompressed
    and allocated before any check (as ``twell._io`` guards ``twell.load``).
    """
    import zipfile

    def invalid(problem):
        return ValueError(f"{path}: not a valid scipy.sparse .npz file ({problem})")

    headers = {}
    try:
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                with z.open(member) as fp:
                    shape, _, dtype = _io.npy_header(fp)
                    start = fp.tell()
                    name = member.removesuffix(".npy")
                    if dtype.hasobject:
                        raise invalid(f"field {name!r} holds Python objects")
                    size = math.prod(shape) * dtype.itemsize
                    if z.getinfo(member).file_size != start + size:
                        raise invalid(f"field {name!r} does not hold the bytes its header "
                                      "describes")
                    if name == "shape" and shape == (2,) and dtype.kind in "iu":
                        value = np.frombuffer(fp.read(size), dtype=dtype)  # 16 bytes
                    headers[name] = shape, dtype
    except ValueError as exc:
        if str(exc).startswith(f"{path}: "):
            raise
        raise invalid(str(exc)) from None
    except OSError:
        raise
    except Exception as exc:  # BadZipFile, zlib.error, EOFError, ... (see _io._Fields)
        raise invalid(f"{type(exc).__name__}: {exc}") from None
    if "shape" not in headers:
        raise invalid("no field 'shape'")
    if headers["shape"][0] != (2,) or headers["shape"][1].kind not in "iu":
        raise invalid(f"the field 'shape' must hold 2 integers; got {headers['shape']}")
    m, k = (int(v) for v in value)
    if m < 0 or k < 0:
        raise invalid(f"the field 'shape' holds a negative size: {(m, k)}")
    room = 2 * (m + 1) * (k + 1)
    for name, (shape, dtype) in headers.items():
        if dtype.kind in "US" and dtype.itemsize > 256:
            raise invalid(f"field {name!r} holds a string of dtype {dtype}")
        if math.prod(shape) > room:
            raise invalid(f"field {name!r} holds {math.prod(shape)} values; a {m} x {k} "
                          f"matrix has room for at most {room}")


def _read_mtx(path):
    import scipy.io
    import scipy.sparse as sp

    if path.lower().endswith((".gz", ".bz2")):
        # scipy would decompress these through a stream, whose errors end the process.
        raise ValueError(f"{path}: compressed Matrix Market files are not read; decompress it "
                         "first")
    with open(path, "rb") as f:
        header = read_mtx_header(f, path)
        check_mtx_body(f, path, header)
    m, k = header.shape
    if header.values == 0:
        # Nothing for scipy to read; its array reader divides by zero on zero rows.
        return np.zeros((m, k)) if header.format == "array" else sp.coo_array((m, k))
    try:
        # A path, never an open file object: scipy's reader of Python streams ends the process
        # (C++ terminate) when the file is not what it expects.
        x = scipy.io.mmread(path)
    except (ValueError, TypeError, OverflowError, UnicodeDecodeError, MemoryError) as exc:
        text = str(exc) or type(exc).__name__
        raise _mtx_error(path, text[:1].lower() + text[1:].rstrip(".")) from None
    if header.symmetry == "skew-symmetric" and header.format == "coordinate":
        diagonal = np.flatnonzero(x.row == x.col)  # scipy keeps such entries as they are
        if diagonal.size:
            i = int(x.row[diagonal[0]]) + 1
            raise _mtx_error(path, f"a skew-symmetric matrix has zeros on its diagonal; the "
                                   f"file holds an entry at row {i}, column {i}")
    return x


class MtxHeader(NamedTuple):
    """What the first lines of a Matrix Market file declare."""

    format: str  # "coordinate" or "array"
    field: str  # "real", "integer" or "pattern" ("double" and "unsigned-integer" as named)
    symmetry: str  # "general", "symmetric", "skew-symmetric" or "hermitian"
    shape: tuple
    values: int  # lines of numbers that follow: entries (coordinate) or stored values (array)
    numbers: int  # numbers on each of those lines
    lines: int  # lines up to and including the size line


#: The longest header line read (the format allows 1024 characters a line; comments are
#: skipped whatever their length) and the longest line of numbers.
MTX_LINE_LIMIT = 1 << 16

#: Bytes of the body checked at once.
MTX_CHUNK = 1 << 22

_MTX_FIELDS = ("real", "double", "integer", "unsigned-integer", "pattern", "complex")
_MTX_SYMMETRIES = ("general", "symmetric", "skew-symmetric", "hermitian")


def _mtx_error(path, problem):
    return ValueError(f"{path}: not a valid Matrix Market file: {problem}")


def _plural(n, word):
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def _shown(line, limit=60):
    text = line.decode("latin-1").strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def read_mtx_header(f, path):
    """Read and check the banner, comments and size line of a Matrix Market file.

    ``f``: the file, opened in binary mode at its start; left at the first line after the
    size line. Returns an :class:`MtxHeader`; raises ValueError naming ``path`` and the
    line.
    """
    banner = f.readline(MTX_LINE_LIMIT)
    if not banner.startswith(b"%%MatrixMarket") or not banner[14:15].isspace():
        raise _mtx_error(path, "line 1 does not start with the banner '%%MatrixMarket'")
    words = banner[14:].decode("latin-1").lower().split()
    if len(words) != 4:
        raise _mtx_error(path, "line 1 must read '%%MatrixMarket matrix FORMAT FIELD "
                               f"SYMMETRY'; got {_shown(banner)}")
    obj, fmt, field, symmetry = words
    if obj != "matrix":
        raise _mtx_error(path, f"line 1: the object is {obj!r}; twell reads 'matrix' files")
    if fmt not in ("coordinate", "array"):
        raise _mtx_error(path, f"line 1: the format must be 'coordinate' or 'array'; got {fmt!r}")
    if field not in _MTX_FIELDS:
        raise _mtx_error(path, f"line 1: the field must be one of {', '.join(_MTX_FIELDS)}; "
                               f"got {field!r}")
    if symmetry not in _MTX_SYMMETRIES:
        raise _mtx_error(path, f"line 1: the symmetry must be one of "
                               f"{', '.join(_MTX_SYMMETRIES)}; got {symmetry!r}")
    if field == "complex":
        raise ValueError(f"{path}: the values are complex numbers (Matrix Market field "
                         "'complex'); twell holds real numbers: float64, float32, float16 or "
                         "bfloat16")
    if field == "pattern" and (fmt == "array" or symmetry in ("skew-symmetric", "hermitian")):
        raise _mtx_error(path, f"line 1: a pattern matrix cannot be {fmt} {symmetry}")
    n = 1
    while True:
        line = f.readline(MTX_LINE_LIMIT)
        n += 1
        if not line:
            raise _mtx_error(path, f"the file ends at line {n} before its size line")
        if line.startswith(b"%"):
            while line and not line.endswith(b"\n"):  # a long comment: skip the rest
                line = f.readline(MTX_LINE_LIMIT)
            continue
        if not line.endswith(b"\n") and len(line) == MTX_LINE_LIMIT:
            raise _mtx_error(path, f"line {n} is longer than {MTX_LINE_LIMIT} bytes")
        if line.strip():
            break
    names = ("rows", "columns", "entries") if fmt == "coordinate" else ("rows", "columns")
    words = line.split()
    if len(words) != len(names) or not all(w.isdigit() for w in words):
        raise _mtx_error(path, f"line {n}: the size line must hold the {', '.join(names)} as "
                               f"{len(names)} non-negative integers; got {_shown(line)}")
    m, k, *rest = (int(w) for w in words)
    for size, what, limit in ((m, "rows", _layout.MAX_ROWS), (k, "columns",
                                                                _layout.MAX_COLUMNS)):
        if size > limit:
            raise ValueError(f"{path}: the matrix has {size} {what}; twell holds at most "
                             f"{limit}")
    if symmetry != "general" and m != k:
        raise _mtx_error(path, f"line {n}: a {symmetry} matrix must be square; the size line "
                               f"declares {m} x {k}")
    if fmt == "coordinate":
        values, numbers = rest[0], 2 if field == "pattern" else 3
    else:
        values = {"general": m * k, "skew-symmetric": m * (m - 1) // 2}.get(
            symmetry, m * (m + 1) // 2)
        numbers = 1
    return MtxHeader(fmt, field, symmetry, (m, k), values, numbers, n)


# Byte classes of the numbers of a Matrix Market body; 0 is a byte that has no place there.
_SPACE, _NEWLINE, _DIGIT, _MINUS, _POINT, _EXPONENT, _LETTER, _PLUS = range(1, 9)
_WORDS = (b"nan", b"inf", b"infinity")

# Flags of a byte, looked up with the byte before it: a number starts there, the pair is
# bad, the byte is a point, an exponent, a letter, a line end, or has no place there.
_START, _BAD, _IS_POINT, _IS_EXPONENT, _IS_LETTER, _IS_NEWLINE, _IS_STRAY = 1, 2, 4, 8, 16, 32, 64


@functools.cache
def _mtx_tables(field):
    """Lookup tables of a field: byte -> class (256 uint8), and ``byte_before | byte << 8``
    -> flags (65536 uint8).

    A pair is bad when either byte has no place in a number of the field, a number starts or
    ends with a byte that cannot start or end one, or two bytes of a number cannot follow
    each other (``[-]`` digits ``[.]`` digits ``[eE[+-]digits]``, or ``[-]`` and a word);
    the counts of points and exponents, and the words, are checked apart.
    """
    cls = np.zeros(256, dtype=np.uint8)
    cls[list(b" \t\r")] = _SPACE
    cls[ord("\n")] = _NEWLINE
    cls[list(b"0123456789")] = _DIGIT
    cls[ord("-")] = _MINUS
    if field in ("real", "double"):
        cls[ord(".")] = _POINT
        cls[list(b"eE")] = _EXPONENT
        cls[list(b"nafityNAFITY")] = _LETTER  # nan, inf, infinity
        cls[ord("+")] = _PLUS  # scipy takes no "+" before a number, only in an exponent
    follows = {(_DIGIT, _DIGIT), (_DIGIT, _POINT), (_DIGIT, _EXPONENT), (_MINUS, _DIGIT),
               (_MINUS, _POINT), (_MINUS, _LETTER), (_POINT, _DIGIT), (_POINT, _EXPONENT),
               (_EXPONENT, _DIGIT), (_EXPONENT, _MINUS), (_EXPONENT, _PLUS), (_PLUS, _DIGIT),
               (_LETTER, _LETTER)}
    first, last = {_DIGIT, _MINUS, _POINT, _LETTER}, {_DIGIT, _POINT, _LETTER}
    pairs = np.zeros((9, 9), dtype=np.uint8)  # by (class before, class)
    for a in range(9):
        for c in range(9):
            flags = _BAD if 0 in (a, c) else 0
            if a < _DIGIT <= c:
                flags |= _START | (0 if c in first else _BAD)
            elif c < _DIGIT <= a:
                flags |= 0 if a in last else _BAD
            elif a >= _DIGIT and (a, c) not in follows:
                flags |= _BAD
            flags |= {_POINT: _IS_POINT, _EXPONENT: _IS_EXPONENT, _LETTER: _IS_LETTER,
                      _NEWLINE: _IS_NEWLINE, 0: _IS_STRAY}.get(c, 0)
            pairs[a, c] = flags
    code = np.arange(65536)
    return cls, pairs[cls[code & 0xFF], cls[code >> 8]]


def check_mtx_body(f, path, header):
    """Check the lines of numbers that follow a Matrix Market header, to the end of ``f``.

    Every byte must belong to a number (digits, a minus, a point, an exponent, ``nan``,
    ``inf``, ``infinity``) or separate numbers (spaces, tabs, line ends); every number must
    be well formed; every line that is not blank must hold ``header.numbers`` numbers, and
    there must be ``header.values`` such lines. Reads ``f`` in chunks of
    :data:`MTX_CHUNK` bytes: memory stays small whatever the file's size. Raises ValueError
    naming ``path`` and the line.
    """
    tables = _mtx_tables(header.field)
    line = header.lines  # lines before the chunk
    found = 0  # lines of numbers so far
    carry = b""
    while True:
        chunk = f.read(MTX_CHUNK)
        data = carry + chunk if carry else chunk
        if chunk:
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) > MTX_LINE_LIMIT:
                raise _mtx_error(path, f"line {line + 1} is longer than {MTX_LINE_LIMIT} bytes")
            carry = data[cut:]
        elif data:
            data += b"\n"  # the last line, without its line end
            cut = len(data)
        else:
            break
        if cut:
            found, line = _check_mtx_lines(data, cut, tables, path, header, found, line)
        if not chunk:
            break
    if found != header.values:
        what = _plural(header.values, "entry" if header.format == "coordinate" else "value")
        raise _mtx_error(path, f"the size line declares {what} and the file holds "
                               f"{found}")


def _check_mtx_lines(data, n, tables, path, header, found, line):
    """Check the whole lines ``data[:n]`` (ending with a line end) of a Matrix Market body.

    ``found``: lines of numbers before them, ``line``: lines before them in the file.
    Returns both, updated. A few vectorised passes over the bytes: every pair of neighbours
    is looked up at once, as 16-bit words read at even and at odd offsets.
    """
    cls, table = tables
    raw = np.frombuffer(data, dtype=np.uint8, count=n)
    flags = np.empty(n, dtype=np.uint8)
    flags[0] = table[ord("\n") | data[0] << 8]
    flags[1::2] = table.take(np.frombuffer(data, dtype="<u2", count=n // 2))
    flags[2::2] = table.take(np.frombuffer(data, dtype="<u2", count=(n - 1) // 2, offset=1))
    present = int(np.bitwise_or.reduce(flags))  # the flags that occur at all
    newlines = np.flatnonzero(raw == ord("\n"))  # nonzero() is fastest on bools

    def where(pos):
        return line + int(np.searchsorted(newlines, pos)) + 1

    def is_digit(at):
        return (raw[at] - np.uint8(48)) < 10

    if present & _IS_STRAY:
        pos = int(np.argmax((flags & _IS_STRAY) != 0))
        byte = data[pos]
        shown = f"{chr(byte)!r} (0x{byte:02x})" if 0x20 < byte < 0x7F else f"0x{byte:02x}"
        raise _mtx_error(path, f"line {where(pos)}: the byte {shown} is not part of a number "
                               f"(field '{header.field}')")
    bad = np.zeros(0, dtype=np.intp)
    if present & _BAD:
        pos = int(np.argmax((flags & _BAD) != 0))
        bad = np.array([pos - (cls[data[pos]] < _DIGIT)])  # a bad end: at the last byte
    ids = np.cumsum(flags & _START, dtype=np.int32 if n < 2**31 else np.int64)
    wrong = [bad]
    points = np.flatnonzero((flags & _IS_POINT) != 0) if present & _IS_POINT else bad[:0]
    exponents = (np.flatnonzero((flags & _IS_EXPONENT) != 0) if present & _IS_EXPONENT
                 else bad[:0])
    # A point needs a digit beside it ("+", "." and ".e5" are no numbers).
    wrong.append(points[~is_digit(points - 1) & ~is_digit(points + 1)])
    # Within a number at most one point, then at most one exponent.
    marks = np.concatenate([points, exponents])
    order = np.argsort(marks, kind="stable")
    marks, is_point = marks[order], order < points.size
    same = ids[marks[1:]] == ids[marks[:-1]]
    wrong.append(marks[1:][same & ~(is_point[:-1] & ~is_point[1:])])
    if present & _IS_LETTER:  # every run of letters is a word: nan, inf or infinity
        letters = np.flatnonzero((flags & _IS_LETTER) != 0)
        first = letters[(flags[letters - 1] & _IS_LETTER) == 0]
        size = letters[(flags[letters + 1] & _IS_LETTER) == 0] - first + 1
        known = np.zeros(first.size, dtype=bool)
        for word in _WORDS:
            fits = np.flatnonzero(size == len(word))
            same_word = np.ones(fits.size, dtype=bool)
            for i, c in enumerate(word):
                same_word &= (raw[first[fits] + i] | 0x20) == c  # ASCII lower case
            known[fits[same_word]] = True
        wrong.append(first[~known])
    wrong = np.concatenate(wrong)
    if wrong.size:
        pos = lo = hi = int(wrong.min())
        while lo > 0 and cls[data[lo - 1]] >= _DIGIT:
            lo -= 1
        while cls[data[hi]] >= _DIGIT:  # the lines end with a line end
            hi += 1
        number = data[lo:hi]
        raise _mtx_error(path, f"line {where(pos)}: {_shown(number, 40)} is not a number")

    per_line = np.diff(ids[newlines], prepend=0)
    full = np.flatnonzero(per_line)
    odd = full[per_line[full] != header.numbers]
    over = full[header.values - found] if full.size > header.values - found else None
    if odd.size and (over is None or odd[0] <= over):
        i = int(odd[0])
        raise _mtx_error(path, f"line {line + i + 1} holds {int(per_line[i])} numbers; a line "
                               f"of a {header.field} {header.format} file holds "
                               f"{header.numbers}")
    if over is not None:
        what = _plural(header.values, "entry" if header.format == "coordinate" else "value")
        more = " more" if header.values else ""
        raise _mtx_error(path, f"the size line declares {what} and line "
                               f"{line + int(over) + 1} holds one{more}")
    return found + full.size, line + newlines.size


def _read_npy(path):
    """A 2-D array from a .npy file, its header checked before anything is read or
    allocated: the magic string, the header, no Python objects (nothing is unpickled), two
    dimensions and exactly the bytes the header describes."""
    fmt = np.lib.format
    with open(path, "rb") as f:
        start = f.read(len(fmt.MAGIC_PREFIX))
        if start != fmt.MAGIC_PREFIX:
            hint = " (a zip archive: an .npz file?)" if start.startswith(b"PK") else ""
            raise ValueError(f"{path}: not a .npy file: it does not start with NumPy's magic "
                             f"string \\x93NUMPY{hint}")
        f.seek(0)
        try:
            shape, fortran, dtype = _io.npy_header(f)
        except (ValueError, EOFError) as exc:
            raise ValueError(f"{path}: not a valid .npy file: its header cannot be read "
                             f"({exc})") from None
        if len(shape) != 2:
            raise ValueError(f"{path}: the array must be 2-D (a matrix); got shape {shape}")
        _check_matrix(path, dtype, shape)  # objects (pickles) are refused here
        described = math.prod(shape) * dtype.itemsize
        held = os.fstat(f.fileno()).st_size - f.tell()
        if held != described:
            what = "the file is truncated" if held < described else "the file is too long"
            raise ValueError(f"{path}: {what}: its header describes {described} bytes of "
                             f"values and {held} follow it")
        data = np.fromfile(f, dtype=dtype, count=math.prod(shape))
    return data.reshape(shape, order="F" if fortran else "C")


_READERS = {"mtx": _read_mtx, "npz": _read_npz, "npy": _read_npy, "twell": _read_twell}


def write(path, fmt, a):
    """Write the TwELLMatrix ``a`` to ``path`` in format ``fmt``.

    The file is written under a temporary name in the same folder and then
    renamed, so a failed write leaves no partial output; an OSError names
    ``path``, not the temporary file.

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
    except OSError as exc:
        if exc.errno is None:
            raise
        # Named after the output: the temporary name means nothing to the user.
        err = type(exc)(f"{path}: cannot write the file: {exc.strerror or exc}")
        err.errno = exc.errno
        raise err from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return written


def _storable(a, narrow):
    """``a`` cast to float32 when its dtype is in ``narrow`` (exact), else ``a``."""
    return a.astype(np.float32) if a.dtype in narrow else a


def _write_twell(f, a):
    _io.save(f, a)
    return a.dtype


def _write_npz(f, a):
    import scipy.sparse as sp

    from ._dtypes import bfloat16

    a = _storable(a, (np.float16, bfloat16))
    sp.save_npz(f, sp.csr_array(a.tocsr()), compressed=True)
    return a.dtype


def _write_mtx(f, a):
    import scipy.io

    from ._dtypes import bfloat16

    a = _storable(a, (np.float16, bfloat16))
    # float64 values: their shortest decimals read back exactly, also for float32 input.
    scipy.io.mmwrite(f, a.tocsr().astype(np.float64))
    return a.dtype


def _write_npy(f, a):
    from ._dtypes import bfloat16

    a = _storable(a, (bfloat16,))
    np.save(f, a.toarray(), allow_pickle=False)
    return a.dtype


_WRITERS = {"mtx": _write_mtx, "npz": _write_npz, "npy": _write_npy, "twell": _write_twell}
