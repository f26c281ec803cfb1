"""Generate the answers that ``benchmarks/support_eval.py`` judges: the default model over the bundled corpus.

Asks the questions of ``benchmarks/data/support_questions.json`` and ``heldout_questions.json`` (single
questions and three-turn conversations written for issue 37) and the follow-up conversations of
``benchmarks/data/conversations.json`` as the demo does (``DocumentQA``, k=3, ``max_tokens=96``, the
default model, greedy, ``QA_DEFAULTS``), turn by turn through ``DocumentQA.conversation()``, and
writes each answer with its question and the passages of its prompt, for labelling by hand:

    flock /tmp/ragspec-bench.lock python benchmarks/support_answers.py --out benchmarks/data/support_answers.json

The answers labelled for tuning the rule are in ``support_answers.json``; those made after it was frozen
(``--ids`` of the rest) in ``heldout_answers.json``; the turns left unanswered then and the third round's
questions (``fresh_questions.json``) in ``fresh_answers.json``; the turns still unanswered after that and the
fourth round's (``fresh2_questions.json``) in ``fresh2_answers.json``; the fifth round's (``fresh3_questions.json``) in
``fresh3_answers.json``; the sixth round's (``fresh4_questions.json``) in ``fresh4_answers.json``.

``--layout`` measures what lifts follow-ups (``--report FILE`` counts, for the conversations of
``conversations.json``, the first turns and the follow-ups whose answer holds a gold string):

- ``conversation`` (the default): as ``DocumentQA.conversation()`` lays a follow-up out, after every earlier
  turn with its passages, retrieved with the ``combine`` query;
- ``last``: only the last earlier turn kept (its question, answer and passages), the same retrieval;
- ``questions``: the recent earlier questions and the follow-up asked together as a first turn (the
  ``combine`` query, "When did the great flood hit Marrowford? How many people died in it?"): retrieved
  for it, no earlier answer in the prompt (the small model repeats its earlier answers, right or wrong);
- ``standalone``: the model rewrites the follow-up into a standalone question (``follow_up="rewrite"``'s
  query), which is then asked as a first turn: retrieved for it, no earlier turn in the prompt.

- ``no-answers``: every earlier question with its passages, as ``conversation`` lays them out, but no earlier
  answer (the prompt still extends the previous one, less its last few tokens);
- ``passages-after``: the earlier questions and answers first, then every passage (earlier and new), then the
  follow-up;
- ``fresh-passages``: the earlier questions and answers, then only this turn's k passages (earlier ones dropped);
- ``rules``: the follow-up made standalone by rules (``follow_up_rewrite.py``: "How many people died in it?" becomes
  "How many people died in the great flood?") and asked as a first turn, with the ``combine`` query's k passages;
- ``rules-conversation``: the rule rewrite asked in the ``conversation`` layout;
- ``k2``: the ``conversation`` layout with k = 2 passages for follow-ups.

``--first-turns FILE ...`` takes the first turns' answers from earlier ``--out`` files (the first turn is the same
in every layout) instead of asking them again. The conversations of ``followup_conversations.json`` were
written after the rules were frozen and before any answer to them was seen: the held-out part.
``fresh3_questions.json``'s conversations, written before any answer to them, were asked the same way later
(``conversation``, then the other layouts with ``--first-turns`` its file): the newest held-out part.

``--follow-ups-only`` leaves the first turns out (they are asked as in ``conversation`` whatever the layout,
so its file has them) where the layout does not need their answers (``questions``).

An ``--out`` file that exists is resumed: turns already in it are kept, not asked again (a conversation
whose turns are all there is skipped; one cut short is asked again from its start).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from conversation_bench import has_gold  # noqa: E402  (benchmarks/, on the path as the script's folder)

from ragspec.answers import Answer  # noqa: E402
from ragspec.conversation import follow_up_query  # noqa: E402
from ragspec.lc import ChatRagSpec  # noqa: E402
from ragspec.pipeline import DocumentQA  # noqa: E402
from follow_up_rewrite import standalone_question  # noqa: E402
from ragspec.prompts import QA_USER_TEMPLATE, Turn, chat_prompt_ids, format_passages, qa_messages  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"
QUESTION_FILES = ("support_questions.json", "heldout_questions.json", "fresh_questions.json", "fresh2_questions.json",
                  "fresh3_questions.json", "fresh4_questions.json")
"""The questions written for issue 37, in the order they were written (``fresh_questions.json``: the third round's held-out
part; ``fresh2_questions.json``: the fourth round's; ``fresh3_questions.json``: the fifth round's; ``fresh4_questions.json``:
the sixth round's)."""


def workload(ids: list[str] | None = None) -> list[tuple[str, list[tuple[str, str]]]]:
    """Conversations as ``(id, [(turn id, question), ...])`` (a single question is a one-turn conversation):
    all of them, or those of ``ids`` in that order."""
    mine = [json.loads((DATA / name).read_text()) for name in QUESTION_FILES]
    theirs = [c for name in GOLD_FILES for c in json.loads((DATA / name).read_text())["conversations"]]
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


GOLD_FILES = ("conversations.json", "followup_conversations.json")
"""Conversations with gold strings (``--report``); the second was written for the follow-up layouts, held out."""

LAYOUTS = ("conversation", "last", "questions", "standalone", "no-answers", "passages-after", "fresh-passages", "rules",
           "rules-conversation", "k2")
PROMPT_LAYOUTS = ("no-answers", "passages-after", "fresh-passages", "rules")
"""Layouts whose follow-up prompt ``laid_out`` builds (the others are ``DocumentQA.ask`` calls)."""


def laid_out(qa: DocumentQA, question: str, history: list[Turn], layout: str) -> Answer:
    """A follow-up asked in one of ``PROMPT_LAYOUTS`` (module docstring), with ``DocumentQA``'s generation settings."""
    messages: list[dict[str, str]] = [{"role": "system", "content": qa.system_prompt}]
    if layout == "rules":
        question = standalone_question(question, [t.question for t in history])
    request = qa._prepare(question, None, {}, history)  # the combine query's retrieval and the call's settings
    passages = list(request.passages)
    if layout == "no-answers":  # every earlier question with its passages, no earlier answer
        start = 1
        for turn in history:
            messages.append({"role": "user", "content": _user(turn.question, turn.passages, start)})
            start += len(turn.passages)
        messages.append({"role": "user", "content": _user(question, passages[request.earlier_passages :], start)})
    elif layout == "passages-after":  # the earlier questions and answers, then every passage, then the question
        for turn in history:
            messages += [{"role": "user", "content": f"Question: {turn.question}"}, {"role": "assistant", "content": turn.answer}]
        messages.append({"role": "user", "content": _user(question, passages, 1)})
    elif layout == "fresh-passages":  # the earlier questions and answers, then this turn's k passages only
        passages = qa.retrieve(request.retrieval_query)
        for turn in history:
            messages += [{"role": "user", "content": f"Question: {turn.question}"}, {"role": "assistant", "content": turn.answer}]
        messages.append({"role": "user", "content": _user(question, passages, 1)})
    else:  # rules: the standalone question asked as a first turn, with the combine query's k passages
        passages = qa.retrieve(request.retrieval_query)
        messages = qa_messages(question, passages, qa.system_prompt)
    generator = qa.llm.load()
    request = dataclasses.replace(
        request, passages=passages, prompt_ids=chat_prompt_ids(generator.tokenizer, messages),
        earlier_passages=request.earlier_passages if layout in ("no-answers", "passages-after") else 0,
        options=dataclasses.replace(request.options, references=tuple(p.page_content for p in passages)),
    )
    answer = None
    for item in qa._generate(request):
        answer = item
    assert isinstance(answer, Answer)
    return answer


def _user(question: str, passages: object, start: int) -> str:
    return QA_USER_TEMPLATE.format(context=format_passages(passages, start), question=question)  # type: ignore[arg-type]


def ask_turns(qa: DocumentQA, turns: list[tuple[str, str]], layout: str, follow_ups_only: bool = False,
              first: dict[str, str] | None = None) -> Iterator[tuple[int, str, Answer]]:
    """``(turn index, question asked, answer)`` for each turn of a conversation, laid out as ``layout`` says
    (module docstring); without the first turn when ``follow_ups_only`` and the layout needs no earlier answer.
    ``first``: first turns' answers by turn id (``--first-turns``), shown as the earlier answer instead of asking again."""
    history: list[Turn] = []
    for index, question in enumerate(q for _, q in turns):
        asked, shown = question, history
        if index == 0 and first is not None and turns[0][0] in first:
            retrieved = qa._prepare(question, None, {}, [])
            history.append(Turn(question, first[turns[0][0]], tuple(retrieved.passages)))
            continue
        if index > 0 and layout in PROMPT_LAYOUTS:
            answer = laid_out(qa, question, history, layout)
            history.append(Turn(question, answer.model_text, tuple(answer.passages[answer.earlier_passages :])))
            yield index, answer.question, answer
            continue
        if layout in ("rules-conversation", "k2") and history:
            asked = standalone_question(question, [t.question for t in history]) if layout != "k2" else question
            answer = qa.ask(asked, history=shown, k=2 if layout == "k2" else None)
            history.append(Turn(question, answer.model_text, tuple(answer.passages[answer.earlier_passages :])))
            yield index, asked, answer
            continue
        if layout == "last":
            shown = history[-1:]
        elif layout == "questions" and history:
            asked, shown = follow_up_query("combine", question, history, qa.llm.load(), qa.system_prompt)[0], []
        elif layout == "standalone" and history:
            asked, shown = follow_up_query("rewrite", question, history, qa.llm.load(), qa.system_prompt)[0], []
        if index == 0 and follow_ups_only and layout == "questions":
            history.append(Turn(question, "", ()))
            continue
        answer = qa.ask(asked, history=shown)
        history.append(Turn(question, answer.model_text, tuple(answer.passages[answer.earlier_passages :])))
        yield index, asked, answer


def report(paths: list[Path]) -> str:
    """First turns and follow-ups of ``conversations.json``'s conversations in ``paths`` whose answer holds a gold string."""
    gold = {f"{c['id']}-{i + 1}": t["gold"] for name in GOLD_FILES for c in json.loads((DATA / name).read_text())["conversations"]
            for i, t in enumerate(c["turns"])}  # fmt: skip
    rows = [r for path in paths for r in json.loads(path.read_text())["answers"] if r["id"] in gold]
    right = {kind: [has_gold(r["text"], gold[r["id"]]) for r in rows if (r["turn"] == 1) == (kind == "first turns")]
             for kind in ("first turns", "follow-ups")}  # fmt: skip
    return ", ".join(f"{kind} {sum(hits)}/{len(hits)}" for kind, hits in right.items())


def label_table(path: Path) -> str:
    """A markdown table of the hand labels in ``path`` (``followup_labels.json``, ``followup_heldout_labels.json``,
    ``followup_fresh3_labels.json``):
    per layout, its follow-ups labelled right and partial, the first layout's (the baseline's) on the same
    follow-ups, and the first turns of their conversations labelled right (the first turn is asked alike in
    every layout)."""
    labels = json.loads(path.read_text())["labels"]
    layouts = list(dict.fromkeys(row["layout"] for row in labels))
    verdict = {(row["layout"], row["id"]): row["verdict"] for row in labels}
    lines = ["| layout | follow-ups | right | partial | baseline on the same follow-ups: right | partial | "
             "first turns of their conversations: right |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for layout in layouts:
        follow = [i for (name, i) in verdict if name == layout and int(i.rsplit("-", 1)[1]) > 1 and (layouts[0], i) in verdict]
        got = [verdict[(layout, i)] for i in follow]
        base = [verdict[(layouts[0], i)] for i in follow]
        first = [verdict.get((layouts[0], f"{c}-1")) for c in sorted({i.rsplit("-", 1)[0] for i in follow})]
        lines.append(f"| `{layout}` | {len(got)} | {got.count('right')} | {got.count('partial')} | {base.count('right')} | "
                     f"{base.count('partial')} | {first.count('right')}/{len(first)} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--ids", default=None, help="only these conversations or single questions, comma-separated, in order")
    parser.add_argument("--layout", choices=LAYOUTS, default="conversation", help="how a follow-up is asked")
    parser.add_argument("--follow-ups-only", action="store_true", help="leave the first turns out (layout 'questions')")
    parser.add_argument("--first-turns", type=Path, nargs="+", default=None,
                        help="--out files whose first-turn answers the follow-ups see (those first turns are not asked again)")
    parser.add_argument("--report", type=Path, nargs="+", default=None, help="only count gold answers in these --out files")
    parser.add_argument("--labels", type=Path, default=None, help="only print the table of hand labels in this file "
                        "(benchmarks/data/followup_labels.json, followup_heldout_labels.json, followup_fresh3_labels.json)")
    args = parser.parse_args()
    if args.report is not None:
        print(report(args.report))
        return
    if args.labels is not None:
        print(label_table(args.labels))
        return
    if args.out is None:
        parser.error("--out is required")
    # fp32 prompts: the stored, hand-labelled answers are fp32 answers (the default on a CPU that computes bf16
    # runs prompts in bf16 and may answer otherwise: docs/backends.md, "bf16 prompts").
    qa = DocumentQA.from_paths(REPO / "retrievers" / "data" / "corpus", llm=ChatRagSpec(max_tokens=args.max_tokens, dtype="float32"), k=3,
                               unsupported="flag")  # fmt: skip
    done = json.loads(args.out.read_text())["answers"] if args.out.exists() else []
    first = ({r["id"]: r["text"] for path in args.first_turns for r in json.loads(path.read_text())["answers"] if r["turn"] == 1}
             if args.first_turns else None)  # fmt: skip
    for conv_id, turns in workload(args.ids.split(",") if args.ids else None):
        skip_first = args.follow_ups_only or (first is not None and turns[0][0] in first)
        if {t for t, _ in turns[1 if skip_first else 0 :]} <= {r["id"] for r in done}:
            continue
        done = [r for r in done if r["conversation"] != conv_id]
        for index, asked, answer in ask_turns(qa, turns, args.layout, args.follow_ups_only, first):
            turn_id, question = turns[index]
            done.append({"id": turn_id, "conversation": conv_id, "turn": index + 1, "question": question,
                         **({"asked": asked} if asked != question else {}),
                         "text": answer.model_text, "finish": answer.finish_reason,
                         "passages": [{"source": Path(str(p.metadata.get("source", ""))).name, "text": p.page_content}
                                      for p in answer.passages]})  # fmt: skip
            print(json.dumps({k: done[-1][k] for k in ("id", "question", "text")}), flush=True)
            args.out.write_text(json.dumps({"answers": done}, indent=1) + "\n")


if __name__ == "__main__":
    main()
