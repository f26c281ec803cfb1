"""The hybrid drafter: ragspec's n-gram drafts and a draft model's, chosen per request and step.

vLLM runs the draft model (``ragspec.backends.vllm.hybrid_worker`` puts this drafter inside vLLM's
own draft-model proposer, so the model runs batched with vLLM's KV cache and catch-up); this
module decides, with no vLLM import (tested on fake batches):

1. ``candidates``: ragspec's n-gram candidate of every row (``BatchDrafter``'s suffix automata
   over the prompt, where the passages are, the answer so far and earlier answers; its compiled
   kernel with planning off), and the step that just ran timed by its batch size and drafted
   tokens (``StepCosts``, as ragspec's n-gram proposer times them).
2. ``plan``: ``ragspec.engine.planning.plan_sources``, the one choice rule: per row the n-gram
   draft or the model's (whichever whole draft yields more; acceptance by source and match length,
   learnt online), every row's length, and how many draft-model steps the batch runs (their cost
   timed here, ``model_seconds``): where the n-gram drafts win the batch runs none, where
   nothing pays, nothing is drafted. The model's first forward over each step's tokens (its
   catch-up, which keeps its KV cache whole) is the one cost paid without drafting: it stops
   ``MODEL_IDLE_STEPS`` steps after the model last drafted (``_decide_catch_up``).
3. ``compose``: the drafts vLLM verifies, from the n-gram candidates and the model's tokens;
   each row's choice is remembered so that the next step's kernel records its acceptance under
   its source (``planning.MODEL`` for the model's).

Seeded rows get no drafts (as in ``BatchDrafter``: drafts that depend on timing would change a
seeded sample from run to run).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from ragspec.backends.vllm.proposer import BatchDrafter
from ragspec.engine.ngram_batch import CAP, LAST_BUCKET, LAST_GROUP, LAST_K, NONE, OUTPUT_SOURCE
from ragspec.engine.planning import MAX_BUCKET, MODEL, OUTPUT, REFERENCE, CostCurve, plan_sources, rates

EXPLORE_TOKENS = 2
"""Draft-model tokens a row tries when the model is explored (two: its first and later acceptance)."""
MODEL_IDLE_STEPS = 8
"""Steps the draft model keeps catching up after it last drafted, before it stops (``_decide_catch_up``)."""
MODEL_PRIOR_SLOPE = 0.5
"""Prior cost of one draft-model step beyond its catch-up forward, in catch-up forwards, until timed."""


class HybridDrafter(BatchDrafter):
    """``BatchDrafter``'s state and timing, with a draft model as a second source (module docstring).

    ``model_seconds`` times the draft model's work by its number of steps (0: the catch-up forward
    alone); ``model_steps_cost(rows, longest)`` turns it into plain steps of the batch.
    """

    def __init__(self, max_draft: int, **settings: Any) -> None:
        """``settings``: ``BatchDrafter``'s (``max_model_len``, ``history_tokens``, ``policy``, ...)."""
        super().__init__(max_draft, **settings)
        self.model_seconds = CostCurve(MODEL_PRIOR_SLOPE, self.costs.smoothing, monotone=True)
        self.from_model = np.zeros(0, np.int64)
        self.ks = np.zeros(0, np.int64)
        self.model_caps = np.zeros(0, np.int64)
        self.drafted_by_source = {"ngram": 0, "model": 0}
        self.accepted_by_source = {"ngram": 0, "model": 0}
        self.model_steps_run = 0
        self._rows = 0
        self._since_model = self.policy.explore_every  # the first chance measures the model
        self._idle = 0  # steps since the model last drafted
        self._tracked: set[str] = set()  # requests with state, as of the last step
        self._new: set[str] = set()  # requests that showed their first tokens this step
        self.model_live: set[str] = set()  # requests whose draft-model KV cache is whole
        self.catch_up = True
        self.skipped_catch_ups = 0

    def candidates(
        self,
        req_ids: Sequence[str],
        sampled: Sequence[Sequence[int]],
        num_tokens: Sequence[int] | np.ndarray,
        token_ids: np.ndarray,
        seeded_rows: Collection[int] = (),
    ) -> None:
        """Index the tokens each row sampled and find its n-gram candidate (``index.cand``,
        ``index.drafts``); rows that may draft get ``model_caps`` > 0."""
        ids, n_new, num_tokens, seeded, all_sampled = self._begin_step(req_ids, sampled, num_tokens, seeded_rows)
        rows = len(ids)
        self._count_accepted(n_new)
        _, accepted, restarted = self.index.step(
            self._slots, n_new, num_tokens, token_ids, seeded, self.policy.acceptance.counts, self.policy.decay)
        self.accepted += accepted
        self.requests_seen += restarted
        self.steps += 1
        caps = np.zeros(rows, np.int64)
        live = (self._slots >= 0) & (n_new > 0) & (seeded == 0)
        if live.any():
            room = np.minimum(self.index.requests[self._slots[live], CAP], self.max_model_len - num_tokens[live] - 1)
            caps[live] = np.clip(room, 0, self.max_draft)
        tracked = {rid for rid, slot in zip(ids, self._slots.tolist()) if slot >= 0}
        self._new = tracked - self._tracked
        self._tracked = tracked
        self.model_live &= tracked
        for r, rid in enumerate(ids):  # a row whose draft-model KV cache has holes gets none of its drafts
            if caps[r] and rid not in self.model_live and rid not in self._new:
                caps[r] = 0
        self.model_caps = caps
        self._rows = rows
        self._last_ids = ids if all_sampled else None

    def _count_accepted(self, n_new: np.ndarray) -> None:
        """Per source, the drafted tokens this step kept (the kernel records them into the policy's
        statistics; this only counts them for ``stats``)."""
        live = np.flatnonzero(self._slots >= 0)
        if not len(live):
            return
        req = self.index.requests[self._slots[live]]
        for r, k, group in zip(live.tolist(), req[:, LAST_K].tolist(), req[:, LAST_GROUP].tolist()):
            if k > 0 and n_new[r] > 0:
                self.accepted_by_source["model" if group == MODEL else "ngram"] += min(int(n_new[r]) - 1, k)

    def plan(self) -> int:
        """Every row's source and length (``ks``, ``from_model``); returns the draft-model steps to run."""
        rows = self._rows
        cand = self.index.cand[:rows]
        self.ks, self.from_model = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
        curve = self.costs.plannable(rows)
        if curve is None or not rows:
            self._last_drafted = 0
            self._decide_catch_up(0)
            return 0  # a batch size whose plain step is not timed yet: plain, as ragspec's proposer
        counts = self.policy.acceptance.counts
        lengths = np.where(cand[:, 0] != NONE, np.minimum(cand[:, 2], self.model_caps), 0)
        groups = np.where(cand[:, 0] == OUTPUT_SOURCE, OUTPUT, REFERENCE)
        buckets = np.minimum(cand[:, 1], MAX_BUCKET)
        p1, q = np.empty(rows), np.empty(rows)
        for r in range(rows):
            p1[r], q[r] = rates(counts, groups[r], buckets[r])
        model_p1, model_q = rates(counts, MODEL, 0)
        longest = int(self.model_caps.max(initial=0))
        cost = curve.table(int(lengths.sum()) + rows * longest + 1)
        drafted, steps = plan_sources(
            p1, q, lengths, groups * (MAX_BUCKET + 1) + buckets, 2 * (MAX_BUCKET + 1), model_p1, model_q,
            self.model_caps, cost, self.model_steps_cost(rows, longest), self.policy.margin, self.ks, self.from_model,
        )  # fmt: skip
        if steps == 0:
            steps = self._explore()
        else:
            self._since_model = 0
        self._last_drafted = int(self.ks.sum())
        self._decide_catch_up(steps)
        return int(steps)

    def _decide_catch_up(self, steps: int) -> None:
        """Whether the draft model runs this step at all (``catch_up``): its first forward over the
        step's tokens is what keeps its KV cache whole, and it costs a draft forward every step. So
        it runs while the model drafts, while prompts are prefilled and for requests that just began
        (their prompt enters its cache), and for ``MODEL_IDLE_STEPS`` steps after the model last drafted; then it stops and
        the requests in the batch lose the model for good (their cache has holes), while new
        requests start with it again."""
        self._idle = 0 if steps > 0 else self._idle + 1
        live = bool(self.model_live) or bool(self._new)
        prefilling = self._pending  # a prompt (or a chunk of it) is entering the cache
        self.catch_up = steps > 0 or bool(self._new) or prefilling or (live and self._idle < MODEL_IDLE_STEPS)
        if self.catch_up:
            self.model_live |= self._new
        else:
            self.model_live.clear()  # every request of this batch: the step's tokens never reach its cache
            self.skipped_catch_ups += 1

    def _explore(self) -> int:
        """Every ``policy.explore_every`` steps without the model, rows that draft nothing try
        ``EXPLORE_TOKENS`` of its tokens: its cost and acceptance may have changed (or were never
        measured: until then its priors decide)."""
        idle = (self.model_caps > 0) & (self.ks == 0)
        if not idle.any():
            return 0
        self._since_model += 1
        if self._since_model < self.policy.explore_every:
            return 0
        self._since_model = 0
        self.ks[idle] = np.minimum(self.model_caps[idle], EXPLORE_TOKENS)
        self.from_model[idle] = 1
        return int(self.ks[idle].max())

    def model_steps_cost(self, rows: int, longest: int) -> np.ndarray:
        """``[j]``: ``j`` draft-model steps beyond its catch-up forward, in plain steps of a batch of
        ``rows`` (until the catch-up forward is timed: ``MODEL_PRIOR_SLOPE`` per step)."""
        steps = np.arange(longest + 1, dtype=np.float64)
        plain = self.costs.curve(rows)
        if not self.model_seconds.has_plain or not plain.has_plain:
            return MODEL_PRIOR_SLOPE * steps
        catch_up = self.model_seconds.fitted()[0]
        return (self.model_seconds.table(longest) - 1.0) * catch_up / plain.fitted()[0]

    def compose(self, model_tokens: Sequence[Sequence[int]]) -> list[list[int]]:
        """The drafts of the planned rows: n-gram tokens, or the model's (``model_tokens[row]``)."""
        rows = self._rows
        drafts: list[list[int]] = [[] for _ in range(rows)]
        if not self._last_drafted:
            self._last_time = self.clock()
            return drafts
        ngram = self.index.drafts[:rows]
        requests = self.index.requests
        cand = self.index.cand
        for r in np.flatnonzero(self.ks[:rows]).tolist():
            k = int(self.ks[r])
            req = requests[self._slots[r]]
            if self.from_model[r]:
                drafts[r] = list(model_tokens[r][:k])
                req[LAST_GROUP], req[LAST_BUCKET] = MODEL, 0
                self.drafted_by_source["model"] += k
            else:
                drafts[r] = ngram[r, :k].tolist()
                req[LAST_GROUP] = OUTPUT if cand[r, 0] == OUTPUT_SOURCE else REFERENCE
                req[LAST_BUCKET] = min(int(cand[r, 1]), MAX_BUCKET)
                self.drafted_by_source["ngram"] += k
            req[LAST_K] = len(drafts[r])
        self.drafted += self._last_drafted
        self._last_time = self.clock()
        return drafts

    def record_model(self, steps: int, seconds: float) -> None:
        """The draft model's work this step took ``seconds`` for ``steps`` steps (0: catch-up only)."""
        self.model_seconds.record(steps, seconds)
        self.model_steps_run += steps

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["drafted_by_source"] = dict(self.drafted_by_source)
        out["accepted_by_source"] = dict(self.accepted_by_source)
        out["model_seconds_by_steps"] = {str(j): s for j, s in self.model_seconds.measured().items()}
        out["model_steps"] = self.model_steps_run
        out["skipped_catch_ups"] = self.skipped_catch_ups
        return out
