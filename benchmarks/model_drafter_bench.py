"""Draft-model fallback: acceptance and speed, and what the policy does with a weak draft model.

SmolLM2-135M has no smaller sibling that runs offline here, so the same-vocabulary draft model
is the target cut to its first ``--draft-layers`` transformer layers (same embeddings, final
norm and LM head): a real model with the target's vocabulary, cheaper per token, and a weak
predictor of the full model. Also runs a tiny random target/draft pair (identical weights and
unrelated weights). Prints a markdown table per workload.

    python benchmarks/model_drafter_bench.py [--questions 6] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench import open_prompts, rag_prompts  # noqa: E402
from ragspec.decoding.generator import SpeculativeGenerator  # noqa: E402
from ragspec.backends import load_model  # noqa: E402
from ragspec.backends.pytorch.loading import LoadedModel  # noqa: E402
from ragspec.engine.ngram import NgramDrafter  # noqa: E402
from ragspec.engine.policy import FixedPolicy  # noqa: E402


class NoNgram(NgramDrafter):
    """Never proposes: isolates the draft model."""

    def propose(self, context, max_tokens):  # type: ignore[override]
        return None


def truncated(target: LoadedModel, layers: int) -> LoadedModel:
    model = copy.deepcopy(target.model)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return LoadedModel(model.eval(), target.tokenizer, f"{target.name}-first{layers}layers", target.device, target.dtype)


def measure(methods: dict[str, tuple[SpeculativeGenerator, bool]], prompts: list, max_new: int) -> dict[str, dict]:
    """Each method (a generator, and whether it speculates) on every prompt, interleaved prompt by
    prompt in a rotating order, each generator starting every prompt cold."""
    for gen, speculative in methods.values():  # untimed warm-up: calibration and first-shape set-up
        gen.generate([*prompts[0].ids[:8]], max_new_tokens=4, speculation=speculative)
    totals = {name: {"tokens": 0, "seconds": 0.0, "forwards": 0, "drafted": 0, "accepted": 0, "outputs": []} for name in methods}
    names = list(methods)
    for i, p in enumerate(prompts):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            gen, speculative = methods[name]
            gen.clear_cache()
            s = (r := gen.generate(p.ids, references=p.passages, max_new_tokens=max_new, speculation=speculative)).stats
            t = totals[name]
            t["tokens"] += s.new_tokens - 1
            t["seconds"] += s.wall_s - s.ttft_s
            t["forwards"] += s.forward_passes
            model = s.by_source.get("model")
            t["drafted"] += model.drafted if model else 0
            t["accepted"] += model.accepted if model else 0
            t["outputs"].append(r.token_ids)
    return {
        name: {"tok/s": t["tokens"] / t["seconds"], "tok/forward": (t["tokens"] + len(prompts)) / t["forwards"],
               "model drafted": t["drafted"],
               "model acceptance": f"{t['accepted'] / t['drafted']:.2f}" if t["drafted"] else "–", "outputs": t["outputs"]}
        for name, t in totals.items()
    }


def table(title: str, rows: dict[str, dict[str, float]]) -> None:
    base = rows["plain"]
    print(f"\n{title}\n| method | decode tok/s | vs plain | tok/forward | draft-model tokens | draft-model acceptance | identical |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        same = sum(a == b for a, b in zip(r["outputs"], base["outputs"]))
        print(f"| {name} | {r['tok/s']:.1f} | {r['tok/s'] / base['tok/s']:.2f}x | {r['tok/forward']:.2f} | "
              f"{r['model drafted']} | {r['model acceptance']} | {same}/{len(base['outputs'])} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-layers", type=int, default=6)
    args = parser.parse_args()

    target = load_model("default")
    draft = truncated(target, args.draft_layers)
    for name, prompts in [("rag", rag_prompts(target, args.questions)), ("open", open_prompts(target, args.questions))]:
        rows = measure({
            "plain": (SpeculativeGenerator(target), False),
            "draft model only, 4 tokens always": (
                SpeculativeGenerator(target, drafter=NoNgram(), draft_model=draft, policy=FixedPolicy(k=0, model_k=4)), True),
            "n-gram + draft model, adaptive policy": (SpeculativeGenerator(target, draft_model=draft), True),
            "n-gram only, adaptive policy": (SpeculativeGenerator(target), True),
        }, prompts, args.max_new_tokens)
        table(f"{name} workload, target {target.name}, draft {draft.name}", rows)

    from tests.ragspec.tiny import tiny_model

    tiny = tiny_model(300, 0, layers=4)
    pairs = {"identical weights": copy.deepcopy(tiny), "unrelated weights": tiny_model(300, 99, layers=2)}
    prompt = [type("P", (), {"ids": [5, 6, 7, 8, 9], "passages": []})()]
    methods = {"plain": (SpeculativeGenerator(tiny), False)}
    for name, d in pairs.items():
        methods[f"draft model only ({name})"] = (
            SpeculativeGenerator(tiny, drafter=NoNgram(), draft_model=d, policy=FixedPolicy(k=0, model_k=4)), True)
        methods[f"adaptive ({name})"] = (SpeculativeGenerator(tiny, drafter=NoNgram(), draft_model=d), True)
    rows = measure(methods, prompt, 200)
    table("tiny random pair (4-layer target, 300-token vocabulary)", rows)
    return 0


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
