"""Sentence segmentation: exact splits on hand cases and real text, invariants on whole books."""
from __future__ import annotations

import json
import re

import pytest

from pipelines.books import cleaning
from pipelines.corpus.sentences import split_passages, split_sentences


@pytest.mark.parametrize("text, expected", [
    ("Mr. Knightley came in. He sat down.", ["Mr. Knightley came in.", "He sat down."]),
    ("Dr. Smith and Mrs. Weston met at 3 p.m. on Monday. It rained.",
     ["Dr. Smith and Mrs. Weston met at 3 p.m. on Monday.", "It rained."]),
    ("The U.S. Army arrived in Jan. 1944. They fought.",
     ["The U.S. Army arrived in Jan. 1944.", "They fought."]),
    # Dialogue: the speech tag after ? and ! stays with the quotation.
    ('"Is it you?" she asked. "Yes," said he. "Come in!" And he did.',
     ['"Is it you?" she asked.', '"Yes," said he.', '"Come in!"', "And he did."]),
    ('"Ah! my dear, I wish you would not," said he. Then he left.',
     ['"Ah! my dear, I wish you would not," said he.', "Then he left."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    # A title at a paragraph start, and a title starting the next sentence.
    ("Mrs. Weston was a woman. Mr. Elton smiled at Dr. Perry.",
     ["Mrs. Weston was a woman.", "Mr. Elton smiled at Dr. Perry."]),
    ("He stayed for some time. Mr. Knightley had a cheerful manner.",
     ["He stayed for some time.", "Mr. Knightley had a cheerful manner."]),
    # "Jr." ends a name and here a sentence; "St." before a lower-case word does not.
    ("The speech was by Martin Luther King Jr. He spoke for an hour.",
     ["The speech was by Martin Luther King Jr.", "He spoke for an hour."]),
    ("They lived on Baker St. in London. It was foggy.",
     ["They lived on Baker St. in London.", "It was foggy."]),
    # Whitespace (hard wraps) inside a sentence becomes one space; no empty sentences.
    ("  It was a\n dark   night.\n\nThe end  ", ["It was a dark night.", "The end"]),
    ("", []), (" \n\t ", []),
    ("Ünïcödé café. Zweiter Satz — ja.", ["Ünïcödé café.", "Zweiter Satz — ja."]),
])
def test_hand_cases(text, expected):
    assert split_sentences(text) == expected


def test_nul_is_whitespace_not_a_crash():
    # blingfire turns NUL into a space; a book may hold a few (under --max_control_fraction).
    assert split_sentences("Ab\x00cd. Ef\x00\x00 gh.") == ["Ab cd.", "Ef gh."]
    assert split_passages(["\x00", "One.\x00Two."]) == ["One.", "Two."]


EMMA_PARAGRAPH = (
    "Mr. Knightley, a sensible man about seven or eight-and-thirty, was not only a very old and "
    "intimate friend of the family, but particularly connected with it, as the elder brother of "
    "Isabella's husband. He lived about a mile from Highbury, was a frequent visitor, and always "
    "welcome, and at this time more welcome than usual, as coming directly from their mutual "
    "connexions in London. He had returned to a late dinner, after some days' absence, and now "
    "walked up to Hartfield to say that all were well in Brunswick Square. It was a happy "
    "circumstance, and animated Mr. Woodhouse for some time. Mr. Knightley had a cheerful manner, "
    "which always did him good; and his many inquiries after \"poor Isabella\" and her children "
    "were answered most satisfactorily. When this was over, Mr. Woodhouse gratefully observed, "
    "\"It is very kind of you, Mr. Knightley, to come out at this late hour to call upon us. I am "
    "afraid you must have had a shocking walk.\"")


def test_real_paragraph_from_emma(shared_data):
    emma = cleaning.extract_book((shared_data / "books" / "austen-emma.txt").read_bytes())
    assert emma.passages[20] == EMMA_PARAGRAPH
    assert split_sentences(EMMA_PARAGRAPH) == [
        ("Mr. Knightley, a sensible man about seven or eight-and-thirty, was not only a very old "
        "and intimate friend of the family, but particularly connected with it, as the elder "
        "brother of Isabella's husband."),
        ("He lived about a mile from Highbury, was a frequent visitor, and always welcome, and at "
        "this time more welcome than usual, as coming directly from their mutual connexions in "
        "London."),
        ("He had returned to a late dinner, after some days' absence, and now walked up to "
        "Hartfield to say that all were well in Brunswick Square."),
        "It was a happy circumstance, and animated Mr. Woodhouse for some time.",
        ("Mr. Knightley had a cheerful manner, which always did him good; and his many inquiries "
        "after \"poor Isabella\" and her children were answered most satisfactorily."),
        ("When this was over, Mr. Woodhouse gratefully observed, \"It is very kind of you, "
        "Mr. Knightley, to come out at this late hour to call upon us."),
        "I am afraid you must have had a shocking walk.\""]


def test_real_wikipedia_paragraph(shared_data):
    squad = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    context = squad["data"][0]["paragraphs"][0]["context"]
    assert split_sentences(context) == [
        ("Super Bowl 50 was an American football game to determine the champion of the National "
        "Football League (NFL) for the 2015 season."),
        ("The American Football Conference (AFC) champion Denver Broncos defeated the National "
        "Football Conference (NFC) champion Carolina Panthers 24–10 to earn their third Super "
        "Bowl title."),
        ("The game was played on February 7, 2016, at Levi's Stadium in the San Francisco Bay Area "
        "at Santa Clara, California."),
        ("As this was the 50th Super Bowl, the league emphasized the \"golden anniversary\" with "
        "various gold-themed initiatives, as well as temporarily suspending the tradition of "
        "naming each Super Bowl game with Roman numerals (under which the game would have been "
        "known as \"Super Bowl L\"), so that the logo could prominently feature the Arabic "
        "numerals 50.")]


TITLE_AT_END = re.compile(r"(?:^|\s)[\"'(]*(?:Mr|Mrs|Ms|Dr|St|Messrs)\.$")


@pytest.mark.parametrize("name, expected_count", [
    ("austen-emma", 7398), ("melville-moby_dick", 8812), ("shakespeare-caesar", 2113)])
def test_whole_books_invariants(shared_data, name, expected_count):
    book = cleaning.extract_book((shared_data / "books" / f"{name}.txt").read_bytes())
    sentences = split_passages(book.passages)
    assert len(sentences) == expected_count
    position = 0
    text = " ".join(book.passages)
    for sentence in sentences:
        assert sentence and sentence == sentence.strip() and "\n" not in sentence
        assert not TITLE_AT_END.search(sentence), sentence
        # Sentences are exact slices of the passages, in order: nothing lost, nothing rewritten.
        found = text.find(sentence, position)
        assert found >= 0, sentence
        position = found + len(sentence)
    assert "".join(sentences).replace(" ", "") == text.replace(" ", "")
