"""``/v1/chat/completions`` with ``"retrieval"``: the conversation answered over the server's index
exactly as ``DocumentQA.ask(question, history=...)`` answers it (a tiny random model over the default
tokenizer, the bundled corpus indexed with the default embeddings)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.collection import Collection, update_index
from apps.web.server import AppConfig, create_app
from tests.apps.conftest import CORPUS, LiveServer, ScriptedIndexer
from tests.apps.fakes import GeneratorSource

FIRST = "When did the great flood hit Marrowford?"
FOLLOW_UP = "How many people died in it?"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def generator(lc_tokenizer: Any) -> Any:
    """A tiny random Llama with room for a conversation with passages (4096 positions)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ragspec.decoding.generator import SpeculativeGenerator
    from ragspec.backends.pytorch.loading import LoadedModel

    torch.manual_seed(7)
    config = LlamaConfig(
        vocab_size=len(lc_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=lc_tokenizer.eos_token_id,
        bos_token_id=lc_tokenizer.bos_token_id,
    )  # fmt: skip
    lm = LoadedModel(LlamaForCausalLM(config).eval(), lc_tokenizer, "tiny", torch.device("cpu"), torch.float32,
                     prompt_chunk=1)  # every shared prefix reused whole
    return SpeculativeGenerator(lm)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("v1-retrieval") / "index"
    update_index([CORPUS], folder)
    return folder


@pytest.fixture
def collection(index_dir: Path, generator: Any) -> Collection:
    from ragspec.lc import ChatRagSpec

    return Collection(index_dir, max_tokens=8, k=2, source=ChatRagSpec(generator=generator, max_tokens=8))


@pytest.fixture
def client(collection: Collection, generator: Any, tmp_path: Path) -> Iterator[httpx.Client]:
    app = create_app(AppConfig(), indexer=ScriptedIndexer(), preload=collection, sessions_root=tmp_path,
                     generation=GeneratorSource(generator))  # fmt: skip
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def ask(client: httpx.Client, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    r = client.post(CHAT, json={"model": "tiny", "messages": messages, "max_tokens": 6, "retrieval": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.timeout(300)
def test_a_v1_conversation_is_retrieved_and_answered_as_the_python_api_does(client: httpx.Client, collection: Collection) -> None:
    qa = collection.load()
    first = qa.ask(FIRST, max_tokens=6)
    second = qa.ask(FOLLOW_UP, history=[first.as_turn()], max_tokens=6)
    assert second.retrieval_query == f"{FIRST} {FOLLOW_UP}" and second.earlier_passages == len(first.passages) > 0

    one = ask(client, [{"role": "user", "content": FIRST}], cache_salt="alice")  # one client: its prefixes are reused
    assert one["choices"][0]["message"]["content"] == first.text
    retrieval = one["ragspec"]["retrieval"]
    assert retrieval["query"] == FIRST and retrieval["passages"] == len(first.passages) and retrieval["history_turns"] == 0
    assert retrieval["citations"] == [c.as_dict() for c in first.citations]
    assert one["usage"]["prompt_tokens"] == first.stats.prompt_tokens

    conversation = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                    {"role": "user", "content": FOLLOW_UP}]  # fmt: skip
    two = ask(client, conversation, cache_salt="alice")
    assert two["choices"][0]["message"]["content"] == second.text
    retrieval = two["ragspec"]["retrieval"]
    assert retrieval["query"] == second.retrieval_query  # retrieved with the conversation, not the bare follow-up
    # the server remembered the passages its first answer was shown with: the prompt extends the first one
    assert (retrieval["earlier_passages"], retrieval["history_turns"]) == (second.earlier_passages, 1)
    assert two["usage"]["prompt_tokens"] == second.stats.prompt_tokens
    assert two["ragspec"]["cached_prompt_tokens"] >= one["usage"]["prompt_tokens"] - 1

    # streamed: the same text, the retrieval in the finish chunk
    with client.stream("POST", CHAT, json={"model": "tiny", "messages": conversation, "max_tokens": 6, "retrieval": {"k": 2},
                                           "stream": True}) as r:  # fmt: skip
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == second.text and chunks[-1]["ragspec"]["retrieval"]["query"] == second.retrieval_query

    # the official client, with the extension in extra_body
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=str(client.base_url).rstrip("/") + "/v1", api_key="unused", max_retries=0) as oc:
        reply = oc.chat.completions.create(model="tiny", messages=conversation, max_tokens=6, extra_body={"retrieval": True})
    assert reply.choices[0].message.content == second.text


@pytest.mark.timeout(300)
def test_an_unbacked_answer_is_flagged_and_abstains_when_the_client_asks(client: httpx.Client, collection: Collection) -> None:
    first = collection.load().ask(FIRST, max_tokens=6)  # the random model's words back nothing
    assert not first.supported and first.note.startswith("I don't know: no passage backs this answer")
    user = [{"role": "user", "content": FIRST}]
    flagged = ask(client, user)
    assert flagged["choices"][0]["message"]["content"] == first.text  # "flag", the default: the words, and the field
    assert flagged["ragspec"]["retrieval"]["supported"] is False and flagged["ragspec"]["retrieval"]["note"] == first.note
    abstained = ask(client, user, retrieval={"unsupported": "abstain"})
    assert abstained["choices"][0]["message"]["content"] == first.note
    with client.stream("POST", CHAT, json={"model": "tiny", "messages": user, "max_tokens": 6, "stream": True,
                                           "retrieval": {"unsupported": "abstain"}}) as r:  # fmt: skip
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == first.text + "\n\n" + first.note  # a stream cannot take its words back: it ends with the flag


@pytest.mark.timeout(300)
def test_retrieval_requests_it_cannot_serve_are_400s_naming_the_parameter(client: httpx.Client, tmp_path: Path, generator: Any) -> None:
    user = {"role": "user", "content": FIRST}
    answer = {"role": "assistant", "content": "In 1871."}
    tool = {"type": "function", "function": {"name": "f", "description": "Look it up.", "parameters": {"type": "object", "properties": {}}}}
    for extra, param in [
        ({"retrieval": "yes"}, "retrieval"),
        ({"retrieval": {"k": 0}}, "retrieval.k"),
        ({"retrieval": {"top": 3}}, "retrieval"),
        ({"retrieval": {"unsupported": "hide"}}, "retrieval.unsupported"),
        ({"messages": [{"role": "system", "content": "Be brief."}, user]}, "messages[0].role"),
        ({"messages": [user, answer, {"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages[2]"),
        ({"messages": [user, answer]}, "messages[1]"),
        ({"messages": [user, user]}, "messages[1]"),
        ({"tools": [tool]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [{"role": "user", "content": "word " * 5000}]}, "messages"),
    ]:
        r = client.post(CHAT, json={"model": "tiny", "messages": [user], "max_tokens": 4, "retrieval": True, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    assert client.post(CHAT, json={"model": "tiny", "messages": [user], "max_tokens": 4, "retrieval": False}).status_code == 200

    bare = create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path, generation=GeneratorSource(generator))
    with LiveServer(bare) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post(CHAT, json={"model": "tiny", "messages": [user], "retrieval": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "retrieval" and "--index" in r.json()["error"]["message"]


def test_the_page_lists_the_preloaded_indexs_documents(client: httpx.Client, index_dir: Path) -> None:
    from retrievers.persistence import read_manifest

    want = sorted(read_manifest(index_dir)["ingest"]["files"])
    session = client.get("/api/session").json()
    assert session["preloaded"] and session["preloaded_documents"] == want and len(want) == len(list(CORPUS.iterdir()))
    assert session["documents"] == []  # the session's own uploads: none yet
