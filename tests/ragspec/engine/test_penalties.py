"""Penalties against a brute-force reference, and speculative decoding with them against plain decoding."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from ragspec.engine.config import GenerationConfig, GenerationConfigError
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.backends.pytorch.loading import LoadedModel
from ragspec.engine.penalties import Penalties
from ragspec.engine.policy import FixedPolicy

from tests.ragspec.decoding.test_generator import NoisyOracle, assert_same_or_tie
from tests.ragspec.tiny import EOS, tiny_model


def reference_penalties(logits: torch.Tensor, history: Sequence[int], config: GenerationConfig) -> torch.Tensor:
    """One position's logits ``[vocab]`` penalised from the answer tokens before it, the slow way:
    transformers' repetition penalty over the window, then OpenAI's formula token by token."""
    n = config.repeat_last_n
    window = list(history) if n < 0 else list(history)[max(0, len(history) - n) :] if n > 0 else []
    out = logits.clone()
    if window and config.repeat_penalty != 1:
        out = RepetitionPenaltyLogitsProcessor(config.repeat_penalty)(torch.tensor([window]), out[None])[0]
    for token, count in Counter(history).items():
        out[token] -= count * config.frequency_penalty + config.presence_penalty
    return out


CONFIGS = [
    GenerationConfig(repeat_penalty=1.7, repeat_last_n=3),
    GenerationConfig(repeat_penalty=0.6, repeat_last_n=-1),  # below 1 favours repeats: still exact
    GenerationConfig(frequency_penalty=0.8),
    GenerationConfig(presence_penalty=-1.2, frequency_penalty=2.0),
    GenerationConfig(repeat_penalty=1.3, repeat_last_n=64, frequency_penalty=0.4, presence_penalty=0.9),
    GenerationConfig(repeat_penalty=2.0, repeat_last_n=0, presence_penalty=0.5),  # window 0: no repeat penalty
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", range(4))
def test_each_verified_row_is_penalised_from_the_history_before_it(config: GenerationConfig, seed: int) -> None:
    rng = random.Random(seed)
    vocab = 37
    out = [rng.randrange(8) for _ in range(rng.choice([0, 1, 5, 70]))]  # few distinct tokens: many repeats
    drafted = [rng.randrange(10) for _ in range(rng.choice([0, 1, 4, 17]))]
    logits = torch.randn(1 + len(drafted), vocab, generator=torch.Generator().manual_seed(seed)) * 3
    penalties = Penalties(config)
    for start in range(0, len(out), 7):  # the answer arrives in pieces, as accepted tokens do
        penalties.advance(out[start : start + 7])
    got = penalties.mask(logits, drafted)
    for j in range(len(drafted) + 1):
        want = reference_penalties(logits[j], out + drafted[:j], config)
        torch.testing.assert_close(got[j], want, rtol=1e-6, atol=1e-6)


def test_penalty_options_are_validated_and_off_by_default() -> None:
    assert not GenerationConfig().penalized
    assert not GenerationConfig(repeat_penalty=1.5, repeat_last_n=0).penalized
    assert GenerationConfig(presence_penalty=0.1).penalized and GenerationConfig(repeat_penalty=1.1).penalized
    for bad, message in [
        ({"frequency_penalty": 2.5}, "frequency_penalty must be from -2 to 2"),
        ({"presence_penalty": "x"}, "presence_penalty must be a finite number"),
        ({"repeat_penalty": 0}, "repeat_penalty must be > 0"),
        ({"repeat_last_n": -2}, "repeat_last_n must be >= -1"),
        ({"repeat_last_n": 1.5}, "repeat_last_n must be an integer"),
    ]:
        with pytest.raises(GenerationConfigError, match=message):
            GenerationConfig(**bad)


@torch.inference_mode()
def brute_penalised_greedy(lm: LoadedModel, prompt: Sequence[int], n: int, config: GenerationConfig) -> list[int]:
    """Greedy decoding with penalties, recomputing the whole sequence every step."""
    out: list[int] = []
    for _ in range(n):
        logits = lm.model(torch.tensor([list(prompt) + out])).logits[0, -1]
        token = int(reference_penalties(logits, out, config).argmax())
        if token == EOS:
            break
        out.append(token)
    return out


@pytest.mark.parametrize("config", CONFIGS[:5])
@pytest.mark.parametrize("seed", range(2))
def test_speculative_greedy_with_penalties_equals_plain_and_brute_force(config: GenerationConfig, seed: int) -> None:
    lm = tiny_model(300, seed, layers=2)
    rng = random.Random(seed)
    motif = [rng.randrange(EOS) for _ in range(4)]
    prompt = [rng.choice(motif) for _ in range(30)]  # the model tends to repeat these; the penalties push back
    expected = brute_penalised_greedy(lm, prompt, 48, config)
    unpenalised = brute_penalised_greedy(lm, prompt, 48, GenerationConfig())
    oracle = NoisyOracle(expected, len(prompt), seed, 300)
    for gen in (SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=8)),
                SpeculativeGenerator(lm, policy=FixedPolicy(k=4, min_match=1))):  # fmt: skip
        spec = gen.generate(prompt, config, references=[motif * 5], max_new_tokens=48)
        plain = gen.generate(prompt, config, max_new_tokens=48, speculation=False)
        assert_same_or_tie(lm, prompt, expected, plain.token_ids)
        assert spec.token_ids == plain.token_ids
    assert max(oracle.accepted) >= 3 and any(0 < n < 8 for n in oracle.accepted), "drafts were partly rejected: rows saw different histories"
    if seed == 0:
        assert expected != unpenalised, "the penalties changed the output (the test can see a wrong history)"
