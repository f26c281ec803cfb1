"""Turning accepted tokens into text: incremental decoding, stop strings and the repetition stop.

Streaming must never emit text it later takes back. Three things could force that: a token that
ends in the middle of a UTF-8 character (decoded as U+FFFD until the next token completes it),
the start of a stop string, which is only known to be a stop once it is complete, and the start
of a repeat of the answer's own tokens or sentences (see ``RepeatGuard``). So the tail that could still be
any of them is held back until the next tokens settle it.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"
CUT_FINISH_REASONS = ("length", "repetition")
"""Finish reasons of an answer that did not end by itself: ``max_tokens`` or the repetition stop cut it."""


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (from undecodable bytes: ``surrogateescape``, bad JSON escapes)
    replaced by U+FFFD, so that tokenizers, which take valid Unicode only, accept it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_REPLACEMENT if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


def encode(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, text: str | Sequence[int], *, special_tokens: bool,
    what: str = "the prompt",
) -> list[int]:
    """Token ids of ``text`` (lone surrogates, which no tokenizer takes, become U+FFFD); ids pass
    through, checked against the vocabulary (``ValueError`` for one outside ``[0, vocab_size)``).
    Anything else (bytes, floats, None) is a ``TypeError`` naming ``what`` it was given as."""
    if isinstance(text, str):
        return list(tokenizer.encode(clean_text(text), add_special_tokens=special_tokens))
    if isinstance(text, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be text or token ids, got {type(text).__name__}: decode it first (data.decode())")
    if not isinstance(text, Sequence) and not hasattr(text, "__array__"):
        raise TypeError(f"{what} must be text or a sequence of token ids, got {type(text).__name__}")
    ids = [_token_id(t, what) for t in text]
    if (bad := next((t for t in ids if not 0 <= t < vocab_size), None)) is not None:
        raise ValueError(f"token id {bad} is outside the model's vocabulary [0, {vocab_size})")
    return ids


def _token_id(value: object, what: str) -> int:
    """``value`` as a token id: an integer (numpy's included), never a float or a bool."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: token ids are integers, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what}: token ids are integers, got {type(value).__name__} {value!r:.40}") from None


def question_text(question: object) -> str:
    """A question as the prompt takes it: white space around it gone, ``clean_text``; ``ValueError`` when
    it is not a string or nothing is left. Every way a question comes in (``DocumentQA``, the web
    app's ``/api/ask``) goes through this once."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("the question must be a non-empty string")
    return clean_text(question.strip())


MIN_SENTENCE = 4
"""The fewest tokens a sentence has for its repeat to end the answer (not "Yes." or a list's "2.")."""


class RepeatGuard:
    """Finds where an answer starts repeating ``n`` or more of its own tokens verbatim, or a whole
    sentence of its own.

    The answer then ends where the repeat begins: the first occurrence stays, the copy goes (when
    the two overlap, as in a loop of a short phrase, the loop's first turns stay). A sentence is the
    tokens after the previous sentence end up to a token in ``sentence_ends`` (one whose text ends
    with ".", "!", "?" or a line break), at least ``MIN_SENTENCE`` of them: a loop of a short sentence
    in a numbered list ("1. The pool is locked. 2. The pool is locked. ...") never repeats ``n``
    tokens, since its numbers differ. ``tail`` is how many of the latest tokens could still become a
    repeat (a suffix that occurred before, fewer than ``n``, or the sentence so far when it begins an
    earlier one): their text is held back. Every ``L``-gram (``L <= n``) and every prefix of a
    finished sentence is indexed once.
    """

    def __init__(self, n: int, sentence_ends: Callable[[int], bool] | None = None) -> None:
        if n < 2:
            raise ValueError(f"a repeat is at least 2 tokens, got {n}")
        self.n = n
        self.ids: list[int] = []
        self._seen: set[tuple[int, ...]] = set()
        self._sentence_ends = sentence_ends
        self._sentences: set[tuple[int, ...]] = set()
        self._sentence_prefixes: set[tuple[int, ...]] = set()
        self._sentence_start = 0
        self.tail = 0

    def add(self, tokens: Sequence[int]) -> int | None:
        """Take tokens; the index in the answer where a repeat begins, or None."""
        for token in tokens:
            self.ids.append(token)
            end, tail = len(self.ids), 0
            for length in range(1, min(self.n, end) + 1):
                gram = tuple(self.ids[end - length :])
                if gram in self._seen:
                    if length == self.n:
                        return end - self.n
                    tail = length
                else:
                    self._seen.add(gram)
            if self._sentence_ends is not None:
                sentence = tuple(self.ids[self._sentence_start :])
                if self._sentence_ends(token):
                    if len(sentence) >= MIN_SENTENCE:
                        if sentence in self._sentences:
                            return self._sentence_start
                        self._sentences.add(sentence)
                        self._sentence_prefixes.update(sentence[:k] for k in range(1, len(sentence) + 1))
                    self._sentence_start = end
                elif sentence in self._sentence_prefixes:
                    tail = max(tail, len(sentence))
            self.tail = tail
        return None


def sentence_end_tokens(tokenizer: PreTrainedTokenizerBase) -> Callable[[int], bool]:
    """Whether a token's text ends a sentence (ends with ".", "!", "?" or a line break), cached per id."""
    ends: dict[int, bool] = {}

    def ends_sentence(token: int) -> bool:
        if token not in ends:
            ends[token] = tokenizer.decode([token]).rstrip(" ").endswith((".", "!", "?", "\n"))
        return ends[token]

    return ends_sentence


@dataclass
class TextUpdate:
    """What one batch of accepted tokens changed."""

    delta: str
    """Text that is now safe to show (never retracted later)."""
    n_tokens: int
    """How many of the offered tokens were kept (fewer when a stop string completed)."""
    stopped: bool
    """A stop string completed (or the answer repeated itself); generation must end."""
    repeated: bool = False
    """The answer started repeating itself: ``n_tokens`` of the offered tokens are kept and the
    answer is ``StopTextAssembler.ids``, which may have dropped earlier (held back) tokens too."""


class StopTextAssembler:
    """Decodes generated tokens incrementally, cutting the text before the first stop string."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str] = (), repetition_stop: int = 0) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._guard = RepeatGuard(repetition_stop, sentence_end_tokens(tokenizer)) if repetition_stop else None
        self._ids: list[int] = []
        self._emitted = ""
        self.text = ""
        """The full text so far, without any stop string."""

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def _find_stop(self, text: str) -> int:
        """Index of the earliest stop string in ``text``, or -1."""
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else -1

    @property
    def ids(self) -> list[int]:
        """The answer's tokens kept so far."""
        return list(self._ids)

    def add(self, tokens: Sequence[int]) -> TextUpdate:
        """Offer newly accepted tokens; returns the safe text delta."""
        repeat = self._guard.add(tokens) if self._guard is not None else None
        if repeat is None:
            return self._add(tokens)
        kept = max(0, repeat - len(self._ids))
        del self._ids[repeat:]  # their text was held back, never shown (see ``add``'s hold-back)
        update = self._add(tokens[:kept])
        if update.stopped:  # a stop string before the repeat wins
            return update
        self.text = self._decode(self._ids)
        return TextUpdate(update.delta, update.n_tokens, True, repeated=True)

    def _add(self, tokens: Sequence[int]) -> TextUpdate:
        text = self._decode(self._ids + list(tokens))
        kept = len(tokens)
        stop_at = self._find_stop(text) if self._stop else -1
        if stop_at >= 0:
            # Keep tokens up to the one that completed the stop string.
            for kept in range(1, len(tokens) + 1):
                if self._find_stop(self._decode(self._ids + list(tokens[:kept]))) >= 0:
                    break
            text = text[:stop_at]
        self._ids.extend(tokens[:kept])
        self.text = text
        if stop_at >= 0:
            return TextUpdate(self._take(text), kept, True)
        held = self._holdback(text)
        if self._guard is not None and self._guard.tail:  # the text of tokens that may start a repeat
            held = max(held, len(text) - len(self._decode(self._ids[: -self._guard.tail])))
        return TextUpdate(self._take(text[: len(text) - held]), kept, False)

    def flush(self) -> str:
        """Generation ended without a stop string: release whatever was held back."""
        return self._take(self.text)

    def _take(self, safe: str) -> str:
        if not safe.startswith(self._emitted):
            # Decoding changed earlier text (a tokenizer that merges across tokens); emit nothing
            # until it agrees again rather than contradict what was already shown.
            return ""
        delta = safe[len(self._emitted) :]
        self._emitted = safe
        return delta

    def _holdback(self, text: str) -> int:
        """Length of the tail that may still turn into a stop string or a full character."""
        n = len(text) - len(text.rstrip(_REPLACEMENT))
        for s in self._stop:
            for length in range(min(len(s) - 1, len(text)), n, -1):
                if text.endswith(s[:length]):
                    n = max(n, length)
                    break
        return n


# The last word of a text with the white space before it (or the white space a text ends with): letters, digits, "_" and apostrophes, joined
# by single hyphens, dots, colons or commas ("twenty-three", "don't", "11:30", "4.1875", "1,000").
_LAST_WORD = re.compile(r"(?:\s*[\w'’]+(?:[-.:,][\w'’]+)*|\s*)\Z")


_LONGEST_WORD = 256
"""The longest last word ``whole_words`` recognises whole; a longer one is cut to its last 256 characters' word."""


def whole_words(text: str) -> str:
    """``text`` up to its last whole word: without its last word and the white space before it when it
    ends in one (nothing after it says the word is complete), and without the white space it ends
    with. ``"refining his work by re"`` -> ``"refining his work by"``; ``"It is 23."`` stays as it is."""
    tail = max(0, len(text) - _LONGEST_WORD)  # searched from there only: linear in the text, whatever it holds
    return text[: tail + _LAST_WORD.search(text, tail).start() - tail]  # type: ignore[union-attr]  # matches every text


class WholeWordText:
    """Holds back the last word of streamed text until what follows shows it complete, so that an
    answer cut by ``max_tokens`` or the repetition stop never shows a partial word and nothing shown
    is taken back.

    ``add(delta)`` returns what is safe to show: the text up to its last whole word (``whole_words``).
    ``finish(text, finish_reason)`` returns the rest of the answer's final text, which is ``text``
    (all the kept tokens' text) when the answer ended by itself, and ``whole_words(text)`` when it was
    cut (``CUT_FINISH_REASONS``), never shorter than what was shown. The deltas shown add up to ``text``
    as ``finish`` leaves it.
    """

    def __init__(self) -> None:
        self._text = ""
        self.shown = ""
        """What ``add`` and ``finish`` returned so far, together."""

    def add(self, delta: str) -> str:
        self._text += delta
        return self._show(whole_words(self._text))

    def finish(self, text: str, finish_reason: str) -> str:
        """The last delta; ``self.shown`` is then the answer's final text."""
        final = whole_words(text) if finish_reason in CUT_FINISH_REASONS else text
        return self._show(final if len(final) >= len(self.shown) else self.shown)

    def _show(self, safe: str) -> str:
        if len(safe) <= len(self.shown) or not safe.startswith(self.shown):
            return ""
        delta, self.shown = safe[len(self.shown) :], safe
        return delta
