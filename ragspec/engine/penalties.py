"""Repetition penalties, applied once per verified position so that speculation stays exact.

At each position the target scores, the logits are changed from the answer's tokens *before that
position*: the tokens accepted so far plus the drafted tokens in front of it in the same verify
forward. Plain decoding changes its one position from the tokens accepted so far, which is the
same history, so greedy speculative output is token-identical to greedy plain decoding with the
same penalties and rejection sampling verifies against the same penalised distribution.

For a token ``t`` seen ``c(t)`` times in the answer so far (the prompt is never counted, so a copy
from the passages is not punished):

- OpenAI: ``logit[t] -= c(t) * frequency_penalty + (c(t) > 0) * presence_penalty``.
- llama.cpp / Ollama: when ``t`` is among the last ``repeat_last_n`` answer tokens,
  ``logit[t] /= repeat_penalty`` if positive, else ``logit[t] *= repeat_penalty``. llama.cpp's
  server also puts the prompt's tokens into that window and applies its frequency and presence
  penalties over the window only; ragspec counts answer tokens only, over the whole answer for
  OpenAI's two.

The repeat penalty is applied first, then the subtractions (llama.cpp's order); both before the
grammar mask, temperature, top-k and top-p.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from ragspec.engine.config import GenerationConfig


class Penalties:
    """Penalised logits after each draft prefix (the ``ragspec.engine.sampling.Mask`` interface)."""

    def __init__(self, config: GenerationConfig) -> None:
        self.frequency = config.frequency_penalty
        self.presence = config.presence_penalty
        self.repeat = config.repeat_penalty if config.repeat_last_n != 0 else 1.0
        self.last_n = config.repeat_last_n
        self.out: list[int] = []
        self.counts: Counter[int] = Counter()

    def advance(self, tokens: Sequence[int]) -> None:
        self.out.extend(tokens)
        self.counts.update(tokens)

    def mask(self, logits: torch.Tensor, drafted: Sequence[int]) -> torch.Tensor:
        """``logits`` ``[1 + k, vocab]``, row ``j`` penalised from the answer plus ``drafted[:j]``."""
        if not self.out and not drafted:
            return logits
        ids = sorted(self.counts.keys() | set(drafted))  # only tokens seen can be penalised
        column = {t: i for i, t in enumerate(ids)}
        rows = logits.shape[0]
        # Occurrences in seq[:i] for each i, where seq is the window's old tokens, then the draft.
        old = self.out[-self.last_n :] if self.last_n > 0 else []
        seq = [*old, *drafted]
        onehot = torch.zeros(len(seq) + 1, len(ids))
        onehot[torch.arange(1, len(seq) + 1), torch.tensor([column[t] for t in seq], dtype=torch.long)] = 1.0
        prefix = onehot.cumsum(0)  # [len(seq) + 1, m]
        ends = torch.arange(rows) + len(old)  # row j has seen seq[:len(old) + j]
        drafted_before = prefix[ends] - prefix[len(old)]  # [rows, m]: in drafted[:j]
        counts = torch.tensor([float(self.counts[t]) for t in ids]) + drafted_before  # [rows, m]
        scores = logits[:, ids]  # [rows, m]
        if self.repeat != 1.0:
            recent = counts if self.last_n < 0 else prefix[ends] - prefix[(ends - self.last_n).clamp(min=0)]
            repeated = torch.where(scores <= 0, scores * self.repeat, scores / self.repeat)
            scores = torch.where(recent > 0, repeated, scores)
        if self.frequency or self.presence:
            scores = scores - (counts * self.frequency + (counts > 0) * self.presence).to(scores.dtype)
        penalised = logits.clone()
        penalised[:, ids] = scores
        return penalised
