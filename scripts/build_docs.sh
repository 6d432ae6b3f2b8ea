#!/usr/bin/env bash
# Build the HTML documentation with warnings as errors, against a real install of this checkout.
#
#   bash scripts/build_docs.sh [SPHINX-BUILD ARGS...]
#
# Creates the virtual environment .venv in the repository root (or reuses it; TWELL_VENV=DIR
# picks another one, as .ci/run does), installs ".[docs]" into it (sphinx, numpydoc, furo,
# matplotlib), then runs
#
#   sphinx-build -W --keep-going -b html docs docs/_build/html
#
# from a clean docs/_build (an incremental build would not repeat the warnings of unchanged
# pages). Every figure is drawn while building, by matplotlib's plot directive, from the code
# on the page; nothing is fetched from the network. Open docs/_build/html/index.html.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
install_twell build_docs.sh docs

rm -rf docs/_build
# The sphinx-build executable (not "python -m sphinx", which would put the checkout's twell/
# first on sys.path) documents the installed package.
MPLBACKEND=Agg "$VENV/bin/sphinx-build" -W --keep-going -b html docs docs/_build/html "$@"
echo "build_docs.sh: docs/_build/html/index.html"
