"""How well ``Answer.supported`` tells right answers from the rest: precision and recall against hand labels.

Three labelled sets of the default model's answers over the bundled corpus (k=3, ``max_tokens=96``,
greedy, ``QA_DEFAULTS``):

- ``benchmarks/data/qa_labels.json``: the 51 answers of ``docs/bench/qa_defaults.json`` (39 bundled
  questions, 12 the corpus cannot answer);
- ``benchmarks/data/support_labels.json``: the same questions' answers with ``repeat_penalty=1.1``
  (the other setting of ``docs/bench/qa_defaults.json``; those equal to the first set's left out), and
  the answers in ``benchmarks/data/support_answers.json`` (made by ``benchmarks/support_answers.py``):
  questions written for this measurement before any answer was seen
  (``benchmarks/data/support_questions.json``: single questions and three-turn conversations) and
  the follow-up conversations of ``benchmarks/data/conversations.json``, every turn;
- ``benchmarks/data/heldout_labels.json``: the answers of ``benchmarks/data/heldout_answers.json`` (the
  same script, the rest of those questions and turns and ``benchmarks/data/heldout_questions.json``,
  written over corpus sentences no earlier question asks about), made and labelled after the rules were
  frozen: the "held-out" part, which measures the rules without having shaped them ("tuned" is the rest);
- ``benchmarks/data/fresh_labels.json``: the answers of ``benchmarks/data/fresh_answers.json`` (the turns
  the earlier rounds left unanswered), made and labelled after the load-bearing checks (counts with what
  they count, the number asked for, denials, circles) were frozen: the "fresh" part. Those checks were
  shaped by the false positives of both earlier parts, so for them only "fresh" is held out;
- ``benchmarks/data/fresh2_labels.json``: the answers of ``benchmarks/data/fresh2_answers.json`` (the turns the
  third round wrote and left unanswered, and ``benchmarks/data/fresh2_questions.json``: easy extractive questions
  written for a held-out part with enough right answers), made and labelled after the same freeze, blind to
  the rules' verdicts: the "fresh2" part ("fresh + fresh2" together: all that is held out of the
  load-bearing checks);
- ``benchmarks/data/fresh3_labels.json``: the answers of ``benchmarks/data/fresh3_answers.json``
  (``benchmarks/data/fresh3_questions.json``, written before any of its answers was generated), made after
  the clause and subject checks (``unbacked_clause``, ``swapped_subject``) were frozen and labelled blind to
  the rules' verdicts: the "fresh3" part, the only one held out of those checks ("fresh + fresh2 + fresh3":
  all that is held out of the load-bearing checks);
- ``benchmarks/data/fresh4_labels.json``: the answers of ``benchmarks/data/fresh4_answers.json``
  (``benchmarks/data/fresh4_questions.json``, written before any of its answers was generated), made after the
  short-clause, heading and month checks (``stray_clause``, ``heading``, ``statements``) were frozen and labelled blind
  to the rules' verdicts: the "fresh4" part, the only one held out of those checks.

Each label says whether the answer is right (it says what a passage says and nothing false; "partial"
and "wrong" are not right) and which passage holds the answer. For the citation rules before and after
the fact check (``choose_citations(..., check_facts=False / True)``, both with the on-topic rule) it
reports, overall, per part (tuned, held-out) and per group (bundled questions, new questions, first turns,
follow-ups; the held-out part's groups apart too):

- ``supported`` precision (right answers among those marked supported) and recall (right answers
  marked supported);
- cited-passage precision (citations of right answers that name the labelled passage, among all
  citations of supported answers) and recall (right answers citing the labelled passage);
- "I don't know" on right answers whose number the passage writes differently ("23" against
  "Twenty-three", "1000" against "1,000"): the case the number normalization is for.

A label counts only for an answer with exactly its text. No model runs; it takes a second:

    python benchmarks/support_eval.py [--limit N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from langchain_core.documents import Document  # noqa: E402

from ragspec.citations import choose_citations  # noqa: E402
from ragspec.facts import answer_facts, words  # noqa: E402

DATA = REPO / "benchmarks" / "data"
QUESTIONS = REPO / "retrievers" / "data" / "questions.json"
RULES = {"before": False, "after": True}
"""The two rule sets compared: the citation rules without and with the fact check."""


@dataclass(frozen=True)
class Case:
    """One labelled answer."""

    id: str
    group: str
    question: str
    text: str
    passages: list[Document]
    right: bool
    passage: int | None
    """The passage (1-based) that holds the answer, when one does."""
    part: str = "tuned"
    """"tuned" (the rules were designed against its label), "held-out" (answered and labelled after the fact
    check was frozen), "fresh" / "fresh2" (answered and labelled after the load-bearing checks were frozen) or
    "fresh3" (after the clause and subject checks were frozen) or "fresh4" (after the short-clause, heading and month
    checks were frozen)."""


def _stored_cases() -> list[Case]:
    """The bundled questions' answers (docs/bench/qa_defaults.json, setting "none") with their labels."""
    labels = json.loads((DATA / "qa_labels.json").read_text())["labels"]
    asked = {q["id"]: q["question"] for q in json.loads(QUESTIONS.read_text())["questions"]}
    asked |= {q["id"]: q["question"] for q in json.loads((DATA / "unanswerable.json").read_text())["questions"]}
    stored = json.loads((REPO / "docs" / "bench" / "qa_defaults.json").read_text())["settings"]["none"]["answers"]
    passages = {a["id"]: [Document(p["text"]) for p in a["passages"]] for a in stored}
    return [Case(label["id"], "bundled", asked[label["id"]], label["text"], passages[label["id"]],
                 label["verdict"] == "right", label.get("passage") if label["answerable"] else None)
            for label in labels]  # fmt: skip


def _new_answers(name: str) -> dict[tuple[str, str], dict]:
    """The answers of ``benchmarks/data/<name>`` (``benchmarks/support_answers.py``) by ``("new", id)``, with their group."""
    answers = {}
    for a in json.loads((DATA / name).read_text())["answers"]:
        group = "new questions" if a["id"] == a["conversation"] else ("first turns" if a["turn"] == 1 else "follow-ups")
        answers[("new", a["id"])] = {**a, "group": group}
    return answers


def _labelled_cases() -> list[Case]:
    """The answers labelled in support_labels.json: the bundled questions' answers with a repeat penalty
    (docs/bench/qa_defaults.json, a prefix of the stored text: cut by the stop) and the new answers
    (benchmarks/data/support_answers.json)."""
    stored = json.loads((REPO / "docs" / "bench" / "qa_defaults.json").read_text())["settings"]["repeat_penalty=1.1"]["answers"]
    asked = {q["id"]: q["question"] for q in json.loads(QUESTIONS.read_text())["questions"]}
    asked |= {q["id"]: q["question"] for q in json.loads((DATA / "unanswerable.json").read_text())["questions"]}
    answers = {("repeat_penalty", a["id"]): {**a, "question": asked[a["id"]], "group": "bundled"} for a in stored}
    return _matched(json.loads((DATA / "support_labels.json").read_text())["labels"], answers | _new_answers("support_answers.json"), "tuned")


def _held_out_cases() -> list[Case]:
    """The answers of heldout_answers.json (made after the rules were frozen) with their heldout_labels.json labels."""
    return _matched(json.loads((DATA / "heldout_labels.json").read_text())["labels"], _new_answers("heldout_answers.json"), "held-out")


def _fresh_cases() -> list[Case]:
    """The answers of fresh_answers.json (made after the load-bearing checks were frozen) with their fresh_labels.json labels."""
    return _matched(json.loads((DATA / "fresh_labels.json").read_text())["labels"], _new_answers("fresh_answers.json"), "fresh")


def _fresh2_cases() -> list[Case]:
    """The answers of fresh2_answers.json (the fourth round's, same freeze as "fresh") with their fresh2_labels.json labels."""
    return _matched(json.loads((DATA / "fresh2_labels.json").read_text())["labels"], _new_answers("fresh2_answers.json"), "fresh2")


def _fresh3_cases() -> list[Case]:
    """The answers of fresh3_answers.json (the fifth round's, made after the clause and subject checks were frozen)
    with their fresh3_labels.json labels."""
    return _matched(json.loads((DATA / "fresh3_labels.json").read_text())["labels"], _new_answers("fresh3_answers.json"), "fresh3")


def _fresh4_cases() -> list[Case]:
    """The answers of fresh4_answers.json (the sixth round's, made after the short-clause, heading and month checks were
    frozen) with their fresh4_labels.json labels."""
    return _matched(json.loads((DATA / "fresh4_labels.json").read_text())["labels"], _new_answers("fresh4_answers.json"), "fresh4")


def _matched(labels: list[dict], answers: dict[tuple[str, str], dict], part: str) -> list[Case]:
    """A case per label whose answer has its text (a new answer exactly, a stored one up to where the stop cut it)."""
    cases = []
    for label in labels:
        a = answers.get((label["set"], label["id"]))
        if a is None or not a["text"].startswith(label["text"]) or (label["set"] == "new" and a["text"] != label["text"]):
            continue  # labelled for another text: not counted
        cases.append(Case(label["id"], a["group"], a["question"], label["text"], [Document(p["text"]) for p in a["passages"]],
                          label["verdict"] == "right", label.get("passage"), part))  # fmt: skip
    return cases


def cases(limit: int | None = None) -> list[Case]:
    """Every labelled answer (the first ``limit`` of each file's labels)."""
    return (_stored_cases()[:limit] + _labelled_cases()[:limit] + _held_out_cases()[:limit] + _fresh_cases()[:limit]
            + _fresh2_cases()[:limit] + _fresh3_cases()[:limit] + _fresh4_cases()[:limit])


_DIGITS = re.compile(r"\d+(?:[.:,]\d+)*")


def spelled_differently(case: Case) -> bool:
    """A right answer with a number its passage writes otherwise: in digits in one, in words (or with a
    thousands separator) in the other ("23" against "Twenty-three")."""
    if case.passage is None or not case.right:
        return False
    passage = case.passages[case.passage - 1].page_content
    as_digits = [set(_DIGITS.findall(t)) for t in (case.text, passage)]
    shared = answer_facts(case.text).numbers & set(words(passage))
    return any((n in as_digits[0]) != (n in as_digits[1]) for n in shared)


def share(n: int, of: int) -> str:
    return f"{n}/{of}" + (f" ({n / of:.0%})" if of else "")


def measure(rows: list[Case], check_facts: bool) -> dict[str, str]:
    """Precision and recall of ``supported`` and of the cited passage over ``rows``."""
    cited = [(c, choose_citations(c.text, c.passages, c.question, check_facts=check_facts)[0]) for c in rows]
    supported = [(c, n) for c, n in cited if n]
    right = [(c, n) for c, n in cited if c.right]
    numbers = [(c, n) for c, n in right if spelled_differently(c)]
    return {
        "answers": str(len(rows)),
        "right": str(len(right)),
        "supported_precision": share(sum(c.right for c, _ in supported), len(supported)),
        "supported_recall": share(sum(bool(n) for _, n in right), len(right)),
        "cited_passage_precision": share(sum(c.right and p == c.passage for c, n in supported for p in n),
                                         sum(len(n) for _, n in supported)),  # fmt: skip
        "cited_passage_recall": share(sum(c.passage in n for c, n in right), len(right)),
        "dont_know_on_right_number_word_answers": share(sum(not n for _, n in numbers), len(numbers)),
    }


def report(rows: list[Case]) -> dict[str, dict[str, dict[str, str]]]:
    """``{rule set: {group: measures}}``, the groups being "all", each part ("tuned", "held-out", "fresh", "fresh2",
    "fresh3"), "fresh + fresh2" (what the load-bearing checks never saw when fresh2 was labelled), "fresh + fresh2 +
    fresh3", each group of the cases ("bundled", "new questions", "first turns", "follow-ups"), and each group of the
    held-out and fresh parts apart ("held-out follow-ups")."""
    parts = {g: [c for c in rows if c.part == g] for g in dict.fromkeys(c.part for c in rows)}
    parts["fresh + fresh2"] = [c for c in rows if c.part in ("fresh", "fresh2")]
    parts["fresh + fresh2 + fresh3"] = [c for c in rows if c.part in ("fresh", "fresh2", "fresh3")]
    groups = {g: [c for c in rows if c.group == g] for g in dict.fromkeys(c.group for c in rows)}
    held = {f"{p} {g}": [c for c in rows if c.part == p and c.group == g]
            for p in ("held-out", "fresh", "fresh2", "fresh3", "fresh4")
            for g in dict.fromkeys(c.group for c in rows if c.part == p)}  # fmt: skip
    sets = {"all": rows} | parts | groups | held
    return {name: {g: measure(cases, check) for g, cases in sets.items()} for name, check in RULES.items()}


def table(result: dict[str, dict[str, dict[str, str]]]) -> str:
    """The report as a Markdown table: one row per rule set and group."""
    keys = ["answers", "right", "supported_precision", "supported_recall", "cited_passage_precision",
            "cited_passage_recall", "dont_know_on_right_number_word_answers"]  # fmt: skip
    lines = ["| rules | group | " + " | ".join(k.replace("_", " ") for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]  # fmt: skip
    for name, groups in result.items():
        for group, row in groups.items():
            lines.append(f"| {name} | {group} | " + " | ".join(row[k] for k in keys) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/support_eval.py", description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N labelled answers of each set")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    result = report(cases(args.limit))
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
