"""The drafting replay's arithmetic (``benchmarks/drafter_replay.py``) against brute force, on synthetic answers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from benchmarks.drafter_replay import (SELF, Lever, accepted_in_tree, copy_head, copy_oracle, occurrences, oracle,
                                       recorded_costs, replay, replay_lever, tree_size)
from ragspec.engine.ngram import NgramDrafter
from tests.benchmarks.scripts import run_script

COST = {0: 1.0} | {k: 1.1 + 0.05 * k for k in range(1, 40)}


def synthetic_rows(seed: int, answers: int = 5) -> list[dict[str, list[int]]]:
    """Answers that copy spans of 3 random passages half of the time, with a small vocabulary (many repeats)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(answers):
        refs = [[rng.randrange(40) for _ in range(60)] for _ in range(3)]
        answer: list[int] = []
        while len(answer) < 30:
            if rng.random() < 0.5:
                ref, j = rng.choice(refs), rng.randrange(50)
                answer += ref[j : j + rng.randrange(1, 9)]
            else:
                answer.append(rng.randrange(40))
        rows.append({"prompt": [1, 2, *sum(refs, []), 3], "references": refs, "answer": answer})
    return rows


@pytest.mark.parametrize("seed", range(4))
def test_the_default_lever_replays_exactly_the_default_drafter(seed: int) -> None:
    rows = synthetic_rows(seed)
    assert replay_lever(rows, COST.get, Lever()) == replay(rows, COST.get, NgramDrafter(history_tokens=2048))


@pytest.mark.parametrize("seed", range(4))
def test_more_branches_never_accept_fewer_tokens_per_forward(seed: int) -> None:
    """A tree holds the policy's draft plus others: per forward it accepts at least as much as the draft alone."""
    rows = synthetic_rows(seed)
    base, _ = replay_lever(rows, COST.get, Lever())
    tree, _ = replay_lever(rows, COST.get, Lever(3, 3, 8, also_without_draft=True))
    assert tree >= base


def test_occurrences_are_those_of_the_longest_suffix_with_a_continuation() -> None:
    rng = random.Random(7)
    for _ in range(200):
        refs = [[rng.randrange(5) for _ in range(rng.randrange(0, 17))] for _ in range(rng.randrange(1, 4))]
        context = [rng.randrange(5) for _ in range(rng.randrange(2, 13))]
        n, found = occurrences(refs, context, longest=5, max_tokens=3)
        pool = [*enumerate(refs), (SELF, context[:-1])]
        naive = lambda m: sorted((i, j + m - 1, tuple(r[j + m : j + m + 3])) for i, r in pool  # noqa: E731
                                 for j in range(len(r) - m) if r[j : j + m] == context[-m:])
        lengths = [m for m in range(1, min(5, len(context) - 1) + 1) if naive(m)]
        assert n == max(lengths, default=0)
        assert sorted((o.reference, o.end, o.following) for o in found) == (naive(n) if n else [])


def test_a_tree_accepts_its_best_path_and_counts_shared_prefixes_once() -> None:
    branches = [(5, 6, 7), (5, 6, 9, 1), (8,)]
    assert tree_size(branches) == 6  # 5, 5-6, 5-6-7, 5-6-9, 5-6-9-1, 8
    assert accepted_in_tree(branches, [5, 6, 9, 2]) == 3
    assert accepted_in_tree(branches, [8, 8]) == 1
    assert accepted_in_tree(branches, [4]) == 0
    assert tree_size([]) == 0


def test_the_oracle_yields_k_plus_one_tokens_a_forward_up_to_the_end() -> None:
    rows = [{"prompt": [1], "references": [], "answer": list(range(20))}]  # 19 tokens after the prefill's
    per_forward, speedup = oracle(rows, COST.get, k=8)
    assert per_forward == pytest.approx(19 / 3)  # 9 + 9 + 1
    assert speedup == pytest.approx(19 / (COST[8] * 2 + COST[1]))


def test_recorded_costs_interpolate_a_quiet_measurement(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"verify_cost": {"torch": {"1": 1.2, "2": 1.3, "4": 1.5, "8": 1.9, "12": 2.3, "16": 2.7}}}))
    costs = recorded_costs(report)
    assert costs[0] == 1.0 and costs[1] == 1.2 and costs[3] == pytest.approx(1.4) and costs[6] == pytest.approx(1.7)
    assert costs[20] == pytest.approx(3.1) and len(costs) == 33


def attending(rows: list[dict[str, list[int]]], layers: int = 3, heads: int = 4) -> list[np.ndarray]:
    """Attended positions (``attended_positions``' layout) where, at step i, head (1, 2) attends to the first
    occurrence of the context's last token that the answer's next token follows (a head that knows which occurrence
    to copy), head (0, 0) to the first position that does not hold the context's last token, and every other head
    to position 1."""
    found = []
    for row in rows:
        prompt, answer = row["prompt"], row["answer"]
        text = prompt + answer
        steps = np.ones((len(answer) - 1, layers, heads), np.int64)
        for i in range(1, len(answer)):
            last = len(prompt) + i - 1
            right = [j for j in range(last) if text[j] == text[last] and text[j + 1] == text[last + 1]]
            steps[i - 1, 1, 2] = right[0] if right else 1
            steps[i - 1, 0, 0] = next(j for j in range(last) if text[j] != text[last])
        found.append(steps)
    return found


@pytest.mark.parametrize("seed", range(3))
def test_copy_head_finds_the_head_whose_attended_position_is_followed_by_the_next_token(seed: int) -> None:
    rows = synthetic_rows(seed)
    assert copy_head(rows, attending(rows)) == (1, 2)


@pytest.mark.parametrize("seed", range(3))
def test_attention_copies_replace_only_short_matches_at_an_occurrence_of_the_last_token(seed: int) -> None:
    """A head that attends to a position that does not hold the context's last token changes nothing; one that
    attends to the occurrence of the last token whose next token is right raises tokens per forward where the
    drafter's match is one token."""
    rows = synthetic_rows(seed)
    default = replay_lever(rows, COST.get, Lever())
    assert replay_lever(rows, COST.get, Lever(attention_head=(0, 0)), attended=attending(rows)) == default
    assert replay_lever(rows, COST.get, Lever(attention_head=(1, 2)), attended=attending(rows))[0] > default[0]


@pytest.mark.timeout(300)
def test_the_script_prints_the_table_from_a_recording(tmp_path: Path) -> None:
    rows = synthetic_rows(0, answers=2)
    (tmp_path / "answers.json").write_text(json.dumps({"rows": rows, "relative_cost": COST}))
    done = run_script("drafter_replay.py", "--record", "answers.json", cwd=tmp_path, timeout=280)
    assert done.returncode == 0, done.stderr
    assert "| oracle drafter, 8 tokens a step |" in done.stdout
    assert "| default (n-gram + earlier answers, adaptive policy) |" in done.stdout
    assert "tree: +2 other continuation(s)" in done.stdout


@pytest.mark.timeout(300)
def test_the_script_replays_attention_copies_on_the_default_models_attention(tmp_path: Path) -> None:
    rows = synthetic_rows(0, answers=4)
    (tmp_path / "answers.json").write_text(json.dumps({"rows": rows, "relative_cost": COST}))
    done = run_script("drafter_replay.py", "--record", "answers.json", "--attention", cwd=tmp_path, timeout=280)
    assert done.returncode == 0, done.stderr
    assert "| default, odd-numbered answers |" in done.stdout
    assert "attends to where the match is <= 1 token, odd-numbered answers |" in done.stdout


@pytest.mark.timeout(300)
def test_costs_from_a_report_replace_the_recordings_own(tmp_path: Path) -> None:
    """``--costs`` replays a recording at another report's verify costs: with every r(k) = 1 a forward costs a plain
    step, so the oracle's estimated speedup is its tokens per forward."""
    rows = synthetic_rows(0, answers=2)
    (tmp_path / "answers.json").write_text(json.dumps({"rows": rows, "relative_cost": COST}))
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"verify_cost": {"torch": {str(k): 1.0 for k in (1, 2, 4, 8, 12, 16)}}}))

    def oracle_row(*extra: str) -> list[str]:
        done = run_script("drafter_replay.py", "--record", "answers.json", *extra, cwd=tmp_path, timeout=280)
        assert done.returncode == 0, done.stderr
        line = next(line for line in done.stdout.splitlines() if line.startswith("| oracle drafter"))
        return [cell.strip() for cell in line.strip("|").split("|")][1:]

    per_forward, speedup = oracle_row("--costs", str(flat))
    assert float(speedup.removesuffix("x")) == pytest.approx(float(per_forward), abs=0.006)
    assert oracle_row() != [per_forward, speedup]  # the recording's own costs are dearer


@pytest.mark.parametrize("seed", range(3))
def test_the_copy_ceiling_is_above_every_lever(seed: int) -> None:
    """Choosing the best-agreeing span with hindsight beats any drafter's tokens per forward."""
    rows = synthetic_rows(seed)
    ceiling, _ = copy_oracle(rows, COST.get)
    assert copy_oracle(rows, COST.get, anchored=False)[0] >= ceiling
    for lever in (Lever(), Lever(2, 2, 2, also_without_draft=True), Lever(recent_passage=True)):
        assert replay_lever(rows, COST.get, lever)[0] <= ceiling


@pytest.mark.timeout(300)
def test_the_readme_figures_come_from_the_recorded_unseen_answers() -> None:
    """The README's default row of the unseen-question replay is what the committed recording gives."""
    repo = Path(__file__).resolve().parents[2]
    data = json.loads((repo / "docs" / "bench" / "replay-unseen.json").read_text())
    table = {int(k): v for k, v in data["relative_cost"].items()}
    per_forward, speedup = replay(data["rows"], table.get, NgramDrafter(history_tokens=2048))
    row = f"| **default (n-gram + earlier answers, adaptive policy)** | **{per_forward:.2f}** | **{speedup:.2f}x** |"
    assert row in (repo / "README.md").read_text()
    assert len(data["rows"]) == 41 and sum(len(r["answer"]) for r in data["rows"]) == 1339
