"""The dtype choice of the PyTorch back end made at run time (``resolve_dtype``, ``prompt_dtype``)."""

from __future__ import annotations

import pytest
import torch

from ragspec.backends.pytorch.loading import prompt_dtype, resolve_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize(("flags", "want"), [
    ({"avx2", "fma", "amx_bf16", "amx_tile"}, torch.bfloat16),  # Sapphire Rapids and later
    ({"avx2", "avx512f", "avx512_bf16"}, torch.bfloat16),  # Cooper Lake, Zen 4
    ({"avx2", "avx512f"}, None),  # AVX-512 without bf16 arithmetic: bf16 would be emulated
    ({"avx2", "fma"}, None),
    (set(), None),  # no /proc/cpuinfo
])
def test_bf16_prompts_run_in_bf16_only_where_the_cpu_computes_it(flags: set[str], want: torch.dtype | None) -> None:
    assert prompt_dtype("bf16-prompts", CPU, frozenset(flags)) == want
    assert resolve_dtype("bf16-prompts", CPU) == torch.float32  # decoding steps stay fp32 either way
    assert prompt_dtype("auto", CPU, frozenset(flags)) == want  # the default: bf16 prompts where the CPU computes bf16
    assert resolve_dtype("auto", CPU) == torch.float32


@pytest.mark.parametrize("dtype", ["float32", "fp32", "bfloat16", torch.float32])
def test_an_explicit_dtype_runs_everything_in_it(dtype: str | torch.dtype) -> None:
    assert prompt_dtype(dtype, CPU, frozenset({"amx_bf16", "avx512_bf16"})) is None


def test_a_gpu_runs_prompts_in_the_weights_dtype() -> None:
    assert prompt_dtype("bf16-prompts", torch.device("cuda"), frozenset({"amx_bf16"})) is None
    assert prompt_dtype("auto", torch.device("cuda"), frozenset({"amx_bf16"})) is None
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16


def test_loading_the_default_model_prints_no_progress_bar(capfd: pytest.CaptureFixture[str]) -> None:
    """transformers' per-tensor bar would land in the middle of the first answer shown (the demo loads the model
    there); it is off while loading and as it was afterwards."""
    from transformers.utils import logging as hf_logging

    from ragspec.backends.pytorch.loading import load_torch_model

    was_on = hf_logging.is_progress_bar_enabled()  # another test in this process may have turned bars off (the CLI does)
    hf_logging.enable_progress_bar()
    try:
        load_torch_model(device="cpu", dtype="float32")
        out, err = capfd.readouterr()
        assert "Loading weights" not in out + err
        assert hf_logging.is_progress_bar_enabled()
    finally:
        if not was_on:
            hf_logging.disable_progress_bar()
