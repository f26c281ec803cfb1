"""What a new LangChain user hits first: token counts, strict construction, serialization, and
handing retrieved documents to the drafter inside an LCEL chain (tiny random model)."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.load import dumpd, dumps, load, loads
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, trim_messages
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from pydantic import ValidationError

from ragspec.lc import ChatRagSpec, RagSpecLLM, answer_from_context, load_options
from ragspec.prompts import format_passages, qa_messages

MESSAGES = [SystemMessage("Be brief."), HumanMessage("Hello world"), AIMessage("Hi."), HumanMessage("Bye")]


# -- token counts --------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ChatRagSpec, RagSpecLLM])
def test_text_is_counted_with_the_models_tokenizer(cls, lc_tiny_generator):
    model = cls(generator=lc_tiny_generator)
    tokenizer = lc_tiny_generator.target.tokenizer
    for text in ["Hello world", "Kestrel Lane, 7:15 — ferry", ""]:
        want = tokenizer.encode(text, add_special_tokens=False)
        assert model.get_token_ids(text) == want
        assert model.get_num_tokens(text) == len(want)
    assert model.get_num_tokens("Hello world") > 0  # langchain-core's GPT-2 fallback gives 0 offline


def test_chat_messages_are_counted_through_the_chat_template(lc_tiny_generator):
    chat = ChatRagSpec(generator=lc_tiny_generator)
    tokenizer = lc_tiny_generator.target.tokenizer
    turns = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello world"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Bye"},
    ]
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    want = len(tokenizer.encode(text, add_special_tokens=False))
    assert chat.get_num_tokens_from_messages(MESSAGES) == want
    # Exactly the prompt the model is given: the usage it reports agrees.
    assert chat.invoke(MESSAGES, max_tokens=1).usage_metadata["input_tokens"] == want
    # Bound tools are listed in the system turn, so they count too.
    search = {"name": "search", "description": "Search the documents.",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}
    assert chat.get_num_tokens_from_messages(MESSAGES, tools=[search]) > want


def test_llm_counts_messages_as_the_prompt_it_is_given(lc_tiny_generator):
    from langchain_core.messages import get_buffer_string

    llm = RagSpecLLM(generator=lc_tiny_generator)
    want = len(lc_tiny_generator.target.tokenizer.encode(get_buffer_string(MESSAGES)))
    assert llm.get_num_tokens_from_messages(MESSAGES) == want


def test_trim_messages_trims_by_real_counts(lc_tiny_generator):
    chat = ChatRagSpec(generator=lc_tiny_generator)
    long = [SystemMessage("Be brief."), HumanMessage("word " * 200), AIMessage("ok"), HumanMessage("Bye")]
    full = chat.get_num_tokens_from_messages(long)
    budget = chat.get_num_tokens_from_messages([long[0], *long[2:]])
    assert budget < full
    kept = trim_messages(long, max_tokens=budget, token_counter=chat, strategy="first")
    assert len(kept) < len(long)
    assert chat.get_num_tokens_from_messages(kept) <= budget


def test_custom_token_counter_wins(lc_tiny_generator):
    chat = ChatRagSpec(generator=lc_tiny_generator, custom_get_token_ids=lambda text: [0] * len(text))
    assert chat.get_num_tokens("Hello world") == 11


# -- strict construction -------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ChatRagSpec, RagSpecLLM])
def test_misspelt_fields_are_rejected_with_the_likely_name(cls):
    with pytest.raises(ValidationError, match="unknown field 'max_token'.*did you mean 'max_tokens'"):
        cls(max_token=5)
    with pytest.raises(ValidationError, match="unknown field 'temprature'.*'temperature'"):
        cls(temprature=0.5)
    with pytest.raises(ValidationError, match="unknown field 'colour'") as info:
        cls(colour="blue")
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("cls", [ChatRagSpec, RagSpecLLM])
def test_model_kwargs_is_rejected_with_the_fields_to_use(cls):
    with pytest.raises(ValidationError, match="model_kwargs is not supported.*max_tokens, temperature"):
        cls(model_kwargs={"temperature": 0.5})


def test_langchain_base_fields_still_work():
    chat = ChatRagSpec(tags=["t"], metadata={"k": "v"}, callbacks=None, verbose=False, cache=False, max_tokens=5)
    assert chat.tags == ["t"] and chat.max_tokens == 5
    assert RagSpecLLM(tags=["t"], max_tokens=3).max_tokens == 3


# -- serialization -------------------------------------------------------------------------------
def test_dumpd_gives_a_constructor_without_the_generator(lc_tiny_generator):
    chat = ChatRagSpec(generator=lc_tiny_generator, max_tokens=5, stop=["\n"], temperature=0.5, seed=3)
    data = dumpd(chat)
    assert data["type"] == "constructor" and data["id"] == ["ragspec", "lc", "ChatRagSpec"]
    kwargs = data["kwargs"]
    assert (kwargs["max_tokens"], kwargs["stop"], kwargs["temperature"], kwargs["seed"]) == (5, ["\n"], 0.5, 3)
    assert "generator" not in kwargs
    revived = load(data, **load_options())
    assert isinstance(revived, ChatRagSpec) and revived.generator is None
    assert (revived.max_tokens, revived.stop, revived.temperature, revived.seed) == (5, ["\n"], 0.5, 3)


@pytest.mark.parametrize(
    ("prompt", "model"),
    [
        (ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{question}")]), ChatRagSpec(max_tokens=7)),
        (PromptTemplate.from_template("Q: {question}\nA:"), RagSpecLLM(max_tokens=9, stop=["\n"])),
    ],
)
def test_chains_round_trip_through_dumps_and_loads(prompt, model):
    chain = prompt | model | StrOutputParser()
    text = dumps(chain)
    revived = loads(text, **load_options())
    assert revived == chain
    assert dumps(revived) == text
    # Without ragspec on the allowlist langchain-core refuses, as it should.
    with pytest.raises(ValueError, match="not allowed"):
        loads(text, valid_namespaces=["ragspec"], allowed_objects="core")


# -- documents as drafting references in LCEL -----------------------------------------------------
class SpyDrafter:
    """Records the references each request begins with; proposes nothing."""

    def __init__(self) -> None:
        self.references: list[list[list[int]]] = []

    def begin(self, prompt, references):
        self.references.append([list(r) for r in references])

    def propose(self, context, max_tokens):
        return None

    def feedback(self, draft, n_accepted):
        pass

    def finish(self, output):
        pass


DOCS = [
    Document("The Larkspur ferry leaves Dunmore harbour at 7:15.", metadata={"source": "/d/ferry.txt"}),
    Document("The bakery sells rye bread on Tuesdays.", metadata={"source": "/d/bakery.txt", "title": "Bakery"}),
]


@pytest.fixture
def spy_generator(lc_tiny_model):
    from ragspec.decoding.generator import SpeculativeGenerator

    spy = SpyDrafter()
    return SpeculativeGenerator(lc_tiny_model, drafter=spy), spy


def test_answer_from_context_forwards_documents_as_references(spy_generator):
    generator, spy = spy_generator
    retriever = RunnableLambda(lambda question: DOCS)
    chain = {"context": retriever, "question": RunnablePassthrough()} | answer_from_context(
        ChatRagSpec(generator=generator, max_tokens=6)
    ) | StrOutputParser()
    text = chain.invoke("When does the ferry leave?")
    encode = generator.target.tokenizer.encode
    assert spy.references == [[encode(d.page_content, add_special_tokens=False) for d in DOCS]]
    # The prompt is the pipeline's: numbered passages, then the question.
    ids = generator.target.tokenizer.apply_chat_template(
        qa_messages("When does the ferry leave?", DOCS), tokenize=False, add_generation_prompt=True
    )
    assert text == generator.generate(encode(ids, add_special_tokens=False), max_new_tokens=6).text
    streamed = list(chain.stream("When does the ferry leave?"))
    assert "".join(streamed) == text and len(streamed) > 1
    assert len(spy.references) == 3 and spy.references[-1] == spy.references[0]


async def test_answer_from_context_async_and_custom_prompt(spy_generator):
    generator, spy = spy_generator
    prompt = PromptTemplate.from_template("{context}\n\nQ: {question}\nA:")
    chain = answer_from_context(RagSpecLLM(generator=generator, max_tokens=5), prompt)
    inputs = {"question": "Which day?", "context": DOCS[1:]}
    text = await chain.ainvoke(inputs)
    chunks = [c async for c in chain.astream(inputs)]
    assert "".join(chunks) == text
    assert len(spy.references) == 2 and len(spy.references[0]) == 1
    want_prompt = prompt.format(context=format_passages(DOCS[1:]), question="Which day?")
    assert text == generator.generate(want_prompt, max_new_tokens=5).text


def test_answer_from_context_says_what_it_takes(lc_tiny_generator):
    chain = answer_from_context(ChatRagSpec(generator=lc_tiny_generator, max_tokens=2))
    with pytest.raises(ValueError, match='"question": str, "context"'):
        chain.invoke("just a question")
    with pytest.raises(ValueError, match="list of Documents"):
        chain.invoke({"question": "q", "context": 3})
    with pytest.raises(ValueError, match="ChatRagSpec or RagSpecLLM"):
        answer_from_context(RunnableLambda(lambda x: x))  # type: ignore[arg-type]


def test_the_langchain_fields_are_generation_config_s() -> None:
    """``RagSpecParams`` declares ``GenerationConfig``'s options as pydantic fields (each with its docstring):
    every option is one, under its name, with the same default."""
    import dataclasses

    from ragspec.engine.config import GenerationConfig
    from ragspec.lc.base import _GENERATION_FIELDS, RagSpecParams

    options = {f.name for f in dataclasses.fields(GenerationConfig)} - {"constraint"}  # per call: response_format
    assert options <= set(RagSpecParams.model_fields) and options <= set(_GENERATION_FIELDS)
    assert ChatRagSpec().generation_config() == GenerationConfig()
    assert RagSpecLLM(temperature=0.5, stop=["x"]).generation_config() == GenerationConfig(temperature=0.5, stop=("x",))
