"""The docstring examples of every twell module run as doctests (on the CPU)."""

import doctest
import importlib
import importlib.util
import pkgutil

import numpy as np
import pytest

import twell

# Modules that need CuPy to import; their examples would need a GPU.
GPU_MODULES = {"twell._cuda." + name for name in (
    "_backend", "_canonical", "_cast", "_ffn", "_launch", "_pack", "_reduce", "_spmm", "_unpack")}

MODULES = sorted(
    {"twell"} | {m.name for m in pkgutil.walk_packages(twell.__path__, prefix="twell.")}
    - GPU_MODULES
)


# Modules whose examples draw with matplotlib, an optional extra.
PLOT_MODULES = {"twell.plot"}
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

# Modules whose examples run Dask, an optional extra (the modules import without it).
DASK_MODULES = {"twell.dask"}
HAVE_DASK = importlib.util.find_spec("dask") is not None


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name):
    if name in PLOT_MODULES and not HAVE_MATPLOTLIB:
        pytest.skip("matplotlib is not installed (pip install 'twell[plot]')")
    if name in DASK_MODULES and not HAVE_DASK:
        pytest.skip("dask is not installed (pip install 'twell[dask]')")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for test in finder.find(module, name, globs={"np": np}):
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, "".join(report)


def test_public_classes_have_examples():
    """numpydoc Examples on the public classes (STYLE.md): they must exist to be run."""
    finder = doctest.DocTestFinder()
    for obj in (twell.TwELLMatrix, twell.ELLMatrix):
        tests = [t for t in finder.find(obj) if t.name.endswith(obj.__name__)]
        assert tests and tests[0].examples, f"{obj.__name__} has no docstring examples"
