"""Shared pieces of the kernel development benches (spmm_dev.py, pack_dev.py, ffn_dev.py) and
of the results folders' scripts.

Imported as ``_dev`` by scripts run from the repository root (``python benchmarks/x.py`` puts
``benchmarks/`` on the import path).
"""

import cupy
import numpy as np
from scipy.special import ndtri


def timed(fn, reps, warm=3):
    """Median of ``reps`` CUDA-event timings of ``fn()`` (ms), after ``warm`` untimed calls."""
    for _ in range(warm):
        fn()
    ev = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    ev[-1][1].synchronize()
    return float(np.median([cupy.cuda.get_elapsed_time(a, b) for a, b in ev]))


def activations(m, k, d, s, rng):
    """relu(X W^T), (m, k) float32, a fraction ~(1 - s) non-zero: the bias-column trick."""
    x = cupy.asarray(rng.standard_normal((m, d), dtype=np.float32))
    w = cupy.asarray(rng.standard_normal((k, d), dtype=np.float32)) / np.sqrt(d)
    x[:, 0] = 1.0
    w[:, 0] = -ndtri(s)  # relu(x w^T) > 0 with probability ~ 1 - s
    return cupy.maximum(x @ w.T, 0)


def ffn_operands(m, d, h, dtype, seed=0):
    """The paper's feed-forward operands, drawn in this order from ``default_rng(seed)``:
    ``x`` (m, d) with a bias column of ones, ``w0`` (h, d) float32 whose column 0 the caller
    sets (:func:`gate_weight`), ``w_up`` (h, d) and ``w_down`` (d, h); all but ``w0`` in
    ``dtype``, weights scaled by 1 / sqrt(fan-in)."""
    rng = np.random.default_rng(seed)
    x = cupy.asarray(rng.standard_normal((m, d), dtype=np.float32))
    x[:, 0] = 1.0
    w0 = cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)
    wu = cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)
    wd = cupy.asarray(rng.standard_normal((d, h), dtype=np.float32)) / np.sqrt(h)
    return x.astype(dtype), w0, wu.astype(dtype), wd.astype(dtype)


def gate_weight(w0, s, dtype):
    """``w0`` with its bias column set so that relu(x @ w.T) is a fraction ~(1 - s) non-zero
    (the bias-column trick; x's column 0 is ones), in ``dtype``; ``w0`` is not changed."""
    w = w0.copy()
    w[:, 0] = -ndtri(s)
    return w.astype(dtype)
