"""Sphinx configuration of the twell documentation.

Build: ``bash scripts/build_docs.sh`` (sphinx-build -W --keep-going -b html docs docs/_build/html
in the project's virtual environment). Every figure is drawn at build time: by the plot directive
from code shown on the page, with the installed twell, and by the ``twell_bench`` extension
(``docs/_ext/``) from the benchmark results in ``benchmarks/results/*.json``, as are the tables of
those results. Nothing is fetched from the network (no intersphinx).
"""

import sys
from pathlib import Path

import twell

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "twell"
author = "the twell authors"
copyright = "2026, the twell authors"  # noqa: A001 - Sphinx's name
release = twell.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "matplotlib.sphinxext.plot_directive",
    "twell_bench",
]

# _generated: the benchmark figures that twell_bench writes while reading a page.
exclude_patterns = ["_build", "_generated"]
templates_path = []
root_doc = "index"
default_role = "code"

# -- autodoc / autosummary / numpydoc ---------------------------------------------------------
try:  # twell.torch's classes subclass torch's: a stand-in where PyTorch is not installed
    import torch  # noqa: F401
except ImportError:
    autodoc_mock_imports = ["torch"]
autosummary_generate = False  # the API page documents every object itself: no stub files
autodoc_member_order = "groupwise"
autodoc_default_options = {"undoc-members": False}
numpydoc_show_class_members = False  # members are listed by autodoc's :members:
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()

# -- matplotlib's plot directive --------------------------------------------------------------
plot_include_source = True
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 130)]
plot_rcparams = {"savefig.bbox": "tight", "savefig.pad_inches": 0.1}
plot_apply_rcparams = True
# Each page's code imports what it uses; this only keeps figures off any screen.
plot_pre_code = "import matplotlib\nmatplotlib.use('Agg')\n"

# -- HTML ---------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"twell {release}"
html_static_path = []
html_theme_options = {"navigation_with_keys": True}
