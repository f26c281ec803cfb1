"""One drafter over all of a generator's sources, behind the ``Drafter`` seam.

Each step ``CompositeDrafter.propose`` tries, in order: the tokens a constraint's grammar forces
(drafted for free), a copy from the n-gram sources (the passages, the prompt, the answer so far and
earlier answers) when the policy finds one worth verifying, else the draft model's tokens (if
there is one) as many as the policy asks for. ``feedback`` goes to the drafter that made the draft.
The decode loop (``ragspec.decoding.loop``) sees one drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ragspec.engine.drafting import Draft, Drafter
from ragspec.engine.policy import Policy, choose_draft

if TYPE_CHECKING:
    from ragspec.engine.constraints import Grammar


class ModelDrafting(Drafter, Protocol):
    """A draft model behind the seam (``ragspec.decoding.model_drafter.ModelDrafter``: it keeps a KV cache), or a
    draft head on the target's hidden states (``ragspec.decoding.draft_head.HeadDrafter``)."""

    longest: int | None
    """Most tokens one ``propose`` returns (None: as many as asked)."""
    acceptance: float | None
    """Share of its first drafted tokens the target is expected to accept, measured where it was made (None: unknown)."""

    def clear_cache(self) -> None:
        """Forget every cached position."""
        ...


class CompositeDrafter:
    """The n-gram sources first, then the draft model, as ``policy`` chooses (see the module docstring)."""

    def __init__(self, copies: Drafter, policy: Policy, model: ModelDrafting | None = None) -> None:
        self.copies = copies
        """Copies from the passages, the prompt, the answer and earlier answers (``NgramDrafter``)."""
        self.policy = policy
        self.model = model
        """The draft model's drafter, or None."""
        if model is not None:
            policy.expect_model(model.longest, model.acceptance)
        self.grammar: Grammar | None = None
        """This request's constraint (set by ``begin``)."""
        self._last: Drafter | None = None  # made the draft being verified (None: the grammar's forced tokens)

    def _parts(self) -> list[Drafter]:
        return [self.copies] if self.model is None else [self.copies, self.model]

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]], grammar: Grammar | None = None) -> None:
        self.grammar = grammar
        for part in self._parts():
            part.begin(prompt, references)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        draft, self._last = self._propose(context, max_tokens)
        return draft

    def _propose(self, context: Sequence[int], max_tokens: int) -> tuple[Draft | None, Drafter | None]:
        """This step's draft and the drafter that made it.

        With a grammar: where it forces tokens, they are the draft; a copy is cut at its first token
        the grammar rejects (never verified) and the tokens the grammar forces after it are
        appended; a draft-model draft is cut too.
        """
        grammar = self.grammar
        if grammar is not None and (forced := grammar.forced_draft(max_tokens)) is not None:
            return forced, None
        candidate = self.copies.propose(context, max_tokens)
        if grammar is not None and candidate is not None and candidate.probs is None:
            # A deterministic draft is cut before the policy chooses its length, from what can be kept.
            # A sampled one only after: the length chosen must not depend on its tokens' values.
            candidate = grammar.cut(candidate)
        draft = choose_draft(self.policy, candidate)
        if draft is not None:
            return (draft if grammar is None else grammar.extend(grammar.cut(draft), max_tokens)), self.copies
        if self.model is not None:
            k = self.policy.choose_model(max_tokens)
            draft = self.model.propose(context, k) if k > 0 else None
            return (draft if grammar is None or draft is None else grammar.cut(draft)), self.model
        return None, None

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        if self._last is not None:
            self._last.feedback(draft, n_accepted)

    def finish(self, output: Sequence[int]) -> None:
        for part in self._parts():
            part.finish(output)
        self.grammar = self._last = None

    def forget(self) -> None:
        """Drop what was kept across requests (earlier answers, the draft model's cache): a request of
        another cache scope (``ragspec.engine.tenancy``) starts without it."""
        forget = getattr(self.copies, "forget", None)  # optional: a drafter of the user's may keep nothing
        if callable(forget):
            forget()
        self.clear_cache()

    def clear_cache(self) -> None:
        """Forget the draft model's cached positions."""
        if self.model is not None:
            self.model.clear_cache()
