"""``benchmarks/follow_up_rewrite.py``: follow-ups made standalone by rules, checked on written-out examples."""

from __future__ import annotations

import pytest

from benchmarks.follow_up_rewrite import PRONOUNS, question_subject, standalone_question

SUBJECTS = [
    ("When did the great flood hit Marrowford?", "the great flood"),
    ("When did the Wend Valley Railway reach Marrowford?", "the Wend Valley Railway"),
    ("When did the priory build the stone bridge at Marrowford?", "the priory"),
    ("When was the Kestrel Lane bakery cooperative founded?", "the Kestrel Lane bakery cooperative"),
    ("How long is the trial period for new Kestrel Lane staff?", "the trial period for new Kestrel Lane staff"),
    ("How many days of paid holiday do full-time Kestrel Lane members get?", "full-time Kestrel Lane members"),
    ("How often does Ledgerline write a checkpoint?", "Ledgerline"),
    ("How many players can play Harbour Lights?", "the players"),  # the wh-phrase is the subject
    ("What does the Spare Lens card do in Harbour Lights?", "the Spare Lens card"),
    ("Where does tidepool restore write a snapshot?", "tidepool restore"),
    ("When did the last woollen mill in Marrowford close?", "the last woollen mill in Marrowford"),
    ("How many bakers founded the Kestrel Lane cooperative?", "the bakers"),
    ("Since what year has the Lantern Walk been held in Marrowford?", "the Lantern Walk"),
    ("How many members does it have today?", None),  # a pronoun names nothing
    ("Who warned the town?", None),  # "who" is the subject
    ("Tell me about the flood.", None),  # not a wh-question
]

REWRITES = [
    (["When did the great flood hit Marrowford?"], "How many people died in it?", "How many people died in the great flood?"),
    (["When did the Wend Valley Railway reach Marrowford?", "When did its passenger trains stop?"],
     "What is its track bed used for now?", "What is the Wend Valley Railway's track bed used for now?"),
    (["When was the Kestrel Lane bakery cooperative founded?", "How many members does it have today?"],
     "How much does each of them pay for a share?", "How much does each of the members pay for a share?"),
    (["How long is the trial period for new Kestrel Lane staff?"], "What majority is needed in the vote at the end of it?",
     "What majority is needed in the vote at the end of the trial period for new Kestrel Lane staff?"),
    (["How many days of paid holiday do full-time Kestrel Lane members get?"], "And how long is their parental leave?",
     "How long is full-time Kestrel Lane members' parental leave?"),
    (["How many players can play Harbour Lights?"], "How many boats must reach the harbour for them to win?",
     "How many boats must reach the harbour for the players to win?"),
    (["How many oil cubes go on each lighthouse when setting up Harbour Lights?", "How many can one lighthouse hold at most?"],
     "What happens if the supply of them runs out?", "What happens if the supply of the oil cubes runs out?"),
    (["How long is sick leave paid at the Kestrel Lane bakery?"], "And how much notice do members give when they leave?",
     "How much notice do members give when they leave?"),  # "they" is its own subject
    (["When did the great flood hit Marrowford?"], "Who warned the town?", "Who warned the town?"),  # nothing to resolve
    ([], "How many people died in it?", "How many people died in it?"),  # no earlier question
    (["Tell me about the flood."], "How many people died in it?", "How many people died in it?"),  # nothing named
]


@pytest.mark.parametrize(("question", "subject"), SUBJECTS)
def test_the_subject_of_a_question(question: str, subject: str | None) -> None:
    assert question_subject(question) == subject


@pytest.mark.parametrize(("earlier", "question", "standalone"), REWRITES)
def test_a_follow_up_is_rewritten_with_the_earlier_subject(earlier: list[str], question: str, standalone: str) -> None:
    assert standalone_question(question, earlier) == standalone


def test_a_question_without_a_pronoun_is_left_as_it_is() -> None:
    earlier = ["When did the great flood hit Marrowford?"]
    for question in ["Who warned the town?", "How many supply cards may a player hold at most?", "What does `--into-existing` do?",
                     "Which checksum does that header carry?"]:  # fmt: skip
        assert not PRONOUNS & {w.lower().strip("?") for w in question.split()}
        assert standalone_question(question, earlier) == question


def test_every_pronoun_is_replaced_when_the_earlier_questions_name_a_subject() -> None:
    earlier = ["When was the Kestrel Lane bakery cooperative founded?"]
    for pronoun in ["it", "he", "she", "him"]:
        out = standalone_question(f"Who founded {pronoun}?", earlier)
        assert out == "Who founded the Kestrel Lane bakery cooperative?"
    assert standalone_question("What is its address?", earlier) == "What is the Kestrel Lane bakery cooperative's address?"
    assert standalone_question("Who works there?", earlier) == "Who works in the Kestrel Lane bakery cooperative?"
