"""The apps' adapter over the pipeline: events, citations, stats, history, index building errors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from langchain_core.documents import Document

from apps.engine import AppError, Collection, Finished, SpeedStats, Token, _pipeline_events, build_index, citation_view, with_history
from ragspec.generator import GenerationStats
from ragspec.pipeline import Answer, Citation


def cite(number: int, page: int | None = None, start: int | None = 7) -> Citation:
    return Citation(number, f"/docs/{number}.md", start, page, f"Doc {number}", "the start…", f"c{number}")


@dataclass
class FakeStream:
    """Shaped like ``AnswerStream``; optionally exposes live statistics as ``stats``."""

    deltas: list[str]
    answer_: Answer
    live: bool = False
    stats: GenerationStats | None = None
    closed: list[bool] = field(default_factory=list)
    answer: Answer | None = None

    def __iter__(self) -> Iterator[str]:
        if self.live:
            self.stats = GenerationStats()
        try:
            for i, d in enumerate(self.deltas):
                if self.stats is not None:
                    self.stats.forward_passes = i + 2
                    self.stats.new_tokens = 2 * (i + 1)
                    self.stats.drafted_tokens, self.stats.accepted_tokens = 4 * (i + 1), 3 * (i + 1)
                yield d
            self.answer = self.answer_
        finally:
            self.closed.append(True)


def make_answer(text: str, citations: list[Citation]) -> Answer:
    passages = [Document(page_content=f"full passage {i}", metadata={}) for i in (1, 2)]
    stats = GenerationStats(prompt_tokens=10, new_tokens=6, forward_passes=3, drafted_tokens=4, accepted_tokens=3, ttft_s=0.5, wall_s=1.5)
    return Answer("q", text, citations, passages, "cited", "eos", stats)


def test_events_are_tokens_then_one_finished_with_full_passages() -> None:
    stream = FakeStream(["The ", "", "answer [2]."], make_answer("The answer [2].", [cite(2)]))
    events = list(_pipeline_events(stream, 0.0, lambda text: len(text.split())))
    tokens, finished = events[:-1], events[-1]
    assert [t.text for t in tokens] == ["The ", "answer [2]."]  # empty deltas dropped
    assert all(isinstance(t, Token) for t in tokens) and [t.tokens for t in tokens] == [1, 3]
    assert tokens[0].acceptance is None  # the stream has no live statistics
    assert isinstance(finished, Finished) and finished.text == "The answer [2]."
    (c,) = finished.citations
    assert (c.number, c.source, c.location, c.title, c.text) == (2, "/docs/2.md", "char 7", "Doc 2", "full passage 2")
    assert finished.stats == SpeedStats(6, 5.0, 0.75, 2.0, 1.5)  # 5 decode tokens in 1 s; 3 of 4 drafted accepted


def test_an_unsupported_answer_finishes_unsupported() -> None:
    *_, finished = _pipeline_events(FakeStream(["Lima."], make_answer("Lima.", [])), 0.0)
    assert isinstance(finished, Finished) and finished.supported is False and finished.citations == []
    *_, cited = _pipeline_events(FakeStream(["[2]"], make_answer("[2]", [cite(2)])), 0.0)
    assert cited.supported is True


def test_live_statistics_are_passed_on_when_the_stream_has_them() -> None:
    stream = FakeStream(["a", "b"], make_answer("ab", []), live=True)
    tokens = [e for e in _pipeline_events(stream, 0.0) if isinstance(e, Token)]
    assert [(t.acceptance, t.tokens_per_forward) for t in tokens] == [(0.75, 1.0), (0.75, 4 / 3)]


def test_closing_early_closes_the_stream_and_finishes_nothing() -> None:
    stream = FakeStream(["a", "b", "c"], make_answer("abc", []))
    events = _pipeline_events(stream, 0.0)
    assert next(events).text == "a"
    events.close()
    assert stream.closed == [True] and stream.answer is None


def test_citation_locations() -> None:
    assert citation_view(cite(1, page=3)).location == "page 3"
    assert citation_view(cite(1, page=None, start=None)).location == ""
    assert citation_view(cite(5), passages=[]).text == "the start…"  # no passage: the pipeline's snippet


def test_history_goes_before_the_new_question() -> None:
    assert with_history("Why?", []) == "Why?"
    text = with_history("And then?", [("When?", " At six. ")])
    assert text == "Earlier question: When?\nEarlier answer: At six.\nNew question: And then?"


def test_bad_settings_and_paths_fail_early(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Collection(tmp_path, max_tokens=0)
    with pytest.raises(ValueError):
        Collection(tmp_path, k=0)
    with pytest.raises(AppError, match="no files"):
        build_index([])
    with pytest.raises(AppError, match="no such file"):
        build_index([tmp_path / "nope"])
    with pytest.raises(AppError, match="empty"):
        next(Collection(tmp_path).stream("   "))
