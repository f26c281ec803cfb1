"""``python -m tests.security.fake_cli ARGS...``: the real ``ragspec`` command line over a fake index.

Its collection encodes every question with a ``tokenizers`` tokenizer before answering, as the
real pipeline does before retrieval, so text that is not valid Unicode fails the same way
(``TypeError`` from the tokenizer) without loading a model. The answer echoes the question.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

from apps import cli
from apps.collection import Event, Token
from tests.apps.fakes import fake_answer


class TokenizingCollection:
    def __init__(self) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers

        self.tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
        self.tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        if "boom" in question:
            raise RuntimeError("the model failed on this question")
        self.tokenizer.encode(question)  # TypeError for a lone surrogate, like the real tokenizers
        yield Token("You asked: ", 0.1, 1, 1)
        yield Token(question, 0.2, 2, 2)
        yield fake_answer(f"You asked: {question}", [("notes.md", "Notes", "t")])


if __name__ == "__main__":
    cli._collection = lambda args: TokenizingCollection()  # type: ignore[assignment]
    sys.exit(cli.main())
