"""The draft head: hidden states kept by the forward, the head's one-token guess, exact output whatever it guesses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.train_draft_head import train
from ragspec.backends.pytorch import TorchBackend
from ragspec.decoding.draft_head import DraftHead, HeadDrafter, head_drafter
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.engine.drafting import DraftSource
from ragspec.engine.policy import AdaptivePolicy, FixedPolicy

from tests.ragspec.decoding.test_generator import assert_same_or_tie, brute_greedy
from tests.ragspec.decoding.test_model_drafter import NoDrafts
from tests.ragspec.tiny import tiny_model


def weights(lm) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    return lm.model.get_input_embeddings().weight.detach(), lm.model.get_output_embeddings().weight.detach()


def fitted_head(lm, prompt: list[int], n: int) -> DraftHead:  # type: ignore[no-untyped-def]
    """A head fitted to the target's own greedy continuation of ``prompt`` (so most of its guesses are right there),
    by the training script's own pairs and loop."""
    seq = prompt + brute_greedy(lm, prompt, n)
    with torch.no_grad():
        out = lm.model(torch.tensor([seq]), output_hidden_states=True)
    head = DraftHead(*weights(lm), torch.arange(lm.model.config.vocab_size), width=64)
    train(head, out.hidden_states[-1][0, :-2], torch.tensor(seq[1:-1]), out.logits[0, 1:-1].argmax(-1), epochs=300)
    return head.eval()


@torch.inference_mode()
def test_the_forward_keeps_the_final_norm_hidden_state_of_each_position_it_computed() -> None:
    lm = tiny_model(300, 3)
    backend = TorchBackend(lm)
    ids = [5, 17, 250, 3, 99, 42, 7]
    reference = lm.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]  # after the final norm
    cache = backend.new_cache(64)
    backend.forward(ids[:4], cache, last_only=True)  # a prompt: its last position only
    torch.testing.assert_close(backend.hidden_at(3), reference[3], rtol=1e-4, atol=1e-4)
    assert backend.hidden_at(2) is None and backend.hidden_at(4) is None
    backend.forward(ids[4:], cache)  # a verify pass: every row
    for position in (4, 5, 6):
        torch.testing.assert_close(backend.hidden_at(position), reference[position], rtol=1e-4, atol=1e-4)
    assert backend.hidden_at(3) is None and backend.hidden_at(7) is None


class States:
    def __init__(self, states: dict[int, torch.Tensor]) -> None:
        self.states = states

    def hidden_at(self, position: int) -> torch.Tensor | None:
        return self.states.get(position)


def test_the_head_guesses_from_the_state_before_the_newest_token() -> None:
    lm = tiny_model(300, 4)
    torch.manual_seed(0)
    head = DraftHead(*weights(lm), torch.arange(40, 300), width=16)
    states = {i: torch.randn(32) for i in range(6)}
    drafter = HeadDrafter(head, States(states))
    context = [1, 2, 3, 4, 5, 6]
    draft = drafter.propose(context, 4)
    assert draft is not None and draft.source is DraftSource.MODEL and len(draft) == 1
    with torch.no_grad():
        expected = int(head.vocab[head(states[4], torch.tensor(6)).argmax()])  # position 4 chose the newest token
    assert draft.tokens == (expected,) and 40 <= expected < 300
    assert drafter.propose(context, 0) is None
    assert drafter.propose([*context, 7, 8], 4) is None  # no state kept for position 6


@pytest.mark.parametrize("seed", range(3))
def test_head_drafts_keep_greedy_output_exact_and_a_fitted_head_saves_forwards(seed: int, tmp_path: Path) -> None:
    target = tiny_model(300, seed)
    prompt = [seed, 17, 4, 250, 3]
    expected = brute_greedy(target, prompt, 40)
    torch.manual_seed(seed)
    random_head = DraftHead(*weights(target), torch.arange(300), width=16)
    for head, fitted in ((random_head, False), (fitted_head(target, prompt, 40), True)):
        path = tmp_path / f"{fitted}.safetensors"
        head.save(path, {"model": target.name})
        gen = SpeculativeGenerator(target, drafter=NoDrafts(), draft_head=path, policy=FixedPolicy(k=0, model_k=4))
        assert isinstance(gen.drafter.model, HeadDrafter)
        result = gen.generate(prompt, max_new_tokens=40)
        assert_same_or_tie(target, prompt, expected, result.token_ids)
        drafted = result.stats.by_source["model"]
        assert drafted.drafted >= result.stats.forward_passes - 2  # one token a step (model_longest), but the last
        if fitted:
            assert drafted.accepted >= drafted.drafted // 2
            assert result.stats.forward_passes <= 0.7 * len(expected)


def test_the_default_model_drafts_with_its_bundled_head_when_asked() -> None:
    gen = SpeculativeGenerator("default", device="cpu", dtype="float32", backend="torch", draft_head=True)
    assert isinstance(gen.drafter.model, HeadDrafter) and gen.policy.model_longest == 1
    assert gen.drafter.model.acceptance == pytest.approx(float(gen.drafter.model.head.metadata["held_out_accuracy"]))
    assert SpeculativeGenerator(gen.target).drafter.model is None  # off by default


def test_a_head_that_cannot_be_used_is_a_clear_error(tmp_path: Path) -> None:
    target, other = tiny_model(300, 1), tiny_model(257, 1)
    with pytest.raises(ValueError, match="no file"):
        SpeculativeGenerator(target, draft_head=tmp_path / "missing.safetensors")
    path = tmp_path / "other.safetensors"
    DraftHead(*weights(other), torch.arange(257), width=16).save(path, {"model": other.name})
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    for bad in (path, tmp_path / "junk.safetensors"):
        with pytest.raises(ValueError, match="is not a draft head of"):
            SpeculativeGenerator(target, draft_head=bad)
    assert head_drafter(TorchBackend(target)) is None  # no bundled head for this model: nothing, no error


def test_the_policy_asks_a_one_token_drafter_for_one_token() -> None:
    def measured(longest: int | None) -> AdaptivePolicy:
        policy = AdaptivePolicy(model_longest=longest)
        policy.calibrate({0: 1.0, 1: 1.02, 2: 1.04, 4: 1.08, 8: 1.16, 16: 1.32})
        from ragspec.engine.drafting import Draft

        for _ in range(20):  # a cheap draft model whose tokens are always accepted
            policy.record(Draft((1,), DraftSource.MODEL), 1, 1.02, 0.001)
        return policy

    assert measured(None).choose_model(8) > 1
    assert measured(1).choose_model(8) == 1
