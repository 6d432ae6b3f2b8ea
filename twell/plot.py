"""Pictures of the TwELL format, drawn with matplotlib.

matplotlib is an optional extra (``pip install "twell[plot]"``); it is
imported when a function here is first called, not when ``twell`` is.

Every function returns the matplotlib object it drew on (an ``Axes``, or a
``Figure`` for the multi-panel :func:`formats_side_by_side`) and never calls
``show()``: display or save the figure yourself. Given ``ax=None`` a function
makes a new figure through ``matplotlib.pyplot``, sized for its content.
Matrices and arrays may live on the host (NumPy) or on the GPU (CuPy); what
is drawn is copied to the host first.

Functions
---------
layout
    A small matrix's TwELL layout: tiles, the slots each (row, tile) uses
    against its capacity, overflow entries.
occupancy
    Heat map of the non-zeros of every (row, tile), overflow included.
tile_histogram
    Histogram of the non-zeros per (row, tile) against the slot count.
format_comparison
    Bytes of a matrix as dense, CSR, row-wise ELL and TwELL, and their padding.
formats_side_by_side
    One small matrix drawn as dense, CSR arrays, ELL arrays and TwELL arrays.
packed_words
    The reference packed words of one (row, tile), in hexadecimal.
"""

import numpy as np

from . import _algorithms, _arrays, _layout
from ._arguments import check_compression, check_slots, check_tile_width, operator_index
from ._dtypes import bfloat16

__all__ = [
    "format_comparison",
    "formats_side_by_side",
    "layout",
    "occupancy",
    "packed_words",
    "tile_histogram",
]

# One palette for every picture, so that the same thing has the same colour throughout the
# documentation.
SLOT_COLOR = "#1f77b4"       # an entry held in a slot
OVERFLOW_COLOR = "#d62728"   # an entry in the overflow part
FREE_COLOR = "#ffffff"       # an unused slot
PADDING_COLOR = "#d9d9d9"    # stored padding (ELL/TwELL) or zeros (dense)
STRUCTURE_COLOR = "#ff9f1c"  # counts, indices, row pointers (bars)
STRUCTURE_TINT = "#ffe3b8"   # counts and row pointers (table cells)
COUNT_COLOR = "#ffd166"      # the count word of a packed tile
BAND_COLORS = ("#ffffff", "#f0f0f0")  # alternate column tiles
OVERFLOW_CELL_COLOR = "#fbe0de"       # background of a (row, tile) that overflows
# Light tints that tell the tiles apart in formats_side_by_side.
TILE_TINTS = ("#cfe3f6", "#d4efd0", "#fde9c8", "#e6dcf3", "#f9d7e7", "#d6f0ee")

#: Largest matrix formats_side_by_side draws (it writes every entry out).
SIDE_BY_SIDE_MAX_SHAPE = (16, 32)

#: Rows layout draws by default (the first ones).
LAYOUT_MAX_ROWS = 64


# -- shared helpers ------------------------------------------------------------------------


def _pyplot():
    """``matplotlib.pyplot``, or an ImportError that says how to get it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "twell.plot needs matplotlib (>= 3.7); install it with "
            "pip install \"twell[plot]\" (or pip install matplotlib)"
        ) from exc
    return plt


def _new_axes(ax, figsize):
    """``ax`` itself, or the Axes of a new pyplot figure of ``figsize`` inches."""
    if ax is not None:
        return ax
    plt = _pyplot()
    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _twell_on_host(a, name="A"):
    """A host (NumPy-backed) TwELLMatrix; TypeError for anything else."""
    from ._twell import TwELLMatrix

    if not isinstance(a, TwELLMatrix):
        raise TypeError(f"{name} must be a TwELLMatrix; got {type(a).__name__}")
    return a.get()


def _input_on_host(x):
    """Anything TwELLMatrix accepts, copied to the host when it lives on the GPU."""
    from ._ell import ELLMatrix
    from ._twell import TwELLMatrix

    on_device = _arrays.is_cupy_array(x) or _arrays.is_cupyx_sparse(x)
    if on_device or isinstance(x, (TwELLMatrix, ELLMatrix)):
        return x.get()
    return x


def _coo(a):
    """Host ``(rows, cols, vals)`` of a TwELLMatrix, sorted by (row, column)."""
    return _algorithms.to_coo(a._parts, a.shape, a.tile_width)


def _overflow_coo(a):
    """Host ``(rows, cols)`` of the overflow entries of a TwELLMatrix."""
    rows = _algorithms.expand_indptr(a.overflow_indptr, a.overflow_indices.size)
    return rows, a.overflow_indices.astype(np.int64)


def _fmt_value(v):
    """A value for a table cell: at most 3 significant digits."""
    return f"{float(v):.3g}"


def _fmt_bytes(n):
    """Bytes in a readable unit (B, kB, MB, GB; powers of 1000)."""
    for unit in ("B", "kB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} GB"


# -- layout ----------------------------------------------------------------------------------


def layout(A, ax=None, *, max_rows=LAYOUT_MAX_ROWS, gauges=None):
    """Draw the TwELL layout of a (small) matrix.

    The columns are drawn as bands, one per tile. Every entry is a marker at
    its (column, row): blue when it sits in a slot, red when it went to the
    overflow part. Under the entries of each (row, tile), a gauge of
    ``slots`` small boxes shows the capacity: filled boxes are used slots,
    white ones are free. A (row, tile) with more non-zeros than slots has a
    red background; its first ``slots`` entries by column fill the slots and
    the rest are the red markers.

    Parameters
    ----------
    A : TwELLMatrix
        On the host or on the GPU (copied to the host).
    ax : matplotlib.axes.Axes, optional
        Where to draw; default: a new figure.
    max_rows : int, optional
        Draw at most the first ``max_rows`` rows (default 64); the title
        says when rows were left out.
    gauges : bool, optional
        Draw the slot gauges. Default: when they would be at most 5000 boxes.

    Returns
    -------
    matplotlib.axes.Axes
        The slot entries and the overflow entries are two scatter
        collections, with the labels ``"slot entries"`` and ``"overflow
        entries"`` (one point per drawn entry).

    Raises
    ------
    TypeError
        When ``A`` is not a TwELLMatrix.
    ValueError
        When ``max_rows`` is not positive.

    See Also
    --------
    occupancy : the same counts for a large matrix, as a heat map.
    formats_side_by_side : the storage arrays themselves.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import twell, twell.plot
    >>> x = np.zeros((3, 16))
    >>> x[0, [1, 2]] = 1; x[1, [8, 9, 10, 12]] = 2; x[2, 15] = 3
    >>> a = twell.TwELLMatrix(x, tile_width=8, slots=2)
    >>> ax = twell.plot.layout(a)
    >>> [(c.get_label(), len(c.get_offsets())) for c in ax.collections
    ...  if not c.get_label().startswith("_")]
    [('slot entries', 5), ('overflow entries', 2)]
    >>> import matplotlib.pyplot as plt; plt.close(ax.figure)
    """
    _pyplot()  # first, for a clear ImportError without matplotlib
    from matplotlib.collections import PatchCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    a = _twell_on_host(A)
    max_rows = operator_index(max_rows, "max_rows")
    if max_rows < 1:
        raise ValueError(f"max_rows must be positive; got max_rows={max_rows}")
    m, k = a.shape
    t, s, nt = a.tile_width, a.slots, a.n_tiles
    mr = min(m, max_rows)
    ax = _new_axes(ax, (min(max(4.5 + 0.12 * k, 7.0), 9.5), min(max(1.6 + 0.4 * mr, 2.6), 9.0)))

    tile_nnz = a.tile_nnz()[:mr]
    counts = a.counts[:mr]
    starts = np.arange(nt) * t
    extents = np.minimum(t, k - starts)

    # Tile bands, and a red background where a (row, tile) overflows.
    bands = [Rectangle((starts[j] - 0.5, -0.5), extents[j], mr, facecolor=BAND_COLORS[j % 2],
                       edgecolor="none") for j in range(nt)]
    over_r, over_t = np.nonzero(tile_nnz > s)
    bands += [Rectangle((starts[j] - 0.5, r - 0.5), extents[j], 1,
                        facecolor=OVERFLOW_CELL_COLOR, edgecolor="none")
              for r, j in zip(over_r, over_t, strict=True)]
    ax.add_collection(PatchCollection(bands, match_original=True, zorder=0, label="_bands"))
    for j in range(1, nt):
        ax.axvline(starts[j] - 0.5, color="0.35", linewidth=1.0, zorder=1)

    # Slot gauges: `slots` boxes spread over the width of each (row, tile).
    if gauges is None:
        gauges = mr * nt * s <= 5000
    if gauges and mr and nt:
        r, j, q = np.meshgrid(np.arange(mr), np.arange(nt), np.arange(s), indexing="ij")
        width = extents[j] / s
        x0 = starts[j] - 0.5 + q * width
        used = q < counts[r, j]
        boxes = [Rectangle((bx + 0.08 * bw, by + 0.16), 0.84 * bw, 0.2)
                 for bx, bw, by in zip(x0.ravel(), width.ravel(), r.ravel(), strict=True)]
        colors = np.where(used.ravel(), SLOT_COLOR, FREE_COLOR)
        ax.add_collection(PatchCollection(boxes, facecolors=colors, edgecolors="0.45",
                                          linewidths=0.5, zorder=2, label="_gauges"))

    # Entries: markers sized to a column (or a row, whichever is smaller) on screen.
    rows, cols, _ = _coo(a)
    orow, ocol = _overflow_coo(a)
    keep, okeep = rows < mr, orow < mr
    in_overflow = np.zeros(rows.size, dtype=bool)
    if ocol.size:
        in_overflow = np.isin(rows * k + cols, orow * k + ocol)
    fig = ax.figure
    box = ax.get_position()
    cell_pt = min(box.width * fig.get_figwidth() / max(k, 1),
                  box.height * fig.get_figheight() / max(mr, 1)) * 72
    size = float(np.clip((0.7 * cell_pt) ** 2, 4, 120))
    sel = keep & ~in_overflow
    ax.scatter(cols[sel], rows[sel] - 0.15, s=size, marker="s", color=SLOT_COLOR,
               label="slot entries", zorder=3)
    ax.scatter(ocol[okeep], orow[okeep] - 0.15, s=size * 1.2, marker="X",
               color=OVERFLOW_COLOR, label="overflow entries", zorder=3)

    ax.set_xlim(-0.5, k - 0.5)
    ax.set_ylim(mr - 0.5, -0.5)
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    if mr <= 32:
        ax.set_yticks(np.arange(mr))
    top = ax.secondary_xaxis("top")
    step = max(1, nt // 16)
    top.set_xticks(starts[::step] + (extents[::step] - 1) / 2,
                   labels=[f"tile {j}" for j in range(0, nt, step)])
    top.tick_params(length=0)
    shown = "" if mr == m else f" (first {mr} of {m} rows)"
    entries = "entry" if a.overflow_nnz == 1 else "entries"
    ax.set_title(f"TwELL layout{shown}: {m}x{k}, tile_width={t}, slots={s}; "
                 f"{a.overflow_nnz} overflow {entries}", fontsize="medium")
    handles = [
        Line2D([], [], marker="s", linestyle="none", color=SLOT_COLOR, label="entry in a slot"),
        Line2D([], [], marker="X", linestyle="none", color=OVERFLOW_COLOR,
               label="entry in the overflow"),
        Patch(facecolor=SLOT_COLOR, edgecolor="0.45", label="used slot"),
        Patch(facecolor=FREE_COLOR, edgecolor="0.45", label="free slot"),
        Patch(facecolor=OVERFLOW_CELL_COLOR, label="(row, tile) over capacity"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
              frameon=False)
    return ax


# -- occupancy and histogram --------------------------------------------------------------


def occupancy(A, ax=None, *, cmap="viridis"):
    """Heat map of the non-zeros of every (row, tile), overflow included.

    One pixel per (row, tile), coloured by ``A.tile_nnz()``. A red line on
    the colour bar marks ``A.slots``: pairs coloured above it overflow. When
    there are at most 2000 of them, each is also outlined in red.

    Parameters
    ----------
    A : TwELLMatrix
        On the host or on the GPU (copied to the host).
    ax : matplotlib.axes.Axes, optional
        Where to draw; default: a new figure.
    cmap : str or matplotlib.colors.Colormap, optional
        Colour map of the counts.

    Returns
    -------
    matplotlib.axes.Axes
        Its image is ``ax.images[0]`` (data: ``A.tile_nnz()``); the colour
        bar is ``ax.images[0].colorbar``.

    See Also
    --------
    tile_histogram : the distribution of the same counts.
    TwELLMatrix.tile_nnz : the counts.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import twell, twell.plot
    >>> x = (np.random.default_rng(0).random((64, 1024)) < 0.02).astype(np.float32)
    >>> ax = twell.plot.occupancy(twell.TwELLMatrix(x, slots=4))
    >>> ax.images[0].get_array().shape
    (64, 4)
    >>> import matplotlib.pyplot as plt; plt.close(ax.figure)
    """
    _pyplot()  # first, for a clear ImportError without matplotlib
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    a = _twell_on_host(A)
    m, k = a.shape
    tile_nnz = a.tile_nnz()
    ax = _new_axes(ax, (6.4, 4.8))
    vmax = max(int(tile_nnz.max(initial=0)), a.slots, 1)
    im = ax.imshow(tile_nnz, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0,
                   vmax=vmax)
    cbar = ax.figure.colorbar(im, ax=ax,
                              label=f"non-zeros per (row, tile); red line: slots = {a.slots}")
    cbar.ax.axhline(a.slots, color=OVERFLOW_COLOR, linewidth=2)
    over_r, over_t = np.nonzero(tile_nnz > a.slots)
    if 0 < over_r.size <= 2000:
        ax.add_collection(PatchCollection(
            [Rectangle((j - 0.5, r - 0.5), 1, 1) for r, j in zip(over_r, over_t, strict=True)],
            facecolor="none", edgecolor=OVERFLOW_COLOR, linewidth=1.0, label="_overflowing"))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"tile ({a.tile_width} columns each)")
    ax.set_ylabel("row")
    share = a.overflow_nnz / a.nnz if a.nnz else 0.0
    ax.set_title(f"non-zeros per (row, tile) of a {m}x{k} matrix: mean "
                 f"{tile_nnz.mean() if tile_nnz.size else 0:.2f}, max "
                 f"{int(tile_nnz.max(initial=0))}\n{over_r.size} pairs over slots={a.slots}, "
                 f"{share:.1%} of the non-zeros in the overflow", fontsize="medium")
    return ax


def tile_histogram(A, ax=None, *, log=False):
    """Histogram of the non-zeros per (row, tile), against the slot count.

    Bar ``c`` is the number of (row, tile) pairs holding ``c`` non-zeros
    (overflow included). Bars right of the dashed line at ``slots + 0.5``
    are pairs that overflow; they are red. This is the distribution that
    ``slots="auto"`` reads (see :func:`twell.auto_slots`).

    Parameters
    ----------
    A : TwELLMatrix
        On the host or on the GPU (copied to the host).
    ax : matplotlib.axes.Axes, optional
        Where to draw; default: a new figure.
    log : bool, optional
        Logarithmic count axis (useful when almost every tile is empty).

    Returns
    -------
    matplotlib.axes.Axes
        Its bars are ``ax.patches`` (one per count from 0 to the largest);
        the slot line is ``ax.lines[0]``.

    See Also
    --------
    occupancy : where in the matrix the full tiles are.
    twell.auto_slots : the slot count chosen from this histogram.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import twell, twell.plot
    >>> x = np.zeros((2, 512)); x[0, :5] = 1; x[1, 300] = 1
    >>> ax = twell.plot.tile_histogram(twell.TwELLMatrix(x, slots=3))
    >>> [int(p.get_height()) for p in ax.patches]   # pairs with 0, 1, ..., 5 non-zeros
    [2, 1, 0, 0, 0, 1]
    >>> import matplotlib.pyplot as plt; plt.close(ax.figure)
    """
    _pyplot()  # first, for a clear ImportError without matplotlib
    a = _twell_on_host(A)
    tile_nnz = a.tile_nnz().ravel()
    hist = np.bincount(tile_nnz, minlength=1)
    c = np.arange(hist.size)
    ax = _new_axes(ax, (6.4, 3.6))
    colors = np.where(c > a.slots, OVERFLOW_COLOR, SLOT_COLOR)
    ax.bar(c, hist, width=0.85, color=colors, log=log)
    ax.axvline(a.slots + 0.5, color="0.2", linestyle="--", linewidth=1.2,
               label=f"slots = {a.slots}")
    ax.set_xlim(-0.7, max(hist.size, a.slots + 1) - 0.3)
    ax.set_xlabel("non-zeros in a (row, tile)")
    ax.set_ylabel("(row, tile) pairs")
    over_pairs = int(hist[a.slots + 1:].sum())
    ax.set_title(f"{tile_nnz.size} (row, tile) pairs, tile_width={a.tile_width}: {over_pairs} "
                 f"over slots={a.slots}, {a.overflow_nnz} entries in the overflow",
                 fontsize="medium")
    ax.legend(frameon=False)
    return ax


# -- format comparison ------------------------------------------------------------------


def _format_bytes(x, tile_width="auto", slots="auto"):
    """Bytes of ``x`` in each format, split into values, structure and padding.

    Returns a dict ``{format: {"values", "structure", "padding", "total"}}``
    for "dense", "CSR", "ELL" and "TwELL" (in that order), plus ``"twell"``:
    the TwELLMatrix, and ``"ell_width"``.

    * values: the non-zeros themselves, ``nnz * itemsize``;
    * structure: what locates them (CSR indptr/indices; ELL columns of the
      entries; TwELL counts, slot columns of the entries, overflow indptr
      and columns);
    * padding: stored bytes that hold no entry (the zeros of the dense
      array; unused ELL slots; unused TwELL slots, value and column).

    TwELL's total is that of the six storage arrays (``TwELLMatrix.nbytes`` without the
    compressed rows a host matrix keeps for its products); CSR's is that of a scipy
    ``csr_array`` (int32 indices while they fit, as scipy chooses), with
    values of x's dtype; ELL's is that of :class:`twell.ELLMatrix` (int32
    columns, as wide as the longest row).
    """
    from ._twell import TwELLMatrix

    a = TwELLMatrix(_input_on_host(x), tile_width=tile_width, slots=slots)
    m, k = a.shape
    isz = a.dtype.itemsize
    nnz = a.nnz
    rows = _coo(a)[0]
    width = int(np.bincount(rows, minlength=m).max(initial=0))
    csr_index = 4 if max(nnz, k) < 2**31 else 8
    ell_index = np.dtype(np.int32).itemsize
    used = int(a.counts.sum())
    free = a.data.size - used
    out = {
        "dense": {"values": nnz * isz, "structure": 0, "padding": (m * k - nnz) * isz},
        "CSR": {"values": nnz * isz, "structure": (nnz + m + 1) * csr_index, "padding": 0},
        "ELL": {"values": nnz * isz, "structure": nnz * ell_index,
                "padding": (m * width - nnz) * (isz + ell_index)},
        "TwELL": {"values": nnz * isz,
                  "structure": (a.counts.nbytes + used * a.indices.itemsize
                                + a.overflow_indptr.nbytes + a.overflow_indices.nbytes),
                  "padding": free * (isz + a.indices.itemsize)},
    }
    for v in out.values():
        v["total"] = v["values"] + v["structure"] + v["padding"]
    out["twell"] = a
    out["ell_width"] = width
    return out


def format_comparison(x, ax=None, *, tile_width="auto", slots="auto",
                      dense=True):
    """Bytes of a matrix as dense, CSR, row-wise ELL and TwELL, and their padding.

    One horizontal bar per format, split into the non-zero values, the
    structure that locates them (indices, counts, row pointers) and the
    padding (stored bytes that hold no entry: zeros of the dense array,
    unused ELL and TwELL slots). Each bar is labelled with its total and its
    size relative to dense.

    Parameters
    ----------
    x : array_like, sparse matrix, ELLMatrix or TwELLMatrix
        The matrix (anything :class:`twell.TwELLMatrix` accepts; on the host
        or on the GPU).
    ax : matplotlib.axes.Axes, optional
        Where to draw; default: a new figure.
    tile_width, slots : optional
        The TwELL layout to size (as for :class:`twell.TwELLMatrix`).
    dense : bool, optional
        Draw the dense bar (default). Leave it out when it dwarfs the others;
        the title still gives its size.

    Returns
    -------
    matplotlib.axes.Axes
        The bar segments are ``ax.containers`` (values, structure, padding),
        one bar per format, top to bottom in the order dense, CSR, ELL, TwELL.

    Notes
    -----
    TwELL's size is ``TwELLMatrix.nbytes``; CSR's that of
    ``scipy.sparse.csr_array`` (int32 indices where they fit) with values of
    the matrix dtype; ELL's that of :class:`twell.ELLMatrix` (int32 columns,
    as wide as the longest row).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import twell.plot
    >>> x = (np.random.default_rng(0).random((64, 512)) < 0.05).astype(np.float32)
    >>> ax = twell.plot.format_comparison(x, slots=8)
    >>> [t.get_text() for t in ax.get_yticklabels()]
    ['dense', 'CSR', 'ELL (width 38)', 'TwELL (T=256, S=8)']
    >>> import matplotlib.pyplot as plt; plt.close(ax.figure)
    """
    _pyplot()  # first, for a clear ImportError without matplotlib
    from matplotlib.ticker import FuncFormatter

    tile_width = check_tile_width(tile_width)
    slots = check_slots(slots, tile_width)
    sizes = _format_bytes(x, tile_width, slots)
    a = sizes["twell"]
    names = ["dense", "CSR", "ELL", "TwELL"] if dense else ["CSR", "ELL", "TwELL"]
    labels = {"dense": "dense", "CSR": "CSR", "ELL": f"ELL (width {sizes['ell_width']})",
              "TwELL": f"TwELL (T={a.tile_width}, S={a.slots})"}
    ax = _new_axes(ax, (7.5, 0.7 * len(names) + 1.9))
    y = np.arange(len(names))
    left = np.zeros(len(names))
    parts = (("values", "non-zero values", SLOT_COLOR),
             ("structure", "indices, counts, row pointers", STRUCTURE_COLOR),
             ("padding", "padding (unused slots, zeros)", PADDING_COLOR))
    for key, label, color in parts:
        widths = np.array([sizes[n][key] for n in names], dtype=np.float64)
        ax.barh(y, widths, left=left, color=color, label=label, height=0.6, edgecolor="0.3",
                linewidth=0.5)
        left += widths
    dense_total = sizes["dense"]["total"]
    for yi, n in zip(y, names, strict=True):
        total = sizes[n]["total"]
        rel = f" ({total / dense_total:.1%} of dense)" if dense_total and n != "dense" else ""
        ax.text(total, yi, f"  {_fmt_bytes(total)}{rel}", va="center", fontsize="small")
    ax.set_yticks(y, labels=[labels[n] for n in names])
    ax.invert_yaxis()
    ax.set_xlim(0, left.max(initial=0) * 1.45 or 1)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _fmt_bytes(v) if v else "0"))
    ax.set_xlabel("bytes")
    m, k = a.shape
    ax.set_title(f"{m}x{k} {a.dtype}, {a.nnz} non-zeros ({a.nnz / max(m * k, 1):.2%}); "
                 f"dense {_fmt_bytes(dense_total)}", fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncols=3, fontsize="small",
              frameon=False)
    return ax


# -- formats side by side ---------------------------------------------------------------


class _Panel:
    """Boxes and labels in grid units (1 unit = one table cell), drawn later on an Axes."""

    def __init__(self, title):
        self.title = title
        self.boxes = []   # (x, y, w, h, facecolor, text, fontsize, textcolor)
        self.labels = []  # (x, y, text, ha, fontsize)
        self.lines = []   # ((x0, x1), (y0, y1))
        self.width = 0.0
        self.height = 0.0

    def box(self, x, y, text="", color=FREE_COLOR, w=1.0, fontsize=10, textcolor="black"):
        self.boxes.append((x, y, w, 1.0, color, text, fontsize, textcolor))
        self._grow(x + w, y + 1)

    def label(self, x, y, text, ha="right", fontsize=9):
        self.labels.append((x, y, text, ha, fontsize))
        if ha == "left":  # about 0.6 em per character; one grid unit is 26 points
            self._grow(x + 0.6 * fontsize / 26 * len(text), y + 0.5)

    def array(self, x, y, name, texts, colors, textcolors=None, w=1.0, fontsize=10):
        """A 1-D array as a row of boxes at height ``y``: its name above, then its indices."""
        self.label(x, y - 1.0, name, ha="left")
        if not texts:
            self.label(x, y + 0.5, "(empty)", ha="left")
        textcolors = textcolors or ["black"] * len(texts)
        for i, (text, color, tc) in enumerate(zip(texts, colors, textcolors, strict=True)):
            self.box(x + i * w, y, text, color, w, fontsize, tc)
            self.label(x + (i + 0.5) * w, y - 0.3, str(i), ha="center", fontsize=7)
        self._grow(x + max(len(texts), 3) * w, y + 1)

    def _grow(self, x, y):
        self.width, self.height = max(self.width, x), max(self.height, y)

    def draw(self, ax, left_margin):
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import Rectangle

        rects = [Rectangle((x, y), w, h) for x, y, w, h, *_ in self.boxes]
        ax.add_collection(PatchCollection(rects, facecolors=[b[4] for b in self.boxes],
                                          edgecolors="0.35", linewidths=0.6))
        for x, y, w, h, _, text, fs, tc in self.boxes:
            if text:
                ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs,
                        color=tc)
        for x, y, text, ha, fs in self.labels:
            ax.text(x, y, text, ha=ha, va="center", fontsize=fs, color="0.15")
        for xs, ys in self.lines:
            ax.plot(xs, ys, color="black", linewidth=1.8, solid_capstyle="butt")
        ax.set_xlim(-left_margin, self.width + 0.2)
        ax.set_ylim(self.height + 0.2, -1.6)
        ax.set_axis_off()
        ax.set_title(self.title, fontsize=11, loc="left", x=0.0)


def formats_side_by_side(x, *, tile_width=4, slots=2, fig=None):
    """Draw one small matrix as dense, CSR, row-wise ELL and TwELL, side by side.

    Four panels show every stored array with its contents: the dense matrix
    (tiles as column bands); CSR's ``indptr``, ``indices``, ``data``; ELL's
    ``data`` and ``indices`` (padding in grey); TwELL's ``counts``, the
    slots of each tile (value and column within the tile) and the overflow
    CSR part. Each entry has the colour of its tile in every panel, so that
    it can be followed from one format to the next; overflow entries are red.

    Parameters
    ----------
    x : array_like, sparse matrix, ELLMatrix or TwELLMatrix
        At most 16 x 32 (every entry is written out); on the host or the GPU.
    tile_width : int, optional
        TwELL tile width (default 4: small, for pictures).
    slots : int or "auto", optional
        TwELL slots per (row, tile) (default 2).
    fig : matplotlib.figure.Figure, optional
        Where to draw (cleared first); default: a new pyplot figure sized for
        the content.

    Returns
    -------
    matplotlib.figure.Figure
        With four Axes, titled "dense", "CSR", "ELL" and "TwELL".

    Raises
    ------
    ValueError
        When the matrix is larger than 16 x 32.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import twell.plot
    >>> x = np.array([[0, 1.5, 0, 0, 2, 0, 0, 0],
    ...               [3, 0, 0, 4, 0, 5, 6, 7]])
    >>> fig = twell.plot.formats_side_by_side(x, tile_width=4, slots=2)
    >>> [ax.get_title(loc="left").split(" ")[0] for ax in fig.axes]
    ['dense', 'CSR', 'ELL', 'TwELL']
    >>> import matplotlib.pyplot as plt; plt.close(fig)
    """
    plt = _pyplot()  # first, for a clear ImportError without matplotlib

    from ._ell import ELLMatrix
    from ._twell import TwELLMatrix

    tile_width = check_tile_width(tile_width)
    slots = check_slots(slots, tile_width)
    a = TwELLMatrix(_input_on_host(x), tile_width=tile_width, slots=slots)
    m, k = a.shape
    mmax, kmax = SIDE_BY_SIDE_MAX_SHAPE
    if m > mmax or k > kmax:
        raise ValueError(
            f"formats_side_by_side draws every entry: x must be at most {mmax}x{kmax}; "
            f"got shape {a.shape} (use twell.plot.layout or occupancy for larger matrices)"
        )
    t, s, nt = a.tile_width, a.slots, a.n_tiles
    rows, cols, vals = _coo(a)
    orow, ocol = _overflow_coo(a)
    overflow = set(zip(orow.tolist(), ocol.tolist(), strict=True))

    def color(r, c):
        return OVERFLOW_COLOR if (r, c) in overflow else TILE_TINTS[(c // t) % len(TILE_TINTS)]

    def tcolor(r, c):
        return "white" if (r, c) in overflow else "black"

    entry_color = [color(r, c) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)]
    entry_text = [tcolor(r, c) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)]

    # Dense: the matrix, tiles as bands; zeros blank.
    dense = _Panel(f"dense ({m} x {k})")
    dense_vals = {(r, c): v for r, c, v in zip(rows.tolist(), cols.tolist(), vals.tolist(),
                                               strict=True)}
    for r in range(m):
        dense.label(-0.15, r + 0.5, str(r))
        for c in range(k):
            v = dense_vals.get((r, c))
            if v is None:
                dense.box(c, r, "", BAND_COLORS[(c // t) % 2])
            else:
                dense.box(c, r, _fmt_value(v), color(r, c), textcolor=tcolor(r, c))
    for c in range(k):
        dense.label(c + 0.5, -0.3, str(c), ha="center", fontsize=7)
    for j in range(nt):
        dense.label(j * t + min(t, k - j * t) / 2, -1.1, f"tile {j}", ha="center")
        if j:
            dense.lines.append(((j * t, j * t), (-0.6, m)))

    # CSR: indptr, indices, data.
    csr = _Panel(f"CSR (nnz = {rows.size})")
    indptr = _algorithms.exclusive_cumsum(np.bincount(rows, minlength=m))
    csr.array(0, 0, "indptr", [str(v) for v in indptr.tolist()], [STRUCTURE_TINT] * (m + 1))
    csr.array(0, 2.4, "indices", [str(c) for c in cols.tolist()], entry_color, entry_text)
    csr.array(0, 4.8, "data", [_fmt_value(v) for v in vals.tolist()], entry_color, entry_text)

    # ELL: data and indices, M x width, padding in grey.
    ell = ELLMatrix(a)
    w = ell.width
    ell_panel = _Panel(f"ELL (width {w}: the longest row)")
    lengths = np.bincount(rows, minlength=m)
    starts = indptr[:-1]
    for r in range(m):
        ell_panel.label(-0.15, r + 0.5, str(r))
        for q in range(w):
            if q < lengths[r]:
                e = starts[r] + q
                ell_panel.box(q, r, _fmt_value(ell.data[r, q]), entry_color[e],
                              textcolor=entry_text[e])
                ell_panel.box(w + 1.5 + q, r, str(int(ell.indices[r, q])), entry_color[e],
                              textcolor=entry_text[e])
            else:
                ell_panel.box(q, r, "0", PADDING_COLOR, textcolor="0.45")
                ell_panel.box(w + 1.5 + q, r, "0", PADDING_COLOR, textcolor="0.45")
    ell_panel.label(0, -0.5, "data", ha="left")
    ell_panel.label(w + 1.5, -0.5, "indices", ha="left")
    ell_panel._grow(2 * w + 1.5, m)

    # TwELL: counts, then per tile the slots (value over column within the tile), overflow.
    tw = _Panel(f"TwELL (tile_width={t}, slots={s}; {a.overflow_nnz} overflow)")
    for r in range(m):
        tw.label(-0.15, r + 0.5, str(r))
        for j in range(nt):
            tw.box(j, r, str(int(a.counts[r, j])), STRUCTURE_TINT)
    tw.label(0, -0.5, "counts", ha="left")
    cw = 1.7  # slot cells hold "value @ column"
    x0 = nt + 1.0
    for j in range(nt):
        tw.label(x0, -0.5, f"tile {j}: data @ indices", ha="left", fontsize=8)
        for r in range(m):
            for q in range(s):
                if q < a.counts[r, j]:
                    c = j * t + int(a.indices[r, j, q])
                    tw.box(x0 + q * cw, r, f"{_fmt_value(a.data[r, j, q])} @{a.indices[r, j, q]}",
                           color(r, c), w=cw, fontsize=9, textcolor=tcolor(r, c))
                else:
                    tw.box(x0 + q * cw, r, "0 @0", PADDING_COLOR, w=cw, fontsize=9,
                           textcolor="0.45")
        x0 += s * cw + 0.6
    # The overflow part, a CSR matrix with global columns, under the slots.
    y0 = m + 1.9
    ocolors, owhite = [OVERFLOW_COLOR] * ocol.size, ["white"] * ocol.size
    tw.array(0, y0, "overflow_indptr", [str(v) for v in a.overflow_indptr.tolist()],
             [STRUCTURE_TINT] * (m + 1))
    ox = max(m + 2.0, 7.0)
    tw.array(ox, y0, "overflow_indices", [str(v) for v in ocol.tolist()], ocolors, owhite)
    tw.array(ox, y0 + 2.4, "overflow_data",
             [_fmt_value(v) for v in a.overflow_data.tolist()], ocolors, owhite)

    # Two panels per line, left to right; one grid unit is `unit` inches.
    panels = [dense, csr, ell_panel, tw]
    margins = [0.7, 0.3, 0.7, 0.7]
    unit, gap = 0.36, 1.2
    placed, x, y, row_h, total_w = [], 0.0, 0.0, 0.0, 0.0
    for i, (p, lm) in enumerate(zip(panels, margins, strict=True)):
        pw, ph = p.width + lm + 0.3, p.height + 1.9 + 0.7  # + title band
        if i == 2:
            x, y, row_h = 0.0, y + row_h + gap, 0.0
        placed.append((p, lm, x, y, pw, ph))
        x += pw + gap
        row_h = max(row_h, ph)
        total_w = max(total_w, x - gap)
    total_h = y + row_h
    if fig is None:
        fig = plt.figure(figsize=(total_w * unit + 0.4, total_h * unit + 0.4))
    else:
        fig.clear()
    fw, fh = fig.get_figwidth() / unit, fig.get_figheight() / unit
    for p, lm, px, py, pw, ph in placed:
        ax = fig.add_axes(((px + 0.2 / unit) / fw, 1 - (py + ph + 0.2 / unit) / fh, pw / fw,
                           (ph - 0.7) / fh))
        p.draw(ax, lm)
    return fig


# -- packed words -----------------------------------------------------------------------


def packed_words(A, row, tile, compression=8, ax=None):
    """Draw the reference packed words of one (row, tile), in hexadecimal.

    The words are those ``A.to_packed(compression)`` writes for row ``row``
    and 256-column tile ``tile``: word 0 is the count, words ``1..count``
    are entries ``bf16_bits << 16 | global_column`` (each decoded below its
    hexadecimal value), the rest are unused (zero). Eight words per line.

    Parameters
    ----------
    A : TwELLMatrix
        On the host or the GPU; values that are not bfloat16 are rounded to
        bfloat16 (the packed layout holds nothing else), and any tile width
        is re-tiled to 256, as ``to_packed`` does.
    row, tile : int
        Which (row, tile) to draw.
    compression : {8, 4, 2}
        The reference's compression factor: 256 / C words per tile.
    ax : matplotlib.axes.Axes, optional
        Where to draw; default: a new figure.

    Returns
    -------
    matplotlib.axes.Axes
        One text per word holds its hexadecimal value (``0x%08X``).

    Raises
    ------
    ValueError
        When ``row`` or ``tile`` is out of range, or the (row, tile) does not
        fit the packed layout (K not a multiple of 256, above 65536, or more
        non-zeros than the capacity ``256 / C - 1``).

    See Also
    --------
    TwELLMatrix.to_packed : all the words of a matrix.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import twell, twell.plot
    >>> x = np.zeros((1, 512), dtype=np.float32)
    >>> x[0, 3], x[0, 100], x[0, 300] = 1.5, 2.0, 0.25
    >>> ax = twell.plot.packed_words(twell.TwELLMatrix(x), row=0, tile=0)
    >>> [t.get_text() for t in ax.texts if t.get_text().startswith("0x")][:4]
    ['0x00000002', '0x3FC00003', '0x40000064', '0x00000000']
    >>> import matplotlib.pyplot as plt; plt.close(ax.figure)
    """
    _pyplot()  # first, for a clear ImportError without matplotlib
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Patch, Rectangle

    from ._twell import TwELLMatrix

    a = _twell_on_host(A)
    c = check_compression(compression)
    m, k = a.shape
    row, tile = operator_index(row, "row"), operator_index(tile, "tile")
    n_packed_tiles = -(-k // _layout.PACKED_TILE_WIDTH)
    if not 0 <= row < m:
        raise ValueError(f"row must be in [0, {m}); got row={row}")
    if not 0 <= tile < n_packed_tiles:
        raise ValueError(f"tile must be in [0, {n_packed_tiles}) (256-column tiles of K={k}); "
                         f"got tile={tile}")
    # Pack this (row, tile) alone, so that a full tile elsewhere in the matrix does not matter.
    rows, cols, vals = _coo(a)
    sel = (rows == row) & (cols // _layout.PACKED_TILE_WIDTH == tile)
    one = np.zeros((1, k), dtype=a.dtype)
    one[0, cols[sel]] = vals[sel]
    cap = _layout.packed_capacity(c)
    b = TwELLMatrix(one, tile_width=_layout.PACKED_TILE_WIDTH, slots=cap, dtype=bfloat16)
    wpt = _layout.packed_words_per_tile(c)
    words = b.to_packed(c)[0, tile * wpt:(tile + 1) * wpt]
    count = int(words[0])

    per_line = 8
    n_lines = -(-wpt // per_line)
    ax = _new_axes(ax, (per_line * 1.05 + 0.3, n_lines * 0.62 + 1.1))
    boxes, colors = [], []
    for i, word in enumerate(words.tolist()):
        x, y = i % per_line, i // per_line
        if i == 0:
            color, note = COUNT_COLOR, f"count = {word}"
        elif i <= count:
            value = np.array([word >> 16], dtype=np.uint16).view(bfloat16)[0]
            color, note = TILE_TINTS[0], f"col {word & 0xFFFF}, {_fmt_value(value)}"
        else:
            color, note = PADDING_COLOR, "unused"
        boxes.append(Rectangle((x, y), 1, 1))
        colors.append(color)
        ax.text(x + 0.05, y + 0.17, f"w[{tile * wpt + i}]", fontsize=7, color="0.3",
                va="center")
        ax.text(x + 0.5, y + 0.5, f"0x{word:08X}", ha="center", va="center", fontsize=9,
                family="monospace")
        ax.text(x + 0.5, y + 0.82, note, ha="center", va="center", fontsize=7, color="0.2")
    ax.add_collection(PatchCollection(boxes, facecolors=colors, edgecolors="0.35",
                                      linewidths=0.6))
    ax.set_xlim(-0.05, per_line + 0.05)
    ax.set_ylim(n_lines + 0.05, -0.05)
    ax.set_axis_off()
    ax.set_title(f"packed words of row {row}, tile {tile} (columns {tile * 256}-"
                 f"{tile * 256 + 255}), compression={c}\n{wpt} words: the count, then up to "
                 f"{cap} entries bf16_bits << 16 | global column", fontsize="medium")
    ax.legend(handles=[Patch(facecolor=COUNT_COLOR, edgecolor="0.35", label="count"),
                       Patch(facecolor=TILE_TINTS[0], edgecolor="0.35", label="entry"),
                       Patch(facecolor=PADDING_COLOR, edgecolor="0.35", label="unused (zero)")],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=3, fontsize="small",
              frameon=False)
    return ax
