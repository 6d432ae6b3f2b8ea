"""The documentation pages: their ``>>>`` examples run as doctests (on the CPU), and the
``twell_bench`` extension (docs/_ext/) turns benchmark results into tables and plots.

Sphinx only renders the pages; these tests keep their examples true. The figures on the pages
come from plot directives and from twell_bench, which the documentation build itself runs
(scripts/build_docs.sh).
"""

import copy
import doctest
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.rst")
               if not {"_build", "_generated"} & set(p.relative_to(DOCS).parts)) \
    if DOCS.is_dir() else []
PAGE_IDS = [p.relative_to(DOCS).as_posix() for p in PAGES]

# Pages whose examples run Dask, an optional extra (pip install 'twell[dask]').
DASK_PAGES = {"dask.rst"}
HAVE_DASK = importlib.util.find_spec("dask") is not None
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

EXTENSION = DOCS / "_ext" / "twell_bench.py"
RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.skipif(not PAGES, reason="no docs/ folder beside tests/ (not a checkout)")
@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_page_examples(page):
    if page.relative_to(DOCS).as_posix() in DASK_PAGES and not HAVE_DASK:
        pytest.skip("dask is not installed (pip install 'twell[dask]')")
    results = doctest.testfile(
        str(page), module_relative=False, verbose=False, report=True,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert results.failed == 0, f"{results.failed} example(s) of {page.name} failed (see above)"


# -- the twell_bench extension ------------------------------------------------------------------

@pytest.fixture(scope="module")
def bench():
    if not EXTENSION.is_file():
        pytest.skip("no docs/_ext/twell_bench.py beside tests/ (not a checkout)")
    spec = importlib.util.spec_from_file_location("twell_bench", EXTENSION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(case, op, family, ms, *, variant="", contender=None, status="ok", matrix=None,
         workload="sci", dtype="fp64", param="", sparsity=None):
    return {"case": case, "workload": workload, "dtype": dtype, "label": matrix or "",
            "sparsity": sparsity, "matrix": matrix, "op": op, "param": param,
            "contender": contender or family, "family": family, "variant": variant,
            "impl": "", "status": status, "ms": ms}


def _cpu_result(tmp_path):
    """A CPU suite result in the twell-bench/1 schema: twell against scipy on two matrices."""
    rows = [
        _row("cpu-poisson", "spmv", "twell", 2.0, variant="T=65536 S=auto(5)", matrix="poisson"),
        _row("cpu-poisson", "spmv", "scipy", 1.0, contender="scipy csr", matrix="poisson"),
        _row("cpu-poisson", "spmm", "twell", 4.0, variant="T=65536 S=auto(5)", matrix="poisson",
             param="N=64"),
        _row("cpu-poisson", "spmm", "scipy", 6.0, contender="scipy csr", matrix="poisson",
             param="N=64"),
        _row("cpu-graph", "spmv", "twell", 3.0, variant="T=65536 S=auto(9)", matrix="graph"),
        _row("cpu-graph", "spmv", "twell", 1.0, variant="T=4096 S=7", matrix="graph"),
        _row("cpu-graph", "spmv", "scipy", 1.5, contender="scipy csr", matrix="graph"),
        _row("cpu-graph", "spmv", "scipy", 9.0, contender="scipy csr", matrix="graph",
             status="skipped"),
    ]
    data = {"schema": "twell-bench/1", "meta": {"card": "2 CPU cores", "twell": "0.1.0"},
            "rows": rows}
    (tmp_path / "cpu-2core.json").write_text(json.dumps(data))
    return data


def test_results_are_grouped_by_suite_and_card(bench, tmp_path):
    _cpu_result(tmp_path)
    (tmp_path / "gpu-h100.json").write_text(json.dumps({"schema": "twell-bench/1", "rows": []}))
    (tmp_path / "dask-h200.json").write_text(json.dumps({"records": []}))
    found = bench.load_results(tmp_path)
    assert [(r.suite, r.card) for r in found] == [("gpu", "h100"), ("cpu", "2core"),
                                                   ("dask", "h200")]
    assert found[0].device == "NVIDIA H100"  # from the card's short name: the JSON has none
    text = "\n".join(bench.summary_lines(found))
    assert "result yet" not in text  # every suite has one


def test_status_reads_the_status_cards_result_when_there_are_several(bench, tmp_path):
    cards = ("a100", "h100", "h200")
    assert bench.STATUS_CARD in cards[1:]
    for card in cards:
        (tmp_path / f"gpu-{card}.json").write_text(json.dumps(
            {"schema": "twell-bench/1", "meta": {"card": card}, "rows": []}))
    assert bench.status_result(bench.load_results(tmp_path)).card == bench.STATUS_CARD
    (tmp_path / f"gpu-{bench.STATUS_CARD}.json").unlink()
    assert bench.status_result(bench.load_results(tmp_path)).card == "a100"


def test_cpu_suite_pivot_gives_scipy_over_twell(bench, tmp_path):
    _cpu_result(tmp_path)
    (result,) = bench.load_results(tmp_path)
    header, rows = bench.pivot_table(result)
    assert header == ["operation", "fp64 power-law graph", "fp64 Poisson stencil",
                      "fp64 Poisson stencil, N=64"]
    cells = {row[0]: row[1:] for row in rows}
    # The graph's SpMV: twell "auto" (3.0 ms) against scipy's ok row (1.5 ms; the skipped 9.0
    # does not count): 0.50, not the slots-given 1.0 ms and not bold (twell slower).
    assert cells["A @ x"] == ["0.50", "0.50", bench.NONE]
    assert cells["A @ B"] == [bench.NONE, bench.NONE, "**1.50**"]


def test_op_table_ratios_are_other_over_twell(bench, tmp_path):
    _cpu_result(tmp_path)
    (result,) = bench.load_results(tmp_path)
    header, rows = bench.op_table(result, "spmv", variants=("auto", "given"))
    assert header[-1] == "vs scipy.sparse"
    by_layout = {row[3]: row for row in rows}
    assert by_layout["T=65536 S=auto(9)"][-1] == "0.50"
    assert by_layout["T=4096 S=7"][-1] == "**1.50**"


def test_a_suite_without_results_says_so_in_one_line(bench, tmp_path):
    lines = bench.table_lines(bench.load_results(tmp_path), "cpu", {})
    text = " ".join(lines).strip()
    assert text.startswith("No CPU suite result yet") and text.count(".") >= 1
    assert "python benchmarks/bench.py --cpu" in text


@pytest.mark.skipif(not (RESULTS / "gpu-h200.json").is_file(), reason="no GPU result committed")
def test_readme_status_table_is_the_gpu_result(bench):
    """README.md's status table is the one the extension makes from the GPU result: when a
    new result lands, ``python docs/_ext/twell_bench.py`` prints the table to paste."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    expected = bench.status_markdown(bench.load_results(RESULTS)).strip()
    assert expected in readme, f"README's status table is stale; it should read:\n{expected}"


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib is not installed")
@pytest.mark.skipif(not (RESULTS / "gpu-h200.json").is_file(), reason="no GPU result committed")
@pytest.mark.parametrize("kind", ["spmm-sparsity", "pack-sparsity", "sci-bars"])
def test_figures_draw_from_the_gpu_result(bench, kind, tmp_path):
    (gpu,) = [r for r in bench.load_results(RESULTS) if r.suite == "gpu" and r.card == "h200"]
    path = tmp_path / f"{kind}.png"
    assert bench.FIGURES_BY_KIND[kind](gpu, path)
    assert path.stat().st_size > 10_000
    empty = copy.copy(gpu)
    empty.data = {**gpu.data, "rows": []}
    assert not bench.FIGURES_BY_KIND[kind](empty, tmp_path / "none.png")


@pytest.mark.skipif(not (RESULTS / "gpu-h200.json").is_file(), reason="no GPU result committed")
def test_gpu_tables_match_the_rows(bench):
    """A table cell against the row it comes from: the bf16 SpMM at 99%, ffn workload."""
    (gpu,) = [r for r in bench.load_results(RESULTS) if r.suite == "gpu" and r.card == "h200"]
    header, rows = bench.op_table(gpu, "spmm", workloads=("ffn",), dtypes=("bf16",))
    row = next(r for r in rows if r[2] == "99%")
    twell = next(r for r in gpu.rows if r["op"] == "spmm" and r["case"] == "ffn-0.99-bf16"
                 and r["family"] == "twell" and "auto" in r["variant"])
    dense = min(r["ms"] for r in gpu.rows if r["op"] == "spmm" and r["case"] == "ffn-0.99-bf16"
                and r["family"] == "dense" and r["status"] == "ok")
    assert row[header.index("twell (ms)")] == f"{twell['ms']:.3g}"
    cell = row[header.index("vs dense cuBLAS")]
    assert float(re.sub(r"[*~]", "", cell)) == pytest.approx(dense / twell["ms"], abs=0.006)
