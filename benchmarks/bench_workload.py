"""What both benchmarks (``benchmarks.bench``, ``benchmarks.bench_structured``) run on: the bundled questions,
the bundled corpus behind a hybrid retriever, a timer for transformers' first new token, the timing
every run records (``TimedRun``) with the decode speed computed from it, and the CPU the figures belong to
(``cpu_features``)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers.generation.streamers import BaseStreamer

if TYPE_CHECKING:
    from langchain_core.documents import Document

    from retrievers import HybridRetriever


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and the vector features that decide these speeds (AVX2, AVX-512, AMX flags), as
    ``cpuinfo`` lists them: every figure a report holds is named with it."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        return "unknown CPU"
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in lines if ":" in line)}
    flags = sorted(f for f in fields.get("flags", "").split() if f == "avx2" or f.startswith(("avx512", "amx")))
    model = fields.get("model name", "unknown CPU")
    family = f", family {fields['cpu family']}" if "cpu family" in fields else ""
    return f"{model}{family}: {' '.join(flags) or 'no AVX2, AVX-512 or AMX'}"


@dataclass
class TimedRun:
    """One generation's timing; each benchmark's ``Run`` adds its own counts."""

    new_tokens: int
    wall_s: float
    ttft_s: float
    """Seconds to the first new token (the prefill, mostly)."""
    forwards: int | None = None
    """Target forwards, where the method counts them."""


def decode_tokens_per_s(runs: Sequence[TimedRun]) -> float:
    """Tokens after the first over the time after the first token, pooled over ``runs``."""
    tokens = sum(max(r.new_tokens - 1, 0) for r in runs)
    seconds = sum(r.wall_s - r.ttft_s for r in runs)
    return tokens / seconds if seconds > 0 else 0.0


DATA = Path(__file__).resolve().parents[1] / "retrievers" / "data"
"""The bundled questions (``questions.json``) and corpus (``corpus/``)."""


def bundled_questions(n: int, question_sets: Sequence[Path] = ()) -> list[dict[str, Any]]:
    """The first ``n`` bundled questions (``question``, ``kind``, ...), or the first ``n`` of the
    ``question_sets`` (JSON files with a ``questions`` list of objects with a ``question``, in order)
    when any is given."""
    files = question_sets or [DATA / "questions.json"]
    questions: list[dict[str, Any]] = [q for f in files for q in json.loads(Path(f).read_text())["questions"]]
    return questions[:n]


def bundled_retriever(k: int) -> HybridRetriever:
    """The bundled corpus loaded, chunked and embedded, behind a hybrid retriever of top ``k``."""
    from retrievers import FaissVectorStore, HybridRetriever, default_embeddings, load_documents, split_documents

    chunks = split_documents(load_documents(DATA / "corpus").documents)
    store = FaissVectorStore(default_embeddings())
    store.add_documents(chunks)
    return HybridRetriever(vectorstore=store, documents=chunks, k=k)


def retrieved_questions(n: int, k: int, question_sets: Sequence[Path] = ()) -> list[tuple[dict[str, Any], list[Document]]]:
    """The first ``n`` questions (``bundled_questions``), each with its top ``k`` passages from the bundled corpus (hybrid)."""
    retriever = bundled_retriever(k)
    return [(q, retriever.invoke(q["question"])) for q in bundled_questions(n, question_sets)]


class FirstTokenTimer(BaseStreamer):
    """Notes when ``generate`` emits its first new token (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()

    def end(self) -> None: ...
