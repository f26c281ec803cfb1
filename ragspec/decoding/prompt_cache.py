"""A request's KV cache from the prompt prefixes kept for its scope, and a finished one kept again.

The saved prefixes themselves (bounded, per cache scope) are ``ragspec.engine.prefix_cache``'s; the
back end saves and loads their keys and values (``Backend.save`` / ``Backend.load``).
"""

from __future__ import annotations

from ragspec.backends import Backend, KVCache
from ragspec.engine.prefix_cache import PrefixCache


def take_cache(
    backend: Backend, prefixes: PrefixCache | None, prompt_ids: list[int], capacity: int, scope: str
) -> tuple[KVCache, int]:
    """A cache holding the longest prefix of this prompt that a kept entry of ``scope`` has, or a new one
    (``prefixes`` None: always a new one).

    Returns the cache and how many prompt tokens it already holds: at most the shared prefix less the
    last prompt token, which is always computed again since its logits give the first new token, and
    fewer where the back end keeps only whole prompt chunks (``Backend.load``).
    """
    found = prefixes.best(prompt_ids, len(prompt_ids) - 1, scope) if prefixes is not None else None
    if found is not None:
        entry, shared = found
        cache = backend.load(entry.saved, shared, capacity)
        if cache is not None:
            return cache, cache.get_seq_length()
    return backend.new_cache(capacity), 0


def keep_cache(backend: Backend, prefixes: PrefixCache, cache: KVCache, prompt_ids: list[int], scope: str) -> None:
    """Store a finished request's prompt positions for ``scope`` (its answer's are cropped: see
    ``ragspec.engine.prefix_cache``), and the cache's public prefix once, when the prompt starts with it.
    A request that does not finish (an abandoned stream, an error) stores nothing."""
    keep = min(len(prompt_ids), cache.get_seq_length())
    cache.crop(keep - cache.get_seq_length())
    saved = backend.save(cache)
    if saved is None:
        return
    prefixes.add(prompt_ids[:keep], saved, scope)
    if prefixes.lacks_public(prompt_ids[:keep]):  # the template's fixed part, for every scope: a copy of its positions
        public = backend.load(saved, len(prefixes.public), len(prefixes.public))
        copy = backend.save(public) if public is not None else None
        if copy is not None:
            prefixes.add_public(copy, public.get_seq_length())
