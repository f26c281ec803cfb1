#!/usr/bin/env bash
# Installs the OCR extra: Debian's Tesseract (with its English data) and pytesseract in the venv on
# PATH (scripts/test.sh runs this after bootstrap.sh). Idempotent: a no-op when both are there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v tesseract >/dev/null 2>&1 || [[ ! -d /usr/share/tesseract-ocr ]]; then
    SUDO=$([[ "$(id -u)" -ne 0 ]] && echo sudo || true)
    echo "[setup] installing tesseract-ocr (Debian package) for OCR" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq tesseract-ocr tesseract-ocr-eng >/dev/null
fi
if ! python -c "import pytesseract" 2>/dev/null; then
    echo "[setup] installing the ocr extra (pytesseract)" >&2
    python -m pip install -q -c "$ROOT/constraints.txt" "pytesseract>=0.3.10"  # the ocr extra of pyproject.toml
fi
tesseract --version >/dev/null
