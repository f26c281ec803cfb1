"""Deciding which drafted tokens the target keeps: greedy agreement or rejection sampling.

Rejection sampling (Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318): drafted
token ``x`` with draft probability ``q(x)`` is kept with probability ``min(1, p(x) / q(x))``,
where ``p`` is the target's (warped) distribution at that position. At the first rejection the
replacement is drawn from ``max(0, p - q)`` renormalised; when every drafted token is kept, a
bonus token is drawn from the target's next distribution. Each emitted token is then distributed
exactly as in plain sampling from the target. An n-gram copy is a deterministic draft, i.e. a
one-hot ``q``: it is kept with probability ``p(x)`` and the replacement is drawn from ``p``
with ``x`` removed.

Under a constraint (``MaskedAcceptor``) the target's logits are masked first: tokens the grammar
rejects get -inf at every verified position, so greedy takes the argmax over allowed tokens and
sampling warps (temperature, top-k, top-p) the renormalised allowed distribution. That masked
distribution is the reference: plain constrained decoding goes through the same mask. Repetition
penalties (``ragspec.engine.penalties``) change the logits through the same interface, before the mask.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ragspec.engine.config import GenerationConfig


def warp(logits: torch.Tensor, params: GenerationConfig) -> torch.Tensor:
    """Sampling distribution for each row of ``logits`` (``[n, vocab]`` -> ``[n, vocab]``, fp32)."""
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = scores.topk(params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = scores.softmax(-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class Acceptor(Protocol):
    def accept(
        self, logits: torch.Tensor, drafted: Sequence[int], draft_probs: torch.Tensor | None
    ) -> tuple[int, int]:
        """Given target logits ``[1 + k, vocab]`` after each draft prefix, return
        ``(number of drafted tokens kept, the next token)``."""
        ...


class GreedyAcceptor:
    """Keep drafted tokens while they equal the target's argmax; then the target's own token."""

    def accept(
        self, logits: torch.Tensor, drafted: Sequence[int], draft_probs: torch.Tensor | None
    ) -> tuple[int, int]:
        target = logits.argmax(-1).tolist()  # [1 + k]
        n = 0
        while n < len(drafted) and drafted[n] == target[n]:
            n += 1
        return n, target[n]


class RejectionSampler:
    """Lossless speculative sampling (see the module docstring)."""

    def __init__(self, params: GenerationConfig, device: torch.device) -> None:
        self.params = params
        self.rng = torch.Generator(device=device)
        if params.seed is None:
            self.rng.seed()
        else:
            self.rng.manual_seed(params.seed)

    def sample(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.rng))

    def accept(
        self, logits: torch.Tensor, drafted: Sequence[int], draft_probs: torch.Tensor | None
    ) -> tuple[int, int]:
        p = warp(logits, self.params)  # [1 + k, vocab]
        for j, x in enumerate(drafted):
            q_x = 1.0 if draft_probs is None else float(draft_probs[j, x])
            u = float(torch.rand((), generator=self.rng, device=p.device))
            if u * q_x < float(p[j, x]):  # u < p(x) / q(x), without dividing by a zero q
                continue
            if draft_probs is None:  # one-hot q: the residual is p without x
                residual = p[j].clone()
                residual[x] = 0.0
            else:
                residual = (p[j] - draft_probs[j].to(p.dtype)).clamp_(min=0.0)
            if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p is exact
                residual = p[j]
            return j, self.sample(residual)
        k = len(drafted)
        if draft_probs is not None and draft_probs.shape[0] > k:
            # The draft went on with a token the grammar rejects (cut before verifying): p gives it
            # no mass, so it is rejected for sure and the replacement comes from the residual.
            residual = (p[k] - draft_probs[k].to(p.dtype)).clamp_(min=0.0)
            return k, self.sample(residual if float(residual.sum()) > 0.0 else p[k])
        return k, self.sample(p[k])


class Mask(Protocol):
    def mask(self, logits: torch.Tensor, drafted: Sequence[int]) -> torch.Tensor:
        """``logits`` ``[1 + k, vocab]`` changed for the history after each draft prefix (a grammar:
        disallowed tokens at -inf; penalties: repeated tokens lowered)."""
        ...

    def advance(self, tokens: Sequence[int]) -> None:
        """Move past accepted tokens."""
        ...


class MaskedAcceptor:
    """An acceptor over masked logits (see the module docstring); the mask advances over what is kept."""

    def __init__(self, inner: Acceptor, mask: Mask) -> None:
        self.inner = inner
        self.mask = mask

    def accept(
        self, logits: torch.Tensor, drafted: Sequence[int], draft_probs: torch.Tensor | None
    ) -> tuple[int, int]:
        n, token = self.inner.accept(self.mask.mask(logits, drafted), drafted, draft_probs)
        self.mask.advance([*drafted[:n], token])
        return n, token


def make_acceptor(params: GenerationConfig, device: torch.device) -> Acceptor:
    return GreedyAcceptor() if params.greedy else RejectionSampler(params, device)
