"""A follow-up question made standalone by rules: "How many people died in it?" after "When did the
great flood hit Marrowford?" becomes "How many people died in the great flood?".

``support_answers.py --layout rules`` asks follow-ups rewritten so (issue 37: does the small default model
answer a follow-up it can read on its own better than one that leans on the conversation? Measured: no,
see docs/conversations.md). The model's own rewrite (``DocumentQA(follow_up="rewrite")``) costs a generation
and often answers instead of rewriting; these rules cost nothing and never invent: they only put the
earlier question's subject where the follow-up says *it*, *its*, *they*, *them*, *their* or *there*.

The subject (``question_subject``) is read off an English question's shape: the words after the
wh-phrase and its auxiliary ("When did | the great flood | hit Marrowford?", "How long is | the trial
period for new Kestrel Lane staff?"), up to the main verb, which is taken to be the first lower-case
word that is followed by an article, a preposition, a capitalised word or the end (a preposition
followed by a capitalised name stays in the subject: "the last woollen mill in Marrowford"). A plural
"How many X" of the previous question is what *they* / *them* stand for, when it has one. A question
whose subject is itself a pronoun names none, so the subject of the one before stays the topic.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

WH = frozenset({"when", "where", "what", "which", "who", "whom", "whose", "how", "why"})
AUX = frozenset({"did", "does", "do", "is", "was", "are", "were", "can", "could", "must", "should", "has", "have",
                 "had", "will", "would", "may", "might"})  # fmt: skip
DETERMINERS = frozenset({"the", "a", "an", "each", "every", "this", "that", "these", "those", "its", "their", "his",
                         "her", "our", "your", "my", "one", "all"})  # fmt: skip
PREPOSITIONS = frozenset({"in", "of", "for", "at", "on", "to", "from", "with", "by", "about", "into", "under", "over",
                          "after", "before", "during", "when", "if", "since", "until"})  # fmt: skip
PRONOUNS = frozenset({"it", "its", "they", "them", "their", "there", "he", "she", "him", "her", "his"})
_PRONOUN = re.compile(r"\b(?:they|them|their|it|its|he|she|him|his|there)\b", re.IGNORECASE)
_WORD = re.compile(r"[\w'’-]+|[^\w\s]")


def _words(question: str) -> list[str]:
    return _WORD.findall(question.strip().rstrip("?").strip())


def _lower(word: str) -> bool:
    return word[:1].islower()


ENDS_SUBJECT = frozenset({"not", "be", "been", "being"})
_HOW = frozenset({"many", "much", "long", "often", "far", "large", "big", "old", "soon", "high"})


def _verb_at(words: list[str], i: int, strict: bool) -> bool:
    """Whether lower-case ``words[i]`` can be the main verb that ends a subject before it: followed by an
    article, a pronoun, a capitalised word, a word in -ing or the end; ``strict``: not by a preposition
    and a capitalised name ("mill in Marrowford" is still the subject)."""
    word = words[i]
    if word in ENDS_SUBJECT:
        return True
    if not _lower(word) or word in PREPOSITIONS or word in DETERMINERS or words[i - 1] in DETERMINERS:
        return False
    if i + 1 == len(words):
        return True
    after = words[i + 1]
    if after in PREPOSITIONS:
        return not strict or not (i + 2 < len(words) and not _lower(words[i + 2]))
    return after in DETERMINERS or after in PRONOUNS or not _lower(after) or after.endswith("ing")


def _wh_noun(words: list[str], wh: int) -> tuple[str | None, int]:
    """"the X" for a question asking "How many X" / "Which X" / "What X" (None without X), and where X ends."""
    i = wh + 1
    if words[wh].lower() == "how":
        if i < len(words) and words[i].lower() in _HOW:
            i += 1
        else:
            return None, i
    j = i
    while j < len(words) and words[j].lower() not in AUX and words[j] not in PREPOSITIONS and words[j] not in PRONOUNS:
        j += 1
        if words[j - 1].endswith("s") or words[j - 1] == "people":
            break
    noun = words[i:j]
    if not noun or words[wh].lower() not in ("how", "which", "what"):
        return None, j
    return "the " + _join(noun), j


def _parse(question: str) -> tuple[str | None, str | None, bool]:
    """(subject, the wh-phrase's noun, whether the subject is the wh-phrase's noun) of an English
    wh-question (module docstring)."""
    words = _words(question)
    wh = next((i for i, w in enumerate(words[:3]) if w.lower() in WH), None)
    if wh is None:
        return None, None, False
    noun, after = _wh_noun(words, wh)
    aux = next((i for i in range(wh + 1, min(len(words), after + 5)) if words[i].lower() in AUX), None)
    if aux is None or aux + 1 >= len(words):  # "How many bakers founded ...": the wh-phrase is the subject
        return noun, noun, True
    start = aux + 1
    first = words[start]
    if first.lower() in PRONOUNS or first.lower() in ("i", "you", "we"):
        return None, noun, False
    if first in ENDS_SUBJECT or (_lower(first) and first not in DETERMINERS and start + 1 < len(words)
                                 and (words[start + 1] in DETERMINERS or words[start + 1] in PRONOUNS
                                      or all(not _lower(w) for w in words[start + 1 :]))):  # fmt: skip
        return noun, noun, True  # "How many players can play Harbour Lights?": the wh-phrase is the subject
    if words[aux].lower() in ("is", "was", "are", "were"):  # "How long is X?"; a participle ends it ("When was X founded?")
        end = next((i for i in range(start + 1, len(words)) if _lower(words[i]) and words[i].endswith("ed")), len(words))
    else:
        end = next((i for i in range(start + 1, len(words)) if _verb_at(words, i, True)), None)
        if end is None:
            end = next((i for i in range(start + 1, len(words)) if _verb_at(words, i, False)), len(words))
    subject = words[start:end]
    while subject and subject[-1] in PREPOSITIONS:
        subject.pop()
    return _join(subject) or None, noun, False


def question_subject(question: str) -> str | None:
    """The subject of an English wh-question (see the module docstring), or None when it names none."""
    return _parse(question)[0]


def _join(words: Sequence[str]) -> str:
    return re.sub(r" (?=[^\w\s])", "", " ".join(words))


def _possessive(noun: str) -> str:
    return noun + ("'" if noun.endswith("s") else "'s")


def _plural(noun: str) -> bool:
    last = noun.split()[-1]
    return _lower(last) and (last.endswith("s") or last == "people")


def standalone_question(question: str, earlier: Sequence[str]) -> str:
    """``question`` with *it/its/they/them/their/there* (and *he/she/him/his*) replaced by what the
    ``earlier`` questions (oldest first) name (see the module docstring); unchanged when they name
    nothing or it has no such word. A leading "And" is dropped."""
    parsed = [_parse(q) for q in reversed(earlier)]
    subjects = [s for s, _, _ in parsed if s]
    singular = next((s for s in subjects if not _plural(s)), None)
    plural = next((s for s in subjects if _plural(s)), None) or next((n for _, n, _ in parsed if n and _plural(n)), None)
    own, _, own_is_wh = _parse(question)
    if own and not own_is_wh and _plural(own):
        plural = None  # "How much notice do members give when they leave?": they are its own subject
    replacements = {"they": plural, "them": plural, "their": plural and _possessive(plural), "it": singular,
                    "he": singular, "she": singular, "him": singular, "its": singular and _possessive(singular),
                    "his": singular and _possessive(singular), "there": singular}  # fmt: skip

    def replace(match: re.Match[str]) -> str:
        word = match.group(0)
        noun = replacements[word.lower()]
        if noun is None:
            return word
        before = match.string[: match.start()].split()
        if word.lower() == "there" and not (before and before[-1].lower() in PREPOSITIONS):
            return f"in {noun}"
        return noun

    text = _PRONOUN.sub(replace, re.sub(r"^\s*and\b[\s,]*", "", question.strip(), flags=re.IGNORECASE))
    return text[:1].upper() + text[1:] if text[:1].islower() else text
