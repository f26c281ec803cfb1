"""ragspec's vLLM proposer on fake batches shaped like vLLM's model runner's (no vLLM needed)."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest

from ragspec.backends.vllm.proposer import (
    REQUEST_MAX_DRAFT,
    STATS_ENV,
    BatchDrafter,
    RagspecProposer,
    StepBatch,
    StepCosts,
    draft_lists,
)
from ragspec.engine.ngram_batch import HISTORY, SOURCES
from ragspec.engine.planning import plan
from ragspec.engine.policy import AdaptivePolicy

PASSAGE = [101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112]
MAX_LEN = 64


class Clock:
    """Steps take ``step_s`` seconds; the proposer's own work none."""

    def __init__(self, step_s: float = 0.1) -> None:
        self.t, self.step_s, self.calls = 0.0, step_s, 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2:  # each ``step`` reads the clock on entry and on exit
            self.t += self.step_s
        return self.t


class FakeBatch:
    """The runner's view: a row per request, ``token_ids`` padded to the model length."""

    def __init__(self) -> None:
        self.rows: dict[str, list[int]] = {}
        self.new: dict[str, list[int]] = {}

    def add(self, rid: str, prompt: list[int], first: int) -> None:
        self.rows[rid] = prompt + [first]
        self.new[rid] = [first]

    def extend(self, rid: str, tokens: list[int]) -> None:
        self.rows[rid] += tokens
        self.new[rid] = tokens

    def call(self, drafter: BatchDrafter, order: list[str] | None = None) -> dict[str, list[int]]:
        ids = order or list(self.rows)
        token_ids = np.zeros((len(ids), max(MAX_LEN, *map(len, self.rows.values()))), dtype=np.int32)
        for i, rid in enumerate(ids):
            token_ids[i, : len(self.rows[rid])] = self.rows[rid]
        counts = np.array([len(self.rows[rid]) for rid in ids], dtype=np.int32)
        drafts = drafter.step(StepBatch(ids, [self.new[rid] for rid in ids], counts, token_ids))
        return dict(zip(ids, drafts))


def cheap_drafts_policy(max_draft: int = 8) -> AdaptivePolicy:
    """Verify costs flat in k (as on a GPU at small batch sizes)."""
    policy = AdaptivePolicy(max_draft=max_draft)
    policy.calibrate({0: 0.1, 16: 0.1})
    return policy


def flat_costs(max_rows: int = 8) -> StepCosts:
    """Steps of every batch size timed, their cost flat in the drafted tokens (a GPU at small batches)."""
    costs = StepCosts()
    for rows in range(1, max_rows + 1):
        costs.record(rows, 0, 0.1)
        costs.record(rows, 16, 0.1)
    return costs


def test_a_request_drafts_the_passage_that_its_prompt_holds() -> None:
    drafter = BatchDrafter(6, max_model_len=MAX_LEN, policy=cheap_drafts_policy(), costs=flat_costs(), clock=Clock())
    batch = FakeBatch()
    batch.add("a", [1, 2, *PASSAGE, 3], 103)  # the answer starts copying the passage
    assert batch.call(drafter)["a"] == [104, 105, 106, 107, 108, 109]
    batch.extend("a", [104, 105, 106])  # vLLM accepted two, its own third token agrees too
    assert batch.call(drafter)["a"] == [107, 108, 109, 110, 111, 112]
    assert drafter.index.tokens("a").tolist() == batch.rows["a"]
    assert drafter.index.requests[drafter.index.slot_of["a"], 0] == len(PASSAGE) + 3  # its prompt


def test_state_follows_the_request_id_when_rows_move_and_acceptance_is_counted() -> None:
    drafter = BatchDrafter(4, max_model_len=MAX_LEN, policy=cheap_drafts_policy(4), costs=flat_costs(), clock=Clock())
    batch = FakeBatch()
    batch.add("a", [*PASSAGE, 7], 101)
    batch.add("b", [9, 8, 7, 6, 5, 9, 8], 7)
    batch.call(drafter, ["a", "b"])
    states = dict(drafter.index.slot_of)
    batch.extend("a", [102])
    batch.extend("b", [6])
    drafts = batch.call(drafter, ["b", "a"])  # vLLM reordered its rows
    assert drafts["a"] == [103, 104, 105, 106] and drafts["b"] == [5, 9, 8, 7]
    batch.extend("a", [103, 104, 99])  # two drafted tokens accepted, then the target's own token
    batch.extend("b", [5, 9, 8, 7, 6])  # all four accepted plus the bonus token
    batch.call(drafter, ["a", "b"])
    assert drafter.index.slot_of == states  # the same rows of state, extended
    for rid in "ab":
        assert drafter.index.tokens(rid).tolist() == batch.rows[rid]
    assert drafter.accepted == 2 + 4


def test_rows_still_prefilling_get_no_draft_and_no_state() -> None:
    drafter = BatchDrafter(4, max_model_len=MAX_LEN, policy=cheap_drafts_policy(4), costs=flat_costs(), clock=Clock())
    token_ids = np.zeros((2, MAX_LEN), dtype=np.int32)
    token_ids[0, :3] = [5, 6, 5]
    drafts = drafter.step(StepBatch(["a", "b"], [[5], []], np.array([3, 40]), token_ids))
    assert drafts[1] == [] and set(drafter.index.slot_of) == {"a"}


def test_seeded_rows_get_no_draft_but_stay_indexed() -> None:
    drafter = BatchDrafter(4, max_model_len=MAX_LEN, policy=cheap_drafts_policy(4), costs=flat_costs(), clock=Clock())
    token_ids = np.zeros((2, MAX_LEN), dtype=np.int32)
    token_ids[:, :14] = [*PASSAGE, 7, 101]
    drafts = drafter.step(StepBatch(["a", "b"], [[101], [101]], np.array([14, 14]), token_ids, seeded_rows={0}))
    assert drafts == [[], [102, 103, 104, 105]]
    assert drafter.index.tokens("a").tolist() == token_ids[0, :14].tolist()


def test_ended_requests_are_freed_and_their_answers_draft_later_ones() -> None:
    drafter = BatchDrafter(4, max_model_len=MAX_LEN, history_tokens=64, policy=cheap_drafts_policy(4), costs=flat_costs(), clock=Clock())
    batch = FakeBatch()
    batch.add("a", [1, 2, 3], 50)
    batch.call(drafter)
    for t in (51, 52, 53, 54, 55):
        batch.extend("a", [t])
        batch.call(drafter)
    del batch.rows["a"], batch.new["a"]
    batch.add("b", [1, 2, 3], 50)  # a second request starts the same answer
    drafts = batch.call(drafter)
    assert set(drafter.index.slot_of) == {"b"}
    assert drafts["b"] == [51, 52, 53, 54] and SOURCES[drafter.index.cand[0, 0]] == SOURCES[HISTORY]


def test_state_stays_bounded_over_many_sequential_requests() -> None:
    drafter = BatchDrafter(4, max_model_len=MAX_LEN, history_tokens=100, policy=cheap_drafts_policy(4), costs=flat_costs(), clock=Clock())
    batch = FakeBatch()
    rng = np.random.default_rng(0)
    for n in range(200):
        rid = f"req-{n}"
        batch.add(rid, rng.integers(0, 50, size=20).tolist(), 7)
        for _ in range(5):
            batch.call(drafter)
            batch.extend(rid, [int(rng.integers(0, 50))])
        del batch.rows[rid], batch.new[rid]
    batch.add("last", [1, 2], 3)
    batch.call(drafter)
    assert list(drafter.index.slot_of) == ["last"] and drafter.requests_seen == 201
    assert len(drafter.history) <= 101
    assert drafter.index.automata.count == 4 and drafter.index.versions.count == 4 + 2  # rows and history versions reused, never grown


def test_drafts_respect_the_longest_draft_and_the_model_length() -> None:
    drafter = BatchDrafter(3, max_model_len=len(PASSAGE) + 4, policy=cheap_drafts_policy(3), costs=flat_costs(), clock=Clock())
    batch = FakeBatch()
    batch.add("a", PASSAGE[:], 101)
    assert batch.call(drafter)["a"] == [102, 103]  # 13 tokens of 16: two drafted, one the target's
    drafter = BatchDrafter(3, max_model_len=MAX_LEN, policy=cheap_drafts_policy(8), costs=flat_costs(), clock=Clock())
    batch = FakeBatch()
    batch.add("a", PASSAGE[:], 101)
    assert batch.call(drafter)["a"] == [102, 103, 104]


def test_expensive_verification_and_rejected_drafts_make_it_propose_nothing() -> None:
    """Timed steps: a drafted step costs twice a plain one, and the target rejects every draft."""
    clock = Clock()
    drafter = BatchDrafter(4, max_model_len=4096, clock=clock)
    batch = FakeBatch()
    batch.add("a", PASSAGE * 3, 101)
    proposed = []
    for _ in range(80):
        drafts = batch.call(drafter)["a"]
        proposed.append(len(drafts))
        clock.step_s = 0.2 if drafts else 0.1
        batch.extend("a", [999])  # never what was drafted
    assert sum(proposed[:20]) > 0  # it tried, measured, and stopped
    assert sum(proposed[-30:]) == 0
    assert drafter.costs.curve(1).relative(4) > 1.5


def _plan(p1: list[float], q: list[float], lengths: list[int], cost: list[float], margin: float = 0.03) -> list[int]:
    ks = np.zeros(len(lengths), np.int64)
    kinds = {(a, b): i for i, (a, b) in enumerate(dict.fromkeys(zip(p1, q)))}  # rows of equal p1 and q share a kind
    plan(np.array(p1), np.array(q), np.array(lengths), np.array([kinds[a, b] for a, b in zip(p1, q)]), len(kinds),
         np.array(cost), margin, len(lengths), ks)
    return ks.tolist()


def _brute_force_plan(p1, q, lengths, cost, margin) -> float:
    """The best expected tokens per cost over every allocation of draft lengths (0 when none beats plain)."""
    rows, plain = len(lengths), len(lengths) / cost[0]
    best = (1 + margin) * plain
    found = 0.0
    for ks in itertools.product(*(range(n + 1) for n in lengths)):
        if not sum(ks):
            continue
        expected = rows + sum(p * (1 - b**k) / (1 - b) for p, b, k in zip(p1, q, ks))
        rate = expected / cost[sum(ks)]
        if rate > best:
            best, found = rate, rate
    return found


def test_the_plan_is_the_best_allocation_and_for_one_request_the_policys_choice() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        rows = int(rng.integers(1, 5))
        lengths = rng.integers(0, 5, rows).tolist()
        pairs = [(float(rng.uniform(0, 1)), float(rng.uniform(0, 0.999))) for _ in range(2)]
        p1, q = map(list, zip(*(pairs[int(rng.integers(2))] for _ in range(rows))))  # some rows share a kind
        cost = np.maximum.accumulate(1 + np.cumsum(rng.uniform(0, 0.3, sum(lengths) + 1)) - rng.uniform(0, 0.3)).tolist()
        cost[0] = 1.0
        ks = _plan(p1, q, lengths, cost)
        assert all(0 <= k <= n for k, n in zip(ks, lengths))
        best = _brute_force_plan(p1, q, lengths, cost, 0.03)
        if best == 0.0:
            assert sum(ks) == 0
        else:
            rate = (rows + sum(p * (1 - b**k) / (1 - b) for p, b, k in zip(p1, q, ks))) / cost[sum(ks)]
            assert rate == pytest.approx(best, rel=1e-9)
    policy = AdaptivePolicy(max_draft=8)
    policy.calibrate({0: 0.05, 1: 0.1, 2: 0.1, 4: 0.07, 8: 0.09})
    for length in (1, 3, 8):
        p1, q = policy.acceptance.rates(0, length)
        gains = {k: (1 + p1 * (1 - q**k) / (1 - q)) / policy.costs.relative(k) for k in range(1, 9)}
        best = max(gains, key=gains.get)
        assert _plan([p1], [q], [8], policy.costs.table(8).tolist()) == [best if gains[best] > 1.03 else 0]


def test_a_full_batch_backs_off_where_a_single_request_drafts() -> None:
    """CPU-like costs: a step's cost grows with the tokens it carries, one token at a time."""
    policy = AdaptivePolicy(max_draft=8)
    policy.calibrate({0: 0.10, 4: 0.115, 7: 0.17, 15: 0.25})
    strong, weak = policy.acceptance.rates(0, 3), policy.acceptance.rates(1, 1)
    single = policy.costs.table(8).tolist()
    assert _plan([strong[0]], [strong[1]], [8], single)[0] > 0
    batch = [policy.costs.relative(7 + d) for d in range(65)]  # eight rows: a step of 8 + d tokens
    assert _plan([weak[0]] * 8, [weak[1]] * 8, [8] * 8, batch) == [0] * 8


def _isotonic_brute_force(points: list[tuple[int, float, float]]) -> list[float]:
    """The non-decreasing fit of (x, y, weight) points with the least weighted squared error,
    searched over fits whose values are means of runs of consecutive points (where the optimum lies)."""
    best, best_err = None, float("inf")
    n = len(points)
    for cuts in itertools.product((False, True), repeat=n - 1):
        runs, run = [], [points[0]]
        for cut, p in zip(cuts, points[1:]):
            if cut:
                runs.append(run)
                run = []
            run.append(p)
        runs.append(run)
        fit = [sum(y * w for _, y, w in r) / sum(w for *_, w in r) for r in runs for _ in r]
        if all(a <= b + 1e-12 for a, b in zip(fit, fit[1:])):
            err = sum(w * (y - f) ** 2 for (_, y, w), f in zip(points, fit))
            if err < best_err:
                best, best_err = fit, err
    assert best is not None
    return best


def test_step_costs_are_kept_per_batch_size_and_fitted_non_decreasing() -> None:
    costs = StepCosts(prior_slope=0.1)
    assert not costs.measured(4) and costs.curve(4).relative(3) == pytest.approx(1.3)  # untimed: the prior
    costs.record(1, 0, 0.05)
    costs.record(1, 4, 0.10)
    for _ in range(3):
        costs.record(4, 0, 0.12)  # four rows cost more than one row with four drafted tokens ...
        costs.record(4, 4, 0.13)  # ... but drafting into that batch adds little
    costs.record(4, 2, 0.40)  # one slow outlier, timed once
    assert costs.measured(1) and costs.measured(4) and not costs.measured(8)
    assert costs.curve(1).relative(4) == pytest.approx(2.0) and costs.curve(1).relative(2) == pytest.approx(1.5)
    pooled = (0.40 + 3 * 0.13) / 4  # the outlier is pooled with the cell after it, by weight
    assert costs.curve(4).fitted() == pytest.approx({0: 0.12, 2: pooled, 4: pooled})
    # Beyond the longest timed length, the prior: 0.1 of the one-row plain step per token, in 4-row steps.
    assert costs.curve(4).relative(8) == pytest.approx(pooled / 0.12 + 4 * 0.1 * 0.05 / 0.12)
    assert costs.curve(1).relative(8) == pytest.approx(2.0 + 4 * 0.1)  # one row: 0.1 of its own step
    rng = np.random.default_rng(1)
    for trial in range(30):  # against a brute-force isotonic fit, on random timings
        costs = StepCosts()
        for _ in range(12):
            costs.record(2, int(rng.integers(0, 6)), float(rng.uniform(0.05, 0.2)))
        curve = costs.curve(2)
        cells = [(d, m, curve.timings()[d]) for d, m in sorted(curve.measured().items())]
        expected = _isotonic_brute_force(cells)
        assert [curve.fitted()[d] for d, *_ in cells] == pytest.approx(expected)
        if curve.has_plain:
            assert all(1.0 <= costs.curve(2).relative(d) <= costs.curve(2).relative(d + 1) for d in range(10))


def test_a_batch_size_first_seen_is_timed_plain_before_it_gets_drafts() -> None:
    clock = Clock()
    drafter = BatchDrafter(4, max_model_len=4096, clock=clock)
    batch = FakeBatch()
    batch.add("a", PASSAGE * 3, 101)
    assert batch.call(drafter)["a"] == [] and not drafter.costs.measured(1)  # no plain step of one row timed yet
    batch.extend("a", [102])
    assert batch.call(drafter)["a"][:2] == [103, 104] and drafter.costs.measured(1)  # the step just ended was plain
    batch.add("b", PASSAGE * 2, 101)  # a second request: its prefill step is not timed
    batch.extend("a", [103, 104, 105])
    assert all(d == [] for d in batch.call(drafter).values()) and not drafter.costs.measured(2)
    batch.extend("a", [106])
    batch.extend("b", [102])
    assert any(batch.call(drafter).values()) and drafter.costs.measured(2)


def test_stats_file_reports_live_requests_and_costs(tmp_path, monkeypatch) -> None:
    path = tmp_path / "stats.json"
    monkeypatch.setenv(STATS_ENV, str(path))
    drafter = BatchDrafter(4, max_model_len=MAX_LEN, policy=cheap_drafts_policy(4), costs=flat_costs(), clock=Clock())
    batch = FakeBatch()
    batch.add("a", [*PASSAGE, 7], 101)
    batch.call(drafter)
    batch.extend("a", [102])
    batch.call(drafter)
    del batch.rows["a"], batch.new["a"]
    batch.add("b", [1], 2)
    batch.call(drafter)
    stats = json.loads(path.read_text())
    assert stats["live_requests"] == 1 and stats["requests_seen"] == 2
    assert stats["drafted_tokens"] >= 4 and stats["history_tokens"] == 2 + 1
    assert "0" in stats["step_seconds"]["1"] and stats["relative_cost"]["1"]["0"] == 1.0


class FakeModelRunner:
    """Builds the drafter in its constructor, as vLLM's GPUModelRunner (and the CPU runner) do."""

    def __init__(self, config: SimpleNamespace, extra: dict[str, dict] | None = None) -> None:
        self.drafter = RagspecProposer(config)
        self.input_batch = SimpleNamespace(req_ids=["x", "y"], generators={1: object()})
        if extra is not None:  # vLLM's request states: their sampling parameters' extra_args
            self.requests = {rid: SimpleNamespace(sampling_params=SimpleNamespace(extra_args=args))
                             for rid, args in extra.items()}


def _config(k: int = 4) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=SimpleNamespace(max_model_len=MAX_LEN)
    )


def test_the_vllm_class_reads_request_ids_from_the_runner_that_built_it() -> None:
    runner = FakeModelRunner(_config())
    runner.drafter.load_model(object())
    runner.drafter.drafter.costs = flat_costs()
    token_ids = np.zeros((2, MAX_LEN), dtype=np.int32)
    token_ids[:, :15] = [*PASSAGE, 7, 101, 102]
    drafts = runner.drafter.propose([[102], [102]], np.array([15, 15]), token_ids)
    assert set(runner.drafter.drafter.index.slot_of) == {"x", "y"}
    assert drafts[0] and drafts[1] == []  # "y" is sampled with a seed (the runner has a generator for its row)


def test_the_vllm_class_outside_a_runner_and_bad_settings_fail_clearly(monkeypatch) -> None:
    with pytest.raises(RuntimeError, match="custom_class"):
        RagspecProposer(_config())
    monkeypatch.setenv("RAGSPEC_PROPOSER_HISTORY_TOKENS", "many")
    with pytest.raises(ValueError, match="RAGSPEC_PROPOSER_HISTORY_TOKENS"):
        FakeModelRunner(_config())
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        BatchDrafter(0, max_model_len=MAX_LEN)


def test_requests_cap_or_turn_off_their_own_drafts_through_extra_args(caplog) -> None:
    token_ids = np.zeros((3, MAX_LEN), dtype=np.int32)
    token_ids[:, :15] = [*PASSAGE, 7, 101, 102]
    runner = FakeModelRunner(_config(6), {"x": {REQUEST_MAX_DRAFT: 0}, "y": {REQUEST_MAX_DRAFT: "2"}, "z": None})
    runner.input_batch = SimpleNamespace(req_ids=["x", "y", "z"], generators={})
    runner.drafter.drafter.costs = flat_costs()
    runner.drafter.drafter.policy = cheap_drafts_policy(6)
    drafts = runner.drafter.propose([[102]] * 3, np.array([15, 15, 15]), token_ids)
    assert drafts == [[], [103, 104], [103, 104, 105, 106, 107, 108]]
    assert set(runner.drafter.drafter.index.slot_of) == {"y", "z"}  # "x" is not even indexed
    stats = runner.drafter.drafter.stats()
    assert (stats["live_requests"], stats["requests_seen"], stats["undrafted_requests_seen"]) == (3, 2, 1)
    # A vLLM whose runner keeps no request states: every request drafts, and the log says so once.
    old = FakeModelRunner(_config(6))
    old.drafter.drafter.costs = flat_costs()
    old.drafter.drafter.policy = cheap_drafts_policy(6)
    old.input_batch = SimpleNamespace(req_ids=["x", "y"], generators={})
    with caplog.at_level("WARNING"):
        assert all(old.drafter.propose([[102]] * 2, np.array([15, 15]), token_ids[:2]))
    assert len([r for r in caplog.records if "per-request speculation" in r.getMessage()]) == 1


@pytest.mark.parametrize("seed", range(9))
def test_draft_lists_are_each_rows_first_k_tokens_as_separate_lists(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, width = int(rng.integers(1, 40)), int(rng.integers(1, 10))
    drafts = rng.integers(0, 50_000, (rows, width)).astype(np.int32)
    kind = seed % 3  # every row drafts the longest; lengths at random; few rows draft
    ks = np.full(rows, width) if kind == 0 else rng.integers(0, width + 1, rows)
    if kind == 2:
        ks[rng.random(rows) < 0.8] = 0
    ks[0] = max(ks[0], 1)  # drafted somewhere (step() builds empty lists itself otherwise)
    lists = draft_lists(drafts, ks)
    assert lists == [drafts[r, : ks[r]].tolist() for r in range(rows)]
    assert all(type(t) is int for row in lists for t in row)
    assert len({id(row) for row in lists}) == rows  # vLLM's scheduler may change one row's list in place


def test_several_requests_ending_in_one_step_enter_the_history_in_the_order_they_began() -> None:
    drafter = BatchDrafter(4, max_model_len=MAX_LEN, history_tokens=64, policy=cheap_drafts_policy(4), costs=flat_costs(), clock=Clock())
    batch = FakeBatch()
    for rid, first in (("a", 50), ("b", 60), ("c", 70)):
        batch.add(rid, [1, 2, 3], first)
    batch.call(drafter)
    batch.call(drafter, order=["c", "a", "b"])  # the runner moved its rows
    for rid in ("a", "b", "c"):
        del batch.rows[rid], batch.new[rid]
    batch.add("d", [9], 8)
    batch.call(drafter)
    assert list(drafter.history._answers) == [[50], [60], [70]]


@pytest.mark.parametrize("seed", range(4))
def test_rows_follow_their_requests_through_random_moves_ends_and_arrivals(seed: int) -> None:
    """The runner's rows move, shrink and grow; every row keeps its own request's state, and a request
    leaves the index exactly when it leaves the batch."""
    rng = np.random.default_rng(seed)
    drafter = BatchDrafter(4, max_model_len=MAX_LEN, history_tokens=32, policy=cheap_drafts_policy(4), costs=flat_costs(12),
                           clock=Clock(), request_cap=lambda rid: 0 if rid.endswith("off") else 4)
    batch = FakeBatch()
    order: list[str] = []
    added: set[str] = set()
    for n in range(60):
        if order and rng.random() < 0.3:  # requests end: the runner fills their rows with the last ones
            for rid in rng.choice(order, size=int(rng.integers(1, min(3, len(order)) + 1)), replace=False).tolist():
                del batch.rows[rid], batch.new[rid]
                order.remove(rid)
        while len(order) < 12 and rng.random() < 0.5:  # requests arrive at the end
            rid = f"r{n}-{len(order)}" + ("-off" if rng.random() < 0.2 else "")
            batch.add(rid, rng.integers(0, 9, size=5).tolist(), int(rng.integers(0, 9)))
            order.append(rid)
            added.add(rid)
        if len(order) > 1 and rng.random() < 0.3:  # two rows swap
            i, j = rng.choice(len(order), size=2, replace=False)
            order[i], order[j] = order[j], order[i]
        if not order:
            continue
        batch.call(drafter, order=list(order))
        index = drafter.index
        assert set(index.slot_of) == {rid for rid in order if not rid.endswith("off")}
        assert drafter.undrafted == {rid for rid in order if rid.endswith("off")}
        assert drafter.requests_seen == len({rid for rid in added if not rid.endswith("off")})  # each indexed once
        for r, rid in enumerate(order):
            expected = -2 if rid.endswith("off") else index.slot_of[rid]
            assert drafter._slots[r] == expected
            if expected >= 0:
                assert index.tokens(rid).tolist() == batch.rows[rid]
        for rid in order:
            batch.extend(rid, [int(rng.integers(0, 9))])
