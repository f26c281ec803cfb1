"""The seam under the decoding loop: a target model's forward over a KV cache that can be rolled back.

Drafting, the cost policy, greedy and sampling verification (``ragspec.decoding.generator``,
``ragspec.engine.sampling``) are written once, over this protocol. An implementation evaluates token ids
after the positions its cache holds and returns one row of logits per position asked for; the
generator rolls the cache back over rejected draft positions with ``crop`` and reuses a cache
across requests for their shared prompt prefix (``ragspec.engine.prefix_cache``: ``save`` hands a
finished request's cache to it, ``load`` gives a new request a cache holding a saved prefix).

Positions: a cache holds exactly the first ``get_seq_length()`` tokens of the sequence; a
forward over ``n`` ids appends them (positions ``len .. len + n - 1``), ``crop(-m)`` forgets the
last ``m``. Implementations: ``ragspec.backends.pytorch`` (transformers' weights, the lean Llama
forward) and ``ragspec.backends.llamacpp`` (GGUF files through llama.cpp's own kernels).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from ragspec.engine.results import ModelLoadError

if TYPE_CHECKING:  # annotations only: importing the back ends' names stays torch-free
    import torch
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from ragspec.engine.prefix_cache import SavedPrefix


class KVCache(Protocol):
    """Keys and values of the positions a back end has evaluated, in order."""

    def get_seq_length(self) -> int:
        """How many positions the cache holds."""
        ...

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (a negative count, transformers' convention)."""
        ...


class Backend(Protocol):
    """One target model's forward and KV cache; a generator owns one, the weights may be shared."""

    name: str
    """``"torch"`` or ``"llamacpp"``."""
    description: str
    """What runs, in words (shown in benchmark reports)."""
    model_name: str
    tokenizer: PreTrainedTokenizerBase
    """Text <-> ids for every back end: the Hugging Face tokenizer (chat template, stop strings, streaming)."""
    context_length: int
    """Most positions (prompt and answer together) a cache takes."""
    eos_token_ids: frozenset[int]
    vocab_size: int
    """Columns of the logits."""
    device: torch.device
    """Where the returned logits live."""

    def forward(
        self, ids: list[int], cache: KVCache, last_only: bool = False, cancel: threading.Event | None = None
    ) -> torch.Tensor:
        """Evaluate ``ids`` after the cached positions and append them to ``cache``.

        Returns logits ``[len(ids), vocab]`` (``[1, vocab]`` with ``last_only``) on ``device``. The
        tensor may be a view of the back end's own buffer: it is valid until the next ``forward``.
        A prompt (``last_only``) is evaluated in chunks, and ``cancel`` is checked before each: once it
        is set, ``ragspec.engine.cancel.GenerationCancelled`` is raised and the cache holds the chunks done.
        """
        ...

    def new_cache(self, capacity: int) -> KVCache:
        """An empty cache with room for ``capacity`` positions.

        A back end may hold one cache at a time (llama.cpp: one context's memory); a new cache
        then replaces the previous one, and using the replaced one is an error.
        """
        ...

    def save(self, cache: KVCache) -> SavedPrefix | None:
        """Keep ``cache``'s positions for later requests (the caller no longer uses ``cache``); None when
        a later prompt could not reuse them exactly."""
        ...

    def load(self, saved: SavedPrefix, length: int, capacity: int) -> KVCache | None:
        """A cache of room ``capacity`` holding the first ``length`` positions of ``saved``, bit for bit, or
        fewer where a cold prefill could not resume exactly after ``length`` (the PyTorch back end keeps
        whole prompt chunks); ``saved`` stays valid. None when this back end cannot take a prefix of it
        (the caller starts cold)."""
        ...


class BackendUnavailableError(ModelLoadError):
    """A back end's optional dependency is installed but unusable (its library does not load, or it is another
    version); the message names the install command. A missing one is ``retrievers.extras.MissingExtraError``."""
