"""Target and draft forwards on the decoding hot path: a lean Llama pass, else transformers' own.

Why a second implementation of the same arithmetic: speculative decoding lives on forwards over
a few rows (a pending token and a short draft), and there transformers' module tree and its
default matrix products were slow on a CPU; ``LlamaForward`` is cheaper for both plain steps
and verify passes. The measurements behind this are in docs/design.md ("Measurements").

``LlamaForward`` replays a ``LlamaForCausalLM``'s computation on the model's own weights (a second
copy only where a kernel reads them in a layout of its own, ``Kernel``, or prompts run in another
dtype): RMSNorm, rotary embedding, grouped-query attention (torch's SDPA; a bf16 prompt's on a CPU in
bf16 matrix products, ``LlamaForward._attend_in_products``), SiLU MLP, the same operations in the
same order as transformers' Llama code, with products through the faster of oneDNN's linear over
weights packed once into its own layout and ``F.linear`` (MKL) on a CPU in fp32 or bf16, timed on
the model's own weights when the pass is built (``pick_kernel``), and ``F.linear`` elsewhere. Products
that read the same input are fused: q/k/v is one product and gate/up another (7 weight streams per
layer become 4). Logits agree with transformers' to float rounding (tests compare them, and greedy
outputs against transformers' ``generate``); ragspec's plain and speculative decoding both use this pass, so the lossless
guarantee is unaffected. A prompt runs in one forward whose
attention is split into query blocks aligned to positions (``LlamaForward.prompt``), so that a prefix-cache hit
computes exactly what a cold prefill computes. Other architectures use ``HFForward`` (transformers' forward with a
preallocated cache). ``Forward`` is what the PyTorch back end (``ragspec.backends.pytorch``)
runs; the generator and the draft model call that back end through ``ragspec.backends.base.Backend``.
"""
from __future__ import annotations

import functools
import inspect
import threading
import time
import weakref
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from retrievers.embeddings import cpu_flags
from ragspec.backends.pytorch.kv_cache import make_cache
from ragspec.engine.cancel import check as check_cancelled

Linear = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, "list[tuple[int, int, torch.Tensor | None]]"], torch.Tensor]
"""Attention of queries over keys and values in spans of query positions (``LlamaForward._attend``)."""


class Forward(Protocol):
    """Runs the model on ``ids`` after the positions in ``cache`` and appends them to it."""

    description: str
    """Which implementation runs (shown in benchmark reports)."""

    def __call__(self, ids: list[int], cache: DynamicCache, last_only: bool = False) -> torch.Tensor:
        """Logits ``[len(ids), vocab]`` (``[1, vocab]`` with ``last_only``)."""
        ...

    def prompt(self, ids: list[int], cache: DynamicCache, block: int, cancel: threading.Event | None = None) -> torch.Tensor:
        """A prompt's last logits ``[1, vocab]``, its positions split into blocks that end where they reach a multiple
        of ``block`` (``query_blocks``), each block computed alike whether the blocks before it are in ``cache`` or
        evaluated in the same call. So evaluating a prompt's last positions after a cache that holds the others up
        to a multiple of ``block`` (a prefix-cache hit, ``TorchBackend.load``) computes what evaluating the whole
        prompt computes: the logits and the keys and values written are bit for bit the same. (Rounding depends on
        the rows a computation sees, even in fp32: torch's CPU attention splits its work by the number of query and
        key positions, and a product of a few rows may take another kernel; docs/backends.md, "Prefill".)
        ``cancel`` is checked as it goes (a cancelled prompt leaves the cache partly written: start the next
        request cold)."""
        ...

    def new_cache(self, capacity: int) -> DynamicCache:
        """An empty cache with room for ``capacity`` positions (grown when exceeded)."""
        ...

    def hidden_at(self, position: int) -> torch.Tensor | None:
        """The final-norm hidden state at ``position`` if the last call computed it, else None."""
        ...


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


PACK_ROWS = 16
"""The row count oneDNN is told to lay a packed weight out for. Measured on the default model's products (2 cores
of an AMD EPYC): hints of 2, 4 and 16 rows gave the same speed for steps, verify passes and prompts; 1 row a
slower layout."""


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` reordered once into oneDNN's blocked layout (an opaque tensor only ``_onednn_linear`` reads)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def _as_is(weight: torch.Tensor) -> torch.Tensor:
    return weight


@dataclass(frozen=True)
class Kernel:
    """A matrix-product kernel: ``linear(x, prepare(weight), bias)`` computes ``F.linear(x, weight, bias)``.

    ``prepare`` is applied once per weight, when a forward is built. oneDNN's linear given a plain weight
    reorders it into its blocked layout on every call, a pass over the weight as long as the product itself
    with a few rows: on 2 cores of an AMD EPYC the default model's products took 23 ms per forward of 2 rows
    plain and 11 ms packed, and a packed product's row has the same bits whatever the rows around it, 1 row
    included (docs/backends.md, "Packed weights")."""

    name: str
    linear: Linear
    prepare: Callable[[torch.Tensor], torch.Tensor] = _as_is

    @property
    def packs(self) -> bool:
        """Whether the kernel reads weights in a layout of its own (a copy, besides the model's own weights)."""
        return self.prepare is not _as_is


F_LINEAR = Kernel("F.linear", F.linear)
ONEDNN = Kernel("oneDNN packed", _onednn_linear, _pack)


STEP_ROWS = (1, 2, 3, 5, 9)
"""Rows the products of forwards over the cache are timed at, each row count apart (a plain step; verifies of 1, 2,
4 and 8 drafted tokens): a forward of ``n`` rows takes the kernel timed fastest at the largest of these up to ``n``
(``LlamaForward.step_products``). On 2 cores of an Intel Xeon with AMX, MKL's products were the faster for 1 to 3
rows and oneDNN's packed ones for 5 and more: a verify of 4 drafted tokens cost 1.67 plain steps with MKL's
products and 1.35 with oneDNN's (docs/backends.md, "Products by row count")."""
PROMPT_CHUNK = 256
"""Prompt positions per query block of attention, counted from position 0: a prompt's attention runs in blocks
of queries ``[k * PROMPT_CHUNK, (k + 1) * PROMPT_CHUNK)`` (``LoadedModel.prompt_chunk``, ``query_blocks``), its
products over all its rows at once, so that a prefix-cache hit, which resumes at a multiple of it, computes
what a cold prefill computes after it (docs/backends.md, "Prefill")."""
PROMPT_ROWS = (PROMPT_CHUNK,)
"""Rows a prompt's products are timed at."""
PROMPT_MIN_ROWS = 16
"""Fewest rows a prompt's product is computed over (``prompt_min_rows``)."""


def prompt_min_rows() -> int:
    """Rows a prompt's products are padded to (zero rows appended, their results dropped) when it has fewer.

    A product's row then has the same bits whatever the number of rows around it: measured on the default
    model's weights (2 cores of an AMD EPYC, torch 2.13), oneDNN's fp32 linear differs only for 1 row, and bf16
    ``F.linear`` never; MKL's fp32 ``F.linear`` differs below 12 rows with 2 threads (below 4 with 1), and its
    range grows with the threads: up to 27 rows with 12 or 16 threads, 51 with 32, 171 with 64 (always a count
    that is not a multiple of 4). Hence at least 16 rows and 4 per thread (docs/backends.md, "Prefill")."""
    return max(PROMPT_MIN_ROWS, 4 * torch.get_num_threads())


def rows_independent(kernel: Kernel, weight: torch.Tensor, block: int = PROMPT_CHUNK) -> bool:
    """Whether ``kernel``'s product with ``weight`` (``[out, in]``, in the dtype it runs in) gives a row the same bits
    whatever the rows computed with it, as a prefix-cache hit needs when a prompt's products run over all its rows at
    once: probed on seeded random rows, a product over ``2 * block + 369`` rows against its last ``block + 369``,
    369, 113 and 37 rows, each count from ``prompt_min_rows`` to 20 more, and each below it padded to it. What decides
    is the order in which the kernel sums, a matter of shapes, not data: on 2 cores of an AMD EPYC both kernels kept
    it in fp32 and bf16; on an Intel Xeon with AMX bf16 products of either kernel and MKL's fp32 ones did not. So the
    answer is kept per kernel, device, dtype, shape, block and thread count (probed once per process: 65-170 ms for
    the default model's four products)."""
    least = prompt_min_rows()
    key = (kernel.name, str(weight.device), weight.dtype, tuple(weight.shape), block, least)
    if key not in _INDEPENDENT:
        prepared = kernel.prepare(weight)
        rows = torch.randn(2 * block + 369, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight)
        counts = [block + 369, 369, 113, 37, *range(1, least + 21)]
        with torch.inference_mode():
            whole = kernel.linear(rows, prepared, None)
            _INDEPENDENT[key] = all(
                torch.equal(_product(kernel.linear, rows[-n:].contiguous(), prepared, None, least), whole[-n:])
                for n in counts)
    return _INDEPENDENT[key]


_INDEPENDENT: dict[tuple[object, ...], bool] = {}
"""``rows_independent``'s answers in this process."""


def query_blocks(past: int, n: int, block: int) -> list[int]:
    """Sizes of the blocks that positions ``[past, past + n)`` split into where they reach a multiple of ``block``."""
    sizes, start = [], past
    while start < past + n:
        end = min(past + n, start + block - start % block)
        sizes.append(end - start)
        start = end
    return sizes


def pick_kernel(
    device: torch.device, dtype: torch.dtype, weights: Sequence[tuple[torch.Tensor, int]] = (), rows: Sequence[int] = STEP_ROWS
) -> Kernel:
    """``F_LINEAR``; for fp32 or bf16 on a CPU where torch was built with oneDNN, the faster of ``ONEDNN`` (packed
    weights) and ``F_LINEAR`` (MKL in fp32) on ``weights`` (each with how often one forward uses it) with ``rows``
    input rows.

    Which is faster depends on the CPU and on the number of rows, so it is timed at run time
    (``fastest_kernel``), once for decoding steps (``STEP_ROWS``) and once for prompts
    (``PROMPT_ROWS``): on 2 cores of an AMD EPYC MKL's products with few rows were about half as
    fast as oneDNN's, on an Intel Xeon with AMX MKL's were faster than oneDNN's over plain weights
    (docs/backends.md, "The PyTorch step per CPU"). Without ``weights`` oneDNN's is taken where it exists.
    Both compute the same products to float rounding (in bf16, oneDNN's packed products and ``F.linear``'s gave
    the same bits on the default model's prompts).
    """
    candidates = [F_LINEAR]
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available():
        try:
            _onednn_linear(torch.ones(2, 4, dtype=dtype), _pack(torch.ones(3, 4, dtype=dtype)), None)
            candidates.insert(0, ONEDNN)
        except (AttributeError, RuntimeError):  # a build without the ops, or without bf16 in them
            pass
    if len(candidates) == 1 or not weights:
        return candidates[0]
    key = (str(device), dtype, tuple(rows), tuple((tuple(w.shape), uses) for w, uses in weights))
    if key not in _PICKED:
        _PICKED[key] = fastest_kernel(candidates, weights, rows)
    return _PICKED[key]


_PICKED: dict[tuple[object, ...], Kernel] = {}
"""The kernel chosen per device, dtype, row counts and weight shapes: timed once per process."""


def fastest_kernel(
    candidates: Sequence[Kernel], weights: Sequence[tuple[torch.Tensor, int]], rows: Sequence[int] = STEP_ROWS,
    rounds: int = 3,
) -> Kernel:
    """The candidate whose products over ``weights`` (each counted ``uses`` times, each prepared as the candidate
    reads it) with ``rows`` input rows take least time: each product's best of ``rounds`` interleaved rounds,
    after one round of warm-up.

    The best of several rounds, not their sum: a burst of other work during one round would otherwise pick
    the slower kernel for the whole process (seen once in a benchmark run: MKL's products for decoding
    steps on an AMD EPYC, where oneDNN's are about twice as fast with few rows)."""
    inputs = {(w.shape[1], r): torch.randn(r, w.shape[1], dtype=w.dtype, device=w.device) for w, _ in weights for r in rows}
    best = [[float("inf")] * (len(weights) * len(rows)) for _ in candidates]
    with torch.inference_mode():
        prepared = [[kernel.prepare(w) for w, _ in weights] for kernel in candidates]
        for round_ in range(rounds + 1):
            for i, kernel in enumerate(candidates):
                for j, ((w, _), r) in enumerate((wu, r) for wu in weights for r in rows):
                    start = time.perf_counter()
                    kernel.linear(inputs[w.shape[1], r], prepared[i][j // len(rows)], None)
                    if round_:
                        best[i][j] = min(best[i][j], time.perf_counter() - start)
    uses = [u for _, u in weights for _ in rows]
    spent = [sum(u * t for u, t in zip(uses, times)) for times in best]
    return candidates[min(range(len(candidates)), key=spent.__getitem__)]


class HFForward:
    """transformers' own forward with a preallocated KV cache (any architecture)."""

    def __init__(self, model: PreTrainedModel, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.description = "transformers forward"
        # transformers 5.x renamed `past_key_values` to `cache`; accept either.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def new_cache(self, capacity: int) -> DynamicCache:
        return make_cache(self.model.config, capacity)

    def hidden_at(self, position: int) -> torch.Tensor | None:
        """None: transformers' forward keeps no hidden states."""
        return None

    def __call__(self, ids: list[int], cache: DynamicCache, last_only: bool = False) -> torch.Tensor:
        x = torch.tensor([ids], device=self.device)
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if last_only:
            kwargs["logits_to_keep"] = 1
        return self.model(input_ids=x, **kwargs).logits[0]

    def prompt(
        self, ids: list[int], cache: DynamicCache, block: int = PROMPT_CHUNK, cancel: threading.Event | None = None
    ) -> torch.Tensor:
        """See ``Forward.prompt``: one forward per block (``prompt_in_blocks``), since transformers' attention cannot
        be split apart from its products."""
        return prompt_in_blocks(self, ids, cache, block, cancel)


def prompt_in_blocks(
    forward: Callable[[list[int], DynamicCache, bool], torch.Tensor], ids: list[int], cache: DynamicCache, block: int,
    cancel: threading.Event | None = None,
) -> torch.Tensor:
    """``Forward.prompt`` from one ``forward(ids, cache, last_only=True)`` per block of ``query_blocks``; ``cancel`` is
    checked before each, so a cancelled prompt stops within one."""
    start = 0
    for size in query_blocks(cache.get_seq_length(), len(ids), block):
        check_cancelled(cancel)
        logits = forward(ids[start : start + size], cache, True)
        start += size
    return logits


class _Fused:
    """One weight (and bias) for linears that read the same input, split again by ``sizes``."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.sizes = [lin.out_features for lin in linears]
        self.weight = torch.cat([lin.weight.detach() for lin in linears])
        # Llama projections of one group all have a bias or none do (attention_bias, mlp_bias).
        self.bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears])
        # The modules keep working, reading views of the fused tensors: no second copy of the weights.
        for lin, w in zip(linears, self.weight.split(self.sizes)):
            lin.weight = nn.Parameter(w, requires_grad=lin.weight.requires_grad)
        if self.bias is not None:
            for lin, b in zip(linears, self.bias.split(self.sizes)):
                lin.bias = nn.Parameter(b, requires_grad=lin.bias.requires_grad)


# Per decoder layer, so that several generators over one model share one set of fused weights.
_FUSED: weakref.WeakKeyDictionary[nn.Module, tuple[_Fused, _Fused]] = weakref.WeakKeyDictionary()


def _projections(layer: nn.Module) -> list[nn.Module]:
    """q, k, v, o, gate, up, down of a Llama decoder layer."""
    att, mlp = layer.self_attn, layer.mlp
    return [att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def _own_memory(model: nn.Module) -> None:
    """Copy a CPU model's weights out of its memory-mapped checkpoint before fusing.

    Weights still mapped from the file keep the whole mapping alive, so the projections that
    fusing replaces would stay resident (measured in docs/design.md, "Measurements").
    """
    with torch.no_grad():
        for param in model.parameters():  # tied weights are one Parameter: copied once, still tied
            param.data = param.data.clone()


def _fused(layer: nn.Module) -> tuple[_Fused, _Fused]:
    if layer not in _FUSED:
        q, k, v, _, gate, up, _ = _projections(layer)
        _FUSED[layer] = (_Fused([q, k, v]), _Fused([gate, up]))
    return _FUSED[layer]


@dataclass(frozen=True)
class _Weights:
    """One decoder layer's tensors in one dtype: its two norms and its four products (q/k/v and
    gate/up fused)."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None

    @classmethod
    def of(cls, layer: nn.Module) -> _Weights:
        """The layer's own tensors (no copy)."""
        qkv, gate_up = _fused(layer)
        att, mlp = layer.self_attn, layer.mlp
        return cls(layer.input_layernorm.weight, qkv.weight, qkv.bias, att.o_proj.weight, att.o_proj.bias,
                   layer.post_attention_layernorm.weight, gate_up.weight, gate_up.bias, mlp.down_proj.weight,
                   mlp.down_proj.bias)

    def to(self, dtype: torch.dtype, kernel: Kernel) -> _Weights:
        """A copy in ``dtype`` (tensors already in it are kept), its four products' weights prepared for ``kernel``."""
        products = {"qkv", "o", "gate_up", "down"}
        return _Weights(*(
            None if (t := getattr(self, f.name)) is None else
            (kernel.prepare if f.name in products else _as_is)(t.detach().to(dtype)) for f in fields(self)
        ))


# A layer's tensors in another dtype (bf16 prompts over fp32 steps) or prepared for a kernel that packs them, per
# decoder layer, dtype and kernel, so that several generators over one model share one copy.
_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[tuple[torch.dtype, str], _Weights]] = weakref.WeakKeyDictionary()
# The output head prepared for a kernel that packs it, per head module and kernel.
_HEADS: weakref.WeakKeyDictionary[nn.Module, dict[str, torch.Tensor]] = weakref.WeakKeyDictionary()


def _weights(layer: nn.Module, dtype: torch.dtype, kernel: Kernel) -> _Weights:
    """The layer's tensors in ``dtype`` as ``kernel`` reads them: its own where they are, else a shared copy."""
    own = _Weights.of(layer)
    if own.qkv.dtype == dtype and not kernel.packs:
        return own
    copies = _COPIES.setdefault(layer, {})
    if (dtype, kernel.name) not in copies:
        copies[dtype, kernel.name] = own.to(dtype, kernel)
    return copies[dtype, kernel.name]


def _head(head: nn.Linear, kernel: Kernel) -> torch.Tensor:
    """The output head's weight as ``kernel`` reads it (its own, or a copy shared by every forward over the model)."""
    if not kernel.packs:
        return head.weight
    packed = _HEADS.setdefault(head, {})
    if kernel.name not in packed:
        packed[kernel.name] = kernel.prepare(head.weight)
    return packed[kernel.name]


def attends_in_products(device: torch.device, prompt_dtype: torch.dtype, flags: frozenset[str] | None = None) -> bool:
    """Whether a prompt's attention runs in bf16 matrix products (``LlamaForward._attend_in_products``) rather than
    torch's fused kernel: for bf16 prompts on a CPU without AMX (``flags``: by default this CPU's).

    torch's fused CPU attention widens bf16 to fp32 tile by tile, so on a CPU with AVX512-BF16 but no AMX it ran
    at fp32 speed and the products were faster (an 850-token prompt of the default model 401 ms against 515 on a
    Zen 5 EPYC); on an Intel Xeon with AMX the fused kernel is the faster (285 ms against 338; 509 against 625 for
    1500 tokens), and it is also the more exact (it does not round the scores to bf16). Chosen by the CPU's flags,
    not timed, so that a process's answers do not depend on a timing (docs/backends.md, "Prompt attention in bf16
    products")."""
    if device.type != "cpu" or prompt_dtype != torch.bfloat16:
        return False
    return "amx_bf16" not in (cpu_flags() if flags is None else flags)


class LlamaForward:
    """A ``LlamaForCausalLM`` pass without the module tree (see the module docstring).

    Building one fuses the model's q/k/v and gate/up weights: each group is concatenated once and
    the original ``nn.Linear`` parameters are replaced by views of the concatenation (same values,
    same memory use). transformers' forward is unaffected; saving the model afterwards with
    safetensors needs ``safe_serialization=False`` or cloned weights, since the views share storage.

    Prompts (``last_only``) may run in another dtype than decoding steps (``prompt_dtype``: bf16
    prompts over fp32 weights on CPUs that compute bf16 natively, see
    ``ragspec.backends.pytorch.loading.prompt_dtype``): the layers' tensors are then copied once
    into that dtype, the keys and values a prompt computes are stored in the cache in the weights'
    dtype (exactly: fp32 holds every bf16 value), and a prompt's last hidden state goes through the
    final norm and the output head in the weights' dtype. Steps and verify passes never run in the
    prompt dtype, so plain and speculative decoding read the same cache and compute alike.
    """

    @staticmethod
    def supports(model: PreTrainedModel) -> bool:
        """True for plain Llama models whose computation this class reproduces."""
        cfg = model.config
        rope = getattr(cfg, "rope_parameters", None) or {}
        return (
            type(model).__name__ == "LlamaForCausalLM"
            and getattr(cfg, "hidden_act", None) == "silu"
            # These recompute their rotary tables from the sequence length; the rest are static.
            and rope.get("rope_type", "default") not in ("dynamic", "longrope")
            and getattr(model.lm_head, "bias", None) is None
            # Plain float linears only (not quantized or offloaded replacements).
            and all(type(m) is nn.Linear and m.weight.is_floating_point() and m.weight.device.type != "meta"
                    for layer in model.model.layers for m in _projections(layer))
        )

    def __init__(
        self, model: PreTrainedModel, device: torch.device, dtype: torch.dtype, prompt_dtype: torch.dtype | None = None
    ) -> None:
        cfg = model.config
        self.config = cfg
        self.device = device
        self.dtype = dtype
        self.prompt_dtype = prompt_dtype or dtype
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.layers = list(inner.layers)
        if device.type == "cpu" and any(layer not in _FUSED for layer in self.layers):
            _own_memory(model)
        self.fused = [_fused(layer) for layer in self.layers]
        self.norm = inner.norm

        def uses(dt: torch.dtype) -> list[tuple[torch.Tensor, int]]:
            first = _Weights.of(self.layers[0]).to(dt, F_LINEAR)  # the model's own tensors, or a passing copy
            return [(w, len(self.layers)) for w in (first.qkv, first.o, first.gate_up, first.down)]

        prompt_uses = uses(self.prompt_dtype)
        timed = [*uses(dtype), (model.lm_head.weight, 1)]
        kernels = [pick_kernel(device, dtype, timed, (rows,)) for rows in STEP_ROWS]
        self.kernel = kernels[0]
        """Products of one-row decoding steps (and of a prompt's output head, one row)."""
        # A prompt's head product has one row (its last position): it is a step's product.
        self.prompt_kernel = pick_kernel(device, self.prompt_dtype, prompt_uses, PROMPT_ROWS)
        """Products of prompts: timed apart, since the faster kernel for a few rows need not be the faster for hundreds."""
        self.step_weights = [_weights(layer, dtype, self.kernel) for layer in self.layers]
        """Each layer's tensors as steps read them: the model's own, or a copy packed for ``kernel`` (shared by every
        forward over the model, and with prompts where they run in the same dtype and kernel)."""
        self.prompt_weights = [_weights(layer, self.prompt_dtype, self.prompt_kernel) for layer in self.layers]
        """Each layer's tensors as prompts read them: the steps', or copies in ``prompt_dtype``."""
        self.prompt_products_whole = all(rows_independent(self.prompt_kernel, w) for w, _ in prompt_uses)
        """Whether a prompt's products run over all its rows at once (the faster), which needs ``rows_independent``
        products for a prefix-cache hit to equal a cold prefill; else over each block of ``prompt``'s attention
        apart, the same blocks a hit computes again, which is exact by construction."""
        self.head = _head(model.lm_head, self.kernel)
        copies = {self.kernel: (self.step_weights, self.head)}
        for k in kernels:
            if k not in copies:
                copies[k] = ([_weights(layer, dtype, k) for layer in self.layers], _head(model.lm_head, k))
        self.step_products: list[tuple[int, Kernel, list[_Weights], torch.Tensor]] = [
            (rows, k, *copies[k]) for rows, k in zip(STEP_ROWS, kernels)]
        """Per row count of ``STEP_ROWS``: the kernel timed fastest at it, each layer's tensors and the output head as
        it reads them. Where one kernel wins for steps and another for verify passes, both copies are kept (oneDNN's
        packed weights beside the model's own: about 430 MB more for the default model)."""
        in_products = attends_in_products(device, self.prompt_dtype)
        self.prompt_attend: Attend = self._attend_in_products if in_products else self._attend
        """A prompt's attention: in bf16 matrix products for bf16 prompts on a CPU without AMX, else torch's fused
        kernel (``attends_in_products``)."""
        self.description = f"lean Llama forward ({self.kernel.name} products"
        for (_, before, _, _), (rows, kernel, _, _) in zip(self.step_products, self.step_products[1:]):
            self.description += f", {kernel.name} from {rows} rows" if kernel != before else ""
        self.description += f", prompts: {self.prompt_kernel.name}"
        self.description += "" if self.prompt_dtype == dtype else f" in {str(self.prompt_dtype).removeprefix('torch.')}"
        self.description += "" if self.prompt_products_whole else " per block"
        self.description += ", attention in bf16 products)" if in_products else ")"
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scale = attn.scaling
        self.eps = inner.norm.variance_epsilon
        # Rotary tables for every position, from the model's own rotary module (same values).
        positions = torch.arange(cfg.max_position_embeddings, device=device)[None]
        cos, sin = inner.rotary_emb(self.embed[:1][None], positions)
        self.cos, self.sin = cos[0], sin[0]  # [positions, head_dim]
        # transformers casts the tables to the activations' dtype; keep one cast per dtype that runs.
        self.rotary = {dt: (self.cos.to(dt), self.sin.to(dt)) for dt in {dtype, self.prompt_dtype}}
        self.hidden = torch.empty(0, cfg.hidden_size, device=device, dtype=dtype)
        """The last forward's final-norm hidden states (``hidden_at``), its last row at position ``hidden_end - 1``."""
        self.hidden_end = 0

    def new_cache(self, capacity: int) -> DynamicCache:
        return make_cache(self.config, capacity, self.dtype)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # torch's fused kernel; the same arithmetic as below
            return F.rms_norm(x, (x.shape[-1],), weight, self.eps)
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def __call__(self, ids: list[int], cache: DynamicCache, last_only: bool = False) -> torch.Tensor:
        if last_only:
            return self.prompt(ids, cache)
        _, kernel, weights, head = self.step_products[bisect_right(STEP_ROWS, len(ids)) - 1]
        return self._run(ids, cache, self.dtype, weights, kernel.linear, [len(ids)], 1, self._attend, head=(kernel, head))

    def prompt(
        self, ids: list[int], cache: DynamicCache, block: int = PROMPT_CHUNK, cancel: threading.Event | None = None
    ) -> torch.Tensor:
        """See ``Forward.prompt``: one forward, its products over all its rows (at least ``prompt_min_rows``, so a
        row has the same bits whatever the rows around it), or over each attention block apart where the prompt
        kernel is not row-independent (``prompt_products_whole``), its attention in blocks of queries that end where
        positions reach a multiple of ``block`` (each attends to every position up to its end, causally), in
        ``prompt_dtype``. After a cache that ends at a multiple of ``block`` it runs the same attention calls on the
        same rows as for the whole prompt. ``cancel`` is checked before each layer."""
        blocks = query_blocks(cache.get_seq_length(), len(ids), block)
        return self._run(ids, cache, self.prompt_dtype, self.prompt_weights, self.prompt_kernel.linear, blocks,
                         prompt_min_rows(), self.prompt_attend, cancel, True, per_block=not self.prompt_products_whole)

    def _run(
        self, ids: list[int], cache: DynamicCache, dt: torch.dtype, weights: list[_Weights], lin: Linear,
        blocks: list[int], min_rows: int, attend: Attend, cancel: threading.Event | None = None, last_only: bool = False,
        head: tuple[Kernel, torch.Tensor] | None = None, per_block: bool = False,
    ) -> torch.Tensor:
        """Logits of ``ids`` after the cached positions, in ``dt`` with each layer's ``weights`` and products ``lin``
        over at least ``min_rows`` rows (over each block of ``blocks`` apart if ``per_block``, else over all rows),
        attention ``attend`` in query blocks of ``blocks`` rows, the output ``head`` as its kernel reads it (None: a
        one-row step's)."""

        def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            if not per_block or len(blocks) == 1:
                return _product(lin, x, weight, bias, min_rows)
            return torch.cat([_product(lin, part, weight, bias, min_rows) for part in x.split(blocks)])

        n, past, hd = len(ids), cache.get_seq_length(), self.head_dim
        x = F.embedding(torch.tensor(ids, device=self.device), self.embed).to(dt)  # [n, hidden]
        cos, sin = (t[past : past + n] for t in self.rotary[dt])
        spans = self._spans(past, blocks)
        for i, w in enumerate(weights):
            check_cancelled(cancel)
            h = self._norm(x, w.input_norm)
            qkv = product(h, w.qkv, w.qkv_bias)
            q, k, v = (t.view(n, -1, hd).transpose(0, 1) for t in qkv.split(self.fused[i][0].sizes, -1))
            keys, values = cache.layers[i].update(self._rotate(k, cos, sin)[None], v[None])  # stored in self.dtype
            a = attend(self._rotate(q, cos, sin), keys.to(dt), values.to(dt), past, spans)
            x = x + product(a, w.o, w.o_bias)
            h = self._norm(x, w.post_norm)
            gate, up = product(h, w.gate_up, w.gate_up_bias).split(self.fused[i][1].sizes, -1)
            x = x + product(F.silu(gate) * up, w.down, w.down_bias)
        if last_only:
            x = x[-1:].to(self.dtype)
        self.hidden = self._norm(x, self.norm.weight)
        self.hidden_end = past + n
        kernel, weight = head or (self.kernel, self.head)
        return kernel.linear(self.hidden, weight, None)

    def hidden_at(self, position: int) -> torch.Tensor | None:
        """The final-norm hidden state at ``position`` if the last forward computed it (a prompt's: its last
        position only), else None; valid until the next forward. A draft head reads it
        (``ragspec.decoding.draft_head``)."""
        first = self.hidden_end - len(self.hidden)
        return self.hidden[position - first] if first <= position < self.hidden_end else None

    def _spans(self, past: int, blocks: list[int]) -> list[tuple[int, int, torch.Tensor | None]]:
        """Per block of query rows after ``past`` cached positions: its first and end positions, and its mask."""
        spans, start = [], past
        for size in blocks:
            end = start + size
            # A new position sees every cached one and the new ones up to itself.
            mask = None if size == 1 or start == 0 else torch.ones(size, end, dtype=torch.bool, device=self.device).tril(start)
            spans.append((start, end, mask))
            start = end
        return spans

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int,
        spans: list[tuple[int, int, torch.Tensor | None]],
    ) -> torch.Tensor:
        """Attention of queries ``q`` ``[heads, n, hd]`` at positions ``past..`` over ``keys``/``values``
        ``[1, kv_heads, past + n, hd]``, one call per span of query positions (``_spans``), each over the positions
        up to its end; ``[n, heads * hd]``."""
        out = [
            F.scaled_dot_product_attention(
                q[None, :, start - past : end - past], keys[:, :, :end], values[:, :, :end], attn_mask=mask,
                scale=self.scale, is_causal=mask is None and end - start > 1, enable_gqa=True,
            )  # [1, heads, end - start, hd]
            for start, end, mask in spans
        ]
        a = out[0] if len(out) == 1 else torch.cat(out, dim=2)
        return a[0].transpose(0, 1).reshape(q.shape[1], -1)

    def _attend_in_products(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int,
        spans: list[tuple[int, int, torch.Tensor | None]],
    ) -> torch.Tensor:
        """``_attend`` as two batched matrix products per span with a softmax between them: a bf16 prompt's
        attention on a CPU (``prompt_attend``).

        torch's fused CPU attention widens bf16 to fp32 tile by tile and so runs bf16 at fp32 speed, while a bf16
        ``bmm`` runs on the CPU's bf16 units: on 2 cores of an AMD EPYC with AVX512-BF16 a 750-token prompt of the
        default model took about 380 ms instead of 490 (docs/backends.md, "Prompt attention in bf16 products").
        The scores are rounded to bf16 before the softmax (which computes in fp32), the one rounding the fused
        kernel does not do, and the weights to bf16 before their product with the values, as the fused kernel
        does (it rounds its exponentials before dividing by their sum). The queries are scaled in bf16 (exact
        when the scale is a power of two, as for heads of 64) and grouped by the key head they share, so each
        product reads its keys once."""
        heads, n, hd = q.shape
        kv_heads = keys.shape[1]
        group = heads // kv_heads
        q = q * self.scale
        out = []
        for start, end, _ in spans:
            m = end - start
            rows = q[:, start - past : end - past].reshape(kv_heads, group * m, hd)
            scores = torch.bmm(rows, keys[0, :, :end].transpose(1, 2)).view(kv_heads, group, m, end)
            if m > 1:  # a position sees the block's positions up to itself, and all before the block
                scores[..., start:end] += _future_bias(m, q.device, q.dtype)
            weights = torch.softmax(scores, -1).view(kv_heads, group * m, end)
            out.append(torch.bmm(weights, values[0, :, :end]).view(heads, m, hd))
        a = out[0] if len(out) == 1 else torch.cat(out, dim=1)
        return a.transpose(0, 1).reshape(n, -1)


@functools.lru_cache(maxsize=8)
def _future_bias(m: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``[m, m]``: -inf above the diagonal (a later position of the block), 0 elsewhere. Added to scores it masks
    exactly as ``masked_fill_`` does (x + 0 is x), in a fifth of its time on a slice of bf16 scores."""
    later = torch.ones(m, m, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(m, m, dtype=dtype, device=device).masked_fill_(later, float("-inf"))


def _product(lin: Linear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, min_rows: int) -> torch.Tensor:
    """``lin(x, weight, bias)`` computed over at least ``min_rows`` rows (zero rows appended, their results dropped)."""
    n = x.shape[0]
    if n >= min_rows:
        return lin(x, weight, bias)
    return lin(F.pad(x, (0, 0, 0, min_rows - n)), weight, bias)[:n]


def make_forward(
    model: PreTrainedModel, device: torch.device, dtype: torch.dtype, prompt_dtype: torch.dtype | None = None
) -> Forward:
    """The lean pass when the model is a plain Llama, else transformers' forward (which runs prompts
    in the model's dtype, whatever ``prompt_dtype`` asks)."""
    if LlamaForward.supports(model):
        return LlamaForward(model, device, dtype, prompt_dtype)
    return HFForward(model, device)
