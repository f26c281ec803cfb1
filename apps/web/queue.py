"""The model queue of ``ragspec serve``: who generates now, who waits, who is turned away.

One ``ModelQueue`` per app is shared by every route that generates (the web page's ``/api/ask``
and the OpenAI-compatible ``/v1`` routes), so they never compete for the model behind each
other's back. A request first takes a ``Ticket``:

- ``ModelQueue.ticket()`` refuses at once (``QueueFullError``, answered 429 with
  ``Retry-After``) when ``max_waiting`` requests already wait: a bounded queue, never an
  unbounded pile of requests that will all time out;
- ``Ticket.wait(timeout_s)`` waits for one of the ``slots`` (first come, first served) and
  raises ``QueueTimeoutError`` after ``timeout_s``;
- ``async with ticket:`` holds the slot (or the place in the queue) and gives it back on every
  exit: the answer finished, failed, timed out, or the client went away. A response that outlives
  the block (a stream) takes it over with ``ticket.hand_over()``, and gives it back when it ends.
  ``Ticket.release()`` is idempotent.

A local model has one slot (``SpeculativeGenerator`` decodes one request at a time; see
docs/serving.md for why requests are not batched); a remote generator can have more.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType


class QueueFullError(Exception):
    """Too many requests wait already; try again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueTimeoutError(Exception):
    """No slot became free in time; try again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelQueue:
    """``slots`` requests generate at once; at most ``max_waiting`` more wait for a slot."""

    def __init__(self, slots: int = 1, max_waiting: int = 16) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        self.slots = slots
        self.max_waiting = max_waiting
        self.waiting = 0
        """Requests holding a ticket that have no slot yet."""
        self.running = 0
        """Requests holding a slot."""
        self._semaphore = asyncio.Semaphore(slots)
        self._durations: deque[float] = deque(maxlen=16)  # recent slot hold times, for Retry-After

    @property
    def busy(self) -> bool:
        """Every slot is taken: a new request would wait."""
        return self.running + self.waiting >= self.slots

    def ticket(self) -> Ticket:
        """A place in the queue; ``QueueFullError`` when ``max_waiting`` requests already wait."""
        if self.busy and self.waiting >= self.max_waiting:
            raise QueueFullError(
                f"the server is busy: {self.running} request(s) generating and {self.waiting} waiting, "
                f"the most it queues (--max-queue {self.max_waiting}); retry after the time in Retry-After",
                self.retry_after_s(),
            )
        self.waiting += 1
        return Ticket(self)

    def retry_after_s(self) -> int:
        """Seconds until a slot is likely free: the recent mean answer time per request ahead, 1..120."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 5.0
        ahead = (self.waiting + self.running) / self.slots
        return int(min(120, max(1, math.ceil(mean * max(ahead, 1)))))


@dataclass(eq=False)
class Ticket:
    """One request's place in a ``ModelQueue`` (see the module docstring)."""

    queue: ModelQueue
    state: str = "waiting"
    """``"waiting"``, ``"running"`` (holds a slot) or ``"released"``."""
    started: float = 0.0
    waited_s: float = 0.0
    """How long ``wait`` took."""
    _work: list[asyncio.Future[object]] = field(default_factory=list)
    """Work done for this request in other threads; the slot is kept until it has ended."""
    _handed_over: bool = False

    async def __aenter__(self) -> Ticket:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if not self._handed_over:
            self.release()

    def hand_over(self) -> Callable[[], None]:
        """Leave the ticket held past the ``async with`` block: whoever takes it (a streaming
        response's ``on_close``) calls the returned ``release`` when it is done."""
        self._handed_over = True
        return self.release

    async def wait(self, timeout_s: float) -> None:
        """Take a slot; ``QueueTimeoutError`` after ``timeout_s`` (the place in the queue is then given up)."""
        if self.state != "waiting":
            raise RuntimeError(f"a ticket in state {self.state!r} cannot wait")
        start = time.monotonic()
        try:
            await asyncio.wait_for(self.queue._semaphore.acquire(), timeout_s)
        except asyncio.TimeoutError:  # an alias of TimeoutError from Python 3.11 on
            self.release()
            raise QueueTimeoutError(
                f"the server is busy: no model free after {timeout_s:g} s in the queue; try again later",
                self.queue.retry_after_s(),
            ) from None
        except BaseException:  # cancelled (the client went away): leave the queue
            self.release()
            raise
        self.queue.waiting -= 1
        self.queue.running += 1
        self.state = "running"
        self.started = time.monotonic()
        self.waited_s = self.started - start

    def keep_until_done(self, work: asyncio.Future[object]) -> None:
        """Keep the slot until ``work`` (done for this request in another thread) has ended, even
        past ``release``: a request answered early (a time limit) cannot hand a busy model on."""
        self._work.append(work)
        work.add_done_callback(lambda _: self.release())

    def release(self) -> None:
        """Give back the slot or the place in the queue (once the work kept by ``keep_until_done``
        has ended); further calls do nothing."""
        if any(not work.done() for work in self._work):
            return  # the last of the work's callbacks releases
        if self.state == "waiting":
            self.queue.waiting -= 1
        elif self.state == "running":
            self.queue.running -= 1
            self.queue._durations.append(time.monotonic() - self.started)
            self.queue._semaphore.release()
        self.state = "released"
