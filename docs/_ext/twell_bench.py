"""Sphinx extension: the benchmark results in ``benchmarks/results/*.json`` as tables and plots.

Each results file is named ``<suite>-<card>.json``: the suite is ``gpu`` (whose sci workload
holds the solvers), ``cpu`` or ``dask`` and the card a short name of the machine (``h200``,
``h100``, ``2core``). Every page that shows results reads them while the documentation builds,
so the tables and plots are those of the files in the checkout, and a new results file changes
the pages without an edit.

Directives:

``.. bench-summary::``
    One row per results file (suite, card, device, software), and one line for each suite that
    has no result yet.
``.. bench-table:: SUITE``
    One table per card of the suite. For the ``twell-bench/1`` schema (the GPU and CPU suites),
    ``:op:`` picks an operation and the table has a row per case and twell layout, twell's time
    and, for each other family of contenders, the ratio of that family's best time to twell's
    (above 1: twell is faster). Without ``:op:``, one row per operation and one column per
    matrix, each cell the ratio of the best other contender to twell. Options: ``:workloads:``,
    ``:dtypes:`` (space-separated filters), ``:variants:`` (``auto``, the default: twell's
    ``slots="auto"`` layouts; ``given``; or ``auto given``), ``:copy:`` (add the fraction of the
    copy bandwidth), ``:include-models:`` (count modelled times as contenders). The Dask suite's
    records get a table of their own.
``.. bench-figure:: SUITE``
    One figure per card: ``:kind:`` is ``spmm-sparsity`` (time against sparsity of the bf16
    SpMM on the activations), ``pack-sparsity`` (the same for dense -> TwELL) or ``sci-bars``
    (the SpMM on the scientific matrices, grouped bars).
``.. bench-status::``
    The short table of current numbers (operation, twell, best alternative, ratio, card) of
    the GPU result of STATUS_CARD (else the first GPU result); ``python
    docs/_ext/twell_bench.py`` prints it as Markdown for the README.

Figures are written to ``docs/_generated/bench/`` (ignored by git) while the page is read.
"""

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SUITES = ("gpu", "cpu", "dask")
SUITE_TITLES = {"gpu": "GPU suite", "cpu": "CPU suite",
                "dask": "Dask suite"}
RERUN = {
    "gpu": "python benchmarks/bench.py --out benchmarks/results/gpu-<card>.json",
    "cpu": "python benchmarks/bench.py --cpu --out benchmarks/results/cpu-<card>.json",
}
SCHEMA = "twell-bench/1"

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
FIGURES = Path(__file__).resolve().parents[1] / "_generated" / "bench"

WORKLOADS = {"ffn": "activations", "sweep": "activations", "hot": "hot neurons",
             "sci": "scientific"}
WORKLOAD_ORDER = ("ffn", "sweep", "hot", "sci")
DTYPE_ORDER = ("bf16", "fp16", "fp32", "fp64")
MATRICES = {"poisson": "Poisson stencil", "graph": "power-law graph"}
FAMILY_ORDER = ("dense", "composed", "torch", "cupyx", "ref", "scipy")
FAMILY_LABELS = {
    "dense": "dense cuBLAS", "composed": "composed", "torch": "cuSPARSE (torch)",
    "cupyx": "cupyx", "ref": "reference", "scipy": "scipy.sparse",
}
# Per operation, what a family's contender is, where it is not what FAMILY_LABELS says.
OP_FAMILY_LABELS = {
    "pack": {"torch": "torch to_sparse_csr", "cupyx": "cupyx csr_matrix"},
    "gemm+pack": {"dense": "cuBLAS GEMM + ReLU, dense", "composed": "cuBLAS + ReLU + twell pack",
                  "ref": "reference D2T"},
    "gated ffn": {"dense": "dense layer (cuBLAS)", "ref": "reference"},
    "spmm": {"ref": "reference T2D", "cupyx": "cupyx CSR"},
    "spmv": {"cupyx": "cupyx CSR"},
    "twell->dense": {"torch": "torch to_dense", "cupyx": "cupyx toarray"},
}
OP_TITLES = {
    "pack": "dense -> TwELL", "gemm+pack": "relu(x @ w.T) -> TwELL", "gated ffn": "gated FFN",
    "csr->twell": "CSR -> TwELL", "twell->csr": "TwELL -> CSR", "twell->dense": "TwELL -> dense",
    "spmm": "A @ B", "spmv": "A @ x", "sum": "A.sum(axis)", "columns": "A[:, K/4:3K/4]",
}
TIMED = ("ok", "wrong")
# An empty cell: a lone "-" would be a bullet list in reStructuredText.
NONE = "\u2014"
IMPL_WORDS = {"gather": "gather", "toarray + cuBLAS": "dense",
              "A._csr_arrays()": "CSR arrays", "A.tocsr()": "cupyx CSR"}
# Short card names of the file names, in words (for files whose JSON does not name the card).
CARD_WORDS = {"h100": "NVIDIA H100", "h200": "NVIDIA H200", "a100": "NVIDIA A100",
              "2core": "2 CPU cores"}
# The benchmark's contender names, in words (the status table).
CONTENDER_WORDS = {
    "cupy.matmul": "dense cuBLAS (cupy.matmul)", "torch.matmul": "dense cuBLAS (torch.matmul)",
    "torch csr": "cuSPARSE CSR (torch)", "cupyx csr": "cupyx CSR",
    "ref T2D C=8": "the reference kernels' product", "ref D2T C=8": "the reference kernels' GEMM",
    "ref D2T C=4": "the reference kernels' GEMM",
    "ref gated FFN (D2T + gated T2D) C=8": "the reference kernels' layer",
    "torch to_sparse_csr": "torch to_sparse_csr", "torch csr.to_dense": "torch to_dense",
    "torch 3 GEMMs (dense)": "dense layer (torch, cuBLAS)",
    "cupy 3 GEMMs (dense)": "dense layer (cupy, cuBLAS)",
}


# -- loading ------------------------------------------------------------------------------------

@dataclass
class Result:
    """One results file: ``<suite>-<card>.json``."""

    path: Path
    suite: str
    card: str
    data: dict

    @property
    def schema(self):
        return self.data.get("schema")

    @property
    def rows(self):
        return self.data.get("rows", [])

    @property
    def device(self):
        """The machine in words: the card's name from the file, else its short name."""
        meta = self.data.get("meta", {})
        return (meta.get("card") or meta.get("device", {}).get("name")
                or CARD_WORDS.get(self.card, self.card))

    @property
    def where(self):
        """``benchmarks/results/<name>``, the path a reader finds in a checkout."""
        return f"benchmarks/results/{self.path.name}"


def load_results(folder=RESULTS):
    """Every ``*.json`` of ``folder``, ordered by suite (as SUITES, others after) and card."""
    found = []
    for path in sorted(Path(folder).glob("*.json")):
        suite, _, card = path.stem.partition("-")
        with open(path, encoding="utf-8") as f:
            found.append(Result(path, suite, card or "?", json.load(f)))
    order = {s: i for i, s in enumerate(SUITES)}
    return sorted(found, key=lambda r: (order.get(r.suite, len(SUITES)), r.suite, r.card))


def of_suite(results, suite):
    return [r for r in results if r.suite == suite]


# -- twell-bench/1 rows ------------------------------------------------------------------------

def parse_variant(variant):
    """(tile width or None, slots text, indexed) of a twell row's variant."""
    tile = re.search(r"\bT=(\d+)", variant or "")
    slots = re.search(r"\bS=(\S+)", variant or "")
    text = slots.group(1) if slots else (variant or "").strip()
    return (int(tile.group(1)) if tile else None, text, "+index" in (variant or ""))


def is_auto(variant):
    return "auto" in parse_variant(variant)[1]


def case_text(row):
    """The case of a row in words: ``99%`` for a sparsity, else the matrix and its parameter."""
    if row.get("sparsity") is not None:
        return f"{100 * row['sparsity']:g}%"
    name = MATRICES.get(row.get("matrix"), row.get("matrix") or row.get("label") or "")
    return f"{name}, {row['param']}" if row.get("param") else name


def _order_key(row):
    wl = row.get("workload")
    wl_rank = WORKLOAD_ORDER.index(wl) if wl in WORKLOAD_ORDER else len(WORKLOAD_ORDER)
    if wl == "sweep":
        wl_rank = WORKLOAD_ORDER.index("ffn")  # one set of activations, sorted by sparsity
    dt = row.get("dtype")
    dt_rank = DTYPE_ORDER.index(dt) if dt in DTYPE_ORDER else len(DTYPE_ORDER)
    sparsity = row.get("sparsity")
    param = row.get("param") or ""
    n = re.search(r"(\d+)", param)
    return (wl_rank, row.get("matrix") or "", dt_rank,
            -(sparsity if sparsity is not None else 0), int(n.group(1)) if n else 0, param)


def groups(rows, op, workloads=None, dtypes=None):
    """The rows of ``op`` by (case, param), in reading order."""
    out = {}
    for r in rows:
        if r.get("op") != op:
            continue
        if workloads and r.get("workload") not in workloads:
            continue
        if dtypes and r.get("dtype") not in dtypes:
            continue
        out.setdefault((r["case"], r.get("param") or ""), []).append(r)
    return sorted(out.values(), key=lambda g: _order_key(g[0]))


def twell_choices(group, variants=("auto",)):
    """twell's rows of one group to show: per kind (``auto``/``given``) and tile width, the
    fastest timed one (with a tile index or without)."""
    best = {}
    for r in group:
        if r.get("family") != "twell" or r.get("status") not in TIMED or not r.get("ms"):
            continue
        kind = "auto" if is_auto(r.get("variant")) else "given"
        if kind not in variants:
            continue
        key = (variants.index(kind), -(parse_variant(r.get("variant"))[0] or 0))  # wide first
        if key not in best or _faster(r, best[key]):
            best[key] = r
    return [best[k] for k in sorted(best)]


def _faster(row, other):
    """Whether ``row`` beats ``other`` (same layout, with and without a tile index): the index
    must gain over 2%, within the runs' noise the plain layout is shown."""
    indexed, other_indexed = parse_variant(row.get("variant"))[2], \
        parse_variant(other.get("variant"))[2]
    margin = 0.98 if indexed and not other_indexed else 1 / 0.98 if other_indexed else 1.0
    return row["ms"] < other["ms"] * margin


def best_of(group, family, include_models=False):
    """The fastest timed row of ``family`` in a group, or None."""
    ok = ("ok", "model") if include_models else ("ok",)
    found = [r for r in group if r.get("family") == family and r.get("status") in ok
             and r.get("ms")]
    return min(found, key=lambda r: r["ms"]) if found else None


def families(groups_, include_models=False):
    """The contender families with a timed row in any group, in FAMILY_ORDER (others after)."""
    seen = {r["family"] for g in groups_ for r in g if r.get("family") != "twell"
            and r.get("status") in (("ok", "model") if include_models else ("ok",))}
    return [f for f in FAMILY_ORDER if f in seen] + sorted(seen - set(FAMILY_ORDER))


def fmt_ms(row):
    ms = row["ms"]
    text = f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"
    return text + ("!" if row.get("status") == "wrong" else "")


class Markup(str):
    """A table cell that is reStructuredText already (not escaped)."""


def rst_escape(text):
    """Text from a results file as literal reStructuredText."""
    text = str(text)
    for ch in "\\*`|":
        text = text.replace(ch, "\\" + ch)
    return re.sub(r"_(?=\W|$)", r"\\_", text)


def fmt_ratio(value, model=False):
    if value is None or not math.isfinite(value):
        return NONE
    text = f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    text = ("~" if model else "") + text
    return Markup(f"**{text}**") if value >= 1 else text


def layout_text(row):
    tile, slots, indexed = parse_variant(row.get("variant"))
    parts = [f"T={tile}"] if tile else []
    if slots:
        parts.append(f"S={slots}")
    if indexed:
        parts.append("indexed")
    return " ".join(parts) or NONE


def op_table(result, op, workloads=None, dtypes=None, variants=("auto",), copy=False,
             include_models=False):
    """(header, rows of cells) for one operation of a twell-bench/1 result, or None."""
    gs = groups(result.rows, op, workloads, dtypes)
    fams = families(gs, include_models)
    labels = {**FAMILY_LABELS, **OP_FAMILY_LABELS.get(op, {})}
    chosen = [(g, tw) for g in gs for tw in twell_choices(g, variants)]
    ways = any(tw.get("impl") for _, tw in chosen)
    header = ["workload", "dtype", "case", "twell layout"] + (["way"] if ways else [])
    header.append("twell (ms)")
    if copy:
        header.append("% of copy")
    header += [f"vs {labels.get(f, f)}" for f in fams]
    body = []
    for g, tw in chosen:
        cells = [WORKLOADS.get(tw.get("workload"), tw.get("workload") or ""),
                 tw.get("dtype") or "", case_text(tw), layout_text(tw)]
        if ways:
            cells.append(IMPL_WORDS.get(tw.get("impl"), tw.get("impl") or NONE))
        cells.append(fmt_ms(tw))
        if copy:
            frac = tw.get("frac_copy")
            cells.append(f"{100 * frac:.0f}%" if frac else NONE)
        for f in fams:
            other = best_of(g, f, include_models)
            cells.append(fmt_ratio(other["ms"] / tw["ms"], other["status"] == "model")
                         if other else NONE)
        body.append(cells)
    return (header, body) if body else None


SOLVERS = ("cg", "gmres")


def _products(row):
    """A solver row's matrix-vector products to its rtol, as text."""
    n = row.get("products_to_rtol")
    return "not reached" if n is None else str(n)


def solver_table(result):
    """(header, rows) of the iterative solvers (ops ``cg`` and ``gmres`` of the sci workload):
    GPU time per iteration with the TwELLMatrix and with cupyx's CSR, and the matrix-vector
    products each took to the relative residual ``rtol``; None without such rows."""
    header = ["matrix", "dtype", "solver", "twell layout", "twell (ms / iteration)",
              "cupyx CSR (ms / iteration)", "vs cupyx CSR", "products to rtol (twell / CSR)"]
    body = []
    for solver in SOLVERS:
        for g in groups(result.rows, solver, ("sci",)):
            tw = next((r for r in g if r.get("family") == "twell"), None)
            csr = next((r for r in g if r.get("family") == "cupyx"), None)
            if tw is None or csr is None or tw.get("status") not in TIMED:
                continue
            per_tw, per_csr = tw.get("ms_per_iteration"), csr.get("ms_per_iteration")
            mark = "!" if tw.get("status") == "wrong" else ""
            rtol = tw.get("rtol")
            body.append([
                MATRICES.get(tw.get("matrix"), tw.get("matrix") or ""), tw.get("dtype") or "",
                solver, layout_text(tw),
                f"{per_tw:.3f}{mark}" if per_tw else NONE,
                f"{per_csr:.3f}" if per_csr else NONE,
                fmt_ratio(per_csr / per_tw) if per_tw and per_csr else NONE,
                f"{_products(tw)} / {_products(csr)}" + (f" (rtol {rtol:g})" if rtol else ""),
            ])
    return (header, body) if body else None


def pivot_table(result):
    """(header, rows) of a twell-bench/1 result: one row per operation, one column per matrix,
    each cell the best other contender's time over twell's (``slots="auto"`` where it has it,
    else its fastest layout)."""
    ops, cases = [], []
    cells = {}
    several = len({r.get("workload") for r in result.rows}) > 1
    for r in result.rows:
        op = r.get("op")
        if op not in ops:
            ops.append(op)
    for op in ops:
        for g in groups(result.rows, op):
            tw = twell_choices(g, ("auto", "given"))
            if not tw:
                continue
            tw = min(tw, key=lambda r: (not is_auto(r.get("variant")), r["ms"]))
            others = [best_of(g, f) for f in families([g])]
            others = [o for o in others if o]
            if not others:
                continue
            other = min(others, key=lambda r: r["ms"])
            label = f"{tw.get('dtype')} {case_text(tw)}".strip()
            if several:
                label = f"{WORKLOADS.get(tw.get('workload'), tw.get('workload'))}, {label}"
            if label not in cases:
                cases.append(label)
            cells[op, label] = fmt_ratio(other["ms"] / tw["ms"])
    rows = [[OP_TITLES.get(op, op)] + [cells.get((op, c), NONE) for c in cases]
            for op in ops if any((op, c) in cells for c in cases)]
    return (["operation"] + cases, rows) if rows else None


def dask_table(result):
    """(header, rows) of the Dask suite's records."""
    recs = result.data.get("records", [])
    if not recs:
        return None
    base = next((r["seconds"] for r in recs if r.get("config") == "single"), None)
    header = ["configuration", "workers", "row blocks", "median (ms)", "single / this",
              "rel. error vs single"]
    rows = []
    for r in recs:
        blocks = r.get("blocks")
        err = r.get("rel_err_vs_single")
        rows.append([r.get("config", "?"), str(r.get("workers", NONE)),
                     str(blocks) if blocks else "1", f"{1e3 * r['seconds']:.3g}",
                     f"{base / r['seconds']:.2f}" if base else NONE,
                     f"{err:.1e}" if err is not None else NONE])
    return header, rows


def dask_caption(result):
    w = result.data.get("workload", {})
    parts = [f"M = {w['m']}, K = {w['k']}, N = {w['n']}" if {"m", "k", "n"} <= set(w) else "",
             f"density {w['density']:g}" if "density" in w else "",
             w.get("dtype", ""), f"tile width {w['tile_width']}" if "tile_width" in w else ""]
    text = ", ".join(p for p in parts if p)
    notes = result.data.get("notes") or []
    return text + (". " + " ".join(notes) if notes else "")


# -- status (README) ---------------------------------------------------------------------------

# (operation in words, op, workload, dtype, sparsity, matrix, param, twell tile width, or the
# twell variant by name)
STATUS = [
    ("A @ B, bf16, 99% sparse activations", "spmm", "ffn", "bf16", 0.99, None, "", None),
    ("A @ B, bf16, 99.9% sparse activations", "spmm", "sweep", "bf16", 0.999, None, "", None),
    ("A @ B, bf16, 90% sparse activations", "spmm", "ffn", "bf16", 0.9, None, "", None),
    ("A @ B, fp32, 99% sparse activations", "spmm", "ffn", "fp32", 0.99, None, "", None),
    ("A @ B, Poisson stencil, fp32, N = 64", "spmm", "sci", "fp32", None, "poisson", "N=64",
     65536),
    ("A @ B, power-law graph, fp32, N = 64", "spmm", "sci", "fp32", None, "graph", "N=64",
     65536),
    ("A @ x, Poisson stencil, fp32", "spmv", "sci", "fp32", None, "poisson", "", None),
    ("A @ x, power-law graph, fp32", "spmv", "sci", "fp32", None, "graph", "", None),
    ("dense -> TwELL, bf16, 99%", "pack", "ffn", "bf16", 0.99, None, "", None),
    ("relu(x @ w.T) -> TwELL, bf16, 99%", "gemm+pack", "ffn", "bf16", 0.99, None, "", None),
    ("gated FFN layer, bf16, 99%", "gated ffn", "ffn", "bf16", 0.99, None, "", None),
    ("SparseGatedMLP in a CUDA graph, bf16, 99%", "gated ffn", "ffn", "bf16", 0.99, None, "",
     "module, CUDA graph"),
    ("SparseGatedMLP in a CUDA graph, bf16, 99.9%", "gated ffn", "sweep", "bf16", 0.999, None,
     "", "module, CUDA graph"),
    ("TwELL -> dense, bf16, 99%", "twell->dense", "ffn", "bf16", 0.99, None, "", None),
]


def status_rows(result):
    """[operation, twell ms, best alternative (name, ms), ratio, card] for STATUS, from a
    twell-bench/1 result; twell with ``slots="auto"``."""
    rows = []
    for words, op, wl, dt, s, matrix, param, tile in STATUS:
        group = [r for r in result.rows if r.get("op") == op and r.get("workload") == wl
                 and r.get("dtype") == dt and r.get("sparsity") == s
                 and r.get("matrix") == matrix and (r.get("param") or "") == param]
        if isinstance(tile, str):
            tw = [r for r in group if r.get("family") == "twell" and r.get("variant") == tile
                  and r.get("status") in TIMED and r.get("ms")]
        else:
            tw = [r for r in twell_choices(group)
                  if tile is None or parse_variant(r.get("variant"))[0] == tile]
        others = [o for o in (best_of(group, f) for f in families([group])) if o]
        if not tw or not others:
            continue
        other = min(others, key=lambda r: r["ms"])
        name = other.get("contender", other["family"])
        name = CONTENDER_WORDS.get(name, name)
        rows.append([words, f"{tw[0]['ms']:.3f} ms", f"{name}, {other['ms']:.3f} ms",
                     f"{other['ms'] / tw[0]['ms']:.2f}", result.device])
    return rows


STATUS_HEADER = ["operation", "twell", "best alternative", "ratio", "card"]


STATUS_CARD = "h100"  # the card of the README's status table, when it has a GPU result


def status_result(results):
    """The GPU result the status table reads: STATUS_CARD's, else the first."""
    gpu = [r for r in results if r.suite == "gpu" and r.schema == SCHEMA]
    gpu.sort(key=lambda r: r.card != STATUS_CARD)
    return gpu[0] if gpu else None


def status_markdown(results=None):
    """The status table as Markdown (for the README), from status_result."""
    gpu = status_result(results or load_results())
    if gpu is None:
        return "No GPU result yet.\n"
    lines = ["| " + " | ".join(STATUS_HEADER) + " |", "|---" * len(STATUS_HEADER) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in status_rows(gpu)]
    return "\n".join(lines) + "\n"


# -- figures -----------------------------------------------------------------------------------

COLORS = {"twell": "C0", "twell-given": "C9", "dense": "C1", "torch": "C2", "cupyx": "C4",
          "ref": "C3", "composed": "C5", "scipy": "C6", "floor": "0.5"}


def _sparsity_axis(ax, sparsities):
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xticks([1 - s for s in sparsities], [f"{100 * s:g}%" for s in sparsities],
                  rotation=45)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("sparsity (share of zeros; log scale of the non-zeros)")
    ax.set_yscale("log")
    ax.set_ylabel("time (ms, median; log scale)")
    ax.grid(True, which="major", alpha=0.3)


def _series(gs, pick):
    """[(sparsity, ms)] of pick(group) over groups, sorted by sparsity."""
    pts = []
    for g in gs:
        row = pick(g)
        if row is not None and row.get("sparsity") is not None:
            pts.append((row["sparsity"], row["ms"]))
    return sorted(pts)


def _twell_pick(kind):
    def pick(g):
        rows = twell_choices(g, (kind,))
        return rows[0] if rows else None
    return pick


def figure_spmm_sparsity(result, path):
    import matplotlib.pyplot as plt

    gs = groups(result.rows, "spmm", ("ffn", "sweep"), ("bf16",))
    if not gs:
        return False
    labels = {**FAMILY_LABELS, **OP_FAMILY_LABELS["spmm"]}
    fig, ax = plt.subplots(figsize=(7.5, 4.6), layout="constrained")
    lines = [("twell", 'twell, slots="auto"', _twell_pick("auto"), "o-")]
    lines += [(f, labels.get(f, f), lambda g, f=f: best_of(g, f), style)
              for f, style in (("dense", "s--"), ("torch", "^-."), ("ref", "d:"))]
    for key, label, pick, style in lines:
        pts = _series(gs, pick)
        if pts:
            ax.plot([1 - s for s, _ in pts], [ms for _, ms in pts], style, color=COLORS[key],
                    label=label)
    dense_way = [r for r in (_twell_pick("auto")(g) for g in gs)
                 if r is not None and r.get("impl") == "toarray + cuBLAS"]
    if dense_way:
        ax.plot([1 - r["sparsity"] for r in dense_way], [r["ms"] for r in dense_way], "o",
                color="white", markeredgecolor=COLORS["twell"], zorder=3,
                label="twell by A.toarray() + cuBLAS (its choice)")
    _sparsity_axis(ax, sorted({g[0]["sparsity"] for g in gs}))
    m, k, n = _ffn_shape(result)
    ax.set_title(f"A @ B, bf16 activations ({m} x {k}) times a {k} x {n} matrix\n"
                 f"{result.device}", fontsize="medium")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def _ffn_shape(result):
    args = result.data.get("meta", {}).get("args", {})
    return args.get("m", "M"), args.get("k", "K"), args.get("n", "N")


def figure_pack_sparsity(result, path):
    import matplotlib.pyplot as plt

    dts = [d for d in ("bf16", "fp32")
           if groups(result.rows, "pack", ("ffn",), (d,))]
    if not dts:
        return False
    copy = result.data.get("ceilings", {}).get("copy_GBps")
    labels = {**FAMILY_LABELS, **OP_FAMILY_LABELS["pack"]}
    fig, axes = plt.subplots(1, len(dts), figsize=(4.2 * len(dts) + 1, 4.4), squeeze=False,
                             layout="constrained", sharey=True)
    for ax, dt in zip(axes[0], dts, strict=True):
        gs = groups(result.rows, "pack", ("ffn",), (dt,))
        lines = [("twell", 'twell, slots="auto"', _twell_pick("auto"), "o-"),
                 ("twell-given", "twell, slots given (no overflow)", _twell_pick("given"), "o--")]
        lines += [(f, labels.get(f, f), lambda g, f=f: best_of(g, f), style)
                  for f, style in (("torch", "^-."), ("cupyx", "v:"))]
        for key, label, pick, style in lines:
            pts = _series(gs, pick)
            if pts:
                ax.plot([1 - s for s, _ in pts], [ms for _, ms in pts], style,
                        color=COLORS[key], label=label)
        if copy:
            floor = []
            for g in gs:
                tw = _twell_pick("auto")(g)
                if tw and tw.get("bytes"):
                    floor.append((tw["sparsity"], tw["bytes"] / copy / 1e6))
            if floor:
                floor.sort()
                ax.plot([1 - s for s, _ in floor], [ms for _, ms in floor], "-",
                        color=COLORS["floor"], lw=1,
                        label="floor: bytes read and written, at the copy rate")
        _sparsity_axis(ax, sorted({g[0]["sparsity"] for g in gs}))
        ax.set_title(dt, fontsize="medium")
        ax.label_outer()
    m, k, _ = _ffn_shape(result)
    fig.suptitle(f"dense -> TwELL, {m} x {k} activations\n{result.device}", fontsize="medium")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=3,
               fontsize="small")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def figure_sci_bars(result, path):
    import matplotlib.pyplot as plt
    import numpy as np

    gs = groups(result.rows, "spmm", ("sci",))
    if not gs:
        return False
    tiles = sorted({parse_variant(r.get("variant"))[0] for g in gs for r in twell_choices(g)},
                   reverse=True)
    series = [(f"twell, tile width {t}" + (" (indexed where faster)" if i else ""),
               COLORS["twell"] if i == 0 else COLORS["twell-given"],
               lambda g, t=t: next((r for r in twell_choices(g)
                                    if parse_variant(r.get("variant"))[0] == t), None))
              for i, t in enumerate(tiles)]
    labels = {**FAMILY_LABELS, **OP_FAMILY_LABELS["spmm"]}
    series += [(labels[f], COLORS[f], lambda g, f=f: best_of(g, f))
               for f in ("torch", "cupyx") if any(best_of(g, f) for g in gs)]
    names = [f"{MATRICES.get(g[0]['matrix'], g[0]['matrix'])}, {g[0]['dtype']}, "
             f"{g[0]['param'].replace('=', ' = ')}" for g in gs]
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.42 * len(gs)), layout="constrained")
    height = 0.8 / len(series)
    for i, (label, color, pick) in enumerate(series):
        y, ms = [], []
        for k, g in enumerate(gs):
            row = pick(g)
            if row is not None:
                y.append(k + (i - (len(series) - 1) / 2) * height)
                ms.append(row["ms"])
        ax.barh(y, ms, height=height, color=color, label=label)
    ax.set_yticks(np.arange(len(gs)), names, fontsize="small")
    ax.set_ylim(len(gs) - 0.5, -0.5)
    ax.set_xscale("log")
    ax.set_xlabel("time (ms, median; log scale)")
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.set_title(f"A @ B on the scientific matrices ($10^6$ rows), N columns of B\n"
                 f"{result.device}", fontsize="medium")
    fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


FIGURES_BY_KIND = {"spmm-sparsity": figure_spmm_sparsity, "pack-sparsity": figure_pack_sparsity,
                   "sci-bars": figure_sci_bars}


# -- reStructuredText --------------------------------------------------------------------------

def list_table(header, rows, title=None, widths=None):
    """reST lines of a list-table."""
    out = [f".. list-table:: {rst_escape(title)}" if title else ".. list-table::",
           "   :header-rows: 1"]
    if widths:
        out.append("   :widths: " + " ".join(str(w) for w in widths))
    out.append("")
    def cell(c):
        return (c if isinstance(c, Markup) else rst_escape(c)) or " "

    for row in [header] + rows:
        out.append(f"   * - {cell(row[0])}")
        out += [f"     - {cell(c)}" for c in row[1:]]
    out.append("")
    return out


def no_result_line(suite):
    rerun = RERUN.get(suite)
    how = f" (``{rerun}`` makes one)" if rerun else ""
    return [f"No {SUITE_TITLES.get(suite, suite)} result yet in ``benchmarks/results/"
            f"{suite}-*.json``{how}.", ""]


def summary_lines(results):
    out = []
    if results:
        rows = []
        for r in results:
            meta = r.data.get("meta", {})
            soft = ", ".join(f"{k} {meta[k]}" for k in ("twell", "cupy", "numpy", "scipy")
                             if meta.get(k)) or f"twell {r.data.get('twell', '?')}"
            rows.append([SUITE_TITLES.get(r.suite, r.suite), r.device, soft,
                         Markup(f"``{r.where}``")])
        out += list_table(["suite", "card", "software", "file"], rows)
    for suite in SUITES:
        if not of_suite(results, suite):
            out += no_result_line(suite)
    return out


def table_lines(results, suite, options):
    found = of_suite(results, suite)
    if not found:
        return no_result_line(suite)
    out = []
    for r in found:
        if r.schema == SCHEMA:
            op = options.get("op")
            if op == "solve":
                table = solver_table(r)
                title = f"Iterative solvers (cupyx.scipy.sparse.linalg), {r.device}"
            elif op:
                table = op_table(r, op, options.get("workloads"), options.get("dtypes"),
                                 tuple(options.get("variants") or ("auto",)),
                                 "copy" in options, "include-models" in options)
                title = f"{OP_TITLES.get(op, op)}, {r.device}"
            else:
                table = pivot_table(r)
                title = f"{SUITE_TITLES.get(suite, suite)}, {r.device}: other / twell"
        elif "records" in r.data:
            table = dask_table(r)
            title = f"{r.data.get('benchmark', suite)}, {r.device}: {dask_caption(r)}"
        else:
            out += [f"``{r.where}`` has no table here (schema "
                    f"``{r.schema or 'unknown'}``).", ""]
            continue
        if table is None:
            out += [f"``{r.where}`` holds no rows for this table.", ""]
            continue
        out += list_table(*table, title=title)
    return out


def figure_lines(results, suite, kind, srcdir_figures=FIGURES):
    found = [r for r in of_suite(results, suite) if r.schema == SCHEMA]
    if not found:
        return no_result_line(suite)
    out = []
    srcdir_figures.mkdir(parents=True, exist_ok=True)
    for r in found:
        name = f"{r.path.stem}-{kind}.png"
        if FIGURES_BY_KIND[kind](r, srcdir_figures / name):
            out += [f".. figure:: /_generated/bench/{name}",
                    f"   :alt: {kind} of {r.path.name}", ""]
        else:
            out += [f"``{r.where}`` holds no rows for this plot.", ""]
    return out


def status_lines(results):
    gpu = status_result(results)
    if gpu is None:
        return no_result_line("gpu")
    return list_table(STATUS_HEADER, status_rows(gpu))


# -- Sphinx ------------------------------------------------------------------------------------

def _words(text):
    return tuple(text.split())


def setup(app):
    from docutils import nodes
    from docutils.parsers.rst import directives
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class _BenchDirective(SphinxDirective):
        option_spec = {}

        def lines(self, results):
            raise NotImplementedError

        def run(self):
            results = load_results()
            for r in results:  # rebuild the page when a results file changes
                self.env.note_dependency(str(r.path))
            node = nodes.container()
            text = StringList(self.lines(results), source="benchmarks/results")
            self.state.nested_parse(text, self.content_offset, node)
            return node.children

    class BenchSummary(_BenchDirective):
        def lines(self, results):
            return summary_lines(results)

    class BenchStatus(_BenchDirective):
        def lines(self, results):
            return status_lines(results)

    class BenchTable(_BenchDirective):
        required_arguments = 1
        option_spec = {"op": directives.unchanged, "workloads": _words, "dtypes": _words,
                       "variants": _words, "copy": directives.flag,
                       "include-models": directives.flag}

        def lines(self, results):
            return table_lines(results, self.arguments[0], self.options)

    class BenchFigure(_BenchDirective):
        required_arguments = 1
        option_spec = {"kind": lambda k: directives.choice(k, tuple(FIGURES_BY_KIND))}

        def lines(self, results):
            if "kind" not in self.options:
                raise self.error(f"bench-figure needs :kind: (one of {', '.join(FIGURES_BY_KIND)})")
            return figure_lines(results, self.arguments[0], self.options["kind"],
                                Path(self.env.srcdir) / "_generated" / "bench")

    app.add_directive("bench-summary", BenchSummary)
    app.add_directive("bench-status", BenchStatus)
    app.add_directive("bench-table", BenchTable)
    app.add_directive("bench-figure", BenchFigure)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # the README's status table, as Markdown
    sys.stdout.write(status_markdown())
