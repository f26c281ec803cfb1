"""Back ends under the decoding loop (see ``ragspec.backends.base`` for the seam).

``choose_backend`` resolves ``backend="auto"``; ``make_backend`` builds a generator's own back end
(forward + KV cache) over a loaded model, whose weights stay shared.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Union

from ragspec.backends.base import Backend, BackendUnavailableError, KVCache
from ragspec.backends.models import DEFAULT_MODEL, DEFAULT_MODEL_NAME, default_gguf_path
from ragspec.engine.results import ModelLoadError

if TYPE_CHECKING:
    import torch

    from ragspec.backends.llamacpp import LlamaCppModel, LlamaCppSettings
    from ragspec.backends.pytorch.loading import LoadedModel

# The PyTorch and llama.cpp modules are imported where they are used: vLLM's worker imports this
# package (for ``ragspec.backends.vllm.proposer``) in an environment without llama.cpp or
# retrievers' dependencies.


AUTO_LLAMACPP_MIN_PARAMETERS = 1_000_000_000
"""``"auto"`` runs a GGUF file on llama.cpp from this many parameters, and on PyTorch below.

Chosen by end-to-end time on the RAG workload (long prompts, short answers), where PyTorch's
fp32 prefill outweighs llama.cpp's faster steps on the default 135M model, and by memory from a
billion parameters on; the measurements are in docs/backends.md ("The default back end")."""

BACKENDS = ("auto", "torch", "llamacpp")
"""What can run a local target model (``choose_backend`` resolves ``"auto"``)."""


def check_backend(name: str) -> str:
    """``name`` if it is one of ``BACKENDS``, else a ``ValueError`` naming them."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")
    return name


TargetModel = Union["LoadedModel", "LlamaCppModel"]
"""A loaded target model: transformers weights (``LoadedModel``) or a GGUF file in llama.cpp."""

__all__ = ["AUTO_LLAMACPP_MIN_PARAMETERS", "BACKENDS", "Backend", "BackendUnavailableError", "KVCache", "TargetModel",
           "check_backend", "choose_backend", "load_model", "make_backend"]


def is_gguf_name(model: str) -> bool:
    """``"default"`` (a GGUF file in a package) or a path ending in ``.gguf``."""
    return model == DEFAULT_MODEL or model.lower().endswith(".gguf")


def choose_backend(model: str, backend: str = "auto", device: str | torch.device = "auto", dtype: str | torch.dtype = "auto") -> str:
    """``"torch"`` or ``"llamacpp"`` for loading ``model`` by name; raises when the choice cannot work.

    ``"auto"`` is llama.cpp for GGUF files of at least ``AUTO_LLAMACPP_MIN_PARAMETERS``
    parameters when llama-cpp-python is installed, the device is the CPU and no dtype is asked
    for (an explicit dtype asks for the de-quantized PyTorch weights); otherwise PyTorch. The
    default model (135M) therefore runs on PyTorch unless ``"llamacpp"`` is asked for.
    """
    from ragspec.backends import llamacpp
    from ragspec.backends.pytorch.loading import resolve_device

    check_backend(backend)
    if backend == "torch":
        return "torch"
    if backend == "llamacpp":
        if not is_gguf_name(model):
            raise ModelLoadError(
                f"backend='llamacpp' runs GGUF files and {model!r} is not one: pass a .gguf file or 'default', "
                "or use backend='torch' for a transformers model"
            )
        if not (device == "auto" or str(device) == "cpu"):
            raise ValueError(f"the llama.cpp back end runs on the CPU: use device='cpu' or 'auto', or backend='torch' for {device}")
        if dtype != "auto":
            raise ValueError(
                f"the llama.cpp back end computes with the GGUF file's own quantization: leave dtype='auto', "
                f"or use backend='torch' for {dtype}"
            )
        if not llamacpp.available():
            llamacpp._lib()  # raises the error that names the install command
        return "llamacpp"
    use_llamacpp = (
        is_gguf_name(model) and dtype == "auto" and resolve_device(device).type == "cpu" and llamacpp.available()
        and gguf_parameters(model) >= AUTO_LLAMACPP_MIN_PARAMETERS
    )
    return "llamacpp" if use_llamacpp else "torch"


def gguf_parameters(model: str) -> int:
    """Parameters of a GGUF model (``"default"`` or a path), from its tensor table; 0 when unreadable."""

    try:
        path = default_gguf_path() if model == DEFAULT_MODEL else Path(model).expanduser()
        return _tensor_elements(str(path.resolve()), path.stat().st_mtime_ns)
    except (OSError, ValueError, ModelLoadError):
        return 0  # loading it reports the problem


@functools.lru_cache(maxsize=32)
def _tensor_elements(path: str, mtime_ns: int) -> int:
    """Sum of the tensor shapes in a GGUF file's header (reads only the header; ``gguf.GGUFReader``
    takes seconds on a 49k-token vocabulary)."""
    import struct

    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
    with open(path, "rb") as f:
        def read(fmt: str) -> int:
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def skip(kind: int) -> None:
            if kind == 8:  # string
                f.seek(read("Q"), 1)
            elif kind == 9:  # array
                item, count = read("I"), read("Q")
                if item in scalar:
                    f.seek(scalar[item] * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                f.seek(scalar[kind], 1)

        if f.read(4) != b"GGUF" or read("I") < 2:
            return 0
        n_tensors, n_kv = read("Q"), read("Q")
        for _ in range(n_kv):
            f.seek(read("Q"), 1)  # key
            skip(read("I"))
        total = 0
        for _ in range(n_tensors):
            f.seek(read("Q"), 1)  # name
            elements = 1
            for _ in range(read("I")):
                elements *= read("Q")
            total += elements
            f.seek(12, 1)  # type (u32), offset (u64)
        return total


def make_backend(target: TargetModel) -> Backend:
    """A new back end (its own KV cache, or llama.cpp context) over ``target``'s shared weights."""
    from ragspec.backends.pytorch.loading import LoadedModel

    if isinstance(target, LoadedModel):
        from ragspec.backends.pytorch import TorchBackend

        return TorchBackend(target)
    from ragspec.backends.llamacpp import LlamaCppBackend, LlamaCppModel

    if isinstance(target, LlamaCppModel):
        return LlamaCppBackend(target)
    raise TypeError(f"expected a LoadedModel or a LlamaCppModel, got {type(target).__name__}")


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    backend: str = "auto",
    llamacpp: LlamaCppSettings | None = None,
) -> LoadedModel | LlamaCppModel:
    """Load a causal LM and its tokenizer.

    ``name`` is ``"default"`` (the embedded SmolLM2-135M-Instruct), a path to a ``.gguf`` file, a
    local model directory, or a Hugging Face model id (which transformers may fetch if it is not
    in the local hub cache; set ``HF_HUB_OFFLINE=1`` to forbid that).

    ``backend`` picks what runs it (``ragspec.backends.choose_backend``): ``"torch"`` returns a
    ``LoadedModel`` (transformers weights; a GGUF file is de-quantized once into the cache),
    ``"llamacpp"`` a ``LlamaCppModel`` (the GGUF file itself, with ``llamacpp`` settings), and
    ``"auto"`` llama.cpp for GGUF files of a billion parameters or more on a CPU when
    llama-cpp-python is installed, PyTorch otherwise (the default model included).
    """
    if choose_backend(name, backend, device, dtype) == "llamacpp":
        from ragspec.backends.llamacpp import load_llamacpp

        if name == DEFAULT_MODEL:
            return load_llamacpp(default_gguf_path(), DEFAULT_MODEL_NAME, llamacpp)
        return load_llamacpp(name, None, llamacpp)
    from ragspec.backends.pytorch.loading import load_torch_model

    return load_torch_model(name, device=device, dtype=dtype)
