#!/usr/bin/env bash
# The whole test suite: offline unit tests and integration tests on the real default models.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
bash "$ROOT/scripts/install-browser.sh"  # Debian's chromium, for the web app's browser test
bash "$ROOT/scripts/install-ocr.sh"  # Debian's tesseract-ocr and pytesseract: the OCR extra's tests
# The llama.cpp back end's extra, which the tests cover (the demo does not need it). pip compiles
# llama.cpp from source where it finds no wheel: 15-35 min on 2 cores, once per change of the set-up.
if [[ "$(cat "$VENV/.ragspec-llamacpp" 2>/dev/null)" != "$WANT" ]]; then
    echo "[setup] installing the llama.cpp extra (first run only)" >&2
    python -m pip install -q -c "$ROOT/constraints.txt" -e "$ROOT[test,llamacpp]"
    echo "$WANT" > "$VENV/.ragspec-llamacpp"
fi
bash "$ROOT/scripts/install-vllm.sh"  # vLLM (CPU) in .venv-vllm, for tests/apps/test_vllm_engine.py
cd "$ROOT"
exec python -m pytest "$@"
