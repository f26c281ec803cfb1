"""The remote generator against servers that misbehave: clear errors, never a cut answer passed off as whole."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ragspec.engine.results import TextGenerator
from ragspec.engine.config import VLLM_MAX_DRAFT_ARG
from ragspec.remote import RemoteGenerationError, RemoteGenerator, RemoteModel


class Handler(BaseHTTPRequestHandler):
    """``/v1/models`` answers ``models_body``; ``/v1/completions`` streams ``events`` and closes."""

    models_body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
    events: list[str] = []
    request: dict = {}
    """The last completion request's body."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.models_body)))
        self.end_headers()
        self.wfile.write(self.models_body)

    def do_POST(self) -> None:
        type(self).request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for event in self.events:
                self.wfile.write(event.encode())
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # a client that stops reading (a cut answer) leaves
            pass


def chunk(text: str, finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}) + "\n\n"


@contextmanager
def served(handler: type[Handler]) -> Iterator[str]:
    """``handler`` answering on a local port until the block ends; yields (and sets as ``handler.url``) its ``/v1`` URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    handler.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"  # type: ignore[attr-defined]
    try:
        yield handler.url  # type: ignore[attr-defined]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server() -> Iterator[type[Handler]]:
    handler = type("ThisHandler", (Handler,), {})
    with served(handler):
        yield handler


def generator(server: type[Handler]) -> object:
    return RemoteModel(server.url, model="m", tokenizer="default").load()  # type: ignore[attr-defined]


def answer_and_facts(gen: TextGenerator, prompt: str) -> tuple[str, str, int, list[int]]:
    """What a caller (``DocumentQA``, the LangChain classes, the apps) reads of any generator, typed by the protocol."""
    return gen.generate(prompt, max_tokens=4).text, gen.model_name, gen.context_length, gen.encode(prompt, special_tokens=False)


@pytest.mark.timeout(120)
def test_the_local_and_the_remote_generator_are_one_protocol(server: type[Handler], lc_tiny_generator: object) -> None:
    server.events = [chunk("The ferry"), chunk(" leaves", "stop"), "data: [DONE]\n\n"]
    remote = generator(server)
    for gen in (lc_tiny_generator, remote):
        assert isinstance(gen, TextGenerator)
    assert not hasattr(remote, "lm")  # nothing imitates a loaded model any more
    text, name, context, ids = answer_and_facts(remote, "Hello")
    assert (text, name, ids) == ("The ferry leaves", "m", list(remote.tokenizer.encode("Hello", add_special_tokens=False)))
    assert context >= 2
    local = lc_tiny_generator
    _, name, context, ids = answer_and_facts(local, "Hello")  # type: ignore[arg-type]
    assert (name, context) == (local.target.name, local.target.context_length)  # type: ignore[attr-defined]
    assert ids == list(local.target.tokenizer.encode("Hello", add_special_tokens=False))  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_a_stream_that_ends_without_a_finish_reason_is_an_error(server: type[Handler]) -> None:
    server.events = [chunk("The ferry"), chunk(" leaves")]  # then the connection closes
    with pytest.raises(RemoteGenerationError, match="ended without a finish_reason after 16 characters"):
        generator(server).generate("Hello", max_new_tokens=8)
    server.events = [chunk("The ferry"), chunk(" leaves", "stop"), "data: [DONE]\n\n"]
    assert generator(server).generate("Hello", max_new_tokens=8).text == "The ferry leaves"


@pytest.mark.timeout(60)
def test_a_last_event_cut_off_is_an_error_not_a_json_traceback(server: type[Handler]) -> None:
    server.events = [chunk("The"), 'data: {"choices": [{"text": " fer']
    with pytest.raises(RemoteGenerationError, match="last event is not JSON"):
        generator(server).generate("Hello", max_new_tokens=8)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", [b"<html>proxy error</html>", b"[1, 2]"])
def test_a_model_list_that_is_not_one_is_a_clear_error(server: type[Handler], body: bytes) -> None:
    server.models_body = body
    with pytest.raises(RemoteGenerationError, match="did not answer with an OpenAI model list"):
        RemoteModel(server.url).load().generate("Hello", max_new_tokens=2)  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_iterating_a_finished_stream_again_keeps_its_result(server: type[Handler]) -> None:
    server.events = [chunk("Yes", "stop"), "data: [DONE]\n\n"]
    stream = generator(server).stream("Hello", max_new_tokens=4)  # type: ignore[attr-defined]
    assert list(stream) == ["Yes"] and stream.result is not None
    result = stream.result
    assert list(stream) == [] and stream.result is result


@pytest.mark.timeout(60)
def test_penalties_travel_by_the_names_servers_know(server: type[Handler]) -> None:
    server.events = [chunk("Yes", "stop"), "data: [DONE]\n\n"]
    gen = generator(server)
    gen.generate("Is it?", frequency_penalty=0.5, presence_penalty=-0.25, repeat_penalty=1.2, repeat_last_n=32)
    sent = server.request  # type: ignore[attr-defined]
    assert (sent["frequency_penalty"], sent["presence_penalty"], sent["repeat_penalty"], sent["repeat_last_n"]) == (
        0.5, -0.25, 1.2, 32)
    gen.generate("Is it?")
    assert not {"frequency_penalty", "presence_penalty", "repeat_penalty", "repeat_last_n"} & set(server.request)  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_vllm_answers_keep_the_servers_token_ids(server: type[Handler]) -> None:
    """vLLM returns the ids it decoded: the result holds those (EOS left out), not the text encoded again."""
    server.models_body = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}'
    event = {"choices": [{"index": 0, "text": "Hi", "token_ids": [17, 4], "finish_reason": None}]}
    last = {"choices": [{"index": 0, "text": "", "token_ids": [2], "finish_reason": "stop", "stop_reason": None}]}
    server.events = ["data: " + json.dumps(event) + "\n\n", "data: " + json.dumps(last) + "\n\n", "data: [DONE]\n\n"]
    result = RemoteGenerator(server.url, model="m", tokenizer="default").generate("Hello", max_new_tokens=8)  # type: ignore[attr-defined]
    assert server.request["return_token_ids"] is True  # type: ignore[attr-defined]
    assert result.token_ids == [17, 4] and result.text == "Hi" and result.finish_reason == "eos"
    server.models_body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
    server.events = [chunk("Hi", "stop"), "data: [DONE]\n\n"]
    other = RemoteGenerator(server.url, model="m", tokenizer="default")  # type: ignore[attr-defined]
    result = other.generate("Hello", max_new_tokens=8)
    assert "return_token_ids" not in server.request  # type: ignore[attr-defined]
    assert result.token_ids == other.encode("Hi", special_tokens=False)


@pytest.mark.timeout(60)
def test_a_requests_speculation_setting_reaches_vllms_proposer_as_extra_args(server: type[Handler]) -> None:
    """To vLLM, ``speculation`` travels as ``vllm_xargs`` (the request's sampling params' ``extra_args``,
    which ragspec's proposer reads); nothing is sent when the request leaves it to the server."""
    server.models_body = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}'
    gen = RemoteGenerator(server.url, model="m", tokenizer="default")  # type: ignore[attr-defined]
    for setting, sent in (({"enabled": False}, 0), ({"max_draft": 3}, 3), (False, 0), (True, None)):
        server.events = [chunk("Hi", "stop"), "data: [DONE]\n\n"]
        gen.generate("Hello", max_new_tokens=8, speculation=setting)
        xargs = server.request.get("vllm_xargs")  # type: ignore[attr-defined]
        assert xargs == (None if sent is None else {VLLM_MAX_DRAFT_ARG: sent})


def _first_repeat(ids: list[int], n: int) -> int | None:
    """Brute force: where the answer starts an ``n``-token copy of an earlier stretch of itself."""
    for end in range(n, len(ids) + 1):
        if any(ids[j : j + n] == ids[end - n : end] for j in range(end - n)):
            return end - n
    return None


@pytest.mark.timeout(60)
def test_vllm_answers_end_where_they_start_repeating_themselves(server: type[Handler]) -> None:
    """vLLM has no repetition stop: the remote generator applies ``repetition_stop`` to the ids vLLM
    streams, shows none of the repeat, and ends the answer there (finish_reason "repetition")."""
    server.models_body = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}'
    gen = RemoteGenerator(server.url, model="m", tokenizer="default")  # type: ignore[attr-defined]
    loop = gen.encode("The ferry leaves at noon. It leaves at noon. It leaves at noon. It leaves at noon.",
                      special_tokens=False)
    server.events = [
        "data: " + json.dumps({"choices": [{"index": 0, "text": gen.tokenizer.decode([t]), "token_ids": [t],
                                            "finish_reason": None}]}) + "\n\n"
        for t in loop
    ] + ["data: " + json.dumps({"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "length"}]}) + "\n\n",
         "data: [DONE]\n\n"]
    for n in (4, 6):
        stream = gen.stream("Hello", max_new_tokens=64, repetition_stop=n)
        shown = "".join(stream)
        cut = _first_repeat(loop, n)
        assert cut is not None and cut < len(loop)
        assert stream.result.finish_reason == "repetition"
        assert stream.result.token_ids == loop[:cut] and shown == stream.result.text == gen.tokenizer.decode(loop[:cut])
    whole = gen.generate("Hello", max_new_tokens=64, repetition_stop=0)  # off: the loop comes back whole
    assert whole.token_ids == loop and whole.finish_reason == "length"


VLLM_SPEC_METRICS = {  # vLLM 0.32's ``metrics.speculative_decoding`` (summary level) for 5 verify steps, k=4
    "mean_acceptance_length": 1 + 9 / 5, "draft_acceptance_rate": 9 / 18, "acceptance_histogram": [1, 1, 2, 0, 1],
    "num_spec_steps": 5, "num_accepted_draft_tokens": 9, "num_draft_tokens": 18, "num_spec_tokens": 4,
}


@pytest.mark.timeout(60)
def test_vllms_per_request_drafting_metrics_become_the_stats(server: type[Handler]) -> None:
    """The final usage chunk's ``metrics.speculative_decoding`` fills the drafting figures, which read
    back in the same shape; without it there are none (and vLLM counts no forwards: 0, not measured)."""
    server.models_body = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}'
    last = {"choices": [{"index": 0, "text": "", "token_ids": [2], "finish_reason": "stop", "stop_reason": None}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
             "metrics": {"speculative_decoding": VLLM_SPEC_METRICS}}
    events = ["data: " + json.dumps({"choices": [{"index": 0, "text": "Hi", "token_ids": [17, 4]}]}) + "\n\n",
              "data: " + json.dumps(last) + "\n\n"]
    server.events = [*events, "data: " + json.dumps(usage) + "\n\n", "data: [DONE]\n\n"]
    gen = RemoteGenerator(server.url, model="m", tokenizer="default")  # type: ignore[attr-defined]
    stats = gen.generate("Hello", max_new_tokens=8).stats
    assert stats.speculative_decoding() == VLLM_SPEC_METRICS
    assert (stats.drafted_tokens, stats.accepted_tokens, stats.accepted_by_position) == (18, 9, [4, 3, 1, 1])
    assert stats.forward_passes == 0 and stats.by_source == {}
    usage["metrics"] = {"speculative_decoding": {**VLLM_SPEC_METRICS, "acceptance_histogram": "garbled"}}
    for tail in ([], ["data: " + json.dumps(usage) + "\n\n"]):  # no metrics (a plain vLLM), or not in vLLM's shape
        server.events = [*events, *tail, "data: [DONE]\n\n"]
        stats = gen.generate("Hello", max_new_tokens=8).stats
        assert stats.speculative_decoding() is None and stats.drafted_tokens == 0 and stats.acceptance_histogram == []


VLLM_MODELS = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}'


@pytest.mark.timeout(60)
def test_the_cache_scope_travels_as_a_salt_never_as_itself(server: type[Handler]) -> None:
    """vLLM's ``cache_salt``: the same scope the same salt, another scope another, and no scope's text in it."""
    from ragspec.engine.tenancy import cache_scope

    server.models_body = VLLM_MODELS
    server.events = [chunk("Hi", "stop"), "data: [DONE]\n\n"]
    gen = RemoteGenerator(server.url, model="m", tokenizer="default")  # type: ignore[attr-defined]

    def salt() -> str:
        gen.generate("Hello", max_new_tokens=2)
        return server.request["cache_salt"]  # type: ignore[attr-defined]

    with cache_scope("web:session-secret"):
        alice, alice_again = salt(), salt()
    with cache_scope("v1:other"):
        bob = salt()
    shared = salt()
    assert alice == alice_again and len({alice, bob, shared}) == 3
    assert "session-secret" not in alice and len(alice) == 43
    server.models_body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
    RemoteGenerator(server.url, model="m", tokenizer="default").generate("Hello", max_new_tokens=2)  # type: ignore[attr-defined]
    assert "cache_salt" not in server.request  # type: ignore[attr-defined]  # a server that may not know it


@pytest.mark.timeout(60)
def test_grammars_reach_vllm_as_its_structured_outputs_and_json_as_response_format(server: type[Handler]) -> None:
    from ragspec.engine.constraints import Constraint, ConstraintError
    from ragspec.engine.tool_calls import Tool, tool_call_constraint

    server.models_body = VLLM_MODELS
    server.events = [chunk("1", "stop"), "data: [DONE]\n\n"]
    gen = RemoteGenerator(server.url, model="m", tokenizer="default")  # type: ignore[attr-defined]
    tools = tool_call_constraint([Tool("weather", "the weather in a city", {"type": "object", "properties": {"city": {"type": "string"}}})])
    gen.generate("Weather?", max_new_tokens=4, constraint=tools)
    assert server.request["structured_outputs"] == {"grammar": tools.source}  # type: ignore[attr-defined]
    assert "%json" in tools.source and "weather" in tools.source and "response_format" not in server.request  # type: ignore[attr-defined]
    gen.generate("Digits?", max_new_tokens=4, constraint=Constraint.regex("[0-9]+"))
    assert server.request["structured_outputs"] == {"regex": "[0-9]+"}  # type: ignore[attr-defined]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    gen.generate("Number?", max_new_tokens=4, constraint=Constraint.json_schema(schema))
    sent = server.request  # type: ignore[attr-defined]
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert "structured_outputs" not in sent
    server.models_body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
    other = RemoteGenerator(server.url, model="m", tokenizer="default")  # type: ignore[attr-defined]
    with pytest.raises(ConstraintError, match="a lark constraint cannot be sent to this generator"):
        other.stream("Weather?", constraint=tools)


# -- timeout and retries (ChatOpenAI's timeout= and max_retries=) ---------------------------------------
class Flaky(Handler):
    """Answers the first ``failures`` completion requests with 503, then streams ``events``; counts requests."""

    failures = 0
    seen = 0

    def do_POST(self) -> None:
        type(self).seen += 1
        if type(self).seen <= self.failures:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"error": {"message": "warming up"}}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Retry-After", "0.1")
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_POST()


class Slow(Handler):
    def do_POST(self) -> None:
        threading.Event().wait(3)
        super().do_POST()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("failures", "retries", "ok"), [(2, 2, True), (3, 2, False), (1, 0, False)])
def test_server_errors_are_retried_max_retries_times(failures: int, retries: int, ok: bool) -> None:
    handler = type("FlakyHere", (Flaky,), {"failures": failures, "seen": 0, "events": [chunk("Hi", "stop")]})
    with served(handler) as url:
        gen = RemoteModel(url, model="m", tokenizer="default", max_retries=retries).load()
        if ok:
            assert gen.generate("x", max_tokens=4).text == "Hi"
        else:
            with pytest.raises(Exception, match="warming up"):
                gen.generate("x", max_tokens=4)
        assert handler.seen == min(failures + 1, retries + 1)


@pytest.mark.timeout(120)
def test_timeout_bounds_the_wait_for_a_silent_server() -> None:
    with served(type("SlowHere", (Slow,), {"events": [chunk("Hi", "stop")]})) as url:
        import time

        gen = RemoteModel(url, model="m", tokenizer="default", timeout_s=0.5, max_retries=0).load()
        start = time.monotonic()
        with pytest.raises(RemoteGenerationError, match="could not reach.*Timeout"):
            gen.generate("x", max_tokens=4)
        assert time.monotonic() - start < 2.5
        patient = RemoteModel(url, model="m", tokenizer="default", timeout_s=10).load()
        assert patient.generate("x", max_tokens=4).text == "Hi"


def test_the_langchain_models_take_chatopenais_names() -> None:
    from ragspec.lc import ChatRagSpec, RagSpecLLM

    chat = ChatRagSpec(base_url="http://127.0.0.1:9/v1", model_name="m", timeout=7.5, max_retries=4)
    assert chat.model == "m" and chat.remote_model().timeout_s == 7.5 and chat.remote_model().max_retries == 4
    assert RagSpecLLM(model_name="m").model == "m" and ChatRagSpec(model="m").model == "m"
    for option in ({"timeout": 5}, {"max_retries": 1}):
        with pytest.raises(ValueError, match="apply to a model on a server"):
            ChatRagSpec(**option)
    with pytest.raises(ValueError, match="max_retries"):
        ChatRagSpec(base_url="http://127.0.0.1:9/v1", max_retries=-1)
