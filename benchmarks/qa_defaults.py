"""Choosing the QA defaults of the default model: penalties and the repetition stop, measured.

Answers the bundled questions (``retrievers/data/questions.json``, 39, and the 12 the corpus cannot
answer in ``benchmarks/data/unanswerable.json``) over the bundled corpus as
the demo does (``DocumentQA``, k=3, the default model, greedy) under several penalty settings,
and for each answer records its tokens, finish reason, speed and whether it is right. Because the
repetition stop only cuts an answer short, its effect for every N is computed from the same
answers (``first_repeat``), without generating again.

"Right" is a word check, not a judge: at least half of the reference answer's content words
(lower-cased, numbers kept, a short stop list removed) occur in the answer.

    flock /tmp/ragspec-bench.lock python benchmarks/qa_defaults.py --out docs/bench/qa_defaults.json
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from ragspec.lc import ChatRagSpec
from ragspec.pipeline import DocumentQA

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


def first_repeat(ids: list[int], n: int) -> int | None:
    """Where the answer first starts repeating ``n`` of its own tokens (as ``RepeatGuard`` finds it)."""
    seen: set[tuple[int, ...]] = set()
    for end in range(n, len(ids) + 1):
        gram = tuple(ids[end - n : end])
        if gram in seen:
            return end - n
        seen.add(gram)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=39)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    questions = json.loads((DATA / "questions.json").read_text())["questions"][: args.questions]
    unanswerable = json.loads((Path(__file__).parent / "data" / "unanswerable.json").read_text())["questions"]
    questions += [{**q, "answer": ""} for q in unanswerable]  # reference "": never counted right
    # No QA defaults: the repetition stop is applied afterwards, for every N, to the same answers.
    qa = DocumentQA.from_paths(DATA / "corpus", llm=ChatRagSpec(max_tokens=args.max_tokens), k=3, generation={})
    tokenizer = qa.llm.load().lm.tokenizer
    qa.ask("Warm-up: what is Kestrel Lane?", max_tokens=8)
    report: dict[str, object] = {"max_tokens": args.max_tokens, "questions": len(questions), "settings": {}}
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in SETTINGS}
    for q in questions:  # settings interleaved per question, so a busy machine slows them alike
        for name, options in SETTINGS.items():
            start = time.perf_counter()
            answer = qa.ask(q["question"], **options)
            s = answer.stats
            ids = tokenizer.encode(answer.text, add_special_tokens=False)
            runs[name].append({"id": q["id"], "text": answer.text, "ids": ids, "finish": answer.finish_reason,
                               "tokens": s.new_tokens, "forwards": s.forward_passes, "decode_s": s.wall_s - s.ttft_s,
                               "wall_s": time.perf_counter() - start, "reference": q["answer"],
                               "passages": [{"source": Path(p.metadata.get("source", "")).name, "text": p.page_content}
                                            for p in answer.passages],
                               "citations": [c.number for c in answer.citations]})  # fmt: skip
    for name, everything in runs.items():
        rows = [r for r in everything if r["reference"]]
        table = {}
        for n in STOPS:
            cut = [first_repeat(r["ids"], n) if n else None for r in rows]  # type: ignore[arg-type]
            texts = [r["text"] if c is None else tokenizer.decode(r["ids"][:c]) for r, c in zip(rows, cut)]  # type: ignore[index]
            table[f"repetition_stop={n}"] = {
                "right": sum(right(t, r["reference"]) for t, r in zip(texts, rows)),  # type: ignore[arg-type]
                "hit_max_tokens": sum(r["finish"] == "length" and c is None for r, c in zip(rows, cut)),
                "cut_by_stop": sum(c is not None for c in cut),
                "mean_tokens": sum(len(r["ids"]) if c is None else c for r, c in zip(rows, cut)) / len(rows),  # type: ignore[arg-type]
            }
        decode_tokens = sum(int(r["tokens"]) - 1 for r in rows)  # type: ignore[call-overload]
        report["settings"][name] = {  # type: ignore[index]
            "by_stop": table,
            "decode_tokens_per_s": decode_tokens / sum(float(r["decode_s"]) for r in rows),  # type: ignore[arg-type]
            "tokens_per_forward": sum(int(r["tokens"]) for r in rows) / sum(int(r["forwards"]) for r in rows),  # type: ignore[call-overload]
            "answers": [{k: r[k] for k in ("id", "text", "finish", "tokens", "citations", "passages")} for r in everything],
        }
        print(name, json.dumps({k: v for k, v in report["settings"][name].items() if k != "answers"}), flush=True)  # type: ignore[index]
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
