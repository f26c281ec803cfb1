"""Generate the answers that ``benchmarks/support_eval.py`` judges: the default model over the bundled corpus.

Asks the questions of ``benchmarks/data/support_questions.json`` and ``heldout_questions.json`` (single
questions and three-turn conversations written for issue 37) and the follow-up conversations of
``benchmarks/data/conversations.json`` as the demo does (``DocumentQA``, k=3, ``max_tokens=96``, the
default model, greedy, ``QA_DEFAULTS``), turn by turn through ``DocumentQA.conversation()``, and
writes each answer with its question and the passages of its prompt, for labelling by hand:

    flock /tmp/ragspec-bench.lock python benchmarks/support_answers.py --out benchmarks/data/support_answers.json

The answers labelled for tuning the rule are in ``support_answers.json``; those made after it was frozen
(``--ids`` of the rest) in ``heldout_answers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ragspec.lc import ChatRagSpec  # noqa: E402
from ragspec.pipeline import DocumentQA  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"
QUESTION_FILES = ("support_questions.json", "heldout_questions.json", "fresh_questions.json")
"""The questions written for issue 37, in the order they were written (``fresh_questions.json`` last: the third round's held-out part)."""


def workload(ids: list[str] | None = None) -> list[tuple[str, list[tuple[str, str]]]]:
    """Conversations as ``(id, [(turn id, question), ...])`` (a single question is a one-turn conversation):
    all of them, or those of ``ids`` in that order."""
    mine = [json.loads((DATA / name).read_text()) for name in QUESTION_FILES]
    theirs = json.loads((DATA / "conversations.json").read_text())["conversations"]
    convs = [(q["id"], [(q["id"], q["question"])]) for m in mine for q in m["questions"]]
    for conv in [c for m in mine for c in m["conversations"]] + theirs:
        convs.append((conv["id"], [(f"{conv['id']}-{i + 1}", t["question"]) for i, t in enumerate(conv["turns"])]))
    if ids is None:
        return convs
    by_id = dict(convs)
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise SystemExit(f"no conversation or question {', '.join(unknown)}")
    return [(i, by_id[i]) for i in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--ids", default=None, help="only these conversations or single questions, comma-separated, in order")
    args = parser.parse_args()
    qa = DocumentQA.from_paths(REPO / "retrievers" / "data" / "corpus", llm=ChatRagSpec(max_tokens=args.max_tokens), k=3,
                               unsupported="flag")  # fmt: skip
    rows = []
    for conv_id, turns in workload(args.ids.split(",") if args.ids else None):
        conversation = qa.conversation()
        for index, (turn_id, question) in enumerate(turns):
            answer = conversation.ask(question)
            rows.append({"id": turn_id, "conversation": conv_id, "turn": index + 1, "question": question,
                         "text": answer.model_text, "finish": answer.finish_reason,
                         "passages": [{"source": Path(str(p.metadata.get("source", ""))).name, "text": p.page_content}
                                      for p in answer.passages]})  # fmt: skip
            print(json.dumps({k: rows[-1][k] for k in ("id", "question", "text")}), flush=True)
            args.out.write_text(json.dumps({"answers": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
