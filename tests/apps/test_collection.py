"""The apps' adapter over the pipeline: events, citations, stats, history, index building errors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from langchain_core.documents import Document

from apps.collection import AppError, Collection, Token, _pipeline_events, update_index
from ragspec.engine.results import GenerationStats
from ragspec.answers import Answer, Citation
from ragspec.prompts import Turn
from tests.apps.fakes import counting_embeddings


def cite(number: int, page: int | None = None, start: int | None = 7) -> Citation:
    return Citation(number, f"/docs/{number}.md", start, page, f"Doc {number}", "the start…", f"c{number}")


@dataclass
class FakeStream:
    """Shaped like ``AnswerStream``: a context manager whose ``stats`` are live once it runs (when ``live``)."""

    deltas: list[str]
    answer_: Answer
    live: bool = False
    stats: GenerationStats | None = None
    closed: int = 0
    answer: Answer | None = None

    def __iter__(self) -> Iterator[str]:
        if self.live:
            self.stats = GenerationStats()
        for i, d in enumerate(self.deltas):
            if self.stats is not None:
                self.stats.forward_passes = i + 2
                self.stats.new_tokens = 2 * (i + 1)
                self.stats.drafted_tokens, self.stats.accepted_tokens = 4 * (i + 1), 3 * (i + 1)
            yield d
        self.answer = self.answer_

    def __enter__(self) -> FakeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.closed += 1


def make_answer(text: str, citations: list[Citation]) -> Answer:
    passages = [Document(page_content=f"full passage {i}", metadata={}) for i in (1, 2)]
    stats = GenerationStats(prompt_tokens=10, new_tokens=6, forward_passes=3, drafted_tokens=4, accepted_tokens=3, ttft_s=0.5, wall_s=1.5)
    return Answer("q", text, citations, passages, "cited" if citations else "unsupported", "eos", stats)


def test_events_are_tokens_then_the_answer_itself() -> None:
    answer = make_answer("The answer [2].", [cite(2)])
    stream = FakeStream(["The ", "", "answer [2]."], answer)
    events = list(_pipeline_events(stream, 0.0))
    tokens, last = events[:-1], events[-1]
    assert [t.text for t in tokens] == ["The ", "answer [2]."]  # empty deltas dropped
    assert all(isinstance(t, Token) for t in tokens)
    assert [t.tokens for t in tokens] == [1, 2] and tokens[0].acceptance is None  # no live stats: one per piece
    assert last is answer and stream.closed == 1


def test_live_counts_come_from_the_generation_stats_not_the_text() -> None:
    stream = FakeStream(["a", "b"], make_answer("ab", []), live=True)
    tokens = [e for e in _pipeline_events(stream, 0.0) if isinstance(e, Token)]
    assert [t.tokens for t in tokens] == [2, 4]  # the live new_tokens, whatever the text
    assert [(t.acceptance, t.tokens_per_forward) for t in tokens] == [(0.75, 1.0), (0.75, 4 / 3)]


def test_an_unsupported_answer_arrives_as_it_is() -> None:
    *_, last = _pipeline_events(FakeStream(["Lima."], make_answer("Lima.", [])), 0.0)
    assert isinstance(last, Answer) and last.supported is False and last.citations == []
    *_, cited = _pipeline_events(FakeStream(["[2]"], make_answer("[2]", [cite(2)])), 0.0)
    assert cited.supported is True


def test_closing_early_closes_the_stream_and_finishes_nothing() -> None:
    stream = FakeStream(["a", "b", "c"], make_answer("abc", []))
    events = _pipeline_events(stream, 0.0)
    assert next(events).text == "a"
    events.close()
    assert stream.closed == 1 and stream.answer is None


def test_citation_locations_and_dicts() -> None:
    assert cite(1, page=3).location == "page 3"
    assert cite(1, page=None, start=1520).location == "char 1520"
    assert cite(1, page=None, start=None).location == ""
    as_dict = cite(2, page=4).as_dict()
    assert as_dict["location"] == "page 4" and as_dict["number"] == 2 and as_dict["title"] == "Doc 2"


class FakeQA:
    """Records what ``Collection`` asks; answers each question with ``answer_for(question)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Turn]]] = []

    def stream(self, question: str, *, history: list[Turn], max_tokens: int, k: int | None = None) -> FakeStream:
        self.calls.append((question, list(history)))
        answer = make_answer(f"answer to {question}", [])
        answer = Answer(question, answer.text, [], answer.passages, "unsupported", "eos", answer.stats, earlier_passages=1)
        return FakeStream([answer.text], answer)


def test_history_pairs_reach_the_pipeline_as_turns_with_the_passages_they_were_shown(tmp_path: Path) -> None:
    collection = Collection(tmp_path, history_turns=2)
    qa = collection._qa = FakeQA()
    *_, first = collection.stream("When?")
    history = [("When?", first.text)]
    list(collection.stream("And then?", history))
    history.append(("And then?", "answer to And then?"))
    list(collection.stream("Why?", [("Unknown?", "No."), *history]))
    assert qa.calls[0] == ("When?", [])
    shown = (first.passages[1],)  # passages[earlier_passages:] of the answer
    assert qa.calls[1] == ("And then?", [Turn("When?", first.text, shown)])
    assert qa.calls[2] == ("Why?", [Turn("When?", first.text, shown), Turn("And then?", "answer to And then?", shown)])


def test_bad_settings_and_paths_fail_early(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Collection(tmp_path, max_tokens=0)
    with pytest.raises(ValueError):
        Collection(tmp_path, k=0)
    with pytest.raises(ValueError, match="repeat_penalty must be > 0"):
        Collection(tmp_path, options={"repeat_penalty": -1.0})
    with pytest.raises(AppError, match="no files"):
        update_index([], tmp_path / "index")
    with pytest.raises(AppError, match="no such file"):
        update_index([tmp_path / "nope"], tmp_path / "index")
    with pytest.raises(AppError, match="empty"):
        next(Collection(tmp_path).stream("   "))


@pytest.mark.timeout(120)
def test_update_index_is_incremental_and_its_errors_leave_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.collection import update_index

    embedded = counting_embeddings(monkeypatch)
    index = tmp_path / "idx"
    with pytest.raises(AppError, match="no files"):
        update_index([], index)
    with pytest.raises(AppError, match="no such file"):
        update_index([tmp_path / "nope"], index)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nThe ferry leaves at seven.\n")
    (docs / "scan.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    summary = update_index([docs], index)
    assert summary.files == [str(docs / "a.md")] and summary.chunks == 1 and len(embedded) == 1
    assert [s.path for s in summary.skipped] == [str(docs / "scan.pdf")] and "corrupt PDF" in summary.skipped[0].reason
    assert summary.update is not None and summary.update.new == [str(docs / "a.md")]
    saved = {p.name: p.read_bytes() for p in index.iterdir()}
    again = update_index([docs], index)
    assert again.update is not None and again.update.unchanged == [str(docs / "a.md")] and len(embedded) == 1
    (docs / "a.md").unlink()
    with pytest.raises(AppError, match="found no text to index") as info:
        update_index([docs], index)
    assert "scan.pdf: corrupt PDF" in str(info.value) and "left as it was" in str(info.value)
    assert {p.name: p.read_bytes() for p in index.iterdir()} == saved
