"""``/v1``'s model names and drafting figures, the same whatever generates: ragspec's own engine
(a tiny random model) or a vLLM behind ``RemoteGenerator`` (a scripted stand-in speaking vLLM's
protocol; the real one: tests/apps/test_vllm_engine.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.web.server import AppConfig, create_app
from ragspec.remote import RemoteModel
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.fakes import GeneratorSource
from tests.ragspec.test_remote import VLLM_SPEC_METRICS, Handler
from tests.ragspec.test_remote import server as vllm_stand_in  # noqa: F401 - a fixture

VLLM_SHAPE = set(VLLM_SPEC_METRICS)
"""The keys of vLLM 0.32's ``metrics.speculative_decoding`` (summary level)."""


@pytest.fixture
def api(tmp_path: Path, lc_tiny_generator: Any) -> Iterator[httpx.Client]:
    """The app over the tiny model, which calls itself "tiny", served as "default" (as ``ragspec serve``
    serves its default model, and ``--engine vllm`` now too)."""
    app = create_app(AppConfig(model_name="default"), indexer=ScriptedIndexer(), sessions_root=tmp_path,
                     generation=GeneratorSource(lc_tiny_generator, model="tiny-source"))
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.mark.timeout(120)
def test_one_server_answers_to_its_name_and_the_models_own_and_lists_both(api: httpx.Client) -> None:
    listed = [m["id"] for m in api.get("/v1/models").json()["data"]]
    assert listed[:2] == ["default", "tiny"]  # the served name, then the model's own; the embedding model after
    for name in ("default", "tiny"):
        assert api.get(f"/v1/models/{name}").json()["id"] == name
        body = {"model": name, "prompt": "Hello", "max_tokens": 2}
        answer = api.post("/v1/completions", json=body)
        assert answer.status_code == 200 and answer.json()["model"] == name
    refused = api.post("/v1/completions", json={"model": "tiny-source", "prompt": "Hello", "max_tokens": 2})
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "model"
    assert "'default' or 'tiny'" in refused.json()["error"]["message"]
    assert api.get("/v1/models/gpt-4o").status_code == 404


def _stream_events(api: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    with api.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


@pytest.mark.timeout(120)
def test_own_engine_responses_carry_vllms_per_request_drafting_metrics(api: httpx.Client) -> None:
    """A passage the answer copies makes the drafter draft: the figures are vLLM's keys, consistent with
    ragspec's own (by position, by source); a request without speculation has none of them."""
    first = api.post("/v1/completions", json={"model": "default", "prompt": "Once", "max_tokens": 24}).json()
    text = first["choices"][0]["text"]
    body = {"model": "default", "prompt": "Once", "max_tokens": 24, "references": [text]}  # the answer, as a passage
    answer = api.post("/v1/completions", json=body).json()
    drafting, extension = answer["metrics"]["speculative_decoding"], answer["ragspec"]
    assert set(drafting) == VLLM_SHAPE and drafting["num_spec_steps"] > 0
    assert drafting["num_draft_tokens"] == extension["drafted_tokens"] > 0
    assert drafting["num_accepted_draft_tokens"] == extension["accepted_tokens"] == sum(extension["accepted_by_position"])
    assert drafting["acceptance_histogram"] == extension["acceptance_histogram"]
    assert sum(s["drafted"] for s in extension["by_source"].values()) == extension["drafted_tokens"]
    assert drafting["mean_acceptance_length"] == pytest.approx(1 + drafting["num_accepted_draft_tokens"] / drafting["num_spec_steps"])
    finish = [e for e in _stream_events(api, body) if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and set(finish[0]["metrics"]["speculative_decoding"]) == VLLM_SHAPE
    plain = api.post("/v1/completions", json={**body, "speculation": False}).json()
    assert "metrics" not in plain and plain["ragspec"]["forward_passes"] > 0


@pytest.mark.timeout(120)
def test_behind_vllm_figures_are_vllms_own_or_absent_never_zeros(tmp_path: Path, vllm_stand_in: type[Handler]) -> None:  # noqa: F811
    """What vLLM measured (its per-request metrics) goes out in its shape; what it does not count
    (forwards, by source, draft time) is left out, as is every drafting figure when it sends none."""
    vllm_stand_in.models_body = json.dumps({"object": "list", "data": [
        {"id": "SmolLM2-135M-Instruct", "object": "model", "owned_by": "vllm", "max_model_len": 2048}]}).encode()
    done = {"choices": [{"index": 0, "text": "", "token_ids": [2], "finish_reason": "stop", "stop_reason": None}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
             "metrics": {"speculative_decoding": VLLM_SPEC_METRICS}}
    answer = ["data: " + json.dumps({"choices": [{"index": 0, "text": "Hi", "token_ids": [17, 4]}]}) + "\n\n",
              "data: " + json.dumps(done) + "\n\n"]
    remote = RemoteModel(vllm_stand_in.url, model="SmolLM2-135M-Instruct", tokenizer="default")  # type: ignore[attr-defined]
    app = create_app(AppConfig(model_name="default"), indexer=ScriptedIndexer(), sessions_root=tmp_path, generation=remote)
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=60) as api:
        assert [m["id"] for m in api.get("/v1/models").json()["data"]][:2] == ["default", "SmolLM2-135M-Instruct"]
        vllm_stand_in.events = [*answer, "data: " + json.dumps(usage) + "\n\n", "data: [DONE]\n\n"]
        body = {"model": "default", "prompt": "Hello", "max_tokens": 8}
        measured = api.post("/v1/completions", json=body).json()
        assert measured["metrics"]["speculative_decoding"] == VLLM_SPEC_METRICS
        extension = measured["ragspec"]
        assert (extension["drafted_tokens"], extension["accepted_tokens"], extension["accepted_by_position"]) == (18, 9, [4, 3, 1, 1])
        for absent in ("forward_passes", "tokens_per_forward", "by_source", "draft_s", "cached_prompt_tokens"):
            assert absent not in extension
        vllm_stand_in.events = [*answer, "data: [DONE]\n\n"]  # a vLLM without speculation or metrics
        silent = api.post("/v1/completions", json={**body, "model": "SmolLM2-135M-Instruct"}).json()
        assert "metrics" not in silent and "drafted_tokens" not in silent["ragspec"] and "forward_passes" not in silent["ragspec"]
        assert silent["usage"]["completion_tokens"] == 2 and silent["choices"][0]["text"] == "Hi"
