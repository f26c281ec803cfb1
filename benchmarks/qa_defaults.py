"""Choosing the QA defaults of the default model: penalties and the repetition stop, measured.

Answers the bundled questions (``retrievers/data/questions.json``, 39, and the 12 the corpus cannot
answer in ``benchmarks/data/unanswerable.json``) over the bundled corpus as
the demo does (``DocumentQA``, k=3, the default model, greedy) under several penalty settings,
and for each answer records its tokens, finish reason, speed and whether it is right. Because the
repetition stop only cuts an answer short, its effect for every N (N tokens or a whole sentence) is
computed from the same answers (``first_repeat``), without generating again.

"Right" is a word check, not a judge: at least half of the reference answer's content words
(lower-cased, numbers kept, a short stop list removed) occur in the answer.

Support and "I don't know" are measured against hand labels (``benchmarks/data/qa_labels.json``:
answerable or not, which passage holds the answer, and whether each answer of the setting "none",
cut by ``QA_DEFAULTS``' stop, is right), for the citation rules with and without the on-topic check
(``choose_citations`` without and with the question); a label counts only for an answer with its
exact text. ``--from FILE`` recomputes the stop table and support from a stored run's answers
without generating again (its speed figures stay those of the run).

    flock /tmp/ragspec-bench.lock python benchmarks/qa_defaults.py --out docs/bench/qa_defaults.json
    python benchmarks/qa_defaults.py --from docs/bench/qa_defaults.json
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from langchain_core.documents import Document

from ragspec.lc import ChatRagSpec
from ragspec.citations import choose_citations
from ragspec.pipeline import QA_DEFAULTS, DocumentQA
from ragspec.remote import load_tokenizer
from ragspec.engine.text import RepeatGuard, sentence_end_tokens

DATA = Path(__file__).resolve().parents[1] / "retrievers" / "data"
STOP_WORDS = frozenset(
    "a an the of to in on at for and or is are was were be been it its this that with by from as per "
    "each every do does did not no can you your they their there which who what when how why".split()
)
SETTINGS = {
    "none": {},
    "repeat_penalty=1.1": {"repeat_penalty": 1.1},
}
STOPS = (0, 8, 12, 16, 24)


def words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+(?:[.:][0-9]+)?", text.lower()) if w not in STOP_WORDS]


def right(answer: str, reference: str) -> bool:
    """At least half of the reference's content words occur in the answer."""
    want, have = set(words(reference)), set(words(answer))
    return bool(want) and len(want & have) >= len(want) / 2


def first_repeat(ids: list[int], n: int, tokenizer: object) -> int | None:
    """Where the answer first repeats ``n`` of its own tokens or a whole sentence: where
    ``repetition_stop=n`` cuts it."""
    return RepeatGuard(n, sentence_end_tokens(tokenizer)).add(ids)  # type: ignore[arg-type]


def by_stop(rows: list[dict[str, object]], tokenizer: object) -> dict[str, dict[str, object]]:
    """Right answers, answers cut at ``max_tokens``, cut by the stop, and mean length, for each stop N."""
    table = {}
    for n in STOPS:
        ids = [tokenizer.encode(r["text"], add_special_tokens=False) for r in rows]  # type: ignore[attr-defined]
        cut = [first_repeat(i, n, tokenizer) if n else None for i in ids]
        texts = [r["text"] if c is None else tokenizer.decode(i[:c]) for r, i, c in zip(rows, ids, cut)]  # type: ignore[attr-defined]
        table[f"repetition_stop={n}"] = {
            "right": sum(right(t, r["reference"]) for t, r in zip(texts, rows)),  # type: ignore[arg-type]
            "hit_max_tokens": sum(r["finish"] == "length" and c is None for r, c in zip(rows, cut)),
            "cut_by_stop": sum(c is not None for c in cut),
            "mean_tokens": sum(len(i) if c is None else c for i, c in zip(ids, cut)) / len(rows),
        }
    return table


def share(n: int, of: int) -> str:
    return f"{n}/{of}" + (f" ({n / of:.0%})" if of else "")


def support(answers: list[dict[str, object]], questions: dict[str, str], tokenizer: object) -> dict[str, object]:
    """Precision and recall of ``supported`` and of the cited passage, and "I don't know" rates, against
    the hand labels, for the citation rules without (``before``) and with (``after``) the question."""
    labels = {row["id"]: row for row in json.loads((Path(__file__).parent / "data" / "qa_labels.json").read_text())["labels"]}
    stop = QA_DEFAULTS["repetition_stop"]
    cases = []
    for a in answers:
        ids = tokenizer.encode(a["text"], add_special_tokens=False)  # type: ignore[attr-defined]
        cut = first_repeat(ids, stop, tokenizer)
        text = a["text"] if cut is None else tokenizer.decode(ids[:cut])  # type: ignore[attr-defined]
        label = labels.get(a["id"])  # type: ignore[call-overload]
        if label is not None and label["text"] == text:
            passages = [Document(p["text"]) for p in a["passages"]]  # type: ignore[attr-defined]
            cases.append((label, text, passages, questions[a["id"]]))  # type: ignore[index]
    report: dict[str, object] = {"labelled": f"{len(cases)}/{len(answers)}"}
    for name, with_question in (("before", False), ("after", True)):
        rows = [(label, choose_citations(text, passages, question if with_question else "")[0])
                for label, text, passages, question in cases]  # fmt: skip
        right = [(label, cited) for label, cited in rows if label["verdict"] == "right"]
        supported = [(label, cited) for label, cited in rows if cited]
        answerable = [cited for label, cited in rows if label["answerable"]]
        unanswerable = [cited for label, cited in rows if not label["answerable"]]
        report[name] = {
            "dont_know_on_unanswerable": share(sum(not c for c in unanswerable), len(unanswerable)),
            "dont_know_on_answerable": share(sum(not c for c in answerable), len(answerable)),
            "dont_know_on_right_answers": share(sum(not c for _, c in right), len(right)),
            "dont_know_on_other_answers": share(sum(not c for label, c in rows if label["verdict"] != "right"), len(rows) - len(right)),
            "supported_precision": share(sum(label["verdict"] == "right" for label, _ in supported), len(supported)),
            "supported_recall": share(sum(bool(c) for _, c in right), len(right)),
            "cited_passage_precision": share(sum(label["verdict"] == "right" and n == label["passage"]
                                                 for label, c in supported for n in c),
                                             sum(len(c) for _, c in supported)),  # fmt: skip
            "cited_passage_recall": share(sum(label["passage"] in c for label, c in right), len(right)),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=39)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--from", dest="stored", type=Path, default=None, help="a stored run: recompute support only")
    args = parser.parse_args()
    questions = json.loads((DATA / "questions.json").read_text())["questions"][: args.questions]
    unanswerable = json.loads((Path(__file__).parent / "data" / "unanswerable.json").read_text())["questions"]
    questions += [{**q, "answer": ""} for q in unanswerable]  # reference "": never counted right
    asked = {q["id"]: q["question"] for q in questions}
    if args.stored is not None:  # the answers as stored; speed is not recomputed
        stored = json.loads(args.stored.read_text())
        tokenizer = load_tokenizer("default")  # the default model's, without its weights
        references = {q["id"]: q["answer"] for q in questions}
        for name, setting in stored["settings"].items():
            rows = [{**a, "reference": references[a["id"]]} for a in setting["answers"] if references[a["id"]]]
            setting["by_stop"] = by_stop(rows, tokenizer)
            print(name, json.dumps(setting["by_stop"]), flush=True)
        stored["support"] = support(stored["settings"]["none"]["answers"], asked, tokenizer)
        print(json.dumps(stored["support"], indent=1))
        if args.out is not None:
            args.out.write_text(json.dumps(stored, indent=1) + "\n")
        return
    # No QA defaults: the repetition stop is applied afterwards, for every N, to the same answers.
    # fp32 prompts: the stored, hand-labelled answers are fp32 answers (the default on a CPU that computes bf16
    # runs prompts in bf16 and may answer otherwise: docs/backends.md, "bf16 prompts").
    qa = DocumentQA.from_paths(DATA / "corpus", llm=ChatRagSpec(max_tokens=args.max_tokens, dtype="float32"), k=3, generation={})
    tokenizer = qa.llm.load().tokenizer
    qa.ask("Warm-up: what is Kestrel Lane?", max_tokens=8)
    report: dict[str, object] = {"max_tokens": args.max_tokens, "questions": len(questions), "settings": {}}
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in SETTINGS}
    for q in questions:  # settings interleaved per question, so a busy machine slows them alike
        for name, options in SETTINGS.items():
            start = time.perf_counter()
            answer = qa.ask(q["question"], **options)
            s = answer.stats
            runs[name].append({"id": q["id"], "text": answer.text, "finish": answer.finish_reason,
                               "tokens": s.new_tokens, "forwards": s.forward_passes, "decode_s": s.wall_s - s.ttft_s,
                               "wall_s": time.perf_counter() - start, "reference": q["answer"],
                               "passages": [{"source": Path(p.metadata.get("source", "")).name, "text": p.page_content}
                                            for p in answer.passages],
                               "citations": [c.number for c in answer.citations]})  # fmt: skip
    for name, everything in runs.items():
        rows = [r for r in everything if r["reference"]]
        decode_tokens = sum(int(r["tokens"]) - 1 for r in rows)  # type: ignore[call-overload]
        report["settings"][name] = {  # type: ignore[index]
            "by_stop": by_stop(rows, tokenizer),
            "decode_tokens_per_s": decode_tokens / sum(float(r["decode_s"]) for r in rows),  # type: ignore[arg-type]
            "tokens_per_forward": sum(int(r["tokens"]) for r in rows) / sum(int(r["forwards"]) for r in rows),  # type: ignore[call-overload]
            "answers": [{k: r[k] for k in ("id", "text", "finish", "tokens", "citations", "passages")} for r in everything],
        }
        print(name, json.dumps({k: v for k, v in report["settings"][name].items() if k != "answers"}), flush=True)  # type: ignore[index]
    report["support"] = support(report["settings"]["none"]["answers"], asked, tokenizer)  # type: ignore[index]
    print(json.dumps(report["support"], indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
