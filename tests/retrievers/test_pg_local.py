"""`LocalPostgres`: a throwaway server from the postgres extra's wheel, on 127.0.0.1 only, gone after `stop`."""

from __future__ import annotations

import socket

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")

from retrievers import pg_local  # noqa: E402
from retrievers.pg_local import LocalPostgres, LocalPostgresError  # noqa: E402


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(180)
def test_a_tcp_server_listens_on_loopback_only_and_leaves_nothing_behind(pg_server: LocalPostgres) -> None:
    server = LocalPostgres(port=free_port())
    try:
        url = server.start()
        root, process = server.root, server.process
        assert root is not None and process is not None and url.startswith("postgresql://postgres@127.0.0.1:")
        with psycopg.connect(url) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone()[0] == "127.0.0.1"
            assert conn.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()[0] >= "0.8"
    finally:
        server.stop()  # also when an assertion fails: no server outlives the test
    assert process.poll() is not None and not root.exists()
    server.stop()  # twice is fine
    with pytest.raises(LocalPostgresError, match="not running"):
        _ = server.url


def test_without_the_wheel_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_local.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(LocalPostgresError, match=r"pip install 'ragspec\[postgres\]'"):
        LocalPostgres().start()
    with pytest.raises(ValueError, match="port"):
        LocalPostgres(port=70000)
