"""ChatRagSpec on a tiny random model, and the shared model cache."""

from __future__ import annotations

import threading
import uuid

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from ragspec import registry
from ragspec.lc import ChatRagSpec, RagSpecLLM

MAX = 16
MESSAGES = [SystemMessage("Be brief."), HumanMessage("Where is Kestrel Lane?")]


@pytest.fixture
def chat(lc_tiny_generator) -> ChatRagSpec:
    return ChatRagSpec(generator=lc_tiny_generator, max_tokens=MAX)


def template_ids(tokenizer, chat_turns) -> list[int]:
    text = tokenizer.apply_chat_template(chat_turns, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def test_messages_go_through_the_chat_template(chat, lc_tiny_generator):
    ids = template_ids(
        lc_tiny_generator.target.tokenizer,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is Kestrel Lane?"}],
    )
    want = lc_tiny_generator.generate(ids, max_new_tokens=MAX)
    message = chat.invoke(MESSAGES)
    assert isinstance(message, AIMessage)
    assert message.content == want.text
    assert message.usage_metadata == {
        "input_tokens": len(ids), "output_tokens": MAX, "total_tokens": len(ids) + MAX
    }
    assert message.response_metadata["model_name"] == "tiny"
    assert message.response_metadata["finish_reason"] == "length"
    assert message.response_metadata["speculative"]["prompt_tokens"] == len(ids)


def test_text_blocks_and_chat_messages_are_accepted(chat):
    plain = chat.invoke(MESSAGES).content
    blocks = [
        ChatMessage(role="system", content="Be brief."),
        HumanMessage(content=[{"type": "text", "text": "Where is "}, "Kestrel Lane?"]),
    ]
    assert chat.invoke(blocks).content == plain


def test_stream_chunks(chat):
    chunks = list(chat.stream(MESSAGES))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert sum(1 for c in chunks if c.usage_metadata) == 1
    assert chunks[-1].chunk_position == "last"
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert full.content == chat.invoke(MESSAGES).content
    assert full.usage_metadata["output_tokens"] == MAX
    assert full.response_metadata["model_name"] == "tiny"


async def test_astream_and_ainvoke(chat):
    want = chat.invoke(MESSAGES).content
    assert (await chat.ainvoke(MESSAGES)).content == want
    text = "".join([c.content async for c in chat.astream(MESSAGES)])
    assert text == want


async def test_astream_events_streams_the_chat_model_token_by_token(chat):
    want = chat.invoke(MESSAGES).content
    deltas = [e["data"]["chunk"].content async for e in chat.astream_events(MESSAGES, version="v2")
              if e["event"] == "on_chat_model_stream"]
    assert len([d for d in deltas if d]) > 1 and "".join(deltas) == want


def test_stop_in_chat(chat):
    full = chat.invoke(MESSAGES).content
    word = full.split()[len(full.split()) // 2]
    cut = full.index(word)
    assert chat.invoke(MESSAGES, stop=[word]).content == full[:cut]
    assert "".join(c.content for c in chat.stream(MESSAGES, stop=[word])) == full[:cut]
    assert ChatRagSpec(generator=chat.generator, max_tokens=MAX, stop=[word]).invoke(MESSAGES).content == full[:cut]


def test_references_reach_the_drafter(chat, lc_tiny_model):
    from ragspec.decoding.generator import SpeculativeGenerator

    # A separate generator writes the answer, so the tested one's drafter has no memory of it.
    full = ChatRagSpec(generator=SpeculativeGenerator(lc_tiny_model), max_tokens=MAX).invoke(MESSAGES).content
    message = chat.invoke(MESSAGES, references=[full])
    assert message.content == full
    assert message.response_metadata["speculative"]["by_source"]["passage"]["accepted"] > 0


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (FunctionMessage("3", name="f"), "FunctionMessage"),
        (ChatMessage(role="tool", content="x"), "ChatMessage"),
        (HumanMessage(content=[{"type": "image", "url": "https://example.com/a.png"}]), "'image'"),
        (HumanMessage(content=[{"type": "image_url", "image_url": {"url": "data:x"}}]), "'image_url'"),
    ],
)
def test_unsupported_messages_are_a_clear_error(chat, message, fragment):
    with pytest.raises(ValueError, match=fragment) as info:
        chat.invoke([HumanMessage("hi"), message])
    assert "supports" in str(info.value) or "text only" in str(info.value) or "tool calling" in str(info.value)


def test_without_a_chat_template_the_conversation_is_a_plain_transcript(lc_tiny_model):
    import copy
    import dataclasses

    from ragspec.decoding.generator import SpeculativeGenerator
    from ragspec.prompts import NoChatTemplateWarning

    tokenizer = copy.deepcopy(lc_tiny_model.tokenizer)
    tokenizer.chat_template = None
    generator = SpeculativeGenerator(dataclasses.replace(lc_tiny_model, tokenizer=tokenizer))
    transcript = "Be brief.\n\nUser: Where is Kestrel Lane?\n\nAssistant:"
    ids = tokenizer.encode(transcript)
    with pytest.warns(NoChatTemplateWarning, match="no chat template"):
        message = ChatRagSpec(generator=generator, max_tokens=4).invoke(MESSAGES)
    assert message.usage_metadata["input_tokens"] == len(ids)
    assert message.content == generator.generate(ids, max_new_tokens=4).text


def test_ls_params(chat):
    params = chat._get_ls_params(stop=["x"], model="other")
    assert params["ls_provider"] == "ragspec" and params["ls_model_type"] == "chat"
    assert params["ls_model_name"] == "other" and params["ls_stop"] == ["x"]
    assert chat._get_ls_params()["ls_model_name"] == "tiny"


# -- the shared model cache --------------------------------------------------------------------
@pytest.fixture
def counting_loader(monkeypatch, lc_tiny_model):
    import ragspec.backends

    calls: list[tuple[str, str, str]] = []
    gate = threading.Event()

    def fake_load(name: str, *, device: str = "auto", dtype: str = "auto", backend: str = "auto"):
        calls.append((name, device, dtype))
        gate.wait(timeout=5)  # widen the race window for the concurrency test
        return lc_tiny_model

    gate.set()
    monkeypatch.setattr(ragspec.backends, "load_model", fake_load)
    return calls, gate


def test_models_load_lazily_and_are_shared(counting_loader):
    calls, _ = counting_loader
    name = f"fake-{uuid.uuid4()}"
    a = ChatRagSpec(model=name, max_tokens=4)
    b = RagSpecLLM(model=name, max_tokens=8)
    assert calls == []
    assert a.load() is b.load()
    assert calls == [(name, "auto", "auto")]
    c = ChatRagSpec(model=name, max_draft=4)
    assert c.load() is not a.load() and c.load().target is a.load().target  # same weights, own policy
    assert c.load().max_draft == 4
    assert len(calls) == 1
    ChatRagSpec(model=name, dtype="float32").load()
    assert len(calls) == 2


def test_concurrent_first_use_loads_once(counting_loader):
    calls, gate = counting_loader
    gate.clear()
    name = f"fake-{uuid.uuid4()}"
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(ChatRagSpec(model=name).load())) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(timeout=30)
    assert len(calls) == 1 and len(got) == 4 and all(g is got[0] for g in got)


def test_per_call_model_override(counting_loader, chat):
    calls, _ = counting_loader
    name = f"fake-{uuid.uuid4()}"
    message = chat.invoke("hi", model=name)
    assert calls == [(name, "auto", "auto")]
    assert message.response_metadata["model_name"] == "tiny"  # the fake loader returns the tiny model
    assert registry.get_generator(name) is not chat.generator


def test_import_ragspec_is_light_and_exports_lazily():
    import subprocess
    import sys

    code = (
        "import sys, ragspec\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n"
        "from ragspec import ChatRagSpec, RagSpecLLM\n"
        "assert 'torch' not in sys.modules, 'torch imported by the LangChain classes'\n"
        "ChatRagSpec(max_tokens=3)\n"
        "assert 'torch' not in sys.modules, 'torch imported at construction'\n"
        "assert ragspec.DocumentQA.__module__ == 'ragspec.pipeline'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


async def test_iterate_in_thread_keeps_context_and_propagates_errors():
    import contextvars

    from ragspec.bridge import iterate_in_thread

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller")
    caller = threading.get_ident()

    def items():
        yield var.get()
        yield threading.get_ident() != caller
        raise KeyError("boom")

    got = []
    with pytest.raises(KeyError, match="boom"):
        async for item in iterate_in_thread(items):
            got.append(item)
    assert got == ["caller", True]


def test_on_llm_new_token_fires_once_per_token_on_invoke_and_stream(chat):
    """The second call drafts from the first answer (many tokens per forward): its callbacks still
    come one per token, as the first call's, and the stream's chunks are those tokens."""
    from langchain_core.callbacks import BaseCallbackHandler

    class Tokens(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens: list[str] = []

        def on_llm_new_token(self, token: str, **kwargs: object) -> None:
            self.tokens.append(token)

    question = "Count: one two three four five six seven"
    invoked, streamed = Tokens(), Tokens()
    message = chat.invoke(question, config={"callbacks": [invoked]})
    chunks = [c.content for c in chat.stream(question, config={"callbacks": [streamed]})]
    assert "".join(invoked.tokens) == message.content and len(invoked.tokens) > 1
    assert streamed.tokens == [*invoked.tokens, ""]  # and the last chunk, which carries the usage
    assert chunks == streamed.tokens
    assert len(invoked.tokens) <= message.usage_metadata["output_tokens"]


def test_speculation_is_one_setting_checked_when_the_model_is_built() -> None:
    from ragspec.engine.config import Speculation

    assert ChatRagSpec(speculation={"max_draft": 4}).generation_config().speculation == Speculation(max_draft=4)
    assert ChatRagSpec(speculation=False).generation_config().speculation.limit == 0
    assert ChatRagSpec().identifying_params["speculation"] == {}
    with pytest.raises(ValueError, match="speculation.max_draft"):
        ChatRagSpec(speculation={"max_draft": 0})
