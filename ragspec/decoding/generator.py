"""The speculative generator: owns the target model's back end, its KV cache and the verify loop.

The target runs behind the back-end seam (``ragspec.backends``: PyTorch or llama.cpp): a forward
over ids after the cached positions returning their logits, and a cache that can be cropped.
Drafting, the policy and verification here are the same for every back end.

KV cache positions: the cache always holds exactly the tokens before ``pending`` (the newest
accepted token, whose logits are not computed yet). A verify forward appends ``pending`` and the
``k`` drafted tokens; after accepting ``n`` of them the cache is cropped by ``k - n`` entries
(``crop`` with a negative count), leaving it again just before the new pending token. Both back
ends make a crop cheap: PyTorch writes positions into preallocated buffers (``ragspec.backends.pytorch.kv_cache``),
llama.cpp removes the positions from its context's memory (``llama_memory_seq_rm``).
"""

from __future__ import annotations

import operator
import threading
import time
from contextlib import contextmanager
from collections.abc import Generator as StepGenerator
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ragspec.backends import KVCache, TargetModel, load_model, make_backend
from ragspec.engine.cancel import check as check_cancelled
from ragspec.engine.cancel import current_cancel_event
from ragspec.engine.config import GenerationConfig
from ragspec.engine.constraints import Grammar
from ragspec.engine.drafting import Draft, Drafter, DraftSource
from ragspec.decoding.model_drafter import ModelDrafter
from ragspec.engine.ngram import NgramDrafter
from ragspec.engine.penalties import Penalties
from ragspec.engine.policy import AdaptivePolicy, Policy, choose_draft
from ragspec.engine.prefix_cache import DEFAULT_MAX_BYTES, PrefixCache
from ragspec.engine.results import (
    GenerationResult,
    GenerationStats,
    GenerationStream,
    GeneratorBusyError,
    PromptTooLongError,
    SourceStats,
    Generator,
)
from ragspec.engine.sampling import Acceptor, MaskedAcceptor, make_acceptor
from ragspec.engine.tenancy import SHARED, current_cache_scope
from ragspec.engine.text import StopTextAssembler, clean_text

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase


class SpeculativeGenerator(Generator):
    """Decoding of a target model, sped up by drafts the target verifies in one forward.

    With ``prefix_cache`` the keys and values of recent prompts are kept (``ragspec.engine.prefix_cache``,
    at most ``prefix_cache_bytes``), and a new prompt that starts with the same tokens as one of
    them (a system prompt, the earlier turns of a conversation, the same first passages) only
    computes the rest, which shortens the time to first token. A hit gives what a cold prefill gives.
    Prefixes are reused only within the request's cache scope (``ragspec.engine.tenancy``: one web
    session, one ``/v1`` client), and the state kept across requests for drafting (the n-gram
    drafter's earlier answers, cleared through its ``forget()``, and the draft model's cache) belongs
    to one scope at a time: a request of another scope starts without it.

    Lossless: greedy output is token-identical to plain greedy decoding of the same model on the
    same back end (a drafted token is kept only when it equals the target's argmax after the
    tokens before it), and sampled output has the distribution of plain sampling (see
    ``ragspec.engine.sampling``).

    ``backend`` chooses what runs a model given by name: ``"torch"``, ``"llamacpp"`` (GGUF files
    through llama.cpp, ``pip install 'ragspec[llamacpp]'``) or ``"auto"`` (see
    ``ragspec.backends.choose_backend``). A loaded model (``load_model``) brings its own.
    """

    def __init__(
        self,
        model: TargetModel | str = "default",
        *,
        drafter: Drafter | None = None,
        draft_model: TargetModel | str | None = None,
        policy: Policy | None = None,
        max_draft: int = 16,
        prefix_cache: bool = True,
        prefix_cache_bytes: int = DEFAULT_MAX_BYTES,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        backend: str = "auto",
        config: GenerationConfig | None = None,
        busy_timeout_s: float = 300.0,
    ) -> None:
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        if not busy_timeout_s >= 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s}")
        self.config = config if config is not None else GenerationConfig()
        """Defaults of every call; per-call options merge into it."""
        self.busy_timeout_s = busy_timeout_s
        """How long a request waits for another thread's request to finish before ``GeneratorBusyError``
        (``float("inf")``: as long as it takes)."""
        if isinstance(model, str):
            self.lm: TargetModel = load_model(model, device=device, dtype=dtype, backend=backend)
        elif backend not in ("auto", model.backend):
            raise ValueError(f"backend={backend!r} but the model given is loaded for {model.backend!r}")
        else:
            self.lm = model
        # Earlier answers are a source too: a small model repeats its own phrasing across questions.
        self.drafter: Drafter = drafter if drafter is not None else NgramDrafter(history_tokens=2048)
        if isinstance(draft_model, str):
            draft_model = load_model(draft_model, device=self.lm.device, dtype=self.lm.dtype, backend="torch")
        self.model_drafter = ModelDrafter(draft_model, self.lm) if draft_model is not None else None
        self.policy: Policy = policy if policy is not None else AdaptivePolicy(max_draft=max_draft)
        self.max_draft = max_draft
        self.backend = make_backend(self.lm)
        """This generator's forward and KV cache (the model's weights are shared); what the generator
        knows of its model comes from here."""
        self._forward = self.backend.forward
        self.eos_token_ids = self.backend.eos_token_ids
        self.prefix_cache = prefix_cache
        self.prefixes = PrefixCache(prefix_cache_bytes)
        """Saved prompt prefixes (empty unless ``prefix_cache``)."""
        self._drafting_scope = SHARED
        """The cache scope whose requests the drafters' cross-request state came from."""
        if getattr(self.policy, "needs_calibration", False):
            self._calibrate()
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id of the request holding ``_lock``

    @property
    def model_name(self) -> str:
        return self.backend.model_name

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.backend.tokenizer

    @property
    def context_length(self) -> int:
        return self.backend.context_length

    # -- public API ---------------------------------------------------------------------------
    def stream(
        self,
        prompt: str | Sequence[int],
        config: GenerationConfig | None = None,
        *,
        references: Sequence[str | Sequence[int]] = (),
        **options: Any,
    ) -> GenerationStream:
        """Like ``generate`` but yields text deltas as they are accepted; see ``GenerationStream``.

        Arguments are checked here, before any work starts. The generator is taken on the first
        delta: a request from another thread waits up to ``busy_timeout_s`` for it, and one from a
        thread that still has an open stream of this generator fails at once (``GeneratorBusyError``).
        """
        config = (config if config is not None else self.config).merged(options)
        acceptor = make_acceptor(config, self.backend.device)
        grammar = None
        if config.constraint is not None:  # compiled now: a bad constraint fails before any decoding
            vocab = self.backend.vocab_size
            grammar = Grammar(config.constraint, self.tokenizer, vocab, sorted(self.eos_token_ids))
            acceptor = MaskedAcceptor(acceptor, grammar)
        if config.penalized:  # outermost: penalised first, then masked by the grammar
            acceptor = MaskedAcceptor(acceptor, Penalties(config))
        assembler = StopTextAssembler(self.tokenizer, config.stop, config.repetition_stop)
        prompt_ids = self.encode(prompt, special_tokens=True)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.context_length:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens but {self.model_name} takes at most "
                f"{self.context_length} (prompt and answer together): shorten it or pass fewer passages"
            )
        if isinstance(references, (str, bytes)):
            raise TypeError("references must be a list of passages (texts or token-id lists), got one string: wrap it in a list")
        ref_ids = [self.encode(r, special_tokens=False, what=f"reference {i}") for i, r in enumerate(references)]
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        if config.speculation.enabled:  # drafting figures from here on (vLLM's shape: ``GenerationStats.speculative_decoding``)
            stats.acceptance_histogram = [0] * (self.max_draft + 1)
        cancel = current_cancel_event()
        scope = current_cache_scope()
        steps = self._run(prompt_ids, ref_ids, config, assembler, acceptor, grammar, stats, cancel, scope)
        return GenerationStream(steps, stats, cancel)

    def calibrate(self, context: int = 128) -> None:
        """Start the policy from verify costs timed after ``context`` tokens (done with 128 when the
        generator is built; a workload with longer prompts may ask for its own; cached on disk)."""
        if not callable(getattr(self.policy, "calibrate", None)):
            raise ValueError(f"{type(self.policy).__name__} takes no calibration (AdaptivePolicy does)")
        with self._hold():
            self._calibrate(context=context)

    def clear_cache(self) -> None:
        """Forget the keys and values kept from earlier requests (the next prompt starts cold)."""
        with self._hold():
            self.prefixes.clear()
            if self.model_drafter is not None:
                self.model_drafter.clear_cache()

    def encode(self, text: str | Sequence[int], *, special_tokens: bool, what: str = "the prompt") -> list[int]:
        """Token ids of ``text`` (lone surrogates, which no tokenizer takes, become U+FFFD); ids pass
        through, checked against the model's vocabulary (``ValueError`` for one outside it). Anything
        else (bytes, floats, None) is a ``TypeError`` naming ``what`` it was given as."""
        if isinstance(text, str):
            return list(self.tokenizer.encode(clean_text(text), add_special_tokens=special_tokens))
        if isinstance(text, (bytes, bytearray, memoryview)):
            raise TypeError(f"{what} must be text or token ids, got {type(text).__name__}: decode it first (data.decode())")
        if not isinstance(text, Sequence) and not hasattr(text, "__array__"):
            raise TypeError(f"{what} must be text or a sequence of token ids, got {type(text).__name__}")
        ids = [_token_id(t, what) for t in text]
        vocab = self.backend.vocab_size
        if (bad := next((t for t in ids if not 0 <= t < vocab), None)) is not None:
            raise ValueError(f"token id {bad} is outside the model's vocabulary [0, {vocab})")
        return ids

    @contextmanager
    def _hold(self, cancel: threading.Event | None = None) -> Iterator[None]:
        """Hold the generator for one request (see ``stream`` for who waits and who fails); a
        request whose ``cancel`` event is set while it waits stops waiting (``GenerationCancelled``)."""
        if self._owner == threading.get_ident():
            raise GeneratorBusyError(
                "this thread still has an open stream of this generator: exhaust or close it first "
                "(`with generator.stream(...) as s:` closes it on exit)"
            )
        deadline = time.monotonic() + self.busy_timeout_s  # inf: for as long as it takes
        while not self._lock.acquire(timeout=max(0.0, min(0.05, deadline - time.monotonic()))):
            check_cancelled(cancel)
            if time.monotonic() >= deadline:
                raise GeneratorBusyError(
                    f"the generator stayed busy with another request for {self.busy_timeout_s:g} s; try again later"
                )
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None
            self._lock.release()

    # -- decoding -----------------------------------------------------------------------------
    def _verify(
        self, cache: KVCache, pending: int, draft: Draft | None, acceptor: Acceptor
    ) -> tuple[list[int], int]:
        """One target forward over ``[pending, *draft]``; returns the new tokens and the accepted count.

        The acceptor compares the draft with the target's distribution after each prefix
        (greedy: its argmax; sampling: rejection sampling), keeps the agreeing prefix and adds the
        target's own next token, so every forward yields at least one token.
        """
        drafted = draft.tokens if draft is not None else ()
        logits = self._forward([pending, *drafted], cache)  # [1 + k, vocab]
        n, token = acceptor.accept(logits, drafted, None if draft is None else draft.probs)
        if n < len(drafted):
            cache.crop(-(len(drafted) - n))  # forget the rejected draft positions
        return [*drafted[:n], token], n

    @torch.inference_mode()
    def _run(
        self,
        prompt_ids: list[int],
        ref_ids: list[list[int]],
        config: GenerationConfig,
        assembler: StopTextAssembler,
        acceptor: Acceptor,
        grammar: Grammar | None,
        stats: GenerationStats,
        cancel: threading.Event,
        scope: str,
    ) -> StepGenerator[str, None, GenerationResult]:
        with self._hold(cancel):
            start = time.perf_counter()
            if scope != self._drafting_scope:  # earlier answers and the draft model's cache stay with their scope
                forget = getattr(self.drafter, "forget", None)
                if callable(forget):
                    forget()
                if self.model_drafter is not None:
                    self.model_drafter.clear_cache()
                self._drafting_scope = scope
            budget = min(config.max_tokens, self.context_length - len(prompt_ids))
            finish = "length"
            out: list[int] = []
            context = list(prompt_ids)  # prompt + out, kept as one list for the drafter
            if budget > 0:
                self.drafter.begin(prompt_ids, ref_ids)
                if self.model_drafter is not None:
                    self.model_drafter.begin(prompt_ids, ref_ids)
                cache, reused = self._take_cache(prompt_ids, len(prompt_ids) + budget + self.max_draft + 1, scope)
                stats.cached_prompt_tokens = reused
                check_cancelled(cancel)
                logits = self._forward(prompt_ids[reused:], cache, last_only=True, cancel=cancel)
                _, first = acceptor.accept(logits, (), None)
                new = [first]
                stats.forward_passes = 1
                while True:
                    new, finish = self._clip(new, budget - len(out), grammar)
                    for token in new:  # one delta per token, however many a forward accepted
                        update = assembler.add([token])
                        out.extend([token][: update.n_tokens])
                        context.extend([token][: update.n_tokens])
                        if update.repeated:  # the repeat may have begun in tokens held back earlier
                            out = assembler.ids
                            context = [*prompt_ids, *out]
                        stats.new_tokens = len(out)
                        stats.wall_s = time.perf_counter() - start
                        stats.ttft_s = stats.ttft_s or stats.wall_s
                        if update.delta:
                            yield update.delta
                        if update.stopped:
                            finish = "repetition" if update.repeated else "stop"
                            break
                    stats.new_tokens = len(out)
                    stats.wall_s = time.perf_counter() - start
                    stats.ttft_s = stats.ttft_s or stats.wall_s
                    if finish != "continue":
                        break
                    check_cancelled(cancel)
                    new = self._step(cache, context, budget - len(out), acceptor, grammar, config.speculation.limit, stats)
                self.drafter.finish(out)
                if self.model_drafter is not None:
                    self.model_drafter.finish(out)
                if self.prefix_cache:
                    self._keep(cache, prompt_ids, scope)
            tail = assembler.flush()
            if tail:
                yield tail
            stats.new_tokens = len(out)
            stats.wall_s = time.perf_counter() - start
            return GenerationResult(assembler.text, out, finish, stats, self.model_name)

    @torch.inference_mode()
    def _calibrate(self, lengths: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32), context: int = 128) -> None:
        """Time target forwards of several draft lengths after ``context`` tokens, so that the
        policy starts from real verify costs (about 30 forwards when the generator is built; later
        timings refine them). The timings are cached on disk per model and machine
        (``ragspec.decoding.calibration``), so only the first generator of a model on a machine waits."""
        from ragspec.decoding import calibration
        from retrievers.cache import cache_root

        folder = cache_root() / "calibration"
        lengths = tuple(k for k in lengths if k <= self.max_draft and k + 2 <= self.context_length)
        context = min(context, self.context_length - max(lengths) - 1)  # stay inside the position limit
        key = calibration.calibration_key(self.lm, self.backend.description, lengths, context)
        cached = calibration.load(key, folder)
        if cached is not None:
            self.policy.calibrate(cached)  # type: ignore[attr-defined]
            return
        cache = self.backend.new_cache(context + max(lengths) + 1)
        self._forward([0] * context, cache, last_only=True)
        seconds: dict[int, float] = {}
        for k in lengths:
            times = []
            for _ in range(3):  # the first run of a shape pays one-off set-up; keep the fastest
                start = time.perf_counter()
                self._forward([0] * (k + 1), cache)
                times.append(time.perf_counter() - start)
                cache.crop(-(k + 1))
            seconds[k] = min(times)
        calibration.save(key, seconds, folder)
        self.policy.calibrate(seconds)  # type: ignore[attr-defined]

    def _take_cache(self, prompt_ids: list[int], capacity: int, scope: str) -> tuple[KVCache, int]:
        """A cache holding the longest prefix of this prompt that a kept entry of ``scope`` has, or a new one.

        Returns the cache and how many prompt tokens it already holds. At least the last prompt
        token is always computed again, since its logits give the first new token. A request that
        does not finish (an abandoned stream, an error) stores nothing.
        """
        found = self.prefixes.best(prompt_ids, len(prompt_ids) - 1, scope) if self.prefix_cache else None
        if found is not None:
            entry, shared = found
            cache = self.backend.load(entry.saved, shared, capacity)
            if cache is not None:
                return cache, shared
        return self.backend.new_cache(capacity), 0

    def _keep(self, cache: KVCache, prompt_ids: list[int], scope: str) -> None:
        """Store a finished request's prompt positions for ``scope`` (its answer's are cropped: see
        ``ragspec.engine.prefix_cache``)."""
        keep = min(len(prompt_ids), cache.get_seq_length())
        cache.crop(keep - cache.get_seq_length())
        saved = self.backend.save(cache)
        if saved is not None:
            self.prefixes.add(prompt_ids[:keep], saved, scope)

    def _clip(self, new: list[int], room: int, grammar: Grammar | None = None) -> tuple[list[int], str]:
        """Cut newly accepted tokens at EOS and at the token budget. An output that fills the budget
        exactly as its grammar completes ends as at an EOS ("eos", not "length"): the grammar allows
        nothing but the end of the output after it."""
        for i, t in enumerate(new[:room]):
            if t in self.eos_token_ids:
                return new[:i], "eos"
        if len(new) < room:
            return new, "continue"
        # The grammar advanced over every accepted token: its state is the output's only if what the
        # budget cuts off is nothing, or an EOS.
        complete = grammar is not None and grammar.finished and all(t in self.eos_token_ids for t in new[room:])
        return new[:room], ("eos" if complete else "length")

    def _step(
        self,
        cache: KVCache,
        context: list[int],
        room: int,
        acceptor: Acceptor,
        grammar: Grammar | None,
        limit: int | None,
        stats: GenerationStats,
    ) -> list[int]:
        """Draft (or not: ``limit`` 0), verify, and book-keep one target forward; ``limit`` is the
        request's own cap on drafted tokens (``Speculation.limit``; ``None``: ``max_draft``)."""
        t0 = time.perf_counter()
        speculative = limit != 0
        longest = self.max_draft if limit is None else min(limit, self.max_draft)
        draft, drafter = self._draft(context, min(longest, room - 1), grammar) if speculative else (None, None)
        t1 = time.perf_counter()
        new, n_accepted = self._verify(cache, context[-1], draft, acceptor)
        t2 = time.perf_counter()
        stats.draft_s += t1 - t0
        stats.forward_passes += 1
        if speculative:
            self.policy.record(draft, n_accepted, t2 - t1, t1 - t0)
        if draft is not None:
            if drafter is not None:
                drafter.feedback(draft, n_accepted)
            _count(stats, draft, n_accepted)
        if grammar is not None:
            stats.mask_s, stats.masks = grammar.mask_s, grammar.masks
        return new

    def _draft(
        self, context: list[int], max_tokens: int, grammar: Grammar | None
    ) -> tuple[Draft | None, Drafter | None]:
        """This step's draft and the drafter that made it (None for the grammar's forced tokens).

        Without a grammar: a copy from the references when the policy finds one worth verifying,
        else the draft model's tokens (if there is one). With a grammar: where it forces tokens,
        they are the draft; a copy is cut at its first token the grammar rejects (never verified)
        and the tokens the grammar forces after it are appended; a draft-model draft is cut too.
        """
        if grammar is not None and (forced := grammar.forced_draft(max_tokens)) is not None:
            return forced, None
        candidate = self.drafter.propose(context, max_tokens)
        if grammar is not None and candidate is not None and candidate.probs is None:
            # A deterministic draft is cut before the policy chooses its length, from what can be kept.
            # A sampled one only after: the length chosen must not depend on its tokens' values.
            candidate = grammar.cut(candidate)
        draft = choose_draft(self.policy, candidate)
        if draft is not None:
            return (draft if grammar is None else grammar.extend(grammar.cut(draft), max_tokens)), self.drafter
        if self.model_drafter is not None:
            k = self.policy.choose_model(max_tokens)
            draft = self.model_drafter.propose(context, k) if k > 0 else None
            return (draft if grammar is None or draft is None else grammar.cut(draft)), self.model_drafter
        return None, None


def _token_id(value: object, what: str) -> int:
    """``value`` as a token id: an integer (numpy's included), never a float or a bool."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: token ids are integers, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what}: token ids are integers, got {type(value).__name__} {value!r:.40}") from None


def _count(stats: GenerationStats, draft: Draft, n_accepted: int) -> None:
    """Book-keep one verified draft per source (grammar-forced tokens count as ``grammar``)."""
    head = len(draft) - draft.forced
    parts = [(draft.source, head, min(n_accepted, head)), (DraftSource.GRAMMAR, draft.forced, max(0, n_accepted - head))]
    for source, drafted, accepted in parts:
        if drafted:
            src = stats.by_source.setdefault(source.value, SourceStats())
            src.drafted += drafted
            src.accepted += accepted
            src.verify_steps += 1
    if draft.source is DraftSource.PASSAGE and draft.reference is not None and head:
        ref = stats.by_reference.setdefault(draft.reference, SourceStats())
        ref.drafted += head
        ref.accepted += min(n_accepted, head)
        ref.verify_steps += 1
    stats.count_draft(len(draft), n_accepted)
