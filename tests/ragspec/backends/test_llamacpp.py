"""The llama.cpp back end: rollback, prefix reuse, exactness against llama.cpp's own greedy, sampling.

Unit tests run a tiny random Llama written to a GGUF file here (``ragspec.backends.gguf_export``);
the integration tests run the default model's GGUF file against llama-cpp-python's ``Llama``.
"""

from __future__ import annotations

import logging
import random
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from tokenizers import pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM

from ragspec.backends import choose_backend, make_backend
from ragspec.backends import llamacpp as llamacpp_module
from ragspec.backends.llamacpp import LlamaCppModel, LlamaCppSettings, load_llamacpp
from ragspec.engine.config import GenerationConfig
from ragspec.engine.drafting import Draft, DraftSource
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.decoding.loop import verify
from ragspec.backends import load_model
from ragspec.engine.results import ModelLoadError
from retrievers.cache import CACHE_ENV
from retrievers.extras import MissingExtraError
from ragspec.engine.policy import FixedPolicy
from ragspec.engine.sampling import GreedyAcceptor

from tests.ragspec.decoding.test_generator import NoisyOracle
from tests.ragspec.engine.test_penalties import CONFIGS as PENALTIES, reference_penalties
from tests.ragspec.engine.test_sampling import (
    ALPHA, PROMPT, RUNS, FixedDrafter, RandomModelDrafter, chi_square_pvalue, output_distribution,
)  # fmt: skip

needs_llamacpp = pytest.mark.skipif(not llamacpp_module.available(), reason="llama-cpp-python is not installed")

TIE = 1e-4
THREADED_GAP = 2.0
"""Top-2 gap under which speculative greedy may leave plain greedy with f16 keys and values on several
threads: a one-token step's split attention moves each logit by up to ~1 against a verify batch's
(measured on the default model from 256 cached positions), so two logits' order can flip where they are
up to twice that apart. Not the default (``LlamaCppSettings.split_steps``)."""
EOS = 256
VOCAB = [*sorted(pre_tokenizers.ByteLevel.alphabet()), "<|endoftext|>", "Ġt"]  # bytes, EOS, one merge


# -- a tiny GGUF written here ------------------------------------------------------------------
def tiny_llama(seed: int, context: int = 2048, layers: int = 2) -> LlamaForCausalLM:
    """A random Llama with large weights (logits far apart: no argmax ties) over ``VOCAB``."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, initializer_range=0.3,
        eos_token_id=EOS, bos_token_id=None, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private cache directory, so the tiny files' tokenizers do not land in the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("ragspec-cache")
        mp.setenv(CACHE_ENV, str(path))
        yield path


def write_tiny(directory: Path, seed: int, quantized: bool = True, **kwargs: object) -> tuple[Path, LlamaForCausalLM]:
    """The tiny model as a GGUF file: Q4_1 like the default model, or F32 (``quantized=False``).

    Exactness tests use Q4_1: llama.cpp multiplies quantized weights row by row whatever the batch,
    while F32 weights go through a blocked GEMM for batches (rounding ~1e-4 apart, ties only).
    """
    from ragspec.backends.gguf_export import quantize, write_llama_gguf

    model = tiny_llama(seed, **kwargs)  # type: ignore[arg-type]
    path = write_llama_gguf(model, directory / f"tiny-{seed}-f32.gguf", byte_vocab=VOCAB, merges=["Ġ t"],
                            eos_token_id=EOS, f16=False)
    if quantized:
        path = quantize(path, directory / f"tiny-{seed}-q4_1.gguf", "Q4_1")
    return path, model


@pytest.fixture(scope="module")
def tiny(tiny_cache: Path) -> tuple[LlamaCppModel, LlamaForCausalLM]:
    if not llamacpp_module.available():
        pytest.skip("llama-cpp-python is not installed")
    path, model = write_tiny(tiny_cache, seed=3)
    return load_llamacpp(path), model


@pytest.fixture(scope="module")
def tiny_f32(tiny_cache: Path) -> tuple[LlamaCppModel, LlamaForCausalLM]:
    if not llamacpp_module.available():
        pytest.skip("llama-cpp-python is not installed")
    path, model = write_tiny(tiny_cache, seed=4, quantized=False)
    return load_llamacpp(path), model


def plain_greedy(lm: LlamaCppModel, prompt: Sequence[int], n: int) -> list[int]:
    """llama.cpp greedy decoding one token per forward, in a context of its own."""
    backend = make_backend(lm)
    cache = backend.new_cache(len(prompt) + n)
    token = int(backend.forward(list(prompt), cache, last_only=True)[0].argmax())
    out: list[int] = []
    while token != EOS and len(out) < n:
        out.append(token)
        token = int(backend.forward([token], cache)[0].argmax())
    return out


# -- unit tests on the tiny GGUF ---------------------------------------------------------------
@needs_llamacpp
@pytest.mark.timeout(120)
def test_export_and_forward_match_transformers(tiny_f32: tuple[LlamaCppModel, LlamaForCausalLM]) -> None:
    lm, model = tiny_f32
    assert len(lm.tokenizer) == lm.n_vocab == len(VOCAB) and lm.eos_token_ids == {EOS}
    ids = [random.Random(0).randrange(EOS) for _ in range(40)]
    backend = make_backend(lm)
    got = backend.forward(ids, backend.new_cache(64))
    with torch.inference_mode():
        want = model(torch.tensor([ids])).logits[0]
    assert got.shape == want.shape == (40, len(VOCAB))
    # F32 weights, F16 keys and values: close, and the same argmax (the tiny model has no near-ties).
    torch.testing.assert_close(got, want, rtol=0, atol=0.05)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()


@needs_llamacpp
@pytest.mark.timeout(120)
@pytest.mark.parametrize("split", [1, 5, 40, 63, 64, 100])
def test_logits_do_not_depend_on_how_positions_are_batched(tiny: tuple[LlamaCppModel, LlamaForCausalLM], split: int) -> None:
    """A prompt evaluated in two parts (a reused prefix) gives the logits of one evaluation, bit for
    bit, and a verify batch gives those of one-token steps on two threads beyond 512 positions: what
    makes speculation bit-exact at the default settings (bf16 values: no split attention, LlamaCppSettings)."""
    lm = load_llamacpp(tiny[0].path, settings=LlamaCppSettings(n_threads=2, n_threads_batch=2))
    rng = random.Random(split)
    prompt = [rng.randrange(EOS) for _ in range(560)]
    backend = make_backend(lm)
    cache = backend.new_cache(1024)
    whole = backend.forward(prompt, cache, last_only=True).clone()
    steps = torch.stack([backend.forward([t], cache)[0].clone() for t in prompt[:20]])
    cache = backend.new_cache(1024)
    backend.forward(prompt[: len(prompt) - split], cache, last_only=True)
    assert torch.equal(backend.forward(prompt[len(prompt) - split :], cache, last_only=True), whole)
    assert cache.get_seq_length() == len(prompt)
    assert torch.equal(backend.forward(prompt[:20], cache), steps)


@needs_llamacpp
@pytest.mark.timeout(120)
def test_f16_values_on_several_threads_split_a_steps_attention(tiny: tuple[LlamaCppModel, LlamaForCausalLM]) -> None:
    """Why values are bf16 by default: with f16 keys and values, two threads make a one-token step's
    attention differ from a verify batch's beyond ~256 cached positions, and equal below."""
    prompt = [random.Random(7).randrange(EOS) for _ in range(310)]
    apart = {}
    for type_v in ("f16", "bf16"):
        backend = make_backend(load_llamacpp(tiny[0].path, settings=LlamaCppSettings(n_threads=2, type_v=type_v)))
        for cut in (200, 300):
            cache = backend.new_cache(512)
            backend.forward(prompt[:cut], cache, last_only=True)
            steps = torch.cat([backend.forward([t], cache).clone() for t in prompt[cut : cut + 8]])
            cache.crop(-8)
            apart[type_v, cut] = float((backend.forward(prompt[cut : cut + 8], cache) - steps).abs().max())
    assert apart["f16", 200] == apart["bf16", 200] == apart["bf16", 300] == 0.0
    assert apart["f16", 300] > 1e-3


@needs_llamacpp
@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", [None, 300])  # None: grown from 1024 positions; 300: fixed
def test_rollback_leaves_cache_equal_to_plain_decoding(tiny: tuple[LlamaCppModel, LlamaForCausalLM], context: int | None) -> None:
    # Two threads: rollback is checked bit for bit at the default cache types (no split attention).
    lm_sized = load_llamacpp(tiny[0].path, settings=LlamaCppSettings(n_ctx=context, n_threads=2))
    gen = SpeculativeGenerator(lm_sized, policy=FixedPolicy(k=4))
    prompt = [random.Random(1).randrange(EOS) for _ in range(250 if context else 1020)]
    truth = plain_greedy(lm_sized, prompt, 12)
    cache = gen.backend.new_cache(len(prompt) + 20)
    gen.backend.forward(prompt, cache, last_only=True)
    wrong = (truth[1], truth[2], (truth[3] + 1) % EOS, 42, 43)  # two right, then wrong
    new, n = verify(gen.backend, cache, truth[0], Draft(wrong, DraftSource.ORACLE), GreedyAcceptor())
    assert (new, n) == ([truth[1], truth[2], truth[3]], 2)
    assert cache.get_seq_length() == len(prompt) + 3
    if context is None:
        assert gen.backend.n_ctx > 1024  # the context grew, its cached positions copied over
    # After the rollback the next positions decode exactly as plain decoding does.
    fresh = make_backend(lm_sized)
    reference = fresh.new_cache(len(prompt) + 20)
    fresh.forward(prompt, reference, last_only=True)
    for t in truth[:3]:
        fresh.forward([t], reference)
    assert torch.equal(gen.backend.forward(truth[3:8], cache), fresh.forward(truth[3:8], reference))
    with pytest.raises(ValueError, match="negative"):
        cache.crop(1)
    gen.backend.new_cache(16)
    with pytest.raises(RuntimeError, match="replaced by a newer one"):
        gen.backend.forward([1], cache)


@needs_llamacpp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", range(4))
def test_speculative_greedy_equals_plain_greedy(tiny_cache: Path, seed: int) -> None:
    path, _ = write_tiny(tiny_cache, seed=10 + seed, layers=3)
    lm = load_llamacpp(path)
    rng = random.Random(seed)
    prompt = [rng.randrange(EOS) for _ in range(rng.choice([3, 70, 300]))]
    expected = plain_greedy(lm, prompt, 80)
    oracle = NoisyOracle(expected, len(prompt), seed, len(VOCAB))
    gen = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=16), max_draft=16)
    assert gen.generate(prompt, max_new_tokens=80).token_ids == expected
    assert gen.generate(prompt, max_new_tokens=80, speculation=False).token_ids == expected
    assert any(0 < n < 16 for n in oracle.accepted) and max(oracle.accepted) >= 3  # rollbacks happened


@needs_llamacpp
@pytest.mark.timeout(120)
def test_prefix_is_reused_across_requests(tiny: tuple[LlamaCppModel, LlamaForCausalLM]) -> None:
    lm, _ = tiny
    rng = random.Random(7)
    system = [rng.randrange(EOS) for _ in range(200)]
    first, second = system + [5, 6, 7], system + [8, 9, 10, 11]
    gen = SpeculativeGenerator(lm, policy=FixedPolicy(k=4))
    gen.generate(first, max_new_tokens=10)
    reused = gen.generate(second, max_new_tokens=20)
    assert reused.stats.cached_prompt_tokens == len(system)
    gen.clear_cache()
    cold = gen.generate(second, max_new_tokens=20)
    assert cold.stats.cached_prompt_tokens == 0
    assert reused.token_ids == cold.token_ids == plain_greedy(lm, second, 20)


@needs_llamacpp
@pytest.mark.timeout(120)
def test_calibrating_between_requests_does_not_break_prefix_reuse(
    tiny: tuple[LlamaCppModel, LlamaForCausalLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A llama.cpp context holds one cache: timing verify forwards replaces the one kept for reuse."""
    from ragspec.decoding import calibration

    lm, _ = tiny
    rng = random.Random(8)
    system = [rng.randrange(EOS) for _ in range(100)]
    gen = SpeculativeGenerator(lm)
    gen.generate(system + [5, 6, 7], max_new_tokens=5)
    monkeypatch.setattr(calibration, "load", lambda key, folder: None)  # time them now, not from the disk cache
    gen.calibrate(context=64)
    second = system + [8, 9, 10, 11]
    assert gen.generate(second, max_new_tokens=20).token_ids == plain_greedy(lm, second, 20)


@needs_llamacpp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("system_len", [70, 200])
def test_several_prompts_are_kept_and_each_hit_equals_plain_greedy(
    tiny: tuple[LlamaCppModel, LlamaForCausalLM], system_len: int
) -> None:
    """Two conversations interleaved: each turn extends its own earlier prompt, whose state the context
    no longer holds (copied back from the prefix cache), or still holds (cropped only). One thread: bit for bit."""
    lm = load_llamacpp(tiny[0].path, settings=LlamaCppSettings(n_threads=2))
    rng = random.Random(system_len)
    system = [rng.randrange(EOS) for _ in range(system_len)]
    a1, b1 = system + [rng.randrange(EOS) for _ in range(17)], system + [rng.randrange(EOS) for _ in range(5)]
    a2 = a1 + [rng.randrange(EOS) for _ in range(66)]
    b2 = b1 + [rng.randrange(EOS) for _ in range(3)]
    gen = SpeculativeGenerator(lm, policy=FixedPolicy(k=4))
    hits = []
    for prompt in (a1, b1, a2, b2, b2, a1):
        got = gen.generate(prompt, max_new_tokens=12)
        hits.append(got.stats.cached_prompt_tokens)
        assert got.token_ids == plain_greedy(lm, prompt, 12)
    # a1 again: a2's entry holds it all, but the last prompt token is always computed again
    assert hits == [0, system_len, len(a1), len(b1), len(b2) - 1, len(a1) - 1]
    assert gen.prefixes.prefixes() == [b2, a2, a1] and gen.prefixes.nbytes > 0
    gen.generate(a1[:40], max_new_tokens=3)  # under 64 tokens: evaluated otherwise than longer prompts, not kept
    assert gen.prefixes.prefixes() == [b2, a2, a1]


@needs_llamacpp
@pytest.mark.timeout(120)
@pytest.mark.parametrize("length,shared", [(70, 1), (70, 69), (200, 63), (300, 137)])
def test_loaded_state_gives_the_logits_of_a_cold_prefill(
    tiny: tuple[LlamaCppModel, LlamaForCausalLM], length: int, shared: int
) -> None:
    lm, _ = tiny
    backend = make_backend(lm)
    rng = random.Random(length + shared)
    prompt = [rng.randrange(EOS) for _ in range(length)]
    cold = backend.forward(prompt, backend.new_cache(length + 8), last_only=True).clone()
    earlier = backend.new_cache(shared + 80)
    backend.forward(prompt[:shared] + [rng.randrange(EOS) for _ in range(70)], earlier, last_only=True)
    saved = backend.save(earlier)
    for _ in range(2):  # the context's own cache, then the copy (the context changed since)
        cache = backend.load(saved, shared, length + 8)
        assert cache.get_seq_length() == shared
        assert torch.equal(backend.forward(prompt[shared:], cache, last_only=True), cold)


@needs_llamacpp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", PENALTIES[:5])
def test_speculative_greedy_with_penalties_equals_plain_penalised_greedy(
    tiny: tuple[LlamaCppModel, LlamaForCausalLM], config: GenerationConfig
) -> None:
    lm, _ = tiny
    rng = random.Random(11)
    motif = [rng.randrange(EOS) for _ in range(4)]
    prompt = [rng.choice(motif) for _ in range(30)]
    backend = make_backend(lm)
    cache = backend.new_cache(len(prompt) + 40)
    logits = backend.forward(prompt, cache, last_only=True)[0]
    expected: list[int] = []  # plain llama.cpp greedy, one token per forward, penalised the slow way
    while len(expected) < 40 and (token := int(reference_penalties(logits, expected, config).argmax())) != EOS:
        expected.append(token)
        logits = backend.forward([token], cache)[0]
    oracle = NoisyOracle(expected, len(prompt), 5, len(VOCAB))
    spec = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=6)).generate(prompt, config, max_new_tokens=40)
    assert spec.token_ids == expected
    assert any(0 < n < 6 for n in oracle.accepted), "drafts were partly rejected: rows saw different histories"


# -- sampling keeps its distribution (the chi-square test of test_sampling, on llama.cpp) ------
def exact_distribution(lm: LlamaCppModel, params: GenerationConfig, n: int) -> dict[tuple[int, ...], float]:
    """Probability of every output of at most ``n`` tokens under plain sampling, by enumeration."""
    backend = make_backend(lm)
    return output_distribution(lambda seq: backend.forward(PROMPT + list(seq), backend.new_cache(16), last_only=True), params, n)


@needs_llamacpp
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("kind", "params"), [
    ("plain", GenerationConfig(temperature=1.3, top_k=4)),
    ("ngram", GenerationConfig(temperature=1.3, top_k=4)),
    ("model", GenerationConfig(temperature=0.9, top_p=0.7)),
    ("ngram", GenerationConfig(temperature=1.3, top_k=4, presence_penalty=1.5, repeat_penalty=1.6, repeat_last_n=2)),
])
def test_speculative_sampling_matches_plain_sampling(tiny_cache: Path, kind: str, params: GenerationConfig) -> None:
    path, _ = write_tiny(tiny_cache, seed=9, layers=1)
    lm = load_llamacpp(path)
    n = 3  # the first token comes from the prefill, the next two from one verified 2-token draft
    expected = exact_distribution(lm, params, n)
    support = sorted({t for seq in expected for t in seq})
    drafter: object | None
    if kind == "plain":
        drafter = None
    elif kind == "ngram":
        drafter = FixedDrafter([support[0], support[-1]])  # plausible but often wrong
    else:
        q = torch.zeros(len(VOCAB))
        q[support] = torch.linspace(1.0, 3.0, len(support))
        q[200] = 1.0  # mass outside the target's support must always be rejected
        drafter = RandomModelDrafter(q / q.sum())
    gen = SpeculativeGenerator(lm, drafter=drafter, policy=FixedPolicy(k=n - 1, min_match=0))
    counts: Counter = Counter()
    for seed in range(RUNS):
        config = params.merged(max_new_tokens=n, speculation=drafter is not None, seed=seed)
        counts[tuple(gen.generate(PROMPT, config).token_ids)] += 1
    pvalue = chi_square_pvalue(counts, expected, RUNS)
    assert pvalue > ALPHA, f"{kind}: sampled distribution differs from llama.cpp's (p={pvalue:.2e})"


# -- choosing and loading: errors that name the fix ---------------------------------------------
def test_auto_falls_back_to_torch_and_explicit_llamacpp_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(llamacpp_module, "available", lambda: False)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # importing it now raises ImportError
    assert choose_backend("default", "auto", "cpu", "auto") == "torch"
    with pytest.raises(MissingExtraError, match=r"pip install 'ragspec\[llamacpp\]'"):
        choose_backend("default", "llamacpp")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(MissingExtraError, match=r"pip install 'ragspec\[llamacpp\]'"):
        load_llamacpp(gguf)


def test_backend_choice_rules() -> None:
    assert choose_backend("some/dir", "auto") == "torch"
    assert choose_backend("default", "torch") == "torch"
    assert choose_backend("default", "auto", "cpu", "float32") == "torch"  # a dtype asks for PyTorch weights
    with pytest.raises(ValueError, match="unknown backend"):
        choose_backend("default", "onnx")
    with pytest.raises(ModelLoadError, match="runs GGUF files"):
        choose_backend("HuggingFaceTB/SmolLM2-135M-Instruct", "llamacpp")
    with pytest.raises(ValueError, match="dtype='auto'"):
        choose_backend("default", "llamacpp", "cpu", "bfloat16")
    with pytest.raises(ValueError, match="runs on the CPU"):
        choose_backend("default", "llamacpp", "cuda", "auto")
    if llamacpp_module.available():
        assert choose_backend("model.GGUF", "llamacpp") == "llamacpp"
        # auto: the default model (135M parameters) is faster end to end on PyTorch.
        assert choose_backend("default", "auto", "cpu", "auto") == "torch"


@needs_llamacpp
def test_auto_runs_large_gguf_files_on_llamacpp(tiny: tuple[LlamaCppModel, LlamaForCausalLM],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import ragspec.backends as backends

    path = str(tiny[0].path)
    n = backends.gguf_parameters(path)
    assert n == sum(p.numel() for p in tiny[1].parameters())  # read from the file's header
    assert choose_backend(path, "auto", "cpu") == "torch"
    monkeypatch.setattr(backends, "AUTO_LLAMACPP_MIN_PARAMETERS", n)
    assert choose_backend(path, "auto", "cpu") == "llamacpp"
    assert choose_backend(path, "auto", "cpu", "float32") == "torch"
    assert backends.gguf_parameters(__file__) == 0


@needs_llamacpp
@pytest.mark.timeout(120)
def test_exactness_probe_flags_files_and_settings_that_break_it(
    tiny: tuple[LlamaCppModel, LlamaForCausalLM], tiny_f32: tuple[LlamaCppModel, LlamaForCausalLM],
    caplog: pytest.LogCaptureFixture,
) -> None:
    quantized, f32 = load_llamacpp(tiny[0].path), load_llamacpp(tiny_f32[0].path)  # not probed yet
    for lm in (quantized, f32):
        make_backend(lm)
    assert quantized.exact is True and quantized.settings.threads == llamacpp_module.physical_cores()
    # F32 weights: batches go through a blocked GEMM, one row through a dot product.
    assert f32.exact is False and "another kernel" in caplog.text
    unfused = load_llamacpp(tiny[0].path, settings=LlamaCppSettings(flash_attn=False))
    make_backend(unfused)
    assert unfused.exact is False and "flash_attn=False" in caplog.text
    split = load_llamacpp(tiny[0].path, settings=LlamaCppSettings(n_threads=2, type_v="f16"))
    make_backend(split)  # several threads over f16 keys and values: split attention, flagged
    assert split.exact is False and "threads for one-token steps with f16 keys and f16 values" in caplog.text
    assert LlamaCppSettings(n_threads=2).split_steps is False and LlamaCppSettings(n_threads=1, type_v="f16").split_steps is False


@needs_llamacpp
@pytest.mark.timeout(120)
def test_quantizations_are_written_once(tmp_path: Path, tiny_cache: Path) -> None:
    from ragspec.backends.gguf_export import cached_quantizations, write_llama_gguf

    writes: list[Path] = []

    def write(path: Path) -> None:
        writes.append(path)
        write_llama_gguf(tiny_llama(5), path, byte_vocab=VOCAB, merges=["Ġ t"], eos_token_id=EOS, f16=False)

    files = cached_quantizations(tmp_path, "tiny", ["Q4_0", "Q8_0"], write)
    assert [p.name for p in files.values()] == ["tiny.Q4_0.gguf", "tiny.Q8_0.gguf"] and len(writes) == 1
    assert load_llamacpp(files["Q4_0"]).quantization.startswith("Q4_0")
    assert not (tmp_path / "tiny.source.gguf").exists()  # not kept by default
    assert cached_quantizations(tmp_path, "tiny", ["Q8_0"], write) == {"Q8_0": files["Q8_0"]} and len(writes) == 1


@needs_llamacpp
@pytest.mark.timeout(120)
def test_a_file_whose_verify_runs_row_by_row_is_noted(
    tiny: tuple[LlamaCppModel, LlamaForCausalLM], tiny_f32: tuple[LlamaCppModel, LlamaForCausalLM],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=llamacpp_module.__name__):
        load_llamacpp(tiny_f32[0].path)
        assert "row by row" not in caplog.text
        load_llamacpp(tiny[0].path)  # Q4_1
    assert "is Q4_1, which llama.cpp multiplies row by row" in caplog.text


@pytest.mark.parametrize("bad", [dict(n_threads=0), dict(n_threads_batch=-1), dict(n_batch=64, n_ubatch=128),
                                 dict(flash_attn=None), dict(n_ctx=True), dict(type_k="fp8"), dict(type_v="F16"),
                                 dict(type_v="q8_0", flash_attn=False)])
def test_settings_are_validated_when_built(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LlamaCppSettings(**bad)  # type: ignore[arg-type]


@needs_llamacpp
@pytest.mark.timeout(60)
def test_files_llamacpp_cannot_use_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model(str(tmp_path / "absent.gguf"), backend="llamacpp")
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF file.*convert_hf_to_gguf"):
        load_model(str(text), backend="llamacpp")
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(ModelLoadError, match="llama.cpp could not load .*damaged.*backend='torch'"):
        load_model(str(damaged), backend="llamacpp")


def test_a_loaded_model_keeps_its_backend(lc_tiny_model: object) -> None:
    with pytest.raises(ValueError, match="loaded for 'torch'"):
        SpeculativeGenerator(lc_tiny_model, backend="llamacpp")  # type: ignore[arg-type]


# -- integration: the default model's GGUF against llama.cpp's own greedy ------------------------
@pytest.fixture(scope="module")
def default_lm() -> LlamaCppModel:
    if not llamacpp_module.available():
        pytest.skip("llama-cpp-python is not installed")
    lm = load_model("default", backend="llamacpp")
    assert isinstance(lm, LlamaCppModel)
    return lm


UNSEEN = [
    ("When did the ferry line start running at night?",
     ["The Harrow Point ferry began as a daytime service in 1962, carrying mail and a few cars across the sound.",
      "Night crossings were added in 1978, after the paper mill on the far shore started a second shift; the "
      "last boat now leaves the pier at 23:40.",
      "A new hybrid vessel, the Sound Runner, replaced the old diesel ferry in 2019."]),
    ("Why did the orchard switch to drip irrigation?",
     ["Kessler Orchard grows apples and pears on 40 hectares of sandy soil.",
      "After two dry summers cut the harvest by a third, the owners replaced the sprinklers with drip lines in "
      "2015, because drip irrigation puts water at the roots and loses far less of it to evaporation.",
      "The orchard sells most of its fruit at the regional market every Saturday."]),
    ("What does the library lend besides books?",
     ["The Eastfield public library opened its new building in 2021.",
      "Besides books, members can borrow tools, board games, sewing machines and a telescope, for up to two weeks.",
      "Opening hours are 9:00 to 19:00 on weekdays and 10:00 to 16:00 on Saturdays."]),
]
"""Unseen-style document questions written for these tests (not in the bundled set)."""


def rag_prompts(lm: LlamaCppModel, n: int, unseen: bool = False) -> list[tuple[str, list[str]]]:
    from ragspec.prompts import qa_messages

    from tests.ragspec.engine.test_default_model import document_prompts

    questions = document_prompts(n) + (UNSEEN if unseen else [])
    return [(lm.tokenizer.apply_chat_template(qa_messages(q, passages), tokenize=False, add_generation_prompt=True), passages)
            for q, passages in questions]


@needs_llamacpp
@pytest.mark.integration
def test_generation_stops_on_every_token_llamacpp_stops_on(default_lm: LlamaCppModel) -> None:
    """llama.cpp ends a generation on any end-of-generation token, not only the file's EOS."""
    names = {default_lm.tokenizer.convert_ids_to_tokens(t) for t in default_lm.eos_token_ids}
    assert {"<|im_end|>", "<|endoftext|>"} <= names


@needs_llamacpp
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_tokenizer_ids_equal_llamacpp_tokenization(default_lm: LlamaCppModel) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(str(default_lm.path), vocab_only=True, verbose=False)
    prompts = rag_prompts(default_lm, 39)
    for text, passages in prompts:
        for piece, special in [(text, True), *((p, False) for p in passages)]:
            ours = default_lm.tokenizer.encode(piece, add_special_tokens=special)
            assert llm.tokenize(piece.encode(), add_bos=special, special=special) == ours, piece[:60]


@needs_llamacpp
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_speculative_greedy_equals_llamacpp_greedy_on_document_questions(default_lm: LlamaCppModel) -> None:
    """At the default settings (one-token steps on every physical core, bf16 values), against llama.cpp's
    own greedy with the same settings: bit for bit (the gap rule only where settings split a step's attention)."""
    import llama_cpp

    s = default_lm.settings
    llm = llama_cpp.Llama(str(default_lm.path), n_ctx=2048, n_threads=s.threads, n_threads_batch=s.threads_batch,
                          n_batch=s.n_batch, n_ubatch=s.n_ubatch, flash_attn=s.flash_attn, verbose=False,
                          type_k=llamacpp_module.kv_type_id(s.type_k), type_v=llamacpp_module.kv_type_id(s.type_v))
    # Every match of 2+ tokens drafted and verified (the adaptive policy may find drafting not worth its
    # cost on this file, and then nothing would be verified): exactness under real verify batches.
    gen = SpeculativeGenerator(default_lm, policy=FixedPolicy(k=4, min_match=2))
    gap = THREADED_GAP if s.split_steps else TIE
    identical, accepted = 0, 0
    prompts = rag_prompts(default_lm, 4, unseen=True)
    for text, passages in prompts:
        ids = gen.encode(text, special_tokens=True)
        llm.reset()  # a fresh prompt evaluation: no prefix kept from the previous question
        reference = []
        for token in llm.generate(ids, temp=0.0):
            if token in default_lm.eos_token_ids or len(reference) == 48:
                break
            reference.append(token)
        spec = gen.generate(text, references=passages, max_new_tokens=48)
        plain = gen.generate(text, max_new_tokens=48, speculation=False)
        accepted += spec.stats.accepted_tokens
        assert plain.token_ids == reference, "ragspec's plain decoding on llama.cpp differs from llama.cpp's greedy"
        if spec.token_ids == reference:
            identical += 1
            continue
        # Only a near-tie of the target at the first divergence is tolerated (rounding of split attention).
        i = next((j for j, (a, b) in enumerate(zip(reference, spec.token_ids)) if a != b), len(spec.token_ids))
        backend = make_backend(default_lm)
        cache = backend.new_cache(len(ids) + i + 1)
        logits = backend.forward(ids, cache, last_only=True)
        for t in reference[:i]:
            logits = backend.forward([t], cache)
        top2 = logits[0].topk(2).values
        assert float(top2[0] - top2[1]) < gap, f"diverges from llama.cpp's greedy at token {i} without a near-tie"
    # With split attention most answers meet a near-tie within 48 tokens (4 of 9 identical on 2 cores);
    # what makes the test then is the gap check above at every divergence.
    wanted = len(prompts) // 4 if s.split_steps else len(prompts) - 1
    assert identical >= wanted, f"identical to llama.cpp's greedy: {identical}/{len(prompts)}"
    assert accepted > 0, "drafting never helped: the passages were not used as references"


@needs_llamacpp
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_default_model_runs_on_llamacpp_with_streaming_and_stop_strings(default_lm: LlamaCppModel) -> None:
    gen = SpeculativeGenerator("default", backend="llamacpp")
    assert gen.backend.name == "llamacpp" and isinstance(gen.target, LlamaCppModel) and gen.target.exact
    assert not hasattr(gen.target, "model")  # the 538 MB fp32 PyTorch weights were not loaded
    text, passages = rag_prompts(default_lm, 1)[0]
    with gen.stream(text, references=passages, max_new_tokens=40) as stream:
        deltas = list(stream)
    assert stream.result is not None and "".join(deltas) == stream.result.text and stream.result.stats.new_tokens > 0
    full = stream.result.text
    stop = full.split()[3] if len(full.split()) > 4 else full[:5]
    cut = gen.generate(text, references=passages, max_new_tokens=40, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full[: full.index(stop)]
