"""``benchmarks/proposer_cost.py`` runs end to end at a tiny size, in vLLM's venv as documented."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ragspec.backends.vllm.server import VllmError, find_python

ROOT = Path(__file__).resolve().parents[2]


def _vllm_python() -> Path | None:
    try:
        return find_python()
    except VllmError:
        return None


@pytest.mark.skipif(_vllm_python() is None, reason="vLLM is not installed here: scripts/install-vllm.sh makes .venv-vllm")
@pytest.mark.timeout(600)
def test_the_proposer_cost_benchmark_runs_both_proposers_on_the_same_batches(tmp_path: Path) -> None:
    from ragspec.backends.pytorch.loading import model_folder

    out = tmp_path / "cost.json"
    command = [str(_vllm_python()), "benchmarks/proposer_cost.py", "--rows", "1", "3", "--steps", "6", "--warmup", "2",
               "--tokenizer", str(model_folder("default")), "--json", str(out), "--clock", "thread"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["rows"] for r in report["results"]] == [1, 3]
    for r in report["results"]:
        assert r["steps"] == 6 and r["clock"] == "thread"
        for name in ("ragspec", "vllm"):  # each kernel timed inside its own whole step
            assert 0 < r[f"{name}_kernel_median_ms"] <= r[f"{name}_step_median_ms"]
            assert 0 < r[f"{name}_kernel_ms"] <= r[f"{name}_step_ms"]
        assert r["step_ratio"] == r["ragspec_step_median_ms"] / r["vllm_step_median_ms"] and r["kernel_ratio"] > 0
        assert r["ragspec_drafted_per_step"] > 0 and r["vllm_drafted_per_step"] > 0
        assert 0 < r["ragspec_share"] < 1 and 6 < r["gpu_step_ms"] < 7  # the H100 estimate for 1 to 3 rows
    assert "ragspec_step" in done.stdout and "kernel ratio" in done.stdout and report["cpu_features"]
