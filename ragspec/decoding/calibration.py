"""Verify-cost calibrations cached on disk, per model and machine.

A ``SpeculativeGenerator`` times about 30 target forwards when it is built, so that its policy
starts from real verify costs (see ``ragspec.engine.policy``). Those timings depend on the model and the
machine, not on the request, so they are stored once in a folder the caller names (the generator's
is ``calibration`` under ``retrievers.cache.cache_root()``) and read back by the next generator of the same model on the same machine, which then starts at once.

A file is named by a hash of its key and holds the key itself, so a read checks the whole key
(model name, a fingerprint of the weights, device, dtype, forward implementation, torch version,
thread count, CPU or GPU model, and what was timed). A file that is missing, unreadable, not
JSON, written for another key or holding implausible numbers (a verify pass timed at more than ``MAX_RELATIVE``
plain steps: taken while the machine was busy) is ignored, and the generator
measures again and overwrites it; nothing here is ever unpickled. Delete the folder to force a
new measurement (e.g. after a calibration taken while the machine was busy).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

import torch

from ragspec.backends import Backend, TargetModel
from ragspec.backends.pytorch.loading import LoadedModel

logger = logging.getLogger(__name__)

FORMAT = 1
"""Bump when the meaning of a stored calibration changes; older files are then ignored."""


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A cheap identity of a model's weights: every tensor's name, shape and dtype, and 64 of its values.

    Reading every weight would cost as much as the calibration it guards; sampled values tell apart
    two checkpoints of one architecture (or two random initialisations) in practice.
    """
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            flat = tensor.detach().reshape(-1)
            step = max(1, flat.numel() // 64)
            sample = flat[::step][:64].to("cpu", torch.float64).numpy().tobytes()
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
            digest.update(sample)
    return digest.hexdigest()


@cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _device_model(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model()


MAX_RELATIVE = 8.0
"""A stored verify cost above this many plain steps is implausible: the calibration is measured again."""

LENGTHS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
"""Draft lengths timed (those up to the generator's ``max_draft``); the policy interpolates between them."""


@torch.inference_mode()
def verify_costs(lm: TargetModel, backend: Backend, max_draft: int, context: int, folder: Path) -> dict[int, float]:
    """Seconds of a verify forward by drafted tokens after ``context`` tokens: read from ``folder`` when
    this model and machine were timed before, else timed now (about 30 forwards) and stored there."""
    lengths = tuple(k for k in LENGTHS if k <= max_draft and k + 2 <= backend.context_length)
    context = min(context, backend.context_length - max(lengths) - 1)  # stay inside the position limit
    key = calibration_key(lm, backend.description, lengths, context)
    cached = load(key, folder)
    if cached is not None:
        return cached
    cache = backend.new_cache(context + max(lengths) + 1)
    backend.forward([0] * context, cache, last_only=True)
    seconds: dict[int, float] = {}
    for k in lengths:
        times = []
        for _ in range(3):  # the first run of a shape pays one-off set-up; keep the fastest
            start = time.perf_counter()
            backend.forward([0] * (k + 1), cache)
            times.append(time.perf_counter() - start)
            cache.crop(-(k + 1))
        seconds[k] = min(times)
    save(key, seconds, folder)
    return seconds


def calibration_key(lm: TargetModel, forward: str, lengths: tuple[int, ...], context: int) -> dict[str, Any]:
    """Everything a stored calibration must match to be reused."""
    return {
        "format": FORMAT,
        "model": lm.name,
        # A GGUF file run by llama.cpp is identified by its path, size and modification time.
        "weights": weights_fingerprint(lm.model) if isinstance(lm, LoadedModel) else lm.fingerprint,
        "device": str(lm.device),
        "device_model": _device_model(lm.device),
        "dtype": str(lm.dtype),
        "forward": forward,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "lengths": list(lengths),
        "context": context,
    }


def _path(key: dict[str, Any], folder: Path) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return folder / f"{digest}.json"


def load(key: dict[str, Any], folder: Path) -> dict[int, float] | None:
    """The seconds per draft length stored in ``folder`` for ``key``, or ``None`` when there is no valid entry."""
    path = _path(key, folder)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        logger.warning("ignoring unreadable calibration cache %s (%s); measuring again", path, e)
        return None
    seconds = _valid(data, key)
    if seconds is None:
        logger.warning("ignoring calibration cache %s: not written for this model and machine; measuring again", path)
    return seconds


def _valid(data: object, key: dict[str, Any]) -> dict[int, float] | None:
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("seconds"), dict):
        return None
    seconds: dict[int, float] = {}
    for k, v in data["seconds"].items():
        if not isinstance(k, str) or not k.isdigit() or isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if not (math.isfinite(v) and 0 < v < 3600):
            return None
        seconds[int(k)] = float(v)
    if sorted(seconds) != sorted(key["lengths"]):
        return None
    # A verify pass reads the weights once, as a plain step does: one timed at many plain steps was measured while
    # other work held the CPU (seen: 160 ms against 12 for a tiny model), and would keep drafting off for good.
    return seconds if max(seconds.values()) <= MAX_RELATIVE * seconds[0] else None


def save(key: dict[str, Any], seconds: dict[int, float], folder: Path) -> None:
    """Store ``seconds`` for ``key`` in ``folder`` (atomically; a cache that cannot be written is only logged)."""
    path = _path(key, folder)
    payload = json.dumps({"key": key, "seconds": {str(k): v for k, v in sorted(seconds.items())}}, indent=1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(payload)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        logger.warning("could not store the calibration in %s (%s); the next start measures again", path, e)
