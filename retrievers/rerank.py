"""Optional second-stage reranking of retrieved passages, e.g. by a sentence-transformers CrossEncoder."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from retrievers.errors import EmbeddingModelError
from retrievers.extras import require

__all__ = ["CrossEncoderReranker", "Reranker"]


@runtime_checkable
class Reranker(Protocol):
    """Scores how well each passage answers the query (higher is better)."""

    def score(self, query: str, passages: Sequence[str]) -> Sequence[float]: ...


class CrossEncoderReranker:
    """A `Reranker` on `sentence_transformers.CrossEncoder`, loaded offline on first use."""

    def __init__(self, model_name_or_path: str | Path, *, batch_size: int = 32, device: str | None = None) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        require("retrieval", "CrossEncoderReranker", ("sentence_transformers",))
        self.model_name_or_path = str(model_name_or_path)
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def model(self) -> Any:
        """The CrossEncoder (loaded on first access, never downloaded)."""
        with self._lock:
            if self._model is None:
                from sentence_transformers import CrossEncoder

                try:
                    self._model = CrossEncoder(self.model_name_or_path, device=self.device, local_files_only=True)
                except Exception as e:  # noqa: BLE001 - many error types for a missing model
                    raise EmbeddingModelError(
                        f"could not load cross-encoder {self.model_name_or_path!r} offline ({type(e).__name__}: {e}); "
                        "pass a local model directory or download the model beforehand"
                    ) from e
            return self._model

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        scores = self.model.predict(
            [(query, p) for p in passages], batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True
        )
        return [float(s) for s in scores.reshape(len(passages), -1)[:, 0]]
