"""Books as they really come: early-1990s Project Gutenberg etexts (shared/data/books-1990s).

Old headers and footers, the small print at the top or after the text, DOS Ctrl-Z and other
control characters, transcriber's notes, title pages, cast lists and verse without stanza breaks.
"""
from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from pipelines import extract_books
from pipelines.books import cleaning

# (first words of the first passage, last words of the last passage), read off each file: where
# the literary text starts after the header (and title page), and where it ends before the footer.
TEXT_BOUNDS = {
    "1mlyd10": ("THE verses of Emily Dickinson belong emphatically to what Emerson",
                "Burglar, banker, father, I am poor once more!"),
    "8rtib10": ('"Alme Sol, curru nitido diem qui Promis et celas,',
                ("but Agricola shall ever survive in his history here composed and transmitted "
                "to posterity.")),
    "aesop11": ("WOLF, meeting with a Lamb astray from the fold, resolved not to",
                "Fables of Aesop examined. By the Honorable Charles Boyle."),
    "chldh10": ("On the 12th of August, 18-- (just three days after my tenth",
                ('"Did Providence unite me to those two beings solely in order to make me regret '
                'them my life long?"')),
    "drfst10": ("In reprinting this edition, I have here and there amended the text",
                'as they passed by the house." Sig. K 3, ed. 1648.'),
    "duglas11": ("In the month of August, 1841, I attended an anti- slavery convention",
                 "FREDERICK DOUGLASS LYNN, ~Mass., April~ 28, 1845."),
    "mpolo10": ("So Celtic in feeling and atmosphere are the stories of Donn Byrne",
                '"Oh, my God Almighty!. . ."'),
    "myant11": ("LAST summer I happened to be crossing the plains of Iowa",
                "we possessed together the precious, the incommunicable past."),
    "ozland10": ('AFTER the publication of "The Wonderful Wizard of OZ" I began to receive',
                 '"and your riches are the only riches worth having -- the riches of content!"'),
    "pcwar10": ("Originally written in Latin, approximately A.D. 61-65, by the",
                "(26) Younger sister of Cleopatra."),
    "shkdd10": ("Scattered here and there through the stacks of unpublished manuscript",
                '{2} From chapter XIII of "The Shakespeare Problem Restated."'),
    "zenda10": (('"I wonder when in the world you\'re going to do anything, Rudolf?" said my '
                "brother's wife."),
                "for the other side, I must pray a dreamless sleep."),
}
# (passages, headings, control characters, transcriber's notes, front matter, lists, verse split)
COUNTS = {
    "1mlyd10": (356, 189, 0, 1, 4, 0, 0),
    "8rtib10": (418, 26, 0, 1, 1, 0, 0),
    "aesop11": (754, 3, 0, 0, 2, 0, 0),
    "chldh10": (577, 56, 0, 1, 3, 0, 0),
    "drfst10": (680, 3, 0, 1, 2, 5, 0),
    "duglas11": (213, 27, 1, 1, 5, 0, 0),
    "mpolo10": (455, 27, 1, 2, 1, 0, 0),
    "myant11": (1086, 51, 0, 2, 3, 0, 0),
    "ozland10": (1690, 106, 2, 1, 15, 0, 0),
    "pcwar10": (416, 19, 1, 1, 3, 0, 21),
    "shkdd10": (237, 22, 0, 0, 1, 0, 0),
    "zenda10": (1696, 45, 0, 1, 0, 3, 0),
}
# Words of the header, the small print and the footer that no book passage holds.
LICENCE = re.compile(r"Project Gutenberg|SMALL PRINT|\be-?texts?\b|\be-?books?\b|Michael S\. Hart"
                     r"|\.zip\b|Ver\.\d|legal advisor|Proofreading Team|Jim Tinsley|Martin Adamson"
                     r"|Daniel A\. Wentzell|Martin Robb|Gary R\. Young", re.IGNORECASE)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@pytest.fixture(scope="module")
def old_books(shared_data):
    folder = shared_data / "books-1990s"
    return {name: cleaning.extract_book((folder / f"{name}.txt").read_bytes()) for name in COUNTS}


def test_old_etexts_keep_the_literary_text_word_for_word(old_books):
    for name, (first, last) in TEXT_BOUNDS.items():
        passages = old_books[name].passages
        assert passages[0].startswith(first), (name, passages[0][:100])
        assert passages[-1].endswith(last), (name, passages[-1][-100:])


def test_old_etexts_lose_every_licence_and_header_line(old_books):
    for name, book in old_books.items():
        assert (book.header_stripped, book.footer_stripped) == (True, name != "duglas11"), name
        for passage in book.passages:
            assert not LICENCE.search(passage), (name, passage[:200])
            assert not CONTROL.search(passage), (name, passage[:200])
    # the verse's first lines: the second passage of Pharsalia, after the etext editor's note
    assert old_books["pcwar10"].passages[1].startswith(
        "Wars worse than civil on Emathian (1) plains, And crime let loose we sing;")
    # the first footer ends Pharsalia: the bibliography after it (and the repeated footer) go
    assert not any("Killings" in p for p in old_books["pcwar10"].passages[2:])


def test_old_etexts_exact_counts(old_books):
    assert {name: (len(b.passages), b.headings_dropped, b.control_chars_removed,
                   b.transcriber_notes_dropped, b.front_matter_dropped, b.list_blocks_dropped,
                   b.verse_paragraphs_split) for name, b in old_books.items()} == COUNTS
    assert sorted(n for n, b in old_books.items() if b.fell_back) == ["8rtib10", "drfst10"]


def test_play_cast_list_is_dropped_and_speeches_stay(old_books):
    faustus = old_books["drfst10"].passages
    assert not any(p.startswith(("THE POPE.", "LUCIFER. BELZEBUB.", "DRAMATIS"))
                   or p == "Chorus." for p in faustus)
    assert faustus[1].startswith("CHORUS. Not marching now in fields of Thrasymene, Where Mars "
                                 "did mate<1> the Carthaginians;")
    assert "DUCHESS OF VANHOLT" not in faustus


def test_long_verse_is_cut_into_sentences(old_books):
    pharsalia = old_books["pcwar10"].passages
    # Book II's "Now stand the troops within the captured town" (136 lines, 1096 words, no blank
    # line) becomes nine passages, each of whole sentences ("... lay their weapons down (11).").
    first = pharsalia.index(next(p for p in pharsalia if p.startswith("Now stand the troops")))
    pieces = pharsalia[first:first + 9]
    assert [len(p.split()) for p in pieces] == [112, 116, 117, 153, 138, 102, 157, 104, 97]
    assert pieces[0].endswith("the peace that all men else enjoy!")
    assert pieces[-1].endswith('seek to drag the tyrant down."')
    assert all(p.endswith((".", "!", "?", '."', ".)")) for p in pieces)
    assert not pharsalia[first + 9].startswith(pieces[-1][:20])


# ---------------------------------------------------------------- the pure functions on hand cases

def test_control_characters_are_removed_and_counted():
    assert cleaning.remove_controls("THE END\n \x1a\n") == ("THE END\n \n", 1)
    assert cleaning.remove_controls("a\x0cb\x0ec\td") == ("a\nbc\td", 2)
    assert cleaning.remove_controls("plain\r\n") == ("plain\r\n", 0)


OLD_1992 = """This is the January 1992 Project Gutenberg release of:
***This is the Project Gutenberg Etext of A Tale***
****START**THE SMALL PRINT!**FOR PUBLIC DOMAIN ETEXTS**START****
Why is this "small print" statement here?  You know: lawyers.
*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.03.08.92*END*

This etext was prepared by A. Volunteer.

It began in spring, as all such tales do.

*End of The Project Gutenberg Etext of A Tale*
"""


def test_1992_header_small_print_on_top_and_footer():
    body = cleaning.strip_gutenberg(OLD_1992.split("\n"))
    assert (body.header_stripped, body.footer_stripped, body.first_line) == (True, True, 6)
    book = cleaning.extract_book(OLD_1992.encode())
    assert book.passages == ("It began in spring, as all such tales do.",)
    assert (book.transcriber_notes_dropped, book.front_matter_dropped) == (1, 0)


def test_small_print_after_the_text_is_footer_not_header():
    text = "Text of the book, a sentence.\n\n" * 3 + (
        "***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**START***\nlawyers\n"
        "*END THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*Ver.02/11/02*END*\n")
    body = cleaning.strip_gutenberg(text.split("\n"))
    assert (body.header_stripped, body.footer_stripped) == (False, True)
    assert [line for line in body.lines if line] == ["Text of the book, a sentence."] * 3


def test_tab_aligned_cast_list_and_contents_are_lists():
    cast = cleaning.split_paragraphs(["DUKE\tfather to the bride", "JOHN\this son",
                                   "MARY\ta maid"])[0]
    assert cleaning.is_column_block(cast)
    prose = cleaning.split_paragraphs(["He said, and went", "away\tat last."])[0]
    assert not cleaning.is_column_block(prose) and not cleaning.is_list(
        cleaning.split_paragraphs(["He said, and went away; the night was long and cold,",
                                "and no one came."])[0])
    text = "CONTENTS\n\nI. One\nII. Two\n\nIt began, as tales do, in the spring of that year.\n"
    book = cleaning.extract_book(text.encode())
    assert book.passages == ("It began, as tales do, in the spring of that year.",)
    assert (book.headings_dropped, book.list_blocks_dropped) == (1, 1)


def test_verse_split_only_past_the_limit_and_at_sentence_ends():
    stanza = ["Sing of the sea and the ships that sail,", "Sing of the wind and the rain;",
              "Sing of the sailors who never fail", "To come to the port again."]
    short = cleaning.split_paragraphs(stanza * 10)[0]  # 260 words: one passage
    assert cleaning.split_verse(short) == [short.text]
    long = cleaning.split_paragraphs(stanza * 20)[0]  # 520 words of verse
    pieces = cleaning.split_verse(long)
    assert len(pieces) == 5 and all(p.endswith("port again.") for p in pieces)
    assert " ".join(pieces) == long.text
    prose = cleaning.split_paragraphs(["the sea and the ships that sail, and the wind"] * 60)[0]
    assert cleaning.split_verse(prose) == [prose.text]  # lower-case line starts: not verse


def test_job_on_old_etexts_counts(shared_data, tmp_path):
    out = tmp_path / "docs"
    manifest = extract_books.main(["--input", str(shared_data / "books-1990s"),
                                  "--output", str(out)])
    totals = [sum(c[i] for c in COUNTS.values()) for i in range(7)]
    assert manifest["counts"] == {
        "files_read": 12, "decoded_utf8": 10, "decoded_fallback": 2, "documents": 12,
        "passages": totals[0], "headings_dropped": totals[1], "gutenberg_headers_stripped": 12,
        "gutenberg_footers_stripped": 11, "bad_records": 0, "passages_set_aside": 0,
        "control_chars_removed": totals[2], "transcriber_notes_dropped": totals[3],
        "front_matter_dropped": totals[4], "list_blocks_dropped": totals[5],
        "verse_paragraphs_split": totals[6], "long_paragraphs_split": 0, "files_excluded": 1}
    assert manifest["excluded_inputs"] == [str(shared_data / "books-1990s" / "SOURCES.md")]
    rows = pq.read_table(out / "documents-00000-of-00001.parquet").to_pylist()
    assert [r["doc_id"] for r in rows] == [f"books/{n}" for n in sorted(COUNTS)]
    assert json.loads((out / "manifest.json").read_text())["output_version"] == 3
