"""``python benchmarks/parse_limits.py`` (the command docs/retrieval.md gives) at a tiny scale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_documented_command_measures_each_shape_it_is_given(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "parse_limits.py"), "--scale", "0.001",
               "--only", "docx-5", "xlsx-170", "docx-lying"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split(" | ")[0].strip("| "): line for line in done.stdout.splitlines() if line.startswith("| ") and " KiB " in line}
    assert set(rows) == {"docx-5", "xlsx-170", "docx-lying"}, done.stdout
    assert rows["docx-5"].endswith("| 1 parts |") and rows["xlsx-170"].endswith("| 1 parts |")
    assert "skipped: not readable as a Word document (.docx): BadZipFile: Bad CRC-32" in rows["docx-lying"]
