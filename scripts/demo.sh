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

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TWELL_VENV:-$ROOT/.venv}
cd "$ROOT"

if ! "$VENV/bin/python" -c "" 2>/dev/null; then
    echo "demo.sh: creating the virtual environment $VENV"
    "${PYTHON:-python3}" -m venv --clear "$VENV"
fi

echo "demo.sh: installing twell from $ROOT into $VENV"
# Build from a snapshot of the working tree (tracked files and untracked ones
# that git does not ignore), as from a fresh clone: setuptools never clears its
# build/ folder in the source tree, so a module deleted from twell/ would live
# on in the wheel, and two builds in one checkout at once would collide there.
SRC=$ROOT
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    SRC=$(mktemp -d)
    trap 'rm -rf "$SRC"' EXIT
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do
            if [ -e "$f" ]; then printf '%s\0' "$f"; fi  # skip deleted, uncommitted files
        done |
        tar --null -T - -cf - | tar -xf - -C "$SRC"
fi
(cd "$SRC" && "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    ".${TWELL_EXTRAS:+[$TWELL_EXTRAS]}")

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
        && ! "$VENV/bin/python" -c "import cupy" 2>/dev/null; then
    echo "demo.sh: a GPU is present but CuPy is not installed, so the demo runs on the CPU;" \
         "for the GPU: TWELL_EXTRAS=cuda12 bash scripts/demo.sh (or cuda13)"
fi

# The console command, started outside the checkout so that nothing but the
# installed package can be imported.
cd /
"$VENV/bin/twell" demo "$@"
