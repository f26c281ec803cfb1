"""The main demo: document Q&A over the bundled corpus on the embedded default models, offline.

Indexes ``retrievers/data/corpus`` (five documents), then answers a few questions: each answer
streams as it is generated, followed by its citations and the speculative decoding stats. Then
every question is answered again with plain decoding, to show that the answers are identical and
how much faster speculative decoding was.

    python -m apps.demo ["your own question" ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ragspec.lc import ChatRagSpec
from ragspec.answers import Answer
from ragspec.pipeline import DocumentQA

CORPUS = Path(__file__).resolve().parents[1] / "retrievers" / "data" / "corpus"
QUESTIONS = [
    "How long is the trial period for new bakery staff?",
    "What are the hours of the early bake shift?",
    "How do I get rid of a stale lock left behind after tidepool crashed?",
]


ENDS = {"eos": "ended by itself", "stop": "ended by itself", "length": "cut at max_tokens",
        "repetition": "cut where it began repeating itself"}


def show(qa: DocumentQA, question: str) -> Answer:
    print(f"\nQ: {question}\nA: ", end="", flush=True)
    stream = qa.stream(question)
    for delta in stream:
        print(delta, end="", flush=True)
    answer = stream.answer
    assert answer is not None
    print()
    for c in answer.citations:
        where = ", ".join(x for x in (Path(c.source).name, c.location) if x)
        print(f"   [{c.number}] {where}: {c.text}")
    if not answer.supported:
        print(f"   {answer.note}")
    s = answer.stats
    print(f"   {s.new_tokens} tokens ({ENDS.get(answer.finish_reason, answer.finish_reason)}) in {s.wall_s:.2f} s ({s.decode_tokens_per_s:.1f} tok/s decode), "
          f"{s.tokens_per_forward:.2f} tokens per forward, {s.acceptance_rate:.0%} of drafted tokens accepted")
    return answer


def main(argv: list[str] | None = None) -> int:
    questions = (sys.argv[1:] if argv is None else argv) or QUESTIONS
    print(f"Indexing {CORPUS} ...", flush=True)
    start = time.perf_counter()
    qa = DocumentQA.from_paths(CORPUS, llm=ChatRagSpec(max_tokens=96), k=3)
    print(f"Indexed in {time.perf_counter() - start:.1f} s; loading SmolLM2-135M-Instruct (first run converts it once).")
    answers = [show(qa, question) for question in questions]
    plain_qa = DocumentQA(qa.retriever, ChatRagSpec(max_tokens=96, speculation=False))
    plain = [plain_qa.ask(question) for question in questions]
    same = sum(p.text == a.text for p, a in zip(plain, answers))
    rate = {name: sum(x.stats.new_tokens - 1 for x in xs) / sum(x.stats.wall_s - x.stats.ttft_s for x in xs)
            for name, xs in (("plain", plain), ("speculative", answers))}
    lengths = ", ".join(f"{a.stats.new_tokens} ({ENDS.get(a.finish_reason, a.finish_reason)})" for a in answers)
    print(f"\nPlain decoding of the same questions: {rate['plain']:.1f} tok/s; speculative: "
          f"{rate['speculative']:.1f} tok/s ({rate['speculative'] / rate['plain']:.2f}x) over answers of {lengths} "
          f"tokens; answers identical: {same}/{len(questions)}.")
    return 0 if same == len(questions) else 1


if __name__ == "__main__":
    raise SystemExit(main())
