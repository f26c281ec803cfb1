"""vLLM side by side: no speculation, its n-gram (defaults and tuned), its suffix decoding, ragspec's
proposer, vLLM's ``draft_model`` alone and ragspec's hybrid (n-gram drafts and the same draft model's,
chosen per request and step; ``--draft-model``); and ragspec's own engine (plain and with its
drafting, one client) on the same prompts.

Each method is one vLLM server (started here on 127.0.0.1 with the same flags; on a CPU all of them
at once, idle but for the one measured, and each cell runs the methods one after another, their
order reversed from cell to cell, so that the machine's drift hits them alike),
measured on the bundled RAG workload (a question and 3 retrieved passages) and the open workload
(no passages) at 1, 4 and 8 concurrent streaming clients, each client count on prompts of its own
(the same for every method). Per method, workload and client count: decode tokens/s as all
tokens after each answer's first over all the time from each answer's first to its last token kept
(the headline: a 7-token answer weighs what it decodes, not what a 59-token one does), the mean of
the per-request rates beside it, total throughput (all new tokens over the wall time), mean TTFT,
vLLM's own drafted/accepted counters (``/metrics``), how many answers ended by themselves (EOS, or
where ragspec's repetition stop cuts them, see ``stream``; not the token limit), and how many
outputs equal vLLM without speculation token for token (at 1 client, where batching does not
change the numerics), compared on what both engines emit: the answer's ids without the EOS that
ended it (vLLM returns it among the ids, ragspec's engine does not; ``stream`` drops it, once).

Every method starts from a state of its own: each vLLM method is its own server (they share no
cache), and ragspec's own engine gets a new generator (empty prefix cache, no earlier answers to
draft from) for every method and cell, on one loaded model. Prefix caching is one switch for all
methods (``--prefix-caching``, default on as in both engines; ``--no-prefix-caching`` turns it off
in vLLM and in ragspec's engine alike), and the report states it.
ragspec's proposer also reports the step costs it measured (``r``: a step of
T tokens in one-token steps, keyed by T - 1), which is vLLM's verify cost on this device; the
hybrid, per cell, the drafted tokens each engine step kept by source (n-gram / model), and in the
report its draft model's timed work by steps.

    python benchmarks/vllm_bench.py                                   # CPU: the default model, fp32
    python benchmarks/vllm_bench.py --questions 1 --open-ended 1 --clients 1 --max-tokens 8   # a smoke run
    python benchmarks/vllm_bench.py --device cuda --model /models/Qwen2.5-7B-Instruct \\
        --draft-model /models/Qwen2.5-0.5B-Instruct \\
        --vllm-arg=--gpu-memory-utilization=0.85                      # a GPU: nothing else changes

Run it alone (``flock /tmp/ragspec-bench.lock python benchmarks/vllm_bench.py``); it writes
``bench-out/vllm_bench.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import OPEN_ENDED, open_prompts, rag_prompts  # noqa: E402
from ragspec.backends.pytorch.loading import model_folder  # noqa: E402
from ragspec.backends.vllm.proposer import STATS_ENV  # noqa: E402
from ragspec.backends.vllm.draft import draft_folder  # noqa: E402
from ragspec.backends.vllm.server import VllmServer, hybrid_config, speculative_config  # noqa: E402
from ragspec.pipeline import QA_DEFAULTS  # noqa: E402
from ragspec.prompts import chat_prompt_ids  # noqa: E402
from ragspec.remote import load_tokenizer  # noqa: E402
from ragspec.engine.text import RepeatGuard, sentence_end_tokens  # noqa: E402


def methods(draft_tokens: int, ngram_best: dict[str, Any], draft: Path | None) -> dict[str, dict[str, Any] | None]:
    """Each vLLM method's speculative config (``None``: none). With a draft model, vLLM's
    ``draft_model`` alone and ragspec's hybrid (``HYBRID_METHODS``: started with ``hybrid=True``)."""
    table: dict[str, dict[str, Any] | None] = {
        "vllm": None,
        "vllm_ngram": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
        "vllm_ngram_best": {"method": "ngram", **ngram_best},
        "vllm_suffix": {"method": "suffix", "num_speculative_tokens": draft_tokens},
        "vllm_ragspec": speculative_config(draft_tokens),
    }
    if draft is not None:
        table["vllm_draft_model"] = hybrid_config(draft, draft_tokens)
        table["vllm_hybrid"] = hybrid_config(draft, draft_tokens)
    return table


HYBRID_METHODS = {"vllm_hybrid"}
STATS_METHODS = ("vllm_ragspec", "vllm_hybrid")
"""Methods whose drafter writes its statistics (``RAGSPEC_PROPOSER_STATS``): kept in the report."""


@dataclass
class Request:
    prompt: int
    tokens: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    decode_s: float = 0.0
    finish: str | None = None
    """``eos`` (the answer ended itself; its EOS is not among ``tokens``), ``length`` or ``repetition``."""


@dataclass
class Cell:
    method: str
    workload: str
    clients: int
    decode_tokens_per_s: float
    """All tokens after each answer's first over all their decode time (the headline)."""
    mean_request_tokens_per_s: float
    """The mean of the per-request decode rates."""
    throughput_tokens_per_s: float
    ttft_s: float
    drafted: int
    accepted: int
    ended_by_eos: int
    ended_by_repeat: int
    requests: int
    identical: int | None = None
    by_source: dict[str, float] | None = None
    """The hybrid's drafted tokens kept per engine step, by source (``ngram``, ``model``), and its steps."""


def stream(base_url: str, index: int, ids: list[int], max_tokens: int, guard: RepeatGuard | None, eos: int | None
           ) -> Request:
    """One streamed greedy answer, cut as ragspec in front of vLLM cuts it: where it starts
    repeating itself (``guard``, as ``RemoteGenerator`` builds it), the stream is closed, which
    ends the request in vLLM; the tokens kept are those before the repeat, timed to the token that
    showed it. So a loop, which every method drafts well from the answer itself, is not measured.
    An answer that ends by itself ends with the ``eos`` id among vLLM's ids: it is dropped here,
    so that ``tokens`` is what ragspec's own engine returns for the same answer."""
    body = {"model": "bench", "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "return_token_ids": True}
    request = Request(index)
    start = time.perf_counter()
    arrived: list[float] = []  # when each token came
    with httpx.stream("POST", f"{base_url}/completions", json=body, timeout=900) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or ():
                new = choice.get("token_ids") or []
                finish = choice.get("finish_reason")
                if finish == "stop":  # no stop strings here: vLLM stopped at the EOS, the last id
                    if new and new[-1] == eos:
                        new = new[:-1]
                    finish = "eos"
                request.tokens += new
                arrived += [time.perf_counter()] * len(new)
                request.finish = finish or request.finish
                cut = guard.add(new) if guard is not None else None
                if cut is not None:
                    del request.tokens[cut:]
                    request.finish = "repetition"
                    break
            if request.finish == "repetition":
                break
    kept = arrived[: len(request.tokens)]  # decode time ends at the last token kept, not at the repeat's
    request.ttft_s = (kept[0] if kept else time.perf_counter()) - start
    request.decode_s = kept[-1] - kept[0] if kept else 0.0
    return request


def counters(base_url: str) -> tuple[int, int]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    found = {"vllm:spec_decode_num_draft_tokens_total": 0.0, "vllm:spec_decode_num_accepted_tokens_total": 0.0}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return int(found["vllm:spec_decode_num_draft_tokens_total"]), int(found["vllm:spec_decode_num_accepted_tokens_total"])


def run_cell(base_url: str, prompts: list[list[int]], clients: int, max_tokens: int,
             new_guard: Callable[[], RepeatGuard | None], eos: int | None) -> tuple[list[Request], float, int, int]:
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(prompts)):
        todo.put(i)
    done: list[Request] = []
    lock = threading.Lock()

    def client() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            result = stream(base_url, i, prompts[i], max_tokens, new_guard(), eos)
            with lock:
                done.append(result)

    drafted0, accepted0 = counters(base_url)
    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    drafted1, accepted1 = counters(base_url)
    return sorted(done, key=lambda r: r.prompt), wall, drafted1 - drafted0, accepted1 - accepted0


def summarize(method: str, workload: str, clients: int, runs: list[Request], wall: float, drafted: int, accepted: int
              ) -> Cell:
    timed = [r for r in runs if len(r.tokens) > 1 and r.decode_s > 0]
    decode_s = sum(r.decode_s for r in timed)
    return Cell(
        method, workload, clients,
        decode_tokens_per_s=sum(len(r.tokens) - 1 for r in timed) / decode_s if decode_s else 0.0,
        mean_request_tokens_per_s=statistics.mean((len(r.tokens) - 1) / r.decode_s for r in timed) if timed else 0.0,
        throughput_tokens_per_s=sum(len(r.tokens) for r in runs) / wall,
        ttft_s=statistics.mean(r.ttft_s for r in runs),
        drafted=drafted, accepted=accepted,
        ended_by_eos=sum(1 for r in runs if r.finish == "eos"),
        ended_by_repeat=sum(1 for r in runs if r.finish == "repetition"),
        requests=len(runs),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="a model folder, a .gguf file or 'default' (SmolLM2-135M-Instruct)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: fp32, 1 GiB KV cache; cuda: bf16")
    p.add_argument("--questions", type=int, default=12, help="RAG prompts per client count (bundled questions, default 12)")
    p.add_argument("--open-ended", type=int, default=8,
                   help=f"open prompts per client count ({len(OPEN_ENDED)} in all, default 8)")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--repetition-stop", type=int, default=QA_DEFAULTS["repetition_stop"],
                   help="cut an answer where it repeats this many of its own tokens, as ragspec does (0: off)")
    p.add_argument("--clients", default="1,4,8", help="concurrency levels (default 1,4,8)")
    p.add_argument("--methods", default="vllm,vllm_ragspec,vllm_ngram,vllm_ngram_best,vllm_suffix,vllm_draft_model,"
                                        "vllm_hybrid,ragspec_plain,ragspec_ngram",
                   help="vLLM servers (vllm*) and ragspec's own engine (ragspec_*), measured in this order")
    p.add_argument("--draft-tokens", type=int, default=8,
                   help="longest draft of ragspec's proposer, suffix decoding, vLLM's draft_model and the hybrid")
    p.add_argument("--draft-model", default="weak",
                   help="the draft model of vllm_draft_model and vllm_hybrid: a folder of the same tokenizer, 'default' "
                        "(the model as its own draft) or 'weak' (the default model cut to 2 layers; default)")
    p.add_argument("--ngram-best", default='{"num_speculative_tokens": 4, "prompt_lookup_min": 3, "prompt_lookup_max": 5}',
                   help="vLLM n-gram settings of the tuned row (JSON)")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the keys and values of earlier prompts' shared prefixes, in every method alike "
                        "(vLLM's --enable-prefix-caching, ragspec's prefix cache; default on, as in both)")
    p.add_argument("--vllm-arg", action="append", default=[], help="a flag passed to every vLLM server (repeatable)")
    p.add_argument("--out", default=str(ROOT / "bench-out" / "vllm_bench.json"))
    p.add_argument("--together", action=argparse.BooleanOptionalAction, default=None,
                   help="start every vLLM server at once and interleave the methods cell by cell (default on a CPU; "
                        "on a GPU each server would need its share of memory: --vllm-arg=--gpu-memory-utilization=...)")
    p.add_argument("--keep", action="store_true",
                   help="keep the other methods' cells of an earlier run in --out (same settings) and add these")
    args = p.parse_args(argv)

    folder = model_folder(args.model)
    tokenizer = load_tokenizer(str(folder))
    lm = SimpleNamespace(tokenizer=tokenizer)
    levels = [int(c) for c in args.clients.split(",")]
    # Each client count gets prompts of its own: the proposer keeps earlier answers as a source,
    # and a question answered again would be drafted whole from its own earlier answer.
    workloads = {"rag": [q.ids for q in rag_prompts(lm, args.questions * len(levels))],
                 "open": [q.ids for q in open_prompts(lm, args.open_ended * len(levels))]}
    for name, count in (("rag", args.questions), ("open", args.open_ended)):
        if len(workloads[name]) < count * len(levels):
            p.error(f"--{'questions' if name == 'rag' else 'open-ended'} {count} at {len(levels)} client counts needs "
                    f"{count * len(levels)} {name} prompts; there are {len(workloads[name])}")
    workloads = {name: every for name, every in workloads.items() if every}  # --open-ended 0: RAG only
    warm_up = chat_prompt_ids(tokenizer, [{"role": "user", "content": "Say hello."}])
    ends = sentence_end_tokens(tokenizer)

    def new_guard() -> RepeatGuard | None:  # the repetition stop as ragspec applies it (12 tokens or a sentence)
        return RepeatGuard(args.repetition_stop, ends) if args.repetition_stop else None
    flags = ["--max-model-len", "2048", "--max-num-seqs", str(max(levels)), "--seed", "0",
             "--enable-prefix-caching" if args.prefix_caching else "--no-enable-prefix-caching", *args.vllm_arg]
    if args.device == "cuda":
        flags += ["--dtype", "bfloat16"]
    chosen = args.methods.split(",")
    needs_draft = any(m in ("vllm_draft_model", "vllm_hybrid") for m in chosen)
    table = methods(args.draft_tokens, json.loads(args.ngram_best), draft_folder(args.draft_model) if needs_draft else None)
    cells: list[Cell] = []
    outputs: dict[str, dict[str, list[list[int]]]] = {}
    report: dict[str, Any] = {"model": str(folder), "device": args.device, "max_tokens": args.max_tokens,
                              "repetition_stop": args.repetition_stop, "prefix_caching": args.prefix_caching,
                              "flags": flags, "draft_model": args.draft_model if needs_draft else None, "cells": [],
                              "proposer": None, "skipped": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.keep and out.is_file():  # an earlier run's other methods, measured with the same settings
        earlier = json.loads(out.read_text())
        if any(earlier.get(k) != report[k] for k in ("model", "device", "max_tokens", "repetition_stop", "prefix_caching",
                                                     "flags")):
            p.error(f"--keep: {out} was measured with other settings")
        cells += [Cell(**c) for c in earlier["cells"] if c["method"] not in chosen]
        outputs.update({m: o for m, o in earlier.get("outputs", {}).items() if m not in chosen})
        report["skipped"] = {m: why for m, why in earlier.get("skipped", {}).items() if m not in chosen}
        report["proposer"] = earlier.get("proposer")

    servers: dict[str, VllmServer] = {}
    eos = tokenizer.eos_token_id
    own_model: list[Any] = []  # ragspec's own engine's model, loaded once for its methods

    def start(method: str) -> Any:
        """The method's ``run(prompts, clients)`` -> (requests, wall s, drafted, accepted), or None."""
        if method in OWN_ENGINE:
            if not own_model:
                own_model.append(load_own_model(folder, args.device))

            def run_own(prompts: list[list[int]], _: int) -> tuple[list[Request], float, int, int]:
                generator = fresh_generator(own_model[0], args.draft_tokens, args.prefix_caching, warm_up)
                return own_cell(generator, prompts, args.max_tokens, new_guard, OWN_ENGINE[method])
            return run_own
        server = VllmServer(folder, speculation=table[method], extra_args=flags, served_name="bench",
                            hybrid=method in HYBRID_METHODS,
                            env={STATS_ENV: str(out.parent / f"{method}-proposer.json")}, log=out.parent / f"{method}.log")
        started = time.perf_counter()
        try:
            server.start()
        except Exception as e:  # noqa: BLE001 - e.g. suffix decoding without arctic-inference: reported, not fatal
            report["skipped"][method] = str(e)[:500]
            print(f"{method}: not measured: {str(e)[:300]}", file=sys.stderr)
            return None
        servers[method] = server
        print(f"{method}: server up in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        stream(server.base_url, 0, warm_up, 8, None, eos)  # a prompt of no workload
        return lambda prompts, clients: run_cell(server.base_url, prompts, clients, args.max_tokens, new_guard, eos)

    def measure(runners: dict[str, Any]) -> None:
        """Every cell, each cell's methods one after another, their order reversed from cell to cell."""
        turn = 0
        for workload, every in workloads.items():
            per_cell = len(every) // len(levels)
            for level, clients in enumerate(levels):
                prompts = every[level * per_cell : (level + 1) * per_cell]
                order = [m for m in runners if clients == 1 or m not in OWN_ENGINE]
                for method in order if turn % 2 == 0 else order[::-1]:
                    before = drafter_stats(method)
                    runs, wall, drafted, accepted = runners[method](prompts, clients)
                    cell = summarize(method, workload, clients, runs, wall, drafted, accepted)
                    cell.by_source = per_step_by_source(before, drafter_stats(method, flush=True))
                    if clients == 1:
                        outputs.setdefault(method, {})[workload] = [r.tokens for r in runs]
                    cells.append(cell)
                    print(json.dumps(asdict(cell)), file=sys.stderr)
                turn += 1
                save()

    def drafter_stats(method: str, flush: bool = False) -> dict[str, Any] | None:
        """The hybrid's statistics; with ``flush``, after a one-token request of no workload: the drafter
        counts a request's last steps when it sees the batch without it, at the next request's first step."""
        if method not in HYBRID_METHODS:
            return None
        if flush:
            stream(servers[method].base_url, 0, warm_up, 1, None, eos)
        path = out.parent / f"{method}-proposer.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def save() -> None:
        mark_identical(cells, outputs)
        for method in STATS_METHODS:  # the drafters' own figures (the hybrid's: tokens drafted and kept by source)
            stats = out.parent / f"{method}-proposer.json"
            if method in servers and stats.is_file():
                key = "proposer" if method == "vllm_ragspec" else method
                report[key] = json.loads(stats.read_text())
        report["cells"] = [asdict(c) for c in cells]
        report["outputs"] = outputs
        out.write_text(json.dumps(report, indent=2))

    together = args.together if args.together is not None else args.device == "cpu"
    try:
        if together:  # all servers up at once, so that every cell compares the methods minutes apart
            runners = {m: r for m in chosen if (r := start(m)) is not None}
            measure(runners)
        else:  # one server at a time (e.g. one GPU that one server fills)
            for method in chosen:
                runner = start(method)
                if runner is not None:
                    measure({method: runner})
                if method in servers:
                    servers.pop(method).stop()
    finally:
        save()
        for server in servers.values():
            server.stop()
    print(format_table(cells))
    return 0


def per_step_by_source(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, float] | None:
    """Drafted tokens kept per engine step by source, between two of the hybrid's statistics, and
    the draft model's forwards and the tokens they took in (``model_forwards``, ``model_tokens``)."""
    if after is None or "accepted_by_source" not in after:
        return None
    was = before or {"steps": 0, "accepted_by_source": {}}
    steps = after["steps"] - was["steps"]
    if steps <= 0:
        return None
    kept = {s: n - was["accepted_by_source"].get(s, 0) for s, n in after["accepted_by_source"].items()}
    # What the draft model cost in the cell, as counts: its forwards and the tokens they took in.
    model = {k: float(after[k] - was.get(k, 0)) for k in ("model_forwards", "model_tokens") if k in after}
    return {**{s: n / steps for s, n in kept.items()}, "steps": float(steps), **model}


def mark_identical(cells: list[Cell], outputs: dict[str, dict[str, list[list[int]]]]) -> None:
    """At one client, how many answers equal vLLM's without speculation token for token."""
    for cell in cells:
        base, mine = outputs.get("vllm", {}).get(cell.workload), outputs.get(cell.method, {}).get(cell.workload)
        if cell.clients == 1 and base is not None and mine is not None:
            cell.identical = sum(a == b for a, b in zip(base, mine))


OWN_ENGINE = {"ragspec_plain": False, "ragspec_ngram": True}
"""ragspec's own engine (PyTorch, one request at a time), plain and with its drafting: 1 client only."""


def load_own_model(folder: Path, device: str) -> Any:
    """The model vLLM serves, loaded for ragspec's own engine in the same dtype (fp32 on a CPU)."""
    from ragspec.backends import load_model

    return load_model(str(folder), device=device, dtype="float32" if device == "cpu" else "bfloat16", backend="torch")


def fresh_generator(model: Any, max_draft: int, prefix_cache: bool, warm_up: list[int]) -> Any:
    """A new generator on ``model`` (its weights shared): an empty prefix cache and no earlier answers
    to draft from, so no method or cell finds another's prompt or answer. Warmed up, as each vLLM
    server is, on a prompt of no workload."""
    from ragspec.decoding.generator import SpeculativeGenerator

    generator = SpeculativeGenerator(model, max_draft=max_draft, prefix_cache=prefix_cache)
    generator.generate(warm_up, max_new_tokens=8, temperature=0.0)
    return generator


def own_cell(generator: Any, prompts: list[list[int]], max_tokens: int, new_guard: Callable[[], RepeatGuard | None],
             speculative: bool) -> tuple[list[Request], float, int, int]:
    """The prompts one after another on ragspec's own engine, cut and timed as ``stream`` cuts vLLM's."""
    runs: list[Request] = []
    drafted = accepted = 0
    for i, ids in enumerate(prompts):
        request, arrived = Request(i), []
        began = time.perf_counter()
        with generator.stream(ids, max_new_tokens=max_tokens, temperature=0.0, speculation=speculative) as deltas:
            for _ in deltas:  # one delta per accepted token
                arrived.append(time.perf_counter())
        result = deltas.result
        request.tokens = list(result.token_ids)  # without the EOS that ended it, as ``stream`` keeps vLLM's
        request.finish = result.finish_reason
        guard = new_guard()
        cut = guard.add(request.tokens) if guard is not None else None
        if cut is not None:
            del request.tokens[cut:]
            request.finish = "repetition"
        kept = arrived[: len(request.tokens)]
        request.ttft_s = (kept[0] if kept else time.perf_counter()) - began
        request.decode_s = kept[-1] - kept[0] if kept else 0.0
        drafted += result.stats.drafted_tokens
        accepted += result.stats.accepted_tokens
        runs.append(request)
    # Its wall time is what a server stopping at the repeat would spend (the answers ran on past it here).
    return runs, sum(r.ttft_s + r.decode_s for r in runs), drafted, accepted


def format_table(cells: list[Cell]) -> str:
    """Decode tok/s is all decoded tokens over all decode time; the mean of the per-request rates beside it;
    each method's decode tok/s also over vLLM's without speculation and over ragspec's proposer alone in
    the same cell (the hybrid's target is the latter's ratio, per cell)."""
    base = {(c.workload, c.clients): c for c in cells if c.method == "vllm"}
    proposer = {(c.workload, c.clients): c for c in cells if c.method == "vllm_ragspec"}
    lines = ["| method | workload | clients | decode tok/s | vs vLLM | vs ragspec's proposer | mean per request | vs vLLM | "
             "throughput tok/s | TTFT s | drafted | accepted | ended by EOS / repeat | identical | "
             "kept per step: n-gram / model (model forwards, tokens) |",
             "|---" * 15 + "|"]

    def sources(by_source: dict[str, float] | None) -> str:
        if not by_source:
            return ""
        kept = f"{by_source.get('ngram', 0.0):.2f} / {by_source.get('model', 0.0):.2f}"
        if "model_forwards" not in by_source:
            return kept
        return f"{kept} ({by_source['model_forwards']:.0f}, {by_source.get('model_tokens', 0.0):.0f})"

    def ratio(mine: float, theirs: float | None) -> str:
        return f"{mine / theirs:.2f}x" if theirs else ""
    for c in cells:
        b = base.get((c.workload, c.clients))
        own = proposer.get((c.workload, c.clients))
        lines.append(
            f"| {c.method} | {c.workload} | {c.clients} | {c.decode_tokens_per_s:.2f} | "
            f"{ratio(c.decode_tokens_per_s, b and b.decode_tokens_per_s)} | "
            f"{ratio(c.decode_tokens_per_s, own and own.decode_tokens_per_s)} | {c.mean_request_tokens_per_s:.2f} | "
            f"{ratio(c.mean_request_tokens_per_s, b and b.mean_request_tokens_per_s)} | "
            f"{c.throughput_tokens_per_s:.2f} | {c.ttft_s:.2f} | {c.drafted} | "
            f"{c.accepted} | {c.ended_by_eos}+{c.ended_by_repeat}/{c.requests} | {'' if c.identical is None else f'{c.identical}/{c.requests}'} | "
            f"{sources(c.by_source)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
