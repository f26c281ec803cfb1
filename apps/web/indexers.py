"""What indexes a web session's uploads and answers over them (``apps.web.sessions.Indexer``): into a folder
per session (``FolderIndexer``), or into a collection per session in PostgreSQL (``StoreIndexer``, for
replicas that share one database: ``apps.web.pg_state``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from apps.collection import Collection, IndexSummary, update_index
from ragspec.engine.config import DEFAULT_MAX_TOKENS

if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings

    from apps.web.openai_api import Source
    from retrievers.ingest import SyncProgress

__all__ = ["FolderIndexer", "StoreIndexer", "session_collection"]


def session_collection(folder_name: str) -> str:
    """The collection holding a session's documents, named after the session's folder."""
    return f"web-{folder_name}"


@dataclass
class FolderIndexer:
    """Indexes with ``apps.collection.update_index`` (incremental, into ``workdir/index``) and answers with the ragspec pipeline."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    k: int = 4
    model: str = "default"
    model_backend: str = "auto"
    """What runs the local ``model``: ``"auto"``, ``"torch"`` or ``"llamacpp"`` (``ragspec.backends``)."""
    source: Source | None = None
    """Where answers are generated (a ``RemoteModel``); None: the local ``model``."""

    def index(
        self, paths: Sequence[Path], workdir: Path, progress: Callable[[SyncProgress], None] | None = None
    ) -> tuple[Collection, IndexSummary]:
        index_dir = workdir / "index"
        summary = update_index(paths, index_dir, progress=progress)
        return self._collection(index_dir), summary

    def _collection(self, target: str | Path, name: str | None = None, embeddings: Embeddings | None = None) -> Collection:
        return Collection(target, max_tokens=self.max_tokens, k=self.k, model=self.model, source=self.source,
                          backend=self.model_backend, collection=name, embeddings=embeddings)  # fmt: skip


@dataclass
class StoreIndexer(FolderIndexer):
    """Indexes a session's files into its own collection of the database at ``url`` (``session_collection``
    of the session's folder), so that every replica answers over the same passages without embedding them again."""

    url: str = ""
    embeddings: Embeddings | None = None
    """Embed passages and questions (None: the bundled model)."""

    def index(
        self, paths: Sequence[Path], workdir: Path, progress: Callable[[SyncProgress], None] | None = None
    ) -> tuple[Collection, IndexSummary]:
        name = session_collection(workdir.name)
        summary = update_index(paths, self.url, progress=progress, collection=name, embeddings=self.embeddings)
        return self.open(workdir), summary

    def open(self, workdir: Path) -> Collection:
        """The answerer of what ``index`` put in the session's collection (indexed by any replica)."""
        return self._collection(self.url, session_collection(workdir.name), self.embeddings)
