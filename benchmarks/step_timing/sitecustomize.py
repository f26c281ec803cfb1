"""Per-step timers inside vLLM's processes: which of the runner's, drafters' and scheduler's methods take how long.

Put this folder on ``PYTHONPATH`` and name an output folder in ``STEP_TIMING_OUT``; every vLLM process
started then (``benchmarks/vllm_bench.py`` starts them with the caller's environment) wraps the
methods in ``TARGETS`` with ``time.perf_counter_ns`` when their module is imported, and writes, per
process, every step's nanoseconds by method to ``STEP_TIMING_OUT/<label>-<pid>.json`` (a step: from
one ``execute_model`` to the next in a worker, one ``schedule`` in the engine core; rewritten every
10 steps). ``python benchmarks/step_timing/table.py FOLDER`` prints the medians. Without
``STEP_TIMING_OUT`` it does nothing::

    STEP_TIMING_OUT=/tmp/steps PYTHONPATH=$PWD:$PWD/benchmarks/step_timing python benchmarks/vllm_bench.py \\
        --methods vllm_ragspec,vllm_hybrid --clients 4 --questions 3 --open-ended 3 --max-tokens 64 \\
        --draft-model weak --vllm-arg=-O0
    python benchmarks/step_timing/table.py /tmp/steps
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time
from typing import Any

TARGETS: dict[str, dict[str, list[str]]] = {
    "vllm.v1.worker.gpu_model_runner": {"GPUModelRunner": [
        "execute_model", "sample_tokens", "_update_states", "_prepare_inputs", "_build_attention_metadata",
        "_prepare_input_ids", "_model_forward", "_sample", "_bookkeeping_sync", "propose_draft_token_ids",
        "_copy_valid_sampled_token_count", "_copy_draft_token_ids_to_cpu", "take_draft_token_ids",
        "_input_fits_in_drafter", "_zero_block_ids", "_calc_spec_decode_metadata", "_preprocess",
        "_determine_batch_execution_and_padding"]},
    "vllm.v1.worker.block_table": {"MultiGroupBlockTable": ["compute_slot_mapping", "commit_block_table"]},
    "vllm.v1.spec_decode.llm_base_proposer": {"SpecDecodeBaseProposer": [
        "prepare_next_token_ids_padded", "prepare_next_token_ids_cpu", "prepare_inputs_padded", "prepare_inputs",
        "propose"]},
    "vllm.v1.core.sched.scheduler": {"Scheduler": ["schedule", "update_from_output", "update_draft_token_ids"]},
    "vllm.v1.core.kv_cache_manager": {"KVCacheManager": ["allocate_slots"]},
    "ragspec.backends.vllm.hybrid_worker": {"HybridProposer": [
        "propose", "prepare_next_token_ids_padded", "prepare_inputs_padded", "_plan_step", "_padded_tokens",
        "_with_sampled"]},
    "ragspec.backends.vllm.hybrid": {"HybridDrafter": ["candidates", "plan", "compose"]},
    "ragspec.backends.vllm.proposer": {"RagspecProposer": ["propose"]},
}
"""Module -> class -> the methods timed (a missing one is skipped)."""
STEP_STARTS = {"GPUModelRunner.execute_model", "Scheduler.schedule"}


class _Recorder:
    """Every step's nanoseconds by method in this process, written to ``out`` every 10 steps."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.label: str | None = None
        self.steps: list[dict[str, int]] = []
        self.step: dict[str, int] = {}

    def add(self, key: str, ns: int, owner: Any) -> None:
        self.step[key] = self.step.get(key, 0) + ns
        if key not in STEP_STARTS:
            return
        if self.label is None:
            spec = owner.vllm_config.speculative_config
            self.label = f"{'scheduler' if key.startswith('Scheduler') else 'worker'}-{spec.method if spec else 'none'}"
        self.steps.append(self.step)
        self.step = {}
        if len(self.steps) % 10 == 0:
            path = os.path.join(self.out, f"{self.label}-{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"label": self.label, "steps": self.steps}, f)
            os.replace(path + ".tmp", path)


def _wrap(recorder: _Recorder, cls: type, name: str) -> None:
    fn = cls.__dict__.get(name)
    if fn is None:
        return
    key = f"{cls.__name__}.{name}"

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter_ns()
        try:
            return fn(self, *args, **kwargs)
        finally:
            recorder.add(key, time.perf_counter_ns() - began, self)

    timed.__name__, timed.__qualname__, timed.__wrapped__ = name, fn.__qualname__, fn  # type: ignore[attr-defined]
    setattr(cls, name, timed)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, recorder: _Recorder) -> None:
        self.inner, self.recorder = inner, recorder

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        for cls_name, names in TARGETS[module.__name__].items():
            cls = getattr(module, cls_name, None)
            for name in names if cls is not None else ():
                _wrap(self.recorder, cls, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Hands each module of ``TARGETS`` a loader that wraps its methods once it has run."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.recorder)
        return spec


if os.environ.get("STEP_TIMING_OUT"):
    sys.meta_path.insert(0, _Finder(_Recorder(os.environ["STEP_TIMING_OUT"])))
