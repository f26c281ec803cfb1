"""What a generation returns, torch-free: its result, its statistics, its stream and its errors, and
the ``TextGenerator`` protocol that returns them.

``ragspec.decoding.generator`` (the local speculative generator) and ``ragspec.remote`` (generation on an
OpenAI-compatible server) both return these, so ``DocumentQA``, the LangChain classes and the apps
read one set of types whichever generates; importing this module imports neither torch nor
transformers.
"""

from __future__ import annotations

import threading
from collections.abc import Generator as StepGenerator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from ragspec.engine.config import GenerationConfig


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be found or loaded; the message says what to do."""


class PromptTooLongError(ValueError):
    """The prompt does not fit the model's context window."""


class GeneratorBusyError(RuntimeError):
    """The generator is decoding another request (a generator decodes one request at a time)."""


@dataclass
class SourceStats:
    """Drafting outcome for one draft source."""

    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        """One verified draft of ``drafted`` tokens from this source, ``accepted`` of them kept."""
        self.drafted += drafted
        self.accepted += accepted
        self.verify_steps += 1


@dataclass
class GenerationStats:
    """What one generation call did and how fast."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens whose keys and values were reused from an earlier request (``ragspec.engine.prefix_cache``)."""
    new_tokens: int = 0
    decoded_tokens: int = 0
    """Tokens the target's forwards produced, those a stop then cut off included (the repetition stop drops the
    repeat it detects, a stop string what follows it): what ``tokens_per_forward`` counts."""
    forward_passes: int = 0
    """Target forwards, the prompt's prefill included."""
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    acceptance_histogram: list[int] = field(default_factory=list)
    """``[j]``: verified drafts of which exactly ``j`` tokens were accepted, ``j`` up to the longest draft
    the engine proposes (vLLM's per-request ``acceptance_histogram``). Empty when nothing was drafting:
    speculation off, or an engine that does not report it; then there are no drafting figures."""
    by_source: dict[str, SourceStats] = field(default_factory=dict)
    by_reference: dict[int, SourceStats] = field(default_factory=dict)
    """Drafts copied from each reference, by its index in ``references`` (the ``"passage"`` source split up;
    grammar-forced tokens excluded): ``/v1``'s Predicted Outputs counts come from the prediction's entry."""
    ttft_s: float = 0.0
    """Time to first token: prefill and the first token's decoding."""
    wall_s: float = 0.0
    draft_s: float = 0.0
    """Time spent proposing drafts and choosing their length."""
    mask_s: float = 0.0
    """Time the grammar engine spent computing token masks (constrained decoding only)."""
    masks: int = 0
    """Token masks computed: one per position a forward scored under a constraint."""

    def progress(self, new_tokens: int, wall_s: float) -> None:
        """The answer so far: ``new_tokens`` tokens after ``wall_s`` seconds (the first call sets ``ttft_s``)."""
        self.new_tokens, self.wall_s = new_tokens, wall_s
        self.ttft_s = self.ttft_s or wall_s

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def accepted_by_position(self) -> list[int]:
        """``[i]``: verified drafts whose token ``i`` (0: the first drafted) was accepted."""
        hist = self.acceptance_histogram
        return [sum(hist[i + 1 :]) for i in range(len(hist) - 1)]

    def speculative_decoding(self) -> dict[str, object] | None:
        """The drafting figures in vLLM's per-request shape (``metrics.speculative_decoding`` of its
        responses with ``--per-request-spec-decode-metrics``; ``vllm.v1.metrics.stats.RequestSpecDecodeMetrics``
        in vLLM 0.32), or None when nothing was drafting. ``mean_acceptance_length`` counts the token
        each verify step adds beside the accepted ones, as vLLM does."""
        hist = self.acceptance_histogram
        if not hist:
            return None
        steps = sum(hist)
        accepted = sum(j * count for j, count in enumerate(hist))
        return {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / self.drafted_tokens if self.drafted_tokens else 0.0,
            "acceptance_histogram": list(hist),
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": self.drafted_tokens,
            "num_spec_tokens": len(hist) - 1,
        }

    def count_draft(self, drafted: int, accepted: int) -> None:
        """Book-keep one verified draft of ``drafted`` tokens, ``accepted`` of them kept."""
        if len(self.acceptance_histogram) <= accepted:
            self.acceptance_histogram.extend([0] * (accepted + 1 - len(self.acceptance_histogram)))
        self.acceptance_histogram[accepted] += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted

    @property
    def tokens_per_forward(self) -> float:
        """Tokens each target forward produced on average: the decoding's own yield, so an answer the repetition
        stop cut back counts the tokens it cut too (else a cut answer could show fewer than one token per forward)."""
        produced = max(self.decoded_tokens, self.new_tokens)
        return produced / self.forward_passes if self.forward_passes else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second after the first (prefill excluded)."""
        decode_s = self.wall_s - self.ttft_s
        return (self.new_tokens - 1) / decode_s if self.new_tokens > 1 and decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "new_tokens": self.new_tokens,
            "decoded_tokens": self.decoded_tokens,
            "forward_passes": self.forward_passes,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_histogram": list(self.acceptance_histogram),
            "accepted_by_position": self.accepted_by_position,
            "tokens_per_forward": self.tokens_per_forward,
            "ttft_s": self.ttft_s,
            "wall_s": self.wall_s,
            "draft_s": self.draft_s,
            "mask_s": self.mask_s,
            "masks": self.masks,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "by_source": {k: vars(v).copy() for k, v in self.by_source.items()},
        }

    def reported(self) -> dict[str, object]:
        """``as_dict`` without the figures this generation did not count: an engine that counts no
        forwards (vLLM behind ``RemoteGenerator``) leaves out ``ENGINE_COUNTED``, and one that reported
        no drafting (speculation off, or an engine without per-request metrics) also ``DRAFTING``, so a
        reader never sees zeros that look measured."""
        shown = self.as_dict()
        if not self.forward_passes:
            hidden = ENGINE_COUNTED if self.acceptance_histogram else ENGINE_COUNTED + DRAFTING
            shown = {k: v for k, v in shown.items() if k not in hidden}
        return shown


ENGINE_COUNTED = ("forward_passes", "decoded_tokens", "tokens_per_forward", "by_source", "draft_s", "mask_s", "masks",
                  "cached_prompt_tokens")
"""Figures only ragspec's own engine counts."""
DRAFTING = ("drafted_tokens", "accepted_tokens", "acceptance_rate", "acceptance_histogram", "accepted_by_position")
"""Drafting figures, which another engine may report per request (vLLM's ``metrics.speculative_decoding``)."""


@dataclass
class GenerationResult:
    """The answer of one call: its text, its token ids and how it was produced."""

    text: str
    token_ids: list[int]
    """Generated ids, EOS excluded; with a stop string, up to the token that completed it."""
    finish_reason: str
    """``"stop"`` (a stop string), ``"eos"`` (the end of the output, or a constraint's grammar
    completed), ``"length"`` (max_tokens or the context), or ``"repetition"`` (the answer began
    repeating itself: ``GenerationConfig.repetition_stop``)."""
    stats: GenerationStats
    model: str = ""
    """Name of the model that produced it."""


_Closing = TypeVar("_Closing", bound="Closing")


class Closing:
    """Something that holds a generator (or a connection) until ``close()``; leaving a ``with`` block closes it."""

    def __enter__(self: _Closing) -> _Closing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class GenerationStream(Closing):
    """Iterates over text deltas as tokens are accepted; ``result`` is set once it is exhausted.

    One delta per accepted token (a forward that accepts five tokens gives five), so a consumer
    sees the same pieces whether the answer was drafted or decoded token by token; a token whose
    text is held back (the start of a stop string, part of a UTF-8 character) gives its text with
    a later one.

    A stream holds its generator from the first delta until it is exhausted or closed; use it as
    a context manager (``with gen.stream(prompt) as s: ...``) so that an early exit releases it.
    ``stats`` is updated after every target forward, so it can be shown live while streaming.

    Both generators return one: ``SpeculativeGenerator`` (deltas as the target accepts tokens) and
    ``RemoteGenerator`` (deltas as the server sends them; the request goes out on the first
    ``next``, and closing the stream closes the connection, so the server can free the model).
    """

    def __init__(
        self, steps: StepGenerator[str, None, GenerationResult], stats: GenerationStats, cancel_event: threading.Event
    ) -> None:
        self._steps = steps
        self._cancel = cancel_event
        self.stats = stats
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[str]:
        result = yield from self._steps
        if self.result is None:  # iterating an exhausted stream again yields nothing and keeps the result
            self.result = result

    def close(self) -> None:
        """Stop generating (e.g. the client went away); releases the generator (or the connection) for other calls."""
        self._steps.close()

    def cancel(self) -> None:
        """Ask the generation to stop, from any thread: the thread iterating the stream gets
        ``GenerationCancelled`` at its next check (in the prefill, between steps, or while it
        waits for the generator), and the generator is free again."""
        self._cancel.set()


@runtime_checkable
class TextGenerator(Protocol):
    """What ``SpeculativeGenerator`` (local) and ``RemoteGenerator`` (a server) both are, and all that
    ``DocumentQA``, ``Conversation``, the LangChain classes and the apps call: the model's
    ``model_name``, ``tokenizer`` (text <-> ids, chat template) and ``context_length`` (prompt and
    answer together), the defaults of every call (``config``), ``encode``, ``stream`` and
    ``generate``.

    Both generators subclass it and inherit ``stream`` (which merges the options and calls their
    ``_start``) and ``generate``, which is ``stream`` run to its end.
    """

    config: GenerationConfig
    """Defaults of every call; per-call options merge into it."""

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> Any:  # a Hugging Face tokenizer (not imported here: this module stays torch-free)
        ...

    @property
    def context_length(self) -> int: ...

    def encode(self, text: str | Sequence[int], *, special_tokens: bool) -> list[int]:
        """Token ids of ``text`` by the model's tokenizer; ids pass through."""
        ...

    def stream(
        self,
        prompt: str | Sequence[int],
        config: GenerationConfig | None = None,
        *,
        references: Sequence[str | Sequence[int]] = (),
        **options: Any,
    ) -> GenerationStream:
        """Like ``generate`` but yields text deltas as they come; see ``GenerationStream``.

        Arguments are checked here, before any work starts; the work starts on the first ``next``
        (``SpeculativeGenerator`` takes the model then, ``RemoteGenerator`` sends the request).
        """
        return self._start(prompt, (config if config is not None else self.config).merged(options), references)

    def _start(
        self, prompt: str | Sequence[int], config: GenerationConfig, references: Sequence[str | Sequence[int]]
    ) -> GenerationStream:
        """``stream`` once its options are merged into ``config``: each generator's own."""
        ...

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """The prompt's token ids, checked: not empty, and shorter than the context window."""
        prompt_ids = self.encode(prompt, special_tokens=True)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.context_length:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens but {self.model_name} takes at most "
                f"{self.context_length} (prompt and answer together): shorten it or pass fewer passages"
            )
        return prompt_ids

    def generate(
        self,
        prompt: str | Sequence[int],
        config: GenerationConfig | None = None,
        *,
        references: Sequence[str | Sequence[int]] = (),
        **options: Any,
    ) -> GenerationResult:
        """Generate a completion of ``prompt``; ``references`` are passages to draft from.

        ``config`` (default: the generator's ``config``) is merged with ``options``
        (``max_tokens=``, ``stop=``, ``temperature=``, ... see ``GenerationConfig``).
        Greedy output is the target's own greedy output; sampled output has the distribution of
        plain sampling (drafts are verified by rejection sampling).
        """
        with self.stream(prompt, config, references=references, **options) as stream:
            for _ in stream:
                pass
        assert stream.result is not None
        return stream.result
