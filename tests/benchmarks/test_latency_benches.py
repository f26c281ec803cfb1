"""``benchmarks/dtype_quality.py`` (generating or counting saved answers) and ``benchmarks/public_prefix_bench.py`` run as documented, at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import dtype_quality
from ragspec.backends.pytorch.forward import PROMPT_CHUNK

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


def _dtype_quality(folder: Path, args: list[str], timeout: int) -> dict:
    """``benchmarks/dtype_quality.py`` run in ``folder`` with ``args``: its JSON report."""
    out = folder / "q.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "dtype_quality.py"), *args, "--out", str(out)],
                          cwd=folder, env=ENV, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_dtype_quality_counts_labelled_answers_per_setting(tmp_path: Path) -> None:
    report = _dtype_quality(tmp_path, ["--limit", "1"], timeout=880)
    assert report["answers"] == 1
    assert report["float32"]["same_as_float32"] == 1
    assert sum(report["float32"]["verdicts"].values()) == sum(report["bf16-prompts"]["verdicts"].values()) == 1
    if not report["cpu_bf16"]:  # bf16 prompts are fp32 on such a CPU
        assert report["bf16-prompts"]["same_as_float32"] == 1



def _label(name: str, turn_id: str) -> tuple[str, str]:
    row = next(r for r in json.loads((REPO / "benchmarks" / "data" / name).read_text())["labels"] if r["id"] == turn_id)
    return row["text"], row["verdict"]


@pytest.mark.timeout(300)
def test_dtype_quality_counts_saved_answers_without_the_model(tmp_path: Path) -> None:
    right, right_verdict = _label("qa_labels.json", "kl-02")
    wrong, wrong_verdict = _label("support_labels.json", "un-01")
    assert (right_verdict, wrong_verdict) == ("right", "wrong")
    lines = ["Loading weights: 100%", json.dumps({"id": "kl-02", "float32": right, "bf16-prompts": right + " No label has this."}),
             json.dumps({"id": "un-01", "float32": wrong, "bf16-prompts": wrong}), 'float32 {"verdicts": {}}']  # fmt: skip
    (tmp_path / "answers.log").write_text("\n".join(lines) + "\n")
    report = _dtype_quality(tmp_path, ["--answers", "answers.log"], timeout=280)
    assert report["answers"] == 2
    assert report["float32"]["verdicts"] == {"right": 1, "wrong": 1} and report["float32"]["same_as_float32"] == 2
    assert report["bf16-prompts"]["verdicts"] == {"unlabelled": 1, "wrong": 1} and report["bf16-prompts"]["same_as_float32"] == 1
    assert [u["id"] for u in report["bf16-prompts"]["unlabelled"]] == ["kl-02"]
    assert report["bf16-prompts"]["unlabelled"][0]["question"].startswith("How long is the trial period")
    assert report["bf16-prompts vs float32"] == {"answers_differ": 1, "bf16-prompts_right_float32_not": 0, "float32_right_bf16-prompts_not": 1}
    (tmp_path / "empty.log").write_text("Loading weights: 100%\n")
    with pytest.raises(SystemExit, match="no answer lines"):
        dtype_quality.saved([tmp_path / "empty.log"])
    (tmp_path / "other.log").write_text(json.dumps({"id": "un-01", "float32": wrong, "bf16-prompts": right}) + "\n")
    with pytest.raises(SystemExit, match="other answers to un-01"):
        dtype_quality.saved([tmp_path / "answers.log", tmp_path / "other.log"])
    assert dtype_quality.questions(3, start=1) == dtype_quality.questions(None)[1:3]


@pytest.mark.timeout(300)
def test_the_docs_count_on_a_cpu_with_amx_is_what_the_committed_answers_and_labels_give() -> None:
    asked, answers = dtype_quality.saved([REPO / "docs" / "bench" / "dtype_quality_answers-amx.jsonl"])
    report = dtype_quality.count(asked, answers, {}, dtype_quality.labels())
    assert report["answers"] == 380
    assert report["float32"]["verdicts"] == {"right": 49, "partial": 42, "wrong": 288, "no_answer": 1}
    assert report["bf16-prompts"]["verdicts"] == {"right": 51, "partial": 44, "wrong": 284, "no_answer": 1}
    assert report["bf16-prompts vs float32"] == {"answers_differ": 100, "bf16-prompts_right_float32_not": 6,
                                                 "float32_right_bf16-prompts_not": 4}
    docs = (REPO / "docs" / "backends.md").read_text()
    assert "| fp32 | 380 | 49 | 42 | 288 | 1 | 380/380 |" in docs
    assert "| bf16 prompts, fp32 steps | 380 | 51 | 44 | 284 | 1 | 280/380 |" in docs


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_public_prefix_bench_reuses_the_fixed_part_of_every_first_question() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "public_prefix_bench.py"), "--questions", "2"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=880)  # fmt: skip
    assert done.returncode == 0, done.stderr
    public = 75 - 75 % PROMPT_CHUNK  # the template's 75 tokens, in whole prompt chunks (TorchBackend.load)
    assert f"2 first questions of new scopes (float32): {2 * public} of " in done.stdout, done.stdout


def test_no_two_label_files_give_one_text_of_one_question_different_verdicts() -> None:
    """``dtype_quality.labels`` merges every hand-label file by (question id, answer text): a conflict would let the
    file read last decide silently."""
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for name in dtype_quality.LABELS:
        for row in json.loads((dtype_quality.DATA / name).read_text())["labels"]:
            verdict, first = row["verdict"], seen.setdefault((row["id"], row["text"]), (row["verdict"], name))
            assert first[0] == verdict, f"{row['id']}: {first[1]} says {first[0]}, {name} says {verdict}"
