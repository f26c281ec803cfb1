"""ragspec's drafting inside vLLM: a proposer for vLLM's ``custom_class`` speculative method.

Started by vLLM with ``--speculative-config '{"method": "custom_class", "model":
"ragspec.backends.vllm.proposer.RagspecProposer", "num_speculative_tokens": K}'`` (``ragspec serve --engine
vllm`` does that, see ``ragspec.backends.vllm.server``). Every engine step vLLM's model runner calls
``propose`` with the whole batch; vLLM's rejection sampler then verifies the drafts, so the output
is what vLLM gives without speculation (greedy: the same tokens; sampling: the same distribution).

What runs here is ragspec's own drafting, for the whole batch in one compiled call per step
(``ragspec.engine.ngram_batch``, numba; its docstring says why), with the semantics of
``ragspec.engine.ngram.NgramDrafter``, which a test checks it against token for token:

- a suffix automaton of each request's running context (its prompt, where the retrieved passages
  are, and its output), indexed once when the request appears and extended by the tokens each
  step accepted, never rescanned; plus one bounded ``AnswerHistory`` of earlier answers shared by
  all requests. Passage boundaries are not separate sources here: the passages are in the prompt,
  so the context's automaton finds the same matches, and vLLM keeps no per-passage statistics to
  report them in.
- ``ragspec.engine.planning``: the acceptance model of ``AdaptivePolicy`` (by source and match
  length, learnt from how many drafted tokens each step kept), step costs timed here
  (``StepCosts``: the interval between two calls of ``propose`` whose batches were the same
  requests in decode, one cost curve per batch size), and the one best-k search, which chooses
  every row's draft length at once for the most expected tokens per second of the whole step. So
  under a full batch (where verification is no longer free) and where drafts do not pay, the
  proposer proposes nothing.
- Per request: a request whose sampling parameters carry ``extra_args["ragspec_max_draft"]``
  (``REQUEST_MAX_DRAFT``; a ``RemoteGenerator`` sends it as vLLM's ``vllm_xargs`` from
  ``GenerationConfig.speculation``) drafts at most that many tokens per step, none with 0 (it is
  then not indexed at all, and its answer does not enter the history).

State is kept by request id (the model runner's batch rows move when requests end or are
reordered), created when a request first shows a sampled token, and dropped, its answer handed to
the history, when the id leaves the batch; so memory is bounded by the batch size plus the history.

This module runs inside vLLM's worker process, in vLLM's own environment, with ragspec's source
on ``PYTHONPATH``: it imports only the standard library, numpy, numba (a dependency of vLLM's) and
ragspec's drafting modules.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from operator import ne
from pathlib import Path
from typing import Any

import numpy as np

from ragspec.engine.ngram import AnswerHistory
from ragspec.engine.ngram_batch import BatchIndex
from ragspec.engine.planning import CostCurve
from ragspec.engine.policy import AdaptivePolicy

logger = logging.getLogger(__name__)

PROPOSER_CLASS = "ragspec.backends.vllm.proposer.RagspecProposer"
"""The value of ``speculative_config["model"]`` that loads this proposer."""
STATS_ENV = "RAGSPEC_PROPOSER_STATS"
"""When set, the proposer writes its statistics (JSON) to this file whenever a request ends."""
HISTORY_ENV = "RAGSPEC_PROPOSER_HISTORY_TOKENS"
MIN_MATCH_ENV = "RAGSPEC_PROPOSER_MIN_MATCH"
REQUEST_MAX_DRAFT = "ragspec_max_draft"
"""The key of a request's sampling parameters' ``extra_args`` (``vllm_xargs`` on vLLM's OpenAI API)
that caps its drafts: an integer, 0 for no speculation."""
DEFAULT_HISTORY_TOKENS = 2048
DEFAULT_MIN_MATCH = 1
HISTORY_EVERY = 8
"""Steps between two entries of finished answers into the history (``BatchIndex(history_every=...)``).
Each entry rebuilds the history's automaton; from about 100 rows some request ends at nearly every
step, so entries are batched: an answer waits at most 8 steps (a few hundred ms on a GPU) before
later requests can draft from it. A batch of a few rows, whose requests end tens of steps apart,
still enters every answer at once, so a user's next question drafts from the previous answer."""


@dataclass(frozen=True)
class StepBatch:
    """What vLLM's model runner hands a proposer at a step, a row per request of the batch."""

    req_ids: Sequence[str]
    sampled: Sequence[Sequence[int]]
    """The tokens each row sampled in the step that just ran (empty: a prompt not finished yet)."""
    num_tokens: Sequence[int] | np.ndarray
    token_ids: np.ndarray
    """Each row's tokens so far (vLLM's ``token_ids_cpu``), the first ``num_tokens`` of the row."""
    seeded_rows: Collection[int] = ()
    """Rows of requests sampled with a seed (vLLM's ``input_batch.generators``)."""


class StepCosts:
    """Seconds of one engine step, by the batch's size and the drafted tokens it carried.

    One ``ragspec.engine.planning.CostCurve`` per batch size (monotone: step times are noisy), because
    a row costs far more than a drafted token: each row reads its own context's keys and values,
    while a drafted token reuses its row's. ``curve(rows).relative(d)`` is then the step's cost in plain
    steps of a batch of that size. A size whose plain step is untimed gets no drafts
    (``measured``), and the plain step is timed again every ``replain_every`` steps of a size, as
    its contexts grow.

    Lengths not timed yet cost the prior: ``prior_slope`` of a plain step per drafted token for one
    row, and for a batch that fraction of the one-row step, over the batch's own plain step (a
    drafted token costs about what one row's token does, whatever else the batch holds), once both
    plain steps are timed. Without this a full batch would never try a draft: its step costs several
    one-row steps, so ``prior_slope`` of it per token looked dearer than any draft's expected gain.
    """

    def __init__(self, prior_slope: float = 0.1, smoothing: float = 0.1, replain_every: int = 64) -> None:
        self.prior_slope, self.smoothing, self.replain_every = prior_slope, smoothing, replain_every
        self.curves: dict[int, CostCurve] = {}
        self._since_plain: dict[int, int] = {}

    def curve(self, rows: int) -> CostCurve:
        """This batch size's curve, its prior scaled to the one-row step (class docstring)."""
        curve = self._cells(rows)
        if rows > 1:
            self._scale_prior(curve)
        return curve

    def _cells(self, rows: int) -> CostCurve:
        curve = self.curves.get(rows)
        if curve is None:
            curve = self.curves[rows] = CostCurve(self.prior_slope, self.smoothing, monotone=True)
        return curve

    def _scale_prior(self, curve: CostCurve) -> None:
        """The batch's prior per drafted token: ``prior_slope`` of the one-row plain step (class docstring)."""
        one = self.curves.get(1)
        if one is not None and one.has_plain and curve.has_plain:
            curve.prior_slope = self.prior_slope * min(1.0, float(one.means[0] / curve.means[0]))

    def record(self, rows: int, drafted: int, seconds: float) -> None:
        self._cells(rows).record(drafted, seconds)  # timings need no prior: no scaling on every step
        self._since_plain[rows] = 0 if drafted == 0 else self._since_plain.get(rows, 0) + 1

    def measured(self, rows: int) -> bool:
        """Whether drafts may be planned for this batch size (its plain step is timed and recent)."""
        return self.plannable(rows) is not None

    def plannable(self, rows: int) -> CostCurve | None:
        """This batch size's curve when drafts may be planned with it (``measured``), else ``None``."""
        curve = self.curves.get(rows)
        if curve is None or not curve.weights[0] or self._since_plain.get(rows, 0) >= self.replain_every:
            return None
        if rows > 1:
            self._scale_prior(curve)
        return curve


class BatchDrafter:
    """ragspec's drafter and policy for a batch of requests that an engine steps together.

    ``step`` takes what vLLM's model runner has after a step: each row's request id, the tokens it
    sampled this step (none while its prompt is still being prefilled), its token count and its
    token ids; it returns each row's draft for the next step. The work is one call of
    ``ragspec.engine.ngram_batch``'s compiled kernel for the whole batch (index, match, plan); what
    stays in Python per step is constant, plus C-level passes over the rows (the sampled lists'
    lengths, comparing the id list with the last step's, the draft lists vLLM takes) and work per
    request that begins or ends (its row, its answer into the history).
    ``request_cap(rid)`` is a request's own longest draft (0: it asked for no speculation; it is
    then not indexed at all), read once when the request first shows a sampled token. ``costs``
    (timed here by default) and ``clock`` are injectable for tests; ``max_rows`` is the batch size to
    allocate state for at once (more grows it).
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
        request_cap: Callable[[str], int] | None = None,
        max_rows: int = 4,
    ) -> None:
        if max_draft < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {max_draft}")
        self.max_draft = max_draft
        self.max_model_len = max_model_len
        self.index = BatchIndex(max_draft, max_model_len, history_tokens, min_match, rows=max_rows,
                                history_every=HISTORY_EVERY)
        self.policy = policy if policy is not None else AdaptivePolicy(max_draft=max_draft)
        self.costs = costs if costs is not None else StepCosts(prior_slope=self.policy.prior_cost_slope)
        self.clock = clock
        self.request_cap = request_cap if request_cap is not None else (lambda rid: max_draft)
        self.requests_seen = 0  # indexed (drafted for)
        self.undrafted_seen = 0  # asked for no speculation
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.undrafted: set[str] = set()  # live requests that asked for no speculation
        self._ids: list[str] = []
        self._slots = np.zeros(0, np.int64)
        self._pending = False  # some row of ``_slots`` has no state yet (-1)
        self._no_seeds = np.zeros(0, np.int8)
        self._last_ids: list[str] | None = None
        self._last_drafted = 0  # drafted tokens the last planned step carries
        self._last_time: float | None = None
        self._stats_path = os.environ.get(STATS_ENV)  # read once: requests begin and end at most steps

    @property
    def history(self) -> AnswerHistory:
        return self.index.history

    def step(self, batch: StepBatch) -> list[list[int]]:
        """Each row's draft for the next step. Rows in ``seeded_rows`` (requests sampled with a
        seed) get none: vLLM's rejection sampler draws its random numbers per drafted token, so
        drafts that depend on timing and on other requests would make a seeded sample differ
        from run to run; without drafts it is the sample vLLM gives without speculation."""
        ids, n_new, num_tokens, seeded, all_sampled = self._begin_step(batch)
        rows = len(ids)
        curve = self.costs.plannable(rows)
        drafted, accepted, restarted = self.index.step(
            self._slots, n_new, num_tokens, batch.token_ids, seeded, self.policy.acceptance.counts, self.policy.decay,
            curve, self.policy.margin,
        )  # fmt: skip
        drafts = draft_lists(self.index.drafts[:rows], self.index.ks[:rows]) if drafted else [[] for _ in ids]
        self.drafted += drafted
        self.accepted += accepted
        self.requests_seen += restarted
        self.steps += 1
        self._last_ids = ids if all_sampled else None
        self._last_drafted = drafted
        self._last_time = self.clock()
        return drafts

    def _begin_step(self, batch: StepBatch) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, bool]:
        """What every step does before drafting: follow the batch's requests (``_regroup``,
        ``_admit``), time the step that just ran, and mark the seeded rows. Returns the rows' ids,
        new tokens, token counts, seeded flags, and whether every row sampled."""
        now = self.clock()
        sampled, seeded_rows = batch.sampled, batch.seeded_rows
        rows = len(sampled)
        ids = batch.req_ids[:rows]
        if not isinstance(ids, list):
            ids = list(ids)
        n_new = np.fromiter(map(len, sampled), np.int64, rows)
        num_tokens = np.asarray(batch.num_tokens)[:rows]
        if ids != self._ids:
            self._regroup(ids)
        if self._pending:
            self._admit(n_new, num_tokens)
        all_sampled = bool(n_new.all())
        if all_sampled and ids == self._last_ids and self._last_time is not None and now > self._last_time:
            # The step just verified what the last call planned: time it by its size and drafts.
            self.costs.record(rows, self._last_drafted, now - self._last_time)
        if seeded_rows:
            seeded = np.zeros(rows, np.int8)
            seeded[[r for r in seeded_rows if r < rows]] = 1
        else:
            if len(self._no_seeds) < rows:
                self._no_seeds = np.zeros(2 * rows, np.int8)
            seeded = self._no_seeds[:rows]
        return ids, n_new, num_tokens, seeded, all_sampled

    def _regroup(self, ids: list[str]) -> None:
        """The batch's requests changed: end the absent ones (their answers go to the history, in
        the order they began) and map every row to its request's state. Only the rows whose
        request differs from the last step's are looked at in Python (vLLM's runner moves a few
        rows when requests end or begin); finding them is one C-level comparison of the id lists."""
        old = self._ids
        common = min(len(ids), len(old))
        changed = np.flatnonzero(np.fromiter(map(ne, ids, old), bool, common)).tolist()
        rows = changed + list(range(common, len(ids)))
        gone = {old[r] for r in changed + list(range(common, len(old)))}
        gone -= {ids[r] for r in rows}
        ended = self.index.in_order(gone)
        if ended:
            self.index.end(ended)
        self.undrafted -= gone
        slots = np.empty(len(ids), np.int64)
        slots[:common] = self._slots[:common]
        slot_of, undrafted = self.index.slot_of, self.undrafted
        for r in rows:
            rid = ids[r]
            slots[r] = -2 if rid in undrafted else slot_of.get(rid, -1)
        self._slots = slots
        self._pending = bool((slots == -1).any())
        self._ids = ids
        if ended:
            self.write_stats()

    def _admit(self, n_new: np.ndarray, num_tokens: np.ndarray) -> None:
        """State for rows that show their first sampled tokens: their prompt is what came before."""
        waiting = np.flatnonzero((self._slots == -1) & (n_new > 0) & (num_tokens < self.max_model_len))
        for r in waiting.tolist():
            rid = self._ids[r]
            cap = self.request_cap(rid)
            if cap <= 0:
                self.undrafted.add(rid)
                self.undrafted_seen += 1
                self._slots[r] = -2
                continue
            self._slots[r] = self.index.begin(rid, int(num_tokens[r] - n_new[r]), cap)
            self.requests_seen += 1
        self._pending = bool((self._slots == -1).any())
        if len(waiting):
            self.write_stats()

    def stats(self) -> dict[str, Any]:
        """Counters (``requests_seen``: requests indexed and drafted for; ``undrafted_requests_seen``:
        requests that asked for no speculation) and the measured step costs: ``step_seconds[rows][d]``, a step of a batch of
        ``rows`` requests carrying ``d`` drafted tokens; ``relative_cost``, the same over that
        batch's plain step as fitted (``r(d)`` of a single request in ``relative_cost["1"]``);
        ``timings``, how many timings each cell holds (capped at ``1 / smoothing``)."""
        curves = sorted(self.costs.curves.items())
        return {
            "live_requests": len(self.index) + len(self.undrafted),
            "requests_seen": self.requests_seen,
            "undrafted_requests_seen": self.undrafted_seen,
            "history_tokens": len(self.history),
            "history_budget": self.history.max_tokens,
            "steps": self.steps,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "step_seconds": {str(r): {str(d): s for d, s in c.measured().items()} for r, c in curves},
            "timings": {str(r): {str(d): w for d, w in c.timings().items()} for r, c in curves},
            "relative_cost": {str(r): {str(d): c.relative(d) for d in c.measured()} for r, c in curves if c.has_plain},
        }

    def write_stats(self) -> None:
        """``stats`` into the file ``RAGSPEC_PROPOSER_STATS`` named when this drafter was built, if any."""
        if not self._stats_path:
            return
        target = Path(self._stats_path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.stats()))
        tmp.replace(target)


class RagspecProposer:
    """The proposer class vLLM builds for ``{"method": "custom_class", "model": PROPOSER_CLASS}``.

    vLLM 0.32 builds it with its ``VllmConfig`` inside the model runner's constructor and calls
    ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` with the
    batch's rows, but not their request ids; those are the runner's ``input_batch.req_ids``, so the
    proposer keeps a reference to the runner that built it (found on the call stack), whose batch
    also says which rows have a seeded generator (those get no drafts), and whose ``requests``
    hold each request's sampling parameters (their ``extra_args`` may set ``REQUEST_MAX_DRAFT``; a
    vLLM without them drafts for every request, saying so once in its log). Settings come from
    ``num_speculative_tokens`` (the longest draft) and the environment variables
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
            request_cap=self._request_cap,
            max_rows=int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 4)),
        )
        self._runner = _building_runner()
        self._warned: set[str] = set()

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
        return self.drafter.step(StepBatch(batch.req_ids, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, batch.generators))

    def _request_cap(self, rid: str) -> int:
        return request_cap(self._runner, rid, self.drafter.max_draft, self._warned)


def draft_lists(drafts: np.ndarray, ks: np.ndarray) -> list[list[int]]:
    """Row ``r``'s first ``ks[r]`` tokens of ``drafts``, as vLLM takes drafts: a list of ints per row.

    vLLM 0.32's model runner hands a proposer's ``list[list[int]]`` to the scheduler as it is (its
    other form, a tensor, gives every row the same length). Where most rows draft, the lists are
    made in one C call for the longest length and only the rows that draft fewer are cut; where
    few do, the others get empty lists and only the drafting rows are converted."""
    rows = np.flatnonzero(ks)
    if 2 * len(rows) < len(ks):
        out: list[list[int]] = [[] for _ in range(len(ks))]
        for r, k in zip(rows.tolist(), ks[rows].tolist()):
            out[r] = drafts[r, :k].tolist()
        return out
    longest = int(ks.max())
    lists: list[list[int]] = drafts[:, :longest].tolist()
    short = np.flatnonzero(ks < longest)
    for r, k in zip(short.tolist(), ks[short].tolist()):
        del lists[r][k:]
    return lists


def request_cap(runner: Any, rid: str, longest: int, warned: set[str]) -> int:
    """Request ``rid``'s longest draft: ``extra_args[REQUEST_MAX_DRAFT]`` of its sampling parameters
    in vLLM's model ``runner`` (0: no speculation), else ``longest``. Each kind of problem is
    logged once (``warned`` keeps which)."""

    def warn_once(what: str, message: str) -> None:
        if what not in warned:
            warned.add(what)
            logger.warning("ragspec proposer: %s", message)

    try:
        params = runner.requests[rid].sampling_params
        extra = getattr(params, "extra_args", None) if params is not None else None
    except (AttributeError, KeyError):
        warn_once("state", "this vLLM's model runner keeps no request states with sampling parameters: "
                  f"per-request speculation settings ({REQUEST_MAX_DRAFT}) are ignored")
        return longest
    value = extra.get(REQUEST_MAX_DRAFT) if isinstance(extra, dict) else None
    if value is None:
        return longest
    try:  # vLLM may hand vllm_xargs values over as strings
        cap = int(str(value))
    except ValueError:
        cap = -1
    if cap < 0:
        warn_once("value", f"ignoring {REQUEST_MAX_DRAFT}={value!r} (an integer >= 0 is expected)")
        return longest
    return min(cap, longest)


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
