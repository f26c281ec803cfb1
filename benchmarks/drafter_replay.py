"""Compare drafters and policies by replaying recorded greedy answers: exact acceptance, no timing noise.

Under greedy decoding a draft's accepted length is its common prefix with the target's own
continuation, so once the plain greedy answers are recorded, any drafter + policy pair can be
replayed step by step without running the model: each step proposes, the policy picks ``k``, the
accepted count comes from the recorded answer, and the step is charged the verify cost of ``k``
measured on this machine at a 640-token context. The result estimates the speedup over plain
decoding that the real loop gets, without drafting time and timing noise; it is for comparing
drafters and policies (here it estimated 1.70x for the default where the benchmark measured
1.75x; a re-recording with a cheaper-looking cost table gave 1.88x). The script also
counts how often *any* occurrence of the matched suffix continues correctly (what verifying
several candidates at once, tree verification, could gain).

    python benchmarks/drafter_replay.py [--questions 30] [--max-new-tokens 96] [--record answers.json]

The first run records the answers (plain greedy, a few minutes); later runs reuse the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragspec.engine.drafting import Draft  # noqa: E402
from ragspec.engine.ngram import NgramDrafter, SuffixAutomaton  # noqa: E402
from ragspec.engine.policy import AdaptivePolicy, choose_draft  # noqa: E402

MAX_COST_K = 32  # verify costs are recorded up to this many drafted tokens


def record(path: Path, questions: int, max_new_tokens: int) -> dict[str, object]:
    from benchmarks.bench import rag_prompts
    from ragspec.decoding.generator import SpeculativeGenerator

    gen = SpeculativeGenerator("default", device="cpu", dtype="float32")
    # Verify costs at this workload's context length (prompts of ~600 tokens), not the 128-token
    # default of the start-up calibration: attention over a longer context makes verifying dearer.
    gen.calibrate(context=640)
    rows = []
    for p in rag_prompts(gen.target, questions):
        answer = gen.generate(p.ids, max_new_tokens=max_new_tokens, speculation=False)
        rows.append({"prompt": p.ids,
                     "references": [gen.encode(r, special_tokens=False) for r in p.passages],
                     "answer": answer.token_ids})
    policy = gen.policy
    # Measured up to max_draft; beyond it, the policy's own extrapolation.
    costs = {k: policy.costs.relative(k) for k in range(MAX_COST_K + 1)}  # type: ignore[attr-defined]
    data = {"rows": rows, "relative_cost": costs}
    path.write_text(json.dumps(data))
    return data


def replay(rows: list[dict[str, list]], cost: Callable[[int], float], drafter: NgramDrafter,
           max_draft: int = 16, choose_source: bool = False, **policy_options: float) -> float:
    """Replay every answer in order (earlier answers feed the drafter's history as in real use);
    returns the estimated speedup over plain decoding.

    Each step makes the generator's own calls: the drafter's ``propose``, ``choose_draft`` (the
    length the policy verifies), then ``policy.record`` and the drafter's ``feedback`` with the
    accepted count, which under greedy decoding is the draft's common prefix with the recorded
    answer. ``choose_source``: instead of the longest match, verify the per-reference match whose
    measured acceptance promises the most tokens per unit of cost.
    """
    policy = AdaptivePolicy(max_draft=max_draft, **policy_options)  # type: ignore[arg-type]
    policy.calibrate({k: cost(k) for k in range(max_draft + 1)})
    time = tokens = 0.0
    for row in rows:
        prompt, answer = row["prompt"], row["answer"]
        drafter.begin(prompt, row["references"])
        i = 1  # the first token comes from the prefill
        while i < len(answer):
            context, room = prompt + answer[:i], min(max_draft, len(answer) - i)
            if choose_source:
                draft, best = None, 0.0
                for m in drafter.matches(context, room):
                    chosen = choose_draft(policy, Draft(m.tokens, m.source, m.length, m.reference)) if m.tokens else None
                    gain = policy.expected_yield(chosen, len(chosen)) / policy.costs.relative(len(chosen)) if chosen else 0.0
                    if gain > best:
                        draft, best = chosen, gain
            else:
                draft = choose_draft(policy, drafter.propose(context, room))
            k = len(draft) if draft is not None else 0
            accepted = 0
            while accepted < k and answer[i + accepted] == draft.tokens[accepted]:  # type: ignore[union-attr]
                accepted += 1
            policy.record(draft, accepted, cost(k), 0.0)
            if draft is not None:
                drafter.feedback(draft, accepted)
            time += cost(k)
            tokens += min(accepted + 1, len(answer) - i)  # past the answer's end the forward yields its EOS
            i += accepted + 1
        drafter.finish(answer)
    return tokens / time


def continuation_coverage(rows: list[dict[str, list]], longest: int = 8) -> dict[str, dict[str, float]]:
    """By length of the longest suffix match (1, 2, 3+) over the passages and the context so far:
    how often the next answer token follows the match's first occurrence, one of its two most
    frequent continuations, or any occurrence. Brute force, for the record only."""
    counts: Counter[tuple[str, str]] = Counter()
    for row in rows:
        prompt, answer = row["prompt"], row["answer"]
        for i in range(1, len(answer)):
            context = prompt + answer[:i]
            for n in range(longest, 0, -1):
                suffix = context[-n:]
                following = [ref[j + n] for ref in [*row["references"], context[:-1]]
                             for j in range(len(ref) - n) if ref[j : j + n] == suffix]
                if following:
                    break
            else:
                continue
            bucket, top = str(min(n, 3)) + ("+" if n >= 3 else ""), Counter(following)
            counts[bucket, "steps"] += 1
            counts[bucket, "first"] += following[0] == answer[i]
            counts[bucket, "top2"] += answer[i] in [t for t, _ in top.most_common(2)]
            counts[bucket, "any"] += answer[i] in top
    buckets = sorted({b for b, _ in counts})
    return {b: {"steps": counts[b, "steps"]} | {k: round(counts[b, k] / counts[b, "steps"], 2)
                                               for k in ("first", "top2", "any")} for b in buckets}


class FrequentSAM(SuffixAutomaton):
    """Continues a match with its most frequent next token in the reference (ties: first occurrence)."""

    def counts(self) -> list[int]:
        cnt = getattr(self, "_cnt", None)
        if cnt is None or len(cnt) != len(self.length):
            cnt = [1 if self.length[s] == self.first_end[s] + 1 else 0 for s in range(len(self.length))]
            for s in sorted(range(1, len(cnt)), key=self.length.__getitem__, reverse=True):
                cnt[self.link[s]] += cnt[s]
            self._cnt = cnt
        return cnt

    def continuation(self, state: int, length: int, max_tokens: int) -> tuple[int, tuple[int, ...]]:
        cnt = self.counts()
        while state > 0:
            tokens, s = [], state
            while len(tokens) < max_tokens:
                options = [(cnt[t], -self.first_end[t], c, t) for c, t in self.next[s].items() if c >= 0]
                if not options:
                    break
                _, _, c, s = max(options)
                tokens.append(c)
            if tokens:
                return length, tuple(tokens)
            state = self.link[state]
            length = self.length[state]
        return 0, ()




def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--record", default="answers.json", help="recorded answers (created when missing)")
    args = parser.parse_args(argv)
    path = Path(args.record)
    data = json.loads(path.read_text()) if path.exists() else record(path, args.questions, args.max_new_tokens)
    table = {int(k): v for k, v in data["relative_cost"].items()}
    rows = data["rows"]
    variants: dict[str, Callable[[], float]] = {
        "default (n-gram + earlier answers, adaptive policy)": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048)),
        "no earlier-answers index": lambda: replay(rows, table.get, NgramDrafter()),
        "most frequent continuation": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048, automaton=FrequentSAM)),
        "source chosen by measured acceptance": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048), choose_source=True),
        "policy margin 0": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048), margin=0.0),
        "policy margin 0.1": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048), margin=0.1),
        "acceptance decay 0.95": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048), decay=0.95),
        "acceptance decay 0.995": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048), decay=0.995),
        "up to 24 drafted tokens": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048), max_draft=24),
        "up to 32 drafted tokens": lambda: replay(rows, table.get, NgramDrafter(history_tokens=2048), max_draft=32),
    }
    print("verify cost in plain steps, k = 1 / 4 / 8 / 16 drafted tokens: "
          + " / ".join(f"{table[k]:.2f}" for k in (1, 4, 8, 16)))
    print("| variant | estimated speedup over plain |\n|---|---|")
    for name, run in variants.items():
        print(f"| {name} | {run():.3f}x |")
    print("\nnext-token coverage by longest match length (first occurrence / top-2 / any occurrence):")
    for bucket, row in continuation_coverage(rows).items():
        print(f"  {bucket}: {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
