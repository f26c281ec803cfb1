"""CPU cost per engine step of ragspec's proposer against vLLM's own n-gram proposer, at serving batch sizes.

Inside vLLM the proposer runs on the CPU between two GPU steps, synchronously (vLLM 0.32 runs
``custom_class`` proposers on its V1 model runner without async scheduling), so whatever it takes
is added to every step. This simulates the batches vLLM's model runner hands a proposer and times
both proposers on the same arrays, interleaved, in one run:

- rows of RAG requests: a ~700-token prompt (an instruction and three consecutive passages of the
  bundled corpus, ``retrievers/data/corpus``, tokenized with the default model's tokenizer) and an
  answer that copies stretches of those passages joined by a few other tokens; one token per step
  (every row samples one token, as when no draft is accepted); a request that has answered is
  replaced by a new one in its row (its prompt is then indexed in that step);
Both sides are timed twice, nested in the same call, so that like is compared with like:

- **the whole step** (``step`` columns): from the runner's arrays (each row's sampled tokens, token
  counts, the ``token_ids`` table) to the ``list[list[int]]`` of drafts the runner takes.
  ragspec: ``BatchDrafter.step``, all that ``RagspecProposer.propose`` does (following the batch's
  requests by id, indexing new prompts, the compiled kernel, planning, the draft lists). vLLM:
  ``NgramProposer.propose``, all that vLLM's runner calls for ``"method": "ngram"`` (choosing the
  rows, the kernel, its draft lists); ``prompt_lookup_min`` 2, ``prompt_lookup_max`` 4, one thread
  as vLLM 0.32 uses below 8192 tokens in the batch (more threads only from there; and those cores
  are then taken from the frontend and tokenization).
- **the compiled kernel** (``kernel`` columns), timed inside those same calls: ragspec's
  ``BatchIndex.step`` (extend every row's index by its new tokens, match, continue, record
  acceptance, plan every row's length; results in preallocated arrays) and vLLM's
  ``batch_propose_numba`` (match the last 2-4 tokens against the whole context of every row,
  continue; results in preallocated arrays). The issue's first figures timed vLLM's kernel alone.

ragspec's step costs are given as flat in the drafted tokens, so it plans drafts for every row
that has a match (the most work planning can do). The ratio columns are ragspec over vLLM, of the
medians, whole step against whole step and kernel against kernel.

It reports ms per step (median and mean) for each, and each proposer's share of a step whose
GPU part is ``gpu_step_ms(rows)``: an 8B model's decode step on one H100 estimated from its memory
traffic (not a measurement; docs/scale-out.md gives the arithmetic and its sources). Run it with the Python of vLLM's venv and ragspec's source on the path::

    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/proposer_cost.py [--rows 1 8 32 128 256] [--steps 200] [--json out.json] [--clock thread]

``--tokenizer`` is a folder with the default model's ``tokenizer.json`` (default: the one ragspec
converted into its cache, ``~/.cache/ragspec/models/SmolLM2-135M-Instruct*``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from itertools import count
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_workload import cpu_features  # noqa: E402
from ragspec.backends.vllm.proposer import BatchDrafter, StepBatch, StepCosts  # noqa: E402
from ragspec.engine.policy import AdaptivePolicy  # noqa: E402

CORPUS = ROOT / "retrievers" / "data" / "corpus"
ROWS = (1, 8, 32, 128, 256)
# A decode step of Llama-3.1-8B in bf16 on one H100 SXM, from its memory traffic (docs/scale-out.md,
# "What custom_class costs on a GPU"): the weights and every row's keys and values are read once per
# step, at 75% of the 3.35 TB/s peak of NVIDIA's H100 SXM datasheet (a measured A100 decode reached
# 77% of its own); the compute of a plain step stays below that at every size here.
GPU_WEIGHT_BYTES = 8.03e9 * 2  # parameters in bf16
GPU_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # keys and values, 32 layers, 8 KV heads of 128, bf16
GPU_CONTEXT_TOKENS = 1000  # a ~700-token RAG prompt and its answer
GPU_BYTES_PER_S = 0.75 * 3.35e12


def gpu_step_ms(rows: int) -> float:
    """The plain decode step assumed for ``rows`` requests on the GPU (not a measurement)."""
    return 1e3 * (GPU_WEIGHT_BYTES + rows * GPU_CONTEXT_TOKENS * GPU_KV_BYTES_PER_TOKEN) / GPU_BYTES_PER_S


DRAFT_TOKENS = 8
PROMPT_TOKENS = 700
MAX_MODEL_LEN = 2048


def default_tokenizer_folder() -> Path:
    root = Path(os.environ.get("RAGSPEC_CACHE_DIR") or Path.home() / ".cache" / "ragspec")
    found = sorted(root.glob("models/SmolLM2-135M-Instruct*/tokenizer.json"))
    if not found:
        raise SystemExit(f"no converted default model under {root}/models: run ragspec once (e.g. `ragspec ask`), "
                         "or pass --tokenizer")
    return found[0].parent


def corpus_tokens(tokenizer_folder: Path) -> list[np.ndarray]:
    """Every bundled corpus file as token ids of the default tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
    texts = [p.read_text(encoding="utf-8", errors="ignore") for p in sorted(CORPUS.iterdir()) if p.is_file()]
    return [np.array(tokenizer.encode(t, add_special_tokens=False), np.int32) for t in texts if t.strip()]


class Workload:
    """Requests of the simulated batch: prompts from the corpus, answers copying stretches of them."""

    def __init__(self, docs: list[np.ndarray], seed: int) -> None:
        self.docs = [d for d in docs if len(d) > 64]
        self.rng = np.random.default_rng(seed)
        self.ids = count()
        self.instruction = self.docs[0][:40]

    def request(self) -> tuple[str, np.ndarray, np.ndarray]:
        rng = self.rng
        passages = []
        for _ in range(3):  # three retrieved passages
            doc = self.docs[int(rng.integers(len(self.docs)))]
            start = int(rng.integers(0, max(1, len(doc) - 220)))
            passages.append(doc[start : start + 220])
        prompt = np.concatenate([self.instruction, *passages])[:PROMPT_TOKENS]
        answer: list[int] = []
        for _ in range(int(rng.integers(3, 8))):  # stretches copied from the passages, a few other tokens between
            length = int(rng.integers(8, 40))
            start = int(rng.integers(40, max(41, len(prompt) - length)))
            answer += prompt[start : start + length].tolist()
            other = self.docs[int(rng.integers(len(self.docs)))]
            answer += other[: int(rng.integers(1, 6))].tolist()
        return f"req-{next(self.ids)}", prompt, np.array(answer, np.int32)


class Batch:
    """The model runner's arrays for ``rows`` requests in decode, one token sampled per step."""

    def __init__(self, rows: int, workload: Workload) -> None:
        self.workload = workload
        self.token_ids = np.zeros((rows, MAX_MODEL_LEN), np.int32)
        self.num_tokens = np.zeros(rows, np.int32)
        self.req_ids: list[str] = [""] * rows
        self.answers: list[np.ndarray] = [np.zeros(0, np.int32)] * rows
        self.done = [0] * rows
        self.sampled: list[list[int]] = [[] for _ in range(rows)]
        for r in range(rows):
            self._start(r)

    def _start(self, r: int) -> None:
        rid, prompt, answer = self.workload.request()
        self.req_ids[r], self.answers[r], self.done[r] = rid, answer, 0
        self.token_ids[r, : len(prompt)] = prompt
        self.num_tokens[r] = len(prompt)

    def advance(self) -> None:
        """Every row samples its answer's next token; a finished request is replaced by a new one."""
        for r in range(len(self.req_ids)):
            if self.done[r] >= len(self.answers[r]):
                self._start(r)
            token = int(self.answers[r][self.done[r]])
            self.done[r] += 1
            self.token_ids[r, self.num_tokens[r]] = token
            self.num_tokens[r] += 1
            self.sampled[r] = [token]


def vllm_ngram(rows: int) -> Any:
    try:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer, batch_propose_numba
    except ImportError as e:
        raise SystemExit(f"vLLM is not importable here ({e}): run this with .venv-vllm/bin/python "
                         "(scripts/install-vllm.sh makes it)") from e
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(prompt_lookup_min=2, prompt_lookup_max=4, num_speculative_tokens=DRAFT_TOKENS),
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN),
        scheduler_config=SimpleNamespace(max_num_seqs=max(rows, 1024)),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    return NgramProposer(config), batch_propose_numba


def flat_costs(rows: int) -> StepCosts:
    """Step costs flat in the drafted tokens (a GPU well below its compute limit): planning drafts
    for every row with a match."""
    costs = StepCosts()
    for d in (0, rows * DRAFT_TOKENS):
        costs.record(rows, d, 0.01)
    costs.replain_every = 1 << 60
    return costs


CLOCKS = {"wall": time.perf_counter_ns, "thread": time.thread_time_ns}
"""``wall``: elapsed time (what a step waits for; the figure to report from a quiet machine). ``thread``:
CPU time of this thread, which leaves out the time the OS gave other processes, so a shared machine's
preemptions do not land in one proposer's column (its caches are still shared)."""


class _Timed:
    """A callable that adds the time of each call to ``elapsed`` (for the kernels, nested in a step)."""

    def __init__(self, function: Any, now: Any) -> None:
        self.function, self.now, self.elapsed = function, now, 0

    def __call__(self, *args: Any) -> Any:
        t0 = self.now()
        try:
            return self.function(*args)
        finally:
            self.elapsed += self.now() - t0


def measure(rows: int, steps: int, warmup: int, docs: list[np.ndarray], clock: str = "wall") -> dict[str, Any]:
    import vllm.v1.spec_decode.ngram_proposer as vllm_module

    batch = Batch(rows, Workload(docs, seed=rows))
    now = CLOCKS[clock]
    # Margin 0 and the acceptance statistics held at the policy's prior: with flat costs every expected
    # gain then pays, so every row with a match drafts, as vLLM's n-gram does (the simulated rows keep no
    # draft, so learned statistics would soon stop all drafting and the planning's work with it).
    ragspec = BatchDrafter(DRAFT_TOKENS, max_model_len=MAX_MODEL_LEN, costs=flat_costs(rows), clock=lambda: 0.0,
                           policy=AdaptivePolicy(max_draft=DRAFT_TOKENS, margin=0.0),
                           max_rows=rows)  # as RagspecProposer allocates for vLLM's max_num_seqs
    ragspec_kernel = _Timed(ragspec.index.step, now)
    ragspec.index.step = ragspec_kernel  # type: ignore[method-assign]
    counts = ragspec.policy.acceptance.counts
    prior = counts.copy()
    ngram, kernel = vllm_ngram(rows)
    vllm_kernel = _Timed(kernel, now)
    times: dict[str, list[float]] = {"ragspec_step": [], "ragspec_kernel": [], "vllm_step": [], "vllm_kernel": []}
    drafted = {"ragspec": 0, "vllm": 0}
    vllm_module.batch_propose_numba = vllm_kernel  # what NgramProposer.batch_propose calls, timed
    try:
        for step in range(warmup + steps):
            batch.advance()
            for name in ("ragspec", "vllm") if step % 2 else ("vllm", "ragspec"):
                timed = ragspec_kernel if name == "ragspec" else vllm_kernel
                timed.elapsed = 0
                t0 = now()
                if name == "ragspec":
                    counts[...] = prior
                    out = ragspec.step(StepBatch(batch.req_ids, batch.sampled, batch.num_tokens, batch.token_ids))
                else:
                    out = ngram.propose(DRAFT_TOKENS, batch.sampled, batch.num_tokens, batch.token_ids)
                elapsed = now() - t0
                if step >= warmup:
                    times[f"{name}_step"].append(elapsed / 1e6)
                    times[f"{name}_kernel"].append(timed.elapsed / 1e6)
                    drafted[name] += sum(map(len, out))
    finally:
        vllm_module.batch_propose_numba = kernel
    result: dict[str, Any] = {"rows": rows, "steps": steps, "clock": clock}
    for name, ms in times.items():
        result[f"{name}_ms"] = float(np.mean(ms))
        result[f"{name}_median_ms"] = float(np.median(ms))
        result[f"{name}_us_per_request"] = float(np.mean(ms)) * 1000 / rows
    for part in ("step", "kernel"):
        result[f"{part}_ratio"] = result[f"ragspec_{part}_median_ms"] / result[f"vllm_{part}_median_ms"]
    result["ragspec_drafted_per_step"] = drafted["ragspec"] / steps
    result["vllm_drafted_per_step"] = drafted["vllm"] / steps
    gpu = result["gpu_step_ms"] = gpu_step_ms(rows)
    for name in ("ragspec", "vllm"):
        result[f"{name}_share"] = result[f"{name}_step_ms"] / (gpu + result[f"{name}_step_ms"])
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    p.add_argument("--steps", type=int, default=200, help="measured steps per batch size")
    p.add_argument("--warmup", type=int, default=300,
                   help="steps run first and not timed: compilation, first prompts, requests ending and beginning")
    p.add_argument("--tokenizer", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall: elapsed time (default); thread: this thread's CPU time, for a shared machine")
    args = p.parse_args(argv)
    docs = corpus_tokens(args.tokenizer or default_tokenizer_folder())
    report: dict[str, Any] = {"cpu_features": cpu_features(), "draft_tokens": DRAFT_TOKENS, "results": []}
    print(f"CPU features: {report['cpu_features']}; {DRAFT_TOKENS} draft tokens; ~{PROMPT_TOKENS}-token prompts")
    print(f"ms per step ({args.clock} clock): median (mean); ratio: ragspec / vLLM of the medians")
    names = ("ragspec_step", "vllm_step", "ragspec_kernel", "vllm_kernel")
    print(f"{'rows':>5} | " + " | ".join(f"{n:>18}" for n in names)
          + f" | {'step ratio':>10} {'kernel ratio':>12} | {'GPU ms':>6} {'ragspec share':>13} {'vLLM share':>10}")
    for rows in args.rows:
        r = measure(rows, args.steps, args.warmup, docs, args.clock)
        report["results"].append(r)
        share = f"{r['gpu_step_ms']:>6.1f} {100 * r['ragspec_share']:>12.2f}% {100 * r['vllm_share']:>9.2f}%"
        cells = " | ".join(f"{r[n + '_median_ms']:>8.4f} ({r[n + '_ms']:.4f})" for n in names)
        print(f"{rows:>5} | {cells} | {r['step_ratio']:>9.2f}x {r['kernel_ratio']:>11.2f}x | {share}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
