"""``python benchmarks/batch_forward.py`` (the command docs/serving.md gives) at a tiny size."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.timeout(300)
def test_the_documented_command_times_each_batch_and_row_count(tmp_path: Path) -> None:
    done = run_script("batch_forward.py", "--context", "16", "--batches", "1", "2", "--rows", "1", "3", "--repeat", "2",
                      cwd=tmp_path, timeout=280, HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [tuple(line.split(" | ")[:2]) for line in rows] == [("| 1", "1"), ("| 1", "2"), ("| 3", "1"), ("| 3", "2")]
    assert "lean Llama forward (" in done.stdout and " products" in done.stdout and ", prompts: " in done.stdout
