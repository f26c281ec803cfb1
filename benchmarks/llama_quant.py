"""Which GGUF quantization makes a llama.cpp verify cheap: r(k) and answer agreement per type.

Speculative decoding on llama.cpp pays when verifying ``k`` drafted tokens (a forward over
``1 + k`` rows) costs little more than one plain step. The shipped default file is Q4_1, which
llama.cpp multiplies row by row (measured r(8) 2.5-3.8 plain steps, docs/backends.md); its
repacked kernels (Q4_0, Q4_K, IQ4_NL) and tinyBLAS (Q8_0, F16) tile several rows. This converts
the default model once, locally, to each candidate type and measures, per type:

- r(k), k = 1..8: a forward over ``1 + k`` positions after the first RAG prompt, in one-position
  forwards after the same prompt (medians of ``--repeats`` interleaved timings, ``bench.verify_costs``);
- the one-token step (ms) and the prompt's prefill (ms, from an empty cache);
- whether the back end's exactness probe passes (a verify batch computing bit for bit what
  one-token steps do; a K-quant may fail it);
- answer agreement with the fp32 PyTorch model: plain greedy answers to bench.py's RAG prompts
  (bundled questions, passages from hybrid retrieval), identical answers and the mean share of each answer's tokens before the first
  difference.

The files come from the fp32 weights ragspec de-quantizes from the default Q4_1 file
(``ragspec.backends.gguf_export``: written as F32 GGUF, then quantized by llama.cpp's own
``llama_model_quantize``), cached under ``<ragspec cache>/bench/quant-<llama-cpp-python version>/``.
So F16 and Q8_0 are the fp32 model to their rounding, and every type starts from Q4_1's values.

    python benchmarks/llama_quant.py [--kinds F16,Q8_0,Q4_0,Q4_1,Q4_K_S,IQ4_NL] [--questions 8] [--out report.json]
    python benchmarks/llama_quant.py --kinds Q8_0 --questions 1 --max-new-tokens 8 --repeats 1   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench import rag_prompts, verify_costs  # noqa: E402
from ragspec.backends import load_model  # noqa: E402
from ragspec.backends.gguf_export import QUANT_TYPES, cached_quantizations, write_llama_gguf  # noqa: E402
from ragspec.backends.llamacpp import PINNED_VERSION, LlamaCppSettings, load_llamacpp  # noqa: E402
from ragspec.backends.models import default_gguf_path  # noqa: E402
from ragspec.decoding.generator import SpeculativeGenerator  # noqa: E402
from retrievers.cache import cache_root  # noqa: E402

KINDS = ("F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K_S", "IQ4_NL")
LENGTHS = tuple(range(1, 9))


@dataclass
class TypeResult:
    kind: str
    file_mb: float
    exact: bool | None
    step_ms: float
    prefill_ms: float
    r: dict[int, float]
    identical: int
    questions: int
    agreement: float
    """Mean share of an answer's tokens before its first difference from the fp32 answer."""


def gguf_files(kinds: tuple[str, ...]) -> dict[str, Path]:
    """The default model as GGUF files of ``kinds``, written (F32, kept) and quantized once into the cache."""
    import llama_cpp

    folder = cache_root() / "bench" / f"quant-{getattr(llama_cpp, '__version__', PINNED_VERSION)}"
    return cached_quantizations(
        folder, "SmolLM2-135M-Instruct", kinds,
        lambda path: write_llama_gguf(load_model("default").model, path, tokenizer_from=default_gguf_path(), f16=False,
                                      name="SmolLM2-135M-Instruct"),
        keep_source=True,
    )


def agreement(answer: list[int], reference: list[int]) -> float:
    """Share of ``reference``'s tokens that ``answer`` matches before their first difference."""
    same = next((i for i, (a, b) in enumerate(zip(answer, reference)) if a != b), min(len(answer), len(reference)))
    return same / max(len(reference), 1) if answer != reference else 1.0


def measure(kind: str, path: Path, prompts: list[tuple[list[int], list[int]]], max_new_tokens: int,
            repeats: int, settings: LlamaCppSettings) -> TypeResult:
    """``prompts``: (prompt ids, the fp32 model's greedy answer) pairs."""
    lm = load_llamacpp(path, settings=settings)
    gen = SpeculativeGenerator(lm)
    context = prompts[0][0]
    r = verify_costs(gen, context, lengths=LENGTHS, repeats=repeats)
    steps, prefills = [], []
    for _ in range(repeats):
        cache = gen.backend.new_cache(len(context) + 2)
        start = time.perf_counter()
        gen.backend.forward(context, cache, last_only=True)
        prefills.append(time.perf_counter() - start)
        start = time.perf_counter()
        gen.backend.forward([1], cache)
        steps.append(time.perf_counter() - start)
    answers = [gen.generate(ids, max_new_tokens=max_new_tokens, speculation=False).token_ids for ids, _ in prompts]
    shares = [agreement(a, ref) for a, (_, ref) in zip(answers, prompts)]
    return TypeResult(
        kind=kind, file_mb=round(path.stat().st_size / 2**20, 1), exact=lm.exact,
        step_ms=round(1000 * statistics.median(steps), 2), prefill_ms=round(1000 * statistics.median(prefills), 1),
        r=r, identical=sum(a == ref for a, (_, ref) in zip(answers, prompts)), questions=len(prompts),
        agreement=round(statistics.mean(shares), 3),
    )


def table(results: list[TypeResult]) -> str:
    head = ["type", "file MB", "exact probe", "step ms", "prefill ms", *(f"r({k})" for k in LENGTHS),
            "identical to fp32", "agreement"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in results:
        cells = [t.kind, t.file_mb, t.exact, t.step_ms, t.prefill_ms, *(t.r[k] for k in LENGTHS),
                 f"{t.identical}/{t.questions}", t.agreement]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"GGUF types to compare (default: {','.join(KINDS)})")
    parser.add_argument("--questions", type=int, default=8, help="bundled document questions (default: 8)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="answer length for agreement (default: 48)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timings per r(k) (default: 7)")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama.cpp threads for steps and batches (default: ragspec's, the physical cores)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in QUANT_TYPES]
    if unknown:
        parser.error(f"unknown types {unknown}: use some of {', '.join(QUANT_TYPES)}")

    files = gguf_files(kinds)
    reference = SpeculativeGenerator("default", dtype="float32")  # fp32 PyTorch: the answers each type is compared with
    prompts = [(p.ids, reference.generate(p.ids, max_new_tokens=args.max_new_tokens, speculation=False).token_ids)
               for p in rag_prompts(reference.target, args.questions)]  # bench.py's RAG prompts (hybrid retrieval)
    settings = LlamaCppSettings(n_threads=args.threads, n_threads_batch=args.threads)
    results = []
    for kind in kinds:
        print(f"measuring {kind} ...", flush=True)
        results.append(measure(kind, files[kind], prompts, args.max_new_tokens, args.repeats, settings))
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps({"llama_cpp_python": PINNED_VERSION, "threads": settings.threads,
                                        "threads_batch": settings.threads_batch, "questions": args.questions,
                                        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                                        "types": [asdict(t) for t in results]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
