"""The repetition stop against a brute-force scan: the answer ends where it starts repeating itself."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.engine.config import GenerationConfig, GenerationConfigError
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.engine.policy import FixedPolicy
from ragspec.engine.text import (
    CUT_FINISH_REASONS,
    MIN_SENTENCE,
    RepeatGuard,
    StopTextAssembler,
    WholeWordText,
    sentence_end_tokens,
    whole_words,
)

from tests.ragspec.tiny import byte_tokenizer, tiny_model


def first_repeat(ids: Sequence[int], n: int) -> int | None:
    """Where the first ``n``-token span that occurred earlier (overlaps allowed) begins, by scanning."""
    for end in range(n, len(ids) + 1):
        span = list(ids[end - n : end])
        if any(list(ids[i : i + n]) == span for i in range(end - n)):
            return end - n
    return None


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 3), max_size=60), n=st.integers(2, 6), cuts=st.lists(st.integers(1, 9), max_size=20))
def test_repeat_guard_finds_the_first_repeat_however_the_tokens_arrive(ids: list[int], n: int, cuts: list[int]) -> None:
    guard, at, found = RepeatGuard(n), 0, None
    for size in [*cuts, len(ids)]:  # tokens arrive in pieces, as verified drafts do
        found = guard.add(ids[at : at + size])
        at += size
        if found is not None or at >= len(ids):
            break
    assert found == first_repeat(ids, n)
    if found is None:  # the tail held back: the longest suffix (< n) that occurred before
        tail = max((k for k in range(1, min(n, len(ids) + 1)) if any(ids[i : i + k] == ids[-k:] for i in range(len(ids) - k))),
                   default=0)
        assert guard.tail == tail


def first_repeat_or_sentence(ids: Sequence[int], n: int, ends: Callable[[int], bool]) -> int | None:
    """Where the answer first repeats ``n`` tokens or a whole sentence (of ``MIN_SENTENCE`` tokens or
    more), by scanning: at each token, the rules that fire there; the answer ends at the first."""
    starts = [0] + [i + 1 for i, t in enumerate(ids) if ends(t)]
    sentences = [tuple(ids[a:b]) for a, b in zip(starts, starts[1:])]
    for end in range(1, len(ids) + 1):
        if end >= n and any(list(ids[i : i + n]) == list(ids[end - n : end]) for i in range(end - n)):
            return end - n
        if end in starts[1:]:
            k = starts.index(end) - 1
            if len(sentences[k]) >= MIN_SENTENCE and sentences[k] in sentences[:k]:
                return starts[k]
    return None


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 4), max_size=60), n=st.integers(4, 12), cuts=st.lists(st.integers(1, 9), max_size=20))
def test_repeat_guard_finds_a_repeated_sentence_too(ids: list[int], n: int, cuts: list[int]) -> None:
    ends = (0).__eq__  # token 0 ends a sentence
    guard, at, found = RepeatGuard(n, ends), 0, None
    for size in [*cuts, len(ids)]:
        found = guard.add(ids[at : at + size])
        at += size
        if found is not None or at >= len(ids):
            break
    assert found == first_repeat_or_sentence(ids, n, ends)
    if found is None:  # the sentence so far is held back while an earlier sentence begins with it
        current = tuple(ids[max([i + 1 for i, t in enumerate(ids) if t == 0], default=0) :])
        starts = [0] + [i + 1 for i, t in enumerate(ids) if t == 0]
        earlier = [tuple(ids[a:b]) for a, b in zip(starts, starts[1:]) if b - a >= MIN_SENTENCE]
        if current and any(e[: len(current)] == current for e in earlier):
            assert guard.tail >= len(current)


def test_a_numbered_list_that_loops_a_short_sentence_ends_after_its_first_turn() -> None:
    tok = byte_tokenizer()
    text = "".join(f"{i}. The pool is locked.\n" for i in range(1, 6))  # 40 tokens never repeat here...
    assembler = StopTextAssembler(tok, (), repetition_stop=40)  # ... but the sentence does
    shown = ""
    for t in tok.encode(text):
        update = assembler.add([t])
        shown += update.delta
        if update.stopped:
            break
    assert update.repeated and shown + assembler.flush() == assembler.text
    assert assembler.text == "1. The pool is locked.\n2."
    assert not sentence_end_tokens(tok)(tok.encode("a")[0]) and sentence_end_tokens(tok)(tok.encode("?")[0])


def test_the_assembler_drops_a_repeat_that_began_in_held_back_tokens() -> None:
    tok = byte_tokenizer()
    ids = tok.encode("abcdefg-abcdefg-abcdefg")
    assembler = StopTextAssembler(tok, (), repetition_stop=5)
    shown, update = "", None
    for t in ids:
        update = assembler.add([t])
        shown += update.delta
        if update.stopped:
            break
    assert update is not None and update.repeated and update.stopped
    shown += assembler.flush()
    assert assembler.text == shown == "abcdefg-" and tok.decode(assembler.ids) == "abcdefg-"


def test_a_stop_string_before_the_repeat_wins() -> None:
    tok = byte_tokenizer()
    assembler = StopTextAssembler(tok, ("-",), repetition_stop=3)
    update = assembler.add(tok.encode("abc-abc"))
    assert update.stopped and not update.repeated and assembler.text == "abc"


def test_repetition_stop_is_validated() -> None:
    assert GenerationConfig(repetition_stop=12).repetition_stop == 12
    for bad in (1, -1, 2.5):
        with pytest.raises(GenerationConfigError, match="repetition_stop"):
            GenerationConfig(repetition_stop=bad)


@pytest.mark.parametrize("seed", range(6))
def test_the_answer_is_the_plain_answer_cut_where_it_first_repeats_itself(seed: int) -> None:
    lm = tiny_model(257, seed, layers=1)  # a random model loops soon
    prompt = [random.Random(seed).randrange(256) for _ in range(12)]
    gen = SpeculativeGenerator(lm, policy=FixedPolicy(k=6, min_match=1))
    whole = gen.generate(prompt, max_new_tokens=120, speculation=False)
    cut = first_repeat_or_sentence(whole.token_ids, 8, sentence_end_tokens(lm.tokenizer))
    for speculative in (False, True):
        with gen.stream(prompt, max_new_tokens=120, repetition_stop=8, speculation=speculative) as stream:
            shown = "".join(stream)
        result = stream.result
        assert result is not None and shown == result.text
        if cut is None:
            assert result.token_ids == whole.token_ids and result.finish_reason == whole.finish_reason
        else:
            assert result.token_ids == whole.token_ids[:cut] and result.finish_reason == "repetition"
            assert result.text == lm.tokenizer.decode(whole.token_ids[:cut], skip_special_tokens=True)
            assert result.stats.new_tokens == cut
            # tokens per forward counts what the forwards produced, the cut repeat included: plain decoding
            # produces one token a forward, also when the stop then drops the repeat
            assert result.stats.decoded_tokens > cut
            if not speculative:
                assert result.stats.tokens_per_forward == 1.0
    if seed == 0:
        assert cut is not None, "the random model looped: the stop was exercised"


# -- whole words at a cut end -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "whole"),
    [
        ("Robert Boyle refined his work by refining his work by re", "Robert Boyle refined his work by refining his work by"),
        ("The answer is: The", "The answer is:"),
        ("It is 23.", "It is 23."),
        ("It is twenty-thr", "It is"),  # a hyphenated word is one word
        ("It is 4.18", "It is"),  # so is a number with its dots, colons or commas
        ("at 11:3", "at"),
        ("don't", ""),
        ("Ends here\n\n", "Ends here"),
        ("(1963)", "(1963)"),
        ("", ""),
        ("x" * 600, "x" * 344),  # a last word longer than 256 characters is cut to its last 256
    ],
)
def test_whole_words(text, whole):
    assert whole_words(text) == whole


def reference_whole_words(text: str) -> str:
    """Brute force: when the text ends in a word character, drop its longest suffix that is one word
    (letters, digits, "_", apostrophes, joined by single "-", ".", ":" or ","); then the white space it ends with."""
    import re

    word = re.compile(r"[\w'’]+(?:[-.:,][\w'’]+)*")
    end = len(text)
    if text and re.match(r"[\w'’]", text[-1]):
        end = min(start for start in range(len(text)) if word.fullmatch(text[start:]))
    return text[:end].rstrip()


@given(st.text(alphabet="ab1 .-:\n'", max_size=40))
def test_whole_words_against_brute_force(text):
    assert whole_words(text) == reference_whole_words(text)


@given(st.text(alphabet="ab1 .-\n", max_size=40), st.lists(st.integers(0, 40), max_size=8),
       st.sampled_from(["eos", "stop", *CUT_FINISH_REASONS]))
def test_whole_word_text_never_takes_back_and_ends_at_a_whole_word(text, cuts, finish):
    held, shown, points = WholeWordText(), [], sorted({min(c, len(text)) for c in cuts} | {len(text)})
    start = 0
    for point in points:
        shown.append(held.add(text[start:point]))
        assert text.startswith("".join(shown))  # what is shown is the text's start, never retracted
        start = point
    before = "".join(shown)
    shown.append(held.finish(text, finish))
    final = "".join(shown)
    assert final == held.shown
    if finish in CUT_FINISH_REASONS:
        assert final == max(whole_words(text), before, key=len)  # whole words, or what was shown already
    else:
        assert final == text
