#!/usr/bin/env bash
# Set up, then run the whole test suite (plus lint and types). Store tests also run on a
# private PostgreSQL cluster when the PostgreSQL server binaries are on this machine.
# Arguments go to pytest: `make test-fast` passes -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
PY="$PWD/.venv/bin/python"

PGDIR=""
PGBIN=""
cleanup() {
    if [[ -n "$PGDIR" ]]; then
        runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDIR/data" -m fast stop >/dev/null 2>&1 || true
        rm -rf "$PGDIR"
    fi
}
trap cleanup EXIT
if [[ -z "${OPTLAB_TEST_POSTGRES_URL:-}" ]]; then
    source scripts/postgres.sh
    start_private_postgres || echo "PostgreSQL not available: its store tests will be skipped"
fi

"$PY" -m ruff check .
"$PY" -m mypy
"$PWD/.venv/bin/lint-imports"
"$PY" -m pytest "$@"
