"""Planning drafts: the one cost curve and the one search for how many drafted tokens pay.

Both drafting engines plan with what is here: ``ragspec.engine.policy.AdaptivePolicy`` (one request,
one verify forward per step) and ragspec's proposer inside vLLM (``ragspec.backends.vllm.proposer``,
a whole batch per step).

**Cost.** ``CostCurve`` holds timed steps by the number of drafted tokens they carried and answers
``relative(d)``: a step carrying ``d`` drafted tokens in plain steps (``d = 0``). Each timing is
averaged into its cell (a plain mean over the first ``1 / smoothing`` timings, then a moving
average of that weight); between timed lengths the curve is interpolated, beyond the longest it
grows by ``prior_slope`` per token, and it never falls below a plain step. Until the plain step is
timed it is the prior ``1 + prior_slope * d``. With ``monotone`` the cells are first fitted by the
closest non-decreasing curve (weighted isotonic regression): whole-batch step times are noisy
(other requests' prefills, contexts of other lengths) and a step that carries more tokens does no
less work, so one outlier moves its neighbours a little instead of ruling the choice. Without it
the cells are taken as they are: one request's verify cost on a CPU is a calibrated profile that
is really not monotone (small matrix products take a slower BLAS path; ``AdaptivePolicy.calibrate``).

**Acceptance.** ``Acceptance`` keeps, per source group and match-length bucket, the chance ``p1``
that a draft's first token is accepted and ``q`` that each later one is, given all before it were
(Beta counts that slowly forget). A ``k``-token draft then yields ``1 + p1 (1 - q^k) / (1 - q)``
tokens, so its ``j``-th token adds ``p1 q^(j-1)``: each row's gains shrink with ``j``.

**Search.** ``plan`` chooses every row's draft length at once: for a total of ``D`` drafted tokens
the best allocation takes the ``D`` largest gains over all rows (they shrink along each row, so
each row gets a prefix), and the step's expected tokens per unit of cost is ``(rows + those
gains) / c(D)``; ``plan`` takes the ``D`` with the highest rate, and drafts nothing unless it beats
the plain step by ``margin``. For one row this is the ``k`` that maximises expected yield over
``r(k)``, the classic choice. It is compiled with numba where the ``compiled`` extra is installed
(``ragspec.engine.jit``; ``ragspec.engine.ngram_batch`` says why numba) so that planning a batch of
256 requests costs microseconds; without it the same functions run in Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from ragspec.engine.jit import njit

if TYPE_CHECKING:
    from ragspec.engine.drafting import DraftSource

MAX_BUCKET = 8
"""Match lengths of 8 tokens and more behave alike: the acceptance statistics' last bucket."""
GROUPS = ("reference", "output", "model", "oracle", "grammar")
"""Source groups with acceptance statistics of their own (copies of fixed text behave alike)."""
REFERENCE, OUTPUT, MODEL = 0, 1, 2
MAX_Q = 0.999
"""The later-token acceptance is capped below 1, so that a yield stays finite."""


def source_group(source: DraftSource) -> int:
    """The acceptance group of a draft source: copies of fixed text (passages, the prompt, earlier
    answers) behave alike; a model's own running output and a draft model differ."""
    value = source.value
    if value in ("passage", "prompt", "history"):
        return REFERENCE
    return GROUPS.index(value)


def bucket(match_length: int) -> int:
    return min(match_length, MAX_BUCKET)


class Acceptance:
    """Acceptance statistics by source group and match-length bucket (see the module docstring).

    ``counts[0] / counts[1]`` is ``p1`` and ``counts[2] / counts[3]`` is ``q`` (hits over trials of
    the first and of the later drafted tokens), each cell ``[group, bucket]``. Each starts from a
    prior worth two observations, optimistic enough that a draft is tried and its real acceptance
    measured (``p1`` from 0.3, plus 0.07 per matched token, up to 0.85; ``q`` 0.8). Every
    observation first multiplies a cell's counts by ``decay``, so estimates follow the workload.
    """

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.counts = np.empty((4, len(GROUPS), MAX_BUCKET + 1))
        self.counts[0] = 2.0 * np.minimum(0.3 + 0.07 * np.arange(MAX_BUCKET + 1), 0.85)
        self.counts[1], self.counts[2], self.counts[3] = 2.0, 1.6, 2.0

    def seed(self, group: int, p1: float, weight: float) -> None:
        """Start ``group``'s first-token acceptance from ``p1``, worth ``weight`` observations, at every match length."""
        if not 0 <= p1 <= 1 or weight <= 0:
            raise ValueError(f"a prior acceptance must be in [0, 1] with a positive weight, got {p1} and {weight}")
        self.counts[0, group], self.counts[1, group] = p1 * weight, weight

    def rates(self, group: int, match_length: int) -> tuple[float, float]:
        """``(p1, q)`` for a draft of this group and match length."""
        b = bucket(match_length)
        c = self.counts
        return float(c[0, group, b] / c[1, group, b]), float(min(c[2, group, b] / c[3, group, b], MAX_Q))

    def record(self, group: int, match_length: int, drafted: int, accepted: int) -> None:
        """``accepted`` leading tokens of a verified ``drafted``-token draft were kept."""
        record_acceptance(self.counts, self.decay, group, bucket(match_length), drafted, accepted)


@njit(cache=True, nogil=True)
def record_acceptance(counts, decay, group, b, drafted, accepted):  # type: ignore[no-untyped-def]
    """One observation into ``Acceptance.counts`` (compiled: kernels record a batch's in a loop)."""
    if drafted <= 0:
        return
    accepted = min(accepted, drafted)
    counts[0, group, b] = counts[0, group, b] * decay + (1.0 if accepted else 0.0)
    counts[1, group, b] = counts[1, group, b] * decay + 1.0
    if accepted:
        counts[2, group, b] = counts[2, group, b] * decay + (accepted - 1)
        counts[3, group, b] = counts[3, group, b] * decay + min(accepted, drafted - 1)


@njit(cache=True, nogil=True)
def rates(counts, group, b):  # type: ignore[no-untyped-def]
    """``(p1, q)`` of a cell of ``Acceptance.counts`` (compiled)."""
    return counts[0, group, b] / counts[1, group, b], min(counts[2, group, b] / counts[3, group, b], MAX_Q)


class CostCurve:
    """A step's cost by the drafted tokens it carries, from timings (see the module docstring)."""

    def __init__(self, prior_slope: float = 0.1, smoothing: float = 0.1, monotone: bool = False) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"cost smoothing must be in (0, 1], got {smoothing}")
        self.prior_slope, self.smoothing, self.monotone = prior_slope, smoothing, monotone
        self.means = np.zeros(17)
        self.weights = np.zeros(17)  # 0: that length never timed

    def _room(self, drafted: int) -> None:
        if drafted >= len(self.means):
            size = max(drafted + 1, 2 * len(self.means))
            self.means = np.concatenate([self.means, np.zeros(size - len(self.means))])
            self.weights = np.concatenate([self.weights, np.zeros(size - len(self.weights))])

    def record(self, drafted: int, seconds: float) -> None:
        """One timed step that carried ``drafted`` drafted tokens."""
        if drafted >= len(self.means):
            self._room(drafted)
        weight = min(self.weights[drafted] + 1.0, 1.0 / self.smoothing)
        self.weights[drafted] = weight
        self.means[drafted] += (seconds - self.means[drafted]) / weight

    def calibrate(self, seconds: dict[int, float]) -> None:
        """Set timed cells outright (a calibration's measured forwards)."""
        for drafted, s in seconds.items():
            self._room(drafted)
            self.means[drafted], self.weights[drafted] = s, max(self.weights[drafted], 1.0)

    @property
    def has_plain(self) -> bool:
        return bool(self.weights[0] > 0)

    def measured(self) -> dict[int, float]:
        """Mean seconds by drafted tokens, of the lengths timed so far."""
        return {int(d): float(self.means[d]) for d in np.flatnonzero(self.weights)}

    def timings(self) -> dict[int, float]:
        """How many timings each cell holds (capped at ``1 / smoothing``)."""
        return {int(d): float(self.weights[d]) for d in np.flatnonzero(self.weights)}

    def fitted(self) -> dict[int, float]:
        """Seconds by drafted tokens as the curve uses them (isotonic fit when ``monotone``)."""
        fit = np.zeros(len(self.means))
        _fit(self.means, self.weights, self.monotone, fit)
        return {int(d): float(fit[d]) for d in np.flatnonzero(self.weights)}

    def table(self, longest: int) -> np.ndarray:
        """``relative(d)`` for every ``d`` from 0 to ``longest``."""
        out = np.empty(longest + 1)
        relative_table(self.means, self.weights, self.monotone, self.prior_slope, out)
        return out

    def relative(self, drafted: int) -> float:
        """A step carrying ``drafted`` drafted tokens, in plain steps."""
        return float(self.table(drafted)[drafted])


@njit(cache=True, nogil=True)
def _fit(means, weights, monotone, out):  # type: ignore[no-untyped-def]
    """``out[d]`` for every timed ``d``: the cell's mean, or its weighted isotonic (pool adjacent
    violators) fit when ``monotone``. Returns how many cells are timed."""
    n = 0
    for d in range(len(means)):
        if weights[d] > 0:
            n += 1
    if not monotone:
        for d in range(len(means)):
            out[d] = means[d]
        return n
    sums = np.empty(n)
    wsum = np.empty(n)
    first = np.empty(n, np.int64)  # the block's first cell, by order among the timed ones
    cells = np.empty(n, np.int64)
    blocks = 0
    i = 0
    for d in range(len(means)):
        if weights[d] <= 0:
            continue
        cells[i] = d
        sums[blocks], wsum[blocks], first[blocks] = means[d] * weights[d], weights[d], i
        blocks += 1
        while blocks > 1 and sums[blocks - 2] / wsum[blocks - 2] > sums[blocks - 1] / wsum[blocks - 1]:
            sums[blocks - 2] += sums[blocks - 1]
            wsum[blocks - 2] += wsum[blocks - 1]
            blocks -= 1
        i += 1
    for b in range(blocks):
        end = first[b + 1] if b + 1 < blocks else n
        for j in range(first[b], end):
            out[cells[j]] = sums[b] / wsum[b]
    return n


@njit(cache=True, nogil=True)
def relative_table(means, weights, monotone, prior_slope, out):  # type: ignore[no-untyped-def]
    """``out[d]``: ``CostCurve.relative(d)`` of a curve's cells (compiled)."""
    fit = np.empty(len(means))
    _fit(means, weights, monotone, fit)
    if weights[0] <= 0:
        for d in range(len(out)):
            out[d] = 1.0 + prior_slope * d
        return
    base = fit[0]
    below = 0  # the longest timed length <= d
    above = 1  # the next timed length after ``below`` (len(means): none)
    while above < len(means) and weights[above] <= 0:
        above += 1
    out[0] = 1.0
    for d in range(1, len(out)):
        if above < len(means) and d >= above:
            below = above
            above += 1
            while above < len(means) and weights[above] <= 0:
                above += 1
        if d == below:
            value = fit[d] / base
        elif above >= len(means):
            value = fit[below] / base + prior_slope * (d - below)
        else:
            low, high = fit[below], fit[above]
            value = (low + (high - low) * (d - below) / (above - below)) / base
        out[d] = max(value, 1.0)


@njit(cache=True, nogil=True)
def plan(p1, q, lengths, kinds, n_kinds, cost, margin, rows, ks):  # type: ignore[no-untyped-def]
    """Every row's draft length, written into ``ks`` (see the module docstring).

    Row ``i`` may draft up to ``lengths[i]`` tokens (0: none) with acceptance ``p1[i]``, ``q[i]``;
    rows of the same ``kinds[i]`` (below ``n_kinds``) must have the same ``p1`` and ``q``, so the
    search sorts one gain per kind and length, not one per row and length. ``cost[D]`` is the
    step's cost with ``D`` drafted tokens in all (``cost[0]``: a step of ``rows`` plain tokens;
    ``len(cost)`` > the sum of ``lengths``). Equal gains go to the earlier rows. Returns the
    drafted total.
    """
    longest = 0
    for i in range(len(lengths)):
        ks[i] = 0
        longest = max(longest, lengths[i])
    if longest <= 0:
        return 0
    # count[g, k]: rows of kind g that may draft a k-th token.
    count = np.zeros((n_kinds, longest + 2), np.int64)
    kp1 = np.zeros(n_kinds)
    kq = np.zeros(n_kinds)
    for i in range(len(lengths)):
        if lengths[i] > 0:
            count[kinds[i], lengths[i]] += 1
            kp1[kinds[i]], kq[kinds[i]] = p1[i], q[i]
    n_entries = 0
    for g in range(n_kinds):
        for k in range(longest - 1, 0, -1):
            count[g, k] += count[g, k + 1]
        for k in range(1, longest + 1):
            if count[g, k]:
                n_entries += 1
    gains = np.empty(n_entries)
    entry_kind = np.empty(n_entries, np.int64)
    entry_k = np.empty(n_entries, np.int64)
    j = 0
    for g in range(n_kinds):  # by kind, then k ascending: a stable sort keeps each kind's equal gains in k order
        y_prev, qk = 1.0, 1.0
        for k in range(1, longest + 1):
            if not count[g, k]:
                break
            qk *= kq[g]
            y = 1.0 + kp1[g] * (1.0 - qk) / (1.0 - kq[g])
            gains[j], entry_kind[j], entry_k[j] = y - y_prev, g, k  # the k-th token's gain: p1 q^(k-1)
            y_prev = y
            j += 1
    order = np.argsort(-gains, kind="mergesort")
    best_rate = (1.0 + margin) * rows / cost[0]
    best_entry, best_take = -1, 0
    expected, d = float(rows), 0
    for e in range(n_entries):
        entry = order[e]
        for m in range(1, count[entry_kind[entry], entry_k[entry]] + 1):
            expected += gains[entry]
            d += 1
            rate = expected / cost[d]
            if rate > best_rate:
                best_rate, best_entry, best_take = rate, e, m
    if best_entry < 0:
        return 0
    full = np.zeros(n_kinds, np.int64)  # each kind's tokens taken for every row that may draft them
    for e in range(best_entry):
        full[entry_kind[order[e]]] = max(full[entry_kind[order[e]]], entry_k[order[e]])
    last = order[best_entry]
    g_last, k_last = entry_kind[last], entry_k[last]
    if best_take == count[g_last, k_last]:
        full[g_last] = max(full[g_last], k_last)
        best_take = 0
    drafted = 0
    for i in range(len(lengths)):
        if lengths[i] > 0:
            ks[i] = min(lengths[i], full[kinds[i]])
            if best_take and kinds[i] == g_last and lengths[i] >= k_last:
                ks[i] = k_last
                best_take -= 1
            drafted += ks[i]
    return drafted


@njit(cache=True, nogil=True)
def plan_sources(p1, q, lengths, kinds, n_kinds, model_p1, model_q, model_caps, cost, model_cost, margin, ks, from_model):  # type: ignore[no-untyped-def]
    """``plan`` with a draft model beside the n-gram drafts: every row's source and draft length,
    and how many draft-model steps the batch runs. Returns ``(drafted, model_steps)``.

    Row ``i`` has an n-gram candidate of ``lengths[i]`` tokens (0: none) of ``kinds[i]`` (below
    ``n_kinds``) with acceptance ``p1[i]``, ``q[i]``, and may take up to ``model_caps[i]`` tokens
    of the draft model's (0: not), whose acceptance is ``model_p1``, ``model_q`` for every row. The
    draft model drafts for the whole batch at once, ``j`` tokens in ``j`` of its steps, which cost
    ``model_cost[j]`` plain steps of the batch (``model_cost[0] = 0``); verifying ``D`` drafted
    tokens costs ``cost[D]`` (as in ``plan``; ``len(cost)`` > the sum of the rows' longest drafts).

    For each ``j``, a row takes the source whose whole draft yields more (the n-gram draft on
    ties: it costs nothing to make), ``plan`` chooses the lengths, and the step's expected tokens
    over ``cost[D] + model_cost[j]`` is compared: the best ``j`` wins, and nothing is drafted
    unless it beats a plain step by ``margin``. So where the n-gram drafts are long and likely
    they win and the batch does not pay for the model; where nothing matches the model fills in;
    where neither pays, nothing is drafted. ``ks[i]`` gets the row's length and ``from_model[i]``
    whether it is the model's draft.
    """
    rows = len(lengths)
    longest_model = 0
    for i in range(rows):
        ks[i], from_model[i] = 0, 0
        longest_model = max(longest_model, model_caps[i])
    longest_model = min(longest_model, len(model_cost) - 1)
    rp1 = np.empty(rows)
    rq = np.empty(rows)
    rlen = np.zeros(rows, np.int64)
    rkind = np.zeros(rows, np.int64)
    tks = np.zeros(rows, np.int64)
    best_rate = (1.0 + margin) * rows / cost[0]
    found = False
    for j in range(longest_model + 1):
        for i in range(rows):
            rp1[i], rq[i], rlen[i], rkind[i] = p1[i], q[i], lengths[i], kinds[i]
            m = min(j, model_caps[i])
            if m > 0:
                ng = 0.0 if lengths[i] <= 0 else p1[i] * (1.0 - q[i] ** lengths[i]) / (1.0 - q[i])
                if model_p1 * (1.0 - model_q**m) / (1.0 - model_q) > ng:
                    rp1[i], rq[i], rlen[i], rkind[i] = model_p1, model_q, m, n_kinds
        step = cost + model_cost[j]
        drafted = plan(rp1, rq, rlen, rkind, n_kinds + 1, step, margin, rows, tks)
        expected = float(rows)
        for i in range(rows):
            if tks[i] > 0:
                expected += rp1[i] * (1.0 - rq[i] ** tks[i]) / (1.0 - rq[i])
        rate = expected / step[drafted]
        if drafted > 0 and rate > best_rate:
            best_rate, found = rate, True
            for i in range(rows):
                ks[i], from_model[i] = tks[i], 1 if tks[i] > 0 and rkind[i] == n_kinds else 0
    if not found:
        return 0, 0
    total, steps = 0, 0
    for i in range(rows):
        total += ks[i]
        if from_model[i]:
            steps = max(steps, ks[i])
    return total, steps
