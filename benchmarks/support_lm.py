"""Does the generator itself tell right answers from wrong ones? Model-based support signals on the hand labels.

``Answer.supported`` comes from lexical rules (``ragspec.citations.choose_citations``). This measures, on the
labelled answers of ``benchmarks/support_eval.py`` that the rules mark supported, signals computed with the
model that wrote the answers (the default model; no new weights), each meant as an extra condition of
``supported`` (rules AND signal):

- ``pmi_mean``: mean log p(answer token | the QA prompt with its passages) minus the same with no passages
  (an answer the model writes without the passages is a parametric guess);
- ``pmi_cited``: the same with only the cited passages in the prompt;
- ``pmi_min``: the smallest per-token difference of ``pmi_mean``'s two terms (the least supported token);
- ``pmi_sentence``: the smallest mean difference over the answer's sentences (one bad sentence sinks it);
- ``lp_with``: mean log p(answer token | the QA prompt with its passages) alone;
- ``verify_question`` / ``verify_claim``: log p(Yes) - log p(No) for a verification prompt over the cited
  passages ("Passage: … Question: … Answer: … Does the passage support this answer?" / "Passage: … Claim: …
  Does the passage say this?");
- ``verify_sentences``: the smallest such margin over the answer's sentences, each against the passage sentences
  it drew from (``ragspec.citations.drawn_sentences``), with a four-example plain-text prompt (``FEW_SHOT``).

Thresholds are chosen on the "tuned" part only (and, in a second row, on tuned + held-out): the largest that
keeps every right answer of the fit parts supported. Fresh, fresh2, fresh3 and fresh4 are held out of every choice
(fresh4 was also labelled after these signals' figures were published: the test of ``verify_sentences``, the lead).
Each row prints ``supported`` precision and recall per part as ``support_eval.py`` counts them, with the
rules alone first. The last table gives each signal's AUC (right against wrong answers among those the
rules mark supported: 0.5 is chance).

    python benchmarks/support_lm.py [--limit N] [--json FILE]   # runs the model on each supported answer
    python benchmarks/support_lm.py --from FILE                  # the tables again from a --json file
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from statistics import fmean
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.support_eval import Case, cases, share  # noqa: E402
from ragspec.citations import choose_citations, drawn_sentences  # noqa: E402
from ragspec.citations import sentence_spans as citation_sentences  # noqa: E402
from ragspec.prompts import chat_prompt_ids, qa_messages  # noqa: E402

if TYPE_CHECKING:
    from langchain_core.documents import Document

    from ragspec.backends.pytorch.loading import LoadedModel

PARTS = ("tuned", "held-out", "fresh", "fresh2", "fresh3", "fresh4")
GROUPS = {p: (p,) for p in PARTS} | {"all": PARTS, "fresh + fresh2 + fresh3": ("fresh", "fresh2", "fresh3"),
                                     "fresh + fresh2 + fresh3 + fresh4": ("fresh", "fresh2", "fresh3", "fresh4")}
VERIFY = {
    "verify_question": "Passage:\n{passage}\n\nQuestion: {question}\nAnswer: {answer}\n\n"
    "Does the passage support this answer? Answer Yes or No.",
    "verify_claim": "Passage:\n{passage}\n\nClaim: {answer}\n\nDoes the passage say this? Answer Yes or No.",
}
"""The verification prompts (one user turn each), by signal name."""
FEW_SHOT = (
    "Passage: The museum opens at 10 am on weekdays and at noon on Sundays.\nQuestion: When does the museum open on Sundays?\n"
    "Answer: The museum opens at noon on Sundays.\nDoes the passage support the answer? Yes\n\n"
    "Passage: The bridge was built in 1820 by a local mason.\nQuestion: Who built the bridge?\n"
    "Answer: The bridge was built in 1902 by the town council.\nDoes the passage support the answer? No\n\n"
    "Passage: The shop sells bread and cakes.\nQuestion: What does the shop sell?\n"
    "Answer: The shop sells bread and cakes.\nDoes the passage support the answer? Yes\n\n"
    "Passage: Members meet every Tuesday in the library.\nQuestion: Where do members meet?\n"
    "Answer: Members meet every Tuesday.\nDoes the passage support the answer? No\n\n"
    "Passage: {passage}\nQuestion: {question}\nAnswer: {answer}\nDoes the passage support the answer?"
)
"""A few-shot plain-text verification prompt (no chat template; made-up examples, none from the labels): the
next token's " Yes" against " No", per answer sentence against the passage sentences it drew from."""
_SENTENCE_END = re.compile(r"[.!?:]\s|\n")


def answer_logprobs(loaded: LoadedModel, messages: list[dict[str, str]], answer: str) -> list[float]:
    """log p of each of ``answer``'s tokens after the prompt of ``messages``."""
    import torch

    prompt = chat_prompt_ids(loaded.tokenizer, messages)
    ids = loaded.tokenizer.encode(answer, add_special_tokens=False)
    with torch.no_grad():
        logits = loaded.model(torch.tensor([prompt + ids], device=loaded.device)).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1)  # [len(ids), vocab]
    return logp.gather(1, torch.tensor(ids, device=loaded.device)[:, None])[:, 0].tolist()


def yes_no_margin(loaded: LoadedModel, prompt: str, chat: bool = True) -> float:
    """log p(Yes) - log p(No) for the first token of the model's reply to ``prompt`` (spellings "Yes", " Yes", "yes"
    pooled), as a chat turn or, ``chat=False``, as plain text to continue."""
    import torch

    first = [loaded.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("Yes", " Yes", "yes", "No", " No", "no")]
    if chat:
        ids = chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": prompt}])
    else:
        ids = loaded.tokenizer.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        logp = torch.log_softmax(loaded.model(torch.tensor([ids], device=loaded.device)).logits[0, -1].float(), -1)
    return (torch.logsumexp(logp[first[:3]], 0) - torch.logsumexp(logp[first[3:]], 0)).item()


def case_signals(loaded: LoadedModel, case: Case, cited: Sequence[int]) -> dict:
    """The stored measurements of one supported answer: per-token log-probabilities with all passages, none and
    the cited ones, the verification margins, and the seconds they took."""
    start = time.perf_counter()
    ids = loaded.tokenizer.encode(case.text, add_special_tokens=False)
    shown = [case.passages[n - 1] for n in cited]
    row = {
        "id": case.id, "part": case.part, "group": case.group, "right": case.right, "text": case.text, "cited": list(cited),
        "tokens": [loaded.tokenizer.decode([i]) for i in ids],
        "with": answer_logprobs(loaded, qa_messages(case.question, case.passages), case.text),
        "none": answer_logprobs(loaded, qa_messages(case.question, []), case.text),
        "cited_only": answer_logprobs(loaded, qa_messages(case.question, shown), case.text),
    }  # fmt: skip
    passage = "\n\n".join(p.page_content for p in shown)
    for name, template in VERIFY.items():
        row[name] = yes_no_margin(loaded, template.format(passage=passage, question=case.question, answer=case.text))
    row["verify_sentences"] = sentence_margins(loaded, case, shown)
    row["seconds"] = time.perf_counter() - start
    return row


def sentence_margins(loaded: LoadedModel, case: Case, shown: Sequence[Document]) -> list[float]:
    """``FEW_SHOT``'s margin for each sentence of the answer against the sentences of ``shown`` it drew from."""
    margins = []
    for s, e in citation_sentences(case.text):
        sentence = case.text[s:e]
        drawn = [p.page_content[a:b] for p in shown for a, b in [drawn_sentences(sentence, p.page_content, case.question)] if b > a]
        passage = " ".join(drawn) or " ".join(p.page_content for p in shown)
        margins.append(yes_no_margin(loaded, FEW_SHOT.format(passage=passage, question=case.question, answer=sentence), chat=False))
    return margins


def token_sentences(tokens: Sequence[str]) -> list[range]:
    """Token ranges of the answer's sentences: a sentence ends after a token whose text ends one."""
    spans, start = [], 0
    for i, token in enumerate(tokens):
        if _SENTENCE_END.search(token + " ") and i + 1 > start:
            spans.append(range(start, i + 1))
            start = i + 1
    if start < len(tokens):
        spans.append(range(start, len(tokens)))
    return spans


def _pmi_sentence(row: dict) -> float:
    diff = [a - b for a, b in zip(row["with"], row["none"])]
    return min(fmean([diff[i] for i in span]) for span in token_sentences(row["tokens"]))


SIGNALS: dict[str, Callable[[dict], float]] = {
    "pmi_mean": lambda r: fmean(r["with"]) - fmean(r["none"]),
    "pmi_cited": lambda r: fmean(r["cited_only"]) - fmean(r["none"]),
    "pmi_min": lambda r: min(a - b for a, b in zip(r["with"], r["none"])),
    "pmi_sentence": _pmi_sentence,
    "lp_with": lambda r: fmean(r["with"]),
    "verify_question": lambda r: r["verify_question"],
    "verify_claim": lambda r: r["verify_claim"],
    "verify_sentences": lambda r: min(r["verify_sentences"]),
}
"""Each signal from a stored row: higher means more likely right."""


def collect(loaded: LoadedModel, rows: Sequence[Case]) -> list[dict]:
    """``case_signals`` for each of ``rows`` the rules (``choose_citations``) mark supported."""
    out = []
    for case in rows:
        cited, _ = choose_citations(case.text, case.passages, case.question)
        if cited:
            out.append(case_signals(loaded, case, cited))
    return out


def threshold(rows: Sequence[dict], signal: str, fit: Sequence[str]) -> float | None:
    """The largest threshold that keeps every right answer of the ``fit`` parts; None when they hold none."""
    scores = [SIGNALS[signal](r) for r in rows if r["right"] and r["part"] in fit]
    return min(scores) if scores else None


def counts(rows: Sequence[dict], totals: dict[str, tuple[int, int]], keep: Callable[[dict], bool]) -> dict[str, list[str]]:
    """Per group of ``GROUPS``: answers, right answers, and ``supported`` precision and recall of (rules AND ``keep``);
    ``totals`` holds each part's labelled and right answers."""
    cells = {}
    for group, parts in GROUPS.items():
        kept = [r for r in rows if r["part"] in parts and keep(r)]
        hits = sum(r["right"] for r in kept)
        answers, right = (sum(totals.get(p, (0, 0))[i] for p in parts) for i in (0, 1))
        cells[group] = [str(answers), str(right), share(hits, len(kept)), share(hits, right)]
    return cells


def auc(rows: Sequence[dict], signal: str) -> float | None:
    """The chance that a right answer scores above a wrong one (ties count half); None without both."""
    good = [SIGNALS[signal](r) for r in rows if r["right"]]
    bad = [SIGNALS[signal](r) for r in rows if not r["right"]]
    if not good or not bad:
        return None
    return sum((g > b) + 0.5 * (g == b) for g in good for b in bad) / (len(good) * len(bad))


def tables(rows: Sequence[dict], totals: dict[str, tuple[int, int]]) -> str:
    """The precision/recall table in ``support_eval.py``'s columns (rules alone, then rules AND each signal at each
    fit, a row per group) and the AUC table."""
    sets = {"rules alone": lambda r: True}
    for fit in (("tuned",), ("tuned", "held-out")):
        for name, signal in SIGNALS.items():
            if (t := threshold(rows, name, fit)) is not None:
                sets[f"rules and {name} >= {t:.2f} (fit on {' + '.join(fit)})"] = lambda r, s=signal, t=t: s(r) >= t
    lines = ["| rules | group | answers | right | supported precision | supported recall |", "|---|---|---|---|---|---|"]
    for label, keep in sets.items():
        lines += [f"| {label} | {group} | " + " | ".join(cells) + " |" for group, cells in counts(rows, totals, keep).items()]
    lines += ["", "| signal | AUC, all parts | AUC, fresh + fresh2 + fresh3 |", "|---|---|---|"]
    held = [r for r in rows if r["part"] in GROUPS["fresh + fresh2 + fresh3"]]
    for name in SIGNALS:
        cells = [f"{a:.2f}" if (a := auc(part, name)) is not None else "-" for part in (rows, held)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    seconds = [r["seconds"] for r in rows if "seconds" in r]
    if seconds:
        lines += ["", f"{len(seconds)} answers, {fmean(seconds):.1f} s each for all signals (5 forwards and one per answer sentence)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/support_lm.py", description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N labelled answers of each set")
    parser.add_argument("--json", type=Path, default=None, help="also write the per-answer measurements here")
    parser.add_argument("--from", dest="source", type=Path, default=None, help="tables from a --json file; no model runs")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the model's dtype on the CPU")
    args = parser.parse_args(argv)
    labelled = cases(args.limit)
    totals = {p: (sum(c.part == p for c in labelled), sum(c.right for c in labelled if c.part == p)) for p in PARTS}
    if args.source is not None:
        rows = json.loads(args.source.read_text())["answers"]
    else:
        import torch

        from ragspec.backends.pytorch.loading import load_torch_model

        if args.threads:
            torch.set_num_threads(args.threads)
        rows = collect(load_torch_model(device="cpu", dtype=args.dtype), labelled)
    print(tables(rows, totals))
    if args.json is not None:
        args.json.write_text(json.dumps({"answers": rows}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
