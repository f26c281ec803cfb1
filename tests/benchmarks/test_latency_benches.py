"""``benchmarks/dtype_quality.py`` and ``benchmarks/public_prefix_bench.py`` run as documented, at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragspec.backends.pytorch.forward import PROMPT_CHUNK

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_dtype_quality_counts_labelled_answers_per_setting(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "dtype_quality.py"), "--limit", "1", "--out", str(out)],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=880)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["answers"] == 1
    assert report["float32"]["same_as_float32"] == 1
    assert sum(report["float32"]["verdicts"].values()) == sum(report["bf16-prompts"]["verdicts"].values()) == 1
    if not report["cpu_bf16"]:  # bf16 prompts are fp32 on such a CPU
        assert report["bf16-prompts"]["same_as_float32"] == 1


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_public_prefix_bench_reuses_the_fixed_part_of_every_first_question() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "public_prefix_bench.py"), "--questions", "2"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=880)  # fmt: skip
    assert done.returncode == 0, done.stderr
    public = 75 - 75 % PROMPT_CHUNK  # the template's 75 tokens, in whole prompt chunks (TorchBackend.load)
    assert f"2 first questions of new scopes (float32): {2 * public} of " in done.stdout, done.stdout
