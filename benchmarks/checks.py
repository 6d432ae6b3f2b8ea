"""Every contender's first result is checked before it is timed: builders of the checks.

A check takes the result and returns ``(relative error, tolerance)``; the harness marks a row
``wrong`` when the error is over the tolerance, not finite, or the result is all zeros where
the reference is not.
"""

import math

import numpy as np
from arrays import SHORT, TOLERANCE, acc_dtype, rows_of, widen
from contenders import from_torch

import twell


def rel_err(xp, got, ref):
    """``||got - ref|| / ||ref||`` over all entries; NaN for a non-finite result, 1.0 for an
    all-zero one where ``ref`` is not zero (nothing was written)."""
    if got.shape != ref.shape:
        raise ValueError(f"result shape {got.shape} != expected {ref.shape}")
    got_norm = float(xp.linalg.norm(got.ravel()))
    if not math.isfinite(got_norm):
        return float("nan")
    ref_norm = float(xp.linalg.norm(ref.ravel()))
    if got_norm == 0 and ref_norm != 0:
        return 1.0
    diff = float(xp.linalg.norm((got - ref).ravel()))
    return diff / ref_norm if ref_norm else diff


class Checks:
    """Check builders for one bench (NumPy or CuPy arrays, any kind of result)."""

    def __init__(self, bench):
        self.b = bench
        self.xp = bench.xp

    def rel_err(self, got, ref):
        return rel_err(self.xp, got, ref)

    def dense_of(self, res, shape, dtype):
        """A float32/float64 dense array from any result kind."""
        xp, acc = self.xp, acc_dtype(dtype)
        if isinstance(res, twell.TwELLMatrix):
            return widen(xp, res.toarray(), acc)
        if isinstance(res, tuple) and len(res) == 3:  # CSR arrays (indptr, indices, data)
            indptr, indices, data = res
            out = xp.zeros(shape, dtype=acc)
            out[rows_of(xp, indptr, data.size), indices] = widen(xp, data, acc)
            return out
        if type(res).__module__.startswith("torch"):
            t = res.to_dense() if res.layout != self.b.torch.strided else res
            return from_torch(xp, self.b.torch, t, acc)
        if hasattr(res, "toarray"):
            return widen(xp, res.toarray(), acc)
        return widen(xp, res, acc)

    def close(self, ref, dtype, tol=None):
        """Products: relative error by norm against ``ref`` (float32/float64)."""
        tol = TOLERANCE[SHORT[np.dtype(dtype)]] if tol is None else tol

        def check(res):
            return self.rel_err(self.dense_of(res, ref.shape, dtype), ref), tol
        return check

    def equal(self, ref, dtype):
        """Conversions: the dense form of the result equals ``ref`` exactly."""
        return self.close(ref, dtype, tol=0.0)

    def same_sparse(self, ref, tol=0.0):
        """Sparse results, without a dense form: the canonical CSR of the result has the
        structure of ``ref``'s (a canonical CSR) and its values within ``tol`` by norm (0:
        exactly). A TwELLMatrix is read through ``tocsr()``, float32/float64 only."""
        xp = self.xp

        def check(res):
            if isinstance(res, twell.TwELLMatrix):
                res = res.tocsr()
            res = self.b.sp.csr_matrix(res) if not _is_csr(res) else res.copy()
            res.sum_duplicates()  # sorted indices, duplicates summed: the canonical form
            if (res.shape != ref.shape or res.nnz != ref.nnz
                    or not bool(xp.array_equal(res.indptr.astype(np.int64),
                                               ref.indptr.astype(np.int64)))
                    or not bool(xp.array_equal(res.indices.astype(np.int64),
                                               ref.indices.astype(np.int64)))):
                return 1.0, tol
            acc = acc_dtype(ref.dtype)
            return self.rel_err(widen(xp, res.data, acc), widen(xp, ref.data, acc)), tol
        return check


def _is_csr(a):
    return getattr(a, "format", None) == "csr"
