"""ragspec's drafting inside vLLM: a proposer for vLLM's ``custom_class`` speculative method.

Started by vLLM with ``--speculative-config '{"method": "custom_class", "model":
"ragspec.backends.vllm.proposer.RagspecProposer", "num_speculative_tokens": K}'`` (``ragspec serve --engine
vllm`` does that, see ``ragspec.backends.vllm.server``). Every engine step vLLM's model runner calls
``propose`` with the whole batch; vLLM's rejection sampler then verifies the drafts, so the output
is what vLLM gives without speculation (greedy: the same tokens; sampling: the same distribution).

What runs here is ragspec's own drafting, per request of the batch:

- ``ragspec.engine.ngram.NgramDrafter`` over the request's running context (its prompt, where the
  retrieved passages are, and its output), indexed once when the request appears and extended by
  the tokens each step accepted, never rescanned; plus one bounded ``AnswerHistory`` of earlier
  answers shared by all requests. Passage boundaries are not separate sources here: the passages
  are in the prompt, so the context's automaton finds the same matches, and vLLM keeps no
  per-passage statistics to report them in.
- ``ragspec.engine.policy.AdaptivePolicy``'s acceptance model (by source and match length, learnt from
  how many drafted tokens each step kept), and step costs timed here (``StepCosts``: the interval
  between two calls of ``propose`` whose batches were the same requests in decode, kept per batch
  size and drafted tokens). ``plan_batch`` adds drafts while they raise the expected tokens per
  second of the whole step, so under a full batch (where verification is no longer free) and
  where drafts do not pay, the proposer proposes nothing.

State is kept by request id (the model runner's batch rows move when requests end or are
reordered), created when a request first shows a sampled token, and dropped, its answer handed to
the history, when the id leaves the batch; so memory is bounded by the batch size plus the history.

This module runs inside vLLM's worker process, in vLLM's own environment, with ragspec's source
on ``PYTHONPATH``: it imports only the standard library, numpy, and ragspec's drafting modules.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragspec.engine.drafting import Draft
from ragspec.engine.ngram import AnswerHistory, NgramDrafter
from ragspec.engine.policy import AdaptivePolicy

PROPOSER_CLASS = "ragspec.backends.vllm.proposer.RagspecProposer"
"""The value of ``speculative_config["model"]`` that loads this proposer."""
STATS_ENV = "RAGSPEC_PROPOSER_STATS"
"""When set, the proposer writes its statistics (JSON) to this file whenever a request ends."""
HISTORY_ENV = "RAGSPEC_PROPOSER_HISTORY_TOKENS"
MIN_MATCH_ENV = "RAGSPEC_PROPOSER_MIN_MATCH"
DEFAULT_HISTORY_TOKENS = 2048
DEFAULT_MIN_MATCH = 1


@dataclass
class _Request:
    drafter: NgramDrafter
    tokens: list[int]
    prompt_len: int
    draft: Draft | None = None  # proposed at the last step: what this step verified


def plan_batch(
    policy: AdaptivePolicy, candidates: Sequence[Draft | None], step_cost: Callable[[int], float] | None = None
) -> list[int]:
    """How many tokens of each candidate draft one step of the batch verifies.

    ``step_cost(d)`` is the cost of this batch's step when it carries ``d`` drafted tokens besides
    one token per request (any unit: only ratios matter); by default ``policy.relative_cost(rows -
    1 + d)``, a step of ``T`` tokens in plain one-token steps (so for a single request this is
    ``AdaptivePolicy.choose``). Requests are taken by the chance of their first drafted token, and a
    draft is added when the step's expected tokens per unit of cost rise by more than the policy's
    margin. ``None`` or empty candidates verify nothing.
    """
    rows = len(candidates)
    cost = step_cost if step_cost is not None else (lambda d: policy.relative_cost(rows - 1 + d))
    ks = [0] * rows
    expected, drafted = float(rows), 0
    live = [i for i, c in enumerate(candidates) if c is not None and c.tokens]
    for i in sorted(live, key=lambda i: -policy.expected_yield(candidates[i], 1)):  # type: ignore[arg-type]
        candidate = candidates[i]
        assert candidate is not None
        best_k = 0
        best_rate = (1.0 + policy.margin) * expected / cost(drafted)
        for k in range(1, min(len(candidate), policy.max_draft) + 1):
            rate = (expected + policy.expected_yield(candidate, k) - 1.0) / cost(drafted + k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k:
            ks[i] = best_k
            expected += policy.expected_yield(candidate, best_k) - 1.0
            drafted += best_k
    return ks


class StepCosts:
    """Seconds of one engine step, by the batch's size and the drafted tokens it carried.

    Kept per batch size because a row costs far more than a drafted token: each row reads its own
    context's keys and values, while a drafted token reuses its row's. ``relative(rows, d)`` is
    then the step's cost in plain steps of a batch of that size. Each timing is averaged into its
    (size, drafted) cell (a plain mean over the first ``1 / smoothing`` timings, then a moving
    average). Step times are noisy (other requests' prefills, contexts of other lengths), and a
    step that carries more tokens does no less work, so the cells of a size are fitted by the
    closest non-decreasing curve (isotonic regression, weighted by how often each cell was timed):
    one slow or fast outlier then moves its neighbours a little instead of ruling the choice.
    Between timed lengths the curve is interpolated; beyond the longest it grows by ``prior_slope``
    per token. A size whose plain step is untimed gets no drafts (``measured``), and the plain step
    is timed again every ``replain_every`` steps of a size, as its contexts grow.
    """

    def __init__(self, prior_slope: float = 0.1, smoothing: float = 0.1, replain_every: int = 64) -> None:
        self.prior_slope, self.smoothing, self.replain_every = prior_slope, smoothing, replain_every
        self.cells: dict[int, dict[int, tuple[float, float]]] = {}  # rows -> drafted -> (mean s, weight)
        self._since_plain: dict[int, int] = {}

    def record(self, rows: int, drafted: int, seconds: float) -> None:
        table = self.cells.setdefault(rows, {})
        mean, weight = table.get(drafted, (0.0, 0.0))
        weight = min(weight + 1.0, 1.0 / self.smoothing)
        table[drafted] = (mean + (seconds - mean) / weight, weight)
        self._since_plain[rows] = 0 if drafted == 0 else self._since_plain.get(rows, 0) + 1

    def measured(self, rows: int) -> bool:
        """Whether drafts may be planned for this batch size (its plain step is timed and recent)."""
        return 0 in self.cells.get(rows, {}) and self._since_plain.get(rows, 0) < self.replain_every

    def fitted(self, rows: int) -> dict[int, float]:
        """Seconds by drafted tokens for this size: the weighted isotonic fit of its cells."""
        blocks: list[list[Any]] = []  # [weighted sum, weight, drafted lengths], means non-decreasing
        for drafted, (mean, weight) in sorted(self.cells.get(rows, {}).items()):
            blocks.append([mean * weight, weight, [drafted]])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, weight, lengths = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += weight
                blocks[-1][2] += lengths
        return {d: total / weight for total, weight, lengths in blocks for d in lengths}

    def relative(self, rows: int, drafted: int) -> float:
        curve = self.fitted(rows)
        base = curve.get(0)
        if base is None or drafted == 0:
            return 1.0 + self.prior_slope * drafted
        below = max(d for d in curve if d <= drafted)
        above = min((d for d in curve if d > drafted), default=None)
        if above is None:
            return max(curve[below] / base + self.prior_slope * (drafted - below), 1.0)
        low, high = curve[below], curve[above]
        return max((low + (high - low) * (drafted - below) / (above - below)) / base, 1.0)


class BatchDrafter:
    """ragspec's drafter and policy for a batch of requests that an engine steps together.

    ``step`` takes what vLLM's model runner has after a step: each row's request id, the tokens it
    sampled this step (none while its prompt is still being prefilled), its token count and its
    token ids; it returns each row's draft for the next step. ``costs`` (timed here by default) and
    ``clock`` are injectable for tests.
    """

    def __init__(
        self,
        max_draft: int,
        *,
        max_model_len: int,
        history_tokens: int = DEFAULT_HISTORY_TOKENS,
        min_match: int = DEFAULT_MIN_MATCH,
        policy: AdaptivePolicy | None = None,
        costs: StepCosts | None = None,
        clock: Any = time.perf_counter,
    ) -> None:
        if max_draft < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {max_draft}")
        self.max_draft = max_draft
        self.max_model_len = max_model_len
        self.min_match = min_match
        self.history = AnswerHistory(history_tokens)
        self.policy = policy if policy is not None else AdaptivePolicy(max_draft=max_draft)
        self.costs = costs if costs is not None else StepCosts(prior_slope=self.policy.prior_cost_slope)
        self.clock = clock
        self.requests: dict[str, _Request] = {}
        self.requests_seen = 0
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self._last_ids: tuple[str, ...] = ()
        self._last_drafted = 0  # drafted tokens the last planned step carries
        self._last_time: float | None = None

    def step(
        self,
        req_ids: Sequence[str],
        sampled: Sequence[Sequence[int]],
        num_tokens: Sequence[int] | np.ndarray,
        token_ids: np.ndarray,
        seeded_rows: Collection[int] = (),
    ) -> list[list[int]]:
        """Each row's draft for the next step. Rows in ``seeded_rows`` (requests sampled with a
        seed) get none: vLLM's rejection sampler draws its random numbers per drafted token, so
        drafts that depend on timing and on other requests would make a seeded sample differ
        from run to run; without drafts it is the sample vLLM gives without speculation."""
        now = self.clock()
        rows = len(sampled)
        ids = tuple(req_ids[:rows])
        self._finish_absent(set(ids))
        steady = ids == self._last_ids and all(sampled)
        if steady and self._last_time is not None and now > self._last_time:
            # The step just verified what the last call planned: time it by its size and drafts.
            self.costs.record(rows, self._last_drafted, now - self._last_time)
        candidates: list[Draft | None] = []
        for i, (rid, new, n) in enumerate(zip(ids, sampled, num_tokens)):
            n = int(n)
            if not new or n >= self.max_model_len:
                candidates.append(None)
                continue
            request = self._sync(rid, len(new), n, token_ids[i])
            room = 0 if i in seeded_rows else min(self.max_draft, self.max_model_len - n - 1)
            candidates.append(request.drafter.propose(request.tokens, room))
        ks = (plan_batch(self.policy, candidates, lambda d: self.costs.relative(rows, d))
              if self.costs.measured(rows) else [0] * rows)
        drafts: list[list[int]] = []
        for rid, candidate, k in zip(ids, candidates, ks):
            draft = candidate.truncated(k) if candidate is not None and k else None
            if rid in self.requests:
                self.requests[rid].draft = draft
            drafts.append(list(draft.tokens) if draft is not None else [])
            self.drafted += k
        self.steps += 1
        self._last_ids = ids if all(sampled) else ()
        self._last_drafted = sum(ks)
        self._last_time = self.clock()
        return drafts

    def _sync(self, rid: str, n_new: int, n: int, row: np.ndarray) -> _Request:
        """The request's state, created on first sight, extended by this step's accepted tokens.

        ``row`` is the request's row of the runner's token ids (its first ``n`` are valid), and
        ``n_new`` how many of those this step sampled: the accepted drafted tokens plus one.
        """
        request = self.requests.get(rid)
        if request is not None and n >= len(request.tokens):
            if request.draft is not None:
                accepted = min(n_new - 1, len(request.draft))
                self.policy.record_acceptance(request.draft, accepted)
                self.accepted += accepted
            request.tokens.extend(row[len(request.tokens) : n].tolist())
            return request
        # New (or restarted after preemption): index its prompt and what it sampled so far.
        tokens = row[:n].tolist()
        drafter = NgramDrafter(min_match=self.min_match, history=self.history)
        drafter.begin(tokens[: n - n_new], [])
        request = self.requests[rid] = _Request(drafter, tokens, n - n_new)
        self.requests_seen += 1
        self.write_stats()
        return request

    def _finish_absent(self, present: set[str]) -> None:
        ended = [rid for rid in self.requests if rid not in present]
        for rid in ended:
            request = self.requests.pop(rid)
            self.history.add(request.tokens[request.prompt_len :])
        if ended:
            self.write_stats()

    def stats(self) -> dict[str, Any]:
        """Counters and the measured step costs: ``step_seconds[rows][d]``, a step of a batch of
        ``rows`` requests carrying ``d`` drafted tokens; ``relative_cost``, the same over that
        batch's plain step as fitted (``r(d)`` of a single request in ``relative_cost["1"]``);
        ``timings``, how many timings each cell holds (capped at ``1 / smoothing``)."""
        return {
            "live_requests": len(self.requests),
            "requests_seen": self.requests_seen,
            "history_tokens": len(self.history),
            "history_budget": self.history.max_tokens,
            "steps": self.steps,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "step_seconds": {str(r): {str(d): t[d][0] for d in sorted(t)} for r, t in sorted(self.costs.cells.items())},
            "timings": {str(r): {str(d): t[d][1] for d in sorted(t)} for r, t in sorted(self.costs.cells.items())},
            "relative_cost": {str(r): {str(d): self.costs.relative(r, d) for d in sorted(t)}
                              for r, t in sorted(self.costs.cells.items()) if 0 in t},
        }

    def write_stats(self) -> None:
        path = os.environ.get(STATS_ENV)
        if not path:
            return
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.stats()))
        tmp.replace(target)


class RagspecProposer:
    """The proposer class vLLM builds for ``{"method": "custom_class", "model": PROPOSER_CLASS}``.

    vLLM 0.32 builds it with its ``VllmConfig`` inside the model runner's constructor and calls
    ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` with the
    batch's rows, but not their request ids; those are the runner's ``input_batch.req_ids``, so the
    proposer keeps a reference to the runner that built it (found on the call stack), whose batch
    also says which rows have a seeded generator (those get no drafts). Settings come
    from ``num_speculative_tokens`` (the longest draft) and the environment variables
    ``RAGSPEC_PROPOSER_HISTORY_TOKENS`` (earlier answers kept, default 2048) and
    ``RAGSPEC_PROPOSER_MIN_MATCH`` (shortest match drafted from, default 1).
    """

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.drafter = BatchDrafter(
            int(spec.num_speculative_tokens),
            max_model_len=int(vllm_config.model_config.max_model_len),
            history_tokens=_env_int(HISTORY_ENV, DEFAULT_HISTORY_TOKENS),
            min_match=_env_int(MIN_MATCH_ENV, DEFAULT_MIN_MATCH),
        )
        self._runner = _building_runner()

    def load_model(self, model: Any) -> None:
        """vLLM's CPU model runner hands every drafter the target model; drafting from text needs none."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Drafts for every row of the batch (an empty list: no draft for that request)."""
        batch = self._runner.input_batch
        return self.drafter.step(batch.req_ids, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, batch.generators)


def _building_runner() -> Any:
    """The vLLM model runner whose constructor is building this proposer."""
    frame = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if frame.f_code.co_name == "__init__" and type(candidate).__name__.endswith("ModelRunner"):
            return candidate
        frame = frame.f_back
    raise RuntimeError(
        f"{PROPOSER_CLASS} is built by vLLM's model runner (speculative_config method 'custom_class', "
        "vLLM 0.32 or newer); it cannot be built on its own"
    )


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
