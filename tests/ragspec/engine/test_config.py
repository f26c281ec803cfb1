"""GenerationConfig: one set of rules for every entry point, merged with per-call overrides."""

from __future__ import annotations

import pytest

from ragspec.engine.config import (
    DEFAULT_MAX_TOKENS,
    MIN_TEMPERATURE,
    GenerationConfig,
    GenerationConfigError,
    call_options,
    request_config,
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 1.5}, "max_new_tokens must be an integer, got 1.5"),
        ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
        ({"max_new_tokens": -1}, "max_new_tokens must be >= 0"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"seed": "abc"}, "seed must be an integer, got 'abc'"),
        ({"seed": -3}, "seed must be >= 0"),
        ({"seed": 2**64}, "seed must be at most"),
        ({"stop": None, "temperature": 1e-45}, "temperature must be 0 (greedy) or at least"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"temperature": -0.5}, "temperature must be 0"),
        ({"temperature": "hot"}, "temperature must be a finite number"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"stop": [""]}, "stop strings must be non-empty"),
        ({"stop": [3]}, "stop strings must be non-empty strings, got 3"),
        ({"stop": 3}, "stop must be a string or a list"),
        ({"speculation": "yes"}, "speculation must be true, false or an object"),
        ({"speculation": {"max_draft": 0}}, "speculation.max_draft must be >= 1"),
        ({"speculation": {"enabled": "no"}}, "speculation.enabled must be true or false"),
        ({"speculation": {"draft": 4}}, "speculation takes enabled and max_draft, got unknown key"),
    ],
)
def test_bad_values_name_the_parameter(kwargs: dict, message: str) -> None:
    with pytest.raises(GenerationConfigError) as info:
        GenerationConfig(**kwargs)
    assert message in str(info.value)


def test_values_are_normalised() -> None:
    config = GenerationConfig(stop="\n\n", temperature=1, top_p=1)
    assert config.stop == ("\n\n",) and isinstance(config.temperature, float) and config.temperature == 1.0
    assert GenerationConfig(stop=None).stop == ()
    assert GenerationConfig(stop=["a", "b", "a"]).stop == ("a", "b")
    assert GenerationConfig().greedy and not GenerationConfig(temperature=MIN_TEMPERATURE).greedy


def test_merge_returns_a_new_validated_config_and_rejects_unknown_names() -> None:
    base = GenerationConfig(max_new_tokens=64, temperature=0.7, seed=1)
    merged = base.merged({"max_new_tokens": 8}, seed=2)
    assert (merged.max_new_tokens, merged.temperature, merged.seed) == (8, 0.7, 2)
    assert (base.max_new_tokens, base.seed) == (64, 1)  # never mutated
    assert base.merged() is base
    with pytest.raises(GenerationConfigError, match="unknown generation option.*max_token"):
        base.merged(max_token=3)
    with pytest.raises(GenerationConfigError, match="top_p"):
        base.merged(top_p=2)


def test_max_tokens_and_its_transformers_name_are_one_field() -> None:
    assert GenerationConfig().max_tokens == DEFAULT_MAX_TOKENS
    config = GenerationConfig(max_new_tokens=5)
    assert (config.max_tokens, config.max_new_tokens) == (5, 5) and config == GenerationConfig(max_tokens=5)
    assert config.merged(max_tokens=3).max_tokens == 3  # the new value wins over the old one's alias
    assert config.merged(temperature=0.5).max_tokens == 5
    with pytest.raises(GenerationConfigError, match="set one, not both"):
        config.merged(max_tokens=3, max_new_tokens=4)


def test_a_request_is_checked_once_with_the_parameter_named() -> None:
    assert GenerationConfig(max_tokens=0).max_tokens == 0  # a program may prefill only
    for options, param in (({"max_tokens": 0}, "max_tokens"), ({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p")):
        with pytest.raises(GenerationConfigError) as e:
            request_config(GenerationConfig(), options)
        assert e.value.param == param and str(e.value).startswith(param)
        assert e.value.named("--flag").startswith("--flag must")
    call = call_options("m", GenerationConfig(stop=("a",)), ["b"], {"model": "other", "max_tokens": 7})
    assert (call.model, call.config.max_tokens, call.config.stop) == ("other", 7, ("a", "b"))
    with pytest.raises(ValueError, match="model must be a non-empty string"):
        call_options("m", GenerationConfig(), None, {"model": ""})
