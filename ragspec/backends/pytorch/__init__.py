"""The PyTorch back end: transformers' weights (loaded by ``ragspec.backends.pytorch.loading``), the lean
Llama forward (``ragspec.backends.pytorch.forward``) on a preallocated KV cache
(``ragspec.backends.pytorch.kv_cache``), transformers' own forward for other architectures."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ragspec.backends.pytorch.forward import LlamaForward, make_forward
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

    def forward(
        self, ids: list[int], cache: DynamicCache, last_only: bool = False, cancel: threading.Event | None = None
    ) -> torch.Tensor:
        """See ``Backend.forward``. A prompt (``last_only``) runs through ``Forward.prompt`` in blocks of the model's
        ``prompt_chunk``, so that a prefix-cache hit (``load``, which keeps whole blocks) computes what a cold
        prefill of the same prompt computes after it, bit for bit (see there). The lean Llama forward evaluates it
        in one forward, its attention in aligned blocks (``LlamaForward.prompt``; a cancelled request stops within
        one layer); transformers' forward runs one forward per block (``HFForward.prompt``; a cancelled request
        stops within one)."""
        if not last_only:
            return self._forward(ids, cache, False)
        return self._forward.prompt(ids, cache, self.target.prompt_chunk, cancel)

    def new_cache(self, capacity: int) -> DynamicCache:
        return self._forward.new_cache(capacity)

    @property
    def keeps_hidden(self) -> bool:
        """Whether ``hidden_at`` can return anything (the lean Llama forward keeps its hidden states)."""
        return isinstance(self._forward, LlamaForward)

    def hidden_at(self, position: int) -> torch.Tensor | None:
        """The final-norm hidden state at ``position`` if the last forward computed it (``LlamaForward.hidden_at``;
        None with transformers' own forward, which keeps none)."""
        return self._forward.hidden_at(position)

    def save(self, cache: DynamicCache) -> SavedTorchCache:
        return SavedTorchCache(cache, cache_nbytes(cache))

    def load(self, saved: SavedTorchCache, length: int, capacity: int) -> DynamicCache | None:
        """A cache holding the first ``length`` positions of ``saved`` rounded down to whole prompt chunks
        (``forward``): a cold prefill computes the positions after them alike."""
        cache = self.new_cache(capacity)
        return cache if copy_prefix(saved.cache, length - length % self.target.prompt_chunk, cache) else None
