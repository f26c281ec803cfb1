"""The batch kernel against the Python reference (``NgramDrafter`` sharing one ``AnswerHistory``).

Both are driven through the same simulated engine: rows of requests that accept a few tokens per
step, end, and are replaced by new ones whose drafts may come from the finished answers. At every
step every row's candidate must be the reference's: the same tokens, source and match length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.engine.drafting import DraftSource
from ragspec.engine.ngram import AnswerHistory, NgramDrafter
from ragspec.engine.ngram_batch import SOURCES, BatchIndex
from ragspec.engine.planning import Acceptance

CORPUS = Path(__file__).resolve().parents[3] / "retrievers" / "data" / "corpus"


@dataclass
class Request:
    rid: str
    prompt: list[int]
    answer: list[int]
    done: int = 0  # answer tokens accepted so far
    drafter: NgramDrafter | None = None
    prompt_len: int = 0
    tokens: list[int] = field(default_factory=list)


def run(requests: list[Request], batch: int, steps_accepted: list[int], rooms: list[int], history_tokens: int,
        min_match: int = 1, history_every: int = 0) -> int:
    """Drive both through the same schedule; returns how many candidates were compared. With
    ``history_every``, the reference's history takes the finished answers where the index's should:
    when they end or before a step, once ``history_every`` steps have passed since the last entry."""
    max_len = max(len(r.prompt) + len(r.answer) for r in requests) + 2
    index = BatchIndex(8, max_len + 8, history_tokens, min_match, history_every=history_every)
    history = AnswerHistory(history_tokens)
    waiting_answers: list[list[int]] = []
    entered_at = -history_every

    def enter(step: int) -> None:
        nonlocal entered_at
        if waiting_answers and step - entered_at >= history_every:
            history.add_all(waiting_answers)
            waiting_answers.clear()
            entered_at = step
    acceptance = Acceptance(0.98)
    waiting = list(requests)
    live: list[Request] = []
    compared, step = 0, 0
    while waiting or live:
        while len(live) < batch and waiting:
            live.append(waiting.pop(0))
        # Requests that finished leave (their answers go to the history, in the order they began).
        ended = [r for r in live if r.done >= len(r.answer)]
        for r in ended:
            live.remove(r)
            waiting_answers.append(r.tokens[r.prompt_len :])
        if ended:
            enter(step)
            index.end([r.rid for r in ended])
        if not live:
            continue
        rows = len(live)
        token_ids = np.zeros((rows, max_len + 8), np.int32)
        n_new = np.zeros(rows, np.int64)
        for i, r in enumerate(live):
            take = 1 + steps_accepted[(step + i) % len(steps_accepted)] if r.drafter else 1
            take = min(take, len(r.answer) - r.done)
            r.done += take
            n_new[i] = take
            r.tokens = r.prompt + r.answer[: r.done]
            token_ids[i, : len(r.tokens)] = r.tokens
            if r.drafter is None:
                r.drafter = NgramDrafter(min_match=min_match, history=history)
                r.prompt_len = len(r.tokens) - take
                r.drafter.begin(r.tokens[: r.prompt_len], [])
                index.begin(r.rid, r.prompt_len, 8)
        num_tokens = np.array([len(r.tokens) for r in live], np.int64)
        slots = np.array([index.slot_of[r.rid] for r in live], np.int64)
        room = [rooms[(step * 7 + i) % len(rooms)] for i in range(rows)]
        for i, r in enumerate(live):
            index.requests[slots[i], 7] = room[i]
        enter(step)
        index.step(slots, n_new, num_tokens, token_ids, np.zeros(rows, np.int8), acceptance.counts, 0.98)
        for i, r in enumerate(live):
            expected = r.drafter.propose(r.tokens, room[i])
            source, length, k = index.cand[i]
            got = None if source == 0 else (tuple(index.drafts[i, :k].tolist()), SOURCES[source], int(length))
            want = None if expected is None else (expected.tokens, expected.source.value, expected.match_length)
            assert got == want, (step, r.rid, r.tokens, room[i])
            assert index.tokens(r.rid).tolist() == r.tokens
            compared += 1
        step += 1
    assert len(index.history) == len(history) and index.steps == step
    return compared


@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(st.tuples(st.lists(st.integers(0, 4), max_size=30), st.lists(st.integers(0, 4), min_size=1, max_size=30)),
                  min_size=1, max_size=8),
    batch=st.integers(1, 4),
    accepted=st.lists(st.integers(0, 3), min_size=1, max_size=5),
    rooms=st.lists(st.integers(0, 8), min_size=1, max_size=5),
    history_tokens=st.sampled_from([0, 5, 20, 200]),
    min_match=st.integers(1, 3),
    history_every=st.sampled_from([0, 0, 1, 3]),
)
def test_random_streams_draft_what_the_reference_drafts(data, batch, accepted, rooms, history_tokens, min_match,
                                                        history_every) -> None:
    requests = [Request(f"r{i}", p, a) for i, (p, a) in enumerate(data)]
    run(requests, batch, accepted, rooms, history_tokens, min_match, history_every)


def _corpus_tokens() -> list[list[int]]:
    """The bundled corpus as words mapped to ids (a real token stream's repeats, no tokenizer needed)."""
    ids: dict[str, int] = {}
    texts = []
    for path in sorted(CORPUS.iterdir())[:6]:
        words = path.read_text(encoding="utf-8", errors="ignore").split()
        texts.append([ids.setdefault(w, len(ids)) for w in words[:1500]])
    return texts


def test_real_streams_with_turnover_draft_what_the_reference_drafts() -> None:
    rng = np.random.default_rng(0)
    requests = []
    for n, text in enumerate(_corpus_tokens() * 3):
        start = int(rng.integers(0, max(1, len(text) - 400)))
        prompt = text[start : start + 300]
        copy = int(rng.integers(0, 250))
        answer = prompt[copy : copy + 40] + text[: 20] + prompt[copy + 60 : copy + 100]  # copies and a jump
        requests.append(Request(f"q{n}", prompt, answer))
    compared = run(requests, 6, [0, 2, 1, 4, 0, 0, 3], [8, 4, 0, 8, 1], 400)
    assert compared > 500
    for r in requests:
        r.done, r.drafter, r.tokens = 0, None, []
    assert run(requests, 6, [0, 2, 1, 4, 0, 0, 3], [8, 4, 0, 8, 1], 400, history_every=5) == compared


def test_answers_wait_for_the_history_at_most_history_every_steps() -> None:
    index = BatchIndex(4, 100, 64, history_every=3)
    acceptance = Acceptance(0.98)
    sizes = []
    for n in range(8):  # one request ends before every step
        index.begin(f"a{n}", 2, 4)
        index.step(np.array([index.slot_of[f"a{n}"]]), np.array([1]), np.array([3]), np.array([[7, 8, n]], np.int32),
                   np.zeros(1, np.int8), acceptance.counts, 0.98)
        index.end([f"a{n}"])
        sizes.append(len(index.history))
    # Entries at steps 1 (the first answer), 4 and 7; nothing waits longer than 3 steps.
    assert sizes == [2, 2, 2, 8, 8, 8, 14, 14]


def test_automata_grow_and_rows_are_reused() -> None:
    index = BatchIndex(4, 10_000, 64)
    acceptance = Acceptance(0.98)
    for n in range(12):  # more requests than the first rows, contexts longer than the first capacity
        tokens = (list(range(300)) * 4)[: 600 + n]
        index.begin(f"x{n}", len(tokens) - 1, 4)
        token_ids = np.array([tokens], np.int32)
        index.step(np.array([index.slot_of[f"x{n}"]]), np.array([1]), np.array([len(tokens)]), token_ids,
                   np.zeros(1, np.int8), acceptance.counts, 0.98)
        source, length, k = index.cand[0]
        assert SOURCES[source] == DraftSource.PROMPT.value and index.drafts[0, :k].tolist() == tokens[len(tokens) - 300 : len(tokens) - 296]
        if n % 3 == 2:
            index.end(list(index.slot_of))
    assert index.automata.capacity >= 611 and len(index) <= 3


def test_ended_requests_come_in_the_order_they_began_and_a_restart_keeps_its_place() -> None:
    index = BatchIndex(4, 64, 32)
    for rid in ("c", "a", "d", "b"):
        index.begin(rid, 3, 4)
    index.begin("c", 5, 4)  # restarted (preempted): still the first to have begun
    assert index.in_order([]) == []
    assert index.in_order(["b", "a", "c", "never"]) == ["c", "a", "b"]
    assert index.in_order({"d"}) == ["d"]
    index.end(["c", "a"])
    index.begin("e", 2, 4)
    assert index.in_order(["e", "b", "d", "c"]) == ["d", "b", "e"]
