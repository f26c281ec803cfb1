"""Run a benchmark script as its documented command does: ``python benchmarks/NAME ...`` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, cwd: Path, timeout: float = 110, pythonpath: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/<name> <args>`` run from ``cwd``, with this tree on ``PYTHONPATH`` (its ragspec,
    whatever is installed) or, ``pythonpath=False``, with none (the script finds the repository itself)."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        environ["PYTHONPATH"] = str(REPO)
    environ.update(env)
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / name), *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
