"""The Predicted Outputs benchmark at a tiny size: both arms run, give the same tokens, and report the
prediction's counts as ``/v1`` does (the measurements themselves are not tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.prediction_bench import FILES, benchmark, summarize
from tests.benchmarks.scripts import run_script


@pytest.mark.timeout(300)
def test_both_arms_run_and_give_the_same_tokens(lc_tiny_model: Any) -> None:
    report = benchmark(lc_tiny_model, files=2, repeats=1, max_tokens=12)
    assert report["identical"] == "2/2"
    pred, base = report["arms"]["with_prediction"], report["arms"]["without_prediction"]
    assert pred["requests"] == base["requests"] == 2 and pred["new_tokens"] == base["new_tokens"]
    assert pred["accepted_prediction_tokens"] + pred["rejected_prediction_tokens"] >= 0
    assert "accepted_prediction_tokens" not in base


def test_summary_arithmetic() -> None:
    rows = [{"new_tokens": 11, "wall_s": 2.0, "ttft_s": 1.0, "forwards": 5, "accepted_prediction_tokens": 6, "rejected_prediction_tokens": 2},
            {"new_tokens": 21, "wall_s": 4.0, "ttft_s": 1.0, "forwards": 11, "accepted_prediction_tokens": 10, "rejected_prediction_tokens": 0}]  # fmt: skip
    s = summarize(rows)
    assert s["median_s"] == 3.0 and s["decode_tokens_per_s"] == pytest.approx(30 / 4) and s["tokens_per_forward"] == 2.0
    assert (s["accepted_prediction_tokens"], s["rejected_prediction_tokens"], s["accepted_share"]) == (16, 2, 0.5)
    assert len(FILES) >= 3


@pytest.mark.timeout(120)
def test_the_documented_command_runs_from_any_folder(tmp_path: Path) -> None:
    done = run_script("prediction_bench.py", "--help", cwd=tmp_path, pythonpath=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: benchmarks/prediction_bench.py") and "--max-tokens" in done.stdout


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_the_documented_command_measures_both_arms_at_a_tiny_size(tmp_path: Path) -> None:
    """docs/serving.md's command (without the bench lock, which only serializes quiet runs) on the
    default model, one file, one round, 8 tokens: it prints and writes the report the docs describe."""
    out = tmp_path / "prediction.json"
    done = run_script("prediction_bench.py", "--files", "1", "--repeats", "1", "--max-tokens", "8", "--out", str(out),
                      cwd=tmp_path, timeout=880)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(done.stdout[done.stdout.index("{"):]) == report
    assert report["model"] == "SmolLM2-135M-Instruct" and report["identical"] == "1/1"
    pred, base = report["arms"]["with_prediction"], report["arms"]["without_prediction"]
    assert pred["requests"] == base["requests"] == 1 and pred["new_tokens"] == base["new_tokens"] == 8
    assert {"accepted_prediction_tokens", "rejected_prediction_tokens", "accepted_share"} <= set(pred)
