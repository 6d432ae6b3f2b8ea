# Shared by scripts/*.sh (sourced, not run): make the virtual environment and install this
# checkout into it, non-editable.
#
#   source scripts/_venv.sh; install_twell NAME EXTRAS
#
# Sets ROOT (the repository root, also the working directory) and VENV (.venv in the root, or
# TWELL_VENV). EXTRAS is pip's extras text without brackets ("" for none, e.g. "test").

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TWELL_VENV:-$ROOT/.venv}
cd "$ROOT"

install_twell() {
    local name=$1 extras=$2
    if ! "$VENV/bin/python" -c "" 2>/dev/null; then
        echo "$name: creating the virtual environment $VENV"
        "${PYTHON:-python3}" -m venv --clear "$VENV"
    fi
    echo "$name: installing twell${extras:+[$extras]} from $ROOT into $VENV"
    # Build from a snapshot of the working tree (tracked files and untracked ones that git
    # does not ignore), as from a fresh clone: setuptools never clears its build/ folder in
    # the source tree, so a module deleted from twell/ would live on in the wheel, and two
    # builds in one checkout at once would collide there.
    local src=$ROOT
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        src=$(mktemp -d)
        git ls-files -z --cached --others --exclude-standard |
            while IFS= read -r -d '' f; do
                if [ -e "$f" ]; then printf '%s\0' "$f"; fi  # skip deleted, uncommitted files
            done |
            tar --null -T - -cf - | tar -xf - -C "$src"
    fi
    (cd "$src" && "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        ".${extras:+[$extras]}")
    if [ "$src" != "$ROOT" ]; then rm -rf "$src"; fi
}
