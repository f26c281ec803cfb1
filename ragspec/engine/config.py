"""One validated generation config: every entry point builds it once; per-call overrides merge into it.

``GenerationConfig`` is checked when it is built (types and ranges, with messages that name the
parameter), so nothing deep in the decoding loop meets a float token budget or a NaN
temperature. ``merged(**overrides)`` returns a new config; an unknown name is an error, not
ignored. Options are spelled as users spell them (OpenAI's names: ``max_tokens``, ``temperature``,
``stop``...). Every request — LangChain call keyword arguments, a ``/v1`` body, ``DocumentQA``
options, a registry or remote model's call — becomes a config through ``request_config`` (and
``call_options``, which adds the model name), so a default or a range is written here only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragspec.engine.constraints import Constraint

DEFAULT_MAX_TOKENS = 256
"""Most new tokens when nothing says otherwise (every entry point's default: LangChain, ``/v1``, CLI, web)."""
MIN_TEMPERATURE = 1e-3
"""Smallest sampling temperature; below it logits / temperature overflows fp32. Use 0 for greedy."""
MAX_TEMPERATURE = 2.0
"""Largest sampling temperature, as OpenAI's API takes it (above it the distribution is nearly uniform noise)."""
MAX_SEED = 2**63 - 1
MAX_DRAFT_LIMIT = 256
"""The largest per-request draft cap (``Speculation.max_draft``)."""
VLLM_MAX_DRAFT_ARG = "ragspec_max_draft"
"""The key of vLLM's per-request ``extra_args`` (OpenAI ``vllm_xargs``) that carries a request's draft
cap to ragspec's proposer inside vLLM: ``Speculation.limit``, 0 for no speculation."""


class GenerationConfigError(ValueError):
    """A generation parameter has the wrong type or is out of range; the message names it, ``param`` too."""

    def __init__(self, param: str | None, problem: str) -> None:
        super().__init__(f"{param} {problem}" if param else problem)
        self.param = param
        self.problem = problem

    def named(self, spelling: str) -> str:
        """The message with the parameter spelled otherwise (a CLI flag: ``--presence-penalty must be ...``)."""
        return f"{spelling} {self.problem}" if self.param else str(self)


def _integer(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GenerationConfigError(name, f"must be an integer, got {value!r}")
    if value < minimum:
        raise GenerationConfigError(name, f"must be >= {minimum}, got {value!r}")
    return value


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GenerationConfigError(name, f"must be a finite number, got {value!r}")
    return float(value)


def request_max_tokens(value: object, name: str = "max_tokens") -> int:
    """A request's token budget: an integer of at least 1.

    ``GenerationConfig`` itself allows 0 (a program may prefill a prompt without generating, e.g.
    to warm the prefix cache); a request for no tokens is a mistake, and OpenAI's API refuses it
    too, so every request (``request_config``) goes through this.
    """
    return _integer(name, value, 1)


def stop_strings(value: object) -> tuple[str, ...]:
    """``None``, one string or a sequence of non-empty strings, as a tuple."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Sequence):
        raise GenerationConfigError("stop", f"must be a string or a list of strings, got {value!r}")
    for s in items:
        if not isinstance(s, str) or not s:
            raise GenerationConfigError("stop", f"strings must be non-empty strings, got {s!r}")
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class Speculation:
    """One request's speculation: ``enabled`` (``False`` decodes one token per forward: the same
    output, slower) and ``max_draft``, the most tokens drafted per step (``None``: the engine's own
    limit; a cap below it, never above). The same on every engine: ragspec's own, and ragspec's
    proposer inside vLLM, which receives ``limit`` with the request (``VLLM_MAX_DRAFT_ARG``)."""

    enabled: bool = True
    max_draft: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise GenerationConfigError("speculation.enabled", f"must be true or false, got {self.enabled!r}")
        if self.max_draft is not None:
            _integer("speculation.max_draft", self.max_draft, 1)
            if self.max_draft > MAX_DRAFT_LIMIT:
                raise GenerationConfigError("speculation.max_draft", f"must be at most {MAX_DRAFT_LIMIT}, got {self.max_draft!r}")

    @property
    def limit(self) -> int | None:
        """The most tokens a step may draft for this request: 0 when off, ``None`` when the engine decides."""
        return 0 if not self.enabled else self.max_draft

    def as_dict(self) -> dict[str, Any]:
        """As a request body spells it (only what differs from the default)."""
        out: dict[str, Any] = {} if self.enabled else {"enabled": False}
        if self.max_draft is not None:
            out["max_draft"] = self.max_draft
        return out


def speculation_setting(value: object) -> Speculation:
    """``value`` as a ``Speculation``: one already, ``True``/``False`` (on or off), or a mapping with
    ``enabled`` and/or ``max_draft`` (``{"enabled": false}``, ``{"max_draft": 4}``)."""
    if isinstance(value, Speculation):
        return value
    if isinstance(value, bool):
        return Speculation(enabled=value)
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in ("enabled", "max_draft"))
        if unknown:
            raise GenerationConfigError(
                "speculation", f"takes enabled and max_draft, got unknown key(s) {', '.join(unknown)}"
            )
        return Speculation(**value)
    raise GenerationConfigError(
        "speculation", f'must be true, false or an object like {{"max_draft": 4}}, got {value!r}'
    )


@dataclass(frozen=True)
class GenerationConfig:
    """How to decode: the token budget, stop strings, sampling and how to speculate.

    ``max_tokens`` is the most new tokens (``max_new_tokens``, transformers' name, is the same
    field: accepted when building or merging, and readable). ``temperature`` 0 is greedy
    decoding; above 0 (from ``MIN_TEMPERATURE`` to ``MAX_TEMPERATURE``) tokens are
    sampled, optionally restricted to the ``top_k`` most likely (0: all) and to the smallest set
    whose probability reaches ``top_p`` (1: all). With a ``constraint``, the tokens its grammar
    rejects are removed first, then temperature, ``top_k`` and ``top_p`` apply to the rest. A
    ``seed`` fixes plain sampling; speculative sampling has the same distribution but its sample
    also depends on the drafts.

    Penalties change the target's logits before all of that, at every position from the answer's
    tokens before it (``ragspec.engine.penalties``): ``frequency_penalty`` and ``presence_penalty`` as
    OpenAI defines them, ``repeat_penalty`` over the last ``repeat_last_n`` answer tokens as
    llama.cpp does. None counts the prompt, so copying from the passages is never punished.
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    """Most new tokens; fewer when the context window ends first. 0 prefills only (see ``request_max_tokens``)."""
    stop: tuple[str, ...] = ()
    """The answer ends before the first of these strings."""
    speculation: Speculation = Speculation()
    """Draft and verify (``Speculation``: on or off, and a cap on drafted tokens per step); given as a
    ``Speculation``, ``True``/``False`` or ``{"enabled": false}`` / ``{"max_draft": 4}``. Never changes the output."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it occurs in the answer so far (-2 to 2, as OpenAI)."""
    presence_penalty: float = 0.0
    """Subtracted from a token's logit once it occurs in the answer so far (-2 to 2, as OpenAI)."""
    repeat_penalty: float = 1.0
    """A token among the last ``repeat_last_n`` answer tokens has its logit divided by this (multiplied
    when negative), as llama.cpp and Ollama do; 1 is off."""
    repeat_last_n: int = 64
    """How many of the answer's latest tokens ``repeat_penalty`` looks at; -1: the whole answer, 0: off."""
    repetition_stop: int = 0
    """Once the answer repeats this many of its own tokens verbatim, or a whole sentence of its own (of
    at least 4 tokens), it ends where the repeat begins (``finish_reason`` ``"repetition"``); 0 is off.
    Exact: it only cuts the same answer short."""
    constraint: Constraint | None = None
    """Output must match this grammar (``ragspec.engine.constraints``): JSON Schema, JSON, regex, tool calls."""
    max_new_tokens: InitVar[int | None] = None
    """``max_tokens`` by transformers' name (set one of them)."""

    def __post_init__(self, max_new_tokens: int | None) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once, here
        if max_new_tokens is None:
            set_(self, "max_tokens", _integer("max_tokens", self.max_tokens, 0))
        else:
            set_(self, "max_tokens", _integer("max_new_tokens", max_new_tokens, 0))
        set_(self, "stop", stop_strings(self.stop))
        set_(self, "speculation", speculation_setting(self.speculation))
        temperature = _number("temperature", self.temperature)
        if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
            raise GenerationConfigError(
                "temperature",
                f"must be 0 (greedy) or at least {MIN_TEMPERATURE} and at most {MAX_TEMPERATURE:g}, got {self.temperature!r}",
            )
        set_(self, "temperature", temperature)
        set_(self, "top_k", _integer("top_k", self.top_k, 0))
        top_p = _number("top_p", self.top_p)
        if not 0 < top_p <= 1:
            raise GenerationConfigError("top_p", f"must be in (0, 1] (1 keeps every token), got {self.top_p!r}")
        set_(self, "top_p", top_p)
        for name in ("frequency_penalty", "presence_penalty"):
            value = _number(name, getattr(self, name))
            if not -2 <= value <= 2:
                raise GenerationConfigError(name, f"must be from -2 to 2 (0 is off), got {getattr(self, name)!r}")
            set_(self, name, value)
        repeat_penalty = _number("repeat_penalty", self.repeat_penalty)
        if not repeat_penalty > 0:
            raise GenerationConfigError("repeat_penalty", f"must be > 0 (1 is off), got {self.repeat_penalty!r}")
        set_(self, "repeat_penalty", repeat_penalty)
        set_(self, "repeat_last_n", _integer("repeat_last_n", self.repeat_last_n, -1))
        set_(self, "repetition_stop", _integer("repetition_stop", self.repetition_stop, 0))
        if self.repetition_stop == 1:
            raise GenerationConfigError("repetition_stop", "must be 0 (off) or at least 2 tokens, got 1")
        if self.seed is not None and _integer("seed", self.seed, 0) > MAX_SEED:
            raise GenerationConfigError("seed", f"must be at most {MAX_SEED}, got {self.seed!r}")
        if self.constraint is not None:
            from ragspec.engine.constraints import Constraint

            if not isinstance(self.constraint, Constraint):
                raise GenerationConfigError(
                    "constraint",
                    "must be a ragspec.engine.constraints.Constraint (Constraint.json_schema(schema), "
                    f"Constraint.json(), Constraint.regex(pattern)), got {type(self.constraint).__name__}",
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits."""
        repeat = self.repeat_penalty != 1 and self.repeat_last_n != 0
        return repeat or self.frequency_penalty != 0 or self.presence_penalty != 0

    def merged(self, overrides: Mapping[str, Any] | None = None, /, **kwargs: Any) -> GenerationConfig:
        """A copy with ``overrides`` (and ``kwargs``) applied; names not in the config are an error.

        The way to change a config (``dataclasses.replace`` would hand the old ``max_tokens`` on as
        ``max_new_tokens``)."""
        changes = {**(overrides or {}), **kwargs}
        unknown = sorted(set(changes) - FIELDS - {"max_new_tokens"})
        if unknown:
            raise GenerationConfigError(
                None, f"unknown generation option(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELDS))}"
            )
        if "max_new_tokens" in changes and "max_tokens" in changes:
            raise GenerationConfigError("max_tokens", "or max_new_tokens (the same option): set one, not both")
        if "max_tokens" in changes:  # else ``replace`` passes the old value on as the alias, which would win
            changes["max_new_tokens"] = None
        return replace(self, **changes) if changes else self


GenerationConfig.max_new_tokens = property(  # type: ignore[assignment]  # the alias, readable (set after __init__ is made)
    lambda self: self.max_tokens, doc="``max_tokens`` by transformers' name."
)
FIELDS = frozenset(f.name for f in fields(GenerationConfig))


def request_config(
    defaults: GenerationConfig, options: Mapping[str, Any], stop: Sequence[str] | None = None
) -> GenerationConfig:
    """``defaults`` with one request's generation ``options`` (as users spell them) merged in; ``stop``
    strings are added to the defaults'. A request's ``max_tokens`` must be at least 1
    (``request_max_tokens``). Errors are ``GenerationConfigError``s that name the parameter."""
    for name in ("max_tokens", "max_new_tokens"):
        if options.get(name) is not None:
            request_max_tokens(options[name], name)
    config = defaults.merged(options)
    if stop:
        config = config.merged(stop=(*config.stop, *stop_strings(stop)))
    return config


@dataclass(frozen=True)
class CallOptions:
    """One request's settings: which model, how to decode, and the passages to draft from."""

    model: str
    config: GenerationConfig
    references: tuple[str | list[int], ...] = ()


def call_options(
    model: str, defaults: GenerationConfig, stop: Sequence[str] | None = None, options: Mapping[str, Any] | None = None
) -> CallOptions:
    """One request for ``model`` with ``defaults``: ``options`` may name another ``model`` and set
    generation options (``request_config``); ``stop`` is added."""
    options = dict(options or {})
    if "model" in options:
        model = options.pop("model")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
    return CallOptions(model, request_config(defaults, options, stop))
