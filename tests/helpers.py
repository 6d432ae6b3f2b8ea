"""Test helpers: the backend object, independent oracles, tolerances and assertions.

The oracles here never call twell: dense references are rebuilt from the
public storage arrays with plain NumPy, and sparse references come from
scipy.sparse.
"""

import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import twell

GPU_SKIP_REASON = "CuPy with a CUDA GPU is not available"



def run_python(code):
    """Run ``code`` in a fresh interpreter (a clean ``sys.modules``); its stdout, stripped.

    Fails the test, with the child's stderr, if the child exits with an error.
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def gpu_test(test):
    """Mark a test that needs CuPy and a GPU but does not take the ``backend`` fixture."""
    skip = pytest.mark.skipif(not twell.cuda_available(), reason=GPU_SKIP_REASON)
    return pytest.mark.gpu(skip(test))


BF16 = np.dtype(twell.bfloat16)
F64, F32, F16 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)

#: The value dtypes twell stores, as pytest params with readable ids.
DTYPES = [pytest.param(F64, id="f64"), pytest.param(F32, id="f32"),
          pytest.param(F16, id="f16"), pytest.param(BF16, id="bf16")]

#: Relative error by norm allowed in products, per result dtype (see issue 2).
MATMUL_RTOL = {F64: 1e-12, F32: 1e-5, F16: 1e-3, BF16: 1e-2}

#: Relative error allowed in float64-accumulated sums rounded to the dtype.
SUM_RTOL = {F64: 1e-12, F32: 1e-6, F16: 1e-3, BF16: 1e-2}

#: dtypes cupyx.scipy.sparse can hold.
CUPYX_DTYPES = (F32, F64)


class Backend:
    """The array library one run of a test uses (NumPy on the host or CuPy on the GPU)."""

    def __init__(self, name):
        self.name = name
        if name == "numpy":
            self.xp = np
        else:
            import cupy

            self.xp = cupy

    def __repr__(self):
        return f"Backend({self.name!r})"

    @property
    def on_gpu(self):
        return self.name == "cupy"

    def asarray(self, x, dtype=None):
        """Host data -> this backend: NumPy/CuPy arrays; scipy.sparse -> cupyx ``csr_matrix``."""
        if sp.issparse(x):
            return self.sparse(x, "csr")
        if self.on_gpu:
            return self.xp.asarray(np.asarray(x), dtype=dtype)
        return np.asarray(x, dtype=dtype)

    def sparse(self, x, fmt=None):
        """A scipy.sparse array/matrix in ``fmt`` on this backend, structure kept as is.

        On CuPy the cupyx matrix is built from the raw arrays, so that
        duplicates, explicit zeros and unsorted indices survive.
        """
        fmt = fmt or x.format
        if x.format != fmt:
            x = x.asformat(fmt)
        if not self.on_gpu:
            return x
        import cupyx.scipy.sparse as cs

        if x.dtype not in CUPYX_DTYPES:
            pytest.skip(f"cupyx.scipy.sparse holds float32/float64 only, not {x.dtype}")
        xp = self.xp
        if fmt == "coo":
            return cs.coo_matrix((xp.asarray(x.data), (xp.asarray(x.row, dtype=np.int32),
                                                        xp.asarray(x.col, dtype=np.int32))),
                                 shape=x.shape)
        cls = {"csr": cs.csr_matrix, "csc": cs.csc_matrix}[fmt]
        return cls((xp.asarray(x.data), xp.asarray(x.indices, dtype=np.int32),
                    xp.asarray(x.indptr, dtype=np.int32)), shape=x.shape)

    def to_host(self, x):
        """Device -> host: CuPy arrays, cupyx sparse and twell matrices; host data passes."""
        if isinstance(x, (twell.TwELLMatrix, twell.ELLMatrix)):
            return x.get()
        if self.on_gpu:
            import cupyx.scipy.sparse as cs

            if isinstance(x, self.xp.ndarray) or cs.issparse(x):
                return x.get()
        return x

    def is_native(self, x):
        """True when array ``x`` belongs to this backend (outputs stay where the input lives)."""
        return isinstance(x, self.xp.ndarray)

    def poison(self):
        """Fill the free device memory that the next allocations reuse with 0xFF bytes.

        CuPy's pool hands freed blocks out again uninitialised: a kernel that
        leaves part of an ``empty`` output unwritten then shows NaN / -1 /
        0xFFFF there instead of a lucky zero. A no-op on NumPy.
        """
        if self.on_gpu:
            blocks = [self.xp.full(1 << p, 0xFF, dtype=np.uint8) for p in range(9, 25)]
            self.xp.cuda.get_current_stream().synchronize()
            del blocks


def cast(x, dtype):
    """``x.astype(dtype)`` without overflow warnings (overflow to Inf is the point).

    float64 -> bfloat16 is rounded once whatever the ml_dtypes release (some convert through
    float32 and round twice): through float32 rounded to odd, which keeps the information
    a single rounding to bfloat16's 8 bits needs (float32 has more than 8 + 1 bits).
    """
    x = np.asarray(x)
    with np.errstate(all="ignore"):
        if np.dtype(dtype) != BF16 or x.dtype != np.float64:
            return x.astype(dtype)
        t = x.astype(np.float32)
        fix = (t.astype(np.float64) != x) & ((t.view(np.uint32) & 1) == 0) & ~np.isnan(x)
        toward = np.where(x > t, np.inf, -np.inf).astype(np.float32)
        t = np.where(fix, np.nextafter(t, toward), t)
        return t.astype(dtype)


def parts_of(a):
    """The six public storage arrays of a TwELLMatrix, on the host."""
    a = a.get()
    return (a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices, a.overflow_data)


PART_NAMES = ("counts", "data", "indices", "overflow_indptr", "overflow_indices",
              "overflow_data")


def dense_from_parts(a, dtype=np.float64):
    """Independent TwELL -> dense: rebuild the matrix from its public arrays with NumPy."""
    counts, data, indices, indptr, ocols, odata = parts_of(a)
    m, k = a.shape
    t = a.tile_width
    out = np.zeros((m, k), dtype=dtype)
    mask = np.arange(data.shape[2]) < counts[..., None]
    r, tile, j = np.nonzero(mask)
    out[r, tile * t + indices[r, tile, j].astype(np.int64)] = data[r, tile, j].astype(dtype)
    orow = np.repeat(np.arange(m), np.diff(indptr))
    out[orow, ocols] = odata.astype(dtype)
    return out


def tile_counts(dense, tile_width):
    """Brute-force non-zeros per (row, tile) of a dense host array, int64 (M, n_tiles)."""
    m, k = dense.shape
    nt = -(-k // tile_width)
    padded = np.zeros((m, nt * tile_width), dtype=bool)
    padded[:, :k] = dense != 0
    return padded.reshape(m, nt, tile_width).sum(axis=2, dtype=np.int64)


def canonical_csr(x):
    """scipy's canonical CSR of a dense array or sparse matrix: sorted, summed, no zeros."""
    c = sp.csr_array(x, copy=True)
    c.sum_duplicates()
    c.eliminate_zeros()
    c.sort_indices()
    return c


def assert_values_equal(got, want, what="values", signed_zeros=False):
    """Same shape and values, NaN equal to NaN; with ``signed_zeros``, -0.0 != +0.0.

    Compared in float64, so bfloat16 arrays need no special path.
    """
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    g, w = cast(got, np.float64), cast(want, np.float64)
    np.testing.assert_array_equal(g, w, err_msg=what)
    if signed_zeros:
        np.testing.assert_array_equal(np.signbit(g) & (g == 0), np.signbit(w) & (w == 0),
                                      err_msg=f"{what}: signs of zeros")


def assert_dense_equal(got, want, dtype=None):
    """Exact dense equality (NaN-aware), and the expected dtype when given."""
    if dtype is not None:
        assert np.asarray(got).dtype == np.dtype(dtype), f"dtype {got.dtype} != {dtype}"
    assert_values_equal(got, want, "dense")


def assert_csr_equal(got, want):
    """Host CSR matrices with the same structure arrays and values (NaN-aware)."""
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got.indptr, dtype=np.int64),
                                  np.asarray(want.indptr, dtype=np.int64), err_msg="indptr")
    np.testing.assert_array_equal(np.asarray(got.indices, dtype=np.int64),
                                  np.asarray(want.indices, dtype=np.int64), err_msg="indices")
    assert_values_equal(got.data, want.data, "data")


def assert_parts_equal(a, b):
    """Two TwELL matrices with identical storage arrays (dtype, shape and values)."""
    assert a.shape == b.shape and a.tile_width == b.tile_width
    for name, x, y in zip(PART_NAMES, parts_of(a), parts_of(b), strict=True):
        assert x.dtype == y.dtype, f"{name}: dtype {x.dtype} != {y.dtype}"
        assert_values_equal(x, y, name, signed_zeros=True)


def assert_same_bits(a, b, what=""):
    """``a`` and ``b`` are the same matrix with bit-identical storage arrays (``what`` prefixes
    the failure messages)."""
    assert type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype
    if isinstance(a, twell.TwELLMatrix):
        assert a.tile_width == b.tile_width
        pairs = zip(PART_NAMES, parts_of(a), parts_of(b), strict=True)
    else:
        pairs = (("data", a.data, b.data), ("indices", a.indices, b.indices))
    for name, x, y in pairs:
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what} {name}"
        bits = np.dtype(f"u{x.dtype.itemsize}")
        np.testing.assert_array_equal(x.view(bits), y.view(bits), err_msg=f"{what} {name}")


def misaligned(xp, b):
    """A copy of ``b`` on ``xp`` starting one element past a 16-byte boundary.

    Every SpMM kernel but ``twell_spmm_rows`` needs 16-byte aligned B: with this copy that
    one runs, one value at a time (its order of accumulation does not depend on the vector
    width).
    """
    out = xp.empty(b.size + 1, dtype=b.dtype)[1:].reshape(b.shape)
    out[...] = xp.asarray(b)
    return out


def force_short_rows(monkeypatch, short):
    """Make the GPU launcher take every layout for one of short rows (``short``) or for none
    (``_policy.short_rows``), whatever its shape: tests cover both kinds of gather SpMM
    shape (team widths and column chunks) on the same matrices. The SpMV chooses its kernel
    by its own rule (``_policy.spmv_lanes``)."""
    from twell._cuda import _policy

    monkeypatch.setattr(_policy, "SHORT_ROW_ENTRIES", 2**62 if short else -1)


def rel_err(got, want):
    """``||got - want|| / ||want||`` in float64 (0 when both are 0), safe from overflow."""
    got, want = cast(got, np.float64), cast(want, np.float64)
    scale = max(np.abs(want).max(initial=0.0), np.abs(got).max(initial=0.0))
    if scale == 0:
        return 0.0
    num = np.linalg.norm(got / scale - want / scale)
    den = np.linalg.norm(want / scale)
    if den == 0:
        return np.inf
    return num / den


def gpu_spmm(*args, way=None, **kwargs):
    """The CuPy backend's ``spmm(*args, **kwargs)``, its way forced (``"rows"``: the gather
    kernels, ``"dense"``: cuBLAS on ``A.toarray()``) or chosen by the policy (None)."""
    from twell._cuda import _policy, _spmm

    if way is None:
        return _spmm.spmm(*args, **kwargs)
    chosen = _policy.spmm_way
    _policy.spmm_way = lambda *_: way
    try:
        return _spmm.spmm(*args, **kwargs)
    finally:
        _policy.spmm_way = chosen


def editable(a):
    """A matrix on writable copies of ``a``'s storage arrays, which a test may then break in
    place: twell keeps the storage of its own host matrices read-only, and a matrix shares
    the arrays of the constructor's tuple form, writable, as this one does."""
    arrays = tuple(x.copy() for x in (a.counts, a.data, a.indices, a.overflow_indptr,
                                      a.overflow_indices, a.overflow_data))
    out = twell.TwELLMatrix.__new__(twell.TwELLMatrix)
    out._set(arrays, a.shape, a.tile_width, shared=True)  # unchecked, as the test wants
    return out


# -- Matrix Market, read line by line -------------------------------------------

_MTX_NUMBER = re.compile(rb"-?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:nan|inf|infinity))")
_MTX_INTEGER = re.compile(rb"-?\d+")
_MTX_INDEX = re.compile(rb"\d+")


def read_matrix_market(text):
    """The shape and the entries ``{(row, column): value}`` (duplicates summed, symmetric
    entries mirrored) of a Matrix Market file, or ValueError where it breaks the format.

    An oracle independent of twell and scipy: a line-by-line Python reading of the format
    as twell documents it (real, integer and pattern fields; every number well formed, with
    no "+" before it, which scipy's parser refuses; the
    numbers a line holds and the lines the size line declares).
    """
    lines = text.split(b"\n")
    banner = lines[0].split()
    if len(banner) != 5 or banner[0] != b"%%MatrixMarket" or lines[0][:1] != b"%":
        raise ValueError("banner")
    obj, fmt, field, symmetry = (w.lower().decode("latin-1") for w in banner[1:])
    if (obj != "matrix" or fmt not in ("coordinate", "array")
            or field not in ("real", "double", "integer", "unsigned-integer", "pattern")
            or symmetry not in ("general", "symmetric", "skew-symmetric", "hermitian")
            or (field == "pattern" and (fmt == "array" or symmetry in ("skew-symmetric",
                                                                       "hermitian")))):
        raise ValueError("banner words")
    i = 1
    while i < len(lines) and (lines[i].startswith(b"%") or not lines[i].strip()):
        i += 1
    if i == len(lines):
        raise ValueError("no size line")
    size = lines[i].split()
    if len(size) != (3 if fmt == "coordinate" else 2) or not all(
            _MTX_INDEX.fullmatch(w) for w in size):
        raise ValueError("size line")
    m, k = int(size[0]), int(size[1])
    if m > 2**31 - 1 or k > 2**31 - 1 or (symmetry != "general" and m != k):
        raise ValueError("sizes")
    rows = [line.split() for line in lines[i + 1:] if line.strip()]
    value = _MTX_INTEGER if field in ("integer", "unsigned-integer") else _MTX_NUMBER

    def number(token):
        if not value.fullmatch(token):
            raise ValueError(f"number {token!r}")
        if value is _MTX_INTEGER and not -2**63 <= int(token) < 2**63:
            raise ValueError("integer out of range")
        return float(token)

    if fmt == "coordinate":
        stored = []
        if len(rows) != int(size[2]):
            raise ValueError("entry count")
        for row in rows:
            if len(row) != (2 if field == "pattern" else 3):
                raise ValueError("numbers on a line")
            if not all(_MTX_INDEX.fullmatch(t) for t in row[:2]):
                raise ValueError("index")
            r, c = int(row[0]) - 1, int(row[1]) - 1
            if not (0 <= r < m and 0 <= c < k):
                raise ValueError("index out of range")
            if symmetry == "skew-symmetric" and r == c:
                raise ValueError("an entry on the diagonal of a skew-symmetric matrix")
            stored.append((r, c, 1.0 if field == "pattern" else number(row[2])))
    else:
        if symmetry == "general":
            places = [(r, c) for c in range(k) for r in range(m)]
        else:
            places = [(r, c) for c in range(m) for r in range(c + (symmetry == "skew-symmetric"),
                                                              m)]
        if len(rows) != len(places) or any(len(row) != 1 for row in rows):
            raise ValueError("values")
        stored = [(r, c, number(row[0])) for (r, c), row in zip(places, rows, strict=True)]
    entries = {}
    for r, c, v in stored:
        entries[r, c] = entries.get((r, c), 0.0) + v
        if symmetry != "general" and r != c:
            entries[c, r] = entries.get((c, r), 0.0) + (-v if symmetry == "skew-symmetric"
                                                        else v)
    return (m, k), entries


def in_child(fn, *args):
    """``fn(*args)`` in a forked child process: ``("returned", value)``, ``("raised",
    exception)``, or ``("died", status)`` when the child ended without reporting (an abort,
    a crash), so that a crash fails one test instead of ending the test run."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            try:
                report = ("returned", fn(*args))
            except BaseException as exc:  # noqa: BLE001 - every outcome goes to the parent
                report = ("raised", exc)
            with os.fdopen(write, "wb") as out:
                pickle.dump(report, out)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as src:
        data = src.read()
    _, status = os.waitpid(pid, 0)
    return pickle.loads(data) if data else ("died", status)
