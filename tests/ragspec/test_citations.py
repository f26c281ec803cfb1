"""The citation rules (ragspec.citations): which passages an answer cites, and when it cites none."""

from __future__ import annotations

from langchain_core.documents import Document

from ragspec.citations import (
    heading,
    repeats,
    restates,
    statements,
    stray_clause,
    swapped_subject,
    unbacked_clause,
    choose_citations,
    cited_numbers,
    copied_numbers,
    drawn_sentences,
    on_topic_numbers,
    sentence_spans,
)

FERRY = "The Larkspur ferry leaves Dunmore harbour at 7:15 every morning. The crossing to Gannet Island takes forty minutes."
BAKERY = "The Quillon bakery on Mill Street sells rye bread on Tuesdays only. Marta Quillon opened it in 1987."
LIBRARY = "The Brackwater library lends telescopes to its members for two weeks at a time."


def doc(text: str, source: str) -> Document:
    return Document(page_content=text, metadata={"source": source})


PASSAGES = [doc(FERRY, "/docs/ferry.txt"), doc(BAKERY, "/docs/bakery.md"), doc(LIBRARY, "/docs/library.pdf")]


def test_cited_numbers():
    assert cited_numbers("Yes [2]. Also [1, 3] and [2] again; not [7] or [0].", 3) == [2, 1, 3]
    assert cited_numbers("See [1;2].", 1) == [1]
    assert cited_numbers("No markers here (1).", 3) == []


def test_copied_numbers():
    assert copied_numbers("It sells rye bread on Tuesdays only, they say.", PASSAGES) == [2]
    assert copied_numbers("Telescopes for two weeks at a time.", PASSAGES) == [3]
    assert copied_numbers("the ferry", PASSAGES) == []  # too short to call it copying
    assert copied_numbers("Mill Street sells rye bread on Tuesdays", PASSAGES[:1]) == []
    # A shared run of stop words and one content word is not a copied span.
    assert copied_numbers("It is in the hall of it.", [doc("And it is in the hall of the town.", "x")]) == []
    assert copied_numbers("It is in the town hall of it.", [doc("And it is in the town hall of the town.", "x")]) == [1]


def test_citation_rule_order():
    assert choose_citations("At 7:15 [1].", PASSAGES) == ([1], "cited")
    assert choose_citations("At 7:15 [3].", PASSAGES, check_facts=False) == ([3], "cited")
    assert choose_citations("At 7:15 [3].", PASSAGES) == ([3, 1], "cited")  # passage 3 does not say 7:15; 1 does
    assert choose_citations("At 7:16 [3].", PASSAGES) == ([], "missing_facts")  # none does
    assert choose_citations("lends telescopes to its members for two weeks", PASSAGES) == ([3], "copied")
    assert choose_citations("I do not know.", PASSAGES) == ([], "unsupported")
    assert choose_citations("Anything", []) == ([], "unsupported")


TIMETABLE = [
    doc("Ferry timetable. Dunmore harbour departures: 7:15, 9:40 and 13:05 on weekdays; "
        "8:30 and 16:00 on Sundays. Tickets are sold on board.", "/docs/timetable.txt"),
    doc("The Gannet Island crossing takes forty minutes in calm weather.", "/docs/crossing.txt"),
]


def test_an_answer_no_passage_backs_is_unsupported_and_cites_nothing():
    assert choose_citations("The capital of Peru is Lima.", TIMETABLE) == ([], "unsupported")
    assert choose_citations("The Gannet ferry costs 12 pounds.", TIMETABLE) == ([], "unsupported")  # 1 of 5 words in either


def test_a_short_answer_in_a_passage_s_own_words_cites_that_passage():
    assert choose_citations("It takes forty minutes.", TIMETABLE) == ([2], "overlap")
    assert choose_citations("Departures at 9:40 on weekdays.", TIMETABLE) == ([1], "overlap")
    assert choose_citations("Forty.", TIMETABLE) == ([], "unsupported")  # one word is no evidence


def test_an_answer_that_copies_a_span_cites_that_passage():
    answer = "On Sundays the ferry leaves at 8:30 and 16:00 on Sundays, and tickets are sold on board."
    assert choose_citations(answer, TIMETABLE) == ([1], "copied")
    assert choose_citations("The crossing takes forty minutes in calm weather.", TIMETABLE) == ([2], "copied")


def test_an_answer_beside_the_question_cites_nothing():
    # The answer copies the timetable, but the question asks about parking: not what the passage is cited for.
    copied = "Tickets are sold on board, with departures at 7:15, 9:40 and 13:05 on weekdays."
    assert choose_citations(copied, TIMETABLE) == ([1], "copied")
    assert choose_citations(copied, TIMETABLE, "Where can visitors park their cars?") == ([], "off_topic")
    # On topic: the question's words ("departures", "weekdays"; "When" is a question word) in the answer and passage.
    assert choose_citations(copied, TIMETABLE, "When are the departures on weekdays?") == ([1], "copied")
    # Plural and verb endings do not matter: "crossings" and "take" match "crossing" and "takes".
    assert choose_citations("The crossing takes forty minutes.", TIMETABLE, "How long do crossings take?") == ([2], "overlap")
    # A question of stop words only leaves the evidence rules as they are.
    assert choose_citations(copied, TIMETABLE, "What is it?") == ([1], "copied")
    # Unsupported stays unsupported, whatever the question.
    assert choose_citations("The capital of Peru is Lima.", TIMETABLE, "What is the capital of Peru?") == ([], "unsupported")


def test_on_topic_numbers_keeps_the_passages_holding_half_the_question_s_words():
    passages = [doc("The ferry leaves at noon.", "a"), doc("Ferry tickets cost five pounds at noon.", "b")]
    question = "When does the ferry leave with tickets?"  # content words: ferry, leave, tickets
    assert on_topic_numbers("The ferry leaves at noon.", question, passages, [1, 2]) == [1]  # passage 2 lacks "leave"
    assert on_topic_numbers("The ferry tickets leave at noon.", question, passages, [1, 2]) == [1, 2]  # 2 of 3 in each
    assert on_topic_numbers("At noon.", question, passages, [1, 2]) == []  # the answer holds none of them
    assert on_topic_numbers("The ferry tickets.", question, passages, [1, 2]) == [2]  # passage 1 lacks "tickets"
    assert on_topic_numbers("The ferry leaves at noon.", question, passages, [1], min_share=1.0) == []


def test_an_answer_that_restates_the_question_is_judged_on_the_words_it_adds():
    passages = [doc("Dunmore harbour has a lifeboat station and a fish market.", "a"),
                doc("New bakery staff join as trial workers. The trial period lasts six months.", "b")]  # fmt: skip
    question = "How long is the trial period at the Kestrel Lane bakery?"
    answer = "The trial period at Kestrel Lane Bakery Cooperative is six months."  # 5 of its 8 content words in passage 2
    assert choose_citations(answer, passages) == ([], "unsupported")
    assert choose_citations(answer, passages, question) == ([2], "overlap")  # "six months" of "cooperative six months"
    assert choose_citations(answer.replace("six months", "ten weeks"), passages, question) == ([], "unsupported")


def test_a_cited_marker_on_an_off_topic_passage_falls_through_to_the_next_rule():
    answer = "The crossing takes forty minutes in calm weather [1]."
    assert choose_citations(answer, TIMETABLE) == ([1, 2], "cited")  # "forty" is passage 2's, which it cites too
    assert choose_citations(answer, TIMETABLE, "How long does the crossing take?") == ([2], "copied")


# -- the answer's facts ----------------------------------------------------------------------------------
FLOOD = [
    doc("The great flood of 1871. On the night of 14 November 1871 the dam gave way. Twenty-three people died.", "a"),
    doc("The Lantern Walk is held on the Saturday closest to 14 November. Ada Pellow rode down the valley.", "b"),
]


def test_an_answer_whose_facts_no_matching_passage_holds_is_not_supported():
    question = "How many people died in the flood?"
    assert choose_citations("Twenty-three people died in the flood of 1871.", FLOOD, question) == ([1], "overlap")
    assert choose_citations("23 people died in the flood of 1871.", FLOOD, question) == ([1], "overlap")  # digits = words
    # The same words with a number no passage holds: the rules match passage 1, the facts do not.
    assert choose_citations("Twenty-four people died in the flood of 1871.", FLOOD, question) == ([], "missing_facts")
    assert choose_citations("Twenty-four people died in the flood of 1871.", FLOOD, question, check_facts=False)[0] == [1]
    # A name the passages lack, in an answer that otherwise copies one.
    answer = "On the night of 14 November 1871 the dam gave way, said Mayor Quint."
    assert choose_citations(answer, FLOOD, "When did the dam give way?") == ([], "missing_facts")


def test_facts_from_a_second_passage_the_answer_draws_on_cite_it_too():
    answer = "On the night of 14 November 1871 the dam gave way; Ada Pellow rode down the valley."
    assert choose_citations(answer, FLOOD, "When did the dam give way?") == ([1, 2], "copied")


def test_drawn_sentences_are_the_ones_holding_the_answer_s_words():
    passage = FLOOD[0].page_content
    start, end = drawn_sentences("It was twenty-three.", passage)
    assert passage[start:end] == "Twenty-three people died."
    start, end = drawn_sentences("The flood of 1871 came in November when the dam gave way.", passage)
    assert passage[start:end] == "On the night of 14 November 1871 the dam gave way."
    start, end = drawn_sentences("The great flood of 1871 came in November when the dam gave way.", passage)
    assert passage[start:end] == "The great flood of 1871. On the night of 14 November 1871 the dam gave way."  # two
    assert drawn_sentences("Nothing alike here.", passage) == (0, 0)
    assert sentence_spans("  One. Two!\n\nThree 4.5 ") == [(2, 6), (7, 11), (13, 22)]


def test_an_answer_that_only_repeats_the_question_backs_nothing():
    passages = [doc("Ada Pellow, the keeper of the toll house, rode down the valley to wake the town.", "a")]
    question = "Who was Ada Pellow and why is she remembered?"
    assert choose_citations("The answer is: Ada Pellow.", passages, question) == ([], "restates")
    assert choose_citations("The answer is: Ada Pellow.", passages, question, check_facts=False)[0] == [1]
    assert choose_citations("Ada Pellow was the keeper of the toll house.", passages, question) == ([1], "copied")


def test_the_sentences_an_answer_draws_from_must_be_about_the_question():
    passage = doc("Tidepool is a single static binary. Put it on your PATH. Install it with brew. "
                  "The prune command deletes old snapshots. Always run prune with --dry-run first.", "a")  # fmt: skip
    answer = "Tidepool is a single static binary, so prune snapshots."  # its words come from the first sentence
    question = "Does tidepool prune snapshots?"
    assert choose_citations(answer, [passage], question, check_facts=False) == ([1], "copied")  # the passage is on topic
    assert choose_citations(answer, [passage], question) == ([], "off_topic")  # the sentences it drew from are not
    assert choose_citations("The prune command deletes old snapshots.", [passage], question) == ([1], "copied")


def test_facts_count_only_in_the_sentences_the_answer_drew_from():
    passage = doc("The last woollen mill, Bracken Mill, closed in 1979. Its building stood empty for years. "
                  "It became flats. It became a museum. The Lantern Walk is held near 14 November.", "a")  # fmt: skip
    question = "When did the last woollen mill close?"
    assert choose_citations("The last woollen mill closed in 1979.", [passage], question) == ([1], "overlap")
    # "14 November" is in the passage, but not where the answer took its words from.
    assert choose_citations("The last woollen mill closed on 14 November 1979.", [passage], question) == ([], "missing_facts")


MUSEUM = (
    "The museum runs its fulling hammer for visitors on the first Saturday of every month. The hammer weighs two tons. "
    "It was restored in 1990. Volunteers keep it oiled. The Lantern Walk is held on the Saturday closest to 14 November."
)


def test_an_answer_draws_from_the_sentence_of_the_words_it_adds_to_the_question():
    question = "On which day is the Lantern Walk held?"
    mixed = "The Lantern Walk is held on the first Saturday of every month."  # the walk's name, the hammer's day
    start, end = drawn_sentences(mixed, MUSEUM, question)
    assert MUSEUM[start:end] == "The museum runs its fulling hammer for visitors on the first Saturday of every month."
    start, end = drawn_sentences(mixed, MUSEUM)  # without the question every word counts alike: the walk's sentence
    assert MUSEUM[start:end] == "The Lantern Walk is held on the Saturday closest to 14 November."
    # Where it takes its new words is not about the question: not supported, though the passage is.
    assert choose_citations(mixed, [doc(MUSEUM, "m.txt")], question) == ([], "off_topic")
    right = "The Lantern Walk is held on the Saturday closest to 14 November."
    assert choose_citations(right, [doc(MUSEUM, "m.txt")], question) == ([1], "copied")


# -- load-bearing words: counts with what they count, the number asked for, denials, circles ----------------
BAKERY = [doc("We are a worker-owned bakery with two shops and a delivery round. The deck ovens run at up to 260 degrees. "
              "The cooperative was founded in 2009 by four bakers. Sick leave is paid for up to twenty working days. "
              "Holiday requests go in four weeks ahead.", "a")]  # fmt: skip


def test_a_number_counts_what_follows_it_in_the_passage_too():
    question = "How many ovens does the bakery have?"
    assert choose_citations("The bakery has 2 ovens.", BAKERY, question) == ([], "missing_facts")  # "two shops"
    assert choose_citations("The bakery has 2 shops.", BAKERY, "How many shops does the bakery have?") == ([1], "overlap")
    assert choose_citations("The deck ovens run at up to 260 degrees.", BAKERY, "How hot do the deck ovens get?")[0] == [1]


def test_a_bare_number_counts_what_the_question_asks_about():
    assert choose_citations("The answer is: 4.", BAKERY, "How many bakers founded the cooperative?") == ([1], "facts")
    # "four weeks ahead" is not a count of working days
    assert choose_citations("The answer is: 4.", BAKERY, "For how many working days is sick leave paid?") == ([], "missing_facts")
    assert choose_citations("The answer is: 20.", BAKERY, "For how many working days is sick leave paid?") == ([1], "facts")


def test_a_question_asking_for_a_number_needs_one_in_the_answer():
    question = "How many days of rain came before the dam gave way?"
    assert choose_citations("The dam gave way on 14 November 1871.", FLOOD, question) == ([], "no_number")  # a date, no count
    assert choose_citations("The bakery was founded by bakers.", BAKERY, "In what year was the cooperative founded?") == (
        [], "no_number")  # fmt: skip
    assert choose_citations("The cooperative was founded in 2009 by four bakers.", BAKERY, "In what year was the cooperative founded?")[0] == [1]


def test_an_answer_that_denies_what_its_sentence_does_not_is_not_supported():
    question = "What does the bakery do with its deck ovens?"
    assert choose_citations("The deck ovens do not run at up to 260 degrees.", BAKERY, question) == ([], "negation")
    assert choose_citations("The deck ovens run at up to 260 degrees.", BAKERY, question)[0] == [1]
    sick = doc("Sick leave is not paid after twenty working days.", "b")
    assert choose_citations("Sick leave is not paid after twenty working days.", [sick], "Is sick leave paid?")[0] == [1]


def test_an_answer_going_round_in_circles_is_not_supported():
    text = "The bakery has two shops, and the bakery has two shops and a delivery round."
    assert repeats(text) and not repeats("The bakery has two shops and a delivery round.")
    assert choose_citations(text, BAKERY, "What does the bakery have?") == ([], "repeats")


def test_every_rule_without_citations_has_its_own_reason_in_the_note():
    from ragspec.answers import unsupported_note

    rules = ["restates", "no_number", "repeats", "missing_facts", "negation", "unbacked_clause", "swapped_subject",
             "stray_clause", "heading", "off_topic", "unsupported"]
    notes = [unsupported_note(rule) for rule in rules]
    assert len(set(notes)) == len(rules) and all(n.startswith("I don't know: no passage backs this answer (") for n in notes)
    assert "2 oven" in unsupported_note("missing_facts", ["2 oven"])  # the facts it states win over the rule


def test_a_bare_fact_is_backed_where_its_question_points() -> None:
    """"The answer is: 3." to "How many actions ...?" draws on the sentence about actions, not on the first one that
    says three (the fresh2 part's fq-18)."""
    passage = Document("A round has three phases. The keepers' phase comes first. Players take turns in any order. "
                       "On your turn you have three actions.")  # fmt: skip
    question = "How many actions does a player have on a turn?"
    assert choose_citations("The answer is: 3.", [passage], question) == ([1], "facts")
    assert choose_citations("The answer is: 4.", [passage], question)[0] == []


def test_an_answer_restating_the_question_with_a_verb_ending_restates() -> None:
    question = "What does the museum run for visitors on the first Saturday?"
    assert restates("The museum runs for visitors on the first Saturday.", question)
    assert not restates("The museum runs a fulling hammer for visitors on the first Saturday.", question)


def test_every_finished_clause_must_be_backed_by_one_sentence_of_the_cited_passage() -> None:
    """A right clause with an invented one attached (the fresh2 part's "…the last 10 milliseconds of the log. The reason
    is that the log is stored on a disk designed to hold a large amount of data…")."""
    question = "When does the Larkspur ferry leave?"
    right = "The ferry leaves Dunmore harbour at 7:15 every morning."
    invented = " The reason is that the captain likes an early breakfast and the harbour master locks the gates at night."
    assert choose_citations(right, PASSAGES, question) == ([1], "copied")
    assert unbacked_clause(right + invented, question, [FERRY]) == invented.strip()
    assert choose_citations(right + invented, PASSAGES, question) == ([], "unbacked_clause")
    # A paraphrase keeping a quarter of its words in one sentence passes; an unfinished tail is not judged.
    loose = " The trip across to Gannet Island then takes about forty minutes of sailing."
    assert not unbacked_clause(right + loose, question, [FERRY])
    assert not unbacked_clause(right + " The reason is that the captain likes an early breakfast and", question, [FERRY])
    # A clause drawing on two sentences passes when one of them holds a quarter of its words; words spread one per
    # sentence back nothing.
    assert unbacked_clause("It crosses at 7:15 from Dunmore to Gannet Island harbour every forty minutes.", "", [FERRY]) == ""
    spread = "Gannet morning crossing harbour captains sail slowly."
    assert unbacked_clause(spread, "", ["Gannet is far. The morning is cold. The crossing is long. The harbour is small."]) == spread


def test_a_copied_sentence_must_keep_its_subject() -> None:
    """"The top of the market cross is a copy made in 1958" copies "the weathervane on top of it is a copy made in 1958";
    "The guide is not a sync tool" copies "tidepool is not a sync tool" (held-out hc-cross-2, nq-13)."""
    hall = "The market hall in Low Street dates from 1502, although the clock on top of it is a copy made in 1958."
    question = "What is on top of the market hall?"
    assert swapped_subject("The top of the market hall is a copy made in 1958.", [hall])
    assert choose_citations("The top of the market hall is a copy made in 1958.", [doc(hall, "h")], question) == (
        [], "swapped_subject")
    assert choose_citations("The clock on top of the market hall is a copy made in 1958.", [doc(hall, "h")], question)[0] == [1]
    tool = "tidepool is not a sync tool: it never changes the folder it protects. This guide covers version 2.4."
    assert swapped_subject("The guide is not a sync tool: it never changes the folder.", [tool])
    assert not swapped_subject("tidepool is not a sync tool.", [tool])  # the copy starts the clause
    # A pronoun subject is not judged; a synonym the sentence also holds elsewhere is not a swap.
    assert not swapped_subject("The hall is a copy made in 1958.", ["It is a copy made in 1958, they say."])
    line = "Trains stopped in 1963, when the line was closed as part of a review of unprofitable railways."
    assert not swapped_subject("Trains stopped in 1963, when the railway was closed as part of a review of unprofitable railways.",
                               [line])
    # A subject the copied words follow in the passage through "during which you" is a pronoun.
    assert not swapped_subject("Staff are paid the same hourly rate as members.",
                               ["The trial lasts six months, during which you are paid the same hourly rate as members."])


def test_a_short_claim_must_add_its_words_where_the_question_is_spoken_of() -> None:
    """A clause about the question adding one to three words, none of them beside the question's words in the passage
    ("…ll_wal_fsync_seconds is a crash." where "crash" is only elsewhere: the fresh3 part's f3-37)."""
    passage = ("The Larkspur ferry leaves Dunmore harbour at 7:15 every morning. The crossing to Gannet Island takes forty "
               "minutes. Tickets are sold on board. Dogs travel free. Bicycles go on the lower deck. In winter storms the "
               "crossing is cancelled.")
    question = "How long does the crossing to Gannet Island take?"
    assert stray_clause("The crossing to Gannet Island takes a storm.", question, [passage]) == (
        "The crossing to Gannet Island takes a storm.")
    assert choose_citations("The crossing to Gannet Island takes a storm.", [doc(passage, "f")], question)[0] == []
    assert choose_citations("The crossing to Gannet Island takes 40 minutes.", [doc(passage, "f")], question)[0] == [1]
    # A paraphrase beside the passage's fact passes (more than half of the added words are there: "40", "minute").
    assert not stray_clause("The length of the crossing to Gannet Island is 40 minutes.", question, [passage])
    # Words naming the kind of answer claim nothing ("The number of people who died was 23.", the follow-up).
    died = "The flood came at night. Twenty-three people died. The bridge was rebuilt."
    assert not stray_clause("The number of people who died was 23.", "How many people died in it?", [died])
    # A clause sharing no word with the question, or adding four or more, is left to the other checks.
    assert not stray_clause("Dogs travel free.", question, [passage])
    assert not stray_clause("The crossing to Gannet Island takes a storm of wild angry wind.", question, [passage])


def test_an_answer_that_is_a_heading_states_nothing() -> None:
    passage = "# Larkspur Ferry Company: Timetable\n\nThe ferry leaves Dunmore harbour at 7:15 every morning."
    assert heading("The Larkspur Ferry Company: Timetable", [passage]) == "# Larkspur Ferry Company: Timetable"
    assert heading("The answer is: Larkspur Ferry Company: Timetable", [passage])
    assert not heading("The ferry leaves Dunmore harbour at 7:15 every morning", [passage])  # a sentence, not a heading
    assert choose_citations("Larkspur Ferry Company: Timetable", [doc(passage, "f")], "Which company runs the ferry timetable?") == (
        [], "heading")


def test_an_answer_restating_the_question_before_a_heading_and_a_cut_tail_restates() -> None:
    """What is stated leaves out heading lines and an unfinished tail of four words or more (the fresh3 part's f3-51:
    "The `tidepool` command creates a pool.\n\n## Command-line\n\nThe command-line version of")."""
    text = "The ferry command books a crossing.\n\n## Booking\n\nThe online version of the"
    assert statements(text) == "The ferry command books a crossing."
    assert restates(statements(text), "Which ferry command books a crossing?")
    assert choose_citations(text, PASSAGES, "Which ferry command books a crossing?") == ([], "restates")
    assert statements("The answer: Wednesday") == "The answer: Wednesday"  # a short tail is the answer itself
    cut = "The crossing to Gannet Island takes forty minutes on the morning"  # one sentence cut by max_tokens
    assert statements(cut) == cut and not restates(statements(cut), "How long does the crossing take?")
