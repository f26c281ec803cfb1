"""Generation on a remote server: ``RemoteModel`` / ``ChatRagSpec(base_url=...)`` against a real ``ragspec serve``.

The server runs the default model in its own process; the test process runs the same model
locally. Under greedy decoding the pipeline's answers through the server must be the local
ones: same text, same citations, same finish reason (the prompt travels as token ids). A
divergence is accepted only where the two logits it hinges on are within float rounding of each
other (batched verification can flip such a tie), checked against the local model.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apps.ragspec_server import ROOT, ServeProcess

pytestmark = pytest.mark.integration

KEY = "remote-key-" + secrets.token_urlsafe(18)
CORPUS = ROOT / "retrievers" / "data" / "corpus"
MAX_TOKENS = 16
QUESTIONS = ["What does the tidepool CLI do?", "When was Marrowford founded?"]
TIE_TOLERANCE = 1e-3
"""Largest top-2 logit gap (fp32) at which two greedy decodings of one model may disagree."""


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    process = ServeProcess("--max-tokens", str(MAX_TOKENS), api_key=KEY)
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote") / "index"


@pytest.fixture(scope="module")
def local_qa(index_dir: Path) -> Any:
    """The pipeline on the local generator; its index is saved for the CLI test."""
    from ragspec.engine.config import GenerationConfig
    from ragspec.pipeline import DocumentQA
    from ragspec.registry import LocalModel

    llm = LocalModel(config=GenerationConfig(max_new_tokens=MAX_TOKENS))
    return DocumentQA.from_paths([CORPUS], llm=llm, k=3, index_dir=index_dir)


@pytest.fixture(scope="module")
def remote_qa(server: ServeProcess, local_qa: Any) -> Any:
    from ragspec.engine.config import GenerationConfig
    from ragspec.pipeline import DocumentQA
    from ragspec.remote import RemoteModel

    source = RemoteModel(server.url, api_key=KEY, config=GenerationConfig(max_new_tokens=MAX_TOKENS))
    return DocumentQA(local_qa.retriever, llm=source)  # the same retriever: only generation moves


def assert_same_greedy(local_text: str, remote_text: str, prompt_ids: list[int]) -> None:
    """Equal texts, or a first difference at a near-tie of the local model's logits."""
    if local_text == remote_text:
        return
    import torch

    from ragspec.registry import get_generator

    generator = get_generator("default")
    tokenizer = generator.target.tokenizer
    a, b = tokenizer.encode(local_text, add_special_tokens=False), tokenizer.encode(remote_text, add_special_tokens=False)
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    with torch.inference_mode():
        logits = generator.target.model(torch.tensor([prompt_ids + a[:same]])).logits[0, -1].float()
    top2 = torch.topk(logits, 2).values
    gap = float(top2[0] - top2[1])
    assert gap < TIE_TOLERANCE, f"remote answer diverged at token {same} with a top-2 gap of {gap}:\n{local_text!r}\n{remote_text!r}"


@pytest.mark.timeout(600)
def test_document_qa_answers_through_the_server_as_it_does_locally(local_qa: Any, remote_qa: Any) -> None:
    from ragspec.remote import RemoteGenerator

    assert isinstance(remote_qa.llm.load(), RemoteGenerator)
    for question in QUESTIONS:
        local = local_qa.ask(question)
        remote = remote_qa.ask(question)
        prompt_ids = local_qa._prepare(question, None, {}).prompt_ids
        assert_same_greedy(local.text, remote.text, prompt_ids)
        if local.text == remote.text:
            assert [c.number for c in remote.citations] == [c.number for c in local.citations]
            assert remote.citation_rule == local.citation_rule and remote.finish_reason == local.finish_reason
            assert remote.stats.new_tokens == local.stats.new_tokens
        assert [p.page_content for p in remote.passages] == [p.page_content for p in local.passages]
        # the server's own speculative statistics come back with the answer
        assert remote.stats.prompt_tokens == len(prompt_ids)
        assert remote.stats.forward_passes >= 1 and remote.stats.tokens_per_forward > 0
        assert remote.stats.drafted_tokens >= remote.stats.accepted_tokens >= 0
        assert remote.stats.wall_s >= remote.stats.ttft_s > 0


@pytest.mark.timeout(300)
def test_streaming_through_the_server(remote_qa: Any) -> None:
    with remote_qa.stream(QUESTIONS[0]) as stream:
        deltas = list(stream)
    assert len(deltas) > 1 and stream.answer is not None
    assert "".join(deltas) == stream.answer.model_text  # the model's words (an abstaining answer's text is its note)
    assert stream.stats is stream.answer.stats and stream.stats.new_tokens >= 1


@pytest.mark.timeout(300)
def test_chat_ragspec_with_base_url_matches_the_local_chat_model(server: ServeProcess) -> None:
    from ragspec.lc import ChatRagSpec

    messages = [("system", "Answer in one short sentence."), ("human", "Name a colour of the rainbow.")]
    local = ChatRagSpec(max_tokens=12).invoke(messages)
    remote_chat = ChatRagSpec(base_url=f"{server.url}/v1", api_key=KEY, max_tokens=12)
    remote = remote_chat.invoke(messages)
    assert remote.content == local.content
    assert remote.usage_metadata == local.usage_metadata
    assert remote.response_metadata["speculative"]["forward_passes"] >= 1
    assert "".join(str(c.content) for c in remote_chat.stream(messages)) == local.content
    assert KEY not in repr(remote_chat) and "base_url" in remote_chat.identifying_params


@pytest.mark.timeout(300)
def test_a_json_schema_travels_as_response_format(server: ServeProcess) -> None:
    from ragspec.engine.constraints import Constraint
    from ragspec.registry import get_generator
    from ragspec.remote import RemoteModel

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    prompt = "Name the capital of France as JSON with the key city: "
    options = {"max_new_tokens": MAX_TOKENS, "constraint": Constraint.json_schema(schema)}
    remote = RemoteModel(server.url, api_key=KEY).load().generate(prompt, **options)
    local = get_generator("default").generate(prompt, **options)
    assert remote.text == local.text and set(json.loads(remote.text)) == {"city"}
    with pytest.raises(ValueError, match="JSON Schemas"):
        RemoteModel(server.url, api_key=KEY).load().stream(prompt, constraint=Constraint.regex("[0-9]+"))


@pytest.mark.timeout(120)
def test_errors_name_the_cause_and_never_the_key(server: ServeProcess) -> None:
    from ragspec.remote import RemoteGenerationError, RemoteModel

    wrong = RemoteModel(server.url, api_key="wrong-key-1234567890abcdef").load()
    with pytest.raises(RemoteGenerationError, match="401") as e:
        wrong.generate("Hello", max_new_tokens=2)
    assert "--generator-api-key" in str(e.value) and "wrong-key" not in str(e.value)
    with pytest.raises(RemoteGenerationError, match="could not reach"):
        RemoteModel("http://127.0.0.1:9", model="default", tokenizer="default").load().generate("Hello", max_new_tokens=2)
    with pytest.raises(ValueError, match="not in the URL"):
        RemoteModel("http://user:secret@127.0.0.1:9/v1")
    right = RemoteModel(server.url, api_key=KEY).load()
    with pytest.raises(RemoteGenerationError, match="404"):
        RemoteModel(server.url, api_key=KEY, model="gpt-4o", tokenizer="default").load().generate("Hi", max_new_tokens=2)
    assert right.generate("The sky is", max_new_tokens=3).stats.new_tokens >= 1


@pytest.mark.timeout(600)
def test_the_cli_answers_through_the_server(server: ServeProcess, local_qa: Any, index_dir: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAGSPEC_GENERATOR_API_KEY": KEY}
    out = subprocess.run(
        [sys.executable, "-m", "apps.cli", "ask", QUESTIONS[0], "--index", str(index_dir), "-k", "3",
         "--max-tokens", str(MAX_TOKENS), "--generator-url", server.url, "--no-stats"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    local = local_qa.ask(QUESTIONS[0])
    assert out.stdout.startswith(local.model_text.strip()[:40]), (out.stdout, local.model_text)  # the CLI streams the model's words
    assert KEY not in out.stdout + out.stderr
