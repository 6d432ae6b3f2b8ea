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

source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
install_twell test.sh test
PY=$VENV/bin/python

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
