"""benchmarks/step_timing: the per-step timers put inside vLLM's processes, and their table."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "benchmarks" / "step_timing"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"step_timing_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_wrapped_method_is_timed_per_step_and_the_table_gives_its_median(tmp_path, capsys) -> None:
    timers = _load("sitecustomize")
    recorder = timers._Recorder(str(tmp_path))

    class GPUModelRunner:
        vllm_config = SimpleNamespace(speculative_config=None)

        def execute_model(self) -> int:
            time.sleep(0.002)
            return 7

    timers._wrap(recorder, GPUModelRunner, "execute_model")
    runner = GPUModelRunner()
    assert [runner.execute_model() for _ in range(10)] == [7] * 10
    steps = json.loads((tmp_path / f"worker-none-{os.getpid()}.json").read_text())["steps"]
    assert len(steps) == 10 and all(s["GPUModelRunner.execute_model"] >= 2_000_000 for s in steps)
    assert _load("table").main([str(tmp_path), "--skip", "2"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "execute_model" in line)
    assert float(row.split("|")[2]) >= 2000.0  # µs


@pytest.mark.timeout(120)
def test_the_import_hook_wraps_the_named_methods_only_when_asked(tmp_path) -> None:
    code = ("from ragspec.backends.vllm.proposer import RagspecProposer as P; "
            "print(hasattr(P.propose, '__wrapped__'))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FOLDER)])}
    for out, wrapped in ((str(tmp_path), "True"), ("", "False")):
        got = subprocess.run([sys.executable, "-c", code], env={**env, "STEP_TIMING_OUT": out}, capture_output=True,
                             text=True, timeout=100, check=True)
        assert got.stdout.strip() == wrapped, got.stderr
