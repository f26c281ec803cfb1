"""Turning accepted tokens into text: incremental decoding and stop strings.

Streaming must never emit text it later takes back. Two things could force that: a token that
ends in the middle of a UTF-8 character (decoded as U+FFFD until the next token completes it),
and the start of a stop string, which is only known to be a stop once it is complete. So the
tail that could still be either is held back until the next tokens settle it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (from undecodable bytes: ``surrogateescape``, bad JSON escapes)
    replaced by U+FFFD, so that tokenizers, which take valid Unicode only, accept it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_REPLACEMENT if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


@dataclass
class TextUpdate:
    """What one batch of accepted tokens changed."""

    delta: str
    """Text that is now safe to show (never retracted later)."""
    n_tokens: int
    """How many of the offered tokens were kept (fewer when a stop string completed)."""
    stopped: bool
    """A stop string completed; generation must end."""


class StopTextAssembler:
    """Decodes generated tokens incrementally, cutting the text before the first stop string."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str] = ()) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
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

    def add(self, tokens: Sequence[int]) -> TextUpdate:
        """Offer newly accepted tokens; returns the safe text delta."""
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
        return TextUpdate(self._take(text[: len(text) - self._holdback(text)]), kept, False)

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
