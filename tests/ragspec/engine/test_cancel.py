"""Cancelling a generation from another thread: it stops inside the prefill, between steps and
while waiting for the generator, and leaves the generator as good as new."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ragspec.bridge import iterate_in_thread
from ragspec.engine.cancel import GenerationCancelled, cancel_scope
from ragspec.engine.results import GeneratorBusyError
from tests.slow_forward import slow_generator

PROMPT = [(7 * i) % 250 for i in range(3000)]  # 3000 ids: three prefill chunks of at most 1024
PER_TOKEN_S = 0.001  # 3 s for the whole prompt, about 1 s for one chunk


@pytest.mark.timeout(60)
def test_a_cancelled_stream_stops_inside_the_prefill_and_the_generator_is_free_again() -> None:
    gen, slow = slow_generator(PER_TOKEN_S)
    stream = gen.stream(PROMPT, max_new_tokens=4)
    threading.Timer(0.3, stream.cancel).start()
    start = time.monotonic()
    with pytest.raises(GenerationCancelled), stream:
        list(stream)
    assert time.monotonic() - start < 2.0  # the whole prefill would take 3 s
    assert 0 < slow.tokens < len(PROMPT)  # stopped between chunks, not after the prompt
    slow.seconds_per_token = 0.0
    again = gen.generate(PROMPT[:40], max_new_tokens=6)  # no GeneratorBusyError: the lock was released
    gen.clear_cache()
    assert again.token_ids == gen.generate(PROMPT[:40], max_new_tokens=6).token_ids


@pytest.mark.timeout(60)
def test_a_request_waiting_for_the_generator_stops_waiting_when_cancelled() -> None:
    gen, _ = slow_generator(PER_TOKEN_S)
    gen.busy_timeout_s = 30.0
    holder = gen.stream(PROMPT, max_new_tokens=2)
    started = threading.Event()

    def hold() -> None:
        with holder:
            started.set()
            list(holder)

    thread = threading.Thread(target=hold)
    thread.start()
    started.wait(5)
    time.sleep(0.05)
    event = threading.Event()
    with cancel_scope(event):
        waiter = gen.stream(PROMPT[:10], max_new_tokens=2)
    threading.Timer(0.2, event.set).start()
    start = time.monotonic()
    with pytest.raises(GenerationCancelled):
        list(waiter)
    assert time.monotonic() - start < 2.0  # not the 30 s busy timeout, nor the 3 s of the holder
    thread.join(10)


@pytest.mark.timeout(30)
def test_busy_timeout_still_applies_while_waiting() -> None:
    gen, _ = slow_generator(PER_TOKEN_S)
    gen.busy_timeout_s = 0.2
    holder = gen.stream(PROMPT, max_new_tokens=2)
    thread = threading.Thread(target=lambda: list(holder))
    thread.start()
    time.sleep(0.1)
    with pytest.raises(GeneratorBusyError):
        gen.generate(PROMPT[:10], max_new_tokens=2)
    thread.join(10)


@pytest.mark.timeout(60)
def test_the_bridge_cancels_the_prefill_and_returns_only_once_the_worker_has_ended() -> None:
    gen, slow = slow_generator(PER_TOKEN_S)

    async def scenario() -> tuple[float, bool]:
        events = iterate_in_thread(lambda: iter(gen.stream(PROMPT, max_new_tokens=4)))
        task = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.3)  # inside the prefill
        task.cancel()  # the consumer goes away (a client that left, a time limit)
        start = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        await events.aclose()
        return time.monotonic() - start, slow.busy.is_set()

    waited, still_busy = asyncio.run(scenario())
    assert not still_busy  # clean-up returned after the worker's last forward, not before
    assert waited < 2.0 and slow.tokens < len(PROMPT)
