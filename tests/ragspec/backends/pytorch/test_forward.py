"""The lean Llama forward against transformers' own model, which is the reference."""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from ragspec.backends.pytorch.forward import (
    PROMPT_ROWS,
    STEP_ROWS,
    PROMPT_MIN_ROWS,
    F_LINEAR,
    ONEDNN,
    HFForward,
    Kernel,
    LlamaForward,
    _product,
    attends_in_products,
    fastest_kernel,
    make_forward,
    pick_kernel,
    prompt_min_rows,
    query_blocks,
)

CPU, FP32 = torch.device("cpu"), torch.float32


def llama(**overrides: object) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = dict(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                  initializer_range=0.2, tie_word_embeddings=False)
    return LlamaForCausalLM(LlamaConfig(**(config | overrides))).eval()


@pytest.mark.parametrize("overrides", [
    {},
    {"num_key_value_heads": 6},  # no grouping
    {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}},
])
@torch.inference_mode()
def test_llama_forward_matches_transformers_over_cached_chunks(overrides: dict[str, object]) -> None:
    model = llama(**overrides)
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    want = model(torch.tensor([ids])).logits[0]  # one cache-free pass over everything
    fwd = make_forward(model, CPU, FP32)
    assert isinstance(fwd, LlamaForward) and fwd.description.startswith("lean Llama forward")
    cache = fwd.new_cache(8)  # too small on purpose: the buffers grow
    # Prefill, single tokens, and multi-token chunks after a cache (the draft-verify shape).
    got = [fwd(ids[:17], cache), fwd(ids[17:18], cache), fwd(ids[18:27], cache), fwd(ids[27:28], cache),
           fwd(ids[28:40], cache)]
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-4, atol=1e-4)
    assert cache.get_seq_length() == 40
    cache.crop(-5)  # roll back, then redo the same positions
    torch.testing.assert_close(fwd(ids[35:40], cache), want[35:40], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fwd(ids[:3], fwd.new_cache(4), last_only=True), want[2:3], rtol=1e-4, atol=1e-4)
    # Fusing the projections left the model itself computing exactly what it did.
    assert torch.equal(model(torch.tensor([ids])).logits[0], want)


@torch.inference_mode()
def test_fused_weights_share_the_models_storage_and_are_built_once() -> None:
    model = llama(attention_bias=True)
    first, second = LlamaForward(model, CPU, FP32), LlamaForward(model, CPU, FP32)
    assert first.fused == second.fused  # the same objects: one set of fused weights per model
    (qkv, gate_up), layer = first.fused[0], model.model.layers[0]
    att = layer.self_attn
    for fused, linears in ((qkv, [att.q_proj, att.k_proj, att.v_proj]), (gate_up, [layer.mlp.gate_proj, layer.mlp.up_proj])):
        storage = fused.weight.untyped_storage().data_ptr()
        assert all(lin.weight.untyped_storage().data_ptr() == storage for lin in linears)
        assert fused.weight.shape[0] == sum(lin.out_features for lin in linears)
    assert qkv.bias is not None and att.v_proj.bias.untyped_storage().data_ptr() == qkv.bias.untyped_storage().data_ptr()


def test_replaced_projection_layers_are_left_to_transformers() -> None:
    class Custom(torch.nn.Linear):  # e.g. a quantized or adapter-wrapped layer
        pass

    model = llama()
    old = model.model.layers[1].mlp.up_proj
    model.model.layers[1].mlp.up_proj = Custom(old.in_features, old.out_features, bias=False)
    assert isinstance(make_forward(model, CPU, FP32), HFForward)


@torch.inference_mode()
def test_bfloat16_path_matches_transformers() -> None:
    # The dtype a GPU runs by default: F.linear products and transformers' norm arithmetic.
    model = llama().to(torch.bfloat16)
    ids = list(range(5, 35))
    want = model(torch.tensor([ids])).logits[0].float()
    fwd = make_forward(model, CPU, torch.bfloat16)
    assert isinstance(fwd, LlamaForward) and fwd.kernel is F_LINEAR
    cache = fwd.new_cache(64)
    got = torch.cat([fwd(ids[:20], cache), fwd(ids[20:21], cache), fwd(ids[21:30], cache)]).float()
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9


@torch.inference_mode()
def test_other_architectures_use_transformers_forward() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)).eval()
    fwd = make_forward(model, CPU, FP32)
    assert isinstance(fwd, HFForward) and not LlamaForward.supports(model)
    assert fwd.description == "transformers forward"
    ids = list(range(10, 30))
    want = model(torch.tensor([ids])).logits[0]
    cache = fwd.new_cache(32)
    got = torch.cat([fwd(ids[:12], cache), fwd(ids[12:13], cache), fwd(ids[13:20], cache)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_dynamic_rope_is_left_to_transformers() -> None:
    # Dynamic NTK scaling recomputes its tables from the sequence length: not reproduced here.
    model = llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert isinstance(make_forward(model, CPU, FP32), HFForward)


@pytest.mark.parametrize("rows", [1, 2, 9])
@pytest.mark.parametrize("timed", [False, True])
def test_picked_linear_computes_a_linear_layer(rows: int, timed: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 64, generator=g), torch.randn(40, 64, generator=g), torch.randn(40, generator=g)
    kernel = pick_kernel(CPU, FP32, [(w, 3)] if timed else ())
    if torch.backends.mkldnn.is_available() and not timed:
        assert kernel is ONEDNN and kernel.packs  # oneDNN's kernel is really used where it exists
    prepared = kernel.prepare(w)
    torch.testing.assert_close(kernel.linear(x, prepared, b), x @ w.T + b, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(kernel.linear(x, prepared, None), x @ w.T, rtol=1e-5, atol=1e-4)
    assert pick_kernel(CPU, torch.float16, [(w, 3)]) is F_LINEAR
    half = pick_kernel(CPU, torch.bfloat16, [(w.bfloat16(), 3)] if timed else ())
    torch.testing.assert_close(half.linear(x.bfloat16(), half.prepare(w.bfloat16()), None).float(), x @ w.T, rtol=0.02, atol=0.1)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch was built without oneDNN")
@torch.inference_mode()
def test_packed_products_give_a_row_the_same_bits_whatever_the_rows_around_it() -> None:
    """Why steps and verify passes agree better with packed weights: oneDNN's product of one row over a plain weight
    takes another kernel than a row among several; over a packed weight every row count computes a row alike."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(17, 576, generator=g), torch.randn(1536, 576, generator=g) * 0.05
    packed = ONEDNN.prepare(w)
    whole = ONEDNN.linear(x, packed, None)
    for rows in (1, 2, 3, 5, 9, 16):
        assert torch.equal(ONEDNN.linear(x[:rows], packed, None), whole[:rows]), rows
    torch.testing.assert_close(whole, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_the_faster_linear_is_picked_by_timing_the_weights_uses() -> None:
    """Each candidate is timed on every weight, times its uses: a slow product used often loses."""
    calls: list[tuple[str, tuple[int, ...]]] = []

    def product(name: str, seconds_per_row: float) -> Kernel:
        def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            calls.append((name, tuple(x.shape)))
            if weight.shape[0] == 8:  # the weight used ten times
                time.sleep(seconds_per_row * x.shape[0])
            return x @ weight.T
        return Kernel(name, linear)

    fast_on_big, fast_on_small = product("a", 0.0), product("b", 0.0)
    slow = product("c", 0.004)
    big, small = torch.randn(16, 4), torch.randn(8, 4)
    assert fastest_kernel([slow, fast_on_big], [(big, 1), (small, 10)]) is fast_on_big
    assert fastest_kernel([fast_on_small, slow], [(big, 1), (small, 10)]) is fast_on_small
    # per call: 1 warm-up and 3 timed rounds, each over both weights with 1 and 5 rows (two calls)
    assert calls.count(("c", (5, 4))) == 2 * 4 * 2 and calls.count(("c", (1, 4))) == 2 * 4 * 2


def test_a_burst_of_other_work_in_one_round_does_not_pick_the_slower_linear() -> None:
    """Each product counts its best round: a stall in one round of the faster kernel does not make it lose."""
    rounds: list[int] = []

    def fast_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rounds.append(1)
        if len(rounds) == 2:  # the first timed round, after the warm-up: a stall of 50 ms
            time.sleep(0.05)
        return x @ weight.T

    def slow_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        time.sleep(0.005)
        return x @ weight.T

    fast, slow = Kernel("fast", fast_product), Kernel("slow", slow_product)
    assert fastest_kernel([slow, fast], [(torch.randn(8, 4), 1)], rows=(1,)) is fast


def test_a_kernel_is_timed_on_weights_prepared_as_it_reads_them() -> None:
    """A kernel that packs its weights is timed on packed copies, so the packing is not timed as part of each product."""
    seen: list[str] = []

    def record(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        seen.append(getattr(weight, "layout_tag", "plain"))
        return x @ weight.T

    def tag(weight: torch.Tensor) -> torch.Tensor:
        tagged = weight.clone()
        tagged.layout_tag = "packed"
        return tagged

    fastest_kernel([Kernel("packs", record, tag), Kernel("plain", record)], [(torch.randn(8, 4), 1)])
    assert seen.count("packed") == seen.count("plain") == 4 * len(STEP_ROWS)  # warm-up and 3 rounds, each row count



@pytest.mark.parametrize("past", [0, 6])
@torch.inference_mode()
def test_bf16_prompts_over_fp32_steps(past: int) -> None:
    """A prompt in bf16 (``prompt_dtype``) stores its keys and values in the fp32 cache exactly as it
    computed them, and the steps after it are the fp32 forward's own over that cache."""
    model = llama()
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    mixed = LlamaForward(model, CPU, FP32, prompt_dtype=torch.bfloat16)
    plain = LlamaForward(model, CPU, FP32)
    assert f"prompts: {mixed.prompt_kernel.name} in bfloat16" in mixed.description and "bfloat16" not in plain.description
    assert all(w.qkv.dtype == FP32 for w in plain.step_weights)  # the model's own weights stay fp32
    assert mixed.prompt_weights[0].qkv.dtype == torch.bfloat16
    cache = mixed.new_cache(40)
    if past:  # a cached prefix (a reused prompt prefix) before the prompt's remainder
        mixed(ids[:past], cache, last_only=True)
    first = mixed(ids[past:20], cache, last_only=True)
    keys = cache.layers[0].keys
    assert keys.dtype == FP32 and torch.equal(keys.to(torch.bfloat16).float(), keys)  # bf16 values, stored exactly
    # The prompt against transformers' own model in bf16 (bf16 rounding apart).
    reference = copy.deepcopy(model).to(torch.bfloat16)
    want = reference(torch.tensor([ids[:20]])).logits[0, -1:].float()
    torch.testing.assert_close(first, want, rtol=0.05, atol=0.05)
    # Steps and verify passes after it: exactly the fp32 forward's over a copy of the same cache.
    twin = plain.new_cache(40)
    twin_layers = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    for layer, (k, v) in zip(twin.layers, twin_layers):
        layer.update(k, v)
    assert torch.equal(mixed(ids[20:21], cache), plain(ids[20:21], twin))
    assert torch.equal(mixed(ids[21:26], cache), plain(ids[21:26], twin))


def test_prompts_and_steps_each_get_the_faster_linear_for_their_row_counts() -> None:
    """The product fastest with few rows need not be the fastest with hundreds: each is timed apart."""

    def product(seconds_per_row_few: float, seconds_per_row_many: float) -> Kernel:
        def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            time.sleep((seconds_per_row_few if x.shape[0] <= 8 else seconds_per_row_many) * x.shape[0])
            return x @ weight.T
        return Kernel(f"{seconds_per_row_few}/{seconds_per_row_many}", linear)

    # Margins of 10-50 ms a call (each product's best of 3 rounds counts), so that a loaded machine, which can
    # delay a call by a few milliseconds, does not swap the two.
    few, many = product(0.0, 2e-4), product(1e-2, 0.0)
    weights = [(torch.randn(8, 4), 2)]
    assert fastest_kernel([many, few], weights, STEP_ROWS) is few
    assert fastest_kernel([few, many], weights, PROMPT_ROWS) is many
    fwd = LlamaForward(llama(), CPU, FP32)
    assert fwd.description.startswith("lean Llama forward (") and ", prompts: " in fwd.description


@pytest.mark.parametrize("block", [1, 5, 17, 256])
@pytest.mark.parametrize("past", [0, 3, 17, 256, 300])
def test_query_blocks_end_where_positions_reach_a_multiple_of_the_block(block: int, past: int) -> None:
    for n in [1, 2, block - 1, block, block + 1, 3 * block + 7]:
        if n < 1:
            continue
        sizes = query_blocks(past, n, block)
        ends = [past + sum(sizes[: i + 1]) for i in range(len(sizes))]
        assert sum(sizes) == n and all(size >= 1 for size in sizes)
        assert all(end % block == 0 for end in ends[:-1]) and ends[-1] == past + n
        assert all(size <= block for size in sizes)  # no multiple of the block inside one


@pytest.mark.parametrize("rows", [1, 3, 9, 40])
def test_a_prompts_product_is_computed_over_at_least_min_rows(rows: int) -> None:
    seen: list[int] = []

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        seen.append(x.shape[0])
        return F.linear(x, weight, bias)

    x, weight, bias = torch.randn(rows, 6), torch.randn(4, 6), torch.randn(4)
    out = _product(linear, x, weight, bias, 16)
    assert seen == [max(rows, 16)] and out.shape == (rows, 4)
    torch.testing.assert_close(out, F.linear(x, weight, bias))
    assert prompt_min_rows() >= max(PROMPT_MIN_ROWS, 4 * torch.get_num_threads())


@torch.inference_mode()
def test_a_prompts_attention_runs_in_blocks_aligned_to_positions_within_one_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Products over all of a prompt's rows (at least ``prompt_min_rows``), attention in query blocks ending at
    multiples of the block, each over the positions up to its end; a step is one attention call."""
    model = llama()
    fwd = LlamaForward(model, CPU, FP32)
    calls: list[tuple[int, int, bool]] = []
    sdpa = F.scaled_dot_product_attention

    def recording(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object) -> torch.Tensor:
        calls.append((q.shape[2], k.shape[2], bool(kwargs.get("is_causal"))))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    cache = fwd.new_cache(80)
    layers = len(fwd.layers)
    fwd.prompt(list(range(5)), cache, 16)
    assert calls == [(5, 5, True)] * layers
    calls.clear()
    fwd.prompt(list(range(40)), cache, 16)  # positions 5..44
    assert calls == [(11, 16, False), (16, 32, False), (13, 45, False)] * layers
    calls.clear()
    fwd([1, 2, 3], cache)  # a verify pass: one call, wherever it starts
    assert calls == [(3, 48, False)] * layers
    monkeypatch.undo()
    # transformers' logits of the whole prompt, to float rounding, from a prompt in blocks after a cached part.
    cache = fwd.new_cache(80)
    ids = list(range(3, 43))
    fwd.prompt(ids[:9], cache, 16)
    want = model(torch.tensor([ids])).logits[0, -1:]
    torch.testing.assert_close(fwd.prompt(ids[9:], cache, 16), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kv_heads", [2, 6])
@pytest.mark.parametrize("past", [0, 7, 16])
@torch.inference_mode()
def test_bf16_prompt_attention_in_products_matches_the_fused_kernels(kv_heads: int, past: int) -> None:
    """The bf16 prompt's attention (two products and a softmax per block) against a position-by-position
    reference with the same two roundings (scores and weights to bf16), and against torch's fused attention on
    the same values widened to fp32 (looser: the rounded scores), with and without grouped heads."""
    fwd = LlamaForward(llama(num_key_value_heads=kv_heads), CPU, FP32, prompt_dtype=torch.bfloat16)
    heads, hd, n = 6, 8, 37
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(heads, n, hd, generator=gen).bfloat16()
    keys, values = (torch.randn(1, kv_heads, past + n, hd, generator=gen).bfloat16() for _ in range(2))
    spans = fwd._spans(past, query_blocks(past, n, 16))
    got = fwd._attend_in_products(q, keys, values, past, spans)
    assert got.dtype == torch.bfloat16 and got.shape == (n, heads * hd)
    reference = torch.empty(n, heads, hd)
    for i in range(n):
        for h in range(heads):
            k, v = (t[0, h // (heads // kv_heads), : past + i + 1].float() for t in (keys, values))
            scores = (k @ (q[h, i] * fwd.scale).float()).bfloat16().float()
            reference[i, h] = torch.softmax(scores, 0).bfloat16().float() @ v
    torch.testing.assert_close(got.float(), reference.reshape(n, -1), rtol=0.01, atol=0.01)
    fused = fwd._attend(q.float(), keys.float(), values.float(), past, spans)
    torch.testing.assert_close(got.float(), fused, rtol=0.05, atol=0.05)
    # A future key changed changes nothing: the causal mask holds inside each block.
    keys[:, :, -1] += 5
    assert torch.equal(fwd._attend_in_products(q, keys, values, past, spans)[:-1], got[:-1])


@torch.inference_mode()
@pytest.mark.parametrize("amx", [False, True])
def test_bf16_prompts_on_a_cpu_attend_in_products_without_amx_and_steps_in_the_fused_kernel(
    monkeypatch: pytest.MonkeyPatch, amx: bool
) -> None:
    """A bf16 prompt's attention runs in products on a CPU with AVX512-BF16 only, in the fused kernel (in bf16) on
    one with AMX, where that kernel is the faster; steps and verify passes in the fused kernel in fp32 on both."""
    from ragspec.backends.pytorch import forward

    flags = frozenset({"avx512_bf16", "amx_bf16"} if amx else {"avx512_bf16"})
    monkeypatch.setattr(forward, "cpu_flags", lambda: flags)
    assert attends_in_products(CPU, torch.bfloat16) is not amx
    assert not attends_in_products(CPU, FP32) and not attends_in_products(torch.device("cuda"), torch.bfloat16, flags)
    mixed = LlamaForward(llama(), CPU, FP32, prompt_dtype=torch.bfloat16)
    plain = LlamaForward(llama(), CPU, FP32)
    assert mixed.prompt_attend == (mixed._attend if amx else mixed._attend_in_products)
    assert plain.prompt_attend == plain._attend
    assert mixed.description.endswith("in bfloat16)" if amx else "in bfloat16, attention in bf16 products)")
    assert "attention" not in plain.description
    fused: list[torch.dtype] = []
    sdpa = F.scaled_dot_product_attention

    def recording(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object) -> torch.Tensor:
        fused.append(q.dtype)
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    cache = mixed.new_cache(40)
    mixed.prompt(list(range(20)), cache, 16)
    assert fused == ([torch.bfloat16] * 2 * len(mixed.layers) if amx else [])  # two blocks of queries
    fused.clear()
    mixed([1, 2, 3], cache)  # a verify pass: fp32, the fused kernel
    assert fused == [FP32] * len(mixed.layers)


def split_kernels(candidates: list[Kernel], weights: object, rows: tuple[int, ...] = STEP_ROWS, rounds: int = 3) -> Kernel:
    """A stand-in for ``fastest_kernel`` that times nothing: MKL's products (``F.linear``) under 5 rows, oneDNN's packed
    ones from 5 rows, as timed on 2 cores of an Intel Xeon with AMX."""
    return F_LINEAR if max(rows) < 5 or ONEDNN not in candidates else ONEDNN


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch was built without oneDNN")
@torch.inference_mode()
def test_a_forward_takes_the_kernel_timed_fastest_at_its_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of 1 to 4 rows run MKL's products over the model's own weights, verify passes of 5 rows and more oneDNN's
    over packed copies (the output head too), and every one computes transformers' logits."""
    from ragspec.backends.pytorch import forward

    monkeypatch.setattr(forward, "_PICKED", {})
    monkeypatch.setattr(forward, "fastest_kernel", split_kernels)
    model = llama()
    fwd = LlamaForward(model, CPU, FP32)
    assert [(rows, k) for rows, k, _, _ in fwd.step_products] == [
        (1, F_LINEAR), (2, F_LINEAR), (3, F_LINEAR), (5, ONEDNN), (9, ONEDNN)]
    assert "F.linear products, oneDNN packed from 5 rows, prompts: oneDNN packed" in fwd.description
    _, _, plain, plain_head = fwd.step_products[0]
    _, _, packed, packed_head = fwd.step_products[3]
    assert plain is fwd.step_weights and plain[0].qkv.data_ptr() == model.model.layers[0].self_attn.q_proj.weight.data_ptr()
    assert packed[0].qkv.is_mkldnn and packed_head.is_mkldnn and not plain_head.is_mkldnn
    ids = list(range(5, 45))
    want = model(torch.tensor([ids])).logits[0]
    cache = fwd.new_cache(64)
    got = torch.cat([fwd(ids[:20], cache), fwd(ids[20:21], cache), fwd(ids[21:24], cache), fwd(ids[24:28], cache),
                     fwd(ids[28:33], cache), fwd(ids[33:40], cache)])
    torch.testing.assert_close(got, want[:40], rtol=1e-4, atol=1e-4)
