"""Writing a transformers Llama as a GGUF file that llama.cpp runs, and quantizing it with llama.cpp.

For tests and benchmarks that need a GGUF file of a model made here (a tiny random Llama, a
~1B-parameter random Llama in the default model's vocabulary): neither the ``gguf`` package nor
llama-cpp-python ships llama.cpp's ``convert_hf_to_gguf.py`` or the ``llama-quantize`` binary, so
this writes the file with ``gguf.GGUFWriter`` (the same tensor names, metadata and q/k row order
as ``convert_hf_to_gguf.py`` for plain Llama models) and quantizes through llama.cpp's own
``llama_model_quantize``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaForCausalLM

QUANT_TYPES = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_S": 14, "Q4_K_M": 15, "Q6_K": 18, "IQ4_NL": 25}
"""``llama_ftype`` values of the quantizations ``quantize`` accepts."""


def _permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' rotary halves -> GGUF's interleaved pairs (``convert_hf_to_gguf.py``'s ``permute``)."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _tensors(model: LlamaForCausalLM, dtype: type) -> dict[str, np.ndarray]:
    cfg = model.config
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads

    def arr(t: torch.Tensor, keep_f32: bool = False) -> np.ndarray:
        return t.detach().to(torch.float32).cpu().numpy().astype(np.float32 if keep_f32 else dtype)

    inner = model.model
    out = {"token_embd.weight": arr(inner.embed_tokens.weight), "output_norm.weight": arr(inner.norm.weight, True)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = arr(model.lm_head.weight)
    for i, layer in enumerate(inner.layers):
        att, mlp = layer.self_attn, layer.mlp
        out |= {
            f"blk.{i}.attn_norm.weight": arr(layer.input_layernorm.weight, True),
            f"blk.{i}.attn_q.weight": _permute(arr(att.q_proj.weight), n_head),
            f"blk.{i}.attn_k.weight": _permute(arr(att.k_proj.weight), n_kv),
            f"blk.{i}.attn_v.weight": arr(att.v_proj.weight),
            f"blk.{i}.attn_output.weight": arr(att.o_proj.weight),
            f"blk.{i}.ffn_norm.weight": arr(layer.post_attention_layernorm.weight, True),
            f"blk.{i}.ffn_gate.weight": arr(mlp.gate_proj.weight),
            f"blk.{i}.ffn_up.weight": arr(mlp.up_proj.weight),
            f"blk.{i}.ffn_down.weight": arr(mlp.down_proj.weight),
        }
    return out


def write_llama_gguf(
    model: LlamaForCausalLM,
    path: str | Path,
    *,
    tokenizer_from: str | Path | None = None,
    byte_vocab: Sequence[str] | None = None,
    merges: Sequence[str] = (),
    eos_token_id: int | None = None,
    f16: bool = True,
    name: str = "ragspec-export",
) -> Path:
    """Write ``model`` (a plain ``LlamaForCausalLM``) as a GGUF file llama.cpp loads.

    The vocabulary comes from one of: ``tokenizer_from``, an existing GGUF file whose
    ``tokenizer.*`` entries are copied (the model must use that vocabulary); or ``byte_vocab``
    and ``merges``, a byte-level BPE vocabulary (GPT-2 style; llama.cpp needs at least one
    merge) whose ``eos_token_id`` entry is a control token. Weights are written as F16 (``f16``) or F32;
    norms stay F32.
    """
    import gguf

    if (tokenizer_from is None) == (byte_vocab is None):
        raise ValueError("pass exactly one of tokenizer_from (a GGUF file) and byte_vocab")
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    if tokenizer_from is not None:
        reader = gguf.GGUFReader(str(tokenizer_from))
        for key, field in reader.fields.items():
            if key.startswith("tokenizer."):
                sub_type = field.types[1] if len(field.types) > 1 else None
                writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    else:
        assert byte_vocab is not None
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(list(byte_vocab))
        writer.add_token_types([gguf.TokenType.CONTROL if i == eos_token_id else gguf.TokenType.NORMAL
                                for i in range(len(byte_vocab))])
        writer.add_token_merges(list(merges))
        if eos_token_id is not None:
            writer.add_eos_token_id(eos_token_id)
    for tensor_name, data in _tensors(model, np.float16 if f16 else np.float32).items():
        writer.add_tensor(tensor_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize(source: str | Path, target: str | Path, kind: str, threads: int = 0) -> Path:
    """Quantize a F16/F32 GGUF file with llama.cpp (``kind``: one of ``QUANT_TYPES``)."""
    from ragspec.backends.llamacpp import _lib

    if kind not in QUANT_TYPES:
        raise ValueError(f"unknown quantization {kind!r}: use one of {', '.join(QUANT_TYPES)}")
    lib = _lib()
    params = lib.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[kind]
    params.nthread = threads
    status = lib.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {kind} (status {status})")
    return Path(target)


def cached_quantizations(folder: Path, stem: str, kinds: Sequence[str], write_source: Callable[[Path], None],
                         keep_source: bool = False) -> dict[str, Path]:
    """``<folder>/<stem>.<kind>.gguf`` for each of ``kinds``, quantized once from a source GGUF file that
    ``write_source(path)`` writes (F16 or F32) when one is missing; each file appears whole (renamed
    into place). The source is deleted afterwards unless ``keep_source``."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {kind: folder / f"{stem}.{kind}.gguf" for kind in kinds}
    missing = [kind for kind, path in files.items() if not path.is_file()]
    if not missing:
        return files
    source = folder / f"{stem}.source.gguf"
    if not source.is_file():
        print(f"writing {source} ...", flush=True)
        tmp = source.with_suffix(".tmp")
        write_source(tmp)
        tmp.rename(source)
    for kind in missing:
        print(f"quantizing to {kind} ...", flush=True)
        tmp = files[kind].with_suffix(".tmp")
        quantize(source, tmp, kind)
        tmp.rename(files[kind])
    if not keep_source:
        source.unlink()
    return files
