#!/usr/bin/env bash
# Install twell from this checkout and run its demo.
#
#   bash scripts/demo.sh [DEMO OPTIONS...]     e.g.  bash scripts/demo.sh --cpu
#
# Creates the virtual environment .venv in the repository root (or reuses it;
# TWELL_VENV=DIR picks another one), installs this checkout into it (a real,
# non-editable install), then runs "twell demo" with the given options: on the
# GPU when CuPy sees one, else on the CPU. CuPy is an extra: for the GPU demo,
# name it, e.g. TWELL_EXTRAS=cuda12 bash scripts/demo.sh (or cuda13).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
install_twell demo.sh "${TWELL_EXTRAS:-}"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
        && ! "$VENV/bin/python" -c "import cupy" 2>/dev/null; then
    echo "demo.sh: a GPU is present but CuPy is not installed, so the demo runs on the CPU;" \
         "for the GPU: TWELL_EXTRAS=cuda12 bash scripts/demo.sh (or cuda13)"
fi

# The console command, started outside the checkout so that nothing but the
# installed package can be imported.
cd /
"$VENV/bin/twell" demo "$@"
