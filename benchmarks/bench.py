"""Side-by-side benchmark: ragspec against transformers' and llama.cpp's decoding, on identical RAG prompts.

Every method decodes the same prompts in one process, interleaved prompt by prompt (the order
of methods rotates), so drift in machine speed hits all of them alike. Methods, per back end:

- PyTorch: transformers greedy ``generate`` and its prompt lookup; ragspec plain and n-gram on
  the PyTorch back end; where the model has a draft head (``ragspec.decoding.draft_head``), n-gram with
  the head guessing where nothing is worth copying (``ragspec_ngram_head``); an oracle drafter (the
  target's own output: the ceiling).
- llama.cpp (GGUF models, with ``ragspec[llamacpp]``): llama-cpp-python's ``Llama`` greedy (its
  high-level ``generate``, as a user runs it) and ``Llama`` with its ``LlamaPromptLookupDecoding``
  (10 tokens); ragspec plain and n-gram on the llama.cpp back end; the oracle on it. Every
  llama.cpp method runs with the same settings (threads, batch sizes, flash attention, KV cache
  types): the back end's defaults, every physical core for one-token steps and for batches, as
  Ollama and llama.cpp's own CLI run, values cached as bf16 (what keeps a step bit-identical to a
  verify batch on several threads). One more row, ``llama_greedy_f16_kv``, is llama.cpp greedy
  with its own default f16 cache (what Ollama runs; its outputs may differ from the others').

Reported per method, first what a user waits for: the time to the whole answer and its ratio to
the back end's own greedy decoding, the time to first token (TTFT) and its ratio to greedy's on
the same prompt (the prefill's guard); then decode tokens/s (tokens after the first over the time
after the first), its ratio to transformers greedy and to llama.cpp greedy, end-to-end
tokens/s (new tokens over the whole call), new tokens per target forward, draft acceptance,
drafting time per step, peak resident memory of the process, and how many outputs equal their
back end's own greedy decoding (transformers for PyTorch methods, llama.cpp for llama.cpp
methods) token for token. The report also holds each back end's verify cost r(k).

Answers end by themselves: a small model often loops until ``max_new_tokens``, and drafting its
own loop back out of its output would pass for speed. So before the methods run a prompt, an
untimed generator of each back end answers it with ragspec's repetition stop (``QA_DEFAULTS``,
as ``DocumentQA`` answers), and every method of that back end then decodes exactly the tokens
that answer keeps (outputs are identical, so each stops at the same token, or at EOS). The
report counts how each back end's answers ended (``endings``).

Run ``python benchmarks/bench.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: ``python benchmarks/bench.py``

from benchmarks.bench_workload import (  # noqa: E402
    FirstTokenTimer,
    TimedRun,
    cpu_features,
    decode_tokens_per_s,
    retrieved_questions,
)
from ragspec.backends import TargetModel, load_model  # noqa: E402
from ragspec.engine.drafting import Draft, DraftSource  # noqa: E402
from ragspec.decoding.generator import SpeculativeGenerator  # noqa: E402
from ragspec.decoding.draft_head import head_path  # noqa: E402
from ragspec.backends.pytorch.loading import LoadedModel  # noqa: E402
from ragspec.engine.ngram import NgramDrafter  # noqa: E402
from ragspec.engine.policy import FixedPolicy  # noqa: E402
from ragspec.pipeline import QA_DEFAULTS  # noqa: E402


# Open-ended requests with no passages: nothing to copy, so drafting must stay out of the way.
OPEN_ENDED = [
    "Write a short poem about a lighthouse keeper who collects lost gloves.",
    "Invent a recipe for a soup made only from autumn vegetables and describe how it tastes.",
    "Describe an imaginary city where all the streets are canals and the buses are boats.",
    "Tell a brief story about a robot that learns to whistle.",
    "Give three unusual ideas for a birthday party in a library.",
    "Explain to a child why the sky changes colour at sunset.",
    "Write a letter from a cat to its owner complaining about the new sofa.",
    "Describe your ideal weekend in the mountains in a few sentences.",
    "Make up a legend about why owls stay awake at night.",
    "List some tips for someone learning to ride a bicycle as an adult.",
    "Write a short dialogue between a teapot and a kettle arguing about who is more useful.",
    "Describe a market on a floating island where everything is paid for with songs.",
    "Tell a story about a postman who delivers letters to the moon.",
    "Suggest five names for a bakery run by penguins and explain each one.",
    "Explain how a rainbow forms, as if talking to a curious seven-year-old.",
    "Write a diary entry of a snowman on the first warm day of spring.",
    "Invent a board game played with seashells and describe its rules.",
    "Describe the sounds of a forest at night to someone who has never been in one.",
    "Write a thank-you note from a tree to the birds that live in it.",
    "Give some advice to a dragon who is afraid of heights.",
    "Describe a train journey through a desert made of glass.",
    "Tell a short fable about a tortoise who wants to fly.",
    "Imagine a museum of forgotten smells and describe three of its rooms.",
    "Write instructions for building a sandcastle that survives the tide.",
]


@dataclass
class Prompt:
    ids: list[int]
    """The prompt's token ids (``ragspec.prompts.chat_prompt_ids``): every method gets exactly these."""
    passages: list[str]
    kind: str


@dataclass
class Run(TimedRun):
    drafted: int = 0
    accepted: int = 0
    """Of the drafted tokens, those the target accepted."""
    draft_s: float = 0.0
    """Seconds spent drafting."""
    peak_rss_mb: float = 0.0
    token_ids: list[int] = field(default_factory=list)


@dataclass
class MethodSummary:
    method: str
    decode_tokens_per_s: float
    ratio_vs_hf_greedy: float | None
    ttft_ms: float
    tokens_per_forward: float | None
    acceptance_rate: float | None
    draft_ms_per_step: float | None
    peak_rss_mb: float
    identical: int | None
    """Outputs equal to the back end's own greedy (transformers or llama.cpp); None without it."""
    prompts: int
    ratio_vs_llama_greedy: float | None = None
    e2e_tokens_per_s: float = 0.0
    """New tokens over the whole call (prefill included)."""
    answer_ms: float = 0.0
    """Time to the whole answer (prefill and decoding), mean over prompts: the headline figure."""
    answer_vs_greedy: float | None = None
    """Time to the whole answers over its back end's greedy's (below 1: faster); every method decodes the same tokens."""
    ttft_vs_greedy: float | None = None
    """Time to first token over its back end's greedy's on the same prompt (interleaved), median over prompts:
    the prefill's guard (ragspec's must stay at or below 1 against transformers at the same dtype)."""


GREEDY = {"torch": "hf_greedy", "llamacpp": "llama_greedy"}
"""Each back end's own greedy decoding: the reference for speed ratios and identical outputs."""


def family(method: str) -> str:
    """The back end a method runs on."""
    return "llamacpp" if method.startswith(("llama_", "ragspec_llamacpp", "oracle_llamacpp")) else "torch"


# -- workload ---------------------------------------------------------------------------------
def rag_prompts(lm: TargetModel, n: int, k: int = 3, question_sets: Sequence[Path] = ()) -> list[Prompt]:
    """The bundled questions (or those of ``question_sets``, see ``bundled_questions``) with passages
    retrieved from the bundled corpus (hybrid, top ``k``)."""
    from ragspec.prompts import qa_prompt_ids

    prompts = []
    for q, passages in retrieved_questions(n, k, question_sets):
        ids = qa_prompt_ids(lm.tokenizer, q["question"], passages)  # the pipeline's own prompt
        prompts.append(Prompt(ids, [p.page_content for p in passages], q.get("kind", "rag")))
    return prompts


def open_prompts(lm: TargetModel, n: int) -> list[Prompt]:
    from ragspec.prompts import chat_prompt_ids

    return [Prompt(chat_prompt_ids(lm.tokenizer, [{"role": "user", "content": r}]), [], "open") for r in OPEN_ENDED[:n]]


# -- methods ----------------------------------------------------------------------------------
class OracleDrafter:
    """Proposes the target's own greedy continuation: an upper bound for any drafter."""

    def __init__(self) -> None:
        self.truth: list[int] = []
        self.prompt_len = 0

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]]) -> None:
        self.prompt_len = len(prompt)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        done = len(context) - self.prompt_len
        tokens = tuple(self.truth[done : done + max_tokens])
        return Draft(tokens, DraftSource.ORACLE) if tokens else None

    def feedback(self, draft: Draft, n_accepted: int) -> None: ...

    def finish(self, output: Sequence[int]) -> None: ...


class _PeakRss:
    """Samples the process's resident memory in a thread while a method runs."""

    def __enter__(self) -> _PeakRss:
        self.peak, self._stop = _rss_mb(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())


def _rss_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def hf_method(lm: LoadedModel, **kwargs: object) -> Callable[[Prompt, int], Run]:
    eos = lm.tokenizer.eos_token_id

    @torch.inference_mode()
    def run(prompt: Prompt, max_new_tokens: int) -> Run:
        ids = torch.tensor([prompt.ids], device=lm.device)
        timer = FirstTokenTimer()
        start = time.perf_counter()
        out = lm.model.generate(
            ids, max_new_tokens=max_new_tokens, do_sample=False, streamer=timer,
            pad_token_id=eos, **kwargs,  # type: ignore[arg-type]
        )
        wall = time.perf_counter() - start
        new = out[0, ids.shape[1] :].tolist()
        if eos in new:
            new = new[: new.index(eos)]
        return Run(len(new), wall, (timer.first or start + wall) - start, token_ids=new)

    return run


def ragspec_method(gen: SpeculativeGenerator, speculative: bool, use_passages: bool = True) -> Callable[[Prompt, int], Run]:
    def run(prompt: Prompt, max_new_tokens: int) -> Run:
        refs = prompt.passages if use_passages else []
        r = gen.generate(prompt.ids, references=refs, max_new_tokens=max_new_tokens, speculation=speculative)
        s = r.stats
        return Run(s.new_tokens, s.wall_s, s.ttft_s, s.forward_passes, s.drafted_tokens, s.accepted_tokens,
                   s.draft_s, token_ids=r.token_ids)

    return run


def llama_method(llm: object, eos: frozenset[int]) -> Callable[[Prompt, int], Run]:
    """llama-cpp-python's ``Llama`` greedy (``generate`` with temperature 0).

    It gets the same prompt ids as every method (the tokenizers agree: tests check it) and stops
    at the same end-of-sequence ids. Each prompt is evaluated from an empty context, like
    transformers ``generate``: ``Llama`` would otherwise reuse the prefix it shares with the
    previous prompt, and a short remainder is computed by another attention kernel than a whole
    prompt (see docs/backends.md), so its output would depend on the previous question.
    """

    def run(prompt: Prompt, max_new_tokens: int) -> Run:
        llm.reset()  # type: ignore[attr-defined]
        start = time.perf_counter()
        first: float | None = None
        out: list[int] = []
        for token in llm.generate(prompt.ids, temp=0.0):  # type: ignore[attr-defined]
            if first is None:
                first = time.perf_counter()
            if token in eos:
                break
            out.append(token)
            if len(out) >= max_new_tokens:
                break
        wall = time.perf_counter() - start
        return Run(len(out), wall, (first or start + wall) - start, token_ids=out)

    return run


def llama_instances(lm: TargetModel, n_ctx: int) -> dict[str, object]:
    """llama-cpp-python ``Llama`` instances on ``lm``'s file, with the back end's settings:
    greedy, greedy with llama.cpp's default f16 keys and values, and prompt lookup."""
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from ragspec.backends.llamacpp import kv_type_id

    s = lm.settings  # type: ignore[union-attr]
    kw = dict(n_ctx=n_ctx, n_threads=s.threads, n_threads_batch=s.threads_batch, n_batch=s.n_batch,
              n_ubatch=s.n_ubatch, flash_attn=s.flash_attn, verbose=False)
    cache = dict(type_k=kv_type_id(s.type_k), type_v=kv_type_id(s.type_v))
    path = str(lm.path)  # type: ignore[union-attr]
    return {
        "llama_greedy": llama_cpp.Llama(path, **kw, **cache),
        # llama.cpp's (and Ollama's) default cache: f16 keys and values, whose one-token steps split attention.
        "llama_greedy_f16_kv": llama_cpp.Llama(path, **kw, type_k=kv_type_id("f16"), type_v=kv_type_id("f16")),
        # logits_all=True as well: with a draft model Llama keeps every position's logits, but sizes its
        # score array from this argument, and overflows it after n_batch positions without it (0.3.36).
        "llama_prompt_lookup": llama_cpp.Llama(path, logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10),
                                               **kw, **cache),
    }


@torch.inference_mode()
def verify_costs(gen: SpeculativeGenerator, context: Sequence[int], lengths: Sequence[int] = (1, 2, 4, 8, 12, 16),
                 repeats: int = 7) -> dict[int, float]:
    """r(k): the time of a forward over ``1 + k`` positions after ``context`` (a workload prompt),
    in one-position forwards after the same context; medians of ``repeats`` interleaved timings."""
    cache = gen.backend.new_cache(len(context) + max(lengths) + 2)
    gen.backend.forward(list(context), cache, last_only=True)
    times: dict[int, list[float]] = {k: [] for k in (0, *lengths)}
    for _ in range(repeats):
        for k in times:
            start = time.perf_counter()
            gen.backend.forward([1] * (k + 1), cache)
            times[k].append(time.perf_counter() - start)
            cache.crop(-(k + 1))
    step = statistics.median(times[0])
    return {k: round(statistics.median(times[k]) / step, 2) for k in lengths}


def kept_length(gen: SpeculativeGenerator, prompt: Prompt, max_new_tokens: int, repetition_stop: int) -> tuple[int, str]:
    """The tokens an answer keeps when ragspec's repetition stop ends it, and how it ended
    (``"eos"``, ``"repetition"``, ``"length"``); ``max_new_tokens`` when the stop is off."""
    if not repetition_stop:
        return max_new_tokens, "unchecked"
    r = gen.generate(prompt.ids, references=prompt.passages, max_new_tokens=max_new_tokens,
                     repetition_stop=repetition_stop)
    return (len(r.token_ids) if r.finish_reason == "repetition" else max_new_tokens), r.finish_reason


# -- driver -----------------------------------------------------------------------------------
def run_benchmark(
    *,
    model: str = "default",
    draft_model: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    questions: int = 30,
    question_sets: Sequence[Path] = (),
    open_ended: int = 10,
    max_new_tokens: int = 96,
    oracle_k: int = 8,
    structured: int = 0,
    repetition_stop: int = QA_DEFAULTS["repetition_stop"],
    backends: Sequence[str] = ("torch", "llamacpp"),
    llamacpp: object | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, object]:
    """Run every method on the RAG workload and the open-ended one; returns the report as a dict.

    ``backends`` picks the method families (``"torch"``, ``"llamacpp"``); llama.cpp runs only
    GGUF models, with ``llamacpp`` (a ``LlamaCppSettings``) or its defaults. Each answer is cut
    where ``repetition_stop`` (tokens; 0: off) ends it (see the module's docstring). The RAG workload
    is the first ``questions`` bundled questions, or of ``question_sets`` when given.
    """
    from ragspec.backends import is_gguf_name
    from ragspec.backends import llamacpp as llamacpp_backend

    unknown = sorted(set(backends) - set(GREEDY))
    if unknown or not backends:
        raise ValueError(f"unknown backends {unknown}: use torch and/or llamacpp")
    use_llama = "llamacpp" in backends
    if use_llama and not (llamacpp_backend.available() and is_gguf_name(model)):
        progress("skipping the llama.cpp methods: they need a GGUF model and llama-cpp-python "
                 f"(`{llamacpp_backend.INSTALL_HINT}`)")
        use_llama = False
    lm = load_model(model, device=device, dtype=dtype, backend="torch") if "torch" in backends else None
    cpp = load_model(model, backend="llamacpp", llamacpp=llamacpp) if use_llama else None  # type: ignore[arg-type]
    if lm is None and cpp is None:
        raise ValueError("no back end left to run")
    # One generator per method: each reuses only its own previous prompt's prefix (the system prompt).
    methods: dict[str, Callable[[Prompt, int], Run]] = {}
    generators: list[SpeculativeGenerator] = []
    oracles: dict[str, tuple[OracleDrafter, str]] = {}  # oracle method -> its drafter and the plain run it replays
    report: dict[str, object] = {"cpu": cpu_features(), "max_new_tokens": max_new_tokens, "repetition_stop": repetition_stop,
                                 "question_sets": [str(f) for f in question_sets],
                                 "workloads": {}, "endings": {}, "verify_cost": {}}
    if lm is not None:
        plain, ngram = SpeculativeGenerator(lm), SpeculativeGenerator(lm)
        methods |= {
            "hf_greedy": hf_method(lm),
            "hf_prompt_lookup": hf_method(lm, prompt_lookup_num_tokens=10),
            "ragspec_plain": ragspec_method(plain, speculative=False),
            "ragspec_ngram": ragspec_method(ngram, speculative=True),
        }
        generators += [plain, ngram]
        if head_path(lm.name).is_file():  # the model has a draft head: also measured with it
            with_head = SpeculativeGenerator(lm, draft_head=True)
            methods["ragspec_ngram_head"] = ragspec_method(with_head, speculative=True)
            generators.append(with_head)
        if draft_model:
            both = SpeculativeGenerator(lm, draft_model=draft_model)
            methods["ragspec_ngram_model"] = ragspec_method(both, speculative=True)
            generators.append(both)
        report |= {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).removeprefix("torch."),
                   "prompt_dtype": str(lm.prompt_dtype or lm.dtype).removeprefix("torch."),
                   "threads": torch.get_num_threads(), "ragspec_forward": plain.backend.description}
    if cpp is not None:
        cplain, cngram = SpeculativeGenerator(cpp), SpeculativeGenerator(cpp)
        methods |= {m: llama_method(llm, cpp.eos_token_ids) for m, llm in llama_instances(cpp, n_ctx=4096).items()}
        methods |= {
            "ragspec_llamacpp_plain": ragspec_method(cplain, speculative=False),
            "ragspec_llamacpp_ngram": ragspec_method(cngram, speculative=True),
        }
        generators += [cplain, cngram]
        report |= {"llamacpp": cplain.backend.description}
        report.setdefault("model", cpp.name)
        report.setdefault("device", "cpu")
        report.setdefault("dtype", cpp.quantization)
        report.setdefault("threads", cpp.settings.threads_batch)
    for name, target, source in [(f"oracle_k{oracle_k}", lm, "ragspec_plain"),
                                 (f"oracle_llamacpp_k{oracle_k}", cpp, "ragspec_llamacpp_plain")]:
        if target is not None:
            drafter = OracleDrafter()
            gen = SpeculativeGenerator(target, drafter=drafter, policy=FixedPolicy(k=oracle_k, min_match=0))
            methods[name] = ragspec_method(gen, speculative=True)
            generators.append(gen)
            oracles[name] = (drafter, source)

    # Untimed, one per back end (their outputs differ): where each answer ends by itself.
    cutters = {fam: SpeculativeGenerator(t) for fam, t in (("torch", lm), ("llamacpp", cpp)) if t is not None}
    tokenizer_lm = lm if lm is not None else cpp
    workloads = {"rag": rag_prompts(tokenizer_lm, questions, question_sets=question_sets)}
    if open_ended:
        workloads["open"] = open_prompts(tokenizer_lm, open_ended)
    warm = workloads["rag"][0]
    for m, fn in methods.items():  # one untimed run each: allocator and kernel warm-up
        if m in oracles:
            drafter, source = oracles[m]
            drafter.truth = methods[source](warm, 8).token_ids
        fn(warm, 8)
    for gen in generators:  # the warm-up prompt is also measured: its answer must not be drafted from
        if isinstance(gen.drafter.copies, NgramDrafter):
            gen.drafter.copies = NgramDrafter(history_tokens=gen.drafter.copies.history_tokens)
    for name, prompts in workloads.items():
        runs: dict[str, list[Run]] = {m: [] for m in methods}
        endings: dict[str, dict[str, int]] = {fam: {} for fam in cutters}
        for i, prompt in enumerate(prompts):
            budget = {}
            for fam, cutter in cutters.items():
                budget[fam], ending = kept_length(cutter, prompt, max_new_tokens, repetition_stop)
                endings[fam][ending] = endings[fam].get(ending, 0) + 1
            for gen in generators:  # every method prefills the whole prompt, as transformers and Llama do here
                gen.clear_cache()
            # Rotate the order; the oracles go last because they replay a plain run's output.
            order = [m for m in methods if m not in oracles]
            order = order[i % len(order) :] + order[: i % len(order)] + list(oracles)
            for m in order:
                if m in oracles:
                    drafter, source = oracles[m]
                    drafter.truth = runs[source][-1].token_ids
                with _PeakRss() as rss:
                    run = methods[m](prompt, budget[family(m)])
                run.peak_rss_mb = rss.peak
                runs[m].append(run)
            progress(f"[{name} {i + 1}/{len(prompts)}] " + "  ".join(
                f"{m}={decode_tokens_per_s(runs[m][-1:]):.1f}" for m in methods))
        report["workloads"][name] = [asdict(s) for s in summarize(runs)]  # type: ignore[index]
        report["endings"][name] = endings  # type: ignore[index]
    # r(k) of each back end, timed after the first RAG prompt (the workload's context length).
    context = workloads["rag"][0].ids
    if lm is not None:
        report["verify_cost"]["torch"] = verify_costs(ngram, context)  # type: ignore[index]
    if cpp is not None:
        report["verify_cost"]["llamacpp"] = verify_costs(cngram, context)  # type: ignore[index]
    for gen in generators:  # the timing replaced a llama.cpp generator's cache
        gen.clear_cache()
    if structured and lm is not None:  # its own methods and columns (benchmarks.bench_structured)
        from benchmarks.bench_structured import run_structured

        report["structured"] = run_structured(lm, structured, progress=progress)
    return report


def summarize(runs: dict[str, list[Run]]) -> list[MethodSummary]:
    base = {fam: decode_tokens_per_s(runs[m]) for fam, m in GREEDY.items() if m in runs}
    reference = {fam: [r.token_ids for r in runs[m]] for fam, m in GREEDY.items() if m in runs}
    greedy_runs = {fam: runs[m] for fam, m in GREEDY.items() if m in runs}
    out = []
    for method, rs in runs.items():
        greedy = greedy_runs.get(family(method))
        greedy_wall = sum(r.wall_s for r in greedy) if greedy else 0.0
        ttft_ratios = [r.ttft_s / g.ttft_s for r, g in zip(rs, greedy or []) if g.ttft_s > 0]
        forwards = sum(r.forwards or 0 for r in rs)
        drafted = sum(r.drafted for r in rs)
        steps = sum(max((r.forwards or 1) - 1, 1) for r in rs)
        tps = decode_tokens_per_s(rs)
        ref = reference.get(family(method))
        wall = sum(r.wall_s for r in rs)
        out.append(MethodSummary(
            method=method,
            decode_tokens_per_s=round(tps, 2),
            ratio_vs_hf_greedy=round(tps / base["torch"], 3) if base.get("torch") else None,
            ratio_vs_llama_greedy=round(tps / base["llamacpp"], 3) if base.get("llamacpp") else None,
            ttft_ms=round(1000 * sum(r.ttft_s for r in rs) / len(rs), 1),
            e2e_tokens_per_s=round(sum(r.new_tokens for r in rs) / wall, 2) if wall > 0 else 0.0,
            tokens_per_forward=round(sum(r.new_tokens for r in rs) / forwards, 2) if forwards else None,
            acceptance_rate=round(sum(r.accepted for r in rs) / drafted, 3) if drafted else None,
            draft_ms_per_step=round(1000 * sum(r.draft_s for r in rs) / steps, 3) if forwards else None,
            peak_rss_mb=round(max(r.peak_rss_mb for r in rs), 1),
            identical=sum(r.token_ids == want for r, want in zip(rs, ref)) if ref is not None else None,
            prompts=len(rs),
            answer_ms=round(1000 * wall / len(rs), 1),
            answer_vs_greedy=round(wall / greedy_wall, 3) if greedy_wall > 0 else None,
            ttft_vs_greedy=round(statistics.median(ttft_ratios), 3) if ttft_ratios else None,
        ))
    return out


def format_table(rows: Sequence[dict[str, object]]) -> str:
    cols = ["method", "answer_ms", "answer_vs_greedy", "ttft_ms", "ttft_vs_greedy", "decode_tokens_per_s",
            "ratio_vs_hf_greedy", "ratio_vs_llama_greedy", "e2e_tokens_per_s", "tokens_per_forward", "acceptance_rate",
            "draft_ms_per_step", "peak_rss_mb", "identical"]
    heads = ["method", "answer ms", "answer time vs greedy", "TTFT ms", "TTFT vs greedy", "decode tok/s", "vs HF greedy",
             "vs llama.cpp greedy", "e2e tok/s", "tok/forward", "acceptance", "draft ms/step", "peak MB", "identical"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in rows:
        cells = []
        for c in cols:
            v = row.get(c)
            if c == "identical" and v is not None:
                cells.append(f"{v}/{row['prompts']}")
            else:
                cells.append("–" if v is None else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latency_headline(rows: Sequence[dict[str, object]], method: str = "ragspec_ngram") -> str:
    """One line: ``method``'s time to the whole answer and to the first token, against its back end's greedy."""
    row = next((r for r in rows if r["method"] == method), None)
    if row is None or row.get("answer_vs_greedy") is None:
        return ""
    greedy = GREEDY[family(method)]
    return (f"{method}: whole answer in {row['answer_ms']:.0f} ms, {row['answer_vs_greedy']:.2f}x {greedy}'s time; "
            f"first token in {row['ttft_ms']:.0f} ms, {row['ttft_vs_greedy']:.2f}x {greedy}'s")


def headline(rows: Sequence[dict[str, object]], method: str = "ragspec_ngram") -> str:
    """One line: ``method``'s speed against every other method, and its share of its back end's oracle's."""
    speed = {str(r["method"]): float(r["decode_tokens_per_s"]) for r in rows}  # type: ignore[arg-type]
    if not speed.get(method):
        return ""
    parts = [f"{speed[method] / v:.2f}x {m}" for m, v in speed.items()
             if m != method and not m.startswith("oracle") and v > 0]
    oracle = next((v for m, v in speed.items() if m.startswith("oracle") and family(m) == family(method)), 0.0)
    if oracle > 0:
        parts.append(f"{speed[method] / oracle:.0%} of the oracle's speed")
    return f"{method}: " + ", ".join(parts)


def plot(report: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads: dict[str, list[dict[str, object]]] = report["workloads"]  # type: ignore[assignment]
    costs: dict[str, dict[str, float]] = {b: c for b, c in report.get("verify_cost", {}).items() if c}  # type: ignore[union-attr]
    panels = len(workloads) + (1 if costs else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    if costs:  # r(k) of each back end: what a verify of k drafted tokens costs, in plain steps
        ax = axes[0][-1]
        for backend, curve in costs.items():
            points = sorted((int(k), float(v)) for k, v in curve.items())  # JSON keys are strings
            ax.plot([k for k, _ in points], [v for _, v in points], marker="o",
                    label={"torch": "PyTorch", "llamacpp": "llama.cpp"}.get(backend, backend))
        ax.plot([0, 16], [1, 17], color="#bbb", lw=0.8, ls="--", label="k+1 plain steps")
        ax.set_ylim(0, 10)
        ax.set_xlabel("drafted tokens verified, k")
        ax.set_ylabel("r(k): verify cost in plain steps")
        ax.set_title("verify cost r(k)")
        ax.legend()
    for ax, (name, rows) in zip(axes[0], workloads.items()):
        # Each method against its own back end's greedy decoding (transformers or llama.cpp).
        names = [str(r["method"]) for r in rows]
        key = {"torch": "ratio_vs_hf_greedy", "llamacpp": "ratio_vs_llama_greedy"}
        ratios = [float(r.get(key[family(n)]) or 0.0) for r, n in zip(rows, names)]  # type: ignore[arg-type]
        colors = ["#888" if n.startswith(("hf", "llama_", "oracle")) else "#2a7" if family(n) == "torch" else "#27a"
                  for n in names]
        bars = ax.barh(names, ratios, color=colors)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.bar_label(bars, fmt="%.2fx")
        ax.invert_yaxis()
        ax.set_title(f"{name} workload: decode speed vs its back end's greedy")
        ax.set_xlabel(f"ratio ({report['model']}, {report['device']}, {report['dtype']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="target model (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft-model", default=None, help="a same-vocabulary draft model (adds a method)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA; on CPU bf16-prompts), bf16-prompts (fp32 with "
                        "prompts in bf16 where the CPU has AMX or AVX512-BF16), float32, bfloat16, float16")
    parser.add_argument("--questions", type=int, default=30, help="bundled RAG questions to run (max 39)")
    parser.add_argument("--question-set", action="append", type=Path, default=[], metavar="FILE",
                        help="RAG questions from this JSON file (a 'questions' list of objects with a 'question') "
                             "instead of the bundled ones, asked over the bundled corpus; repeatable, in order")
    parser.add_argument("--open-ended", type=int, default=10, help="open-ended prompts with nothing to copy (max 10)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--oracle-k", type=int, default=8, help="tokens the oracle drafter proposes per step")
    parser.add_argument("--repetition-stop", type=int, default=QA_DEFAULTS["repetition_stop"],
                        help="cut each answer where ragspec's repetition stop ends it (tokens; 0: let answers loop "
                             "to --max-new-tokens)")
    parser.add_argument("--structured", type=int, default=20,
                        help="questions of the structured-extraction workload (JSON Schema, constrained decoding); 0 skips it")
    parser.add_argument("--backends", default="torch,llamacpp",
                        help="method families to run, comma-separated: torch, llamacpp (default: both; llama.cpp "
                             "needs a GGUF model and ragspec[llamacpp])")
    parser.add_argument("--llamacpp-threads", type=int, default=None,
                        help="llama.cpp threads for every method's steps, prompts and verification (default: the "
                             "physical cores, ragspec's default)")
    parser.add_argument("--llamacpp-ubatch", type=int, default=512, help="llama.cpp micro-batch size (default: 512)")
    parser.add_argument("--out", default="bench-out", help="directory for report.json and speedup.png")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - set(GREEDY):
        parser.error("--backends takes torch and/or llamacpp")
    try:
        from ragspec.backends.llamacpp import LlamaCppSettings

        settings = LlamaCppSettings(n_threads=args.llamacpp_threads, n_threads_batch=args.llamacpp_threads,
                                    n_ubatch=args.llamacpp_ubatch, n_batch=max(512, args.llamacpp_ubatch))
    except ValueError as e:
        parser.error(str(e))
    for name in ("questions", "open_ended", "max_new_tokens", "oracle_k", "structured", "repetition_stop"):
        if getattr(args, name) < (0 if name in ("open_ended", "structured", "repetition_stop") else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive")
    report = run_benchmark(
        model=args.model, draft_model=args.draft_model, device=args.device, dtype=args.dtype,
        questions=args.questions, question_sets=args.question_set, open_ended=args.open_ended, max_new_tokens=args.max_new_tokens,
        oracle_k=args.oracle_k, structured=args.structured, repetition_stop=args.repetition_stop,
        backends=backends, llamacpp=settings,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "speedup.png")
    prompts = f", prompts in {report['prompt_dtype']}" if report.get("prompt_dtype", report["dtype"]) != report["dtype"] else ""
    print(f"\n{report['model']} on {report['device']} ({report['dtype']}{prompts}, {report['threads']} threads), "
          f"max_new_tokens={report['max_new_tokens']}, repetition_stop={report['repetition_stop']}\nCPU: {report['cpu']}")
    for label, key in (("ragspec on PyTorch", "ragspec_forward"), ("ragspec on llama.cpp", "llamacpp")):
        if key in report:
            print(f"{label}: {report[key]}")
    for name, rows in report["workloads"].items():  # type: ignore[union-attr]
        lines = [f(rows, m) for m in ("ragspec_ngram", "ragspec_llamacpp_ngram") for f in (latency_headline, headline)]
        print(f"\n{name} workload\n{format_table(rows)}\n" + "\n".join(line for line in lines if line))
        for fam, ended in report["endings"][name].items():  # type: ignore[index]
            print(f"{fam} answers ended by: " + ", ".join(f"{k} {v}" for k, v in sorted(ended.items())))
    for backend, costs in report["verify_cost"].items():  # type: ignore[union-attr]
        print(f"r(k) on {backend} (verify of k drafted tokens, in plain steps): "
              + ", ".join(f"r({k})={v}" for k, v in costs.items()))
    if "structured" in report:
        from benchmarks.bench_structured import format_table as structured_table

        print(f"\nstructured workload (grammar-constrained extraction)\n{structured_table(report['structured'])}")  # type: ignore[arg-type]
    print(f"\nwrote {out / 'report.json'} and {out / 'speedup.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
