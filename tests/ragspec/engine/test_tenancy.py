"""Cache scopes: set per request, read where a stream is made, salted before they leave the process."""

from __future__ import annotations

import threading

import pytest

from ragspec.engine.tenancy import (
    SHARED, cache_scope, current_cache_scope, in_cache_scope, private_scope, scope_salt, scoped_key,
)  # fmt: skip


def test_a_scope_holds_inside_its_block_and_nests() -> None:
    assert current_cache_scope() == SHARED
    with cache_scope("a"):
        assert current_cache_scope() == "a"
        with cache_scope("b"):
            assert current_cache_scope() == "b"
        assert current_cache_scope() == "a"
    assert current_cache_scope() == SHARED
    with pytest.raises(TypeError, match="string"):
        with cache_scope(None):  # type: ignore[arg-type]
            pass


def test_in_cache_scope_runs_the_whole_iteration_in_the_scope_in_another_thread() -> None:
    seen: list[str] = []

    def answer() -> list[str]:
        seen.append(current_cache_scope())  # made inside the scope
        return ["x", "y"]

    def steps() -> object:
        yield from answer()
        seen.append(current_cache_scope())  # still inside after the first items

    worker = threading.Thread(target=lambda: seen.extend(in_cache_scope("web:1", steps)))
    worker.start()
    worker.join(10)
    assert seen == ["web:1", "x", "y", "web:1"]
    assert current_cache_scope() == SHARED


def test_salts_are_keyed_hashes_stable_per_scope_and_distinct_between_scopes() -> None:
    scopes = [SHARED, "web:abc", scoped_key("v1", "Bearer k", "salt"), private_scope(), private_scope()]
    salts = [scope_salt(s) for s in scopes]
    assert len(set(salts)) == len(scopes)
    assert all(len(s) == 43 and s.isascii() and "=" not in s for s in salts)  # 256 bits, as vLLM recommends
    assert salts == [scope_salt(s) for s in scopes]
    assert all(s not in salt for s in scopes[1:] for salt in salts)


def test_scoped_keys_hash_their_secrets() -> None:
    key = scoped_key("v1", "Bearer secret-key", "my-salt")
    assert key.startswith("v1:") and "secret" not in key and "my-salt" not in key
    assert key == scoped_key("v1", "Bearer secret-key", "my-salt") != scoped_key("v1", "Bearer secret-key", "other")
    assert scoped_key("v1", "a", "b\0c") != scoped_key("v1", "a\0b", "c")  # no two splits of the secrets meet
    assert scoped_key("web", "\ud800") != scoped_key("web", "\ufffd")  # a lone surrogate is hashed, not refused
