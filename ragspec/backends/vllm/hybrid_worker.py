"""The hybrid inside vLLM: a worker class that gives vLLM's draft-model proposer ragspec's n-gram drafts.

Started by vLLM with ``--speculative-config '{"method": "draft_model", "model": SMALL_DIR,
"num_speculative_tokens": K}' --worker-cls ragspec.backends.vllm.hybrid_worker.HybridWorker``
(``ragspec serve --engine vllm --draft-model SMALL_DIR`` does that; ``hybrid_config`` in
``ragspec.backends.vllm.server``). vLLM itself builds its ``DraftModelProposer``, loads the draft
model, gives it a KV cache beside the target's and runs it batched on the target's device; the
worker (vLLM's own CPU or GPU worker, subclassed) only replaces that proposer, once the model
runner exists and before the models load, by ``HybridProposer``: the same class with
``propose`` wrapped. Each step it asks ``ragspec.backends.vllm.hybrid.HybridDrafter`` for every
row's n-gram candidate and the plan (which rows take which source, how many draft-model steps
the batch runs), runs vLLM's own ``propose`` for that many steps (none: only the catch-up forward
that keeps the draft model's KV cache whole, and not even that when the drafter does not keep the
model, ``HybridDrafter.catch_up``), and hands vLLM the chosen drafts; vLLM's rejection
sampler verifies them, so the output is vLLM's without speculation.

docs/scale-out.md ("The hybrid: n-gram drafts and a draft model inside vLLM") says why this seam,
what it assumes of vLLM 0.32's model runner (checked here, with clear errors) and what an upgrade
may break. Runs in vLLM's worker process with ragspec's source on ``PYTHONPATH``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from vllm.platforms import current_platform
from vllm.v1.spec_decode.draft_model import DraftModelProposer

from ragspec.backends.vllm.hybrid import HybridDrafter
from ragspec.backends.vllm.proposer import (
    DEFAULT_HISTORY_TOKENS,
    DEFAULT_MIN_MATCH,
    HISTORY_ENV,
    MIN_MATCH_ENV,
    StepBatch,
    _env_int,
    request_cap,
)

if current_platform.is_cpu():
    from vllm.v1.worker.cpu_worker import CPUWorker as _VllmWorker
else:
    from vllm.v1.worker.gpu_worker import Worker as _VllmWorker


class HybridProposer(DraftModelProposer):
    """vLLM's ``DraftModelProposer`` whose drafts per row are ragspec's n-gram drafts or the model's."""

    def __init__(self, vllm_config: Any, device: torch.device, runner: Any) -> None:
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        spec = vllm_config.speculative_config
        if spec.draft_sample_method != "greedy":
            raise ValueError("ragspec's hybrid needs draft_sample_method 'greedy' (its n-gram drafts have no "
                             "probabilities); remove draft_sample_method from the speculative config")
        if getattr(runner, "use_async_scheduling", False):
            raise ValueError("ragspec's hybrid reads each step's tokens on the host: start vLLM with "
                             "--no-async-scheduling (ragspec serve --engine vllm does)")
        self._runner = runner
        self._warned: set[str] = set()
        longest = int(spec.num_speculative_tokens)
        self.hybrid = HybridDrafter(
            longest,
            max_model_len=int(vllm_config.model_config.max_model_len),
            history_tokens=_env_int(HISTORY_ENV, DEFAULT_HISTORY_TOKENS),
            min_match=_env_int(MIN_MATCH_ENV, DEFAULT_MIN_MATCH),
            request_cap=lambda rid: request_cap(runner, rid, longest, self._warned),
            max_rows=int(vllm_config.scheduler_config.max_num_seqs),
        )
        self._sampled: Any = None  # this step's sampled tokens, as the runner hands them to the proposer
        self._scratch = torch.zeros(0, dtype=torch.int32).numpy()

    # The runner hands the step's sampled tokens to these two before ``propose``: keep them.
    def prepare_next_token_ids_padded(self, sampled_token_ids: torch.Tensor, requests: Any, gpu_input_batch: Any,
                                      discard_request_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._sampled = (sampled_token_ids, discard_request_mask)
        return super().prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch, discard_request_mask)

    def prepare_next_token_ids_cpu(self, sampled_token_ids: list[list[int]], requests: Any, gpu_input_batch: Any,
                                   num_scheduled_tokens: dict[str, int]) -> torch.Tensor:
        self._sampled = sampled_token_ids
        return super().prepare_next_token_ids_cpu(sampled_token_ids, requests, gpu_input_batch, num_scheduled_tokens)

    def take_last_draft_probs(self) -> None:
        """No draft probabilities: every draft is deterministic (greedy), so vLLM verifies it as one-hot."""
        return None

    def propose(self, num_speculative_tokens: int, *args: Any, **kwargs: Any) -> list[list[int]]:  # type: ignore[override]
        batch = self._runner.input_batch
        rows = batch.num_reqs
        sampled, appended = self._step_tokens(rows)
        num_tokens = batch.num_tokens_no_spec[:rows]
        token_ids = batch.token_ids_cpu
        if not appended:  # before the runner's bookkeeping: this step's tokens are not in its arrays yet
            token_ids = self._with_sampled(token_ids, num_tokens, sampled, rows)
            num_tokens = num_tokens + [len(s) for s in sampled]
        self.hybrid.candidates(StepBatch(batch.req_ids, sampled, num_tokens, token_ids, batch.generators))
        steps = min(self.hybrid.plan(), num_speculative_tokens)
        model_tokens: list[list[int]] = []
        if self.hybrid.catch_up:  # else the draft model does not run at all this step
            began = time.perf_counter()
            tokens = super().propose(steps, *args, **kwargs)
            if steps:
                model_tokens = tokens.tolist()  # waits for the device
            elif tokens.device.type == "cuda":  # the catch-up alone: its time is the model's, not the next step's
                torch.cuda.synchronize(tokens.device)
            target = kwargs.get("target_token_ids", args[0] if args else None)
            self.hybrid.record_model(steps, time.perf_counter() - began, 0 if target is None else int(target.shape[0]))
        return self.hybrid.compose(model_tokens)

    def _step_tokens(self, rows: int) -> tuple[list[list[int]], bool]:
        """Each row's tokens sampled this step (none for a row still in prefill), and whether the
        runner has already appended them to its arrays (only when it drafts after bookkeeping)."""
        got, self._sampled = self._sampled, None
        if isinstance(got, list):
            return [list(s) for s in got[:rows]], True
        if got is None:
            raise RuntimeError("vLLM did not hand ragspec's hybrid this step's sampled tokens (prepare_next_token_ids_*): "
                               "this vLLM's model runner is not the one it was written for (0.32)")
        tensor, discard = got
        vocab = self._runner.input_batch.vocab_size
        discarded = discard[:rows].tolist()
        return [[] if gone else [t for t in row if 0 <= t < vocab]
                for row, gone in zip(tensor[:rows].tolist(), discarded)], False

    def _with_sampled(self, token_ids: Any, num_tokens: Any, sampled: list[list[int]], rows: int) -> Any:
        """The runner's token array for the first ``rows`` rows with this step's tokens appended (a
        copy of the columns the rows use, not of the model's whole length)."""
        if self._scratch.shape[0] < rows or self._scratch.shape[1] != token_ids.shape[1]:
            self._scratch = token_ids[: max(rows, 1)].copy()
        scratch = self._scratch
        width = int(num_tokens.max(initial=0)) if rows else 0
        scratch[:rows, :width] = token_ids[:rows, :width]
        for r, new in enumerate(sampled):
            if new:
                n = int(num_tokens[r])
                scratch[r, n : n + len(new)] = new
        return scratch


class HybridWorker(_VllmWorker):  # type: ignore[misc, valid-type]
    """vLLM's worker for this platform (CPU or GPU), whose model runner drafts with ``HybridProposer``."""

    def init_device(self) -> None:
        super().init_device()
        runner = self.model_runner
        spec = self.vllm_config.speculative_config
        if spec is None or not spec.uses_draft_model():
            raise ValueError("ragspec's hybrid worker needs --speculative-config with method 'draft_model' "
                             "(ragspec.backends.vllm.server.hybrid_config)")
        if not isinstance(getattr(runner, "drafter", None), DraftModelProposer):
            raise ValueError(f"ragspec's hybrid works with vLLM's V1 model runner, not {type(runner).__name__}: "
                             "set VLLM_USE_V2_MODEL_RUNNER=0 (ragspec serve --engine vllm does)")
        runner.drafter = HybridProposer(self.vllm_config, runner.device, runner)
