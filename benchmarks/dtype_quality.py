"""Right answers in fp32 and with bf16 prompts, against the hand labels: is ``"bf16-prompts"`` worse?

Asks every labelled question over the bundled corpus as the labelled answers were made (``DocumentQA``,
k=3, ``max_tokens=96``, the default model, greedy, ``QA_DEFAULTS``): the bundled questions and the 12
the corpus cannot answer (labels: ``benchmarks/data/qa_labels.json``) and the questions and
conversations of ``benchmarks/support_answers.py`` (``support_labels.json``, ``heldout_labels.json``, the
fresh and follow-up label files: ``LABELS``), once per dtype setting, the settings interleaved per question. A label counts only for an answer with
exactly its text; answers no label covers are labelled in ``benchmarks/data/dtype_labels.json`` (same
scheme, written from the passages and the question before the counts were taken) or listed as
unlabelled. Per setting it reports right / partial / wrong / unlabelled and how many answers equal
fp32's, and, on the turns whose answers differ, how often one setting's is right and the other's not. The
counts do not depend on timing (the answers are greedy), so a busy machine gives the same
report (about 25 minutes on 2 quiet cores):

    python benchmarks/dtype_quality.py --out docs/bench/dtype_quality.json

It prints one line per turn (its id and each setting's answer): saved to a file, ``--answers FILE...``
counts them again against the labels present then, without the model (e.g. after labelling the answers
the run listed as unlabelled), and ``--start N`` continues a run that stopped after N conversations.

On a CPU without AMX or AVX512-BF16 ``"bf16-prompts"`` runs fp32 and both columns are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from support_answers import workload  # noqa: E402

from ragspec.backends.pytorch.loading import BF16_PROMPTS, prompt_dtype, resolve_device  # noqa: E402
from ragspec.lc import ChatRagSpec  # noqa: E402
from ragspec.pipeline import DocumentQA  # noqa: E402

DATA = REPO / "benchmarks" / "data"
SETTINGS = ("float32", BF16_PROMPTS)
LABELS = ("qa_labels.json", "support_labels.json", "heldout_labels.json", "fresh_labels.json", "fresh2_labels.json",
          "fresh3_labels.json", "fresh4_labels.json", "followup_labels.json", "followup_heldout_labels.json",
          "followup_fresh3_labels.json", "dtype_labels.json")
"""Every hand-label file keyed by (question id, answer text); no two give one text of one question different verdicts."""


def questions(limit: int | None, start: int = 0) -> list[tuple[str, list[tuple[str, str]]]]:
    """The bundled and unanswerable questions (one turn each), then support_answers.py's conversations: from the
    ``start``-th (0-based) to before the ``limit``-th (all when None)."""
    bundled = [json.loads((REPO / "retrievers" / "data" / "questions.json").read_text())["questions"],
               json.loads((DATA / "unanswerable.json").read_text())["questions"]]  # fmt: skip
    convs = [(q["id"], [(q["id"], q["question"])]) for qs in bundled for q in qs] + workload()
    return convs[start:limit]


def labels() -> dict[tuple[str, str], str]:
    """Verdict by (question id, exact answer text), from every label file present."""
    out = {}
    for name in LABELS:
        path = DATA / name
        if path.is_file():
            out |= {(row["id"], row["text"]): row["verdict"] for row in json.loads(path.read_text())["labels"]}
    return out


def ask(limit: int | None, start: int) -> tuple[dict[str, str], dict[str, dict[str, str]], dict[tuple[str, str], list[str]]]:
    """Every turn asked once per setting: the questions by turn id, the answers by setting and turn id, and the
    passages each answer was given by (setting, turn id). Prints one line per turn: its id and each setting's answer."""
    first = DocumentQA.from_paths(REPO / "retrievers" / "data" / "corpus", k=3, unsupported="flag",
                                  llm=ChatRagSpec(max_tokens=96, dtype=SETTINGS[0]))  # fmt: skip
    qas = {SETTINGS[0]: first} | {
        s: DocumentQA(first.retriever, ChatRagSpec(max_tokens=96, dtype=s), unsupported="flag") for s in SETTINGS[1:]
    }
    answers: dict[str, dict[str, str]] = {s: {} for s in SETTINGS}
    asked: dict[str, str] = {}
    passages: dict[tuple[str, str], list[str]] = {}
    for _, turns in questions(limit, start):
        chats = {s: qa.conversation() for s, qa in qas.items()}
        for turn_id, question in turns:
            asked[turn_id] = question
            for s, chat in chats.items():
                answer = chat.ask(question)
                answers[s][turn_id] = answer.model_text
                passages[s, turn_id] = [p.page_content for p in answer.passages]
            print(json.dumps({"id": turn_id, **{s: answers[s][turn_id] for s in SETTINGS}}), flush=True)
    return asked, answers, passages


def saved(paths: list[Path]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The questions and answers of the turn lines earlier runs printed (their standard output, saved in ``paths``,
    e.g. a run and its continuation with ``--start``); other lines (progress bars, the counts) are skipped."""
    by_turn = {turn_id: question for _, turns in questions(None) for turn_id, question in turns}
    rows: dict[str, dict[str, str]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not (isinstance(row, dict) and set(row) == {"id", *SETTINGS}):
                continue
            if row["id"] not in by_turn:
                raise SystemExit(f"{path}: no question with the id {row['id']}")
            if rows.setdefault(row["id"], row) != row:
                raise SystemExit(f"{path}: other answers to {row['id']} than an earlier line's")
    if not rows:
        raise SystemExit(f"{', '.join(map(str, paths))}: no answer lines of this script (one JSON object per turn: id, "
                         f"{', '.join(SETTINGS)})")  # fmt: skip
    return {i: by_turn[i] for i in rows}, {s: {i: row[s] for i, row in rows.items()} for s in SETTINGS}


def count(asked: dict[str, str], answers: dict[str, dict[str, str]], passages: dict[tuple[str, str], list[str]],
          known: dict[tuple[str, str], str]) -> dict[str, object]:  # fmt: skip
    """Per setting: verdicts, answers equal to fp32's and the unlabelled answers (with their passages where known)."""
    report: dict[str, object] = {
        "cpu_bf16": prompt_dtype(BF16_PROMPTS, resolve_device("cpu")) is not None,
        "answers": len(asked),
    }
    for s in SETTINGS:
        report[s] = {
            "verdicts": dict(Counter(known.get((i, t), "unlabelled") for i, t in answers[s].items())),
            "same_as_float32": sum(t == answers[SETTINGS[0]][i] for i, t in answers[s].items()),
            "unlabelled": [{"id": i, "question": asked[i], "text": t, "passages": passages.get((s, i), [])}
                           for i, t in answers[s].items() if (i, t) not in known],
        }
    fp32, *others = SETTINGS
    for s in others:
        differ = [i for i, t in answers[s].items() if t != answers[fp32][i]]
        right = {x: {i for i in differ if known.get((i, answers[x][i])) == "right"} for x in (fp32, s)}
        report[f"{s} vs {fp32}"] = {"answers_differ": len(differ), f"{s}_right_{fp32}_not": len(right[s] - right[fp32]),
                                   f"{fp32}_right_{s}_not": len(right[fp32] - right[s])}  # fmt: skip
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--start", type=int, default=0, help="skip the first N conversations (continue a run)")
    parser.add_argument("--answers", type=Path, nargs="+", default=None,
                        help="count the answers earlier runs printed (their standard output saved in these files) "
                             "against the labels now present, without loading the model; unlabelled answers then "
                             "come without their passages")  # fmt: skip
    args = parser.parse_args()
    if args.answers is not None:
        asked, answers = saved(args.answers)
        passages: dict[tuple[str, str], list[str]] = {}
    else:
        asked, answers, passages = ask(args.limit, args.start)
    report = count(asked, answers, passages, labels())
    for s in SETTINGS:
        print(s, json.dumps({k: v for k, v in report[s].items() if k != "unlabelled"}), flush=True)  # type: ignore[union-attr]
    for s in SETTINGS[1:]:
        print(f"{s} vs {SETTINGS[0]}", json.dumps(report[f"{s} vs {SETTINGS[0]}"]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
