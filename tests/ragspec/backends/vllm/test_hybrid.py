"""The hybrid's choice rule (``ragspec.engine.planning.plan_sources``) and its draft folders, without vLLM."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from ragspec.engine.planning import plan, plan_sources


def _plan(lengths, p1, q, model_caps, model_p1, model_q, model_step, slope=0.05, margin=0.03):
    rows = len(lengths)
    lengths = np.asarray(lengths, np.int64)
    kinds = np.zeros(rows, np.int64)
    cost = 1.0 + slope * np.arange(int(lengths.sum() + np.sum(model_caps)) + 1)
    model_cost = np.array([0.0] + [model_step * j for j in range(1, max(model_caps, default=0) + 1)])
    ks, from_model = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
    drafted, steps = plan_sources(np.full(rows, p1), np.full(rows, q), lengths, kinds, 1, model_p1, model_q,
                                  np.asarray(model_caps, np.int64), cost, model_cost, margin, ks, from_model)
    return drafted, steps, ks.tolist(), from_model.tolist()


def test_long_likely_ngram_drafts_win_and_the_batch_pays_no_model_step() -> None:
    drafted, steps, ks, from_model = _plan([8, 8], 0.9, 0.95, [8, 8], 0.6, 0.7, model_step=0.05)
    assert steps == 0 and from_model == [0, 0] and ks == [8, 8] and drafted == 16


def test_the_model_fills_rows_without_a_match_and_only_as_many_steps_as_it_pays() -> None:
    drafted, steps, ks, from_model = _plan([8, 0], 0.9, 0.95, [8, 8], 0.8, 0.8, model_step=0.02)
    assert ks[0] == 8 and from_model == [0, 1] and 0 < ks[1] == steps <= 8 and drafted == 8 + steps


def test_a_costly_or_poor_model_is_not_run_and_a_poor_batch_drafts_nothing() -> None:
    _, steps, ks, from_model = _plan([6, 0], 0.9, 0.9, [8, 8], 0.8, 0.8, model_step=2.0)
    assert steps == 0 and from_model == [0, 0] and ks == [6, 0]
    assert _plan([0, 0], 0.9, 0.9, [8, 8], 0.02, 0.1, model_step=0.01)[:2] == (0, 0)


def test_without_a_model_it_is_plan() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = int(rng.integers(1, 9))
        lengths = rng.integers(0, 9, rows)
        p1, q = float(rng.uniform(0.05, 0.95)), float(rng.uniform(0.05, 0.95))
        cost = 1.0 + rng.uniform(0.0, 0.3) * np.arange(int(lengths.sum()) + 1)
        want = np.zeros(rows, np.int64)
        plan(np.full(rows, p1), np.full(rows, q), lengths, np.zeros(rows, np.int64), 1, cost, 0.03, rows, want)
        ks, from_model = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
        drafted, steps = plan_sources(np.full(rows, p1), np.full(rows, q), lengths, np.zeros(rows, np.int64), 1, 0.9, 0.9,
                                      np.zeros(rows, np.int64), cost, np.zeros(1), 0.03, ks, from_model)
        assert ks.tolist() == want.tolist() and steps == 0 and drafted == want.sum()


# -- the hybrid drafter on fake batches (vLLM's draft model stood in for by a function) -------------

from ragspec.backends.vllm.hybrid import EXPLORE_TOKENS, HybridDrafter  # noqa: E402
from ragspec.backends.vllm.proposer import StepBatch  # noqa: E402
from ragspec.engine.planning import MODEL  # noqa: E402
from tests.ragspec.backends.vllm.test_proposer import MAX_LEN, PASSAGE, flat_costs  # noqa: E402


def _step(drafter: HybridDrafter, rows: dict[str, list[int]], new: dict[str, list[int]], model: dict[str, list[int]],
          model_s: float = 0.01) -> tuple[dict[str, list[int]], int]:
    ids = list(rows)
    token_ids = np.zeros((len(ids), MAX_LEN), np.int32)
    for i, rid in enumerate(ids):
        token_ids[i, : len(rows[rid])] = rows[rid]
    drafter.candidates(StepBatch(ids, [new[r] for r in ids], np.array([len(rows[r]) for r in ids]), token_ids))
    steps = drafter.plan()
    if drafter.catch_up:  # else the model does not run (as in ``HybridProposer.propose``)
        drafter.record_model(steps, model_s * (1 + steps))
    drafts = drafter.compose([model[r][:steps] for r in ids])
    return dict(zip(ids, drafts)), steps


def test_the_hybrid_drafts_the_passage_without_running_the_model_and_the_model_where_nothing_matches() -> None:
    drafter = HybridDrafter(8, max_model_len=MAX_LEN, costs=flat_costs(), clock=lambda: 0.0)
    rows = {"rag": PASSAGE + [7, 8, 101], "open": [40, 41, 42, 43]}
    new = {"rag": [101], "open": [43]}
    model = {"rag": [55] * 8, "open": [60, 61, 62, 63, 64, 65, 66, 67]}
    drafts, steps = _step(drafter, rows, new, model)
    assert drafts["rag"] == PASSAGE[1:9]  # the passage's continuation, 8 tokens
    # The model's cost is only a prior so far: the first chance explores it on the row without a match.
    assert steps == EXPLORE_TOKENS and drafts["open"] == [60, 61]
    assert drafter.stats()["drafted_by_source"] == {"ngram": 8, "model": 2}
    assert not drafter.model_seconds.measured()  # the prompts' catch-up: a prefill, not a model step
    # Its two tokens accepted: the next step records them under the model's source.
    before = drafter.policy.acceptance.counts[0, MODEL, 0]
    rows["rag"] += PASSAGE[1:9] + [113]
    rows["open"] += [60, 61, 62]
    new = {"rag": PASSAGE[1:9] + [113], "open": [60, 61, 62]}
    drafts, steps = _step(drafter, rows, new, model)
    assert drafter.policy.acceptance.counts[0, MODEL, 0] > before * drafter.policy.decay
    assert drafter.accepted == 8 + 2 and drafter.stats()["accepted_by_source"] == {"ngram": 8, "model": 2}


def test_a_model_that_is_rejected_is_no_longer_run() -> None:
    drafter = HybridDrafter(4, max_model_len=MAX_LEN, costs=flat_costs(), clock=lambda: 0.0)
    drafter.policy.explore_every = 1000
    drafter._since_model = 1000
    rows, new = {"open": [40, 41, 42, 43]}, {"open": [43]}
    ran = []
    for n in range(12):
        drafts, steps = _step(drafter, rows, new, {"open": [99, 98, 97, 96]})
        ran.append(steps)
        token = 200 + n  # the target never says what the model drafted
        rows["open"].append(token)
        new["open"] = [token]
    assert ran[0] > 0 and ran[-4:] == [0, 0, 0, 0]


def test_seeded_rows_and_rows_that_asked_for_no_speculation_get_nothing() -> None:
    drafter = HybridDrafter(4, max_model_len=MAX_LEN, costs=flat_costs(), clock=lambda: 0.0,
                            request_cap=lambda rid: 0 if rid == "off" else 4)
    ids = ["seeded", "off"]
    token_ids = np.zeros((2, MAX_LEN), np.int32)
    token_ids[:, :16] = PASSAGE + [1, 2, 3, 101]
    drafter.candidates(StepBatch(ids, [[101], [101]], np.array([16, 16]), token_ids, seeded_rows={0}))
    assert drafter.plan() == 0 and drafter.compose([]) == [[], []]


def test_the_own_engines_policy_leaves_a_weak_copy_for_a_good_cheap_draft_model_by_the_same_rule() -> None:
    from ragspec.engine.drafting import Draft, DraftSource
    from ragspec.engine.policy import AdaptivePolicy

    policy = AdaptivePolicy(max_draft=8)
    policy.calibrate({0: 0.1, 8: 0.12, 16: 0.14})
    strong = Draft(tuple(range(8)), DraftSource.PASSAGE, match_length=8)
    weak = Draft((1, 2), DraftSource.OUTPUT, match_length=1)
    assert policy.choose(strong) == 8 and policy.choose(weak) > 0  # no draft model measured: copies only
    for _ in range(40):  # a draft model measured: cheap, and most of its tokens kept
        policy.record(Draft((5, 6, 7, 8), DraftSource.MODEL), 3, 0.12, 0.004)
        policy.record(weak, 0, 0.11, 0.0)
        policy.record(strong, 8, 0.14, 0.0)
    assert policy.choose(strong) == 8  # a long passage copy that is always right still wins
    assert policy.choose(weak) == 0 and policy.choose_model(8) > 0  # the model's turn


def test_the_draft_model_stops_catching_up_when_idle_and_the_ngram_drafts_go_on() -> None:
    from ragspec.backends.vllm.hybrid import MODEL_IDLE_STEPS

    drafter = HybridDrafter(4, max_model_len=MAX_LEN, costs=flat_costs(), clock=lambda: 0.0)
    drafter._since_model = 0  # no exploring, and its steps cost 5 plain steps each: never chosen
    drafter._idle = 0  # as if its drafts had just earned tokens
    rows, new = {"a": PASSAGE + [7, 8, 40]}, {"a": [40]}
    ran = []
    for _ in range(MODEL_IDLE_STEPS + 3):
        drafts, steps = _step(drafter, rows, new, {"a": [9, 9, 9, 9]}, model_s=1.0)
        assert steps == 0
        ran.append(drafter.catch_up)
        rows["a"] = rows["a"] + drafts["a"] + [1]
        new["a"] = drafts["a"] + [1]
    assert ran.index(False) == MODEL_IDLE_STEPS - 1 and not any(ran[MODEL_IDLE_STEPS - 1 :])
    assert drafter.model_caps[0] == 0  # "a"'s draft-model cache has holes now: never the model's drafts
    rows["a"] += PASSAGE[:3]  # the answer starts copying the passage: its n-gram drafts go on
    new["a"] = PASSAGE[:3]
    drafts, _ = _step(drafter, rows, new, {"a": [9] * 4})
    assert drafts["a"] == PASSAGE[3:7], "the n-gram drafts stopped with the model"
    # A request that begins while the model is neither in use nor due does not start it.
    rows["b"], new["b"] = [40, 41, 42], [42]
    _step(drafter, rows, new, {"a": [9] * 4, "b": [9] * 4})
    assert not drafter.catch_up
    assert drafter.stats()["idle_model_forwards"] == MODEL_IDLE_STEPS - 1
    # An exploration due waits, the model off, until a request begins, and tries the model on it.
    drafter._since_model = drafter.policy.explore_every
    for _ in range(2 * MODEL_IDLE_STEPS):
        _step(drafter, rows, new, {"a": [9] * 4, "b": [9] * 4})
        assert not drafter.catch_up
    rows["c"], new["c"] = [50, 51, 52], [52]
    _step(drafter, rows, new, {"a": [9] * 4, "b": [9] * 4, "c": [9] * 4})
    assert drafter.catch_up and drafter.from_model.tolist() == [0, 0, 1]


# -- a RAG answer with a draft model whose every token is rejected -------------------------------


class _Clock:
    """Time that the test advances by hand (the target's steps, the model's forwards)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


TARGET_STEP_S, DRAFTED_TOKEN_S = 0.1, 0.01
MODEL_FORWARD_S = 0.016
"""A weak draft's forward: 0.16 of a target step, as the 2-layer draft measured on this CPU."""


def _rag_answer(seed: int = 0) -> tuple[list[int], list[int]]:
    """A prompt holding a passage, and an answer that copies spans of it between words of its own."""
    rng = np.random.default_rng(seed)
    passage = list(range(1000, 1200))
    answer: list[int] = []
    while len(answer) < 300:
        start = int(rng.integers(0, 150))
        answer += passage[start : start + int(rng.integers(8, 30))]
        answer += rng.integers(2000, 3000, int(rng.integers(3, 8))).tolist()
    return [5, 6, 7, *passage, 8, 9], answer


def _generate(drafter, prompt: list[int], answer: list[int], clock: _Clock, right: bool = False,
              forward_s: float = MODEL_FORWARD_S) -> list[bool]:
    """The target answers ``answer`` (greedy), verifying each step's draft; a hybrid's model drafts
    token 1 (always rejected), or the answer's next tokens if ``right``, at ``forward_s`` per
    forward. Returns, per step, whether the model ran on a step where no row took its draft."""
    max_len = 1024
    context, pos, new = [*prompt, answer[0]], 1, [answer[0]]
    idle_forwards = []
    while pos < len(answer) - 10:
        token_ids = np.zeros((1, max_len), np.int32)
        token_ids[0, : len(context)] = context
        if isinstance(drafter, HybridDrafter):
            drafter.candidates(StepBatch(["r"], [new], np.array([len(context)]), token_ids))
            steps = drafter.plan()
            if drafter.catch_up:
                clock.t += forward_s * max(steps, 1)
                drafter.record_model(steps, forward_s * max(steps, 1))
            idle_forwards.append(drafter.catch_up and not drafter.from_model.any())
            draft = drafter.compose([answer[pos : pos + steps] if right else [1] * steps])[0]
        else:
            draft = drafter.step(StepBatch(["r"], [new], np.array([len(context)]), token_ids))[0]
        kept = 0
        while kept < len(draft) and draft[kept] == answer[pos + kept]:
            kept += 1
        clock.t += TARGET_STEP_S + DRAFTED_TOKEN_S * len(draft)
        new = answer[pos : pos + kept + 1]
        context += new
        pos += kept + 1
    return idle_forwards


def test_with_a_weak_draft_the_hybrid_drafts_the_passages_as_the_ngram_proposer_alone() -> None:
    from ragspec.backends.vllm.proposer import BatchDrafter

    prompt, answer = _rag_answer()
    alone = BatchDrafter(8, max_model_len=1024, clock=_Clock())
    _generate(alone, prompt, answer, alone.clock)
    hybrid = HybridDrafter(8, max_model_len=1024, clock=_Clock())
    idle_forwards = _generate(hybrid, prompt, answer, hybrid.clock)
    stats = hybrid.stats()
    assert alone.drafted > 100
    # Before the fix the n-gram side stopped with the model's catch-up: 46 tokens against 246.
    assert stats["drafted_by_source"]["ngram"] >= 0.9 * alone.drafted, (stats, alone.stats())
    assert hybrid.accepted >= 0.9 * alone.accepted
    # The model is tried once, its tokens rejected, and then never run: no forward on a step where
    # no row takes its draft (the first step's is the exploring request's prompt entering its cache).
    assert stats["drafted_by_source"]["model"] <= 2 * EXPLORE_TOKENS
    assert sum(idle_forwards) <= 1 and stats["model_forwards"] <= 3, stats
    assert stats["plans"]["model"] <= 2 and stats["plans"]["ngram"] > 20


def test_the_step_costs_the_policy_plans_with_hold_no_draft_model_work() -> None:
    prompt, answer = _rag_answer(1)
    hybrid = HybridDrafter(8, max_model_len=1024, clock=_Clock())
    _generate(hybrid, prompt, answer, hybrid.clock, right=True, forward_s=0.01)  # always right and cheap: chosen
    stats = hybrid.stats()
    assert stats["model_forwards"] >= 5 and stats["timed_steps"]["model"] >= 3, stats
    for drafted, seconds in hybrid.costs.curves[1].measured().items():
        assert seconds == pytest.approx(TARGET_STEP_S + DRAFTED_TOKEN_S * drafted), (drafted, stats)
    # The model is charged its whole forward work, its first forward included: a forward per step.
    assert hybrid.model_steps_cost(1, 2).tolist() == pytest.approx([0.0, 0.1, 0.2])


# -- many requests, 1 to 8 at once, with a draft model whose every token is rejected ----------


def _open_answer(seed: int) -> tuple[list[int], list[int]]:
    """A short prompt and an answer of its own words: nothing to copy (the open workload)."""
    rng = np.random.default_rng(seed + 1000)
    return rng.integers(1000, 5000, 30).tolist(), rng.integers(6000, 30000, 120).tolist()


_REQUEST_IDS = itertools.count()


def _serve(drafter, work: list[tuple[list[int], list[int]]], clients: int, right: bool = False) -> dict[str, int]:
    """The target answers each (prompt, answer) of ``work`` greedily, ``clients`` requests at once,
    verifying each step's drafts; a hybrid's model drafts token 1 (always rejected), or each row's
    next tokens if ``right``. Counts what the draft model took in: ``model_tokens`` (the tokens of
    its first forwards, as vLLM's padded batch feeds it: a new request's prompt, a decoding row's
    verified tokens), ``prefilled`` of those (prompts) and ``prompts`` prefilled."""
    clock = drafter.clock
    todo = list(work)
    live: dict[str, list] = {}  # id -> [context, position in the answer, new tokens, answer, last draft's length]
    counts = {"steps": 0, "model_tokens": 0, "prefilled": 0, "prompts": 0, "exploring_steps": []}
    while todo or live:
        while todo and len(live) < clients:
            prompt, answer = todo.pop(0)
            live[f"r{next(_REQUEST_IDS)}"] = [[*prompt, answer[0]], 1, [answer[0]], answer, -1]
        ids = list(live)
        token_ids = np.zeros((len(ids), 1024), np.int32)
        for r, rid in enumerate(ids):
            token_ids[r, : len(live[rid][0])] = live[rid][0]
        lengths = np.array([len(live[rid][0]) for rid in ids])
        new = [live[rid][2] for rid in ids]
        if isinstance(drafter, HybridDrafter):
            before = drafter.explorations
            drafter.candidates(StepBatch(ids, new, lengths, token_ids))
            steps = drafter.plan()
            model: list[list[int]] = []
            if drafter.catch_up:
                prompts = [len(live[rid][0]) - 1 for rid in ids if live[rid][4] < 0]
                tokens = sum(prompts) + sum(1 + live[rid][4] for rid in ids if live[rid][4] >= 0)
                counts["model_tokens"] += tokens + len(ids) * max(steps - 1, 0)
                counts["prefilled"] += sum(prompts)
                counts["prompts"] += len(prompts)
                clock.t += MODEL_FORWARD_S * max(steps, 1)
                drafter.record_model(steps, MODEL_FORWARD_S * max(steps, 1), tokens)
                model = [live[rid][3][live[rid][1] : live[rid][1] + steps] if right else [1] * steps for rid in ids]
            if drafter.explorations > before:
                counts["exploring_steps"].append(counts["steps"])
            drafts = drafter.compose(model)
        else:
            drafts = drafter.step(StepBatch(ids, new, lengths, token_ids))
        counts["steps"] += 1
        clock.t += TARGET_STEP_S + DRAFTED_TOKEN_S * sum(map(len, drafts))
        for rid, draft in zip(ids, drafts):
            context, pos, _, answer, _ = state = live[rid]
            kept = 0
            while kept < len(draft) and pos + kept < len(answer) and draft[kept] == answer[pos + kept]:
                kept += 1
            state[0], state[1], state[2], state[4] = context + answer[pos : pos + kept + 1], pos + kept + 1, answer[
                pos : pos + kept + 1], len(draft)
            if state[1] >= len(answer):
                del live[rid]
    return counts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("clients", [1, 4, 8])
@pytest.mark.parametrize("workload", [_rag_answer, _open_answer])
def test_a_model_that_never_pays_prefills_few_prompts_and_tries_ever_more_rarely(workload, clients) -> None:
    work = [workload(seed) for seed in range(24)]
    hybrid = HybridDrafter(8, max_model_len=1024, clock=_Clock(), max_rows=8)
    counts = _serve(hybrid, work, clients)
    stats = hybrid.stats()
    steps = counts["steps"]
    # Tries back off: 64, 128, 256, ... steps apart (the model's drafts never chosen in between), so
    # over S steps at most 2 + log2(S / 64) tries, each prefilling the prompts that begin on its steps.
    tries = 2 + max(0.0, np.log2(steps / hybrid.policy.explore_every))
    assert stats["explorations"] <= tries, (counts, stats)
    gaps = np.diff(counts["exploring_steps"])
    assert (gaps >= hybrid.policy.explore_every * 2 ** np.arange(1, len(gaps) + 1)).all(), counts
    prompt = len(work[0][0])
    assert counts["prompts"] <= tries * clients and counts["prefilled"] <= tries * clients * prompt, counts
    # Besides prompts the model took in little: its forwards are on exploring steps and a wait or two.
    assert stats["model_forwards"] <= 3 * tries and stats["idle_model_forwards"] <= 2 * tries, stats
    assert counts["model_tokens"] - counts["prefilled"] <= 4 * tries * clients * 9, counts
    assert stats["drafted_by_source"]["model"] <= EXPLORE_TOKENS * clients * tries


def test_the_tries_back_off_while_the_plan_never_follows_and_reset_when_it_does() -> None:
    from ragspec.backends.vllm.hybrid import EXPLORE_BACKOFF

    hybrid = HybridDrafter(8, max_model_len=1024, clock=_Clock(), max_rows=8)
    base = hybrid.policy.explore_every
    intervals = []
    for seed in range(4):  # a request at a time, each new one whole: every try that falls due happens
        _serve(hybrid, [_open_answer(seed)], 1)
        intervals.append(hybrid.explore_interval)
    assert hybrid.explorations >= 2 and hybrid.explore_interval == base * 2 ** hybrid.explorations
    assert intervals == sorted(intervals)
    for _ in range(10):
        hybrid._backoff()
    assert hybrid.explore_interval == EXPLORE_BACKOFF * base  # capped
    # A model that is right and cheap is chosen by the plan once tried: the interval is back at its base.
    hybrid._since_model = hybrid.explore_interval
    counts = _serve(hybrid, [_open_answer(9)], 1, right=True)
    assert hybrid.stats()["plans"]["model"] > 5 and hybrid.explore_interval == base, (counts, hybrid.stats())


def test_once_the_model_is_left_the_hybrid_drafts_what_the_proposer_alone_drafts() -> None:
    from ragspec.backends.vllm.proposer import BatchDrafter

    work = [_rag_answer(seed) for seed in range(6)]
    alone = BatchDrafter(8, max_model_len=1024, clock=_Clock(), max_rows=8)
    hybrid = HybridDrafter(8, max_model_len=1024, clock=_Clock(), max_rows=8)
    hybrid._since_model = 0  # never tried: the model can take no row after each request's first step
    hybrid.explore_interval = 10**9
    a, h = _serve(alone, work, 4), _serve(hybrid, work, 4)
    assert h["steps"] == a["steps"] and hybrid.drafted == alone.drafted and hybrid.accepted == alone.accepted
    assert hybrid.stats()["drafted_by_source"] == {"ngram": alone.drafted, "model": 0}
    assert hybrid.stats()["accepted_by_source"] == {"ngram": alone.accepted, "model": 0}
