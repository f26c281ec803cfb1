"""OpenAI's Predicted Outputs on ``/v1``: ``prediction`` is drafted from as a reference, the output is the
same with and without it, and ``usage.completion_tokens_details`` counts the prediction's accepted and
rejected drafted tokens (a tiny random model over the default tokenizer, through the ``openai`` client)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.web.openai_api import ApiSettings, OpenAIError, parse_request, prepare
from apps.web.server import AppConfig, create_app
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.fakes import GeneratorSource

openai = pytest.importorskip("openai")

PROMPT = "Rename the function in this file:\ndef total(items):\n    return sum(item.price for item in items)\n"


@pytest.fixture
def server(tmp_path: Path, lc_tiny_generator: Any) -> Iterator[LiveServer]:
    app = create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path, generation=GeneratorSource(lc_tiny_generator))
    with LiveServer(app) as s:
        yield s


def client_for(server: LiveServer) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def check_counts(body: dict[str, Any]) -> dict[str, int]:
    """The prediction is the only reference: its counts are the ``passage`` source's drafting stats."""
    details = body["usage"]["completion_tokens_details"]
    passage = body["ragspec"]["by_source"].get("passage", {"drafted": 0, "accepted": 0})
    assert details["accepted_prediction_tokens"] == passage["accepted"]
    assert details["rejected_prediction_tokens"] == passage["drafted"] - passage["accepted"] >= 0
    return details


@pytest.mark.timeout(300)
def test_a_prediction_leaves_the_completion_unchanged_and_is_counted(server: LiveServer) -> None:
    client = client_for(server)
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=48, extra_body={"speculation": False})
    text = plain.choices[0].text
    assert plain.usage.completion_tokens_details is None  # no prediction, no prediction counts
    predicted = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=48,
                                          extra_body={"prediction": {"type": "content", "content": text}})  # fmt: skip
    assert predicted.choices[0].text == text
    details = check_counts(predicted.model_dump())
    assert details["accepted_prediction_tokens"] > 0  # the output repeats the prediction: it was drafted from it
    assert predicted.usage.completion_tokens == plain.usage.completion_tokens
    wrong = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=48,
                                      extra_body={"prediction": {"type": "content", "content": "nothing like it " * 8}})
    assert wrong.choices[0].text == text
    assert check_counts(wrong.model_dump())["accepted_prediction_tokens"] < details["accepted_prediction_tokens"]


@pytest.mark.timeout(300)
def test_chat_streamed_with_a_prediction_in_text_parts(server: LiveServer) -> None:
    client = client_for(server)
    messages = [{"role": "user", "content": PROMPT}]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40)
    text = plain.choices[0].message.content
    half = len(text) // 2
    parts = [{"type": "text", "text": text[:half]}, {"type": "text", "text": text[half:]}]
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, stream=True,
                                            stream_options={"include_usage": True},
                                            prediction={"type": "content", "content": parts})  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens
    assert usage.completion_tokens_details.accepted_prediction_tokens > 0
    assert usage.completion_tokens_details.rejected_prediction_tokens >= 0


@pytest.mark.parametrize(
    "prediction",
    [{"type": "content"}, {"type": "text", "content": "x"}, {"type": "content", "content": 3},
     {"type": "content", "content": [{"type": "image_url", "image_url": "x"}]}, {"type": "content", "content": []},
     {"type": "content", "content": "x", "extra": 1}, "x"],
)
def test_a_malformed_prediction_is_a_400_naming_it(prediction: object) -> None:
    with pytest.raises(OpenAIError) as e:
        parse_request({"model": "m", "prompt": "p", "prediction": prediction}, chat=False)
    assert e.value.status == 400 and e.value.param == "prediction"


def test_a_prediction_with_retrieval_is_a_400() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "retrieval": True,
            "prediction": {"type": "content", "content": "x"}}  # fmt: skip
    with pytest.raises(OpenAIError) as e:
        parse_request(body, chat=True)
    assert e.value.status == 400 and e.value.param == "prediction"


def test_a_server_that_generates_elsewhere_refuses_a_prediction() -> None:
    """``--engine vllm`` and ``--generator-url``: the generator is remote, nothing there drafts from the prediction."""
    request = parse_request({"model": "m", "prompt": "p", "prediction": {"type": "content", "content": "x"}}, chat=False)
    remote = types.SimpleNamespace(tokenizer=None, context_length=512)  # a RemoteGenerator has no drafter
    with pytest.raises(OpenAIError) as e:
        prepare(remote, request, ApiSettings(model_id="m", max_tokens=16))
    assert e.value.status == 400 and e.value.param == "prediction" and "ragspec's own engine" in e.value.message
