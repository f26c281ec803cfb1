"""What the streaming routes share: a response that always cleans up, and noticing a client that left."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


class EventStream(StreamingResponse):
    """A streaming response that always closes its iterator, also when the client went away.

    Its content is an async generator (or a plain iterable, which starlette wraps in one).

    ``on_close`` runs once the response is over, however it ended (finished, failed, client
    gone, or never started): the place to give back a queue slot.
    """

    def __init__(self, *args: Any, on_close: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.on_close is not None:
                self.on_close()

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]  # always an async generator


async def until_disconnected(request: Request) -> None:
    """Return when the client closes the connection (call it after the body has been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ``ClientGone``.

    Cancelling ``work`` runs its cleanup (a queue place given back, a generation stopped), so a
    request whose client left stops holding the model at once.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - cancelled, or failed while being cancelled: the client is gone either way
        pass
    raise ClientGone
