"""A larger model: plain decode and prefill of PyTorch fp32 against llama.cpp (Q4_1, Q8_0).

Speculation on random weights means nothing, the speed of a step does: this builds a
~1.1B-parameter Llama with random weights in the default model's vocabulary (TinyLlama's shape:
hidden 2048, 22 layers, 32 heads, 4 key/value heads, MLP 5632, tied embeddings), writes it as a
GGUF file (``ragspec.backends.gguf_export``: F16, then quantized to Q4_1 and Q8_0 by llama.cpp's
own ``llama_model_quantize``; the files are cached under ``<ragspec cache>/bench/``), and times,
interleaved round by round on the same prompt:

- prefill: a ``--prompt-tokens`` prompt (time to its first token's logits);
- plain decode: ``--decode-tokens`` one-token steps after it (tokens/s);
- the verify cost r(k) (a forward over 1 + k positions, in one-token steps) for k = 4 and 8.

Back ends: ragspec's PyTorch forward on the fp32 weights (the lean Llama forward), and ragspec's
llama.cpp back end on each GGUF file, with one-token steps on 1 thread (bit-identical speculation)
and on every physical core (the back end's default since issue 38, the fastest plain decoding).

``--single-core`` runs everything on one thread and times it in CPU seconds of the process
(``time.process_time``) instead of wall time: a proxy that stays meaningful on a machine other
jobs are using (wall time there measures the other jobs), at the price of ignoring how each back
end scales over cores.

    python benchmarks/large_model_bench.py [--rounds 2] [--prompt-tokens 400] [--decode-tokens 32]
    python benchmarks/large_model_bench.py --layers 2   # a quick smoke run of the same code
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragspec.backends import Backend, make_backend  # noqa: E402
from ragspec.backends.gguf_export import cached_quantizations, write_llama_gguf  # noqa: E402
from ragspec.backends.llamacpp import LlamaCppSettings, load_llamacpp, physical_cores  # noqa: E402
from ragspec.backends import load_model  # noqa: E402
from ragspec.backends.models import default_gguf_path  # noqa: E402
from ragspec.backends.pytorch.loading import LoadedModel  # noqa: E402
from retrievers.cache import cache_root  # noqa: E402


def random_llama(layers: int, seed: int = 0) -> LoadedModel:
    """TinyLlama's shape with random weights in the default model's vocabulary and tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_model("default").tokenizer
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    return LoadedModel(model, tokenizer, f"random-llama-{layers}L", torch.device("cpu"), torch.float32)


def gguf_files(lm: LoadedModel, layers: int, kinds: tuple[str, ...]) -> dict[str, Path]:
    """The model as GGUF files, written and quantized once into the cache (the F16 source is not kept)."""
    return cached_quantizations(
        cache_root() / "bench" / f"random-llama-{layers}L-seed0", "model", kinds,
        lambda path: write_llama_gguf(lm.model, path, tokenizer_from=default_gguf_path(), f16=True, name=lm.name),
    )


def time_backend(backend: Backend, prompt: list[int], decode: int, clock: Callable[[], float]) -> dict[str, float]:
    """Prefill seconds, plain decode tokens/s, and r(4), r(8) after the prompt."""
    cache = backend.new_cache(len(prompt) + decode + 16)
    start = clock()
    token = int(backend.forward(prompt, cache, last_only=True)[0].argmax())
    prefill = clock() - start
    steps = []
    for _ in range(decode):
        t = clock()
        token = int(backend.forward([token], cache)[0].argmax())
        steps.append(clock() - t)
    step = statistics.median(steps)
    costs = {}
    for k in (4, 8):
        t = clock()
        backend.forward([token] * (k + 1), cache)
        costs[f"r({k})"] = (clock() - t) / step
        cache.crop(-(k + 1))
    return {"prefill_s": prefill, "decode_tok_s": 1.0 / step, **costs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=22, help="decoder layers (22: ~1.1B parameters)")
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best round of each method is kept")
    parser.add_argument("--single-core", action="store_true",
                        help="one thread everywhere, timed in CPU seconds (a proxy for a busy machine)")
    parser.add_argument("--out", default="bench-out/large_model.json")
    args = parser.parse_args(argv)
    clock = time.process_time if args.single_core else time.perf_counter
    if args.single_core:
        torch.set_num_threads(1)

    lm = random_llama(args.layers)
    params = sum(p.numel() for p in lm.model.parameters())
    print(f"{lm.name}: {params / 1e9:.2f}B parameters", flush=True)
    files = gguf_files(lm, args.layers, ("Q4_1", "Q8_0"))
    cores = 1 if args.single_core else physical_cores()
    methods: dict[str, Callable[[], Backend]] = {"pytorch_fp32": lambda: make_backend(lm)}
    for kind, path in files.items():
        for threads in sorted({1, cores}):
            settings = LlamaCppSettings(n_threads=threads, n_threads_batch=cores)
            model = load_llamacpp(path, settings=settings)
            methods[f"llamacpp_{kind}_{threads}t"] = lambda model=model: make_backend(model)
    backends = {name: make() for name, make in methods.items()}
    prompt = torch.randint(100, len(lm.tokenizer), (args.prompt_tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in backends}
    with torch.inference_mode():
        for r in range(args.rounds):
            for name in (list(backends)[r % len(backends):] + list(backends)[: r % len(backends)]):
                results[name].append(time_backend(backends[name], prompt, args.decode_tokens, clock))
                print(f"round {r + 1} {name}: " + ", ".join(f"{k}={v:.2f}" for k, v in results[name][-1].items()), flush=True)
    best = {name: {"prefill_s": min(x["prefill_s"] for x in rs), "decode_tok_s": max(x["decode_tok_s"] for x in rs),
                   "r(4)": min(x["r(4)"] for x in rs), "r(8)": min(x["r(8)"] for x in rs)} for name, rs in results.items()}
    base = best["pytorch_fp32"]
    print(f"\n{lm.name} ({params / 1e9:.2f}B), prompt {args.prompt_tokens} tokens, {cores} cores used, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
          + ("CPU seconds (--single-core)" if args.single_core else "wall seconds"))
    print("| back end | prefill s | decode tok/s | decode vs PyTorch | r(4) | r(8) |\n|---|---|---|---|---|---|")
    for name, b in best.items():
        print(f"| {name} | {b['prefill_s']:.2f} | {b['decode_tok_s']:.2f} | {b['decode_tok_s'] / base['decode_tok_s']:.2f}x "
              f"| {b['r(4)']:.2f} | {b['r(8)']:.2f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": lm.name, "parameters": params, "prompt_tokens": args.prompt_tokens,
                               "clock": "process CPU seconds" if args.single_core else "wall seconds",
                               "descriptions": {n: b.description for n, b in backends.items()}, "best": best,
                               "rounds": results}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
