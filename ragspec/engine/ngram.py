"""N-gram (prompt-lookup) drafting over reference token sequences, with suffix automata.

Each reference — every retrieved passage, earlier answers, and the running context (prompt
followed by the generated tokens) — gets a suffix automaton. For a fixed reference, a *matcher*
tracks the longest suffix of the context that occurs in it, advanced one token at a time by the
classic automaton walk (follow suffix links until a transition exists), which costs amortized
O(1) per token whatever the lengths. For the running context the automaton is extended as tokens
arrive, and the longest suffix that also occurs *earlier* is simply the suffix link of the
newest state. So drafting cost per step does not grow with the context or the references.

A match proposes the tokens that followed the match's first occurrence in its reference.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import takewhile
from typing import Sequence

from ragspec.engine.drafting import Draft, DraftSource


class SuffixAutomaton:
    """Suffix automaton of a token sequence that can be extended one token at a time.

    State 0 is the root (the empty string). For every state, ``first_end[s]`` is the position of
    the last token of the first occurrence of the strings the state stands for.
    """

    __slots__ = ("tokens", "next", "link", "length", "first_end", "last")

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]
        self.last = 0
        for t in tokens:
            self.extend(t)

    def __len__(self) -> int:
        return len(self.tokens)

    def _new_state(self, length: int, first_end: int, link: int, next_: dict[int, int]) -> int:
        self.next.append(next_)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def extend(self, token: int) -> None:
        """Append one token (the standard online construction)."""
        pos = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, pos, 0, {})
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._new_state(self.length[p] + 1, self.first_end[q], self.link[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = clone
                self.link[cur] = clone
        self.last = cur

    def continuation(self, state: int, length: int, max_tokens: int) -> tuple[int, tuple[int, ...]]:
        """What followed the first occurrence of a match, shortening it if nothing followed.

        Returns ``(match_length, tokens)``; ``(0, ())`` when no suffix of the match has a
        continuation. Negative tokens are separators: a continuation stops before one, and a match
        whose first occurrence ends the sequence or a separator falls back to its suffix link.
        """
        while state > 0:
            end = self.first_end[state]
            if end + 1 < len(self.tokens) and self.tokens[end + 1] >= 0:
                following = self.tokens[end + 1 : end + 1 + max_tokens]
                return length, tuple(takewhile(lambda t: t >= 0, following))
            state = self.link[state]
            length = self.length[state]
        return 0, ()


@dataclass
class _Matcher:
    """Longest suffix of a growing context that occurs in a fixed automaton."""

    sam: SuffixAutomaton
    state: int = 0
    length: int = 0

    def advance(self, token: int) -> None:
        sam = self.sam
        while self.state and token not in sam.next[self.state]:
            self.state = sam.link[self.state]
            self.length = sam.length[self.state]
        nxt = sam.next[self.state].get(token)
        if nxt is None:
            self.state, self.length = 0, 0
        else:
            self.state, self.length = nxt, self.length + 1


@dataclass(frozen=True)
class Match:
    """The longest suffix of the context found in one reference, and what followed it there."""

    length: int
    tokens: tuple[int, ...]
    source: DraftSource
    reference: int | None


class AnswerHistory:
    """A bounded index of earlier answers, which the drafters of many requests may share.

    It keeps the newest answers whose tokens (one separator each included) fit in ``max_tokens``,
    in one suffix automaton of class ``automaton``; each answer ends with its own negative
    separator, so no match runs from one answer into the next. ``add`` rebuilds the automaton
    (O(``max_tokens``)); a drafter that began a request keeps the automaton it saw then.
    """

    def __init__(self, max_tokens: int, automaton: type[SuffixAutomaton] = SuffixAutomaton) -> None:
        if max_tokens < 0:
            raise ValueError(f"history_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.automaton = automaton
        self._answers: deque[list[int]] = deque()
        self.index = SuffixAutomaton()

    def __len__(self) -> int:
        """Tokens indexed, separators included."""
        return len(self.index)

    def add(self, output: Sequence[int]) -> None:
        """Remember a finished answer, forgetting the oldest ones beyond the budget."""
        if not self.max_tokens or not output:
            return
        self._answers.append(list(output[-self.max_tokens :]))
        while sum(len(a) + 1 for a in self._answers) > self.max_tokens + 1:
            self._answers.popleft()
        tokens: list[int] = []
        for i, answer in enumerate(self._answers):
            tokens += answer + [-1 - i]  # a distinct separator: no match crosses two answers
        self.index = self.automaton(tokens)

    def clear(self) -> None:
        """Forget every answer."""
        self._answers.clear()
        self.index = SuffixAutomaton()


class NgramDrafter:
    """Proposes copies of reference spans that continue the longest matching suffix.

    References are the passages given to ``begin`` (each its own, so a draft knows its passage),
    an optional bounded index of earlier answers (``history``, which several drafters may share;
    by default one of ``history_tokens`` tokens of its own), and the running context itself
    (prompt and output). On equal match lengths a passage wins over earlier answers, and those over the
    running context, because passages say where an answer came from.

    ``min_match`` is the shortest suffix match worth proposing; how many of the proposed tokens
    are actually verified is the decoding policy's decision (see ``ragspec.engine.policy``).
    ``automaton`` is the suffix automaton class indexing the passages and earlier answers; a
    subclass may continue a match differently (``benchmarks/drafter_replay.py`` compares one).
    """

    def __init__(
        self,
        min_match: int = 1,
        history_tokens: int = 0,
        automaton: type[SuffixAutomaton] = SuffixAutomaton,
        history: AnswerHistory | None = None,
    ) -> None:
        if min_match < 1:
            raise ValueError(f"min_match must be >= 1, got {min_match}")
        self.min_match = min_match
        self.history = history if history is not None else AnswerHistory(history_tokens, automaton)
        self.history_tokens = self.history.max_tokens
        self.automaton = automaton
        self._matchers: list[_Matcher] = []
        self._ref_ids: list[int] = []  # index in ``begin``'s references of each passage matcher
        self._self = SuffixAutomaton()
        self._prompt_len = 0
        self._answer_start = 0

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]]) -> None:
        self._matchers = [_Matcher(self.automaton(ref)) for ref in references if len(ref) > 0]
        self._ref_ids = [i for i, ref in enumerate(references) if len(ref) > 0]
        if len(self.history):
            self._matchers.append(_Matcher(self.history.index))
        self._self = SuffixAutomaton()
        self._prompt_len = len(prompt)

    def _sync(self, context: Sequence[int]) -> None:
        """Feed the context tokens not seen yet to every matcher and the self automaton."""
        for token in context[len(self._self) :]:
            self._self.extend(token)
            for m in self._matchers:
                m.advance(token)

    def matches(self, context: Sequence[int], max_tokens: int) -> list[Match]:
        """Per reference, the longest suffix match that has a continuation, in source priority
        order: passages, earlier answers, then the running context (prompt and output)."""
        self._sync(context)
        found: list[Match] = []
        n_passages = len(self._ref_ids)
        for i, m in enumerate(self._matchers):
            if m.length < self.min_match:
                continue
            length, tokens = m.sam.continuation(m.state, m.length, max_tokens)
            if length >= self.min_match:
                if i < n_passages:
                    found.append(Match(length, tokens, DraftSource.PASSAGE, self._ref_ids[i]))
                else:
                    found.append(Match(length, tokens, DraftSource.HISTORY, None))
        sam = self._self
        state = sam.link[sam.last] if sam.last else 0
        length = sam.length[state] if state > 0 else 0
        if length >= self.min_match:
            end = sam.first_end[state]
            tokens = tuple(sam.tokens[end + 1 : end + 1 + max_tokens])
            source = DraftSource.PROMPT if end + 1 < self._prompt_len else DraftSource.OUTPUT
            found.append(Match(length, tokens, source, None))
        return found

    def longest_match(self, context: Sequence[int], max_tokens: int) -> Match | None:
        """The longest suffix match over all references (ties broken by source priority)."""
        return max(self.matches(context, max_tokens), key=lambda m: m.length, default=None)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        if max_tokens <= 0:
            self._sync(context)
            return None
        match = self.longest_match(context, max_tokens)
        if match is None or not match.tokens:
            return None
        return Draft(match.tokens, match.source, match.length, match.reference)

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        """Acceptance is tracked by the policy; the index needs nothing."""

    def finish(self, output: Sequence[int]) -> None:
        """Remember a finished answer in the bounded cross-request history (if enabled)."""
        self.history.add(output)

    def forget(self) -> None:
        """Forget the earlier answers (the generator does when a request of another cache scope comes:
        what one user was answered must not speed up, or show in the statistics of, another's answer)."""
        self.history.clear()
