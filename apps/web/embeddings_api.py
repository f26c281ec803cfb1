"""``POST /v1/embeddings``: the server's embedding model, in OpenAI's request and response shape.

A remote app embeds with the model the server's indexes are built with (``OpenAIEmbeddings(
base_url=..., model=..., check_embedding_ctx_length=False)``, the ``openai`` client's
``embeddings.create``). docs/serving.md is the reference. In short:

- ``input``: a string or a list of strings (at most ``MAX_INPUTS``, each at most ``MAX_INPUT_CHARS``
  characters, none empty). Token ids are refused with a 400 that says what to send instead:
  they would be ids of OpenAI's tokenizer, not of this model's. A text longer than the model's
  window is cut at it, as when an index is built (``usage`` counts the tokens read).
- ``model``: the embedding model's name (``GET /v1/models`` lists it); ``encoding_format``
  ``"float"`` or ``"base64"`` (little-endian float32, the ``openai`` client's default);
  ``dimensions`` only as the model's own size (vectors are not shortened).
- Vectors are L2-normalized, exactly as ``retrievers`` computes them for an index. Requests are
  embedded one at a time in a worker thread (batched by the model's ``batch_size``), so the event
  loop stays free and two requests do not share the cores.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from fastapi import FastAPI, Request

from apps.web.openai_api import OpenAIError, json_body
from ragspec.engine.text import clean_text

MAX_INPUTS = 2048
"""Most texts per request (OpenAI's limit)."""
MAX_INPUT_CHARS = 100_000
"""Longest text accepted (the model reads its first window of tokens of it)."""
_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}


def parse_inputs(body: object, model_id: str) -> tuple[list[str], str, int | None]:
    """The texts, the encoding format and the requested dimensions; ``OpenAIError`` names what is wrong."""
    if not isinstance(body, Mapping):
        raise OpenAIError(400, "the request body must be a JSON object")
    for name in body:
        if name not in _FIELDS:
            raise OpenAIError(400, f"unrecognized request argument supplied: {str(name)[:100]}", param=str(name)[:100])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, f"model is required: {model_id!r} (GET /v1/models)", param="model")
    if model != model_id:
        raise OpenAIError(
            404, f"the embedding model {model[:100]!r} does not exist here: this server embeds with {model_id!r}",
            param="model", code="model_not_found",
        )  # fmt: skip
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if isinstance(texts, list) and texts and all(isinstance(t, int) or isinstance(t, list) for t in texts):
        raise OpenAIError(
            400, "token ids are not accepted: send the text (they would be another tokenizer's ids); with "
            "LangChain's OpenAIEmbeddings pass check_embedding_ctx_length=False", param="input", code="unsupported_parameter",
        )  # fmt: skip
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise OpenAIError(400, "input must be a non-empty string or a non-empty list of strings", param="input")
    if len(texts) > MAX_INPUTS:
        raise OpenAIError(400, f"input takes at most {MAX_INPUTS} texts per request, got {len(texts)}: split it", param="input")
    for i, text in enumerate(texts):
        if not text:
            raise OpenAIError(400, f"input[{i}] is empty: every text needs at least one character", param="input")
        if len(text) > MAX_INPUT_CHARS:
            raise OpenAIError(400, f"input[{i}] has {len(text)} characters; at most {MAX_INPUT_CHARS}", param="input")
        if clean_text(text) != text:  # the tokenizer takes valid Unicode only
            raise OpenAIError(400, f"input[{i}] is not valid text (a lone surrogate such as \\ud800): send valid Unicode", param="input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise OpenAIError(400, f'encoding_format must be "float" or "base64", got {encoding!r}', param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)):
        raise OpenAIError(400, f"dimensions must be an integer, got {dimensions!r}", param="dimensions")
    return list(texts), encoding, dimensions


def add_embeddings_route(app: FastAPI, embeddings: Any, model_id: str) -> None:
    """``POST /v1/embeddings`` over ``embeddings`` (a ``retrievers.SentenceTransformerEmbeddings``),
    answering to ``model_id``."""
    lock = threading.Lock()

    def embed(texts: list[str]) -> tuple[np.ndarray, int]:
        with lock:
            vectors = np.asarray(embeddings.embed_documents(texts), dtype="<f4")  # [N, D]
            return vectors, sum(embeddings.count_tokens(texts))

    @app.post("/v1/embeddings")
    async def create_embeddings(request: Request) -> dict[str, Any]:
        texts, encoding, dimensions = parse_inputs(await json_body(request), model_id)
        if dimensions is not None:
            size = await asyncio.to_thread(lambda: embeddings.dimension)
            if dimensions != size:
                raise OpenAIError(
                    400, f"dimensions must be {size}, this model's size: ragspec does not shorten vectors", param="dimensions"
                )
        vectors, tokens = await asyncio.to_thread(embed, texts)
        data = [
            {"object": "embedding", "index": i,
             "embedding": base64.b64encode(row.tobytes()).decode("ascii") if encoding == "base64" else row.tolist()}
            for i, row in enumerate(vectors)
        ]  # fmt: skip
        return {"object": "list", "data": data, "model": model_id, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


__all__ = ["MAX_INPUTS", "MAX_INPUT_CHARS", "add_embeddings_route", "parse_inputs"]
