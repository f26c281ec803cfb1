"""A KV cache that writes new positions into preallocated buffers instead of concatenating.

transformers' ``DynamicLayer`` appends with ``torch.cat``, which copies the whole cache of every
layer at every step; on a CPU that copy was the largest single cost of a decoding step (see
docs/design.md, "Measurements"). ``BufferLayer``
keeps one buffer per layer with room for the whole request and returns views of its filled part,
so a step writes only its new positions. Rolling back (``crop``) just shortens the filled part.
Values are bit-identical to the concatenating cache: only where they are stored differs.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class BufferLayer(DynamicLayer):
    """A ``DynamicLayer`` backed by a buffer of ``capacity`` positions (grown by doubling if exceeded)."""

    def __init__(self, capacity: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.capacity = max(capacity, 1)
        self.length = 0
        self.dtype = dtype
        """What the buffers hold (None: the first keys' dtype); keys of another dtype are converted when written."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        dtype = self.dtype or key_states.dtype
        self._keys = key_states.new_empty((*key_states.shape[:-2], self.capacity, key_states.shape[-1]), dtype=dtype)
        self._values = value_states.new_empty((*value_states.shape[:-2], self.capacity, value_states.shape[-1]), dtype=dtype)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._grow(max(end, 2 * self.capacity))
        self._keys[..., self.length : end, :].copy_(key_states)
        self._values[..., self.length : end, :].copy_(value_states)
        self._set_length(end)
        return self.keys, self.values

    def _grow(self, capacity: int) -> None:
        keys = self._keys.new_empty((*self._keys.shape[:-2], capacity, self._keys.shape[-1]))
        values = self._values.new_empty((*self._values.shape[:-2], capacity, self._values.shape[-1]))
        keys[..., : self.length, :].copy_(self._keys[..., : self.length, :])
        values[..., : self.length, :].copy_(self._values[..., : self.length, :])
        self._keys, self._values, self.capacity = keys, values, capacity

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self._keys[..., :length, :]
        self.values = self._values[..., :length, :]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Remove ``-tokens_to_remove`` positions from the end (transformers' negative convention)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized:
            self._set_length(max(self.length + tokens_to_remove, 0))


def make_cache(config: PretrainedConfig, capacity: int, dtype: torch.dtype | None = None) -> DynamicCache:
    """A ``DynamicCache`` whose attention layers are ``BufferLayer``s sized for ``capacity`` positions,
    holding ``dtype`` (None: the dtype of the first keys written).

    Sliding-window layers get one too: transformers' own drops positions that leave the window, so
    it cannot be cropped back once the sequence is longer than the window (a rejected draft would
    end the request), while the attention mask, built from the model's config, still limits every
    query to its window over a cache that keeps all positions. Other layer kinds (linear
    attention) keep transformers' implementation.
    """
    cache = DynamicCache(config=config)
    cache.layers = [BufferLayer(capacity, dtype) if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) else layer
                    for layer in cache.layers]
    return cache


def cache_nbytes(cache: DynamicCache) -> int:
    """Memory held by a cache's keys and values (a ``BufferLayer`` counts its whole buffer)."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, BufferLayer):
            if layer.is_initialized:
                total += layer._keys.nbytes + layer._values.nbytes
        else:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                total += t.nbytes if isinstance(t, torch.Tensor) else 0
    return total


def copy_prefix(source: DynamicCache, length: int, target: DynamicCache) -> bool:
    """Write the first ``length`` positions of ``source`` into the empty ``target`` (bit for bit).

    False, with ``target`` untouched, when a layer is not a ``BufferLayer`` (linear attention keeps a
    state, not per-position keys and values, so no prefix of it can be taken).
    """
    if not all(isinstance(layer, BufferLayer) for layer in (*source.layers, *target.layers)):
        return False
    if length > source.get_seq_length():
        raise ValueError(f"the source cache holds {source.get_seq_length()} positions, not {length}")
    for src, dst in zip(source.layers, target.layers):
        if src.is_initialized and length:
            dst.update(src.keys[..., :length, :], src.values[..., :length, :])
    return True
