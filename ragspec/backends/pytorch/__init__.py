"""The PyTorch back end: transformers' weights (loaded by ``ragspec.backends.pytorch.loading``), the lean
Llama forward (``ragspec.backends.pytorch.forward``) on a preallocated KV cache
(``ragspec.backends.pytorch.kv_cache``), transformers' own forward for other architectures."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ragspec.engine.cancel import check as check_cancelled
from ragspec.backends.pytorch.forward import make_forward
from ragspec.backends.pytorch.kv_cache import cache_nbytes, copy_prefix
from ragspec.backends.pytorch.loading import LoadedModel


@dataclass
class SavedTorchCache:
    """A finished request's cache itself, handed over to the prefix cache."""

    cache: DynamicCache
    nbytes: int


class TorchBackend:
    """Forward and cache of a ``LoadedModel`` (its weights are shared by every back end built on it)."""

    name = "torch"

    def __init__(self, target: LoadedModel) -> None:
        self.target = target
        """The loaded target model whose weights this back end runs."""
        self._forward = make_forward(target.model, target.device, target.dtype, target.prompt_dtype)
        self.description = self._forward.description
        self.model_name = target.name
        self.tokenizer = target.tokenizer
        self.context_length = target.context_length
        self.device = target.device
        self.vocab_size = int(target.model.config.vocab_size)
        eos = target.model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if target.tokenizer.eos_token_id is not None:
            ids.add(target.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(ids)

    prefill_chunk = 1024
    """Prompt tokens per forward: a long prompt is evaluated in chunks so that a cancelled request
    stops within one chunk (about a second for the default model on 2 CPU cores). Prompts up to
    this length take one forward: a RAG prompt (500-1000 tokens) split at 512 cost ~10% more
    (a second forward over the weights, and its attention over the first chunk through an explicit
    mask instead of the causal kernel; docs/backends.md, "Prefill")."""

    def forward(
        self, ids: list[int], cache: DynamicCache, last_only: bool = False, cancel: threading.Event | None = None
    ) -> torch.Tensor:
        if not last_only:
            return self._forward(ids, cache, False)
        for start in range(0, len(ids), self.prefill_chunk):
            check_cancelled(cancel)
            logits = self._forward(ids[start : start + self.prefill_chunk], cache, True)
        return logits

    def new_cache(self, capacity: int) -> DynamicCache:
        return self._forward.new_cache(capacity)

    def save(self, cache: DynamicCache) -> SavedTorchCache:
        return SavedTorchCache(cache, cache_nbytes(cache))

    def load(self, saved: SavedTorchCache, length: int, capacity: int) -> DynamicCache | None:
        cache = self.new_cache(capacity)
        return cache if copy_prefix(saved.cache, length, cache) else None
