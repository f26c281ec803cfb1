"""The facts an answer states, for checking them against the passage it cites.

A reader takes numbers, dates and names from an answer; a small model invents exactly those ("The
boiling point of mercury is 4.1875 degrees Celsius."). ``missing_facts`` lists the ones a passage does
not hold, so that ``ragspec.citations`` can refuse support to an answer whose words match a passage
but whose facts do not.

Numbers are compared as digits: number words become digits (``"twenty-three"`` = ``"23"``, ``"nine
thousand"`` = ``"9000"``, ``"three hundred and forty-two"`` = ``"342"``), fractions in words become
fractions in digits (``"two-thirds"`` = ``"2/3"``, ``"a quarter"`` = ``"1/4"``) and thousands separators go
(``"1,000"`` = ``"1000"``), in the answer and the passage alike, by ``normalize_numbers``. It is written
here rather than taken from a library: text2num 3.1 (the maintained one on PyPI) is made for speech
transcripts and leaves "one" and "two" as words in every context tried ("two players", "for two
weeks"), while it turns "five" into "5"; a passage saying "two to five players" and an answer saying
"2 to 5" would then disagree. The check needs the same digits on both sides, which a few dozen lines give.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "STOP_WORDS", "Facts", "answer_facts", "asks_number", "counts", "missing_facts", "negations", "normalize_numbers",
    "number_units", "stem", "unheld", "unheld_units", "words",
]

_UNITS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen".split()
    )
}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_NUMBER_WORD = "|".join(sorted([*_UNITS, *_TENS, *_SCALES], key=len, reverse=True))
# A run of number words joined by spaces or hyphens, with "and" allowed before a word after a scale
# ("three hundred and forty-two").
_NUMBER_RUN = re.compile(
    rf"\b(?:{_NUMBER_WORD})(?:(?:[ \t-]+|[ \t]+and[ \t]+)(?:{_NUMBER_WORD}))*\b", re.IGNORECASE
)
_GROUPED = re.compile(r"\b\d{1,3}(?:,\d{3})+\b")
_DENOMINATORS = {"half": 2, "halves": 2, "quarter": 4, "quarters": 4} | {
    w + s: i for i, w in enumerate("third fourth fifth sixth seventh eighth ninth tenth".split(), start=3) for s in ("", "s")
}
# A fraction in words: a count ("a", "one" to "nine") then a denominator ("two-thirds", "a quarter", "three fifths");
# "the fifth day" or "half past three" name no fraction.
_FRACTION = re.compile(
    rf"\b(an?|{'|'.join(list(_UNITS)[1:10])})[ \t-]+({'|'.join(sorted(_DENOMINATORS, key=len, reverse=True))})\b",
    re.IGNORECASE,
)


def _values(run: str) -> list[int]:
    """The numbers a run of number words says: ``"twenty three"`` is 23, ``"nineteen sixty-three"`` 19 and 63."""
    numbers: list[int] = []
    total = current = 0
    last = ""  # the kind of the previous word: "unit", "teen", "tens", "scale"
    started = False
    for word in re.split(r"[ \t-]+", run.lower()):
        if word == "and":
            continue
        if word in _SCALES:
            scale = _SCALES[word]
            current = current or 1
            if scale == 100:
                current *= 100
            else:
                total, current = total + current * scale, 0
            last = "scale"
        else:
            value = _UNITS.get(word, _TENS.get(word, 0))
            kind = "tens" if word in _TENS else ("teen" if value >= 10 else "unit")
            joins = started and (last == "scale" or (last == "tens" and kind == "unit"))
            if started and not joins:
                numbers.append(total + current)
                total = current = 0
            current += value
            last = kind
        started = True
    numbers.append(total + current)
    return numbers


def _fraction(match: re.Match[str]) -> str:
    count = match.group(1).lower()
    return f"{1 if count in ('a', 'an') else _UNITS[count]}/{_DENOMINATORS[match.group(2).lower()]}"


def normalize_numbers(text: str) -> str:
    """``text`` with number words as digits, fractions in words as fractions in digits and thousands
    separators dropped ("Twenty-three" -> "23", "two-thirds" -> "2/3", "1,000" -> "1000"); everything
    else as it was."""
    text = _GROUPED.sub(lambda m: m.group(0).replace(",", ""), text)
    text = _FRACTION.sub(_fraction, text)
    return _NUMBER_RUN.sub(lambda m: " ".join(str(v) for v in _values(m.group(0))), text)


STOP_WORDS = frozenset(
    "a an and are as at be been but by do does for from had has have he her his i if in is it its "
    "not of on or she so than that the their them then there they this to was we were what when "
    "which who will with you your".split()
)
"""Words that carry no fact of their own ("the", "is")."""


def stem(word: str) -> str:
    """``word`` without a plural, then an "-ing"/"-ed" ending, then a final "e" ("crossings" -> "cross", "takes" ->
    "tak", "doubled" and "double" -> "doubl"), for matching words."""
    if word.endswith("s") and not word.endswith("ss") and len(word) > 4:
        word = word[:-1]
    for ending in ("ing", "ed"):
        if word.endswith(ending) and len(word) - len(ending) >= 4:
            word = word[: -len(ending)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 4 else word


_TOKEN = re.compile(r"\d+(?:[.:/]\d+)*|\w+")


def words(text: str) -> list[str]:
    """The lower-cased words of ``text`` with its numbers as digits (``"3:30"``, ``"4.1875"`` and ``"2/3"`` stay one word)."""
    return [w.lower() for w in _TOKEN.findall(normalize_numbers(text))]


_LIST_MARKER = re.compile(r"(?m)^[ \t]*(?:\d+(?:\.\d+)*[.)]|[-*+])[ \t]+|^[ \t]*\d+(?:\.\d+)*[.)]?[ \t]*$")
_CITE_MARKER = re.compile(r"\[\d+(?:\s*[,;]\s*\d+)*\]")
_NUMBER = re.compile(r"^\d+(?:[.:/]\d+)*$")
_SENTENCE_START = re.compile(r"""(?:^|[.!?:]\s+|\n\s*|["'(*#`]\s*)$""")  # a capital there starts a sentence, names nothing
_NAME_RUN = re.compile(r"\b[A-Z][\w'’]*(?:[ \t]+[A-Z][\w'’]*)*")
_GENERIC = frozenset("i answer question passage passages document documents note yes no".split())


@dataclass(frozen=True)
class Facts:
    """What an answer states that a reader takes from it."""

    numbers: frozenset[str]
    """Its numbers, as ``words`` writes them (list and citation markers left out)."""
    names: frozenset[str]
    """Its capitalized words that do not start a sentence, lower-cased (names of people, places, things),
    but for runs of them that name something the question names."""

    def __bool__(self) -> bool:
        return bool(self.numbers or self.names)


def answer_facts(text: str, question: str = "") -> Facts:
    """The numbers and names of ``text`` that ``question`` does not already hold."""
    body = _CITE_MARKER.sub(" ", _LIST_MARKER.sub(" ", text))
    given = set(words(question))
    numbers = {w for w in words(body) if _NUMBER.match(w)} - given
    normalized = normalize_numbers(body)
    names: set[str] = set()
    for match in _NAME_RUN.finditer(normalized):
        run = [w for w in words(match.group(0)) if len(w) > 1 and w not in _GENERIC]  # not the "s" of "Society's"
        if _SENTENCE_START.search(normalized[: match.start()]):
            run = run[1:]  # a capital that starts a sentence names nothing ("The", "It")
        if not given.intersection(run):  # "Kestrel Lane Bakery Cooperative" names the question's "Kestrel Lane"
            names.update(run)
    return Facts(frozenset(numbers), frozenset(names))


def missing_facts(text: str, passages: Sequence[str], question: str = "") -> list[str]:
    """The facts of ``text`` (``answer_facts``) that none of ``passages`` holds: numbers, then names, sorted."""
    facts = answer_facts(text, question)
    return unheld([*sorted(facts.numbers), *sorted(facts.names)], passages) if facts else []


def unheld(wanted: Sequence[str], passages: Sequence[str]) -> list[str]:
    """Those of ``wanted`` (words as ``words`` writes them) that none of ``passages`` holds, in order."""
    held = {w for p in passages for w in words(p)}
    return [w for w in wanted if w not in held]


_NUMBER_UNIT = re.compile(r"(?<![\w.:/])(\d+(?:[.:/]\d+)*)(?![\w:/]|\.\d)(?:[ \t]+([^\W\d][\w'’]*))?")
_COUNTED = re.compile(r"\bhow\s+(?:many|much)\s+(\w+)", re.IGNORECASE)
_YEAR = re.compile(r"^1\d{3}$|^20\d{2}$")
_MONTHS = frozenset(
    "january february march april may june july august september october november december".split()
)
_CLAUSE_END = re.compile(r"[.!?;:](?=\s)|[()\[\]\n|]")


def number_units(text: str, question: str = "") -> list[tuple[str, str]]:
    """``(number, unit)`` for each number of ``text`` that ``question`` does not hold and that a word
    directly follows, the thing it counts or measures ("2 ovens" -> ``("2", "oven")``, the unit stemmed);
    not years (a year followed by a word is not a count: "1871 flood") nor days of a month. A number
    with no word after it answering "how many W" counts the question's W ("4." to "How many bakers ...?"
    -> ``("4", "baker")``), unless it is a time or a decimal ("3:30 to 11:30." counts no shifts)."""
    given = set(words(question))
    asked = _COUNTED.search(question)
    counted = stem(asked.group(1).lower()) if asked and asked.group(1).lower() not in STOP_WORDS else ""
    found = []
    for match in _NUMBER_UNIT.finditer(normalize_numbers(_CITE_MARKER.sub(" ", _LIST_MARKER.sub(" ", text)))):
        number, unit = match.group(1), (match.group(2) or "").lower()
        if number in given or _YEAR.match(number) or unit in _MONTHS:
            continue
        if unit and unit not in STOP_WORDS and not unit.isdigit():
            found.append((number, stem(unit)))
        elif counted and not unit and number.isdigit():  # a time or a decimal ("11:30", "4.5") counts nothing
            found.append((number, counted))
    return list(dict.fromkeys(found))


def unheld_units(wanted: Sequence[tuple[str, str]], passages: Sequence[str], reach: int = 3) -> list[str]:
    """Those of ``wanted`` (``number_units``) that no clause of ``passages`` holds, the number with its unit
    at most ``reach`` words before or after it ("two shops" does not back "2 ovens"), written "2 oven"."""
    held: set[tuple[str, str]] = set()
    for passage in passages:
        for clause in _CLAUSE_END.split(normalize_numbers(passage)):
            ws = [stem(w) for w in words(clause)]
            for i, w in enumerate(ws):
                if _NUMBER.match(w):
                    held.update((w, u) for u in ws[max(0, i - reach) : i + reach + 1])
    return [f"{n} {u}" for n, u in wanted if (n, u) not in held]


_COUNT_QUESTION = re.compile(r"\bhow\s+(?:many|much)\b", re.IGNORECASE)
_YEAR_QUESTION = re.compile(r"\b(?:what|which)\s+year\b", re.IGNORECASE)
_MONTH_QUESTION = re.compile(r"\b(?:what|which)\s+month\b", re.IGNORECASE)


def asks_number(question: str) -> str:
    """``"count"`` for a question that asks how many or how much, ``"year"`` for one that asks what year,
    ``"month"`` for one that asks what month, else ``""``: what an answer must state to answer it at all."""
    if _COUNT_QUESTION.search(question):
        return "count"
    if _MONTH_QUESTION.search(question):
        return "month"
    return "year" if _YEAR_QUESTION.search(question) else ""


def counts(text: str, question: str) -> bool:
    """Whether ``text`` states what ``question``'s ``asks_number`` asks for: a month's name for a month ("held in
    2015" names none); else a number the question does not hold, for a count one that is not a year or a day of a
    month ("14 November 1871" counts nothing)."""
    kind = asks_number(question)
    if kind == "month":
        return bool(set(words(text)) & _MONTHS - set(words(question)))
    numbers = answer_facts(text, question).numbers
    if kind != "count":
        return bool(numbers)
    ws = words(_CITE_MARKER.sub(" ", _LIST_MARKER.sub(" ", text)))
    dated = {w for i, w in enumerate(ws) if {ws[i - 1] if i else "", ws[i + 1] if i + 1 < len(ws) else ""} & _MONTHS}
    return any(not _YEAR.match(n) and n not in dated for n in numbers)


_NEGATION = re.compile(r"\b(?:not|no|never|none|nobody|nothing|neither|nor|cannot)\b|n[’']t\b", re.IGNORECASE)


def negations(text: str) -> bool:
    """Whether ``text`` denies something ("not", "never", "no", "can't")."""
    return bool(_NEGATION.search(text))
