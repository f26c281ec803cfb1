"""Drafting with a small causal LM that shares the target's vocabulary.

The draft model keeps its own KV cache of the context it has seen. Before drafting, the cache is
cropped to the longest prefix it shares with the current context (rolling back rejected draft
tokens) and the context tokens it has not seen are fed in one forward (catching up on accepted
tokens and the target's own token). Drafts are greedy: a deterministic draft is a one-hot draft
distribution, which keeps rejection sampling exact in sampling mode too.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from ragspec.backends import TargetModel, make_backend
from ragspec.engine.drafting import Draft, DraftSource


STEP_TOKENS = 8
"""Most tokens the draft model evaluates as a decoding step (all their logits, the step's products and dtype) rather
than as a prompt (the PyTorch back end computes a prompt's products over at least
``ragspec.backends.pytorch.forward.prompt_min_rows`` rows, and may run it in bf16)."""


class VocabularyMismatchError(ValueError):
    """The draft model's tokenizer does not map text to the same ids as the target's."""


def check_same_vocabulary(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase,
                          target_name: str, draft_name: str) -> None:
    """Raise ``VocabularyMismatchError`` unless both tokenizers have identical vocabularies."""
    if len(target) != len(draft) or target.get_vocab() != draft.get_vocab():
        raise VocabularyMismatchError(
            f"draft model {draft_name!r} ({type(draft).__name__}, {len(draft)} tokens) does not share the "
            f"vocabulary of target {target_name!r} ({type(target).__name__}, {len(target)} tokens): "
            "use a draft model from the same family as the target (same tokenizer)"
        )


class ModelDrafter:
    """Greedy drafts from a small model with its own, rolled-back KV cache.

    The draft model runs behind the same back-end seam as the target (``ragspec.backends``), so
    it may be transformers weights or a GGUF file in llama.cpp."""

    longest: int | None = None
    """It drafts as many tokens as asked."""
    acceptance: float | None = None
    """Unknown until measured (the policy's prior)."""

    def __init__(self, draft: TargetModel, target: TargetModel) -> None:
        check_same_vocabulary(target.tokenizer, draft.tokenizer, target.name, draft.name)
        self.model = draft
        self.backend = make_backend(draft)
        self.clear_cache()

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]]) -> None:
        # Keep the cache across requests: a shared prompt prefix (system prompt) is reused.
        pass

    def clear_cache(self) -> None:
        """Forget every cached position."""
        self._cache = self.backend.new_cache(1024)  # grows by doubling when needed
        self._seen: list[int] = []  # tokens whose keys/values are in the cache

    @torch.inference_mode()
    def _logits(self, tokens: Sequence[int]) -> torch.Tensor:
        # A few tokens (a drafted one, the accepted ones) are a decoding step's forward; more (the prompt) a
        # prompt's, which computes the last position's logits only (``Backend.forward``).
        try:
            out = self.backend.forward(list(tokens), self._cache, last_only=len(tokens) > STEP_TOKENS)[-1]  # [vocab]
        except BaseException:
            self.clear_cache()  # the forward may have written some layers: start the next draft cold
            raise
        self._seen.extend(tokens)
        return out

    def _rollback(self, context: Sequence[int]) -> None:
        keep = 0
        limit = min(len(self._seen), len(context) - 1)  # always re-feed at least the last token
        while keep < limit and self._seen[keep] == context[keep]:
            keep += 1
        if keep < len(self._seen):
            self._cache.crop(-(len(self._seen) - keep))
            del self._seen[keep:]

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        # Drafting k tokens puts len(context) + k - 1 positions in the draft model's cache; past its
        # context window the target goes on alone (its own window may be larger).
        max_tokens = min(max_tokens, self.model.context_length - len(context))
        if max_tokens <= 0 or not context:
            return None
        self._rollback(context)
        token = int(self._logits(context[len(self._seen) :]).argmax())
        tokens = [token]
        while len(tokens) < max_tokens:
            token = int(self._logits([token]).argmax())
            tokens.append(token)
        return Draft(tuple(tokens), DraftSource.MODEL)

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        """The cache is reconciled with the context at the next ``propose``."""

    def finish(self, output: Sequence[int]) -> None:
        """The cache is kept for the next request's shared prefix."""
