"""The hybrid inside vLLM: a worker class that gives vLLM's draft-model proposer ragspec's n-gram drafts.

Started by vLLM with ``--speculative-config '{"method": "draft_model", "model": SMALL_DIR,
"num_speculative_tokens": K}' --worker-cls ragspec.backends.vllm.hybrid_worker.HybridWorker``
(``ragspec serve --engine vllm --draft-model SMALL_DIR`` does that; ``hybrid_config`` in
``ragspec.backends.vllm.server``). vLLM itself builds its ``DraftModelProposer``, loads the draft
model, gives it a KV cache beside the target's and runs it batched on the target's device; the
worker (vLLM's own CPU or GPU worker, subclassed) only replaces that proposer, once the model
runner exists and before the models load, by ``HybridProposer``: the same class with
``propose`` wrapped. Each step, in the hook where the runner hands it the step's sampled tokens
(``prepare_next_token_ids_*``), it asks ``ragspec.backends.vllm.hybrid.HybridDrafter`` for every
row's n-gram candidate and the plan (which rows take which source, how many draft-model steps
the batch runs, and whether the model runs at all, ``HybridDrafter.model.catch_up``); where the
model does not run, vLLM's preparation of its inputs (next tokens, ``prepare_inputs_padded``) is
skipped too, so such a step costs what ragspec's n-gram proposer's does. ``propose`` then runs
vLLM's own ``propose`` for the planned steps (none: only the catch-up forward that keeps the draft
model's KV cache whole) where the model runs, and hands vLLM the chosen drafts; vLLM's rejection
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


VLLM_HOOKS = ("prepare_next_token_ids_padded", "prepare_next_token_ids_cpu", "prepare_inputs_padded", "prepare_inputs")
"""The methods of vLLM's draft-model proposer the runner calls before ``propose`` and the hybrid overrides:
it plans the step in the first (or second) and skips vLLM's preparation where the model does not run."""


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
        missing = [name for name in VLLM_HOOKS if not callable(getattr(DraftModelProposer, name, None))]
        if missing:
            raise ValueError(f"ragspec's hybrid overrides {', '.join(missing)} of vLLM's DraftModelProposer, which this "
                             "vLLM does not have: it was written for vLLM 0.32's (docs/scale-out.md)")
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
        self._steps: int | None = None  # this step's planned draft-model steps, until ``propose`` takes them
        self._model_began = 0.0  # when vLLM began preparing the draft model's inputs, on a step it runs
        self._idle_tokens = torch.zeros(self.max_batch_size, dtype=torch.int32, device=device)
        self._scratch = torch.zeros(0, dtype=torch.int32).numpy()

    # The runner hands the step's sampled tokens to one of these two before ``propose``: the hybrid plans
    # the step there, and vLLM prepares the draft model's inputs only on a step where the model runs.
    def prepare_next_token_ids_padded(self, sampled_token_ids: torch.Tensor, requests: Any, gpu_input_batch: Any,
                                      discard_request_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._plan_step(self._padded_tokens(sampled_token_ids, discard_request_mask), appended=False):
            if gpu_input_batch.prev_req_id_to_index:  # set only by asynchronous scheduling in 0.32
                raise RuntimeError("vLLM reads the draft model's next tokens on the next step (prev_req_id_to_index "
                                   "is set): ragspec's hybrid needs synchronous scheduling (--no-async-scheduling)")
            idle = self._idle_tokens[: sampled_token_ids.shape[0]]
            return idle, idle  # read by nothing: the model does not run, and scheduling is synchronous
        self.hybrid.model.inputs_prepared += 1
        return super().prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch, discard_request_mask)

    def prepare_next_token_ids_cpu(self, sampled_token_ids: list[list[int]], requests: Any, gpu_input_batch: Any,
                                   num_scheduled_tokens: dict[str, int]) -> torch.Tensor:
        rows = self._runner.input_batch.num_reqs
        if not self._plan_step([list(s) for s in sampled_token_ids[:rows]], appended=True):
            return self._idle_tokens[: len(sampled_token_ids)]
        self.hybrid.model.inputs_prepared += 1
        return super().prepare_next_token_ids_cpu(sampled_token_ids, requests, gpu_input_batch, num_scheduled_tokens)

    # Where the model does not run, the runner only slices its own buffers with what these return.
    def prepare_inputs_padded(self, common_attn_metadata: Any, spec_decode_metadata: Any,
                              valid_sampled_tokens_count: torch.Tensor) -> tuple[Any, Any, Any]:
        if not self.hybrid.model.catch_up:
            return common_attn_metadata, None, None
        return super().prepare_inputs_padded(common_attn_metadata, spec_decode_metadata, valid_sampled_tokens_count)

    def prepare_inputs(self, common_attn_metadata: Any, sampled_token_ids: list[list[int]],
                       num_draft_tokens: list[int]) -> tuple[Any, torch.Tensor]:
        if not self.hybrid.model.catch_up:
            return common_attn_metadata, self._idle_tokens[:0].long()
        return super().prepare_inputs(common_attn_metadata, sampled_token_ids, num_draft_tokens)

    def take_last_draft_probs(self) -> None:
        """No draft probabilities: every draft is deterministic (greedy), so vLLM verifies it as one-hot."""
        return None

    def propose(self, num_speculative_tokens: int, *args: Any, **kwargs: Any) -> list[list[int]]:  # type: ignore[override]
        if self._steps is None:
            raise RuntimeError("vLLM did not hand ragspec's hybrid this step's sampled tokens (prepare_next_token_ids_*): "
                               "this vLLM's model runner is not the one it was written for (0.32)")
        steps, self._steps = min(self._steps, num_speculative_tokens), None
        model_tokens: list[list[int]] = []
        if self.hybrid.model.catch_up:  # else the draft model does not run at all this step
            tokens = super().propose(steps, *args, **kwargs)
            if steps:
                model_tokens = tokens.tolist()  # waits for the device
            elif tokens.device.type == "cuda":  # the catch-up alone: its time is the model's, not the next step's
                torch.cuda.synchronize(tokens.device)
            target = kwargs.get("target_token_ids", args[0] if args else None)
            self.hybrid.record_model(steps, time.perf_counter() - self._model_began,
                                     0 if target is None else int(target.shape[0]))
        return self.hybrid.compose(model_tokens)

    def _plan_step(self, sampled: list[list[int]], appended: bool) -> bool:
        """Plans the step (each row's n-gram candidate, the plan, whether the draft model runs) from each
        row's tokens sampled this step (none for a row still in prefill), ``appended`` when the runner has
        already added them to its arrays (only when it drafts after bookkeeping); whether the model runs."""
        batch = self._runner.input_batch
        rows = batch.num_reqs
        num_tokens = batch.num_tokens_no_spec[:rows]
        token_ids = batch.token_ids_cpu
        if not appended:  # before the runner's bookkeeping: this step's tokens are not in its arrays yet
            token_ids = self._with_sampled(token_ids, num_tokens, sampled, rows)
            num_tokens = num_tokens + [len(s) for s in sampled]
        self.hybrid.candidates(StepBatch(batch.req_ids, sampled, num_tokens, token_ids, batch.generators))
        self._steps = self.hybrid.plan()
        if self.hybrid.model.catch_up:
            self._model_began = time.perf_counter()
        return self.hybrid.model.catch_up

    def _padded_tokens(self, tensor: torch.Tensor, discard: torch.Tensor) -> list[list[int]]:
        """Each row's tokens sampled this step from the runner's padded tensor (rejected positions are
        out of the vocabulary; a discarded row, still in prefill, sampled none)."""
        rows = self._runner.input_batch.num_reqs
        vocab = self._runner.input_batch.vocab_size
        return [[] if gone else [t for t in row if 0 <= t < vocab]
                for row, gone in zip(tensor[:rows].tolist(), discard[:rows].tolist())]

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
