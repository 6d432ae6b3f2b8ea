"""The ``>>>`` examples of the documentation pages (docs/*.rst) run as doctests, on the CPU.

Sphinx only renders these pages; this test keeps their examples true. The figures on the pages
come from plot directives, which the documentation build itself runs (scripts/build_docs.sh).
"""

import doctest
import importlib.util
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.rst")) if DOCS.is_dir() else []

# Pages whose examples run Dask, an optional extra (pip install 'twell[dask]').
DASK_PAGES = {"dask.rst"}
HAVE_DASK = importlib.util.find_spec("dask") is not None


@pytest.mark.skipif(not PAGES, reason="no docs/ folder beside tests/ (not a checkout)")
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_examples(page):
    if page.name in DASK_PAGES and not HAVE_DASK:
        pytest.skip("dask is not installed (pip install 'twell[dask]')")
    results = doctest.testfile(
        str(page), module_relative=False, verbose=False, report=True,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert results.failed == 0, f"{results.failed} example(s) of {page.name} failed (see above)"
