"""Dtypes, tolerances and array helpers shared by the suites (NumPy or CuPy arrays)."""

import pathlib

import numpy as np

import twell

BF16 = np.dtype(twell.bfloat16)
DTYPES = {"bf16": BF16, "fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32),
          "fp64": np.dtype(np.float64)}
SHORT = {v: k for k, v in DTYPES.items()}

#: Relative error (by norm) allowed against the float32/float64 product, per dtype, on the GPU
#: (16-bit inputs, float32 accumulation, kernels that sum in another order than the reference).
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 2e-3, "fp64": 1e-9}

#: The CPU suite compares twell with scipy.sparse in the same dtype: only rounding may differ.
HOST_TOLERANCE = {"fp32": 1e-5, "fp64": 1e-12}


def jsonable(x):
    """``json.dumps``'s fallback for NumPy scalars and arrays, paths and dtypes."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (pathlib.Path, np.dtype)):
        return str(x)
    return repr(x)


def short_error(exc, limit=300):
    """``"Type: message"`` on one line, cut to ``limit`` characters."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


class RNG:
    """float32 normal/uniform and int64 integers on NumPy or CuPy, seeded."""

    def __init__(self, xp, seed):
        self.np = xp is np
        self.g = np.random.default_rng(seed) if self.np else xp.random.RandomState(seed)

    def normal(self, shape):
        return self.g.standard_normal(shape, dtype=np.float32)

    def uniform(self, shape):
        if self.np:
            return self.g.random(shape, dtype=np.float32)
        return self.g.random_sample(shape, dtype=np.float32)

    def integers(self, high, size):
        if self.np:
            return self.g.integers(0, high, size, dtype=np.int64)
        return self.g.randint(0, high, size=size, dtype=np.int64)


def acc_dtype(dtype):
    """The dtype references are computed in: float64 for float64, else float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def cast(xp, x, dtype):
    """``x.astype(dtype)``; between float32 and bfloat16 by bit arithmetic where the array
    library has no bfloat16 cast of its own (CuPy): float32 -> bfloat16 rounds to nearest
    even, bfloat16 -> float32 is exact."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    try:
        return x.astype(dtype)
    except Exception:
        if x.dtype == np.float32 and dtype == BF16:
            bits = x.view(np.uint32)
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
            return (rounded >> np.uint32(16)).astype(np.uint16).view(BF16)
        if x.dtype == BF16 and dtype == np.float32:
            return (x.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
        raise


def widen(xp, x, dtype=np.float32):
    """``x`` as float32 (float64 for ``dtype=float64``), bfloat16 included (exactly)."""
    if x.dtype == BF16:
        x = cast(xp, x, np.float32)
    return cast(xp, x, dtype)


def relu(xp, y):
    return xp.maximum(y, xp.zeros((), dtype=y.dtype))


def matmul_same(xp, a, b):
    """``a @ b`` in the operands' dtype (NumPy's ml_dtypes matmul returns float32)."""
    out = xp.matmul(a, b)
    return out if out.dtype == a.dtype else out.astype(a.dtype)


def csr_nbytes(nnz, rows, itemsize, index_bytes=4, indptr_bytes=4):
    """Bytes of a CSR matrix: values and column indices per entry, a row pointer per row."""
    return int(nnz) * (itemsize + index_bytes) + (int(rows) + 1) * indptr_bytes


def sparse_nbytes(a):
    """Bytes of a scipy or cupyx compressed matrix's three arrays, as stored."""
    return int(a.data.nbytes + a.indices.nbytes + a.indptr.nbytes)


def rows_of(xp, indptr, nnz):
    """The row of every entry of a CSR structure."""
    return xp.searchsorted(indptr[1:], xp.arange(nnz), side="right")
