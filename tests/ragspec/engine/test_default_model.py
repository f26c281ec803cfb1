"""Exactness on the real default model (SmolLM2-135M-Instruct, fp32) over document questions."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ragspec.backends.pytorch import forward
from ragspec.backends.pytorch.forward import F_LINEAR, ONEDNN, LlamaForward, _product, _weights, prompt_min_rows, rows_independent
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.engine.results import PromptTooLongError
from ragspec.backends import load_model
from ragspec.prompts import qa_messages, qa_prefix_ids
from retrievers.embeddings import BF16_FLAGS, cpu_flags
from tests.ragspec.backends.pytorch.test_forward import split_kernels
from tests.ragspec.engine.test_prefix_cache import assert_hit_is_a_cold_prefill

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[3] / "retrievers" / "data"
TIE = 1e-4


def document_prompts(n: int) -> list[tuple[str, list[str]]]:
    """``n`` bundled questions, each with the paragraph holding its answer and two neighbours."""
    spec = json.loads((DATA / "questions.json").read_text())["questions"]
    prompts = []
    for q in spec[:n]:
        text = (DATA / "corpus" / q["source"]).read_text()
        paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40]
        hit = next((i for i, p in enumerate(paragraphs) if q["span"][:30] in p), 0)
        prompts.append((q["question"], paragraphs[max(0, hit - 1) : hit + 2]))
    return prompts


def chat_prompt(gen: SpeculativeGenerator, question: str, passages: list[str]) -> str:
    messages = qa_messages(question, passages)  # the pipeline's own numbered-passage prompt
    return gen.target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module")
def generator() -> SpeculativeGenerator:
    return SpeculativeGenerator("default", device="cpu", dtype="float32")


def check_speculative_equals_plain(gen: SpeculativeGenerator, logits_after: Callable[[str, list[int]], torch.Tensor]) -> None:
    """Speculative greedy is plain greedy on 12 document questions, drafting from their passages: one
    may diverge, and only at a tie of the target's own logits (``logits_after(prompt, plain output
    before the divergence)``: the ``[V]`` logits of the next token at the generator's settings)."""
    identical, accepted = 0, 0
    prompts = document_prompts(12)
    for question, passages in prompts:
        prompt = chat_prompt(gen, question, passages)
        plain = gen.generate(prompt, max_new_tokens=48, speculation=False)
        spec = gen.generate(prompt, references=passages, max_new_tokens=48)
        accepted += spec.stats.accepted_tokens
        if spec.token_ids == plain.token_ids:
            identical += 1
            continue
        i = next(j for j, (a, b) in enumerate(zip(plain.token_ids, spec.token_ids)) if a != b)
        with torch.inference_mode():
            top2 = logits_after(prompt, plain.token_ids[:i]).topk(2).values
        assert float(top2[0] - top2[1]) < TIE, f"{question!r} diverges at token {i} without a tie"
    assert identical >= len(prompts) - 1, f"outputs identical: {identical}/{len(prompts)}"
    assert accepted > 0, "drafting never helped: the passages were not used as references"


def test_speculative_greedy_is_token_identical_on_document_questions(generator: SpeculativeGenerator) -> None:
    def logits_after(prompt: str, output: list[int]) -> torch.Tensor:
        ids = generator.encode(prompt, special_tokens=True) + output
        return generator.target.model(torch.tensor([ids])).logits[0, -1]

    check_speculative_equals_plain(generator, logits_after)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch was built without oneDNN")
@pytest.mark.timeout(1800)
def test_verify_passes_in_another_kernel_than_steps_keep_speculative_equal_to_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where MKL's products are the faster for steps and oneDNN's for verify passes (2 cores of an Intel Xeon with
    AMX), a verify pass computes its rows with another kernel than a plain step's: the same products to float
    rounding, so speculative greedy still equals plain greedy (a divergence only at a tie)."""
    monkeypatch.setattr(forward, "_PICKED", {})
    monkeypatch.setattr(forward, "fastest_kernel", split_kernels)
    gen = SpeculativeGenerator("default", device="cpu", dtype="float32", prefix_cache=False)
    assert "F.linear products, oneDNN packed from 5 rows" in gen.backend.description

    def logits_after(prompt: str, output: list[int]) -> torch.Tensor:
        ids = gen.encode(prompt, special_tokens=True) + output
        return gen.target.model(torch.tensor([ids])).logits[0, -1]

    check_speculative_equals_plain(gen, logits_after)


@pytest.mark.skipif(not cpu_flags() & BF16_FLAGS,
                    reason="this CPU has no native bf16 (AMX, AVX512-BF16): dtype 'bf16-prompts' runs prompts in fp32 here")
@pytest.mark.timeout(1800)
def test_bf16_prompts_keep_speculative_equal_to_plain_on_the_default_model() -> None:
    """On a CPU with native bf16, dtype "bf16-prompts" runs prompts in bf16 over fp32 steps; speculative greedy
    equals plain greedy at those settings (a divergence only at a tie of the generator's own logits)."""
    gen = SpeculativeGenerator("default", device="cpu", dtype="bf16-prompts", prefix_cache=False)
    assert gen.target.dtype == torch.float32 and gen.target.prompt_dtype == torch.bfloat16

    def logits_after(prompt: str, output: list[int]) -> torch.Tensor:  # the same settings: the prompt in bf16, then fp32 positions
        ids = gen.encode(prompt, special_tokens=True)
        cache = gen.backend.new_cache(len(ids) + len(output) + 1)
        logits = gen.backend.forward(ids, cache, last_only=True)
        if output:
            logits = gen.backend.forward(output, cache)[-1:]
        return logits[0]

    check_speculative_equals_plain(gen, logits_after)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bf16-prompts", marks=pytest.mark.skipif(
    not cpu_flags() & BF16_FLAGS, reason="this CPU has no native bf16 (AMX, AVX512-BF16): 'bf16-prompts' is fp32 here"))])
def test_a_prefix_hit_equals_a_cold_prefill_bit_for_bit(dtype: str) -> None:
    """A RAG prompt after a kept prefix (the template's public part, about half, all but its last token) gives
    a cold prefill's last logits and keys and values exactly, in fp32 and with bf16 prompts."""
    gen = SpeculativeGenerator("default", device="cpu", dtype=dtype, prefix_cache=False)
    question, passages = document_prompts(1)[0]
    prompt = gen.encode(chat_prompt(gen, question, passages), special_tokens=True)
    public = len(qa_prefix_ids(gen.target.tokenizer))
    with torch.inference_mode():
        assert_hit_is_a_cold_prefill(gen.backend, prompt, [public, len(prompt) // 2, len(prompt) - 1])


NEEDS_BF16 = pytest.mark.skipif(not cpu_flags() & BF16_FLAGS, reason="this CPU has no native bf16 (AMX, AVX512-BF16)")
KERNELS = {"oneDNN": ONEDNN, "F.linear": F_LINEAR}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dtype, linear", [(torch.float32, "oneDNN"), (torch.float32, "F.linear"),
                                           pytest.param(torch.bfloat16, "oneDNN", marks=NEEDS_BF16),
                                           pytest.param(torch.bfloat16, "F.linear", marks=NEEDS_BF16)])
def test_prompt_products_run_whole_only_where_a_row_has_the_same_bits_whatever_the_rows_around_it(
    dtype: torch.dtype, linear: str
) -> None:
    """What a prefix-cache hit relies on when a prompt's products run over all its rows (``LlamaForward.prompt``): where
    ``rows_independent`` says so, a product's row over the default model's weights is the same over a whole prompt's
    rows as over its last rows after a multiple of 256, and over 1 to ``prompt_min_rows`` rows padded to it, on other
    rows and counts than the probe's. (Where it says not, prompts take their products per block, exact by
    construction; on an Intel Xeon with AMX bf16 products and MKL's fp32 ones are such.)"""
    lm = load_model("default", device="cpu", dtype="float32")
    fwd = LlamaForward(lm.model, lm.device, lm.dtype, dtype)
    kernel, least = KERNELS[linear], prompt_min_rows()
    if linear == "oneDNN" and not torch.backends.mkldnn.is_available():
        pytest.skip("torch was built without oneDNN")
    lin, w = kernel.linear, _weights(fwd.layers[0], dtype, kernel)
    own = _weights(fwd.layers[0], dtype, F_LINEAR)
    gen = torch.Generator().manual_seed(1)
    independent = 0
    with torch.inference_mode():
        for weight, plain in ((w.qkv, own.qkv), (w.o, own.o), (w.gate_up, own.gate_up), (w.down, own.down)):
            if not rows_independent(kernel, plain):
                continue
            independent += 1
            x = torch.randn(812, plain.shape[1], generator=gen).to(dtype)  # a RAG prompt's rows
            whole = lin(x, weight, None)
            for rows in [556, 300, 44, *range(least, least + 12)]:
                assert torch.equal(lin(x[-rows:].contiguous(), weight, None), whole[-rows:]), f"{rows} rows of {tuple(plain.shape)}"
            for rows in range(1, least + 1):
                assert torch.equal(_product(lin, x[-rows:].contiguous(), weight, None, least), whole[-rows:]), f"{rows} rows padded"
    if kernel == fwd.prompt_kernel:  # the forward runs a prompt's products whole exactly where all four are independent
        assert fwd.prompt_products_whole == (independent == 4)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dtype, linear", [("float32", "oneDNN"), ("float32", "F.linear"),
                                           pytest.param("bf16-prompts", "oneDNN", marks=NEEDS_BF16),
                                           pytest.param("bf16-prompts", "F.linear", marks=NEEDS_BF16)])
def test_a_hit_leaving_a_few_rows_equals_a_cold_prefill_bit_for_bit(dtype: str, linear: str) -> None:
    """A RAG prompt cut 1, 7, 11 and ``prompt_min_rows() + 3`` tokens after 256, after a hit that keeps all but those:
    the products of those rows padded to ``prompt_min_rows``, against the whole prompt's."""
    gen = SpeculativeGenerator("default", device="cpu", dtype=dtype, prefix_cache=False)
    assert isinstance(gen.backend._forward, LlamaForward)
    fwd = gen.backend._forward
    fwd.prompt_kernel = KERNELS[linear]
    fwd.prompt_weights = [_weights(layer, fwd.prompt_dtype, fwd.prompt_kernel) for layer in fwd.layers]
    own = _weights(fwd.layers[0], fwd.prompt_dtype, F_LINEAR)  # as LlamaForward decides, for the forced kernel
    fwd.prompt_products_whole = all(rows_independent(fwd.prompt_kernel, w) for w in (own.qkv, own.o, own.gate_up, own.down))
    question, passages = document_prompts(1)[0]
    prompt = gen.encode(chat_prompt(gen, question, passages), special_tokens=True)
    with torch.inference_mode():
        for rest in [1, 7, 11, prompt_min_rows() + 3]:
            cut = prompt[: 256 + rest]
            assert len(cut) == 256 + rest
            assert_hit_is_a_cold_prefill(gen.backend, cut, [len(cut) - 1])


def test_plain_decoding_matches_transformers_generate(generator: SpeculativeGenerator) -> None:
    question, passages = document_prompts(1)[0]
    prompt = chat_prompt(generator, question, passages)
    ids = torch.tensor([generator.encode(prompt, special_tokens=True)])
    with torch.inference_mode():
        hf = generator.target.model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :].tolist()
    ours = generator.generate(prompt, max_new_tokens=24, speculation=False).token_ids
    eos = generator.target.tokenizer.eos_token_id
    assert ours == [t for t in hf if t != eos][: len(ours)] and len(ours) >= min(24, hf.index(eos) if eos in hf else 24)


def test_prompt_longer_than_context_names_the_limit(generator: SpeculativeGenerator) -> None:
    with pytest.raises(PromptTooLongError, match="at most 8192"):
        generator.generate("word " * 9000)


def _resident_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
@torch.inference_mode()
def test_fusing_projections_replaces_weights_instead_of_adding_memory() -> None:
    """Fusing adds nothing; the only copy a forward adds is its kernel's packed weights, shared by a second forward."""
    lm = load_model("default", device="cpu", dtype="float32")
    lm.model(torch.tensor([[1, 2, 3]]))  # touch every weight page
    before = _resident_mb()
    fwd = LlamaForward(lm.model, lm.device, lm.dtype)
    packed = [t for w in fwd.step_weights for t in (w.qkv, w.o, w.gate_up, w.down)] + [fwd.head] if fwd.kernel.packs else []
    packed_mb = sum(t.numel() * t.element_size() for t in packed) / 2**20
    # The fused q/k/v and gate/up weights are ~280 MB; the replaced ones must be released.
    assert _resident_mb() - before < packed_mb + 100
    again = _resident_mb()
    LlamaForward(lm.model, lm.device, lm.dtype)
    assert _resident_mb() - again < 50
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight  # still tied after the copy