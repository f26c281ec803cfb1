"""The n-gram index against brute-force scans of the same token sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.engine.drafting import DraftSource
from ragspec.engine.ngram import NgramDrafter, SuffixAutomaton, _Matcher

tokens = st.lists(st.integers(0, 3), max_size=40)  # a tiny alphabet makes repeats likely


def occurrences(ref: list[int], pattern: list[int]) -> list[int]:
    """End positions of every occurrence of ``pattern`` in ``ref`` (naive scan)."""
    n = len(pattern)
    return [i + n - 1 for i in range(len(ref) - n + 1) if ref[i : i + n] == pattern]


def brute_reference_match(ref: list[int], context: list[int], k: int) -> tuple[int, tuple[int, ...]]:
    """Longest suffix of ``context`` whose first occurrence in ``ref`` has a continuation."""
    for length in range(len(context), 0, -1):
        ends = occurrences(ref, context[len(context) - length :])
        if ends and ends[0] + 1 < len(ref):
            return length, tuple(ref[ends[0] + 1 : ends[0] + 1 + k])
    return 0, ()


def brute_self_match(context: list[int]) -> tuple[int, int]:
    """Longest suffix of ``context`` that also ends earlier; returns (length, first end)."""
    for length in range(len(context) - 1, 0, -1):
        ends = occurrences(context[:-1], context[len(context) - length :])
        if ends:
            return length, ends[0]
    return 0, -1


@settings(max_examples=300, deadline=None)
@given(ref=tokens, context=tokens, k=st.integers(1, 5))
def test_matcher_finds_longest_suffix_with_continuation(ref: list[int], context: list[int], k: int) -> None:
    m = _Matcher(SuffixAutomaton(ref))
    for i, t in enumerate(context):
        m.advance(t)
        # After every appended token, not only at the end: the index is incremental.
        assert m.sam.continuation(m.state, m.length, k) == brute_reference_match(ref, context[: i + 1], k)


@settings(max_examples=300, deadline=None)
@given(context=st.lists(st.integers(0, 3), min_size=1, max_size=60))
def test_self_automaton_matches_earlier_occurrence(context: list[int]) -> None:
    sam = SuffixAutomaton()
    for i, t in enumerate(context):
        sam.extend(t)
        state = sam.link[sam.last]
        length = sam.length[state] if state > 0 else 0
        expected_length, expected_end = brute_self_match(context[: i + 1])
        assert length == expected_length
        if length:
            assert sam.first_end[state] == expected_end


@settings(max_examples=200, deadline=None)
@given(refs=st.lists(tokens, max_size=4), prompt=st.lists(st.integers(0, 3), min_size=1, max_size=20),
       output=tokens, k=st.integers(1, 6))
def test_drafter_picks_longest_match_over_all_references(
    refs: list[list[int]], prompt: list[int], output: list[int], k: int
) -> None:
    drafter = NgramDrafter()
    drafter.begin(prompt, refs)
    context = list(prompt)
    for t in [None, *output]:  # propose before any output, then after each generated token
        if t is not None:
            context.append(t)
        draft = drafter.propose(context, k)
        best = max([brute_reference_match(r, context, k)[0] for r in refs] + [brute_self_match(context)[0]])
        if best == 0:
            assert draft is None
            continue
        assert draft is not None and draft.match_length == best and 1 <= len(draft) <= k
        # The proposal really is what followed the suffix in the reference it names.
        if draft.source == DraftSource.PASSAGE:
            assert brute_reference_match(refs[draft.reference], context, k) == (best, draft.tokens)
        else:
            length, end = brute_self_match(context)
            assert length == best
            assert draft.tokens == tuple(context[end + 1 : end + 1 + k])
            assert draft.source == (DraftSource.PROMPT if end + 1 < len(prompt) else DraftSource.OUTPUT)


def test_passage_wins_ties_and_names_its_passage() -> None:
    drafter = NgramDrafter()
    prompt = [1, 2, 3, 4, 0, 1, 2]  # "1 2" occurs earlier in the prompt and in passage 1
    drafter.begin(prompt, [[7, 7], [5, 1, 2, 8, 8]])
    draft = drafter.propose(prompt, 3)
    assert draft is not None
    assert (draft.source, draft.reference, draft.match_length, draft.tokens) == (DraftSource.PASSAGE, 1, 2, (8, 8))


def test_empty_references_and_min_match() -> None:
    drafter = NgramDrafter(min_match=3)
    drafter.begin([1, 2, 3], [[], []])
    assert drafter.propose([1, 2, 3], 4) is None
    assert drafter.propose([1, 2, 3, 1, 2], 4) is None  # a 2-token match is below min_match
    draft = drafter.propose([1, 2, 3, 1, 2, 3], 4)
    assert draft is not None and draft.tokens == (1, 2, 3) and draft.match_length == 3


def test_history_remembers_earlier_answers_without_crossing_them() -> None:
    drafter = NgramDrafter(history_tokens=10)
    drafter.begin([0], [])
    drafter.finish([10, 11, 12])
    drafter.finish([20, 21, 22])
    drafter.begin([0], [])
    draft = drafter.propose([0, 11], 5)
    assert draft is not None and draft.source == DraftSource.HISTORY and draft.tokens == (12,)
    drafter.begin([0], [])
    assert drafter.propose([0, 12], 5) is None  # the end of one answer does not run into the next
    drafter.finish([30, 31, 32, 33, 34])  # pushes the oldest answer out of the 10-token budget
    drafter.begin([0], [])
    assert drafter.propose([0, 11], 5) is None
    drafter.begin([0], [])
    assert drafter.propose([0, 21], 5).tokens == (22,)


def test_invalid_parameters_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="min_match"):
        NgramDrafter(min_match=0)
    with pytest.raises(ValueError, match="history_tokens"):
        NgramDrafter(history_tokens=-1)


def test_the_automaton_class_indexes_passages_and_earlier_answers() -> None:
    class Sevens(SuffixAutomaton):
        """Continues every match with 7s (a stand-in for another continuation rule)."""

        def continuation(self, state: int, length: int, max_tokens: int) -> tuple[int, tuple[int, ...]]:
            found, tokens = super().continuation(state, length, max_tokens)
            return found, tuple(7 for _ in tokens)

    drafter = NgramDrafter(history_tokens=10, automaton=Sevens)
    drafter.begin([0], [[1, 2, 3]])
    assert drafter.propose([0, 1], 2).tokens == (7, 7)  # a passage (it continues with 2, 3)
    drafter.finish([4, 5, 6])
    drafter.begin([0], [])
    assert drafter.propose([0, 4], 2).tokens == (7, 7)  # an earlier answer (5, 6)
    assert NgramDrafter().propose([0, 4], 2) is None


class _Reads:
    count = 0


class _CountingList(list):
    """A list that counts reads by index: the unit of work of an automaton walk."""

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        _Reads.count += 1
        return super().__getitem__(i)


class _CountingAutomaton(SuffixAutomaton):
    """A suffix automaton whose every table read is counted (after it is built)."""

    def __init__(self, tokens=()) -> None:  # type: ignore[no-untyped-def]
        super().__init__(tokens)
        for name in ("tokens", "next", "link", "length", "first_end"):
            setattr(self, name, _CountingList(getattr(self, name)))


def _reads_per_drafted_token(n_ref_tokens: int, monkeypatch: pytest.MonkeyPatch, vocab: int = 2000) -> float:
    import random

    import ragspec.engine.ngram

    monkeypatch.setattr(ragspec.engine.ngram, "SuffixAutomaton", _CountingAutomaton)  # the running context's automaton too
    rng = random.Random(0)
    refs = [[rng.randrange(vocab) for _ in range(n_ref_tokens // 4)] for _ in range(4)]
    drafter = NgramDrafter(automaton=_CountingAutomaton)
    prompt = [t for r in refs for t in r]
    drafter.begin(prompt, refs)
    context = list(prompt)
    drafter.propose(context, 8)  # index the prompt
    _Reads.count = 0
    for i in range(400):
        # Half copies from a passage, half fresh tokens: both the match and the miss paths.
        context.append(refs[i % 4][i % len(refs[0])] if i % 2 else rng.randrange(vocab))
        drafter.propose(context, 8)
    return _Reads.count / 400


def test_drafting_work_per_token_does_not_grow_with_reference_length(monkeypatch: pytest.MonkeyPatch) -> None:
    small = _reads_per_drafted_token(500, monkeypatch)
    large = _reads_per_drafted_token(8000, monkeypatch)
    # Amortized constant per step (counted table reads, no clock): a rescan would read the
    # 8,000 reference tokens at every step, 16x the work at 500.
    assert 0 < small and large < 2 * small, (small, large)
