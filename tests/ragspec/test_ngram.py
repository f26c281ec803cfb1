"""The n-gram index against brute-force scans of the same token sequences."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.drafting import DraftSource
from ragspec.ngram import NgramDrafter, SuffixAutomaton, _Matcher

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


def _drafting_cost_per_token(n_ref_tokens: int, vocab: int = 2000) -> float:
    import random

    rng = random.Random(0)
    refs = [[rng.randrange(vocab) for _ in range(n_ref_tokens // 4)] for _ in range(4)]
    drafter = NgramDrafter()
    prompt = [t for r in refs for t in r]
    drafter.begin(prompt, refs)
    context = list(prompt)
    drafter.propose(context, 8)  # index the prompt
    start = time.perf_counter()
    for i in range(400):
        # Half copies from a passage, half fresh tokens: both the match and the miss paths.
        context.append(refs[i % 4][i % len(refs[0])] if i % 2 else rng.randrange(vocab))
        drafter.propose(context, 8)
    return (time.perf_counter() - start) / 400


def test_drafting_cost_does_not_grow_with_reference_length() -> None:
    small = min(_drafting_cost_per_token(500) for _ in range(3))
    large = min(_drafting_cost_per_token(8000) for _ in range(3))
    # Constant per step up to noise: a rescan would be ~16x slower at 8,000 tokens.
    assert large < 3 * small, (small, large)
