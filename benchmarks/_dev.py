"""Shared pieces of the kernel development benches (spmm_dev.py, pack_dev.py, ffn_dev.py) and
of the results folders' scripts.

Imported as ``_dev`` by scripts run from the repository root (``python benchmarks/x.py`` puts
``benchmarks/`` on the import path).
"""

import collections
import time

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


class StageProfile:
    """Where a call spends its time between its steps: each wrapped function records a CUDA
    event and the host clock as it starts and ends, and between consecutive marks the events
    give the GPU's time and the clock the host's (the GPU is idle at the call's start, so an
    event records when the host got there if nothing is queued before it). Used by the
    results folders' ``gaps.py`` scripts.

    The events are made before each profiled call (``cudaEventCreate`` took ~5 us of the
    host's time a mark when made in the mark, twenty-second session), so a mark costs one
    ``cudaEventRecord`` and a clock read: a few microseconds, counted in the step before it.
    """

    #: Events made ahead for one profiled call (more marks than this make their own).
    SPARE_EVENTS = 256

    def __init__(self):
        self.marks = []
        self.spare = []

    def mark(self, name):
        event = self.spare.pop() if self.spare else cupy.cuda.Event()
        event.record()
        self.marks.append((name, time.perf_counter(), event))

    def wrap(self, module, names):
        """Replaces ``module.<name>`` for each of ``names`` by a wrapper that marks its start
        and end (callers that look the name up at call time see the wrapper)."""
        for name in names:
            inner = getattr(module, name)

            def wrapped(*args, _inner=inner, _name=name, **kwargs):
                self.mark(f"{_name}>")
                result = _inner(*args, **kwargs)
                self.mark(f"{_name}<")
                return result

            setattr(module, name, wrapped)

    def breakdown(self, label, fn, reps=20):
        """Prints, for ``reps`` calls of ``fn()`` after 3 warm-ups, the median host and GPU
        microseconds between consecutive marks, and the median span of the call."""
        for _ in range(3):
            fn()
        cupy.cuda.Device().synchronize()
        host, gpu, total = collections.defaultdict(list), collections.defaultdict(list), []
        for _ in range(reps):
            self.marks.clear()
            self.spare = [cupy.cuda.Event() for _ in range(self.SPARE_EVENTS)]
            self.mark("call>")
            fn()
            self.mark("call<")
            self.marks[-1][2].synchronize()
            total.append(cupy.cuda.get_elapsed_time(self.marks[0][2], self.marks[-1][2]) * 1e3)
            steps = zip(self.marks[:-1], self.marks[1:], strict=True)
            for i, ((a, ta, ea), (b, tb, eb)) in enumerate(steps):
                key = f"{i:2d} {a} -> {b}"
                host[key].append((tb - ta) * 1e6)
                gpu[key].append(cupy.cuda.get_elapsed_time(ea, eb) * 1e3)
        print(f"\n## {label}: {np.median(total):.0f} us between the first and last event")
        print(f"{'step':<58} {'host us':>8} {'GPU us':>8}")
        for key in host:
            print(f"{key:<58} {np.median(host[key]):8.1f} {np.median(gpu[key]):8.1f}")
