"""The verify loop against brute-force greedy decoding, on tiny random models."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest
import torch
from transformers import DynamicCache

from ragspec.engine.drafting import Draft, DraftSource
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.decoding.loop import verify
from ragspec.engine.results import GeneratorBusyError, PromptTooLongError
from ragspec.backends.pytorch.kv_cache import make_cache
from ragspec.backends.pytorch.loading import LoadedModel
from ragspec.engine.policy import AdaptivePolicy, FixedPolicy
from ragspec.engine.sampling import GreedyAcceptor

from tests.ragspec.tiny import EOS, tiny_model

TIE = 1e-4  # a top-2 logit gap below this is a numerical tie (see docs/design.md, "Exactness rules")


@torch.inference_mode()
def brute_greedy(lm: LoadedModel, prompt: Sequence[int], n: int) -> list[int]:
    """Greedy decoding by recomputing the whole sequence every step: no cache, no drafts."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(n):
        token = int(lm.model(torch.tensor([ids])).logits[0, -1].argmax())
        if token == EOS:
            break
        out.append(token)
        ids.append(token)
    return out


@torch.inference_mode()
def assert_same_or_tie(lm: LoadedModel, prompt: Sequence[int], expected: list[int], got: list[int]) -> None:
    """Token-identical, or the first divergence sits on a numerical tie of the target."""
    if got == expected:
        return
    i = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    logits = lm.model(torch.tensor([list(prompt) + expected[:i]])).logits[0, -1]
    top2 = logits.topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap < TIE, f"outputs diverge at token {i} where the target's top-2 gap is {gap:.3g} (not a tie)"


class NoisyOracle:
    """Proposes the true greedy continuation with random corruptions: exercises partial acceptance."""

    def __init__(self, truth: list[int], prompt_len: int, seed: int, vocab: int) -> None:
        self.truth, self.prompt_len, self.rng, self.vocab = truth, prompt_len, random.Random(seed), vocab
        self.accepted: list[int] = []

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]]) -> None:
        pass

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        done = len(context) - self.prompt_len
        tokens = list(self.truth[done : done + self.rng.randint(0, max_tokens)])
        for j in range(len(tokens)):
            if self.rng.random() < 0.15:
                tokens[j] = self.rng.randrange(self.vocab)
        return Draft(tuple(tokens), DraftSource.ORACLE) if tokens else None

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        self.accepted.append(n_accepted)

    def finish(self, output: Sequence[int]) -> None:
        pass


@pytest.mark.parametrize("vocab", [257, 300, 1024])
@pytest.mark.parametrize("seed", range(6))
def test_ngram_speculation_equals_brute_force_greedy(vocab: int, seed: int) -> None:
    lm = tiny_model(vocab, seed)
    rng = random.Random(seed)
    prompt_len = rng.choice([1, 2, 7, 33, 90])
    # Prompts with repeats so that the n-gram drafter has something to copy.
    motif = [rng.randrange(vocab) for _ in range(5)]
    prompt = [rng.choice(motif) if rng.random() < 0.6 else rng.randrange(EOS) for _ in range(prompt_len)]
    passages = [[rng.choice(motif) for _ in range(20)], []]
    expected = brute_greedy(lm, prompt, 60)
    gen = SpeculativeGenerator(lm, policy=FixedPolicy(k=rng.choice([1, 3, 8])))
    plain = gen.generate(prompt, references=passages, max_new_tokens=60, speculation=False)
    spec = gen.generate(prompt, references=passages, max_new_tokens=60)
    assert_same_or_tie(lm, prompt, expected, plain.token_ids)
    assert_same_or_tie(lm, prompt, expected, spec.token_ids)
    assert spec.text == plain.text
    assert plain.stats.drafted_tokens == 0 and plain.stats.forward_passes == len(plain.token_ids) + (plain.finish_reason == "eos")


@pytest.mark.parametrize("seed", range(3))
def test_a_sliding_window_model_rolls_back_past_its_window(seed: int) -> None:
    """Rejected drafts after the sequence outgrew the window (transformers' own sliding-window cache
    cannot be cropped there), and the output still equals greedy decoding without a cache."""
    from transformers import MistralConfig, MistralForCausalLM

    from tests.ragspec.tiny import byte_tokenizer

    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, sliding_window=16, initializer_range=0.3,
        eos_token_id=EOS, bos_token_id=None, pad_token_id=EOS, tie_word_embeddings=False,
    )  # fmt: skip
    lm = LoadedModel(MistralForCausalLM(config).eval(), byte_tokenizer(257), "tiny-swa", torch.device("cpu"), torch.float32)
    prompt = [random.Random(seed).randrange(EOS) for _ in range(40)]
    expected = brute_greedy(lm, prompt, 40)
    oracle = NoisyOracle(expected, len(prompt), seed, 257)
    spec = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=4)).generate(prompt, max_new_tokens=40)
    assert_same_or_tie(lm, prompt, expected, spec.token_ids)
    assert any(n < 4 for n in oracle.accepted), "some drafts were rejected and rolled back"


@pytest.mark.parametrize("seed", range(8))
def test_partial_acceptance_and_rollback_keep_output_exact(seed: int) -> None:
    lm = tiny_model(300, seed, layers=3)
    prompt = [random.Random(seed).randrange(EOS) for _ in range(11)]
    expected = brute_greedy(lm, prompt, 80)
    oracle = NoisyOracle(expected, len(prompt), seed, 300)
    gen = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=16), max_draft=16)
    result = gen.generate(prompt, max_new_tokens=80)
    assert_same_or_tie(lm, prompt, expected, result.token_ids)
    # Both rejections (rollback) and multi-token acceptances really happened.
    assert any(0 < n < 16 for n in oracle.accepted) and max(oracle.accepted) >= 3
    assert result.stats.forward_passes < len(result.token_ids)


@pytest.mark.parametrize("capacity", [1, 7, 64])  # 1 and 7 force the buffers to grow
@torch.inference_mode()
def test_rollback_leaves_cache_equal_to_a_fresh_prefill(capacity: int) -> None:
    lm = tiny_model(257, 3)
    gen = SpeculativeGenerator(lm)
    prompt = [5, 6, 7, 8, 9, 10]
    truth = brute_greedy(lm, prompt, 6)
    cache = make_cache(lm.model.config, capacity)
    gen.backend.forward(prompt, cache)
    wrong = (truth[1], truth[2], (truth[3] + 1) % 250, 42, 43)  # two right, then wrong
    new, n = verify(gen.backend, cache, truth[0], Draft(wrong, DraftSource.ORACLE), GreedyAcceptor())
    assert (new, n) == ([truth[1], truth[2], truth[3]], 2)
    fresh = DynamicCache(config=lm.model.config)  # transformers' own concatenating cache
    gen.backend.forward(prompt + truth[:3], fresh)
    assert cache.get_seq_length() == fresh.get_seq_length() == len(prompt) + 3
    for got, want in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(got.keys, want.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.values, want.values, rtol=1e-5, atol=1e-5)


def _printable_model() -> tuple[LoadedModel, list[int], str]:
    """A tiny model that only writes printable ASCII (other output rows zeroed), and its output."""
    lm = tiny_model(257, 5)
    with torch.no_grad():
        for token in range(257):
            text = lm.tokenizer.decode([token])
            if not (len(text) == 1 and text.isascii() and text.isprintable()):
                lm.model.lm_head.weight[token] = 0.0
    prompt = lm.tokenizer.encode("hello there")
    text = SpeculativeGenerator(lm).generate(prompt, max_new_tokens=40, speculation=False).text
    assert len(text) == 40 and text.isprintable()
    return lm, prompt, text


def test_stop_string_split_across_tokens_never_appears() -> None:
    lm, prompt, plain_text = _printable_model()
    stop = plain_text[9:12]  # three bytes: three tokens with the byte tokenizer
    cut = plain_text.find(stop)
    gen = SpeculativeGenerator(lm, policy=FixedPolicy(k=4))
    for speculative in (False, True):
        stream = gen.stream(prompt, max_new_tokens=40, stop=["never-there", stop], speculation=speculative)
        deltas = list(stream)
        result = stream.result
        assert result is not None and result.finish_reason == "stop"
        assert result.text == plain_text[:cut]
        assert "".join(deltas) == result.text
        # The ids end with the token that completed the stop string.
        assert lm.tokenizer.decode(result.token_ids).endswith(stop)


def test_streaming_holds_back_a_partial_stop_string() -> None:
    lm, prompt, plain_text = _printable_model()
    # A stop string that starts like the output but then differs: its prefix must be held back
    # while it could still complete, then released.
    stop = plain_text[5:8] + "\x00"
    stream = SpeculativeGenerator(lm).stream(prompt, max_new_tokens=20, stop=[stop])
    seen = ""
    for delta in stream:
        seen += delta
        assert plain_text.startswith(seen)
        assert not seen.endswith(stop[:3]), "a possible stop string was shown before it was settled"
    assert stream.result is not None and seen == stream.result.text == plain_text[: len(seen)]
    assert stream.result.finish_reason == "length"


def test_eos_ends_generation_and_is_not_returned() -> None:
    lm = tiny_model(300, 1)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    out = brute_greedy(lm, prompt, 30)
    lm.model.generation_config.eos_token_id = out[7]  # pretend the 8th token is EOS
    first = out.index(out[7])
    for speculative in (False, True):
        result = SpeculativeGenerator(lm).generate(prompt, max_new_tokens=30, speculation=speculative)
        assert result.finish_reason == "eos"
        assert result.token_ids == out[:first]


@pytest.mark.parametrize("n", [0, 1, 2])
def test_max_new_tokens_is_exact(n: int) -> None:
    lm = tiny_model(257, 2)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    result = SpeculativeGenerator(lm, policy=FixedPolicy(k=8)).generate(prompt, max_new_tokens=n)
    assert result.token_ids == brute_greedy(lm, prompt, n)[:n]
    assert len(result.token_ids) == n and result.finish_reason == "length"
    # No forward without a token to produce; each forward yields at least one token.
    assert (result.stats.forward_passes == 0) if n == 0 else (1 <= result.stats.forward_passes <= n)


def test_prompt_longer_than_context_is_a_clear_error() -> None:
    lm = tiny_model(257, 0, context=32)
    gen = SpeculativeGenerator(lm)
    with pytest.raises(PromptTooLongError, match="40 tokens but .* at most 32"):
        gen.generate(list(range(40)))
    # A prompt that leaves room for 2 tokens gets exactly those, however many were asked for.
    result = gen.generate(list(range(30)), max_new_tokens=50)
    assert len(result.token_ids) == 2 and result.finish_reason == "length"


def test_invalid_parameters_raise_value_error_before_work() -> None:
    lm = tiny_model(257, 0)
    with pytest.raises(ValueError, match="max_draft"):
        SpeculativeGenerator(lm, max_draft=0)
    with pytest.raises(ValueError, match="max_draft"):
        AdaptivePolicy(max_draft=0)
    with pytest.raises(ValueError, match="must be >= 0"):
        FixedPolicy(k=-1)
    gen = SpeculativeGenerator(lm)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.stream([1, 2], max_new_tokens=-1)
    with pytest.raises(ValueError, match="stop strings"):
        gen.stream([1, 2], stop=[""])
    with pytest.raises(ValueError, match="prompt is empty"):
        gen.generate([])


def test_stats_account_for_every_token() -> None:
    lm = tiny_model(300, 4, layers=3)
    prompt = [7] * 5 + [8, 9]
    expected = brute_greedy(lm, prompt, 50)
    oracle = NoisyOracle(expected, len(prompt), 0, 300)
    result = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=6)).generate(prompt, max_new_tokens=50)
    s = result.stats
    assert s.new_tokens == len(result.token_ids) == len(expected[:50])
    assert s.by_source["oracle"].drafted == s.drafted_tokens and s.by_source["oracle"].accepted == s.accepted_tokens
    assert s.accepted_tokens == sum(oracle.accepted)
    # Every forward yields one target token plus its accepted drafts (the final one may be cut).
    assert s.new_tokens <= s.forward_passes + s.accepted_tokens
    assert 0 < s.ttft_s <= s.wall_s and s.decode_tokens_per_s > 0


class RecordingOracle(NoisyOracle):
    """A ``NoisyOracle`` that records every verified draft as (drafted, accepted)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.steps: list[tuple[int, int]] = []

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        super().feedback(draft, n_accepted)
        self.steps.append((len(draft), n_accepted))


@pytest.mark.parametrize(("seed", "k"), [(0, 6), (1, 3), (2, 16)])
def test_drafting_metrics_in_vllms_shape_count_every_verified_draft(seed: int, k: int) -> None:
    """``speculative_decoding()`` against the drafts the drafter was told about, counted by hand with
    vLLM's formulas (``RequestSpecDecodeMetrics.to_dict``); none at all without speculation."""
    lm = tiny_model(300, seed, layers=3)
    prompt = [random.Random(seed).randrange(EOS) for _ in range(9)]
    expected = brute_greedy(lm, prompt, 60)
    oracle = RecordingOracle(expected, len(prompt), seed, 300)
    gen = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=k), max_draft=16)
    s = gen.generate(prompt, max_new_tokens=60).stats
    steps = oracle.steps
    assert steps and any(a < d for d, a in steps)  # rejections happened
    histogram = [sum(1 for _, a in steps if a == j) for j in range(17)]
    accepted = sum(a for _, a in steps)
    assert s.speculative_decoding() == {
        "mean_acceptance_length": 1 + accepted / len(steps),
        "draft_acceptance_rate": accepted / sum(d for d, _ in steps),
        "acceptance_histogram": histogram,
        "num_spec_steps": len(steps),
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": sum(d for d, _ in steps),
        "num_spec_tokens": 16,
    }
    assert s.accepted_by_position == [sum(1 for _, a in steps if a > i) for i in range(16)]
    assert s.as_dict()["accepted_by_position"] == s.accepted_by_position
    plain = gen.generate(prompt, max_new_tokens=20, speculation=False).stats
    assert plain.speculative_decoding() is None and plain.acceptance_histogram == [] and plain.accepted_by_position == []
    assert s.as_dict()["tokens_per_forward"] == pytest.approx(s.decoded_tokens / s.forward_passes)
    assert s.decoded_tokens == s.new_tokens  # nothing was cut


def test_passage_drafts_are_counted_per_reference() -> None:
    lm = tiny_model(300, 2)
    prompt = [5, 6, 7]
    expected = brute_greedy(lm, prompt, 40)
    # reference 1 holds the answer itself (as a prediction would), reference 0 noise, reference 2 is empty
    references = [[11, 12, 13, 14] * 4, list(expected), []]
    s = SpeculativeGenerator(lm, policy=FixedPolicy(k=4)).generate(prompt, references=references, max_new_tokens=40).stats
    assert set(s.by_reference) <= {0, 1} and s.by_reference[1].accepted > 0
    passage = s.by_source["passage"]
    assert sum(r.drafted for r in s.by_reference.values()) == passage.drafted
    assert sum(r.accepted for r in s.by_reference.values()) == passage.accepted
    assert sum(r.verify_steps for r in s.by_reference.values()) == passage.verify_steps


def test_prefix_cache_reuses_a_shared_prompt_prefix_exactly() -> None:
    lm = tiny_model(300, 6)
    system = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    first, second = system + [7, 7, 8], system + [20, 21]
    gen = SpeculativeGenerator(lm)
    a = gen.generate(first, max_new_tokens=20)
    b = gen.generate(second, max_new_tokens=20)
    assert (a.stats.cached_prompt_tokens, b.stats.cached_prompt_tokens) == (0, len(system))
    assert_same_or_tie(lm, second, brute_greedy(lm, second, 20), b.token_ids)
    again = gen.generate(second, max_new_tokens=20)  # the whole prompt but its last token is reused
    assert again.stats.cached_prompt_tokens == len(second) - 1 and again.token_ids == b.token_ids
    gen.clear_cache()
    cold = gen.generate(second, max_new_tokens=20)
    assert cold.stats.cached_prompt_tokens == 0 and cold.token_ids == b.token_ids
    off = SpeculativeGenerator(lm, prefix_cache=False)
    off.generate(first, max_new_tokens=5)
    assert off.generate(second, max_new_tokens=5).stats.cached_prompt_tokens == 0


def test_abandoned_stream_releases_the_model_and_keeps_no_cache() -> None:
    lm = tiny_model(300, 6)
    gen = SpeculativeGenerator(lm)
    prompt = [4, 5, 6, 7, 8]
    stream = gen.stream(prompt, max_new_tokens=30)
    next(iter(stream))
    stream.close()  # e.g. a client disconnected
    result = gen.generate(prompt, max_new_tokens=30)  # would deadlock if the lock were still held
    assert result.stats.cached_prompt_tokens == 0
    assert_same_or_tie(lm, prompt, brute_greedy(lm, prompt, 30), result.token_ids)


def test_stream_stats_are_live() -> None:
    lm = tiny_model(300, 2)
    stream = SpeculativeGenerator(lm).stream([1, 2, 3], max_new_tokens=12, speculation=False)
    seen = []
    for _ in stream:
        seen.append((stream.stats.new_tokens, stream.stats.forward_passes))
    assert seen[0][0] >= 1 and seen[-1][0] > seen[0][0]  # counts grow while streaming
    assert stream.result is not None and stream.result.stats is stream.stats
    result = stream.result
    assert list(stream) == [] and stream.result is result  # iterating again yields nothing, keeps the result


@pytest.mark.timeout(60)
def test_an_infinite_busy_timeout_waits_for_the_other_request() -> None:
    import threading

    gen = SpeculativeGenerator(tiny_model(257, 3), policy=FixedPolicy(k=4), busy_timeout_s=float("inf"))
    stream = gen.stream([5, 6, 7], max_new_tokens=20)
    deltas = iter(stream)
    next(deltas)  # held by this thread
    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(gen.generate([5, 6, 7], max_new_tokens=3).finish_reason))
    worker.start()
    worker.join(timeout=0.3)
    assert worker.is_alive() and not done  # waiting, not failed
    stream.close()
    worker.join(timeout=30)
    assert done == ["length"]


@pytest.mark.timeout(60)
def test_a_second_request_in_the_thread_of_an_open_stream_fails_at_once() -> None:
    gen = SpeculativeGenerator(tiny_model(257, 3), policy=FixedPolicy(k=4))
    stream = gen.stream([5, 6, 7], max_new_tokens=20)
    deltas = iter(stream)
    next(deltas)  # the stream now holds the generator
    with pytest.raises(GeneratorBusyError, match="open stream"):
        gen.generate([5, 6, 7], max_new_tokens=3)
    stream.close()
    assert len(gen.generate([5, 6, 7], max_new_tokens=3).token_ids) == 3  # released by close()


@pytest.mark.timeout(60)
def test_a_stream_used_as_a_context_manager_releases_the_generator_on_early_exit() -> None:
    gen = SpeculativeGenerator(tiny_model(257, 3), policy=FixedPolicy(k=4))
    with gen.stream([5, 6, 7], max_new_tokens=20) as stream:
        for _ in stream:
            break
    assert gen.generate([5, 6, 7], max_new_tokens=3).finish_reason == "length"


@pytest.mark.timeout(60)
def test_another_thread_waits_a_bounded_time_then_gets_a_busy_error() -> None:
    import threading

    gen = SpeculativeGenerator(tiny_model(257, 3), policy=FixedPolicy(k=4), busy_timeout_s=0.2)
    stream = gen.stream([5, 6, 7], max_new_tokens=20)
    deltas = iter(stream)
    next(deltas)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            gen.generate([5, 6, 7], max_new_tokens=3)
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    worker = threading.Thread(target=other)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive() and len(errors) == 1 and isinstance(errors[0], GeneratorBusyError)
    assert "busy with another request for 0.2 s" in str(errors[0])
    stream.close()
    # Once released, a waiting thread gets the generator.
    done: list[int] = []
    stream = gen.stream([5, 6, 7], max_new_tokens=20)
    deltas = iter(stream)
    next(deltas)
    gen.busy_timeout_s = 30.0
    waiter = threading.Thread(target=lambda: done.append(len(gen.generate([5, 6, 7], max_new_tokens=3).token_ids)))
    waiter.start()
    stream.close()
    waiter.join(timeout=30)
    assert done == [3]


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"top_k": 2.5}, "top_k"),
        ({"seed": "abc"}, "seed"),
        ({"temperature": 1e-45}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"max_token": 3}, "unknown generation option"),  # max_tokens is the option itself (GenerationConfig.max_tokens)
    ],
)
def test_bad_options_are_rejected_before_any_work(options: dict, name: str) -> None:
    gen = SpeculativeGenerator(tiny_model(257, 3), policy=FixedPolicy(k=4))
    with pytest.raises(ValueError, match=name):
        gen.stream([5, 6, 7], **options)


@pytest.mark.parametrize("where", ["prompt", "reference"])
@pytest.mark.parametrize("bad", [257, 2**70, -1])
def test_token_ids_outside_the_vocabulary_are_refused_before_decoding(where: str, bad: int) -> None:
    gen = SpeculativeGenerator(tiny_model(257, 3), policy=FixedPolicy(k=4))
    prompt, references = ([5, bad], ()) if where == "prompt" else ([5, 6], [[5, 6, bad]])
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the model's vocabulary \[0, 257\)"):
        gen.stream(prompt, references=references)
    assert gen.generate([5, 6], references=[[5, 6, 256]], max_new_tokens=3).finish_reason == "length"


def test_lone_surrogates_in_a_prompt_are_replaced_not_a_crash() -> None:
    gen = SpeculativeGenerator(tiny_model(257, 3), policy=FixedPolicy(k=4))
    assert gen.encode("a\udcffb", special_tokens=False) == gen.encode("a\ufffdb", special_tokens=False)
    assert gen.generate("a\ud800b", max_new_tokens=2).finish_reason == "length"


def test_a_stream_gives_one_delta_per_token_however_many_a_forward_accepts() -> None:
    """Callbacks and stream chunks count tokens, not forwards: a drafted answer streams in the
    same pieces as the one decoded token by token (tiny models decode each byte token to text)."""
    lm = tiny_model(300, 4)
    prompt = [random.Random(4).randrange(EOS) for _ in range(11)]
    expected = brute_greedy(lm, prompt, 40)
    plain = SpeculativeGenerator(lm).stream(prompt, max_new_tokens=40, speculation=False)
    plain_deltas = list(plain)
    oracle = NoisyOracle(expected, len(prompt), 4, 300)
    drafted = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=8)).stream(prompt, max_new_tokens=40)
    drafted_deltas = list(drafted)
    assert drafted.result.stats.tokens_per_forward > 1.5  # forwards accepted several tokens each
    assert drafted_deltas == plain_deltas and "".join(plain_deltas) == plain.result.text
    assert len(drafted_deltas) > drafted.result.stats.forward_passes  # not one delta per forward


class AskedOracle(NoisyOracle):
    """Also remembers how many tokens each step asked for."""

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        self.asked.append(max_tokens)
        return super().propose(context, max_tokens)


def test_a_requests_speculation_setting_caps_or_stops_its_drafts_and_keeps_the_output() -> None:
    lm = tiny_model(300, 4, layers=2)
    prompt = [random.Random(4).randrange(EOS) for _ in range(11)]
    expected = brute_greedy(lm, prompt, 60)
    oracle = AskedOracle(expected, len(prompt), 4, 300)
    gen = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=16), max_draft=16)
    for setting, longest in (({"max_draft": 3}, 3), ({"enabled": False}, 0), (True, 16)):
        oracle.asked = []
        result = gen.generate(prompt, max_new_tokens=60, speculation=setting)
        assert_same_or_tie(lm, prompt, expected, result.token_ids)
        assert (max(oracle.asked) if oracle.asked else 0) == longest
        assert result.stats.drafted_tokens <= longest * result.stats.forward_passes
        assert (result.stats.drafted_tokens > 0) == (longest > 0)


@pytest.mark.parametrize("seed", range(4))
def test_bf16_prompts_keep_speculative_equal_to_plain_decoding(seed: int) -> None:
    """With prompts in bf16 over fp32 steps (the default on CPUs with AMX or AVX512-BF16), speculative
    decoding equals plain decoding at those settings, also after a reused prompt prefix."""
    lm = dataclasses.replace(tiny_model(300, seed, layers=3), prompt_dtype=torch.bfloat16)
    rng = random.Random(seed)
    system = [rng.randrange(EOS) for _ in range(24)]
    prompts = [system + [rng.randrange(EOS) for _ in range(rng.choice([3, 17]))] for _ in range(2)]
    plain_gen = SpeculativeGenerator(lm, prefix_cache=False)
    assert "in bfloat16" in plain_gen.backend.description
    for prompt in prompts:
        plain = plain_gen.generate(prompt, max_new_tokens=50, speculation=False).token_ids
        oracle = NoisyOracle(plain, len(prompt), seed, 300)
        spec_gen = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=6))
        spec_gen.generate(system + [1], max_new_tokens=2)  # leaves the system prefix in its prefix cache
        spec = spec_gen.generate(prompt, max_new_tokens=50)
        assert spec.stats.cached_prompt_tokens == len(system)
        assert spec.token_ids == plain
        assert any(0 < n < 6 for n in oracle.accepted), "some drafts were rejected and rolled back"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_steps_on_a_cpu_draft_nothing_and_equal_plain_decoding(
    dtype: torch.dtype, caplog: pytest.LogCaptureFixture
) -> None:
    """A verify pass in bf16 or fp16 on a CPU rounds rows otherwise than one-row steps, so a drafted token could be
    kept where plain decoding writes another: such a generator drafts nothing (and says so), and its answers are
    plain decoding's. fp32 steps, also under bf16 prompts, keep drafting."""
    tiny, other = tiny_model(300, 1, layers=2), tiny_model(300, 1, layers=2)
    half = dataclasses.replace(other, model=other.model.to(dtype), dtype=dtype)  # converts ``other`` in place
    assert not half.verify_matches_steps
    assert tiny.verify_matches_steps and dataclasses.replace(tiny, prompt_dtype=torch.bfloat16).verify_matches_steps
    with caplog.at_level("WARNING", logger="ragspec.decoding.generator"):
        gen = SpeculativeGenerator(half, prefix_cache=False)
    assert "drafting is off" in caplog.text and "dtype='auto'" in caplog.text
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]  # a repeat an n-gram drafter would copy
    plain = gen.generate(prompt, max_new_tokens=24, speculation=False)
    spec = gen.generate(prompt, max_new_tokens=24)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted_tokens == 0 and spec.stats.forward_passes == plain.stats.forward_passes
    drafting = SpeculativeGenerator(tiny, prefix_cache=False).generate(prompt, max_new_tokens=24)
    assert drafting.stats.drafted_tokens > 0
