"""The hybrid drafter: ragspec's n-gram drafts and a draft model's, chosen per request and step.

vLLM runs the draft model (``ragspec.backends.vllm.hybrid_worker`` puts this drafter inside vLLM's
own draft-model proposer, so the model runs batched with vLLM's KV cache and catch-up); this
module decides, with no vLLM import (tested on fake batches):

1. ``candidates``: ragspec's n-gram candidate of every row (``BatchDrafter``'s suffix automata
   over the prompt, where the passages are, the answer so far and earlier answers; its compiled
   kernel with planning off), and the step that just ran timed by its batch size and drafted
   tokens (``StepCosts``, as ragspec's n-gram proposer times them). Where the model can draft for
   no row (every request's draft cache has holes, ``_holes``: the model was left), the kernel plans
   too, exactly as ragspec's proposer alone does, and steps 2 and 3 only hand its drafts on: a step
   then costs what the proposer's does, in the host's work as in the device's.
2. ``plan``: ``ragspec.engine.planning.plan_sources``, the one choice rule: per row the n-gram
   draft or the model's (whichever whole draft yields more; acceptance by source and match length,
   learnt online), every row's length, and how many draft-model steps the batch runs, each costed
   with the model's whole forward work of the step (its first forward included, timed here,
   ``model_seconds``): where the n-gram drafts win the batch runs none, where nothing pays, nothing
   is drafted. The model's first forward over each step's tokens (its catch-up, which keeps its KV
   cache whole) is paid on a step where no row takes the model's draft only to keep the model
   usable: for ``MODEL_IDLE_STEPS`` steps after its drafts last earned tokens, and while an exploration
   waits for a row (``_decide_catch_up``); otherwise the model does not run at all, so such a step
   costs what ragspec's n-gram proposer's does. The n-gram drafts never depend on the model's state.
   A model never chosen is tried (``_explore``: two tokens on rows that draft nothing, a new
   request's prompt entering its cache for it) ever more rarely: 64, 128, 256, ... steps apart
   (``EXPLORE_BACKOFF``) while the plan never follows a try, back to 64 once it does.
3. ``compose``: the drafts vLLM verifies, from the n-gram candidates and the model's tokens;
   each row's choice is remembered so that the next step's kernel records its acceptance under
   its source (``planning.MODEL`` for the model's).

Seeded rows get no drafts (as in ``BatchDrafter``: drafts that depend on timing would change a
seeded sample from run to run).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ragspec.backends.vllm.proposer import BatchDrafter, StepBatch, draft_lists
from ragspec.engine.ngram_batch import CAP, LAST_BUCKET, LAST_GROUP, LAST_K, NONE, OUTPUT_SOURCE
from ragspec.engine.planning import MAX_BUCKET, MAX_Q, MODEL, OUTPUT, REFERENCE, CostCurve, plan_sources, rates

EXPLORE_TOKENS = 2
"""Draft-model tokens a row tries when the model is explored (two: its first and later acceptance)."""
MODEL_IDLE_STEPS = 8
"""Steps the draft model keeps catching up after its drafts last earned tokens (``_decide_catch_up``)."""
EXPLORE_WAIT_STEPS = 2
"""Steps an exploration due waits, the model running, for a new request to draft nothing (then it
is tried on it); after that the next try is the backed-off interval away (``EXPLORE_BACKOFF``)."""
EXPLORE_BACKOFF = 32
"""Each try of the model that the plan does not follow (its drafts were never chosen before the next
try fell due) doubles the steps to the next one, from ``policy.explore_every`` up to this many times
it: 64, 128, 256, ... 2048 steps by default. A step whose plan chooses the model resets it."""
MODEL_PRIOR_SLOPE = 0.5
"""Prior cost of one draft-model forward in plain steps of the batch, until timed."""


class HybridDrafter(BatchDrafter):
    """``BatchDrafter``'s state and timing, with a draft model as a second source (module docstring).

    ``model_seconds`` times the draft model's work by its number of steps (0: the catch-up forward
    alone); ``model_steps_cost(rows, longest)`` turns it into plain steps of the batch, a forward per step. The step
    costs of ``BatchDrafter`` never hold the model's work: they time the interval from ``compose``
    to the next ``candidates``, and the model runs between ``plan`` and ``compose``.
    """

    def __init__(self, max_draft: int, **settings: Any) -> None:
        """``settings``: ``BatchDrafter``'s (``max_model_len``, ``history_tokens``, ``policy``, ...)."""
        super().__init__(max_draft, **settings)
        self.model_seconds = CostCurve(MODEL_PRIOR_SLOPE, self.costs.smoothing, monotone=True)
        self.from_model = np.zeros(0, np.int64)
        self.ks = np.zeros(0, np.int64)
        self.caps = np.zeros(0, np.int64)  # each row's longest draft this step (0: none; set where the model may draft)
        self.model_caps = np.zeros(0, np.int64)  # the same for the model's drafts (0: its cache has holes)
        self.drafted_by_source = {"ngram": 0, "model": 0}
        self.accepted_by_source = {"ngram": 0, "model": 0}
        self.plans = {"none": 0, "ngram": 0, "model": 0}  # steps by what they drafted
        self.timed_steps = {"none": 0, "ngram": 0, "model": 0}  # timed steps (``costs``) by what they carried
        self.model_steps_run = 0
        self.model_forwards = 0  # steps on which the draft model ran (catch-up, maybe drafting)
        self.idle_model_forwards = 0  # of those, steps on which no row took the model's draft
        self.model_tokens = 0  # tokens the model's forwards took in (prompts, catch-ups, its drafting steps)
        self.explorations = 0  # tries of the model (``_explore``), and tries that found no row to try it on
        self.skipped_catch_ups = 0
        self.catch_up = True
        self.explore_interval = self.policy.explore_every  # steps from one try of the model to the next
        self._no_caps = np.zeros(0, np.int64)
        self._rows = 0
        self._ngram_only = False  # no row may take the model's draft: the kernel planned, as the proposer's
        self._decode_only = False  # every row of this step sampled: its model timing is a decode step's
        self._last_source = "none"
        self._since_model = self.policy.explore_every  # the first chance measures the model
        self._idle = MODEL_IDLE_STEPS  # steps since the model's drafts last earned tokens
        self._earned = False  # some row kept model tokens in the step that just ran
        self._model_unverified = False  # some request's last draft was the model's, not yet counted
        self._waited = 0  # steps an exploration has waited for a row to try the model on
        self._holes: set[str] = set()  # requests in the batch whose draft-model KV cache has holes

    def candidates(self, batch: StepBatch) -> None:
        """Index the tokens each row sampled and find its n-gram candidate (``index.cand``,
        ``index.drafts``); rows that may draft get ``caps`` > 0, and ``model_caps`` > 0 where the
        draft model's cache is whole. Where no row's is (the model left, its requests holed), the
        kernel also plans, as ragspec's proposer alone does, and ``plan`` has nothing left to do:
        a step costs what the proposer's does."""
        last_ids, last_time = self._last_ids, self._last_time
        began = self.requests_seen + self.undrafted_seen
        ids, n_new, num_tokens, seeded, all_sampled = self._begin_step(batch)
        admitted = self.requests_seen + self.undrafted_seen > began  # a prompt ended: its catch-up is a prefill
        if all_sampled and ids == last_ids and last_time is not None:  # ``_begin_step`` timed the last step
            self.timed_steps[self._last_source] += 1
        rows = len(ids)
        if self._holes:
            self._holes.intersection_update(ids)
        self._ngram_only = self._holes.issuperset(ids)
        by_row = self._model_unverified  # else every token this step kept was an n-gram draft's
        self._earned = self._count_accepted(n_new) if by_row else False
        curve = self.costs.plannable(rows) if self._ngram_only else None
        _, accepted, restarted = self.index.step(
            self._slots, n_new, num_tokens, batch.token_ids, seeded, self.policy.acceptance.counts, self.policy.decay,
            curve, self.policy.margin)
        self.accepted += accepted
        if not by_row:
            self.accepted_by_source["ngram"] += accepted
        self.requests_seen += restarted
        self.steps += 1
        self._rows = rows
        self._decode_only = all_sampled and not self._pending and not admitted and not restarted
        self._last_ids = ids if all_sampled else None
        if self._ngram_only:  # the model may take no row: no caps for it (the kernel capped the n-gram drafts)
            if len(self._no_caps) < rows:
                self._no_caps = np.zeros(2 * rows, np.int64)
            self.model_caps = self._no_caps[:rows]
            return
        caps = np.zeros(rows, np.int64)
        live = (self._slots >= 0) & (n_new > 0) & (seeded == 0)
        if live.any():
            room = np.minimum(self.index.requests[self._slots[live], CAP], self.max_model_len - num_tokens[live] - 1)
            caps[live] = np.clip(room, 0, self.max_draft)
        model_caps = caps.copy()
        if self._holes:
            model_caps[[r for r, rid in enumerate(ids) if rid in self._holes]] = 0
        self.caps, self.model_caps = caps, model_caps

    def _count_accepted(self, n_new: np.ndarray) -> bool:
        """Per source, the drafted tokens this step kept (the kernel records them into the policy's
        statistics; this only counts them for ``stats``), while some request's last draft was the
        model's (else every kept token is an n-gram draft's: ``candidates`` counts them at once).
        Returns whether some row kept model tokens."""
        live = np.flatnonzero(self._slots >= 0)
        if not len(live):
            return False
        req = self.index.requests[self._slots[live]]
        earned = unverified = False
        for r, k, group in zip(live.tolist(), req[:, LAST_K].tolist(), req[:, LAST_GROUP].tolist()):
            if k <= 0:
                continue
            if n_new[r] <= 0:  # not verified yet (its row did not sample this step)
                unverified = unverified or group == MODEL
                continue
            kept = min(int(n_new[r]) - 1, k)
            if group == MODEL:
                self.accepted_by_source["model"] += kept
                earned = earned or kept > 0
            else:
                self.accepted_by_source["ngram"] += kept
        self._model_unverified = unverified
        return earned

    def plan(self) -> int:
        """Every row's source and length (``ks``, ``from_model``); returns the draft-model steps to
        run, and sets ``catch_up`` (whether the model runs at all this step)."""
        rows = self._rows
        self._idle = 0 if self._earned else self._idle + 1
        if self._ngram_only:  # the kernel planned (``candidates``); the model can draft for no row
            self.ks, self.from_model = self.index.ks[:rows], np.zeros(rows, np.int64)
            self._since_model += 1
            self._last_drafted = int(self.ks.sum())
            if self._waited:  # the model ran for a request to try it on, which left untried: a try
                self._backoff()
                self._waited = 0
            self.catch_up = False
            self.skipped_catch_ups += 1
            self._last_source = "ngram" if self._last_drafted else "none"
            self.plans[self._last_source] += 1
            return 0
        cand = self.index.cand[:rows]
        self.ks, self.from_model = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
        curve = self.costs.plannable(rows)
        steps = 0
        if curve is not None and rows:  # else a batch size whose plain step is not timed yet: plain
            counts = self.policy.acceptance.counts
            lengths = np.where(cand[:, 0] != NONE, np.minimum(cand[:, 2], self.caps), 0)
            groups = np.where(cand[:, 0] == OUTPUT_SOURCE, OUTPUT, REFERENCE)
            buckets = np.minimum(cand[:, 1], MAX_BUCKET)
            p1 = counts[0, groups, buckets] / counts[1, groups, buckets]
            q = np.minimum(counts[2, groups, buckets] / counts[3, groups, buckets], MAX_Q)
            model_p1, model_q = rates(counts, MODEL, 0)
            longest = int(self.model_caps.max(initial=0))
            cost = curve.table(int(lengths.sum()) + rows * longest + 1)
            _, steps = plan_sources(
                p1, q, lengths, groups * (MAX_BUCKET + 1) + buckets, 2 * (MAX_BUCKET + 1), model_p1, model_q,
                self.model_caps, cost, self.model_steps_cost(rows, longest), self.policy.margin, self.ks,
                self.from_model,
            )  # fmt: skip
        if steps > 0:  # the plan chose the model: it pays, so it is tried again soon once left
            self._since_model = 0
            self.explore_interval = self.policy.explore_every
        else:
            steps = self._explore()
        self._last_drafted = int(self.ks.sum())
        self._decide_catch_up(steps)
        model_rows = int(self.from_model.sum())
        self._last_source = "model" if model_rows else "ngram" if self._last_drafted else "none"
        self.plans[self._last_source] += 1
        return int(steps)

    def _decide_catch_up(self, steps: int) -> None:
        """Whether the draft model runs this step at all (``catch_up``). Its first forward over the
        step's tokens keeps its KV cache whole, and costs a draft forward; a step whose rows take
        no model draft pays it only to keep the model usable: for ``MODEL_IDLE_STEPS`` steps after
        its drafts last earned tokens (some were kept), or while an exploration is due (new
        requests enter its cache, to be tried on; ``EXPLORE_WAIT_STEPS``). Otherwise the model does not run, and
        every request in the batch loses it for good (``_holes``: its cache misses this step's
        tokens); later requests start whole. A step whose rows are all holed never runs it (it
        could draft for none of them; ``plan`` does not come here)."""
        due = self._since_model >= self.explore_interval
        if steps:
            self._waited = 0
        elif due:  # the model runs for a row to try it on (``candidates``: some row is whole)
            self._waited += 1
            if self._waited > EXPLORE_WAIT_STEPS:  # none came that drafts nothing: a try, backed off
                self._backoff()
                self._waited, due = 0, False
        self.catch_up = steps > 0 or self._idle < MODEL_IDLE_STEPS or due
        if not self.catch_up:
            self._holes.update(self._ids)  # the step's tokens never reach the model's cache
            self.skipped_catch_ups += 1

    def _explore(self) -> int:
        """Once the steps without the model reach ``explore_interval``, rows that draft nothing and
        whose model cache is whole try ``EXPLORE_TOKENS`` of its tokens: its cost and acceptance
        may have changed (or were never measured: until then its priors decide)."""
        self._since_model += 1
        if self._since_model < self.explore_interval:
            return 0
        idle = (self.model_caps > 0) & (self.ks == 0)
        if not idle.any():
            return 0
        self._backoff()
        self.ks[idle] = np.minimum(self.model_caps[idle], EXPLORE_TOKENS)
        self.from_model[idle] = 1
        return int(self.ks[idle].max())

    def _backoff(self) -> None:
        """A try of the model: the next is ``explore_interval`` steps away, twice as far as this one
        (up to ``EXPLORE_BACKOFF`` times ``policy.explore_every``) unless the plan chooses the model
        in between (``plan`` resets it)."""
        self.explorations += 1
        self._since_model = 0
        self.explore_interval = min(2 * self.explore_interval, EXPLORE_BACKOFF * self.policy.explore_every)

    def model_steps_cost(self, rows: int, longest: int) -> np.ndarray:
        """``[j]``: the draft model's work for ``j`` steps, ``j`` forwards (its first forward, over the
        step's tokens, drafts the first token), in plain steps of a batch of ``rows``; until timed,
        ``MODEL_PRIOR_SLOPE`` per step. The first forward is charged to the model even when it
        would run anyway (keeping the model usable): so a model whose drafts do not pay for their
        whole forward work is never chosen, and its forwards stop."""
        steps = np.arange(longest + 1, dtype=np.float64)
        plain = self.costs.curve(rows)
        timed = self.model_seconds.measured()
        if not timed or not plain.has_plain:
            return MODEL_PRIOR_SLOPE * steps
        weights = self.model_seconds.timings()
        forward = sum(weights[j] * s / max(j, 1) for j, s in timed.items()) / sum(weights.values())
        return steps * (forward / plain.fitted()[0])

    def compose(self, model_tokens: Sequence[Sequence[int]]) -> list[list[int]]:
        """The drafts of the planned rows: n-gram tokens, or the model's (``model_tokens[row]``)."""
        rows = self._rows
        if not self._last_drafted:
            drafts: list[list[int]] = [[] for _ in range(rows)]
        elif self._ngram_only:  # the kernel planned and noted each draft's source
            drafts = draft_lists(self.index.drafts[:rows], self.ks)
            self.drafted_by_source["ngram"] += self._last_drafted
        else:
            drafts = self._compose_sources(model_tokens)
        self.drafted += self._last_drafted
        self._last_time = self.clock()
        return drafts

    def _compose_sources(self, model_tokens: Sequence[Sequence[int]]) -> list[list[int]]:
        rows = self._rows
        drafts: list[list[int]] = [[] for _ in range(rows)]
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
                self._model_unverified = True
            else:
                drafts[r] = ngram[r, :k].tolist()
                req[LAST_GROUP] = OUTPUT if cand[r, 0] == OUTPUT_SOURCE else REFERENCE
                req[LAST_BUCKET] = min(int(cand[r, 1]), MAX_BUCKET)
                self.drafted_by_source["ngram"] += k
            req[LAST_K] = len(drafts[r])
        return drafts

    def record_model(self, steps: int, seconds: float, tokens: int = 0) -> None:
        """The draft model ran this step (``catch_up``): ``steps`` draft steps (0: catch-up only) in
        ``seconds``, its first forward over ``tokens`` tokens (the step's: prompts, catch-ups); timed
        into ``model_seconds`` when every row was decoding (a prompt's catch-up is a prefill, not a
        step's)."""
        if self._decode_only:
            self.model_seconds.record(steps, seconds)
        self.model_steps_run += steps
        self.model_forwards += 1
        self.idle_model_forwards += steps == 0
        self.model_tokens += tokens + self._rows * max(steps - 1, 0)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["drafted_by_source"] = dict(self.drafted_by_source)
        out["accepted_by_source"] = dict(self.accepted_by_source)
        out["model_seconds_by_steps"] = {str(j): s for j, s in self.model_seconds.measured().items()}
        out["model_steps"] = self.model_steps_run
        out["model_forwards"] = self.model_forwards
        out["idle_model_forwards"] = self.idle_model_forwards
        out["model_tokens"] = self.model_tokens
        out["explorations"] = self.explorations
        out["explore_interval"] = self.explore_interval
        out["skipped_catch_ups"] = self.skipped_catch_ups
        out["plans"] = dict(self.plans)
        out["timed_steps"] = dict(self.timed_steps)
        return out
