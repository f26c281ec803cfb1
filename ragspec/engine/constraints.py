"""Constrained decoding: a grammar restricts the target's next-token distribution.

Two objects, one for each moment:

- ``Constraint`` says *what* the output must be (a JSON Schema, any JSON object, a regex, a Lark
  grammar, or the tool-call format of ``ragspec.engine.tool_calls``). It is immutable and checked when
  it is built, so an invalid or unsupported schema is an error before any generation starts. It
  travels in ``GenerationConfig.constraint``, like every other per-call setting.
- ``Grammar`` is one request's parser state over the model's tokenizer. The generator asks it
  for the allowed tokens at every position a verify forward scores (``allowed``), for the tokens
  it forces (``forced``: JSON keys, punctuation), to cut a draft at the first token it rejects
  (``cut``) and to append forced tokens to a draft (``extend``); it advances only over accepted
  tokens (``advance``). While masks for drafted positions are computed, the parser walks the
  draft and is rolled back to where it was (llguidance keeps the states to roll back to).

The engine is llguidance (see docs/structured-output.md for the comparison with xgrammar): a
3 MB wheel with no dependencies, sub-millisecond grammar compilation, and masks in tens of
microseconds per token on the default 49k-token vocabulary.

JSON output is compact with one space after ``:`` and ``,`` (``{"a": 1, "b": 2}``) and no other
whitespace: every key, quote and separator is then forced, so it is drafted for free.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np

if TYPE_CHECKING:  # torch and transformers are imported when a grammar is compiled, not by the LangChain classes
    import torch

    from ragspec.engine.drafting import Draft

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How constrained JSON is laid out (see the module docstring)."""


class ConstraintError(ValueError):
    """An invalid or unsupported schema, regex or grammar, or one that allows no output."""


@dataclass(frozen=True)
class Constraint:
    """What the output must match; build one with ``json_schema``, ``json``, ``regex`` or ``lark``."""

    kind: str
    """``"json_schema"``, ``"json"``, ``"regex"``, ``"lark"`` or ``"tool_calls"``."""
    grammar: str
    """The grammar in llguidance's serialized form."""
    source: str
    """The schema (as JSON), regex or Lark text it was built from."""

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str | bool) -> Constraint:
        """Output is JSON valid against ``schema`` (a dict or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConstraintError(f"the JSON Schema is not valid JSON: {e}") from e
            except RecursionError:
                raise ConstraintError("the JSON Schema is nested too deeply to be read") from None
        if isinstance(schema, bool) or not isinstance(schema, Mapping):
            raise ConstraintError(
                f"a JSON Schema must be a JSON object (a dict), got {type(schema).__name__}: {schema!r}"
            )
        check_finite(schema)
        try:
            text = json.dumps(schema)
        except (TypeError, ValueError) as e:
            raise ConstraintError(f"the JSON Schema cannot be written as JSON: {e}") from e
        except RecursionError:
            raise ConstraintError("the JSON Schema is nested too deeply to be written as JSON") from None
        return cls._checked("json_schema", lambda: llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS),
                            text, "JSON Schema")

    @classmethod
    def json(cls) -> Constraint:
        """Output is one JSON object (JSON mode: no schema)."""
        return replace(cls.json_schema({"type": "object"}), kind="json")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Output matches ``pattern`` as a whole (Rust ``regex`` syntax, close to Python's)."""
        if not isinstance(pattern, str):
            raise ConstraintError(f"a regex must be a string, got {type(pattern).__name__}")
        return cls._checked("regex", lambda: llguidance.LLMatcher.grammar_from_regex(pattern), pattern, "regex")

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        """Output is in the language of a Lark grammar (llguidance's dialect, ``%json {...}`` included)."""
        if not isinstance(grammar, str):
            raise ConstraintError(f"a Lark grammar must be a string, got {type(grammar).__name__}")
        return cls._checked("lark", lambda: llguidance.LLMatcher.grammar_from_lark(grammar), grammar, "Lark grammar")

    @classmethod
    def _checked(cls, kind: str, build: Callable[[], str], source: str, what: str) -> Constraint:
        try:
            grammar = build()
            error = llguidance.LLMatcher.validate_grammar(grammar)
        except (ValueError, RuntimeError) as e:  # e.g. a schema nested too deeply for the engine
            raise ConstraintError(f"invalid or unsupported {what}: {e}") from e
        if error:
            raise ConstraintError(f"invalid or unsupported {what}: {error.strip()}")
        return cls(kind, grammar, source)


MAX_FINITE_CHECK_STEPS = 10_000
"""Most subschemas ``check_finite`` visits; beyond it the schema is left to the grammar engine."""


def check_finite(schema: Mapping[str, Any], what: str = "the JSON Schema") -> None:
    """``ConstraintError`` for a schema whose every instance would contain itself: an object that
    requires a property whose schema (through local references ``$ref``, ``allOf``, every ``anyOf``/``oneOf``
    branch, or arrays with ``minItems``) leads back to it, as ``{"type": "object", "properties": {"a":
    {"$ref": "#"}}, "required": ["a"]}``. No finite JSON matches it; llguidance accepts it and only
    fails deep into generation (its parser's item limit), so it is refused here, when a request is
    built. Conservative: a schema it cannot follow (remote refs, ``type`` lists) passes."""
    steps = [0]

    def resolve(ref: str) -> Any:
        if ref == "#":
            return schema
        if not ref.startswith("#/"):
            return None
        node: Any = schema
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, Mapping) else None
        return node

    def finite(node: Any, resolving: frozenset[str]) -> bool:
        steps[0] += 1
        if not isinstance(node, Mapping) or steps[0] > MAX_FINITE_CHECK_STEPS:
            return True
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in resolving:
                return False
            if not finite(resolve(ref), resolving | {ref}):
                return False
        for key in ("anyOf", "oneOf"):
            branches = node.get(key)
            if isinstance(branches, list) and branches and not any(finite(b, resolving) for b in branches):
                return False
        parts = node.get("allOf")
        if isinstance(parts, list) and not all(finite(p, resolving) for p in parts):
            return False
        if node.get("type") == "object":
            properties = node.get("properties")
            required = node.get("required")
            if isinstance(properties, Mapping) and isinstance(required, list):
                if any(isinstance(n, str) and n in properties and not finite(properties[n], resolving) for n in required):
                    return False
        if node.get("type") == "array":
            least = node.get("minItems", 0)
            if isinstance(least, int) and least > 0 and not finite(node.get("items"), resolving):
                return False
        return True

    try:
        ok = finite(schema, frozenset())
    except RecursionError:
        raise ConstraintError(f"{what} is nested too deeply") from None
    if not ok:
        raise ConstraintError(
            f"no finite JSON matches {what}: a required property (or a non-empty array's items) refers back "
            "to the schema that contains it; make that property optional or allow another type (anyOf with null)"
        )


OPENAI_RESPONSE_FORMATS = ("text", "json_object", "json_schema")
"""The ``type`` values of OpenAI's ``response_format``."""


def response_format_constraint(
    value: object, schema_for: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
) -> Constraint | None:
    """OpenAI's ``response_format`` as a constraint: ``{"type": "text"}`` -> None (no constraint),
    ``{"type": "json_object"}`` -> any JSON object, ``{"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}}}`` -> JSON valid against the schema. Anything else is a
    ``ConstraintError`` saying what is accepted. ``schema_for`` rewrites the schema first (``/v1``
    bounds its strings). The one reader of this format (``/v1`` and the LangChain classes'
    ``response_format=`` both use it)."""
    kind = response_format_kind(value)
    if kind is None:
        return None
    if kind == "json_object":
        return Constraint.json()
    schema = value["json_schema"]["schema"]  # type: ignore[index]
    try:
        schema = schema if schema_for is None else schema_for(schema)
    except RecursionError:
        raise ConstraintError("the JSON Schema is nested too deeply") from None
    return Constraint.json_schema(schema)


def response_format_kind(value: object) -> str | None:
    """``"json_object"`` or ``"json_schema"`` for a ``response_format`` of that shape, None for
    ``{"type": "text"}``; ``ConstraintError`` for anything else. Checks the shape only: nothing is
    compiled (``/v1`` checks a request with it before the request holds the model)."""
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return kind
    if kind == "json_schema":
        assert isinstance(value, Mapping)
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise ConstraintError('a json_schema response_format must be {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}')
        return kind
    raise ConstraintError(
        'response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}'
    )


_tokenizers: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], llguidance.LLTokenizer]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def engine_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face fast tokenizer (built once per tokenizer, ~1 s, then cached)."""
    import llguidance.hf

    key = (vocab_size, tuple(sorted(eos_token_ids)))
    with _lock:
        per_tokenizer = _tokenizers.setdefault(tokenizer, {})
        if key not in per_tokenizer:
            try:
                per_tokenizer[key] = llguidance.hf.from_tokenizer(
                    tokenizer, n_vocab=vocab_size, eos_token=list(key[1]) or None
                )
            except Exception as e:  # llguidance only takes fast (Rust) tokenizers
                raise ConstraintError(
                    f"constrained decoding needs a fast Hugging Face tokenizer; {type(tokenizer).__name__} "
                    f"could not be read by llguidance ({e})"
                ) from e
        return per_tokenizer[key]


class Grammar:
    """One request's grammar state over the model's tokenizer (see the module docstring)."""

    def __init__(
        self, constraint: Constraint, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]
    ) -> None:
        self.constraint = constraint
        self.vocab_size = vocab_size
        self._eos = frozenset(eos_token_ids)
        self._matcher = llguidance.LLMatcher(
            engine_tokenizer(tokenizer, vocab_size, eos_token_ids), constraint.grammar, log_level=0
        )
        if self._matcher.is_error():
            raise ConstraintError(f"the {constraint.kind} constraint cannot be used: {self._matcher.get_error()}")
        self._words = (vocab_size + 31) // 32
        self._bits = np.zeros((1, self._words), dtype="<u4")  # one bit per token, little-endian words
        self.mask_s = 0.0
        """Seconds spent computing masks (for stats)."""
        self.masks = 0
        """Masks computed."""
        if not bool(self.allowed(())[0].any()):
            raise ConstraintError(f"the {constraint.kind} constraint allows no output with this model's tokenizer")
        self.mask_s, self.masks = 0.0, 0  # that check is not decoding

    # -- masks --------------------------------------------------------------------------------
    def allowed(self, drafted: Sequence[int]) -> torch.Tensor:
        """Allowed tokens after the accepted tokens and after each prefix of ``drafted``:
        ``[1 + k, vocab]`` bool. ``drafted`` must be valid (``cut`` makes it so)."""
        import torch

        start = time.perf_counter()
        rows = len(drafted) + 1
        if self._bits.shape[0] < rows:
            self._bits = np.zeros((rows, self._words), dtype="<u4")
        bits = self._bits[:rows]
        m = self._matcher
        consumed = 0
        for j in range(rows):
            if j > 0 and drafted[j - 1] in self._eos:  # the output ends there: only EOS after it
                bits[j:] = 0
                for t in self._eos:
                    bits[j:, t // 32] |= np.uint32(1 << (t % 32))
                break
            m.unsafe_compute_mask_ptr(bits[j].ctypes.data, self._words * 4)
            if j < len(drafted) and drafted[j] not in self._eos:
                if not m.consume_token(drafted[j]):
                    self._rollback(consumed)
                    raise AssertionError(f"drafted token {drafted[j]} is not allowed by the grammar (uncut draft)")
                consumed += 1
        self._rollback(consumed)
        # numpy, single-threaded: torch's thread pool costs milliseconds on tensors this small when
        # the cores are busy (measured here: 15 ms instead of 36 us per mask).
        unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, : self.vocab_size]
        allowed = torch.from_numpy(unpacked.view(np.bool_))
        self.mask_s += time.perf_counter() - start
        self.masks += rows
        return allowed

    def mask(self, logits: torch.Tensor, drafted: Sequence[int]) -> torch.Tensor:
        """``logits`` (``[1 + k, vocab]``) with the tokens the grammar rejects at each position set to -inf."""
        import torch

        allowed = self.allowed(drafted).to(logits.device)
        if allowed.shape[-1] < logits.shape[-1]:  # ids past the tokenizer's vocabulary are never allowed
            allowed = torch.nn.functional.pad(allowed, (0, logits.shape[-1] - allowed.shape[-1]))
        return logits.masked_fill(~allowed[:, : logits.shape[-1]], float("-inf"))

    # -- state --------------------------------------------------------------------------------
    def _rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens. EOS is never consumed here: when the grammar scans
        it, llguidance does not record it as a token, and a rollback would then undo one too many."""
        if n and not self._matcher.rollback(n):
            raise AssertionError(f"grammar rollback of {n} tokens failed: {self._matcher.get_error()}")

    def advance(self, tokens: Sequence[int]) -> None:
        """Consume accepted tokens (each was allowed by the mask it was chosen under); an EOS ends the output."""
        tokens = list(tokens)
        ends = [i for i, t in enumerate(tokens) if t in self._eos]
        tokens = tokens[: ends[0]] if ends else tokens
        if tokens and not self._matcher.consume_tokens(tokens):
            raise AssertionError(f"accepted tokens rejected by the grammar: {self._matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar allows nothing more than the end of the output."""
        return self._matcher.is_stopped()

    # -- drafting -----------------------------------------------------------------------------
    def forced(self, max_tokens: int, after: Sequence[int] = ()) -> tuple[int, ...]:
        """Tokens the grammar forces next (after the accepted tokens and then ``after``)."""
        if max_tokens <= 0:
            return ()
        if any(t in self._eos for t in after):  # nothing follows the end of the output
            return ()
        m = self._matcher
        if after and not m.consume_tokens(list(after)):
            raise AssertionError("forced() after tokens the grammar rejects")
        tokens = tuple(m.compute_ff_tokens()[:max_tokens])
        self._rollback(len(after))
        return tokens

    def forced_draft(self, max_tokens: int) -> Draft | None:
        """The tokens the grammar forces next as a draft (source ``GRAMMAR``), or None."""
        from ragspec.engine.drafting import Draft, DraftSource

        tokens = self.forced(max_tokens)
        return Draft(tokens, DraftSource.GRAMMAR, forced=len(tokens)) if tokens else None

    def cut(self, draft: Draft) -> Draft:
        """``draft`` up to its first token the grammar rejects (no tokens when that is the first).

        A sampled draft (with ``probs``) keeps the draft distribution of the rejected token as an
        extra row: rejection sampling then draws the replacement from the residual, as if the
        token had been verified and rejected (which keeps sampling exact).
        """
        n = self._matcher.validate_tokens(list(draft.tokens)) if draft.tokens else 0
        end = next((i + 1 for i, t in enumerate(draft.tokens[:n]) if t in self._eos), None)
        if end is not None:  # nothing is drafted after an EOS: the output ends there
            return draft.truncated(end)
        if n == len(draft.tokens):
            return draft
        if draft.probs is not None:
            return replace(draft, tokens=draft.tokens[:n], probs=draft.probs[: n + 1])
        return draft.truncated(n)

    def extend(self, draft: Draft, max_tokens: int) -> Draft:
        """``draft`` followed by the tokens the grammar forces after it (deterministic drafts only)."""
        if draft.probs is not None or len(draft) >= max_tokens:
            return draft
        tail = self.forced(max_tokens - len(draft), after=draft.tokens)
        if not tail:
            return draft
        return replace(draft, tokens=draft.tokens + tail, forced=draft.forced + len(tail))
