"""Shared pieces of the kernel development benches (spmm_dev.py, pack_dev.py).

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
