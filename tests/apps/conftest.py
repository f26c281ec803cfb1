"""Fixtures for the apps: a real uvicorn server on 127.0.0.1 and a scripted indexer (its answerers answer by script)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from apps.collection import Event, IndexSummary, Token
from retrievers.ingest import SyncProgress
from tests.apps.fakes import fake_answer

CORPUS = Path(__file__).resolve().parents[2] / "retrievers" / "data" / "corpus"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """Runs an ASGI app with uvicorn in a thread, bound to loopback only."""

    def __init__(self, app: object) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@dataclass
class ScriptedAnswerer:
    """Answers with fixed words, one ``Token`` per ``delay_s``; records what happened."""

    words: Sequence[str] = ("The", " trial", " lasts", " six", " months", " [1]", ".")
    delay_s: float = 0.01
    label: str = "doc"
    supported: bool = True
    """False: the answer is one no passage backs (no citations)."""
    started: int = 0
    finished: int = 0
    closed: int = 0
    questions: list[str] = field(default_factory=list)
    histories: list[list[tuple[str, str]]] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    generating: threading.Event = field(default_factory=threading.Event)
    """Set when an answer has started (its first word is on its way)."""
    ended: threading.Event = field(default_factory=threading.Event)
    """Set when an answer has ended, finished or closed early."""
    spans: list[tuple[float, float]] = field(default_factory=list)
    """``time.monotonic()`` at the start and the end of each answer."""

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        self.started += 1
        self.questions.append(question)
        self.histories.append(list(history))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        begun = time.monotonic()
        self.generating.set()
        text = ""
        try:
            for i, word in enumerate(self.words):
                time.sleep(self.delay_s)
                text += word
                yield Token(word, (i + 1) * self.delay_s, i + 1, i + 1)
            sources = [(f"{self.label}.md", self.label, f"passage of {self.label}")] if self.supported else []
            self.finished += 1
            yield fake_answer(text, sources, question=question)
        finally:
            self.active -= 1
            if self.finished < self.started:
                self.closed += 1
            self.spans.append((begun, time.monotonic()))
            self.ended.set()


@dataclass
class ScriptedIndexer:
    """Indexes by listing file names; every session gets its own ``ScriptedAnswerer``."""

    delay_s: float = 0.01
    words: Sequence[str] = ScriptedAnswerer.words
    supported: bool = True
    answerers: list[ScriptedAnswerer] = field(default_factory=list)
    progress_steps: Sequence[SyncProgress] = ()
    """Reported one per ``progress_delay_s`` while indexing, when the app passes a progress callback."""
    progress_delay_s: float = 0.0

    def index(
        self, paths: Sequence[Path], workdir: Path, progress: Callable[[SyncProgress], None] | None = None
    ) -> tuple[ScriptedAnswerer, IndexSummary]:
        for step in self.progress_steps:
            if progress is not None:
                progress(step)
            time.sleep(self.progress_delay_s)
        files = sorted(str(p.name) for path in paths for p in (path.iterdir() if path.is_dir() else [path]))
        answerer = ScriptedAnswerer(words=self.words, delay_s=self.delay_s, label="+".join(files), supported=self.supported)
        self.answerers.append(answerer)
        return answerer, IndexSummary(files=files, chunks=len(files))


@pytest.fixture
def apps_corpus() -> Path:
    return CORPUS


# -- vLLM: what every vLLM test module compares with, computed once per session ---------------------


@pytest.fixture(scope="session")
def served_folder() -> Path:
    from ragspec.backends.pytorch.loading import model_folder

    return model_folder("default")


@pytest.fixture(scope="session")
def rag_ids(lc_tokenizer) -> list[list[int]]:
    from types import SimpleNamespace

    from benchmarks.bench import rag_prompts
    from tests.apps.vllm_common import N_PROMPTS

    return [p.ids for p in rag_prompts(SimpleNamespace(tokenizer=lc_tokenizer), N_PROMPTS)]


@pytest.fixture(scope="session")
def reference(served_folder, rag_ids, tmp_path_factory) -> list[dict]:
    """vLLM without speculation: greedy answers and their top-2 logprobs, one prompt at a time (its
    server stopped before any other starts: one vLLM at a time)."""
    from ragspec.backends.vllm.server import VllmServer
    from tests.apps.vllm_common import FLAGS, complete

    log = tmp_path_factory.mktemp("vllm") / "plain.log"
    with VllmServer(served_folder, speculation=None, extra_args=FLAGS, served_name="smol", log=log) as server:
        return [complete(server.base_url, ids, logprobs=2) for ids in rag_ids]
