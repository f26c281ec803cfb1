"""``RemoteEmbeddings`` and ``--embeddings-url`` against ragspec's own ``POST /v1/embeddings`` on 127.0.0.1, with a
PostgreSQL store (the session's `pg_server`) recording the model's name and refusing another."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from langchain_core.embeddings import DeterministicFakeEmbedding

from apps import cli
from apps.web.embeddings_api import add_embeddings_route
from apps.web.openai_api import OpenAIError
from retrievers.errors import EmbeddingModelError
from retrievers.remote_embeddings import RemoteEmbeddings
from tests.apps.conftest import LiveServer
from tests.helpers import write_notes

pytestmark = pytest.mark.timeout(300)


class ServedModel(DeterministicFakeEmbedding):
    """What the route needs of a model: vectors, token counts, a dimension; counts the requests' texts."""

    seen: list[list[str]] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.seen.append(list(texts))
        return super().embed_documents(texts)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(t.split()) for t in texts]

    @property
    def dimension(self) -> int:
        return self.size


@pytest.fixture(scope="module")
def served() -> object:
    model = ServedModel(size=16, seen=[])
    app = FastAPI()

    async def openai_error(request: object, exc: OpenAIError) -> object:  # as `ragspec serve` answers errors
        return exc.response()

    app.add_exception_handler(OpenAIError, openai_error)  # type: ignore[arg-type]
    add_embeddings_route(app, model, "fake-minilm")
    with LiveServer(app) as server:
        yield server, model


def test_remote_vectors_are_the_served_models_in_order_and_batches(served: tuple) -> None:
    server, model = served
    texts = [f"text number {i}" for i in range(7)]
    remote = RemoteEmbeddings(f"{server.url}/v1", "fake-minilm", batch_size=3, api_key="s3cret")
    model.seen.clear()
    vectors = remote.embed_documents(texts)
    local = DeterministicFakeEmbedding(size=16).embed_documents(texts)
    assert [len(batch) for batch in model.seen] == [3, 3, 1]
    assert np.allclose(vectors, local, atol=1e-6)  # float32 on the wire
    assert np.allclose(remote.embed_query("text number 2"), local[2], atol=1e-6)
    assert remote.model_id == "fake-minilm" and "s3cret" not in repr(remote)


def test_remote_failures_are_clear(served: tuple) -> None:
    server, _ = served
    with pytest.raises(EmbeddingModelError, match="answered 404: the embedding model 'other'"):
        RemoteEmbeddings(f"{server.url}/v1", "other").embed_query("x")
    port = server.port
    with pytest.raises(EmbeddingModelError, match="cannot reach"):
        RemoteEmbeddings(f"http://127.0.0.1:{port + 1 if port < 65535 else 1}/v1", "m", timeout_s=2).embed_query("x")
    with pytest.raises(ValueError, match="http"):
        RemoteEmbeddings("gpu-box:8000", "m")


def test_ingest_and_ask_embed_on_the_server_and_the_collection_refuses_another_model(
    served: tuple, tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")
    server, model = served
    monkeypatch.setattr(cli, "_quiet_model_loading", lambda: None)
    docs = write_notes(tmp_path / "docs", 3, "The ferry number {i} leaves at {hour}.", "n{i}.md")
    remote = ["--embeddings-url", f"{server.url}/v1", "--embeddings-model", "fake-minilm"]
    model.seen.clear()
    assert cli.main(["ingest", str(docs), "--store", pg_url, "--collection", "r", "--no-progress", *remote]) == 0
    assert "Indexed 3 passages" in capsys.readouterr().out and sum(len(b) for b in model.seen) == 3
    args = cli.build_parser().parse_args(["ask", "ferry 2", "--store", pg_url, "--collection", "r", *remote])
    found = cli._collection(args).load().retriever.invoke("ferry number 2")
    assert Path(found[0].metadata["source"]).name == "n2.md" and model.seen[-1] == ["ferry number 2"]
    # the bundled model (another name) may not write into or read this collection
    assert cli.main(["ask", "ferry 2", "--store", pg_url, "--collection", "r"]) == 1
    assert "was built with embeddings 'fake-minilm'" in capsys.readouterr().err
    assert cli.main(["ingest", str(docs), "--embeddings-model", "fake-minilm"]) == 1
    assert "--embeddings-model needs --embeddings-url" in capsys.readouterr().err
