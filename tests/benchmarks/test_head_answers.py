"""``python benchmarks/head_answers.py`` (the draft head's training text, docs/model-drafter.md) at a tiny size, and
the questions it asks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.head_answers import UNSEEN, DATA, questions
from tests.benchmarks.scripts import run_script


def test_questions_cover_the_corpus_and_none_is_an_unseen_question() -> None:
    asked = questions(400)
    assert len(asked) == len(set(asked)) >= 200  # every chunk's sentences, round-robin, no repeats
    assert asked == questions(400)  # the same every time (seeded)
    unseen = {q["question"] for f in UNSEEN for q in json.loads((DATA / f).read_text())["questions"]}
    assert not set(asked) & unseen
    assert all(q.endswith(("?", ".")) and len(q.split()) >= 3 for q in asked)


@pytest.mark.timeout(300)
def test_the_documented_command_records_answers_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "head.json"
    done = run_script("head_answers.py", "--questions", "2", "--max-tokens", "8", "--out", str(out), cwd=tmp_path,
                      timeout=280, HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert [a["question"] for a in record["answers"]] == questions(2)
    for a in record["answers"]:
        assert a["passages"] and all(0 <= p < len(record["chunks"]) for p in a["passages"])
    assert all(c["source"] and c["text"] for c in record["chunks"])
    again = run_script("head_answers.py", "--questions", "2", "--max-tokens", "8", "--out", str(out), cwd=tmp_path,
                       timeout=280, HF_HUB_OFFLINE="1")
    assert again.returncode == 0 and json.loads(out.read_text()) == record  # answered questions are not asked again
