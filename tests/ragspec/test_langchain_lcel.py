"""LCEL chains of public langchain-core pieces + ragspec's retriever and models (real default model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import LLMResult
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from ragspec.lc import ChatRagSpec, RagSpecLLM
from ragspec.prompts import format_passages

pytestmark = pytest.mark.integration

DOCS = {
    "ferry.txt": "The Larkspur ferry leaves Dunmore harbour at 7:15 every morning. "
    "The crossing to Gannet Island takes forty minutes, and bicycles travel free.\n",
    "bakery.txt": "The Quillon bakery on Mill Street sells rye bread on Tuesdays only. "
    "Marta Quillon opened the shop in 1987 and still bakes every loaf herself.\n",
    "library.txt": "The Brackwater library lends telescopes to its members for two weeks at a time. "
    "Late returns cost one pound per day.\n",
}
QUESTION = "When does the Larkspur ferry leave Dunmore harbour?"


class LastResult(BaseCallbackHandler):
    def __init__(self) -> None:
        self.results: list[LLMResult] = []

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        self.results.append(response)


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    from retrievers import FaissVectorStore, HybridRetriever, default_embeddings, load_documents, split_documents

    directory: Path = tmp_path_factory.mktemp("lcel-docs")
    for name, text in DOCS.items():
        (directory / name).write_text(text)
    chunks = split_documents(load_documents(directory).documents)
    store = FaissVectorStore(default_embeddings())
    store.add_documents(chunks)
    return HybridRetriever(vectorstore=store, documents=chunks, k=2)


def test_chat_chain_streams_an_answer_from_the_documents(retriever):
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer the question using only the passages. Be brief."),
            ("human", "Passages:\n{context}\n\nQuestion: {question}"),
        ]
    )
    chain = (
        {"context": retriever | RunnableLambda(format_passages), "question": RunnablePassthrough()}
        | prompt
        | ChatRagSpec(max_tokens=40)
        | StrOutputParser()
    )
    handler = LastResult()
    chunks = list(chain.stream(QUESTION, config={"callbacks": [handler]}))
    streamed = "".join(chunks)
    assert len(chunks) > 1
    assert streamed == chain.invoke(QUESTION)  # greedy: the same answer either way
    assert "7:15" in streamed
    # No passages were passed explicitly: the prompt itself was drafted from, and it paid off.
    [generation] = handler.results[0].generations[0]
    stats = generation.message.response_metadata["speculative"]
    assert stats["by_source"]["prompt"]["accepted"] > 0
    assert stats["tokens_per_forward"] > 1


async def test_llm_chain_astream(retriever):
    prompt = PromptTemplate.from_template("Passages:\n{context}\n\nQuestion: {question}\nAnswer: The ferry leaves")
    chain = (
        {"context": retriever | RunnableLambda(format_passages), "question": RunnablePassthrough()}
        | prompt
        | RagSpecLLM(max_tokens=24, stop=["\n"])
        | StrOutputParser()
    )
    chunks = [c async for c in chain.astream(QUESTION)]
    answer = "".join(chunks)
    assert answer == await chain.ainvoke(QUESTION)
    assert "7:15" in answer and "\n" not in answer
    assert not answer.lstrip().startswith("Passages")  # the prompt is never echoed
