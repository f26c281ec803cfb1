"""Predicted Outputs: an edit-a-file workload with and without ``prediction``, interleaved.

Each request asks the model to make a small edit to a short source file and reply with the whole
file; the file is in the prompt (as editing tools send it) and, in one arm, also the prediction
(OpenAI's ``prediction: {"type": "content", "content": <the file>}``, which ``/v1`` drafts from as
one more reference: ``GenerationStream`` gets it after the request's references). The other arm is the same
request without it. Greedy, so both arms must give the same tokens (checked). Reported per arm:
seconds per request (median), decode tokens/s, tokens per target forward; for the prediction arm the
accepted and rejected prediction tokens (``apps.web.openai_api.prediction_details``, as in
``usage.completion_tokens_details``) and the share of output tokens accepted from the prediction.

    flock /tmp/ragspec-bench.lock python benchmarks/prediction_bench.py

Run it under the exclusive bench lock: the ratio is only meaningful when nothing else runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python benchmarks/prediction_bench.py` from any folder
    sys.path.insert(0, str(REPO))

from apps.web.openai_api import prediction_details  # noqa: E402
from ragspec.decoding.generator import SpeculativeGenerator  # noqa: E402
from ragspec.engine.ngram import NgramDrafter  # noqa: E402
from ragspec.backends import TargetModel  # noqa: E402
from ragspec.prompts import chat_prompt_ids  # noqa: E402

FILES = [
    (
        "Rename the function `total` to `order_total`.",
        '''def total(items):
    """The price of an order: each item's price times its quantity, summed."""
    result = 0
    for item in items:
        result += item.price * item.quantity
    return result


def average_price(items):
    """The mean price of the items, or 0 for none."""
    if not items:
        return 0
    return total(items) / len(items)
''',
    ),
    (
        "Change the default port from 8000 to 8080.",
        '''import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Serve the documents.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    return parser.parse_args(argv)
''',
    ),
    (
        "Add a docstring to the class.",
        '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, word):
        self.counts[word] = self.counts.get(word, 0) + 1

    def most_common(self, n):
        return sorted(self.counts.items(), key=lambda kv: -kv[1])[:n]
''',
    ),
]
SYSTEM = "You edit code. Reply with the whole updated file and nothing else."


def prompt_ids(generator: SpeculativeGenerator, instruction: str, source: str) -> list[int]:
    user = f"{instruction}\n\n```python\n{source}```"
    return chat_prompt_ids(generator.tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])


def run(generator: SpeculativeGenerator, ids: list[int], prediction: str | None, max_tokens: int) -> dict[str, Any]:
    references = [] if prediction is None else [prediction]  # /v1: the request's references (none), then the prediction
    result = generator.generate(ids, references=references, max_tokens=max_tokens, temperature=0.0)
    s = result.stats
    row: dict[str, Any] = {"token_ids": result.token_ids, "new_tokens": s.new_tokens, "wall_s": s.wall_s,
                           "ttft_s": s.ttft_s, "forwards": s.forward_passes}  # fmt: skip
    if prediction is not None:
        row.update(prediction_details(s, 0))
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(r["new_tokens"] for r in rows)
    decode_s = sum(r["wall_s"] - r["ttft_s"] for r in rows)
    out: dict[str, Any] = {
        "requests": len(rows),
        "new_tokens": tokens,
        "median_s": round(statistics.median(r["wall_s"] for r in rows), 3),
        "decode_tokens_per_s": round((tokens - len(rows)) / decode_s, 2) if decode_s > 0 else 0.0,
        "tokens_per_forward": round(tokens / max(1, sum(r["forwards"] for r in rows)), 2),
    }
    if "accepted_prediction_tokens" in rows[0]:
        accepted = sum(r["accepted_prediction_tokens"] for r in rows)
        out.update(accepted_prediction_tokens=accepted, rejected_prediction_tokens=sum(r["rejected_prediction_tokens"] for r in rows),
                   accepted_share=round(accepted / tokens, 3) if tokens else 0.0)  # fmt: skip
    return out


def benchmark(model: TargetModel | str, files: int, repeats: int, max_tokens: int) -> dict[str, Any]:
    # No index of earlier answers: otherwise the arm run second would draft from the first arm's answer.
    generator = SpeculativeGenerator(model, drafter=NgramDrafter(history_tokens=0))
    arms: dict[str, list[dict[str, Any]]] = {"without_prediction": [], "with_prediction": []}
    identical = 0
    for r in range(repeats):
        for i, (instruction, source) in enumerate(FILES[:files]):
            ids = prompt_ids(generator, instruction, source)
            order = ["without_prediction", "with_prediction"] if (r + i) % 2 == 0 else ["with_prediction", "without_prediction"]
            got = {}
            for arm in order:
                generator.clear_cache()  # each arm prefills cold
                got[arm] = run(generator, ids, source if arm == "with_prediction" else None, max_tokens)
                arms[arm].append(got[arm])
            identical += got["with_prediction"]["token_ids"] == got["without_prediction"]["token_ids"]
    summary = {arm: summarize(rows) for arm, rows in arms.items()}
    base, pred = summary["without_prediction"], summary["with_prediction"]
    ratio = base["median_s"] / pred["median_s"] if pred["median_s"] else 0.0
    return {"model": generator.model_name, "max_tokens": max_tokens, "identical": f"{identical}/{len(arms['with_prediction'])}",
            "speedup_median_s": round(ratio, 2), "arms": summary}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/prediction_bench.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--model", default="default", help="model to run (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--files", type=int, default=len(FILES), choices=range(1, len(FILES) + 1), metavar=f"1..{len(FILES)}",
                        help="how many of the edit tasks to run")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the tasks (default: 3)")
    parser.add_argument("--max-tokens", type=int, default=160, help="answer budget (default: 160, about one file)")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.max_tokens < 1:
        parser.error("--repeats and --max-tokens must be at least 1")
    report = benchmark(args.model, args.files, args.repeats, args.max_tokens)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
