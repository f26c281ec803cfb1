"""The draft head's training command at a tiny size: it writes a head the generator loads, and the bundled
head is the one it documents."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors import safe_open

from ragspec.backends.models import DEFAULT_MODEL_NAME
from ragspec.decoding.draft_head import head_path
from tests.benchmarks.scripts import run_script


@pytest.mark.timeout(600)
def test_the_documented_command_writes_a_head_the_generator_drafts_with(tmp_path: Path) -> None:
    out = tmp_path / "head.safetensors"
    done = run_script("train_draft_head.py", "--limit", "10", "--epochs", "1", "--vocab", "64", "--out", str(out),
                      cwd=tmp_path, pythonpath=False, timeout=540)
    assert done.returncode == 0, done.stderr
    assert "epoch 1: loss" in done.stdout and "held-out answer positions" in done.stdout and f"wrote {out}" in done.stdout
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["model"] == DEFAULT_MODEL_NAME and f.get_tensor("vocab").shape == (64,)

    from ragspec.decoding.draft_head import HeadDrafter
    from ragspec.decoding.generator import SpeculativeGenerator

    gen = SpeculativeGenerator("default", device="cpu", dtype="float32", backend="torch", draft_head=out)
    assert isinstance(gen.drafter.model, HeadDrafter) and len(gen.drafter.model.head.vocab) == 64
    plain = gen.generate("Where is Marrowford?", max_new_tokens=12, speculation=False).token_ids
    assert gen.generate("Where is Marrowford?", max_new_tokens=12).token_ids == plain


def test_the_bundled_head_says_how_it_was_trained() -> None:
    with safe_open(str(head_path(DEFAULT_MODEL_NAME)), "pt") as f:
        meta = f.metadata()
    assert meta["model"] == DEFAULT_MODEL_NAME and meta["sets"] == "support,fresh2,fresh3,head"
    assert not {"heldout", "fresh"} & set(meta["sets"].split(","))  # the unseen-question sets stay unseen
    assert float(meta["training_accuracy"]) > 0.5 and 0.3 < float(meta["held_out_accuracy"]) < 1


def test_training_answers_leave_out_every_unseen_question() -> None:
    """fresh2 answered fresh_questions.json's questions; they must not train the head the speed is measured with."""
    import json

    from benchmarks.train_draft_head import DATA, SETS, UNSEEN, records

    unseen = {q["question"] for f in UNSEEN for q in json.loads((DATA / f).read_text())["questions"]}
    raw = [a for s in SETS for a in json.loads((DATA / f"{s}_answers.json").read_text())["answers"]]
    assert any(a["question"] in unseen for a in raw)  # the raw sets do hold some
    kept = records(list(SETS))
    assert kept and not any(a["question"] in unseen for a in kept)
    assert len(kept) == sum(a["question"] not in unseen for a in raw)
    assert all(p["text"] and "source" in p for a in kept for p in a["passages"])  # chunk indexes resolved
