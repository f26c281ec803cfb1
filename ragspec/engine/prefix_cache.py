"""Keys and values of several recent prompts, so that a new prompt computes only what it adds.

A follow-up question's prompt starts with the previous turn's prompt (``ragspec.prompts`` lays
conversations out that way), and questions over the same documents share a system prompt and
often their first passages. ``PrefixCache`` keeps the KV caches of recent prompts, each with the
token ids it holds, least recently used first out, within a memory bound; a new prompt gets a copy of
the longest prefix an entry shares with it, and the entry stays (a request that is abandoned or
fails loses nothing); the request's own entry replaces those it makes redundant.

Every entry belongs to a cache scope (``ragspec.engine.tenancy``: a web session, a ``/v1`` client,
or ``SHARED``), and a prompt only ever gets a prefix of its own scope: whether, and how much of, a
prompt was cached must say nothing about another user's prompts. The memory bound is shared: one
scope's entries can push out another's (which says how busy the server is, not what it was asked).
One entry is every scope's: the *public* prefix (``PrefixCache.public``, the question-answering
prompt's fixed part: ``ragspec.prompts.qa_prefix_ids``), which holds no user's words, so the first
question of every session or client reuses it too (whether it is cached says only that some
request of this process used the default prompt).

Only prompt positions are kept (a request's answer positions are cropped before it is stored):
they were all computed by a prefill, so a hit gives what a cold prefill of the same prompt gives
(the tests compare both on each back end; a back end may reuse fewer positions than are shared to keep
it so: ``Backend.load``). Entries are opaque ``SavedPrefix`` objects made by the
back end (``Backend.save``): the PyTorch cache itself, llama.cpp's sequence state copied out of its
context.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ragspec.engine.tenancy import SHARED

DEFAULT_MAX_BYTES = 512 * 2**20
"""Default memory bound: about 11,000 prompt positions of the default model in fp32 (46 KiB each)."""


class SavedPrefix(Protocol):
    """A back end's copy of the keys and values of some positions (see ``Backend.save``)."""

    nbytes: int
    """Memory it holds, counted against ``PrefixCache.max_bytes``."""


@dataclass
class Entry:
    tokens: list[int]
    """The ids whose keys and values ``saved`` holds, in position order."""
    saved: SavedPrefix
    scope: str = SHARED
    """The cache scope of the request that computed it; only requests of that scope reuse it."""
    public: bool = False
    """Holds ``PrefixCache.public`` only: every scope reuses it."""


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64)
    return int(differ.argmax()) if differ.any() else n


class PrefixCache:
    """An LRU of saved prompt prefixes holding at most ``max_bytes`` (and ``max_entries`` entries)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = 32, public: Sequence[int] = ()) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"the prefix cache's max_bytes must be a non-negative integer, got {max_bytes!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"the prefix cache's max_entries must be a positive integer, got {max_entries!r}")
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.public = list(public)
        """Ids whose keys and values every scope may reuse (no user's words: a prompt template's fixed part)."""
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # oldest first
        self._next = 0

    @property
    def nbytes(self) -> int:
        """Memory the entries hold."""
        return sum(e.saved.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def prefixes(self) -> list[list[int]]:
        """The token ids of each entry, least recently used first."""
        return [list(e.tokens) for e in self._entries.values()]

    def best(self, tokens: Sequence[int], limit: int, scope: str = SHARED) -> tuple[Entry, int] | None:
        """The entry of ``scope`` sharing the longest prefix with ``tokens`` (at most ``limit`` ids) and
        how many ids it shares, None when none shares any; the entry becomes the most recently used."""
        found: tuple[int, int] | None = None  # (shared, key)
        for key, entry in self._entries.items():
            if entry.scope != scope and not entry.public:
                continue
            shared = min(shared_prefix(entry.tokens, tokens), limit)
            if shared > 0 and (found is None or shared >= found[0]):  # ties: the most recent
                found = (shared, key)
        if found is None:
            return None
        shared, key = found
        self._entries.move_to_end(key)
        return self._entries[key], shared

    def add(self, tokens: Sequence[int], saved: SavedPrefix, scope: str = SHARED) -> None:
        """Keep ``saved`` (the keys and values of ``tokens``, computed for ``scope``) as the most recent
        entry; entries of the scope it makes redundant (their ids start ``tokens``) go, then the least
        recently used ones beyond the bounds. An entry larger than ``max_bytes`` is not kept."""
        tokens = list(tokens)
        redundant = [k for k, e in self._entries.items()
                     if e.scope == scope and not e.public and shared_prefix(e.tokens, tokens) == len(e.tokens)]  # fmt: skip
        for key in redundant:
            del self._entries[key]
        self._keep(Entry(tokens, saved, scope))

    def lacks_public(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` start with the public ids and no entry holds them yet (``add_public``)."""
        n = len(self.public)
        return n > 0 and shared_prefix(self.public, tokens) == n and not any(e.public for e in self._entries.values())

    def add_public(self, saved: SavedPrefix, length: int) -> None:
        """Keep ``saved`` (the keys and values of the first ``length`` public ids: all of them, or fewer where
        the back end keeps whole prompt chunks only) as the entry every scope reuses."""
        self._keep(Entry(self.public[:length], saved, SHARED, public=True))

    def _keep(self, entry: Entry) -> None:
        if entry.saved.nbytes > self.max_bytes or not entry.tokens:
            return
        self._entries[self._next] = entry
        self._next += 1
        total = self.nbytes
        while total > self.max_bytes or len(self._entries) > self.max_entries:
            _, oldest = self._entries.popitem(last=False)
            total -= oldest.saved.nbytes

    def clear(self) -> None:
        self._entries.clear()
