"""Target and draft forwards on the decoding hot path: a lean Llama pass, else transformers' own.

Why a second implementation of the same arithmetic: speculative decoding lives on forwards over
a few rows (a pending token and a short draft), and there transformers' module tree and its
default matrix products were slow on a CPU; ``LlamaForward`` is cheaper for both plain steps
and verify passes. The measurements behind this are in docs/design.md ("Measurements").

``LlamaForward`` replays a ``LlamaForCausalLM``'s computation on the model's own weights (no
second copy): RMSNorm, rotary embedding, grouped-query SDPA attention, SiLU MLP, the same
operations in the same order as transformers' Llama code, with products through the faster of
oneDNN's linear and ``F.linear`` (MKL) on a CPU in fp32, timed on the model's own weights when the
pass is built (``pick_linear``), and ``F.linear`` elsewhere. Products that read the same input are fused: q/k/v is one
product and gate/up another (7 weight streams per layer become 4). Logits agree with
transformers' to float rounding (tests compare them, and greedy outputs against transformers'
``generate``); ragspec's plain and speculative decoding both use this pass, so the lossless
guarantee is unaffected. Other architectures use ``HFForward`` (transformers' forward with a
preallocated cache). ``Forward`` is what the PyTorch back end (``ragspec.backends.pytorch``)
runs; the generator and the draft model call that back end through ``ragspec.backends.base.Backend``.
"""
from __future__ import annotations

import inspect
import time
import weakref
from collections.abc import Sequence
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ragspec.backends.pytorch.kv_cache import make_cache

Linear = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


class Forward(Protocol):
    """Runs the model on ``ids`` after the positions in ``cache`` and appends them to it."""

    description: str
    """Which implementation runs (shown in benchmark reports)."""

    def __call__(self, ids: list[int], cache: DynamicCache, last_only: bool = False) -> torch.Tensor:
        """Logits ``[len(ids), vocab]`` (``[1, vocab]`` with ``last_only``)."""
        ...

    def new_cache(self, capacity: int) -> DynamicCache:
        """An empty cache with room for ``capacity`` positions (grown when exceeded)."""
        ...


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def pick_linear(device: torch.device, dtype: torch.dtype, weights: Sequence[tuple[torch.Tensor, int]] = ()) -> Linear:
    """``F.linear``; for fp32 on a CPU where torch was built with oneDNN, the faster of oneDNN's
    linear and ``F.linear`` (MKL) on ``weights`` (each with how often one forward uses it).

    Which is faster depends on the CPU, so it is timed at run time (``fastest_linear``): on 2 cores
    of an AMD EPYC MKL's products with few rows were about half as fast as oneDNN's, on an Intel
    Xeon with AMX MKL's were the faster (docs/backends.md, "The PyTorch step per CPU"). Without
    ``weights`` oneDNN's is taken where it exists. Both compute the same products to float rounding.
    """
    candidates: list[Linear] = [F.linear]
    if device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available():
        try:
            _onednn_linear(torch.ones(2, 4), torch.ones(3, 4), None)
            candidates.insert(0, _onednn_linear)
        except (AttributeError, RuntimeError):  # a build without the op
            pass
    if len(candidates) == 1 or not weights:
        return candidates[0]
    key = (str(device), dtype, tuple((tuple(w.shape), uses) for w, uses in weights))
    if key not in _PICKED:
        _PICKED[key] = fastest_linear(candidates, weights)
    return _PICKED[key]


_PICKED: dict[tuple[object, ...], Linear] = {}
"""The linear chosen per device, dtype and weight shapes: timed once per process."""


def fastest_linear(
    candidates: Sequence[Linear], weights: Sequence[tuple[torch.Tensor, int]], rows: Sequence[int] = (1, 5), rounds: int = 2
) -> Linear:
    """The candidate whose products over ``weights`` (each counted ``uses`` times) with ``rows`` input
    rows (a plain step, a verify of 4 drafted tokens) take least time, in ``rounds`` interleaved
    rounds after one round of warm-up."""
    inputs = {(w.shape[1], r): torch.randn(r, w.shape[1], dtype=w.dtype, device=w.device) for w, _ in weights for r in rows}
    spent = [0.0] * len(candidates)
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            for i, linear in enumerate(candidates):
                for w, uses in weights:
                    for r in rows:
                        start = time.perf_counter()
                        linear(inputs[w.shape[1], r], w, None)
                        if round_:
                            spent[i] += uses * (time.perf_counter() - start)
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

    def __call__(self, ids: list[int], cache: DynamicCache, last_only: bool = False) -> torch.Tensor:
        x = torch.tensor([ids], device=self.device)
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if last_only:
            kwargs["logits_to_keep"] = 1
        return self.model(input_ids=x, **kwargs).logits[0]


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


class LlamaForward:
    """A ``LlamaForCausalLM`` pass without the module tree (see the module docstring).

    Building one fuses the model's q/k/v and gate/up weights: each group is concatenated once and
    the original ``nn.Linear`` parameters are replaced by views of the concatenation (same values,
    same memory use). transformers' forward is unaffected; saving the model afterwards with
    safetensors needs ``safe_serialization=False`` or cloned weights, since the views share storage.
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

    def __init__(self, model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> None:
        cfg = model.config
        self.config = cfg
        self.device = device
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.layers = list(inner.layers)
        if device.type == "cpu" and any(layer not in _FUSED for layer in self.layers):
            _own_memory(model)
        self.fused = [_fused(layer) for layer in self.layers]
        self.norm = inner.norm
        self.head = model.lm_head.weight
        (qkv, gate_up), first = self.fused[0], self.layers[0]
        products = [(w, len(self.layers)) for w in (qkv.weight, first.self_attn.o_proj.weight, gate_up.weight,
                                                     first.mlp.down_proj.weight)]
        self.linear = pick_linear(device, dtype, [*products, (self.head, 1)])
        self.description = f"lean Llama forward ({'oneDNN' if self.linear is _onednn_linear else 'F.linear'} products)"
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scale = attn.scaling
        self.eps = inner.norm.variance_epsilon
        # Rotary tables for every position, from the model's own rotary module (same values).
        positions = torch.arange(cfg.max_position_embeddings, device=device)[None]
        cos, sin = inner.rotary_emb(self.embed[:1][None], positions)
        self.cos, self.sin = cos[0], sin[0]  # [positions, head_dim]

    def new_cache(self, capacity: int) -> DynamicCache:
        return make_cache(self.config, capacity)

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
        n, past, lin, hd = len(ids), cache.get_seq_length(), self.linear, self.head_dim
        x = F.embedding(torch.tensor(ids, device=self.device), self.embed)  # [n, hidden]
        cos, sin = self.cos[past : past + n], self.sin[past : past + n]
        # A new position sees every cached one and the new ones up to itself.
        mask = None if n == 1 or past == 0 else torch.ones(n, past + n, dtype=torch.bool, device=self.device).tril(past)
        for i, (layer, (qkv, gate_up)) in enumerate(zip(self.layers, self.fused)):
            att = layer.self_attn
            h = self._norm(x, layer.input_layernorm.weight)
            q, k, v = (t.view(n, -1, hd).transpose(0, 1) for t in lin(h, qkv.weight, qkv.bias).split(qkv.sizes, -1))
            keys, values = cache.layers[i].update(self._rotate(k, cos, sin)[None], v[None])
            a = F.scaled_dot_product_attention(
                self._rotate(q, cos, sin)[None], keys, values, attn_mask=mask, scale=self.scale,
                is_causal=n > 1 and past == 0, enable_gqa=True,
            )
            x = x + lin(a[0].transpose(0, 1).reshape(n, -1), att.o_proj.weight, att.o_proj.bias)
            h = self._norm(x, layer.post_attention_layernorm.weight)
            gate, up = lin(h, gate_up.weight, gate_up.bias).split(gate_up.sizes, -1)
            x = x + lin(F.silu(gate) * up, layer.mlp.down_proj.weight, layer.mlp.down_proj.bias)
        if last_only:
            x = x[-1:]
        return lin(self._norm(x, self.norm.weight), self.head, None)


def make_forward(model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> Forward:
    """The lean pass when the model is a plain Llama, else transformers' forward."""
    if LlamaForward.supports(model):
        return LlamaForward(model, device, dtype)
    return HFForward(model, device)
