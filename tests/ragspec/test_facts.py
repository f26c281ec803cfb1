"""The facts of an answer (ragspec.facts): number words as digits, numbers and names, and which a passage lacks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragspec.facts import answer_facts, missing_facts, normalize_numbers, stem, words

UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def spelled(n: int, hyphen: bool = True, and_: bool = False) -> str:
    """A reference spelling of ``0 <= n < 10**9`` in English words, written here independently of the parser."""
    if n < 20:
        return UNITS[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else ("-" if hyphen else " ") + UNITS[n % 10])
    for size, name in ((10**6, "million"), (1000, "thousand"), (100, "hundred")):
        if n >= size:
            head = spelled(n // size, hyphen, and_) + " " + name
            rest = n % size
            if not rest:
                return head
            return head + (" and " if and_ and rest < 100 else " ") + spelled(rest, hyphen, and_)
    raise AssertionError(n)


@given(st.integers(0, 999_999_999), st.booleans(), st.booleans())
def test_every_spelled_number_becomes_its_digits(n, hyphen, and_):
    assert normalize_numbers(spelled(n, hyphen, and_)) == str(n)
    assert normalize_numbers(f"About {spelled(n, hyphen, and_).capitalize()} people.") == f"About {n} people."


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("Twenty-three people died.", "23 people died."),
        ("It cost 1,000 pounds, not 12,345,678.", "It cost 1000 pounds, not 12345678."),
        ("two to five players", "2 to 5 players"),
        ("nineteen sixty-three", "19 63"),  # two numbers side by side stay two
        ("three hundred and forty-two", "342"),
        ("bread and butter", "bread and butter"),  # "and" joins numbers only
        ("Someone came at 3:30 or 11:30; pi is 3.14", "Someone came at 3:30 or 11:30; pi is 3.14"),
        ("often, tone, phone, Seventeen", "often, tone, phone, 17"),  # whole words only
    ],
)
def test_normalize_numbers(text, want):
    assert normalize_numbers(text) == want


DENOMINATORS = {"half": 2, "third": 3, "quarter": 4, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10}


@given(st.integers(1, 9), st.sampled_from(sorted(DENOMINATORS)), st.sampled_from(["-", " "]), st.booleans())
def test_every_fraction_in_words_becomes_digits(count, denominator, joint, capital):
    name = denominator if count == 1 else ("halves" if denominator == "half" else denominator + "s")
    text = f"{UNITS[count]}{joint}{name}"
    assert normalize_numbers(text.capitalize() if capital else text) == f"{count}/{DENOMINATORS[denominator]}"
    assert normalize_numbers(f"at least a{'n' if denominator == 'eighth' else ''} {denominator} of it") == f"at least 1/{DENOMINATORS[denominator]} of it"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("A two-thirds majority.", "A 2/3 majority."),
        ("almost a fifth of the bread", "almost 1/5 of the bread"),
        ("half past three", "half past 3"),  # no count before it: no fraction
        ("the fifth day", "the fifth day"),
    ],
)
def test_normalize_fractions(text, want):
    assert normalize_numbers(text) == want


def test_a_fraction_in_digits_is_the_fraction_in_words():
    assert words("It needs 2/3 of the votes.") == ["it", "needs", "2/3", "of", "the", "votes"]
    assert missing_facts("A 2/3 majority is needed.", ["A two-thirds majority of those present is needed."]) == []
    assert missing_facts("A 3/4 majority is needed.", ["A two-thirds majority of those present is needed."]) == ["3/4"]


def test_words_keep_times_and_decimals_whole():
    assert words("At 3:30, 4.1875 and Twenty-three.") == ["at", "3:30", "4.1875", "and", "23"]


def test_answer_facts_are_its_numbers_and_names_beyond_the_question():
    facts = answer_facts("The flood of 1871 killed twenty-three people; Ada Pellow warned the town.", "When was the flood?")
    assert facts.numbers == {"1871", "23"} and facts.names == {"ada", "pellow"}
    # List markers, citation markers and sentence-initial capitals are not facts; the question's words are given.
    facts = answer_facts("1. The hours of the early bake are 3:30 to 11:30 [2].\n2. Then Day shift.", "When is the Day shift?")
    assert facts.numbers == {"3:30", "11:30"} and facts.names == set()
    assert not answer_facts("I do not know.")


def test_missing_facts_compares_digits_with_number_words():
    passage = "Twenty-three people died. The dam of the Hollin reservoir gave way on 14 November 1871."
    assert missing_facts("The number of people who died was 23.", [passage], "How many people died in it?") == []
    assert missing_facts("It gave way in 1872 near Hollin and Ellery.", [passage]) == ["1872", "ellery"]
    assert missing_facts("The boiling point of mercury is 4.1875 degrees Celsius.", [passage]) == ["4.1875", "celsius"]
    assert missing_facts("It was 23.", [passage, "One thousand came."]) == []


def test_number_units_pair_each_count_with_what_it_counts():
    from ragspec.facts import number_units, unheld_units

    assert number_units("The bakery has 2 ovens and 5 arches; in 1871 the flood came on 14 November.") == [("2", "oven"), ("5", "arch")]
    assert number_units("The answer is: 4.", "How many bakers founded it?") == [("4", "baker")]
    assert number_units("From 3:30 to 11:30.", "What are the hours?") == []  # a word like "to" counts nothing
    # A time with no word after it counts nothing the question asks about (fresh3's f3-61: "runs three shifts:
    # ... 3:30 to 11:30. Bread ...").
    assert number_units("It runs 3 shifts: 3:30 to 11:30. Day: 9:00 to 17:00.", "How many shifts are there?") == [("3", "shift")]
    assert unheld_units([("2", "oven")], ["A bakery with two shops. It has ovens."]) == ["2 oven"]
    assert unheld_units([("2", "oven"), ("6:15", "sharp")], ["Two deck ovens.", "It leaves at 6:15 sharp."]) == []


def test_asks_number_and_counts():
    from ragspec.facts import asks_number, counts, negations

    assert [asks_number(q) for q in ("How many arches?", "In what year?", "How long is it?")] == ["count", "year", ""]
    assert counts("Twenty-three died.", "How many people died in 1871?")
    assert not counts("It gave way on 14 November 1871.", "How many days of rain came?")  # a date counts nothing
    assert counts("It opened in 1874.", "In what year did the bridge open?")
    assert asks_number("In which month was the reunion held?") == "month"
    assert not counts("The reunion was held in 2015.", "In which month was the reunion held?")  # a year names no month
    assert counts("It was held every September.", "In which month was the reunion held?")
    assert negations("It can't.") and negations("Never on Sundays") and not negations("Nothing" [1:] + " notable")


def test_stem_matches_a_word_with_its_endings() -> None:
    """"doubled" matches "double" ("The population doubled" answers "did the population double?")."""
    assert {stem(w) for w in ("double", "doubled", "doubles", "doubling")} == {"doubl"}
    assert stem("crossings") == "cross" and stem("arches") == stem("arch") == "arch" and stem("the") == "the"
