"""RagSpecLLM on a tiny random model: the behaviour LangChain's chat suites check, for the LLM.

A random model writes nonsense, but greedily and deterministically, so every expectation is
derived from the generator's own output for the same prompt.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.outputs import LLMResult

from ragspec.lc import RagSpecLLM

PROMPT = "Kestrel Lane opens at nine. The ferry leaves at ten."
MAX = 24


class Tokens(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.results: list[LLMResult] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        self.results.append(response)


class AsyncTokens(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


@pytest.fixture
def llm(lc_tiny_generator) -> RagSpecLLM:
    return RagSpecLLM(generator=lc_tiny_generator, max_tokens=MAX)


@pytest.fixture
def expected(lc_tiny_model) -> str:
    # Its own generator: the drafter of the one under test must not remember this answer.
    from ragspec.decoding.generator import SpeculativeGenerator

    text = SpeculativeGenerator(lc_tiny_model).generate(PROMPT, max_new_tokens=MAX, speculation=False).text
    assert len(text) > 10
    return text


def test_invoke_returns_the_completion_without_the_prompt(llm, expected):
    out = llm.invoke(PROMPT)
    assert out == expected
    assert not out.startswith(PROMPT)


def test_stream_chunks_join_to_invoke(llm, expected):
    chunks = list(llm.stream(PROMPT))
    assert len([c for c in chunks if c]) > 1
    assert "".join(chunks) == expected


def test_batch_matches_separate_calls(llm, lc_tiny_generator):
    prompts = [PROMPT, "An entirely different prompt."]
    want = [lc_tiny_generator.generate(p, max_new_tokens=MAX).text for p in prompts]
    assert llm.batch(prompts) == want
    assert want[0] != want[1]


async def test_ainvoke_and_astream(llm, expected):
    assert await llm.ainvoke(PROMPT) == expected
    chunks = [c async for c in llm.astream(PROMPT)]
    assert len(chunks) > 1
    assert "".join(chunks) == expected


async def test_astream_does_not_block_the_event_loop(lc_tiny_generator):
    llm = RagSpecLLM(generator=lc_tiny_generator, max_tokens=64, speculation=False)
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    seen_at: list[int] = []
    async for _ in llm.astream(PROMPT):
        seen_at.append(ticks)
    done.set()
    await task
    # The loop kept running between chunks: the generation ran in another thread.
    assert seen_at[-1] - seen_at[0] > len(seen_at)


def test_stop_strings_from_field_and_call_are_merged(lc_tiny_generator, expected):
    words = expected.split()
    first, second = words[len(words) // 2], words[len(words) // 4]
    cut = min(expected.index(first), expected.index(second))
    llm = RagSpecLLM(generator=lc_tiny_generator, max_tokens=MAX, stop=[first])
    assert llm.invoke(PROMPT, stop=[second]) == expected[:cut]
    assert "".join(llm.stream(PROMPT, stop=[second])) == expected[:cut]
    assert llm.invoke(PROMPT) == expected[: expected.index(first)]


def test_multi_token_stop_string(llm, lc_tiny_generator, expected):
    ids = lc_tiny_generator.generate(PROMPT, max_new_tokens=MAX).token_ids
    tok = lc_tiny_generator.target.tokenizer
    stop = tok.decode(ids[6:9])  # three tokens from the middle of the answer
    assert len(tok.encode(stop, add_special_tokens=False)) > 1
    cut = expected.index(stop)
    assert llm.invoke(PROMPT, stop=[stop]) == expected[:cut]
    assert "".join(llm.stream(PROMPT, stop=[stop])) == expected[:cut]
    assert llm.generate([PROMPT], stop=[stop]).generations[0][0].generation_info["finish_reason"] == "stop"


def test_callbacks_receive_every_token(llm, expected):
    handler = Tokens()
    assert llm.invoke(PROMPT, config={"callbacks": [handler]}) == expected
    assert len(handler.tokens) > 1 and "".join(handler.tokens) == expected
    handler = Tokens()
    assert "".join(llm.stream(PROMPT, config={"callbacks": [handler]})) == expected
    assert len(handler.tokens) > 1 and "".join(handler.tokens) == expected


async def test_async_callbacks_receive_every_token(llm, expected):
    handler = AsyncTokens()
    assert await llm.ainvoke(PROMPT, config={"callbacks": [handler]}) == expected
    assert "".join(handler.tokens) == expected
    handler = AsyncTokens()
    assert "".join([c async for c in llm.astream(PROMPT, config={"callbacks": [handler]})]) == expected
    assert "".join(handler.tokens) == expected


def test_usage_and_metadata(llm, lc_tiny_generator):
    result = llm.generate([PROMPT, "Another prompt."])
    n_in = [len(lc_tiny_generator.encode(p, special_tokens=True)) for p in (PROMPT, "Another prompt.")]
    infos = [g[0].generation_info for g in result.generations]
    assert [i["usage"]["input_tokens"] for i in infos] == n_in
    assert [i["usage"]["output_tokens"] for i in infos] == [MAX, MAX]
    assert all(i["usage"]["total_tokens"] == i["usage"]["input_tokens"] + MAX for i in infos)
    assert all(i["finish_reason"] == "length" and i["model_name"] == "tiny" for i in infos)
    assert infos[0]["speculative"]["new_tokens"] == MAX
    assert result.llm_output["token_usage"] == {
        "input_tokens": sum(n_in), "output_tokens": 2 * MAX, "total_tokens": sum(n_in) + 2 * MAX
    }
    # Streaming ends with a chunk carrying the same information.
    handler = Tokens()
    list(llm.stream(PROMPT, config={"callbacks": [handler]}))
    info = handler.results[0].generations[0][0].generation_info
    assert info["usage"]["input_tokens"] == n_in[0] and info["usage"]["output_tokens"] == MAX


def test_references_go_to_the_drafter_as_passages(llm, lc_tiny_generator, expected):
    # The model's own answer as a passage: the drafter copies it and the target accepts.
    passage = Document(page_content="Unrelated lead-in. " + expected + " Trailing words.")
    result = llm.generate([PROMPT], references=[passage, "another passage"])
    gen = result.generations[0][0]
    assert gen.text == expected
    by_source = gen.generation_info["speculative"]["by_source"]
    assert by_source["passage"]["accepted"] > MAX // 2
    plain = llm.generate([PROMPT]).generations[0][0]
    assert plain.text == expected
    assert "passage" not in plain.generation_info["speculative"]["by_source"]


def test_bound_references(llm, expected):
    bound = llm.bind(references=[expected])
    handler = Tokens()
    assert bound.invoke(PROMPT, config={"callbacks": [handler]}) == expected
    stats = handler.results[0].generations[0][0].generation_info["speculative"]
    assert stats["by_source"]["passage"]["accepted"] > 0


def test_speculative_off_gives_the_same_text(llm, expected):
    assert llm.invoke(PROMPT, speculation=False, references=[expected]) == expected


def test_early_break_releases_the_generator(llm, expected):
    for _ in llm.stream(PROMPT):
        break
    out: list[str] = []
    worker = threading.Thread(target=lambda: out.append(llm.invoke(PROMPT)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the generator stayed locked after an abandoned stream"
    assert out == [expected]


async def test_async_early_break_releases_the_generator(llm, expected):
    async for _ in llm.astream(PROMPT):
        break
    assert await asyncio.wait_for(llm.ainvoke(PROMPT), timeout=60) == expected


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_draft": 0}, "max_draft"),
        ({"device": "gpu"}, "device"),
        ({"dtype": "int8"}, "dtype"),
        ({"stop": [""]}, "stop"),
        ({"generator": "not a generator"}, "generator"),
    ],
)
def test_invalid_settings_fail_at_construction(params, fragment):
    with pytest.raises(ValueError, match=fragment):
        RagSpecLLM(**params)


def test_invalid_call_options(llm):
    with pytest.raises(ValueError, match="unsupported option.*tools"):
        llm.invoke(PROMPT, tools=[])
    with pytest.raises(ValueError, match="reference"):
        llm.invoke(PROMPT, references=[3.5])
    with pytest.raises(ValueError, match="max_tokens"):
        llm.invoke(PROMPT, max_tokens=-1)
    with pytest.raises(ValueError, match="speculation"):
        llm.invoke(PROMPT, speculation="no")
    with pytest.raises(ValueError, match="seed"):
        llm.invoke(PROMPT, seed=1.5)


def test_construction_does_not_load_a_model(monkeypatch):
    import ragspec.backends

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("loaded at construction")

    monkeypatch.setattr(ragspec.backends, "load_model", fail)
    llm = RagSpecLLM(model="some/model", max_tokens=5)
    assert llm.model == "some/model"
    assert llm._get_ls_params()["ls_model_name"] == "some/model"


def test_sampling_settings_reach_the_generator(lc_tiny_generator, expected, monkeypatch):
    llm = RagSpecLLM(generator=lc_tiny_generator, max_tokens=MAX, temperature=1.0, seed=7)
    # Without drafting the seed alone fixes the sample (drafts change which random numbers are drawn).
    first, again = llm.invoke(PROMPT, speculation=False), llm.invoke(PROMPT, speculation=False)
    assert first == again
    assert llm.invoke(PROMPT, seed=8, speculation=False) != first  # near-uniform random model
    assert llm.invoke(PROMPT, temperature=0.0) == expected
    assert llm.invoke(PROMPT, top_k=1) == expected  # sampling among one token is greedy
    seen: list = []
    original = lc_tiny_generator.stream
    monkeypatch.setattr(lc_tiny_generator, "stream", lambda p, config, **kw: seen.append(config) or original(p, config, **kw))
    llm.invoke(PROMPT, top_p=0.5, top_k=3)
    assert (seen[0].temperature, seen[0].top_k, seen[0].top_p, seen[0].seed, seen[0].max_new_tokens) == (1.0, 3, 0.5, 7, MAX)


def test_penalties_as_fields_and_per_call_are_the_generators(lc_tiny_generator):
    # Negative: this random model never repeats itself unless pushed to.
    push = {"presence_penalty": -1.5, "repeat_penalty": 0.7, "repeat_last_n": 8}
    want = lc_tiny_generator.generate(PROMPT, max_new_tokens=MAX, **push).text
    assert want != lc_tiny_generator.generate(PROMPT, max_new_tokens=MAX).text
    assert RagSpecLLM(generator=lc_tiny_generator, max_tokens=MAX, **push).invoke(PROMPT) == want
    assert RagSpecLLM(generator=lc_tiny_generator, max_tokens=MAX).bind(**push).invoke(PROMPT) == want
    with pytest.raises(ValueError, match="frequency_penalty must be from -2 to 2"):
        RagSpecLLM(generator=lc_tiny_generator, frequency_penalty=5)


def test_an_instruct_model_warns_once_that_the_prompt_is_not_templated(lc_tiny_generator, monkeypatch):
    from ragspec.lc import InstructModelWarning

    llm = RagSpecLLM(generator=lc_tiny_generator, max_tokens=2)
    with pytest.warns(InstructModelWarning, match="use ChatRagSpec"):  # the default tokenizer has a chat template
        llm.invoke(PROMPT)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InstructModelWarning)
        llm.invoke(PROMPT)  # once per object
        monkeypatch.setattr(lc_tiny_generator.target.tokenizer, "chat_template", None)
        RagSpecLLM(generator=lc_tiny_generator, max_tokens=2).invoke(PROMPT)  # a base model: nothing to say
