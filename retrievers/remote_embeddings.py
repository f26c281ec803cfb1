"""Embeddings from a serving engine: any OpenAI-compatible ``POST /v1/embeddings`` (``ragspec serve``, vLLM, ...).

A big ingest then embeds on as many workers as the server has, and queries embed where the index was
built. The model's name is what a store records (`embeddings_fingerprint` reads ``model_id``) and
checks on every later use, with the vectors' dimension: another model is a clear error, never mixed
vectors.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import httpx
from langchain_core.embeddings import Embeddings

from retrievers.errors import EmbeddingModelError

__all__ = ["RemoteEmbeddings"]


class RemoteEmbeddings(Embeddings):
    """``embed_documents`` / ``embed_query`` through ``{base_url}/embeddings`` of an OpenAI-compatible server.

    Example:
        >>> emb = RemoteEmbeddings("http://gpu-box:8000/v1", "sentence-transformers/all-MiniLM-L6-v2")
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        batch_size: int = 64,
        timeout_s: float = 120.0,
    ) -> None:
        """``api_key`` defaults to the ``RAGSPEC_EMBEDDINGS_API_KEY`` environment variable (none when unset)."""
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the embeddings URL must start with http:// or https://, got {base_url[:60]!r}")
        if not model or not model.strip():
            raise ValueError("name the served embedding model (its name in the server's GET /v1/models)")
        if batch_size < 1 or not timeout_s > 0:
            raise ValueError(f"batch_size must be positive and timeout_s above 0, got {batch_size}, {timeout_s}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        key = api_key if api_key is not None else os.environ.get("RAGSPEC_EMBEDDINGS_API_KEY") or None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}

    @property
    def model_id(self) -> str:
        """The served model's name, as a store records it."""
        return self.model

    def __repr__(self) -> str:  # never the key
        return f"RemoteEmbeddings({self.base_url!r}, {self.model!r})"

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        with httpx.Client(timeout=self.timeout_s, headers=self._headers) as client:
            for start in range(0, len(texts), self.batch_size):
                vectors += self._request(client, texts[start : start + self.batch_size])
        if vectors and len({len(v) for v in vectors}) != 1:
            raise EmbeddingModelError(f"the embeddings server at {self.base_url} returned vectors of different lengths")
        return vectors

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    def _request(self, client: httpx.Client, batch: Sequence[str]) -> list[list[float]]:
        url = f"{self.base_url}/embeddings"
        try:
            response = client.post(url, json={"model": self.model, "input": list(batch), "encoding_format": "float"})
        except httpx.HTTPError as e:
            raise EmbeddingModelError(f"cannot reach the embeddings server at {self.base_url} ({type(e).__name__}: {e})") from e
        if response.status_code != 200:
            raise EmbeddingModelError(
                f"the embeddings server at {self.base_url} answered {response.status_code}: {_message(response)}"
            )
        try:
            data = sorted(response.json()["data"], key=lambda item: int(item["index"]))
            vectors = [[float(x) for x in item["embedding"]] for item in data]
        except (ValueError, KeyError, TypeError) as e:
            raise EmbeddingModelError(f"the embeddings server at {self.base_url} sent no OpenAI embeddings response ({e})") from e
        if len(vectors) != len(batch):
            raise EmbeddingModelError(f"the embeddings server at {self.base_url} returned {len(vectors)} vectors for {len(batch)} texts")
        return vectors


def _message(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
        return str(body["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
