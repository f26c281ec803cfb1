"""The demo (``python -m apps.demo``, run by ``scripts/demo.sh``) shows each answer with what backs it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from apps import demo
from ragspec.answers import Answer, Citation
from tests.apps.fakes import fake_answer


class OneAnswer:
    """A ``DocumentQA`` stand-in whose stream yields ``answer``'s words, then has ``answer``."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    def stream(self, question: str) -> OneAnswer:
        self.answer: Answer | None = None
        return self

    def __iter__(self) -> Iterator[str]:
        yield self._answer.model_text
        self.answer = self._answer


def test_the_demo_flags_an_unbacked_answer(capsys: pytest.CaptureFixture[str]) -> None:
    guess = dataclasses.replace(fake_answer("You can use the tidepool command to remove the lock."), citation_rule="off_topic")
    demo.show(OneAnswer(guess), "How do I get rid of a stale lock?")  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "A: You can use the tidepool command to remove the lock.\n" in out
    assert "I don't know: no passage backs this answer (the passages it matches are not about the question)" in out


def test_the_demo_shows_the_cited_sentences_and_where_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    answer = fake_answer("Early bake runs 3:30 to 11:30 [1].", [("corpus/kestrel.md", "Kestrel", "x")])
    cited = Citation(1, "corpus/kestrel.md", 900, None, "Kestrel", "- **Early bake**: 3:30 to 11:30.", None, offset=1012)
    demo.show(OneAnswer(dataclasses.replace(answer, citations=[cited])), "When is the early bake?")  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "   [1] kestrel.md, char 1012: - **Early bake**: 3:30 to 11:30.\n" in out and "I don't know" not in out
