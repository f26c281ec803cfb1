"""``ragspec serve``'s OpenAI-compatible API through the official clients, against a real server.

The integration tests share one ``ragspec serve`` subprocess on the default model (a free
loopback port, an API key, a queue of one and a short queue timeout, so that the concurrency
test can fill it). Requests ask for few tokens: the tests check the protocol, not the model.
The first tests run offline and fast: the queue itself, and the web page and ``/v1`` sharing it
in one app over a tiny random model.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.web.queue import ModelQueue, QueueFullError, QueueTimeoutError
from apps.web.server import AppConfig, create_app
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.fakes import GeneratorSource as TinySource
from tests.apps.ragspec_server import ServeProcess

openai = pytest.importorskip("openai")

integration = pytest.mark.integration

KEY = "test-key-" + secrets.token_urlsafe(18)
QUEUE_TIMEOUT_S = 2
MAX_TOKENS = 1024
"""The server's cap; long enough that counting to it outlasts the queue timeout."""
MESSAGES = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "What colour is the sky on a clear day?"},
]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


# -- offline: the queue, and the web page and /v1 sharing it -----------------------------------


def test_the_model_queue_is_bounded_first_come_first_served_and_released_once() -> None:
    async def scenario() -> None:
        queue = ModelQueue(slots=1, max_waiting=2)
        first = queue.ticket()
        await first.wait(1)
        second, third = queue.ticket(), queue.ticket()
        with pytest.raises(QueueFullError) as full:
            queue.ticket()
        assert full.value.retry_after_s >= 1 and (queue.running, queue.waiting) == (1, 2)
        order: list[str] = []

        async def take(name: str, ticket: Any) -> None:
            await ticket.wait(5)
            order.append(name)
            ticket.release()

        tasks = [asyncio.create_task(take("second", second)), asyncio.create_task(take("third", third))]
        await asyncio.sleep(0.05)
        assert order == [] and queue.busy
        first.release()
        first.release()  # idempotent: the slot is given back once
        await asyncio.gather(*tasks)
        assert order == ["second", "third"] and (queue.running, queue.waiting) == (0, 0) and not queue.busy

        holder = queue.ticket()
        await holder.wait(1)
        late = queue.ticket()
        with pytest.raises(QueueTimeoutError):
            await late.wait(0.05)
        assert (queue.running, queue.waiting) == (1, 0)  # the timed-out request left the queue
        cancelled = asyncio.create_task(queue.ticket().wait(5))
        await asyncio.sleep(0.02)
        cancelled.cancel()  # a client that went away while waiting
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert queue.waiting == 0
        holder.release()
        assert not queue.busy

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_web_questions_and_v1_calls_share_one_bounded_queue(tmp_path: Path, lc_tiny_generator: Any) -> None:
    backend = ScriptedIndexer(delay_s=0.05, words=["word "] * 200)  # 10 s unless stopped
    app = create_app(AppConfig(max_queue=0), indexer=backend, sessions_root=tmp_path, generation=TinySource(lc_tiny_generator))
    completion = {"model": "tiny", "prompt": "Hello there", "max_tokens": 3}
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny"
        assert c.post("/api/documents", files=[("files", ("a.md", b"# A\n\nText.\n", "text/markdown"))]).status_code == 200
        with c.stream("POST", "/api/ask", json={"question": "long"}) as web:
            assert web.status_code == 200
            assert backend.answerers[0].generating.wait(10)  # the web answer holds the only slot
            busy = c.post("/v1/completions", json=completion)
            assert busy.status_code == 429 and int(busy.headers["retry-after"]) >= 1
            assert busy.json()["error"]["code"] == "queue_full" and busy.json()["error"]["type"] == "rate_limit_error"
            second = c.post("/api/ask", json={"question": "also"})
            assert second.status_code == 429 and second.json()["code"] == "queue_full"
        assert backend.answerers[0].ended.wait(10)  # leaving stopped the web answer
        deadline = time.monotonic() + 5
        while c.get("/api/health").json()["busy"] and time.monotonic() < deadline:
            time.sleep(0.02)
        r = c.post("/v1/completions", json=completion)
        assert r.status_code == 200, r.text
        body = r.json()
        assert 1 <= body["usage"]["completion_tokens"] <= 3 and body["ragspec"]["queue_s"] < 1
        assert body["choices"][0]["text"] == lc_tiny_generator.generate("Hello there", max_new_tokens=3).text

        # response_format: a grammar holds even a random model to the schema
        schema = {
            "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
            "additionalProperties": False,
        }  # fmt: skip
        fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        r = c.post("/v1/completions", json={**completion, "max_tokens": 24, "response_format": fmt})
        assert r.status_code == 200, r.text
        assert json.loads(r.json()["choices"][0]["text"])["answer"] in ("yes", "no")
        bad = c.post("/v1/completions", json={**completion, "response_format": {"type": "json_schema", "json_schema": {}}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"


@pytest.mark.timeout(120)
def test_token_ids_outside_the_vocabulary_are_a_400_not_a_crash(tmp_path: Path, lc_tiny_generator: Any) -> None:
    app = create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path, generation=TinySource(lc_tiny_generator))
    vocab = len(lc_tiny_generator.target.tokenizer)
    ok = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        for body, param in [
            ({**ok, "references": [[1, 2, 3, vocab]]}, "references"),
            ({**ok, "references": [[1, 2**70]]}, "references"),
            ({**ok, "prompt": [1, vocab]}, "prompt"),
        ]:
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert c.post("/v1/completions", json={**ok, "references": [[1, 2, 3, vocab - 1]]}).status_code == 200


@pytest.mark.timeout(120)
def test_penalties_are_taken_exactly_as_the_generator_takes_them(tmp_path: Path, lc_tiny_generator: Any) -> None:
    app = create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path, generation=TinySource(lc_tiny_generator))
    # Negative: this random model never repeats itself unless pushed to (then it does at once).
    penalties = {"frequency_penalty": -0.4, "presence_penalty": -1.5, "repeat_penalty": 0.7, "repeat_last_n": 8}
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    want = lc_tiny_generator.generate(prompt, max_new_tokens=24, **penalties).text
    assert want != lc_tiny_generator.generate(prompt, max_new_tokens=24).text, "the penalties change this answer"
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 24, **penalties})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want, r.text
        for name, bad in [("frequency_penalty", 2.5), ("presence_penalty", "a lot"), ("repeat_penalty", 0),
                          ("repeat_last_n", -5)]:  # fmt: skip
            r = c.post("/v1/completions", json={"model": "tiny", "prompt": prompt, name: bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == name and name in r.json()["error"]["message"]


# -- against a real server on the default model ------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    process = ServeProcess(
        "--max-queue", "1", "--queue-timeout", str(QUEUE_TIMEOUT_S), "--max-tokens", str(MAX_TOKENS), api_key=KEY
    )  # fmt: skip
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture
def client(server: ServeProcess) -> Any:
    """The official client; no retries, so a 429 or 503 reaches the test."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=300) as c:
        yield c


def ragspec_stats(obj: Any) -> dict[str, Any]:
    """The ``ragspec`` extension object beside the standard fields."""
    extra = obj.model_extra or {}
    assert "ragspec" in extra, f"no ragspec object in {obj}"
    return extra["ragspec"]


def wait_until(condition: Callable[[], bool], timeout_s: float) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not true within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic() - start


@integration
@pytest.mark.timeout(420)
def test_models_lists_the_served_model(client: Any) -> None:
    # the chat model by the name it is served as, then by its own (both accepted), then the embedding model
    model, own, embeddings = client.models.list().data
    assert model.id == "default" and model.owned_by == "ragspec"
    assert own.id == "SmolLM2-135M-Instruct" and client.models.retrieve(own.id).id == own.id
    assert embeddings.id == "sentence-transformers/all-MiniLM-L6-v2" and embeddings.model_extra["ragspec"]["kind"] == "embeddings"
    assert model.model_extra["max_model_len"] > 1000 and model.model_extra["ragspec"]["name"] == "SmolLM2-135M-Instruct"
    assert client.models.retrieve("default").id == "default"


@integration
@pytest.mark.timeout(300)
def test_chat_completion_and_its_stream_agree(client: Any, lc_tokenizer: Any) -> None:
    r = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=8)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == "default" and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    template = lc_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(lc_tokenizer.encode(template, add_special_tokens=False))
    stats = ragspec_stats(r)
    assert 1 <= r.usage.completion_tokens == stats["new_tokens"] <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert stats["forward_passes"] >= 1 and stats["tokens_per_forward"] > 0 and isinstance(stats["by_source"], dict)
    assert stats["finish_reason"] in ("eos", "length") and {"acceptance_rate", "queue_s", "wall_s"} <= set(stats)

    chunks = list(
        client.chat.completions.create(
            model="default", messages=MESSAGES, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    (finish,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish.choices[0].finish_reason == choice.finish_reason
    assert ragspec_stats(finish)["new_tokens"] == r.usage.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == r.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


@integration
@pytest.mark.timeout(300)
def test_completions_stop_token_prompts_and_streaming(client: Any, lc_tokenizer: Any) -> None:
    prompt = "Monday, Tuesday, Wednesday,"
    plain = client.completions.create(model="default", prompt=prompt, max_tokens=6)
    text = plain.choices[0].text
    assert plain.object == "text_completion" and len(text.split()) >= 3, text

    stop = text.split()[1]  # a string the greedy answer is known to reach
    stopped = client.completions.create(model="default", prompt=prompt, max_tokens=6, stop=["never there", stop])
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop" and ragspec_stats(stopped)["finish_reason"] == "stop"

    ids = lc_tokenizer.encode(prompt, add_special_tokens=True)  # what the server makes of the text
    by_ids = client.completions.create(model="default", prompt=ids, max_tokens=6, stream=True)
    chunks = list(by_ids)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert ragspec_stats(chunks[-1])["prompt_tokens"] == len(ids)


@integration
@pytest.mark.timeout(300)
def test_references_are_drafted_from_and_leave_the_answer_unchanged(client: Any) -> None:
    passage = "The ferry to Marrow Island leaves at seven in the morning and returns at six in the evening."
    # only the reference holds the passage, and the answer so far matches it over many tokens: worth drafting
    # from, whatever the server's policy learnt in earlier tests
    prompt = "Question: When does the ferry to Marrow Island leave and return?\nAnswer: The ferry to Marrow Island leaves at seven in the morning and"
    # with references first: afterwards the server's index of earlier answers holds this answer too
    with_refs = client.completions.create(model="default", prompt=prompt, max_tokens=12, extra_body={"references": [passage]})
    without = client.completions.create(model="default", prompt=prompt, max_tokens=12)
    assert with_refs.choices[0].text == without.choices[0].text  # lossless: drafts never change greedy output
    drafted = ragspec_stats(with_refs)["by_source"]
    # The server's adaptive policy may decline to draft at all after the timings of earlier tests on a loaded
    # machine (seen in full-suite runs); when it drafts, the reference is what it copies from.
    assert "passage" in drafted or drafted == {}
    assert "passage" not in ragspec_stats(without)["by_source"]


def post(server: ServeProcess, path: str, body: object, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers, timeout=120, **kwargs)


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": "default", "messages": MESSAGES, "max_tokens": 4, **fields}


@integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [
        (CHAT, chat_body(n=2), 400, "n", "unsupported_parameter"),
        (CHAT, chat_body(temperature=3), 400, "temperature", None),
        (CHAT, chat_body(top_p=0), 400, "top_p", None),
        (CHAT, chat_body(seed=-1), 400, "seed", None),
        (CHAT, chat_body(max_tokens=0), 400, "max_tokens", None),
        (CHAT, chat_body(max_tokens=MAX_TOKENS + 1), 400, "max_tokens", None),
        (CHAT, chat_body(max_completion_tokens=10**6), 400, "messages", "context_length_exceeded"),
        (CHAT, chat_body(stop=[""]), 400, "stop", None),
        (CHAT, chat_body(logprobs=True), 400, "logprobs", "unsupported_parameter"),
        (CHAT, chat_body(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools[0]", None),
        (CHAT, chat_body(response_format={"type": "xml"}), 400, "response_format", None),
        (CHAT, chat_body(response_format={"type": "json_schema", "json_schema": {"schema": 3}}), 400, "response_format", None),
        (CHAT, chat_body(frobnicate=1), 400, "frobnicate", None),
        (CHAT, chat_body(messages=[{"role": "function", "content": "x"}]), 400, "messages[0].role", None),
        (CHAT, chat_body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400, "messages[0].content", None),
        (CHAT, chat_body(references="not a list"), 400, "references", None),
        (CHAT, chat_body(speculation={"max_draft": 0}), 400, "speculation.max_draft", None),
        (CHAT, chat_body(speculation="off"), 400, "speculation", None),
        (CHAT, chat_body(model="gpt-4o"), 404, "model", "model_not_found"),
        (COMPLETIONS, {"model": "default", "prompt": ["one", "two"]}, 400, "prompt", None),
        (COMPLETIONS, {"model": "default", "prompt": [10**9]}, 400, "prompt", None),
        (COMPLETIONS, {"model": "default", "prompt": "hello " * 9000}, 400, "prompt", "context_length_exceeded"),
        (COMPLETIONS, {"model": "default", "prompt": "x", "echo": True}, 400, "echo", "unsupported_parameter"),
        (COMPLETIONS, [1, 2], 400, None, None),
    ],
)
def test_errors_are_openai_error_objects(
    server: ServeProcess, path: str, body: object, status: int, param: str | None, code: str | None
) -> None:
    r = post(server, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code)
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


@integration
@pytest.mark.timeout(120)
def test_malformed_requests_and_unknown_routes(server: ServeProcess, client: Any) -> None:
    r = httpx.post(f"{server.url}{CHAT}", content=b"{not json", headers=server.headers, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(f"{server.url}/v1/no-such-route", headers=server.headers, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.delete(f"{server.url}/v1/models", headers=server.headers, timeout=60)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=MESSAGES, n=3)
    assert e.value.status_code == 400 and e.value.body["param"] == "n" and "one sequence" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


@integration
@pytest.mark.timeout(120)
def test_a_body_over_the_limit_is_413(server: ServeProcess) -> None:
    big = json.dumps({"model": "default", "prompt": "x" * 2**20}).encode()
    r = httpx.post(f"{server.url}{COMPLETIONS}", content=big, headers={**server.headers, "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it arrives
        yield b'{"model": "default", "prompt": "'
        for _ in range(20):
            yield b"x" * 2**16
        yield b'"}'

    r = httpx.post(f"{server.url}{COMPLETIONS}", content=chunks(), headers={**server.headers, "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


@integration
@pytest.mark.timeout(120)
def test_the_api_key_is_required_on_every_v1_route_and_never_logged(server: ServeProcess) -> None:
    for method, path in [("GET", "/v1/models"), ("GET", "/v1/models/default"), ("POST", CHAT), ("POST", COMPLETIONS)]:
        for headers in ({}, {"Authorization": "Bearer wrong-key-123456789012"}, {"Authorization": KEY}):
            r = httpx.request(method, f"{server.url}{path}", json=chat_body(), headers=headers, timeout=60)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, path, headers)
            assert r.json()["error"] == {
                "message": "missing or wrong API key: send 'Authorization: Bearer KEY'",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            }
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong-key-123456789012", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    assert KEY not in server.output()


def first_text(lines: Iterator[str]) -> str:
    """Read a completions stream until its first non-empty text."""
    for line in lines:
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                return chunk["choices"][0]["text"]
    raise AssertionError("the stream ended without text")


@integration
@pytest.mark.timeout(600)
def test_full_queue_429_long_wait_503_and_a_client_that_leaves_frees_the_model(server: ServeProcess, client: Any) -> None:
    # counting never ends by itself: the model is busy for all MAX_TOKENS tokens (many seconds)
    long_request = {"model": "default", "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": MAX_TOKENS, "stream": True}
    waiting: dict[str, Any] = {}

    def wait_in_queue() -> None:
        try:
            waiting["response"] = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2)
        except openai.APIStatusError as e:
            waiting["error"] = e

    with httpx.Client(base_url=server.url, headers=server.headers, timeout=300) as http:
        with http.stream("POST", COMPLETIONS, json=long_request) as a:  # holds the model
            assert a.status_code == 200 and a.headers["content-type"].startswith("text/event-stream")
            lines = a.iter_lines()  # keep it: dropping the iterator would close the connection (httpcore)
            first_text(lines)
            started = time.monotonic()
            b = threading.Thread(target=wait_in_queue)
            b.start()
            wait_until(lambda: server.health()["queue"] == 1, 60)  # the queue (of one) is full

            with pytest.raises(openai.RateLimitError) as full:
                client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2)
            assert int(full.value.response.headers["retry-after"]) >= 1
            assert full.value.body["type"] == "rate_limit_error" and full.value.body["code"] == "queue_full"

            b.join(timeout=QUEUE_TIMEOUT_S + 120)
            waited = time.monotonic() - started
            timed_out = waiting.get("error")
            assert timed_out is not None and timed_out.status_code == 503, waiting
            assert timed_out.body["code"] == "queue_timeout" and int(timed_out.response.headers["retry-after"]) >= 1
            assert waited >= QUEUE_TIMEOUT_S * 0.9
            assert server.health()["busy"] is True  # the long answer is still being generated
        # leaving the with-block closes the connection mid-stream
    freed_after = wait_until(lambda: server.health() == {"ok": True, "queue": 0, "busy": False, "running": 0, "waiting": 0, "slots": 1}, 10)
    assert freed_after < 5

    start = time.monotonic()
    after = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2)
    assert after.choices[0].message.content and ragspec_stats(after)["queue_s"] < 1.0
    assert time.monotonic() - start < 120


@integration
@pytest.mark.timeout(300)
def test_response_format_json_schema_constrains_the_answer(client: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 12}, "certain": {"type": "boolean"}},
        "required": ["colour", "certain"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "sky", "schema": schema}},
    )  # fmt: skip
    answer = json.loads(r.choices[0].message.content)
    assert set(answer) == {"colour", "certain"} and isinstance(answer["certain"], bool)
    assert "grammar" in ragspec_stats(r)["by_source"]  # keys and punctuation are forced, so drafted for free


@integration
@pytest.mark.timeout(300)
def test_langchain_chat_openai_talks_to_the_server(server: ServeProcess, client: Any) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        base_url=f"{server.url}/v1", api_key=KEY, model="default", max_tokens=8, temperature=0, max_retries=0
    )
    expected = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=8, temperature=0)
    turns = [(m["role"], m["content"]) for m in MESSAGES]
    message = llm.invoke(turns)
    assert message.content == expected.choices[0].message.content
    assert message.usage_metadata["output_tokens"] == expected.usage.completion_tokens
    assert "".join(str(chunk.content) for chunk in llm.stream(turns)) == expected.choices[0].message.content


@pytest.mark.parametrize(
    ("value", "param"),
    [({"max_draft": 0}, "speculation.max_draft"), ({"max_draft": 1.5}, "speculation.max_draft"),
     ({"enabled": "no"}, "speculation.enabled"), ({"draft": 2}, "speculation"), ("off", "speculation"), (1, "speculation")],
)
def test_a_bad_speculation_setting_is_a_400_naming_it(value: object, param: str) -> None:
    from apps.web.openai_api import OpenAIError, parse_request
    from ragspec.engine.config import GenerationConfig

    with pytest.raises(OpenAIError) as e:
        parse_request(chat_body(speculation=value), chat=True)
    assert e.value.status == 400 and e.value.param == param
    for good, limit in (({"enabled": False}, 0), (False, 0), ({"max_draft": 4}, 4), (True, None)):
        request = parse_request(chat_body(speculation=good), chat=True)
        assert GenerationConfig().merged(request.options).speculation.limit == limit
