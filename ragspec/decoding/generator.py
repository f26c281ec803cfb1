"""The speculative generator: a target model's back end, its drafters, its policy and its prompt caches.

The target runs behind the back-end seam (``ragspec.backends``: PyTorch or llama.cpp): a forward
over ids after the cached positions returning their logits, and a cache that can be cropped.
``stream`` checks a request's arguments, builds what it decodes with and hands it to the verify
loop (``ragspec.decoding.loop``), which is the same for every back end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator as StepGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch

from ragspec.backends import TargetModel, load_model, make_backend
from ragspec.decoding import calibration
from ragspec.decoding.lock import RequestLock
from ragspec.decoding.loop import Request, decode
from ragspec.decoding.draft_head import head_drafter
from ragspec.decoding.model_drafter import ModelDrafter
from ragspec.decoding.prompt_cache import keep_cache, take_cache
from ragspec.engine.cancel import check as check_cancelled
from ragspec.engine.cancel import current_cancel_event
from ragspec.engine.composite import CompositeDrafter, ModelDrafting
from ragspec.engine.config import GenerationConfig
from ragspec.engine.constraints import Grammar
from ragspec.engine.drafting import Drafter
from ragspec.engine.ngram import NgramDrafter
from ragspec.engine.penalties import Penalties
from ragspec.engine.policy import AdaptivePolicy, Policy
from ragspec.engine.prefix_cache import DEFAULT_MAX_BYTES, PrefixCache
from ragspec.engine.results import (
    GenerationResult,
    GenerationStats,
    GenerationStream,
    TextGenerator,
)
from ragspec.engine.sampling import Acceptor, MaskedAcceptor, make_acceptor
from ragspec.engine.tenancy import SHARED, current_cache_scope
from ragspec.engine.text import StopTextAssembler, encode

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


class SpeculativeGenerator(TextGenerator):
    """Decoding of a target model, sped up by drafts the target verifies in one forward.

    With ``prefix_cache`` the keys and values of recent prompts are kept (``ragspec.engine.prefix_cache``,
    at most ``prefix_cache_bytes``), and a new prompt that starts with the same tokens as one of
    them (a system prompt, the earlier turns of a conversation, the same first passages) only
    computes the rest, which shortens the time to first token. A hit gives what a cold prefill gives.
    Prefixes are reused only within the request's cache scope (``ragspec.engine.tenancy``: one web
    session, one ``/v1`` client), except ``public_prefix``: ids that hold no user's words (the
    question-answering prompt's fixed part, ``ragspec.prompts.qa_prefix_ids``, which the shared
    generators of ``ragspec.registry`` get), computed once for every scope; and the state kept across requests for drafting (the n-gram
    drafter's earlier answers, cleared through its ``forget()``, and the draft model's cache) belongs
    to one scope at a time: a request of another scope starts without it.

    Lossless: greedy output is token-identical to plain greedy decoding of the same model on the
    same back end (a drafted token is kept only when it equals the target's argmax after the
    tokens before it), and sampled output has the distribution of plain sampling (see
    ``ragspec.engine.sampling``).

    ``backend`` chooses what runs a model given by name: ``"torch"``, ``"llamacpp"`` (GGUF files
    through llama.cpp, ``pip install 'ragspec[llamacpp]'``) or ``"auto"`` (see
    ``ragspec.backends.choose_backend``). A loaded model (``load_model``) brings its own.

    Where no copy is worth verifying, a draft model (``draft_model``) drafts; without one, with ``draft_head``
    True, the target's bundled draft head (``ragspec.decoding.draft_head``: one token guessed from the target's
    own last hidden state; the default model has one, and only the PyTorch back end's Llama forward keeps the
    hidden states it needs; a path: a head of this model that ``benchmarks/train_draft_head.py`` wrote) guesses
    one token, as far as the policy finds that it pays. Off by default: on the 2-core CPUs measured, verifying
    one drafted token costs 1.2-1.5 plain steps, and the head's guesses did not speed decoding up
    (docs/model-drafter.md, "The draft head").
    """

    def __init__(
        self,
        model: TargetModel | str = "default",
        *,
        drafter: Drafter | None = None,
        draft_model: TargetModel | str | None = None,
        draft_head: bool | str | Path = False,
        policy: Policy | None = None,
        max_draft: int = 16,
        prefix_cache: bool = True,
        prefix_cache_bytes: int = DEFAULT_MAX_BYTES,
        public_prefix: Sequence[int] = (),
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        backend: str = "auto",
        config: GenerationConfig | None = None,
        busy_timeout_s: float = 300.0,
    ) -> None:
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.lock = RequestLock(busy_timeout_s)
        """One request at a time: another thread's waits up to ``busy_timeout_s`` (then ``GeneratorBusyError``)."""
        self.config = config if config is not None else GenerationConfig()
        """Defaults of every call; per-call options merge into it."""
        if isinstance(model, str):
            self.target: TargetModel = load_model(model, device=device, dtype=dtype, backend=backend)
        elif backend not in ("auto", model.backend):
            raise ValueError(f"backend={backend!r} but the model given is loaded for {model.backend!r}")
        else:
            self.target = model
        if isinstance(draft_model, str):
            draft_model = load_model(draft_model, device=self.target.device, dtype=self.target.dtype, backend="torch")
        self.policy: Policy = policy if policy is not None else AdaptivePolicy(max_draft=max_draft)
        # Earlier answers are a source too: a small model repeats its own phrasing across questions.
        copies = drafter if drafter is not None else NgramDrafter(history_tokens=2048)
        self.backend = make_backend(self.target)
        """This generator's forward and KV cache (the model's weights are shared); what the generator
        knows of its model comes from here."""
        model_drafter: ModelDrafting | None = None
        if draft_model is not None:
            model_drafter = ModelDrafter(draft_model, self.target)
        elif draft_head:
            model_drafter = head_drafter(self.backend, None if draft_head is True else Path(draft_head))
        self.drafter = CompositeDrafter(copies, self.policy, model_drafter)
        """The n-gram sources (``drafter.copies``), then the draft model (``drafter.model``), as the policy chooses."""
        self.max_draft = max_draft
        self.drafts = self.target.verify_matches_steps
        """Whether requests draft at all: not where a verify pass would compute other tokens than plain steps."""
        if not self.drafts:
            logger.warning("%s in %s on a CPU: drafting is off, so answers stay exactly plain decoding's (a verify pass "
                           "rounds rows otherwise than one-token steps at this precision); dtype='auto' drafts with fp32 "
                           "steps", self.target.name, str(self.target.dtype).removeprefix("torch."))
        self.prefix_cache = prefix_cache
        self.prefixes = PrefixCache(prefix_cache_bytes, public=public_prefix)
        """Saved prompt prefixes (empty unless ``prefix_cache``); ``public_prefix`` is every scope's."""
        self._drafting_scope = SHARED
        """The cache scope whose requests the drafters' cross-request state came from."""
        if self.policy.needs_calibration:
            self._calibrate()

    @property
    def model_name(self) -> str:
        return self.backend.model_name

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.backend.tokenizer

    @property
    def context_length(self) -> int:
        return self.backend.context_length

    @property
    def busy_timeout_s(self) -> float:
        """How long a request waits for another thread's request to finish before ``GeneratorBusyError``."""
        return self.lock.busy_timeout_s

    @busy_timeout_s.setter
    def busy_timeout_s(self, seconds: float) -> None:
        self.lock.busy_timeout_s = seconds

    # -- public API ---------------------------------------------------------------------------
    def _start(
        self, prompt: str | Sequence[int], config: GenerationConfig, references: Sequence[str | Sequence[int]]
    ) -> GenerationStream:
        """The stream of one request. The generator is taken on the first delta: a request from another
        thread waits up to ``busy_timeout_s`` for it, and one from a thread that still has an open stream
        of this generator fails at once (``GeneratorBusyError``)."""
        acceptor, grammar = self._acceptor(config)
        assembler = StopTextAssembler(self.tokenizer, config.stop, config.repetition_stop)
        prompt_ids = self._prompt_ids(prompt)
        if isinstance(references, (str, bytes)):
            raise TypeError("references must be a list of passages (texts or token-id lists), got one string: wrap it in a list")
        ref_ids = [self.encode(r, special_tokens=False, what=f"reference {i}") for i, r in enumerate(references)]
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        if config.speculation.enabled:  # drafting figures from here on (vLLM's shape: ``GenerationStats.speculative_decoding``)
            stats.acceptance_histogram = [0] * (self.max_draft + 1)
        limit = config.speculation.limit  # the request's own cap on drafted tokens (None: ``max_draft``)
        request = Request(self.backend, self.drafter, acceptor, grammar, assembler, stats, current_cancel_event(),
                          longest=self.max_draft if limit is None else min(limit, self.max_draft),
                          speculative=limit != 0 and self.drafts, start=0.0)
        return GenerationStream(self._run(request, prompt_ids, ref_ids, config.max_tokens, current_cache_scope()),
                                stats, request.cancel)

    def calibrate(self, context: int = 128) -> None:
        """Start the policy from verify costs timed after ``context`` tokens (done with 128 when the
        generator is built; a workload with longer prompts may ask for its own; cached on disk)."""
        with self.lock.hold():
            self._calibrate(context=context)

    def clear_cache(self) -> None:
        """Forget the keys and values kept from earlier requests (the next prompt starts cold)."""
        with self.lock.hold():
            self.prefixes.clear()
            self.drafter.clear_cache()

    def encode(self, text: str | Sequence[int], *, special_tokens: bool, what: str = "the prompt") -> list[int]:
        """Token ids of ``text``; ids pass through, checked against the model's vocabulary
        (``ragspec.engine.text.encode``)."""
        return encode(self.tokenizer, self.backend.vocab_size, text, special_tokens=special_tokens, what=what)

    # -- one request --------------------------------------------------------------------------
    def _acceptor(self, config: GenerationConfig) -> tuple[Acceptor, Grammar | None]:
        """How drafted tokens are accepted under ``config``, and its grammar (compiled now: a bad
        constraint fails before any decoding)."""
        acceptor = make_acceptor(config, self.backend.device)
        grammar = None
        if config.constraint is not None:
            grammar = Grammar(config.constraint, self.tokenizer, self.backend.vocab_size, sorted(self.backend.eos_token_ids))
            acceptor = MaskedAcceptor(acceptor, grammar)
        if config.penalized:  # outermost: penalised first, then masked by the grammar
            acceptor = MaskedAcceptor(acceptor, Penalties(config))
        return acceptor, grammar

    def _run(
        self, r: Request, prompt_ids: list[int], ref_ids: list[list[int]], max_tokens: int, scope: str
    ) -> StepGenerator[str, None, GenerationResult]:
        """Take the generator, set up the drafters and the cache, decode, keep what later requests reuse."""
        with self.lock.hold(r.cancel):
            r.start = time.perf_counter()
            if scope != self._drafting_scope:  # earlier answers and the draft model's cache stay with their scope
                self.drafter.forget()
                self._drafting_scope = scope
            budget = min(max_tokens, self.context_length - len(prompt_ids))
            out: list[int] = []
            finish = "length"
            if budget > 0:
                self.drafter.begin(prompt_ids, ref_ids, r.grammar)
                capacity = len(prompt_ids) + budget + self.max_draft + 1
                cache, r.stats.cached_prompt_tokens = take_cache(
                    self.backend, self.prefixes if self.prefix_cache else None, prompt_ids, capacity, scope)
                check_cancelled(r.cancel)
                out, finish = yield from decode(r, cache, prompt_ids, r.stats.cached_prompt_tokens, budget)
                self.drafter.finish(out)
                if self.prefix_cache:
                    keep_cache(self.backend, self.prefixes, cache, prompt_ids, scope)
            tail = r.assembler.flush()
            if tail:
                yield tail
            r.stats.new_tokens, r.stats.wall_s = len(out), time.perf_counter() - r.start
            return GenerationResult(r.assembler.text, out, finish, r.stats, self.model_name)

    def _calibrate(self, context: int = 128) -> None:
        """Start the policy from verify costs after ``context`` tokens, timed once per model and machine
        and cached on disk (``ragspec.decoding.calibration``), so only the first generator of a model on
        a machine waits (about 30 forwards)."""
        from retrievers.cache import cache_root

        folder = cache_root() / "calibration"
        self.policy.calibrate(calibration.verify_costs(self.target, self.backend, self.max_draft, context, folder))
