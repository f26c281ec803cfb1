"""Structured-extraction benchmark: fill a JSON Schema from retrieved passages, four ways side by side.

Each bundled question gets the top passages of the bundled corpus (hybrid retrieval) and asks
for a JSON record with six fields (``EXTRACTION_SCHEMA``): the answer, a quote copied from the
passages, the passage's source file, a confidence level, whether the answer has a number, and a
few keywords. Methods, interleaved prompt by prompt with a rotating order:

- ``constrained_speculative``: ragspec, grammar-constrained, drafting from the passages and the
  grammar's forced tokens (keys, quotes, separators);
- ``constrained_plain``: ragspec, grammar-constrained, one token per forward (the same output);
- ``unconstrained_plain``: ragspec, no grammar, one token per forward (what the grammar costs);
- ``hf_llguidance``: transformers ``generate`` (greedy) with a logits processor driving the same
  grammar engine (llguidance), the usual way to get structured output from transformers.

Reported per method: decode tokens/s and the ratio to ``constrained_plain``, tokens per target
forward, the share of output tokens drafted by the grammar and kept, the grammar engine's time
per mask, and how many outputs equal ``constrained_plain``'s token for token (and parse as JSON).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import llguidance
import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from benchmarks.bench_workload import FirstTokenTimer, TimedRun, decode_tokens_per_s, retrieved_questions
from ragspec.engine.constraints import Constraint, engine_tokenizer
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.backends.pytorch.loading import LoadedModel

EXTRACTION_SCHEMA = {
    "title": "Extraction",
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 300},
        "quote": {"type": "string", "maxLength": 400},
        "source": {"type": "string", "maxLength": 80},
        "confidence": {"enum": ["high", "medium", "low"]},
        "mentions_number": {"type": "boolean"},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
    },
    "required": ["answer", "quote", "source", "confidence", "mentions_number", "keywords"],
    "additionalProperties": False,
}
INSTRUCTION = (
    "Answer the question from the passages as a JSON object with these fields: answer (one sentence), "
    "quote (the sentence of a passage that supports it, copied exactly), source (the file name of that "
    "passage), confidence (high, medium or low), mentions_number (true if the answer has a number) and "
    "keywords (up to three)."
)


@dataclass
class Item:
    ids: list[int]
    passages: list[str]


@dataclass
class Run(TimedRun):
    forced: int = 0
    """Tokens the grammar allowed alone (drafted for free)."""
    mask_s: float = 0.0
    masks: int = 0
    """Grammar masks computed (``mask_s`` the seconds they took)."""
    token_ids: list[int] = field(default_factory=list)
    text: str = ""


@dataclass
class Summary:
    method: str
    decode_tokens_per_s: float
    ratio_vs_constrained_plain: float
    tokens_per_forward: float | None
    forced_share: float | None
    mask_us_per_token: float | None
    identical: int
    valid_json: int
    prompts: int


def extraction_items(lm: LoadedModel, n: int, k: int = 3) -> list[Item]:
    """The first ``n`` bundled questions, each with its top ``k`` passages, as chat prompts."""
    from ragspec.prompts import format_passages

    items = []
    for q, passages in retrieved_questions(n, k):
        chat = [
            {"role": "system", "content": INSTRUCTION},
            {"role": "user", "content": f"{format_passages(passages)}\n\nQuestion: {q['question']}"},
        ]
        text = lm.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        items.append(Item(list(lm.tokenizer.encode(text, add_special_tokens=False)), [p.page_content for p in passages]))
    return items


class LLGuidanceProcessor(LogitsProcessor):
    """A transformers logits processor that masks with llguidance (batch of one, greedy or sampled)."""

    def __init__(self, lm: LoadedModel, constraint: Constraint, prompt_len: int) -> None:
        vocab = int(lm.model.config.vocab_size)
        eos = [lm.tokenizer.eos_token_id]
        self.matcher = llguidance.LLMatcher(engine_tokenizer(lm.tokenizer, vocab, eos), constraint.grammar, log_level=0)
        self.words, self.vocab, self.prompt_len = (vocab + 31) // 32, vocab, prompt_len
        self.bits = np.zeros(self.words, dtype="<u4")
        self.mask_s, self.masks = 0.0, 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        start = time.perf_counter()
        generated = input_ids.shape[1] - self.prompt_len
        if generated:
            assert self.matcher.consume_token(int(input_ids[0, -1])), self.matcher.get_error()
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.words * 4)
        allowed = torch.from_numpy(np.unpackbits(self.bits.view(np.uint8), bitorder="little")[: self.vocab].view(np.bool_))
        self.mask_s += time.perf_counter() - start
        self.masks += 1
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))


def hf_method(lm: LoadedModel, constraint: Constraint) -> Callable[[Item, int], Run]:
    eos = lm.tokenizer.eos_token_id

    @torch.inference_mode()
    def run(item: Item, max_new_tokens: int) -> Run:
        ids = torch.tensor([item.ids], device=lm.device)
        processor = LLGuidanceProcessor(lm, constraint, len(item.ids))
        timer = FirstTokenTimer()
        start = time.perf_counter()
        out = lm.model.generate(
            ids, max_new_tokens=max_new_tokens, do_sample=False, streamer=timer, pad_token_id=eos,
            logits_processor=LogitsProcessorList([processor]),
        )
        wall = time.perf_counter() - start
        new = out[0, ids.shape[1] :].tolist()
        if eos in new:
            new = new[: new.index(eos)]
        return Run(len(new), wall, (timer.first or start + wall) - start, None, 0, processor.mask_s,
                   processor.masks, new, lm.tokenizer.decode(new))

    return run


def ragspec_method(
    gen: SpeculativeGenerator, constraint: Constraint | None, speculative: bool
) -> Callable[[Item, int], Run]:
    def run(item: Item, max_new_tokens: int) -> Run:
        r = gen.generate(item.ids, references=item.passages, max_new_tokens=max_new_tokens,
                         speculation=speculative, constraint=constraint)
        s = r.stats
        forced = s.by_source["grammar"].accepted if "grammar" in s.by_source else 0
        return Run(s.new_tokens, s.wall_s, s.ttft_s, s.forward_passes, forced, s.mask_s, s.masks, r.token_ids, r.text)

    return run


def run_structured(
    lm: LoadedModel, questions: int = 20, max_new_tokens: int = 160, progress: Callable[[str], None] = print
) -> list[dict[str, object]]:
    """Run the four methods on the extraction workload; rows of the report (see the module docstring)."""
    constraint = Constraint.json_schema(EXTRACTION_SCHEMA)
    spec, plain, free = SpeculativeGenerator(lm), SpeculativeGenerator(lm), SpeculativeGenerator(lm)
    methods: dict[str, Callable[[Item, int], Run]] = {
        "constrained_speculative": ragspec_method(spec, constraint, True),
        "constrained_plain": ragspec_method(plain, constraint, False),
        "unconstrained_plain": ragspec_method(free, None, False),
        "hf_llguidance": hf_method(lm, constraint),
    }
    items = extraction_items(lm, questions)
    for fn in methods.values():  # untimed warm-up
        fn(items[0], 8)
    for gen in (spec, plain, free):
        gen.clear_cache()
    runs: dict[str, list[Run]] = {m: [] for m in methods}
    for i, item in enumerate(items):
        order = list(methods)[i % len(methods) :] + list(methods)[: i % len(methods)]
        for m in order:
            runs[m].append(methods[m](item, max_new_tokens))
        progress(f"[structured {i + 1}/{len(items)}] " + "  ".join(f"{m}={decode_tokens_per_s(runs[m][-1:]):.1f}" for m in methods))
    return [asdict(s) for s in summarize(runs)]


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def summarize(runs: dict[str, list[Run]]) -> list[Summary]:
    base = decode_tokens_per_s(runs["constrained_plain"])
    reference = [r.token_ids for r in runs["constrained_plain"]]
    out = []
    for method, rs in runs.items():
        forwards = sum(r.forwards or 0 for r in rs)
        tokens = sum(r.new_tokens for r in rs)
        masks = sum(r.masks for r in rs)
        out.append(Summary(
            method=method,
            decode_tokens_per_s=round(decode_tokens_per_s(rs), 2),
            ratio_vs_constrained_plain=round(decode_tokens_per_s(rs) / base, 3) if base else 0.0,
            tokens_per_forward=round(tokens / forwards, 2) if forwards else None,
            forced_share=round(sum(r.forced for r in rs) / tokens, 3) if forwards and masks and tokens else None,
            mask_us_per_token=round(1e6 * sum(r.mask_s for r in rs) / masks, 1) if masks else None,
            identical=sum(r.token_ids == ref for r, ref in zip(rs, reference)),
            valid_json=sum(_parses(r.text) for r in rs),
            prompts=len(rs),
        ))
    return out


def format_table(rows: Sequence[dict[str, object]]) -> str:
    cols = ["method", "decode_tokens_per_s", "ratio_vs_constrained_plain", "tokens_per_forward", "forced_share",
            "mask_us_per_token", "identical", "valid_json"]
    heads = ["method", "decode tok/s", "vs constrained plain", "tok/forward", "forced share", "mask µs/token",
             "identical", "valid JSON"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in rows:
        cells = [f"{row[c]}/{row['prompts']}" if c in ("identical", "valid_json") else "–" if row[c] is None else str(row[c])
                 for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
