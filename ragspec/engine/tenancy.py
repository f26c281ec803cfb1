"""Whose prompt it is: the cache scope in which a request's prompt prefixes are kept and reused.

A kept prefix (``ragspec.engine.prefix_cache``) makes a later prompt that starts the same way
faster, and says so in ``GenerationStats.cached_prompt_tokens``. Shared between users, that is a
side channel: a user who guesses another's prompt (a document, a system prompt with a PIN) one
token at a time sees which guess was cached, in the counter and in the time to first token. So
every request runs in a *cache scope*, and only requests of the same scope reuse each other's
prefixes; the generator's other cross-request state (the earlier answers the n-gram drafter
copies from, the draft model's cache) is kept for one scope at a time and forgotten when a
request of another scope comes (docs/threat-model.md, "Shared caches").

The scope reaches the generator the way the cancel event does (``ragspec.engine.cancel``): a
context variable set by whoever knows the user (the web app: the session; ``/v1``: the client's
``cache_salt``), read when a stream is created, so the layers in between (pipeline, LangChain
classes) carry nothing. Code that serves one user needs nothing: everything runs in ``SHARED``.
``RemoteGenerator`` sends the scope to vLLM (or another ragspec server) as vLLM's per-request
``cache_salt``, a keyed hash of it (``scope_salt``), never the scope itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")

SHARED = ""
"""The scope of code that sets none: one user, or a deployment that shares its cache on purpose."""

_current: ContextVar[str] = ContextVar("ragspec_cache_scope", default=SHARED)
_SALT_KEY = secrets.token_bytes(32)
"""Key of ``scope_salt``: random per process, so a salt says nothing about the scope it came from."""


@contextmanager
def cache_scope(scope: str) -> Iterator[str]:
    """Generations started inside keep and reuse prompt prefixes within ``scope`` only."""
    if not isinstance(scope, str):
        raise TypeError(f"a cache scope is a string, got {type(scope).__name__}")
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


def current_cache_scope() -> str:
    """The scope of the enclosing ``cache_scope`` (``SHARED`` outside any)."""
    return _current.get()


def in_cache_scope(scope: str, make: Callable[[], Iterable[T]]) -> Generator[T, None, None]:
    """The items of ``make()``, made and iterated inside ``cache_scope(scope)``: for a generator that a
    worker thread runs (``ragspec.bridge.iterate_in_thread``), where a scope set around it would be gone."""
    with cache_scope(scope):
        yield from make()


def private_scope() -> str:
    """A scope no other request has: its prefixes are never reused (a client nobody can tell apart)."""
    return "private:" + secrets.token_hex(16)


def scoped_key(kind: str, *parts: str) -> str:
    """A scope for a user known by the secrets ``parts`` (a session id; an API key and a client's salt):
    a hash, so that the secrets themselves are not kept as cache keys."""
    digest = hashlib.sha256(json.dumps(parts).encode("ascii")).hexdigest()  # unambiguous, whatever the parts hold
    return f"{kind}:{digest}"


def scope_salt(scope: str) -> str:
    """vLLM's ``cache_salt`` for ``scope``: HMAC-SHA256 under this process's random key, 43 characters of
    base64 (256 bits, as vLLM recommends). The same scope gets the same salt within a process."""
    mac = hmac.new(_SALT_KEY, scope.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")


__all__ = [
    "SHARED", "cache_scope", "current_cache_scope", "in_cache_scope", "private_scope", "scope_salt", "scoped_key",
]  # fmt: skip
