"""Which passages an answer cites, by this rule:

1. the passages the answer cites by number (``[2]``, ``[1, 3]``), in order of first mention;
2. otherwise the passages the answer copies a substantial span from: a run of
   ``min(6, words in the answer)`` consecutive words (at least 4, two of them not stop words
   such as "the" or "is") that the passage also holds, in rank order;
3. otherwise the passage that holds the most of the answer's content words (words that are not
   stop words), when it holds at least two thirds of them and at least two: a short answer
   ("It had five arches.") rarely copies six words but uses the passage's own; failing that, the
   same over the words the answer adds to the question's (an answer that restates the question,
   "The trial period at Kestrel Lane Bakery Cooperative is six months.", is judged on "cooperative
   six months");
4. otherwise, for an answer that adds only numbers and names to the question ("The answer is: 4."), the
   passages that hold all of them (``fact_numbers``), judged on topic as the question with the answer;
5. otherwise none: the answer is marked unsupported (``Answer.supported`` is False), since no
   passage is shown to back it. A passage is never cited just for being retrieved.

A passage chosen by 1-4 is kept only if the answer is about the question: at least half of the
question's content words (not stop words or question words such as "how"), compared without a plural
or verb ending, occur both in the answer and in that passage. A small model that cannot answer often
copies a passage that is beside the point ("Where can visitors park?" answered with the archive's
opening hours). The next rule is tried when none of a rule's passages is on topic; when no rule's is,
the answer cites nothing and its rule is ``"off_topic"``.

Matching words is not backing facts: "The boiling point of mercury is 4.1875 degrees Celsius." can share
a passage's words and still state what no passage says. So (``check_facts``, on by default) a passage is
cited only when

- what the answer states (without heading lines and an unfinished tail of four words or more: ``statements``) adds
  something to the question (``"restates"`` otherwise: "The answer is: Ada Pellow.");
- it states a number when the question asks how many, how much or what year (``"no_number"`` otherwise; for
  a count, not a year or a day of a month: "It gave way on 14 November 1871." counts no days of rain), and a
  month's name when it asks what month ("It was held in 2015." names none);
- it does not say the same six words twice (``"repeats"``: a small model going round in circles);
- the sentences of the passage it drew its words from (``drawn_sentences``: found by the words it adds
  to the question, with one sentence either side) are about the question, as above, not only the
  passage somewhere;
- the cited passages' sentences it drew from (with one either side), with the question, hold the
  answer's facts (``ragspec.facts``): its numbers, with
  number words as digits ("23" = "Twenty-three", "1000" = "1,000", "2/3" = "two-thirds"), and its names (capitalized words that
  do not start a sentence), each number with the word that follows it, the thing it counts, within three
  words of it in one clause ("2 ovens" is not backed by "two shops"; a bare "4." to "How many bakers ...?"
  counts bakers: ``facts.number_units``). Another passage the rules found the answer drawing on is cited too when it
  holds a fact the first lacks; when the facts are still not all held, the rule is ``"missing_facts"``;
- an answer that denies something ("not", "never", "no", "can't") draws on a sentence that denies something
  too (``"negation"`` otherwise: "verify checks that the pool is not locked" drawn from "the lock stays behind");
- every finished clause of it (a sentence, or a part of one between ";" or ":") that adds at least four content words
  to the question has at least a quarter of them in one sentence of the cited passages (``"unbacked_clause"``
  otherwise: a right clause with an invented reason attached, "The reason is that the log is stored on a disk that
  is designed to hold a large amount of data"); an unfinished tail is not judged;
- a clause that copies a passage sentence from a verb on keeps that sentence's subject (``"swapped_subject"``
  otherwise: "The top of the market cross is a copy made in 1958" from "the weathervane on top of it is a copy made
  in 1958"; "The guide is not a sync tool" from "tidepool is not a sync tool"): the clause's subject, when its head
  differs from the sentence's, is neither a word of the sentence's subject phrase nor a word the sentence lacks
  (a synonym the sentence also uses is not a swap; a pronoun subject is not judged);
- a finished clause about the question that adds one to three content words to it has more than half of them in a
  sentence of the cited passages (with one either side) that also holds half of the question's content words
  (``"stray_clause"`` otherwise: "The usual cause of a high 99th percentile of ll_wal_fsync_seconds is a crash.",
  "crash" being only elsewhere in the passage);
- the answer is not a heading of a passage, a line without a full stop ("The Kestrel Lane Bakery Cooperative: Staff
  Handbook"; ``"heading"``): a heading names a part of a document and states nothing.

``benchmarks/support_eval.py`` measures the rules, with and without these checks, against hand labels
(README, "Answers you can check").
"""

from __future__ import annotations

import dataclasses
import re
from difflib import SequenceMatcher
from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_core.documents import Document

from ragspec import facts
from ragspec.answers import Answer, Citation

if TYPE_CHECKING:
    from ragspec.engine.results import GenerationStats
    from ragspec.qa_models import QARequest

__all__ = [
    "cite", "cited_answer", "choose_citations", "cited_numbers", "copied_numbers", "fact_numbers", "on_topic_numbers",
    "overlap_numbers", "repeats", "restates", "statements", "stray_clause", "swapped_subject", "unbacked_clause", "heading",
]

_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    """The lower-cased words of ``text``, its number words as digits ("Twenty-three" and "23" are one word)."""
    return _WORD.findall(facts.normalize_numbers(text).lower())


_MARKER = re.compile(r"\[(\d+(?:\s*[,;]\s*\d+)*)\]")


def cited_numbers(text: str, n_passages: int) -> list[int]:
    """Passage numbers cited as ``[n]`` / ``[n, m]`` in ``text``, valid ones only, in order of first mention."""
    found: list[int] = []
    for match in _MARKER.finditer(text):
        for number in (int(x) for x in re.split(r"\s*[,;]\s*", match.group(1))):
            if 1 <= number <= n_passages and number not in found:
                found.append(number)
    return found


_STOP_WORDS = facts.STOP_WORDS


def copied_numbers(
    text: str, passages: Sequence[Document], max_run: int = 6, min_run: int = 4, min_content: int = 2
) -> list[int]:
    """Passages that hold a run of ``min(max_run, words in text)`` consecutive words of ``text``
    (at least ``min_run``, with at least ``min_content`` words that are not stop words), in rank order."""
    words = _words(text)
    run = min(max_run, len(words))
    if run < min_run:
        return []
    answer_runs = {
        tuple(words[i : i + run])
        for i in range(len(words) - run + 1)
        if sum(w not in _STOP_WORDS for w in words[i : i + run]) >= min_content
    }
    if not answer_runs:
        return []
    found = []
    for number, passage in enumerate(passages, start=1):
        pw = _words(passage.page_content)
        if any(tuple(pw[i : i + run]) in answer_runs for i in range(len(pw) - run + 1)):
            found.append(number)
    return found


def overlap_numbers(
    text: str, passages: Sequence[Document], min_share: float = 2 / 3, min_words: int = 2, ignore: str = ""
) -> list[int]:
    """The passages holding the most of ``text``'s content words (leaving out the words of ``ignore``),
    when that is at least ``min_share`` of them and at least ``min_words`` (ties: all of them, in rank order)."""
    wanted = set(_words(text)) - _STOP_WORDS - set(_words(ignore))
    if len(wanted) < min_words:
        return []
    held = [len(wanted & set(_words(p.page_content))) for p in passages]
    best = max(held, default=0)
    if best < max(min_words, min_share * len(wanted)):
        return []
    return [number for number, n in enumerate(held, start=1) if n == best]


def fact_numbers(text: str, passages: Sequence[Document], question: str) -> list[int]:
    """The passages holding every word ``text`` adds to ``question`` when those are all numbers or names:
    a bare fact ("The answer is: 4.") copies no run and has too few words for ``overlap_numbers``."""
    found = facts.answer_facts(text, question)
    added = set(_words(text)) - _STOP_WORDS - _FILLER - set(_words(question))
    if not found or added - found.numbers - found.names:
        return []
    return [n for n, p in enumerate(passages, start=1) if not facts.unheld(sorted(added), [p.page_content])]


_QUESTION_WORDS = _STOP_WORDS | frozenset("how why where whom whose can could should would did many much".split())


def _stems(text: str, stop_words: frozenset[str]) -> set[str]:
    return {facts.stem(w) for w in _words(text) if w not in stop_words}


def on_topic_numbers(text: str, question: str, passages: Sequence[Document], numbers: Sequence[int], min_share: float = 0.5) -> list[int]:
    """Those of ``numbers`` whose passage holds, together with ``text``, at least ``min_share`` of the
    question's content words (all of ``numbers`` when the question has none)."""
    wanted = _stems(question, _QUESTION_WORDS)
    if not wanted:
        return list(numbers)
    about = wanted & _stems(text, _QUESTION_WORDS)
    return [n for n in numbers if len(about & _stems(passages[n - 1].page_content, _QUESTION_WORDS)) >= min_share * len(wanted)]


def choose_citations(
    text: str, passages: Sequence[Document], question: str = "", check_facts: bool = True
) -> tuple[list[int], str]:
    """Passage numbers to cite and the rule that chose them (see the module docstring): the first rule
    whose passages are on topic (checked when ``question`` is given) and, with ``check_facts``, hold the
    answer's facts in sentences about the question. With no citations the rule says why:
    ``"restates"`` (the answer adds nothing to the question), ``"no_number"`` (the question asks for a
    number, the answer states none), ``"repeats"`` (it says the same words twice), ``"missing_facts"``
    (on-topic passages were found but none held the facts), ``"negation"`` (it denies what the sentences
    it drew from do not), ``"unbacked_clause"`` (a clause of it is in no sentence of the cited passages),
    ``"swapped_subject"`` (it copies a sentence about something else), ``"stray_clause"`` (a short clause's new
    words are not where the question's are), ``"heading"`` (it copies a heading), ``"off_topic"`` (rules found passages but none on topic),
    ``"unsupported"`` (no rule found any)."""
    if check_facts and question and restates(statements(text), question):
        return [], "restates"
    if check_facts and question and facts.asks_number(question) and not facts.counts(text, question):
        return [], "no_number"
    if check_facts and repeats(text):
        return [], "repeats"
    evidence = (
        ("cited", cited_numbers(text, len(passages))),
        ("copied", copied_numbers(text, passages)),
        ("overlap", overlap_numbers(text, passages)),
        ("overlap", overlap_numbers(text, passages, ignore=question) if question else []),
        ("facts", fact_numbers(text, passages, question) if question and check_facts else []),
    )
    drawn_from = sorted({n for _, numbers in evidence for n in numbers})
    lacking = False
    for rule, numbers in evidence:
        about = f"{question} {text}" if rule == "facts" else text  # a bare fact answers the question it was asked
        kept = on_topic_numbers(about, question, passages, numbers) if question else list(numbers)
        if check_facts and question:
            kept = [n for n in kept if _drawn_on_topic(about, question, passages[n - 1].page_content)]
        if kept:
            if not check_facts:
                return kept, rule
            if backed := _backing(text, passages, question, kept, drawn_from, about):
                drawn = [_drawn(text, passages[n - 1].page_content, question) for n in backed]
                if facts.negations(text) and not any(map(facts.negations, drawn)):
                    return [], "negation"
                cited_texts = [passages[n - 1].page_content for n in backed]
                if unbacked_clause(text, question, cited_texts):
                    return [], "unbacked_clause"
                if swapped_subject(text, cited_texts):
                    return [], "swapped_subject"
                if stray_clause(text, question, cited_texts):
                    return [], "stray_clause"
                if heading(text, cited_texts):
                    return [], "heading"
                return backed, rule
            lacking = True
    if lacking:
        return [], "missing_facts"
    return [], "off_topic" if any(numbers for _, numbers in evidence) else "unsupported"


_FILLER = frozenset("answer question passage passages document documents".split())
_FRAME = frozenset("number amount total count size length name".split())
"""Words that name the kind of answer rather than claim anything ("The number of people who died was 23.")."""


def restates(text: str, question: str) -> bool:
    """Whether ``text`` adds no word to ``question`` but question and filler words ("The answer is: Ada
    Pellow." to "Who was Ada Pellow?"), a word with an "s" the question's without it counting as the
    question's ("runs" to "What does the museum run?": ``facts.stem`` keeps a short word's "s")."""
    asked = _stems(question, _QUESTION_WORDS)
    return all(w in asked or (w.endswith("s") and w[:-1] in asked) for w in _stems(text, _QUESTION_WORDS | _FILLER))


_CLAUSE_BREAK = re.compile(r"[;:](?=\s)")
_HEADING_LINE = re.compile(r"^\s*#+\s.*$", re.MULTILINE)
_TAIL = re.compile(r"(?:^|(?<=[.!?:;\n]))[^.!?:;\n]*$")


def statements(text: str, min_tail: int = 4) -> str:
    """``text`` without its Markdown heading lines and without an unfinished tail of at least ``min_tail`` words
    after something finished (the cut end of a sentence, "The command-line version of"): what it states. A shorter
    tail stays, since a bare answer often ends without a full stop ("The answer: Wednesday"), and so does an answer
    that is all one unfinished sentence (cut by ``max_tokens`` before its first full stop)."""
    kept = _HEADING_LINE.sub("", text).strip()
    tail = _TAIL.search(kept)
    if tail and len(_words(tail.group())) >= min_tail and _words(kept[: tail.start()]):
        kept = kept[: tail.start()]
    return kept.strip()


def _clauses(text: str) -> list[tuple[str, bool]]:
    """``(clause, complete)`` for each sentence of ``text`` (``sentence_spans``) cut at ";" and ":": complete when it
    ends with ".", "!", "?" or is followed by ";" or ":" (not a cut tail, a heading or a file name line)."""
    found = []
    for start, end in sentence_spans(text):
        pieces = _CLAUSE_BREAK.split(text[start:end])
        for i, piece in enumerate(pieces):
            if piece.strip():
                found.append((piece.strip(), i < len(pieces) - 1 or piece.rstrip()[-1] in ".!?"))
    return found


def _content_stems(question: str, passages: Sequence[str]) -> tuple[set[str], list[set[str]]]:
    """The content stems of ``question`` and of each sentence of ``passages``, in order: what the clause checks
    compare a clause with."""
    return (_stems(question, _QUESTION_WORDS | _FILLER),
            [_stems(p[s:e], _QUESTION_WORDS | _FILLER) for p in passages for s, e in sentence_spans(p)])


def unbacked_clause(text: str, question: str, passages: Sequence[str], min_share: float = 0.25, min_words: int = 4) -> str:
    """The first complete clause of ``text`` (``_clauses``) adding at least ``min_words`` content words to ``question``
    of which no sentence of ``passages`` holds ``min_share``: a right clause with an invented one attached ("…the
    last 10 milliseconds of the log. The reason is that the log is stored on a disk that is designed to hold a
    large amount of data…"); ``""`` when there is none. Word matching is loose on purpose (a paraphrase keeps a
    quarter of its words); an unfinished tail is not judged."""
    asked, sentences = _content_stems(question, passages)
    for clause, complete in _clauses(text):
        added = _stems(clause, _QUESTION_WORDS | _FILLER) - asked
        best = max((len(added & s) for s in sentences), default=0)
        if complete and len(added) >= min_words and best < min_share * len(added):
            return clause
    return ""


def stray_clause(text: str, question: str, passages: Sequence[str], max_words: int = 3, min_share: float = 0.5) -> str:
    """The first complete clause of ``text`` (``_clauses``) about ``question`` (sharing a content word with it) that
    adds one to ``max_words`` content words to it (fewer than ``unbacked_clause`` judges), more than ``min_share`` of
    which no sentence of ``passages``, with one sentence either side, holds together with ``min_share`` of the
    question's content words: a short claim whose new words are not where the question's are ("The usual cause of a
    high 99th percentile of ll_wal_fsync_seconds is a crash.", "crash" being only elsewhere in the passage; "The
    archive is a building called the … archive."); ``""`` when there is none. A paraphrase's word beside the
    passage's facts passes ("The size of each segment file is 64 MiB." for "How big is each segment file?"), and
    words that name the kind of answer (``_FRAME``: "The number of people who died was 23.") add nothing."""
    asked, sentences = _content_stems(question, passages)
    windows = [set().union(*sentences[max(0, i - 1) : i + 2]) for i in range(len(sentences))]
    for clause, complete in _clauses(text):
        said = _stems(clause, _QUESTION_WORDS | _FILLER | _FRAME)
        added = said - asked
        if complete and said & asked and 1 <= len(added) <= max_words and not any(
            len(added & w) > min_share * len(added) and len(asked & w) >= min_share * len(asked) for w in windows
        ):
            return clause
    return ""


_MARKUP = re.compile(r"[#*_`>]+")
_ANSWER_LEAD = re.compile(r"^\s*(?:\d+\.\s+)?(?:the answer(?: to this question)? is\s*:?\s*)?(?:the\s+)?", re.IGNORECASE)


def heading(text: str, passages: Sequence[str]) -> str:
    """The line of ``passages`` without a full stop (a title or heading: "# Kestrel Lane Bakery Cooperative: Staff
    Handbook") that ``text`` is, once a leading "The answer is:", "The" and markup are set aside; ``""`` when it is
    none. A heading names a part of a document; it states nothing."""
    def bare(line: str) -> str:
        return " ".join(_words(_ANSWER_LEAD.sub("", _MARKUP.sub(" ", line).strip())))

    mine = bare(text)
    for p in passages:
        for line in p.splitlines():
            if line.strip() and line.rstrip()[-1] not in ".!?" and mine and bare(line) == mine:
                return line.strip()
    return ""


_AUXILIARIES = frozenset("is are was were has have had can cannot may must will would should does do did".split())
_JOINERS = frozenset("although though and but while whereas because so since when if during".split())
_PRONOUNS = frozenset("it they you we he she i this these those there".split())
_POSTMODIFIERS = frozenset(
    "of on in at to for from with by about into over under near after before between that which who whose where".split()
)


def _subject(prefix: str) -> tuple[str, set[str]]:
    """The head word of the noun phrase that ends ``prefix`` (the words before a copied verb), stemmed, and the
    stems of that phrase: after its last comma, semicolon or colon and a leading "although", "and"..., the last
    content word before a preposition or relative word ("although the weathervane on top of it" -> "weathervane");
    ``""`` when the phrase is a pronoun ("during which you") or holds no content word."""
    words = _words(re.split(r"[,;:()]", prefix)[-1])
    while words and (words[0] in _JOINERS or words[0] in _POSTMODIFIERS):
        words = words[1:]
    if not words or words[0] in _PRONOUNS:
        return "", set()
    cut = next((i for i, w in enumerate(words) if w in _POSTMODIFIERS), len(words))
    content = [w for w in words[:cut] if w not in _STOP_WORDS]
    return (facts.stem(content[-1]) if content else ""), {facts.stem(w) for w in words if w not in _STOP_WORDS}


def swapped_subject(text: str, passages: Sequence[str], min_run: int = 4) -> str:
    """The first clause of ``text`` that copies a passage sentence's words from a verb on ("is a copy made in 1958")
    with another subject; ``""`` when there is none. The copy is the longest run of at least ``min_run`` words, two
    of them not stop words, that clause and sentence share, starting with an auxiliary ("is", "can", "must"...)
    after some words of the clause. The subjects are the noun phrases before the copy (``_subject``): the clause's
    head differs from the sentence's and is either a word of the sentence's subject phrase ("The top of the market
    cross" from "the weathervane on top of it") or absent from the sentence ("The guide is not a sync tool" from
    "tidepool is not a sync tool"). A pronoun subject on either side is not judged."""
    sentences = [facts.normalize_numbers(p[s:e]).lower() for p in passages for s, e in sentence_spans(p)]
    for clause, _ in _clauses(text):
        normalized = facts.normalize_numbers(clause).lower()
        mine = list(_WORD.finditer(normalized))
        for sentence in sentences:
            theirs = list(_WORD.finditer(sentence))
            words = SequenceMatcher(None, [m.group() for m in mine], [m.group() for m in theirs], autojunk=False)
            i, j, n = words.find_longest_match()  # the longest shared run, the first of the longest
            run = [m.group() for m in mine[i : i + n]]
            if n < min_run or sum(w not in _STOP_WORDS for w in run) < 2 or run[0] not in _AUXILIARIES or i == 0:
                continue
            head, phrase = _subject(sentence[: theirs[j].start()])
            own, _ = _subject(normalized[: mine[i].start()])
            if head and own and own != head and (own in phrase or own not in {facts.stem(m.group()) for m in theirs}):
                return clause
    return ""


def repeats(text: str, run: int = 6) -> bool:
    """Whether ``text`` says the same ``run`` words twice ("The game is called Harbour Lights, and the game is
    called Harbour Lights"): a small model going round in circles, not stating what a passage says."""
    words = _words(text)
    seen: set[tuple[str, ...]] = set()
    for i in range(len(words) - run + 1):
        if (piece := tuple(words[i : i + run])) in seen:
            return True
        seen.add(piece)
    return False


def _drawn_window(text: str, passage: str, question: str) -> str:
    """The sentences of ``passage`` that ``text`` drew from (``drawn_sentences``), with one sentence either
    side; ``""`` when it drew from none."""
    start, end = drawn_sentences(text, passage, question)
    spans = sentence_spans(passage)
    inside = [i for i, (s, e) in enumerate(spans) if s >= start and e <= end]
    if end == 0 or not inside:
        return ""
    return passage[spans[max(0, inside[0] - 1)][0] : spans[min(len(spans) - 1, inside[-1] + 1)][1]]


def _drawn(text: str, passage: str, question: str) -> str:
    """The sentences of ``passage`` that ``text`` drew from (``drawn_sentences``), without neighbours."""
    start, end = drawn_sentences(text, passage, question)
    return passage[start:end]


def _drawn_on_topic(text: str, question: str, passage: str, min_share: float = 0.5) -> bool:
    """Whether the sentences of ``passage`` the answer drew from (``_drawn_window``) hold, together with
    the answer, at least ``min_share`` of the question's content words: the answer is about the question
    where it takes its words, not only somewhere in the passage."""
    wanted = _stems(question, _QUESTION_WORDS)
    if not wanted:
        return True
    window = _drawn_window(text, passage, question)
    return len(wanted & _stems(text, _QUESTION_WORDS) & _stems(window, _QUESTION_WORDS)) >= min_share * len(wanted)


def _backing(
    text: str, passages: Sequence[Document], question: str, kept: list[int], drawn_from: list[int], about: str = ""
) -> list[int]:
    """``kept`` and the other passages the answer draws from that hold facts of it ``kept`` lacks, when
    together with the question they hold all of its facts, each in the sentences the answer drew from
    there (``_drawn_window``: "14 November" elsewhere in the passage does not back "closed on 14 November
    1979"); else ``[]``. The sentences are found with ``about`` when given: a bare fact with its question ("The
    answer is: 3." to "How many actions does a player have on a turn?" draws on "you have three actions", not
    on the first sentence that says three)."""
    windows = {n: _drawn_window(about or text, passages[n - 1].page_content, question) for n in {*kept, *drawn_from}}
    missing = facts.missing_facts(text, [windows[n] for n in kept], question)
    cited = list(kept)
    for n in drawn_from:
        if not missing:
            break
        if n not in cited and len(still := facts.unheld(missing, [windows[n]])) < len(missing):
            cited.append(n)
            missing = still
    if missing or facts.unheld_units(facts.number_units(text, question), [windows[n] for n in cited]):
        return []
    return cited


_SENTENCE_END = re.compile(r"[.!?](?=\s)|\n")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence (or line) of ``text``, without the white space around it."""
    spans, start = [], 0
    for end in [m.end() for m in _SENTENCE_END.finditer(text)] + [len(text)]:
        piece = text[start:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            spans.append((start + lead, start + len(piece.rstrip())))
        start = end
    return spans


def drawn_sentences(answer: str, passage: str, question: str = "") -> tuple[int, int]:
    """``(start, end)`` in ``passage`` of the sentence(s) ``answer`` drew from: the sentence holding the
    most of the answer's content words, with each neighbour that holds at least half as many; ``(0, 0)``
    when no sentence holds any. A word the answer adds to ``question`` counts twice, a number or name it
    adds three times: the answer draws from where its new words are, not from where the question's words
    it repeats are ("The Lantern Walk is held on the first Saturday of every month" draws on the sentence
    about the first Saturday of every month, not on the one about the Lantern Walk)."""
    found = facts.answer_facts(answer, question)
    asked = set(facts.words(question))
    weight = {w: 1 if w in asked else 2 for w in facts.words(answer) if w not in _STOP_WORDS}
    weight |= {w: 3 for w in found.numbers | found.names}
    spans = sentence_spans(passage)
    scores = [sum(weight.get(w, 0) for w in set(facts.words(passage[s:e]))) for s, e in spans]
    best = max(range(len(spans)), key=lambda i: scores[i], default=-1)
    if best < 0 or scores[best] == 0:
        return 0, 0
    first = last = best
    while first > 0 and scores[first - 1] * 2 >= scores[best]:
        first -= 1
    while last + 1 < len(spans) and scores[last + 1] * 2 >= scores[best]:
        last += 1
    return spans[first][0], spans[last][1]


def cite(answer: str, passages: Sequence[Document], question: str, snippet_chars: int) -> tuple[list[Citation], str]:
    """The citations of ``answer`` (``choose_citations``'s passages, each with the sentence(s) the answer
    drew from, at most ``snippet_chars`` characters) and the rule that chose them."""
    numbers, rule = choose_citations(answer, passages, question)
    return [citation(n, passages[n - 1], answer, snippet_chars, question) for n in numbers], rule


def citation(number: int, passage: Document, answer: str, snippet_chars: int, question: str = "") -> Citation:
    """The citation of ``passage``, showing the sentence(s) ``answer`` drew from for ``question`` (else the passage's start)."""
    meta = passage.metadata
    content = passage.page_content
    start, end = drawn_sentences(answer, content, question)
    if end == 0:
        start = len(content) - len(content.lstrip())
        end = len(content.rstrip())
    text = content[start:end]
    if len(text) > snippet_chars:
        cut = text.rfind(" ", 0, snippet_chars)
        text = text[: cut if cut > snippet_chars // 2 else snippet_chars].rstrip() + "…"
    passage_start = meta.get("start_index")
    return Citation(
        number=number,
        source=str(meta.get("source", "")),
        start_index=passage_start,
        page=meta.get("page"),
        title=meta.get("title"),
        text=text,
        chunk_id=meta.get("chunk_id") or passage.id,
        section=str(meta["location"]) if meta.get("location") else None,
        offset=passage_start + start if isinstance(passage_start, int) else None,
    )


def cited_answer(
    request: QARequest, text: str, finish_reason: str, stats: GenerationStats | None, snippet_chars: int, unsupported: str
) -> Answer:
    """``DocumentQA``'s answer to ``request``: ``text`` with its citations and the facts no passage holds;
    an answer no passage backs shows its note instead of its text unless ``unsupported`` is ``"flag"``."""
    citations, rule = cite(text, request.passages, request.question, snippet_chars)
    answer = Answer(
        question=request.question,
        text=text,
        citations=citations,
        passages=request.passages,
        citation_rule=rule,
        finish_reason=finish_reason,
        stats=stats,
        earlier_passages=request.earlier_passages,
        history_turns=request.history_turns,
        dropped_turns=request.dropped_turns,
        retrieval_query=request.retrieval_query,
        query_stats=request.query_stats,
        missing_facts=tuple(facts.missing_facts(text, [p.page_content for p in request.passages], request.question)),
    )
    if citations or unsupported == "flag":
        return answer
    return dataclasses.replace(answer, text=answer.note, generated_text=text)
