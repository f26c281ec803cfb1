"""Running a blocking iterator in a worker thread and consuming it from asyncio."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")

_ITEM, _ERROR, _END = range(3)


async def iterate_in_thread(make: Callable[[], Generator[T, Any, Any]]) -> AsyncIterator[T]:
    """Yield the items of ``make()`` without blocking the event loop.

    ``make`` returns a generator; it and every step of it run in one worker thread, in a copy of
    the caller's context (so tracing and callback context carry over); items cross into the loop
    through an ``asyncio.Queue``. If the consumer stops early (break, cancellation), the worker
    stops after its current item and closes the generator, so a generation releases its model.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
    stop = threading.Event()

    def post(kind: int, value: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()

    def work() -> None:
        try:
            iterator = make()
            try:
                for item in iterator:
                    if stop.is_set():
                        break
                    post(_ITEM, item)
            finally:
                iterator.close()
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            post(_ERROR, e)
        else:
            post(_END, None)

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(work,), name="ragspec-generate", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = await queue.get()
            if kind == _END:
                return
            if kind == _ERROR:
                assert isinstance(value, BaseException)
                raise value
            yield value  # type: ignore[misc]
    finally:
        stop.set()
