"""``python benchmarks/head_accuracy.py`` (the command docs/model-drafter.md gives) at a tiny size."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.timeout(300)
def test_the_documented_command_counts_the_same_guesses_both_ways(tmp_path: Path) -> None:
    done = run_script("head_accuracy.py", "--questions", "1", "--max-new-tokens", "6", "--dtype", "float32",
                      cwd=tmp_path, timeout=280, HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr[-2000:]
    loop = re.search(r"in the loop: (\d+)/(\d+) right", done.stdout)
    whole = re.search(r"one forward over prompt and answer: (\d+)/(\d+) right", done.stdout)
    assert loop and whole, done.stdout
    # Every step after the first token is guessed once each way (up to 5 of them, fewer if the answer ends).
    assert 1 <= int(loop[2]) == int(whole[2]) <= 5
    assert 0 <= int(loop[1]) <= int(loop[2]) and 0 <= int(whole[1]) <= int(whole[2])
