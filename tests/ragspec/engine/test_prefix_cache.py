"""The prefix cache: its LRU and memory bound, and hits against cold prefills on tiny random models."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest
import torch
from transformers import DynamicCache

from ragspec.backends.pytorch import TorchBackend
from ragspec.backends.pytorch.forward import HFForward, LlamaForward, prompt_min_rows
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.backends.pytorch.kv_cache import BufferLayer, cache_nbytes, copy_prefix
from ragspec.engine.policy import FixedPolicy
from ragspec.engine.prefix_cache import PrefixCache, shared_prefix

from tests.ragspec.decoding.test_generator import assert_same_or_tie, brute_greedy
from retrievers.embeddings import BF16_FLAGS, cpu_flags
from tests.ragspec.tiny import EOS, tiny_model

NEEDS_BF16 = pytest.mark.skipif(not cpu_flags() & BF16_FLAGS, reason="this CPU has no native bf16 (AMX, AVX512-BF16)")


@dataclass
class Blob:
    nbytes: int


def test_shared_prefix_against_a_naive_scan() -> None:
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.randrange(3) for _ in range(rng.randrange(12))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(5))]
        naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert shared_prefix(a, b) == shared_prefix(b, a) == naive


def test_best_entry_is_the_longest_shared_prefix() -> None:
    cache = PrefixCache(max_bytes=100)
    cache.add([1, 2, 3, 4], Blob(10))
    cache.add([1, 2, 9, 9, 9], Blob(10))
    entry, shared = cache.best([1, 2, 3, 7], limit=3)
    assert (entry.tokens, shared) == ([1, 2, 3, 4], 3)
    assert cache.prefixes() == [[1, 2, 9, 9, 9], [1, 2, 3, 4]]  # now the most recently used
    entry, shared = cache.best([1, 2, 9, 9, 9, 5, 6], limit=6)
    assert (entry.tokens, shared) == ([1, 2, 9, 9, 9], 5)
    assert cache.best([5, 6], limit=1) is None
    entry, shared = cache.best([1, 2, 3, 4], limit=3)  # the same prompt again: the last token is recomputed
    assert (entry.tokens, shared) == ([1, 2, 3, 4], 3)
    assert len(cache) == 2  # looking up takes nothing out


def test_memory_bound_evicts_least_recently_used_and_redundant_entries() -> None:
    cache = PrefixCache(max_bytes=25)
    cache.add([1, 1], Blob(10))
    cache.add([2, 2], Blob(10))
    cache.add([1, 1, 5], Blob(10))  # makes [1, 1] redundant
    cache.add([3, 3], Blob(10))  # 30 bytes > 25: the least recently used ([2, 2]) goes
    assert cache.prefixes() == [[1, 1, 5], [3, 3]] and cache.nbytes == 20
    cache.add([3, 3, 4], Blob(10))  # makes [3, 3] redundant
    assert cache.prefixes() == [[1, 1, 5], [3, 3, 4]]
    cache.add([7], Blob(26))  # larger than the whole bound: not kept
    assert cache.prefixes() == [[1, 1, 5], [3, 3, 4]]
    few = PrefixCache(max_bytes=100, max_entries=2)
    for t in range(4):
        few.add([t], Blob(1))
    assert few.prefixes() == [[2], [3]]
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_bounds_are_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(max_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_entries"):
        PrefixCache(max_entries=0)


@torch.inference_mode()
@pytest.mark.parametrize("length,shared", [(2, 1), (17, 5), (33, 16), (90, 31), (90, 89), (130, 64)])
def test_loaded_prefix_gives_the_logits_of_a_cold_prefill(length: int, shared: int) -> None:
    lm = tiny_model(300, 3, layers=3)
    backend = TorchBackend(lm)
    rng = random.Random(length)
    prompt = [rng.randrange(EOS) for _ in range(length)]
    other = prompt[:shared] + [rng.randrange(EOS) for _ in range(7)]  # an earlier prompt sharing `shared` ids
    cold = backend.forward(prompt, backend.new_cache(length)).clone()
    earlier = backend.new_cache(len(other))
    backend.forward(other, earlier)
    saved = backend.save(earlier)
    for _ in range(2):  # the entry stays valid after a copy
        cache = backend.load(saved, shared, length + 3)
        assert cache is not None and cache.get_seq_length() == shared
        warm = backend.forward(prompt[shared:], cache)
        torch.testing.assert_close(warm, cold[shared:], rtol=1e-5, atol=1e-5)
        assert torch.equal(warm.argmax(-1), cold[shared:].argmax(-1))


def test_copy_prefix_is_bit_for_bit_and_counts_bytes() -> None:
    lm = tiny_model(300, 1)
    backend = TorchBackend(lm)
    source = backend.new_cache(40)
    backend.forward(list(range(30)), source)
    target = backend.new_cache(50)
    assert copy_prefix(source, 13, target) and target.get_seq_length() == 13
    for s, t in zip(source.layers, target.layers):
        assert torch.equal(s.keys[..., :13, :], t.keys) and torch.equal(s.values[..., :13, :], t.values)
    layer = source.layers[0]
    assert isinstance(layer, BufferLayer)
    assert cache_nbytes(source) == len(source.layers) * 2 * layer._keys.nbytes
    with pytest.raises(ValueError, match="holds 30 positions"):
        copy_prefix(source, 31, backend.new_cache(50))


def _prompts(seed: int) -> tuple[list[int], list[list[int]]]:
    rng = random.Random(seed)
    system = [rng.randrange(EOS) for _ in range(rng.choice([1, 9, 40]))]
    passages = [[rng.randrange(EOS) for _ in range(rng.choice([5, 17, 23]))] for _ in range(3)]
    return system, passages


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(4))
def test_interleaved_questions_and_turns_hit_and_equal_cold_prefill(seed: int) -> None:
    """Two conversations interleaved: each turn extends its own previous prompt, which a one-entry cache
    (the previous request only) would have lost; every answer equals a cold generator's and brute force."""
    lm = tiny_model(300, seed)
    system, (p1, p2, p3) = _prompts(seed)
    a1, b1 = system + p1 + [1, 2], system + p2 + [3]
    a2, b2 = a1 + [40, 41] + p3 + [5], b1 + [42] + [6, 7]
    warm = SpeculativeGenerator(lm, policy=FixedPolicy(k=4))
    cold = SpeculativeGenerator(lm, policy=FixedPolicy(k=4), prefix_cache=False)
    hits = []
    for prompt in (a1, b1, a2, b2, a2):
        got = warm.generate(prompt, max_new_tokens=12)
        hits.append(got.stats.cached_prompt_tokens)
        assert got.token_ids == cold.generate(prompt, max_new_tokens=12).token_ids
        assert_same_or_tie(lm, prompt, brute_greedy(lm, prompt, 12), got.token_ids)
    assert hits == [0, len(system), len(a1), len(b1), len(a2) - 1]
    assert warm.prefixes.prefixes() == [b2, a2]  # a1 and b1 went when the turns that extend them were kept


@pytest.mark.timeout(60)
def test_sampled_answer_after_a_hit_equals_the_cold_one_with_the_same_seed() -> None:
    lm = tiny_model(300, 4)
    system, (p1, p2, _) = _prompts(4)
    warm = SpeculativeGenerator(lm)
    warm.generate(system + p1, max_new_tokens=4)
    prompt = system + p2
    # Plain sampling: with drafts the random draws depend on what the drafter saw before (same distribution).
    hit = warm.generate(prompt, max_new_tokens=16, temperature=0.9, seed=11, speculation=False)
    assert hit.stats.cached_prompt_tokens == len(system)
    cold = SpeculativeGenerator(lm, prefix_cache=False).generate(
        prompt, max_new_tokens=16, temperature=0.9, seed=11, speculation=False
    )
    assert hit.token_ids == cold.token_ids


@pytest.mark.timeout(60)
def test_the_memory_bound_holds_across_requests() -> None:
    lm = tiny_model(300, 5)
    rng = random.Random(5)
    probe = SpeculativeGenerator(lm)
    probe.generate([rng.randrange(EOS) for _ in range(50)], max_new_tokens=4)
    one = probe.prefixes.nbytes  # one stored request of this size
    assert one > 0
    gen = SpeculativeGenerator(lm, prefix_cache_bytes=int(2.5 * one))
    for _ in range(6):
        gen.generate([rng.randrange(EOS) for _ in range(50)], max_new_tokens=4)
        assert gen.prefixes.nbytes <= int(2.5 * one)
    assert len(gen.prefixes) == 2
    gen.clear_cache()
    assert len(gen.prefixes) == 0


def test_an_entry_is_found_only_in_its_own_scope() -> None:
    cache = PrefixCache(max_bytes=100)
    cache.add([1, 2, 3, 4], Blob(10), "alice")
    assert cache.best([1, 2, 3, 9], limit=3, scope="bob") is None
    assert cache.best([1, 2, 3, 9], limit=3) is None  # the shared scope is a scope like any other
    entry, shared = cache.best([1, 2, 3, 9], limit=3, scope="alice")
    assert (entry.tokens, entry.scope, shared) == ([1, 2, 3, 4], "alice", 3)
    cache.add([1, 2, 3, 4, 5], Blob(10), "bob")  # makes alice's entry redundant only for bob: alice keeps hers
    assert sorted(cache.prefixes()) == [[1, 2, 3, 4], [1, 2, 3, 4, 5]]
    cache.add([1, 2, 3, 4, 5, 6], Blob(10), "alice")
    assert sorted(cache.prefixes()) == [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]]
    assert cache.best([1, 2, 3, 4, 5, 7], limit=5, scope="bob")[0].scope == "bob"


@pytest.mark.timeout(60)
def test_a_prompt_reuses_the_prefixes_of_its_own_scope_only() -> None:
    """The third probe's finding: one user's cached prompt counted (and sped up) another user's guess."""
    from ragspec.engine.tenancy import cache_scope

    lm = tiny_model(300, 6)
    system, (p1, p2, _) = _prompts(6)
    gen = SpeculativeGenerator(lm)
    cold = SpeculativeGenerator(lm, prefix_cache=False)
    with cache_scope("alice"):
        gen.generate(system + p1, max_new_tokens=4)
    with cache_scope("bob"):
        guess = gen.generate(system + p1, max_new_tokens=4)
    assert guess.stats.cached_prompt_tokens == 0
    assert gen.generate(system + p1, max_new_tokens=4).stats.cached_prompt_tokens == 0  # outside any scope: SHARED
    with cache_scope("alice"):
        follow_up = gen.generate(system + p2, max_new_tokens=4)
    assert follow_up.stats.cached_prompt_tokens == len(system)
    assert follow_up.token_ids == cold.generate(system + p2, max_new_tokens=4).token_ids
    with cache_scope("bob"):
        assert gen.generate(system + p1 + [7], max_new_tokens=4).stats.cached_prompt_tokens == len(system + p1)


def test_the_public_entry_is_every_scopes_and_never_redundant() -> None:
    cache = PrefixCache(max_bytes=100, public=[1, 2])
    assert not cache.lacks_public([1, 3]) and cache.lacks_public([1, 2, 5])
    cache.add_public(Blob(10), 2)
    assert not cache.lacks_public([1, 2, 5])
    cache.add([1, 2, 5, 6], Blob(10))  # extends the public entry without removing it
    entry, shared = cache.best([1, 2, 7], limit=3, scope="bob")
    assert (entry.tokens, entry.public, shared) == ([1, 2], True, 2)
    assert cache.best([1, 2, 5, 6], limit=4, scope="bob")[1] == 2  # another scope's longer entry stays its own
    assert cache.best([1, 2, 5, 6], limit=4)[1] == 4


@pytest.mark.timeout(120)
def test_the_question_answering_template_is_computed_once_for_every_scope() -> None:
    """The fixed part of the QA prompt (``qa_prefix_ids``) is reused by another scope's first question, and only
    that part; the answer equals a cold prefill's."""
    from ragspec.engine.tenancy import cache_scope
    from ragspec.prompts import qa_prefix_ids, qa_prompt_ids

    lm = tiny_model(300, 7, context=1024)
    public = qa_prefix_ids(lm.tokenizer)
    first, second = (qa_prompt_ids(lm.tokenizer, q, ["The oven runs at 260 degrees.", "Vans leave at 6:15."])
                     for q in ("How hot is the oven?", "When do vans leave?"))  # fmt: skip
    assert first[: len(public)] == second[: len(public)] == public
    gen = SpeculativeGenerator(lm, public_prefix=public)
    cold = SpeculativeGenerator(lm, prefix_cache=False)
    with cache_scope("alice"):
        assert gen.generate(first, max_new_tokens=4).stats.cached_prompt_tokens == 0
    for scope, prompt in (("bob", second), ("carol", first)):
        with cache_scope(scope):
            got = gen.generate(prompt, max_new_tokens=8)
        assert got.stats.cached_prompt_tokens == len(public)  # carol's equals alice's prompt: still the public part only
        assert got.token_ids == cold.generate(prompt, max_new_tokens=8).token_ids
        assert_same_or_tie(lm, prompt, brute_greedy(lm, prompt, 8), got.token_ids)


@pytest.mark.timeout(60)
def test_earlier_answers_are_drafted_from_within_their_scope_only() -> None:
    """The n-gram drafter copies from earlier answers: another user's answer must not be drafted (its
    acceptance would show in ``by_source`` and in the time taken)."""
    from ragspec.engine.tenancy import cache_scope

    lm = tiny_model(300, 7)
    prompt = [random.Random(7).randrange(EOS) for _ in range(30)]
    gen = SpeculativeGenerator(lm, policy=FixedPolicy(k=4), prefix_cache=False)
    with cache_scope("alice"):
        first = gen.generate(prompt, max_new_tokens=24)
        again = gen.generate(prompt, max_new_tokens=24)
    assert again.token_ids == first.token_ids and again.stats.by_source["history"].accepted > 0  # reuse within a scope
    with cache_scope("bob"):
        other = gen.generate(prompt, max_new_tokens=24)
    assert other.token_ids == first.token_ids and "history" not in other.stats.by_source


def assert_hit_is_a_cold_prefill(backend: TorchBackend, prompt: list[int], hits: Sequence[int]) -> None:
    """For each shared length in ``hits``: an earlier prompt sharing that many ids is prefilled and kept, and
    the prompt's prefill after loading it gives a cold prefill's last logits and keys and values, bit for bit;
    the loaded cache holds the shared positions in whole prompt chunks."""
    chunk = backend.target.prompt_chunk
    cold_cache = backend.new_cache(len(prompt))
    cold = backend.forward(prompt, cold_cache, last_only=True).clone()
    rng = random.Random(len(prompt))
    for shared in hits:
        earlier = backend.new_cache(len(prompt) + 8)
        backend.forward(prompt[:shared] + [rng.randrange(EOS) for _ in range(8)], earlier, last_only=True)
        cache = backend.load(backend.save(earlier), shared, len(prompt))
        assert cache is not None and cache.get_seq_length() == shared - shared % chunk
        warm = backend.forward(prompt[cache.get_seq_length() :], cache, last_only=True)
        assert torch.equal(warm, cold), f"hit of {shared}: logits up to {float((warm - cold).abs().max()):.3g} apart"
        for hit_layer, cold_layer in zip(cache.layers, cold_cache.layers):
            assert torch.equal(hit_layer.keys, cold_layer.keys) and torch.equal(hit_layer.values, cold_layer.values)


@torch.inference_mode()
@pytest.mark.parametrize("chunk", [5, 17, 64])
@pytest.mark.parametrize("prompt_dtype", [None, pytest.param(torch.bfloat16, marks=NEEDS_BF16)])
def test_a_hit_gives_a_cold_prefills_logits_and_cache_bit_for_bit(chunk: int, prompt_dtype: torch.dtype | None) -> None:
    """Attention in query blocks aligned to positions: a hit resumes where a cold prefill's block begins (fp32, and
    bf16 prompts over fp32 steps where the CPU computes bf16)."""
    lm = replace(tiny_model(300, 6, context=512, layers=3, prompt_chunk=chunk), prompt_dtype=prompt_dtype)
    backend = TorchBackend(lm)
    prompt = [random.Random(chunk).randrange(EOS) for _ in range(301)]
    assert_hit_is_a_cold_prefill(backend, prompt, [1, 9, chunk, chunk + 1, 150, 300])


@torch.inference_mode()
@pytest.mark.parametrize("chunk", [16, 32])
@pytest.mark.parametrize("prompt_dtype", [None, pytest.param(torch.bfloat16, marks=NEEDS_BF16)])
def test_a_hit_leaving_fewer_rows_than_prompt_min_rows_gives_a_cold_prefill_bit_for_bit(
    chunk: int, prompt_dtype: torch.dtype | None
) -> None:
    """Prompts just above a multiple of the chunk: the hit computes 1 to ``prompt_min_rows() + 1`` rows, whose
    products are padded to ``prompt_min_rows`` rows, the cold prefill all of them."""
    lm = replace(tiny_model(300, 8, context=512, layers=2, prompt_chunk=chunk), prompt_dtype=prompt_dtype)
    backend = TorchBackend(lm)
    rng = random.Random(chunk)
    for rest in sorted({1, 2, 3, 5, 7, 11, prompt_min_rows() - 1, prompt_min_rows(), prompt_min_rows() + 1}):
        prompt = [rng.randrange(EOS) for _ in range(3 * chunk + rest)]
        assert_hit_is_a_cold_prefill(backend, prompt, [len(prompt) - 1])


@pytest.mark.timeout(120)
def test_a_prompt_is_evaluated_in_blocks_ending_at_multiples_of_the_chunk() -> None:
    """The lean forward evaluates a prompt in one forward (its attention in blocks: tests/ragspec/backends/pytorch/
    test_forward.py); a forward that cannot split its attention (transformers') runs one forward per block."""
    lm = tiny_model(300, 7, prompt_chunk=16)
    backend = TorchBackend(lm)
    rows: list[tuple[int, int]] = []
    lean = backend._forward
    assert isinstance(lean, LlamaForward)
    prompt = lean.prompt

    def recording_prompt(ids: list[int], cache: object, block: int = 256, cancel: object = None) -> torch.Tensor:
        rows.append((cache.get_seq_length(), len(ids)))  # type: ignore[attr-defined]
        return prompt(ids, cache, block, cancel)  # type: ignore[arg-type]

    lean.prompt = recording_prompt  # type: ignore[method-assign]
    cache = backend.new_cache(80)
    backend.forward(list(range(5)), cache, last_only=True)
    backend.forward(list(range(40)), cache, last_only=True)
    assert rows == [(0, 5), (5, 40)]
    rows.clear()

    class RecordingHF(HFForward):
        def __call__(self, ids: list[int], cache: DynamicCache, last_only: bool = False) -> torch.Tensor:
            rows.append((cache.get_seq_length(), len(ids)))
            return super().__call__(ids, cache, last_only)

    hf = RecordingHF(lm.model, lm.device)
    backend._forward = hf
    cache = hf.new_cache(80)
    backend.forward(list(range(5)), cache, last_only=True)
    backend.forward(list(range(40)), cache, last_only=True)
    backend.forward([1, 2, 3], cache)  # a verify pass: one forward, wherever it starts
    assert rows == [(0, 5), (5, 11), (16, 16), (32, 13), (45, 3)]
    with pytest.raises(ValueError, match="prompt_chunk"):
        tiny_model(prompt_chunk=0)
