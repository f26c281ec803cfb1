"""Running a blocking iterator in a worker thread and consuming it from asyncio."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any, TypeVar

import anyio

from ragspec.engine.cancel import cancel_scope

T = TypeVar("T")

_ITEM, _ERROR, _END = range(3)


async def iterate_in_thread(make: Callable[[], Generator[T, Any, Any]]) -> AsyncIterator[T]:
    """Yield the items of ``make()`` without blocking the event loop.

    ``make`` returns a generator; it and every step of it run in one worker thread, in a copy of
    the caller's context (so tracing and callback context carry over); items cross into the loop
    through an ``asyncio.Queue``.

    If the consumer stops early (break, ``aclose``, cancellation, a time limit), the worker's
    cancel event is set (``ragspec.engine.cancel``): a generation inside stops at its next check — in the
    prefill, between steps, or while it waits for the model — and the generator is closed. This
    iterator's own clean-up returns only once the worker thread has ended (shielded from further
    cancellation), so whoever holds a place in a queue for it gives the place back when the
    model is really free, not while the abandoned generation still runs.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
    stop = threading.Event()
    ended = asyncio.Event()

    def post(kind: int, value: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()

    def work() -> None:
        try:
            with cancel_scope(stop):
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
        finally:
            try:
                loop.call_soon_threadsafe(ended.set)
            except RuntimeError:  # the loop is closed
                pass

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
        with anyio.CancelScope(shield=True):  # a cancelled consumer still waits for the worker's end
            await ended.wait()


async def next_before(items: AsyncIterator[T], deadline: float) -> T:
    """``anext(items)``, or ``TimeoutError`` once ``time.monotonic()`` passes ``deadline``.

    The wait runs in the caller's task (``asyncio.wait_for`` would wrap it in a task of its own,
    which a cancelled caller can abandon while the iterator still runs its clean-up), so an
    ``iterate_in_thread`` iterator has finished its clean-up, worker ended, when this returns or raises.
    """
    with anyio.fail_after(max(0.0, deadline - time.monotonic())):
        return await anext(items)
