"""Stopping a generation from another thread, wherever it is: in the prefill, between steps, or
waiting for the model.

A generation runs in one thread (``ragspec.bridge`` runs it in a worker thread for asyncio
callers) and its consumer may go away at any moment. Closing a Python generator from another
thread is not possible while it runs, and a long prompt's prefill runs for seconds before the
first text delta, so the consumer instead sets a ``threading.Event``: the *cancel event* of the
generation. ``SpeculativeGenerator`` checks it before and between prefill chunks (both back ends:
PyTorch between chunks of ``prefill_chunk`` tokens, llama.cpp between its batches), between
decoding steps and while it waits for the model, and raises ``GenerationCancelled``.

The event reaches the generator through a context variable rather than through every layer in
between (pipeline, LangChain classes, web routes): ``cancel_scope(event)`` sets it for the code
that runs inside, and a stream takes the event current when it is created. Code that runs a
generation by hand can also call ``GenerationStream.cancel()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_current: ContextVar[threading.Event | None] = ContextVar("ragspec_cancel_event", default=None)


class GenerationCancelled(Exception):
    """The generation was cancelled (its consumer went away) before it finished."""


@contextmanager
def cancel_scope(event: threading.Event) -> Iterator[threading.Event]:
    """Generations started inside stop (``GenerationCancelled``) once ``event`` is set."""
    token = _current.set(event)
    try:
        yield event
    finally:
        _current.reset(token)


def current_cancel_event() -> threading.Event:
    """The cancel event of the enclosing ``cancel_scope``, or a new one nobody else sets."""
    event = _current.get()
    return event if event is not None else threading.Event()


def check(event: threading.Event | None) -> None:
    """Raise ``GenerationCancelled`` when ``event`` is set."""
    if event is not None and event.is_set():
        raise GenerationCancelled("the generation was cancelled")
