"""Record the default model's own answers to many templated questions over the bundled corpus: training text for
the draft head (the ``head`` set of ``benchmarks/train_draft_head.py``).

The head learns what the target writes in answers, and 178 hand-asked answers were too few (it fit them to 0.95
and guessed 0.49 of the next-but-one tokens on unseen questions: docs/model-drafter.md). Questions here are made
by template from the corpus's own sentences ("What must the members do?", "Tell me about the sesame rule."), one
or more per chunk, so the answers cover every passage in the pipeline's answer style; no question is written by
hand and none is one of the unseen-question sets' (``heldout_questions.json``, ``fresh_questions.json``). Each is
asked as the demo asks (``DocumentQA``, k=3, greedy, fp32, ``max_tokens=96``); the file keeps each passage once
(``chunks``) and each answer's passages as indexes into it:

    python benchmarks/head_answers.py [--questions 400] [--out benchmarks/data/head_answers.json]

An ``--out`` file that exists is resumed (questions already answered are kept).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragspec.citations import sentence_spans  # noqa: E402
from ragspec.lc import ChatRagSpec  # noqa: E402
from ragspec.pipeline import DocumentQA  # noqa: E402
from retrievers import load_documents, split_documents  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "retrievers" / "data" / "corpus"
DATA = Path(__file__).resolve().parent / "data"
UNSEEN = ("heldout_questions.json", "fresh_questions.json")

TEMPLATES = (
    "What does the text say about {}?",
    "What do the documents say about {}?",
    "Tell me about {}.",
    "What should I know about {}?",
)
LEADING = frozenset("the a an this that these those it its there they we you he she his her our their in on at of to "
                    "and but so if when then also most each every all".split())
# A sentence "<subject> <verb> ..." with one of these verbs gives a wh-question about its subject.
ASK = {"is": "What is {}?", "are": "What are {}?", "was": "What was {}?", "were": "What were {}?",
       "has": "What does {} have?", "have": "What do {} have?", "had": "What did {} have?",
       "can": "What can {} do?", "must": "What must {} do?", "will": "What will {} do?", "should": "What should {} do?",
       "may": "What may {} do?"}


def _words(sentence: str) -> list[str]:
    words = [w.strip(".,;:!?()[]*`#\"'") for w in sentence.split()]
    return [w for w in words if w and re.fullmatch(r"[\w'-]+", w)]


def asked(sentence: str, rng: random.Random) -> str | None:
    """A question about ``sentence``: a wh-question about its subject where it reads "<subject> <verb> ..." with a
    verb of ``ASK`` after 2-6 words, else a template about a few of its first words; None for a sentence too short
    or too marked-up to ask about."""
    words = _words(sentence)
    for i, w in enumerate(words[:7]):
        if w.lower() in ASK and 2 <= i:
            return ASK[w.lower()].format(" ".join(words[:i]).lower())
    while words and words[0].lower() in LEADING:
        words.pop(0)
    if len(words) < 4:
        return None
    phrase = words[: rng.randint(2, 5)]
    while phrase and phrase[-1].lower() in LEADING:
        phrase.pop()
    return rng.choice(TEMPLATES).format(" ".join(phrase).lower()) if len(phrase) >= 2 else None


def questions(n: int, seed: int = 0) -> list[str]:
    """Up to ``n`` questions over the bundled corpus's chunks, taken round-robin over chunks and sentences so that
    every passage is asked about; none equals a question of the unseen-question sets."""
    rng = random.Random(seed)
    unseen = {q["question"] for f in UNSEEN for q in json.loads((DATA / f).read_text())["questions"]}
    per_chunk = [[s for a, b in sentence_spans(c.page_content) if (s := c.page_content[a:b])]
                 for c in split_documents(load_documents(CORPUS).documents)]
    for sentences in per_chunk:
        rng.shuffle(sentences)
    out: list[str] = []
    for round_ in range(max(map(len, per_chunk))):
        for sentences in per_chunk:
            if round_ < len(sentences) and (q := asked(sentences[round_], rng)) and q not in unseen and q not in out:
                out.append(q)
                if len(out) == n:
                    return out
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=DATA / "head_answers.json")
    args = parser.parse_args()
    record = json.loads(args.out.read_text()) if args.out.exists() else {"chunks": [], "answers": []}
    record["description"] = ("The default model's answers (DocumentQA, k=3, greedy, fp32, max_tokens="
                             f"{args.max_tokens}) to templated questions over the bundled corpus, written by "
                             "benchmarks/head_answers.py; training text of the draft head.")
    chunks: dict[tuple[str, str], int] = {(c["source"], c["text"]): i for i, c in enumerate(record["chunks"])}
    done = {a["question"] for a in record["answers"]}
    qa = DocumentQA.from_paths(CORPUS, llm=ChatRagSpec(max_tokens=args.max_tokens, dtype="float32"), k=3)
    for question in questions(args.questions):
        if question in done:
            continue
        answer = qa.ask(question)
        refs = []
        for p in answer.passages:
            key = (Path(str(p.metadata.get("source", ""))).name, p.page_content)
            if key not in chunks:
                chunks[key] = len(record["chunks"])
                record["chunks"].append({"source": key[0], "text": key[1]})
            refs.append(chunks[key])
        record["answers"].append({"question": question, "text": answer.model_text, "passages": refs})
        print(json.dumps({"question": question, "text": answer.model_text[:80]}), flush=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
