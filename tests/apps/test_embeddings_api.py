"""``POST /v1/embeddings`` with the default embedding model, through ``httpx``, the ``openai``
client and LangChain's standard suite for ``OpenAIEmbeddings``: the vectors are the ones an index
is built with, in OpenAI's shapes; bad input is a 400 naming the parameter.

One in-process app serves the module (a tiny random generator: the chat routes are not used).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from apps.web.embeddings_api import MAX_INPUT_CHARS, MAX_INPUTS
from apps.web.server import AppConfig, create_app
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.test_openai_api import TinySource

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_urls: list[str] = []


@pytest.fixture(scope="module")
def embeddings() -> Any:
    from retrievers import default_embeddings

    return default_embeddings()


@pytest.fixture(scope="module", autouse=True)
def api(tmp_path_factory: pytest.TempPathFactory, lc_tiny_model: Any, embeddings: Any) -> Iterator[httpx.Client]:
    from ragspec.decoding.generator import SpeculativeGenerator

    app = create_app(
        AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path_factory.mktemp("sessions"),
        generation=TinySource(SpeculativeGenerator(lc_tiny_model)), embeddings=embeddings,
    )  # fmt: skip
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        _urls.append(server.url)
        yield c
        _urls.clear()


def embed(api: httpx.Client, **fields: Any) -> httpx.Response:
    return api.post("/v1/embeddings", json={"model": MODEL, **fields})


@pytest.mark.timeout(300)
def test_vectors_are_the_index_vectors_in_openai_shapes(api: httpx.Client, embeddings: Any) -> None:
    texts = ["The ferry leaves at seven.", "Photosynthesis turns light into sugar.", "ferry"]
    body = embed(api, input=texts).json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"embedding"}
    got = np.array([d["embedding"] for d in body["data"]])
    assert np.allclose(got, np.array(embeddings.embed_documents(texts)), atol=1e-6)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == sum(embeddings.count_tokens(texts))
    assert body["usage"]["prompt_tokens"] > 3 * 2  # each text and its special tokens

    one = embed(api, input=texts[0], encoding_format="base64").json()["data"]
    (vector,) = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in one]
    assert np.allclose(vector, got[0], atol=1e-6)
    assert api.get("/v1/models").json()["data"][1]["id"] == MODEL
    assert api.get(f"/v1/models/{MODEL}").json()["ragspec"] == {"kind": "embeddings"}


@pytest.mark.timeout(300)
def test_the_openai_client_and_langchain_embed_through_it(embeddings: Any) -> None:
    openai = pytest.importorskip("openai")
    langchain_openai = pytest.importorskip("langchain_openai")
    (url,) = _urls
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        r = client.embeddings.create(model=MODEL, input=["alpha", "beta"])  # base64 on the wire (the client's default)
    expected = np.array(embeddings.embed_documents(["alpha", "beta"]))
    assert np.allclose(np.array([d.embedding for d in r.data]), expected, atol=1e-6)
    lc = langchain_openai.OpenAIEmbeddings(base_url=f"{url}/v1", api_key="unused", model=MODEL,
                                           check_embedding_ctx_length=False, chunk_size=1)  # fmt: skip
    assert np.allclose(np.array(lc.embed_documents(["alpha", "beta"])), expected, atol=1e-6)  # one request per text
    assert np.allclose(np.array(lc.embed_query("alpha")), np.array(embeddings.embed_query("alpha")), atol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"input": [[1, 2, 3]]}, 400, "input"),
        ({"input": [1, 2, 3]}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": ["ok", ""]}, 400, "input"),
        ({"input": ["ok", 3]}, 400, "input"),
        ({"input": ["x"] * (MAX_INPUTS + 1)}, 400, "input"),
        ({"input": "x" * (MAX_INPUT_CHARS + 1)}, 400, "input"),
        ({"input": "ok", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "ok", "dimensions": 64}, 400, "dimensions"),
        ({"input": "ok", "model": "text-embedding-3-small"}, 404, "model"),
        ({"input": "ok", "truncate": True}, 400, "truncate"),
    ],
)
def test_bad_requests_are_openai_errors(api: httpx.Client, fields: dict[str, Any], status: int, param: str) -> None:
    r = embed(api, **fields)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"]
    assert embed(api, input="ok", dimensions=384).status_code == 200  # the model's own size is fine


try:
    from langchain_tests.integration_tests import EmbeddingsIntegrationTests
except ImportError:  # pragma: no cover - the test extra installs it
    EmbeddingsIntegrationTests = object  # type: ignore[assignment,misc]


class TestOpenAIEmbeddingsOnRagspecServe(EmbeddingsIntegrationTests):
    """LangChain's standard integration suite for ``OpenAIEmbeddings`` against the server."""

    @property
    def embeddings_class(self) -> type:
        return pytest.importorskip("langchain_openai").OpenAIEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        (url,) = _urls
        return {"base_url": f"{url}/v1", "api_key": "unused", "model": MODEL, "check_embedding_ctx_length": False}
