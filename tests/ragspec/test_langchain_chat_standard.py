"""LangChain's standard chat model suites, run against ChatRagSpec.

Unsupported features are declared through the suites' own properties (a local text model has no
tool calling, structured output, JSON mode or image/audio/PDF input); nothing is skipped or
marked as an expected failure by hand. The integration suite runs the real default model.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from ragspec.lc import ChatRagSpec


@cache
def tiny_model_dir() -> str:
    """A different model for the per-call ``model=`` override: a tiny random Llama saved to disk."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ragspec import registry

    tokenizer = registry.get_generator("default").lm.tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    directory = tempfile.mkdtemp(prefix="ragspec-tiny-override-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    assert AutoTokenizer.from_pretrained(directory).chat_template
    return directory


class TestChatRagSpecUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatRagSpec]:
        return ChatRagSpec

    @property
    def chat_model_params(self) -> dict:
        return {"model": "default"}


@pytest.mark.integration
class TestChatRagSpecIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatRagSpec]:
        return ChatRagSpec

    @property
    def chat_model_params(self) -> dict:
        return {"model": "default", "max_tokens": 16}

    @property
    def model_override_value(self) -> str:
        return tiny_model_dir()
