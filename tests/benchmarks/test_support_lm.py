"""``benchmarks/support_lm.py`` (the model-based support signals of docs/support.md) runs as documented."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from langchain_core.documents import Document

from benchmarks import support_lm
from benchmarks.support_eval import Case
from tests.benchmarks.scripts import REPO, run_script

STORED = REPO / "docs" / "bench" / "support_lm.json"


def _row(part: str, right: bool, score: float) -> dict:
    """A stored row whose every signal is ``score`` (one token, one sentence)."""
    return {"part": part, "right": right, "tokens": ["x."], "with": [score], "none": [0.0], "cited_only": [score],
            "verify_question": score, "verify_claim": score, "verify_sentences": [score]}  # fmt: skip


def test_token_sentences_cover_every_token_once() -> None:
    tokens = ["The", " bridge", ".", " It", " fell", ":", "\n", "-", " gone"]
    spans = support_lm.token_sentences(tokens)
    assert [list(s) for s in spans] == [[0, 1, 2], [3, 4, 5], [6], [7, 8]]
    assert support_lm.token_sentences(["no", " end"]) == [range(0, 2)]


def test_threshold_keeps_every_right_answer_of_the_fit_parts_and_counts_match_a_tally() -> None:
    rows = [_row("tuned", True, 0.5), _row("tuned", False, 0.1), _row("tuned", True, 2.0),
            _row("fresh", True, 0.2), _row("fresh", False, 3.0), _row("fresh3", False, -1.0)]  # fmt: skip
    assert support_lm.threshold(rows, "pmi_mean", ("tuned",)) == 0.5
    assert support_lm.threshold(rows, "verify_sentences", ("fresh2",)) is None  # no right answer to keep
    totals = {"tuned": (5, 3), "fresh": (4, 1), "fresh3": (2, 0)}
    cells = support_lm.counts(rows, totals, lambda r: support_lm.SIGNALS["pmi_mean"](r) >= 0.5)
    assert cells["tuned"] == ["5", "3", "2/2 (100%)", "2/3 (67%)"]
    assert cells["fresh"] == ["4", "1", "0/1 (0%)", "0/1 (0%)"]  # the right 0.2 is cut, the wrong 3.0 kept
    assert cells["all"] == ["11", "4", "2/3 (67%)", "2/4 (50%)"] and cells["fresh2"] == ["0", "0", "0/0", "0/0"]
    # AUC by brute force: right {0.5, 2.0, 0.2} against wrong {0.1, 3.0, -1.0}: 6 of 9 pairs ordered
    assert support_lm.auc(rows, "lp_with") == pytest.approx(6 / 9)
    assert support_lm.auc([r for r in rows if r["right"]], "lp_with") is None


@pytest.mark.timeout(120)
def test_signals_on_a_tiny_model_have_one_log_probability_per_answer_token(lc_tiny_model) -> None:
    passage = Document("The bridge had five arches. It was built in 1820.")
    case = Case("a", "g", "How many arches did the bridge have?", "The bridge had five arches. It was old.", [passage], True, 1)
    row = support_lm.case_signals(lc_tiny_model, case, [1])
    n = len(lc_tiny_model.tokenizer.encode(case.text, add_special_tokens=False))
    assert len(row["tokens"]) == len(row["with"]) == len(row["none"]) == len(row["cited_only"]) == n
    assert all(v <= 0 for v in row["with"] + row["none"]) and row["with"] != row["none"]  # the passages change them
    assert len(row["verify_sentences"]) == 2  # one margin per answer sentence
    assert all(math.isfinite(support_lm.SIGNALS[name](row)) for name in support_lm.SIGNALS)


@pytest.mark.timeout(120)
def test_the_docs_tables_are_what_the_stored_run_gives(tmp_path: Path) -> None:
    done = run_script("support_lm.py", "--from", str(STORED), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| rules") or line.startswith("| pmi")
            or line.startswith("| lp_") or line.startswith("| verify")]  # fmt: skip
    docs = (REPO / "docs" / "support.md").read_text()
    assert len(rows) > len(support_lm.SIGNALS) and all(row in docs for row in rows)
    assert "| rules alone | tuned | 119 | 13 | 12/13 (92%) | 12/13 (92%) |" in done.stdout  # support_eval.py's figures
    assert "| rules alone | fresh + fresh2 + fresh3 | 185 | 16 | 13/22 (59%) | 13/16 (81%) |" in done.stdout
    assert "| rules alone | fresh4 | 54 | 10 | 7/10 (70%) | 7/10 (70%) |" in done.stdout
    assert len(json.loads(STORED.read_text())["answers"]) == 52  # every answer the rules mark supported


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-3), ("bfloat16", 0.3)])
def test_the_command_runs_the_default_model(tmp_path: Path, dtype: str, tolerance: float) -> None:
    out = tmp_path / "r.json"
    done = run_script("support_lm.py", "--limit", "1", "--threads", "1", "--dtype", dtype, "--json", str(out), cwd=tmp_path,
                      timeout=580, HF_HUB_OFFLINE="1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["answers"]  # the supported answers among the first label of each set
    assert [r["id"] for r in rows] == ["fq-01", "f4-01"]
    stored = {(r["part"], r["id"], r["text"]): r for r in json.loads(STORED.read_text())["answers"]}
    for row in rows:
        same = stored[(row["part"], row["id"], row["text"])]
        assert row["with"] == pytest.approx(same["with"], abs=tolerance)
        assert row["verify_sentences"] == pytest.approx(same["verify_sentences"], abs=tolerance)
