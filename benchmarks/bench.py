#!/usr/bin/env python3
"""twell benchmark suite: every contender, one process, the same inputs.

Workloads (``--workloads``):

ffn
    The feed-forward shapes of the paper's 2B model: Z (M=16384 tokens x K=5632 hidden)
    times DOWN (K x N=2048), bf16/fp16/fp32, at 99%, 95% and 90% sparsity, with
    Z = relu(X @ W^T) made sparse by the bias-column trick (X[:, 0] = 1,
    W[:, 0] = -Phi^-1(s): uniform sparsity, the worst case for weight reuse).
sweep
    bf16 SpMM from 90% to 99.9% sparsity: time against the number of non-zeros.
hot
    The same shapes with hot neurons: column j fires with probability
    rank_j^-a (a chosen so that the mean density is 1 - s), columns shuffled; made by the
    bias-column trick with one bias per column, so the D2T and the gated FFN run on them
    too.
sci
    A 2-D Poisson 5-point stencil (1000 x 1000 grid, n = 10^6) and a power-law-degree
    random graph (n = 10^6, mean degree ~16, max degree in the thousands), fp32/fp64,
    with 64, 256 and 512 right-hand sides, built with ``TwELLMatrix(csr, slots="auto")``
    for several tile widths.

Contenders: twell (pack, conversions, SpMM, SpMV), dense cuBLAS (cupy.matmul and
torch.matmul), cuSPARSE through cupyx.scipy.sparse and torch.sparse, cupyx/torch
dense -> CSR, and the reference TwELL kernels (``--reference DIR``).

Method: CUDA-event timings (one event pair per run) after warm-up, median of
``--reps`` runs, rotating among ``--buffers`` input sets where one set would sit in
L2; each contender's result is checked once against a float32/float64 computation
before it is timed. Prints a table last; writes JSON (and the table as text) to
``--out``. See benchmarks/README.md.

Usage (GPU machine, repo root)::

    PYTHONPATH=. python benchmarks/bench.py [--quick] [--reference DIR] [--out FILE]
    PYTHONPATH=. python benchmarks/bench.py --cpu-dry-run     # control flow on the CPU
"""


import argparse
import dataclasses
import datetime
import hashlib
import importlib.util
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import tracemalloc
import warnings

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(REPO))

import twell  # noqa: E402
from twell import _layout  # noqa: E402

# -- configuration ----------------------------------------------------------------

BF16 = np.dtype(twell.bfloat16)
DTYPES = {"bf16": BF16, "fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32),
          "fp64": np.dtype(np.float64)}
SHORT = {v: k for k, v in DTYPES.items()}

#: Relative error (by norm) allowed against the float32/float64 product, per dtype.
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 2e-3, "fp64": 1e-9}

#: The paper's 2B feed-forward shape: tokens, hidden width, model width.
FFN_M, FFN_K, FFN_N = 16384, 5632, 2048
FFN_SPARSITIES = (0.99, 0.95, 0.90)
SWEEP = (0.90, 0.92, 0.95, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999)
SCI_GRID = 1000            # Poisson grid side: n = 10^6
SCI_GRAPH_N = 1_000_000
SCI_GRAPH_DEGREE = 16.0    # mean degree
SCI_GRAPH_ALPHA = 2.0      # Pareto tail index: max degree ~ xmin * n^(1/alpha), thousands
SCI_RHS = (64, 256, 512)
SCI_TILE_WIDTHS = (65536, 4096, 256)

#: Column families of the printed table, in order.
FAMILIES = ("dense", "cupyx", "torch", "ref")
OPS = ("pack", "gemm+pack", "gated ffn", "csr->twell", "twell->csr", "twell->dense", "spmm",
       "spmv")
#: Conversions: each of their rows also gets its peak memory, from one more, untimed call.
PEAK_OPS = ("pack", "csr->twell", "twell->csr", "twell->dense")
WORKLOADS = ("ffn", "sweep", "hot", "sci")

#: Past ``--time-budget`` the reps drop to the minimum; past this multiple, cases are skipped.
HARD_STOP = 1.4


# -- small helpers ----------------------------------------------------------------


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (pathlib.Path, np.dtype)):
        return str(x)
    return repr(x)


def _short_error(exc, limit=300):
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _git(*argv):
    try:
        out = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=20)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _source_digest():
    """SHA-256 over twell's Python and CUDA sources: identifies the code without git."""
    h = hashlib.sha256()
    for folder, pattern in (("twell", "*.py"), ("cuda_src", "*.cu*")):
        for path in sorted((REPO / folder).glob(pattern)):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _ndtri(p):
    from scipy.special import ndtri

    return float(ndtri(p))


def zipf_probabilities(k, density, seed):
    """Per-column firing probabilities ``rank^-a`` with mean ``density``, shuffled.

    ``a`` is found by bisection (the mean of ``rank^-a`` falls from 1 at a = 0 towards
    1/k); the most popular column always fires.
    """
    r = np.arange(1, k + 1, dtype=np.float64)
    lo, hi = 0.0, 64.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.mean(r ** -mid) > density:
            lo = mid
        else:
            hi = mid
    a = 0.5 * (lo + hi)
    p = np.minimum(r ** -a, 1.0)
    return p[np.random.default_rng(seed).permutation(k)], a


# -- devices ------------------------------------------------------------------------


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


class GPU:
    """CuPy arrays, cupyx.scipy.sparse, CUDA-event timing."""

    gpu = True
    sparse_name = "cupyx"

    def __init__(self, sync_each):
        import cupy
        import cupyx.scipy.sparse

        self.cp = self.xp = cupy
        self.sp = cupyx.scipy.sparse
        self.sync_each = sync_each
        self.torch = None
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props.get("name", b"?")
        self.card = name.decode() if isinstance(name, bytes) else str(name)
        self.props = {
            "name": self.card,
            "compute_capability": f"{props.get('major')}.{props.get('minor')}",
            "multiprocessors": props.get("multiProcessorCount"),
            "memory_bytes": props.get("totalGlobalMem"),
            "l2_bytes": props.get("l2CacheSize"),
            "clock_khz": props.get("clockRate"),
            "memory_clock_khz": props.get("memoryClockRate"),
            "memory_bus_bits": props.get("memoryBusWidth"),
        }
        self.l2_bytes = int(props.get("l2CacheSize") or 50 << 20)

    def versions(self):
        cp = self.cp
        v = {"cupy": cp.__version__}
        for key, fn in (("cuda_runtime", cp.cuda.runtime.runtimeGetVersion),
                        ("cuda_driver", cp.cuda.runtime.driverGetVersion)):
            try:
                v[key] = fn()
            except Exception as exc:  # noqa: BLE001 - record, never fail on metadata
                v[key] = _short_error(exc)
        try:
            v["nvrtc"] = ".".join(map(str, cp.cuda.nvrtc.getVersion()))
        except Exception as exc:  # noqa: BLE001
            v["nvrtc"] = _short_error(exc)
        return v

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def healthy(self):
        """False once the CUDA context is broken (an illegal access poisons it for good)."""
        try:
            float(self.cp.ones(4, dtype=np.float32).sum())
            self.sync()
            return True
        except Exception:  # noqa: BLE001
            return False

    def timed(self, fn, nbuf, first, reps):
        """Milliseconds of ``reps`` calls ``fn(i)``, one CUDA event pair each.

        Without ``--sync-each`` the calls are queued back to back (the host runs ahead,
        launch overheads overlap) and one synchronisation ends the loop.
        """
        cp = self.cp
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
        for r, (start, stop) in enumerate(events):
            start.record()
            fn((first + r) % nbuf)
            stop.record()
            if self.sync_each:
                stop.synchronize()
        events[-1][1].synchronize()
        return [cp.cuda.get_elapsed_time(start, stop) for start, stop in events]

    def free_bytes(self):
        """Device memory free after returning CuPy's and PyTorch's cached blocks."""
        self.release()
        return int(self.cp.cuda.runtime.memGetInfo()[0])

    def release(self):
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()
        if self.torch is not None:
            self.torch.cuda.empty_cache()

    def copy_fn(self, a, b):
        nbytes = a.nbytes

        def copy(_):
            b.data.copy_from_device_async(a.data, nbytes)  # cudaMemcpyAsync, device to device
        return copy

    def peak_bytes(self, fn):
        """Most device memory ``fn()`` holds at once beyond what was allocated before it.

        CuPy's default pool (:func:`pool_peak_bytes`) plus, when PyTorch is loaded, PyTorch's
        caching allocator (:func:`torch_peak_bytes`): a sum of two peaks, but every contender
        here allocates through one of the two only. Returns the cached blocks first.
        """
        self.release()
        if self.torch is None:
            return pool_peak_bytes(self.cp, fn)[1]
        (_, torch_peak), cupy_peak = pool_peak_bytes(
            self.cp, lambda: torch_peak_bytes(self.torch, fn))
        return cupy_peak + torch_peak


class CPU:
    """NumPy arrays, scipy.sparse, perf_counter timing: the dry run of the control flow."""

    gpu = False
    sparse_name = "scipy"
    sync_each = True
    torch = None

    def __init__(self):
        import scipy.sparse

        self.xp = np
        self.sp = scipy.sparse
        cpus = os.cpu_count() or 1
        self.card = f"CPU dry run ({cpus} cores, {platform.processor() or platform.machine()})"
        self.props = {"name": self.card}
        self.l2_bytes = 1 << 20

    def versions(self):
        return {}

    def sync(self):
        pass

    def healthy(self):
        return True

    def timed(self, fn, nbuf, first, reps):
        times = []
        for r in range(reps):
            t = time.perf_counter()
            fn((first + r) % nbuf)
            times.append((time.perf_counter() - t) * 1e3)
        return times

    def free_bytes(self):
        return 8 << 30

    def release(self):
        pass

    def copy_fn(self, a, b):
        def copy(_):
            np.copyto(b, a)
        return copy

    def peak_bytes(self, fn):
        """Most host memory ``fn()`` holds at once beyond what was allocated before it.

        Measured with tracemalloc, to which NumPy reports its buffers (a CPU PyTorch's are not
        seen): the dry run's stand-in for the GPU's counting allocator.
        """
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            result = fn()
            peak = tracemalloc.get_traced_memory()[1]
            del result
        finally:
            if not tracing:
                tracemalloc.stop()
        return peak - before


def pool_peak_bytes(cp, fn):
    """``(fn(), peak)``: the most bytes of CuPy's default pool in use during ``fn()``, less
    those in use before it.

    For this one call, a thread-local allocator forwards every allocation to the pool and notes
    the pool's bytes in use after it; the pool's use can only grow at an allocation, so the
    largest note is the peak. The output counts (it is alive at the end), the input does not
    (it was allocated before). Memory that bypasses CuPy's allocator is not seen.
    """
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    before = peak = pool.used_bytes()

    def malloc(size):
        nonlocal peak
        mem = pool.malloc(size)
        peak = max(peak, pool.used_bytes())
        return mem

    with cp.cuda.using_allocator(malloc):
        result = fn()
        cp.cuda.get_current_stream().synchronize()
    return result, peak - before


def torch_peak_bytes(torch, fn):
    """``(fn(), peak)`` for PyTorch's CUDA caching allocator, as :func:`pool_peak_bytes`."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


# -- array helpers (NumPy or CuPy) --------------------------------------------------


def acc_dtype(dtype):
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def cast(xp, x, dtype):
    """``x.astype(dtype)``; float32 -> bfloat16 falls back to bit arithmetic (nearest even)."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    try:
        return x.astype(dtype)
    except Exception:
        if dtype != BF16 or x.dtype != np.float32:
            raise
        bits = x.view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
        return (rounded >> np.uint32(16)).astype(np.uint16).view(BF16)


def widen(xp, x, dtype=np.float32):
    """``x`` as float32 (float64 for ``dtype=float64``), bfloat16 included."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    try:
        return x.astype(dtype)
    except Exception:
        if x.dtype != BF16:
            raise
        return (x.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(dtype)


def relu(xp, y):
    return xp.maximum(y, xp.zeros((), dtype=y.dtype))


def matmul_same(xp, a, b):
    """``a @ b`` in the operands' dtype (NumPy's ml_dtypes matmul returns float32)."""
    out = xp.matmul(a, b)
    return out if out.dtype == a.dtype else out.astype(a.dtype)


def spmm_way(a, n):
    """How ``a @ B`` (B with ``n`` columns) runs on a GPU: the gather kernel, or cuBLAS on
    ``a.toarray()`` (the JSON's ``impl``: the library's own choice)."""
    from twell import _cupy_backend

    way = _cupy_backend.spmm_way(*a.shape, n, a.dtype, a._nnz_hint)
    return "toarray + cuBLAS" if way == "dense" else "gather"


def csr_nbytes(nnz, rows, itemsize, index_bytes=4, indptr_bytes=4):
    return int(nnz) * (itemsize + index_bytes) + (int(rows) + 1) * indptr_bytes


def rows_of(xp, indptr, nnz):
    return xp.searchsorted(indptr[1:], xp.arange(nnz), side="right")


# -- PyTorch interop ----------------------------------------------------------------


def load_torch(args):
    """PyTorch when importable (and, on the GPU, seeing the device); else None and why.

    The CPU dry run uses a CPU PyTorch too when one is importable, so that the interop
    (DLPack views, torch.sparse CSR) is exercised without a GPU.
    """
    if args.no_torch:
        return None, "disabled (--no-torch)"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - torch is optional
        return None, _short_error(exc)
    if not args.cpu_dry_run and not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    for text in ("Sparse CSR tensor support is in beta", "Sparse invariant checks"):
        warnings.filterwarnings("ignore", message=text, category=UserWarning)
    return torch, None


def to_torch(torch, x):
    """Zero-copy CuPy -> torch through DLPack (bfloat16 and uint32 through integer views)."""
    if x.dtype == BF16:
        return torch.from_dlpack(x.view(np.int16)).view(torch.bfloat16)
    if x.dtype == np.uint32:
        return torch.from_dlpack(x.view(np.int32)).view(torch.uint32)
    return torch.from_dlpack(x)


def torch_nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def from_torch(cp, torch, t, dtype=np.float32):
    """torch tensor -> CuPy array of ``dtype`` (float32/float64)."""
    tdt = torch.float64 if np.dtype(dtype) == np.float64 else torch.float32
    return cp.from_dlpack(t.to(tdt).contiguous())


# -- the reference kernels ------------------------------------------------------------


class Reference:
    """The reference TwELL extension (SakanaAI/sparser-faster-llms), built as anchors.py does.

    Loaded from ``DIR/twell.py`` under another module name (ours is ``twell``).
    """

    def __init__(self, folder, torch):
        path = pathlib.Path(folder).expanduser().resolve() / "twell.py"
        if not path.is_file():
            raise FileNotFoundError(f"--reference: no twell.py in {path.parent}")
        os.environ.setdefault("MAX_JOBS", str(min(16, os.cpu_count() or 1)))
        spec = importlib.util.spec_from_file_location("twell_reference", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["twell_reference"] = mod
        t = time.perf_counter()
        spec.loader.exec_module(mod)
        self.mod, self.torch = mod, torch
        self.cf_keyword = None
        self.ext = mod.get_ext(algorithms=["twell_mlp"])
        self.build_s = time.perf_counter() - t
        self.folder = str(path.parent)

    def d2t_out(self, x, w, packed, cf):
        if self.cf_keyword is None:  # first call: does this copy take compression_factor?
            try:
                self.mod.matmul_sparse_out(x, w, packed, compression_factor=cf, ext=self.ext)
                self.cf_keyword = True
                return packed
            except TypeError:
                self.cf_keyword = False
        if self.cf_keyword:
            self.mod.matmul_sparse_out(x, w, packed, compression_factor=cf, ext=self.ext)
        elif cf == 8:  # an older copy: C = 8 only
            self.mod.matmul_sparse_out(x, w, packed, ext=self.ext)
        else:
            raise TypeError("this copy of the reference has no compression_factor (C = 8 only)")
        return packed

    def t2d_out(self, packed, down, out):
        self.mod.matmul_t2d_out(packed, down, out, ext=self.ext)
        return out

    def gated_t2d_out(self, x, packed, up, down, out):
        self.mod.matmul_gated_t2d_out(x, packed, up, down, out, ext=self.ext)
        return out

    @staticmethod
    def d2t_supports(m, n_model, k_hidden):
        ok = m % 256 == 0 and n_model % 64 == 0 and k_hidden % 256 == 0
        return ok, "" if ok else "the reference D2T needs M % 256, D % 64, H % 256 == 0"

    @staticmethod
    def t2d_supports(m, n_model, k_hidden):
        ok = m % 256 == 0 and n_model == 2048 and k_hidden in (5632, 8192)
        return ok, "" if ok else "the reference T2D is hard-wired to D = 2048, H in {5632, 8192}"


# -- cases and the bench ----------------------------------------------------------------


@dataclasses.dataclass
class Case:
    id: str
    workload: str
    dtype: str
    label: str
    sparsity: float | None = None
    matrix: str | None = None
    info: dict = dataclasses.field(default_factory=dict)


class Bench:
    """Runs measurements, keeps rows and cases, writes JSON, prints the table."""

    def __init__(self, args, dev, torch, ref):
        self.args, self.dev, self.torch, self.ref = args, dev, torch, ref
        self.xp, self.sp = dev.xp, dev.sp
        self.rows, self.cases, self.notes = [], [], []
        self.meta, self.ceilings = {}, {}
        self.t0 = self.budget_t0 = time.perf_counter()
        self.broken = False
        self.ops = set(args.ops)
        self.progress = None
        self.tdev = "cuda" if dev.gpu else "cpu"  # where torch tensors live

    # -- time budget

    def elapsed(self):
        return time.perf_counter() - self.t0

    def budget_used(self):
        """Seconds on the budget clock (started after the kernels compiled)."""
        return time.perf_counter() - self.budget_t0

    def tight(self):
        return self.budget_used() > self.args.time_budget

    def stopped(self):
        return self.broken or self.budget_used() > HARD_STOP * self.args.time_budget

    def plan(self, est_s):
        """(reps, extra warm-ups) for one contender whose call takes ``est_s`` seconds."""
        a = self.args
        if self.tight():
            return a.min_reps, 0
        reps = int(min(a.reps, max(a.min_reps, a.max_timing_s / max(est_s, 1e-7))))
        return reps, max(0, a.warmup - 2)

    # -- rows

    def skip(self, case, op, contender, reason, *, family, variant="", param="", impl=""):
        if op not in self.ops:
            return None
        row = self._row(case, op, contender, family, variant, param, impl, "")
        row.update(status="skipped", note=reason)
        self.rows.append(row)
        return row

    def _row(self, case, op, contender, family, variant, param, impl, note):
        return {
            "case": case.id, "workload": case.workload, "dtype": case.dtype, "label": case.label,
            "sparsity": case.sparsity, "matrix": case.matrix, "op": op, "param": param,
            "contender": contender, "family": family, "variant": variant, "impl": impl,
            "status": None, "ms": None, "note": note,
        }

    def model(self, case, op, contender, ms, *, family, param="", note=""):
        if op not in self.ops:
            return None
        row = self._row(case, op, contender, family, "", param, "model", note)
        row.update(status="model", ms=ms)
        self.rows.append(row)
        return row

    def measure(self, case, op, contender, fn, *, family, nbuf=1, check=None, nbytes=None,
                flops=None, variant="", param="", impl="", note="", keep=False):
        """Check once, warm up, time; record one row. Returns the row (and the first result).

        ``fn(i)`` runs the contender on input set ``i % nbuf`` and returns its result.
        ``check(result)`` returns ``(relative error, tolerance)``. ``nbytes``/``flops`` are
        numbers or functions of the result. Any exception becomes a ``failed`` row.
        """
        if op not in self.ops:
            return (None, None) if keep else None
        row = self._row(case, op, contender, family, variant, param, impl, note)
        first = None
        if self.stopped():
            row.update(status="skipped",
                       note="CUDA context broken" if self.broken else "over the time budget")
            self.rows.append(row)
            return (row, None) if keep else row
        if self.progress:
            self.progress.op(f"{op} {param} {contender} {variant}".replace("  ", " "))
        try:
            t = time.perf_counter()
            first = fn(0)
            self.dev.sync()
            row["first_call_s"] = round(time.perf_counter() - t, 4)
            if check is not None:
                err, tol = check(first)
                row["rel_err"], row["tol"] = err, tol
                ok = err is not None and math.isfinite(err) and err <= tol
                row["status"] = "ok" if ok else "wrong"
            else:
                row["status"] = "ok"
            for key, value in (("bytes", nbytes), ("flops", flops)):
                if value is not None:
                    row[key] = int(value(first) if callable(value) else value)
            if not keep:
                first = None
            t = time.perf_counter()
            fn(1 % nbuf)
            self.dev.sync()
            reps, warm = self.plan(time.perf_counter() - t)
            for w in range(warm):
                fn((2 + w) % nbuf)
            self.dev.sync()
            times = self.dev.timed(fn, nbuf, 2 + warm, reps)
            ms = statistics.median(times)
            row.update(ms=ms, ms_min=min(times), ms_max=max(times), reps=reps,
                       warmup=2 + warm, buffers=nbuf, times_ms=[round(x, 5) for x in times])
            if row.get("bytes"):
                row["GBps"] = row["bytes"] / ms / 1e6
                if self.ceilings.get("copy_GBps"):
                    row["frac_copy"] = row["GBps"] / self.ceilings["copy_GBps"]
            if row.get("flops"):
                row["TFLOPs"] = row["flops"] / ms / 1e9
            if op in PEAK_OPS:
                self._peak(case, row, fn)
        except Exception as exc:  # noqa: BLE001 - one contender must not stop the suite
            row.update(status="failed", error=_short_error(exc),
                       traceback=traceback.format_exc(limit=6)[-2000:])
            first = None
            self.dev.release()
            if not self.dev.healthy():
                self.broken = True
                self.notes.append(f"CUDA context broken after {case.id} {op} {contender}: "
                                  f"{row['error']}; the remaining measurements were skipped")
        self.rows.append(row)
        return (row, first) if keep else row

    def _peak(self, case, row, fn):
        """One more, untimed call of a conversion on input set 0: ``peak_bytes`` and
        ``peak_over_io`` (peak / (input + output bytes), the row's ``bytes``).

        A failure here (out of memory, say) is recorded as ``peak_error`` and keeps the timing.
        """
        try:
            peak = int(self.dev.peak_bytes(lambda: fn(0)))
        except Exception as exc:  # noqa: BLE001 - the timing is already measured
            row["peak_error"] = _short_error(exc)
            self.dev.release()
            if not self.dev.healthy():
                self.broken = True
                self.notes.append(f"CUDA context broken after {case.id} {row['op']} "
                                  f"{row['contender']} (peak memory): {row['peak_error']}")
            return
        row["peak_bytes"] = peak
        if row.get("bytes"):
            row["peak_over_io"] = peak / row["bytes"]

    def guarded(self, case, op, block, param=""):
        """Run one operation's block; a set-up failure becomes a failed row, not a lost case."""
        if op not in self.ops or self.stopped():
            return
        try:
            block()
        except Exception as exc:  # noqa: BLE001
            row = self._row(case, op, "twell", "twell", "", param, "", "")
            row.update(status="failed", error="set-up failed: " + _short_error(exc),
                       traceback=traceback.format_exc(limit=6)[-2000:])
            self.rows.append(row)
            self.notes.append(f"{case.id} {op} {param}: set-up failed: {_short_error(exc)}")
            self.dev.release()
            if not self.dev.healthy():
                self.broken = True

    def time_only(self, fn, reps=10):
        """Median milliseconds of ``fn(0)`` after 3 warm-ups (for the ceilings)."""
        for _ in range(3):
            fn(0)
        self.dev.sync()
        return statistics.median(self.dev.timed(fn, 1, 0, reps))

    # -- output

    def finish_case(self, case):
        self.cases.append(case)
        add_ratios(self.rows, case.id)
        self.save()

    def document(self):
        return {
            "schema": "twell-bench/1",
            "meta": self.meta,
            "ceilings": self.ceilings,
            "cases": [dataclasses.asdict(c) for c in self.cases],
            "rows": self.rows,
            "sweep": sweep_summary(self.rows),
            "targets": targets(self.rows),
            "notes": self.notes,
            "elapsed_s": round(self.elapsed(), 2),
        }

    def save(self):
        path = pathlib.Path(self.args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.document(), indent=1, default=_jsonable))
        os.replace(tmp, path)


# -- ratios, sweep, targets, table ---------------------------------------------------------


TIMED = ("ok", "wrong", "model")


def _group_key(row):
    return (row["case"], row["op"], row["param"])


def add_ratios(rows, case_id):
    """For every twell row of the case: ``speedup[c] = ms(c) / ms(twell)`` for each contender."""
    groups = {}
    for r in rows:
        if r["case"] == case_id:
            groups.setdefault(_group_key(r), []).append(r)
    for group in groups.values():
        for tw in group:
            if tw["family"] != "twell" or tw["status"] not in TIMED:
                continue
            tw["speedup"] = {
                f"{r['contender']} {r['variant']}".strip(): r["ms"] / tw["ms"]
                for r in group if r is not tw and r["status"] in TIMED and r["ms"]
            }
            best = {}
            for r in group:
                if r["family"] in FAMILIES and r["status"] in ("ok", "model") and r["ms"]:
                    if r["family"] not in best or r["ms"] < best[r["family"]]:
                        best[r["family"]] = r["ms"]
            tw["speedup_best"] = {f: ms / tw["ms"] for f, ms in best.items()}


def _find(rows, **where):
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def _best(rows, **where):
    ok = [r for r in _find(rows, **where) if r["status"] in ("ok", "model") and r["ms"]]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def _twell(rows, **where):
    """The twell row with the default (auto) slots, else the first twell row."""
    cands = [r for r in _find(rows, family="twell", **where) if r["status"] in TIMED]
    auto = [r for r in cands if "auto" in r["variant"]]
    return (auto or cands or [None])[0]


def sweep_summary(rows):
    """bf16 FFN SpMM against the number of non-zeros, with a least-squares line.

    ``twell_ms`` is what ``A @ B`` takes with ``slots="auto"`` (cuBLAS on ``A.toarray()``
    above the dense crossover); ``gather_ms`` is the gather kernel (the auto row where it
    gathers, else the row with the slots given, which always gathers). The line is fitted to
    ``gather_ms``: only the gather kernel's time can follow the non-zeros.
    """
    pts = []
    for r in rows:
        if (r["op"] == "spmm" and r["dtype"] == "bf16" and r["workload"] in ("ffn", "sweep")
                and r["family"] == "twell" and "auto" in r["variant"] and r["status"] in TIMED):
            same = dict(case=r["case"], op="spmm")
            dense, torch_, ref = (_best(rows, family=f, **same) for f in ("dense", "torch", "ref"))
            gather = [g for g in _find(rows, family="twell", **same)
                      if g.get("impl") in ("gather", "") and g["status"] in TIMED]
            gather.sort(key=lambda g: "auto" not in g["variant"])
            pts.append({"sparsity": r["sparsity"], "nnz": r.get("nnz"), "twell_ms": r["ms"],
                        "impl": r.get("impl", ""),
                        "gather_ms": gather[0]["ms"] if gather else None,
                        "dense_ms": dense and dense["ms"], "torch_csr_ms": torch_ and torch_["ms"],
                        "ref_t2d_ms": ref and ref["ms"], "status": r["status"]})
    pts.sort(key=lambda p: p["sparsity"])
    fit = None
    xy = [(p["nnz"] / 1e6, p["gather_ms"]) for p in pts if p["nnz"] and p["gather_ms"]]
    if len(xy) >= 3:
        x, y = np.array(xy).T
        slope, intercept = np.polyfit(x, y, 1)
        pred = slope * x + intercept
        ss = float(((y - y.mean()) ** 2).sum())
        r2 = 1 - float(((y - pred) ** 2).sum()) / ss if ss else 1.0
        fit = {"ms_per_million_nnz": float(slope), "intercept_ms": float(intercept), "r2": r2,
               "nnz_ratio_max_min": float(x.max() / x.min()),
               "time_ratio_max_min": float(y[x.argmax()] / y[x.argmin()])}
    return {"points": pts, "fit": fit}


def _twell_failed(rows, **where):
    return any(r["status"] == "failed" for r in _find(rows, family="twell", **where))


def _ratio_target(rows, name, threshold, twell_where, other, **other_where):
    tw = _twell(rows, **twell_where)
    base = _best(rows, **{**twell_where, **other_where, "family": other})
    value = base["ms"] / tw["ms"] if tw and base else None
    met = None if value is None else bool(value >= threshold and tw["status"] == "ok")
    if tw is None and _twell_failed(rows, **twell_where):
        met = False  # twell ran and failed: a miss, not a gap in the run
    return {"target": name, "value": value, "threshold": threshold, "met": met,
            "twell_ms": tw and tw["ms"], "other_ms": base and base["ms"],
            "other": base and base["contender"],
            "twell_status": tw["status"] if tw else "failed" if met is False else None}


def targets(rows):
    """The targets of issue 3, read off this run's rows."""
    out = []
    for s, fam, thr, name in ((0.99, "dense", 3.0, "SpMM 99% bf16 vs dense cuBLAS"),
                              (0.99, "ref", 3.0, "SpMM 99% bf16 vs reference T2D"),
                              (0.99, "torch", 8.0, "SpMM 99% bf16 vs cuSPARSE CSR (torch)"),
                              (0.95, "dense", 1.0, "SpMM 95% bf16 vs dense cuBLAS"),
                              (0.90, "torch", 2.0, "SpMM 90% bf16 vs cuSPARSE CSR (torch)")):
        out.append(_ratio_target(rows, name, thr, dict(workload="ffn", dtype="bf16",
                                                       sparsity=s, op="spmm"), fam))
    for s, fam, thr, name in (
            (0.99, "ref", 1.0, "D2T 99% bf16 vs reference D2T (no slower)"),
            (0.99, "composed", 1.0, "D2T 99% bf16 vs cuBLAS GEMM + ReLU + twell pack"),
            (0.99, "dense", 1.8, "gated FFN 99% bf16 vs dense (3 GEMMs)"),
            (0.95, "dense", 1.0, "gated FFN 95% bf16 vs dense (3 GEMMs)")):
        op = "gemm+pack" if name.startswith("D2T") else "gated ffn"
        out.append(_ratio_target(rows, name, thr, dict(workload="ffn", dtype="bf16",
                                                       sparsity=s, op=op), fam))
    where = dict(workload="ffn", dtype="bf16", sparsity=0.90, op="spmm")
    tw = _twell(rows, **where)
    out.append({"target": "SpMM 90% bf16 lossless (overflow kept)",
                "value": tw and tw.get("rel_err"), "threshold": TOLERANCE["bf16"],
                "met": tw["status"] == "ok" if tw else False if _twell_failed(rows, **where)
                else None})
    out.append(_ratio_target(rows, "SpMM 99% fp32 vs cupyx CSR", 5.0,
                             dict(workload="ffn", dtype="fp32", sparsity=0.99, op="spmm"), "cupyx"))
    # Hot neurons and scientific matrices: faster than cuSPARSE (best of cupyx/torch) everywhere.
    for wl in ("hot", "sci"):
        worst = None
        for tw in _find(rows, workload=wl, op="spmm", family="twell"):
            if tw["status"] not in TIMED or (wl == "hot" and "auto" not in tw["variant"]):
                continue
            where = dict(case=tw["case"], op="spmm", param=tw["param"])
            base = [b for b in (_best(rows, family=f, **where) for f in ("cupyx", "torch")) if b]
            if not base:
                continue
            b = min(base, key=lambda r: r["ms"])
            v = b["ms"] / tw["ms"]
            d = _best(rows, family="dense", **where)
            item = {"case": f"{tw['case']} {tw['param']} {tw['variant']}".strip(), "value": v,
                    "vs_dense": d and d["ms"] / tw["ms"]}
            if worst is None or v < worst["value"]:
                worst = item
        out.append({"target": f"SpMM {wl}: faster than cuSPARSE on every case (worst)",
                    "value": worst and worst["value"], "threshold": 1.0,
                    "met": None if worst is None else worst["value"] > 1.0, "worst": worst})
    packs = [r for r in _find(rows, workload="ffn", op="pack", family="twell")
             if r["status"] in TIMED and r.get("frac_copy")]
    low = min(packs, key=lambda r: r["frac_copy"]) if packs else None
    out.append({"target": "pack dense->TwELL: fraction of copy bandwidth (worst ffn case)",
                "value": low and low["frac_copy"], "threshold": 0.75,
                "met": None if low is None else low["frac_copy"] >= 0.75,
                "case": low and f"{low['case']} {low['variant']}"})
    for s in (0.99, 0.95, 0.90):
        out.append(_ratio_target(rows, f"pack fp32 {s:.0%} vs cupyx csr_matrix(dense)", 10.0,
                                 dict(workload="ffn", dtype="fp32", sparsity=s, op="pack"),
                                 "cupyx"))
    for op in ("csr->twell", "twell->csr", "twell->dense"):
        fr = [r["frac_copy"] for r in _find(rows, op=op, family="twell")
              if r["status"] in TIMED and r.get("frac_copy")]
        out.append({"target": f"{op}: fraction of copy bandwidth (min / median / max)",
                    "value": [min(fr), statistics.median(fr), max(fr)] if fr else None,
                    "threshold": None, "met": None})
    return out


def _fmt_ms(row):
    if row is None:
        return "-"
    if row["status"] == "failed":
        return "FAIL"
    if row["status"] == "skipped":
        return "skip"
    ms = row["ms"]
    text = f"{ms:.3f}" if ms < 10 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"
    return ("~" if row["status"] == "model" else "") + text + (
        "!" if row["status"] == "wrong" else "")


def _fmt_ratio(v):
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _family_cell(group, family):
    rows = [r for r in group if r["family"] == family]
    timed = [r for r in rows if r["status"] in ("ok", "model")]
    if timed:
        return min(timed, key=lambda r: r["ms"])
    wrong = [r for r in rows if r["status"] == "wrong"]
    return wrong[0] if wrong else (rows[0] if rows else None)


TABLE_COLUMNS = (("op", 12, "<"), ("wl", 5, "<"), ("dt", 4, "<"), ("case", 13, "<"),
                 ("variant", 19, "<"), ("twell", 8, ">"), ("dense", 8, ">"), ("cupyx", 8, ">"),
                 ("torch", 8, ">"), ("ref", 8, ">"), ("xdense", 6, ">"), ("xcupyx", 6, ">"),
                 ("xtorch", 6, ">"), ("xref", 6, ">"), ("GB/s", 6, ">"), ("%copy", 5, ">"),
                 ("peak", 6, ">"), ("pk/io", 5, ">"))


def _fmt_bytes(n):
    """``1.5G``, ``320M``, ``12K``: decimal units, two or three significant digits."""
    if n is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return f"{n}B"


def table_lines(rows, cases):
    """One line per twell row (or per group without one), grouped by operation, SpMM last."""
    labels = {c.id: c for c in cases}
    groups = {}
    for r in rows:
        groups.setdefault(_group_key(r), []).append(r)
    order = ("pack", "gemm+pack", "gated ffn", "csr->twell", "twell->csr", "twell->dense", "spmv",
             "spmm")

    def line(cells):
        return " ".join(f"{str(c):{a}{w}}"
                        for c, (_, w, a) in zip(cells, TABLE_COLUMNS, strict=True)).rstrip()

    header = line([c for c, _, _ in TABLE_COLUMNS])
    out = []
    for op in order:
        section = [(key, g) for key, g in groups.items() if key[1] == op]
        if not section:
            continue
        out += ["", header]
        for (case_id, _, param), group in section:
            case = labels.get(case_id)
            label = (case.label if case else case_id) + (f" {param}" if param else "")
            base = [_family_cell(group, f) for f in FAMILIES]
            for tw in [r for r in group if r["family"] == "twell"] or [None]:
                ratios = []
                for b in base:
                    ok = (tw is not None and tw["status"] in TIMED and b is not None
                          and b["status"] in TIMED)
                    ratios.append(_fmt_ratio(b["ms"] / tw["ms"]) if ok else "-")
                gbps = tw.get("GBps") if tw else None
                frac = tw.get("frac_copy") if tw else None
                peak = tw.get("peak_bytes") if tw else None
                pk_io = tw.get("peak_over_io") if tw else None
                out.append(line([
                    op, group[0]["workload"], group[0]["dtype"], label,
                    (tw["variant"] if tw else "(no twell row)"), _fmt_ms(tw),
                    *map(_fmt_ms, base), *ratios, f"{gbps:.0f}" if gbps else "-",
                    f"{frac:.0%}" if frac else "-", _fmt_bytes(peak),
                    f"{pk_io:.2f}" if pk_io is not None else "-"]))
    return out[1:]


def targets_lines(items):
    out = []
    for t in items:
        v = t["value"]
        if isinstance(v, list):
            text = " / ".join(f"{x:.0%}" for x in v)
        elif v is None:
            text = "twell FAILED" if t["met"] is False else "not measured"
        elif "fraction" in t["target"]:
            text = f"{v:.0%}"
        elif "lossless" in t["target"]:
            text = f"rel. error {v:.1e}"
        else:
            text = f"x{v:.2f}"
        thr = t["threshold"]
        goal = "" if thr is None or "lossless" in t["target"] else (
            f"(>= {thr:.0%})" if "fraction" in t["target"] else f"(>= x{thr:g})")
        verdict = {True: "met", False: "MISSED", None: "-"}[t["met"]]
        extra = ""
        if t.get("worst"):
            w = t["worst"]
            extra = f"  worst: {w['case']}" + (
                f", x{w['vs_dense']:.2f} vs dense" if w.get("vs_dense") else "")
        elif t.get("other") and t.get("twell_ms"):
            extra = f"  ({t['twell_ms']:.3f} ms vs {t['other']} {t['other_ms']:.3f} ms" + (
                ", twell result WRONG" if t.get("twell_status") == "wrong" else "") + ")"
        elif t.get("other"):
            extra = f"  (twell not timed; {t['other']} {t['other_ms']:.3f} ms)"
        elif t.get("case"):
            extra = f"  ({t['case']})"
        out.append(f"  {t['target']:<58} {text:>16} {goal:>9}  {verdict}{extra}")
    return out


# -- checks ------------------------------------------------------------------------------


class Checks:
    """Check builders: each returns ``check(result) -> (relative error, tolerance)``."""

    def __init__(self, bench):
        self.b = bench
        self.xp = bench.xp

    def rel_err(self, got, ref):
        xp = self.xp
        if got.shape != ref.shape:
            raise ValueError(f"result shape {got.shape} != expected {ref.shape}")
        got_norm = float(xp.linalg.norm(got.ravel()))
        if not math.isfinite(got_norm):
            return float("nan")
        ref_norm = float(xp.linalg.norm(ref.ravel()))
        if got_norm == 0 and ref_norm != 0:
            return 1.0  # an all-zero result: nothing was written
        diff = float(xp.linalg.norm((got - ref).ravel()))
        return diff / ref_norm if ref_norm else diff

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


# -- workloads: activations (ffn, sweep, hot) -------------------------------------------------


@dataclasses.dataclass
class Inputs:
    """Input sets of one activation case, one entry per rotating buffer."""

    z: list
    down: list
    v: list
    x: list | None = None
    w: object = None


def n_buffers(bench, nbytes):
    """Rotate among ``--buffers`` input sets when one set would sit in L2 (< 4 x L2)."""
    return bench.args.buffers if nbytes < 4 * bench.dev.l2_bytes else 1


def ffn_inputs32(bench, m, k, n, s, nbuf, seed, with_x=True, thresholds=None):
    """float32 inputs: Z = relu(X W^T) with the bias-column trick, DOWN, v.

    Column j of Z fires with probability 1 - s, or where ``thresholds`` (k,) is given,
    1 - Phi(thresholds[j]).
    """
    xp = bench.xp
    g = RNG(xp, seed)
    thr = _ndtri(s) if thresholds is None else xp.asarray(thresholds.astype(np.float32))
    w = g.normal((k, n)) / np.float32(math.sqrt(max(n - 1, 1)))
    w[:, 0] = -thr
    xs, zs = [], []
    for _ in range(nbuf):
        x = g.normal((m, n))
        x[:, 0] = 1.0
        zs.append(relu(xp, x @ w.T))
        xs.append(x if with_x else None)
    down = [g.normal((k, n)) / np.float32(math.sqrt(k)) for _ in range(nbuf)]
    v = [g.normal((k,)) for _ in range(nbuf)]
    return Inputs(zs, down, v, xs if with_x else None, w)


def hot_inputs32(bench, m, k, n, s, nbuf, seed):
    """float32 inputs with Zipf-like per-column firing probabilities p_j: the bias-column
    trick with a bias per column, W[j, 0] = -Phi^-1(1 - p_j), so that the D2T and the gated
    FFN run on the hot activations too. The hottest column's p_j = 1 is capped at
    1 - 1e-7 (a finite bias: it fires in all but ~1e-7 of the rows)."""
    from scipy.special import ndtri

    p, a = zipf_probabilities(k, 1.0 - s, seed)
    thresholds = ndtri(1.0 - np.clip(p, 1e-12, 1.0 - 1e-7))
    inp = ffn_inputs32(bench, m, k, n, s, nbuf, seed + 1, thresholds=thresholds)
    return inp, {"zipf_exponent": a, "p_max": float(p.max()), "p_min": float(p.min())}


def tile_counts(xp, nonzero, tile_width=twell.DEFAULT_TILE_WIDTH):
    """Non-zeros per (row, tile) from a boolean mask, int32: computed without twell."""
    m, k = nonzero.shape
    nt = -(-k // tile_width)
    if nt * tile_width != k:
        pad = xp.zeros((m, nt * tile_width - k), dtype=bool)
        nonzero = xp.concatenate([nonzero, pad], axis=1)
    return nonzero.reshape(m, nt, tile_width).sum(axis=2, dtype=np.int32)


def run_activation_case(bench, case, inp32, dtype, with_gemm, sweep=False):
    """Every contender of one (workload, sparsity, dtype) on the same input sets."""
    xp, sp, torch, ref, ck = bench.xp, bench.sp, bench.torch, bench.ref, Checks(bench)
    dt = np.dtype(dtype)
    acc = acc_dtype(dt)
    nb = len(inp32.z)
    z = [cast(xp, a, dt) for a in inp32.z]
    down = [cast(xp, a, dt) for a in inp32.down]
    v = [cast(xp, a, dt) for a in inp32.v]
    m, k = z[0].shape
    n = down[0].shape[1]
    isz = dt.itemsize
    z_ref = widen(xp, z[0], acc)  # buffer 0, as the contenders see it
    nnz = int(xp.count_nonzero(z_ref))
    dense_bytes = m * k * isz

    # Tile statistics without twell (a twell failure must not hide the baselines); the fixed
    # slot count is the largest tile count over all buffers: no overflow anywhere.
    tile = tile_counts(xp, z_ref != 0)
    s_max = max(1, int(tile.max()), *(int(tile_counts(xp, t != 0).max()) for t in z[1:]))
    hist = xp.bincount(tile.ravel())
    hist = np.asarray(hist.get() if bench.dev.gpu else hist)  # host copy, a few words
    case.info.update(
        shape=[m, k, n], nnz=nnz, density=nnz / (m * k), buffers=nb, slots_max=s_max,
        slots_auto_expected=twell.auto_slots(hist, twell.DEFAULT_TILE_WIDTH),
        max_per_tile=int(tile.max()), mean_per_tile=float(tile.mean()),
        tile_rows=int(tile.size), tile_rows_over_31=int((tile > 31).sum()),
        tile_rows_over_63=int((tile > 63).sum()),
        bytes_dense=dense_bytes, bytes_csr=csr_nbytes(nnz, m, isz))
    del tile, hist
    tiles31 = case.info["tile_rows_over_31"]

    # TwELL layouts (untimed) for the consumers: auto slots and s_max slots.
    a_auto = a_max = None
    try:
        a_auto = [twell.TwELLMatrix(t) for t in z]
        a_max = [twell.TwELLMatrix(t, slots=s_max) for t in z]
        case.info.update(
            slots_auto=a_auto[0].slots, occupancy_auto=a_auto[0].occupancy,
            overflow_nnz_auto=a_auto[0].overflow_nnz,
            overflow_rows_auto=a_auto[0].overflow_rows, bytes_twell_auto=a_auto[0].nbytes,
            bytes_twell_max=a_max[0].nbytes)
        v_auto = f"S=auto({a_auto[0].slots})"
        built = ""
    except Exception as exc:  # noqa: BLE001 - timed below as failures; baselines still run
        v_auto = "S=auto"
        built = f"building TwELL failed: {_short_error(exc)}"
        bench.notes.append(f"{case.id}: {built}")
    v_max = f"S={s_max}"

    def twell_skip(op, variant=v_auto):
        bench.skip(case, op, "twell", built, family="twell", variant=variant)

    has_sp = dt in (np.float32, np.float64)
    csr = [sp.csr_matrix(t) for t in z] if has_sp else None
    tz = tdown = tv = tcsr = None
    if torch is not None:
        try:
            tz = [to_torch(torch, t) for t in z]
            tdown = [to_torch(torch, t) for t in down]
            tv = [to_torch(torch, t) for t in v]
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch views failed: {_short_error(exc)}")
            tz = tdown = tv = None
    if tz is not None:
        try:
            tcsr = [t.to_sparse_csr() for t in tz]
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch to_sparse_csr failed: {_short_error(exc)}")
    ref_ok, ref_why = (False, "no --reference given") if ref is None else \
        Reference.t2d_supports(m, n, k)
    if ref is not None and dt != BF16:
        ref_ok, ref_why = False, "the reference is bf16 only"
    elif ref_ok and tdown is None:
        ref_ok, ref_why = False, "torch inputs unavailable"

    def spmm_ops():
        out_ref = z_ref @ widen(xp, down[0], acc)
        flops = 2 * nnz * n
        chk = ck.close(out_ref, dt)
        out_bytes = m * n * isz + k * n * isz
        bench.measure(case, "spmm", "cupy.matmul", lambda i: matmul_same(xp, z[i], down[i]),
                      family="dense", nbuf=nb, check=chk, flops=2 * m * k * n,
                      nbytes=dense_bytes + out_bytes, impl="cuBLAS")
        if tz is not None:
            bench.measure(case, "spmm", "torch.matmul", lambda i: tz[i] @ tdown[i],
                          family="dense", nbuf=nb, check=chk, flops=2 * m * k * n, impl="cuBLAS")
        if csr is not None:
            bench.measure(case, "spmm", f"{bench.dev.sparse_name} csr", lambda i: csr[i] @ down[i],
                          family="cupyx", nbuf=nb, check=chk, flops=flops, impl="cuSPARSE")
        if tcsr is not None:
            bench.measure(case, "spmm", "torch csr", lambda i: tcsr[i] @ tdown[i],
                          family="torch", nbuf=nb, check=chk, flops=flops, impl="cuSPARSE")
        if ref_ok and tiles31:
            bench.skip(case, "spmm", "ref T2D C=8",
                       f"overflow: {tiles31} (row, tile) pairs hold more than 31 entries; the "
                       "reference packed layout (C=8) cannot hold this matrix", family="ref")
        elif ref_ok and a_auto is None:
            bench.skip(case, "spmm", "ref T2D C=8", "no TwELL matrix to pack: " + built,
                       family="ref")
        elif ref_ok:
            try:
                packed = [to_torch(torch, a.to_packed(8)) for a in a_auto]
                out = torch.empty((m, n), dtype=torch.bfloat16, device=bench.tdev)
                bench.measure(case, "spmm", "ref T2D C=8",
                              lambda i: ref.t2d_out(packed[i], tdown[i], out), family="ref",
                              nbuf=nb, check=chk, flops=flops)
            except ValueError as exc:  # to_packed refuses what the layout cannot hold
                bench.skip(case, "spmm", "ref T2D C=8", _short_error(exc), family="ref")
        elif ref is not None:
            bench.skip(case, "spmm", "ref T2D C=8", ref_why, family="ref")
        for a, var in ((a_auto, v_auto), (a_max, v_max)):
            if a is None:
                twell_skip("spmm", var)
                continue
            bench.measure(case, "spmm", "twell", lambda i, a=a: a[i] @ down[i], family="twell",
                          variant=var, nbuf=nb, check=chk, flops=flops,
                          nbytes=a[0].nbytes + out_bytes, impl=spmm_way(a[0], n))

    if sweep:
        bench.guarded(case, "spmm", spmm_ops)
        _tag_nnz(bench, case, nnz)
        return

    eq = ck.equal(z_ref, dt)

    def pack_ops():
        """dense -> TwELL (and dense -> CSR for the others)."""
        _pack_ops(bench, case, z, tz, csr, eq, dense_bytes, v_auto, s_max)

    def csr_ops():
        """CSR -> TwELL (cupyx holds float32/float64 only)."""
        if csr is None:
            bench.skip(case, "csr->twell", "twell",
                       f"cupyx.scipy.sparse cannot hold {SHORT[dt]} CSR input", family="twell")
            return
        bench.measure(case, "csr->twell", "twell", lambda i: twell.TwELLMatrix(csr[i]),
                      family="twell", variant="S=auto", nbuf=nb, check=eq,
                      nbytes=lambda a: case.info["bytes_csr"] + a.nbytes)

    def tocsr_ops():
        """TwELL -> CSR (tocsr needs float32/float64; else the internal CSR arrays)."""
        if a_auto is None:
            twell_skip("twell->csr")
            return
        if has_sp:
            to_csr, impl = (lambda i: a_auto[i].tocsr()), "A.tocsr()"
        else:
            to_csr, impl = (lambda i: a_auto[i]._csr_arrays()), "A._csr_arrays()"
        bench.measure(case, "twell->csr", "twell", to_csr, family="twell", variant=v_auto,
                      nbuf=nb, check=eq, nbytes=a_auto[0].nbytes + csr_nbytes(nnz, m, isz, 4, 8),
                      impl=impl)

    def todense_ops():
        """TwELL -> dense (and CSR -> dense for the others)."""
        if csr is not None:
            bench.measure(case, "twell->dense", f"{bench.dev.sparse_name} csr.toarray",
                          lambda i: csr[i].toarray(), family="cupyx", nbuf=nb, check=eq,
                          nbytes=case.info["bytes_csr"] + dense_bytes)
        if tcsr is not None:
            bench.measure(case, "twell->dense", "torch csr.to_dense",
                          lambda i: tcsr[i].to_dense(), family="torch", nbuf=nb, check=eq,
                          nbytes=lambda d: torch_nbytes(d, tcsr[0].crow_indices(),
                                                        tcsr[0].col_indices(), tcsr[0].values()))
        if a_auto is None:
            twell_skip("twell->dense")
            return
        bench.measure(case, "twell->dense", "twell", lambda i: a_auto[i].toarray(),
                      family="twell", variant=v_auto, nbuf=nb, check=eq,
                      nbytes=a_auto[0].nbytes + dense_bytes)

    def spmv_ops():
        vref = z_ref @ widen(xp, v[0], acc)
        chk = ck.close(vref, dt)
        bench.measure(case, "spmv", "cupy.matmul", lambda i: matmul_same(xp, z[i], v[i]),
                      family="dense", nbuf=nb, check=chk, nbytes=dense_bytes, impl="cuBLAS")
        if tz is not None:
            bench.measure(case, "spmv", "torch.matmul", lambda i: tz[i] @ tv[i],
                          family="dense", nbuf=nb, check=chk, impl="cuBLAS")
        if csr is not None:
            bench.measure(case, "spmv", f"{bench.dev.sparse_name} csr", lambda i: csr[i] @ v[i],
                          family="cupyx", nbuf=nb, check=chk, impl="cuSPARSE")
        if tcsr is not None:
            bench.measure(case, "spmv", "torch csr", lambda i: tcsr[i] @ tv[i],
                          family="torch", nbuf=nb, check=chk, impl="cuSPARSE")
        if a_auto is None:
            twell_skip("spmv")
            return
        bench.measure(case, "spmv", "twell", lambda i: a_auto[i] @ v[i], family="twell",
                      variant=v_auto, nbuf=nb, check=chk,
                      nbytes=a_auto[0].nbytes + (k + m) * isz)

    bench.guarded(case, "pack", pack_ops)
    if with_gemm:  # relu(X @ W^T) -> sparse: the reference fuses it into its GEMM
        bench.guarded(case, "gemm+pack", lambda: run_gemm_pack(
            bench, case, inp32, dt, s_max, case.info["max_per_tile"], nb))
        bench.guarded(case, "gated ffn", lambda: run_gated_ffn(
            bench, case, inp32, dt, s_max, case.info["max_per_tile"], nb))
    bench.guarded(case, "csr->twell", csr_ops)
    bench.guarded(case, "twell->csr", tocsr_ops)
    bench.guarded(case, "twell->dense", todense_ops)
    bench.guarded(case, "spmm", spmm_ops)
    bench.guarded(case, "spmv", spmv_ops)
    _tag_nnz(bench, case, nnz)


def _pack_ops(bench, case, z, tz, csr, eq, dense_bytes, v_auto, s_max):
    sp, nb = bench.sp, len(z)
    if csr is not None:
        bench.measure(case, "pack", f"{bench.dev.sparse_name} csr_matrix(dense)",
                      lambda i: sp.csr_matrix(z[i]), family="cupyx", nbuf=nb, check=eq,
                      nbytes=lambda c: dense_bytes + c.data.nbytes + c.indices.nbytes
                      + c.indptr.nbytes)
    if tz is not None:
        bench.measure(case, "pack", "torch to_sparse_csr", lambda i: tz[i].to_sparse_csr(),
                      family="torch", nbuf=nb, check=eq,
                      nbytes=lambda t: dense_bytes + torch_nbytes(
                          t.crow_indices(), t.col_indices(), t.values()))
    bench.measure(case, "pack", "twell", lambda i: twell.TwELLMatrix(z[i]), family="twell",
                  variant=v_auto, nbuf=nb, check=eq, nbytes=lambda a: dense_bytes + a.nbytes)
    bench.measure(case, "pack", "twell", lambda i: twell.TwELLMatrix(z[i], slots=s_max),
                  family="twell", variant=f"S={s_max}", nbuf=nb, check=eq,
                  nbytes=lambda a: dense_bytes + a.nbytes)


def _tag_nnz(bench, case, nnz):
    for r in bench.rows:
        if r["case"] == case.id:
            r["nnz"] = nnz


def run_gemm_pack(bench, case, inp32, dt, s_max, max_tile, nb):
    """relu(X @ W^T) packed: dense GEMM + twell pack vs dense GEMM alone vs reference D2T."""
    xp, torch, ref, ck = bench.xp, bench.torch, bench.ref, Checks(bench)
    x = [cast(xp, a, dt) for a in inp32.x]
    w = cast(xp, inp32.w, dt)
    m, n = x[0].shape
    k = w.shape[0]
    acc = acc_dtype(dt)
    flops = 2 * m * n * k
    up_ref = relu(xp, matmul_same(xp, x[0], w.T))  # what the twell pipeline packs, buffer 0
    chk = ck.close(widen(xp, up_ref, acc), dt)
    del up_ref
    bench.measure(case, "gemm+pack", "cupy.matmul+relu (dense)",
                  lambda i: relu(xp, matmul_same(xp, x[i], w.T)), family="dense", nbuf=nb,
                  check=chk, flops=flops, impl="cuBLAS")
    tx = tw = None
    if torch is not None:
        try:
            tx = [to_torch(torch, a) for a in x]
            tw = to_torch(torch, w)
            bench.measure(case, "gemm+pack", "torch relu(matmul) (dense)",
                          lambda i: torch.relu(tx[i] @ tw.T), family="dense", nbuf=nb,
                          check=chk, flops=flops, impl="cuBLAS")
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch GEMM inputs failed: {_short_error(exc)}")
            tx = None
    if ref is not None:
        ok, why = Reference.d2t_supports(m, n, k)
        if dt != BF16:
            ok, why = False, "the reference is bf16 only"
        if ok and tx is None:
            ok, why = False, "torch inputs unavailable"
        for cf in (8, 4):
            name, cap = f"ref D2T C={cf}", 256 // cf - 1
            if not ok:
                bench.skip(case, "gemm+pack", name, why, family="ref")
            elif max_tile > cap:
                bench.skip(case, "gemm+pack", name,
                           f"overflow: up to {max_tile} entries per (row, tile) > capacity {cap}; "
                           "the reference output would be corrupt", family="ref")
            else:
                # int32 storage viewed as uint32: zeros() need not support uint32 itself.
                packed = [torch.zeros((m, k // cf), dtype=torch.int32, device=bench.tdev)
                          .view(torch.uint32) for _ in range(nb)]

                def words_dense(p, cf=cf):
                    words = xp.from_dlpack(p.view(torch.int32)).view(np.uint32)
                    return twell.TwELLMatrix.from_packed(words, (m, k), compression=cf)
                bench.measure(case, "gemm+pack", name,
                              lambda i, cf=cf, packed=packed: ref.d2t_out(tx[i], tw, packed[i], cf),
                              family="ref", nbuf=nb, check=lambda p, f=words_dense: chk(f(p)),
                              flops=flops)
    bench.measure(case, "gemm+pack", "cupy.matmul+relu+twell pack",
                  lambda i: twell.TwELLMatrix(relu(xp, matmul_same(xp, x[i], w.T)), slots=s_max),
                  family="composed", variant=f"S={s_max}", nbuf=nb, check=chk, flops=flops)
    # twell.matmul_to_twell: one fused kernel for 16-bit inputs on the GPU (the dense product
    # never reaches memory), a composed product + pack elsewhere.
    bench.measure(case, "gemm+pack", "twell.matmul_to_twell",
                  lambda i: twell.matmul_to_twell(x[i], w), family="twell", variant="auto",
                  nbuf=nb, check=chk, flops=flops)
    bench.measure(case, "gemm+pack", "twell.matmul_to_twell",
                  lambda i: twell.matmul_to_twell(x[i], w, slots=s_max), family="twell",
                  variant=f"S={s_max}", nbuf=nb, check=chk, flops=flops)


def run_gated_ffn(bench, case, inp32, dt, s_max, max_tile, nb):
    """(relu(X Wg^T) * (X Wu^T)) Wd^T: twell.sparse_ffn vs the dense layer vs the reference.

    Wg is the activation workload's W (its bias column sets the sparsity); Wu is random
    normal; the down weight is the workload's DOWN, (H, D) as the reference takes it, so
    twell gets its nn.Linear form DOWN.T (a view). The check is against a float32 layer
    computed from the same rounded inputs.
    """
    xp, torch, ref, ck = bench.xp, bench.torch, bench.ref, Checks(bench)
    x = [cast(xp, a, dt) for a in inp32.x]
    wg = cast(xp, inp32.w, dt)
    h, d = wg.shape
    m = x[0].shape[0]
    wu = cast(xp, RNG(xp, 17).normal((h, d)) / np.float32(math.sqrt(d)), dt)
    down = [cast(xp, a, dt) for a in inp32.down]
    acc = acc_dtype(dt)
    x0 = widen(xp, x[0], acc)
    hidden = relu(xp, x0 @ widen(xp, wg, acc).T) * (x0 @ widen(xp, wu, acc).T)
    chk = ck.close(hidden @ widen(xp, down[0], acc), dt)
    del hidden, x0
    flops = 3 * 2 * m * d * h  # the dense layer's
    bench.measure(case, "gated ffn", "cupy 3 GEMMs (dense)",
                  lambda i: matmul_same(xp, relu(xp, matmul_same(xp, x[i], wg.T))
                                        * matmul_same(xp, x[i], wu.T), down[i]),
                  family="dense", nbuf=nb, check=chk, flops=flops, impl="cuBLAS")
    tx = None
    if torch is not None:
        try:
            tx = [to_torch(torch, a) for a in x]
            twg, twu = to_torch(torch, wg), to_torch(torch, wu)
            tdown = [to_torch(torch, a) for a in down]
            bench.measure(case, "gated ffn", "torch 3 GEMMs (dense)",
                          lambda i: (torch.relu(tx[i] @ twg.T) * (tx[i] @ twu.T)) @ tdown[i],
                          family="dense", nbuf=nb, check=chk, flops=flops, impl="cuBLAS")
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch FFN inputs failed: {_short_error(exc)}")
            tx = None
    if ref is not None:
        ok, why = Reference.t2d_supports(m, d, h)
        if ok:
            ok, why = Reference.d2t_supports(m, d, h)
        if dt != BF16:
            ok, why = False, "the reference is bf16 only"
        if ok and tx is None:
            ok, why = False, "torch inputs unavailable"
        name = "ref gated FFN (D2T + gated T2D) C=8"
        if not ok:
            bench.skip(case, "gated ffn", name, why, family="ref")
        elif max_tile > _layout.packed_capacity(8):
            bench.skip(case, "gated ffn", name,
                       f"overflow: up to {max_tile} entries per (row, tile) > capacity "
                       f"{_layout.packed_capacity(8)}; the reference output would be corrupt",
                       family="ref")
        else:
            packed = [torch.zeros((m, h // 8), dtype=torch.int32, device=bench.tdev)
                      .view(torch.uint32) for _ in range(nb)]
            gout = [torch.zeros((m, d), dtype=torch.bfloat16, device=bench.tdev)
                    for _ in range(nb)]

            def ref_ffn(i):
                ref.d2t_out(tx[i], twg, packed[i], 8)
                return ref.gated_t2d_out(tx[i], packed[i], twu, tdown[i], gout[i])

            bench.measure(case, "gated ffn", name, ref_ffn, family="ref", nbuf=nb, check=chk,
                          flops=flops)
    for slots, variant in (("auto", "auto"), (s_max, f"S={s_max}")):
        bench.measure(case, "gated ffn", "twell.sparse_ffn",
                      lambda i, s=slots: twell.sparse_ffn(x[i], wg, wu, down[i].T, slots=s),
                      family="twell", variant=variant, nbuf=nb, check=chk, flops=flops)


# -- workloads: scientific matrices -------------------------------------------------------------


def poisson2d(bench, g, dtype):
    """5-point Laplacian on a g x g grid (4 on the diagonal, -1 to each neighbour), CSR."""
    xp, sp = bench.xp, bench.sp
    n = g * g
    idx = xp.arange(n, dtype=np.int64)
    i, j = idx // g, idx % g
    rows, cols = [idx], [idx]
    for keep, shift in ((i > 0, -g), (i < g - 1, g), (j > 0, -1), (j < g - 1, 1)):
        r = idx[keep]
        rows.append(r)
        cols.append(r + shift)
    rows, cols = xp.concatenate(rows), xp.concatenate(cols)
    vals = xp.full(rows.size, -1.0, dtype=dtype)
    vals[:n] = 4.0
    a = sp.coo_matrix((vals, (rows.astype(np.int32), cols.astype(np.int32))), shape=(n, n))
    a = a.tocsr()
    a.sum_duplicates()
    return a, {"grid": g, "n": n}


def powerlaw_graph(bench, n, mean_degree, alpha, seed, dtype):
    """Random graph: Pareto(alpha) out-degrees with mean ~mean_degree, uniform columns."""
    xp, sp = bench.xp, bench.sp
    host = np.random.default_rng(seed)
    xmin = mean_degree * (alpha - 1) / alpha + 0.5  # + 0.5: the floor below loses ~0.5
    deg = np.floor(xmin * (1.0 - host.random(n)) ** (-1.0 / alpha)).astype(np.int64)
    deg = np.clip(deg, 1, max(1, n // 4))
    indptr = xp.asarray(np.concatenate([[0], np.cumsum(deg)]))
    nnz = int(deg.sum())
    g = RNG(xp, seed + 1)
    rows = rows_of(xp, indptr, nnz).astype(np.int32)
    cols = g.integers(n, nnz).astype(np.int32)
    # Values in [0.25, 1.25): float32 normals include exact zeros (~1 in 3 M), and summed
    # duplicates could cancel; the exact round-trip checks need a canonical CSR, without
    # explicit zeros. (cupyx's eliminate_zeros is no way out: at n = 10^6 on the H200 it
    # returned a corrupted structure: 4133 entries in one (row, 256-column tile).)
    vals = (g.uniform((nnz,)) + 0.25).astype(dtype)
    a = sp.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()
    a.sum_duplicates()
    return a, {"n": n, "mean_degree": float(deg.mean()), "max_degree": int(deg.max()),
               "alpha": alpha}


def twell_estimate(bench, a, tile_width, itemsize):
    """Slots ``"auto"`` would choose, TwELL bytes, and a peak-memory estimate for packing.

    The auto choice comes from the run lengths of (row, tile) keys of the canonical CSR,
    so no (M x n_tiles) array is needed to decide whether one fits.
    """
    xp = bench.xp
    m, k = a.shape
    nt = -(-k // tile_width)
    pairs = m * nt
    nnz = int(a.nnz)
    key = rows_of(xp, a.indptr, nnz).astype(np.int64) * nt + a.indices.astype(np.int64) // \
        tile_width
    _, counts = xp.unique(key, return_counts=True)
    del key
    hist = xp.bincount(counts)
    hist = np.asarray(hist.get() if bench.dev.gpu else hist, dtype=np.int64)  # host copy
    hist[0] += pairs - int(counts.size)
    slots = twell.auto_slots(hist, tile_width)
    c = np.arange(hist.size)
    overflow = int((hist * np.maximum(c - slots, 0)).sum())
    parts = pairs * (4 + slots * (itemsize + 2)) + overflow * (itemsize + 4) + (m + 1) * 8
    # Packing holds per-pair counts, totals and int64 offsets beside the parts, and a few
    # nnz-long index arrays (COO, sort keys); the timed conversion holds a second copy.
    peak = 2 * parts + pairs * 24 + nnz * 48
    return {"tile_width": tile_width, "n_tiles": nt, "pairs": pairs, "slots_est": slots,
            "overflow_est": overflow, "bytes_est": parts, "peak_est": peak,
            "max_per_tile": int(hist.size - 1)}


def _sci_spmm(bench, case, mats, tcsr, a64, layouts, dt, nrhs, g):
    """SpMM with ``nrhs`` right-hand sides: cupyx, torch, dense model, every TwELL layout."""
    xp, torch, ck = bench.xp, bench.torch, Checks(bench)
    n, nnz, nb, isz, acc = mats[0].shape[0], int(mats[0].nnz), len(mats), dt.itemsize, \
        acc_dtype(dt)
    param = f"N={nrhs}"
    need = (3 + nb) * n * nrhs * 8
    free = bench.dev.free_bytes()
    if need > 0.8 * free:
        reason = f"N={nrhs}: right-hand sides and outputs ~{need / 1e9:.1f} GB > 80% free"
        bench.skip(case, "spmm", "twell", reason, family="twell", param=param)
        return
    b = [cast(xp, g.normal((n, nrhs)), dt) for _ in range(nb)]
    ref = a64 @ widen(xp, b[0], np.float64)
    chk = ck.close(ref if dt == np.float64 else ref.astype(acc), dt)
    del ref
    flops = 2 * nnz * nrhs
    gemm = bench.ceilings.get(f"{SHORT[dt]}_gemm_TFLOPs")
    if gemm:
        bench.model(case, "spmm", "dense (model)", 2 * n * n * nrhs / gemm / 1e9,
                    family="dense", param=param,
                    note=f"2 n^2 N at the measured {SHORT[dt]} GEMM rate; "
                         f"the dense matrix would take {n * n * isz / 1e12:.1f} TB")
    bench.measure(case, "spmm", f"{bench.dev.sparse_name} csr", lambda i: mats[i] @ b[i],
                  family="cupyx", nbuf=nb, check=chk, flops=flops, param=param,
                  impl="cuSPARSE")
    if tcsr is not None:
        tb = [to_torch(torch, x) for x in b]
        bench.measure(case, "spmm", "torch csr", lambda i: tcsr[i] @ tb[i], family="torch",
                      nbuf=nb, check=chk, flops=flops, param=param, impl="cuSPARSE")
    for var, built in layouts:
        bench.measure(case, "spmm", "twell", lambda i, a=built: a[i] @ b[i], family="twell",
                      variant=var, nbuf=nb, check=chk, flops=flops, param=param,
                      nbytes=built[0].nbytes + 2 * n * nrhs * isz)


#: The storage arrays of a TwELLMatrix, in the order of its tuple constructor.
TWELL_PARTS = ("counts", "data", "indices", "overflow_indptr", "overflow_indices",
               "overflow_data")


def _sci_layout(bench, case, mats, t, rhs_list, eq_sparse):
    """CSR -> TwELL (timed) and TwELL -> CSR for tile width ``t``; None, or two layouts
    ``(variant, matrices)``: the matrices as built, and the same arrays with the tile index
    (``TwELLMatrix.index_tiles``, its build time in ``case.info``), whose products the
    consumers time as a variant of their own.

    Skipped, with the numbers, when packing would not fit in memory.
    """
    n, nb, isz = mats[0].shape[0], len(mats), mats[0].dtype.itemsize
    nnz = int(mats[0].nnz)
    csr_bytes = csr_nbytes(nnz, n, isz)
    try:
        est = twell_estimate(bench, mats[0], t, isz)
    except Exception as exc:  # noqa: BLE001 - the estimate only guards memory
        bench.notes.append(f"{case.id}: size estimate for T={t} failed: {_short_error(exc)}")
        est = {"peak_est": 0}
    free = bench.dev.free_bytes()
    case.info[f"twell_T{t}"] = est
    var = f"T={t} S=auto"
    if est["peak_est"] > 0.85 * free:
        reason = (f"tile_width={t}: {est['pairs']:.3g} (row, tile) pairs, slots~"
                  f"{est['slots_est']}; TwELL ~{est['bytes_est'] / 1e9:.1f} GB, packing peak "
                  f"~{est['peak_est'] / 1e9:.1f} GB > 85% of {free / 1e9:.1f} GB free")
        for op in ("csr->twell", "twell->csr", "spmm", "spmv"):
            for p in [f"N={r}" for r in rhs_list] if op == "spmm" else [""]:
                bench.skip(case, op, "twell", reason, family="twell", variant=var, param=p)
        return None
    row, first = bench.measure(
        case, "csr->twell", "twell",
        lambda i: twell.TwELLMatrix(mats[i], tile_width=t, slots="auto"),
        family="twell", variant=var, nbuf=nb, check=eq_sparse,
        nbytes=lambda a: csr_bytes + a.nbytes, keep=True)
    if first is None:  # not timed (filtered or failed): build it for the consumers anyway
        first = twell.TwELLMatrix(mats[0], tile_width=t, slots="auto")
    built = [first] + [twell.TwELLMatrix(c, tile_width=t, slots="auto") for c in mats[1:]]
    var = f"T={t} S=auto({first.slots})"
    if row is not None:
        row["variant"] = var
    case.info[f"twell_T{t}"].update(slots=first.slots, bytes=first.nbytes,
                                    overflow_nnz=first.overflow_nnz, occupancy=first.occupancy)
    if mats[0].dtype in (np.float32, np.float64):
        to_csr = lambda i: built[i].tocsr()  # noqa: E731
    else:
        to_csr = lambda i: built[i]._csr_arrays()  # noqa: E731
    bench.measure(case, "twell->csr", "twell", to_csr, family="twell", variant=var, nbuf=nb,
                  check=eq_sparse, nbytes=first.nbytes + csr_nbytes(nnz, n, isz, 4, 8))
    # The same storage arrays (not copied) in matrices that carry the tile index.
    indexed = [twell.TwELLMatrix(tuple(getattr(a, f) for f in TWELL_PARTS), shape=a.shape,
                                 tile_width=t) for a in built]
    case.info[f"twell_T{t}"]["index_ms"] = bench.time_only(lambda _: indexed[0].index_tiles())
    for a in indexed:
        a.index_tiles()
    case.info[f"twell_T{t}"]["index_tiles"] = int(indexed[0].tile_index.tiles.size)
    return [(var, built), (f"{var} +index", indexed)]


def run_sci_case(bench, case, base, dt, rhs_list, tile_widths, nbuf_rule):
    """Conversions, SpMM for each right-hand-side count, SpMV: every contender, same inputs."""
    xp, torch, ck = bench.xp, bench.torch, Checks(bench)
    dt = np.dtype(dt)
    acc = acc_dtype(dt)
    isz = dt.itemsize
    n = base.shape[0]
    nnz = int(base.nnz)
    csr_bytes = csr_nbytes(nnz, n, isz)
    nb = nbuf_rule(csr_bytes + n * min(rhs_list) * isz)
    # Rotating sets: the same structure, other arrays (values scaled: never zeros).
    mats = []
    for i in range(nb):
        c = base.copy()
        if i:
            c.data *= dt.type(1 + 0.25 * i)
        mats.append(c)
    a64 = mats[0].astype(np.float64) if dt != np.float64 else mats[0]
    case.info.update(n=n, nnz=nnz, density=nnz / (n * n), buffers=nb, bytes_csr=csr_bytes,
                     bytes_dense=n * n * isz)
    row_nnz = xp.diff(base.indptr)
    case.info.update(max_row_nnz=int(row_nnz.max()), mean_row_nnz=float(row_nnz.mean()))
    del row_nnz
    tcsr = None
    if torch is not None:
        try:
            tcsr = [torch.sparse_csr_tensor(to_torch(torch, c.indptr), to_torch(torch, c.indices),
                                            to_torch(torch, c.data), size=(n, n)) for c in mats]
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch CSR failed: {_short_error(exc)}")

    # -- TwELL layouts: CSR -> TwELL (timed), TwELL -> CSR
    def eq_sparse(res):
        """Exact: the canonical CSR of the result equals the input's (no dense n x n)."""
        if isinstance(res, twell.TwELLMatrix):
            indptr, indices, data = res._csr_arrays()
        else:
            indptr, indices, data = res.indptr, res.indices, res.data
        r = mats[0]
        same = (indptr.size == r.indptr.size and indices.size == r.indices.size
                and bool(xp.array_equal(indptr.astype(np.int64), r.indptr.astype(np.int64)))
                and bool(xp.array_equal(indices.astype(np.int64), r.indices.astype(np.int64))))
        if not same:
            return 1.0, 0.0
        return ck.rel_err(widen(xp, data, acc), widen(xp, r.data, acc)), 0.0

    layouts = []
    for t in tile_widths:
        try:
            layout = _sci_layout(bench, case, mats, t, rhs_list, eq_sparse)
        except Exception as exc:  # noqa: BLE001 - other tile widths may still fit
            layout = None
            bench.notes.append(f"{case.id}: TwELL T={t} failed: {_short_error(exc)}")
            bench.dev.release()
        if layout is not None:
            layouts.extend(layout)

    # -- SpMM, one right-hand-side count at a time (B and the reference freed in between)
    g = RNG(xp, 7)
    for nrhs in rhs_list:
        bench.guarded(case, "spmm", lambda r=nrhs: _sci_spmm(
            bench, case, mats, tcsr, a64, layouts, dt, r, g), param=f"N={nrhs}")
        bench.dev.release()
    bench.guarded(case, "spmv", lambda: _sci_spmv(bench, case, mats, tcsr, a64, layouts, dt, g))


def _sci_spmv(bench, case, mats, tcsr, a64, layouts, dt, g):
    """SpMV: cupyx, torch, every TwELL layout."""
    xp, torch, ck = bench.xp, bench.torch, Checks(bench)
    n, nb, isz, acc = mats[0].shape[0], len(mats), dt.itemsize, acc_dtype(dt)
    csr_bytes = csr_nbytes(mats[0].nnz, n, isz)
    v = [cast(xp, g.normal((n,)), dt) for _ in range(nb)]
    vref = a64 @ widen(xp, v[0], np.float64)
    chk = ck.close(vref if dt == np.float64 else vref.astype(acc), dt)
    bench.measure(case, "spmv", f"{bench.dev.sparse_name} csr", lambda i: mats[i] @ v[i],
                  family="cupyx", nbuf=nb, check=chk, impl="cuSPARSE",
                  nbytes=csr_bytes + 2 * n * isz)
    if tcsr is not None:
        tv = [to_torch(torch, x) for x in v]
        bench.measure(case, "spmv", "torch csr", lambda i: tcsr[i] @ tv[i], family="torch",
                      nbuf=nb, check=chk, impl="cuSPARSE")
    for var, built in layouts:
        bench.measure(case, "spmv", "twell", lambda i, a=built: a[i] @ v[i], family="twell",
                      variant=var, nbuf=nb, check=chk, nbytes=built[0].nbytes + 2 * n * isz)


# -- ceilings ------------------------------------------------------------------------------------


def _gemm_rate(bench, name, size, g):
    """TFLOP/s of a size^3 GEMM in dtype ``name`` (cupy.matmul; torch too for bf16)."""
    xp, torch = bench.xp, bench.torch
    dt = DTYPES[name]
    x = cast(xp, g.normal((size, size)), dt)
    y = cast(xp, g.normal((size, size)), dt)
    rates = {}
    try:
        rates["cupy.matmul"] = 2 * size ** 3 / bench.time_only(
            lambda _: matmul_same(xp, x, y)) / 1e9
    except Exception as exc:  # noqa: BLE001
        bench.notes.append(f"{name} GEMM ceiling (cupy) failed: {_short_error(exc)}")
    if torch is not None and name == "bf16":
        try:
            tx, ty = to_torch(torch, x), to_torch(torch, y)
            rates["torch.matmul"] = 2 * size ** 3 / bench.time_only(lambda _: tx @ ty) / 1e9
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{name} GEMM ceiling (torch) failed: {_short_error(exc)}")
    if rates:
        bench.ceilings[f"{name}_gemm_TFLOPs"] = max(rates.values())
        bench.ceilings[f"{name}_gemm"] = {"size": size, "TFLOPs": rates}


def warm_twell(bench):
    """Compile twell's kernels before anything is timed (each .cu file compiles as a whole).

    Returns the seconds it took; recorded as ``meta.compile_s``.
    """
    xp = bench.xp
    t = time.perf_counter()
    g = RNG(xp, 1)
    for name in ("bf16", "fp32"):
        try:
            x = g.normal((64, 600))
            x = cast(xp, xp.where(x > 1.0, x, np.float32(0)), DTYPES[name])
            a = twell.TwELLMatrix(x, slots=4)  # some overflow: every packing pass runs
            a.toarray()
            a._csr_arrays()
            a @ cast(xp, g.normal((600, 64)), DTYPES[name])
            a @ cast(xp, g.normal((600,)), DTYPES[name])
            if name == "fp32":
                twell.TwELLMatrix(bench.sp.csr_matrix(x), slots=4)
            bench.dev.sync()
        except Exception as exc:  # noqa: BLE001 - the measurements will report it per row
            bench.notes.append(f"warm-up of twell ({name}) failed: {_short_error(exc)}")
    return time.perf_counter() - t


def measure_ceilings(bench):
    """Copy bandwidth (bytes read + written) and GEMM rates, measured in this run."""
    xp, dev = bench.xp, bench.dev
    c = bench.ceilings
    n = (1 << 30) if dev.gpu else (1 << 25)
    try:
        a = xp.arange(n // 4, dtype=np.uint32)  # not zeros
        b = xp.empty_like(a)
        ms = bench.time_only(dev.copy_fn(a, b), reps=20)
        c.update(copy_GBps=2 * n / ms / 1e6, copy_bytes=n, copy_ms=ms)
        del a, b
    except Exception as exc:  # noqa: BLE001
        bench.notes.append(f"copy ceiling failed: {_short_error(exc)}")
    sizes = {"bf16": 8192, "fp32": 4096, "fp64": 4096} if dev.gpu else \
        {"bf16": 128, "fp32": 256, "fp64": 256}
    g = RNG(xp, 123)
    for name, size in sizes.items():
        _gemm_rate(bench, name, size, g)
    dev.release()


# -- metadata -------------------------------------------------------------------------------------


def collect_meta(bench, argv):
    args, dev, torch = bench.args, bench.dev, bench.torch
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "card": dev.card,
        "device": dev.props,
        "mode": "gpu" if dev.gpu else "cpu-dry-run",
        "host": platform.node(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "twell": twell.__version__,
        "git_commit": args.commit or _git("rev-parse", "HEAD"),
        "git_dirty": None,
        "source_digest": _source_digest(),
        "argv": argv,
        "args": vars(args),
        "timing": ("CUDA events, one pair per run, " if dev.gpu else "perf_counter, ")
        + ("synchronised after each run" if dev.sync_each else "runs queued back to back")
        + "; median",
        "env": {k: os.environ.get(k) for k in ("CUPY_TF32", "CUDA_VISIBLE_DEVICES",
                                               "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM",
                                               "NVIDIA_TF32_OVERRIDE")},
    }
    status = _git("status", "--porcelain", "--untracked-files=no")
    meta["git_dirty"] = None if status is None else bool(status)
    for mod in ("scipy", "ml_dtypes"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            meta[mod] = None
    meta.update(dev.versions())
    if torch is not None:
        meta["torch"] = torch.__version__
        meta["torch_cuda"] = torch.version.cuda
        meta["torch_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    else:
        meta["torch"] = None
        meta["torch_missing"] = bench.torch_why
    meta["reference"] = None if bench.ref is None else {
        "folder": bench.ref.folder, "build_s": round(bench.ref.build_s, 1)}
    if getattr(bench, "ref_error", None):
        meta["reference_error"] = bench.ref_error
    return meta


# -- the plan and main -------------------------------------------------------------------


def _floats(text):
    return tuple(float(v) for v in text.split(",") if v.strip())


def _ints(text):
    return tuple(int(v) for v in text.split(",") if v.strip())


def _names(text, allowed, what):
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in names if v not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad}; choose from {list(allowed)}")
    return names


def build_parser(prog="bench.py"):
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run from the repository root with PYTHONPATH=. ; see benchmarks/README.md.")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   type=lambda s: _names(s, WORKLOADS, "workload"),
                   help="comma list of %(default)s")
    p.add_argument("--ops", default=",".join(OPS), type=lambda s: _names(s, OPS, "op"),
                   help="operations to time (default all: %(default)s)")
    p.add_argument("--dtypes", type=lambda s: _names(s, DTYPES, "dtype"),
                   help="override the dtypes of every workload (bf16,fp16,fp32,fp64)")
    p.add_argument("--sparsities", type=_floats, help="ffn/hot sparsities (default 0.99,0.95,0.9)")
    p.add_argument("--sweep", type=_floats, help="sweep sparsities (default 0.90 ... 0.999)")
    p.add_argument("--rhs", type=_ints, help="sci right-hand-side counts (default 64,256,512)")
    p.add_argument("--sci-matrices", default="poisson,graph",
                   type=lambda s: _names(s, ("poisson", "graph"), "matrix"))
    p.add_argument("--graph-alpha", type=float, default=SCI_GRAPH_ALPHA,
                   help="Pareto tail index of the power-law graph's degrees (default "
                        "%(default)s; 1.5 gives heavier hubs, where slots=\"auto\" is capped)")
    p.add_argument("--sci-tile-widths", type=_ints,
                   help="tile widths tried on the sci matrices (default 65536,4096,256)")
    p.add_argument("--shape", type=_ints,
                   help=f"ffn/hot/sweep M,K,N (default {FFN_M},{FFN_K},{FFN_N}; M then scales)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="scale the token count M and the sci rows n (default 1)")
    p.add_argument("--quick", action="store_true",
                   help="a ~1-minute subset: bf16/fp32 at 99%%/90%%, few sweep points, one hot "
                        "case, sci fp32 N=64, M and n scaled by 1/4, fewer reps")
    p.add_argument("--reps", type=int, default=20, help="timed runs per contender (median)")
    p.add_argument("--min-reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3, help="warm-up runs (the first one is checked)")
    p.add_argument("--max-timing-s", type=float, default=1.5,
                   help="cap on one contender's timed loop; fewer reps for slow calls")
    p.add_argument("--buffers", type=int, default=3,
                   help="input sets rotated where one set is under 4x the L2 size")
    p.add_argument("--time-budget", type=float,
                   help="seconds after the kernels compiled; past it reps drop to --min-reps, "
                        "past 1.4x it cases are skipped (default 300, --quick 75)")
    p.add_argument("--sync-each", action="store_true",
                   help="synchronise after every timed run (anchors.py's method) instead of "
                        "queueing runs back to back")
    p.add_argument("--reference", default=os.environ.get("TWELL_REFERENCE_DIR"),
                   help="folder with the reference twell.py and .cu files "
                        "(default $TWELL_REFERENCE_DIR)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch contenders")
    p.add_argument("--commit", help="git commit to record when the checkout has no .git")
    p.add_argument("--out", help="JSON path (default $OUT/bench.json, else "
                                 "benchmarks/results/bench-<date>.json); the table goes to .txt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="run the whole control flow with NumPy at tiny sizes (no GPU needed)")
    return p


def finalize_args(args):
    q, dry = args.quick, args.cpu_dry_run
    wl_dtypes = {"ffn": ("bf16", "fp16", "fp32"), "hot": ("bf16", "fp32"),
                 "sci": ("fp32", "fp64"), "sweep": ("bf16",)}
    if q:
        wl_dtypes.update(ffn=("bf16", "fp32"), hot=("bf16",), sci=("fp32",))
    if args.dtypes:
        sci = tuple(d for d in args.dtypes if d in ("fp32", "fp64"))  # cupyx input: fp32/64
        wl_dtypes.update(ffn=args.dtypes, hot=args.dtypes, sci=sci)
    args.wl_dtypes = wl_dtypes
    args.sparsities = args.sparsities or ((0.99, 0.90) if q else FFN_SPARSITIES)
    args.sweep = args.sweep or ((0.95, 0.999) if q else SWEEP)
    args.rhs = args.rhs or ((64,) if q else SCI_RHS)
    args.sci_tile_widths = args.sci_tile_widths or ((65536,) if q else SCI_TILE_WIDTHS)
    if q and args.scale == 1.0:
        args.scale = 0.25
    if q and args.reps == 20:
        args.reps = 10
    if args.time_budget is None:
        args.time_budget = 75.0 if q else 300.0
    if args.shape and len(args.shape) != 3:
        raise SystemExit("bench.py: error: --shape takes M,K,N")
    if not args.graph_alpha > 1:
        raise SystemExit("bench.py: error: --graph-alpha must be above 1 (a finite mean "
                         f"degree); got {args.graph_alpha}")
    if dry:
        args.m, args.k, args.n = args.shape or (256, 768, 64)
        args.grid, args.graph_n, args.graph_degree = 40, 2000, 8.0
        args.rhs = (4, 8)
        args.reps, args.min_reps, args.warmup = 3, 2, 3
        args.time_budget = min(args.time_budget, 240.0)
    else:
        m, args.k, args.n = args.shape or (FFN_M, FFN_K, FFN_N)
        args.m = max(256, int(round(m * args.scale / 256)) * 256) if m >= 256 else m
        args.grid = max(8, int(round(SCI_GRID * math.sqrt(args.scale))))
        args.graph_n = max(1000, int(round(SCI_GRAPH_N * args.scale)))
        args.graph_degree = SCI_GRAPH_DEGREE
    args.min_reps = max(1, min(args.min_reps, args.reps))
    if not args.out:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        if os.environ.get("OUT"):
            args.out = os.path.join(os.environ["OUT"], "bench.json")
        elif dry:
            args.out = os.path.join(tempfile.gettempdir(), f"twell-bench-dry-run-{stamp}.json")
        else:
            args.out = str(REPO / "benchmarks" / "results" / f"bench-{stamp}.json")
    return args


class Progress:
    """A tqdm bar over the cases on a terminal; else one stderr line per case (logs, pipes)."""

    def __init__(self, total, enabled):
        self.total, self.i, self.bar = total, 0, None
        self.enabled = enabled
        self.t0 = time.perf_counter()
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="case", file=sys.stderr, mininterval=1.0,
                                dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def start(self, label):
        if self.bar is not None:
            self.bar.set_description(label)
        elif self.enabled:
            print(f"[{min(self.i + 1, self.total)}/{self.total} "
                  f"{time.perf_counter() - self.t0:5.0f} s] {label}", file=sys.stderr, flush=True)

    def op(self, text):
        if self.bar is not None:
            self.bar.set_postfix_str(text[:40], refresh=False)

    def done(self):
        self.i += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def plan_cases(args):
    """(workload, key, dtype) of every case, in run order, for the progress bar."""
    plan = []
    dts = args.wl_dtypes
    if "ffn" in args.workloads:
        plan += [("ffn", s, d) for s in args.sparsities for d in dts["ffn"]]
    if "sweep" in args.workloads:
        done = set(args.sparsities) if "ffn" in args.workloads and "bf16" in dts["ffn"] else set()
        plan += [("sweep", s, "bf16") for s in args.sweep if s not in done]
    if "hot" in args.workloads:
        plan += [("hot", s, d) for s in args.sparsities for d in dts["hot"]]
    if "sci" in args.workloads:
        plan += [("sci", mat, d) for mat in args.sci_matrices for d in dts["sci"]]
    return plan


def run(bench, plan):
    args = bench.args
    m, k, n = args.m, args.k, args.n

    def skip_all(items, why):
        for wl, key, dname in items:
            c = Case(f"{wl}-{key}-{dname}", wl, dname, str(key))
            c.info["skipped"] = why
            bench.cases.append(c)
            bench.progress.done()

    def nbuf_rule(nbytes):
        return n_buffers(bench, nbytes)

    # Group the plan by (workload, key): inputs are generated once and cast per dtype.
    groups = {}
    for item in plan:
        groups.setdefault(item[:2], []).append(item)
    for (wl, key), items in groups.items():
        if bench.stopped():
            skip_all(items, "CUDA context broken" if bench.broken else "over the time budget")
            continue
        seed = args.seed + int(1000 * float(key)) if wl != "sci" else args.seed
        try:
            if wl in ("ffn", "sweep"):
                nb = nbuf_rule(m * k * (1 - key) * 8 + k * n * 4)
                inp = ffn_inputs32(bench, m, k, n, key, nb, seed, with_x=(wl == "ffn"))
                extra = {}
            elif wl == "hot":
                nb = nbuf_rule(m * k * (1 - key) * 8 + k * n * 4)
                inp, extra = hot_inputs32(bench, m, k, n, key, nb, seed)
            else:
                inp, extra = None, {}
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{wl} {key}: input generation failed: {_short_error(exc)}")
            skip_all(items, f"input generation failed: {_short_error(exc)}")
            bench.dev.release()
            continue
        for item in items:
            if bench.stopped():
                skip_all([item], "CUDA context broken" if bench.broken else "over the time budget")
                continue
            dname = item[2]
            label = f"s={key:g}" if wl != "sci" else str(key)
            case = Case(f"{wl}-{key}-{dname}", wl, dname, label,
                        sparsity=None if wl == "sci" else float(key),
                        matrix=key if wl == "sci" else None, info=dict(extra))
            bench.progress.start(f"{wl} {dname} {label}")
            t = time.perf_counter()
            try:
                if wl == "sci":
                    if key == "poisson":
                        a, info = poisson2d(bench, args.grid, DTYPES[dname])
                    else:
                        a, info = powerlaw_graph(bench, args.graph_n, args.graph_degree,
                                                 args.graph_alpha, args.seed + 5, DTYPES[dname])
                    case.info.update(info)
                    run_sci_case(bench, case, a, DTYPES[dname], args.rhs, args.sci_tile_widths,
                                 nbuf_rule)
                    del a
                else:
                    run_activation_case(bench, case, inp, DTYPES[dname],
                                        with_gemm=(wl in ("ffn", "hot")),
                                        sweep=(wl == "sweep"))
            except Exception as exc:  # noqa: BLE001 - setup failure: keep the other cases
                case.info["error"] = _short_error(exc)
                case.info["traceback"] = traceback.format_exc(limit=6)[-2000:]
                bench.notes.append(f"{case.id}: case setup failed: {_short_error(exc)}")
                if not bench.dev.healthy():
                    bench.broken = True
            case.info["wall_s"] = round(time.perf_counter() - t, 2)
            bench.dev.release()
            bench.finish_case(case)
            bench.progress.done()
        del inp
        bench.dev.release()


def main(argv=None, prog="bench.py"):
    """Run the suite; returns 0 (missed targets included), 1 if the run aborted, 130 if
    interrupted. Exits with 2 on a usage error or when no GPU is visible."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = finalize_args(parser.parse_args(argv))

    if args.cpu_dry_run:
        dev = CPU()
    else:
        if not twell.cuda_available():
            parser.exit(2, f"{prog}: error: no CUDA GPU visible to CuPy; "
                           "use --cpu-dry-run to exercise the control flow on the CPU\n")
        dev = GPU(args.sync_each)
    torch, torch_why = load_torch(args)
    dev.torch = torch
    ref, ref_error = None, None
    if args.reference:
        if torch is None:
            ref_error = f"--reference needs PyTorch ({torch_why})"
        else:
            try:
                print(f"building the reference extension from {args.reference} ...",
                      file=sys.stderr, flush=True)
                ref = Reference(args.reference, torch)
            except Exception as exc:  # noqa: BLE001
                ref_error = _short_error(exc, 600)
    bench = Bench(args, dev, torch, ref)
    bench.torch_why, bench.ref_error = torch_why, ref_error
    bench.meta = collect_meta(bench, argv)
    if ref_error:
        bench.notes.append(f"reference kernels unavailable: {ref_error}")

    plan = plan_cases(args)
    bench.progress = Progress(len(plan), not args.no_progress)
    status = 0
    try:
        bench.progress.start("compiling twell kernels")
        bench.meta["compile_s"] = round(warm_twell(bench), 1)
        bench.budget_t0 = time.perf_counter()  # the budget trims measurements, not compiling
        bench.progress.start("ceilings")
        measure_ceilings(bench)
        bench.save()
        run(bench, plan)
    except KeyboardInterrupt:
        status = 130
        bench.notes.append("interrupted: partial results")
    except Exception as exc:  # noqa: BLE001 - a bug here must still leave the table and JSON
        status = 1
        bench.notes.append(f"run aborted: {_short_error(exc)}")
        traceback.print_exc()
    finally:
        bench.progress.close()
        bench.meta["elapsed_s"] = round(bench.elapsed(), 1)
        bench.save()
    report(bench)
    return status


def report(bench):
    """Print the header, the table, failures, the sweep fit and the targets; save as text.

    Each section is built on its own: a bug in one must not cost the others.
    """
    def section(build):
        try:
            return build()
        except Exception as exc:  # noqa: BLE001
            return [f"(this section failed: {_short_error(exc)}; the JSON has the data)"]

    lines = []
    for build in (lambda: _header_lines(bench), lambda: table_lines(bench.rows, bench.cases),
                  lambda: _problem_lines(bench), lambda: _sweep_lines(bench.rows),
                  lambda: ["", "targets (issue 3; ratios from this run):",
                           *targets_lines(targets(bench.rows))]):
        lines += section(build)
    lines += ["", f"{len(bench.rows)} rows in {bench.elapsed():.0f} s; JSON: {bench.args.out}"]
    text = "\n".join(lines)
    try:
        pathlib.Path(bench.args.out).with_suffix(".txt").write_text(text + "\n")
    except OSError as exc:
        print(f"could not write the table: {exc}", file=sys.stderr)
    print(text, flush=True)


def _header_lines(bench):
    c, meta = bench.ceilings, bench.meta
    return [
        f"twell bench: {meta['card']}; twell {meta['twell']} "
        f"(commit {(meta.get('git_commit') or '?')[:12]}, sources {meta['source_digest']}); "
        f"CuPy {meta.get('cupy', '-')}, CUDA runtime {meta.get('cuda_runtime', '-')}, "
        f"torch {meta.get('torch') or '-'}; {meta['date']}; kernels compiled in "
        f"{meta.get('compile_s', '-')} s",
        "ceilings: copy {} GB/s (read + written), bf16 GEMM {} TFLOP/s, fp32 {} TFLOP/s, fp64 {} "
        "TFLOP/s".format(*(f"{c[k]:.4g}" if c.get(k) else "-" for k in (
            "copy_GBps", "bf16_gemm_TFLOPs", "fp32_gemm_TFLOPs", "fp64_gemm_TFLOPs"))),
        f"timing: {meta['timing']} of up to {bench.args.reps} runs; x<col> = contender ms / "
        "twell ms (> 1: twell faster); ! wrong result, ~ modelled, FAIL/skip see JSON; "
        "GB/s and %copy: twell's compulsory bytes / time; conversions: peak = twell's peak "
        "memory beyond its input, pk/io = peak / (input + output bytes)",
    ]


def _problem_lines(bench):
    failed = [r for r in bench.rows if r["status"] == "failed"]
    wrong = [r for r in bench.rows if r["status"] == "wrong"]
    if not (failed or wrong or bench.notes):
        return []
    lines = ["", f"{len(failed)} failed, {len(wrong)} wrong, {len(bench.notes)} notes "
                 "(all in the JSON):"]
    for r in (failed + wrong)[:12]:
        what = r.get("error") or f"rel. error {r.get('rel_err')} > {r.get('tol')}"
        lines.append(f"  {r['status']}: {r['case']} {r['op']} {r['param']} {r['contender']} "
                     f"{r['variant']}: {what}")
    return lines + [f"  note: {x}" for x in bench.notes[:8]]


def _sweep_lines(rows):
    f = sweep_summary(rows)["fit"]
    if not f:
        return []
    return ["", f"sweep (bf16 SpMM gather kernel vs nnz): {f['ms_per_million_nnz']:.3f} ms "
                f"per million nnz + {f['intercept_ms']:.3f} ms, r2 {f['r2']:.3f}; nnz x"
                f"{f['nnz_ratio_max_min']:.0f} -> time x{f['time_ratio_max_min']:.1f}"]


if __name__ == "__main__":
    sys.exit(main())
