"""One request at a time on a generator: who waits, for how long, and who fails at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ragspec.engine.cancel import check as check_cancelled
from ragspec.engine.results import GeneratorBusyError


class RequestLock:
    """Held by one request of a generator at a time.

    A request from another thread waits up to ``busy_timeout_s`` (``float("inf")``: as long as it
    takes) and then fails with ``GeneratorBusyError``; one from the thread that holds it (a second
    stream opened before the first is closed) fails at once, since waiting would never end.
    """

    def __init__(self, busy_timeout_s: float) -> None:
        if not busy_timeout_s >= 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s}")
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id of the request holding ``_lock``

    @contextmanager
    def hold(self, cancel: threading.Event | None = None) -> Iterator[None]:
        """Hold the generator for one request; a request whose ``cancel`` event is set while it waits
        stops waiting (``GenerationCancelled``)."""
        if self._owner == threading.get_ident():
            raise GeneratorBusyError(
                "this thread still has an open stream of this generator: exhaust or close it first "
                "(`with generator.stream(...) as s:` closes it on exit)"
            )
        deadline = time.monotonic() + self.busy_timeout_s  # inf: for as long as it takes
        while not self._lock.acquire(timeout=max(0.0, min(0.05, deadline - time.monotonic()))):
            check_cancelled(cancel)
            if time.monotonic() >= deadline:
                raise GeneratorBusyError(
                    f"the generator stayed busy with another request for {self.busy_timeout_s:g} s; try again later"
                )
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None
            self._lock.release()
