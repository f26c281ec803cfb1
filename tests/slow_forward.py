"""A target forward slowed down in proportion to the tokens it evaluates, for cancellation tests."""

from __future__ import annotations

import threading
import time
from typing import Any

from ragspec.backends.pytorch.forward import prompt_in_blocks


class SlowForward:
    """Wraps a ``make_forward`` result: sleeps ``seconds_per_token`` per evaluated id, counts them,
    and says (``busy``) while a call runs."""

    def __init__(self, forward: Any, seconds_per_token: float) -> None:
        self.inner = forward
        self.description = forward.description
        self.seconds_per_token = seconds_per_token
        self.tokens = 0
        self.busy = threading.Event()

    def __call__(self, ids: list[int], cache: Any, last_only: bool = False) -> Any:
        self.busy.set()
        try:
            time.sleep(self.seconds_per_token * len(ids))
            self.tokens += len(ids)
            return self.inner(ids, cache, last_only)
        finally:
            self.busy.clear()

    def prompt(self, ids: list[int], cache: Any, block: int, cancel: threading.Event | None = None) -> Any:
        """One call per block of positions, as transformers' forward evaluates a prompt, so that a cancellation
        lands between blocks."""
        return prompt_in_blocks(self, ids, cache, block, cancel)

    def new_cache(self, capacity: int) -> Any:
        return self.inner.new_cache(capacity)


def slow_generator(seconds_per_token: float, context: int = 4096) -> tuple[Any, SlowForward]:
    """A generator over a tiny random model whose forwards take ``seconds_per_token`` per id."""
    from ragspec.decoding.generator import SpeculativeGenerator
    from tests.ragspec.tiny import tiny_model

    gen = SpeculativeGenerator(tiny_model(context=context), prefix_cache=False)
    slow = SlowForward(gen.backend._forward, seconds_per_token)
    gen.backend._forward = slow
    return gen, slow
