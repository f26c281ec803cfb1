"""Drafts: what a drafter proposes, and the interface every drafter implements."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, Sequence

import torch


class DraftSource(str, Enum):
    """Where a drafted token came from; stats are kept per source."""

    PASSAGE = "passage"  # a retrieved passage handed in as a reference
    PROMPT = "prompt"  # the prompt itself
    OUTPUT = "output"  # the tokens generated so far in this answer
    HISTORY = "history"  # earlier answers (cross-request index)
    MODEL = "model"  # a small draft model
    ORACLE = "oracle"  # the target's own continuation (benchmarks only)
    GRAMMAR = "grammar"  # tokens a constraint's grammar forces (JSON keys, punctuation)


@dataclass(frozen=True)
class Draft:
    """Tokens proposed to follow the current context.

    ``probs`` holds the draft distribution of each token (``[k, vocab]``) for drafters that
    sample; it is ``None`` for deterministic drafts (n-gram copies), which rejection sampling then
    treats as one-hot. ``match_length`` is how many context tokens the n-gram match spans (0 for
    other drafters) and ``reference`` the index of the passage a copy came from. The last
    ``forced`` tokens were forced by a constraint's grammar (drafted for free after the rest).

    A sampled draft cut at a token the grammar rejects keeps that token's draft distribution as
    one extra row of ``probs`` (``[k + 1, vocab]``; see ``ragspec.engine.constraints.Grammar.cut``).
    """

    tokens: tuple[int, ...]
    source: DraftSource
    match_length: int = 0
    reference: int | None = None
    probs: torch.Tensor | None = None
    forced: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, k: int) -> Draft:
        """The first ``k`` tokens of this draft."""
        if k >= len(self.tokens):
            return self
        probs = None if self.probs is None else self.probs[:k]
        forced = max(0, self.forced - (len(self.tokens) - k))
        return Draft(self.tokens[:k], self.source, self.match_length, self.reference, probs, forced)


class Drafter(Protocol):
    """Proposes tokens to follow a context; the target model verifies them.

    One request is ``begin``, any number of ``propose``/``feedback`` rounds, then ``finish``. The
    ``context`` passed to ``propose`` is the prompt followed by every token accepted so far; it
    only ever grows during a request, so a drafter may index it incrementally.
    """

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]]) -> None:
        """Start a request: ``references`` are the token ids of each retrieved passage."""
        ...

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        """Up to ``max_tokens`` tokens likely to follow ``context``; ``None`` when there is nothing."""
        ...

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        """How many leading tokens of ``draft`` the target accepted."""
        ...

    def finish(self, output: Sequence[int]) -> None:
        """The request is over; ``output`` is everything it generated."""
        ...
