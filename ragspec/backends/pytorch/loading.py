"""Loading a model as transformers weights for the PyTorch back end: the default model and ``.gguf``
files de-quantized once into the cache (safetensors + config + tokenizer, a cache entry of
``ragspec.backends.models``), a local directory, or a Hugging Face id from the local hub cache.

transformers de-quantizes GGUF to an ordinary fp32 model, which takes tens of seconds, so the
result is converted once and later loads read the converted folder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from retrievers.embeddings import BF16_FLAGS, cpu_flags
from ragspec.backends.pytorch.forward import PROMPT_CHUNK
from ragspec.backends.models import (
    COMPLETE_MARKER,
    DEFAULT_MODEL,
    default_gguf_path,
    entry_folder,
    load_tokenizer,
    model_label,
    not_found_message,
    write_entry,
)
from ragspec.engine.results import ModelLoadError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready for decoding, with its tokenizer and where it came from."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    device: torch.device
    dtype: torch.dtype
    prompt_dtype: torch.dtype | None = None
    """The dtype prompts are evaluated in, when it is not ``dtype`` (``prompt_dtype``); decoding steps run in ``dtype``."""
    prompt_chunk: int = PROMPT_CHUNK
    """Prompt positions per block of attention queries, counted from position 0
    (``ragspec.backends.pytorch.forward.PROMPT_CHUNK``; transformers' forward runs one forward per block); a
    prefix-cache hit reuses whole blocks only."""
    backend: ClassVar[str] = "torch"
    """What runs it (``ragspec.backends``); a GGUF file in llama.cpp is a ``LlamaCppModel``."""

    def __post_init__(self) -> None:
        if isinstance(self.prompt_chunk, bool) or not isinstance(self.prompt_chunk, int) or self.prompt_chunk < 1:
            raise ValueError(f"prompt_chunk must be a positive number of positions, got {self.prompt_chunk!r}")

    @property
    def context_length(self) -> int:
        """Longest sequence (prompt + generated tokens) the model accepts."""
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def verify_matches_steps(self) -> bool:
        """Whether a verify pass of several rows computes each row as a one-row decoding step does (to float
        ties), which lossless speculation needs; the generator drafts nothing where it does not.

        False for bf16 or fp16 decoding steps on a CPU: torch's CPU products and attention round a row
        differently with the number of rows around it, and at 8 bits of mantissa that moves greedy tokens
        (measured on the default model, ``dtype="bfloat16"``: the oracle drafter, which drafts plain decoding's
        own answer, kept 14% of its tokens instead of all; docs/backends.md, "Tried and not kept: decoding steps
        in bf16"). fp32 steps, with prompts in bf16 or not, are True. Not measured on CUDA, taken as True."""
        return not (self.device.type == "cpu" and self.dtype in (torch.bfloat16, torch.float16))


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; anything else is passed to ``torch.device``."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'") from e


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


BF16_PROMPTS = "bf16-prompts"
"""The dtype setting that evaluates prompts in bf16 over fp32 weights and decoding steps, on a CPU that
computes bf16 natively (elsewhere it is fp32): what ``"auto"`` does on a CPU, see ``prompt_dtype``."""


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """The weights' dtype, in which decoding steps run: ``"auto"`` is bf16 on CUDA and fp32 on CPU (where its
    prompts may run in bf16, as ``"bf16-prompts"``'s: ``prompt_dtype``); ``"bf16-prompts"`` is fp32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype == BF16_PROMPTS:
        return torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use 'auto', {BF16_PROMPTS!r} or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def prompt_dtype(dtype: str | torch.dtype, device: torch.device, flags: frozenset[str] | None = None) -> torch.dtype | None:
    """bf16 for prompts where ``dtype`` is ``"auto"`` or ``"bf16-prompts"``, ``device`` a CPU, and the CPU computes bf16
    natively (AMX or AVX512-BF16: ``retrievers.embeddings.BF16_FLAGS`` in ``flags``, by default this CPU's,
    as the embeddings decide); None (prompts in the weights' dtype) otherwise.

    A prompt is compute-bound and runs several times faster in bf16 there, while a decoding step is
    memory-bound and was the faster in fp32 (docs/backends.md, "bf16 prompts"), so steps stay fp32
    and plain and speculative decoding stay exactly as in fp32 after the same prompt; a prefix-cache hit
    gives a cold prefill's logits bit for bit (a prompt's attention runs in blocks aligned to positions:
    ``ragspec.backends.pytorch.forward.Forward.prompt``). So it is what ``"auto"`` does on such a CPU: 85 of the
    326 turns counted against the hand labels (``benchmarks/dtype_quality.py``) answer otherwise than in fp32,
    7 of those right in bf16 only and 4 in fp32 only, which passes the rule fixed before the count
    (docs/backends.md, "bf16 prompts" and "Prompt attention in bf16 products"). ``dtype="float32"`` keeps prompts in fp32 (the reference for
    transformers' fp32 output).
    """
    if dtype not in ("auto", BF16_PROMPTS) or device.type != "cpu":
        return None
    return torch.bfloat16 if (cpu_flags() if flags is None else flags) & BF16_FLAGS else None


def load_torch_model(
    name: str = DEFAULT_MODEL, *, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto"
) -> LoadedModel:
    """``name`` as transformers weights (the PyTorch back end's model; ``ragspec.backends.load_model``
    picks the back end): the default model and ``.gguf`` files de-quantized once into the cache, a
    local directory, or a Hugging Face id from the local hub cache."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    label = model_label(name)
    if name == DEFAULT_MODEL:
        source = _converted_gguf(default_gguf_path())
    elif name.endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        source = _converted_gguf(path)
    else:
        source = name
    tokenizer = load_tokenizer(source, label)
    try:  # a hub id loads only from the local cache: nothing is downloaded at run time
        with _no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dt, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(not_found_message(name)) from e
    model.to(dev).eval()
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or tokenizer.eos_token_id
    return LoadedModel(model=model, tokenizer=tokenizer, name=label, device=dev, dtype=dt,
                       prompt_dtype=prompt_dtype(dtype, dev))


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' per-tensor "Loading weights" bar off while a model loads from local files (under a second for
    the default model), restored after: it would print in the middle of whatever the caller shows, such as the
    demo's first answer, which is where the model loads."""
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def model_folder(name: str = DEFAULT_MODEL) -> Path:
    """A folder of weights, config and tokenizer for ``name``, as servers such as vLLM load it.

    The default model and ``.gguf`` files are converted once into the cache (safetensors, with the
    architecture named in ``config.json``); a local folder is returned as it is.
    """
    if name == DEFAULT_MODEL:
        return _converted_gguf(default_gguf_path())
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return _converted_gguf(path)
    return path


def _converted_gguf(gguf: Path) -> Path:
    """Return a directory holding ``gguf`` converted to safetensors, converting it on first use.

    The entry is keyed by the file's size and modification time plus the transformers version, and
    written to a temporary sibling directory that is renamed into place only when complete, so an
    interrupted conversion never leaves an entry that a later load would trust.
    """
    target = entry_folder("models", gguf)
    if (target / COMPLETE_MARKER).is_file():
        return target
    logger.warning("converting %s to safetensors once (about 30 s); cached in %s", gguf.name, target)
    write_entry(target, gguf, _convert_gguf)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    from safetensors.torch import save_file

    directory, filename = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    except Exception as e:  # gguf raises a variety of errors for damaged files
        raise ModelLoadError(f"could not read GGUF file {gguf}: {e}") from e
    # save_pretrained refuses GGUF-loaded models, so write the pieces ourselves. Tied weights
    # (lm_head == embed_tokens) are stored once; from_pretrained re-ties them from the config.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    # transformers leaves a GGUF-loaded config without architectures; servers such as vLLM pick
    # the model class by it.
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Sanity check: a converted config must load; a failure here is a bug, not a user error.
    AutoConfig.from_pretrained(out)
