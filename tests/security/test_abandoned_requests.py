"""A client that gives up on a long prompt: its generation must stop inside the prefill, and the
queue (and ``/api/health``) must count it until it has really stopped."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.web.server import AppConfig, create_app
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.fakes import GeneratorSource
from tests.slow_forward import slow_generator

PROMPT = [(7 * i) % 250 for i in range(3000)]
PER_TOKEN_S = 0.001  # the prompt's prefill: 3 s in six chunks of ~0.5 s


def watch_health(url: str, slow: Any, stop: threading.Event, seen: list[tuple[bool, bool]]) -> None:
    """Record (a forward ran before and after the request, health said busy) every 20 ms."""
    with httpx.Client(base_url=url, timeout=5) as client:
        while not stop.is_set():
            before = slow.busy.is_set()
            busy = client.get("/api/health").json()["busy"]
            seen.append((before and slow.busy.is_set(), busy))
            time.sleep(0.02)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stream", [False, True])
def test_an_abandoned_long_prompt_stops_in_the_prefill_and_holds_its_slot_until_then(tmp_path: Path, stream: bool) -> None:
    gen, slow = slow_generator(PER_TOKEN_S)
    app = create_app(AppConfig(max_queue=4), indexer=ScriptedIndexer(), sessions_root=tmp_path, generation=GeneratorSource(gen))
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "stream": stream}
    with LiveServer(app) as server:
        seen: list[tuple[bool, bool]] = []
        stop = threading.Event()
        watcher = threading.Thread(target=watch_health, args=(server.url, slow, stop, seen))
        watcher.start()
        try:
            with pytest.raises(httpx.ReadTimeout):  # the client gives up inside the prefill and leaves
                with httpx.Client(base_url=server.url, timeout=httpx.Timeout(5, read=0.4)) as client:
                    if stream:
                        with client.stream("POST", "/v1/completions", json=body) as response:
                            list(response.iter_bytes())
                    else:
                        client.post("/v1/completions", json=body)
            left = time.monotonic()
            with httpx.Client(base_url=server.url, timeout=30) as client:
                small = client.post("/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2})
            waited = time.monotonic() - left
        finally:
            stop.set()
            watcher.join(10)
    assert small.status_code == 200
    assert slow.tokens < len(PROMPT)  # the abandoned prompt was not evaluated to its end
    assert waited < 1.8  # one prefill chunk at most, not the remaining 2.5 s of the prefill
    assert seen and not any(forwarding and not busy for forwarding, busy in seen), seen
