"""Compare drafters by replaying recorded greedy answers: exact acceptance, no timing noise.

Under greedy decoding a draft's accepted length is its common prefix with the target's own
continuation, so once the plain greedy answers are recorded, any drafter + policy pair can be
replayed step by step without running the model: each step proposes, the policy picks ``k``, the
accepted count comes from the recorded answer, and the step is charged the verify cost of ``k``
measured on this machine at a 640-token context. The result estimates the speedup over plain
decoding that the real loop gets, without drafting time and timing noise; it is for comparing
drafters and policies, and ran ~7% above the benchmark's measured ratio here.

    python benchmarks/drafter_replay.py [--questions 30] [--max-new-tokens 96] [--record answers.json]

The first run records the answers (plain greedy, a few minutes); later runs reuse the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragspec.drafting import Drafter  # noqa: E402
from ragspec.ngram import NgramDrafter, SuffixAutomaton, _Matcher  # noqa: E402
from ragspec.policy import AdaptivePolicy  # noqa: E402


def record(path: Path, questions: int, max_new_tokens: int) -> dict[str, object]:
    from ragspec.bench import rag_prompts
    from ragspec.generator import SpeculativeGenerator

    gen = SpeculativeGenerator("default", device="cpu", dtype="float32")
    # Verify costs at this workload's context length (prompts of ~600 tokens), not the 128-token
    # default of the start-up calibration: attention over a longer context makes verifying dearer.
    gen._calibrate(context=640)
    rows = []
    for p in rag_prompts(gen.lm, questions):
        answer = gen.generate(p.text, max_new_tokens=max_new_tokens, speculative=False)
        rows.append({"prompt": gen.encode(p.text, special_tokens=True),
                     "references": [gen.encode(r, special_tokens=False) for r in p.passages],
                     "answer": answer.token_ids})
    policy = gen.policy
    costs = {k: policy.relative_cost(k) for k in range(0, gen.max_draft + 1)}  # type: ignore[attr-defined]
    data = {"rows": rows, "relative_cost": costs}
    path.write_text(json.dumps(data))
    return data


def replay(rows: list[dict[str, list]], cost: Callable[[int], float], drafter: Drafter,
           max_draft: int = 16) -> dict[str, float]:
    """Replay every answer in order (earlier answers feed the drafter's history as in real use)."""
    policy = AdaptivePolicy(max_draft=max_draft)
    policy.calibrate({k: cost(k) for k in range(max_draft + 1)})
    time = tokens = forwards = 0.0
    by_bucket: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # steps, first token accepted
    for row in rows:
        prompt, answer = row["prompt"], row["answer"]
        drafter.begin(prompt, row["references"])
        i = 1  # the first token comes from the prefill
        while i < len(answer):
            context = prompt + answer[:i]
            room = len(answer) - i
            candidate = drafter.propose(context, min(max_draft, room))
            k = policy.choose(candidate) if candidate is not None else 0
            draft = candidate.truncated(k) if k and candidate is not None else None
            accepted = 0
            if draft is not None:
                while accepted < k and answer[i + accepted] == draft.tokens[accepted]:
                    accepted += 1
                bucket = by_bucket[f"{draft.source.value}/{min(draft.match_length, 8)}"]
                bucket[0] += 1
                bucket[1] += accepted > 0
            policy.record(draft, accepted, cost(k), 0.0)
            time += cost(k)
            forwards += 1
            i += accepted + 1
            tokens += accepted + 1
        drafter.finish(answer)
    out = {"speedup_vs_plain": tokens / time, "tokens_per_forward": tokens / forwards}
    out |= {f"{b} steps/p1": f"{s}/{h / s:.2f}" for b, (s, h) in sorted(by_bucket.items())}  # type: ignore[misc]
    return out


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


class FrequentNgram(NgramDrafter):
    def begin(self, prompt, references):  # type: ignore[override]
        super().begin(prompt, references)
        for m in self._matchers:
            if not isinstance(m.sam, FrequentSAM):
                sam = FrequentSAM()
                for t in m.sam.tokens:
                    sam.extend(t)
                m.sam = sam


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--record", default="answers.json", help="recorded answers (created when missing)")
    args = parser.parse_args(argv)
    path = Path(args.record)
    data = json.loads(path.read_text()) if path.exists() else record(path, args.questions, args.max_new_tokens)
    table = {int(k): v for k, v in data["relative_cost"].items()}
    drafters: dict[str, Callable[[], Drafter]] = {
        "ngram (default)": lambda: NgramDrafter(history_tokens=2048),
        "ngram, no history": lambda: NgramDrafter(),
        "ngram, most frequent continuation": lambda: FrequentNgram(history_tokens=2048),
    }
    for name, make in drafters.items():
        print(name, json.dumps(replay(data["rows"], table.__getitem__, make()), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
