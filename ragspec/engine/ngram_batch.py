"""N-gram drafting for a whole batch in one compiled call: ``NgramDrafter``'s suffix automata over flat arrays.

ragspec's proposer inside vLLM (``ragspec.backends.vllm.proposer``) drafts for every request of the
batch at every engine step, on the CPU, while the accelerator waits (vLLM 0.32 runs ``custom_class``
proposers synchronously). ``BatchIndex.step`` does the whole batch's per-step work in one call of
compiled code: per row, extend its suffix automaton by the tokens the step accepted, advance its
matcher over the bounded history of earlier answers, find the longest match in both, write the
continuation, record how many of the last draft's tokens were accepted, and plan every row's draft
length with ``ragspec.engine.planning.plan``.

The semantics are ``ragspec.engine.ngram.NgramDrafter``'s (the Python reference, with no passages:
inside vLLM they are part of the prompt) exactly, and a test compares the two on random and real
token streams: the same tokens, source and match length for every row at every step. Per request:
an online suffix automaton of its context (prompt and output); the longest suffix of the context
that also occurs earlier is the suffix link of its newest state, and the draft is what followed
that suffix's first occurrence. One ``AnswerHistory`` of earlier answers is shared by all
requests; a request matches against the history as it was when the request began (each version
is a suffix automaton of its own, freed when no live request uses it). On equal lengths the
history wins over the context, as in the reference.

Layout: every automaton is rows of preallocated arrays: its tokens; its states (length, suffix
link, end of first occurrence, first outgoing edge); its edges (source, token, target, next edge of
the same source), and an open-addressing hash table from (state, token) to edge. A suffix
automaton of ``n`` tokens has at most ``2n`` states and ``3n`` edges, so a row of capacity ``T``
tokens never overflows; the rows of all requests share ``T``, which doubles when a context outgrows
it. Memory is about 100 bytes per token of capacity, times the batch's rows, plus the history's
versions: bounded by the batch and the history, as with the Python drafters (which take about ten
times more per token).

**Why numba.** The work per row is a few dependent table lookups per token; in Python each costs
a dictionary access and interpreter overhead (the Python proposer took ~35 µs per request per
step, ``docs/scale-out.md``), while vLLM's own n-gram proposer (``vllm.v1.spec_decode.ngram_proposer``)
is a numba kernel at ~2.6 µs. numba compiles the same kind of loop to machine code with no build
step: vLLM already depends on it, so inside vLLM's environment it costs nothing, and in ragspec's it
is one wheel (no compiler, no extension to build per platform, unlike Cython or C++). Functions are
compiled on first use and cached on disk (``cache=True``), so a process pays the compilation once.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
from ragspec.engine.jit import njit

from ragspec.engine.ngram import AnswerHistory
from ragspec.engine.planning import (
    MAX_BUCKET,
    OUTPUT,
    REFERENCE,
    CostCurve,
    plan,
    rates,
    record_acceptance,
    relative_table,
)

# Sources of a candidate, as the kernel writes them (``SOURCES[code]`` is the DraftSource value).
NONE, PROMPT, OUTPUT_SOURCE, HISTORY = 0, 1, 2, 3
SOURCES = (None, "prompt", "output", "history")
# Columns of the per-request table (``SEQ``: the order in which requests first began).
PROMPT_LEN, VERSION, H_STATE, H_LEN, LAST_K, LAST_GROUP, LAST_BUCKET, CAP, SEQ = range(9)
SLOT_COLUMNS = 9
_NO_CELLS = np.zeros(1)


def _hash_size(capacity: int) -> int:
    return 1 << max(4, int(4 * (capacity + 1)).bit_length())


class Automata:
    """``count`` suffix automata of at most ``capacity`` tokens each, in flat arrays (module docstring)."""

    def __init__(self, count: int, capacity: int) -> None:
        self.count, self.capacity = count, capacity
        self.tokens = np.zeros((count, capacity), np.int32)
        self.states = np.zeros((count, 2 * capacity + 2, 4), np.int32)  # length, link, first end, first edge
        self.edges = np.zeros((count, 3 * capacity + 3, 4), np.int32)  # source, token, target, next edge
        self.table = np.full((count, _hash_size(capacity)), -1, np.int32)
        self.meta = np.zeros((count, 4), np.int64)  # tokens, states, edges, last state
        for a in range(count):
            _reset(self.states[a], self.table[a], self.meta[a])

    def reset(self, a: int) -> None:
        _reset(self.states[a], self.table[a], self.meta[a])

    def resized(self, count: int, capacity: int) -> Automata:
        """A copy with room for ``count`` automata of ``capacity`` tokens (both at least as large)."""
        grown = Automata(count, capacity)
        c, t = self.count, self.capacity
        grown.tokens[:c, :t] = self.tokens
        grown.states[:c, : self.states.shape[1]] = self.states
        grown.edges[:c, : self.edges.shape[1]] = self.edges
        grown.meta[:c] = self.meta
        if capacity == t:
            grown.table[:c] = self.table
        else:
            for a in range(c):
                _rehash(grown.edges[a], grown.table[a], grown.meta[a])
        return grown

    def build(self, a: int, tokens: np.ndarray) -> None:
        """Automaton ``a`` made anew from ``tokens``."""
        _reset(self.states[a], self.table[a], self.meta[a])
        _build(self.tokens[a], self.states[a], self.edges[a], self.table[a], self.meta[a], tokens)


@njit(cache=True, nogil=True)
def _reset(states, table, meta):  # type: ignore[no-untyped-def]
    table[:] = -1
    states[0, 0], states[0, 1], states[0, 2], states[0, 3] = 0, -1, -1, -1
    meta[0], meta[1], meta[2], meta[3] = 0, 1, 0, 0


@njit(cache=True, nogil=True, inline="always")
def _slot(state, token, mask):  # type: ignore[no-untyped-def]
    x = (np.int64(state) * 1000003 + np.int64(token)) * np.int64(-7046029254386353131)  # 2^64 / golden ratio
    return (x ^ (x >> 29)) & mask


@njit(cache=True, nogil=True)
def _find(edges, table, state, token):  # type: ignore[no-untyped-def]
    """The edge leaving ``state`` on ``token``, or -1."""
    mask = len(table) - 1
    h = _slot(state, token, mask)
    while True:
        e = table[h]
        if e < 0:
            return -1
        if edges[e, 0] == state and edges[e, 1] == token:
            return e
        h = (h + 1) & mask


@njit(cache=True, nogil=True)
def _insert(table, e, state, token):  # type: ignore[no-untyped-def]
    mask = len(table) - 1
    h = _slot(state, token, mask)
    while table[h] >= 0:
        h = (h + 1) & mask
    table[h] = e


@njit(cache=True, nogil=True)
def _add_edge(states, edges, table, meta, state, token, target):  # type: ignore[no-untyped-def]
    e = meta[2]
    meta[2] = e + 1
    edges[e, 0], edges[e, 1], edges[e, 2], edges[e, 3] = state, token, target, states[state, 3]
    states[state, 3] = e
    _insert(table, e, state, token)


@njit(cache=True, nogil=True)
def _rehash(edges, table, meta):  # type: ignore[no-untyped-def]
    table[:] = -1
    for e in range(meta[2]):
        _insert(table, e, edges[e, 0], edges[e, 1])


@njit(cache=True, nogil=True)
def _extend(tokens, states, edges, table, meta, token):  # type: ignore[no-untyped-def]
    """Append one token: the standard online construction (``SuffixAutomaton.extend``)."""
    pos = meta[0]
    tokens[pos] = token
    meta[0] = pos + 1
    cur = meta[1]
    meta[1] = cur + 1
    last = meta[3]
    states[cur, 0], states[cur, 1], states[cur, 2], states[cur, 3] = states[last, 0] + 1, 0, pos, -1
    p = last
    e = -1
    while p != -1:
        e = _find(edges, table, p, token)
        if e >= 0:
            break
        _add_edge(states, edges, table, meta, p, token, cur)
        p = states[p, 1]
    if p != -1:
        q = edges[e, 2]
        if states[p, 0] + 1 == states[q, 0]:
            states[cur, 1] = q
        else:
            clone = meta[1]
            meta[1] = clone + 1
            states[clone, 0], states[clone, 1], states[clone, 2], states[clone, 3] = (
                states[p, 0] + 1, states[q, 1], states[q, 2], -1)
            f = states[q, 3]
            while f >= 0:
                _add_edge(states, edges, table, meta, clone, edges[f, 1], edges[f, 2])
                f = edges[f, 3]
            while p != -1:
                e = _find(edges, table, p, token)
                if e < 0 or edges[e, 2] != q:
                    break
                edges[e, 2] = clone
                p = states[p, 1]
            states[q, 1] = clone
            states[cur, 1] = clone
    meta[3] = cur


@njit(cache=True, nogil=True)
def _build(tokens, states, edges, table, meta, source):  # type: ignore[no-untyped-def]
    for t in source:
        _extend(tokens, states, edges, table, meta, t)


@njit(cache=True, nogil=True)
def step_kernel(  # type: ignore[no-untyped-def]
    slots, n_new, num_tokens, token_ids, seeded, max_model_len, min_match,
    tokens, states, edges, table, meta, requests,
    h_tokens, h_states, h_edges, h_table, h_meta, h_longest, h_refs, version,
    counts, decay, plan_on, means, weights, monotone, prior_slope, margin,
    cand, drafts, ks,
):
    """One step of the batch (``BatchIndex.step``). Returns ``(drafted, accepted, restarted)``, or
    ``(-n, 0, 0)`` when a context of ``n`` tokens does not fit the automata's capacity (nothing is
    changed then). ``version`` is the history's current automaton (-1: empty), which a restarted
    request (its context shorter than what was indexed: preempted, its id reused) begins with.

    ``cand[r]`` gets row ``r``'s candidate: source code, match length, tokens written to
    ``drafts[r]``; ``ks[r]`` how many of them the plan verifies.
    """
    rows = len(slots)
    capacity = tokens.shape[1]
    for r in range(rows):
        if slots[r] >= 0 and num_tokens[r] > capacity:
            return -num_tokens[r], 0, 0
    accepted_total = 0
    restarted = 0
    for r in range(rows):
        cand[r, 0], cand[r, 1], cand[r, 2] = NONE, 0, 0
        s = slots[r]
        n = num_tokens[r]
        if s < 0 or n_new[r] == 0 or n >= max_model_len:
            continue
        req = requests[s]
        m = meta[s]
        ts, ss, es, tb = tokens[s], states[s], edges[s], table[s]
        if n < m[0]:  # restarted (preempted, or its id reused): index it anew
            _reset(ss, tb, m)
            if req[VERSION] >= 0:
                h_refs[req[VERSION]] -= 1
            if version >= 0:
                h_refs[version] += 1
            req[PROMPT_LEN], req[VERSION], req[H_STATE], req[H_LEN], req[LAST_K] = n - n_new[r], version, 0, 0, 0
            restarted += 1
        if req[LAST_K] > 0:  # what this step verified: the last draft
            kept = min(n_new[r] - 1, req[LAST_K])
            record_acceptance(counts, decay, req[LAST_GROUP], req[LAST_BUCKET], req[LAST_K], kept)
            accepted_total += kept
            req[LAST_K] = 0
        v = req[VERSION]
        h_state, h_len = req[H_STATE], req[H_LEN]
        hs, he, ht = h_states[max(v, 0)], h_edges[max(v, 0)], h_table[max(v, 0)]
        # A new matcher need not read more than the history's longest answer back: no match is longer.
        h_from = m[0] if m[0] > 0 or v < 0 else max(0, n - h_longest[v])
        row = token_ids[r]
        for i in range(m[0], n):
            t = row[i]
            _extend(ts, ss, es, tb, m, t)
            if v >= 0 and i >= h_from:  # the history matcher (``_Matcher.advance``)
                while h_state != 0:
                    if _find(he, ht, h_state, t) >= 0:
                        break
                    h_state = hs[h_state, 1]
                    h_len = hs[h_state, 0]
                e = _find(he, ht, h_state, t)
                if e < 0:
                    h_state, h_len = 0, 0
                else:
                    h_state, h_len = he[e, 2], h_len + 1
        req[H_STATE], req[H_LEN] = h_state, h_len
        room = 0 if seeded[r] else min(req[CAP], max_model_len - n - 1, drafts.shape[1])
        if room <= 0:
            continue
        # The history's match, shortened while its first occurrence has no continuation.
        best_len, best_src, start = 0, NONE, -1
        if v >= 0 and h_len >= min_match:
            state, length = h_state, h_len
            hn = h_meta[v, 0]
            while state > 0:
                end = h_states[v, state, 2]
                if end + 1 < hn and h_tokens[v, end + 1] >= 0:
                    break
                state = h_states[v, state, 1]
                length = h_states[v, state, 0]
            if state > 0 and length >= min_match:
                best_len, best_src, start = length, HISTORY, h_states[v, state, 2] + 1
        # The context's own: the longest suffix that occurs earlier is the newest state's link.
        last = m[3]
        state = states[s, last, 1] if last else 0
        length = states[s, state, 0] if state > 0 else 0
        if length >= min_match and length > best_len:
            end = states[s, state, 2]
            best_len, start = length, end + 1
            best_src = PROMPT if end + 1 < req[PROMPT_LEN] else OUTPUT_SOURCE
        if best_src == NONE:
            continue
        k = 0
        if best_src == HISTORY:
            hn = h_meta[v, 0]
            while k < room and start + k < hn and h_tokens[v, start + k] >= 0:
                drafts[r, k] = h_tokens[v, start + k]
                k += 1
        else:
            while k < room and start + k < m[0]:
                drafts[r, k] = tokens[s, start + k]
                k += 1
        cand[r, 0], cand[r, 1], cand[r, 2] = best_src, best_len, k
    # Plan every row's length at once; rows of one source group and match-length bucket share p1 and q.
    p1 = np.empty(rows)
    q = np.empty(rows)
    lengths = np.zeros(rows, np.int64)
    kinds = np.zeros(rows, np.int64)
    total = 0
    for r in range(rows):
        ks[r] = 0
        if plan_on and cand[r, 0] != NONE:
            group = OUTPUT if cand[r, 0] == OUTPUT_SOURCE else REFERENCE
            b = min(cand[r, 1], MAX_BUCKET)
            p1[r], q[r] = rates(counts, group, b)
            kinds[r] = group * (MAX_BUCKET + 1) + b
            lengths[r] = cand[r, 2]
            total += cand[r, 2]
    drafted = 0
    if total:
        cost = np.empty(total + 1)
        relative_table(means, weights, monotone, prior_slope, cost)
        drafted = plan(p1, q, lengths, kinds, 2 * (MAX_BUCKET + 1), cost, margin, rows, ks)
    for r in range(rows):
        if ks[r] > 0:
            req = requests[slots[r]]
            req[LAST_K] = ks[r]
            req[LAST_GROUP] = OUTPUT if cand[r, 0] == OUTPUT_SOURCE else REFERENCE
            req[LAST_BUCKET] = min(cand[r, 1], MAX_BUCKET)
    return drafted, accepted_total, restarted


class _Version:
    """One automaton of the history's, in ``BatchIndex.versions``."""

    __slots__ = ("slot", "tokens")

    def __init__(self, slot: int, tokens: int) -> None:
        self.slot, self.tokens = slot, tokens

    def __len__(self) -> int:
        return self.tokens


class BatchIndex:
    """The drafting state of a batch of requests, kept by request id, stepped in one compiled call.

    ``begin(rid, prompt_len, cap)`` gives a request its row (``cap``: its longest draft), ``end(rid)``
    frees it and hands its answer to the history (at once, or with the others that end within ``history_every`` steps), and ``step`` runs ``step_kernel`` over the batch's
    rows (``slots[r]``: the row of the batch's ``r``-th request, -1: not drafted for). After a step,
    ``cand`` and ``drafts`` hold every row's candidate (source code, match length, tokens).
    """

    def __init__(
        self, max_draft: int, max_model_len: int, history_tokens: int, min_match: int = 1, rows: int = 4,
        history_every: int = 0,
    ) -> None:
        if min_match < 1:
            raise ValueError(f"min_match must be >= 1, got {min_match}")
        if history_every < 0:
            raise ValueError(f"history_every must be >= 0, got {history_every}")
        self.max_draft, self.max_model_len, self.min_match = max_draft, max_model_len, min_match
        # Finished answers enter the history at most once every ``history_every`` steps: each entry
        # rebuilds the history's automaton (O(history_tokens)), and in a large batch some request ends
        # at almost every step. Where requests end rarely (a few rows) every answer enters at once.
        self.history_every = history_every
        self.steps = 0
        self._ended: list[list[int]] = []  # answers waiting to enter the history, in the order they began
        self._entered_at = -history_every  # the step at which answers last entered it
        self.automata = Automata(rows, min(1024, max_model_len + 1))  # rows: the batch's expected size
        self.requests = np.zeros((rows, SLOT_COLUMNS), np.int64)
        self.slot_of: dict[str, int] = {}
        self._free = list(range(rows - 1, -1, -1))
        self.history = AnswerHistory(history_tokens, self._build_version)
        # At most one version per live request, plus the current one.
        self.versions = Automata(rows + 2 if history_tokens else 1, history_tokens + 1)
        self.version_longest = np.zeros(self.versions.count, np.int64)  # each version's longest answer
        self.version_refs = np.zeros(self.versions.count, np.int64)  # live requests that began with each version
        self._began = 0  # requests that began so far (``SEQ``)
        self.cand = np.zeros((0, 3), np.int64)
        self.drafts = np.zeros((0, max_draft), np.int32)
        self.ks = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.slot_of)

    @property
    def version(self) -> int:
        """The history's current automaton in ``versions`` (-1: the history is empty)."""
        return self.history.index.slot if len(self.history) else -1

    def begin(self, rid: str, prompt_len: int, cap: int) -> int:
        """A row for request ``rid`` (new, or restarted), its first ``prompt_len`` tokens its prompt."""
        slot = self.slot_of.get(rid)
        row = self.requests
        if slot is None:
            if not self._free:
                count = self.automata.count
                self.automata = self.automata.resized(2 * count, self.automata.capacity)
                self.requests = row = np.concatenate([row, np.zeros_like(row)])
                self._free = list(range(2 * count - 1, count - 1, -1))
            slot = self.slot_of[rid] = self._free.pop()
            seq = self._began = self._began + 1
        else:  # restarted: it keeps its place in the order of beginnings
            seq = int(row[slot, SEQ])
            if row[slot, VERSION] >= 0:
                self.version_refs[row[slot, VERSION]] -= 1
        self.automata.reset(slot)
        version = self.version
        row[slot] = (prompt_len, version, 0, 0, 0, 0, 0, min(cap, self.max_draft), seq)
        if version >= 0:
            self.version_refs[version] += 1
        return slot

    def in_order(self, rids: Collection[str]) -> list[str]:
        """Those of ``rids`` that have a row, in the order they began (``end`` takes them so)."""
        slot_of, seq = self.slot_of, self.requests[:, SEQ]
        return sorted((rid for rid in rids if rid in slot_of), key=lambda rid: int(seq[slot_of[rid]]))

    def end(self, rids: Sequence[str]) -> None:
        """Free the rows of these requests; their answers go to the history, in this order."""
        if not rids:
            return
        slots = [self.slot_of.pop(rid) for rid in rids]
        row, meta, tokens = self.requests, self.automata.meta, self.automata.tokens
        self._ended += [tokens[s, row[s, PROMPT_LEN] : meta[s, 0]].tolist() for s in slots]
        self._free += slots
        for version in row[slots, VERSION].tolist():
            if version >= 0:
                self.version_refs[version] -= 1
        self._enter_history()

    def _enter_history(self) -> None:
        """The finished answers enter the history if ``history_every`` steps have passed since the
        last entry."""
        if self._ended and self.steps - self._entered_at >= self.history_every:
            self.history.add_all(self._ended)
            self._ended = []
            self._entered_at = self.steps

    def tokens(self, rid: str) -> np.ndarray:
        """The context indexed for ``rid``."""
        slot = self.slot_of[rid]
        return self.automata.tokens[slot, : self.automata.meta[slot, 0]]

    def _build_version(self, tokens: Sequence[int]) -> _Version:
        # A free slot: no live request began with it, and it is not the current version.
        free = self.version_refs == 0
        if self.version >= 0:
            free[self.version] = False
        slots = np.flatnonzero(free)
        if not len(slots):
            count = self.versions.count
            self.versions = self.versions.resized(2 * count, self.versions.capacity)
            self.version_longest = np.concatenate([self.version_longest, np.zeros(count, np.int64)])
            self.version_refs = np.concatenate([self.version_refs, np.zeros(count, np.int64)])
            slots = np.arange(count, 2 * count)
        slot = int(slots[0])
        array = np.asarray(tokens, np.int32)
        self.versions.build(slot, array)
        ends = np.flatnonzero(array < 0)  # every answer ends with its separator
        self.version_longest[slot] = int(np.max(np.diff(ends, prepend=-1)) - 1)
        return _Version(slot, len(tokens))

    def step(
        self,
        slots: np.ndarray,
        n_new: np.ndarray,
        num_tokens: np.ndarray,
        token_ids: np.ndarray,
        seeded: np.ndarray,
        counts: np.ndarray,
        decay: float,
        curve: CostCurve | None = None,
        margin: float = 0.0,
    ) -> tuple[int, int, int]:
        """Extend, match and (with a ``curve``: the batch's step cost) plan every row; ``ks`` then
        holds each row's draft length. Returns ``(drafted, accepted, restarted)``."""
        rows = len(slots)
        if self._ended:
            self._enter_history()
        self.steps += 1
        if len(self.ks) < rows:
            self.cand = np.zeros((2 * rows, 3), np.int64)
            self.drafts = np.zeros((2 * rows, self.max_draft), np.int32)
            self.ks = np.zeros(2 * rows, np.int64)
        a, v = self.automata, self.versions
        means, weights = (curve.means, curve.weights) if curve is not None else (_NO_CELLS, _NO_CELLS)
        while True:
            result = step_kernel(
                slots, n_new, num_tokens, token_ids, seeded, self.max_model_len, self.min_match,
                a.tokens, a.states, a.edges, a.table, a.meta, self.requests,
                v.tokens, v.states, v.edges, v.table, v.meta, self.version_longest, self.version_refs, self.version,
                counts, decay, curve is not None, means, weights, curve is not None and curve.monotone,
                curve.prior_slope if curve is not None else 0.0, margin,
                self.cand[:rows], self.drafts[:rows], self.ks[:rows],
            )  # fmt: skip
            if result[0] >= 0:
                return result
            capacity = a.capacity
            while capacity < -result[0]:
                capacity *= 2
            a = self.automata = a.resized(a.count, min(capacity, self.max_model_len + 1))
