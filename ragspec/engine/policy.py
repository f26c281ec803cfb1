"""The decoding policy: per step, whether to verify a draft and how many of its tokens.

A verify pass over ``1 + k`` tokens costs ``r(k)`` plain steps (``r(0) = 1``); it yields one
token from the target plus the accepted draft tokens. With ``p1`` the chance that the first
drafted token is accepted and ``q`` the chance that each later one is, given that all before it
were, the expected yield is ``1 + p1 * (1 - q**k) / (1 - q)``. The policy verifies the ``k`` that
maximises yield per unit of cost, and nothing when no ``k`` beats a plain step by a margin.

Both factors are measured online: ``r(k)`` from timed target forwards (an exponential moving
average per ``k``, with a conservative prior until a ``k`` has been seen), ``p1`` and ``q`` from
the acceptance of earlier drafts with the same source kind and match length (Beta counts that
slowly forget, so the estimate follows the workload). Until a length is timed, ``r`` grows by
``prior_cost_slope`` per drafted token; docs/design.md ("Cost model") has the reasoning and the
measured costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ragspec.engine.drafting import Draft, DraftSource


class Policy(Protocol):
    """Decides how many tokens of a candidate draft to verify, and learns from the outcome."""

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

    def __post_init__(self) -> None:
        if self.k < 0 or self.min_match < 0 or self.model_k < 0:
            raise ValueError(f"k, min_match and model_k must be >= 0, got {self.k}, {self.min_match}, {self.model_k}")

    def choose(self, candidate: Draft | None) -> int:
        if candidate is None or candidate.match_length < self.min_match and candidate.source != DraftSource.ORACLE:
            return 0
        return min(self.k, len(candidate))

    def choose_model(self, max_tokens: int) -> int:
        return min(self.model_k, max_tokens)

    def record(self, draft: Draft | None, n_accepted: int, forward_seconds: float, draft_seconds: float) -> None:
        pass


@dataclass
class _Beta:
    """A success rate with a prior worth ``weight`` observations, forgetting old evidence."""

    hits: float
    trials: float

    def rate(self) -> float:
        return self.hits / self.trials

    def add(self, hits: int, trials: int, decay: float) -> None:
        self.hits = self.hits * decay + hits
        self.trials = self.trials * decay + trials


_MAX_BUCKET = 8  # match lengths of 8 and more behave alike


@dataclass
class _Acceptance:
    first: _Beta
    rest: _Beta


@dataclass
class AdaptivePolicy:
    """Cost-driven draft length from measured verify cost and running acceptance (see module doc)."""

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
    _cost: dict[int, float] = field(default_factory=dict)
    _calibrated: bool = False
    _model_token_cost: float | None = None  # seconds per draft-model token
    _since_model: int = 0  # plain steps since the draft model was last tried
    _acceptance: dict[tuple[str, int], _Acceptance] = field(default_factory=dict)

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
        self._cost.update(seconds)
        self._calibrated = True

    def measured_costs(self) -> dict[int, float]:
        """Seconds of a forward by number of drafted tokens, as measured (or calibrated) so far."""
        return dict(sorted(self._cost.items()))

    def relative_cost(self, k: int) -> float:
        """Estimated cost of verifying ``k`` drafted tokens, in plain decoding steps."""
        base = self._cost.get(0)
        if not k or base is None:
            return 1.0 + self.prior_cost_slope * k
        if k in self._cost:
            return max(self._cost[k] / base, 1.0)
        below = max((j for j in self._cost if j < k), default=0)
        above = min((j for j in self._cost if j > k), default=None)
        low = self._cost[below] / base
        if above is None:  # beyond the longest measured draft: extend with the prior slope
            return max(low + self.prior_cost_slope * (k - below), 1.0)
        high = self._cost[above] / base
        return max(low + (high - low) * (k - below) / (above - below), 1.0)

    # -- acceptance -------------------------------------------------------------------------
    def _stats(self, draft: Draft) -> _Acceptance:
        key = (_source_group(draft.source), min(draft.match_length, _MAX_BUCKET))
        stats = self._acceptance.get(key)
        if stats is None:
            # Optimistic enough to try a draft, so that real acceptance gets measured.
            p1 = min(0.3 + 0.07 * key[1], 0.85)
            stats = self._acceptance[key] = _Acceptance(_Beta(2 * p1, 2.0), _Beta(1.6, 2.0))
        return stats

    def expected_yield(self, draft: Draft, k: int) -> float:
        """Expected tokens produced by a forward that verifies ``k`` tokens of ``draft``."""
        stats = self._stats(draft)
        p1, q = stats.first.rate(), min(stats.rest.rate(), 0.999)
        return 1.0 + p1 * (1.0 - q**k) / (1.0 - q)

    # -- decisions --------------------------------------------------------------------------
    def choose(self, candidate: Draft | None) -> int:
        if candidate is None or not candidate.tokens:
            return 0
        best_k, best_gain = 0, 1.0 + self.margin
        for k in range(1, min(len(candidate), self.max_draft) + 1):
            gain = self.expected_yield(candidate, k) / self.relative_cost(k)
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k

    def choose_model(self, max_tokens: int) -> int:
        """Draft-model tokens worth drafting: expected yield per cost of drafting plus verifying."""
        if max_tokens <= 0:
            return 0
        best_k, base = 0, self._cost.get(0)
        if self._model_token_cost is not None and base is not None:
            per_token = self._model_token_cost / base
            probe = Draft((), DraftSource.MODEL)
            best_gain = 1.0 + self.margin
            for k in range(1, min(max_tokens, self.max_draft) + 1):
                gain = self.expected_yield(probe, k) / (self.relative_cost(k) + k * per_token)
                if gain > best_gain:
                    best_k, best_gain = k, gain
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
            self._model_token_cost = _smooth(self._model_token_cost, draft_seconds / k, self.cost_smoothing)
        self.record_acceptance(draft, n_accepted)

    def record_cost(self, k: int, forward_seconds: float) -> None:
        """A timed forward that verified ``k`` drafted tokens (``k = 0``: a plain step)."""
        self._cost[k] = _smooth(self._cost.get(k), forward_seconds, self.cost_smoothing)

    def record_acceptance(self, draft: Draft, n_accepted: int) -> None:
        """How many leading tokens of a verified ``draft`` the target accepted."""
        # Acceptance is learnt on the drafter's own tokens; grammar-forced tokens after them are not its doing.
        k, n_accepted = len(draft) - draft.forced, min(n_accepted, len(draft) - draft.forced)
        if k <= 0:
            return
        stats = self._stats(draft)
        stats.first.add(1 if n_accepted else 0, 1, self.decay)
        if n_accepted:
            stats.rest.add(n_accepted - 1, min(n_accepted, k - 1), self.decay)


def _smooth(old: float | None, new: float, weight: float) -> float:
    return new if old is None else old + weight * (new - old)


def _source_group(source: DraftSource) -> str:
    # Copies from fixed text (passages, prompt, earlier answers) behave alike; a model's own
    # running output and a draft model differ.
    if source in (DraftSource.PASSAGE, DraftSource.PROMPT, DraftSource.HISTORY):
        return "reference"
    return source.value
