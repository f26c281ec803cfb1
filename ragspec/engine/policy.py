"""The decoding policy: per step, whether to verify a draft and how many of its tokens.

A verify pass over ``1 + k`` tokens costs ``r(k)`` plain steps (``r(0) = 1``); it yields one
token from the target plus the accepted draft tokens. With ``p1`` the chance that the first
drafted token is accepted and ``q`` the chance that each later one is, given that all before it
were, the expected yield is ``1 + p1 * (1 - q**k) / (1 - q)``. The policy verifies the ``k`` that
maximises yield per unit of cost, and nothing when no ``k`` beats a plain step by a margin.

Both factors are measured online: ``r(k)`` from timed target forwards (a mean per ``k`` that
becomes a moving average, with a conservative prior until a ``k`` has been seen), ``p1`` and ``q`` from
the acceptance of earlier drafts with the same source kind and match length (Beta counts that
slowly forget, so the estimate follows the workload). Until a length is timed, ``r`` grows by
``prior_cost_slope`` per drafted token; docs/design.md ("Cost model") has the reasoning and the
measured costs. The curve, the statistics and the search are ``ragspec.engine.planning``'s, shared
with ragspec's proposer inside vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ragspec.engine.drafting import Draft, DraftSource
from ragspec.engine.planning import MODEL, Acceptance, CostCurve, plan, plan_sources, source_group


class Policy(Protocol):
    """Decides how many tokens of a candidate draft to verify, and learns from the outcome."""

    def expect_model(self, longest: int | None, acceptance: float | None) -> None:
        """What the draft model is known to do before it runs: at most ``longest`` tokens a step (None: as many as
        asked; a draft head guesses one), first tokens accepted at about ``acceptance`` (None: unknown).
        ``CompositeDrafter`` tells it."""
        ...

    def choose(self, candidate: Draft | None) -> int:
        """Number of leading candidate tokens to verify; 0 means no n-gram draft this step."""
        ...

    def choose_model(self, max_tokens: int) -> int:
        """When no n-gram draft was chosen: tokens to ask the draft model for (0: a plain step)."""
        ...

    def record(self, draft: Draft | None, n_accepted: int, forward_seconds: float, draft_seconds: float) -> None:
        """Outcome of one target forward that verified ``draft`` (``None`` for a plain step);
        ``draft_seconds`` is the time spent producing the draft."""
        ...

    @property
    def needs_calibration(self) -> bool:
        """True when the generator should time verify forwards for ``calibrate`` before the first request."""
        ...

    def calibrate(self, seconds: dict[int, float]) -> None:
        """Seconds of a verify forward by drafted tokens (``ragspec.decoding.calibration``); a policy
        that takes none raises ``ValueError``."""
        ...


def choose_draft(policy: Policy, candidate: Draft | None) -> Draft | None:
    """The part of ``candidate`` a decoding step verifies: its first ``policy.choose(candidate)``
    tokens, or ``None`` when the policy verifies none of it.

    The generator's step calls this between the drafter's ``propose`` and the verify forward,
    then reports the outcome with ``policy.record``; ``benchmarks/drafter_replay.py`` replays
    recorded answers through the same calls without running the model.
    """
    k = policy.choose(candidate)
    return candidate.truncated(k) if k > 0 and candidate is not None else None


@dataclass
class FixedPolicy:
    """Verify ``k`` tokens whenever the match is at least ``min_match`` long, else ``model_k``
    draft-model tokens (for comparisons and tests)."""

    k: int
    min_match: int = 1
    model_k: int = 0
    model_longest: int | None = None

    def __post_init__(self) -> None:
        if self.k < 0 or self.min_match < 0 or self.model_k < 0:
            raise ValueError(f"k, min_match and model_k must be >= 0, got {self.k}, {self.min_match}, {self.model_k}")

    def choose(self, candidate: Draft | None) -> int:
        if candidate is None or candidate.match_length < self.min_match and candidate.source != DraftSource.ORACLE:
            return 0
        return min(self.k, len(candidate))

    def choose_model(self, max_tokens: int) -> int:
        cap = self.model_k if self.model_longest is None else min(self.model_k, self.model_longest)
        return min(cap, max_tokens)

    def expect_model(self, longest: int | None, acceptance: float | None) -> None:
        self.model_longest = longest

    def record(self, draft: Draft | None, n_accepted: int, forward_seconds: float, draft_seconds: float) -> None:
        pass

    @property
    def needs_calibration(self) -> bool:
        return False

    def calibrate(self, seconds: dict[int, float]) -> None:
        raise ValueError("FixedPolicy takes no calibration (AdaptivePolicy does)")


_ONE_KIND = np.zeros(1, np.int64)

_kernels_loaded = False
"""Whether a policy of this process has run the planning kernels once (``AdaptivePolicy._load_kernels``)."""

MODEL_PRIOR_WEIGHT = 8.0
"""Observations a draft model's known acceptance (``Policy.expect_model``) is worth."""


@dataclass
class AdaptivePolicy:
    """Cost-driven draft length from measured verify cost and running acceptance (see module doc).

    The cost curve, the acceptance statistics and the search for ``k`` are ``ragspec.engine.planning``'s,
    the same that ragspec's proposer inside vLLM plans a whole batch with.
    """

    max_draft: int = 16
    margin: float = 0.03
    """Required relative gain over a plain step before a draft is verified."""
    decay: float = 0.98
    """Per-observation forgetting of acceptance counts."""
    cost_smoothing: float = 0.1
    """Weight of the newest timing in the moving averages of verify and draft-model cost."""
    explore_every: int = 64
    """Try the draft model once per this many plain steps even when it does not seem to pay."""
    prior_cost_slope: float = 0.1
    """Prior verify cost per drafted token, in plain steps, until that length has been timed."""
    model_longest: int | None = None
    """Most tokens the draft model drafts in a step (None: ``max_draft``); set by ``CompositeDrafter``."""
    _calibrated: bool = False
    _model_token_cost: float | None = None  # seconds per draft-model token
    _since_model: int = 0  # plain steps since the draft model was last tried

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {self.max_draft}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if self.explore_every < 1:
            raise ValueError(f"explore_every must be >= 1, got {self.explore_every}")
        if not 0 < self.cost_smoothing <= 1:
            raise ValueError(f"cost_smoothing must be in (0, 1], got {self.cost_smoothing}")
        self._ks = np.zeros(1, np.int64)
        global _kernels_loaded
        if not _kernels_loaded:
            _kernels_loaded = True
            self._load_kernels()
        self._reset()

    def _reset(self) -> None:
        # One request's verify cost is a calibrated profile that is really not monotone in k on a CPU.
        self.costs = CostCurve(self.prior_cost_slope, self.cost_smoothing, monotone=False)
        self.acceptance = Acceptance(self.decay)
        self._calibrated, self._model_token_cost, self._since_model = False, None, 0

    def _load_kernels(self) -> None:
        """Run every planning kernel a request runs, with the same argument types, then forget what that taught.
        numba loads a kernel's compiled code at its first call in a process (about 0.5 s for these on a 2-core
        EPYC), which otherwise lands inside the first request's first step, i.e. in its time to the first token;
        a policy is made when a model is loaded, so the load moves there."""
        self._reset()
        draft = Draft((1, 2, 3), DraftSource.PASSAGE, match_length=4)
        self.calibrate({0: 1.0, 2: 1.1})
        self.choose(draft)
        self.record(draft, 2, 1.1, 0.0)
        self.record(Draft((1,), DraftSource.MODEL), 1, 1.0, 0.1)
        self.choose(draft)
        self.choose_model(4)

    # -- cost -------------------------------------------------------------------------------
    @property
    def needs_calibration(self) -> bool:
        """True until verify costs have been measured (see ``calibrate``)."""
        return not self._calibrated

    def calibrate(self, seconds: dict[int, float]) -> None:
        """Seed the cost table with measured forward times for some draft lengths (0 included).

        Verify cost is not smooth in ``k`` on a CPU (in a profile here, verifying 1 or 2 drafted
        tokens cost more than 4, because small matrix products take a slower BLAS path), so it
        is measured rather than assumed; lengths between measured ones are interpolated.
        """
        if 0 not in seconds:
            raise ValueError("calibration needs the cost of a plain step (k=0)")
        self.costs.calibrate(seconds)
        self._calibrated = True

    # -- acceptance -------------------------------------------------------------------------
    def expected_yield(self, draft: Draft, k: int) -> float:
        """Expected tokens produced by a forward that verifies ``k`` tokens of ``draft``."""
        p1, q = self.acceptance.rates(source_group(draft.source), draft.match_length)
        return 1.0 + p1 * (1.0 - q**k) / (1.0 - q)

    # -- decisions --------------------------------------------------------------------------
    def _best_k(self, group: int, match_length: int, longest: int, per_token: float = 0.0) -> int:
        """``planning.plan`` for this one request: the ``k`` up to ``longest`` with the best expected
        tokens per cost, where each drafted token also costs ``per_token`` plain steps to draft."""
        longest = min(longest, self.max_draft)
        if longest <= 0:
            return 0
        p1, q = self.acceptance.rates(group, match_length)
        cost = self.costs.table(longest) + per_token * np.arange(longest + 1)
        plan(np.array([p1]), np.array([q]), np.array([longest]), _ONE_KIND, 1, cost, self.margin, 1, self._ks)
        return int(self._ks[0])

    def choose(self, candidate: Draft | None) -> int:
        """The candidate's tokens worth verifying; 0 also where the draft model (once measured) is
        expected to do better: ``planning.plan_sources`` decides, the rule ragspec's hybrid inside
        vLLM uses for a whole batch (``ragspec.backends.vllm.hybrid``)."""
        if candidate is None or not candidate.tokens:
            return 0
        group, longest = source_group(candidate.source), min(len(candidate), self.max_draft)
        if self._model_token_cost is None or not self.costs.has_plain:
            return self._best_k(group, candidate.match_length, longest)
        p1, q = self.acceptance.rates(group, candidate.match_length)
        model_p1, model_q = self.acceptance.rates(MODEL, 0)
        per_step = self._model_token_cost / self.costs.means[0]
        ks, from_model, model_k = np.zeros(1, np.int64), np.zeros(1, np.int64), self._model_cap(self.max_draft)
        plan_sources(np.array([p1]), np.array([q]), np.array([longest]), _ONE_KIND, 1, model_p1, model_q,
                     np.array([model_k]), self.costs.table(longest + model_k),
                     per_step * np.arange(model_k + 1), self.margin, ks, from_model)
        return 0 if from_model[0] else int(ks[0])

    def expect_model(self, longest: int | None, acceptance: float | None) -> None:
        """See ``Policy.expect_model``: ``acceptance`` replaces the draft model's prior first-token acceptance, worth
        ``MODEL_PRIOR_WEIGHT`` observations (an optimistic prior would be spent by a few unlucky first drafts: after
        two misses the default prior's 0.3 falls to 0.15, below what pays, and the model is tried again only every
        ``explore_every`` plain steps)."""
        self.model_longest = longest
        if acceptance is not None:
            self.acceptance.seed(MODEL, acceptance, MODEL_PRIOR_WEIGHT)

    def _model_cap(self, max_tokens: int) -> int:
        return max_tokens if self.model_longest is None else min(max_tokens, self.model_longest)

    def choose_model(self, max_tokens: int) -> int:
        """Draft-model tokens worth drafting: expected yield per cost of drafting plus verifying."""
        max_tokens = self._model_cap(max_tokens)
        if max_tokens <= 0:
            return 0
        best_k = 0
        if self._model_token_cost is not None and self.costs.has_plain:
            best_k = self._best_k(MODEL, 0, max_tokens, self._model_token_cost / self.costs.means[0])
        self._since_model = 0 if best_k else self._since_model + 1
        if best_k == 0 and (self._model_token_cost is None or self._since_model >= self.explore_every):
            self._since_model = 0
            return 1  # measure (again): its cost and acceptance may have changed
        return best_k

    def record(self, draft: Draft | None, n_accepted: int, forward_seconds: float, draft_seconds: float) -> None:
        k = 0 if draft is None else len(draft)
        self.record_cost(k, forward_seconds)
        if draft is None or k == 0:
            return
        if draft.source == DraftSource.MODEL:
            per_token = draft_seconds / k
            old = self._model_token_cost
            self._model_token_cost = per_token if old is None else old + self.cost_smoothing * (per_token - old)
        self.record_acceptance(draft, n_accepted)

    def record_cost(self, k: int, forward_seconds: float) -> None:
        """A timed forward that verified ``k`` drafted tokens (``k = 0``: a plain step)."""
        self.costs.record(k, forward_seconds)

    def record_acceptance(self, draft: Draft, n_accepted: int) -> None:
        """How many leading tokens of a verified ``draft`` the target accepted."""
        # Acceptance is learnt on the drafter's own tokens; grammar-forced tokens after them are not its doing.
        k = len(draft) - draft.forced
        self.acceptance.record(source_group(draft.source), draft.match_length, k, min(n_accepted, k))
