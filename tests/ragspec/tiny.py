"""Tiny random models and a byte-level tokenizer, built offline from configs."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ragspec.backends.pytorch.loading import LoadedModel

EOS = 256  # the byte tokenizer's end-of-sequence id


def byte_tokenizer(vocab_size: int = 257) -> PreTrainedTokenizerFast:
    """One token per byte (so text splits across tokens everywhere), EOS, and filler tokens up to ``vocab_size``."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)} | {"<eos>": EOS}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.add_tokens([f"<w{i}>" for i in range(vocab_size - len(fast))])
    assert len(fast) == vocab_size
    return fast


def tiny_model(vocab_size: int = 257, seed: int = 0, context: int = 256, layers: int = 2, prompt_chunk: int = 1) -> LoadedModel:
    """A random Llama with large weights, so its logits are far apart (no argmax ties in fp32). Its prompts'
    attention runs in blocks of ``prompt_chunk`` positions (1: a prefix-cache hit reuses every shared position)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        initializer_range=0.3, eos_token_id=EOS, bos_token_id=None, pad_token_id=EOS, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    return LoadedModel(model, byte_tokenizer(vocab_size), f"tiny-{vocab_size}-{seed}", torch.device("cpu"), torch.float32,
                       prompt_chunk=prompt_chunk)
