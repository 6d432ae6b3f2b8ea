#!/usr/bin/env bash
# Run twell's test suite against a real, non-editable install of this checkout.
#
#   bash scripts/test.sh [PYTEST ARGS...]     e.g.  bash scripts/test.sh -x -k packed
#
# Creates the virtual environment .venv in the repository root (or reuses it;
# TWELL_VENV=DIR picks another one, as .ci/run does), installs ".[test]" into
# it, then runs pytest from the repository root; extra arguments go to pytest.
# Exit status: pytest's, except that "no tests collected" (5) is a failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TWELL_VENV:-$ROOT/.venv}
cd "$ROOT"

if ! "$VENV/bin/python" -c "" 2>/dev/null; then
    echo "test.sh: creating the virtual environment $VENV"
    "${PYTHON:-python3}" -m venv --clear "$VENV"
fi
PY=$VENV/bin/python

echo "test.sh: installing twell[test] from $ROOT into $VENV"
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
(cd "$SRC" && "$PY" -m pip install --quiet --disable-pip-version-check \
    ".[test]")

# Test the installed package, not the checkout's twell/ folder. Both
# "python -m pytest" (the working directory first on sys.path) and pytest's
# default import mode (the repository root on sys.path when tests/ is a
# package) would let the checkout shadow it. So this drops the working
# directory from sys.path, imports twell, checks that it comes from the
# virtual environment, and only then runs pytest in the same process: later
# "import twell" statements find the module already loaded, whatever pytest
# does to sys.path.
SCRIPT=$(cat <<'EOF'
import os
import sys

sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]

import pytest
import twell

where = os.path.realpath(twell.__file__)
print(f"test.sh: testing twell {twell.__version__} from {where}", flush=True)
if not where.startswith(os.path.realpath(sys.prefix) + os.sep):
    sys.exit(f"test.sh: twell was imported from {where}, not from the environment {sys.prefix}")
sys.exit(int(pytest.main(sys.argv[1:])))
EOF
)
# Tests that start "python -m twell" in a subprocess get the same protection
# on Python >= 3.11: PYTHONSAFEPATH keeps the working directory off sys.path.
set +e
PYTHONSAFEPATH=1 "$PY" -c "$SCRIPT" -q "$@"
rc=$?
set -e

if [ "$rc" -eq 5 ]; then
    echo "test.sh: FAILED: pytest collected no tests (exit status 5)" >&2
    exit 1
fi
exit "$rc"
