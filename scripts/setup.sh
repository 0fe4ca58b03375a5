#!/usr/bin/env bash
# Create .venv and install optlab with its dev tools. torch is pinned to the CPU build
# through constraints.txt: an unpinned resolve would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV="${VENV:-.venv}"
STAMP="$VENV/.optlab-installed"
WANT="$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -c constraints.txt -e '.[dev]'
echo "$WANT" > "$STAMP"
echo "optlab installed in $VENV ($("$VENV/bin/optlab" --version))"
