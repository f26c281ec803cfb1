"""The draft model vLLM runs beside the target for the hybrid proposer: found, or built.

Runs on ragspec's side (``ragspec serve --engine vllm --draft-model DIR``, the tests, the
benchmark), never in vLLM's worker.

- ``draft_folder(name)``: a model folder as ``ragspec.backends.pytorch.loading.model_folder`` finds
  it, or ``WEAK_DRAFT`` (``"weak"``): the default model cut to its first ``WEAK_LAYERS`` layers, a
  deliberately poor draft of the same tokenizer for tests and benchmarks, built once into ragspec's
  cache folder (``retrievers.cache``; a few seconds, ~120 MB).

The folder is checked before vLLM starts by ``ragspec.backends.vllm.server.check_draft_folder``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

WEAK_DRAFT = "weak"
"""The ``--draft-model`` name of the truncated default model."""
WEAK_LAYERS = 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")
COMPLETE_MARKER = "ragspec-complete.json"


def draft_folder(name: str) -> Path:
    """The folder of draft model ``name``: ``WEAK_DRAFT``, ``"default"``, a ``.gguf`` file or a folder."""
    if name == WEAK_DRAFT:
        return weak_draft_folder()
    from ragspec.backends.pytorch.loading import model_folder

    return model_folder(name)


def weak_draft_folder(layers: int = WEAK_LAYERS) -> Path:
    """The default model's first ``layers`` layers (with its embeddings, final norm and head), cached."""
    from ragspec.backends.pytorch.loading import model_folder
    from retrievers.cache import cache_root, publish_folder

    source = model_folder("default")
    target = cache_root() / "models" / f"{source.name}-first{layers}layers"
    if not (target / COMPLETE_MARKER).is_file():
        publish_folder(target, COMPLETE_MARKER, lambda out: _truncate(source, out, layers))
    return target


def _truncate(source: Path, out: Path, layers: int) -> None:
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    if not 1 <= layers < int(config["num_hidden_layers"]):
        raise ValueError(f"layers must be in [1, {config['num_hidden_layers']}), got {layers}")
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = {}
    for file in sorted(source.glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers:
                weights[name] = tensor.contiguous()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    (out / COMPLETE_MARKER).write_text(json.dumps({"source": str(source), "layers": layers}))
