"""Draft-model fallback: exact output whatever the draft model, and a policy that drops it when useless."""

from __future__ import annotations

import copy

import pytest

from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.decoding.model_drafter import ModelDrafter, VocabularyMismatchError
from ragspec.engine.ngram import NgramDrafter
from ragspec.engine.policy import AdaptivePolicy, FixedPolicy

from tests.ragspec.decoding.test_generator import assert_same_or_tie, brute_greedy
from tests.ragspec.tiny import tiny_model


class NoDrafts(NgramDrafter):
    """An n-gram drafter that never matches, so every draft comes from the draft model."""

    def propose(self, context, max_tokens):  # type: ignore[override]
        return None


@pytest.mark.parametrize("seed", range(3))
def test_identical_draft_model_is_fully_accepted_and_exact(seed: int) -> None:
    target = tiny_model(300, seed)
    draft = copy.deepcopy(target)
    prompt = [seed, 17, 4, 250, 3]
    expected = brute_greedy(target, prompt, 40)
    gen = SpeculativeGenerator(target, drafter=NoDrafts(), draft_model=draft, policy=FixedPolicy(k=0, model_k=5))
    for i in range(3):  # a second request re-uses and rolls back the draft model's cache; a third starts cold
        if i == 2:
            gen.clear_cache()
            assert gen.drafter.model is not None and gen.drafter.model._seen == []
        result = gen.generate(prompt, max_new_tokens=40)
        assert_same_or_tie(target, prompt, expected, result.token_ids)
        model = result.stats.by_source["model"]
        assert model.accepted == model.drafted > 0
        assert result.stats.forward_passes <= len(expected) // 6 + 2


@pytest.mark.parametrize("seed", range(3))
def test_unrelated_draft_model_keeps_output_exact(seed: int) -> None:
    target, draft = tiny_model(300, seed), tiny_model(300, seed + 100)
    prompt = [9, 8, 7, seed]
    expected = brute_greedy(target, prompt, 40)
    gen = SpeculativeGenerator(target, drafter=NoDrafts(), draft_model=draft, policy=FixedPolicy(k=0, model_k=4))
    result = gen.generate(prompt, max_new_tokens=40)
    assert_same_or_tie(target, prompt, expected, result.token_ids)
    model = result.stats.by_source["model"]
    assert model.drafted > 0 and model.accepted <= model.drafted // 4


def test_a_draft_model_with_a_shorter_window_drafts_only_inside_it() -> None:
    target, draft = tiny_model(300, 1, context=256), tiny_model(300, 1, context=48)
    prompt = [(7 * i) % 250 for i in range(40)]
    expected = brute_greedy(target, prompt, 30)
    gen = SpeculativeGenerator(target, drafter=NoDrafts(), draft_model=draft, policy=FixedPolicy(k=0, model_k=4))
    result = gen.generate(prompt, max_new_tokens=30)
    assert_same_or_tie(target, prompt, expected, result.token_ids)
    assert 0 < result.stats.by_source["model"].drafted <= 8  # positions 40..47 only


class FixedCostPolicy(AdaptivePolicy):
    """The adaptive policy fed fixed costs instead of the clock, so its choices are reproducible:
    a plain step 50 ms, each verified draft token 5 ms more, each draft-model token 10 ms."""

    def record(self, draft, n_accepted, forward_seconds, draft_seconds):  # type: ignore[no-untyped-def]
        k = len(draft) if draft is not None else 0
        super().record(draft, n_accepted, 0.05 + 0.005 * k, 0.01 * k)


def test_adaptive_policy_stops_asking_a_useless_draft_model() -> None:
    target, draft = tiny_model(300, 1), tiny_model(300, 77)
    policy = FixedCostPolicy(explore_every=32)
    policy.calibrate({k: 0.05 + 0.005 * k for k in (0, 1, 2, 4, 8, 16)})  # no timed calibration either
    gen = SpeculativeGenerator(target, drafter=NoDrafts(), draft_model=draft, policy=policy)
    result = gen.generate([5, 6, 7], max_new_tokens=120)
    model = result.stats.by_source["model"]
    # A few tries while acceptance is learnt, then only the periodic re-check (every 32 plain steps).
    assert model.accepted <= model.drafted // 4
    assert 1 <= model.verify_steps <= 12, model.verify_steps
    assert result.stats.forward_passes >= 100  # almost every token came from a plain step


def test_vocabulary_mismatch_is_a_clear_error() -> None:
    target, draft = tiny_model(300, 0), tiny_model(320, 0)
    with pytest.raises(VocabularyMismatchError, match=r"tiny-320-0.*320 tokens.*tiny-300-0.*300 tokens"):
        ModelDrafter(draft, target)
    with pytest.raises(ValueError):
        SpeculativeGenerator(target, draft_model=draft)
