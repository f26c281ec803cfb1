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

from apps.bench import open_prompts, rag_prompts  # noqa: E402
from ragspec.generator import SpeculativeGenerator  # noqa: E402
from ragspec.models import LoadedModel, load_model  # noqa: E402
from ragspec.ngram import NgramDrafter  # noqa: E402
from ragspec.policy import FixedPolicy  # noqa: E402


class NoNgram(NgramDrafter):
    """Never proposes: isolates the draft model."""

    def propose(self, context, max_tokens):  # type: ignore[override]
        return None


def truncated(target: LoadedModel, layers: int) -> LoadedModel:
    model = copy.deepcopy(target.model)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return LoadedModel(model.eval(), target.tokenizer, f"{target.name}-first{layers}layers", target.device, target.dtype)


def measure(gen: SpeculativeGenerator, prompts: list, max_new: int, speculative: bool = True) -> dict[str, float]:
    # Untimed warm-up: the policy's one-off cost calibration and first-shape set-up.
    gen.generate(prompts[0].ids, references=prompts[0].passages, max_new_tokens=4, speculative=speculative)
    tokens = forwards = drafted = accepted = 0
    seconds = 0.0
    outputs = []
    for p in prompts:
        r = gen.generate(p.ids, references=p.passages, max_new_tokens=max_new, speculative=speculative)
        s = r.stats
        tokens += s.new_tokens - 1
        seconds += s.wall_s - s.ttft_s
        forwards += s.forward_passes
        model = s.by_source.get("model")
        drafted += model.drafted if model else 0
        accepted += model.accepted if model else 0
        outputs.append(r.token_ids)
    return {"tok/s": tokens / seconds, "tok/forward": (tokens + len(prompts)) / forwards,
            "model drafted": drafted, "model acceptance": f"{accepted / drafted:.2f}" if drafted else "–",
            "outputs": outputs}


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
        rows = {
            "plain": measure(SpeculativeGenerator(target), prompts, args.max_new_tokens, speculative=False),
            "draft model only, 4 tokens always": measure(
                SpeculativeGenerator(target, drafter=NoNgram(), draft_model=draft, policy=FixedPolicy(k=0, model_k=4)),
                prompts, args.max_new_tokens),
            "n-gram + draft model, adaptive policy": measure(
                SpeculativeGenerator(target, draft_model=draft), prompts, args.max_new_tokens),
            "n-gram only, adaptive policy": measure(SpeculativeGenerator(target), prompts, args.max_new_tokens),
        }
        table(f"{name} workload, target {target.name}, draft {draft.name}", rows)

    from tests.ragspec.tiny import tiny_model

    tiny = tiny_model(300, 0, layers=4)
    pairs = {"identical weights": copy.deepcopy(tiny), "unrelated weights": tiny_model(300, 99, layers=2)}
    prompt = [type("P", (), {"text": [5, 6, 7, 8, 9], "passages": []})()]
    rows = {"plain": measure(SpeculativeGenerator(tiny), prompt, 200, speculative=False)}
    for name, d in pairs.items():
        rows[f"draft model only ({name})"] = measure(
            SpeculativeGenerator(tiny, drafter=NoNgram(), draft_model=d, policy=FixedPolicy(k=0, model_k=4)), prompt, 200)
        rows[f"adaptive ({name})"] = measure(SpeculativeGenerator(tiny, drafter=NoNgram(), draft_model=d), prompt, 200)
    table("tiny random pair (4-layer target, 300-token vocabulary)", rows)
    return 0


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
