"""What the public prefix saves: each question the first of a new cache scope, with and without it.

The question-answering prompt's fixed part (``ragspec.prompts.qa_prefix_ids``: template, system text and
instructions) is cached once per process and reused by every cache scope (``ragspec.engine.prefix_cache``).
Here each of the 51 bundled questions (``docs/bench/qa_defaults.json``: the question and the 3 passages
the demo's retrieval gave it) is asked in a scope of its own, as the first question of a new web session
or ``/v1`` client is: once on a generator that keeps prefixes (the public prefix hits, nothing else can)
and, right after, on one without a prefix cache over the same weights (a cold prefill). Reported: prompt
tokens, tokens reused, and the median time to the first token of each (one new token, greedy):

    python benchmarks/public_prefix_bench.py [--questions N] [--dtype float32]

The token counts do not depend on timing; the TTFT figures need a quiet machine (about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ragspec.backends import load_model  # noqa: E402
from ragspec.decoding.generator import SpeculativeGenerator  # noqa: E402
from ragspec.engine.tenancy import cache_scope  # noqa: E402
from ragspec.prompts import qa_prefix_ids, qa_prompt_ids  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=51)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    stored = json.loads((REPO / "docs" / "bench" / "qa_defaults.json").read_text())["settings"]["none"]["answers"]
    asked = {q["id"]: q["question"] for name in ("retrievers/data/questions.json", "benchmarks/data/unanswerable.json")
             for q in json.loads((REPO / name).read_text())["questions"]}  # fmt: skip
    model = load_model("default", dtype=args.dtype, backend="torch")
    warm = SpeculativeGenerator(model, public_prefix=qa_prefix_ids(model.tokenizer))  # as ragspec.registry's
    cold = SpeculativeGenerator(model, prefix_cache=False)
    prompts = [qa_prompt_ids(warm.tokenizer, asked[a["id"]], [p["text"] for p in a["passages"]])
               for a in stored[: args.questions]]  # fmt: skip
    with cache_scope("warm-up"):  # computes the public prefix once, as the process's first question does
        warm.generate(prompts[0], max_new_tokens=1)
    cold.generate(prompts[0], max_new_tokens=1)
    rows = []
    for i, prompt in enumerate(prompts):
        with cache_scope(f"user-{i}"):
            hit = warm.generate(prompt, max_new_tokens=1).stats
        rows.append((len(prompt), hit.cached_prompt_tokens, hit.ttft_s, cold.generate(prompt, max_new_tokens=1).stats.ttft_s))
    total, reused = sum(r[0] for r in rows), sum(r[1] for r in rows)
    print(f"{len(rows)} first questions of new scopes ({args.dtype}): {reused} of {total} prompt tokens reused "
          f"({reused / total:.1%}), {reused / len(rows):.0f} per question")  # fmt: skip
    hit_ms, cold_ms = (statistics.median(r[k] for r in rows) * 1000 for k in (2, 3))
    print(f"median TTFT: {hit_ms:.0f} ms with the public prefix, {cold_ms:.0f} ms cold ({hit_ms / cold_ms:.2f}x)")


if __name__ == "__main__":
    main()
