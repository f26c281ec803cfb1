"""Follow-up benchmark: conversations over the bundled corpus, first turns and follow-ups apart.

The workload is benchmarks/data/conversations.json (13 conversations x 3 turns; the second and third
questions lean on the earlier ones). For each way of retrieving a follow-up (``DocumentQA(follow_up=...)``:
``question`` retrieves it on its own, ``combine`` with the recent questions, ``rewrite`` with the
model's own standalone rewrite) every conversation is asked turn by turn, as ``Conversation`` does,
on the default model (PyTorch back end, greedy); ``--retrieval-only`` modes (default: ``rewrite``)
are measured on the conversation of the first mode instead (their query and its retrieval before
each follow-up; no answers of their own). Reported per turn kind:

- gold in retrieved: a passage retrieved for this turn holds the answer's span;
- gold in prompt: a passage anywhere in the prompt (earlier turns' included) holds it;
- gold in answer: the answer contains one of the gold strings;
- TTFT of the turn (prefill through the prefix cache, and the first token) and, right after it, of
  a cold prefill of the same prompt (a generator without prefix cache over the same weights, same
  references), so the ratio compares the two under the same load (first mode only).

Run from the repository root (offline), holding the machine-wide benchmark lock:

    flock /tmp/ragspec-bench.lock .venv/bin/python benchmarks/conversation_bench.py

Prints Markdown tables and writes every turn as JSON (default bench-out/conversations.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ragspec.engine.config import GenerationConfig  # noqa: E402
from ragspec.conversation import follow_up_query  # noqa: E402
from ragspec.decoding.generator import SpeculativeGenerator  # noqa: E402
from ragspec.pipeline import DocumentQA  # noqa: E402
from ragspec.prompts import Turn  # noqa: E402
from ragspec.registry import LocalModel  # noqa: E402
from retrievers import FaissVectorStore, default_embeddings, load_documents, split_documents  # noqa: E402

CORPUS = REPO / "retrievers" / "data" / "corpus"
WORKLOAD = REPO / "benchmarks" / "data" / "conversations.json"


def has_gold(text: str, gold: list[str]) -> bool:
    """Whether ``text`` holds one of the gold strings (case-insensitive, on word boundaries)."""
    low = text.lower().replace("`", " ")
    return any(re.search(rf"\b{re.escape(g.lower())}\b", low) for g in gold)


def holds_span(passages: list, source: str, span: str) -> bool:
    return any(Path(str(p.metadata.get("source", ""))).name == source and span in p.page_content for p in passages)


def run_mode(
    mode: str, qa: DocumentQA, cold: SpeculativeGenerator | None, conversations: list[dict], rows: list[dict], out: Path,
    retrieval_only: list[str],
) -> None:
    """Append a row per turn to ``rows`` (written to ``out`` after each, so a cut-short run keeps what it did)."""
    generator = qa.llm.load()
    for conv in conversations:
        turns: list[Turn] = []
        for index, turn in enumerate(conv["turns"]):
            for other in retrieval_only if turns else ():
                query, stats = follow_up_query(other, turn["question"], turns, generator, qa.system_prompt)
                rows.append({
                    "mode": other, "conversation": conv["id"], "turn": index + 1, "retrieval_query": query,
                    "gold_in_retrieved": holds_span(qa.retriever.invoke(query), conv["source"], turn["span"]),
                    "rewrite_s": stats.wall_s if stats is not None else 0.0,
                })  # fmt: skip
            request = qa._prepare(turn["question"], None, {}, turns)  # what Conversation.stream does
            *_, answer = qa._generate(request)
            options = request.options
            cold_ttft = None if cold is None else cold.generate(
                request.prompt_ids, options.config, references=options.references, max_new_tokens=1
            ).stats.ttft_s
            retrieved = qa.retriever.invoke(answer.retrieval_query)
            s = answer.stats
            rows.append({
                "mode": mode, "conversation": conv["id"], "turn": index + 1, "question": turn["question"],
                "retrieval_query": answer.retrieval_query, "answer": answer.text,
                "gold_in_retrieved": holds_span(retrieved, conv["source"], turn["span"]),
                "gold_in_prompt": holds_span(answer.passages, conv["source"], turn["span"]),
                "gold_in_answer": has_gold(answer.text, turn["gold"]),
                "prompt_tokens": s.prompt_tokens, "cached_prompt_tokens": s.cached_prompt_tokens,
                "ttft_s": s.ttft_s, "cold_ttft_s": cold_ttft, "wall_s": s.wall_s,
                "rewrite_s": answer.query_stats.wall_s if answer.query_stats is not None else 0.0,
                "dropped_turns": answer.dropped_turns,
            })  # fmt: skip
            turns.append(answer.as_turn())
            r = rows[-1]
            print(f"{mode} {conv['id']} turn {index + 1}: ttft {r['ttft_s']:.3f} s, cold {r['cold_ttft_s']} s, "
                  f"reused {r['cached_prompt_tokens']}/{r['prompt_tokens']}, gold retrieved/prompt/answer "
                  f"{r['gold_in_retrieved']:d}{r['gold_in_prompt']:d}{r['gold_in_answer']:d}", file=sys.stderr, flush=True)
            out.write_text(json.dumps({"rows": rows}, indent=1), encoding="utf-8")


def _share(rows: list[dict], key: str) -> str:
    rows = [r for r in rows if key in r]
    return f"{sum(r[key] for r in rows)}/{len(rows)}" if rows else "-"


def report(rows: list[dict], modes: list[str]) -> str:
    lines = [
        "| follow-up retrieval | first turns: gold in retrieved | first turns: gold in answer | follow-ups: gold in retrieved "
        "| follow-ups: gold in prompt | follow-ups: gold in answer | rewrite, median s per follow-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        first = [r for r in rows if r["mode"] == mode and r["turn"] == 1]
        later = [r for r in rows if r["mode"] == mode and r["turn"] > 1]
        rewrite = statistics.median(r["rewrite_s"] for r in later) if later else 0.0
        if not first:  # measured on another mode's conversation: its first turns are that mode's
            first = [r for r in rows if r["turn"] == 1 and r["mode"] == rows[0]["mode"]]
        lines.append(f"| `{mode}` | {_share(first, 'gold_in_retrieved')} | {_share(first, 'gold_in_answer')} | "
                     f"{_share(later, 'gold_in_retrieved')} | {_share(later, 'gold_in_prompt')} | "
                     f"{_share(later, 'gold_in_answer')} | {rewrite:.2f} |")
    lines += [
        "",
        "| follow-up retrieval | TTFT turn 1, median s | TTFT turns 2+, median s | cold prefill of the same turn 2+ prompts, median s "
        "| turns 2+ / cold, median of per-turn ratios | turns 2+ / turn 1 | prompt tokens reused, turns 2+ |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        first = [r for r in rows if r["mode"] == mode and r["turn"] == 1]
        later = [r for r in rows if r["mode"] == mode and r["turn"] > 1 and r.get("cold_ttft_s")]
        if not first or not later:
            continue
        t1 = statistics.median(r["ttft_s"] for r in first)
        t2 = statistics.median(r["ttft_s"] for r in later)
        cold = statistics.median(r["cold_ttft_s"] for r in later)
        ratio = statistics.median(r["ttft_s"] / r["cold_ttft_s"] for r in later)
        reused = sum(r["cached_prompt_tokens"] for r in later) / sum(r["prompt_tokens"] for r in later)
        lines.append(f"| `{mode}` | {t1:.3f} | {t2:.3f} | {cold:.3f} | {ratio:.2f} | {t2 / t1:.2f} | {reused:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="combine,question", help="follow_up modes answered, comma-separated; "
                        "the first is timed against cold prefills")
    parser.add_argument("--retrieval-only", default="rewrite", help="follow_up modes whose retrieval alone is measured")
    parser.add_argument("--report", type=Path, help="only print the tables of an earlier run's JSON")
    parser.add_argument("--conversations", type=int, default=0, help="only the first N conversations (0: all)")
    parser.add_argument("--max-tokens", type=int, default=48, help="answer budget per turn")
    parser.add_argument("--k", type=int, default=4, help="passages retrieved per turn")
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "conversations.json")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    retrieval_only = [m for m in args.retrieval_only.split(",") if m]
    if args.report is not None:
        print(report(json.loads(args.report.read_text(encoding="utf-8"))["rows"], modes + retrieval_only))
        return
    conversations = json.loads(WORKLOAD.read_text(encoding="utf-8"))["conversations"]
    if args.conversations:
        conversations = conversations[: args.conversations]

    start = time.perf_counter()
    chunks = split_documents(load_documents(CORPUS).documents)
    store = FaissVectorStore(default_embeddings())
    store.add_documents(chunks)
    llm = LocalModel(backend="torch", config=GenerationConfig(max_new_tokens=args.max_tokens))
    generator = llm.load()
    cold = SpeculativeGenerator(generator.target, prefix_cache=False)
    for gen in (generator, cold):  # the first forwards of a process pay one-off set-up: not in the figures
        gen.generate(list(range(1000, 1600)), max_new_tokens=4)
    rows: list[dict] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i, mode in enumerate(modes):
        generator.clear_cache()  # each mode starts cold: its first turns are the same prompts as the last mode's
        qa = DocumentQA.from_vectorstore(store, documents=chunks, k=args.k, llm=llm, follow_up=mode)
        run_mode(mode, qa, cold if i == 0 else None, conversations, rows, args.out, retrieval_only if i == 0 else [])
    elapsed = time.perf_counter() - start

    print(f"{len(conversations)} conversations x 3 turns, default model ({generator.backend.description}), "
          f"max_tokens {args.max_tokens}, k {args.k}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; {elapsed / 60:.1f} min\n")
    print(report(rows, modes + retrieval_only))
    args.out.write_text(json.dumps({"rows": rows, "elapsed_s": elapsed}, indent=1), encoding="utf-8")
    print(f"\nevery turn: {args.out}")


if __name__ == "__main__":
    main()
