"""Compare drafters and policies by replaying recorded greedy answers: exact acceptance, no timing noise.

Under greedy decoding a draft's accepted length is its common prefix with the target's own
continuation, so once the plain greedy answers are recorded, any drafter + policy pair can be
replayed step by step without running the model: each step proposes, the policy picks ``k``, the
accepted count comes from the recorded answer, and the step is charged the verify cost of ``k``
measured on this machine at a 640-token context. The result estimates the speedup over plain
decoding that the real loop gets, without drafting time and timing noise; it is for comparing
drafters and policies (here it estimated 1.70x for the default where the benchmark measured
1.75x; a re-recording with a cheaper-looking cost table gave 1.88x). Beside the speedup it prints
tokens per target forward, for the default, for levers replayed on top of it (tree verification of
other continuations, continuing the passage copied from most recently), for the oracle drafter and
for two ceilings of copy drafting (the span that agrees longest with the answer, chosen with
hindsight). The script also counts how often *any* occurrence of the matched suffix continues
correctly.

    python benchmarks/drafter_replay.py [--questions 30] [--max-new-tokens 96] [--record answers.json]
        [--question-set FILE ...] [--repetition-stop 12] [--costs docs/bench/report-fp32-epyc.json]

The first run records the answers (plain greedy, cut by the repetition stop as bench.py's are; a few
minutes on a quiet machine), with r(k) timed then or taken from a bench report's quiet measurement
(``--costs``); later runs reuse the file, at its recorded costs or at another report's (``--costs``: the same
answers replayed at other verify costs). The unseen-question recording of issue 35 is
``docs/bench/replay-unseen.json`` (see the README's "Speed").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragspec.engine.drafting import Draft, DraftSource  # noqa: E402
from ragspec.engine.ngram import NgramDrafter, SuffixAutomaton  # noqa: E402
from ragspec.engine.policy import AdaptivePolicy, choose_draft  # noqa: E402
from ragspec.pipeline import QA_DEFAULTS  # noqa: E402

MAX_COST_K = 32  # verify costs are recorded up to this many drafted tokens


def record(path: Path, questions: int, max_new_tokens: int, question_sets: Sequence[Path] = (),
           repetition_stop: int = 0, costs_from: Path | None = None) -> dict[str, object]:
    from benchmarks.bench import rag_prompts
    from ragspec.decoding.generator import SpeculativeGenerator

    gen = SpeculativeGenerator("default", device="cpu", dtype="float32")
    rows = []
    for p in rag_prompts(gen.target, questions, question_sets=question_sets):
        answer = gen.generate(p.ids, max_new_tokens=max_new_tokens, speculation=False, repetition_stop=repetition_stop)
        rows.append({"prompt": p.ids,
                     "references": [gen.encode(r, special_tokens=False) for r in p.passages],
                     "answer": answer.token_ids})
    if costs_from is not None:
        costs = recorded_costs(costs_from)
    else:
        # Verify costs at this workload's context length (prompts of ~600 tokens), not the 128-token
        # default of the start-up calibration: attention over a longer context makes verifying dearer.
        gen.calibrate(context=640)
        # Measured up to max_draft; beyond it, the policy's own extrapolation.
        costs = {k: gen.policy.costs.relative(k) for k in range(MAX_COST_K + 1)}  # type: ignore[attr-defined]
    data = {"rows": rows, "relative_cost": costs}
    path.write_text(json.dumps(data))
    return data


def recorded_costs(report: Path) -> dict[int, float]:
    """r(k) for k = 0..MAX_COST_K from a ``benchmarks/bench.py`` report's quiet measurement of the
    PyTorch verify cost (``verify_cost.torch``: k = 1, 2, 4, 8, 12, 16): linear between the measured
    lengths, r(0) = 1, and beyond the last one the slope of the last two."""
    measured = {0: 1.0} | {int(k): float(v) for k, v in json.loads(report.read_text())["verify_cost"]["torch"].items()}
    ks = sorted(measured)
    costs = {}
    for k in range(MAX_COST_K + 1):
        lo = max((x for x in ks if x <= k), default=ks[0])
        hi = min((x for x in ks if x > k), default=None)
        if hi is None:  # extrapolate
            lo, hi = ks[-2], ks[-1]
        costs[k] = round(measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo), 4)
    return costs


@dataclass
class Tally:
    """Tokens, forwards and cost (in plain steps) of a replay."""

    cost: float = 0.0
    tokens: int = 0
    forwards: int = 0

    def step(self, cost: float, accepted: int, left: int) -> int:
        """A forward of ``cost`` that accepted ``accepted`` drafted tokens with ``left`` answer tokens to go
        (past the answer's end the forward yields its EOS); returns how far the answer advances."""
        self.cost += cost
        self.forwards += 1
        self.tokens += min(accepted + 1, left)
        return accepted + 1

    def result(self) -> tuple[float, float]:
        """(tokens per forward, estimated speedup over plain decoding)."""
        return self.tokens / self.forwards, self.tokens / self.cost


def replay(rows: list[dict[str, list]], cost: Callable[[int], float], drafter: NgramDrafter,
           max_draft: int = 16, choose_source: bool = False, **policy_options: float) -> tuple[float, float]:
    """Replay every answer in order (earlier answers feed the drafter's history as in real use);
    returns (tokens per forward, estimated speedup over plain decoding).

    Each step makes the generator's own calls: the drafter's ``propose``, ``choose_draft`` (the
    length the policy verifies), then ``policy.record`` and the drafter's ``feedback`` with the
    accepted count, which under greedy decoding is the draft's common prefix with the recorded
    answer. ``choose_source``: instead of the longest match, verify the per-reference match whose
    measured acceptance promises the most tokens per unit of cost.
    """
    policy = AdaptivePolicy(max_draft=max_draft, **policy_options)  # type: ignore[arg-type]
    policy.calibrate({k: cost(k) for k in range(max_draft + 1)})
    tally = Tally()
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
            i += tally.step(cost(k), accepted, len(answer) - i)
        drafter.finish(answer)
    return tally.result()


@dataclass(frozen=True)
class Occurrence:
    """Where a suffix of the context occurs in a reference, and what followed it there."""

    reference: int
    """Index in ``rows``' passages; ``SELF`` for the context itself (prompt and output so far)."""
    end: int
    """Position of the occurrence's last token."""
    following: tuple[int, ...]


SELF = -1


def occurrences(references: Sequence[Sequence[int]], context: Sequence[int], longest: int = 8,
                max_tokens: int = 16) -> tuple[int, list[Occurrence]]:
    """Every occurrence of the longest suffix of ``context`` (up to ``longest`` tokens) that has a
    continuation, in the passages and earlier in the context; brute force, for the replay only."""
    arrays = [(i, np.asarray(ref)) for i, ref in enumerate(references)] + [(SELF, np.asarray(context[:-1]))]
    for n in range(min(longest, len(context) - 1), 0, -1):
        suffix = np.asarray(context[-n:])
        found = []
        for i, a in arrays:
            if len(a) <= n:
                continue
            starts = np.flatnonzero(a[: len(a) - n] == suffix[0])
            for j in starts:
                if np.array_equal(a[j : j + n], suffix):
                    found.append(Occurrence(i, int(j + n - 1), tuple(int(t) for t in a[j + n : j + n + max_tokens])))
        if found:
            return n, found
    return 0, []


def ranked_continuations(found: Sequence[Occurrence]) -> list[tuple[int, ...]]:
    """One continuation per distinct next token, the most frequent next token first (ties: the
    earliest found), each the continuation of that token's first occurrence."""
    counts = Counter(o.following[0] for o in found)
    first: dict[int, tuple[int, ...]] = {}
    for o in found:
        first.setdefault(o.following[0], o.following)
    return sorted(first.values(), key=lambda c: -counts[c[0]])


def accepted_in_tree(branches: Sequence[Sequence[int]], answer: Sequence[int]) -> int:
    """Greedy acceptance of a token tree whose root-to-leaf paths are ``branches``: the longest
    common prefix of ``answer`` with any branch (a tree's paths share their common prefixes)."""
    best = 0
    for b in branches:
        n = 0
        while n < len(b) and n < len(answer) and b[n] == answer[n]:
            n += 1
        best = max(best, n)
    return best


def tree_size(branches: Sequence[Sequence[int]]) -> int:
    """Nodes of the token trie of ``branches`` (the positions one tree-verify forward evaluates)."""
    return len({tuple(b[: n + 1]) for b in branches for n in range(len(b))})


@dataclass
class Lever:
    """A drafting change replayed on top of the default drafter and policy.

    ``extra_branches``: besides the policy's draft, verify this many other continuations of the
    longest suffix (most frequent next token first), ``extra_depth`` tokens each, in the same
    forward (tree verification), where the longest suffix match is at most ``extra_up_to`` tokens;
    ``also_without_draft``: also where the policy verifies no draft. ``recent_passage``: among the
    occurrences of the longest suffix in the passages, continue the one after the last accepted
    copy's position in the passage copied from most recently (else the policy's draft).
    ``attention_head``: (layer, head) whose most attended position picks what to copy where the longest suffix
    match is at most one token (``replay_lever``'s ``attended``).
    """

    extra_branches: int = 0
    extra_depth: int = 1
    extra_up_to: int = 2
    also_without_draft: bool = False
    recent_passage: bool = False
    attention_head: tuple[int, int] | None = None


def replay_lever(rows: list[dict[str, list]], cost: Callable[[int], float], lever: Lever,
                 max_draft: int = 16, automaton: type[SuffixAutomaton] = SuffixAutomaton,
                 attended: Sequence[np.ndarray] = ()) -> tuple[float, float]:
    """``replay`` of the default drafter and policy with ``lever``; returns (tokens per forward,
    estimated speedup over plain). A tree of n nodes is charged r(n), the cost of verifying n
    drafted tokens in a row (the forward evaluates as many positions; the tree mask is extra).

    With ``lever.attention_head``, ``attended[r]`` is ``attended_positions``' array for ``rows[r]``: where the
    drafter's match is at most one token and the head's most attended position holds the context's last token,
    the draft is the span after that position, with acceptance statistics of its own (the oracle's group, which a
    replay of copies does not use otherwise)."""
    drafter = NgramDrafter(history_tokens=2048, automaton=automaton)
    policy = AdaptivePolicy(max_draft=max_draft)
    policy.calibrate({k: cost(k) for k in range(max_draft + 1)})
    tally = Tally()
    for r, row in enumerate(rows):
        prompt, answer, refs = row["prompt"], row["answer"], row["references"]
        drafter.begin(prompt, refs)
        recent: tuple[int, int] | None = None  # (passage, position of the last token copied from it)
        i = 1
        while i < len(answer):
            context, room = prompt + answer[:i], min(max_draft, len(answer) - i)
            candidate = drafter.propose(context, room)
            if lever.attention_head is not None and (candidate is None or candidate.match_length <= 1):
                j = int(attended[r][(i - 1, *lever.attention_head)]) + 1
                if j < len(context) and context[j - 1] == context[-1]:
                    candidate = Draft(tuple(context[j : j + room]), DraftSource.ORACLE, 1)
            found: list[Occurrence] = []
            if lever.recent_passage or lever.extra_branches:
                n, found = occurrences(refs, context, max_tokens=room)
            if lever.recent_passage and candidate is not None and recent is not None:
                mine = [o for o in found if o.reference == recent[0] and o.end >= recent[1] and o.following]
                if mine and n == candidate.match_length:
                    o = min(mine, key=lambda o: o.end)
                    candidate = Draft(o.following, DraftSource.PASSAGE, n, o.reference)
            draft = choose_draft(policy, candidate)
            branches = [draft.tokens] if draft is not None else []
            if lever.extra_branches and found and n <= lever.extra_up_to and (draft is not None or lever.also_without_draft):
                others = [c[: lever.extra_depth] for c in ranked_continuations(found)
                          if not branches or c[0] != branches[0][0]]
                branches += others[: lever.extra_branches]
            k = tree_size(branches)
            own = accepted_in_tree([draft.tokens], answer[i:]) if draft is not None else 0
            accepted = accepted_in_tree(branches, answer[i:]) if branches else 0
            policy.record(draft, own, cost(k), 0.0)
            if draft is not None and draft.source != DraftSource.ORACLE:
                drafter.feedback(draft, own)
                if own and draft.source == DraftSource.PASSAGE and draft.reference is not None:
                    ref = refs[draft.reference]
                    # Position of the copied span in its passage: the occurrence the draft continued.
                    ends = [o.end for o in found if o.reference == draft.reference and o.following[:len(draft)] == draft.tokens]
                    recent = (draft.reference, (min(ends) if ends else 0) + own) if ref else None
            i += tally.step(cost(k), accepted, len(answer) - i)
        drafter.finish(answer)
    return tally.result()


def attended_positions(rows: list[dict[str, list]]) -> list[np.ndarray]:
    """Per answer, ``[steps, layers, heads]``: for each step after the first token (step ``i`` drafts
    ``answer[i]``), the position each head of the default model attends to most (position 0, where every head parks
    attention it does not need, left out) from the query of the context's second-to-last token. That is the last
    query a verify forward computes before the step (the context's last token is the one that forward produced),
    so a drafter could read it without an extra forward. Brute force over transformers' eager attention (one
    forward per answer), for the replay only."""
    from transformers import AutoModelForCausalLM

    from ragspec.backends.pytorch.loading import model_folder

    model = AutoModelForCausalLM.from_pretrained(model_folder(), attn_implementation="eager", local_files_only=True)
    found = []
    for row in rows:
        prompt, answer = row["prompt"], row["answer"]
        with torch.no_grad():
            weights = model(torch.tensor([prompt + answer[:-1]]), output_attentions=True).attentions
        queries = torch.arange(len(prompt) - 1, len(prompt) + len(answer) - 2)  # step i's is len(prompt) + i - 2
        per_layer = [w[0][:, queries, 1:].argmax(-1) + 1 for w in weights]  # [heads, steps] each
        found.append(torch.stack(per_layer).permute(2, 0, 1).numpy())
    return found


def copy_head(rows: list[dict[str, list]], attended: Sequence[np.ndarray]) -> tuple[int, int]:
    """The (layer, head) whose most attended position is most often followed by the answer's next token (the
    token an induction head predicts) over ``rows``."""
    hits = 0
    for row, found in zip(rows, attended):
        text = np.asarray(row["prompt"] + row["answer"])
        want = np.asarray(row["answer"][1:])[:, None, None]
        hits = hits + (text[found + 1] == want).sum(0)
    layer, head = np.unravel_index(int(np.argmax(hits)), np.shape(hits))
    return int(layer), int(head)


def oracle(rows: list[dict[str, list]], cost: Callable[[int], float], k: int = 8) -> tuple[float, float]:
    """The oracle drafter (the recorded answer itself, ``k`` tokens a step): (tokens per forward, speedup)."""
    tally = Tally()
    for row in rows:
        i, answer = 1, row["answer"]
        while i < len(answer):
            n = min(k, len(answer) - i)  # past the answer's end the forward yields its EOS
            i += tally.step(cost(n), n, len(answer) - i)
    return tally.result()


def copy_oracle(rows: list[dict[str, list]], cost: Callable[[int], float], anchored: bool = True,
                max_draft: int = 16) -> tuple[float, float]:
    """The ceiling of copy drafting: each step verifies the one span of the passages, the context so
    far or an earlier answer that agrees longest with the recorded answer (as many of its tokens as
    agree, up to ``max_draft``; none when none agrees), as if a drafter always picked the right
    occurrence and length. ``anchored``: only spans that follow an occurrence of the context's last
    token (a suffix match of at least one token); else any span. Returns (tokens per forward, speedup)."""
    tally = Tally()
    earlier: list[list[int]] = []
    for row in rows:
        prompt, answer = row["prompt"], row["answer"]
        i = 1
        while i < len(answer):
            context = prompt + answer[:i]
            want = answer[i : i + max_draft]
            best = 0
            for ref in [*row["references"], context[:-1], *earlier]:
                for j in range(1 if anchored else 0, len(ref)):
                    if ref[j] != want[0] or anchored and ref[j - 1] != context[-1]:
                        continue
                    n = 0
                    while n < len(want) and j + n < len(ref) and ref[j + n] == want[n]:
                        n += 1
                    best = max(best, n)
            i += tally.step(cost(best), best, len(answer) - i)
        earlier.append(answer)
    return tally.result()


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
    parser.add_argument("--question-set", action="append", type=Path, default=[], metavar="FILE",
                        help="record answers to the questions of this JSON file instead of the bundled ones "
                             "(as benchmarks/bench.py --question-set); repeatable")
    parser.add_argument("--repetition-stop", type=int, default=QA_DEFAULTS["repetition_stop"],
                        help="cut recorded answers where ragspec's repetition stop ends them (0: off), as bench.py does")
    parser.add_argument("--costs", type=Path, default=None, metavar="REPORT",
                        help="take r(k) from this bench.py report's quiet measurement (e.g. "
                             "docs/bench/report-fp32-epyc.json) instead of timing it while recording, or instead "
                             "of the recording's own when it exists")
    parser.add_argument("--attention", action="store_true",
                        help="also replay copies chosen by the default model's attention (one forward per answer with "
                             "transformers' eager attention): the head is chosen on the even-numbered answers and "
                             "the lever printed on the odd-numbered ones beside the default, and on all")
    args = parser.parse_args(argv)
    path = Path(args.record)
    data = json.loads(path.read_text()) if path.exists() else record(
        path, args.questions, args.max_new_tokens, args.question_set, args.repetition_stop, args.costs)
    table = recorded_costs(args.costs) if args.costs else {int(k): v for k, v in data["relative_cost"].items()}
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
    variants |= {
        f"tree: +{n} other continuation(s) of {d} token(s) where the match is <= {u} tokens"
        + (", also with no draft" if w else ""): (lambda n=n, d=d, u=u, w=w: replay_lever(rows, table.get, Lever(n, d, u, w)))
        for n, d, u, w in [(1, 1, 1, False), (1, 1, 2, False), (1, 1, 2, True), (2, 1, 2, True), (1, 2, 2, True),
                           (2, 2, 2, True), (3, 3, 2, True), (1, 4, 8, True), (3, 4, 8, True)]
    }
    variants["continue the passage copied from most recently"] = lambda: replay_lever(rows, table.get, Lever(recent_passage=True))
    variants["both: recent passage, tree +2 of 2 tokens (match <= 2, also with no draft)"] = lambda: replay_lever(
        rows, table.get, Lever(2, 2, 2, True, recent_passage=True))
    variants["most frequent continuation, tree +1 of 1 token (match <= 2, also with no draft)"] = lambda: replay_lever(
        rows, table.get, Lever(1, 1, 2, True), automaton=FrequentSAM)
    if args.attention:
        attended = attended_positions(rows)
        head = copy_head(rows[::2], attended[::2])
        lever, name = Lever(attention_head=head), f"copy what head {head[0]}.{head[1]} attends to where the match is <= 1 token"
        variants[f"{name} (all answers; the head chosen on the even-numbered)"] = lambda: replay_lever(
            rows, table.get, lever, attended=attended)
        variants["default, odd-numbered answers"] = lambda: replay_lever(rows[1::2], table.get, Lever())
        variants[f"{name}, odd-numbered answers"] = lambda: replay_lever(
            rows[1::2], table.get, lever, attended=attended[1::2])
    answer_tokens = [len(r["answer"]) for r in rows]
    print(f"{len(rows)} answers, {sum(answer_tokens)} tokens ({min(answer_tokens)}-{max(answer_tokens)} each)")
    print("verify cost in plain steps, k = 1 / 2 / 4 / 8 / 16 drafted tokens: "
          + " / ".join(f"{table[k]:.2f}" for k in (1, 2, 4, 8, 16)))
    print("| variant | tokens per forward | estimated speedup over plain |\n|---|---|---|")
    ceilings = {"oracle drafter, 8 tokens a step": lambda: oracle(rows, table.get),
                "copy ceiling: the best-agreeing span after the last token's occurrences": lambda: copy_oracle(rows, table.get),
                "copy ceiling: the best-agreeing span anywhere": lambda: copy_oracle(rows, table.get, anchored=False)}
    for name, run in {**ceilings, **variants}.items():
        per_forward, speedup = run()
        print(f"| {name} | {per_forward:.2f} | {speedup:.3f}x |")
    print("\nnext-token coverage by longest match length (first occurrence / top-2 / any occurrence):")
    for bucket, row in continuation_coverage(rows).items():
        print(f"  {bucket}: {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
