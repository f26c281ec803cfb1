"""``benchmarks/support_eval.py`` (the README's support table) and ``benchmarks/support_answers.py`` run as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.documents import Document

from benchmarks import support_eval
from benchmarks.support_eval import Case, measure
from ragspec.citations import choose_citations
from tests.benchmarks.scripts import REPO, run_script



def _keys(name: str, key: str) -> set[tuple[str, str]]:
    return {(row.get("set", "new"), row["id"]) for row in json.loads((REPO / "benchmarks/data" / name).read_text())[key]}


def test_every_label_matches_an_answer_and_every_answer_is_labelled() -> None:
    labelled = _keys("support_labels.json", "labels")
    held_out = _keys("heldout_labels.json", "labels")
    assert _keys("support_answers.json", "answers") <= labelled  # every stored new answer is labelled
    assert _keys("heldout_answers.json", "answers") == held_out
    fresh = _keys("fresh_labels.json", "labels")
    assert _keys("fresh_answers.json", "answers") == fresh
    fresh2 = _keys("fresh2_labels.json", "labels")
    assert _keys("fresh2_answers.json", "answers") == fresh2
    fresh3 = _keys("fresh3_labels.json", "labels")
    assert _keys("fresh3_answers.json", "answers") == fresh3
    fresh4 = _keys("fresh4_labels.json", "labels")
    assert _keys("fresh4_answers.json", "answers") == fresh4
    parts = [{i for _, i in part} for part in (labelled, held_out, fresh, fresh2, fresh3, fresh4)]
    assert all(not (a & b) for i, a in enumerate(parts) for b in parts[i + 1 :])  # an answer is in one part only
    cases = support_eval.cases()
    held = len(held_out) + len(fresh) + len(fresh2) + len(fresh3) + len(fresh4)
    assert len(cases) == 51 + len(labelled) + held >= 100  # a label counts only for its exact text
    assert {c.part for c in cases} == {"tuned", "held-out", "fresh", "fresh2", "fresh3", "fresh4"}


def test_no_held_out_question_repeats_an_earlier_sets_words() -> None:
    """An answer to the same words over the same passages would be an earlier part's answer again, not held out."""
    data = REPO / "benchmarks" / "data"
    def asked(name: str) -> set[str]:
        d = json.loads((data / name).read_text())
        turns = [t["question"] for c in d.get("conversations", []) for t in c["turns"]]
        return {q.lower() for q in [q["question"] for q in d["questions"]] + turns}
    earlier = set().union(*map(asked, ("support_questions.json", "heldout_questions.json", "fresh_questions.json",
                                        "fresh2_questions.json", "fresh3_questions.json")))
    assert not asked("fresh4_questions.json") & earlier


def test_measure_counts_against_a_brute_force_tally() -> None:
    passage = Document("Twenty-three people died. The bridge had five arches.")
    rows = [
        Case("a", "g", "How many people died?", "23 people died.", [passage], True, 1),
        Case("b", "g", "How many arches did the bridge have?", "The bridge had six arches.", [passage], False, 1),
        Case("c", "g", "How many arches did the bridge have?", "The bridge had five arches.", [passage], True, 1),
        Case("d", "g", "Who built it?", "The answer is: it.", [passage], False, None),
    ]
    supported = [c for c in rows if choose_citations(c.text, c.passages, c.question)[0]]
    assert [c.id for c in supported] == ["a", "c"]
    got = measure(rows, check_facts=True)
    assert got["supported_precision"] == "2/2 (100%)" and got["supported_recall"] == "2/2 (100%)"
    assert got["dont_know_on_right_number_word_answers"] == "0/1 (0%)"  # "a": 23 against "Twenty-three"
    assert measure(rows, check_facts=False)["supported_precision"] == "2/3 (67%)"  # "six" matched the words before


@pytest.mark.timeout(120)
def test_the_readme_command_prints_the_table(tmp_path: Path) -> None:
    done = run_script("support_eval.py", "--limit", "5", "--json", str(tmp_path / "r.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("| rules | group | answers |") and "| after | all | 35 |" in done.stdout and "| after | fresh | 5 |" in done.stdout
    assert "| after | fresh2 | 5 |" in done.stdout and "| after | fresh + fresh2 | 10 |" in done.stdout
    assert "| after | fresh3 | 5 |" in done.stdout and "| after | fresh + fresh2 + fresh3 | 15 |" in done.stdout
    assert set(json.loads((tmp_path / "r.json").read_text())) == {"before", "after"}


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_support_answers_runs_on_the_default_model(tmp_path: Path) -> None:
    out = tmp_path / "answers.json"
    done = run_script("support_answers.py", "--out", str(out), "--ids", "nq-13", "--max-tokens", "8", cwd=tmp_path,
                      timeout=880, HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(out.read_text())["answers"]
    assert row["id"] == "nq-13" and row["question"].startswith("Which version of tidepool") and len(row["passages"]) == 3


def test_support_answers_report_counts_gold_in_first_turns_and_follow_ups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # the script imports conversation_bench as its neighbour
    from benchmarks import support_answers

    conv = json.loads((REPO / "benchmarks/data/conversations.json").read_text())["conversations"][0]  # mf-flood
    rows = [{"id": f"{conv['id']}-{i + 1}", "turn": i + 1, "text": text}
            for i, text in enumerate([f"It was in {conv['turns'][0]['gold'][0]}.", "Nobody knows.", conv["turns"][2]["gold"][0]])]  # fmt: skip
    rows.append({"id": "nq-01", "turn": 1, "text": "anything"})  # not a conversations.json turn: not counted
    (tmp_path / "a.json").write_text(json.dumps({"answers": rows}))
    assert support_answers.report([tmp_path / "a.json"]) == "first turns 1/1, follow-ups 1/2"


def test_label_table_counts_each_layout_beside_the_baseline_on_the_same_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from benchmarks import support_answers

    rows = [("conversation", "a-1", "right"), ("conversation", "a-2", "right"), ("conversation", "a-3", "partial"),
            ("conversation", "b-1", "wrong"), ("conversation", "b-2", "wrong"),
            ("rules", "a-2", "wrong"), ("rules", "a-3", "right"), ("rules", "b-2", "right"),
            ("rules", "c-2", "right")]  # c-2: no baseline label, so not counted  # fmt: skip
    labels = [{"layout": layout, "id": i, "verdict": v} for layout, i, v in rows]
    (tmp_path / "labels.json").write_text(json.dumps({"labels": labels}))
    assert support_answers.label_table(tmp_path / "labels.json").splitlines()[2:] == [
        "| `conversation` | 3 | 1 | 1 | 1 | 1 | 1/2 |",
        "| `rules` | 3 | 2 | 0 | 1 | 1 | 1/2 |",
    ]


def test_follow_up_labels_are_in_the_scheme_and_the_baseline_texts_are_the_stored_answers_cut() -> None:
    labels = json.loads((REPO / "benchmarks/data/followup_labels.json").read_text())["labels"]
    stored = {r["id"]: r["text"] for name in ("support_answers.json", "heldout_answers.json", "fresh_answers.json")
              for r in json.loads((REPO / "benchmarks/data" / name).read_text())["answers"]}  # fmt: skip
    assert {row["verdict"] for row in labels} <= {"right", "partial", "wrong", "no_answer"}
    assert len({(row["layout"], row["id"]) for row in labels}) == len(labels)
    baseline = [row for row in labels if row["layout"] == "conversation"]
    assert len(baseline) >= 40 and all(stored[row["id"]].startswith(row["text"].rstrip()) for row in baseline)


LAYOUTS_ASKED = ("conversation", "rules", "k2", "no-answers", "last", "rules-conversation", "passages-after", "fresh-passages")
"""The layouts asked on the held-out conversations (``followup_conversations.json``), the baseline first."""

FRESH3_LAYOUTS = ("conversation", "rules-conversation", "passages-after", "fresh-passages")
"""The layouts asked on ``fresh3_questions.json``'s conversations (written before any answer), the baseline first."""


@pytest.mark.parametrize(("labels", "answers", "layouts", "questions"), [
    ("followup_heldout_labels.json", "followup_{}_answers.json", LAYOUTS_ASKED, "followup_conversations.json"),
    ("followup_fresh3_labels.json", "followup_fresh3_{}_answers.json", FRESH3_LAYOUTS, "fresh3_questions.json"),
])  # fmt: skip
def test_held_out_follow_up_labels_label_every_committed_answer_as_it_was_generated(
        labels: str, answers: str, layouts: tuple[str, ...], questions: str) -> None:
    rows = json.loads((REPO / "benchmarks/data" / labels).read_text())["labels"]
    convs = json.loads((REPO / "benchmarks/data" / questions).read_text())["conversations"]
    turns = {f"{c['id']}-{i + 1}" for c in convs for i in range(len(c["turns"]))}
    assert {row["verdict"] for row in rows} <= {"right", "partial", "wrong", "no_answer"}
    assert list(dict.fromkeys(row["layout"] for row in rows)) == list(layouts)  # the baseline first: the table's order
    for layout in layouts:
        stored = json.loads((REPO / "benchmarks/data" / answers.format(layout)).read_text())["answers"]
        labelled = {row["id"]: row["text"] for row in rows if row["layout"] == layout}
        assert labelled == {r["id"]: r["text"] for r in stored} and set(labelled) <= turns, layout
    assert len({(row["layout"], row["id"]) for row in rows}) == len(rows)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("labels", "layouts"), [("followup_labels.json", 7), ("followup_heldout_labels.json", len(LAYOUTS_ASKED)),
                                                 ("followup_fresh3_labels.json", len(FRESH3_LAYOUTS))])  # fmt: skip
def test_the_docs_layout_table_is_what_the_labels_give(tmp_path: Path, labels: str, layouts: int) -> None:
    done = run_script("support_answers.py", "--labels", str(REPO / "benchmarks/data" / labels), cwd=tmp_path, timeout=280)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `")]
    docs = (REPO / "docs/conversations.md").read_text()
    assert len(rows) == layouts and all(row in docs for row in rows)  # the tables in docs/conversations.md, as printed


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_layout_asks_the_follow_ups_after_the_stored_first_turns(tmp_path: Path) -> None:
    """The docs' ``--layout L --first-turns FILE`` commands: the first turn is taken, not asked again."""
    first = REPO / "benchmarks/data/followup_fresh3_conversation_answers.json"
    out = tmp_path / "answers.json"
    done = run_script("support_answers.py", "--layout", "fresh-passages", "--max-tokens", "4", "--first-turns", str(first),
                      "--out", str(out), "--ids", "f3c-salvage", cwd=tmp_path, timeout=880, HF_HUB_OFFLINE="1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["answers"]
    assert [r["id"] for r in rows] == ["f3c-salvage-2", "f3c-salvage-3"] and all(len(r["passages"]) == 3 for r in rows)
