"""The hybrid drafter: ragspec's n-gram drafts and a draft model's, chosen per request and step.

vLLM runs the draft model (``ragspec.backends.vllm.hybrid_worker`` puts this drafter inside vLLM's
own draft-model proposer, so the model runs batched with vLLM's KV cache and catch-up); this
module decides, with no vLLM import (tested on fake batches):

1. ``candidates``: ragspec's n-gram candidate of every row (``BatchDrafter``'s suffix automata
   over the prompt, where the passages are, the answer so far and earlier answers; its compiled
   kernel with planning off), and the step that just ran timed by its batch size and drafted
   tokens (``StepCosts``, as ragspec's n-gram proposer times them). Where the model can draft for
   no row (every request's draft cache has holes, ``DraftModelState.holes``: the model was left), the kernel plans
   too, exactly as ragspec's proposer alone does, and steps 2 and 3 only hand its drafts on: a step
   then costs what the proposer's does, in the host's work as in the device's.
2. ``plan``: ``ragspec.engine.planning.plan_sources``, the one choice rule: per row the n-gram
   draft or the model's (whichever whole draft yields more; acceptance by source and match length,
   learnt online), every row's length, and how many draft-model steps the batch runs, each costed
   with the model's whole forward work of the step (its first forward included, timed by
   ``DraftModelState`` in ``hybrid_model``, which holds what is known of the model): where the
   n-gram drafts win the batch runs none, where nothing pays, nothing is drafted. The model's first
   forward over each step's tokens (its catch-up, which keeps its KV cache whole) is paid on a step
   where no row takes the model's draft only to keep the model usable: for ``MODEL_IDLE_STEPS``
   steps after its drafts last earned tokens, and while an exploration waits for a row
   (``DraftModelState.decide_catch_up``); otherwise the model does not run at all, so such a step
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

from ragspec.backends.vllm.hybrid_model import DraftModelState
from ragspec.backends.vllm.proposer import BatchDrafter, StepBatch, draft_lists
from ragspec.engine.ngram_batch import CAP, LAST_BUCKET, LAST_GROUP, LAST_K, NONE, OUTPUT_SOURCE
from ragspec.engine.planning import MAX_BUCKET, MAX_Q, MODEL, OUTPUT, REFERENCE, plan_sources, rates

EXPLORE_TOKENS = 2
"""Draft-model tokens a row tries when the model is explored (two: its first and later acceptance)."""


class HybridDrafter(BatchDrafter):
    """``BatchDrafter``'s state and timing, with a draft model as a second source (module docstring).

    ``model`` (``DraftModelState``) holds what it knows of the draft model: its cost, its tries,
    whether it runs this step (``model.catch_up``), its holes and counters. The step costs of
    ``BatchDrafter`` never hold the model's work: they time the interval from ``compose``
    to the next ``candidates``, and the model runs between ``plan`` and ``compose``.
    """

    def __init__(self, max_draft: int, **settings: Any) -> None:
        """``settings``: ``BatchDrafter``'s (``max_model_len``, ``history_tokens``, ``policy``, ...)."""
        super().__init__(max_draft, **settings)
        self.model = DraftModelState(self.policy, self.costs.smoothing)
        self.from_model = np.zeros(0, np.int64)
        self.ks = np.zeros(0, np.int64)
        self.caps = np.zeros(0, np.int64)  # each row's longest draft this step (0: none; set where the model may draft)
        self.model_caps = np.zeros(0, np.int64)  # the same for the model's drafts (0: its cache has holes)
        self.drafted_by_source = {"ngram": 0, "model": 0}
        self.accepted_by_source = {"ngram": 0, "model": 0}
        self.plans = {"none": 0, "ngram": 0, "model": 0}  # steps by what they drafted
        self.timed_steps = {"none": 0, "ngram": 0, "model": 0}  # timed steps (``costs``) by what they carried
        self._no_caps = np.zeros(0, np.int64)
        self._rows = 0
        self._ngram_only = False  # no row may take the model's draft: the kernel planned, as the proposer's
        self._decode_only = False  # every row of this step sampled: its model timing is a decode step's
        self._last_source = "none"
        self._earned = False  # some row kept model tokens in the step that just ran
        self._model_unverified = False  # some request's last draft was the model's, not yet counted

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
        self._ngram_only = self.model.whole_for_none(ids)
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
        if self.model.holes:
            model_caps[[r for r, rid in enumerate(ids) if rid in self.model.holes]] = 0
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
        run, and sets ``model.catch_up`` (whether the model runs at all this step)."""
        rows = self._rows
        self.model.idle = 0 if self._earned else self.model.idle + 1
        if self._ngram_only:  # the kernel planned (``candidates``); the model can draft for no row
            self.ks, self.from_model = self.index.ks[:rows], np.zeros(rows, np.int64)
            self._last_drafted = int(self.ks.sum())
            self.model.sit_out()
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
                self.model_caps, cost, self.model.steps_cost(self.costs.curve(rows), longest), self.policy.margin,
                self.ks, self.from_model,
            )  # fmt: skip
        if steps > 0:
            self.model.chosen()
        else:
            steps = self._explore()
        self._last_drafted = int(self.ks.sum())
        self.model.decide_catch_up(steps, self._ids)
        model_rows = int(self.from_model.sum())
        self._last_source = "model" if model_rows else "ngram" if self._last_drafted else "none"
        self.plans[self._last_source] += 1
        return int(steps)

    def _explore(self) -> int:
        """Once the steps without the model reach ``model.explore_interval``, rows that draft nothing and
        whose model cache is whole try ``EXPLORE_TOKENS`` of its tokens: its cost and acceptance
        may have changed (or were never measured: until then its priors decide)."""
        if not self.model.try_due():
            return 0
        idle = (self.model_caps > 0) & (self.ks == 0)
        if not idle.any():
            return 0
        self.model.backoff()
        self.ks[idle] = np.minimum(self.model_caps[idle], EXPLORE_TOKENS)
        self.from_model[idle] = 1
        return int(self.ks[idle].max())

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
        """The draft model ran this step (``model.catch_up``): ``steps`` draft steps (0: catch-up only)
        in ``seconds``, its first forward over ``tokens`` tokens (the step's: prompts, catch-ups); timed
        into ``model.seconds`` when every row was decoding (a prompt's catch-up is a prefill, not a
        step's)."""
        self.model.record(steps, seconds, tokens, self._rows, self._decode_only)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["drafted_by_source"] = dict(self.drafted_by_source)
        out["accepted_by_source"] = dict(self.accepted_by_source)
        out.update(self.model.stats())
        out["plans"] = dict(self.plans)
        out["timed_steps"] = dict(self.timed_steps)
        return out
