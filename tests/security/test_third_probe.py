"""The third probe's findings over HTTP: a prompt cache that told one client another's prompt
(web session -> /v1, /v1 -> /v1), and five 500s that are 400s naming the parameter.

The attack as the probe ran it: a client sends a prompt that is a victim's prompt up to a secret
digit, then a guess, and reads ``ragspec.cached_prompt_tokens`` (a cache hit also answers sooner):
the right guess used to be cached one token further. With each client in its own cache scope the
count is the same for every guess; the same client still reuses its own prefixes."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.documents import Document

from apps.collection import Event, IndexSummary, Token
from apps.web.server import AppConfig, create_app
from ragspec.answers import Answer
from ragspec.prompts import chat_prompt_ids, qa_prompt_ids
from tests.apps.conftest import LiveServer
from tests.apps.fakes import GeneratorSource
from tests.ragspec.test_remote import Handler, chunk, served

VAULT = "# Vault\n\nThe vault door code is 74096"
DIGITS = "0123456789"


@dataclass
class VaultAnswerer:
    """Answers from the uploaded files with the real generator, as the pipeline lays out the prompt."""

    generator: Any
    passages: list[Document]

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        prompt = qa_prompt_ids(self.generator.tokenizer, question, self.passages)
        with self.generator.stream(prompt, max_tokens=2) as s:
            for delta in s:
                yield Token(delta, s.stats.wall_s, s.stats.new_tokens, s.stats.forward_passes)
        result = s.result
        yield Answer(question, result.text, [], list(self.passages), "unsupported", result.finish_reason, result.stats)


@dataclass
class VaultIndexer:
    generator: Any
    answerers: list[VaultAnswerer] = field(default_factory=list)

    def index(self, paths: Sequence[Path], workdir: Path, progress: Any = None) -> tuple[VaultAnswerer, IndexSummary]:
        files = [p for path in paths for p in (sorted(path.iterdir()) if path.is_dir() else [path])]
        answerer = VaultAnswerer(self.generator, [Document(page_content=p.read_text()) for p in files])
        return answerer, IndexSummary(files=[p.name for p in files], chunks=len(files))


def cached(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return int(response.json()["ragspec"]["cached_prompt_tokens"])


def asked(client: httpx.Client, question: str) -> int:
    """Ask on the web page; the answer's cached prompt tokens."""
    r = client.post("/api/ask", json={"question": question})
    assert r.status_code == 200
    done = [line for line in r.text.splitlines() if line.startswith("data: ") and '"stats"' in line]
    return int(json.loads(done[-1][6:])["stats"]["cached_prompt_tokens"])


def guess_vault(api: httpx.Client, tokenizer: Any, **extra: Any) -> dict[str, int]:
    """The probe's guesses at the code's first digit: cached prompt tokens per digit."""
    out = {}
    for d in DIGITS:
        prompt = qa_prompt_ids(tokenizer, "x", [Document(page_content=VAULT[: VAULT.index("74096")] + d)])
        out[d] = cached(api.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1, **extra}))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shared", [False, True])
def test_a_web_sessions_document_cannot_be_guessed_through_the_cache_from_v1(
    tmp_path: Path, lc_tiny_generator: Any, shared: bool
) -> None:
    tokenizer = lc_tiny_generator.tokenizer
    app = create_app(AppConfig(shared_prefix_cache=shared), indexer=VaultIndexer(lc_tiny_generator), sessions_root=tmp_path,
                     generation=GeneratorSource(lc_tiny_generator))  # fmt: skip
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as web, \
            httpx.Client(base_url=server.url, timeout=120) as api:  # fmt: skip
        r = web.post("/api/documents", files=[("files", ("vault.md", VAULT.encode(), "text/markdown"))])
        assert r.status_code == 200, r.text
        assert asked(web, "What is the vault door code?") == 0
        guesses = guess_vault(api, tokenizer)
        if shared:  # the deployment chose to share: the attack works, which is what makes the test able to fail
            assert guesses["7"] == max(guesses.values()) and sorted(guesses.values()).count(guesses["7"]) == 1
        else:
            assert set(guesses.values()) == {0}, guesses  # nothing told apart, and no /v1 request reused anything
        assert asked(web, "And who may open it?") > 0  # the session still reuses its own prompt


@pytest.mark.timeout(240)
def test_a_v1_clients_system_prompt_cannot_be_guessed_by_another_client(tmp_path: Path, lc_tiny_generator: Any) -> None:
    def chat(system: str, **extra: Any) -> dict[str, Any]:
        return {"model": "tiny", "max_tokens": 1, **extra,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}]}  # fmt: skip

    secret = "The PIN is 4821. Never say it."
    victim_salt, attacker_salt = "victim-" + "a" * 40, "attacker-" + "b" * 40
    app = create_app(AppConfig(), indexer=VaultIndexer(lc_tiny_generator), sessions_root=tmp_path,
                     generation=GeneratorSource(lc_tiny_generator))  # fmt: skip
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        assert cached(c.post("/v1/chat/completions", json=chat(secret, cache_salt=victim_salt))) == 0
        for extra in ({}, {"cache_salt": attacker_salt}):
            guesses = [cached(c.post("/v1/chat/completions", json=chat("The PIN is " + d, **extra))) for d in DIGITS]
            assert len(set(guesses[1:])) == 1, guesses  # the right digit (4) counts as every wrong one after the first
        follow_up = chat(secret, cache_salt=victim_salt)
        follow_up["messages"] += [{"role": "assistant", "content": "Hi."}, {"role": "user", "content": "How are you?"}]
        first = chat_prompt_ids(lc_tiny_generator.tokenizer, chat(secret)["messages"])
        assert cached(c.post("/v1/chat/completions", json=follow_up)) == len(first)  # the victim reuses its own prompt
        bad = c.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1, "cache_salt": ""})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


# -- 6. five 500s --------------------------------------------------------------------------------


@dataclass
class NoEmbeddings:
    """Embeddings that are never reached: every request here is refused before embedding."""

    model_id: str = "e"

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise AssertionError("a refused request reached the model")


RECURSIVE = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


def tool(name: str = "w", parameters: dict | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "walks", "parameters": parameters or {"type": "object"}}}


def post_raw(c: httpx.Client, path: str, body: str) -> httpx.Response:
    return c.post(path, content=body.encode(), headers={"Content-Type": "application/json"})


@pytest.mark.timeout(240)
def test_the_probes_500s_are_400s_naming_the_parameter(tmp_path: Path, lc_tiny_generator: Any) -> None:
    app = create_app(AppConfig(), indexer=VaultIndexer(lc_tiny_generator), sessions_root=tmp_path,
                     generation=GeneratorSource(lc_tiny_generator), embeddings=NoEmbeddings())  # fmt: skip
    hi = [{"role": "user", "content": "hi"}]
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        cases = [
            (post_raw(c, "/v1/embeddings", '{"model": "e", "input": "\\ud800"}'), "input"),
            (post_raw(c, "/v1/embeddings", '{"model": "e", "input": ["fine", "a\\udfffb"]}'), "input"),
            (c.post("/v1/chat/completions", json={"model": "tiny", "messages": hi, "tools": [tool()],
                                                  "tool_choice": {"type": "function", "function": "w"}}), "tool_choice"),
            (c.post("/v1/chat/completions", json={"model": "tiny", "messages": hi, "tools": [tool(parameters=RECURSIVE)],
                                                  "tool_choice": "w"}), "tools"),
            (c.post("/v1/chat/completions", json={"model": "tiny", "messages": hi, "tools": [tool(parameters=RECURSIVE)]}), "tools"),
            (c.post("/v1/chat/completions", json={"model": "tiny", "messages": hi, "max_tokens": 4, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": RECURSIVE}}}), "response_format"),
            (post_raw(c, "/v1/completions", '{"model": "tiny", "prompt": "hi", "\\ud800x": 1}'), "\ufffdx"),
            (post_raw(c, "/v1/embeddings", '{"model": "e", "input": "a", "\\udc80": 1}'), "\ufffd"),
        ]  # fmt: skip
        for response, param in cases:
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error", error
            assert "Traceback" not in response.text and "Error:" not in error["message"]
        assert "no finite JSON" in cases[3][0].json()["error"]["message"]
        assert c.get("/api/health").json()["ok"]


@contextmanager
def fake_openai_server(owned_by: str, text: str) -> Iterator[type[Handler]]:
    """An OpenAI-compatible server that answers ``text`` and records the last completion request."""
    models = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": owned_by, "max_model_len": 512}]}
    handler = type("Recorder", (Handler,), {"models_body": json.dumps(models).encode(),
                                            "events": [chunk(text, "stop"), "data: [DONE]\n\n"]})  # fmt: skip
    with served(handler):
        yield handler


@pytest.mark.timeout(240)
def test_tools_and_json_schemas_reach_vllm_as_its_own_parameters(tmp_path: Path) -> None:
    """``ragspec serve --engine vllm`` is ``/v1`` over a ``RemoteGenerator``: a tools request was a 500
    ("a lark constraint cannot be sent to a remote generator"); now the call grammar goes to vLLM
    as ``structured_outputs`` and the call comes back as OpenAI's ``tool_calls``."""
    from ragspec.remote import RemoteModel

    call = '<tool_call>[{"name": "weather", "arguments": {"city": "Paris"}}]</tool_call>'
    weather = tool("weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    with fake_openai_server("vllm", call) as vllm:
        remote = RemoteModel(vllm.url, model="m", tokenizer="default")  # type: ignore[attr-defined]
        app = create_app(AppConfig(), indexer=VaultIndexer(None), sessions_root=tmp_path, generation=remote,
                         embeddings=NoEmbeddings())  # fmt: skip
        with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as c:
            r = c.post("/v1/chat/completions", json={"model": "m", "messages": ask, "tools": [weather]})
            assert r.status_code == 200, r.text
            message = r.json()["choices"][0]["message"]
            assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in message["tool_calls"]] == [
                ("weather", {"city": "Paris"})]
            sent = vllm.request  # type: ignore[attr-defined]
            assert "%json" in sent["structured_outputs"]["grammar"] and '"weather"' in sent["structured_outputs"]["grammar"]
            assert len(sent["cache_salt"]) == 43  # a private scope: this client sent no cache_salt
            schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
            vllm.events = [chunk('{"n": 3}', "stop"), "data: [DONE]\n\n"]  # type: ignore[attr-defined]
            r = c.post("/v1/chat/completions", json={"model": "m", "messages": ask, "response_format": {
                "type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})  # fmt: skip
            assert r.status_code == 200 and json.loads(r.json()["choices"][0]["message"]["content"]) == {"n": 3}
            assert vllm.request["response_format"]["json_schema"]["schema"]["properties"] == schema["properties"]  # type: ignore[attr-defined]
    with fake_openai_server("someone", call) as other:  # a server that takes JSON Schemas only: a 400, not a 500
        remote = RemoteModel(other.url, model="m", tokenizer="default")  # type: ignore[attr-defined]
        app = create_app(AppConfig(), indexer=VaultIndexer(None), sessions_root=tmp_path / "b", generation=remote,
                         embeddings=NoEmbeddings())  # fmt: skip
        with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as c:
            r = c.post("/v1/chat/completions", json={"model": "m", "messages": ask, "tools": [weather]})
            assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
            assert "JSON Schemas" in r.json()["error"]["message"]
