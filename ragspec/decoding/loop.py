"""The verify loop on one page: prefill, then draft -> verify -> accept -> update until the answer ends.

KV cache positions: the cache always holds exactly the tokens before ``pending`` (the newest
accepted token, whose logits are not computed yet). A verify forward appends ``pending`` and the
``k`` drafted tokens; after accepting ``n`` of them the cache is cropped by ``k - n`` entries
(``crop`` with a negative count), leaving it again just before the new pending token. Both back
ends make a crop cheap: PyTorch writes positions into preallocated buffers
(``ragspec.backends.pytorch.kv_cache``), llama.cpp removes the positions from its context's memory.

Accepting (``ragspec.engine.sampling``): greedy keeps the drafted prefix that equals the target's
argmax after the tokens before it; sampling keeps a drafted token with probability
``min(1, p_target / p_draft)``; either way the target's own next token follows, so every forward
yields at least one token and the output is what plain decoding gives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator as StepGenerator
from dataclasses import dataclass

import torch

from ragspec.backends import Backend, KVCache
from ragspec.engine.cancel import check as check_cancelled
from ragspec.engine.composite import CompositeDrafter
from ragspec.engine.constraints import Grammar
from ragspec.engine.drafting import Draft, DraftSource
from ragspec.engine.results import GenerationStats, SourceStats
from ragspec.engine.sampling import Acceptor
from ragspec.engine.text import StopTextAssembler


@dataclass
class Request:
    """What one request decodes with (``SpeculativeGenerator.stream`` builds it)."""

    backend: Backend
    drafter: CompositeDrafter
    acceptor: Acceptor
    grammar: Grammar | None
    assembler: StopTextAssembler
    stats: GenerationStats
    cancel: threading.Event
    longest: int
    """Most drafted tokens per step; ``speculative`` False: none are drafted."""
    speculative: bool
    start: float
    """``time.perf_counter()`` when the request began."""


@torch.inference_mode()
def decode(
    r: Request, cache: KVCache, prompt_ids: list[int], cached: int, budget: int
) -> StepGenerator[str, None, tuple[list[int], str]]:
    """Yield text deltas up to ``budget`` tokens after the prompt (``cache`` holds its first ``cached``
    positions); return the answer's ids and why it ended ("eos", "length", "stop", "repetition")."""
    logits = r.backend.forward(prompt_ids[cached:], cache, last_only=True, cancel=r.cancel)  # [1, vocab]
    _, first = r.acceptor.accept(logits, (), None)
    new, out, context = [first], [], list(prompt_ids)  # context: prompt + out, what the drafters match
    r.stats.forward_passes = 1
    while True:
        new, finish = clip(new, budget - len(out), r.backend.eos_token_ids, r.grammar)
        r.stats.decoded_tokens += len(new)
        for token in new:  # one delta per token, however many a forward accepted
            update = r.assembler.add([token])
            out.extend([token][: update.n_tokens])
            context.extend([token][: update.n_tokens])
            if update.repeated:  # the repeat may have begun in tokens held back earlier
                out = r.assembler.ids
                context = [*prompt_ids, *out]
            r.stats.progress(len(out), time.perf_counter() - r.start)
            if update.delta:
                yield update.delta
            if update.stopped:
                finish = "repetition" if update.repeated else "stop"
                break
        r.stats.progress(len(out), time.perf_counter() - r.start)
        if finish != "continue":
            return out, finish
        check_cancelled(r.cancel)
        new = step(r, cache, context, budget - len(out))


def step(r: Request, cache: KVCache, context: list[int], room: int) -> list[int]:
    """One target forward: draft (unless the request drafts nothing), verify, accept, update."""
    t0 = time.perf_counter()
    draft = r.drafter.propose(context, min(r.longest, room - 1)) if r.speculative else None
    t1 = time.perf_counter()
    new, n_accepted = verify(r.backend, cache, context[-1], draft, r.acceptor)
    t2 = time.perf_counter()
    r.stats.draft_s += t1 - t0
    r.stats.forward_passes += 1
    if r.speculative:
        r.drafter.policy.record(draft, n_accepted, t2 - t1, t1 - t0)
    if draft is not None:
        r.drafter.feedback(draft, n_accepted)
        count(r.stats, draft, n_accepted)
    if r.grammar is not None:
        r.stats.mask_s, r.stats.masks = r.grammar.mask_s, r.grammar.masks
    return new


def verify(backend: Backend, cache: KVCache, pending: int, draft: Draft | None, acceptor: Acceptor) -> tuple[list[int], int]:
    """One target forward over ``[pending, *draft]``; returns the new tokens and the accepted count."""
    drafted = draft.tokens if draft is not None else ()
    logits = backend.forward([pending, *drafted], cache)  # [1 + k, vocab]
    n, token = acceptor.accept(logits, drafted, None if draft is None else draft.probs)
    if n < len(drafted):
        cache.crop(-(len(drafted) - n))  # forget the rejected draft positions
    return [*drafted[:n], token], n


def clip(new: list[int], room: int, eos: frozenset[int], grammar: Grammar | None = None) -> tuple[list[int], str]:
    """Cut newly accepted tokens at EOS and at the token budget. An output that fills the budget
    exactly as its grammar completes ends as at an EOS ("eos", not "length"): the grammar allows
    nothing but the end of the output after it."""
    for i, t in enumerate(new[:room]):
        if t in eos:
            return new[:i], "eos"
    if len(new) < room:
        return new, "continue"
    # The grammar advanced over every accepted token: its state is the output's only if what the
    # budget cuts off is nothing, or an EOS.
    complete = grammar is not None and grammar.finished and all(t in eos for t in new[room:])
    return new[:room], ("eos" if complete else "length")


def count(stats: GenerationStats, draft: Draft, n_accepted: int) -> None:
    """Book-keep one verified draft per source (grammar-forced tokens count as ``grammar``)."""
    head = len(draft) - draft.forced
    parts = [(draft.source, head, min(n_accepted, head)), (DraftSource.GRAMMAR, draft.forced, max(0, n_accepted - head))]
    for source, drafted, accepted in parts:
        if drafted:
            stats.by_source.setdefault(source.value, SourceStats()).add(drafted, accepted)
    if draft.source is DraftSource.PASSAGE and draft.reference is not None and head:
        stats.by_reference.setdefault(draft.reference, SourceStats()).add(head, min(n_accepted, head))
    stats.count_draft(len(draft), n_accepted)
