"""The ``twell`` command line (also ``python -m twell``).

Subcommands
-----------
demo
    Build an activation-like sparse matrix, convert it to TwELL, check it and
    time it against scipy.sparse (or cupyx on a GPU).
info FILE
    Shape, dtype, nnz, the distribution of non-zeros per (row, tile), the
    overflow for a tile width and slot count, bytes per format and the
    recommended slot count.
convert IN OUT
    Between Matrix Market (.mtx), scipy.sparse (.npz), dense NumPy (.npy)
    and twell files (.twell); formats from the names (see
    :mod:`twell._files`) or ``--from``/``--to``.
show FILE -o PICTURE
    The TwELL layout picture (``twell.plot.layout``, matplotlib).

Exit status: 0 on success, 1 on an error (missing or invalid file, unknown
format) or a failed demo check, 2 on a usage error (unknown option, bad
option value), 130 when interrupted. Errors are one line on stderr.
"""

import argparse
import itertools
import os
import statistics
import sys
import time

import numpy as np

from . import _arrays, _files, _layout
from ._dtypes import SUPPORTED_DTYPES
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


def _int_option(low, high=None):
    """argparse type: an int in [low, high]; a bad value is a usage error (exit 2)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int; got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}; got {value}")
        return value
    return parse


def _slots_option(text):
    """argparse type of --slots: "auto" or an int in [1, 2**31 - 1] (at most the tile width,
    checked once that is known: :class:`_UsageError`)."""
    if text == "auto":
        return text
    try:
        return _int_option(1, _layout.MAX_TILE_WIDTH)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f'{exc} (or "auto")') from None


class _UsageError(Exception):
    """A bad option value found after parsing (exit status 2, like argparse's own)."""


def _check_slots(slots, tile_width, source):
    """A slot count above the tile width is a usage error; ``source`` says where the width
    comes from (None: the --tile-width option)."""
    limit = _layout.MAX_TILE_WIDTH if tile_width == "auto" else tile_width
    if isinstance(slots, int) and slots > limit:
        where = f" ({source})" if source else ""
        raise _UsageError(f"argument --slots: must be at most the tile width {limit}{where}; "
                          f"got {slots}")


def _layout_options(p, what):
    p.add_argument("--tile-width", type=_int_option(1, _layout.MAX_TILE_WIDTH), metavar="T",
                   help=f"columns per tile {what} (default: a twell file's own, else "
                        '"auto": 256 where rows average an entry or more per 256 columns, '
                        "else one tile as wide as the row)")
    p.add_argument("--slots", type=_slots_option, metavar="S",
                   help='slots per (row, tile), an int from 1 to the tile width or "auto" '
                        '(default: a twell file\'s own, else "auto": the fewest that leave at '
                        "most 1%% of the non-zeros in the overflow, but at most 4 times the "
                        "count that 99%% of the non-empty (row, tile) pairs fit in)")


def _from_option(p):
    p.add_argument("--from", dest="from_format", choices=list(_files.FORMATS),
                   help="input format (default: from the file name; .npz and .twell files are "
                        "recognised by their content)")


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

    info = sub.add_parser(
        "info", help="statistics of a matrix file: nnz per (row, tile), overflow, bytes",
        description="Print the shape, dtype, nnz and density of a matrix file, the "
                    "distribution of its non-zeros per (row, tile) with a text histogram, the "
                    "overflow for the tile width and slot count, the bytes of dense, CSR, ELL "
                    "and TwELL storage, and the recommended slot count (twell.auto_slots).")
    info.add_argument("file", metavar="FILE", help="a .mtx, .npz, .npy or .twell file")
    _layout_options(info, "to count in")
    _from_option(info)
    info.set_defaults(func=run_info, parser=info)

    convert = sub.add_parser(
        "convert", help="convert between .mtx, .npz (scipy), .npy (dense) and .twell files",
        description="Convert a matrix file. Formats come from the names: .mtx Matrix Market, "
                    ".npy dense NumPy, .npz scipy.sparse (when reading: a twell file if it has "
                    "the field 'twell_format'), .twell or .twell.npz twell's own format "
                    "(twell.save). float16/bfloat16 values go to .mtx and .npz (and bfloat16 to "
                    ".npy) as float32, exactly; Matrix Market is read as float64.")
    convert.add_argument("input", metavar="IN", help="the matrix file to read")
    convert.add_argument("output", metavar="OUT", help="the file to write (replaced if present)")
    _layout_options(convert, "of a twell output")
    convert.add_argument("--dtype", choices=[str(d) for d in SUPPORTED_DTYPES],
                         help="cast the values (default: keep them; Matrix Market gives float64)")
    _from_option(convert)
    convert.add_argument("--to", dest="to_format", choices=list(_files.FORMATS),
                         help="output format (default: from the file name)")
    convert.set_defaults(func=run_convert, parser=convert, check=_check_convert)

    show = sub.add_parser(
        "show", help="draw the TwELL layout of a matrix file (needs matplotlib)",
        description="Draw the TwELL layout of a matrix file (twell.plot.layout) into a "
                    "picture; the format comes from its extension (.png, .svg, .pdf, ...).")
    show.add_argument("file", metavar="FILE", help="a .mtx, .npz, .npy or .twell file")
    show.add_argument("-o", "--output", required=True, metavar="PICTURE",
                      help="the picture to write (replaced if present)")
    _layout_options(show, "to draw")
    show.add_argument("--rows", type=_int_option(1), metavar="R",
                      help=f"draw the first R rows (default: all, at most {SHOW_ROWS})")
    _from_option(show)
    show.set_defaults(func=run_show, parser=show)
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
        if getattr(args, "tile_width", None) is not None:
            try:
                _check_slots(args.slots, args.tile_width, None)
            except _UsageError as exc:
                args.parser.error(str(exc))
        if getattr(args, "check", None):
            args.check(args)  # checks across options: usage errors too
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        return args.func(args)
    except _UsageError as exc:  # an option checked against the file (the tile width)
        try:
            args.parser.error(str(exc))
        except SystemExit as done:
            return done.code
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


# -- info, convert, show ---------------------------------------------------------

#: Rows that ``twell show`` draws unless told (more make an unreadable picture).
SHOW_ROWS = 64

#: Columns of the widest bar of the ``twell info`` histogram.
BAR_WIDTH = 40


def _load(args):
    """Read FILE and build the TwELL matrix of the options: (source, TwELLMatrix, format)."""
    src, fmt = _files.read(args.file, args.from_format)
    return src, _as_twell(args.file, src, args.tile_width, args.slots), fmt


def _as_twell(path, src, tile_width, slots, dtype=None):
    """TwELL with the given layout; a twell file keeps its own unless told otherwise.

    ``tile_width``/``slots`` None: not given on the command line. Errors name the file
    ``path`` and the options, not the constructor's parameters.
    """
    import twell
    from twell import _layout

    is_twell = isinstance(src, twell.TwELLMatrix)
    if tile_width is None:
        tile_width = src.tile_width if is_twell else "auto"
        _check_slots(slots, tile_width, f"{path}'s" if is_twell else "the default")
    m, k = src.shape
    # "auto" takes tiles of at most MAX_TILE_WIDTH columns: the fewest tiles it can choose.
    width = _layout.MAX_TILE_WIDTH if tile_width == "auto" else tile_width
    nt = _layout.n_tiles(k, width)
    least = slots if isinstance(slots, int) else 1
    if m * nt * least > _layout.MAX_STORED_SLOTS:
        fewer = " or fewer --slots" if least > 1 else ""
        raise ValueError(f"{path}: a {m} x {k} matrix at tile width {width} takes {m} * "
                         f"{nt} * {least} = {m * nt * least} stored slots; twell holds at most "
                         f"{_layout.MAX_STORED_SLOTS}: choose a wider --tile-width{fewer}")
    if slots == "auto" and is_twell and tile_width == src.tile_width:
        # The constructor keeps a TwELL input's slots under "auto"; --slots auto asks anew.
        slots = twell.auto_slots(np.bincount(src.tile_nnz().ravel(), minlength=1), tile_width,
                                 shape=src.shape, itemsize=src.dtype.itemsize)
    try:
        return twell.TwELLMatrix(src, tile_width=tile_width, slots=slots or "auto",
                                 dtype=dtype)
    except (TypeError, ValueError) as exc:
        # What the file's checks leave: a limit reached by the slots "auto" chooses.
        raise ValueError(f"{path}: cannot store the matrix as TwELL: {exc}") from None


def run_info(args):
    """``twell info FILE``: statistics that guide the choice of tile width and slots."""
    import twell

    src, a, fmt = _load(args)
    m, k = a.shape
    nnz = a.nnz
    tile_nnz = a.tile_nnz().ravel()
    hist = np.bincount(tile_nnz, minlength=1)
    recommended = twell.auto_slots(hist, a.tile_width, shape=a.shape,
                                   itemsize=a.dtype.itemsize)
    kept = (isinstance(src, twell.TwELLMatrix) and args.slots is None
            and a.tile_width == src.tile_width)
    slots_how = "given" if args.slots not in (None, "auto") else "the file's" if kept else '"auto"'

    stored = ""
    if isinstance(src, (twell.TwELLMatrix, twell.ELLMatrix)):
        stored = (f" ({type(src).__name__}"
                  + (f", tile width {src.tile_width}, slots {src.slots}"
                     if isinstance(src, twell.TwELLMatrix) else f", width {src.width}") + ")")
    last = k - (a.n_tiles - 1) * a.tile_width if a.n_tiles else 0
    tiles = f"{a.n_tiles} tile{'s' if a.n_tiles != 1 else ''} per row" + (
        f", the last {last} wide" if a.n_tiles and last != a.tile_width else "")
    over_pairs = int((tile_nnz > a.slots).sum())
    _table([
        ("file", f"{args.file}: {_files.FORMATS[fmt]}{stored}"),
        ("shape", f"{m} x {k}"),
        ("dtype", str(a.dtype)),
        ("nnz", f"{nnz}"),
        ("density", f"{nnz / max(m * k, 1):.3%}"),
        ("tile width", f"{a.tile_width} ({tiles})"),
        ("slots", f"{a.slots} ({slots_how})"),
        ("occupancy", f"{a.occupancy:.1%} of the slots hold an entry" if a.data.size
                      else "no slots (no rows or no columns)"),
        ("overflow", f"{a.overflow_nnz} entries ({a.overflow_nnz / max(nnz, 1):.2%} of nnz) in "
                     f"{a.overflow_rows} rows; {over_pairs} of {tile_nnz.size} (row, tile) pairs "
                     f"hold more than {a.slots}"),
        ("recommended slots", f"{recommended} (twell.auto_slots: the fewest that leave at most "
                              f"{twell.AUTO_OVERFLOW_FRACTION:.0%} of the non-zeros in the "
                              f"overflow, at most {twell.AUTO_MAX_FACTOR} times the count that "
                              "99% of the non-empty (row, tile) pairs fit in, and fewer while "
                              "the storage would take more than twice the bytes of CSR)"),
    ], indent="")

    print("\nnon-zeros per (row, tile)")
    if tile_nnz.size:
        # Nearest-rank percentiles: p90 = 9 means that 90% of the pairs hold at most 9.
        q = np.percentile(tile_nnz, [50, 90, 99, 99.9], method="inverted_cdf")
        print(f"  min {tile_nnz.min()}, p50 {q[0]}, p90 {q[1]}, p99 {q[2]}, p99.9 {q[3]}, "
              f"max {tile_nnz.max()}, mean {tile_nnz.mean():.3g}")
        _table([("nnz", "pairs", "share", "", "")] + _histogram(hist, a.slots), align="rrrll")
    else:
        print("  no (row, tile) pairs: the matrix has no rows or no columns")

    itemsize = a.dtype.itemsize
    width = int(tile_nnz.reshape(m, -1).sum(axis=1).max()) if tile_nnz.size else 0
    dense = m * k * itemsize
    sizes = [
        (f"dense ({a.dtype})", dense),
        ("CSR (int32 indices and row pointer)", nnz * (itemsize + 4) + (m + 1) * 4),
        (f"ELL (width {width}, int32 indices)", m * width * (itemsize + 4)),
        (f"TwELL (slots {a.slots}, overflow included)", a.nbytes),
    ]
    print("\nbytes")
    _table([(name, _bytes(b), f"{b / dense:.1%} of dense" if dense else "")
            for name, b in sizes], align="lrr")
    return 0


def _histogram(hist, slots):
    """Rows (nnz range, pairs, share, bar, "overflow" or "") of the per-(row, tile) histogram.

    One row per count up to 16; beyond, power-of-two ranges, split at the
    slot count so that every row is either within the slots or overflowing.
    """
    top = len(hist) - 1
    if top <= 16:
        edges = list(range(top + 2))
    else:
        edges = sorted({0, 1, slots + 1, top + 1} | {2**i for i in range(1, top.bit_length())})
        edges = [e for e in edges if e <= top + 1]
    total = int(hist.sum())
    groups = [(lo, hi - 1, int(hist[lo:hi].sum())) for lo, hi in itertools.pairwise(edges)]
    most = max(n for _, _, n in groups)
    rows = []
    for lo, hi, n in groups:
        bar = "#" * (round(BAR_WIDTH * n / most) if n else 0) or ("#" if n else "")
        label = f"{lo}" if lo == hi else f"{lo}-{hi}"
        rows.append((label, f"{n}", f"{n / total:.1%}", bar, "overflow" if lo > slots else ""))
    return rows


def _bytes(n):
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _check_convert(args):
    fmt = args.to_format or _files.format_from_name(args.output, writing=True)
    if fmt not in (None, "twell") and (args.tile_width is not None or args.slots is not None):
        args.parser.error(f"--tile-width and --slots apply to twell output only; {args.output} "
                          f"is written as {_files.FORMATS[fmt]}")


def run_convert(args):
    """``twell convert IN OUT``: between Matrix Market, scipy .npz, .npy and twell files."""
    to = _files.output_format(args.output, args.to_format)  # before the work: a name error
    src, fmt = _files.read(args.input, args.from_format)
    a = _as_twell(args.input, src, args.tile_width, args.slots, args.dtype)
    written = _files.write(args.output, to, a)
    m, k = a.shape
    line = (f"{args.input} ({_files.FORMATS[fmt]}) -> {args.output} ({_files.FORMATS[to]}): "
            f"{m} x {k}, {written}, nnz {a.nnz}")
    if to == "twell":
        line += (f", tile width {a.tile_width}, slots {a.slots}, overflow {a.overflow_nnz} "
                 "entries")
    if written != a.dtype:
        line += f" ({a.dtype} values written as {written}, exactly)"
    print(line)
    return 0


def run_show(args):
    """``twell show FILE -o PICTURE``: the layout picture, through ``twell.plot.layout``."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("twell show needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")  # files only, no display; before pyplot is imported
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    kinds = FigureCanvasAgg.get_supported_filetypes()
    ext = os.path.splitext(args.output)[1].lower().lstrip(".")
    if ext not in kinds:
        raise ValueError(f"{args.output}: the picture format comes from the extension, one of "
                         f"{', '.join('.' + e for e in sorted(kinds))}; got "
                         f"{'.' + ext if ext else 'none'}")
    folder = os.path.dirname(args.output) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{args.output}: the folder {folder!r} does not exist")
    import matplotlib.pyplot as plt

    from . import plot

    _, a, _ = _load(args)
    if 0 in a.shape:
        raise ValueError(f"{args.file}: the matrix is {a.shape[0]} x {a.shape[1]}: nothing to "
                         "draw")
    rows = min(a.shape[0], args.rows or SHOW_ROWS)
    ax = plot.layout(a, max_rows=rows)  # its title says when rows were left out
    fig = ax.figure
    try:
        fig.savefig(args.output)
    finally:
        plt.close(fig)
    m, k = a.shape
    shown = f"the first {rows} of {m} rows" if rows < m else f"all {m} rows"
    print(f"wrote {args.output}: TwELL layout of {args.file} ({m} x {k}, tile width "
          f"{a.tile_width}, slots {a.slots}), {shown}")
    return 0


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
    gpu = not args.cpu and _arrays.cupy_available()
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

        cp = _arrays.cupy_module()
        self.xp = cp
        self.csr = _arrays.cupyx_sparse().csr_matrix
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
        print("  (on the host a matrix keeps canonical CSR beside its TwELL storage and its"
              " products run scipy.sparse's compiled kernels)")

    if not ok:
        _error("twell demo: error: a check failed (see 'checks' above)")
        return 1
    return 0


def _section(title, rows, align=None):
    print(f"\n{title}")
    _table(rows, align)


def _table(rows, align=None, indent="  "):
    """Print rows of strings as aligned columns ("l"/"r" per column), indented."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    align = align or "l" * len(widths)
    for r in rows:
        cells = [c.rjust(w) if al == "r" else c.ljust(w)
                 for c, w, al in zip(r, widths, align, strict=True)]
        print(indent + "  ".join(cells).rstrip(), flush=True)
