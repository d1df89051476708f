# Sourced by scripts/fairq and scripts/test: make .venv (Python >= 3.11) and install this
# checkout into it with the given extras, again only when pyproject.toml changed.
# shellcheck shell=bash

FAIRQ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FAIRQ_VENV:-$FAIRQ_ROOT/.venv}"

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "fairq needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
    return 1
}

ensure_venv() {
    local extras="$1" python stamp want
    if [ ! -x "$VENV/bin/python" ]; then
        python="$(find_python)"
        echo "creating $VENV with $python" >&2
        "$python" -m venv "$VENV"
    fi
    stamp="$VENV/.fairq-installed-${extras//,/-}"
    want="$(sha256sum <"$FAIRQ_ROOT/pyproject.toml" | cut -c1-16)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "installing fairq[$extras] into $VENV (quietly; takes a minute the first time)" >&2
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
            -e "$FAIRQ_ROOT[$extras]" >&2
        echo "$want" >"$stamp"
    fi
}
