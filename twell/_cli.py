"""The ``twell`` command line (also ``python -m twell``).

Subcommands
-----------
demo
    Build an activation-like sparse matrix, convert it to TwELL, check it and
    time it against scipy.sparse (or cupyx on a GPU).
info, convert, show, bench
    Not implemented yet: placeholders that say which issue brings them.

Exit status: 0 on success, 1 on an error or a failed demo check, 2 on a usage
error or a command that is not implemented yet, 130 when interrupted.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

from . import _backend
from ._version import __version__

# -- demo parameters ------------------------------------------------------------

#: Matrix sizes of ``twell demo --size``: (tokens M, hidden units K). "medium"
#: is the hidden width of the paper's 1.5B model (5632); "small" is a quarter
#: of its area, so that the CPU demo stays short.
SIZES = {"small": (2048, 2816), "medium": (4096, 5632)}

#: Columns of the dense right-hand side of the demo's product.
N_RHS = 256

#: Mean share of non-zeros, about that of the paper's ReLU + L1 models.
DENSITY = 0.01

#: Spread (log-normal sigma) of the per-column firing rates around DENSITY.
HOT_SPREAD = 1.0

#: Relative error allowed between twell's and scipy's float32 products
#: (the test suite's float32 tolerance).
TOLERANCE = 1e-5

SEED = 0

# Timing repetitions: (warm-up runs, timed runs). The CPU numbers keep the
# small demo at a few seconds on a 2-core machine.
CPU_RUNS = {"small": (1, 5), "medium": (1, 3)}
GPU_RUNS = (3, 20)


# -- argument parsing -----------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# Commands planned by other issues: (name, issue, one-line help).
_STUBS = (
    ("info", 5, "statistics of a matrix file: nnz per (row, tile), overflow, bytes per format"),
    ("convert", 5, "convert between .mtx, .npz, .npy and twell's file format"),
    ("show", 5, "draw the TwELL layout of a matrix file"),
)


def build_parser():
    """The argparse parser of the ``twell`` command.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = _Parser(
        prog="twell",
        description="TwELL (Tile-wise ELLPACK) sparse matrices: demo and tools.",
    )
    parser.add_argument("--version", action="version", version=f"twell {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="convert an activation-like sparse matrix, multiply it, time it against scipy",
        description=(
            "Build a ~99%-sparse activation-like float32 matrix, convert it to TwELL "
            '(slots="auto"), print its layout statistics, check the round trip and the '
            f"product with a dense {N_RHS}-column matrix against scipy.sparse CSR, and time "
            "both. Runs on the GPU (CuPy, cupyx.scipy.sparse) when one is available, else on "
            "the CPU (NumPy, scipy.sparse)."
        ),
    )
    demo.add_argument("--cpu", action="store_true",
                      help="run on the CPU even when a GPU is available")
    demo.add_argument(
        "--size", choices=list(SIZES),
        help=", ".join(f"{k}: {m} x {n}" for k, (m, n) in SIZES.items())
        + " (default: medium on the GPU, small on the CPU)",
    )
    demo.set_defaults(func=run_demo, parser=demo)

    bench = sub.add_parser(
        "bench", help="the GPU benchmark suite (benchmarks/bench.py of a source checkout)",
        description="Run the GPU benchmark suite; arguments go to benchmarks/bench.py "
                    "(see 'python benchmarks/bench.py --help').", add_help=False)
    bench.set_defaults(func=_run_bench, accepts_extra=True, parser=bench)

    for name, issue, text in _STUBS:
        stub = sub.add_parser(name, help=f"{text} (not implemented yet)",
                              description=f"{text}. Not implemented yet (issue {issue}).")
        stub.set_defaults(func=_not_implemented, issue=issue, accepts_extra=True, parser=stub)
    return parser


def main(argv=None):
    """Run the ``twell`` command line.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit status (see the module docstring).
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        # Only the placeholders take arbitrary arguments (their future ones).
        if extra and not getattr(args, "accepts_extra", False):
            args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.extra = extra
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (``twell demo | head``): nothing to report.
        # Point stdout at /dev/null so the interpreter's final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (TypeError, ValueError, OSError, ImportError, MemoryError) as exc:
        # twell reports bad input with these; the user gets the message, not a traceback.
        _error(f"twell {args.command}: error: {exc}")
        return 1
    except KeyboardInterrupt:
        _error("twell: interrupted")
        return 130


def _error(line):
    sys.stdout.flush()  # keep stdout and stderr in order on a terminal
    print(line, file=sys.stderr)


def _run_bench(args):
    from . import _bench

    return _bench.main(args.extra)


def _not_implemented(args):
    _error(f"twell {args.command}: not implemented yet (issue {args.issue})")
    return 2


# -- the demo -------------------------------------------------------------------


def run_demo(args):
    """``twell demo``: convert, check and time an activation-like sparse matrix.

    Parameters
    ----------
    args : argparse.Namespace
        ``cpu`` (bool) and ``size`` (``"small"``, ``"medium"`` or None).

    Returns
    -------
    int
        0 when the round trip is exact and the product agrees with scipy
        within :data:`TOLERANCE`, else 1.

    Notes
    -----
    On the GPU the timings are CUDA-event medians after warm-up runs (the
    first runs also compile the kernels); on the CPU they are
    ``time.perf_counter`` medians. Packing is timed twice: with
    ``slots="auto"``, which on the GPU includes a small device-to-host copy
    to choose the slot count, and with that count given.
    """
    gpu = not args.cpu and _backend.cupy_available()
    size = args.size or ("medium" if gpu else "small")
    m, k = SIZES[size]
    dev = _GPU() if gpu else _CPU(size)
    return _demo(dev, m, k)


class _CPU:
    """NumPy + scipy.sparse, timed with ``time.perf_counter``."""

    name = "CPU"

    def __init__(self, size):
        import scipy
        import scipy.sparse

        self.xp = np
        self.csr = scipy.sparse.csr_array
        self.warmup, self.runs = CPU_RUNS[size]
        self.versions = f"NumPy {np.__version__}, SciPy {scipy.__version__}"
        self.sparse_name, self.dense_name = "scipy.sparse", "numpy.matmul"
        self.clock = "time.perf_counter"
        cpus = os.cpu_count() or 1
        self.card = f"{cpus} CPU core{'s' if cpus > 1 else ''}"

    def normal(self, shape, seed):
        return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)

    def host(self, x):
        return x

    def time(self, fn):
        for _ in range(self.warmup):  # first runs pay for page faults and lazy imports
            fn()
        times = []
        for _ in range(self.runs):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)


class _GPU:
    """CuPy + cupyx.scipy.sparse, timed with CUDA events."""

    name = "GPU"

    def __init__(self):
        import scipy

        cp = _backend.cupy_module()
        self.xp = cp
        self.csr = _backend.cupyx_sparse().csr_matrix
        self.warmup, self.runs = GPU_RUNS
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"]
        self.card = name.decode() if isinstance(name, bytes) else str(name)
        runtime = cp.cuda.runtime.runtimeGetVersion()  # e.g. 13020 for 13.2
        runtime = f"{runtime // 1000}.{runtime % 1000 // 10}"
        self.versions = (f"CuPy {cp.__version__}, CUDA runtime {runtime}, "
                         f"NumPy {np.__version__}, SciPy {scipy.__version__}")
        self.sparse_name, self.dense_name = "cupyx.scipy.sparse", "cupy.matmul"
        self.clock = "CUDA events"

    def normal(self, shape, seed):
        return self.xp.random.RandomState(seed).standard_normal(shape, dtype=np.float32)

    def host(self, x):
        return x.get()  # device-to-host copy, for printing statistics only

    def time(self, fn):
        cp = self.xp
        for _ in range(self.warmup):  # compiles kernels, fills CuPy's memory pool
            fn()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(self.runs):
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
        return statistics.median(times)


def activations(xp, normal, m, k):
    """An activation-like float32 matrix: ``relu(z + bias)`` with ~DENSITY non-zeros.

    Real ReLU activations are not uniformly sparse: some hidden units fire far
    more often than others. Each column gets its own firing probability
    (log-normal around :data:`DENSITY`), and its bias is the normal quantile
    that makes ``z + bias > 0`` that likely.
    """
    import scipy.special

    g = np.random.default_rng(SEED + 1).standard_normal(k)
    p = np.minimum(DENSITY * np.exp(HOT_SPREAD * g - HOT_SPREAD**2 / 2), 0.5)
    bias = xp.asarray(scipy.special.ndtri(p).astype(np.float32))  # explicit host->device copy
    return xp.maximum(normal((m, k), SEED) + bias, np.float32(0))


def _demo(dev, m, k):
    import twell

    xp = dev.xp
    print(f"twell {__version__} demo on the {dev.name}: {dev.card} ({dev.versions})")
    print(f"input: relu(z + bias), z ~ N(0, 1), per-column bias for ~{DENSITY:.0%} non-zeros "
          f"with hot columns; float32; seed {SEED}")

    x = activations(xp, dev.normal, m, k)
    a = twell.TwELLMatrix(x, slots="auto")
    csr = dev.csr(x)
    ell = twell.ELLMatrix(a)

    # -- layout
    tile_nnz = dev.host(a.tile_nnz()).ravel()
    nnz = a.nnz
    over_tiles = int((tile_nnz > a.slots).sum())
    q = np.percentile(tile_nnz, [50, 90, 99, 99.9]) if tile_nnz.size else np.zeros(4)
    last = k - (a.n_tiles - 1) * a.tile_width if a.n_tiles else 0
    tiles = f"{a.n_tiles} tiles per row" + (f", the last {last} wide" if last != a.tile_width
                                             else "")
    _section("layout", [
        ("shape", f"{m} x {k}"),
        ("nnz", f"{nnz}"),
        ("density", f"{nnz / max(m * k, 1):.3%}"),
        ("tile width", f"{a.tile_width} ({tiles})"),
        ('slots ("auto")', f"{a.slots} per (row, tile)"),
        ("occupancy", f"{a.occupancy:.1%} of the slots hold an entry"),
        ("overflow", f"{a.overflow_nnz} entries ({a.overflow_nnz / max(nnz, 1):.2%} of nnz) "
                     f"in {a.overflow_rows} rows; {over_tiles} of {tile_nnz.size} (row, tile) "
                     f"pairs exceed {a.slots}"),
        ("nnz per (row, tile)", f"mean {tile_nnz.mean() if tile_nnz.size else 0:.2f}, "
                                f"p50 {q[0]:g}, p90 {q[1]:g}, p99 {q[2]:g}, p99.9 {q[3]:g}, "
                                f"max {tile_nnz.max() if tile_nnz.size else 0}"),
    ])

    # -- memory
    dense_bytes = x.nbytes
    sizes = [
        ("dense", dense_bytes),
        (f"CSR ({dev.sparse_name})", csr.data.nbytes + csr.indices.nbytes + csr.indptr.nbytes),
        (f"ELL (width {ell.width})", ell.data.nbytes + ell.indices.nbytes),
        ("TwELL", a.nbytes),
    ]
    _section("memory", [(name, f"{b / 2**20:.2f} MiB", f"{b / max(dense_bytes, 1):6.1%} of dense")
                        for name, b in sizes], align="lrr")

    # -- checks
    b = dev.normal((N_RHS, k), SEED + 2).T.copy()  # C-contiguous (K, N), independent of x
    exact = bool(xp.array_equal(a.toarray(), x))
    y, y_ref = a @ b, csr @ b
    rel = float(xp.linalg.norm(y - y_ref) / max(float(xp.linalg.norm(y_ref)), 1e-30))
    ok = exact and rel <= TOLERANCE
    _section("checks", [
        ("round trip: A.toarray() == input", "exact" if exact else "MISMATCH",
         "ok" if exact else "FAILED"),
        (f"A @ B, B {k} x {N_RHS}, vs {dev.sparse_name} CSR @ B",
         f"relative error {rel:.1e} (max {TOLERANCE:.0e})",
         "ok" if rel <= TOLERANCE else "FAILED"),
    ])

    # -- timings
    slots = a.slots
    runs = [
        ('twell pack, dense -> TwELL (slots="auto")',
         lambda: twell.TwELLMatrix(x, slots="auto")),
        (f"twell pack, dense -> TwELL (slots={slots})",
         lambda: twell.TwELLMatrix(x, slots=slots)),
        (f"twell SpMM, A @ B (N = {N_RHS})", lambda: a @ b),
        (f"{dev.sparse_name} CSR from dense", lambda: dev.csr(x)),
        (f"{dev.sparse_name} CSR @ B", lambda: csr @ b),
        (f"dense {dev.dense_name}(x, B)", lambda: xp.matmul(x, b)),
    ]
    print(f"\ntimings (median of {dev.runs} runs after {dev.warmup} warm-up, {dev.clock})",
          flush=True)
    _table([(name, f"{dev.time(fn) * 1e3:.3f} ms") for name, fn in runs], align="lr")
    if dev.name == "CPU":
        print("  (the NumPy backend is the readable reference implementation, not a tuned one)")

    if not ok:
        _error("twell demo: error: a check failed (see 'checks' above)")
        return 1
    return 0


def _section(title, rows, align=None):
    print(f"\n{title}")
    _table(rows, align)


def _table(rows, align=None):
    """Print rows of strings as aligned columns ("l"/"r" per column), indented by two."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    align = align or "l" * len(widths)
    for r in rows:
        cells = [c.rjust(w) if al == "r" else c.ljust(w)
                 for c, w, al in zip(r, widths, align, strict=True)]
        print("  " + "  ".join(cells).rstrip(), flush=True)
