"""The draft model's bookkeeping in the hybrid (``HybridDrafter.model``): what its work costs, when a
model the plan never chooses is tried again, whether it runs on a step at all, which requests lost it,
and its counters. ``HybridDrafter`` decides each row's draft; this holds what it knows of the model.

- Cost: ``seconds`` times the model's work by its number of steps (0: the catch-up forward alone);
  ``steps_cost`` turns it into plain steps of the batch, a forward per step.
- Tries: ``explore_interval`` steps apart, doubled by each try the plan does not follow
  (``backoff``, up to ``EXPLORE_BACKOFF`` times the policy's ``explore_every``), back to
  ``explore_every`` once the plan chooses the model (``chosen``).
- Running: ``decide_catch_up`` sets ``catch_up``; a step it does not run holes the cache of every
  request in the batch (``holes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ragspec.engine.planning import CostCurve
from ragspec.engine.policy import AdaptivePolicy

MODEL_IDLE_STEPS = 8
"""Steps the draft model keeps catching up after its drafts last earned tokens (``decide_catch_up``)."""
EXPLORE_WAIT_STEPS = 2
"""Steps an exploration due waits, the model running, for a new request to draft nothing (then it
is tried on it); after that the next try is the backed-off interval away (``EXPLORE_BACKOFF``)."""
EXPLORE_BACKOFF = 32
"""Each try of the model that the plan does not follow (its drafts were never chosen before the next
try fell due) doubles the steps to the next one, from ``policy.explore_every`` up to this many times
it: 64, 128, 256, ... 2048 steps by default. A step whose plan chooses the model resets it."""
MODEL_PRIOR_SLOPE = 0.5
"""Prior cost of one draft-model forward in plain steps of the batch, until timed."""


class DraftModelState:
    """The hybrid's draft model: its cost, its tries and back-off, whether it runs, its holes, its counters."""

    def __init__(self, policy: AdaptivePolicy, smoothing: float) -> None:
        """``policy``: the drafter's, whose ``explore_every`` steps separate tries before any back-off;
        ``smoothing``: that of the step costs, for ``seconds``."""
        self.policy = policy
        self.seconds = CostCurve(MODEL_PRIOR_SLOPE, smoothing, monotone=True)
        self.catch_up = True  # whether the model runs this step
        self.holes: set[str] = set()  # requests in the batch whose draft-model KV cache has holes
        self.steps_run = 0
        self.forwards = 0  # steps on which the draft model ran (catch-up, maybe drafting)
        self.idle_forwards = 0  # of those, steps on which no row took the model's draft
        self.tokens = 0  # tokens the model's forwards took in (prompts, catch-ups, its drafting steps)
        self.explorations = 0  # tries of the model, and tries that found no row to try it on
        self.skipped_catch_ups = 0
        self.inputs_prepared = 0  # steps on which vLLM prepared the model's inputs (its next tokens, metadata)
        self.explore_interval = policy.explore_every  # steps from one try of the model to the next
        self.since_tried = policy.explore_every  # steps since last tried or chosen (the first chance measures it)
        self.idle = MODEL_IDLE_STEPS  # steps since the model's drafts last earned tokens
        self.waited = 0  # steps an exploration has waited for a row to try the model on

    def whole_for_none(self, ids: Sequence[str]) -> bool:
        """Forgets the holes of requests that left the batch (``ids``); whether every one still in it has one."""
        if self.holes:
            self.holes.intersection_update(ids)
        return self.holes.issuperset(ids)

    def chosen(self) -> None:
        """The plan chose the model: it pays, so it is tried again soon once left."""
        self.since_tried = 0
        self.explore_interval = self.policy.explore_every

    def try_due(self) -> bool:
        """Counts a step without the model; whether a try of it is due (``explore_interval`` reached)."""
        self.since_tried += 1
        return self.since_tried >= self.explore_interval

    def backoff(self) -> None:
        """A try of the model: the next is ``explore_interval`` steps away, twice as far as this one
        (up to ``EXPLORE_BACKOFF`` times ``policy.explore_every``) unless the plan chooses the model in between
        (``chosen``)."""
        self.explorations += 1
        self.since_tried = 0
        self.explore_interval = min(2 * self.explore_interval, EXPLORE_BACKOFF * self.policy.explore_every)

    def sit_out(self) -> None:
        """A step whose rows are all holed: the model could draft for none of them and does not run. An
        exploration waiting for a row to try it on ends untried: a try, backed off."""
        self.since_tried += 1
        if self.waited:
            self.backoff()
            self.waited = 0
        self.catch_up = False
        self.skipped_catch_ups += 1

    def decide_catch_up(self, steps: int, ids: Sequence[str]) -> None:
        """Whether the draft model runs this step at all (``catch_up``), ``steps`` its planned draft
        steps. Its first forward over the step's tokens keeps its KV cache whole, and costs a draft
        forward; a step whose rows take no model draft pays it only to keep the model usable: for
        ``MODEL_IDLE_STEPS`` steps after its drafts last earned tokens (some were kept), or while an
        exploration is due (new requests enter its cache, to be tried on; ``EXPLORE_WAIT_STEPS``).
        Otherwise the model does not run, and every request in the batch (``ids``) loses it for good
        (``holes``: its cache misses this step's tokens); later requests start whole."""
        due = self.since_tried >= self.explore_interval
        if steps:
            self.waited = 0
        elif due:  # the model runs for a row to try it on (some row is whole)
            self.waited += 1
            if self.waited > EXPLORE_WAIT_STEPS:  # none came that drafts nothing: a try, backed off
                self.backoff()
                self.waited, due = 0, False
        self.catch_up = steps > 0 or self.idle < MODEL_IDLE_STEPS or due
        if not self.catch_up:
            self.holes.update(ids)  # the step's tokens never reach the model's cache
            self.skipped_catch_ups += 1

    def steps_cost(self, plain: CostCurve, longest: int) -> np.ndarray:
        """``[j]``: the draft model's work for ``j`` steps, ``j`` forwards (its first forward, over the
        step's tokens, drafts the first token), in plain steps of the batch whose step costs ``plain``
        times; until timed, ``MODEL_PRIOR_SLOPE`` per step. The first forward is charged to the model
        even when it would run anyway (keeping the model usable): so a model whose drafts do not pay
        for their whole forward work is never chosen, and its forwards stop."""
        steps = np.arange(longest + 1, dtype=np.float64)
        timed = self.seconds.measured()
        if not timed or not plain.has_plain:
            return MODEL_PRIOR_SLOPE * steps
        weights = self.seconds.timings()
        forward = sum(weights[j] * s / max(j, 1) for j, s in timed.items()) / sum(weights.values())
        return steps * (forward / plain.fitted()[0])

    def record(self, steps: int, seconds: float, tokens: int, rows: int, decode_only: bool) -> None:
        """The model ran: ``steps`` draft steps (0: catch-up only) in ``seconds`` for a batch of ``rows``,
        its first forward over ``tokens`` tokens; timed into ``seconds`` when ``decode_only`` (every
        row decoding: a prompt's catch-up is a prefill, not a step's)."""
        if decode_only:
            self.seconds.record(steps, seconds)
        self.steps_run += steps
        self.forwards += 1
        self.idle_forwards += steps == 0
        self.tokens += tokens + rows * max(steps - 1, 0)

    def stats(self) -> dict[str, Any]:
        """The model's part of ``HybridDrafter.stats``."""
        return {
            "model_seconds_by_steps": {str(j): s for j, s in self.seconds.measured().items()},
            "model_steps": self.steps_run,
            "model_forwards": self.forwards,
            "idle_model_forwards": self.idle_forwards,
            "model_tokens": self.tokens,
            "explorations": self.explorations,
            "explore_interval": self.explore_interval,
            "skipped_catch_ups": self.skipped_catch_ups,
            "model_inputs_prepared": self.inputs_prepared,
        }
