"""The benchmark's arithmetic and report shape (the measurements themselves are not tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench import Prompt, Run, format_table, headline, kept_length, latency_headline, main, summarize
from benchmarks.bench_workload import cpu_features
from ragspec.engine.results import GenerationResult, GenerationStats
from tests.benchmarks.scripts import run_script


def test_summary_ratios_and_identity_count() -> None:
    runs = {
        "hf_greedy": [Run(11, 2.0, 1.0, token_ids=[1, 2]), Run(5, 1.5, 0.5, token_ids=[3])],
        "ragspec_ngram": [Run(11, 1.5, 1.0, forwards=4, drafted=12, accepted=8, draft_s=0.003, token_ids=[1, 2]),
                          Run(5, 1.0, 0.5, forwards=3, drafted=4, accepted=2, draft_s=0.001, token_ids=[9])],
    }
    rows = {s.method: s for s in summarize(runs)}
    # decode tok/s = tokens after the first / time after the first token, pooled over prompts
    assert rows["hf_greedy"].decode_tokens_per_s == pytest.approx(14 / 2.0)
    assert rows["ragspec_ngram"].decode_tokens_per_s == pytest.approx(14 / 1.0)
    assert rows["ragspec_ngram"].ratio_vs_hf_greedy == pytest.approx(2.0)
    assert rows["ragspec_ngram"].tokens_per_forward == pytest.approx(16 / 7, abs=0.01)
    assert rows["ragspec_ngram"].acceptance_rate == pytest.approx(10 / 16, abs=1e-3)
    assert rows["ragspec_ngram"].draft_ms_per_step == pytest.approx(1000 * 0.004 / 5, abs=1e-3)
    assert (rows["ragspec_ngram"].identical, rows["hf_greedy"].identical) == (1, 2)
    assert rows["hf_greedy"].tokens_per_forward is None
    table = format_table([vars(s) for s in rows.values()])
    # The headline columns: time to the whole answer and to the first token, against greedy's.
    assert rows["ragspec_ngram"].answer_ms == pytest.approx(1250.0)
    assert rows["ragspec_ngram"].answer_vs_greedy == pytest.approx(2.5 / 3.5, abs=1e-3)
    assert rows["ragspec_ngram"].ttft_vs_greedy == pytest.approx(1.0)
    assert "| ragspec_ngram | 1250.0 | 0.714 | 750.0 | 1.0 | 14.0 | 2.0 |" in table and "1/2" in table
    line = latency_headline([vars(s) for s in rows.values()])
    assert line == "ragspec_ngram: whole answer in 1250 ms, 0.71x hf_greedy's time; first token in 750 ms, 1.00x hf_greedy's"


def test_ttft_against_greedy_is_the_median_of_per_prompt_ratios() -> None:
    """Prompt by prompt (interleaved runs of the same prompt), so a slow prompt does not weigh more."""
    greedy = [Run(3, 2.0, t, token_ids=[1]) for t in (1.0, 2.0, 4.0)]
    ours = [Run(3, 2.0, t, forwards=3, token_ids=[1]) for t in (0.5, 3.0, 2.0)]
    rows = {s.method: s for s in summarize({"hf_greedy": greedy, "ragspec_plain": ours})}
    assert rows["ragspec_plain"].ttft_vs_greedy == pytest.approx(0.5)  # median of 0.5, 1.5, 0.5
    assert rows["hf_greedy"].ttft_vs_greedy == 1.0


class Answers:
    """A generator whose answer to every prompt is ``ids``, ending as ``finish``; records the calls."""

    def __init__(self, ids: list[int], finish: str) -> None:
        self.ids, self.finish, self.calls = ids, finish, []

    def generate(self, prompt, **options):
        self.calls.append(options)
        return GenerationResult("", self.ids, self.finish, GenerationStats())


@pytest.mark.parametrize(("finish", "kept"), [("repetition", 5), ("eos", 40), ("length", 40)])
def test_every_method_decodes_the_tokens_the_repetition_stop_keeps(finish: str, kept: int) -> None:
    """Cut by the stop: exactly the kept tokens; ended by EOS or the limit: the limit (EOS ends them all alike)."""
    gen = Answers([7, 8, 9, 7, 8], finish)
    prompt = Prompt([1, 2], ["a passage"], "extractive")
    assert kept_length(gen, prompt, 40, 12) == (kept, finish)  # type: ignore[arg-type]
    assert gen.calls == [{"references": ["a passage"], "max_new_tokens": 40, "repetition_stop": 12}]
    assert kept_length(gen, prompt, 40, 0) == (40, "unchecked")  # type: ignore[arg-type]
    assert len(gen.calls) == 1  # no answer is needed when the stop is off


@pytest.mark.timeout(120)
def test_the_script_runs_from_any_folder(tmp_path: Path) -> None:
    """``python benchmarks/bench.py`` (the command the README gives) finds the repository by itself."""
    done = run_script("bench.py", "--help", cwd=tmp_path, pythonpath=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: benchmarks/bench.py") and "--questions" in done.stdout


def test_bad_options_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as e:
        main(["--questions", "0"])
    assert e.value.code == 2


def test_headline_compares_against_every_method_and_the_oracle() -> None:
    rows = [{"method": "hf_greedy", "decode_tokens_per_s": 10.0}, {"method": "hf_prompt_lookup", "decode_tokens_per_s": 12.5},
            {"method": "ragspec_ngram", "decode_tokens_per_s": 25.0}, {"method": "oracle_k8", "decode_tokens_per_s": 100.0}]
    assert headline(rows) == "ragspec_ngram: 2.50x hf_greedy, 2.00x hf_prompt_lookup, 25% of the oracle's speed"
    assert headline(rows[:2]) == ""


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_llamacpp_methods_run_side_by_side_on_the_default_model() -> None:
    """The llama.cpp family end to end on one question (shape and exactness, not speed)."""
    from ragspec.backends import llamacpp

    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed")
    from benchmarks.bench import run_benchmark

    # The defaults (every core, bf16 values): every method's output is bit for bit llama.cpp's greedy
    # at the same settings (docs/backends.md "Exactness").
    report = run_benchmark(model="default", backends=("llamacpp",), questions=1, open_ended=0,
                           max_new_tokens=12, structured=0, progress=lambda _: None)
    rows = {r["method"]: r for r in report["workloads"]["rag"]}  # type: ignore[index]
    assert set(rows) == {"llama_greedy", "llama_greedy_f16_kv", "llama_prompt_lookup", "ragspec_llamacpp_plain",
                         "ragspec_llamacpp_ngram", "oracle_llamacpp_k8"}
    for method in ("llama_prompt_lookup", "ragspec_llamacpp_plain", "ragspec_llamacpp_ngram", "oracle_llamacpp_k8"):
        assert rows[method]["identical"] == 1, method  # equal to llama.cpp's own greedy output
    assert rows["llama_greedy"]["ratio_vs_llama_greedy"] == 1.0 and rows["llama_greedy"]["ratio_vs_hf_greedy"] is None
    assert sum(report["endings"]["rag"]["llamacpp"].values()) == 1  # type: ignore[index]
    assert report["repetition_stop"] == 12
    costs = report["verify_cost"]["llamacpp"]  # type: ignore[index]
    assert costs and all(v > 0 for v in costs.values())


def test_plot_draws_each_workload_and_the_verify_cost_curves(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.figure

    from benchmarks.bench import plot

    row = {"method": "hf_greedy", "ratio_vs_hf_greedy": 1.0}
    report = {"model": "m", "device": "cpu", "dtype": "float32", "workloads": {"rag": [row], "open": [row]},
              "verify_cost": {"torch": {"1": 1.1, "8": 1.7}, "llamacpp": {1: 1.8, 8: 4.9}}}
    drawn = []
    real_savefig = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        drawn.append({ax.get_title(): len(ax.get_lines()) for ax in fig.axes})
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    plot(report, tmp_path / "speedup.png")
    assert (tmp_path / "speedup.png").stat().st_size > 0
    titles = drawn[0]
    assert titles.get("verify cost r(k)") == 3  # two back ends and the k+1 line
    assert sum("workload" in t for t in titles) == 2


def test_a_question_set_replaces_the_bundled_questions_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--question-set FILE`` (repeatable): the RAG workload asks those files' questions, in order, cut at ``--questions``."""
    from benchmarks import bench
    from benchmarks.bench_workload import bundled_questions

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text('{"questions": [{"question": "q1"}, {"question": "q2"}]}')
    second.write_text('{"questions": [{"question": "q3", "kind": "extractive"}]}')
    assert [q["question"] for q in bundled_questions(3, [first, second])] == ["q1", "q2", "q3"]
    assert [q["question"] for q in bundled_questions(2, [second, first])] == ["q3", "q1"]
    assert len(bundled_questions(39)) == 39  # no set: the bundled questions
    seen: dict[str, object] = {}

    def stop(**kwargs: object) -> dict[str, object]:
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(bench, "run_benchmark", stop)
    with pytest.raises(SystemExit):
        main(["--question-set", str(first), "--question-set", str(second), "--questions", "3"])
    assert seen["question_sets"] == [first, second] and seen["questions"] == 3


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_the_torch_methods_run_on_a_question_set() -> None:
    """One unseen question end to end on PyTorch (shape and exactness, not speed)."""
    from benchmarks.bench import run_benchmark

    data = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
    report = run_benchmark(model="default", backends=("torch",), dtype="float32", questions=1, open_ended=0, max_new_tokens=6,
                           question_sets=[data / "fresh_questions.json"], progress=lambda _: None)
    rows = {r["method"]: r for r in report["workloads"]["rag"]}  # type: ignore[index]
    assert rows["ragspec_ngram"]["identical"] == 1 and rows["oracle_k8"]["identical"] == 1
    assert rows["ragspec_ngram_head"]["identical"] == 1  # the default model's draft head, measured beside
    assert report["question_sets"] == [str(data / "fresh_questions.json")]
    assert report["cpu"] == cpu_features()


def test_the_cpu_is_named_by_model_family_and_its_vector_features(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    processor = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel name\t: AMD EPYC 9B45\n"
                 "flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile sha_ni\n\n")
    info.write_text(processor.format(n=0) + processor.format(n=1))
    assert cpu_features(info) == "AMD EPYC 9B45, family 26: amx_tile avx2 avx512_bf16 avx512f"
    info.write_text("processor\t: 0\nmodel name\t: Old CPU\nflags\t\t: fpu sse2\n")
    assert cpu_features(info) == "Old CPU: no AVX2, AVX-512 or AMX"
    assert cpu_features(tmp_path / "missing") == "unknown CPU"
